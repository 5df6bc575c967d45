//! HTTPRoute features past the core routing, on the real `portcullis run` and HAProxy: the
//! CORS filter (a table in the shape of the upstream HTTPRouteCORS conformance test),
//! `RegularExpression` paths, and the route hooks of the policy scripts acting on HTTPRoutes
//! (a site script, the bundled annotations, a hostile route that can only hurt itself).
//!
//! Every loop here is bounded in count and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;

use support::{APPLY_TIMEOUT, Answer, Harness, poll};

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: portcullis
spec:
  controllerName: portcullis.io/gateway-controller
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: same-namespace
  namespace: infra
spec:
  gatewayClassName: portcullis
  listeners:
  - name: http
    port: 80
    protocol: HTTP
    allowedRoutes:
      namespaces:
        from: All
";

/// A controller serving the base Gateway, echo backends `infra-backend-v1..v3` and
/// `manifests`, with `extra` flags.
fn serving(manifests: &str, extra: &[&str]) -> Harness {
    let mut h = Harness::new();
    for name in ["infra-backend-v1", "infra-backend-v2", "infra-backend-v3"] {
        let backend = h.backend("infra", name);
        h.write(&format!("{name}.yaml"), &backend);
    }
    h.write("gateway.yaml", GATEWAY);
    h.write("routes.yaml", manifests);
    h.start(extra);
    h
}

fn send(h: &Harness, method: &str, host: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let addr = SocketAddr::from(([127, 0, 0, 1], h.http_port));
    support::http_request(addr, method, host, path, headers)
        .unwrap_or_else(|e| panic!("{method} {host}{path}: {e}\n{}", h.log()))
}

/// A request header as the echo backend received it.
fn received(answer: &Answer, name: &str) -> Option<String> {
    answer.body.lines().find_map(|line| {
        let (n, v) = line.split_once(": ")?;
        n.eq_ignore_ascii_case(name).then(|| v.to_string())
    })
}

/// Polls until `check` holds for the answer to the request (the controller applies changes
/// within [`APPLY_TIMEOUT`]), and fails with the last answer and the log.
fn eventually(
    h: &Harness,
    what: &str,
    request: (&str, &str, &str, &[(&str, &str)]),
    check: impl Fn(&Answer) -> bool,
) -> Answer {
    let (method, host, path, headers) = request;
    let mut last = None;
    let found = poll(APPLY_TIMEOUT, || {
        let answer = send(h, method, host, path, headers);
        let ok = check(&answer);
        last = Some(answer.clone());
        ok.then_some(answer)
    });
    found.unwrap_or_else(|| {
        panic!(
            "{what}: {method} {host}{path} {headers:?}: last answer {last:?}\n{}",
            support::log_tail(&h.log(), 80)
        )
    })
}

const CORS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: cors-multiple-origins-methods-headers
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /cors-1
    filters:
    - type: CORS
      cors:
        allowOrigins:
        - https://www.foo.com
        - https://*.bar.com
        allowMethods: [GET, OPTIONS]
        allowHeaders: [x-header-1, x-header-2]
        exposeHeaders: [x-header-3, x-header-4]
        allowCredentials: true
        maxAge: 3600
    backendRefs:
    - name: infra-backend-v1
      port: 80
  - matches:
    - path:
        type: PathPrefix
        value: /cors-2
    filters:
    - type: CORS
      cors:
        allowOrigins: [https://www.foo.com]
        allowMethods: ['*']
    backendRefs:
    - name: infra-backend-v1
      port: 80
  - matches:
    - path:
        type: PathPrefix
        value: /cors-wildcard-origin
    filters:
    - type: CORS
      cors:
        allowOrigins: ['*']
        allowMethods: [PUT]
    backendRefs:
    - name: infra-backend-v1
      port: 80
  - matches:
    - path:
        type: PathPrefix
        value: /cors-wildcard-methods-headers
    filters:
    - type: CORS
      cors:
        allowOrigins: ['*']
        allowMethods: ['*']
        allowHeaders: ['*']
        allowCredentials: true
    backendRefs:
    - name: infra-backend-v1
      port: 80
  - matches:
    - path:
        type: PathPrefix
        value: /cors-wildcard-methods-headers-unauth
    filters:
    - type: CORS
      cors:
        allowOrigins: ['*']
        allowMethods: ['*']
        allowHeaders: ['*']
    backendRefs:
    - name: infra-backend-v1
      port: 80
  - matches:
    - path:
        type: PathPrefix
        value: /cors-bad
    filters:
    - type: CORS
      cors:
        allowOrigins: [https://www.foo.com/path]
    backendRefs:
    - name: infra-backend-v1
      port: 80
";

/// One row of the CORS table: a request, the statuses allowed, the headers that must have
/// one of the listed values, and those that must be absent.
struct CorsCase {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    statuses: &'static [u16],
    valid: &'static [(&'static str, &'static [&'static str])],
    absent: &'static [&'static str],
}

