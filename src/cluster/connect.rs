//! Connecting to the API server at start-up, loudly.
//!
//! The incumbent controller turned a 288 ms DNS race at boot into a lasting outage by exiting 0
//! after a fatal start-up error. Here every transient failure (DNS, refused connection, TLS
//! handshake, 5xx, timeout) is retried with capped exponential backoff and jitter until the
//! start-up deadline, each attempt logged with its cause; a permanent failure (unusable
//! kubeconfig, 401/403, a required CRD missing) stops at once. Either way the caller gets an
//! error that becomes one line and a non-zero exit status.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::api_errors::{error_chain, is_permanent_status};
use crate::objects::{Kind, TCP_API_VERSION};

/// How to find the API server.
#[derive(Debug, Clone, Default)]
pub struct ConnectConfig {
    /// `--kubeconfig`, else `KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// Out of cluster: use the kubeconfig (default `~/.kube/config`), never in-cluster config.
    pub external: bool,
    /// Give up on transient failures after this long; `None` retries forever.
    pub startup_timeout: Option<Duration>,
    pub tcp_crd: TcpCrd,
}

/// Whether the TCP custom resource is watched. A missing CRD is an explicit choice: fatal when
/// `Required`, a warning when `Optional`, not looked for when `Off`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TcpCrd {
    Required,
    #[default]
    Optional,
    Off,
}

/// Why start-up failed.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// Retrying cannot help: bad configuration, credentials refused, a required CRD missing.
    #[error("{0}")]
    Permanent(String),
    /// Transient failures lasted past `--startup-timeout`.
    #[error("{0}")]
    Timeout(String),
}

/// A connected client and what start-up learned about the cluster.
#[derive(Clone)]
pub struct Connected {
    pub client: kube::Client,
    /// The API server's URL, for messages.
    pub server: String,
    /// The API server's version (`v1.33.0`).
    pub version: String,
    /// Whether the TCP custom resource is served (and so watched).
    pub tcp_crd_present: bool,
    /// The incumbent's Backend, Defaults and Global resources the API server serves (and so
    /// watched).
    pub resources_present: Vec<Kind>,
    /// The Gateway API kinds the API server serves (and so watched), with `Namespace` when
    /// any is (`allowedRoutes` selectors read namespace labels).
    pub gateway_api_present: Vec<Kind>,
    /// Those served at another version than their default (TLSRoute, TCPRoute at `v1alpha2`).
    pub gateway_api_versions: crate::cluster::reflect::ApiVersions,
}

impl std::fmt::Debug for Connected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connected")
            .field("server", &self.server)
            .field("version", &self.version)
            .field("tcp_crd_present", &self.tcp_crd_present)
            .field("resources_present", &self.resources_present)
            .field("gateway_api_present", &self.gateway_api_present)
            .finish_non_exhaustive()
    }
}

/// A start-up deadline shared by connecting and the first sync of every watch.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    start: Instant,
    timeout: Option<Duration>,
}

impl Deadline {
    pub fn new(timeout: Option<Duration>) -> Self {
        Self {
            start: Instant::now(),
            timeout,
        }
    }

    /// Time left, or `None` when there is no deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.timeout.map(|t| t.saturating_sub(self.start.elapsed()))
    }

    pub fn expired(&self) -> bool {
        self.remaining().is_some_and(|r| r.is_zero())
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Formats the configured timeout for messages (`3s`).
    pub fn describe(&self) -> String {
        match self.timeout {
            Some(t) => format!("{}s", t.as_secs_f64()),
            None => "forever".to_string(),
        }
    }
}

