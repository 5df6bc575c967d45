//! What the pipeline-equivalence tests share (`tests/memo.rs`, `tests/parallel.rs`): a run's
//! output as one comparable value, and the golden cases with their translation settings.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use clap::Parser;
use portcullis::cli::{Cli, Command};
use portcullis::pipeline::Output;
use portcullis::translate::TranslateConfig;

/// Everything a run decides, comparable: the model, the files, the diagnostics.
pub type Summary = (String, Vec<(String, Vec<u8>)>, Vec<String>);

pub fn summary(out: &Output) -> Summary {
    (
        format!("{:?}", out.model),
        out.rendered
            .files()
            .iter()
            .map(|(k, v)| (k.clone(), v.bytes().into_owned()))
            .collect(),
        out.diagnostics.iter().map(ToString::to_string).collect(),
    )
}

/// The translation settings of a golden case (its `flags` file).
pub fn case_config(dir: &Path) -> TranslateConfig {
    let mut argv: Vec<String> = ["portcullis", "render", "--manifests", "."]
        .map(String::from)
        .to_vec();
    if let Ok(text) = std::fs::read_to_string(dir.join("flags")) {
        argv.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from),
        );
    }
    let Command::Render(args) = Cli::try_parse_from(&argv).unwrap().command else {
        panic!("not render");
    };
    args.pipeline.translate_config()
}

/// The golden cases' directories, in order.
pub fn golden_cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    cases
}
