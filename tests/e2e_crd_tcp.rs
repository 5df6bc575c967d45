//! The incumbent's TCP custom resource suite (haproxytech/kubernetes-ingress
//! `deploy/tests/e2e/crd-tcp`) re-expressed against a real HAProxy: one test per case of that
//! suite, with manifests of the same shape (binds as a map by name, a `v4v6` bind, more
//! Services, ACLs and backend switching rules, a Backend resource named by `cr-backend`).
//!
//! Its "pods" are an HTTP echo server (answering with its name) for the plain Service ports,
//! and `openssl s_server` processes with a certificate each for the TLS ports, so a
//! connection switched by SNI shows which Service it reached by the certificate it gets.
//! Addresses are loopback: the incumbent's `::` bind is `::1` here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use support::*;

const NS: &str = "e2e-tests-crd-tcp";

/// One "app" of the suite: Service `name` with ports 80 (`http`), 81 (`http2`, the same
/// pod port) and 443 (`https`), an echo server behind the first two and a TLS pod with its own
/// certificate behind the third.
struct App {
    /// The PEM certificate of its TLS pod.
    cert: String,
    _tls: TlsPod,
}

fn app(h: &mut Harness, name: &str, service_annotations: &[(&str, &str)]) -> App {
    let http = h.echo(name);
    let https = free_port();
    let work = h.work();
    let (cert, key) = self_signed(&work, &format!("{name}.example.com"), name);
    let (cert_file, key_file) = (
        work.join(format!("{name}.crt")),
        work.join(format!("{name}.key")),
    );
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let tls = TlsPod::start(https, &cert_file, &key_file);
    h.write(
        &format!("app-{name}.yaml"),
        &app_manifests(name, service_annotations, http, https),
    );
    App { cert, _tls: tls }
}

fn app_manifests(name: &str, annotations: &[(&str, &str)], http: u16, https: u16) -> String {
    let annotations: String = annotations
        .iter()
        .map(|(k, v)| format!("    {k}: {v:?}\n"))
        .collect();
    let annotations = if annotations.is_empty() {
        String::new()
    } else {
        format!("  annotations:\n{annotations}")
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {NS}\n{annotations}\
         spec:\n  ports:\n    - {{name: http, port: 80, targetPort: http}}\n    \
         - {{name: http2, port: 81, targetPort: http}}\n    - {{name: https, port: 443, targetPort: https}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-http\n  \
         namespace: {NS}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\n\
         ports:\n  - {{name: http, port: {http}}}\n  - {{name: http2, port: {http}}}\n\
         endpoints:\n  - addresses: [127.0.0.1]\n    conditions: {{ready: true}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-https\n  \
         namespace: {NS}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\n\
         ports:\n  - {{name: https, port: {https}}}\n\
         endpoints:\n  - addresses: [127.0.0.1]\n    conditions: {{ready: true}}\n"
    )
}

/// The suite's Backend resource (`backend-cr.yaml`).
fn backend_cr() -> String {
    format!(
        "apiVersion: ingress.v3.haproxy.org/v3\nkind: Backend\nmetadata:\n  name: mybackend\n  namespace: {NS}\n\
         spec:\n  name: foo\n  abortonclose: disabled\n  balance: {{algorithm: leastconn}}\n  \
         server_timeout: 20000\n  default_server:\n    check-sni: example.com\n    resolve-prefer: ipv4\n    \
         sni: str(example.com)\n    verify: none\n"
    )
}

fn cfg(h: &Harness) -> String {
    std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap()
}

/// The lines of section `header` (`frontend tcp_fe`), trimmed.
fn section(cfg: &str, header: &str) -> Vec<String> {
    let mut lines = cfg.lines().skip_while(|l| l.trim() != header);
    assert!(lines.next().is_some(), "no section {header:?} in:\n{cfg}");
    lines
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.trim().to_string())
        .collect()
}

fn has(lines: &[String], line: &str) {
    assert!(
        lines.iter().any(|l| l == line),
        "no line {line:?} in {lines:#?}"
    );
}

/// A raw HTTP request through a TCP frontend, optionally after a PROXY protocol v1 header:
/// who answered.
fn who_via(addr: SocketAddr, proxy_header: bool) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    if proxy_header {
        s.write_all(b"PROXY TCP4 192.0.2.7 127.0.0.1 40000 80\r\n")
            .ok()?;
    }
    s.write_all(b"GET /tcp HTTP/1.1\r\nHost: tcp\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| {
        body.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    })
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

