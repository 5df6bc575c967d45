//! Translation: a store snapshot in, the model out. Pure: no IO, no clock, no randomness.
//!
//! Rust decides the structure (which Ingresses are ours, routes, backends, server slots,
//! certificates); the policy hooks decide what annotations mean. Every bad input is reported
//! against its object and field and only that piece is dropped.

pub mod auth;
pub mod backends;
pub mod class;
pub mod configmaps;
pub mod cookies;
pub mod exposure;
pub mod gateway;
pub mod incremental;
pub mod incumbent_crs;
pub mod parts;
pub mod patterns;
pub mod peers;
pub mod routes;
pub mod slots;
pub mod tcp;
pub mod tcp_rules;
pub mod tls;
pub mod tls_edge;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use sha2::{Digest, Sha256};

use crate::diagnostics::{Diagnostics, Severity};
use crate::model::{
    Backend, BackendSettings, CrtListEntry, DefaultBackend, Listen, Model, RoutePolicy,
    RouteSettings, ServerSlots,
};
use crate::objects::{Key, Kind, ObjectRef, Service};
use crate::policy::{Budget, HookContext, PolicyEngine, RouteOutcome, ValueSource};
use crate::store::Store;
use crate::values;

use backends::ResolvedPort;
pub use incremental::{EndpointUsers, Reuse};
use routes::{PathKind, RedirectClaim, RouteCandidate};

/// Everything translation needs besides the store: flags, parsed once.
#[derive(Debug, Clone)]
pub struct TranslateConfig {
    pub version: String,
    pub ingress_class: String,
    pub controller_class: String,
    /// `--gateway-controller-name`: the `controllerName` of our GatewayClasses.
    pub gateway_controller_name: String,
    /// `--gateway-listener-ports`: the ports Gateway listeners may open binds on.
    pub gateway_listener_ports: gateway::listeners::PortRanges,
    pub watch_ingress_without_class: bool,
    pub config_map: Option<Key>,
    pub default_backend_service: Option<Key>,
    pub default_ssl_certificate: Option<Key>,
    pub listen: Listen,
    /// Where HAProxy opens its runtime API socket, when Portcullis drives it.
    pub runtime_socket: Option<String>,
    /// This controller's pod, for the peers section.
    pub identity: peers::Identity,
    /// Who may write raw config snippets (off unless an administrator turns them on).
    pub snippets: crate::snippets::SnippetPolicy,
    /// The Secret holding the key of dynamic persistence cookies (`cookie-persistence`).
    pub dynamic_cookie_key_secret: Option<Key>,
    /// `--configmap-errorfiles`: status code → HTTP response served as HAProxy's error page.
    pub errorfiles_config_map: Option<Key>,
    /// `--configmap-tcp-services`: port → `namespace/service:port[:ssl][:proxy]`.
    pub tcp_services_config_map: Option<Key>,
    /// `--configmap-patternfiles`: key → pattern file `patterns/<key>`.
    pub patternfiles_config_map: Option<Key>,
    /// Threads that translate Ingresses and assemble backends ahead when a run has many
    /// (see [`crate::parallel`]). The output is the same for any.
    pub workers: crate::parallel::Workers,
    /// `--host-ownership`: whether a host belongs to the namespace of its oldest Ingress.
    pub host_ownership: class::HostOwnership,
    /// What tenants' objects may point HAProxy at (ExternalName, endpoint addresses, TCP
    /// bind ports) and the controller's own listeners they may not take.
    pub exposure: exposure::Exposure,
}

impl Default for TranslateConfig {
    /// The flags' defaults: class `portcullis`, HTTP on 0.0.0.0:80 and HTTPS on 443, no
    /// ConfigMap, no default backend or certificate, no identity.
    fn default() -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_string(),
            ingress_class: "portcullis".to_string(),
            controller_class: "portcullis.io/ingress".to_string(),
            gateway_controller_name: gateway::DEFAULT_CONTROLLER_NAME.to_string(),
            gateway_listener_ports: gateway::listeners::PortRanges::default(),
            watch_ingress_without_class: false,
            config_map: None,
            default_backend_service: None,
            default_ssl_certificate: None,
            listen: Listen::default(),
            runtime_socket: None,
            identity: peers::Identity {
                peer_port: 10000,
                ..peers::Identity::default()
            },
            snippets: crate::snippets::SnippetPolicy::default(),
            dynamic_cookie_key_secret: None,
            errorfiles_config_map: None,
            tcp_services_config_map: None,
            patternfiles_config_map: None,
            workers: crate::parallel::Workers::default(),
            host_ownership: class::HostOwnership::default(),
            exposure: exposure::Exposure::default(),
        }
    }
}

/// What a pipeline run knows besides the store: the time (for expiry warnings only; it never
/// changes the output) and the certificates in force, so that an invalid Secret update keeps
/// the previous good certificate instead of dropping it.
#[derive(Debug, Clone, Default)]
pub struct RunInputs {
    pub now_unix: Option<i64>,
    /// By Secret; shared, since a large cluster holds thousands and most runs change none.
    pub previous_certificates: Arc<BTreeMap<Key, crate::model::PemFile>>,
    /// The resolver's answers for ExternalName names (`run`); `None` renders the names.
    pub external_names: Option<Arc<exposure::ResolvedNames>>,
    /// Certificate files HAProxy refused (`run`), with its words: their Secrets' hosts are
    /// served without them (see [`tls::Unserved::Refused`]).
    pub refused_certificates: Arc<BTreeMap<crate::model::CertPath, String>>,
    /// TLS cipher lists of the controller ConfigMap HAProxy refused (`run`): by key, the
    /// value refused and HAProxy's words. While the key holds that value it is left out.
    pub refused_tls_keys: Arc<crate::policy::global_keys::RefusedTlsKeys>,
}

/// The model and everything that was wrong with the input.
#[derive(Debug)]
pub struct Translation {
    pub model: Model,
    pub diagnostics: Diagnostics,
    /// What a later run needs to redo only the backends whose endpoints changed.
    pub reuse: Reuse,
    /// The parts a later run may take instead of translating them again.
    pub parts: parts::Parts,
    /// The run's hook operation budget, as the run left it.
    pub budget: Budget,
}

/// Whether a host's HTTP requests are redirected to HTTPS, with which status, and to which
/// port (`ssl-redirect-port`; none: the default one).
type Redirect = (bool, u16, Option<u16>);

/// The first second at which the expiry message of a certificate ending at `end` reads
/// differently than at `now` (see [`Translator::certificate`]).
fn expiry_message_stable_until(end: i64, now: i64) -> Option<i64> {
    const DAY: i64 = 86_400;
    let remaining = end - now;
    if remaining <= 0 {
        None
    } else if remaining >= 14 * DAY {
        Some(end - 14 * DAY + 1)
    } else if remaining < DAY {
        Some(end)
    } else {
        Some(end - (remaining / DAY) * DAY + 1)
    }
}

/// A backend being assembled: the Service port and who refers to it.
#[derive(Debug, Clone)]
struct BackendBuild {
    service: Key,
    port: ResolvedPort,
    /// The oldest Ingress routing here; its annotations rank between Service and ConfigMap.
    ingress: Option<(ObjectRef, Arc<BTreeMap<String, String>>)>,
    policies: BTreeMap<String, Arc<RouteSettings>>,
}

/// Translates a snapshot into the model, every Ingress and backend from scratch.
pub fn translate(
    store: &Store,
    config: &TranslateConfig,
    policy: &PolicyEngine,
    inputs: &RunInputs,
) -> Translation {
    translate_taking(
        store,
        config,
        policy,
        inputs,
        None,
        parts::Carried::default(),
    )
}