/// Builds the client configuration: in-cluster by default, the kubeconfig when one is named or
/// `--external` is set. Failures here are permanent.
pub async fn client_config(config: &ConnectConfig) -> Result<kube::Config, StartupError> {
    let explicit = config.kubeconfig.clone().or_else(|| {
        std::env::var_os("KUBECONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    if let Some(path) = explicit {
        return from_kubeconfig_file(&path).await;
    }
    if config.external {
        return kube::Config::from_kubeconfig(&KubeConfigOptions::default())
            .await
            .map_err(|e| {
                StartupError::Permanent(format!(
                    "--external: no usable kubeconfig (~/.kube/config; name one with --kubeconfig): {}",
                    error_chain(&e)
                ))
            });
    }
    kube::Config::incluster().map_err(|e| {
        StartupError::Permanent(format!(
            "not running in a cluster ({}); outside a cluster use --kubeconfig PATH or --external, or --manifests DIR to run without one",
            error_chain(&e)
        ))
    })
}

async fn from_kubeconfig_file(path: &Path) -> Result<kube::Config, StartupError> {
    let bad = |e: &dyn std::error::Error| {
        StartupError::Permanent(format!("kubeconfig {}: {}", path.display(), error_chain(e)))
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(&e))
}

/// Connects: builds the client, then asks for the server version (and whether the TCP CRD is
/// served) until it answers, a permanent failure, or the deadline.
pub async fn connect(
    config: &ConnectConfig,
    deadline: Deadline,
) -> Result<Connected, StartupError> {
    let client_config = client_config(config).await?;
    let server = client_config.cluster_url.to_string();
    let server = server.trim_end_matches('/').to_string();
    let client = kube::Client::try_from(client_config).map_err(|e| {
        StartupError::Permanent(format!(
            "Kubernetes client for {server}: {}",
            error_chain(&e)
        ))
    })?;
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let per_attempt = deadline
            .remaining()
            .map_or(Duration::from_secs(10), |r| r.min(Duration::from_secs(10)))
            .max(Duration::from_millis(100));
        let result = tokio::time::timeout(per_attempt, probe(&client, config.tcp_crd)).await;
        let cause = match result {
            Ok(Ok((version, tcp_crd_present, resources_present))) => 'found: {
                let (gateway_api_present, gateway_api_versions) =
                    match gateway_api_kinds(&client).await {
                        Ok(kinds) => kinds,
                        Err(ProbeError::Permanent(message)) => {
                            return Err(StartupError::Permanent(format!("{server}: {message}")));
                        }
                        Err(ProbeError::Transient(cause)) => break 'found cause,
                    };
                tracing::info!(%server, %version, attempt, "connected to the Kubernetes API server");
                return Ok(Connected {
                    client,
                    server,
                    version,
                    tcp_crd_present,
                    resources_present,
                    gateway_api_present,
                    gateway_api_versions,
                });
            }
            Ok(Err(ProbeError::Permanent(message))) => {
                return Err(StartupError::Permanent(format!("{server}: {message}")));
            }
            Ok(Err(ProbeError::Transient(cause))) => cause,
            Err(_) => format!("no answer within {}ms", per_attempt.as_millis()),
        };
        let pause = backoff.next_pause();
        let remaining = deadline.remaining();
        if remaining.is_some_and(|r| r <= Duration::from_millis(1)) {
            return Err(StartupError::Timeout(format!(
                "the Kubernetes API server {server} was not reachable within --startup-timeout {} ({attempt} attempts): {cause}",
                deadline.describe()
            )));
        }
        let pause = remaining.map_or(pause, |r| pause.min(r));
        tracing::warn!(
            %server,
            attempt,
            retry_in_ms = pause.as_millis() as u64,
            "Kubernetes API server not reachable: {cause}"
        );
        tokio::time::sleep(pause).await;
    }
}

enum ProbeError {
    Permanent(String),
    Transient(String),
}

/// The API server's version, whether it serves the TCP resource, and which of the
/// incumbent's other resources (same API group) it serves.
async fn probe(
    client: &kube::Client,
    tcp_crd: TcpCrd,
) -> Result<(String, bool, Vec<Kind>), ProbeError> {
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| classify(&e, "GET /version"))?;
    let served: Vec<String> = match tcp_crd {
        TcpCrd::Off => Vec::new(),
        TcpCrd::Required | TcpCrd::Optional => {
            match client.list_api_group_resources(TCP_API_VERSION).await {
                Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
                Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
                Err(e) => return Err(classify(&e, "discovery of the TCP custom resource")),
            }
        }
    };
    let tcp_crd_present = served.iter().any(|r| r == "tcps");
    let mut resources_present = Vec::new();
    for kind in Kind::RESOURCES {
        let plural = crate::cluster::reflect::api_resource(kind).plural;
        if served.contains(&plural) {
            resources_present.push(kind);
        } else if tcp_crd != TcpCrd::Off {
            tracing::info!(
                "the {} resource ({TCP_API_VERSION}, {plural}) is not installed: not watched; references to it are reported as missing",
                kind.as_str()
            );
        }
    }
    if !tcp_crd_present {
        match tcp_crd {
            TcpCrd::Required => {
                return Err(ProbeError::Permanent(format!(
                    "the TCP custom resource ({TCP_API_VERSION}, tcps) is not installed and --tcp-crd is required; install deploy's CRD or pass --tcp-crd optional"
                )));
            }
            TcpCrd::Optional => tracing::warn!(
                "the TCP custom resource ({TCP_API_VERSION}) is not installed: TCP objects are not watched (--tcp-crd required makes this fatal)"
            ),
            TcpCrd::Off => {}
        }
    }
    Ok((version.git_version, tcp_crd_present, resources_present))
}

