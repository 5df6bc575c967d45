//! Reflecting the cluster into the store: one kube-rs watcher per watched kind and scope.
//!
//! Watchers deliver `Init`, `InitApply`…, `InitDone` on every (re)list, then `Apply` and
//! `Delete`. Each watch remembers the keys it contributed; on `InitDone` it replaces exactly
//! those, so a relist after 410 Gone or a lost connection neither loses nor duplicates an
//! object. Objects go through the same parser as the files source ([`Object::from_value`]), so
//! one malformed object is reported by name and the rest are kept.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, mpsc};

use crate::diagnostics::{Diagnostic, Severity, Subject};
use crate::objects::SERVICE_NAME_LABEL;
use crate::objects::{Key, Kind, Object, ObjectRef};
use crate::store::Store;

use super::api_errors::{error_chain, is_permanent_status};

/// Which namespaces' Ingresses, Services, EndpointSlices, Secrets and TCP objects are read.
/// The controller's own ConfigMap and Pods, and objects named by flags, are read wherever
/// they are.
#[derive(Debug, Clone, Default)]
pub struct NamespaceFilter {
    /// Empty: every namespace.
    pub allow: BTreeSet<String>,
    pub deny: BTreeSet<String>,
}

impl NamespaceFilter {
    pub fn admits(&self, namespace: &str) -> bool {
        (self.allow.is_empty() || self.allow.contains(namespace)) && !self.deny.contains(namespace)
    }
}

/// One watch: a kind, optionally narrowed to a namespace and selectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub field_selector: Option<String>,
    pub label_selector: Option<String>,
    /// Whether objects pass through the namespace filter (cluster-wide watches do).
    pub filtered: bool,
    /// The API version to watch when the API server serves another than [`api_resource`]'s
    /// (TLSRoute and TCPRoute at `v1alpha2`).
    pub version: Option<&'static str>,
}

impl WatchSpec {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            namespace: None,
            field_selector: None,
            label_selector: None,
            filtered: false,
            version: None,
        }
    }

    /// `Ingress (all namespaces)`, `ConfigMap in kube-system (metadata.name=portcullis)`.
    pub fn label(&self) -> String {
        let mut s = self.kind.as_str().to_string();
        match &self.namespace {
            Some(ns) => s.push_str(&format!(" in {ns}")),
            None if self.kind.namespaced() => s.push_str(" (all namespaces)"),
            None => {}
        }
        if let Some(f) = &self.field_selector {
            s.push_str(&format!(" ({f})"));
        }
        // Only narrowed watches name their label selector (the EndpointSlices of one Service).
        if let Some(l) = self.label_selector.as_deref().filter(|l| l.contains('=')) {
            s.push_str(&format!(" ({l})"));
        }
        s
    }
}

/// What the controller asks to be watched.
#[derive(Debug, Clone, Default)]
pub struct WatchPlan {
    pub namespaces: NamespaceFilter,
    /// ConfigMaps named by flags (the controller ConfigMap, `--configmap-errorfiles`,
    /// `--configmap-tcp-services`, `--configmap-patternfiles`), each watched by name.
    pub config_maps: Vec<Key>,
    /// Where the controller's own Pods live (peers).
    pub pod_namespace: Option<String>,
    pub tcp: bool,
    /// The incumbent's Backend, Defaults and Global resources to watch (those served).
    pub resources: Vec<Kind>,
    /// The Gateway API kinds to watch (those served), and `Namespace` with them.
    pub gateway_api: Vec<Kind>,
    /// The kinds served at another version than [`api_resource`]'s.
    pub gateway_api_versions: ApiVersions,
    /// Services and Secrets named by flags (default backend, publish service, default
    /// certificate): watched by name when the namespace filter would hide them.
    pub named_services: Vec<Key>,
    pub named_secrets: Vec<Key>,
}

