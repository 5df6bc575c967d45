//! Gateway API conformance-shaped tests: GatewayClass, Gateway and HTTPRoute manifests in
//! the shape of the upstream GATEWAY-HTTP conformance suite (a base Gateway in an `infra`
//! namespace, echo backends `infra-backend-v1..v3` that report which backend answered, and
//! a table of requests and expected answers per feature), served by the real `portcullis
//! run` from a manifest directory through a real HAProxy.
//!
//! Every loop here is bounded in count and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::{
    APPLY_TIMEOUT, Answer, GATEWAY_CLASS, Harness, https_get, poll, self_signed, tls_secret,
    wait_until,
};

const INFRA: &str = "infra";

/// The base Gateway: an HTTP listener for routes of every namespace, and one for
/// `*.wildcard.io` taking routes of its own namespace only.
const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1
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
  - name: wild
    port: 80
    protocol: HTTP
    hostname: \"*.wildcard.io\"
";

/// The request, and which backend (or `status <n>`) must answer it.
struct Case {
    host: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    expect: &'static str,
}

const fn case(host: &'static str, path: &'static str, expect: &'static str) -> Case {
    Case {
        host,
        path,
        headers: &[],
        expect,
    }
}

fn check(h: &Harness, cases: &[Case]) {
    for c in cases {
        let mut last = String::new();
        let answered = poll(APPLY_TIMEOUT, || {
            let answer = support::http_get_with(
                std::net::SocketAddr::from(([127, 0, 0, 1], h.http_port)),
                c.host,
                c.path,
                c.headers,
            )
            .ok()?;
            last = answer.who();
            (last == c.expect).then_some(())
        });
        assert!(
            answered.is_some(),
            "{} {} {:?}: expected {}, got {last}\n{}",
            c.host,
            c.path,
            c.headers,
            c.expect,
            support::log_tail(&h.log(), 60)
        );
    }
}

fn backends(h: &mut Harness) {
    for name in ["infra-backend-v1", "infra-backend-v2", "infra-backend-v3"] {
        let backend = h.backend(INFRA, name);
        h.write(&format!("{name}.yaml"), &backend);
    }
    let app = h.backend("app", "app-backend");
    h.write("app-backend.yaml", &app);
    h.write("gatewayclass.yaml", GATEWAY_CLASS);
    h.write("gateway.yaml", GATEWAY);
}

/// A controller serving the base Gateways, the backends and `manifests` (written as `file`).
fn serving(file: &str, manifests: &str) -> Harness {
    let mut h = Harness::new();
    backends(&mut h);
    h.write(file, manifests);
    h.start(&[]);
    h
}

fn header(answer: &Answer, name: &str) -> Option<String> {
    answer.body.lines().find_map(|line| {
        let (n, v) = line.split_once(": ")?;
        n.eq_ignore_ascii_case(name).then(|| v.to_string())
    })
}

const MATCHING: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: matching
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
    sectionName: http
  rules:
  - backendRefs:
    - name: infra-backend-v1
      port: 80
  - matches:
    - path:
        type: Exact
        value: /exact
    backendRefs:
    - name: infra-backend-v2
      port: 80
  - matches:
    - path:
        type: PathPrefix
        value: /prefix/
    backendRefs:
    - name: infra-backend-v2
      port: 80
  - matches:
    - headers:
      - name: version
        value: two
    - headers:
      - name: x-odd
        value: \"a b#c\"
    backendRefs:
    - name: infra-backend-v3
      port: 80
  - matches:
    - path:
        value: /q
      queryParams:
      - name: animal
        value: whale
    backendRefs:
    - name: infra-backend-v3
      port: 80
  - matches:
    - path:
        value: /both
      headers:
      - name: version
        value: two
      - name: color
        value: blue
    backendRefs:
    - name: infra-backend-v2
      port: 80
  - matches:
    - path:
        value: /both
      headers:
      - name: version
        value: two
    backendRefs:
    - name: infra-backend-v3
      port: 80
