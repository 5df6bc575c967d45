//! The test API server of `tests/support/apiserver.rs`, proved with the real kube-rs client: a
//! kubeconfig file, typed and dynamic `Api`s, the runtime `watcher`, discovery and the event
//! recorder, against every fault the server can inject.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/apiserver.rs"]
mod apiserver;

use std::fmt::Display;
use std::time::Duration;

use apiserver::{ApiServer, write_kubeconfig};
use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, events};
use kube::{Client, Discovery, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

const WAIT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Helpers

/// A kube client built exactly as the controller builds one: from a kubeconfig file on disk.
async fn kube_client(server_url: &str, token: Option<&str>) -> Client {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    write_kubeconfig(&path, server_url, token);
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    Client::try_from(config).unwrap()
}

async fn client(server: &ApiServer) -> Client {
    kube_client(&server.url(), None).await
}

fn ingress_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("networking.k8s.io", "v1", "Ingress"),
        "ingresses",
    )
}

fn ingresses(client: Client) -> Api<DynamicObject> {
    Api::namespaced_with(client, "default", &ingress_resource())
}

fn ingress(name: &str, labels: Value) -> Value {
    let mut ingress = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "rules": [{
                "host": format!("{name}.example.com"),
                "http": { "paths": [{
                    "path": "/",
                    "pathType": "Prefix",
                    "backend": { "service": { "name": name, "port": { "number": 80 } } }
                }]}
            }]
        }
    });
    ingress["metadata"]["labels"] = labels;
    ingress
}

fn config_map(name: &str, labels: Value) -> Value {
    let mut config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": "default" },
        "data": { "k": name }
    });
    config_map["metadata"]["labels"] = labels;
    config_map
}

fn api_error(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A watcher polled continuously in the background, its events (and errors) rendered as
/// strings ("Init", "InitApply(a)", "InitDone", "Apply(a)", "Delete(a)", "Err: ...").
struct Watch {
    rx: mpsc::UnboundedReceiver<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watch {
    fn spawn<S, E, T>(stream: S) -> Self
    where
        S: Stream<Item = Result<watcher::Event<T>, E>> + Send + 'static,
        E: Display,
        T: ResourceExt,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let line = match item {
                    Ok(event) => event.to_string(),
                    Err(e) => format!("Err: {e}"),
                };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { rx, task }
    }

    /// The next event that is not an error.
    async fn next(&mut self) -> String {
        loop {
            let line = timeout(WAIT, self.rx.recv())
                .await
                .expect("a watcher event within 5 s")
                .expect("watcher running");
            if !line.starts_with("Err") {
                return line;
            }
        }
    }

    /// The next event, errors included.
    async fn next_raw(&mut self) -> String {
        timeout(WAIT, self.rx.recv())
            .await
            .expect("a watcher event within 5 s")
            .expect("watcher running")
    }

    async fn expect(&mut self, expected: &[&str]) {
        for want in expected {
            assert_eq!(self.next().await, *want);
        }
    }

    /// Asserts nothing but errors arrives for `window`.
    async fn quiet_for(&mut self, window: Duration) {
        let deadline = Instant::now() + window;
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            assert!(line.starts_with("Err"), "unexpected event {line}");
        }
    }
}

async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Discovery

#[tokio::test]
async fn version_discovery_and_health() {
    let server = ApiServer::start().await;
    let client = client(&server).await;

    let info = client.apiserver_version().await.unwrap();
    assert_eq!(info.git_version, "v1.33.0");
    assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "33"));

    let health = client.request_text(http_get("/healthz")).await.unwrap();
    assert_eq!(health, "ok");

    for discovery in [
        Discovery::new(client.clone()).run().await.unwrap(),
        Discovery::new(client.clone())
            .run_aggregated()
            .await
            .unwrap(),
    ] {
        for (group, kind) in [
            ("", "Service"),
            ("", "Secret"),
            ("", "ConfigMap"),
            ("", "Pod"),
            ("", "Event"),
            ("networking.k8s.io", "Ingress"),
            ("networking.k8s.io", "IngressClass"),
            ("discovery.k8s.io", "EndpointSlice"),
            ("coordination.k8s.io", "Lease"),
            ("events.k8s.io", "Event"),
            ("ingress.v3.haproxy.org", "TCP"),
        ] {
            let version = if group == "ingress.v3.haproxy.org" {
                "v3"
            } else {
                "v1"
            };
            let (resource, caps) = discovery
                .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
                .unwrap_or_else(|| panic!("{group}/{kind} discovered"));
            assert!(!resource.plural.is_empty());
            let cluster_scoped = kind == "IngressClass";
            assert_eq!(
                caps.scope == kube::discovery::Scope::Cluster,
                cluster_scoped,
                "{kind}"
            );
        }
    }

    let without = ApiServer::builder().without_tcp_crd().start().await;
    let client = self::client(&without).await;
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group("networking.k8s.io"));
    assert!(!discovery.has_group("ingress.v3.haproxy.org"));
    let tcp = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("ingress.v3.haproxy.org", "v3", "TCP"),
        "tcps",
    );
    let tcps: Api<DynamicObject> = Api::all_with(client, &tcp);
    let err = tcps.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_error(err), (404, "NotFound".into()));
}

