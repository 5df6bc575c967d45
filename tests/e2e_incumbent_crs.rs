//! The incumbent's Backend, Defaults and Global resources against a real HAProxy: a Backend
//! named by `cr-backend` changes how a backend balances (seen in haproxy.cfg and in which
//! pods answer), follows edits of the resource, and a reference to a missing one falls back
//! to the annotations with an error; `cr-global` and `cr-defaults` take precedence over the
//! controller ConfigMap's keys (the incumbent's global ConfigMap suite, `maxconn`). Against
//! the test API server, Backend resources are watched when served, and their absence is a
//! notice.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/apiserver.rs"]
mod apiserver;
mod support;

use std::time::Duration;

use apiserver::{ApiServer, ResourceDef};
use support::*;

const NS: &str = "app";
const HOST: &str = "web.example.com";

fn backend_cr(algorithm: &str) -> String {
    format!(
        "apiVersion: ingress.v3.haproxy.org/v3\nkind: Backend\nmetadata:\n  name: sticky\n  namespace: {NS}\n\
         spec:\n  balance: {{algorithm: {algorithm}}}\n  server_timeout: 7000\n  abortonclose: enabled\n"
    )
}

fn backend_section(h: &Harness) -> Vec<String> {
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    let header = format!("backend {NS}_web_80");
    let mut lines = cfg.lines().skip_while(|l| l.trim() != header);
    assert!(lines.next().is_some(), "no {header} in:\n{cfg}");
    lines
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn a_backend_resource_reaches_haproxy_cfg_and_traffic() {
    let mut h = Harness::new();
    let (a, b) = (h.echo("web-a"), h.echo("web-b"));
    h.write(
        "web.yaml",
        &format!(
            "{}---\n{}",
            service(NS, "web", &[("haproxy.org/cr-backend", "app/sticky")]),
            endpoint_slices(NS, "web", &[("a", a, true), ("b", b, true)])
        ),
    );
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "web",
            &[route(Some(HOST), "/", "Prefix", "web")],
            None,
            &[],
        ),
    );
    h.write("backend.yaml", &backend_cr("source"));
    h.start(&[]);

    // `balance source`: one client address, one pod.
    let be = backend_section(&h);
    assert!(be.contains(&"balance source".to_string()), "{be:#?}");
    assert!(be.contains(&"timeout server 7000".to_string()), "{be:#?}");
    assert_eq!(h.answering(HOST, "/", 8).len(), 1);
    wait_until(APPLY_TIMEOUT, "the unmapped field is reported", || {
        h.log().contains("Backend app/sticky: spec.abortonclose")
    });

    // The resource is edited: round robin reaches both pods.
    h.write("backend.yaml", &backend_cr("roundrobin"));
    wait_until(APPLY_TIMEOUT, "both pods answer", || {
        h.answering(HOST, "/", 4).len() == 2
    });
    assert!(backend_section(&h).contains(&"balance roundrobin".to_string()));

    // Back to source, then the resource goes away: the reference is an error and the
    // backend falls back to its annotations (none: round robin, no backend timeout).
    h.write("backend.yaml", &backend_cr("source"));
    wait_until(APPLY_TIMEOUT, "one pod answers", || {
        h.answering(HOST, "/", 6).len() == 1
    });
    h.remove("backend.yaml");
    wait_until(APPLY_TIMEOUT, "both pods answer again", || {
        h.answering(HOST, "/", 4).len() == 2
    });
    let be = backend_section(&h);
    assert!(
        !be.iter().any(|l| l.starts_with("timeout server")),
        "{be:#?}"
    );
    wait_until(APPLY_TIMEOUT, "the missing Backend is reported", || {
        h.log().contains(
            "Service app/web: annotation haproxy.org/cr-backend: Backend app/sticky does not exist",
        )
    });
}

fn config_map(extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: portcullis\n  namespace: ingress\n\
         data:\n  maxconn: \"1000\"\n  timeout-client: 30s\n{extra}"
    )
}

fn show_info(h: &Harness, field: &str) -> Option<String> {
    h.runtime("show info\n")
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}: ")).map(str::to_string))
}

fn defaults_section(h: &Harness) -> Vec<String> {
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    cfg.lines()
        .skip_while(|l| l.trim() != "defaults")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.trim().to_string())
        .collect()
}