";

/// Path matching (Exact, PathPrefix with segment boundaries), header and query parameter
/// matches and their precedence, as in the upstream HTTPRouteMatching,
/// HTTPRouteExactPathMatching, HTTPRoutePathMatchOrder, HTTPRouteHeaderMatching and
/// HTTPRouteQueryParamMatching tests.
#[test]
fn matches_paths_headers_and_query_parameters_in_spec_order() {
    let h = serving("matching.yaml", MATCHING);
    check(
        &h,
        &[
            case("example.com", "/", "infra-backend-v1"),
            case("example.com", "/exact", "infra-backend-v2"),
            case("example.com", "/exact/", "infra-backend-v1"),
            case("example.com", "/exactly", "infra-backend-v1"),
            case("example.com", "/prefix", "infra-backend-v2"),
            case("example.com", "/prefix/", "infra-backend-v2"),
            case("example.com", "/prefix/one/two", "infra-backend-v2"),
            case("example.com", "/prefixed", "infra-backend-v1"),
            Case {
                headers: &[("version", "two")],
                ..case("example.com", "/", "infra-backend-v3")
            },
            Case {
                headers: &[("version", "one")],
                ..case("example.com", "/", "infra-backend-v1")
            },
            // A longer path wins over a header match on a shorter one.
            Case {
                headers: &[("version", "two")],
                ..case("example.com", "/prefix/x", "infra-backend-v2")
            },
            // Values that are not plain words are compared exactly too.
            Case {
                headers: &[("x-odd", "a b#c")],
                ..case("example.com", "/", "infra-backend-v3")
            },
            Case {
                headers: &[("x-odd", "a b#cd")],
                ..case("example.com", "/", "infra-backend-v1")
            },
            case("example.com", "/q?animal=whale", "infra-backend-v3"),
            case("example.com", "/q?animal=dolphin", "infra-backend-v1"),
            // More header matches take precedence over fewer.
            Case {
                headers: &[("version", "two"), ("color", "blue")],
                ..case("example.com", "/both", "infra-backend-v2")
            },
            Case {
                headers: &[("version", "two")],
                ..case("example.com", "/both", "infra-backend-v3")
            },
            case("example.com", "/both", "infra-backend-v1"),
        ],
    );
}

const HOSTNAMES: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: wildcard-hosts
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
    sectionName: wild
  hostnames:
  - foo.wildcard.io
  - bar.other.org
  rules:
  - backendRefs:
    - name: infra-backend-v3
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: no-match
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
    sectionName: wild
  hostnames:
  - nope.example.com
  rules:
  - backendRefs:
    - name: infra-backend-v2
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: other-namespace
  namespace: app
spec:
  parentRefs:
  - name: same-namespace
    namespace: infra
    sectionName: wild
  hostnames:
  - app.wildcard.io
  rules:
  - backendRefs:
    - name: app-backend
      port: 80
";

/// Hostname intersection with a listener's wildcard hostname (HTTPRouteListenerHostnameMatching,
/// HTTPRouteHostnameIntersection), and a listener that takes routes of its own namespace only
/// (`NotAllowedByListeners`): what does not attach is not routed, and is reported.
#[test]
fn attaches_by_listener_hostname_and_namespace() {
    let h = serving("hostnames.yaml", HOSTNAMES);
    check(
        &h,
        &[
            case("foo.wildcard.io", "/", "infra-backend-v3"),
            case("bar.other.org", "/", "status 404"),
            case("nope.example.com", "/", "status 404"),
            case("app.wildcard.io", "/", "status 404"),
        ],
    );
    let log = h.log();
    for (route, reason) in [
        ("HTTPRoute infra/no-match", "NoMatchingListenerHostname"),
        ("HTTPRoute app/other-namespace", "NotAllowedByListeners"),
    ] {
        assert!(
            log.lines().any(|l| l.contains(route) && l.contains(reason)),
            "{route}: no {reason} reported:\n{log}"
        );
    }
}

