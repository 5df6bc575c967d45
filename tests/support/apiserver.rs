//! A protocol-faithful Kubernetes API server for tests: real HTTP/1.1 on loopback that the real
//! kube-rs client talks to through a real kubeconfig file.
//!
//! What it serves:
//! - discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/{group}`, `/apis/{group}/{version}`,
//!   both the classic documents and the aggregated `APIGroupDiscoveryList` when the client asks for
//!   it in `Accept`), and `/healthz`, `/readyz`, `/livez`;
//! - the resources of [`builtin_resources`] plus the `ingress.v3.haproxy.org/v3` `TCP` custom
//!   resource (unless [`ApiServerBuilder::without_tcp_crd`]) and any [`ApiServerBuilder::with_resource`];
//! - get, list (label and field selectors, `limit`/`continue` pagination over a consistent
//!   snapshot, `resourceVersion` + `resourceVersionMatch`), watch (replay from a retained event
//!   history, `410 Expired` ERROR event when the history is compacted, bookmarks,
//!   `timeoutSeconds`, streaming lists with `sendInitialEvents=true`), create, replace (optimistic
//!   concurrency), patch (merge, strategic-merge treated as merge, server-side apply treated as
//!   merge-or-create, JSON patch), delete (preconditions, finalizers), deletecollection and the
//!   `status` subresource;
//! - `Accept: ...;as=PartialObjectMetadata[List]` metadata-only responses.
//!
//! Everything a test does to the server is synchronous (a `std::sync::Mutex` guards the state)
//! except [`ApiServer::start`], [`ApiServer::stop`], [`ApiServer::resume`],
//! [`ApiServer::refuse_connections`] and [`ApiServer::client`], which are `async`.
//!
//! Every error answer is a `meta/v1 Status` with the code, reason and message wording of the real
//! API server, so kube-rs turns it into `kube::Error::Api`.
//!
//! Note for fault tests: kube-rs retries 429, 503 and 504 answers on its own (up to 15 times with
//! exponential backoff starting at 5 ms), so use 500 for a failure that must reach the caller, or a
//! bounded `count`.
#![allow(dead_code, unreachable_pub)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Map, Value, json};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The version the server reports in `/version`.
pub const GIT_VERSION: &str = "v1.33.0";
/// The user named in `403 Forbidden` messages.
pub const TEST_USER: &str = "system:serviceaccount:default:portcullis";
/// Default interval between two BOOKMARK events on a watch that allows them.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);
/// Default number of change events retained for watch replay and consistent pagination.
pub const DEFAULT_HISTORY_LIMIT: usize = 100_000;

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];

// ---------------------------------------------------------------------------------------------
// Resources

/// One served resource: its group/version, kind, plural, scope and whether it has a `status`
/// subresource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub status_subresource: bool,
    pub short_names: Vec<String>,
}

impl ResourceDef {
    /// A resource of `api_version` (`"v1"` or `"group/version"`), without status subresource.
    pub fn new(api_version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        let (group, version) = split_api_version(api_version);
        Self {
            group,
            version,
            kind: kind.to_string(),
            plural: plural.to_string(),
            singular: kind.to_lowercase(),
            namespaced,
            status_subresource: false,
            short_names: Vec::new(),
        }
    }

    /// The same resource with a `status` subresource.
    #[must_use]
    pub fn with_status(mut self) -> Self {
        self.status_subresource = true;
        self
    }

    /// The same resource with these short names in discovery.
    #[must_use]
    pub fn with_short_names(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|n| (*n).to_string()).collect();
        self
    }

    /// `"v1"` or `"group/version"`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The storage key of the resource: `group/version/plural`.
    fn gvr(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.plural)
    }

    /// `plural.group` (or `plural` in the core group), as in error messages.
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

fn split_api_version(api_version: &str) -> (String, String) {
    match api_version.split_once('/') {
        Some((group, version)) => (group.to_string(), version.to_string()),
        None => (String::new(), api_version.to_string()),
    }
}

/// The built-in resources every server serves.
pub fn builtin_resources() -> Vec<ResourceDef> {
    let mut endpoints =
        ResourceDef::new("v1", "Endpoints", "endpoints", true).with_short_names(&["ep"]);
    endpoints.singular = "endpoints".to_string();
    vec![
        ResourceDef::new("v1", "Namespace", "namespaces", false)
            .with_status()
            .with_short_names(&["ns"]),
        ResourceDef::new("v1", "Service", "services", true)
            .with_status()
            .with_short_names(&["svc"]),
        ResourceDef::new("v1", "Secret", "secrets", true),
        ResourceDef::new("v1", "ConfigMap", "configmaps", true).with_short_names(&["cm"]),
        ResourceDef::new("v1", "Pod", "pods", true)
            .with_status()
            .with_short_names(&["po"]),
        endpoints,
        ResourceDef::new("v1", "Event", "events", true).with_short_names(&["ev"]),
        ResourceDef::new("networking.k8s.io/v1", "Ingress", "ingresses", true)
            .with_status()
            .with_short_names(&["ing"]),
        ResourceDef::new(
            "networking.k8s.io/v1",
            "IngressClass",
            "ingressclasses",
            false,
        ),
        ResourceDef::new(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            "endpointslices",
            true,
        ),
        ResourceDef::new("coordination.k8s.io/v1", "Lease", "leases", true),
        ResourceDef::new("events.k8s.io/v1", "Event", "events", true).with_short_names(&["ev"]),
    ]
}

/// The HAProxy `TCP` custom resource (`ingress.v3.haproxy.org/v3`, plural `tcps`, namespaced).
pub fn tcp_crd() -> ResourceDef {
    ResourceDef::new("ingress.v3.haproxy.org/v3", "TCP", "tcps", true)
}

/// The Gateway API's standard-channel resources (`gateway.networking.k8s.io`): GatewayClass,
/// Gateway, HTTPRoute, TLSRoute (v1, with `status`), TCPRoute (v1alpha2, with `status`) and
/// ReferenceGrant (v1beta1).
pub fn gateway_api_crds() -> Vec<ResourceDef> {
    vec![
        ResourceDef::new(
            "gateway.networking.k8s.io/v1",
            "GatewayClass",
            "gatewayclasses",
            false,
        )
        .with_status(),
        ResourceDef::new("gateway.networking.k8s.io/v1", "Gateway", "gateways", true).with_status(),
        ResourceDef::new(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "httproutes",
            true,
        )
        .with_status(),
        ResourceDef::new(
            "gateway.networking.k8s.io/v1beta1",
            "ReferenceGrant",
            "referencegrants",
            true,
        ),
        ResourceDef::new(
            "gateway.networking.k8s.io/v1",
            "TLSRoute",
            "tlsroutes",
            true,
        )
        .with_status(),
        // Served at its version before Gateway API v1.6, as older clusters do.
        ResourceDef::new(
            "gateway.networking.k8s.io/v1alpha2",
            "TCPRoute",
            "tcproutes",
            true,
        )
        .with_status(),
    ]
}

// ---------------------------------------------------------------------------------------------
// Kubeconfig

/// Writes a kubeconfig whose current context points at `server_url`, with a bearer `token` if
/// given (the file is JSON, which is valid YAML).
pub fn write_kubeconfig(path: impl AsRef<Path>, server_url: &str, token: Option<&str>) {
    std::fs::write(path.as_ref(), kubeconfig_text(server_url, token))
        .unwrap_or_else(|e| panic!("writing kubeconfig {}: {e}", path.as_ref().display()));
}

/// The text of a kubeconfig pointing at `server_url`.
pub fn kubeconfig_text(server_url: &str, token: Option<&str>) -> String {
    let user = match token {
        Some(token) => json!({ "token": token }),
        None => json!({}),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "test", "cluster": { "server": server_url } }],
        "users": [{ "name": "test", "user": user }],
        "contexts": [{
            "name": "test",
            "context": { "cluster": "test", "user": "test", "namespace": "default" }
        }],
        "current-context": "test",
        "preferences": {}
    });
    serde_json::to_string_pretty(&config).expect("kubeconfig serializes")
}

// ---------------------------------------------------------------------------------------------
// Public handle

/// Configures an [`ApiServer`] before it starts.
#[derive(Debug, Clone)]
pub struct ApiServerBuilder {
    tcp_crd: bool,
    extra: Vec<ResourceDef>,
    bookmark_interval: Duration,
    history_limit: usize,
    list_item_type_meta: bool,
}

impl Default for ApiServerBuilder {
    fn default() -> Self {
        Self {
            tcp_crd: true,
            extra: Vec::new(),
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            history_limit: DEFAULT_HISTORY_LIMIT,
            list_item_type_meta: true,
        }
    }
}

impl ApiServerBuilder {
    /// Serve no `TCP` CRD: its paths answer 404 and discovery omits its group.
    #[must_use]
    pub fn without_tcp_crd(mut self) -> Self {
        self.tcp_crd = false;
        self
    }

    /// Also serve this resource.
    #[must_use]
    pub fn with_resource(mut self, def: ResourceDef) -> Self {
        self.extra.push(def);
        self
    }

    /// Interval between BOOKMARK events (default 1 s).
    #[must_use]
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// How many change events to retain (older ones are compacted away automatically).
    #[must_use]
    pub fn history_limit(mut self, limit: usize) -> Self {
        self.history_limit = limit.max(1);
        self
    }

    /// Omit `apiVersion`/`kind` from the items of list responses of built-in kinds, as the real
    /// API server does (by default every returned object carries them).
    #[must_use]
    pub fn list_items_without_type_meta(mut self) -> Self {
        self.list_item_type_meta = false;
        self
    }