/// The incumbent's global ConfigMap suite sets `maxconn` and reads it back from HAProxy; here
/// the same through the ConfigMap, then through a Global resource named by `cr-global` (which
/// wins over the key), with a Defaults resource named by `cr-defaults` beside it.
#[test]
fn cr_global_and_cr_defaults_take_precedence_over_the_config_map() {
    let mut h = Harness::new();
    let backend = h.backend(NS, "web");
    h.write("web.yaml", &backend);
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "web",
            &[route(Some(HOST), "/", "Prefix", "web")],
            None,
            &[],
        ),
    );
    h.write("configmap.yaml", &config_map(""));
    h.write(
        "resources.yaml",
        "apiVersion: ingress.v3.haproxy.org/v3\nkind: Global\nmetadata: {name: myglobal, namespace: ingress}\n\
         spec:\n  performance_options: {maxconn: 1007}\n  hard_stop_after: 30000\n---\n\
         apiVersion: ingress.v3.haproxy.org/v3\nkind: Defaults\nmetadata: {name: mydefaults, namespace: ingress}\n\
         spec:\n  client_timeout: 45000\n  redispatch: {enabled: enabled}\n",
    );
    h.start(&["--configmap", "ingress/portcullis"]);
    assert_eq!(show_info(&h, "Maxconn").as_deref(), Some("1000"));
    assert!(defaults_section(&h).contains(&"timeout client 30000".to_string()));

    h.write(
        "configmap.yaml",
        &config_map("  cr-global: ingress/myglobal\n  cr-defaults: mydefaults\n"),
    );
    wait_until(
        APPLY_TIMEOUT,
        "HAProxy runs with the Global's maxconn",
        || show_info(&h, "Maxconn").as_deref() == Some("1007"),
    );
    assert!(defaults_section(&h).contains(&"timeout client 45000".to_string()));
    assert_eq!(h.who(HOST, "/"), "web");
    wait_until(APPLY_TIMEOUT, "the unmapped field is reported", || {
        h.log()
            .contains("Defaults ingress/mydefaults: spec.redispatch")
    });
}

/// The test API server, with the Backend resource served or not, and `web` behind an Ingress
/// whose Service names Backend `app/sticky`.
fn cluster(
    h: &mut Harness,
    serve_backends: bool,
) -> (tokio::runtime::Runtime, std::sync::Arc<ApiServer>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut builder = ApiServer::builder()
        .list_items_without_type_meta()
        .bookmark_interval(Duration::from_secs(1));
    if serve_backends {
        builder = builder.with_resource(ResourceDef::new(
            "ingress.v3.haproxy.org/v3",
            "Backend",
            "backends",
            true,
        ));
    }
    let server = std::sync::Arc::new(rt.block_on(builder.start()));
    // The IngressClass the Ingresses name: without it they are not served.
    server.apply_yaml(INGRESS_CLASS);
    let (a, b) = (h.echo("web-a"), h.echo("web-b"));
    server.apply_yaml(&format!(
        "{}---\n{}---\n{}",
        service(NS, "web", &[("cr-backend", "sticky")]),
        endpoint_slices(NS, "web", &[("a", a, true), ("b", b, true)]),
        ingress(
            NS,
            "web",
            &[route(Some(HOST), "/", "Prefix", "web")],
            None,
            &[]
        )
    ));
    let kubeconfig = h.work().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig, None);
    h.use_kubeconfig(&kubeconfig);
    (rt, server)
}

const CLUSTER_FLAGS: &[&str] = &[
    "--pod-name",
    "solo",
    "--pod-namespace",
    "ingress",
    "--allow-local-endpoints",
];

#[test]
fn backend_resources_are_watched_in_a_cluster() {
    let mut h = Harness::new();
    let (_rt, server) = cluster(&mut h, true);
    server.apply_yaml(&backend_cr("source"));
    h.start(CLUSTER_FLAGS);
    assert!(backend_section(&h).contains(&"balance source".to_string()));
    assert_eq!(h.answering(HOST, "/", 6).len(), 1);
    server.apply_yaml(&backend_cr("roundrobin"));
    wait_until(APPLY_TIMEOUT, "the edited Backend applies", || {
        backend_section(&h).contains(&"balance roundrobin".to_string())
    });
    wait_until(APPLY_TIMEOUT, "both pods answer", || {
        h.answering(HOST, "/", 4).len() == 2
    });
}

#[test]
fn a_backend_resource_that_is_not_served_is_a_notice_and_the_reference_an_error() {
    let mut h = Harness::new();
    let (_rt, _server) = cluster(&mut h, false);
    h.start(CLUSTER_FLAGS);
    assert_eq!(h.answering(HOST, "/", 4).len(), 2);
    wait_until(APPLY_TIMEOUT, "the reference is reported", || {
        h.log()
            .contains("Service app/web: annotation cr-backend: Backend app/sticky does not exist")
    });
    assert!(
        h.log().contains(
            "the Backend resource (ingress.v3.haproxy.org/v3, backends) is not installed"
        ),
        "{}",
        log_tail(&h.log(), 30)
    );
}
