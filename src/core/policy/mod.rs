//! The policy engine: Rhai scripts that decide what annotations mean.
//!
//! Scripts are compiled once. Each may define any of the hook functions `global(ctx)`,
//! `backend(ctx)` and `route(ctx)`; each returns a map of settings (or nothing). Scripts run in
//! name order and later keys override earlier ones. A script that fails at run time affects
//! only the object it was evaluating: its result for that object is dropped and reported.

pub mod budget;
mod bundled;
pub mod context;
pub mod global_keys;
pub mod memo;
pub mod names;
pub mod reads;
pub mod settings;

use std::sync::{Arc, Mutex};

use rhai::{AST, CallFnOptions, Dynamic, Engine, Map, Scope};

use crate::diagnostics::{Diagnostic, Diagnostics, Severity, Subject};
use crate::layers::{self, ReadLayer, SiteFiles, SourceFile};
use crate::model::{BackendSettings, GlobalSettings};

pub use budget::{Budget, MAX_CALL_TIME, MAX_OPERATIONS_PER_CALL, MAX_OPERATIONS_PER_RUN};
use context::Report;
pub use context::{HookContext, ValueSource};
pub use settings::RouteOutcome;

/// What a hook run gives back: the settings, what was wrong with the inputs or the scripts,
/// and the budget after its calls.
#[derive(Debug)]
pub struct HookRun<T> {
    pub settings: T,
    pub diagnostics: Diagnostics,
    pub budget: Budget,
}

/// The hook points scripts can implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

/// How much harm a script can do if it is wrong or abused, as its author declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Risk {
    /// Cosmetic or bounded: headers, timeouts, balance algorithm.
    Low,
    /// Changes who reaches what, or load on the pods: access lists, rewrites, redirects.
    Medium,
    /// Changes security properties: TLS to the pods, authentication, persistence.
    High,
    /// Can change the configuration almost arbitrarily: raw config snippets.
    Critical,
}

impl Risk {
    fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "low" => Some(Risk::Low),
            "medium" => Some(Risk::Medium),
            "high" => Some(Risk::High),
            "critical" => Some(Risk::Critical),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Low => "low",
            Risk::Medium => "medium",
            Risk::High => "high",
            Risk::Critical => "critical",
        }
    }
}

/// What a script declares in its header comment: `// Scope: backend, route` and
/// `// Risk: low`, both required so that an operator reviewing a site layer sees at a glance
/// what each script can touch, and a `// Read: …` line per setting it reads
/// ([`reads::Read`]), continued on the indented comment lines that follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    pub scope: Vec<Hook>,
    pub risk: Risk,
    pub reads: Vec<reads::Read>,
}

impl Declaration {
    /// Reads the declaration from the script's leading comment lines.
    /// A failure is given with the (1-based) line it concerns.
    fn parse(text: &str) -> Result<Self, (usize, String)> {
        if text.trim().is_empty() {
            // An empty site file switches the bundled script of that name off.
            return Ok(Self {
                scope: Vec::new(),
                risk: Risk::Low,
                reads: Vec::new(),
            });
        }
        let mut scope = None;
        let mut risk = None;
        // The `Read:` lines, each with its continuation lines.
        let mut read_texts: Vec<(usize, String)> = Vec::new();
        let mut in_read = false;
        for (n, line) in text.lines().map(str::trim).enumerate() {
            if line.is_empty() {
                in_read = false;
                continue;
            }
            let Some(raw) = line.strip_prefix("//") else {
                break;
            };
            // An indented comment line continues the directive above it.
            if in_read && raw.starts_with("  ") && !raw.trim().is_empty() {
                if let Some((_, text)) = read_texts.last_mut() {
                    text.push(' ');
                    text.push_str(raw.trim());
                }
                continue;
            }
            in_read = false;
            let comment = raw.trim();
            let Some((key, value)) = comment.split_once(':') else {
                continue;
            };
            match key.trim().to_ascii_lowercase().as_str() {
                "read" => {
                    read_texts.push((n + 1, value.trim().to_string()));
                    in_read = true;
                }
                "scope" => {
                    let mut hooks = Vec::new();
                    for word in value.split(',').map(str::trim) {
                        let hook = Hook::ALL
                            .into_iter()
                            .find(|h| h.function_name() == word)
                            .ok_or_else(|| {
                                (
                                    n + 1,
                                    format!("Scope: {word:?} is not one of global, backend, route"),
                                )
                            })?;
                        hooks.push(hook);
                    }
                    hooks.sort();
                    hooks.dedup();
                    scope = Some(hooks);
                }
                "risk" => {
                    risk = Some(Risk::parse(value).ok_or_else(|| {
                        (
                            n + 1,
                            format!(
                                "Risk: {:?} is not one of low, medium, high, critical",
                                value.trim()
                            ),
                        )
                    })?);
                }
                _ => {}
            }
        }
        let reads = read_texts
            .iter()
            .map(|(n, t)| reads::Read::parse(t).map_err(|e| (*n, e)))
            .collect::<Result<Vec<_>, _>>()?;
        match (scope, risk) {
            (Some(scope), Some(risk)) => Ok(Self { scope, risk, reads }),
            _ => Err((
                1,
                "the header must declare `// Scope: <global|backend|route>[, ...]` and `// Risk: <low|medium|high|critical>`"
                    .to_string(),
            )),
        }
    }

