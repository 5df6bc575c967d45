//! Typed parsers for annotation and ConfigMap values.
//!
//! Nothing a user wrote reaches haproxy.cfg, a map file or a runtime command without passing one
//! of these. Each parser accepts a narrow, documented syntax and explains a rejection in words
//! an operator can act on. Parsers refuse anything that could leave its place in the config:
//! whitespace where one token is expected, control characters, quotes, `#`, `$` and `%`.

use std::net::IpAddr;

use crate::diagnostics::quoted;

mod header;
mod health_check;
mod patterns;
mod pcre;
mod routing;
pub use header::{
    Direction, check_format as check_header_format, check_format_for as check_header_format_for,
    converter_names as header_converter_names, fetch_names as header_fetch_names,
    parse_header_format,
};
pub use health_check::{CHECK_METHODS, CHECK_VERSIONS, parse_http_check};
pub use patterns::{
    AccessList, MAX_PATTERN_FILE_BYTES, MAX_PATTERN_KEY_BYTES, MAX_PATTERN_LINE_BYTES,
    MAX_PATTERN_LINES, PATTERN_PREFIX, check_address_patterns, check_pattern_content,
    parse_access_list, parse_pattern_key, parse_pattern_ref, pattern_lines, pattern_path,
};
pub use pcre::RegexPlace;
pub use routing::{
    parse_capture_sample, parse_capture_samples, parse_redirect_target, parse_rewrite,
    parse_rewrites, parse_route_acl, redirect_target_text, route_acl_text,
};

/// A parse failure, phrased to follow "annotation X: ".
pub type ParseResult<T> = Result<T, String>;

/// The largest annotation or ConfigMap value read, in bytes. The longest legitimate values
/// (a CORS origin list, header lines, a route-acl with many patterns, a config snippet) are a
/// few KiB; one above this is refused before any parser reads it.
pub const MAX_VALUE_BYTES: usize = 16 * 1024;

/// The most distinct `request-capture` slots (sample and length) the frontends hold, over
/// every Ingress. Each slot is allocated for every request.
pub const MAX_CAPTURE_SLOTS: usize = 64;
/// The most bytes all `request-capture` slots together may hold per request (the sum of their
/// lengths).
pub const MAX_CAPTURE_BYTES: u64 = 16 * 1024;
/// The most distinct hosts the rules of one Ingress may name.
pub const MAX_HOSTS_PER_INGRESS: usize = 1000;

/// Whether one more capture slot, `new`, fits beside `slots` under [`MAX_CAPTURE_SLOTS`] and
/// [`MAX_CAPTURE_BYTES`].
pub fn check_capture_slot(
    slots: &[crate::model::FrontendCapture],
    new: &crate::model::FrontendCapture,
) -> ParseResult<()> {
    let used: u64 = slots.iter().map(|c| u64::from(c.len)).sum();
    if slots.len() >= MAX_CAPTURE_SLOTS {
        return Err(format!(
            "capture of {} refused: the frontends already hold {MAX_CAPTURE_SLOTS} capture slots, the limit over all Ingresses",
            new.sample
        ));
    }
    if used + u64::from(new.len) > MAX_CAPTURE_BYTES {
        return Err(format!(
            "capture of {} (len {}) refused: the capture slots already hold {used} of at most {MAX_CAPTURE_BYTES} bytes per request over all Ingresses",
            new.sample, new.len
        ));
    }
    Ok(())
}

/// Whether an Ingress that already names `hosts` distinct hosts may name one more.
pub fn check_host_count(hosts: usize) -> ParseResult<()> {
    if hosts >= MAX_HOSTS_PER_INGRESS {
        return Err(format!(
            "more than {MAX_HOSTS_PER_INGRESS} hosts in one Ingress; rule skipped"
        ));
    }
    Ok(())
}

/// Refuses a value larger than [`MAX_VALUE_BYTES`], with a message that does not quote it.
pub fn check_value_size(v: &str) -> ParseResult<()> {
    if v.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "the value is {} bytes, more than the limit of {MAX_VALUE_BYTES}",
            v.len()
        ));
    }
    Ok(())
}

/// `true`/`false` (also `enabled`/`disabled`, as the incumbent controller accepts).
pub fn parse_bool(v: &str) -> ParseResult<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "enabled" => Ok(true),
        "false" | "disabled" => Ok(false),
        _ => Err(format!(
            "{v} is not a boolean (expected true or false)",
            v = quoted(v)
        )),
    }
}

/// A decimal integer within `min..=max`.
pub fn parse_int(v: &str, min: i64, max: i64) -> ParseResult<i64> {
    let n: i64 = v
        .trim()
        .parse()
        .map_err(|_| format!("{v} is not an integer", v = quoted(v)))?;
    if n < min || n > max {
        return Err(format!("{n} is outside the allowed range {min}..{max}"));
    }
    Ok(n)
}

/// The most entries a stick table may hold (16m). A table takes memory for every entry clients
/// fill, so one tenant's table sized in billions would let traffic exhaust HAProxy's memory.
pub const MAX_TABLE_ENTRIES: u64 = 16 << 20;