/// [`translate`], taking from `prior` the parts of the last run, when nothing but Ingresses,
/// EndpointSlices and the Gateway API's objects changed since (see [`parts`]; an HTTPRoute's
/// part is taken only when made from the same inputs), and patching what that run left in `carried`
/// ([`parts::Parts::take_carried`]). The translation is the same.
pub fn translate_taking<'a>(
    store: &'a Store,
    config: &'a TranslateConfig,
    policy: &'a PolicyEngine,
    inputs: &'a RunInputs,
    prior: Option<incremental::Prior<'a>>,
    carried: parts::Carried,
) -> Translation {
    // A run that takes parts keeps every remembered result: the parts stand for the work.
    if prior.is_none() {
        policy.begin_run();
    }
    let ctx = Ctx {
        store,
        config,
        inputs,
        policy,
        config_map: None,
        resources: Vec::new(),
        owners: None,
        patterns: Arc::default(),
    };
    let mut t = Translator::new(&ctx);
    t.incremental = incremental::Incremental::new(prior, carried);
    t.registered = Some(Vec::new());
    t.load_config_map();
    t.ctx.patterns = Arc::new(patterns::PatternFiles::load(
        store,
        config.patternfiles_config_map.as_ref(),
        &mut t.diags,
    ));
    t.ctx.resources = t.config_resources();
    let global = {
        let subject = config.config_map.as_ref().map_or_else(
            || ObjectRef::new(Kind::ConfigMap, &Key::new("", "(none)")),
            |k| ObjectRef::new(Kind::ConfigMap, k),
        );
        let ctx = HookContext::new(
            subject.clone(),
            t.ctx
                .resources
                .iter()
                .chain(&t.ctx.config_map)
                .cloned()
                .collect(),
            BTreeMap::new(),
        )
        .with_snippets(config.snippets);
        let run = policy.run_global(&ctx, t.budget);
        t.budget = run.budget;
        t.diags.extend(run.diagnostics);
        let mut settings = run.settings;
        crate::policy::global_keys::leave_out_refused(
            &mut settings,
            &inputs.refused_tls_keys,
            &subject,
            &mut t.diags,
        );
        settings
    };
    if let Some(key) = &config.default_backend_service {
        t.default_backend_service(key);
    }
    let filter = class::ClassFilter::new(
        store,
        &config.ingress_class,
        &config.controller_class,
        config.watch_ingress_without_class,
    );
    for (key, ingress) in store.ingresses() {
        if let Some(why) = filter.unserved(store, ingress) {
            t.diags.object(
                Severity::Error,
                &ObjectRef::new(Kind::Ingress, key),
                "spec.ingressClassName",
                filter.unserved_message(&why),
            );
        }
    }
    // Oldest first, then by namespace and name: where two Ingresses claim the same thing,
    // the older one wins.
    let order = t.incremental.ingress_order(store, &filter);
    if config.host_ownership == class::HostOwnership::Namespace {
        let ingresses = order.iter().map(|o| (&o.key, &*o.ingress));
        t.ctx.owners = Some(Arc::new(class::HostOwners::new(ingresses)));
    }
    let mut ahead = t.translate_ahead(&order);
    for (rank, ordered) in order.iter().enumerate() {
        let part = ahead.get_mut(rank).and_then(Option::take);
        t.ingress(rank, &ordered.key, &ordered.ingress, part);
    }
    t.gateway_api(order.iter().count());
    t.incremental.keep_ingress_order(order);
    let mut tcps: Vec<(&Key, &Arc<crate::objects::Tcp>)> = store
        .tcps()
        .filter(|(_, t)| filter.accepts_meta(&t.metadata))
        .collect();
    tcps.sort_by(|a, b| {
        let age = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            m.creation_timestamp.clone().map(|t| t.0)
        };
        age(&a.1.metadata)
            .cmp(&age(&b.1.metadata))
            .then_with(|| a.0.cmp(b.0))
    });
    t.tcp_objects(&tcps);
    // The ConfigMap's `ssl-certificate` replaces --default-ssl-certificate when it loads, and
    // when HAProxy refused it (its hosts are then served without a default certificate).
    let mut replaced = false;
    if let Some(reference) = &global.tls.ssl_certificate {
        replaced = t.default_certificate_from(&tls_edge::secret_key(reference), "ssl-certificate");
    }
    if !replaced {
        if let Some(key) = &config.default_ssl_certificate {
            t.default_certificate(key);
        }
    }
    t.tcp_services_config_map();
    t.refused_endpoints();
    t.finish(global)
}

/// A part made by [`translate_ingress`] or [`assemble_backend`], and the operations its hooks
/// used (`None` when a call was stopped: then the part is not kept, and one made ahead by a
/// worker is made again).
type Forked<P> = (P, Option<u64>);

/// What translating one Ingress or assembling one backend reads besides the object: the
/// snapshot, the flags, the run's inputs and scripts, and what the run settled before any
/// object (the controller ConfigMap's values; under `--host-ownership=namespace`, the
/// namespace each host belongs to). Read-only, and nothing in it comes from an earlier run:
/// the same object and context give the same part.
#[derive(Debug, Clone)]
pub struct Ctx<'a> {
    pub store: &'a Store,
    pub config: &'a TranslateConfig,
    pub inputs: &'a RunInputs,
    pub policy: &'a PolicyEngine,
    /// The controller ConfigMap as a source of values, when it exists.
    pub config_map: Option<ValueSource>,
    /// The Global and Defaults resources it names (`cr-global`, `cr-defaults`), which take
    /// precedence over its keys.
    pub resources: Vec<ValueSource>,
    pub owners: Option<Arc<class::HostOwners>>,
    /// The pattern files of `--configmap-patternfiles`, read once per run.
    pub patterns: Arc<patterns::PatternFiles>,
}

/// One Ingress' rules and TLS section (its default backend is the run's, where the first
/// Ingress to name one wins) as the part it contributes at age rank `rank`, its hooks running
/// on `budget`: the part, the operations its hooks used (`None` when a call was stopped) and
/// the budget after.
pub fn translate_ingress(
    rank: usize,
    key: &Key,
    ingress: &Arc<Ingress>,
    ctx: &Ctx<'_>,
    budget: Budget,
) -> (Forked<parts::IngressPart>, Budget) {
    let mut t = Translator::new(ctx);
    t.budget = budget;
    t.ingress_rules(rank, key, ingress);
    let after = t.budget;
    let operations = after.used_since(budget);
    let part = t.into_ingress_part(ingress.clone(), rank, operations.unwrap_or(0));
    ((part, operations), after)
}

/// The HTTP backend `build` registers, assembled (its backend hook on `budget`, cookies,
/// servers and server TLS settings): the part, the operations its hook used (`None` when a
/// call was stopped) and the budget after.
pub fn assemble_backend(
    build: &Arc<parts::Registration>,
    ctx: &Ctx<'_>,
    budget: Budget,
) -> (Forked<parts::BackendPart>, Budget) {
    let mut t = Translator::new(ctx);
    t.budget = budget;
    let mut backend = t.backend(build.name.clone(), build.to_build());
    let service = ObjectRef::new(Kind::Service, &build.service);
    tls_edge::resolve_server_tls(
        &mut backend.settings,
        t.store,
        &service,
        &mut t.diags,
        &mut t.static_files,
    );
    let after = t.budget;
    let operations = after.used_since(budget);
    let part = parts::BackendPart {
        build: build.clone(),
        backend: Arc::new(backend),
        diagnostics: t.diags.into_sorted(),
        static_files: t.static_files.into_iter().collect(),
        follows_endpoints: !t.reuse.endpoint_users.is_empty(),
        operations: operations.unwrap_or(0),
    };
    ((part, operations), after)
}

/// What the paths of one Ingress share while they are translated.
struct IngressScope {
    rank: usize,
    object: ObjectRef,
    /// The object the Ingress' routes name, shared by them.
    route_object: Arc<ObjectRef>,
    annotations: Arc<BTreeMap<String, String>>,
    /// The hook sources of every path: the annotations, resources, ConfigMap.
    sources: Vec<ValueSource>,
    /// The Services' annotations as hook sources, made once per Service: the paths of an
    /// Ingress mostly name one or two.
    service_sources: Vec<(Key, ValueSource)>,
    /// The first route outcome per host decides that host's ssl-redirect; a TLS host
    /// without a rule of its own follows the Ingress' first route.
    redirect_by_host: BTreeMap<String, Redirect>,
    first_redirect: Option<Redirect>,
    /// The TLS options of the Ingress' TLS hosts: its first route's (they are read from the
    /// Ingress, so every route of it has the same).
    host_tls: Option<Option<crate::model::HostTls>>,
    /// The hosts the rules route: the only ones the TLS entries may speak for.
    routed: tls_edge::RoutedHosts,
}

impl IngressScope {
    fn service_source(&mut self, key: &Key, service: &Service) -> ValueSource {
        if let Some((_, source)) = self.service_sources.iter().find(|(k, _)| k == key) {
            return source.clone();
        }
        let source = Translator::service_source(key, service);
        self.service_sources.push((key.clone(), source.clone()));
        source
    }

    /// `host` is routed by an HTTP route with `outcome`'s ssl-redirect.
    fn routes_host(&mut self, host: &str, outcome: &RouteOutcome) {
        let decision = (
            outcome.ssl_redirect.unwrap_or(false),
            outcome.ssl_redirect_code.unwrap_or(302),
            outcome.ssl_redirect_port,
        );
        self.redirect_by_host
            .entry(host.to_string())
            .or_insert(decision);
        self.first_redirect.get_or_insert(decision);
        self.routed.insert(host);
    }
}

struct Translator<'a> {
    store: &'a Store,
    config: &'a TranslateConfig,
    inputs: &'a RunInputs,
    policy: &'a PolicyEngine,
    /// What the hooks may still do in this run (for a part: in the work it does).
    budget: Budget,
    diags: Diagnostics,
    backends: BTreeMap<String, BackendBuild>,
    routes: Vec<RouteCandidate>,
    redirects: Vec<RedirectClaim>,
    tls_entries: Vec<CrtListEntry>,
    default_certificate: Option<CrtListEntry>,
    pem_files: BTreeMap<crate::model::CertPath, Arc<str>>,
    /// The default backend and what chose it, for messages.
    default_backend: Option<(String, String)>,
    tcp_services: Vec<crate::model::TcpService>,
    tcp_backends: BTreeMap<String, BackendBuild>,
    /// TLSRoutes on the HTTPS port, resolved against the ssl-passthrough hosts in `finish`.
    gateway_sni: Vec<gateway::l4::SniRule>,
    /// Some Gateway API TCP or TLS frontend sends connections to `portcullis_reject`.
    gateway_reject: bool,
    /// Gateway API HTTP and HTTPS listeners on ports of their own.
    gateway_http_ports: Vec<crate::model::HttpPort>,
    /// `request-capture` slots of the frontends, in the order routes first ask for them.
    captures: Vec<crate::model::FrontendCapture>,
    /// `userlist` sections of basic authentication, read from Secrets.
    userlists: auth::Userlists,
    /// `ssl-passthrough` hosts, resolved into the SNI map in `finish`.
    passthrough: Vec<tls_edge::PassthroughClaim>,
    /// Files haproxy.cfg names directly (CA bundles, client certificates to the pods).
    static_files: BTreeMap<crate::model::CertPath, Arc<str>>,
    reuse: Reuse,
    /// What the run takes from the last one, and keeps for the next (the main
    /// translator's: the parts' own translators take nothing).
    incremental: incremental::Incremental<'a>,
    /// Every Ingress' part, oldest Ingress first: their routes make the maps.
    ingress_parts: Vec<Arc<parts::IngressPart>>,
    /// The run's HTTP backend registrations besides the Ingress parts' (default backends),
    /// each with the number of Ingress parts before it (the main translator's: a part's
    /// translator registers into `backends`). `finish` groups them with the parts' by name.
    registered: Option<Vec<(usize, Arc<parts::Registration>)>>,
    /// The crt-list lines of the Ingress parts so far, repeats included.
    tls_entries_from_parts: usize,
    /// The hosts this part's Ingress named, each with the namespace it was refused for (see
    /// [`parts::IngressPart::host_verdicts`]).
    host_verdicts: Vec<(String, Option<Arc<str>>)>,
    /// What the run settled before any object (the ConfigMap's values, the owners of
    /// hosts), for the parts made under this translator.
    ctx: Ctx<'a>,
}

