//! `portcullis webhook` served over TLS and called with real AdmissionReview requests: allowed,
//! denied with the controller's own message, warnings passed through, hostile requests answered
//! safely within the deadline, and a rotated certificate served without a restart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::needless_pass_by_value)]

#[path = "support/apiserver.rs"]
mod apiserver;
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};
use support::{free_port, make_ca, sign_with_ca, wait_until};

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A running webhook and the files of its certificate.
struct Webhook {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Webhook {
    fn start(scripts_dir: Option<&Path>) -> Webhook {
        let dir = tempfile::tempdir().unwrap();
        issue(dir.path(), "first");
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_portcullis"));
        cmd.arg("webhook")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--tls-cert")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.path().join("tls.key"))
            .args(["--configmap", "portcullis/portcullis", "--deadline", "2s"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(scripts) = scripts_dir {
            cmd.arg("--scripts-dir").arg(scripts);
        }
        let child = cmd.spawn().unwrap();
        wait_until(Duration::from_secs(20), "the webhook listens", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Webhook { child, port, dir }
    }

    /// The CA the current serving certificate was issued by, as the API server's `caBundle`.
    fn trusted(&self) -> rustls::RootCertStore {
        let pem = std::fs::read(self.dir.path().join("ca.crt")).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(cert.unwrap()).unwrap();
        }
        roots
    }

    fn connect(&self, roots: rustls::RootCertStore) -> Tls {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("webhook.portcullis.svc").unwrap();
        let connection = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let socket = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        rustls::StreamOwned::new(connection, socket)
    }

    /// One HTTPS request trusting `roots`: (status, body); status 0 when no answer came.
    fn request_with(
        &self,
        roots: rustls::RootCertStore,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, String) {
        let mut tls = self.connect(roots);
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        // A handshake the client refuses fails the first write: no answer.
        if tls.write_all(head.as_bytes()).is_err() {
            return (0, String::new());
        }
        let _ = tls.write_all(body);
        answer_on(&mut tls)
    }

    /// A POST that declares `length` bytes and sends none: the status.
    fn declared_only(&self, roots: rustls::RootCertStore, length: usize) -> u16 {
        let mut tls = self.connect(roots);
        let head =
            format!("POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Length: {length}\r\n\r\n");
        tls.write_all(head.as_bytes()).unwrap();
        answer_on(&mut tls).0
    }

    /// A POST of `body` in 64 KiB chunks, with no declared length: (status, body).
    fn request_chunked(&self, roots: rustls::RootCertStore, body: &[u8]) -> (u16, String) {
        let mut tls = self.connect(roots);
        let head = "POST /validate HTTP/1.1\r\nHost: webhook\r\nTransfer-Encoding: chunked\r\n\r\n";
        tls.write_all(head.as_bytes()).unwrap();
        for chunk in body.chunks(64 << 10) {
            let size = format!("{:x}\r\n", chunk.len());
            let framed = [size.as_bytes(), chunk, b"\r\n"].concat();
            // The server answers once the limit is passed and stops reading.
            if tls.write_all(&framed).is_err() {
                break;
            }
        }
        let _ = tls.write_all(b"0\r\n\r\n");
        answer_on(&mut tls)
    }

    fn review(&self, kind: &str, object: &Value) -> Value {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": kind},
                "namespace": object["metadata"]["namespace"],
                "name": object["metadata"]["name"],
                "operation": "CREATE",
                "object": object,
            },
        });
        let (status, body) = self.request_with(
            self.trusted(),
            "POST",
            "/validate",
            review.to_string().as_bytes(),
        );
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(
            answer["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
        answer["response"].clone()
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status and body of the answer read from `tls`.
fn answer_on(tls: &mut Tls) -> (u16, String) {
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A CA (`ca.crt`) and a serving certificate it signed (`tls.crt`, `tls.key`) in `dir`.
fn issue(dir: &Path, tag: &str) {
    let ca = make_ca(dir, tag, &format!("/CN=webhook CA {tag}"));
    let (crt, key) = sign_with_ca(
        dir,
        &ca,
        "/CN=webhook.portcullis.svc",
        Some("webhook.portcullis.svc"),
        &format!("{tag}-serving"),
    );
    // The key first: the pair is read again when either file changes.
    std::fs::copy(&key, dir.join("tls.key")).unwrap();
    std::fs::copy(&crt, dir.join("tls.crt")).unwrap();
    std::fs::copy(&ca.0, dir.join("ca.crt")).unwrap();
}

fn ingress(class: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
        "spec": {"ingressClassName": class, "rules": [{"host": "shop.example", "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]},
    })
}

/// The controller's diagnostics for `object` alone, as `portcullis render` prints them.
fn controller_says(object: &Value) -> String {
    let dir = tempfile::tempdir().unwrap();
    let class = "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: portcullis}\nspec: {controller: portcullis.io/ingress}\n";
    std::fs::write(dir.path().join("class.yaml"), class).unwrap();
    std::fs::write(dir.path().join("object.json"), object.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["render", "--manifests"])
        .arg(dir.path())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn reviews_allow_deny_and_warn_as_the_controller_reports() {
    let webhook = Webhook::start(None);

    let good = webhook.review(
        "Ingress",
        &ingress("portcullis", json!({"haproxy.org/timeout-server": "30s"})),
    );
    assert_eq!(good["allowed"], true, "{good}");
    assert!(good["warnings"].is_null(), "{good}");

    // Denied, with the message the controller gives for the same object.
    let bad_object = ingress(
        "portcullis",
        json!({"haproxy.org/timeout-server": "forever"}),
    );
    let bad = webhook.review("Ingress", &bad_object);
    assert_eq!(bad["allowed"], false, "{bad}");
    assert_eq!(bad["status"]["code"], 422);
    let message = bad["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("annotation haproxy.org/timeout-server") && message.contains("forever"),
        "{message}"
    );
    let detail = message
        .split_once(": ")
        .map(|(_, rest)| rest)
        .unwrap_or(message);
    let controller = controller_says(&bad_object);
    assert!(
        controller.contains(detail),
        "the controller says otherwise:\n{controller}\nwebhook: {message}"
    );

    // The Ingress' own fields are checked as the controller checks them.
    let mut bad_path = ingress("portcullis", json!({}));
    bad_path["spec"]["rules"][0]["http"]["paths"][0]["pathType"] = json!("Regex");
    let refused = webhook.review("Ingress", &bad_path);
    assert_eq!(refused["allowed"], false, "{refused}");
    let message = refused["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("spec.rules[0].http.paths[0].pathType: "),
        "{message}"
    );
    assert!(controller_says(&bad_path).contains(message), "{message}");

    // A warning (an annotation no script reads) passes through; the object is allowed.
    let typo = webhook.review(
        "Ingress",
        &ingress("portcullis", json!({"haproxy.org/timeout-servr": "30s"})),
    );
    assert_eq!(typo["allowed"], true, "{typo}");
    let warnings = typo["warnings"].to_string();
    assert!(
        warnings.contains("did you mean timeout-server"),
        "{warnings}"
    );

    // Another class's Ingress, or a ConfigMap that is not the controller's: not reviewed.
    let theirs = webhook.review(
        "Ingress",
        &ingress("nginx", json!({"haproxy.org/timeout-server": "forever"})),
    );
    assert_eq!(theirs["allowed"], true);
    assert!(theirs["warnings"].is_null());
    let config_map = |namespace: &str, name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": namespace},
               "data": {"timeout-server": "forever"}})
    };
    assert_eq!(
        webhook.review("ConfigMap", &config_map("apps", "settings"))["allowed"],
        true
    );
    let ours = webhook.review("ConfigMap", &config_map("portcullis", "portcullis"));
    assert_eq!(ours["allowed"], false, "{ours}");

    // A Service's annotations are checked too.
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop",
                     "annotations": {"haproxy.org/check": "sometimes"}},
        "spec": {"ports": [{"port": 80}]}});
    assert_eq!(webhook.review("Service", &service)["allowed"], false);
}

#[test]
fn hostile_requests_are_answered_safely_and_in_time() {
    let scripts = tempfile::tempdir().unwrap();
    std::fs::write(
        scripts.path().join("zz-spin.rhai"),
        "// Spins when asked to.\n// Scope: route\n// Risk: low\n\
         // Read: spin bool from Ingress default false: spins forever.\n\
         fn route(ctx) {\n    if ctx.bool(\"spin\") == true {\n        let n = 0;\n        loop { n += 1; }\n    }\n    #{}\n}\n",
    )
    .unwrap();
    let webhook = Webhook::start(Some(scripts.path()));
    let roots = || webhook.trusted();

    // Oversized by its declared length: refused before a byte of it is read.
    assert_eq!(webhook.declared_only(roots(), 4 << 20), 413);
    // Oversized as it arrives (chunked, no length): cut at the limit.
    let (status, _) = webhook.request_chunked(roots(), &vec![b' '; 5 << 20]);
    assert_eq!(status, 413);
    // Not JSON, not an AdmissionReview v1, no uid, the wrong method or path.
    for body in [
        &b"{not json"[..],
        br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u"}}"#,
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}"#,
    ] {
        let (status, text) = webhook.request_with(roots(), "POST", "/validate", body);
        assert_eq!(status, 400, "{text}");
    }
    assert_eq!(
        webhook.request_with(roots(), "GET", "/validate", b"").0,
        405
    );
    assert_eq!(
        webhook.request_with(roots(), "POST", "/other", b"{}").0,
        404
    );

