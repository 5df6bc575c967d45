//! Backend sections rendered once per content, and configurations patched section by section.
//!
//! Backends are most of haproxy.cfg (10 000 Services make hundreds of thousands of lines), and
//! one change touches few of them. The bundled entry template prints each backend with
//! `{{ backend_section(backend) }}`, which renders `parts/backend.j2` (the effective one, site
//! overrides included) with `model`, `files` and `backend` — what `{% include %}` would see —
//! and remembers the text by a fingerprint of that backend and of the rest of the model: the
//! same inputs give the same text, so a remembered one is printed as it is.
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
use crate::model::{Backend, Model};

/// The template `backend_section` renders.
const BACKEND_TEMPLATE: &str = "parts/backend.j2";
/// The context variable holding the render in progress.
pub(crate) const SCOPE_VAR: &str = "_portcullis_render";

/// Texts and fingerprints remembered across renders.
#[derive(Debug, Default)]
pub(crate) struct Fragments {
    /// Counts renders.
    render: u64,
    /// (rest, backend) fingerprints → (text, the last render that used it).
    texts: HashMap<(u128, u128), (Arc<str>, u64)>,
    /// Backend fingerprints by the address of the shared backend (kept alive here, so the
    /// address is not reused while remembered) → (backend, fingerprint, last render).
    fingerprints: HashMap<usize, (Arc<Backend>, u128, u64)>,
}

impl Fragments {
    /// Starts a render: drops what the previous two renders did not use (the planner renders
    /// a blanked model between two real ones).
    fn begin(&mut self) -> u64 {
        self.render += 1;
        let keep_from = self.render.saturating_sub(2);
        self.texts.retain(|_, (_, used)| *used >= keep_from);
        self.fingerprints
            .retain(|_, (_, _, used)| *used >= keep_from);
        self.render
    }

    fn fingerprint(&mut self, backend: &Arc<Backend>) -> u128 {
        let render = self.render;
        let address = Arc::as_ptr(backend) as usize;
        if let Some((_, fp, used)) = self.fingerprints.get_mut(&address) {
            *used = render;
            return *fp;
        }
        let mut h = Fingerprint::new();
        h.add_serialized(&**backend);
        let fp = h.finish();
        self.fingerprints
            .insert(address, (backend.clone(), fp, render));
        fp
    }
}

/// The model without its backends: what every section may read besides its own backend.
/// Naming every field makes a new field a compile error here. (Grouped: tuples compare up to
/// twelve elements.)
fn rest_of(model: &Model) -> impl serde::Serialize + PartialEq + '_ {
    let Model {
        version,
        listen,
        runtime_socket,
        global,
        maps,
        frontend_rules,
        redirect_codes,
        backends: _,
        default_backend,
        tls,
        peers,
        tcp,
        tcp_backends,
        userlists,
        errorfiles,
    } = model;
    (
        (
            version,
            listen,
            runtime_socket,
            global,
            maps,
            frontend_rules,
        ),
        (
            redirect_codes,
            default_backend,
            tls,
            peers,
            tcp,
            tcp_backends,
        ),
        (userlists, errorfiles),
    )
}

/// A fingerprint of the model without its backends.
pub(crate) fn rest_fingerprint(model: &Model) -> u128 {
    let mut rest = Fingerprint::new();
    rest.add_serialized(&rest_of(model));
    rest.finish()
}

/// Whether two models are equal but for their backends' contents (same backends by name, in
/// the same order).
fn same_but_backends(a: &Model, b: &Model) -> bool {
    a.backends.len() == b.backends.len()
        && a.backends
            .iter()
            .zip(&b.backends)
            .all(|(x, y)| x.name == y.name)
        && rest_of(a) == rest_of(b)
}

/// One render in progress, reachable from template functions through [`SCOPE_VAR`].
#[derive(Debug)]
pub(crate) struct Scope {
    /// Marks sections in the output; unguessable, so no template text can forge one.
    nonce: u64,
    rest: u128,
    /// Set when a template read a backend other than through `backend_section`, or used a
    /// section other than by printing it: the output then has no [`Layout`].
    touched: Arc<AtomicBool>,
    /// Sections printed, by marker number: (index of the backend in the model, text).
    printed: Mutex<Vec<(usize, Arc<str>)>>,
}

impl Object for Scope {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }
}

