//! End-to-end tests of the traffic-policy annotations (issue 8, part 1): cookie persistence,
//! rate limits and the PROXY protocol to the pods. The real `portcullis run` drives a real
//! HAProxy; requests go through it to loopback pods, with and without each annotation, and
//! with a bad value for it (reported, ignored, the rest still works).
//!
//! Every loop here is bounded in count and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::annotated;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use support::{
    APPLY_TIMEOUT, Answer, Harness, endpoint_slices, free_port, ingress, route, service,
    socket_command, wait_until,
};

const NS: &str = "shop";
const HOST: &str = "traffic.example.com";

/// An Ingress `name` routing `HOST` + `path` (Prefix) to `service`, with annotations.
fn path_ingress(name: &str, path: &str, service: &str, annotations: &[(&str, &str)]) -> String {
    let doc = ingress(
        NS,
        name,
        &[route(Some(HOST), path, "Prefix", service)],
        None,
        &[],
    );
    if annotations.is_empty() {
        doc
    } else {
        annotated(&doc, annotations)
    }
}

/// A Service whose pods are echo servers named `<service>-<i>`, one slice per pod.
fn echo_pods(h: &mut Harness, svc: &str, pods: usize, annotations: &[(&str, &str)]) -> String {
    let ports: Vec<(String, u16)> = (0..pods)
        .map(|i| {
            let name = format!("{svc}-{i}");
            let port = h.echo(&name);
            (name, port)
        })
        .collect();
    service_with_pods(svc, &ports, annotations)
}

fn service_with_pods(svc: &str, pods: &[(String, u16)], annotations: &[(&str, &str)]) -> String {
    let endpoints: Vec<(&str, u16, bool)> = pods
        .iter()
        .map(|(name, port)| (name.as_str(), *port, true))
        .collect();
    format!(
        "{}---\n{}",
        service(NS, svc, annotations),
        endpoint_slices(NS, svc, &endpoints)
    )
}

/// Whether some diagnostic line in the log holds all of `parts`.
fn log_has(h: &Harness, parts: &[&str]) -> bool {
    h.log()
        .lines()
        .any(|line| parts.iter().all(|p| line.contains(p)))
}

/// The error count of `portcullis_input_diagnostics`, and `/readyz`'s diagnostics count.
fn diagnostic_counts(h: &Harness) -> (f64, u64) {
    let errors = h.metric("portcullis_input_diagnostics{severity=\"error\"}");
    let (_, ready) = h.readyz().expect("/readyz answers");
    (errors, ready["diagnostics"].as_u64().unwrap_or(0))
}

// ---------------------------------------------------------------------------------------------
// Cookie persistence

/// `(cookie value, who answered)` of a request without a cookie: the cookie HAProxy inserts.
fn fresh_cookie(h: &Harness, path: &str, cookie: &str) -> (Option<String>, String) {
    let answer = h.get(HOST, path);
    (cookie_value(&answer, cookie), answer.who())
}

/// The value `answer` sets for cookie `name`.
fn cookie_value(answer: &Answer, name: &str) -> Option<String> {
    answer
        .headers
        .iter()
        .filter(|(n, _)| n == "set-cookie")
        .find_map(|(_, v)| {
            let first = v.split(';').next()?;
            let (n, value) = first.split_once('=')?;
            (n.trim() == name).then(|| value.trim().to_string())
        })
}

/// Each pod's cookie, learnt from requests without a cookie (round robin visits them all).
fn cookies_by_pod(h: &Harness, path: &str, cookie: &str, pods: usize) -> BTreeMap<String, String> {
    let mut seen = BTreeMap::new();
    for _ in 0..pods * 10 {
        let (value, who) = fresh_cookie(h, path, cookie);
        let value = value.unwrap_or_else(|| panic!("no {cookie} cookie from {who}\n{}", h.log()));
        if let Some(before) = seen.insert(who.clone(), value.clone()) {
            assert_eq!(before, value, "{who} was given two different cookies");
        }
        if seen.len() == pods {
            break;
        }
    }
    assert_eq!(seen.len(), pods, "not every pod answered: {seen:?}");
    seen
}

