//! Hostile input never reaches an output file. Every annotation, ConfigMap key, host, path and
//! reference carrying a break-out attempt is refused with an error naming the object and the
//! field; everything else still renders and passes `haproxy -c`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::needless_pass_by_value, clippy::type_complexity)]

use clap::Parser;
use portcullis::cli::{Cli, Command};
use portcullis::objects::Object;
use portcullis::pipeline::Pipeline;
use portcullis::store::Store;
use serde_json::json;

/// Break-out attempts; each carries the marker `PWN`, which must appear in no output file.
const PAYLOADS: &[&str] = &[
    "1\nPWN /x",
    "1s\n  lua-load /PWN",
    "1 #PWN",
    "'PWN'",
    "\"PWN\"",
    "%[env(PWN)]",
    "$PWN",
    "${PWN}",
    " PWN /x",
    "1\rPWN",
    "1\u{0}PWN",
];

/// Backend-scope annotations, set on a Service.
const SERVICE_ANNOTATIONS: &[&str] = &[
    "load-balance",
    "check",
    "check-http",
    "check-interval",
    "timeout-server",
    "timeout-connect",
    "timeout-queue",
    "timeout-tunnel",
    "timeout-check",
    "pod-maxconn",
    "server-ssl",
    "server-proto",
    "forwarded-for",
    "scale-server-slots",
    // Read by route hooks, from the Service a path routes to.
    "route-acl",
    "standalone-backend",
    "cookie-persistence",
    "cookie-persistence-no-dynamic",
    "send-proxy-protocol",
];

/// Route-scope annotations, set on an Ingress.
const INGRESS_ANNOTATIONS: &[&str] = &[
    "set-host",
    "request-set-header",
    "response-set-header",
    "path-rewrite",
    "allow-list",
    "deny-list",
    "ssl-redirect",
    "ssl-redirect-code",
    "request-redirect",
    "request-capture",
    "src-ip-header",
    "standalone-backend",
    "rate-limit-requests",
    "rate-limit-period",
    "rate-limit-size",
    "rate-limit-status-code",
    "rate-limit-whitelist",
    // Only these are read while their feature is off; the other auth-, cors- and hsts-
    // settings are read once it is on (their parsers are covered by hostile_inputs.rs).
    "auth-type",
    "auth-realm",
    "cors-enable",
    "hsts",
];

/// Global keys, set in the controller ConfigMap.
const CONFIGMAP_KEYS: &[&str] = &[
    "timeout-client",
    "timeout-http-request",
    "timeout-http-keep-alive",
    "timeout-server",
];

fn object(v: serde_json::Value) -> Object {
    Object::from_value(v).unwrap()
}

fn service(name: &str, annotations: serde_json::Value) -> Vec<Object> {
    vec![
        object(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "inj", "annotations": annotations},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        })),
        object(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "inj",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.0.0.1"]}]
        })),
    ]
}

fn path(p: &str, service: &str) -> serde_json::Value {
    json!({"path": p, "pathType": "Prefix",
           "backend": {"service": {"name": service, "port": {"number": 80}}}})
}

/// One Ingress per case: a good rule that must survive, plus the hostile parts.
fn ingress(
    name: &str,
    annotations: serde_json::Value,
    extra_rules: serde_json::Value,
    tls: serde_json::Value,
    service: &str,
) -> Object {
    let mut rules = vec![json!({"host": format!("{name}.example.com"),
                                 "http": {"paths": [path("/ok", service)]}})];
    rules.extend(extra_rules.as_array().cloned().unwrap_or_default());
    object(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": "inj", "annotations": annotations},
        "spec": {"ingressClassName": "portcullis", "rules": rules, "tls": tls}
    }))
}

/// (object, field) pairs that must each be named by a diagnostic.
type Expected = Vec<(String, String)>;

