//! Peers: this controller's pod and the other running pods of the same workload, so that
//! stick tables are shared and a client keeps its server when its traffic moves to another
//! replica.
//!
//! The workload is found through the pod's controller owner reference: a ReplicaSet stands
//! for its Deployment (its name minus the `pod-template-hash`), so pods of two ReplicaSets
//! during a rollout are peers; DaemonSets and StatefulSets stand for themselves.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

use crate::diagnostics::{Diagnostics, Severity};
use crate::model::{Peer, Peers};
use crate::objects::{Key, Kind, ObjectRef};
use crate::store::Store;

/// Who this controller is, passed in (from the downward API or flags), never looked up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    pub pod_ip: Option<IpAddr>,
    pub peer_port: u16,
}

/// The peers section, or `None` when this controller does not know who it is.
pub fn peers(store: &Store, identity: &Identity, diags: &mut Diagnostics) -> Option<Peers> {
    let name = identity.pod_name.as_ref()?;
    let own = store
        .pods()
        .find(|(key, _)| {
            key.name == *name
                && identity
                    .pod_namespace
                    .as_ref()
                    .is_none_or(|ns| *ns == key.namespace)
        })
        .map(|(key, pod)| (key.clone(), pod.clone()));
    let own_ip = identity
        .pod_ip
        .or_else(|| own.as_ref().and_then(|(_, pod)| pod_ip(pod)));
    let Some(own_ip) = own_ip else {
        let object = ObjectRef::new(
            Kind::Pod,
            &Key::new(
                identity.pod_namespace.clone().unwrap_or_default(),
                name.clone(),
            ),
        );
        diags.object(
            Severity::Warning,
            &object,
            "status.podIP",
            "this controller's pod IP is unknown (set POD_IP or --pod-ip): no peers section, stick tables stay local",
        );
        return None;
    };
    let mut entries = vec![Peer {
        name: name.clone(),
        address: own_ip.to_string(),
    }];
    if let Some((own_key, own_pod)) = &own {
        if let Some(workload) = workload_of(own_pod) {
            for (key, pod) in store.pods() {
                if key == own_key || key.namespace != own_key.namespace {
                    continue;
                }
                if workload_of(pod).as_ref() != Some(&workload) || !running(pod) {
                    continue;
                }
                if let Some(ip) = pod_ip(pod) {
                    entries.push(Peer {
                        name: key.name.clone(),
                        address: ip.to_string(),
                    });
                }
            }
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries.dedup_by(|a, b| a.name == b.name);
    Some(Peers {
        local: name.clone(),
        port: identity.peer_port,
        entries,
    })
}

/// (kind, name) of the workload that controls `pod`.
fn workload_of(pod: &Pod) -> Option<(String, String)> {
    let owner = pod
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    if owner.kind == "ReplicaSet" {
        let hash = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-template-hash"));
        let deployment = hash
            .and_then(|h| owner.name.strip_suffix(&format!("-{h}")))
            .unwrap_or(&owner.name);
        return Some(("Deployment".to_string(), deployment.to_string()));
    }
    Some((owner.kind.clone(), owner.name.clone()))
}

/// Running, IP-assigned and not being deleted.
fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Running")
        && pod_ip(pod).is_some()
}

fn pod_ip(pod: &Pod) -> Option<IpAddr> {
    pod.status.as_ref()?.pod_ip.as_ref()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::objects::Object;

    fn pod(
        name: &str,
        owner: (&str, &str),
        hash: Option<&str>,
        phase: &str,
        ip: Option<&str>,
    ) -> Object {
        let mut labels = serde_json::Map::new();
        if let Some(h) = hash {
            labels.insert("pod-template-hash".into(), json!(h));
        }
        Object::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ingress", "labels": labels,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner.0, "name": owner.1,
                                     "uid": "u", "controller": true}]},
            "status": {"phase": phase, "podIP": ip}
        }))
        .unwrap()
    }

    #[test]
    fn peers_are_the_running_pods_of_the_same_workload_sorted() {
        let store = Store::from_objects([
            pod(
                "pc-aaa-1",
                ("ReplicaSet", "pc-aaa"),
                Some("aaa"),
                "Running",
                Some("10.0.0.2"),
            ),
            // Another ReplicaSet of the same Deployment (a rollout): still a peer.
            pod(
                "pc-bbb-0",
                ("ReplicaSet", "pc-bbb"),
                Some("bbb"),
                "Running",
                Some("10.0.0.1"),
            ),
            pod(
                "pc-bbb-9",
                ("ReplicaSet", "pc-bbb"),
                Some("bbb"),
                "Pending",
                None,
            ),
            pod(
                "other-ccc-1",
                ("ReplicaSet", "other-ccc"),
                Some("ccc"),
                "Running",
                Some("10.0.0.3"),
            ),
            pod(
                "ds-1",
                ("DaemonSet", "pc"),
                None,
                "Running",
                Some("10.0.0.4"),
            ),
        ]);
        let identity = Identity {
            pod_name: Some("pc-aaa-1".into()),
            pod_namespace: None,
            pod_ip: None,
            peer_port: 10000,
        };
        let mut diags = Diagnostics::new();
        let p = peers(&store, &identity, &mut diags).unwrap();
        let names: Vec<_> = p
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.address.as_str()))
            .collect();
        assert_eq!(names, [("pc-aaa-1", "10.0.0.2"), ("pc-bbb-0", "10.0.0.1")]);
        assert_eq!(p.local, "pc-aaa-1");
        assert!(diags.is_empty());
    }

    #[test]
    fn without_identity_there_is_no_peers_section() {
        let mut diags = Diagnostics::new();
        assert!(peers(&Store::new(), &Identity::default(), &mut diags).is_none());
        let named = Identity {
            pod_name: Some("x".into()),
            ..Identity::default()
        };
        assert!(peers(&Store::new(), &named, &mut diags).is_none());
        assert_eq!(diags.len(), 1, "the missing IP is reported");
        let with_ip = Identity {
            pod_name: Some("x".into()),
            pod_ip: Some("127.0.0.2".parse().unwrap()),
            ..Identity::default()
        };
        let p = peers(&Store::new(), &with_ip, &mut diags).unwrap();
        assert_eq!(p.entries.len(), 1);
    }
}