/// Who answers `n` requests carrying `cookie=value`.
fn pinned(h: &Harness, path: &str, cookie: &str, value: &str, n: usize) -> BTreeSet<String> {
    let header = format!("{cookie}={value}");
    (0..n)
        .map(|_| h.get_with(HOST, path, &[("Cookie", &header)]).who())
        .collect()
}

fn cookie_key_secret(key: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: cookie-key\n  namespace: ingress\n\
         stringData:\n  dynamic-cookie-key: {key}\n"
    )
}

#[test]
fn cookie_persistence_pins_clients_to_pods() {
    let mut h = Harness::new();
    h.write("key.yaml", &cookie_key_secret("first-key-0123456789"));
    let web_pods: Vec<(String, u16)> = (0..3)
        .map(|i| {
            let name = format!("web-{i}");
            let port = h.echo(&name);
            (name, port)
        })
        .collect();
    let dynamic = [("haproxy.org/cookie-persistence", "WEBSESSION")];
    h.write("web.yaml", &service_with_pods("web", &web_pods, &dynamic));
    let api = echo_pods(
        &mut h,
        "api",
        3,
        &[("haproxy.org/cookie-persistence-no-dynamic", "APISESSION")],
    );
    h.write("api.yaml", &api);
    let plain = echo_pods(&mut h, "plain", 2, &[]);
    h.write("plain.yaml", &plain);
    let bad = echo_pods(
        &mut h,
        "bad",
        2,
        &[("haproxy.org/cookie-persistence", "bad;name")],
    );
    h.write("bad.yaml", &bad);
    for (name, path, svc) in [
        ("web", "/web", "web"),
        ("api", "/api", "api"),
        ("plain", "/plain", "plain"),
        ("bad", "/bad", "bad"),
    ] {
        h.write(
            &format!("{name}-ing.yaml"),
            &path_ingress(name, path, svc, &[]),
        );
    }
    h.start(&["--dynamic-cookie-key-secret", "ingress/cookie-key"]);

    // Dynamic cookies: 16 hex digits (a hash of the pod's address and port with the key), one
    // per pod, and each pins its client to its pod.
    let web = cookies_by_pod(&h, "/web", "WEBSESSION", 3);
    let values: BTreeSet<&String> = web.values().collect();
    assert_eq!(values.len(), 3, "{web:?}");
    for (pod, value) in &web {
        assert!(
            value.len() == 16 && value.bytes().all(|b| b.is_ascii_hexdigit()),
            "{pod}: {value}"
        );
        assert_eq!(
            pinned(&h, "/web", "WEBSESSION", value, 12),
            BTreeSet::from([pod.clone()])
        );
    }

    // Static cookies: the server slot names, one per pod, pinning too.
    let api = cookies_by_pod(&h, "/api", "APISESSION", 3);
    for (pod, value) in &api {
        assert!(
            value
                .strip_prefix("SRV_")
                .is_some_and(|n| n.parse::<u32>().is_ok()),
            "{pod}: {value}"
        );
        assert_eq!(
            pinned(&h, "/api", "APISESSION", value, 12),
            BTreeSet::from([pod.clone()])
        );
    }
    assert_eq!(api.values().collect::<BTreeSet<_>>().len(), 3, "{api:?}");

    // Without the annotation: no cookie, and round robin spreads the requests.
    let answers: Vec<Answer> = (0..6).map(|_| h.get(HOST, "/plain")).collect();
    assert!(answers.iter().all(|a| a.header("set-cookie").is_none()));
    let spread: BTreeSet<String> = answers.iter().map(Answer::who).collect();
    assert_eq!(spread.len(), 2, "{spread:?}");

    // A bad cookie name: reported against the Service and its annotation, ignored; the
    // backend still serves, without a cookie.
    assert!(
        log_has(
            &h,
            &[
                "error: Service shop/bad",
                "annotation haproxy.org/cookie-persistence",
                "not a cookie name"
            ]
        ),
        "{}",
        h.log()
    );
    let (errors, count) = diagnostic_counts(&h);
    assert!(errors >= 1.0 && count >= 1, "{errors} {count}");
    let answer = h.get(HOST, "/bad");
    assert!(answer.who().starts_with("bad-"), "{answer:?}");
    assert!(answer.header("set-cookie").is_none(), "{answer:?}");

    // A fourth pod comes without a reload; the dynamic cookies of the others still pin them.
    let reloads = h.reloads().0;
    let name = "web-3".to_string();
    let port = h.echo(&name);
    let mut four = web_pods;
    four.push((name, port));
    h.write("web.yaml", &service_with_pods("web", &four, &dynamic));
    wait_until(APPLY_TIMEOUT, "the fourth pod answers", || {
        (0..8).any(|_| h.get(HOST, "/web").who() == "web-3")
    });
    assert_eq!(h.reloads().0, reloads, "scaling up reloaded");
    for (pod, value) in &web {
        assert_eq!(
            pinned(&h, "/web", "WEBSESSION", value, 8),
            BTreeSet::from([pod.clone()])
        );
    }
    // The added pod has a dynamic cookie of its own, which pins its clients too.
    let four = cookies_by_pod(&h, "/web", "WEBSESSION", 4);
    let added = &four["web-3"];
    assert!(
        added.len() == 16 && added.bytes().all(|b| b.is_ascii_hexdigit()),
        "web-3 (added at run time) got the cookie {added:?}"
    );
    assert_eq!(
        pinned(&h, "/web", "WEBSESSION", added, 8),
        BTreeSet::from(["web-3".to_string()])
    );

    // A new key in the Secret gives every pod a new cookie: the value is the key's hash.
    h.write("key.yaml", &cookie_key_secret("second-key-9876543210"));
    wait_until(APPLY_TIMEOUT, "the new key is in force", || {
        let (value, who) = fresh_cookie(&h, "/web", "WEBSESSION");
        web.get(&who)
            .is_some_and(|old| value.as_ref().is_some_and(|v| v != old))
    });
    h.wait_old_workers_gone();
    let rotated = cookies_by_pod(&h, "/web", "WEBSESSION", 4);
    for (pod, value) in &web {
        assert_ne!(rotated.get(pod), Some(value), "{pod} kept its cookie");
    }
    // Slot-name cookies do not depend on the key.
    assert_eq!(cookies_by_pod(&h, "/api", "APISESSION", 3), api);
}

