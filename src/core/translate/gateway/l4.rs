//! TLSRoutes and TCPRoutes into TCP-mode frontends and backends.
//!
//! - A `TCP` listener's port is a frontend of its own (`gateway_tcp_<port>`); the oldest
//!   TCPRoute attached there takes the port, younger ones are warned.
//! - A `TLS` passthrough listener on a port of its own is a frontend (`gateway_tls_<port>`)
//!   that reads the ClientHello and picks a backend by server name; one on the HTTPS port
//!   adds the same rules to the ssl-passthrough frontend, after the Ingresses'
//!   ssl-passthrough hosts, which take precedence (a TLSRoute host an Ingress also passes
//!   through is warned and left out). There a route must name its hosts: one for every name
//!   would take every other host's HTTPS.
//! - Server names: an exact name before a wildcard, a longer wildcard before a shorter one,
//!   and for one name the oldest route. A wildcard matches one or more labels, as the spec
//!   says.
//! - Backends are the Service port's TCP backend (`tcp_<namespace>_<service>_<port>`), shared
//!   with ssl-passthrough Ingresses and TCP services. Weights become `rand` conditions as for
//!   HTTPRoutes; a backend ref that does not resolve, and a route or frontend with no backend,
//!   lead to the built-in `portcullis_reject`, which closes the connection.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::networking::v1::ServiceBackendPort;

use super::{Attachments, Condition, Frontend, RouteState, backend_ref_of, l4_routes};
use crate::diagnostics::{Diagnostics, Severity};
use crate::model::{MapEntry, TcpBind, TcpService, TcpSwitch};
use crate::objects::gateway::{L4Route, L4RouteRule};
use crate::objects::{Key, Kind, ObjectRef};
use crate::store::Store;
use crate::translate::Translator;

/// The built-in TCP backend without servers: its connections are closed.
pub const REJECT_BACKEND: &str = "portcullis_reject";

/// How long a TLS frontend waits for the ClientHello.
const INSPECT_DELAY: &str = "5s";

/// One TLSRoute's rule for one server name: where its connections go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniRule {
    /// Validated; `*.` for a wildcard; empty: every name.
    pub host: String,
    /// (backend, weight), weights above zero.
    pub backends: Vec<(String, i64)>,
    pub route: ObjectRef,
    pub field: String,
}

/// Whether a route of an HTTP or HTTPS listener on a port of its own leads to the built-in
/// 500 backend (its values carry a prefix, so the maps' own check does not see them). Looked
/// for only while such ports exist.
pub fn port_routes_invalid(
    ports: &[crate::model::HttpPort],
    maps: &crate::model::RouteMaps,
    canaries: &[crate::model::CanaryRoute],
) -> bool {
    if ports.is_empty() {
        return false;
    }
    let invalid = format!(
        "{}{}",
        super::listeners::PORT_VALUE_PREFIX,
        crate::translate::routes::INVALID_BACKEND
    );
    maps.exact
        .iter()
        .chain(&maps.prefix)
        .any(|e| *e.value == *invalid)
        || canaries.iter().any(|c| c.route == invalid)
}

/// The route's `ResolvedRefs` condition: every backend ref names a Service port that
/// exists, in its namespace or one whose ReferenceGrant permits it.
pub fn resolved_refs(store: &Store, kind: Kind, key: &Key, route: &L4Route) -> Condition {
    for (i, rule) in route.spec.rules.iter().enumerate() {
        for (j, r) in rule.backend_refs.iter().enumerate() {
            if let Err((reason, message)) = backend_ref_of(store, kind, key, &r.reference) {
                return Condition::no(
                    "ResolvedRefs",
                    reason,
                    format!("spec.rules[{i}].backendRefs[{j}]: {message}"),
                );
            }
        }
    }
    Condition::yes("ResolvedRefs", "ResolvedRefs")
}

