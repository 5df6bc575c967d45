//! A hostile tenant against a real HAProxy: objects that would route into the controller or
//! its node, or bind an address that is already taken. Each is added next to a victim
//! Ingress; a newcomer's Ingress must then go live while the victim keeps answering, nothing
//! of the admin endpoint may be served through HAProxy, the controller stays up with no
//! failed reload, and the hostile object gets a diagnostic naming it and the field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/apiserver.rs"]
mod apiserver;
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use support::*;

/// How long a newcomer's Ingress may take to go live next to a hostile object.
const LIVE_WITHIN: Duration = Duration::from_secs(10);

/// Paths of the admin endpoint a hostile route would reach.
const ADMIN_PATHS: &[&str] = &[
    "/debug/config",
    "/debug/model",
    "/debug/log-level",
    "/metrics",
    "/readyz",
    "/healthz",
];

/// Whether `body` is something the admin endpoint (not an echo server, which repeats the
/// request line, nor HAProxy's error page) wrote.
fn is_admin_content(body: &str) -> bool {
    body.contains("portcullis_")
        || body.contains("global\n")
        || body.contains("\"backends\"")
        || body.contains("not found\n")
        || body.contains("\"frontends\"")
        || body.contains("\"last_outcome\"")
        || body.contains("builder=off")
        || body == "ok\n"
}

/// A victim Ingress in `victim`, answering on `victim.example.com`.
fn victim(h: &mut Harness) {
    let backend = h.backend("victim", "victim");
    h.write("victim.yaml", &backend);
    h.write(
        "victim-ingress.yaml",
        &ingress(
            "victim",
            "victim",
            &[route(Some("victim.example.com"), "/", "Prefix", "victim")],
            None,
            &[],
        ),
    );
}

/// An Ingress of `ns` sending every path of `host` to Service `service`.
fn ingress_to(ns: &str, name: &str, host: &str, service: &str) -> String {
    ingress(
        ns,
        name,
        &[route(Some(host), "/", "Prefix", service)],
        None,
        &[],
    )
}

/// Waits until `portcullis run` has logged a diagnostic containing every one of `parts`.
fn wait_for_diagnostic(h: &Harness, parts: &[&str]) {
    wait_until(
        APPLY_TIMEOUT,
        &format!("a diagnostic with {parts:?}"),
        || h.log().lines().any(|l| parts.iter().all(|p| l.contains(p))),
    );
}

/// A `PUT` through HAProxy's HTTP frontend: the raw answer, or `None` when the connection
/// failed.
fn put_through(h: &Harness, host: &str, path: &str, body: &str) -> Option<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], h.http_port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!(
        "PUT {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    Some(String::from_utf8_lossy(&raw).into_owned())
}

/// Nothing of the admin endpoint comes back through HAProxy for `host`, and the log filter
/// cannot be changed through it.
fn no_admin_content_through(h: &Harness, host: &str) {
    let filter = h.admin("/debug/log-level").map(|a| a.body);
    for path in ADMIN_PATHS {
        if let Some(answer) = h.try_get(host, path) {
            assert!(
                !is_admin_content(&answer.body),
                "http://{host}{path} served admin content ({}):\n{}",
                answer.status,
                answer.body
            );
        }
    }
    if let Some(answer) = put_through(h, host, "/debug/log-level", "debug") {
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        assert!(
            !is_admin_content(body) && !body.starts_with("debug"),
            "PUT /debug/log-level through {host} reached the admin endpoint:\n{answer}"
        );
    }
    assert_eq!(
        h.admin("/debug/log-level").map(|a| a.body),
        filter,
        "the log filter changed"
    );
}

