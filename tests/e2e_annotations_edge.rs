//! End-to-end tests of the edge annotations (basic authentication, CORS, HSTS and
//! `X-Forwarded-Proto`): the real `portcullis run` drives a real HAProxy, and real HTTP requests
//! show what a client and a pod see with and without each annotation, and that a bad value is
//! reported while the rest keeps working.
//!
//! Every test has its own ports, directories and processes, so they run in parallel. Every loop
//! and wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::annotated;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{
    APPLY_TIMEOUT, Harness, endpoint_slices, https_get, ingress, poll, route, self_signed, service,
    tls_secret, wait_until,
};

const NS: &str = "shop";
const IO_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Manifests

/// An Ingress `name` routing `host` `/` to Service `service`, with annotations.
fn site(name: &str, host: &str, service: &str, annotations: &[(&str, &str)]) -> String {
    let doc = ingress(
        NS,
        name,
        &[route(Some(host), "/", "Prefix", service)],
        None,
        &[],
    );
    if annotations.is_empty() {
        doc
    } else {
        annotated(&doc, annotations)
    }
}

/// An Opaque Secret with these `stringData` entries.
fn secret(name: &str, entries: &[(&str, &str)]) -> String {
    let mut out = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {NS}\ntype: Opaque\nstringData:\n"
    );
    for (k, v) in entries {
        out.push_str(&format!("  {k}: {v:?}\n"));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// An answer: status, headers (names lowercased, in order) and body.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// One request on a fresh connection (`Connection: close`) to HAProxy's HTTP frontend.
fn request(h: &Harness, method: &str, host: &str, path: &str, extra: &[(&str, &str)]) -> Reply {
    let addr = SocketAddr::from(([127, 0, 0, 1], h.http_port));
    try_request(addr, method, host, path, extra)
        .unwrap_or_else(|e| panic!("{method} http://{host}{path} failed: {e}\n{}", h.log()))
}

fn try_request(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    extra: &[(&str, &str)],
) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Reply {
        status,
        headers,
        body: body.to_string(),
    })
}

/// `Authorization: Basic ...` for `user:password`.
fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        support::base64(format!("{user}:{password}").as_bytes())
    )
}

// ---------------------------------------------------------------------------------------------
// A pod that records what reaches it

