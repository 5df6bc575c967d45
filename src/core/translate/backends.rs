//! Services and EndpointSlices become backend targets.
//!
//! What a target may be is decided by [`super::exposure`]: an ExternalName Service only when
//! the operator allows them, and never a name of this host; an endpoint never one of the
//! controller's own listeners, and in cluster mode never a loopback, link-local or metadata
//! address nor the controller's pod.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::ServiceBackendPort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::Translator;
use super::exposure::{EndpointRule, Exposure, ResolvedNames};
use crate::diagnostics::Severity;
use crate::model::Address;
use crate::objects::{Key, Kind, ObjectRef, Service, ServicePort};
use crate::store::Store;
use crate::translate::slots::Endpoint;

/// A Service port an Ingress routes to, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPort {
    /// The Service port number (names the backend).
    pub number: u16,
    /// The Service port name, matched against EndpointSlice port names.
    pub name: String,
    /// For ExternalName services: where to connect.
    pub external: Option<External>,
    /// Which endpoint addresses may become servers.
    pub endpoints: EndpointRule,
}

/// Where an ExternalName Service's backend connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct External {
    /// `spec.externalName`.
    pub name: String,
    pub port: u16,
    /// The name's addresses, when the run was given the resolver's answers (`run`): then
    /// these are the servers and HAProxy never resolves the name. `None` (`render`, `check`):
    /// the name is the server, as HAProxy resolves it.
    pub addresses: Option<Arc<[IpAddr]>>,
}

/// Finds the Service port `port` refers to (by name or by number). For an ExternalName
/// Service, the server is its name, or the addresses `names` (the resolver's answers, when
/// the run has them) gives it; whether it may be routed to at all is [`external_refusal`]'s
/// question.
pub fn resolve_port(
    service: &Service,
    port: &ServiceBackendPort,
    exposure: &Exposure,
    names: Option<&ResolvedNames>,
) -> Result<ResolvedPort, String> {
    let ports = service.ports.as_slice();
    let wanted = match (&port.name, port.number) {
        (Some(name), _) if !name.is_empty() => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str())),
        (_, Some(number)) => ports.iter().find(|p| p.port == number),
        _ => return Err("the backend names no port".to_string()),
    };
    let external = (service.type_.as_deref() == Some("ExternalName"))
        .then(|| service.external_name.clone())
        .flatten();
    if let Some(dns_name) = external {
        let dns_name = crate::values::parse_host(&dns_name)
            .ok()
            .filter(|h| !h.starts_with('*'))
            .ok_or_else(|| {
                format!(
                    "spec.externalName {} is not a DNS name",
                    super::exposure::brief(&dns_name)
                )
            })?;
        // An ExternalName Service need not list ports: the Ingress' port number is used as is.
        let (number, target) = match wanted {
            Some(p) => (p.port, target_number(p).unwrap_or(p.port)),
            None => {
                let n = port
                    .number
                    .ok_or_else(|| "an ExternalName Service needs a port number".to_string())?;
                (n, n)
            }
        };
        // A name that did not resolve has no address: its backend answers 503 until it does.
        let addresses = names.map(|names| match names.0.get(&dns_name) {
            Some(Ok(addresses)) => Arc::from(addresses.as_slice()),
            _ => Arc::from([]),
        });
        return Ok(ResolvedPort {
            number: to_port(number)?,
            name: String::new(),
            external: Some(External {
                name: dns_name,
                port: to_port(target)?,
                addresses,
            }),
            endpoints: EndpointRule::default(),
        });
    }
    let p = wanted.ok_or_else(|| match (&port.name, port.number) {
        (Some(name), _) if !name.is_empty() => format!("the Service has no port named {name:?}"),
        (_, n) => format!("the Service has no port {}", n.unwrap_or_default()),
    })?;
    Ok(ResolvedPort {
        number: to_port(p.port)?,
        name: p.name.clone().unwrap_or_default(),
        external: None,
        endpoints: exposure.endpoints.clone(),
    })
}

