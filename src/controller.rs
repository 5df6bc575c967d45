//! The controller loop behind `portcullis run`: watch the source, coalesce bursts of changes,
//! run the pipeline, apply the result, and report status through the admin endpoint.
//!
//! One task owns the store and the applier; the admin endpoint reads a [`Status`] snapshot.
//! Losing a change is impossible by construction: every apply starts from the complete current
//! state of the source, not from the events themselves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::admin::{self, AdminState};
use crate::apply::{Applied, Applier, ApplyError, Outcome, Supervision};
use crate::attribution::Quarantine;
use crate::diagnostics::{Severity, Subject};
use crate::external_names::Resolver;
use crate::haproxy::client::Client;
use crate::metrics::Metrics;
use crate::objects::Kind;
use crate::pipeline::{LoadError, Output, Pipeline, RunReport};
use crate::source::{files, watch};
use crate::store::Store;
use crate::translate::{RunInputs, TranslateConfig};

/// How long a run waits for ExternalName lookups, and how long their answers are used.
const EXTERNAL_NAME_WAIT: Duration = Duration::from_secs(2);
const EXTERNAL_NAME_TTL: Duration = Duration::from_secs(30);

/// Where the objects come from.
#[derive(Debug, Clone)]
pub enum SourceConfig {
    /// A directory of manifests, watched.
    Files(PathBuf),
    /// The Kubernetes API.
    Cluster(crate::cluster::ClusterConfig),
}

/// How a `run` is set up; built from flags.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub source: SourceConfig,
    pub scripts_dir: Option<PathBuf>,
    pub templates_dir: Option<PathBuf>,
    pub translate: crate::translate::TranslateConfig,
    pub haproxy_bin: String,
    pub config_dir: PathBuf,
    pub runtime_dir: PathBuf,
    /// Drive an HAProxy supervised by something else through this master CLI socket.
    pub external_master_socket: Option<PathBuf>,
    pub admin_addr: SocketAddr,
    /// `--debug-addr`: the debug pages' own listener (see [`admin::Surface::split`]).
    pub debug_addr: Option<SocketAddr>,
    pub debounce: Duration,
    /// `--server-drain-timeout`.
    pub drain_timeout: Duration,
}

/// Why `run` stopped other than by a requested shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Load(#[from] LoadError),
    #[error("HAProxy binary {bin:?} is not usable: {reason}")]
    HaproxyMissing { bin: String, reason: String },
    #[error("preparing {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("admin endpoint on {addr}: {source}")]
    AdminBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Watch(#[from] watch::WatchError),
    #[error("manifests: {0}")]
    Manifests(#[from] files::FilesError),
    #[error("HAProxy exited unexpectedly")]
    HaproxyExited,
    #[error("HAProxy did not start: {0}")]
    HaproxyStart(String),
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("starting the demo's echo backends: {0}")]
    DemoBackends(std::io::Error),
    /// The cluster could not be used and waiting will not help.
    #[error("{0}")]
    ClusterRefused(String),
    /// The cluster did not answer within `--startup-timeout`.
    #[error("{0}")]
    ClusterUnavailable(String),
}

impl From<crate::cluster::connect::StartupError> for RunError {
    fn from(e: crate::cluster::connect::StartupError) -> Self {
        use crate::cluster::connect::StartupError;
        match e {
            StartupError::Permanent(m) => RunError::ClusterRefused(m),
            StartupError::Timeout(m) => RunError::ClusterUnavailable(m),
        }
    }
}

/// The running source: what `compute` reads from.
enum Source {
    Files {
        dir: PathBuf,
        /// Files whose content did not change are not parsed again.
        cache: Arc<files::ParseCache>,
        /// The objects of the last read, kept so that the store's journal names what changed.
        store: Arc<std::sync::Mutex<Store>>,
        _watch: watch::DirWatch,
    },
    Cluster(Box<crate::cluster::Cluster>),
}

impl Source {
    /// What the pipeline runs on: a directory to read, or a copy of the cluster store.
    fn input(&self) -> SourceInput {
        match self {
            Source::Files {
                dir, cache, store, ..
            } => SourceInput::Files(dir.clone(), cache.clone(), store.clone()),
            Source::Cluster(c) => {
                let (store, diagnostics) = c.state.snapshot();
                SourceInput::Store(Box::new(store), diagnostics)
            }
        }
    }
}

enum SourceInput {
    Files(
        PathBuf,
        Arc<files::ParseCache>,
        Arc<std::sync::Mutex<Store>>,
    ),
    Store(Box<Store>, Vec<crate::diagnostics::Diagnostic>),
}

/// What the admin endpoint shows.
#[derive(Debug)]
pub struct Status {
    metrics: Arc<Metrics>,
    inner: RwLock<StatusInner>,
}