/// The `use_backend` rules of the passthrough frontend for the TLSRoutes on the HTTPS port.
/// Names that others serve on that port take precedence: an ssl-passthrough Ingress' (the
/// SNI map, looked up first) and a name HTTPS serves with a certificate of its own (an
/// Ingress' TLS host, an HTTPS listener's), which would otherwise be taken from its owner. A
/// route naming one exactly is warned and left out there; one with a wildcard over such
/// names hands them to the HTTPS frontend first.
pub fn passthrough_rules(
    rules: Vec<SniRule>,
    (sni, crt_list): (&[MapEntry], &[crate::model::CrtListEntry]),
    diags: &mut Diagnostics,
) -> Vec<TcpSwitch> {
    if rules.is_empty() {
        return Vec::new();
    }
    let offloaded: BTreeSet<&str> = crt_list
        .iter()
        .flat_map(|e| &e.sni)
        .map(String::as_str)
        .filter(|n| !n.starts_with("*.") && !n.is_empty())
        .collect();
    let (wildcards, exact): (Vec<SniRule>, Vec<SniRule>) = rules
        .into_iter()
        .filter(|r| {
            let owner = if sni.iter().any(|e| *e.key == *r.host) {
                "passed through by an Ingress (ssl-passthrough)"
            } else if offloaded.contains(r.host.as_str()) {
                "served with a certificate on the HTTPS port (an Ingress' TLS host or an HTTPS listener's)"
            } else {
                return true;
            };
            diags.object(
                Severity::Warning,
                &r.route,
                r.field.clone(),
                format!(
                    "host {} is also {owner}, which takes precedence; not passed through here",
                    r.host
                ),
            );
            false
        })
        .partition(|r| r.host.starts_with("*."));
    let mut out = switches(&exact);
    // The certificate names under a route's wildcard go to the HTTPS frontend first, a few
    // to a line (HAProxy's lines are bounded).
    let covered: Vec<&str> = offloaded
        .iter()
        .copied()
        .filter(|n| {
            wildcards
                .iter()
                .any(|w| w.host.strip_prefix('*').is_some_and(|s| n.ends_with(s)))
        })
        .collect();
    for chunk in covered.chunks(OFFLOAD_NAMES_PER_LINE) {
        let mut condition = words(&["if", "{", "req_ssl_sni,lower", "-m", "str"]);
        condition.extend(chunk.iter().map(|n| n.to_string()));
        condition.push("}".to_string());
        out.push(TcpSwitch {
            backend: HTTPS_OFFLOAD.to_string(),
            condition,
        });
    }
    out.extend(switches(&wildcards));
    out
}

/// The passthrough frontend's backend to the HTTPS frontend (`parts/frontend-passthrough.j2`).
const HTTPS_OFFLOAD: &str = "portcullis_https_offload";

/// Names per `use_backend` line of [`passthrough_rules`].
const OFFLOAD_NAMES_PER_LINE: usize = 16;

/// The rules in the order HAProxy must try them: exact names, then wildcards longest
/// first, then the rule for every name; each name's backends by weight.
fn switches(rules: &[SniRule]) -> Vec<TcpSwitch> {
    let mut ordered: Vec<&SniRule> = rules.iter().collect();
    ordered.sort_by_key(|r| {
        let wildcard = r.host.starts_with("*.");
        (
            r.host.is_empty(),
            wildcard,
            std::cmp::Reverse(r.host.len()),
            r.host.clone(),
        )
    });
    let mut out = Vec::new();
    for r in ordered {
        let name: Vec<String> = if r.host.is_empty() {
            Vec::new()
        } else if let Some(suffix) = r.host.strip_prefix('*') {
            words(&["{", "req_ssl_sni,lower", "-m", "end", suffix, "}"])
        } else {
            words(&["{", "req_ssl_sni,lower", "-m", "str", &r.host, "}"])
        };
        weighted(&r.backends, &name, &mut out);
    }
    out
}

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|w| w.to_string()).collect()
}

/// `use_backend` rules sharing `condition` by weight: backend `k` of `n` is taken with
/// `rand(rest) lt w_k`, where `rest` is the sum of its weight and those after it; the last
/// takes what is left.
fn weighted(backends: &[(String, i64)], condition: &[String], out: &mut Vec<TcpSwitch>) {
    let mut rest: i64 = backends.iter().map(|(_, w)| *w).sum();
    for (k, (backend, weight)) in backends.iter().enumerate() {
        let mut words = condition.to_vec();
        if k + 1 < backends.len() {
            words.extend([
                "{".to_string(),
                format!("rand({rest})"),
                "lt".to_string(),
                weight.to_string(),
                "}".to_string(),
            ]);
        }
        rest -= weight;
        if !words.is_empty() {
            words.insert(0, "if".to_string());
        }
        out.push(TcpSwitch {
            backend: backend.clone(),
            condition: words,
        });
    }
}

