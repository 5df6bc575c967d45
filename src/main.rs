//! The `portcullis` binary: parses flags and runs a command. Errors end here as one clear line
//! on stderr and a non-zero exit status (see docs/operations.md).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use portcullis::check::{self, CheckError};
use portcullis::cli::{
    AnnotationsCommand, AnnotationsOutput, Cli, Command, DemoArgs, ListCommand, PipelineArgs,
    RunArgs,
};
use portcullis::cluster::ClusterConfig;
use portcullis::cluster::connect::ConnectConfig;
use portcullis::cluster::reflect::NamespaceFilter;
use portcullis::cluster::status::Publish;
use portcullis::controller::{self, RunConfig, RunError, SourceConfig};
use portcullis::pipeline::Output;
use portcullis::source::files;
use portcullis::store::Store;

/// Exit statuses.
mod exit {
    /// The input or the site's scripts/templates could not be used.
    pub(crate) const INPUT: u8 = 1;
    /// HAProxy rejected the rendered configuration.
    pub(crate) const REJECTED: u8 = 3;
    /// Something around us failed (filesystem, missing HAProxy binary, admin port taken).
    pub(crate) const ENVIRONMENT: u8 = 4;
    /// HAProxy exited while `run` was driving it.
    pub(crate) const HAPROXY_EXITED: u8 = 5;
    /// The Kubernetes API server did not answer (or the watches did not list) within
    /// `--startup-timeout`.
    pub(crate) const CLUSTER_UNAVAILABLE: u8 = 6;
    /// The cluster cannot be used and retrying will not help: unusable kubeconfig, 401/403,
    /// a required CRD missing.
    pub(crate) const CLUSTER_REFUSED: u8 = 7;
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Scripts {
            command: ListCommand::List,
            scripts_dir,
        } => list(
            portcullis::source::site::load_policy(scripts_dir.as_deref()).map(|e| {
                e.declarations()
                    .map(|(f, d)| {
                        (
                            f.clone(),
                            format!("{:<8}  {:<20}", d.risk_text(), d.scope_text()),
                        )
                    })
                    .collect::<Vec<_>>()
            }),
        ),
        Command::Annotations {
            command: AnnotationsCommand::List { output },
            scripts_dir,
        } => match portcullis::source::site::load_policy(scripts_dir.as_deref()) {
            Ok(engine) => {
                use portcullis::tools::annotations;
                let rows = annotations::rows(&engine);
                print_out(&match output {
                    AnnotationsOutput::Table => annotations::table(&rows),
                    AnnotationsOutput::Json => annotations::json(&rows),
                    AnnotationsOutput::Markdown => annotations::markdown(&rows),
                });
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for e in errors {
                    eprintln!("error: {e}");
                }
                ExitCode::from(exit::INPUT)
            }
        },
        Command::AdmissionPolicy {
            scripts_dir,
            ingress_class,
            configmap,
            deny,
        } => match portcullis::source::site::load_policy(scripts_dir.as_deref()) {
            Ok(engine) => {
                use portcullis::tools::{admission_policy, annotations};
                let options = admission_policy::PolicyOptions {
                    ingress_class,
                    config_map: configmap,
                    deny,
                };
                print_out(&admission_policy::yaml(
                    &annotations::rows(&engine),
                    &options,
                ));
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for e in errors {
                    eprintln!("error: {e}");
                }
                ExitCode::from(exit::INPUT)
            }
        },
        Command::Webhook(args) => webhook(args),
        Command::Templates {
            command: ListCommand::List,
            templates_dir,
        } => list(
            portcullis::source::site::load_renderer(templates_dir.as_deref()).map(|r| {
                r.templates()
                    .iter()
                    .map(|f| (f.clone(), String::new()))
                    .collect()
            }),
        ),
        Command::Crd => match portcullis::crd::tcp_crd_yaml() {
            Ok(yaml) => {
                print_out(&yaml);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(exit::INPUT)
            }
        },
        Command::Version => {
            println_out(&format!("portcullis {}", env!("CARGO_PKG_VERSION")));
            ExitCode::SUCCESS
        }
        Command::Render(args) => {
            let output = match run_pipeline(&args.manifests, &args.pipeline) {
                Ok(o) => o,
                Err(code) => return code,
            };
            match &args.out {
                Some(dir) => {
                    if let Err(e) = portcullis::check::write_config(&output.rendered, dir) {
                        eprintln!("error: {e}");
                        return ExitCode::from(exit::ENVIRONMENT);
                    }
                    eprintln!(
                        "wrote {} files to {}",
                        output.rendered.files().len(),
                        dir.display()
                    );
                }
                None => print_out(&output.rendered.haproxy_cfg()),
            }
            ExitCode::SUCCESS
        }
        Command::Run(args) => {
            init_logging(&args.haproxy.log_level, args.haproxy.log_format);
            for warning in args.pipeline.ignored_flags() {
                tracing::warn!("{warning}");
            }
            let config = run_config(&args);
            block_on(controller::run(config))
        }
        Command::Demo(args) => {
            init_logging("info", args.log_format);
            block_on(demo(args))
        }
        Command::Test(args) => site_test(&args),
        Command::Check(args) => {
            let output = match run_pipeline(&args.manifests, &args.pipeline) {
                Ok(o) => o,
                Err(code) => return code,
            };
            match check::check_config(&args.haproxy_bin, &output.rendered) {
                Ok(()) => {
                    let m = &output.model;
                    println_out(&format!(
                        "ok: {} backends, {} routing map entries, {} certificates, {} diagnostics; haproxy -c accepted the configuration",
                        m.backends.len(),
                        m.maps.exact.len() + m.maps.prefix.len(),
                        m.tls.pem_files.len(),
                        output.diagnostics.len()
                    ));
                    ExitCode::SUCCESS
                }
                Err(CheckError::Rejected { messages }) => {
                    eprintln!("error: HAProxy rejected the rendered configuration:");
                    for m in &messages {
                        eprintln!("{m}");
                    }
                    // The lines a site template part printed, named with its file and line.
                    let site = &args.pipeline;
                    if site.templates_dir.is_some() {
                        if let Ok(p) = portcullis::source::site::load_pipeline(
                            site.scripts_dir.as_deref(),
                            site.templates_dir.as_deref(),
                            site.translate_config(),
                        ) {
                            let templates = p.renderer.templates();
                            for d in portcullis::attribution::site_parts(
                                &messages,
                                &output.rendered,
                                templates,
                            ) {
                                eprintln!("{d}");
                            }
                        }
                    }
                    ExitCode::from(exit::REJECTED)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(exit::ENVIRONMENT)
                }
            }
        }
    }
}

