//! `portcullis run` against a Kubernetes API server: the real controller binary and its real
//! kube-rs client, a protocol-faithful test API server (tests/support/apiserver.rs) on
//! loopback, and a real HAProxy serving real HTTP to echo backends.
//!
//! Start-up must never fail silently (../shared/context/upstream-failures.md §1): transient
//! failures are retried until `--startup-timeout`, then the process exits non-zero with one
//! line; permanent ones exit at once. After start-up, losing the API server never stops
//! HAProxy, and the watches converge on the final state when it comes back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/apiserver.rs"]
mod apiserver;
mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use support::*;

const NS: &str = "shop";

/// A test API server on its own runtime (its tasks keep serving while the test thread blocks).
struct Cluster {
    rt: tokio::runtime::Runtime,
    server: Arc<ApiServer>,
}

impl Cluster {
    fn start() -> Self {
        // Like the real API server: list items of built-in kinds carry no apiVersion/kind.
        Self::start_with(ApiServer::builder().list_items_without_type_meta())
    }

    fn start_with(builder: apiserver::ApiServerBuilder) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server =
            Arc::new(rt.block_on(builder.bookmark_interval(Duration::from_secs(1)).start()));
        // The IngressClass the Ingresses of the tests name: without it they are not served.
        server.apply_yaml(INGRESS_CLASS);
        Self { rt, server }
    }

    fn kubeconfig(&self, dir: &Path, token: Option<&str>) -> PathBuf {
        let path = dir.join("kubeconfig");
        self.server.write_kubeconfig(&path, token);
        path
    }

    fn apply(&self, yaml: &str) {
        self.server.apply_yaml(yaml);
    }

    fn stop(&self) {
        self.rt.block_on(self.server.stop());
    }

    fn resume(&self) {
        self.rt.block_on(self.server.resume());
    }

    /// Resumes the server after `delay`, in the background.
    fn resume_after(&self, delay: Duration) {
        let server = self.server.clone();
        self.rt.spawn(async move {
            tokio::time::sleep(delay).await;
            server.resume().await;
        });
    }
}

/// Service `name` with one endpoint: an echo server named `name`, in the test API server.
fn backend(h: &mut Harness, cluster: &Cluster, name: &str) {
    cluster.apply(&h.backend(NS, name));
}

/// Points Service `service` at the echo servers `ports` (one slice each, replacing the old).
fn set_endpoints(cluster: &Cluster, service: &str, ports: &[(&str, u16)]) {
    for slice in cluster
        .server
        .list("discovery.k8s.io/v1", "EndpointSlice", Some(NS))
    {
        let name = slice["metadata"]["name"].as_str().unwrap().to_string();
        let owner = slice["metadata"]["labels"]["kubernetes.io/service-name"].as_str();
        if owner == Some(service) && !ports.iter().any(|(s, _)| name == format!("{service}-{s}")) {
            cluster
                .server
                .delete("discovery.k8s.io/v1", "EndpointSlice", NS, &name);
        }
    }
    let endpoints: Vec<(&str, u16, bool)> = ports.iter().map(|(s, p)| (*s, *p, true)).collect();
    cluster.apply(&endpoint_slices(NS, service, &endpoints));
}

/// A test API server with Service `web` (one echo pod) routed from shop.example, and a
/// harness reading it through a kubeconfig.
fn shop_routed_to_web() -> (Cluster, Harness) {
    let cluster = Cluster::start();
    let mut h = Harness::new();
    backend(&mut h, &cluster, "web");
    cluster.apply(&shop_ingress(&[route(
        Some("shop.example"),
        "/",
        "Prefix",
        "web",
    )]));
    let kubeconfig = cluster.kubeconfig(&h.work(), None);
    h.use_kubeconfig(&kubeconfig);
    (cluster, h)
}

fn shop_ingress(routes: &[Route<'_>]) -> String {
    ingress(NS, "shop", routes, None, &[])
}

/// Runs the binary to its exit and returns (status code, stderr, elapsed).
fn run_to_exit(h: &Harness, extra: &[&str], timeout: Duration) -> (Option<i32>, String, Duration) {
    let started = Instant::now();
    let mut cmd = h.command(extra);
    cmd.stdin(Stdio::null());
    let out = output_within(cmd, timeout);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
        started.elapsed(),
    )
}

