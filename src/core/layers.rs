//! Layered sources: files compiled into the binary, overlaid by a site directory's.
//!
//! Scripts and templates both work this way: a site file with the same name replaces the
//! bundled one, a new name adds a file. The effective set is sorted by name, so every replica
//! evaluates scripts in the same order.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

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

/// A site directory's files of one kind (scripts or templates), as the controller read them
/// (`source::site`): the core reads no files itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SiteFiles(pub Vec<SourceFile>);

impl SiteFiles {
    /// A site file `name` (relative, e.g. `parts/backend.j2`) read from `path`.
    pub fn file(name: &str, path: PathBuf, text: String) -> SourceFile {
        SourceFile {
            name: name.to_string(),
            layer: Layer::Site { path },
            text,
        }
    }
}

/// The effective files: `bundled` (name, text) overlaid by the site's files.
pub fn effective(bundled: &[(&str, &str)], site: Option<&SiteFiles>) -> Vec<SourceFile> {
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
    for file in site.iter().flat_map(|s| &s.0) {
        files.insert(file.name.clone(), file.clone());
    }
    files.into_values().collect()
}

/// The files with `extension` under `dir`, for the core's own tests (the controller's reader is
/// `source::site`).
#[cfg(test)]
pub(crate) fn read_for_tests(dir: &std::path::Path, extension: &str) -> SiteFiles {
    fn walk(
        root: &std::path::Path,
        dir: &std::path::Path,
        extension: &str,
        out: &mut Vec<SourceFile>,
    ) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, extension, out);
            } else if path.extension().and_then(|e| e.to_str()) == Some(extension) {
                let name = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let text = std::fs::read_to_string(&path).unwrap();
                out.push(SiteFiles::file(&name, path, text));
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, dir, extension, &mut files);
    SiteFiles(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_files_override_and_add() {
        let site = SiteFiles(vec![
            SiteFiles::file("a.rhai", "/site/a.rhai".into(), "site a".to_string()),
            SiteFiles::file("c.rhai", "/site/c.rhai".into(), "site c".to_string()),
        ]);
        let files = effective(
            &[("a.rhai", "bundled a"), ("b.rhai", "bundled b")],
            Some(&site),
        );
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