#[derive(Debug, Default)]
struct StatusInner {
    /// Set once the first configuration is serving; never unset by later failures.
    ready: bool,
    last_error: Option<String>,
    /// Site scripts/templates that failed to load or render; the previous ones are in force.
    site_error: Option<String>,
    last_outcome: Option<String>,
    diagnostics: usize,
    /// Manifest files and documents that do not parse (their last good objects stay in
    /// force), as diagnostic lines; the first few.
    source_errors: Vec<String>,
    /// The configuration last applied, for `/debug/config` and `/debug/model`: shown (redacted,
    /// serialized) on request, since at 10 000 Ingresses that is tens of megabytes of text.
    applied: Option<(crate::model::Model, crate::render::RenderedConfig)>,
    /// The cluster source's watches and leadership, when running against a cluster.
    cluster: Option<serde_json::Value>,
}

impl Status {
    fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            inner: RwLock::new(StatusInner::default()),
        }
    }

    fn update(&self, f: impl FnOnce(&mut StatusInner)) {
        if let Ok(mut inner) = self.inner.write() {
            f(&mut inner);
        }
    }
}

impl AdminState for Status {
    fn readiness(&self) -> Result<serde_json::Value, serde_json::Value> {
        let Ok(inner) = self.inner.read() else {
            return Err(serde_json::json!({"ready": false, "reason": "status unavailable"}));
        };
        let detail = serde_json::json!({
            "ready": inner.ready,
            "last_error": inner.last_error,
            "site_error": inner.site_error,
            "last_outcome": inner.last_outcome,
            "diagnostics": inner.diagnostics,
            "source_errors": inner.source_errors,
            "cluster": inner.cluster,
        });
        if inner.ready {
            Ok(detail)
        } else {
            let mut detail = detail;
            detail["reason"] = serde_json::json!(
                inner
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "no configuration applied yet".to_string())
            );
            Err(detail)
        }
    }

    fn metrics(&self) -> String {
        self.metrics.render()
    }

    fn config(&self) -> Option<String> {
        let rendered = self.inner.read().ok()?.applied.as_ref()?.1.clone();
        Some(crate::translate::auth::redact_config(
            &rendered.haproxy_cfg(),
        ))
    }

    fn model(&self) -> Option<String> {
        let model = self.inner.read().ok()?.applied.as_ref()?.0.clone();
        // Without password hashes (basic-auth userlists).
        serde_json::to_string_pretty(&crate::translate::auth::redacted(&model)).ok()
    }
}

