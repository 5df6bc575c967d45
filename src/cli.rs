//! Command-line flags. Every flag can also be set through `PORTCULLIS_<FLAG>`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::model::Listen;
use crate::objects::Key;
use crate::translate::TranslateConfig;

/// Portcullis: a Kubernetes ingress controller for HAProxy.
#[derive(Debug, Parser)]
#[command(name = "portcullis", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Render haproxy.cfg and its files from a directory of manifests.
    Render(RenderArgs),
    /// Compile scripts and templates, render, and ask `haproxy -c` whether the result is valid.
    Check(CheckArgs),
    /// Keep a real HAProxy equal to the desired state (runtime API first, verified reloads).
    Run(Box<RunArgs>),
    /// The quickstart: example manifests, loopback echo backends and `run`, on ports 8080/8443.
    Demo(DemoArgs),
    /// Run test cases (manifests plus expectations) against the effective scripts and
    /// templates; print a diff for each mismatch (see docs/scripting.md).
    Test(TestArgs),
    /// List the effective policy scripts and the layer each comes from.
    Scripts {
        #[command(subcommand)]
        command: ListCommand,
        /// Site scripts layered over the bundled ones.
        #[arg(long, env = "PORTCULLIS_SCRIPTS_DIR", global = true)]
        scripts_dir: Option<PathBuf>,
    },
    /// List every annotation and ConfigMap key the effective scripts declare they read.
    Annotations {
        #[command(subcommand)]
        command: AnnotationsCommand,
        /// Site scripts layered over the bundled ones.
        #[arg(long, alias = "scripts", env = "PORTCULLIS_SCRIPTS_DIR", global = true)]
        scripts_dir: Option<PathBuf>,
    },
    /// Print a ValidatingAdmissionPolicy and its binding (YAML) that check the declared
    /// annotations' values in the API server; `deploy/overlays/admission-policy` is this
    /// output with the defaults.
    AdmissionPolicy {
        /// Site scripts layered over the bundled ones.
        #[arg(long, alias = "scripts", env = "PORTCULLIS_SCRIPTS_DIR")]
        scripts_dir: Option<PathBuf>,
        /// The class of the Ingresses checked.
        #[arg(long, env = "PORTCULLIS_INGRESS_CLASS", default_value = "portcullis")]
        ingress_class: String,
        /// The controller ConfigMap (NAMESPACE/NAME) whose keys are checked.
        #[arg(long, env = "PORTCULLIS_CONFIGMAP", value_parser = Key::parse_namespaced)]
        configmap: Option<Key>,
        /// Refuse objects with a bad value instead of warning (`validationActions: [Deny]`).
        #[arg(long)]
        deny: bool,
    },
    /// Serve a validating admission webhook (HTTPS, `POST /validate`) that runs the declared
    /// annotation checks and the scripts' hooks on the object under review.
    Webhook(WebhookArgs),
    /// List the effective templates and the layer each comes from.
    Templates {
        #[command(subcommand)]
        command: ListCommand,
        /// Site templates layered over the bundled ones.
        #[arg(long, env = "PORTCULLIS_TEMPLATES_DIR", global = true)]
        templates_dir: Option<PathBuf>,
    },
    /// Print the CustomResourceDefinition of the TCP resource (YAML), generated from the types
    /// that read it; `deploy/base/crd-tcp.yaml` is this output.
    Crd,
    /// Print the version.
    Version,
}

#[derive(Debug, Subcommand)]
pub enum ListCommand {
    /// One line per effective file: name, then `bundled` or the site file's path.
    List,
}