const FILTERS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: filters
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
  rules:
  - matches:
    - path:
        value: /headers
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set:
        - name: X-Set
          value: set 100%
        add:
        - name: X-Add
          value: added
        remove:
        - X-Remove
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        set:
        - name: X-Response
          value: answered
    backendRefs:
    - name: infra-backend-v1
      port: 80
  - matches:
    - path:
        value: /redirect
    filters:
    - type: RequestRedirect
      requestRedirect:
        hostname: example.org
        statusCode: 301
  - matches:
    - path:
        value: /moved
    filters:
    - type: RequestRedirect
      requestRedirect:
        scheme: https
        port: 8443
        path:
          type: ReplacePrefixMatch
          replacePrefixMatch: /new
  - matches:
    - path:
        value: /rewrite
    filters:
    - type: URLRewrite
      urlRewrite:
        hostname: rewritten.example
        path:
          type: ReplacePrefixMatch
          replacePrefixMatch: /one
    backendRefs:
    - name: infra-backend-v2
      port: 80
  - matches:
    - path:
        value: /full
    filters:
    - type: URLRewrite
      urlRewrite:
        path:
          type: ReplaceFullPath
          replaceFullPath: /whole
    backendRefs:
    - name: infra-backend-v2
      port: 80
";

/// Header modifiers, redirects and rewrites (HTTPRouteRequestHeaderModifier,
/// HTTPRouteResponseHeaderModifier, HTTPRouteRedirect*, HTTPRouteRewrite*).
#[test]
fn filters_modify_headers_redirect_and_rewrite() {
    let h = serving("filters.yaml", FILTERS);
    check(&h, &[case("example.com", "/headers", "infra-backend-v1")]);
    let answer = h.get_with(
        "example.com",
        "/headers",
        &[("X-Set", "old"), ("X-Add", "first"), ("X-Remove", "gone")],
    );
    assert_eq!(
        header(&answer, "x-set").as_deref(),
        Some("set 100%"),
        "{answer:?}"
    );
    assert!(
        answer.body.contains("x-add: first\nx-add: added\n"),
        "add keeps the request's header and adds one: {answer:?}"
    );
    assert_eq!(header(&answer, "x-remove"), None, "{answer:?}");
    assert_eq!(answer.header("x-response"), Some("answered"), "{answer:?}");

    let redirect = h.get("example.com", "/redirect/a?b=c");
    assert_eq!(redirect.status, 301, "{redirect:?}");
    assert_eq!(
        redirect.header("location"),
        Some("http://example.org/redirect/a?b=c")
    );
    let moved = h.get("example.com:8080", "/moved/x");
    assert_eq!(moved.status, 302, "{moved:?}");
    assert_eq!(
        moved.header("location"),
        Some("https://example.com:8443/new/x")
    );

    let rewritten = h.get("example.com", "/rewrite/two?x=1");
    assert_eq!(rewritten.who(), "infra-backend-v2");
    assert!(
        rewritten
            .body
            .contains("GET /one/two?x=1 host=rewritten.example"),
        "{rewritten:?}"
    );
    let full = h.get("example.com", "/full/any/thing");
    assert!(
        full.body.contains("GET /whole host=example.com"),
        "{full:?}"
    );
}

const WEIGHTS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: weights
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
  rules:
  - matches:
    - path:
        value: /split
    backendRefs:
    - name: infra-backend-v1
      port: 80
      weight: 1
    - name: infra-backend-v2
      port: 80
      weight: 1
    - name: infra-backend-v3
      port: 80
      weight: 0
  - matches:
    - path:
        value: /broken
    backendRefs:
    - name: missing
      port: 80
  - matches:
    - path:
        value: /cross
    backendRefs:
    - name: app-backend
      namespace: app
      port: 80
";

const GRANT: &str = "apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata:
  name: infra-routes
  namespace: app
