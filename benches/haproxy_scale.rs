//! The HAProxy side of the scale benchmark (issue 11, items 4 and 5): the real `portcullis run`
//! binary, a real HAProxy and a synthetic cluster (`portcullis::synth`) of N Ingresses around a
//! small bench cluster (`bench.local`) whose endpoints are loopback echo servers.
//!
//! Run: `cargo bench --bench haproxy_scale` (needs `haproxy` on PATH, and `wrk` for the data
//! plane part: `apt-get install -y wrk`). Cargo builds the `portcullis` binary with the bench
//! profile first and passes it as `CARGO_BIN_EXE_portcullis`.
//!
//! For each k of `HSCALE_K` (default `3,20`), each N of `HSCALE_N` (default
//! `100,1000,10000`; empty: the data plane alone) and each server form of `HSCALE_MODES`
//! (default `slots,dynamic`: before and after in one run; `slots` puts
//! `scale-server-slots: "42"` in the controller ConfigMap, the form every backend had before
//! dynamic servers):
//! 1. writes the synthetic cluster (seed `HSCALE_SEED`, default 1) as JSON lines
//!    (`00-synth.json`); the first EndpointSlice of up to `HSCALE_CHURN_SERVICES` (default 200)
//!    Services goes to `10-churn.json`, rewritten by the churn; the bench objects go to
//!    `20-bench.yaml`. Synthetic endpoint addresses 10.a.b.c become 127.a.b.c, port 1, so
//!    that HAProxy's health checks stay on loopback (and are refused at once);
//! 2. starts `portcullis run` on that directory and records the time to `/readyz` and to the
//!    first request answered through HAProxy;
//! 3. event-to-applied latency (`HSCALE_ROUNDS`, default 20 per scenario, each scenario
//!    bounded by `HSCALE_LATENCY_BUDGET_SECS`, default 180): one bench pod replaced; one
//!    endpoint beyond a former block of slots (bench.local's Service grown to 42 endpoints,
//!    then one more each round: with slots the first outgrows the block; until `show servers
//!    state` has it in service); and one new path on bench.local, from the atomic write of
//!    `20-bench.yaml` until a request sees it;
//! 4. `haproxy -c` on the generated configuration and a real reload through the master CLI
//!    (`HSCALE_RELOADS`, default 3, medians): until the new worker is listed by `show proc`,
//!    and until the old one is gone; then as many structural changes through the controller
//!    (a new Service and host), from the write until the host answers, `haproxy -c` included;
//! 5. churn: `HSCALE_CHURN_SECS` (default 60) of `HSCALE_CHURN_RATE` (default 20) endpoint
//!    changes per second, one per second a bench pod (the old pod keeps serving for
//!    `HSCALE_GRACE_MS`, default 5000, as a terminating pod would), every 5 s the Service of
//!    grow.local swinging between none and `HSCALE_GROW` (default 50) endpoints, the rest
//!    synthetic Services; meanwhile 10 requests per second to bench.local. Reports the reloads
//!    (expected: 0), failed requests, how long the change made right after the churn takes to
//!    apply, and what the controller still does in the `HSCALE_DRAIN_SECS` (default 30) after
//!    that (applies, CPU).
//!
//! The bench sets its own `nofile` limit (soft and hard) to `HSCALE_NOFILE` (default 65536; 0
//! leaves it) with `prlimit` before it starts anything, so HAProxy must start under it; the
//! worker's RSS is reported at the end of each measurement.
//!
//! Health checks: by default a controller ConfigMap (`--configmap portcullis/controller`,
//! `check: "false"`) turns them off for every Service, here and in the data-plane part.
//! HAProxy 2.6 reserves one file descriptor per `server` line with `check`, the disabled
//! server slots included (42 per backend with slots), so with slots at N = 1000 it asks for
//! about 37 500 descriptors and refuses to start under a `nofile` limit of 20 000.
//! `HSCALE_CHECKS=1` keeps the checks the scripts decide (on by default).
//!
//! Then the data plane (`HSCALE_DP`, default 1; needs `wrk`): a synthetic cluster of
//! `HSCALE_DP_N` (default 1000) Ingresses plus bench.local whose Services all point at a
//! backend HAProxy answering itself (`echo<m> ok`), served four ways: by `portcullis run` (at
//! the default log level, `info`, so that it passes on every request log line); by
//! a plain HAProxy on a copy of the configuration Portcullis generated minus request logging
//! (`log` lines and `option httplog`: what logging costs); by a minimal hand-written
//! configuration (same `timeout`s and `maxconn`, a host → backend map, the same servers; `check`
//! only with `HSCALE_CHECKS=1`), the reference of the ratios; and by that configuration with the
//! generated one's request log (`log stdout`, `option httplog`; its output a pipe the bench
//! reads) and X-Forwarded-For and -Proto, to tell what those cost from what routing by host
//! and path costs. The measured hosts are bench.local and the first
//! `HSCALE_DP_HOSTS` (default 20) synthetic hosts whose Ingress and Service carry no
//! annotation, checked first to be answered by the expected backend on every side.
//! `wrk -t1 -c$HSCALE_DP_CONNS -d${HSCALE_DP_SECS}s --timeout 2s` (defaults 32 and 5) runs
//! against each side in turn (the order rotates each round), `HSCALE_DP_ROUNDS` (default 5)
//! times, once with `Host: bench.local` and once rotating over the measured hosts (a Lua
//! `request` function). Reports median requests per second, the HAProxy worker's CPU time per
//! request (and the controller's, which reads HAProxy's log pipe), the ratios to the minimal
//! hand-written configuration, and Portcullis's to the hand-written one with the log and
//! headers. The headline ratio is the median over the rounds of the two sides' ratio within
//! the round (measured within 20 seconds of each other), the machine's slow and fast minutes
//! cancelled; the ratio of the two sides' medians is printed beside it.
//!
//! Output: markdown tables on stdout; with `HSCALE_OUT=<dir>`, also `haproxy-scale.csv` and
//! `haproxy-dataplane.csv` there. Other knobs: `HSCALE_DEBOUNCE` (default `100ms`),
//! `HSCALE_CTL_LOG` (the scale controller's `--log-level`, default `warn`; e.g.
//! `warn,portcullis::controller=debug,portcullis::apply=debug` shows each apply's phases),
//! `HSCALE_IDLE_SECS` (default 5, CPU of an idle controller and HAProxy), `HSCALE_DP_BACKENDS`
//! (default 4 backend frontends), `HSCALE_HAPROXY` (default `haproxy`), `HSCALE_KEEP=1` (keep
//! the work directories under /tmp), `HSCALE_CONFIGMAP` (more keys of the controller
//! ConfigMap, as YAML flow entries, e.g. `dontlog-normal: "true"`).
//!
//! Plot mode: `SCALE_PLOT_IN=docs/perf/scale.csv SCALE_PLOT_OUT=docs/perf/scaling.svg cargo
//! bench --bench haproxy_scale` reads the `benches/scale.rs` figures (columns
//! `N,k,full_ms,endpoint_ms,ingress_ms,script_ms,rss_mib`) and draws them, log-log, as SVG;
//! nothing else runs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::panic
)]

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;
use support::{env_list, env_num, free_port, get, loopback_run};

use portcullis::objects::{Key, Kind, Object};
use portcullis::synth::{self, SynthConfig, TlsPem};
use portcullis::tools::demo::{EchoServer, spawn_echo};
use serde_json::{Value, json};
use tokio::runtime::Runtime;

// ---------------------------------------------------------------------------------------------
// Environment

/// `eprintln!` with the UTC time of day, to line progress up with other logs of the machine.
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!("[{}] {}", stamp(), format_args!($($arg)*))
    };
}

fn stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

#[derive(Clone)]
struct Options {
    seed: u64,
    /// Endpoints per Service: each of `HSCALE_K` in turn; the data plane takes the first.
    k: usize,
    rounds: usize,
    latency_budget: Duration,
    debounce: String,
    /// `--log-level` of the controller of the scale part; its stderr is shown.
    ctl_log: String,
    reloads: usize,
    idle: Duration,
    churn_secs: u64,
    churn_rate: u64,
    churn_services: usize,
    grace: Duration,
    drain: Duration,
    haproxy: String,
    /// Health checks as the scripts decide (`HSCALE_CHECKS=1`), or off for every Service
    /// (the default). HAProxy 2.6 reserves a file descriptor per server line with `check`,
    /// disabled slots included: 42 slots per backend need about 37 500 descriptors at N = 1000,
    /// more than a `nofile` limit of 20 000 allows, and HAProxy then refuses to start.
    checks: bool,
    /// More controller ConfigMap keys (`HSCALE_CONFIGMAP`), YAML flow entries.
    configmap: String,
    /// How backends hold their servers: `dynamic` (one per endpoint, added and deleted at run
    /// time) or `slots` (`scale-server-slots: "42"` in the controller ConfigMap, the form
    /// before dynamic servers). Each of `HSCALE_MODES` (default `slots,dynamic`) in turn.
    mode: &'static str,
    /// Endpoints the grow-and-shrink Service (`grow.local`) swings between during the churn
    /// (`HSCALE_GROW`, default 50; 0 leaves it out).
    grow: usize,
}

