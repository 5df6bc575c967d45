//! Kubernetes Events for rejected and questionable settings.
//!
//! Diagnostics otherwise only reach the controller's log, which the owner of an Ingress may
//! not be able to read; as Events they show in `kubectl describe ingress`. Every pipeline run
//! reports the full set of diagnostics again, so Events are rate limited: an unchanged
//! diagnostic is posted again only after a while, and each call posts a bounded number.
//! Only the leader should record, or each replica posts its own copy.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

use crate::diagnostics::{Diagnostic, Severity, Subject};
use crate::objects::{Key, Kind, ObjectRef, TCP_API_VERSION};
use crate::store::Store;

/// How long an unchanged diagnostic stays quiet after its Event (Events expire after an hour).
pub const DEFAULT_REPEAT_AFTER: Duration = Duration::from_secs(600);
/// At most this many Events per call, so that a bad change to many objects does not flood the
/// API server; the rest follow on later calls.
pub const DEFAULT_BURST: usize = 25;
/// Messages are cut to this many bytes, as client-go's recorder does.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Reason of Events for settings that were dropped.
pub const REASON_REJECTED: &str = "SettingRejected";
/// Reason of Events for settings that were ignored or defaulted.
pub const REASON_WARNING: &str = "SettingWarning";

/// What makes two Events identical for rate limiting.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventKey {
    pub object: ObjectRef,
    pub reason: &'static str,
    pub message: String,
}

/// Remembers when each key was last admitted, so that repeats are held back for
/// `repeat_after`. Pure: the caller supplies the time.
#[derive(Debug)]
pub struct RateLimiter<K> {
    repeat_after: Duration,
    sent: HashMap<K, Instant>,
}

impl<K: Eq + Hash> RateLimiter<K> {
    pub fn new(repeat_after: Duration) -> Self {
        Self {
            repeat_after,
            sent: HashMap::new(),
        }
    }

    /// Whether `key` may be emitted at `now`: never admitted, or last admitted at least
    /// `repeat_after` before.
    pub fn is_due(&self, key: &K, now: Instant) -> bool {
        self.sent
            .get(key)
            .is_none_or(|t| now.saturating_duration_since(*t) >= self.repeat_after)
    }

    /// Like [`Self::is_due`], and if so remembers `now` as the time it was emitted.
    pub fn admit(&mut self, key: K, now: Instant) -> bool {
        if !self.is_due(&key, now) {
            return false;
        }
        self.sent.insert(key, now);
        true
    }

    /// Makes `key` due again, for an Event that could not be posted.
    pub fn forget(&mut self, key: &K) {
        self.sent.remove(key);
    }

    /// Keeps only the keys `keep` accepts, so that a problem that was fixed and comes back is
    /// reported at once.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.sent.retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.sent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }
}

/// What one `record` call did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecordStats {
    /// Events posted.
    pub emitted: usize,
    /// Events due but held back for a later call (over the burst, or the API server was not
    /// reachable). Unchanged diagnostics within `repeat_after` are not counted anywhere.
    pub suppressed: usize,
    /// Events the API server did not accept or that could not be sent.
    pub failed: usize,
}

/// Which candidates to post now, by index.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    emit: Vec<usize>,
    suppressed: usize,
}

/// Forgets keys no longer reported, then admits due keys up to `burst`. Keys over the burst
/// are not admitted, so they stay due for the next call.
fn plan<K: Eq + Hash + Clone>(
    limiter: &mut RateLimiter<K>,
    keys: &[K],
    burst: usize,
    now: Instant,
) -> Plan {
    let live: HashSet<&K> = keys.iter().collect();
    limiter.retain(|k| live.contains(k));
    let mut plan = Plan {
        emit: Vec::new(),
        suppressed: 0,
    };
    for (i, key) in keys.iter().enumerate() {
        if !limiter.is_due(key, now) {
            continue;
        }
        if plan.emit.len() < burst {
            limiter.admit(key.clone(), now);
            plan.emit.push(i);
        } else {
            plan.suppressed += 1;
        }
    }
    plan
}

/// An Event to post, with the object it is about as the store has it.
#[derive(Debug, Clone, PartialEq)]
struct Candidate {
    key: EventKey,
    involved: ObjectReference,
}