impl<'a> Translator<'a> {
    fn load_config_map(&mut self) {
        let Some(key) = &self.config.config_map else {
            return;
        };
        let object = ObjectRef::new(Kind::ConfigMap, key);
        match self.store.config_map(key) {
            Some(cm) => {
                let data = cm.data.clone().unwrap_or_default();
                self.policy
                    .vocabulary()
                    .check_config_map(&object, &data, &mut self.diags);
                self.ctx.config_map = Some(ValueSource::config_map(object, Arc::new(data)));
            }
            None => self.diags.push(crate::diagnostics::Diagnostic {
                severity: Severity::Warning,
                subject: crate::diagnostics::Subject::Object(object),
                field: None,
                message: "the controller ConfigMap does not exist; using defaults".to_string(),
            }),
        }
    }

    fn default_backend_service(&mut self, key: &Key) {
        let object = ObjectRef::new(Kind::Service, key);
        let Some(service) = self.store.service(key) else {
            self.diags.object(
                Severity::Error,
                &object,
                "--default-backend-service",
                "the Service does not exist; unmatched requests get 404",
            );
            return;
        };
        let first_port =
            service
                .ports
                .first()
                .map(|p| k8s_openapi::api::networking::v1::ServiceBackendPort {
                    name: None,
                    number: Some(p.port),
                });
        let Some(port) = first_port else {
            self.diags.object(
                Severity::Error,
                &object,
                "spec.ports",
                "the default backend Service has no port; unmatched requests get 404",
            );
            return;
        };
        match self.resolve_port(service, &port) {
            Ok(resolved) => {
                let name = self.register_backend(key, resolved, None);
                self.default_backend = Some((name, format!("--default-backend-service {key}")));
            }
            Err(e) => self.diags.object(Severity::Error, &object, "spec.ports", e),
        }
    }

    /// Registers (once) the HTTP backend for a Service port; the first Ingress that names it
    /// supplies its annotations.
    fn register_backend(
        &mut self,
        service: &Key,
        port: ResolvedPort,
        ingress: Option<(ObjectRef, Arc<BTreeMap<String, String>>)>,
    ) -> String {
        let name = format!("{}_{}_{}", service.namespace, service.name, port.number);
        self.add_registration(&name, service, port, ingress);
        name
    }

    /// One registration of HTTP backend `name`: noted in order by the main translator, made
    /// into the table at once for a part (whose routes then add their policies to it).
    fn add_registration(
        &mut self,
        name: &str,
        service: &Key,
        port: ResolvedPort,
        ingress: Option<(ObjectRef, Arc<BTreeMap<String, String>>)>,
    ) {
        if let Some(registered) = &mut self.registered {
            let registration = Arc::new(parts::Registration {
                name: name.to_string(),
                service: service.clone(),
                port,
                ingress,
                policies: Box::default(),
            });
            registered.push((self.ingress_parts.len(), registration));
            return;
        }
        let entry = register(&mut self.backends, name, service, port);
        if entry.ingress.is_none() {
            entry.ingress = ingress;
        }
    }

    /// Registers (once) the TCP-mode backend for a Service port.
    fn register_tcp_backend(&mut self, service: &Key, port: ResolvedPort) -> String {
        let name = format!("tcp_{}_{}_{}", service.namespace, service.name, port.number);
        register(&mut self.tcp_backends, &name, service, port);
        name
    }

    /// Resolves an Ingress backend reference to a registered backend name.
    fn ingress_backend(
        &mut self,
        ingress: &ObjectRef,
        annotations: &Arc<BTreeMap<String, String>>,
        backend: &IngressBackend,
        field: &str,
    ) -> Option<String> {
        let (key, resolved, _) =
            self.resolve_ingress_backend(ingress, backend, || field.to_string(), "route skipped")?;
        Some(self.register_backend(&key, resolved, Some((ingress.clone(), annotations.clone()))))
    }

    /// The Service and port an Ingress backend reference names, without registering a
    /// backend; problems are reported against `field()` (made only for a report: a cold
    /// run resolves tens of thousands of paths), ending with `consequence`.
    fn resolve_ingress_backend(
        &mut self,
        ingress: &ObjectRef,
        backend: &IngressBackend,
        field: impl Fn() -> String,
        consequence: &str,
    ) -> Option<(Key, ResolvedPort, &'a Arc<Service>)> {
        let Some(svc) = &backend.service else {
            self.diags.object(
                Severity::Error,
                ingress,
                field(),
                format!(
                    "only Service backends are supported (resource backends are not); {consequence}"
                ),
            );
            return None;
        };
        let key = Key::new(ingress.namespace.clone(), svc.name.clone());
        let Some(service) = self.store.service(&key) else {
            self.diags.object(
                Severity::Error,
                ingress,
                format!("{}.service.name", field()),
                format!("Service {key} does not exist; {consequence}"),
            );
            return None;
        };
        let port = svc.port.clone().unwrap_or_default();
        match self.resolve_port(service, &port) {
            Ok(resolved) => Some((key, resolved, service)),
            Err(e) => {
                self.diags.object(
                    Severity::Error,
                    ingress,
                    format!("{}.service.port", field()),
                    format!("Service {key}: {e}; {consequence}"),
                );
                None
            }
        }
    }

    /// The annotations of Service `key`, for `ctx.service()` in route hooks.
    fn service_source(key: &Key, service: &Service) -> ValueSource {
        let annotations = service.metadata.annotations.clone().unwrap_or_default();
        ValueSource::annotations(ObjectRef::new(Kind::Service, key), Arc::new(annotations))
    }

    /// Registers (once) the backend of Ingress `ingress` alone for a Service port
    /// (`standalone-backend`): `<namespace>_<ingress>_svc_<service>_<port>`, with the dots of
    /// the Ingress name as `:` (a dot separates the backend from the policy in map values).
    /// Its backend-scope settings come from the Service, then this Ingress, then the ConfigMap.
    fn register_standalone_backend(
        &mut self,
        service: &Key,
        port: ResolvedPort,
        ingress: &ObjectRef,
        annotations: Arc<BTreeMap<String, String>>,
    ) -> String {
        let name = format!(
            "{}_{}_svc_{}_{}",
            ingress.namespace,
            ingress.name.replace('.', ":"),
            service.name,
            port.number
        );
        self.add_registration(&name, service, port, Some((ingress.clone(), annotations)));
        name
    }

    /// Records the capture slots `request-capture` asks for, in the order routes first ask
    /// for them, each with the route policies it applies to.
    fn add_captures(&mut self, capture: &crate::model::RequestCapture, policy: &str) {
        for sample in &capture.samples {
            let found = self
                .captures
                .iter()
                .position(|c| c.sample == *sample && c.len == capture.len);
            let i = found.unwrap_or_else(|| {
                self.captures.push(crate::model::FrontendCapture {
                    sample: sample.clone(),
                    len: capture.len,
                    policies: Vec::new(),
                });
                self.captures.len() - 1
            });
            if let Some(slot) = self.captures.get_mut(i) {
                if !slot.policies.iter().any(|p| p == policy) {
                    slot.policies.push(policy.to_string());
                    slot.policies.sort();
                }
            }
        }
    }

    /// A translator with nothing translated yet.
    fn new(ctx: &Ctx<'a>) -> Self {
        let inputs = ctx.inputs;
        Translator {
            store: ctx.store,
            config: ctx.config,
            inputs,
            policy: ctx.policy,
            budget: ctx.policy.budget(),
            diags: Diagnostics::new(),
            backends: BTreeMap::new(),
            routes: Vec::new(),
            redirects: Vec::new(),
            tls_entries: Vec::new(),
            default_certificate: None,
            pem_files: BTreeMap::new(),
            tcp_services: Vec::new(),
            tcp_backends: BTreeMap::new(),
            gateway_sni: Vec::new(),
            gateway_reject: false,
            gateway_http_ports: Vec::new(),
            default_backend: None,
            captures: Vec::new(),
            userlists: auth::Userlists::default(),
            passthrough: Vec::new(),
            static_files: BTreeMap::new(),
            reuse: Reuse {
                knew_time: inputs.now_unix.is_some(),
                external_names: inputs.external_names.clone(),
                refused_certificates: inputs.refused_certificates.clone(),
                refused_tls_keys: inputs.refused_tls_keys.clone(),
                ..Reuse::default()
            },
            incremental: incremental::Incremental::default(),
            ingress_parts: Vec::new(),
            registered: None,
            tls_entries_from_parts: 0,
            host_verdicts: Vec::new(),
            ctx: ctx.clone(),
        }
    }