#[derive(Debug, Subcommand)]
pub enum AnnotationsCommand {
    /// One row per declared setting: name (aliases), type, default, the objects it may come
    /// from, the script that declares it (bundled, or the site file's path), description.
    List {
        /// `table` for people, `json` for machines, `markdown` for docs/annotations.md.
        #[arg(long, value_enum, default_value = "table")]
        output: AnnotationsOutput,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AnnotationsOutput {
    Table,
    Json,
    Markdown,
}

#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Address and port to serve on.
    #[arg(
        long,
        env = "PORTCULLIS_WEBHOOK_LISTEN",
        default_value = "0.0.0.0:8443"
    )]
    pub listen: std::net::SocketAddr,
    /// The serving certificate chain (PEM), read again when it changes.
    #[arg(long, env = "PORTCULLIS_WEBHOOK_CERT")]
    pub tls_cert: PathBuf,
    /// The serving certificate's private key (PEM).
    #[arg(long, env = "PORTCULLIS_WEBHOOK_KEY")]
    pub tls_key: PathBuf,
    /// The longest one review may take, e.g. `2s` (the API server's timeout should be longer).
    #[arg(long, env = "PORTCULLIS_WEBHOOK_DEADLINE", default_value = "2s", value_parser = parse_deadline)]
    pub deadline: std::time::Duration,
    /// Site scripts layered over the bundled ones.
    #[arg(long, alias = "scripts", env = "PORTCULLIS_SCRIPTS_DIR")]
    pub scripts_dir: Option<PathBuf>,
    /// The class of the Ingresses reviewed.
    #[arg(long, env = "PORTCULLIS_INGRESS_CLASS", default_value = "portcullis")]
    pub ingress_class: String,
    /// The controller ConfigMap (NAMESPACE/NAME) whose keys are reviewed.
    #[arg(long, env = "PORTCULLIS_CONFIGMAP", value_parser = Key::parse_namespaced)]
    pub configmap: Option<Key>,
    /// Manage the serving certificate here (NAMESPACE/NAME, a Secret) instead of reading one
    /// issued by cert-manager: a CA and certificate of its own, renewed before they expire,
    /// written to --tls-cert and --tls-key for serving.
    #[arg(long, env = "PORTCULLIS_WEBHOOK_CERTIFICATE_SECRET", value_parser = Key::parse_namespaced)]
    pub certificate_secret: Option<Key>,
    /// The ValidatingWebhookConfiguration that gets the managed CA bundle.
    #[arg(
        long,
        env = "PORTCULLIS_WEBHOOK_CONFIGURATION",
        default_value = "portcullis-webhook"
    )]
    pub webhook_configuration: String,
    /// The names of the managed serving certificate (repeat for more).
    #[arg(
        long,
        env = "PORTCULLIS_WEBHOOK_DNS_NAME",
        default_value = "portcullis-webhook.portcullis.svc"
    )]
    pub dns_name: Vec<String>,
    /// How long a managed serving certificate is valid, e.g. `90d` (renewed with a third left).
    #[arg(long, env = "PORTCULLIS_WEBHOOK_CERTIFICATE_VALIDITY", default_value = "90d", value_parser = parse_validity)]
    pub certificate_validity: std::time::Duration,
    /// How often the managed certificate is checked (and renewed when due), e.g. `60s`.
    #[arg(long, env = "PORTCULLIS_WEBHOOK_CERTIFICATE_CHECK", default_value = "60s", value_parser = parse_check_interval)]
    pub certificate_check: std::time::Duration,
    /// A kubeconfig for managing the certificate (default: the in-cluster configuration).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// As the controller's flag: snippets in the ConfigMap are allowed.
    #[arg(long, env = "PORTCULLIS_ALLOW_CONFIG_SNIPPETS")]
    pub allow_config_snippets: bool,
    /// As the controller's flag: snippets in annotations too.
    #[arg(long, env = "PORTCULLIS_ALLOW_CONFIG_SNIPPETS_IN_ANNOTATIONS")]
    pub allow_config_snippets_in_annotations: bool,
}