/// A loopback HTTP server that records the request line of every request it gets and answers
/// `200 recorder <request line>`. Connections that send nothing (TCP health checks) are not
/// recorded. It stops when dropped.
#[derive(Debug)]
struct RecordingPod {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl RecordingPod {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().expect("an address").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            // Bounded: about ten minutes of idle polling at most.
            for _ in 0..600_000 {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                match listener.accept() {
                    Ok((stream, _)) => {
                        let seen = seen2.clone();
                        std::thread::spawn(move || serve_one(stream, &seen));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Self { port, seen, stop }
    }

    /// The request lines seen so far.
    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A Service `name` whose one endpoint is this pod.
    fn service(&self, name: &str) -> String {
        format!(
            "{}---\n{}",
            service(NS, name, &[]),
            endpoint_slices(NS, name, &[("0", self.port, true)])
        )
    }
}

impl Drop for RecordingPod {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve_one(mut stream: TcpStream, seen: &Mutex<Vec<String>>) {
    if stream.set_nonblocking(false).is_err() || stream.set_read_timeout(Some(IO_TIMEOUT)).is_err()
    {
        return;
    }
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    // Bounded: at most 16 KiB of head.
    for _ in 0..4 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let Some(line) = text.lines().next().filter(|l| !l.is_empty()) else {
        return;
    };
    let line = line.to_string();
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(line.clone());
    let body = format!("recorder {line}");
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes());
}

// ---------------------------------------------------------------------------------------------
// Diagnostics

/// Waits until `portcullis run` has logged a diagnostic containing every one of `parts`.
fn wait_for_diagnostic(h: &Harness, parts: &[&str]) {
    wait_until(
        APPLY_TIMEOUT,
        &format!("a diagnostic with {parts:?}"),
        || h.log().lines().any(|l| parts.iter().all(|p| l.contains(p))),
    );
}

// ---------------------------------------------------------------------------------------------
// Basic authentication

/// Users of the `creds` Secret, with their passwords: one per accepted crypt(3) scheme.
const USERS: &[(&str, &str, &str)] = &[
    (
        "alice",
        "alice-pw",
        "$6$aliceSalt$X2b53EFzySBqhWCVNZEEZXodjGcJirtaxIv/ymrKDCfnlKTKkuvMYzGHCmuEHx5gSzlQC16EMBOdofzP3q01U1",
    ),
    (
        "bob",
        "bob-pw",
        "$2y$05$bobbobbobbobbobbobbobu8bcX0qdbFERObRmMPfdv9EJc5Iht9Hi",
    ),
    (
        "grace",
        "grace-pw",
        "$2b$05$gracegracegracegraceg.yIekJDm4IdPR4Sot0q.mAaZBlGQQdbm",
    ),
    (
        "dave",
        "dave-pw",
        "$y$j9T$F5Jx5fExrKuPp53xLKQ..1$wAfDpu8wV6TrqRh6kNE13avyKIoIJavt6efEtNirXLA",
    ),
    ("erin", "erin-pw", "$1$erinsalt$.NKQEemjAnBemnhxO8kSk/"),
    (
        "frank",
        "frank-pw",
        "$5$rounds=5000$franksalt$l//PjMkyS8JLnmiCK./kmq8vd2R/NQ3ViW4B.7raCR3",
    ),
    ("heidi", "heidi-pw", "hdLhgkDIDCglA"),
];

fn creds_secret() -> String {
    let mut entries: Vec<(&str, &str)> = USERS.iter().map(|(u, _, hash)| (*u, *hash)).collect();
    // Apache's $apr1$ (htpasswd -m) is not a crypt(3) scheme; a plain-text password is refused.
    entries.push(("carol", "$apr1$carolsal$QeN3z6Y1b8Yz6x1Yy0Qy0."));
    entries.push(("mallory", "mallory-pw"));
    secret("creds", &entries)
}

#[test]
fn basic_auth_lets_in_the_users_of_the_secret_only() {
    let mut h = Harness::new();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    h.write("creds.yaml", &creds_secret());
    let auth = |realm: &str| {
        vec![
            ("haproxy.org/auth-type", "basic-auth".to_string()),
            ("haproxy.org/auth-secret", "creds".to_string()),
            ("haproxy.org/auth-realm", realm.to_string()),
        ]
    };
    let write_site = |h: &Harness, name: &str, annotations: &[(&str, String)]| {
        let refs: Vec<(&str, &str)> = annotations.iter().map(|(k, v)| (*k, v.as_str())).collect();
        h.write(
            &format!("{name}.yaml"),
            &site(name, &format!("{name}.example.com"), "web", &refs),
        );
    };
    write_site(&h, "private", &auth("Admin Area"));
    // The same Service without authentication through another Ingress.
    write_site(&h, "public", &[]);
    // A realm with quotes is refused: the default realm is used.
    write_site(&h, "quoted", &auth("Say \"hi\""));
    // Misconfigured authentication fails closed: nobody logs in.
    write_site(
        &h,
        "badtype",
        &[
            ("haproxy.org/auth-type", "digest".to_string()),
            ("haproxy.org/auth-secret", "creds".to_string()),
        ],
    );
    write_site(
        &h,
        "nosecret",
        &[
            ("haproxy.org/auth-type", "basic-auth".to_string()),
            ("haproxy.org/auth-secret", "later".to_string()),
        ],
    );
    h.start(&[]);

    // Without credentials, or with wrong ones: 401 and the realm, from HAProxy.
    let anonymous = request(&h, "GET", "private.example.com", "/", &[]);
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert_eq!(
        anonymous.header("www-authenticate"),
        Some("Basic realm=\"Admin Area\""),
        "{anonymous:?}"
    );
    assert!(!anonymous.body.starts_with("web"), "{anonymous:?}");
    let wrong = request(
        &h,
        "GET",
        "private.example.com",
        "/",
        &[("Authorization", &basic("alice", "bob-pw"))],
    );
    assert_eq!(wrong.status, 401, "{wrong:?}");

    // Every scheme HAProxy's crypt(3) checks here lets its user in, to the pod.
    for (user, password, _) in USERS {
        let answer = request(
            &h,
            "GET",
            "private.example.com",
            "/",
            &[("Authorization", &basic(user, password))],
        );
        assert_eq!(answer.status, 200, "{user}: {answer:?}");
        assert!(answer.body.starts_with("web "), "{user}: {answer:?}");
    }

    // The bad entries are reported against the Secret, without their value, and skipped.
    for (user, password) in [("carol", "carol-pw"), ("mallory", "mallory-pw")] {
        let answer = request(
            &h,
            "GET",
            "private.example.com",
            "/",
            &[("Authorization", &basic(user, password))],
        );
        assert_eq!(answer.status, 401, "{user}: {answer:?}");
    }
    wait_for_diagnostic(
        &h,
        &["Secret shop/creds", "data.carol", "$apr1$", "skipped"],
    );
    wait_for_diagnostic(&h, &["Secret shop/creds", "data.mallory", "plain-text"]);
    assert!(
        !h.log().contains("mallory-pw"),
        "a password reached the log"
    );
    wait_for_diagnostic(&h, &["Secret shop/creds", "data.heidi", "DES"]);

    // Other routes to the same pods are not affected.
    let public = request(&h, "GET", "public.example.com", "/", &[]);
    assert_eq!(public.status, 200, "{public:?}");

    // A bad realm: reported, the default realm is used, authentication still works.
    wait_for_diagnostic(&h, &["Ingress shop/quoted", "haproxy.org/auth-realm"]);
    let quoted = request(&h, "GET", "quoted.example.com", "/", &[]);
    assert_eq!(
        quoted.header("www-authenticate"),
        Some("Basic realm=\"Protected Content\""),
        "{quoted:?}"
    );
    let alice = [("Authorization", basic("alice", "alice-pw"))];
    let alice: Vec<(&str, &str)> = alice.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(
        request(&h, "GET", "quoted.example.com", "/", &alice).status,
        200
    );

    // A bad auth-type and a missing Secret: reported, and nobody gets in.
    wait_for_diagnostic(&h, &["Ingress shop/badtype", "haproxy.org/auth-type"]);
    wait_for_diagnostic(
        &h,
        &["Ingress shop/nosecret", "Secret shop/later does not exist"],
    );
    for host in ["badtype.example.com", "nosecret.example.com"] {
        assert_eq!(request(&h, "GET", host, "/", &alice).status, 401, "{host}");
    }
    assert!(h.metric("portcullis_input_diagnostics{severity=\"error\"}") >= 5.0);

    // When the Secret appears, its users get in.
    h.write("later.yaml", &secret("later", &[("alice", USERS[0].2)]));
    wait_until(
        APPLY_TIMEOUT,
        "alice gets in once the Secret exists",
        || request(&h, "GET", "nosecret.example.com", "/", &alice).status == 200,
    );
    assert_eq!(
        request(&h, "GET", "nosecret.example.com", "/", &[]).status,
        401
    );

    // Neither the log (reload reasons name the first changed line), /readyz nor the admin
    // endpoint's debug pages show the hashes.
    let readyz = h
        .readyz()
        .map(|(_, json)| json.to_string())
        .unwrap_or_default();
    wait_until(
        APPLY_TIMEOUT,
        "the reload reason names the new user, redacted",
        || h.log().contains("user alice password '(redacted)'"),
    );
    for (_, _, hash) in USERS {
        assert!(!h.log().contains(hash), "the log shows a hash");
        assert!(!readyz.contains(hash), "/readyz shows a hash");
    }
    let config = h
        .admin("/debug/config")
        .expect("the admin endpoint answers");
    assert!(
        config.body.contains("userlist auth_shop_creds"),
        "{}",
        config.body
    );
    let model = h.admin("/debug/model").expect("the admin endpoint answers");
    for (_, _, hash) in USERS {
        assert!(!config.body.contains(hash), "/debug/config shows a hash");
        assert!(!model.body.contains(hash), "/debug/model shows a hash");
    }
}

// ---------------------------------------------------------------------------------------------
// CORS

#[test]
fn cors_preflight_is_answered_by_haproxy_and_allowed_origins_get_the_headers() {
    let mut h = Harness::new();
    let pod = RecordingPod::start();
    h.write("api.yaml", &pod.service("api"));
    h.write(
        "list.yaml",
        &site(
            "list",
            "list.example.com",
            "api",
            &[
                ("haproxy.org/cors-enable", "true"),
                (
                    "haproxy.org/cors-allow-origin",
                    "https://app.example.com, https://admin.example.com:8443",
                ),
                ("haproxy.org/cors-allow-methods", "get, POST,PUT"),
                (
                    "haproxy.org/cors-allow-headers",
                    "Content-Type, X-Request-Id",
                ),
                ("haproxy.org/cors-allow-credentials", "true"),
                ("haproxy.org/cors-max-age", "10m"),
            ],
        ),
    );
    h.write(
        "regex.yaml",
        &site(
            "regex",
            "regex.example.com",
            "api",
            &[
                ("haproxy.org/cors-enable", "true"),
                (
                    "haproxy.org/cors-allow-origin",
                    r"^https://([a-z0-9-]+\.)?example\.org(:[0-9]{1,5})?$",
                ),
                // A bad max age: reported, the default (5s) applies.
                ("haproxy.org/cors-max-age", "soon"),
            ],
        ),
    );
    h.write(
        "any.yaml",
        &site(
            "any",
            "any.example.com",
            "api",
            &[("haproxy.org/cors-enable", "true")],
        ),
    );
    // An origin with a path is not an origin: reported, and CORS stays off on this Ingress
    // rather than allowing every origin.
    h.write(
        "broken.yaml",
        &site(
            "broken",
            "broken.example.com",
            "api",
            &[
                ("haproxy.org/cors-enable", "true"),
                ("haproxy.org/cors-allow-origin", "https://app.example.com/"),
            ],
        ),
    );
    h.write(
        "plain.yaml",
        &site("plain", "plain.example.com", "api", &[]),
    );
    h.start(&[]);

    let preflight = |host: &str, origin: &str| {
        request(
            &h,
            "OPTIONS",
            host,
            "/items",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "PUT"),
                ("Access-Control-Request-Headers", "content-type"),
            ],
        )
    };
    let options_seen = || {
        pod.seen()
            .iter()
            .filter(|l| l.starts_with("OPTIONS"))
            .count()
    };

