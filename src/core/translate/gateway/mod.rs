//! Gateway API: which GatewayClasses and Gateways are ours, which listeners are served, which
//! HTTPRoutes attach to them and with which hosts, and whether their references resolve.
//!
//! [`attach`] is a pure function of the store and the flags. Translation
//! ([`http`]) turns what it finds into routes, backends and certificates of the same model as
//! Ingresses; the cluster source writes it as the objects' status ([`Attachments`] holds every
//! condition the spec defines, with its reason).
//!
//! `HTTP` and `HTTPS` listeners on port 80 or the HTTP bind port, 443 or the HTTPS bind port,
//! are served by the shared HAProxy frontends; `TLS` passthrough listeners on the HTTPS port
//! by its passthrough frontend; every other listener by a bind of its own ([`listeners`]
//! decides which ports). TLSRoutes and TCPRoutes are translated in [`l4`]. Other protocols
//! are refused on the listener (`Accepted: False`, `UnsupportedProtocol`).

pub mod http;
pub mod l4;
pub mod listeners;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::Serialize;

use crate::objects::gateway::{
    GATEWAY_GROUP, Gateway, GatewayApi, HttpRoute, L4Route, Listener, ObjectReference,
    ReferenceGrant,
};
use crate::objects::{Key, Kind};
use crate::store::Store;
use crate::values;

/// Most a backend ref's weight may be (the spec's bound).
const MAX_WEIGHT: i64 = 1_000_000;

/// The weight a backend ref at `at` is served with: `None` for 0 (never chosen) and for a
/// weight outside the spec's bounds, which is reported on `<at>.weight`.
fn served_weight(
    diags: &mut crate::diagnostics::Diagnostics,
    object: &crate::objects::ObjectRef,
    at: &str,
    weight: Option<i64>,
) -> Option<i64> {
    let weight = weight.unwrap_or(1);
    if !(0..=MAX_WEIGHT).contains(&weight) {
        diags.object(
            crate::diagnostics::Severity::Error,
            object,
            format!("{at}.weight"),
            format!("{weight} is not between 0 and {MAX_WEIGHT}; backend skipped"),
        );
        return None;
    }
    (weight > 0).then_some(weight)
}
pub use listeners::{ListenerPorts, PortRanges};

/// `--gateway-controller-name`'s default.
pub const DEFAULT_CONTROLLER_NAME: &str = "portcullis.io/gateway-controller";

/// One status condition as the Gateway API defines it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Condition {
    fn yes(kind: &'static str, reason: &'static str) -> Self {
        Condition {
            kind,
            status: true,
            reason,
            message: String::new(),
        }
    }

    fn no(kind: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Condition {
            kind,
            status: false,
            reason,
            message: message.into(),
        }
    }
}

/// The frontend a listener is served by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Frontend {
    Http,
    Https,
    /// TLS passthrough, routed by server name: on the HTTPS port by the passthrough frontend,
    /// elsewhere by a frontend of its port.
    Tls,
    /// Plain TCP, by a frontend of its port.
    Tcp,
}

impl Frontend {
    /// The route kind listeners of this protocol serve.
    pub fn route_kind(self) -> Kind {
        match self {
            Frontend::Http | Frontend::Https => Kind::HttpRoute,
            Frontend::Tls => Kind::TlsRoute,
            Frontend::Tcp => Kind::TcpRoute,
        }
    }
}

/// A GatewayClass whose `controllerName` is ours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassState {
    pub key: Key,
    pub generation: Option<i64>,
    pub accepted: Condition,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListenerState {
    pub name: String,
    /// Validated; `*.` for a wildcard; none: every host.
    pub hostname: Option<String>,
    /// None: not served (see the conditions).
    pub frontend: Option<Frontend>,
    /// The port of the bind of its own the listener is served on; none: a shared frontend.
    pub port: Option<u16>,
    /// The TLS Secrets of an HTTPS listener that resolve.
    pub certificates: Vec<Key>,
    pub attached_routes: u32,
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GatewayState {
    pub key: Key,
    pub generation: Option<i64>,
    pub listeners: Vec<ListenerState>,
    pub conditions: Vec<Condition>,
}

/// One `parentRefs` entry of a route that names a Gateway of ours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParentState {
    /// Index in `spec.parentRefs`.
    pub index: usize,
    pub gateway: Key,
    pub section_name: Option<String>,
    pub port: Option<i64>,
    /// The listeners the route attached to: (index into [`Attachments::gateways`], listener
    /// index, the hosts it serves there, validated; empty string: every host).
    pub listeners: Vec<(usize, usize, Vec<String>)>,
    pub conditions: Vec<Condition>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteState {
    pub key: Key,
    pub generation: Option<i64>,
    pub parents: Vec<ParentState>,
}

/// Everything [`attach`] found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Attachments {
    pub classes: Vec<ClassState>,
    pub gateways: Vec<GatewayState>,
    /// HTTPRoutes, oldest first.
    pub routes: Vec<RouteState>,
    /// TLSRoutes, oldest first.
    pub tls_routes: Vec<RouteState>,
    /// TCPRoutes, oldest first.
    pub tcp_routes: Vec<RouteState>,
}

