//! The output guard: what `{{ value }}` may print into haproxy.cfg.
//!
//! A plain value must be a single config token: no whitespace, control characters, quotes,
//! `\`, `#`, `$` or `%`. Anything else has to go through the `q` filter, which single-quotes
//! it (HAProxy does no expansion inside single quotes) and refuses what cannot be quoted.
//! The `safe` and `escape` filters are replaced so a template cannot switch the guard off.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Output, State, Value};

/// Characters that may never appear in an unquoted token.
fn forbidden_in_token(c: char) -> bool {
    c.is_whitespace() || c.is_control() || matches!(c, '\'' | '"' | '\\' | '#' | '$' | '%' | '`')
}

/// The first character of `s` that may not appear in an unquoted token. Most of haproxy.cfg
/// is printed through here, so ASCII text is checked by byte.
fn first_forbidden(s: &str) -> Option<char> {
    if s.is_ascii() {
        s.bytes()
            .find(|&b| !b.is_ascii_graphic() || b"'\"\\#$%`".contains(&b))
            .map(char::from)
    } else {
        s.chars().find(|c| forbidden_in_token(*c))
    }
}

/// Whether `s` prints as it is: a single config token (not empty).
pub fn is_token(s: &str) -> bool {
    !s.is_empty() && first_forbidden(s).is_none()
}

/// The formatter installed in the environment.
pub(crate) fn guard(out: &mut Output, _state: &mut State, value: &Value) -> Result<(), Error> {
    // A backend section prints as its text, which haproxy.cfg's writer places by itself.
    if let Some(section) = value.downcast_object_ref::<super::sections::Section>() {
        return section.print(out).map_err(write_error);
    }
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => {
            Err(error("cannot print an undefined or none value"))
        }
        ValueKind::Bool | ValueKind::Number => write!(out, "{value}").map_err(write_error),
        ValueKind::String if value.is_safe() => {
            // Only `q` produces safe strings (see `register`).
            out.write_str(value.as_str().unwrap_or_default())
                .map_err(write_error)
        }
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            if let Some(c) = first_forbidden(s) {
                return Err(error(&format!(
                    "refusing to print {s:?}: {c:?} could break out of its place in haproxy.cfg (use the q filter for quoted text)"
                )));
            }
            out.write_str(s).map_err(write_error)
        }
        other => Err(error(&format!(
            "cannot print a {other} directly; iterate over it or pick a field"
        ))),
    }
}

/// `{{ value|q }}`: a single-quoted HAProxy word.
pub(crate) fn quote(value: &str) -> Result<Value, Error> {
    if let Some(c) = value.chars().find(|c| c.is_control() || *c == '\'') {
        return Err(error(&format!("cannot quote {value:?}: it contains {c:?}")));
    }
    Ok(Value::from_safe_string(format!("'{value}'")))
}

/// `{{ value|lf }}`: a header value in format form (text with `%%` and vetted `%[…]` sample
/// fetches, see [`crate::values::check_header_format`]), checked again here before it is
/// quoted. HAProxy reads such an argument as a log format once its quotes are undone, so a
/// `%` in it is never just text and `q` alone would not do. Single quotes when the value has
/// none, else double quotes with `\` and `"` escaped (a `$`, which HAProxy would expand
/// there, never passes the check).
pub(crate) fn log_format_text(value: &str) -> Result<Value, Error> {
    crate::values::check_header_format(value)
        .map_err(|e| error(&format!("refusing header value {value:?}: {e}")))?;
    if !value.contains('\'') {
        return Ok(Value::from_safe_string(format!("'{value}'")));
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if matches!(c, '\\' | '"') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(Value::from_safe_string(out))
}

/// `{{ line|snippet("backend") }}`: a raw config line, printed only if it passes the snippet
/// checks again here for the section named (`global`, `frontend`, `backend`), so that no
/// template can print unchecked text this way. Without a section, the line must be allowed in
/// one of them.
pub(crate) fn snippet(value: &str, section: Option<&str>) -> Result<Value, Error> {
    let checked = match section {
        None => crate::snippets::check_line(value),
        Some(name) => {
            let section = crate::snippets::Section::of_name(name)
                .filter(|_| matches!(name, "global" | "frontend" | "backend"))
                .ok_or_else(|| {
                    error(&format!(
                        "snippet: unknown section {name:?} (global, frontend or backend)"
                    ))
                })?;
            crate::snippets::check_line_in(value, section)
        }
    };
    checked.map_err(|e| error(&format!("refusing snippet line {value:?}: {e}")))?;
    Ok(Value::from_safe_string(value.trim().to_string()))
}

/// `policy_condition(p.id)`: the ACL condition "this route's policy applies",
/// `{ var(txn.policy) -m str <id> }`, to write after `if` in a route policy's rules.
pub(crate) fn policy_condition(id: &str) -> Result<Value, Error> {
    let generated =
        id.len() > 1 && id.starts_with('p') && id[1..].bytes().all(|b| b.is_ascii_hexdigit());
    if !generated {
        return Err(error(&format!(
            "policy_condition: {id:?} is not a route policy id (p.id)"
        )));
    }
    Ok(Value::from_safe_string(format!(
        "{{ var(txn.policy) -m str {id} }}"
    )))
}

fn refuse_bypass(_value: Value) -> Result<Value, Error> {
    Err(error(
        "the safe and escape filters are disabled in Portcullis templates; use q for quoted text",
    ))
}

/// Installs the guard and its filters.
pub fn register(env: &mut minijinja::Environment<'static>) {
    env.set_formatter(guard);
    env.add_filter("q", quote);
    env.add_filter("lf", log_format_text);
    env.add_filter("snippet", snippet);
    env.add_function("policy_condition", policy_condition);
    env.add_filter("safe", refuse_bypass);
    env.add_filter("escape", refuse_bypass);
    env.add_filter("e", refuse_bypass);
}

fn error(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.to_string())
}

