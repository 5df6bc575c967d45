//! Gateway API status, written by the leader: GatewayClass `Accepted`; Gateway `Accepted`
//! and `Programmed` with the published addresses and each listener's conditions and
//! `attachedRoutes`; each HTTPRoute's `parents[]` entries for our Gateways, with `Accepted`
//! and `ResolvedRefs`. Every condition carries the object's `observedGeneration`.
//!
//! What to write is [`crate::translate::gateway::attach`]'s, a pure function of the store; an
//! object is written only when that differs from the status the store holds (times aside),
//! and a condition keeps its `lastTransitionTime` while its status stays the same. Entries of
//! other controllers in a route's `parents` are kept.

use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::objects::gateway::{GATEWAY_GROUP, GatewayApi};
use crate::objects::{Key, Kind};
use crate::store::Store;
use crate::translate::gateway::{Condition, ListenerPorts, attach};

/// What this replica last wrote per object, with the resourceVersion the store had then:
/// not written again with the same status until the store shows another version.
pub type Written = HashMap<(Kind, Key), (Option<String>, Value)>;

/// One status to write.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayStatusUpdate {
    pub kind: Kind,
    pub key: Key,
    pub status: Value,
}

fn condition(c: &Condition, generation: Option<i64>, previous: Option<&Value>, now: &str) -> Value {
    let status = if c.status { "True" } else { "False" };
    let kept = previous
        .and_then(|p| p.as_array())
        .and_then(|list| {
            list.iter()
                .find(|p| p["type"] == c.kind && p["status"] == status)
        })
        .and_then(|p| p["lastTransitionTime"].as_str().map(str::to_string));
    let message = if c.message.is_empty() {
        c.reason.to_string()
    } else {
        c.message.clone()
    };
    json!({
        "type": c.kind,
        "status": status,
        "reason": c.reason,
        "message": message,
        "observedGeneration": generation.unwrap_or(0),
        "lastTransitionTime": kept.unwrap_or_else(|| now.to_string()),
    })
}

fn conditions(
    list: &[Condition],
    generation: Option<i64>,
    previous: Option<&Value>,
    now: &str,
) -> Value {
    Value::Array(
        list.iter()
            .map(|c| condition(c, generation, previous, now))
            .collect(),
    )
}

/// `v` without its `lastTransitionTime` fields, for comparing.
fn timeless(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| *k != "lastTransitionTime")
                .map(|(k, v)| (k.clone(), timeless(v)))
                .collect(),
        ),
        Value::Array(list) => Value::Array(list.iter().map(timeless).collect()),
        other => other.clone(),
    }
}

