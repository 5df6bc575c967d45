//! Hook results remembered by what the hook read.
//!
//! A hook is a pure function of what it reads through `ctx` (the engine has no clock, no
//! randomness, no I/O). A call logs every read with its answer (see [`super::context`]): the
//! annotations found for a name (raw values, where), a fact, the subject's name, whether a
//! Service is there. Those reads, in order, lead to the result. The next call of the same
//! script and hook replays the reads against its own context: if every answer is the same, so
//! is the result, and the script does not run. The reads form a tree per script and hook
//! (each answer decides the next read), so finding a result costs the reads, not the script.
//!
//! This makes a pipeline run incremental: an object whose inputs did not change costs a few
//! lookups per script, and objects with the same relevant annotations (most have none) share
//! results. Reports (bad values, `ctx.warn`) are kept relative to the context (which source,
//! or the subject) and named against the object at hand when replayed. Results are dropped
//! when a run no longer uses them; a new script set starts a new memo.
//!
//! Both memos are layers: [`Calls`] stands in for the calls of one hook run, and
//! [`WholeRuns::run`] for a whole hook run; the hook-running code underneath (in the parent
//! module) makes its calls the same way whether or not they are found here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rhai::Dynamic;

use crate::diagnostics::{Diagnostic, Diagnostics};

use super::Hook;
use super::budget::Budget;
use super::context::{HookContext, Log, ReadKey, ReadValue, Report};

/// A remembered call: its value (a settings map or unit), its reports, and the operations it
/// used (charged again when replayed, so the run budget stops every replica at the same
/// object whether or not its memo is warm).
#[derive(Debug)]
pub struct Outcome {
    pub value: Dynamic,
    pub reports: Vec<Report>,
    pub operations: u64,
}

/// The answers a read led to, each to the rest of its tree. A find hashes every answer it
/// replays (about 1.5 million at 10 000 Ingresses): foldhash (seeded per process, as the
/// answers are the cluster's annotations) costs a fraction of the standard SipHash.
type Answers = HashMap<ReadValue, Node, foldhash::fast::RandomState>;

enum Node {
    Read {
        key: ReadKey,
        next: Answers,
    },
    Leaf {
        outcome: Arc<Outcome>,
        /// The last run that used it; set under the read lock, by concurrent finds.
        run: AtomicU64,
    },
}

/// Past this many remembered results the memo starts over (a safety bound; a cluster of
/// 10 000 Ingresses with the bundled scripts needs a few hundred).
const MAX_LEAVES: usize = 1_000_000;

#[derive(Default)]
struct State {
    run: u64,
    leaves: usize,
    roots: HashMap<(u64, Hook), Node, foldhash::fast::RandomState>,
}

/// The memo of one compiled script set. Finds share it (the workers of a cold run look up
/// at once); only remembering writes.
#[derive(Default)]
pub struct Memo {
    state: RwLock<State>,
    /// Calls to remember that found the tree locked (another worker finding in it): the next
    /// call that gets the lock adds them, so no worker waits for another's lookups.
    pending: Mutex<Vec<Entry>>,
}

/// A call to remember: what `script`'s `hook` read, and its outcome.
struct Entry {
    script: u64,
    hook: Hook,
    trace: Vec<(ReadKey, ReadValue)>,
    outcome: Outcome,
}

/// Past this many calls waiting to be remembered, remembering waits for the lock.
const MAX_PENDING: usize = 4096;

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let leaves = self.state.read().map(|s| s.leaves).unwrap_or(0);
        f.debug_struct("Memo").field("leaves", &leaves).finish()
    }
}

impl Memo {
    /// A new pipeline run: drops what the previous run did not use.
    pub fn begin_run(&self) {
        let Ok(mut state) = self.state.write() else {
            return;
        };
        self.add_pending(&mut state);
        let keep_from = state.run;
        state.run += 1;
        let mut leaves = 0;
        state
            .roots
            .retain(|_, node| prune(node, keep_from, &mut leaves));
        state.leaves = leaves;
    }