/// Runs until SIGTERM or SIGINT (then returns Ok after stopping HAProxy) or a fatal error.
pub async fn run(config: RunConfig) -> Result<(), RunError> {
    check_haproxy_binary(&config.haproxy_bin).await?;
    for dir in [&config.config_dir, &config.runtime_dir] {
        std::fs::create_dir_all(dir).map_err(|source| RunError::Directory {
            path: dir.clone(),
            source,
        })?;
    }
    let admin_socket = config.runtime_dir.join("admin.sock");
    let translate = translate_config(&config, &admin_socket);
    let mut in_force = CertificatesInForce::default();
    let resolver = translate
        .exposure
        .allow_external_name_services
        .then(|| Arc::new(Resolver::new(EXTERNAL_NAME_WAIT, EXTERNAL_NAME_TTL)));
    let mut pipeline = Arc::new(crate::source::site::load_pipeline(
        config.scripts_dir.as_deref(),
        config.templates_dir.as_deref(),
        translate.clone(),
    )?);
    let metrics = Arc::new(Metrics::new());
    let status = Arc::new(Status::new(metrics.clone()));
    let admin = AdminTasks::start(&config, &status).await?;

    let mut expiry = CertificateExpiry::default();
    let mut applier = Applier::new(
        config.config_dir.clone(),
        config.haproxy_bin.clone(),
        supervision(&config),
        Client::new(&admin_socket, Duration::from_secs(5)),
        metrics.clone(),
    )
    .with_drain_timeout(config.drain_timeout);
    // Removed dynamic servers are deleted once drained, looked at this often.
    let mut drains = tokio::time::interval(Duration::from_millis(250));

    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate()).map_err(RunError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(RunError::Signals)?;

    let (changes_tx, mut changes) = mpsc::unbounded_channel::<Instant>();
    let started = start_source(
        &config,
        &translate,
        &changes_tx,
        &metrics,
        &status,
        (&mut sigterm, &mut sigint),
    );
    let source = match started.await {
        Ok(Some(source)) => source,
        Ok(None) => {
            admin.stop().await;
            return Ok(());
        }
        Err(e) => {
            admin.stop().await;
            return Err(e);
        }
    };
    let _ = changes_tx.send(Instant::now());
    // Site scripts and templates are hot: a change is compiled and test-rendered against the
    // live state; only then does it replace the version in force.
    let (site_tx, mut site_changes) = mpsc::unbounded_channel::<Instant>();
    let mut _site_watches = Vec::new();
    for dir in [&config.scripts_dir, &config.templates_dir]
        .into_iter()
        .flatten()
    {
        _site_watches.push(watch::watch_dir(
            dir,
            site_tx.clone(),
            Duration::from_secs(5),
        )?);
    }

    let mut health = tokio::time::interval(Duration::from_secs(1));
    // An owed reload (failed, or rejected by `haproxy -c`) is retried on every change, and
    // also on its own, with a growing pause, in case no change comes.
    let mut retry_pause = Duration::from_secs(5);
    let mut next_retry = Instant::now() + retry_pause;
    // ExternalName answers are looked up again once they are older than their TTL.
    let mut next_names_check = Instant::now() + EXTERNAL_NAME_TTL;

    // Objects HAProxy refused, left out until they change; and how many runs in a row have
    // left objects out.
    let mut quarantine = Quarantine::default();
    let mut attribution_rounds = 0;
    let result = loop {
        tokio::select! {
            _ = sigterm.recv() => break Ok(()),
            _ = sigint.recv() => break Ok(()),
            _ = drains.tick(), if applier.draining() => applier.drain().await,
            _ = health.tick() => {
                if let Source::Cluster(c) = &source {
                    let detail = c.observe(&metrics);
                    status.update(|s| s.cluster = Some(detail));
                }
                if applier.running().is_some() && !applier.haproxy_alive() {
                    break Err(RunError::HaproxyExited);
                }
                if resolver.as_ref().is_some_and(|r| r.has_names()) && Instant::now() >= next_names_check {
                    let _ = changes_tx.send(Instant::now());
                    next_names_check = Instant::now() + EXTERNAL_NAME_TTL;
                }
                if !applier.owes_reload() {
                    retry_pause = Duration::from_secs(5);
                    next_retry = Instant::now() + retry_pause;
                } else if Instant::now() >= next_retry {
                    let _ = changes_tx.send(Instant::now());
                    retry_pause = (retry_pause * 2).min(Duration::from_secs(60));
                    next_retry = Instant::now() + retry_pause;
                }
            }
            Some(first) = changes.recv() => {
                settle(&mut changes, first, config.debounce).await;
                match compute(source.input(), &pipeline, in_force.inputs(&applier), &metrics, &mut quarantine, resolver.as_ref()).await {
                    Ok((output, store)) => {
                        let diagnostics = output.diagnostics.clone();
                        match apply_output(output, &pipeline, &mut applier, &status, &metrics, &mut expiry, first, (&store, &mut quarantine, &mut in_force)).await {
                            Err(e) => break Err(e),
                            Ok(true) => again(&changes_tx, &mut attribution_rounds),
                            Ok(false) => attribution_rounds = 0,
                        }
                        if let (Source::Cluster(c), RunStore::Cluster(store)) = (&source, store) {
                            c.publish(store, diagnostics);
                        }
                    }
                    Err(e) => fail(&status, &metrics, e),
                }
            }
            Some(first) = site_changes.recv() => {
                settle(&mut site_changes, first, config.debounce).await;
                match crate::source::site::load_pipeline(config.scripts_dir.as_deref(), config.templates_dir.as_deref(), translate.clone()) {
                    Ok(mut candidate) => {
                        // Results of the scripts that did not change stay valid, and so do
                        // the translation's.
                        candidate.keep_memo_of(&pipeline);
                        let candidate = Arc::new(candidate);
                        // Objects left out for what the previous layers made of them (a
                        // site part HAProxy refused) get another chance with the new ones.
                        let mut fresh = Quarantine::default();
                        match compute(source.input(), &candidate, in_force.inputs(&applier), &metrics, &mut fresh, resolver.as_ref()).await {
                            Ok((output, store)) => {
                                tracing::info!("site scripts and templates reloaded");
                                status.update(|s| s.site_error = None);
                                pipeline = candidate;
                                quarantine = fresh;
                                match apply_output(output, &pipeline, &mut applier, &status, &metrics, &mut expiry, first, (&store, &mut quarantine, &mut in_force)).await {
                                    Err(e) => break Err(e),
                                    Ok(true) => again(&changes_tx, &mut attribution_rounds),
                                    Ok(false) => attribution_rounds = 0,
                                }
                            }
                            Err(e) => {
                                metrics.template_errors.inc(&[]);
                                site_failed(&status, format!("site scripts/templates not applied, the previous ones stay in force: {e}"));
                            }
                        }
                    }
                    Err(e) => {
                        match &e {
                            LoadError::Scripts(_) => metrics.script_errors.inc(&["(compile)"]),
                            LoadError::Templates(_) => metrics.template_errors.inc(&[]),
                        }
                        site_failed(&status, format!("site scripts/templates not applied, the previous ones stay in force: {e}"));
                    }
                }
            }
        }
    };
    tracing::info!("shutting down");
    if let Source::Cluster(c) = source {
        c.shutdown().await;
    }
    applier.shutdown().await;
    admin.stop().await;
    result
}