fn error_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("error:")).collect()
}

#[test]
fn an_unresolvable_api_server_host_fails_loudly_within_the_startup_timeout() {
    let mut h = Harness::new();
    let kubeconfig = h.work().join("kubeconfig");
    apiserver::write_kubeconfig(&kubeconfig, "http://portcullis-nowhere.invalid:6443", None);
    h.use_kubeconfig(&kubeconfig);
    let (code, stderr, elapsed) =
        run_to_exit(&h, &["--startup-timeout", "3s"], Duration::from_secs(20));
    assert_eq!(code, Some(6), "exit status; stderr:\n{stderr}");
    assert!(
        elapsed < Duration::from_secs(5) + Duration::from_millis(500),
        "took {elapsed:?}"
    );
    let errors = error_lines(&stderr);
    assert_eq!(errors.len(), 1, "one error line:\n{stderr}");
    assert!(
        errors[0].contains("portcullis-nowhere.invalid") && errors[0].contains("dns error"),
        "the line names the host and the cause: {}",
        errors[0]
    );
    // Every attempt was logged with its cause.
    assert!(
        stderr.matches("not reachable: GET /version").count() >= 2,
        "{stderr}"
    );
}

#[test]
fn refused_connections_are_retried_until_the_api_server_comes_up() {
    let (cluster, mut h) = shop_routed_to_web();
    cluster.stop();
    cluster.resume_after(Duration::from_secs(2));
    let started = Instant::now();
    h.start(&["--startup-timeout", "30s", "--allow-local-endpoints"]);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "ready before the server was up"
    );
    assert_eq!(h.who("shop.example", "/"), "web");
    let log = h.log();
    assert!(
        log.contains("Connection refused"),
        "attempts logged with the cause:\n{log}"
    );
    assert!(log.contains("every watch has listed the cluster"), "{log}");
    assert_eq!(
        h.terminate(Duration::from_secs(20)).and_then(|s| s.code()),
        Some(0)
    );
}

#[test]
fn unauthorized_exits_at_once() {
    let cluster = Cluster::start();
    cluster.server.require_token(Some("right"));
    let mut h = Harness::new();
    let kubeconfig = cluster.kubeconfig(&h.work(), Some("wrong"));
    h.use_kubeconfig(&kubeconfig);
    let (code, stderr, elapsed) =
        run_to_exit(&h, &["--startup-timeout", "60s"], Duration::from_secs(20));
    assert_eq!(code, Some(7), "exit status; stderr:\n{stderr}");
    assert!(elapsed < Duration::from_secs(5), "not retried: {elapsed:?}");
    let errors = error_lines(&stderr);
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("401"), "{}", errors[0]);
}

