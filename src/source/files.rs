//! The files source: every `*.yaml`, `*.yml` and `*.json` document under a directory.
//!
//! This is how Portcullis runs with no cluster. A malformed document is reported with its file
//! and document index; every other document still loads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::diagnostics::{Diagnostic, Diagnostics, Severity, Subject};
use crate::objects::{Key, Kind, Object, ParseError};

/// Errors that stop the whole source (as opposed to one bad document).
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("reading manifest directory {path}: {source}")]
    ReadDir {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a directory of manifests held.
#[derive(Debug, Default)]
pub struct Loaded {
    pub objects: Vec<Object>,
    pub diagnostics: Diagnostics,
}

/// Reads every manifest under `dir`, recursively, in path order. Entries whose name starts with
/// `.` are skipped: a ConfigMap volume keeps its real files under `..data`, reached through the
/// visible symlinks.
pub fn load_dir(dir: &Path) -> Result<Loaded, FilesError> {
    load_dir_cached(dir, &ParseCache::default())
}

/// One document's outcome: (document index, object or why not).
type Parsed = Vec<(usize, Result<(Kind, Key, Object), String>)>;

/// The parsed documents of each file, by a fingerprint of its content: `run` reads the whole
/// directory on every change, and a file whose bytes did not change is not parsed again. A
/// file whose stamp (`Stamp`) did not change since it was read, long enough after its last change,
/// is not even read again.
#[derive(Debug)]
pub struct ParseCache {
    files: std::sync::Mutex<HashMap<PathBuf, Cached>>,
    /// How long before it is read a file must have last changed for its stamp to vouch for
    /// its content.
    margin: std::time::Duration,
}

impl Default for ParseCache {
    fn default() -> Self {
        Self {
            files: std::sync::Mutex::default(),
            margin: std::time::Duration::from_secs(1),
        }
    }
}

#[derive(Debug)]
struct Cached {
    fingerprint: u128,
    parsed: std::sync::Arc<Parsed>,
    /// The file's stamp when it was read, when it can vouch for the content (see [`Stamp`]).
    stamp: Option<Stamp>,
}

/// What `stat` says of a file. Writing a file, replacing it (a rename, a ConfigMap volume's
/// `..data` swap) or touching it sets its status-change time (ctime) to the present, which
/// nothing can set back. So a file read when its ctime was already past by more than the
/// clock's coarseness, and whose stamp is the same now, still has the content read then. One
/// changed within that margin before it was read is read again next time (as git does with
/// "racily clean" files).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    device: u64,
    inode: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl Stamp {
    /// The file's stamp, when reading it now lets the stamp vouch for its content later.
    fn vouching(metadata: &std::fs::Metadata, margin: std::time::Duration) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let stamp = Self::of(metadata);
        let changed = std::time::UNIX_EPOCH
            + std::time::Duration::new(
                u64::try_from(metadata.ctime()).ok()?,
                u32::try_from(metadata.ctime_nsec()).ok()?,
            );
        let settled = changed + margin < std::time::SystemTime::now();
        settled.then_some(stamp)
    }

    fn of(metadata: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            device: metadata.dev(),
            inode: metadata.ino(),
            len: metadata.len(),
            modified: (metadata.mtime(), metadata.mtime_nsec()),
            changed: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }
}

/// [`load_dir`], parsing only files whose content is not in `cache`.
pub fn load_dir_cached(dir: &Path, cache: &ParseCache) -> Result<Loaded, FilesError> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    files.sort();
    let mut loaded = Loaded::default();
    // The last definition of a kind/namespace/name wins, with a warning naming both places.
    let mut parsed_files = Vec::new();
    let mut cached = cache.files.lock().unwrap_or_else(|e| e.into_inner());
    cached.retain(|path, _| files.contains(path));
    for file in files {
        let display = file
            .strip_prefix(dir)
            .unwrap_or(&file)
            .display()
            .to_string();
        // Stat first: a change between the stat and the read only makes the stamp older.
        let metadata = std::fs::metadata(&file).ok();
        if let (Some(metadata), Some(entry)) = (&metadata, cached.get(&file)) {
            if entry.stamp == Some(Stamp::of(metadata)) {
                parsed_files.push((display, entry.parsed.clone()));
                continue;
            }
        }
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                loaded.diagnostics.push(Diagnostic {
                    severity: Severity::Error,
                    subject: Subject::File { file: display },
                    field: None,
                    message: format!("cannot read: {e}"),
                });
                continue;
            }
        };
        let fingerprint = crate::fingerprint::of_bytes(text.as_bytes());
        let parsed = match cached.get(&file) {
            Some(entry) if entry.fingerprint == fingerprint => entry.parsed.clone(),
            _ => std::sync::Arc::new(parse_file(&file, &text)),
        };
        let stamp = metadata
            .as_ref()
            .and_then(|m| Stamp::vouching(m, cache.margin));
        cached.insert(
            file.clone(),
            Cached {
                fingerprint,
                parsed: parsed.clone(),
                stamp,
            },
        );
        parsed_files.push((display, parsed));
    }
    let mut seen: Seen = HashMap::with_capacity(parsed_files.iter().map(|(_, p)| p.len()).sum());
    for (display, parsed) in &parsed_files {
        add_documents(&mut loaded, &mut seen, display, parsed);
    }
    Ok(loaded)
}

