//! Ingress `.status.loadBalancer.ingress`: where clients reach the Ingresses we serve.
//!
//! Tools such as external-dns and `kubectl get ingress` read this field. Only the leader
//! writes it; every replica computes the same value, sorted, so that a change of leader does
//! not rewrite every Ingress.

use std::net::IpAddr;

use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use kube::api::{Api, Patch, PatchParams};

use crate::objects::Key;
use crate::store::Store;
use crate::translate::class::ClassFilter;

/// What to publish as the Ingresses' address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// `--publish-service NS/NAME`: the address of the Service in front of the controller.
    Service(Key),
    /// `--publish-address IP|HOST[,..]`: fixed addresses, for when no Service has them.
    Addresses(Vec<String>),
}

/// One Ingress whose published address must change.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    pub key: Key,
    pub ingress: Vec<IngressLoadBalancerIngress>,
}

/// The addresses to publish, sorted and deduplicated. For a Service: its load balancer's
/// addresses, else its external IPs, else its cluster IP, so that something useful shows even
/// without a cloud load balancer. Empty if the Service is not known (yet).
pub fn publish_addresses(publish: &Publish, store: &Store) -> Vec<IngressLoadBalancerIngress> {
    let mut out: Vec<IngressLoadBalancerIngress> = match publish {
        Publish::Addresses(addresses) => addresses.iter().filter_map(|a| entry(a)).collect(),
        Publish::Service(key) => store.service(key).map_or_else(Vec::new, |service| {
            let from_lb: Vec<_> = service
                .load_balancer
                .iter()
                .filter_map(|i| {
                    let ip = i.ip.clone().filter(|s| !s.is_empty());
                    let hostname = i.hostname.clone().filter(|s| !s.is_empty());
                    (ip.is_some() || hostname.is_some()).then_some(IngressLoadBalancerIngress {
                        ip,
                        hostname,
                        ports: None,
                    })
                })
                .collect();
            if !from_lb.is_empty() {
                return from_lb;
            }
            let external: Vec<_> = service
                .external_ips
                .iter()
                .filter_map(|a| entry(a))
                .collect();
            if !external.is_empty() {
                return external;
            }
            service
                .cluster_ip
                .as_deref()
                .filter(|ip| *ip != "None")
                .and_then(entry)
                .into_iter()
                .collect()
        }),
    };
    out.sort_by(|a, b| (&a.ip, &a.hostname).cmp(&(&b.ip, &b.hostname)));
    out.dedup();
    out
}

/// An IP literal becomes `ip`, anything else `hostname`; blanks are skipped.
fn entry(address: &str) -> Option<IngressLoadBalancerIngress> {
    let address = address.trim();
    if address.is_empty() {
        return None;
    }
    let is_ip = address.parse::<IpAddr>().is_ok();
    Some(IngressLoadBalancerIngress {
        ip: is_ip.then(|| address.to_string()),
        hostname: (!is_ip).then(|| address.to_string()),
        ports: None,
    })
}

/// The Ingresses of our classes whose status is not `addresses` yet. Other Ingresses are left
/// alone: their status belongs to their own controller.
pub fn updates(
    store: &Store,
    classes: &ClassFilter,
    addresses: &[IngressLoadBalancerIngress],
) -> Vec<StatusUpdate> {
    store
        .ingresses()
        .filter(|(_, ingress)| classes.accepts(ingress))
        .filter(|(_, ingress)| current(ingress) != addresses)
        .map(|(key, _)| StatusUpdate {
            key: key.clone(),
            ingress: addresses.to_vec(),
        })
        .collect()
}