/// After a hostile object: the diagnostic naming it and its field, a newcomer's Ingress live
/// within [`LIVE_WITHIN`], the victim unchanged, no failed reload, the controller up.
fn survives(h: &mut Harness, round: &str, diagnostic: &[&str]) {
    wait_for_diagnostic(h, diagnostic);
    let newcomer = format!("newcomer-{round}");
    let host = format!("{newcomer}.example.com");
    let backend = h.backend("newcomer", &newcomer);
    h.write(&format!("{newcomer}.yaml"), &backend);
    h.write(
        &format!("{newcomer}-ingress.yaml"),
        &ingress_to("newcomer", &newcomer, &host, &newcomer),
    );
    wait_until(LIVE_WITHIN, &format!("{host} goes live"), || {
        h.try_get(&host, "/").is_some_and(|a| a.who() == newcomer)
    });
    assert_eq!(h.who("victim.example.com", "/"), "victim");
    assert_eq!(h.reloads().1, 0, "a reload failed:\n{}", h.log());
    let (status, readyz) = h.readyz().expect("the admin endpoint answers");
    assert_eq!(status, 200, "{readyz}");
    assert!(readyz["last_error"].is_null(), "{readyz}");
    assert!(
        h.wait_exit(Duration::ZERO).is_none(),
        "the controller exited:\n{}",
        h.log()
    );
}

/// A Service of `evil` pointing at `external_name` on the admin port, and an Ingress routing
/// `<service>.example.com/debug` to it and the rest of that host to an `evil` pod of its own
/// (`<service>-pod`), which a refused path must not fall through to.
fn external_name_to(h: &mut Harness, service: &str, external_name: &str) -> String {
    let pod = format!("{service}-pod");
    let host = format!("{service}.example.com");
    let pod_backend = h.backend("evil", &pod);
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {service}\n  namespace: evil\n\
         spec:\n  type: ExternalName\n  externalName: {external_name:?}\n  \
         ports:\n    - {{name: http, port: 80, targetPort: {}}}\n---\n{}---\n{}",
        h.admin_port,
        pod_backend,
        ingress(
            "evil",
            service,
            &[
                route(Some(&host), "/", "Prefix", &pod),
                route(Some(&host), "/debug", "Prefix", service),
                route(Some(&host), "/metrics", "Prefix", service),
            ],
            None,
            &[],
        )
    )
}

/// The refused ExternalName's paths answer 503: not the admin endpoint, not the host's
/// other backend.
fn refused_paths_answer_503(h: &Harness, service: &str) {
    let host = format!("{service}.example.com");
    for path in ["/debug/config", "/metrics"] {
        let answer = h.get(&host, path);
        assert_eq!(answer.status, 503, "http://{host}{path}: {}", answer.body);
    }
    assert_eq!(h.who(&host, "/"), format!("{service}-pod"));
}

#[test]
fn external_name_services_are_off_by_default() {
    let mut h = Harness::new();
    victim(&mut h);
    h.start(&[]);
    assert_eq!(h.who("victim.example.com", "/"), "victim");

    let evil = external_name_to(&mut h, "ext", "localhost");
    h.write("evil.yaml", &evil);
    survives(
        &mut h,
        "off",
        &[
            "Service evil/ext",
            "spec.type",
            "--allow-external-name-services",
        ],
    );
    no_admin_content_through(&h, "ext.example.com");
    refused_paths_answer_503(&h, "ext");
    assert!(
        !std::fs::read_to_string(h.config_dir().join("haproxy.cfg"))
            .unwrap()
            .contains("localhost"),
        "the ExternalName reached haproxy.cfg"
    );
}

