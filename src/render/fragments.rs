//! Backend sections rendered once per content, and configurations patched section by section.
//!
//! Backends are most of haproxy.cfg (10 000 Services make hundreds of thousands of lines), and
//! one change touches few of them. The bundled entry template prints each backend with
//! `{{ backend_section(backend) }}`, which renders `parts/backend.j2` (the effective one, site
//! overrides included) with `model`, `files` and `backend` — what `{% include %}` would see —
//! and remembers the text with a fingerprint of that backend and of each model field the render
//! read (the view notes them): the same inputs give the same text, so a remembered one is
//! printed as it is.
//!
//! Templates see the model as a [`ModelView`]: fields are converted to template values when a
//! template first reads them, and every backend is a [`BackendView`] that notes when a template
//! reads anything of it but its name (`backend_section` reads it without a note). A render in
//! which no template read a backend that way, and in which every section was printed as
//! itself, has a [`Layout`]: where each backend's section sits in haproxy.cfg. A model that
//! differs from that render's only inside some backends is then rendered by rendering those
//! sections and splicing them in ([`patch`]), which is what an endpoint change needs.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use minijinja::value::{Enumerator, Object, ObjectRepr};
use minijinja::{Environment, Error, State, Value};

use crate::fingerprint::Fingerprint;
use crate::model::{Backend, Model, UNUSED_SLOT_PORT};

/// The template `backend_section` renders.
const BACKEND_TEMPLATE: &str = "parts/backend.j2";
/// The context variable holding the render in progress.
pub(crate) const SCOPE_VAR: &str = "_portcullis_render";

/// Texts and fingerprints remembered across renders.
#[derive(Debug, Default)]
pub(crate) struct Fragments {
    /// Counts renders.
    render: u64,
    /// Backend fingerprint → the texts rendered for it, each with the model fields its
    /// render read and their fingerprints then.
    texts: HashMap<u128, Vec<Remembered>>,
    /// Backend fingerprints by the address of the shared backend (kept alive here, so the
    /// address is not reused while remembered) → (backend, fingerprint, last render).
    fingerprints: HashMap<usize, (Arc<Backend>, u128, u64)>,
    /// Sections rendered rather than taken from memory, for tests.
    rendered: u64,
}

impl Fragments {
    /// Starts a render: drops what the previous two renders did not use (the planner renders
    /// a blanked model between two real ones).
    fn begin(&mut self) -> u64 {
        self.render += 1;
        let keep_from = self.render.saturating_sub(2);
        self.texts.retain(|_, texts| {
            texts.retain(|t| t.used >= keep_from);
            !texts.is_empty()
        });
        self.fingerprints
            .retain(|_, (_, _, used)| *used >= keep_from);
        self.render
    }

    pub(crate) fn rendered_sections(&self) -> u64 {
        self.rendered
    }

    /// Forgets what was remembered for `backend`, which a patch replaced: patches start no
    /// render of their own (the sections they keep are those of the render they patch, and
    /// stay remembered with it), so they drop what they replace.
    fn replaced(&mut self, backend: &Arc<Backend>) {
        let address = Arc::as_ptr(backend) as usize;
        if let Some((_, fp, _)) = self.fingerprints.remove(&address) {
            self.texts.remove(&fp);
        }
    }

