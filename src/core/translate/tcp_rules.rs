//! The rules of a TCP resource's frontend: ACLs, conditions, `tcp-request` rules, as the
//! incumbent's frontend model writes them (`acl_list`, `backend_switching_rule_list`,
//! `tcp_request_rule_list`), parsed into checked words.
//!
//! Only what a TCP-mode frontend can decide on is accepted: a vetted list of layer-4 and
//! TLS-hello sample fetches, literal patterns of plain characters, and the match flags that
//! read nothing from disk (`-f` would read a file on the controller's node; `-m reg` runs a
//! regex on every connection). Anything else is refused with the reason.

use std::collections::BTreeSet;

/// What a sample fetch returns, which decides what its patterns may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sample {
    /// An address: patterns are IP addresses or CIDR blocks.
    Ip,
    /// An integer: patterns are numbers, ranges `a:b` and the operators `eq ge gt le lt`.
    Int,
    /// A TLS version: numbers like `3.1`, and ranges.
    Version,
    /// A boolean: no patterns.
    Bool,
    /// Text: plain patterns.
    Text,
}

/// Sample fetches an ACL of a TCP frontend may test, with what they return.
const FETCHES: &[(&str, Sample)] = &[
    ("src", Sample::Ip),
    ("src_port", Sample::Int),
    ("dst", Sample::Ip),
    ("dst_port", Sample::Int),
    ("req_ssl_sni", Sample::Text),
    ("req.ssl_sni", Sample::Text),
    ("req_ssl_hello_type", Sample::Int),
    ("req.ssl_hello_type", Sample::Int),
    ("req_ssl_ver", Sample::Version),
    ("req.ssl_ver", Sample::Version),
    ("req.ssl_alpn", Sample::Text),
    ("req_len", Sample::Int),
    ("req.len", Sample::Int),
    ("ssl_fc", Sample::Bool),
    ("ssl_fc_sni", Sample::Text),
    ("ssl_fc_alpn", Sample::Text),
    ("ssl_fc_protocol", Sample::Text),
    ("always_true", Sample::Bool),
    ("always_false", Sample::Bool),
    ("wait_end", Sample::Bool),
];

/// The names of the accepted sample fetches, for the documentation and messages.
pub fn fetch_names() -> Vec<&'static str> {
    FETCHES.iter().map(|(n, _)| *n).collect()
}

/// HAProxy's predefined ACLs a condition may name.
const PREDEFINED: &[&str] = &["TRUE", "FALSE", "WAIT_END"];

/// Match methods `-m` may name.
const METHODS: &[&str] = &[
    "str", "beg", "end", "sub", "dom", "found", "len", "int", "ip",
];

/// The longest word accepted (a host name's length).
const MAX_WORD: usize = 253;

/// An HAProxy name: an ACL's, a bind's (letters, digits, `-`, `_`, `.`, `:`).
pub fn parse_haproxy_name(v: &str) -> Result<String, String> {
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{} is not a name (1 to 63 letters, digits, '-', '_', '.', ':')",
            super::exposure::brief(v)
        ))
    }
}

/// A pattern word: letters, digits and `. _ : / * - , + =`, not starting with `-`.
fn pattern(word: &str) -> Result<String, String> {
    let ok = !word.is_empty()
        && word.len() <= MAX_WORD
        && !word.starts_with('-')
        && word.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'*' | b'-')
        });
    if ok {
        Ok(word.to_string())
    } else {
        Err(format!(
            "{} is not a plain pattern (letters, digits, '.', '_', ':', '/', '*', '-')",
            super::exposure::brief(word)
        ))
    }
}

/// Words are separated by spaces alone: a line break or tab is refused rather than read as
/// a separator.
fn one_line(v: &str) -> Result<(), String> {
    match v
        .chars()
        .find(|c| c.is_whitespace() && *c != ' ' || c.is_control())
    {
        Some(c) => Err(format!(
            "{c:?} is not allowed; words are separated by spaces"
        )),
        None => Ok(()),
    }
}

