//! `portcullis webhook`: a validating admission webhook for what the generated
//! ValidatingAdmissionPolicy cannot express. It answers from one object and the scripts, never
//! renders a configuration, never runs HAProxy and reads no Secrets ([admission.md]).
//!
//! [admission.md]: ../../docs/admission.md

pub mod review;
pub mod server;