/// Where each backend section sits in a rendered haproxy.cfg, and what rendered it.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The haproxy.cfg this describes.
    pub cfg: Arc<[u8]>,
    /// (index of the backend in the model, byte range), in output order.
    sections: Vec<(usize, Range<usize>)>,
    rest: u128,
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
        nonce: rand_nonce(),
        rest: rest_fingerprint(model),
        touched: touched.clone(),
        printed: Mutex::new(Vec::new()),
    });
    let model = ModelView::value(model, &touched);
    let ctx = minijinja::context! {
        model => model,
        files => files,
        _portcullis_render => Value::from_dyn_object(scope.clone()),
    };
    (ctx, scope)
}

/// Replaces the section marks of a finished render by the sections. Returns haproxy.cfg and,
/// when no template read a backend or used a section except by printing it, its layout.
pub(crate) fn finish_render(
    raw: &str,
    scope: &Scope,
    ctx: &Value,
) -> Result<(Arc<[u8]>, Option<Layout>), &'static str> {
    let printed = scope.printed.lock().map(|p| p.clone()).unwrap_or_default();
    let mut out =
        String::with_capacity(raw.len() + printed.iter().map(|p| p.1.len()).sum::<usize>());
    let mut sections = Vec::with_capacity(printed.len());
    let mut rest = raw;
    while let Some(at) = rest.find('\0') {
        out.push_str(&rest[..at]);
        let mark = rest.get(at..at + MARK_LEN).unwrap_or_default();
        let number =
            parse_mark(mark, scope.nonce).ok_or("the template output holds a NUL character")?;
        let (backend, text) = printed
            .get(number)
            .ok_or("the template output holds an unknown section mark")?;
        let start = out.len();
        out.push_str(text);
        sections.push((*backend, start..out.len()));
        rest = &rest[at + MARK_LEN..];
    }
    out.push_str(rest);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    let cfg: Arc<[u8]> = Arc::from(out.into_bytes());
    let layout = (!scope.touched.load(Ordering::Relaxed)).then(|| Layout {
        cfg: cfg.clone(),
        sections,
        rest: scope.rest,
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
    if layout.touched.load(Ordering::Relaxed) || !same_but_backends(previous, model) {
        return Ok(None);
    }
    let render = fragments.lock().map(|mut f| f.begin()).unwrap_or_default();
    let mut texts: HashMap<usize, Arc<str>> = HashMap::new();
    for (i, (old, new)) in previous.backends.iter().zip(&model.backends).enumerate() {
        if Arc::ptr_eq(old, new) || old == new {
            continue;
        }
        let fp = fragments
            .lock()
            .map(|mut f| f.fingerprint(new))
            .unwrap_or_default();
        let key = (layout.rest, fp);
        let known = fragments.lock().ok().and_then(|mut f| {
            let (text, used) = f.texts.get_mut(&key)?;
            *used = render;
            Some(text.clone())
        });
        let text = match known {
            Some(text) => text,
            None => {
                let ctx = minijinja::context! {
                    model => layout.model.clone(),
                    files => layout.files.clone(),
                    backend => to_value(&**new),
                };
                let text: Arc<str> = Arc::from(env.get_template(BACKEND_TEMPLATE)?.render(ctx)?);
                if let Ok(mut f) = fragments.lock() {
                    f.texts.insert(key, (text.clone(), render));
                }
                text
            }
        };
        texts.insert(i, text);
    }
    // A section template that read another backend saw the previous one.
    if layout.touched.load(Ordering::Relaxed) {
        return Ok(None);
    }
    // Byte ranges of a UTF-8 text, spliced with whole UTF-8 sections: still UTF-8.
    let old: &[u8] = &layout.cfg;
    let mut out = Vec::with_capacity(old.len() + 4096);
    let mut sections = Vec::with_capacity(layout.sections.len());
    let mut copied = 0;
    for (backend, range) in &layout.sections {
        out.extend_from_slice(&old[copied..range.start]);
        let start = out.len();
        out.extend_from_slice(
            texts
                .get(backend)
                .map_or(&old[range.clone()], |t| t.as_bytes()),
        );
        sections.push((*backend, start..out.len()));
        copied = range.end;
    }
    out.extend_from_slice(&old[copied..]);
    Ok(Some(Layout {
        cfg: Arc::from(out),
        sections,
        ..layout.clone()
    }))
}

/// A template value of `value`, as serde sees it.
pub(crate) fn to_value<T: serde::Serialize>(value: &T) -> Value {
    Value::from(minijinja::value::Serde(value))
}

const MARK_LEN: usize = 1 + 16 + 8 + 1;

fn mark(nonce: u64, number: usize) -> String {
    format!("\0{nonce:016x}{number:08x}\0")
}

fn parse_mark(mark: &str, nonce: u64) -> Option<usize> {
    let inner = mark.strip_prefix('\0')?.strip_suffix('\0')?;
    let (n, number) = (inner.get(..16)?, inner.get(16..)?);
    (u64::from_str_radix(n, 16).ok()? == nonce)
        .then(|| usize::from_str_radix(number, 16).ok())
        .flatten()
}

fn rand_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

/// A printed section: the formatter prints its mark; any other use (a filter, a
/// concatenation) gets the text and leaves the render without a layout.
#[derive(Debug)]
pub(crate) struct Section {
    pub mark: String,
    text: Arc<str>,
    touched: Arc<AtomicBool>,
}

impl Object for Section {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.touched.store(true, Ordering::Relaxed);
        f.write_str(&self.text)
    }
}

