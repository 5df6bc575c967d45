//! Header values as the incumbent writes them (`request-set-header`, `response-set-header`):
//! text, optionally in double quotes, with sample fetches `%[…]` from a vetted list.
//!
//! HAProxy reads the value of `http-request set-header` as a log format: `%[expr]` is replaced
//! by a sample expression's result, and `%%` is a literal `%`. A sample expression can read
//! much more than a header should carry (the environment with `env()`, files with `map()`,
//! other tenants' stick tables), so only the fetches and converters listed here are accepted.
//!
//! The parsed value is kept in its **format** form, the text HAProxy must receive once
//! haproxy.cfg's quoting is undone: literal text with every `%` doubled, and `%[expr]` for
//! each sample. [`check_format`] tells whether a string is such a value; the `lf` filter of
//! the output guard checks it again before printing it in double quotes.

use crate::diagnostics::quoted;

use super::{ParseResult, parse_header_name};

/// Which message a header belongs to: sample fetches of the request are not available when
/// the response's headers are set, and the other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Request,
    Response,
}

/// What a fetch takes in its parentheses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arg {
    /// Nothing: no parentheses.
    None,
    /// A distinguished name's field, optionally with its occurrence: `CN`, `cn,1`.
    DnField,
    /// A header name (required).
    Header,
    /// A cookie name (required).
    Cookie,
}

/// The sample fetches a header value may use: name, argument, where it is available
/// (`None`: both directions).
const FETCHES: &[(&str, Arg, Option<Direction>)] = &[
    ("src", Arg::None, None),
    ("src_port", Arg::None, None),
    ("dst", Arg::None, None),
    ("dst_port", Arg::None, None),
    ("ssl_fc", Arg::None, None),
    ("ssl_fc_sni", Arg::None, None),
    ("ssl_fc_protocol", Arg::None, None),
    ("ssl_fc_cipher", Arg::None, None),
    ("ssl_c_used", Arg::None, None),
    ("ssl_c_verify", Arg::None, None),
    ("ssl_c_serial", Arg::None, None),
    ("ssl_c_sha1", Arg::None, None),
    ("ssl_c_notbefore", Arg::None, None),
    ("ssl_c_notafter", Arg::None, None),
    ("ssl_c_s_dn", Arg::DnField, None),
    ("ssl_c_i_dn", Arg::DnField, None),
    ("unique-id", Arg::None, None),
    ("method", Arg::None, Some(Direction::Request)),
    ("path", Arg::None, Some(Direction::Request)),
    ("base", Arg::None, Some(Direction::Request)),
    ("url", Arg::None, Some(Direction::Request)),
    ("query", Arg::None, Some(Direction::Request)),
    ("req.hdr", Arg::Header, Some(Direction::Request)),
    ("hdr", Arg::Header, Some(Direction::Request)),
    ("req.cook", Arg::Cookie, Some(Direction::Request)),
    ("status", Arg::None, Some(Direction::Response)),
    ("res.hdr", Arg::Header, Some(Direction::Response)),
];

/// The converters a header value's sample may go through, and whether each takes a number.
const CONVERTERS: &[(&str, bool)] = &[
    ("lower", false),
    ("upper", false),
    ("base64", false),
    ("hex", false),
    ("json", false),
    ("ipmask", true),
];

/// The most samples one header value may hold.
const MAX_SAMPLES: usize = 8;

/// The sample fetches accepted in a header value, for documentation and messages.
pub fn fetch_names() -> impl Iterator<Item = &'static str> {
    FETCHES.iter().map(|(n, ..)| *n)
}

/// The converters accepted in a header value.
pub fn converter_names() -> impl Iterator<Item = &'static str> {
    CONVERTERS.iter().map(|(n, _)| *n)
}

