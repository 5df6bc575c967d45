//! Apply: the only place that changes HAProxy.
//!
//! Each call moves HAProxy from the configuration it runs to a new one: through the runtime
//! API when the [`plan`] allows, otherwise by a checked, verified reload. Files are written
//! atomically; the configuration on disk always holds the complete desired state, so a reload
//! (ours or anyone's) loads exactly what runtime commands had set. Files are deleted only
//! after a successful reload of a configuration that no longer names them.

pub mod files;
pub use portcullis_core::plan;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::check::{self, CheckError};
use crate::haproxy::client::Client;
use crate::haproxy::process::{self, Haproxy, ProcessError};
use crate::metrics::Metrics;
use crate::render::CONFIG_FILE;

pub use plan::{Applied, Plan};

/// How long a reload may take to be confirmed.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long HAProxy may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The default of `--server-drain-timeout`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// After a drain's time is up and its streams are shut, how long idle connections HAProxy
/// keeps to the server may take to be purged before `del server` is given up on (the server
/// then stays in maintenance until the next reload, which leaves it out).
const DRAIN_PURGE_GRACE: Duration = Duration::from_secs(15);

/// What an apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Unchanged,
    /// Runtime API commands only.
    Runtime {
        commands: usize,
    },
    /// A verified reload (or the first start), with its reasons.
    Reloaded {
        reasons: Vec<String>,
    },
}

/// An apply failed; HAProxy keeps running what it ran before.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("HAProxy rejected the new configuration (nothing was reloaded):\n{}", .0.join("\n"))]
    CheckRejected(Vec<String>),
    #[error("checking the new configuration: {0}")]
    Check(CheckError),
    #[error(transparent)]
    Files(#[from] files::FilesError),
    #[error("starting HAProxy: {0}")]
    Start(ProcessError),
    /// Addresses the new configuration binds that something else holds: HAProxy's check
    /// passes such a bind, and then every reload fails. In HAProxy's own words, so that
    /// [`crate::attribution`] reads them like HAProxy's.
    #[error("the new configuration binds addresses in use (nothing was reloaded):\n{}", .0.join("\n"))]
    BindTaken(Vec<String>),
    #[error("reloading HAProxy ({reasons}): {source}{}", .alerts.iter().map(|a| format!("\n{a}")).collect::<String>())]
    Reload {
        reasons: String,
        source: ProcessError,
        /// HAProxy's `[ALERT]` lines written during the reload (a managed HAProxy only).
        alerts: Vec<String>,
    },
}

/// Who runs HAProxy.
#[derive(Debug)]
pub enum Supervision {
    /// Portcullis starts HAProxy (master-worker) and stops it on exit.
    Managed {
        bin: String,
        master_socket: PathBuf,
        process: Option<Box<Haproxy>>,
    },
    /// Something else (systemd, a sidecar) supervises HAProxy; we talk to its master CLI.
    External { master: Client },
}

/// Keeps HAProxy equal to the desired state.
#[derive(Debug)]
pub struct Applier {
    config_dir: PathBuf,
    haproxy_bin: String,
    supervision: Supervision,
    runtime: Client,
    metrics: Arc<Metrics>,
    /// What HAProxy runs, including runtime changes.
    running: Option<Applied>,
    /// A reload that is still owed (it failed, or its check failed), with its reason.
    owed_reload: Option<String>,
    /// The files whose configuration HAProxy is equal to: what it last loaded, or what the
    /// runtime API then brought it to. Not updated by the runtime part of a configuration
    /// that could not be loaded.
    loaded: Option<crate::render::RenderedConfig>,
    /// The files last written to the configuration directory, so that unchanged ones are
    /// not read back to be compared.
    written: Option<crate::render::RenderedConfig>,
    /// Dynamic servers in maintenance waiting to be deleted, with when they were put there
    /// and whether their streams were shut after `drain_timeout`.
    draining: std::collections::BTreeMap<plan::Drain, (std::time::Instant, bool)>,
    /// How long a removed server's connections may take to finish.
    drain_timeout: Duration,
}