/// How often a managed certificate is checked: from 1s to 1d.
fn parse_check_interval(v: &str) -> Result<std::time::Duration, String> {
    let ms = crate::values::parse_duration(v)?;
    if !(1_000..=86_400_000).contains(&ms) {
        return Err(format!("{v}: between 1s and 1d"));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// A certificate's validity: whole hours (`12h`) or days (`90d`), from 1h to 10 years.
fn parse_validity(v: &str) -> Result<std::time::Duration, String> {
    let (digits, hours) = match v.strip_suffix('d') {
        Some(d) => (d, 24),
        None => (v.strip_suffix('h').unwrap_or("-"), 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{v}: hours or days, e.g. 12h or 90d"))?;
    let total = n.saturating_mul(hours);
    if total == 0 || total > 87_600 {
        return Err(format!("{v}: from 1h to 3650d"));
    }
    Ok(std::time::Duration::from_secs(total * 3600))
}

fn parse_deadline(v: &str) -> Result<std::time::Duration, String> {
    let ms = crate::values::parse_duration(v)?;
    if ms == 0 || ms > 30_000 {
        return Err(format!("{v}: between 1ms and 30s"));
    }
    Ok(std::time::Duration::from_millis(ms))
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Directory of Kubernetes YAML/JSON manifests (read recursively).
    #[arg(long, env = "PORTCULLIS_MANIFESTS")]
    pub manifests: PathBuf,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Write haproxy.cfg and every file it references here (default: haproxy.cfg to stdout).
    #[arg(long, env = "PORTCULLIS_OUT")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Directory of Kubernetes YAML/JSON manifests (read recursively).
    #[arg(long, env = "PORTCULLIS_MANIFESTS")]
    pub manifests: PathBuf,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// The HAProxy binary to check with.
    #[arg(long, env = "PORTCULLIS_HAPROXY_BIN", default_value = "haproxy")]
    pub haproxy_bin: String,
}

/// `portcullis test`: exit 0 when every case passes, 1 when any fails or cannot be read.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// Directory of test cases: one subdirectory per case, holding manifests and
    /// `expect.txt` or `expected.cfg` (and optionally `args`). Or a single case directory.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    // The defaults of every case; a case's `args` file overrides the flags it names.
    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Read a directory of Kubernetes YAML/JSON manifests (watched) instead of a cluster.
    #[arg(long, env = "PORTCULLIS_MANIFESTS")]
    pub manifests: Option<PathBuf>,
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    #[command(flatten)]
    pub haproxy: HaproxyArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Flags for the cluster source (used when `--manifests` is not given).
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Kubeconfig file (default: `KUBECONFIG`, else in-cluster configuration).
    #[arg(long, env = "PORTCULLIS_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Run outside the cluster next to a host HAProxy: use the kubeconfig (default
    /// ~/.kube/config), never the in-cluster service account.
    #[arg(long, env = "PORTCULLIS_EXTERNAL")]
    pub external: bool,
    /// Give up (exit status 6) when the API server has not answered and every watch has not
    /// listed within this time; transient failures are retried until then. `0` waits forever.
    #[arg(long, env = "PORTCULLIS_STARTUP_TIMEOUT", default_value = "2m", value_parser = startup_timeout)]
    pub startup_timeout: std::time::Duration,
    /// Only read Ingresses, Services, EndpointSlices, Secrets and TCP objects in these
    /// namespaces (repeat or comma-separate; default: all).
    #[arg(long = "namespace", env = "PORTCULLIS_NAMESPACE", value_delimiter = ',', value_parser = namespace)]
    pub namespaces: Vec<String>,
    /// Never read these namespaces (repeat or comma-separate).
    #[arg(long = "namespace-deny", env = "PORTCULLIS_NAMESPACE_DENY", value_delimiter = ',', value_parser = namespace)]
    pub namespaces_deny: Vec<String>,
    /// Watch the TCP custom resource: `required` (exit at start-up when its CRD is missing),
    /// `optional` (warn and carry on) or `off`.
    #[arg(
        long,
        env = "PORTCULLIS_TCP_CRD",
        value_enum,
        default_value = "optional"
    )]
    pub tcp_crd: crate::cluster::connect::TcpCrd,
    /// Write Ingress status from this Service's load-balancer addresses (NAMESPACE/NAME).
    #[arg(long, env = "PORTCULLIS_PUBLISH_SERVICE", value_parser = Key::parse_namespaced, conflicts_with = "publish_address")]
    pub publish_service: Option<Key>,
    /// Write these addresses (IPs or host names, comma-separated) into Ingress status.
    #[arg(long, env = "PORTCULLIS_PUBLISH_ADDRESS", value_delimiter = ',')]
    pub publish_address: Vec<String>,
    /// Name of the Lease (in the pod's namespace) that elects the replica writing status
    /// and Events.
    #[arg(long, env = "PORTCULLIS_ELECTION_ID", default_value = "portcullis-leader", value_parser = pod_name)]
    pub election_id: String,
    /// How long a leader's Lease lasts without renewal.
    #[arg(long, env = "PORTCULLIS_LEASE_DURATION", default_value = "15s", value_parser = lease_duration)]
    pub lease_duration: std::time::Duration,
}

/// `--startup-timeout`: a duration; `0` means no limit.
fn startup_timeout(v: &str) -> Result<std::time::Duration, String> {
    Ok(std::time::Duration::from_millis(
        crate::values::parse_duration(v)?,
    ))
}

/// `--lease-duration`: between 2s and 5m.
fn lease_duration(v: &str) -> Result<std::time::Duration, String> {
    let ms = crate::values::parse_duration(v)?;
    if !(2_000..=300_000).contains(&ms) {
        return Err(format!("{v:?} must be between 2s and 5m"));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// Flags for driving HAProxy.
#[derive(Debug, Args)]
pub struct HaproxyArgs {
    /// The HAProxy binary.
    #[arg(long, env = "PORTCULLIS_HAPROXY_BIN", default_value = "haproxy")]
    pub haproxy_bin: String,
    /// Where haproxy.cfg and its maps and certificates are written.
    #[arg(
        long,
        env = "PORTCULLIS_CONFIG_DIR",
        default_value = "/var/lib/portcullis/haproxy"
    )]
    pub config_dir: PathBuf,
    /// Where the sockets live: master CLI `master.sock`, runtime API `admin.sock`.
    #[arg(long, env = "PORTCULLIS_RUNTIME_DIR", default_value = "/run/portcullis", value_parser = socket_dir)]
    pub runtime_dir: PathBuf,
    /// Drive an HAProxy that something else supervises, through its master CLI socket.
    #[arg(long, env = "PORTCULLIS_HAPROXY_MASTER_SOCKET")]
    pub haproxy_master_socket: Option<PathBuf>,
    /// Admin HTTP endpoint: /healthz, /readyz, /metrics; and the debug pages
    /// (/debug/config, /debug/model, /debug/log-level) when it is on loopback and
    /// --debug-addr is not set.
    #[arg(long, env = "PORTCULLIS_ADMIN_ADDR", default_value = "127.0.0.1:6060")]
    pub admin_addr: std::net::SocketAddr,
    /// Serve the debug pages here instead (every admin route; PUT from loopback only).
    /// Without it, an --admin-addr off loopback serves no debug page.
    #[arg(long, env = "PORTCULLIS_DEBUG_ADDR")]
    pub debug_addr: Option<std::net::SocketAddr>,
    /// Changes arriving within this quiet period are applied together (e.g. 100ms).
    #[arg(long, env = "PORTCULLIS_SYNC_DEBOUNCE", default_value = "100ms", value_parser = debounce)]
    pub sync_debounce: std::time::Duration,
    /// How long a removed endpoint's open connections may take to finish before its server
    /// is deleted; past it they are closed (e.g. 30s, at most 1h).
    #[arg(long, env = "PORTCULLIS_SERVER_DRAIN_TIMEOUT", default_value = "30s", value_parser = drain_timeout)]
    pub server_drain_timeout: std::time::Duration,
    /// Log filter, e.g. `info` or `portcullis=debug,haproxy=warn`.
    #[arg(long, env = "PORTCULLIS_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log lines as human-readable `text` or as one JSON object per line (`json`).
    #[arg(
        long,
        env = "PORTCULLIS_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (with colours when stderr is a terminal).
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the fields.
    Json,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The example manifests (endpoints on 127.0.0.1 get echo servers).
    #[arg(
        long,
        env = "PORTCULLIS_MANIFESTS",
        default_value = "deploy/examples/quickstart"
    )]
    pub manifests: PathBuf,
    /// HTTP port on 127.0.0.1.
    #[arg(long, env = "PORTCULLIS_HTTP_BIND_PORT", default_value_t = 8080)]
    pub http_bind_port: u16,
    /// HTTPS port on 127.0.0.1.
    #[arg(long, env = "PORTCULLIS_HTTPS_BIND_PORT", default_value_t = 8443)]
    pub https_bind_port: u16,
    /// Admin HTTP endpoint.
    #[arg(long, env = "PORTCULLIS_ADMIN_ADDR", default_value = "127.0.0.1:6060")]
    pub admin_addr: std::net::SocketAddr,
    /// The HAProxy binary.
    #[arg(long, env = "PORTCULLIS_HAPROXY_BIN", default_value = "haproxy")]
    pub haproxy_bin: String,
    /// Log lines as human-readable `text` or as one JSON object per line (`json`).
    #[arg(
        long,
        env = "PORTCULLIS_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// A debounce period: a duration such as `100ms`, at most 10s.