impl Translator<'_> {
    /// The TLSRoutes and TCPRoutes attached to our listeners, and the frontends of the
    /// listeners with ports of their own.
    pub(in crate::translate) fn gateway_l4(&mut self, attachments: &Attachments) {
        self.listener_warnings(attachments);
        // Port → protocol, for the listeners with a bind of their own.
        let mut ports: BTreeMap<u16, Frontend> = BTreeMap::new();
        for g in &attachments.gateways {
            for l in &g.listeners {
                if let (Some(f), Some(p)) = (l.frontend, l.port) {
                    ports.entry(p).or_insert(f);
                }
            }
        }
        let tls = self.tls_rules(attachments);
        let tcp = self.tcp_route_ports(attachments);
        for (port, frontend) in ports {
            if matches!(frontend, Frontend::Http | Frontend::Https) {
                // Its routes are keys of the shared maps; the template makes the frontend.
                self.gateway_http_ports.push(crate::model::HttpPort {
                    port,
                    tls: frontend == Frontend::Https,
                });
                continue;
            }
            let binds = self.gateway_binds(port);
            if binds.is_empty() {
                continue;
            }
            let mut service = TcpService {
                binds,
                tcplog: true,
                ..TcpService::default()
            };
            match frontend {
                Frontend::Tcp => {
                    service.frontend = format!("gateway_tcp_{port}");
                    let backends = tcp.get(&port).cloned().unwrap_or_default();
                    weighted(&backends, &[], &mut service.switching);
                    // The last rule has no condition: its backend is the default.
                    service.backend = service
                        .switching
                        .pop()
                        .map_or_else(|| REJECT_BACKEND.to_string(), |s| s.backend);
                }
                _ => {
                    service.frontend = format!("gateway_tls_{port}");
                    service.requests = vec![
                        words(&["inspect-delay", INSPECT_DELAY]),
                        words(&[
                            "content",
                            "accept",
                            "if",
                            "{",
                            "req_ssl_hello_type",
                            "1",
                            "}",
                        ]),
                    ];
                    let rules: Vec<SniRule> = tls
                        .iter()
                        .filter(|(p, _)| *p == Some(port))
                        .map(|(_, r)| r.clone())
                        .collect();
                    service.switching = switches(&rules);
                    service.backend = REJECT_BACKEND.to_string();
                }
            }
            if service.backend == REJECT_BACKEND
                || service
                    .switching
                    .iter()
                    .any(|s| s.backend == REJECT_BACKEND)
            {
                self.gateway_reject = true;
            }
            self.tcp_services.push(service);
        }
        for (port, rule) in tls {
            if port.is_none() {
                if rule.backends.iter().any(|(b, _)| b == REJECT_BACKEND) {
                    self.gateway_reject = true;
                }
                self.gateway_sni.push(rule);
            }
        }
    }

    /// The binds of a listener port: the addresses the HTTP and HTTPS frontends bind.
    fn gateway_binds(&self, port: u16) -> Vec<TcpBind> {
        let l = &self.config.listen;
        let ipv4 = l.ipv4.then_some(&l.ipv4_address).map(|a| (a, false));
        let ipv6 = l.ipv6_address.as_ref().map(|a| (a, true));
        ipv4.into_iter()
            .chain(ipv6)
            .filter_map(|(a, v6only)| {
                Some(TcpBind {
                    address: a.parse::<IpAddr>().ok()?,
                    port,
                    v6only,
                    ..TcpBind::default()
                })
            })
            .collect()
    }

    /// The server-name rules of the TLSRoutes, with the port of their listener's own
    /// frontend (none: the HTTPS port's passthrough frontend). For one name on one port the
    /// oldest route wins; the others are warned.
    fn tls_rules(&mut self, attachments: &Attachments) -> Vec<(Option<u16>, SniRule)> {
        let routes: BTreeMap<&Key, &L4Route> = l4_routes(self.store, Kind::TlsRoute).collect();
        let mut claimed: BTreeMap<(Option<u16>, String), ObjectRef> = BTreeMap::new();
        let mut out = Vec::new();
        for state in &attachments.tls_routes {
            let Some(route) = routes.get(&state.key) else {
                continue;
            };
            let object = ObjectRef::new(Kind::TlsRoute, &state.key);
            self.parent_warnings(&object, state);
            for (i, h) in route.spec.hostnames.iter().enumerate() {
                if let Err(e) = crate::values::parse_host(h) {
                    self.diags.object(
                        Severity::Error,
                        &object,
                        format!("spec.hostnames[{i}]"),
                        format!("{e}; hostname skipped"),
                    );
                }
            }
            let mut hosts: BTreeSet<(Option<u16>, String)> = BTreeSet::new();
            for parent in state.parents.iter().filter(|p| p.conditions[0].status) {
                for (g, l, names) in &parent.listeners {
                    let port = attachments.gateways[*g].listeners[*l].port;
                    for name in names {
                        if port.is_none() && name.is_empty() {
                            self.diags.object(
                                Severity::Error,
                                &object,
                                "spec.hostnames",
                                "on the HTTPS port a TLSRoute needs hostnames (or a listener with a hostname): a route for every name would take every other host's HTTPS; not served there",
                            );
                            continue;
                        }
                        hosts.insert((port, name.clone()));
                    }
                }
            }
            let mut backends: Option<Vec<(String, i64)>> = None;
            for (port, host) in hosts {
                if let Some(owner) = claimed.get(&(port, host.clone())) {
                    self.diags.object(
                        Severity::Warning,
                        &object,
                        "spec.hostnames",
                        format!(
                            "server name {} is already routed by {owner}, which is older; not served here",
                            if host.is_empty() { "(any)" } else { &host }
                        ),
                    );
                    continue;
                }
                claimed.insert((port, host.clone()), object.clone());
                let backends = backends
                    .get_or_insert_with(|| self.l4_backends(&object, &state.key, route))
                    .clone();
                out.push((
                    port,
                    SniRule {
                        host,
                        backends,
                        route: object.clone(),
                        field: "spec.hostnames".to_string(),
                    },
                ));
            }
        }
        out
    }

    /// The backends of the TCP listener ports: each port's oldest TCPRoute's.
    fn tcp_route_ports(&mut self, attachments: &Attachments) -> BTreeMap<u16, Vec<(String, i64)>> {
        let routes: BTreeMap<&Key, &L4Route> = l4_routes(self.store, Kind::TcpRoute).collect();
        let mut owners: BTreeMap<u16, ObjectRef> = BTreeMap::new();
        let mut out = BTreeMap::new();
        for state in &attachments.tcp_routes {
            let Some(route) = routes.get(&state.key) else {
                continue;
            };
            let object = ObjectRef::new(Kind::TcpRoute, &state.key);
            self.parent_warnings(&object, state);
            let ports: BTreeSet<u16> = state
                .parents
                .iter()
                .filter(|p| p.conditions[0].status)
                .flat_map(|p| &p.listeners)
                .filter_map(|(g, l, _)| attachments.gateways[*g].listeners[*l].port)
                .collect();
            let mut backends: Option<Vec<(String, i64)>> = None;
            for port in ports {
                if let Some(owner) = owners.get(&port) {
                    self.diags.object(
                        Severity::Warning,
                        &object,
                        "spec.parentRefs",
                        format!(
                            "port {port} is already routed by {owner}, which is older; not served there"
                        ),
                    );
                    continue;
                }
                owners.insert(port, object.clone());
                let b = backends
                    .get_or_insert_with(|| self.l4_backends(&object, &state.key, route))
                    .clone();
                out.insert(port, b);
            }
        }
        out
    }

    /// A warning for each listener that is not served, naming why (the status says the
    /// same; with manifests, this is where it shows).
    fn listener_warnings(&mut self, attachments: &Attachments) {
        for g in &attachments.gateways {
            let object = ObjectRef::new(Kind::Gateway, &g.key);
            for (i, l) in g.listeners.iter().enumerate() {
                if let Some(c) = l
                    .conditions
                    .iter()
                    .find(|c| c.kind == "Accepted" && !c.status)
                {
                    self.diags.object(
                        Severity::Warning,
                        &object,
                        format!("spec.listeners[{i}]"),
                        format!(
                            "listener {}: Accepted {}: {}; not served",
                            l.name, c.reason, c.message
                        ),
                    );
                }
            }
        }
    }

    /// Warnings for the parent refs that did not accept the route.
    fn parent_warnings(&mut self, object: &ObjectRef, state: &RouteState) {
        for parent in &state.parents {
            if let Some(refused) = parent.conditions.iter().find(|c| !c.status) {
                let effect = if refused.kind == "Accepted" {
                    "not attached there"
                } else {
                    "served without the refs that do not resolve"
                };
                self.diags.object(
                    Severity::Warning,
                    object,
                    format!("spec.parentRefs[{}]", parent.index),
                    format!(
                        "{} {}: {}: {effect}",
                        refused.kind, refused.reason, refused.message
                    ),
                );
            }
        }
    }

    /// The route's backends by weight (its first rule; the spec allows one for TCPRoutes,
    /// and a TLSRoute's rules have nothing to choose between them). A ref that does not
    /// resolve keeps its share, which is closed; no backend at all closes every connection.
    fn l4_backends(
        &mut self,
        object: &ObjectRef,
        key: &Key,
        route: &L4Route,
    ) -> Vec<(String, i64)> {
        if route.spec.rules.len() > 1 {
            self.diags.object(
                Severity::Warning,
                object,
                "spec.rules",
                "only the first rule is served (it has nothing to match on); the others are ignored",
            );
        }
        let empty = L4RouteRule::default();
        let rule = route.spec.rules.first().unwrap_or(&empty);
        let mut out: Vec<(String, i64)> = Vec::new();
        for (j, r) in rule.backend_refs.iter().enumerate() {
            let at = format!("spec.rules[0].backendRefs[{j}]");
            let Some(weight) = super::served_weight(&mut self.diags, object, &at, r.weight) else {
                continue;
            };
            let name = match backend_ref_of(self.store, object.kind, key, &r.reference) {
                Ok((service_key, service, number)) => {
                    let port = ServiceBackendPort {
                        name: None,
                        number: Some(number),
                    };
                    match self.resolve_port(&service, &port) {
                        Ok(resolved) => self.register_tcp_backend(&service_key, resolved),
                        Err(e) => {
                            self.diags.object(
                                Severity::Error,
                                object,
                                at,
                                format!("Service {service_key}: {e}; its share is refused"),
                            );
                            REJECT_BACKEND.to_string()
                        }
                    }
                }
                Err((_, message)) => {
                    self.diags.object(
                        Severity::Error,
                        object,
                        at,
                        format!("{message}; its share is refused"),
                    );
                    REJECT_BACKEND.to_string()
                }
            };
            out.push((name, weight));
        }
        if out.is_empty() {
            self.diags.object(
                Severity::Warning,
                object,
                "spec.rules[0].backendRefs",
                "no backend with a weight above 0: every connection is refused",
            );
            out.push((REJECT_BACKEND.to_string(), 1));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, backends: &[(&str, i64)]) -> SniRule {
        SniRule {
            host: host.to_string(),
            backends: backends.iter().map(|(b, w)| (b.to_string(), *w)).collect(),
            route: ObjectRef::new(Kind::TlsRoute, &Key::new("ns", "r")),
            field: "spec.hostnames".to_string(),
        }
    }

    fn lines(s: &[TcpSwitch]) -> Vec<String> {
        s.iter()
            .map(|s| format!("{} {}", s.backend, s.condition.join(" ")))
            .collect()
    }

    #[test]
    fn exact_names_before_wildcards_and_weights_split_the_rest() {
        let rules = [
            rule("*.example.com", &[("w", 1)]),
            rule("", &[("any", 1)]),
            rule("a.example.com", &[("a", 1), ("b", 3)]),
            rule("*.b.example.com", &[("wb", 1)]),
        ];
        assert_eq!(
            lines(&switches(&rules)),
            [
                "a if { req_ssl_sni,lower -m str a.example.com } { rand(4) lt 1 }",
                "b if { req_ssl_sni,lower -m str a.example.com }",
                "wb if { req_ssl_sni,lower -m end .b.example.com }",
                "w if { req_ssl_sni,lower -m end .example.com }",
                "any ",
            ]
        );
    }

    #[test]
    fn a_tcp_frontends_default_keeps_its_share() {
        let mut out = Vec::new();
        let backends = [
            ("a".to_string(), 1),
            ("b".to_string(), 2),
            ("c".to_string(), 1),
        ];
        weighted(&backends, &[], &mut out);
        assert_eq!(
            lines(&out),
            ["a if { rand(4) lt 1 }", "b if { rand(3) lt 2 }", "c "]
        );
    }

    #[test]
    fn ingress_and_certificate_names_take_precedence() {
        let mut diags = Diagnostics::default();
        let sni = [MapEntry {
            key: "a.example.com".into(),
            value: "tcp_x".into(),
        }];
        let crt_list = [crate::model::CrtListEntry {
            path: crate::model::CertPath::new("certs/x.pem".to_string(), Key::new("other", "x")),
            options: None,
            sni: vec!["c.example.com".to_string(), "d.other.com".to_string()],
        }];
        let out = passthrough_rules(
            vec![
                rule("a.example.com", &[("a", 1)]),
                rule("b.example.com", &[("b", 1)]),
                rule("c.example.com", &[("c", 1)]),
                rule("*.example.com", &[("w", 1)]),
            ],
            (&sni, &crt_list),
            &mut diags,
        );
        assert_eq!(
            lines(&out),
            [
                "b if { req_ssl_sni,lower -m str b.example.com }",
                "portcullis_https_offload if { req_ssl_sni,lower -m str c.example.com }",
                "w if { req_ssl_sni,lower -m end .example.com }",
            ]
        );
        let d = diags.into_sorted();
        assert_eq!(d.len(), 2);
        assert!(
            d.iter().all(|d| d.message.contains("takes precedence")),
            "{d:?}"
        );
    }
}