impl Applier {
    pub fn new(
        config_dir: PathBuf,
        haproxy_bin: String,
        supervision: Supervision,
        runtime: Client,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            config_dir,
            haproxy_bin,
            supervision,
            runtime,
            metrics,
            running: None,
            owed_reload: None,
            loaded: None,
            written: None,
            draining: std::collections::BTreeMap::new(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }

    /// Gives removed servers' connections `timeout` to finish (`--server-drain-timeout`).
    pub fn with_drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Whether removed servers are waiting to be deleted ([`Applier::drain`]).
    pub fn draining(&self) -> bool {
        !self.draining.is_empty()
    }

    /// Deletes the removed dynamic servers whose connections are gone: `del server` succeeds
    /// only for a server in maintenance without streams, queued requests or idle connections,
    /// so it is the test. A server still busy after the drain timeout has its streams shut
    /// (`shutdown sessions server`); one that still cannot be deleted some time later stays in
    /// maintenance, taking no traffic, until the next reload leaves it out.
    pub async fn drain(&mut self) {
        let now = std::time::Instant::now();
        let pending: Vec<(plan::Drain, (std::time::Instant, bool))> =
            self.draining.iter().map(|(d, s)| (d.clone(), *s)).collect();
        for (drain, (since, shut)) in pending {
            let del = plan::command::Command::DelServer {
                backend: drain.backend.clone(),
                server: drain.server.clone(),
            };
            let answer = match self.runtime.execute(&del).await {
                Ok(_) => {
                    self.metrics.runtime_commands.inc(&[del.name(), "ok"]);
                    tracing::info!(backend = %drain.backend, server = %drain.server, waited_ms = since.elapsed().as_millis() as u64, "removed server drained and deleted");
                    self.draining.remove(&drain);
                    continue;
                }
                Err(crate::haproxy::client::ClientError::Rejected { answer, .. }) => answer,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot delete a drained server yet");
                    continue;
                }
            };
            if !answer.contains("connections") {
                // Gone already (a reload by someone else), or back in service: not ours to
                // delete any more.
                tracing::info!(backend = %drain.backend, server = %drain.server, answer = %answer, "not deleting a removed server");
                self.draining.remove(&drain);
                continue;
            }
            let waited = now.saturating_duration_since(since);
            if waited >= self.drain_timeout && !shut {
                let shutdown = plan::command::Command::ShutdownSessions {
                    backend: drain.backend.clone(),
                    server: drain.server.clone(),
                };
                let outcome = match self.runtime.execute(&shutdown).await {
                    Ok(_) => "ok",
                    Err(_) => "error",
                };
                self.metrics
                    .runtime_commands
                    .inc(&[shutdown.name(), outcome]);
                tracing::warn!(backend = %drain.backend, server = %drain.server, timeout_s = self.drain_timeout.as_secs_f64(), "removed server still had connections after the drain timeout; closed them");
                self.draining.insert(drain, (since, true));
            } else if waited >= self.drain_timeout + DRAIN_PURGE_GRACE {
                tracing::warn!(backend = %drain.backend, server = %drain.server, answer = %answer, "removed server cannot be deleted; it stays in maintenance until the next reload");
                self.draining.remove(&drain);
            }
        }
    }

    /// `commands` with each `add server` of a server still draining replaced by moving that
    /// server (its name is taken until it is deleted): the same endpoint back, or, rarely,
    /// another one that now has its id. It is no longer drained.
    fn reuse_draining(
        &mut self,
        commands: Vec<plan::command::Command>,
    ) -> Vec<plan::command::Command> {
        use plan::command::Command;
        if self.draining.is_empty() {
            return commands;
        }
        commands
            .into_iter()
            .map(|c| match c {
                Command::AddServer {
                    backend,
                    server,
                    addr,
                    port,
                    ..
                } if self
                    .draining
                    .remove(&plan::Drain {
                        backend: backend.clone(),
                        server: server.clone(),
                    })
                    .is_some() =>
                {
                    Command::SetServerAddr {
                        backend,
                        server,
                        addr,
                        port,
                    }
                }
                c => c,
            })
            .collect()
    }

    fn start_draining(&mut self, drains: Vec<plan::Drain>) {
        let now = std::time::Instant::now();
        for drain in drains {
            self.draining.entry(drain).or_insert((now, false));
        }
    }

    /// Whether a reload is still owed (it failed, or the configuration was rejected).
    pub fn owes_reload(&self) -> bool {
        self.owed_reload.is_some()
    }

    /// What HAProxy runs now.
    pub fn running(&self) -> Option<&Applied> {
        self.running.as_ref()
    }

    /// The master CLI, if HAProxy is up.
    pub fn master(&self) -> Option<&Client> {
        match &self.supervision {
            Supervision::Managed { process, .. } => process.as_deref().map(Haproxy::master),
            Supervision::External { master } => Some(master),
        }
    }

