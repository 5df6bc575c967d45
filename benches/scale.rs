//! Scale benchmark: the pure pipeline (store → translate + Rhai policy → model → render) on a
//! synthetic cluster (`portcullis::synth`) of N Ingresses with k endpoints per Service.
//!
//! Run: `cargo bench --bench scale`. Environment:
//! - `SCALE_N` (default `100,1000,10000`) and `SCALE_K` (default `3,20`): the sizes; every
//!   pair is measured;
//! - `SCALE_RUNS` (default 5): runs per figure; the table shows medians;
//! - `SCALE_SEED` (default 1): the generator's seed;
//! - `SCALE_SKIP` (default empty): `N:k` pairs to leave out, comma-separated;
//! - `SCALE_CSV` (default unset): also write the medians to this file as CSV (`N,k,full_ms,
//!   endpoint_ms,ingress_ms,script_ms,rss_mib`), which `benches/haproxy_scale.rs`'s plot mode
//!   draws (`docs/perf/scale.csv` → `docs/perf/scaling.svg`).
//!
//! Per size it reports:
//! 1. full pipeline, cold: `Store::from_objects` + `Pipeline::run_with` on the whole cluster;
//! 2. the run that follows one change: an EndpointSlice (one pod moved), an Ingress (one more
//!    path and another `timeout-server`), a script (a site copy of `pod-maxconn.rhai` with one
//!    more comment line, so `source::site::load_pipeline` + `keep_memo_of` + `run_with`), each on a
//!    pipeline that has run before (its hook memo warm, as in `portcullis run`);
//! 3. peak resident memory (`VmHWM`) of a fresh process that generates the cluster, builds the
//!    store, loads the pipeline and runs it once: this binary re-executed with
//!    `SCALE_CHILD=N,k`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::panic
)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use portcullis::pipeline::Pipeline;
use portcullis::store::Store;
use portcullis::synth::{self, SynthConfig, TlsPem};
use portcullis::translate::{RunInputs, TranslateConfig};

mod support;
use support::{env_list, env_num, script_change_runs};

fn config(seed: u64, n: usize, k: usize) -> SynthConfig {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    SynthConfig {
        tls: Some(TlsPem {
            cert: std::fs::read_to_string(dir.join("ec.crt")).unwrap(),
            key: std::fs::read_to_string(dir.join("ec.key")).unwrap(),
        }),
        ..SynthConfig::new(seed, n, k)
    }
}

fn load() -> Pipeline {
    Pipeline::load(None, None, TranslateConfig::default()).unwrap()
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e3
}

fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_default()
}

/// Child mode: build the state once and report the peak RSS.
fn child(spec: &str, seed: u64) {
    let (n, k) = spec.split_once(',').expect("SCALE_CHILD=N,k");
    let cfg = config(seed, n.parse().unwrap(), k.parse().unwrap());
    let cluster = synth::generate(&cfg).unwrap();
    let store = Store::from_objects(cluster.objects);
    let pipeline = load();
    let (output, _) = pipeline.run_with(&store, &RunInputs::default()).unwrap();
    // Counted piece by piece: a copy of haproxy.cfg would be part of the peak.
    let lines: usize = output.rendered.files()[portcullis::render::CONFIG_FILE]
        .pieces()
        .map(|piece| piece.iter().filter(|b| **b == b'\n').count())
        .sum();
    println!(
        "VmHWM {} VmRSS {} lines {lines}",
        proc_status_kib("VmHWM:"),
        proc_status_kib("VmRSS:"),
    );
}

fn peak_rss_mib(n: usize, k: usize, seed: u64) -> f64 {
    let out = Command::new(std::env::current_exe().unwrap())
        .env("SCALE_CHILD", format!("{n},{k}"))
        .env("SCALE_SEED", seed.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "child failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let kib: f64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unexpected child output {text:?}"));
    kib / 1024.0
}

struct Row {
    n: usize,
    k: usize,
    objects: usize,
    hosts: usize,
    paths: usize,
    endpoints: usize,
    cfg_lines: usize,
    diagnostics: usize,
    full: f64,
    endpoint: f64,
    ingress: f64,
    script: f64,
    rss: f64,
}