fn typed<'a, T: 'a>(
    store: &'a Store,
    kind: Kind,
    pick: impl Fn(&'a GatewayApi) -> Option<&'a T>,
) -> impl Iterator<Item = (&'a Key, &'a T)> {
    store
        .gateway_api(kind)
        .iter()
        .filter_map(move |(k, o)| pick(o).map(|t| (k, t)))
}

/// The HTTPRoutes of the store.
pub fn http_routes(store: &Store) -> impl Iterator<Item = (&Key, &HttpRoute)> {
    typed(store, Kind::HttpRoute, |o| match o {
        GatewayApi::HttpRoute(r) => Some(r),
        _ => None,
    })
}

/// The TLSRoutes or TCPRoutes (`kind`) of the store.
pub fn l4_routes(store: &Store, kind: Kind) -> impl Iterator<Item = (&Key, &L4Route)> {
    typed(store, kind, |o| match o {
        GatewayApi::TlsRoute(r) | GatewayApi::TcpRoute(r) => Some(r),
        _ => None,
    })
}

fn gateways(store: &Store) -> impl Iterator<Item = (&Key, &Gateway)> {
    typed(store, Kind::Gateway, |o| match o {
        GatewayApi::Gateway(g) => Some(g),
        _ => None,
    })
}

fn grants(store: &Store) -> impl Iterator<Item = (&Key, &ReferenceGrant)> {
    typed(store, Kind::ReferenceGrant, |o| match o {
        GatewayApi::ReferenceGrant(g) => Some(g),
        _ => None,
    })
}

/// Whether a ReferenceGrant in `to_namespace` lets a `from_kind` of `from_namespace` refer
/// to the core object `to_kind`/`to_name` there.
pub fn granted(
    store: &Store,
    from_kind: &str,
    from_namespace: &str,
    to_kind: &str,
    to_namespace: &str,
    to_name: &str,
) -> bool {
    from_namespace == to_namespace
        || grants(store).any(|(k, g)| {
            k.namespace == to_namespace && g.permits(from_kind, from_namespace, to_kind, to_name)
        })
}

/// Older first (`creationTimestamp`; none counts as oldest), then by namespace/name: the
/// spec's order of precedence between routes.
pub fn age_order(a: (&Key, &ObjectMeta), b: (&Key, &ObjectMeta)) -> std::cmp::Ordering {
    let t = |m: &ObjectMeta| m.creation_timestamp.as_ref().map(|t| t.0);
    t(a.1).cmp(&t(b.1)).then_with(|| a.0.cmp(b.0))
}

/// Whether `labels` match a Kubernetes label selector (an empty selector matches all).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expression = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_label && by_expression
}

/// The host a route hostname and a listener hostname both match, as the spec intersects them
/// (a wildcard label matches one or more labels); none when they are disjoint.
pub fn intersect(route: &str, listener: &str) -> Option<String> {
    let covers = |wild: &str, host: &str| -> bool {
        wild.strip_prefix('*')
            .is_some_and(|suffix| host.ends_with(suffix) && host.len() > suffix.len())
    };
    if route == listener || (listener.starts_with("*.") && covers(listener, route)) {
        Some(route.to_string())
    } else if route.starts_with("*.") && covers(route, listener) {
        Some(listener.to_string())
    } else {
        None
    }
}

