//! What a tenant's object may point HAProxy at: no route into the controller or its node.
//!
//! A Service, an EndpointSlice or a TCP object is written by whoever may edit a namespace;
//! HAProxy connects where they say and binds what they say, from inside the controller's
//! network namespace. So an ExternalName to `localhost`, an endpoint on loopback or on the
//! cloud metadata address, or a TCP bind on the admin port would turn a public route into
//! the controller's own endpoints, the node's or another tenant's listener. These rules are
//! decided here, from flags, and applied where backends and binds are built.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// The cloud metadata services' addresses (AWS, GCP, Azure, OpenStack: 169.254.169.254;
/// AWS over IPv6: fd00:ec2::254).
const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

/// Names that reach the node or the cloud without DNS: the resolver answers them itself
/// (`/etc/hosts`, RFC 6761 `localhost`) or the platform does.
const LOCAL_NAMES: &[&str] = &[
    "localhost",
    "ip6-localhost",
    "ip6-loopback",
    "metadata",
    "metadata.google.internal",
    "instance-data",
    "instance-data.ec2.internal",
];

/// What the controller's resolver answered, for each ExternalName Service's name, before a
/// run (see the controller's `external_names`): the addresses, or why there are none. Resolution is IO,
/// so it happens at the edge and comes in as input; translation refuses a name any of whose
/// addresses is local and renders the addresses, so HAProxy never resolves a tenant's name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvedNames(pub BTreeMap<String, Result<Vec<IpAddr>, String>>);

/// What tenants' objects may point at, from flags (see `docs/security.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exposure {
    /// `--allow-external-name-services`: ExternalName Services may be routed to.
    pub allow_external_name_services: bool,
    /// `--allow-privileged-tcp-binds`: TCP objects may bind ports below 1024.
    pub allow_privileged_tcp_binds: bool,
    /// `--allow-local-endpoints`: in cluster mode, loopback and link-local endpoints are kept.
    pub allow_local_endpoints: bool,
    /// Which endpoint addresses a backend may use.
    pub endpoints: EndpointRule,
}

impl Exposure {
    /// The rules of a controller reading a cluster, where an endpoint on loopback,
    /// link-local or metadata addresses, or on the controller's pod, is a tenant reaching
    /// into the controller's node (unless `--allow-local-endpoints` keeps the local ones).
    pub fn in_cluster(mut self, own_ip: Option<IpAddr>) -> Self {
        self.endpoints.refuse_local = !self.allow_local_endpoints;
        self.endpoints.refuse_platform = true;
        self.endpoints.own_ip = own_ip;
        self
    }

    /// The controller's own listeners (admin, debug), which no server and no TCP bind may take.
    pub fn with_listeners(mut self, listeners: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.endpoints.own_listeners = listeners.into_iter().collect();
        self
    }
}

/// Which EndpointSlice addresses become servers. Carried by every [`super::backends::ResolvedPort`],
/// so each way of computing servers (full run, endpoint-only run, memo) applies the same rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct EndpointRule {
    /// Refuse loopback, link-local and unspecified addresses: on in cluster mode unless
    /// `--allow-local-endpoints`; off for manifests and `demo`, where loopback endpoints are
    /// how a developer runs it.
    pub refuse_local: bool,
    /// Refuse the metadata addresses and this controller's pod IP (cluster mode).
    pub refuse_platform: bool,
    /// This controller's pod IP (`--pod-ip`, `POD_IP`).
    pub own_ip: Option<IpAddr>,
    /// The controller's own listeners (admin, debug): never a server, in any mode.
    pub own_listeners: Arc<[SocketAddr]>,
}

