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
    /// Print the version.
    Version,
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Write haproxy.cfg and every file it references here (default: haproxy.cfg to stdout).
    #[arg(long, env = "PORTCULLIS_OUT")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// The HAProxy binary to check with.
    #[arg(long, env = "PORTCULLIS_HAPROXY_BIN", default_value = "haproxy")]
    pub haproxy_bin: String,
}

/// Flags shared by every command that runs the pipeline.
#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// Directory of Kubernetes YAML/JSON manifests (read recursively).
    #[arg(long, env = "PORTCULLIS_MANIFESTS")]
    pub manifests: PathBuf,
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
}

impl PipelineArgs {
    pub fn translate_config(&self) -> TranslateConfig {
        TranslateConfig {
            version: env!("CARGO_PKG_VERSION").to_string(),
            ingress_class: self.ingress_class.clone(),
            controller_class: self.controller_class.clone(),
            watch_ingress_without_class: self.watch_ingress_without_class,
            config_map: self.configmap.clone(),
            default_backend_service: self.default_backend_service.clone(),
            default_ssl_certificate: self.default_ssl_certificate.clone(),
            listen: Listen {
                ipv4_address: self.ipv4_bind_address.to_string(),
                http_port: self.http_bind_port,
                https_port: self.https_bind_port,
            },
        }
    }
}