/// Finds our GatewayClasses and Gateways, their listeners and the routes attached to them.
pub fn attach(store: &Store, controller_name: &str, ports: &ListenerPorts) -> Attachments {
    let mut out = Attachments::default();
    for (key, object) in store.gateway_api(Kind::GatewayClass) {
        let GatewayApi::GatewayClass(class) = &**object else {
            continue;
        };
        if class.spec.controller_name == controller_name {
            out.classes.push(ClassState {
                key: key.clone(),
                generation: class.metadata.generation,
                accepted: Condition::yes("Accepted", "Accepted"),
            });
        }
    }
    let ours = |name: &str| out.classes.iter().any(|c| c.key.name == name);
    let mut ordered: Vec<(&Key, &Gateway)> = gateways(store)
        .filter(|(_, g)| ours(&g.spec.gateway_class_name))
        .collect();
    ordered.sort_by(|a, b| age_order((a.0, &a.1.metadata), (b.0, &b.1.metadata)));
    for (key, gateway) in &ordered {
        out.gateways.push(gateway_state(store, key, gateway, ports));
    }
    shared_ports(&mut out.gateways);
    for g in &mut out.gateways {
        g.conditions = gateway_conditions(&g.listeners);
    }
    let mut routes: Vec<(&Key, &HttpRoute)> = http_routes(store).collect();
    routes.sort_by(|a, b| age_order((a.0, &a.1.metadata), (b.0, &b.1.metadata)));
    for (key, route) in routes {
        let view = RouteView {
            key,
            kind: Kind::HttpRoute,
            parent_refs: &route.spec.parent_refs,
            hostnames: &route.spec.hostnames,
            resolved: resolved_refs(store, key, route),
        };
        let parents = route_parents(store, &view, &ordered, &mut out.gateways);
        if !parents.is_empty() {
            out.routes.push(RouteState {
                key: key.clone(),
                generation: route.metadata.generation,
                parents,
            });
        }
    }
    for kind in [Kind::TlsRoute, Kind::TcpRoute] {
        let mut routes: Vec<(&Key, &L4Route)> = l4_routes(store, kind).collect();
        routes.sort_by(|a, b| age_order((a.0, &a.1.metadata), (b.0, &b.1.metadata)));
        for (key, route) in routes {
            let view = RouteView {
                key,
                kind,
                parent_refs: &route.spec.parent_refs,
                // A TCPRoute has none; one read from a newer version would not apply.
                hostnames: if kind == Kind::TlsRoute {
                    &route.spec.hostnames
                } else {
                    &[]
                },
                resolved: l4::resolved_refs(store, kind, key, route),
            };
            let parents = route_parents(store, &view, &ordered, &mut out.gateways);
            if !parents.is_empty() {
                let state = RouteState {
                    key: key.clone(),
                    generation: route.metadata.generation,
                    parents,
                };
                match kind {
                    Kind::TlsRoute => out.tls_routes.push(state),
                    _ => out.tcp_routes.push(state),
                }
            }
        }
    }
    out
}

/// Listeners of their own port, oldest Gateway first: a port goes to the first listener
/// that claims it; later ones of the same protocol share it, those of another are refused
/// (`Conflicted: True`, `ProtocolConflict` within one Gateway; `PortUnavailable` across).
fn shared_ports(gateways: &mut [GatewayState]) {
    let mut owners: BTreeMap<u16, (Frontend, Key, String)> = BTreeMap::new();
    for g in gateways.iter_mut() {
        for l in &mut g.listeners {
            let (Some(frontend), Some(port)) = (l.frontend, l.port) else {
                continue;
            };
            match owners.get(&port) {
                None => {
                    owners.insert(port, (frontend, g.key.clone(), l.name.clone()));
                }
                Some((f, _, _)) if *f == frontend => {}
                Some((f, owner, name)) => {
                    let message = format!(
                        "port {port} is already served for {f:?} by listener {name} of Gateway {owner}"
                    );
                    l.frontend = None;
                    l.port = None;
                    l.conditions = vec![
                        Condition::no("Accepted", "PortUnavailable", message.clone()),
                        Condition::no("Programmed", "Invalid", message.clone()),
                        Condition::yes("ResolvedRefs", "ResolvedRefs"),
                    ];
                    if *owner == g.key {
                        l.conditions.push(Condition {
                            kind: "Conflicted",
                            status: true,
                            reason: "ProtocolConflict",
                            message,
                        });
                    }
                }
            }
        }
    }
}

