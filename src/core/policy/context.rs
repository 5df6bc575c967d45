//! What a hook reads: the [`HookContext`] of the object it evaluates (plain data), and the
//! `ctx` object a script's call receives, with typed, validating access to it.
//!
//! A hook never sees a raw annotation string. Each accessor parses the value with a parser
//! from [`crate::values`]; a bad value is reported naming the object and the annotation, and
//! the lookup falls through to the next source (as if the bad value were not there). When no
//! source has a valid value, the accessor returns `()`. Through
//! `ctx.fail_closed(consequence)` the first value found decides instead: a bad one is reported
//! with the consequence and the accessor returns `()`, for settings that guard access.
//!
//! A call's `ctx` logs every read it makes ([`ReadKey`], answered by [`ReadValue`]) and every
//! report, relative to the context (which source, or the subject): a hook is a function of
//! what it reads, so another context that answers the same reads gets the same result, and
//! the reports name that context's objects ([`HookContext::answer`], [`HookContext::resolve`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use rhai::{Array, Dynamic, Engine, INT, Map};

use crate::diagnostics::{Diagnostic, Severity, Subject};
use crate::objects::ObjectRef;
use crate::snippets::{self, Origin, SnippetPolicy};
use crate::values::{self, ParseResult, parse_http_check, parse_rewrite, parse_rewrites};

use super::names::{ANNOTATION_PREFIXES, annotation_name};
use super::reads::{CallArgs, Declared};

/// Where settings are read from, in precedence order.
#[derive(Debug, Clone)]
pub struct ValueSource {
    pub object: ObjectRef,
    pub values: Arc<BTreeMap<String, String>>,
    /// Annotations carry a prefix; ConfigMap keys do not.
    pub prefixed: bool,
    /// For a custom resource's settings: the field each came from (`spec.server_timeout`),
    /// by setting name, which messages name instead of a key.
    fields: Option<Arc<BTreeMap<String, String>>>,
    /// The values by name (a key's name is what follows its accepted prefix, or the whole
    /// key without one), in lookup order within a name: made once per source (its clones
    /// share it), as every read of every script looks names up here.
    settings: Arc<[Setting]>,
}

/// A value under a name.
#[derive(Debug)]
struct Setting {
    key: Box<str>,
    /// Where the name starts in the key (after the prefix).
    name_start: usize,
    value: Box<str>,
    /// The order among the keys of one name: on an object, the prefixes most specific first
    /// and the bare name last; in a ConfigMap, the plain key first.
    rank: usize,
}

impl Setting {
    fn name(&self) -> &str {
        &self.key[self.name_start..]
    }
}

impl ValueSource {
    /// An object's annotations: those under an accepted prefix, and those without any prefix
    /// (the bare names the incumbent reads as well).
    pub fn annotations(object: ObjectRef, values: Arc<BTreeMap<String, String>>) -> Self {
        let bare = ANNOTATION_PREFIXES.len();
        let settings = Self::index(&values, |key| match annotation_name(key) {
            Some((i, name)) => Some((i, key.len() - name.len())),
            None if !key.contains('/') => Some((bare, 0)),
            None => None,
        });
        Self {
            object,
            values,
            prefixed: true,
            fields: None,
            settings,
        }
    }

    /// The settings of one of the incumbent's resources (`Backend`, `Defaults`, `Global`):
    /// read like ConfigMap keys, named in messages by their field.
    pub fn resource(object: ObjectRef, resource: &crate::objects::Resource) -> Self {
        let values = resource
            .settings
            .iter()
            .map(|(k, f)| (k.clone(), f.value.clone()))
            .collect();
        let fields = resource
            .settings
            .iter()
            .map(|(k, f)| (k.clone(), f.field.clone()))
            .collect();
        Self {
            fields: Some(Arc::new(fields)),
            ..Self::config_map(object, Arc::new(values))
        }
    }

    /// The controller ConfigMap's keys: plain names, and (as the incumbent strips them here
    /// too) names under an accepted prefix, after the plain one.
    pub fn config_map(object: ObjectRef, values: Arc<BTreeMap<String, String>>) -> Self {
        let settings = Self::index(&values, |key| match annotation_name(key) {
            Some((i, name)) => Some((i + 1, key.len() - name.len())),
            None => Some((0, 0)),
        });
        Self {
            object,
            values,
            prefixed: false,
            fields: None,
            settings,
        }
    }

    /// The keys `place` gives a (rank, name start) for, sorted by name and rank.
    fn index(
        values: &BTreeMap<String, String>,
        place: impl Fn(&str) -> Option<(usize, usize)>,
    ) -> Arc<[Setting]> {
        let mut settings: Vec<Setting> = values
            .iter()
            .filter_map(|(key, value)| {
                let (rank, name_start) = place(key)?;
                Some(Setting {
                    key: key.as_str().into(),
                    name_start,
                    value: value.as_str().into(),
                    rank,
                })
            })
            .collect();
        settings.sort_unstable_by(|a, b| (a.name(), a.rank).cmp(&(b.name(), b.rank)));
        settings.into()
    }

    /// Every value this source holds under `names` (a name and its aliases, in order; each
    /// under every accepted spelling, in rank order), with how to name it in messages.
    /// Values are found by a search by name among the keys, sorted once.
    fn lookup<'s>(&'s self, names: &[String]) -> Vec<(&'s str, String)> {
        if self.settings.is_empty() {
            return Vec::new();
        }
        let what = if self.prefixed { "annotation" } else { "key" };
        let mut hits = Vec::new();
        for name in names {
            let from = self.settings.partition_point(|s| s.name() < name.as_str());
            for s in self.settings[from..]
                .iter()
                .take_while(|s| s.name() == name.as_str())
            {
                let field = self.fields.as_ref().and_then(|f| f.get(s.name()));
                hits.push(match field {
                    Some(field) => (&*s.value, format!("field {field}")),
                    None => (&*s.value, format!("{what} {}", s.key)),
                });
            }
        }
        hits
    }
}

