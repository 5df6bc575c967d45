//! Raw configuration snippets: the one way raw text reaches haproxy.cfg, and the rules it must
//! pass on the way.
//!
//! Snippets (`global-config-snippet`, `frontend-config-snippet`, `backend-config-snippet`) are
//! off unless an administrator turns them on: `--allow-config-snippets` for the controller
//! ConfigMap, plus `--allow-config-snippets-in-annotations` for Ingress and Service
//! annotations. Even then every line is checked here twice — when a script reads it (with the
//! knowledge of where it came from and which section it is for) and again when a template
//! prints it.
//!
//! The check is an allowlist. A line is first split into words exactly as HAProxy's config
//! reader (`parse_line()` in HAProxy 2.6 `src/tools.c`) splits it: single quotes literal,
//! double quotes with backslash escapes and `$` expansion, backslash escapes outside quotes,
//! `#` starting a comment outside quotes. Then its directive, and for rule directives its
//! action, must be in the list for the section; no word may name a file, and no word may use a
//! sample fetch or converter that reads the environment, a file, Lua or another proxy's
//! stick table. A `$` outside single quotes is refused outright, so nothing is expanded.

use serde::Serialize;

use crate::diagnostics::quoted;

/// Who may use snippets; built from flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub struct SnippetPolicy {
    /// `--allow-config-snippets`: snippets in the controller ConfigMap.
    pub allow: bool,
    /// `--allow-config-snippets-in-annotations`: also in annotations (needs `allow`).
    pub in_annotations: bool,
}

/// Where a snippet was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    ConfigMap,
    Annotation,
}

/// The section a snippet goes into, which decides what it may say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Global,
    Frontend,
    Backend,
}

impl Section {
    /// The section of the snippet read under an annotation or key `name`
    /// (`global-config-snippet`, `frontend-config-snippet`, `backend-config-snippet`).
    pub fn of_name(name: &str) -> Option<Section> {
        if name.starts_with("global") {
            Some(Section::Global)
        } else if name.starts_with("frontend") {
            Some(Section::Frontend)
        } else if name.starts_with("backend") {
            Some(Section::Backend)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Section::Global => "global",
            Section::Frontend => "frontend",
            Section::Backend => "backend",
        }
    }
}

/// The longest snippet accepted, in bytes.
pub const MAX_SNIPPET_BYTES: usize = 16 * 1024;

/// HAProxy refuses a line of more words than this (`MAX_LINE_ARGS`), and with it the
/// configuration.
const MAX_WORDS: usize = 63;

/// Directives of the `global` section a snippet may use: limits and tuning, TLS defaults, log
/// tags. Nothing that names a file, a socket, a program, a user or the environment.
const GLOBAL_DIRECTIVES: &[&str] = &[
    "maxconn",
    "maxconnrate",
    "maxsessrate",
    "maxsslconn",
    "maxsslrate",
    "maxcomprate",
    "maxcompcpuusage",
    "maxpipes",
    "maxzlibmem",
    "spread-checks",
    "max-spread-checks",
    "hard-stop-after",
    "grace",
    "ssl-default-bind-ciphers",
    "ssl-default-bind-ciphersuites",
    "ssl-default-bind-options",
    "ssl-default-bind-curves",
    "ssl-default-server-ciphers",
    "ssl-default-server-ciphersuites",
    "ssl-default-server-options",
    "log-send-hostname",
    "log-tag",
    "h2-workaround-bogus-websocket-clients",
    "tune.bufsize",
    "tune.maxrewrite",
    "tune.http.maxhdr",
    "tune.http.cookielen",
    "tune.http.logurilen",
    "tune.h2.header-table-size",
    "tune.h2.initial-window-size",
    "tune.h2.max-concurrent-streams",
    "tune.h2.max-frame-size",
    "tune.maxaccept",
    "tune.maxpollevents",
    "tune.recv_enough",
    "tune.idletimer",
    "tune.ssl.default-dh-param",
    "tune.ssl.cachesize",
    "tune.ssl.lifetime",
    "tune.ssl.maxrecord",
    "tune.comp.maxlevel",
    "tune.pattern.cache-size",
    "tune.rcvbuf.client",
    "tune.rcvbuf.server",
    "tune.sndbuf.client",
    "tune.sndbuf.server",
    "tune.pipesize",
    "tune.vars.global-max-size",
    "tune.vars.proc-max-size",
    "tune.vars.reqres-max-size",
    "tune.vars.sess-max-size",
    "tune.vars.txn-max-size",
    "tune.buffers.limit",
    "tune.buffers.reserve",
];

