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
            let Some(ip) = endpoint
                .addresses
                .first()
                .and_then(|a| a.parse::<IpAddr>().ok())
            else {
                continue;
            };
            let conditions = endpoint.conditions.as_ref();
            let is_ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let is_serving = conditions.and_then(|c| c.serving).unwrap_or(is_ready);
            let is_terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            if is_ready && !is_terminating {
                ready.push((ip.to_string(), number));
            } else if is_serving && is_terminating {
                terminating.push((ip.to_string(), number));
            }
        }
    }
    let mut chosen = if ready.is_empty() { terminating } else { ready };
    chosen.sort();
    chosen.dedup();
    chosen
}