    /// The Ingresses of `order` this run will not take from the last one, translated ahead
    /// on worker threads when there are enough of them (`config.workers`), by rank. Each
    /// starts with the whole run budget; [`Translator::ingress`] takes its part
    /// only when the operations it used still fit the run's (then its hooks ran as they would
    /// have in turn), else translates the Ingress again.
    fn translate_ahead(
        &self,
        order: &parts::IngressOrder,
    ) -> Vec<Option<Forked<parts::IngressPart>>> {
        // After changes, the Ingresses without a part are the changed ones (and any whose
        // part was not kept: a stopped hook call), which the run translates in turn when
        // there are few: most runs stop here.
        let at_most = self.incremental.to_translate_at_most();
        if !self.config.workers.spread(at_most) {
            return Vec::new();
        }
        let to_translate: Vec<(usize, &Key, &Arc<Ingress>)> = order
            .iter()
            .enumerate()
            .filter(|(rank, o)| self.prior_ingress(*rank, &o.key, &o.ingress).is_none())
            .map(|(rank, o)| (rank, &o.key, &o.ingress))
            .collect();
        if !self.config.workers.spread(to_translate.len()) {
            return Vec::new();
        }
        let parts = crate::parallel::map(&to_translate, self.config.workers, |(rank, key, i)| {
            self.translate_ingress(*rank, key, i, self.budget.whole()).0
        });
        let ranks = to_translate.last().map_or(0, |(rank, _, _)| rank + 1);
        let mut by_rank: Vec<Option<Forked<parts::IngressPart>>> =
            std::iter::repeat_with(|| None).take(ranks).collect();
        for ((rank, _, _), part) in to_translate.iter().zip(parts) {
            by_rank[*rank] = Some(part);
        }
        by_rank
    }

    /// One Ingress: its default backend here, the rest from its part of the last run when it
    /// is the same object (and the operations its hooks used fit the budget), else from
    /// `ahead` (translated by a worker) when its operations fit, else translated in turn.
    fn ingress(
        &mut self,
        rank: usize,
        key: &Key,
        ingress: &Arc<Ingress>,
        ahead: Option<Forked<parts::IngressPart>>,
    ) {
        if let Some(default) = ingress
            .spec
            .as_ref()
            .and_then(|s| s.default_backend.as_ref())
        {
            self.ingress_default_backend(key, ingress, default);
        }
        let taken = self
            .prior_ingress(rank, key, ingress)
            .filter(|part| self.budget.charge(part.operations));
        let part = match taken {
            Some(part) => self.incremental.took_ingress(rank, part),
            None => {
                let ahead = ahead.filter(|(_, ops)| ops.is_some_and(|o| self.budget.charge(o)));
                let (part, operations) = match ahead {
                    Some(ahead) => ahead,
                    None => {
                        let (part, budget) =
                            self.translate_ingress(rank, key, ingress, self.budget);
                        self.budget = budget;
                        part
                    }
                };
                self.incremental
                    .made_ingress(rank, part, operations.is_some())
            }
        };
        self.absorb_ingress(&ObjectRef::new(Kind::Ingress, key), &part);
        self.ingress_parts.push(part);
    }

