//! `haproxy -c`: asking HAProxy itself whether a rendered configuration is valid.

use std::path::Path;
use std::process::Command;

use crate::render::{CONFIG_FILE, CRT_LIST, RenderedConfig};

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
    check_config_since(haproxy_bin, config, None)
}

/// [`check_config`], with the certificates of `loaded`, a configuration HAProxy runs, taken
/// as proved: the checked crt-list holds only the lines `loaded` lacks (or the first line,
/// for the binds to have a certificate). A line names an immutable file (its content hash
/// is in its name) with its options, so HAProxy loads it again as it did; and loading a
/// certificate costs about a millisecond, seconds with thousands of them.
pub fn check_config_since(
    haproxy_bin: &str,
    config: &RenderedConfig,
    loaded: Option<&RenderedConfig>,
) -> Result<(), CheckError> {
    let dir = tempfile::tempdir().map_err(CheckError::TempDir)?;
    write_config(config, dir.path())?;
    if let Some(list) = loaded.and_then(|loaded| new_crt_list_lines(config, loaded)) {
        let path = dir.path().join(CRT_LIST);
        std::fs::write(&path, list).map_err(|source| CheckError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    check_file(haproxy_bin, &dir.path().join(CONFIG_FILE))
}

/// The lines of `config`'s crt-list that `loaded`'s lacks, or its first line when there are
/// none; `None` when `config` has no crt-list.
fn new_crt_list_lines(config: &RenderedConfig, loaded: &RenderedConfig) -> Option<String> {
    let list = config.file(CRT_LIST)?;
    let proved = loaded.file(CRT_LIST).unwrap_or_default();
    let proved: std::collections::HashSet<&str> = proved.lines().collect();
    let mut new: String = list
        .lines()
        .filter(|line| !proved.contains(line))
        .flat_map(|line| [line, "\n"])
        .collect();
    if new.is_empty() {
        new = list.lines().take(1).flat_map(|line| [line, "\n"]).collect();
    }
    Some(new)
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