impl EndpointRule {
    /// Why `address:port` may not be a server, or `None` when it may.
    pub fn refusal(&self, address: IpAddr, port: u16) -> Option<String> {
        let address = address.to_canonical();
        let own_ip = self.own_ip.map(|ip| ip.to_canonical());
        if let Some(listener) = self.own_listeners.iter().find(|l| {
            l.port() == port
                && (reaches(l.ip(), address)
                    || (l.ip().is_unspecified() && own_ip == Some(address)))
        }) {
            return Some(format!(
                "{address}:{port} is this controller's own listener {listener}"
            ));
        }
        if self.refuse_platform {
            if is_metadata(address) {
                return Some(format!("{address} is the cloud metadata address"));
            }
            if own_ip == Some(address) {
                return Some(format!("{address} is this controller's pod IP"));
            }
        }
        if self.refuse_local {
            if let Some(range) = local_range(address) {
                return Some(format!(
                    "{address} is {range} (allowed only with --allow-local-endpoints)"
                ));
            }
        }
        None
    }

    /// Whether any address could be refused: when not, checking endpoints is skipped.
    pub fn is_active(&self) -> bool {
        self.refuse_local || self.refuse_platform || !self.own_listeners.is_empty()
    }
}

/// Whether a connection to `target` reaches a socket listening on `listener` of this host.
fn reaches(listener: IpAddr, target: IpAddr) -> bool {
    let listener = listener.to_canonical();
    listener == target
        || (listener.is_unspecified() && local_range(target).is_some())
        || (listener.is_loopback() && target.is_loopback())
}

/// Whether `address` is a cloud metadata address.
fn is_metadata(address: IpAddr) -> bool {
    address == IpAddr::V4(METADATA_V4) || address == IpAddr::V6(METADATA_V6)
}

/// The local range `address` is in (loopback, link-local, unspecified, metadata), if any:
/// addresses that reach the host HAProxy runs on, or its cloud, rather than a pod.
pub fn local_range(address: IpAddr) -> Option<&'static str> {
    match address.to_canonical() {
        IpAddr::V4(v4) => {
            if v4 == METADATA_V4 {
                Some("the cloud metadata address")
            } else if v4.is_loopback() {
                Some("a loopback address (127.0.0.0/8)")
            } else if v4.is_link_local() {
                Some("a link-local address (169.254.0.0/16)")
            } else if v4.octets()[0] == 0 {
                // Linux connects 0.0.0.0/8 to the host itself.
                Some("an unspecified address (0.0.0.0/8)")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if v6 == METADATA_V6 {
                Some("the cloud metadata address")
            } else if v6.is_loopback() {
                Some("the loopback address (::1)")
            } else if v6.is_unspecified() {
                Some("the unspecified address (::)")
            } else if v6.segments()[0] & 0xffc0 == 0xfe80 {
                Some("a link-local address (fe80::/10)")
            } else {
                None
            }
        }
    }
}

/// Why an ExternalName Service's `spec.externalName` may not be a server, or `None` when it
/// may: IP literals (in the forms the C resolver reads too, such as `127.1` or `0x7f000001`),
/// names the resolver answers locally (`localhost`, `*.localhost`, `ip6-localhost`), the
/// cloud metadata names and the API server's own Service names. What a permitted name
/// resolves to is checked apart (see [`address_refusal`]).
pub fn external_name_refusal(name: &str) -> Option<String> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if let Ok(ip) = name.parse::<IpAddr>() {
        // Other IP literals are not DNS names either, which the caller says.
        return local_range(ip).map(|range| format!("it is {range}"));
    }
    // `inet_aton` reads `127.1`, `2130706433` and `0x7f.1` as addresses; no top-level
    // domain starts with a digit, so a last label that does is read as one.
    let last = name.rsplit('.').next().unwrap_or_default();
    if last.starts_with(|c: char| c.is_ascii_digit()) {
        return Some("it reads as an IP address (as the C resolver reads it)".to_string());
    }
    if LOCAL_NAMES.contains(&name.as_str()) || name.ends_with(".localhost") {
        return Some("it names this host or the cloud metadata service".to_string());
    }
    let api_server = name == "kubernetes"
        || name == "kubernetes.default"
        || name == "kubernetes.default.svc"
        || name.starts_with("kubernetes.default.svc.");
    if api_server {
        return Some("it names the Kubernetes API server".to_string());
    }
    None
}

/// `v` quoted for a diagnostic, cut to its first 64 characters.
pub fn brief(v: &str) -> String {
    const MAX: usize = 64;
    match v.char_indices().nth(MAX) {
        Some((end, _)) => format!("{:?}…", &v[..end]),
        None => format!("{v:?}"),
    }
}

