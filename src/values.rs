//! Typed parsers for annotation and ConfigMap values.
//!
//! Nothing a user wrote reaches haproxy.cfg, a map file or a runtime command without passing one
//! of these. Each parser accepts a narrow, documented syntax and explains a rejection in words
//! an operator can act on. Parsers refuse anything that could leave its place in the config:
//! whitespace where one token is expected, control characters, quotes, `#`, `$` and `%`.

use std::net::IpAddr;

/// A parse failure, phrased to follow "annotation X: ".
pub type ParseResult<T> = Result<T, String>;

/// `true`/`false` (also `enabled`/`disabled`, as the incumbent controller accepts).
pub fn parse_bool(v: &str) -> ParseResult<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "enabled" => Ok(true),
        "false" | "disabled" => Ok(false),
        _ => Err(format!("{v:?} is not a boolean (expected true or false)")),
    }
}

/// A decimal integer within `min..=max`.
pub fn parse_int(v: &str, min: i64, max: i64) -> ParseResult<i64> {
    let n: i64 = v
        .trim()
        .parse()
        .map_err(|_| format!("{v:?} is not an integer"))?;
    if n < min || n > max {
        return Err(format!("{n} is outside the allowed range {min}..{max}"));
    }
    Ok(n)
}

/// A size with an optional `k`, `m` or `g` suffix (powers of 1024, as HAProxy reads them).
pub fn parse_size(v: &str) -> ParseResult<u64> {
    let t = v.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1u64 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1u64 << 30),
        _ => (t, 1),
    };
    let err = || format!("{v:?} is not a size (expected e.g. 100k, 1m, 2g or a plain number)");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let n: u64 = digits.parse().map_err(|_| err())?;
    let size = n.checked_mul(mult).ok_or_else(err)?;
    if size == 0 || size > (1u64 << 32) {
        return Err(format!("{v:?} is outside the allowed range 1..4g"));
    }
    Ok(size)
}

/// The longest duration HAProxy's timers accept, in milliseconds (2^31 - 1).
pub const MAX_DURATION_MS: u64 = 2_147_483_647;

/// A duration: a number with an optional unit `ms`, `s`, `m`, `h` or `d` (a bare number is
/// milliseconds, as in HAProxy). Returns milliseconds.
pub fn parse_duration(v: &str) -> ParseResult<u64> {
    let t = v.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let err = || format!("{v:?} is not a duration (expected e.g. 500ms, 30s, 5m, 1h, 1d)");
    if digits.is_empty() {
        return Err(err());
    }
    let n: u64 = digits.parse().map_err(|_| err())?;
    let mult = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(err()),
    };
    let ms = n.checked_mul(mult).ok_or_else(err)?;
    if ms > MAX_DURATION_MS {
        return Err(format!("{v:?} is longer than HAProxy's maximum of 24d"));
    }
    Ok(ms)
}

/// One of a fixed set of words.
pub fn parse_enum(v: &str, allowed: &[&str]) -> ParseResult<String> {
    let t = v.trim();
    if allowed.contains(&t) {
        Ok(t.to_string())
    } else {
        Err(format!("{v:?} is not one of: {}", allowed.join(", ")))
    }
}

/// A list of IP addresses or CIDR blocks, separated by commas and/or whitespace. Returned in
/// canonical form (`10.0.0.0/8`, `2001:db8::/32`, single addresses without a prefix).
pub fn parse_cidr_list(v: &str) -> ParseResult<Vec<String>> {
    let mut out = Vec::new();
    for item in v.split(|c: char| c == ',' || c.is_ascii_whitespace()) {
        if item.is_empty() {
            continue;
        }
        out.push(parse_cidr(item)?);
    }
    if out.is_empty() {
        return Err("the list is empty".to_string());
    }
    Ok(out)
}

fn parse_cidr(item: &str) -> ParseResult<String> {
    let err = || format!("{item:?} is not an IP address or CIDR block");
    let (addr, prefix) = match item.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (item, None),
    };
    let ip: IpAddr = addr.parse().map_err(|_| err())?;
    match prefix {
        None => Ok(ip.to_string()),
        Some(p) => {
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len: u8 = p.parse().map_err(|_| err())?;
            if len > max || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            Ok(format!("{ip}/{len}"))
        }
    }
}

/// An HTTP header name: letters, digits, `-`, `_` and `.`, at most 256 characters.
pub fn parse_header_name(v: &str) -> ParseResult<String> {
    let ok = !v.is_empty()
        && v.len() <= 256
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{v:?} is not a header name (letters, digits, '-', '_' and '.')"
        ))
    }
}

