//! End-to-end tests of dynamic servers on a real HAProxy: a backend holds only its endpoints'
//! servers, added (`add server`) and deleted (`del server`, after a drain) at run time, and
//! scaling from none to many and back never reloads. The reload counter is the master CLI's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::{APPLY_TIMEOUT, Harness, endpoint_slices, ingress, poll, route, service, wait_until};

const NS: &str = "shop";
const HOST: &str = "web.example.com";
const BACKEND: &str = "shop_web_80";

/// The Ingress routing [`HOST`] to Service `web`.
fn web_ingress() -> String {
    ingress(
        NS,
        "web",
        &[route(Some(HOST), "/", "Prefix", "web")],
        None,
        &[],
    )
}

/// One server of `show servers state <backend>`: (id, name, port, admin state).
fn servers(h: &Harness, backend: &str) -> Vec<(u32, String, u16, u32)> {
    let text = h.runtime(&format!("show servers state {backend}\n"));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 19 {
                return None;
            }
            Some((
                f[2].parse().ok()?,
                f[3].to_string(),
                f[18].parse().ok()?,
                f[6].parse().ok()?,
            ))
        })
        .collect()
}

/// Waits until round robin over `requests` requests shows exactly `want` and stays so.
fn wait_answering(h: &Harness, want: &BTreeSet<String>, requests: usize) {
    let seen = poll(APPLY_TIMEOUT, || {
        let seen = h.answering(HOST, "/", requests);
        (seen == *want).then_some(seen)
    });
    assert!(
        seen.is_some(),
        "want {want:?}, answering {:?}\n{}",
        h.answering(HOST, "/", requests),
        h.log()
    );
    assert_eq!(h.answering(HOST, "/", requests), *want);
}

/// 0 → 60 → 0 → 3 endpoints: every live endpoint serves at each step, HAProxy holds exactly
/// the endpoints' servers (no empty slot; removed ones deleted once drained), each named after
/// its id, and nothing reloads.
#[test]
fn scaling_from_none_to_sixty_and_back_never_reloads() {
    let mut h = Harness::new();
    let ports: Vec<u16> = (0..60).map(|i| h.echo(&format!("web-{i}"))).collect();
    let slices = |n: usize| {
        let endpoints: Vec<(String, u16, bool)> = ports[..n]
            .iter()
            .enumerate()
            .map(|(i, p)| (i.to_string(), *p, true))
            .collect();
        let refs: Vec<(&str, u16, bool)> = endpoints
            .iter()
            .map(|(s, p, r)| (s.as_str(), *p, *r))
            .collect();
        endpoint_slices(NS, "web", &refs)
    };
    h.write(
        "web.yaml",
        &service(
            NS,
            "web",
            &[
                ("haproxy.org/check", "true"),
                ("haproxy.org/check-interval", "1s"),
            ],
        ),
    );
    h.write("ingress.yaml", &web_ingress());
    h.start(&[]);
    let start = h.reloads();
    assert!(
        servers(&h, BACKEND).is_empty(),
        "no endpoint, no server: {:?}",
        servers(&h, BACKEND)
    );
    let cfg = h.admin("/debug/config").unwrap().body;
    assert!(!cfg.contains("server-template"), "no slots:\n{cfg}");

    for n in [60usize, 0, 3] {
        if n == 0 {
            h.remove("web-endpoints.yaml");
        } else {
            h.write("web-endpoints.yaml", &slices(n));
        }
        let want: BTreeSet<String> = if n == 0 {
            BTreeSet::from(["status 503".to_string()])
        } else {
            (0..n).map(|i| format!("web-{i}")).collect()
        };
        wait_answering(&h, &want, 3 * n.max(2));
        // Exactly the endpoints' servers, all in service, once removed ones are deleted.
        let wanted_ports: BTreeSet<u16> = ports[..n].iter().copied().collect();
        let mut last = Vec::new();
        let exact = poll(APPLY_TIMEOUT, || {
            last = servers(&h, BACKEND);
            let held: BTreeSet<u16> = last.iter().map(|s| s.2).collect();
            (held == wanted_ports && last.len() == n).then_some(())
        });
        assert!(exact.is_some(), "{n} endpoints, HAProxy holds {last:?}");
        for (id, name, _, admin) in &last {
            assert_eq!(*name, format!("SRV_{id}"));
            assert_eq!(admin & 0x01, 0, "{name} in maintenance");
        }
        assert_eq!(h.reloads(), start, "a reload on the way to {n} endpoints");
    }
    // The configuration on disk holds the same servers with the same ids, so a reload would
    // load what runs.
    // (/debug/config follows an apply a moment after its runtime commands.)
    let running = servers(&h, BACKEND);
    let lines: Vec<String> = running
        .iter()
        .map(|(id, name, port, _)| format!("server {name} 127.0.0.1:{port} id {id}"))
        .collect();
    let mut cfg = String::new();
    let written = poll(APPLY_TIMEOUT, || {
        cfg = h.admin("/debug/config")?.body;
        lines.iter().all(|l| cfg.contains(l)).then_some(())
    });
    assert!(written.is_some(), "{lines:?} not all in:\n{cfg}");
    assert_eq!(
        h.metric("portcullis_reloads_total{reason=\"initial\"}"),
        1.0
    );
}