    /// Binds `127.0.0.1:0` and starts serving.
    pub async fn start(self) -> ApiServer {
        let mut resources = builtin_resources();
        if self.tcp_crd {
            resources.push(tcp_crd());
        }
        resources.extend(self.extra);
        let listener =
            bind_reuse("127.0.0.1:0".parse().expect("address")).expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ (u64::from(addr.port()) << 32)
            | 1;
        let state = State {
            resources,
            objects: HashMap::new(),
            rv: 1,
            history: VecDeque::new(),
            history_start: 0,
            history_limit: self.history_limit,
            watchers: HashMap::new(),
            next_watcher: 0,
            random: seed,
            faults: Faults::default(),
            admission: None,
            requests: Vec::new(),
            list_counts: HashMap::new(),
            watch_counts: HashMap::new(),
            list_item_type_meta: self.list_item_type_meta,
            addr,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            net: Mutex::new(Net::default()),
            bookmark_interval: self.bookmark_interval,
            next_conn: AtomicU64::new(0),
        });
        let accept = spawn_accept(shared.clone(), listener);
        shared.net().accept = Some(accept);
        ApiServer { shared, addr }
    }
}

/// A running test API server. Dropping it stops serving and aborts every connection.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let (accept, conns) = {
            let mut net = self.shared.net();
            net.stopped = true;
            (net.accept.take(), std::mem::take(&mut net.conns))
        };
        if let Some(accept) = accept {
            accept.abort();
        }
        for conn in conns.into_values() {
            conn.abort();
        }
        self.shared.lock().watchers.clear();
    }
}

/// One request the server received, as recorded in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// `GET`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub method: String,
    /// The URL path, e.g. `/apis/networking.k8s.io/v1/namespaces/default/ingresses/a/status`.
    pub path: String,
    /// The raw query string (without `?`), possibly empty.
    pub query: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The request body as text.
    pub body: String,
    /// The HTTP status answered (200 for a watch that started streaming).
    pub status: u16,
    /// The bearer token presented, if any.
    pub token: Option<String>,
    /// The `User-Agent` header, if any.
    pub user_agent: Option<String>,
}

impl RequestRecord {
    /// The body parsed as JSON, if it is JSON.
    pub fn body_json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }

    /// Whether this is a mutating request (anything but GET/HEAD/OPTIONS).
    pub fn is_mutation(&self) -> bool {
        !matches!(self.method.as_str(), "GET" | "HEAD" | "OPTIONS")
    }
}

