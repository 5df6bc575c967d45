//! The policy engine: Rhai scripts that decide what annotations mean.
//!
//! Scripts are compiled once. Each may define any of the hook functions `global(ctx)`,
//! `backend(ctx)` and `route(ctx)`; each returns a map of settings (or nothing). Scripts run in
//! name order and later keys override earlier ones. A script that fails at run time affects
//! only the object it was evaluating: its result for that object is dropped and reported.

mod bundled;
pub mod context;
pub mod settings;

use std::path::Path;

use rhai::{AST, CallFnOptions, Dynamic, Engine, Map, Scope};

use crate::diagnostics::{Diagnostic, Diagnostics, Severity, Subject};
use crate::layers::{self, ReadLayer, SourceFile};
use crate::model::{BackendSettings, GlobalSettings};

pub use context::{HookContext, ValueSource};
pub use settings::RouteOutcome;

/// Operations one hook call may perform before it is stopped.
pub const MAX_OPERATIONS_PER_CALL: u64 = 100_000;

/// The hook points scripts can implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Hook {
    /// Once per pipeline run, reading the controller ConfigMap.
    Global,
    /// Once per Service backend: Service, then Ingress, then ConfigMap.
    Backend,
    /// Once per Ingress path: Ingress, then ConfigMap.
    Route,
}

impl Hook {
    pub const ALL: [Hook; 3] = [Hook::Global, Hook::Backend, Hook::Route];

    pub fn function_name(self) -> &'static str {
        match self {
            Hook::Global => "global",
            Hook::Backend => "backend",
            Hook::Route => "route",
        }
    }
}

/// Loading scripts failed.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    ReadScripts(#[from] ReadLayer),
    #[error("{file}: line {line}: {message}")]
    ScriptCompile {
        file: String,
        line: usize,
        message: String,
    },
}

/// A compiled script.
#[derive(Debug)]
struct Script {
    source: SourceFile,
    display: String,
    ast: AST,
    hooks: Vec<Hook>,
}

/// The compiled, effective set of scripts and the sandboxed engine that runs them.
#[derive(Debug)]
pub struct PolicyEngine {
    engine: Engine,
    scripts: Vec<Script>,
}

impl PolicyEngine {
    /// Compiles the bundled scripts overlaid by `site_dir`. Every compile error is reported.
    pub fn load(site_dir: Option<&Path>) -> Result<Self, Vec<PolicyError>> {
        let files = layers::effective(bundled::SCRIPTS, site_dir, "rhai")
            .map_err(|e| vec![PolicyError::from(e)])?;
        Self::compile(files)
    }

    /// Compiles the given effective files.
    pub fn compile(files: Vec<SourceFile>) -> Result<Self, Vec<PolicyError>> {
        let engine = sandboxed_engine();
        let mut scripts = Vec::new();
        let mut errors = Vec::new();
        for source in files {
            let display = source.display_name("scripts");
            match engine.compile(&source.text) {
                Ok(ast) => {
                    let hooks = Hook::ALL
                        .into_iter()
                        .filter(|h| {
                            ast.iter_functions()
                                .any(|f| f.name == h.function_name() && f.params.len() == 1)
                        })
                        .collect();
                    scripts.push(Script {
                        source,
                        display,
                        ast,
                        hooks,
                    });
                }
                Err(e) => errors.push(PolicyError::ScriptCompile {
                    file: display,
                    line: e.1.line().unwrap_or(0),
                    message: e.0.to_string(),
                }),
            }
        }
        if errors.is_empty() {
            Ok(Self { engine, scripts })
        } else {
            Err(errors)
        }
    }

    /// The effective script files, in evaluation order.
    pub fn scripts(&self) -> impl Iterator<Item = &SourceFile> {
        self.scripts.iter().map(|s| &s.source)
    }

    pub fn run_global(&self, ctx: &HookContext, diags: &mut Diagnostics) -> GlobalSettings {
        let mut out = GlobalSettings::default();
        self.run(Hook::Global, ctx, diags, |m| {
            settings::apply_global(m, &mut out)
        });
        out
    }

    pub fn run_backend(&self, ctx: &HookContext, diags: &mut Diagnostics) -> BackendSettings {
        let mut out = BackendSettings::default();
        self.run(Hook::Backend, ctx, diags, |m| {
            settings::apply_backend(m, &mut out)
        });
        out
    }

