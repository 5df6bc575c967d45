//! Keys and flags operators bring from haproxytech/kubernetes-ingress, against a real HAProxy:
//! `--healthz-bind-port` answered by HAProxy itself, `ssl-redirect-port`, and the TLS
//! protocol and cipher keys of the controller ConfigMap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;

use support::*;

const NS: &str = "shop";

#[test]
fn haproxy_answers_healthz_on_its_own_port() {
    let mut h = Harness::new();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    let port = free_port();
    h.start(&["--healthz-bind-port", &port.to_string()]);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let answer = http_get(addr, "lb-probe", "/healthz").expect("HAProxy answers");
    assert_eq!(answer.status, 200, "{answer:?}");
    let other = http_get(addr, "lb-probe", "/").expect("HAProxy answers");
    assert_eq!(other.status, 404, "{other:?}");
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(cfg.contains("frontend healthz"), "{cfg}");
    // It is HAProxy's: the controller's own admin endpoint is elsewhere.
    assert_ne!(port, h.admin_port);
}

/// The incumbent's QUIC flags are accepted, each with a warning: this HAProxy has no QUIC.
#[test]
fn quic_flags_are_accepted_with_a_warning() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/tests/quic");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .env("NO_COLOR", "1")
        .arg("render")
        .arg("--manifests")
        .arg(&dir)
        .args(["--quic-bind-port", "443", "--quic-announce-port", "443"])
        .arg("--disable-quic")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for flag in ["--quic-bind-port", "--quic-announce-port"] {
        assert!(
            stderr.contains(&format!(
                "warning: {flag} is ignored: this HAProxy has no QUIC"
            )),
            "{stderr}"
        );
    }
    let cfg = String::from_utf8_lossy(&out.stdout);
    assert!(!cfg.contains("quic"), "{cfg}");
}