const PREFLIGHT_FOO: &[(&str, &str)] = &[
    ("Origin", "https://www.foo.com"),
    ("Access-Control-Request-Method", "GET"),
    ("Access-Control-Request-Headers", "x-header-1, x-header-2"),
];

const CORS_1_ALLOWED: &[(&str, &[&str])] = &[
    ("access-control-allow-methods", &["GET, OPTIONS"]),
    ("access-control-allow-headers", &["x-header-1, x-header-2"]),
    ("access-control-expose-headers", &["x-header-3, x-header-4"]),
    ("access-control-max-age", &["3600"]),
    ("access-control-allow-credentials", &["true"]),
];

const CORS_CASES: &[CorsCase] = &[
    CorsCase {
        name: "preflight from an exact origin",
        method: "OPTIONS",
        path: "/cors-1",
        headers: PREFLIGHT_FOO,
        statuses: &[200, 204],
        valid: CORS_1_ALLOWED,
        absent: &[],
    },
    CorsCase {
        name: "preflight from a wildcard origin",
        method: "OPTIONS",
        path: "/cors-1",
        headers: &[
            ("Origin", "https://www.bar.com"),
            ("Access-Control-Request-Method", "GET"),
        ],
        statuses: &[200, 204],
        valid: &[("access-control-allow-origin", &["https://www.bar.com"])],
        absent: &[],
    },
    CorsCase {
        name: "preflight from a wildcard origin, several labels under it",
        method: "OPTIONS",
        path: "/cors-1",
        headers: &[
            ("Origin", "https://xpto.www.bar.com"),
            ("Access-Control-Request-Method", "GET"),
        ],
        statuses: &[200, 204],
        valid: &[
            ("access-control-allow-origin", &["https://xpto.www.bar.com"]),
            ("access-control-max-age", &["3600"]),
        ],
        absent: &[],
    },
    CorsCase {
        name: "preflight from an origin not allowed",
        method: "OPTIONS",
        path: "/cors-1",
        headers: &[
            ("Origin", "https://foobar.com"),
            ("Access-Control-Request-Method", "GET"),
        ],
        statuses: &[200, 204, 403],
        valid: &[],
        absent: &["access-control-allow-origin"],
    },
    CorsCase {
        name: "the wildcard does not match the bare domain",
        method: "OPTIONS",
        path: "/cors-1",
        headers: &[
            ("Origin", "https://bar.com"),
            ("Access-Control-Request-Method", "GET"),
        ],
        statuses: &[200, 204, 403],
        valid: &[],
        absent: &["access-control-allow-origin"],
    },
    CorsCase {
        name: "simple request from an exact origin",
        method: "GET",
        path: "/cors-1",
        headers: &[("Origin", "https://www.foo.com")],
        statuses: &[200],
        valid: &[("access-control-allow-origin", &["https://www.foo.com"])],
        absent: &[],
    },
    CorsCase {
        name: "simple request from an origin not allowed",
        method: "GET",
        path: "/cors-1",
        headers: &[("Origin", "https://foobar.com")],
        statuses: &[200],
        valid: &[],
        absent: &["access-control-allow-origin"],
    },
    CorsCase {
        name: "wildcard methods allow POST, without credentials",
        method: "OPTIONS",
        path: "/cors-2",
        headers: &[
            ("Origin", "https://www.foo.com"),
            ("Access-Control-Request-Method", "POST"),
        ],
        statuses: &[200, 204],
        valid: &[
            ("access-control-allow-methods", &["POST", "*"]),
            ("access-control-allow-origin", &["https://www.foo.com"]),
            ("access-control-max-age", &["5"]),
        ],
        absent: &["access-control-allow-credentials"],
    },
    CorsCase {
        name: "preflight to a wildcard origin",
        method: "OPTIONS",
        path: "/cors-wildcard-origin",
        headers: &[
            ("Origin", "https://foobar.com:12345"),
            ("Access-Control-Request-Method", "PUT"),
        ],
        statuses: &[200, 204],
        valid: &[
            (
                "access-control-allow-origin",
                &["https://foobar.com:12345", "*"],
            ),
            ("access-control-allow-methods", &["PUT"]),
        ],
        absent: &["access-control-allow-credentials"],
    },
    CorsCase {
        name: "request to a wildcard origin",
        method: "PUT",
        path: "/cors-wildcard-origin",
        headers: &[("Origin", "https://foobar.com")],
        statuses: &[200],
        valid: &[("access-control-allow-origin", &["https://foobar.com", "*"])],
        absent: &["access-control-allow-credentials"],
    },
    CorsCase {
        name: "credentialed wildcards echo what the preflight asks for",
        method: "OPTIONS",
        path: "/cors-wildcard-methods-headers",
        headers: &[
            ("Origin", "https://other.foo.com"),
            ("Access-Control-Request-Method", "PUT"),
            ("Access-Control-Request-Headers", "x-header-1, x-header-2"),
        ],
        statuses: &[200, 204],
        valid: &[
            ("access-control-allow-origin", &["https://other.foo.com"]),
            ("access-control-allow-methods", &["PUT"]),
            ("access-control-allow-headers", &["x-header-1, x-header-2"]),
            ("access-control-allow-credentials", &["true"]),
        ],
        absent: &[],
    },
    CorsCase {
        name: "without credentials, wildcards may stay wildcards",
        method: "OPTIONS",
        path: "/cors-wildcard-methods-headers-unauth",
        headers: &[
            ("Origin", "https://other.foo.com"),
            ("Access-Control-Request-Method", "PUT"),
            ("Access-Control-Request-Headers", "x-header-1, x-header-2"),
        ],
        statuses: &[200, 204],
        valid: &[
            (
                "access-control-allow-origin",
                &["https://other.foo.com", "*"],
            ),
            ("access-control-allow-methods", &["PUT", "*"]),
            (
                "access-control-allow-headers",
                &["x-header-1, x-header-2", "*"],
            ),
        ],
        absent: &["access-control-allow-credentials"],
    },
    CorsCase {
        name: "a credentialed request gets its origin and credentials",
        method: "GET",
        path: "/cors-wildcard-methods-headers",
        headers: &[("Origin", "https://other.foo.com"), ("Cookie", "foo=bar")],
        statuses: &[200],
        valid: &[
            ("access-control-allow-origin", &["https://other.foo.com"]),
            ("access-control-allow-credentials", &["true"]),
        ],
        absent: &[],
    },
    CorsCase {
        name: "a request without credentials allowed hides them",
        method: "GET",
        path: "/cors-wildcard-methods-headers-unauth",
        headers: &[("Origin", "https://other.foo.com"), ("Cookie", "foo=bar")],
        statuses: &[200],
        valid: &[(
            "access-control-allow-origin",
            &["https://other.foo.com", "*"],
        )],
        absent: &["access-control-allow-credentials"],
    },
];