/// `portcullis test`: runs every case, one line each, then `N passed, M failed`.
fn site_test(args: &portcullis::cli::TestArgs) -> ExitCode {
    // The flags again, as clap matches: a case's `args` file overrides only the flags it names.
    let matches = match <Cli as clap::CommandFactory>::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(2);
        }
    };
    let Some(base) = matches.subcommand_matches("test") else {
        return ExitCode::from(2);
    };
    let each = |case: &portcullis::tools::sitetest::CaseResult| print_out(&case.report());
    match portcullis::tools::sitetest::run(&args.dir, base, each) {
        Ok(summary) => {
            println_out(&summary.to_string());
            if summary.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(exit::INPUT)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::INPUT)
        }
    }
}

/// Prints the effective files of a layered set (name, a detail column such as a script's risk
/// and scope, layer), or the reasons it does not load.
fn list<E: std::fmt::Display>(
    files: Result<Vec<(portcullis::layers::SourceFile, String)>, Vec<E>>,
) -> ExitCode {
    match files {
        Ok(files) => {
            let width = files.iter().map(|(f, _)| f.name.len()).max().unwrap_or(0);
            for (f, detail) in files {
                let detail = if detail.is_empty() {
                    String::new()
                } else {
                    format!("{detail}  ")
                };
                println_out(&format!("{:<width$}  {detail}{}", f.name, f.layer));
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            ExitCode::from(exit::INPUT)
        }
    }
}

fn run_config(args: &RunArgs) -> RunConfig {
    let source = match &args.manifests {
        Some(dir) => SourceConfig::Files(dir.clone()),
        None => {
            let c = &args.cluster;
            SourceConfig::Cluster(ClusterConfig {
                connect: ConnectConfig {
                    kubeconfig: c.kubeconfig.clone(),
                    external: c.external,
                    startup_timeout: Some(c.startup_timeout).filter(|t| !t.is_zero()),
                    tcp_crd: c.tcp_crd,
                },
                namespaces: NamespaceFilter {
                    allow: c.namespaces.iter().cloned().collect(),
                    deny: c.namespaces_deny.iter().cloned().collect(),
                },
                publish: match (&c.publish_service, c.publish_address.is_empty()) {
                    (Some(key), _) => Some(Publish::Service(key.clone())),
                    (None, false) => Some(Publish::Addresses(c.publish_address.clone())),
                    (None, true) => None,
                },
                election_id: c.election_id.clone(),
                lease_duration: c.lease_duration,
            })
        }
    };
    RunConfig {
        source,
        scripts_dir: args.pipeline.scripts_dir.clone(),
        templates_dir: args.pipeline.templates_dir.clone(),
        translate: args.pipeline.translate_config(),
        haproxy_bin: args.haproxy.haproxy_bin.clone(),
        config_dir: args.haproxy.config_dir.clone(),
        runtime_dir: args.haproxy.runtime_dir.clone(),
        external_master_socket: args.haproxy.haproxy_master_socket.clone(),
        admin_addr: args.haproxy.admin_addr,
        debug_addr: args.haproxy.debug_addr,
        debounce: args.haproxy.sync_debounce,
        drain_timeout: args.haproxy.server_drain_timeout,
    }
}

/// Runs a controller future on a fresh runtime and turns its result into an exit status.
fn block_on(fut: impl std::future::Future<Output = Result<(), RunError>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(exit::ENVIRONMENT);
        }
    };
    match runtime.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(match e {
                RunError::Load(_) | RunError::Manifests(_) => exit::INPUT,
                RunError::HaproxyExited => exit::HAPROXY_EXITED,
                RunError::ClusterUnavailable(_) => exit::CLUSTER_UNAVAILABLE,
                RunError::ClusterRefused(_) => exit::CLUSTER_REFUSED,
                _ => exit::ENVIRONMENT,
            })
        }
    }
}