impl Options {
    fn from_env() -> Self {
        Self {
            seed: env_num("HSCALE_SEED", 1),
            k: 3,
            rounds: env_num("HSCALE_ROUNDS", 20),
            latency_budget: Duration::from_secs(env_num("HSCALE_LATENCY_BUDGET_SECS", 180)),
            debounce: std::env::var("HSCALE_DEBOUNCE").unwrap_or_else(|_| "100ms".to_string()),
            ctl_log: std::env::var("HSCALE_CTL_LOG").unwrap_or_else(|_| "warn".to_string()),
            reloads: env_num("HSCALE_RELOADS", 3),
            idle: Duration::from_secs(env_num("HSCALE_IDLE_SECS", 5)),
            churn_secs: env_num("HSCALE_CHURN_SECS", 60),
            churn_rate: env_num("HSCALE_CHURN_RATE", 20).max(1),
            churn_services: env_num("HSCALE_CHURN_SERVICES", 200).max(1),
            grace: Duration::from_millis(env_num("HSCALE_GRACE_MS", 5000)),
            drain: Duration::from_secs(env_num("HSCALE_DRAIN_SECS", 30)),
            haproxy: std::env::var("HSCALE_HAPROXY").unwrap_or_else(|_| "haproxy".to_string()),
            checks: env_num("HSCALE_CHECKS", 0) != 0,
            configmap: std::env::var("HSCALE_CONFIGMAP").unwrap_or_default(),
            mode: "dynamic",
            grow: env_num("HSCALE_GROW", 50),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP, files, processes

/// A work directory under /tmp (short: socket paths live there), kept with `HSCALE_KEEP=1`.
fn work_dir(prefix: &str) -> tempfile::TempDir {
    let mut dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    if env_num("HSCALE_KEEP", 0) != 0 {
        dir.disable_cleanup(true);
        progress!("work directory kept: {}", dir.path().display());
    }
    dir
}

fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Whether `backend` has a server on `port` that is not in maintenance (`show servers state`).
fn server_in_service(runtime: &Path, backend: &str, port: u16) -> bool {
    cli(runtime, &format!("show servers state {backend}")).is_ok_and(|text| {
        text.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 18
                && f[18].parse() == Ok(port)
                && f[6].parse::<u32>().is_ok_and(|admin| admin & 0x01 == 0)
        })
    })
}

/// The `nofile` limit of process `pid`: (soft, hard), from `/proc/<pid>/limits`
/// (`u64::MAX` for unlimited or unreadable).
fn open_files_limit(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_default();
    let mut values = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(u64::MAX));
    (
        values.next().unwrap_or(u64::MAX),
        values.next().unwrap_or(u64::MAX),
    )
}