/// Where each object was defined: file (as messages name it) and document index.
type Seen<'a> = HashMap<(Kind, &'a Key), (&'a str, usize)>;

/// Adds the documents of one file: its objects, and an error for each document that is not
/// one. The last definition of a kind/namespace/name wins, with a warning naming both places.
fn add_documents<'a>(
    loaded: &mut Loaded,
    seen: &mut Seen<'a>,
    display: &'a str,
    parsed: &'a Parsed,
) {
    for (index, outcome) in parsed {
        match outcome {
            Ok((kind, key, object)) => {
                if let Some((file_before, index_before)) =
                    seen.insert((*kind, key), (display, *index))
                {
                    loaded.diagnostics.push(Diagnostic {
                        severity: Severity::Warning,
                        subject: Subject::Object(object.object_ref()),
                        field: None,
                        message: format!(
                            "defined twice; {display} (document {index}) replaces the one in \
                             {file_before} (document {index_before})"
                        ),
                    });
                }
                loaded.objects.push(object.clone());
            }
            Err(reason) => loaded
                .diagnostics
                .push(document_error(display, *index, reason.clone())),
        }
    }
}

/// Every document of one file: objects, and why the others are not.
fn parse_file(file: &Path, text: &str) -> Parsed {
    let mut out = Vec::new();
    for (index, doc) in parse_documents(file, text).into_iter().enumerate() {
        let index = index + 1;
        let values = match doc {
            Ok(serde_json::Value::Null) => continue,
            Ok(v) => expand_list(v),
            Err(reason) => {
                out.push((index, Err(reason)));
                continue;
            }
        };
        for value in values {
            match Object::from_value(value) {
                Ok(object) => out.push((index, Ok((object.kind(), object.key(), object)))),
                Err(ParseError::UnsupportedKind(_)) => {}
                Err(e) => out.push((index, Err(e.to_string()))),
            }
        }
    }
    out
}

fn document_error(file: &str, index: usize, message: String) -> Diagnostic {
    Diagnostic {
        severity: Severity::Error,
        subject: Subject::Document {
            file: file.to_string(),
            index,
        },
        field: None,
        message,
    }
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), FilesError> {
    let entries = std::fs::read_dir(dir).map_err(|source| FilesError::ReadDir {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks, as a ConfigMap volume needs.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            collect_files(&path, out)?;
        } else if is_manifest(&path) {
            out.push(path);
        }
    }
    Ok(())
}