    // A preflight from an allowed origin: HAProxy answers with the configured headers.
    let answer = preflight("list.example.com", "https://admin.example.com:8443");
    assert_eq!(answer.status, 204, "{answer:?}");
    assert_eq!(
        answer.header("access-control-allow-origin"),
        Some("https://admin.example.com:8443"),
        "{answer:?}"
    );
    assert_eq!(
        answer.header("access-control-allow-methods"),
        Some("GET, POST, PUT")
    );
    assert_eq!(
        answer.header("access-control-allow-headers"),
        Some("Content-Type, X-Request-Id")
    );
    assert_eq!(answer.header("access-control-max-age"), Some("600"));
    assert_eq!(
        answer.header("access-control-allow-credentials"),
        Some("true")
    );
    assert!(
        answer.headers_named("vary").contains(&"Origin"),
        "{answer:?}"
    );
    let regex = preflight("regex.example.com", "https://shop.example.org");
    assert_eq!(regex.status, 204, "{regex:?}");
    assert_eq!(regex.header("access-control-max-age"), Some("5"));
    let any = preflight("any.example.com", "https://anyone.example.net");
    assert_eq!(any.status, 204, "{any:?}");
    assert_eq!(any.header("access-control-allow-origin"), Some("*"));
    assert_eq!(
        options_seen(),
        0,
        "the pod saw a preflight: {:?}",
        pod.seen()
    );

