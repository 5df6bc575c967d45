//! Runs after changes, one after the other, for counting instructions: the same pipeline and
//! synthetic cluster as `benches/scale.rs` (N Ingresses, k = 3, TLS on a share of hosts), a
//! cold run, then `CHANGE_RUNS_ROUNDS` changes each followed by a run, all inside
//! `change_rounds`, so that callgrind can count those runs alone. Instruction counts are the
//! same for the same binary and inputs, where this machine's wall clock moves by a third.
//!
//! ```text
//! cargo bench --bench change_runs --no-run          # prints the binary's path
//! CHANGE_RUNS_N=10000 CHANGE_RUNS_ROUNDS=4 valgrind --tool=callgrind --collect-atstart=no \
//!     --toggle-collect='*change_rounds*' target/release/deps/change_runs-<hash>
//! callgrind_annotate --inclusive=yes callgrind.out.<pid> | grep portcullis::
//! ```
//!
//! `--toggle-collect='*cold_run*'` counts the first run instead (nothing remembered: every
//! Ingress translated, every section rendered).
//!
//! `CHANGE_RUNS_WHAT=endpoint` moves one pod per change instead of adding a path (and another
//! `timeout-server`) to an Ingress; `CHANGE_RUNS_WHAT=script` changes a site copy of
//! `pod-maxconn.rhai` by a comment line, then loads the scripts and templates again and runs,
//! as `run` does (count those runs with `--toggle-collect='*script_rounds*'`). Without
//! valgrind it prints the runs' wall-clock times.
//! For line-level profiles, build with `CARGO_PROFILE_BENCH_DEBUG=line-tables-only`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::panic
)]

use std::time::Instant;

use portcullis::pipeline::{Pipeline, RunReport};
use portcullis::store::Store;
use portcullis::synth::{self, SynthConfig, TlsPem};
use portcullis::translate::{RunInputs, TranslateConfig};

mod support;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The measured runs: change `rounds` objects, running the pipeline after each. Their
/// times in milliseconds and the paths they took.
#[inline(never)]
fn change_rounds(
    pipeline: &Pipeline,
    store: &mut Store,
    cfg: &SynthConfig,
    rounds: usize,
    endpoints: bool,
) -> (Vec<f64>, Vec<RunReport>) {
    let inputs = RunInputs::default();
    let mut times = Vec::with_capacity(rounds);
    let mut reports = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        // Spread over the cluster, the same objects for the same N.
        let i = (round * 7919) % cfg.ingresses;
        let generation = u64::try_from(round).unwrap();
        let changed = if endpoints {
            synth::changed_endpoint_slice(cfg, i, generation)
                .unwrap()
                .expect("every Service has an EndpointSlice")
        } else {
            synth::changed_ingress(cfg, i, generation).unwrap()
        };
        let started = Instant::now();
        store.upsert(changed);
        let (output, report) = pipeline.run_with(store, &inputs).unwrap();
        drop(output);
        times.push(started.elapsed().as_secs_f64() * 1e3);
        reports.push(report);
    }
    (times, reports)
}

/// The measured runs after site script changes (`support::script_change_runs`), in
/// milliseconds.
#[inline(never)]
fn script_rounds(pipeline: Pipeline, store: &Store, rounds: usize) -> Vec<f64> {
    let (_, times) = support::script_change_runs(pipeline, store, &RunInputs::default(), rounds);
    times.iter().map(|t| t.as_secs_f64() * 1e3).collect()
}

/// The first run, with nothing remembered: its wall-clock time in milliseconds.
#[inline(never)]
fn cold_run(pipeline: &Pipeline, store: &Store) -> f64 {
    let started = Instant::now();
    drop(pipeline.run_with(store, &RunInputs::default()).unwrap());
    started.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let n = env("CHANGE_RUNS_N", 10_000);
    let rounds = env("CHANGE_RUNS_ROUNDS", 4).max(1);
    let what = std::env::var("CHANGE_RUNS_WHAT").unwrap_or_default();
    let endpoints = what == "endpoint";
    let tls = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    let cfg = SynthConfig {
        tls: Some(TlsPem {
            cert: std::fs::read_to_string(tls.join("ec.crt")).unwrap(),
            key: std::fs::read_to_string(tls.join("ec.key")).unwrap(),
        }),
        ..SynthConfig::new(1, n, 3)
    };
    let cluster = synth::generate(&cfg).unwrap();
    let pipeline = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    let mut store = Store::from_objects(cluster.objects);
    let cold = cold_run(&pipeline, &store);
    if what == "script" {
        let mut times = script_rounds(pipeline, &store, rounds);
        times.sort_by(f64::total_cmp);
        println!(
            "N = {n}: cold {cold:.1} ms; {rounds} script changes: median {:.1} ms, min {:.1}, max {:.1}",
            times[times.len() / 2],
            times[0],
            times[times.len() - 1],
        );
        return;
    }
    let (mut times, reports) = change_rounds(&pipeline, &mut store, &cfg, rounds, endpoints);
    times.sort_by(f64::total_cmp);
    let count = |path: &str| reports.iter().filter(|r| r.path() == path).count();
    println!(
        "N = {n}: cold {cold:.1} ms; {rounds} {} changes: median {:.1} ms, min {:.1}, max {:.1}; runs that took unchanged parts {}, patched haproxy.cfg {}, endpoint path {}",
        if endpoints { "endpoint" } else { "Ingress" },
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        count("parts"),
        reports.iter().filter(|r| r.patched()).count(),
        count("endpoints"),
    );
}