    // An object that is not what its kind says: refused with the decoding error.
    let mangled = webhook.review(
        "Ingress",
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"ingressClassName": "portcullis", "rules": "everything"}}),
    );
    assert_eq!(mangled["allowed"], false);
    assert!(
        mangled["status"]["message"]
            .as_str()
            .unwrap()
            .contains("field spec.rules"),
        "{mangled}"
    );

    // A TCP object or an HTTPRoute of the wrong shape: refused, the field named.
    let tcp = webhook.review(
        "TCP",
        &json!({"apiVersion": "ingress.v3.haproxy.org/v3", "kind": "TCP",
                "metadata": {"name": "db", "namespace": "shop"},
                "spec": [{"name": "db", "frontend": {"name": "db",
                          "binds": {"v4": {"name": "v4", "port": "many"}}},
                          "service": {"name": "db", "port": 5432}}]}),
    );
    assert_eq!(tcp["allowed"], false);
    assert!(
        tcp.to_string()
            .contains("field spec[0].frontend.binds.v4.port"),
        "{tcp}"
    );
    let route = webhook.review(
        "HTTPRoute",
        &json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "web", "namespace": "shop"},
                "spec": {"rules": "all"}}),
    );
    assert_eq!(route["allowed"], false, "{route}");
    assert!(route.to_string().contains("spec.rules"), "{route}");

    // An HTTPRoute's annotations go through the route hooks, and its matches and filters
    // through the controller's checks: a bad value is refused with the field named, an
    // annotation no script reads on an HTTPRoute is a warning.
    let http_route = |annotations: Value, path: Value| {
        webhook.review(
            "HTTPRoute",
            &json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                    "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
                    "spec": {"hostnames": ["shop.example.com"],
                             "rules": [{"matches": [{"path": path}],
                                        "backendRefs": [{"name": "web", "port": 80}]}]}}),
        )
    };
    let prefix = json!({"type": "PathPrefix", "value": "/"});
    let good = http_route(
        json!({"haproxy.org/allow-list": "10.0.0.0/8"}),
        prefix.clone(),
    );
    assert_eq!(good["allowed"], true, "{good}");
    let banana = http_route(json!({"haproxy.org/allow-list": "banana"}), prefix.clone());
    assert_eq!(banana["allowed"], false, "{banana}");
    assert!(
        banana
            .to_string()
            .contains("annotation haproxy.org/allow-list"),
        "{banana}"
    );
    let regex = http_route(
        json!({}),
        json!({"type": "RegularExpression", "value": "/items/(["}),
    );
    assert_eq!(regex["allowed"], false, "{regex}");
    assert!(
        regex
            .to_string()
            .contains("spec.rules[0].matches[0].path.value"),
        "{regex}"
    );
    let ingress_only = http_route(json!({"haproxy.org/ssl-redirect": "true"}), prefix);
    assert_eq!(ingress_only["allowed"], true, "{ingress_only}");
    assert!(
        ingress_only["warnings"]
            .to_string()
            .contains("no script reads it on an HTTPRoute"),
        "{ingress_only}"
    );

    // A script that runs away is stopped by its budget: the answer comes within the deadline,
    // and says why.
    let started = Instant::now();
    let spun = webhook.review(
        "Ingress",
        &ingress("portcullis", json!({"portcullis.io/spin": "true"})),
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(spun.to_string().contains("zz-spin.rhai"), "{spun}");
    // And the webhook still answers.
    let after = webhook.review("Ingress", &ingress("portcullis", json!({})));
    assert_eq!(after["allowed"], true);

    // A client that does not trust the serving certificate gets no answer.
    let (status, _) =
        webhook.request_with(rustls::RootCertStore::empty(), "POST", "/validate", b"{}");
    assert_eq!(status, 0);
}

