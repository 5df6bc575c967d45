//! Raw configuration snippets: the one way raw text reaches haproxy.cfg, and the rules it must
//! pass on the way.
//!
//! Snippets (`global-config-snippet`, `frontend-config-snippet`, `backend-config-snippet`) are
//! off unless an administrator turns them on: `--allow-config-snippets` for the controller
//! ConfigMap, plus `--allow-config-snippets-in-annotations` for Ingress and Service
//! annotations. Even then every line is checked here twice — when a script reads it (with the
//! knowledge of where it came from) and again when a template prints it — and refused if it
//! could run a program, read the environment, load code, open a socket, name a file
//! Portcullis did not write, or start a new section.

use serde::Serialize;

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

/// The longest snippet accepted, in bytes.
pub const MAX_SNIPPET_BYTES: usize = 16 * 1024;

/// Directives that can run programs, load code, change the environment, or expose control
/// sockets. Matched against the first one or two words of a line.
const DENIED_DIRECTIVES: &[&str] = &[
    "lua-load",
    "lua-load-per-thread",
    "lua-prepend-path",
    "program",
    "external-check",
    "insecure-fork-wanted",
    "insecure-setuid-wanted",
    "setenv",
    "presetenv",
    "resetenv",
    "unsetenv",
    "ssl-engine",
    "stats socket",
    "master-worker",
    "chroot",
    "user",
    "group",
    "uid",
    "gid",
    "daemon",
    "pidfile",
    "server-state-file",
    "server-state-base",
    "load-server-state-from-file",
    "crt-base",
    "ca-base",
    "key-base",
    "h1-case-adjust-file",
    "51degrees-data-file",
    "wurfl-data-file",
    "deviceatlas-json-file",
    "fd-hard-limit",
    "ulimit-n",
];

/// Section keywords: a snippet line that starts one would move everything after it into a
/// section of the snippet's choosing.
const SECTIONS: &[&str] = &[
    "global",
    "defaults",
    "frontend",
    "backend",
    "listen",
    "peers",
    "resolvers",
    "userlist",
    "program",
    "cache",
    "ring",
    "mailers",
    "http-errors",
    "crt-store",
    "traces",
    "log-forward",
    "fcgi-app",
];

/// Words after which HAProxy reads a file name.
const FILE_ARGUMENTS: &[&str] = &[
    "crt",
    "crt-list",
    "ca-file",
    "ca-verify-file",
    "crl-file",
    "ca-sign-file",
    "errorfile",
    "errorfiles",
    "-f",
    "-M",
    "key",
    "ocsp",
    "issuer",
    "sctl",
    "file",
    "load",
];

/// Reads a snippet written at `origin` under `policy`: the lines, trimmed of blank ones.
pub fn parse(text: &str, origin: Origin, policy: SnippetPolicy) -> Result<Vec<String>, String> {
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
        check_line(line).map_err(|e| format!("line {}: {e}", n + 1))?;
        out.push(line.trim().to_string());
    }
    Ok(out)
}

/// Whether one snippet line may be printed into haproxy.cfg.
pub fn check_line(line: &str) -> Result<(), String> {
    if let Some(c) = line.chars().find(|c| c.is_control() && *c != '\t') {
        return Err(format!("{c:?} is not allowed"));
    }
    if line.contains('\\') {
        // HAProxy unescapes `\` inside words (`lua\-load` is `lua-load`) and joins lines.
        return Err("a backslash is not allowed in a snippet".to_string());
    }
    if dollar_outside_single_quotes(line) {
        // HAProxy expands `$NAME` from the environment outside single quotes.
        return Err("environment variables ($NAME) are not allowed in a snippet".to_string());
    }
    if unbalanced_quotes(line) {
        // HAProxy refuses the line, and with it the whole configuration.
        return Err("a quote is not closed".to_string());
    }
    // What HAProxy reads: the text before a comment, with quotes removed from words
    // (`"lua-load"` and `lua-load#x` are both `lua-load`).
    let text = without_comment(line).replace(['"', '\''], "");
    let text = text.trim();
    let words: Vec<&str> = text.split_whitespace().collect();
    let Some(first) = words.first() else {
        return Ok(());
    };
    let first = first.to_ascii_lowercase();
    if SECTIONS.contains(&first.as_str()) {
        return Err(format!("{first:?} would start a new section"));
    }
    let two = words
        .get(1)
        .map(|w| format!("{first} {}", w.to_ascii_lowercase()));
    for denied in DENIED_DIRECTIVES {
        if first == *denied || two.as_deref() == Some(denied) {
            return Err(format!("{denied:?} is not allowed in a snippet"));
        }
    }
    let lower = text.to_ascii_lowercase();
    for pattern in [
        "env(",
        "${",
        "lua.",
        "lua-",
        "stats socket",
        "external-check",
    ] {
        if lower.contains(pattern) {
            return Err(format!("{pattern:?} is not allowed in a snippet"));
        }
    }
    if text.contains("../") || text.contains("/..") {
        return Err("path traversal (..) is not allowed in a snippet".to_string());
    }
    for pair in words.windows(2) {
        if FILE_ARGUMENTS.contains(&pair[0]) {
            check_path(pair[1])?;
        }
    }
    // Converters and fetches that read files: map(file), map_*(file), lua.*, acl -f.
    for word in &words {
        for (open, _) in word.match_indices("map") {
            let rest = &word[open..];
            if let Some(paren) = rest.find('(') {
                let name = &rest[..paren];
                if name == "map" || name.starts_with("map_") {
                    let arg = rest[paren + 1..]
                        .split([',', ')'])
                        .next()
                        .unwrap_or_default();
                    check_path(arg)?;
                }
            }
        }
    }
    Ok(())
}

