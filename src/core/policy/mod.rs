//! The policy engine: Rhai scripts that decide what annotations mean.
//!
//! Scripts are compiled once. Each may define any of the hook functions `global(ctx)`,
//! `backend(ctx)` and `route(ctx)`; each returns a map of settings (or nothing). Scripts run in
//! name order and later keys override earlier ones. A script that fails at run time affects
//! only the object it was evaluating: its result for that object is dropped and reported.

mod bundled;
pub mod context;
pub mod global_keys;
pub mod memo;
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
/// Operations all hook calls of one pipeline run may perform together. Counting operations,
/// not time, keeps the result the same on every replica however busy its machine is.
pub const MAX_OPERATIONS_PER_RUN: u64 = 200_000_000;
/// Wall-clock cap of one hook call: a safety net for work that operations do not count well
/// (a huge string built in few steps). Far above what any sane hook needs (microseconds), so
/// only an already-broken script can hit it, the one case where replicas may then differ.
pub const MAX_CALL_TIME: std::time::Duration = std::time::Duration::from_secs(1);

thread_local! {
    /// When the hook call running on this thread started, and how many operations it has
    /// used; read by the engine's progress callback. A pipeline run is one thread, besides
    /// the work its workers do ahead (`PolicyEngine::with_whole_budget`).
    static CALL: std::cell::Cell<(Option<std::time::Instant>, u64)> =
        const { std::cell::Cell::new((None, 0)) };
    /// Operations used by the pipeline run on this thread so far, and its budget.
    static RUN_OPERATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static RUN_BUDGET: std::cell::Cell<u64> = const { std::cell::Cell::new(MAX_OPERATIONS_PER_RUN) };
    /// Whether a hook call on this thread was stopped (budget, clock) since it was reset.
    static STOPPED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// How many hook calls on this thread were stopped, ever (see [`PolicyEngine::account`]).
    static STOPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
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
/// `// Risk: low`. Both are required, so that an operator reviewing a site layer sees at a
/// glance what each script can touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    pub scope: Vec<Hook>,
    pub risk: Risk,
}

impl Declaration {
    /// Reads the declaration from the script's leading comment lines.
    fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            // An empty site file switches the bundled script of that name off.
            return Ok(Self {
                scope: Vec::new(),
                risk: Risk::Low,
            });
        }
        let mut scope = None;
        let mut risk = None;
        for line in text.lines().map(str::trim) {
            if line.is_empty() {
                continue;
            }
            let Some(comment) = line.strip_prefix("//") else {
                break;
            };
            let comment = comment.trim();
            let Some((key, value)) = comment.split_once(':') else {
                continue;
            };
            match key.trim().to_ascii_lowercase().as_str() {
                "scope" => {
                    let mut hooks = Vec::new();
                    for word in value.split(',').map(str::trim) {
                        let hook = Hook::ALL
                            .into_iter()
                            .find(|h| h.function_name() == word)
                            .ok_or_else(|| {
                                format!("Scope: {word:?} is not one of global, backend, route")
                            })?;
                        hooks.push(hook);
                    }
                    hooks.sort();
                    hooks.dedup();
                    scope = Some(hooks);
                }
                "risk" => {
                    risk = Some(Risk::parse(value).ok_or_else(|| {
                        format!(
                            "Risk: {:?} is not one of low, medium, high, critical",
                            value.trim()
                        )
                    })?);
                }
                _ => {}
            }
        }
        match (scope, risk) {
            (Some(scope), Some(risk)) => Ok(Self { scope, risk }),
            _ => Err(
                "the header must declare `// Scope: <global|backend|route>[, ...]` and `// Risk: <low|medium|high|critical>`"
                    .to_string(),
            ),
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
    /// Names the script's results in the memo: a hash of its name and text, so that an
    /// unchanged script keeps its results across a reload of the script set.
    memo_id: u64,
}