fn hostile_cluster() -> (Vec<Object>, Expected, Vec<String>) {
    let mut objects = service("web", json!({}));
    let mut expected = Vec::new();
    let mut good_hosts = Vec::new();
    let mut configmap = serde_json::Map::new();
    for (i, payload) in PAYLOADS.iter().enumerate() {
        // Backend scope: a Service per payload carrying every backend annotation.
        let svc = format!("svc{i}");
        let mut svc_annotations = serde_json::Map::new();
        for a in SERVICE_ANNOTATIONS {
            svc_annotations.insert(format!("haproxy.org/{a}"), json!(payload));
            expected.push((
                format!("Service inj/{svc}"),
                format!("annotation haproxy.org/{a}"),
            ));
        }
        objects.extend(service(&svc, serde_json::Value::Object(svc_annotations)));

        // Route scope, hosts, paths, TLS hosts and references on an Ingress per payload.
        let name = format!("ing{i}");
        let mut ing_annotations = serde_json::Map::new();
        for a in INGRESS_ANNOTATIONS {
            ing_annotations.insert(format!("ingress.kubernetes.io/{a}"), json!(payload));
            expected.push((
                format!("Ingress inj/{name}"),
                format!("annotation ingress.kubernetes.io/{a}"),
            ));
        }
        let rules = json!([
            {"host": format!("h{i}{payload}.example.com"), "http": {"paths": [path("/", "web")]}},
            {"host": format!("p{i}.example.com"), "http": {"paths": [
                path(&format!("/{payload}"), "web"),
                {"path": "/svc", "pathType": "Prefix",
                 "backend": {"service": {"name": format!("web{payload}"), "port": {"number": 80}}}},
                {"path": "/port", "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"name": format!("http{payload}")}}}},
            ]}},
        ]);
        // With the Ingress' own host besides the hostile one: an entry left with no host the
        // Ingress routes is ignored whole, and the hostile Secret name would not be read.
        let tls = json!([{"hosts": [format!("t{i}{payload}"), format!("{name}.example.com")],
                          "secretName": format!("s{payload}")}]);
        for field in [
            "spec.rules[1].host",
            "spec.rules[2].http.paths[0].path",
            "spec.rules[2].http.paths[1].backend.service.name",
            "spec.rules[2].http.paths[2].backend.service.port",
            "spec.tls[0].hosts[0]",
            "spec.tls[0].secretName",
        ] {
            expected.push((format!("Ingress inj/{name}"), field.to_string()));
        }
        objects.push(ingress(
            &name,
            serde_json::Value::Object(ing_annotations),
            rules,
            tls,
            &svc,
        ));
        good_hosts.push(format!("{name}.example.com/ok"));

        configmap.insert(
            CONFIGMAP_KEYS[i % CONFIGMAP_KEYS.len()].to_string(),
            json!(payload),
        );
    }
    for key in configmap.keys() {
        expected.push(("ConfigMap inj/config".to_string(), format!("key {key}")));
    }
    objects.push(object(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "config", "namespace": "inj"},
        "data": configmap
    })));
    (objects, expected, good_hosts)
}

/// The pipeline as `portcullis render --configmap inj/config` builds it.
fn pipeline() -> Pipeline {
    let cli = Cli::try_parse_from([
        "portcullis",
        "render",
        "--manifests",
        "unused",
        "--configmap",
        "inj/config",
    ])
    .unwrap();
    let Command::Render(args) = cli.command else {
        unreachable!("parsed a render command")
    };
    Pipeline::load(None, None, args.pipeline.translate_config()).unwrap()
}

#[test]
fn hostile_values_are_refused_named_and_contained() {
    let (objects, expected, good_hosts) = hostile_cluster();
    let output = pipeline().run(&Store::from_objects(objects)).unwrap();

    // 1. Nothing hostile in any output file.
    for (name, bytes) in output.rendered.files() {
        let text = String::from_utf8_lossy(&bytes.bytes()).into_owned();
        assert!(!text.contains("PWN"), "{name} carries a payload:\n{text}");
    }

    // 2. Every hostile field is reported against its object and field.
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    let mut missing = Vec::new();
    for (object, field) in &expected {
        let found = diagnostics
            .iter()
            .any(|d| d.contains(&format!("{object}: {field}")));
        if !found {
            missing.push(format!("{object}: {field}"));
        }
    }
    assert!(
        missing.is_empty(),
        "not reported:\n{}\n\ndiagnostics:\n{}",
        missing.join("\n"),
        diagnostics.join("\n")
    );

    // 3. The rest still renders: every good route is there, with its backend.
    let exact: Vec<&str> = output.model.maps.exact.iter().map(|e| &*e.key).collect();
    for host in &good_hosts {
        assert!(
            exact.contains(&host.as_str()),
            "{host} missing from {exact:?}"
        );
    }
    // One backend per payload Service; `web` is only referenced by refused paths.
    assert_eq!(output.model.backends.len(), PAYLOADS.len());

    // 4. And HAProxy accepts it.
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}

#[test]
fn a_script_cannot_smuggle_raw_text_past_the_settings_parser() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("evil.rhai"),
        r#"// Scope: backend, route
        // Risk: low
        fn backend(ctx) { #{ balance: "roundrobin\n  lua-load /PWN", maxconn: 10 } }
        fn route(ctx) { #{ request_headers: [["X-A", "b' lua-load /PWN '"]], set_host: "a.com" } }
        "#,
    )
    .unwrap();
    let mut config = pipeline().config;
    config.config_map = None;
    let pipeline = Pipeline::load(Some(dir.path()), None, config).unwrap();
    let (objects, _, _) = hostile_cluster();
    let output = pipeline.run(&Store::from_objects(objects)).unwrap();
    for (name, bytes) in output.rendered.files() {
        assert!(
            !String::from_utf8_lossy(&bytes.bytes()).contains("PWN"),
            "{name}"
        );
    }
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    assert!(
        diagnostics
            .iter()
            .any(|d| d.contains("evil.rhai") && d.contains("setting balance")),
        "{diagnostics:?}"
    );
    assert!(
        diagnostics
            .iter()
            .any(|d| d.contains("evil.rhai") && d.contains("setting request_headers")),
        "{diagnostics:?}"
    );
    // The script's valid settings still apply.
    assert!(
        output
            .model
            .backends
            .iter()
            .all(|b| b.settings.maxconn == Some(10))
    );
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}
