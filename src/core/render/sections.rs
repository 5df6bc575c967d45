//! Backend sections: [`super::backend::render_backend`] renders one, and haproxy.cfg is joined from the entry
//! template's output and the sections, in Rust.
//!
//! The bundled entry template prints each backend with `{{ backend_section(backend) }}`, which
//! gives a [`Section`]: the text of `parts/backend.j2` (the effective one, site overrides
//! included) rendered with `model`, `files` and `backend`, what `{% include %}` would see,
//! taken from the [`SectionCache`] when its inputs are unchanged. The output guard prints a
//! section as its text; the writer of haproxy.cfg ([`Joiner`]) recognises that text, keeps
//! where it goes instead of a copy, and [`finish_render`] joins the template's own output and
//! the sections. A section printed into a captured block (a `{% set %}` block, a macro, a
//! filtered block) is text there like any other.
//!
//! A render in which no template read a backend (but its name) outside its section, and in
//! which every section was printed into haproxy.cfg as itself, has a [`Layout`]: where each
//! backend's section sits in haproxy.cfg. A model that differs from that render's only inside
//! some backends is then rendered by rendering those sections and putting them in place of
//! the old ones ([`patch`]), which is what an endpoint change needs.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use minijinja::value::{Object, ObjectRepr};
use minijinja::{Environment, Error, State, Value};

use super::backend::render_section;
use super::section_cache::SectionCache;
use super::views::{BackendView, ModelView, slot_runs};
use crate::model::Model;

/// The context variable holding the render in progress.
pub(crate) const SCOPE_VAR: &str = "_portcullis_render";

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
        patterns: _,
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
    check("patterns", a.patterns == b.patterns);
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
pub(crate) fn begin_render(model: &Model, files: Value) -> (Value, Arc<Scope>) {
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
    cache: &SectionCache,
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
        let text = cache.section(env, &layout.model, &layout.files, new)?;
        cache.replaced(old);
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

/// Registers `backend_section(backend)`.
pub(crate) fn register(env: &mut Environment<'static>, cache: &Arc<SectionCache>) {
    env.add_filter("slot_runs", slot_runs);
    let cache = cache.clone();
    env.add_function(
        "backend_section",
        move |state: &State, backend: Value| -> Result<Value, Error> {
            let scope = state
                .lookup(SCOPE_VAR)
                .and_then(|s| s.downcast_object::<Scope>());
            let view = backend.downcast_object_ref::<BackendView>();
            let (Some(scope), Some(view)) = (scope, view) else {
                // Not a backend of the model being rendered: render it as an include would.
                let text = render_section(
                    state.env(),
                    &state.lookup("model").unwrap_or_default(),
                    &state.lookup("files").unwrap_or_default(),
                    backend,
                )?;
                return Ok(Value::from_safe_string(text));
            };
            let text = cache.section(
                state.env(),
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