fn http_get(path: &str) -> hyper::Request<Vec<u8>> {
    hyper::Request::get(path).body(Vec::new()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// CRUD

#[tokio::test]
async fn crud_with_kubernetes_status_errors() {
    let server = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&server).await, "default");
    let cm: ConfigMap = serde_json::from_value(config_map("a", json!({"app": "x"}))).unwrap();

    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let rv = created.resource_version().unwrap();
    assert!(rv.parse::<u64>().is_ok());
    assert!(created.uid().is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));

    let err = cms.create(&PostParams::default(), &cm).await.unwrap_err();
    assert_eq!(api_error(err), (409, "AlreadyExists".into()));
    let err = cms.get("missing").await.unwrap_err();
    assert_eq!(api_error(err), (404, "NotFound".into()));
    assert!(cms.get_opt("missing").await.unwrap().is_none());

    // Replace: stale resourceVersion conflicts, the current one succeeds.
    let mut changed = created.clone();
    changed.data = Some([("k".to_string(), "v2".to_string())].into());
    let replaced = cms
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_ne!(replaced.resource_version(), created.resource_version());
    assert_eq!(replaced.uid(), created.uid());
    let err = cms
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (409, "Conflict".into()));
    let err = cms
        .replace("b", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert_eq!(api_error(err).0, 404);

    // Merge and JSON patches.
    let patched = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": null, "tier": "web"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.labels().get("tier").map(String::as_str),
        Some("web")
    );
    assert!(!patched.labels().contains_key("app"));
    let err = cms
        .patch("missing", &PatchParams::default(), &Patch::Merge(json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_error(err).0, 404);

    // An unchanged write is not a write.
    let same = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v2"}})),
        )
        .await
        .unwrap();
    assert_eq!(same.resource_version(), patched.resource_version());

    // The server-side store agrees, and the test can read it.
    let stored = server.get("v1", "ConfigMap", "default", "a").unwrap();
    assert_eq!(stored["data"]["k"], "v2");
    assert_eq!(
        stored["metadata"]["resourceVersion"],
        json!(patched.resource_version().unwrap())
    );

    let deleted = cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(deleted.is_right(), "a Success Status");
    let err = cms.delete("a", &DeleteParams::default()).await.unwrap_err();
    assert_eq!(api_error(err), (404, "NotFound".into()));
    assert!(server.get("v1", "ConfigMap", "default", "a").is_none());

    let log: Vec<(String, String)> = server
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(
        log[0],
        (
            "POST".to_string(),
            "/api/v1/namespaces/default/configmaps".to_string()
        )
    );
    assert!(log.iter().all(|(m, _)| m != "GET"));
}

