//! Remembered hook results (`policy::memo`) never change an outcome: a pipeline whose memo is
//! warm from other clusters and earlier runs gives exactly what a fresh one gives — the same
//! files, model and diagnostics — for every golden case (which include bad values, ignored
//! settings and `ctx.warn`) and for seeded synthetic clusters before and after a change.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;
use portcullis::objects::{Kind, Object};
use portcullis::pipeline::{Output, Pipeline, RunReport};
use portcullis::source::files::load_dir;
use portcullis::store::Store;
use portcullis::synth::{self, SynthConfig};
use portcullis::translate::{RunInputs, TranslateConfig};

#[path = "support/golden.rs"]
mod golden;
use golden::{Summary, case_config, golden_cases, summary};

/// A run of `pipeline` on `store` and the path it took.
fn run(pipeline: &Pipeline, store: &Store) -> (Output, RunReport) {
    pipeline.run_with(store, &RunInputs::default()).unwrap()
}

#[test]
fn a_warm_memo_gives_what_a_fresh_pipeline_gives_on_every_golden_case() {
    let cases = golden_cases();
    assert!(cases.len() >= 15);
    // One memo for all cases, warmed by every case before (and run twice per case).
    let holder = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    for dir in &cases {
        let store = Store::from_objects(load_dir(dir).unwrap().objects);
        let fresh = Pipeline::load(None, None, case_config(dir)).unwrap();
        let expected = summary(&fresh.run(&store).unwrap());
        let mut warm = Pipeline::load(None, None, case_config(dir)).unwrap();
        warm.keep_memo_of(&holder);
        for round in 0..2 {
            assert_eq!(
                summary(&warm.run(&store).unwrap()),
                expected,
                "{} (round {round})",
                dir.display()
            );
        }
    }
    assert!(holder.policy.memo_len() > 0, "the memo was used");
}

#[test]
fn a_warm_memo_gives_what_a_fresh_pipeline_gives_on_synthetic_clusters() {
    let config = TranslateConfig {
        watch_ingress_without_class: true,
        ..TranslateConfig::default()
    };
    let warm = Pipeline::load(None, None, config.clone()).unwrap();
    for seed in [1, 2, 3] {
        let synth_config = SynthConfig::new(seed, 150, 3);
        let cluster = synth::generate(&synth_config).unwrap();
        let mut store = Store::from_objects(cluster.objects);
        let cold = |store: &Store| {
            let fresh = Pipeline::load(None, None, config.clone()).unwrap();
            summary(&fresh.run(store).unwrap())
        };
        assert_eq!(
            summary(&warm.run(&store).unwrap()),
            cold(&store),
            "seed {seed}"
        );
        // One Ingress and one EndpointSlice change: still the same as from scratch.
        store.upsert(synth::changed_ingress(&synth_config, 7, 1).unwrap());
        store.upsert(
            synth::changed_endpoint_slice(&synth_config, 11, 1)
                .unwrap()
                .unwrap(),
        );
        let (output, report) = run(&warm, &store);
        assert_eq!(summary(&output), cold(&store), "seed {seed}, changed");
        assert_eq!(report.path(), "parts", "seed {seed}, changed");
        // Endpoint changes alone: the warm pipeline redoes only the affected backends and
        // splices their sections into the previous haproxy.cfg; still the same as from scratch.
        for round in 2..6_u64 {
            for i in [3, 11, 40 + usize::try_from(round).unwrap()] {
                store.upsert(
                    synth::changed_endpoint_slice(&synth_config, i, round)
                        .unwrap()
                        .unwrap(),
                );
            }
            let (warm_output, report) = run(&warm, &store);
            assert_eq!(
                summary(&warm_output),
                cold(&store),
                "seed {seed}, endpoint round {round}"
            );
            assert!(
                matches!(report, RunReport::Endpoints { redone } if redone >= 3),
                "seed {seed}, endpoint round {round}: {report:?}"
            );
        }
        // An Ingress change among endpoint changes runs in full, and agrees too.
        store.upsert(synth::changed_ingress(&synth_config, 5, 9).unwrap());
        store.upsert(
            synth::changed_endpoint_slice(&synth_config, 6, 9)
                .unwrap()
                .unwrap(),
        );
        let (output, report) = run(&warm, &store);
        assert_eq!(summary(&output), cold(&store));
        // The same backends by name: haproxy.cfg is patched, the map files made again.
        assert!(report.patched(), "seed {seed}: {report:?}");
        // Every backend is taken from the last run but eight: the changed Ingress' one, the
        // one whose endpoints moved with it, and the six whose endpoints moved in the endpoint
        // rounds (Services 3, 11 and 42 to 45: those runs drop their parts).
        assert_eq!(
            report.backends_taken(),
            output.model.backends.len() - 8,
            "seed {seed}"
        );
        // The oldest Ingress removed: every other one moves up an age rank, and its part is
        // taken at the new rank.
        store.delete(
            Kind::Ingress,
            &synth::changed_ingress(&synth_config, 0, 0).unwrap().key(),
        );
        let (output, report) = run(&warm, &store);
        assert_eq!(summary(&output), cold(&store));
        assert_eq!(report.path(), "parts", "seed {seed}");
    }
}