/// The CORS filter as the HTTPRouteCORS conformance test expects it: preflight requests from
/// allowed origins (exact, and `*.` wildcards of one or more labels) answered by HAProxy with
/// the configured headers, actual requests served by the backend with
/// `Access-Control-Allow-Origin`, other origins without it; credentialed wildcards echo the
/// request. A filter with a bad origin makes its rule answer 500 and is reported.
#[test]
fn cors_filter_answers_as_the_conformance_test_expects() {
    let h = serving(CORS, &[]);
    for c in CORS_CASES {
        eventually(
            &h,
            c.name,
            (c.method, "cors.example.com", c.path, c.headers),
            |a| {
                c.statuses.contains(&a.status)
                    && c.valid
                        .iter()
                        .all(|(name, values)| a.header(name).is_some_and(|v| values.contains(&v)))
                    && c.absent.iter().all(|name| a.header(name).is_none())
            },
        );
    }
    // A preflight is answered by HAProxy: the backend never sees it.
    let preflight = send(&h, "OPTIONS", "cors.example.com", "/cors-1", PREFLIGHT_FOO);
    assert_eq!(preflight.status, 204, "{preflight:?}");
    assert!(!preflight.body.contains("infra-backend"), "{preflight:?}");
    // A bare OPTIONS (no Access-Control-Request-Method) is not a preflight: the pod answers.
    let bare = send(
        &h,
        "OPTIONS",
        "cors.example.com",
        "/cors-1",
        &[("Origin", "https://www.foo.com")],
    );
    assert_eq!(bare.who(), "infra-backend-v1", "{bare:?}");
    let bad = send(&h, "GET", "cors.example.com", "/cors-bad", &[]);
    assert_eq!(bad.status, 500, "{bad:?}");
    let log = h.log();
    assert!(
        log.lines().any(
            |l| l.contains("HTTPRoute infra/cors-multiple-origins-methods-headers")
                && l.contains("spec.rules[5].filters[0].cors.allowOrigins[0]")
        ),
        "the bad origin is not reported:\n{log}"
    );
}