/// Directives of a frontend snippet. Rule directives are checked further by action.
const FRONTEND_DIRECTIVES: &[&str] = &[
    "http-request",
    "http-response",
    "http-after-response",
    "tcp-request",
    "acl",
    "option",
    "no",
    "timeout",
    "capture",
    "declare",
    "compression",
    "redirect",
    "errorloc",
    "errorloc302",
    "errorloc303",
    "http-error",
    "unique-id-format",
    "unique-id-header",
    "log-format",
    "maxconn",
    "rate-limit",
    "filter",
];

/// Directives of a backend snippet. Rule directives are checked further by action.
const BACKEND_DIRECTIVES: &[&str] = &[
    "http-request",
    "http-response",
    "http-after-response",
    "tcp-request",
    "tcp-response",
    "acl",
    "option",
    "no",
    "timeout",
    "compression",
    "redirect",
    "errorloc",
    "errorloc302",
    "errorloc303",
    "http-error",
    "http-reuse",
    "http-check",
    "http-send-name-header",
    "retries",
    "retry-on",
    "balance",
    "hash-type",
    "fullconn",
    "cookie",
    "ignore-persist",
    "force-persist",
    "filter",
];

/// `option` (and `no option`) names a snippet may use.
const OPTIONS: &[&str] = &[
    "abortonclose",
    "accept-invalid-http-request",
    "accept-invalid-http-response",
    "allbackups",
    "checkcache",
    "contstats",
    "disable-h2-upgrade",
    "dontlog-normal",
    "dontlognull",
    "forwardfor",
    "h1-case-adjust-bogus-client",
    "h1-case-adjust-bogus-server",
    "http-buffer-request",
    "http-ignore-probes",
    "http-keep-alive",
    "http-no-delay",
    "http-pretend-keepalive",
    "http-restrict-req-hdr-names",
    "http-server-close",
    "http-use-proxy-header",
    "httpchk",
    "httpclose",
    "httplog",
    "independent-streams",
    "log-health-checks",
    "log-separate-errors",
    "logasap",
    "nolinger",
    "originalto",
    "persist",
    "prefer-last-server",
    "redispatch",
    "socket-stats",
    "splice-auto",
    "splice-request",
    "splice-response",
    "ssl-hello-chk",
    "tcp-smart-accept",
    "tcp-smart-connect",
    "tcplog",
];

/// `http-check` steps a snippet may use (no `connect`: it could aim checks anywhere).
const HTTP_CHECK_STEPS: &[&str] = &["expect", "send", "send-state", "disable-on-404"];

/// `filter` types a snippet may use.
const FILTERS: &[&str] = &["compression"];

/// `http-request` actions a snippet may use (`normalize-uri` is experimental in HAProxy 2.6 and
/// needs a global directive no snippet may set).
const HTTP_REQUEST_ACTIONS: &[&str] = &[
    "add-header",
    "set-header",
    "del-header",
    "replace-header",
    "replace-value",
    "set-path",
    "set-pathq",
    "set-query",
    "set-uri",
    "set-method",
    "replace-path",
    "replace-pathq",
    "replace-uri",
    "set-var",
    "unset-var",
    "set-log-level",
    "set-nice",
    "set-mark",
    "set-tos",
    "set-timeout",
    "set-priority-class",
    "set-priority-offset",
    "allow",
    "deny",
    "tarpit",
    "reject",
    "silent-drop",
    "auth",
    "redirect",
    "return",
    "capture",
    "early-hint",
    "wait-for-body",
    "wait-for-handshake",
    "strict-mode",
    "disable-l7-retry",
];

/// `http-response` actions a snippet may use.
const HTTP_RESPONSE_ACTIONS: &[&str] = &[
    "add-header",
    "set-header",
    "del-header",
    "replace-header",
    "replace-value",
    "set-status",
    "set-var",
    "unset-var",
    "set-log-level",
    "set-nice",
    "set-mark",
    "set-tos",
    "allow",
    "deny",
    "silent-drop",
    "redirect",
    "return",
    "capture",
    "wait-for-body",
    "strict-mode",
];