/// The compiled, effective set of scripts and the sandboxed engine that runs them.
#[derive(Debug)]
pub struct PolicyEngine {
    engine: Engine,
    scripts: Vec<Script>,
    run_budget: u64,
    memo: std::sync::Arc<memo::Memo>,
    /// Shared with the engine this one replaced (see [`PolicyEngine::keep_memo_of`]): its
    /// keys name the scripts of the hook, so the runs of unchanged hooks stay valid.
    whole: std::sync::Arc<memo::WholeRuns>,
    /// By hook (`hook as usize`, the order of [`Hook::ALL`]), the fingerprint of the scripts
    /// that implement it (names and texts, in evaluation order): part of every whole run's key.
    hook_scripts: [u128; 3],
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
            let declaration = match Declaration::parse(&source.text) {
                Ok(d) => d,
                Err(message) => {
                    errors.push(PolicyError::ScriptCompile {
                        file: display,
                        line: 1,
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
            Ok(Self {
                engine,
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

    /// The effective script files, in evaluation order.
    pub fn scripts(&self) -> impl Iterator<Item = &SourceFile> {
        self.scripts.iter().map(|s| &s.source)
    }

    /// Starts a pipeline run's operation budget (on this thread), and drops the remembered
    /// results the previous run did not use.
    pub fn begin_run(&self) {
        RUN_OPERATIONS.with(|r| r.set(0));
        RUN_BUDGET.with(|b| b.set(self.run_budget));
        self.memo.begin_run();
        self.whole.begin_run();
    }

    /// Starts a pipeline run that takes parts of the last one instead of translating them
    /// again (see `translate::parts`): the run's operation budget starts afresh, and every
    /// remembered result is kept, since the parts taken stand for the hook calls they made.
    pub fn begin_partial_run(&self) {
        RUN_OPERATIONS.with(|r| r.set(0));
        RUN_BUDGET.with(|b| b.set(self.run_budget));
    }

    /// Runs `work` (one item done ahead, see [`crate::parallel`]) with the whole run budget,
    /// which the run charges again when it takes the result; this thread's run account is
    /// as it was afterwards.
    pub fn with_whole_budget<T>(&self, work: impl FnOnce() -> T) -> T {
        let saved = (
            RUN_OPERATIONS.with(|r| r.replace(0)),
            RUN_BUDGET.with(|b| b.replace(self.run_budget)),
        );
        let out = work();
        RUN_OPERATIONS.with(|r| r.set(saved.0));
        RUN_BUDGET.with(|b| b.set(saved.1));
        out
    }

    /// The hook work of the run on this thread so far.
    pub fn account(&self) -> RunAccount {
        RunAccount {
            operations: RUN_OPERATIONS.with(std::cell::Cell::get),
            stops: STOPS.with(std::cell::Cell::get),
        }
    }

    /// Charges the operations of hook calls a kept translation part stands for, as if they
    /// ran; false, and nothing charged, when they would exhaust the run's budget (then the
    /// part is translated again, and its scripts stop where any replica's stop).
    pub fn charge(&self, operations: u64) -> bool {
        let spent = RUN_OPERATIONS.with(std::cell::Cell::get);
        if spent.saturating_add(operations) > self.run_budget {
            return false;
        }
        RUN_OPERATIONS.with(|r| r.set(spent + operations));
        true
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

    pub fn run_global(&self, ctx: &HookContext, diags: &mut Diagnostics) -> GlobalSettings {
        let mut out = GlobalSettings::default();
        self.run(Hook::Global, ctx, diags, |m| {
            settings::apply_global(m, &mut out)
        });
        out
    }

    /// Backend settings, shared with the equal settings of other backends.
    pub fn run_backend(
        &self,
        ctx: &HookContext,
        diags: &mut Diagnostics,
    ) -> std::sync::Arc<BackendSettings> {
        self.run_whole(Hook::Backend, ctx, diags, |diags| {
            let mut out = BackendSettings::default();
            self.run(Hook::Backend, ctx, diags, |m| {
                settings::apply_backend(m, &mut out)
            });
            std::sync::Arc::new(out)
        })
    }

    pub fn run_route(&self, ctx: &HookContext, diags: &mut Diagnostics) -> RouteOutcome {
        self.run_whole(Hook::Route, ctx, diags, |diags| {
            let mut out = RouteOutcome::default();
            self.run(Hook::Route, ctx, diags, |m| {
                settings::apply_route(m, &mut out)
            });
            out
        })
    }

    /// Runs every script of `hook` (`compute`), or replays the run remembered for a context
    /// with the same inputs. Its operations are charged again, unless they would exhaust the
    /// run's budget (then the scripts run, and stop where any replica stops). A run in which
    /// a call was stopped (budget, clock) is not remembered.
    fn run_whole<T: Clone + PartialEq + Send + Sync + 'static>(
        &self,
        hook: Hook,
        ctx: &HookContext,
        diags: &mut Diagnostics,
        compute: impl FnOnce(&mut Diagnostics) -> T,
    ) -> T {
        let keys = self.whole.keys(ctx, self.hook_scripts[hook as usize]);
        let spent = RUN_OPERATIONS.with(std::cell::Cell::get);
        if let Some(done) = self
            .whole
            .find(hook, keys)
            .filter(|d| spent.saturating_add(d.operations) <= self.run_budget)
        {
            if let Some(value) = done.value.downcast_ref::<T>() {
                RUN_OPERATIONS.with(|r| r.set(spent + done.operations));
                for d in done.diagnostics {
                    diags.push(d);
                }
                return value.clone();
            }
        }
        STOPPED.with(|s| s.set(false));
        ctx.forget_facts_read();
        let mut own = Diagnostics::new();
        let value = compute(&mut own);
        let operations = RUN_OPERATIONS
            .with(std::cell::Cell::get)
            .saturating_sub(spent);
        let reports: Vec<Diagnostic> = own.iter().cloned().collect();
        diags.extend(own);
        if STOPPED.with(std::cell::Cell::get) {
            return value;
        }
        let shared = self.whole.shared(hook, value.clone());
        // The remembered equal value, whose shared parts (`Arc`s) the caller then shares too:
        // most routes come out with the same settings.
        let value = shared.downcast_ref::<T>().cloned().unwrap_or(value);
        let facts_free = !ctx.facts_read();
        self.whole
            .remember(hook, keys, facts_free, shared, reports, operations);
        value
    }

    fn run(
        &self,
        hook: Hook,
        ctx: &HookContext,
        diags: &mut Diagnostics,
        mut apply: impl FnMut(&Map) -> Vec<settings::KeyError>,
    ) {
        // Held across the scripts that replay; let go before one runs (and is remembered).
        let mut reader = None;
        for script in self.scripts.iter().filter(|s| s.hooks.contains(&hook)) {
            // Remembered for a context that reads the same: replayed, with the operations the
            // call used charged again, unless they would exhaust the run's budget (then the
            // script runs and stops where any replica stops).
            let spent = RUN_OPERATIONS.with(std::cell::Cell::get);
            let replayed = reader.get_or_insert_with(|| self.memo.reader()).find(
                script.memo_id,
                hook,
                |key| ctx.replay(key),
                |outcome| {
                    if spent.saturating_add(outcome.operations) > self.run_budget {
                        return false;
                    }
                    RUN_OPERATIONS.with(|r| r.set(spent + outcome.operations));
                    for report in &outcome.reports {
                        if let Some(d) = ctx.resolve(report) {
                            diags.push(d);
                        }
                    }
                    self.apply_result(hook, ctx, script, Ok(&outcome.value), diags, &mut apply);
                    true
                },
            );
            if replayed == Some(true) {
                continue;
            }
            reader = None;
            // For `ctx.warn`: a replayed call's reports already name their script.
            ctx.set_script(&script.display);
            CALL.with(|c| c.set((Some(std::time::Instant::now()), 0)));
            ctx.begin_trace();
            // A panic inside the engine or an accessor must only cost this object its settings.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.engine.call_fn_with_options::<Dynamic>(
                    CallFnOptions::new().eval_ast(false).rewind_scope(true),
                    &mut Scope::new(),
                    &script.ast,
                    hook.function_name(),
                    (ctx.clone(),),
                )
            }));
            let trace = ctx.end_trace();
            let used = CALL.with(|c| c.replace((None, 0)).1);
            RUN_OPERATIONS.with(|r| r.set(r.get().saturating_add(used)));
            let result = match result {
                Ok(r) => r,
                Err(_) => Err(Box::new(rhai::EvalAltResult::ErrorRuntime(
                    "the script panicked".into(),
                    rhai::Position::NONE,
                ))),
            };
            // Only completed calls are remembered: a stopped or failed one depends on the
            // budget or the clock, or is worth running again.
            if let (Ok(value), Some(trace)) = (&result, trace) {
                self.memo.remember(
                    script.memo_id,
                    hook,
                    trace.reads,
                    memo::Outcome {
                        value: value.clone(),
                        reports: trace.reports,
                        operations: used,
                    },
                );
            }
            for d in ctx.take_diagnostics() {
                diags.push(d);
            }
            self.apply_result(
                hook,
                ctx,
                script,
                result.as_ref().map_err(|e| &**e),
                diags,
                &mut apply,
            );
        }
    }

    /// Applies one hook call's result (a settings map, nothing, or an error) to the settings.
    fn apply_result(
        &self,
        hook: Hook,
        ctx: &HookContext,
        script: &Script,
        result: Result<&Dynamic, &rhai::EvalAltResult>,
        diags: &mut Diagnostics,
        apply: &mut impl FnMut(&Map) -> Vec<settings::KeyError>,
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
                    for (key, message) in apply(&map) {
                        diags.push(script_error(format!("setting {key}: {message}")));
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
                    other => other.to_string(),
                };
                diags.push(script_error(format!(
                    "line {line}: {reason}; this script's settings are not applied to this object"
                )));
            }
        }
    }
}