#[tokio::test]
async fn server_side_apply_creates_then_merges() {
    let server = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&server).await, "default");
    let pp = PatchParams::apply("portcullis");
    let first = cms
        .patch("s", &pp, &Patch::Apply(config_map("s", json!({"a": "1"}))))
        .await
        .unwrap();
    assert_eq!(first.data.unwrap()["k"], "s");
    let second = cms
        .patch("s", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s", "labels": {"b": "2"}}})))
        .await
        .unwrap();
    assert_eq!(second.labels().len(), 2);
    let request = server.requests().pop().unwrap();
    assert_eq!(
        request.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert!(request.query.contains("fieldManager=portcullis"));
}

#[tokio::test]
async fn status_subresource_changes_only_status() {
    let server = ApiServer::start().await;
    let api = ingresses(client(&server).await);
    server.apply(ingress("web", json!({})));

    let patched = api
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "spec": { "ingressClassName": "ignored" },
                "metadata": { "labels": { "ignored": "yes" } },
                "status": { "loadBalancer": { "ingress": [{ "ip": "192.0.2.1" }] } }
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.data["status"]["loadBalancer"]["ingress"][0]["ip"],
        "192.0.2.1"
    );
    assert!(patched.data["spec"]["ingressClassName"].is_null());
    assert!(patched.labels().is_empty());
    assert_eq!(patched.metadata.generation, Some(1));

    // The main resource ignores status but bumps generation on a spec change.
    let patched = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "spec": { "ingressClassName": "haproxy" },
                "status": { "loadBalancer": { "ingress": [{ "ip": "198.51.100.1" }] } }
            })),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["spec"]["ingressClassName"], "haproxy");
    assert_eq!(
        patched.data["status"]["loadBalancer"]["ingress"][0]["ip"],
        "192.0.2.1"
    );
    assert_eq!(patched.metadata.generation, Some(2));

    // A status PUT with a stale resourceVersion conflicts.
    let mut stale = patched.clone();
    stale.metadata.resource_version = Some("1".into());
    let err = api
        .replace_status("web", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (409, "Conflict".into()));

    let status_patches = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/ingresses/web/status"))
        .count();
    assert_eq!(status_patches, 1);
}

#[tokio::test]
async fn lease_replace_uses_optimistic_concurrency() {
    let server = ApiServer::start().await;
    let leases: Api<Lease> = Api::namespaced(client(&server).await, "default");
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": "portcullis-leader" },
        "spec": { "holderIdentity": "a", "leaseDurationSeconds": 15 }
    }))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();

    let mut mine = created.clone();
    mine.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let renewed = leases
        .replace("portcullis-leader", &PostParams::default(), &mine)
        .await
        .unwrap();
    assert_eq!(renewed.spec.unwrap().holder_identity.as_deref(), Some("b"));

    // Another candidate still holding the old resourceVersion loses.
    let mut theirs = created;
    theirs.spec.as_mut().unwrap().holder_identity = Some("c".into());
    let err = leases
        .replace("portcullis-leader", &PostParams::default(), &theirs)
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (409, "Conflict".into()));
    let stored = server
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            "default",
            "portcullis-leader",
        )
        .unwrap();
    assert_eq!(stored["spec"]["holderIdentity"], "b");
}

#[tokio::test]
async fn event_recorder_creates_then_patches_a_series() {
    let server = ApiServer::start().await;
    let client = client(&server).await;
    let recorder = events::Recorder::new(client, "portcullis".into());
    let reference = ObjectReference {
        api_version: Some("networking.k8s.io/v1".into()),
        kind: Some("Ingress".into()),
        name: Some("web".into()),
        namespace: Some("default".into()),
        ..ObjectReference::default()
    };
    let event = events::Event {
        type_: events::EventType::Warning,
        reason: "BadConfig".into(),
        note: Some("no backend".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let stored = server.list("events.k8s.io/v1", "Event", Some("default"));
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["reason"], "BadConfig");
    assert_eq!(stored[0]["series"]["count"], 2);
    let methods: Vec<String> = server.requests().into_iter().map(|r| r.method).collect();
    assert_eq!(methods, ["POST", "PATCH"]);
}

// ---------------------------------------------------------------------------------------------
// Lists

#[tokio::test]
async fn label_and_field_selectors() {
    let server = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&server).await, "default");
    server.apply(config_map("a", json!({"app": "a", "tier": "web"})));
    server.apply(config_map("b", json!({"app": "b"})));
    server.apply(config_map("c", json!({})));
    let mut other = config_map("d", json!({"app": "a"}));
    other["metadata"]["namespace"] = json!("other");
    server.apply(other);

    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items.iter().map(ResourceExt::name_any).collect()
    };
    for (selector, want) in [
        ("app=a", vec!["a"]),
        ("app==a", vec!["a"]),
        ("app!=a", vec!["b", "c"]),
        ("app", vec!["a", "b"]),
        ("!app", vec!["c"]),
        ("app in (a,b)", vec!["a", "b"]),
        ("app notin (a)", vec!["b", "c"]),
        ("app,tier=web", vec!["a"]),
        ("app in (a, b),!tier", vec!["b"]),
    ] {
        let list = cms
            .list(&ListParams::default().labels(selector))
            .await
            .unwrap();
        assert_eq!(names(list), want, "{selector}");
    }
    for (selector, want) in [
        ("metadata.name=b", vec!["b"]),
        ("metadata.name!=b", vec!["a", "c"]),
        ("metadata.namespace=default", vec!["a", "b", "c"]),
    ] {
        let list = cms
            .list(&ListParams::default().fields(selector))
            .await
            .unwrap();
        assert_eq!(names(list), want, "{selector}");
    }
    let err = cms
        .list(&ListParams::default().fields("data.k=a"))
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (400, "BadRequest".into()));

    let everywhere: Api<ConfigMap> = Api::all(cms.clone().into_client());
    assert_eq!(
        everywhere
            .list(&ListParams::default().labels("app=a"))
            .await
            .unwrap()
            .items
            .len(),
        2
    );

    let metadata = cms.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(metadata.items.len(), 3);
    assert_eq!(metadata.items[0].metadata.name.as_deref(), Some("a"));
}