/// The statuses that differ from those the store holds.
pub fn updates(
    store: &Store,
    controller_name: &str,
    ports: &ListenerPorts,
    addresses: &[k8s_openapi::api::networking::v1::IngressLoadBalancerIngress],
    now: &str,
) -> Vec<GatewayStatusUpdate> {
    let attachments = attach(store, controller_name, ports);
    let mut out = Vec::new();
    let current = |kind: Kind, key: &Key| -> Value {
        store
            .gateway_api(kind)
            .get(key)
            .and_then(|o| match &**o {
                GatewayApi::GatewayClass(c) => c.status.clone(),
                GatewayApi::Gateway(g) => g.status.clone(),
                GatewayApi::HttpRoute(r) => r.status.clone(),
                GatewayApi::TlsRoute(r) | GatewayApi::TcpRoute(r) => r.status.clone(),
                _ => None,
            })
            .unwrap_or(Value::Null)
    };
    let mut push = |kind: Kind, key: &Key, status: Value, now_status: &Value| {
        if timeless(&status) != timeless(now_status) {
            out.push(GatewayStatusUpdate {
                kind,
                key: key.clone(),
                status,
            });
        }
    };
    for class in &attachments.classes {
        let held = current(Kind::GatewayClass, &class.key);
        let status = json!({"conditions": conditions(
            std::slice::from_ref(&class.accepted), class.generation, held.get("conditions"), now)});
        push(Kind::GatewayClass, &class.key, status, &held);
    }
    for gateway in &attachments.gateways {
        let held = current(Kind::Gateway, &gateway.key);
        let listeners: Vec<Value> = gateway
            .listeners
            .iter()
            .map(|l| {
                let previous = held["listeners"]
                    .as_array()
                    .and_then(|list| list.iter().find(|p| p["name"] == l.name.as_str()))
                    .and_then(|p| p.get("conditions"));
                let kinds = match l.frontend {
                    Some(f) => json!([{"group": GATEWAY_GROUP, "kind": f.route_kind().as_str()}]),
                    None => json!([]),
                };
                json!({
                    "name": l.name,
                    "supportedKinds": kinds,
                    "attachedRoutes": l.attached_routes,
                    "conditions": conditions(&l.conditions, gateway.generation, previous, now),
                })
            })
            .collect();
        let addresses: Vec<Value> = addresses
            .iter()
            .filter_map(|a| match (&a.ip, &a.hostname) {
                (Some(ip), _) => Some(json!({"type": "IPAddress", "value": ip})),
                (None, Some(h)) => Some(json!({"type": "Hostname", "value": h})),
                _ => None,
            })
            .collect();
        let status = json!({
            "addresses": addresses,
            "conditions": conditions(&gateway.conditions, gateway.generation, held.get("conditions"), now),
            "listeners": listeners,
        });
        push(Kind::Gateway, &gateway.key, status, &held);
    }
    let routes = attachments
        .routes
        .iter()
        .map(|r| (Kind::HttpRoute, r))
        .chain(attachments.tls_routes.iter().map(|r| (Kind::TlsRoute, r)))
        .chain(attachments.tcp_routes.iter().map(|r| (Kind::TcpRoute, r)));
    for (kind, route) in routes {
        let held = current(kind, &route.key);
        let held_parents = held["parents"].as_array().cloned().unwrap_or_default();
        let mut parents: Vec<Value> = held_parents
            .iter()
            .filter(|p| p["controllerName"] != controller_name)
            .cloned()
            .collect();
        for parent in &route.parents {
            let mut parent_ref = json!({
                "group": GATEWAY_GROUP,
                "kind": "Gateway",
                "namespace": parent.gateway.namespace,
                "name": parent.gateway.name,
            });
            if let Some(section) = &parent.section_name {
                parent_ref["sectionName"] = json!(section);
            }
            if let Some(port) = parent.port {
                parent_ref["port"] = json!(port);
            }
            let previous = held_parents
                .iter()
                .find(|p| p["parentRef"] == parent_ref && p["controllerName"] == controller_name)
                .and_then(|p| p.get("conditions"));
            parents.push(json!({
                "parentRef": parent_ref,
                "controllerName": controller_name,
                "conditions": conditions(&parent.conditions, route.generation, previous, now),
            }));
        }
        let status = json!({"parents": parents});
        push(kind, &route.key, status, &held);
    }
    out
}

/// Writes the statuses, each with a merge patch of its `status` subresource; the failures
/// are returned.
pub async fn write(
    client: &kube::Client,
    updates: &[GatewayStatusUpdate],
    versions: &crate::cluster::reflect::ApiVersions,
) -> Vec<(GatewayStatusUpdate, kube::Error)> {
    let mut failed = Vec::new();
    for update in updates {
        let resource = crate::cluster::reflect::api_resource_at(update.kind, versions);
        let api: Api<DynamicObject> = if update.kind.namespaced() {
            Api::namespaced_with(client.clone(), &update.key.namespace, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        let patch = json!({"status": update.status});
        if let Err(e) = api
            .patch_status(
                &update.key.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            failed.push((update.clone(), e));
        }
    }
    failed
}

/// The leader's pass: computes, filters what was just written, writes, remembers.
pub async fn publish(
    client: &kube::Client,
    store: &Store,
    controller_name: &str,
    (ports, versions): (&ListenerPorts, &crate::cluster::reflect::ApiVersions),
    addresses: &[k8s_openapi::api::networking::v1::IngressLoadBalancerIngress],
    written: &mut Written,
) -> (usize, usize) {
    let now = Timestamp::now().to_string();
    let version = |kind: Kind, key: &Key| {
        store
            .gateway_api(kind)
            .get(key)
            .and_then(|o| o.metadata().resource_version.clone())
    };
    let updates: Vec<GatewayStatusUpdate> = updates(store, controller_name, ports, addresses, &now)
        .into_iter()
        .filter(|u| {
            written.get(&(u.kind, u.key.clone()))
                != Some(&(version(u.kind, &u.key), timeless(&u.status)))
        })
        .collect();
    written.retain(|(kind, key), _| store.gateway_api(*kind).contains_key(key));
    if updates.is_empty() {
        return (0, 0);
    }
    let failed = write(client, &updates, versions).await;
    for update in &updates {
        if !failed
            .iter()
            .any(|(f, _)| f.kind == update.kind && f.key == update.key)
        {
            written.insert(
                (update.kind, update.key.clone()),
                (version(update.kind, &update.key), timeless(&update.status)),
            );
        }
    }
    for (update, e) in &failed {
        tracing::warn!(
            object = %crate::objects::ObjectRef::new(update.kind, &update.key),
            "writing Gateway API status failed (retried): {e}"
        );
    }
    (updates.len() - failed.len(), failed.len())
}