    /// Whether a managed HAProxy is still alive (external ones are assumed alive).
    pub fn haproxy_alive(&mut self) -> bool {
        match &mut self.supervision {
            Supervision::Managed { process, .. } => {
                process.as_deref_mut().is_some_and(Haproxy::is_running)
            }
            Supervision::External { .. } => true,
        }
    }

    /// Moves HAProxy to `new`.
    pub async fn apply(&mut self, new: Applied) -> Result<Outcome, ApplyError> {
        let Some(running) = &self.running else {
            return self
                .reload(new, vec!["initial configuration".to_string()])
                .await;
        };
        // Back to exactly what HAProxy loaded last: the reload owed for a change that was
        // reverted is not needed any more (the runtime part is reverted below).
        if self.loaded.as_ref() == Some(&new.rendered) {
            self.owed_reload = None;
        }
        let started = std::time::Instant::now();
        let mut plan = plan::plan(running, &new);
        let planned = started.elapsed();
        if let Some(owed) = &self.owed_reload {
            plan.reload_reasons.push(format!("retrying: {owed}"));
        }
        if !plan.reload_reasons.is_empty() {
            let reasons = plan.reload_reasons;
            return self.reload(new, reasons).await;
        }
        if plan.commands.is_empty()
            && running.rendered == new.rendered
            && running.structure == new.structure
        {
            return Ok(Outcome::Unchanged);
        }
        let commands = self.reuse_draining(std::mem::take(&mut plan.commands));
        let count = commands.len();
        for command in &commands {
            match self.runtime.execute(command).await {
                Ok(_) => self.metrics.runtime_commands.inc(&[command.name(), "ok"]),
                Err(e) => {
                    self.metrics
                        .runtime_commands
                        .inc(&[command.name(), "error"]);
                    tracing::warn!(error = %e, "runtime command failed; reloading instead");
                    return self
                        .reload(new, vec![format!("runtime command failed: {e}")])
                        .await;
                }
            }
        }
        let sent = started.elapsed();
        // The disk follows, so that any later reload starts from the same state.
        self.write_files(&new.rendered)?;
        tracing::debug!(
            commands = count,
            plan_ms = planned.as_secs_f64() * 1e3,
            commands_ms = (sent - planned).as_secs_f64() * 1e3,
            write_ms = (started.elapsed() - sent).as_secs_f64() * 1e3,
            "runtime commands sent, files written"
        );
        self.loaded = Some(new.rendered.clone());
        self.start_draining(plan.drains);
        let mut running = new;
        if let Some(tls) = plan.running_tls {
            running.model.tls = std::sync::Arc::new(tls);
        }
        // Certificates HAProxy let go of (`del ssl cert`) and files of intermediate contents.
        self.remove_unreferenced(&running);
        self.running = Some(running);
        Ok(Outcome::Runtime { commands: count })
    }