#[test]
fn allowed_external_names_of_this_host_are_refused() {
    let mut h = Harness::new();
    victim(&mut h);
    h.start(&["--allow-external-name-services"]);
    assert_eq!(h.who("victim.example.com", "/"), "victim");

    // (Service, externalName, whether its paths answer 503: a name that is not a DNS name at
    // all leaves the path unrouted instead.)
    for (round, (service, name, answers_503)) in [
        ("to-localhost", "localhost", true),
        ("to-loopback", "127.0.0.1", false),
        ("to-short-loopback", "127.1", false),
        ("to-hex-loopback", "0x7f000001", true),
        ("to-admin-localhost", "admin.localhost", true),
        ("to-metadata", "metadata.google.internal", true),
    ]
    .into_iter()
    .enumerate()
    {
        let evil = external_name_to(&mut h, service, name);
        h.write(&format!("evil-{service}.yaml"), &evil);
        survives(
            &mut h,
            &round.to_string(),
            &[&format!("Service evil/{service}"), "spec.externalName"],
        );
        no_admin_content_through(&h, &format!("{service}.example.com"));
        if answers_503 {
            refused_paths_answer_503(&h, service);
        }
    }
    // A name that passes every check on sight and resolves to loopback: refused by its
    // answer, which the controller looks up itself.
    match hosts_name_on_loopback() {
        Some(name) => {
            let evil = external_name_to(&mut h, "resolved", &name);
            h.write("evil-resolved.yaml", &evil);
            survives(
                &mut h,
                "resolved",
                &[
                    "Service evil/resolved",
                    "spec.externalName",
                    "resolves to 127.",
                ],
            );
            no_admin_content_through(&h, "resolved.example.com");
            refused_paths_answer_503(&h, "resolved");
        }
        None => {
            eprintln!("no /etc/hosts name on loopback here: the resolved-name vector is not run");
        }
    }
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    let admin = format!(":{}", h.admin_port);
    assert!(
        !cfg.split_whitespace().any(|w| w.ends_with(&admin)),
        "the admin port reached haproxy.cfg:\n{cfg}"
    );
}

/// A name `/etc/hosts` maps to a loopback address (a host's own name usually is), other than
/// the names refused on sight (`localhost`, `ip6-localhost`, …).
fn hosts_name_on_loopback() -> Option<String> {
    let hosts = std::fs::read_to_string("/etc/hosts").ok()?;
    hosts.lines().find_map(|line| {
        let mut words = line.split('#').next()?.split_whitespace();
        let address: std::net::IpAddr = words.next()?.parse().ok()?;
        if !address.is_loopback() {
            return None;
        }
        words
            .find(|name| {
                !name.contains("localhost")
                    && !name.starts_with("ip6-")
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b == b'-' || b == b'.')
            })
            .map(str::to_string)
    })
}

/// Endpoints of `evil`'s Service on the controller's own admin and debug listeners: refused
/// (loopback endpoints stay allowed with `--manifests`, these two addresses never are).
/// With `--debug-addr`, the debug pages are on that listener only.
#[test]
fn endpoints_on_the_controller_listeners_are_refused_and_debug_pages_stay_apart() {
    let mut h = Harness::new();
    let debug_port = free_port();
    let debug = SocketAddr::from(([127, 0, 0, 1], debug_port));
    victim(&mut h);
    h.start(&["--debug-addr", &debug.to_string()]);
    assert_eq!(h.who("victim.example.com", "/"), "victim");

    // The probe listener serves probes and metrics, not the debug pages.
    assert!(h.admin("/metrics").unwrap().body.contains("portcullis_"));
    for path in ["/debug/config", "/debug/model", "/debug/log-level"] {
        let answer = h.admin(path).unwrap();
        assert_eq!(
            answer.status, 404,
            "{path} on --admin-addr: {}",
            answer.body
        );
    }
    let config = http_get(debug, "127.0.0.1", "/debug/config").unwrap();
    assert_eq!(config.status, 200);
    assert!(config.body.contains("global"));
    assert_eq!(http_get(debug, "127.0.0.1", "/readyz").unwrap().status, 200);

    for (round, port) in [("admin", h.admin_port), ("debug", debug_port)] {
        let service = format!("to-{round}");
        let slices = endpoint_slices("evil", &service, &[("0", port, true)]);
        h.write(
            &format!("evil-{round}.yaml"),
            &format!(
                "{}---\n{slices}---\n{}",
                support::service("evil", &service, &[]),
                ingress_to(
                    "evil",
                    &service,
                    &format!("{service}.example.com"),
                    &service
                )
            ),
        );
        survives(
            &mut h,
            round,
            &[
                &format!("EndpointSlice evil/{service}-0"),
                "endpoints[0].addresses[0]",
                "own listener",
            ],
        );
        no_admin_content_through(&h, &format!("{service}.example.com"));
        let through = h.get(&format!("{service}.example.com"), "/debug/config");
        assert_eq!(through.status, 503, "{}", through.body);
    }
    // The debug listener kept its content to itself, and still answers.
    assert_eq!(
        http_get(debug, "127.0.0.1", "/debug/model").unwrap().status,
        200
    );
}