impl ApiServer {
    /// A builder for a server with non-default options.
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder::default()
    }

    /// Starts a server with the default options on `127.0.0.1:0`.
    pub async fn start() -> Self {
        ApiServerBuilder::default().start().await
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address (the same across [`stop`](Self::stop) and [`resume`](Self::resume)).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Writes a kubeconfig pointing at this server, with a bearer `token` if given.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>, token: Option<&str>) {
        write_kubeconfig(path, &self.url(), token);
    }

    /// A kube client for this server, built from an in-memory kubeconfig the same way a
    /// kubeconfig file would be read.
    pub async fn client(&self, token: Option<&str>) -> kube::Client {
        let text = kubeconfig_text(&self.url(), token);
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).expect("kubeconfig parses");
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("kube config from kubeconfig");
        kube::Client::try_from(config).expect("kube client")
    }

    // --- test-side store access -------------------------------------------------------------

    /// Creates or replaces the object described by `manifest` (resource chosen from `apiVersion`
    /// and `kind`; namespace defaults to `default` for namespaced kinds), as a controller or the
    /// kubelet writing directly would: `status` is kept, `uid`/`creationTimestamp` are preserved
    /// on update, `generation` bumps when anything outside metadata/status changed, and an
    /// unchanged object is not rewritten. Watchers see ADDED/MODIFIED. Returns the stored object.
    pub fn apply(&self, manifest: Value) -> Value {
        let mut st = self.shared.lock();
        let api_version = manifest["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = manifest["kind"].as_str().unwrap_or_default().to_string();
        let def = st
            .def_for_kind(&api_version, &kind)
            .unwrap_or_else(|| panic!("the test API server does not serve {api_version} {kind}"));
        let name = manifest["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| panic!("manifest without metadata.name: {manifest}"))
            .to_string();
        let ns = if def.namespaced {
            manifest["metadata"]["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        match st.get_obj(&def, &ns, &name) {
            Some(existing) => st.store_update(&def, &ns, &name, &existing, manifest, false),
            None => st.store_create(&def, &ns, &name, manifest, true, false),
        }
    }

    /// Applies every document of a (multi-document) YAML text; `kind: List` documents apply
    /// each item. Returns the stored objects.
    pub fn apply_yaml(&self, yaml: &str) -> Vec<Value> {
        let mut stored = Vec::new();
        // Read as the files source reads manifests; empty documents are skipped.
        let options = portcullis::source::files::yaml_options();
        let documents = serde_saphyr::from_multiple_with_options::<Value>(yaml, options);
        for value in documents.expect("YAML documents") {
            if value["kind"] == "List" {
                for item in value["items"].as_array().cloned().unwrap_or_default() {
                    stored.push(self.apply(item));
                }
            } else {
                stored.push(self.apply(value));
            }
        }
        stored
    }

    /// The stored object, if any (`ns` is ignored for cluster-scoped kinds).
    pub fn get(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let st = self.shared.lock();
        let def = st.def_for_kind(api_version, kind)?;
        let ns = if def.namespaced { ns } else { "" };
        st.get_obj(&def, ns, name)
    }

    /// The stored objects of a kind, in namespace/name order, in `ns` or everywhere.
    pub fn list(&self, api_version: &str, kind: &str, ns: Option<&str>) -> Vec<Value> {
        let st = self.shared.lock();
        let Some(def) = st.def_for_kind(api_version, kind) else {
            return Vec::new();
        };
        st.objects
            .get(&def.gvr())
            .map(|m| {
                m.iter()
                    .filter(|((o_ns, _), _)| ns.is_none_or(|ns| ns == o_ns))
                    .map(|(_, v)| v.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Removes the object at once (finalizers are ignored); watchers see DELETED. Returns the
    /// deleted object.
    pub fn delete(&self, api_version: &str, kind: &str, ns: &str, name: &str) -> Option<Value> {
        let mut st = self.shared.lock();
        let def = st.def_for_kind(api_version, kind)?;
        let ns = if def.namespaced { ns } else { "" };
        st.commit(&def, ns, name, None)
    }

    /// The current (global) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    // --- log and counters --------------------------------------------------------------------

    /// The mutating requests (POST/PUT/PATCH/DELETE) received so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| r.is_mutation())
            .cloned()
            .collect()
    }

    /// Every request received so far, in order (including GETs, watches and refused ones).
    pub fn all_requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().requests.clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.shared.lock().requests.clear();
    }

    /// How many list requests for `plural` reached the resource handler (after injected
    /// failures, authentication and `forbid`).
    pub fn list_count(&self, plural: &str) -> usize {
        self.shared
            .lock()
            .list_counts
            .get(plural)
            .copied()
            .unwrap_or(0)
    }

    /// How many watch requests for `plural` reached the resource handler.
    pub fn watch_count(&self, plural: &str) -> usize {
        self.shared
            .lock()
            .watch_counts
            .get(plural)
            .copied()
            .unwrap_or(0)
    }

    /// How many watch streams for `plural` are open right now.
    pub fn open_watches(&self, plural: &str) -> usize {
        self.shared
            .lock()
            .watchers
            .values()
            .filter(|w| w.plural == plural)
            .count()
    }

    // --- fault injection ---------------------------------------------------------------------

    /// Stops listening (connects get ECONNREFUSED) and aborts every open connection, watch
    /// streams included. State is kept. Returns once the port is closed.
    pub async fn stop(&self) {
        let accept = {
            let mut net = self.shared.net();
            net.stopped = true;
            net.accept.take()
        };
        if let Some(accept) = accept {
            accept.abort();
            let _ = accept.await;
        }
        let conns: Vec<JoinHandle<()>> = self.shared.net().conns.drain().map(|(_, h)| h).collect();
        for conn in &conns {
            conn.abort();
        }
        for conn in conns {
            let _ = conn.await;
        }
        self.shared.lock().watchers.clear();
    }

    /// Listens again on the same port, with the same state. A no-op if not stopped.
    pub async fn resume(&self) {
        if !self.shared.net().stopped {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match bind_reuse(self.addr) {
                Ok(listener) => break listener,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("rebinding {}: {e}", self.addr),
            }
        };
        let accept = spawn_accept(self.shared.clone(), listener);
        let mut net = self.shared.net();
        net.accept = Some(accept);
        net.stopped = false;
    }

    /// `true`: [`stop`](Self::stop); `false`: [`resume`](Self::resume).
    pub async fn refuse_connections(&self, refuse: bool) {
        if refuse {
            self.stop().await;
        } else {
            self.resume().await;
        }
    }

    /// Whether the server is stopped.
    pub fn is_stopped(&self) -> bool {
        self.shared.net().stopped
    }

    /// Answers the next `count` requests (every request while `None`), `/version` included, with
    /// HTTP `code` and a matching Status body. `fail_requests(code, Some(0))` clears it.
    pub fn fail_requests(&self, code: u16, count: Option<usize>) {
        self.shared.lock().faults.fail = Some(FailSpec {
            code,
            remaining: count,
        });
    }

    /// Stops failing requests.
    pub fn clear_failures(&self) {
        self.shared.lock().faults.fail = None;
    }

    /// Runs `check` on every object created or replaced through the API (POST, PUT; not
    /// status), as the API server's validating admission does: a refusal answers 422 Invalid
    /// with its message, warnings come back as `Warning` headers. `None` removes it.
    pub fn set_admission(&self, check: Option<AdmissionCheck>) {
        self.shared.lock().admission = check;
    }

    /// Requires `Authorization: Bearer <token>` on every request (401 otherwise); `None` lifts it.
    pub fn require_token(&self, token: Option<&str>) {
        self.shared.lock().faults.token = token.map(str::to_string);
    }

    /// Holds every new request this long before answering it (`Duration::ZERO` to stop).
    pub fn stall(&self, delay: Duration) {
        self.shared.lock().faults.stall = delay;
    }

    /// Ends every open watch stream abruptly: the connection is closed without the terminating
    /// chunk.
    pub fn drop_watches(&self) {
        let mut st = self.shared.lock();
        for watcher in st.watchers.values() {
            let _ = watcher.tx.send(WatchMsg::Drop);
        }
        st.watchers.clear();
    }

    /// Forgets the retained event history up to now: a watch from an older resourceVersion gets
    /// the `410 Expired` ERROR event, a list with an older continue token (or an `Exact` older
    /// resourceVersion) gets HTTP 410. A watch from the current resourceVersion stays valid.
    pub fn compact(&self) {
        let mut st = self.shared.lock();
        st.history.clear();
        st.history_start = st.rv;
    }

    /// Answers 403 Forbidden to every request on `resource` (a plural, or `plural/status` for the
    /// subresource only; like RBAC, `ingresses` does not cover `ingresses/status`).
    pub fn forbid(&self, resource: &str) {
        self.shared
            .lock()
            .faults
            .forbidden
            .insert((resource.to_string(), None));
    }

    /// Answers 403 Forbidden to `verb` (get, list, watch, create, update, patch, delete,
    /// deletecollection) on `resource`.
    pub fn forbid_verb(&self, resource: &str, verb: &str) {
        self.shared
            .lock()
            .faults
            .forbidden
            .insert((resource.to_string(), Some(verb.to_string())));
    }

    /// Lifts every `forbid`/`forbid_verb` on `resource`.
    pub fn allow(&self, resource: &str) {
        self.shared
            .lock()
            .faults
            .forbidden
            .retain(|(r, _)| r != resource);
    }
}

// ---------------------------------------------------------------------------------------------
// Shared state

struct Shared {
    state: Mutex<State>,
    net: Mutex<Net>,
    bookmark_interval: Duration,
    next_conn: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn net(&self) -> MutexGuard<'_, Net> {
        self.net.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct Net {
    accept: Option<JoinHandle<()>>,
    conns: HashMap<u64, JoinHandle<()>>,
    stopped: bool,
}

#[derive(Debug, Default)]
struct Faults {
    fail: Option<FailSpec>,
    token: Option<String>,
    stall: Duration,
    forbidden: HashSet<(String, Option<String>)>,
}

#[derive(Debug)]
struct FailSpec {
    code: u16,
    remaining: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One stored change, as retained in the history and fanned out to watchers.
#[derive(Debug)]
struct Change {
    rv: u64,
    gvr: String,
    kind: ChangeType,
    /// The object after the change (for a deletion: the last state with the deletion's rv).
    object: Value,
    /// The object before the change.
    prev: Option<Value>,
}

enum WatchMsg {
    Change(Arc<Change>),
    Drop,
}

struct Watcher {
    gvr: String,
    plural: String,
    tx: mpsc::UnboundedSender<WatchMsg>,
}

type Key = (String, String);

/// A validating admission step: (kind, namespace, operation, object) → verdict.
pub type AdmissionCheck = Arc<dyn Fn(&str, &str, &str, &Value) -> AdmissionVerdict + Send + Sync>;

/// What an admission step decided.
#[derive(Debug, Clone, Default)]
pub struct AdmissionVerdict {
    /// The refusal's message; `None`: admitted.
    pub denied: Option<String>,
    pub warnings: Vec<String>,
}

struct State {
    resources: Vec<ResourceDef>,
    admission: Option<AdmissionCheck>,
    /// gvr -> (namespace, name) -> object.
    objects: HashMap<String, BTreeMap<Key, Value>>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    /// Every change with an rv greater than this is in `history`.
    history_start: u64,
    history_limit: usize,
    watchers: HashMap<u64, Watcher>,
    next_watcher: u64,
    random: u64,
    faults: Faults,
    requests: Vec<RequestRecord>,
    list_counts: HashMap<String, usize>,
    watch_counts: HashMap<String, usize>,
    list_item_type_meta: bool,
    addr: SocketAddr,
}

impl State {
    fn def_for_kind(&self, api_version: &str, kind: &str) -> Option<ResourceDef> {
        self.resources
            .iter()
            .find(|d| d.api_version() == api_version && d.kind == kind)
            .cloned()
    }

    fn def_for_plural(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceDef> {
        self.resources
            .iter()
            .find(|d| d.group == group && d.version == version && d.plural == plural)
    }

    fn get_obj(&self, def: &ResourceDef, ns: &str, name: &str) -> Option<Value> {
        self.objects
            .get(&def.gvr())?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.random;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.random = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn new_uid(&mut self) -> String {
        let a = self.next_random();
        let b = self.next_random();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }

    fn random_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[(self.next_random() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }

    /// Stores (`Some`) or removes (`None`) an object: stamps a new resourceVersion, records the
    /// change and fans it out to watchers. Returns the stored (or deleted) object.
    fn commit(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        new: Option<Value>,
    ) -> Option<Value> {
        let gvr = def.gvr();
        let key = (ns.to_string(), name.to_string());
        let prev = self.objects.get(&gvr).and_then(|m| m.get(&key)).cloned();
        if prev.is_none() && new.is_none() {
            return None;
        }
        self.rv += 1;
        let rv = self.rv;
        let (kind, object) = match new {
            Some(mut object) => {
                set_resource_version(&mut object, rv);
                self.objects
                    .entry(gvr.clone())
                    .or_default()
                    .insert(key, object.clone());
                let kind = if prev.is_some() {
                    ChangeType::Modified
                } else {
                    ChangeType::Added
                };
                (kind, object)
            }
            None => {
                if let Some(m) = self.objects.get_mut(&gvr) {
                    m.remove(&key);
                }
                let mut object = prev.clone().unwrap_or(Value::Null);
                set_resource_version(&mut object, rv);
                (ChangeType::Deleted, object)
            }
        };
        let change = Arc::new(Change {
            rv,
            gvr,
            kind,
            object: object.clone(),
            prev,
        });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.history_start = old.rv;
            }
        }
        self.watchers.retain(|_, w| {
            w.gvr != change.gvr || w.tx.send(WatchMsg::Change(change.clone())).is_ok()
        });
        Some(object)
    }

    /// The objects of `gvr` as they were at resourceVersion `rv` (which must be retained).
    fn objects_at(&self, gvr: &str, rv: u64) -> BTreeMap<Key, Value> {
        let mut objects = self.objects.get(gvr).cloned().unwrap_or_default();
        for change in self.history.iter().rev() {
            if change.rv <= rv {
                break;
            }
            if change.gvr != gvr {
                continue;
            }
            let key = object_key(&change.object);
            match (change.kind, &change.prev) {
                (ChangeType::Added, _) => {
                    objects.remove(&key);
                }
                (_, Some(prev)) => {
                    objects.insert(key, prev.clone());
                }
                (_, None) => {}
            }
        }
        objects
    }

    /// Stores a new object: type meta, name, namespace, uid, creationTimestamp, generation 1.
    fn store_create(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        mut obj: Value,
        keep_status: bool,
        dry_run: bool,
    ) -> Value {
        if !obj.is_object() {
            obj = json!({});
        }
        obj["apiVersion"] = json!(def.api_version());
        obj["kind"] = json!(def.kind);
        let uid = self.new_uid();
        {
            let meta = metadata_mut(&mut obj);
            meta.insert("name".into(), json!(name));
            if def.namespaced {
                meta.insert("namespace".into(), json!(ns));
            } else {
                meta.remove("namespace");
            }
            meta.insert("uid".into(), json!(uid));
            meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
            meta.insert("generation".into(), json!(1));
            meta.remove("resourceVersion");
            meta.remove("deletionTimestamp");
            meta.remove("deletionGracePeriodSeconds");
        }
        if def.status_subresource && !keep_status {
            if let Some(map) = obj.as_object_mut() {
                map.remove("status");
            }
        }
        if dry_run {
            return obj;
        }
        self.commit(def, ns, name, Some(obj)).unwrap_or(Value::Null)
    }

    /// Replaces `existing` with `new`, keeping the system metadata; bumps generation when
    /// anything outside metadata/status changed; writes nothing when nothing changed; deletes
    /// the object when it is being deleted and its last finalizer went away.
    fn store_update(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        existing: &Value,
        mut new: Value,
        dry_run: bool,
    ) -> Value {
        if !new.is_object() {
            new = json!({});
        }
        new["apiVersion"] = json!(def.api_version());
        new["kind"] = json!(def.kind);
        let old_meta = existing["metadata"].clone();
        {
            let meta = metadata_mut(&mut new);
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
                "generation",
            ] {
                match old_meta.get(field) {
                    Some(v) => {
                        meta.insert(field.into(), v.clone());
                    }
                    None => {
                        meta.remove(field);
                    }
                }
            }
            meta.insert("name".into(), json!(name));
            if def.namespaced {
                meta.insert("namespace".into(), json!(ns));
            } else {
                meta.remove("namespace");
            }
        }
        if without_meta_and_status(existing) != without_meta_and_status(&new) {
            let generation = old_meta["generation"].as_i64().unwrap_or(0) + 1;
            metadata_mut(&mut new).insert("generation".into(), json!(generation));
        }
        let finalizers_gone = new["metadata"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty);
        let deleting = !new["metadata"]["deletionTimestamp"].is_null() && finalizers_gone;
        if new == *existing && !deleting {
            return existing.clone();
        }
        if dry_run {
            return new;
        }
        if deleting {
            return self.commit(def, ns, name, None).unwrap_or(Value::Null);
        }
        self.commit(def, ns, name, Some(new)).unwrap_or(Value::Null)
    }
}

fn object_key(obj: &Value) -> Key {
    (
        obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

fn set_resource_version(obj: &mut Value, rv: u64) {
    if obj.is_object() {
        metadata_mut(obj).insert("resourceVersion".into(), json!(rv.to_string()));
    }
}

fn resource_version_of(obj: &Value) -> &str {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
}

fn without_meta_and_status(obj: &Value) -> Value {
    let mut obj = obj.clone();
    if let Some(map) = obj.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
        map.remove("apiVersion");
        map.remove("kind");
    }
    obj
}

// ---------------------------------------------------------------------------------------------
// Networking

fn bind_reuse(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

fn spawn_accept(shared: Arc<Shared>, listener: TcpListener) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            };
            spawn_connection(&shared, stream);
        }
    })
}

fn spawn_connection(shared: &Arc<Shared>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let conn_shared = shared.clone();
    let handle = tokio::spawn(async move {
        let service_shared = conn_shared.clone();
        let service = hyper::service::service_fn(move |req| serve(service_shared.clone(), req));
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .serve_connection(TokioIo::new(stream), service)
            .await;
        conn_shared.net().conns.remove(&id);
    });
    let mut net = shared.net();
    if !handle.is_finished() {
        net.conns.insert(id, handle);
    }
}

/// A response body: a whole JSON document, or a stream of chunks (watch), which ends cleanly
/// when the sender is dropped and abruptly (the connection is closed) on an `Err`.
enum RespBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<io::Result<Bytes>>),
}

impl hyper::body::Body for RespBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            RespBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            RespBody::Stream(rx) => rx
                .poll_recv(cx)
                .map(|item| item.map(|chunk| chunk.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, RespBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RespBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            RespBody::Full(None) => SizeHint::with_exact(0),
            RespBody::Stream(_) => SizeHint::default(),
        }
    }
}