fn debounce(v: &str) -> Result<std::time::Duration, String> {
    let ms = crate::values::parse_duration(v)?;
    if ms > 10_000 {
        return Err(format!("{v:?} is longer than 10s"));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// A drain timeout: a duration such as `30s`, at most 1h.
fn drain_timeout(v: &str) -> Result<std::time::Duration, String> {
    let ms = crate::values::parse_duration(v)?;
    if ms > 3_600_000 {
        return Err(format!("{v:?} is longer than 1h"));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// A directory for sockets: its path ends up in haproxy.cfg, so it must be a plain path.
fn socket_dir(v: &str) -> Result<PathBuf, String> {
    let ok = v.starts_with('/')
        && v.len() <= 80
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-'));
    if ok {
        Ok(PathBuf::from(v))
    } else {
        Err(format!(
            "{v:?}: the socket directory must be an absolute path of letters, digits, '/', '.', '_' and '-', at most 80 characters (it is written into haproxy.cfg, and Unix socket paths are short)"
        ))
    }
}

/// Flags shared by every command that runs the pipeline.
#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// Site scripts layered over the bundled ones (same name replaces, new names add).
    #[arg(long, env = "PORTCULLIS_SCRIPTS_DIR")]
    pub scripts_dir: Option<PathBuf>,
    /// Site templates layered over the bundled ones.
    #[arg(long, env = "PORTCULLIS_TEMPLATES_DIR")]
    pub templates_dir: Option<PathBuf>,
    /// The ingress class this controller serves.
    #[arg(long, env = "PORTCULLIS_INGRESS_CLASS", default_value = "portcullis")]
    pub ingress_class: String,
    /// IngressClasses with this spec.controller are served too.
    #[arg(
        long,
        env = "PORTCULLIS_CONTROLLER_CLASS",
        default_value = "portcullis.io/ingress"
    )]
    pub controller_class: String,
    /// GatewayClasses with this spec.controllerName are ours: their Gateways and the
    /// routes attached to them are served.
    #[arg(
        long,
        env = "PORTCULLIS_GATEWAY_CONTROLLER_NAME",
        default_value = "portcullis.io/gateway-controller"
    )]
    pub gateway_controller_name: String,
    /// Ports Gateway listeners may open binds of their own on (`PORT` or `FIRST-LAST`,
    /// comma-separated). Empty (the default): Gateways share the HTTP and HTTPS ports only.
    #[arg(
        long,
        env = "PORTCULLIS_GATEWAY_LISTENER_PORTS",
        default_value = "",
        value_parser = crate::translate::gateway::PortRanges::parse
    )]
    pub gateway_listener_ports: crate::translate::gateway::PortRanges,
    /// Also serve Ingresses that name no class.
    #[arg(long, env = "PORTCULLIS_WATCH_INGRESS_WITHOUT_CLASS")]
    pub watch_ingress_without_class: bool,
    /// The controller ConfigMap (NAMESPACE/NAME): unprefixed keys set defaults.
    #[arg(long, env = "PORTCULLIS_CONFIGMAP", value_parser = Key::parse_namespaced)]
    pub configmap: Option<Key>,
    /// Service (NAMESPACE/NAME) that receives requests no rule matches (first port).
    #[arg(long, env = "PORTCULLIS_DEFAULT_BACKEND_SERVICE", value_parser = Key::parse_namespaced)]
    pub default_backend_service: Option<Key>,
    /// TLS Secret (NAMESPACE/NAME) served when no SNI name matches.
    #[arg(long, env = "PORTCULLIS_DEFAULT_SSL_CERTIFICATE", value_parser = Key::parse_namespaced)]
    pub default_ssl_certificate: Option<Key>,
    /// IPv4 address the frontends bind.
    #[arg(long, env = "PORTCULLIS_IPV4_BIND_ADDRESS", default_value = "0.0.0.0")]
    pub ipv4_bind_address: std::net::Ipv4Addr,
    /// HTTP port.
    #[arg(long, env = "PORTCULLIS_HTTP_BIND_PORT", default_value_t = 80)]
    pub http_bind_port: u16,
    /// HTTPS port.
    #[arg(long, env = "PORTCULLIS_HTTPS_BIND_PORT", default_value_t = 443)]
    pub https_bind_port: u16,
    /// This controller's pod name (default: the downward API's POD_NAME). Needed for peers.
    #[arg(long, env = "PORTCULLIS_POD_NAME", value_parser = pod_name)]
    pub pod_name: Option<String>,
    /// This controller's pod namespace (default: POD_NAMESPACE).
    #[arg(long, env = "PORTCULLIS_POD_NAMESPACE", value_parser = namespace)]
    pub pod_namespace: Option<String>,
    /// This controller's pod IP (default: POD_IP, then the Pod's status).
    #[arg(long, env = "PORTCULLIS_POD_IP")]
    pub pod_ip: Option<std::net::IpAddr>,
    /// Port of the HAProxy peers protocol between replicas.
    #[arg(long, env = "PORTCULLIS_LOCALPEER_PORT", default_value_t = 10000)]
    pub localpeer_port: u16,
    /// Accept raw config snippets (`*-config-snippet`) from the controller ConfigMap. Every
    /// line is still checked against an allowlist.
    #[arg(long, env = "PORTCULLIS_ALLOW_CONFIG_SNIPPETS")]
    pub allow_config_snippets: bool,
    /// Also accept snippets from Ingress and Service annotations (one line each); needs
    /// --allow-config-snippets. Anyone who can edit an Ingress can then change HAProxy's
    /// configuration within the allowlist's limits.
    #[arg(
        long,
        env = "PORTCULLIS_ALLOW_CONFIG_SNIPPETS_IN_ANNOTATIONS",
        requires = "allow_config_snippets"
    )]
    pub allow_config_snippets_in_annotations: bool,
    /// Secret (NAMESPACE/NAME) whose `dynamic-cookie-key` is the key of dynamic persistence
    /// cookies (`cookie-persistence`). Without it such cookies hold server slot names.
    #[arg(long, env = "PORTCULLIS_DYNAMIC_COOKIE_KEY_SECRET", value_parser = Key::parse_namespaced)]
    pub dynamic_cookie_key_secret: Option<Key>,
    /// ConfigMap (NAMESPACE/NAME) of error pages: keys are status codes, values whole HTTP
    /// responses, served by HAProxy (`errorfile`).
    #[arg(long, env = "PORTCULLIS_CONFIGMAP_ERRORFILES", value_parser = Key::parse_namespaced)]
    pub configmap_errorfiles: Option<Key>,
    /// ConfigMap (NAMESPACE/NAME) of TCP services: keys are ports, values
    /// `namespace/service:port[:ssl][:proxy]`.
    #[arg(long, env = "PORTCULLIS_CONFIGMAP_TCP_SERVICES", value_parser = Key::parse_namespaced)]
    pub configmap_tcp_services: Option<Key>,
    /// ConfigMap (NAMESPACE/NAME) of pattern files: each key is written as the file
    /// `patterns/<key>`, which access lists (`allow-list: patterns/<key>`) and snippets
    /// (`map(patterns/<key>)`) name.
    #[arg(long, env = "PORTCULLIS_CONFIGMAP_PATTERNFILES", value_parser = Key::parse_namespaced)]
    pub configmap_patternfiles: Option<Key>,
    /// Also bind this IPv6 address (e.g. `::`); without it there are no IPv6 binds.
    #[arg(long, env = "PORTCULLIS_IPV6_BIND_ADDRESS")]
    pub ipv6_bind_address: Option<std::net::Ipv6Addr>,
    /// Do not bind the IPv4 address (needs --ipv6-bind-address).
    #[arg(
        long,
        env = "PORTCULLIS_DISABLE_IPV4",
        requires = "ipv6_bind_address",
        conflicts_with = "disable_ipv6"
    )]
    pub disable_ipv4: bool,
    /// Do not bind the IPv6 address, even with --ipv6-bind-address.
    #[arg(long, env = "PORTCULLIS_DISABLE_IPV6")]
    pub disable_ipv6: bool,
    /// No HTTP frontend.
    #[arg(long, env = "PORTCULLIS_DISABLE_HTTP")]
    pub disable_http: bool,
    /// No HTTPS frontend, even when certificates exist.
    #[arg(long, env = "PORTCULLIS_DISABLE_HTTPS")]
    pub disable_https: bool,
    /// Serve HAProxy's stats page (`/`) and Prometheus exporter (`/metrics`) on this port.
    #[arg(long, env = "PORTCULLIS_STATS_BIND_PORT")]
    pub stats_bind_port: Option<u16>,
    /// HAProxy answers `GET /healthz` with 200 on this port, for load balancers that probe
    /// the data plane (the controller's own probes stay on --admin-addr).
    #[arg(long, env = "PORTCULLIS_HEALTHZ_BIND_PORT")]
    pub healthz_bind_port: Option<u16>,
    /// Accepted for the incumbent's command lines, with a warning: this HAProxy build has no
    /// QUIC (HTTP/3), so HTTPS is served over TCP only.
    #[arg(long, env = "PORTCULLIS_QUIC_BIND_PORT")]
    pub quic_bind_port: Option<u16>,
    /// Accepted with a warning, as --quic-bind-port.
    #[arg(long, env = "PORTCULLIS_QUIC_ANNOUNCE_PORT")]
    pub quic_announce_port: Option<u16>,
    /// Accepted (QUIC is always off).
    #[arg(long, env = "PORTCULLIS_DISABLE_QUIC")]
    pub disable_quic: bool,
    /// Who may route a host: `shared` (any Ingress of the class; the oldest wins a path) or
    /// `namespace` (a host belongs to the namespace of its oldest Ingress; rules and TLS hosts
    /// for it from other namespaces are refused).
    #[arg(
        long,
        env = "PORTCULLIS_HOST_OWNERSHIP",
        default_value = "shared",
        value_parser = host_ownership
    )]
    pub host_ownership: crate::translate::class::HostOwnership,

    // What tenants' objects may point HAProxy at (docs/security.md).
    /// Route to ExternalName Services. Names of this host, IP literals, the cloud metadata
    /// and API server names are refused even then.
    #[arg(long, env = "PORTCULLIS_ALLOW_EXTERNAL_NAME_SERVICES")]
    pub allow_external_name_services: bool,
    /// In cluster mode, keep EndpointSlice endpoints on loopback and link-local addresses
    /// (the metadata address and this controller's pod stay refused).
    #[arg(long, env = "PORTCULLIS_ALLOW_LOCAL_ENDPOINTS")]
    pub allow_local_endpoints: bool,
    /// Let TCP objects bind ports below 1024.
    #[arg(long, env = "PORTCULLIS_ALLOW_PRIVILEGED_TCP_BINDS")]
    pub allow_privileged_tcp_binds: bool,
}

