//! Replicas agree: the same cluster state renders byte-identical files whatever order the
//! objects and events arrived in, and however endpoints are ordered or split across slices.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::needless_pass_by_value, clippy::type_complexity)]

use std::collections::BTreeMap;

use portcullis::model::Listen;
use portcullis::objects::{Key, Kind, Object};
use portcullis::pipeline::Pipeline;
use portcullis::render::RenderedConfig;
use portcullis::store::Store;
use portcullis::translate::TranslateConfig;
use proptest::prelude::*;
use serde_json::{Value, json};

/// A small deterministic generator, so one seed describes a whole cluster.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

const HOSTS: &[&str] = &["a.example.com", "b.example.com", "*.example.com", ""];
const PATHS: &[&str] = &["/", "/api", "/api/", "/api/v1", "/static", "/x"];
const KINDS: &[&str] = &["Exact", "Prefix", "ImplementationSpecific"];

/// A cluster: Services with endpoints (as a set), Ingresses, and conditions per endpoint.
struct Cluster {
    services: Vec<(String, Vec<(String, bool, bool)>)>,
    ingresses: Vec<Value>,
}

fn cluster(rng: &mut Rng) -> Cluster {
    let services: Vec<(String, Vec<(String, bool, bool)>)> = (0..1 + rng.below(4))
        .map(|s| {
            let endpoints = (0..rng.below(12))
                .map(|e| {
                    let ip = format!("10.{s}.{}.{e}", rng.below(3));
                    // (address, ready, terminating)
                    (ip, rng.below(5) != 0, rng.below(6) == 0)
                })
                .collect();
            (format!("svc{s}"), endpoints)
        })
        .collect();
    let ingresses = (0..1 + rng.below(6))
        .map(|i| {
            let rules: Vec<Value> = (0..1 + rng.below(3))
                .map(|_| {
                    let paths: Vec<Value> = (0..1 + rng.below(3))
                        .map(|_| {
                            let svc = &rng.pick(&services).0;
                            json!({"path": rng.pick(PATHS), "pathType": rng.pick(KINDS),
                                   "backend": {"service": {"name": svc, "port": {"number": 80}}}})
                        })
                        .collect();
                    let host = *rng.pick(HOSTS);
                    if host.is_empty() {
                        json!({"http": {"paths": paths}})
                    } else {
                        json!({"host": host, "http": {"paths": paths}})
                    }
                })
                .collect();
            let mut annotations = serde_json::Map::new();
            if rng.below(2) == 0 {
                annotations.insert(
                    "haproxy.org/request-set-header".into(),
                    json!(format!("X-Ingress ing{i}")),
                );
            }
            if rng.below(3) == 0 {
                annotations.insert("haproxy.org/load-balance".into(), json!("leastconn"));
            }
            // Frontend captures (first-asked order) and standalone backends.
            if rng.below(3) == 0 {
                annotations.insert(
                    "haproxy.org/request-capture".into(),
                    json!(format!("hdr(X-Ing{i})\ncookie(c{})", rng.below(2))),
                );
            }
            if rng.below(4) == 0 {
                annotations.insert("haproxy.org/standalone-backend".into(), json!("true"));
            }
            json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": format!("ing{i}"), "namespace": "ns",
                             "creationTimestamp": format!("2026-01-01T00:00:{:02}Z", rng.below(4)),
                             "annotations": annotations},
                "spec": {"ingressClassName": "portcullis", "rules": rules}
            })
        })
        .collect();
    Cluster {
        services,
        ingresses,
    }
}

fn object(v: Value) -> Object {
    Object::from_value(v).unwrap()
}

/// The cluster's objects; endpoints are ordered and split into slices by `rng`.
fn objects(c: &Cluster, rng: &mut Rng) -> Vec<Object> {
    let mut out: Vec<Object> = c.ingresses.iter().cloned().map(object).collect();
    // The IngressClass the Ingresses name: without it they are not served.
    out.push(object(json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "portcullis"}, "spec": {"controller": "portcullis.io/ingress"}})));
    for (name, endpoints) in &c.services {
        // svc1's paths are canary routes (route-acl).
        let annotations = if name == "svc1" {
            json!({"haproxy.org/route-acl": "cookie(canary) -m found"})
        } else {
            json!({})
        };
        out.push(object(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "web"}]}
        })));
        let mut endpoints = endpoints.clone();
        rng.shuffle(&mut endpoints);
        let slices = 1 + rng.below(3) as usize;
        for s in 0..slices {
            let part: Vec<Value> = endpoints
                .iter()
                .skip(s)
                .step_by(slices)
                .map(|(ip, ready, terminating)| {
                    json!({"addresses": [ip],
                           "conditions": {"ready": ready, "serving": true, "terminating": terminating}})
                })
                .collect();
            out.push(object(json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{name}-{s}"), "namespace": "ns",
                             "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080}],
                "endpoints": part
            })));
        }
    }
    out
}

