//! The `portcullis` binary as an operator runs it: real processes, real exit codes, real
//! `haproxy -c`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

const BASIC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/basic");

fn portcullis(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(args)
        .env_remove("PORTCULLIS_MANIFESTS")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_accepts_the_bundled_set() {
    let out = portcullis(&["check", "--manifests", BASIC]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("ok: 2 backends"), "{stdout}");
}

#[test]
fn check_reports_haproxys_own_words_for_an_invalid_template() {
    let site = tempfile::tempdir().unwrap();
    std::fs::create_dir(site.path().join("parts")).unwrap();
    // A site override that renders a directive HAProxy does not know.
    let global = "\nglobal\n  default-path config\n  no-such-directive 1\n";
    std::fs::write(site.path().join("parts/global.j2"), global).unwrap();
    let out = portcullis(&[
        "check",
        "--manifests",
        BASIC,
        "--templates-dir",
        site.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("[ALERT]"), "{stderr}");
    assert!(stderr.contains("no-such-directive"), "{stderr}");
}

#[test]
fn template_syntax_error_names_file_and_line() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(
        site.path().join("haproxy.cfg.j2"),
        "global\n\n{% if model.version %}\n",
    )
    .unwrap();
    let out = portcullis(&[
        "render",
        "--manifests",
        BASIC,
        "--templates-dir",
        site.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("haproxy.cfg.j2"), "{stderr}");
    assert!(stderr.contains("line"), "{stderr}");
}

#[test]
fn script_compile_error_names_the_site_file() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(
        site.path().join("mine.rhai"),
        "// Scope: backend\n// Risk: low\nfn backend(ctx) { let = ; }",
    )
    .unwrap();
    let out = portcullis(&[
        "render",
        "--manifests",
        BASIC,
        "--scripts-dir",
        site.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("mine.rhai: line 3"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn flags_can_come_from_the_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["render"])
        .env("PORTCULLIS_MANIFESTS", BASIC)
        .env("PORTCULLIS_HTTP_BIND_PORT", "8080")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("bind 0.0.0.0:8080"));
}

#[test]
fn render_out_writes_every_referenced_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = portcullis(&[
        "render",
        "--manifests",
        BASIC,
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let cfg = std::fs::read_to_string(dir.path().join("haproxy.cfg")).unwrap();
    for referenced in ["maps/exact.map", "maps/prefix.map", "certs/crt-list.txt"] {
        assert!(cfg.contains(referenced));
        assert!(dir.path().join(referenced).is_file(), "{referenced}");
    }
    let crt_list = std::fs::read_to_string(dir.path().join("certs/crt-list.txt")).unwrap();
    let pem = crt_list.split_whitespace().next().unwrap();
    assert!(dir.path().join(pem).is_file());
    // The written directory is itself valid for HAProxy.
    let status = Command::new("haproxy")
        .args(["-c", "-q", "-f"])
        .arg(dir.path().join("haproxy.cfg"))
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn missing_haproxy_binary_is_a_clear_non_zero_exit() {
    let out = portcullis(&[
        "check",
        "--manifests",
        BASIC,
        "--haproxy-bin",
        "/nonexistent/haproxy",
    ]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("/nonexistent/haproxy"));
}

#[test]
fn unreadable_manifest_directory_fails_with_its_path() {
    let out = portcullis(&["render", "--manifests", "/nonexistent/manifests"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/manifests"));
}

#[test]
fn run_with_an_unreadable_manifest_directory_fails_with_its_path_before_haproxy_starts() {
    let work = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let out = portcullis(&[
        "run",
        "--manifests",
        "/nonexistent/manifests",
        "--config-dir",
        &work.path().join("c").display().to_string(),
        "--runtime-dir",
        &work.path().join("r").display().to_string(),
        "--admin-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("/nonexistent/manifests"));
    assert!(!work.path().join("c/haproxy.cfg").exists());
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn version_prints_the_crate_version() {
    let out = portcullis(&["version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("portcullis {}", env!("CARGO_PKG_VERSION"))
    );
    assert!(Path::new(BASIC).is_dir());
}

#[test]
fn scripts_and_templates_list_name_their_layer() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(
        site.path().join("check.rhai"),
        "// Scope: backend\n// Risk: low\nfn backend(ctx) { #{} }",
    )
    .unwrap();
    std::fs::write(
        site.path().join("zz-mine.rhai"),
        "// Scope: route\n// Risk: medium\nfn route(ctx) { #{} }",
    )
    .unwrap();
    // An empty file switches the bundled script off: it declares no risk.
    std::fs::write(site.path().join("hsts.rhai"), "").unwrap();
    let out = portcullis(&[
        "scripts",
        "list",
        "--scripts-dir",
        site.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    let line = |name: &str| {
        listing
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{listing}"))
            .to_string()
    };
    assert!(line("check.rhai").contains("site ("));
    assert!(line("zz-mine.rhai").contains("site ("));
    assert!(line("zz-mine.rhai").contains(" medium "), "risk shown");
    assert!(
        line("config-snippets.rhai").contains(" critical "),
        "risk shown"
    );
    assert!(line("load-balance.rhai").ends_with("bundled"));
    let disabled = line("hsts.rhai");
    assert!(disabled.contains("(disabled)"), "{disabled}");
    assert!(
        !["low", "medium", "high", "critical"]
            .iter()
            .any(|r| disabled.contains(&format!(" {r} "))),
        "no risk for a disabled file: {disabled}"
    );
    let out = portcullis(&["templates", "list"]);
    assert!(
        text(&out.stdout)
            .lines()
            .any(|l| l.starts_with("haproxy.cfg.j2"))
    );
}