/// `--host-ownership`.
fn host_ownership(v: &str) -> Result<crate::translate::class::HostOwnership, String> {
    crate::translate::class::HostOwnership::parse(v)
}

impl PipelineArgs {
    /// Warnings about flags that are accepted but change nothing.
    pub fn ignored_flags(&self) -> Vec<String> {
        [
            ("--quic-bind-port", self.quic_bind_port.is_some()),
            ("--quic-announce-port", self.quic_announce_port.is_some()),
        ]
        .into_iter()
        .filter(|(_, given)| *given)
        .map(|(flag, _)| {
            format!("{flag} is ignored: this HAProxy has no QUIC (HTTP/3); HTTPS is served over TCP only")
        })
        .collect()
    }

    /// What tenants' objects may point at; the cluster source and the controller's own
    /// listeners are added by `run` (see [`crate::controller`]).
    pub fn exposure(&self) -> crate::translate::exposure::Exposure {
        crate::translate::exposure::Exposure {
            allow_external_name_services: self.allow_external_name_services,
            allow_privileged_tcp_binds: self.allow_privileged_tcp_binds,
            allow_local_endpoints: self.allow_local_endpoints,
            ..Default::default()
        }
    }

    pub fn translate_config(&self) -> TranslateConfig {
        TranslateConfig {
            version: env!("CARGO_PKG_VERSION").to_string(),
            ingress_class: self.ingress_class.clone(),
            controller_class: self.controller_class.clone(),
            gateway_controller_name: self.gateway_controller_name.clone(),
            gateway_listener_ports: self.gateway_listener_ports.clone(),
            watch_ingress_without_class: self.watch_ingress_without_class,
            config_map: self.configmap.clone(),
            default_backend_service: self.default_backend_service.clone(),
            default_ssl_certificate: self.default_ssl_certificate.clone(),
            listen: Listen {
                ipv4_address: self.ipv4_bind_address.to_string(),
                http_port: self.http_bind_port,
                https_port: self.https_bind_port,
                ipv4: !self.disable_ipv4,
                ipv6_address: self
                    .ipv6_bind_address
                    .filter(|_| !self.disable_ipv6)
                    .map(|a| a.to_string()),
                http: !self.disable_http,
                https: !self.disable_https,
                stats_port: self.stats_bind_port,
                healthz_port: self.healthz_bind_port,
            },
            runtime_socket: None,
            identity: crate::translate::peers::Identity {
                pod_name: self
                    .pod_name
                    .clone()
                    .or_else(|| std::env::var("POD_NAME").ok().filter(|v| !v.is_empty())),
                pod_namespace: self.pod_namespace.clone().or_else(|| {
                    std::env::var("POD_NAMESPACE")
                        .ok()
                        .filter(|v| !v.is_empty())
                }),
                pod_ip: self
                    .pod_ip
                    .or_else(|| std::env::var("POD_IP").ok().and_then(|v| v.parse().ok())),
                peer_port: self.localpeer_port,
            },
            snippets: crate::snippets::SnippetPolicy {
                allow: self.allow_config_snippets,
                in_annotations: self.allow_config_snippets_in_annotations,
            },
            dynamic_cookie_key_secret: self.dynamic_cookie_key_secret.clone(),
            errorfiles_config_map: self.configmap_errorfiles.clone(),
            tcp_services_config_map: self.configmap_tcp_services.clone(),
            patternfiles_config_map: self.configmap_patternfiles.clone(),
            workers: crate::parallel::Workers::default(),
            exposure: self.exposure(),
            host_ownership: self.host_ownership,
        }
    }
}

/// A namespace: a DNS-1123 label.
fn namespace(v: &str) -> Result<String, String> {
    crate::objects::validate_dns_label(v)?;
    Ok(v.to_string())
}

/// A pod name: a DNS-1123 subdomain (it becomes HAProxy's local peer name).
fn pod_name(v: &str) -> Result<String, String> {
    crate::objects::validate_dns_subdomain(v)?;
    Ok(v.to_string())
}
