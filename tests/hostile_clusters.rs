//! Property: hostile values mixed into an otherwise valid cluster never cost a valid object its
//! routes. Each tenant has its own namespace; some tenants annotate their Ingress and Service
//! with values built from injection material and regexes HAProxy refuses. The cluster is run
//! the way the controller runs it: render, ask the real `haproxy -c`, trace a refusal to the
//! objects it names, leave those out, render again (bounded). The configuration that passes
//! must route every valid tenant's host.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use portcullis::attribution::{Quarantine, culprits};
use portcullis::check::{CheckError, check_config};
use portcullis::objects::{Kind, Object};
use portcullis::pipeline::{Output, Pipeline};
use portcullis::store::Store;
use portcullis::translate::TranslateConfig;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn haproxy() -> String {
    if std::path::Path::new("/usr/sbin/haproxy").exists() {
        "/usr/sbin/haproxy".into()
    } else {
        "haproxy".into()
    }
}

/// Annotations a tenant may set on its Ingress (route scope) or Service (backend scope).
const INGRESS_KEYS: &[&str] = &[
    "haproxy.org/path-rewrite",
    "haproxy.org/request-set-header",
    "haproxy.org/response-set-header",
    "haproxy.org/set-host",
    "haproxy.org/allow-list",
    "haproxy.org/deny-list",
    "haproxy.org/request-redirect",
    "haproxy.org/request-capture",
    "haproxy.org/cors-enable",
    "haproxy.org/cors-allow-origin",
    "haproxy.org/timeout-server",
    "haproxy.org/rate-limit-requests",
];
const SERVICE_KEYS: &[&str] = &[
    "haproxy.org/route-acl",
    "haproxy.org/load-balance",
    "haproxy.org/check-http",
    "haproxy.org/timeout-connect",
    "haproxy.org/cookie-persistence",
];

/// Break-out material and values that pass a Rust parser but not HAProxy's.
const FRAGMENTS: &[&str] = &[
    "\n",
    "#",
    "'",
    "\"",
    "\\",
    "%[env(HOME)]",
    "${HOME}",
    " lua-load /tmp/x.lua",
    "/etc/passwd",
    "}",
    "{",
    " ",
    "true",
    "10s",
    "/api",
    "X-A",
    "10.0.0.0/8",
    "^/x",
    "(?u)^/x /y",
    "^/a{65536} /b",
    "\\u0041 /c",
    "\\U00000041",
    "path_reg (?u)x",
    "cookie(staging) -m reg (?u)a",
    "https://a.example",
    "~",
];

fn hostile_value() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(FRAGMENTS), 1..4).prop_map(|p| p.concat())
}

/// Whole values, each in its place, that typed parsers have let through and HAProxy refused.
const REFUSED_BY_HAPROXY: &[(&str, &str)] = &[
    ("haproxy.org/path-rewrite", "(?u)^/x /y"),
    ("haproxy.org/path-rewrite", "^/a{65536} /b"),
    ("haproxy.org/path-rewrite", "\\u0041 /c"),
    ("haproxy.org/path-rewrite", "\\U00000041 /c"),
    ("haproxy.org/cors-allow-origin", "^https://(?u)a$"),
];

/// An annotation of `keys` with a hostile value, or one of the values HAProxy refused.
fn hostile_pair(keys: &'static [&'static str]) -> impl Strategy<Value = (&'static str, String)> {
    prop_oneof![
        (prop::sample::select(keys), hostile_value()),
        prop::sample::select(REFUSED_BY_HAPROXY).prop_map(|(k, v)| (k, v.to_string())),
    ]
}