#[test]
fn forbidden_watches_and_a_required_missing_crd_exit_at_once() {
    let cluster = Cluster::start_with(ApiServer::builder().without_tcp_crd());
    let mut h = Harness::new();
    let kubeconfig = cluster.kubeconfig(&h.work(), None);
    h.use_kubeconfig(&kubeconfig);
    let (code, stderr, _) = run_to_exit(
        &h,
        &["--tcp-crd", "required", "--startup-timeout", "60s"],
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(7), "{stderr}");
    assert!(
        error_lines(&stderr)[0].contains("TCP custom resource"),
        "{stderr}"
    );

    cluster.server.forbid("secrets");
    let (code, stderr, elapsed) =
        run_to_exit(&h, &["--startup-timeout", "60s"], Duration::from_secs(20));
    assert_eq!(code, Some(7), "{stderr}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    let line = error_lines(&stderr)[0].to_string();
    assert!(line.contains("Secret") && line.contains("403"), "{line}");
}

#[test]
fn an_api_server_outage_never_stops_haproxy_and_nothing_is_lost() {
    let cluster = Cluster::start();
    let mut h = Harness::new();
    let a = h.echo("a");
    let b = h.echo("b");
    let c = h.echo("c");
    cluster.apply(&service(NS, "web", &[]));
    set_endpoints(&cluster, "web", &[("a", a)]);
    cluster.apply(&shop_ingress(&[route(
        Some("shop.example"),
        "/",
        "Prefix",
        "web",
    )]));
    // An Ingress in a namespace the controller does not read.
    cluster.apply(&ingress(
        "other",
        "hidden",
        &[route(Some("hidden.example"), "/", "Prefix", "web")],
        None,
        &[],
    ));
    let kubeconfig = cluster.kubeconfig(&h.work(), None);
    h.use_kubeconfig(&kubeconfig);
    h.start(&["--namespace", NS, "--allow-local-endpoints"]);
    assert_eq!(h.who("shop.example", "/"), "a");
    assert_eq!(h.get("hidden.example", "/").status, 404, "namespace filter");

    // A change before the outage is applied.
    set_endpoints(&cluster, "web", &[("b", b)]);
    wait_until(APPLY_TIMEOUT, "b serves", || {
        h.who("shop.example", "/") == "b"
    });

    // Outage: the state changes on the server while the controller cannot see it.
    cluster.stop();
    let outage = Instant::now();
    set_endpoints(&cluster, "web", &[("b", b), ("c", c)]);
    cluster.apply(&service(NS, "api", &[]));
    set_endpoints(&cluster, "api", &[("a", a)]);
    cluster.apply(&shop_ingress(&[
        route(Some("shop.example"), "/", "Prefix", "web"),
        route(Some("shop.example"), "/api", "Prefix", "api"),
    ]));
    cluster.apply(&ingress(
        NS,
        "extra",
        &[route(Some("extra.example"), "/", "Prefix", "api")],
        None,
        &[],
    ));
    let mut served = 0;
    while outage.elapsed() < Duration::from_secs(10) {
        let who = h.who("shop.example", "/");
        assert_eq!(
            who, "b",
            "HAProxy keeps serving the last good state during the outage"
        );
        served += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(served > 50);
    let (status, detail) = h.readyz().unwrap();
    assert_eq!(status, 200, "still ready during the outage: {detail}");
    assert!(
        h.metric("portcullis_cluster_watch_stale_seconds{watch=\"Ingress in shop\"}") >= 5.0,
        "the stale-data metric rises: {}",
        h.admin("/metrics").unwrap().body
    );
    assert!(
        !detail["cluster"]["stale"].as_array().unwrap().is_empty(),
        "{detail}"
    );

    // Back: the final state, every change included.
    cluster.resume();
    // Each watch retries on kube-runtime's default backoff (doubling from 0.8 s, jittered,
    // at most 30 s apart): one whose next try falls late comes back up to 30 s after this.
    wait_until(
        Duration::from_secs(60),
        "converged after the outage",
        || {
            h.try_get("shop.example", "/api")
                .is_some_and(|a| a.who() == "a")
                && h.try_get("extra.example", "/")
                    .is_some_and(|a| a.who() == "a")
                && h.answering("shop.example", "/", 12) == ["b", "c"].map(String::from).into()
        },
    );
    wait_until(APPLY_TIMEOUT, "stale metric back to 0", || {
        h.try_metric("portcullis_cluster_watch_stale_seconds{watch=\"Ingress in shop\"}")
            == Some(0.0)
    });

    // 410 Gone: while the controller cannot reconnect, the state changes and the server
    // forgets its history, so every watch must relist when it is back.
    let lists_before = cluster.server.list_count("endpointslices");
    cluster.stop();
    set_endpoints(&cluster, "web", &[("c", c)]);
    cluster
        .server
        .delete("networking.k8s.io/v1", "Ingress", NS, "shop");
    cluster.apply(&shop_ingress(&[route(
        Some("shop.example"),
        "/api",
        "Prefix",
        "api",
    )]));
    cluster
        .server
        .delete("networking.k8s.io/v1", "Ingress", NS, "extra");
    set_endpoints(&cluster, "api", &[("c", c)]);
    cluster.server.compact();
    cluster.resume();
    // The watches' backoff has not been reset since the outage above (kube-runtime resets
    // it after 120 s without an error): the next try can again fall up to 30 s away.
    wait_until(Duration::from_secs(60), "converged after 410 Gone", || {
        h.try_get("shop.example", "/")
            .is_some_and(|a| a.status == 404)
            && h.try_get("extra.example", "/")
                .is_some_and(|a| a.status == 404)
            && h.try_get("shop.example", "/api")
                .is_some_and(|a| a.who() == "c")
    });
    assert_eq!(h.who("shop.example", "/api"), "c");
    // The EndpointSlice change could only be seen by relisting: its history was compacted.
    assert!(
        cluster.server.list_count("endpointslices") > lists_before,
        "a relist happened"
    );
    assert_eq!(
        h.terminate(Duration::from_secs(20)).and_then(|s| s.code()),
        Some(0)
    );
}

#[test]
fn only_the_lease_holder_writes_status_and_the_other_takes_over() {
    let cluster = Cluster::start();
    let mut one = Harness::new();
    let mut two = Harness::new();
    backend(&mut one, &cluster, "web");
    cluster.apply(&shop_ingress(&[route(
        Some("shop.example"),
        "/",
        "Prefix",
        "web",
    )]));
    let flags = |pod: &'static str| {
        [
            "--pod-name",
            pod,
            "--pod-namespace",
            "ingress",
            "--publish-address",
            "192.0.2.7",
            "--lease-duration",
            "3s",
            "--allow-local-endpoints",
        ]
    };
    for (h, pod) in [(&mut one, "one"), (&mut two, "two")] {
        let kubeconfig = cluster.kubeconfig(&h.work(), None);
        h.use_kubeconfig(&kubeconfig);
        h.start(&flags(pod));
    }
    let status_of = |name: &str| {
        cluster
            .server
            .get("networking.k8s.io/v1", "Ingress", NS, name)
            .and_then(|i| {
                i["status"]["loadBalancer"]["ingress"][0]["ip"]
                    .as_str()
                    .map(String::from)
            })
    };
    wait_until(Duration::from_secs(15), "status written", || {
        status_of("shop").as_deref() == Some("192.0.2.7")
    });
    let holder = || {
        cluster
            .server
            .get(
                "coordination.k8s.io/v1",
                "Lease",
                "ingress",
                "portcullis-leader",
            )
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(String::from))
    };
    let leader = holder().expect("a Lease holder");
    let (leader_h, follower_h, follower) = if leader == "one" {
        (&mut one, &mut two, "two")
    } else {
        (&mut two, &mut one, "one")
    };
    let status_patches = || {
        cluster
            .server
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
            .count()
    };
    assert_eq!(status_patches(), 1, "written once, not by both replicas");
    assert!(leader_h.log().contains("Ingress status updated"));
    assert!(
        !follower_h.log().contains("Ingress status updated"),
        "the follower wrote status"
    );
    // Both serve, whoever leads.
    assert_eq!(leader_h.who("shop.example", "/"), "web");
    assert_eq!(follower_h.who("shop.example", "/"), "web");

    // The leader exits (0); the other takes over within the lease duration.
    let stopped = Instant::now();
    assert_eq!(
        leader_h
            .terminate(Duration::from_secs(20))
            .and_then(|s| s.code()),
        Some(0)
    );
    wait_until(
        Duration::from_secs(3),
        "the other replica holds the Lease",
        || holder().as_deref() == Some(follower),
    );
    assert!(stopped.elapsed() < Duration::from_secs(3) + Duration::from_secs(20));
    cluster.apply(&ingress(
        NS,
        "late",
        &[route(Some("late.example"), "/", "Prefix", "web")],
        None,
        &[],
    ));
    wait_until(
        Duration::from_secs(15),
        "the new leader writes status",
        || status_of("late").as_deref() == Some("192.0.2.7"),
    );
    // The line follows the API server's answer, which the status above may beat.
    wait_until(
        Duration::from_secs(5),
        "the new leader logs its status update",
        || follower_h.log().contains("Ingress status updated"),
    );
}