fn gateway_conditions(listeners: &[ListenerState]) -> Vec<Condition> {
    let served = listeners.iter().filter(|l| l.frontend.is_some()).count();
    if listeners.is_empty() || served > 0 {
        vec![
            Condition::yes("Accepted", "Accepted"),
            Condition::yes("Programmed", "Programmed"),
        ]
    } else {
        vec![
            Condition::no("Accepted", "ListenersNotValid", "no listener can be served"),
            Condition::no("Programmed", "Invalid", "no listener can be served"),
        ]
    }
}

fn gateway_state(
    store: &Store,
    key: &Key,
    gateway: &Gateway,
    ports: &ListenerPorts,
) -> GatewayState {
    let mut listeners = Vec::new();
    for listener in &gateway.spec.listeners {
        listeners.push(listener_state(store, key, listener, ports));
    }
    let conditions = gateway_conditions(&listeners);
    GatewayState {
        key: key.clone(),
        generation: gateway.metadata.generation,
        listeners,
        conditions,
    }
}

fn listener_state(
    store: &Store,
    gateway: &Key,
    listener: &Listener,
    ports: &ListenerPorts,
) -> ListenerState {
    let mut state = ListenerState {
        name: listener.name.clone(),
        hostname: None,
        frontend: None,
        port: None,
        certificates: Vec::new(),
        attached_routes: 0,
        conditions: Vec::new(),
    };
    let refuse = |state: &mut ListenerState, reason: &'static str, message: String| {
        state.conditions = vec![
            Condition::no("Accepted", reason, message.clone()),
            Condition::no("Programmed", "Invalid", message),
            Condition::yes("ResolvedRefs", "ResolvedRefs"),
        ];
    };
    let frontend = match listener.protocol.as_str() {
        "HTTP" => Frontend::Http,
        "HTTPS" => Frontend::Https,
        "TLS" => Frontend::Tls,
        "TCP" => Frontend::Tcp,
        other => {
            refuse(
                &mut state,
                "UnsupportedProtocol",
                format!("protocol {other:?} is not served (HTTP, HTTPS, TLS and TCP are)"),
            );
            return state;
        }
    };
    // HTTP and HTTPS listeners on their protocol's shared port are served by the shared
    // frontend; on another port, like TLS and TCP listeners, by a bind of their own.
    let shared = match frontend {
        Frontend::Http => ports.is_http(listener.port),
        Frontend::Https => ports.is_https(listener.port),
        Frontend::Tls | Frontend::Tcp => false,
    };
    let tls_mode = listener.tls.as_ref().and_then(|t| t.mode.as_deref());
    if frontend == Frontend::Tls && tls_mode != Some("Passthrough") {
        refuse(
            &mut state,
            "UnsupportedValue",
            format!(
                "tls.mode {:?} is not served on a TLS listener (Passthrough is)",
                tls_mode.unwrap_or("Terminate")
            ),
        );
        return state;
    }
    // A TLS listener on the HTTPS port shares its bind; other ports are binds of their own.
    let own_port = if shared || (frontend == Frontend::Tls && ports.is_https(listener.port)) {
        None
    } else {
        match ports.unavailable(store, listener.port) {
            Some(why) => {
                refuse(&mut state, "PortUnavailable", why);
                return state;
            }
            None => u16::try_from(listener.port).ok(),
        }
    };
    if frontend == Frontend::Tcp {
        // A TCP listener's hostname does not apply: TCP carries no name.
    } else if let Some(h) = listener.hostname.as_deref().filter(|h| !h.is_empty()) {
        match values::parse_host(h) {
            Ok(h) => state.hostname = Some(h),
            Err(e) => {
                refuse(&mut state, "UnsupportedValue", format!("hostname: {e}"));
                return state;
            }
        }
    }
    let mut resolved = Condition::yes("ResolvedRefs", "ResolvedRefs");
    if let Some(kinds) = listener.allowed_routes.as_ref().map(|a| &a.kinds) {
        let served = frontend.route_kind();
        let bad: Vec<&str> = kinds
            .iter()
            .filter(|k| !is_route_kind(k, served))
            .map(|k| k.kind.as_str())
            .collect();
        if !bad.is_empty() {
            resolved = Condition::no(
                "ResolvedRefs",
                "InvalidRouteKinds",
                format!(
                    "route kinds {bad:?} are not served on a {} listener ({} is)",
                    listener.protocol,
                    served.as_str()
                ),
            );
        }
    }
    if frontend == Frontend::Https {
        let tls = listener.tls.as_ref();
        if tls.and_then(|t| t.mode.as_deref()) == Some("Passthrough") {
            refuse(
                &mut state,
                "UnsupportedProtocol",
                "tls.mode Passthrough is not served on an HTTPS listener".to_string(),
            );
            return state;
        }
        let refs = tls
            .map(|t| t.certificate_refs.as_slice())
            .unwrap_or_default();
        for (i, r) in refs.iter().enumerate() {
            match certificate_ref(store, gateway, r) {
                Ok(secret) => state.certificates.push(secret),
                Err((reason, message)) => {
                    resolved = Condition::no(
                        "ResolvedRefs",
                        reason,
                        format!("tls.certificateRefs[{i}]: {message}"),
                    );
                }
            }
        }
        if refs.is_empty() {
            resolved = Condition::no(
                "ResolvedRefs",
                "InvalidCertificateRef",
                "an HTTPS listener needs tls.certificateRefs",
            );
        }
    }
    let programmed = if frontend == Frontend::Https && state.certificates.is_empty() {
        Condition::no("Programmed", "Invalid", "no usable certificate")
    } else {
        Condition::yes("Programmed", "Programmed")
    };
    state.conditions = vec![Condition::yes("Accepted", "Accepted"), programmed, resolved];
    state.frontend = Some(frontend);
    state.port = own_port;
    state
}