/// The suite's `tcp-cr.yaml`: two entries, one with a v4 and a v4v6 bind on one port, one
/// with an `accept_proxy` bind.
fn tcp_cr(p1: u16, p2: u16, class: bool) -> String {
    let class = if class {
        "  annotations:\n    ingress.class: portcullis\n"
    } else {
        ""
    };
    format!(
        "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  name: tcp-1\n  namespace: {NS}\n{class}\
spec:
- frontend:
    binds:
      v4:
        name: v4
        address: 127.0.0.1
        port: {p1}
      v4v6:
        address: '::1'
        name: v4v6
        port: {p1}
        v4v6: true
    log_format: '%{{+Q}}o %t %s'
    name: fe-http-echo-80
    tcplog: true
  name: tcp-http-echo-80
  service:
    name: http-echo
    port: 80
- frontend:
    binds:
      v4acceptproxy:
        accept_proxy: true
        address: 127.0.0.1
        name: v4acceptproxy
        port: {p2}
    log_format: '%{{+Q}}o %t %s'
    name: fe-http-echo-81
    tcplog: true
  name: tcp-http-echo-81
  service:
    name: http-echo
    port: 81
"
    )
}

/// What `tcp-cr.yaml` must render and serve.
fn check_tcp_cr(h: &Harness, p1: u16, p2: u16, balance: &str) {
    wait_until(APPLY_TIMEOUT, "the v4 bind answers", || {
        who_via(addr("127.0.0.1", p1), false).as_deref() == Some("http-echo")
    });
    assert_eq!(
        who_via(addr("::1", p1), false).as_deref(),
        Some("http-echo"),
        "the v4v6 bind"
    );
    // The accept_proxy bind needs the PROXY header, and serves with it.
    assert_eq!(
        who_via(addr("127.0.0.1", p2), true).as_deref(),
        Some("http-echo")
    );
    assert_eq!(who_via(addr("127.0.0.1", p2), false), None);

    let cfg = cfg(h);
    let fe80 = section(&cfg, "frontend tcp_fe-http-echo-80");
    has(&fe80, "mode tcp");
    has(&fe80, &format!("bind 127.0.0.1:{p1} name v4"));
    has(&fe80, &format!("bind [::1]:{p1} name v4v6 v4v6"));
    has(&fe80, "log-format '%{+Q}o %t %s'");
    has(&fe80, &format!("default_backend tcp_{NS}_http-echo_80"));
    let fe81 = section(&cfg, "frontend tcp_fe-http-echo-81");
    has(
        &fe81,
        &format!("bind 127.0.0.1:{p2} name v4acceptproxy accept-proxy"),
    );
    has(&fe81, &format!("default_backend tcp_{NS}_http-echo_81"));
    for port in [80, 81] {
        let be = section(&cfg, &format!("backend tcp_{NS}_http-echo_{port}"));
        has(&be, "mode tcp");
        has(&be, &format!("balance {balance}"));
        assert!(
            be.iter().any(|l| l.starts_with("default-server check")),
            "{be:#?}"
        );
    }
}

#[test]
fn tcp_cr_ok() {
    let mut h = Harness::new();
    let (p1, p2) = (free_port(), free_port());
    let _app = app(&mut h, "http-echo", &[]);
    h.write("tcp.yaml", &tcp_cr(p1, p2, true));
    h.start(&[]);
    check_tcp_cr(&h, p1, p2, "roundrobin");
}

/// `Test_CRD_TCP_CR_Backend`: the Service names the suite's Backend resource with a bare
/// `cr-backend` annotation, as the suite's template does. Its balance algorithm and server
/// timeout reach both TCP backends; its TLS settings for the servers (`check-sni`, `sni`,
/// `verify`, `resolve-prefer`) and `abortonclose` map onto nothing in Portcullis and are
/// reported by path.
#[test]
fn tcp_cr_with_backend_cr() {
    let mut h = Harness::new();
    let (p1, p2) = (free_port(), free_port());
    let reference = format!("{NS}/mybackend");
    let _app = app(&mut h, "http-echo", &[("cr-backend", &reference)]);
    h.write("backend.yaml", &backend_cr());
    h.write("tcp.yaml", &tcp_cr(p1, p2, true));
    h.start(&[]);
    check_tcp_cr(&h, p1, p2, "leastconn");
    let cfg = cfg(&h);
    for port in [80, 81] {
        has(
            &section(&cfg, &format!("backend tcp_{NS}_http-echo_{port}")),
            "timeout server 20000",
        );
    }
    for field in [
        "spec.abortonclose",
        "spec.default_server.check-sni",
        "spec.default_server.resolve-prefer",
        "spec.default_server.sni",
        "spec.default_server.verify",
    ] {
        let line = format!("Backend {NS}/mybackend: {field}: Portcullis maps no setting");
        wait_until(APPLY_TIMEOUT, &line, || h.log().contains(&line));
    }
}