spec:
  from:
  - group: gateway.networking.k8s.io
    kind: HTTPRoute
    namespace: infra
  to:
  - group: \"\"
    kind: Service
";

/// Weighted backends (HTTPRouteWeight; weight 0 never answers), a backend that does not
/// exist (500, HTTPRouteInvalidBackendRefUnknownKind's sibling), and a reference to another
/// namespace's Service, refused until a ReferenceGrant permits it
/// (HTTPRouteInvalidCrossNamespaceBackendRef, HTTPRouteReferenceGrant).
#[test]
fn weights_unresolved_refs_and_reference_grants() {
    let h = serving("weights.yaml", WEIGHTS);
    check(
        &h,
        &[
            case("example.com", "/broken", "status 500"),
            case("example.com", "/cross", "status 500"),
        ],
    );
    let seen = h.answering("example.com", "/split", 60);
    assert_eq!(
        seen,
        ["infra-backend-v1", "infra-backend-v2"]
            .map(String::from)
            .into_iter()
            .collect(),
        "60 requests to a 1:1 split"
    );
    let log = h.log();
    assert!(
        log.lines().any(|l| l.contains("HTTPRoute infra/weights")
            && l.contains("backendRefs[0]")
            && l.contains("no ReferenceGrant")),
        "the refused reference is reported:\n{log}"
    );
    h.write("grant.yaml", GRANT);
    check(&h, &[case("example.com", "/cross", "app-backend")]);
    h.remove("grant.yaml");
    check(&h, &[case("example.com", "/cross", "status 500")]);
}

/// An HTTPS listener terminating TLS with a certificate from a Secret (HTTPRouteHTTPSListener):
/// its hosts are served with it, and a route attached to the HTTPS listener only does not
/// answer on the HTTP port, where another route redirects to HTTPS.
#[test]
fn https_listener_serves_its_certificate() {
    let mut h = Harness::new();
    backends(&mut h);
    let (crt, key) = self_signed(&h.work(), "secure.example.com", "secure");
    h.write("secret.yaml", &tls_secret(INFRA, "secure-tls", &crt, &key));
    h.write(
        "https.yaml",
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: tls
  namespace: infra
spec:
  gatewayClassName: portcullis
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    hostname: secure.example.com
    tls:
      certificateRefs:
      - name: secure-tls
  - name: http
    port: 80
    protocol: HTTP
    hostname: secure.example.com
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: secure
  namespace: infra
spec:
  parentRefs:
  - name: tls
    sectionName: https
  rules:
  - backendRefs:
    - name: infra-backend-v2
      port: 80
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: to-https
  namespace: infra
spec:
  parentRefs:
  - name: tls
    sectionName: http
  rules:
  - filters:
    - type: RequestRedirect
      requestRedirect:
        scheme: https
        statusCode: 301
",
    );
    h.start(&[]);
    let answer = poll(APPLY_TIMEOUT, || {
        https_get(
            h.https_port,
            "secure.example.com",
            "secure.example.com",
            "/x",
        )
        .filter(|a| a.who() == "infra-backend-v2")
    });
    assert!(answer.is_some(), "HTTPS answer\n{}", h.log());
    let served =
        support::served_certificate(h.https_port, "secure.example.com").unwrap_or_default();
    let bare = |pem: &str| pem.split_whitespace().collect::<String>();
    assert_eq!(
        bare(&served),
        bare(&crt),
        "the listener's certificate is served"
    );
    wait_until(APPLY_TIMEOUT, "the HTTP listener redirects", || {
        h.try_get("secure.example.com", "/x").is_some_and(|a| {
            a.status == 301 && a.header("location") == Some("https://secure.example.com/x")
        })
    });
}

