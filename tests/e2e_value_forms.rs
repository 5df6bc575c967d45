//! End-to-end: the incumbent controller's annotation names and value forms on a real HAProxy.
//! Header values in double quotes and with sample fetches are set as HAProxy evaluates them,
//! bare and `haproxy.com/` annotation names are read (in their documented precedence), two
//! `path-rewrite` rules apply in order, `load-balance` options pass `haproxy -c` and balance,
//! `check-http` with a version and a Host header keeps the pods up, the incumbent's own
//! frontend snippet (a backslash-escaped space) works, and an unknown annotation is reported.
//!
//! One `portcullis run` serves every case; every loop is bounded in count and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/apiserver.rs"]
mod apiserver;
mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use apiserver::ApiServer;

use support::{
    APPLY_TIMEOUT, Harness, INGRESS_CLASS, annotated, annotated_site, endpoint_slices, ingress,
    route, service, wait_until,
};

const NS: &str = "forms";

/// The value of header `name` (lowercase) in an echo body, which lists the `x-` headers the
/// pod received.
fn echoed<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
}

/// The request line the pod saw: `<pod> <method> <target> host=<host>`.
fn target(body: &str) -> &str {
    body.lines()
        .next()
        .and_then(|l| l.split(' ').nth(2))
        .unwrap_or_default()
}

/// A Service of `pods` echo pods named `<name>-<i>` with these annotations, and an Ingress
/// routing `host` to it.
fn pods_site(h: &mut Harness, name: &str, host: &str, pods: usize, svc: &[(&str, &str)]) -> String {
    let ports: Vec<(String, u16)> = (0..pods)
        .map(|i| {
            let pod = format!("{name}-{i}");
            let port = h.echo(&pod);
            (pod, port)
        })
        .collect();
    let endpoints: Vec<(&str, u16, bool)> =
        ports.iter().map(|(n, p)| (n.as_str(), *p, true)).collect();
    format!(
        "{}---\n{}---\n{}",
        service(NS, name, svc),
        endpoint_slices(NS, name, &endpoints),
        ingress(
            NS,
            name,
            &[route(Some(host), "/", "Prefix", name)],
            None,
            &[]
        ),
    )
}