/// A stick-table size in entries, with an optional `k`, `m` or `g` suffix (powers of 1024, as
/// HAProxy reads them), from 1 to [`MAX_TABLE_ENTRIES`].
pub fn parse_size(v: &str) -> ParseResult<u64> {
    let t = v.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1u64 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1u64 << 30),
        _ => (t, 1),
    };
    let err = || {
        format!(
            "{v} is not a size (expected e.g. 100k, 1m, 2g or a plain number)",
            v = quoted(v)
        )
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let n: u64 = digits.parse().map_err(|_| err())?;
    let size = n.checked_mul(mult).ok_or_else(err)?;
    if size == 0 || size > MAX_TABLE_ENTRIES {
        return Err(format!(
            "{v} is outside the allowed range 1..16m",
            v = quoted(v)
        ));
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
    let err = || {
        format!(
            "{v} is not a duration (expected e.g. 500ms, 30s, 5m, 1h, 1d)",
            v = quoted(v)
        )
    };
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
        return Err(format!(
            "{v} is longer than HAProxy's maximum of 24d",
            v = quoted(v)
        ));
    }
    Ok(ms)
}

/// One of a fixed set of words.
pub fn parse_enum(v: &str, allowed: &[&str]) -> ParseResult<String> {
    let t = v.trim();
    if allowed.contains(&t) {
        Ok(t.to_string())
    } else {
        Err(format!(
            "{v} is not one of: {}",
            allowed.join(", "),
            v = quoted(v)
        ))
    }
}

/// `ctx.regex`: a regex for an ACL pattern (`-m reg`), checked as [`parse_regex_at`] checks it
/// there.
pub fn parse_acl_regex(v: &str) -> ParseResult<String> {
    parse_regex_at(v, RegexPlace::Acl { ignore_case: false })
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
    let err = || {
        format!(
            "{item} is not an IP address or CIDR block",
            item = quoted(item)
        )
    };
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
            "{v} is not a header name (letters, digits, '-', '_' and '.')",
            v = quoted(v)
        ))
    }
}

/// An HTTP header value: printable ASCII, at most 4096 characters, no leading or trailing
/// space, and none of `'`, `"`, `\`, `#`, `$`, `%` (HAProxy would read them as quoting,
/// comments, environment variables or sample expressions).
pub fn parse_header_value(v: &str) -> ParseResult<String> {
    if v.is_empty() || v.len() > 4096 {
        return Err(format!("{v} must be 1 to 4096 characters", v = quoted(v)));
    }
    if v.starts_with(' ') || v.ends_with(' ') {
        return Err(format!(
            "{v} has leading or trailing whitespace",
            v = quoted(v)
        ));
    }
    if let Some(bad) = v
        .chars()
        .find(|&c| !(' '..='~').contains(&c) || matches!(c, '\'' | '"' | '\\' | '#' | '$' | '%'))
    {
        return Err(format!(
            "{v} contains {bad:?}; header values may not contain control characters, quotes, '\\', '#', '$' or '%'",
            v = quoted(v)
        ));
    }
    Ok(v.to_string())
}

/// Header lines as the incumbent writes them: one `Name value` per line, the value as
/// [`parse_header_format`] reads it (text, optionally double-quoted, with vetted sample
/// fetches available in `direction`, or in either when `None`). A line may not start with
/// whitespace (that would be an obsolete folded continuation, which RFC 9112 forbids) and no
/// control character other than the line feeds is allowed.
pub fn parse_header_lines(
    v: &str,
    direction: Option<Direction>,
) -> ParseResult<Vec<(String, String)>> {
    if let Some(c) = v.chars().find(|c| c.is_control() && *c != '\n') {
        return Err(format!(
            "{v} contains the control character {c:?}",
            v = quoted(v)
        ));
    }
    let mut out = Vec::new();
    for (i, line) in v.split('\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let n = i + 1;
        if line.starts_with(char::is_whitespace) {
            return Err(format!(
                "line {n}: {line} starts with whitespace",
                line = quoted(line)
            ));
        }
        let (name, value) = line.split_once(' ').ok_or_else(|| {
            format!(
                "line {n}: {line} is not 'Header-Name value'",
                line = quoted(line)
            )
        })?;
        let name = parse_header_name(name).map_err(|e| format!("line {n}: {e}"))?;
        let value = match direction {
            Some(d) => parse_header_format(value.trim(), d),
            None => parse_header_format(value.trim(), Direction::Request)
                .or_else(|_| parse_header_format(value.trim(), Direction::Response)),
        }
        .map_err(|e| format!("line {n}: {e}"))?;
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
        format!(
            "{v} is not a host name (lowercase DNS name, optionally starting with '*.')",
            v = quoted(v)
        )
    })?;
    if rest.parse::<IpAddr>().is_ok() || rest.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!(
            "{v} is an IP address, not a host name",
            v = quoted(v)
        ));
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
        return Err(format!("{v}: a wildcard is not a host", v = quoted(v)));
    }
    let host = parse_host(host).map_err(|_| {
        format!(
            "{v} is not a host name (lowercase DNS name, optionally :port)",
            v = quoted(v)
        )
    })?;
    match port {
        None => Ok(host),
        Some(p) => {
            let n = parse_int(p, 1, 65535).map_err(|e| format!("{v}: port {e}", v = quoted(v)))?;
            Ok(format!("{host}:{n}"))
        }
    }
}

