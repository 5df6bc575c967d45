//! The controller ConfigMap's global keys, the errorfiles and TCP services ConfigMaps and the
//! bind flags, against a real HAProxy: `show info` and the rendered configuration change as
//! the keys say, a bad key is reported while the rest applies, an error page is served on 503,
//! a TCP service carries raw bytes both ways, the stats page and `/metrics` are served, and
//! `--disable-http` removes the HTTP frontend.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use support::*;

const NS: &str = "edge";

/// A raw TCP echo server on 127.0.0.1: every connection gets its bytes back until it closes.
/// Bounded: at most 64 connections, each with read and write timeouts.
fn tcp_echo() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding an echo port");
    let port = listener.local_addr().expect("an address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(64) {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
                let mut buf = [0u8; 4096];
                for _ in 0..1000 {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    port
}

/// Sends `payload` to `addr` and reads back as many bytes; `None` on any failure.
fn round_trip(addr: SocketAddr, payload: &[u8]) -> Option<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(payload).ok()?;
    let mut back = vec![0u8; payload.len()];
    stream.read_exact(&mut back).ok()?;
    Some(back)
}

/// A Service `name` on port 7000 with one ready loopback endpoint on `target`.
fn tcp_service(name: &str, target: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  ports:\n    - {{name: raw, port: 7000, targetPort: {target}}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-0\n  namespace: {NS}\n  labels: {{kubernetes.io/service-name: {name}}}\n\
         addressType: IPv4\nports:\n  - {{name: raw, port: {target}, protocol: TCP}}\nendpoints:\n  - addresses: [\"127.0.0.1\"]\n    conditions: {{ready: true}}\n"
    )
}

/// A ConfigMap in `NS` with `data` given as YAML lines (indented by two spaces).
fn config_map(name: &str, data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {NS}\ndata:\n{data}"
    )
}

/// The errorfiles ConfigMap: a 503 page with `body`.
fn error_pages(body: &str) -> String {
    config_map(
        "errorfiles",
        &format!(
            "  \"503\": |\n    HTTP/1.1 503 Service Unavailable\n    Content-Type: text/plain\n    Cache-Control: no-cache\n    Connection: close\n\n    {body}\n"
        ),
    )
}

/// One GET without `Connection: close`: the answer's headers, and whether HAProxy closed the
/// connection after it (read to the end within 3 s).
fn keep_alive_get(port: u16, host: &str) -> (String, bool) {
    let mut stream = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    stream
        .write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .unwrap();
    let mut raw = Vec::new();
    let started = Instant::now();
    let closed = stream.read_to_end(&mut raw).is_ok() && started.elapsed() < Duration::from_secs(3);
    (String::from_utf8_lossy(&raw).to_lowercase(), closed)
}

/// The value of `Name: value` in `show info`.
fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(|v| v.trim().to_string())
}

