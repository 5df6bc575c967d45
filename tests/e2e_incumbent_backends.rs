//! haproxytech/kubernetes-ingress' own suites for what a Service's backend does, re-expressed
//! against Portcullis: `cookie-persistence`, `canary-deployment`, the `route-acl`
//! configuration tests (`deploy/tests/tnr/routeacl`), `send-proxy-protocol` and the
//! `timeout-server` integration tests. One test per suite case, in the suites' shape (an
//! `http-echo` app and an Ingress of class `haproxy` per suite namespace), their assertions
//! polled until they hold.
//!
//! The tests share one `portcullis run` with the controller ConfigMap of the timeout suite
//! (`timeout-server: 77000`) and a dynamic cookie key; they differ by namespace and host.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod incumbent;
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use incumbent::*;
use support::{APPLY_TIMEOUT, Harness, wait_until};

static SHARED: Shared = Shared::new();

fn harness() -> Arc<Harness> {
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend(CONFIGMAP_FLAGS);
    flags.extend([
        "--dynamic-cookie-key-secret",
        "haproxy-controller/cookie-key",
    ]);
    SHARED.get(
        |h| {
            h.write("ingressclass.yaml", &ingress_class());
            h.write(
                "configmap.yaml",
                &controller_configmap(&[("timeout-server", "77000")]),
            );
            h.write(
                "cookie-key.yaml",
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: cookie-key\n  \
                 namespace: haproxy-controller\nstringData:\n  dynamic-cookie-key: ohph7OoGhong\n",
            );
        },
        &flags,
    )
}

