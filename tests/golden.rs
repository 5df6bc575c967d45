#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Golden tests: each directory under `tests/golden/` is a small cluster (manifests plus an
//! optional `flags` file of extra command-line flags). The whole pipeline runs on it, the
//! rendered files and diagnostics are compared with an insta snapshot in `tests/snapshots/`,
//! and the rendered configuration must pass the real `haproxy -c`.
//!
//! Update snapshots with `INSTA_UPDATE=always cargo test --test golden`, then read the diff:
//! a snapshot is the specification of that case. In snapshots, PEM files are shown as their
//! length (their names carry a content hash) and the version in the header as `<version>`.

use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use clap::Parser;
use portcullis::cli::{Cli, Command};
use portcullis::pipeline::Pipeline;
use portcullis::source::files::load_dir;
use portcullis::store::Store;

/// The corpus must keep covering the pipeline; fewer cases means some were lost.
const MIN_CASES: usize = 15;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Every case directory, sorted by name.
fn cases() -> Vec<(String, PathBuf)> {
    let mut cases: Vec<(String, PathBuf)> = std::fs::read_dir(golden_dir())
        .expect("tests/golden exists")
        .map(|e| e.expect("readable directory entry"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    cases.sort();
    cases
}

/// The extra flags of a case: one per line; blank lines and `#` comments are skipped.
fn flags(dir: &Path) -> Vec<String> {
    match std::fs::read_to_string(dir.join("flags")) {
        Ok(text) => text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("reading {}/flags: {e}", dir.display()),
    }
}

/// Runs one case: returns the snapshot text and the `haproxy -c` verdict.
fn run_case(dir: &Path) -> Result<(String, Result<(), String>), String> {
    let mut argv = vec![
        "portcullis".to_string(),
        "render".to_string(),
        "--manifests".to_string(),
        dir.display().to_string(),
    ];
    argv.extend(flags(dir));
    let cli = Cli::try_parse_from(&argv).map_err(|e| format!("bad flags {argv:?}: {e}"))?;
    let Command::Render(args) = cli.command else {
        return Err("the command line is not `render`".to_string());
    };
    let config = args.pipeline.translate_config();

    let loaded = load_dir(dir).map_err(|e| e.to_string())?;
    let pipeline = Pipeline::load(None, None, config).map_err(|e| e.to_string())?;
    let store = Store::from_objects(loaded.objects);
    let output = pipeline.run(&store).map_err(|e| e.to_string())?;

    let mut text = String::new();
    for (path, bytes) in output.rendered.files() {
        writeln!(text, "==> {path} <==").unwrap();
        let is_pem = path.starts_with("certs/") && path.ends_with(".pem");
        if is_pem {
            writeln!(text, "({} bytes of PEM)", bytes.len()).unwrap();
        } else {
            // The version in the header would change every snapshot on each release.
            let content = String::from_utf8_lossy(&bytes.bytes()).replace(
                concat!("Portcullis ", env!("CARGO_PKG_VERSION")),
                "Portcullis <version>",
            );
            text.push_str(&content);
            if !content.is_empty() && !content.ends_with('\n') {
                text.push('\n');
            }
        }
        text.push('\n');
    }
    let mut diagnostics: Vec<String> = loaded
        .diagnostics
        .into_sorted()
        .iter()
        .chain(output.diagnostics.iter())
        .map(ToString::to_string)
        .collect();
    diagnostics.sort();
    writeln!(text, "==> diagnostics ({}) <==", diagnostics.len()).unwrap();
    for d in &diagnostics {
        writeln!(text, "{d}").unwrap();
    }

    let check =
        portcullis::check::check_config("haproxy", &output.rendered).map_err(|e| e.to_string());
    Ok((text, check))
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "(no message)".to_string())
}

#[test]
fn golden_cases() {
    let cases = cases();
    assert!(
        cases.len() >= MIN_CASES,
        "expected at least {MIN_CASES} cases under {}, found {}",
        golden_dir().display(),
        cases.len()
    );
    let mut failures = Vec::new();
    for (name, dir) in &cases {
        let result = catch_unwind(AssertUnwindSafe(|| run_case(dir)));
        let (text, check) = match result {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
            Err(payload) => {
                failures.push(format!("{name}: panicked: {}", panic_message(&*payload)));
                continue;
            }
        };
        if let Err(e) = check {
            failures.push(format!("{name}: haproxy -c failed: {e}"));
        }
        let snapshot = catch_unwind(AssertUnwindSafe(|| {
            insta::assert_snapshot!(name.as_str(), text);
        }));
        if let Err(payload) = snapshot {
            failures.push(format!(
                "{name}: snapshot differs: {}",
                panic_message(&*payload)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} golden cases failed:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}