// ---------------------------------------------------------------------------------------------
// Rate limits

/// The flags of the peers section (`show peers`), if it has one.
fn peers_flags(h: &Harness) -> Option<u32> {
    let text = socket_command(&h.runtime_dir().join("admin.sock"), "show peers\n").ok()?;
    let first = text.lines().find(|l| l.contains("id=localinstance"))?;
    let hex = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("flags=0x"))?;
    u32::from_str_radix(hex, 16).ok()
}

/// The statuses of `n` requests in a row.
fn statuses(h: &Harness, path: &str, n: usize) -> Vec<u16> {
    (0..n).map(|_| h.get(HOST, path).status).collect()
}

#[test]
fn rate_limits_refuse_requests_past_the_limit() {
    let mut h = Harness::new();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    let limited = [
        ("haproxy.org/rate-limit-requests", "10"),
        ("haproxy.org/rate-limit-period", "1m"),
        ("haproxy.org/rate-limit-size", "1k"),
        ("haproxy.org/rate-limit-status-code", "429"),
    ];
    let ingresses = [
        ("open", "/open", vec![]),
        ("limited", "/limited", limited.to_vec()),
        (
            "whitelisted",
            "/whitelisted",
            vec![
                ("haproxy.org/rate-limit-requests", "10"),
                ("haproxy.org/rate-limit-period", "1m"),
                (
                    "haproxy.org/rate-limit-whitelist",
                    "10.0.0.0/8, 127.0.0.0/8",
                ),
            ],
        ),
        (
            "default-code",
            "/default-code",
            vec![
                ("haproxy.org/rate-limit-requests", "2"),
                ("haproxy.org/rate-limit-period", "1m"),
            ],
        ),
        (
            "window",
            "/window",
            vec![
                ("haproxy.org/rate-limit-requests", "3"),
                ("haproxy.org/rate-limit-period", "2s"),
                ("haproxy.org/rate-limit-status-code", "503"),
            ],
        ),
        // Bad values: a limit that is not a number (no limit at all), and a status code
        // HAProxy cannot refuse with (the limit applies with the default 403).
        (
            "bad-requests",
            "/bad-requests",
            vec![("haproxy.org/rate-limit-requests", "ten")],
        ),
        (
            "bad-code",
            "/bad-code",
            vec![
                ("haproxy.org/rate-limit-requests", "5"),
                ("haproxy.org/rate-limit-period", "1m"),
                ("haproxy.org/rate-limit-status-code", "418"),
            ],
        ),
    ];
    for (name, path, annotations) in &ingresses {
        h.write(
            &format!("{name}.yaml"),
            &path_ingress(name, path, "web", annotations),
        );
    }
    // This replica knows its pod, so the tables are in `peers localinstance`: the counts are
    // shared with the other replicas (none here) and survive a reload.
    let peer_port = free_port().to_string();
    h.start(&[
        "--pod-name",
        "portcullis-0",
        "--pod-ip",
        "127.0.0.1",
        "--localpeer-port",
        &peer_port,
    ]);

    // Without the annotation nothing is limited.
    assert!(statuses(&h, "/open", 30).iter().all(|s| *s == 200));

    // The eleventh request in the period gets the configured status, and so do the next.
    let started = Instant::now();
    let got = statuses(&h, "/limited", 12);
    assert!(started.elapsed() < Duration::from_secs(50), "too slow");
    assert_eq!(got, [vec![200; 10], vec![429; 2]].concat());
    // Only this Ingress' routes are limited.
    assert!(statuses(&h, "/open", 5).iter().all(|s| *s == 200));

    // A whitelisted client is never limited.
    assert!(statuses(&h, "/whitelisted", 30).iter().all(|s| *s == 200));

    // The default status is 403, as in the incumbent controller.
    assert_eq!(statuses(&h, "/default-code", 3), [200, 200, 403]);

    // The count is over the period: after it (two periods: the rate is smoothed over the
    // previous one) the client is served again.
    assert_eq!(statuses(&h, "/window", 4), [200, 200, 200, 503]);
    std::thread::sleep(Duration::from_millis(4_500));
    assert_eq!(statuses(&h, "/window", 1), [200]);

    // Bad values are reported against the Ingress and the annotation, and ignored.
    for (ingress, annotation) in [
        ("bad-requests", "rate-limit-requests"),
        ("bad-code", "rate-limit-status-code"),
    ] {
        assert!(
            log_has(
                &h,
                &[
                    &format!("error: Ingress shop/{ingress}"),
                    &format!("annotation haproxy.org/{annotation}")
                ]
            ),
            "no diagnostic for {ingress}\n{}",
            h.log()
        );
    }
    let (errors, count) = diagnostic_counts(&h);
    assert!(errors >= 2.0 && count >= 2, "{errors} {count}");
    assert!(statuses(&h, "/bad-requests", 30).iter().all(|s| *s == 200));
    assert_eq!(
        statuses(&h, "/bad-code", 7),
        [vec![200; 5], vec![403; 2]].concat()
    );

    // A reload (a new Service) keeps the counts: the old process hands its tables to the new
    // one through the local peer.
    // HAProxy hands its tables over only once its own initial resync is over (at most 5 s
    // after a cold start, with no other peer to learn from).
    wait_until(
        Duration::from_secs(20),
        "the peers resync is finished",
        || peers_flags(&h).is_some_and(|f| f & 0x3 == 0x3),
    );
    let reloads = h.reloads().0;
    let later = h.backend(NS, "later");
    h.write("later-svc.yaml", &later);
    h.write("later.yaml", &path_ingress("later", "/later", "later", &[]));
    wait_until(APPLY_TIMEOUT, "the new Ingress is served", || {
        h.get(HOST, "/later").status == 200
    });
    h.wait_old_workers_gone();
    assert!(h.reloads().0 > reloads, "adding a Service did not reload");
    assert_eq!(statuses(&h, "/limited", 2), [429, 429]);
    assert_eq!(statuses(&h, "/default-code", 1), [403]);
}