/// The translation settings of `run`: the flags' plus the runtime socket, and the listeners
/// no tenant's object may point HAProxy at.
fn translate_config(config: &RunConfig, admin_socket: &std::path::Path) -> TranslateConfig {
    let mut translate = config.translate.clone();
    translate.runtime_socket = Some(admin_socket.display().to_string());
    // No server and no TCP bind may take the controller's own listeners; in a cluster, no
    // endpoint may be on the node's local or metadata addresses or on this pod either.
    translate.exposure = translate
        .exposure
        .with_listeners(std::iter::once(config.admin_addr).chain(config.debug_addr));
    if matches!(config.source, SourceConfig::Cluster(_)) {
        translate.exposure = translate.exposure.in_cluster(translate.identity.pod_ip);
    }
    translate
}

/// The admin endpoint, and the debug pages when they have an address of their own, serving
/// until [`AdminTasks::stop`].
struct AdminTasks {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl AdminTasks {
    /// Binds the listeners (a taken address ends the start-up) and serves them.
    async fn start(config: &RunConfig, status: &Arc<Status>) -> Result<Self, RunError> {
        let listener = tokio::net::TcpListener::bind(config.admin_addr)
            .await
            .map_err(|source| RunError::AdminBind {
                addr: config.admin_addr,
                source,
            })?;
        let (admin_surface, debug) = admin::Surface::split(config.admin_addr, config.debug_addr);
        let debug_listener = match debug {
            Some((addr, surface)) => Some((
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| RunError::AdminBind { addr, source })?,
                surface,
            )),
            None => None,
        };
        let (stop, admin_stopped) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let mut tasks = vec![tokio::spawn(admin::serve(
            listener,
            status.clone(),
            admin_surface,
            stopped(admin_stopped.clone()),
        ))];
        tracing::info!(addr = %config.admin_addr, surface = ?admin_surface, "admin endpoint listening");
        if let Some((listener, surface)) = debug_listener {
            tracing::info!(addr = ?config.debug_addr, "debug endpoint listening");
            if config
                .debug_addr
                .is_some_and(|a| !a.ip().to_canonical().is_loopback())
            {
                tracing::warn!(addr = ?config.debug_addr, "the debug pages are served off loopback, without authentication");
            }
            tasks.push(tokio::spawn(admin::serve(
                listener,
                status.clone(),
                surface,
                stopped(admin_stopped),
            )));
        }
        Ok(Self { stop, tasks })
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Whether the controller starts HAProxy itself or drives one started by others.
fn supervision(config: &RunConfig) -> Supervision {
    match &config.external_master_socket {
        Some(path) => Supervision::External {
            master: Client::new(path, Duration::from_secs(5)),
        },
        None => Supervision::Managed {
            bin: config.haproxy_bin.clone(),
            master_socket: config.runtime_dir.join("master.sock"),
            process: None,
        },
    }
}

/// The source of objects, watched: the manifests directory, or the cluster once its first
/// lists are in. `None` when a shutdown was asked for during the cluster's start-up, which is
/// still a clean exit.
async fn start_source(
    config: &RunConfig,
    translate: &TranslateConfig,
    changes_tx: &mpsc::UnboundedSender<Instant>,
    metrics: &Arc<Metrics>,
    status: &Status,
    (sigterm, sigint): (
        &mut tokio::signal::unix::Signal,
        &mut tokio::signal::unix::Signal,
    ),
) -> Result<Option<Source>, RunError> {
    match &config.source {
        SourceConfig::Files(dir) => {
            // The manifests must be readable at start; later read errors keep the last good state.
            files::check_dir(dir)?;
            let watch = watch::watch_dir(dir, changes_tx.clone(), Duration::from_secs(5))?;
            Ok(Some(Source::Files {
                dir: dir.clone(),
                cache: Arc::default(),
                store: Arc::default(),
                _watch: watch,
            }))
        }
        SourceConfig::Cluster(cluster) => {
            status
                .update(|s| s.last_error = Some("connecting to the Kubernetes API server".into()));
            let started = tokio::select! {
                r = crate::cluster::start(cluster, translate, changes_tx.clone(), metrics.clone()) => r,
                _ = sigterm.recv() => return Ok(None),
                _ = sigint.recv() => return Ok(None),
            };
            let cluster = started?;
            status.update(|s| s.last_error = None);
            Ok(Some(Source::Cluster(Box::new(cluster))))
        }
    }
}

/// Asks for another run right away after objects or certificates were left out, up to
/// [`ATTRIBUTION_ROUNDS`] times in a row; past that, the owed reload's usual retries go on.
fn again(changes: &mpsc::UnboundedSender<Instant>, rounds: &mut u32) {
    *rounds += 1;
    if *rounds <= ATTRIBUTION_ROUNDS {
        let _ = changes.send(Instant::now());
    }
}

/// Coalesces a burst: waits until the source has been quiet for `debounce` since its last
/// change, but never longer than ten debounce periods after the first change. The quiet time
/// counts from when the changes happened (the times the notifications carry), so a change
/// noticed while the last apply was still finishing waits only what is left of its debounce.
/// Then takes every notification already queued: the run that follows reads the source as
/// it is now, so it covers them all. (Left queued, they would each start another full run
/// after a slow one, long after the last change.)
async fn settle(
    changes: &mut mpsc::UnboundedReceiver<Instant>,
    first: Instant,
    debounce: Duration,
) {
    let cap = first + debounce * 10;
    let mut last = first;
    loop {
        let quiet = tokio::time::sleep_until((last + debounce).min(cap).into());
        tokio::select! {
            more = changes.recv() => match more {
                Some(at) if Instant::now() < cap => last = last.max(at),
                _ => break,
            },
            _ = quiet => break,
        }
    }
    while changes.try_recv().is_ok() {}
}

/// The certificates HAProxy holds, by Secret, for [`RunInputs`] (a Secret updated with
/// invalid data keeps the one in force): rebuilt only when they changed, since a large cluster
/// holds thousands. And the certificate files HAProxy refused, with its words: each run leaves
/// them out until their Secret's content changes (a new file) or the Secret goes.
#[derive(Debug, Default)]
struct CertificatesInForce {
    tls: Option<Arc<crate::model::Tls>>,
    by_secret: Arc<std::collections::BTreeMap<crate::objects::Key, crate::model::PemFile>>,
    refused: Arc<std::collections::BTreeMap<crate::model::CertPath, String>>,
    /// The ConfigMap's cipher lists HAProxy refused, left out while they keep that value.
    refused_tls_keys: Arc<crate::policy::global_keys::RefusedTlsKeys>,
}

impl CertificatesInForce {
    /// What the next run knows besides the store: the time, and these certificates.
    fn inputs(&mut self, applier: &Applier) -> RunInputs {
        let running = applier.running().map(|r| &r.model.tls);
        let same = match (&self.tls, running) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if !same {
            self.tls = running.cloned();
            self.by_secret = Arc::new(
                running
                    .map(|tls| {
                        tls.pem_files
                            .iter()
                            .map(|p| (p.path.secret().clone(), p.clone()))
                            .collect()
                    })
                    .unwrap_or_default(),
            );
        }
        RunInputs {
            now_unix: unix_now(),
            previous_certificates: self.by_secret.clone(),
            external_names: None,
            refused_certificates: self.refused.clone(),
            refused_tls_keys: self.refused_tls_keys.clone(),
        }
    }