/// A golden case: its objects, their store, a pipeline warmed by a run on it, and what a
/// fresh pipeline gives for a store (with the case's translation settings).
fn warmed_case(dir: &Path) -> (Vec<Object>, Store, Pipeline, impl Fn(&Store) -> Summary) {
    let objects = load_dir(dir).unwrap().objects;
    let store = Store::from_objects(objects.clone());
    let config = case_config(dir);
    let warm = Pipeline::load(None, None, config.clone()).unwrap();
    drop(warm.run(&store).unwrap());
    let fresh = move |store: &Store| {
        let pipeline = Pipeline::load(None, None, config.clone()).unwrap();
        summary(&pipeline.run(store).unwrap())
    };
    (objects, store, warm, fresh)
}

/// Runs after Ingress changes take the parts of the unchanged Ingresses and backends from
/// the last run (`translate::parts`). On every golden case (default backends, conflicts,
/// captures, passthrough, basic auth, TLS), each Ingress is removed, put back as the very
/// object it was (its part is taken again, at another age rank) and as a copy (translated
/// again): after each step the warm pipeline gives what a fresh one gives.
#[test]
fn runs_that_take_the_parts_of_unchanged_ingresses_give_what_a_fresh_pipeline_gives() {
    let cases = golden_cases();
    let mut partial = 0;
    let mut taken_total = 0;
    let mut patched = 0;
    for dir in &cases {
        let (objects, mut store, warm, fresh) = warmed_case(dir);
        let ingresses: Vec<Object> = objects
            .into_iter()
            .filter(|o| o.kind() == Kind::Ingress)
            .collect();
        for ingress in &ingresses {
            let copy = match ingress {
                Object::Ingress(i) => Object::Ingress(std::sync::Arc::new(Ingress::clone(i))),
                _ => unreachable!(),
            };
            let steps = [
                ("removed", None),
                ("put back", Some(ingress.clone())),
                ("copied", Some(copy)),
            ];
            let mut taken_per_step = Vec::new();
            for (step, object) in steps {
                match object {
                    None => store.delete(Kind::Ingress, &ingress.key()),
                    Some(object) => store.upsert(object),
                }
                let (output, report) = run(&warm, &store);
                assert_eq!(
                    summary(&output),
                    fresh(&store),
                    "{}: Ingress {} {step}",
                    dir.display(),
                    ingress.key()
                );
                // Every run after an Ingress change takes parts.
                assert_eq!(
                    report.path(),
                    "parts",
                    "{}: Ingress {} {step}",
                    dir.display(),
                    ingress.key()
                );
                partial += 1;
                patched += usize::from(report.patched());
                taken_per_step.push(report.ingresses_taken());
            }
            // Every other Ingress is the same object in each step, whatever its age rank
            // (removing an Ingress moves the younger ones up a rank): its part is taken.
            // Under --host-ownership=namespace, but those whose hosts change owner with it:
            // they are translated again.
            let ownership = case_config(dir).host_ownership
                == portcullis::translate::class::HostOwnership::Namespace;
            assert!(
                ownership || taken_per_step.iter().all(|t| *t == taken_per_step[2]),
                "{}: Ingress {}: parts taken in the three steps: {taken_per_step:?}",
                dir.display(),
                ingress.key()
            );
            taken_total += taken_per_step[2];
        }
    }
    assert!(partial > 100, "{partial} partial runs");
    assert!(taken_total > 100, "{taken_total} Ingress parts taken");
    // Putting back or copying an Ingress often leaves the backends as they were: those
    // runs patch haproxy.cfg, and agree with fresh pipelines all the same.
    assert!(patched > 50, "{patched} runs patched haproxy.cfg");
}

