//! Gateway API TLS and TCP listeners against a real HAProxy: TLSRoutes passing TLS through by
//! server name (on the HTTPS port and on a port of their own) to pods that present their own
//! certificates, TCPRoutes to an echo pod on a new port, listener ports that collide refused
//! while the rest is served, a new port costing one reload and a removed one freed, and
//! cross-namespace backends only with a ReferenceGrant.
//!
//! Every loop here is bounded in count and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/apiserver.rs"]
mod apiserver;
mod support;

use std::net::{SocketAddr, TcpListener};

use support::*;

const INFRA: &str = "infra";

/// Gateway `l4` in `infra`: TLS passthrough on 443 (the HTTPS port) and on `tls_port`, TCP on
/// `tcp_port`, each taking routes of every namespace; `extra` listeners appended as written.
fn gateway(tls_port: u16, tcp_port: u16, extra: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: l4
  namespace: {INFRA}
spec:
  gatewayClassName: portcullis
  listeners:
  - name: tls-shared
    port: 443
    protocol: TLS
    tls: {{mode: Passthrough}}
  - name: tls-own
    port: {tls_port}
    protocol: TLS
    tls: {{mode: Passthrough}}
  - name: tcp
    port: {tcp_port}
    protocol: TCP
    allowedRoutes: {{namespaces: {{from: All}}}}
{extra}"
    )
}

fn tls_route(name: &str, host: &str, service: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata:
  name: {name}
  namespace: {INFRA}
spec:
  parentRefs: [{{name: l4}}]
  hostnames: [{host}]
  rules:
  - backendRefs: [{{name: {service}, port: 80}}]
"
    )
}

/// A TCPRoute in `ns` to Service `service` of `service_ns`, on the listener `section`.
fn tcp_route(ns: &str, name: &str, section: &str, service_ns: &str, service: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata:
  name: {name}
  namespace: {ns}
spec:
  parentRefs: [{{name: l4, namespace: {INFRA}, sectionName: {section}}}]
  rules:
  - backendRefs: [{{name: {service}, namespace: {service_ns}, port: 80}}]
"
    )
}