    // A simple request from an allowed origin reaches the pod and gets the headers back.
    let simple = request(
        &h,
        "GET",
        "list.example.com",
        "/items",
        &[("Origin", "https://app.example.com")],
    );
    assert_eq!(simple.status, 200, "{simple:?}");
    assert!(simple.body.starts_with("recorder GET /items"), "{simple:?}");
    assert_eq!(
        simple.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(
        simple.header("access-control-allow-credentials"),
        Some("true")
    );

    // Other origins get no CORS headers, and their preflights are not answered by HAProxy.
    for (host, origin) in [
        ("list.example.com", "https://evil.example.net"),
        // An exact origin is not a pattern: no suffix tricks.
        ("list.example.com", "https://app.example.com.evil.net"),
        // The regex is anchored at both ends.
        ("regex.example.com", "https://example.org.evil.net"),
        ("regex.example.com", "http://shop.example.org"),
    ] {
        let answer = request(&h, "GET", host, "/items", &[("Origin", origin)]);
        assert_eq!(answer.status, 200, "{host} {origin}: {answer:?}");
        assert_eq!(
            answer.header("access-control-allow-origin"),
            None,
            "{host} {origin}: {answer:?}"
        );
    }
    let refused = preflight("list.example.com", "https://evil.example.net");
    assert_eq!(refused.status, 200, "{refused:?}");
    assert!(refused.body.starts_with("recorder OPTIONS"), "{refused:?}");
    assert_eq!(refused.header("access-control-allow-origin"), None);

    // Without cors-enable nothing changes.
    let plain = preflight("plain.example.com", "https://app.example.com");
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(plain.header("access-control-allow-origin"), None);

    // The bad values: reported against the Ingress and the annotation.
    wait_for_diagnostic(
        &h,
        &["Ingress shop/broken", "haproxy.org/cors-allow-origin"],
    );
    wait_for_diagnostic(&h, &["Ingress shop/broken", "CORS stays off"]);
    wait_for_diagnostic(&h, &["Ingress shop/regex", "haproxy.org/cors-max-age"]);
    let broken = request(
        &h,
        "GET",
        "broken.example.com",
        "/",
        &[("Origin", "https://app.example.com")],
    );
    assert_eq!(broken.status, 200, "{broken:?}");
    assert_eq!(broken.header("access-control-allow-origin"), None);
}

// ---------------------------------------------------------------------------------------------
// HSTS and X-Forwarded-Proto

#[test]
fn hsts_only_over_https_and_forwarded_proto_cannot_be_spoofed() {
    let mut h = Harness::new();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    let host = "secure.example.com";
    let (crt, key) = self_signed(&h.work(), host, "secure");
    h.write("tls.yaml", &tls_secret(NS, "tls", &crt, &key));
    let tls_site = |name: &str, host: &str, annotations: &[(&str, &str)]| {
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
        "secure.yaml",
        &tls_site(
            "secure",
            host,
            &[
                ("haproxy.org/ssl-redirect", "false"),
                ("haproxy.org/hsts", "true"),
                ("haproxy.org/hsts-include-subdomains", "true"),
            ],
        ),
    );
    // A bad max age: reported, the default applies.
    h.write(
        "other.yaml",
        &tls_site(
            "other",
            "other.example.com",
            &[
                ("haproxy.org/ssl-redirect", "false"),
                ("haproxy.org/hsts", "true"),
                ("haproxy.org/hsts-max-age", "a year"),
            ],
        ),
    );
    // Authentication that lets nobody in: HAProxy's own 401 carries the header too.
    h.write(
        "locked.yaml",
        &tls_site(
            "locked",
            "locked.example.com",
            &[
                ("haproxy.org/ssl-redirect", "false"),
                ("haproxy.org/hsts", "true"),
                ("haproxy.org/auth-type", "basic-auth"),
            ],
        ),
    );
    h.start(&[]);

    let https = |host: &str| {
        poll(APPLY_TIMEOUT, || {
            https_get(h.https_port, host, host, "/").filter(|a| a.status == 200)
        })
        .unwrap_or_else(|| panic!("no 200 over HTTPS for {host}\n{}", h.log()))
    };
    let secure = https(host);
    assert_eq!(
        secure.header("strict-transport-security"),
        Some("max-age=31536000; includeSubDomains"),
        "{secure:?}"
    );
    assert!(
        secure.body.contains("x-forwarded-proto: https"),
        "{secure:?}"
    );
    let other = https("other.example.com");
    assert_eq!(
        other.header("strict-transport-security"),
        Some("max-age=31536000")
    );
    wait_for_diagnostic(&h, &["Ingress shop/other", "haproxy.org/hsts-max-age"]);
    let locked = https_get(
        h.https_port,
        "locked.example.com",
        "locked.example.com",
        "/",
    )
    .unwrap_or_else(|| panic!("no answer over HTTPS\n{}", h.log()));
    assert_eq!(locked.status, 401, "{locked:?}");
    assert_eq!(
        locked.header("strict-transport-security"),
        Some("max-age=31536000"),
        "{locked:?}"
    );

    // Plain HTTP: no HSTS (RFC 6797), and a client cannot claim it came over HTTPS.
    let plain = request(&h, "GET", host, "/", &[("X-Forwarded-Proto", "https")]);
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(plain.header("strict-transport-security"), None);
    let forwarded: Vec<&str> = plain
        .body
        .lines()
        .filter(|l| l.starts_with("x-forwarded-proto:"))
        .collect();
    assert_eq!(forwarded, ["x-forwarded-proto: http"], "{plain:?}");
}