    /// The last run's part of this very Ingress object (see [`incremental::Incremental::ingress`]).
    fn prior_ingress(
        &self,
        rank: usize,
        key: &Key,
        ingress: &Arc<Ingress>,
    ) -> Option<&'a Arc<parts::IngressPart>> {
        self.incremental
            .ingress(rank, key, ingress, self.ctx.owners.as_deref())
    }

    /// An Ingress' part, made by [`translate_ingress`] in this run's context on `budget`,
    /// and the budget after.
    fn translate_ingress(
        &self,
        rank: usize,
        key: &Key,
        ingress: &Arc<Ingress>,
        budget: Budget,
    ) -> (Forked<parts::IngressPart>, Budget) {
        translate_ingress(rank, key, ingress, &self.ctx, budget)
    }

    /// `spec.defaultBackend`: the first Ingress to set one wins.
    fn ingress_default_backend(&mut self, key: &Key, ingress: &Ingress, default: &IngressBackend) {
        let object = ObjectRef::new(Kind::Ingress, key);
        if let Some((_, owner)) = &self.default_backend {
            self.diags.object(
                Severity::Warning,
                &object,
                "spec.defaultBackend",
                format!("ignored: the default backend is already set by {owner}"),
            );
        } else {
            let annotations = Arc::new(ingress.metadata.annotations.clone().unwrap_or_default());
            if let Some(name) =
                self.ingress_backend(&object, &annotations, default, "spec.defaultBackend")
            {
                self.default_backend = Some((name, object.to_string()));
            }
        }
    }

    /// This translator's state as the part of `ingress`.
    fn into_ingress_part(
        self,
        ingress: Arc<Ingress>,
        rank: usize,
        operations: u64,
    ) -> parts::IngressPart {
        parts::IngressPart {
            ingress,
            rank,
            has_canary: self.routes.iter().any(|r| r.canary.is_some()),
            // Kept until the Ingress changes: without the room their growth left.
            routes: shrunk(self.routes),
            redirects: shrunk(self.redirects),
            tls_entries: shrunk(self.tls_entries),
            passthrough: self.passthrough,
            host_verdicts: self.host_verdicts,
            backends: self
                .backends
                .into_iter()
                .map(|(name, build)| Arc::new(parts::Registration::from_build(name, build)))
                .collect(),
            captures: self.captures,
            userlists: self.userlists,
            pem_files: self.pem_files.into_iter().collect(),
            diagnostics: self.diags.into_sorted(),
            previous_read: self.reuse.previous_read,
            stable_until: self.reuse.stable_until,
            operations,
        }
    }

    /// Takes the part of `object` (an Ingress, or a Gateway API object) into this run's state,
    /// as translating it here would have. The part is the next of `ingress_parts` (pushed
    /// after this).
    fn absorb_ingress(&mut self, object: &ObjectRef, part: &parts::IngressPart) {
        for capture in &part.captures {
            match self
                .captures
                .iter_mut()
                .find(|c| c.sample == capture.sample && c.len == capture.len)
            {
                Some(slot) => {
                    slot.policies.extend(capture.policies.iter().cloned());
                    slot.policies.sort();
                    slot.policies.dedup();
                }
                None => {
                    // Older Ingresses come first: a new slot over the caps is refused on the
                    // Ingress that asked for it, and those before it keep theirs.
                    match values::check_capture_slot(&self.captures, capture) {
                        Ok(()) => self.captures.push(capture.clone()),
                        Err(e) => self.diags.object(
                            Severity::Error,
                            object,
                            "annotation request-capture",
                            e,
                        ),
                    }
                }
            }
        }
        self.userlists.absorb(&part.userlists);
        for d in &part.diagnostics {
            self.diags.push(d.clone());
        }
        self.reuse
            .previous_read
            .extend(part.previous_read.iter().cloned());
        if let Some(until) = part.stable_until {
            let soonest = self.reuse.stable_until.map_or(until, |u| u.min(until));
            self.reuse.stable_until = Some(soonest);
        }
        // Crt-list lines, certificate files, redirect and passthrough claims are gathered
        // in `finish`, or taken from the last run (see `parts::PartsTls`).
        self.tls_entries_from_parts += part.tls_entries.len();
    }

    /// An Ingress' rules and TLS section (into a part: see [`translate_ingress`]).
    fn ingress_rules(&mut self, rank: usize, key: &Key, ingress: &Ingress) {
        let object = ObjectRef::new(Kind::Ingress, key);
        let annotations = Arc::new(ingress.metadata.annotations.clone().unwrap_or_default());
        // Made with the Ingress' part, so an unchanged Ingress costs nothing here.
        self.policy
            .vocabulary()
            .check_annotations(&object, &annotations, &mut self.diags);
        let Some(spec) = &ingress.spec else {
            return;
        };
        let mut sources = vec![ValueSource::annotations(
            object.clone(),
            annotations.clone(),
        )];
        sources.extend(self.ctx.resources.iter().cloned());
        sources.extend(self.ctx.config_map.iter().cloned());
        let mut scope = IngressScope {
            rank,
            route_object: Arc::new(object.clone()),
            object,
            annotations,
            sources,
            service_sources: Vec::new(),
            redirect_by_host: BTreeMap::new(),
            first_redirect: None,
            host_tls: None,
            routed: tls_edge::RoutedHosts::default(),
        };
        let mut hosts = BTreeSet::new();
        for (i, rule) in spec.rules.iter().flatten().enumerate() {
            let Some(host) =
                self.rule_host(i, rule.host.as_deref(), key, &scope.object, &mut hosts)
            else {
                continue;
            };
            let Some(http) = &rule.http else { continue };
            for (j, path) in http.paths.iter().enumerate() {
                let field = format!("spec.rules[{i}].http.paths[{j}]");
                self.ingress_path(&mut scope, &host, field, path);
            }
        }
        self.ingress_tls(
            spec,
            rank,
            key,
            &scope.object,
            &scope.routed,
            (
                &scope.redirect_by_host,
                scope.first_redirect,
                scope.host_tls.flatten(),
            ),
        );
    }

    /// One path of an Ingress rule for `host`: its route hook, then an HTTP route to its
    /// backend (a 503 route when the backend does not resolve), or an SNI route under
    /// ssl-passthrough.
    fn ingress_path(
        &mut self,
        scope: &mut IngressScope,
        host: &str,
        field: String,
        path: &k8s_openapi::api::networking::v1::HTTPIngressPath,
    ) {
        let object = scope.object.clone();
        let kind = match PathKind::parse(&path.path_type) {
            Ok(k) => k,
            Err(e) => {
                self.diags.object(
                    Severity::Error,
                    &object,
                    format!("{field}.pathType"),
                    format!("{e}; path skipped"),
                );
                return;
            }
        };
        let raw = path.path.as_deref().unwrap_or("/");
        let raw = if raw.is_empty() { "/" } else { raw };
        let parsed = match values::parse_path(raw) {
            Ok(p) => p,
            Err(e) => {
                self.diags.object(
                    Severity::Error,
                    &object,
                    format!("{field}.path"),
                    format!("{e}; path skipped"),
                );
                return;
            }
        };
        let target = self.resolve_ingress_backend(
            &object,
            &path.backend,
            || format!("{field}.backend"),
            "the path answers 503",
        );
        let facts = BTreeMap::from([
            ("host", host.to_string()),
            ("path", parsed.clone()),
            ("path_type", kind.as_str().to_string()),
        ]);
        let mut ctx = HookContext::new(object.clone(), scope.sources.clone(), facts)
            .with_snippets(self.config.snippets);
        if let Some((service_key, _, service)) = &target {
            ctx = ctx.with_service(scope.service_source(service_key, service));
        }
        let run = self.policy.run_route(&ctx, self.budget);
        self.budget = run.budget;
        self.diags.extend(run.diagnostics);
        let mut outcome = run.settings;
        self.check_pattern_refs(&object, &mut outcome);
        scope
            .host_tls
            .get_or_insert_with(|| outcome.host_tls.clone());
        let mut route = RouteCandidate {
            host: host.to_string(),
            path: parsed,
            kind,
            value: routes::UNAVAILABLE_BACKEND.into(),
            rank: scope.rank,
            ingress: scope.route_object.clone(),
            field,
            canary: None,
        };
        // ssl-passthrough: the host goes to the Service's TCP backend by SNI; the path makes
        // no HTTP route.
        if outcome.ssl_passthrough == Some(true) {
            if let Some((service_key, resolved, _)) = target {
                self.passthrough_path(scope, route, (service_key, resolved), &outcome);
            }
            return;
        }
        scope.routes_host(host, &outcome);
        // Without a backend the path keeps its keys and answers 503 (the error above says
        // why): falling through would serve another route's backend.
        if let Some((service_key, resolved, _)) = target {
            route.canary = outcome
                .route_acl
                .clone()
                .map(|c| Box::new(routes::Canary::one(c)));
            route.value = self
                .route_backend(scope, &service_key, resolved, outcome)
                .into();
        }
        self.routes.push(route);
    }

    /// The backend value a resolved HTTP route maps to: the Service's backend (the
    /// Ingress' own under standalone-backend), with the route's policy when it has one.
    fn route_backend(
        &mut self,
        scope: &IngressScope,
        service_key: &Key,
        resolved: ResolvedPort,
        outcome: RouteOutcome,
    ) -> String {
        let object = &scope.object;
        let backend = if outcome.standalone_backend == Some(true) {
            self.register_standalone_backend(
                service_key,
                resolved,
                object,
                scope.annotations.clone(),
            )
        } else {
            self.register_backend(
                service_key,
                resolved,
                Some((object.clone(), scope.annotations.clone())),
            )
        };
        if let Some(auth) = &outcome.settings.basic_auth {
            self.userlists
                .require(auth, self.store, object, &mut self.diags);
        }
        if outcome.settings.is_empty() {
            return backend;
        }
        let id = policy_id(&outcome.settings);
        if let Some(capture) = &outcome.settings.capture {
            self.add_captures(capture, &id);
        }
        if let Some(b) = self.backends.get_mut(&backend) {
            b.policies.insert(id.clone(), outcome.settings);
        }
        format!("{backend}.{id}")
    }

    /// An ssl-passthrough path: its host routed by SNI to the Service's TCP backend.
    fn passthrough_path(
        &mut self,
        scope: &mut IngressScope,
        route: RouteCandidate,
        service: (Key, ResolvedPort),
        outcome: &RouteOutcome,
    ) {
        let host = &route.host;
        if outcome.settings.basic_auth.is_some() {
            self.diags.object(
                Severity::Error,
                &scope.object,
                "auth-type",
                format!("basic authentication cannot be checked on ssl-passthrough connections (HAProxy does not decrypt them); every connection for host {host} is refused until one of the two is removed"),
            );
        }
        let access = passthrough_access(host, &outcome.settings);
        if self.passthrough_route(
            host,
            service,
            scope.rank,
            &scope.object,
            route.field,
            access,
        ) {
            scope.routed.insert(host);
        }
    }

    /// The host of rule `i` (empty for none), counted against the Ingress' hosts; `None`, with
    /// an error on the rule, when it does not parse, is one too many, or belongs to another
    /// namespace under `--host-ownership=namespace`.
    fn rule_host(
        &mut self,
        i: usize,
        raw: Option<&str>,
        key: &Key,
        object: &ObjectRef,
        hosts: &mut BTreeSet<String>,
    ) -> Option<String> {
        let field = || format!("spec.rules[{i}].host");
        let host = match raw {
            None | Some("") => String::new(),
            Some(h) => match values::parse_host(h) {
                Ok(h) => h,
                Err(e) => {
                    self.diags.object(
                        Severity::Error,
                        object,
                        field(),
                        format!("{e}; rule skipped"),
                    );
                    return None;
                }
            },
        };
        if !hosts.contains(&host) {
            if let Err(e) = values::check_host_count(hosts.len()) {
                self.diags.object(Severity::Error, object, field(), e);
                return None;
            }
            hosts.insert(host.clone());
        }
        if let Some(owners) = &self.ctx.owners {
            let owner = owners.foreign(&host, &key.namespace).cloned();
            if !self.host_verdicts.iter().any(|(h, _)| *h == host) {
                self.host_verdicts.push((host.clone(), owner.clone()));
            }
            if let Some(owner) = owner {
                self.diags.object(
                    Severity::Error,
                    object,
                    field(),
                    format!(
                        "{} belongs to namespace {owner}, whose Ingress for it is older (--host-ownership=namespace); rule refused",
                        routes::host_name(&host)
                    ),
                );
                return None;
            }
        }
        Some(host)
    }

    /// The Ingress' `spec.tls` entries: the certificate of each for the hosts it may speak for
    /// (those its rules route), and their HTTPS redirects.
    fn ingress_tls(
        &mut self,
        spec: &k8s_openapi::api::networking::v1::IngressSpec,
        rank: usize,
        key: &Key,
        object: &ObjectRef,
        routed: &tls_edge::RoutedHosts,
        (redirect_by_host, first_redirect, host_tls): (
            &BTreeMap<String, Redirect>,
            Option<Redirect>,
            Option<crate::model::HostTls>,
        ),
    ) {
        for (i, entry) in spec.tls.iter().flatten().enumerate() {
            let field = format!("spec.tls[{i}]");
            let owners = self.ctx.owners.clone();
            let foreign = |host: &str| {
                owners
                    .as_deref()
                    .and_then(|o| o.foreign(host, &key.namespace))
                    .map(|owner| &**owner)
            };
            let hosts = tls_edge::entry_hosts(
                entry.hosts.as_deref(),
                i,
                routed,
                foreign,
                object,
                &mut self.diags,
            );
            if hosts.is_empty() {
                continue;
            }
            let Some(secret_name) = entry.secret_name.as_deref().filter(|s| !s.is_empty()) else {
                self.diags.object(
                    Severity::Warning,
                    object,
                    format!("{field}.secretName"),
                    format!("no secretName; {}", self.fallback_certificate()),
                );
                self.add_redirects(&hosts, redirect_by_host, first_redirect, rank, object);
                continue;
            };
            let secret_key = Key::new(key.namespace.clone(), secret_name);
            match self.certificate(&secret_key) {
                Ok(path) => {
                    self.tls_entries.push(CrtListEntry {
                        path,
                        options: host_tls.clone(),
                        sni: hosts.clone(),
                    });
                }
                // Reported on the Secret.
                Err(tls::Unserved::Refused) => {}
                Err(e) => self.diags.object(
                    Severity::Error,
                    object,
                    format!("{field}.secretName"),
                    format!("Secret {secret_key}: {e}; {}", self.fallback_certificate()),
                ),
            }
            self.add_redirects(&hosts, redirect_by_host, first_redirect, rank, object);
        }
    }

    fn add_redirects(
        &mut self,
        hosts: &[String],
        by_host: &BTreeMap<String, Redirect>,
        first: Option<Redirect>,
        rank: usize,
        object: &ObjectRef,
    ) {
        for host in hosts {
            // A host routed by a wildcard rule follows that rule's first route.
            let wildcard = || {
                let (_, rest) = host.split_once('.')?;
                by_host.get(&format!("*.{rest}")).copied()
            };
            let decision = by_host.get(host).copied().or_else(wildcard).or(first);
            if let Some((true, code, port)) = decision {
                self.redirects.push(RedirectClaim {
                    host: host.clone(),
                    code,
                    port,
                    rank,
                    ingress: object.clone(),
                });
            }
        }
    }

    /// What hosts without a usable certificate of their own get.
    fn fallback_certificate(&self) -> &'static str {
        if self.config.default_ssl_certificate.is_some() {
            "these hosts are served with the default certificate"
        } else {
            "these hosts have no certificate (no --default-ssl-certificate)"
        }
    }

    /// The certificate in force for Secret `key`, noted as read (see [`Reuse`]).
    fn previous_certificate(&mut self, key: &Key) -> Option<&'a crate::model::PemFile> {
        let previous = self.inputs.previous_certificates.get(key);
        self.reuse
            .previous_read
            .push((key.clone(), previous.cloned()));
        previous
    }

    /// Writes (once) the PEM file for a TLS Secret and returns its path. A file HAProxy
    /// refused is left out, with an error on its Secret.
    fn certificate(&mut self, key: &Key) -> Result<crate::model::CertPath, tls::Unserved> {
        let secret = self
            .store
            .secret(key)
            .ok_or_else(|| tls::Unserved::Unusable("does not exist".to_string()))?;
        let (pem, end) = match tls::certificate_file(key, secret) {
            Ok(file) => file,
            // An invalid update of a Secret whose certificate is in force: keep that one.
            Err(e) => match self.previous_certificate(key) {
                Some(previous) => {
                    self.diags.object(
                        Severity::Error,
                        &ObjectRef::new(Kind::Secret, key),
                        "data",
                        format!("{e}; the previous certificate stays in force"),
                    );
                    // Named by its content: HAProxy may hold it under an older file name.
                    let pem = crate::model::PemFile {
                        path: tls::file_path("certs", key, &previous.content),
                        content: previous.content.clone(),
                    };
                    let end = tls::not_after(&pem.content);
                    (pem, end)
                }
                None => return Err(tls::Unserved::Unusable(e)),
            },
        };
        if let Some(end) = end {
            if let Some(now) = self.inputs.now_unix {
                if let Some(until) = expiry_message_stable_until(end, now) {
                    let soonest = self.reuse.stable_until.map_or(until, |u| u.min(until));
                    self.reuse.stable_until = Some(soonest);
                }
                let object = ObjectRef::new(Kind::Secret, key);
                if end <= now {
                    self.diags.object(
                        Severity::Warning,
                        &object,
                        "data.tls.crt",
                        "the certificate has expired; it is served anyway",
                    );
                } else if end - now < 14 * 86_400 {
                    self.diags.object(
                        Severity::Warning,
                        &object,
                        "data.tls.crt",
                        format!("the certificate expires in {} days", (end - now) / 86_400),
                    );
                }
            }
        }
        if let Some(words) = self.inputs.refused_certificates.get(pem.path.as_str()) {
            self.diags.object(
                Severity::Error,
                &ObjectRef::new(Kind::Secret, key),
                "data",
                format!(
                    "HAProxy refused this certificate; its hosts are served without it: {words}"
                ),
            );
            return Err(tls::Unserved::Refused);
        }
        self.pem_files.insert(pem.path.clone(), pem.content);
        Ok(pem.path)
    }

    /// `ssl-passthrough` for the rule's host: only a host name (a TLS server name) can be
    /// passed through. Whether the host got a claim.
    fn passthrough_route(
        &mut self,
        host: &str,
        (service, port): (Key, ResolvedPort),
        rank: usize,
        ingress: &ObjectRef,
        field: String,
        access: Option<crate::model::PassthroughAccess>,
    ) -> bool {
        if host.is_empty() || host.starts_with("*.") {
            self.diags.object(
                Severity::Warning,
                ingress,
                field,
                "ssl-passthrough needs a rule with a host name (no wildcard): TLS connections are chosen by their exact server name; path skipped",
            );
            return false;
        }
        let backend = format!("tcp_{}_{}_{}", service.namespace, service.name, port.number);
        self.passthrough.push(tls_edge::PassthroughClaim {
            host: host.to_string(),
            backend,
            service: (service, port),
            rank,
            ingress: ingress.clone(),
            field,
            access,
        });
        true
    }

    /// The default certificate from the ConfigMap's `field`; problems are reported on the
    /// Secret under that key. Whether it loaded or HAProxy refused it.
    fn default_certificate_from(&mut self, key: &Key, field: &str) -> bool {
        match self.certificate(key) {
            Ok(path) => {
                self.default_certificate = Some(CrtListEntry {
                    path,
                    options: None,
                    sni: Vec::new(),
                });
                true
            }
            Err(tls::Unserved::Refused) => true,
            Err(e) => {
                self.diags.object(
                    Severity::Error,
                    &ObjectRef::new(Kind::Secret, key),
                    field,
                    e.to_string(),
                );
                false
            }
        }
    }

    fn default_certificate(&mut self, key: &Key) {
        match self.certificate(key) {
            Ok(path) => {
                self.default_certificate = Some(CrtListEntry {
                    path,
                    options: None,
                    sni: Vec::new(),
                });
            }
            Err(tls::Unserved::Refused) => {}
            Err(e) => self.diags.object(
                Severity::Error,
                &ObjectRef::new(Kind::Secret, key),
                "--default-ssl-certificate",
                e.to_string(),
            ),
        }
    }

    fn finish(mut self, global: crate::model::GlobalSettings) -> Translation {
        let global_tls = global.tls.clone();
        let ingress_parts = std::mem::take(&mut self.ingress_parts);
        let parts_tls = self.incremental.parts_tls(&ingress_parts);
        let groups: Vec<&[RouteCandidate]> = ingress_parts
            .iter()
            .map(|part| part.routes.as_slice())
            .collect();
        let claims = self.incremental.claims(&groups);
        let (mut maps, needs) = routes::build_maps(&groups, claims, &mut self.diags);
        // route-acl: canary routes get their own part of the maps and frontend rules. Most
        // clusters have none: the routes (tens of thousands) are not gathered for nothing.
        let canaries = if ingress_parts.iter().any(|p| p.has_canary) {
            let routes: Vec<&RouteCandidate> = groups.iter().copied().flatten().collect();
            routes::build_canaries(&routes, &mut maps)
        } else {
            Vec::new()
        };
        drop(groups);

        let mut backends = self.http_backends(&ingress_parts);
        let route_policies = backends.iter().any(|b| !b.policies.is_empty());
        let (sni, winners) = tls_edge::sni_map(parts_tls.passthrough.clone(), &mut self.diags);
        maps.sni = sni;
        // Sorted by host, as the winners are.
        let passthrough_access: Vec<_> = winners.iter().filter_map(|c| c.access.clone()).collect();
        for claim in winners {
            self.register_tcp_backend(&claim.service.0, claim.service.1);
        }
        let client_auth = self.client_auth(&global_tls);
        let mut tcp_backends = Vec::with_capacity(self.tcp_backends.len());
        for (name, build) in std::mem::take(&mut self.tcp_backends) {
            tcp_backends.push(Arc::new(self.backend(name, build)));
        }

        let tls_main = parts::TlsMain {
            default_certificate: self.default_certificate.take(),
            pem_files: std::mem::take(&mut self.pem_files),
            static_files: std::mem::take(&mut self.static_files),
            alpn: global_tls
                .alpn
                .clone()
                .unwrap_or_else(|| vec!["h2".to_string(), "http/1.1".to_string()]),
            strict_sni: global_tls.strict_sni,
            client_auth,
        };
        // Without a certificate there is no HTTPS frontend to redirect to.
        let redirects_on = self.config.listen.https
            && (!parts_tls.crt_list.is_empty() || tls_main.default_certificate.is_some());
        let https = self
            .incremental
            .https(&ingress_parts, parts_tls, tls_main, redirects_on);
        drop(ingress_parts);
        let tls = https.tls.clone();
        let tls_routes = gateway::l4::passthrough_rules(
            std::mem::take(&mut self.gateway_sni),
            (&maps.sni, &tls.crt_list),
            &mut self.diags,
        );
        let mut redirect_codes = Vec::new();
        let mut ssl_redirect_ports = Vec::new();
        if let Some(redirects) = &https.redirects {
            maps.ssl_redirect.clone_from(&redirects.entries);
            redirect_codes.clone_from(&redirects.codes);
            ssl_redirect_ports.clone_from(&redirects.ported);
            for d in &redirects.diagnostics {
                self.diags.push(d.clone());
            }
        }

        let default_backend = match self.default_backend.take() {
            Some((backend, _)) => DefaultBackend::Service { backend },
            None => DefaultBackend::NotFound,
        };
        let invalid_backend_routes = needs.invalid
            || canaries.iter().any(|c| c.route == routes::INVALID_BACKEND)
            || gateway::l4::port_routes_invalid(&self.gateway_http_ports, &maps, &canaries);
        let peers = peers::peers(self.store, &self.config.identity, &mut self.diags);
        let replicas = peers.as_ref().map_or(1, |p| p.entries.len().max(1));
        let replicas = u32::try_from(replicas).unwrap_or(u32::MAX);
        share_pod_maxconn(&mut backends, replicas);
        share_pod_maxconn(&mut tcp_backends, replicas);
        let model = Model {
            version: self.config.version.clone(),
            listen: self.config.listen.clone(),
            runtime_socket: self.config.runtime_socket.clone(),
            global,
            maps: Arc::new(maps),
            frontend_rules: crate::model::FrontendRules {
                captures: std::mem::take(&mut self.captures),
                canaries,
                wildcard_hosts: needs.wildcard,
                hostless_routes: needs.none,
                route_policies,
                unavailable_routes: needs.unavailable,
                invalid_backend_routes,
                passthrough_access,
                ssl_redirect_ports,
                tls_routes,
                reject_backend: self.gateway_reject,
                http_ports: std::mem::take(&mut self.gateway_http_ports),
            },
            redirect_codes,
            backends,
            default_backend,
            tls,
            peers,
            tcp: std::mem::take(&mut self.tcp_services),
            tcp_backends,
            userlists: std::mem::take(&mut self.userlists).into_vec(),
            errorfiles: self.errorfiles(),
            patterns: self.ctx.patterns.files(),
        };
        Translation {
            model,
            diagnostics: self.diags,
            reuse: self.reuse,
            parts: self.incremental.into_parts(),
            budget: self.budget,
        }
    }

    /// The HTTPS bind's client authentication from the ConfigMap's `client-ca` settings. A
    /// CA that cannot be used refuses every HTTPS request rather than letting it through.
    fn client_auth(
        &mut self,
        global_tls: &crate::model::GlobalTls,
    ) -> Option<crate::model::ClientAuth> {
        // A `client-ca` that is not even a Secret reference refuses like an unusable Secret
        // (the global hook reported it on the ConfigMap).
        let client_ca_invalid = global_tls
            .client_ca_invalid
            .then(|| crate::model::ClientAuth {
                ca_file: None,
                verify: "required".to_string(),
            });
        let client_auth = global_tls.client_ca.as_deref().map(|reference| {
            let verify = if global_tls.client_crt_optional {
                "optional"
            } else {
                "required"
            }
            .to_string();
            match tls_edge::ca_file(self.store, reference) {
                Ok(pem) => {
                    let ca_file = Some(pem.path.clone());
                    self.static_files.insert(pem.path, pem.content);
                    crate::model::ClientAuth { ca_file, verify }
                }
                Err(e) => {
                    let subject = self.config.config_map.as_ref().map_or_else(
                        || ObjectRef::new(Kind::ConfigMap, &Key::new("", "(none)")),
                        |k| ObjectRef::new(Kind::ConfigMap, k),
                    );
                    self.diags.object(
                        Severity::Error,
                        &subject,
                        "client-ca",
                        format!("{e}; HTTPS requests are refused (403) until it is fixed"),
                    );
                    crate::model::ClientAuth {
                        ca_file: None,
                        verify,
                    }
                }
            }
        });
        client_auth.or(client_ca_invalid)
    }

    /// The HTTP backends, in name order, from the run's registrations (`ingress_parts` holds
    /// those of the Ingress parts). A backend registered once (most are) is looked up and
    /// compared as that registration; one registered more than once is assembled from them
    /// in the order they happened: the first Ingress supplies its annotations, and each
    /// route policy comes from the first registration that has it.
    fn http_backends(&mut self, ingress_parts: &[Arc<parts::IngressPart>]) -> Vec<Arc<Backend>> {
        let directs = self.registered.take().unwrap_or_default();
        // The parts' registrations by name, then in the order they happened: the last run's
        // order with the replaced parts' moved, when it holds.
        let registrations = self
            .incremental
            .registration_order(ingress_parts)
            .with_directs(ingress_parts, &directs);
        let builds = registrations
            .chunk_by(|a, b| a.0 == b.0 && a.1.name == b.1.name)
            .filter_map(|group| match group {
                [(_, only)] => Some(std::borrow::Cow::Borrowed(*only)),
                [(_, first), rest @ ..] => Some(std::borrow::Cow::Owned(Arc::new(
                    parts::Registration::merged(first, rest.iter().map(|(_, r)| &***r)),
                ))),
                [] => None,
            });
        // A run that takes nothing from the last one (a cold start, a script change)
        // assembles every backend: workers assemble them ahead, as the Ingresses.
        let workers = self.config.workers;
        if !self.incremental.takes() && workers.spread(registrations.len()) {
            let builds: Vec<_> = builds.collect();
            let this = &*self;
            let ahead = crate::parallel::map(&builds, workers, |build| {
                this.assemble_backend(build, this.budget.whole()).0
            });
            return builds
                .iter()
                .zip(ahead)
                .map(|(build, ahead)| self.backend_part(build, Some(ahead)).backend.clone())
                .collect();
        }
        let mut backends = Vec::with_capacity(registrations.len());
        for build in builds {
            backends.push(self.backend_part(&build, None).backend.clone());
        }
        backends
    }

    /// A backend part, made by [`assemble_backend`] in this run's context on `budget`, and
    /// the budget after.
    fn assemble_backend(
        &self,
        build: &Arc<parts::Registration>,
        budget: Budget,
    ) -> (Forked<parts::BackendPart>, Budget) {
        assemble_backend(build, &self.ctx, budget)
    }

    /// An HTTP backend: its part of the last run when it was assembled from the same inputs
    /// and its endpoints did not move (and its hook's operations fit the budget), else the
    /// one assembled `ahead` by a worker when its operations fit, else assembled in turn.
    /// Taken into this run's state either way.
    fn backend_part(
        &mut self,
        build: &Arc<parts::Registration>,
        ahead: Option<Forked<parts::BackendPart>>,
    ) -> Arc<parts::BackendPart> {
        let taken = self
            .incremental
            .backend(build)
            .filter(|part| self.budget.charge(part.operations))
            .cloned();
        let (part, taken, keep) = match taken {
            Some(part) => (part, true, true),
            None => {
                let ahead = ahead.filter(|(_, ops)| ops.is_some_and(|o| self.budget.charge(o)));
                let (part, operations) = match ahead {
                    Some(ahead) => ahead,
                    None => {
                        let (part, budget) = self.assemble_backend(build, self.budget);
                        self.budget = budget;
                        part
                    }
                };
                (Arc::new(part), false, operations.is_some())
            }
        };
        for d in &part.diagnostics {
            self.diags.push(d.clone());
        }
        for (path, content) in &part.static_files {
            self.static_files
                .entry(path.clone())
                .or_insert_with(|| content.clone());
        }
        if part.follows_endpoints {
            self.reuse.endpoint_users.add_part(&part);
        }
        self.incremental.keep_backend(&part, taken, keep);
        part
    }

    fn backend(&mut self, name: String, build: BackendBuild) -> Backend {
        let service_ref = ObjectRef::new(Kind::Service, &build.service);
        let service_annotations = self
            .store
            .service(&build.service)
            .and_then(|s| s.metadata.annotations.clone())
            .unwrap_or_default();
        // Made with the backend's part; a Service of several ports reports once (the
        // diagnostics are de-duplicated).
        self.policy.vocabulary().check_annotations(
            &service_ref,
            &service_annotations,
            &mut self.diags,
        );
        // A Backend resource (`cr-backend`) takes precedence over the annotations, as in the
        // incumbent; the annotations still fill in what it leaves unset.
        let resource = self.backend_resource(
            (&service_ref, &service_annotations),
            build.ingress.as_ref().map(|(o, a)| (o, &**a)),
        );
        let mut sources: Vec<ValueSource> = resource.into_iter().collect();
        sources.push(ValueSource::annotations(
            service_ref.clone(),
            Arc::new(service_annotations),
        ));
        if let Some((object, annotations)) = &build.ingress {
            sources.push(ValueSource::annotations(
                object.clone(),
                annotations.clone(),
            ));
        }
        sources.extend(self.ctx.resources.iter().cloned());
        sources.extend(self.ctx.config_map.iter().cloned());
        let facts = BTreeMap::from([("port", build.port.number.to_string())]);
        let ctx = HookContext::new(service_ref, sources, facts).with_snippets(self.config.snippets);
        let run = self.policy.run_backend(&ctx, self.budget);
        self.budget = run.budget;
        self.diags.extend(run.diagnostics);
        let mut settings = run.settings;
        cookies::resolve(
            &mut settings,
            self.store,
            self.config.dynamic_cookie_key_secret.as_ref(),
            ctx.subject(),
            &mut self.diags,
        );

        let servers = Arc::new(servers(self.store, &build.service, &build.port, &settings));
        if build.port.external.is_none() {
            // Its servers follow the Service's endpoints alone (see `Reuse`).
            self.reuse
                .endpoint_users
                .add(&build.service, &name, &build.port);
        }
        Backend {
            name,
            namespace: build.service.namespace.clone(),
            service: build.service.name.clone(),
            port: build.port.number,
            settings,
            policies: build
                .policies
                .into_iter()
                .map(|(id, settings)| RoutePolicy { id, settings })
                .collect(),
            servers,
        }
    }
}

