//! Render: the model in, haproxy.cfg and its auxiliary files out. Pure and deterministic.
//!
//! haproxy.cfg comes from minijinja templates (bundled, overridable per site) with strict
//! undefined behaviour and an output guard ([`formatter`]). Map files, the crt-list and PEM
//! files are data, written by Rust.

mod backend;
mod bundled;
mod content;
pub mod formatter;
mod section_cache;
mod sections;
mod views;

pub use content::Content;
use content::Shared;

use std::collections::BTreeMap;
use std::sync::Arc;

use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde::Serialize;

use crate::layers::{self, ReadLayer, SiteFiles, SourceFile};
use crate::model::{MapEntry, Model, RouteMaps};

/// The template rendered into haproxy.cfg.
pub const ENTRY_TEMPLATE: &str = "haproxy.cfg.j2";
/// File names, relative to the config directory (HAProxy runs with `default-path config`).
pub const CONFIG_FILE: &str = "haproxy.cfg";
pub const EXACT_MAP: &str = "maps/exact.map";
pub const PREFIX_MAP: &str = "maps/prefix.map";
pub const SSL_REDIRECT_MAP: &str = "maps/ssl-redirect.map";
pub const CRT_LIST: &str = "certs/crt-list.txt";
/// `ssl-passthrough`: TLS server name → TCP backend; written only when passthrough is used.
pub const SNI_MAP: &str = "maps/sni.map";

/// Rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    ReadTemplates(#[from] ReadLayer),
    #[error("{file}: line {line}: {message}")]
    TemplateCompile {
        file: String,
        line: usize,
        message: String,
    },
    #[error("template {entry} is missing")]
    MissingEntry { entry: &'static str },
    #[error("{file}: line {line}: {message}")]
    TemplateRender {
        file: String,
        line: usize,
        message: String,
    },
    #[error("{file}: refusing to write entry {line:?}: it is not a single key and value")]
    UnsafeMapEntry { file: &'static str, line: String },
}

/// What templates see besides the model: where the auxiliary files are.
#[derive(Debug, Serialize)]
struct Files {
    exact_map: &'static str,
    prefix_map: &'static str,
    ssl_redirect_map: &'static str,
    crt_list: &'static str,
    sni_map: &'static str,
}

const FILES: Files = Files {
    exact_map: EXACT_MAP,
    prefix_map: PREFIX_MAP,
    ssl_redirect_map: SSL_REDIRECT_MAP,
    crt_list: CRT_LIST,
    sni_map: SNI_MAP,
};

/// The rendered configuration: every file, by path relative to the config directory. The
/// contents are shared: copies of a configuration, and configurations that differ in a few
/// files, do not copy the rest. The table is shared too: with a certificate file per TLS
/// Secret it has thousands of names, and the output is copied on every run and apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedConfig {
    files: Arc<BTreeMap<String, Content>>,
}

impl RenderedConfig {
    /// haproxy.cfg as text (copied into one string when it is held in pieces).
    pub fn haproxy_cfg(&self) -> std::borrow::Cow<'_, str> {
        self.file(CONFIG_FILE).unwrap_or_default()
    }

    /// File `name` as text, when there is one and it is UTF-8.
    pub fn file(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
        self.files.get(name).and_then(Content::text)
    }

    pub fn files(&self) -> &BTreeMap<String, Content> {
        &self.files
    }

    /// A configuration from (path, content) pairs, for tests and tools.
    pub fn from_files<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Self {
            files: Arc::new(
                files
                    .into_iter()
                    .map(|(n, c)| (n.to_string(), Content::whole(c.as_bytes().to_vec())))
                    .collect(),
            ),
        }
    }

    /// The sections of haproxy.cfg with their line ranges, so that a line HAProxy names can
    /// be traced to the proxy (and through the model to the objects) that produced it.
    pub fn sections(&self) -> Vec<Section> {
        Section::all(&self.haproxy_cfg())
    }
}

/// One section of haproxy.cfg: its keyword, its name and its lines (1-based, inclusive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub keyword: String,
    pub name: String,
    pub first_line: usize,
    pub last_line: usize,
}

/// The keywords that open a section (HAProxy's configuration manual, section 2.1 and on).
const SECTION_KEYWORDS: &[&str] = &[
    "global",
    "defaults",
    "frontend",
    "backend",
    "listen",
    "peers",
    "userlist",
    "resolvers",
    "http-errors",
    "ring",
    "cache",
    "program",
    "mailers",
    "log-forward",
];

impl Section {
    /// The sections of `cfg`, in order. A section runs until the next one opens.
    fn all(cfg: &str) -> Vec<Section> {
        let mut sections: Vec<Section> = Vec::new();
        let mut last = 0;
        for (i, line) in cfg.lines().enumerate() {
            last = i + 1;
            if line.starts_with(char::is_whitespace) || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let Some(keyword) = words.next().filter(|w| SECTION_KEYWORDS.contains(w)) else {
                continue;
            };
            if let Some(open) = sections.last_mut() {
                open.last_line = i;
            }
            sections.push(Section {
                keyword: keyword.to_string(),
                name: words.next().unwrap_or_default().to_string(),
                first_line: i + 1,
                last_line: i + 1,
            });
        }
        if let Some(open) = sections.last_mut() {
            open.last_line = last;
        }
        sections
    }

    /// The section holding line `line` (1-based).
    pub fn containing(sections: &[Section], line: usize) -> Option<&Section> {
        sections
            .iter()
            .find(|s| s.first_line <= line && line <= s.last_line)
    }
}

/// The hook points of the bundled templates: (the key in `site_parts`, the part's name
/// without `.j2`). The bundled part of each is empty.
pub const HOOK_PARTS: &[(&str, &str)] = &[
    ("global", "parts/site/global"),
    ("defaults", "parts/site/defaults"),
    ("frontend", "parts/site/frontend"),
    ("backend", "parts/site/backend"),
    ("route_policy", "parts/site/route-policy"),
];