/// A hostile tenant's annotations (a valid tenant is `None`).
#[derive(Debug, Clone)]
struct Tenant {
    ingress: Vec<(&'static str, String)>,
    service: Vec<(&'static str, String)>,
}

fn tenant() -> impl Strategy<Value = Option<Tenant>> {
    let pairs = |keys: &'static [&'static str]| prop::collection::vec(hostile_pair(keys), 0..3);
    prop::option::weighted(
        0.5,
        (pairs(INGRESS_KEYS), pairs(SERVICE_KEYS))
            .prop_map(|(ingress, service)| Tenant { ingress, service }),
    )
}

fn annotations(list: &[(&str, String)]) -> Value {
    let mut map = Map::new();
    for (k, v) in list {
        map.insert((*k).to_string(), Value::String(v.clone()));
    }
    Value::Object(map)
}

fn objects(i: usize, t: Option<&Tenant>) -> Vec<Object> {
    let ns = format!("t{i}");
    let (ia, sa) = t.map_or((json!({}), json!({})), |t| {
        let mut ingress = t.ingress.clone();
        // CORS settings act only with CORS on.
        if ingress.iter().any(|(k, _)| k.contains("cors")) {
            ingress.push(("haproxy.org/cors-enable", "true".into()));
        }
        (annotations(&ingress), annotations(&t.service))
    });
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": ns, "annotations": sa},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    });
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "namespace": ns,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": [format!("10.0.{i}.1")], "conditions": {"ready": true}}]
    });
    let ingress = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "site", "namespace": ns, "annotations": ia},
        "spec": {"ingressClassName": "portcullis", "rules": [{"host": format!("t{i}.example"),
            "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                {"path": "/api", "pathType": "Exact",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
    });
    [service, slice, ingress]
        .into_iter()
        .filter_map(|v| Object::from_value(v).ok())
        .collect()
}

/// Renders, checks with HAProxy, leaves out what it refuses, until it passes (bounded).
fn applied(pipeline: &Pipeline, mut store: Store) -> Result<Output, String> {
    let mut quarantine = Quarantine::default();
    for _ in 0..16 {
        quarantine.exclude(&mut store);
        let output = pipeline.run(&store).map_err(|e| e.to_string())?;
        let messages = match check_config(&haproxy(), &output.rendered) {
            Ok(()) => return Ok(output),
            Err(CheckError::Rejected { messages }) => messages,
            Err(e) => return Err(e.to_string()),
        };
        let found = culprits(&messages, &output.rendered, &output.model, &store);
        let tenant = |k: Kind| matches!(k, Kind::Ingress | Kind::Service | Kind::Tcp);
        let mut held = 0;
        for c in found.iter().filter(|c| tenant(c.object.kind)) {
            held += usize::from(quarantine.hold(c, &store));
        }
        if held == 0 {
            return Err(format!("refused, and traced to no tenant: {messages:?}"));
        }
    }
    Err("still refused after 16 rounds".into())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_valid_tenant_keeps_its_routes(tenants in prop::collection::vec(tenant(), 2..6)) {
        let pipeline = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
        let store = Store::from_objects(
            tenants
                .iter()
                .enumerate()
                .flat_map(|(i, t)| objects(i, t.as_ref()))
                .chain([Object::from_value(json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "portcullis"}, "spec": {"controller": "portcullis.io/ingress"}})).unwrap()]),
        );
        let output = applied(&pipeline, store).unwrap();
        for (i, t) in tenants.iter().enumerate() {
            if t.is_some() {
                continue;
            }
            let host = format!("t{i}.example");
            let backend = format!("t{i}_web_80");
            let routed = |entries: &[portcullis::model::MapEntry], key: &str| {
                entries.iter().any(|e| &*e.key == key && e.value.starts_with(&backend))
            };
            prop_assert!(routed(&output.model.maps.prefix, &format!("{host}/")), "{host}/ lost");
            prop_assert!(routed(&output.model.maps.exact, &format!("{host}/api")), "{host}/api lost");
            let cfg = output.rendered.haproxy_cfg();
            prop_assert!(cfg.contains(&format!("backend {backend}\n")), "backend {backend} lost");
        }
    }
}