/// An HTTP path as an Ingress rule writes it: starts with `/`, at most 2048 characters of
/// URL path characters (RFC 3986 pchar and `/`), `%` only as a `%XX` escape. Quotes, `$`,
/// `#`, spaces and control characters are refused.
pub fn parse_path(v: &str) -> ParseResult<String> {
    if !v.starts_with('/') {
        return Err(format!("{v} does not start with '/'", v = quoted(v)));
    }
    if v.len() > 2048 {
        return Err(format!("{v} is longer than 2048 characters", v = quoted(v)));
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
            return Err(format!("{v}: '%' must start a %XX escape", v = quoted(v)));
        }
        if !ok {
            return Err(format!(
                "{v} contains {:?}, which is not allowed in a path",
                b as char,
                v = quoted(v)
            ));
        }
        i += 1;
    }
    Ok(v.to_string())
}

/// A regular expression for `http-request replace-path`: [`parse_regex_at`] at
/// [`RegexPlace::Replace`].
pub fn parse_regex(v: &str) -> ParseResult<String> {
    parse_regex_at(v, RegexPlace::Replace)
}

/// A regular expression for HAProxy, written at `place`: printable ASCII without spaces,
/// quotes, `#` or `%`, `$` only as an end anchor, at most 1024 bytes, and compiled by PCRE2
/// with the flags HAProxy uses there (see [`pcre`]).
pub fn parse_regex_at(v: &str, place: RegexPlace) -> ParseResult<String> {
    if v.is_empty() || v.len() > 1024 {
        return Err(format!("{v} must be 1 to 1024 characters", v = quoted(v)));
    }
    if let Some(bad) = v
        .chars()
        .find(|&c| !('!'..='~').contains(&c) || matches!(c, '\'' | '"' | '#' | '%'))
    {
        return Err(format!(
            "{v} contains {bad:?}, which is not allowed in a regex",
            v = quoted(v)
        ));
    }
    let chars: Vec<char> = v.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if *c == '$' && !matches!(chars.get(i + 1), None | Some(')' | '|')) {
            return Err(format!(
                "{v}: '$' is only allowed as an end anchor",
                v = quoted(v)
            ));
        }
    }
    pcre::compile(v, place).map_err(|e| format!("{v} is not a valid regex: {e}", v = quoted(v)))?;
    Ok(v.to_string())
}

/// A replacement for a regex substitution: printable ASCII without spaces, quotes, `#`, `$`
/// or `%`; `\1`..`\9` refer to capture groups.
pub fn parse_replacement(v: &str) -> ParseResult<String> {
    if v.is_empty() || v.len() > 1024 {
        return Err(format!("{v} must be 1 to 1024 characters", v = quoted(v)));
    }
    if let Some(bad) = v
        .chars()
        .find(|&c| !('!'..='~').contains(&c) || matches!(c, '\'' | '"' | '#' | '$' | '%'))
    {
        return Err(format!(
            "{v} contains {bad:?}, which is not allowed in a replacement",
            v = quoted(v)
        ));
    }
    Ok(v.to_string())
}

/// The most `path-rewrite` rules one value may hold.
pub const MAX_REWRITES: usize = 16;

/// Balance algorithms that take no argument.
pub const BALANCE_ALGORITHMS: &[&str] =
    &["roundrobin", "static-rr", "leastconn", "first", "source"];

/// Whether `balance` (its words) picks a server by a hash of the request (`source`, `uri`,
/// `url_param`, `hdr(...)`, `rdp-cookie`). Such backends are written with `hash-type
/// consistent`: HAProxy's default, map-based hashing, is static (2.6 refuses `add server` in
/// it) and sends nearly every client elsewhere when one pod comes or goes; consistent hashing
/// moves only the share of the pod that changed.
pub fn is_hash_balance(balance: &[String]) -> bool {
    balance.first().is_some_and(|algorithm| {
        let name = algorithm.split('(').next().unwrap_or(algorithm);
        matches!(name, "source" | "uri" | "url_param" | "hdr" | "rdp-cookie")
    })
}

