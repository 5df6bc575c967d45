//! Portcullis: a Kubernetes ingress controller for HAProxy.
//!
//! Data flows one way: `source` → `store` → `translate` (+ `policy`) → `model` → `render`.
//! Everything from `store` to `render` is pure: it takes a snapshot and returns data.

pub mod admin;
pub mod apply;
pub mod attribution;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod controller;
pub mod crd;
pub mod demo;
pub mod diagnostics;
pub mod external_names;
pub mod fingerprint;
pub mod haproxy;
pub(crate) mod http1;
pub mod layers;
pub mod logwriter;
pub mod metrics;
pub mod model;
pub mod objects;
pub mod parallel;
pub mod pipeline;
pub mod policy;
pub mod render;
pub mod sitetest;
pub mod snippets;
pub mod source;
pub mod store;
pub mod synth;
pub mod translate;
pub mod values;

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
