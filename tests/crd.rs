//! The committed CRD of the TCP resource is what `portcullis crd` prints: the YAML cannot
//! drift from the Rust types it is generated from (src/crd.rs; the unit tests there show that
//! a field added to the types changes the output).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

const COMMITTED: &str = "deploy/base/crd-tcp.yaml";

#[test]
fn the_committed_crd_is_what_portcullis_crd_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .arg("crd")
        .output()
        .expect("run portcullis crd");
    assert!(
        out.status.success(),
        "portcullis crd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8(out.stdout).expect("UTF-8 output");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(COMMITTED);
    let committed = std::fs::read_to_string(&path).expect("read the committed CRD");
    if generated != committed {
        let first = generated
            .lines()
            .zip(committed.lines())
            .position(|(g, c)| g != c)
            .unwrap_or_else(|| generated.lines().count().min(committed.lines().count()));
        panic!(
            "{COMMITTED} differs from `portcullis crd` (first at line {}): the TCP types changed \
             without regenerating it. Run\n    cargo run -q -- crd > {COMMITTED}\n\
             generated:\n{generated}",
            first + 1
        );
    }
}

#[test]
fn the_library_generates_the_committed_crd() {
    let yaml = portcullis::crd::tcp_crd_yaml().expect("generate the CRD");
    let committed = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(COMMITTED))
        .expect("read the committed CRD");
    assert!(
        yaml == committed,
        "{COMMITTED} differs from the generated CRD: run\n    cargo run -q -- crd > {COMMITTED}"
    );
    let value: serde_json::Value = serde_saphyr::from_str(&yaml).expect("the CRD is YAML");
    assert_eq!(value["kind"].as_str(), Some("CustomResourceDefinition"));
    assert_eq!(
        value["metadata"]["name"].as_str(),
        Some("tcps.ingress.v3.haproxy.org")
    );
    assert_eq!(
        value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["type"]
            .as_str(),
        Some("array")
    );
}