    /// The memo standing in for the calls of one hook run (see [`Calls`]).
    pub fn calls(&self) -> Calls<'_> {
        Calls {
            memo: self,
            reader: None,
            read_facts: false,
        }
    }

    /// A reader of the memo, for the finds of one hook run (every script of the hook, in
    /// turn): one read lock instead of one per script. The workers of a cold run find
    /// results a million times at 10 000 Ingresses; taking the lock for each made the two
    /// cores fight over it. Drop it before remembering.
    fn reader(&self) -> Reader<'_> {
        Reader(self.state.read().ok())
    }

    /// Remembers a call. A trace that disagrees with the tree (a read where the tree has
    /// another) is not remembered: that would mean the hook is not a function of its reads.
    /// While another thread holds the tree, the call waits in `pending` (see [`Memo`]).
    fn remember(
        &self,
        script: u64,
        hook: Hook,
        trace: Vec<(ReadKey, ReadValue)>,
        outcome: Outcome,
    ) {
        let call = Entry {
            script,
            hook,
            trace,
            outcome,
        };
        let mut state = match self.state.try_write() {
            Ok(state) => state,
            Err(std::sync::TryLockError::WouldBlock) => {
                {
                    let Ok(mut pending) = self.pending.lock() else {
                        return;
                    };
                    if pending.len() < MAX_PENDING {
                        pending.push(call);
                        return;
                    }
                }
                let Ok(state) = self.state.write() else {
                    return;
                };
                state
            }
            Err(std::sync::TryLockError::Poisoned(_)) => return,
        };
        self.add_pending(&mut state);
        add(&mut state, call);
    }

    /// Adds the calls waiting in `pending`. Locks `pending` under the tree's lock: the
    /// other order is never taken (see `remember`).
    fn add_pending(&self, state: &mut State) {
        let waiting = match self.pending.lock() {
            Ok(mut pending) if !pending.is_empty() => std::mem::take(&mut *pending),
            _ => return,
        };
        for call in waiting {
            add(state, call);
        }
    }

    /// How many results are remembered (the calls waiting are added first).
    pub fn len(&self) -> usize {
        let Ok(mut state) = self.state.write() else {
            return 0;
        };
        self.add_pending(&mut state);
        state.leaves
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Adds `call` to the tree (see [`Memo::remember`]).
fn add(state: &mut State, call: Entry) {
    let Entry {
        script,
        hook,
        trace,
        outcome,
    } = call;
    if state.leaves >= MAX_LEAVES {
        state.roots.clear();
        state.leaves = 0;
    }
    let run = state.run;
    let leaf = Node::Leaf {
        outcome: Arc::new(outcome),
        run: AtomicU64::new(run),
    };
    let mut reads = trace.into_iter();
    let chain = |reads: std::vec::IntoIter<(ReadKey, ReadValue)>, leaf: Node| {
        reads.rev().fold(leaf, |node, (key, value)| Node::Read {
            key,
            next: Answers::from_iter([(value, node)]),
        })
    };
    let State { roots, leaves, .. } = state;
    let Some(mut node) = roots.get_mut(&(script, hook)) else {
        roots.insert((script, hook), chain(reads, leaf));
        *leaves += 1;
        return;
    };
    loop {
        let Some((key, value)) = reads.next() else {
            return;
        };
        let Node::Read { key: at, next } = node else {
            return;
        };
        if *at != key {
            return;
        }
        match next.entry(value) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                let rest: Vec<(ReadKey, ReadValue)> = reads.collect();
                slot.insert(chain(rest.into_iter(), leaf));
                *leaves += 1;
                return;
            }
            std::collections::hash_map::Entry::Occupied(slot) => node = slot.into_mut(),
        }
    }
}

/// The memo standing in for the calls of one hook run (every script of the hook, in turn):
/// a call whose reads answer as a remembered call's did is not made again.
#[derive(Debug)]
pub struct Calls<'a> {
    memo: &'a Memo,
    /// Held across the calls found; let go before one is made (and remembered).
    reader: Option<Reader<'a>>,
    read_facts: bool,
}

