//! Workers never change an outcome: a pipeline that translates Ingresses ahead on worker
//! threads (`portcullis::parallel`) gives exactly what one translating them in turn gives —
//! the same files, model and diagnostics — on every golden case, on seeded synthetic clusters
//! before and after changes, and when the run's operation budget runs out part of the way.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use portcullis::parallel::Workers;
use portcullis::pipeline::Pipeline;
use portcullis::policy::PolicyEngine;
use portcullis::source::files::load_dir;
use portcullis::store::Store;
use portcullis::synth::{self, SynthConfig, TlsPem};
use portcullis::translate::memo::Memo;
use portcullis::translate::parts::Carried;
use portcullis::translate::{RunInputs, TranslateConfig, translate};

#[path = "support/golden.rs"]
mod golden;
use golden::{case_config, golden_cases, summary};

/// `config` with one thread (every item in turn), or `threads` that start at one item.
fn with_workers(config: &TranslateConfig, threads: usize) -> TranslateConfig {
    TranslateConfig {
        workers: Workers {
            threads,
            min_items: 1,
        },
        ..config.clone()
    }
}

#[test]
fn workers_give_what_one_thread_gives_on_every_golden_case() {
    let cases = golden_cases();
    assert!(cases.len() >= 15);
    for dir in &cases {
        let store = Store::from_objects(load_dir(dir).unwrap().objects);
        let config = case_config(dir);
        let alone = Pipeline::load(None, None, with_workers(&config, 1)).unwrap();
        let workers = Pipeline::load(None, None, with_workers(&config, 4)).unwrap();
        assert_eq!(
            summary(&workers.run(&store).unwrap()),
            summary(&alone.run(&store).unwrap()),
            "{}",
            dir.display()
        );
    }
}

fn tls_synth(seed: u64, ingresses: usize) -> SynthConfig {
    let tls = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    SynthConfig {
        tls: Some(TlsPem {
            cert: std::fs::read_to_string(tls.join("ec.crt")).unwrap(),
            key: std::fs::read_to_string(tls.join("ec.key")).unwrap(),
        }),
        ..SynthConfig::new(seed, ingresses, 3)
    }
}

#[test]
fn workers_give_what_one_thread_gives_on_synthetic_clusters_and_after_changes() {
    let config = TranslateConfig {
        watch_ingress_without_class: true,
        ..TranslateConfig::default()
    };
    for seed in [1, 2] {
        let synth_config = tls_synth(seed, 200);
        let mut store = Store::from_objects(synth::generate(&synth_config).unwrap().objects);
        let alone = Pipeline::load(None, None, with_workers(&config, 1)).unwrap();
        let workers = Pipeline::load(None, None, with_workers(&config, 4)).unwrap();
        let check = |store: &Store, what: &str| {
            assert_eq!(
                summary(&workers.run(store).unwrap()),
                summary(&alone.run(store).unwrap()),
                "seed {seed}: {what}"
            );
        };
        check(&store, "cold");
        for round in 1..4_u64 {
            for i in [7, 70, 140 + usize::try_from(round).unwrap()] {
                store.upsert(synth::changed_ingress(&synth_config, i, round).unwrap());
            }
            check(&store, &format!("Ingress changes, round {round}"));
        }
    }
}

#[test]
fn workers_give_what_one_thread_gives_when_the_run_budget_runs_out() {
    let config = TranslateConfig {
        watch_ingress_without_class: true,
        ..TranslateConfig::default()
    };
    let synth_config = tls_synth(3, 120);
    let store = Store::from_objects(synth::generate(&synth_config).unwrap().objects);
    // What a whole run's hooks use.
    let whole = translate(
        &store,
        &with_workers(&config, 1),
        &PolicyEngine::load(None).unwrap(),
        &RunInputs::default(),
        &Memo::default(),
        None,
        Carried::default(),
    )
    .budget
    .spent();
    assert!(whole > 1000, "{whole}");
    // Out among the Ingresses, and among the backends (assembled after them).
    for (budget, out_at) in [(whole / 2, "route()"), (whole - whole / 20, "backend()")] {
        let budgeted = |workers: usize| {
            let mut pipeline = Pipeline::load(None, None, with_workers(&config, workers)).unwrap();
            pipeline.policy = PolicyEngine::load(None).unwrap().with_run_budget(budget);
            summary(&pipeline.run(&store).unwrap())
        };
        let alone = budgeted(1);
        assert!(
            alone
                .2
                .iter()
                .any(|d| d.contains("budget") && d.contains(out_at)),
            "the budget of {budget} ran out in {out_at}: {:?}",
            alone.2
        );
        assert_eq!(budgeted(4), alone, "budget {budget} of {whole}");
    }
}