/// What a hook reads about the object it is evaluating: plain data, shared by its clones.
#[derive(Debug, Clone)]
pub struct HookContext {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    subject: ObjectRef,
    sources: Vec<ValueSource>,
    /// Extra read-only facts for the hook, e.g. `host` and `path` for a route.
    facts: BTreeMap<&'static str, String>,
    snippets: SnippetPolicy,
    /// For a route hook: the annotations of the Service the path routes to, which
    /// `ctx.service()` reads.
    service: Option<ValueSource>,
}

/// A context derived from the hook's own: `ctx.service()`, `ctx.without(kind)` or
/// `ctx.fail_closed(consequence)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Derive {
    Service,
    Without(String),
    /// The same sources; a bad value is not skipped but reported with this consequence.
    FailClosed(String),
}

/// One read a hook made, relative to its context.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReadKey {
    /// Every value under `names` (with aliases and prefixes) in the view's sources.
    Lookup {
        view: Vec<Derive>,
        names: Vec<String>,
    },
    /// The same, in the view's sources of one kind only (`ctx.ignore_on`).
    LookupKind {
        view: Vec<Derive>,
        kind: String,
        names: Vec<String>,
    },
    /// `ctx.fact(name)`.
    Fact(String),
    /// The view's subject: `kind`, `namespace` or `name`.
    Subject {
        view: Vec<Derive>,
        part: SubjectPart,
    },
    /// Whether the view exists (`ctx.service()` is `()` without a Service).
    Exists(Vec<Derive>),
    /// Who may write config snippets.
    SnippetPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubjectPart {
    Kind,
    Namespace,
    Name,
}

/// What a read answered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReadValue {
    /// (source index in the view, raw value, how messages name it), in precedence order.
    Found(Vec<(usize, String, String)>),
    Text(Option<String>),
    Flag(bool),
}

/// Whom a report is about, relative to the context it was made in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The view's source at this index.
    Source(usize),
    /// The view's subject.
    Subject,
}

/// A report an accessor made (bad value, `ctx.warn`, ignored setting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub view: Vec<Derive>,
    pub target: Target,
    pub severity: Severity,
    pub field: String,
    pub message: String,
}

/// What one call read and reported, in order.
#[derive(Debug, Default)]
pub struct Log {
    pub reads: Vec<(ReadKey, ReadValue)>,
    pub reports: Vec<Report>,
    /// The first read the script does not declare (see [`super::reads::Declared`]): it
    /// fails the call even when the script catches the error.
    pub undeclared: Option<String>,
}

impl Log {
    /// Whether the call read a fact (a result that holds for other facts only if not).
    pub fn read_facts(&self) -> bool {
        self.reads
            .iter()
            .any(|(k, _)| matches!(k, ReadKey::Fact(_)))
    }
}

/// A context's subject and sources, borrowed, as a chain of [`Derive`] steps sees them.
struct View<'a> {
    subject: &'a ObjectRef,
    sources: &'a [ValueSource],
    /// Kinds whose sources are left out.
    without: Vec<&'a str>,
    service: Option<&'a ValueSource>,
}