/// A `balance` line as HAProxy 2.6 takes it, returned in canonical form (words separated by
/// one space):
///
/// - `roundrobin`, `static-rr`, `leastconn`, `first`, `source`;
/// - `uri` with any of `len <n>`, `depth <n>`, `whole`, `path-only`;
/// - `url_param <name>`, optionally `check_post [<bytes>]`;
/// - `hdr(<header>)`, optionally `use_domain_only`;
/// - `random` or `random(<draws>)`;
/// - `rdp-cookie` or `rdp-cookie(<name>)`.
pub fn parse_balance(v: &str) -> ParseResult<String> {
    let words: Vec<&str> = v.split_ascii_whitespace().collect();
    let Some((&first, options)) = words.split_first() else {
        return Err("an empty balance algorithm".to_string());
    };
    let bad = || {
        format!(
            "{v} is not a balance algorithm with its options ({}, uri [len N] [depth N] [whole] [path-only], url_param NAME [check_post [N]], hdr(NAME) [use_domain_only], random[(N)], rdp-cookie[(NAME)])",
            BALANCE_ALGORITHMS.join(", "),
            v = quoted(v)
        )
    };
    let number = |w: Option<&&str>, max: u64| -> ParseResult<String> {
        let w = w.ok_or_else(bad)?;
        match w.parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n.to_string()),
            _ => Err(format!("{} must be a number from 1 to {max}", quoted(w))),
        }
    };
    let mut out = Vec::new();
    let (name, arg) = match first.split_once('(') {
        Some((name, rest)) => (name, Some(rest.strip_suffix(')').ok_or_else(bad)?)),
        None => (first, None),
    };
    match (name, arg) {
        (n, None) if BALANCE_ALGORITHMS.contains(&n) => {
            if !options.is_empty() {
                return Err(format!("{} takes no options", n));
            }
            out.push(n.to_string());
        }
        ("uri", None) => {
            out.push("uri".to_string());
            let mut i = 0;
            let mut seen = Vec::new();
            while let Some(&w) = options.get(i) {
                if seen.contains(&w) {
                    return Err(format!("uri option {w} is given twice"));
                }
                seen.push(w);
                match w {
                    "whole" | "path-only" => out.push(w.to_string()),
                    "len" | "depth" => {
                        let n = number(options.get(i + 1), 65535)?;
                        out.push(w.to_string());
                        out.push(n);
                        i += 1;
                    }
                    _ => {
                        return Err(format!(
                            "{} is not a uri option (len, depth, whole, path-only)",
                            quoted(w)
                        ));
                    }
                }
                i += 1;
            }
        }
        ("url_param", None) => {
            let param = options.first().ok_or_else(bad)?;
            out.push("url_param".to_string());
            out.push(parse_header_name(param)?);
            match &options[1..] {
                [] => {}
                ["check_post"] => out.push("check_post".to_string()),
                ["check_post", n] => {
                    out.push("check_post".to_string());
                    out.push(number(Some(n), 1 << 20)?);
                }
                _ => {
                    return Err(format!(
                        "{}: url_param takes only check_post [N] after its name",
                        quoted(v)
                    ));
                }
            }
        }
        ("hdr", Some(header)) => {
            out.push(format!("hdr({})", parse_header_name(header)?));
            match options {
                [] => {}
                ["use_domain_only"] => out.push("use_domain_only".to_string()),
                _ => return Err(format!("{}: hdr() takes only use_domain_only", quoted(v))),
            }
        }
        ("random", draws) | ("rdp-cookie", draws) if options.is_empty() => match draws {
            None => out.push(name.to_string()),
            Some(a) if name == "random" => out.push(format!("random({})", number(Some(&a), 100)?)),
            Some(a) => out.push(format!("rdp-cookie({})", parse_cookie_name(a)?)),
        },
        _ => return Err(bad()),
    }
    Ok(out.join(" "))
}

/// A cookie name (`cookie-persistence`): letters, digits, `-`, `_` and `.`, at most 64
/// characters (a subset of RFC 6265's token that needs no quoting in haproxy.cfg).
pub fn parse_cookie_name(v: &str) -> ParseResult<String> {
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{v} is not a cookie name (1 to 64 letters, digits, '-', '_' and '.')",
            v = quoted(v)
        ))
    }
}

/// The secret key of dynamic cookies (`dynamic-cookie-key`): 8 to 256 letters, digits and
/// `+`, `/`, `=`, `-`, `_`, `.`, `~` (base64 and hex keys fit), surrounding whitespace
/// (a trailing line feed from a file) ignored. The message never repeats the value: it is a
/// secret.
pub fn parse_cookie_key(v: &str) -> ParseResult<String> {
    let t = v.trim();
    let ok = (8..=256).contains(&t.len())
        && t.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_' | b'.' | b'~')
        });
    if ok {
        Ok(t.to_string())
    } else {
        Err(
            "is not a usable dynamic cookie key (8 to 256 letters, digits and '+', '/', '=', '-', '_', '.', '~'; the value is not shown)"
                .to_string(),
        )
    }
}

/// Status codes HAProxy 2.6 can answer `http-request deny deny_status` with (those it has a
/// built-in error page for); any other makes it refuse the whole configuration. 200 is left
/// out: a refusal must not look like a success.
pub const DENY_STATUS_CODES: &[i64] = &[
    400, 401, 403, 404, 405, 407, 408, 410, 413, 425, 429, 500, 501, 502, 503, 504,
];

/// `send-proxy-protocol` values and the `default-server` keyword each one renders.
pub const SEND_PROXY_PROTOCOLS: &[(&str, &str)] = &[
    ("proxy", "send-proxy"),
    ("proxy-v1", "send-proxy"),
    ("proxy-v2", "send-proxy-v2"),
    ("proxy-v2-ssl", "send-proxy-v2-ssl"),
    ("proxy-v2-ssl-cn", "send-proxy-v2-ssl-cn"),
];

