//! Tools built on the controller rather than parts of it. The third, the seeded synthetic
//! cluster of the benchmarks and tests, is pure and lives in the core (`synth`).

/// `portcullis admission-policy`: the declared annotations as a ValidatingAdmissionPolicy.
pub mod admission_policy;
/// `portcullis annotations list`: the declared annotations and ConfigMap keys.
pub mod annotations;
/// `portcullis demo`: echo servers standing in for the quickstart's pods.
pub mod demo;
/// `portcullis test`: a site author's test kit for scripts and templates.
pub mod sitetest;