    pub fn run_route(&self, ctx: &HookContext, diags: &mut Diagnostics) -> RouteOutcome {
        let mut out = RouteOutcome::default();
        self.run(Hook::Route, ctx, diags, |m| {
            settings::apply_route(m, &mut out)
        });
        out
    }

    fn run(
        &self,
        hook: Hook,
        ctx: &HookContext,
        diags: &mut Diagnostics,
        mut apply: impl FnMut(&Map) -> Vec<settings::KeyError>,
    ) {
        for script in self.scripts.iter().filter(|s| s.hooks.contains(&hook)) {
            ctx.set_script(&script.display);
            let result = self.engine.call_fn_with_options::<Dynamic>(
                CallFnOptions::new().eval_ast(false).rewind_scope(true),
                &mut Scope::new(),
                &script.ast,
                hook.function_name(),
                (ctx.clone(),),
            );
            for d in ctx.take_diagnostics() {
                diags.push(d);
            }
            let script_error = |message: String| Diagnostic {
                severity: Severity::Error,
                subject: Subject::Source {
                    file: script.display.clone(),
                },
                field: Some(format!("{}() for {}", hook.function_name(), ctx.subject())),
                message,
            };
            match result {
                Ok(v) if v.is_unit() => {}
                Ok(v) => match v.try_cast::<Map>() {
                    Some(map) => {
                        for (key, message) in apply(&map) {
                            diags.push(script_error(format!("setting {key}: {message}")));
                        }
                    }
                    None => diags.push(script_error(
                        "the hook must return a map of settings or nothing".to_string(),
                    )),
                },
                Err(e) => {
                    let line = e.position().line().unwrap_or(0);
                    diags.push(script_error(format!(
                        "line {line}: {}; this script's settings are not applied to this object",
                        e.unwrap_inner()
                    )));
                }
            }
        }
    }
}