impl Calls<'_> {
    /// Lends `take` the result of `script`'s `hook` on `ctx`: a remembered one, its
    /// operations charged to `budget` again unless they would exhaust it (then the call is
    /// made, and stops where any replica's stops); else the call `make` makes, remembered
    /// when it completed (a stopped or failed one depends on the budget or the clock, or is
    /// worth making again).
    pub fn call(
        &mut self,
        script: u64,
        hook: Hook,
        ctx: &HookContext,
        budget: &mut Budget,
        make: impl FnOnce(&mut Budget) -> super::Call,
        take: &mut dyn FnMut(super::CallResult<'_>, &[Report]),
    ) {
        let Calls {
            memo,
            reader,
            read_facts,
        } = self;
        let found = reader.get_or_insert_with(|| memo.reader()).find(
            script,
            hook,
            |key| {
                *read_facts |= matches!(key, ReadKey::Fact(_));
                ctx.answer(key)
            },
            |outcome| {
                let fits = budget.charge(outcome.operations);
                if fits {
                    take(Ok(&outcome.value), &outcome.reports);
                }
                fits
            },
        );
        if found == Some(true) {
            return;
        }
        *reader = None;
        let super::Call {
            value,
            log,
            operations,
        } = make(budget);
        *read_facts |= log.read_facts();
        take(value.as_ref().map_err(|e| &**e), &log.reports);
        if let Ok(value) = value {
            let Log { reads, reports, .. } = log;
            memo.remember(
                script,
                hook,
                reads,
                Outcome {
                    value,
                    reports,
                    operations,
                },
            );
        }
    }

    /// Whether a call made or found read a fact.
    pub fn read_facts(&self) -> bool {
        self.read_facts
    }
}

/// The memo held for reading ([`Memo::reader`]).
struct Reader<'a>(Option<std::sync::RwLockReadGuard<'a, State>>);

impl std::fmt::Debug for Reader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader<'_> {
    /// `use_outcome` of the remembered outcome of `script`'s `hook` for a context that
    /// answers `replay` the way an earlier one did.
    ///
    /// The outcome is lent, not shared: the workers of a cold run find the same few outcomes
    /// hundreds of thousands of times, and counting references to them (or marking them used
    /// when they already are) made the two cores fight over those cache lines.
    fn find<R>(
        &self,
        script: u64,
        hook: Hook,
        mut replay: impl FnMut(&ReadKey) -> ReadValue,
        use_outcome: impl FnOnce(&Outcome) -> R,
    ) -> Option<R> {
        let state = self.0.as_ref()?;
        let run = state.run;
        let mut node = state.roots.get(&(script, hook))?;
        loop {
            match node {
                Node::Read { key, next } => {
                    let value = replay(key);
                    node = next.get(&value)?;
                }
                Node::Leaf { outcome, run: used } => {
                    if used.load(Ordering::Relaxed) < run {
                        used.fetch_max(run, Ordering::Relaxed);
                    }
                    return Some(use_outcome(outcome));
                }
            }
        }
    }
}

/// Whole hook runs (every script of one hook, applied) remembered by the complete inputs of
/// their context ([`HookContext::hash_inputs`]: the subject, every source's annotations, the
/// Service's; and the facts). An object whose inputs did not change since the last pipeline
/// run costs one hash of its inputs. Tied to one compiled script set (a new set starts empty),
/// unlike the per-script [`Memo`].
///
/// A run that read no fact is remembered by its inputs without the facts ([`WholeKeys`]): it
/// gives the same result for any facts, as every hook is a function of what it reads. The
/// routes of one Ingress to one Service differ only in their facts (host, path), and the
/// bundled scripts read none, so all but the first of them are found (about 30 000 of
/// 40 000 route runs at 10 000 Ingresses, each some 25 000 instructions of replays).
///
/// The key is a 128-bit fingerprint (SipHash-1-3 under random keys) of the hook's scripts
/// and the inputs, not the inputs themselves, which would double the memory a large cluster
/// needs; the chance that two different inputs among a million collide is about 2^-89. The
/// scripts in the key let an engine loaded after a script change share the memo
/// (`PolicyEngine::keep_memo_of`).
///
/// The entries are in shards by key, each behind its own lock: the workers of a cold run
/// look up and remember tens of thousands at once.
pub struct WholeRuns {
    shards: Vec<Mutex<WholeState>>,
    /// By hook, the last few distinct values remembered, newest first (see `shared`).
    recent: Mutex<HashMap<Hook, std::collections::VecDeque<Arc<dyn std::any::Any + Send + Sync>>>>,
    /// SipHash keys, random for each memo: a tenant cannot pick annotation values whose key
    /// another object's run already has.
    keys: (u64, u64),
}

