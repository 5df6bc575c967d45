//! Parsers for controller ConfigMap keys that only make sense globally: `syslog-server`, the
//! `log-format` strings and the TLS keys of the HTTPS binds (`ssl-default-bind-options`,
//! `ssl-default-bind-ciphers`, `ssl-default-bind-ciphersuites`). Like every parser in [`crate::values`], they accept a small,
//! checked language and refuse anything that could break out of its place in haproxy.cfg.

use crate::model::{SyslogServer, TlsBindOptions, TlsVersion};
use crate::values::ParseResult;

/// Syslog facilities HAProxy knows.
pub const FACILITIES: &[&str] = &[
    "kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron", "auth2",
    "ftp", "ntp", "audit", "alert", "cron2", "local0", "local1", "local2", "local3", "local4",
    "local5", "local6", "local7",
];

/// Syslog levels, most severe first.
pub const LEVELS: &[&str] = &[
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];

/// Log formats of the `log` keyword.
pub const LOG_FORMATS: &[&str] = &[
    "local", "rfc3164", "rfc5424", "priority", "short", "timed", "iso", "raw",
];

/// The longest `log-format` / `log-format-tcp` value.
pub const MAX_LOG_FORMAT: usize = 2048;

/// The most `syslog-server` lines.
pub const MAX_SYSLOG_SERVERS: usize = 8;

/// `syslog-server`: one target per line, each a comma-separated list of `name:value`
/// parameters (the incumbent's format): `address` (required: an IP address, a host name, or
/// `stdout`/`stderr`), `port`, `length`, `format`, `facility` (default `local0`), `level`,
/// `minlevel`. Blank lines are skipped; one bad line rejects the whole value.
pub fn parse_syslog_servers(v: &str) -> ParseResult<Vec<SyslogServer>> {
    let mut out = Vec::new();
    for (i, line) in v.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let server = parse_syslog_line(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        out.push(server);
    }
    if out.is_empty() {
        return Err("no syslog server (expected e.g. address:10.0.0.1, facility:local0)".into());
    }
    if out.len() > MAX_SYSLOG_SERVERS {
        return Err(format!(
            "{} syslog servers; at most {MAX_SYSLOG_SERVERS}",
            out.len()
        ));
    }
    Ok(out)
}

fn parse_syslog_line(line: &str) -> ParseResult<SyslogServer> {
    if let Some(c) = line.chars().find(|c| c.is_control()) {
        return Err(format!("{line:?} contains the control character {c:?}"));
    }
    let mut server = SyslogServer {
        address: String::new(),
        port: None,
        length: None,
        format: None,
        facility: "local0".to_string(),
        level: None,
        minlevel: None,
    };
    let mut seen = std::collections::BTreeSet::new();
    for param in line.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = param
            .split_once(':')
            .map(|(n, v)| (n.trim(), v.trim()))
            .ok_or_else(|| format!("{param:?} is not name:value"))?;
        if !seen.insert(name.to_string()) {
            return Err(format!("{name} is given twice"));
        }
        let choice = |allowed: &[&str]| -> ParseResult<String> {
            allowed
                .iter()
                .find(|a| **a == value)
                .map(|a| a.to_string())
                .ok_or_else(|| format!("{name} {value:?} is not one of {}", allowed.join(", ")))
        };
        match name {
            "address" => server.address = parse_log_address(value)?,
            "port" => {
                server.port = Some(
                    value
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| format!("port {value:?} is not 1..65535"))?,
                );
            }
            "length" => {
                server.length = Some(
                    value
                        .parse::<u32>()
                        .ok()
                        .filter(|n| (80..=65535).contains(n))
                        .ok_or_else(|| format!("length {value:?} is not 80..65535"))?,
                );
            }
            "format" => server.format = Some(choice(LOG_FORMATS)?),
            "facility" => server.facility = choice(FACILITIES)?,
            "level" => server.level = Some(choice(LEVELS)?),
            "minlevel" => server.minlevel = Some(choice(LEVELS)?),
            other => {
                return Err(format!(
                    "unknown parameter {other:?} (address, port, length, format, facility, level, minlevel)"
                ));
            }
        }
    }
    if server.address.is_empty() {
        return Err("address is required".to_string());
    }
    if server.minlevel.is_some() && server.level.is_none() {
        return Err("minlevel needs level".to_string());
    }
    if matches!(server.address.as_str(), "stdout" | "stderr") && server.port.is_some() {
        return Err(format!("{} takes no port", server.address));
    }
    Ok(server)
}