/// A TCP object of `ns` (older when `created` is earlier) with one bind on
/// `address:port` in front of Service `service` port 80.
fn tcp_object(
    ns: &str,
    name: &str,
    created: &str,
    address: &str,
    port: u16,
    service: &str,
) -> String {
    format!(
        "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  name: {name}\n  \
         namespace: {ns}\n  creationTimestamp: {created:?}\n  \
         annotations: {{ingress.class: portcullis}}\nspec:\n  - name: {name}\n    frontend:\n      \
         name: {ns}-{name}\n      binds:\n        - {{name: b, address: {address}, port: {port}}}\n    \
         service: {{name: {service}, port: 80}}\n"
    )
}

/// TCP binds on the admin port, the HTTP port, an older TCP object's port and a port below
/// 1024: each refused up front, no reload fails, everyone else's changes apply.
#[test]
fn tcp_binds_on_taken_or_privileged_ports_are_refused() {
    let mut h = Harness::new();
    victim(&mut h);
    // An older tenant's TCP service, which the hostile object tries to take over; `evil`
    // sorts before `tenant`, so the creation time decides.
    let tenant_port = free_port();
    let tenant = h.backend("tenant", "tenant");
    h.write("tenant.yaml", &tenant);
    h.write(
        "tenant-tcp.yaml",
        &tcp_object(
            "tenant",
            "db",
            "2020-01-01T00:00:00Z",
            "127.0.0.1",
            tenant_port,
            "tenant",
        ),
    );
    let evil = h.backend("evil", "evil");
    h.write("evil.yaml", &evil);
    h.start(&[]);
    assert_eq!(h.who("victim.example.com", "/"), "victim");
    let tenant_addr = SocketAddr::from(([127, 0, 0, 1], tenant_port));
    assert_eq!(http_get(tenant_addr, "x", "/").unwrap().who(), "tenant");

    let vectors = [
        (
            "admin",
            "127.0.0.1",
            h.admin_port,
            "this controller's admin endpoint",
        ),
        ("http", "0.0.0.0", h.http_port, "the HTTP frontend"),
        ("tenant", "0.0.0.0", tenant_port, "TCP tenant/db"),
        ("privileged", "127.0.0.1", 81, "below 1024"),
    ];
    for (round, address, port, owner) in vectors {
        h.write(
            &format!("evil-tcp-{round}.yaml"),
            &tcp_object("evil", round, "2024-01-01T00:00:00Z", address, port, "evil"),
        );
        survives(
            &mut h,
            round,
            &[
                &format!("TCP evil/{round}"),
                "spec[0].frontend.binds[0]",
                owner,
            ],
        );
        // The older owner keeps its address.
        assert_eq!(http_get(tenant_addr, "x", "/").unwrap().who(), "tenant");
        assert_eq!(h.readyz().unwrap().0, 200);
    }
    no_admin_content_through(&h, "victim.example.com");
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(!cfg.contains("frontend tcp_evil-"), "{cfg}");
}

/// A test API server on its own runtime (its tasks keep serving while the test thread blocks).
struct Cluster {
    _rt: tokio::runtime::Runtime,
    server: apiserver::ApiServer,
}