const REGEX: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: regex
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
  hostnames: [regex.example.com]
  rules:
  - backendRefs:
    - name: infra-backend-v1
      port: 80
  - matches:
    - path:
        type: RegularExpression
        value: /items/[0-9]+
    - path:
        type: RegularExpression
        value: /v[12]/.*/edit
    backendRefs:
    - name: infra-backend-v2
      port: 80
  - matches:
    - path:
        type: PathPrefix
        value: /items/special
    backendRefs:
    - name: infra-backend-v3
      port: 80
  - matches:
    - path:
        type: RegularExpression
        value: /broken/([
    - path:
        type: Exact
        value: /unbroken
    backendRefs:
    - name: infra-backend-v3
      port: 80
";

/// `RegularExpression` paths match the whole path; a longer prefix of another rule still
/// wins; a pattern PCRE2 refuses is reported on its field and only that match is skipped.
#[test]
fn regular_expression_paths_match_the_whole_path() {
    let h = serving(REGEX, &[]);
    for (path, expect) in [
        ("/items/42", "infra-backend-v2"),
        ("/items/42?x=1", "infra-backend-v2"),
        ("/items/42/more", "infra-backend-v1"),
        ("/items/abc", "infra-backend-v1"),
        ("/v1/doc/edit", "infra-backend-v2"),
        ("/v3/doc/edit", "infra-backend-v1"),
        ("/items/special", "infra-backend-v3"),
        ("/unbroken", "infra-backend-v3"),
        ("/broken/x", "infra-backend-v1"),
    ] {
        eventually(&h, path, ("GET", "regex.example.com", path, &[]), |a| {
            a.who() == expect
        });
    }
    let log = h.log();
    assert!(
        log.lines().any(|l| l.contains("HTTPRoute infra/regex")
            && l.contains("spec.rules[3].matches[0].path.value")
            && l.contains("match skipped")),
        "the bad pattern is not reported:\n{log}"
    );
}

/// A site script that marks the responses of HTTPRoutes with what its hook saw.
const SITE_SCRIPT: &str = "// zz-route-kind.rhai: marks HTTPRoutes' responses.
//
// Scope:    route
// Risk:     low
// Read:     spin bool from HTTPRoute default false: spins forever (a broken script).
// Read:     response-set-header headers from Ingress, HTTPRoute, ConfigMap default none: the
//           headers the bundled response-set-header.rhai sets, appended to.

fn route(ctx) {
    if ctx.kind != \"HTTPRoute\" {
        return;
    }
    if ctx.bool(\"spin\") == true {
        let n = 0;
        loop { n += 1; }
    }
    let mark = `${ctx.kind} ${ctx.namespace}/${ctx.name} ${ctx.fact(\"path_type\")} ${ctx.fact(\"path\")}`;
    let headers = ctx.headers(\"response-set-header\") ?? [];
    headers.push([\"X-Hook\", mark]);
    #{ response_headers: headers }
}
";

const HOOKED: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: hooked
  namespace: infra
  annotations:
    haproxy.org/request-set-header: |
      X-Env annotation
      X-Team blue
    haproxy.org/response-set-header: X-Annotated yes
spec:
  parentRefs:
  - name: same-namespace
  hostnames: [hooked.example.com]
  rules:
  - matches:
    - path:
        type: PathPrefix
        value: /app
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set:
        - name: X-Env
          value: filter
    backendRefs:
    - name: infra-backend-v1
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: guarded
  namespace: infra
  annotations:
    haproxy.org/allow-list: 10.0.0.0/8
spec:
  parentRefs:
  - name: same-namespace
  hostnames: [guarded.example.com]
  rules:
  - backendRefs:
    - name: infra-backend-v1
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: cors-both
  namespace: infra
  annotations:
    haproxy.org/cors-enable: \"true\"
    haproxy.org/cors-allow-origin: https://annotation.example
spec:
  parentRefs:
  - name: same-namespace
  hostnames: [cors-both.example.com]
  rules:
  - matches:
    - path:
        value: /filter
    filters:
    - type: CORS
      cors:
        allowOrigins: [https://filter.example]
    backendRefs:
    - name: infra-backend-v2
      port: 80
  - backendRefs:
    - name: infra-backend-v2
      port: 80
";

/// The route hooks run for HTTPRoutes: a site script sees `ctx.kind == \"HTTPRoute\"` and the
/// match's facts; the bundled annotations act on the route (headers, an allow-list, CORS);
/// where a filter sets the same thing, the filter wins.
#[test]
fn route_hooks_act_on_httproutes_and_filters_win() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("zz-route-kind.rhai"), SITE_SCRIPT).unwrap();
    let h = serving(HOOKED, &["--scripts-dir", site.path().to_str().unwrap()]);
    let answer = eventually(
        &h,
        "the site script's header",
        ("GET", "hooked.example.com", "/app/x", &[]),
        |a| a.header("x-hook").is_some(),
    );
    assert_eq!(answer.who(), "infra-backend-v1", "{answer:?}");
    assert_eq!(
        answer.header("x-hook"),
        Some("HTTPRoute infra/hooked PathPrefix /app"),
        "{answer:?}"
    );
    // The site script re-read response-set-header and appended to it.
    assert_eq!(answer.header("x-annotated"), Some("yes"), "{answer:?}");
    // The annotation and the filter both set X-Env: the filter's value is the one sent.
    assert_eq!(
        received(&answer, "x-env").as_deref(),
        Some("filter"),
        "{answer:?}"
    );
    assert_eq!(
        received(&answer, "x-team").as_deref(),
        Some("blue"),
        "{answer:?}"
    );

    // allow-list on an HTTPRoute: 127.0.0.1 is not in 10.0.0.0/8.
    eventually(
        &h,
        "the allow-list",
        ("GET", "guarded.example.com", "/", &[]),
        |a| a.status == 403,
    );

    // The CORS filter wins over the cors-* annotations on its rule; the annotations act on
    // the rule without the filter.
    let preflight = |path: &str, origin: &str| {
        let headers = [("Origin", origin), ("Access-Control-Request-Method", "GET")];
        send(&h, "OPTIONS", "cors-both.example.com", path, &headers)
    };
    eventually(
        &h,
        "the filter's origin",
        (
            "OPTIONS",
            "cors-both.example.com",
            "/filter",
            &[
                ("Origin", "https://filter.example"),
                ("Access-Control-Request-Method", "GET"),
            ],
        ),
        |a| a.header("access-control-allow-origin") == Some("https://filter.example"),
    );
    let annotated_on_filter = preflight("/filter", "https://annotation.example");
    assert_eq!(
        annotated_on_filter.header("access-control-allow-origin"),
        None,
        "{annotated_on_filter:?}"
    );
    let annotated = preflight("/other", "https://annotation.example");
    assert_eq!(
        annotated.header("access-control-allow-origin"),
        Some("https://annotation.example"),
        "{annotated:?}"
    );
}

const HOSTILE: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: neighbour
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
  hostnames: [shared.example.com]
  rules:
  - matches:
    - path:
        value: /neighbour
    backendRefs:
    - name: infra-backend-v1
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: hostile
  namespace: app
  annotations:
    haproxy.org/allow-list: banana
    haproxy.org/request-set-header: X-Leak %[env(HOME)]
    haproxy.org/set-host: \"evil.example\\nuse_backend other\"
    haproxy.org/backend-config-snippet: http-request deny
spec:
  parentRefs:
  - name: same-namespace
    namespace: infra
  hostnames: [shared.example.com]
  rules:
  - matches:
    - path:
        value: /hostile
    backendRefs:
    - name: infra-backend-v1
      namespace: infra
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata:
  name: app-to-infra
  namespace: infra
spec:
  from:
  - group: gateway.networking.k8s.io
    kind: HTTPRoute
    namespace: app
  to:
  - group: \"\"
    kind: Service
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: spinner
  namespace: app
  annotations:
    haproxy.org/spin: \"true\"
    haproxy.org/response-set-header: X-Spinner yes
spec:
  parentRefs:
  - name: same-namespace
    namespace: infra
  hostnames: [shared.example.com]
  rules:
  - matches:
    - path:
        value: /spinner
    backendRefs:
    - name: infra-backend-v1
      namespace: infra
      port: 80
";

/// A hostile HTTPRoute on the same host and backend as a neighbour: its bad allow-list
/// fails closed on its own path, its injected values are refused, its snippet is not
/// allowed, and a script that runs away on another route is stopped and costs that route
/// that script's settings; the neighbour is served untouched throughout.
#[test]
fn a_hostile_httproute_hurts_only_itself() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("zz-route-kind.rhai"), SITE_SCRIPT).unwrap();
    let h = serving(HOSTILE, &["--scripts-dir", site.path().to_str().unwrap()]);
    let neighbour = eventually(
        &h,
        "the neighbour",
        ("GET", "shared.example.com", "/neighbour", &[]),
        |a| a.who() == "infra-backend-v1",
    );
    assert_eq!(
        neighbour.header("x-hook"),
        Some("HTTPRoute infra/neighbour PathPrefix /neighbour"),
        "{neighbour:?}"
    );
    assert_eq!(received(&neighbour, "x-leak"), None, "{neighbour:?}");
    let hostile = eventually(
        &h,
        "the hostile route fails closed",
        ("GET", "shared.example.com", "/hostile", &[]),
        |a| a.status == 403,
    );
    assert!(!hostile.body.contains("infra-backend"), "{hostile:?}");
    // The stopped script costs the spinner its settings from that script only: the route is
    // served, without the site script's header.
    let spinner = eventually(
        &h,
        "the spinner is served",
        ("GET", "shared.example.com", "/spinner", &[]),
        |a| a.who() == "infra-backend-v1",
    );
    assert_eq!(spinner.header("x-hook"), None, "{spinner:?}");
    assert_eq!(spinner.header("x-spinner"), Some("yes"), "{spinner:?}");
    let log = h.log();
    for (what, needle) in [
        ("the bad allow-list", "annotation haproxy.org/allow-list"),
        (
            "the injected header",
            "annotation haproxy.org/request-set-header",
        ),
        ("the injected host", "annotation haproxy.org/set-host"),
        (
            "the snippet",
            "annotation haproxy.org/backend-config-snippet",
        ),
        ("the stopped script", "zz-route-kind.rhai"),
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("HTTPRoute app/") && l.contains(needle)),
            "{what} is not reported:\n{log}"
        );
    }
    // Nothing of the hostile route reached the configuration.
    let config = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    for needle in ["env(HOME)", "evil.example", "use_backend other"] {
        assert!(!config.contains(needle), "{needle} in haproxy.cfg");
    }
    // And the neighbour still answers after all of it.
    let again = send(&h, "GET", "shared.example.com", "/neighbour", &[]);
    assert_eq!(again.who(), "infra-backend-v1", "{again:?}");
}