impl<'a> View<'a> {
    /// The view `steps` lead to; `None` when one does not exist (no Service).
    fn derive(mut self, steps: &'a [Derive]) -> Option<View<'a>> {
        for step in steps {
            match step {
                Derive::Service => {
                    let service = self.service?;
                    self = View {
                        subject: &service.object,
                        sources: std::slice::from_ref(service),
                        without: Vec::new(),
                        service: None,
                    };
                }
                Derive::Without(kind) => self.without.push(kind),
                // The same sources: only how their values are judged differs.
                Derive::FailClosed(_) => {}
            }
        }
        Some(self)
    }

    /// The view's sources, in precedence order.
    fn sources(&self) -> impl Iterator<Item = &'a ValueSource> + '_ {
        self.sources
            .iter()
            .filter(|s| !self.without.contains(&s.object.kind.as_str()))
    }

    /// Every value under `names` in the view's sources (of `kind` only, if given), in
    /// precedence order: (source index in the view, raw value, how to name it).
    fn found(&self, names: &[String], kind: Option<&str>) -> Vec<(usize, &'a str, String)> {
        let mut out = Vec::new();
        for (i, source) in self.sources().enumerate() {
            if kind.is_some_and(|k| source.object.kind.as_str() != k) {
                continue;
            }
            for (raw, field) in source.lookup(names) {
                out.push((i, raw, field));
            }
        }
        out
    }
}

fn subject_part(subject: &ObjectRef, part: SubjectPart) -> String {
    match part {
        SubjectPart::Kind => subject.kind.as_str().to_string(),
        SubjectPart::Namespace => subject.namespace.clone(),
        SubjectPart::Name => subject.name.clone(),
    }
}

/// Owned copies of [`View::found`]'s answers, for a log.
fn owned(found: &[(usize, &str, String)]) -> Vec<(usize, String, String)> {
    found
        .iter()
        .map(|(i, raw, field)| (*i, raw.to_string(), field.clone()))
        .collect()
}

/// Raw config lines that passed [`crate::snippets`]' checks for where they were written. Only
/// `ctx.snippet(..)` makes one: a script cannot turn a string into a snippet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snippet(pub Vec<String>);

impl HookContext {
    pub fn new(
        subject: ObjectRef,
        sources: Vec<ValueSource>,
        facts: BTreeMap<&'static str, String>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                subject,
                sources,
                facts,
                snippets: SnippetPolicy::default(),
                service: None,
            }),
        }
    }

    /// Sets who may write config snippets (none by default).
    pub fn with_snippets(mut self, policy: SnippetPolicy) -> Self {
        Arc::make_mut(&mut self.inner).snippets = policy;
        self
    }

    /// Gives a route hook the annotations of the Service its path routes to, for
    /// `ctx.service()`.
    pub fn with_service(mut self, service: ValueSource) -> Self {
        Arc::make_mut(&mut self.inner).service = Some(service);
        self
    }

    /// Feeds everything hooks can read through this context but the facts into `state`: the
    /// subject, every source (object, kind of keys, values), the Service's, the snippet
    /// policy; [`Self::hash_facts`] feeds the facts. Contexts that feed the same give every
    /// hook the same result.
    pub fn hash_inputs(&self, state: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        let i = &self.inner;
        i.subject.hash(state);
        i.sources.len().hash(state);
        for source in i.sources.iter().chain(&i.service) {
            source.object.hash(state);
            source.prefixed.hash(state);
            source.values.hash(state);
        }
        i.service.is_some().hash(state);
        i.snippets.hash(state);
    }

    /// Feeds the facts into `state` (see [`Self::hash_inputs`]).
    pub fn hash_facts(&self, state: &mut impl std::hash::Hasher) {
        std::hash::Hash::hash(&self.inner.facts, state);
    }

    pub fn subject(&self) -> &ObjectRef {
        &self.inner.subject
    }

    /// This context's sources and subject, borrowed.
    fn view(&self) -> View<'_> {
        View {
            subject: &self.inner.subject,
            sources: &self.inner.sources,
            without: Vec::new(),
            service: self.inner.service.as_ref(),
        }
    }

    /// What `key` reads in this context: the answer a call would get.
    pub fn answer(&self, key: &ReadKey) -> ReadValue {
        let view = match key {
            ReadKey::Lookup { view, .. }
            | ReadKey::LookupKind { view, .. }
            | ReadKey::Subject { view, .. }
            | ReadKey::Exists(view) => view.as_slice(),
            ReadKey::Fact(_) | ReadKey::SnippetPolicy => &[],
        };
        let Some(v) = self.view().derive(view) else {
            return ReadValue::Flag(false);
        };
        match key {
            ReadKey::Lookup { names, .. } => ReadValue::Found(owned(&v.found(names, None))),
            ReadKey::LookupKind { kind, names, .. } => {
                ReadValue::Found(owned(&v.found(names, Some(kind))))
            }
            ReadKey::Fact(name) => ReadValue::Text(self.inner.facts.get(name.as_str()).cloned()),
            ReadKey::Subject { part, .. } => ReadValue::Text(Some(subject_part(v.subject, *part))),
            ReadKey::Exists(_) => ReadValue::Flag(true),
            ReadKey::SnippetPolicy => ReadValue::Text(Some(format!("{:?}", self.inner.snippets))),
        }
    }

    /// Names a report made in some context (relative to this one) against this context's
    /// objects.
    pub fn resolve(&self, report: &Report) -> Option<Diagnostic> {
        let view = self.view().derive(&report.view)?;
        let object = match report.target {
            Target::Source(i) => view.sources().nth(i)?.object.clone(),
            Target::Subject => view.subject.clone(),
        };
        Some(Diagnostic {
            severity: report.severity,
            subject: Subject::Object(object),
            field: Some(report.field.clone()),
            message: report.message.clone(),
        })
    }
}

/// The `ctx` a script's call receives: the hook's context as `view` sees it, and the log its
/// reads and reports go to, shared with the contexts derived from it.
#[derive(Debug, Clone)]
pub struct Ctx {
    context: HookContext,
    view: Vec<Derive>,
    /// Set by `ctx.fail_closed(consequence)`: the first value found decides, and a bad one is
    /// reported with this consequence instead of being skipped.
    closed: Option<Arc<str>>,
    /// The script being run, for `ctx.warn` messages.
    script: Arc<str>,
    /// What the script declares it reads; every read is checked against it (unchecked when
    /// absent, as in this module's tests).
    declared: Option<Arc<Declared>>,
    log: Arc<Mutex<Log>>,
}

impl Ctx {
    /// The `ctx` of a call of `script` on `context`.
    pub fn new(context: &HookContext, script: &str) -> Self {
        Self {
            context: context.clone(),
            view: Vec::new(),
            closed: None,
            script: script.into(),
            declared: None,
            log: Arc::default(),
        }
    }

    /// Checks every read against what the script declares.
    pub fn checking(mut self, declared: Arc<Declared>) -> Self {
        self.declared = Some(declared);
        self
    }

    /// Refuses a read of `name` through `accessor` the script does not declare (or declares
    /// with another type): an error that fails the call, and is noted in the log so that
    /// catching it does not help.
    fn guard(
        &self,
        name: &Dynamic,
        accessor: &str,
        args: Option<&CallArgs>,
    ) -> Result<(), Box<rhai::EvalAltResult>> {
        let Some(declared) = &self.declared else {
            return Ok(());
        };
        for name in names(name.clone()) {
            if let Some(why) = declared.refuse(&name, accessor, args) {
                let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
                log.undeclared.get_or_insert_with(|| why.clone());
                return Err(why.into());
            }
        }
        Ok(())
    }