/// The servers of a backend of Service `service` on `port` with `settings`: a dynamic server
/// for each of its endpoints (or the ExternalName's addresses), with the ids
/// [`slots::assign_ids`] gives them; or, for a backend that must keep slots
/// ([`slot_reason`]), the endpoints spread over `slots_block`-sized blocks of slots.
pub fn servers(
    store: &Store,
    service: &Key,
    port: &ResolvedPort,
    settings: &BackendSettings,
) -> ServerSlots {
    let endpoints = match &port.external {
        Some(external) => backends::external_endpoints(external),
        None => backends::endpoints(store, service, port),
    };
    if slot_reason(settings).is_none() {
        let ids = slots::assign_ids(&endpoints);
        return ServerSlots::dynamic(
            endpoints
                .into_iter()
                .zip(ids)
                .map(|((address, port), id)| (id, address, port)),
        );
    }
    let count = slots::slot_count(endpoints.len(), settings.slots_block);
    let occupants = slots::assign(&endpoints, count);
    ServerSlots::from_occupants(
        count,
        occupants
            .into_iter()
            .enumerate()
            .filter_map(|(slot, occupant)| {
                let (address, port) = endpoints.get(occupant?)?.clone();
                Some((slot, address, port))
            }),
    )
}

/// Why a backend with `settings` keeps pre-allocated server slots rather than dynamic servers
/// (one per endpoint, added and deleted through the runtime API), or `None` when it need not.
/// HAProxy 2.6's `add server` refuses backends whose balance algorithm is static and the
/// `cookie` keyword, and takes `crt` only for a certificate it already holds.
pub fn slot_reason(settings: &BackendSettings) -> Option<&'static str> {
    if settings.server_slots {
        return Some("scale-server-slots is set");
    }
    if !dynamic_balance(&settings.balance) {
        return Some("its balance algorithm is static-rr");
    }
    if settings
        .cookie_persistence
        .as_ref()
        .is_some_and(|c| !c.dynamic)
    {
        return Some("static cookies name each server (`cookie` is refused on `add server`)");
    }
    // A snippet may change how servers are chosen in ways `add server` refuses (a static
    // balance, map-based hashing, static cookies).
    if settings.config_snippet.iter().any(|line| {
        matches!(
            line.split_ascii_whitespace().next(),
            Some("balance" | "hash-type" | "cookie")
        )
    }) {
        return Some("its backend snippet sets balance, hash-type or cookie");
    }
    if settings.server_crt_file.is_some() {
        return Some(
            "a client certificate to the pods (`add server` takes `crt` only for a certificate HAProxy already holds)",
        );
    }
    None
}

