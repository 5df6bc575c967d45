//! HAProxy's verdict on a rendered configuration, traced to the objects that produced the
//! lines it names: a real `haproxy -c` on a real rendering, with a defect planted in one
//! tenant's section (standing for whatever HAProxy refuses that Portcullis did not foresee).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::needless_pass_by_value)]

use portcullis::attribution::{Quarantine, culprits};
use portcullis::check::{CheckError, check_config};
use portcullis::objects::{Kind, Object, ObjectRef};
use portcullis::pipeline::Pipeline;
use portcullis::render::RenderedConfig;
use portcullis::store::Store;
use portcullis::translate::TranslateConfig;
use serde_json::json;

fn haproxy() -> String {
    std::env::var("HAPROXY_BIN").unwrap_or_else(|_| {
        if std::path::Path::new("/usr/sbin/haproxy").exists() {
            "/usr/sbin/haproxy".into()
        } else {
            "haproxy".into()
        }
    })
}

fn service(ns: &str, name: &str) -> Object {
    Object::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

fn ingress(
    ns: &str,
    name: &str,
    host: &str,
    service: &str,
    annotations: serde_json::Value,
) -> Object {
    Object::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"ingressClassName": "portcullis", "rules": [{"host": host, "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": service, "port": {"number": 80}}}}]}}]}
    }))
    .unwrap()
}

fn store() -> Store {
    Store::from_objects([
        Object::from_value(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "portcullis"}, "spec": {"controller": "portcullis.io/ingress"}}),
        )
        .unwrap(),
        service("victim", "web"),
        ingress("victim", "site", "victim.example", "web", json!({})),
        service("evil", "web"),
        ingress("evil", "plain", "plain.evil.example", "web", json!({})),
        ingress(
            "evil",
            "rewrite",
            "rewrite.evil.example",
            "web",
            json!({"haproxy.org/request-set-header": "X-Marker planted-value"}),
        ),
        // Its only values are words every other line may hold: never what ties a line to it.
        ingress(
            "evil",
            "switches",
            "switches.evil.example",
            "web",
            json!({"haproxy.org/forwarded-for": "true", "haproxy.org/pod-maxconn": "100"}),
        ),
    ])
}

/// `rendered` with `line` added after the first line that starts with `after`.
fn planted(rendered: &RenderedConfig, after: &str, line: &str) -> RenderedConfig {
    let cfg = rendered.haproxy_cfg();
    let mut out = String::new();
    let mut done = false;
    for l in cfg.lines() {
        out.push_str(l);
        out.push('\n');
        if !done && l.starts_with(after) {
            out.push_str(line);
            out.push('\n');
            done = true;
        }
    }
    assert!(done, "no line starts with {after:?}:\n{cfg}");
    let mut files: Vec<(String, String)> = rendered
        .files()
        .keys()
        .filter(|n| *n != "haproxy.cfg")
        .map(|n| (n.clone(), rendered.file(n).unwrap().into_owned()))
        .collect();
    files.push(("haproxy.cfg".into(), out));
    RenderedConfig::from_files(files.iter().map(|(n, c)| (n.as_str(), c.as_str())))
}

fn refusal(rendered: &RenderedConfig) -> Vec<String> {
    match check_config(&haproxy(), rendered) {
        Err(CheckError::Rejected { messages }) => messages,
        other => panic!("HAProxy should refuse the planted line, got {other:?}"),
    }
}

/// The objects HAProxy's refusal of `store`'s rendering, with `line` planted after the line
/// starting with `after`, leads to; and HAProxy's messages.
fn culprits_of_planted(store: &Store, after: &str, line: &str) -> (Vec<ObjectRef>, Vec<String>) {
    let pipeline = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    let output = pipeline.run(store).unwrap();
    check_config(&haproxy(), &output.rendered).expect("the rendering itself is valid");
    let bad = planted(&output.rendered, after, line);
    let messages = refusal(&bad);
    let found = culprits(&messages, &bad, &output.model, store)
        .into_iter()
        .map(|c| c.object)
        .collect();
    (found, messages)
}

fn refs(list: &[(Kind, &str, &str)]) -> Vec<ObjectRef> {
    list.iter()
        .map(|(k, ns, n)| ObjectRef {
            kind: *k,
            namespace: (*ns).into(),
            name: (*n).into(),
        })
        .collect()
}

#[test]
fn a_refused_backend_line_leads_to_its_namespace_objects_only() {
    let (found, messages) =
        culprits_of_planted(&store(), "backend evil_web_80", "  http-request frobnicate");
    // Nothing on the line is any object's own value: everything behind the backend.
    assert_eq!(
        found,
        refs(&[
            (Kind::Ingress, "evil", "plain"),
            (Kind::Ingress, "evil", "rewrite"),
            (Kind::Ingress, "evil", "switches"),
            (Kind::Service, "evil", "web"),
        ]),
        "{messages:?}"
    );
}

