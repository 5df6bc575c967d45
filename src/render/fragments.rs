//! Backend sections rendered once per content.
//!
//! Backends are most of haproxy.cfg (10 000 Services make hundreds of thousands of lines), and
//! one change touches few of them. The bundled entry template prints each backend with
//! `{{ backend_section(backend) }}`, which renders `parts/backend.j2` (the effective one, site
//! overrides included) with `model`, `files` and `backend` — what `{% include %}` would see —
//! and remembers the text by a fingerprint of that backend and of the rest of the model: the
//! same inputs give the same text, so a remembered one is printed as it is.
//!
//! Everything else in the model counts (a template may read any of it), so a change outside
//! the backends renders every section again; an endpoint change renders one. Sections that
//! neither of the last two renders used are dropped. A site entry template that still includes
//! `parts/backend.j2` renders as before, without this cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use minijinja::{Environment, Error, State, Value};

use crate::fingerprint::Fingerprint;
use crate::model::Model;

/// The template `backend_section` renders.
const BACKEND_TEMPLATE: &str = "parts/backend.j2";

#[derive(Debug, Default)]
pub(crate) struct Fragments {
    /// A fingerprint of the model without its backends, for the render in progress.
    rest: u128,
    /// Each backend's fingerprint by name, for the render in progress.
    backends: HashMap<String, u128>,
    /// Counts renders.
    render: u64,
    /// (rest, backend) fingerprints → (text, the last render that used it).
    texts: HashMap<(u128, u128), (Arc<str>, u64)>,
}

/// Starts a render of `model`: fingerprints the model without its backends and each backend
/// (their serialized form, which is what templates see), and drops the sections the previous
/// render did not use.
pub(crate) fn begin_render(fragments: &Mutex<Fragments>, model: &Model) {
    // Every field but the backends; naming them all makes a new field a compile error here.
    let Model {
        version,
        listen,
        runtime_socket,
        global,
        maps,
        frontend_rules,
        redirect_codes,
        backends,
        default_backend,
        tls,
        peers,
        tcp,
        tcp_backends,
        userlists,
        errorfiles,
    } = model;
    let mut rest = Fingerprint::new();
    rest.add_serialized(&(
        version,
        listen,
        runtime_socket,
        global,
        maps,
        frontend_rules,
    ));
    rest.add_serialized(&(
        redirect_codes,
        default_backend,
        tls,
        peers,
        tcp,
        tcp_backends,
    ));
    rest.add_serialized(&(userlists, errorfiles));
    let fingerprints = backends
        .iter()
        .map(|b| {
            let mut h = Fingerprint::new();
            h.add_serialized(b);
            (b.name.clone(), h.finish())
        })
        .collect();
    let Ok(mut f) = fragments.lock() else {
        return;
    };
    f.rest = rest.finish();
    f.backends = fingerprints;
    // Kept for two renders: the planner renders a blanked model between two real ones.
    f.render += 1;
    let keep_from = f.render.saturating_sub(2);
    f.texts.retain(|_, (_, used)| *used >= keep_from);
}

/// Registers `backend_section(backend)`.
pub(crate) fn register(env: &mut Environment<'static>, fragments: &Arc<Mutex<Fragments>>) {
    let fragments = fragments.clone();
    env.add_function(
        "backend_section",
        move |state: &State, backend: Value| -> Result<Value, Error> {
            let name = backend.get_attr("name").ok();
            let known = fragments.lock().ok().and_then(|f| {
                let name = name.as_ref()?.as_str()?;
                Some((f.rest, *f.backends.get(name)?))
            });
            // Not a backend of the model being rendered: remember it by its value.
            let key = known.unwrap_or_else(|| {
                let mut h = Fingerprint::new();
                h.add(&backend);
                let rest = fragments.lock().map(|f| f.rest).unwrap_or_default();
                (rest, h.finish())
            });
            if let Ok(mut f) = fragments.lock() {
                let render = f.render;
                if let Some((text, used)) = f.texts.get_mut(&key) {
                    *used = render;
                    return Ok(Value::from_safe_string(text.to_string()));
                }
            }
            let ctx = minijinja::context! {
                model => state.lookup("model").unwrap_or_default(),
                files => state.lookup("files").unwrap_or_default(),
                backend => backend,
            };
            let text = state.env().get_template(BACKEND_TEMPLATE)?.render(ctx)?;
            if let Ok(mut f) = fragments.lock() {
                let render = f.render;
                f.texts.insert(key, (Arc::from(text.as_str()), render));
            }
            // Already through the output guard of the section's own template.
            Ok(Value::from_safe_string(text))
        },
    );
}