/// Whether HAProxy can add servers at run time to a backend balanced by `balance` (its
/// words; empty for HAProxy's default, `roundrobin`): the algorithms whose server weights
/// may change at run time. Hashes are written with `hash-type consistent`
/// ([`values::is_hash_balance`]); `static-rr` is static.
fn dynamic_balance(balance: &[String]) -> bool {
    match balance.first().map(String::as_str) {
        None => true,
        Some(algorithm) => {
            let name = algorithm.split('(').next().unwrap_or(algorithm);
            matches!(name, "roundrobin" | "leastconn" | "first" | "random")
                || values::is_hash_balance(balance)
        }
    }
}

/// The backend `name` in `table`, created for `service`/`port` if new.
fn register<'t>(
    table: &'t mut BTreeMap<String, BackendBuild>,
    name: &str,
    service: &Key,
    port: ResolvedPort,
) -> &'t mut BackendBuild {
    table
        .entry(name.to_string())
        .or_insert_with(|| BackendBuild {
            service: service.clone(),
            port,
            ingress: None,
            policies: BTreeMap::new(),
        })
}

/// A short, stable id for a set of route settings, so equal settings share one policy: the
/// first 40 bits of the SHA-256 of their JSON, which every replica and version computes alike.
///
/// `pod-maxconn` is the most connections the controller as a whole opens to each pod, shared
/// by its replicas as the incumbent shares it: each replica's servers get `maxconn` of the
/// budget divided by the number of replicas (the Pods of the peers section), at least 1.
/// The budget stays in `pod_maxconn`, so that a backend taken from the last run is divided
/// from the budget again, never twice.
fn share_pod_maxconn(backends: &mut [Arc<crate::model::Backend>], replicas: u32) {
    for backend in backends {
        let s = &backend.settings;
        let Some(budget) = s.pod_maxconn.or(s.maxconn) else {
            continue;
        };
        let per_replica = (budget / replicas.max(1)).max(1);
        if s.maxconn == Some(per_replica) && s.pod_maxconn == Some(budget) {
            continue;
        }
        let settings = Arc::make_mut(&mut Arc::make_mut(backend).settings);
        settings.pod_maxconn = Some(budget);
        settings.maxconn = Some(per_replica);
    }
}

