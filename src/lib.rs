//! Portcullis: a Kubernetes ingress controller for HAProxy.
//!
//! The pipeline itself — store → translate (+ policy) → model → render → plan — is the
//! `portcullis-core` crate (`src/core`), pure and re-exported here under the same names. This
//! crate is what runs around it, in the order an event travels:

pub use portcullis_core::{
    attribution, diagnostics, fingerprint, layers, model, objects, parallel, pipeline, plan,
    policy, render, snippets, store, synth, translate, values,
};

/// The admin endpoint: health, readiness, metrics, debug pages.
pub mod admin;
/// Writing files and talking to HAProxy to carry out a plan.
pub mod apply;
/// `haproxy -c` on a rendered configuration.
pub mod check;
/// The command line.
pub mod cli;
/// The Kubernetes API: watches, leases, status and Events.
pub mod cluster;
/// The controller loop: debounce, run the pipeline, apply, report.
pub mod controller;
/// The TCP custom resource's definition.
pub mod crd;
/// ExternalName Services' names resolved, and refused where they point inward.
pub mod external_names;
/// HAProxy itself: its process, its master CLI and runtime API.
pub mod haproxy;
pub(crate) mod http1;
/// HAProxy's log lines as tracing events.
pub mod logwriter;
/// Prometheus metrics.
pub mod metrics;
/// Where objects come from: a directory of manifests, or the cluster (`cluster`).
pub mod source;

/// Tools built on the controller: the quickstart's echo servers, the site test kit.
pub mod tools;

/// The allocator of every program built on this crate (the controller, its tests and
/// benchmarks). A pipeline run allocates and frees millions of small objects; with glibc's
/// allocator a run after an Ingress change at 10 000 Ingresses spent half its time in
/// `malloc` and `free`, and took twice as long as with mimalloc. mimalloc's version 2 (the
/// `v2` feature) peaks at about the memory glibc's does; version 3 held 18 MiB more there
/// ([docs/performance.md](../docs/performance.md)). The `no_thp` feature stops it asking the
/// kernel for transparent huge pages (`MADV_HUGEPAGE`): 2 MiB pages partly used held about
/// 12 MiB more at 10 000 Ingresses, for a cold run some 7 % faster.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
