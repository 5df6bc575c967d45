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
/// `portcullis webhook`: admission reviews answered from one object and the scripts.
pub mod admission;
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
/// benchmarks). A pipeline run allocates and frees millions of small objects, which glibc's
/// allocator serves at about twice the cost. mimalloc's version 2 (`v2`) holds no more memory
/// at its peak than glibc's; `no_thp` keeps it from asking for transparent huge pages, whose
/// partly used 2 MiB pages would be held for nothing. Figures: docs/performance.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
