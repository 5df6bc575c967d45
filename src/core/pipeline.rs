//! The pipeline: store → translate (+ policy) → model → render, as one call.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use crate::diagnostics::Diagnostic;
use crate::layers::SiteFiles;
use crate::model::{Backend, Model};
use crate::objects::Kind;
use crate::policy::{PolicyEngine, PolicyError};
use crate::render::{RenderError, RenderedConfig, Renderer};
use crate::store::{Mark, Store};
use crate::translate::{self, Reuse, RunInputs, TranslateConfig};

/// Compiled scripts and templates plus the translation settings.
#[derive(Debug)]
pub struct Pipeline {
    pub policy: PolicyEngine,
    /// Shared with the pipeline this one replaced when the templates are the same (see
    /// [`Pipeline::keep_memo_of`]): its remembered sections stay valid.
    pub renderer: Arc<Renderer>,
    pub config: TranslateConfig,
    /// The last run, so that the next one can redo only what changed since.
    last: Mutex<Option<LastRun>>,
}

#[derive(Debug)]
struct LastRun {
    mark: Mark,
    output: Output,
    reuse: Reuse,
    /// Translation parts the next run may take (see [`translate::parts`]).
    parts: translate::parts::Parts,
    /// How many results the hook memo held after the last full run. Runs that take parts drop
    /// none (the parts stand for them), so those of replaced objects pile up until a full
    /// run; one comes when they have grown by a quarter.
    remembered_after_full: usize,
}

/// Loading scripts or templates failed; every problem is listed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}", join(.0))]
    Scripts(Vec<PolicyError>),
    #[error("{}", join(.0))]
    Templates(Vec<RenderError>),
}

fn join<E: std::fmt::Display>(errors: &[E]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// One pipeline run's result.
#[derive(Debug, Clone)]
pub struct Output {
    pub model: Model,
    pub rendered: RenderedConfig,
    /// Problems with the input, sorted; none of them stopped the run.
    pub diagnostics: Vec<Diagnostic>,
}

/// Which way a run went, as [`Pipeline::run_with`] chose it: what it redid and what it took
/// from the run before. The output is the same whichever it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunReport {
    /// Every change since the last run was an EndpointSlice: only the servers of the
    /// `redone` backends were made again, the rest of the last output kept.
    Endpoints { redone: usize },
    /// Only Ingresses, EndpointSlices and Gateway API objects changed: the parts of
    /// `ingresses_taken` unchanged Ingresses, `routes_taken` HTTPRoutes made from the same
    /// inputs and `backends_taken` HTTP backends came from the last run, and haproxy.cfg was
    /// `patched` (its changed backend sections replaced) rather than rendered whole.
    Partial {
        ingresses_taken: usize,
        routes_taken: usize,
        backends_taken: usize,
        patched: bool,
    },
    /// Everything translated and rendered again.
    Full,
}

impl RunReport {
    /// Every [`RunReport::path`], for metrics that list them up front.
    pub const PATHS: [&'static str; 3] = ["full", "parts", "endpoints"];

    /// The path's name in metrics and logs: `endpoints`, `parts` or `full`.
    pub fn path(&self) -> &'static str {
        match self {
            RunReport::Endpoints { .. } => "endpoints",
            RunReport::Partial { .. } => "parts",
            RunReport::Full => "full",
        }
    }

    /// Whether a run that took parts patched the last haproxy.cfg.
    pub fn patched(&self) -> bool {
        matches!(self, RunReport::Partial { patched: true, .. })
    }

    /// How many HTTPRoute parts the run took from the last one.
    pub fn routes_taken(&self) -> usize {
        match self {
            RunReport::Partial { routes_taken, .. } => *routes_taken,
            _ => 0,
        }
    }

    /// How many Ingress parts the run took from the last one.
    pub fn ingresses_taken(&self) -> usize {
        match self {
            RunReport::Partial {
                ingresses_taken, ..
            } => *ingresses_taken,
            _ => 0,
        }
    }

    /// How many HTTP backend parts the run took from the last one.
    pub fn backends_taken(&self) -> usize {
        match self {
            RunReport::Partial { backends_taken, .. } => *backends_taken,
            _ => 0,
        }
    }
}

impl Pipeline {
    /// Compiles bundled scripts and templates, overlaid by the site's (read by the caller:
    /// `source::site`).
    pub fn load(
        scripts: Option<&SiteFiles>,
        templates: Option<&SiteFiles>,
        config: TranslateConfig,
    ) -> Result<Self, LoadError> {
        let policy = PolicyEngine::load(scripts).map_err(LoadError::Scripts)?;
        let mut renderer = Renderer::load(templates).map_err(LoadError::Templates)?;
        renderer.set_workers(config.workers);
        Ok(Self {
            policy,
            renderer: Arc::new(renderer),
            config,
            last: Mutex::new(None),
        })
    }