fn is_route_kind(k: &crate::objects::gateway::GroupKind, kind: Kind) -> bool {
    k.kind == kind.as_str() && k.group.as_deref().is_none_or(|g| g == GATEWAY_GROUP)
}

/// The Secret a certificate ref names, when it exists and may be referred to.
fn certificate_ref(
    store: &Store,
    gateway: &Key,
    r: &ObjectReference,
) -> Result<Key, (&'static str, String)> {
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Secret");
    if !group.is_empty() || kind != "Secret" {
        return Err((
            "InvalidCertificateRef",
            format!("{group}/{kind} is not a Secret"),
        ));
    }
    let namespace = r
        .namespace
        .clone()
        .unwrap_or_else(|| gateway.namespace.clone());
    let key = Key::new(namespace, r.name.clone());
    if !granted(
        store,
        "Gateway",
        &gateway.namespace,
        "Secret",
        &key.namespace,
        &key.name,
    ) {
        return Err((
            "RefNotPermitted",
            format!("Secret {key} is in another namespace and no ReferenceGrant there permits it"),
        ));
    }
    match store.secret(&key) {
        Some(_) => Ok(key),
        None => Err((
            "InvalidCertificateRef",
            format!("Secret {key} does not exist"),
        )),
    }
}

/// What attaching reads of a route of any kind.
struct RouteView<'a> {
    key: &'a Key,
    kind: Kind,
    parent_refs: &'a [ObjectReference],
    hostnames: &'a [String],
    resolved: Condition,
}