    /// Notes the certificate files of `tls` that HAProxy's check `messages` name (the first
    /// line naming each). Whether there were any.
    fn refuse(&mut self, tls: &crate::model::Tls, messages: &[String]) -> bool {
        let named: Vec<(crate::model::CertPath, String)> = tls
            .pem_files
            .iter()
            .filter_map(|pem| {
                let line = messages.iter().find(|m| m.contains(pem.path.as_str()))?;
                Some((pem.path.clone(), line.trim().to_string()))
            })
            .collect();
        if named.is_empty() {
            return false;
        }
        Arc::make_mut(&mut self.refused).extend(named);
        true
    }

    /// Notes the cipher lists of `global` that HAProxy's check `messages` name. Whether there
    /// were any new ones.
    fn refuse_tls_keys(
        &mut self,
        global: &crate::model::GlobalSettings,
        messages: &[String],
    ) -> bool {
        let named = crate::policy::global_keys::refused_tls_keys(global, messages);
        let new: Vec<_> = named
            .into_iter()
            .filter(|(key, v)| self.refused_tls_keys.get(key) != Some(v))
            .collect();
        if new.is_empty() {
            return false;
        }
        Arc::make_mut(&mut self.refused_tls_keys).extend(new);
        true
    }

    /// Forgets the refusals of Secrets `store` no longer holds.
    fn forget_gone(&mut self, store: &Store) {
        if self
            .refused
            .keys()
            .any(|path| store.secret(path.secret()).is_none())
        {
            Arc::make_mut(&mut self.refused)
                .retain(|path, _| store.secret(path.secret()).is_some());
        }
    }
}

fn unix_now() -> Option<i64> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_secs()).ok())
}

/// The store a pipeline run read: the manifest directory's (shared with the source) or a copy
/// of the cluster's. Read again only when HAProxy refuses the result, to trace its verdict.
enum RunStore {
    Files(Arc<std::sync::Mutex<Store>>),
    Cluster(Arc<Store>),
}

impl RunStore {
    fn with<R>(&self, f: impl FnOnce(&Store) -> R) -> R {
        match self {
            RunStore::Files(store) => f(&store
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)),
            RunStore::Cluster(store) => f(store),
        }
    }
}

