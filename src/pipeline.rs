//! The pipeline: store → translate (+ policy) → model → render, as one call.

use std::path::Path;

use crate::diagnostics::Diagnostic;
use crate::model::Model;
use crate::policy::{PolicyEngine, PolicyError};
use crate::render::{RenderError, RenderedConfig, Renderer};
use crate::store::Store;
use crate::translate::{self, RunInputs, TranslateConfig};

/// Compiled scripts and templates plus the translation settings.
#[derive(Debug)]
pub struct Pipeline {
    pub policy: PolicyEngine,
    pub renderer: Renderer,
    pub config: TranslateConfig,
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
#[derive(Debug)]
pub struct Output {
    pub model: Model,
    pub rendered: RenderedConfig,
    /// Problems with the input, sorted; none of them stopped the run.
    pub diagnostics: Vec<Diagnostic>,
}

impl Pipeline {
    /// Compiles bundled scripts and templates, overlaid by the site directories.
    pub fn load(
        scripts_dir: Option<&Path>,
        templates_dir: Option<&Path>,
        config: TranslateConfig,
    ) -> Result<Self, LoadError> {
        let policy = PolicyEngine::load(scripts_dir).map_err(LoadError::Scripts)?;
        let renderer = Renderer::load(templates_dir).map_err(LoadError::Templates)?;
        Ok(Self {
            policy,
            renderer,
            config,
        })
    }

    /// Translates and renders a snapshot.
    pub fn run(&self, store: &Store) -> Result<Output, RenderError> {
        self.run_with(store, &RunInputs::default())
    }

    /// Translates and renders a snapshot, with the time and the certificates in force.
    pub fn run_with(&self, store: &Store, inputs: &RunInputs) -> Result<Output, RenderError> {
        let translation = translate::translate(store, &self.config, &self.policy, inputs);
        let rendered = self.renderer.render(&translation.model)?;
        Ok(Output {
            model: translation.model,
            rendered,
            diagnostics: translation.diagnostics.into_sorted(),
        })
    }
}