/// Waits for `child` up to `timeout`, then kills it.
fn reap(child: &mut Child, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `portcullis run` on a manifest directory, stopped (SIGTERM) when dropped.
struct Controller {
    child: Child,
    http: u16,
    admin: u16,
    master: PathBuf,
    /// The runtime API (`admin.sock`).
    runtime: PathBuf,
    config_dir: PathBuf,
}

impl Controller {
    /// Starts `portcullis run` at `log_level`. Without `opt.checks`, a controller ConfigMap
    /// turns health checks off by default (`check: "false"`), see [`Options::checks`]; it also
    /// holds the keys of `opt.configmap`.
    fn start(manifests: &Path, work: &Path, opt: &Options, log_level: &str) -> Self {
        let (http, https, admin) = (free_port(), free_port(), free_port());
        let run_dir = work.join("r");
        let config_dir = work.join("c");
        let mut command = Command::new(env!("CARGO_BIN_EXE_portcullis"));
        command.arg("run");
        let mut data = Vec::new();
        if !opt.checks {
            data.push("check: \"false\"");
        }
        if !opt.configmap.is_empty() {
            data.push(opt.configmap.as_str());
        }
        if opt.mode == "slots" {
            data.push("scale-server-slots: \"42\"");
        }
        if !data.is_empty() {
            std::fs::write(
                manifests.join("05-controller.yaml"),
                format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: controller, namespace: portcullis}}\ndata: {{{}}}\n",
                    data.join(", ")
                ),
            )
            .unwrap();
            command.args(["--configmap", "portcullis/controller"]);
        }
        let debounce = opt.debounce.as_str();
        let child = loopback_run(
            &mut command,
            manifests,
            &config_dir,
            &run_dir,
            (http, https, admin),
            debounce,
            log_level,
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // At `warn` the bench shows what goes wrong; at `info` the output is mostly request
        // log lines, thousands a second, and is discarded.
        .stderr(if log_level.starts_with("warn") {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .unwrap();
        Self {
            child,
            http,
            admin,
            master: run_dir.join("master.sock"),
            runtime: run_dir.join("admin.sock"),
            config_dir,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn ready(&self) -> bool {
        get(self.admin, "x", "/readyz").map(|r| r.0) == Some(200)
    }

    fn metrics(&self) -> Metrics {
        Metrics(
            get(self.admin, "x", "/metrics")
                .map(|r| r.1)
                .unwrap_or_default(),
        )
    }

    fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("portcullis run exited: {status}");
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        reap(&mut self.child, Duration::from_secs(60));
    }
}

/// A plain HAProxy (`-db`, no master), killed when dropped.
struct Haproxy(Child);

impl Haproxy {
    fn start(bin: &str, dir: &Path, config: &str, name: &str) -> Self {
        Self::launch(bin, dir, config, name, false)
    }

    /// As `start`, with HAProxy's standard output a pipe that a thread reads and drops the way
    /// `portcullis run` reads the request log (`log stdout`): a 1 MiB pipe, read every 20 ms
    /// (the controller's pause at this bench's log rate), so that HAProxy's writes seldom
    /// wake the reader.
    fn start_logging(bin: &str, dir: &Path, config: &str, name: &str) -> Self {
        Self::launch(bin, dir, config, name, true)
    }

    fn launch(bin: &str, dir: &Path, config: &str, name: &str, read_stdout: bool) -> Self {
        let path = dir.join(name);
        std::fs::write(&path, config).unwrap();
        let check = Command::new(bin)
            .current_dir(dir)
            .args(["-c", "-q", "-f"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{name} rejected: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(bin)
            .current_dir(dir)
            .args(["-db", "-f"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(if read_stdout {
                let (mut reader, writer) = std::io::pipe().unwrap();
                let _ = rustix::pipe::fcntl_setpipe_size(&reader, 1 << 20);
                std::thread::spawn(move || {
                    let mut buffer = vec![0u8; 256 * 1024];
                    while let Ok(n @ 1..) = std::io::Read::read(&mut reader, &mut buffer) {
                        if n < buffer.len() {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                });
                Stdio::from(writer)
            } else {
                Stdio::null()
            })
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{name}: HAProxy exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prometheus text from the admin endpoint.
struct Metrics(String);

impl Metrics {
    /// The sum of every series of `name` (all label sets).
    fn sum(&self, name: &str) -> f64 {
        self.0
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next())
            .filter_map(|v| v.parse::<f64>().ok())
            .sum()
    }
}

// ---------------------------------------------------------------------------------------------
// The master CLI

fn cli(socket: &Path, command: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{command}\n").as_bytes())?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The master's `show proc`: its reload and failed-reload counters, and every worker listed
/// (current and old ones).
#[derive(Debug, Clone)]
struct ProcStatus {
    master: u32,
    reloads: u64,
    failed: u64,
    workers: Vec<u32>,
}

fn show_proc(socket: &Path) -> Option<ProcStatus> {
    let text = cli(socket, "show proc").ok()?;
    let mut status = None;
    let mut workers = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.get(1).copied() {
            Some("master") => {
                let reloads = words.get(2)?.parse().ok()?;
                let failed = line
                    .split("[failed: ")
                    .nth(1)
                    .and_then(|r| r.split(']').next())
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(0);
                status = Some((words.first()?.parse().ok()?, reloads, failed));
            }
            Some("worker") => workers.push(words.first()?.parse().ok()?),
            _ => {}
        }
    }
    let (master, reloads, failed) = status?;
    Some(ProcStatus {
        master,
        reloads,
        failed,
        workers,
    })
}

fn worker_pid(socket: &Path) -> u32 {
    show_proc(socket)
        .and_then(|p| p.workers.first().copied())
        .expect("HAProxy has a worker")
}

/// `reload` on the master CLI, then `show proc` until a new worker is listed (first figure)
/// and no worker from before is (second figure). `None` when the reload failed or took more
/// than two minutes.
fn timed_reload(socket: &Path) -> Option<(Duration, Duration)> {
    let before = show_proc(socket)?;
    let old: HashSet<u32> = before.workers.iter().copied().collect();
    let t0 = Instant::now();
    let answer = cli(socket, "reload").unwrap_or_default();
    if answer.contains("Success=0") {
        return None;
    }
    let deadline = t0 + Duration::from_secs(120);
    let mut new_worker = None;
    while Instant::now() < deadline {
        // The master re-executes itself: its socket refuses connections for a while.
        if let Some(now) = show_proc(socket).filter(|p| p.reloads > before.reloads) {
            if now.failed > before.failed {
                return None;
            }
            if new_worker.is_none() && now.workers.iter().any(|w| !old.contains(w)) {
                new_worker = Some(t0.elapsed());
            }
            if let Some(first) = new_worker {
                if !now.workers.iter().any(|w| old.contains(w)) {
                    return Some((first, t0.elapsed()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

// ---------------------------------------------------------------------------------------------
// /proc

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Busy CPU seconds of the whole machine (all cores), from /proc/stat.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return f64::NAN;
    };
    // user nice system idle iowait irq softirq steal: everything but idle and iowait.
    let busy: f64 = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum();
    busy / clock_ticks()
}

/// CPU used by every process but this benchmark's own (this process, the controller, its
/// HAProxy master and worker) over a window, in % of one core: someone else's load on a
/// shared machine, which inflates the figures measured meanwhile.
struct OtherLoad {
    start: Instant,
    busy: f64,
    ours: Vec<u32>,
    ours_cpu: f64,
}

impl OtherLoad {
    fn start(ctl: &Controller) -> Self {
        let p = show_proc(&ctl.master).unwrap();
        let mut ours = vec![std::process::id(), ctl.pid(), p.master];
        ours.extend(p.workers);
        Self {
            start: Instant::now(),
            busy: machine_busy_seconds(),
            ours_cpu: ours.iter().map(|&p| cpu_seconds(p)).sum(),
            ours,
        }
    }

    fn percent(&self) -> f64 {
        let ours: f64 = self.ours.iter().map(|&p| cpu_seconds(p)).sum();
        let other = (machine_busy_seconds() - self.busy) - (ours - self.ours_cpu);
        (other / self.start.elapsed().as_secs_f64() * 100.0).max(0.0)
    }
}

/// User + system CPU seconds of a process (all its threads).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // After the command: state is field 3, utime 14 and stime 15.
    (ticks(11) + ticks(12)) / clock_ticks()
}

fn status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// CPU use of processes over a window, in % of one core.
struct CpuWindow {
    start: Instant,
    pids: Vec<(u32, f64)>,
}

impl CpuWindow {
    fn start(pids: &[u32]) -> Self {
        Self {
            start: Instant::now(),
            pids: pids.iter().map(|&p| (p, cpu_seconds(p))).collect(),
        }
    }

    fn percent(&self) -> Vec<f64> {
        let wall = self.start.elapsed().as_secs_f64();
        self.pids
            .iter()
            .map(|&(p, before)| (cpu_seconds(p) - before) / wall * 100.0)
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Manifests

fn object_value(object: &Object) -> Value {
    match object {
        Object::Ingress(o) => serde_json::to_value(&**o),
        Object::IngressClass(o) => serde_json::to_value(&**o),
        Object::Service(o) => serde_json::to_value(&**o),
        Object::EndpointSlice(o) => serde_json::to_value(&**o),
        Object::Secret(o) => serde_json::to_value(&**o),
        Object::ConfigMap(o) => serde_json::to_value(&**o),
        Object::Pod(o) => serde_json::to_value(&**o),
        Object::Tcp(_) | Object::Resource(_) | Object::GatewayApi(_) => {
            panic!("the generator makes no custom resources")
        }
    }
    .unwrap()
}

/// An EndpointSlice of the synthetic load moved to loopback: 10.a.b.c → 127.a.b.c, port 1
/// (nothing listens there: health checks are refused at once and stay on this machine).
fn loopback_slice(object: &Object) -> Value {
    let mut value = object_value(object);
    if let Some(endpoints) = value.get_mut("endpoints").and_then(Value::as_array_mut) {
        for endpoint in endpoints {
            if let Some(addresses) = endpoint.get_mut("addresses").and_then(Value::as_array_mut) {
                for address in addresses {
                    if let Some(rest) = address.as_str().and_then(|a| a.strip_prefix("10.")) {
                        *address = Value::String(format!("127.{rest}"));
                    }
                }
            }
        }
    }
    if let Some(ports) = value.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports {
            port["port"] = json!(1);
        }
    }
    value
}

fn load_value(object: &Object) -> Value {
    if object.kind() == Kind::EndpointSlice {
        loopback_slice(object)
    } else {
        object_value(object)
    }
}

fn json_lines<'a>(values: impl IntoIterator<Item = &'a String>) -> String {
    let mut out = String::new();
    for v in values {
        out.push_str(v);
        out.push('\n');
    }
    out
}

/// The bench cluster: `/` on bench.local → `web` (the `endpoints`, one slice each), `/p0..`
/// → `api` (one pod). As in `benches/latency.rs`; its IngressClass is the synthetic cluster's.
fn bench_manifests(endpoints: &[SocketAddr], api: SocketAddr, paths: usize) -> String {
    let mut rules = String::from(
        "      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}\n",
    );
    for i in 0..paths {
        let _ = writeln!(
            rules,
            "      - {{path: /p{i}, pathType: Prefix, backend: {{service: {{name: api, port: {{number: 80}}}}}}}}"
        );
    }
    let mut slices = String::new();
    for (i, ep) in endpoints.iter().enumerate() {
        let _ = write!(
            slices,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-{i}, namespace: bench, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{port: {}}}]\nendpoints: [{{addresses: [\"{}\"]}}]\n",
            ep.port(),
            ep.ip()
        );
    }
    let _ = write!(
        slices,
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: api, namespace: bench}}\nspec: {{ports: [{{port: 80}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: api-0, namespace: bench, labels: {{kubernetes.io/service-name: api}}}}\naddressType: IPv4\nports: [{{port: {}}}]\nendpoints: [{{addresses: [\"{}\"]}}]\n",
        api.port(),
        api.ip()
    );
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: bench, namespace: bench}}\nspec:\n  ingressClassName: portcullis\n  rules:\n  - host: bench.local\n    http:\n      paths:\n{rules}---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: bench}}\nspec: {{ports: [{{port: 80}}]}}\n{slices}"
    )
}

/// `grow.local` → Service `grow` with `endpoints` endpoints on loopback port 1 (nothing listens:
/// health checks are refused at once), for the churn to swing between none and many.
fn grow_manifests(endpoints: usize) -> String {
    let list: Vec<String> = (0..endpoints)
        .map(|i| format!("{{addresses: [\"127.2.{}.{}\"]}}", i / 250, i % 250 + 1))
        .collect();
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: grow, namespace: bench}}\nspec:\n  ingressClassName: portcullis\n  rules:\n  - host: grow.local\n    http:\n      paths:\n      - {{path: /, pathType: Prefix, backend: {{service: {{name: grow, port: {{number: 80}}}}}}}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: grow, namespace: bench}}\nspec: {{ports: [{{port: 80}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: grow-0, namespace: bench, labels: {{kubernetes.io/service-name: grow}}}}\naddressType: IPv4\nports: [{{port: 1}}]\nendpoints: [{}]\n",
        list.join(", ")
    )
}

/// `s<round>.structural.local` → a new Service `s<round>` on the api pod: a structural change.
fn structural_manifests(round: usize, api: SocketAddr) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: s{round}, namespace: bench}}\nspec:\n  ingressClassName: portcullis\n  rules:\n  - host: s{round}.structural.local\n    http:\n      paths:\n      - {{path: /, pathType: Prefix, backend: {{service: {{name: s{round}, port: {{number: 80}}}}}}}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{round}, namespace: bench}}\nspec: {{ports: [{{port: 80}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{round}-0, namespace: bench, labels: {{kubernetes.io/service-name: s{round}}}}}\naddressType: IPv4\nports: [{{port: {}}}]\nendpoints: [{{addresses: [\"{}\"]}}]\n",
        api.port(),
        api.ip()
    )
}

fn synth_config(seed: u64, n: usize, k: usize, tls: bool) -> SynthConfig {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    SynthConfig {
        tls: tls.then(|| TlsPem {
            cert: std::fs::read_to_string(dir.join("ec.crt")).unwrap(),
            key: std::fs::read_to_string(dir.join("ec.key")).unwrap(),
        }),
        ..SynthConfig::new(seed, n, k)
    }
}

// ---------------------------------------------------------------------------------------------
// Figures

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    percentile(&s, 0.5)
}

/// Named figures of one measurement, in order: (CSV key, label, value as printed).
#[derive(Default)]
struct Figures(Vec<(&'static str, &'static str, String)>);

impl Figures {
    fn put(&mut self, key: &'static str, label: &'static str, value: impl std::fmt::Display) {
        self.0.push((key, label, value.to_string()));
    }

    fn ms(&mut self, key: &'static str, label: &'static str, d: f64) {
        self.put(key, label, format!("{:.1}", d * 1e3));
    }

    fn num(&mut self, key: &'static str, label: &'static str, v: f64) {
        self.put(key, label, format!("{v:.1}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Part 1: event-to-applied latency, reloads, churn at N

fn echo(rt: &Runtime, name: String) -> EchoServer {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    rt.block_on(spawn_echo(name, addr)).unwrap()
}

fn addrs(servers: &[EchoServer]) -> Vec<SocketAddr> {
    servers.iter().map(|e| e.addr).collect()
}

/// Polls bench.local every 2 ms until `accept(body)`, for at most `limit`.
fn wait_for(
    http: u16,
    path: &str,
    limit: Duration,
    accept: impl Fn(&str) -> bool,
) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if get(http, "bench.local", path).is_some_and(|(s, b)| s == 200 && accept(&b)) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// What the request thread saw during the churn.
#[derive(Default)]
struct Traffic {
    sent: u64,
    failed: u64,
    /// Answered by a pod already removed from the manifests (still in its grace period).
    stale: u64,
    examples: Vec<String>,
}

fn measure_scale(rt: &Runtime, n: usize, opt: &Options) -> Figures {
    let k = opt.k;
    let mut f = Figures::default();
    let cfg = synth_config(opt.seed, n, k, true);
    let t = Instant::now();
    let cluster = synth::generate(&cfg).unwrap();
    progress!(
        "N={n} k={k}: generated {} objects in {:.0} ms",
        cluster.objects.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    f.put("n", "N (Ingresses)", n);
    f.put("k", "k (endpoints per Service)", k);
    f.put("mode", "servers", opt.mode);
    f.put(
        "objects",
        "objects (synthetic + 7 bench)",
        cluster.objects.len() + 7,
    );
    f.put("hosts", "hosts", cluster.hosts + 1);
    f.put("paths", "paths", cluster.paths + 2);
    f.put("endpoints", "endpoints", cluster.endpoints + 4);

    // The manifests: the load, the churned slices, the bench objects.
    let work = work_dir("hsc");
    let dir = work.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    let churn_count = opt.churn_services.min(n);
    let churn_idx: Vec<usize> = (0..churn_count).map(|j| j * n / churn_count).collect();
    let churn_slices: Vec<Object> = churn_idx
        .iter()
        .map(|&i| synth::changed_endpoint_slice(&cfg, i, 0).unwrap().unwrap())
        .collect();
    let churn_keys: HashSet<Key> = churn_slices.iter().map(Object::key).collect();
    let synth_lines: Vec<String> = cluster
        .objects
        .iter()
        .filter(|o| !(o.kind() == Kind::EndpointSlice && churn_keys.contains(&o.key())))
        .map(|o| load_value(o).to_string())
        .collect();
    std::fs::write(dir.join("00-synth.json"), json_lines(&synth_lines)).unwrap();
    drop(synth_lines);
    drop(cluster);
    let churn_file = dir.join("10-churn.json");
    let mut churn_lines: Vec<String> = churn_slices
        .iter()
        .map(|o| loopback_slice(o).to_string())
        .collect();
    write_atomic(&churn_file, &json_lines(&churn_lines));
    let mut pods: Vec<EchoServer> = (0..3).map(|i| echo(rt, format!("pod-{i}"))).collect();
    let api = echo(rt, "api-0".to_string());
    let bench_file = dir.join("20-bench.yaml");
    let mut paths = 1;
    write_atomic(
        &bench_file,
        &bench_manifests(&addrs(&pods), api.addr, paths),
    );
    // The Service the churn grows and shrinks, without endpoints to begin with.
    let grow_file = dir.join("25-grow.yaml");
    if opt.grow > 0 {
        write_atomic(&grow_file, &grow_manifests(0));
    }

    // Cold start.
    let t0 = Instant::now();
    let mut ctl = Controller::start(&dir, work.path(), opt, &opt.ctl_log);
    let limit = Duration::from_secs(600);
    while !ctl.ready() {
        ctl.assert_alive();
        assert!(t0.elapsed() < limit, "not ready within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ready = t0.elapsed();
    wait_for(ctl.http, "/", limit, |b| b.starts_with("pod-"))
        .expect("bench.local answered through HAProxy");
    let first = t0.elapsed();
    let cfg_text = std::fs::read_to_string(ctl.config_dir.join("haproxy.cfg")).unwrap();
    f.put("cfg_lines", "haproxy.cfg lines", cfg_text.lines().count());
    f.num(
        "cfg_mib",
        "haproxy.cfg size (MiB)",
        cfg_text.len() as f64 / 1048576.0,
    );
    drop(cfg_text);
    let m = ctl.metrics();
    f.put(
        "diagnostics",
        "input diagnostics: errors / warnings",
        format!(
            "{} / {}",
            m.0.lines()
                .find(|l| l.starts_with("portcullis_input_diagnostics{severity=\"error\"}"))
                .and_then(|l| l.rsplit(' ').next())
                .unwrap_or("?"),
            m.0.lines()
                .find(|l| l.starts_with("portcullis_input_diagnostics{severity=\"warning\"}"))
                .and_then(|l| l.rsplit(' ').next())
                .unwrap_or("?")
        ),
    );
    f.ms(
        "ready_ms",
        "cold start: spawn → /readyz 200 (ms)",
        ready.as_secs_f64(),
    );
    f.ms(
        "first_request_ms",
        "cold start: spawn → first answer through HAProxy (ms)",
        first.as_secs_f64(),
    );
    progress!(
        "N={n}: ready in {:.2} s, first request at {:.2} s",
        ready.as_secs_f64(),
        first.as_secs_f64()
    );
    let reloads_start = show_proc(&ctl.master).unwrap().reloads;

    // Idle CPU: health checks of the load and the controller at rest.
    let worker = worker_pid(&ctl.master);
    let window = CpuWindow::start(&[worker, ctl.pid()]);
    std::thread::sleep(opt.idle);
    let idle = window.percent();
    f.num(
        "idle_haproxy_cpu",
        "idle: HAProxy worker CPU (% of a core)",
        idle[0],
    );
    f.num(
        "idle_ctl_cpu",
        "idle: controller CPU (% of a core)",
        idle[1],
    );

    // Event-to-applied latency: one pod replaced.
    let m0 = ctl.metrics();
    let other = OtherLoad::start(&ctl);
    let change_limit = Duration::from_secs(120);
    let mut endpoint = Vec::new();
    let started = Instant::now();
    for round in 0..opt.rounds {
        if started.elapsed() > opt.latency_budget {
            break;
        }
        let fresh = echo(rt, format!("new-{round}"));
        let want = format!("new-{round} ");
        let slot = round % pods.len();
        let old = std::mem::replace(&mut pods[slot], fresh);
        let t0 = Instant::now();
        write_atomic(
            &bench_file,
            &bench_manifests(&addrs(&pods), api.addr, paths),
        );
        wait_for(ctl.http, "/", change_limit, |b| b.starts_with(&want))
            .expect("endpoint change applied");
        endpoint.push(t0.elapsed().as_secs_f64());
        drop(old);
    }
    // Event-to-applied latency: an endpoint beyond a former block of slots. bench.local's
    // Service grows to 42 endpoints (one block; not timed), then each round adds one more, up
    // to 42 + rounds: with slots the first of them outgrows the block.
    let mut beyond = Vec::new();
    {
        let mut wide: Vec<EchoServer> = (pods.len()..42)
            .map(|i| echo(rt, format!("wide-{i}")))
            .collect();
        let all = |pods: &[EchoServer], wide: &[EchoServer]| {
            let mut a = addrs(pods);
            a.extend(addrs(wide));
            a
        };
        write_atomic(
            &bench_file,
            &bench_manifests(&all(&pods, &wide), api.addr, paths),
        );
        wait_for(ctl.http, "/", change_limit, |b| b.starts_with("wide-41 "))
            .expect("bench.local grown to 42 endpoints");
        let started = Instant::now();
        for round in 0..opt.rounds {
            if started.elapsed() > opt.latency_budget {
                break;
            }
            wide.push(echo(rt, format!("beyond-{round}")));
            let port = wide.last().unwrap().addr.port();
            let t0 = Instant::now();
            write_atomic(
                &bench_file,
                &bench_manifests(&all(&pods, &wide), api.addr, paths),
            );
            // Applied when HAProxy has the server in service (a request would have to wait
            // for round robin to come round to it among 43 or more).
            while !server_in_service(&ctl.runtime, "bench_web_80", port) {
                assert!(
                    t0.elapsed() < change_limit,
                    "endpoint beyond the block not applied"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            beyond.push(t0.elapsed().as_secs_f64());
        }
        write_atomic(
            &bench_file,
            &bench_manifests(&addrs(&pods), api.addr, paths),
        );
        // Back to the pods alone: ten answers in a row from them.
        let t0 = Instant::now();
        let mut in_a_row = 0;
        while in_a_row < 10 && t0.elapsed() < change_limit {
            let pod = get(ctl.http, "bench.local", "/").is_some_and(|(s, b)| {
                s == 200 && !b.starts_with("wide-") && !b.starts_with("beyond-")
            });
            in_a_row = if pod { in_a_row + 1 } else { 0 };
        }
        drop(wide);
    }
    // Event-to-applied latency: a new path.
    let mut path = Vec::new();
    let started = Instant::now();
    for _ in 0..opt.rounds {
        if started.elapsed() > opt.latency_budget {
            break;
        }
        paths += 1;
        let t0 = Instant::now();
        write_atomic(
            &bench_file,
            &bench_manifests(&addrs(&pods), api.addr, paths),
        );
        let target = format!("/p{}/x", paths - 1);
        wait_for(ctl.http, &target, change_limit, |b| b.starts_with("api-0 "))
            .expect("new path applied");
        path.push(t0.elapsed().as_secs_f64());
    }
    for (name, samples) in [
        ("ep", &mut endpoint),
        ("beyond", &mut beyond),
        ("path", &mut path),
    ] {
        // The slowest rounds by number, before sorting: a slow first round is a warm-up.
        let mut slowest: Vec<(usize, f64)> = samples.iter().copied().enumerate().collect();
        slowest.sort_by(|a, b| b.1.total_cmp(&a.1));
        let slowest: Vec<String> = slowest
            .iter()
            .take(3)
            .map(|(round, s)| format!("#{round} {:.1} ms", s * 1e3))
            .collect();
        samples.sort_by(f64::total_cmp);
        progress!(
            "N={n}: {name} n={} p50={:.1} ms p99={:.1} ms; slowest rounds {}",
            samples.len(),
            percentile(samples, 0.5) * 1e3,
            percentile(samples, 0.99) * 1e3,
            slowest.join(", ")
        );
    }
    f.num(
        "latency_other_cpu",
        "latency rounds: CPU of other processes on the machine (% of a core)",
        other.percent(),
    );
    f.put("ep_rounds", "endpoint change: rounds", endpoint.len());
    f.ms(
        "ep_p50_ms",
        "endpoint change: p50 (ms)",
        percentile(&endpoint, 0.5),
    );
    f.ms(
        "ep_p99_ms",
        "endpoint change: p99 (ms)",
        percentile(&endpoint, 0.99),
    );
    f.ms(
        "ep_max_ms",
        "endpoint change: max (ms)",
        endpoint.last().copied().unwrap_or(f64::NAN),
    );
    f.put(
        "beyond_rounds",
        "endpoint beyond a former block of 42 slots: rounds",
        beyond.len(),
    );
    f.ms(
        "beyond_p50_ms",
        "endpoint beyond a former block of 42 slots: p50 (ms)",
        percentile(&beyond, 0.5),
    );
    f.ms(
        "beyond_p99_ms",
        "endpoint beyond a former block of 42 slots: p99 (ms)",
        percentile(&beyond, 0.99),
    );
    f.put("path_rounds", "new path: rounds", path.len());
    f.ms("path_p50_ms", "new path: p50 (ms)", percentile(&path, 0.5));
    f.ms("path_p99_ms", "new path: p99 (ms)", percentile(&path, 0.99));
    f.ms(
        "path_max_ms",
        "new path: max (ms)",
        path.last().copied().unwrap_or(f64::NAN),
    );
    let m1 = ctl.metrics();
    let delta = |name: &str| m1.sum(name) - m0.sum(name);
    f.ms(
        "ctl_e2a_mean_ms",
        "latency rounds: controller's event_to_applied histogram, mean (ms)",
        delta("portcullis_event_to_applied_seconds_sum")
            / delta("portcullis_event_to_applied_seconds_count"),
    );
    f.ms(
        "ctl_apply_mean_ms",
        "latency rounds: controller's apply_duration histogram, mean (ms)",
        delta("portcullis_apply_duration_seconds_sum")
            / delta("portcullis_apply_duration_seconds_count"),
    );
    // Each run's own time, by the path it took: the rest of event_to_applied is the debounce,
    // reading the manifests, and the apply.
    for (key, label, path) in [
        (
            "ctl_run_ep_mean_ms",
            "latency rounds: controller's pipeline runs on the endpoint path, mean (ms)",
            "endpoints",
        ),
        (
            "ctl_run_parts_mean_ms",
            "latency rounds: controller's pipeline runs taking unchanged parts (new paths), mean (ms)",
            "parts",
        ),
    ] {
        let series =
            |part: &str| format!("portcullis_pipeline_duration_seconds_{part}{{path=\"{path}\"}}");
        f.ms(key, label, delta(&series("sum")) / delta(&series("count")));
    }
    f.put(
        "latency_reloads",
        "HAProxy reloads during the latency rounds",
        show_proc(&ctl.master).unwrap().reloads - reloads_start,
    );

    // HAProxy's own cost for this configuration: a check, and real reloads.
    let mut checks = Vec::new();
    for _ in 0..opt.reloads.max(1) {
        let t0 = Instant::now();
        let out = Command::new(&opt.haproxy)
            .current_dir(&ctl.config_dir)
            .args(["-c", "-q", "-f", "haproxy.cfg"])
            .output()
            .unwrap();
        checks.push(t0.elapsed().as_secs_f64());
        assert!(
            out.status.success(),
            "haproxy -c failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut reload_new = Vec::new();
    let mut reload_gone = Vec::new();
    for _ in 0..opt.reloads.max(1) {
        let (new, gone) = timed_reload(&ctl.master).expect("reload through the master CLI");
        reload_new.push(new.as_secs_f64());
        reload_gone.push(gone.as_secs_f64());
        // Let the new worker settle (first health checks) before the next one.
        std::thread::sleep(Duration::from_secs(1));
    }
    progress!(
        "N={n}: haproxy -c {:.0} ms, reload {:.0} ms (old worker gone {:.0} ms)",
        median(&checks) * 1e3,
        median(&reload_new) * 1e3,
        median(&reload_gone) * 1e3
    );
    f.ms("check_ms", "`haproxy -c` (ms, median)", median(&checks));
    f.ms(
        "reload_ms",
        "reload via master CLI → new worker listed (ms, median)",
        median(&reload_new),
    );
    f.ms(
        "reload_old_gone_ms",
        "reload via master CLI → old worker gone (ms, median)",
        median(&reload_gone),
    );
    f.put("reload_runs", "reload runs", reload_new.len());
    // A structural change through the controller: a new Service and host, from the write of
    // its manifest until it answers (`haproxy -c`, the files, the reload and its check).
    let mut structural = Vec::new();
    for round in 0..opt.reloads.max(1) {
        let host = format!("s{round}.structural.local");
        let t0 = Instant::now();
        write_atomic(
            &dir.join(format!("30-structural-{round}.yaml")),
            &structural_manifests(round, api.addr),
        );
        let deadline = t0 + change_limit;
        while !get(ctl.http, &host, "/").is_some_and(|(s, b)| s == 200 && b.starts_with("api-0 ")) {
            assert!(Instant::now() < deadline, "{host} not served");
            std::thread::sleep(Duration::from_millis(2));
        }
        structural.push(t0.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_secs(1));
    }
    progress!(
        "N={n}: structural change applied in {:.0} ms (median)",
        median(&structural) * 1e3
    );
    f.ms(
        "structural_ms",
        "structural change through the controller, `haproxy -c` and reload included (ms, median)",
        median(&structural),
    );
    // After the reloads, bench.local still answers.
    wait_for(ctl.http, "/", change_limit, |b| b.starts_with("new-")).expect("serving after reload");

    // Churn.
    if opt.churn_secs > 0 {
        churn(
            rt,
            &mut f,
            &mut ctl,
            opt,
            &cfg,
            &churn_idx,
            &mut churn_lines,
            &churn_file,
            &bench_file,
            &grow_file,
            &mut pods,
            &api,
            paths,
        );
    }

    let worker = worker_pid(&ctl.master);
    f.num(
        "ctl_peak_rss_mib",
        "controller peak RSS, VmHWM (MiB)",
        status_mib(ctl.pid(), "VmHWM:"),
    );
    f.num(
        "haproxy_rss_mib",
        "HAProxy worker RSS at the end (MiB)",
        status_mib(worker, "VmRSS:"),
    );
    let (soft, hard) = open_files_limit(worker);
    f.put(
        "haproxy_nofile",
        "HAProxy worker `nofile`: as HAProxy raised it / hard limit",
        format!("{soft} / {hard}"),
    );
    drop(ctl);
    drop(work);
    f
}

#[allow(clippy::too_many_arguments)]
fn churn(
    rt: &Runtime,
    f: &mut Figures,
    ctl: &mut Controller,
    opt: &Options,
    cfg: &SynthConfig,
    churn_idx: &[usize],
    churn_lines: &mut [String],
    churn_file: &Path,
    bench_file: &Path,
    grow_file: &Path,
    pods: &mut [EchoServer],
    api: &EchoServer,
    paths: usize,
) {
    let n = cfg.ingresses;
    let before = show_proc(&ctl.master).unwrap();
    let m0 = ctl.metrics();
    let removed: Arc<Mutex<HashSet<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let (removed, stop, http) = (removed.clone(), stop.clone(), ctl.http);
        std::thread::spawn(move || {
            let mut t = Traffic::default();
            let start = Instant::now();
            let mut next = start;
            while !stop.load(Ordering::Relaxed) {
                sleep_until(next);
                next += Duration::from_millis(100);
                t.sent += 1;
                match get(http, "bench.local", "/") {
                    Some((200, body)) => {
                        let pod = body.split(' ').next().unwrap_or_default();
                        if removed.lock().unwrap().contains(pod) {
                            t.stale += 1;
                        }
                    }
                    other => {
                        t.failed += 1;
                        if t.examples.len() < 5 {
                            t.examples.push(format!(
                                "{:.1}s: {:?}",
                                start.elapsed().as_secs_f64(),
                                other.map(|(s, b)| (s, b.chars().take(60).collect::<String>()))
                            ));
                        }
                    }
                }
            }
            t
        })
    };
    let window = CpuWindow::start(&[worker_pid(&ctl.master), ctl.pid()]);
    let other = OtherLoad::start(ctl);
    let mut dying: VecDeque<(Instant, EchoServer)> = VecDeque::new();
    let rate = opt.churn_rate;
    let total = opt.churn_secs * rate;
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let (mut synthetic, mut bench, mut generation, mut swings) = (0u64, 0u64, 0u64, 0u64);
    let mut replace_pod = |round: u64, dying: &mut VecDeque<(Instant, EchoServer)>| {
        let fresh = echo(rt, format!("churn-{round}"));
        let name = fresh.name.clone();
        let slot = usize::try_from(round).unwrap() % pods.len();
        let old = std::mem::replace(&mut pods[slot], fresh);
        removed.lock().unwrap().insert(old.name.clone());
        dying.push_back((Instant::now() + opt.grace, old));
        write_atomic(bench_file, &bench_manifests(&addrs(pods), api.addr, paths));
        name
    };
    let t0 = Instant::now();
    for j in 0..total {
        sleep_until(t0 + period * u32::try_from(j).unwrap());
        if j % rate == 0 {
            replace_pod(j, &mut dying);
            bench += 1;
        } else if opt.grow > 0 && j % (5 * rate) == rate / 2 {
            // Every 5 s, grow.local's Service swings between none and `grow` endpoints.
            swings += 1;
            let endpoints = if swings % 2 == 1 { opt.grow } else { 0 };
            write_atomic(grow_file, &grow_manifests(endpoints));
        } else {
            generation += 1;
            let pos = usize::try_from(generation).unwrap() % churn_idx.len();
            let slice = synth::changed_endpoint_slice(cfg, churn_idx[pos], generation)
                .unwrap()
                .unwrap();
            churn_lines[pos] = loopback_slice(&slice).to_string();
            write_atomic(churn_file, &json_lines(churn_lines.iter()));
            synthetic += 1;
        }
        while dying.front().is_some_and(|(t, _)| *t <= Instant::now()) {
            dying.pop_front();
        }
        if j % rate == 0 {
            ctl.assert_alive();
        }
    }
    let churn_wall = t0.elapsed();
    // One more pod change right after the churn: how long until it is applied (the backlog).
    let last = replace_pod(total, &mut dying);
    let t_last = Instant::now();
    let settle = wait_for(ctl.http, "/", Duration::from_secs(180), |b| {
        b.starts_with(&format!("{last} "))
    });
    let settle = settle.map(|_| t_last.elapsed().as_secs_f64());
    let cpu = window.percent();
    let other = other.percent();
    stop.store(true, Ordering::Relaxed);
    let traffic = traffic.join().unwrap();
    drop(dying);
    let after = show_proc(&ctl.master).unwrap();
    let m1 = ctl.metrics();
    let delta = |name: &str| m1.sum(name) - m0.sum(name);
    // What the controller still does once the churn is over and applied (a backlog of
    // change notifications would keep it busy).
    let drain = if opt.drain.is_zero() {
        None
    } else {
        let window = CpuWindow::start(&[ctl.pid()]);
        std::thread::sleep(opt.drain);
        let m2 = ctl.metrics();
        Some((
            m2.sum("portcullis_applies_total") - m1.sum("portcullis_applies_total"),
            window.percent()[0],
        ))
    };
    progress!(
        "N={n}: churn {} changes in {:.1} s, reloads {}, requests {} failed {} stale {}; settle {:?}",
        synthetic + bench,
        churn_wall.as_secs_f64(),
        after.reloads - before.reloads,
        traffic.sent,
        traffic.failed,
        traffic.stale,
        settle
    );
    for e in &traffic.examples {
        progress!("  failed request at {e}");
    }
    f.put(
        "churn_changes",
        "churn: endpoint changes (synthetic + bench.local)",
        format!(
            "{} ({synthetic} + {bench}) in {:.1} s",
            synthetic + bench,
            churn_wall.as_secs_f64()
        ),
    );
    f.put(
        "churn_grow_swings",
        "churn: grow.local swung between 0 and HSCALE_GROW endpoints",
        swings,
    );
    f.put(
        "churn_reloads",
        "churn: HAProxy reloads (show proc)",
        after.reloads - before.reloads,
    );
    f.put(
        "churn_worker_changed",
        "churn: worker pid changed",
        before.workers.first() != after.workers.first(),
    );
    f.put(
        "churn_ctl_reloads",
        "churn: controller reloads (portcullis_reloads_total)",
        delta("portcullis_reloads_total"),
    );
    f.put(
        "churn_applies",
        "churn: controller applies (portcullis_applies_total)",
        delta("portcullis_applies_total"),
    );
    f.ms(
        "churn_e2a_mean_ms",
        "churn: controller event_to_applied mean (ms)",
        delta("portcullis_event_to_applied_seconds_sum")
            / delta("portcullis_event_to_applied_seconds_count"),
    );
    f.put(
        "churn_requests",
        "churn: requests to bench.local (10/s)",
        traffic.sent,
    );
    f.put("churn_failed", "churn: failed requests", traffic.failed);
    f.put(
        "churn_stale",
        "churn: answered by a removed pod (in its grace period)",
        traffic.stale,
    );
    f.ms(
        "churn_settle_ms",
        "churn: a bench pod change right after the churn, applied in (ms)",
        settle.unwrap_or(f64::NAN),
    );
    f.num(
        "churn_haproxy_cpu",
        "churn: HAProxy worker CPU (% of a core)",
        cpu[0],
    );
    f.num(
        "churn_ctl_cpu",
        "churn: controller CPU (% of a core)",
        cpu[1],
    );
    f.num(
        "churn_other_cpu",
        "churn: CPU of other processes on the machine (% of a core)",
        other,
    );
    if let Some((applies, cpu)) = drain {
        f.put(
            "drain_applies",
            "after the churn (HSCALE_DRAIN_SECS): controller applies",
            applies,
        );
        f.num(
            "drain_ctl_cpu",
            "after the churn (HSCALE_DRAIN_SECS): controller CPU (% of a core)",
            cpu,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Part 2: the data plane, Portcullis against a hand-written configuration

struct DpOptions {
    n: usize,
    hosts: usize,
    rounds: usize,
    secs: u64,
    conns: u64,
    backends: usize,
}

/// The `timeout`, `maxconn` and `nbthread` lines of the `global` and `defaults` sections.
fn shared_settings(cfg: &str) -> (Vec<String>, Vec<String>) {
    let (mut global, mut defaults) = (Vec::new(), Vec::new());
    let mut section = "";
    for line in cfg.lines() {
        if !line.starts_with([' ', '\t']) {
            section = line.split_whitespace().next().unwrap_or_default();
            continue;
        }
        let l = line.trim();
        let keep = l.starts_with("maxconn ") || l.starts_with("nbthread ");
        match section {
            "global" if keep => global.push(l.to_string()),
            "defaults" if keep || l.starts_with("timeout ") => defaults.push(l.to_string()),
            _ => {}
        }
    }
    (global, defaults)
}

/// The data plane's sides: Portcullis, its configuration without the request log, the
/// hand-written configuration with the log and headers ([`LOGGED_HAND`]), and the minimal one.
const DP_SIDES: usize = 4;
const LOGGED_HAND: &str = "hand-written with the same request log and X-Forwarded headers";

struct WrkResult {
    rps: f64,
    requests: f64,
    non2xx: u64,
    errors: u64,
}

fn wrk(port: u16, secs: u64, conns: u64, host: Option<&str>, script: Option<&Path>) -> WrkResult {
    let mut cmd = Command::new("wrk");
    cmd.args([
        "-t1",
        &format!("-c{conns}"),
        &format!("-d{secs}s"),
        "--timeout",
        "2s",
    ]);
    if let Some(h) = host {
        cmd.args(["-H", &format!("Host: {h}")]);
    }
    if let Some(s) = script {
        cmd.arg("-s").arg(s);
    }
    let out = cmd
        .arg(format!("http://127.0.0.1:{port}/"))
        .stdin(Stdio::null())
        .output()
        .expect("wrk runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "wrk failed: {text}");
    let after = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .map(str::trim)
    };
    let numbers = |s: &str| -> u64 {
        s.split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse::<u64>().ok())
            .sum()
    };
    WrkResult {
        rps: after("Requests/sec:")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no Requests/sec in {text}")),
        requests: text
            .lines()
            .find(|l| l.contains(" requests in "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN),
        non2xx: after("Non-2xx or 3xx responses:").map_or(0, numbers),
        errors: after("Socket errors:").map_or(0, numbers),
    }
}

/// One row of the data-plane table.
struct DpRow {
    scenario: &'static str,
    side: &'static str,
    rps: Vec<f64>,
    cpu_us: Vec<f64>,
    ctl_cpu_us: Vec<f64>,
    non2xx: u64,
    errors: u64,
}

fn measure_dataplane(opt: &Options, dp: &DpOptions) -> Vec<DpRow> {
    let k = opt.k;
    assert!((1..=100).contains(&k), "HSCALE_K must be 1..=100 here");
    let work = work_dir("hdp");
    // The backend: HAProxy answering itself, `backends` frontends on 127.0.1.1..k.
    let ports: Vec<u16> = (0..dp.backends).map(|_| free_port()).collect();
    let mut backend_cfg = String::from(
        "global\n  maxconn 4000\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 50s\n  timeout server 50s\n  timeout http-keep-alive 60s\n",
    );
    for (m, port) in ports.iter().enumerate() {
        let _ = writeln!(backend_cfg, "frontend echo{m}");
        for e in 0..k {
            let _ = writeln!(backend_cfg, "  bind 127.0.1.{}:{port}", e + 1);
        }
        let _ = writeln!(
            backend_cfg,
            "  http-request return status 200 content-type text/plain string \"echo{m} ok\""
        );
    }
    let backend = Haproxy::start(&opt.haproxy, work.path(), &backend_cfg, "backend.cfg");

    // The manifests: the synthetic cluster (no TLS) with every Service on the backend.
    let cfg = synth_config(opt.seed, dp.n, k, false);
    let cluster = synth::generate(&cfg).unwrap();
    let mut services: BTreeMap<Key, Vec<SocketAddr>> = BTreeMap::new();
    let mut lines = Vec::new();
    let mut annotated: HashSet<(Kind, Key)> = HashSet::new();
    let mut ingresses = Vec::new();
    for object in &cluster.objects {
        let mut value = object_value(object);
        let key = object.key();
        if object
            .metadata()
            .annotations
            .as_ref()
            .is_some_and(|a| !a.is_empty())
        {
            annotated.insert((object.kind(), key.clone()));
        }
        match object {
            Object::EndpointSlice(slice) => {
                let service = slice.service.clone().unwrap();
                let i: usize = service.trim_start_matches("app").parse().unwrap();
                let port = ports[i % ports.len()];
                let endpoints = value["endpoints"].as_array_mut().unwrap();
                for (e, endpoint) in endpoints.iter_mut().enumerate() {
                    endpoint["addresses"] = json!([format!("127.0.1.{}", e + 1)]);
                }
                let count = endpoints.len();
                value["ports"][0]["port"] = json!(port);
                let addrs = services
                    .entry(Key::new(key.namespace.clone(), service))
                    .or_default();
                for e in 0..count {
                    addrs.push(format!("127.0.1.{}:{port}", e + 1).parse().unwrap());
                }
            }
            Object::Ingress(ingress) => {
                let spec = ingress.spec.as_ref().unwrap();
                for rule in spec.rules.as_deref().unwrap_or_default() {
                    let service = rule.http.as_ref().unwrap().paths[0]
                        .backend
                        .service
                        .as_ref()
                        .unwrap()
                        .name
                        .clone();
                    ingresses.push((
                        rule.host.clone().unwrap(),
                        key.clone(),
                        Key::new(key.namespace.clone(), service),
                    ));
                }
            }
            _ => {}
        }
        lines.push(value.to_string());
    }
    // bench.local → bench/web on the first backend.
    let web: Vec<SocketAddr> = (0..k)
        .map(|e| format!("127.0.1.{}:{}", e + 1, ports[0]).parse().unwrap())
        .collect();
    let bench = [
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "bench", "namespace": "bench"},
            "spec": {"ingressClassName": "portcullis", "rules": [{"host": "bench.local", "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "bench"},
            "spec": {"ports": [{"port": 80}]}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-0", "namespace": "bench", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"port": ports[0]}],
            "endpoints": web.iter().map(|a| json!({"addresses": [a.ip().to_string()]})).collect::<Vec<_>>()}),
    ];
    lines.extend(bench.iter().map(Value::to_string));
    let bench_key = Key::new("bench", "web");
    services.insert(bench_key.clone(), web);
    ingresses.push((
        "bench.local".to_string(),
        Key::new("bench", "bench"),
        bench_key,
    ));
    let dir = work.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("00-dp.json"), json_lines(&lines)).unwrap();

    // The hosts measured: bench.local and the first synthetic hosts whose Ingress and Service
    // carry no annotation (so both configurations do the same thing for them).
    let expected = |service: &Key| -> String {
        let port = services[service][0].port();
        let m = ports.iter().position(|&p| p == port).unwrap();
        format!("echo{m} ok")
    };
    let mut subset: Vec<(String, String)> =
        vec![("bench.local".to_string(), "echo0 ok".to_string())];
    for (host, ingress, service) in &ingresses {
        if subset.len() > dp.hosts {
            break;
        }
        if !annotated.contains(&(Kind::Ingress, ingress.clone()))
            && !annotated.contains(&(Kind::Service, service.clone()))
            && host != "bench.local"
        {
            subset.push((host.clone(), expected(service)));
        }
    }

    // Portcullis.
    // The default log level: the controller passes on every request log line, as in
    // production (its output goes to /dev/null here).
    let ctl = Controller::start(&dir, work.path(), opt, "info");
    let t0 = Instant::now();
    while !ctl.ready() {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "data plane controller not ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let generated = std::fs::read_to_string(ctl.config_dir.join("haproxy.cfg")).unwrap();

    // The hand-written configuration.
    let (global, defaults) = shared_settings(&generated);
    let hand_port = free_port();
    let map_path = work.path().join("hosts.map");
    let backend_name = |key: &Key| format!("b_{}_{}", key.namespace, key.name);
    let mut map = String::new();
    for (host, _, service) in &ingresses {
        let _ = writeln!(map, "{host} {}", backend_name(service));
    }
    std::fs::write(&map_path, map).unwrap();
    // `logged`: the same request log as the generated configuration (`log stdout`, read from a
    // pipe) and the headers every Ingress gets (X-Forwarded-For and -Proto): what is left
    // between it and Portcullis is the routing by host and path.
    let hand_config = |port: u16, logged: bool| {
        let mut hand = String::from("global\n");
        for l in &global {
            let _ = writeln!(hand, "  {l}");
        }
        if logged {
            hand.push_str("  log stdout format raw local0 info\n");
        }
        hand.push_str("defaults\n  mode http\n");
        if logged {
            hand.push_str("  log global\n  option httplog\n  option forwardfor\n");
        }
        for l in &defaults {
            let _ = writeln!(hand, "  {l}");
        }
        let _ = writeln!(hand, "frontend http\n  bind 127.0.0.1:{port}");
        if logged {
            hand.push_str("  http-request set-header X-Forwarded-Proto http\n");
        }
        let _ = write!(
            hand,
            "  use_backend %[req.hdr(host),field(1,:),lower,map_str({},b_none)]\nbackend b_none\n",
            map_path.display()
        );
        for (key, servers) in &services {
            let _ = writeln!(hand, "backend {}\n  balance roundrobin", backend_name(key));
            for (s, addr) in servers.iter().enumerate() {
                let check = if opt.checks { " check" } else { "" };
                let _ = writeln!(hand, "  server s{s} {addr}{check}");
            }
        }
        hand
    };
    let hand = hand_config(hand_port, false);
    let reference = Haproxy::start(&opt.haproxy, work.path(), &hand, "hand.cfg");
    let logged_port = free_port();
    let logged = Haproxy::start_logging(
        &opt.haproxy,
        work.path(),
        &hand_config(logged_port, true),
        "hand-logged.cfg",
    );
    let nolog_port = free_port();
    progress!(
        "data plane: {} Ingresses, {} hosts routed, {} measured; Portcullis config {} lines, hand-written {} lines",
        dp.n,
        ingresses.len(),
        subset.len(),
        generated.lines().count(),
        hand.lines().count()
    );

    // The generated configuration once more, without request logging (the `log` lines and
    // `option httplog`), run by a plain HAProxy on other ports: what the logging costs.
    let nolog_dir = work.path().join("nolog");
    copy_dir(&ctl.config_dir, &nolog_dir);
    let mut nolog = String::new();
    for line in generated.lines() {
        let l = line.trim();
        if l.starts_with("log ") || l == "option httplog" || l.starts_with("stats socket ") {
            continue;
        }
        match l.strip_prefix("bind 127.0.0.1:") {
            Some(rest) => {
                let port: u16 = rest.split_whitespace().next().unwrap().parse().unwrap();
                let new = if port == ctl.http {
                    nolog_port
                } else {
                    free_port()
                };
                let _ = writeln!(
                    nolog,
                    "{}",
                    line.replacen(&format!(":{port}"), &format!(":{new}"), 1)
                );
            }
            None => {
                let _ = writeln!(nolog, "{line}");
            }
        }
    }
    let nolog = Haproxy::start(&opt.haproxy, &nolog_dir, &nolog, "haproxy.cfg");

    // Every side answers every measured host from the expected backend.
    // The minimal hand-written configuration, the reference of every ratio, is the last.
    let sides: [(&'static str, u16, u32); DP_SIDES] = [
        ("Portcullis", ctl.http, worker_pid(&ctl.master)),
        (
            "Portcullis config without request log",
            nolog_port,
            nolog.pid(),
        ),
        (LOGGED_HAND, logged_port, logged.pid()),
        ("hand-written", hand_port, reference.pid()),
    ];
    for (side, port, _) in sides {
        for (host, want) in &subset {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let got = get(port, host, "/");
                if got.as_ref().is_some_and(|(s, b)| *s == 200 && b == want) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{side}: {host} answered {got:?}, expected 200 {want:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let script = work.path().join("hosts.lua");
    let mut lua = String::from("local hosts = {");
    for (host, _) in &subset {
        let _ = write!(lua, "\"{host}\", ");
    }
    lua.push_str(
        "}\nlocal reqs = {}\nfor i, h in ipairs(hosts) do reqs[i] = wrk.format(\"GET\", \"/\", {[\"Host\"] = h}) end\nlocal n = 0\nrequest = function()\n  n = n % #reqs + 1\n  return reqs[n]\nend\n",
    );
    std::fs::write(&script, lua).unwrap();

    let scenarios: [(&'static str, Option<&str>, Option<&Path>); 2] = [
        ("bench.local only", Some("bench.local"), None),
        ("rotating over the hosts (Lua)", None, Some(&script)),
    ];
    let mut rows: Vec<DpRow> = Vec::new();
    for &(scenario, _, _) in &scenarios {
        for &(side, _, _) in &sides {
            rows.push(DpRow {
                scenario,
                side,
                rps: Vec::new(),
                cpu_us: Vec::new(),
                ctl_cpu_us: Vec::new(),
                non2xx: 0,
                errors: 0,
            });
        }
    }
    for round in 0..dp.rounds {
        for (s, (_, host, script)) in scenarios.iter().enumerate() {
            // Rotate which side goes first.
            for i in 0..sides.len() {
                let side = (i + round) % sides.len();
                let (_, port, pid) = sides[side];
                let (cpu0, ctl0) = (cpu_seconds(pid), cpu_seconds(ctl.pid()));
                let r = wrk(port, dp.secs, dp.conns, *host, *script);
                let (cpu, ctl_cpu) = (cpu_seconds(pid) - cpu0, cpu_seconds(ctl.pid()) - ctl0);
                let row = &mut rows[s * sides.len() + side];
                row.rps.push(r.rps);
                row.cpu_us.push(cpu / r.requests * 1e6);
                row.ctl_cpu_us.push(ctl_cpu / r.requests * 1e6);
                row.non2xx += r.non2xx;
                row.errors += r.errors;
                progress!(
                    "data plane round {round}: {} / {}: {:.0} req/s, HAProxy {:.1} µs CPU/req, non-2xx {}, socket errors {}",
                    row.scenario,
                    row.side,
                    r.rps,
                    cpu / r.requests * 1e6,
                    r.non2xx,
                    r.errors
                );
            }
        }
    }
    drop(ctl);
    drop(nolog);
    drop(logged);
    drop(reference);
    drop(backend);
    rows
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The SVG plot of the scale benchmark's figures

const PLOT_SERIES: [(&str, &str, &str); 4] = [
    ("full_ms", "full pipeline, cold", "#1f77b4"),
    ("endpoint_ms", "after 1 endpoint change", "#ff7f0e"),
    ("ingress_ms", "after 1 Ingress change", "#2ca02c"),
    ("script_ms", "after 1 script change", "#d62728"),
];
const RSS_COLOR: &str = "#9467bd";

/// 1 000, 10 000, 0.5: labels for log axes.
fn tick_label(v: f64) -> String {
    if v >= 1.0 {
        let digits = format!("{}", v.round() as u64);
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push('\u{2009}');
            }
            out.push(c);
        }
        out
    } else {
        format!("{v}")
    }
}

fn dash(k_index: usize) -> &'static str {
    ["", "7 4", "2 3", "10 3 2 3"][k_index % 4]
}

struct Series {
    color: &'static str,
    dash: &'static str,
    points: Vec<(f64, f64)>,
}

/// Decades covering `values` (positive).
fn decades(values: impl Iterator<Item = f64>) -> (i32, i32) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| *v > 0.0) {
        lo = lo.min(v.log10());
        hi = hi.max(v.log10());
    }
    let (lo, mut hi) = (lo.floor() as i32, hi.ceil() as i32);
    if hi <= lo {
        hi = lo + 1;
    }
    (lo, hi)
}

/// One log-log panel: the plot area is (x, y, w, h).
#[allow(clippy::too_many_arguments)]
fn panel(
    svg: &mut String,
    (x, y, w, h): (f64, f64, f64, f64),
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = decades(all().map(|p| p.0));
    let (y0, y1) = decades(all().map(|p| p.1));
    let sx = |v: f64| x + (v.log10() - f64::from(x0)) / f64::from(x1 - x0) * w;
    let sy = |v: f64| y + h - (v.log10() - f64::from(y0)) / f64::from(y1 - y0) * h;
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="15" font-weight="bold">{title}</text>"##,
        x + w / 2.0,
        y - 14.0
    );
    // Grid and ticks.
    for (lo, hi, vertical) in [(x0, x1, true), (y0, y1, false)] {
        for d in lo..=hi {
            for m in 1..10 {
                if d == hi && m > 1 {
                    break;
                }
                let v = f64::from(m) * 10f64.powi(d);
                let major = m == 1;
                let (stroke, width) = if major { ("#bbb", 1.0) } else { ("#eee", 1.0) };
                if vertical {
                    let px = sx(v);
                    let _ = writeln!(
                        svg,
                        r##"<line x1="{px:.1}" y1="{y:.1}" x2="{px:.1}" y2="{:.1}" stroke="{stroke}" stroke-width="{width}"/>"##,
                        y + h
                    );
                    let tick = if major { 6.0 } else { 3.0 };
                    let _ = writeln!(
                        svg,
                        r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#000"/>"##,
                        y + h,
                        y + h + tick
                    );
                    if major {
                        let _ = writeln!(
                            svg,
                            r##"<text x="{px:.1}" y="{:.1}" text-anchor="middle" font-size="12">{}</text>"##,
                            y + h + 20.0,
                            tick_label(v)
                        );
                    }
                } else {
                    let py = sy(v);
                    let _ = writeln!(
                        svg,
                        r##"<line x1="{x:.1}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="{stroke}" stroke-width="{width}"/>"##,
                        x + w
                    );
                    let tick = if major { 6.0 } else { 3.0 };
                    let _ = writeln!(
                        svg,
                        r##"<line x1="{:.1}" y1="{py:.1}" x2="{x:.1}" y2="{py:.1}" stroke="#000"/>"##,
                        x - tick
                    );
                    if major {
                        let _ = writeln!(
                            svg,
                            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="12">{}</text>"##,
                            x - 9.0,
                            py + 4.0,
                            tick_label(v)
                        );
                    }
                }
            }
        }
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#000"/>"##
    );
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13">{x_label}</text>"##,
        x + w / 2.0,
        y + h + 42.0
    );
    let _ = writeln!(
        svg,
        r##"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle" font-size="13">{y_label}</text>"##,
        x - 58.0,
        y + h / 2.0
    );
    for s in series {
        let points: Vec<String> = s
            .points
            .iter()
            .map(|&(a, b)| format!("{:.1},{:.1}", sx(a), sy(b)))
            .collect();
        let dash = if s.dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{}""#, s.dash)
        };
        let _ = writeln!(
            svg,
            r##"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"##,
            s.color,
            points.join(" ")
        );
        if s.color != "#888" {
            for &(a, b) in &s.points {
                let _ = writeln!(
                    svg,
                    r##"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}"/>"##,
                    sx(a),
                    sy(b),
                    s.color
                );
            }
        }
    }
}

fn plot(input: &Path, output: &Path) {
    let text = std::fs::read_to_string(input).unwrap();
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split(',').map(str::trim).collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("{} has no column {name}", input.display()))
    };
    let rows: Vec<Vec<f64>> = lines
        .map(|l| {
            l.split(',')
                .map(|v| v.trim().parse().expect("numbers"))
                .collect()
        })
        .collect();
    let (cn, ck, crss) = (col("N"), col("k"), col("rss_mib"));
    let mut ks: Vec<u64> = rows.iter().map(|r| r[ck] as u64).collect();
    ks.sort_unstable();
    ks.dedup();
    let points = |k: u64, c: usize| {
        let mut p: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r[ck] as u64 == k)
            .map(|r| (r[cn], r[c]))
            // A log scale has no place for 0 (a run under the CSV's precision).
            .filter(|p| p.1 > 0.0)
            .collect();
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        p
    };
    let mut time = Vec::new();
    for (ki, &k) in ks.iter().enumerate() {
        for (name, _, color) in PLOT_SERIES {
            time.push(Series {
                color,
                dash: dash(ki),
                points: points(k, col(name)),
            });
        }
    }
    // A reference line ∝ N through the first full-pipeline point.
    if let Some(first) = time.first().and_then(|s| s.points.first().copied()) {
        let last_n = rows.iter().map(|r| r[cn]).fold(first.0, f64::max);
        time.push(Series {
            color: "#888",
            dash: "2 4",
            points: vec![first, (last_n, first.1 * last_n / first.0)],
        });
    }
    let rss: Vec<Series> = ks
        .iter()
        .enumerate()
        .map(|(ki, &k)| Series {
            color: RSS_COLOR,
            dash: dash(ki),
            points: points(k, crss),
        })
        .collect();

    let (width, height) = (1120.0, 500.0);
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">
<rect width="100%" height="100%" fill="#fff"/>
<text x="{:.1}" y="26" text-anchor="middle" font-size="17">Portcullis pipeline scaling (benches/scale.rs, medians; log-log)</text>
"##,
        width / 2.0
    );
    panel(
        &mut svg,
        (90.0, 70.0, 430.0, 340.0),
        "Pipeline run time",
        "N (Ingresses)",
        "time (ms)",
        &time,
    );
    panel(
        &mut svg,
        (640.0, 70.0, 220.0, 340.0),
        "Peak RSS",
        "N (Ingresses)",
        "peak RSS (MiB)",
        &rss,
    );
    // Legend.
    let (lx, mut ly) = (890.0, 80.0);
    let mut entry = |svg: &mut String, color: &str, dash: &str, label: &str| {
        let d = if dash.is_empty() {
            String::new()
        } else {
            format!(r#" stroke-dasharray="{dash}""#)
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{d}/>"##,
            lx + 28.0
        );
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{}" font-size="12">{label}</text>"##,
            lx + 36.0,
            ly + 4.0
        );
        ly += 20.0;
    };
    for (_, label, color) in PLOT_SERIES {
        entry(&mut svg, color, "", label);
    }
    entry(&mut svg, RSS_COLOR, "", "peak RSS");
    for (ki, k) in ks.iter().enumerate() {
        entry(
            &mut svg,
            "#000",
            dash(ki),
            &format!("k = {k} endpoints/Service"),
        );
    }
    entry(&mut svg, "#888", "2 4", "\u{221d} N (reference)");
    svg.push_str("</svg>\n");
    std::fs::write(output, svg).unwrap();
    println!("wrote {}", output.display());
}

// ---------------------------------------------------------------------------------------------

fn main() {
    if let (Ok(input), Ok(output)) = (
        std::env::var("SCALE_PLOT_IN"),
        std::env::var("SCALE_PLOT_OUT"),
    ) {
        plot(Path::new(&input), Path::new(&output));
        return;
    }
    let ks = env_list("HSCALE_K", "3,20");
    let opt = Options {
        k: *ks.first().expect("HSCALE_K: at least one k"),
        ..Options::from_env()
    };
    let ns = env_list("HSCALE_N", "100,1000,10000");
    let out_dir = std::env::var("HSCALE_OUT").ok().map(PathBuf::from);
    let rt = Runtime::new().unwrap();
    let started = Instant::now();

    // HAProxy must start under this `nofile` limit (`HSCALE_NOFILE`, default 65536; 0 leaves
    // the limit as it is): set on this process, so every HAProxy the bench starts inherits it.
    // Where the hard limit is lower already, the lower one is kept: a stricter test.
    let nofile: u64 = env_num("HSCALE_NOFILE", 65536);
    if nofile > 0 {
        let limit = nofile.min(open_files_limit(std::process::id()).1);
        let set = Command::new("prlimit")
            .arg("--pid")
            .arg(std::process::id().to_string())
            .arg(format!("--nofile={limit}:{limit}"))
            .status();
        assert!(
            set.is_ok_and(|s| s.success()),
            "prlimit --nofile={limit} failed (util-linux; or set HSCALE_NOFILE=0)"
        );
        progress!("nofile limit {limit} (asked for {nofile})");
    }
    let modes: Vec<&'static str> = std::env::var("HSCALE_MODES")
        .unwrap_or_else(|_| "slots,dynamic".to_string())
        .split(',')
        .map(|m| match m.trim() {
            "slots" => "slots",
            "dynamic" => "dynamic",
            other => panic!("HSCALE_MODES: {other:?} is neither slots nor dynamic"),
        })
        .collect();
    let mut measured = Vec::new();
    for &k in &ks {
        for &n in &ns {
            for &mode in &modes {
                let opt = Options {
                    k,
                    mode,
                    ..opt.clone()
                };
                let t = Instant::now();
                measured.push(measure_scale(&rt, n, &opt));
                progress!(
                    "N={n} k={k} {mode}: done in {:.0} s",
                    t.elapsed().as_secs_f64()
                );
            }
        }
    }

    let dp_opt = DpOptions {
        n: env_num("HSCALE_DP_N", 1000),
        hosts: env_num("HSCALE_DP_HOSTS", 20),
        rounds: env_num("HSCALE_DP_ROUNDS", 5).max(1),
        secs: env_num("HSCALE_DP_SECS", 5).max(1),
        conns: env_num("HSCALE_DP_CONNS", 32).max(1),
        backends: env_num("HSCALE_DP_BACKENDS", 4).max(1),
    };
    let wrk_found = Command::new("wrk")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let dp = if env_num("HSCALE_DP", 1) == 0 {
        None
    } else if !wrk_found {
        progress!("data plane skipped: wrk not found (apt-get install -y wrk)");
        None
    } else {
        Some(measure_dataplane(&opt, &dp_opt))
    };

    // Report.
    println!(
        "HAProxy-side scale benchmark: seed {}, debounce {}, data plane at k = {}, release build; `haproxy -v`: {}",
        opt.seed,
        opt.debounce,
        opt.k,
        Command::new(&opt.haproxy)
            .arg("-v")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string())
            .unwrap_or_default()
    );
    println!();
    if let Some(first) = measured.first() {
        let mut header = String::from("| figure |");
        let mut rule = String::from("|---|");
        for f in &measured {
            let _ = write!(
                header,
                " N = {}, k = {}, {} |",
                f.0[0].2, f.0[1].2, f.0[2].2
            );
            rule.push_str("---:|");
        }
        println!("{header}\n{rule}");
        for (i, (_, label, _)) in first.0.iter().enumerate().skip(3) {
            let mut line = format!("| {label} |");
            for f in &measured {
                let _ = write!(line, " {} |", f.0.get(i).map_or("", |v| v.2.as_str()));
            }
            println!("{line}");
        }
        println!();
    }
    if let Some(rows) = &dp {
        println!(
            "Data plane: `wrk -t1 -c{} -d{}s`, {} alternating rounds per side; N = {} synthetic Ingresses + bench.local, every Service on a backend HAProxy answering itself",
            dp_opt.conns, dp_opt.secs, dp_opt.rounds, dp_opt.n
        );
        println!();
        println!(
            "| scenario | side | req/s (median) | HAProxy CPU µs/request (median) | controller CPU µs/request (median) | non-2xx | socket errors |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|");
        for r in rows {
            println!(
                "| {} | {} | {:.0} | {:.1} | {:.2} | {} | {} |",
                r.scenario,
                r.side,
                median(&r.rps),
                median(&r.cpu_us),
                median(&r.ctl_cpu_us),
                r.non2xx,
                r.errors
            );
        }
        // Each round runs the sides one after the other, so the ratio within a round is taken
        // in the same minute: its median over the rounds cancels the machine's slower and
        // faster minutes, which the ratio of the two sides' medians does not.
        println!();
        println!(
            "| scenario | ratio | req/s: median of the rounds' ratios | req/s: ratio of the medians | HAProxy CPU per request: ratio of the medians |"
        );
        println!("|---|---|---:|---:|---:|");
        let ratio = |r: &DpRow, to: &DpRow| {
            let rounds: Vec<f64> = r.rps.iter().zip(&to.rps).map(|(a, b)| a / b).collect();
            println!(
                "| {} | {} ÷ {} | **{:.3}** | {:.3} | {:.3} |",
                r.scenario,
                r.side,
                to.side,
                median(&rounds),
                median(&r.rps) / median(&to.rps),
                median(&r.cpu_us) / median(&to.cpu_us)
            );
        };
        for group in rows.chunks(DP_SIDES) {
            let (reference, others) = group.split_last().unwrap();
            for r in others {
                ratio(r, reference);
            }
            // What routing by host and path costs, the log and headers on both sides.
            let logged = group.iter().find(|r| r.side == LOGGED_HAND).unwrap();
            ratio(&group[0], logged);
        }
        println!();
    }
    progress!("total {:.0} s", started.elapsed().as_secs_f64());

    if let Some(dir) = out_dir {
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(first) = measured.first() {
            let mut csv = first.0.iter().map(|v| v.0).collect::<Vec<_>>().join(",");
            csv.push('\n');
            for f in &measured {
                let row: Vec<String> =
                    f.0.iter()
                        .map(|v| {
                            if v.2.contains([',', '"', ' ']) {
                                format!("\"{}\"", v.2.replace('"', "\"\""))
                            } else {
                                v.2.clone()
                            }
                        })
                        .collect();
                csv.push_str(&row.join(","));
                csv.push('\n');
            }
            std::fs::write(dir.join("haproxy-scale.csv"), csv).unwrap();
        }
        if let Some(rows) = &dp {
            let mut csv = String::from(
                "scenario,side,runs,rps_median,haproxy_cpu_us_per_req_median,controller_cpu_us_per_req_median,non2xx,socket_errors,rps_samples\n",
            );
            for r in rows {
                let _ = writeln!(
                    csv,
                    "\"{}\",{},{},{:.1},{:.2},{:.3},{},{},\"{}\"",
                    r.scenario,
                    r.side,
                    r.rps.len(),
                    median(&r.rps),
                    median(&r.cpu_us),
                    median(&r.ctl_cpu_us),
                    r.non2xx,
                    r.errors,
                    r.rps
                        .iter()
                        .map(|v| format!("{v:.0}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
            std::fs::write(dir.join("haproxy-dataplane.csv"), csv).unwrap();
        }
        progress!("figures written to {}", dir.display());
    }
}