#[test]
fn rejected_annotations_become_events_on_the_ingress() {
    let cluster = Cluster::start();
    let mut h = Harness::new();
    backend(&mut h, &cluster, "web");
    cluster.apply(&with_metadata(
        &shop_ingress(&[route(Some("shop.example"), "/", "Prefix", "web")]),
        "  annotations:\n    haproxy.org/timeout-server: \"soon\"\n",
    ));
    let kubeconfig = cluster.kubeconfig(&h.work(), None);
    h.use_kubeconfig(&kubeconfig);
    h.start(&[
        "--pod-name",
        "solo",
        "--pod-namespace",
        "ingress",
        "--allow-local-endpoints",
    ]);
    let events = || {
        cluster
            .server
            .list("v1", "Event", Some(NS))
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == "shop")
            .collect::<Vec<_>>()
    };
    wait_until(Duration::from_secs(15), "an Event on the Ingress", || {
        !events().is_empty()
    });
    let event = &events()[0];
    assert_eq!(event["involvedObject"]["kind"], "Ingress");
    assert_eq!(event["type"], "Warning");
    let message = event["message"].as_str().unwrap();
    assert!(message.contains("timeout-server"), "{message}");
    // Still served; the setting alone was dropped.
    assert_eq!(h.who("shop.example", "/"), "web");
    // A later unrelated change does not repeat the Event.
    set_endpoints(&cluster, "web", &[("0", h.echo("web2"))]);
    wait_until(APPLY_TIMEOUT, "web2 serves", || {
        h.who("shop.example", "/") == "web2"
    });
    holds_for(
        Duration::from_millis(500),
        "the Event is not repeated",
        || events().len() == 1,
    );
}