/// Why an address an ExternalName resolved to may not be a server, or `None` when it may.
pub fn address_refusal(address: IpAddr) -> Option<String> {
    local_range(address).map(|range| format!("it resolves to {address}, {range}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn local_ranges_cover_loopback_link_local_unspecified_and_metadata() {
        for local in [
            "127.0.0.1",
            "127.255.0.9",
            "169.254.169.254",
            "169.254.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "::1",
            "::",
            "fe80::1",
            "febf::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(local_range(ip(local)).is_some(), "{local}");
        }
        for remote in [
            "10.0.0.1",
            "192.0.2.1",
            "1.1.1.1",
            "fd00::1",
            "fec0::1",
            "2001:db8::1",
            "::ffff:10.0.0.1",
        ] {
            assert_eq!(local_range(ip(remote)), None, "{remote}");
        }
    }

    #[test]
    fn external_names_that_reach_the_host_or_read_as_addresses_are_refused() {
        for refused in [
            "localhost",
            "LOCALHOST.",
            "admin.localhost",
            "ip6-localhost",
            "metadata.google.internal",
            "kubernetes.default.svc.cluster.local",
            "kubernetes",
            "127.0.0.1",
            "127.1",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "::1",
            "169.254.169.254",
            "fe80::1",
        ] {
            assert!(external_name_refusal(refused).is_some(), "{refused}");
        }
        for allowed in [
            "db.example.com",
            "api.payments-partner.example.net",
            "search.internal.example.org",
            "kubernetes.example.com",
            "localhost.example.com",
            "my-svc.other-ns.svc.cluster.local",
            // Not a DNS name, which `resolve_port` says; not this host's either.
            "192.0.2.10",
        ] {
            assert_eq!(external_name_refusal(allowed), None, "{allowed}");
        }
    }

    #[test]
    fn endpoint_rule_refuses_by_mode() {
        let admin: SocketAddr = "127.0.0.1:6060".parse().unwrap();
        let manifests = EndpointRule {
            own_listeners: Arc::from([admin]),
            ..EndpointRule::default()
        };
        // Loopback endpoints stay, but not the controller's own listener.
        assert_eq!(manifests.refusal(ip("127.0.0.1"), 8080), None);
        assert!(manifests.refusal(ip("127.0.0.1"), 6060).is_some());
        assert!(manifests.refusal(ip("127.0.0.2"), 6060).is_some());
        assert!(manifests.refusal(ip("::ffff:127.0.0.1"), 6060).is_some());
        assert_eq!(manifests.refusal(ip("10.0.0.1"), 6060), None);
        let wildcard = EndpointRule {
            own_listeners: Arc::from(["0.0.0.0:6060".parse::<SocketAddr>().unwrap()]),
            ..EndpointRule::default()
        };
        assert!(wildcard.refusal(ip("0.0.0.0"), 6060).is_some());

        let cluster = EndpointRule {
            refuse_local: true,
            refuse_platform: true,
            own_ip: Some(ip("10.1.2.3")),
            own_listeners: Arc::from([admin]),
        };
        for refused in [
            "127.0.0.1",
            "169.254.169.254",
            "169.254.1.1",
            "::1",
            "fe80::1",
            "0.0.0.0",
            "10.1.2.3",
        ] {
            assert!(cluster.refusal(ip(refused), 8080).is_some(), "{refused}");
        }
        assert_eq!(cluster.refusal(ip("10.1.2.4"), 8080), None);
        // --allow-local-endpoints: loopback and link-local pass, the platform's do not.
        let allowed = EndpointRule {
            refuse_local: false,
            ..cluster
        };
        assert_eq!(allowed.refusal(ip("127.0.0.1"), 8080), None);
        assert_eq!(allowed.refusal(ip("169.254.1.1"), 8080), None);
        assert!(allowed.refusal(ip("169.254.169.254"), 8080).is_some());
        assert!(allowed.refusal(ip("10.1.2.3"), 8080).is_some());
    }
}