/// `criterion` and `value` of an ACL: the fetch and its flags and patterns, as words.
pub fn parse_acl(criterion: &str, value: &str) -> Result<Vec<String>, String> {
    one_line(value)?;
    let (name, sample) = fetch(criterion)?;
    let mut words = vec![name];
    words.extend(flags_and_patterns(sample, value.split_whitespace())?);
    Ok(words)
}

fn fetch(word: &str) -> Result<(String, Sample), String> {
    match FETCHES.iter().find(|(n, _)| *n == word) {
        Some((n, sample)) => Ok((n.to_string(), *sample)),
        None => Err(format!(
            "criterion {} is not one Portcullis accepts in a TCP frontend ({})",
            super::exposure::brief(word),
            fetch_names().join(", ")
        )),
    }
}

/// A pattern of a fetch returning `sample` (matched by its own method).
fn typed_pattern(sample: Sample, word: &str) -> Result<String, String> {
    let number = |w: &str| !w.is_empty() && w.len() <= 10 && w.bytes().all(|b| b.is_ascii_digit());
    let ok = match sample {
        Sample::Ip => match word.split_once('/') {
            Some((ip, bits)) => ip.parse::<std::net::IpAddr>().is_ok_and(|ip| {
                bits.parse::<u8>()
                    .is_ok_and(|b| b <= if ip.is_ipv4() { 32 } else { 128 })
            }),
            None => word.parse::<std::net::IpAddr>().is_ok(),
        },
        Sample::Int => {
            matches!(word, "eq" | "ge" | "gt" | "le" | "lt")
                || number(word)
                || word.split_once(':').is_some_and(|(a, b)| {
                    (a.is_empty() || number(a)) && (b.is_empty() || number(b))
                })
        }
        Sample::Version => {
            !word.is_empty()
                && word.len() <= 16
                && word
                    .bytes()
                    .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b':'))
        }
        Sample::Bool => false,
        Sample::Text => return pattern(word),
    };
    if ok {
        Ok(word.to_string())
    } else if sample == Sample::Bool {
        Err(format!(
            "{} after a boolean fetch, which takes no pattern",
            super::exposure::brief(word)
        ))
    } else {
        Err(format!(
            "{} is not a pattern for this fetch ({})",
            super::exposure::brief(word),
            match sample {
                Sample::Ip => "an IP address or CIDR block",
                Sample::Int => "a number, a range a:b, or eq ge gt le lt",
                _ => "a version such as 3.1, or a range",
            }
        ))
    }
}

fn flags_and_patterns<'a>(
    sample: Sample,
    words: impl Iterator<Item = &'a str>,
) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut words = words.peekable();
    let mut literal = false;
    // `-m` makes HAProxy match as the method says: the patterns are then read as text.
    let mut method = false;
    while let Some(w) = words.next() {
        if literal || !w.starts_with('-') {
            out.push(if method && sample != Sample::Bool {
                pattern(w)?
            } else {
                typed_pattern(sample, w)?
            });
            continue;
        }
        match w {
            "-i" | "-n" => out.push(w.to_string()),
            "--" => {
                literal = true;
                out.push(w.to_string());
            }
            "-m" => {
                let method_name = words.next().unwrap_or_default();
                if !METHODS.contains(&method_name) {
                    return Err(format!(
                        "match method {} is not accepted ({})",
                        super::exposure::brief(method_name),
                        METHODS.join(", ")
                    ));
                }
                out.push(w.to_string());
                out.push(method_name.to_string());
                method = true;
            }
            _ => {
                return Err(format!(
                    "flag {} is not accepted (-i, -n, -m <method>, --; -f would read a file of the controller's node)",
                    super::exposure::brief(w)
                ));
            }
        }
    }
    Ok(out)
}