/// `http-after-response` actions a snippet may use.
const HTTP_AFTER_RESPONSE_ACTIONS: &[&str] = &[
    "add-header",
    "set-header",
    "del-header",
    "replace-header",
    "replace-value",
    "set-status",
    "set-var",
    "unset-var",
    "allow",
    "capture",
    "strict-mode",
];

/// `tcp-request` / `tcp-response` rule actions a snippet may use.
const TCP_ACTIONS: &[&str] = &[
    "accept",
    "reject",
    "close",
    "silent-drop",
    "set-var",
    "unset-var",
    "set-log-level",
    "set-mark",
    "set-tos",
    "set-nice",
    "capture",
    "switch-mode",
];

/// Words after which HAProxy reads a file; refused wherever they appear as a word.
const FILE_WORDS: &[&str] = &[
    "file",
    "lf-file",
    "errorfile",
    "errorfiles",
    "config",
    "crt",
    "crt-list",
    "ca-file",
    "crl-file",
    "-f",
    "-M",
];

/// Variables the route lookup after a frontend snippet owns (`templates/parts/routing.j2`).
const ROUTING_VARIABLES: &[&str] = &[
    "txn.route",
    "txn.host",
    "txn.path",
    "txn.hostpath",
    "txn.wildhost",
    "txn.wildpath",
    "txn.policy",
    "txn.canary",
    "txn.canarykey",
    "txn.canary_route",
];

/// Reads a snippet for `section` written at `origin` under `policy`: the lines, trimmed of
/// blank ones.
pub fn parse(
    text: &str,
    origin: Origin,
    section: Section,
    policy: SnippetPolicy,
) -> Result<Vec<String>, String> {
    if !policy.allow {
        return Err(
            "config snippets are disabled; an administrator can enable them with --allow-config-snippets"
                .to_string(),
        );
    }
    if origin == Origin::Annotation && !policy.in_annotations {
        return Err(
            "config snippets are accepted from the controller ConfigMap only; --allow-config-snippets-in-annotations also accepts them from annotations"
                .to_string(),
        );
    }
    if text.len() > MAX_SNIPPET_BYTES {
        return Err(format!(
            "the snippet is {} bytes, more than {MAX_SNIPPET_BYTES}",
            text.len()
        ));
    }
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.trim().is_empty())
        .collect();
    if origin == Origin::Annotation && lines.len() > 1 {
        return Err("a snippet in an annotation must be a single line".to_string());
    }
    let mut out = Vec::with_capacity(lines.len());
    for (n, line) in lines.iter().enumerate() {
        // The line as it is printed, trimmed: trimming may leave an escape at its end
        // (`\` before a tab), which the template's check refuses.
        let line = line.trim();
        check_line_in(line, section).map_err(|e| format!("line {}: {e}", n + 1))?;
        out.push(line.to_string());
    }
    Ok(out)
}

