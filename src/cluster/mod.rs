//! The cluster source and the cluster side effects: connecting to the Kubernetes API server
//! (with start-up retries), reflecting the watched kinds into the store, leader election,
//! Ingress status and Events.
pub mod api_errors;
pub mod connect;
pub mod events;
pub mod gateway_status;
pub mod lease;
pub mod publish;
pub mod reflect;
pub mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::diagnostics::Diagnostic;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::translate::TranslateConfig;

use connect::{ConnectConfig, Connected, Deadline, StartupError};
use reflect::{ClusterState, NamespaceFilter, WatchPlan};

/// How the cluster source is set up; built from flags.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub connect: ConnectConfig,
    pub namespaces: NamespaceFilter,
    pub publish: Option<status::Publish>,
    /// The Lease's name (`--election-id`).
    pub election_id: String,
    pub lease_duration: Duration,
}

/// A connected, synced cluster source and its side effects (leader election, status, Events).
pub struct Cluster {
    pub connected: Connected,
    pub state: Arc<ClusterState>,
    watches: Vec<tokio::task::JoinHandle<()>>,
    publisher: publish::Publisher,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("connected", &self.connected)
            .finish_non_exhaustive()
    }
}

/// Connects, starts every watch and waits until each has listed, all within
/// `--startup-timeout`. Store changes are signalled on `changed`.
pub async fn start(
    config: &ClusterConfig,
    translate: &TranslateConfig,
    changed: mpsc::UnboundedSender<Instant>,
    metrics: Arc<Metrics>,
) -> Result<Cluster, StartupError> {
    let deadline = Deadline::new(config.connect.startup_timeout);
    let connected = connect::connect(&config.connect, deadline).await?;
    let identity = &translate.identity;
    let mut named_services: Vec<_> = translate.default_backend_service.iter().cloned().collect();
    if let Some(status::Publish::Service(key)) = &config.publish {
        named_services.push(key.clone());
    }
    let plan = WatchPlan {
        namespaces: config.namespaces.clone(),
        config_maps: translate
            .config_map
            .iter()
            .chain(&translate.errorfiles_config_map)
            .chain(&translate.tcp_services_config_map)
            .chain(&translate.patternfiles_config_map)
            .cloned()
            .collect(),
        pod_namespace: identity.pod_namespace.clone(),
        tcp: connected.tcp_crd_present,
        resources: connected.resources_present.clone(),
        gateway_api: connected.gateway_api_present.clone(),
        gateway_api_versions: connected.gateway_api_versions.clone(),
        named_services,
        named_secrets: translate
            .default_ssl_certificate
            .iter()
            .chain(&translate.dynamic_cookie_key_secret)
            .cloned()
            .collect(),
    };
    let (state, watches) = ClusterState::start(&connected.client, &plan, changed);
    let synced = match deadline.remaining() {
        Some(left) => tokio::time::timeout(left, state.wait_synced()).await,
        None => Ok(state.wait_synced().await),
    };
    let failure = match synced {
        Ok(Ok(())) => None,
        Ok(Err(permanent)) => Some(StartupError::Permanent(format!(
            "{}: {permanent}",
            connected.server
        ))),
        Err(_) => Some(StartupError::Timeout(format!(
            "the Kubernetes API server {} answered but the watches did not list within --startup-timeout {}: {}",
            connected.server,
            deadline.describe(),
            state.unsynced().join("; ")
        ))),
    };
    if let Some(e) = failure {
        for w in &watches {
            w.abort();
        }
        return Err(e);
    }
    tracing::info!(
        elapsed_ms = deadline.elapsed().as_millis() as u64,
        watches = watches.len(),
        "every watch has listed the cluster"
    );
    let publisher = publish::Publisher::spawn(
        connected.client.clone(),
        publish::PublisherConfig {
            lease: lease_config(config, translate),
            publish: config.publish.clone(),
            ingress_class: translate.ingress_class.clone(),
            controller_class: translate.controller_class.clone(),
            watch_ingress_without_class: translate.watch_ingress_without_class,
            gateway_controller_name: translate.gateway_controller_name.clone(),
            gateway_ports: crate::translate::gateway::ListenerPorts::of(translate),
            gateway_api_versions: connected.gateway_api_versions.clone(),
        },
        metrics,
    );
    Ok(Cluster {
        connected,
        state,
        watches,
        publisher,
    })
}

/// The Lease lives in the controller's namespace and is held under the pod's name; outside a
/// cluster, under the host name and process id.
fn lease_config(config: &ClusterConfig, translate: &TranslateConfig) -> lease::LeaseConfig {
    let identity = translate.identity.pod_name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "portcullis".to_string());
        format!("{host}-{}", std::process::id())
    });
    let namespace = translate
        .identity
        .pod_namespace
        .clone()
        .unwrap_or_else(|| "default".to_string());
    let mut lease = lease::LeaseConfig::new(namespace, config.election_id.clone(), identity);
    lease.lease_duration = config.lease_duration;
    lease.renew_interval = config.lease_duration / 3;
    lease
}

impl Cluster {
    /// Hands the state just applied to the publisher (status and Events, on the leader).
    pub fn publish(&self, store: Arc<Store>, diagnostics: Vec<Diagnostic>) {
        self.publisher.publish(store, diagnostics);
    }

    /// Updates the watch and leadership metrics; returns the readiness detail.
    pub fn observe(&self, metrics: &Metrics) -> serde_json::Value {
        let health = self.state.health();
        let now = Instant::now();
        let stale = reflect::staleness(&health, now);
        for ((label, age), w) in stale.iter().zip(&health) {
            metrics.watch_stale.set(&[label], age.as_secs_f64());
            metrics.watch_errors.set(&[label], w.errors as f64);
        }
        let leader = self.publisher.is_leader();
        metrics.leader.set(&[], if leader { 1.0 } else { 0.0 });
        let failing: Vec<serde_json::Value> = stale
            .iter()
            .zip(&health)
            .filter(|((_, age), _)| !age.is_zero())
            .map(|((label, age), w)| {
                serde_json::json!({
                    "watch": label,
                    "stale_seconds": age.as_secs(),
                    "last_error": w.last_error,
                })
            })
            .collect();
        serde_json::json!({
            "server": self.connected.server,
            "leader": leader,
            "watches": health.len(),
            "stale": failing,
        })
    }

    /// Stops the watches and, on the leader, releases the Lease so another replica takes
    /// over at once.
    pub async fn shutdown(self) {
        for w in &self.watches {
            w.abort();
        }
        self.publisher.shutdown().await;
    }
}
