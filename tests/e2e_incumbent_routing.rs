//! haproxytech/kubernetes-ingress' own suites about choosing the pod for a request,
//! re-expressed against Portcullis: `ingress-match` (path types, hosts, wildcards),
//! `service-discovery` (Service ports by number and by name), `different-ports` (replicas of
//! one Service on different ports), `config-snippet` and `haproxy-files` (error pages,
//! pattern files). One test per suite case, in the suites' shape.
//!
//! The tests share one `portcullis run` that allows config snippets (the config-snippet and
//! endpoints suites need them), except those that change the controller ConfigMap or need a
//! flag of their own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod incumbent;
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use incumbent::*;
use support::{APPLY_TIMEOUT, Harness};

static SHARED: Shared = Shared::new();

const SNIPPET_FLAGS: [&str; 2] = [
    "--allow-config-snippets",
    "--allow-config-snippets-in-annotations",
];

fn harness() -> Arc<Harness> {
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend(SNIPPET_FLAGS);
    SHARED.get(|h| h.write("ingressclass.yaml", &ingress_class()), &flags)
}

/// A harness of its own with the suites' base ConfigMap (plus `extra` data lines) and flags.
fn own_harness(extra_data: &str, extra_flags: &[&str]) -> Harness {
    let mut h = Harness::new();
    h.write("ingressclass.yaml", &ingress_class());
    let base = include_str!("fixtures/incumbent/configmap.yaml");
    h.write("configmap.yaml", &format!("{base}{extra_data}"));
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend(CONFIGMAP_FLAGS);
    flags.extend(extra_flags);
    h.start(&flags);
    h
}

// ---------------------------------------------------------------------------------------------
// ingress-match