/// Whether a single or double quote is left open (a `#` outside quotes ends the check).
fn unbalanced_quotes(line: &str) -> bool {
    let (mut single, mut double) = (false, false);
    for c in line.chars() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double => break,
            _ => {}
        }
    }
    single || double
}

/// The line up to its first `#` outside quotes.
fn without_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double => return &line[..i],
            _ => {}
        }
    }
    line
}

fn dollar_outside_single_quotes(text: &str) -> bool {
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '\'' => quoted = !quoted,
            '$' if !quoted => return true,
            _ => {}
        }
    }
    false
}

/// A file argument must be one Portcullis generates: under `maps/` or `certs/`, no `..`.
fn check_path(path: &str) -> Result<(), String> {
    let generated = (path.starts_with("maps/") || path.starts_with("certs/"))
        && !path.contains("..")
        && !path.contains("//");
    if generated {
        Ok(())
    } else {
        Err(format!(
            "file {path:?} was not generated by Portcullis (only maps/ and certs/ files may be named)"
        ))
    }
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
        assert!(parse(line, Origin::ConfigMap, SnippetPolicy::default()).is_err());
        let cm_only = SnippetPolicy {
            allow: true,
            in_annotations: false,
        };
        assert_eq!(
            parse(line, Origin::ConfigMap, cm_only).unwrap(),
            vec![line.to_string()]
        );
        assert!(parse(line, Origin::Annotation, cm_only).is_err());
        assert!(parse(line, Origin::Annotation, ON).is_ok());
    }

    #[test]
    fn the_denylist_refuses_what_escapes_the_proxy() {
        for bad in [
            "lua-load /tmp/x.lua",
            "lua-load-per-thread x.lua",
            "program evil",
            "external-check",
            "option external-check",
            "insecure-fork-wanted",
            "setenv A b",
            "presetenv A b",
            "ssl-engine rdrand",
            "stats socket /tmp/s level admin",
            "http-request set-header X %[env(SECRET)]",
            "http-request set-header X \"$HOME\"",
            "http-request set-header X \"${HOME}\"",
            "errorfile 503 /etc/passwd",
            "http-request set-var(txn.x) path,map(/etc/passwd)",
            "http-request deny if { src -f /etc/hosts }",
            "acl bad path -f ../maps/x.map",
            "backend other",
            "frontend stolen",
            "global",
            "http-request return status 200 \\",
            "http-request set-header X a\u{0}b",
            "bind :81 crt /etc/ssl/private/key.pem",
            "http-request lua.fn",
            "http-response set-header X 'a' $HOME",
            "program#x",
            "\"lua-load\" /tmp/x.lua",
            "lua\\-load x",
            "'stats' socket /tmp/s",
            "program'#",
        ] {
            assert!(check_line(bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn ordinary_directives_pass() {
        for good in [
            "http-response set-header X-Frame-Options DENY",
            "http-request deny if { path_beg /admin }",
            "timeout server 30s",
            "option httplog",
            "http-request redirect location /login code 302",
            "http-request set-var(txn.b) path,map_beg(maps/prefix.map)",
            "tune.bufsize 32768",
            "http-response set-header X-Price '$5'",
        ] {
            assert!(check_line(good).is_ok(), "{good:?}: {:?}", check_line(good));
        }
    }

    #[test]
    fn annotations_are_single_line_and_configmaps_may_be_multi_line() {
        let two = "option httplog\nhttp-response set-header X a\n";
        assert!(parse(two, Origin::Annotation, ON).is_err());
        assert_eq!(parse(two, Origin::ConfigMap, ON).unwrap().len(), 2);
        let err = parse("option httplog\nlua-load x", Origin::ConfigMap, ON).unwrap_err();
        assert!(err.starts_with("line 2:"), "{err}");
    }
}