    /// A text remembered for backend `fp` whose render read model fields that `field` still
    /// gives the same fingerprints, with the names of those fields; noted as used by the
    /// current render.
    fn remembered(
        &mut self,
        fp: u128,
        field: impl Fn(&'static str) -> Option<u128>,
    ) -> Option<(Arc<str>, Vec<&'static str>)> {
        let render = self.render;
        let found = self.texts.get_mut(&fp)?.iter_mut().find(|t| {
            t.reads
                .iter()
                .all(|(name, value)| field(name) == Some(*value))
        })?;
        found.used = render;
        let reads = found.reads.iter().map(|(name, _)| *name).collect();
        Some((found.text.clone(), reads))
    }

    fn remember(&mut self, fp: u128, reads: Vec<(&'static str, u128)>, text: Arc<str>) {
        let used = self.render;
        let texts = self.texts.entry(fp).or_default();
        if texts.len() >= TEXTS_PER_BACKEND {
            if let Some(oldest) = (0..texts.len()).min_by_key(|&i| texts[i].used) {
                texts.swap_remove(oldest);
            }
        }
        // Most backends have one or two texts (the planner's blanked one): no room for
        // four (a push's first growth).
        texts.reserve_exact(1);
        texts.push(Remembered { reads, text, used });
    }

    /// The fingerprint of `backend` when it is known by its address; noted as used.
    fn known_fingerprint(&mut self, backend: &Arc<Backend>) -> Option<u128> {
        let render = self.render;
        let address = Arc::as_ptr(backend) as usize;
        let (_, fp, used) = self.fingerprints.get_mut(&address)?;
        *used = render;
        Some(*fp)
    }

    fn note_fingerprint(&mut self, backend: &Arc<Backend>, fp: u128) {
        let address = Arc::as_ptr(backend) as usize;
        self.fingerprints
            .insert(address, (backend.clone(), fp, self.render));
    }
}

/// The fingerprint of `backend`'s content, computed outside the lock (a serialization of
/// its servers: the workers of [`render_ahead`] make thousands at once).
fn content_fingerprint(backend: &Backend) -> u128 {
    let mut h = Fingerprint::new();
    // The slots as held, not as the list of every slot: a tenth of a cold run was hashing
    // the 420 000 slots of 10 000 backends one by one.
    h.add_serialized(&BackendWith(backend, backend.servers.compact()));
    h.finish()
}

/// Whether a text is remembered for `backend` (known by its address) for some model.
fn has_text(f: &Fragments, backend: &Arc<Backend>) -> bool {
    let address = Arc::as_ptr(backend) as usize;
    f.fingerprints
        .get(&address)
        .is_some_and(|(_, fp, _)| f.texts.contains_key(fp))
}

/// Renders ahead, on worker threads, the sections of the backends of `model` that have no
/// text remembered, and remembers them: a full render then prints them from memory. Each
/// worker renders with its own view of `model`, so what each section read is noted as in a
/// render of its own; the render checks those reads against its own view as it does for
/// any remembered text. Failures are left to the render, which reports them.
pub(crate) fn render_ahead(
    env: &Environment<'_>,
    fragments: &Mutex<Fragments>,
    model: &Model,
    files: &Value,
    workers: crate::parallel::Workers,
) {
    let missing: Vec<&Arc<Backend>> = match fragments.lock() {
        Ok(f) => model.backends.iter().filter(|b| !has_text(&f, b)).collect(),
        Err(_) => return,
    };
    if !workers.spread(missing.len()) {
        return;
    }
    crate::parallel::map_with(
        &missing,
        workers,
        || ModelView::value(model, &Arc::new(AtomicBool::new(false))),
        |view, backend| {
            let _ = section_text(env, fragments, view, files, backend);
        },
    );
}

/// A section text, and what else than its backend it depends on.
#[derive(Debug)]
struct Remembered {
    /// The model fields the render read, with their fingerprints.
    reads: Vec<(&'static str, u128)>,
    text: Arc<str>,
    /// The last render that used it.
    used: u64,
}

/// At most this many texts are kept per backend content (one per combination of the fields
/// it read; more only while those change back and forth).
const TEXTS_PER_BACKEND: usize = 4;

/// Whether two models have the same backends by name, in the same order.
fn same_backend_names(a: &Model, b: &Model) -> bool {
    a.backends.len() == b.backends.len()
        && a.backends
            .iter()
            .zip(&b.backends)
            .all(|(x, y)| x.name == y.name)
}

/// The fields of the model, as templates read them (`maps.<map>` for each map), in which
/// `a` and `b` differ; the backends aside.
fn differing_fields(a: &Model, b: &Model) -> Vec<&'static str> {
    // Every field named, so that a new one cannot be left out.
    let Model {
        version: _,
        listen: _,
        runtime_socket: _,
        global: _,
        maps: _,
        frontend_rules: _,
        redirect_codes: _,
        backends: _,
        default_backend: _,
        tls: _,
        peers: _,
        tcp: _,
        tcp_backends: _,
        userlists: _,
        errorfiles: _,
    } = a;
    let mut differing = Vec::new();
    let mut check = |name: &'static str, same: bool| {
        if !same {
            differing.push(name);
        }
    };
    check("version", a.version == b.version);
    check("listen", a.listen == b.listen);
    check("runtime_socket", a.runtime_socket == b.runtime_socket);
    check("global", a.global == b.global);
    if !Arc::ptr_eq(&a.maps, &b.maps) {
        check("maps.exact", a.maps.exact == b.maps.exact);
        check("maps.prefix", a.maps.prefix == b.maps.prefix);
        check(
            "maps.ssl_redirect",
            a.maps.ssl_redirect == b.maps.ssl_redirect,
        );
        check("maps.sni", a.maps.sni == b.maps.sni);
    }
    check("frontend_rules", a.frontend_rules == b.frontend_rules);
    check("redirect_codes", a.redirect_codes == b.redirect_codes);
    check("default_backend", a.default_backend == b.default_backend);
    check("tls", Arc::ptr_eq(&a.tls, &b.tls) || a.tls == b.tls);
    check("peers", a.peers == b.peers);
    check("tcp", a.tcp == b.tcp);
    check("tcp_backends", a.tcp_backends == b.tcp_backends);
    check("userlists", a.userlists == b.userlists);
    check("errorfiles", a.errorfiles == b.errorfiles);
    differing
}

/// One render in progress, reachable from template functions through [`SCOPE_VAR`].
#[derive(Debug)]
pub(crate) struct Scope {
    /// Set when a template read a backend other than through `backend_section`, or used a
    /// section other than by printing it into haproxy.cfg: the output then has no [`Layout`].
    touched: Arc<AtomicBool>,
    /// Whether the output guard is printing a section ([`Section::print`]).
    printing: AtomicBool,
    /// The section being printed, (index of the backend in the model, text), until the writer
    /// of haproxy.cfg takes it ([`Joiner`]): a section printed into a captured block (a
    /// `{% set %}` block, a macro, a filtered block) never reaches that writer.
    printed: Mutex<Option<(usize, Arc<str>)>>,
}

impl Scope {
    /// The section being printed, when `bytes` is its text (the very bytes: the guard writes
    /// the section's text as it is, and nothing else while it is being printed).
    fn take_printed(&self, bytes: &[u8]) -> Option<(usize, Arc<str>)> {
        if !self.printing.load(Ordering::Relaxed) {
            return None;
        }
        let mut printed = self.printed.lock().ok()?;
        let is_it = printed.as_ref().is_some_and(|(_, text)| {
            std::ptr::eq(text.as_ptr(), bytes.as_ptr()) && text.len() == bytes.len()
        });
        if is_it {
            self.printing.store(false, Ordering::Relaxed);
            printed.take()
        } else {
            None
        }
    }
}

impl Object for Scope {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }
}

