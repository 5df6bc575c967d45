//! Portcullis: a Kubernetes ingress controller for HAProxy.
//!
//! Data flows one way: `source` → `store` → `translate` (+ `policy`) → `model` → `render`.
//! Everything from `store` to `render` is pure: it takes a snapshot and returns data.

pub mod admin;
pub mod apply;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod controller;
pub mod crd;
pub mod demo;
pub mod diagnostics;
pub mod fingerprint;
pub mod haproxy;
pub mod layers;
pub mod metrics;
pub mod model;
pub mod objects;
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