/// A condition (`cond_test`) as words: names of `declared` ACLs or predefined ones (each
/// optionally negated with `!`), anonymous ACLs `{ fetch flags patterns }`, `||` and `or`.
pub fn parse_condition(test: &str, declared: &BTreeSet<String>) -> Result<Vec<String>, String> {
    one_line(test)?;
    let mut out = Vec::new();
    let mut words = test.split_whitespace();
    let mut expect_term = true;
    while let Some(w) = words.next() {
        if matches!(w, "||" | "or") {
            if expect_term {
                return Err(format!("{w:?} with no condition before it"));
            }
            out.push(w.to_string());
            expect_term = true;
            continue;
        }
        let (negated, rest) = match w.strip_prefix('!') {
            Some("") => {
                out.push("!".to_string());
                continue;
            }
            Some(r) => (true, r),
            None => (false, w),
        };
        if rest == "{" {
            let inner: Vec<&str> = words.by_ref().take_while(|w| *w != "}").collect();
            let Some((first, tail)) = inner.split_first() else {
                return Err("an empty or unclosed { } in the condition".to_string());
            };
            if negated {
                out.push("!".to_string());
            }
            out.push("{".to_string());
            let (name, sample) = fetch(first)?;
            out.push(name);
            out.extend(flags_and_patterns(sample, tail.iter().copied())?);
            out.push("}".to_string());
        } else if declared.contains(rest) || PREDEFINED.contains(&rest) {
            out.push(if negated {
                format!("!{rest}")
            } else {
                rest.to_string()
            });
        } else {
            return Err(format!(
                "{} is not an ACL of this frontend's acl_list nor an anonymous ACL in {{ }}",
                super::exposure::brief(rest)
            ));
        }
        expect_term = false;
    }
    if expect_term {
        return Err(if out.is_empty() {
            "the condition is empty".to_string()
        } else {
            "the condition ends with an operator".to_string()
        });
    }
    if test.split_whitespace().filter(|w| *w == "}").count()
        != test
            .split_whitespace()
            .filter(|w| w.trim_start_matches('!') == "{")
            .count()
    {
        return Err("the condition's { } do not pair up".to_string());
    }
    Ok(out)
}

