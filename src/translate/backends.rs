//! Services and EndpointSlices become backend targets.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::networking::v1::ServiceBackendPort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::objects::Key;
use crate::store::Store;
use crate::translate::slots::Endpoint;

/// A Service port an Ingress routes to, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedPort {
    /// The Service port number (names the backend).
    pub number: u16,
    /// The Service port name, matched against EndpointSlice port names.
    pub name: String,
    /// For ExternalName services: the DNS name and the port to connect to.
    pub external: Option<(String, u16)>,
}

/// Finds the Service port `port` refers to (by name or by number).
pub fn resolve_port(service: &Service, port: &ServiceBackendPort) -> Result<ResolvedPort, String> {
    let spec = service
        .spec
        .as_ref()
        .ok_or_else(|| "the Service has no spec".to_string())?;
    let ports: &[ServicePort] = spec.ports.as_deref().unwrap_or_default();
    let wanted = match (&port.name, port.number) {
        (Some(name), _) if !name.is_empty() => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str())),
        (_, Some(number)) => ports.iter().find(|p| p.port == number),
        _ => return Err("the backend names no port".to_string()),
    };
    let external = (spec.type_.as_deref() == Some("ExternalName"))
        .then(|| spec.external_name.clone())
        .flatten();
    if let Some(dns_name) = external {
        let dns_name = crate::values::parse_host(&dns_name)
            .ok()
            .filter(|h| !h.starts_with('*'))
            .ok_or_else(|| format!("spec.externalName {dns_name:?} is not a DNS name"))?;
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
        return Ok(ResolvedPort {
            number: to_port(number)?,
            name: String::new(),
            external: Some((dns_name, to_port(target)?)),
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
    })
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
/// a named `targetPort` is resolved.
/// `address` as HAProxy is given it: an IPv6 address in its canonical form; an IPv4 one as
/// written, which is its canonical form once it parses (no leading zeros, no other notation),
/// without formatting it again (30 000 times in a cold run at 10 000 Services). `None` when
/// it is not an IP address.
fn canonical_ip(address: &str) -> Option<String> {
    match address.parse::<IpAddr>().ok()? {
        IpAddr::V4(_) => Some(address.to_string()),
        ip @ IpAddr::V6(_) => Some(ip.to_string()),
    }
}

pub fn endpoints(store: &Store, service: &Key, port: &ResolvedPort) -> Vec<Endpoint> {
    let mut ready = Vec::new();
    let mut terminating = Vec::new();
    for slice in store.endpoint_slices_of(service) {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        let Some(number) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or("") == port.name)
            .and_then(|p| p.port)
            .and_then(|n| to_port(n).ok())
        else {
            continue;
        };
        for endpoint in &slice.endpoints {
            let Some(address) = endpoint.addresses.first().and_then(|a| canonical_ip(a)) else {
                continue;
            };
            let conditions = endpoint.conditions.as_ref();
            let is_ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let is_serving = conditions.and_then(|c| c.serving).unwrap_or(is_ready);
            let is_terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_addresses_are_canonical() {
        for (written, expected) in [
            ("10.0.0.1", Some("10.0.0.1")),
            ("0.0.0.0", Some("0.0.0.0")),
            ("255.255.255.255", Some("255.255.255.255")),
            ("2001:DB8:0:0:0:0:0:1", Some("2001:db8::1")),
            ("::ffff:10.0.0.1", Some("::ffff:10.0.0.1")),
            // Not written as Display would write them: refused by the parser, not kept as is.
            ("010.0.0.1", None),
            ("10.0.0.1 ", None),
            ("10.1", None),
            ("0x0a.0.0.1", None),
            ("pod.example", None),
        ] {
            assert_eq!(canonical_ip(written).as_deref(), expected, "{written}");
            if let Some(ip) = written.parse::<IpAddr>().ok().filter(IpAddr::is_ipv4) {
                assert_eq!(ip.to_string(), written);
            }
        }
    }
}