/// `site_parts`: for each hook point, the site templates to include there, in name order:
/// `<part>.j2` when a site file overrides it, then every `<part>/NAME.j2` (one per directive
/// family). The bundled templates include nothing at a point without any: an include costs
/// a tenth of a backend's rendering, and the bundled parts are empty.
fn site_parts(files: &[SourceFile]) -> minijinja::Value {
    HOOK_PARTS
        .iter()
        .map(|(key, part)| {
            let single = format!("{part}.j2");
            let dir = format!("{part}/");
            let mut names: Vec<String> = files
                .iter()
                .filter(|f| {
                    (f.name == single && matches!(f.layer, layers::Layer::Site { .. }))
                        || (f.name.starts_with(&dir) && f.name.ends_with(".j2"))
                })
                .map(|f| f.name.clone())
                .collect();
            // `<part>.j2` sorts before `<part>/…` ('.' < '/').
            names.sort_unstable();
            (*key, names)
        })
        .collect::<BTreeMap<&str, Vec<String>>>()
        .into()
}

/// Compiled templates.
#[derive(Debug)]
pub struct Renderer {
    /// Tells renderers apart (see [`Renderer::id`]).
    id: u64,
    env: Environment<'static>,
    templates: Vec<SourceFile>,
    /// The last haproxy.cfg [`Renderer::render_config_cached`] made, by the fingerprint of
    /// its model.
    last_config: std::sync::Mutex<Option<(u128, Content)>>,
    /// Backend sections remembered across renders (see [`section_cache`]).
    sections: std::sync::Arc<section_cache::SectionCache>,
    /// Where the sections sit in the last renderings, for [`Renderer::render_patched`].
    layouts: std::sync::Mutex<std::collections::VecDeque<sections::Layout>>,
    /// Threads that render sections ahead of a full render (see
    /// [`section_cache::SectionCache::render_ahead`]).
    workers: crate::parallel::Workers,
}

impl Renderer {
    /// Compiles the bundled templates overlaid by the site's. Every compile error is reported.
    pub fn load(site: Option<&SiteFiles>) -> Result<Self, Vec<RenderError>> {
        Self::compile(layers::effective(bundled::TEMPLATES, site))
    }

    pub fn compile(files: Vec<SourceFile>) -> Result<Self, Vec<RenderError>> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        let mut syntax = minijinja::syntax::SyntaxConfig::builder();
        syntax
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(true);
        if let Ok(config) = syntax.build() {
            env.set_syntax(config);
        }
        formatter::register(&mut env);
        env.add_global("site_parts", site_parts(&files));
        let sections = std::sync::Arc::default();
        sections::register(&mut env, &sections);
        let mut errors = Vec::new();
        for file in &files {
            if let Err(e) = env.add_template_owned(file.name.clone(), file.text.clone()) {
                errors.push(RenderError::TemplateCompile {
                    file: file.display_name("templates"),
                    line: e.line().unwrap_or(0),
                    message: e.detail().unwrap_or("syntax error").to_string(),
                });
            }
        }
        if !files.iter().any(|f| f.name == ENTRY_TEMPLATE) {
            errors.push(RenderError::MissingEntry {
                entry: ENTRY_TEMPLATE,
            });
        }
        if errors.is_empty() {
            static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
            Ok(Self {
                id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                env,
                templates: files,
                last_config: std::sync::Mutex::new(None),
                sections,
                layouts: std::sync::Mutex::default(),
                workers: crate::parallel::Workers::default(),
            })
        } else {
            Err(errors)
        }
    }

    /// Sets how many threads render sections ahead of a full render, from how many
    /// sections. The output is the same for any.
    pub fn set_workers(&mut self, workers: crate::parallel::Workers) {
        self.workers = workers;
    }

    /// How many threads render sections ahead of a full render (see [`Renderer::set_workers`]).
    pub fn workers(&self) -> crate::parallel::Workers {
        self.workers
    }

    /// Unique to this renderer in the process: the same id, the same templates.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// How many backend sections this renderer rendered rather than took from memory.
    pub fn sections_rendered(&self) -> u64 {
        self.sections.rendered_sections()
    }

    /// The effective template files.
    pub fn templates(&self) -> &[SourceFile] {
        &self.templates
    }

    /// haproxy.cfg for `model`; when the model is the one of the previous call (the same
    /// fingerprint of what templates see), that rendering again without running the
    /// templates. The planner renders every configuration with its runtime parts blanked,
    /// which for an endpoint change or a new path is the same model as before.
    pub fn render_config_cached(&self, model: &Model) -> Result<Content, RenderError> {
        let key = crate::fingerprint::of_serialized(model);
        if let Ok(last) = self.last_config.lock() {
            if let Some((k, cfg)) = last.as_ref() {
                if *k == key {
                    return Ok(cfg.clone());
                }
            }
        }
        let cfg = self
            .render(model)?
            .files()
            .get(CONFIG_FILE)
            .cloned()
            .unwrap_or_default();
        if let Ok(mut last) = self.last_config.lock() {
            *last = Some((key, cfg.clone()));
        }
        Ok(cfg)
    }

    /// An error of minijinja as a render error naming the template file and line.
    fn render_error(&self, e: &minijinja::Error) -> RenderError {
        // An error inside an included template is wrapped by the including one: report the
        // innermost, which names the file and line that failed.
        let mut e = e;
        while let Some(inner) =
            std::error::Error::source(e).and_then(|s| s.downcast_ref::<minijinja::Error>())
        {
            e = inner;
        }
        RenderError::TemplateRender {
            file: self.template_file(e.name().unwrap_or(ENTRY_TEMPLATE)),
            line: e.line().unwrap_or(0),
            message: e.detail().map_or_else(|| e.to_string(), str::to_string),
        }
    }

    /// How messages name template `name`: the site file that provides it, or the bundled one.
    fn template_file(&self, name: &str) -> String {
        self.templates
            .iter()
            .find(|t| t.name == name)
            .map_or_else(|| name.to_string(), |t| t.display_name("templates"))
    }

    fn remember_layout(&self, layout: sections::Layout) {
        if let Ok(mut layouts) = self.layouts.lock() {
            // The planner's blanked render comes between two real ones.
            if layouts.len() == 3 {
                layouts.pop_front();
            }
            layouts.push_back(layout);
        }
    }

    /// The files for `model`, made from `previous_rendered` (this renderer's rendering of
    /// `previous`) by rendering again only the backend sections that differ, when `model`
    /// has the same backends by name and differs otherwise only in fields no template read
    /// (a new path changes the map files alone), and the templates allow it (see
    /// [`sections`]). The other files are made again where their inputs changed. `None`
    /// when a patch cannot give the result: render in full then. The result is what
    /// [`Renderer::render`] gives for `model`.
    pub fn render_patched(
        &self,
        previous: &Model,
        previous_rendered: &RenderedConfig,
        model: &Model,
    ) -> Result<Option<RenderedConfig>, RenderError> {
        let Some(cfg) = previous_rendered.files.get(CONFIG_FILE) else {
            return Ok(None);
        };
        let layout = self
            .layouts
            .lock()
            .ok()
            .and_then(|layouts| layouts.iter().find(|l| l.cfg.ptr_eq(cfg)).cloned());
        let Some(layout) = layout else {
            return Ok(None);
        };
        let patched = sections::patch(&self.env, &self.sections, &layout, previous, model)
            .map_err(|e| self.render_error(&e))?;
        let Some(layout) = patched else {
            return Ok(None);
        };
        // With the same certificates and error pages (the usual case), the last table is
        // copied whole, thousands of certificate files at once, and only haproxy.cfg and the
        // maps are put in again.
        let copied = same_tls(previous, model) && previous.errorfiles == model.errorfiles;
        let mut files = if copied {
            (*previous_rendered.files).clone()
        } else {
            BTreeMap::new()
        };
        files.insert(CONFIG_FILE.to_string(), layout.cfg.clone());
        other_files(
            model,
            Some((previous, previous_rendered)),
            &mut files,
            copied,
        )?;
        self.remember_layout(layout);
        Ok(Some(RenderedConfig {
            files: Arc::new(files),
        }))
    }

    /// Renders every file. The same model always gives the same bytes.
    pub fn render(&self, model: &Model) -> Result<RenderedConfig, RenderError> {
        let template = self
            .env
            .get_template(ENTRY_TEMPLATE)
            .map_err(|e| self.render_error(&e))?;
        let files_value = views::to_value(&FILES);
        self.sections.begin();
        let (ctx, scope) = sections::begin_render(model, files_value.clone());
        self.sections
            .render_ahead(&self.env, model, &files_value, self.workers);
        let mut out = sections::Joiner::new(&scope);
        template
            .render_captured_to(&ctx, &mut out)
            .map_err(|e| self.render_error(&e))?;
        let (cfg, layout) =
            sections::finish_render(out, &ctx).map_err(|message| RenderError::TemplateRender {
                file: self.template_file(ENTRY_TEMPLATE),
                line: 0,
                message: message.to_string(),
            })?;
        if let Some(layout) = layout {
            self.remember_layout(layout);
        }
        let mut files: BTreeMap<String, Content> = BTreeMap::new();
        files.insert(CONFIG_FILE.to_string(), cfg);
        other_files(model, None, &mut files, false)?;
        Ok(RenderedConfig {
            files: Arc::new(files),
        })
    }
}