#[test]
fn a_refused_line_carrying_an_objects_own_value_leads_to_that_object() {
    let (found, messages) = culprits_of_planted(
        &store(),
        "backend evil_web_80",
        "  http-request frobnicate planted-value true 100",
    );
    assert_eq!(
        found,
        refs(&[(Kind::Ingress, "evil", "rewrite")]),
        "{messages:?}"
    );
}

#[test]
fn a_refused_global_line_leads_to_no_tenant() {
    let (found, messages) = culprits_of_planted(&store(), "global", "  frobnicate");
    assert!(found.is_empty(), "{messages:?}");
}

#[test]
fn left_out_objects_come_back_when_they_change() {
    let mut store = store();
    let pipeline = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    let output = pipeline.run(&store).unwrap();
    let bad = planted(
        &output.rendered,
        "backend evil_web_80",
        "  http-request frobnicate planted-value",
    );
    let messages = refusal(&bad);
    let found = culprits(&messages, &bad, &output.model, &store);
    let mut quarantine = Quarantine::default();
    for c in &found {
        assert!(quarantine.hold(c, &store));
        assert!(!quarantine.hold(c, &store), "held twice");
    }
    // Left out, with an error naming it; everyone else renders.
    let (diagnostics, excluded) = quarantine.exclude(&mut store);
    assert_eq!(excluded.len(), 1);
    assert!(
        diagnostics[0].to_string().contains("Ingress evil/rewrite"),
        "{diagnostics:?}"
    );
    let output = pipeline.run(&store).unwrap();
    let cfg = output.rendered.haproxy_cfg();
    assert!(!cfg.contains("planted-value"), "{cfg}");
    check_config(&haproxy(), &output.rendered).expect("valid without it");
    // The source gives it back unchanged: left out again.
    store.upsert(excluded[0].clone());
    assert_eq!(quarantine.exclude(&mut store).1.len(), 1);
    // Edited: it gets another chance.
    store.upsert(ingress(
        "evil",
        "rewrite",
        "rewrite.evil.example",
        "web",
        json!({"haproxy.org/request-set-header": "X-Marker fixed"}),
    ));
    assert!(quarantine.exclude(&mut store).1.is_empty());
    assert!(quarantine.is_empty());
}

/// A line of a site template part that HAProxy refuses is named with the site file and its
/// line, and still leads only to the objects of the backend it was printed in.
#[test]
fn a_refused_site_part_line_is_attributed_to_its_site_file() {
    let site = tempfile::tempdir().unwrap();
    let scripts = site.path().join("scripts");
    let part = site.path().join("templates/parts/site/backend/algo.j2");
    std::fs::create_dir_all(&scripts).unwrap();
    std::fs::create_dir_all(part.parent().unwrap()).unwrap();
    // The script passes on a word HAProxy 2.6 has no algorithm of, for evil's Service only.
    std::fs::write(
        scripts.join("algo.rhai"),
        "// Scope: backend\n// Risk: low\nfn backend(ctx) {\n    if ctx.namespace == \"evil\" {\n        #{ site: #{ algo: \"brotli\" } }\n    }\n}\n",
    )
    .unwrap();
    std::fs::write(
        &part,
        "{% if site.algo is defined %}\n  compression algo {{ site.algo }}\n{% endif %}\n",
    )
    .unwrap();
    let store = store();
    let pipeline = portcullis::source::site::load_pipeline(
        Some(&scripts),
        Some(&site.path().join("templates")),
        TranslateConfig::default(),
    )
    .unwrap();
    let output = pipeline.run(&store).unwrap();
    let messages = refusal(&output.rendered);
    let found = portcullis::attribution::site_parts(
        &messages,
        &output.rendered,
        pipeline.renderer.templates(),
    );
    assert_eq!(found.len(), 1, "{found:?} from {messages:?}");
    let text = found[0].to_string();
    assert!(
        text.starts_with(&format!(
            "error: {}: line 2: HAProxy refused",
            part.display()
        )),
        "{text}"
    );
    assert!(text.contains("brotli"), "{text}");
    let objects: Vec<ObjectRef> = culprits(&messages, &output.rendered, &output.model, &store)
        .into_iter()
        .map(|c| c.object)
        .collect();
    assert!(
        !objects.is_empty() && objects.iter().all(|o| o.namespace == "evil"),
        "{objects:?}"
    );
    // Without the site part nothing is refused.
    let bundled = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    check_config(&haproxy(), &bundled.run(&store).unwrap().rendered).unwrap();
}