#[tokio::test]
async fn pagination_is_a_consistent_snapshot_and_expires() {
    let server = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client(&server).await, "default");
    for name in ["a", "b", "c", "d", "e"] {
        server.apply(config_map(name, json!({})));
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut versions = Vec::new();
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().limit(2);
        if let Some(token) = &token {
            lp = lp.continue_token(token);
        }
        let page = cms.list(&lp).await.unwrap();
        pages += 1;
        if pages == 1 {
            assert_eq!(page.metadata.remaining_item_count, Some(3));
            // Changes after the first page do not show in the later ones.
            server.delete("v1", "ConfigMap", "default", "d");
            server.apply(config_map("bb", json!({})));
        }
        versions.push(page.metadata.resource_version.clone().unwrap());
        seen.extend(page.items.iter().map(ResourceExt::name_any));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);
    assert!(versions.windows(2).all(|w| w[0] == w[1]), "{versions:?}");

    // A continue token from before a compaction is gone.
    let first = cms.list(&ListParams::default().limit(2)).await.unwrap();
    server.apply(config_map("f", json!({})));
    server.compact();
    let err = cms
        .list(
            &ListParams::default()
                .limit(2)
                .continue_token(first.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(err), (410, "Expired".into()));
}

// ---------------------------------------------------------------------------------------------
// Watches

#[tokio::test]
async fn watcher_sees_the_initial_list_then_changes() {
    let server = ApiServer::start().await;
    server.apply(ingress("a", json!({})));
    let api = ingresses(client(&server).await);
    let mut watch = Watch::spawn(watcher(api, watcher::Config::default()));
    watch.expect(&["Init", "InitApply(a)", "InitDone"]).await;
    until("the watch is open", || {
        server.open_watches("ingresses") == 1
    })
    .await;

    let mut changed = ingress("a", json!({}));
    changed["spec"]["ingressClassName"] = json!("haproxy");
    server.apply(changed);
    watch.expect(&["Apply(a)"]).await;
    server.apply(ingress("b", json!({})));
    watch.expect(&["Apply(b)"]).await;
    server.delete("networking.k8s.io/v1", "Ingress", "default", "a");
    watch.expect(&["Delete(a)"]).await;
    assert_eq!(server.list_count("ingresses"), 1);
    assert_eq!(server.watch_count("ingresses"), 1);
}

#[tokio::test]
async fn watcher_resumes_a_dropped_watch_without_relisting() {
    let server = ApiServer::start().await;
    server.apply(ingress("a", json!({})));
    let api = ingresses(client(&server).await);
    let mut watch = Watch::spawn(watcher(api, watcher::Config::default()));
    watch.expect(&["Init", "InitApply(a)", "InitDone"]).await;
    until("the watch is open", || {
        server.open_watches("ingresses") == 1
    })
    .await;

    server.drop_watches();
    server.apply(ingress("b", json!({})));
    watch.expect(&["Apply(b)"]).await;
    until("the watch is reopened", || {
        server.watch_count("ingresses") == 2
    })
    .await;
    server.apply(ingress("c", json!({})));
    watch.expect(&["Apply(c)"]).await;
    watch.quiet_for(Duration::from_millis(300)).await;
    assert_eq!(server.list_count("ingresses"), 1);
    // The resumed watch asked for the resourceVersion the first one had reached.
    let watches: Vec<String> = server
        .all_requests()
        .into_iter()
        .filter(|r| r.query.contains("watch=true"))
        .map(|r| r.query)
        .collect();
    assert_eq!(watches.len(), 2);
    assert!(
        watches
            .iter()
            .all(|q| q.contains("allowWatchBookmarks=true")),
        "{watches:?}"
    );
}