/// The lines of the backend of Service `svc` port 80 in namespace `ns`.
fn backend_lines(h: &Harness, ns: &str, svc: &str) -> Vec<String> {
    section(&config(h), &format!("backend {ns}_{svc}_80"))
        .into_iter()
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// cookie-persistence

/// The suite's Service annotation for each step.
#[derive(Debug, Clone, Copy)]
enum Cookie {
    Dynamic,
    NoDynamic,
    None,
}

fn cookie_step(suite: &Suite, h: &Harness, pod: &Pod, step: Cookie) {
    let annotations: &[(&str, &str)] = match step {
        Cookie::Dynamic => &[("cookie-persistence", "mycookie")],
        Cookie::NoDynamic => &[("cookie-persistence-no-dynamic", "mycookie")],
        Cookie::None => &[],
    };
    h.write(
        &format!("{}-app.yaml", suite.ns),
        &format!(
            "{}---\n{}",
            echo_service(&suite.ns, "http-echo", annotations),
            slices(&suite.ns, "http-echo", &[pod.endpoint()])
        ),
    );
    // Which cookie this step's configuration sets: a dynamic one is 16 hex digits, the other
    // the slot name.
    let expected = |value: Option<&str>| match (step, value) {
        (Cookie::Dynamic, Some(v)) => v.len() == 16 && v.bytes().all(|b| b.is_ascii_hexdigit()),
        (Cookie::NoDynamic, Some(v)) => v.starts_with("SRV_"),
        (Cookie::None, None) => true,
        _ => false,
    };
    let mut value = None;
    suite.eventually(
        h,
        &format!("{step:?}: 200 and the step's mycookie cookie"),
        || suite.get(h, &[]),
        |a| {
            let set = set_cookie(a, "mycookie");
            a.status == 200
                && expected(set.as_deref())
                && header_values(a, "set-cookie").len() == usize::from(set.is_some())
        },
    );
    if !matches!(step, Cookie::None) {
        value = suite.get(h, &[]).and_then(|a| set_cookie(&a, "mycookie"));
        assert!(expected(value.as_deref()), "{value:?}");
    }
    let lines = backend_lines(h, &suite.ns, "http-echo");
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    let servers: Vec<&String> = lines.iter().filter(|l| l.starts_with("server ")).collect();
    assert!(!servers.is_empty(), "{lines:?}");
    match step {
        Cookie::Dynamic => {
            assert!(
                has("cookie mycookie insert indirect nocache dynamic"),
                "{lines:?}"
            );
            assert!(has("dynamic-cookie-key "), "{lines:?}");
            assert!(
                servers.iter().all(|l| !l.contains(" cookie ")),
                "no cookie on the server lines: {servers:?}"
            );
            let value = value.expect("a cookie value");
            assert!(
                value.len() == 16 && value.bytes().all(|b| b.is_ascii_hexdigit()),
                "a dynamic cookie: {value}"
            );
        }
        Cookie::NoDynamic => {
            assert!(has("cookie mycookie insert indirect nocache"), "{lines:?}");
            assert!(!has("dynamic"), "{lines:?}");
            // The cookie names the server slot that answered, whose line carries it.
            let value = value.expect("a cookie value");
            assert!(value.starts_with("SRV_"), "a slot name: {value}");
            let line = format!("server {value} ");
            let server = servers
                .iter()
                .find(|l| l.starts_with(&line))
                .unwrap_or_else(|| panic!("no {line}: {servers:?}"));
            assert!(
                server.contains(&format!(":{} ", pod.port))
                    || server.ends_with(&format!(":{}", pod.port))
                    || server.contains(&format!(":{} cookie", pod.port)),
                "{server}"
            );
            assert!(server.ends_with(&format!("cookie {value}")), "{server}");
        }
        Cookie::None => {
            assert!(!has("cookie mycookie"), "{lines:?}");
            assert!(!has("dynamic-cookie-key"), "{lines:?}");
            assert!(
                servers.iter().all(|l| !l.contains(" cookie ")),
                "{servers:?}"
            );
        }
    }
}

fn cookie_suite(name: &str) -> (Suite, Pod) {
    let suite = Suite::new(name);
    let pod = Pod::start("http-echo", Reply::Echo);
    (suite, pod)
}

/// cookie-persistence `Test_CookiePersistence_Dynamic`.
#[test]
fn cookie_persistence_dynamic() {
    let h = harness();
    let (suite, pod) = cookie_suite("cookie-dynamic");
    suite.ingress(&h, &[]);
    cookie_step(&suite, &h, &pod, Cookie::Dynamic);
    cookie_step(&suite, &h, &pod, Cookie::None);
}

/// cookie-persistence `Test_CookiePersistence_No_Dynamic`.
#[test]
fn cookie_persistence_no_dynamic() {
    let h = harness();
    let (suite, pod) = cookie_suite("cookie-no-dynamic");
    suite.ingress(&h, &[]);
    cookie_step(&suite, &h, &pod, Cookie::NoDynamic);
    cookie_step(&suite, &h, &pod, Cookie::None);
}

/// cookie-persistence `Test_CookiePersistence_Switch`.
#[test]
fn cookie_persistence_switch() {
    let h = harness();
    let (suite, pod) = cookie_suite("cookie-switch");
    suite.ingress(&h, &[]);
    cookie_step(&suite, &h, &pod, Cookie::Dynamic);
    cookie_step(&suite, &h, &pod, Cookie::NoDynamic);
    cookie_step(&suite, &h, &pod, Cookie::Dynamic);
}

// ---------------------------------------------------------------------------------------------
// canary-deployment

/// canary-deployment `Test_Response_Percentage`: the staging Service's `route-acl: rand(100)
/// lt N` takes about N % of the requests for the shared path.
#[test]
fn canary_deployment_response_percentage() {
    let h = harness();
    let suite = Suite::new("canary-deployment");
    let prod = Pod::start("http-echo-prod", Reply::Echo);
    let staging = Pod::start("http-echo-staging", Reply::Echo);
    let apply = |percentage: u32| {
        let acl = format!("rand(100) lt {percentage}");
        h.write(
            &format!("{}-app.yaml", suite.ns),
            &[
                echo_service(&suite.ns, "http-echo-prod", &[]),
                slices(&suite.ns, "http-echo-prod", &[prod.endpoint()]),
                echo_service(&suite.ns, "http-echo-staging", &[("route-acl", &acl)]),
                slices(&suite.ns, "http-echo-staging", &[staging.endpoint()]),
                ingress(
                    &suite.ns,
                    "http-echo",
                    Some(CLASS),
                    &[],
                    Some(&suite.host),
                    &[
                        IngPath {
                            path: Some("/"),
                            path_type: "ImplementationSpecific",
                            service: "http-echo-prod",
                            port: "http",
                        },
                        IngPath {
                            path: None,
                            path_type: "ImplementationSpecific",
                            service: "http-echo-staging",
                            port: "http",
                        },
                    ],
                    &[],
                ),
            ]
            .join("---\n"),
        );
    };
    let count = |n: usize| -> BTreeMap<String, usize> {
        let mut seen = BTreeMap::new();
        for _ in 0..n {
            let who = suite.get(&h, &[]).map_or("none".into(), |a| a.who());
            *seen.entry(who).or_default() += 1;
        }
        seen
    };
    // Setup: rand(100) lt 0, prod answers.
    apply(0);
    suite.eventually(
        &h,
        "prod answers",
        || suite.get(&h, &[]),
        |a| a.who() == "http-echo-prod",
    );
    assert_eq!(count(10), BTreeMap::from([("http-echo-prod".into(), 10)]));
    apply(100);
    wait_until(
        APPLY_TIMEOUT,
        "100 %: staging answers every request",
        || count(10) == BTreeMap::from([("http-echo-staging".into(), 10)]),
    );
    apply(25);
    wait_until(APPLY_TIMEOUT, "25 %: prod answers again", || {
        count(10).contains_key("http-echo-prod")
    });
    h.wait_old_workers_gone();
    // The suite takes 10 requests and wants 3 or 4 staging answers; 400 requests give a
    // bound that holds with near certainty (mean 100, standard deviation about 8.7).
    let seen = count(400);
    let staging_n = seen.get("http-echo-staging").copied().unwrap_or(0);
    let prod_n = seen.get("http-echo-prod").copied().unwrap_or(0);
    assert_eq!(staging_n + prod_n, 400, "{seen:?}");
    assert!((60..=140).contains(&staging_n), "about 25 %: {seen:?}");
    apply(0);
    wait_until(APPLY_TIMEOUT, "0 %: prod answers every request", || {
        count(10) == BTreeMap::from([("http-echo-prod".into(), 10)])
    });
}

// ---------------------------------------------------------------------------------------------
// route-acl (deploy/tests/tnr/routeacl)

/// routeacl `TestUseBackend` (the incumbent's issue 476): changing another annotation of the
/// canary Service does not repeat its routing rule.
#[test]
fn route_acl_use_backend_not_repeated() {
    let h = harness();
    let suite = Suite::new("routeacl-usebackend");
    let pod = Pod::start("myappservice", Reply::Echo);
    let host = format!("{}.test", suite.ns);
    let write = |extra: bool| {
        let mut annotations = vec![("route-acl", "cookie(staging) -m found")];
        if extra {
            annotations.push(("anyannotation", "anyvalue"));
        }
        h.write(
            &format!("{}-app.yaml", suite.ns),
            &[
                echo_service(&suite.ns, "myappservice", &annotations),
                slices(&suite.ns, "myappservice", &[pod.endpoint()]),
                ingress(
                    &suite.ns,
                    "myapping",
                    Some(CLASS),
                    &[],
                    Some(&host),
                    &[root("myappservice")],
                    &[],
                ),
            ]
            .join("---\n"),
        );
    };
    let with_cookie = || request(h.http_port, "GET", &host, "/", &[("Cookie", "staging=1")]);
    write(false);
    suite.eventually(
        &h,
        "the canary takes requests with the cookie",
        with_cookie,
        |a| a.who() == "myappservice",
    );
    write(true);
    // The rule is there once per frontend routing HTTP, and still routes.
    let rules_per_frontend = || {
        let cfg = config(&h);
        let frontends: Vec<String> = cfg
            .lines()
            .filter(|l| l.starts_with("frontend "))
            .map(str::to_string)
            .collect();
        frontends
            .iter()
            .map(|f| {
                section(&cfg, f)
                    .iter()
                    .filter(|l| l.contains("req.cook(staging) -m found"))
                    .count()
            })
            .filter(|n| *n > 0)
            .collect::<Vec<_>>()
    };
    // Nothing to wait for: the annotation changes nothing HAProxy sees. Give the change the
    // time to be applied, checking all along.
    support::holds_for(
        std::time::Duration::from_millis(600),
        "one rule per frontend, still routing",
        || {
            let counts = rules_per_frontend();
            !counts.is_empty()
                && counts.iter().all(|n| *n == 1)
                && with_cookie().is_some_and(|a| a.who() == "myappservice")
        },
    );
    let without = request(h.http_port, "GET", &host, "/", &[]).unwrap();
    assert_eq!(without.status, 404, "no regular route: the default backend");
}

/// routeacl `TestNonWildcardHostWithRouteACL` (the incumbent's issue 734): a route-acl on a
/// Service routed for a plain host. The incumbent's value is `path_reg path-in-bug-repro$`;
/// Portcullis reads the same condition written `path -m reg` and refuses `path_reg` with a
/// diagnostic (its route-acl is a checked subset of HAProxy's ACL syntax).
#[test]
fn route_acl_non_wildcard_host() {
    let h = harness();
    let suite = Suite::new("routeacl-host");
    let pod = Pod::start("api-service", Reply::Echo);
    route_acl_case(&suite, &h, &pod, "api.example.local", "api.example.local");
}

/// routeacl `TestWildcardHostWithRouteACL`: the same on a wildcard host.
#[test]
fn route_acl_wildcard_host() {
    let h = harness();
    let suite = Suite::new("routeacl-wildcard");
    let pod = Pod::start("api-service", Reply::Echo);
    route_acl_case(&suite, &h, &pod, "*.example.wild", "app.example.wild");
}

fn route_acl_case(suite: &Suite, h: &Harness, pod: &Pod, rule_host: &str, host: &str) {
    let write = |acl: &str| {
        h.write(
            &format!("{}-app.yaml", suite.ns),
            &[
                echo_service(&suite.ns, "api-service", &[("route-acl", acl)]),
                slices(&suite.ns, "api-service", &[pod.endpoint()]),
                ingress(
                    &suite.ns,
                    "api-ingress",
                    Some(CLASS),
                    &[],
                    Some(rule_host),
                    &[root("api-service")],
                    &[],
                ),
            ]
            .join("---\n"),
        );
    };
    write("path -m reg path-in-bug-repro$");
    let get = |path: &str| request(h.http_port, "GET", host, path, &[]);
    suite.eventually(
        h,
        "a matching path goes to the Service",
        || get("/x/path-in-bug-repro"),
        |a| a.who() == "api-service",
    );
    assert_eq!(get("/other").map(|a| a.status), Some(404), "no other route");
    // The incumbent's spelling: refused on the Service, and the path is an ordinary route.
    write("path_reg path-in-bug-repro$");
    let object = format!("Service {}/api-service", suite.ns);
    wait_until(APPLY_TIMEOUT, "path_reg is reported", || {
        log_has(h, &[&object, "route-acl"])
    });
    suite.eventually(
        h,
        "the path is an ordinary route",
        || get("/other"),
        |a| a.who() == "api-service",
    );
}

// ---------------------------------------------------------------------------------------------
// send-proxy-protocol

/// send-proxy-protocol `Test_Send_Proxy`: the pod, which wants a PROXY v1 header, says
/// `hello!`.
#[test]
fn send_proxy_protocol() {
    let h = harness();
    let suite = Suite::new("send-proxy-protocol");
    let pod = Pod::start("http-echo", Reply::ProxyHello);
    h.write(
        &format!("{}-app.yaml", suite.ns),
        &format!(
            "{}---\n{}",
            echo_service(
                &suite.ns,
                "http-echo",
                &[("send-proxy-protocol", "proxy-v1")]
            ),
            slices(&suite.ns, "http-echo", &[pod.endpoint()])
        ),
    );
    suite.ingress(&h, &[]);
    suite.eventually(
        &h,
        "the pod says hello!",
        || suite.get(&h, &[]),
        |a| a.status == 200 && a.body == "hello!",
    );
}

// ---------------------------------------------------------------------------------------------
// timeout-server (deploy/tests/integration/timeout-server)

/// The suite's app: Service `appSvcName` and Ingress `appIngName`, each with an optional
/// `timeout-server`; waits until its backend is rendered and returns its lines.
fn timeout_app(
    suite: &Suite,
    h: &Harness,
    service: Option<&str>,
    ingress_value: Option<&str>,
) -> Vec<String> {
    let pod = Pod::start("app", Reply::Echo);
    let svc: Vec<(&str, &str)> = service.map(|v| ("timeout-server", v)).into_iter().collect();
    let ing: Vec<(&str, &str)> = ingress_value
        .map(|v| ("timeout-server", v))
        .into_iter()
        .collect();
    h.write(
        &format!("{}-app.yaml", suite.ns),
        &[
            echo_service(&suite.ns, "appsvcname", &svc),
            slices(&suite.ns, "appsvcname", &[pod.endpoint()]),
            ingress(
                &suite.ns,
                "appingname",
                Some(CLASS),
                &ing,
                Some(&suite.host),
                &[root("appsvcname")],
                &[],
            ),
        ]
        .join("---\n"),
    );
    suite.eventually(
        h,
        "the app is served",
        || suite.get(h, &[]),
        |a| a.status == 200,
    );
    let defaults = section(&config(h), "defaults")
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    assert!(
        defaults.iter().any(|l| l == "timeout server 77000"),
        "the ConfigMap's value in defaults: {defaults:?}"
    );
    drop(pod);
    backend_lines(h, &suite.ns, "appsvcname")
        .into_iter()
        .filter(|l| l.starts_with("timeout server"))
        .collect()
}

/// timeout-server `TestTimeoutServerConfigMap`: the ConfigMap's value in defaults and in the
/// app's backend.
#[test]
fn timeout_server_configmap() {
    let h = harness();
    let suite = Suite::new("timeout-configmap");
    assert_eq!(
        timeout_app(&suite, &h, None, None),
        ["timeout server 77000"]
    );
}

/// timeout-server `TestTimeoutServerService`: the Service's value beats the Ingress' and the
/// ConfigMap's.
#[test]
fn timeout_server_service() {
    let h = harness();
    let suite = Suite::new("timeout-service");
    assert_eq!(
        timeout_app(&suite, &h, Some("75000"), Some("76000")),
        ["timeout server 75000"]
    );
}

/// timeout-server `TestTimeoutServerIngress`: the Ingress' value beats the ConfigMap's.
#[test]
fn timeout_server_ingress() {
    let h = harness();
    let suite = Suite::new("timeout-ingress");
    assert_eq!(
        timeout_app(&suite, &h, None, Some("76000")),
        ["timeout server 76000"]
    );
}