/// The quickstart: echo servers for the example's loopback endpoints, then `run`.
async fn demo(args: DemoArgs) -> Result<(), RunError> {
    let loaded = files::load_dir(&args.manifests)?;
    let backends = portcullis::tools::demo::spawn_demo_backends(&loaded.objects)
        .await
        .map_err(RunError::DemoBackends)?;
    let work = std::env::temp_dir().join(format!("portcullis-demo-{}", std::process::id()));
    let config = RunConfig {
        source: SourceConfig::Files(args.manifests.clone()),
        scripts_dir: None,
        templates_dir: None,
        translate: portcullis::translate::TranslateConfig {
            config_map: Some(portcullis::objects::Key::new("demo", "portcullis")),
            listen: portcullis::model::Listen {
                ipv4_address: "127.0.0.1".to_string(),
                http_port: args.http_bind_port,
                https_port: args.https_bind_port,
                ..portcullis::model::Listen::default()
            },
            ..portcullis::translate::TranslateConfig::default()
        },
        haproxy_bin: args.haproxy_bin.clone(),
        config_dir: work.join("config"),
        runtime_dir: work.join("run"),
        external_master_socket: None,
        admin_addr: args.admin_addr,
        debug_addr: None,
        debounce: std::time::Duration::from_millis(100),
        drain_timeout: portcullis::apply::DEFAULT_DRAIN_TIMEOUT,
    };
    let port = args.http_bind_port;
    eprintln!(
        "\nPortcullis demo: {} echo backends, HAProxy on 127.0.0.1:{port}, files in {}\n\
         Edit the manifests in {} and watch the changes apply. Try:\n\
         \x20 curl -H 'Host: demo.localhost' http://127.0.0.1:{port}/\n\
         \x20 curl -H 'Host: demo.localhost' http://127.0.0.1:{port}/api/users\n\
         \x20 curl -H 'Host: admin.demo.localhost' -i http://127.0.0.1:{port}/\n\
         \x20 curl http://{}/metrics\n\
         Stop with Ctrl-C.\n",
        backends.len(),
        work.display(),
        args.manifests.display(),
        args.admin_addr,
    );
    let result = controller::run(config).await;
    for b in backends {
        b.stop().await;
    }
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// Logs to stderr as text or JSON lines, with a filter the admin endpoint can replace
/// (`PUT /debug/log-level`); HAProxy's lines are written a batch at a time (`logwriter`).
fn init_logging(filter: &str, format: portcullis::cli::LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_new(effective_filter(filter))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(effective_filter("info")));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let ansi = std::io::stderr().is_terminal();
    let installed = match format {
        portcullis::cli::LogFormat::Text => registry
            .with(portcullis::logwriter::text_layer(ansi))
            .try_init(),
        portcullis::cli::LogFormat::Json => registry
            .with(portcullis::logwriter::json_layer())
            .try_init(),
    };
    if installed.is_ok() {
        portcullis::admin::set_log_control(Box::new(ReloadableFilter(handle)));
    }
}