fn json_response(code: u16, value: &Value) -> Response<RespBody> {
    json_response_typed(code, value, "application/json")
}

fn json_response_typed(code: u16, value: &Value, content_type: &str) -> Response<RespBody> {
    let body = serde_json::to_vec(value).expect("JSON serializes");
    Response::builder()
        .status(code)
        .header("content-type", content_type)
        .header("cache-control", "no-cache, private")
        .body(RespBody::Full(Some(Bytes::from(body))))
        .expect("response")
}

fn text_response(code: u16, text: &'static str) -> Response<RespBody> {
    Response::builder()
        .status(code)
        .header("content-type", "text/plain; charset=utf-8")
        .body(RespBody::Full(Some(Bytes::from_static(text.as_bytes()))))
        .expect("response")
}

// ---------------------------------------------------------------------------------------------
// Requests

struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: &str) -> Self {
        Self(
            raw.split('&')
                .filter(|p| !p.is_empty())
                .map(|pair| match pair.split_once('=') {
                    Some((k, v)) => (percent_decode(k), percent_decode(v)),
                    None => (percent_decode(pair), String::new()),
                })
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                match (
                    bytes.get(i + 1).copied().and_then(hex),
                    bytes.get(i + 2).copied().and_then(hex),
                ) {
                    (Some(hi), Some(lo)) => {
                        out.push((hi * 16 + lo) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Ctx {
    method: Method,
    path: String,
    raw_query: String,
    query: Query,
    accept: String,
    content_type: String,
    token: Option<String>,
    user_agent: Option<String>,
    body: Bytes,
}

impl Ctx {
    fn dry_run(&self) -> bool {
        self.query.get("dryRun") == Some("All")
    }

    fn shape(&self) -> Shape {
        if self.accept.contains("as=PartialObjectMetadata") {
            Shape::Meta
        } else {
            Shape::Full
        }
    }
}

async fn serve(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, Infallible> {
    let stall = shared.lock().faults.stall;
    if !stall.is_zero() {
        tokio::time::sleep(stall).await;
    }
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let raw_query = parts.uri.query().unwrap_or_default().to_string();
    let ctx = Ctx {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        query: Query::parse(&raw_query),
        raw_query,
        accept: header("accept").unwrap_or_default(),
        content_type: header("content-type").unwrap_or_default(),
        token: header("authorization").and_then(|a| a.strip_prefix("Bearer ").map(str::to_string)),
        user_agent: header("user-agent"),
        body,
    };
    let response = dispatch(&shared, &ctx);
    shared.lock().requests.push(RequestRecord {
        method: ctx.method.to_string(),
        path: ctx.path.clone(),
        query: ctx.raw_query.clone(),
        content_type: (!ctx.content_type.is_empty()).then(|| ctx.content_type.clone()),
        body: String::from_utf8_lossy(&ctx.body).into_owned(),
        status: response.status().as_u16(),
        token: ctx.token.clone(),
        user_agent: ctx.user_agent.clone(),
    });
    Ok(response)
}

fn dispatch(shared: &Arc<Shared>, ctx: &Ctx) -> Response<RespBody> {
    let mut st = shared.lock();
    if let Some(fail) = &mut st.faults.fail {
        match fail.remaining {
            Some(0) => st.faults.fail = None,
            remaining => {
                let code = fail.code;
                fail.remaining = remaining.map(|n| n - 1);
                return error_response(&ApiError::injected(code));
            }
        }
    }
    let authorized = st
        .faults
        .token
        .as_deref()
        .is_none_or(|token| ctx.token.as_deref() == Some(token));
    if !authorized {
        return error_response(&ApiError::new(401, "Unauthorized", "Unauthorized".into()));
    }
    let segments: Vec<&str> = ctx.path.split('/').filter(|s| !s.is_empty()).collect();
    let get_only = |response: Response<RespBody>| {
        if ctx.method == Method::GET {
            response
        } else {
            error_response(&ApiError::method_not_allowed())
        }
    };
    let aggregated = ctx.accept.contains("as=APIGroupDiscoveryList");
    match segments.as_slice() {
        ["version"] => get_only(json_response(200, &version_info())),
        [probe, ..] if matches!(*probe, "healthz" | "readyz" | "livez") => {
            get_only(text_response(200, "ok"))
        }
        ["api"] if aggregated => get_only(json_response_typed(
            200,
            &st.aggregated_discovery(true),
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        )),
        ["api"] => get_only(json_response(
            200,
            &json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    { "clientCIDR": "0.0.0.0/0", "serverAddress": st.addr.to_string() }
                ]
            }),
        )),
        ["api", version] => match st.resource_list("", version) {
            Some(list) => get_only(json_response(200, &list)),
            None => error_response(&ApiError::generic_not_found()),
        },
        ["apis"] if aggregated => get_only(json_response_typed(
            200,
            &st.aggregated_discovery(false),
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        )),
        ["apis"] => get_only(json_response(200, &st.api_group_list())),
        ["apis", group] => match st.api_group(group) {
            Some(group) => get_only(json_response(200, &group)),
            None => error_response(&ApiError::generic_not_found()),
        },
        ["apis", group, version] => match st.resource_list(group, version) {
            Some(list) => get_only(json_response(200, &list)),
            None => error_response(&ApiError::generic_not_found()),
        },
        ["api", version, rest @ ..] => resource_request(shared, &mut st, "", version, rest, ctx),
        ["apis", group, version, rest @ ..] => {
            resource_request(shared, &mut st, group, version, rest, ctx)
        }
        _ => error_response(&ApiError::generic_not_found()),
    }
}

/// Which resource (and object, subresource) a path names.
struct Target {
    def: ResourceDef,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Target {
    fn ns(&self) -> &str {
        self.ns.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
}

fn parse_target(st: &State, group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let target = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if tail.len() <= 2
                && st
                    .def_for_plural(group, version, plural)
                    .is_some_and(|d| d.namespaced) =>
        {
            Target {
                def: st.def_for_plural(group, version, plural)?.clone(),
                ns: Some((*ns).to_string()),
                name: tail.first().map(|s| (*s).to_string()),
                sub: tail.get(1).map(|s| (*s).to_string()),
            }
        }
        [plural, tail @ ..] if tail.len() <= 2 => {
            let def = st.def_for_plural(group, version, plural)?;
            if def.namespaced && !tail.is_empty() {
                return None;
            }
            Target {
                def: def.clone(),
                ns: None,
                name: tail.first().map(|s| (*s).to_string()),
                sub: tail.get(1).map(|s| (*s).to_string()),
            }
        }
        _ => return None,
    };
    match target.sub.as_deref() {
        None => Some(target),
        Some("status") if target.def.status_subresource => Some(target),
        Some(_) => None,
    }
}

fn resource_request(
    shared: &Arc<Shared>,
    st: &mut State,
    group: &str,
    version: &str,
    rest: &[&str],
    ctx: &Ctx,
) -> Response<RespBody> {
    let Some(target) = parse_target(st, group, version, rest) else {
        return error_response(&ApiError::generic_not_found());
    };
    let watch = ctx.query.flag("watch");
    let verb = match (&ctx.method, target.name.is_some(), target.sub.is_some()) {
        (&Method::GET, false, _) if watch => "watch",
        (&Method::GET, false, _) => "list",
        (&Method::GET, true, false) if watch => "watch",
        (&Method::GET, true, _) => "get",
        (&Method::POST, false, _) => "create",
        (&Method::PUT, true, _) => "update",
        (&Method::PATCH, true, _) => "patch",
        (&Method::DELETE, true, false) => "delete",
        (&Method::DELETE, false, _) => "deletecollection",
        _ => return error_response(&ApiError::method_not_allowed()),
    };
    let resource = match &target.sub {
        Some(sub) => format!("{}/{sub}", target.def.plural),
        None => target.def.plural.clone(),
    };
    let forbidden = st
        .faults
        .forbidden
        .iter()
        .any(|(r, v)| *r == resource && v.as_deref().is_none_or(|v| v == verb));
    if forbidden {
        return error_response(&ApiError::forbidden(&target, &resource, verb));
    }
    let shape = ctx.shape();
    let status_sub = target.sub.is_some();
    let mut warnings = Vec::new();
    if let (Some(check), "create" | "update", false) = (st.admission.clone(), verb, status_sub) {
        if let Ok(object) = parse_json_body(&ctx.body) {
            let operation = if verb == "create" { "CREATE" } else { "UPDATE" };
            let verdict = check(&target.def.kind, target.ns(), operation, &object);
            if let Some(message) = verdict.denied {
                return error_response(&ApiError::new(422, "Invalid", message));
            }
            warnings = verdict.warnings;
        }
    }
    let result = match verb {
        "watch" => {
            *st.watch_counts
                .entry(target.def.plural.clone())
                .or_default() += 1;
            return match start_watch(shared, st, &target, ctx) {
                Ok(response) => response,
                Err(e) => error_response(&e),
            };
        }
        "list" => {
            *st.list_counts.entry(target.def.plural.clone()).or_default() += 1;
            st.api_list(&target, ctx).map(|v| (200, v))
        }
        "get" => st
            .get_obj(&target.def, target.ns(), target.name())
            .map(|obj| (200, shape.apply(&obj)))
            .ok_or_else(|| ApiError::not_found(&target.def, target.name())),
        "create" => st
            .api_create(&target, ctx)
            .map(|(c, v)| (c, shape.apply(&v))),
        "update" => parse_json_body(&ctx.body)
            .and_then(|body| st.api_update(&target, body, status_sub, ctx.dry_run()))
            .map(|(c, v)| (c, shape.apply(&v))),
        "patch" => st
            .api_patch(&target, ctx, status_sub)
            .map(|(c, v)| (c, shape.apply(&v))),
        "delete" => st.api_delete(&target, ctx),
        "deletecollection" => st.api_delete_collection(&target, ctx),
        _ => Err(ApiError::method_not_allowed()),
    };
    match result {
        Ok((code, value)) => {
            let mut response = json_response(code, &value);
            for w in warnings {
                let header = format!("299 - \"{}\"", w.replace('"', "'"));
                if let Ok(v) = hyper::header::HeaderValue::from_str(&header) {
                    response.headers_mut().append("warning", v);
                }
            }
            response
        }
        Err(e) => error_response(&e),
    }
}

fn parse_json_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

// ---------------------------------------------------------------------------------------------
// Errors

#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> Self {
        Self {
            code,
            reason,
            message,
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }

    fn not_found(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", def.qualified()),
        )
        .with_details(details(def, name))
    }

    fn generic_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
        )
        .with_details(json!({}))
    }

    fn already_exists(def: &ResourceDef, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", def.qualified()),
        )
        .with_details(details(def, name))
    }

    fn conflict(def: &ResourceDef, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                def.qualified()
            ),
        )
        .with_details(details(def, name))
    }

    fn modified(def: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            def,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    fn bad_request(message: String) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn invalid(def: &ResourceDef, name: &str, message: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {message}", def.kind),
        )
        .with_details(details(def, name))
    }

    fn expired(message: String) -> Self {
        Self::new(410, "Expired", message)
    }

    fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
        )
        .with_details(json!({}))
    }

    fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, \
                 application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    fn forbidden(target: &Target, resource: &str, verb: &str) -> Self {
        let def = &target.def;
        let scope = match &target.ns {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let qualified = if def.group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{}", def.group)
        };
        let subject = match &target.name {
            Some(name) => format!("{qualified} \"{name}\" is forbidden"),
            None => format!("{qualified} is forbidden"),
        };
        let mut details = json!({ "kind": def.plural });
        if !def.group.is_empty() {
            details["group"] = json!(def.group);
        }
        if let Some(name) = &target.name {
            details["name"] = json!(name);
        }
        Self::new(
            403,
            "Forbidden",
            format!(
                "{subject}: User \"{TEST_USER}\" cannot {verb} resource \"{resource}\" in API group \"{}\" {scope}",
                def.group
            ),
        )
        .with_details(details)
    }

    fn injected(code: u16) -> Self {
        let (reason, message) = match code {
            400 => ("BadRequest", "injected bad request"),
            401 => ("Unauthorized", "Unauthorized"),
            403 => ("Forbidden", "forbidden: injected failure"),
            404 => (
                "NotFound",
                "the server could not find the requested resource",
            ),
            409 => ("Conflict", "injected conflict"),
            410 => ("Expired", "injected expiry"),
            429 => (
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            ),
            500 => ("InternalError", "Internal error occurred: injected failure"),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted, but may still be processing the request",
            ),
            c if c >= 500 => ("InternalError", "Internal error occurred: injected failure"),
            _ => ("BadRequest", "injected failure"),
        };
        Self::new(code, reason, message.into())
    }
}