/// The Gateway API kinds the API server serves. A missing CRD is a notice, not an error:
/// its kind is not watched.
async fn gateway_api_kinds(
    client: &kube::Client,
) -> Result<(Vec<Kind>, crate::cluster::reflect::ApiVersions), ProbeError> {
    let mut present = Vec::new();
    let mut versions = crate::cluster::reflect::ApiVersions::new();
    for kind in Kind::GATEWAY_API {
        if kind == Kind::Namespace {
            continue;
        }
        let resource = crate::cluster::reflect::api_resource(kind);
        let plural = &resource.plural;
        let serves = |api_version: String| async move {
            match client.list_api_group_resources(&api_version).await {
                Ok(list) => Ok(list.resources.iter().any(|r| r.name == *plural)),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
                Err(e) => Err(classify(&e, "discovery of the Gateway API")),
            }
        };
        let mut served = serves(resource.api_version.clone()).await?;
        // TLSRoute and TCPRoute were `v1alpha2` until Gateway API v1.6.
        if !served && matches!(kind, Kind::TlsRoute | Kind::TcpRoute) {
            served = serves(format!("{}/v1alpha2", resource.group)).await?;
            if served {
                versions.insert(kind, "v1alpha2");
            }
        }
        if served {
            present.push(kind);
        } else {
            let version = if matches!(kind, Kind::TlsRoute | Kind::TcpRoute) {
                format!("{} or v1alpha2", resource.api_version)
            } else {
                resource.api_version.clone()
            };
            tracing::info!(
                "the Gateway API {} resource ({version}, {}) is not installed: not watched",
                kind.as_str(),
                resource.plural
            );
        }
    }
    if !present.is_empty() {
        present.push(Kind::Namespace);
    }
    Ok((present, versions))
}

/// Whether an error is worth retrying. Authentication and authorisation failures are not:
/// a wrong token does not become right by waiting.
fn classify(e: &kube::Error, what: &str) -> ProbeError {
    match e {
        kube::Error::Api(s) if is_permanent_status(s.code) => {
            ProbeError::Permanent(format!("{what}: {} {} ({})", s.code, s.reason, s.message))
        }
        kube::Error::Api(s) => {
            ProbeError::Transient(format!("{what}: {} {} ({})", s.code, s.reason, s.message))
        }
        kube::Error::Auth(_) => ProbeError::Permanent(format!("{what}: {}", error_chain(e))),
        _ => ProbeError::Transient(format!("{what}: {}", error_chain(e))),
    }
}

/// Capped exponential backoff with jitter (half to full of the step), so replicas restarted
/// together do not retry in lockstep.
#[derive(Debug)]
pub struct Backoff {
    step: Duration,
    cap: Duration,
    seed: u64,
}

impl Backoff {
    pub fn new(initial: Duration, cap: Duration) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        Self {
            step: initial,
            cap,
            seed: seed | 1,
        }
    }

    /// The next pause: a random point in [step/2, step], then the step doubles up to the cap.
    pub fn next_pause(&mut self) -> Duration {
        // xorshift64: jitter needs no cryptographic randomness.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let step_ms = self.step.as_millis().max(2) as u64;
        let pause = Duration::from_millis(step_ms / 2 + self.seed % (step_ms / 2 + 1));
        self.step = (self.step * 2).min(self.cap);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_with_jitter_inside_the_step() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        let mut step = 200u64;
        for _ in 0..12 {
            let p = b.next_pause().as_millis() as u64;
            assert!(
                p >= step / 2 && p <= step,
                "{p} outside [{}, {step}]",
                step / 2
            );
            step = (step * 2).min(10_000);
        }
    }

    #[tokio::test]
    async fn an_unreadable_kubeconfig_is_permanent() {
        let config = ConnectConfig {
            kubeconfig: Some(PathBuf::from("/nonexistent/kubeconfig")),
            ..Default::default()
        };
        let err = connect(&config, Deadline::new(Some(Duration::from_secs(5))))
            .await
            .err();
        assert!(
            matches!(&err, Some(StartupError::Permanent(m)) if m.contains("/nonexistent/kubeconfig")),
            "{err:?}"
        );
    }
}
