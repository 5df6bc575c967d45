//! Access lists on `ssl-passthrough` hosts against a real HAProxy: HAProxy does not decrypt
//! these connections, so `allow-list` and `deny-list` are applied to the client's address in
//! the passthrough frontend, per host, before a byte reaches the pod. Clients are told apart
//! by their loopback source address (127.0.0.x). The "pod" is an `openssl s_server` that
//! terminates TLS with its own certificate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::{IpAddr, Ipv4Addr};

use support::*;

const NS: &str = "shop";
const ALLOWED: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const OTHER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
const DEFAULT: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));

fn passthrough_ingress(name: &str, host: &str, annotations: &[(&str, &str)]) -> String {
    annotated(
        &ingress(
            NS,
            name,
            &[route(Some(host), "/", "Prefix", "vault")],
            None,
            &[],
        ),
        annotations,
    )
}

#[test]
fn access_lists_apply_to_passthrough_hosts_one_by_one() {
    let mut h = Harness::new();
    let work = h.work();
    let (pod_crt, _) = self_signed(&work, "vault.example.com", "vault-pod");
    let pod_port = free_port();
    let _pod = TlsPod::start(
        pod_port,
        &work.join("vault-pod.crt"),
        &work.join("vault-pod.key"),
    );
    let pod_fp = fingerprint(&work, &pod_crt);
    h.write(
        "vault.yaml",
        &format!(
            "{}---\n{}",
            service(NS, "vault", &[("haproxy.org/ssl-passthrough", "true")]),
            endpoint_slices(NS, "vault", &[("0", pod_port, true)])
        ),
    );
    // Three hosts on the same Service: one open to 127.0.0.2 alone, one closed to
    // 127.0.0.3, one without a list.
    h.write(
        "allow.yaml",
        &passthrough_ingress(
            "allow",
            "allow.example.com",
            &[("haproxy.org/allow-list", "127.0.0.2/32, 10.0.0.0/8")],
        ),
    );
    h.write(
        "deny.yaml",
        &passthrough_ingress(
            "deny",
            "deny.example.com",
            &[("haproxy.org/blacklist", "127.0.0.3")],
        ),
    );
    h.write(
        "open.yaml",
        &passthrough_ingress("open", "open.example.com", &[]),
    );
    h.start(&[]);
    let port = h.https_port;
    let reaches_pod = |from: IpAddr, host: &str| {
        served_certificate_der_from(Some(from), port, host)
            .is_some_and(|der| fingerprint(&work, &pem_encode("CERTIFICATE", &der)) == pod_fp)
    };
    let refused =
        |from: IpAddr, host: &str| served_certificate_der_from(Some(from), port, host).is_none();

    assert!(reaches_pod(ALLOWED, "allow.example.com"), "{}", h.log());
    assert!(refused(OTHER, "allow.example.com"));
    assert!(refused(DEFAULT, "allow.example.com"));
    assert!(refused(OTHER, "deny.example.com"));
    assert!(reaches_pod(ALLOWED, "deny.example.com"));
    assert!(reaches_pod(DEFAULT, "deny.example.com"));
    for from in [ALLOWED, OTHER, DEFAULT] {
        assert!(reaches_pod(from, "open.example.com"), "{from}");
    }
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(
        cfg.contains("tcp-request content reject if { req_ssl_sni,lower -m str allow.example.com } !{ src 127.0.0.2/32 10.0.0.0/8 }"),
        "{cfg}"
    );

    // A typo in the allow-list closes the host to everyone (fail closed), reported on the
    // Ingress; the other hosts are untouched.
    h.write(
        "allow.yaml",
        &passthrough_ingress(
            "allow",
            "allow.example.com",
            &[("haproxy.org/allow-list", "127.0.0.2/33")],
        ),
    );
    wait_until(APPLY_TIMEOUT, "the host is closed to everyone", || {
        refused(ALLOWED, "allow.example.com")
    });
    assert!(refused(DEFAULT, "allow.example.com"));
    assert!(reaches_pod(OTHER, "open.example.com"));
    assert!(reaches_pod(ALLOWED, "deny.example.com"));
    wait_until(APPLY_TIMEOUT, "a diagnostic on the Ingress", || {
        h.log()
            .lines()
            .any(|l| l.contains("Ingress shop/allow") && l.contains("allow-list"))
    });

    // Removing the list opens the host again.
    h.write(
        "allow.yaml",
        &passthrough_ingress("allow", "allow.example.com", &[]),
    );
    wait_until(APPLY_TIMEOUT, "the host is open again", || {
        reaches_pod(OTHER, "allow.example.com")
    });
    assert_eq!(h.reloads().1, 0, "no reload failed");
}