#[test]
fn the_incumbents_names_and_value_forms_work_on_haproxy() {
    let mut h = Harness::new();
    let headers = annotated_site(
        &mut h,
        (NS, "headers", "headers.example.com"),
        &[],
        &[
            (
                "haproxy.org/request-set-header",
                "X-Cache \"no-store,no-cache,private\"\nX-Client %[src]\nX-Quoted \"say \\\"hi\\\" # it's 100%% \\\\o/\"\nX-Host %[req.hdr(host),upper]",
            ),
            (
                "haproxy.org/response-set-header",
                "Cache-Control \"no-store,no-cache,private\"\nX-Status %[status]",
            ),
            // Misspelt: reported, with the name it is close to.
            ("haproxy.org/tiemout-server", "5s"),
        ],
    );
    // Bare and haproxy.com/ names, as the incumbent's own e2e templates write them; the
    // prefixed name wins over the bare one on the same object.
    let bare = annotated_site(
        &mut h,
        (NS, "bare", "bare.example.com"),
        &[],
        &[
            ("request-set-header", "X-From bare\nX-Bare yes"),
            ("haproxy.org/request-set-header", "X-From prefixed"),
            ("haproxy.com/response-set-header", "X-Com yes"),
        ],
    );
    let rewrite = annotated_site(
        &mut h,
        (NS, "rewrite", "rewrite.example.com"),
        &[],
        &[(
            "haproxy.org/path-rewrite",
            "/foo/(.*) /\\1\n/bar/(.*) /baz/\\1",
        )],
    );
    let uri_whole = pods_site(
        &mut h,
        "uri",
        "uri.example.com",
        3,
        &[("haproxy.org/load-balance", "uri whole")],
    );
    let random = pods_site(
        &mut h,
        "random",
        "random.example.com",
        3,
        &[("haproxy.org/load-balance", "random(2)")],
    );
    let checked = pods_site(
        &mut h,
        "checked",
        "checked.example.com",
        2,
        &[
            (
                "haproxy.org/check-http",
                "HEAD /healthz HTTP/1.1\\r\\nHost:\\ health.example.com",
            ),
            ("haproxy.org/check-interval", "200ms"),
        ],
    );
    let config = annotated(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: portcullis\n  namespace: forms\n",
        &[],
    ) + "data:\n  frontend-config-snippet: |\n    unique-id-format %{+X}o\\ %ci:%cp_%fi:%fp_%Ts_%rt:%pid\n    unique-id-header X-Unique-ID\n";
    h.write(
        "all.yaml",
        &[headers, bare, rewrite, uri_whole, random, checked, config].join("---\n"),
    );
    h.start(&["--configmap", "forms/portcullis", "--allow-config-snippets"]);

    // Quoted values and sample fetches, as HAProxy evaluates them.
    let answer = h.get("headers.example.com", "/x");
    assert_eq!(answer.status, 200, "{answer:?}\n{}", h.log());
    let body = &answer.body;
    assert_eq!(
        echoed(body, "x-cache"),
        Some("no-store,no-cache,private"),
        "{body}"
    );
    assert_eq!(echoed(body, "x-client"), Some("127.0.0.1"), "{body}");
    assert_eq!(
        echoed(body, "x-quoted"),
        Some("say \"hi\" # it's 100% \\o/"),
        "{body}"
    );
    assert_eq!(
        echoed(body, "x-host"),
        Some("HEADERS.EXAMPLE.COM"),
        "{body}"
    );
    assert_eq!(
        answer.header("cache-control"),
        Some("no-store,no-cache,private")
    );
    assert_eq!(answer.header("x-status"), Some("200"));

    // Bare and haproxy.com/ names.
    let body = h.get("bare.example.com", "/").body;
    assert_eq!(echoed(&body, "x-from"), Some("prefixed"), "{body}");
    assert_eq!(
        echoed(&body, "x-bare"),
        None,
        "the prefixed value replaces the bare one"
    );
    assert_eq!(h.get("bare.example.com", "/").header("x-com"), Some("yes"));

    // Two rewrite rules, the second applied to what the first left.
    assert_eq!(
        target(&h.get("rewrite.example.com", "/foo/bar/x").body),
        "/baz/x"
    );
    assert_eq!(target(&h.get("rewrite.example.com", "/foo/y").body), "/y");

    // `uri whole`: one URI (query string included) always goes to the same pod; different
    // URIs spread.
    let same: BTreeSet<String> = (0..9).map(|_| h.who("uri.example.com", "/a?x=1")).collect();
    assert_eq!(same.len(), 1, "{same:?}");
    let spread: BTreeSet<String> = (0..40)
        .map(|i| h.who("uri.example.com", &format!("/a?x={i}")))
        .collect();
    assert!(spread.len() > 1, "{spread:?}");
    assert!(spread.iter().all(|w| w.starts_with("uri-")), "{spread:?}");
    let drawn: BTreeSet<String> = (0..40).map(|_| h.who("random.example.com", "/")).collect();
    assert!(
        drawn.len() > 1 && drawn.iter().all(|w| w.starts_with("random-")),
        "{drawn:?}"
    );

    // HTTP/1.1 checks with a Host header keep the pods up: after several check intervals
    // both pods still answer.
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(
        cfg.contains(
            "http-check send meth HEAD uri /healthz ver HTTP/1.1 hdr Host 'health.example.com'"
        ),
        "{cfg}"
    );
    wait_until(APPLY_TIMEOUT, "both pods' HTTP checks to pass", || {
        h.runtime("show stat\n")
            .lines()
            .filter(|l| l.starts_with("forms_checked_80,") && l.contains("L7OK"))
            .count()
            == 2
    });
    let up: BTreeSet<String> = (0..20).map(|_| h.who("checked.example.com", "/")).collect();
    assert_eq!(
        up,
        BTreeSet::from(["checked-0".to_string(), "checked-1".to_string()])
    );

    // The incumbent's frontend snippet, its escaped space included, is accepted and works:
    // `%{+X}o` prints what follows in hex, the client address first (127.0.0.1).
    let body = h.get("headers.example.com", "/").body;
    let id = echoed(&body, "x-unique-id").unwrap_or_else(|| panic!("{body}"));
    assert!(id.starts_with("7F000001:"), "{id:?}");
    assert_eq!(id.split('_').count(), 4, "{id:?}");

    // The misspelt annotation is reported, with the name it is close to.
    wait_until(APPLY_TIMEOUT, "the unknown annotation's warning", || {
        h.log().lines().any(|l| {
            l.contains("Ingress forms/headers")
                && l.contains("haproxy.org/tiemout-server")
                && l.contains("did you mean timeout-server")
        })
    });
}

/// From a cluster: the unknown annotation becomes a Warning Event on its Ingress, with the
/// suggestion, and a `haproxy.com/` annotation is applied.
#[test]
fn an_unknown_annotation_becomes_an_event_with_a_suggestion() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = Arc::new(
        rt.block_on(
            ApiServer::builder()
                .list_items_without_type_meta()
                .bookmark_interval(Duration::from_secs(1))
                .start(),
        ),
    );
    let mut h = Harness::new();
    // The IngressClass the Ingress names: without it, it is not served.
    server.apply_yaml(INGRESS_CLASS);
    server.apply_yaml(&h.backend(NS, "web"));
    server.apply_yaml(&annotated(
        &ingress(
            NS,
            "shop",
            &[route(Some("shop.example"), "/", "Prefix", "web")],
            None,
            &[],
        ),
        &[
            ("haproxy.org/tiemout-server", "5s"),
            ("haproxy.com/request-set-header", "X-Com %[src]"),
        ],
    ));
    let kubeconfig = h.work().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig, None);
    h.use_kubeconfig(&kubeconfig);
    h.start(&[
        "--pod-name",
        "solo",
        "--pod-namespace",
        "ingress",
        "--allow-local-endpoints",
    ]);
    let body = h.get("shop.example", "/").body;
    assert_eq!(echoed(&body, "x-com"), Some("127.0.0.1"), "{body}");
    let event = || {
        server.list("v1", "Event", Some(NS)).into_iter().find(|e| {
            e["involvedObject"]["name"] == "shop"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("haproxy.org/tiemout-server"))
        })
    };
    wait_until(APPLY_TIMEOUT, "an Event on the Ingress", || {
        event().is_some()
    });
    let event = event().unwrap();
    assert_eq!(event["involvedObject"]["kind"], "Ingress");
    assert_eq!(event["type"], "Warning");
    let message = event["message"].as_str().unwrap();
    assert!(
        message.contains("did you mean timeout-server?"),
        "{message}"
    );
}