/// The writer the entry template renders into: the template's own output, and where in it
/// each section printed into haproxy.cfg goes (the sections are not copied into it).
pub(crate) struct Joiner {
    scope: Arc<Scope>,
    /// The template's own output.
    own: Vec<u8>,
    /// (offset in `own`, index of the backend in the model, text), in output order.
    sections: Vec<(usize, usize, Arc<str>)>,
}

impl Joiner {
    pub(crate) fn new(scope: &Arc<Scope>) -> Self {
        Joiner {
            scope: scope.clone(),
            own: Vec::with_capacity(64 * 1024),
            sections: Vec::new(),
        }
    }
}

impl std::io::Write for Joiner {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self.scope.take_printed(bytes) {
            Some((backend, text)) => self.sections.push((self.own.len(), backend, text)),
            None => self.own.extend_from_slice(bytes),
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Where each backend section sits in a rendered haproxy.cfg, and what rendered it.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The haproxy.cfg this describes.
    pub cfg: super::Content,
    /// (index of the backend in the model, byte range), in output order.
    sections: Vec<(usize, Range<usize>)>,
    /// The `model` and `files` the templates saw, for sections rendered into this layout.
    model: Value,
    files: Value,
    touched: Arc<AtomicBool>,
}

/// Starts a render of `model`: the context templates get, and the scope to finish it with.
pub(crate) fn begin_render(
    fragments: &Mutex<Fragments>,
    model: &Model,
    files: Value,
) -> (Value, Arc<Scope>) {
    if let Ok(mut f) = fragments.lock() {
        f.begin();
    }
    let touched = Arc::new(AtomicBool::new(false));
    let scope = Arc::new(Scope {
        touched: touched.clone(),
        printing: AtomicBool::new(false),
        printed: Mutex::new(None),
    });
    let model = ModelView::value(model, &touched);
    let ctx = minijinja::context! {
        model => model,
        files => files,
        _portcullis_render => Value::from_dyn_object(scope.clone()),
    };
    (ctx, scope)
}

/// haproxy.cfg from a finished render: the entry template's own output with each section
/// printed into it put in its place. Returns haproxy.cfg and, when no template read a backend
/// or used a section except by printing it, its layout. haproxy.cfg holds the sections
/// themselves (shared with the remembered ones) and the template's own output, not copies.
pub(crate) fn finish_render(
    out: Joiner,
    ctx: &Value,
) -> Result<(super::Content, Option<Layout>), &'static str> {
    let Joiner {
        scope,
        own,
        sections: placed,
    } = out;
    // HAProxy refuses a configuration holding one ("Stray NUL character").
    if own.contains(&0) {
        return Err("the template output holds a NUL character");
    }
    let mut parts = Vec::with_capacity(2 * placed.len() + 2);
    let mut sections = Vec::with_capacity(placed.len());
    // Bytes of haproxy.cfg so far, and of `own` put in.
    let (mut len, mut at) = (0, 0);
    let mut last_byte = None;
    for (offset, backend, text) in placed {
        if offset > at {
            last_byte = own.get(offset - 1).copied();
        }
        parts.push(super::content::Part::Own(at..offset));
        len += offset - at;
        sections.push((backend, len..len + text.len()));
        len += text.len();
        last_byte = text.as_bytes().last().copied().or(last_byte);
        parts.push(super::content::Part::Shared(text.into()));
        at = offset;
    }
    if own.len() > at {
        last_byte = own.last().copied();
    }
    parts.push(super::content::Part::Own(at..own.len()));
    if last_byte != Some(b'\n') {
        parts.push(super::content::Part::Shared(b"\n".to_vec().into()));
    }
    let cfg = super::Content::assemble(own, parts);
    let layout = (!scope.touched.load(Ordering::Relaxed)).then(|| Layout {
        cfg: cfg.clone(),
        sections,
        model: ctx.get_attr("model").unwrap_or_default(),
        files: ctx.get_attr("files").unwrap_or_default(),
        touched: scope.touched.clone(),
    });
    Ok((cfg, layout))
}