/// Why an ExternalName Service may not be routed to, with the field at fault, or `None`
/// when it may: ExternalName Services are off unless `exposure` allows them; a name of this
/// host or the cloud is refused on sight; and one any of whose addresses (in `names`, the
/// resolver's answers) is local, since whoever controls a name's answers chooses them all.
pub fn external_refusal(
    service: &Service,
    exposure: &Exposure,
    names: Option<&ResolvedNames>,
) -> Option<(&'static str, String)> {
    if service.type_.as_deref() != Some("ExternalName") {
        return None;
    }
    if !exposure.allow_external_name_services {
        return Some((
            "spec.type",
            "ExternalName Services are not routed to unless the operator sets --allow-external-name-services"
                .to_string(),
        ));
    }
    let name = service.external_name.as_deref()?;
    let refused = |why: String| {
        Some((
            "spec.externalName",
            format!("{} is refused: {why}", super::exposure::brief(name)),
        ))
    };
    if let Some(why) = super::exposure::external_name_refusal(name) {
        return refused(why);
    }
    if let Some(Ok(addresses)) = names.and_then(|n| n.0.get(name)) {
        if let Some(why) = addresses
            .iter()
            .find_map(|a| super::exposure::address_refusal(*a))
        {
            return refused(why);
        }
    }
    None
}

/// The servers of an ExternalName backend: its addresses when resolved at the edge (sorted,
/// as endpoints are), else its name (which HAProxy resolves).
pub fn external_endpoints(external: &External) -> Vec<Endpoint> {
    match &external.addresses {
        Some(addresses) => {
            let mut chosen: Vec<Endpoint> = addresses
                .iter()
                .map(|a| (Address::Ip(*a), external.port))
                .collect();
            chosen.sort();
            chosen.dedup();
            chosen
        }
        None => vec![(Address::Name(external.name.as_str().into()), external.port)],
    }
}

fn target_number(p: &ServicePort) -> Option<i32> {
    match &p.target_port {
        Some(IntOrString::Int(n)) => Some(*n),
        _ => None,
    }
}

fn to_port(n: i32) -> Result<u16, String> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{n} is not a port number"))
}

/// The endpoints traffic should go to: ready endpoints; when none is ready, the serving ones
/// that are terminating (so a rollout's last pods still answer). Sorted, without duplicates.
/// Target ports come from the EndpointSlice port with the Service port's name, which is how
/// a named `targetPort` is resolved. An endpoint without an IP address is skipped, and so is
/// one the port's [`EndpointRule`] refuses (reported by [`Translator::refused_endpoints`]).
pub fn endpoints(store: &Store, service: &Key, port: &ResolvedPort) -> Vec<Endpoint> {
    let mut ready = Vec::new();
    let mut terminating = Vec::new();
    for slice in store.endpoint_slices_of(service) {
        if !slice.address_type.is_ip() {
            continue;
        }
        let Some(number) = slice
            .ports
            .iter()
            .find(|p| p.name.as_deref().unwrap_or("") == port.name)
            .and_then(|p| p.port)
            .and_then(|n| to_port(n).ok())
        else {
            continue;
        };
        let check = port.endpoints.is_active();
        for endpoint in &slice.endpoints {
            let Some(ip) = endpoint.address else {
                continue;
            };
            if check && port.endpoints.refusal(ip, number).is_some() {
                continue;
            }
            let address = Address::Ip(ip);
            let is_ready = endpoint.ready.unwrap_or(true);
            let is_serving = endpoint.serving.unwrap_or(is_ready);
            let is_terminating = endpoint.terminating.unwrap_or(false);
            if is_ready && !is_terminating {
                ready.push((address, number));
            } else if is_serving && is_terminating {
                terminating.push((address, number));
            }
        }
    }
    let mut chosen = if ready.is_empty() { terminating } else { ready };
    chosen.sort();
    chosen.dedup();
    chosen
}

