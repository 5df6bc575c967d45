//! Layered sources: files compiled into the binary, overlaid by a site directory.
//!
//! Scripts and templates both work this way: a site file with the same name replaces the
//! bundled one, a new name adds a file. The effective set is sorted by name, so every replica
//! evaluates scripts in the same order.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where an effective file came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "layer", rename_all = "lowercase")]
pub enum Layer {
    /// Compiled into the binary from the repository's `scripts/` or `templates/`.
    Bundled,
    /// Read from a site directory.
    Site { path: PathBuf },
}

/// One effective source file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceFile {
    /// Relative name, e.g. `check.rhai` or `parts/backend.j2`.
    pub name: String,
    pub layer: Layer,
    #[serde(skip)]
    pub text: String,
}

impl SourceFile {
    /// How messages name this file: `scripts/check.rhai (bundled)` or the site path.
    pub fn display_name(&self, bundled_dir: &str) -> String {
        match &self.layer {
            Layer::Bundled => format!("{bundled_dir}/{} (bundled)", self.name),
            Layer::Site { path } => path.display().to_string(),
        }
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layer::Bundled => write!(f, "bundled"),
            Layer::Site { path } => write!(f, "site ({})", path.display()),
        }
    }
}

/// Reading a site directory failed.
#[derive(Debug, thiserror::Error)]
#[error("reading site directory {path}: {source}")]
pub struct ReadLayer {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// The effective files: `bundled` (name, text) overlaid by files with `extension` found
/// recursively under `site`. Names starting with `.` are skipped (ConfigMap volume internals).
pub fn effective(
    bundled: &[(&str, &str)],
    site: Option<&Path>,
    extension: &str,
) -> Result<Vec<SourceFile>, ReadLayer> {
    let mut files: BTreeMap<String, SourceFile> = bundled
        .iter()
        .map(|(name, text)| {
            (
                name.to_string(),
                SourceFile {
                    name: name.to_string(),
                    layer: Layer::Bundled,
                    text: text.to_string(),
                },
            )
        })
        .collect();
    if let Some(dir) = site {
        let mut found = Vec::new();
        walk(dir, dir, extension, &mut found)?;
        for (name, path) in found {
            let text = std::fs::read_to_string(&path).map_err(|source| ReadLayer {
                path: path.clone(),
                source,
            })?;
            files.insert(
                name.clone(),
                SourceFile {
                    name,
                    layer: Layer::Site { path },
                    text,
                },
            );
        }
    }
    Ok(files.into_values().collect())
}

fn walk(
    root: &Path,
    dir: &Path,
    extension: &str,
    out: &mut Vec<(String, PathBuf)>,
) -> Result<(), ReadLayer> {
    let entries = std::fs::read_dir(dir).map_err(|source| ReadLayer {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(root, &path, extension, out)?;
        } else if path.extension().and_then(|e| e.to_str()) == Some(extension) {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let name = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((name, path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_files_override_and_add() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.rhai"), "site a").unwrap();
        std::fs::write(dir.path().join("c.rhai"), "site c").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let files = effective(
            &[("a.rhai", "bundled a"), ("b.rhai", "bundled b")],
            Some(dir.path()),
            "rhai",
        )
        .unwrap();
        let summary: Vec<_> = files
            .iter()
            .map(|f| (f.name.as_str(), f.text.as_str(), f.layer == Layer::Bundled))
            .collect();
        assert_eq!(
            summary,
            [
                ("a.rhai", "site a", false),
                ("b.rhai", "bundled b", true),
                ("c.rhai", "site c", false)
            ]
        );
    }
}