/// The Ingresses that were ours (`ours_before`, the keys [`updates`] considered at the last
/// write) and are not any more, whose status still shows `addresses`: cleared once, so that
/// DNS tools stop sending their hosts here. One that now shows anything else was written by
/// its new controller and is left alone, and one is never cleared twice, so two controllers
/// publishing the same address do not take turns at it.
pub fn released(
    store: &Store,
    classes: &ClassFilter,
    addresses: &[IngressLoadBalancerIngress],
    ours_before: &std::collections::BTreeSet<Key>,
) -> Vec<StatusUpdate> {
    ours_before
        .iter()
        .filter_map(|key| Some((key, store.ingress(key)?)))
        .filter(|(_, ingress)| !classes.accepts(ingress))
        .filter(|(_, ingress)| !addresses.is_empty() && current(ingress) == addresses)
        .map(|(key, _)| StatusUpdate {
            key: key.clone(),
            ingress: Vec::new(),
        })
        .collect()
}

/// The keys of the Ingresses of our classes, for [`released`] at the next write.
pub fn ours(store: &Store, classes: &ClassFilter) -> std::collections::BTreeSet<Key> {
    store
        .ingresses()
        .filter(|(_, ingress)| classes.accepts(ingress))
        .map(|(key, _)| key.clone())
        .collect()
}

fn current(ingress: &Ingress) -> &[IngressLoadBalancerIngress] {
    ingress
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default()
}