/// The HTTPS side of a run (crt-list, certificate files, ssl-redirect and passthrough maps)
/// is taken from the last run when every Ingress contributes what the one at its age rank
/// did. An Ingress replaced at its rank by one that contributes otherwise (no TLS section,
/// another redirect code, redirects off, its first TLS host only), then put back: after each
/// step the warm pipeline gives what a fresh one gives.
#[test]
fn an_ingress_whose_https_side_changes_is_not_taken_as_before() {
    let mut variants_run = 0;
    for dir in &golden_cases() {
        let (objects, mut store, warm, fresh) = warmed_case(dir);
        let ingresses: Vec<std::sync::Arc<Ingress>> = objects
            .into_iter()
            .filter_map(|o| match o {
                Object::Ingress(i) => Some(i),
                _ => None,
            })
            .filter(|i| i.spec.as_ref().is_some_and(|s| s.tls.is_some()))
            .collect();
        for ingress in &ingresses {
            let annotated = |key: &str, value: &str| {
                let mut changed = Ingress::clone(ingress);
                changed
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(format!("haproxy.org/{key}"), value.to_string());
                changed
            };
            let mut no_tls = Ingress::clone(ingress);
            if let Some(spec) = no_tls.spec.as_mut() {
                spec.tls = None;
            }
            let mut first_host_only = Ingress::clone(ingress);
            if let Some(tls) = first_host_only.spec.as_mut().and_then(|s| s.tls.as_mut()) {
                tls.truncate(1);
                if let Some(hosts) = tls.first_mut().and_then(|t| t.hosts.as_mut()) {
                    hosts.truncate(1);
                }
            }
            let steps = [
                ("without TLS", no_tls),
                ("with code 308", annotated("ssl-redirect-code", "308")),
                ("without redirects", annotated("ssl-redirect", "false")),
                ("with its first TLS host only", first_host_only),
                ("put back", Ingress::clone(ingress)),
            ];
            for (step, changed) in steps {
                store.upsert(Object::Ingress(std::sync::Arc::new(changed)));
                assert_eq!(
                    summary(&warm.run(&store).unwrap()),
                    fresh(&store),
                    "{}: Ingress {} {step}",
                    dir.display(),
                    ingress.metadata.name.as_deref().unwrap_or_default()
                );
                variants_run += 1;
            }
        }
    }
    assert!(variants_run > 20, "{variants_run} variants run");
}

/// Runs that take parts drop no remembered result, so the results of replaced Ingresses pile
/// up; once the memos have grown by a quarter since the last full run, a full run prunes
/// them. A long stream of Ingress changes alone must not grow memory without bound: here
/// each change gives its Ingress an annotation value never seen before, so every one leaves
/// results that no later run uses.
#[test]
fn a_stream_of_ingress_changes_gets_a_full_run_now_and_then() {
    let synth_config = SynthConfig::new(4, 20, 3);
    let mut store = Store::from_objects(synth::generate(&synth_config).unwrap().objects);
    let warm = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    drop(warm.run(&store).unwrap());
    let rounds = 600_u64;
    let mut partial = 0;
    for generation in 1..=rounds {
        let i = usize::try_from(generation % 20).unwrap();
        let Object::Ingress(mut ingress) =
            synth::changed_ingress(&synth_config, i, generation).unwrap()
        else {
            unreachable!("an Ingress")
        };
        std::sync::Arc::make_mut(&mut ingress)
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                "haproxy.org/timeout-client".to_string(),
                format!("{generation}ms"),
            );
        store.upsert(Object::Ingress(ingress));
        let (_, report) = run(&warm, &store);
        partial += u64::from(report.path() == "parts");
    }
    assert!(
        partial > rounds / 2,
        "{partial} of {rounds} runs took parts"
    );
    assert!(partial < rounds, "no full run in {rounds} Ingress changes");
    let fresh = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    assert_eq!(
        summary(&warm.run(&store).unwrap()),
        summary(&fresh.run(&store).unwrap())
    );
}