/// haproxy.cfg for `model`, from `layout` (a render of `previous`) with the sections of the
/// backends that differ rendered again. `None` when `model` differs from `previous` outside
/// its backends' contents, or a template read what a patch cannot follow.
pub(crate) fn patch(
    env: &Environment<'static>,
    fragments: &Mutex<Fragments>,
    layout: &Layout,
    previous: &Model,
    model: &Model,
) -> Result<Option<Layout>, Error> {
    // Sections are rendered with the model the layout's render saw: the new model may
    // differ from it in fields no template has read (a new path changes the map files'
    // entries, which haproxy.cfg does not print), and in the backends' contents.
    let Some(view) = layout.model.downcast_object_ref::<ModelView>() else {
        return Ok(None);
    };
    if layout.touched.load(Ordering::Relaxed) || !same_backend_names(previous, model) {
        return Ok(None);
    }
    let differing = differing_fields(&view.model, model);
    // Checked again after the sections render; this saves rendering them for nothing.
    if view.read_any(&differing) {
        return Ok(None);
    }
    // No `begin`: starting a render would, after a few patches, drop the remembered sections
    // of every backend the patches kept, and the next full render would redo them all.
    let mut texts: HashMap<usize, Arc<str>> = HashMap::new();
    for (i, (old, new)) in previous.backends.iter().zip(&model.backends).enumerate() {
        if Arc::ptr_eq(old, new) || old == new {
            continue;
        }
        let text = section_text(env, fragments, &layout.model, &layout.files, new)?;
        if let Ok(mut f) = fragments.lock() {
            f.replaced(old);
        }
        texts.insert(i, text);
    }
    // A section template that read another backend saw the previous one; one that read a
    // field that differs saw the old value.
    if layout.touched.load(Ordering::Relaxed) || view.read_any(&differing) {
        return Ok(None);
    }
    // Byte ranges of a UTF-8 text, spliced with whole UTF-8 sections: still UTF-8. The
    // sections kept are shared with the last haproxy.cfg, not copied (see `Content`).
    let mut replacements = Vec::with_capacity(texts.len());
    let mut sections = Vec::with_capacity(layout.sections.len());
    // How far the sections after the replaced ones moved.
    let mut shift: isize = 0;
    for (backend, range) in &layout.sections {
        let start = range.start.saturating_add_signed(shift);
        let len = match texts.get(backend) {
            Some(text) => {
                replacements.push((range.clone(), text.clone().into()));
                shift += text.len() as isize - range.len() as isize;
                text.len()
            }
            None => range.len(),
        };
        sections.push((*backend, start..start + len));
    }
    Ok(Some(Layout {
        cfg: layout.cfg.splice(replacements),
        sections,
        ..layout.clone()
    }))
}

/// The text of `backend`'s section rendered with `model` and `files`: a remembered one when
/// the backend is the same and so is every field of the model that rendering it read.
fn section_text(
    env: &Environment<'_>,
    fragments: &Mutex<Fragments>,
    model: &Value,
    files: &Value,
    backend: &Arc<Backend>,
) -> Result<Arc<str>, Error> {
    // Only the model as the render gives it can say what a section read.
    let view = model.downcast_object_ref::<ModelView>();
    // The fragments are locked once for a backend known by its address, twice for a new
    // one (its fingerprint made between), and once after a render: the workers of a cold
    // run take the lock for each of 10 000 sections.
    let mut fp = None;
    if let Some(view) = view {
        let field = |name| view.fingerprint(name);
        let known = fragments.lock().ok().and_then(|mut f| {
            let fp = f.known_fingerprint(backend)?;
            Some((fp, f.remembered(fp, field)))
        });
        let remembered = match known {
            Some((known, remembered)) => {
                fp = Some(known);
                remembered
            }
            None => {
                let new = content_fingerprint(backend);
                fp = Some(new);
                fragments.lock().ok().and_then(|mut f| {
                    f.note_fingerprint(backend, new);
                    f.remembered(new, field)
                })
            }
        };
        if let Some((text, reads)) = remembered {
            // What its render read counts as read by this one, which printed it.
            view.note_reads(&reads);
            return Ok(text);
        }
    }
    let ctx = minijinja::context! {
        model => model.clone(),
        files => files.clone(),
        backend => backend_value(backend),
    };
    if let Some(view) = view {
        view.record();
    }
    let rendered = env
        .get_template(BACKEND_TEMPLATE)
        .and_then(|t| t.render(ctx));
    let reads = view.map(|v| v.recorded());
    let text: Arc<str> = Arc::from(rendered?);
    // A section that read the backends list (other backends) is not remembered.
    let reads = view.zip(reads).and_then(|(view, reads)| {
        reads
            .into_iter()
            .map(|name| Some((name, view.fingerprint(name)?)))
            .collect::<Option<Vec<_>>>()
    });
    if let Ok(mut f) = fragments.lock() {
        f.rendered += 1;
        if let (Some(fp), Some(reads)) = (fp, reads) {
            f.remember(fp, reads, text.clone());
        }
    }
    Ok(text)
}

/// `backend` as a template value: its fields as serde gives them, but its server slots as a
/// sequence whose slots are made when a template reads them. Serialized, the 42 slots of each
/// of 10 000 backends were a fifth of a cold run's rendering.
fn backend_value(backend: &Backend) -> Value {
    let servers = Value::from_object(SlotsView::new(&backend.servers));
    to_value(&BackendWith(backend, servers))
}