/// A log target address: an IP address, a lowercase DNS name, or `stdout`/`stderr`.
fn parse_log_address(v: &str) -> ParseResult<String> {
    if matches!(v, "stdout" | "stderr") {
        return Ok(v.to_string());
    }
    if let Ok(ip) = v.parse::<std::net::IpAddr>() {
        return Ok(ip.to_string());
    }
    crate::values::parse_host(v)
        .map_err(|_| format!("address {v:?} is not an IP address, a host name, stdout or stderr"))
}

/// `log-format` and `log-format-tcp`: printed single-quoted, so the value must not be able to
/// leave its quotes or start anything HAProxy expands. Accepted: 1 to 2048 printable ASCII
/// characters (space included), none of `'`, `\`, `$`, `` ` `` or `#`, no leading or trailing
/// space, and every `%[` closed by a matching `]` (brackets nest, as in
/// `%[req.hdr(x),lower]`).
pub fn parse_log_format(v: &str) -> ParseResult<String> {
    if v.is_empty() || v.len() > MAX_LOG_FORMAT {
        return Err(format!(
            "a log format has 1 to {MAX_LOG_FORMAT} characters, this one {}",
            v.len()
        ));
    }
    if v.trim() != v {
        return Err(format!("{v:?} has leading or trailing whitespace"));
    }
    if let Some(c) = v
        .chars()
        .find(|c| !(' '..='~').contains(c) || matches!(*c, '\'' | '\\' | '$' | '`' | '#'))
    {
        return Err(format!(
            "{v:?} contains {c:?}; a log format is printable ASCII without ', \\, $, ` or # (and no line breaks)"
        ));
    }
    // `%[` opens a sample expression that ends at its matching `]`.
    let bytes = v.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if bytes.get(i + 1) == Some(&b'[') && depth == 0 => {
                depth = 1;
                i += 2;
                continue;
            }
            b'[' if depth > 0 => depth += 1,
            b']' if depth > 0 => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    if depth != 0 {
        return Err(format!("{v:?}: a %[ is not closed by ]"));
    }
    Ok(v.to_string())
}

/// The longest cipher list (`ssl-default-bind-ciphers`, `ssl-default-bind-ciphersuites`).
pub const MAX_CIPHER_LIST: usize = 2048;

/// The TLS 1.3 cipher suites OpenSSL knows: the whole set `ciphersuites` may name.
pub const TLS13_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_AES_128_CCM_SHA256",
    "TLS_AES_128_CCM_8_SHA256",
];

/// A protocol version as HAProxy's `ssl-min-ver` / `ssl-max-ver` write it.
pub fn parse_tls_version(v: &str) -> ParseResult<TlsVersion> {
    TlsVersion::ALL
        .iter()
        .copied()
        .find(|t| t.as_str() == v)
        .ok_or_else(|| {
            format!("{v:?} is not a TLS version (SSLv3, TLSv1.0, TLSv1.1, TLSv1.2 or TLSv1.3)")
        })
}