/// Whether two models have the same TLS settings (certificates, crt-list, CA files).
fn same_tls(a: &Model, b: &Model) -> bool {
    Arc::ptr_eq(&a.tls, &b.tls) || a.tls == b.tls
}

/// The files besides haproxy.cfg, into `files`: empty but for haproxy.cfg, or, when `copied`,
/// a copy of `previous`' files, whose TLS settings and error pages are the same as `model`'s
/// (only the maps are then put in again). Where `previous` (a model and its rendering) has
/// the same maps, TLS settings or error pages, their files are taken from it as they are.
fn other_files(
    model: &Model,
    previous: Option<(&Model, &RenderedConfig)>,
    files: &mut BTreeMap<String, Content>,
    copied: bool,
) -> Result<(), RenderError> {
    let taken = |name: &str| previous.and_then(|(_, r)| r.files.get(name).cloned());
    let same_maps = |pick: fn(&RouteMaps) -> &Vec<MapEntry>| {
        previous.is_some_and(|(m, _)| {
            Arc::ptr_eq(&m.maps, &model.maps) || pick(&m.maps) == pick(&model.maps)
        })
    };
    for (name, pick) in [
        (
            EXACT_MAP,
            (|m| &m.exact) as fn(&RouteMaps) -> &Vec<MapEntry>,
        ),
        (PREFIX_MAP, |m| &m.prefix),
        (SSL_REDIRECT_MAP, |m| &m.ssl_redirect),
        (SNI_MAP, |m| &m.sni),
    ] {
        if name == SNI_MAP && model.maps.sni.is_empty() {
            files.remove(SNI_MAP);
            continue;
        }
        let bytes = match (taken(name), previous) {
            (Some(bytes), _) if same_maps(pick) => bytes,
            // A few entries changed (a new path): the others' lines are copied from the file.
            (Some(bytes), Some((m, _))) => {
                patch_map_file(name, pick(&m.maps), &bytes, pick(&model.maps))?
            }
            _ => map_file(name, pick(&model.maps))?.into(),
        };
        files.insert(name.to_string(), bytes);
    }
    let tls_kept = previous.is_some_and(|(m, _)| same_tls(m, model));
    let pages_kept = previous.is_some_and(|(m, _)| m.errorfiles == model.errorfiles);
    if copied {
        debug_assert!(tls_kept && pages_kept, "copied only when they are the same");
        return Ok(());
    }
    if model.tls.enabled() {
        let list = match taken(CRT_LIST).filter(|_| tls_kept) {
            Some(bytes) => bytes,
            None => crt_list(model)?.into(),
        };
        files.insert(CRT_LIST.to_string(), list);
    }
    // CA bundles and client certificates haproxy.cfg names directly, certificates named by
    // the crt-list or directly by TCP binds, error pages (`errorfile` in defaults).
    // Certificates are shared with the model, not copied.
    let contents = (model.tls.static_files.iter().chain(&model.tls.pem_files))
        .map(|pem| {
            (
                pem.path.as_str(),
                Shared::from(pem.content.clone()),
                tls_kept,
            )
        })
        .chain(model.errorfiles.iter().map(|page| {
            let bytes = Shared::from(page.content.as_bytes().to_vec());
            (page.path.as_str(), bytes, pages_kept)
        }));
    for (path, content, same) in contents {
        let bytes = match taken(path).filter(|_| same) {
            Some(bytes) => bytes,
            None => Content::shared(content),
        };
        files.insert(path.to_string(), bytes);
    }
    Ok(())
}