impl Cluster {
    fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server = rt.block_on(
            apiserver::ApiServer::builder()
                .list_items_without_type_meta()
                .bookmark_interval(Duration::from_secs(1))
                .start(),
        );
        server.apply_yaml(INGRESS_CLASS);
        Self { _rt: rt, server }
    }

    fn apply(&self, yaml: &str) {
        self.server.apply_yaml(yaml);
    }
}

/// Service `name` of `ns` with one endpoint on `address:port`, and an Ingress routing
/// `<name>.example.com` to it.
fn routed_to(ns: &str, name: &str, address: &str, port: u16) -> String {
    format!(
        "{}---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-0\n  \
         namespace: {ns}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\n\
         ports:\n  - {{name: http, port: {port}, protocol: TCP}}\n\
         endpoints:\n  - addresses: [\"{address}\"]\n    conditions: {{ready: true}}\n---\n{}",
        support::service(ns, name, &[]),
        ingress_to(ns, name, &format!("{name}.example.com"), name)
    )
}

/// Against a cluster, endpoints on the node's loopback, link-local or metadata addresses, or
/// on the controller's own pod, are refused; `--allow-local-endpoints` keeps loopback (the
/// echo servers here) but never the metadata address or the pod.
#[test]
fn in_cluster_endpoints_on_the_node_or_the_controller_are_refused() {
    // Without the flag: a loopback endpoint is a tenant reaching into the node.
    let cluster = Cluster::start();
    let mut h = Harness::new();
    let port = h.echo("local");
    cluster.apply(&routed_to("evil", "local", "127.0.0.1", port));
    let kubeconfig = h.work().join("kubeconfig");
    cluster.server.write_kubeconfig(&kubeconfig, None);
    h.use_kubeconfig(&kubeconfig);
    h.start(&[]);
    wait_for_diagnostic(
        &h,
        &[
            "EndpointSlice evil/local-0",
            "endpoints[0].addresses[0]",
            "loopback",
        ],
    );
    wait_until(
        APPLY_TIMEOUT,
        "the local endpoint's path answers 503",
        || {
            h.try_get("local.example.com", "/")
                .is_some_and(|a| a.status == 503)
        },
    );
    drop(h);

    // With it: loopback pods serve, the metadata address and the pod's own IP do not.
    let cluster = Cluster::start();
    let mut h = Harness::new();
    let victim_port = h.echo("victim");
    cluster.apply(&routed_to("victim", "victim", "127.0.0.1", victim_port));
    let kubeconfig = h.work().join("kubeconfig");
    cluster.server.write_kubeconfig(&kubeconfig, None);
    h.use_kubeconfig(&kubeconfig);
    h.start(&["--allow-local-endpoints", "--pod-ip", "127.0.0.9"]);
    assert_eq!(h.who("victim.example.com", "/"), "victim");
    for (name, address, port, why) in [
        ("metadata", "169.254.169.254", 80, "metadata"),
        ("pod", "127.0.0.9", victim_port, "pod IP"),
    ] {
        cluster.apply(&routed_to("evil", name, address, port));
        wait_for_diagnostic(
            &h,
            &[
                &format!("EndpointSlice evil/{name}-0"),
                "endpoints[0].addresses[0]",
                why,
            ],
        );
        let newcomer = format!("newcomer-{name}");
        let newcomer_port = h.echo(&newcomer);
        cluster.apply(&routed_to(
            "newcomer",
            &newcomer,
            "127.0.0.1",
            newcomer_port,
        ));
        wait_until(LIVE_WITHIN, &format!("{newcomer} goes live"), || {
            h.try_get(&format!("{newcomer}.example.com"), "/")
                .is_some_and(|a| a.who() == newcomer)
        });
        assert_eq!(h.who("victim.example.com", "/"), "victim");
        assert_eq!(h.get(&format!("{name}.example.com"), "/").status, 503);
        no_admin_content_through(&h, &format!("{name}.example.com"));
    }
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(
        !cfg.contains("169.254.169.254") && !cfg.contains("127.0.0.9"),
        "{cfg}"
    );
}