/// The diagnostics that can become Events: about a namespaced object of a kind users edit,
/// still in the store. Deduplicated, in the diagnostics' order.
fn candidates(diagnostics: &[Diagnostic], store: &Store) -> Vec<Candidate> {
    let on_objects: Vec<(&ObjectRef, &Diagnostic)> = diagnostics
        .iter()
        .filter_map(|d| match &d.subject {
            Subject::Object(o) if reported(o) => Some((o, d)),
            _ => None,
        })
        .collect();
    let wants = |kind| on_objects.iter().any(|(o, _)| o.kind == kind);
    // Ingresses and TCPs have no lookup by key in the store; index them once per call.
    let ingresses: HashMap<&Key, &ObjectMeta> = if wants(Kind::Ingress) {
        store.ingresses().map(|(k, o)| (k, &o.metadata)).collect()
    } else {
        HashMap::new()
    };
    let tcps: HashMap<&Key, &ObjectMeta> = if wants(Kind::Tcp) {
        store.tcps().map(|(k, o)| (k, &o.metadata)).collect()
    } else {
        HashMap::new()
    };
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (object, d) in on_objects {
        let key = Key::new(object.namespace.clone(), object.name.clone());
        let (api_version, meta) = match object.kind {
            Kind::Ingress => ("networking.k8s.io/v1", ingresses.get(&key).copied()),
            Kind::Tcp => (TCP_API_VERSION, tcps.get(&key).copied()),
            Kind::Backend | Kind::Defaults | Kind::Global => (
                TCP_API_VERSION,
                store.resource(object.kind, &key).map(|o| &o.metadata),
            ),
            Kind::Service => ("v1", store.service(&key).map(|o| &o.metadata)),
            Kind::ConfigMap => ("v1", store.config_map(&key).map(|o| &o.metadata)),
            Kind::Secret => ("v1", store.secret(&key).map(|o| &o.metadata)),
            _ => continue,
        };
        let Some(meta) = meta else { continue };
        let event_key = EventKey {
            object: object.clone(),
            reason: match d.severity {
                Severity::Error => REASON_REJECTED,
                Severity::Warning => REASON_WARNING,
            },
            message: message(d),
        };
        if !seen.insert(event_key.clone()) {
            continue;
        }
        out.push(Candidate {
            key: event_key,
            involved: ObjectReference {
                api_version: Some(api_version.to_string()),
                kind: Some(object.kind.as_str().to_string()),
                namespace: Some(object.namespace.clone()),
                name: Some(object.name.clone()),
                uid: meta.uid.clone(),
                resource_version: meta.resource_version.clone(),
                field_path: None,
            },
        });
    }
    out
}

fn reported(o: &ObjectRef) -> bool {
    matches!(
        o.kind,
        Kind::Ingress
            | Kind::Service
            | Kind::Tcp
            | Kind::ConfigMap
            | Kind::Secret
            | Kind::Backend
            | Kind::Defaults
            | Kind::Global
    ) && !o.namespace.is_empty()
}

/// `field: message`, cut to [`MAX_MESSAGE_BYTES`] on a character boundary.
fn message(d: &Diagnostic) -> String {
    let mut m = match &d.field {
        Some(field) => format!("{field}: {}", d.message),
        None => d.message.clone(),
    };
    if m.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
    }
    m
}