/// A `send-proxy-protocol` value, returned as its HAProxy server keyword.
pub fn parse_send_proxy(v: &str) -> ParseResult<String> {
    let t = v.trim();
    SEND_PROXY_PROTOCOLS
        .iter()
        .find(|(name, _)| *name == t)
        .map(|(_, keyword)| keyword.to_string())
        .ok_or_else(|| {
            let names: Vec<&str> = SEND_PROXY_PROTOCOLS.iter().map(|(n, _)| *n).collect();
            format!("{v} is not one of {}", names.join(", "), v = quoted(v))
        })
}

/// A Secret reference as `auth-secret` writes it: `name` or `namespace/name`. Returns the
/// namespace (if given) and the name.
pub fn parse_secret_ref(v: &str) -> ParseResult<(Option<String>, String)> {
    let err = || {
        format!(
            "{v} is not a Secret reference (expected name or namespace/name)",
            v = quoted(v)
        )
    };
    let (namespace, name) = match v.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, v),
    };
    if let Some(ns) = namespace {
        crate::objects::validate_dns_label(ns).map_err(|_| err())?;
    }
    crate::objects::validate_dns_subdomain(name).map_err(|_| err())?;
    Ok((namespace.map(str::to_string), name.to_string()))
}

/// ALPN protocol names, comma-separated (`h2,http/1.1`): 1 to 16 names of letters, digits,
/// `.`, `-` and `/`, each at most 32 characters; spaces around commas are ignored.
pub fn parse_alpn(v: &str) -> ParseResult<Vec<String>> {
    let list: Vec<String> = v.split(',').map(|p| p.trim().to_string()).collect();
    let ok = (1..=16).contains(&list.len())
        && list.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 32
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'/'))
        });
    if ok {
        Ok(list)
    } else {
        Err(format!(
            "{v} is not a comma-separated list of ALPN protocol names (e.g. h2,http/1.1)",
            v = quoted(v)
        ))
    }
}

/// A user name of a `userlist`: letters, digits, `-`, `_` and `.` (what a Secret data key may
/// hold), at most 253 characters.
pub fn parse_user_name(v: &str) -> ParseResult<String> {
    let ok = !v.is_empty()
        && v.len() <= 253
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{v} is not a user name (letters, digits, '-', '_' and '.')",
            v = quoted(v)
        ))
    }
}

/// The crypt(3) schemes accepted for `userlist` passwords, as the messages name them.
pub const PASSWORD_SCHEMES: &str =
    "$6$ (SHA-512), $5$ (SHA-256), $y$ (yescrypt), $2b$/$2y$/$2a$ (bcrypt), $1$ (MD5) or DES";

/// A password hash HAProxy's crypt(3) (libxcrypt on Debian) can check: `$1$`, `$5$`, `$6$`,
/// `$2a$`/`$2b$`/`$2y$`, `$y$` or traditional DES (13 characters). Messages never quote the
/// value: it is a secret.
pub fn parse_password_hash(v: &str) -> ParseResult<String> {
    let unsupported = |what: &str| {
        format!(
            "the value is {what}, which crypt(3) cannot check; use one of {PASSWORD_SCHEMES} (e.g. `openssl passwd -6` or `htpasswd -nbB`)"
        )
    };
    if v.starts_with("$apr1$") {
        return Err(unsupported("an Apache $apr1$ MD5 hash (htpasswd -m)"));
    }
    if v.starts_with('{') {
        return Err(unsupported("an LDAP-style {SCHEME} hash"));
    }
    if v.contains(':') {
        return Err(
            "the value looks like htpasswd lines (user:hash); each Secret data key is one user name and its value that user's hash"
                .to_string(),
        );
    }
    if well_formed_hash(&v.split('$').collect::<Vec<_>>()) {
        Ok(v.to_string())
    } else if !v.starts_with('$') && v.len() != 13 {
        Err(format!(
            "the value is not a password hash (plain-text passwords are not accepted); use one of {PASSWORD_SCHEMES}"
        ))
    } else {
        Err(format!(
            "the value is not a well-formed hash of one of {PASSWORD_SCHEMES}"
        ))
    }
}

/// Whether the `$`-separated fields of a hash are one of the accepted schemes.
fn well_formed_hash(fields: &[&str]) -> bool {
    // The crypt(3) alphabet.
    let b64 = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/')
    };
    let salt = |s: &str, max: usize| s.len() <= max && b64(s);
    match fields {
        ["", "1", s, hash] => salt(s, 8) && hash.len() == 22 && b64(hash),
        ["", id @ ("5" | "6"), rest @ ..] => {
            let len = if *id == "5" { 43 } else { 86 };
            let (rounds, s, hash) = match rest {
                [s, hash] => (None, *s, *hash),
                [rounds, s, hash] => (Some(*rounds), *s, *hash),
                _ => return false,
            };
            let rounds_ok = rounds.is_none_or(|r| {
                r.strip_prefix("rounds=")
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|n| (1000..=999_999_999).contains(&n))
            });
            rounds_ok && salt(s, 16) && hash.len() == len && b64(hash)
        }
        ["", "2a" | "2b" | "2y", cost, rest] => {
            cost.len() == 2
                && cost.parse::<u8>().is_ok_and(|c| (4..=31).contains(&c))
                && rest.len() == 53
                && b64(rest)
        }
        ["", "y", params, s, hash] => b64(params) && salt(s, 86) && hash.len() == 43 && b64(hash),
        [des] => des.len() == 13 && b64(des),
        _ => false,
    }
}

