//! Watching a directory for changes: inotify (through notify) on the directory tree, plus a
//! periodic fingerprint of names, sizes and modification times as a safety net for missed
//! events. Watching directories rather than files means a ConfigMap volume's atomic `..data`
//! symlink swap is seen.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc::UnboundedSender;

/// Watching could not start.
#[derive(Debug, thiserror::Error)]
#[error("watching {path}: {source}")]
pub struct WatchError {
    pub path: PathBuf,
    pub source: notify::Error,
}

/// Keeps the watch alive; dropping it stops watching.
#[derive(Debug)]
pub struct DirWatch {
    _watcher: notify::RecommendedWatcher,
    _poller: tokio::task::JoinHandle<()>,
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        self._poller.abort();
    }
}

/// Sends the time of each change seen under `dir` to `changes`.
pub fn watch_dir(
    dir: &Path,
    changes: UnboundedSender<Instant>,
    poll_every: Duration,
) -> Result<DirWatch, WatchError> {
    let tx = changes.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Ok(e) => !e.kind.is_access(),
            Err(_) => true,
        };
        if relevant {
            let _ = tx.send(Instant::now());
        }
    })
    .map_err(|source| WatchError {
        path: dir.to_path_buf(),
        source,
    })?;
    watcher
        .watch(dir, RecursiveMode::Recursive)
        .map_err(|source| WatchError {
            path: dir.to_path_buf(),
            source,
        })?;
    let root = dir.to_path_buf();
    let poller = tokio::spawn(async move {
        let mut last = fingerprint(&root);
        loop {
            tokio::time::sleep(poll_every).await;
            let root = root.clone();
            let now = tokio::task::spawn_blocking(move || fingerprint(&root))
                .await
                .unwrap_or_default();
            if now != last {
                last = now;
                if changes.send(Instant::now()).is_err() {
                    return;
                }
            }
        }
    });
    Ok(DirWatch {
        _watcher: watcher,
        _poller: poller,
    })
}

/// (path, size, mtime) of every file under `dir`, following symlinks, sorted.
fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else {
                out.push((path, meta.len(), meta.modified().ok()));
            }
        }
    }
    out.sort();
    out
}