/// The access rules of an `ssl-passthrough` host from its route settings, `None` when it has
/// none. Basic authentication cannot be checked on a connection HAProxy does not decrypt, so
/// it closes the host to everyone rather than leave it open.
fn passthrough_access(
    host: &str,
    settings: &RouteSettings,
) -> Option<crate::model::PassthroughAccess> {
    let mut deny_all = settings.deny_all.clone();
    if settings.basic_auth.is_some() {
        let d = deny_all.get_or_insert_with(|| crate::model::DenyAll {
            status: 403,
            because: Vec::new(),
        });
        d.because.push("auth-type".to_string());
    }
    if settings.allow_list.is_empty()
        && settings.deny_list.is_empty()
        && settings.allow_file.is_none()
        && settings.deny_file.is_none()
        && deny_all.is_none()
    {
        return None;
    }
    Some(crate::model::PassthroughAccess {
        host: host.to_string(),
        allow_list: settings.allow_list.clone(),
        deny_list: settings.deny_list.clone(),
        allow_file: settings.allow_file.clone(),
        deny_file: settings.deny_file.clone(),
        deny_all,
    })
}

/// The last few ids are kept per thread: the paths of one Ingress, and Ingresses with the
/// same annotations, mostly have equal settings, and comparing them costs less than their
/// JSON and digest.
fn policy_id(settings: &RouteSettings) -> String {
    const RECENT: usize = 4;
    thread_local! {
        static IDS: std::cell::RefCell<std::collections::VecDeque<(RouteSettings, String)>> =
            const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
    }
    IDS.with_borrow_mut(|recent| {
        if let Some(at) = recent.iter().position(|(s, _)| s == settings) {
            let id = recent[at].1.clone();
            if at > 0 {
                let hit = recent.remove(at);
                if let Some(hit) = hit {
                    recent.push_front(hit);
                }
            }
            return id;
        }
        let id = digest_id(settings);
        recent.truncate(RECENT - 1);
        recent.push_front((settings.clone(), id.clone()));
        id
    })
}

/// [`policy_id`], computed.
fn digest_id(settings: &RouteSettings) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let json = serde_json::to_string(settings).unwrap_or_default();
    let digest = Sha256::digest(json.as_bytes());
    let mut id = String::with_capacity(11);
    id.push('p');
    for b in &digest[..5] {
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    id
}

/// `list` without spare capacity.
fn shrunk<T>(mut list: Vec<T>) -> Vec<T> {
    list.shrink_to_fit();
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id as first written: `p` and the hex of the first five bytes of the digest.
    fn id_by_format(settings: &RouteSettings) -> String {
        let json = serde_json::to_string(settings).unwrap_or_default();
        let digest = Sha256::digest(json.as_bytes());
        let hex: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
        format!("p{hex}")
    }

    #[test]
    fn policy_ids_are_the_digest_whether_remembered_or_not() {
        let settings: Vec<RouteSettings> = (0..8)
            .map(|i| RouteSettings {
                set_host: Some(format!("h{i}.internal")),
                ..RouteSettings::default()
            })
            .collect();
        // New, repeated, and back after falling out of the recent ones, in both orders.
        let order = [0, 0, 1, 0, 2, 3, 4, 5, 6, 0, 7, 1, 1, 7, 0];
        for &i in order.iter().chain(order.iter().rev()) {
            let id = policy_id(&settings[i]);
            assert_eq!(id, id_by_format(&settings[i]), "settings {i}");
            assert_eq!(id.len(), 11);
        }
        assert_ne!(policy_id(&settings[0]), policy_id(&settings[1]));
    }

    /// Route hooks read the annotations of the Service each path names (`ctx.service()`),
    /// whichever Services the Ingress' other paths name before or after it.
    #[test]
    fn each_path_reads_its_own_services_annotations() {
        use crate::objects::Object;
        use serde_json::json;
        let service = |name: &str, standalone: bool| {
            let annotations = if standalone {
                json!({"haproxy.org/standalone-backend": "true"})
            } else {
                json!({})
            };
            Object::from_value(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
                "spec": {"ports": [{"port": 80}]}}))
            .unwrap()
        };
        let path = |p: &str, service: &str| {
            json!({"path": p, "pathType": "Prefix",
                "backend": {"service": {"name": service, "port": {"number": 80}}}})
        };
        let ingress = Object::from_value(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"ingressClassName": "portcullis", "rules": [
                {"host": "a.example.com", "http": {"paths": [
                    path("/1", "plain"), path("/2", "own"), path("/3", "plain"), path("/4", "own")]}},
                {"host": "b.example.com", "http": {"paths": [path("/", "own"), path("/x", "plain")]}}]}
        }))
        .unwrap();
        let store = Store::from_objects(vec![
            super::class::tests::our_class(),
            service("plain", false),
            service("own", true),
            ingress,
        ]);
        let pipeline =
            crate::pipeline::Pipeline::load(None, None, TranslateConfig::default()).unwrap();
        let output = pipeline.run(&store).unwrap();
        let cfg = output.rendered.haproxy_cfg();
        assert!(cfg.contains("backend ns_plain_80\n"), "{cfg}");
        assert!(cfg.contains("backend ns_web_svc_own_80\n"), "{cfg}");
        assert!(!cfg.contains("backend ns_own_80\n"), "{cfg}");
        assert!(!cfg.contains("backend ns_web_svc_plain_80\n"), "{cfg}");
        let exact_and_prefix: String = output
            .rendered
            .files()
            .iter()
            .filter(|(name, _)| name.ends_with(".map"))
            .filter_map(|(_, content)| content.text())
            .collect();
        for (key, backend) in [
            ("a.example.com/1", "ns_plain_80"),
            ("a.example.com/2", "ns_web_svc_own_80"),
            ("a.example.com/3", "ns_plain_80"),
            ("a.example.com/4", "ns_web_svc_own_80"),
            ("b.example.com/x", "ns_plain_80"),
        ] {
            assert!(
                exact_and_prefix
                    .lines()
                    .any(|l| l.starts_with(&format!("{key} {backend}"))),
                "{key} → {backend}:\n{exact_and_prefix}"
            );
        }
    }

    /// `txn.policy` is split off the route only while some route has a policy, in a run
    /// from scratch and in runs that take the other Ingresses from the last one; and the
    /// policy's rule is there to read it.
    #[test]
    fn txn_policy_is_set_while_some_route_has_a_policy() {
        use crate::objects::Object;
        use serde_json::json;
        let ingress = |name: &str, annotations: serde_json::Value| {
            Object::from_value(json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
                "spec": {"ingressClassName": "portcullis", "rules": [
                    {"host": format!("{name}.example.com"), "http": {"paths": [
                        {"path": "/", "pathType": "Prefix",
                         "backend": {"service": {"name": name, "port": {"number": 80}}}}]}}]}
            }))
            .unwrap()
        };
        let service = |name: &str| {
            Object::from_value(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"ports": [{"port": 80}]}}))
            .unwrap()
        };
        let split = "http-request set-var(txn.policy) var(txn.route),field(2,.)\n";
        let allow = json!({"haproxy.org/allow-list": "10.0.0.0/8"});
        let mut store = Store::from_objects(vec![
            super::class::tests::our_class(),
            service("a"),
            service("b"),
            ingress("a", json!({})),
            ingress("b", json!({})),
        ]);
        let pipeline =
            crate::pipeline::Pipeline::load(None, None, TranslateConfig::default()).unwrap();
        let fresh = |store: &Store| {
            crate::pipeline::Pipeline::load(None, None, TranslateConfig::default())
                .unwrap()
                .run(store)
                .unwrap()
                .rendered
                .haproxy_cfg()
                .to_string()
        };
        let mut partial_runs = 0;
        for (round, b_annotations, policies) in [
            (0, json!({}), false),
            (1, allow.clone(), true),
            (2, json!({}), false),
            (3, allow, true),
        ] {
            if round > 0 {
                store.upsert(ingress("b", b_annotations));
            }
            let (output, report) = pipeline.run_with(&store, &RunInputs::default()).unwrap();
            partial_runs += u32::from(matches!(report, crate::pipeline::RunReport::Partial { .. }));
            let cfg = output.rendered.haproxy_cfg().to_string();
            assert_eq!(cfg.contains(split), policies, "round {round}:\n{cfg}");
            assert_eq!(
                cfg.contains("http-request deny if { var(txn.policy) -m str p"),
                policies,
                "round {round}:\n{cfg}"
            );
            assert_eq!(cfg, fresh(&store), "round {round}");
        }
        assert!(partial_runs >= 3, "the later runs took Ingress a");
    }
}