fn details(def: &ResourceDef, name: &str) -> Value {
    let mut details = json!({ "name": name, "kind": def.plural });
    if !def.group.is_empty() {
        details["group"] = json!(def.group);
    }
    details
}

fn error_response(error: &ApiError) -> Response<RespBody> {
    json_response(error.code, &error.status())
}

// ---------------------------------------------------------------------------------------------
// Verbs

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Full,
    /// `PartialObjectMetadata`, as asked for with `Accept: ...;as=PartialObjectMetadata`.
    Meta,
}

impl Shape {
    fn apply(self, obj: &Value) -> Value {
        match self {
            Shape::Full => obj.clone(),
            Shape::Meta => json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"].clone(),
            }),
        }
    }
}

fn continue_token(rv: u64, key: &Key) -> String {
    let raw =
        json!({ "v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}\u{0}", key.0, key.1) });
    raw.to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_continue_token(token: &str) -> Option<(u64, Key)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let raw: Value = serde_json::from_slice(&bytes?).ok()?;
    let rv = raw["rv"].as_u64()?;
    let start = raw["start"].as_str()?.strip_suffix('\u{0}')?;
    let (ns, name) = start.split_once('/')?;
    Some((rv, (ns.to_string(), name.to_string())))
}

impl State {
    fn api_list(&self, target: &Target, ctx: &Ctx) -> Result<Value, ApiError> {
        let def = &target.def;
        let filter = Filter::from_query(target, &ctx.query)?;
        let limit = match ctx.query.get("limit") {
            Some(l) => l
                .parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))?,
            None => 0,
        };
        let mut start_after: Option<Key> = None;
        let rv = if let Some(token) = ctx.query.get("continue").filter(|t| !t.is_empty()) {
            let (rv, key) = parse_continue_token(token).ok_or_else(|| {
                ApiError::bad_request(format!("continue key is not valid: {token}"))
            })?;
            if rv < self.history_start {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter, or use the continue \
                     token in this response to retrieve the remainder of the results. Continuing with \
                     the provided token results in an inconsistent list - objects that were created, \
                     modified, or deleted between the time the first chunk was returned and now may \
                     show up in the list."
                        .into(),
                ));
            }
            start_after = Some(key);
            rv
        } else {
            let requested = ctx.query.get("resourceVersion").filter(|v| !v.is_empty());
            let exact = ctx.query.get("resourceVersionMatch") == Some("Exact");
            match requested {
                Some(v) => {
                    let n: u64 = v.parse().map_err(|_| {
                        ApiError::bad_request(format!("invalid resource version: {v:?}"))
                    })?;
                    if n > self.rv {
                        return Err(ApiError::new(
                            504,
                            "Timeout",
                            format!("Too large resource version: {n}, current: {}", self.rv),
                        )
                        .with_details(json!({
                            "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }],
                            "retryAfterSeconds": 1
                        })));
                    }
                    if exact {
                        if n < self.history_start {
                            return Err(ApiError::expired(format!(
                                "too old resource version: {n} ({})",
                                self.history_start + 1
                            )));
                        }
                        n
                    } else {
                        self.rv
                    }
                }
                None => self.rv,
            }
        };
        let objects = self.objects_at(&def.gvr(), rv);
        let matching: Vec<(&Key, &Value)> = objects
            .iter()
            .filter(|(key, _)| start_after.as_ref().is_none_or(|after| *key > after))
            .filter(|(_, obj)| filter.matches(obj))
            .collect();
        let total = matching.len();
        let page: Vec<(&Key, &Value)> = if limit > 0 {
            matching.into_iter().take(limit).collect()
        } else {
            matching
        };
        let shape = ctx.shape();
        let builtin = !def.group.contains('.') || def.group.ends_with(".k8s.io");
        let strip = !self.list_item_type_meta && builtin && shape == Shape::Full;
        let items: Vec<Value> = page
            .iter()
            .map(|(_, obj)| {
                let mut item = shape.apply(obj);
                if strip {
                    if let Some(map) = item.as_object_mut() {
                        map.remove("apiVersion");
                        map.remove("kind");
                    }
                }
                item
            })
            .collect();
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if limit > 0 && total > page.len() {
            if let Some((last, _)) = page.last() {
                metadata["continue"] = json!(continue_token(rv, last));
            }
            if filter.is_empty() {
                metadata["remainingItemCount"] = json!(total - page.len());
            }
        }
        let (kind, api_version) = match shape {
            Shape::Full => (format!("{}List", def.kind), def.api_version()),
            Shape::Meta => (
                "PartialObjectMetadataList".to_string(),
                "meta.k8s.io/v1".to_string(),
            ),
        };
        Ok(json!({
            "kind": kind,
            "apiVersion": api_version,
            "metadata": metadata,
            "items": items,
        }))
    }

    fn api_create(&mut self, target: &Target, ctx: &Ctx) -> Result<(u16, Value), ApiError> {
        let def = &target.def;
        if def.namespaced && target.ns.is_none() {
            return Err(ApiError::method_not_allowed());
        }
        let mut obj = parse_json_body(&ctx.body)?;
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body is not a JSON object".into(),
            ));
        }
        check_type_meta(def, &obj)?;
        if !obj["metadata"].is_null() && !obj["metadata"].is_object() {
            return Err(ApiError::bad_request("metadata must be an object".into()));
        }
        let ns = target.ns().to_string();
        let other_ns = obj["metadata"]["namespace"]
            .as_str()
            .is_some_and(|n| !n.is_empty() && n != ns);
        if def.namespaced && other_ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        let name = match obj["metadata"]["name"].as_str().filter(|n| !n.is_empty()) {
            Some(name) => name.to_string(),
            None => match obj["metadata"]["generateName"]
                .as_str()
                .filter(|n| !n.is_empty())
            {
                Some(prefix) => format!("{prefix}{}", self.random_suffix()),
                None => {
                    return Err(ApiError::invalid(
                        def,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            },
        };
        validate_name(def, &name)?;
        if !resource_version_of(&obj).is_empty() {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created".into(),
            ));
        }
        if self.get_obj(def, &ns, &name).is_some() {
            return Err(ApiError::already_exists(def, &name));
        }
        metadata_mut(&mut obj).insert("name".into(), json!(name));
        Ok((
            201,
            self.store_create(def, &ns, &name, obj, false, ctx.dry_run()),
        ))
    }

    /// PUT of the object or its status: optimistic concurrency on `metadata.resourceVersion`;
    /// the main resource ignores `.status` (status subresource kinds) and the status subresource
    /// changes only `.status`.
    fn api_update(
        &mut self,
        target: &Target,
        body: Value,
        status_sub: bool,
        dry_run: bool,
    ) -> Result<(u16, Value), ApiError> {
        let def = &target.def;
        let name = target.name();
        let ns = target.ns();
        let existing = self
            .get_obj(def, ns, name)
            .ok_or_else(|| ApiError::not_found(def, name))?;
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body is not a JSON object".into(),
            ));
        }
        check_type_meta(def, &body)?;
        if let Some(body_name) = body["metadata"]["name"].as_str().filter(|n| *n != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let other_ns = body["metadata"]["namespace"]
            .as_str()
            .is_some_and(|n| !n.is_empty() && n != ns);
        if def.namespaced && other_ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        let body_rv = resource_version_of(&body);
        if !body_rv.is_empty() && body_rv != resource_version_of(&existing) {
            return Err(ApiError::modified(def, name));
        }
        if let Some(uid) = body["metadata"]["uid"].as_str().filter(|u| !u.is_empty()) {
            let existing_uid = existing["metadata"]["uid"].as_str().unwrap_or_default();
            if uid != existing_uid {
                return Err(ApiError::conflict(
                    def,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {existing_uid}"
                    ),
                ));
            }
        }
        let status = if status_sub {
            body.get("status").cloned()
        } else {
            existing.get("status").cloned()
        };
        let mut merged = if status_sub { existing.clone() } else { body };
        if status_sub || def.status_subresource {
            if let Some(map) = merged.as_object_mut() {
                match status {
                    Some(status) => {
                        map.insert("status".into(), status);
                    }
                    None => {
                        map.remove("status");
                    }
                }
            }
        }
        Ok((
            200,
            self.store_update(def, ns, name, &existing, merged, dry_run),
        ))
    }

    fn api_patch(
        &mut self,
        target: &Target,
        ctx: &Ctx,
        status_sub: bool,
    ) -> Result<(u16, Value), ApiError> {
        let def = &target.def;
        let name = target.name();
        let ns = target.ns();
        let content_type = ctx
            .content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let existing = self.get_obj(def, ns, name);
        let dry_run = ctx.dry_run();
        match content_type.as_str() {
            "application/apply-patch+yaml" => {
                if ctx.query.get("fieldManager").is_none_or(str::is_empty) {
                    return Err(ApiError::bad_request(
                        "PATCH, application/apply-patch+yaml: fieldManager is required".into(),
                    ));
                }
                let patch: Value = match serde_json::from_slice(&ctx.body) {
                    Ok(v) => v,
                    Err(_) => serde_saphyr::from_slice_with_options::<Value>(
                        &ctx.body,
                        portcullis::source::files::yaml_options(),
                    )
                    .ok()
                    .ok_or_else(|| {
                        ApiError::bad_request("error decoding YAML apply patch".into())
                    })?,
                };
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "the apply patch is not an object".into(),
                    ));
                }
                if patch["apiVersion"].as_str().is_none_or(str::is_empty)
                    || patch["kind"].as_str().is_none_or(str::is_empty)
                {
                    return Err(ApiError::bad_request(
                        "apiVersion and kind must be set in an apply patch".into(),
                    ));
                }
                check_type_meta(def, &patch)?;
                if let Some(patch_name) = patch["metadata"]["name"].as_str().filter(|n| *n != name)
                {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({patch_name}) does not match the name on the URL ({name})"
                    )));
                }
                match existing {
                    None if status_sub => Err(ApiError::not_found(def, name)),
                    None => {
                        validate_name(def, name)?;
                        if !resource_version_of(&patch).is_empty() {
                            return Err(ApiError::not_found(def, name));
                        }
                        Ok((201, self.store_create(def, ns, name, patch, false, dry_run)))
                    }
                    Some(existing) => {
                        let mut merged = existing;
                        merge_patch(&mut merged, &patch);
                        self.api_update(target, merged, status_sub, dry_run)
                    }
                }
            }
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                let existing = existing.ok_or_else(|| ApiError::not_found(def, name))?;
                let patch = parse_json_body(&ctx.body)?;
                let mut merged = existing;
                merge_patch(&mut merged, &patch);
                self.api_update(target, merged, status_sub, dry_run)
            }
            "application/json-patch+json" => {
                let existing = existing.ok_or_else(|| ApiError::not_found(def, name))?;
                let ops = parse_json_body(&ctx.body)?;
                let mut patched = existing;
                json_patch(&mut patched, &ops).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ),
                    )
                })?;
                self.api_update(target, patched, status_sub, dry_run)
            }
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }

    fn api_delete(&mut self, target: &Target, ctx: &Ctx) -> Result<(u16, Value), ApiError> {
        let def = &target.def;
        let name = target.name();
        let ns = target.ns();
        let existing = self
            .get_obj(def, ns, name)
            .ok_or_else(|| ApiError::not_found(def, name))?;
        let options: Value = if ctx.body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            parse_json_body(&ctx.body)?
        };
        let dry_run = ctx.dry_run()
            || options["dryRun"]
                .as_array()
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        if let Some(rv) = options["preconditions"]["resourceVersion"]
            .as_str()
            .filter(|rv| *rv != resource_version_of(&existing))
        {
            return Err(ApiError::conflict(
                def,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    resource_version_of(&existing)
                ),
            ));
        }
        if let Some(uid) = options["preconditions"]["uid"].as_str() {
            let existing_uid = existing["metadata"]["uid"].as_str().unwrap_or_default();
            if uid != existing_uid {
                return Err(ApiError::conflict(
                    def,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {existing_uid}"
                    ),
                ));
            }
        }
        Ok((
            200,
            self.delete_one(def, ns, name, existing, dry_run, ctx.shape()),
        ))
    }

    /// Deletes now, or marks for deletion when finalizers remain. Returns what the API answers:
    /// the object (still present) or a Success Status.
    fn delete_one(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        existing: Value,
        dry_run: bool,
        shape: Shape,
    ) -> Value {
        let has_finalizers = existing["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if !existing["metadata"]["deletionTimestamp"].is_null() || dry_run {
                return shape.apply(&existing);
            }
            let mut marked = existing;
            let meta = metadata_mut(&mut marked);
            meta.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
            let stored = self
                .commit(def, ns, name, Some(marked))
                .unwrap_or(Value::Null);
            return shape.apply(&stored);
        }
        if !dry_run {
            self.commit(def, ns, name, None);
        }
        let mut details = details(def, name);
        details["uid"] = existing["metadata"]["uid"].clone();
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        })
    }

    fn api_delete_collection(
        &mut self,
        target: &Target,
        ctx: &Ctx,
    ) -> Result<(u16, Value), ApiError> {
        let def = &target.def;
        let filter = Filter::from_query(target, &ctx.query)?;
        let victims: Vec<(Key, Value)> = self
            .objects
            .get(&def.gvr())
            .map(|m| {
                m.iter()
                    .filter(|(_, obj)| filter.matches(obj))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let dry_run = ctx.dry_run();
        let mut items = Vec::new();
        for ((ns, name), obj) in victims {
            let answer = self.delete_one(def, &ns, &name, obj.clone(), dry_run, Shape::Full);
            items.push(if answer["kind"] == "Status" {
                obj
            } else {
                answer
            });
        }
        Ok((
            200,
            json!({
                "kind": format!("{}List", def.kind),
                "apiVersion": def.api_version(),
                "metadata": { "resourceVersion": self.rv.to_string() },
                "items": items,
            }),
        ))
    }
}

fn check_type_meta(def: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
    if let Some(api_version) = obj["apiVersion"]
        .as_str()
        .filter(|v| !v.is_empty() && *v != def.api_version())
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            def.api_version()
        )));
    }
    if let Some(kind) = obj["kind"]
        .as_str()
        .filter(|k| !k.is_empty() && *k != def.kind)
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            def.kind
        )));
    }
    Ok(())
}