/// The crt-list: each certificate file with the server names it is for.
fn crt_list(model: &Model) -> Result<Vec<u8>, RenderError> {
    let mut list = String::new();
    for entry in &model.tls.crt_list {
        let mut line = entry.path.to_string();
        if let Some(options) = &entry.options {
            line.push(' ');
            line.push_str(&options.crt_list_options());
        }
        for sni in &entry.sni {
            line.push(' ');
            line.push_str(sni);
        }
        check_map_line(CRT_LIST, &line, usize::MAX)?;
        list.push_str(&line);
        list.push('\n');
    }
    Ok(list.into_bytes())
}

fn map_file(name: &'static str, entries: &[MapEntry]) -> Result<Vec<u8>, RenderError> {
    let size = entries
        .iter()
        .map(|e| e.key.len() + e.value.len() + 2)
        .sum();
    let mut out = String::with_capacity(size);
    for e in entries {
        out.push_str(&e.key);
        out.push(' ');
        out.push_str(&e.value);
        out.push('\n');
    }
    // Every line holds two words and nothing special exactly when, over the whole file, the
    // spaces and newlines are one per line, no key or value is empty, and no byte is special:
    // passes over the file rather than over each line. Only a file that fails is gone
    // through entry by entry, for the line to name (or to pass: 0xC2 starts harmless
    // characters too).
    let (mut spaces, mut newlines, mut special) = (0usize, 0usize, false);
    // Byte counters over chunks short enough not to overflow: loops the compiler vectorizes.
    for chunk in out.as_bytes().chunks(255) {
        let (mut s, mut n, mut bad) = (0u8, 0u8, 0u8);
        for &b in chunk {
            s += u8::from(b == b' ');
            n += u8::from(b == b'\n');
            bad |= u8::from(special_byte(b) & (b != b'\n'));
        }
        spaces += usize::from(s);
        newlines += usize::from(n);
        special |= bad != 0;
    }
    let empty = entries
        .iter()
        .any(|e| e.key.is_empty() || e.value.is_empty());
    if special || empty || spaces != entries.len() || newlines != entries.len() {
        for e in entries {
            check_map_line(name, &format!("{} {}", e.key, e.value), 2)?;
        }
    }
    Ok(out.into_bytes())
}

/// The map file of `entries`, given `old_file`, the map file of `old`: runs of entries both
/// lists hold stay the old file's bytes, shared and not copied (entries taken from the last
/// run are the same shared strings, compared by address first), and only the others are
/// written and checked. A new path at 10 000 Ingresses so costs its own line, not a copy of
/// the two route maps (2.5 MB) beside the ones in force. The result is what [`map_file`]
/// makes of `entries` whatever the two lists hold; a file that is not `old`'s (by its
/// length) is made whole.
fn patch_map_file(
    name: &'static str,
    old: &[MapEntry],
    old_file: &Content,
    entries: &[MapEntry],
) -> Result<Content, RenderError> {
    let line_len = |e: &MapEntry| e.key.len() + e.value.len() + 2;
    if old.iter().map(line_len).sum::<usize>() != old_file.len() {
        return map_file(name, entries).map(Content::whole);
    }
    /// How far ahead in the old entries a new one is looked for: further means more entries
    /// removed at one place, which is then written rather than kept.
    const LOOKAHEAD: usize = 8;
    // The old entry `at` starts at byte `offset`; `written` holds the new lines that go
    // before it, replacing the old bytes from `replaced`.
    let (mut at, mut offset) = (0, 0);
    let mut replaced = 0;
    let mut written = String::new();
    let mut replacements: Vec<(std::ops::Range<usize>, Shared)> = Vec::new();
    let mut flush = |range: std::ops::Range<usize>, written: &mut String| {
        if !range.is_empty() || !written.is_empty() {
            replacements.push((range, std::mem::take(written).into_bytes().into()));
        }
    };
    for entry in entries {
        match old[at..].iter().take(LOOKAHEAD).position(|o| o == entry) {
            Some(skipped) => {
                // The old entries before it were removed (or changed).
                offset += old[at..at + skipped].iter().map(line_len).sum::<usize>();
                flush(replaced..offset, &mut written);
                at += skipped + 1;
                offset += line_len(entry);
                replaced = offset;
            }
            None => {
                let start = written.len();
                written.push_str(&entry.key);
                written.push(' ');
                written.push_str(&entry.value);
                check_map_line(name, &written[start..], 2)?;
                written.push('\n');
            }
        }
    }
    flush(replaced..old_file.len(), &mut written);
    Ok(old_file.splice(replacements))
}

/// A byte that makes a map line worth a closer look: a control character (or the first byte
/// of U+0080–U+00BF), or a character HAProxy treats specially.
fn special_byte(b: u8) -> bool {
    (b < 0x20)
        | (b == 0x7f)
        | (b == b'#')
        | (b == b'\'')
        | (b == b'"')
        | (b == b'\\')
        | (b == b'$')
        | (b == 0xc2)
}

