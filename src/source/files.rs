//! The files source: every `*.yaml`, `*.yml` and `*.json` document under a directory.
//!
//! This is how Portcullis runs with no cluster. A malformed document is reported with its file
//! and document index; every other document still loads. While a file holds a document that
//! does not parse, the objects it last produced stay in force (last good input): a typo never
//! takes routes away.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::diagnostics::{Diagnostic, Diagnostics, Severity, Subject};
use crate::objects::{Key, Kind, Object, ParseError};
use crate::store::{Mark, Store};

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

/// Whether every directory under `dir` can be listed, without reading a file: what `run`
/// needs to know at start, before its first read (parsing the directory only to check it took
/// half a second and a transient 100 MiB at 30 000 objects).
pub fn check_dir(dir: &Path) -> Result<(), FilesError> {
    collect_files(dir, &mut Vec::new())
}

/// One document's outcome: (document index, object or why not).
type Document = (usize, Result<(Kind, Key, Object), String>);

/// What one file yields: each document's outcome, and what it keeps of its last read.
#[derive(Debug, Default)]
struct Parsed {
    /// (document index, object or why not), in file order.
    documents: Vec<Document>,
    /// While some document does not parse: the objects the file produced when it was last
    /// read that its documents no longer define, with their document index then. A file with a
    /// broken document can still add and change objects, but removes none until it parses
    /// whole again (or is removed). Kept by kind and key, not by document index: an edit that
    /// adds or removes a document moves the indexes, and a broken document's key is unknown,
    /// while a key is never kept beside a document that defines it now.
    kept: Vec<(usize, Kind, Key, Object)>,
}

impl Parsed {
    /// Every object the file stands for: its documents' and the kept ones, with their indexes.
    fn objects(&self) -> impl Iterator<Item = (usize, Kind, &Key, &Object)> {
        let parsed = self.documents.iter().filter_map(|(index, outcome)| {
            outcome
                .as_ref()
                .ok()
                .map(|(kind, key, object)| (*index, *kind, key, object))
        });
        let kept = self
            .kept
            .iter()
            .map(|(index, kind, key, object)| (*index, *kind, key, object));
        parsed.chain(kept)
    }

    fn has_errors(&self) -> bool {
        self.documents.iter().any(|(_, outcome)| outcome.is_err())
    }

    /// `self` as the next read of a file that last stood for `previous`: while some document
    /// does not parse, the objects of `previous` that no document defines now are kept.
    fn keeping_last_good(mut self, previous: Option<&Parsed>) -> Self {
        let Some(previous) = previous.filter(|_| self.has_errors()) else {
            return self;
        };
        let defined: std::collections::HashSet<(Kind, &Key)> = self
            .documents
            .iter()
            .filter_map(|(_, outcome)| outcome.as_ref().ok().map(|(kind, key, _)| (*kind, key)))
            .collect();
        let kept: Vec<_> = previous
            .objects()
            .filter(|(_, kind, key, _)| !defined.contains(&(*kind, *key)))
            .map(|(index, kind, key, object)| (index, kind, key.clone(), object.clone()))
            .collect();
        self.kept = kept;
        self
    }
}

/// The parsed documents of each file, by a fingerprint of its content: `run` reads the whole
/// directory on every change, and a file whose bytes did not change is not parsed again. A
/// file whose stamp (`Stamp`) did not change since it was read, long enough after its last change,
/// is not even read again.
#[derive(Debug)]
pub struct ParseCache {
    files: std::sync::Mutex<HashMap<PathBuf, Cached>>,
    /// What [`sync_dir`] last brought a store to.
    definitions: std::sync::Mutex<Option<Definitions>>,
    /// How long before it is read a file must have last changed for its stamp to vouch for
    /// its content.
    margin: std::time::Duration,
    /// Whether a [`ParseCache::settle_later`] is pending.
    settling: std::sync::atomic::AtomicBool,
}