/// A header value as an annotation writes it, in its format form (see the module's doc).
///
/// The value may be in double quotes, as the incumbent writes them and as HAProxy reads them:
/// inside, `\"` is a quote and `\\` a backslash. Quoted or not, the value is text with
/// sample fetches `%[…]` (from the vetted list, for `direction`) and `%%` for a literal `%`.
/// Refused: control characters, surrounding whitespace, a `$` (HAProxy expands environment
/// variables in double quotes), any other `%`, and any other backslash escape.
pub fn parse_header_format(v: &str, direction: Direction) -> ParseResult<String> {
    let inner = match v.strip_prefix('"') {
        Some(rest) => rest
            .strip_suffix('"')
            .filter(|_| v.len() >= 2)
            .ok_or_else(|| format!("{v} opens a double quote it does not close", v = quoted(v)))?,
        None => v,
    };
    let mut text = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => text.push(e),
                other => {
                    return Err(format!(
                        "{v}: only \\\" and \\\\ are escapes in a header value (found \\{})",
                        other.map(String::from).unwrap_or_default(),
                        v = quoted(v)
                    ));
                }
            },
            '"' => {
                return Err(format!(
                    "{v}: a double quote inside the value must be written \\\"",
                    v = quoted(v)
                ));
            }
            c => text.push(c),
        }
    }
    check_format_for(&text, Some(direction)).map_err(|e| format!("{v}: {e}", v = quoted(v)))?;
    Ok(text)
}

/// Whether `v` is a header value in format form (see the module's doc), for either direction.
pub fn check_format(v: &str) -> ParseResult<()> {
    check_format_for(v, None)
}

/// Whether `v` is a header value in format form whose samples are available in `direction`
/// (`None`: the fetch is known, wherever it is available).
pub fn check_format_for(v: &str, direction: Option<Direction>) -> ParseResult<()> {
    if v.is_empty() || v.len() > 4096 {
        return Err("a header value must be 1 to 4096 characters".to_string());
    }
    if v.starts_with(' ') || v.ends_with(' ') {
        return Err("a header value may not start or end with whitespace".to_string());
    }
    if let Some(c) = v.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!(
            "{c:?} is not allowed in a header value (printable ASCII only)"
        ));
    }
    if v.contains('$') {
        return Err(
            "a $ is not allowed in a header value (HAProxy would read an environment variable)"
                .to_string(),
        );
    }
    let mut samples = 0;
    let mut rest = v;
    while let Some(at) = rest.find('%') {
        let after = &rest[at + 1..];
        if let Some(r) = after.strip_prefix('%') {
            rest = r;
            continue;
        }
        let Some(expr) = after.strip_prefix('[') else {
            return Err(
                "a % must start a sample fetch %[...] or be written %% for a literal %".to_string(),
            );
        };
        let end = expr
            .find(']')
            .ok_or_else(|| "a sample fetch %[... is not closed with ]".to_string())?;
        check_sample(&expr[..end], direction)?;
        samples += 1;
        if samples > MAX_SAMPLES {
            return Err(format!(
                "a header value may hold at most {MAX_SAMPLES} sample fetches"
            ));
        }
        rest = &expr[end + 1..];
    }
    Ok(())
}

/// `fetch[(arg)][,converter[(n)]]...`, from the vetted lists.
fn check_sample(expr: &str, direction: Option<Direction>) -> ParseResult<()> {
    let mut parts = split_top(expr)?.into_iter();
    let first = parts.next().unwrap_or_default();
    let (name, arg) = call(first)?;
    let Some((_, kind, only)) = FETCHES.iter().find(|(n, ..)| *n == name) else {
        return Err(format!(
            "the sample fetch {} is not allowed in a header value (allowed: {})",
            quoted(name),
            fetch_names().collect::<Vec<_>>().join(", ")
        ));
    };
    if let (Some(only), Some(want)) = (only, direction) {
        if *only != want {
            let (is, isnt) = match only {
                Direction::Request => ("request", "response"),
                Direction::Response => ("response", "request"),
            };
            return Err(format!(
                "the sample fetch {name} reads the {is}, which is not available when a {isnt} header is set"
            ));
        }
    }
    match (kind, arg) {
        (Arg::None, None) | (Arg::DnField, None) => {}
        (Arg::None, Some(_)) => return Err(format!("the sample fetch {name} takes no argument")),
        (Arg::DnField, Some(a)) => {
            let (field, occurrence) = a.split_once(',').unwrap_or((a, ""));
            let field_ok = !field.is_empty()
                && field.len() <= 64
                && field
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.');
            let occurrence_ok = occurrence.is_empty()
                || (occurrence.len() <= 3
                    && occurrence
                        .trim_start_matches('-')
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                    && occurrence != "-");
            if !field_ok || !occurrence_ok {
                return Err(format!(
                    "{} is not a distinguished name's field (such as CN or cn,1)",
                    quoted(a)
                ));
            }
        }
        (Arg::Header, Some(a)) => {
            parse_header_name(a)?;
        }
        (Arg::Cookie, Some(a)) => {
            super::parse_cookie_name(a)?;
        }
        (Arg::Header | Arg::Cookie, None) => {
            return Err(format!(
                "the sample fetch {name} needs a name in parentheses"
            ));
        }
    }
    for converter in parts {
        let (name, arg) = call(converter)?;
        let Some((_, number)) = CONVERTERS.iter().find(|(n, _)| *n == name) else {
            return Err(format!(
                "the converter {} is not allowed in a header value (allowed: {})",
                quoted(name),
                converter_names().collect::<Vec<_>>().join(", ")
            ));
        };
        match (number, arg) {
            (false, None) => {}
            (false, Some(_)) => return Err(format!("the converter {name} takes no argument")),
            (true, Some(a))
                if !a.is_empty() && a.len() <= 3 && a.bytes().all(|b| b.is_ascii_digit()) => {}
            (true, _) => {
                return Err(format!(
                    "the converter {name} needs a number, such as {name}(24)"
                ));
            }
        }
    }
    Ok(())
}

