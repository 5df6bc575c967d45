//! Writing the configuration directory: atomically, only what changed, and removing files
//! only when told that no loaded or on-disk configuration references them, and only files
//! Portcullis wrote: they are listed in `.portcullis-files`; anything else an operator put
//! there is left alone and reported.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::render::RenderedConfig;

/// A file could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Up to this many changed files are fsynced one by one; more are made durable together.
const FSYNC_EACH_UP_TO: usize = 16;

/// The list of files Portcullis wrote in a configuration directory.
const OWNED_LIST: &str = ".portcullis-files";

fn owned(dir: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(dir.join(OWNED_LIST))
        .map(|t| t.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

fn save_owned(dir: &Path, names: &BTreeSet<String>) -> std::io::Result<()> {
    let text: String = names.iter().map(|n| format!("{n}\n")).collect();
    let tmp = dir.join(format!("{OWNED_LIST}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(tmp, dir.join(OWNED_LIST))
}

/// Writes every file of `config` under `dir` whose content differs from what is there:
/// temporary files, made durable, renamed in order, then fsync of the directories. `known` is what the last call
/// wrote: a file with the same content there and the same size on disk is taken as unchanged
/// without reading it (at 10 000 Ingresses haproxy.cfg alone is 20 MB). Returns the files
/// written.
pub fn write_atomically(
    dir: &Path,
    config: &RenderedConfig,
    known: Option<&RenderedConfig>,
) -> Result<Vec<String>, FilesError> {
    let mut written = Vec::new();
    let mut dirs = BTreeSet::new();
    // Record ownership before writing, so a crash in between never leaves an unlisted file.
    let mut owned_now = owned(dir);
    if config.files().keys().any(|n| !owned_now.contains(n)) {
        owned_now.extend(config.files().keys().cloned());
        std::fs::create_dir_all(dir)
            .and_then(|()| save_owned(dir, &owned_now))
            .map_err(|source| FilesError::Write {
                path: dir.join(OWNED_LIST),
                source,
            })?;
    }
    // Files that others name (certificates, maps) first, then the crt-list, then haproxy.cfg:
    // whoever reloads HAProxy in between never finds a reference to a file not yet written.
    let rank = |name: &str| match name {
        crate::render::CONFIG_FILE => 2,
        crate::render::CRT_LIST => 1,
        _ => 0,
    };
    let mut ordered: Vec<(&String, &crate::render::Content)> = config.files().iter().collect();
    ordered.sort_by_key(|(name, _)| (rank(name), name.as_str()));
    // Every changed file goes to a temporary first; all are made durable, then renamed in
    // order. A new configuration never names a file whose content may be lost in a crash.
    let mut pending: Vec<(String, PathBuf, PathBuf)> = Vec::new();
    for (name, bytes) in ordered {
        let path = dir.join(name);
        let written_before = known
            .and_then(|k| k.files().get(name))
            .is_some_and(|before| before == bytes)
            && std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64);
        // Compared as it is read, not read whole first.
        let on_disk = || -> std::io::Result<bool> {
            let file = std::fs::File::open(&path)?;
            Ok(file.metadata()?.len() == bytes.len() as u64 && bytes.same_as_read(file)?)
        };
        if written_before || on_disk().unwrap_or(false) {
            continue;
        }
        let err = |source| FilesError::Write {
            path: path.clone(),
            source,
        };
        let parent = path.parent().unwrap_or(dir).to_path_buf();
        std::fs::create_dir_all(&parent).map_err(err)?;
        let tmp = parent.join(format!(
            ".{}.portcullis-tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
        ));
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        bytes.write_to(&mut f).map_err(err)?;
        if pending.len() < FSYNC_EACH_UP_TO {
            f.sync_all().map_err(err)?;
        }
        pending.push((name.clone(), tmp, path));
    }
    // An fsync costs milliseconds (a journal commit each): thousands of certificates at
    // start-up took seconds. Past a few files, one `syncfs` makes them durable at once.
    if pending.len() > FSYNC_EACH_UP_TO {
        let synced = std::fs::File::open(dir)
            .and_then(|d| rustix::fs::syncfs(&d).map_err(std::io::Error::from));
        synced.map_err(|source| FilesError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    for (name, tmp, path) in pending {
        std::fs::rename(&tmp, &path).map_err(|source| FilesError::Write {
            path: path.clone(),
            source,
        })?;
        dirs.insert(path.parent().unwrap_or(dir).to_path_buf());
        written.push(name);
    }
    for d in dirs {
        if let Ok(f) = std::fs::File::open(&d) {
            let _ = f.sync_all();
        }
    }
    Ok(written)
}

/// Removes the files Portcullis wrote under `dir` for which `keep` says no. `keep` must hold
/// every file the configuration on disk names and every file the running HAProxy holds (see
/// [`super::Applier`]). Files Portcullis did not write are never removed; they are returned as
/// `foreign` so they can be reported.
pub fn remove_unreferenced(dir: &Path, keep: impl Fn(&str) -> bool) -> Removal {
    let mut removal = Removal::default();
    let mut owned_now = owned(dir);
    for name in owned_now.clone() {
        if keep(&name) {
            continue;
        }
        match std::fs::remove_file(dir.join(&name)) {
            Ok(()) => removal.removed.push(name.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => continue,
        }
        owned_now.remove(&name);
    }
    let _ = save_owned(dir, &owned_now);
    // `certs/ca` and `certs/client`: CA bundles and client certificates to the pods.
    for sub in [
        "certs",
        "certs/ca",
        "certs/client",
        "maps",
        "errorfiles",
        "patterns",
    ] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = format!("{sub}/{}", entry.file_name().to_string_lossy());
            if !owned_now.contains(&name) && !name.contains("portcullis-tmp") {
                removal.foreign.push(name);
            }
        }
    }
    removal.foreign.sort();
    removal
}

/// What [`remove_unreferenced`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Removal {
    pub removed: Vec<String>,
    /// Files in `certs/`, `maps/`, `errorfiles/` or `patterns/` that Portcullis did not write: left alone.
    pub foreign: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_portcullis_wrote_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let first = RenderedConfig::from_files([
            ("haproxy.cfg", "a"),
            ("certs/ns_old.pem", "old"),
            ("maps/exact.map", ""),
        ]);
        write_atomically(dir.path(), &first, None).unwrap();
        std::fs::write(dir.path().join("certs/operator.pem"), "theirs").unwrap();
        let second = RenderedConfig::from_files([("haproxy.cfg", "b"), ("maps/exact.map", "")]);
        write_atomically(dir.path(), &second, Some(&first)).unwrap();
        let removal = remove_unreferenced(dir.path(), |n| second.files().contains_key(n));
        assert_eq!(removal.removed, ["certs/ns_old.pem"]);
        assert_eq!(removal.foreign, ["certs/operator.pem"]);
        assert!(dir.path().join("certs/operator.pem").exists());
        assert!(dir.path().join("maps/exact.map").exists());
    }

    /// Files written before are not written again, unless the disk no longer holds them.
    #[test]
    fn files_written_before_are_skipped_unless_changed_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let config = RenderedConfig::from_files([
            ("haproxy.cfg", "global\n"),
            ("maps/exact.map", "a.com/ web\n"),
            ("maps/prefix.map", "a.com/ web\n"),
        ]);
        assert_eq!(
            write_atomically(dir.path(), &config, None).unwrap().len(),
            3
        );
        assert!(
            write_atomically(dir.path(), &config, Some(&config))
                .unwrap()
                .is_empty()
        );
        std::fs::remove_file(dir.path().join("maps/exact.map")).unwrap();
        std::fs::write(dir.path().join("haproxy.cfg"), "changed by hand\n").unwrap();
        let written = write_atomically(dir.path(), &config, Some(&config)).unwrap();
        assert_eq!(written, ["maps/exact.map", "haproxy.cfg"]);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("haproxy.cfg")).unwrap(),
            "global\n"
        );
    }
}
