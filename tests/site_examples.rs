//! The example site scripts in docs/examples/scripts (shown in docs/scripting.md) do what the
//! docs say, layered over the bundled scripts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use portcullis::objects::Object;
use portcullis::store::Store;
use portcullis::translate::TranslateConfig;
use serde_json::json;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples/scripts");
const CERT: &str = include_str!("fixtures/tls/rsa.crt");
const KEY: &str = include_str!("fixtures/tls/rsa.key");

fn tls_ingress(name: &str, host: &str, annotations: &serde_json::Value) -> Object {
    Object::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": "corp", "annotations": annotations},
        "spec": {"ingressClassName": "portcullis",
                 "tls": [{"hosts": [host], "secretName": "tls"}],
                 "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                     "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
    }))
    .unwrap()
}

#[test]
fn the_documented_site_scripts_work() {
    let objects = vec![
        Object::from_value(json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "portcullis"}, "spec": {"controller": "portcullis.io/ingress"}})).unwrap(),
        Object::from_value(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "corp"}, "spec": {"ports": [{"port": 80}]}}))
        .unwrap(),
        Object::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "tls", "namespace": "corp"},
            "stringData": {"tls.crt": CERT, "tls.key": KEY}}))
        .unwrap(),
        // Opted out of redirects, but under corp.example.com: the site policy wins.
        tls_ingress(
            "wiki",
            "wiki.corp.example.com",
            &json!({"haproxy.org/ssl-redirect": "false"}),
        ),
        // Elsewhere the Ingress decides.
        tls_ingress(
            "shop",
            "shop.example.org",
            &json!({"haproxy.org/ssl-redirect": "false",
            "portcullis.io/hsts": "true", "haproxy.org/response-set-header": "Cache-Control no-store"}),
        ),
    ];
    let pipeline = portcullis::source::site::load_pipeline(
        Some(Path::new(EXAMPLES)),
        None,
        TranslateConfig::default(),
    )
    .unwrap();
    let out = pipeline.run(&Store::from_objects(objects)).unwrap();
    assert!(out.diagnostics.is_empty(), "{:?}", out.diagnostics);

    let redirects: Vec<(&str, &str)> = out
        .model
        .maps
        .ssl_redirect
        .iter()
        .map(|e| (&*e.key, &*e.value))
        .collect();
    assert_eq!(redirects, [("wiki.corp.example.com", "308")]);

    let cfg = out.rendered.haproxy_cfg();
    assert!(
        cfg.contains("http-response set-header Cache-Control 'no-store'"),
        "{cfg}"
    );
    assert!(
        cfg.contains("http-response set-header Strict-Transport-Security 'max-age=31536000; includeSubDomains'"),
        "{cfg}"
    );
    portcullis::check::check_config("haproxy", &out.rendered).unwrap();
}
