//! Gateway API TLS and TCP listeners against a real HAProxy: TLSRoutes passing TLS through by
//! server name (on the HTTPS port and on a port of their own) to pods that present their own
//! certificates, TCPRoutes to an echo pod on a new port, listener ports that collide refused
//! while the rest is served, a new port costing one reload and a removed one freed, and
//! cross-namespace backends only with a ReferenceGrant.
//!
//! Every loop here is bounded in count and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::{SocketAddr, TcpListener};

use support::*;

const INFRA: &str = "infra";

const GATEWAY_CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata:
  name: portcullis
spec:
  controllerName: portcullis.io/gateway-controller
";

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
    let log = h.log();
    for (field, reason) in [
        ("spec.listeners[3]", "PortUnavailable: port"),
        ("spec.listeners[4]", "not in --gateway-listener-ports"),
        ("spec.listeners[5]", "PortUnavailable: port"),
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains("Gateway infra/l4") && l.contains(field) && l.contains(reason)),
            "{field}: {reason} is reported\n{}",
            log_tail(&log, 40)
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
