//! Resolving ExternalName Services' names at the edge, for the pure translate stage.
//!
//! With `--allow-external-name-services`, a tenant names any DNS name, and a name is only as
//! safe as its answers: one that resolves to `127.0.0.1` or the metadata address turns a
//! public route into the controller's or the node's own endpoints. So `run` resolves the
//! names itself, before each pipeline run, with a bounded wait, and passes the answers in
//! ([`crate::translate::RunInputs::external_names`]); translation refuses a name any of whose
//! addresses is local and renders the addresses as the servers. HAProxy then never resolves a
//! tenant's name, so the answer checked is the answer used (a name that answers differently
//! a moment later changes nothing until the next check). Answers are kept for
//! [`Resolver::ttl`] and looked up again after it; `run` runs the pipeline that often while
//! there are names, so a changed answer reaches HAProxy (through the runtime API) within it.
//!
//! The lookup is the C resolver's (`getaddrinfo`, so `/etc/hosts` too), on a thread per
//! name: it cannot be cancelled, so a lookup that outlasts the wait keeps running, and the
//! name keeps its last answer (or none) until it returns; at most one lookup per name runs.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::store::Store;
use crate::translate::exposure::{self, ResolvedNames};

/// An answer: the addresses, or why there are none.
type Answer = Result<Vec<IpAddr>, String>;

/// The resolver of `run`: answers by name, the lookups in flight, the last set handed out.
#[derive(Debug)]
pub struct Resolver {
    /// How long a run waits for lookups.
    wait: Duration,
    /// How long an answer is used before it is looked up again.
    ttl: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    answers: BTreeMap<String, (Instant, Answer)>,
    in_flight: BTreeMap<String, Receiver<Answer>>,
    last: Option<Arc<ResolvedNames>>,
}

impl Resolver {
    pub fn new(wait: Duration, ttl: Duration) -> Self {
        Self {
            wait,
            ttl,
            state: Mutex::default(),
        }
    }

    /// How long an answer is used: `run` re-runs the pipeline this often while there are names.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether the last run had any ExternalName names to resolve.
    pub fn has_names(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.last.as_ref().is_some_and(|n| !n.0.is_empty())
    }

    /// The answers for every ExternalName name in `store`, waiting at most `wait` for the
    /// lookups due. The same `Arc` as last time when nothing changed (the pipeline then
    /// reuses its work).
    pub fn resolve(&self, store: &Store) -> Arc<ResolvedNames> {
        self.resolve_with(store, lookup)
    }

