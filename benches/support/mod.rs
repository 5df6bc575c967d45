//! Helpers the benchmarks share: settings from the environment, loopback ports and a plain
//! HTTP/1.1 client. (A directory, so Cargo does not take it for a bench target.)
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// `name` from the environment, parsed, or `default`.
pub(crate) fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// A comma-separated list of numbers from the environment, or `default`.
pub(crate) fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().expect("a comma-separated list of numbers"))
        .collect()
}

/// A free TCP port on 127.0.0.1.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Adds to `command` (a `portcullis run`) what every benchmark runs it with: the manifest
/// directory, the configuration and runtime directories, HTTP, HTTPS and the admin endpoint on
/// loopback ports, the debounce, and warnings only.
pub(crate) fn loopback_run<'c>(
    command: &'c mut std::process::Command,
    manifests: &std::path::Path,
    config_dir: &std::path::Path,
    run_dir: &std::path::Path,
    (http, https, admin): (u16, u16, u16),
    debounce: &str,
    log_level: &str,
) -> &'c mut std::process::Command {
    command
        .arg("--manifests")
        .arg(manifests)
        .arg("--config-dir")
        .arg(config_dir)
        .arg("--runtime-dir")
        .arg(run_dir)
        .args(["--ipv4-bind-address", "127.0.0.1"])
        .args(["--http-bind-port", &http.to_string()])
        .args(["--https-bind-port", &https.to_string()])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .args(["--sync-debounce", debounce, "--log-level", log_level])
}

/// One HTTP/1.1 request over a fresh connection: (status, body).
pub(crate) fn get(port: u16, host: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_nodelay(true).ok()?;
    // One write: a request split over several small writes meets Nagle and delayed ACKs.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let buf = String::from_utf8_lossy(&buf);
    let status = buf.split(' ').nth(1)?.parse().ok()?;
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    Some((status, body))
}

/// Site script changes as `run` meets them, `rounds` times: a site copy of the bundled
/// `pod-maxconn.rhai` with one more comment line each round (the same results), then, timed,
/// loading the scripts and templates into a new pipeline that takes over what the last one
/// remembers (`keep_memo_of`), and its run. Returns the last pipeline and the times.
pub(crate) fn script_change_runs(
    mut pipeline: portcullis::pipeline::Pipeline,
    store: &portcullis::store::Store,
    inputs: &portcullis::translate::RunInputs,
    rounds: usize,
) -> (portcullis::pipeline::Pipeline, Vec<Duration>) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let original = std::fs::read_to_string(root.join("scripts/pod-maxconn.rhai")).unwrap();
    let site = tempfile::tempdir().unwrap();
    let mut times = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        std::fs::write(
            site.path().join("pod-maxconn.rhai"),
            format!("{original}\n// bench change {round}\n"),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let mut reloaded = portcullis::source::site::load_pipeline(
            Some(site.path()),
            None,
            pipeline.config.clone(),
        )
        .unwrap();
        reloaded.keep_memo_of(&pipeline);
        drop(reloaded.run_with(store, inputs).unwrap());
        times.push(started.elapsed());
        pipeline = reloaded;
    }
    (pipeline, times)
}
