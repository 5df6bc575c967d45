//! Writing back to the cluster: Ingress status and Events, on the leader only.
//!
//! Every replica renders and serves on its own; only what other people read (the address in
//! `kubectl get ingress`, the reasons in `kubectl describe`) is written once, by the replica
//! holding the Lease. The controller loop hands over each state it applied; this task writes
//! what differs, retrying failed status writes on a timer.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::diagnostics::Diagnostic;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::translate::class::ClassFilter;

use super::events::EventRecorder;
use super::lease::{self, Elector, LeaseConfig};
use super::status::{self, Publish};

/// How often status is re-checked without a new state (a failed write is retried then).
const RETRY_EVERY: Duration = Duration::from_secs(30);
/// An unchanged rejected setting is reported again after this long.
const EVENT_REPEAT_AFTER: Duration = Duration::from_secs(600);

/// What the publisher needs besides the client.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    pub lease: LeaseConfig,
    pub publish: Option<Publish>,
    pub ingress_class: String,
    pub controller_class: String,
    pub watch_ingress_without_class: bool,
    /// `--gateway-controller-name`, and the ports Gateway listeners may be served on.
    pub gateway_controller_name: String,
    pub gateway_ports: crate::translate::gateway::ListenerPorts,
    /// Gateway API kinds served at another version than their default.
    pub gateway_api_versions: super::reflect::ApiVersions,
}

/// One applied state.
#[derive(Debug)]
struct Applied {
    store: Arc<Store>,
    diagnostics: Vec<Diagnostic>,
}

/// The running publisher: an election and the task that writes while leading.
#[derive(Debug)]
pub struct Publisher {
    elector: Elector,
    applied: watch::Sender<Option<Arc<Applied>>>,
    task: JoinHandle<()>,
}

impl Publisher {
    pub fn spawn(client: kube::Client, config: PublisherConfig, metrics: Arc<Metrics>) -> Self {
        let component = "portcullis";
        let recorder = EventRecorder::new(
            client.clone(),
            component,
            &config.lease.identity,
            EVENT_REPEAT_AFTER,
        );
        let elector = lease::spawn(client.clone(), config.lease.clone());
        let (applied, rx) = watch::channel(None);
        let task = tokio::spawn(run(
            client,
            config,
            elector.subscribe(),
            rx,
            recorder,
            metrics,
        ));
        Self {
            elector,
            applied,
            task,
        }
    }

    pub fn publish(&self, store: Arc<Store>, diagnostics: Vec<Diagnostic>) {
        self.applied
            .send_replace(Some(Arc::new(Applied { store, diagnostics })));
    }

    pub fn is_leader(&self) -> bool {
        self.elector.is_leader()
    }

    /// Stops writing, then releases the Lease.
    pub async fn shutdown(self) {
        self.task.abort();
        let _ = self.task.await;
        self.elector.release().await;
    }
}