#[test]
fn a_rotated_certificate_is_served_without_a_restart() {
    let webhook = Webhook::start(None);
    let before = webhook.trusted();
    assert_eq!(
        webhook
            .request_with(before.clone(), "GET", "/validate", b"")
            .0,
        405
    );
    issue(webhook.dir.path(), "rotated");
    let after = webhook.trusted();
    wait_until(
        Duration::from_secs(25),
        "the new certificate is served",
        || {
            webhook
                .request_with(after.clone(), "GET", "/validate", b"")
                .0
                == 405
        },
    );
    assert_eq!(
        webhook.request_with(before, "GET", "/validate", b"").0,
        0,
        "the old certificate is still served"
    );
}

/// The managed certificate: issued into a Secret with the CA bundle written into the webhook
/// configuration, shared by a second replica, renewed with the old CA kept in the bundle.
#[test]
fn a_managed_certificate_is_issued_shared_and_renewed() {
    use apiserver::{ApiServer, ResourceDef};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(
        ApiServer::builder()
            .with_resource(ResourceDef::new(
                "admissionregistration.k8s.io/v1",
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
                false,
            ))
            .start(),
    );
    server.apply(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "portcullis-webhook"},
        "webhooks": [{"name": "validate.portcullis.io", "admissionReviewVersions": ["v1"],
                      "sideEffects": "None",
                      "clientConfig": {"service": {"name": "portcullis-webhook",
                                                   "namespace": "portcullis", "path": "/validate"}}}],
    }));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig, None);
    let start = |tag: &str| {
        let files = dir.path().join(tag);
        std::fs::create_dir(&files).unwrap();
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .arg("webhook")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--tls-cert")
            .arg(files.join("tls.crt"))
            .arg("--tls-key")
            .arg(files.join("tls.key"))
            .args([
                "--certificate-secret",
                "portcullis/portcullis-webhook-tls",
                "--dns-name",
                "webhook.portcullis.svc",
                "--certificate-check",
                "1s",
            ])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join(format!("{tag}.log"))).unwrap())
            .spawn()
            .unwrap();
        let log = dir.path().join(format!("{tag}.log"));
        wait_until(Duration::from_secs(30), "the webhook listens", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok() || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                assert!(!text.contains("error"), "{text}");
                false
            }
        });
        Webhook {
            child,
            port,
            dir: tempfile::tempdir().unwrap(),
        }
    };
    let bundle = || -> Vec<u8> {
        use base64::Engine as _;
        let configuration = server
            .get(
                "admissionregistration.k8s.io/v1",
                "ValidatingWebhookConfiguration",
                "",
                "portcullis-webhook",
            )
            .unwrap();
        configuration["webhooks"][0]["clientConfig"]["caBundle"]
            .as_str()
            .map(|b| base64::engine::general_purpose::STANDARD.decode(b).unwrap())
            .unwrap_or_default()
    };
    let roots = |pem: &[u8], only_first: bool| {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem).take(if only_first {
            1
        } else {
            9
        }) {
            roots.add(cert.unwrap()).unwrap();
        }
        roots
    };

    let one = start("one");
    let first = bundle();
    assert!(!first.is_empty(), "the CA bundle was written");
    assert_eq!(
        one.request_with(roots(&first, true), "GET", "/validate", b"")
            .0,
        405,
        "served with a certificate the bundle trusts"
    );
    let secret = server
        .get("v1", "Secret", "portcullis", "portcullis-webhook-tls")
        .expect("the Secret");
    assert_eq!(secret["type"], "kubernetes.io/tls");

    // A second replica takes the same certificate rather than issuing its own.
    let two = start("two");
    assert_eq!(bundle(), first, "the second replica issued again");
    assert_eq!(
        two.request_with(roots(&first, true), "GET", "/validate", b"")
            .0,
        405
    );

    // Made for other names: renewed, the old CA kept in the bundle beside the new one.
    let mut stale = server
        .get("v1", "Secret", "portcullis", "portcullis-webhook-tls")
        .unwrap();
    stale["metadata"]["annotations"]["portcullis.io/dns-names"] = json!("old.portcullis.svc");
    server.apply(stale);
    wait_until(Duration::from_secs(20), "renewed", || bundle() != first);
    let renewed = bundle();
    let old_ca = String::from_utf8_lossy(&first).to_string();
    assert!(
        String::from_utf8_lossy(&renewed).ends_with(&old_ca),
        "the old CA is kept"
    );
    for replica in [&one, &two] {
        wait_until(
            Duration::from_secs(30),
            "the renewed certificate is served",
            || {
                replica
                    .request_with(roots(&renewed, true), "GET", "/validate", b"")
                    .0
                    == 405
            },
        );
    }
    drop(rt);
}