/// The parent refs of `route` that name a Gateway of ours, each with its listeners.
fn route_parents(
    store: &Store,
    route: &RouteView<'_>,
    ordered: &[(&Key, &Gateway)],
    states: &mut [GatewayState],
) -> Vec<ParentState> {
    let key = route.key;
    let mut parents = Vec::new();
    let hostnames: Vec<Result<String, String>> = route
        .hostnames
        .iter()
        .map(|h| values::parse_host(h))
        .collect();
    let resolved = route.resolved.clone();
    for (index, parent) in route.parent_refs.iter().enumerate() {
        let group = parent.group.as_deref().unwrap_or(GATEWAY_GROUP);
        let kind = parent.kind.as_deref().unwrap_or("Gateway");
        if group != GATEWAY_GROUP || kind != "Gateway" {
            continue;
        }
        let gateway_key = Key::new(
            parent
                .namespace
                .clone()
                .unwrap_or_else(|| key.namespace.clone()),
            parent.name.clone(),
        );
        let Some(g) = ordered.iter().position(|(k, _)| **k == gateway_key) else {
            continue;
        };
        let gateway = ordered[g].1;
        let mut state = ParentState {
            index,
            gateway: gateway_key.clone(),
            section_name: parent.section_name.clone(),
            port: parent.port,
            listeners: Vec::new(),
            conditions: Vec::new(),
        };
        let mut named = 0;
        let mut allowed = 0;
        for (l, listener) in gateway.spec.listeners.iter().enumerate() {
            if parent
                .section_name
                .as_deref()
                .is_some_and(|s| s != listener.name)
                || parent.port.is_some_and(|p| p != listener.port)
            {
                continue;
            }
            named += 1;
            let Some(listener_state) = states[g].listeners.get(l) else {
                continue;
            };
            if listener_state
                .frontend
                .is_none_or(|f| f.route_kind() != route.kind)
                || !route_allowed(store, &gateway_key, key, route.kind, listener)
            {
                continue;
            }
            allowed += 1;
            let hosts = route_hosts(&hostnames, listener_state.hostname.as_deref());
            if !hosts.is_empty() {
                state.listeners.push((g, l, hosts));
            }
        }
        let accepted = if named == 0 {
            Condition::no(
                "Accepted",
                "NoMatchingParent",
                "no listener of the Gateway has this sectionName and port",
            )
        } else if allowed == 0 {
            Condition::no(
                "Accepted",
                "NotAllowedByListeners",
                "the listeners do not allow routes of this kind from this namespace",
            )
        } else if state.listeners.is_empty() {
            Condition::no(
                "Accepted",
                "NoMatchingListenerHostname",
                "no hostname of the route matches a listener's hostname",
            )
        } else {
            Condition::yes("Accepted", "Accepted")
        };
        if accepted.status {
            for (g, l, _) in &state.listeners {
                if let Some(listener) = states[*g].listeners.get_mut(*l) {
                    listener.attached_routes += 1;
                }
            }
        }
        state.conditions = vec![accepted, resolved.clone()];
        parents.push(state);
    }
    parents
}

/// The hosts a route serves on a listener: the intersection of its hostnames with the
/// listener's; `""` for every host. Hostnames that do not parse are left out (reported by
/// translation).
fn route_hosts(hostnames: &[Result<String, String>], listener: Option<&str>) -> Vec<String> {
    let valid: Vec<&String> = hostnames.iter().filter_map(|h| h.as_ref().ok()).collect();
    let mut hosts: Vec<String> = match (valid.is_empty() && hostnames.is_empty(), listener) {
        (true, None) => vec![String::new()],
        (true, Some(l)) => vec![l.to_string()],
        (false, None) => valid.into_iter().cloned().collect(),
        (false, Some(l)) => valid.into_iter().filter_map(|h| intersect(h, l)).collect(),
    };
    hosts.sort();
    hosts.dedup();
    hosts
}

fn route_allowed(
    store: &Store,
    gateway: &Key,
    route: &Key,
    kind: Kind,
    listener: &Listener,
) -> bool {
    let allowed = listener.allowed_routes.as_ref();
    if let Some(kinds) = allowed.map(|a| &a.kinds).filter(|k| !k.is_empty()) {
        if !kinds.iter().any(|k| is_route_kind(k, kind)) {
            return false;
        }
    }
    let namespaces = allowed.and_then(|a| a.namespaces.as_ref());
    match namespaces.and_then(|n| n.from.as_deref()).unwrap_or("Same") {
        "All" => true,
        "Selector" => {
            let Some(selector) = namespaces.and_then(|n| n.selector.as_ref()) else {
                return false;
            };
            let ns = Key::new("", route.namespace.clone());
            store
                .gateway_api(Kind::Namespace)
                .get(&ns)
                .is_some_and(|o| {
                    selector_matches(selector, &crate::objects::gateway::labels(o.metadata()))
                })
        }
        _ => gateway.namespace == route.namespace,
    }
}