/// Runs the pipeline on the source's input, off the async threads, counting the run by path.
/// The objects `quarantine` holds are left out of the run (and reported).
async fn compute(
    input: SourceInput,
    pipeline: &Arc<Pipeline>,
    inputs: RunInputs,
    metrics: &Arc<Metrics>,
    quarantine: &mut Quarantine,
    resolver: Option<&Arc<Resolver>>,
) -> Result<(Output, RunStore), String> {
    let p = pipeline.clone();
    let metrics = metrics.clone();
    let resolver = resolver.cloned();
    let run = move |store: &Store| {
        // ExternalName names are resolved here, at the edge, with a bounded wait.
        let inputs = RunInputs {
            external_names: resolver.as_ref().map(|r| r.resolve(store)),
            ..inputs.clone()
        };
        let started = Instant::now();
        let result = p.run_with(store, &inputs);
        // A run that failed to render is counted too, as a full one.
        let report = result
            .as_ref()
            .map_or(RunReport::Full, |(_, report)| *report);
        let path = report.path();
        metrics.pipeline_runs.inc(&[path]);
        let took = started.elapsed().as_secs_f64();
        metrics.pipeline_duration.observe(&[path], took);
        let patched = report.patched();
        tracing::debug!(path, patched, run_ms = took * 1e3, "pipeline ran");
        result.map(|(output, _)| output).map_err(|e| e.to_string())
    };
    let mut held = std::mem::take(quarantine);
    let (result, held) = tokio::task::spawn_blocking(move || {
        let result = match input {
            SourceInput::Files(dir, cache, shared) => (|| {
                let started = Instant::now();
                let mut store = shared
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let problems =
                    files::sync_dir(&dir, &cache, &mut store).map_err(|e| e.to_string())?;
                tracing::debug!(
                    read_ms = started.elapsed().as_secs_f64() * 1e3,
                    "manifests read"
                );
                // Files read right after they were written are read again next time, unless
                // they are settled in between (off this path).
                cache.settle_later();
                let (mut left_out, _) = held.exclude(&mut store);
                let mut output = run(&store)?;
                drop(store);
                let mut diagnostics = problems.into_sorted();
                diagnostics.append(&mut left_out);
                diagnostics.append(&mut output.diagnostics);
                diagnostics.sort();
                output.diagnostics = diagnostics;
                Ok((output, RunStore::Files(shared)))
            })(),
            SourceInput::Store(mut store, mut diagnostics) => (|| {
                let (mut left_out, excluded) = held.exclude(&mut store);
                let mut output = run(&store)?;
                diagnostics.append(&mut left_out);
                diagnostics.append(&mut output.diagnostics);
                output.diagnostics = diagnostics;
                // Published with the objects left out, so that their Events reach them.
                for object in excluded {
                    store.upsert(object);
                }
                Ok((output, RunStore::Cluster(Arc::new(*store))))
            })(),
        };
        (result, held)
    })
    .await
    .map_err(|e| format!("pipeline task: {e}"))?;
    *quarantine = held;
    result
}

