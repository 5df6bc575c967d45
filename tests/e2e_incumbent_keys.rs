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

/// `ssl-redirect-port`: plain HTTP for a TLS host goes to that HTTPS port, with the path and
/// query kept and the request's own port dropped; a host without it keeps the plain scheme
/// redirect, and `443` is the same as none.
#[test]
fn ssl_redirect_port_names_the_https_port() {
    let mut h = Harness::new();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    let (crt, key) = self_signed(&h.work(), "example.com", "tls");
    h.write("secret.yaml", &tls_secret(NS, "tls", &crt, &key));
    let tls_ingress = |name: &str, host: &str, annotations: &[(&str, &str)]| {
        annotated(
            &ingress(
                NS,
                name,
                &[route(Some(host), "/", "Prefix", "web")],
                None,
                &[("tls", &[host])],
            ),
            annotations,
        )
    };
    h.write(
        "ported.yaml",
        &tls_ingress(
            "ported",
            "ported.example.com",
            &[
                ("haproxy.org/ssl-redirect-port", "8443"),
                ("haproxy.org/ssl-redirect-code", "301"),
            ],
        ),
    );
    h.write(
        "plain.yaml",
        &tls_ingress("plain", "plain.example.com", &[]),
    );
    h.write(
        "standard.yaml",
        &tls_ingress(
            "standard",
            "standard.example.com",
            &[("haproxy.org/ssl-redirect-port", "443")],
        ),
    );
    h.start(&[]);

    let answer = h.get("ported.example.com:80", "/a/b?x=1");
    assert_eq!(answer.status, 301, "{answer:?}");
    assert_eq!(
        answer.header("location"),
        Some("https://ported.example.com:8443/a/b?x=1")
    );
    for host in ["plain.example.com", "standard.example.com"] {
        let answer = h.get(host, "/c?d=e");
        assert_eq!(answer.status, 302, "{answer:?}");
        assert_eq!(
            answer.header("location"),
            Some(format!("https://{host}/c?d=e").as_str())
        );
    }
    let map = std::fs::read_to_string(h.config_dir().join("maps/ssl-redirect.map")).unwrap();
    assert!(map.contains("ported.example.com 301:8443"), "{map}");
    assert!(map.contains("standard.example.com 302\n"), "{map}");

    // A bad port is reported on the Ingress; its host keeps the default port.
    h.write(
        "ported.yaml",
        &tls_ingress(
            "ported",
            "ported.example.com",
            &[("haproxy.org/ssl-redirect-port", "http")],
        ),
    );
    wait_until(APPLY_TIMEOUT, "the default port again", || {
        h.try_get("ported.example.com", "/")
            .is_some_and(|a| a.header("location") == Some("https://ported.example.com/"))
    });
    wait_until(APPLY_TIMEOUT, "a diagnostic naming the key", || {
        h.log()
            .lines()
            .any(|l| l.contains("Ingress shop/ported") && l.contains("ssl-redirect-port"))
    });
}

/// The controller ConfigMap's TLS keys on a real HAProxy: with `ssl-min-ver TLSv1.3`, a
/// client limited to TLS 1.2 is refused and a TLS 1.3 client served; a bad value is reported
/// on the key and the default (TLS 1.2 and up) comes back.
#[test]
fn tls_versions_and_suites_from_the_configmap() {
    use rustls::ProtocolVersion;
    let mut h = Harness::new();
    write_tls_site(&mut h, NS, "secure.example.com", "tls");
    let (crt, key) = self_signed(&h.work(), "secure.example.com", "tls");
    h.write("secret.yaml", &tls_secret(NS, "tls", &crt, &key));
    let config = |data: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: portcullis, namespace: {NS}}}\ndata:\n{data}"
        )
    };
    h.write(
        "configmap.yaml",
        &config(
            "  ssl-default-bind-options: ssl-min-ver TLSv1.3\n  ssl-default-bind-ciphersuites: TLS_AES_256_GCM_SHA384\n",
        ),
    );
    h.start(&["--configmap", &format!("{NS}/portcullis")]);
    let port = h.https_port;
    let tls12 = || negotiated_version(port, "secure.example.com", &[&rustls::version::TLS12]);
    let tls13 = || negotiated_version(port, "secure.example.com", &[&rustls::version::TLS13]);
    assert_eq!(tls12(), None, "a TLS 1.2 client is refused");
    assert_eq!(tls13(), Some(ProtocolVersion::TLSv1_3));
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(
        cfg.contains("ssl-default-bind-options ssl-min-ver TLSv1.3 no-tls-tickets"),
        "{cfg}"
    );
    assert!(
        cfg.contains("ssl-default-bind-ciphersuites TLS_AES_256_GCM_SHA384"),
        "{cfg}"
    );

    // A version HAProxy does not know: reported on the key, the default applies again.
    h.write(
        "configmap.yaml",
        &config("  ssl-default-bind-options: ssl-min-ver TLSv1.4\n"),
    );
    wait_until(APPLY_TIMEOUT, "TLS 1.2 is served again", || {
        tls12() == Some(ProtocolVersion::TLSv1_2)
    });
    wait_until(APPLY_TIMEOUT, "a diagnostic naming the key", || {
        h.log().lines().any(|l| {
            l.contains("ConfigMap shop/portcullis") && l.contains("ssl-default-bind-options")
        })
    });
    assert_eq!(h.reloads().1, 0, "no reload failed");
}