fn write_error(_: std::fmt::Error) -> Error {
    Error::new(ErrorKind::WriteFailure, "failed to write output")
}

#[cfg(test)]
mod tests {
    use minijinja::Environment;

    use super::*;

    fn env() -> Environment<'static> {
        let mut env = Environment::new();
        register(&mut env);
        env
    }

    #[test]
    fn tokens_pass_and_breakouts_are_refused() {
        let env = env();
        let ok = env.render_str(
            "{{ a }} {{ n }}",
            minijinja::context! { a => "x_1.b", n => 5 },
        );
        assert_eq!(ok.unwrap(), "x_1.b 5");
        for bad in ["a\nb", "a b", "a#b", "%[env(X)]", "$HOME", "it's", "a\"b"] {
            let r = env.render_str("{{ a }}", minijinja::context! { a => bad });
            assert!(r.is_err(), "{bad:?} was printed");
        }
    }

    #[test]
    fn the_ascii_check_agrees_with_the_character_rule() {
        for b in 0u8..=127 {
            let s = format!("a{}b", char::from(b));
            assert_eq!(
                first_forbidden(&s),
                s.chars().find(|c| forbidden_in_token(*c)),
                "byte {b}"
            );
        }
        assert_eq!(first_forbidden("é\u{a0}x"), Some('\u{a0}'));
        assert_eq!(first_forbidden("é.x"), None);
    }

    #[test]
    fn q_quotes_and_cannot_be_bypassed() {
        let env = env();
        let r = env.render_str("{{ a|q }}", minijinja::context! { a => "max-age=1; x" });
        assert_eq!(r.unwrap(), "'max-age=1; x'");
        assert!(
            env.render_str("{{ a|q }}", minijinja::context! { a => "it's" })
                .is_err()
        );
        assert!(
            env.render_str("{{ a|safe }}", minijinja::context! { a => "a\nb" })
                .is_err()
        );
    }

    /// `lf` prints only header values in format form: vetted samples, `%%`, no `$`, no line
    /// break; single quotes when it can, double quotes with escapes when the value has one.
    #[test]
    fn lf_prints_only_checked_header_formats() {
        let env = env();
        let lf = |v: &str| env.render_str("{{ a|lf }}", minijinja::context! { a => v });
        assert_eq!(lf("%[src] 100%%").unwrap(), "'%[src] 100%%'");
        assert_eq!(lf(r#"it's "x" \ #1"#).unwrap(), r#""it's \"x\" \\ #1""#);
        for bad in [
            "%[env(X)]",
            "%[src,map(/etc/passwd)]",
            "50%",
            "$HOME",
            "a\nb",
            "a\rb",
            " a",
            "",
        ] {
            assert!(lf(bad).is_err(), "{bad:?} was printed");
        }
    }

    #[test]
    fn snippet_lines_are_checked_for_the_section_named() {
        let env = env();
        let line = minijinja::context! { l => "http-request deny if { path_beg /private }" };
        let render = |template: &str| env.render_str(template, line.clone());
        assert!(render("{{ l|snippet }}").is_ok());
        assert!(render("{{ l|snippet(\"backend\") }}").is_ok());
        // Rules are not global settings.
        let refused = render("{{ l|snippet(\"global\") }}").unwrap_err();
        assert!(
            refused.to_string().contains("refusing snippet line"),
            "{refused}"
        );
        assert!(render("{{ l|snippet(\"globalx\") }}").is_err());
        assert!(render("{{ l|snippet(\"peers\") }}").is_err());
    }
}