/// Defence in depth: map and crt-list lines hold only validated words. A line that does not
/// split into the expected words, or holds a character HAProxy treats specially, is a bug
/// upstream; refuse to write it rather than let it change the meaning of the file.
///
/// Every map line of every run goes through here, so it works on bytes, in passes without
/// early exits or cross-byte state that the compiler can vectorize: a control character is a
/// byte below 0x20, 0x7F, or U+0080–U+009F (0xC2 then 0x80–0x9F in UTF-8).
fn check_map_line(file: &'static str, line: &str, words: usize) -> Result<(), RenderError> {
    let bytes = line.as_bytes();
    let special = bytes.iter().fold(false, |bad, &b| bad | special_byte(b));
    // 0xC2 also starts harmless characters (U+00A0–U+00BF): look closer only then.
    let bad_char = special
        && bytes.iter().enumerate().any(|(i, &b)| match b {
            0xc2 => matches!(bytes.get(i + 1), Some(0x80..=0x9f)),
            _ => b < 0x20 || matches!(b, 0x7f | b'#' | b'\'' | b'"' | b'\\' | b'$'),
        });
    let spaces = bytes.iter().filter(|&&b| b == b' ').count();
    // A space first, last or after another makes an empty word; so does an empty line.
    let empty_word = bytes.first().is_none_or(|&b| b == b' ')
        || bytes.last() == Some(&b' ')
        || (spaces > 1 && line.contains("  "));
    let bad = bad_char || empty_word || (words != usize::MAX && spaces + 1 != words);
    if bad {
        return Err(RenderError::UnsafeMapEntry {
            file,
            line: line.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An edit of a map: keep an entry (the same shared strings, or equal new ones), drop it,
    /// change its value, or put a new entry before it.
    #[derive(Debug, Clone)]
    enum MapEdit {
        Keep,
        KeepCopied,
        Drop,
        Change(String),
        Insert(String, String),
    }

    fn map_edit() -> impl proptest::strategy::Strategy<Value = MapEdit> {
        use proptest::prelude::*;
        prop_oneof![
            6 => Just(MapEdit::Keep),
            1 => Just(MapEdit::KeepCopied),
            1 => Just(MapEdit::Drop),
            1 => "[a-c]{1,3}".prop_map(MapEdit::Change),
            // Sometimes unsafe: the patch must refuse it as a whole render would.
            1 => ("[a-c/]{1,3}", "[a-c#]{1,3}").prop_map(|(k, v)| MapEdit::Insert(k, v)),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 1000, ..Default::default() })]
        #[test]
        fn a_patched_map_file_is_the_map_file(
            old in proptest::collection::vec(("[a-c/]{1,4}", "[a-c.]{1,3}"), 0..40),
            edits in proptest::collection::vec(map_edit(), 0..48),
        ) {
            let entry = |k: &str, v: &str| MapEntry { key: k.into(), value: v.into() };
            let old: Vec<MapEntry> = old.iter().map(|(k, v)| entry(k, v)).collect();
            let mut new = Vec::new();
            let mut edits = edits.into_iter();
            for e in &old {
                match edits.next().unwrap_or(MapEdit::Keep) {
                    MapEdit::Keep => new.push(e.clone()),
                    MapEdit::KeepCopied => new.push(entry(&e.key, &e.value)),
                    MapEdit::Drop => {}
                    MapEdit::Change(v) => new.push(entry(&e.key, &v)),
                    MapEdit::Insert(k, v) => {
                        new.push(entry(&k, &v));
                        new.push(e.clone());
                    }
                }
            }
            for edit in edits {
                if let MapEdit::Insert(k, v) | MapEdit::Change(k @ v) = &edit {
                    new.push(entry(k, v));
                }
            }
            let old_file = Content::whole(map_file("test", &old).unwrap());
            let whole = format!("{:?}", map_file("test", &new));
            let patched = patch_map_file("test", &old, &old_file, &new);
            // And back, from the patched file (pieces of both buffers).
            if let Ok(patched) = &patched {
                let back = patch_map_file("test", &new, patched, &old).unwrap();
                proptest::prop_assert_eq!(back.bytes().into_owned(), old_file.bytes().into_owned());
            }
            let patched = format!("{:?}", patched.map(|c| c.bytes().into_owned()));
            proptest::prop_assert_eq!(&patched, &whole);
            // A file that is not the old entries' is made whole.
            let other = patch_map_file("test", &old, &Content::whole(b"x".to_vec()), &new);
            let other = format!("{:?}", other.map(|c| c.bytes().into_owned()));
            proptest::prop_assert_eq!(other, whole);
        }
    }

    /// What `check_map_line` decided before it became one pass over the bytes.
    fn check_map_line_by_chars(line: &str, words: usize) -> bool {
        let count = line.split(' ').count();
        let bad_char = line
            .chars()
            .any(|c| c.is_control() || matches!(c, '#' | '\'' | '"' | '\\' | '$'));
        let bad_words =
            line.split(' ').any(str::is_empty) || (words != usize::MAX && count != words);
        !(bad_char || bad_words)
    }

    #[test]
    fn map_lines_are_checked_as_before() {
        let lines = [
            "",
            " ",
            "a b",
            "a  b",
            " a b",
            "a b ",
            "a",
            "a b c",
            "a\tb",
            "a\u{7f} b",
            "a\u{85} b",
            "a\u{9f} b",
            "a\u{a0} b",
            "h\u{e9}.example.com/ x",
            "a# b",
            "a$ b",
            "a' b",
            "a\" b",
            "a\\ b",
            "a\u{2028} b",
            "\u{80}x y",
        ];
        for line in lines {
            for words in [1, 2, 3, usize::MAX] {
                assert_eq!(
                    check_map_line("test", line, words).is_ok(),
                    check_map_line_by_chars(line, words),
                    "{line:?} with {words} words"
                );
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, ..Default::default() })]
        #[test]
        fn map_files_are_checked_as_their_lines(
            entries in proptest::collection::vec(("[ a-z#\n\t\u{85}\u{a0}]{0,4}", "[ a-z$\n\u{9f}\u{a0}]{0,4}"), 0..6)
        ) {
            let entries: Vec<MapEntry> = entries
                .into_iter()
                .map(|(key, value)| MapEntry {
                    key: key.into(),
                    value: value.into(),
                })
                .collect();
            let lines_pass = entries
                .iter()
                .all(|e| check_map_line_by_chars(&format!("{} {}", e.key, e.value), 2));
            proptest::prop_assert_eq!(map_file("test", &entries).is_ok(), lines_pass);
        }

        #[test]
        fn any_map_line_is_checked_as_before(line in "[ a-z#$'\"\\\\\t\u{7f}-\u{a0}\u{e9}\u{2028}]{0,12}") {
            for words in [1, 2, 3, usize::MAX] {
                proptest::prop_assert_eq!(
                    check_map_line("test", &line, words).is_ok(),
                    check_map_line_by_chars(&line, words)
                );
            }
        }
    }

    /// A pipeline, the model of a synthetic cluster it made, and that model with the first
    /// server of one backend moved to 10.9.9.9:9999.
    fn synthetic_model_and_moved() -> (crate::pipeline::Pipeline, Model, Model) {
        let config = crate::translate::TranslateConfig {
            watch_ingress_without_class: true,
            ..crate::translate::TranslateConfig::default()
        };
        let pipeline = crate::pipeline::Pipeline::load(None, None, config).unwrap();
        let cluster = crate::synth::generate(&crate::synth::SynthConfig::new(5, 30, 3)).unwrap();
        let store = crate::store::Store::from_objects(cluster.objects);
        let base = pipeline.run(&store).unwrap().model;
        assert!(base.backends.len() >= 30);
        let mut moved = base.clone();
        let backend = std::sync::Arc::make_mut(&mut moved.backends[3]);
        std::sync::Arc::make_mut(&mut backend.servers).set(
            0,
            Some((
                crate::model::Address::Ip(std::net::Ipv4Addr::new(10, 9, 9, 9).into()),
                9999,
            )),
        );
        (pipeline, base, moved)
    }

    /// Patches keep the remembered sections of the backends they did not change: after any
    /// number of them, a full render redoes only the sections no render remembers.
    #[test]
    fn patches_keep_the_remembered_sections() {
        let (pipeline, base, moved) = synthetic_model_and_moved();
        let renderer = &pipeline.renderer;
        let mut rendered = renderer.render(&base).unwrap();
        let mut previous = base.clone();
        for model in [&moved, &base, &moved, &base, &moved] {
            rendered = renderer
                .render_patched(&previous, &rendered, model)
                .unwrap()
                .expect("a patch");
            previous = model.clone();
        }
        let before = renderer.sections_rendered();
        let full = renderer.render(&moved).unwrap();
        assert_eq!(full, rendered);
        assert_eq!(
            renderer.sections_rendered(),
            before,
            "sections rendered again"
        );
        // The section the last patch replaced is forgotten.
        renderer.render(&base).unwrap();
        assert_eq!(renderer.sections_rendered(), before + 1);
    }

    /// haproxy.cfg holds the remembered backend sections themselves, not copies: two renders
    /// of one model, and a patch of one section, share every other section's bytes.
    #[test]
    fn configurations_share_the_remembered_sections() {
        let (pipeline, base, moved) = synthetic_model_and_moved();
        let renderer = &pipeline.renderer;
        let cfg = |r: &RenderedConfig| r.files()[CONFIG_FILE].clone();
        let first = renderer.render(&base).unwrap();
        let second = renderer.render(&base).unwrap();
        let patched = renderer
            .render_patched(&base, &first, &moved)
            .unwrap()
            .expect("a patch");
        let held = |c: &Content| -> Vec<*const u8> { c.pieces().map(<[u8]>::as_ptr).collect() };
        let (a, b, p) = (
            held(&cfg(&first)),
            held(&cfg(&second)),
            held(&cfg(&patched)),
        );
        let backends = base.backends.len();
        let shared = |x: &[*const u8], y: &[*const u8]| x.iter().filter(|p| y.contains(p)).count();
        assert!(
            shared(&a, &b) >= backends,
            "{} of {backends}",
            shared(&a, &b)
        );
        assert!(
            shared(&a, &p) >= backends - 1,
            "{} of {backends}",
            shared(&a, &p)
        );
        assert_eq!(cfg(&first), cfg(&second));
    }

    /// After a new path, the model differs in the map entries (which haproxy.cfg does not
    /// print) and in a backend: the patch renders that section, makes the map file again
    /// and gives what a full render gives. A difference a template read (the version, in
    /// the header) makes it decline; so does one a section being patched reads now.
    #[test]
    fn patches_follow_map_changes_and_decline_what_templates_read() {
        let (pipeline, base, moved) = synthetic_model_and_moved();
        let with_new_path = |m: &Model| {
            let mut m = m.clone();
            let maps = std::sync::Arc::make_mut(&mut m.maps);
            maps.exact.push(MapEntry {
                key: "zz.example.com/new".into(),
                value: m.backends[3].name.as_str().into(),
            });
            m
        };
        let remapped = with_new_path(&moved);
        let renderer = &pipeline.renderer;
        let rendered = renderer.render(&base).unwrap();
        let patched = renderer
            .render_patched(&base, &rendered, &remapped)
            .unwrap()
            .expect("a patch");
        let fresh = Renderer::load(None).unwrap().render(&remapped).unwrap();
        assert_eq!(patched, fresh);
        assert_ne!(patched.files()[EXACT_MAP], rendered.files()[EXACT_MAP]);
        let mut versioned = remapped.clone();
        versioned.version = "other".to_string();
        assert!(declines(renderer, &remapped, &patched, &versioned));

        // A site section template that prints the exact map's size for one server only.
        let site = site_backend_template(
            "{% if backend.servers[0].address == \"10.9.9.9\" %}\
             # {{ model.maps.exact|length }} exact\n{% endif %}",
        );
        let renderer =
            Renderer::load(Some(&crate::layers::read_for_tests(site.path(), "j2"))).unwrap();
        let rendered = renderer.render(&base).unwrap();
        assert!(
            declines(&renderer, &base, &rendered, &remapped),
            "the moved backend's section reads the exact map, which changed"
        );
        let full = renderer.render(&remapped).unwrap();
        let line = format!("# {} exact", remapped.maps.exact.len());
        assert!(full.haproxy_cfg().contains(&line));
        // Rendered again, that section comes from memory without the template running: what
        // it read still counts, so one more exact entry is not patched in beside the old count.
        let again = renderer.render(&remapped).unwrap();
        assert_eq!(again, full);
        let one_more = with_new_path(&remapped);
        assert!(
            declines(&renderer, &remapped, &again, &one_more),
            "a remembered section read the exact map, which changed"
        );
    }

    /// Remembered backend sections never show an old backend or an old rest of the model.
    #[test]
    fn remembered_backend_sections_follow_the_model() {
        let (pipeline, base, moved) = synthetic_model_and_moved();
        let mut renamed = moved.clone();
        renamed.version = "other".to_string();
        let fresh = |m: &Model| {
            let r = Renderer::load(None).unwrap();
            r.render(m).unwrap().haproxy_cfg().to_string()
        };
        let warm = &pipeline.renderer;
        for model in [&base, &moved, &base, &renamed, &moved, &moved] {
            assert_eq!(
                warm.render(model).unwrap().haproxy_cfg(),
                fresh(model).as_str()
            );
        }
        assert!(fresh(&moved).contains("10.9.9.9:9999"));
    }

    /// A remembered section is used again only when every model field its render read is
    /// the same: a site section template that prints the version, or another backend's
    /// server, follows them.
    #[test]
    fn remembered_sections_follow_what_their_template_read() {
        let (_, base, moved) = synthetic_model_and_moved();
        let mut renamed = base.clone();
        renamed.version = "other".to_string();
        let mut renamed_moved = moved.clone();
        renamed_moved.version = "other".to_string();
        let models = [
            &base,
            &moved,
            &renamed,
            &base,
            &renamed_moved,
            &moved,
            &base,
        ];
        for extra in [
            "# version {{ model.version }}\n",
            "# fourth {{ model.backends[3].servers[0].port }}\n",
            "{% if model.peers %}# peers{% endif %}\n",
        ] {
            let site = site_backend_template(extra);
            let warm =
                Renderer::load(Some(&crate::layers::read_for_tests(site.path(), "j2"))).unwrap();
            // Sections rendered ahead by worker threads, each with a view of its own.
            let mut ahead =
                Renderer::load(Some(&crate::layers::read_for_tests(site.path(), "j2"))).unwrap();
            ahead.set_workers(crate::parallel::Workers {
                threads: 3,
                min_items: 1,
            });
            for model in models {
                let mut fresh =
                    Renderer::load(Some(&crate::layers::read_for_tests(site.path(), "j2")))
                        .unwrap();
                fresh.set_workers(crate::parallel::Workers::ONE);
                let expected = fresh.render(model).unwrap();
                assert_eq!(warm.render(model).unwrap(), expected, "{extra}");
                assert_eq!(ahead.render(model).unwrap(), expected, "{extra}, ahead");
                let cfg = expected.haproxy_cfg();
                assert!(cfg.lines().any(|l| l.starts_with("# ")), "{extra}");
            }
        }
    }

    /// The lazily converted maps read as the maps themselves: by field and as a whole.
    #[test]
    fn templates_read_the_maps_as_they_are() {
        let (_, base, _) = synthetic_model_and_moved();
        let site = tempfile::tempdir().unwrap();
        std::fs::write(
            site.path().join(ENTRY_TEMPLATE),
            "{{ model.maps.exact|length }} {{ model.maps.prefix[0].key }}\n\
             {% for k, v in model.maps|items %}{{ k }}={{ v|length }} {% endfor %}\n",
        )
        .unwrap();
        let renderer =
            Renderer::load(Some(&crate::layers::read_for_tests(site.path(), "j2"))).unwrap();
        let cfg = renderer.render(&base).unwrap().haproxy_cfg().to_string();
        let lines: Vec<&str> = cfg.lines().collect();
        assert_eq!(
            lines[0],
            format!("{} {}", base.maps.exact.len(), base.maps.prefix[0].key)
        );
        let m = &base.maps;
        assert_eq!(
            lines[1].trim(),
            format!(
                "exact={} prefix={} ssl_redirect={} sni={}",
                m.exact.len(),
                m.prefix.len(),
                m.ssl_redirect.len(),
                m.sni.len()
            )
        );
    }

    /// A patched configuration is the full rendering; a template that reads backends (but
    /// their names) outside `backend_section` gets full renderings. (Using a section other
    /// than by printing it makes a plain string, which the output guard refuses anyway.)
    #[test]
    fn patched_configurations_are_full_renderings_or_none() {
        let (pipeline, base, moved) = synthetic_model_and_moved();
        let entry = |body: &str| {
            let site = tempfile::tempdir().unwrap();
            std::fs::write(
                site.path().join(ENTRY_TEMPLATE),
                format!("{body}\n{{% include \"parts/default-backend.j2\" %}}\n"),
            )
            .unwrap();
            Renderer::load(Some(&crate::layers::read_for_tests(site.path(), "j2"))).unwrap()
        };
        let sections = "{% for b in model.backends %}{{ backend_section(b) }}{% endfor %}";
        let cases = [
            (pipeline.renderer.templates().to_vec(), true),
            (entry(sections).templates().to_vec(), true),
            (
                entry(&format!(
                    "# {{{{ model.backends[0].servers|length }}}}\n{sections}"
                ))
                .templates()
                .to_vec(),
                false,
            ),
            (
                entry(&format!("# {{{{ model.backends[0].name }}}}\n{sections}"))
                    .templates()
                    .to_vec(),
                true,
            ),
        ];
        for (templates, patchable) in cases {
            let renderer = Renderer::compile(templates).unwrap();
            let before = renderer.render(&base).unwrap();
            let patched = renderer.render_patched(&base, &before, &moved).unwrap();
            assert_eq!(patched.is_some(), patchable);
            if let Some(patched) = patched {
                assert_eq!(patched, renderer.render(&moved).unwrap());
                assert!(patched.haproxy_cfg().contains("10.9.9.9"));
            }
        }
        // Not a backend change alone: no patch.
        let renderer = &pipeline.renderer;
        let before = renderer.render(&base).unwrap();
        let mut renamed = moved;
        renamed.version = "other".to_string();
        assert!(declines(renderer, &base, &before, &renamed));
    }

    /// A site directory whose `parts/backend.j2` is the bundled one followed by `extra`.
    fn site_backend_template(extra: &str) -> tempfile::TempDir {
        let bundled = Renderer::load(None)
            .unwrap()
            .templates()
            .iter()
            .find(|t| t.name == "parts/backend.j2")
            .unwrap()
            .text
            .clone();
        let site = tempfile::tempdir().unwrap();
        std::fs::create_dir(site.path().join("parts")).unwrap();
        std::fs::write(
            site.path().join("parts/backend.j2"),
            format!("{bundled}{extra}"),
        )
        .unwrap();
        site
    }

    /// Whether `render_patched` declines to patch `rendered` (of `previous`) for `model`.
    fn declines(
        renderer: &Renderer,
        previous: &Model,
        rendered: &RenderedConfig,
        model: &Model,
    ) -> bool {
        renderer
            .render_patched(previous, rendered, model)
            .unwrap()
            .is_none()
    }

    /// HAProxy refuses a configuration holding a NUL character ("Stray NUL character"): a
    /// template that prints one is refused at render, naming the site file.
    #[test]
    fn a_nul_character_in_the_output_is_refused() {
        let site = tempfile::tempdir().unwrap();
        std::fs::write(site.path().join(ENTRY_TEMPLATE), "global\n# \0\n").unwrap();
        let renderer =
            Renderer::load(Some(&crate::layers::read_for_tests(site.path(), "j2"))).unwrap();
        let (_, base, _) = synthetic_model_and_moved();
        let err = renderer.render(&base).unwrap_err().to_string();
        assert!(err.contains("NUL"), "{err}");
        assert!(err.contains(&site.path().display().to_string()), "{err}");
    }

    /// A site entry template whose body is `body` with `SECTION` replaced by `section`.
    fn entry_renderer(body: &str, section: &str) -> Renderer {
        let site = tempfile::tempdir().unwrap();
        std::fs::write(
            site.path().join(ENTRY_TEMPLATE),
            body.replace("SECTION", section),
        )
        .unwrap();
        Renderer::load(Some(&crate::layers::read_for_tests(site.path(), "j2"))).unwrap()
    }

    /// A section printed into a captured block (a `{% set %}` block, a macro, a `{% call %}`
    /// block, a filtered block) is its text there, as the include would print; the render is
    /// then whole, and not patched.
    #[test]
    fn sections_printed_into_captured_blocks_are_their_text() {
        let (_, base, moved) = synthetic_model_and_moved();
        let body = "{% macro m(backend) %}SECTION{% endmacro %}\n\
            {% macro wrap(b) %}{{ caller(b)|length }}{% endmacro %}\n\
            {% for backend in model.backends %}\n\
            {% set s %}SECTION{% endset %}\n\
            # {{ s|length }} {{ m(backend)|length }} {% call(backend) wrap(backend) %}SECTION{% endcall %} \
            {% filter length %}SECTION{% endfilter %}\n\
            SECTION{% endfor %}\n";
        let sections = entry_renderer(body, "{{ backend_section(backend) }}");
        let included = entry_renderer(body, "{% include \"parts/backend.j2\" %}");
        for model in [&base, &moved, &base] {
            let cfg = sections.render(model).unwrap();
            assert_eq!(cfg, included.render(model).unwrap());
            let text = cfg.haproxy_cfg();
            let counts: Vec<&str> = text.lines().filter(|l| l.starts_with("# ")).collect();
            assert_eq!(counts.len(), model.backends.len());
            for line in counts {
                let n: Vec<&str> = line[2..].split(' ').collect();
                assert!(
                    n.iter()
                        .all(|c| *c == n[0] && c.parse::<usize>().unwrap() > 0)
                );
            }
            assert!(text.contains(&format!("backend {}\n", model.backends[3].name)));
        }
        assert!(declines(
            &sections,
            &base,
            &sections.render(&base).unwrap(),
            &moved
        ));
        // Captured only: the sections are in the captured text alone.
        let captured = entry_renderer(
            "{% for backend in model.backends %}{% set s %}SECTION{% endset %}\
             # {{ s|length }}\n{% endfor %}",
            "{{ backend_section(backend) }}",
        );
        let text = captured.render(&base).unwrap().haproxy_cfg().to_string();
        assert_eq!(text.lines().count(), base.backends.len());
        assert!(!text.contains("backend "));
    }

    /// A patched haproxy.cfg is the whole render of the new model, patch after patch, with
    /// sections that grow, shrink, and are printed more than once.
    #[test]
    fn a_patched_render_is_the_whole_render() {
        let (pipeline, base, _) = synthetic_model_and_moved();
        let last = base.backends.len() - 1;
        let edit = |m: &Model, i: usize, slots: &[(usize, &str)]| {
            let mut m = m.clone();
            let servers = &mut std::sync::Arc::make_mut(&mut m.backends[i]).servers;
            for (slot, address) in slots {
                let occupant = (!address.is_empty())
                    .then(|| (crate::model::Address::Ip(address.parse().unwrap()), 8080));
                std::sync::Arc::make_mut(servers).set(*slot, occupant);
            }
            m
        };
        let grown = edit(
            &edit(&base, 0, &[(5, "10.1.0.5"), (9, "10.1.0.9")]),
            last,
            &[(7, "10.2.0.7")],
        );
        let shrunk = edit(
            &edit(&grown, 0, &[(5, ""), (9, ""), (0, "")]),
            3,
            &[(1, "10.3.0.1")],
        );
        let twice = "{% for b in model.backends %}{% set s = backend_section(b) %}{{ s }}{{ s }}\
                     {% endfor %}";
        for renderer in [&pipeline.renderer, &entry_renderer(twice, "")] {
            let fresh = Renderer::compile(renderer.templates().to_vec()).unwrap();
            let mut previous = base.clone();
            let mut rendered = renderer.render(&base).unwrap();
            for model in [&grown, &shrunk, &base, &shrunk] {
                rendered = renderer
                    .render_patched(&previous, &rendered, model)
                    .unwrap()
                    .expect("a patch");
                assert_eq!(rendered, fresh.render(model).unwrap());
                previous = model.clone();
            }
            assert!(rendered.haproxy_cfg().contains("10.3.0.1:8080"));
        }
    }

    #[test]
    fn the_cached_configuration_follows_the_model() {
        let pipeline = crate::pipeline::Pipeline::load(
            None,
            None,
            crate::translate::TranslateConfig::default(),
        )
        .unwrap();
        let renderer = &pipeline.renderer;
        let store = crate::store::Store::from_objects(Vec::new());
        let mut a = pipeline.run(&store).unwrap().model;
        a.version = "a".to_string();
        let mut b = a.clone();
        b.version = "b".to_string();
        for model in [&a, &a, &b, &a, &b, &b] {
            let expected = renderer.render(model).unwrap().haproxy_cfg().to_string();
            assert!(
                renderer
                    .render_config_cached(model)
                    .unwrap()
                    .same_as_read(expected.as_bytes())
                    .unwrap()
            );
        }
        assert_ne!(
            crate::fingerprint::of_serialized(&a),
            crate::fingerprint::of_serialized(&b)
        );
    }
}
