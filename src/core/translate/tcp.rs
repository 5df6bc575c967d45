//! The TCP custom resource (`ingress.v3.haproxy.org/v3`, kind `TCP`): TCP-mode frontends with
//! binds, optionally terminating TLS with a Secret's certificate, in front of a Service.
//!
//! Frontend names and bind addresses are shared by all objects: where two claim the same, the
//! older object wins and the other entry is reported. A bind may not take an address HAProxy
//! or the controller holds either: the HTTP, HTTPS and stats frontends', the peers port, the
//! admin and debug listeners'. HAProxy accepts such a configuration in `haproxy -c` and then
//! fails every reload, so it is refused here, up front. Ports below 1024 need
//! `--allow-privileged-tcp-binds`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::ServiceBackendPort;

use super::Translator;
use crate::diagnostics::Severity;
use crate::model::{TcpBind, TcpService};
use crate::objects::{Key, Kind, ObjectRef, Tcp};

/// ALPN protocol names: letters, digits, '.', '-', '/' (e.g. `h2`, `http/1.1`).
fn parse_alpn(v: &str) -> Result<Vec<String>, String> {
    let list: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let ok = !list.is_empty()
        && list.iter().all(|p| {
            p.len() <= 32
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'/'))
        });
    if ok {
        Ok(list)
    } else {
        Err(format!(
            "{v:?} is not a comma-separated list of ALPN protocol names"
        ))
    }
}

/// A frontend name: a DNS-1123 label (it becomes part of an HAProxy name).
fn parse_name(v: &str) -> Result<String, String> {
    crate::objects::validate_dns_label(v)?;
    Ok(v.to_string())
}

/// Whether two bind addresses (canonical text) take the same port: equal, or one is a
/// wildcard of the other's family. `::` also covers IPv4, as HAProxy binds it (`v4v6`) on
/// Linux's default `bindv6only=0`.
fn overlaps(a: &str, b: &str) -> bool {
    let v6 = |x: &str| x.contains(':');
    let covers = |wild: &str, other: &str| match wild {
        "0.0.0.0" => !v6(other),
        "::" => true,
        _ => false,
    };
    a == b || covers(a, b) || covers(b, a)
}

