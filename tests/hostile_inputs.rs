//! Property test over every typed parser, the template output guard and the runtime API
//! argument check, with strings built from the break-out material of real annotation-injection
//! attacks (ingress-nginx 2025: newline-injected directives, `#` comments, quote breaking,
//! `%[env()]`, `$ENV`, `lua-load`, path traversal). Whatever a parser accepts must be inert
//! where it is placed; whatever it is given, nothing panics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use portcullis::haproxy::command::Command;
use portcullis::values;
use proptest::prelude::*;

/// Fragments attackers combine.
const FRAGMENTS: &[&str] = &[
    "\n",
    "\r\n",
    "#",
    "'",
    "\"",
    "\\",
    "%[env(SECRET)]",
    "%[",
    "%[src]",
    "%[src,lower]",
    ",map(/etc/passwd)]",
    "%[req.hdr(Host)",
    "%%",
    "X-A ",
    "${HOME}",
    "$HOME",
    " lua-load /tmp/x.lua",
    "lua-load",
    "program",
    "../../etc/passwd",
    "/etc/shadow",
    ";",
    "\u{0}",
    "\t",
    " ",
    "}",
    "{",
    "10s",
    "1m",
    "/api",
    "a.example.com",
    "*.example.com",
    "X-Header",
    "value",
    "10.0.0.0/8",
    "roundrobin",
    "hdr(X)",
    "url_param ",
    "GET /health",
    ",",
    ":",
    "%41",
    "\u{2028}",
    "cookie(x)",
    " -m str ",
    "https://",
    "^",
    "http-request set-header X ",
    "http-request return status 200 ",
    "http-response ",
    " lf-file ",
    " file ",
    "set-map(maps/exact.map) ",
    ".if ",
    "\"'$HOME'\"",
    "'$5'",
];

fn hostile() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(FRAGMENTS), 1..6).prop_map(|parts| parts.concat())
}