/// A backend serialized with its servers as `.1`.
struct BackendWith<'a, T>(&'a Backend, T);

impl<T: serde::Serialize> serde::Serialize for BackendWith<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // Every field named, in the order of `Backend`'s own serialization.
        let Backend {
            name,
            namespace,
            service,
            port,
            settings,
            policies,
            servers: _,
        } = self.0;
        let mut out = serializer.serialize_struct("Backend", 7)?;
        out.serialize_field("name", name)?;
        out.serialize_field("namespace", namespace)?;
        out.serialize_field("service", service)?;
        out.serialize_field("port", port)?;
        out.serialize_field("settings", settings)?;
        out.serialize_field("policies", policies)?;
        out.serialize_field("servers", &self.1)?;
        out.end()
    }
}

/// A backend's server slots as templates see them: `{name, address, port}` each.
#[derive(Debug)]
struct SlotsView {
    slots: Arc<crate::model::ServerSlots>,
    names: crate::model::SlotNames,
}

impl SlotsView {
    fn new(slots: &Arc<crate::model::ServerSlots>) -> Self {
        Self {
            names: crate::model::slot_names(slots.len()),
            slots: slots.clone(),
        }
    }
}

impl Object for SlotsView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let index = key.as_usize()?;
        let name = self.names.get(index)?.clone();
        let (address, port) = match self.slots.occupant(index) {
            Some((address, port)) => (Value::from(address), port),
            None => (Value::from(()), crate::model::UNUSED_SLOT_PORT),
        };
        Some(Value::from_object(SlotView {
            name: Value::from(name),
            address,
            port,
        }))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.names.len())
    }
}

/// `{{ backend.servers|slot_runs }}`: the slots in order as runs, each used slot alone and
/// each stretch of unused slots as one, so that a template prints a backend's 39 unused slots
/// (of 42, with 3 endpoints) as one `server-template` line instead of 39 `server` lines. A
/// run is `{name, address, port, prefix, first, last}`: `name`, `address` and `port` are the
/// first slot's, `first` and `last` the numbers of its first and last slot as in their names
/// (`prefix` then the number, `SRV_1` first); `first == last` for a used slot and may be for
/// an unused one.
fn slot_runs(servers: &Value) -> Result<Value, Error> {
    if let Some(view) = servers.downcast_object_ref::<SlotsView>() {
        let runs = view.slots.runs();
        return Ok(Value::from_object(SlotRunsView {
            slots: view.slots.clone(),
            names: view.names.clone(),
            runs,
        }));
    }
    // A list as serialized (a site template's own, say): runs by position.
    let items: Vec<Value> = servers.try_iter()?.collect();
    let mut runs = Vec::new();
    let mut unused_from: Option<(usize, Value)> = None;
    let unused = |(first, name): (usize, Value), last: usize| {
        run_value(
            name,
            Value::from(()),
            Value::from(UNUSED_SLOT_PORT),
            first,
            last,
        )
    };
    for (i, slot) in items.iter().enumerate() {
        let address = slot.get_attr("address")?;
        if address.is_true() {
            if let Some(from) = unused_from.take() {
                runs.push(unused(from, i - 1));
            }
            let (name, port) = (slot.get_attr("name")?, slot.get_attr("port")?);
            runs.push(run_value(name, address, port, i, i));
        } else if unused_from.is_none() {
            unused_from = Some((i, slot.get_attr("name")?));
        }
    }
    if let Some(from) = unused_from {
        runs.push(unused(from, items.len() - 1));
    }
    Ok(Value::from(runs))
}

/// A run as a template value (slot indexes `first..=last`).
fn run_value(name: Value, address: Value, port: Value, first: usize, last: usize) -> Value {
    Value::from_object(SlotRunView {
        name,
        address,
        port,
        first: first + 1,
        last: last + 1,
    })
}

/// A backend's slot runs, made as a template reads them.
#[derive(Debug)]
struct SlotRunsView {
    slots: Arc<crate::model::ServerSlots>,
    names: crate::model::SlotNames,
    runs: Vec<crate::model::SlotRun>,
}

impl Object for SlotRunsView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        use crate::model::SlotRun;
        let (first, last) = match *self.runs.get(key.as_usize()?)? {
            SlotRun::Used(i) => (i, i),
            SlotRun::Unused { first, last } => (first, last),
        };
        let (address, port) = match self.slots.occupant(first) {
            Some((address, port)) => (Value::from(address), port),
            None => (Value::from(()), UNUSED_SLOT_PORT),
        };
        let name = Value::from(self.names.get(first)?.clone());
        Some(run_value(name, address, Value::from(port), first, last))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.runs.len())
    }
}

/// One run of slots as templates see it.
#[derive(Debug)]
struct SlotRunView {
    name: Value,
    address: Value,
    port: Value,
    /// Slot numbers, as in the names.
    first: usize,
    last: usize,
}

impl Object for SlotRunView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "name" => Some(self.name.clone()),
            "address" => Some(self.address.clone()),
            "port" => Some(self.port.clone()),
            "prefix" => Some(Value::from(crate::model::SLOT_NAME_PREFIX)),
            "first" => Some(Value::from(self.first)),
            "last" => Some(Value::from(self.last)),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["name", "address", "port", "prefix", "first", "last"])
    }
}