/// kube-rs logs every failed request at ERROR; Portcullis logs each one itself, with its
/// cause and what happens next, so those lines are only noise unless asked for.
fn effective_filter(filter: &str) -> String {
    if filter.contains("kube") {
        filter.to_string()
    } else {
        format!("{filter},kube_client::client::builder=off")
    }
}

/// The log filter in force, replaceable through the admin endpoint.
struct ReloadableFilter(
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
);

impl portcullis::admin::LogControl for ReloadableFilter {
    fn current(&self) -> String {
        self.0.with_current(ToString::to_string).unwrap_or_default()
    }

    fn set(&self, filter: &str) -> Result<String, String> {
        let new = tracing_subscriber::EnvFilter::try_new(effective_filter(filter))
            .map_err(|e| e.to_string())?;
        let text = new.to_string();
        self.0.reload(new).map_err(|e| e.to_string())?;
        Ok(text)
    }
}

/// Loads manifests, scripts and templates and runs the pipeline, printing diagnostics.
fn run_pipeline(manifests: &std::path::Path, args: &PipelineArgs) -> Result<Output, ExitCode> {
    for warning in args.ignored_flags() {
        eprintln!("warning: {warning}");
    }
    let pipeline = portcullis::source::site::load_pipeline(
        args.scripts_dir.as_deref(),
        args.templates_dir.as_deref(),
        args.translate_config(),
    )
    .map_err(|e| {
        for line in e.to_string().lines() {
            eprintln!("error: {line}");
        }
        ExitCode::from(exit::INPUT)
    })?;
    let loaded = files::load_dir(manifests).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(exit::INPUT)
    })?;
    let mut diagnostics = loaded.diagnostics.into_sorted();
    let store = Store::from_objects(loaded.objects);
    // The time only adds certificate expiry warnings; the files do not depend on it.
    let inputs = portcullis::translate::RunInputs {
        now_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_secs()).ok()),
        ..Default::default()
    };
    let (mut output, _) = pipeline.run_with(&store, &inputs).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(exit::INPUT)
    })?;
    diagnostics.append(&mut output.diagnostics);
    for d in &diagnostics {
        eprintln!("{d}");
    }
    output.diagnostics = diagnostics;
    Ok(output)
}

#[allow(clippy::print_stdout)]
fn print_out(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
}

fn println_out(s: &str) {
    print_out(&format!("{s}\n"));
}

/// `portcullis webhook`: serves until SIGTERM or SIGINT.
fn webhook(args: portcullis::cli::WebhookArgs) -> ExitCode {
    use portcullis::admission::{review::ReviewConfig, server};
    init_logging("info", portcullis::cli::LogFormat::Text);
    let engine = match portcullis::source::site::load_policy(args.scripts_dir.as_deref()) {
        Ok(engine) => std::sync::Arc::new(engine),
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            return ExitCode::from(exit::INPUT);
        }
    };
    let config = server::ServeConfig {
        listen: args.listen,
        cert_file: args.tls_cert,
        key_file: args.tls_key,
        deadline: args.deadline,
        review: ReviewConfig {
            ingress_class: args.ingress_class,
            config_map: args.configmap,
            snippets: portcullis::snippets::SnippetPolicy {
                allow: args.allow_config_snippets,
                in_annotations: args.allow_config_snippets_in_annotations,
            },
            budget: portcullis::admission::review::REVIEW_OPERATIONS,
        },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let managed =
        args.certificate_secret.map(
            |secret| portcullis::admission::certificates::ManagedConfig {
                secret,
                webhook_configuration: args.webhook_configuration,
                dns_names: args.dns_name,
                validity: args.certificate_validity,
                cert_file: config.cert_file.clone(),
                key_file: config.key_file.clone(),
            },
        );
    let serving = async move {
        if let Some(managed) = managed {
            portcullis::admission::certificates::start(
                args.kubeconfig,
                managed,
                args.certificate_check,
            )
            .await?;
        }
        server::serve(engine, config, shutdown).await
    };
    match runtime.block_on(serving) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(exit::INPUT)
        }
    }
}