/// `ssl-default-bind-options`: the words HAProxy's option of that name takes that change how
/// clients may connect, and nothing else: `ssl-min-ver <version>`, `ssl-max-ver <version>`,
/// `no-tls-tickets`, `prefer-client-ciphers`, and the older `no-sslv3` … `no-tlsv13`, which
/// must leave one contiguous range of versions and become `ssl-min-ver` / `ssl-max-ver`.
/// Without `ssl-min-ver` the minimum stays TLSv1.2.
pub fn parse_tls_bind_options(v: &str) -> ParseResult<TlsBindOptions> {
    let mut out = TlsBindOptions::default();
    let mut disabled: Vec<TlsVersion> = Vec::new();
    let mut words = v.split_whitespace();
    while let Some(word) = words.next() {
        match word {
            "ssl-min-ver" | "ssl-max-ver" => {
                let version = words
                    .next()
                    .ok_or_else(|| format!("{word} needs a version"))
                    .and_then(parse_tls_version)?;
                if word == "ssl-min-ver" {
                    out.min_version = version;
                } else {
                    out.max_version = Some(version);
                }
            }
            "no-tls-tickets" => out.no_tls_tickets = true,
            "prefer-client-ciphers" => out.prefer_client_ciphers = true,
            _ => match TlsVersion::ALL.iter().find(|t| t.no_option() == word) {
                Some(t) => disabled.push(*t),
                None => {
                    return Err(format!(
                        "{word:?} is not one of ssl-min-ver, ssl-max-ver, no-tls-tickets, prefer-client-ciphers, no-sslv3, no-tlsv10, no-tlsv11, no-tlsv12, no-tlsv13"
                    ));
                }
            },
        }
    }
    // The no-* words, as the range of versions they leave.
    if !disabled.is_empty() {
        let enabled: Vec<TlsVersion> = TlsVersion::ALL
            .iter()
            .copied()
            .filter(|t| !disabled.contains(t))
            .collect();
        let (Some(low), Some(high)) = (enabled.first(), enabled.last()) else {
            return Err("the no-* options disable every TLS version".to_string());
        };
        let contiguous = TlsVersion::ALL
            .iter()
            .filter(|t| *t >= low && *t <= high)
            .all(|t| enabled.contains(t));
        if !contiguous {
            return Err("the no-* options must leave one range of versions (use ssl-min-ver and ssl-max-ver)".to_string());
        }
        out.min_version = out.min_version.max(*low);
        if *high != TlsVersion::Tls13 {
            out.max_version = Some(out.max_version.map_or(*high, |m| m.min(*high)));
        }
    }
    if out.max_version.is_some_and(|max| max < out.min_version) {
        return Err(format!(
            "ssl-max-ver {} is below ssl-min-ver {}",
            out.max_version.map_or("", TlsVersion::as_str),
            out.min_version.as_str()
        ));
    }
    Ok(out)
}

/// `ssl-default-bind-ciphers`: an OpenSSL cipher list for TLS 1.2 and below, elements joined
/// by `:`. Each element is a cipher or alias name (letters, digits, `-`, `_`, `.`, joined by
/// `+`), optionally prefixed by `!`, `-` or `+`, or `@STRENGTH` / `@SECLEVEL=<0..5>`. Names
/// OpenSSL does not know are left to `haproxy -c`, the final check.
pub fn parse_cipher_list(v: &str) -> ParseResult<String> {
    if v.is_empty() || v.len() > MAX_CIPHER_LIST {
        return Err(format!(
            "a cipher list has 1 to {MAX_CIPHER_LIST} characters"
        ));
    }
    for element in v.split(':') {
        let ok = match element {
            "@STRENGTH" => true,
            e if e.starts_with("@SECLEVEL=") => {
                matches!(&e["@SECLEVEL=".len()..], "0" | "1" | "2" | "3" | "4" | "5")
            }
            e => {
                let name = e.strip_prefix(['!', '-', '+']).unwrap_or(e);
                !name.is_empty()
                    && name.split('+').all(|part| {
                        !part.is_empty()
                            && part.starts_with(|c: char| c.is_ascii_alphanumeric())
                            && part
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    })
            }
        };
        if !ok {
            return Err(format!(
                "{element:?} is not a cipher name, alias or @-directive"
            ));
        }
    }
    if !v.split(':').any(|e| !e.starts_with(['!', '-', '@'])) {
        return Err("the cipher list names no cipher to use (only exclusions)".to_string());
    }
    Ok(v.to_string())
}

/// `ssl-default-bind-ciphersuites`: TLS 1.3 suites joined by `:`, each one OpenSSL knows
/// ([`TLS13_SUITES`]), without repeats.
pub fn parse_ciphersuites(v: &str) -> ParseResult<String> {
    if v.is_empty() || v.len() > MAX_CIPHER_LIST {
        return Err(format!(
            "a cipher suite list has 1 to {MAX_CIPHER_LIST} characters"
        ));
    }
    let mut seen: Vec<&str> = Vec::new();
    for suite in v.split(':') {
        if !TLS13_SUITES.contains(&suite) {
            return Err(format!(
                "{suite:?} is not a TLS 1.3 cipher suite ({})",
                TLS13_SUITES.join(", ")
            ));
        }
        if seen.contains(&suite) {
            return Err(format!("{suite} is listed twice"));
        }
        seen.push(suite);
    }
    Ok(v.to_string())
}

/// The TLS keys HAProxy refused: key → (the value refused, HAProxy's words).
pub type RefusedTlsKeys = std::collections::BTreeMap<String, (String, String)>;