    /// Checks, writes and reloads (or starts) HAProxy, then verifies it took.
    async fn reload(&mut self, new: Applied, reasons: Vec<String>) -> Result<Outcome, ApplyError> {
        let reason_text = reasons.join("; ");
        let began = std::time::Instant::now();
        // With no HAProxy running yet, its start is the check: `haproxy -c` first would parse
        // everything twice, and loading thousands of certificates takes seconds each time. A
        // start that fails is checked then, so a refusal is handled as a refused check.
        let first_start = matches!(self.supervision, Supervision::Managed { process: None, .. });
        if !first_start {
            self.check(&new, &reason_text).await?;
        }
        let checked_at = began.elapsed();
        let taken = taken_binds(self.running.as_ref(), &new);
        if !taken.is_empty() {
            self.metrics.reload_failures.inc(&["check"]);
            self.owed_reload.get_or_insert(reason_text);
            self.apply_runtime_part(&new).await;
            return Err(ApplyError::BindTaken(taken));
        }
        self.write_files(&new.rendered)?;
        let written_at = began.elapsed();
        let config = self.config_dir.join(CONFIG_FILE);
        let mut alerts = Vec::new();
        let result = match &mut self.supervision {
            Supervision::Managed {
                bin,
                master_socket,
                process,
            } => match process {
                Some(p) => {
                    let mark = p.alert_mark();
                    let reloaded = process::reload(p.master(), RELOAD_TIMEOUT).await;
                    if reloaded.is_err() {
                        alerts = p.alerts_since(mark, Duration::from_secs(1)).await;
                    }
                    reloaded.map(|_| ())
                }
                None => match Haproxy::start(bin, &config, master_socket, START_TIMEOUT).await {
                    Ok(started) => {
                        *process = Some(Box::new(started));
                        Ok(())
                    }
                    Err(e) => {
                        if matches!(e, ProcessError::ExitedAtStart { .. }) {
                            self.check(&new, &reason_text).await?;
                        }
                        return Err(ApplyError::Start(e));
                    }
                },
            },
            Supervision::External { master } => {
                process::reload(master, RELOAD_TIMEOUT).await.map(|_| ())
            }
        };
        if let Err(source) = result {
            self.metrics.reload_failures.inc(&[match source {
                ProcessError::ReloadFailed(_) => "reload",
                _ => "verify",
            }]);
            self.owed_reload.get_or_insert(reason_text.clone());
            return Err(ApplyError::Reload {
                reasons: reason_text,
                source,
                alerts,
            });
        }
        tracing::debug!(
            check_ms = checked_at.as_secs_f64() * 1e3,
            write_ms = (written_at - checked_at).as_secs_f64() * 1e3,
            load_ms = (began.elapsed() - written_at).as_secs_f64() * 1e3,
            "configuration checked, written and loaded"
        );
        // One reload, one count, labelled by its first reason.
        self.metrics
            .reloads
            .inc(&[reasons.first().map_or("configuration", |r| reason_label(r))]);
        self.owed_reload = None;
        self.loaded = Some(new.rendered.clone());
        // The new workers have only the servers of the new configuration; the old ones finish
        // their connections on their own.
        self.draining.clear();
        self.repair_servers(&new).await;
        let foreign = self.remove_unreferenced(&new);
        if !foreign.is_empty() {
            tracing::warn!(files = ?foreign, "files Portcullis did not write are in its configuration directory; left alone");
        }
        self.running = Some(new);
        Ok(Outcome::Reloaded { reasons })
    }

    /// `haproxy -c` on `new`. A refusal counts as a failed reload and leaves the reload owed;
    /// meanwhile what can change at run time is still sent.
    async fn check(&mut self, new: &Applied, reason_text: &str) -> Result<(), ApplyError> {
        // `haproxy -c` takes seconds on large configurations: keep it off the async threads.
        let (bin, rendered) = (self.haproxy_bin.clone(), new.rendered.clone());
        let loaded = self.loaded.clone();
        let checked = tokio::task::spawn_blocking(move || {
            check::check_config_since(&bin, &rendered, loaded.as_ref())
        })
        .await
        .unwrap_or_else(|e| Err(CheckError::TempDir(std::io::Error::other(e.to_string()))));
        match checked {
            Ok(()) => Ok(()),
            Err(CheckError::Rejected { messages }) => {
                self.metrics.config_check_failures.inc(&[]);
                self.metrics.reload_failures.inc(&["check"]);
                self.owed_reload.get_or_insert(reason_text.to_string());
                self.apply_runtime_part(new).await;
                Err(ApplyError::CheckRejected(messages))
            }
            Err(e) => Err(ApplyError::Check(e)),
        }
    }

    /// Writes the files of `rendered` that differ from what the directory holds.
    fn write_files(&mut self, rendered: &crate::render::RenderedConfig) -> Result<(), ApplyError> {
        let known = self.written.take();
        files::write_atomically(&self.config_dir, rendered, known.as_ref())?;
        self.written = Some(rendered.clone());
        Ok(())
    }

    /// Removes the files Portcullis wrote that neither the configuration on disk
    /// (`running.rendered`) nor the running HAProxy (`running.model`: the certificates it
    /// holds, under the names it loaded them by) references. Returns the files others put in
    /// the directory, which are left alone.
    fn remove_unreferenced(&self, running: &Applied) -> Vec<String> {
        let held: std::collections::BTreeSet<&str> = running
            .model
            .tls
            .pem_files
            .iter()
            .chain(&running.model.tls.static_files)
            .map(|p| p.path.as_str())
            .collect();
        let removal = files::remove_unreferenced(&self.config_dir, |name| {
            running.rendered.files().contains_key(name) || held.contains(name)
        });
        if !removal.removed.is_empty() {
            tracing::info!(files = ?removal.removed, "removed files no configuration references");
        }
        removal.foreign
    }