/// Whether an endpoint-only run for `services` must be a whole run, to report refused
/// endpoints: one of their slices has an endpoint `rule` refuses, or the last run reported
/// one (which may be gone now).
pub fn reports_endpoints(
    rule: &EndpointRule,
    store: &Store,
    services: &std::collections::BTreeSet<Key>,
    previous: &[crate::diagnostics::Diagnostic],
) -> bool {
    if !rule.is_active() {
        return false;
    }
    let reported = previous.iter().any(|d| {
        matches!(&d.subject, crate::diagnostics::Subject::Object(o) if o.kind == Kind::EndpointSlice)
    });
    reported
        || services.iter().any(|service| {
            store.endpoint_slices_of(service).any(|slice| {
                slice.address_type.is_ip()
                    && slice.endpoints.iter().filter_map(|e| e.address).any(|ip| {
                        slice
                            .ports
                            .iter()
                            .filter_map(|p| p.port.and_then(|n| to_port(n).ok()))
                            .any(|p| rule.refusal(ip, p).is_some())
                    })
            })
        })
}

impl Translator<'_> {
    /// [`resolve_port`] with this run's flags and resolver answers. An ExternalName Service
    /// that [`external_refusal`] refuses is an error on the Service, naming the field, and a
    /// backend without servers: its paths answer 503 rather than fall through to another
    /// route's backend.
    pub(super) fn resolve_port(
        &mut self,
        service: &Service,
        port: &ServiceBackendPort,
    ) -> Result<ResolvedPort, String> {
        let names = self.inputs.external_names.as_deref();
        let exposure = &self.config.exposure;
        let resolved = resolve_port(service, port, exposure, names);
        let Some((field, why)) = external_refusal(service, exposure, names) else {
            return resolved;
        };
        let mut resolved = resolved.map_err(|_| format!("{field}: {why}"))?;
        let key = Key::new(
            service.metadata.namespace.clone().unwrap_or_default(),
            service.metadata.name.clone().unwrap_or_default(),
        );
        self.diags.object(
            Severity::Error,
            &ObjectRef::new(Kind::Service, &key),
            field,
            format!("{why}; its paths answer 503"),
        );
        // No server, whatever the Service's endpoints or the name's answers.
        let name = resolved.external.take().map(|e| e.name).unwrap_or_default();
        resolved.external = Some(External {
            name,
            port: resolved.number,
            addresses: Some(Arc::from([])),
        });
        Ok(resolved)
    }

    /// An error on each EndpointSlice endpoint the run's [`EndpointRule`] refuses, naming
    /// the field; [`endpoints`] leaves them out of every backend.
    pub(super) fn refused_endpoints(&mut self) {
        let rule = &self.config.exposure.endpoints;
        if !rule.is_active() {
            return;
        }
        for (key, slice) in self.store.endpoint_slices() {
            if !slice.address_type.is_ip() {
                continue;
            }
            let ports: Vec<u16> = slice
                .ports
                .iter()
                .filter_map(|p| p.port.and_then(|n| to_port(n).ok()))
                .collect();
            for (i, endpoint) in slice.endpoints.iter().enumerate() {
                let Some(ip) = endpoint.address else {
                    continue;
                };
                if let Some(why) = ports.iter().find_map(|p| rule.refusal(ip, *p)) {
                    self.diags.object(
                        Severity::Error,
                        &ObjectRef::new(Kind::EndpointSlice, key),
                        format!("endpoints[{i}].addresses[0]"),
                        format!("{why}; endpoint skipped"),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Object;

    /// The endpoints of Service `ns/web` on port `http` when its one slice (IPv4 or IPv6 by
    /// `address_type`) lists `addresses`, one endpoint each, all ready.
    fn chosen(address_type: &str, addresses: &[&str]) -> Vec<(String, u16)> {
        let listed: Vec<_> = addresses
            .iter()
            .map(|a| serde_json::json!({"addresses": [a]}))
            .collect();
        let slice = Object::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "ns",
                         "labels": {crate::objects::SERVICE_NAME_LABEL: "web"}},
            "addressType": address_type,
            "endpoints": listed,
            "ports": [{"name": "http", "port": 8080}]
        }))
        .unwrap();
        let port = ResolvedPort {
            number: 80,
            name: "http".into(),
            external: None,
            endpoints: EndpointRule::default(),
        };
        written(endpoints(
            &Store::from_objects([slice]),
            &Key::new("ns", "web"),
            &port,
        ))
    }

    /// Endpoints as HAProxy is given them.
    fn written(endpoints: Vec<Endpoint>) -> Vec<(String, u16)> {
        endpoints
            .into_iter()
            .map(|(a, p)| (a.to_string(), p))
            .collect()
    }

    #[test]
    fn endpoint_addresses_are_canonical_and_others_are_skipped() {
        for (written, expected) in [
            ("10.0.0.1", Some("10.0.0.1")),
            ("0.0.0.0", Some("0.0.0.0")),
            ("255.255.255.255", Some("255.255.255.255")),
            ("2001:DB8:0:0:0:0:0:1", Some("2001:db8::1")),
            ("::ffff:10.0.0.1", Some("::ffff:10.0.0.1")),
            // Not in canonical form, which the API requires: skipped, not rewritten.
            ("010.0.0.1", None),
            ("10.0.0.1 ", None),
            ("10.1", None),
            ("0x0a.0.0.1", None),
            ("pod.example", None),
        ] {
            let expected: Vec<(String, u16)> = expected
                .map(|a| (a.to_string(), 8080))
                .into_iter()
                .collect();
            assert_eq!(chosen("IPv4", &[written]), expected, "{written}");
        }
    }

    fn external(name: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ext", "namespace": "evil"},
            "spec": {"type": "ExternalName", "externalName": name,
                     "ports": [{"name": "http", "port": 80, "targetPort": 6060}]}
        }))
        .unwrap()
    }

    fn by_number(n: i32) -> ServiceBackendPort {
        ServiceBackendPort {
            name: None,
            number: Some(n),
        }
    }

    #[test]
    fn external_name_services_are_off_unless_allowed() {
        let off = Exposure::default();
        let (field, why) = external_refusal(&external("db.example.com"), &off, None).unwrap();
        assert_eq!(field, "spec.type");
        assert!(why.contains("--allow-external-name-services"), "{why}");
        let on = Exposure {
            allow_external_name_services: true,
            ..Exposure::default()
        };
        assert_eq!(
            external_refusal(&external("db.example.com"), &on, None),
            None
        );
        let ok = resolve_port(&external("db.example.com"), &by_number(80), &on, None).unwrap();
        assert_eq!(
            ok.external,
            Some(External {
                name: "db.example.com".to_string(),
                port: 6060,
                addresses: None
            })
        );
        for name in [
            "localhost",
            "x.localhost",
            "0x7f000001",
            "::1",
            "metadata.google.internal",
        ] {
            let (field, _) = external_refusal(&external(name), &on, None).unwrap();
            assert_eq!(field, "spec.externalName", "{name}");
        }
        // Not a DNS name at all: no route.
        for name in ["127.0.0.1", "127.1", "192.0.2.10"] {
            let err = resolve_port(&external(name), &by_number(80), &on, None).unwrap_err();
            assert!(err.starts_with("spec.externalName"), "{name}: {err}");
        }
        // A Service of another type is not concerned.
        let plain: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        }))
        .unwrap();
        assert_eq!(external_refusal(&plain, &off, None), None);
        assert!(resolve_port(&plain, &by_number(80), &off, None).is_ok());
    }

    #[test]
    fn resolved_external_names_are_their_addresses_unless_one_is_local() {
        let on = Exposure {
            allow_external_name_services: true,
            ..Exposure::default()
        };
        let names = ResolvedNames(
            [
                (
                    "db.example.com",
                    Ok(vec![
                        "192.0.2.8".parse().unwrap(),
                        "192.0.2.7".parse().unwrap(),
                    ]),
                ),
                (
                    "rebind.example.com",
                    Ok(vec![
                        "192.0.2.1".parse().unwrap(),
                        "127.0.0.1".parse().unwrap(),
                    ]),
                ),
                (
                    "meta.example.com",
                    Ok(vec!["169.254.169.254".parse().unwrap()]),
                ),
                ("gone.example.com", Err("no such name".to_string())),
            ]
            .into_iter()
            .map(|(n, a)| (n.to_string(), a))
            .collect(),
        );
        let resolve = |name: &str| {
            resolve_port(&external(name), &by_number(80), &on, Some(&names))
                .unwrap()
                .external
                .unwrap()
        };
        assert_eq!(
            external_endpoints(&resolve("db.example.com")),
            [
                (Address::Ip("192.0.2.7".parse().unwrap()), 6060),
                (Address::Ip("192.0.2.8".parse().unwrap()), 6060)
            ]
        );
        assert_eq!(
            written(external_endpoints(&resolve("db.example.com"))),
            [
                ("192.0.2.7".to_string(), 6060),
                ("192.0.2.8".to_string(), 6060)
            ]
        );
        assert_eq!(
            external_refusal(&external("db.example.com"), &on, Some(&names)),
            None
        );
        for refused in ["rebind.example.com", "meta.example.com"] {
            let (field, why) = external_refusal(&external(refused), &on, Some(&names)).unwrap();
            assert_eq!(field, "spec.externalName");
            assert!(why.contains("resolves to"), "{why}");
        }
        // Not resolved (yet): no server, so the path answers 503 rather than go elsewhere.
        assert!(external_endpoints(&resolve("gone.example.com")).is_empty());
        assert!(external_endpoints(&resolve("unknown.example.com")).is_empty());
        // Without answers (render, check) the name is the server.
        let named = resolve_port(&external("db.example.com"), &by_number(80), &on, None).unwrap();
        assert_eq!(
            external_endpoints(&named.external.unwrap()),
            [(Address::Name("db.example.com".into()), 6060)]
        );
    }

    #[test]
    fn refused_endpoints_are_left_out() {
        let slice = Object::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "ns",
                         "labels": {crate::objects::SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"]}, {"addresses": ["169.254.169.254"]},
                          {"addresses": ["10.0.0.9"]}, {"addresses": ["10.0.0.1"]}],
            "ports": [{"name": "http", "port": 6060}]
        }))
        .unwrap();
        let store = Store::from_objects([slice]);
        let web = Key::new("ns", "web");
        let with = |endpoints: EndpointRule| {
            let port = ResolvedPort {
                number: 80,
                name: "http".into(),
                external: None,
                endpoints,
            };
            endpoints_of(&store, &web, &port)
        };
        assert_eq!(with(EndpointRule::default()).len(), 4);
        let admin = EndpointRule {
            own_listeners: std::sync::Arc::from(["127.0.0.1:6060"
                .parse::<std::net::SocketAddr>()
                .unwrap()]),
            ..EndpointRule::default()
        };
        assert_eq!(with(admin), ["10.0.0.1", "10.0.0.9", "169.254.169.254"]);
        let cluster = Exposure::default()
            .with_listeners([])
            .in_cluster(Some("10.0.0.9".parse().unwrap()))
            .endpoints;
        assert_eq!(with(cluster), ["10.0.0.1"]);
    }

    fn endpoints_of(store: &Store, service: &Key, port: &ResolvedPort) -> Vec<String> {
        endpoints(store, service, port)
            .into_iter()
            .map(|(a, _)| a.to_string())
            .collect()
    }

    #[test]
    fn only_ip_slices_give_endpoints_sorted_without_duplicates() {
        assert_eq!(
            chosen("IPv4", &["10.0.0.2", "10.0.0.1", "10.0.0.2"]),
            vec![
                ("10.0.0.1".to_string(), 8080),
                ("10.0.0.2".to_string(), 8080)
            ]
        );
        assert!(chosen("FQDN", &["10.0.0.1"]).is_empty());
    }
}
