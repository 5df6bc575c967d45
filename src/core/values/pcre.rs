//! Regular expressions checked the way HAProxy compiles them: with PCRE2, the library HAProxy
//! is built with, and the flags its `regex_comp()` uses at the place the regex is written.
//!
//! HAProxy 2.6 (`src/regex.c`) calls `pcre2_compile()` with `PCRE2_CASELESS` when the match
//! ignores case and `PCRE2_NO_AUTO_CAPTURE` when it needs no captures, then
//! `pcre2_jit_compile(PCRE2_JIT_COMPLETE)` when built with JIT (Debian's is), and refuses the
//! whole configuration if either step fails. Checking with another regex dialect let through
//! patterns PCRE2 refuses (`(?u)`, `\u0041`, `a{65536}`), and one of those stops every later
//! change from being applied.
//!
//! Every regex Portcullis prints is single-quoted (the `q` filter), and HAProxy's config
//! tokenizer copies the text between single quotes unchanged (no backslash escapes, no `$`
//! expansion): what is checked here is exactly what PCRE2 receives.

use pcre2::bytes::RegexBuilder;

/// Where a regex is written, which decides how HAProxy compiles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegexPlace {
    /// `http-request replace-path` (`regex_comp(re, 1, 1)`): case-sensitive, with captures.
    Replace,
    /// An ACL pattern `-m reg` (`regex_comp(re, !ignore_case, 0)`): no automatic captures
    /// (`PCRE2_NO_AUTO_CAPTURE`), caseless with `-i`.
    Acl { ignore_case: bool },
}

/// Compiles `pattern` as HAProxy does at `place`; the error is PCRE2's own words.
pub(super) fn compile(pattern: &str, place: RegexPlace) -> Result<(), String> {
    let mut builder = RegexBuilder::new();
    // HAProxy treats a build without JIT support (PCRE2_ERROR_JIT_BADOPTION) as no JIT; any
    // other JIT failure refuses the regex, as `jit(true)` does here.
    builder.jit(pcre2::is_jit_available());
    let text = match place {
        RegexPlace::Replace => pattern.to_string(),
        RegexPlace::Acl { ignore_case } => {
            builder.caseless(ignore_case);
            without_auto_capture(pattern)
        }
    };
    builder
        .build(&text)
        .map(|_| ())
        .map_err(|e| pcre2_message(&e, text.len() - pattern.len()))
}

/// `pattern` with `PCRE2_NO_AUTO_CAPTURE` in effect. The binding does not expose that compile
/// option, so it is set with PCRE2's equivalent inline option `(?n)`, placed after any
/// leading `(*...)` start-of-pattern items (`(*UTF)`, `(*LIMIT_MATCH=10)`, …), which must
/// come first. An option set at the top level applies to the whole pattern that follows, as
/// the compile option does; `(?-n)` and `(?^)` inside the pattern undo either alike.
fn without_auto_capture(pattern: &str) -> String {
    let mut rest = pattern;
    while let Some(item) = rest.strip_prefix("(*") {
        let Some(end) = item.find(')') else { break };
        let name = &item[..end];
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_' || b == b'=')
        {
            break;
        }
        rest = &item[end + 1..];
    }
    let head = &pattern[..pattern.len() - rest.len()];
    format!("{head}(?n){rest}")
}

/// PCRE2's message, with the offset counted in the pattern as written (`shift` bytes were
/// added to it for the check).
fn pcre2_message(e: &pcre2::Error, shift: usize) -> String {
    let text = e.to_string();
    // The binding's text: "PCRE2: error compiling pattern at offset N: <message>".
    let message = text.rsplit_once(": ").map_or(text.as_str(), |(_, m)| m);
    match e.offset() {
        Some(offset) => format!(
            "PCRE2 refuses it at offset {}: {message}",
            offset.saturating_sub(shift)
        ),
        None => format!("PCRE2 refuses it: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACL: RegexPlace = RegexPlace::Acl { ignore_case: false };

    #[test]
    fn what_haproxy_refuses_is_refused() {
        for bad in [
            "(?u)^/x",
            "^/a{65536}",
            r"\u0041",
            r"\U00000041",
            r"\N{U+0041}",
            r"\L",
            r"\l",
            r"\c",
            "(?<=a+)b",
            // Bounded variable-length lookbehinds came with PCRE2 10.43: HAProxy's 10.42
            // refuses them, and so must the library checked against.
            "(?<=ab?)c",
            "(",
            "a{2,1}",
            "[z-a]",
            r"\k<missing>",
            "(?P=missing)",
            r"\8",
            "(*UTF)(*LIMIT_MATCH)a",
            "a(*UTF)",
            "[[:word:]-z]",
        ] {
            for place in [RegexPlace::Replace, ACL] {
                assert!(compile(bad, place).is_err(), "{bad:?} at {place:?}");
            }
        }
    }

    #[test]
    fn what_haproxy_accepts_is_accepted() {
        for good in [
            "^/api/(.*)$",
            r"^/(a|b)\d{2}$",
            "^/a{65535}",
            r"\x41",
            r"\x{41}",
            r"\o{101}",
            r"(?<=/v)1",
            "(?i)^/x",
            r"^/(?<id>\d+)/\k<id>",
            "(*LIMIT_MATCH=1000)^/x",
            "(*UTF)^/é",
            r"^https://(.+\.)?example\.com(:\d{1,5})?$",
            r"\Q.*\E",
            "(?#comment)a",
        ] {
            for place in [RegexPlace::Replace, ACL] {
                assert_eq!(compile(good, place), Ok(()), "{good:?} at {place:?}");
            }
        }
    }

    #[test]
    fn acl_patterns_have_no_automatic_captures() {
        // A back reference to a numbered group exists only where groups capture.
        for v in [r"^(a)\1$", r"(*UTF)(a)\1", r"(a)(?-n)(b)\2"] {
            assert_eq!(compile(v, RegexPlace::Replace), Ok(()), "{v:?}");
        }
        assert!(compile(r"^(a)\1$", ACL).is_err());
        assert!(compile(r"(*UTF)(a)\1", ACL).is_err());
        // `(?-n)` turns captures back on for what follows, with the option as with `(?n)`.
        assert_eq!(compile(r"(a)(?-n)(b)\1", ACL), Ok(()));
        // Named groups still capture.
        assert_eq!(compile(r"(?<x>a)\k<x>", ACL), Ok(()));
        let err = compile(r"^(a)\1$", ACL).unwrap_err();
        assert!(err.contains("non-existent"), "{err}");
    }

    #[test]
    fn start_of_pattern_items_stay_first() {
        assert_eq!(without_auto_capture("(*UTF)(*CR)a"), "(*UTF)(*CR)(?n)a");
        assert_eq!(
            without_auto_capture("(*LIMIT_MATCH=9)(a)"),
            "(*LIMIT_MATCH=9)(?n)(a)"
        );
        assert_eq!(without_auto_capture("(*pla:a)b"), "(?n)(*pla:a)b");
        assert_eq!(without_auto_capture("(*"), "(?n)(*");
    }
}
