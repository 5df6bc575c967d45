//! Portcullis' core: the pipeline from a snapshot of the cluster to the plan that moves HAProxy
//! to it, as plain functions over plain data. No tokio, no kube, no network or processes: the
//! controller crate around it watches, applies and serves; this crate only decides.
//!
//! The stages, in the order data flows through them:

/// HAProxy's refusal of a configuration traced back to the objects that produced it.
pub mod attribution;
/// The desired HAProxy as plain data.
pub mod model;
/// Kubernetes objects as the sources hand them over: parsed, named, validated once.
pub mod objects;
/// One call from snapshot to rendered configuration (translate, then render), reusing what
/// an earlier run computed from the same inputs.
pub mod pipeline;
/// What it takes to move HAProxy from the configuration in force to the next: runtime commands
/// or a reload, and why.
pub mod plan;
/// What annotations mean: the Rhai hooks, bundled and site, run under an operation budget.
pub mod policy;
/// The model through minijinja templates to haproxy.cfg, map files and certificates.
pub mod render;
/// Every watched object by kind and name, shared between runs, with a journal of changes.
pub mod store;
/// A store snapshot to the model: which Ingresses are ours, routes, backends, certificates.
pub mod translate;
/// Annotations and ConfigMap keys read through typed parsers; refused values explained.
pub mod values;

// Shared by the stages.

/// What went wrong with which object and field, collected instead of aborting.
pub mod diagnostics;
/// Content fingerprints for the caches that skip unchanged work.
pub mod fingerprint;
/// Bundled files overlaid by a site's (scripts and templates).
pub mod layers;
/// Whole-cluster steps spread over worker threads, with the same output for any number.
pub mod parallel;
/// The rules raw configuration snippets pass, when an administrator allows them.
pub mod snippets;

// A tool: seeded synthetic clusters for the benchmarks and the tests.
pub mod synth;