impl WatchPlan {
    /// The watches: per allowed namespace when there is an allow list (so namespaced RBAC is
    /// enough), else cluster-wide with the deny list applied on receipt.
    pub fn watches(&self) -> Vec<WatchSpec> {
        let mut kinds = vec![
            Kind::Ingress,
            Kind::Service,
            Kind::EndpointSlice,
            Kind::Secret,
        ];
        if self.tcp {
            kinds.push(Kind::Tcp);
        }
        kinds.extend(self.resources.iter().copied());
        let mut specs = vec![WatchSpec::new(Kind::IngressClass)];
        for kind in &self.gateway_api {
            if kind.namespaced() {
                kinds.push(*kind);
            } else {
                specs.push(WatchSpec::new(*kind));
            }
        }
        for kind in kinds {
            let label_selector =
                (kind == Kind::EndpointSlice).then(|| SERVICE_NAME_LABEL.to_string());
            if self.namespaces.allow.is_empty() {
                specs.push(WatchSpec {
                    label_selector,
                    filtered: true,
                    ..WatchSpec::new(kind)
                });
            } else {
                for ns in &self.namespaces.allow {
                    if self.namespaces.admits(ns) {
                        specs.push(WatchSpec {
                            namespace: Some(ns.clone()),
                            label_selector: label_selector.clone(),
                            filtered: true,
                            ..WatchSpec::new(kind)
                        });
                    }
                }
            }
        }
        let by_name = |kind: Kind, key: &Key| WatchSpec {
            namespace: Some(key.namespace.clone()),
            field_selector: Some(format!("metadata.name={}", key.name)),
            ..WatchSpec::new(kind)
        };
        let mut named: BTreeSet<(Kind, &Key)> = BTreeSet::new();
        for key in &self.named_services {
            if !self.namespaces.admits(&key.namespace) && named.insert((Kind::Service, key)) {
                specs.push(by_name(Kind::Service, key));
                // A named Service needs its endpoints too.
                specs.push(WatchSpec {
                    namespace: Some(key.namespace.clone()),
                    label_selector: Some(format!("{SERVICE_NAME_LABEL}={}", key.name)),
                    ..WatchSpec::new(Kind::EndpointSlice)
                });
            }
        }
        for key in &self.named_secrets {
            if !self.namespaces.admits(&key.namespace) && named.insert((Kind::Secret, key)) {
                specs.push(by_name(Kind::Secret, key));
            }
        }
        let mut config_maps: Vec<&Key> = self.config_maps.iter().collect();
        config_maps.sort();
        config_maps.dedup();
        for key in config_maps {
            specs.push(by_name(Kind::ConfigMap, key));
        }
        if let Some(ns) = &self.pod_namespace {
            specs.push(WatchSpec {
                namespace: Some(ns.clone()),
                ..WatchSpec::new(Kind::Pod)
            });
        }
        for spec in &mut specs {
            spec.version = self.gateway_api_versions.get(&spec.kind).copied();
        }
        specs
    }
}

/// Kinds the API server serves at another version than [`api_resource`] names.
pub type ApiVersions = std::collections::BTreeMap<Kind, &'static str>;

/// [`api_resource`] at the version the API server serves, when `versions` names one.
pub fn api_resource_at(kind: Kind, versions: &ApiVersions) -> ApiResource {
    let mut resource = api_resource(kind);
    if let Some(v) = versions.get(&kind) {
        resource.version = v.to_string();
        resource.api_version = format!("{}/{v}", resource.group);
    }
    resource
}

/// The API resource of a kind.
pub fn api_resource(kind: Kind) -> ApiResource {
    use portcullis_core::objects::gateway::GATEWAY_GROUP;
    let (group, version, plural) = match kind {
        Kind::Ingress => ("networking.k8s.io", "v1", "ingresses"),
        Kind::IngressClass => ("networking.k8s.io", "v1", "ingressclasses"),
        Kind::Service => ("", "v1", "services"),
        Kind::EndpointSlice => ("discovery.k8s.io", "v1", "endpointslices"),
        Kind::Secret => ("", "v1", "secrets"),
        Kind::ConfigMap => ("", "v1", "configmaps"),
        Kind::Pod => ("", "v1", "pods"),
        Kind::Tcp => ("ingress.v3.haproxy.org", "v3", "tcps"),
        Kind::Backend => ("ingress.v3.haproxy.org", "v3", "backends"),
        Kind::Defaults => ("ingress.v3.haproxy.org", "v3", "defaults"),
        Kind::Global => ("ingress.v3.haproxy.org", "v3", "globals"),
        Kind::GatewayClass => (GATEWAY_GROUP, "v1", "gatewayclasses"),
        Kind::Gateway => (GATEWAY_GROUP, "v1", "gateways"),
        Kind::HttpRoute => (GATEWAY_GROUP, "v1", "httproutes"),
        // Served as v1beta1 by every standard-channel release.
        Kind::ReferenceGrant => (GATEWAY_GROUP, "v1beta1", "referencegrants"),
        // Standard (v1) since Gateway API v1.6; `v1alpha2` before (see `api_resource_at`).
        Kind::TlsRoute => (GATEWAY_GROUP, "v1", "tlsroutes"),
        Kind::TcpRoute => (GATEWAY_GROUP, "v1", "tcproutes"),
        Kind::Namespace => ("", "v1", "namespaces"),
    };
    ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.as_str().to_string(),
        plural: plural.to_string(),
    }
}