fn validate_name(def: &ResourceDef, name: &str) -> Result<(), ApiError> {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        return Ok(());
    }
    Err(ApiError::invalid(
        def,
        name,
        &format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower \
             case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character \
             (e.g. 'example.com', regex used for validation is \
             '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        ),
    ))
}

// ---------------------------------------------------------------------------------------------
// Watch

struct WatchTask {
    id: u64,
    filter: Filter,
    shape: Shape,
    bookmark_kind: String,
    bookmark_api_version: String,
    initial: Vec<Bytes>,
    events: Option<mpsc::UnboundedReceiver<WatchMsg>>,
    start_rv: u64,
    body: mpsc::Sender<io::Result<Bytes>>,
    deadline: Option<Instant>,
    bookmarks: bool,
    interval: Duration,
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({ "type": kind, "object": object })).expect("JSON serializes");
    line.push(b'\n');
    Bytes::from(line)
}

fn start_watch(
    shared: &Arc<Shared>,
    st: &mut State,
    target: &Target,
    ctx: &Ctx,
) -> Result<Response<RespBody>, ApiError> {
    let def = &target.def;
    let mut filter = Filter::from_query(target, &ctx.query)?;
    if let Some(name) = &target.name {
        filter
            .fields
            .push(FieldReq::Eq("metadata.name".into(), name.clone()));
    }
    let shape = ctx.shape();
    let bookmarks = ctx.query.flag("allowWatchBookmarks");
    let send_initial = match ctx.query.get("sendInitialEvents") {
        Some("true" | "1") => Some(true),
        Some("false" | "0") => Some(false),
        _ => None,
    };
    if send_initial == Some(true) && !bookmarks {
        return Err(ApiError::new(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: allowWatchBookmarks: Required value: allowWatchBookmarks must be set to true when sendInitialEvents is set".into(),
        ));
    }
    let timeout = ctx
        .query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0);
    let requested = ctx.query.get("resourceVersion").filter(|v| !v.is_empty());
    let (bookmark_kind, bookmark_api_version) = match shape {
        Shape::Full => (def.kind.clone(), def.api_version()),
        Shape::Meta => (
            "PartialObjectMetadata".to_string(),
            "meta.k8s.io/v1".to_string(),
        ),
    };
    let gvr = def.gvr();
    let mut initial = Vec::new();
    let mut end = false;
    let start_rv;
    let synthetic = send_initial == Some(true)
        || (send_initial.is_none() && matches!(requested, None | Some("0")));
    if synthetic {
        start_rv = st.rv;
        for obj in st.objects.get(&gvr).into_iter().flat_map(BTreeMap::values) {
            if filter.matches(obj) {
                initial.push(event_line("ADDED", &shape.apply(obj)));
            }
        }
        if send_initial == Some(true) {
            initial.push(event_line(
                "BOOKMARK",
                &json!({
                    "kind": bookmark_kind,
                    "apiVersion": bookmark_api_version,
                    "metadata": {
                        "resourceVersion": st.rv.to_string(),
                        "annotations": { "k8s.io/initial-events-end": "true" }
                    }
                }),
            ));
        }
    } else if matches!(requested, None | Some("0")) {
        start_rv = st.rv;
    } else {
        let v = requested.unwrap_or_default();
        let n: u64 = v
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {v:?}")))?;
        start_rv = n;
        if n < st.history_start {
            let status = ApiError::expired(format!(
                "too old resource version: {n} ({})",
                st.history_start + 1
            ))
            .status();
            initial.push(event_line("ERROR", &status));
            end = true;
        } else {
            for change in st.history.iter().filter(|c| c.rv > n && c.gvr == gvr) {
                if let Some((kind, object)) = filter.render(change) {
                    initial.push(event_line(kind, &shape.apply(&object)));
                }
            }
        }
    }
    let (body_tx, body_rx) = mpsc::channel(64);
    let id = st.next_watcher;
    st.next_watcher += 1;
    let events = if end {
        None
    } else {
        let (tx, rx) = mpsc::unbounded_channel();
        st.watchers.insert(
            id,
            Watcher {
                gvr,
                plural: def.plural.clone(),
                tx,
            },
        );
        Some(rx)
    };
    let task = WatchTask {
        id,
        filter,
        shape,
        bookmark_kind,
        bookmark_api_version,
        initial,
        events,
        start_rv,
        body: body_tx,
        deadline: timeout.map(|t| Instant::now() + Duration::from_secs(t)),
        bookmarks,
        interval: shared.bookmark_interval,
    };
    tokio::spawn(run_watch(shared.clone(), task));
    Ok(Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(RespBody::Stream(body_rx))
        .expect("response"))
}