/// Applies a pipeline output and reports the outcome. Only a failure to start HAProxy at all
/// is fatal; every other failure keeps the running configuration and is retried. When HAProxy
/// refuses certificate files, they are noted in `in_force`, and when its verdict leads to
/// tenant objects, those are put in `quarantine`; then `true` is returned: the caller runs the
/// pipeline again without them.
#[allow(clippy::too_many_arguments)]
async fn apply_output(
    output: Output,
    pipeline: &Pipeline,
    applier: &mut Applier,
    status: &Status,
    metrics: &Metrics,
    expiry: &mut CertificateExpiry,
    first_event: Instant,
    (store, quarantine, in_force): (&RunStore, &mut Quarantine, &mut CertificatesInForce),
) -> Result<bool, RunError> {
    let started = Instant::now();
    let mut output = output;
    let next = Applied::following(
        output.model.clone(),
        output.rendered.clone(),
        &pipeline.renderer,
        applier.running(),
    );
    // With nothing running, the structure is first needed by the next change: it is rendered
    // while HAProxy starts.
    if applier.running().is_none() {
        next.render_structure_ahead();
    }
    tracing::debug!(
        following_ms = started.elapsed().as_secs_f64() * 1e3,
        "configuration prepared"
    );
    let result = applier.apply(next).await;
    store.with(|store| in_force.forget_gone(store));
    // HAProxy is the judge of certificates: one it refuses (a key that does not match, a
    // broken chain) is left out of the next run, which reports it on its Secret; the rest is
    // applied. This outcome is not reported: the next run's is.
    if let Err(ApplyError::CheckRejected(messages)) = &result {
        if in_force.refuse(&output.model.tls, messages) {
            return Ok(true);
        }
        // Likewise a cipher list the linked OpenSSL matches nothing with: the next run
        // leaves that key out and reports it on the ConfigMap.
        if in_force.refuse_tls_keys(&output.model.global, messages) {
            return Ok(true);
        }
    }
    let held = match &result {
        Err(
            ApplyError::CheckRejected(messages)
            | ApplyError::BindTaken(messages)
            | ApplyError::Reload {
                alerts: messages, ..
            },
        ) => {
            // A site template part's line HAProxy refused is the site's to fix: named with
            // its file and line, in /readyz until the site layers change.
            let parts = crate::attribution::site_parts(
                messages,
                &output.rendered,
                pipeline.renderer.templates(),
            );
            if let Some(first) = parts.first() {
                site_failed(status, first.to_string());
            }
            output.diagnostics.extend(parts);
            hold_culprits(messages, &mut output, store, quarantine)
        }
        _ => 0,
    };
    report_diagnostics(&output.diagnostics, metrics);
    let diagnostics = output.diagnostics.len();
    let source_errors = crate::source::source_errors(&output.diagnostics);
    status.update(|s| s.source_errors = source_errors);
    metrics
        .apply_duration
        .observe(&[], started.elapsed().as_secs_f64());
    match result {
        Ok(outcome) => {
            let (label, text) = match &outcome {
                Outcome::Unchanged => ("unchanged", "unchanged".to_string()),
                Outcome::Runtime { commands } => {
                    ("runtime", format!("{commands} runtime commands"))
                }
                Outcome::Reloaded { reasons } => {
                    ("reload", format!("reloaded: {}", reasons.join("; ")))
                }
            };
            if outcome != Outcome::Unchanged {
                tracing::info!(outcome = %text, "applied");
                metrics
                    .event_to_applied
                    .observe(&[], first_event.elapsed().as_secs_f64());
            }
            metrics.applies.inc(&[label]);
            metrics.last_applied_timestamp.set(
                &[],
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or_default(),
            );
            metrics.ready.set(&[], 1.0);
            // Reading every certificate's end date is worth it only when they changed.
            let same_certificates = status.inner.read().ok().is_some_and(|i| {
                i.applied
                    .as_ref()
                    .is_some_and(|(m, _)| Arc::ptr_eq(&m.tls, &output.model.tls))
            });
            if !same_certificates {
                metrics
                    .certificate_expiry
                    .replace_all(&expiry.read(&output.model.tls.pem_files));
            }
            status.update(|s| {
                s.ready = true;
                s.last_error = None;
                s.last_outcome = Some(text);
                s.diagnostics = diagnostics;
                s.applied = Some((output.model.clone(), output.rendered.clone()));
            });
        }
        Err(ApplyError::Start(e)) => return Err(RunError::HaproxyStart(e.to_string())),
        Err(e) => fail(status, metrics, e.to_string()),
    }
    Ok(held > 0)
}

/// How many times in a row a refused configuration may lead to objects left out and a new
/// run. HAProxy names one parse error per check, so each round finds one culprit or a few.
const ATTRIBUTION_ROUNDS: u32 = 16;

/// Traces HAProxy's refusal to tenant objects and holds them in `quarantine`, with an error
/// on each in `output`'s diagnostics. Returns how many were newly held.
fn hold_culprits(
    messages: &[String],
    output: &mut Output,
    store: &RunStore,
    quarantine: &mut Quarantine,
) -> usize {
    let tenant = |k: Kind| matches!(k, Kind::Ingress | Kind::Service | Kind::Tcp);
    store.with(|store| {
        let culprits = crate::attribution::culprits(messages, &output.rendered, &output.model, store);
        let mut held = 0;
        for culprit in culprits.iter().filter(|c| tenant(c.object.kind)) {
            if quarantine.hold(culprit, store) {
                held += 1;
                tracing::warn!(object = %culprit.object, "HAProxy refused what this object produced; left out until it changes");
            }
        }
        held
    })
}

/// The `notAfter` of the certificates last read, by file name. A certificate file's name
/// holds a digest of its content, so only new files are decoded: a Secret renewed among
/// thousands costs one decoding, not thousands.
#[derive(Debug, Default)]
struct CertificateExpiry(std::collections::HashMap<String, Option<i64>>);

impl CertificateExpiry {
    /// The `notAfter` of every certificate of `files`, labelled with its Secret
    /// (`namespace/name`), for `portcullis_certificate_expiry_timestamp_seconds`. Forgets the
    /// files no longer there.
    fn read(&mut self, files: &[crate::model::PemFile]) -> Vec<(Vec<String>, f64)> {
        let mut known = std::collections::HashMap::with_capacity(files.len());
        let mut expiry = Vec::new();
        for pem in files {
            let secret = pem.path.secret();
            let end = match self.0.remove(pem.path.as_str()) {
                Some(end) => end,
                None => crate::translate::tls::not_after(&pem.content),
            };
            if let Some(end) = end {
                expiry.push((vec![secret.to_string()], end as f64));
            }
            known.insert(pem.path.to_string(), end);
        }
        self.0 = known;
        expiry
    }
}

