//! The TCP custom resource against a real HAProxy: raw TCP through a TCP-mode frontend, TLS
//! terminated with a certificate named directly on the bind (the upstream failure page's
//! scenario), and the certificate becoming unused without a failed reload or a missing file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;

use support::*;

const NS: &str = "app";

fn tcp_object(tls_port: u16, plain_port: u16) -> String {
    format!(
        "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  name: app\n  namespace: {NS}\n  annotations: {{ingress.class: portcullis}}\nspec:\n  - name: tcp-app\n    frontend:\n      name: app-tls\n      binds:\n        - {{name: tls, address: 127.0.0.1, port: {tls_port}, ssl: true, ssl_certificate: app-tls, alpn: h2}}\n        - {{name: plain, address: 127.0.0.1, port: {plain_port}}}\n    service: {{name: app, port: 80}}\n"
    )
}

/// Every file the configuration on disk names exists.
fn referenced_files_exist(h: &Harness) {
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    for word in cfg.split_whitespace() {
        let name = word
            .trim_start_matches("map_str(")
            .trim_start_matches("map_beg(");
        let name = name.split(')').next().unwrap_or_default();
        if name.starts_with("certs/") || name.starts_with("maps/") {
            assert!(
                h.config_dir().join(name).is_file(),
                "{name} is named but missing"
            );
        }
    }
}

#[test]
fn tcp_frontends_carry_bytes_and_their_certificate_can_go_away() {
    let mut h = Harness::new();
    let (tls_port, plain_port) = (free_port(), free_port());
    let app = h.backend(NS, "app");
    let (crt, key) = self_signed(&h.work(), "app.example.com", "app");
    h.write("app.yaml", &app);
    h.write("secret.yaml", &tls_secret(NS, "app-tls", &crt, &key));
    h.write("tcp.yaml", &tcp_object(tls_port, plain_port));
    h.start(&[]);

    // Plain TCP: an HTTP request sent as raw bytes reaches the pod and comes back.
    let plain: SocketAddr = format!("127.0.0.1:{plain_port}").parse().unwrap();
    let answer = http_get(plain, "anything", "/raw").unwrap();
    assert_eq!(answer.who(), "app");
    // TLS terminated on the TCP bind with the Secret's certificate.
    let served = served_certificate(tls_port, "app.example.com").expect("a TLS handshake");
    assert_eq!(
        fingerprint(&h.work(), &served),
        fingerprint(&h.work(), &crt)
    );
    referenced_files_exist(&h);
    let pem = h.config_dir().join("certs/app_app-tls.pem");
    assert!(pem.is_file());

    // The TCP object goes away: one reload, which no longer names the certificate; only then
    // is its file removed. No reload failed and nothing named is missing.
    let (reloads, failed) = h.reloads();
    h.remove("tcp.yaml");
    wait_until(APPLY_TIMEOUT, "the TCP frontend is gone", || {
        http_get(plain, "anything", "/raw").is_err()
    });
    wait_until(APPLY_TIMEOUT, "the certificate file is removed", || {
        !pem.exists()
    });
    assert_eq!(h.reloads(), (reloads + 1, failed));
    referenced_files_exist(&h);

    // Back again, and its Secret rotated meanwhile: served with the new certificate.
    let (crt2, key2) = self_signed(&h.work(), "app.example.com", "app2");
    h.write("secret.yaml", &tls_secret(NS, "app-tls", &crt2, &key2));
    h.write("tcp.yaml", &tcp_object(tls_port, plain_port));
    wait_until(APPLY_TIMEOUT, "the new certificate is served", || {
        served_certificate(tls_port, "app.example.com")
            .is_some_and(|c| fingerprint(&h.work(), &c) == fingerprint(&h.work(), &crt2))
    });
    assert_eq!(h.reloads().1, failed, "no reload failed");
    referenced_files_exist(&h);
}