/// Writes the updates with merge patches on the status subresource (which replace the list
/// as a whole). Goes on past failures, so that one deleted or forbidden Ingress does not hold
/// up the others, and returns them.
pub async fn write(client: &kube::Client, updates: &[StatusUpdate]) -> Vec<(Key, kube::Error)> {
    let mut failed = Vec::new();
    for update in updates {
        let api: Api<Ingress> = Api::namespaced(client.clone(), &update.key.namespace);
        let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": update.ingress}}});
        if let Err(e) = api
            .patch_status(
                &update.key.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            failed.push((update.key.clone(), e));
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::objects::Object;

    fn object(v: serde_json::Value) -> Object {
        Object::from_value(v).unwrap()
    }

    fn service(status: serde_json::Value, spec: serde_json::Value) -> Object {
        let mut v = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "haproxy", "namespace": "ingress"}
        });
        v["spec"] = spec;
        v["status"] = status;
        object(v)
    }

    fn ingress(name: &str, class: Option<&str>, lb: serde_json::Value) -> Object {
        let mut v = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": "web"},
            "spec": {}
        });
        if let Some(class) = class {
            v["spec"]["ingressClassName"] = json!(class);
        }
        v["status"]["loadBalancer"]["ingress"] = lb;
        object(v)
    }

    fn ip(a: &str) -> IngressLoadBalancerIngress {
        IngressLoadBalancerIngress {
            ip: Some(a.into()),
            ..Default::default()
        }
    }

    fn host(h: &str) -> IngressLoadBalancerIngress {
        IngressLoadBalancerIngress {
            hostname: Some(h.into()),
            ..Default::default()
        }
    }

    fn published(store: &Store) -> Vec<IngressLoadBalancerIngress> {
        publish_addresses(&Publish::Service(Key::new("ingress", "haproxy")), store)
    }

    #[test]
    fn service_load_balancer_comes_first_sorted_and_deduplicated() {
        let store = Store::from_objects([service(
            json!({"loadBalancer": {"ingress": [
                {"ip": "203.0.113.9"}, {"hostname": "lb.example.com"}, {"ip": "203.0.113.1"},
                {"ip": "203.0.113.9"}, {}
            ]}}),
            json!({"clusterIP": "10.0.0.1", "externalIPs": ["192.0.2.1"]}),
        )]);
        assert_eq!(
            published(&store),
            vec![host("lb.example.com"), ip("203.0.113.1"), ip("203.0.113.9")]
        );
    }

    #[test]
    fn service_falls_back_to_external_then_cluster_ip() {
        let external = Store::from_objects([service(
            json!({"loadBalancer": {}}),
            json!({"clusterIP": "10.0.0.1", "externalIPs": ["192.0.2.2", "192.0.2.1"]}),
        )]);
        assert_eq!(published(&external), vec![ip("192.0.2.1"), ip("192.0.2.2")]);
        let cluster = Store::from_objects([service(json!({}), json!({"clusterIP": "10.0.0.1"}))]);
        assert_eq!(published(&cluster), vec![ip("10.0.0.1")]);
        let headless = Store::from_objects([service(json!({}), json!({"clusterIP": "None"}))]);
        assert_eq!(published(&headless), vec![]);
        assert_eq!(published(&Store::new()), vec![]);
    }

    #[test]
    fn fixed_addresses_are_classified() {
        let publish = Publish::Addresses(vec![
            "lb.example.com".into(),
            " 2001:db8::1 ".into(),
            "192.0.2.7".into(),
            String::new(),
            "192.0.2.7".into(),
        ]);
        assert_eq!(
            publish_addresses(&publish, &Store::new()),
            vec![host("lb.example.com"), ip("192.0.2.7"), ip("2001:db8::1")]
        );
    }

    #[test]
    fn updates_only_our_ingresses_that_differ() {
        let store = Store::from_objects([
            Object::from_value(
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
                "metadata": {"name": "haproxy"},
                "spec": {"controller": "haproxy.org/ingress-controller"}}),
            )
            .unwrap(),
            ingress("current", Some("haproxy"), json!([{"ip": "192.0.2.1"}])),
            ingress("stale", Some("haproxy"), json!([{"ip": "192.0.2.9"}])),
            ingress("new", Some("haproxy"), json!(null)),
            ingress("theirs", Some("nginx"), json!([{"ip": "198.51.100.1"}])),
            ingress("unclassed", None, json!(null)),
        ]);
        let classes = ClassFilter::new(&store, "haproxy", "haproxy.org/ingress-controller", false);
        let addresses = vec![ip("192.0.2.1")];
        let keys: Vec<String> = updates(&store, &classes, &addresses)
            .iter()
            .map(|u| {
                assert_eq!(u.ingress, addresses);
                u.key.to_string()
            })
            .collect();
        assert_eq!(keys, ["web/new", "web/stale"]);
    }

    #[test]
    fn an_ingress_that_left_the_class_is_cleared_once_if_it_still_shows_our_address() {
        let class = |name: &str, controller: &str| {
            Object::from_value(
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
                "metadata": {"name": name}, "spec": {"controller": controller}}),
            )
            .unwrap()
        };
        let store = Store::from_objects([
            class("haproxy", "haproxy.org/ingress-controller"),
            class("nginx", "k8s.io/ingress-nginx"),
            ingress("moved", Some("nginx"), json!([{"ip": "192.0.2.1"}])),
            ingress("taken", Some("nginx"), json!([{"ip": "198.51.100.1"}])),
            ingress("stays", Some("haproxy"), json!([{"ip": "192.0.2.1"}])),
            ingress("never", Some("nginx"), json!([{"ip": "192.0.2.1"}])),
        ]);
        let classes = ClassFilter::new(&store, "haproxy", "haproxy.org/ingress-controller", false);
        let before: std::collections::BTreeSet<Key> = ["moved", "taken", "stays", "gone"]
            .iter()
            .map(|n| Key::new("web", *n))
            .collect();
        let cleared = released(&store, &classes, &[ip("192.0.2.1")], &before);
        assert_eq!(cleared.len(), 1, "{cleared:?}");
        assert_eq!(cleared[0].key, Key::new("web", "moved"));
        assert!(cleared[0].ingress.is_empty());
        assert_eq!(
            ours(&store, &classes).into_iter().collect::<Vec<_>>(),
            [Key::new("web", "stays")]
        );
    }

    #[test]
    fn no_address_clears_ours_and_skips_empty_ones() {
        let store = Store::from_objects([
            Object::from_value(
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
                "metadata": {"name": "haproxy"},
                "spec": {"controller": "haproxy.org/ingress-controller"}}),
            )
            .unwrap(),
            ingress("has", Some("haproxy"), json!([{"ip": "192.0.2.1"}])),
            ingress("empty", Some("haproxy"), json!([])),
            ingress("none", Some("haproxy"), json!(null)),
        ]);
        let classes = ClassFilter::new(&store, "haproxy", "haproxy.org/ingress-controller", false);
        let all = updates(&store, &classes, &[]);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].key, Key::new("web", "has"));
        assert!(all[0].ingress.is_empty());
    }
}