/// One server slot as templates see it.
#[derive(Debug)]
struct SlotView {
    name: Value,
    address: Value,
    port: u16,
}

impl Object for SlotView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "name" => Some(self.name.clone()),
            "address" => Some(self.address.clone()),
            "port" => Some(Value::from(self.port)),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(&["name", "address", "port"])
    }
}

/// A template value of `value`, as serde sees it.
pub(crate) fn to_value<T: serde::Serialize>(value: &T) -> Value {
    Value::from(minijinja::value::Serde(value))
}

/// A section returned by `backend_section`: printed, it is its text (see [`Section::print`]);
/// any other use (a filter, a concatenation) gets the text and leaves the render without a
/// layout.
#[derive(Debug)]
pub(crate) struct Section {
    /// Index of the backend in the model.
    backend: usize,
    text: Arc<str>,
    scope: Arc<Scope>,
}

impl Section {
    /// Prints the section's text for the output guard. Printed into haproxy.cfg, the writer
    /// takes it as a section with its place (see [`Joiner`]); printed into a captured block,
    /// it is text like any other there, and the render has no layout.
    pub(crate) fn print(&self, out: &mut minijinja::Output<'_>) -> std::fmt::Result {
        let scope = &self.scope;
        if let Ok(mut printed) = scope.printed.lock() {
            *printed = Some((self.backend, self.text.clone()));
            scope.printing.store(true, Ordering::Relaxed);
        }
        let written = out.write_str(&self.text);
        if scope.printing.swap(false, Ordering::Relaxed) {
            if let Ok(mut printed) = scope.printed.lock() {
                *printed = None;
            }
            scope.touched.store(true, Ordering::Relaxed);
        }
        written
    }
}

impl Object for Section {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.scope.touched.store(true, Ordering::Relaxed);
        f.write_str(&self.text)
    }
}

/// The model as templates see it: each field converted when first read.
#[derive(Debug)]
struct ModelView {
    model: Model,
    backends: Value,
    fields: Mutex<HashMap<&'static str, Value>>,
    /// Field fingerprints, computed when a remembered section needs them.
    fingerprints: Mutex<HashMap<&'static str, u128>>,
    /// The fields read by each section render in progress, innermost last.
    recording: Mutex<Vec<Vec<&'static str>>>,
    /// Every field any template has read through this view (`maps.<map>` for each map):
    /// a patch may not render with this view for a model that differs in one of them.
    read: Arc<Mutex<Vec<&'static str>>>,
}

const MODEL_FIELDS: &[&str] = &[
    "version",
    "listen",
    "runtime_socket",
    "global",
    "maps",
    "frontend_rules",
    "redirect_codes",
    "backends",
    "default_backend",
    "tls",
    "peers",
    "tcp",
    "tcp_backends",
    "userlists",
    "errorfiles",
];

/// Something done with one serializable field of the model.
trait FieldVisitor {
    type Out;
    fn visit<T: serde::Serialize + ?Sized>(self, value: &T) -> Self::Out;
}

/// Applies `visitor` to the field `name` of `m` (not `backends`, which is views).
fn visit_field<V: FieldVisitor>(m: &Model, name: &str, visitor: V) -> Option<V::Out> {
    Some(match name {
        "version" => visitor.visit(&m.version),
        "listen" => visitor.visit(&m.listen),
        "runtime_socket" => visitor.visit(&m.runtime_socket),
        "global" => visitor.visit(&m.global),
        "maps" => visitor.visit(&*m.maps),
        "frontend_rules" => visitor.visit(&m.frontend_rules),
        "redirect_codes" => visitor.visit(&m.redirect_codes),
        "default_backend" => visitor.visit(&m.default_backend),
        "tls" => visitor.visit(&*m.tls),
        "peers" => visitor.visit(&m.peers),
        "tcp" => visitor.visit(&m.tcp),
        "tcp_backends" => visitor.visit(&m.tcp_backends),
        "userlists" => visitor.visit(&m.userlists),
        "errorfiles" => visitor.visit(&m.errorfiles),
        _ => return None,
    })
}

struct ToValue;

impl FieldVisitor for ToValue {
    type Out = Value;
    fn visit<T: serde::Serialize + ?Sized>(self, value: &T) -> Value {
        Value::from(minijinja::value::Serde(value))
    }
}

struct ToFingerprint;

impl FieldVisitor for ToFingerprint {
    type Out = u128;
    fn visit<T: serde::Serialize + ?Sized>(self, value: &T) -> u128 {
        let mut h = Fingerprint::new();
        h.add_serialized(&value);
        h.finish()
    }
}