/// Methods `cors-allow-methods` may list.
pub const CORS_METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// `*` or a comma-separated list of HTTP methods (any case); returned as `*` or the upper-case
/// methods joined by `, `, without repeats.
pub fn parse_http_methods(v: &str) -> ParseResult<String> {
    comma_list(v, "method", |item| {
        let m = item.to_ascii_uppercase();
        if CORS_METHODS.contains(&m.as_str()) {
            Ok(m)
        } else {
            Err(format!(
                "{item} is not one of {}",
                CORS_METHODS.join(", "),
                item = quoted(item)
            ))
        }
    })
}

/// `*` or a comma-separated list of header names; returned as `*` or the names joined by
/// `, `, without repeats.
pub fn parse_header_name_list(v: &str) -> ParseResult<String> {
    comma_list(v, "header name", parse_header_name)
}

fn comma_list(
    v: &str,
    what: &str,
    item: impl Fn(&str) -> ParseResult<String>,
) -> ParseResult<String> {
    if v.trim() == "*" {
        return Ok("*".to_string());
    }
    if v.chars().any(char::is_control) {
        return Err(format!("{v} contains control characters", v = quoted(v)));
    }
    let mut out: Vec<String> = Vec::new();
    for raw in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parsed = item(raw).map_err(|e| format!("{v}: {e}", v = quoted(v)))?;
        if !out.contains(&parsed) {
            out.push(parsed);
        }
    }
    if out.is_empty() {
        return Err(format!(
            "{v} is not '*' or a comma-separated list of {what}s",
            v = quoted(v)
        ));
    }
    Ok(out.join(", "))
}

/// An origin as a browser sends it: `scheme://host[:port]`, no path. Returned lowercased
/// (scheme and host are case-insensitive; browsers send them lowercased).
pub fn parse_origin(v: &str) -> ParseResult<String> {
    let lower = v.to_ascii_lowercase();
    let err = |why: &str| {
        format!(
            "{v} is not an origin (scheme://host[:port]): {why}",
            v = quoted(v)
        )
    };
    let (scheme, rest) = lower.split_once("://").ok_or_else(|| err("no ://"))?;
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_lowercase())
        && scheme.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.')
        });
    if !scheme_ok {
        return Err(err("bad scheme"));
    }
    if rest.contains('/') {
        return Err(err("an origin has no path (drop the trailing '/')"));
    }
    let (host_ok, port) = match rest.strip_prefix('[') {
        Some(after) => {
            let (ip, tail) = after.split_once(']').ok_or_else(|| err("unclosed '['"))?;
            let port = match tail {
                "" => None,
                t => Some(t.strip_prefix(':').ok_or_else(|| err("bad port"))?),
            };
            (ip.parse::<std::net::Ipv6Addr>().is_ok(), port)
        }
        None => {
            let (host, port) = match rest.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            };
            let ok = host.parse::<std::net::Ipv4Addr>().is_ok()
                || crate::objects::validate_dns_subdomain(host).is_ok();
            (ok, port)
        }
    };
    if !host_ok {
        return Err(err("bad host"));
    }
    if let Some(p) = port {
        let digits = !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
        if !digits || parse_int(p, 1, 65535).is_err() {
            return Err(err("bad port"));
        }
    }
    Ok(lower)
}