/// An HTTP header value: printable ASCII, at most 4096 characters, no leading or trailing
/// space, and none of `'`, `"`, `\`, `#`, `$`, `%` (HAProxy would read them as quoting,
/// comments, environment variables or sample expressions).
pub fn parse_header_value(v: &str) -> ParseResult<String> {
    if v.is_empty() || v.len() > 4096 {
        return Err(format!("{v:?} must be 1 to 4096 characters"));
    }
    if v.starts_with(' ') || v.ends_with(' ') {
        return Err(format!("{v:?} has leading or trailing whitespace"));
    }
    if let Some(bad) = v
        .chars()
        .find(|&c| !(' '..='~').contains(&c) || matches!(c, '\'' | '"' | '\\' | '#' | '$' | '%'))
    {
        return Err(format!(
            "{v:?} contains {bad:?}; header values may not contain control characters, quotes, '\\', '#', '$' or '%'"
        ));
    }
    Ok(v.to_string())
}

/// Header lines as the incumbent writes them: one `Name value` per line. A line may not start
/// with whitespace (that would be an obsolete folded continuation, which RFC 9112 forbids) and
/// no control character other than the line feeds is allowed.
pub fn parse_header_lines(v: &str) -> ParseResult<Vec<(String, String)>> {
    if let Some(c) = v.chars().find(|c| c.is_control() && *c != '\n') {
        return Err(format!("{v:?} contains the control character {c:?}"));
    }
    let mut out = Vec::new();
    for (i, line) in v.split('\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let n = i + 1;
        if line.starts_with(char::is_whitespace) {
            return Err(format!("line {n}: {line:?} starts with whitespace"));
        }
        let (name, value) = line
            .split_once(' ')
            .ok_or_else(|| format!("line {n}: {line:?} is not 'Header-Name value'"))?;
        let name = parse_header_name(name).map_err(|e| format!("line {n}: {e}"))?;
        let value = parse_header_value(value.trim()).map_err(|e| format!("line {n}: {e}"))?;
        out.push((name, value));
    }
    if out.is_empty() {
        return Err("no header lines".to_string());
    }
    Ok(out)
}

/// A host name as an Ingress rule writes it: a lowercase DNS-1123 subdomain, optionally with a
/// leading `*.` wildcard label. IP addresses are not hosts (as the Ingress API says).
pub fn parse_host(v: &str) -> ParseResult<String> {
    let (wild, rest) = match v.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    crate::objects::validate_dns_subdomain(rest).map_err(|_| {
        format!("{v:?} is not a host name (lowercase DNS name, optionally starting with '*.')")
    })?;
    if rest.parse::<IpAddr>().is_ok() || rest.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("{v:?} is an IP address, not a host name"));
    }
    Ok(if wild {
        format!("*.{rest}")
    } else {
        rest.to_string()
    })
}

/// A host with an optional `:port`, as a Host header carries it (no wildcard).
pub fn parse_host_header(v: &str) -> ParseResult<String> {
    let (host, port) = match v.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (v, None),
    };
    if host.starts_with('*') {
        return Err(format!("{v:?}: a wildcard is not a host"));
    }
    let host = parse_host(host)
        .map_err(|_| format!("{v:?} is not a host name (lowercase DNS name, optionally :port)"))?;
    match port {
        None => Ok(host),
        Some(p) => {
            let n = parse_int(p, 1, 65535).map_err(|e| format!("{v:?}: port {e}"))?;
            Ok(format!("{host}:{n}"))
        }
    }
}

/// An HTTP path as an Ingress rule writes it: starts with `/`, at most 2048 characters of
/// URL path characters (RFC 3986 pchar and `/`), `%` only as a `%XX` escape. Quotes, `$`,
/// `#`, spaces and control characters are refused.
pub fn parse_path(v: &str) -> ParseResult<String> {
    if !v.starts_with('/') {
        return Err(format!("{v:?} does not start with '/'"));
    }
    if v.len() > 2048 {
        return Err(format!("{v:?} is longer than 2048 characters"));
    }
    let bytes = v.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let ok = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'/' | b'-'
                    | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'&'
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
            );
        if b == b'%' {
            let hex = |j: usize| bytes.get(j).is_some_and(|c| c.is_ascii_hexdigit());
            if hex(i + 1) && hex(i + 2) {
                i += 3;
                continue;
            }
            return Err(format!("{v:?}: '%' must start a %XX escape"));
        }
        if !ok {
            return Err(format!(
                "{v:?} contains {:?}, which is not allowed in a path",
                b as char
            ));
        }
        i += 1;
    }
    Ok(v.to_string())
}

/// A regular expression for HAProxy: printable ASCII without spaces, quotes or `#`, `$` only
/// as an end anchor, and valid in the common regex syntax (checked with `regex-syntax`).
pub fn parse_regex(v: &str) -> ParseResult<String> {
    if v.is_empty() || v.len() > 1024 {
        return Err(format!("{v:?} must be 1 to 1024 characters"));
    }
    if let Some(bad) = v
        .chars()
        .find(|&c| !('!'..='~').contains(&c) || matches!(c, '\'' | '"' | '#' | '%'))
    {
        return Err(format!(
            "{v:?} contains {bad:?}, which is not allowed in a regex"
        ));
    }
    let chars: Vec<char> = v.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if *c == '$' && !matches!(chars.get(i + 1), None | Some(')' | '|')) {
            return Err(format!("{v:?}: '$' is only allowed as an end anchor"));
        }
    }
    regex_syntax::Parser::new()
        .parse(v)
        .map_err(|e| format!("{v:?} is not a valid regex: {e}"))?;
    Ok(v.to_string())
}