/// Who answers `/?uid=<u>` for each of `uids`.
fn by_uid(h: &Harness, uids: std::ops::Range<u32>) -> Vec<String> {
    uids.map(|u| h.who(HOST, &format!("/?uid={u}"))).collect()
}

/// A hashing balance (`url_param`) is written with `hash-type consistent`, so its backend takes
/// servers at run time like any other: growing from none to four endpoints and to a fifth
/// reloads nothing, a key keeps its endpoint, and the fifth takes over only a share of the keys.
#[test]
fn hash_balanced_backends_take_servers_at_run_time() {
    let mut h = Harness::new();
    let ports: Vec<u16> = (0..5).map(|i| h.echo(&format!("web-{i}"))).collect();
    let slices = |n: usize| {
        let endpoints: Vec<(String, u16, bool)> = ports[..n]
            .iter()
            .enumerate()
            .map(|(i, p)| (i.to_string(), *p, true))
            .collect();
        let refs: Vec<(&str, u16, bool)> = endpoints
            .iter()
            .map(|(s, p, r)| (s.as_str(), *p, *r))
            .collect();
        endpoint_slices(NS, "web", &refs)
    };
    h.write(
        "web.yaml",
        &service(NS, "web", &[("haproxy.org/load-balance", "url_param uid")]),
    );
    h.write("ingress.yaml", &web_ingress());
    h.start(&[]);
    let start = h.reloads();
    let cfg = h.admin("/debug/config").unwrap().body;
    assert!(
        cfg.contains("  balance url_param uid\n  hash-type consistent\n"),
        "{cfg}"
    );
    assert!(!cfg.contains("server-template"), "no slots:\n{cfg}");

    h.write("web-endpoints.yaml", &slices(4));
    let four: BTreeSet<String> = (0..4).map(|i| format!("web-{i}")).collect();
    let spread = poll(APPLY_TIMEOUT, || {
        let seen: BTreeSet<String> = by_uid(&h, 0..64).into_iter().collect();
        (seen == four).then_some(())
    });
    assert!(
        spread.is_some(),
        "64 keys do not reach the four endpoints\n{}",
        h.log()
    );
    let before = by_uid(&h, 0..64);
    assert_eq!(
        by_uid(&h, 0..64),
        before,
        "a key changed endpoint on its own"
    );

    h.write("web-endpoints.yaml", &slices(5));
    let mut after = Vec::new();
    let grown = poll(APPLY_TIMEOUT, || {
        after = by_uid(&h, 0..64);
        after.contains(&"web-4".to_string()).then_some(())
    });
    assert!(
        grown.is_some(),
        "the fifth endpoint gets no key\n{}",
        h.log()
    );
    // Map-based hashing would move about four keys in five; consistent hashing moves the
    // fifth endpoint's share and leaves the others where they were.
    let moved: Vec<u32> = (0..64u32)
        .filter(|&u| before[u as usize] != after[u as usize])
        .collect();
    assert!(
        moved.iter().all(|&u| after[u as usize] == "web-4"),
        "keys moved between the old endpoints: {moved:?}\nbefore {before:?}\nafter {after:?}"
    );
    assert!(moved.len() <= 32, "{} of 64 keys moved", moved.len());
    assert_eq!(h.reloads(), start, "a reload while the hashed backend grew");
}

