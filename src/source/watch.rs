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
                let at = changed_at(&last, &now);
                last = now;
                if changes.send(at).is_err() {
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

/// When the directory changed between two fingerprints, as the change notifications tell it:
/// the latest modification time of a file that is new or different. Inotify has usually
/// reported that change already; sent as "now", the safety net's notification would restart
/// the debounce of a change long noticed (every poll period, a change applied 100 ms late).
/// A file that went away, or a time in the future, counts as now.
fn changed_at(
    before: &[(PathBuf, u64, Option<SystemTime>)],
    after: &[(PathBuf, u64, Option<SystemTime>)],
) -> Instant {
    let now = Instant::now();
    // Both are sorted by path, and a path appears once.
    let gone = before
        .iter()
        .any(|b| after.binary_search_by(|a| a.0.cmp(&b.0)).is_err());
    let changed: Option<Vec<SystemTime>> = after
        .iter()
        .filter(|a| before.binary_search(a).is_err())
        .map(|a| a.2)
        .collect();
    match (gone, changed.and_then(|times| times.into_iter().max())) {
        (false, Some(latest)) => SystemTime::now()
            .duration_since(latest)
            .ok()
            .and_then(|ago| now.checked_sub(ago))
            .unwrap_or(now),
        _ => now,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The safety net's notification carries the time of the change, not of the poll that
    /// found it: a change inotify reported already does not start its debounce again.
    #[tokio::test]
    async fn a_poll_reports_when_the_files_changed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), "a: 1\n").unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let poll = Duration::from_millis(400);
        let _watch = watch_dir(dir.path(), tx, poll).unwrap();
        let started = Instant::now();
        // The write falls between the start and the first poll, which finds it 300 ms later.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let written = Instant::now();
        std::fs::write(dir.path().join("a.yaml"), "a: 22\n").unwrap();
        // Every notification until the poll's (one received after the poll period), or the
        // deadline.
        let deadline = started + poll * 5;
        let mut seen = Vec::new();
        let mut polled = false;
        while !polled {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(Some(at)) = tokio::time::timeout(left, rx.recv()).await else {
                break;
            };
            polled = started.elapsed() >= poll;
            seen.push(at);
        }
        assert!(polled, "no notification from the poll");
        for at in seen {
            let late = at.saturating_duration_since(written);
            assert!(
                late < Duration::from_millis(150),
                "a notification {late:?} after the write"
            );
        }
    }

    #[test]
    fn a_file_gone_or_without_a_time_is_a_change_now() {
        let old = SystemTime::now() - Duration::from_secs(60);
        let entry = |name: &str, t: Option<SystemTime>| (PathBuf::from(name), 1, t);
        let before = vec![entry("a", Some(old)), entry("b", Some(old))];
        let recent = |at: Instant| at.elapsed() < Duration::from_secs(1);
        // Changed a minute ago: reported as then.
        let after = vec![entry("a", Some(old)), (PathBuf::from("b"), 2, Some(old))];
        assert!(!recent(changed_at(&before, &after)));
        assert!(recent(changed_at(&before, &[entry("a", Some(old))])));
        assert!(recent(changed_at(
            &before,
            &[entry("a", Some(old)), entry("b", None)]
        )));
    }
}