/// The hook work of a pipeline run up to a point: operations charged, and calls stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAccount {
    pub operations: u64,
    pub stops: u64,
}

impl RunAccount {
    /// The operations used since `earlier`, or `None` when a call was stopped since (its
    /// result depends on the budget or the clock, so it must not be kept).
    pub fn since(self, earlier: RunAccount) -> Option<u64> {
        (self.stops == earlier.stops).then(|| self.operations.saturating_sub(earlier.operations))
    }
}

/// Stops a hook call past the run's operation budget or the wall-clock cap (the per-call
/// operation limit is the engine's own).
fn progress(operations: u64) -> Option<Dynamic> {
    let (started, _) = CALL.with(|c| {
        let (started, _) = c.get();
        c.set((started, operations));
        c.get()
    });
    let budget = RUN_BUDGET.with(std::cell::Cell::get);
    if RUN_OPERATIONS
        .with(std::cell::Cell::get)
        .saturating_add(operations)
        > budget
    {
        STOPPED.with(|s| s.set(true));
        STOPS.with(|s| s.set(s.get() + 1));
        return Some("the pipeline run's operation budget is exhausted".into());
    }
    if operations.is_multiple_of(1024) && started.is_some_and(|s| s.elapsed() > MAX_CALL_TIME) {
        STOPPED.with(|s| s.set(true));
        STOPS.with(|s| s.set(s.get() + 1));
        return Some(format!("the call ran longer than {}s", MAX_CALL_TIME.as_secs()).into());
    }
    None
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
        .on_progress(progress)
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

    /// A hook that reads facts, the subject, a derived context and warns: remembered results
    /// follow each of those reads, and reports name the object at hand.
    #[test]
    fn remembered_results_follow_every_read() {
        let engine = PolicyEngine::compile(vec![source(
            "reads.rhai",
            r#"
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
            let out = engine.run_backend(&ctx, &mut diags);
            let diags: Vec<String> = diags
                .into_sorted()
                .iter()
                .map(ToString::to_string)
                .collect();
            (out.timeouts.get("server").copied(), diags)
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
            r#"
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
            let out = engine.run_backend(&ctx, &mut Diagnostics::new());
            let whole = engine.remembered() - engine.memo_len();
            (out.timeouts.get("server").copied(), whole)
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
            e.run_route(&route_ctx, &mut Diagnostics::new())
                .settings
                .request_headers[0]
                .1
                .clone()
        };
        let maxconn = |e: &PolicyEngine| {
            e.run_backend(&service_ctx(&[]), &mut Diagnostics::new())
                .maxconn
        };
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

    #[test]
    fn work_done_ahead_has_the_whole_budget_and_leaves_the_account_as_it_was() {
        let engine = PolicyEngine::compile(vec![]).unwrap().with_run_budget(1000);
        engine.begin_run();
        assert!(engine.charge(300));
        let inside = engine.with_whole_budget(|| {
            let fresh = engine.account().operations;
            (fresh, engine.charge(900), engine.charge(200))
        });
        assert_eq!(inside, (0, true, false));
        assert_eq!(engine.account().operations, 300);
        assert!(!engine.charge(800));
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
            engine.run_route(&ctx, &mut Diagnostics::new()).settings
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
            engine.run_backend(&ctx, &mut Diagnostics::new())
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
            let mut applied = 0;
            let mut stopped = Vec::new();
            for _ in 0..6 {
                let mut diags = Diagnostics::new();
                if engine.run_backend(&service_ctx(&[]), &mut diags).check {
                    applied += 1;
                }
                stopped.extend(diags.iter().map(|d| d.to_string()));
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
        let out = engine.run_route(
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
        let out = engine.run_route(&ctx(), &mut diags);
        assert_eq!(out.route_acl, None);
        assert_eq!(out.standalone_backend, Some(true));
    }

    #[test]
    fn a_call_past_the_wall_clock_cap_is_stopped() {
        CALL.with(|c| {
            c.set((
                Some(
                    std::time::Instant::now()
                        - MAX_CALL_TIME
                        - std::time::Duration::from_millis(10),
                ),
                0,
            ));
        });
        RUN_OPERATIONS.with(|r| r.set(0));
        assert!(progress(1023).is_none(), "checked every 1024 operations");
        let stop = progress(2048).map(|d| d.to_string()).unwrap_or_default();
        assert!(stop.contains("longer than"), "{stop}");
        CALL.with(|c| c.set((None, 0)));
    }
}