/// The bytes a `Hash` implementation writes, in order. Two inputs write the same bytes only
/// when they are equal (std's `Hash` implementations are prefix-free), so hashing the bytes
/// at once tells inputs apart as well as feeding the hasher write by write, in one pass.
struct Gathered(Vec<u8>);

impl std::hash::Hasher for Gathered {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    /// Not a fingerprint: [`WholeRuns::keys`] fingerprints the bytes under its keys.
    fn finish(&self) -> u64 {
        self.0.len() as u64
    }
}

/// How many shards [`WholeRuns`] has (a power of two).
const WHOLE_SHARDS: usize = 16;

impl Default for WholeRuns {
    fn default() -> Self {
        Self {
            shards: std::iter::repeat_with(Mutex::default)
                .take(WHOLE_SHARDS)
                .collect(),
            recent: Mutex::default(),
            keys: crate::fingerprint::random_keys(),
        }
    }
}

#[derive(Default)]
struct WholeState {
    run: u64,
    entries: HashMap<(Hook, u128), WholeRun>,
}

/// The keys of a context's inputs: without its facts, and with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeKeys {
    pub general: u128,
    pub specific: u128,
}

/// How many distinct values `WholeRuns::shared` compares a new one with.
const RECENT_VALUES: usize = 8;

/// A remembered whole hook run: the settings (type-erased: route or backend), the reports in
/// order, and the operations the scripts used.
#[derive(Clone)]
pub struct WholeRun {
    pub value: Arc<dyn std::any::Any + Send + Sync>,
    pub diagnostics: Vec<Diagnostic>,
    pub operations: u64,
    run: u64,
    /// Remembered by the general key: the run read no fact.
    facts_free: bool,
}

impl std::fmt::Debug for WholeRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WholeRun")
            .field("diagnostics", &self.diagnostics)
            .field("operations", &self.operations)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for WholeRuns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WholeRuns")
            .field("entries", &self.len())
            .finish()
    }
}

impl WholeRuns {
    /// A new pipeline run: drops what the previous run did not use.
    pub fn begin_run(&self) {
        for shard in &self.shards {
            if let Ok(mut state) = shard.lock() {
                let keep_from = state.run;
                state.run += 1;
                state.entries.retain(|_, e| e.run >= keep_from);
            }
        }
    }

    fn shard(&self, key: u128) -> &Mutex<WholeState> {
        &self.shards[(key as usize) & (WHOLE_SHARDS - 1)]
    }

    /// The fingerprints of `ctx`'s inputs without and with its facts: what their `Hash`
    /// writes, gathered into one buffer, then fingerprinted in one pass under the memo's
    /// keys. SipHash pays per write, and the inputs are hundreds of small writes: one
    /// 128-bit pass over one buffer costs a fraction of two keyed runs over the writes.
    /// `scripts` names the scripts of the hook (see `PolicyEngine::hook_scripts`), so that
    /// engines sharing this memo find only the runs of the same scripts.
    fn keys(&self, ctx: &HookContext, scripts: u128) -> WholeKeys {
        let key = |bytes: &[u8]| {
            let mut f = crate::fingerprint::Fingerprint::with_keys(self.keys);
            std::io::Write::write_all(&mut f, bytes).ok();
            f.finish()
        };
        let mut inputs = Gathered(Vec::with_capacity(512));
        inputs.0.extend_from_slice(&scripts.to_le_bytes());
        ctx.hash_inputs(&mut inputs);
        let general = key(&inputs.0);
        // The specific key: the general one and the facts (not all the inputs again).
        inputs.0.clear();
        inputs.0.extend_from_slice(&general.to_le_bytes());
        ctx.hash_facts(&mut inputs);
        WholeKeys {
            general,
            specific: key(&inputs.0),
        }
    }