#[test]
fn tcp_cr_ssl() {
    let mut h = Harness::new();
    let port = free_port();
    let _app = app(&mut h, "http-echo", &[]);
    let (crt, key) = self_signed(&h.work(), "crdtcp-test.haproxy", "tcp-test-cert");
    h.write("secret.yaml", &tls_secret(NS, "tcp-test-cert", &crt, &key));
    h.write(
        "tcp.yaml",
        &format!(
            "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  name: tcp-1\n  namespace: {NS}\n  \
             annotations: {{ingress.class: portcullis}}\nspec:\n- frontend:\n    binds:\n      v4:\n        \
             name: v4\n        address: 127.0.0.1\n        port: {port}\n        ssl: true\n        \
             ssl_certificate: tcp-test-cert\n      v4v6:\n        address: '::1'\n        name: v4v6\n        \
             port: {port}\n        v4v6: true\n    log_format: '%{{+Q}}o %t %s'\n    name: fe-http-echo-443\n    \
             tcplog: true\n  name: tcp-http-echo-443\n  service:\n    name: http-echo\n    port: 443\n"
        ),
    );
    h.start(&[]);
    // TLS terminated with the Secret's certificate on the v4 bind, then on to the pod.
    let served = served_certificate(port, "crdtcp-test.haproxy").expect("a TLS handshake");
    assert_eq!(
        fingerprint(&h.work(), &served),
        fingerprint(&h.work(), &crt)
    );
    let fe = section(&cfg(&h), "frontend tcp_fe-http-echo-443");
    let pem = secret_file(&h.config_dir(), "certs", NS, "tcp-test-cert");
    has(&fe, &format!("bind 127.0.0.1:{port} name v4 ssl crt {pem}"));
    has(&fe, &format!("bind [::1]:{port} name v4v6 v4v6"));
    has(&fe, "log-format '%{+Q}o %t %s'");
    has(&fe, &format!("default_backend tcp_{NS}_http-echo_443"));
}

#[test]
fn tcp_cr_additional_services() {
    let mut h = Harness::new();
    let port = free_port();
    let _a = app(&mut h, "http-echo", &[]);
    let _b = app(&mut h, "http-echo-2", &[]);
    h.write(
        "tcp.yaml",
        &format!(
            "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  name: tcp-1\n  namespace: {NS}\n  \
             annotations:\n    ingress.class: portcullis\nspec:\n  - name: tcp-http-echo-80\n    frontend:\n      \
             name: fe-http-echo-80\n      tcplog: true\n      log_format: \"%{{+Q}}o %t %s\"\n      binds:\n        \
             v4:\n          port: {port}\n          address: 127.0.0.1\n          name: v4\n        v4v6:\n          \
             address: \"::1\"\n          name: v4v6\n          port: {port}\n          v4v6: true\n    service:\n      \
             name: \"http-echo\"\n      port: 80\n    services:\n      - name: \"http-echo-2\"\n        port: 443\n      \
             - name: \"http-echo-2\"\n        port: 80\n"
        ),
    );
    h.start(&[]);
    wait_until(APPLY_TIMEOUT, "the frontend answers", || {
        who_via(addr("127.0.0.1", port), false).as_deref() == Some("http-echo")
    });
    let cfg = cfg(&h);
    has(
        &section(&cfg, "frontend tcp_fe-http-echo-80"),
        &format!("default_backend tcp_{NS}_http-echo_80"),
    );
    for backend in ["http-echo_80", "http-echo-2_80", "http-echo-2_443"] {
        let be = section(&cfg, &format!("backend tcp_{NS}_{backend}"));
        has(&be, "mode tcp");
        has(&be, "balance roundrobin");
    }
}