impl Default for ParseCache {
    fn default() -> Self {
        Self {
            files: std::sync::Mutex::default(),
            definitions: std::sync::Mutex::default(),
            margin: std::time::Duration::from_secs(1),
            settling: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl ParseCache {
    /// Whether some file was read too soon after its last change for its stamp to vouch for
    /// its content: the next read reads and fingerprints it again.
    pub fn unsettled(&self) -> bool {
        let cached = self.files.lock().unwrap_or_else(|e| e.into_inner());
        cached.values().any(|c| c.stamp.is_none())
    }

    /// Reads again the files whose stamps could not vouch for their content when they were
    /// read, now that they can, and keeps their stamps when the content is what was read then:
    /// the next read takes them by their stamps. Otherwise the first change after a file was
    /// written (a manifest of 20 MB written just before `run` started, say) waited for that
    /// file to be read and fingerprinted again, about 30 ms. A file whose content differs, or
    /// that changed within the margin again, is left to the next read. Does not hold the cache
    /// while reading.
    pub fn settle(&self) {
        let pending: Vec<(PathBuf, u128)> = {
            let cached = self.files.lock().unwrap_or_else(|e| e.into_inner());
            cached
                .iter()
                .filter(|(_, c)| c.stamp.is_none())
                .map(|(path, c)| (path.clone(), c.fingerprint))
                .collect()
        };
        for (path, fingerprint) in pending {
            // Stat first, as `read_files` does: a change after it only makes the stamp older.
            let Some(stamp) = std::fs::metadata(&path)
                .ok()
                .and_then(|m| Stamp::vouching(&m, self.margin))
            else {
                continue;
            };
            // Streamed: this runs beside the pipeline's run after a cold start, whose peak
            // memory a 20 MB manifest held whole would raise by as much.
            let read = std::fs::File::open(&path).and_then(crate::fingerprint::of_reader);
            if read.ok() != Some(fingerprint) {
                continue;
            }
            let mut cached = self.files.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = cached.get_mut(&path) {
                if entry.stamp.is_none() && entry.fingerprint == fingerprint {
                    entry.stamp = Some(stamp);
                }
            }
        }
    }

    /// [`ParseCache::settle`] on a thread of its own once the margin has passed, when some
    /// file needs it and none is pending.
    pub fn settle_later(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if !self.unsettled() || self.settling.swap(true, Ordering::AcqRel) {
            return;
        }
        let cache = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("manifests-settle".to_string())
            .spawn(move || {
                std::thread::sleep(cache.margin + std::time::Duration::from_millis(10));
                cache.settle();
                cache.settling.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.settling.store(false, Ordering::Release);
        }
    }
}

#[derive(Debug)]
struct Cached {
    fingerprint: u128,
    parsed: Arc<Parsed>,
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
    let (files, mut diagnostics) = read_files(dir, cache)?;
    let mut definitions = Definitions::default();
    definitions.update(&files);
    diagnostics.extend(definitions.diagnostics(&files));
    Ok(Loaded {
        objects: definitions.winners(&files),
        diagnostics,
    })
}

/// Brings `store` to what `dir` holds, as [`load_dir_cached`] would, but touching only the
/// objects of files that changed since the last call with this `cache` and this `store`: a
/// directory of 30 000 objects is not gone through again when one file changes. Returns the
/// problems found, in every file.
pub fn sync_dir(
    dir: &Path,
    cache: &ParseCache,
    store: &mut Store,
) -> Result<Diagnostics, FilesError> {
    let (files, mut diagnostics) = read_files(dir, cache)?;
    let mut kept = cache.definitions.lock().unwrap_or_else(|e| e.into_inner());
    // Definitions describe the store they were last synced into, as it was then.
    let fresh = kept.as_ref().is_none_or(|d| d.synced != Some(store.mark()));
    if fresh {
        *kept = Some(Definitions::default());
    }
    let definitions = kept.get_or_insert_with(Definitions::default);
    let touched = definitions.update(&files);
    if fresh {
        store.sync_to(definitions.winners(&files));
    } else {
        for (kind, key) in touched {
            match definitions.winner(kind, &key) {
                Some(object) => {
                    store.upsert_if_changed(object.clone());
                }
                None if store.holds(kind, &key) => store.delete(kind, &key),
                None => {}
            }
        }
    }
    definitions.synced = Some(store.mark());
    diagnostics.extend(definitions.diagnostics(&files));
    Ok(diagnostics)
}

/// A file read: its path, its name as messages give it, its documents.
type ReadFile = (PathBuf, String, Arc<Parsed>);

/// Every manifest file under `dir` in path order, parsed (from `cache` where its content did
/// not change), and the files that could not be read.
fn read_files(dir: &Path, cache: &ParseCache) -> Result<(Vec<ReadFile>, Diagnostics), FilesError> {
    let mut paths = Vec::new();
    collect_files(dir, &mut paths)?;
    paths.sort();
    let mut diagnostics = Diagnostics::default();
    let mut files = Vec::with_capacity(paths.len());
    let mut cached = cache.files.lock().unwrap_or_else(|e| e.into_inner());
    cached.retain(|path, _| paths.binary_search(path).is_ok());
    for file in paths {
        let display = file
            .strip_prefix(dir)
            .unwrap_or(&file)
            .display()
            .to_string();
        // Stat first: a change between the stat and the read only makes the stamp older.
        let metadata = std::fs::metadata(&file).ok();
        if let (Some(metadata), Some(entry)) = (&metadata, cached.get(&file)) {
            if entry.stamp == Some(Stamp::of(metadata)) {
                let parsed = entry.parsed.clone();
                files.push((file, display, parsed));
                continue;
            }
        }
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                // A file that exists but cannot be read keeps what it last stood for.
                let kept = cached.get(&file).map(|entry| entry.parsed.clone());
                let message = match kept {
                    Some(_) => format!(
                        "cannot read: {e}; the objects it last produced stay in force until it can be read"
                    ),
                    None => format!("cannot read: {e}"),
                };
                diagnostics.push(Diagnostic {
                    severity: Severity::Error,
                    subject: Subject::File {
                        file: display.clone(),
                    },
                    field: None,
                    message,
                });
                if let Some(parsed) = kept {
                    files.push((file, display, parsed));
                }
                continue;
            }
        };
        let fingerprint = crate::fingerprint::of_bytes(text.as_bytes());
        let parsed = match cached.get(&file) {
            Some(entry) if entry.fingerprint == fingerprint => entry.parsed.clone(),
            previous => {
                Arc::new(parse_file(&file, &text).keeping_last_good(previous.map(|e| &*e.parsed)))
            }
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
        files.push((file, display, parsed));
    }
    Ok((files, diagnostics))
}

/// Where each kind and key is defined across the files. The last definition in path and
/// document order wins, with a warning naming both places.
#[derive(Debug, Default)]
struct Definitions {
    /// The files these definitions come from, by path.
    files: HashMap<PathBuf, Arc<Parsed>>,
    /// Every definition of each kind and key, in path and document order.
    by_key: HashMap<(Kind, Key), Vec<Definition>>,
    /// The kinds and keys defined more than once.
    twice: BTreeSet<(Kind, Key)>,
    /// The store these definitions were last synced into, as it was then.
    synced: Option<Mark>,
}

#[derive(Debug)]
struct Definition {
    path: Arc<Path>,
    display: Arc<str>,
    index: usize,
    object: Object,
}

impl Definitions {
    /// Takes `files` as the directory's content: drops the definitions of files that are gone
    /// or changed, adds those of files that are new or changed. Returns the kinds and keys
    /// whose definitions changed.
    fn update(&mut self, files: &[ReadFile]) -> BTreeSet<(Kind, Key)> {
        let mut touched = BTreeSet::new();
        let now: HashMap<&Path, &Arc<Parsed>> = files
            .iter()
            .map(|(path, _, parsed)| (path.as_path(), parsed))
            .collect();
        let gone: Vec<PathBuf> = self
            .files
            .iter()
            .filter(|(path, parsed)| {
                now.get(path.as_path())
                    .is_none_or(|p| !Arc::ptr_eq(p, parsed))
            })
            .map(|(path, _)| path.clone())
            .collect();
        for path in gone {
            let Some(parsed) = self.files.remove(&path) else {
                continue;
            };
            for (_, kind, key, _) in parsed.objects() {
                if let Some(list) = self.by_key.get_mut(&(kind, key.clone())) {
                    list.retain(|d| *d.path != *path);
                }
                touched.insert((kind, key.clone()));
            }
        }
        for (path, display, parsed) in files {
            if self.files.contains_key(path) {
                continue;
            }
            let (shared_path, shared_display): (Arc<Path>, Arc<str>) =
                (Arc::from(path.as_path()), Arc::from(display.as_str()));
            for (index, kind, key, object) in parsed.objects() {
                let list = self.by_key.entry((kind, key.clone())).or_default();
                // Nearly every object is defined once: no room for four (a push's first growth).
                list.reserve_exact(1);
                let at = list.partition_point(|d| (&*d.path, d.index) < (path.as_path(), index));
                list.insert(
                    at,
                    Definition {
                        path: shared_path.clone(),
                        display: shared_display.clone(),
                        index,
                        object: object.clone(),
                    },
                );
                touched.insert((kind, key.clone()));
            }
            self.files.insert(path.clone(), parsed.clone());
        }
        for entry in &touched {
            match self.by_key.get(entry).map(Vec::len) {
                Some(0) => {
                    self.by_key.remove(entry);
                    self.twice.remove(entry);
                }
                Some(1) | None => {
                    self.twice.remove(entry);
                }
                Some(_) => {
                    self.twice.insert(entry.clone());
                }
            }
        }
        touched
    }

    /// The object defined last under `kind` and `key`.
    fn winner(&self, kind: Kind, key: &Key) -> Option<&Object> {
        self.by_key
            .get(&(kind, key.clone()))
            .and_then(|list| list.last())
            .map(|d| &d.object)
    }

    /// The winning definitions, in the order of `files`.
    fn winners(&self, files: &[ReadFile]) -> Vec<Object> {
        let mut out = Vec::with_capacity(self.by_key.len());
        for (path, _, parsed) in files {
            for (index, kind, key, object) in parsed.objects() {
                let wins = self.twice.is_empty()
                    || !self.twice.contains(&(kind, key.clone()))
                    || self.by_key[&(kind, key.clone())]
                        .last()
                        .is_some_and(|d| *d.path == **path && d.index == index);
                if wins {
                    out.push(object.clone());
                }
            }
        }
        out
    }

    /// The documents of `files` that are not objects, the objects kept from a file's last
    /// read, and the objects defined twice.
    fn diagnostics(&self, files: &[ReadFile]) -> Diagnostics {
        let mut out = Diagnostics::default();
        for (_, display, parsed) in files {
            for (index, outcome) in &parsed.documents {
                if let Err(reason) = outcome {
                    out.push(document_error(display, *index, reason.clone()));
                }
            }
            if !parsed.kept.is_empty() {
                out.push(kept_notice(display, &parsed.kept));
            }
        }
        for entry in &self.twice {
            for pair in self.by_key[entry].windows(2) {
                let (before, after) = (&pair[0], &pair[1]);
                out.push(Diagnostic {
                    severity: Severity::Warning,
                    subject: Subject::Object(after.object.object_ref()),
                    field: None,
                    message: format!(
                        "defined twice; {} (document {}) replaces the one in {} (document {})",
                        after.display, after.index, before.display, before.index
                    ),
                });
            }
        }
        out
    }
}

/// Every document of one file: objects, and why the others are not.
fn parse_file(file: &Path, text: &str) -> Parsed {
    let mut out = Vec::new();
    let mut index = 0;
    // Each document becomes objects before the next is parsed: a document's JSON value takes
    // some ten times its text, and a file of 10 000 Ingresses' objects held as values at once
    // was most of a cold start's peak memory.
    for_each_document(file, text, |doc| {
        index += 1;
        let values = match doc {
            Ok(serde_json::Value::Null) => return,
            Ok(v) => expand_list(v),
            Err(reason) => {
                out.push((index, Err(reason)));
                return;
            }
        };
        for value in values {
            match Object::from_value(value) {
                Ok(object) => out.push((index, Ok((object.kind(), object.key(), object)))),
                Err(ParseError::UnsupportedKind(_)) => {}
                Err(e) => out.push((index, Err(e.to_string()))),
            }
        }
    });
    // Kept as long as the file is unchanged: without the growth's spare room (up to half).
    out.shrink_to_fit();
    Parsed {
        documents: out,
        kept: Vec::new(),
    }
}

/// How many kept objects a notice names; the rest are counted.
const KEPT_NAMED: usize = 5;

/// The error saying which objects a file with a broken document still stands for.
fn kept_notice(file: &str, kept: &[(usize, Kind, Key, Object)]) -> Diagnostic {
    let mut named: Vec<String> = kept
        .iter()
        .take(KEPT_NAMED)
        .map(|(_, _, _, object)| object.object_ref().to_string())
        .collect();
    if kept.len() > KEPT_NAMED {
        named.push(format!("and {} more", kept.len() - KEPT_NAMED));
    }
    Diagnostic {
        severity: Severity::Error,
        subject: Subject::File {
            file: file.to_string(),
        },
        field: None,
        message: format!(
            "a document does not parse: the objects it last produced stay in force until it does ({})",
            named.join(", ")
        ),
    }
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

/// Gives each document of a file to `each`, in order, one at a time. A YAML file is split
/// into documents at its marker lines first ([`yaml_documents`]) and each is parsed on its
/// own, so a syntax error costs only its document. JSON has no markers: a syntax error ends a
/// JSON file at that document, and the documents before it still load.
fn for_each_document(
    path: &Path,
    text: &str,
    mut each: impl FnMut(Result<serde_json::Value, String>),
) {
    if path.extension().and_then(|e| e.to_str()) == Some("json") {
        for doc in serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>() {
            let failed = doc.is_err();
            each(doc.map_err(|e| e.to_string()));
            // serde_json cannot resume after a syntax error: it would report it forever.
            if failed {
                break;
            }
        }
        return;
    }
    for (first_line, piece) in yaml_documents(text) {
        // A piece holds one document, or none (comments only): none gives nothing.
        match serde_saphyr::from_multiple_with_options::<serde_json::Value>(piece, yaml_options()) {
            Ok(docs) => docs.into_iter().for_each(|doc| each(Ok(doc))),
            Err(e) => each(Err(yaml_error(&e, first_line))),
        }
    }
}

/// How a manifest's YAML is read: YAML 1.2's core schema (`yes`, `0755` and `1_000` stay
/// strings, so an annotation's text is never turned into a number or a boolean), anchors,
/// aliases and merge keys, a key given twice refused, `.inf` and `.nan` read as JSON has
/// them (`null`), and the parser's default budget against alias bombs and deep nesting
/// (64 levels, 250,000 nodes a document). Public so that tools reading manifests read them
/// the same way.
pub fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::PassThrough,
    }
}

/// A YAML stream cut into its documents: (the 0-based line each starts at, its text). YAML
/// ends a document at a line that starts with `---` or `...` followed by a space, a tab or
/// the end of the line, wherever it is (inside a scalar too: such a line is forbidden
/// there). A `---` line begins the next document and stays with it (it may carry content);
/// a `...` line stays with the document it ends. Directive lines (`%YAML`) before a `---`
/// go with the document they precede.
fn yaml_documents(text: &str) -> Vec<(usize, &str)> {
    let marker = |line: &str, m: &str| {
        line.strip_prefix(m)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
    };
    let mut pieces = Vec::new();
    // The current piece: its byte offset and first line, and whether it holds only
    // directives, comments and blank lines so far.
    let (mut start, mut start_line, mut only_preamble) = (0, 0, true);
    let mut offset = 0;
    for (number, line) in text.split_inclusive('\n').enumerate() {
        let line_start = offset;
        offset += line.len();
        let body = line.strip_prefix('\u{feff}').unwrap_or(line);
        if marker(body, "---") {
            // A preamble of directives or comments belongs to this document.
            if line_start > start && !only_preamble {
                pieces.push((start_line, &text[start..line_start]));
                (start, start_line) = (line_start, number);
            }
            only_preamble = false;
        } else if marker(body, "...") {
            pieces.push((start_line, &text[start..offset]));
            (start, start_line, only_preamble) = (offset, number + 1, true);
        } else if only_preamble {
            let trimmed = body.trim();
            if !(trimmed.is_empty() || trimmed.starts_with('#') || body.starts_with('%')) {
                only_preamble = false;
            }
        }
    }
    if start < text.len() {
        pieces.push((start_line, &text[start..]));
    }
    pieces
}

/// A YAML error in a document that starts at `first_line` of its file, on one line, with
/// the file's line numbers (`... at line N, column M`), in the words meant for a manifest's
/// author rather than a Rust programmer.
fn yaml_error(e: &serde_saphyr::Error, first_line: usize) -> String {
    e.render_with_options(serde_saphyr::render_options! {
        formatter: &serde_saphyr::UserMessageFormatter,
        snippets: serde_saphyr::SnippetMode::Off,
        line_offset: u64::try_from(first_line).unwrap_or(u64::MAX),
    })
    .trim_end()
    .to_string()
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

    /// The names of the objects `dir` holds, sorted, read through `cache`.
    fn loaded_names(dir: &Path, cache: &ParseCache) -> Vec<String> {
        let mut n: Vec<String> = load_dir_cached(dir, cache)
            .unwrap()
            .objects
            .iter()
            .map(|o| o.key().name)
            .collect();
        n.sort();
        n
    }

    /// A cache whose stamps vouch for a file as soon as it was read (no margin).
    fn vouching_at_once() -> ParseCache {
        ParseCache {
            margin: std::time::Duration::ZERO,
            ..ParseCache::default()
        }
    }

    /// `sync_dir` keeps a store equal to a fresh read through changed, removed, broken and
    /// duplicated definitions, names only real changes in the journal, and starts over on a
    /// store it did not sync last.
    #[test]
    fn synced_store_follows_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = vouching_at_once();
        let doc = |name: &str, port: u16| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\n\
                 spec: {{ports: [{{port: {port}}}]}}\n---\n"
            )
        };
        let diagnostics = |d: Diagnostics| -> Vec<String> {
            d.into_sorted().iter().map(ToString::to_string).collect()
        };
        let mut store = Store::new();
        // Syncs, then checks the store against a fresh read: syncing a copy to the fresh
        // objects must change nothing. Returns how many changes the sync made.
        let step = |store: &mut Store| -> usize {
            let before = store.mark();
            let found = sync_dir(dir.path(), &cache, store).unwrap();
            let made = store.changes_since(before).unwrap().count();
            let fresh = load_dir(dir.path()).unwrap();
            assert_eq!(diagnostics(found), diagnostics(fresh.diagnostics));
            let mut copy = store.clone();
            let mark = copy.mark();
            copy.sync_to(fresh.objects);
            let differences: Vec<_> = copy.changes_since(mark).unwrap().collect();
            assert!(differences.is_empty(), "{differences:?}");
            made
        };
        let write = |file: &str, text: String| {
            let path = dir.path().join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("a.yaml", doc("a", 1) + doc("b", 1).as_str());
        write("b.yaml", doc("b", 2) + ": [\n");
        assert_eq!(step(&mut store), 2);
        assert_eq!(store.len(), 2);
        // The same files again: nothing changes.
        assert_eq!(step(&mut store), 0);
        // b.yaml's `b` goes: a.yaml's comes back.
        write("b.yaml", doc("c", 1));
        assert_eq!(step(&mut store), 2);
        // A file sorted between the two defines `b` and `c` again; then a.yaml goes.
        write("a1.yaml", doc("b", 3) + doc("c", 3).as_str());
        assert_eq!(step(&mut store), 1);
        std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
        assert_eq!(step(&mut store), 1);
        assert_eq!(store.len(), 2);
        // Rewritten with the same objects in another order: no change.
        write("a1.yaml", doc("c", 3) + doc("b", 3).as_str());
        assert_eq!(step(&mut store), 0);
        // Paths sort by component: a/z.yaml comes before b.yaml, whose `c` still wins.
        write("a/z.yaml", doc("c", 4));
        assert_eq!(step(&mut store), 0);
        // Another store is brought to the directory whole.
        let mut other = Store::new();
        assert_eq!(step(&mut other), 2);
        std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
        assert_eq!(step(&mut store), 1, "the first store, synced whole again");
    }