    /// While a new configuration cannot be loaded, still sends what can change at run time
    /// (endpoints, routes to existing backends, certificates), so a broken template or
    /// annotation does not freeze everything else. The configuration on disk stays the last
    /// good one; the reload is retried on every later change.
    async fn apply_runtime_part(&mut self, new: &Applied) {
        let Some(running) = &self.running else {
            return;
        };
        let (commands, model, drains) = plan::runtime_only(running, new);
        // Later plans start from what HAProxy now runs; the rendered files are the new ones so
        // that returning to the old configuration is seen as a change.
        let next = Applied::with_structure_of(model, new.rendered.clone(), running);
        let commands = self.reuse_draining(commands);
        self.start_draining(drains);
        let mut sent = 0;
        for command in &commands {
            match self.runtime.execute(command).await {
                Ok(_) => {
                    sent += 1;
                    self.metrics.runtime_commands.inc(&[command.name(), "ok"]);
                }
                Err(e) => {
                    self.metrics
                        .runtime_commands
                        .inc(&[command.name(), "error"]);
                    tracing::warn!(error = %e, "runtime command failed");
                }
            }
        }
        if sent > 0 {
            tracing::info!(
                commands = sent,
                "applied the runtime part of a configuration that cannot be loaded"
            );
        }
        self.running = Some(next);
    }

    /// After a reload, checks every server against the model and repairs what differs, so
    /// that no replica silently keeps an old address or a slot in maintenance.
    async fn repair_servers(&mut self, wanted: &Applied) {
        // Line by line: at 10 000 backends the answer is some 40 MB.
        let check = plan::ServerCheck::new(&wanted.model);
        let mut repairs = plan::Plan::default();
        let read = self
            .runtime
            .execute_lines(
                &crate::haproxy::command::Command::ShowServersState,
                |line| {
                    if let Some((backend, server, actual)) = plan::parse_server_state_line(line) {
                        check.repair(backend, server, &actual, &mut repairs);
                    }
                },
            )
            .await;
        if let Err(e) = read {
            tracing::warn!(error = %e, "cannot read the servers' state after the reload");
            return;
        }
        let repairs = repairs.commands;
        if repairs.is_empty() {
            return;
        }
        tracing::warn!(
            commands = repairs.len(),
            "servers differed from the wanted state after the reload; repairing"
        );
        for command in &repairs {
            let outcome = match self.runtime.execute(command).await {
                Ok(_) => "ok",
                Err(e) => {
                    tracing::warn!(error = %e, "repair failed");
                    "error"
                }
            };
            self.metrics
                .runtime_commands
                .inc(&[command.name(), outcome]);
        }
    }

    /// Stops a managed HAProxy.
    pub async fn shutdown(&mut self) {
        if let Supervision::Managed { process, .. } = &mut self.supervision {
            if let Some(p) = process.take() {
                p.stop(Duration::from_secs(10)).await;
            }
        }
    }

    pub fn config_dir(&self) -> &Path {
        &self.config_dir
    }
}

/// A bounded label for the reloads metric: the reason's first words, without names.
fn reason_label(reason: &str) -> &'static str {
    if reason.starts_with("initial") {
        "initial"
    } else if reason.starts_with("backends changed") {
        "backends"
    } else if reason.starts_with("server slots") {
        "slots"
    } else if reason.starts_with("retrying") {
        "retry"
    } else if reason.starts_with("runtime command failed") || reason.starts_with("cannot apply") {
        "runtime_fallback"
    } else if reason.contains("certificate") {
        "certificates"
    } else if reason.starts_with("server ") {
        "external_name"
    } else {
        "configuration"
    }
}

/// The TCP binds of `new` that something else holds now, as HAProxy would report them
/// (`Starting frontend <name>: cannot bind socket (…) [addr:port]`). Ports the running
/// configuration binds are not tried: its workers hold them, and pass them on at a reload.
fn taken_binds(running: Option<&Applied>, new: &Applied) -> Vec<String> {
    let held: std::collections::BTreeSet<u16> = running
        .map(|r| {
            let listen = &r.model.listen;
            r.model
                .tcp
                .iter()
                .flat_map(|t| t.binds.iter().map(|b| b.port))
                .chain([listen.http_port, listen.https_port])
                .chain(listen.stats_port)
                .chain(listen.healthz_port)
                .collect()
        })
        .unwrap_or_default();
    let mut taken = Vec::new();
    for service in &new.model.tcp {
        for bind in &service.binds {
            if held.contains(&bind.port) {
                continue;
            }
            let addr = std::net::SocketAddr::new(bind.address, bind.port);
            if let Err(e) = std::net::TcpListener::bind(addr) {
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    taken.push(format!(
                        "Starting frontend {}: cannot bind socket ({e}) [{}:{}]",
                        service.frontend, bind.address, bind.port
                    ));
                }
            }
        }
    }
    taken
}