#[test]
fn configmap_keys_error_pages_tcp_services_and_stats_through_haproxy() {
    let mut h = Harness::new();
    let (tcp_port, stats_port) = (free_port(), free_port());
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    // A Service whose only endpoint is not ready: HAProxy answers 503 itself.
    let down_port = h.echo("down");
    h.write(
        "down.yaml",
        &format!(
            "{}---\n{}",
            service(NS, "down", &[]),
            endpoint_slices(NS, "down", &[("0", down_port, false)])
        ),
    );
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "site",
            &[
                route(Some("web.example.com"), "/", "Prefix", "web"),
                route(Some("down.example.com"), "/", "Prefix", "down"),
            ],
            None,
            &[],
        ),
    );
    h.write("echo.yaml", &tcp_service("raw", tcp_echo()));
    h.write(
        "portcullis.yaml",
        &config_map(
            "portcullis",
            "  maxconn: \"4242\"\n  nbthread: \"2\"\n  hard-stop-after: 7s\n  http-connection-mode: httpclose\n  timeout-client: 31s\n  log-format-tcp: '%ci:%cp %ft %b/%s %B'\n  logasap: maybe\n  dontlog-normal: \"true\"\n",
        ),
    );
    h.write(
        "errorfiles.yaml",
        &error_pages("Back soon, from the errorfiles ConfigMap"),
    );
    h.write(
        "tcp-services.yaml",
        &config_map(
            "tcp-services",
            &format!(
                "  \"{tcp_port}\": {NS}/raw:7000\n  \"{}\": {NS}/raw:7000\n  \"bad\": {NS}/raw:7000\n",
                h.http_port
            ),
        ),
    );
    let cm = |name: &str| format!("{NS}/{name}");
    h.start(&[
        "--configmap",
        &cm("portcullis"),
        "--configmap-errorfiles",
        &cm("errorfiles"),
        "--configmap-tcp-services",
        &cm("tcp-services"),
        "--stats-bind-port",
        &stats_port.to_string(),
        "--ipv6-bind-address",
        "::1",
    ]);
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();

    // Global keys, as HAProxy itself reports them.
    let info = h.runtime("show info\n");
    assert_eq!(
        info_field(&info, "Maxconn").as_deref(),
        Some("4242"),
        "{info}"
    );
    assert_eq!(
        info_field(&info, "Nbthread").as_deref(),
        Some("2"),
        "{info}"
    );
    for line in [
        "hard-stop-after 7000",
        "option httpclose",
        "timeout client 31000",
    ] {
        assert!(cfg.contains(line), "{line} missing:\n{cfg}");
    }
    // httpclose: HAProxy closes a keep-alive client's connection after the answer.
    let (answer, closed) = keep_alive_get(h.http_port, "web.example.com");
    assert!(answer.starts_with("http/1.1 200"), "{answer}");
    assert!(closed, "the connection stayed open: {answer}");

    // dontlog-normal: a request that failed (503, no ready endpoint) is in the request log,
    // one that was served is not. They are sent in turn, so the first line is there by the
    // time the second is.
    assert!(cfg.contains("option dontlog-normal"), "{cfg}");
    assert_eq!(h.get("web.example.com", "/dontlog-served").status, 200);
    assert_eq!(h.get("down.example.com", "/dontlog-failed").status, 503);
    poll(APPLY_TIMEOUT, || {
        h.log()
            .contains(" /dontlog-failed HTTP/1.1\"")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("no log line for the failed request:\n{}", h.log()));
    assert!(!h.log().contains("/dontlog-served"), "{}", h.log());

    // The bad key is reported, and ignored; the rest applied (above).
    assert!(!cfg.contains("option logasap"));
    let log = h.log();
    assert!(log.contains("key logasap"), "{}", log_tail(&log, 40));
    // The tcp-services key taking the HTTP port loses, with a diagnostic; so does a bad key.
    assert!(
        log.contains(&format!("key {}", h.http_port)),
        "{}",
        log_tail(&log, 40)
    );
    assert!(log.contains("key bad"), "{}", log_tail(&log, 40));

    // The error page is served on 503.
    let down = h.get("down.example.com", "/");
    assert_eq!(down.status, 503);
    assert!(
        down.body
            .contains("Back soon, from the errorfiles ConfigMap"),
        "{down:?}"
    );
    assert_eq!(h.who("web.example.com", "/"), "web");

    // The TCP service carries raw bytes both ways, on IPv4 and on the IPv6 bind.
    let payload: Vec<u8> = (0u8..=255)
        .chain(b"\r\n\r\nnot HTTP at all\x00".iter().copied())
        .collect();
    for addr in [format!("127.0.0.1:{tcp_port}"), format!("[::1]:{tcp_port}")] {
        let back = round_trip(addr.parse().unwrap(), &payload);
        assert_eq!(back.as_deref(), Some(payload.as_slice()), "through {addr}");
    }
    assert!(cfg.contains("log-format '%ci:%cp %ft %b/%s %B'"), "{cfg}");
    // HTTP over the IPv6 bind too.
    let v6 = http_get(
        format!("[::1]:{}", h.http_port).parse().unwrap(),
        "web.example.com",
        "/",
    )
    .unwrap();
    assert_eq!(v6.who(), "web");

    // HAProxy's stats page and Prometheus exporter.
    let stats: SocketAddr = format!("127.0.0.1:{stats_port}").parse().unwrap();
    let page = http_get(stats, "stats", "/").unwrap();
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("Statistics Report"),
        "{}",
        &page.body[..page.body.len().min(300)]
    );
    let metrics = http_get(stats, "stats", "/metrics").unwrap();
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .body
            .contains("haproxy_process_max_connections 4242"),
        "{}",
        &metrics.body[..metrics.body.len().min(500)]
    );

    // A new error page takes a reload (HAProxy reads them when it loads), and is served.
    let (reloads, failed) = h.reloads();
    h.write("errorfiles.yaml", &error_pages("Second edition"));
    wait_until(APPLY_TIMEOUT, "the new error page is served", || {
        h.try_get("down.example.com", "/")
            .is_some_and(|a| a.status == 503 && a.body.contains("Second edition"))
    });
    assert_eq!(h.reloads(), (reloads + 1, failed));
}

#[test]
fn disable_http_removes_the_http_frontend() {
    let mut h = Harness::new();
    let stats_port = free_port();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "site",
            &[route(Some("web.example.com"), "/", "Prefix", "web")],
            None,
            &[],
        ),
    );
    h.start(&[
        "--disable-http",
        "--stats-bind-port",
        &stats_port.to_string(),
    ]);
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(!cfg.contains("frontend http\n"), "{cfg}");
    assert!(
        h.try_get("web.example.com", "/").is_none(),
        "the HTTP port still answers"
    );
    // HAProxy runs: its stats frontend answers.
    let stats: SocketAddr = format!("127.0.0.1:{stats_port}").parse().unwrap();
    assert_eq!(http_get(stats, "stats", "/").unwrap().status, 200);
}