/// An Ingress and an HTTPRoute claiming the same host and path: the Ingress takes it, the
/// route is told which Ingress, and its other paths are served; when the Ingress goes, the
/// route takes the path over.
#[test]
fn ingress_and_httproute_on_the_same_path() {
    let mut h = Harness::new();
    backends(&mut h);
    h.write(
        "ingress.yaml",
        &support::ingress(
            INFRA,
            "legacy",
            &[support::route(
                Some("shared.example.com"),
                "/app",
                "Prefix",
                "infra-backend-v1",
            )],
            None,
            &[],
        ),
    );
    h.write(
        "route.yaml",
        "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: newer
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
  hostnames:
  - shared.example.com
  rules:
  - matches:
    - path:
        value: /app
    - path:
        value: /other
    backendRefs:
    - name: infra-backend-v2
      port: 80
",
    );
    h.start(&[]);
    check(
        &h,
        &[
            case("shared.example.com", "/app/x", "infra-backend-v1"),
            case("shared.example.com", "/other", "infra-backend-v2"),
        ],
    );
    let log = h.log();
    assert!(
        log.lines().any(|l| l.contains("HTTPRoute infra/newer")
            && l.contains("also routed by Ingress infra/legacy")),
        "the conflict is reported on the route:\n{log}"
    );
    h.remove("ingress.yaml");
    check(
        &h,
        &[case("shared.example.com", "/app/x", "infra-backend-v2")],
    );
}

/// Renders `manifests` with `portcullis render` into `out`: every file it wrote, by path.
fn render(
    manifests: &std::path::Path,
    out: &std::path::Path,
) -> std::collections::BTreeMap<String, String> {
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .arg("render")
        .arg("--manifests")
        .arg(manifests)
        .arg("--out")
        .arg(out)
        .env_remove("KUBECONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running portcullis render");
    assert!(status.success(), "portcullis render failed");
    let mut files = std::collections::BTreeMap::new();
    let mut dirs = vec![out.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let name = path.strip_prefix(out).unwrap().display().to_string();
                files.insert(name, std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    files
}

/// The same model as Ingresses: Ingresses and the HTTPRoutes that say the same (hosts,
/// Prefix and Exact paths, Services) render byte-identical files.
#[test]
fn httproutes_render_what_the_equivalent_ingresses_render() {
    let h = Harness::new();
    let dir = h.work();
    let (ingresses, routes) = (dir.join("ingresses"), dir.join("routes"));
    let mut services = String::new();
    for i in 0..3 {
        services.push_str(&support::service(INFRA, &format!("s{i}"), &[]));
        services.push_str("---\n");
        services.push_str(&support::endpoint_slices(
            INFRA,
            &format!("s{i}"),
            &[("a", 18000 + i, true)],
        ));
        services.push_str("---\n");
    }
    let mut ingress_docs = vec![services.clone(), support::INGRESS_CLASS.to_string()];
    let mut route_docs = vec![services, GATEWAY_CLASS.to_string(), GATEWAY.to_string()];
    for i in 0..3 {
        let (host, service) = (format!("h{i}.example.com"), format!("s{i}"));
        ingress_docs.push(support::ingress(
            INFRA,
            &format!("r{i}"),
            &[
                support::route(Some(&host), "/", "Prefix", &service),
                support::route(Some(&host), "/exact", "Exact", &service),
            ],
            None,
            &[],
        ));
        route_docs.push(format!(
            "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: r{i}
  namespace: infra
spec:
  parentRefs:
  - name: same-namespace
    sectionName: http
  hostnames:
  - {host}
  rules:
  - backendRefs:
    - name: {service}
      port: 80
  - matches:
    - path:
        type: Exact
        value: /exact
    backendRefs:
    - name: {service}
      port: 80
"
        ));
    }
    for (d, docs) in [(&ingresses, &ingress_docs), (&routes, &route_docs)] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("all.yaml"), docs.join("---\n")).unwrap();
    }
    let from_ingresses = render(&ingresses, &dir.join("out-ingresses"));
    let from_routes = render(&routes, &dir.join("out-routes"));
    assert!(from_ingresses.contains_key("haproxy.cfg"));
    assert_eq!(from_ingresses, from_routes);
}
