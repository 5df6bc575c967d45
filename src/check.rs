//! `haproxy -c`: asking HAProxy itself whether a rendered configuration is valid.

use std::path::Path;
use std::process::Command;

use crate::render::{CONFIG_FILE, RenderedConfig};

/// Checking could not be done, or HAProxy rejected the configuration.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot run {bin}: {source}")]
    Spawn { bin: String, source: std::io::Error },
    #[error("creating a temporary directory: {0}")]
    TempDir(std::io::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    /// HAProxy's own words: its ALERT lines, or everything it printed if it printed none.
    #[error("HAProxy rejected the configuration:\n{}", .messages.join("\n"))]
    Rejected { messages: Vec<String> },
}

/// Writes `config` to a temporary directory and runs `haproxy -c` on it.
pub fn check_config(haproxy_bin: &str, config: &RenderedConfig) -> Result<(), CheckError> {
    let dir = tempfile::tempdir().map_err(CheckError::TempDir)?;
    write_config(config, dir.path())?;
    check_file(haproxy_bin, &dir.path().join(CONFIG_FILE))
}

/// Writes every file of `config` under `dir`, creating subdirectories (`portcullis render
/// --out`, and the directory `haproxy -c` checks).
pub fn write_config(config: &RenderedConfig, dir: &Path) -> Result<(), CheckError> {
    for (name, content) in config.files() {
        let path = dir.join(name);
        let write = || -> std::io::Result<()> {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut f = std::fs::File::create(&path)?;
            // No fsync: a checked copy need not survive a crash, and thousands of
            // certificates would each pay for one.
            content.write_to(&mut f)
        };
        write().map_err(|source| CheckError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(())
}

/// Runs `haproxy -c -f <path>`.
pub fn check_file(haproxy_bin: &str, path: &Path) -> Result<(), CheckError> {
    // HAProxy 2.6 reads a server's client certificate (`crt` on `server`, from `server-crt`)
    // relative to its working directory, not `default-path config`: check from the
    // configuration's directory, as `run` starts HAProxy.
    let path = &std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut command = Command::new(haproxy_bin);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        command.current_dir(dir);
    }
    let output = command
        .arg("-c")
        .arg("-f")
        .arg(path)
        .output()
        .map_err(|source| CheckError::Spawn {
            bin: haproxy_bin.to_string(),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let alerts: Vec<String> = text
        .lines()
        .filter(|l| l.contains("[ALERT]"))
        .map(str::to_string)
        .collect();
    let messages = if alerts.is_empty() {
        text.lines().map(str::to_string).collect()
    } else {
        alerts
    };
    Err(CheckError::Rejected { messages })
}
