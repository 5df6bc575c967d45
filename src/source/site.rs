//! A site's scripts and templates directories, read for the core, which reads no files itself.
//!
//! Every file with the extension is read, recursively; names starting with `.` are skipped
//! (a ConfigMap volume keeps its real files under `..data`, reached through visible symlinks).

use std::path::{Path, PathBuf};

use crate::layers::{ReadLayer, SiteFiles, SourceFile};
use crate::pipeline::{LoadError, Pipeline};
use crate::policy::{PolicyEngine, PolicyError};
use crate::render::{RenderError, Renderer};
use crate::translate::TranslateConfig;

/// The files with `extension` under `dir`, named by their path relative to it (`parts/x.j2`).
pub fn read(dir: &Path, extension: &str) -> Result<SiteFiles, ReadLayer> {
    let mut found = Vec::new();
    walk(dir, dir, extension, &mut found)?;
    let files = found
        .into_iter()
        .map(|(name, path)| {
            let text = std::fs::read_to_string(&path).map_err(|source| ReadLayer {
                path: path.clone(),
                source,
            })?;
            Ok(SiteFiles::file(&name, path, text))
        })
        .collect::<Result<Vec<SourceFile>, ReadLayer>>()?;
    Ok(SiteFiles(files))
}

/// The bundled scripts overlaid by those under `dir`, compiled.
pub fn load_policy(dir: Option<&Path>) -> Result<PolicyEngine, Vec<PolicyError>> {
    let site = dir
        .map(|d| read(d, "rhai"))
        .transpose()
        .map_err(|e| vec![PolicyError::from(e)])?;
    PolicyEngine::load(site.as_ref())
}

/// The bundled templates overlaid by those under `dir`, compiled.
pub fn load_renderer(dir: Option<&Path>) -> Result<Renderer, Vec<RenderError>> {
    let site = dir
        .map(|d| read(d, "j2"))
        .transpose()
        .map_err(|e| vec![RenderError::from(e)])?;
    Renderer::load(site.as_ref())
}

/// A pipeline of the bundled scripts and templates overlaid by the site directories.
pub fn load_pipeline(
    scripts_dir: Option<&Path>,
    templates_dir: Option<&Path>,
    config: TranslateConfig,
) -> Result<Pipeline, LoadError> {
    let scripts = scripts_dir
        .map(|d| read(d, "rhai"))
        .transpose()
        .map_err(|e| LoadError::Scripts(vec![PolicyError::from(e)]))?;
    let templates = templates_dir
        .map(|d| read(d, "j2"))
        .transpose()
        .map_err(|e| LoadError::Templates(vec![RenderError::from(e)]))?;
    Pipeline::load(scripts.as_ref(), templates.as_ref(), config)
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
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_the_files_with_the_extension_skipping_dot_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("parts")).unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        std::fs::write(dir.path().join("a.rhai"), "site a").unwrap();
        std::fs::write(dir.path().join("parts/b.rhai"), "site b").unwrap();
        std::fs::write(dir.path().join("..data/c.rhai"), "hidden").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let mut names: Vec<(String, String)> = read(dir.path(), "rhai")
            .unwrap()
            .0
            .into_iter()
            .map(|f| (f.name, f.text))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("a.rhai".to_string(), "site a".to_string()),
                ("parts/b.rhai".to_string(), "site b".to_string())
            ]
        );
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let err = load_pipeline(
            Some(Path::new("/nonexistent/scripts")),
            None,
            TranslateConfig::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/scripts"), "{err}");
    }
}
