//! The TCP custom resource (`ingress.v3.haproxy.org/v3`, kind `TCP`): TCP-mode frontends with
//! binds, optionally terminating TLS with a Secret's certificate, in front of a Service.
//!
//! Frontend names and bind addresses are shared by all objects: where two claim the same, the
//! older object wins and the other entry is reported. A bind may not take an address HAProxy
//! or the controller holds either: the HTTP, HTTPS and stats frontends', the peers port, the
//! admin and debug listeners'. HAProxy accepts such a configuration in `haproxy -c` and then
//! fails every reload, so it is refused here, up front. Ports below 1024 need
//! `--allow-privileged-tcp-binds`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::ServiceBackendPort;

use super::{Translator, tcp_rules};
use crate::diagnostics::Severity;
use crate::model::{BindAddress, TcpAcl, TcpBind, TcpService, TcpSwitch};
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

impl Translator<'_> {
    /// Addresses HAProxy's own frontends and the controller hold, with their owner's name:
    /// the HTTP, HTTPS and stats frontends, the peers listener (on every address, when this
    /// controller has an identity) and the admin and debug listeners.
    pub(super) fn reserved_binds(&self) -> BTreeMap<(BindAddress, u16), String> {
        let mut out = self.listen_binds();
        if self.config.identity.pod_name.is_some() {
            // `::` without `v6only`: every address of both families.
            let any = BindAddress::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), false);
            {
                out.insert(
                    (any, self.config.identity.peer_port),
                    "the peers listener (--localpeer-port)".to_string(),
                );
            }
        }
        for listener in self.config.exposure.endpoints.own_listeners.iter() {
            out.insert(
                (BindAddress::new(listener.ip(), false), listener.port()),
                format!("this controller's admin endpoint ({listener})"),
            );
        }
        out
    }

    /// Translates every TCP object the class filter accepts, oldest first.
    pub(super) fn tcp_objects(&mut self, objects: &[(&Key, &Arc<Tcp>)]) {
        // Frontend names and bind addresses already taken, and by whom.
        let mut names: BTreeMap<String, ObjectRef> = BTreeMap::new();
        let mut addresses: BTreeMap<(BindAddress, u16), String> = self.reserved_binds();
        for (key, tcp) in objects {
            let object = ObjectRef::new(Kind::Tcp, key);
            for path in &tcp.unread {
                self.diags.object(
                    Severity::Warning,
                    &object,
                    path.clone(),
                    "Portcullis does not support this field; ignored",
                );
            }
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
                let Some(default) = self.tcp_backend(
                    &object,
                    key,
                    &entry.service,
                    &format!("{field}.service"),
                    "entry skipped",
                ) else {
                    continue;
                };
                let backend = default.name.clone();
                let mut targets = vec![default];
                for (s, target) in entry.services.iter().enumerate() {
                    let sfield = format!("{field}.services[{s}]");
                    let consequence = "Service left out; rules naming it are skipped";
                    if let Some(t) = self.tcp_backend(&object, key, target, &sfield, consequence) {
                        targets.push(t);
                    }
                }
                let Some(binds) = self.tcp_binds(&object, key, entry, &field, &addresses) else {
                    continue;
                };
                let binds = binds
                    .into_iter()
                    .map(|(b, bfield)| {
                        addresses
                            .insert((b.bind_address(), b.port), format!("{object} ({bfield})"));
                        b
                    })
                    .collect();
                names.insert(name.clone(), object.clone());
                let mut service = TcpService {
                    frontend: format!("tcp_{name}"),
                    binds,
                    backend,
                    tcplog: entry.frontend.tcplog.unwrap_or(false),
                    ..TcpService::default()
                };
                self.tcp_frontend_settings(&object, entry, &field, &mut service);
                self.tcp_rules(&object, entry, &field, &targets, &mut service);
                self.tcp_services.push(service);
            }
        }
    }

    /// An entry's binds; `None` (reported) when none is usable. Binds of one entry may share
    /// a port on overlapping addresses (`0.0.0.0` and `::` with `v4v6`, as the incumbent's
    /// examples do): HAProxy binds them with `SO_REUSEPORT` in one process.
    fn tcp_binds(
        &mut self,
        object: &ObjectRef,
        key: &Key,
        entry: &crate::objects::TcpService,
        field: &str,
        taken: &BTreeMap<(BindAddress, u16), String>,
    ) -> Option<Vec<(TcpBind, String)>> {
        let mut binds: Vec<(TcpBind, String)> = Vec::new();
        let list = &entry.frontend.binds;
        for (b, (map_key, bind)) in list.entries.iter().enumerate() {
            let bfield = format!("{field}.frontend.{}", list.field(b));
            // A bind of the map without a `name` is named by its key.
            let name = bind.name.as_deref().or(map_key.as_deref());
            let parsed = self.tcp_bind(key, name, bind, taken).and_then(|p| {
                match binds
                    .iter()
                    .find(|(o, _)| o.address == p.address && o.port == p.port)
                {
                    Some(_) => Err(format!(
                        "{}:{} is bound twice in this frontend; bind skipped",
                        p.address, p.port
                    )),
                    None => Ok(p),
                }
            });
            match parsed {
                Ok(p) => binds.push((p, bfield)),
                Err(e) => self.diags.object(Severity::Error, object, bfield, e),
            }
        }
        if binds.is_empty() {
            self.diags.object(
                Severity::Error,
                object,
                format!("{field}.frontend.binds"),
                "no usable bind; entry skipped",
            );
            return None;
        }
        Some(binds)
    }

    /// `mode`, `log_format`, `maxconn`, `backlog`, the client timeouts and the logging and
    /// keep-alive options of an entry's frontend; a bad value costs that setting alone.
    fn tcp_frontend_settings(
        &mut self,
        object: &ObjectRef,
        entry: &crate::objects::TcpService,
        field: &str,
        out: &mut TcpService,
    ) {
        let fe = &entry.frontend;
        let bad = |diags: &mut crate::diagnostics::Diagnostics, name: &str, e: String| {
            diags.object(
                Severity::Error,
                object,
                format!("{field}.frontend.{name}"),
                format!("{e}; ignored"),
            );
        };
        if let Some(mode) = fe.mode.as_deref().filter(|m| *m != "tcp") {
            bad(
                &mut self.diags,
                "mode",
                format!(
                    "mode {}: a TCP resource's frontend is always tcp",
                    super::exposure::brief(mode)
                ),
            );
        }
        if let Some(f) = &fe.log_format {
            // A tenant's format may not fetch samples (`%[env(…)]` would log the controller's
            // environment); the administrator's `log-format-tcp` may.
            match crate::policy::global_keys::parse_log_format(f) {
                Ok(f) if f.contains("%[") => bad(
                    &mut self.diags,
                    "log_format",
                    "sample expressions (%[...]) are not accepted in a TCP object's log format"
                        .to_string(),
                ),
                Ok(f) => out.log_format = Some(f),
                Err(e) => bad(&mut self.diags, "log_format", e),
            }
        }
        match fe.maxconn {
            Some(n @ 1..=MAX_FRONTEND_MAXCONN) => out.maxconn = Some(n.unsigned_abs()),
            Some(n) => bad(
                &mut self.diags,
                "maxconn",
                format!("{n} is not between 1 and {MAX_FRONTEND_MAXCONN}"),
            ),
            None => {}
        }
        match fe.backlog {
            Some(n @ 1..=MAX_FRONTEND_MAXCONN) => out.backlog = Some(n.unsigned_abs()),
            Some(n) => bad(
                &mut self.diags,
                "backlog",
                format!("{n} is not between 1 and {MAX_FRONTEND_MAXCONN}"),
            ),
            None => {}
        }
        for (name, timeout, value) in [
            ("client_timeout", "client", fe.client_timeout),
            ("client_fin_timeout", "client-fin", fe.client_fin_timeout),
        ] {
            match value {
                Some(ms @ 1..=MAX_TIMEOUT_MS) => {
                    out.timeouts.push((timeout.to_string(), ms.unsigned_abs()));
                }
                Some(ms) => bad(
                    &mut self.diags,
                    name,
                    format!("{ms} is not between 1 and {MAX_TIMEOUT_MS} milliseconds"),
                ),
                None => {}
            }
        }
        for (name, option, value) in [
            ("dontlognull", "dontlognull", &fe.dontlognull),
            ("dontlog_normal", "dontlog-normal", &fe.dontlog_normal),
            ("logasap", "logasap", &fe.logasap),
            ("clitcpka", "clitcpka", &fe.clitcpka),
            ("tcpka", "tcpka", &fe.tcpka),
            ("nolinger", "nolinger", &fe.nolinger),
        ] {
            match value.as_deref() {
                Some("enabled") => out.options.push((true, option.to_string())),
                Some("disabled") => out.options.push((false, option.to_string())),
                Some(other) => bad(
                    &mut self.diags,
                    name,
                    format!(
                        "{} is neither enabled nor disabled",
                        super::exposure::brief(other)
                    ),
                ),
                None => {}
            }
        }
    }

    /// ACLs, `tcp-request` rules and backend switching rules of an entry's frontend. A bad
    /// ACL or rule is skipped and reported; when the frontend rejects connections by rule
    /// and any of its ACLs or `tcp-request` rules is unusable, it rejects every connection
    /// instead (access control fails closed).
    fn tcp_rules(
        &mut self,
        object: &ObjectRef,
        entry: &crate::objects::TcpService,
        field: &str,
        targets: &[TcpTarget],
        out: &mut TcpService,
    ) {
        let fe = &entry.frontend;
        let mut unusable = false;
        let mut declared = BTreeSet::new();
        for (a, acl) in fe.acl_list.iter().enumerate() {
            let parsed = tcp_rules::parse_haproxy_name(acl.acl_name.as_deref().unwrap_or(""))
                .map_err(|e| format!("acl_name: {e}"))
                .and_then(|name| {
                    let words = tcp_rules::parse_acl(
                        acl.criterion.as_deref().unwrap_or(""),
                        acl.value.as_deref().unwrap_or(""),
                    )?;
                    Ok(TcpAcl { name, words })
                });
            match parsed {
                Ok(acl) => {
                    declared.insert(acl.name.clone());
                    out.acls.push(acl);
                }
                Err(e) => {
                    unusable = true;
                    self.diags.object(
                        Severity::Error,
                        object,
                        format!("{field}.frontend.acl_list[{a}]"),
                        format!("{e}; acl skipped"),
                    );
                }
            }
        }
        let mut rejects = false;
        for (r, rule) in fe.tcp_request_rule_list.iter().enumerate() {
            rejects |= rule.action.as_deref() == Some("reject");
            match tcp_request(rule, &declared) {
                Ok(words) => out.requests.push(words),
                Err(e) => {
                    unusable = true;
                    self.diags.object(
                        Severity::Error,
                        object,
                        format!("{field}.frontend.tcp_request_rule_list[{r}]"),
                        format!("{e}; rule skipped"),
                    );
                }
            }
        }
        if rejects && unusable {
            self.diags.object(
                Severity::Error,
                object,
                format!("{field}.frontend.tcp_request_rule_list"),
                "the frontend rejects connections by rule and some of its ACLs or rules are unusable: it refuses every connection until they are fixed",
            );
            out.requests = vec![vec!["connection".to_string(), "reject".to_string()]];
        }
        for (r, rule) in fe.backend_switching_rule_list.iter().enumerate() {
            let rfield = format!("{field}.frontend.backend_switching_rule_list[{r}]");
            let wanted = rule.name.as_deref().unwrap_or("");
            let Some(target) = targets.iter().find(|t| t.answers_to(wanted)) else {
                let known: Vec<&str> = targets.iter().map(|t| t.incumbent.as_str()).collect();
                self.diags.object(
                    Severity::Error,
                    object,
                    format!("{rfield}.name"),
                    format!(
                        "{} names no backend of this entry's service and services ({}); rule skipped",
                        super::exposure::brief(wanted),
                        known.join(", ")
                    ),
                );
                continue;
            };
            match tcp_rules::parse_rule_condition(
                rule.cond.as_deref(),
                rule.cond_test.as_deref(),
                &declared,
            ) {
                Ok(condition) => out.switching.push(TcpSwitch {
                    backend: target.name.clone(),
                    condition,
                }),
                Err(e) => self.diags.object(
                    Severity::Error,
                    object,
                    rfield,
                    format!("{e}; rule skipped"),
                ),
            }
        }
    }

    /// The TCP backend of a Service port named by a TCP object (its `service` or one of its
    /// `services`); `None` (reported) when the Service or port does not exist.
    fn tcp_backend(
        &mut self,
        object: &ObjectRef,
        key: &Key,
        target: &crate::objects::TcpTarget,
        field: &str,
        consequence: &str,
    ) -> Option<TcpTarget> {
        let svc_key = Key::new(key.namespace.clone(), target.name.clone());
        let Some(service) = self.store.service(&svc_key) else {
            self.diags.object(
                Severity::Error,
                object,
                format!("{field}.name"),
                format!("Service {svc_key} does not exist; {consequence}"),
            );
            return None;
        };
        let port = ServiceBackendPort {
            name: None,
            number: Some(i32::from(target.port)),
        };
        match self.resolve_port(service, &port) {
            Ok(resolved) => {
                let port_name = if resolved.name.is_empty() {
                    resolved.number.to_string()
                } else {
                    resolved.name.clone()
                };
                let incumbent = format!("{}_svc_{}_{}", key.namespace, target.name, port_name);
                let by_number = format!("{}_svc_{}_{}", key.namespace, target.name, target.port);
                let name = self.register_tcp_backend(&svc_key, resolved);
                Some(TcpTarget {
                    name,
                    incumbent,
                    by_number,
                })
            }
            Err(e) => {
                self.diags.object(
                    Severity::Error,
                    object,
                    format!("{field}.port"),
                    format!("Service {svc_key}: {e}; {consequence}"),
                );
                None
            }
        }
    }

    fn tcp_bind(
        &mut self,
        key: &Key,
        name: Option<&str>,
        bind: &crate::objects::TcpBind,
        taken: &BTreeMap<(BindAddress, u16), String>,
    ) -> Result<TcpBind, String> {
        let name = name
            .map(tcp_rules::parse_haproxy_name)
            .transpose()
            .map_err(|e| format!("name: {e}; bind skipped"))?;
        let address = match bind.address.as_deref().filter(|a| !a.is_empty()) {
            None => &self.config.listen.ipv4_address,
            Some(a) => a,
        };
        let address = address
            .parse::<IpAddr>()
            .map_err(|_| {
                format!(
                    "address {} is not an IP address; bind skipped",
                    super::exposure::brief(address)
                )
            })?
            .to_canonical();
        let port = match bind.port {
            Some(p @ 1..=65535) => u16::try_from(p).unwrap_or_default(),
            Some(p) => return Err(format!("port {p} is not a port; bind skipped")),
            None => return Err("port is missing; bind skipped".to_string()),
        };
        let v6 = address.is_ipv6();
        let v4v6 = bind.v4v6.unwrap_or(false);
        let v6only = bind.v6only.unwrap_or(false);
        if (v4v6 || v6only) && !v6 {
            return Err(format!(
                "v4v6 and v6only apply to an IPv6 address, not {address}; bind skipped"
            ));
        }
        if v4v6 && v6only {
            return Err("v4v6 and v6only contradict each other; bind skipped".to_string());
        }
        let this = BindAddress::new(address, v6only);
        let clash = taken
            .iter()
            .find(|((a, p), _)| *p == port && this.overlaps(*a));
        if let Some((_, owner)) = clash {
            return Err(format!(
                "{address}:{port} is already bound by {owner}; bind skipped"
            ));
        }
        if port < 1024 && !self.config.exposure.allow_privileged_tcp_binds {
            return Err(format!(
                "port {port} is below 1024, which TCP objects may bind only with --allow-privileged-tcp-binds; bind skipped"
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
            name,
            address,
            port,
            certificate,
            alpn,
            crt_list: false,
            accept_proxy: bind.accept_proxy.unwrap_or(false),
            v6only,
            v4v6,
        })
    }
}