    /// The declared risk, or `-` for an empty (disabling) file, which declares none.
    pub fn risk_text(&self) -> &'static str {
        if self.scope.is_empty() {
            "-"
        } else {
            self.risk.as_str()
        }
    }

    pub fn scope_text(&self) -> String {
        if self.scope.is_empty() {
            return "(disabled)".to_string();
        }
        self.scope
            .iter()
            .map(|h| h.function_name())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A compiled script.
#[derive(Debug)]
struct Script {
    source: SourceFile,
    display: String,
    ast: AST,
    hooks: Vec<Hook>,
    declaration: Declaration,
    /// What its reads are checked against.
    declared: Arc<reads::Declared>,
    /// Names the script's results in the memo: a hash of its name and text, so that an
    /// unchanged script keeps its results across a reload of the script set.
    memo_id: u64,
}

/// A sandboxed engine and the meter its progress callback counts the running call on.
#[derive(Debug)]
struct Metered {
    engine: Engine,
    meter: Arc<budget::Meter>,
}

impl Metered {
    fn new() -> Self {
        let meter = Arc::new(budget::Meter::default());
        Self {
            engine: sandboxed_engine(meter.clone()),
            meter,
        }
    }
}

/// The engines that run calls, each lent to one call at a time, so that a call's meter
/// (and so its budget) is its own while calls run on several threads. There are as many as
/// calls ever ran at once.
#[derive(Debug, Default)]
struct Engines {
    idle: Mutex<Vec<Metered>>,
}

impl Engines {
    fn lend<R>(&self, work: impl FnOnce(&Metered) -> R) -> R {
        let metered = self
            .idle
            .lock()
            .ok()
            .and_then(|mut idle| idle.pop())
            .unwrap_or_else(Metered::new);
        let out = work(&metered);
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(metered);
        }
        out
    }
}

/// The compiled, effective set of scripts and the sandboxed engines that run them.
#[derive(Debug)]
pub struct PolicyEngine {
    engines: Engines,
    scripts: Vec<Script>,
    run_budget: u64,
    memo: std::sync::Arc<memo::Memo>,
    /// Shared with the engine this one replaced (see [`PolicyEngine::keep_memo_of`]): its
    /// keys name the scripts of the hook, so the runs of unchanged hooks stay valid.
    whole: std::sync::Arc<memo::WholeRuns>,
    /// By hook (`hook as usize`, the order of [`Hook::ALL`]), the fingerprint of the scripts
    /// that implement it (names and texts, in evaluation order): part of every whole run's key.
    hook_scripts: [u128; 3],
    /// The names the scripts declare they read.
    vocabulary: reads::Vocabulary,
}

impl PolicyEngine {
    /// Compiles the bundled scripts overlaid by `site_dir`. Every compile error is reported.
    pub fn load(site: Option<&SiteFiles>) -> Result<Self, Vec<PolicyError>> {
        Self::compile(layers::effective(bundled::SCRIPTS, site))
    }