fn pipeline() -> Pipeline {
    Pipeline::load(
        None,
        None,
        TranslateConfig {
            version: "test".into(),
            listen: Listen {
                ipv4_address: "127.0.0.1".into(),
                http_port: 8080,
                https_port: 8443,
                ..Listen::default()
            },
            ..TranslateConfig::default()
        },
    )
    .unwrap()
}

fn render(pipeline: &Pipeline, store: &Store) -> (RenderedConfig, Vec<String>) {
    let out = pipeline.run(store).unwrap();
    let diags = out.diagnostics.iter().map(ToString::to_string).collect();
    (out.rendered, diags)
}

/// Applies `objects` as a stream of events in a random order: stale versions and objects that
/// are later deleted arrive interleaved; each object's final version arrives last for it.
fn replay(objects: &[Object], stale: &[Object], ghosts: &[Object], rng: &mut Rng) -> Store {
    let mut per_object: BTreeMap<(Kind, Key), Vec<Option<Object>>> = BTreeMap::new();
    let live: std::collections::BTreeSet<(Kind, Key)> =
        objects.iter().map(|o| (o.kind(), o.key())).collect();
    // Stale versions only of objects that end up live; anything else would be a different state.
    for o in stale.iter().filter(|o| live.contains(&(o.kind(), o.key()))) {
        per_object
            .entry((o.kind(), o.key()))
            .or_default()
            .push(Some(o.clone()));
    }
    for o in objects {
        per_object
            .entry((o.kind(), o.key()))
            .or_default()
            .push(Some(o.clone()));
    }
    for o in ghosts {
        let e = per_object.entry((o.kind(), o.key())).or_default();
        e.push(Some(o.clone()));
        e.push(None);
    }
    let mut queues: Vec<((Kind, Key), std::collections::VecDeque<Option<Object>>)> =
        per_object.into_iter().map(|(k, v)| (k, v.into())).collect();
    let mut store = Store::new();
    while !queues.is_empty() {
        let i = rng.below(queues.len() as u64) as usize;
        let ((kind, key), queue) = &mut queues[i];
        match queue.pop_front().unwrap() {
            Some(o) => store.upsert(o),
            None => store.delete(*kind, key),
        }
        if queue.is_empty() {
            queues.swap_remove(i);
        }
    }
    store
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn event_order_and_endpoint_order_do_not_change_the_output(seed in any::<u64>(), order in any::<u64>()) {
        let pipeline = pipeline();
        let mut rng = Rng(seed);
        let c = cluster(&mut rng);
        let baseline_objects = objects(&c, &mut Rng(seed ^ 1));
        let (baseline, baseline_diags) = render(&pipeline, &Store::from_objects(baseline_objects));

        // The same state, built from differently ordered and split objects, stale versions
        // and short-lived objects, applied in another order.
        let mut rng = Rng(order);
        let mut shuffled = objects(&c, &mut rng);
        rng.shuffle(&mut shuffled);
        let stale = objects(&cluster(&mut Rng(order ^ 7)), &mut Rng(order ^ 9));
        let ghosts = vec![object(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "ghost", "namespace": "ns"},
            "spec": {"ingressClassName": "portcullis", "rules": [{"host": "ghost.example.com",
                "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "svc0", "port": {"number": 80}}}}]}}]}
        }))];
        let store = replay(&shuffled, &stale, &ghosts, &mut rng);
        let (replayed, replayed_diags) = render(&pipeline, &store);

        for (name, bytes) in baseline.files() {
            let other = replayed.files().get(name);
            prop_assert!(other == Some(bytes), "{} differs:\n{:?}\n---\n{:?}", name, bytes, other);
        }
        prop_assert_eq!(baseline.files().len(), replayed.files().len());
        prop_assert_eq!(baseline_diags, replayed_diags);
    }
}

#[test]
fn generated_clusters_pass_haproxy_check() {
    // A handful of the generated clusters, checked by HAProxy itself.
    let pipeline = pipeline();
    for seed in 0..6u64 {
        let c = cluster(&mut Rng(seed));
        let store = Store::from_objects(objects(&c, &mut Rng(seed)));
        let out = pipeline.run(&store).unwrap();
        portcullis::check::check_config("haproxy", &out.rendered)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}
