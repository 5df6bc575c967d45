//! ConfigMaps named by flags besides the controller ConfigMap: error pages
//! (`--configmap-errorfiles`) and TCP services (`--configmap-tcp-services`).
//!
//! Each key is checked on its own: a bad one is reported against the ConfigMap and the key,
//! and skipped; the others still apply.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::ServiceBackendPort;

use super::Translator;
use crate::diagnostics::Severity;
use crate::model::{BindAddress, ErrorFile, TcpBind, TcpService};
use crate::objects::{Key, Kind, ObjectRef};

/// Status codes HAProxy 2.6 serves error pages for (`errorfile`).
pub const ERRORFILE_CODES: &[u16] = &[
    200, 400, 401, 403, 404, 405, 407, 408, 410, 413, 425, 429, 500, 501, 502, 503, 504,
];

/// The largest error page: HAProxy needs the whole response in one buffer (16 KiB by
/// default, part of it reserved for rewrites).
pub const MAX_ERRORFILE: usize = 8 * 1024;

/// Where the error page of `code` is written, relative to the configuration directory.
pub fn errorfile_path(code: u16) -> String {
    format!("errorfiles/{code}.http")
}

/// One errorfiles ConfigMap entry: `code` must be a status code HAProxy has error pages for,
/// `content` a whole HTTP response: a status line `HTTP/1.0 NNN ...` or `HTTP/1.1 NNN ...`,
/// headers, an empty line, an optional body; at most 8 KiB, no NUL bytes.
pub fn parse_errorfile(code: &str, content: &str) -> Result<ErrorFile, String> {
    let number = code
        .parse::<u16>()
        .ok()
        .filter(|c| ERRORFILE_CODES.contains(c) && code.len() == 3)
        .ok_or_else(|| {
            format!(
                "{code:?} is not a status code HAProxy serves error pages for ({})",
                ERRORFILE_CODES
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    if content.len() > MAX_ERRORFILE {
        return Err(format!(
            "the response has {} bytes; at most {MAX_ERRORFILE}",
            content.len()
        ));
    }
    if content.contains('\0') {
        return Err("the response contains a NUL byte".to_string());
    }
    let status_line = content.lines().next().unwrap_or_default();
    let mut words = status_line.trim_end_matches('\r').splitn(3, ' ');
    let version_ok = matches!(words.next(), Some("HTTP/1.0" | "HTTP/1.1"));
    let status_ok = words.next().is_some_and(|s| {
        s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0')
    });
    if !version_ok || !status_ok {
        return Err(format!(
            "the response must start with a status line such as \"HTTP/1.1 503 Service Unavailable\", not {:?}",
            status_line.chars().take(60).collect::<String>()
        ));
    }
    if !content.contains("\r\n\r\n") && !content.contains("\n\n") {
        return Err("the response has no empty line after its headers".to_string());
    }
    Ok(ErrorFile {
        code: number,
        path: errorfile_path(number),
        content: content.to_string(),
    })
}

/// A `--configmap-tcp-services` value: `namespace/service:port[:option]...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpServiceSpec {
    pub service: Key,
    pub port: u16,
    /// `ssl`: terminate TLS with the controller's certificates (the HTTPS crt-list).
    pub ssl: bool,
    /// `proxy`: clients send a PROXY protocol header (`accept-proxy`).
    pub proxy: bool,
    /// Fields Portcullis reads but ignores (the incumbent's `name=value` backend options).
    pub ignored: Vec<String>,
}

/// Parses `namespace/service:port[:option]...`. Options: `ssl`, `proxy` (any case); empty
/// fields are skipped (`ns/svc:5000::proxy`); a field with `=` (the incumbent's list of
/// backend options) is returned in `ignored`; anything else is refused.
pub fn parse_tcp_service(v: &str) -> Result<TcpServiceSpec, String> {
    if v.trim() != v || v.chars().any(char::is_control) {
        return Err(format!(
            "{v:?} has surrounding whitespace or control characters"
        ));
    }
    let mut fields = v.split(':');
    let target = fields.next().unwrap_or_default();
    let (namespace, name) = target
        .split_once('/')
        .ok_or_else(|| format!("{v:?} is not namespace/service:port[:ssl][:proxy]"))?;
    crate::objects::validate_dns_label(namespace)
        .and_then(|()| crate::objects::validate_dns_label(name))
        .map_err(|e| format!("{target:?}: {e}"))?;
    let port = fields
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{v:?}: the Service port must be a number 1..65535"))?;
    let mut spec = TcpServiceSpec {
        service: Key::new(namespace, name),
        port,
        ssl: false,
        proxy: false,
        ignored: Vec::new(),
    };
    for field in fields {
        match field.to_ascii_lowercase().as_str() {
            "" => {}
            "ssl" => spec.ssl = true,
            "proxy" => spec.proxy = true,
            _ if field.contains('=') => spec.ignored.push(field.to_string()),
            _ => {
                return Err(format!("{v:?}: unknown option {field:?} (ssl, proxy)"));
            }
        }
    }
    Ok(spec)
}

impl Translator<'_> {
    /// The addresses the HTTP, HTTPS and stats frontends bind: the IPv4 one, and the IPv6 one
    /// (`v6only`, beside the IPv4 one). An address that is not an IP binds nothing.
    fn listen_addresses(&self) -> Vec<BindAddress> {
        let l = &self.config.listen;
        let ipv4 = l.ipv4.then_some(&l.ipv4_address).map(|a| (a, false));
        let ipv6 = l.ipv6_address.as_ref().map(|a| (a, true));
        ipv4.into_iter()
            .chain(ipv6)
            .filter_map(|(a, v6only)| Some(BindAddress::new(a.parse().ok()?, v6only)))
            .collect()
    }

    /// The addresses the HTTP, HTTPS and stats frontends bind, with their owner's name.
    pub(super) fn listen_binds(&self) -> BTreeMap<(BindAddress, u16), String> {
        let l = &self.config.listen;
        let mut out = BTreeMap::new();
        for address in self.listen_addresses() {
            if l.http {
                out.insert((address, l.http_port), "the HTTP frontend".to_string());
            }
            if l.https {
                out.insert((address, l.https_port), "the HTTPS frontend".to_string());
            }
            if let Some(port) = l.stats_port {
                out.insert(
                    (address, port),
                    "the stats frontend (--stats-bind-port)".to_string(),
                );
            }
            if let Some(port) = l.healthz_port {
                out.insert(
                    (address, port),
                    "the healthz frontend (--healthz-bind-port)".to_string(),
                );
            }
        }
        out
    }

    /// The error pages of `--configmap-errorfiles`, by code.
    pub(super) fn errorfiles(&mut self) -> Vec<ErrorFile> {
        let Some(key) = self.config.errorfiles_config_map.clone() else {
            return Vec::new();
        };
        let object = ObjectRef::new(Kind::ConfigMap, &key);
        let Some(cm) = self.store.config_map(&key) else {
            self.diags.object(
                Severity::Warning,
                &object,
                "--configmap-errorfiles",
                "the ConfigMap does not exist; HAProxy's own error pages are served",
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (code, content) in cm.data.iter().flatten() {
            match parse_errorfile(code, content) {
                Ok(file) => out.push(file),
                Err(e) => self.diags.object(
                    Severity::Error,
                    &object,
                    format!("key {code}"),
                    format!("{e}; error page ignored"),
                ),
            }
        }
        out.sort_by_key(|f| f.code);
        out
    }

    /// The TCP services of `--configmap-tcp-services`, after the TCP custom resources (whose
    /// binds, like the HTTP, HTTPS and stats frontends', win a port collision).
    pub(super) fn tcp_services_config_map(&mut self) {
        let Some(key) = self.config.tcp_services_config_map.clone() else {
            return;
        };
        let object = ObjectRef::new(Kind::ConfigMap, &key);
        let Some(cm) = self.store.config_map(&key) else {
            self.diags.object(
                Severity::Warning,
                &object,
                "--configmap-tcp-services",
                "the ConfigMap does not exist; no TCP services from it",
            );
            return;
        };
        let mut taken = self.reserved_binds();
        for service in &self.tcp_services {
            for bind in &service.binds {
                taken.insert(
                    (bind.bind_address(), bind.port),
                    format!("frontend {}", service.frontend),
                );
            }
        }
        let mut entries = Vec::new();
        for (k, v) in cm.data.iter().flatten() {
            let field = format!("key {k}");
            if k == "log-format-tcp" {
                self.diags.object(
                    Severity::Warning,
                    &object,
                    field,
                    "ignored: log-format-tcp is read from the controller ConfigMap (--configmap)",
                );
                continue;
            }
            match k
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0 && !k.starts_with('0'))
            {
                Some(port) => entries.push((port, field, v.clone())),
                None => self.diags.object(
                    Severity::Error,
                    &object,
                    field,
                    format!("{k:?} is not a port number 1..65535; entry skipped"),
                ),
            }
        }
        entries.sort();
        let tls_available = self.tls_entries_from_parts > 0 || self.default_certificate.is_some();
        for (port, field, value) in entries {
            let spec = match parse_tcp_service(&value) {
                Ok(s) => s,
                Err(e) => {
                    self.diags.object(
                        Severity::Error,
                        &object,
                        field,
                        format!("{e}; entry skipped"),
                    );
                    continue;
                }
            };
            for ignored in &spec.ignored {
                self.diags.object(
                    Severity::Warning,
                    &object,
                    field.clone(),
                    format!("option {ignored:?} ignored: set backend options as annotations on Service {}", spec.service),
                );
            }
            if spec.ssl && !tls_available {
                self.diags.object(
                    Severity::Error,
                    &object,
                    field,
                    "ssl needs a certificate (an Ingress TLS Secret or --default-ssl-certificate), and there is none; entry skipped",
                );
                continue;
            }
            let addresses = self.listen_addresses();
            let clash = addresses.iter().find_map(|a| {
                taken
                    .iter()
                    .find(|((b, p), _)| *p == port && a.overlaps(*b))
                    .map(|((b, _), owner)| format!("{b}:{port} is already bound by {owner}"))
            });
            if let Some(clash) = clash {
                self.diags.object(
                    Severity::Warning,
                    &object,
                    field,
                    format!("{clash}, which takes precedence; entry skipped"),
                );
                continue;
            }
            let Some(service) = self.store.service(&spec.service) else {
                self.diags.object(
                    Severity::Error,
                    &object,
                    field,
                    format!("Service {} does not exist; entry skipped", spec.service),
                );
                continue;
            };
            let backend_port = ServiceBackendPort {
                name: None,
                number: Some(i32::from(spec.port)),
            };
            let resolved = match self.resolve_port(service, &backend_port) {
                Ok(r) => r,
                Err(e) => {
                    self.diags.object(
                        Severity::Error,
                        &object,
                        field,
                        format!("Service {}: {e}; entry skipped", spec.service),
                    );
                    continue;
                }
            };
            let backend = self.register_tcp_backend(&spec.service, resolved);
            let frontend = format!("tcp-{port}");
            let binds: Vec<TcpBind> = addresses
                .into_iter()
                .map(|address| TcpBind {
                    address: address.ip,
                    v6only: address.v6only,
                    port,
                    certificate: None,
                    alpn: Vec::new(),
                    crt_list: spec.ssl,
                    accept_proxy: spec.proxy,
                    ..TcpBind::default()
                })
                .collect();
            for b in &binds {
                taken.insert((b.bind_address(), port), format!("frontend {frontend}"));
            }
            self.tcp_services.push(TcpService {
                frontend,
                binds,
                backend,
                tcplog: true,
                ..TcpService::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errorfiles_are_checked() {
        let ok = parse_errorfile(
            "503",
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\r\nsorry\n",
        )
        .unwrap();
        assert_eq!(ok.path, "errorfiles/503.http");
        assert!(parse_errorfile("503", "HTTP/1.0 503 x\n\nbody").is_ok());
        for (code, content) in [
            ("418", "HTTP/1.1 418 x\r\n\r\n"),
            ("0503", "HTTP/1.1 503 x\r\n\r\n"),
            ("503", "<html>sorry</html>"),
            ("503", "HTTP/1.1 503 x\r\nno end of headers"),
            ("503", "HTTP/2 503 x\r\n\r\n"),
        ] {
            assert!(
                parse_errorfile(code, content).is_err(),
                "{code} {content:?}"
            );
        }
        let big = format!("HTTP/1.1 503 x\r\n\r\n{}", "x".repeat(MAX_ERRORFILE));
        assert!(parse_errorfile("503", &big).is_err());
    }

    #[test]
    fn tcp_service_values() {
        let s = parse_tcp_service("db/postgres:5432").unwrap();
        assert_eq!(
            (s.service.to_string(), s.port, s.ssl, s.proxy),
            ("db/postgres".into(), 5432, false, false)
        );
        let s = parse_tcp_service("db/postgres:5432:ssl::PROXY:load-balance=leastconn").unwrap();
        assert!(s.ssl && s.proxy);
        assert_eq!(s.ignored, ["load-balance=leastconn"]);
        for bad in [
            "postgres:5432",
            "db/postgres",
            "db/postgres:0",
            "db/postgres:http",
            "db/Postgres:5432",
            "db/postgres:5432:tls",
            " db/postgres:5432",
            "db/postgres:5432\n  lua-load /x",
        ] {
            assert!(parse_tcp_service(bad).is_err(), "{bad:?}");
        }
    }
}