/// A backend registered by an older Ingress' default backend and by a younger Ingress' rule
/// takes the older Ingress' annotations (registrations count in the order they happened),
/// whether the run sorted every registration or moved a changed Ingress' in the last order.
#[test]
fn a_backend_takes_the_annotations_of_its_first_registration() {
    let manifests = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: portcullis
spec:
  controller: portcullis.io/ingress
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: older
  namespace: shop
  creationTimestamp: "2024-01-01T00:00:00Z"
  annotations: {haproxy.org/timeout-server: "5s"}
spec:
  ingressClassName: portcullis
  defaultBackend: {service: {name: web, port: {number: 80}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: younger
  namespace: shop
  creationTimestamp: "2025-01-01T00:00:00Z"
  annotations: {haproxy.org/timeout-server: "9s"}
spec:
  ingressClassName: portcullis
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{port: 80}]}
"#;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("all.yaml"), manifests).unwrap();
    let objects = load_dir(dir.path()).unwrap().objects;
    let younger = objects
        .iter()
        .find_map(|o| match o {
            Object::Ingress(i) if i.metadata.name.as_deref() == Some("younger") => Some(i.clone()),
            _ => None,
        })
        .unwrap();
    let mut store = Store::from_objects(objects);
    let pipeline = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    let timeout = |out: &Output| {
        let web = out
            .model
            .backends
            .iter()
            .find(|b| b.service == "web")
            .unwrap();
        web.settings
            .timeouts
            .get(&portcullis::model::Timeout::Server)
            .copied()
    };
    assert_eq!(timeout(&pipeline.run(&store).unwrap()), Some(5000));
    // The younger Ingress changed: a run that takes the older one's part.
    let mut changed = Ingress::clone(&younger);
    changed
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("changed".into(), "yes".into());
    store.upsert(Object::Ingress(std::sync::Arc::new(changed)));
    let (output, report) = run(&pipeline, &store);
    assert_eq!(timeout(&output), Some(5000));
    assert_eq!(report.path(), "parts");
    // The younger Ingress' rule moved to another Service, at the same age rank: its old
    // registration leaves the order, the new one comes in at its name.
    let mut moved = Ingress::clone(&younger);
    let rules = moved.spec.as_mut().and_then(|s| s.rules.as_mut()).unwrap();
    let paths = &mut rules[0].http.as_mut().unwrap().paths;
    paths[0].backend.service.as_mut().unwrap().name = "api".into();
    store.upsert(Object::Ingress(std::sync::Arc::new(moved)));
    let (warm, report) = run(&pipeline, &store);
    let fresh = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    assert_eq!(summary(&warm), summary(&fresh.run(&store).unwrap()));
    assert_eq!(report.path(), "parts");
}

/// A site script change keeps the renderer while the templates are the same: only the
/// sections of backends whose model the change moved are rendered again, and the output is
/// what a fresh pipeline with that script gives. A site template, even one equal to the
/// bundled file, brings a renderer of its own.
#[test]
fn a_script_change_renders_again_only_the_sections_it_changed() {
    let config = TranslateConfig {
        watch_ingress_without_class: true,
        ..TranslateConfig::default()
    };
    let store = Store::from_objects(
        synth::generate(&SynthConfig::new(1, 150, 3))
            .unwrap()
            .objects,
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let original = std::fs::read_to_string(root.join("scripts/pod-maxconn.rhai")).unwrap();
    let site = tempfile::tempdir().unwrap();
    let write_script = |text: &str| std::fs::write(site.path().join("pod-maxconn.rhai"), text);
    let reload = |previous: &Pipeline, templates: Option<&Path>| {
        let mut next =
            portcullis::source::site::load_pipeline(Some(site.path()), templates, config.clone())
                .unwrap();
        next.keep_memo_of(previous);
        next
    };
    let fresh = |store: &Store| {
        let p = portcullis::source::site::load_pipeline(Some(site.path()), None, config.clone())
            .unwrap();
        summary(&p.run(store).unwrap())
    };
    let first = Pipeline::load(None, None, config.clone()).unwrap();
    let before = first.run(&store).unwrap();

    // The same results: every section is taken from the renderer's memory.
    write_script(&format!("{original}\n// a comment more\n")).unwrap();
    let same = reload(&first, None);
    assert!(Arc::ptr_eq(&same.renderer, &first.renderer));
    let rendered = same.renderer.sections_rendered();
    let output = same.run(&store).unwrap();
    assert_eq!(summary(&output), summary(&before));
    assert_eq!(same.renderer.sections_rendered(), rendered);

    // Other results for the backends with `pod-maxconn`: those sections alone are rendered.
    write_script(&original.replace("#{ maxconn: maxconn }", "#{ maxconn: maxconn + 1 }")).unwrap();
    let changed = reload(&same, None);
    let rendered = changed.renderer.sections_rendered();
    let after = changed.run(&store).unwrap();
    assert_eq!(summary(&after), fresh(&store));
    let moved = after
        .model
        .backends
        .iter()
        .zip(output.model.backends.iter())
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        moved > 0,
        "the synthetic cluster has Services with pod-maxconn"
    );
    assert_eq!(
        changed.renderer.sections_rendered() - rendered,
        moved as u64
    );

    // A site template directory: a renderer of its own, which renders every section.
    let templates = tempfile::tempdir().unwrap();
    std::fs::copy(
        root.join("templates/haproxy.cfg.j2"),
        templates.path().join("haproxy.cfg.j2"),
    )
    .unwrap();
    let own = reload(&changed, Some(templates.path()));
    assert!(!Arc::ptr_eq(&own.renderer, &changed.renderer));
    assert_eq!(summary(&own.run(&store).unwrap()), fresh(&store));
    assert_eq!(
        own.renderer.sections_rendered(),
        after.model.backends.len() as u64
    );
}

