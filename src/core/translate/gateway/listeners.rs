//! Which port a Gateway listener may be served on.
//!
//! `HTTP` and `HTTPS` listeners on their protocol's shared port are served by the shared
//! frontends, and a `TLS` (passthrough) listener on the HTTPS port shares the HTTPS bind
//! (connections are told apart by their TLS server name); on any other port a listener opens
//! a bind of its own. A Gateway may open one only on a port of
//! `--gateway-listener-ports` (none by default: in a shared cluster, opening ports on the
//! controller's addresses is the operator's decision), that Portcullis or HAProxy does not
//! hold already (the HTTP, HTTPS, stats and healthz frontends, the peers and admin listeners,
//! TCP resources and `--configmap-tcp-services`, which win), and that no older listener holds
//! with another protocol. Listeners of one protocol on one port, of any Gateway, share it.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use crate::model::Listen;
use crate::objects::Key;
use crate::store::Store;
use crate::translate::TranslateConfig;

/// `--gateway-listener-ports`: ranges of ports Gateway listeners may open binds on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRanges(pub Vec<RangeInclusive<u16>>);

impl PortRanges {
    /// Parses `PORT` or `FIRST-LAST`, comma-separated (`10000-10099,15000`); empty: none.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let port = |v: &str| -> Result<u16, String> {
                v.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("{v:?} is not a port number 1..65535"))
            };
            let range = match part.split_once('-') {
                Some((a, b)) => port(a)?..=port(b)?,
                None => port(part)?..=port(part)?,
            };
            if range.is_empty() {
                return Err(format!("{part:?}: the first port is above the last"));
            }
            out.push(range);
        }
        Ok(PortRanges(out))
    }

    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|r| r.contains(&port))
    }
}

impl std::fmt::Display for PortRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|r| {
                if r.start() == r.end() {
                    r.start().to_string()
                } else {
                    format!("{}-{}", r.start(), r.end())
                }
            })
            .collect();
        write!(f, "{}", parts.join(","))
    }
}

/// What decides the port of each listener, from the flags; the store adds the TCP resources'
/// and the TCP services ConfigMap's ports.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerPorts {
    pub listen: Listen,
    pub allowed: PortRanges,
    /// Ports the controller or HAProxy hold besides the HTTP and HTTPS frontends, by owner.
    pub reserved: BTreeMap<u16, String>,
    pub tcp_services: Option<Key>,
}

impl Default for ListenerPorts {
    fn default() -> Self {
        ListenerPorts::of(&TranslateConfig::default())
    }
}

impl ListenerPorts {
    pub fn of(config: &TranslateConfig) -> Self {
        let l = &config.listen;
        let mut reserved = BTreeMap::new();
        if let Some(p) = l.stats_port {
            reserved.insert(p, "the stats frontend (--stats-bind-port)".to_string());
        }
        if let Some(p) = l.healthz_port {
            reserved.insert(p, "the healthz frontend (--healthz-bind-port)".to_string());
        }
        if config.identity.pod_name.is_some() {
            reserved.insert(
                config.identity.peer_port,
                "the peers listener (--localpeer-port)".to_string(),
            );
        }
        for a in config.exposure.endpoints.own_listeners.iter() {
            reserved.insert(a.port(), format!("this controller's admin endpoint ({a})"));
        }
        ListenerPorts {
            listen: l.clone(),
            allowed: config.gateway_listener_ports.clone(),
            reserved,
            tcp_services: config.tcp_services_config_map.clone(),
        }
    }

    /// Whether `port` is the shared HTTP frontend's (`80` stands for it too).
    pub fn is_http(&self, port: i64) -> bool {
        self.listen.http && (port == 80 || port == i64::from(self.listen.http_port))
    }

    /// Whether `port` is the shared HTTPS frontend's (`443` stands for it too).
    pub fn is_https(&self, port: i64) -> bool {
        self.listen.https && (port == 443 || port == i64::from(self.listen.https_port))
    }