/// A replacement for a regex substitution: printable ASCII without spaces, quotes, `#`, `$`
/// or `%`; `\1`..`\9` refer to capture groups.
pub fn parse_replacement(v: &str) -> ParseResult<String> {
    if v.is_empty() || v.len() > 1024 {
        return Err(format!("{v:?} must be 1 to 1024 characters"));
    }
    if let Some(bad) = v
        .chars()
        .find(|&c| !('!'..='~').contains(&c) || matches!(c, '\'' | '"' | '#' | '$' | '%'))
    {
        return Err(format!(
            "{v:?} contains {bad:?}, which is not allowed in a replacement"
        ));
    }
    Ok(v.to_string())
}

/// Balance algorithms that take no argument.
pub const BALANCE_ALGORITHMS: &[&str] = &[
    "roundrobin",
    "static-rr",
    "leastconn",
    "first",
    "source",
    "uri",
    "random",
    "rdp-cookie",
];

/// A `balance` argument: one of [`BALANCE_ALGORITHMS`], `hdr(<header>)` or
/// `url_param <name>`. Returned in canonical form.
pub fn parse_balance(v: &str) -> ParseResult<String> {
    let t = v.trim();
    if BALANCE_ALGORITHMS.contains(&t) {
        return Ok(t.to_string());
    }
    if let Some(inner) = t.strip_prefix("hdr(").and_then(|r| r.strip_suffix(')')) {
        return Ok(format!("hdr({})", parse_header_name(inner)?));
    }
    if let Some(param) = t.strip_prefix("url_param ") {
        return Ok(format!("url_param {}", parse_header_name(param.trim())?));
    }
    Err(format!(
        "{v:?} is not a balance algorithm (one of {}, hdr(<header>), url_param <name>)",
        BALANCE_ALGORITHMS.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &[&str] = &[
        "a\nb",
        "a\rb",
        "x # y",
        "it's",
        "say \"hi\"",
        "%[env(SECRET)]",
        "$HOME",
        "${HOME}",
        " lua-load /x",
        "a\u{0}b",
    ];

    #[test]
    fn single_token_parsers_refuse_hostile_values() {
        for v in HOSTILE {
            assert!(parse_duration(v).is_err(), "duration {v:?}");
            assert!(parse_size(v).is_err(), "size {v:?}");
            assert!(parse_host(v).is_err(), "host {v:?}");
            assert!(parse_path(&format!("/{v}")).is_err(), "path {v:?}");
            assert!(parse_header_name(v).is_err(), "header name {v:?}");
            assert!(parse_header_value(v).is_err(), "header value {v:?}");
            assert!(parse_regex(v).is_err(), "regex {v:?}");
            assert!(parse_replacement(v).is_err(), "replacement {v:?}");
            assert!(parse_cidr_list(v).is_err(), "cidr {v:?}");
            assert!(parse_enum(v, &["roundrobin"]).is_err(), "enum {v:?}");
            assert!(parse_balance(v).is_err(), "balance {v:?}");
        }
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("30m"), Ok(1_800_000));
        assert_eq!(parse_duration("250"), Ok(250));
        assert_eq!(parse_duration("2s"), Ok(2000));
        assert!(parse_duration("25d").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("100k"), Ok(102_400));
        assert!(parse_size("0").is_err());
        assert!(parse_size("m").is_err());
    }

    #[test]
    fn hosts_and_paths() {
        assert_eq!(parse_host("*.example.com").as_deref(), Ok("*.example.com"));
        assert!(parse_host("Example.com").is_err());
        assert!(parse_host("10.0.0.1").is_err());
        assert!(parse_host("a.*.com").is_err());
        assert_eq!(parse_host_header("a.com:8080").as_deref(), Ok("a.com:8080"));
        assert!(parse_path("/a%2Fb/c;v=1").is_ok());
        assert!(parse_path("/a%zz").is_err());
        assert!(parse_path("relative").is_err());
    }

    #[test]
    fn cidrs_are_canonical() {
        assert_eq!(
            parse_cidr_list("10.0.0.0/8, 192.168.1.1 2001:DB8::/32"),
            Ok(vec![
                "10.0.0.0/8".to_string(),
                "192.168.1.1".to_string(),
                "2001:db8::/32".to_string()
            ])
        );
        assert!(parse_cidr_list("10.0.0.0/33").is_err());
    }

    #[test]
    fn header_lines_and_regexes() {
        assert_eq!(
            parse_header_lines("X-A one two\nX-B b\n"),
            Ok(vec![
                ("X-A".into(), "one two".into()),
                ("X-B".into(), "b".into())
            ])
        );
        assert!(parse_regex("^/api/(.*)$").is_ok());
        assert!(parse_regex("^/api/(.*").is_err());
        assert!(parse_regex("a$b").is_err());
        assert!(parse_replacement("/\\1").is_ok());
    }
}