/// The model as templates see it: each field converted when first read.
#[derive(Debug)]
struct ModelView {
    model: Model,
    backends: Value,
    fields: Mutex<HashMap<&'static str, Value>>,
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
        })
    }

    fn convert(&self, name: &str) -> Option<Value> {
        let m = &self.model;
        Some(match name {
            "version" => to_value(&m.version),
            "listen" => to_value(&m.listen),
            "runtime_socket" => to_value(&m.runtime_socket),
            "global" => to_value(&m.global),
            "maps" => to_value(&*m.maps),
            "frontend_rules" => to_value(&m.frontend_rules),
            "redirect_codes" => to_value(&m.redirect_codes),
            "backends" => self.backends.clone(),
            "default_backend" => to_value(&m.default_backend),
            "tls" => to_value(&m.tls),
            "peers" => to_value(&m.peers),
            "tcp" => to_value(&m.tcp),
            "tcp_backends" => to_value(&m.tcp_backends),
            "userlists" => to_value(&m.userlists),
            "errorfiles" => to_value(&m.errorfiles),
            _ => return None,
        })
    }
}

impl Object for ModelView {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let name = MODEL_FIELDS.iter().find(|f| Some(**f) == key.as_str())?;
        if let Some(v) = self.fields.lock().ok()?.get(name) {
            return Some(v.clone());
        }
        let v = self.convert(name)?;
        self.fields.lock().ok()?.insert(name, v.clone());
        Some(v)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Str(MODEL_FIELDS)
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
        self.value.get_or_init(|| to_value(&*self.backend))
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
    let fragments = fragments.clone();
    env.add_function(
        "backend_section",
        move |state: &State, backend: Value| -> Result<Value, Error> {
            let scope = state.lookup(SCOPE_VAR);
            let scope = scope
                .as_ref()
                .and_then(|s| s.downcast_object_ref::<Scope>());
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
            let key = fragments
                .lock()
                .map(|mut f| (scope.rest, f.fingerprint(&view.backend)))
                .unwrap_or_default();
            let known = fragments.lock().ok().and_then(|mut f| {
                let render = f.render;
                let (text, used) = f.texts.get_mut(&key)?;
                *used = render;
                Some(text.clone())
            });
            let text = match known {
                Some(text) => text,
                None => {
                    let ctx = minijinja::context! {
                        model => state.lookup("model").unwrap_or_default(),
                        files => state.lookup("files").unwrap_or_default(),
                        backend => to_value(&*view.backend),
                    };
                    let text: Arc<str> =
                        Arc::from(state.env().get_template(BACKEND_TEMPLATE)?.render(ctx)?);
                    if let Ok(mut f) = fragments.lock() {
                        let render = f.render;
                        f.texts.insert(key, (text.clone(), render));
                    }
                    text
                }
            };
            let number = {
                let mut printed = scope
                    .printed
                    .lock()
                    .map_err(|_| Error::new(minijinja::ErrorKind::InvalidOperation, "poisoned"))?;
                printed.push((view.index, text.clone()));
                printed.len() - 1
            };
            Ok(Value::from_object(Section {
                mark: mark(scope.nonce, number),
                text,
                touched: scope.touched.clone(),
            }))
        },
    );
}
