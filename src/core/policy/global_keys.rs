//! Parsers for controller ConfigMap keys that only make sense globally: `syslog-server` and
//! the `log-format` strings. Like every parser in [`crate::values`], they accept a small,
//! checked language and refuse anything that could break out of its place in haproxy.cfg.

use crate::model::SyslogServer;
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
}
