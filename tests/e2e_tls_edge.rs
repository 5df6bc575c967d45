//! TLS at the edge against a real HAProxy: `ssl-passthrough` next to TLS offload on the same
//! port (the client sees the pod's own certificate), client certificates (`client-ca`,
//! required and optional) and verified TLS to the pods with a client certificate
//! (`server-ca`, `server-crt`). The "pods" that speak TLS are `openssl s_server -www` processes
//! on loopback, killed when the test ends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

const NS: &str = "shop";

/// A Secret with `ca.crt`.
fn ca_secret(name: &str, pem: &str) -> String {
    let body: String = pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {NS}\nstringData:\n  ca.crt: |\n{body}"
    )
}

/// An `openssl s_server -www` "pod" on 127.0.0.1:`port`, killed when dropped.
struct TlsPod(Child);

impl TlsPod {
    fn start(port: u16, cert: &Path, key: &Path, client_ca: Option<&Path>) -> Self {
        let mut cmd = Command::new("openssl");
        cmd.args(["s_server", "-www", "-quiet", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(cert)
            .arg("-key")
            .arg(key);
        if let Some(ca) = client_ca {
            cmd.args(["-Verify", "1", "-CAfile"]).arg(ca);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting openssl s_server");
        let pod = Self(child);
        wait_until(Duration::from_secs(10), "s_server listens", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        pod
    }
}

impl Drop for TlsPod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A GET through TLS to HAProxy's HTTPS port with SNI `host`, optionally with a client
/// certificate and extra headers; `None` when no HTTP answer came back (a refused handshake).
fn https_request(
    port: u16,
    host: &str,
    client: Option<(&Path, &Path)>,
    extra: &[(&str, &str)],
) -> Option<Answer> {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-quiet", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-servername")
        .arg(host);
    if let Some((cert, key)) = client {
        cmd.arg("-cert").arg(cert).arg("-key").arg(key);
    }
    let mut request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in extra {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let out = output_with_input(cmd, Some(request.as_bytes()), Duration::from_secs(10));
    let text = String::from_utf8_lossy(&out.stdout);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.lines().next()?.split(' ').nth(1)?.parse().ok()?;
    Some(Answer {
        status,
        headers: Vec::new(),
        body: body.to_string(),
    })
}

fn passthrough_ingress(name: &str, host: &str) -> String {
    ingress(
        NS,
        name,
        &[route(Some(host), "/", "Prefix", "vault")],
        None,
        &[],
    )
}

#[test]
fn passthrough_and_offload_share_the_https_port() {
    let mut h = Harness::new();
    let work = h.work();
    // The pod terminates TLS itself, with its own certificate.
    let (pod_crt, pod_key) = self_signed(&work, "vault.example.com", "vault-pod");
    let (pod_crt_path, pod_key_path) = (work.join("vault-pod.crt"), work.join("vault-pod.key"));
    let pod_port = free_port();
    let _pod = TlsPod::start(pod_port, &pod_crt_path, &pod_key_path, None);
    let pod_fp = fingerprint(&work, &pod_crt);
    assert!(!pod_key.is_empty());

    let vault = format!(
        "{}---\n{}",
        service(NS, "vault", &[("haproxy.org/ssl-passthrough", "true")]),
        endpoint_slices(NS, "vault", &[("0", pod_port, true)])
    );
    h.write("vault.yaml", &vault);
    h.write(
        "vault-ingress.yaml",
        &passthrough_ingress("vault", "vault.example.com"),
    );
    // Offload next to it, on the same port.
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    let (web_crt, web_key) = self_signed(&work, "shop.example.com", "web");
    h.write(
        "web-tls.yaml",
        &tls_secret(NS, "web-tls", &web_crt, &web_key),
    );
    h.write(
        "web-ingress.yaml",
        &ingress(
            NS,
            "web",
            &[route(Some("shop.example.com"), "/", "Prefix", "web")],
            None,
            &[("web-tls", &["shop.example.com"])],
        ),
    );
    h.start(&[]);

    let port = h.https_port;
    let check_both = |h: &Harness| {
        // The passthrough host sees the pod's certificate and the pod's own answer.
        let served = served_certificate(port, "vault.example.com").expect("a handshake");
        assert_eq!(
            fingerprint(&work, &served),
            pod_fp,
            "the pod's own certificate"
        );
        let answer = https_request(port, "vault.example.com", None, &[]).expect("an answer");
        assert_eq!(answer.status, 200);
        assert!(answer.body.contains("s_server"), "{}", answer.body);
        // The offloaded host gets HAProxy's certificate and the echo pod, with the client's
        // address kept across the local hop (PROXY protocol).
        let served = served_certificate(port, "shop.example.com").expect("a handshake");
        assert_eq!(
            fingerprint(&work, &served),
            fingerprint(&work, &web_crt),
            "HAProxy's certificate"
        );
        let answer = https_get(port, "shop.example.com", "shop.example.com", "/").unwrap();
        assert_eq!(answer.who(), "web", "{answer:?}\n{}", h.log());
        assert!(
            answer.body.contains("x-forwarded-for: 127.0.0.1"),
            "{}",
            answer.body
        );
        assert!(
            answer.body.contains("x-forwarded-proto: https"),
            "{}",
            answer.body
        );
    };
    check_both(&h);
    let sni = std::fs::read_to_string(h.config_dir().join("maps/sni.map")).unwrap();
    assert_eq!(sni, "vault.example.com tcp_shop_vault_80\n");

    // Another passthrough host for the same Service: a runtime map change, no reload.
    let (reloads, failed) = h.reloads();
    h.write(
        "vault2-ingress.yaml",
        &passthrough_ingress("vault2", "vault2.example.com"),
    );
    wait_until(APPLY_TIMEOUT, "vault2 is passed through", || {
        served_certificate(port, "vault2.example.com")
            .is_some_and(|c| fingerprint(&work, &c) == pod_fp)
    });
    assert_eq!(h.reloads(), (reloads, failed), "a runtime map change");
    let shown = h.runtime("show map maps/sni.map\n");
    assert!(shown.contains("vault2.example.com"), "{shown}");

    // A structural change reloads HAProxy: both paths on the port survive it (the local
    // socket between the two frontends is handed over to the new worker).
    let api = h.backend(NS, "api");
    h.write("api.yaml", &api);
    h.write("api-ingress.yaml", &api_ingress(NS));
    wait_until(APPLY_TIMEOUT, "the api backend is served", || {
        h.try_get("api.example.com", "/")
            .is_some_and(|a| a.who() == "api")
    });
    assert_eq!(h.reloads(), (reloads + 1, failed));
    h.wait_old_workers_gone();
    check_both(&h);

    // The last passthrough hosts go away: the HTTPS frontend takes the port back.
    h.remove("vault-ingress.yaml");
    h.remove("vault2-ingress.yaml");
    wait_until(APPLY_TIMEOUT, "vault is no longer passed through", || {
        served_certificate(port, "vault.example.com")
            .is_some_and(|c| fingerprint(&work, &c) == fingerprint(&work, &web_crt))
    });
    let answer = https_get(port, "shop.example.com", "shop.example.com", "/").unwrap();
    assert_eq!(answer.who(), "web");
    wait_until(APPLY_TIMEOUT, "the SNI map file is removed", || {
        !h.config_dir().join("maps/sni.map").exists()
    });
    assert_eq!(h.reloads().1, failed, "no reload failed");
}

fn client_ca_config(optional: bool) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: portcullis\n  namespace: ingress\ndata:\n  client-ca: {NS}/clients\n  client-crt-optional: \"{optional}\"\n"
    )
}

#[test]
fn client_certificates_are_required_or_passed_on() {
    let mut h = Harness::new();
    let work = h.work();
    let ca = make_ca(&work, "clients", "/CN=clients CA");
    let alice = make_signed(&work, &ca, "alice", "alice");
    let rogue_ca = make_ca(&work, "rogue", "/CN=rogue CA");
    let mallory = make_signed(&work, &rogue_ca, "mallory", "mallory");

    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    let (web_crt, web_key) = self_signed(&work, "shop.example.com", "web");
    h.write(
        "web-tls.yaml",
        &tls_secret(NS, "web-tls", &web_crt, &web_key),
    );
    h.write(
        "web-ingress.yaml",
        &ingress(
            NS,
            "web",
            &[route(Some("shop.example.com"), "/", "Prefix", "web")],
            None,
            &[("web-tls", &["shop.example.com"])],
        ),
    );
    h.write("clients.yaml", &ca_secret("clients", &ca.2));
    h.write("config.yaml", &client_ca_config(false));
    h.start(&["--configmap", "ingress/portcullis"]);
    let port = h.https_port;
    let ca_file = h.config_dir().join(support::secret_file(
        &h.config_dir(),
        "certs/ca",
        "shop",
        "clients",
    ));
    assert!(ca_file.is_file());

    // Required: a certificate from the CA is accepted and the pod learns who it is.
    let answer = https_request(port, "shop.example.com", Some((&alice.0, &alice.1)), &[])
        .expect("an answer with a good certificate");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.contains("x-ssl-client-verify: SUCCESS"),
        "{}",
        answer.body
    );
    assert!(
        answer.body.contains("x-ssl-client-dn: /CN=alice/O=alice"),
        "{}",
        answer.body
    );
    assert!(
        answer.body.contains("x-ssl-client-cn: alice"),
        "{}",
        answer.body
    );
    // Without a certificate, or with one from another CA, the handshake is refused.
    assert!(https_request(port, "shop.example.com", None, &[]).is_none());
    assert!(
        https_request(
            port,
            "shop.example.com",
            Some((&mallory.0, &mallory.1)),
            &[]
        )
        .is_none()
    );
    // Plain HTTP is not affected (mTLS is a property of the HTTPS bind).
    assert_eq!(h.get("shop.example.com", "/").status, 302, "ssl-redirect");

    // Optional: clients without a certificate are served; the header says so, and a client
    // cannot forge the subject.
    let (reloads, failed) = h.reloads();
    h.write("config.yaml", &client_ca_config(true));
    wait_until(
        APPLY_TIMEOUT,
        "clients without a certificate are served",
        || https_request(port, "shop.example.com", None, &[]).is_some_and(|a| a.status == 200),
    );
    assert_eq!(h.reloads(), (reloads + 1, failed));
    let answer = https_request(
        port,
        "shop.example.com",
        None,
        &[
            ("X-SSL-Client-DN", "/CN=admin"),
            ("X-SSL-Client-Verify", "SUCCESS"),
        ],
    )
    .unwrap();
    assert!(
        answer.body.contains("x-ssl-client-verify: NONE"),
        "{}",
        answer.body
    );
    assert!(!answer.body.contains("x-ssl-client-dn"), "{}", answer.body);
    let answer = https_request(port, "shop.example.com", Some((&alice.0, &alice.1)), &[]).unwrap();
    assert!(
        answer.body.contains("x-ssl-client-verify: SUCCESS"),
        "{}",
        answer.body
    );
    // A certificate from another CA is still refused.
    assert!(
        https_request(
            port,
            "shop.example.com",
            Some((&mallory.0, &mallory.1)),
            &[]
        )
        .is_none()
    );

    // client-ca goes away: the CA file goes with it, after the reload that stops naming it.
    h.write(
        "config.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: portcullis\n  namespace: ingress\ndata: {}\n",
    );
    wait_until(APPLY_TIMEOUT, "the CA file is removed", || {
        !ca_file.exists()
    });
    assert_eq!(h.reloads().1, failed, "no reload failed");
}

#[test]
fn tls_to_the_pods_is_verified_and_presents_a_client_certificate() {
    let mut h = Harness::new();
    let work = h.work();
    let pods_ca = make_ca(&work, "pods", "/CN=pods CA");
    let pod = make_signed(&work, &pods_ca, "api.internal", "api-pod");
    // The pod only talks to clients with a certificate from this CA: HAProxy's server-crt.
    let to_pods_ca = make_ca(&work, "to-pods", "/CN=to-pods CA");
    let haproxy_client = make_signed(&work, &to_pods_ca, "haproxy", "haproxy-client");
    let pod_port = free_port();
    let _pod = TlsPod::start(pod_port, &pod.0, &pod.1, Some(&to_pods_ca.0));

    let api = format!(
        "{}---\n{}",
        service(
            NS,
            "api",
            &[
                ("haproxy.org/server-ca", "pods-ca"),
                ("haproxy.org/server-crt", "to-pods"),
                ("haproxy.org/check", "false"),
            ]
        ),
        endpoint_slices(NS, "api", &[("0", pod_port, true)])
    );
    h.write("api.yaml", &api);
    h.write("pods-ca.yaml", &ca_secret("pods-ca", &pods_ca.2));
    h.write(
        "to-pods.yaml",
        &tls_secret(NS, "to-pods", &haproxy_client.2, &haproxy_client.3),
    );
    h.write("api-ingress.yaml", &api_ingress(NS));
    h.start(&[]);
    let answer = h.get("api.example.com", "/");
    assert_eq!(answer.status, 200, "{answer:?}\n{}", h.log());
    assert!(answer.body.contains("s_server"), "{}", answer.body);
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    let ca = support::secret_file(&h.config_dir(), "certs/ca", "shop", "pods-ca");
    let crt = support::secret_file(&h.config_dir(), "certs/client", "shop", "to-pods");
    assert!(
        cfg.contains(&format!("ssl verify required ca-file {ca} crt {crt}")),
        "{cfg}"
    );

    // Another CA: the pod's certificate no longer verifies, and HAProxy refuses to talk to it.
    let other = make_ca(&work, "other", "/CN=other CA");
    let (reloads, failed) = h.reloads();
    h.write("pods-ca.yaml", &ca_secret("pods-ca", &other.2));
    wait_until(APPLY_TIMEOUT, "the pod is refused", || {
        h.try_get("api.example.com", "/")
            .is_some_and(|a| a.status == 503)
    });
    assert_eq!(h.reloads(), (reloads + 1, failed), "a CA change reloads");

    // The Secret disappears: fail closed (503), never unverified TLS.
    h.remove("pods-ca.yaml");
    wait_until(APPLY_TIMEOUT, "the backend refuses without its CA", || {
        std::fs::read_to_string(h.config_dir().join("haproxy.cfg"))
            .unwrap()
            .contains("http-request deny deny_status 503")
    });
    assert_eq!(h.get("api.example.com", "/").status, 503);
}
