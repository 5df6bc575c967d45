//! haproxytech/kubernetes-ingress' own TLS suites, re-expressed against Portcullis: `https`
//! (offload, passthrough, the HTTP to HTTPS redirect) and `tls-auth` (client certificates).
//! One test per suite case, in the suites' shape: the `http-echo` app, whose pods also serve
//! TLS on their `https` port (here `openssl s_server`), the suites' two certificates, and
//! their assertions polled until they hold. The certificates are made by the tests.
//!
//! The `https` tests share one `portcullis run`, which has a default certificate as the
//! incumbent's installation does; `tls-auth` changes the controller ConfigMap and has its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod incumbent;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use incumbent::*;
use support::{
    APPLY_TIMEOUT, Answer, Harness, TlsPod, fingerprint, free_port, make_ca, output_with_input,
    self_signed, served_certificate, sign_with_ca, wait_until,
};

static SHARED: Shared = Shared::new();

/// The controller's default certificate (`--default-ssl-certificate`), in every
/// installation of the incumbent.
const DEFAULT_CERT_HOST: &str = "controller-default.haproxy";

fn harness() -> Arc<Harness> {
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend([
        "--default-ssl-certificate",
        "haproxy-controller/default-cert",
    ]);
    SHARED.get(
        |h| {
            h.write("ingressclass.yaml", &ingress_class());
            let (crt, key) = self_signed(&h.work(), DEFAULT_CERT_HOST, "controller-default");
            h.write(
                "default-cert.yaml",
                &tls_secret("haproxy-controller", "default-cert", &crt, &key),
            );
        },
        &flags,
    )
}

/// A certificate made for a test: its PEM text and files.
struct Cert {
    crt: String,
    key: String,
    crt_path: PathBuf,
    key_path: PathBuf,
}

fn cert(dir: &Path, host: &str, tag: &str) -> Cert {
    let (crt, key) = self_signed(dir, host, tag);
    Cert {
        crt,
        key,
        crt_path: dir.join(format!("{tag}.crt")),
        key_path: dir.join(format!("{tag}.key")),
    }
}

