//! `portcullis annotations list` through the real binary, the generated reference in
//! docs/annotations.md, and a site script's undeclared read refused by the binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

const BASIC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/basic");
const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/annotations.md");
const BEGIN: &str = "<!-- BEGIN generated: portcullis annotations list --output markdown -->";
const END: &str = "<!-- END generated: portcullis annotations list --output markdown -->";

fn portcullis(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(args)
        .env_remove("PORTCULLIS_SCRIPTS_DIR")
        .env_remove("PORTCULLIS_MANIFESTS")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A site directory: `check.rhai` replaces the bundled one (declaring `check` only, plus a
/// new `check-port`), `zz-compression.rhai` adds a new name.
fn site() -> tempfile::TempDir {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(
        site.path().join("check.rhai"),
        "// Scope: backend\n// Risk: low\n// Read: check bool from Service default true: health checks.\n// Read: check-port int(1..65535) from Service, Ingress: the port checked.\nfn backend(ctx) { #{ check: ctx.bool(\"check\") ?? true } }\n",
    )
    .unwrap();
    std::fs::write(
        site.path().join("zz-compression.rhai"),
        "// Scope: backend\n// Risk: low\n// Read: compression (compress) choice(gzip|deflate) from Service default none:\n//       compress the responses of this backend.\nfn backend(ctx) { let c = ctx.choice([\"compression\", \"compress\"], [\"gzip\", \"deflate\"]); () }\n",
    )
    .unwrap();
    site
}

#[test]
fn the_table_lists_bundled_and_site_declarations_with_their_source() {
    let site = site();
    let dir = site.path().to_str().unwrap();
    let out = portcullis(&["annotations", "list", "--scripts-dir", dir]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    let line = |name: &str| {
        listing
            .lines()
            .find(|l| l.split("  ").next() == Some(name))
            .map(str::to_string)
    };
    let header = listing.lines().next().unwrap();
    for column in ["NAME", "TYPE", "DEFAULT", "FROM", "SCRIPT", "DESCRIPTION"] {
        assert!(header.contains(column), "{header}");
    }
    let check = line("check").unwrap_or_else(|| panic!("no check:\n{listing}"));
    assert!(check.contains(&format!("{dir}/check.rhai")), "{check}");
    assert!(
        check.contains("Service") && !check.contains("ConfigMap"),
        "{check}"
    );
    assert!(check.ends_with("health checks."), "{check}");
    assert!(line("check-port").unwrap().contains("int(1..65535)"));
    // The bundled check.rhai is replaced: what only it declared is gone.
    assert_eq!(line("check-http"), None, "{listing}");
    let added = line("compression (compress)").unwrap_or_else(|| panic!("{listing}"));
    assert!(added.contains("choice(gzip|deflate)"), "{added}");
    assert!(added.contains("zz-compression.rhai"), "{added}");
    assert!(
        added.ends_with("compress the responses of this backend."),
        "{added}"
    );
    let bundled = line("allow-list (whitelist)").unwrap();
    assert!(bundled.contains("access-list.rhai (bundled)"), "{bundled}");
    assert!(bundled.contains("Ingress,HTTPRoute,ConfigMap"), "{bundled}");

    // `--scripts` names the same directory.
    let again = portcullis(&["annotations", "list", "--scripts", dir]);
    assert_eq!(text(&again.stdout), listing);
}

#[test]
fn json_output_has_every_field() {
    let site = site();
    let dir = site.path().to_str().unwrap();
    let out = portcullis(&[
        "annotations",
        "list",
        "--scripts-dir",
        dir,
        "--output",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let compression = row("compression");
    assert_eq!(compression["aliases"], serde_json::json!(["compress"]));
    assert_eq!(compression["type"], "choice(gzip|deflate)");
    assert_eq!(compression["default"], "none");
    assert_eq!(compression["objects"], serde_json::json!(["Service"]));
    assert_eq!(
        compression["description"],
        "compress the responses of this backend."
    );
    assert_eq!(compression["script"], "zz-compression.rhai");
    assert_eq!(
        compression["source"],
        format!("{dir}/zz-compression.rhai").as_str()
    );
    let port = row("check-port");
    assert_eq!(port["default"], serde_json::Value::Null);
    assert_eq!(port["objects"], serde_json::json!(["Service", "Ingress"]));
    let timeout = row("timeout-server");
    assert_eq!(timeout["source"], "bundled");
    assert_eq!(timeout["default"], "50s");
}

/// A site script that reads a name it does not declare is refused by every command that
/// loads scripts, naming the file, the line and the name.
#[test]
fn an_undeclared_read_is_a_compile_error_of_the_site_file() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(
        site.path().join("zz-mine.rhai"),
        "// Scope: backend\n// Risk: low\n// Read: check bool from Service: c.\nfn backend(ctx) {\n  let t = ctx.duration(\"check-timeout\");\n  ()\n}\n",
    )
    .unwrap();
    let dir = site.path().to_str().unwrap();
    for args in [
        vec!["annotations", "list", "--scripts-dir", dir],
        vec!["render", "--manifests", BASIC, "--scripts-dir", dir],
    ] {
        let out = portcullis(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(
                "zz-mine.rhai: line 5: reads \"check-timeout\" (ctx.duration) without declaring it"
            ),
            "{args:?}: {stderr}"
        );
    }
}

/// The reference in docs/annotations.md is the command's output for the bundled scripts.
/// `UPDATE_DOCS=1 cargo test --test annotations` rewrites it.
#[test]
fn the_annotation_reference_in_the_docs_is_generated() {
    let out = portcullis(&["annotations", "list", "--output", "markdown"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let generated = text(&out.stdout);
    let doc = std::fs::read_to_string(DOC).unwrap();
    let start = doc.find(BEGIN).expect("the BEGIN marker") + BEGIN.len();
    let end = doc.find(END).expect("the END marker");
    let section = doc[start..end].trim_start_matches('\n');
    if section == generated {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        let updated = format!("{}\n{generated}{}", &doc[..start], &doc[end..]);
        std::fs::write(DOC, updated).unwrap();
        return;
    }
    panic!(
        "docs/annotations.md: the generated annotation reference is stale; regenerate it with\n\n    UPDATE_DOCS=1 cargo test --test annotations\n\n(it is `portcullis annotations list --output markdown` between the markers)"
    );
}

/// Through `render`: a declared annotation whose value is not of its type is reported even
/// when no hook reads it (a backend setting on an Ingress whose only path names a Service that
/// does not exist: no backend hook runs for it), and once, by the hook, when one does.
#[test]
fn values_of_the_wrong_type_are_reported_once_whether_or_not_a_hook_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("objects.yaml"),
        r#"apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: portcullis
spec:
  controller: portcullis.io/ingress
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  annotations: {haproxy.org/pod-maxconn: "0"}
spec:
  ports: [{name: http, port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: orphan
  namespace: shop
  annotations: {haproxy.org/set-host: "Not A Host", haproxy.org/server-proto: "h3"}
spec:
  ingressClassName: portcullis
  rules:
    - host: orphan.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend: {service: {name: missing, port: {number: 80}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
spec:
  ingressClassName: portcullis
  rules:
    - host: web.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend: {service: {name: web, port: {number: 80}}}
"#,
    )
    .unwrap();
    let out = portcullis(&["render", "--manifests", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let lines = |needle: &str| stderr.lines().filter(|l| l.contains(needle)).count();
    // The route hook reads set-host (the path answers 503): its report alone stands.
    assert_eq!(lines("annotation haproxy.org/set-host"), 1, "{stderr}");
    assert!(
        stderr.contains("Ingress shop/orphan: annotation haproxy.org/set-host: \"Not A Host\" is not a host name"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "Ingress shop/orphan: annotation haproxy.org/server-proto: declared choice(h1|h2): \"h3\" is not one of: h1, h2; ignored wherever it is read"
        ),
        "{stderr}"
    );
    // The backend hook reads pod-maxconn: its report alone stands.
    assert_eq!(lines("annotation haproxy.org/pod-maxconn"), 1, "{stderr}");
    assert!(
        stderr.contains("Service shop/web: annotation haproxy.org/pod-maxconn: 0 is outside the allowed range 1..1000000; setting ignored"),
        "{stderr}"
    );
}