fn site_failed(status: &Status, error: String) {
    tracing::error!(error = %error, "site scripts/templates rejected");
    status.update(|s| s.site_error = Some(error));
}

fn fail(status: &Status, metrics: &Metrics, error: String) {
    tracing::error!(error = %error, "apply failed; HAProxy keeps its current configuration");
    // The report first: whoever sees the failure counted finds it in /readyz too.
    status.update(|s| s.last_error = Some(error));
    metrics.applies.inc(&["failed"]);
}

fn report_diagnostics(diagnostics: &[crate::diagnostics::Diagnostic], metrics: &Metrics) {
    let mut warnings = 0;
    let mut errors = 0;
    for d in diagnostics {
        match d.severity {
            Severity::Warning => warnings += 1,
            Severity::Error => errors += 1,
        }
        if let Subject::Source { file } = &d.subject {
            metrics.script_errors.inc(&[file.as_str()]);
        }
        tracing::warn!("{d}");
    }
    metrics
        .input_diagnostics
        .set(&["warning"], f64::from(warnings));
    metrics.input_diagnostics.set(&["error"], f64::from(errors));
}

/// Fails fast, with a clear message, when HAProxy cannot be run at all.
async fn check_haproxy_binary(bin: &str) -> Result<(), RunError> {
    let out = tokio::process::Command::new(bin)
        .arg("-v")
        .output()
        .await
        .map_err(|e| RunError::HaproxyMissing {
            bin: bin.to_string(),
            reason: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(RunError::HaproxyMissing {
            bin: bin.to_string(),
            reason: format!("`{bin} -v` exited with {}", out.status),
        });
    }
    let version = String::from_utf8_lossy(&out.stdout);
    tracing::info!(version = %version.lines().next().unwrap_or_default(), "using HAProxy");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate file is decoded when its name is new: a renewed Secret (a new name)
    /// is read again, a file gone is forgotten, and a name seen last time is not decoded.
    #[test]
    fn certificate_expiry_decodes_the_new_files_only() {
        use crate::model::PemFile;
        use crate::objects::Key;
        let key = Key::new("shop", "web-tls");
        let pem = |content: &str| PemFile {
            path: crate::translate::tls::file_path("certs", &key, content),
            content: content.into(),
        };
        let good = format!(
            "{}{}",
            include_str!("../tests/fixtures/tls/ec.crt"),
            include_str!("../tests/fixtures/tls/ec.key")
        );
        let end = crate::translate::tls::not_after(&good).unwrap() as f64;
        let series = |end: f64| vec![(vec!["shop/web-tls".to_string()], end)];
        let mut expiry = CertificateExpiry::default();
        assert_eq!(expiry.read(&[pem(&good)]), series(end));
        // Renewed with content that holds no certificate: a new name, decoded.
        assert_eq!(expiry.read(&[pem("not a certificate")]), vec![]);
        assert_eq!(expiry.read(&[pem(&good)]), series(end));
        // The same name is not decoded again (the content here could not be).
        let same_name = PemFile {
            path: pem(&good).path,
            content: "not a certificate".into(),
        };
        assert_eq!(expiry.read(std::slice::from_ref(&same_name)), series(end));
        // A file gone is forgotten.
        assert_eq!(expiry.read(&[]), vec![]);
        assert_eq!(expiry.read(&[same_name]), vec![]);
    }

    /// A run that took longer than the cap must not leave notifications behind, each of
    /// which would start another full run.
    #[tokio::test]
    async fn settling_takes_every_queued_notification() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let debounce = Duration::from_millis(10);
        let first = Instant::now() - Duration::from_secs(5);
        for _ in 0..50 {
            tx.send(Instant::now()).unwrap();
        }
        settle(&mut rx, first, debounce).await;
        assert!(rx.try_recv().is_err(), "notifications were left queued");
        // A quiet source settles after one debounce period.
        let started = Instant::now();
        settle(&mut rx, Instant::now(), debounce).await;
        assert!(started.elapsed() >= debounce);
    }

    /// The quiet period counts from the changes, not from when the loop got to them: a change
    /// made a debounce period ago, while the last apply was finishing, is taken at once; one
    /// made half a period ago waits the other half.
    #[tokio::test]
    async fn settling_counts_from_the_change() {
        let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
        // Long enough that a loaded machine's scheduling delays stay well inside the margins.
        let debounce = Duration::from_secs(1);
        let started = Instant::now();
        settle(&mut rx, started - debounce, debounce).await;
        assert!(started.elapsed() < debounce / 2, "{:?}", started.elapsed());
        let started = Instant::now();
        tx.send(started - debounce / 2).unwrap();
        settle(&mut rx, started - debounce, debounce).await;
        let waited = started.elapsed();
        assert!(
            waited >= debounce / 2 - Duration::from_millis(5),
            "{waited:?}"
        );
        assert!(waited < debounce, "{waited:?}");
    }
}