/// Three apps reached through one TLS-inspecting frontend: SNI backend0/backend1 switch to
/// http-echo-0/http-echo-1 (by ACL name or by an anonymous ACL), anything else goes to the
/// default Service. `frontend` is the YAML of the frontend's rules.
fn switching(rules: &str, extra: &str) -> (Harness, u16, [App; 3]) {
    let mut h = Harness::new();
    let port = free_port();
    let apps = [
        app(&mut h, "http-echo", &[]),
        app(&mut h, "http-echo-0", &[]),
        app(&mut h, "http-echo-1", &[]),
    ];
    h.write(
        "tcp.yaml",
        &format!(
            "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  annotations:\n    \
             ingress.class: portcullis\n  name: tcp-1\n  namespace: {NS}\nspec:\n  - frontend:\n{rules}      \
             binds:\n        v4:\n          address: 127.0.0.1\n          name: v4\n          port: {port}\n      \
             log_format: \"%{{+Q}}o %t %s\"\n      name: fe-http-echo\n      tcp_request_rule_list:\n        \
             - timeout: 5000\n          type: inspect-delay\n        - action: accept\n          cond: if\n          \
             cond_test: \"{{ req_ssl_hello_type 1 }}\"\n          type: content\n      tcplog: true\n{extra}    \
             name: tcp-test\n    service:\n      name: http-echo\n      port: 443\n    services:\n      \
             - name: http-echo-0\n        port: 443\n      - name: http-echo-1\n        port: 443\n"
        ),
    );
    h.start(&[]);
    (h, port, apps)
}

/// Each SNI reaches the pod whose certificate comes back.
fn check_switching(h: &Harness, port: u16, apps: &[App; 3]) {
    let fp = |pem: &str| fingerprint(&h.work(), pem);
    for (sni, app) in [
        ("backend0.example.com", &apps[1]),
        ("backend1.example.com", &apps[2]),
        ("foo.bar", &apps[0]),
    ] {
        wait_until(APPLY_TIMEOUT, sni, || {
            served_certificate(port, sni).is_some_and(|c| fp(&c) == fp(&app.cert))
        });
    }
    let fe = section(&cfg(h), "frontend tcp_fe-http-echo");
    has(&fe, &format!("bind 127.0.0.1:{port} name v4"));
    has(&fe, "mode tcp");
    has(&fe, "log-format '%{+Q}o %t %s'");
    has(&fe, &format!("default_backend tcp_{NS}_http-echo_443"));
    has(&fe, "tcp-request inspect-delay 5000");
    has(
        &fe,
        "tcp-request content accept if { req_ssl_hello_type 1 }",
    );
}

#[test]
fn tcp_cr_backend_switching_rule() {
    let rules = format!(
        "      backend_switching_rule_list:\n        - cond: if\n          \
         cond_test: \"{{ req_ssl_sni -i backend0.example.com }}\"\n          name: {NS}_svc_http-echo-0_https\n        \
         - cond: if\n          cond_test: \"{{ req_ssl_sni -i backend1.example.com }}\"\n          \
         name: {NS}_svc_http-echo-1_https\n"
    );
    let (h, port, apps) = switching(&rules, "");
    check_switching(&h, port, &apps);
    has(
        &section(&cfg(&h), "frontend tcp_fe-http-echo"),
        &format!(
            "use_backend tcp_{NS}_http-echo-0_443 if {{ req_ssl_sni -i backend0.example.com }}"
        ),
    );
}

const ACLS: &str = "      acl_list:\n        - acl_name: switch_be_0\n          criterion: req_ssl_sni\n          \
                    value: -i backend0.example.com\n        - acl_name: switch_be_1\n          \
                    criterion: req_ssl_sni\n          value: -i backend1.example.com\n";

fn acl_rules() -> String {
    format!(
        "{ACLS}      backend_switching_rule_list:\n        - cond: if\n          cond_test: switch_be_0\n          \
         name: {NS}_svc_http-echo-0_https\n        - cond: if\n          cond_test: switch_be_1\n          \
         name: {NS}_svc_http-echo-1_https\n"
    )
}

fn check_acls(h: &Harness) {
    let fe = section(&cfg(h), "frontend tcp_fe-http-echo");
    has(&fe, "acl switch_be_0 req_ssl_sni -i backend0.example.com");
    has(&fe, "acl switch_be_1 req_ssl_sni -i backend1.example.com");
    has(
        &fe,
        &format!("use_backend tcp_{NS}_http-echo-0_443 if switch_be_0"),
    );
    has(
        &fe,
        &format!("use_backend tcp_{NS}_http-echo-1_443 if switch_be_1"),
    );
}

#[test]
fn tcp_cr_backend_switching_rule_with_acls() {
    let (h, port, apps) = switching(&acl_rules(), "");
    check_switching(&h, port, &apps);
    check_acls(&h);
}