/// The health of one watch, for readiness, metrics and start-up.
#[derive(Debug, Clone)]
pub struct WatchHealth {
    pub label: String,
    pub kind: Kind,
    /// Has listed everything at least once.
    pub synced: bool,
    /// Since when the watch has been failing (cleared by the next event or relist).
    pub failing_since: Option<Instant>,
    pub last_error: Option<String>,
    pub errors: u64,
    /// An error retrying cannot fix (401, 403, 404), seen before the first sync.
    pub permanent: Option<String>,
}

/// The cluster's objects as the watches last saw them, shared by the watch tasks (writers)
/// and the controller loop (which takes snapshots).
#[derive(Debug)]
pub struct ClusterState {
    inner: Mutex<Inner>,
    changed: mpsc::UnboundedSender<Instant>,
    progress: Notify,
    namespaces: NamespaceFilter,
}

#[derive(Debug, Default)]
struct Inner {
    store: Store,
    /// Objects that could not be read, with why; replaced when the object changes.
    rejected: BTreeMap<(Kind, Key), Diagnostic>,
    watches: Vec<WatchHealth>,
}

impl ClusterState {
    /// Starts one watcher task per spec. Every change to the store sends the time on `changed`.
    pub fn start(
        client: &kube::Client,
        plan: &WatchPlan,
        changed: mpsc::UnboundedSender<Instant>,
    ) -> (Arc<Self>, Vec<tokio::task::JoinHandle<()>>) {
        let specs = plan.watches();
        let state = Arc::new(Self {
            inner: Mutex::new(Inner {
                watches: specs
                    .iter()
                    .map(|s| WatchHealth {
                        label: s.label(),
                        kind: s.kind,
                        synced: false,
                        failing_since: None,
                        last_error: None,
                        errors: 0,
                        permanent: None,
                    })
                    .collect(),
                ..Inner::default()
            }),
            changed,
            progress: Notify::new(),
            namespaces: plan.namespaces.clone(),
        });
        let tasks = specs
            .into_iter()
            .enumerate()
            .map(|(index, spec)| tokio::spawn(reflect(state.clone(), client.clone(), index, spec)))
            .collect();
        (state, tasks)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters more than stopping would: keep going with what is there.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the store and the objects that could not be read.
    pub fn snapshot(&self) -> (Store, Vec<Diagnostic>) {
        let inner = self.lock();
        (
            inner.store.clone(),
            inner.rejected.values().cloned().collect(),
        )
    }

    pub fn health(&self) -> Vec<WatchHealth> {
        self.lock().watches.clone()
    }

    /// Waits until every watch has listed once. Returns the first permanent error seen before
    /// that, as soon as it is seen.
    pub async fn wait_synced(&self) -> Result<(), String> {
        loop {
            let notified = self.progress.notified();
            {
                let inner = self.lock();
                if let Some(w) = inner.watches.iter().find(|w| w.permanent.is_some()) {
                    return Err(format!(
                        "watching {}: {}",
                        w.label,
                        w.permanent.clone().unwrap_or_default()
                    ));
                }
                if inner.watches.iter().all(|w| w.synced) {
                    return Ok(());
                }
            }
            notified.await;
        }
    }

    /// The watches not yet synced and their last errors, for the start-up timeout message.
    pub fn unsynced(&self) -> Vec<String> {
        self.lock()
            .watches
            .iter()
            .filter(|w| !w.synced)
            .map(|w| match &w.last_error {
                Some(e) => format!("{}: {e}", w.label),
                None => format!("{}: no answer yet", w.label),
            })
            .collect()
    }

    fn event(&self, index: usize, apply: impl FnOnce(&mut Inner)) {
        {
            let mut inner = self.lock();
            apply(&mut inner);
            if let Some(w) = inner.watches.get_mut(index) {
                if w.failing_since.take().is_some() {
                    tracing::info!(watch = %w.label, "watch resumed");
                }
            }
        }
        let _ = self.changed.send(Instant::now());
        self.progress.notify_waiters();
    }

    fn failed(&self, index: usize, error: &watcher::Error) {
        let message = error_chain(error);
        let permanent = match error {
            watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
                if is_permanent_status(s.code) =>
            {
                Some(format!("{} {} ({})", s.code, s.reason, s.message))
            }
            _ => None,
        };
        let mut inner = self.lock();
        let Some(w) = inner.watches.get_mut(index) else {
            return;
        };
        w.errors += 1;
        w.last_error = Some(message.clone());
        if w.failing_since.is_none() {
            // Once per outage at warn; the retries that follow at debug.
            tracing::warn!(watch = %w.label, "watch failed, retrying with backoff: {message}");
            w.failing_since = Some(Instant::now());
        } else {
            tracing::debug!(watch = %w.label, "watch still failing: {message}");
        }
        if !w.synced && permanent.is_some() {
            w.permanent = permanent;
        }
        drop(inner);
        self.progress.notify_waiters();
    }
}

/// Turns a watched object into a store object: the kind's apiVersion and kind are filled in
/// (list items carry neither) and it is parsed like a manifest.
fn to_object(
    kind: Kind,
    resource: &ApiResource,
    object: &DynamicObject,
) -> Result<Object, Diagnostic> {
    let key = Key::new(
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default(),
    );
    let reject = |message: String| Diagnostic {
        severity: Severity::Error,
        subject: Subject::Object(ObjectRef::new(kind, &key)),
        field: None,
        message,
    };
    let mut value = serde_json::to_value(object).map_err(|e| reject(e.to_string()))?;
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), resource.api_version.clone().into());
        map.insert("kind".into(), resource.kind.clone().into());
    }
    Object::from_value(value).map_err(|e| reject(format!("not read: {e}")))
}