    /// `value` to remember for `hook`, as an `Arc` shared with an equal value remembered
    /// lately when there is one. Most routes and backends come out the same (each run is
    /// keyed by its own object), and at 10 000 Ingresses a copy of each was 25 MB. While
    /// another worker holds the list, the value is not shared: a few dozen copies in a cold
    /// run, where waiting cost the workers 8 ms.
    fn shared<T: PartialEq + Send + Sync + 'static>(
        &self,
        hook: Hook,
        value: T,
    ) -> Arc<dyn std::any::Any + Send + Sync> {
        let Ok(mut recent) = self.recent.try_lock() else {
            return Arc::new(value);
        };
        let recent = recent.entry(hook).or_default();
        if let Some(at) = recent
            .iter()
            .position(|r| r.downcast_ref::<T>() == Some(&value))
        {
            let found = recent.remove(at).unwrap_or_else(|| Arc::new(value));
            recent.push_front(found.clone());
            return found;
        }
        let value: Arc<dyn std::any::Any + Send + Sync> = Arc::new(value);
        recent.truncate(RECENT_VALUES - 1);
        recent.push_front(value.clone());
        value
    }

    /// The run of `hook`'s scripts (`scripts`: see `PolicyEngine::hook_scripts`) on `ctx`: one
    /// remembered for a context with the same inputs, its operations charged to `budget`
    /// again unless they would exhaust it; else `run` (which tells whether it read a fact),
    /// remembered unless a call was stopped (budget, clock).
    pub fn run<T: Clone + PartialEq + Send + Sync + 'static>(
        &self,
        hook: Hook,
        scripts: u128,
        ctx: &HookContext,
        budget: &mut Budget,
        diags: &mut Diagnostics,
        run: impl FnOnce(&mut Budget, &mut Diagnostics) -> (T, bool),
    ) -> T {
        let keys = self.keys(ctx, scripts);
        if let Some(done) = self.find(hook, keys) {
            if let Some(value) = done.value.downcast_ref::<T>() {
                if budget.charge(done.operations) {
                    for d in done.diagnostics {
                        diags.push(d);
                    }
                    return value.clone();
                }
            }
        }
        let before = *budget;
        let mut own = Diagnostics::new();
        let (value, read_facts) = run(budget, &mut own);
        let reports: Vec<Diagnostic> = own.iter().cloned().collect();
        diags.extend(own);
        let Some(operations) = budget.used_since(before) else {
            return value;
        };
        let shared = self.shared(hook, value.clone());
        // The remembered equal value, whose shared parts (`Arc`s) the caller then shares too:
        // most routes come out with the same settings.
        let value = shared.downcast_ref::<T>().cloned().unwrap_or(value);
        self.remember(hook, keys, !read_facts, shared, reports, operations);
        value
    }

    /// The run remembered for a context of these keys: one that read no fact under the
    /// general key, else one under the specific key.
    fn find(&self, hook: Hook, keys: WholeKeys) -> Option<WholeRun> {
        self.find_one(hook, keys.general, true)
            .or_else(|| self.find_one(hook, keys.specific, false))
    }

    fn find_one(&self, hook: Hook, key: u128, facts_free: bool) -> Option<WholeRun> {
        let mut state = self.shard(key).lock().ok()?;
        let run = state.run;
        let entry = state
            .entries
            .get_mut(&(hook, key))
            .filter(|e| e.facts_free == facts_free)?;
        entry.run = run;
        Some(entry.clone())
    }

    /// Remembers a run under the general key when it read no fact, else the specific one.
    fn remember(
        &self,
        hook: Hook,
        keys: WholeKeys,
        facts_free: bool,
        value: Arc<dyn std::any::Any + Send + Sync>,
        diagnostics: Vec<Diagnostic>,
        operations: u64,
    ) {
        let key = if facts_free {
            keys.general
        } else {
            keys.specific
        };
        if let Ok(mut state) = self.shard(key).lock() {
            if state.entries.len() >= MAX_LEAVES / WHOLE_SHARDS {
                state.entries.clear();
            }
            let run = state.run;
            state.entries.insert(
                (hook, key),
                WholeRun {
                    value,
                    diagnostics,
                    operations,
                    run,
                    facts_free,
                },
            );
        }
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().map(|s| s.entries.len()).unwrap_or(0))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Keeps the leaves used since run `keep_from`; false when nothing is left under `node`.
fn prune(node: &mut Node, keep_from: u64, leaves: &mut usize) -> bool {
    match node {
        Node::Leaf { run, .. } => {
            let keep = run.load(Ordering::Relaxed) >= keep_from;
            *leaves += usize::from(keep);
            keep
        }
        Node::Read { next, .. } => {
            next.retain(|_, n| prune(n, keep_from, leaves));
            !next.is_empty()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_run_keys_tell_inputs_apart() {
        use crate::objects::{Key, Kind, ObjectRef};
        use crate::policy::ValueSource;
        use std::collections::BTreeMap;
        let runs = WholeRuns::default();
        let ctx = |name: &str, pairs: &[(&str, &str)], facts: &[(&'static str, &str)]| {
            let object = ObjectRef::new(Kind::Ingress, &Key::new("ns", name));
            let values: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let facts = facts.iter().map(|(k, v)| (*k, v.to_string())).collect();
            HookContext::new(
                object.clone(),
                vec![ValueSource::annotations(object, Arc::new(values))],
                facts,
            )
        };
        let base = runs.keys(&ctx("web", &[("a", "bc")], &[("path", "/")]), 7);
        assert_eq!(
            base,
            runs.keys(&ctx("web", &[("a", "bc")], &[("path", "/")]), 7)
        );
        // Other scripts: other keys.
        let scripts = runs.keys(&ctx("web", &[("a", "bc")], &[("path", "/")]), 8);
        assert_ne!(base.general, scripts.general);
        assert_ne!(base.specific, scripts.specific);
        assert_ne!(base.general, base.specific);
        for other in [
            ctx("web", &[("ab", "c")], &[("path", "/")]),
            ctx("web", &[("a", "b"), ("c", "")], &[("path", "/")]),
            ctx("web2", &[("a", "bc")], &[("path", "/")]),
            ctx("web", &[], &[("path", "/")]),
        ] {
            let keys = runs.keys(&other, 7);
            assert_ne!(base.general, keys.general);
            assert_ne!(base.specific, keys.specific);
        }
        // Other facts: the same general key, another specific one.
        for facts in [&[("path", "/x")][..], &[], &[("path", "/"), ("host", "a")]] {
            let keys = runs.keys(&ctx("web", &[("a", "bc")], facts), 7);
            assert_eq!(base.general, keys.general);
            assert_ne!(base.specific, keys.specific);
        }
        // Keyed per process (per memo): another memo's keys differ.
        let elsewhere = WholeRuns::default().keys(&ctx("web", &[("a", "bc")], &[("path", "/")]), 7);
        assert_ne!(base.general, elsewhere.general);
        assert_ne!(base.specific, elsewhere.specific);
    }

    #[test]
    fn equal_whole_run_values_share_one_allocation() {
        let runs = WholeRuns::default();
        let first = runs.shared(Hook::Route, String::from("a"));
        let other = runs.shared(Hook::Route, String::from("b"));
        assert!(!Arc::ptr_eq(&first, &other));
        assert!(Arc::ptr_eq(
            &first,
            &runs.shared(Hook::Route, String::from("a"))
        ));
        // Per hook, and per type.
        assert!(!Arc::ptr_eq(
            &first,
            &runs.shared(Hook::Backend, String::from("a"))
        ));
        let number = runs.shared(Hook::Route, 1u8);
        assert_eq!(number.downcast_ref::<u8>(), Some(&1));
        // Only the last few distinct values are compared with.
        for i in 0..RECENT_VALUES {
            runs.shared(Hook::Route, i.to_string());
        }
        let again = runs.shared(Hook::Route, String::from("a"));
        assert!(!Arc::ptr_eq(&first, &again));
        assert_eq!(
            again.downcast_ref::<String>().map(String::as_str),
            Some("a")
        );
    }

    #[test]
    fn whole_runs_are_found_in_every_shard_and_dropped_when_unused() {
        let runs = WholeRuns::default();
        runs.begin_run();
        // Even ones read no fact (remembered by the general key), odd ones did.
        let keys: Vec<WholeKeys> = (0..100u128)
            .map(|i| WholeKeys {
                general: i * 0x9e37_79b9_7f4a_7c15,
                specific: (i + 1000) * 0x9e37_79b9_7f4a_7c15,
            })
            .collect();
        for (i, &key) in keys.iter().enumerate() {
            let value = runs.shared(Hook::Route, i);
            runs.remember(Hook::Route, key, i % 2 == 0, value, Vec::new(), 3);
        }
        assert_eq!(runs.len(), keys.len());
        assert!(
            runs.shards
                .iter()
                .all(|shard| !shard.lock().unwrap().entries.is_empty())
        );
        runs.begin_run();
        for (i, &key) in keys.iter().enumerate().step_by(3) {
            let found = runs.find(Hook::Route, key).unwrap();
            assert_eq!(found.value.downcast_ref::<usize>(), Some(&i));
            assert_eq!(found.operations, 3);
            assert!(runs.find(Hook::Backend, key).is_none());
            // A fact-free run is found by its general key whatever the specific one; the
            // others only by their specific key.
            let general_only = WholeKeys {
                general: key.general,
                specific: 7,
            };
            assert_eq!(runs.find(Hook::Route, general_only).is_some(), i % 2 == 0);
            let specific_only = WholeKeys {
                general: 7,
                specific: key.specific,
            };
            assert_eq!(runs.find(Hook::Route, specific_only).is_some(), i % 2 == 1);
            // A general key is not taken for a specific one.
            let swapped = WholeKeys {
                general: key.specific,
                specific: key.general,
            };
            assert!(runs.find(Hook::Route, swapped).is_none());
        }
        runs.begin_run();
        assert_eq!(runs.len(), keys.len().div_ceil(3));
        assert!(runs.find(Hook::Route, keys[1]).is_none());
    }

    fn outcome(v: i64) -> Outcome {
        Outcome {
            value: Dynamic::from(v),
            reports: Vec::new(),
            operations: 7,
        }
    }

    fn lookup(name: &str) -> ReadKey {
        ReadKey::Lookup {
            view: Vec::new(),
            names: vec![name.to_string()],
        }
    }

    fn found(raw: &str) -> ReadValue {
        ReadValue::Found(vec![(0, raw.to_string(), "annotation a".to_string())])
    }

    #[test]
    fn a_result_is_found_by_replaying_its_reads() {
        let memo = Memo::default();
        memo.begin_run();
        memo.remember(
            0,
            Hook::Route,
            vec![(lookup("a"), found("1")), (lookup("b"), found("x"))],
            outcome(1),
        );
        // Another answer for `a` leads elsewhere: no read of `b` is made up.
        memo.remember(
            0,
            Hook::Route,
            vec![(lookup("a"), ReadValue::Found(vec![]))],
            outcome(2),
        );
        assert_eq!(memo.len(), 2);
        let answer = |a: &str, b: &str| {
            let (a, b) = (a.to_string(), b.to_string());
            move |key: &ReadKey| match key {
                ReadKey::Lookup { names, .. } if names[0] == "a" => {
                    if a.is_empty() {
                        ReadValue::Found(vec![])
                    } else {
                        found(&a)
                    }
                }
                _ => found(&b),
            }
        };
        let value = |o: &Outcome| o.value.as_int().unwrap();
        assert_eq!(
            memo.reader().find(0, Hook::Route, answer("1", "x"), value),
            Some(1)
        );
        assert_eq!(
            memo.reader()
                .find(0, Hook::Route, answer("1", "x"), |o| o.operations),
            Some(7)
        );
        assert_eq!(
            memo.reader().find(0, Hook::Route, answer("", "y"), value),
            Some(2)
        );
        assert!(
            memo.reader()
                .find(0, Hook::Route, answer("1", "y"), value)
                .is_none()
        );
        assert!(
            memo.reader()
                .find(1, Hook::Route, answer("1", "x"), value)
                .is_none()
        );
        assert!(
            memo.reader()
                .find(0, Hook::Backend, answer("1", "x"), value)
                .is_none()
        );
    }

    #[test]
    fn results_a_run_did_not_use_are_dropped() {
        let memo = Memo::default();
        memo.begin_run();
        memo.remember(0, Hook::Route, vec![(lookup("a"), found("1"))], outcome(1));
        memo.remember(0, Hook::Route, vec![(lookup("a"), found("2"))], outcome(2));
        memo.begin_run();
        assert!(
            memo.reader()
                .find(0, Hook::Route, |_| found("1"), |_| ())
                .is_some()
        );
        memo.begin_run();
        assert_eq!(memo.len(), 1);
        assert!(
            memo.reader()
                .find(0, Hook::Route, |_| found("2"), |_| ())
                .is_none()
        );
        assert!(
            memo.reader()
                .find(0, Hook::Route, |_| found("1"), |_| ())
                .is_some()
        );
    }

    /// A call remembered while a reader holds the tree waits, without blocking, and is
    /// added by the next call that gets the lock (or by `len` and `begin_run`), in order.
    #[test]
    fn calls_remembered_while_the_tree_is_read_are_added_later() {
        let memo = Memo::default();
        memo.begin_run();
        let find = |memo: &Memo, raw: &str| {
            memo.reader().find(
                0,
                Hook::Route,
                |_| found(raw),
                |o| o.value.as_int().unwrap(),
            )
        };
        {
            let reader = memo.reader();
            memo.remember(0, Hook::Route, vec![(lookup("a"), found("1"))], outcome(1));
            memo.remember(0, Hook::Route, vec![(lookup("a"), found("2"))], outcome(2));
            assert!(
                reader
                    .find(0, Hook::Route, |_| found("1"), |_| ())
                    .is_none()
            );
            drop(reader);
            assert_eq!(find(&memo, "1"), None, "still waiting");
        }
        memo.remember(0, Hook::Route, vec![(lookup("a"), found("3"))], outcome(3));
        assert_eq!(
            (find(&memo, "1"), find(&memo, "2"), find(&memo, "3")),
            (Some(1), Some(2), Some(3))
        );
        {
            let _reader = memo.reader();
            memo.remember(0, Hook::Route, vec![(lookup("a"), found("4"))], outcome(4));
        }
        assert_eq!(memo.len(), 4);
        assert_eq!(find(&memo, "4"), Some(4));
        // Past the bound, a call waits for the lock instead (here until another thread's
        // reader lets go), and adds every waiting call with its own. The 20 ms only make it
        // likely that the call finds the lock taken; the assertions hold either way.
        std::thread::scope(|scope| {
            let (held, is_held) = std::sync::mpsc::channel();
            let (release, released) = std::sync::mpsc::channel::<()>();
            let shared = &memo;
            scope.spawn(move || {
                let _reader = shared.reader();
                held.send(()).unwrap();
                released.recv().unwrap();
            });
            is_held.recv().unwrap();
            for i in 0..MAX_PENDING {
                let raw = format!("p{i}");
                memo.remember(
                    0,
                    Hook::Backend,
                    vec![(lookup("a"), found(&raw))],
                    outcome(5),
                );
            }
            assert_eq!(memo.pending.lock().unwrap().len(), MAX_PENDING);
            scope.spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                release.send(()).unwrap();
            });
            memo.remember(
                0,
                Hook::Backend,
                vec![(lookup("a"), found("q"))],
                outcome(6),
            );
            assert!(memo.pending.lock().unwrap().is_empty());
        });
        assert_eq!(memo.len(), 4 + MAX_PENDING + 1);
    }
}