impl Translator<'_> {
    /// Addresses HAProxy's own frontends and the controller hold, with their owner's name:
    /// the HTTP, HTTPS and stats frontends, the peers listener (on every address, when this
    /// controller has an identity) and the admin and debug listeners.
    pub(super) fn reserved_binds(&self) -> BTreeMap<(String, u16), String> {
        let mut out = self.listen_binds();
        if self.config.identity.pod_name.is_some() {
            for any in ["0.0.0.0", "::"] {
                out.insert(
                    (any.to_string(), self.config.identity.peer_port),
                    "the peers listener (--localpeer-port)".to_string(),
                );
            }
        }
        for listener in self.config.exposure.endpoints.own_listeners.iter() {
            out.insert(
                (listener.ip().to_canonical().to_string(), listener.port()),
                format!("this controller's admin endpoint ({listener})"),
            );
        }
        out
    }

    /// Translates every TCP object the class filter accepts, oldest first.
    pub(super) fn tcp_objects(&mut self, objects: &[(&Key, &Arc<Tcp>)]) {
        // Frontend names and bind addresses already taken, and by whom.
        let mut names: BTreeMap<String, ObjectRef> = BTreeMap::new();
        let mut addresses: BTreeMap<(String, u16), String> = self.reserved_binds();
        for (key, tcp) in objects {
            let object = ObjectRef::new(Kind::Tcp, key);
            for (i, entry) in tcp.spec.iter().enumerate() {
                let field = format!("spec[{i}]");
                let name = match parse_name(&entry.frontend.name) {
                    Ok(n) => n,
                    Err(e) => {
                        self.diags.object(
                            Severity::Error,
                            &object,
                            format!("{field}.frontend.name"),
                            format!("{e}; entry skipped"),
                        );
                        continue;
                    }
                };
                if let Some(owner) = names.get(&name) {
                    self.diags.object(
                        Severity::Warning,
                        &object,
                        format!("{field}.frontend.name"),
                        format!("frontend {name} is already defined by {owner}, which is older; entry skipped"),
                    );
                    continue;
                }
                let Some(backend) = self.tcp_backend(&object, key, entry, &field) else {
                    continue;
                };
                let mut binds = Vec::new();
                for (b, bind) in entry.frontend.binds.iter().enumerate() {
                    let bfield = format!("{field}.frontend.binds[{b}]");
                    match self.tcp_bind(key, bind, &addresses) {
                        Ok(parsed) => {
                            addresses.insert(
                                (parsed.address.clone(), parsed.port),
                                format!("{object} ({bfield})"),
                            );
                            binds.push(parsed);
                        }
                        Err(e) => self.diags.object(Severity::Error, &object, bfield, e),
                    }
                }
                if binds.is_empty() {
                    self.diags.object(
                        Severity::Error,
                        &object,
                        format!("{field}.frontend.binds"),
                        "no usable bind; entry skipped",
                    );
                    continue;
                }
                names.insert(name.clone(), object.clone());
                self.tcp_services.push(TcpService {
                    frontend: format!("tcp_{name}"),
                    binds,
                    backend,
                    tcplog: entry.frontend.tcplog.unwrap_or(false),
                });
            }
        }
    }

    fn tcp_backend(
        &mut self,
        object: &ObjectRef,
        key: &Key,
        entry: &crate::objects::TcpService,
        field: &str,
    ) -> Option<String> {
        let svc_key = Key::new(key.namespace.clone(), entry.service.name.clone());
        let Some(service) = self.store.service(&svc_key) else {
            self.diags.object(
                Severity::Error,
                object,
                format!("{field}.service.name"),
                format!("Service {svc_key} does not exist; entry skipped"),
            );
            return None;
        };
        let port = ServiceBackendPort {
            name: None,
            number: Some(i32::from(entry.service.port)),
        };
        match self.resolve_port(service, &port) {
            Ok(resolved) => Some(self.register_tcp_backend(&svc_key, resolved)),
            Err(e) => {
                self.diags.object(
                    Severity::Error,
                    object,
                    format!("{field}.service.port"),
                    format!("Service {svc_key}: {e}; entry skipped"),
                );
                None
            }
        }
    }

    fn tcp_bind(
        &mut self,
        key: &Key,
        bind: &crate::objects::TcpBind,
        taken: &BTreeMap<(String, u16), String>,
    ) -> Result<TcpBind, String> {
        let address = match bind.address.as_deref().filter(|a| !a.is_empty()) {
            None => self.config.listen.ipv4_address.clone(),
            Some(a) => a
                .parse::<IpAddr>()
                .map_err(|_| {
                    format!(
                        "address {} is not an IP address; bind skipped",
                        super::exposure::brief(a)
                    )
                })?
                .to_canonical()
                .to_string(),
        };
        if bind.port == 0 {
            return Err("port 0 is not a port; bind skipped".to_string());
        }
        let clash = taken
            .iter()
            .find(|((a, p), _)| *p == bind.port && overlaps(a, &address));
        if let Some((_, owner)) = clash {
            return Err(format!(
                "{address}:{} is already bound by {owner}; bind skipped",
                bind.port
            ));
        }
        if bind.port < 1024 && !self.config.exposure.allow_privileged_tcp_binds {
            return Err(format!(
                "port {} is below 1024, which TCP objects may bind only with --allow-privileged-tcp-binds; bind skipped",
                bind.port
            ));
        }
        let alpn = match bind.alpn.as_deref() {
            Some(v) => parse_alpn(v).map_err(|e| format!("alpn: {e}; bind skipped"))?,
            None => Vec::new(),
        };
        let certificate = if bind.ssl.unwrap_or(false) {
            let secret = bind
                .ssl_certificate
                .as_deref()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    "ssl is true but ssl_certificate is empty; bind skipped".to_string()
                })?;
            let secret_key = Key::new(key.namespace.clone(), secret);
            let path = self
                .certificate(&secret_key)
                .map_err(|e| format!("ssl_certificate: Secret {secret_key}: {e}; bind skipped"))?;
            Some(path)
        } else {
            None
        };
        Ok(TcpBind {
            address,
            port: bind.port,
            certificate,
            alpn,
            crt_list: false,
            accept_proxy: false,
            v6only: false,
        })
    }
}
