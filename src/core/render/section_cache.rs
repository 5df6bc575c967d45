//! Backend sections remembered across renders: a layer around [`render_backend`].
//!
//! Backends are most of haproxy.cfg (10 000 Services make hundreds of thousands of lines), and
//! one change touches few of them. [`SectionCache::section`] gives what [`render_backend`]
//! gives, and remembers the text with a fingerprint of the backend and of each model field the
//! render read (the [`ModelView`] notes them): a remembered text is used again only when the
//! backend is the same and so is every field its render read. [`render_backend`] does not
//! know it is cached.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use minijinja::{Environment, Error, Value};

use super::backend::render_backend;
use super::views::{BackendWith, ModelView};
use crate::fingerprint::Fingerprint;
use crate::model::{Backend, Model};

/// Section texts remembered across renders.
#[derive(Debug, Default)]
pub(crate) struct SectionCache {
    memory: Mutex<Memory>,
}

/// Texts and fingerprints remembered across renders.
#[derive(Debug, Default)]
struct Memory {
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

impl SectionCache {
    /// Starts a render: drops what the previous two renders did not use (the planner renders
    /// a blanked model between two real ones).
    pub(crate) fn begin(&self) {
        if let Ok(mut m) = self.memory.lock() {
            m.begin();
        }
    }

    /// How many sections were rendered rather than taken from memory.
    pub(crate) fn rendered_sections(&self) -> u64 {
        self.memory.lock().map_or(0, |m| m.rendered)
    }

    /// Forgets what was remembered for `backend`, which a patch replaced: patches start no
    /// render of their own (the sections they keep are those of the render they patch, and
    /// stay remembered with it), so they drop what they replace.
    pub(crate) fn replaced(&self, backend: &Arc<Backend>) {
        if let Ok(mut m) = self.memory.lock() {
            let address = Arc::as_ptr(backend) as usize;
            if let Some((_, fp, _)) = m.fingerprints.remove(&address) {
                m.texts.remove(&fp);
            }
        }
    }

    /// What [`render_backend`] gives for `backend` with `model` and `files`: a remembered
    /// text when the backend is the same and so is every field of the model that rendering
    /// it read. Only a [`ModelView`] can say what a render read: with any other `model`,
    /// nothing is remembered.
    pub(crate) fn section(
        &self,
        env: &Environment<'_>,
        model: &Value,
        files: &Value,
        backend: &Arc<Backend>,
    ) -> Result<Arc<str>, Error> {
        let view = model.downcast_object_ref::<ModelView>();
        let mut fp = None;
        if let Some(view) = view {
            let (known, text) = self.remembered(view, backend);
            fp = Some(known);
            if let Some(text) = text {
                return Ok(text);
            }
            view.record();
        }
        let rendered = render_backend(env, model, files, backend);
        let reads = view.map(|v| v.recorded());
        let text: Arc<str> = Arc::from(rendered?);
        // A section that read the backends list (other backends) is not remembered.
        let reads = view.zip(reads).and_then(|(view, reads)| {
            reads
                .into_iter()
                .map(|name| Some((name, view.fingerprint(name)?)))
                .collect::<Option<Vec<_>>>()
        });
        if let Ok(mut m) = self.memory.lock() {
            m.rendered += 1;
            if let (Some(fp), Some(reads)) = (fp, reads) {
                m.remember(fp, reads, text.clone());
            }
        }
        Ok(text)
    }

    /// The fingerprint of `backend`, and a text remembered for it whose render read fields
    /// that `view` still gives the same fingerprints; what that render read then counts as
    /// read through `view`, which prints the text.
    fn remembered(&self, view: &ModelView, backend: &Arc<Backend>) -> (u128, Option<Arc<str>>) {
        // Locked once for a backend known by its address, twice for a new one (its
        // fingerprint made between, outside the lock): the workers of a cold run take the
        // lock for each of 10 000 sections.
        let field = |name| view.fingerprint(name);
        let known = self.memory.lock().ok().and_then(|mut m| {
            let fp = m.known_fingerprint(backend)?;
            Some((fp, m.remembered(fp, field)))
        });
        let (fp, remembered) = match known {
            Some(known) => known,
            None => {
                let new = content_fingerprint(backend);
                let remembered = self.memory.lock().ok().and_then(|mut m| {
                    m.note_fingerprint(backend, new);
                    m.remembered(new, field)
                });
                (new, remembered)
            }
        };
        let text = remembered.map(|(text, reads)| {
            view.note_reads(&reads);
            text
        });
        (fp, text)
    }

    /// Renders ahead, on worker threads, the sections of the backends of `model` that have
    /// no text remembered, and remembers them: a full render then prints them from memory.
    /// Each worker renders with its own view of `model`, so what each section read is noted
    /// as in a render of its own; the render checks those reads against its own view as it
    /// does for any remembered text. Failures are left to the render, which reports them.
    pub(crate) fn render_ahead(
        &self,
        env: &Environment<'_>,
        model: &Model,
        files: &Value,
        workers: crate::parallel::Workers,
    ) {
        let missing: Vec<&Arc<Backend>> = match self.memory.lock() {
            Ok(m) => model.backends.iter().filter(|b| !m.has_text(b)).collect(),
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
                let _ = self.section(env, view, files, backend);
            },
        );
    }
}

impl Memory {
    fn begin(&mut self) {
        self.render += 1;
        let keep_from = self.render.saturating_sub(2);
        self.texts.retain(|_, texts| {
            texts.retain(|t| t.used >= keep_from);
            !texts.is_empty()
        });
        self.fingerprints
            .retain(|_, (_, _, used)| *used >= keep_from);
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

    /// Whether a text is remembered for `backend` (known by its address) for some model.
    fn has_text(&self, backend: &Arc<Backend>) -> bool {
        let address = Arc::as_ptr(backend) as usize;
        self.fingerprints
            .get(&address)
            .is_some_and(|(_, fp, _)| self.texts.contains_key(fp))
    }
}

/// The fingerprint of `backend`'s content, computed outside the lock (a serialization of
/// its servers: the workers of [`SectionCache::render_ahead`] make thousands at once).
fn content_fingerprint(backend: &Backend) -> u128 {
    let mut h = Fingerprint::new();
    // The slots as held, not as the list of every slot, which would hash each of the
    // hundreds of thousands of slots of a large cluster one by one.
    h.add_serialized(&BackendWith(backend, backend.servers.compact()));
    h.finish()
}