/// `tcp-cr-full.yaml`: the same with `capture_list`, `filter_list` and `log_target_list`,
/// which Portcullis does not render (a capture has nothing to capture in a TCP frontend
/// without `tcp-request content capture`; filters and log targets are the operator's, not a
/// tenant's): each is reported by path, and the rest works.
#[test]
fn tcp_cr_full() {
    let extra = "      capture_list:\n        - length: 12345\n          type: request\n        \
                 - length: 54321\n          type: response\n      filter_list:\n        \
                 - trace_name: BEFORE-HTTP-COMP\n          type: trace\n        - type: compression\n      \
                 log_target_list:\n        - address: stdout\n          facility: daemon\n          format: raw\n";
    let (h, port, apps) = switching(&acl_rules(), extra);
    check_switching(&h, port, &apps);
    check_acls(&h);
    let fe = section(&cfg(&h), "frontend tcp_fe-http-echo");
    assert!(
        !fe.iter()
            .any(|l| l.starts_with("declare capture") || l.starts_with("filter")),
        "{fe:#?}"
    );
    for field in ["capture_list", "filter_list", "log_target_list"] {
        let line = format!("TCP {NS}/tcp-1: spec[0].frontend.{field}: Portcullis does not support");
        wait_until(APPLY_TIMEOUT, &line, || h.log().contains(&line));
    }
}

/// A TCP object without a class is not this controller's (no `--watch-ingress-without-class`,
/// no default IngressClass): nothing listens and nothing of it is rendered.
#[test]
fn tcp_cr_no_ingress_class() {
    let mut h = Harness::new();
    let (p1, p2) = (free_port(), free_port());
    let _app = app(&mut h, "http-echo", &[]);
    let _app2 = app(&mut h, "http-echo-2", &[]);
    h.write("tcp.yaml", &tcp_cr(p1, p2, false));
    h.start(&[]);
    assert_eq!(who_via(addr("127.0.0.1", p1), false), None);
    let cfg = cfg(&h);
    assert!(!cfg.contains("frontend tcp_fe-http-echo-80"), "{cfg}");
    assert!(!cfg.contains(&format!("backend tcp_{NS}_")), "{cfg}");
}

/// Access control by `tcp-request` rules fails closed: a frontend that rejects by rule serves
/// while its rules are usable, and refuses every connection once one of its ACLs is not.
#[test]
fn a_frontend_rejecting_by_rule_fails_closed() {
    let mut h = Harness::new();
    let port = free_port();
    let _app = app(&mut h, "http-echo", &[]);
    let object = |value: &str| {
        format!(
            "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  name: guarded\n  namespace: {NS}\n  \
             annotations: {{ingress.class: portcullis}}\nspec:\n  - name: guarded\n    frontend:\n      \
             name: fe-guarded\n      binds: {{v4: {{address: 127.0.0.1, port: {port}}}}}\n      acl_list:\n        \
             - {{acl_name: blocked, criterion: src, value: \"{value}\"}}\n      tcp_request_rule_list:\n        \
             - {{type: connection, action: reject, cond: if, cond_test: blocked}}\n    \
             service: {{name: http-echo, port: 80}}\n"
        )
    };
    h.write("tcp.yaml", &object("192.0.2.0/24"));
    h.start(&[]);
    let target = addr("127.0.0.1", port);
    wait_until(
        APPLY_TIMEOUT,
        "a client outside the blocked range is served",
        || who_via(target, false).as_deref() == Some("http-echo"),
    );
    // Blocking loopback itself: refused, which shows the rule is in force.
    h.write("tcp.yaml", &object("127.0.0.0/8"));
    wait_until(APPLY_TIMEOUT, "the blocked range is refused", || {
        who_via(target, false).is_none()
    });
    h.write("tcp.yaml", &object("192.0.2.0/24"));
    wait_until(APPLY_TIMEOUT, "served again", || {
        who_via(target, false).as_deref() == Some("http-echo")
    });
    // An ACL that reads a file is refused, and the frontend then refuses everyone.
    h.write("tcp.yaml", &object("-f /etc/hosts"));
    wait_until(APPLY_TIMEOUT, "everyone is refused", || {
        who_via(target, false).is_none()
    });
    let fe = section(&cfg(&h), "frontend tcp_fe-guarded");
    has(&fe, "tcp-request connection reject");
    assert!(!fe.iter().any(|l| l.starts_with("acl")), "{fe:#?}");
}