/// What a value placed in haproxy.cfg or a map may never hold.
fn inert(v: &str) -> bool {
    !v.contains('\n')
        && !v.contains('\r')
        && !v.contains('#')
        && !v.contains('\'')
        && !v.contains('"')
        && !v.contains("%[")
        && !v.contains('$')
        && !v.chars().any(char::is_control)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn accepted_values_are_inert(v in hostile()) {
        let single_token = [
            values::parse_duration(&v).map(|n| n.to_string()),
            values::parse_size(&v).map(|n| n.to_string()),
            values::parse_host(&v),
            values::parse_host_header(&v),
            values::parse_path(&v),
            values::parse_header_name(&v),
            values::parse_regex(&v),
            values::parse_replacement(&v),
            values::parse_enum(&v, &["roundrobin", "leastconn"]),
        ];
        for accepted in single_token.into_iter().flatten() {
            prop_assert!(inert(&accepted), "{:?} accepted as {:?}", v, accepted);
            // A single config word: no whitespace either, except balance's own separator.
            prop_assert!(!accepted.contains(char::is_whitespace), "{:?} accepted with whitespace", accepted);
        }
        // balance: config words separated by single spaces.
        if let Ok(balance) = values::parse_balance(&v) {
            for word in balance.split(' ') {
                prop_assert!(!word.is_empty() && inert(word) && !word.contains(char::is_whitespace),
                    "{:?} accepted as {:?}", v, balance);
            }
        }
        if let Ok(header) = values::parse_header_value(&v) {
            prop_assert!(inert(&header) && !header.contains('\\') && !header.contains('%'), "{:?}", header);
        }
        // Header values are log-format text: quotes, `#` and `\` may be in them (the output
        // guard's `lf` quotes them), but no line break, no `$`, and no sample fetch outside
        // the vetted list.
        for direction in [None, Some(values::Direction::Request), Some(values::Direction::Response)] {
            if let Ok(lines) = values::parse_header_lines(&v, direction) {
                for (name, value) in lines {
                    prop_assert!(inert(&name), "{:?} -> {:?}", v, name);
                    prop_assert!(!value.contains(['\n', '\r', '$']) && !value.chars().any(char::is_control),
                        "{:?} -> {:?}", v, value);
                    prop_assert!(values::check_header_format(&value).is_ok(), "{:?} -> {:?}", v, value);
                    // Every sample expression in it is from the vetted list.
                    for expr in value.split("%[").skip(1).filter_map(|rest| rest.split(']').next()) {
                        for bad in ["env", "map", "lua", "table", "sc0", "file"] {
                            prop_assert!(!expr.contains(bad), "{:?} -> {:?}", v, value);
                        }
                    }
                }
            }
        }
        if let Ok(cidrs) = values::parse_cidr_list(&v) {
            for c in cidrs {
                prop_assert!(c.bytes().all(|b| b.is_ascii_hexdigit() || b"./:".contains(&b)), "{:?}", c);
            }
        }
        if let Ok(path) = values::parse_path(&v) {
            prop_assert!(path.starts_with('/') && !path.contains(' '), "{:?}", path);
        }
        // CORS and basic authentication: config words, or single-quoted where noted.
        if let Ok(origin) = values::parse_cors_origin(&v) {
            match origin {
                portcullis::model::CorsOrigin::Any => {}
                portcullis::model::CorsOrigin::List(list) => {
                    for o in list {
                        prop_assert!(inert(&o) && !o.contains(char::is_whitespace)
                            && !o.contains(['%', '\\', '{', '}']), "{:?} -> {:?}", v, o);
                    }
                }
                // Printed single-quoted.
                portcullis::model::CorsOrigin::Regex(re) => {
                    prop_assert!(!re.contains(['\'', ' ']) && !re.chars().any(char::is_control),
                        "{:?} -> {:?}", v, re);
                }
            }
        }
        for list in [values::parse_http_methods(&v), values::parse_header_name_list(&v)].into_iter().flatten() {
            // Printed single-quoted.
            prop_assert!(inert(&list) && !list.contains(['\\', '%']), "{:?} -> {:?}", v, list);
        }
        if let Ok(user) = values::parse_user_name(&v) {
            prop_assert!(inert(&user) && !user.contains(char::is_whitespace), "{:?} -> {:?}", v, user);
        }
        if let Ok(hash) = values::parse_password_hash(&v) {
            // Printed single-quoted.
            prop_assert!(!hash.contains(['\'', ' ']) && !hash.chars().any(char::is_control),
                "{:?} -> {:?}", v, hash);
        }
        // Routing annotations: every word they render is one inert config word.
        let word = |w: &str| inert(w) && !w.contains(char::is_whitespace) && !w.contains('%');
        if let Ok((_, host)) = values::parse_redirect_target(&v) {
            prop_assert!(word(&host) && !host.contains('/'), "{:?} -> {:?}", v, host);
        }
        if let Ok(samples) = values::parse_capture_samples(&v) {
            for s in samples {
                prop_assert!(word(&s) && !s.contains(','), "{:?} -> {:?}", v, s);
            }
        }
        if let Ok(c) = values::parse_route_acl(&v) {
            prop_assert!(word(&c.fetch), "{:?} -> {:?}", v, c);
            for value in &c.values {
                prop_assert!(value != "{" && value != "}" && !value.starts_with('-'), "{:?} -> {:?}", v, c);
                if c.method.as_deref() == Some("reg") {
                    // Printed single-quoted: nothing may close the quote or the line.
                    prop_assert!(!value.contains(['\'', ' ']) && !value.chars().any(char::is_control),
                        "{:?} -> {:?}", v, c);
                } else {
                    prop_assert!(word(value) && !value.contains(['\\', '{', '}']), "{:?} -> {:?}", v, c);
                }
            }
        }
    }

    #[test]
    fn the_output_guard_refuses_what_could_break_out(v in hostile()) {
        let env = {
            let mut env = minijinja::Environment::new();
            portcullis::render::formatter::register(&mut env);
            env
        };
        let printed = env.render_str("{{ v }}", minijinja::context! { v => v.clone() });
        if let Ok(text) = printed {
            prop_assert!(inert(&text) && !text.contains(char::is_whitespace) && !text.contains('%'),
                "{:?} printed as {:?}", v, text);
        }
        if let Ok(quoted) = env.render_str("{{ v|q }}", minijinja::context! { v => v.clone() }) {
            // One single-quoted word: nothing inside can close the quote or start a line.
            let inner = &quoted[1..quoted.len() - 1];
            prop_assert!(quoted.starts_with('\'') && quoted.ends_with('\'') && !inner.contains('\'')
                && !inner.chars().any(char::is_control), "{:?} quoted as {:?}", v, quoted);
        }
    }

    /// A string a script returns in its site settings is refused, a token the guard prints
    /// bare, or text that prints only quoted, as one word HAProxy reads back unchanged.
    #[test]
    fn site_strings_are_refused_tokens_or_one_quoted_word(v in hostile()) {
        use portcullis::model::SiteValue;
        let env = {
            let mut env = minijinja::Environment::new();
            portcullis::render::formatter::register(&mut env);
            env
        };
        let render = |template: &str, value: &SiteValue| {
            env.render_str(template, minijinja::context! { v => minijinja::Value::from(minijinja::value::Serde(value)) })
        };
        let breaks_out = v.contains(['\n', '\r', '\'']) || v.chars().any(char::is_control);
        match portcullis::policy::settings::site_string(&v) {
            Err(_) => {}
            Ok(value @ SiteValue::Token(_)) => {
                let printed = render("{{ v }}", &value).unwrap();
                prop_assert!(!breaks_out && inert(&printed) && printed == v
                    && !printed.contains(char::is_whitespace) && !printed.contains('%'),
                    "{:?} printed as {:?}", v, printed);
            }
            Ok(value @ SiteValue::Text(_)) => {
                prop_assert!(!breaks_out, "{:?} accepted", v);
                prop_assert!(render("{{ v }}", &value).is_err(), "{:?} printed bare", v);
                let quoted = render("{{ v|q }}", &value).unwrap();
                prop_assert_eq!(haproxy_words(&format!("  x {quoted}")), vec!["x".to_string(), v.clone()]);
            }
            Ok(other) => prop_assert!(false, "{:?} became {:?}", v, other),
        }
    }

    #[test]
    fn runtime_api_arguments_are_one_word(v in hostile()) {
        let commands = [
            Command::AddMap { map: "maps/exact.map".into(), key: v.clone(), value: "b".into() },
            Command::SetMap { map: "maps/exact.map".into(), key: "k".into(), value: v.clone() },
            Command::DelMap { map: v.clone(), key: "k".into() },
            Command::SetServerState { backend: v.clone(), server: "SRV_1".into(),
                state: portcullis::haproxy::command::ServerState::Ready },
            Command::SetSslCert { path: "certs/a.pem".into(), pem: v.clone() },
            Command::AddSslCrtList { crt_list: "certs/crt-list.txt".into(), path: "certs/a.pem".into(), sni: vec![v] },
        ];
        for c in commands {
            if let Ok(wire) = c.to_wire() {
                // One command line (payload commands: the payload has no empty line and ends
                // the command with one), no command separator.
                let first = wire.lines().next().unwrap_or_default();
                prop_assert!(!first.contains(';') && !first.contains('#'), "{:?}", wire);
                if !wire.contains("<<") {
                    prop_assert_eq!(wire.matches('\n').count(), 1, "{:?}", wire);
                } else {
                    let payload = wire.split("<<\n").nth(1).unwrap_or_default();
                    let body = payload.trim_end_matches('\n');
                    prop_assert!(body.lines().all(|l| !l.trim().is_empty()), "{:?}", wire);
                }
            }
        }
    }

    /// Snippets are the one place raw text is allowed: even with every permission, a line
    /// that passes holds no newline, control character, environment reference, Lua, program,
    /// socket or file.
    #[test]
    fn snippets_that_pass_are_inert(v in hostile()) {
        use portcullis::snippets::{Origin, Section, SnippetPolicy, check_line, parse};
        let all = SnippetPolicy { allow: true, in_annotations: true };
        for (origin, section) in [
            (Origin::Annotation, Section::Backend),
            (Origin::ConfigMap, Section::Global),
            (Origin::ConfigMap, Section::Frontend),
            (Origin::ConfigMap, Section::Backend),
        ] {
            if let Ok(lines) = parse(&v, origin, section, all) {
                for line in lines {
                    prop_assert!(check_line(&line).is_ok());
                    prop_assert!(!line.contains('\n') && !line.contains('\r') && !line.contains('\0'), "{:?}", line);
                    // What HAProxy would read: before a comment, quotes removed.
                    let lower = line.to_ascii_lowercase();
                    let code = haproxy_code(&lower);
                    for bad in ["env(", "${", "map(", "set-map"] {
                        prop_assert!(!code.contains(bad), "{:?} passed with {:?}", line, bad);
                    }
                    // A Lua fetch or action: `lua.` starting a name.
                    for (i, _) in code.match_indices("lua.") {
                        let before = code[..i].chars().next_back();
                        prop_assert!(before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'),
                            "{:?} passed with a Lua name", line);
                    }
                    let words = haproxy_words(&lower);
                    let keyword = words.first().cloned().unwrap_or_default();
                    for denied in ["lua-load", "program", "setenv", "presetenv", "external-check", "insecure-fork-wanted", "global", "backend", "frontend"] {
                        prop_assert!(keyword != denied, "{:?} passed", line);
                    }
                    prop_assert!(!keyword.starts_with('.'), "{:?} passed", line);
                    for word in &words {
                        prop_assert!(!["file", "lf-file", "errorfile", "config", "crt", "-f"].contains(&word.as_str()),
                            "{:?} passed with a file argument", line);
                    }
                    let mut quoted = false;
                    for c in line.chars() {
                        if c == '\'' { quoted = !quoted; }
                        prop_assert!(c != '$' || quoted, "unquoted $ in {:?}", line);
                    }
                }
            }
            prop_assert!(parse(&v, origin, section, SnippetPolicy::default()).is_err());
        }
    }
}

/// What HAProxy reads of a line: up to the first `#` outside quotes, quotes removed.
fn haproxy_code(line: &str) -> String {
    haproxy_words(line).join(" ")
}

/// The words HAProxy reads from `line`, written independently of the snippet checker: quotes
/// removed, a backslash escaping the next character outside single quotes (`\xNN` a byte),
/// nothing after an unquoted, unescaped `#`.
fn haproxy_words(line: &str) -> Vec<String> {
    let (mut single, mut double) = (false, false);
    let (mut words, mut word, mut in_word) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if !double => (single, in_word) = (!single, true),
            '"' if !single => (double, in_word) = (!double, true),
            '#' if !single && !double => break,
            '\\' if !single => {
                in_word = true;
                match chars.next() {
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        word.extend(u8::from_str_radix(&hex, 16).ok().map(char::from));
                    }
                    Some(next) => word.push(next),
                    None => {}
                }
            }
            c if c.is_whitespace() && !single && !double => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}