#[tokio::test]
async fn watcher_relists_after_compaction() {
    let server = ApiServer::start().await;
    server.apply(ingress("a", json!({})));
    let api = ingresses(client(&server).await);
    let mut watch = Watch::spawn(watcher(api, watcher::Config::default()));
    watch.expect(&["Init", "InitApply(a)", "InitDone"]).await;
    until("the watch is open", || {
        server.open_watches("ingresses") == 1
    })
    .await;

    // With no await in between, the watcher cannot see `b` before the history is gone.
    server.drop_watches();
    server.apply(ingress("b", json!({})));
    server.compact();
    let first = watch.next_raw().await;
    assert!(
        first.starts_with("Err") && first.contains("too old resource version"),
        "{first}"
    );
    watch
        .expect(&["Init", "InitApply(a)", "InitApply(b)", "InitDone"])
        .await;
    assert_eq!(server.list_count("ingresses"), 2);
    until("the watch is reopened", || {
        server.open_watches("ingresses") == 1
    })
    .await;
    server.apply(ingress("c", json!({})));
    watch.expect(&["Apply(c)"]).await;
}

#[tokio::test]
async fn raw_watch_gets_410_error_event_bookmarks_and_timeout() {
    let server = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await;
    let api = ingresses(client(&server).await);
    server.apply(ingress("a", json!({})));
    let old = server.resource_version().to_string();
    server.apply(ingress("b", json!({})));
    server.compact();

    let mut stream = api
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    match timeout(WAIT, stream.next()).await.unwrap() {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        timeout(WAIT, stream.next()).await.unwrap().is_none(),
        "the stream ends"
    );

    let now = server.resource_version().to_string();
    let started = Instant::now();
    let mut stream = api
        .watch(&WatchParams::default().timeout(1), &now)
        .await
        .unwrap()
        .boxed();
    let mut bookmarks = 0;
    while let Some(event) = timeout(WAIT, stream.next()).await.unwrap() {
        match event.unwrap() {
            WatchEvent::Bookmark(b) => {
                assert_eq!(b.metadata.resource_version, now);
                bookmarks += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let elapsed = started.elapsed();
    assert!(bookmarks >= 3, "{bookmarks} bookmarks");
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn label_selected_watch_deletes_objects_that_stop_matching() {
    let server = ApiServer::start().await;
    server.apply(ingress("a", json!({"shard": "1"})));
    server.apply(ingress("b", json!({"shard": "2"})));
    let api = ingresses(client(&server).await);
    let mut watch = Watch::spawn(watcher(api, watcher::Config::default().labels("shard=1")));
    watch.expect(&["Init", "InitApply(a)", "InitDone"]).await;
    until("the watch is open", || {
        server.open_watches("ingresses") == 1
    })
    .await;

    server.apply(ingress("a", json!({"shard": "2"})));
    watch.expect(&["Delete(a)"]).await;
    server.apply(ingress("b", json!({"shard": "1"})));
    watch.expect(&["Apply(b)"]).await;
    server.apply(ingress("c", json!({"shard": "3"})));
    watch.quiet_for(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn streaming_list_watcher() {
    let server = ApiServer::start().await;
    server.apply(ingress("a", json!({})));
    let api = ingresses(client(&server).await);
    let mut watch = Watch::spawn(watcher(api, watcher::Config::default().streaming_lists()));
    watch.expect(&["Init", "InitApply(a)", "InitDone"]).await;
    server.apply(ingress("b", json!({})));
    watch.expect(&["Apply(b)"]).await;
    assert_eq!(server.list_count("ingresses"), 0);
    assert!(
        server.all_requests()[0]
            .query
            .contains("sendInitialEvents=true")
    );
}

// ---------------------------------------------------------------------------------------------
// Faults

#[tokio::test]
async fn stop_refuses_connections_and_resume_reuses_the_port() {
    let server = ApiServer::start().await;
    server.apply(ingress("a", json!({})));
    let client = client(&server).await;
    let api = ingresses(client.clone());
    let mut watch =
        Watch::spawn(watcher(api.clone(), watcher::Config::default()).default_backoff());
    watch.expect(&["Init", "InitApply(a)", "InitDone"]).await;
    until("the watch is open", || {
        server.open_watches("ingresses") == 1
    })
    .await;

    server.stop().await;
    assert!(server.is_stopped());
    let refused = tokio::net::TcpStream::connect(server.addr())
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(client.apiserver_version().await.is_err());
    server.apply(ingress("b", json!({})));

    server.resume().await;
    let addr = server.addr();
    tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(
        client.apiserver_version().await.unwrap().git_version,
        "v1.33.0"
    );
    watch.expect(&["Apply(b)"]).await;

    // A second cycle right after aborting connections rebinds as well.
    server.refuse_connections(true).await;
    server.refuse_connections(false).await;
    api.get("a").await.unwrap();
}

#[tokio::test]
async fn token_is_required_when_configured() {
    let server = ApiServer::start().await;
    server.require_token(Some("s3cret"));
    let anonymous = kube_client(&server.url(), None).await;
    let err = anonymous.apiserver_version().await.unwrap_err();
    assert_eq!(api_error(err), (401, "Unauthorized".into()));
    let wrong = kube_client(&server.url(), Some("nope")).await;
    assert_eq!(
        api_error(wrong.apiserver_version().await.unwrap_err()).0,
        401
    );
    let good = kube_client(&server.url(), Some("s3cret")).await;
    good.apiserver_version().await.unwrap();
    assert_eq!(
        server.all_requests().last().unwrap().token.as_deref(),
        Some("s3cret")
    );
    server.require_token(None);
    anonymous.apiserver_version().await.unwrap();
}

#[tokio::test]
async fn injected_failures_forbidden_and_stalls() {
    let server = ApiServer::start().await;
    let client = client(&server).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    server.fail_requests(500, Some(1));
    assert_eq!(
        api_error(client.apiserver_version().await.unwrap_err()),
        (500, "InternalError".into())
    );
    client.apiserver_version().await.unwrap();

    // kube-rs retries 503 by itself: two failures are absorbed.
    server.fail_requests(503, Some(2));
    client.apiserver_version().await.unwrap();
    assert_eq!(
        server
            .all_requests()
            .iter()
            .filter(|r| r.status == 503)
            .count(),
        2
    );

    server.fail_requests(500, None);
    assert!(cms.list(&ListParams::default()).await.is_err());
    assert!(cms.list(&ListParams::default()).await.is_err());
    server.clear_failures();
    cms.list(&ListParams::default()).await.unwrap();

    server.forbid("configmaps");
    let err = cms.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_error(err), (403, "Forbidden".into()));
    server.allow("configmaps");
    server.forbid_verb("configmaps", "create");
    cms.list(&ListParams::default()).await.unwrap();
    let cm: ConfigMap = serde_json::from_value(config_map("x", json!({}))).unwrap();
    let err = cms.create(&PostParams::default(), &cm).await.unwrap_err();
    assert_eq!(api_error(err).0, 403);
    server.allow("configmaps");

    server.forbid("ingresses");
    let mut watch = Watch::spawn(watcher(
        ingresses(client.clone()),
        watcher::Config::default(),
    ));
    assert_eq!(watch.next_raw().await, "Init");
    let listed = watch.next_raw().await;
    assert!(
        listed.starts_with("Err") && listed.contains("forbidden"),
        "{listed}"
    );
    drop(watch);

    server.stall(Duration::from_millis(300));
    let started = Instant::now();
    client.apiserver_version().await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    server.stall(Duration::ZERO);
}

#[tokio::test]
async fn kubeconfig_for_a_closed_port_fails_cleanly() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = kube_client(&format!("http://127.0.0.1:{port}"), Some("t")).await;
    let result = timeout(WAIT, client.apiserver_version()).await.unwrap();
    assert!(result.is_err());
}