    /// What the call read and reported so far (a call that panicked keeps what it logged).
    pub fn take_log(&self) -> Log {
        std::mem::take(&mut *self.log.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn note(&self, read: impl FnOnce() -> (ReadKey, ReadValue)) {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reads
            .push(read());
    }

    /// The context as this `ctx` sees it; only a Service's view can be missing, and a
    /// `ctx` for it is only made when it is there.
    fn here(&self) -> Option<View<'_>> {
        self.context.view().derive(&self.view)
    }

    /// The subject's `part`, as a read.
    fn read_subject(&self, part: SubjectPart) -> String {
        let value = self
            .here()
            .map(|v| subject_part(v.subject, part))
            .unwrap_or_default();
        self.note(|| {
            (
                ReadKey::Subject {
                    view: self.view.clone(),
                    part,
                },
                ReadValue::Text(Some(value.clone())),
            )
        });
        value
    }

    /// Every value under `names` in this view's sources (of `kind` only, if given), in
    /// precedence order: (source index, raw value, how to name it), as a read.
    fn read(&self, names: &[String], kind: Option<&str>) -> Vec<(usize, &str, String)> {
        let found = self
            .here()
            .map(|v| v.found(names, kind))
            .unwrap_or_default();
        self.note(|| {
            let view = self.view.clone();
            let names = names.to_vec();
            let key = match kind {
                Some(kind) => ReadKey::LookupKind {
                    view,
                    kind: kind.to_string(),
                    names,
                },
                None => ReadKey::Lookup { view, names },
            };
            (key, ReadValue::Found(owned(&found)))
        });
        found
    }

    fn record(&self, severity: Severity, target: Target, field: String, message: String) {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reports
            .push(Report {
                view: self.view.clone(),
                target,
                severity,
                field,
                message,
            });
    }

    /// A context derived from this one by `step`, logging to the same place.
    fn derived(&self, step: Derive) -> Ctx {
        let mut view = self.view.clone();
        let closed = match &step {
            Derive::FailClosed(consequence) => Some(consequence.as_str().into()),
            _ => self.closed.clone(),
        };
        view.push(step);
        Ctx {
            context: self.context.clone(),
            view,
            closed,
            script: self.script.clone(),
            declared: self.declared.clone(),
            log: self.log.clone(),
        }
    }

    /// Looks `names` up in each source in precedence order, parsing with `parse`; a bad value
    /// is reported and skipped, as if it were not there. In a fail-closed context the first
    /// object that sets the setting decides: its first valid value (by name, alias and
    /// prefix) counts, and when it has none its bad values are reported with the
    /// consequence and nothing is returned (no other object stands in).
    fn typed<T>(&self, names: &[String], parse: impl Fn(&str) -> ParseResult<T>) -> Option<T> {
        if let Some(consequence) = &self.closed {
            let found = self.read(names, None);
            let first = found.first()?.0;
            let mut bad = Vec::new();
            let mut value = None;
            for (i, raw, field) in found.into_iter().take_while(|(i, ..)| *i == first) {
                match values::check_value_size(raw).and_then(|()| parse(raw)) {
                    Ok(v) => {
                        value = Some(v);
                        break;
                    }
                    Err(e) => bad.push((i, field, e)),
                }
            }
            let outcome = if value.is_some() {
                "setting ignored"
            } else {
                consequence
            };
            for (i, field, e) in bad {
                self.record(
                    Severity::Error,
                    Target::Source(i),
                    field,
                    format!("{e}; {outcome}"),
                );
            }
            return value;
        }
        for (i, raw, field) in self.read(names, None) {
            match values::check_value_size(raw).and_then(|()| parse(raw)) {
                Ok(v) => return Some(v),
                Err(e) => self.record(
                    Severity::Error,
                    Target::Source(i),
                    field,
                    format!("{e}; setting ignored"),
                ),
            }
        }
        None
    }

    /// A raw config snippet, checked for where it was written (ConfigMap or annotation) under
    /// the administrator's policy; refused ones are reported like any bad value.
    fn get_snippet(&mut self, name: Dynamic) -> Dynamic {
        let names = names(name);
        let policy = self.context.inner.snippets;
        // The section comes from the name (`global-`, `frontend-`, `backend-config-snippet`).
        let section = names.first().and_then(|n| snippets::Section::of_name(n));
        self.note(|| {
            (
                ReadKey::SnippetPolicy,
                ReadValue::Text(Some(format!("{policy:?}"))),
            )
        });
        for (i, raw, field) in self.read(&names, None) {
            if let Err(e) = values::check_value_size(raw) {
                self.record(
                    Severity::Error,
                    Target::Source(i),
                    field,
                    format!("{e}; snippet ignored"),
                );
                continue;
            }
            let prefixed = self
                .here()
                .and_then(|v| v.sources().nth(i))
                .is_some_and(|s| s.prefixed);
            let origin = if prefixed {
                Origin::Annotation
            } else {
                Origin::ConfigMap
            };
            let Some(section) = section else {
                self.record(
                    Severity::Error,
                    Target::Source(i),
                    field,
                    "a snippet's name must start with global, frontend or backend, the section it is for; snippet ignored".to_string(),
                );
                continue;
            };
            match snippets::parse(raw, origin, section, policy) {
                Ok(lines) => return Dynamic::from(Snippet(lines)),
                Err(e) => self.record(
                    Severity::Error,
                    Target::Source(i),
                    field,
                    format!("{e}; snippet ignored"),
                ),
            }
        }
        Dynamic::UNIT
    }

    fn has(&mut self, name: Dynamic) -> bool {
        !self.read(&names(name), None).is_empty()
    }

    fn get_bool(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_bool)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    fn get_int(&mut self, name: Dynamic, min: INT, max: INT) -> Dynamic {
        self.typed(&names(name), |v| values::parse_int(v, min, max))
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    fn get_size(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_size)
            .map_or(Dynamic::UNIT, |n| Dynamic::from(n as INT))
    }

    fn get_duration(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_duration)
            .map_or(Dynamic::UNIT, |n| Dynamic::from(n as INT))
    }

    fn get_choice(&mut self, name: Dynamic, allowed: Array) -> Dynamic {
        let allowed: Vec<String> = allowed.into_iter().map(|v| v.to_string()).collect();
        let refs: Vec<&str> = allowed.iter().map(String::as_str).collect();
        self.typed(&names(name), |v| values::parse_enum(v, &refs))
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    fn get_cidrs(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_cidr_list)
            .map_or(Dynamic::UNIT, strings_to_array)
    }