/// An HTTP server on 127.0.0.1 that answers each request after `delay`, with body `slow`,
/// counting the requests it started and finished.
struct SlowServer {
    port: u16,
    started: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

impl SlowServer {
    fn start(delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let started = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        let (begun, done) = (started.clone(), finished.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (begun, done) = (begun.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let mut head = Vec::new();
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    // (TCP health checks close before sending a request.)
                    begun.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(delay);
                    let body = "slow\n";
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).is_ok() {
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        Self {
            port,
            started,
            finished,
        }
    }

    /// Sends requests through HAProxy on `http_port` until one is being answered here (round
    /// robin sends others elsewhere), and returns it, still open.
    fn hold_a_request(&self, http_port: u16) -> std::thread::JoinHandle<Result<String, String>> {
        poll(APPLY_TIMEOUT, || {
            let before = self.started.load(Ordering::SeqCst);
            let pending = std::thread::spawn(move || slow_get(http_port));
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline && !pending.is_finished() {
                if self.started.load(Ordering::SeqCst) > before {
                    return Some(pending);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = pending.join();
            None
        })
        .expect("a request held by the slow endpoint")
    }
}

/// A request through HAProxy that may take long: `(status line, body)` or the error.
fn slow_get(port: u16) -> Result<String, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(
            format!("GET / HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

/// A removed endpoint's open request is drained, not cut: it completes after the removal,
/// while new requests already go to the remaining endpoint, and the server is deleted once it
/// is idle. A request that outlasts `--server-drain-timeout` is closed at the bound and the
/// server deleted then.
#[test]
fn removed_endpoints_drain_within_the_bound() {
    let mut h = Harness::new();
    let quick = h.echo("quick");
    // Long enough for the steps below on a loaded machine, inside the bound.
    let slow = SlowServer::start(Duration::from_secs(5));
    let write = |h: &Harness, with_slow: bool| {
        let mut endpoints = vec![("quick", quick, true)];
        if with_slow {
            endpoints.push(("slow", slow.port, true));
        }
        h.write(
            "web-endpoints.yaml",
            &endpoint_slices(NS, "web", &endpoints),
        );
    };
    h.write("web.yaml", &service(NS, "web", &[]));
    h.write("ingress.yaml", &web_ingress());
    write(&h, true);
    h.start(&["--server-drain-timeout", "8s"]);
    let start = h.reloads();
    let slow_server = || servers(&h, BACKEND).into_iter().find(|s| s.2 == slow.port);
    assert!(slow_server().is_some());

    // 1. A request that takes 5 s, inside the bound.
    let held = slow.hold_a_request(h.http_port);
    write(&h, false);
    // New requests go to the remaining endpoint at once, while the old one still drains.
    wait_answering(&h, &BTreeSet::from(["quick".to_string()]), 4);
    let (_, name, _, admin) = slow_server().expect("the removed server still exists while busy");
    assert_eq!(
        admin & 0x01,
        0x01,
        "{name} is in maintenance while it drains"
    );
    // Back while it drains: the same server is put back in service (its name is still
    // taken, so `add server` would fail and force a reload), then removed again.
    write(&h, true);
    wait_until(
        APPLY_TIMEOUT,
        "the draining server is back in service",
        || slow_server().is_some_and(|s| s.3 & 0x01 == 0),
    );
    assert_eq!(slow_server().unwrap().1, name, "the same server");
    write(&h, false);
    let removed_at = Instant::now();
    // In maintenance, or deleted already if the held request has just finished.
    wait_until(APPLY_TIMEOUT, "the server drains again", || {
        slow_server().is_none_or(|s| s.3 & 0x01 == 0x01)
    });
    let answer = held.join().unwrap().expect("the held request completes");
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("slow\n"),
        "the held request was cut: {answer:?}"
    );
    // Deleted once idle, well before the bound.
    wait_until(
        Duration::from_secs(5),
        "the drained server is deleted",
        || slow_server().is_none(),
    );
    assert!(removed_at.elapsed() < Duration::from_secs(8));
    assert_eq!(h.reloads(), start, "no reload:\n{}", h.log());

    // 2. A request that outlasts the bound: the endpoint comes back, takes a 20 s request,
    // and is removed; at 8 s its stream is closed and the server deleted.
    let longer = SlowServer::start(Duration::from_secs(20));
    let write_longer = |h: &Harness, with_longer: bool| {
        let mut endpoints = vec![("quick", quick, true)];
        if with_longer {
            endpoints.push(("longer", longer.port, true));
        }
        h.write(
            "web-endpoints.yaml",
            &endpoint_slices(NS, "web", &endpoints),
        );
    };
    write_longer(&h, true);
    let longer_server = || {
        servers(&h, BACKEND)
            .into_iter()
            .find(|s| s.2 == longer.port)
    };
    wait_until(APPLY_TIMEOUT, "the longer endpoint is added", || {
        longer_server().is_some_and(|s| s.3 & 0x01 == 0)
    });
    let held = longer.hold_a_request(h.http_port);
    let removed_at = Instant::now();
    write_longer(&h, false);
    wait_until(
        Duration::from_secs(20),
        "the server is deleted at the bound",
        || longer_server().is_none(),
    );
    let took = removed_at.elapsed();
    assert!(
        took >= Duration::from_secs(7) && took < Duration::from_secs(17),
        "deleted after {took:?} with an 8 s bound"
    );
    let answer = held.join().unwrap();
    assert!(
        !answer.as_deref().is_ok_and(|a| a.ends_with("slow\n")),
        "the request past the bound was not closed: {answer:?}"
    );
    assert_eq!(longer.finished.load(Ordering::SeqCst), 0);
    assert!(h.log().contains("after the drain timeout"), "{}", h.log());
    assert_eq!(h.reloads(), start);
}

/// A Secret with `ca.crt` in [`NS`].
fn ca_secret(name: &str, pem: &str) -> String {
    let body: String = pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: {NS}\nstringData:\n  ca.crt: |\n{body}"
    )
}

/// Verified TLS to the pods (`server-ca`) and health checks on a server added at run time:
/// `add server` gets the backend's `default-server` words (`check`, `ssl verify required
/// ca-file …`), since dynamic servers inherit none. The pod is served, and a pod whose
/// certificate another CA signed is not, both without a reload.
#[test]
fn tls_to_pods_added_at_run_time_is_verified() {
    let mut h = Harness::new();
    let work = h.work();
    let pods_ca = support::make_ca(&work, "pods", "/CN=pods CA");
    let pod = support::make_signed(&work, &pods_ca, "api.internal", "api-pod");
    let other_ca = support::make_ca(&work, "other", "/CN=other CA");
    let stranger = support::make_signed(&work, &other_ca, "api.internal", "stranger");
    let (pod_port, stranger_port) = (support::free_port(), support::free_port());
    let _pod = support::TlsPod::start(pod_port, &pod.0, &pod.1);
    let _stranger = support::TlsPod::start(stranger_port, &stranger.0, &stranger.1);
    h.write(
        "api.yaml",
        &service(
            NS,
            "api",
            &[
                ("haproxy.org/server-ca", "pods-ca"),
                ("haproxy.org/check-interval", "1s"),
            ],
        ),
    );
    h.write("pods-ca.yaml", &ca_secret("pods-ca", &pods_ca.2));
    h.write("api-ingress.yaml", &support::api_ingress(NS));
    h.start(&[]);
    let start = h.reloads();
    assert_eq!(h.get("api.example.com", "/").status, 503, "no endpoint yet");

    h.write(
        "api-endpoints.yaml",
        &endpoint_slices(NS, "api", &[("0", pod_port, true)]),
    );
    wait_until(APPLY_TIMEOUT, "the pod added at run time answers", || {
        h.try_get("api.example.com", "/")
            .is_some_and(|a| a.status == 200 && a.body.contains("s_server"))
    });
    let server = servers(&h, "shop_api_80");
    assert_eq!(server.len(), 1, "{server:?}");
    // Its health checks run (HAProxy adds servers with checks off): a check passes.
    let check_status = || {
        let stat = h.runtime("show stat shop_api_80 4 -1\n");
        stat.lines()
            .map(|l| l.split(',').collect::<Vec<_>>())
            .find(|f| f.get(1) == Some(&server[0].1.as_str()))
            .map(|f| (f[17].to_string(), f[36].to_string()))
    };
    wait_until(
        APPLY_TIMEOUT,
        "a health check passes on the added server",
        || check_status().is_some_and(|(status, check)| status == "UP" && check.ends_with("OK")),
    );

    // A pod whose certificate does not verify: refused, not served unverified.
    h.write(
        "api-endpoints.yaml",
        &endpoint_slices(NS, "api", &[("0", stranger_port, true)]),
    );
    wait_until(APPLY_TIMEOUT, "the stranger is refused", || {
        h.try_get("api.example.com", "/")
            .is_some_and(|a| a.status == 503)
    });
    assert_eq!(h.reloads(), start, "endpoint changes only");
}