    /// Why a listener may not open a bind on `port`, if it may not.
    pub fn unavailable(&self, store: &Store, port: i64) -> Option<String> {
        let Some(p) = u16::try_from(port).ok().filter(|p| *p > 0) else {
            return Some(format!("{port} is not a port number 1..65535"));
        };
        let l = &self.listen;
        if self.is_http(port) || (l.http && p == l.http_port) {
            return Some(format!("port {p} is the HTTP frontend's"));
        }
        if self.is_https(port) || (l.https && p == l.https_port) {
            return Some(format!("port {p} is the HTTPS frontend's"));
        }
        if let Some(owner) = self.reserved.get(&p) {
            return Some(format!("port {p} is held by {owner}"));
        }
        if let Some(owner) = tcp_port_owner(store, self.tcp_services.as_ref(), p) {
            return Some(format!(
                "port {p} is bound by {owner}, which takes precedence"
            ));
        }
        if !self.allowed.contains(p) {
            return Some(if self.allowed.0.is_empty() {
                format!(
                    "port {p} is not served: Gateways may open no port of their own (--gateway-listener-ports is empty)"
                )
            } else {
                format!(
                    "port {p} is not in --gateway-listener-ports ({})",
                    self.allowed
                )
            });
        }
        None
    }
}

/// The host part of the routing keys of a route attached to an HTTP or HTTPS listener on a
/// port of its own: `<port>/<host>` (`<port>/` for every host). The shared frontends never
/// look such a key up with a request's own name (a Host header with `/` is refused), and
/// the port's frontend looks up nothing else.
pub fn port_host(port: Option<u16>, host: &str) -> String {
    match port {
        Some(p) => format!("{p}/{host}"),
        None => host.to_string(),
    }
}

/// Whether a routing key's host is a [`port_host`].
pub fn is_port_host(host: &str) -> bool {
    host.contains('/')
}

/// The map value of a route on a port of its own: `port~<backend>[.<policy>]`. Those
/// keys can still be reached from the shared frontends by a Host header that is a port
/// number (`8080` and path `/a.example.com/`): there the value names no backend and the
/// default one answers. The port's frontend takes the part after `~`.
pub fn port_value(host: &str, value: &str) -> String {
    if is_port_host(host) {
        format!("{PORT_VALUE_PREFIX}{value}")
    } else {
        value.to_string()
    }
}

/// See [`port_value`].
pub const PORT_VALUE_PREFIX: &str = "port~";

/// The TCP resource or TCP services ConfigMap that names `port`, whether or not its entry is
/// otherwise usable: those ports are theirs.
fn tcp_port_owner(store: &Store, tcp_services: Option<&Key>, port: u16) -> Option<String> {
    for (key, tcp) in store.tcps() {
        for entry in &tcp.spec {
            if entry
                .frontend
                .binds
                .entries
                .iter()
                .any(|(_, b)| b.port == Some(i64::from(port)))
            {
                return Some(format!("TCP {key}"));
            }
        }
    }
    let key = tcp_services?;
    let cm = store.config_map(key)?;
    cm.data
        .iter()
        .flatten()
        .any(|(k, _)| k.parse::<u16>().ok() == Some(port))
        .then(|| format!("ConfigMap {key} (--configmap-tcp-services)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_parse_and_print() {
        let r = PortRanges::parse("10000-10010, 15000").unwrap();
        assert!(r.contains(10000) && r.contains(10010) && r.contains(15000));
        assert!(!r.contains(10011) && !r.contains(9999));
        assert_eq!(r.to_string(), "10000-10010,15000");
        assert_eq!(PortRanges::parse("").unwrap(), PortRanges::default());
        assert!(PortRanges::parse("10-5").is_err());
        assert!(PortRanges::parse("0").is_err());
        assert!(PortRanges::parse("70000").is_err());
        assert!(PortRanges::parse("a-b").is_err());
    }

    #[test]
    fn shared_and_reserved_ports_are_unavailable() {
        let mut config = TranslateConfig::default();
        config.listen.http_port = 8080;
        config.listen.stats_port = Some(1936);
        config.gateway_listener_ports = PortRanges::parse("1000-20000").unwrap();
        let ports = ListenerPorts::of(&config);
        let store = Store::default();
        assert!(ports.unavailable(&store, 8080).unwrap().contains("HTTP"));
        assert!(ports.unavailable(&store, 80).unwrap().contains("HTTP"));
        assert!(ports.unavailable(&store, 1936).unwrap().contains("stats"));
        assert!(ports.unavailable(&store, 443).unwrap().contains("HTTPS"));
        assert!(ports.unavailable(&store, 30000).unwrap().contains("not in"));
        assert_eq!(ports.unavailable(&store, 5432), None);
        let closed = ListenerPorts::default();
        assert!(
            closed
                .unavailable(&store, 5432)
                .unwrap()
                .contains("--gateway-listener-ports is empty")
        );
    }
}