    /// Addresses and blocks, or the one pattern file `patterns/<key>` as a one-element array
    /// (checked against the pattern files in translation, after the hook).
    fn get_access_list(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_access_list)
            .map_or(Dynamic::UNIT, |a| strings_to_array(a.into_strings()))
    }

    fn get_balance(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_balance)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    fn get_header_name(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_header_name)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    fn get_header_value(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_header_value)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    fn get_headers(&mut self, name: Dynamic) -> Dynamic {
        self.headers_for(name, None)
    }

    /// `ctx.headers(name, "request" | "response")`: the sample fetches must be available in
    /// that message.
    fn get_headers_of(
        &mut self,
        name: Dynamic,
        message: &str,
    ) -> Result<Dynamic, Box<rhai::EvalAltResult>> {
        let direction = match message {
            "request" => values::Direction::Request,
            "response" => values::Direction::Response,
            other => {
                return Err(
                    format!("ctx.headers: {other:?} is not \"request\" or \"response\"").into(),
                );
            }
        };
        Ok(self.headers_for(name, Some(direction)))
    }

    fn headers_for(&mut self, name: Dynamic, direction: Option<values::Direction>) -> Dynamic {
        self.typed(&names(name), |v| values::parse_header_lines(v, direction))
            .map_or(Dynamic::UNIT, |pairs| {
                let arr: Array = pairs
                    .into_iter()
                    .map(|(n, v)| Dynamic::from_array(vec![n.into(), v.into()]))
                    .collect();
                Dynamic::from_array(arr)
            })
    }

    fn get_cookie_name(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_cookie_name)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    fn get_host(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_host_header)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    fn get_path(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_path)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    /// A regex as an ACL's `-m reg` compiles it.
    fn get_regex(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_acl_regex)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    /// `REPLACEMENT` or `REGEX REPLACEMENT` → `[regex, replacement]`.
    fn get_rewrite(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), parse_rewrite)
            .map_or(Dynamic::UNIT, |(r, s)| {
                Dynamic::from_array(vec![r.into(), s.into()])
            })
    }

    /// One rule per line → `[[regex, replacement], ...]`.
    fn get_rewrites(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), parse_rewrites)
            .map_or(Dynamic::UNIT, |rules| {
                Dynamic::from_array(
                    rules
                        .into_iter()
                        .map(|(r, s)| Dynamic::from_array(vec![r.into(), s.into()]))
                        .collect(),
                )
            })
    }

    /// `[METHOD] URI [VERSION]` → `#{method, uri}`, with `version` (a string) and `headers`
    /// (an array of `[name, value]`) when the value has them.
    fn get_http_check(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), parse_http_check)
            .map_or(Dynamic::UNIT, |c| {
                let mut map = Map::new();
                map.insert("method".into(), c.method.into());
                map.insert("uri".into(), c.uri.into());
                if let Some(version) = c.version {
                    map.insert("version".into(), version.into());
                }
                if !c.headers.is_empty() {
                    let headers: Array = c
                        .headers
                        .into_iter()
                        .map(|(n, v)| Dynamic::from_array(vec![n.into(), v.into()]))
                        .collect();
                    map.insert("headers".into(), Dynamic::from_array(headers));
                }
                Dynamic::from_map(map)
            })
    }

    /// A Secret reference, `name` or `namespace/name` → `"namespace/name"`; a bare name is in
    /// the namespace of the object the hook is about.
    fn get_secret_ref(&mut self, name: Dynamic) -> Dynamic {
        let default_ns = self.read_subject(SubjectPart::Namespace);
        self.typed(&names(name), values::parse_secret_ref)
            .map_or(Dynamic::UNIT, |(ns, n)| {
                Dynamic::from(format!("{}/{n}", ns.unwrap_or(default_ns)))
            })
    }

    /// `tls-alpn`: ALPN protocol names, as an array of strings.
    fn get_alpn(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_alpn)
            .map_or(Dynamic::UNIT, strings_to_array)
    }

    /// `ssl-default-bind-options`: the checked options, written back as HAProxy takes them.
    fn get_tls_options(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), super::global_keys::parse_tls_bind_options)
            .map_or(Dynamic::UNIT, |o| Dynamic::from(o.to_string()))
    }

    /// `ssl-default-bind-ciphers`: a checked OpenSSL cipher list.
    fn get_ciphers(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), super::global_keys::parse_cipher_list)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    /// `ssl-default-bind-ciphersuites`: TLS 1.3 suites.
    fn get_ciphersuites(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), super::global_keys::parse_ciphersuites)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    /// `cors-allow-origin`: `"*"`, origins joined by `", "` or an anchored regex.
    fn get_cors_origin(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_cors_origin)
            .map_or(Dynamic::UNIT, |o| {
                Dynamic::from(match o {
                    crate::model::CorsOrigin::Any => "*".to_string(),
                    crate::model::CorsOrigin::List(list) => list.join(", "),
                    crate::model::CorsOrigin::Regex(re) => re,
                })
            })
    }

    /// `"*"` or HTTP methods joined by `", "`.
    fn get_http_methods(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_http_methods)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    /// `"*"` or header names joined by `", "`.
    fn get_header_names(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_header_name_list)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    /// `request-redirect`: `host[:port]` or `http(s)://host[:port]`, canonical.
    fn get_redirect(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_redirect_target)
            .map_or(Dynamic::UNIT, |(scheme, host)| {
                Dynamic::from(values::redirect_target_text(scheme.as_deref(), &host))
            })
    }

    /// `request-capture`: the sample expressions, one per line → an array of strings.
    fn get_samples(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_capture_samples)
            .map_or(Dynamic::UNIT, strings_to_array)
    }

    /// `route-acl`: a condition in canonical form (`req.cook(staging) -m found`).
    fn get_acl(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), values::parse_route_acl)
            .map_or(Dynamic::UNIT, |c| Dynamic::from(values::route_acl_text(&c)))
    }

    /// `syslog-server`: one map per line, `#{address, port, length, format, facility, level,
    /// minlevel}` (absent parameters are `()`).
    fn get_syslog_servers(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), super::global_keys::parse_syslog_servers)
            .map_or(Dynamic::UNIT, |servers| {
                let opt = |v: Option<String>| v.map_or(Dynamic::UNIT, Dynamic::from);
                Dynamic::from_array(
                    servers
                        .into_iter()
                        .map(|s| {
                            let mut m = Map::new();
                            m.insert("address".into(), s.address.into());
                            m.insert(
                                "port".into(),
                                s.port
                                    .map_or(Dynamic::UNIT, |p| Dynamic::from(INT::from(p))),
                            );
                            m.insert(
                                "length".into(),
                                s.length
                                    .map_or(Dynamic::UNIT, |n| Dynamic::from(INT::from(n))),
                            );
                            m.insert("format".into(), opt(s.format));
                            m.insert("facility".into(), s.facility.into());
                            m.insert("level".into(), opt(s.level));
                            m.insert("minlevel".into(), opt(s.minlevel));
                            Dynamic::from_map(m)
                        })
                        .collect(),
                )
            })
    }

    /// `log-format`, `log-format-tcp`: a checked log format string.
    fn get_log_format(&mut self, name: Dynamic) -> Dynamic {
        self.typed(&names(name), super::global_keys::parse_log_format)
            .map_or(Dynamic::UNIT, Dynamic::from)
    }

    /// In a route hook, a context over the annotations of the Service the path routes to
    /// (only those: no Ingress, no ConfigMap); `()` in other hooks. Its reports go to the same
    /// place.
    fn service(&mut self) -> Dynamic {
        let exists = self.here().is_some_and(|v| v.service.is_some());
        let service = self.derived(Derive::Service);
        self.note(|| {
            (
                ReadKey::Exists(service.view.clone()),
                ReadValue::Flag(exists),
            )
        });
        if exists {
            Dynamic::from(service)
        } else {
            Dynamic::UNIT
        }
    }

    /// The same context without the sources of one kind (e.g. `"Ingress"`), for settings
    /// that must not come from there.
    fn without(&mut self, kind: &str) -> Ctx {
        self.derived(Derive::Without(kind.to_string()))
    }

    /// The same context, for settings that guard access: the first value found decides, and
    /// a bad one is reported with `consequence` (what happens instead, e.g. "everyone gets
    /// 403 on these routes until it is fixed") rather than skipped. The hook sees `()` and
    /// denies; `ctx.has(name)` tells a bad value from none.
    fn fail_closed(&mut self, consequence: &str) -> Ctx {
        self.derived(Derive::FailClosed(consequence.to_string()))
    }

    /// If an object of `kind` sets `name`, reports it as ignored (with `reason`) on that
    /// object and returns true.
    fn ignore_on(&mut self, kind: &str, name: Dynamic, reason: &str) -> bool {
        let found = self.read(&names(name), Some(kind));
        for (i, _, field) in &found {
            self.record(
                Severity::Warning,
                Target::Source(*i),
                field.clone(),
                format!("ignored: {reason}"),
            );
        }
        !found.is_empty()
    }

    fn warn(&mut self, message: &str) {
        self.record(
            Severity::Warning,
            Target::Subject,
            format!("script {}", self.script),
            message.to_string(),
        );
    }

    fn fact(&mut self, name: &str) -> Dynamic {
        let value = self.context.inner.facts.get(name).cloned();
        self.note(|| {
            (
                ReadKey::Fact(name.to_string()),
                ReadValue::Text(value.clone()),
            )
        });
        value.map_or(Dynamic::UNIT, Dynamic::from)
    }
}