impl ModelView {
    fn value(model: &Model, touched: &Arc<AtomicBool>) -> Value {
        let backends = model
            .backends
            .iter()
            .enumerate()
            .map(|(index, backend)| {
                Value::from_object(BackendView {
                    backend: backend.clone(),
                    index,
                    value: OnceLock::new(),
                    touched: touched.clone(),
                })
            })
            .collect::<Vec<_>>();
        Value::from_object(ModelView {
            model: model.clone(),
            backends: Value::from(backends),
            fields: Mutex::new(HashMap::new()),
            fingerprints: Mutex::new(HashMap::new()),
            recording: Mutex::new(Vec::new()),
            read: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Notes model fields (by [`MODEL_FIELDS`] name) that a remembered section read when it
    /// was rendered; `maps` as every map, since which ones it was is not kept.
    fn note_reads(&self, fields: &[&'static str]) {
        for &field in fields {
            note_read(&self.read, field);
            if field == "maps" {
                for map in ["maps.exact", "maps.prefix", "maps.ssl_redirect", "maps.sni"] {
                    note_read(&self.read, map);
                }
            }
        }
    }

    /// Whether a template read any of `fields` through this view.
    fn read_any(&self, fields: &[&'static str]) -> bool {
        !fields.is_empty()
            && self
                .read
                .lock()
                .map_or(true, |read| fields.iter().any(|f| read.contains(f)))
    }

    /// The fingerprint of field `name`; `None` for the backends, which sections of other
    /// backends must not depend on.
    fn fingerprint(&self, name: &'static str) -> Option<u128> {
        if let Some(fp) = self.fingerprints.lock().ok()?.get(name) {
            return Some(*fp);
        }
        let fp = visit_field(&self.model, name, ToFingerprint)?;
        self.fingerprints.lock().ok()?.insert(name, fp);
        Some(fp)
    }

    /// Starts noting the fields read, until [`ModelView::recorded`].
    fn record(&self) {
        if let Ok(mut r) = self.recording.lock() {
            r.push(Vec::new());
        }
    }

    /// The fields read since the matching [`ModelView::record`].
    fn recorded(&self) -> Vec<&'static str> {
        self.recording
            .lock()
            .ok()
            .and_then(|mut r| r.pop())
            .unwrap_or_default()
    }
}

impl Object for ModelView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let name = *MODEL_FIELDS.iter().find(|f| Some(**f) == key.as_str())?;
        note_read(&self.read, name);
        if let Ok(mut recording) = self.recording.lock() {
            // An enclosing section depends on what a section inside it read too.
            for reads in recording.iter_mut() {
                if !reads.contains(&name) {
                    reads.push(name);
                }
            }
        }
        if let Some(v) = self.fields.lock().ok()?.get(name) {
            return Some(v.clone());
        }
        let v = match name {
            "backends" => self.backends.clone(),
            // `model.maps.sni` is read to know whether there is a passthrough frontend: the
            // tens of thousands of routes in the other maps are converted only if read.
            "maps" => Value::from_object(MapsView {
                maps: self.model.maps.clone(),
                fields: Mutex::new(HashMap::new()),
                read: self.read.clone(),
            }),
            _ => visit_field(&self.model, name, ToValue)?,
        };
        self.fields.lock().ok()?.insert(name, v.clone());
        Some(v)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(MODEL_FIELDS)
    }
}

/// The routing maps as templates see them: each map converted when first read.
#[derive(Debug)]
struct MapsView {
    maps: Arc<crate::model::RouteMaps>,
    fields: Mutex<HashMap<&'static str, Value>>,
    /// The model view's record of fields read.
    read: Arc<Mutex<Vec<&'static str>>>,
}

const MAPS_FIELDS: &[&str] = &["exact", "prefix", "ssl_redirect", "sni"];

/// Notes that a template read `name`.
fn note_read(read: &Mutex<Vec<&'static str>>, name: &'static str) {
    if let Ok(mut read) = read.lock() {
        if !read.contains(&name) {
            read.push(name);
        }
    }
}

impl Object for MapsView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let name = *MAPS_FIELDS.iter().find(|f| Some(**f) == key.as_str())?;
        note_read(
            &self.read,
            match name {
                "exact" => "maps.exact",
                "prefix" => "maps.prefix",
                "ssl_redirect" => "maps.ssl_redirect",
                _ => "maps.sni",
            },
        );
        if let Some(v) = self.fields.lock().ok()?.get(name) {
            return Some(v.clone());
        }
        let m = &self.maps;
        let v = to_value(match name {
            "exact" => &m.exact,
            "prefix" => &m.prefix,
            "ssl_redirect" => &m.ssl_redirect,
            _ => &m.sni,
        });
        self.fields.lock().ok()?.insert(name, v.clone());
        Some(v)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(MAPS_FIELDS)
    }
}

/// One backend as templates see it.
#[derive(Debug)]
struct BackendView {
    backend: Arc<Backend>,
    /// Its place in the model's backends.
    index: usize,
    value: OnceLock<Value>,
    touched: Arc<AtomicBool>,
}

impl BackendView {
    fn full(&self) -> &Value {
        self.value.get_or_init(|| backend_value(&self.backend))
    }
}

impl Object for BackendView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        if key.as_str() != Some("name") {
            self.touched.store(true, Ordering::Relaxed);
        }
        self.full().get_item(key).ok().filter(|v| !v.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.touched.store(true, Ordering::Relaxed);
        match self.full().try_iter() {
            Ok(keys) => Enumerator::Values(keys.collect()),
            Err(_) => Enumerator::Empty,
        }
    }
}