    /// Takes over what `previous` remembers that stays valid in this pipeline: the results of
    /// the scripts that did not change and, when the templates are
    /// the same, the renderer with its remembered backend sections (a script change then
    /// renders again only the sections whose model changed; each remembered section is used
    /// only while every model field its render read is unchanged). What `run` does when site
    /// scripts or templates change.
    pub fn keep_memo_of(&mut self, previous: &Pipeline) {
        self.policy.keep_memo_of(&previous.policy);
        if self.renderer.templates() == previous.renderer.templates()
            && self.renderer.workers() == previous.renderer.workers()
        {
            self.renderer = previous.renderer.clone();
        }
    }

    /// Translates and renders a snapshot.
    pub fn run(&self, store: &Store) -> Result<Output, RenderError> {
        self.run_with(store, &RunInputs::default())
            .map(|(output, _)| output)
    }

    /// How many results the hook memo holds (hook calls and whole hook runs).
    fn remembered(&self) -> usize {
        self.policy.remembered()
    }

    /// Translates and renders a snapshot, with the time and the certificates in force.
    ///
    /// When every change since the previous run on this store is an EndpointSlice, and the
    /// time and certificates in force leave that run's output as it was (see
    /// [`Reuse::holds_for`]), only the backends of the Services whose endpoints changed are
    /// redone, and only their sections rendered again. When the changes are Ingresses,
    /// EndpointSlices and Gateway API objects, the Ingresses that are the same objects and the backends assembled
    /// from the same inputs are taken from the last run ([`translate::parts`]). The output is
    /// the same either way: `tests/memo.rs` compares it with fresh pipelines. The report
    /// says which of these paths the run took.
    pub fn run_with(
        &self,
        store: &Store,
        inputs: &RunInputs,
    ) -> Result<(Output, RunReport), RenderError> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(previous) = last.as_mut() {
            if let Some((output, redone)) = self.after_endpoint_changes(previous, store, inputs)? {
                previous.mark = store.mark();
                previous.output = output.clone();
                // Their servers are no longer those of the backend parts.
                previous
                    .parts
                    .forget_backends(redone.iter().map(String::as_str));
                let report = RunReport::Endpoints {
                    redone: redone.len(),
                };
                return Ok((output, report));
            }
        }
        let remembered = self.remembered();
        let carried = last
            .as_mut()
            .map(|p| p.parts.take_carried())
            .unwrap_or_default();
        let changes = last
            .as_ref()
            .filter(|previous| {
                let full = previous.remembered_after_full;
                remembered <= full + full / 4 + 1024
            })
            .and_then(|previous| parts_still_valid(previous, store, inputs));
        let prior = last
            .as_ref()
            .zip(changes.as_ref())
            .map(|(previous, changes)| translate::incremental::Prior {
                parts: &previous.parts,
                moved_endpoints: &changes.moved_endpoints,
                changed_ingresses: &changes.ingresses,
            });
        let translation =
            translate::translate_taking(store, &self.config, &self.policy, inputs, prior, carried);
        let (ingresses_taken, routes_taken, backends_taken) = (
            translation.parts.ingresses_taken(),
            translation.parts.routes_taken(),
            translation.parts.backends_taken(),
        );
        let mut model = translation.model;
        if let Some(previous) = last.as_ref() {
            share_unchanged_parts(&mut model, &previous.output.model);
        }
        // After Ingress changes, haproxy.cfg often differs only in a few backend sections
        // (a new path changes the map files alone): patch it when the templates allow.
        let patched = match last.as_ref().filter(|_| prior.is_some()) {
            Some(previous) => self.renderer.render_patched(
                &previous.output.model,
                &previous.output.rendered,
                &model,
            )?,
            None => None,
        };
        let report = match &prior {
            Some(_) => RunReport::Partial {
                ingresses_taken,
                routes_taken,
                backends_taken,
                patched: patched.is_some(),
            },
            None => RunReport::Full,
        };
        let rendered = match patched {
            Some(rendered) => rendered,
            None => self.renderer.render(&model)?,
        };
        let output = Output {
            model,
            rendered,
            diagnostics: translation.diagnostics.into_sorted(),
        };
        let remembered_after_full = match (&prior, last.as_ref()) {
            (Some(_), Some(previous)) => previous.remembered_after_full,
            _ => self.remembered(),
        };
        *last = Some(LastRun {
            mark: store.mark(),
            output: output.clone(),
            reuse: translation.reuse,
            parts: translation.parts,
            remembered_after_full,
        });
        Ok((output, report))
    }

    /// The output after changes that are all EndpointSlices: the previous one with the
    /// servers of the affected backends redone, and those backends' names. `None` when the
    /// changes are not all endpoint changes, or are unknown, or the previous run's output
    /// does not hold for `inputs`.
    fn after_endpoint_changes(
        &self,
        previous: &LastRun,
        store: &Store,
        inputs: &RunInputs,
    ) -> Result<Option<(Output, Vec<String>)>, RenderError> {
        if !previous.reuse.holds_for(inputs) {
            return Ok(None);
        }
        let Some(changes) = store.changes_since(previous.mark) else {
            return Ok(None);
        };
        let mut services = BTreeSet::new();
        for change in changes {
            if change.kind != Kind::EndpointSlice {
                return Ok(None);
            }
            services.extend(change.service.iter().cloned());
        }
        // A refused endpoint is reported by a whole run: so is one that no longer is.
        if translate::backends::reports_endpoints(
            &self.config.exposure.endpoints,
            store,
            &services,
            &previous.output.diagnostics,
        ) {
            return Ok(None);
        }
        let mut model = previous.output.model.clone();
        let mut redone = Vec::new();
        for (service, name, port) in previous.reuse.endpoint_users.of(&services) {
            redone.push(name.to_string());
            for list in [&mut model.backends, &mut model.tcp_backends] {
                let Ok(i) = list.binary_search_by(|b| b.name.as_str().cmp(name)) else {
                    continue;
                };
                let servers = translate::servers(store, service, port, &list[i].settings);
                if servers != *list[i].servers {
                    Arc::make_mut(&mut list[i]).servers = Arc::new(servers);
                }
            }
        }
        let previous_output = &previous.output;
        let rendered = match self.renderer.render_patched(
            &previous_output.model,
            &previous_output.rendered,
            &model,
        )? {
            Some(rendered) => rendered,
            None => self.renderer.render(&model)?,
        };
        Ok(Some((
            Output {
                model,
                rendered,
                diagnostics: previous_output.diagnostics.clone(),
            },
            redone,
        )))
    }
}