/// The route's `ResolvedRefs` condition: every backend ref names a Service port that
/// exists, in its namespace or one whose ReferenceGrant permits it.
fn resolved_refs(store: &Store, key: &Key, route: &HttpRoute) -> Condition {
    for (i, rule) in route.spec.rules.iter().enumerate() {
        for (j, r) in rule.backend_refs.iter().enumerate() {
            if let Err((reason, message)) = backend_ref(store, key, &r.reference) {
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

/// A backend ref: the Service and port it names, or why it does not resolve (the spec's
/// reason and a message).
pub fn backend_ref(
    store: &Store,
    route: &Key,
    r: &ObjectReference,
) -> Result<(Key, Arc<crate::objects::Service>, i32), (&'static str, String)> {
    backend_ref_of(store, Kind::HttpRoute, route, r)
}

/// [`backend_ref`] of a route of `kind` (the kind a ReferenceGrant must permit).
pub fn backend_ref_of(
    store: &Store,
    route_kind: Kind,
    route: &Key,
    r: &ObjectReference,
) -> Result<(Key, Arc<crate::objects::Service>, i32), (&'static str, String)> {
    let group = r.group.as_deref().unwrap_or("");
    let kind = r.kind.as_deref().unwrap_or("Service");
    if !group.is_empty() || kind != "Service" {
        return Err((
            "InvalidKind",
            format!("{group}/{kind} is not a Service (only Service backends are served)"),
        ));
    }
    let key = Key::new(
        r.namespace
            .clone()
            .unwrap_or_else(|| route.namespace.clone()),
        r.name.clone(),
    );
    if !granted(
        store,
        route_kind.as_str(),
        &route.namespace,
        "Service",
        &key.namespace,
        &key.name,
    ) {
        return Err((
            "RefNotPermitted",
            format!("Service {key} is in another namespace and no ReferenceGrant there permits it"),
        ));
    }
    let Some(service) = store.service(&key) else {
        return Err(("BackendNotFound", format!("Service {key} does not exist")));
    };
    let Some(port) = r.port.and_then(|p| i32::try_from(p).ok()) else {
        return Err((
            "UnsupportedValue",
            "a Service backend needs a port".to_string(),
        ));
    };
    if !service.ports.iter().any(|p| p.port == port) {
        return Err((
            "BackendNotFound",
            format!("Service {key} has no port {port}"),
        ));
    }
    Ok((key, service.clone(), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Object;

    fn store(docs: &[serde_json::Value]) -> Store {
        Store::from_objects(docs.iter().map(|d| Object::from_value(d.clone()).unwrap()))
    }

    fn reasons(a: &Attachments, route: &str) -> Vec<(&'static str, bool, &'static str)> {
        a.routes
            .iter()
            .find(|r| r.key.name == route)
            .map(|r| {
                r.parents[0]
                    .conditions
                    .iter()
                    .map(|c| (c.kind, c.status, c.reason))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn routes_attach_by_namespace_selector_and_report_why_not() {
        let route = |ns: &str, name: &str, host: &str, backend_ns: &str| {
            serde_json::json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}],
                    "hostnames": [host],
                    "rules": [{"backendRefs": [{"name": "svc", "namespace": backend_ns, "port": 80}]}]}
            })
        };
        let s = store(&[
            serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                "metadata": {"name": "pc"}, "spec": {"controllerName": DEFAULT_CONTROLLER_NAME}}),
            serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "gw", "namespace": "infra"},
                "spec": {"gatewayClassName": "pc", "listeners": [{"name": "http", "port": 80,
                    "protocol": "HTTP", "hostname": "*.example.com",
                    "allowedRoutes": {"namespaces": {"from": "Selector",
                        "selector": {"matchLabels": {"team": "a"}}}}}]}}),
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "a", "labels": {"team": "a"}}}),
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}}),
            serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "svc", "namespace": "a"},
                "spec": {"ports": [{"port": 80}]}}),
            route("a", "ok", "x.example.com", "a"),
            route("b", "other-team", "x.example.com", "b"),
            route("a", "wrong-host", "x.example.org", "a"),
            route("a", "missing", "y.example.com", "c"),
        ]);
        let a = attach(&s, DEFAULT_CONTROLLER_NAME, &ListenerPorts::default());
        assert_eq!(
            reasons(&a, "ok"),
            [
                ("Accepted", true, "Accepted"),
                ("ResolvedRefs", true, "ResolvedRefs")
            ]
        );
        assert_eq!(
            reasons(&a, "other-team")[0],
            ("Accepted", false, "NotAllowedByListeners")
        );
        assert_eq!(
            reasons(&a, "wrong-host")[0],
            ("Accepted", false, "NoMatchingListenerHostname")
        );
        assert_eq!(
            reasons(&a, "missing")[1],
            ("ResolvedRefs", false, "RefNotPermitted")
        );
        assert_eq!(a.gateways[0].listeners[0].attached_routes, 2);
        let ok = a.routes.iter().find(|r| r.key.name == "ok").unwrap();
        assert_eq!(
            ok.parents[0].listeners[0].2,
            vec!["x.example.com".to_string()]
        );
    }

    #[test]
    fn listener_ports_are_shared_by_protocol_and_refused_across() {
        let gateway = |name: &str, age: &str, listeners: serde_json::Value| {
            serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": name, "namespace": "infra", "creationTimestamp": age},
                "spec": {"gatewayClassName": "pc", "listeners": listeners}})
        };
        let tcp = |name: &str, port: u16| serde_json::json!({"name": name, "port": port, "protocol": "TCP"});
        let tls = |name: &str, port: u16| {
            serde_json::json!({"name": name, "port": port, "protocol": "TLS",
                "tls": {"mode": "Passthrough"}})
        };
        let s = store(&[
            serde_json::json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                "metadata": {"name": "pc"}, "spec": {"controllerName": DEFAULT_CONTROLLER_NAME}}),
            gateway(
                "a",
                "2026-01-01T00:00:00Z",
                serde_json::json!([tcp("db", 5432), tls("clash", 5432)]),
            ),
            gateway(
                "b",
                "2026-01-02T00:00:00Z",
                serde_json::json!([tcp("db", 5432), tls("tls", 443)]),
            ),
            gateway(
                "c",
                "2026-01-03T00:00:00Z",
                serde_json::json!([tls("late", 5432), tcp("closed", 7000)]),
            ),
        ]);
        let config = crate::translate::TranslateConfig {
            gateway_listener_ports: PortRanges::parse("5000-6000").unwrap(),
            ..Default::default()
        };
        let a = attach(&s, DEFAULT_CONTROLLER_NAME, &ListenerPorts::of(&config));
        let summary = |g: usize, l: usize| {
            let state = &a.gateways[g].listeners[l];
            let reasons: Vec<(&str, bool, &str)> = state
                .conditions
                .iter()
                .map(|c| (c.kind, c.status, c.reason))
                .collect();
            (state.frontend, state.port, reasons)
        };
        // The oldest Gateway's TCP listener takes 5432; the younger one's shares it.
        for g in [0, 1] {
            let (frontend, port, reasons) = summary(g, 0);
            assert_eq!((frontend, port), (Some(Frontend::Tcp), Some(5432)));
            assert_eq!(reasons[0], ("Accepted", true, "Accepted"));
        }
        // Another protocol on the port: a conflict within the Gateway, unavailable across.
        let (frontend, _, reasons) = summary(0, 1);
        assert_eq!(frontend, None);
        assert!(reasons.contains(&("Accepted", false, "PortUnavailable")));
        assert!(reasons.contains(&("Conflicted", true, "ProtocolConflict")));
        let (frontend, _, reasons) = summary(2, 0);
        assert_eq!(frontend, None);
        assert!(reasons.contains(&("Accepted", false, "PortUnavailable")));
        assert!(!reasons.iter().any(|r| r.0 == "Conflicted"));
        // TLS on the HTTPS port shares the passthrough frontend; outside the range: refused.
        assert_eq!(summary(1, 1).0, Some(Frontend::Tls));
        assert_eq!(summary(1, 1).1, None);
        assert_eq!(summary(2, 1).0, None);
        // Gateway c has no listener left: it is not accepted.
        assert_eq!(a.gateways[2].conditions[0].reason, "ListenersNotValid");
    }

    #[test]
    fn hostnames_intersect_as_the_spec_says() {
        assert_eq!(
            intersect("a.example.com", "a.example.com").as_deref(),
            Some("a.example.com")
        );
        assert_eq!(
            intersect("a.b.example.com", "*.example.com").as_deref(),
            Some("a.b.example.com")
        );
        assert_eq!(
            intersect("*.example.com", "a.example.com").as_deref(),
            Some("a.example.com")
        );
        assert_eq!(intersect("example.com", "*.example.com"), None);
        assert_eq!(intersect("a.example.org", "*.example.com"), None);
        assert_eq!(
            intersect("*.example.com", "*.example.com").as_deref(),
            Some("*.example.com")
        );
        assert_eq!(
            intersect("*.a.example.com", "*.example.com").as_deref(),
            Some("*.a.example.com")
        );
    }
}