/// Service `name` in `infra` whose one endpoint is an `openssl s_server` presenting a
/// certificate for `host`; returns the pod and the certificate's PEM.
fn tls_pod(h: &mut Harness, name: &str, host: &str) -> (TlsPod, String) {
    let (crt, _) = self_signed(&h.work(), host, name);
    let port = free_port();
    let pod = TlsPod::start(
        port,
        &h.work().join(format!("{name}.crt")),
        &h.work().join(format!("{name}.key")),
    );
    h.write(
        &format!("{name}.yaml"),
        &format!(
            "{}---\n{}",
            service(INFRA, name, &[]),
            endpoint_slices(INFRA, name, &[("0", port, true)])
        ),
    );
    (pod, crt)
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Whether the pod that answered a TLS handshake for `name` on `port` is the one with `crt`.
fn presents(h: &Harness, port: u16, name: &str, crt: &str) -> bool {
    served_certificate(port, name)
        .is_some_and(|c| fingerprint(&h.work(), &c) == fingerprint(&h.work(), crt))
}

fn echoed_by(port: u16) -> Option<String> {
    http_get(addr(port), "anything", "/raw")
        .ok()
        .map(|a| a.who())
}

#[test]
fn tls_routes_pass_through_by_server_name_and_tcp_routes_carry_bytes() {
    let mut h = Harness::new();
    let (tls_port, tcp_port) = (free_port(), free_port());
    let (_a, crt_a) = tls_pod(&mut h, "tls-a", "a.example.com");
    let (_b, crt_b) = tls_pod(&mut h, "tls-b", "b.example.com");
    let echo = h.backend(INFRA, "echo");
    h.write("echo.yaml", &echo);
    h.write("class.yaml", GATEWAY_CLASS);
    h.write("gateway.yaml", &gateway(tls_port, tcp_port, ""));
    h.write("route-a.yaml", &tls_route("a", "a.example.com", "tls-a"));
    h.write("route-b.yaml", &tls_route("b", "b.example.com", "tls-b"));
    h.write(
        "route-tcp.yaml",
        &tcp_route(INFRA, "echo", "tcp", INFRA, "echo"),
    );
    let ports = format!("{tls_port},{tcp_port}");
    h.start(&["--gateway-listener-ports", &ports]);

    for port in [h.https_port, tls_port] {
        wait_until(APPLY_TIMEOUT, "a.example.com reaches pod a", || {
            presents(&h, port, "a.example.com", &crt_a)
        });
        assert!(
            presents(&h, port, "b.example.com", &crt_b),
            "b.example.com on {port} is passed to pod b\n{}",
            log_tail(&h.log(), 40)
        );
        // A name no route has: no pod answers.
        assert!(served_certificate(port, "c.example.com").is_none());
    }
    wait_until(APPLY_TIMEOUT, "the TCP port reaches the echo pod", || {
        echoed_by(tcp_port).as_deref() == Some("echo")
    });

    // The echo Service's endpoint moves to another pod: a runtime change, no reload.
    h.wait_old_workers_gone();
    let (reloads, _) = h.reloads();
    let moved = h.echo("echo-moved");
    h.write(
        "echo.yaml",
        &format!(
            "{}---\n{}",
            service(INFRA, "echo", &[]),
            endpoint_slices(INFRA, "echo", &[("0", moved, true)])
        ),
    );
    wait_until(APPLY_TIMEOUT, "the TCP port follows the endpoint", || {
        echoed_by(tcp_port).as_deref() == Some("echo-moved")
    });
    assert_eq!(h.reloads().0, reloads, "endpoints change at run time");

    // An ssl-passthrough Ingress for b.example.com takes precedence over the TLSRoute, and
    // the route is warned; a.example.com stays the route's.
    h.write(
        "passthrough.yaml",
        &annotated(
            &ingress(
                INFRA,
                "pass",
                &[route(Some("b.example.com"), "/", "Prefix", "tls-a")],
                None,
                &[],
            ),
            &[("haproxy.org/ssl-passthrough", "true")],
        ),
    );
    wait_until(APPLY_TIMEOUT, "the Ingress takes b.example.com", || {
        presents(&h, h.https_port, "b.example.com", &crt_a)
    });
    assert!(presents(&h, h.https_port, "a.example.com", &crt_a));
    // Diagnostics are logged once the run is applied.
    wait_until(APPLY_TIMEOUT, "the TLSRoute is warned", || {
        h.log().contains(
            "TLSRoute infra/b: spec.hostnames: host b.example.com is also passed through by an Ingress",
        )
    });
    // On the TLS listener's own port the Ingress has no say.
    assert!(presents(&h, tls_port, "b.example.com", &crt_b));

    // A TLSRoute for every name under example.com does not take an Ingress' HTTPS host
    // (terminated with its own certificate) from it.
    let (crt_t, key_t) = self_signed(&h.work(), "t.example.com", "t");
    h.write("t-secret.yaml", &tls_secret(INFRA, "t-tls", &crt_t, &key_t));
    h.write(
        "t.yaml",
        &ingress(
            INFRA,
            "t",
            &[route(Some("t.example.com"), "/", "Prefix", "echo")],
            None,
            &[("t-tls", &["t.example.com"])],
        ),
    );
    h.write(
        "route-w.yaml",
        &tls_route("w", "\"*.example.com\"", "tls-b"),
    );
    wait_until(
        APPLY_TIMEOUT,
        "the wildcard passes z.example.com through",
        || presents(&h, h.https_port, "z.example.com", &crt_b),
    );
    let answer = https_get(h.https_port, "t.example.com", "t.example.com", "/")
        .expect("the Ingress' HTTPS host answers");
    assert_eq!(answer.who(), "echo-moved");
    assert!(presents(&h, h.https_port, "t.example.com", &crt_t));
    assert!(presents(&h, h.https_port, "a.example.com", &crt_a));
    assert_eq!(h.reloads().1, 0, "no reload failed");
}

#[test]
fn colliding_listener_ports_are_refused_and_new_ports_reload_once() {
    let mut h = Harness::new();
    let (tls_port, tcp_port, outside, added) = (free_port(), free_port(), free_port(), free_port());
    let echo = h.backend(INFRA, "echo");
    h.write("echo.yaml", &echo);
    h.write("class.yaml", GATEWAY_CLASS);
    // The HTTP port, a port outside the allowed ones, and a TLS listener on the TCP one.
    let bad = format!(
        "  - name: on-http
    port: {http}
    protocol: TCP
  - name: outside
    port: {outside}
    protocol: TCP
  - name: clash
    port: {tcp_port}
    protocol: TLS
    tls: {{mode: Passthrough}}
",
        http = h.http_port
    );
    h.write("gateway.yaml", &gateway(tls_port, tcp_port, &bad));
    h.write(
        "route-tcp.yaml",
        &tcp_route(INFRA, "echo", "tcp", INFRA, "echo"),
    );
    let ports = format!("{tls_port},{tcp_port},{added}");
    h.start(&["--gateway-listener-ports", &ports]);
    wait_until(APPLY_TIMEOUT, "the TCP listener is served", || {
        echoed_by(tcp_port).as_deref() == Some("echo")
    });
    // Diagnostics are logged once the run is applied.
    for (field, reason) in [
        ("spec.listeners[3]", "PortUnavailable: port"),
        ("spec.listeners[4]", "not in --gateway-listener-ports"),
        ("spec.listeners[5]", "PortUnavailable: port"),
    ] {
        wait_until(
            APPLY_TIMEOUT,
            &format!("{field}: {reason} is reported"),
            || {
                h.log().lines().any(|l| {
                    l.contains("Gateway infra/l4") && l.contains(field) && l.contains(reason)
                })
            },
        );
    }
    // The HTTP frontend still answers on its port; the refused port is not bound.
    assert!(http_get(addr(h.http_port), "anything", "/").is_ok());
    assert!(
        TcpListener::bind(addr(outside)).is_ok(),
        "{outside} is free"
    );
    assert_eq!(h.reloads().1, 0, "no reload failed");

    // A listener on a new port: one reload; the route attached to it is served there.
    h.wait_old_workers_gone();
    let (reloads, _) = h.reloads();
    let more = format!(
        "{bad}  - name: added
    port: {added}
    protocol: TCP
"
    );
    h.write("gateway.yaml", &gateway(tls_port, tcp_port, &more));
    h.write(
        "route-added.yaml",
        &tcp_route(INFRA, "echo-added", "added", INFRA, "echo"),
    );
    wait_until(APPLY_TIMEOUT, "the added port is served", || {
        echoed_by(added).as_deref() == Some("echo")
    });
    assert_eq!(h.reloads(), (reloads + 1, 0), "one reload, none failed");

    // Removed again: the port is free.
    h.remove("route-added.yaml");
    h.write("gateway.yaml", &gateway(tls_port, tcp_port, &bad));
    wait_until(APPLY_TIMEOUT, "the removed port is free", || {
        TcpListener::bind(addr(added)).is_ok()
    });
    assert_eq!(echoed_by(tcp_port).as_deref(), Some("echo"));
    assert_eq!(h.reloads().1, 0, "no reload failed");
}

#[test]
fn a_backend_in_another_namespace_needs_a_reference_grant() {
    let mut h = Harness::new();
    let (tls_port, tcp_port) = (free_port(), free_port());
    let echo = h.backend(INFRA, "echo");
    h.write("echo.yaml", &echo);
    h.write("class.yaml", GATEWAY_CLASS);
    h.write("gateway.yaml", &gateway(tls_port, tcp_port, ""));
    h.write(
        "route.yaml",
        &tcp_route("app", "cross", "tcp", INFRA, "echo"),
    );
    let ports = format!("{tls_port},{tcp_port}");
    h.start(&["--gateway-listener-ports", &ports]);
    wait_until(APPLY_TIMEOUT, "the refusal is reported", || {
        h.log().contains("RefNotPermitted")
    });
    assert_eq!(echoed_by(tcp_port), None, "no ReferenceGrant: refused");

    h.write(
        "grant.yaml",
        &format!(
            "apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata:
  name: app-tcp
  namespace: {INFRA}
spec:
  from: [{{group: gateway.networking.k8s.io, kind: TCPRoute, namespace: app}}]
  to: [{{group: \"\", kind: Service, name: echo}}]
"
        ),
    );
    wait_until(APPLY_TIMEOUT, "the grant lets it through", || {
        echoed_by(tcp_port).as_deref() == Some("echo")
    });
    assert_eq!(h.reloads().1, 0, "no reload failed");
}

/// Gateway `web` in `infra`: HTTP on the shared port (80) and on `port`, each with a route of
/// its own for the same host, and HTTPS on `tls_port` with the `on-own` route too.
fn http_ports(port: u16, tls_port: u16) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: web
  namespace: {INFRA}
spec:
  gatewayClassName: portcullis
  listeners:
  - name: shared
    port: 80
    protocol: HTTP
  - name: own
    port: {port}
    protocol: HTTP
  - name: own-tls
    port: {tls_port}
    protocol: HTTPS
    hostname: web.example.com
    tls: {{certificateRefs: [{{name: web-tls}}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: on-shared
  namespace: {INFRA}
spec:
  parentRefs: [{{name: web, sectionName: shared}}]
  hostnames: [web.example.com]
  rules:
  - backendRefs: [{{name: shared-pod, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: on-own
  namespace: {INFRA}
spec:
  parentRefs: [{{name: web, sectionName: own}}, {{name: web, sectionName: own-tls}}]
  hostnames: [web.example.com]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /api}}}}]
    backendRefs: [{{name: own-pod, port: 80}}]
  - matches: [{{path: {{type: PathPrefix, value: /v2}}, headers: [{{name: x-v, value: \"2\"}}]}}]
    backendRefs: [{{name: shared-pod, port: 80}}]
"
    )
}

/// A request (port, path, headers) and who must answer it.
type Request<'a> = (u16, &'a str, &'a [(&'a str, &'a str)], &'a str);

fn who(port: u16, host: &str, path: &str, headers: &[(&str, &str)]) -> String {
    http_get_with(addr(port), host, path, headers)
        .map(|a| a.who())
        .unwrap_or_else(|e| format!("{e}"))
}

#[test]
fn an_http_listener_on_a_port_of_its_own_serves_only_its_routes() {
    let mut h = Harness::new();
    let (port, tls_port) = (free_port(), free_port());
    for name in ["shared-pod", "own-pod"] {
        let pod = h.backend(INFRA, name);
        h.write(&format!("{name}.yaml"), &pod);
    }
    let (crt, key) = self_signed(&h.work(), "web.example.com", "web");
    h.write("secret.yaml", &tls_secret(INFRA, "web-tls", &crt, &key));
    h.write("class.yaml", GATEWAY_CLASS);
    h.write("web.yaml", &http_ports(port, tls_port));
    let ports = format!("{port},{tls_port}");
    h.start(&["--gateway-listener-ports", &ports]);
    wait_until(APPLY_TIMEOUT, "the own port serves its route", || {
        who(port, "web.example.com", "/api/x", &[]) == "own-pod"
    });
    let table: [Request<'_>; 8] = [
        (port, "/api", &[], "own-pod"),
        // Not attached there: the shared route is not served on the own port.
        (port, "/", &[], "status 404"),
        (port, "/v2", &[("x-v", "2")], "shared-pod"),
        (port, "/v2", &[], "status 404"),
        (h.http_port, "/", &[], "shared-pod"),
        // The own port's routes are not served on the shared port.
        (h.http_port, "/api/x", &[], "shared-pod"),
        (h.http_port, "/v2", &[("x-v", "2")], "shared-pod"),
        // A Host header that is the port number cannot reach the own port's keys.
        (h.http_port, "/web.example.com/api", &[], "status 404"),
    ];
    for (p, path, headers, expected) in table {
        let host = if path.starts_with("/web.") {
            port.to_string()
        } else {
            "web.example.com".to_string()
        };
        assert_eq!(
            who(p, &host, path, headers),
            expected,
            "port {p} {path} {headers:?}\n{}",
            log_tail(&h.log(), 30)
        );
    }
    // HTTPS on a port of its own, with the listener's certificate.
    let answer = poll(APPLY_TIMEOUT, || {
        https_get(tls_port, "web.example.com", "web.example.com", "/api")
    })
    .expect("an HTTPS answer on the own port");
    assert_eq!(answer.who(), "own-pod");
    assert!(presents(&h, tls_port, "web.example.com", &crt));
    let other = https_get(tls_port, "web.example.com", "web.example.com", "/");
    assert_eq!(other.map(|a| a.who()).as_deref(), Some("status 404"));
    assert_eq!(h.reloads().1, 0, "no reload failed");
}

mod cluster {
    //! The same kinds from the test API server (TCPRoute served at `v1alpha2`, as before
    //! Gateway API v1.6), with the status the leader writes.

    use super::apiserver;
    use std::time::Duration;

    use serde_json::Value;

    use super::*;

    const V1: &str = "gateway.networking.k8s.io/v1";
    const V1ALPHA2: &str = "gateway.networking.k8s.io/v1alpha2";

    fn condition(
        server: &apiserver::ApiServer,
        gv: &str,
        kind: &str,
        name: &str,
        pointer: &str,
        ty: &str,
    ) -> Option<Value> {
        let ns = if kind == "GatewayClass" { "" } else { INFRA };
        server
            .get(gv, kind, ns, name)?
            .pointer(pointer)?
            .as_array()?
            .iter()
            .find(|c| c["type"] == ty)
            .cloned()
    }

    #[test]
    fn routes_from_the_cluster_are_served_and_get_status() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut builder = apiserver::ApiServer::builder()
            .list_items_without_type_meta()
            .bookmark_interval(Duration::from_secs(1));
        for def in apiserver::gateway_api_crds() {
            builder = builder.with_resource(def);
        }
        let server = rt.block_on(builder.start());
        let mut h = Harness::new();
        let (tls_port, tcp_port, outside) = (free_port(), free_port(), free_port());
        let echo = h.backend(INFRA, "echo");
        server.apply_yaml(&echo);
        server.apply_yaml(GATEWAY_CLASS);
        let extra = format!("  - name: outside\n    port: {outside}\n    protocol: TCP\n");
        server.apply_yaml(&gateway(tls_port, tcp_port, &extra));
        server.apply_yaml(&tcp_route(INFRA, "echo", "tcp", INFRA, "echo"));
        server.apply_yaml(&tcp_route(INFRA, "z-cross", "tcp", "other", "echo"));
        server.apply_yaml(&tls_route("a", "a.example.com", "missing"));
        let kubeconfig = h.work().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig, None);
        h.use_kubeconfig(&kubeconfig);
        let ports = format!("{tls_port},{tcp_port}");
        h.start(&[
            "--allow-local-endpoints",
            "--gateway-listener-ports",
            &ports,
        ]);

        let served = poll(APPLY_TIMEOUT, || {
            (echoed_by(tcp_port).as_deref() == Some("echo")).then_some(())
        });
        assert!(
            served.is_some(),
            "the TCP listener is served\n{}",
            log_tail(&h.log(), 40)
        );
        let expect = |what: &str, found: Option<Value>, status: &str, reason: &str| {
            assert!(
                found
                    .as_ref()
                    .is_some_and(|c| c["status"] == status && c["reason"] == reason),
                "{what}: expected {status} {reason}, found {found:?}\n{}",
                log_tail(&h.log(), 40)
            );
        };
        let parents = "/status/parents/0/conditions";
        let found = poll(APPLY_TIMEOUT, || {
            condition(&server, V1ALPHA2, "TCPRoute", "echo", parents, "Accepted")
        });
        expect("TCPRoute echo Accepted", found, "True", "Accepted");
        let found = condition(
            &server,
            V1ALPHA2,
            "TCPRoute",
            "echo",
            parents,
            "ResolvedRefs",
        );
        expect("TCPRoute echo ResolvedRefs", found, "True", "ResolvedRefs");
        let found = poll(APPLY_TIMEOUT, || {
            condition(
                &server,
                V1ALPHA2,
                "TCPRoute",
                "z-cross",
                parents,
                "ResolvedRefs",
            )
        });
        expect(
            "TCPRoute z-cross ResolvedRefs",
            found,
            "False",
            "RefNotPermitted",
        );
        let found = poll(APPLY_TIMEOUT, || {
            condition(&server, V1, "TLSRoute", "a", parents, "ResolvedRefs")
        });
        expect("TLSRoute a ResolvedRefs", found, "False", "BackendNotFound");

        let gw = poll(APPLY_TIMEOUT, || {
            server
                .get(V1, "Gateway", INFRA, "l4")
                .filter(|g| g.pointer("/status/listeners/3").is_some())
        })
        .expect("the Gateway's listener status");
        let listener = |name: &str| {
            gw["status"]["listeners"]
                .as_array()
                .unwrap()
                .iter()
                .find(|l| l["name"] == name)
                .cloned()
                .unwrap()
        };
        let tcp = listener("tcp");
        assert_eq!(tcp["supportedKinds"][0]["kind"], "TCPRoute", "{tcp}");
        // Both TCPRoutes attach; the older one (by name, created in the same second) takes
        // the port.
        assert_eq!(tcp["attachedRoutes"], 2, "{tcp}");
        assert_eq!(listener("tls-own")["supportedKinds"][0]["kind"], "TLSRoute");
        assert_eq!(listener("tls-shared")["attachedRoutes"], 1);
        let refused = listener("outside");
        let accepted = refused["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Accepted")
            .cloned();
        expect(
            "listener outside Accepted",
            accepted,
            "False",
            "PortUnavailable",
        );
        assert_eq!(refused["supportedKinds"], serde_json::json!([]));
        drop(h);
        rt.block_on(server.stop());
    }
}