/// What changed since a run whose translation parts a later run takes.
#[derive(Debug, Default)]
struct PartChanges {
    /// The Services whose endpoints moved.
    moved_endpoints: BTreeSet<crate::objects::Key>,
    /// The Ingresses added, changed or removed.
    ingresses: BTreeSet<crate::objects::Key>,
}

/// What changed since `previous`, when its translation parts are still valid for `store` and
/// `inputs`: every change since is an Ingress, an EndpointSlice or a Gateway API object
/// (whose parts are taken only when made from the same inputs), and the time and
/// certificates in force leave that run's output as it was. `None` otherwise.
fn parts_still_valid(previous: &LastRun, store: &Store, inputs: &RunInputs) -> Option<PartChanges> {
    if !previous.reuse.holds_for(inputs) {
        return None;
    }
    let mut changes = PartChanges::default();
    for change in store.changes_since(previous.mark)? {
        match change.kind {
            Kind::Ingress => {
                changes.ingresses.insert(change.key.clone());
            }
            Kind::EndpointSlice => changes
                .moved_endpoints
                .extend(change.service.iter().cloned()),
            // Read by the HTTPRoutes' parts alone, taken only when made from the same inputs.
            Kind::HttpRoute
            | Kind::Gateway
            | Kind::GatewayClass
            | Kind::ReferenceGrant
            | Kind::Namespace => {}
            _ => return None,
        }
    }
    Some(changes)
}

/// Makes every backend of `model` that equals the one of the same name in `previous` that one
/// (shared), and so the maps and the certificates, so that what compares or fingerprints them
/// later (the renderer, the planner) finds them unchanged at once.
fn share_unchanged_parts(model: &mut Model, previous: &Model) {
    // Both lists are in name order: one walk, no search. Most backends are already the
    // previous ones (taken from the last run's parts), at the same place.
    fn share(list: &mut [Arc<Backend>], previous: &[Arc<Backend>]) {
        let mut at = 0;
        for b in list {
            if previous.get(at).is_some_and(|p| Arc::ptr_eq(p, b)) {
                at += 1;
                continue;
            }
            while previous.get(at).is_some_and(|p| p.name < b.name) {
                at += 1;
            }
            if let Some(p) = previous.get(at).filter(|p| p.name == b.name) {
                if **p == **b {
                    *b = p.clone();
                }
                at += 1;
            }
        }
    }
    share(&mut model.backends, &previous.backends);
    share(&mut model.tcp_backends, &previous.tcp_backends);
    if model.maps == previous.maps {
        model.maps = previous.maps.clone();
    }
    if model.tls == previous.tls {
        model.tls = previous.tls.clone();
    }
}