async fn run_watch(shared: Arc<Shared>, task: WatchTask) {
    let WatchTask {
        id,
        filter,
        shape,
        bookmark_kind,
        bookmark_api_version,
        initial,
        events,
        start_rv,
        body,
        deadline,
        bookmarks,
        interval,
    } = task;
    stream_watch(
        &shared,
        WatchStream {
            filter,
            shape,
            bookmark_kind,
            bookmark_api_version,
            initial,
            events,
            start_rv,
            body,
            deadline,
            bookmarks,
            interval,
        },
    )
    .await;
    shared.lock().watchers.remove(&id);
}

struct WatchStream {
    filter: Filter,
    shape: Shape,
    bookmark_kind: String,
    bookmark_api_version: String,
    initial: Vec<Bytes>,
    events: Option<mpsc::UnboundedReceiver<WatchMsg>>,
    start_rv: u64,
    body: mpsc::Sender<io::Result<Bytes>>,
    deadline: Option<Instant>,
    bookmarks: bool,
    interval: Duration,
}

async fn stream_watch(shared: &Shared, w: WatchStream) {
    for line in w.initial {
        if w.body.send(Ok(line)).await.is_err() {
            return;
        }
    }
    let Some(mut events) = w.events else {
        return; // the ERROR event ends the stream cleanly
    };
    let mut ticks = tokio::time::interval_at(Instant::now() + w.interval, w.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = w.deadline;
    let expiry = async move {
        match deadline {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::pin!(expiry);
    loop {
        let mut messages = Vec::new();
        let mut bookmark = None;
        tokio::select! {
            biased;
            () = w.body.closed() => return,
            message = events.recv() => messages.push(message.unwrap_or(WatchMsg::Drop)),
            () = &mut expiry => return,
            _ = ticks.tick(), if w.bookmarks => {
                // Every change up to the current rv is in `events` once the lock is held, so a
                // bookmark never claims a change this watcher has not been sent.
                let st = shared.lock();
                bookmark = Some(st.rv.max(w.start_rv));
                while let Ok(message) = events.try_recv() {
                    messages.push(message);
                }
            }
        }
        for message in messages {
            match message {
                WatchMsg::Change(change) => {
                    if change.rv <= w.start_rv {
                        continue;
                    }
                    if let Some((kind, object)) = w.filter.render(&change) {
                        let line = event_line(kind, &w.shape.apply(&object));
                        if w.body.send(Ok(line)).await.is_err() {
                            return;
                        }
                    }
                }
                WatchMsg::Drop => {
                    let _ = w
                        .body
                        .send(Err(io::Error::new(
                            io::ErrorKind::ConnectionAborted,
                            "watch dropped by the test",
                        )))
                        .await;
                    return;
                }
            }
        }
        if let Some(rv) = bookmark {
            let object = json!({
                "kind": w.bookmark_kind,
                "apiVersion": w.bookmark_api_version,
                "metadata": { "resourceVersion": rv.to_string() }
            });
            if w.body
                .send(Ok(event_line("BOOKMARK", &object)))
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Selectors

#[derive(Clone, Debug, PartialEq, Eq)]
enum LabelReq {
    Exists(String),
    NotExists(String),
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Gt(String, i64),
    Lt(String, i64),
}

impl LabelReq {
    fn matches(&self, labels: &Map<String, Value>) -> bool {
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        match self {
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            LabelReq::Gt(k, n) => get(k)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l > *n),
            LabelReq::Lt(k, n) => get(k)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l < *n),
        }
    }
}

fn parse_label_selector(selector: &str) -> Result<Vec<LabelReq>, String> {
    let selector = selector.trim();
    if selector.is_empty() {
        return Ok(Vec::new());
    }
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, ch) in selector.char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&selector[start..]);
    parts.into_iter().map(parse_label_requirement).collect()
}

fn label_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    let ok = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!("invalid label key {key:?}"))
    }
}

fn label_value(value: &str) -> Result<String, String> {
    let value = value.trim();
    let ok = value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(value.to_string())
    } else {
        Err(format!("invalid label value {value:?}"))
    }
}

fn parse_label_requirement(part: &str) -> Result<LabelReq, String> {
    let part = part.trim();
    if part.is_empty() {
        return Err("found '', expected: !, identifier, or 'end of string'".into());
    }
    if let Some(key) = part.strip_prefix('!') {
        return Ok(LabelReq::NotExists(label_key(key)?));
    }
    if let Some(open) = part.find('(') {
        let close = part
            .rfind(')')
            .filter(|c| *c > open && part[c + 1..].trim().is_empty())
            .ok_or_else(|| format!("unbalanced parentheses in {part:?}"))?;
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        let [key, op] = head.as_slice() else {
            return Err(format!("unable to parse requirement {part:?}"));
        };
        let values = part[open + 1..close]
            .split(',')
            .map(label_value)
            .collect::<Result<Vec<_>, _>>()?;
        let key = label_key(key)?;
        return match *op {
            "in" => Ok(LabelReq::In(key, values)),
            "notin" => Ok(LabelReq::NotIn(key, values)),
            other => Err(format!("unknown set operator {other:?}")),
        };
    }
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(LabelReq::NotEq(label_key(k)?, label_value(v)?));
    }
    if let Some((k, v)) = part.split_once("==") {
        return Ok(LabelReq::Eq(label_key(k)?, label_value(v)?));
    }
    if let Some((k, v)) = part.split_once('=') {
        return Ok(LabelReq::Eq(label_key(k)?, label_value(v)?));
    }
    for (op, gt) in [('>', true), ('<', false)] {
        if let Some((k, v)) = part.split_once(op) {
            let n: i64 = v.trim().parse().map_err(|_| {
                format!("for 'Gt', 'Lt' operators, the value must be an integer: {v:?}")
            })?;
            let key = label_key(k)?;
            return Ok(if gt {
                LabelReq::Gt(key, n)
            } else {
                LabelReq::Lt(key, n)
            });
        }
    }
    Ok(LabelReq::Exists(label_key(part)?))
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum FieldReq {
    Eq(String, String),
    NotEq(String, String),
}

