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
    let pem = h.config_dir().join(support::secret_file(
        &h.config_dir(),
        "certs",
        "app",
        "app-tls",
    ));
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

/// The same Secret serves a TCP bind (named directly) and an Ingress (through the crt-list);
/// the Ingress goes away while another keeps HTTPS up. The certificate leaves the crt-list at
/// run time, but its file stays, because the TCP bind still names it, and nothing fails.
#[test]
fn a_certificate_shared_with_a_tcp_bind_outlives_its_ingress() {
    let mut h = Harness::new();
    let (tls_port, plain_port) = (free_port(), free_port());
    let app = h.backend(NS, "app");
    let (crt, key) = self_signed(&h.work(), "app.example.com", "app");
    let (other_crt, other_key) = self_signed(&h.work(), "keep.example.com", "keep");
    h.write("app.yaml", &app);
    h.write("secret.yaml", &tls_secret(NS, "app-tls", &crt, &key));
    h.write(
        "keep-secret.yaml",
        &tls_secret(NS, "a-keep-tls", &other_crt, &other_key),
    );
    h.write("tcp.yaml", &tcp_object(tls_port, plain_port));
    // The older Ingress keeps HTTPS (and the default certificate) in place.
    h.write(
        "a-keep.yaml",
        &ingress(
            NS,
            "a-keep",
            &[route(Some("keep.example.com"), "/", "Prefix", "app")],
            None,
            &[("a-keep-tls", &["keep.example.com"])],
        ),
    );
    h.write(
        "b-shared.yaml",
        &ingress(
            NS,
            "b-shared",
            &[route(Some("app.example.com"), "/", "Prefix", "app")],
            None,
            &[("app-tls", &["app.example.com"])],
        ),
    );
    h.start(&[]);
    let fp = fingerprint(&h.work(), &crt);
    let served_https = served_certificate(h.https_port, "app.example.com").unwrap();
    assert_eq!(fingerprint(&h.work(), &served_https), fp);
    let (reloads, failed) = h.reloads();

    h.remove("b-shared.yaml");
    wait_until(APPLY_TIMEOUT, "the Ingress' crt-list line is gone", || {
        !std::fs::read_to_string(h.config_dir().join("certs/crt-list.txt"))
            .unwrap()
            .contains("app_app-tls")
    });
    // Still served on the TCP bind, still on disk, no reload failed.
    let served_tcp = served_certificate(tls_port, "app.example.com").unwrap();
    assert_eq!(fingerprint(&h.work(), &served_tcp), fp);
    support::secret_file(&h.config_dir(), "certs", "app", "app-tls");
    referenced_files_exist(&h);
    assert_eq!(h.reloads().1, failed);
    assert_eq!(h.reloads().0, reloads, "a crt-list line leaves at run time");
}