fn key_of(object: &DynamicObject) -> Key {
    Key::new(
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default(),
    )
}

/// One watch: applies its events to the shared store until the task is aborted.
async fn reflect(state: Arc<ClusterState>, client: kube::Client, index: usize, spec: WatchSpec) {
    let mut resource = api_resource(spec.kind);
    if let Some(v) = spec.version {
        resource = api_resource_at(spec.kind, &ApiVersions::from([(spec.kind, v)]));
    }
    let api: Api<DynamicObject> = match &spec.namespace {
        Some(ns) if spec.kind.namespaced() => Api::namespaced_with(client, ns, &resource),
        _ => Api::all_with(client, &resource),
    };
    let config = watcher::Config {
        label_selector: spec.label_selector.clone(),
        field_selector: spec.field_selector.clone(),
        ..watcher::Config::default()
    };
    let admitted = |object: &DynamicObject| {
        !spec.filtered
            || !spec.kind.namespaced()
            || state
                .namespaces
                .admits(object.metadata.namespace.as_deref().unwrap_or_default())
    };
    let mut stream = watcher(api, config).default_backoff().boxed();
    // Keys this watch put in the store: a relist replaces exactly these.
    let mut known: BTreeSet<Key> = BTreeSet::new();
    let mut relist: Option<Vec<DynamicObject>> = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(watcher::Event::Init) => relist = Some(Vec::new()),
            Ok(watcher::Event::InitApply(object)) => {
                if admitted(&object) {
                    relist.get_or_insert_with(Vec::new).push(object);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let listed = relist.take().unwrap_or_default();
                let kind = spec.kind;
                let objects: Vec<(Key, Result<Object, Diagnostic>)> = listed
                    .into_iter()
                    .map(|o| (key_of(&o), to_object(kind, &resource, &o)))
                    .collect();
                let gone: Vec<Key> = {
                    let listed: BTreeSet<&Key> = objects.iter().map(|(k, _)| k).collect();
                    known
                        .iter()
                        .filter(|k| !listed.contains(k))
                        .cloned()
                        .collect()
                };
                known = objects.iter().map(|(k, _)| k.clone()).collect();
                state.event(index, |inner| {
                    for key in gone {
                        inner.store.delete(kind, &key);
                        inner.rejected.remove(&(kind, key));
                    }
                    for (key, object) in objects {
                        put(inner, kind, key, object);
                    }
                    if let Some(w) = inner.watches.get_mut(index) {
                        if !w.synced {
                            tracing::info!(watch = %w.label, objects = known.len(), "watch synced");
                        }
                        w.synced = true;
                    }
                });
            }
            Ok(watcher::Event::Apply(object)) => {
                if !admitted(&object) {
                    continue;
                }
                let key = key_of(&object);
                known.insert(key.clone());
                let object = to_object(spec.kind, &resource, &object);
                state.event(index, |inner| put(inner, spec.kind, key, object));
            }
            Ok(watcher::Event::Delete(object)) => {
                let key = key_of(&object);
                if known.remove(&key) {
                    state.event(index, |inner| {
                        inner.store.delete(spec.kind, &key);
                        inner.rejected.remove(&(spec.kind, key));
                    });
                }
            }
            Err(e) => state.failed(index, &e),
        }
    }
}