fn supported_field(def: &ResourceDef, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    match (def.group.as_str(), def.kind.as_str()) {
        ("", "Secret") => field == "type",
        ("", "Namespace") => field == "status.phase",
        ("", "Pod") => matches!(
            field,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        ("" | "events.k8s.io", "Event") => {
            field.starts_with("involvedObject.")
                || field.starts_with("regarding.")
                || matches!(
                    field,
                    "reason" | "reportingComponent" | "reportingController" | "source" | "type"
                )
        }
        _ => false,
    }
}

fn parse_field_selector(def: &ResourceDef, selector: &str) -> Result<Vec<FieldReq>, String> {
    let selector = selector.trim();
    if selector.is_empty() {
        return Ok(Vec::new());
    }
    selector
        .split(',')
        .map(|part| {
            let part = part.trim();
            let (req, field) = if let Some((k, v)) = part.split_once("!=") {
                (FieldReq::NotEq(k.trim().into(), v.trim().into()), k.trim())
            } else if let Some((k, v)) = part.split_once("==") {
                (FieldReq::Eq(k.trim().into(), v.trim().into()), k.trim())
            } else if let Some((k, v)) = part.split_once('=') {
                (FieldReq::Eq(k.trim().into(), v.trim().into()), k.trim())
            } else {
                return Err(format!(
                    "invalid selector: '{selector}'; can't understand '{part}'"
                ));
            };
            if supported_field(def, field) {
                Ok(req)
            } else {
                Err(format!("field label not supported: {field}"))
            }
        })
        .collect()
}

fn field_value(obj: &Value, field: &str) -> String {
    // events.k8s.io Events are selected with the core Event field names.
    let field = field.strip_prefix("involvedObject.").map_or_else(
        || field.to_string(),
        |rest| {
            if obj.get("regarding").is_some() {
                format!("regarding.{rest}")
            } else {
                format!("involvedObject.{rest}")
            }
        },
    );
    let mut current = obj;
    for segment in field.split('.') {
        current = &current[segment];
    }
    match current {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// What a list or watch selects: namespace, label and field selectors.
#[derive(Clone, Debug)]
struct Filter {
    ns: Option<String>,
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

impl Filter {
    fn from_query(target: &Target, query: &Query) -> Result<Self, ApiError> {
        let labels = parse_label_selector(query.get("labelSelector").unwrap_or_default())
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
        let fields =
            parse_field_selector(&target.def, query.get("fieldSelector").unwrap_or_default())
                .map_err(ApiError::bad_request)?;
        Ok(Self {
            ns: target.ns.clone(),
            labels,
            fields,
        })
    }

    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    fn matches(&self, obj: &Value) -> bool {
        let namespace = obj["metadata"]["namespace"].as_str().unwrap_or_default();
        if self.ns.as_deref().is_some_and(|ns| ns != namespace) {
            return false;
        }
        let empty = Map::new();
        let labels = obj["metadata"]["labels"].as_object().unwrap_or(&empty);
        self.labels.iter().all(|req| req.matches(labels))
            && self.fields.iter().all(|req| match req {
                FieldReq::Eq(k, v) => field_value(obj, k) == *v,
                FieldReq::NotEq(k, v) => field_value(obj, k) != *v,
            })
    }

    /// The watch event a change shows as to this filter, if any: an object that starts matching
    /// is ADDED, one that stops matching is DELETED (its previous state, with the change's rv).
    fn render(&self, change: &Change) -> Option<(&'static str, Value)> {
        let now = self.matches(&change.object);
        match change.kind {
            ChangeType::Added => now.then(|| ("ADDED", change.object.clone())),
            ChangeType::Deleted => now.then(|| ("DELETED", change.object.clone())),
            ChangeType::Modified => {
                let before = change.prev.as_ref().is_some_and(|p| self.matches(p));
                match (before, now) {
                    (true, true) => Some(("MODIFIED", change.object.clone())),
                    (false, true) => Some(("ADDED", change.object.clone())),
                    (true, false) => {
                        let mut prev = change.prev.clone().unwrap_or(Value::Null);
                        set_resource_version(&mut prev, change.rv);
                        Some(("DELETED", prev))
                    }
                    (false, false) => None,
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Patches

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// RFC 6902 JSON patch.
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops.as_array().ok_or("a JSON patch must be an array")?;
    for op in ops {
        let name = op["op"].as_str().ok_or("missing op")?;
        let path = parse_pointer(op["path"].as_str().ok_or("missing path")?)?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| "missing value".to_string())
        };
        let from = || {
            op["from"]
                .as_str()
                .ok_or_else(|| "missing from".to_string())
                .and_then(parse_pointer)
        };
        match name {
            "add" => pointer_add(doc, &path, value()?)?,
            "remove" => {
                pointer_remove(doc, &path)?;
            }
            "replace" => {
                pointer_get(doc, &path)?;
                pointer_set(doc, &path, value()?)?;
            }
            "move" => {
                let moved = pointer_remove(doc, &from()?)?;
                pointer_add(doc, &path, moved)?;
            }
            "copy" => {
                let copied = pointer_get(doc, &from()?)?.clone();
                pointer_add(doc, &path, copied)?;
            }
            "test" => {
                if *pointer_get(doc, &path)? != value()? {
                    return Err(format!("test operation failed at {}", op["path"]));
                }
            }
            other => return Err(format!("unknown op {other:?}")),
        }
    }
    Ok(())
}

fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| format!("invalid JSON pointer {pointer:?}"))?;
    Ok(rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn pointer_get<'a>(doc: &'a Value, path: &[String]) -> Result<&'a Value, String> {
    let mut current = doc;
    for segment in path {
        current = match current {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        }
        .ok_or_else(|| format!("path not found: /{}", path.join("/")))?;
    }
    Ok(current)
}

fn pointer_parent<'a>(
    doc: &'a mut Value,
    path: &[String],
) -> Result<(&'a mut Value, String), String> {
    let (last, parents) = path.split_last().ok_or("the root has no parent")?;
    let mut current = doc;
    for segment in parents {
        current = match current {
            Value::Object(map) => map.get_mut(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| format!("path not found: /{}", path.join("/")))?;
    }
    Ok((current, last.clone()))
}

fn pointer_add(doc: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = pointer_parent(doc, path)?;
    match parent {
        Value::Object(map) => {
            map.insert(last, value);
            Ok(())
        }
        Value::Array(items) if last == "-" => {
            items.push(value);
            Ok(())
        }
        Value::Array(items) => match last.parse::<usize>() {
            Ok(i) if i <= items.len() => {
                items.insert(i, value);
                Ok(())
            }
            _ => Err(format!("invalid array index {last:?}")),
        },
        _ => Err(format!("cannot add under a scalar at /{}", path.join("/"))),
    }
}

fn pointer_set(doc: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = pointer_parent(doc, path)?;
    let slot = match parent {
        Value::Object(map) => map.get_mut(&last),
        Value::Array(items) => last.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
        _ => None,
    }
    .ok_or_else(|| format!("path not found: /{}", path.join("/")))?;
    *slot = value;
    Ok(())
}

fn pointer_remove(doc: &mut Value, path: &[String]) -> Result<Value, String> {
    let (parent, last) = pointer_parent(doc, path)?;
    match parent {
        Value::Object(map) => map.remove(&last),
        Value::Array(items) => match last.parse::<usize>() {
            Ok(i) if i < items.len() => Some(items.remove(i)),
            _ => None,
        },
        _ => None,
    }
    .ok_or_else(|| format!("path not found: /{}", path.join("/")))
}

// ---------------------------------------------------------------------------------------------
// Discovery

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

impl State {
    /// The non-core groups, each with its versions, in the order resources were declared.
    fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for def in self.resources.iter().filter(|d| !d.group.is_empty()) {
            match groups.iter_mut().find(|(g, _)| *g == def.group) {
                Some((_, versions)) => {
                    if !versions.contains(&def.version) {
                        versions.push(def.version.clone());
                    }
                }
                None => groups.push((def.group.clone(), vec![def.version.clone()])),
            }
        }
        groups
    }

    fn api_group(&self, group: &str) -> Option<Value> {
        let (name, versions) = self.groups().into_iter().find(|(g, _)| g == group)?;
        let versions: Vec<Value> = versions
            .iter()
            .map(|v| json!({ "groupVersion": format!("{name}/{v}"), "version": v }))
            .collect();
        Some(json!({
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": name,
            "versions": versions,
            "preferredVersion": versions[0],
        }))
    }

    fn api_group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .iter()
            .filter_map(|(g, _)| {
                let mut group = self.api_group(g)?;
                let map = group.as_object_mut()?;
                map.remove("kind");
                map.remove("apiVersion");
                Some(group)
            })
            .collect();
        json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
    }

    fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let defs: Vec<&ResourceDef> = self
            .resources
            .iter()
            .filter(|d| d.group == group && d.version == version)
            .collect();
        if defs.is_empty() {
            return None;
        }
        let mut resources = Vec::new();
        for def in defs {
            let mut resource = json!({
                "name": def.plural,
                "singularName": def.singular,
                "namespaced": def.namespaced,
                "kind": def.kind,
                "verbs": VERBS,
            });
            if !def.short_names.is_empty() {
                resource["shortNames"] = json!(def.short_names);
            }
            resources.push(resource);
            if def.status_subresource {
                resources.push(json!({
                    "name": format!("{}/status", def.plural),
                    "singularName": "",
                    "namespaced": def.namespaced,
                    "kind": def.kind,
                    "verbs": STATUS_VERBS,
                }));
            }
        }
        let group_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }))
    }

    fn aggregated_discovery(&self, core: bool) -> Value {
        let groups: Vec<(String, Vec<String>)> = if core {
            vec![(String::new(), vec!["v1".to_string()])]
        } else {
            self.groups()
        };
        let items: Vec<Value> = groups
            .iter()
            .map(|(group, versions)| {
                let versions: Vec<Value> = versions
                    .iter()
                    .map(|version| {
                        let resources: Vec<Value> = self
                            .resources
                            .iter()
                            .filter(|d| d.group == *group && d.version == *version)
                            .map(|d| {
                                let kind = json!({ "group": d.group, "version": d.version, "kind": d.kind });
                                let subresources: Vec<Value> = if d.status_subresource {
                                    vec![json!({
                                        "subresource": "status",
                                        "responseKind": kind,
                                        "verbs": STATUS_VERBS,
                                    })]
                                } else {
                                    Vec::new()
                                };
                                json!({
                                    "resource": d.plural,
                                    "responseKind": kind,
                                    "scope": if d.namespaced { "Namespaced" } else { "Cluster" },
                                    "singularResource": d.singular,
                                    "verbs": VERBS,
                                    "shortNames": d.short_names,
                                    "subresources": subresources,
                                })
                            })
                            .collect();
                        json!({ "version": version, "resources": resources, "freshness": "Current" })
                    })
                    .collect();
                let metadata = if group.is_empty() {
                    json!({})
                } else {
                    json!({ "name": group })
                };
                json!({ "metadata": metadata, "versions": versions })
            })
            .collect();
        json!({
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Time

/// The current UTC time as RFC 3339 with second precision, as Kubernetes writes timestamps.
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}