/// A cipher list whose syntax is fine but that the linked OpenSSL matches nothing with: HAProxy
/// refuses it, the key is left out with an error on the ConfigMap naming it and HAProxy's
/// words, and everything else is applied; a good list is taken again.
#[test]
fn a_cipher_list_haproxy_refuses_is_left_out_and_named() {
    let mut h = Harness::new();
    write_tls_site(&mut h, NS, "secure.example.com", "tls");
    let (crt, key) = self_signed(&h.work(), "secure.example.com", "tls");
    h.write("secret.yaml", &tls_secret(NS, "tls", &crt, &key));
    let config = |ciphers: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: portcullis, namespace: {NS}}}\ndata:\n  ssl-default-bind-ciphers: {ciphers}\n  timeout-client: 31s\n"
        )
    };
    h.write("configmap.yaml", &config("NOSUCHCIPHER"));
    h.start(&["--configmap", &format!("{NS}/portcullis")]);
    let port = h.https_port;
    wait_until(APPLY_TIMEOUT, "a diagnostic naming the key", || {
        h.log().lines().any(|l| {
            l.contains("ConfigMap shop/portcullis")
                && l.contains("key ssl-default-bind-ciphers")
                && l.contains("unable to set SSL cipher list")
        })
    });
    // The rest of the ConfigMap applies, and TLS is served with OpenSSL's default list.
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(cfg.contains("timeout client 31000"), "{cfg}");
    assert!(!cfg.contains("NOSUCHCIPHER"), "{cfg}");
    assert!(served_certificate(port, "secure.example.com").is_some());

    // A list OpenSSL knows is taken.
    h.write(
        "configmap.yaml",
        &config("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256"),
    );
    wait_until(APPLY_TIMEOUT, "the new list is in force", || {
        std::fs::read_to_string(h.config_dir().join("haproxy.cfg"))
            .is_ok_and(|c| c.contains("ssl-default-bind-ciphers ECDHE-ECDSA-AES128-GCM-SHA256"))
    });
    assert_eq!(
        negotiated_version(port, "secure.example.com", &[&rustls::version::TLS12]),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
}

/// Per TLS host: an Ingress' `ssl-min-ver` goes on its hosts' crt-list line, so a TLS 1.2
/// client is refused by that host and served by another Ingress' host on the same port.
#[test]
fn an_ingress_raises_the_tls_version_of_its_own_hosts() {
    use rustls::ProtocolVersion;
    let mut h = Harness::new();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    for (name, host) in [
        ("strict", "strict.example.com"),
        ("plain", "plain.example.com"),
    ] {
        let (crt, key) = self_signed(&h.work(), host, name);
        h.write(
            &format!("{name}-tls.yaml"),
            &tls_secret(NS, &format!("{name}-tls"), &crt, &key),
        );
    }
    let tls_ingress = |name: &str, host: &str, annotations: &[(&str, &str)]| {
        annotated(
            &ingress(
                NS,
                name,
                &[route(Some(host), "/", "Prefix", "web")],
                None,
                &[(&format!("{name}-tls"), &[host])],
            ),
            annotations,
        )
    };
    h.write(
        "strict.yaml",
        &tls_ingress(
            "strict",
            "strict.example.com",
            &[
                ("haproxy.org/ssl-min-ver", "TLSv1.3"),
                ("haproxy.org/ssl-ciphersuites", "TLS_AES_256_GCM_SHA384"),
            ],
        ),
    );
    h.write(
        "plain.yaml",
        &tls_ingress("plain", "plain.example.com", &[]),
    );
    h.start(&[]);
    let port = h.https_port;
    let tls12 = |host: &str| negotiated_version(port, host, &[&rustls::version::TLS12]);
    assert_eq!(tls12("strict.example.com"), None, "{}", h.log());
    assert_eq!(tls12("plain.example.com"), Some(ProtocolVersion::TLSv1_2));
    assert_eq!(
        negotiated_version(port, "strict.example.com", &[&rustls::version::TLS13]),
        Some(ProtocolVersion::TLSv1_3)
    );
    let list = std::fs::read_to_string(h.config_dir().join("certs/crt-list.txt")).unwrap();
    assert!(
        list.lines().any(|l| l.contains(
            "[ssl-min-ver TLSv1.3 ciphersuites TLS_AES_256_GCM_SHA384] strict.example.com"
        )),
        "{list}"
    );

    // A bad version is reported on the Ingress; its host takes the default again.
    h.write(
        "strict.yaml",
        &tls_ingress(
            "strict",
            "strict.example.com",
            &[("haproxy.org/ssl-min-ver", "TLSv9")],
        ),
    );
    wait_until(APPLY_TIMEOUT, "TLS 1.2 is served again", || {
        tls12("strict.example.com") == Some(ProtocolVersion::TLSv1_2)
    });
    wait_until(APPLY_TIMEOUT, "a diagnostic naming the annotation", || {
        h.log()
            .lines()
            .any(|l| l.contains("Ingress shop/strict") && l.contains("ssl-min-ver"))
    });
    assert_eq!(h.reloads().1, 0, "no reload failed");
}