/// ingress-match `Test_Http_MatchPath`: ten Services, one Ingress with the suite's rules, and
/// each request answered by the Service the Kubernetes path semantics pick.
#[test]
fn ingress_match_path() {
    let h = harness();
    let suite = Suite::new("ingress-match");
    // (service, host, path, path type) as the suite's rules.
    let rules: [(&str, Option<&str>, Option<&str>, &str); 10] = [
        (
            "http-echo-1",
            Some("app.haproxy"),
            Some("/"),
            "ImplementationSpecific",
        ),
        (
            "http-echo-2",
            Some("app.haproxy"),
            Some("/a"),
            "ImplementationSpecific",
        ),
        (
            "http-echo-3",
            Some("app.haproxy"),
            Some("/a/b"),
            "ImplementationSpecific",
        ),
        ("http-echo-4", Some("app.haproxy"), Some("/exact"), "Exact"),
        (
            "http-echo-5",
            Some("app.haproxy"),
            Some("/exactslash/"),
            "Exact",
        ),
        (
            "http-echo-6",
            Some("app.haproxy"),
            Some("/prefix"),
            "Prefix",
        ),
        (
            "http-echo-7",
            Some("app.haproxy"),
            Some("/prefixslash"),
            "Prefix",
        ),
        (
            "http-echo-8",
            Some("sub.app.haproxy"),
            None,
            "ImplementationSpecific",
        ),
        (
            "http-echo-9",
            Some("*.haproxy"),
            None,
            "ImplementationSpecific",
        ),
        (
            "http-echo-10",
            None,
            Some("/test"),
            "ImplementationSpecific",
        ),
    ];
    let pods: Vec<Pod> = rules
        .iter()
        .map(|(svc, ..)| Pod::start(svc, Reply::Echo))
        .collect();
    let mut docs = Vec::new();
    for pod in &pods {
        docs.push(echo_service(&suite.ns, &pod.name, &[]));
        docs.push(slices(&suite.ns, &pod.name, &[pod.endpoint()]));
    }
    // One rule per entry, as the suite's template writes them.
    let mut ing = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: http-echo\n  \
         namespace: {}\nspec:\n  ingressClassName: {CLASS}\n  rules:\n",
        suite.ns
    );
    for (svc, host, path, path_type) in &rules {
        match host {
            Some(host) => ing.push_str(&format!("    - host: {host:?}\n      http:\n")),
            None => ing.push_str("    - http:\n"),
        }
        ing.push_str("        paths:\n          - ");
        if let Some(path) = path {
            ing.push_str(&format!("path: {path}\n            "));
        }
        ing.push_str(&format!(
            "pathType: {path_type}\n            backend: {{service: {{name: {svc}, port: {{name: http}}}}}}\n"
        ));
    }
    docs.push(ing);
    h.write("ingress-match.yaml", &docs.join("---\n"));
    let cases: [(&str, &str, &[&str]); 10] = [
        (
            "http-echo-1",
            "app.haproxy",
            &[
                "/",
                "/test",
                "/exact/",
                "/exactslash",
                "/exactslash/foo",
                "/prefixxx",
            ],
        ),
        ("http-echo-2", "app.haproxy", &["/a"]),
        ("http-echo-3", "app.haproxy", &["/a/b"]),
        ("http-echo-4", "app.haproxy", &["/exact"]),
        ("http-echo-5", "app.haproxy", &["/exactslash/"]),
        (
            "http-echo-6",
            "app.haproxy",
            &["/prefix", "/prefix/", "/prefix/foo"],
        ),
        (
            "http-echo-7",
            "app.haproxy",
            &["/prefixslash", "/prefixslash/", "/prefixslash/foo/bar"],
        ),
        ("http-echo-8", "sub.app.haproxy", &["/test"]),
        ("http-echo-9", "test.haproxy", &["/test"]),
        ("http-echo-10", "foo.bar", &["/test"]),
    ];
    for (target, host, paths) in cases {
        for path in paths {
            let mut last = None;
            let ok = support::poll(APPLY_TIMEOUT, || {
                let who = request(h.http_port, "GET", host, path, &[]).map(|a| a.who());
                let ok = who.as_deref() == Some(target);
                last = who;
                ok.then_some(())
            });
            assert!(
                ok.is_some(),
                "{host}{path}: {target} expected, {last:?} answered"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// service-discovery

/// service-discovery `Test_Port_Discovery`: an Ingress naming the Service port by number
/// (a Service whose port has no name) and by name.
#[test]
fn service_discovery_port_discovery() {
    let h = harness();
    let suite = Suite::new("service-discovery");
    let one = Pod::start("http-echo-1", Reply::Echo);
    let two = Pod::start("http-echo-2", Reply::Echo);
    let ns = &suite.ns;
    h.write(
        "service-discovery.yaml",
        &[
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: http-echo-1\n  namespace: {ns}\n\
                 spec:\n  ports:\n    - {{name: http, protocol: TCP, port: 8080, targetPort: http}}\n"
            ),
            slices(ns, "http-echo-1", &[one.endpoint()]),
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: http-echo-2\n  namespace: {ns}\n\
                 spec:\n  ports:\n    - {{port: 8080, protocol: TCP, targetPort: http}}\n"
            ),
            // The slice of a Service port without a name has a port without a name.
            format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: http-echo-2-a\n  \
                 namespace: {ns}\n  labels: {{kubernetes.io/service-name: http-echo-2}}\naddressType: IPv4\n\
                 ports:\n  - {{port: {}, protocol: TCP}}\nendpoints:\n  - addresses: [\"127.0.0.1\"]\n    \
                 conditions: {{ready: true}}\n",
                two.port
            ),
        ]
        .join("---\n"),
    );
    for (service, port) in [
        ("http-echo-2", "number: 8080"),
        ("http-echo-1", "name: http"),
    ] {
        h.write(
            "service-discovery-ingress.yaml",
            &format!(
                "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: http-echo\n  \
                 namespace: {ns}\nspec:\n  ingressClassName: {CLASS}\n  rules:\n    - host: {}\n      \
                 http:\n        paths:\n          - path: /\n            pathType: Prefix\n            \
                 backend: {{service: {{name: {service}, port: {{{port}}}}}}}\n",
                suite.host
            ),
        );
        suite.eventually(
            &h,
            &format!("port {port}: {service} answers"),
            || suite.get(&h, &[]),
            |a| a.who() == service,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// different-ports

/// different-ports `Test_Different_Ports`: replicas of one Service listening on different
/// ports (instances added, scaled, removed), then a standalone backend; twice as many
/// requests as replicas reach each replica exactly twice.
#[test]
fn different_ports() {
    let h = harness();
    let suite = Suite::new("different-ports");
    // Every loopback pod has a port of its own: instance i, replica r.
    let mut instances: Vec<Vec<Pod>> = Vec::new();
    let mut replicas: Vec<usize> = Vec::new();
    let write = |instances: &[Vec<Pod>], replicas: &[usize], standalone: bool| {
        let endpoints: Vec<Endpoint> = instances
            .iter()
            .zip(replicas)
            .flat_map(|(pods, n)| pods[..*n].iter().map(Pod::endpoint))
            .collect();
        let annotations: &[(&str, &str)] = if standalone {
            &[("haproxy.org/standalone-backend", "true")]
        } else {
            &[]
        };
        h.write(
            "different-ports.yaml",
            &[
                echo_service(&suite.ns, "http-echo", &[]),
                slices(&suite.ns, "http-echo", &endpoints),
                ingress(
                    &suite.ns,
                    "http-echo",
                    Some(CLASS),
                    annotations,
                    Some(&suite.host),
                    &[root("http-echo")],
                    &[],
                ),
            ]
            .join("---\n"),
        );
    };
    let every_replica_reachable = |instances: &[Vec<Pod>], replicas: &[usize]| {
        let total: usize = replicas.iter().sum();
        let mut last = BTreeMap::new();
        let ok = support::poll(APPLY_TIMEOUT, || {
            let mut counter: BTreeMap<String, usize> = BTreeMap::new();
            for _ in 0..2 * total {
                if let Some(a) = suite.get(&h, &[]).filter(|a| a.status == 200) {
                    *counter.entry(a.who()).or_default() += 1;
                }
            }
            let expected: Vec<&str> = instances
                .iter()
                .zip(replicas)
                .flat_map(|(pods, n)| pods[..*n].iter().map(|p| p.name.as_str()))
                .collect();
            let ok = counter.len() == expected.len()
                && expected.iter().all(|name| counter.get(*name) == Some(&2));
            last = counter;
            ok.then_some(())
        });
        assert!(
            ok.is_some(),
            "{replicas:?}: every replica twice, got {last:?}"
        );
    };
    let add = |instances: &mut Vec<Vec<Pod>>, replicas: &mut Vec<usize>, n: usize| {
        let i = instances.len();
        instances.push(
            (0..n.max(1))
                .map(|r| Pod::start(&format!("http-echo-{i}-{r}"), Reply::Echo))
                .collect(),
        );
        replicas.push(n);
    };
    // The suite's setup: one instance, one replica.
    add(&mut instances, &mut replicas, 1);
    write(&instances, &replicas, false);
    every_replica_reachable(&instances, &replicas);
    // different port added without scaling
    add(&mut instances, &mut replicas, 1);
    write(&instances, &replicas, false);
    every_replica_reachable(&instances, &replicas);
    // different port added with scaling
    add(&mut instances, &mut replicas, 8);
    write(&instances, &replicas, false);
    every_replica_reachable(&instances, &replicas);
    // different port added while previous port removed
    add(&mut instances, &mut replicas, 1);
    let previous = replicas.len() - 2;
    replicas[previous] = 0;
    write(&instances, &replicas, false);
    every_replica_reachable(&instances, &replicas);
    // standalone different ports
    add(&mut instances, &mut replicas, 1);
    write(&instances, &replicas, true);
    every_replica_reachable(&instances, &replicas);
    let cfg = config(&h);
    assert!(
        cfg.contains(&format!("backend {}_http-echo_svc_http-echo_80", suite.ns)),
        "a standalone backend"
    );
}

// ---------------------------------------------------------------------------------------------
// config-snippet

/// config-snippet `TestBackendCfgSnippet`: the Service's `backend-config-snippet` sets a
/// request header the pod sees.
#[test]
fn config_snippet_backend() {
    let h = harness();
    let suite = Suite::new("config-snippet-backend");
    let pod = Pod::start("http-echo", Reply::Echo);
    h.write(
        "config-snippet-backend.yaml",
        &[
            echo_service(
                &suite.ns,
                "http-echo",
                &[(
                    "backend-config-snippet",
                    "http-request set-header e2e-test %[str(test)]\n",
                )],
            ),
            slices(&suite.ns, "http-echo", &[pod.endpoint()]),
        ]
        .join("---\n"),
    );
    suite.ingress(&h, &[]);
    suite.eventually(
        &h,
        "the pod sees e2e-test",
        || suite.get(&h, &[]),
        |a| received(a, "e2e-test").as_deref() == Some("test"),
    );
}

/// config-snippet `TestFrontendCfgSnippet`: the ConfigMap's `frontend-config-snippet` gives
/// every request a unique id header. Its `unique-id-format` escapes a space with a
/// backslash (`%{+X}o\ %ci…`), which HAProxy's config reader takes as part of the word.
#[test]
fn config_snippet_frontend() {
    let h = own_harness(
        "  frontend-config-snippet: |\n    unique-id-format %{+X}o\\ %ci:%cp_%fi:%fp_%Ts_%rt:%pid\n    \
         unique-id-header X-Unique-ID\n",
        &SNIPPET_FLAGS,
    );
    let suite = Suite::new("config-snippet-frontend");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    suite.ingress(&h, &[]);
    suite.eventually(
        &h,
        "the pod sees X-Unique-ID",
        || suite.get(&h, &[]),
        |a| received(a, "x-unique-id").is_some(),
    );
}

// ---------------------------------------------------------------------------------------------
// haproxy-files

/// The haproxy-files suite's app: Service `http-echo` without pods, and its Ingress with the
/// suite's backend snippet (which reads a pattern file).
fn haproxy_files_app(suite: &Suite, h: &Harness) {
    h.write(
        "haproxy-files.yaml",
        &[
            echo_service(&suite.ns, "http-echo", &[]),
            ingress(
                &suite.ns,
                "http-echo",
                Some(CLASS),
                &[(
                    "backend-config-snippet",
                    "http-after-response set-header result %[var(txn.path),ltrim(/),map(patterns/mapping)]",
                )],
                Some(&suite.host),
                &[root("http-echo")],
                &[],
            ),
        ]
        .join("---\n"),
    );
}

/// haproxy-files `Test_ErrorFiles`: the `--configmap-errorfiles` page for 503 (whose status
/// line says 521) answers for a Service without pods; without the ConfigMap, HAProxy's 503.
#[test]
fn haproxy_files_error_files() {
    let h = own_harness(
        "",
        &["--configmap-errorfiles", "haproxy-controller/errorfiles"],
    );
    let suite = Suite::new("haproxy-files");
    haproxy_files_app(&suite, &h);
    // Enabled
    h.write(
        "errorfiles.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: errorfiles\n  namespace: haproxy-controller\n\
         data:\n  \"503\": |-\n    HTTP/1.1 521 Web server is down\n    Cache-Control: no-cache\n    \
         Connection: close\n    Content-Type: text/html\n\n    <html><body><h1>Oops, that's embarrassing!</h1>\n    \
         There are no servers available to handle your request.\n    </body></html>\n",
    );
    suite.eventually(
        &h,
        "Enabled: 521",
        || suite.get(&h, &[]),
        |a| a.status == 521,
    );
    // Disabled
    h.remove("errorfiles.yaml");
    suite.eventually(
        &h,
        "Disabled: 503",
        || suite.get(&h, &[]),
        |a| a.status == 503,
    );
}

/// haproxy-files `Test_PatternFiles`: a backend snippet maps the path through a pattern file
/// of `--configmap-patternfiles` into a response header; updating the ConfigMap updates the
/// answers.
#[test]
fn haproxy_files_pattern_files() {
    let mut flags = SNIPPET_FLAGS.to_vec();
    flags.extend([
        "--configmap-patternfiles",
        "haproxy-controller/patternfiles",
    ]);
    let patterns = |lines: &[(&str, usize)]| {
        let body: String = lines
            .iter()
            .map(|(k, v)| format!("    {k} {v}\n"))
            .collect();
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: patternfiles\n  \
             namespace: haproxy-controller\ndata:\n  mapping: |\n{body}"
        )
    };
    let first = [("alpha-0", 0), ("alpha-1", 1), ("alpha-2", 2)];
    let second = [("beta-0", 0), ("beta-1", 1), ("beta-2", 2)];
    let mut h = Harness::new();
    h.write("ingressclass.yaml", &ingress_class());
    h.write("patternfiles.yaml", &patterns(&first));
    let mut all = CLASS_FLAGS.to_vec();
    all.extend(flags);
    h.start(&all);
    let suite = Suite::new("haproxy-files-patterns");
    haproxy_files_app(&suite, &h);
    for (step, lines) in [("Enabled", &first), ("Updated", &second)] {
        if step == "Updated" {
            h.write("patternfiles.yaml", &patterns(lines));
        }
        for (key, value) in lines.iter() {
            let path = format!("/{key}");
            let want = value.to_string();
            suite.eventually(
                &h,
                &format!("{step}: {path} gives result {value}"),
                || suite.send(&h, "GET", &path, &[]),
                |a| a.header("result") == Some(want.as_str()),
            );
        }
    }
}