/// `cors-allow-origin`: `*`, a comma-separated list of origins (matched exactly), or a regular
/// expression anchored at both ends (`^...$`), matched against the request's `Origin`.
pub fn parse_cors_origin(v: &str) -> ParseResult<crate::model::CorsOrigin> {
    use crate::model::CorsOrigin;
    use regex_syntax::hir::Look;
    let t = v.trim();
    if t == "*" {
        return Ok(CorsOrigin::Any);
    }
    if !t.starts_with('^') {
        let mut origins: Vec<String> = Vec::new();
        for item in t.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let origin = parse_origin(item).map_err(|e| {
                format!("{e} (a regular expression must start with '^' and end with '$')")
            })?;
            if !origins.contains(&origin) {
                origins.push(origin);
            }
        }
        if origins.is_empty() {
            return Err(format!(
                "{v} is not '*', a list of origins or a regular expression",
                v = quoted(v)
            ));
        }
        return Ok(CorsOrigin::List(origins));
    }
    // Matched by an ACL (`var(txn.cors_origin) -m reg`), case-sensitive.
    let regex = parse_regex_at(t, RegexPlace::Acl { ignore_case: false })?;
    // Whether every alternative is anchored is read with `regex-syntax`, which knows the
    // structure of a pattern; one it cannot read is refused, so the check fails closed.
    let hir = regex_syntax::Parser::new().parse(&regex).map_err(|e| {
        format!(
            "{v}: Portcullis cannot tell whether this regex is anchored ({e})",
            v = quoted(v)
        )
    })?;
    let props = hir.properties();
    if !(props.look_set_prefix().contains(Look::Start)
        && props.look_set_suffix().contains(Look::End))
    {
        return Err(format!(
            "{v}: a regular expression must be anchored at both ends ('^...$', in every alternative) so that it cannot match part of an origin",
            v = quoted(v)
        ));
    }
    Ok(CorsOrigin::Regex(regex))
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
    fn balance_takes_haproxys_options_in_canonical_form() {
        for (v, want) in [
            ("leastconn", "leastconn"),
            ("uri  whole", "uri whole"),
            (
                "uri len 10 depth 2 path-only",
                "uri len 10 depth 2 path-only",
            ),
            ("url_param uid", "url_param uid"),
            ("url_param uid check_post 64", "url_param uid check_post 64"),
            ("hdr(X-User) use_domain_only", "hdr(X-User) use_domain_only"),
            ("random(2)", "random(2)"),
            ("random", "random"),
            ("rdp-cookie(mstshash)", "rdp-cookie(mstshash)"),
        ] {
            assert_eq!(parse_balance(v).as_deref(), Ok(want), "{v}");
        }
        for v in [
            "",
            "leastconn whole",
            "uri whole whole",
            "uri len",
            "uri len 0",
            "uri len x",
            "uri fast",
            "url_param",
            "url_param uid check_post x",
            "url_param uid max_wait 10",
            "hdr(X-User",
            "hdr(a b)",
            "hdr",
            "random(0)",
            "random(2) whole",
            "random(x)",
            "rdp-cookie(a;b)",
            "source(1)",
            "hash path",
            "uri\nlua-load /x",
        ] {
            assert!(parse_balance(v).is_err(), "{v:?}");
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
        assert_eq!(parse_size("16m"), Ok(MAX_TABLE_ENTRIES));
        assert!(parse_size("16385k").is_err());
        assert!(parse_size("4g").is_err());
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
            parse_header_lines("X-A one two\nX-B b\n", None),
            Ok(vec![
                ("X-A".into(), "one two".into()),
                ("X-B".into(), "b".into())
            ])
        );
        assert_eq!(
            parse_header_lines(
                "Cache-Control \"no-store,no-cache,private\"\nX-Client %[src]",
                Some(Direction::Request)
            ),
            Ok(vec![
                ("Cache-Control".into(), "no-store,no-cache,private".into()),
                ("X-Client".into(), "%[src]".into())
            ])
        );
        assert!(parse_header_lines("X-Status %[status]", Some(Direction::Request)).is_err());
        assert!(parse_header_lines("X-Status %[status]", None).is_ok());
        assert!(parse_regex("^/api/(.*)$").is_ok());
        assert!(parse_regex("^/api/(.*").is_err());
        assert!(parse_regex("a$b").is_err());
        assert!(parse_replacement("/\\1").is_ok());
    }

    /// Regexes Rust's regex syntax accepts but HAProxy's PCRE2 refuses, in every place a
    /// regex is written.
    #[test]
    fn regexes_pcre2_refuses_are_refused_everywhere() {
        for bad in [
            "(?u)^/x",
            "^/a{65536}",
            r"\u0041",
            r"\U00000041",
            r"^/\N{U+0041}",
            r"^/(?<=a+)b",
            r"^/\L",
        ] {
            let e = parse_regex(bad).unwrap_err();
            assert!(e.contains("PCRE2"), "{bad:?}: {e}");
            assert!(
                parse_route_acl(&format!("path -m reg {bad}")).is_err(),
                "route-acl {bad:?}"
            );
            assert!(
                parse_route_acl(&format!("path -i -m reg {bad}")).is_err(),
                "route-acl -i {bad:?}"
            );
            let anchored = format!("^https://{}$", bad.trim_start_matches('^'));
            assert!(parse_cors_origin(&anchored).is_err(), "cors {anchored:?}");
        }
        // A numbered back reference exists in a rewrite, not in an ACL (no auto capture).
        assert!(parse_regex(r"^/(a)\1$").is_ok());
        assert!(parse_route_acl(r"path -m reg ^/(a)\1$").is_err());
        assert!(parse_cors_origin(r"^https://(a)\1\.com$").is_err());
        assert!(parse_route_acl(r"path -m reg ^/(?<x>a)\k<x>$").is_ok());
    }

    #[test]
    fn cookie_names_keys_and_proxy_protocols() {
        assert_eq!(parse_cookie_name("SERVERID").as_deref(), Ok("SERVERID"));
        assert!(parse_cookie_name("").is_err());
        assert!(parse_cookie_name("a=b").is_err());
        assert!(parse_cookie_name(&"x".repeat(65)).is_err());
        assert_eq!(
            parse_cookie_key("c2VjcmV0a2V5MTIz\n").as_deref(),
            Ok("c2VjcmV0a2V5MTIz")
        );
        assert!(parse_cookie_key("short").is_err());
        let refused = parse_cookie_key("secret-value with space").unwrap_err();
        assert!(!refused.contains("secret-value"), "{refused}");
        assert_eq!(parse_send_proxy("proxy").as_deref(), Ok("send-proxy"));
        assert_eq!(
            parse_send_proxy(" proxy-v2 ").as_deref(),
            Ok("send-proxy-v2")
        );
        assert!(parse_send_proxy("proxy-v3").is_err());
        for v in HOSTILE {
            assert!(parse_cookie_name(v).is_err(), "cookie name {v:?}");
            assert!(parse_cookie_key(v).is_err(), "cookie key {v:?}");
            assert!(parse_send_proxy(v).is_err(), "send-proxy {v:?}");
        }
    }
}