async fn run(
    client: kube::Client,
    config: PublisherConfig,
    mut leader: watch::Receiver<bool>,
    mut applied: watch::Receiver<Option<Arc<Applied>>>,
    mut recorder: EventRecorder,
    metrics: Arc<Metrics>,
) {
    let mut retry = tokio::time::interval(RETRY_EVERY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut written = Written::new();
    let mut gateway_written = super::gateway_status::Written::new();
    let mut ours_before = std::collections::BTreeSet::new();
    loop {
        // Events are recorded for a new state or a new leader; a timer tick only re-checks
        // status.
        let record_events = tokio::select! {
            r = applied.changed() => {
                if r.is_err() {
                    return;
                }
                true
            }
            r = leader.changed() => {
                if r.is_err() {
                    return;
                }
                true
            }
            _ = retry.tick() => false,
        };
        if !*leader.borrow_and_update() {
            continue;
        }
        let Some(state) = applied.borrow_and_update().clone() else {
            continue;
        };
        if let Some(publish) = &config.publish {
            write_status(
                &client,
                &config,
                publish,
                &state.store,
                &metrics,
                (&mut written, &mut ours_before),
            )
            .await;
        }
        if state
            .store
            .gateway_api(crate::objects::Kind::Gateway)
            .is_empty()
            && state
                .store
                .gateway_api(crate::objects::Kind::GatewayClass)
                .is_empty()
        {
            gateway_written.clear();
        } else {
            let addresses = config
                .publish
                .as_ref()
                .map(|p| status::publish_addresses(p, &state.store))
                .unwrap_or_default();
            let (ok, failed) = super::gateway_status::publish(
                &client,
                &state.store,
                &config.gateway_controller_name,
                (&config.gateway_ports, &config.gateway_api_versions),
                &addresses,
                &mut gateway_written,
            )
            .await;
            metrics.status_writes.inc_by(&["ok"], ok as u64);
            metrics.status_writes.inc_by(&["error"], failed as u64);
            if ok + failed > 0 {
                tracing::info!(written = ok, failed, "Gateway API status updated");
            }
        }
        if record_events {
            let stats = recorder.record(&state.diagnostics, &state.store).await;
            metrics.events.inc_by(&["emitted"], stats.emitted as u64);
            metrics
                .events
                .inc_by(&["suppressed"], stats.suppressed as u64);
            metrics.events.inc_by(&["failed"], stats.failed as u64);
        }
    }
}

/// What this replica wrote to each Ingress' status, with the resourceVersion its store had
/// then: until the store shows a newer version, the Ingress is not written again with the
/// same addresses (the watch has not brought our own write back yet).
type Written = std::collections::HashMap<
    crate::objects::Key,
    (
        Option<String>,
        Vec<k8s_openapi::api::networking::v1::IngressLoadBalancerIngress>,
    ),
>;

async fn write_status(
    client: &kube::Client,
    config: &PublisherConfig,
    publish: &Publish,
    store: &Store,
    metrics: &Metrics,
    (written, ours_before): (
        &mut Written,
        &mut std::collections::BTreeSet<crate::objects::Key>,
    ),
) {
    let addresses = status::publish_addresses(publish, store);
    if addresses.is_empty() {
        // The publish Service has no address yet: better no status than an empty one.
        tracing::debug!("no address to publish yet");
        return;
    }
    let classes = ClassFilter::new(
        store,
        &config.ingress_class,
        &config.controller_class,
        config.watch_ingress_without_class,
    );
    let versions: std::collections::HashMap<&crate::objects::Key, Option<String>> = store
        .ingresses()
        .map(|(key, i)| (key, i.metadata.resource_version.clone()))
        .collect();
    let version = |key: &crate::objects::Key| versions.get(key).cloned().flatten();
    let released = status::released(store, &classes, &addresses, ours_before);
    *ours_before = status::ours(store, &classes);
    let updates: Vec<_> = status::updates(store, &classes, &addresses)
        .into_iter()
        .chain(released)
        .filter(|u| {
            let now = version(&u.key);
            now.is_none() || written.get(&u.key) != Some(&(now, u.ingress.clone()))
        })
        .collect();
    written.retain(|key, _| versions.contains_key(key));
    if updates.is_empty() {
        return;
    }
    let failed = status::write(client, &updates).await;
    for update in &updates {
        if !failed.iter().any(|(key, _)| *key == update.key) {
            written.insert(
                update.key.clone(),
                (version(&update.key), update.ingress.clone()),
            );
        }
    }
    for (key, e) in &failed {
        // A failed release is tried again at the next write, as a failed update is.
        if updates
            .iter()
            .any(|u| u.key == *key && u.ingress.is_empty())
        {
            ours_before.insert(key.clone());
        }
        tracing::warn!(ingress = %key, "writing Ingress status failed (retried): {e}");
    }
    metrics
        .status_writes
        .inc_by(&["ok"], (updates.len() - failed.len()) as u64);
    metrics
        .status_writes
        .inc_by(&["error"], failed.len() as u64);
    tracing::info!(
        written = updates.len() - failed.len(),
        failed = failed.len(),
        "Ingress status updated"
    );
}