/// Whether one snippet line may be printed into some section of haproxy.cfg: the check a
/// template's `{{ line|snippet }}` makes, which does not know the section; [`parse`] checks
/// for the section the snippet is for.
pub fn check_line(line: &str) -> Result<(), String> {
    let mut first = None;
    for section in [Section::Backend, Section::Frontend, Section::Global] {
        match check_line_in(line, section) {
            Ok(()) => return Ok(()),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_default())
}

/// Whether one snippet line may be printed into a `section`.
pub fn check_line_in(line: &str, section: Section) -> Result<(), String> {
    let words = words(line)?;
    let Some(first) = words.first() else {
        // Blank or only a comment.
        return Ok(());
    };
    if words.len() > MAX_WORDS {
        return Err(format!(
            "the line has {} words; HAProxy reads at most {MAX_WORDS}",
            words.len()
        ));
    }
    if first.starts_with('.') {
        return Err(format!(
            "{} is a preprocessor directive, which a snippet may not use",
            quoted(first)
        ));
    }
    for word in &words {
        if FILE_WORDS.contains(&word.as_str()) {
            return Err(format!(
                "{} names a file, which a snippet may not do",
                quoted(word)
            ));
        }
        check_expressions(word)?;
    }
    let allowed = match section {
        Section::Global => GLOBAL_DIRECTIVES,
        Section::Frontend => FRONTEND_DIRECTIVES,
        Section::Backend => BACKEND_DIRECTIVES,
    };
    if !allowed.contains(&first.as_str()) {
        return Err(format!(
            "{} is not a directive a {} snippet may use (see the list in docs/annotations.md)",
            quoted(first),
            section.name()
        ));
    }
    check_arguments(&words, section)
}

/// The arguments of directives whose arguments choose what they do.
fn check_arguments(words: &[String], section: Section) -> Result<(), String> {
    let word = |i: usize| words.get(i).map(String::as_str).unwrap_or_default();
    let refuse = |what: &str, w: &str| {
        Err(format!(
            "{} is not {what} a {} snippet may use",
            quoted(w),
            section.name()
        ))
    };
    match word(0) {
        "option" => check_option(word(1), section),
        "no" => match word(1) {
            "option" => check_option(word(2), section),
            other => refuse("a directive", other),
        },
        "http-check" if !HTTP_CHECK_STEPS.contains(&word(1)) => {
            refuse("an http-check step", word(1))
        }
        "filter" if !FILTERS.contains(&word(1)) => refuse("a filter", word(1)),
        "http-request" => check_action(word(1), HTTP_REQUEST_ACTIONS, section),
        "http-response" => check_action(word(1), HTTP_RESPONSE_ACTIONS, section),
        "http-after-response" => check_action(word(1), HTTP_AFTER_RESPONSE_ACTIONS, section),
        "tcp-request" | "tcp-response" => {
            let rulesets: &[&str] = match (word(0), section) {
                ("tcp-request", Section::Frontend) => {
                    &["connection", "session", "content", "inspect-delay"]
                }
                _ => &["content", "inspect-delay"],
            };
            match word(1) {
                "inspect-delay" => Ok(()),
                set if rulesets.contains(&set) => check_action(word(2), TCP_ACTIONS, section),
                other => refuse("a rule set", other),
            }
        }
        _ => Ok(()),
    }
}

fn check_option(name: &str, section: Section) -> Result<(), String> {
    if OPTIONS.contains(&name) {
        Ok(())
    } else {
        Err(format!(
            "option {} is not an option a {} snippet may use",
            quoted(name),
            section.name()
        ))
    }
}

/// A rule's action, `name` or `name(<args>)`.
fn check_action(word: &str, allowed: &[&str], section: Section) -> Result<(), String> {
    let name = word.split('(').next().unwrap_or_default();
    if !allowed.contains(&name) {
        return Err(format!(
            "{} is not an action a {} snippet may use",
            quoted(name),
            section.name()
        ));
    }
    if section == Section::Frontend && matches!(name, "set-var" | "unset-var") {
        let variable = word[name.len()..]
            .trim_start_matches('(')
            .split([',', ')'])
            .next()
            .unwrap_or_default();
        if ROUTING_VARIABLES.contains(&variable) {
            return Err(format!(
                "{} belongs to the route lookup that follows a frontend snippet",
                quoted(variable)
            ));
        }
    }
    Ok(())
}

/// Refuses sample fetches and converters that read the environment, a file or Lua, or name a
/// stick table (another proxy's), wherever they appear in a word.
fn check_expressions(word: &str) -> Result<(), String> {
    let bytes = word.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        let is_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'.';
        if !is_name(bytes[start]) {
            start += 1;
            continue;
        }
        let mut end = start;
        while end < bytes.len() && is_name(bytes[end]) {
            end += 1;
        }
        let name = &word[start..end];
        let call = bytes.get(end) == Some(&b'(');
        let lower = name.to_ascii_lowercase();
        // A map converter may read a pattern file of --configmap-patternfiles, which holds
        // only what its ConfigMap's writer put there.
        let map = lower == "map" || lower.starts_with("map_");
        let pattern_file = map && call && names_pattern_file(&word[end + 1..]);
        let denied = lower.starts_with("lua.")
            || (call
                && !pattern_file
                && (matches!(lower.as_str(), "env" | "map" | "in_table")
                    || lower.starts_with("map_")
                    || lower.starts_with("table_")
                    || lower.starts_with("sc_")
                    || lower.starts_with("sc0_")
                    || lower.starts_with("sc1_")
                    || lower.starts_with("sc2_")
                    || (lower.starts_with("src_")
                        && !matches!(lower.as_str(), "src_port" | "src_is_local"))));
        if denied {
            return Err(format!(
                "{} reads the environment, a file, Lua or a stick table, which a snippet may not do",
                quoted(name)
            ));
        }
        start = end;
    }
    Ok(())
}