/// A supervisor like systemd's `Restart=on-failure`: restarts only on a non-zero exit.
#[test]
fn a_supervisor_restarting_on_failure_recovers_from_a_failed_start() {
    let (cluster, h) = shop_routed_to_web();
    cluster.stop();
    let mut exits = Vec::new();
    let mut ready = false;
    for attempt in 0..4 {
        if attempt == 1 {
            cluster.resume();
        }
        let mut child = h
            .command(&["--startup-timeout", "1s", "--allow-local-endpoints"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if h.readyz().is_some_and(|(s, _)| s == 200) {
                break None;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "neither ready nor exited"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        match status {
            Some(s) => {
                exits.push(s.code());
                assert!(!s.success(), "a failed start must not exit 0");
            }
            None => {
                ready = true;
                assert_eq!(h.who("shop.example", "/"), "web");
                signal(child.id(), "TERM");
                assert_eq!(child.wait().unwrap().code(), Some(0));
                break;
            }
        }
    }
    assert_eq!(
        exits,
        [Some(6)],
        "one failed start, then one restart that came up"
    );
    assert!(ready);
}

#[test]
fn the_systemd_unit_restarts_on_failure() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd/portcullis.service"),
    )
    .unwrap();
    assert!(unit.contains("\nRestart=on-failure\n"), "{unit}");
    assert!(unit.contains("--external"), "{unit}");
}

#[test]
fn an_ingress_moved_to_another_class_has_our_address_taken_off_its_status() {
    let (cluster, mut h) = shop_routed_to_web();
    h.start(&[
        "--pod-name",
        "one",
        "--pod-namespace",
        "ingress",
        "--publish-address",
        "192.0.2.7",
        "--allow-local-endpoints",
    ]);
    let status_of = || {
        cluster
            .server
            .get("networking.k8s.io/v1", "Ingress", NS, "shop")
            .map(|i| i["status"]["loadBalancer"]["ingress"].clone())
    };
    wait_until(Duration::from_secs(15), "status written", || {
        status_of().is_some_and(|s| s[0]["ip"] == "192.0.2.7")
    });
    // Another controller's class, with the status as it stands (an update of the spec keeps it).
    let mut moved = cluster
        .server
        .get("networking.k8s.io/v1", "Ingress", NS, "shop")
        .unwrap();
    moved["spec"]["ingressClassName"] = serde_json::json!("other");
    let stored = cluster.server.apply(moved);
    assert_eq!(
        stored["status"]["loadBalancer"]["ingress"][0]["ip"], "192.0.2.7",
        "the class change itself left the status alone"
    );
    wait_until(Duration::from_secs(15), "our address taken off", || {
        status_of().is_some_and(|s| s.as_array().is_some_and(Vec::is_empty))
    });
    // Once: the new controller's own address is not fought over.
    let mut theirs = cluster
        .server
        .get("networking.k8s.io/v1", "Ingress", NS, "shop")
        .unwrap();
    theirs["status"] = serde_json::json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}});
    cluster.server.apply(theirs);
    let patches = || {
        cluster
            .server
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
            .count()
    };
    let before = patches();
    // An absence has no event to poll for: the write above reaches the controller's watch and
    // a pipeline run within a second here, so 3 s is past any clear it would make.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(patches(), before, "the status was cleared again");
    assert_eq!(
        h.terminate(Duration::from_secs(20)).and_then(|s| s.code()),
        Some(0)
    );
}
