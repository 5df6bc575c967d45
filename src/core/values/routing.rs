//! Parsers for the routing annotations: `request-redirect`, `request-capture`, `route-acl`
//! and `path-rewrite`.
//!
//! Each accepts a narrow subset of what HAProxy itself would take and returns it in a
//! canonical form; parsing the canonical form again gives the same value. Nothing here lets a
//! value hold whitespace where one word is expected, quotes, `#`, `$`, `%`, `{` or `}`.

use super::{
    ParseResult, RegexPlace, parse_cidr_list, parse_header_name, parse_host_header, parse_regex_at,
};
use crate::diagnostics::quoted;
use crate::model::AclCondition;

/// Where `request-redirect` sends a request: `host[:port]`, optionally after `http://` or
/// `https://` (one trailing `/` is allowed and dropped). Returns the scheme (none: the
/// request's own scheme is kept) and `host[:port]`.
pub fn parse_redirect_target(v: &str) -> ParseResult<(Option<String>, String)> {
    let lower = v.to_ascii_lowercase();
    let (scheme, rest) = if lower.starts_with("https://") {
        (Some("https"), &v[8..])
    } else if lower.starts_with("http://") {
        (Some("http"), &v[7..])
    } else if v.contains("://") {
        return Err(format!(
            "{v}: only http:// and https:// redirects are possible",
            v = quoted(v)
        ));
    } else {
        (None, v)
    };
    let host = rest.strip_suffix('/').unwrap_or(rest);
    if host.contains('/') {
        return Err(format!(
            "{v} has a path; request-redirect takes a host or scheme://host[:port] and keeps the request's path",
            v = quoted(v)
        ));
    }
    if host.starts_with(':') {
        return Err(format!(
            "{v}: a port alone is not a redirect target",
            v = quoted(v)
        ));
    }
    let host = parse_host_header(host).map_err(|_| {
        format!(
            "{v} is not a redirect target (host, host:port, http://host[:port] or https://host[:port]; lowercase host name)", v = quoted(v)
        )
    })?;
    Ok((scheme.map(str::to_string), host))
}

/// The canonical text of a redirect target: `host[:port]` or `scheme://host[:port]`.
pub fn redirect_target_text(scheme: Option<&str>, host: &str) -> String {
    match scheme {
        Some(s) => format!("{s}://{host}"),
        None => host.to_string(),
    }
}

/// Sample fetches `request-capture` may name with a header name as argument.
const CAPTURE_HEADER_FETCHES: &[&str] = &["hdr", "req.hdr", "req.fhdr"];
/// ... with a cookie name.
const CAPTURE_COOKIE_FETCHES: &[&str] = &["cookie", "req.cook"];
/// ... with a URL parameter name.
const CAPTURE_PARAM_FETCHES: &[&str] = &["url_param", "urlp"];
/// ... without an argument.
const CAPTURE_PLAIN_FETCHES: &[&str] = &[
    "base",
    "method",
    "path",
    "query",
    "src",
    "ssl_fc_cipher",
    "ssl_fc_protocol",
    "ssl_fc_sni",
    "url",
];

/// The most expressions one `request-capture` value may list.
const MAX_CAPTURES: usize = 32;

/// One sample expression `request-capture` may log: `hdr(<name>)`, `req.hdr(<name>)`,
/// `req.fhdr(<name>)`, `cookie(<name>)`, `req.cook(<name>)`, `url_param(<name>)`,
/// `urlp(<name>)`, or one of [`CAPTURE_PLAIN_FETCHES`]. No converters. Names are letters,
/// digits, `-`, `_` and `.`.
pub fn parse_capture_sample(v: &str) -> ParseResult<String> {
    let expected = || {
        format!(
            "{v} is not a sample expression Portcullis captures (hdr(<name>), req.hdr(<name>), req.fhdr(<name>), cookie(<name>), req.cook(<name>), url_param(<name>), urlp(<name>), or one of {})",
            CAPTURE_PLAIN_FETCHES.join(", "),
            v = quoted(v)
        )
    };
    if CAPTURE_PLAIN_FETCHES.contains(&v) {
        return Ok(v.to_string());
    }
    let (fetch, arg) = v
        .strip_suffix(')')
        .and_then(|s| s.split_once('('))
        .ok_or_else(expected)?;
    let known = CAPTURE_HEADER_FETCHES
        .iter()
        .chain(CAPTURE_COOKIE_FETCHES)
        .chain(CAPTURE_PARAM_FETCHES)
        .any(|f| *f == fetch);
    if !known {
        return Err(expected());
    }
    let name = parse_header_name(arg).map_err(|e| format!("{v}: {e}", v = quoted(v)))?;
    Ok(format!("{fetch}({name})"))
}