fn measure(n: usize, k: usize, runs: u64, seed: u64) -> Row {
    let cfg = config(seed, n, k);
    let t = Instant::now();
    let cluster = synth::generate(&cfg).unwrap();
    eprintln!(
        "N={n} k={k}: generated {} objects in {:.0} ms",
        cluster.objects.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let inputs = RunInputs::default();

    // 1. Cold: a new store from every object, then the whole pipeline, with freshly compiled
    // scripts (compiling is not timed) and so an empty memo.
    let mut full = Vec::new();
    let mut first = None;
    for _ in 0..runs {
        let objects = cluster.objects.clone();
        let pipeline = load();
        let t = Instant::now();
        let store = Store::from_objects(objects);
        let (output, _) = pipeline.run_with(&store, &inputs).unwrap();
        full.push(t.elapsed());
        first.get_or_insert((
            output.rendered.haproxy_cfg().lines().count(),
            output.diagnostics.len(),
            output
                .diagnostics
                .iter()
                .take(3)
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
        ));
    }
    let (cfg_lines, diagnostics, samples) = first.unwrap();
    for d in samples {
        eprintln!("  diagnostic: {d}");
    }

    // 2. One change, then the run that follows it, as `portcullis run` does it: the same
    // pipeline, whose memo holds the previous run's hook results.
    let pipeline = load();
    let mut store = Store::from_objects(cluster.objects.clone());
    drop(pipeline.run_with(&store, &inputs).unwrap());
    let mut endpoint = Vec::new();
    let mut ingress = Vec::new();
    for r in 1..=runs {
        let i = usize::try_from(r * 7919).unwrap() % n;
        let slice = synth::changed_endpoint_slice(&cfg, i, r).unwrap().unwrap();
        let t = Instant::now();
        store.upsert(slice);
        let (output, _) = pipeline.run_with(&store, &inputs).unwrap();
        endpoint.push(t.elapsed());
        drop(output);

        let changed = synth::changed_ingress(&cfg, i, r).unwrap();
        let t = Instant::now();
        store.upsert(changed);
        let (output, _) = pipeline.run_with(&store, &inputs).unwrap();
        ingress.push(t.elapsed());
        drop(output);
    }
    // What `run` does when a site script changes (see `support::script_change_runs`).
    let (pipeline, script) =
        script_change_runs(pipeline, &store, &inputs, usize::try_from(runs).unwrap());
    drop(pipeline);

    // 3. Peak RSS of a fresh process holding this state.
    let rss = peak_rss_mib(n, k, seed);
    Row {
        n,
        k,
        objects: cluster.objects.len(),
        hosts: cluster.hosts,
        paths: cluster.paths,
        endpoints: cluster.endpoints,
        cfg_lines,
        diagnostics,
        full: median(full),
        endpoint: median(endpoint),
        ingress: median(ingress),
        script: median(script),
        rss,
    }
}

fn main() {
    let seed = env_num("SCALE_SEED", 1);
    if let Ok(spec) = std::env::var("SCALE_CHILD") {
        child(&spec, seed);
        return;
    }
    let ns = env_list("SCALE_N", "100,1000,10000");
    let ks = env_list("SCALE_K", "3,20");
    let runs = env_num("SCALE_RUNS", 5).max(1);
    let skip: Vec<String> = std::env::var("SCALE_SKIP")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let started = Instant::now();
    let mut rows = Vec::new();
    for &k in &ks {
        for &n in &ns {
            if skip.contains(&format!("{n}:{k}")) {
                eprintln!("N={n} k={k}: skipped (SCALE_SKIP)");
                continue;
            }
            rows.push(measure(n, k, runs, seed));
        }
    }
    println!(
        "scale benchmark, seed {seed}, medians of {runs} runs, release build; times in ms, memory in MiB"
    );
    println!();
    println!(
        "| N | k | objects | hosts / paths | endpoints | haproxy.cfg lines | diagnostics | full, cold | after 1 endpoint change | after 1 Ingress change | after 1 script change | full ms per 1 000 Ingresses | peak RSS |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} / {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.n,
            r.k,
            r.objects,
            r.hosts,
            r.paths,
            r.endpoints,
            r.cfg_lines,
            r.diagnostics,
            r.full,
            r.endpoint,
            r.ingress,
            r.script,
            r.full / r.n as f64 * 1000.0,
            r.rss
        );
    }
    println!();
    println!(
        "\"after a change\": Store::upsert of the change, then the run as `portcullis run` does it: hook results of unchanged inputs from the memo, unchanged Ingresses and backends from the last run's parts, unchanged backend sections from the renderer's memory (see docs/performance.md)."
    );
    if let Ok(path) = std::env::var("SCALE_CSV") {
        let mut csv = String::from("N,k,full_ms,endpoint_ms,ingress_ms,script_ms,rss_mib\n");
        for r in &rows {
            csv.push_str(&format!(
                "{},{},{:.3},{:.3},{:.3},{:.3},{:.1}\n",
                r.n, r.k, r.full, r.endpoint, r.ingress, r.script, r.rss
            ));
        }
        std::fs::write(&path, csv).unwrap_or_else(|e| panic!("writing {path}: {e}"));
        eprintln!("wrote {path}");
    }
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}