/// Splits a sample expression at the commas outside parentheses.
fn split_top(expr: &str) -> ParseResult<Vec<&str>> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in expr.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err("nested parentheses are not allowed in a sample fetch".to_string()),
            ')' if depth == 1 => depth = 0,
            ')' => return Err("a ) without its ( in a sample fetch".to_string()),
            ',' if depth == 0 => {
                parts.push(&expr[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a ( without its ) in a sample fetch".to_string());
    }
    parts.push(&expr[start..]);
    Ok(parts)
}

/// `name` or `name(arg)`.
fn call(word: &str) -> ParseResult<(&str, Option<&str>)> {
    let (name, arg) = match word.split_once('(') {
        Some((name, rest)) => {
            let arg = rest
                .strip_suffix(')')
                .ok_or_else(|| format!("{} has text after its )", quoted(word)))?;
            (name, Some(arg))
        }
        None => (word, None),
    };
    if name.is_empty() {
        return Err("an empty sample fetch or converter".to_string());
    }
    Ok((name, arg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_and_samples_become_format_text() {
        let req = |v| parse_header_format(v, Direction::Request);
        assert_eq!(
            req(r#""no-store,no-cache,private""#).unwrap(),
            "no-store,no-cache,private"
        );
        assert_eq!(req("%[src]").unwrap(), "%[src]");
        assert_eq!(
            req(r#""client=%[ssl_c_s_dn(cn)] 100%% sure""#).unwrap(),
            "client=%[ssl_c_s_dn(cn)] 100%% sure"
        );
        assert_eq!(req(r#""say \"hi\" # \\o/""#).unwrap(), r#"say "hi" # \o/"#);
        assert_eq!(
            req("%[req.hdr(Host),lower]").unwrap(),
            "%[req.hdr(Host),lower]"
        );
        assert_eq!(req("%[src,ipmask(24)]").unwrap(), "%[src,ipmask(24)]");
        assert_eq!(
            parse_header_format("%[status]", Direction::Response).unwrap(),
            "%[status]"
        );
        for bad in [
            "\"open",
            "a\"b",
            "%[env(HOME)]",
            "%[src,map(/etc/passwd)]",
            "%[lua.x]",
            "%[src",
            "100%",
            "%ci",
            "%{+Q}[src]",
            "\"${HOME}\"",
            "$HOME",
            r#""a\nb""#,
            "a\nb",
            "%[hdr]",
            "%[src(1)]",
            "%[src,ipmask]",
            "%[src,ipmask(a)]",
            "%[hdr(a b)]",
            "%[ssl_c_s_dn(cn))]",
            "%[ssl_c_s_dn((cn))]",
            "%[status]",
            "%[sc0_get_gpc0()]",
            "\"\"",
            "\" padded \"",
        ] {
            assert!(req(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_header_format("%[path]", Direction::Response).is_err());
    }

    /// The format form is its own check's fixed point: what the parser returns passes
    /// [`check_format`], which the settings and the output guard apply again.
    #[test]
    fn parsed_values_pass_the_format_check() {
        for v in [r#""a \"b\" \\ c""#, "x %[src] %% y", "%[ssl_c_i_dn(CN,1)]"] {
            let f = parse_header_format(v, Direction::Request).unwrap();
            check_format(&f).unwrap();
        }
    }
}