#[cfg(test)]
mod edge_tests {
    use super::*;
    use crate::model::CorsOrigin;

    #[test]
    fn secret_refs() {
        assert_eq!(parse_secret_ref("creds"), Ok((None, "creds".into())));
        assert_eq!(
            parse_secret_ref("auth/creds"),
            Ok((Some("auth".into()), "creds".into()))
        );
        for bad in ["", "a/b/c", "Creds", "/creds", "ns/", "a b", "x\ny"] {
            assert!(parse_secret_ref(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn password_hashes_of_the_accepted_schemes_only() {
        for good in [
            "$1$erinsalt$.NKQEemjAnBemnhxO8kSk/",
            "$5$rounds=5000$franksalt$l//PjMkyS8JLnmiCK./kmq8vd2R/NQ3ViW4B.7raCR3",
            "$6$saltsalt$6Ln9l6BtDgyKwSHwdUE47gnhcuIsgmQhFvEwo9YcWYBgzykQj0GKDn5SZB7NxuK0rgczjYbaFhtalyn4hhc8k1",
            "$2y$05$bobbobbobbobbobbobbobu8bcX0qdbFERObRmMPfdv9EJc5Iht9Hi",
            "$2b$05$gracegracegracegraceg.yIekJDm4IdPR4Sot0q.mAaZBlGQQdbm",
            "$y$j9T$F5Jx5fExrKuPp53xLKQ..1$wAfDpu8wV6TrqRh6kNE13avyKIoIJavt6efEtNirXLA",
            "hdLhgkDIDCglA",
        ] {
            assert_eq!(parse_password_hash(good).as_deref(), Ok(good));
        }
        for bad in [
            "$apr1$abcdefgh$0123456789012345678901",
            "{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=",
            "alice:$6$x$y",
            "hunter2",
            "$6$salt$short",
            "$5$rounds=10$franksalt$l//PjMkyS8JLnmiCK./kmq8vd2R/NQ3ViW4B.7raCR3",
            "$2y$99$bobbobbobbobbobbobbobu8bcX0qdbFERObRmMPfdv9EJc5Iht9Hi",
            "$7$CU..../....abcdefgh$T0sduvKxu8wrIjSE2QDlEIQ24zoUNt7XmCAyI.79rw6",
            "$1$erinsalt$.NKQEemjAnBemnhxO8kSk/ x",
            "$1$erinsalt$.NKQEemjAnBemnhxO8kSk'",
            "",
        ] {
            let e = parse_password_hash(bad).unwrap_err();
            assert!(bad.len() < 8 || !e.contains(bad), "{e} quotes the secret");
        }
        for v in [
            "a\nb",
            "x # y",
            "it's",
            "say \"hi\"",
            "%[env(SECRET)]",
            "${HOME}",
            " lua-load /x",
            "a\u{0}b",
        ] {
            assert!(parse_password_hash(v).is_err(), "{v:?}");
            assert!(parse_user_name(v).is_err(), "{v:?}");
            assert!(parse_http_methods(v).is_err(), "{v:?}");
            assert!(parse_header_name_list(v).is_err(), "{v:?}");
            assert!(parse_cors_origin(v).is_err(), "{v:?}");
        }
    }

    #[test]
    fn cors_values() {
        assert_eq!(parse_cors_origin(" * "), Ok(CorsOrigin::Any));
        assert_eq!(
            parse_cors_origin("https://App.example.com, http://[::1]:8080,https://app.example.com"),
            Ok(CorsOrigin::List(vec![
                "https://app.example.com".into(),
                "http://[::1]:8080".into()
            ]))
        );
        let re = r"^https://(.+\.)?(example-1\.com|example-2\.com)(:\d{1,5})?$";
        assert_eq!(parse_cors_origin(re), Ok(CorsOrigin::Regex(re.into())));
        for bad in [
            "https://a.com/",
            "a.com",
            "https://a.com:0",
            "https://a.com:99999",
            "null",
            "^https://a\\.com",
            "^https://a\\.com$|evil$",
            ",",
            "",
        ] {
            assert!(parse_cors_origin(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_http_methods("get, POST,get").as_deref(),
            Ok("GET, POST")
        );
        assert_eq!(parse_http_methods("*").as_deref(), Ok("*"));
        assert!(parse_http_methods("GET, FETCH").is_err());
        assert_eq!(
            parse_header_name_list("Content-Type,X-Id").as_deref(),
            Ok("Content-Type, X-Id")
        );
        assert!(parse_header_name_list("X-A, X B").is_err());
    }
}