/// A pattern file's content is read by translation, after the hooks, whose remembered results
/// hold the reference alone: a change of the `--configmap-patternfiles` ConfigMap (a bad line
/// fixed, a key added, a file emptied, the ConfigMap gone) gives on a warm pipeline, whose
/// hook results and Ingress parts are all as before, what a fresh pipeline gives, and changes
/// the routes.
#[test]
fn a_pattern_file_change_is_not_hidden_by_remembered_results() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/37-pattern-files");
    let (objects, mut store, warm, fresh) = warmed_case(&dir);
    let original = objects
        .iter()
        .find_map(|o| match o {
            Object::ConfigMap(cm) => Some(cm.clone()),
            _ => None,
        })
        .expect("the case has its pattern files");
    let with = |edit: &dyn Fn(&mut std::collections::BTreeMap<String, String>)| {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::clone(&original);
        edit(cm.data.get_or_insert_with(Default::default));
        Object::ConfigMap(Arc::new(cm))
    };
    let before = summary(&warm.run(&store).unwrap());
    let steps: [(&str, Option<Object>); 4] = [
        (
            "the bad line fixed, the missing key added",
            Some(with(&|d| {
                d.insert("typo".into(), "192.168.0.1\n".into());
                d.insert("nobody".into(), "# nobody yet\n".into());
            })),
        ),
        (
            "the office moved",
            Some(with(&|d| {
                d.insert("office".into(), "198.51.100.0/24\n".into());
            })),
        ),
        ("the ConfigMap deleted", None),
        ("put back", Some(Object::ConfigMap(original.clone()))),
    ];
    for (step, object) in steps {
        match object {
            Some(object) => store.upsert(object),
            None => store.delete(Kind::ConfigMap, &original_key(&original)),
        }
        let (output, _) = run(&warm, &store);
        let now = summary(&output);
        assert_eq!(now, fresh(&store), "{step}");
        if step != "put back" {
            assert_ne!(now, before, "{step}: the output follows the files");
        } else {
            assert_eq!(now, before, "{step}");
        }
    }
}

fn original_key(cm: &k8s_openapi::api::core::v1::ConfigMap) -> portcullis::objects::Key {
    portcullis::objects::Key::new(
        cm.metadata.namespace.clone().unwrap_or_default(),
        cm.metadata.name.clone().unwrap_or_default(),
    )
}