// ---------------------------------------------------------------------------------------------
// PROXY protocol

/// A pod that reads an optional PROXY protocol header (v1 or v2) before the HTTP request and
/// answers `<name> <what it saw>`: `v1 PROXY TCP4 ...`, `v2 <src> <dst>` or `none`.
#[derive(Debug)]
struct ProxyPod {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The v2 signature.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// How long a pod thread lives at most, whatever the test does.
const POD_LIFETIME: Duration = Duration::from_secs(300);

impl ProxyPod {
    fn spawn(name: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding a pod");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().expect("an address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let name = name.to_string();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            while !flag.load(Ordering::Relaxed) && started.elapsed() < POD_LIFETIME {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let name = name.clone();
                        std::thread::spawn(move || serve_proxy_connection(stream, &name));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        Self {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for ProxyPod {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the start of a connection says: the PROXY header seen (if any) and how many bytes it
/// took; `None` while more bytes are needed.
fn proxy_header(buf: &[u8]) -> Option<(String, usize)> {
    if buf.starts_with(b"PROXY ") {
        let end = buf.windows(2).position(|w| w == b"\r\n")?;
        let line = String::from_utf8_lossy(&buf[..end]).into_owned();
        return Some((format!("v1 {line}"), end + 2));
    }
    if buf.len() < V2_SIGNATURE.len() && V2_SIGNATURE.starts_with(buf) {
        return None;
    }
    if !buf.starts_with(V2_SIGNATURE) {
        return Some(("none".to_string(), 0));
    }
    let head = buf.get(..16)?;
    let len = usize::from(u16::from_be_bytes([head[14], head[15]]));
    let body = buf.get(16..16 + len)?;
    let what = match (head[12], head[13]) {
        // Version 2, PROXY command; TCP over IPv4.
        (0x21, 0x11) if body.len() >= 12 => {
            let ip = |b: &[u8]| format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3]);
            let port = |b: &[u8]| u16::from_be_bytes([b[0], b[1]]);
            format!(
                "v2 {}:{} {}:{}",
                ip(&body[0..4]),
                port(&body[8..10]),
                ip(&body[4..8]),
                port(&body[10..12])
            )
        }
        (cmd, family) => format!("v2 command {cmd:#x} family {family:#x}"),
    };
    Some((what, 16 + len))
}

fn serve_proxy_connection(mut stream: TcpStream, name: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut header = None;
    for _ in 0..1000 {
        if header.is_none() {
            header = proxy_header(&buf);
        }
        if let Some((_, used)) = &header {
            if buf[*used..].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        match stream.read(&mut chunk) {
            // A health check closes without a request.
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 * 1024 {
            return;
        }
    }
    let Some((what, _)) = header else { return };
    let body = format!("{name} {what}\n");
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes());
}

/// A GET through HAProxy's HTTP frontend on a connection of our own: `(the answer, our source
/// port)`.
fn get_from(h: &Harness, path: &str) -> (Answer, u16) {
    get_on(h.http_port, path)
}

/// A GET to `127.0.0.1:port` on a connection of our own: `(the answer, our source port)`.
fn get_on(port: u16, path: &str) -> (Answer, u16) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a read timeout");
    let port = stream.local_addr().expect("a local address").port();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("sending");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("unparsable answer {text:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let answer = Answer {
        status,
        headers: Vec::new(),
        body: body.to_string(),
    };
    (answer, port)
}

#[test]
fn send_proxy_protocol_reaches_the_pods() {
    let mut h = Harness::new();
    let v1 = ProxyPod::spawn("v1pod");
    let v2 = ProxyPod::spawn("v2pod");
    let plain = ProxyPod::spawn("plainpod");
    let pod = |name: &str, port: u16| vec![(name.to_string(), port)];
    h.write(
        "v1.yaml",
        &service_with_pods(
            "v1",
            &pod("v1pod", v1.port),
            &[("haproxy.org/send-proxy-protocol", "proxy")],
        ),
    );
    h.write(
        "v2.yaml",
        &service_with_pods("v2", &pod("v2pod", v2.port), &[]),
    );
    h.write(
        "plain.yaml",
        &service_with_pods("plain", &pod("plainpod", plain.port), &[]),
    );
    // A bad value: the echo pod would refuse a PROXY header with a 400.
    let bad = echo_pods(
        &mut h,
        "bad",
        1,
        &[("haproxy.org/send-proxy-protocol", "proxy-v3")],
    );
    h.write("bad.yaml", &bad);
    h.write("v1-ing.yaml", &path_ingress("v1", "/v1", "v1", &[]));
    // Backend scope: read from the Ingress routing to the Service, too.
    h.write(
        "v2-ing.yaml",
        &path_ingress(
            "v2",
            "/v2",
            "v2",
            &[("haproxy.org/send-proxy-protocol", "proxy-v2")],
        ),
    );
    h.write(
        "plain-ing.yaml",
        &path_ingress("plain", "/plain", "plain", &[]),
    );
    h.write("bad-ing.yaml", &path_ingress("bad", "/bad", "bad", &[]));
    // A TCP frontend to the v1 Service: the annotation applies to its TCP backend too.
    let tcp_port = free_port();
    h.write(
        "tcp.yaml",
        &format!(
            "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  name: raw\n  \
             namespace: {NS}\n  annotations: {{ingress.class: portcullis}}\nspec:\n  \
             - name: raw\n    frontend:\n      name: raw\n      binds:\n        \
             - {{name: plain, address: 127.0.0.1, port: {tcp_port}}}\n    \
             service: {{name: v1, port: 80}}\n"
        ),
    );
    h.start(&[]);

    // v1: the pod reads the client's own address and port, and HAProxy's.
    let (answer, client_port) = get_from(&h, "/v1");
    assert_eq!(answer.status, 200, "{answer:?}\n{}", h.log());
    let want = format!(
        "v1pod v1 PROXY TCP4 127.0.0.1 127.0.0.1 {client_port} {}\n",
        h.http_port
    );
    assert_eq!(answer.body, want);

    // The same through the TCP frontend: HAProxy's address is the TCP port's.
    let (answer, client_port) = get_on(tcp_port, "/raw");
    assert_eq!(
        answer.body,
        format!("v1pod v1 PROXY TCP4 127.0.0.1 127.0.0.1 {client_port} {tcp_port}\n")
    );

    // v2, set on the Ingress.
    let (answer, client_port) = get_from(&h, "/v2");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.body,
        format!(
            "v2pod v2 127.0.0.1:{client_port} 127.0.0.1:{}\n",
            h.http_port
        )
    );

    // Without the annotation the request comes bare.
    let (answer, _) = get_from(&h, "/plain");
    assert_eq!(answer.body, "plainpod none\n");

    // A bad value is reported and ignored: the echo pod gets plain HTTP and answers.
    assert!(
        log_has(
            &h,
            &[
                "error: Service shop/bad",
                "annotation haproxy.org/send-proxy-protocol",
                "proxy-v3"
            ]
        ),
        "{}",
        h.log()
    );
    let (errors, count) = diagnostic_counts(&h);
    assert!(errors >= 1.0 && count >= 1, "{errors} {count}");
    assert_eq!(h.who(HOST, "/bad"), "bad-0");
}