/// `cond` and `cond_test` of a rule: nothing (no condition), or `if`/`unless` and the words.
pub fn parse_rule_condition(
    cond: Option<&str>,
    test: Option<&str>,
    declared: &BTreeSet<String>,
) -> Result<Vec<String>, String> {
    let test = test.map(str::trim).filter(|t| !t.is_empty());
    match (cond.map(str::trim).filter(|c| !c.is_empty()), test) {
        (None, None) => Ok(Vec::new()),
        (Some(c @ ("if" | "unless")), Some(t)) => {
            let mut out = vec![c.to_string()];
            out.extend(parse_condition(t, declared)?);
            Ok(out)
        }
        (Some(c @ ("if" | "unless")), None) => Err(format!("cond is {c} but cond_test is empty")),
        (Some(c), _) => Err(format!(
            "cond {} is neither if nor unless",
            super::exposure::brief(c)
        )),
        (None, Some(_)) => Err("cond_test without cond (if or unless)".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_incumbents_rules_parse() {
        assert_eq!(
            parse_acl("req_ssl_sni", "-i backend0.example.com").unwrap(),
            ["req_ssl_sni", "-i", "backend0.example.com"]
        );
        assert_eq!(
            parse_condition("{ req_ssl_sni -i backend0.example.com }", &declared(&[])).unwrap(),
            ["{", "req_ssl_sni", "-i", "backend0.example.com", "}"]
        );
        assert_eq!(
            parse_rule_condition(Some("if"), Some("switch_be_0"), &declared(&["switch_be_0"]))
                .unwrap(),
            ["if", "switch_be_0"]
        );
        assert_eq!(
            parse_condition("!a || { src 10.0.0.0/8 } b", &declared(&["a", "b"])).unwrap(),
            ["!a", "||", "{", "src", "10.0.0.0/8", "}", "b"]
        );
        assert_eq!(
            parse_rule_condition(Some("if"), Some("{ req_ssl_hello_type 1 }"), &declared(&[]))
                .unwrap(),
            ["if", "{", "req_ssl_hello_type", "1", "}"]
        );
    }

    #[test]
    fn what_could_escape_or_read_files_is_refused() {
        let none = declared(&[]);
        for (criterion, value) in [
            ("src", "-f /etc/passwd"),
            ("req_ssl_sni", "-m reg ^(a+)+$"),
            ("req_ssl_sni", "a\nuse_backend x"),
            ("req_ssl_sni", "'quoted'"),
            ("hdr(host)", "x"),
            ("req_ssl_sni", "a#comment"),
            ("req_ssl_sni", "%[src]"),
            ("src", "10.0.0.0/33"),
            ("src", "example.com"),
            ("dst_port", "http"),
            ("ssl_fc", "1"),
            ("req_ssl_ver", "tls1"),
        ] {
            assert!(parse_acl(criterion, value).is_err(), "{criterion} {value}");
        }
        for test in [
            "undeclared",
            "{ req_ssl_sni x",
            "{ }",
            "|| a",
            "{ src x } ||",
            "{ lua.x 1 }",
            "}",
        ] {
            assert!(parse_condition(test, &none).is_err(), "{test}");
        }
        assert!(parse_rule_condition(Some("when"), Some("TRUE"), &none).is_err());
        assert!(parse_rule_condition(None, Some("TRUE"), &none).is_err());
        assert!(parse_rule_condition(Some("if"), None, &none).is_err());
        assert_eq!(
            parse_rule_condition(None, None, &none).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn patterns_fit_what_their_fetch_returns() {
        for (criterion, value) in [
            ("src", "10.0.0.0/8 192.0.2.1 2001:db8::/32"),
            ("dst_port", "443 8000:8080 gt 1024"),
            ("req_ssl_ver", "3.1:"),
            ("ssl_fc", ""),
            ("src_port", "-m str 1234"),
        ] {
            assert!(parse_acl(criterion, value).is_ok(), "{criterion} {value}");
        }
    }

    /// Whatever is accepted is words the output guard prints as they are, none of which
    /// reads a file or runs a regex.
    mod hostile {
        use super::*;
        use proptest::prelude::*;

        const FRAGMENTS: &[&str] = &[
            "\n",
            " ",
            "\t",
            "#",
            "'",
            "\"",
            "\\",
            "%[env(X)]",
            "$HOME",
            "{",
            "}",
            "!",
            "||",
            "-f",
            " /etc/passwd",
            "-m",
            " reg",
            " str",
            "-i",
            "--",
            "src",
            "req_ssl_sni",
            "dst_port",
            "10.0.0.0/8",
            "443",
            "a.example.com",
            "lua.x",
            "acl1",
            ":",
            "*",
        ];

        fn hostile() -> impl Strategy<Value = String> {
            prop::collection::vec(prop::sample::select(FRAGMENTS), 1..8)
                .prop_map(|parts| parts.concat())
        }

        fn printable(word: &str) -> bool {
            !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !b"'\"\\#$%`".contains(&b))
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

            #[test]
            fn accepted_rules_are_inert(criterion in hostile(), value in hostile(), test in hostile()) {
                let declared: BTreeSet<String> = ["acl1".to_string()].into();
                let mut accepted = Vec::new();
                if let Ok(words) = parse_acl(criterion.trim(), &value) {
                    accepted.extend(words);
                }
                if let Ok(words) = parse_rule_condition(Some("if"), Some(&test), &declared) {
                    accepted.extend(words);
                }
                for w in &accepted {
                    prop_assert!(printable(w), "{:?}", w);
                    prop_assert!(w != "-f", "{:?}", accepted);
                }
                // `reg` may be a pattern (an SNI "reg"); only as a match method is it refused.
                prop_assert!(
                    accepted.windows(2).all(|p| !(p[0] == "-m" && p[1] == "reg")),
                    "{:?}",
                    accepted
                );
            }
        }
    }

    #[test]
    fn names_are_haproxy_names() {
        assert!(parse_haproxy_name("v4v6").is_ok());
        assert!(parse_haproxy_name("switch_be_0").is_ok());
        assert!(parse_haproxy_name("a b").is_err());
        assert!(parse_haproxy_name("").is_err());
    }
}