/// The Gateway API's objects beside Ingresses: a Gateway with an HTTP and an HTTPS listener
/// (its certificate from a fixture), HTTPRoutes with filters and annotations read by the
/// route hooks, a cross-namespace backend permitted by a ReferenceGrant, and a listener that
/// takes routes by a namespace selector.
fn gateway_manifests() -> String {
    use base64::Engine;
    let fixture = |name: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tls")
            .join(name);
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(path).unwrap())
    };
    format!(
        r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {{name: portcullis}}
spec: {{controller: portcullis.io/ingress}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: web, namespace: shop, creationTimestamp: "2024-01-01T00:00:00Z"}}
spec:
  ingressClassName: portcullis
  rules:
    - host: shop.example.com
      http:
        paths:
          - {{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: api
  namespace: shop
  creationTimestamp: "2024-02-01T00:00:00Z"
  annotations: {{haproxy.org/allow-list: 10.0.0.0/8}}
spec:
  ingressClassName: portcullis
  rules:
    - host: api.example.com
      http:
        paths:
          - {{path: /api, pathType: Prefix, backend: {{service: {{name: api, port: {{number: 80}}}}}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: shop}}
spec: {{ports: [{{port: 80}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: api, namespace: shop}}
spec: {{ports: [{{port: 80}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{{port: 8080}}]
endpoints: [{{addresses: [10.0.0.1], conditions: {{ready: true}}}}]
---
apiVersion: v1
kind: Namespace
metadata: {{name: team-a, labels: {{gateway: allowed}}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: gateway-tls, namespace: infra}}
type: kubernetes.io/tls
data: {{tls.crt: {crt}, tls.key: {key}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: portcullis}}
spec: {{controllerName: portcullis.io/gateway-controller}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: gw, namespace: infra}}
spec:
  gatewayClassName: portcullis
  listeners:
    - {{name: http, port: 80, protocol: HTTP, allowedRoutes: {{namespaces: {{from: All}}}}}}
    - name: https
      port: 443
      protocol: HTTPS
      hostname: secure.example.com
      tls: {{certificateRefs: [{{name: gateway-tls}}]}}
      allowedRoutes: {{namespaces: {{from: All}}}}
    - name: selected
      port: 80
      protocol: HTTP
      hostname: selected.example.com
      allowedRoutes: {{namespaces: {{from: Selector, selector: {{matchLabels: {{gateway: allowed}}}}}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: store
  namespace: shop
  creationTimestamp: "2024-03-01T00:00:00Z"
  annotations: {{haproxy.org/response-set-header: X-Route store}}
spec:
  parentRefs: [{{name: gw, namespace: infra, sectionName: http}}, {{name: gw, namespace: infra, sectionName: https}}]
  hostnames: [store.example.com, secure.example.com]
  rules:
    - matches: [{{path: {{type: RegularExpression, value: "/items/[0-9]+"}}}}]
      filters:
        - type: CORS
          cors: {{allowOrigins: ["https://*.example.com"], allowCredentials: true}}
      backendRefs: [{{name: web, port: 80}}]
    - backendRefs: [{{name: api, port: 80, weight: 3}}, {{name: echo, namespace: infra, port: 80}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: team, namespace: team-a}}
spec:
  parentRefs: [{{name: gw, namespace: infra, sectionName: selected}}]
  rules:
    - backendRefs: [{{name: echo, namespace: infra, port: 80}}]
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: infra}}
spec: {{ports: [{{port: 80}}]}}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {{name: to-echo, namespace: infra}}
spec:
  from:
    - {{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}}
    - {{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: team-a}}
  to: [{{group: "", kind: Service}}]
"#,
        crt = fixture("ec.crt"),
        key = fixture("ec.key"),
    )
}

/// One object from a manifest.
fn object(manifest: &str) -> Object {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("one.yaml"), manifest).unwrap();
    let mut objects = load_dir(dir.path()).unwrap().objects;
    assert_eq!(objects.len(), 1, "{manifest}");
    objects.remove(0)
}

/// With HTTPRoutes present, runs after changes take the Ingresses' parts from the last run,
/// and an HTTPRoute's part when what it was made from is the same: a change to each thing an
/// HTTPRoute depends on (an Ingress, endpoints, the route, its Gateway, a ReferenceGrant, a
/// Namespace's labels, a Service) makes again the parts it touches, and gives what a fresh
/// pipeline gives.
#[test]
fn runs_with_httproutes_take_parts_and_give_what_a_fresh_pipeline_gives() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("all.yaml"), gateway_manifests()).unwrap();
    let mut store = Store::from_objects(load_dir(dir.path()).unwrap().objects);
    let warm = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
    let first = warm.run(&store).unwrap();
    // The routes are served, so that the steps below change what is rendered.
    let files: String = first
        .rendered
        .files()
        .values()
        .map(|v| String::from_utf8_lossy(&v.bytes()).into_owned())
        .collect();
    for host in [
        "store.example.com",
        "secure.example.com",
        "selected.example.com",
    ] {
        assert!(
            files.contains(host),
            "{host} is not routed:\n{files}\n{:#?}",
            first.diagnostics
        );
    }
    let fresh = |store: &Store| {
        let pipeline = Pipeline::load(None, None, TranslateConfig::default()).unwrap();
        summary(&pipeline.run(store).unwrap())
    };
    // Each step: what changed, the manifest upserted (none: the ReferenceGrant deleted), the
    // path the run must take and how many HTTPRoute parts it takes (of `store` and `team`).
    let steps: Vec<(&str, Option<&str>, &str, usize)> = vec![
        (
            "an Ingress changed",
            Some(
                    "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: shop, creationTimestamp: \"2024-01-01T00:00:00Z\"}
spec:
  ingressClassName: portcullis
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /new, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
",
            ),
            "parts",
            2,
        ),
        (
            "endpoints moved",
            Some(
                    "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.0.0.2], conditions: {ready: true}}]
",
            ),
            "endpoints",
            0,
        ),
        (
            "an HTTPRoute changed",
            Some(
                    "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: team
  namespace: team-a
  annotations: {haproxy.org/allow-list: 192.0.2.0/24}
spec:
  parentRefs: [{name: gw, namespace: infra, sectionName: selected}]
  rules:
    - matches: [{path: {type: Exact, value: /team}}]
      backendRefs: [{name: echo, namespace: infra, port: 80}]
",
            ),
            "parts",
            1,
        ),
        (
            "the Gateway's listener hostname changed",
            Some(
                    "apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra}
spec:
  gatewayClassName: portcullis
  listeners:
    - {name: http, port: 80, protocol: HTTP, hostname: store.example.com, allowedRoutes: {namespaces: {from: All}}}
    - name: https
      port: 443
      protocol: HTTPS
      hostname: secure.example.com
      tls: {certificateRefs: [{name: gateway-tls}]}
      allowedRoutes: {namespaces: {from: All}}
    - name: selected
      port: 80
      protocol: HTTP
      hostname: chosen.example.com
      allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {gateway: allowed}}}}
",
            ),
            "parts",
            0,
        ),
        (
            "the ReferenceGrant no longer permits team-a",
            Some(
                    "apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: to-echo, namespace: infra}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}]
  to: [{group: \"\", kind: Service}]
",
            ),
            "parts",
            1,
        ),
        (
            "the Namespace's labels no longer match the selector",
            Some(
                    "apiVersion: v1
kind: Namespace
metadata: {name: team-a, labels: {gateway: refused}}
",
            ),
            "parts",
            1,
        ),
        (
            "the ReferenceGrant removed",
            None,
            "parts",
            1,
        ),
        (
            "a Service lost its port",
            Some(
                    "apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {ports: [{port: 8080}]}
",
            ),
            "full",
            0,
        ),
        (
            "the Namespace's labels match again",
            Some(
                    "apiVersion: v1
kind: Namespace
metadata: {name: team-a, labels: {gateway: allowed}}
",
            ),
            "parts",
            1,
        ),
    ];
    let mut previous = summary(&first);
    for (step, manifest, path, routes_taken) in steps {
        match manifest {
            Some(manifest) => store.upsert(object(manifest)),
            None => store.delete(
                Kind::ReferenceGrant,
                &portcullis::objects::Key::new("infra", "to-echo"),
            ),
        }
        let (output, report) = run(&warm, &store);
        let warm_summary = summary(&output);
        assert_eq!(warm_summary, fresh(&store), "{step}");
        assert_eq!(report.path(), path, "{step}: {report:?}");
        assert_eq!(report.routes_taken(), routes_taken, "{step}: {report:?}");
        if path == "parts" && step != "an Ingress changed" {
            // The Ingresses did not change: both their parts are taken.
            assert_eq!(report.ingresses_taken(), 2, "{step}: {report:?}");
        }
        assert_ne!(warm_summary, previous, "{step} changed nothing");
        previous = warm_summary;
    }
}