/// Whether the arguments of a converter, `args` (what follows its `(`), start with a pattern
/// file `patterns/<key>` as their own argument.
fn names_pattern_file(args: &str) -> bool {
    let first = args.split([',', ')']).next().unwrap_or_default();
    args.len() > first.len()
        && crate::values::parse_pattern_ref(first).is_ok()
        && first.trim() == first
}

/// The words HAProxy 2.6 reads from a line (`parse_line()` with the options of its config
/// reader): what a snippet's allowlist is checked against. Refused: a control character, a
/// `$` anywhere outside single quotes (HAProxy would expand it inside double quotes and
/// outside quotes), an unclosed quote, an invalid `\x` escape, and an escape that makes a
/// control character.
fn words(line: &str) -> Result<Vec<String>, String> {
    if let Some(c) = line.chars().find(|c| c.is_control() && *c != '\t') {
        return Err(format!("{c:?} is not allowed in a snippet"));
    }
    let chars: Vec<char> = line.chars().collect();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let (mut single, mut double) = (false, false);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '#' if !single && !double => {
                // A comment: HAProxy reads no further, and neither does this check, but a
                // `$` is refused here too so that no line that passes holds one unquoted.
                if chars[i..].contains(&'$') {
                    return Err("a $ is not allowed in a snippet's comment".to_string());
                }
                break;
            }
            '"' if !single => {
                double = !double;
                in_word = true;
            }
            '\'' if !double => {
                single = !single;
                in_word = true;
            }
            '$' if !single => {
                return Err(
                    "environment variables ($) are not allowed in a snippet, not even inside double quotes; single-quote a literal $"
                        .to_string(),
                );
            }
            '\\' if !single => {
                let next = chars.get(i + 1).copied();
                let decoded = match next {
                    Some(' ' | '\\' | '#' | '\'' | '"') => {
                        i += 1;
                        next
                    }
                    None => {
                        // Newer HAProxy versions join such a line with the next one.
                        return Err("a line may not end with a backslash".to_string());
                    }
                    Some('t' | 'n' | 'r') => {
                        return Err(
                            "an escape making a tab or line break is not allowed in a snippet"
                                .to_string(),
                        );
                    }
                    Some('x') => {
                        let hex: String = chars.iter().skip(i + 2).take(2).collect();
                        let byte = (hex.len() == 2 && hex.chars().all(|h| h.is_ascii_hexdigit()))
                            .then(|| u8::from_str_radix(&hex, 16).ok())
                            .flatten()
                            .ok_or_else(|| {
                                "an invalid \\x escape (HAProxy refuses it)".to_string()
                            })?;
                        if !byte.is_ascii() || byte.is_ascii_control() {
                            return Err(format!(
                                "the escape \\x{hex} makes a byte a snippet may not hold"
                            ));
                        }
                        i += 3;
                        Some(char::from(byte))
                    }
                    _ => Some('\\'),
                };
                word.extend(decoded);
                in_word = true;
            }
            c if c.is_whitespace() && c.is_ascii() && !single && !double => {
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
        i += 1;
    }
    if single || double {
        // HAProxy refuses the line, and with it the whole configuration.
        return Err("a quote is not closed".to_string());
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ON: SnippetPolicy = SnippetPolicy {
        allow: true,
        in_annotations: true,
    };

    #[test]
    fn off_by_default_and_configmap_only_unless_annotations_are_allowed() {
        let line = "http-response set-header X-Site yes";
        let parse = |origin, policy| parse(line, origin, Section::Backend, policy);
        assert!(parse(Origin::ConfigMap, SnippetPolicy::default()).is_err());
        let cm_only = SnippetPolicy {
            allow: true,
            in_annotations: false,
        };
        assert_eq!(
            parse(Origin::ConfigMap, cm_only).unwrap(),
            vec![line.to_string()]
        );
        assert!(parse(Origin::Annotation, cm_only).is_err());
        assert!(parse(Origin::Annotation, ON).is_ok());
    }

    #[test]
    fn words_are_read_as_haproxy_reads_them() {
        let w = |l: &str| words(l).unwrap();
        assert_eq!(w(r#"a 'b c' "d e" f\ g"#), ["a", "b c", "d e", "f g"]);
        assert_eq!(w(r#"'lua'-load x#y"#), ["lua-load", "x"]);
        assert_eq!(
            w(r#"a\x41 \1 '\x41' "\"q\"""#),
            ["aA", r"\1", r"\x41", "\"q\""]
        );
        assert_eq!(w(r##"'#' "#" \#"##), ["#", "#", "#"]);
        assert_eq!(w("''"), [""]);
        assert!(w("# only a comment").is_empty());
        for bad in [
            "a $HOME",
            "a \"$HOME\"",
            "a \"'$HOME'\"",
            "a \"\\$HOME\"",
            "a ${HOME}",
            "a 'b",
            "a \"b",
            "a \\x0a",
            "a \\x00",
            "a \\xZZ",
            "a \\x+1",
            "a \\n",
            "a\u{0}b",
            "a\rb",
        ] {
            assert!(words(bad).is_err(), "{bad:?}");
        }
        assert_eq!(w("set-header X '$5'"), ["set-header", "X", "$5"]);
    }

    /// Map converters may read the pattern files of --configmap-patternfiles, and only those.
    #[test]
    fn maps_read_pattern_files() {
        for ok in [
            "http-after-response set-header result %[var(txn.path),ltrim(/),map(patterns/mapping)]",
            "http-request set-var(txn.x) path,map_beg(patterns/prefixes,none)",
            "http-request set-var(txn.x) src,map_ip(patterns/nets)",
        ] {
            assert_eq!(check_line_in(ok, Section::Backend), Ok(()), "{ok}");
        }
    }

    /// Lines that would read files, the environment or code, rewrite other tenants' routes,
    /// or leave their place.
    #[test]
    fn what_is_not_on_the_list_is_refused() {
        for bad in [
            // Files.
            "http-request return status 200 content-type text/plain lf-file /etc/passwd",
            "http-request return status 200 file certs/crt-list.txt",
            "http-request return status 200 file certs/other.pem",
            "http-request deny errorfile /etc/passwd",
            "http-error status 503 errorfile /etc/passwd",
            "http-request set-var(txn.b) path,map_beg(maps/prefix.map)",
            "http-request set-var(txn.x) path,map(/etc/passwd)",
            "http-request set-var(txn.x) path,map(patterns/../../etc/passwd)",
            "http-request set-var(txn.x) path,map(patterns/a/b)",
            "http-request set-var(txn.x) path,map(patterns/)",
            "http-request set-var(txn.x) path,map(maps/exact.map)",
            "http-request set-map(patterns/ips) %[src] a",
            "http-request add-acl(patterns/ips) %[src]",
            "http-request deny if { src -f /etc/hosts }",
            "acl bad path -M maps/x.map",
            "errorfile 503 /etc/passwd",
            "filter spoe engine x config /etc/passwd",
            "filter trace",
            // The environment.
            "http-response set-header X-Home \"'$HOME'\"",
            "http-request set-header X %[env(SECRET)]",
            "http-request set-header X \"${HOME}\"",
            "http-response set-header X 'a' $HOME",
            // Other tenants' routes and tables.
            "http-request set-map(maps/exact.map) %[req.hdr(host)] evil",
            "http-response del-map(maps/exact.map) a",
            "http-request add-acl(maps/x.acl) a",
            "http-request del-acl(maps/x.acl) a",
            "http-request track-sc0 src table other",
            "http-request sc-inc-gpc0(0)",
            "http-request set-var(txn.x) sc_http_req_rate(0,other)",
            "http-request set-var(txn.x) src,table_http_req_rate(other)",
            // Where a connection goes.
            "http-request set-dst ipv4(127.0.0.1)",
            "http-request set-dst-port int(6060)",
            "http-request use-service prometheus-exporter",
            "http-request do-resolve(txn.ip,dns) hdr(host)",
            "http-check connect addr 127.0.0.1 port 6060",
            "server x 127.0.0.1:6060",
            "bind :81 crt /etc/ssl/private/key.pem",
            // Preprocessor.
            ".if defined(HOME)",
            ".alert x",
            ".diag x",
            ".notice x",
            ".warning x",
            ".endif",
            "\".if\" 1",
            // Code, programs, sockets, sections.
            "lua-load /tmp/x.lua",
            "http-request lua.fn",
            "http-request set-var(txn.x) lua.fn",
            "program evil",
            "external-check",
            "option external-check",
            "insecure-fork-wanted",
            "setenv A b",
            "stats socket /tmp/s level admin",
            "backend other",
            "frontend stolen",
            "global",
            "\"lua-load\" /tmp/x.lua",
            "lua\\-load x",
            "'stats' socket /tmp/s",
            "program#x",
            "http-request send-spoe-group a b",
            "http-request cache-use c",
            "stick-table type ip size 100m",
            "HTTP-REQUEST deny",
            "http-request return status 200 \\",
        ] {
            assert!(check_line(bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn each_section_has_its_own_list() {
        let ok = |l: &str, s| check_line_in(l, s).is_ok();
        assert!(ok("tune.bufsize 32768", Section::Global));
        assert!(!ok("tune.bufsize 32768", Section::Backend));
        assert!(!ok("tune.ssl.keylog on", Section::Global));
        assert!(!ok("log /dev/log local0", Section::Global));
        assert!(ok("retries 3", Section::Backend));
        assert!(!ok("retries 3", Section::Frontend));
        assert!(ok("capture request header Host len 32", Section::Frontend));
        assert!(!ok("capture request header Host len 32", Section::Backend));
        assert!(ok("tcp-request connection reject", Section::Frontend));
        assert!(!ok("tcp-request connection reject", Section::Backend));
        // The route lookup's variables are its own.
        assert!(!ok(
            "http-request set-var(txn.policy) str(x)",
            Section::Frontend
        ));
        assert!(!ok("http-request unset-var(txn.route)", Section::Frontend));
        assert!(ok(
            "http-request set-var(txn.mine) str(x)",
            Section::Frontend
        ));
        assert!(check_line("tune.bufsize 32768").is_ok());
    }

    #[test]
    fn ordinary_directives_pass() {
        for (good, section) in [
            (
                "http-response set-header X-Frame-Options DENY",
                Section::Backend,
            ),
            ("http-request deny if { path_beg /admin }", Section::Backend),
            ("timeout server 30s", Section::Backend),
            ("option httplog", Section::Frontend),
            ("no option http-server-close", Section::Backend),
            (
                "http-request redirect location /login code 302",
                Section::Backend,
            ),
            ("http-response set-header X-Price '$5'", Section::Backend),
            (
                "http-request set-header X-Host %[req.hdr(host),lower]",
                Section::Backend,
            ),
            (
                "http-request return status 200 content-type text/plain string ok",
                Section::Backend,
            ),
            (
                "http-request set-var(txn.port) src_port,add(1)",
                Section::Backend,
            ),
            (
                "http-after-response set-header X-A \"b c\"",
                Section::Backend,
            ),
            ("http-check expect status 200", Section::Backend),
            ("filter compression", Section::Backend),
            ("tcp-request inspect-delay 5s", Section::Backend),
            ("tcp-request content accept if HTTP", Section::Backend),
            ("tcp-response content accept", Section::Backend),
            ("maxconn 5000", Section::Global),
            ("acl admin path_beg /admin", Section::Frontend),
            ("# a comment", Section::Backend),
        ] {
            assert_eq!(check_line_in(good, section), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn annotations_are_single_line_and_configmaps_may_be_multi_line() {
        let two = "option httplog\nhttp-response set-header X a\n";
        assert!(parse(two, Origin::Annotation, Section::Backend, ON).is_err());
        assert_eq!(
            parse(two, Origin::ConfigMap, Section::Backend, ON)
                .unwrap()
                .len(),
            2
        );
        let err = parse(
            "option httplog\nlua-load x",
            Origin::ConfigMap,
            Section::Backend,
            ON,
        )
        .unwrap_err();
        assert!(err.starts_with("line 2:"), "{err}");
    }

    #[test]
    fn messages_quote_briefly() {
        let long = format!("http-request {}", "x".repeat(100_000));
        let err = check_line_in(&long, Section::Backend).unwrap_err();
        assert!(err.len() < 300, "{} bytes", err.len());
    }
}