/// The cipher lists of `global` that HAProxy's refusal `messages` name (`unable to set SSL
/// cipher list to '<list>'`): each by its ConfigMap key, with the value and the line. Only
/// OpenSSL knows whether a list matches any cipher, so this is how a bad one is found.
pub fn refused_tls_keys(
    global: &crate::model::GlobalSettings,
    messages: &[String],
) -> Vec<(String, (String, String))> {
    let lists = [
        ("ssl-default-bind-ciphers", &global.ssl_ciphers),
        ("ssl-default-bind-ciphersuites", &global.ssl_ciphersuites),
    ];
    let mut out = Vec::new();
    for (key, value) in lists {
        let Some(value) = value else { continue };
        let quoted = format!("'{value}'");
        if let Some(line) = messages
            .iter()
            .find(|m| m.contains("cipher") && m.contains(&quoted))
        {
            out.push((key.to_string(), (value.clone(), line.trim().to_string())));
        }
    }
    out
}

/// Leaves out of `global` the keys HAProxy refused with the value they still have, with an
/// error on the ConfigMap naming the key: OpenSSL's default applies until the value changes.
pub fn leave_out_refused(
    global: &mut crate::model::GlobalSettings,
    refused: &RefusedTlsKeys,
    config_map: &crate::objects::ObjectRef,
    diags: &mut crate::diagnostics::Diagnostics,
) {
    for (key, slot) in [
        ("ssl-default-bind-ciphers", &mut global.ssl_ciphers),
        (
            "ssl-default-bind-ciphersuites",
            &mut global.ssl_ciphersuites,
        ),
    ] {
        let Some((value, words)) = refused.get(key) else {
            continue;
        };
        if slot.as_deref() == Some(value.as_str()) {
            *slot = None;
            diags.object(
                crate::diagnostics::Severity::Error,
                config_map,
                format!("key {key}"),
                format!("HAProxy refused it ({words}); OpenSSL's default applies until it changes"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syslog_servers_in_the_incumbents_format() {
        let s = parse_syslog_servers(
            "address:10.0.0.1, port:514, facility:local1, level:notice\naddress:stdout, format: raw, facility:daemon\n",
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].address, "10.0.0.1");
        assert_eq!(s[0].port, Some(514));
        assert_eq!(s[0].level.as_deref(), Some("notice"));
        assert_eq!(s[1].format.as_deref(), Some("raw"));
        for bad in [
            "",
            "facility:local0",
            "address:10.0.0.1, facility:local9",
            "address:10.0.0.1 lua-load /x",
            "address:10.0.0.1, port:0",
            "address:10.0.0.1, colour:red",
            "address:stdout, port:514",
            "address:10.0.0.1\r, level:info",
        ] {
            assert!(parse_syslog_servers(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn log_formats_cannot_break_out() {
        for good in [
            "%ci:%cp [%tr] %ft %b/%s %ST %B %{+Q}r",
            "%[req.hdr(host),lower] %[var(txn.x)] \"%HM %HU\"",
            "%[src,map_ip(x,[y])]",
        ] {
            assert_eq!(parse_log_format(good).as_deref(), Ok(good), "{good}");
        }
        for bad in [
            "",
            "%ci'\n  lua-load /x",
            "a'b",
            "a\\b",
            "${HOME}",
            "%[src",
            "%[src,lower] # c",
            " x",
            "line\nbreak",
        ] {
            assert!(parse_log_format(bad).is_err(), "{bad:?}");
        }
        assert!(parse_log_format(&"x".repeat(MAX_LOG_FORMAT + 1)).is_err());
    }

    #[test]
    fn tls_bind_options_are_typed() {
        let o = parse_tls_bind_options("ssl-min-ver TLSv1.3 no-tls-tickets").unwrap();
        assert_eq!(o.min_version, TlsVersion::Tls13);
        assert_eq!(o.max_version, None);
        assert!(o.no_tls_tickets && !o.prefer_client_ciphers);
        // The older words become a range.
        let o = parse_tls_bind_options("no-sslv3 no-tlsv10 no-tlsv11").unwrap();
        assert_eq!(o.min_version, TlsVersion::Tls12);
        let o = parse_tls_bind_options("no-tlsv13 prefer-client-ciphers").unwrap();
        assert_eq!(o.min_version, TlsVersion::Tls12);
        assert_eq!(o.max_version, Some(TlsVersion::Tls12));
        assert!(o.prefer_client_ciphers);
        // Empty: the defaults (TLSv1.2 and up, tickets on).
        assert_eq!(
            parse_tls_bind_options("").unwrap(),
            TlsBindOptions::default()
        );
        for bad in [
            "ssl-min-ver",
            "ssl-min-ver TLSv1.4",
            "ssl-min-ver TLSv1.3 ssl-max-ver TLSv1.2",
            "no-tlsv11",
            "no-sslv3 no-tlsv10 no-tlsv11 no-tlsv12 no-tlsv13",
            "crt /etc/passwd",
            "ssl-min-ver TLSv1.2\nlua-load x",
            "force-tlsv12",
        ] {
            assert!(parse_tls_bind_options(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cipher_lists_are_checked_for_syntax() {
        for good in [
            "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256",
            "HIGH:!aNULL:!MD5",
            "ECDHE+AESGCM:-SHA1:@STRENGTH",
            "DEFAULT:@SECLEVEL=2",
        ] {
            assert_eq!(parse_cipher_list(good).unwrap(), good);
        }
        for bad in [
            "",
            "HIGH !aNULL",
            "HIGH:#x",
            "HIGH:'x'",
            "!aNULL:!MD5",
            "HIGH:@SECLEVEL=9",
            "HIGH::MEDIUM",
            "HIGH\nlua-load",
            "HIGH:%[src]",
        ] {
            assert!(parse_cipher_list(bad).is_err(), "{bad:?}");
        }
        assert!(parse_cipher_list(&"A".repeat(MAX_CIPHER_LIST + 1)).is_err());
    }

    #[test]
    fn ciphersuites_are_the_tls13_suites() {
        let v = "TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";
        assert_eq!(parse_ciphersuites(v).unwrap(), v);
        for bad in [
            "",
            "TLS_AES_999_GCM_SHA1",
            "ECDHE-RSA-AES128-GCM-SHA256",
            "TLS_AES_256_GCM_SHA384:TLS_AES_256_GCM_SHA384",
            "TLS_AES_256_GCM_SHA384 ",
        ] {
            assert!(parse_ciphersuites(bad).is_err(), "{bad:?}");
        }
    }

    /// HAProxy's words about a cipher list lead to its key; the next run leaves that key out
    /// while it keeps the value, with an error naming it, and takes a new value again.
    #[test]
    fn a_refused_cipher_list_is_left_out_by_its_key() {
        let global = crate::model::GlobalSettings {
            ssl_ciphers: Some("NOSUCH".to_string()),
            ssl_ciphersuites: Some("TLS_AES_256_GCM_SHA384".to_string()),
            ..Default::default()
        };
        let messages = ["[ALERT] (1) : config : Proxy 'https': unable to set SSL cipher list to 'NOSUCH' for bind '127.0.0.1:443' at [haproxy.cfg:40].".to_string()];
        let refused: RefusedTlsKeys = refused_tls_keys(&global, &messages).into_iter().collect();
        assert_eq!(
            refused.keys().collect::<Vec<_>>(),
            ["ssl-default-bind-ciphers"]
        );
        let config_map = crate::objects::ObjectRef::new(
            crate::objects::Kind::ConfigMap,
            &crate::objects::Key::new("ingress", "portcullis"),
        );
        let mut diags = crate::diagnostics::Diagnostics::new();
        let mut next = global.clone();
        leave_out_refused(&mut next, &refused, &config_map, &mut diags);
        assert_eq!(next.ssl_ciphers, None);
        assert_eq!(next.ssl_ciphersuites, global.ssl_ciphersuites);
        let said: Vec<String> = diags
            .into_sorted()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(said.len(), 1);
        assert!(
            said[0].contains("ConfigMap ingress/portcullis: key ssl-default-bind-ciphers"),
            "{said:?}"
        );
        assert!(
            said[0].contains("unable to set SSL cipher list"),
            "{said:?}"
        );
        // A new value is tried again.
        let mut changed = crate::model::GlobalSettings {
            ssl_ciphers: Some("HIGH".to_string()),
            ..Default::default()
        };
        let mut diags = crate::diagnostics::Diagnostics::new();
        leave_out_refused(&mut changed, &refused, &config_map, &mut diags);
        assert_eq!(changed.ssl_ciphers.as_deref(), Some("HIGH"));
        assert!(diags.is_empty());
    }
}