/// `request-capture`: one sample expression per line (blank lines skipped, surrounding spaces
/// of a line ignored), at most [`MAX_CAPTURES`]. One bad line rejects the whole value.
pub fn parse_capture_samples(v: &str) -> ParseResult<Vec<String>> {
    if let Some(c) = v.chars().find(|c| c.is_control() && *c != '\n') {
        return Err(format!(
            "{v} contains the control character {c:?}",
            v = quoted(v)
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for (i, line) in v.split('\n').enumerate() {
        let line = line.trim_matches(' ');
        if line.is_empty() {
            continue;
        }
        let sample = parse_capture_sample(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        if !out.contains(&sample) {
            out.push(sample);
        }
    }
    if out.is_empty() {
        return Err("no sample expression".to_string());
    }
    if out.len() > MAX_CAPTURES {
        return Err(format!(
            "{} sample expressions; at most {MAX_CAPTURES} are allowed",
            out.len()
        ));
    }
    Ok(out)
}

/// Match methods a `route-acl` string fetch may use.
const ACL_METHODS: &[&str] = &["found", "str", "beg", "sub", "reg"];
/// Comparison operators of `rand(<n>)`.
const ACL_OPERATORS: &[&str] = &["lt", "le", "gt", "ge", "eq"];
/// The most patterns one condition may list.
const MAX_ACL_VALUES: usize = 32;

/// What a `route-acl` fetch returns, which decides how it is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FetchKind {
    /// Strings: `-m found|str|beg|sub|reg`, optionally `-i`.
    Text,
    /// The client address, matched against addresses and CIDR blocks.
    Address,
    /// `rand(<n>)`, compared with an integer.
    Random(i64),
}

/// A `route-acl` condition, a small safe subset of HAProxy's ACL syntax:
///
/// - `cookie(<name>)` (or `req.cook`), `hdr(<name>)` (or `req.hdr`), `url_param(<name>)` (or
///   `urlp`), `path` or `query`, then optionally `-i`, then `-m found` or `-m str|beg|sub|reg`
///   followed by 1 to 32 patterns (without `-m`, `str`);
/// - `src` followed by IP addresses or CIDR blocks (optionally `-m ip`);
/// - `rand(<n>) lt|le|gt|ge|eq <integer>`, e.g. `rand(100) lt 25` (a random share).
///
/// Words are separated by spaces. Patterns: printable ASCII without quotes, `\`, `#`, `$`,
/// `%`, `{` or `}`, not starting with `-`, at most 256 characters; `reg` patterns are regular
/// expressions (`\` allowed, printed quoted). Fetches are written in canonical form
/// (`req.cook`, `req.hdr`, `url_param`).
pub fn parse_route_acl(v: &str) -> ParseResult<AclCondition> {
    if let Some(c) = v.chars().find(|c| c.is_control()) {
        return Err(format!(
            "{v} contains the control character {c:?}",
            v = quoted(v)
        ));
    }
    let words: Vec<&str> = v.split(' ').filter(|w| !w.is_empty()).collect();
    let Some((first, rest)) = words.split_first() else {
        return Err("the condition is empty".to_string());
    };
    let (fetch, kind) = parse_acl_fetch(first).map_err(|e| format!("{v}: {e}", v = quoted(v)))?;
    let mut ignore_case = false;
    let mut method: Option<&str> = None;
    let mut i = 0;
    while let Some(word) = rest.get(i) {
        match *word {
            "-i" if kind == FetchKind::Text && !ignore_case => ignore_case = true,
            "-m" if method.is_none() => {
                let m = rest
                    .get(i + 1)
                    .ok_or_else(|| format!("{v}: -m needs a match method", v = quoted(v)))?;
                let allowed: &[&str] = match kind {
                    FetchKind::Text => ACL_METHODS,
                    FetchKind::Address => &["ip"],
                    FetchKind::Random(_) => &[],
                };
                if !allowed.contains(m) {
                    return Err(format!(
                        "{v}: -m {m} is not possible here (allowed: {})",
                        if allowed.is_empty() {
                            "none".to_string()
                        } else {
                            allowed.join(", ")
                        },
                        v = quoted(v)
                    ));
                }
                method = Some(m);
                i += 1;
            }
            w if w.starts_with('-') => {
                return Err(format!(
                    "{v}: {w} is not possible here (only -i, and -m once, before the patterns)",
                    v = quoted(v)
                ));
            }
            _ => break,
        }
        i += 1;
    }
    let values = &rest[i..];
    let condition = |method: Option<&str>, values: Vec<String>| AclCondition {
        fetch: fetch.clone(),
        ignore_case,
        method: method.map(str::to_string),
        values,
    };
    match kind {
        FetchKind::Text => {
            let method = method.unwrap_or("str");
            if method == "found" {
                if !values.is_empty() {
                    return Err(format!("{v}: -m found takes no pattern", v = quoted(v)));
                }
                return Ok(condition(Some(method), Vec::new()));
            }
            if values.is_empty() {
                return Err(format!(
                    "{v}: -m {method} needs at least one pattern",
                    v = quoted(v)
                ));
            }
            if values.len() > MAX_ACL_VALUES {
                return Err(format!(
                    "{v}: at most {MAX_ACL_VALUES} patterns are allowed",
                    v = quoted(v)
                ));
            }
            let mut out = Vec::new();
            for value in values {
                out.push(if method == "reg" {
                    parse_acl_regex(value, ignore_case)
                        .map_err(|e| format!("{v}: {e}", v = quoted(v)))?
                } else {
                    parse_acl_pattern(value).map_err(|e| format!("{v}: {e}", v = quoted(v)))?
                });
            }
            Ok(condition(Some(method), out))
        }
        FetchKind::Address => {
            if values.is_empty() {
                return Err(format!(
                    "{v}: src needs IP addresses or CIDR blocks",
                    v = quoted(v)
                ));
            }
            let cidrs = parse_cidr_list(&values.join(" "))
                .map_err(|e| format!("{v}: {e}", v = quoted(v)))?;
            if cidrs.len() > MAX_ACL_VALUES {
                return Err(format!(
                    "{v}: at most {MAX_ACL_VALUES} addresses are allowed",
                    v = quoted(v)
                ));
            }
            Ok(condition(None, cidrs))
        }
        FetchKind::Random(range) => match values {
            [op, n] if ACL_OPERATORS.contains(op) => {
                let n = super::parse_int(n, 0, range)
                    .map_err(|e| format!("{v}: {e}", v = quoted(v)))?;
                Ok(condition(None, vec![op.to_string(), n.to_string()]))
            }
            _ => Err(format!(
                "{v}: rand(<n>) is compared with an integer: rand({range}) lt|le|gt|ge|eq <number>",
                v = quoted(v)
            )),
        },
    }
}

/// The canonical text of a condition, which [`parse_route_acl`] reads back unchanged.
pub fn route_acl_text(c: &AclCondition) -> String {
    let mut words = vec![c.fetch.clone()];
    if c.ignore_case {
        words.push("-i".to_string());
    }
    if let Some(m) = &c.method {
        words.push("-m".to_string());
        words.push(m.clone());
    }
    words.extend(c.values.iter().cloned());
    words.join(" ")
}

fn parse_acl_fetch(word: &str) -> ParseResult<(String, FetchKind)> {
    let expected = || {
        format!(
            "{word} is not a fetch route-acl accepts (cookie(<name>), req.cook(<name>), hdr(<name>), req.hdr(<name>), url_param(<name>), urlp(<name>), path, query, src, rand(<n>))",
            word = quoted(word)
        )
    };
    match word {
        "path" | "query" => return Ok((word.to_string(), FetchKind::Text)),
        "src" => return Ok((word.to_string(), FetchKind::Address)),
        _ => {}
    }
    let (fetch, arg) = word
        .strip_suffix(')')
        .and_then(|s| s.split_once('('))
        .ok_or_else(expected)?;
    let canonical = match fetch {
        "cookie" | "req.cook" => "req.cook",
        "hdr" | "req.hdr" => "req.hdr",
        "url_param" | "urlp" => "url_param",
        "rand" => {
            let n = super::parse_int(arg, 1, 1_000_000)
                .map_err(|e| format!("{word}: rand's range: {e}", word = quoted(word)))?;
            if arg != n.to_string() {
                return Err(format!(
                    "{word}: rand's range must be a plain number",
                    word = quoted(word)
                ));
            }
            return Ok((format!("rand({n})"), FetchKind::Random(n)));
        }
        _ => return Err(expected()),
    };
    let name = parse_header_name(arg).map_err(|e| format!("{word}: {e}", word = quoted(word)))?;
    Ok((format!("{canonical}({name})"), FetchKind::Text))
}

/// A `str`, `beg` or `sub` pattern: one word.
fn parse_acl_pattern(v: &str) -> ParseResult<String> {
    if v.is_empty() || v.len() > 256 {
        return Err(format!(
            "pattern {v} must be 1 to 256 characters",
            v = quoted(v)
        ));
    }
    if v.starts_with('-') {
        return Err(format!(
            "pattern {v} starts with '-', which HAProxy would read as a flag",
            v = quoted(v)
        ));
    }
    if let Some(bad) = v.chars().find(|&c| {
        !('!'..='~').contains(&c) || matches!(c, '\'' | '"' | '\\' | '#' | '$' | '%' | '{' | '}')
    }) {
        return Err(format!(
            "pattern {v} contains {bad:?}; patterns may not contain quotes, '\\', '#', '$', '%', '{{' or '}}'",
            v = quoted(v)
        ));
    }
    Ok(v.to_string())
}

/// A `reg` pattern: a regular expression as [`parse_regex_at`] accepts it for an ACL (no
/// automatic captures, caseless with `-i`), not starting with `-` and not a lone brace.
fn parse_acl_regex(v: &str, ignore_case: bool) -> ParseResult<String> {
    if v.starts_with('-') || v == "{" || v == "}" {
        return Err(format!(
            "pattern {v} would be read as a flag or a brace of the condition",
            v = quoted(v)
        ));
    }
    parse_regex_at(v, RegexPlace::Acl { ignore_case })
}

/// The incumbent's `path-rewrite` syntax: one word replaces the whole path, two words are a
/// regex and its replacement.
pub fn parse_rewrite(v: &str) -> ParseResult<(String, String)> {
    if v.trim() != v || v.chars().any(char::is_control) {
        return Err(format!(
            "{v} has leading or trailing whitespace or control characters",
            v = quoted(v)
        ));
    }
    let words: Vec<&str> = v.split(' ').filter(|w| !w.is_empty()).collect();
    match words.as_slice() {
        [repl] => Ok(("(.*)".to_string(), super::parse_replacement(repl)?)),
        [re, repl] => Ok((super::parse_regex(re)?, super::parse_replacement(repl)?)),
        _ => Err(format!(
            "{v} is not 'REPLACEMENT' or 'REGEX REPLACEMENT' (one or two words)",
            v = quoted(v)
        )),
    }
}

/// `path-rewrite` as the incumbent reads it: one rule per line (see [`parse_rewrite`]), applied
/// in order; blank lines are skipped.
pub fn parse_rewrites(v: &str) -> ParseResult<Vec<(String, String)>> {
    let mut rules = Vec::new();
    for (i, line) in v.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line).trim();
        if line.is_empty() {
            continue;
        }
        rules.push(parse_rewrite(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    if rules.is_empty() {
        return Err("no rewrite rule".to_string());
    }
    if rules.len() > super::MAX_REWRITES {
        return Err(format!(
            "{} rewrite rules, more than {}",
            rules.len(),
            super::MAX_REWRITES
        ));
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_targets() {
        let ok = |v: &str| parse_redirect_target(v).unwrap();
        assert_eq!(ok("example.com"), (None, "example.com".to_string()));
        assert_eq!(
            ok("example.com:8888"),
            (None, "example.com:8888".to_string())
        );
        assert_eq!(
            ok("https://example.com:8443"),
            (Some("https".to_string()), "example.com:8443".to_string())
        );
        assert_eq!(
            ok("HTTP://example.com/"),
            (Some("http".to_string()), "example.com".to_string())
        );
        for bad in [
            ":8080",
            "ftp://example.com",
            "https://example.com/x",
            "Example.com",
            "example.com:0",
            "example.com%0a",
            "https://",
            "a b",
        ] {
            assert!(parse_redirect_target(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn capture_samples() {
        assert_eq!(
            parse_capture_samples("cookie(my-cookie)\n  hdr(Host)\n\nreq.fhdr(user-agent)\n"),
            Ok(vec![
                "cookie(my-cookie)".to_string(),
                "hdr(Host)".to_string(),
                "req.fhdr(user-agent)".to_string()
            ])
        );
        assert_eq!(parse_capture_samples("src"), Ok(vec!["src".to_string()]));
        for bad in [
            "",
            "\n",
            "hdr(a b)",
            "hdr(x),lower",
            "env(SECRET)",
            "hdr()",
            "lua.x(y)",
            "hdr(x)\nhdr(%[env(X)])",
            "hdr(x)\r",
        ] {
            assert!(parse_capture_samples(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn route_acls() {
        let text = |v: &str| route_acl_text(&parse_route_acl(v).unwrap());
        assert_eq!(
            text("cookie(staging) -m found"),
            "req.cook(staging) -m found"
        );
        assert_eq!(text("hdr(X-Canary) yes"), "req.hdr(X-Canary) -m str yes");
        assert_eq!(
            text("req.hdr(x-canary) -i -m beg on yes"),
            "req.hdr(x-canary) -i -m beg on yes"
        );
        assert_eq!(text("path -m reg ^/v2/"), "path -m reg ^/v2/");
        assert_eq!(text("urlp(beta) -m str 1"), "url_param(beta) -m str 1");
        assert_eq!(
            text("src 10.0.0.0/8 192.168.1.1"),
            "src 10.0.0.0/8 192.168.1.1"
        );
        assert_eq!(text("rand(100) lt 25"), "rand(100) lt 25");
        for good in [
            "cookie(staging) -m found",
            "path -m reg ^/(a|b)\\d{2}$",
            "src -m ip 2001:db8::/32",
        ] {
            let once = text(good);
            assert_eq!(text(&once), once, "canonical form of {good:?} is stable");
        }
        for bad in [
            "",
            "cookie(staging) -m found yes",
            "cookie(staging) -m str",
            "cookie(a b) -m found",
            "env(X) -m found",
            "hdr(x) -m str }",
            "hdr(x) -m str { or",
            "hdr(x) -m str -f",
            "hdr(x) -m str a#b",
            "hdr(x) -m str %[env(X)]",
            "hdr(x) -m str 'a'",
            "hdr(x) -m dom a",
            "hdr(x) -m found -m found",
            "hdr(x) -m str a\nhdr(y)",
            "src",
            "src nonsense",
            "src -i 10.0.0.1",
            "rand(100) lt",
            "rand(100) lt 101",
            "rand(0) lt 1",
            "rand(100) foo 1",
            "path -m reg a$b",
            "path -m reg }",
        ] {
            assert!(parse_route_acl(bad).is_err(), "{bad:?}");
        }
    }
}