/// An engine with no way out: no `eval`, no modules, bounded operations, call depth and sizes.
fn sandboxed_engine() -> Engine {
    let mut engine = Engine::new();
    engine
        .set_max_operations(MAX_OPERATIONS_PER_CALL)
        .set_max_call_levels(32)
        .set_max_expr_depths(64, 32)
        .set_max_string_size(64 * 1024)
        .set_max_array_size(10_000)
        .set_max_map_size(10_000)
        .set_max_variables(1_000)
        .set_max_functions(256)
        .on_print(|_| {})
        .on_debug(|_, _, _| {});
    engine.disable_symbol("eval");
    context::register(&mut engine);
    engine
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::layers::Layer;
    use crate::objects::{Key, Kind, ObjectRef};

    fn source(name: &str, text: &str) -> SourceFile {
        SourceFile {
            name: name.into(),
            layer: Layer::Bundled,
            text: text.into(),
        }
    }

    fn service_ctx(annotations: &[(&str, &str)]) -> HookContext {
        let obj = ObjectRef::new(Kind::Service, &Key::new("ns", "web"));
        let values: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HookContext::new(
            obj.clone(),
            vec![ValueSource::annotations(obj, Arc::new(values))],
            BTreeMap::new(),
        )
    }

    #[test]
    fn bundled_scripts_compile() {
        let engine = PolicyEngine::load(None).unwrap();
        assert!(engine.scripts().count() >= 10);
    }

    #[test]
    fn runaway_script_is_stopped_and_others_still_apply() {
        let engine = PolicyEngine::compile(vec![
            source("a.rhai", "fn backend(ctx) { loop {} }"),
            source("b.rhai", "fn backend(ctx) { #{ check: true } }"),
        ])
        .unwrap();
        let mut diags = Diagnostics::new();
        let out = engine.run_backend(&service_ctx(&[]), &mut diags);
        assert!(out.check);
        let msgs: Vec<_> = diags.iter().map(|d| d.to_string()).collect();
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(msgs[0].contains("a.rhai"), "{msgs:?}");
    }

    #[test]
    fn eval_and_import_are_refused_at_compile_time() {
        for text in [r#"fn backend(ctx) { eval("1") }"#, r#"import "x" as y;"#] {
            let err = PolicyEngine::compile(vec![source("bad.rhai", text)]).unwrap_err();
            assert!(
                matches!(err[0], PolicyError::ScriptCompile { .. }),
                "{text}"
            );
        }
    }

    #[test]
    fn aliases_and_prefixes_keep_object_precedence() {
        let engine = PolicyEngine::load(None).unwrap();
        let ingress = ObjectRef::new(Kind::Ingress, &Key::new("ns", "web"));
        let cm = ObjectRef::new(Kind::ConfigMap, &Key::new("ns", "cfg"));
        let map = |pairs: &[(&str, &str)]| {
            Arc::new(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        let ctx = HookContext::new(
            ingress.clone(),
            vec![
                // The alias on the Ingress beats the main name in the ConfigMap; a bad value
                // under one prefix falls through to the next prefix on the same object.
                ValueSource::annotations(
                    ingress,
                    map(&[
                        ("haproxy.org/whitelist", "203.0.113.0/24"),
                        ("portcullis.io/deny-list", "nonsense"),
                        ("haproxy.org/deny-list", "192.0.2.1"),
                    ]),
                ),
                ValueSource::config_map(cm, map(&[("allow-list", "10.0.0.0/8")])),
            ],
            BTreeMap::new(),
        );
        let mut diags = Diagnostics::new();
        let out = engine.run_route(&ctx, &mut diags);
        assert_eq!(out.settings.allow_list, ["203.0.113.0/24"]);
        assert_eq!(out.settings.deny_list, ["192.0.2.1"]);
        let msgs: Vec<_> = diags.iter().map(|d| d.to_string()).collect();
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(
            msgs[0].contains("annotation portcullis.io/deny-list"),
            "{msgs:?}"
        );
    }

    #[test]
    fn scripts_cannot_read_the_clock() {
        let err = PolicyEngine::compile(vec![source(
            "clock.rhai",
            "fn backend(ctx) { let t = timestamp(); #{} }",
        )])
        .map(|e| {
            let mut diags = Diagnostics::new();
            e.run_backend(&service_ctx(&[]), &mut diags);
            diags.len()
        });
        // Either refused at compile time or failing at run time; never a value.
        assert!(!matches!(err, Ok(0)));
    }

    #[test]
    fn bad_annotation_is_reported_with_object_and_field() {
        let engine = PolicyEngine::compile(vec![source(
            "t.rhai",
            r#"fn backend(ctx) { let t = ctx.duration("timeout-server"); if t != () { #{ timeout_server: t } } }"#,
        )])
        .unwrap();
        let mut diags = Diagnostics::new();
        let out = engine.run_backend(
            &service_ctx(&[("haproxy.org/timeout-server", "5x\n  lua-load /x")]),
            &mut diags,
        );
        assert!(out.timeouts.is_empty());
        let msg = diags.iter().next().unwrap().to_string();
        assert!(
            msg.contains("Service ns/web") && msg.contains("annotation haproxy.org/timeout-server"),
            "{msg}"
        );
    }

    #[test]
    fn snippets_come_only_from_the_accessor_and_only_when_allowed() {
        let engine = PolicyEngine::compile(vec![
            source(
                "smuggle.rhai",
                r#"fn backend(ctx) { #{ config_snippet: "lua-load /tmp/x.lua" } }"#,
            ),
            source(
                "snippet.rhai",
                r#"fn backend(ctx) { let s = ctx.snippet("backend-config-snippet"); if s != () { #{ config_snippet: s } } }"#,
            ),
        ])
        .unwrap();
        let annotated = || service_ctx(&[("haproxy.org/backend-config-snippet", "option httplog")]);
        let mut diags = Diagnostics::new();
        let out = engine.run_backend(&annotated(), &mut diags);
        assert!(out.config_snippet.is_empty(), "off by default");
        let msgs: Vec<_> = diags.iter().map(|d| d.to_string()).collect();
        assert!(
            msgs.iter().any(|m| m.contains("expected a snippet")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter().any(|m| m.contains("--allow-config-snippets")),
            "{msgs:?}"
        );

        let policy = crate::snippets::SnippetPolicy {
            allow: true,
            in_annotations: true,
        };
        let mut diags = Diagnostics::new();
        let out = engine.run_backend(&annotated().with_snippets(policy), &mut diags);
        assert_eq!(out.config_snippet, ["option httplog"]);
    }
}