/// A core/v1 Event as `kubectl describe` shows it. The name is generated by the API server
/// from the object's name, as for client-go's `<name>.<suffix>`.
fn event(candidate: &Candidate, component: &str, instance: &str, now: Timestamp) -> Event {
    let object = &candidate.key.object;
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", object.name)),
            namespace: Some(object.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: candidate.involved.clone(),
        type_: Some("Warning".to_string()),
        reason: Some(candidate.key.reason.to_string()),
        message: Some(candidate.key.message.clone()),
        source: Some(EventSource {
            component: Some(component.to_string()),
            host: None,
        }),
        reporting_component: Some(component.to_string()),
        reporting_instance: Some(instance.to_string()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..Event::default()
    }
}

/// Posts Events for diagnostics about cluster objects, rate limited.
pub struct EventRecorder {
    client: kube::Client,
    component: String,
    instance: String,
    burst: usize,
    limiter: RateLimiter<EventKey>,
}

impl fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventRecorder")
            .field("component", &self.component)
            .field("instance", &self.instance)
            .field("burst", &self.burst)
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// `component` names the controller (`portcullis`), `instance` this replica (pod name).
    pub fn new(
        client: kube::Client,
        component: &str,
        instance: &str,
        repeat_after: Duration,
    ) -> Self {
        Self {
            client,
            component: component.to_string(),
            instance: instance.to_string(),
            burst: DEFAULT_BURST,
            limiter: RateLimiter::new(repeat_after),
        }
    }

    /// Changes the per-call limit (default [`DEFAULT_BURST`]).
    pub fn with_burst(mut self, burst: usize) -> Self {
        self.burst = burst;
        self
    }

    /// Posts an Event for each new diagnostic about an Ingress, Service, TCP or ConfigMap in
    /// `store`. Pass the full current set every time: diagnostics missing from it are
    /// forgotten, so they are reported again if they come back.
    ///
    /// An Event the API server rejects is not retried before `repeat_after`, since the same
    /// request would fail again; when the server cannot be reached, this call stops and the
    /// remaining Events stay due for the next call.
    pub async fn record(&mut self, diagnostics: &[Diagnostic], store: &Store) -> RecordStats {
        let candidates = candidates(diagnostics, store);
        let keys: Vec<EventKey> = candidates.iter().map(|c| c.key.clone()).collect();
        let plan = plan(&mut self.limiter, &keys, self.burst, Instant::now());
        let mut stats = RecordStats {
            suppressed: plan.suppressed,
            ..RecordStats::default()
        };
        let now = Timestamp::now();
        let mut first_error = None;
        let mut emit = plan.emit.into_iter();
        while let Some(i) = emit.next() {
            let Some(candidate) = candidates.get(i) else {
                continue;
            };
            let object = &candidate.key.object;
            let api: Api<Event> = Api::namespaced(self.client.clone(), &object.namespace);
            let event = event(candidate, &self.component, &self.instance, now);
            match api.create(&PostParams::default(), &event).await {
                Ok(_) => stats.emitted += 1,
                Err(e) => {
                    stats.failed += 1;
                    tracing::debug!(%object, error = %e, "cannot post event");
                    if !matches!(e, kube::Error::Api(_)) {
                        self.limiter.forget(&candidate.key);
                        for rest in emit.by_ref() {
                            if let Some(c) = candidates.get(rest) {
                                self.limiter.forget(&c.key);
                                stats.suppressed += 1;
                            }
                        }
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            tracing::warn!(failed = stats.failed, error = %e, "cannot post events");
        }
        if stats.suppressed > 0 {
            tracing::info!(
                suppressed = stats.suppressed,
                emitted = stats.emitted,
                "events held back for a later call"
            );
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::objects::Object;

    fn key(n: usize) -> String {
        format!("k{n}")
    }

    #[test]
    fn repeats_wait_for_repeat_after() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(Duration::from_secs(600));
        assert!(l.admit("a", t0));
        assert!(!l.admit("a", t0 + Duration::from_secs(599)));
        assert!(l.admit("b", t0 + Duration::from_secs(1)));
        assert!(l.admit("a", t0 + Duration::from_secs(600)));
        // The window restarts from the last admission.
        assert!(!l.admit("a", t0 + Duration::from_secs(900)));
        l.forget(&"a");
        assert!(l.admit("a", t0 + Duration::from_secs(901)));
        // A clock that appears to go backwards does not admit early.
        assert!(!l.is_due(&"b", t0));
    }

    #[test]
    fn burst_defers_the_rest_to_later_calls() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(Duration::from_secs(600));
        let keys: Vec<String> = (0..30).map(key).collect();
        let first = plan(&mut l, &keys, 25, t0);
        assert_eq!(first.emit, (0..25).collect::<Vec<_>>());
        assert_eq!(first.suppressed, 5);
        let second = plan(&mut l, &keys, 25, t0 + Duration::from_secs(1));
        assert_eq!(second.emit, (25..30).collect::<Vec<_>>());
        assert_eq!(second.suppressed, 0);
        let third = plan(&mut l, &keys, 25, t0 + Duration::from_secs(2));
        assert_eq!(
            third,
            Plan {
                emit: vec![],
                suppressed: 0
            }
        );
    }

    #[test]
    fn fixed_diagnostics_are_forgotten_and_reported_again_on_return() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(Duration::from_secs(600));
        let both = vec![key(1), key(2)];
        assert_eq!(plan(&mut l, &both, 25, t0).emit, [0, 1]);
        // k1 fixed: forgotten.
        assert_eq!(plan(&mut l, &both[1..], 25, t0).emit, Vec::<usize>::new());
        assert_eq!(l.len(), 1);
        // k1 back a minute later: reported at once; k2 still quiet.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(plan(&mut l, &both, 25, later).emit, [0]);
    }

    fn diag(severity: Severity, kind: Kind, name: &str, message: &str) -> Diagnostic {
        Diagnostic {
            severity,
            subject: Subject::Object(ObjectRef::new(kind, &Key::new("web", name))),
            field: Some("annotation haproxy.org/timeout-server".into()),
            message: message.into(),
        }
    }

    fn store() -> Store {
        Store::from_objects(
            [
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                       "metadata": {"name": "app", "namespace": "web", "uid": "u-1",
                                    "resourceVersion": "42"}}),
                json!({"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": "app", "namespace": "web", "uid": "u-2"}}),
                json!({"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": "app", "namespace": "web", "uid": "u-3"}}),
            ]
            .into_iter()
            .map(|v| Object::from_value(v).unwrap()),
        )
    }

    #[test]
    fn candidates_are_objects_in_the_store_deduplicated() {
        let d = [
            diag(Severity::Error, Kind::Ingress, "app", "not a duration"),
            diag(Severity::Error, Kind::Ingress, "app", "not a duration"),
            diag(Severity::Warning, Kind::Service, "app", "defaulted"),
            diag(Severity::Error, Kind::Ingress, "gone", "not a duration"),
            diag(Severity::Error, Kind::Secret, "app", "bad certificate"),
            Diagnostic {
                severity: Severity::Error,
                subject: Subject::File {
                    file: "x.yaml".into(),
                },
                field: None,
                message: "unreadable".into(),
            },
        ];
        let c = candidates(&d, &store());
        assert_eq!(
            c.len(),
            3,
            "an invalid certificate is reported on its Secret too"
        );
        assert_eq!(c[2].involved.kind.as_deref(), Some("Secret"));
        assert_eq!(c[0].key.reason, REASON_REJECTED);
        assert_eq!(
            c[0].key.message,
            "annotation haproxy.org/timeout-server: not a duration"
        );
        assert_eq!(c[0].involved.uid.as_deref(), Some("u-1"));
        assert_eq!(c[0].involved.resource_version.as_deref(), Some("42"));
        assert_eq!(
            c[0].involved.api_version.as_deref(),
            Some("networking.k8s.io/v1")
        );
        assert_eq!(c[1].key.reason, REASON_WARNING);
        assert_eq!(c[1].involved.kind.as_deref(), Some("Service"));

        let e = event(&c[0], "portcullis", "portcullis-0", Timestamp::UNIX_EPOCH);
        assert_eq!(e.metadata.generate_name.as_deref(), Some("app."));
        assert_eq!(e.metadata.namespace.as_deref(), Some("web"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.count, Some(1));
        assert_eq!(
            e.source.and_then(|s| s.component).as_deref(),
            Some("portcullis")
        );
        assert_eq!(e.reporting_instance.as_deref(), Some("portcullis-0"));
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let d = Diagnostic {
            field: None,
            ..diag(Severity::Error, Kind::Ingress, "app", &"é".repeat(600))
        };
        let m = message(&d);
        assert_eq!(m.len(), 1024);
        assert!(m.chars().all(|c| c == 'é'));
        let d = Diagnostic {
            field: Some("f".into()),
            ..diag(Severity::Error, Kind::Ingress, "app", &"é".repeat(600))
        };
        // "f: " is 3 bytes, so 510 'é' fit in 1023 bytes and the 1024th byte would split one.
        assert_eq!(message(&d).len(), 1023);
    }
}