fn is_manifest(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// Splits a file into documents. A YAML syntax error ends the file at that document; the
/// documents before it still load.
fn parse_documents(path: &Path, text: &str) -> Vec<Result<serde_json::Value, String>> {
    if path.extension().and_then(|e| e.to_str()) == Some("json") {
        return serde_json::Deserializer::from_str(text)
            .into_iter::<serde_json::Value>()
            .map(|r| r.map_err(|e| e.to_string()))
            .collect();
    }
    let mut docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(text) {
        match <serde_yaml::Value as serde::Deserialize>::deserialize(de) {
            Ok(v) => docs.push(yaml_to_json(v)),
            Err(e) => {
                docs.push(Err(e.to_string()));
                break;
            }
        }
    }
    docs
}

fn yaml_to_json(v: serde_yaml::Value) -> Result<serde_json::Value, String> {
    serde_json::to_value(v).map_err(|e| format!("not representable as JSON: {e}"))
}

/// A `kind: List` document holds its objects under `items`.
fn expand_list(v: serde_json::Value) -> Vec<serde_json::Value> {
    if v.get("kind").and_then(|k| k.as_str()) == Some("List") {
        if let Some(serde_json::Value::Array(items)) = v.get("items") {
            return items.clone();
        }
    }
    vec![v]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache gives what a fresh read gives: changed, removed and broken files included.
    #[test]
    fn cached_loads_follow_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ParseCache::default();
        let names = |loaded: &Loaded| -> Vec<String> {
            let mut n: Vec<String> = loaded.objects.iter().map(|o| o.key().to_string()).collect();
            n.sort();
            n
        };
        let same = |cache: &ParseCache| {
            let cached = load_dir_cached(dir.path(), cache).unwrap();
            let fresh = load_dir(dir.path()).unwrap();
            assert_eq!(names(&cached), names(&fresh));
            let text = |l: Loaded| -> Vec<String> {
                l.diagnostics
                    .into_sorted()
                    .iter()
                    .map(ToString::to_string)
                    .collect()
            };
            let (c, f) = (names(&cached), text(cached));
            assert_eq!(f, text(fresh));
            (c, f)
        };
        let service = |name: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\n")
        };
        std::fs::write(dir.path().join("a.yaml"), service("a")).unwrap();
        std::fs::write(
            dir.path().join("b.yaml"),
            format!("{}---\n: [\n", service("b")),
        )
        .unwrap();
        let (objects, diags) = same(&cache);
        assert_eq!(objects, ["ns/a", "ns/b"]);
        assert_eq!(diags.len(), 1, "{diags:?}");
        // Read again from the cache: the broken document is still reported.
        assert_eq!(same(&cache).1.len(), 1);
        std::fs::write(dir.path().join("a.yaml"), service("c")).unwrap();
        std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
        let (objects, diags) = same(&cache);
        assert_eq!(objects, ["ns/c"]);
        assert!(diags.is_empty(), "{diags:?}");
    }

    /// With stamps vouching at once (no margin), files replaced by a rename with the same
    /// size, rewritten with another size, or removed and written again are still seen.
    #[test]
    fn stamps_see_replaced_and_rewritten_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ParseCache {
            margin: std::time::Duration::ZERO,
            ..ParseCache::default()
        };
        let service = |name: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\n")
        };
        let names = || -> Vec<String> {
            let mut n: Vec<String> = load_dir_cached(dir.path(), &cache)
                .unwrap()
                .objects
                .iter()
                .map(|o| o.key().name)
                .collect();
            n.sort();
            n
        };
        let replace = |file: &str, text: String| {
            let tmp = dir.path().join(".tmp");
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, dir.path().join(file)).unwrap();
        };
        replace("a.yaml", service("a1"));
        std::fs::write(dir.path().join("b.yaml"), service("b1")).unwrap();
        assert_eq!(names(), ["a1", "b1"]);
        assert_eq!(names(), ["a1", "b1"]);
        replace("a.yaml", service("a2"));
        assert_eq!(names(), ["a2", "b1"]);
        std::fs::write(dir.path().join("b.yaml"), service("b-two")).unwrap();
        assert_eq!(names(), ["a2", "b-two"]);
        std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
        assert_eq!(names(), ["a2"]);
        std::fs::write(dir.path().join("b.yaml"), service("b3")).unwrap();
        assert_eq!(names(), ["a2", "b3"]);
    }

    #[test]
    fn bad_document_is_reported_and_the_rest_loads() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {name: 'Bad Name'}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: b}\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(
            dir.path().join("sub/b.json"),
            r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"x"}}]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("c.yml"), "a: [unclosed\n").unwrap();
        let loaded = load_dir(dir.path()).unwrap();
        let names: Vec<_> = loaded
            .objects
            .iter()
            .map(|o| o.object_ref().to_string())
            .collect();
        assert_eq!(
            names,
            ["Service default/web", "ConfigMap default/cfg", "Secret x/s"]
        );
        let diags: Vec<_> = loaded
            .diagnostics
            .into_sorted()
            .iter()
            .map(|d| d.to_string())
            .collect();
        assert_eq!(diags.len(), 2, "{diags:?}");
        assert!(diags.iter().any(|d| d.contains("a.yaml (document 2)")));
        assert!(diags.iter().any(|d| d.contains("c.yml (document 1)")));
    }
}
