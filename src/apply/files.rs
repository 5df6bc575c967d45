//! Writing the configuration directory: atomically, only what changed, and removing files
//! only when told that no loaded or on-disk configuration references them.

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

/// Writes every file of `config` under `dir` whose content differs from what is there:
/// temporary file, fsync, rename, then fsync of the directory. Returns the files written.
pub fn write_atomically(dir: &Path, config: &RenderedConfig) -> Result<Vec<String>, FilesError> {
    let mut written = Vec::new();
    let mut dirs = BTreeSet::new();
    // Files that others name (certificates, maps) first, then the crt-list, then haproxy.cfg:
    // whoever reloads HAProxy in between never finds a reference to a file not yet written.
    let rank = |name: &str| match name {
        crate::render::CONFIG_FILE => 2,
        crate::render::CRT_LIST => 1,
        _ => 0,
    };
    let mut ordered: Vec<(&String, &Vec<u8>)> = config.files().iter().collect();
    ordered.sort_by_key(|(name, _)| (rank(name), name.as_str()));
    for (name, bytes) in ordered {
        let path = dir.join(name);
        if std::fs::read(&path).is_ok_and(|old| old == *bytes) {
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
        {
            let mut f = std::fs::File::create(&tmp).map_err(err)?;
            f.write_all(bytes).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, &path).map_err(err)?;
        dirs.insert(parent);
        written.push(name.clone());
    }
    for d in dirs {
        if let Ok(f) = std::fs::File::open(&d) {
            let _ = f.sync_all();
        }
    }
    Ok(written)
}

/// Removes files under the managed subdirectories of `dir` (`certs/`, `maps/`) that `keep`
/// does not list. Call only after a successful reload of a configuration equal to `keep`:
/// then neither the running HAProxy nor the configuration on disk references them.
pub fn remove_unreferenced(dir: &Path, keep: &RenderedConfig) -> Vec<String> {
    let mut removed = Vec::new();
    for sub in ["certs", "maps"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = format!("{sub}/{}", entry.file_name().to_string_lossy());
            if !keep.files().contains_key(&name) && std::fs::remove_file(entry.path()).is_ok() {
                removed.push(name);
            }
        }
    }
    removed.sort();
    removed
}