    fn resolve_with(
        &self,
        store: &Store,
        lookup: impl Fn(&str) -> Answer + Send + Sync + Copy + 'static,
    ) -> Arc<ResolvedNames> {
        let names = names_of(store);
        let now = Instant::now();
        let deadline = now + self.wait;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.answers.retain(|name, _| names.contains(name));
        for name in &names {
            let fresh = state
                .answers
                .get(name)
                .is_some_and(|(at, _)| now.duration_since(*at) < self.ttl);
            if !fresh && !state.in_flight.contains_key(name) {
                let (tx, rx) = mpsc::channel();
                let owned = name.clone();
                std::thread::spawn(move || {
                    let _ = tx.send(lookup(&owned));
                });
                state.in_flight.insert(name.clone(), rx);
            }
        }
        let pending: Vec<String> = state.in_flight.keys().cloned().collect();
        for name in pending {
            let Some(rx) = state.in_flight.get(&name) else {
                continue;
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = match rx.recv_timeout(left) {
                Ok(answer) => answer,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => Err("the lookup failed".to_string()),
            };
            state.in_flight.remove(&name);
            if names.contains(&name) {
                if let Err(e) = &answer {
                    tracing::warn!(name, error = %e, "ExternalName does not resolve: its backend answers 503");
                }
                state.answers.insert(name, (Instant::now(), answer));
            }
        }
        let wait = self.wait;
        let resolved = ResolvedNames(
            names
                .into_iter()
                .map(|name| {
                    let answer = match state.answers.get(&name) {
                        Some((_, answer)) => answer.clone(),
                        None => Err(format!("did not resolve within {wait:?}")),
                    };
                    (name, answer)
                })
                .collect(),
        );
        match &state.last {
            Some(last) if **last == resolved => last.clone(),
            _ => {
                let resolved = Arc::new(resolved);
                state.last = Some(resolved.clone());
                resolved
            }
        }
    }
}

/// The ExternalName names of `store` worth looking up: those translation does not refuse on
/// sight (lowercase, without a trailing dot, as translation reads them).
fn names_of(store: &Store) -> BTreeSet<String> {
    store
        .services()
        .filter(|(_, s)| s.type_.as_deref() == Some("ExternalName"))
        .filter_map(|(_, s)| s.external_name.as_deref())
        .filter(|name| exposure::external_name_refusal(name).is_none())
        .filter_map(|name| crate::values::parse_host(name).ok())
        .filter(|name| !name.starts_with('*'))
        .collect()
}

/// The C resolver's answer for `name`: its addresses, IPv4 only when it has any (HAProxy's
/// `libc` resolution preferred them too), sorted and canonical.
fn lookup(name: &str) -> Answer {
    let found = (name, 0).to_socket_addrs().map_err(|e| format!("{e}"))?;
    let mut addresses: Vec<IpAddr> = found.map(|a| a.ip().to_canonical()).collect();
    if addresses.iter().any(IpAddr::is_ipv4) {
        addresses.retain(IpAddr::is_ipv4);
    }
    addresses.sort();
    addresses.dedup();
    if addresses.is_empty() {
        return Err("no address".to_string());
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Object;

    fn external(name: &str, external_name: &str) -> Object {
        Object::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"type": "ExternalName", "externalName": external_name}
        }))
        .unwrap()
    }

    fn fake(name: &str) -> Answer {
        match name {
            "db.example.com" => Ok(vec!["192.0.2.7".parse().unwrap()]),
            "rebind.example.com" => Ok(vec!["127.0.0.1".parse().unwrap()]),
            "slow.example.com" => {
                std::thread::sleep(Duration::from_millis(300));
                Ok(vec!["192.0.2.9".parse().unwrap()])
            }
            _ => Err("no such name".to_string()),
        }
    }

    #[test]
    fn names_are_answered_within_the_wait_and_kept_until_they_change() {
        let store = Store::from_objects([
            external("db", "db.example.com"),
            external("rebind", "rebind.example.com"),
            external("slow", "slow.example.com"),
            external("gone", "gone.example.com"),
            // Refused on sight: not looked up.
            external("local", "localhost"),
        ]);
        let resolver = Resolver::new(Duration::from_millis(100), Duration::from_secs(60));
        let first = resolver.resolve_with(&store, fake);
        assert_eq!(
            first.0.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "db.example.com",
                "gone.example.com",
                "rebind.example.com",
                "slow.example.com"
            ]
        );
        assert_eq!(
            first.0["db.example.com"],
            Ok(vec!["192.0.2.7".parse().unwrap()])
        );
        assert_eq!(
            first.0["rebind.example.com"],
            Ok(vec!["127.0.0.1".parse().unwrap()])
        );
        assert!(first.0["gone.example.com"].is_err());
        // The slow lookup outlasted the wait: no answer yet, and it keeps running.
        assert!(first.0["slow.example.com"].is_err());
        assert!(resolver.has_names());
        // Later runs pick its answer up (polled against a deadline).
        let deadline = Instant::now() + Duration::from_secs(5);
        let answered = loop {
            let next = resolver.resolve_with(&store, fake);
            if next.0["slow.example.com"].is_ok() {
                break next;
            }
            assert!(Instant::now() < deadline, "the slow name never answered");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            answered.0["slow.example.com"],
            Ok(vec!["192.0.2.9".parse().unwrap()])
        );
        // Nothing changed since: the same set.
        assert!(Arc::ptr_eq(&answered, &resolver.resolve_with(&store, fake)));
    }

    #[test]
    fn a_name_no_service_uses_is_forgotten() {
        let resolver = Resolver::new(Duration::from_millis(500), Duration::from_secs(60));
        let store = Store::from_objects([external("db", "db.example.com")]);
        assert_eq!(resolver.resolve_with(&store, fake).0.len(), 1);
        let empty = resolver.resolve_with(&Store::new(), fake);
        assert!(empty.0.is_empty());
        assert!(!resolver.has_names());
    }

    #[test]
    fn the_c_resolver_answers_localhost_with_loopback() {
        let answer = lookup("localhost").expect("localhost resolves");
        assert!(answer.iter().all(|a| a.is_loopback()), "{answer:?}");
    }
}