    /// Compiles the given effective files.
    pub fn compile(files: Vec<SourceFile>) -> Result<Self, Vec<PolicyError>> {
        let compiler = Metered::new();
        let engine = &compiler.engine;
        let mut scripts = Vec::new();
        let mut errors = Vec::new();
        for source in files {
            let display = source.display_name("scripts");
            let declaration = match Declaration::parse(&source.text) {
                Ok(d) => d,
                Err((line, message)) => {
                    errors.push(PolicyError::ScriptCompile {
                        file: display,
                        line,
                        message,
                    });
                    continue;
                }
            };
            match engine.compile(&source.text) {
                Ok(ast) => {
                    let hooks: Vec<Hook> = Hook::ALL
                        .into_iter()
                        .filter(|h| {
                            ast.iter_functions()
                                .any(|f| f.name == h.function_name() && f.params.len() == 1)
                        })
                        .collect();
                    if let Some(h) = hooks.iter().find(|h| !declaration.scope.contains(h)) {
                        errors.push(PolicyError::ScriptCompile {
                            file: display,
                            line: 1,
                            message: format!(
                                "defines {}() but declares `Scope: {}`",
                                h.function_name(),
                                declaration.scope_text()
                            ),
                        });
                        continue;
                    }
                    let declared = Arc::new(reads::Declared::new(&declaration.reads));
                    let mut refused = false;
                    for read in reads::literal_reads(&ast) {
                        for name in &read.names {
                            if let Some(message) =
                                declared.refuse(name, &read.accessor, read.args.as_ref())
                            {
                                refused = true;
                                errors.push(PolicyError::ScriptCompile {
                                    file: display.clone(),
                                    line: read.line,
                                    message,
                                });
                            }
                        }
                    }
                    if refused {
                        continue;
                    }
                    let memo_id = {
                        use std::hash::{Hash, Hasher};
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        (&display, &source.text).hash(&mut h);
                        h.finish()
                    };
                    scripts.push(Script {
                        source,
                        display,
                        ast,
                        hooks,
                        declaration,
                        declared,
                        memo_id,
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
            let hook_scripts = Hook::ALL.map(|hook| {
                let mut f = crate::fingerprint::Fingerprint::new();
                for script in scripts.iter().filter(|s| s.hooks.contains(&hook)) {
                    f.add(&(&script.display, &script.source.text));
                }
                f.finish()
            });
            let vocabulary =
                reads::Vocabulary::new(scripts.iter().flat_map(|s| &s.declaration.reads));
            Ok(Self {
                vocabulary,
                engines: Engines {
                    idle: Mutex::new(vec![compiler]),
                },
                scripts,
                run_budget: MAX_OPERATIONS_PER_RUN,
                memo: std::sync::Arc::default(),
                whole: std::sync::Arc::default(),
                hook_scripts,
            })
        } else {
            Err(errors)
        }
    }

    /// The annotation names and ConfigMap keys the effective scripts declare they read.
    pub fn vocabulary(&self) -> &reads::Vocabulary {
        &self.vocabulary
    }

    /// The effective script files, in evaluation order.
    pub fn scripts(&self) -> impl Iterator<Item = &SourceFile> {
        self.scripts.iter().map(|s| &s.source)
    }

    /// Starts a pipeline run that translates everything afresh: drops the remembered
    /// results the previous run did not use. (A run that takes parts of the last one keeps
    /// them all, since the parts taken stand for the hook calls they made.)
    pub fn begin_run(&self) {
        self.memo.begin_run();
        self.whole.begin_run();
    }

    /// A pipeline run's operation budget, nothing spent.
    pub fn budget(&self) -> Budget {
        Budget::new(self.run_budget)
    }

    /// Takes over `previous`' remembered results (after the script set was reloaded): those
    /// of scripts that did not change are still valid, and so are the whole runs of hooks
    /// whose scripts did not change (a route script edited leaves the backends' runs found);
    /// the others are never found again.
    pub fn keep_memo_of(&mut self, previous: &PolicyEngine) {
        self.memo = previous.memo.clone();
        self.whole = previous.whole.clone();
    }

    /// How many hook results are remembered.
    pub fn memo_len(&self) -> usize {
        self.memo.len()
    }

    /// How many results are remembered, of single calls and of whole hook runs.
    pub fn remembered(&self) -> usize {
        self.memo.len() + self.whole.len()
    }

    /// Changes the per-run operation budget (tests use a small one).
    pub fn with_run_budget(mut self, operations: u64) -> Self {
        self.run_budget = operations;
        self
    }

    /// The effective script files with their declared scope and risk.
    pub fn declarations(&self) -> impl Iterator<Item = (&SourceFile, &Declaration)> {
        self.scripts.iter().map(|s| (&s.source, &s.declaration))
    }

    /// Runs the `global` hooks on the controller ConfigMap.
    pub fn run_global(&self, ctx: &HookContext, budget: Budget) -> HookRun<GlobalSettings> {
        hook_run(budget, |budget, diags| {
            let mut out = GlobalSettings::default();
            let mut owners = settings::SiteOwners::default();
            self.run(Hook::Global, ctx, budget, diags, |m, script| {
                settings::apply_global(m, &mut out, script, &mut owners)
            });
            out
        })
    }

    /// Runs the `backend` hooks. The settings are shared with the equal settings of other
    /// backends.
    pub fn run_backend(&self, ctx: &HookContext, budget: Budget) -> HookRun<Arc<BackendSettings>> {
        hook_run(budget, |budget, diags| {
            let scripts = self.hook_scripts[Hook::Backend as usize];
            self.whole.run(
                Hook::Backend,
                scripts,
                ctx,
                budget,
                diags,
                |budget, diags| {
                    let mut out = BackendSettings::default();
                    let mut owners = settings::SiteOwners::default();
                    let read_facts = self.run(Hook::Backend, ctx, budget, diags, |m, script| {
                        settings::apply_backend(m, &mut out, script, &mut owners)
                    });
                    (Arc::new(out), read_facts)
                },
            )
        })
    }

    /// Runs the `route` hooks of one path.
    pub fn run_route(&self, ctx: &HookContext, budget: Budget) -> HookRun<RouteOutcome> {
        hook_run(budget, |budget, diags| {
            let scripts = self.hook_scripts[Hook::Route as usize];
            self.whole
                .run(Hook::Route, scripts, ctx, budget, diags, |budget, diags| {
                    let mut out = RouteOutcome::default();
                    let mut owners = settings::SiteOwners::default();
                    let read_facts = self.run(Hook::Route, ctx, budget, diags, |m, script| {
                        settings::apply_route(m, &mut out, script, &mut owners)
                    });
                    (out, read_facts)
                })
        })
    }

    /// `hook`'s scripts on `ctx` ([`Self::run_scripts`]), each call found in the memo when
    /// it can be; whether a fact was read.
    fn run(
        &self,
        hook: Hook,
        ctx: &HookContext,
        budget: &mut Budget,
        diags: &mut Diagnostics,
        apply: impl FnMut(&Map, &str) -> Vec<settings::KeyError>,
    ) -> bool {
        let mut calls = self.memo.calls();
        self.run_scripts(hook, ctx, budget, diags, apply, |script, budget, take| {
            calls.call(
                script.memo_id,
                hook,
                ctx,
                budget,
                |budget| self.call(script, hook, ctx, budget),
                take,
            );
        });
        calls.read_facts()
    }

    /// The hook run: every script of `hook`, in order, each call's reports named against
    /// `ctx`'s objects and its settings applied. `call` makes a script's call, or stands in
    /// for it, and lends its result to the function it is given.
    fn run_scripts(
        &self,
        hook: Hook,
        ctx: &HookContext,
        budget: &mut Budget,
        diags: &mut Diagnostics,
        mut apply: impl FnMut(&Map, &str) -> Vec<settings::KeyError>,
        mut call: impl FnMut(&Script, &mut Budget, &mut dyn FnMut(CallResult<'_>, &[Report])),
    ) {
        for script in self.scripts.iter().filter(|s| s.hooks.contains(&hook)) {
            call(script, budget, &mut |result, reports| {
                for report in reports {
                    if let Some(d) = ctx.resolve(report) {
                        diags.push(d);
                    }
                }
                self.apply_result(hook, ctx, script, result, diags, &mut apply);
            });
        }
    }

    /// `script`'s `hook` called on `ctx`, counted on `budget`.
    fn call(&self, script: &Script, hook: Hook, ctx: &HookContext, budget: &mut Budget) -> Call {
        let ctx = context::Ctx::new(ctx, &script.display).checking(script.declared.clone());
        let (value, operations, stop) = self.engines.lend(|metered| {
            metered.meter.start(budget.left());
            // A panic inside the engine or an accessor must only cost this object its
            // settings.
            let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                metered.engine.call_fn_with_options::<Dynamic>(
                    CallFnOptions::new().eval_ast(false).rewind_scope(true),
                    &mut Scope::new(),
                    &script.ast,
                    hook.function_name(),
                    (ctx.clone(),),
                )
            }))
            .unwrap_or_else(|_| {
                Err(Box::new(rhai::EvalAltResult::ErrorRuntime(
                    "the script panicked".into(),
                    rhai::Position::NONE,
                )))
            });
            let (operations, stop) = metered.meter.finish();
            (value, operations, stop)
        });
        budget.spend(operations, stop.is_some());
        let log = ctx.take_log();
        // An undeclared read fails the call even when the script caught its error.
        let value = match (&log.undeclared, value) {
            (Some(why), Ok(_)) => Err(Box::new(rhai::EvalAltResult::ErrorRuntime(
                why.as_str().into(),
                rhai::Position::NONE,
            ))),
            (_, value) => value,
        };
        Call {
            value,
            log,
            operations,
        }
    }

    /// Applies one hook call's result (a settings map, nothing, or an error) to the settings.
    fn apply_result(
        &self,
        hook: Hook,
        ctx: &HookContext,
        script: &Script,
        result: CallResult<'_>,
        diags: &mut Diagnostics,
        apply: &mut impl FnMut(&Map, &str) -> Vec<settings::KeyError>,
    ) {
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
            Ok(v) => match v.as_map_ref() {
                Ok(map) => {
                    for e in apply(&map, &script.display) {
                        let mut d = script_error(format!("setting {}: {}", e.key, e.message));
                        if e.warning {
                            d.severity = Severity::Warning;
                        }
                        diags.push(d);
                    }
                }
                Err(_) => diags.push(script_error(
                    "the hook must return a map of settings or nothing".to_string(),
                )),
            },
            Err(e) => {
                let line = e.position().line().unwrap_or(0);
                let reason = match e.unwrap_inner() {
                    rhai::EvalAltResult::ErrorTerminated(token, _) => {
                        format!("stopped: {token}")
                    }
                    // The line is said once, before.
                    rhai::EvalAltResult::ErrorRuntime(message, _) => message.to_string(),
                    other => other.to_string(),
                };
                let at = if line == 0 {
                    String::new()
                } else {
                    format!("line {line}: ")
                };
                diags.push(script_error(format!(
                    "{at}{reason}; this script's settings are not applied to this object"
                )));
            }
        }
    }
}

/// What a script's call gave: a settings map or unit, or why it gave nothing.
type CallResult<'a> = Result<&'a Dynamic, &'a rhai::EvalAltResult>;

/// A script's call: what it gave, what it read and reported, and the operations it used.
#[derive(Debug)]
pub struct Call {
    pub value: Result<Dynamic, Box<rhai::EvalAltResult>>,
    pub log: context::Log,
    pub operations: u64,
}

/// Runs `work` on `budget` with diagnostics of its own, as a [`HookRun`].
fn hook_run<T>(
    mut budget: Budget,
    work: impl FnOnce(&mut Budget, &mut Diagnostics) -> T,
) -> HookRun<T> {
    let mut diagnostics = Diagnostics::new();
    let settings = work(&mut budget, &mut diagnostics);
    HookRun {
        settings,
        diagnostics,
        budget,
    }
}

/// An engine with no way out: no `eval`, no modules, bounded operations, call depth and sizes.
/// Its progress callback counts each call on `meter`.
fn sandboxed_engine(meter: Arc<budget::Meter>) -> Engine {
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
        .on_progress(move |operations| meter.progress(operations))
        // No string interner: with the `sync` feature it is one lock for every thread, and
        // a thread that finds it taken sleeps 10 ms (rhai 1.27's `locked_write`). A cold run's
        // two workers lost up to 50 ms to it at 10 000 Ingresses.
        .set_max_strings_interned(0)
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

    /// `engine`'s backend hooks on `ctx` with a run's whole budget; their reports go to `diags`.
    fn run_backend(
        engine: &PolicyEngine,
        ctx: &HookContext,
        diags: &mut Diagnostics,
    ) -> Arc<BackendSettings> {
        let run = engine.run_backend(ctx, engine.budget());
        diags.extend(run.diagnostics);
        run.settings
    }

    /// `engine`'s route hooks on `ctx` with a run's whole budget; their reports go to `diags`.
    fn run_route(
        engine: &PolicyEngine,
        ctx: &HookContext,
        diags: &mut Diagnostics,
    ) -> RouteOutcome {
        let run = engine.run_route(ctx, engine.budget());
        diags.extend(run.diagnostics);
        run.settings
    }

    /// A test script; its declaration is added unless it has one.
    fn source(name: &str, text: &str) -> SourceFile {
        let text = if text.contains("// Risk:") {
            text.to_string()
        } else {
            format!("// Scope: global, backend, route\n// Risk: low\n{text}")
        };
        SourceFile {
            name: name.into(),
            layer: Layer::Bundled,
            text,
        }
    }

    #[test]
    fn scripts_must_declare_scope_and_risk_and_stay_in_scope() {
        let missing = PolicyEngine::compile(vec![source(
            "bare.rhai",
            "// Risk: low\nfn backend(ctx) { #{} }",
        )])
        .unwrap_err();
        assert!(missing[0].to_string().contains("Scope:"), "{}", missing[0]);
        let outside = PolicyEngine::compile(vec![source(
            "wide.rhai",
            "// Scope: route\n// Risk: low\nfn backend(ctx) { #{} }",
        )])
        .unwrap_err();
        assert!(
            outside[0]
                .to_string()
                .contains("defines backend() but declares `Scope: route`"),
            "{}",
            outside[0]
        );
        let bad_risk = PolicyEngine::compile(vec![source(
            "r.rhai",
            "// Scope: route\n// Risk: whatever\nfn route(ctx) { #{} }",
        )])
        .unwrap_err();
        assert!(bad_risk[0].to_string().contains("Risk:"), "{}", bad_risk[0]);
        let off = PolicyEngine::compile(vec![SourceFile {
            name: "check.rhai".into(),
            layer: Layer::Bundled,
            text: " \n".into(),
        }])
        .unwrap();
        assert_eq!(
            off.declarations().next().unwrap().1.scope_text(),
            "(disabled)"
        );
        assert_eq!(off.declarations().next().unwrap().1.risk_text(), "-");
        let engine = PolicyEngine::load(None).unwrap();
        let snippets = engine
            .declarations()
            .find(|(f, _)| f.name == "config-snippets.rhai")
            .unwrap();
        assert_eq!(snippets.1.risk, Risk::Critical);
    }

    /// `Read:` lines are parsed with their indented continuation lines; a bad one is a
    /// compile error of the script naming the line's problem.
    #[test]
    fn read_declarations_are_parsed_with_their_continuations() {
        let engine = PolicyEngine::compile(vec![source(
            "r.rhai",
            "// r.rhai: reads two settings.\n//\n// Scope:    route\n// Risk:     low\n//\n// Read:     allow-list (whitelist) cidrs from Ingress, ConfigMap default none: who\n//           may come in.\n// Read:     set-host host from Ingress: the Host.\n// Produces: nothing.\n//           Really nothing.\n\nfn route(ctx) { () }",
        )])
        .unwrap();
        let (_, declaration) = engine.declarations().next().unwrap();
        assert_eq!(declaration.reads.len(), 2);
        assert_eq!(declaration.reads[0].description, "who may come in.");
        assert_eq!(declaration.reads[1].description, "the Host.");
        assert!(engine.vocabulary().knows("whitelist"));
        let bad = PolicyEngine::compile(vec![source(
            "bad.rhai",
            "// Scope: route\n// Risk: low\n// Read: allow-list cidrs from Ingres: x.\nfn route(ctx) { () }",
        )])
        .unwrap_err();
        let message = bad[0].to_string();
        assert!(
            message.contains("bad.rhai (bundled): line 3: Read: \"Ingres\" is not an object kind"),
            "{message}"
        );
    }

    /// A hook that reads facts, the subject, a derived context and warns: remembered results
    /// follow each of those reads, and reports name the object at hand.
    #[test]
    fn remembered_results_follow_every_read() {
        let engine = PolicyEngine::compile(vec![source(
            "reads.rhai",
            r#"// Read: timeout-server duration from Service, ConfigMap: t.
fn backend(ctx) {
    if ctx.fact("tier") == "slow" { return #{ "timeout_server": 9000 }; }
    if ctx.name == "loud" { ctx.warn("loud backend"); }
    let t = ctx.without("Ingress").duration("timeout-server");
    if t != () { #{ "timeout_server": t } } else { () }
}"#,
        )])
        .unwrap();
        let run = |name: &str, tier: &str, timeout: &str| {
            let obj = ObjectRef::new(Kind::Service, &Key::new("ns", name));
            let values: BTreeMap<String, String> = [(
                "haproxy.org/timeout-server".to_string(),
                timeout.to_string(),
            )]
            .into();
            let facts = BTreeMap::from([("tier", tier.to_string())]);
            let ctx = HookContext::new(
                obj.clone(),
                vec![ValueSource::annotations(obj, Arc::new(values))],
                facts,
            );
            let mut diags = Diagnostics::new();
            let out = run_backend(&engine, &ctx, &mut diags);
            let diags: Vec<String> = diags
                .into_sorted()
                .iter()
                .map(ToString::to_string)
                .collect();
            (
                out.timeouts.get(&crate::model::Timeout::Server).copied(),
                diags,
            )
        };
        engine.begin_run();
        // Twice each, in mixed order: the second of each is a replay.
        for _ in 0..2 {
            assert_eq!(run("a", "slow", "1s"), (Some(9000), vec![]));
            assert_eq!(run("a", "fast", "1s"), (Some(1000), vec![]));
            assert_eq!(run("b", "fast", "2s"), (Some(2000), vec![]));
            let (timeout, diags) = run("loud", "fast", "bad");
            assert_eq!(timeout, None);
            assert_eq!(diags.len(), 2, "{diags:?}");
            assert!(
                diags.iter().all(|d| d.contains("Service ns/loud")),
                "{diags:?}"
            );
            let (_, diags) = run("quiet", "fast", "bad");
            assert_eq!(diags.len(), 1, "{diags:?}");
            assert!(diags[0].contains("Service ns/quiet"), "{diags:?}");
        }
        assert_eq!(engine.memo_len(), 5);
    }

    /// A whole run that read no fact is found again for any facts (the other routes of an
    /// Ingress); one that read a fact only for the same facts.
    #[test]
    fn whole_runs_without_fact_reads_are_shared_across_facts() {
        let engine = PolicyEngine::compile(vec![source(
            "tiers.rhai",
            r#"// Read: timeout-server duration from Service: t.
fn backend(ctx) {
    if ctx.duration("timeout-server") == () { return #{ "timeout_server": 5000 }; }
    if ctx.fact("tier") == "slow" { #{ "timeout_server": 9000 } } else { #{ "timeout_server": 1000 } }
}"#,
        )])
        .unwrap();
        let run_on = |name: &str, timeout: Option<&str>, tier: &str| {
            let obj = ObjectRef::new(Kind::Service, &Key::new("ns", name));
            let values: BTreeMap<String, String> = timeout
                .map(|t| ("haproxy.org/timeout-server".to_string(), t.to_string()))
                .into_iter()
                .collect();
            let ctx = HookContext::new(
                obj.clone(),
                vec![ValueSource::annotations(obj, Arc::new(values))],
                BTreeMap::from([("tier", tier.to_string())]),
            );
            let out = run_backend(&engine, &ctx, &mut Diagnostics::new());
            let whole = engine.remembered() - engine.memo_len();
            (
                out.timeouts.get(&crate::model::Timeout::Server).copied(),
                whole,
            )
        };
        let run = |timeout: Option<&str>, tier: &str| run_on("web", timeout, tier);
        engine.begin_run();
        assert_eq!(run(None, "slow"), (Some(5000), 1));
        assert_eq!(
            run(None, "fast"),
            (Some(5000), 1),
            "found without its facts"
        );
        assert_eq!(run(Some("1s"), "slow"), (Some(9000), 2));
        assert_eq!(run(Some("1s"), "fast"), (Some(1000), 3), "a fact was read");
        assert_eq!(run(Some("1s"), "slow"), (Some(9000), 3));
        assert_eq!(run(None, "other"), (Some(5000), 3));
        // Another object: no whole run to find, the script's reads replayed from the memo,
        // the fact among them.
        let memo = engine.memo_len();
        assert_eq!(run_on("api", Some("1s"), "slow"), (Some(9000), 4));
        assert_eq!(engine.memo_len(), memo, "replayed, not run");
        assert_eq!(run_on("api", Some("1s"), "fast"), (Some(1000), 5));
    }

    /// A reloaded engine takes over the whole runs: those of a hook whose scripts did not
    /// change are found again, those of a hook whose script changed are run again.
    #[test]
    fn whole_runs_of_unchanged_hooks_outlive_a_reload() {
        let engine = |maxconn: u32, header: &str| {
            PolicyEngine::compile(vec![
                source(
                    "conns.rhai",
                    &format!("fn backend(ctx) {{ #{{ \"maxconn\": {maxconn} }} }}"),
                ),
                source(
                    "headers.rhai",
                    &format!(
                        "fn route(ctx) {{ #{{ \"request_headers\": [[\"X-Env\", \"{header}\"]] }} }}"
                    ),
                ),
            ])
            .unwrap()
        };
        let route_ctx = {
            let obj = ObjectRef::new(Kind::Ingress, &Key::new("ns", "web"));
            HookContext::new(
                obj.clone(),
                vec![ValueSource::annotations(obj, Arc::new(BTreeMap::new()))],
                BTreeMap::new(),
            )
        };
        let whole = |e: &PolicyEngine| e.remembered() - e.memo_len();
        let header = |e: &PolicyEngine| {
            run_route(e, &route_ctx, &mut Diagnostics::new())
                .settings
                .request_headers[0]
                .1
                .clone()
        };
        let maxconn =
            |e: &PolicyEngine| run_backend(e, &service_ctx(&[]), &mut Diagnostics::new()).maxconn;
        let first = engine(10, "a");
        first.begin_run();
        assert_eq!((header(&first), maxconn(&first)), ("a".into(), Some(10)));
        assert_eq!(whole(&first), 2);

        // The backend script changed: its run is done again, the route's is found.
        let mut second = engine(20, "a");
        second.keep_memo_of(&first);
        second.begin_run();
        assert_eq!(header(&second), "a");
        assert_eq!(whole(&second), 2, "the route's run was found");
        assert_eq!(maxconn(&second), Some(20));
        assert_eq!(whole(&second), 3, "the backend's run was done again");

        // The route script changed: its run is done again.
        let mut third = engine(20, "b");
        third.keep_memo_of(&second);
        third.begin_run();
        assert_eq!((header(&third), maxconn(&third)), ("b".into(), Some(20)));
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

    /// Every name a bundled script reads is one it declares (the compile-time check), and
    /// the names timeouts.rhai builds at run time are declared too.
    #[test]
    fn bundled_scripts_declare_what_they_read() {
        let engine = PolicyEngine::load(None).unwrap();
        let literal: usize = engine
            .scripts
            .iter()
            .map(|s| reads::literal_reads(&s.ast).len())
            .sum();
        assert!(literal > 50, "{literal}");
        for script in &engine.scripts {
            assert!(
                !script.declaration.reads.is_empty(),
                "{} declares no reads",
                script.display
            );
        }
        for name in [
            "client",
            "client-fin",
            "connect",
            "http-keep-alive",
            "http-request",
        ]
        .iter()
        .chain(&["queue", "server", "server-fin", "tunnel", "check"])
        {
            assert!(
                engine.vocabulary().knows(&format!("timeout-{name}")),
                "{name}"
            );
        }
    }

    /// A literal read the header does not declare, or declares with another type or other
    /// arguments, is a compile error naming the file, the line and the name.
    #[test]
    fn undeclared_literal_reads_are_compile_errors() {
        let header = "// Scope: route\n// Risk: low\n// Read: set-host host from Ingress: h.\n// Read: hsts-max-age int(0..100) from Ingress: a.\n// Read: mode choice(a|b) from Ingress: m.\n";
        let refused = |body: &str| {
            let text = format!("{header}fn route(ctx) {{\n{body}\n}}");
            match PolicyEngine::compile(vec![source("r.rhai", &text)]) {
                Ok(_) => String::new(),
                Err(e) => e
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n"),
            }
        };
        let ok = "let h = ctx.host(\"set-host\"); let a = ctx.int(\"hsts-max-age\", 0, 100); let m = ctx.choice(\"mode\", [\"a\", \"b\"]); if ctx.has(\"mode\") { ctx.ignore_on(\"Service\", [\"set-host\"], \"x\"); }";
        assert_eq!(refused(ok), "");
        for (body, expected) in [
            (
                "let t = ctx.duration(\"timeout-server\");",
                "scripts/r.rhai (bundled): line 7: reads \"timeout-server\" (ctx.duration) without declaring it",
            ),
            (
                "if ctx.has([\"set-host\", \"sethost\"]) {}",
                "line 7: reads \"sethost\" (ctx.has) without declaring it",
            ),
            (
                "ctx.ignore_on(\"Service\", \"other\", \"x\");",
                "reads \"other\" (ctx.ignore_on) without declaring it",
            ),
            (
                "let h = ctx.path(\"set-host\");",
                "reads \"set-host\" through ctx.path, but it is declared as host",
            ),
            (
                "let a = ctx.int(\"hsts-max-age\", 1, 100);",
                "it reads the range 1..100 but the declaration says 0..100",
            ),
            (
                "let m = ctx.choice(\"mode\", [\"a\"]);",
                "it allows a but the declaration says a|b",
            ),
        ] {
            let message = refused(body);
            assert!(message.contains(expected), "{body}: {message}");
        }
    }

    /// A name built at run time that the header does not declare fails that hook call, with
    /// an error naming the script and the name, whether or not the script catches it, and
    /// again on the next run (a failed call is never remembered); the other scripts apply.
    #[test]
    fn undeclared_runtime_reads_fail_the_call() {
        let engine = PolicyEngine::compile(vec![
            source(
                "built.rhai",
                "// Read: timeout-server duration from Service: t.\nfn backend(ctx) { let n = \"timeout-\" + ctx.name; let t = ctx.duration(n); #{ maxconn: 5 } }",
            ),
            source(
                "caught.rhai",
                "// Read: timeout-server duration from Service: t.\nfn backend(ctx) { let n = \"x-\" + ctx.name; try { ctx.bool(n) } catch {} #{ maxconn: 9 } }",
            ),
            source(
                "typed.rhai",
                "// Read: timeout-server duration from Service: t.\nfn backend(ctx) { let n = \"timeout-\" + \"server\"; let t = ctx.int(n, 1, 2); #{ forwarded_for: false } }",
            ),
            source(
                "fine.rhai",
                "// Read: timeout-server duration from Service: t.\nfn backend(ctx) { let n = \"timeout-\" + \"server\"; let t = ctx.duration(n); #{ timeout_server: t ?? 7 } }",
            ),
        ])
        .unwrap();
        for _ in 0..3 {
            engine.begin_run();
            let mut diags = Diagnostics::new();
            let out = run_backend(
                &engine,
                &service_ctx(&[("haproxy.org/timeout-server", "3s")]),
                &mut diags,
            );
            assert_eq!(
                out.maxconn, None,
                "built.rhai's and caught.rhai's are dropped"
            );
            assert_eq!(
                out.timeouts.get(&crate::model::Timeout::Server).copied(),
                Some(3000)
            );
            let msgs: Vec<String> = diags.into_sorted().iter().map(|d| d.to_string()).collect();
            assert_eq!(msgs.len(), 3, "{msgs:?}");
            assert!(
                msgs[0].starts_with("error: scripts/built.rhai (bundled): backend() for Service ns/web: line 4: reads")
                    && msgs[0].contains("reads \"timeout-web\" (ctx.duration) without declaring it"),
                "{msgs:?}"
            );
            assert!(
                msgs[1].starts_with("error: scripts/caught.rhai (bundled): backend() for Service ns/web: reads \"x-web\" (ctx.bool) without declaring it"),
                "{msgs:?}"
            );
            assert!(
                msgs[2].contains("typed.rhai")
                    && msgs[2].contains(
                        "reads \"timeout-server\" through ctx.int, but it is declared as duration"
                    ),
                "{msgs:?}"
            );
        }
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
        let out = run_backend(&engine, &service_ctx(&[]), &mut diags);
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
    fn equal_hook_outcomes_share_their_settings() {
        let engine = PolicyEngine::load(None).unwrap();
        // A context of object `name` of `kind` with one annotation.
        let ctx = |kind: Kind, name: &str, annotation: &str, value: &str| {
            let object = ObjectRef::new(kind, &Key::new("ns", name));
            let annotations = [(annotation.to_string(), value.to_string())];
            HookContext::new(
                object.clone(),
                vec![ValueSource::annotations(
                    object,
                    Arc::new(annotations.into_iter().collect()),
                )],
                BTreeMap::new(),
            )
        };
        let route = |name: &str, allowed: &str| {
            let ctx = ctx(Kind::Ingress, name, "haproxy.org/allow-list", allowed);
            run_route(&engine, &ctx, &mut Diagnostics::new()).settings
        };
        let (a, b, other) = (
            route("a", "10.0.0.0/8"),
            route("b", "10.0.0.0/8"),
            route("c", "10.1.0.0/16"),
        );
        // Different objects, so different runs; equal results, so one `RouteSettings`.
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &other));
        assert_ne!(a, other);
        // Backends alike.
        let backend = |name: &str, balance: &str| {
            let ctx = ctx(Kind::Service, name, "haproxy.org/load-balance", balance);
            run_backend(&engine, &ctx, &mut Diagnostics::new())
        };
        let (a, b, other) = (
            backend("a", "leastconn"),
            backend("b", "leastconn"),
            backend("c", "source"),
        );
        assert!(Arc::ptr_eq(&a, &b));
        assert_ne!(a, other);
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
        let out = run_route(&engine, &ctx, &mut diags);
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
            run_backend(&e, &service_ctx(&[]), &mut diags);
            diags.len()
        });
        // Either refused at compile time or failing at run time; never a value.
        assert!(!matches!(err, Ok(0)));
    }

    #[test]
    fn bad_annotation_is_reported_with_object_and_field() {
        let engine = PolicyEngine::compile(vec![source(
            "t.rhai",
            r#"// Read: timeout-server duration from Service: t.
fn backend(ctx) { let t = ctx.duration("timeout-server"); if t != () { #{ timeout_server: t } } }"#,
        )])
        .unwrap();
        let mut diags = Diagnostics::new();
        let out = run_backend(
            &engine,
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
                r#"// Read: backend-config-snippet snippet from Service: s.
fn backend(ctx) { let s = ctx.snippet("backend-config-snippet"); if s != () { #{ config_snippet: s } } }"#,
            ),
        ])
        .unwrap();
        let annotated = || service_ctx(&[("haproxy.org/backend-config-snippet", "option httplog")]);
        let mut diags = Diagnostics::new();
        let out = run_backend(&engine, &annotated(), &mut diags);
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
        let out = run_backend(&engine, &annotated().with_snippets(policy), &mut diags);
        assert_eq!(out.config_snippet, ["option httplog"]);
    }

    #[test]
    fn the_run_budget_stops_a_run_and_the_next_run_starts_afresh() {
        let engine = PolicyEngine::compile(vec![source(
            "busy.rhai",
            "fn backend(ctx) { let n = 0; for i in 0..2000 { n += i; } #{ check: true } }",
        )])
        .unwrap()
        .with_run_budget(30_000);
        for _ in 0..2 {
            engine.begin_run();
            let mut budget = engine.budget();
            let mut applied = 0;
            let mut stopped = Vec::new();
            for _ in 0..6 {
                let run = engine.run_backend(&service_ctx(&[]), budget);
                budget = run.budget;
                if run.settings.check {
                    applied += 1;
                }
                stopped.extend(run.diagnostics.iter().map(|d| d.to_string()));
            }
            assert!((1..6).contains(&applied), "applied {applied} of 6");
            assert!(
                stopped
                    .iter()
                    .all(|m| m.contains("operation budget is exhausted")),
                "{stopped:?}"
            );
        }
    }

    #[test]
    fn route_hooks_read_the_service_through_ctx_service() {
        let engine = PolicyEngine::load(None).unwrap();
        let ingress = ObjectRef::new(Kind::Ingress, &Key::new("ns", "web"));
        let service = ObjectRef::new(Kind::Service, &Key::new("ns", "canary"));
        let map = |pairs: &[(&str, &str)]| {
            Arc::new(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        let on_ingress = map(&[
            ("haproxy.org/route-acl", "cookie(x) -m found"),
            ("haproxy.org/standalone-backend", "true"),
        ]);
        let ctx = || {
            HookContext::new(
                ingress.clone(),
                vec![ValueSource::annotations(
                    ingress.clone(),
                    on_ingress.clone(),
                )],
                BTreeMap::new(),
            )
        };
        let mut diags = Diagnostics::new();
        let out = run_route(
            &engine,
            &ctx().with_service(ValueSource::annotations(
                service,
                map(&[
                    ("haproxy.org/route-acl", "hdr(X-Canary) -m str yes"),
                    ("haproxy.org/standalone-backend", "false"),
                ]),
            )),
            &mut diags,
        );
        let acl = out.route_acl.map(|c| crate::values::route_acl_text(&c));
        assert_eq!(acl.as_deref(), Some("req.hdr(X-Canary) -m str yes"));
        assert_eq!(
            out.standalone_backend,
            Some(false),
            "the Service comes first"
        );
        let msgs: Vec<_> = diags.iter().map(|d| d.to_string()).collect();
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        assert!(
            msgs[0].contains("Ingress ns/web: annotation haproxy.org/route-acl: ignored"),
            "{msgs:?}"
        );
        // Without a Service (as in other hooks), ctx.service() is (): the Ingress decides
        // standalone-backend and there is no canary.
        let mut diags = Diagnostics::new();
        let out = run_route(&engine, &ctx(), &mut diags);
        assert_eq!(out.route_acl, None);
        assert_eq!(out.standalone_backend, Some(true));
    }
}
