//! Event-to-applied latency against a real HAProxy: how long from writing a manifest change
//! until a client sees it, for an endpoint change and for a new path.
//!
//! Run: `cargo bench --bench latency` (needs `haproxy` on PATH). Environment:
//! `BENCH_ROUNDS` (default 40 per scenario), `BENCH_DEBOUNCE` (default `100ms`, the `run`
//! default). Prints p50, p90, p99 and max, the reloads HAProxy performed (expected: 0), and
//! the controller's own `portcullis_event_to_applied_seconds` histogram count and mean.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::panic
)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::{free_port, get, loopback_run};

fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The bench cluster: `/` on bench.local → `web` (the `endpoints`), `/p0..` → `api` (one pod).
fn manifests(endpoints: &[SocketAddr], api: SocketAddr, paths: usize) -> String {
    let mut rules = String::from(
        "      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}\n",
    );
    for i in 0..paths {
        rules.push_str(&format!(
            "      - {{path: /p{i}, pathType: Prefix, backend: {{service: {{name: api, port: {{number: 80}}}}}}}}\n"
        ));
    }
    let mut slices = String::new();
    for (i, ep) in endpoints.iter().enumerate() {
        slices.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-{i}, namespace: bench, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{port: {}}}]\nendpoints: [{{addresses: [\"{}\"]}}]\n",
            ep.port(),
            ep.ip()
        ));
    }
    slices.push_str(&format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: api, namespace: bench}}\nspec: {{ports: [{{port: 80}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: api-0, namespace: bench, labels: {{kubernetes.io/service-name: api}}}}\naddressType: IPv4\nports: [{{port: {}}}]\nendpoints: [{{addresses: [\"{}\"]}}]\n",
        api.port(),
        api.ip()
    ));
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {{name: portcullis}}\nspec: {{controller: portcullis.io/ingress}}\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: bench, namespace: bench}}\nspec:\n  ingressClassName: portcullis\n  rules:\n  - host: bench.local\n    http:\n      paths:\n{rules}---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: bench}}\nspec: {{ports: [{{port: 80}}]}}\n{slices}"
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn report(name: &str, mut samples: Vec<f64>) {
    samples.sort_by(f64::total_cmp);
    println!(
        "{name:<16} n={:<3} p50={:>6.1} ms  p90={:>6.1} ms  p99={:>6.1} ms  max={:>6.1} ms",
        samples.len(),
        percentile(&samples, 0.5) * 1e3,
        percentile(&samples, 0.9) * 1e3,
        percentile(&samples, 0.99) * 1e3,
        samples.last().copied().unwrap_or_default() * 1e3
    );
}

fn show_proc(socket: &Path) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.write_all(b"show proc\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn reloads(socket: &Path) -> u64 {
    show_proc(socket)
        .lines()
        .find(|l| l.contains(" master "))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.wait();
    }
}

fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let debounce = std::env::var("BENCH_DEBOUNCE").unwrap_or_else(|_| "100ms".to_string());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let spawn = |name: String| {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        runtime
            .block_on(portcullis::tools::demo::spawn_echo(name, addr))
            .unwrap()
    };
    let mut servers: Vec<_> = (0..3).map(|i| spawn(format!("pod-{i}"))).collect();
    let api = spawn("api-0".to_string());

    let work = tempfile::Builder::new()
        .prefix("pcb")
        .tempdir_in("/tmp")
        .unwrap();
    let dir: PathBuf = work.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bench.yaml");
    let addrs =
        |s: &[portcullis::tools::demo::EchoServer]| s.iter().map(|e| e.addr).collect::<Vec<_>>();
    write_atomic(&file, &manifests(&addrs(&servers), api.addr, 1));

    let (http, https, admin) = (free_port(), free_port(), free_port());
    let run_dir = work.path().join("r");
    let mut command = Command::new(env!("CARGO_BIN_EXE_portcullis"));
    command.arg("run");
    let child = loopback_run(
        &mut command,
        &dir,
        &work.path().join("c"),
        &run_dir,
        (http, https, admin),
        &debounce,
        "warn",
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    let _controller = Controller(child);
    let ready = Instant::now() + Duration::from_secs(30);
    while get(admin, "x", "/readyz").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < ready, "controller not ready within 30s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let master = run_dir.join("master.sock");
    let reloads_before = reloads(&master);
    println!("event-to-applied latency, real HAProxy, debounce {debounce}, {rounds} rounds each");

    // Endpoint change: replace one pod by a new one and wait until the new one answers.
    let mut endpoint = Vec::new();
    for round in 0..rounds {
        let fresh = spawn(format!("new-{round}"));
        let want = format!("new-{round} ");
        let slot = round % servers.len();
        let old = std::mem::replace(&mut servers[slot], fresh);
        let t0 = Instant::now();
        write_atomic(&file, &manifests(&addrs(&servers), api.addr, 1));
        let deadline = t0 + Duration::from_secs(10);
        loop {
            if get(http, "bench.local", "/").is_some_and(|(_, b)| b.starts_with(&want)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "endpoint change not applied in 10s"
            );
        }
        endpoint.push(t0.elapsed().as_secs_f64());
        drop(old);
    }

    // New path: add /p<i> (to the api Service) and wait until api answers it.
    let mut path = Vec::new();
    for round in 0..rounds {
        let t0 = Instant::now();
        write_atomic(&file, &manifests(&addrs(&servers), api.addr, round + 2));
        let deadline = t0 + Duration::from_secs(10);
        let target = format!("/p{}/x", round + 1);
        loop {
            if get(http, "bench.local", &target).is_some_and(|(_, b)| b.starts_with("api-0 ")) {
                break;
            }
            assert!(Instant::now() < deadline, "new path not applied in 10s");
        }
        path.push(t0.elapsed().as_secs_f64());
    }

    report("endpoint change", endpoint);
    report("new path", path);
    println!(
        "HAProxy reloads during the benchmark: {}",
        reloads(&master) - reloads_before
    );
    let metrics = get(admin, "x", "/metrics").map(|r| r.1).unwrap_or_default();
    let value = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_default()
    };
    let (sum, count) = (
        value("portcullis_event_to_applied_seconds_sum"),
        value("portcullis_event_to_applied_seconds_count"),
    );
    println!(
        "controller histogram portcullis_event_to_applied_seconds: count={count} mean={:.1} ms",
        if count > 0.0 { sum / count * 1e3 } else { 0.0 }
    );
}