    /// With stamps vouching at once (no margin), files replaced by a rename with the same
    /// size, rewritten with another size, or removed and written again are still seen.
    #[test]
    fn stamps_see_replaced_and_rewritten_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = vouching_at_once();
        let service = |name: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\n")
        };
        let names = || loaded_names(dir.path(), &cache);
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

    /// A file read within the margin after it was written is settled once the margin has
    /// passed, when its content is what was read; one that changed in between is not, and
    /// the next read sees the change.
    #[test]
    fn files_read_too_soon_are_settled_once_their_stamps_can_vouch() {
        let dir = tempfile::tempdir().unwrap();
        let margin = std::time::Duration::from_secs(1);
        let cache = Arc::new(ParseCache {
            margin,
            ..ParseCache::default()
        });
        let service = |name: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\n")
        };
        let names = || loaded_names(dir.path(), &cache);
        std::fs::write(dir.path().join("a.yaml"), service("a1")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), service("b1")).unwrap();
        assert_eq!(names(), ["a1", "b1"]);
        assert!(cache.unsettled());
        // Too soon: nothing can vouch yet.
        cache.settle();
        assert!(cache.unsettled());
        // b changes after it was read, keeping its length.
        std::fs::write(dir.path().join("b.yaml"), service("b2")).unwrap();
        std::thread::sleep(margin + std::time::Duration::from_millis(50));
        cache.settle();
        let stamped = |file: &str| {
            let cached = cache.files.lock().unwrap();
            cached[&dir.path().join(file)].stamp.is_some()
        };
        assert!(stamped("a.yaml"));
        assert!(!stamped("b.yaml"), "read as b1, now b2: not settled");
        assert_eq!(names(), ["a1", "b2"]);
        assert!(stamped("b.yaml"));
        assert!(!cache.unsettled());
        // In the background, as `run` does after each read.
        std::fs::write(dir.path().join("a.yaml"), service("a3")).unwrap();
        assert_eq!(names(), ["a3", "b2"]);
        cache.settle_later();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while cache.unsettled() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!cache.unsettled());
        assert_eq!(names(), ["a3", "b2"]);
    }

    /// YAML's document markers, wherever they are, and only they, cut a stream.
    #[test]
    fn yaml_streams_are_cut_at_their_marker_lines() {
        let starts = |text: &str| -> Vec<usize> {
            yaml_documents(text).iter().map(|(line, _)| *line).collect()
        };
        // A leading comment and a directive go with the first document.
        assert_eq!(starts("# c\n%YAML 1.2\n---\na: 1\n---\nb: 2\n"), [0, 4]);
        // `---` followed by content, `...` ending a document, a marker not followed by a
        // blank (`----`, `---x`) and one indented inside a block scalar are no cuts.
        let text = "--- {a: 1}\nb: |\n  ---\n  ----\n...\n----: x\n---x: y\n";
        assert_eq!(starts(text), [0, 5]);
        let pieces = yaml_documents(text);
        assert_eq!(pieces[0].1, "--- {a: 1}\nb: |\n  ---\n  ----\n...\n");
        assert_eq!(yaml_documents(""), []);
        assert_eq!(starts("a: 1\r\n---\r\nb: 2"), [0, 1]);
    }

    /// The documents of `text` read as the file `name`.
    fn documents(name: &str, text: &str) -> Vec<Result<serde_json::Value, String>> {
        let mut docs = Vec::new();
        for_each_document(Path::new(name), text, |d| docs.push(d));
        docs
    }

    /// What a manifest's YAML means: anchors, aliases and merge keys are followed, and
    /// `yes`, `0755` and `1_000` stay the strings an annotation needs (YAML 1.2's core
    /// schema); an empty document gives nothing; a key given twice is an error on the file's
    /// line; JSON files hold a stream of documents.
    #[test]
    fn yaml_is_read_with_the_core_schema_and_its_aliases() {
        let text = "a: &x {k: v}\nb: *x\nc: {<<: *x, d: 1}\nyes: yes\noct: 0755\n\
                    n: 1_000\nt: true\nf: .inf\n---\n# only a comment\n---\nb: 1\nb: 2\n";
        let docs = documents("a.yaml", text);
        assert_eq!(docs.len(), 2, "{docs:?}");
        assert_eq!(
            docs[0],
            Ok(serde_json::json!({
                "a": {"k": "v"}, "b": {"k": "v"}, "c": {"k": "v", "d": 1}, "yes": "yes",
                "oct": "0755", "n": "1_000", "t": true, "f": null,
            }))
        );
        let err = docs[1].as_ref().unwrap_err();
        assert!(err.contains("duplicate"), "{err}");
        assert!(err.ends_with("at line 13, column 1"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        let json = documents("a.json", "{\"a\": 1} {\"b\": [1, 2]}");
        assert_eq!(
            json,
            [
                Ok(serde_json::json!({"a": 1})),
                Ok(serde_json::json!({"b": [1, 2]}))
            ]
        );
    }

    /// Hostile YAML is an error on its document, not a hang, an exhausted memory or a
    /// panic: an alias bomb, nesting past the parser's depth, an undefined alias.
    #[test]
    fn hostile_yaml_is_refused_within_its_budget() {
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            bomb.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        for text in [bomb.as_str(), deep.as_str(), "a: *nowhere\n"] {
            let docs = documents("a.yaml", text);
            assert!(matches!(docs.as_slice(), [Err(_)]), "{docs:?}");
        }
    }

    /// One document with a YAML syntax error costs only itself, and is reported with its
    /// index and the file's line number.
    #[test]
    fn a_syntax_error_costs_only_its_document() {
        let dir = tempfile::tempdir().unwrap();
        let service = |name: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\n")
        };
        std::fs::write(
            dir.path().join("a.yaml"),
            format!(
                "{}---\nkind: Service\nmetadata: {{name: [x\n---\n{}",
                service("a"),
                service("c")
            ),
        )
        .unwrap();
        let loaded = load_dir(dir.path()).unwrap();
        let names: Vec<_> = loaded.objects.iter().map(|o| o.key().name).collect();
        assert_eq!(names, ["a", "c"]);
        let diags: Vec<_> = loaded
            .diagnostics
            .into_sorted()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert!(
            diags[0].starts_with("error: a.yaml (document 2): "),
            "{diags:?}"
        );
        // The error is on the file's line 6 or 7 (the flow sequence left open), not the
        // document's.
        assert!(
            diags[0].contains("at line 6") || diags[0].contains("at line 7"),
            "{diags:?}"
        );
    }

    /// Under `run`, a file that stops parsing keeps the objects it last produced: one broken
    /// document keeps its object, the others still change; a file broken whole keeps them
    /// all, with errors naming the file and document; parsing again, it removes what it no
    /// longer defines; removed, its objects go.
    #[test]
    fn a_broken_file_keeps_its_last_good_objects() {
        let dir = tempfile::tempdir().unwrap();
        let cache = vouching_at_once();
        let mut store = Store::new();
        let doc = |name: &str, port: u16| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: ns}}\n\
                 spec: {{ports: [{{port: {port}}}]}}\n---\n"
            )
        };
        let path = dir.path().join("a.yaml");
        let mut sync = |text: String| -> (Vec<(String, i64)>, Vec<String>) {
            std::fs::write(&path, text).unwrap();
            let diags = sync_dir(dir.path(), &cache, &mut store).unwrap();
            let held: Vec<(String, i64)> = ["a", "b", "c"]
                .iter()
                .filter_map(|name| {
                    let service = store.service(&Key::new("ns", *name))?;
                    Some((name.to_string(), i64::from(service.ports[0].port)))
                })
                .collect();
            let diags = diags
                .into_sorted()
                .iter()
                .map(ToString::to_string)
                .collect();
            (held, diags)
        };
        let held = |list: &[(&str, i64)]| -> Vec<(String, i64)> {
            list.iter().map(|(n, p)| (n.to_string(), *p)).collect()
        };
        let (objects, diags) = sync(doc("a", 1) + doc("b", 1).as_str() + doc("c", 1).as_str());
        assert_eq!(objects, held(&[("a", 1), ("b", 1), ("c", 1)]));
        assert!(diags.is_empty(), "{diags:?}");
        // b's document breaks while a changes and c goes: b stays as it was, a changes, c
        // (no longer defined, but the file does not parse) stays too.
        let (objects, diags) = sync(doc("a", 2) + "kind: Service\nmetadata: {name: [b\n---\n");
        assert_eq!(objects, held(&[("a", 2), ("b", 1), ("c", 1)]));
        assert_eq!(diags.len(), 2, "{diags:?}");
        assert!(
            diags[0].starts_with("error: a.yaml (document 2): "),
            "{diags:?}"
        );
        assert!(
            diags[1].starts_with("error: a.yaml: a document does not parse")
                && diags[1].contains("Service ns/b")
                && diags[1].contains("Service ns/c"),
            "{diags:?}"
        );
        // The whole file broken: everything stays; a document whose object does not parse
        // keeps its object too.
        let (objects, _) = sync(": [\n".to_string());
        assert_eq!(objects, held(&[("a", 2), ("b", 1), ("c", 1)]));
        let (objects, diags) = sync(
            "apiVersion: v1\nkind: Service\nmetadata: {name: 'Bad Name', namespace: ns}\n".into(),
        );
        assert_eq!(objects, held(&[("a", 2), ("b", 1), ("c", 1)]));
        assert!(
            diags[0].starts_with("error: a.yaml (document 1)"),
            "{diags:?}"
        );
        // Parsing again, the file stands for what it holds.
        let (objects, diags) = sync(doc("b", 3));
        assert_eq!(objects, held(&[("b", 3)]));
        assert!(diags.is_empty(), "{diags:?}");
        // A fresh read (`render`, `check`) has no last good input.
        std::fs::write(&path, doc("a", 4) + ": [\n").unwrap();
        let fresh = load_dir(dir.path()).unwrap();
        assert_eq!(fresh.objects.len(), 1);
        // Removed, the file's objects go.
        std::fs::remove_file(&path).unwrap();
        let diags = sync_dir(dir.path(), &cache, &mut store).unwrap();
        assert!(diags.is_empty());
        assert_eq!(store.len(), 0);
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
