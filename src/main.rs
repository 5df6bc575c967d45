//! The `portcullis` binary: parses flags and runs a command. Errors end here as one clear line
//! on stderr and a non-zero exit status (see docs/operations.md).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use portcullis::check::{self, CheckError};
use portcullis::cli::{Cli, Command, PipelineArgs};
use portcullis::pipeline::{Output, Pipeline};
use portcullis::source::files;
use portcullis::store::Store;

/// Exit statuses.
mod exit {
    /// The input or the site's scripts/templates could not be used.
    pub(crate) const INPUT: u8 = 1;
    /// HAProxy rejected the rendered configuration.
    pub(crate) const REJECTED: u8 = 3;
    /// Something around us failed (filesystem, missing HAProxy binary).
    pub(crate) const ENVIRONMENT: u8 = 4;
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println_out(&format!("portcullis {}", env!("CARGO_PKG_VERSION")));
            ExitCode::SUCCESS
        }
        Command::Render(args) => {
            let output = match run_pipeline(&args.pipeline) {
                Ok(o) => o,
                Err(code) => return code,
            };
            match &args.out {
                Some(dir) => {
                    if let Err(e) = output.rendered.write_to(dir) {
                        eprintln!("error: {e}");
                        return ExitCode::from(exit::ENVIRONMENT);
                    }
                    eprintln!(
                        "wrote {} files to {}",
                        output.rendered.files().len(),
                        dir.display()
                    );
                }
                None => print_out(output.rendered.haproxy_cfg()),
            }
            ExitCode::SUCCESS
        }
        Command::Check(args) => {
            let output = match run_pipeline(&args.pipeline) {
                Ok(o) => o,
                Err(code) => return code,
            };
            match check::check_config(&args.haproxy_bin, &output.rendered) {
                Ok(()) => {
                    let m = &output.model;
                    println_out(&format!(
                        "ok: {} backends, {} routing map entries, {} certificates, {} diagnostics; haproxy -c accepted the configuration",
                        m.backends.len(),
                        m.maps.exact.len() + m.maps.prefix.len(),
                        m.tls.pem_files.len(),
                        output.diagnostics.len()
                    ));
                    ExitCode::SUCCESS
                }
                Err(CheckError::Rejected { messages }) => {
                    eprintln!("error: HAProxy rejected the rendered configuration:");
                    for m in messages {
                        eprintln!("{m}");
                    }
                    ExitCode::from(exit::REJECTED)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(exit::ENVIRONMENT)
                }
            }
        }
    }
}

/// Loads manifests, scripts and templates and runs the pipeline, printing diagnostics.
fn run_pipeline(args: &PipelineArgs) -> Result<Output, ExitCode> {
    let pipeline = Pipeline::load(
        args.scripts_dir.as_deref(),
        args.templates_dir.as_deref(),
        args.translate_config(),
    )
    .map_err(|e| {
        for line in e.to_string().lines() {
            eprintln!("error: {line}");
        }
        ExitCode::from(exit::INPUT)
    })?;
    let loaded = files::load_dir(&args.manifests).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(exit::INPUT)
    })?;
    let mut diagnostics = loaded.diagnostics.into_sorted();
    let store = Store::from_objects(loaded.objects);
    let mut output = pipeline.run(&store).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(exit::INPUT)
    })?;
    diagnostics.append(&mut output.diagnostics);
    for d in &diagnostics {
        eprintln!("{d}");
    }
    output.diagnostics = diagnostics;
    Ok(output)
}

#[allow(clippy::print_stdout)]
fn print_out(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
}

fn println_out(s: &str) {
    print_out(&format!("{s}\n"));
}