/// An accessor's first argument: one annotation name, or an array of a name and its aliases.
fn names(name: Dynamic) -> Vec<String> {
    if name.is_array() {
        name.into_array()
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.to_string())
            .collect()
    } else {
        vec![name.to_string()]
    }
}

fn strings_to_array(v: Vec<String>) -> Dynamic {
    Dynamic::from_array(v.into_iter().map(Dynamic::from).collect())
}

/// What a checked accessor gives a script.
type Checked = Result<Dynamic, Box<rhai::EvalAltResult>>;

/// Makes `ctx` and its accessors available to scripts. Every accessor that reads a setting
/// checks first that the script declares it ([`Ctx::guard`]).
pub(crate) fn register(engine: &mut Engine) {
    macro_rules! plain {
        ($($name:literal => $method:ident),* $(,)?) => {
            $(engine.register_fn($name, |c: &mut Ctx, name: Dynamic| -> Checked {
                c.guard(&name, $name, None)?;
                Ok(c.$method(name))
            });)*
        };
    }
    engine
        .register_type_with_name::<Ctx>("Context")
        .register_type_with_name::<Snippet>("Snippet")
        .register_get("kind", |c: &mut Ctx| c.read_subject(SubjectPart::Kind))
        .register_get("namespace", |c: &mut Ctx| {
            c.read_subject(SubjectPart::Namespace)
        })
        .register_get("name", |c: &mut Ctx| c.read_subject(SubjectPart::Name))
        .register_fn("fact", Ctx::fact)
        .register_fn(
            "has",
            |c: &mut Ctx, name: Dynamic| -> Result<bool, Box<rhai::EvalAltResult>> {
                c.guard(&name, "has", None)?;
                Ok(c.has(name))
            },
        )
        .register_fn(
            "int",
            |c: &mut Ctx, name: Dynamic, min: INT, max: INT| -> Checked {
                c.guard(&name, "int", Some(&CallArgs::Range(min, max)))?;
                Ok(c.get_int(name, min, max))
            },
        )
        .register_fn(
            "choice",
            |c: &mut Ctx, name: Dynamic, allowed: Array| -> Checked {
                let words = allowed.iter().map(ToString::to_string).collect();
                c.guard(&name, "choice", Some(&CallArgs::Words(words)))?;
                Ok(c.get_choice(name, allowed))
            },
        )
        .register_fn(
            "headers",
            |c: &mut Ctx, name: Dynamic, message: &str| -> Checked {
                c.guard(&name, "headers", None)?;
                c.get_headers_of(name, message)
            },
        )
        .register_fn(
            "ignore_on",
            |c: &mut Ctx,
             kind: &str,
             name: Dynamic,
             reason: &str|
             -> Result<bool, Box<rhai::EvalAltResult>> {
                c.guard(&name, "ignore_on", None)?;
                Ok(c.ignore_on(kind, name, reason))
            },
        )
        .register_fn("warn", Ctx::warn)
        .register_fn("without", Ctx::without)
        .register_fn("fail_closed", Ctx::fail_closed)
        .register_fn("service", Ctx::service);
    plain! {
        "bool" => get_bool,
        "size" => get_size,
        "duration" => get_duration,
        "cidrs" => get_cidrs,
        "access_list" => get_access_list,
        "balance" => get_balance,
        "header_name" => get_header_name,
        "header_value" => get_header_value,
        "headers" => get_headers,
        "host" => get_host,
        "cookie_name" => get_cookie_name,
        "path" => get_path,
        "regex" => get_regex,
        "rewrite" => get_rewrite,
        "rewrites" => get_rewrites,
        "http_check" => get_http_check,
        "secret_ref" => get_secret_ref,
        "alpn" => get_alpn,
        "tls_options" => get_tls_options,
        "ciphers" => get_ciphers,
        "ciphersuites" => get_ciphersuites,
        "cors_origin" => get_cors_origin,
        "http_methods" => get_http_methods,
        "header_names" => get_header_names,
        "snippet" => get_snippet,
        "redirect" => get_redirect,
        "samples" => get_samples,
        "acl" => get_acl,
        "syslog_servers" => get_syslog_servers,
        "log_format" => get_log_format,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{Key, Kind};

    /// Names in order, then prefixes most specific first and the bare name last, whether the
    /// keys are few or many; keys that only look alike are not found.
    #[test]
    fn lookups_keep_name_then_prefix_order_with_few_or_many_keys() {
        // Only keys under an accepted prefix are found, by the name after it exactly.
        let wanted = [
            ("haproxy.org/timeout-server", "2s"),
            ("portcullis.io/timeout-server", "1s"),
            ("ingress.kubernetes.io/server-timeout", "3s"),
            ("haproxy.org/server-timeout", "4s"),
            ("nginx.ingress.kubernetes.io/timeout-server", "no"),
            ("portcullis.io/timeout-server-x", "no"),
            ("timeout-server", "5s"),
            ("haproxy.com/timeout-server", "6s"),
            ("example.com/timeout-server", "no"),
        ];
        let names = ["timeout-server".to_string(), "server-timeout".to_string()];
        for filler in [0, 100] {
            let mut values: BTreeMap<String, String> = wanted
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            for i in 0..filler {
                for p in ["a/", "haproxy.org/other-", "portcullis.io/x", "zz/"] {
                    values.insert(format!("{p}{i}"), "no".to_string());
                }
            }
            let object = ObjectRef::new(Kind::Ingress, &Key::new("ns", "web"));
            let source = ValueSource::annotations(object, Arc::new(values));
            let found: Vec<(&str, String)> = source.lookup(&names);
            assert_eq!(
                found,
                [
                    ("1s", "annotation portcullis.io/timeout-server".to_string()),
                    ("2s", "annotation haproxy.org/timeout-server".to_string()),
                    ("6s", "annotation haproxy.com/timeout-server".to_string()),
                    ("5s", "annotation timeout-server".to_string()),
                    ("4s", "annotation haproxy.org/server-timeout".to_string()),
                    (
                        "3s",
                        "annotation ingress.kubernetes.io/server-timeout".to_string()
                    ),
                ],
                "{filler} filler keys"
            );
        }
    }

    /// In the ConfigMap the plain key comes first, then the same name under each accepted
    /// prefix (the incumbent strips them there too); other keys are not found.
    #[test]
    fn config_map_keys_are_read_plain_then_prefixed() {
        let values: BTreeMap<String, String> = [
            ("haproxy.com/timeout-server", "3s"),
            ("haproxy.org/timeout-server", "2s"),
            ("timeout-server", "1s"),
            ("example.com/timeout-server", "no"),
            ("timeout-server-x", "no"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let object = ObjectRef::new(Kind::ConfigMap, &Key::new("ns", "cfg"));
        let source = ValueSource::config_map(object, Arc::new(values));
        assert_eq!(
            source.lookup(&["timeout-server".to_string()]),
            [
                ("1s", "key timeout-server".to_string()),
                ("2s", "key haproxy.org/timeout-server".to_string()),
                ("3s", "key haproxy.com/timeout-server".to_string()),
            ]
        );
    }

    /// Through `fail_closed`, the first value found decides: a bad one is reported with the
    /// consequence and gives `()`, where the plain context skips it for the next source.
    #[test]
    fn a_fail_closed_view_does_not_skip_a_bad_value() {
        let ingress = ValueSource::annotations(
            ObjectRef::new(Kind::Ingress, &Key::new("ns", "web")),
            Arc::new(BTreeMap::from([(
                "haproxy.org/allow-list".to_string(),
                "banana".to_string(),
            )])),
        );
        let config = ValueSource::config_map(
            ObjectRef::new(Kind::ConfigMap, &Key::new("ns", "cfg")),
            Arc::new(BTreeMap::from([(
                "allow-list".to_string(),
                "0.0.0.0/0".to_string(),
            )])),
        );
        let context = HookContext::new(
            ingress.object.clone(),
            vec![ingress, config],
            BTreeMap::new(),
        );
        let mut ctx = Ctx::new(&context, "t.rhai");
        let name = || Dynamic::from("allow-list");
        assert!(
            !ctx.get_cidrs(name()).is_unit(),
            "the plain view falls through"
        );
        let plain = reported(&ctx, &context);
        assert!(plain[0].message.ends_with("; setting ignored"), "{plain:?}");
        let mut closed = ctx.fail_closed("everyone gets 403");
        assert!(closed.get_cidrs(name()).is_unit());
        assert!(closed.has(name()));
        let found = reported(&ctx, &context);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].severity, Severity::Error);
        assert_eq!(
            found[0].field.as_deref(),
            Some("annotation haproxy.org/allow-list")
        );
        assert!(
            found[0].message.ends_with("; everyone gets 403"),
            "{found:?}"
        );
        // A good first value is taken as usual.
        let mut only_config = ctx.without("Ingress").fail_closed("everyone gets 403");
        assert!(!only_config.get_cidrs(name()).is_unit());
        // A bad value under one prefix falls through to a good one on the same object.
        let ingress = ValueSource::annotations(
            ObjectRef::new(Kind::Ingress, &Key::new("ns", "web")),
            Arc::new(BTreeMap::from([
                ("portcullis.io/allow-list".to_string(), "banana".to_string()),
                (
                    "haproxy.org/whitelist".to_string(),
                    "10.0.0.0/8".to_string(),
                ),
            ])),
        );
        let context = HookContext::new(ingress.object.clone(), vec![ingress], BTreeMap::new());
        let mut ctx = Ctx::new(&context, "t.rhai").fail_closed("everyone gets 403");
        let allow = ctx.get_cidrs(Dynamic::from_array(vec![
            "allow-list".into(),
            "whitelist".into(),
        ]));
        assert_eq!(allow.into_array().unwrap()[0].to_string(), "10.0.0.0/8");
        let found = reported(&ctx, &context);
        assert!(found[0].message.ends_with("; setting ignored"), "{found:?}");
    }

    /// The reports `ctx`'s call made so far, named against `context`'s objects.
    fn reported(ctx: &Ctx, context: &HookContext) -> Vec<Diagnostic> {
        ctx.take_log()
            .reports
            .iter()
            .filter_map(|r| context.resolve(r))
            .collect()
    }

    /// Every read a call logs, through whatever derived `ctx`, is answered the same by the
    /// context ([`HookContext::answer`]), and its reports name the objects of the view they
    /// were made in.
    #[test]
    fn logged_reads_are_answered_alike_and_reports_resolve_in_their_view() {
        let source = |kind: Kind, name: &str, pairs: &[(&str, &str)]| {
            let object = ObjectRef::new(kind, &Key::new("ns", name));
            let values: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            match kind {
                Kind::ConfigMap => ValueSource::config_map(object, Arc::new(values)),
                _ => ValueSource::annotations(object, Arc::new(values)),
            }
        };
        let ingress = source(
            Kind::Ingress,
            "web",
            &[("haproxy.org/timeout-server", "1s")],
        );
        let service = source(
            Kind::Service,
            "svc",
            &[("portcullis.io/timeout-server", "2x")],
        );
        let config = source(Kind::ConfigMap, "cfg", &[("timeout-server", "3s")]);
        let with_service = HookContext::new(
            ingress.object.clone(),
            vec![ingress.clone(), service.clone(), config.clone()],
            BTreeMap::from([("host", "a.example".to_string())]),
        )
        .with_service(service);
        let without_service = HookContext::new(
            ingress.object.clone(),
            vec![ingress, config],
            BTreeMap::new(),
        );
        let without = |kind: &str| Derive::Without(kind.to_string());
        let views = [
            vec![],
            vec![without("Ingress")],
            vec![without("Ingress"), without("ConfigMap")],
            vec![Derive::Service],
            vec![Derive::Service, without("Service")],
            vec![without("Ingress"), Derive::Service],
            vec![Derive::FailClosed("denied".to_string()), Derive::Service],
            vec![without("Ingress"), Derive::FailClosed("denied".to_string())],
        ];
        let name = || Dynamic::from("timeout-server");
        for context in [&with_service, &without_service] {
            for view in &views {
                let mut ctx = Ctx::new(context, "t.rhai");
                for step in view {
                    if *step == Derive::Service {
                        assert!(!ctx.service().is_unit() || context.inner.service.is_none());
                    }
                    ctx = ctx.derived(step.clone());
                }
                if ctx.here().is_none() {
                    continue;
                }
                let _ = ctx.get_duration(name());
                ctx.ignore_on("ConfigMap", name(), "not here");
                ctx.read_subject(SubjectPart::Name);
                ctx.read_subject(SubjectPart::Kind);
                let _ = ctx.fact("host");
                ctx.warn("checked");
                let log = ctx.take_log();
                assert!(log.reads.len() >= 5, "{view:?}");
                for (key, value) in &log.reads {
                    assert_eq!(&context.answer(key), value, "{view:?} {key:?}");
                }
                let here = ctx.here().unwrap();
                for report in &log.reports {
                    let object = match report.target {
                        Target::Source(i) => here.sources().nth(i).unwrap().object.clone(),
                        Target::Subject => here.subject.clone(),
                    };
                    let resolved = context.resolve(report).unwrap();
                    assert_eq!(resolved.subject, Subject::Object(object), "{view:?}");
                }
                assert!(log.reports.iter().any(|r| r.target == Target::Subject));
            }
        }
        // Without a Service, `ctx.service()` is `()` and that is what is read.
        let mut ctx = Ctx::new(&without_service, "t.rhai");
        assert!(ctx.service().is_unit());
        let (key, value) = ctx.take_log().reads.pop().unwrap();
        assert_eq!(value, ReadValue::Flag(false));
        assert_eq!(without_service.answer(&key), value);
    }
}