/// The largest `maxconn` of a TCP frontend (the global key's bound).
const MAX_FRONTEND_MAXCONN: i64 = 10_000_000;
/// The longest timeout accepted, a day in milliseconds.
const MAX_TIMEOUT_MS: i64 = 86_400_000;

/// A backend a TCP entry may switch to, with the names a rule may call it by: Portcullis'
/// own, and the incumbent's (`<namespace>_svc_<service>_<port name, else number>`, and with
/// the number).
#[derive(Debug, Clone)]
struct TcpTarget {
    name: String,
    incumbent: String,
    by_number: String,
}

impl TcpTarget {
    fn answers_to(&self, name: &str) -> bool {
        name == self.name || name == self.incumbent || name == self.by_number
    }
}

/// One `tcp-request` rule as the words after `tcp-request`.
fn tcp_request(
    rule: &crate::objects::TcpRequestRule,
    declared: &BTreeSet<String>,
) -> Result<Vec<String>, String> {
    let kind = rule.kind.as_deref().unwrap_or("");
    match kind {
        "inspect-delay" => match rule.timeout {
            Some(ms @ 0..=MAX_TIMEOUT_MS) => Ok(vec![kind.to_string(), ms.to_string()]),
            Some(ms) => Err(format!(
                "timeout {ms} is not between 0 and {MAX_TIMEOUT_MS} milliseconds"
            )),
            None => Err("inspect-delay needs a timeout".to_string()),
        },
        "connection" | "session" | "content" => {
            let action = rule.action.as_deref().unwrap_or("");
            if !matches!(action, "accept" | "reject") {
                return Err(format!(
                    "action {} is not supported (accept, reject)",
                    super::exposure::brief(action)
                ));
            }
            let mut words = vec![kind.to_string(), action.to_string()];
            words.extend(tcp_rules::parse_rule_condition(
                rule.cond.as_deref(),
                rule.cond_test.as_deref(),
                declared,
            )?);
            Ok(words)
        }
        other => Err(format!(
            "type {} is not supported (inspect-delay, connection, session, content)",
            super::exposure::brief(other)
        )),
    }
}