fn put(inner: &mut Inner, kind: Kind, key: Key, object: Result<Object, Diagnostic>) {
    match object {
        Ok(object) => {
            inner.store.upsert(object);
            inner.rejected.remove(&(kind, key));
        }
        Err(diagnostic) => {
            // Nothing half-read reaches the store; the reason is reported on the object.
            inner.store.delete(kind, &key);
            inner.rejected.insert((kind, key), diagnostic);
        }
    }
}

/// How long each watch has been failing, for the stale-data metric (0 when healthy).
pub fn staleness(health: &[WatchHealth], now: Instant) -> Vec<(String, Duration)> {
    health
        .iter()
        .map(|w| {
            (
                w.label.clone(),
                w.failing_since
                    .map_or(Duration::ZERO, |since| now.saturating_duration_since(since)),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(allow: &[&str], deny: &[&str]) -> WatchPlan {
        WatchPlan {
            namespaces: NamespaceFilter {
                allow: allow.iter().map(|s| s.to_string()).collect(),
                deny: deny.iter().map(|s| s.to_string()).collect(),
            },
            config_maps: vec![
                Key::new("ingress", "portcullis"),
                Key::new("ingress", "tcp-services"),
                Key::new("ingress", "portcullis"),
            ],
            pod_namespace: Some("ingress".into()),
            tcp: true,
            resources: Vec::new(),
            gateway_api: Vec::new(),
            gateway_api_versions: ApiVersions::new(),
            named_services: vec![Key::new("ingress", "default-backend")],
            named_secrets: vec![Key::new("web", "default-cert")],
        }
    }

    fn labels(plan: &WatchPlan) -> Vec<String> {
        plan.watches().iter().map(WatchSpec::label).collect()
    }

    #[test]
    fn cluster_wide_by_default_with_own_objects_by_name() {
        assert_eq!(
            labels(&plan(&[], &[])),
            [
                "IngressClass",
                "Ingress (all namespaces)",
                "Service (all namespaces)",
                "EndpointSlice (all namespaces)",
                "Secret (all namespaces)",
                "TCP (all namespaces)",
                "ConfigMap in ingress (metadata.name=portcullis)",
                "ConfigMap in ingress (metadata.name=tcp-services)",
                "Pod in ingress",
            ]
        );
    }

    #[test]
    fn an_allow_list_watches_each_namespace_and_names_what_lies_outside() {
        assert_eq!(
            labels(&plan(&["web", "shop"], &["shop"])),
            [
                "IngressClass",
                "Ingress in web",
                "Service in web",
                "EndpointSlice in web",
                "Secret in web",
                "TCP in web",
                "Service in ingress (metadata.name=default-backend)",
                "EndpointSlice in ingress (kubernetes.io/service-name=default-backend)",
                "ConfigMap in ingress (metadata.name=portcullis)",
                "ConfigMap in ingress (metadata.name=tcp-services)",
                "Pod in ingress",
            ]
        );
    }

    #[test]
    fn the_deny_list_wins() {
        let f = NamespaceFilter {
            allow: BTreeSet::new(),
            deny: ["kube-system".to_string()].into(),
        };
        assert!(f.admits("web"));
        assert!(!f.admits("kube-system"));
    }

    #[test]
    fn list_items_without_kind_are_read_like_manifests() {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "7",
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"ports": [{"port": 80}]}
        }))
        .unwrap_or_else(|e| unreachable!("{e}"));
        let resource = api_resource(Kind::Service);
        match to_object(Kind::Service, &resource, &object) {
            Ok(Object::Service(s)) => {
                assert_eq!(s.metadata.name.as_deref(), Some("web"));
                assert!(
                    s.metadata.managed_fields.is_none(),
                    "managedFields stripped"
                );
            }
            other => unreachable!("{other:?}"),
        }
        let bad: DynamicObject = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "Bad_Name", "namespace": "shop"},
        }))
        .unwrap_or_else(|e| unreachable!("{e}"));
        let err = to_object(Kind::Service, &resource, &bad).err();
        assert!(
            err.as_ref()
                .is_some_and(|d| d.to_string().contains("Service shop/Bad_Name")),
            "{err:?}"
        );
    }
}