/// Registers `backend_section(backend)`.
pub(crate) fn register(env: &mut Environment<'static>, fragments: &Arc<Mutex<Fragments>>) {
    env.add_filter("slot_runs", slot_runs);
    let fragments = fragments.clone();
    env.add_function(
        "backend_section",
        move |state: &State, backend: Value| -> Result<Value, Error> {
            let scope = state
                .lookup(SCOPE_VAR)
                .and_then(|s| s.downcast_object::<Scope>());
            let view = backend.downcast_object_ref::<BackendView>();
            let (Some(scope), Some(view)) = (scope, view) else {
                // Not a backend of the model being rendered: render it as an include would.
                let ctx = minijinja::context! {
                    model => state.lookup("model").unwrap_or_default(),
                    files => state.lookup("files").unwrap_or_default(),
                    backend => backend,
                };
                let text = state.env().get_template(BACKEND_TEMPLATE)?.render(ctx)?;
                return Ok(Value::from_safe_string(text));
            };
            let text = section_text(
                state.env(),
                &fragments,
                &state.lookup("model").unwrap_or_default(),
                &state.lookup("files").unwrap_or_default(),
                &view.backend,
            )?;
            Ok(Value::from_object(Section {
                backend: view.index,
                text,
                scope,
            }))
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Backend `ns_web_80` with these slots.
    fn backend_with(slots: crate::model::ServerSlots) -> Backend {
        Backend {
            name: "ns_web_80".to_string(),
            namespace: "ns".to_string(),
            service: "web".to_string(),
            port: 80,
            settings: Arc::default(),
            policies: Vec::new(),
            servers: Arc::new(slots),
        }
    }

    /// Templates see a backend's slots as they saw the serialized list: printed, indexed
    /// (from the end too), counted, iterated, as maps.
    #[test]
    fn backend_slots_read_as_the_serialized_list() {
        let mut slots = crate::model::ServerSlots::unused(4);
        slots.set(1, Some(("10.0.0.1".to_string(), 8080)));
        slots.set(3, Some(("2001:db8::1".to_string(), 80)));
        let backend = backend_with(slots);
        let template = "{{ b.servers }}|{{ b.servers|length }}|{{ b.servers[-1] }}|\
            {{ b.servers[1].address }}|{{ b.servers[0].address is none }}|\
            {% for s in b.servers %}{{ s.name }}={{ s.address }}:{{ s.port }}{% if not loop.last %},{% endif %}{% endfor %}|\
            {% for k, v in b.servers[3]|items %}{{ k }}:{{ v }};{% endfor %}|{{ b.servers[9] is undefined }}|\
            {{ b|list }}|{{ b.servers|map(attribute='port')|sum }}";
        let env = Environment::new();
        let render = |b: Value| {
            env.render_str(template, minijinja::context! { b => b })
                .unwrap()
        };
        let lazy = render(backend_value(&backend));
        assert_eq!(lazy, render(to_value(&backend)));
        assert!(lazy.contains("SRV_4=2001:db8::1:80"), "{lazy}");
    }

    #[test]
    fn slot_runs_group_unused_slots_the_same_from_either_form() {
        // Slots: unused, used, unused ×3, used (IPv6), unused: runs 1, 2, 3-5, 6, 7.
        let mut slots = crate::model::ServerSlots::unused(7);
        slots.set(1, Some(("10.0.0.1".to_string(), 8080)));
        slots.set(5, Some(("2001:db8::1".to_string(), 80)));
        let backend = backend_with(slots);
        let runs = "{{ b.servers|slot_runs|length }}:\
            {% for r in b.servers|slot_runs %}{{ r.name }}={{ r.address }}:{{ r.port }}\
            [{{ r.prefix }}{{ r.first }}-{{ r.last }}];{% endfor %}|";
        let template = format!("{runs}{{{{ (b.servers|slot_runs)[2]|list }}}}");
        let mut env = Environment::new();
        env.add_filter("slot_runs", slot_runs);
        let render = |b: Value| {
            env.render_str(&template, minijinja::context! { b => b })
                .unwrap()
        };
        let lazy = render(backend_value(&backend));
        assert_eq!(lazy, render(to_value(&backend)));
        assert_eq!(
            lazy,
            "5:SRV_1=None:1[SRV_1-1];SRV_2=10.0.0.1:8080[SRV_2-2];SRV_3=None:1[SRV_3-5];\
             SRV_6=2001:db8::1:80[SRV_6-6];SRV_7=None:1[SRV_7-7];|\
             ['name', 'address', 'port', 'prefix', 'first', 'last']"
        );
        // No slots, no runs; all unused, one.
        for (len, want) in [(0, "0:|"), (3, "1:SRV_1=None:1[SRV_1-3];|")] {
            let empty = backend_with(crate::model::ServerSlots::unused(len));
            for b in [backend_value(&empty), to_value(&empty)] {
                let got = env
                    .render_str(runs, minijinja::context! { b => b })
                    .unwrap();
                assert_eq!(got, want);
            }
        }
    }
}