/// A directory of the test's own under the harness' scratch directory.
fn scratch(h: &Harness, name: &str) -> PathBuf {
    let dir = h.work().join(name);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// The https suite's `deploy.yaml`: its two certificates (`haproxy-default` for
/// `default.haproxy`, `haproxy-offload-test` for `offload-test.haproxy`) and the `http-echo`
/// app, whose pod serves HTTP on `http` and TLS on `https`.
fn https_app(suite: &Suite, h: &Harness, pod: &Pod, tls_port: Option<u16>) -> (Cert, Cert) {
    let dir = scratch(h, &suite.ns);
    let default = cert(&dir, "default.haproxy", "haproxy-default");
    let offload = cert(&dir, "offload-test.haproxy", "haproxy-offload-test");
    let endpoint = Endpoint {
        https: tls_port,
        ..pod.endpoint()
    };
    h.write(
        &format!("{}-app.yaml", suite.ns),
        &[
            echo_service(&suite.ns, "http-echo", &[]),
            slices(&suite.ns, "http-echo", &[endpoint]),
            tls_secret(&suite.ns, "haproxy-default", &default.crt, &default.key),
            tls_secret(
                &suite.ns,
                "haproxy-offload-test",
                &offload.crt,
                &offload.key,
            ),
        ]
        .join("---\n"),
    );
    (default, offload)
}

/// The https suite's `ingress.yaml.tmpl`: `/` to the port `port` of `http-echo`, with the two
/// `spec.tls` entries when `tls`.
fn https_ingress(suite: &Suite, h: &Harness, annotations: &[(&str, &str)], tls: bool, port: &str) {
    let host = [suite.host.as_str()];
    let entries: &[(&str, &[&str])] = if tls {
        &[
            ("haproxy-offload-test", &host),
            ("haproxy-default", &["default.haproxy"]),
        ]
    } else {
        &[]
    };
    h.write(
        &format!("{}-ingress.yaml", suite.ns),
        &ingress(
            &suite.ns,
            "http-echo",
            Some(CLASS),
            annotations,
            Some(&suite.host),
            &[IngPath {
                port,
                ..root("http-echo")
            }],
            entries,
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// https

/// https `Test_HTTPS_Offload`: the client asking for `offload-test.haproxy` gets the
/// certificate whose name that is.
///
/// The incumbent picks a certificate by the names in it; Portcullis by the `spec.tls` hosts
/// that name its Secret, and serves its default certificate for any other name. The suite's
/// name is served the right certificate here because this Ingress' first TLS entry is that
/// certificate and the suite's host is listed for it; `default.haproxy`, which no rule of
/// the Ingress routes, gets the controller's default certificate.
#[test]
fn https_offload() {
    let h = harness();
    let suite = Suite::new("https-offload");
    let pod = Pod::start("http-echo", Reply::Echo);
    let (default, offload) = https_app(&suite, &h, &pod, None);
    https_ingress(&suite, &h, &[], true, "http");
    let work = h.work();
    let offload_fp = fingerprint(&work, &offload.crt);
    let served = |sni: &str| served_certificate(h.https_port, sni).map(|c| fingerprint(&work, &c));
    wait_until(
        APPLY_TIMEOUT,
        "the suite's host gets offload-test.haproxy",
        || served(&suite.host).as_deref() == Some(offload_fp.as_str()),
    );
    let answer = support::https_get(h.https_port, &suite.host, &suite.host, "/").unwrap();
    assert_eq!(answer.who(), "http-echo", "{answer:?}");
    // The suite's own request: SNI offload-test.haproxy.
    let controller_default = served(DEFAULT_CERT_HOST).expect("a handshake");
    assert_ne!(controller_default, offload_fp);
    assert_eq!(
        served("offload-test.haproxy"),
        Some(controller_default.clone()),
        "a name no spec.tls host lists gets the default certificate"
    );
    assert_eq!(
        served("default.haproxy"),
        Some(controller_default),
        "default.haproxy is listed but no rule routes it"
    );
    assert_ne!(fingerprint(&work, &default.crt), offload_fp);
}

/// An `openssl s_server -www` pod on 127.0.0.1:`port` serving `default`, or `by_name` to
/// clients whose SNI is `name`; killed when dropped.
fn tls_pod(port: u16, default: &Cert, name: &str, by_name: &Cert) -> TlsPod {
    let extra = [
        "-servername".as_ref(),
        name.as_ref(),
        "-cert2".as_ref(),
        by_name.crt_path.as_os_str(),
        "-key2".as_ref(),
        by_name.key_path.as_os_str(),
    ];
    TlsPod::start_with(port, &default.crt_path, &default.key_path, &extra)
}

/// The https suite's passthrough app: a pod whose TLS server shows a certificate of its own
/// when (and only when) the client's SNI is the suite's host. Returns the pod, its TLS
/// server and that certificate's fingerprint.
fn passthrough_app(suite: &Suite, h: &Harness) -> (Pod, TlsPod, String) {
    let pod = Pod::start("http-echo", Reply::Echo);
    let tls_port = free_port();
    https_app(suite, h, &pod, Some(tls_port));
    let dir = scratch(h, &format!("{}-pod", suite.ns));
    let pod_default = cert(&dir, "pod.default", "pod-default");
    let pod_sni = cert(&dir, &suite.host, "pod-sni");
    let tls = tls_pod(tls_port, &pod_default, &suite.host, &pod_sni);
    (pod, tls, fingerprint(&h.work(), &pod_sni.crt))
}

/// https `Test_HTTPS_Passthrough`, `Reach_Backend`: with `ssl-passthrough` the pod
/// terminates TLS itself and sees the client's SNI.
#[test]
fn https_passthrough_reach_backend() {
    let h = harness();
    let suite = Suite::new("https-passthrough");
    let (_pod, _tls, pod_sni_fp) = passthrough_app(&suite, &h);
    https_ingress(&suite, &h, &[("ssl-passthrough", "true")], true, "https");
    let work = h.work();
    wait_until(
        APPLY_TIMEOUT,
        "the pod answers with its certificate for the SNI",
        || {
            served_certificate(h.https_port, &suite.host)
                .is_some_and(|c| fingerprint(&work, &c) == pod_sni_fp)
        },
    );
    let answer = support::https_get(h.https_port, &suite.host, &suite.host, "/").unwrap();
    assert_eq!(answer.status, 200);
    assert!(
        answer.body.contains("s_server"),
        "the pod's own answer: {answer:?}"
    );
}

/// https `Test_HTTPS_Passthrough`, `Ingress_annotations`: an allow-list on a passthrough
/// Ingress refuses other clients' connections (the test client is not 6.6.6.6); a name that
/// is not passed through is not affected.
#[test]
fn https_passthrough_ingress_annotations() {
    let h = harness();
    let suite = Suite::new("https-passthrough-acl");
    let (_pod, _tls, pod_sni_fp) = passthrough_app(&suite, &h);
    https_ingress(&suite, &h, &[("ssl-passthrough", "true")], true, "https");
    let work = h.work();
    wait_until(APPLY_TIMEOUT, "passed through", || {
        served_certificate(h.https_port, &suite.host)
            .is_some_and(|c| fingerprint(&work, &c) == pod_sni_fp)
    });
    https_ingress(
        &suite,
        &h,
        &[("ssl-passthrough", "true"), ("whitelist", "6.6.6.6")],
        true,
        "https",
    );
    wait_until(APPLY_TIMEOUT, "the connection is refused", || {
        support::https_get(h.https_port, &suite.host, &suite.host, "/").is_none()
    });
    let other = format!("{}.bar", suite.host);
    assert!(
        support::https_get(h.https_port, &other, &other, "/").is_some(),
        "another name is not blocked"
    );
}

/// https `Test_HTTPS_Redirect`.
#[test]
fn https_redirect() {
    let h = harness();
    let suite = Suite::new("https-redirect");
    let pod = Pod::start("http-echo", Reply::Echo);
    https_app(&suite, &h, &pod, None);
    let plain = || request(h.http_port, "GET", &suite.host, "/", &[]);
    https_ingress(&suite, &h, &[], false, "http");
    suite.eventually(&h, "served over HTTP", plain, |a| a.status == 200);
    // implicit_via_TLS
    https_ingress(&suite, &h, &[], true, "http");
    suite.eventually(&h, "implicit_via_TLS: 302", plain, |a| {
        a.status == 302 && a.header("location") == Some(format!("https://{}/", suite.host).as_str())
    });
    // custom_code. The suite asks for it on an Ingress without TLS, which the incumbent
    // redirects; Portcullis redirects only the hosts of `spec.tls` (a host without a
    // certificate would fail its TLS handshake after the redirect), so it is asked with TLS.
    let custom = [("ssl-redirect", "true"), ("ssl-redirect-code", "301")];
    https_ingress(&suite, &h, &custom, false, "http");
    suite.eventually(&h, "custom_code without TLS: not redirected", plain, |a| {
        a.status == 200
    });
    https_ingress(&suite, &h, &custom, true, "http");
    suite.eventually(&h, "custom_code: 301", plain, |a| a.status == 301);
    // disabled
    https_ingress(&suite, &h, &[("ssl-redirect", "false")], true, "http");
    suite.eventually(&h, "disabled: 200", plain, |a| a.status == 200);
}

// ---------------------------------------------------------------------------------------------
// tls-auth

/// A client certificate for `cn` signed by the CA: `(certificate path, key path)`.
fn make_client(
    dir: &Path,
    ca: &(PathBuf, PathBuf, String),
    cn: &str,
    tag: &str,
) -> (PathBuf, PathBuf) {
    sign_with_ca(dir, ca, &format!("/CN={cn}"), None, tag)
}

/// A GET over TLS with SNI `host`, optionally with a client certificate; `None` when no HTTP
/// answer came back (the handshake was refused).
fn https_with_client_cert(
    port: u16,
    host: &str,
    client: Option<&(PathBuf, PathBuf)>,
) -> Option<Answer> {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-quiet", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-servername")
        .arg(host);
    if let Some((crt, key)) = client {
        cmd.arg("-cert").arg(crt).arg("-key").arg(key);
    }
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
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

/// tls-auth `Test_Client_TLS_Auth`: with the ConfigMap's `client-ca`, a client without a
/// certificate or with one of another CA is refused in the handshake; one with a certificate
/// of that CA is served (here the default backend's 404, as in the suite).
#[test]
fn tls_auth_client_tls_auth() {
    let mut h = Harness::new();
    let ns = "e2e-tests-tls-auth";
    let dir = h.work();
    let (crt, key) = self_signed(&dir, "default.haproxy", "default-cert");
    h.write(
        "default-cert.yaml",
        &tls_secret(ns, "default-cert", &crt, &key),
    );
    h.write("ingressclass.yaml", &ingress_class());
    let base = include_str!("fixtures/incumbent/configmap.yaml");
    h.write(
        "configmap.yaml",
        &format!("{base}  ssl-certificate: {ns}/default-cert\n  client-ca: {ns}/client-ca\n"),
    );
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend(CONFIGMAP_FLAGS);
    h.start(&flags);
    let host = format!("{ns}.test");
    // The suite's setup, before the CA's Secret exists: the incumbent ignores the missing
    // CA and serves (404); Portcullis fails closed and refuses every request (403).
    wait_until(APPLY_TIMEOUT, "without the CA's Secret: 403", || {
        https_with_client_cert(h.https_port, &host, None).is_some_and(|a| a.status == 403)
    });
    let ca = make_ca(&dir, "client", "/CN=client CA/O=haproxy");
    let wrong_ca = make_ca(&dir, "wrong", "/CN=wrong CA/O=haproxy");
    let valid = make_client(&dir, &ca, "valid", "valid");
    let wrong = make_client(&dir, &wrong_ca, "wrong", "wrong");
    // The CA Secret in the incumbent's format: the certificate under `tls.crt`.
    let ca_body: String = ca.2.lines().map(|l| format!("    {l}\n")).collect();
    h.write(
        "client-ca.yaml",
        &format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: client-ca\n  namespace: {ns}\n\
             type: Opaque\nstringData:\n  tls.crt: |\n{ca_body}"
        ),
    );
    // no_client_cert
    wait_until(APPLY_TIMEOUT, "no_client_cert: refused", || {
        https_with_client_cert(h.https_port, &host, None).is_none()
    });
    // correct_client_cert
    wait_until(
        APPLY_TIMEOUT,
        "correct_client_cert: the default backend",
        || {
            https_with_client_cert(h.https_port, &host, Some(&valid))
                .is_some_and(|a| a.status == 404)
        },
    );
    // wrong_client_cert
    assert!(
        https_with_client_cert(h.https_port, &host, Some(&wrong)).is_none(),
        "wrong_client_cert: refused"
    );
}

// ---------------------------------------------------------------------------------------------
// https-runtime

/// https-runtime `Test_HTTS_OffloadRuntime`: certificates added to Ingresses, and a
/// certificate's new content, reach HAProxy without a reload, and survive the next reload.
///
/// The suite's first Ingress lists only `default.haproxy`, a host it does not route, which
/// Portcullis ignores; so the suite's second step brings the first TLS host, whose HTTP to
/// HTTPS redirect rule reloads HAProxy once. The hosts added after it do not.
///
/// The controller's default certificate is the suite's `haproxy-default`. The suite then
/// gives the Secret of `offload-test.haproxy` the content of `offload-test-4.haproxy`: the
/// incumbent, which picks certificates by the names in them, then serves its default
/// certificate for `offload-test.haproxy`; Portcullis serves the Secret the Ingress names
/// for that host, now with the name `offload-test-4.haproxy`. The suite's reload comes from
/// a Backend resource (`cr-backend`); here from a backend annotation.
#[test]
fn https_runtime_offload_runtime() {
    let ns = "e2e-tests-https-runtime";
    let mut h = Harness::new();
    let dir = h.work();
    let names = [
        ("haproxy-default", "default.haproxy"),
        ("haproxy-offload-test", "offload-test.haproxy"),
        ("haproxy-offload-test-1", "offload-test-1.haproxy"),
        ("haproxy-offload-test-2", "offload-test-2.haproxy"),
        ("haproxy-offload-test-3", "offload-test-3.haproxy"),
        ("haproxy-offload-test-4", "offload-test-4.haproxy"),
    ];
    let certs: Vec<Cert> = names.iter().map(|(s, host)| cert(&dir, host, s)).collect();
    let secrets: Vec<String> = names
        .iter()
        .zip(&certs)
        .map(|((s, _), c)| tls_secret(ns, s, &c.crt, &c.key))
        .collect();
    h.write("secrets.yaml", &secrets.join("---\n"));
    h.write("ingressclass.yaml", &ingress_class());
    let pod = Pod::start("http-echo-offload", Reply::Echo);
    let app = |service_annotations: &[(&str, &str)], tls: &[(&str, &[&str])]| {
        [
            echo_service(ns, "http-echo-offload", service_annotations),
            slices(ns, "http-echo-offload", &[pod.endpoint()]),
            ingress(
                ns,
                "http-echo-offload",
                Some(CLASS),
                &[],
                Some("offload-test.haproxy"),
                &[root("http-echo-offload")],
                tls,
            ),
        ]
        .join("---\n")
    };
    h.write(
        "app.yaml",
        &app(&[], &[("haproxy-default", &["default.haproxy"])]),
    );
    let default_cert = format!("{ns}/haproxy-default");
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend(["--default-ssl-certificate", default_cert.as_str()]);
    h.start(&flags);
    let work = h.work();
    let fp = |i: usize| fingerprint(&work, &certs[i].crt);
    let served = |sni: &str| served_certificate(h.https_port, sni).map(|c| fingerprint(&work, &c));
    let get = || {
        support::https_get(
            h.https_port,
            "offload-test.haproxy",
            "offload-test.haproxy",
            "/",
        )
    };
    wait_until(
        APPLY_TIMEOUT,
        "default.haproxy's certificate, and 200",
        || served("offload-test.haproxy") == Some(fp(0)) && get().is_some_and(|a| a.status == 200),
    );
    let reloads = h.reloads();
    // Six TLS entries: offload-test.haproxy gets its own certificate, without a reload.
    let all: Vec<(&str, [&str; 1])> = names.iter().map(|(s, host)| (*s, [*host])).collect();
    let entries: Vec<(&str, &[&str])> = all[1..]
        .iter()
        .chain(&all[..1])
        .map(|(s, hosts)| (*s, &hosts[..]))
        .collect();
    h.write("app.yaml", &app(&[], &entries));
    wait_until(APPLY_TIMEOUT, "offload-test.haproxy's certificate", || {
        served("offload-test.haproxy") == Some(fp(1)) && get().is_some_and(|a| a.status == 200)
    });
    // The first host with TLS (the suite's first Ingress lists only a host it does not
    // route, which Portcullis ignores) gives the HTTP frontend its redirect rule: one reload.
    let (first_reloads, failed) = h.reloads();
    assert_eq!((first_reloads, failed), (reloads.0 + 1, reloads.1));
    assert!(config(&h).contains("http-request redirect scheme https code 302"));
    let reloads = h.reloads();
    // More routed hosts with their certificates, in an Ingress of their own: runtime
    // updates only.
    let mut more = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: http-echo-more\n  \
         namespace: {ns}\nspec:\n  ingressClassName: {CLASS}\n  tls:\n"
    );
    for (secret, host) in &names[2..] {
        more.push_str(&format!(
            "    - {{secretName: {secret}, hosts: [{host}]}}\n"
        ));
    }
    more.push_str("  rules:\n");
    for (_, host) in &names[2..] {
        more.push_str(&format!(
            "    - host: {host}\n      http:\n        paths:\n          - path: /\n            \
             pathType: Prefix\n            backend: {{service: {{name: http-echo-offload, port: {{name: http}}}}}}\n"
        ));
    }
    h.write("more.yaml", &more);
    wait_until(
        APPLY_TIMEOUT,
        "offload-test-1..4.haproxy get their certificates",
        || (2..6).all(|i| served(names[i].1) == Some(fp(i))),
    );
    assert_eq!(
        h.reloads(),
        reloads,
        "certificates added without a reload\n{}",
        h.log()
    );
    // The Secret of offload-test.haproxy gets offload-test-4.haproxy's content.
    let mut changed = secrets;
    changed[1] = tls_secret(ns, "haproxy-offload-test", &certs[5].crt, &certs[5].key);
    h.write("secrets.yaml", &changed.join("---\n"));
    wait_until(APPLY_TIMEOUT, "the new content is served", || {
        served("offload-test.haproxy") == Some(fp(5))
    });
    assert_eq!(h.reloads(), reloads, "new content without a reload");
    // A reload keeps the new content.
    h.write("app.yaml", &app(&[("timeout-server", "30s")], &entries));
    wait_until(APPLY_TIMEOUT, "a reload", || h.reloads().0 > reloads.0);
    h.wait_old_workers_gone();
    assert_eq!(served("offload-test.haproxy"), Some(fp(5)));
    assert_eq!(served("offload-test-4.haproxy"), Some(fp(5)));
    assert_eq!(h.reloads().1, reloads.1, "no reload failed");
}
