//! Every manifest under `deploy/` is valid against the Kubernetes 1.33 schemas, offline.
//!
//! The validator is the PyPI package `kubernetes-validate` (it bundles the schemas; `.ci/run`
//! installs the pinned version), run with `--strict`, so unknown fields are errors too. If it
//! is missing these tests fail, they do not skip.
//!
//! - Each YAML file under `deploy/` is validated as it is, and each overlay as a whole after
//!   expansion. The overlays only use `resources`, so the expansion here (concatenating what
//!   they reference, recursively) is what kustomize builds; a kustomization using anything else
//!   fails the test. Where `kubectl` is installed, `kubectl kustomize` is compared with it.
//! - Objects of custom resources have no schema in the validator. TCP objects are validated
//!   against the committed CRD's openAPIV3Schema (with Python's `jsonschema`, which
//!   `kubernetes-validate` depends on); a few other kinds named in [`NO_SCHEMA`] are listed as
//!   not validated; any other kind without a schema fails.
//! - A deliberately broken manifest, `tests/fixtures/broken-manifest.yaml`, must be rejected.
//! - The flags the workloads pass exist, only the controller's container mounts a
//!   service-account token, and the RBAC grants exactly what `src/cluster` uses.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use portcullis::cluster::reflect::api_resource;
use portcullis::objects::Kind;
use serde_json::Value;

/// The Kubernetes version the manifests target (k8s-openapi's `v1_33` feature).
const KUBERNETES_VERSION: &str = "1.33.0";
/// The version of kubernetes-validate `.ci/run` installs.
const VALIDATOR_VERSION: &str = "1.37.0";
const OVERLAYS: &[&str] = &["deployment", "daemonset", "external"];

/// Kinds of custom resources that may appear under `deploy/` without a schema to check them
/// against offline, and why. TCP objects are checked against our own CRD instead.
const NO_SCHEMA: &[(&str, &str, &str)] = &[
    (
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        "the Prometheus Operator's CRD is not bundled with the validator",
    ),
    (
        "gateway.networking.k8s.io/v1",
        "GatewayClass",
        "the Gateway API CRDs are not bundled with the validator",
    ),
    (
        "gateway.networking.k8s.io/v1",
        "Gateway",
        "the Gateway API CRDs are not bundled with the validator",
    ),
    (
        "gateway.networking.k8s.io/v1",
        "HTTPRoute",
        "the Gateway API CRDs are not bundled with the validator",
    ),
    (
        "cert-manager.io/v1",
        "Issuer",
        "cert-manager's CRDs are not bundled with the validator",
    ),
    (
        "cert-manager.io/v1",
        "Certificate",
        "cert-manager's CRDs are not bundled with the validator",
    ),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `python3 -m kubernetes_validate ARGS`, failing with instructions when it is not installed.
fn kubernetes_validate(args: &[&str]) -> Output {
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate"])
        .args(args)
        .current_dir(root())
        .output();
    let installed = |o: &Output| {
        !String::from_utf8_lossy(&o.stderr).contains("No module named kubernetes_validate")
    };
    match out {
        Ok(o) if installed(&o) => o,
        Ok(_) | Err(_) => panic!(
            "the schema validator is not installed: `python3 -m pip install \
             kubernetes-validate=={VALIDATOR_VERSION}` (.ci/run does this)"
        ),
    }
}

/// What the validator said about each file: its lines, and whether it exited 0.
struct Verdict {
    success: bool,
    lines: Vec<String>,
}

impl Verdict {
    fn errors(&self) -> Vec<&String> {
        self.lines
            .iter()
            .filter(|l| !l.starts_with("INFO") && !l.starts_with("WARN"))
            .collect()
    }

    fn missing_schemas(&self) -> Vec<&String> {
        self.lines
            .iter()
            .filter(|l| l.starts_with("WARN") && l.contains("Couldn't find schema"))
            .collect()
    }
}

fn validate(files: &[PathBuf]) -> Verdict {
    let mut args = vec!["--strict", "-k", KUBERNETES_VERSION];
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    args.extend(names.iter().map(String::as_str));
    let out = kubernetes_validate(&args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Verdict {
        success: out.status.success(),
        lines: text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
    }
}

/// Every `*.yaml`/`*.yml` file under `dir`, recursively, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read a deploy directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_kustomization(path: &Path) -> bool {
    matches!(
        path.file_name().and_then(|n| n.to_str()),
        Some("kustomization.yaml" | "kustomization.yml" | "Kustomization")
    )
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read a manifest");
    // Read as the files source reads manifests; empty documents are skipped.
    serde_saphyr::from_multiple_with_options(&text, portcullis::source::files::yaml_options())
        .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// (apiVersion, kind, namespace, name) of an object.
fn identity(v: &Value) -> (String, String, String, String) {
    (
        s(v, "apiVersion").to_string(),
        s(v, "kind").to_string(),
        s(&v["metadata"], "namespace").to_string(),
        s(&v["metadata"], "name").to_string(),
    )
}

/// The objects a kustomization directory builds: what its `resources` name, in order,
/// recursively. Fails on a missing resource and on any field but `resources`.
fn expand(dir: &Path) -> Vec<Value> {
    let file = dir.join("kustomization.yaml");
    let k = documents(&file).into_iter().next().unwrap_or(Value::Null);
    let Value::Object(map) = &k else {
        panic!("{}: not a mapping", file.display())
    };
    for key in map.keys() {
        let key = key.as_str();
        assert!(
            matches!(key, "apiVersion" | "kind" | "resources"),
            "{}: `{key}` is not expanded by this test (only `resources` is); extend \
             expand() or keep the overlays to resources",
            file.display()
        );
    }
    assert_eq!(s(&k, "kind"), "Kustomization", "{}", file.display());
    let resources = k["resources"].as_array().cloned().unwrap_or_default();
    assert!(!resources.is_empty(), "{}: no resources", file.display());
    let mut objects = Vec::new();
    for r in resources {
        let r = r.as_str().expect("a resource is a path");
        let path = dir.join(r);
        if path.is_dir() {
            assert!(
                path.join("kustomization.yaml").is_file(),
                "{}: resource {r} is a directory without kustomization.yaml",
                file.display()
            );
            objects.extend(expand(&path));
        } else {
            assert!(
                path.is_file(),
                "{}: resource {r} does not exist",
                file.display()
            );
            objects.extend(documents(&path));
        }
    }
    objects
}

fn overlay(name: &str) -> Vec<Value> {
    expand(&root().join("deploy/overlays").join(name))
}

#[test]
fn every_manifest_under_deploy_is_valid() {
    let files: Vec<PathBuf> = yaml_files(&root().join("deploy"))
        .into_iter()
        .filter(|p| !is_kustomization(p))
        .collect();
    assert!(files.len() > 10, "too few manifests found: {files:?}");
    let verdict = validate(&files);
    assert!(
        verdict.success && verdict.errors().is_empty(),
        "the validator rejected manifests under deploy/:\n{}",
        verdict.lines.join("\n")
    );
    let passed = verdict
        .lines
        .iter()
        .filter(|l| l.starts_with("INFO") && l.contains(" passed for resource "))
        .count();

    // Objects the validator has no schema for: TCP objects against our CRD, the kinds of
    // NO_SCHEMA named, anything else fails.
    let mut tcps = Vec::new();
    let mut unchecked = Vec::new();
    let mut unknown = Vec::new();
    let mut objects = 0;
    for file in &files {
        for doc in documents(file) {
            objects += 1;
            let (api_version, kind, ns, name) = identity(&doc);
            let line = format!("{}: {api_version} {kind} {ns}/{name}", file.display());
            if api_version == portcullis::objects::TCP_API_VERSION && kind == "TCP" {
                tcps.push(doc);
            } else if let Some((_, _, why)) = NO_SCHEMA
                .iter()
                .find(|(a, k, _)| *a == api_version && *k == kind)
            {
                unchecked.push(format!("{line} ({why})"));
            } else if verdict
                .missing_schemas()
                .iter()
                .any(|w| w.contains(&format!("kind {kind} with api version {api_version} ")))
            {
                unknown.push(line);
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "no schema for these objects, and no rule for them in tests/deploy_manifests.rs:\n{}",
        unknown.join("\n")
    );
    assert_eq!(
        passed + tcps.len() + unchecked.len(),
        objects,
        "every object is validated or listed:\n{}",
        verdict.lines.join("\n")
    );
    validate_tcps(&tcps).expect("TCP objects under deploy/ match the CRD");
    eprintln!(
        "{passed} objects valid against Kubernetes {KUBERNETES_VERSION}, {} TCP objects \
         against the CRD",
        tcps.len()
    );
    for u in &unchecked {
        eprintln!("not validated, no schema offline: {u}");
    }
}

#[test]
fn every_overlay_expands_and_is_valid_as_a_whole() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for name in OVERLAYS {
        let objects = overlay(name);
        let mut seen = BTreeSet::new();
        for o in &objects {
            assert!(
                seen.insert(identity(o)),
                "overlay {name}: {:?} twice",
                identity(o)
            );
        }
        let text = objects
            .iter()
            .map(|o| serde_saphyr::to_string(o).expect("YAML"))
            .collect::<Vec<_>>()
            .join("---\n");
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, text).expect("write the expansion");
        let verdict = validate(std::slice::from_ref(&file));
        assert!(
            verdict.success && verdict.errors().is_empty() && verdict.missing_schemas().is_empty(),
            "overlay {name} as built:\n{}",
            verdict.lines.join("\n")
        );
        kubectl_agrees(name, &seen);
    }
}

/// Where `kubectl` is installed, `kubectl kustomize` builds the same objects as [`expand`].
fn kubectl_agrees(name: &str, expanded: &BTreeSet<(String, String, String, String)>) {
    let dir = root().join("deploy/overlays").join(name);
    let Ok(out) = Command::new("kubectl").arg("kustomize").arg(&dir).output() else {
        eprintln!(
            "note: kubectl is not installed; overlay {name} was expanded by this test only \
             (it uses nothing but `resources`)"
        );
        return;
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let built: BTreeSet<_> = serde_saphyr::from_slice_multiple::<Value>(&out.stdout)
        .expect("kubectl's YAML")
        .iter()
        .map(identity)
        .collect();
    assert_eq!(&built, expanded, "kubectl kustomize differs for {name}");
}

#[test]
fn the_broken_manifest_is_rejected() {
    let file = root().join("tests/fixtures/broken-manifest.yaml");
    let verdict = validate(&[file]);
    assert!(!verdict.success, "{}", verdict.lines.join("\n"));
    let errors = verdict.errors();
    let about = |what: &str, why: &str| {
        errors
            .iter()
            .any(|l| l.starts_with("ERROR") && l.contains(what) && l.contains(why))
    };
    assert!(
        about("deployment/broken-port", "containerPort"),
        "{errors:?}"
    );
    assert!(about("service/broken-field", "selectr"), "{errors:?}");
    assert_eq!(errors.len(), 2, "only the two broken objects: {errors:?}");
    assert!(
        verdict
            .lines
            .iter()
            .any(|l| l.starts_with("INFO") && l.contains("configmap/fine")),
        "{:?}",
        verdict.lines
    );
}

#[test]
fn every_kustomization_references_files_that_exist() {
    for file in yaml_files(&root().join("deploy")) {
        if is_kustomization(&file) {
            let dir = file.parent().expect("a directory");
            assert!(!expand(dir).is_empty(), "{}", file.display());
        }
    }
    // The base is the three parts of an installation and the overlays build on it.
    let base = expand(&root().join("deploy/base"));
    let kinds: BTreeSet<&str> = base.iter().map(|o| s(o, "kind")).collect();
    for kind in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "IngressClass",
        "CustomResourceDefinition",
        "ConfigMap",
    ] {
        assert!(kinds.contains(kind), "base lacks {kind}");
    }
    let class = base
        .iter()
        .find(|o| s(o, "kind") == "IngressClass")
        .expect("IngressClass");
    assert_eq!(s(&class["metadata"], "name"), "portcullis");
    assert_eq!(s(&class["spec"], "controller"), "portcullis.io/ingress");

    let external: BTreeSet<String> = overlay("external")
        .iter()
        .map(|o| s(o, "kind").to_string())
        .collect();
    let expected: BTreeSet<String> = [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Secret",
    ]
    .map(String::from)
    .into();
    assert_eq!(external, expected, "external: only RBAC and the token");

    let deployment = overlay("deployment");
    let service = deployment
        .iter()
        .find(|o| s(o, "kind") == "Service")
        .expect("a Service");
    assert_eq!(s(&service["spec"], "type"), "LoadBalancer");
    assert!(
        deployment
            .iter()
            .any(|o| s(o, "kind") == "PodDisruptionBudget")
    );
    let daemonset = overlay("daemonset");
    let ds = daemonset
        .iter()
        .find(|o| s(o, "kind") == "DaemonSet")
        .expect("a DaemonSet");
    assert_eq!(
        ds["spec"]["template"]["spec"]["hostNetwork"].as_bool(),
        Some(true)
    );
}

/// The workloads of the overlays: (overlay, pod spec).
fn pod_specs() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for name in OVERLAYS {
        for o in overlay(name) {
            if matches!(s(&o, "kind"), "Deployment" | "DaemonSet") {
                out.push((name.to_string(), o["spec"]["template"]["spec"].clone()));
            }
        }
    }
    assert_eq!(out.len(), 2, "a Deployment and a DaemonSet");
    out
}

fn containers(pod: &Value) -> Vec<Value> {
    let mut all = pod["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    all.extend(pod["containers"].as_array().cloned().unwrap_or_default());
    all
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_flag_the_workloads_pass_exists() {
    let mut help = BTreeMap::new();
    let mut checked = 0;
    for (overlay, pod) in pod_specs() {
        for c in containers(&pod) {
            if !strings(&c["command"]).is_empty() {
                continue; // HAProxy, not portcullis
            }
            let args = strings(&c["args"]);
            let sub = args.first().expect("a subcommand").clone();
            let text = help.entry(sub.clone()).or_insert_with(|| {
                let out = Command::new(env!("CARGO_BIN_EXE_portcullis"))
                    .args([sub.as_str(), "--help"])
                    .output()
                    .expect("portcullis --help");
                assert!(out.status.success(), "portcullis {sub} --help");
                String::from_utf8_lossy(&out.stdout).to_string()
            });
            for arg in args.iter().skip(1) {
                let flag = arg.split('=').next().unwrap_or(arg);
                assert!(flag.starts_with("--"), "{overlay}: {arg} is not a flag");
                let known = text
                    .lines()
                    .any(|l| l.trim_start().split([' ', ',']).any(|w| w == flag));
                assert!(known, "{overlay}: portcullis {sub} has no flag {flag}");
                checked += 1;
            }
        }
    }
    assert!(checked > 20, "{checked} flags");
}

#[test]
fn only_the_controller_container_gets_a_service_account_token() {
    for (overlay, pod) in pod_specs() {
        assert_eq!(
            pod["automountServiceAccountToken"].as_bool(),
            Some(false),
            "{overlay}: the token is not mounted into every container"
        );
        let token_volumes: BTreeSet<String> = pod["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|v| {
                v["projected"]["sources"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|x| !x["serviceAccountToken"].is_null()))
            })
            .map(|v| s(v, "name").to_string())
            .collect();
        assert_eq!(token_volumes.len(), 1, "{overlay}: one token volume");
        for c in containers(&pod) {
            let mounts_token = c["volumeMounts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .any(|m| token_volumes.contains(s(m, "name")));
            let args = strings(&c["args"]);
            let is_controller = args.first().map(String::as_str) == Some("run");
            assert_eq!(
                mounts_token,
                is_controller,
                "{overlay}: container {} (token mounted: {mounts_token})",
                s(&c, "name")
            );
            if is_controller {
                assert!(
                    args.iter()
                        .any(|a| a.starts_with("--haproxy-master-socket")),
                    "{overlay}: HAProxy is a separate container, not a child of the controller"
                );
                let admin = args
                    .iter()
                    .find(|a| a.starts_with("--admin-addr"))
                    .expect("--admin-addr: its default, 127.0.0.1, is not reachable by the kubelet unless said so");
                let paths: Vec<&str> = ["livenessProbe", "readinessProbe", "startupProbe"]
                    .iter()
                    .map(|p| s(&c[*p]["httpGet"], "path"))
                    .collect();
                assert_eq!(paths, ["/healthz", "/readyz", "/healthz"], "{overlay}");
                if admin.contains("127.0.0.1") {
                    assert_eq!(s(&c["readinessProbe"]["httpGet"], "host"), "127.0.0.1");
                }
                let env: BTreeSet<String> = c["env"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .filter(|e| !e["valueFrom"]["fieldRef"].is_null())
                    .map(|e| s(e, "name").to_string())
                    .collect();
                for v in ["POD_NAME", "POD_NAMESPACE", "POD_IP"] {
                    assert!(env.contains(v), "{overlay}: {v} from the downward API");
                }
            }
        }
    }
}

/// (API group, resource, verb).
type Grant = (String, String, String);

fn grants(rules: &Value) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in rules.as_array().cloned().unwrap_or_default() {
        for g in strings(&rule["apiGroups"]) {
            for r in strings(&rule["resources"]) {
                for v in strings(&rule["verbs"]) {
                    assert!(
                        !g.contains('*') && !r.contains('*') && !v.contains('*'),
                        "no wildcards"
                    );
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

#[test]
fn rbac_grants_exactly_what_the_cluster_source_uses() {
    let rbac = expand(&root().join("deploy/base/rbac"));
    let rules = |kind: &str| {
        let o = rbac
            .iter()
            .find(|o| s(o, "kind") == kind)
            .unwrap_or_else(|| panic!("{kind}"));
        grants(&o["rules"])
    };
    let grant = |g: &str, r: &str, v: &str| (g.to_string(), r.to_string(), v.to_string());
    // Read: every kind the watches use (src/cluster/reflect.rs), listed and watched.
    let namespaced_here = [Kind::Pod, Kind::ConfigMap];
    let mut cluster = BTreeSet::new();
    let mut local = BTreeSet::new();
    for kind in Kind::ALL {
        let r = api_resource(kind);
        let set = if namespaced_here.contains(&kind) {
            &mut local
        } else {
            &mut cluster
        };
        for verb in ["list", "watch"] {
            set.insert(grant(&r.group, &r.plural, verb));
        }
    }
    // Write: Ingress status (merge patch), Events (created), the Lease (read, create, replace).
    cluster.insert(grant("networking.k8s.io", "ingresses/status", "patch"));
    for resource in [
        "gatewayclasses",
        "gateways",
        "httproutes",
        "tlsroutes",
        "tcproutes",
    ] {
        let status = format!("{resource}/status");
        cluster.insert(grant("gateway.networking.k8s.io", &status, "patch"));
    }
    cluster.insert(grant("", "events", "create"));
    for verb in ["get", "create", "update"] {
        local.insert(grant("coordination.k8s.io", "leases", verb));
    }
    assert_eq!(rules("ClusterRole"), cluster);
    assert_eq!(rules("Role"), local);
    // The Role is in the controller's namespace, which is where the workloads run.
    let role = rbac.iter().find(|o| s(o, "kind") == "Role").expect("Role");
    assert_eq!(s(&role["metadata"], "namespace"), "portcullis");
    for (overlay, _) in pod_specs() {
        for o in self::overlay(&overlay) {
            if matches!(s(&o, "kind"), "Deployment" | "DaemonSet") {
                assert_eq!(s(&o["metadata"], "namespace"), "portcullis");
            }
        }
    }
}

/// Validates TCP objects against the openAPIV3Schema of deploy/base/crd-tcp.yaml, with
/// Python's jsonschema (`nullable: true` read as OpenAPI means it: null is allowed too).
fn validate_tcps(objects: &[Value]) -> Result<(), String> {
    if objects.is_empty() {
        return Ok(());
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let input = dir.path().join("objects.json");
    let json: Vec<serde_json::Value> = objects
        .iter()
        .map(|o| serde_json::to_value(o).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    std::fs::write(
        &input,
        serde_json::to_string(&json).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let script = r#"
import json, sys, yaml, jsonschema
crd = yaml.safe_load(open(sys.argv[1]))
schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
def openapi(s):
    if isinstance(s, dict):
        s = {k: openapi(v) for k, v in s.items()}
        if s.pop("nullable", False) and "type" in s:
            s["type"] = [s["type"], "null"]
    return s
validator = jsonschema.Draft7Validator(openapi(schema))
bad = 0
for o in json.load(open(sys.argv[2])):
    for e in validator.iter_errors(o):
        bad += 1
        print("%s: %s: %s" % (o["metadata"]["name"], "/".join(map(str, e.path)), e.message))
sys.exit(1 if bad else 0)
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(root().join("deploy/base/crd-tcp.yaml"))
        .arg(input)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn tcp_objects_are_checked_against_the_committed_crd() {
    // TCP objects of the golden tests, as the incumbent controller's users write them: binds
    // as a list, and the incumbent's v3 form (binds as a map by name, more Services, ACLs,
    // rules and lists Portcullis does not read), which the CRD must accept as the
    // incumbent's own does.
    let tcps: Vec<Value> = ["26-tcp", "33-incumbent-crs"]
        .iter()
        .flat_map(|case| documents(&root().join(format!("tests/golden/{case}/tcp.yaml"))))
        .filter(|o| s(o, "kind") == "TCP")
        .collect();
    assert!(tcps.len() >= 4);
    validate_tcps(&tcps).expect("the golden TCP objects match the CRD");
    // And a broken one is refused: a Service port that is not a number, a Service without a
    // port, an entry without a frontend.
    let mut broken = tcps[0].clone();
    broken["spec"][0]["service"]["port"] = Value::from("https");
    if let Value::Object(m) = &mut broken["spec"][1]["service"] {
        m.remove("port");
    }
    if let Value::Object(m) = &mut broken["spec"][1] {
        m.remove("frontend");
    }
    let err = validate_tcps(&[broken]).expect_err("a broken TCP object is refused");
    assert!(err.contains("spec/0/service/port"), "{err}");
    assert!(err.contains("'port' is a required property"), "{err}");
    assert!(err.contains("'frontend' is a required property"), "{err}");
}

/// The ports a NetworkPolicy rule opens: `(first, last)` ranges; `None` when it names a port by
/// name (none of ours does) or opens every port.
fn rule_ports(rule: &Value) -> Option<Vec<(u64, u64)>> {
    let ports = rule["ports"].as_array()?;
    ports
        .iter()
        .map(|p| {
            let first = p["port"].as_u64()?;
            Some((first, p["endPort"].as_u64().unwrap_or(first)))
        })
        .collect()
}

/// The port of a `--flag=ADDR:PORT` among `args`, with its address.
fn listen_flag(args: &[String], flag: &str) -> Option<(String, u64)> {
    let value = args
        .iter()
        .find_map(|a| a.strip_prefix(&format!("{flag}=")))?;
    let (address, port) = value.rsplit_once(':')?;
    Some((address.to_string(), port.parse().ok()?))
}

/// Each overlay that runs pods ships a NetworkPolicy for them: HAProxy's ports open to
/// everyone, the peers port to the replicas, the admin port only to namespaces the operator
/// labels for monitoring, and the debug listener on loopback.
#[test]
fn every_workload_overlay_ships_a_network_policy() {
    for name in OVERLAYS {
        let objects = overlay(name);
        let Some(workload) = objects
            .iter()
            .find(|o| matches!(s(o, "kind"), "Deployment" | "DaemonSet"))
        else {
            assert!(
                !objects.iter().any(|o| s(o, "kind") == "NetworkPolicy"),
                "{name}: a NetworkPolicy without pods"
            );
            continue;
        };
        let namespace = s(&workload["metadata"], "namespace");
        let labels = &workload["spec"]["template"]["metadata"]["labels"];
        let policy = objects
            .iter()
            .find(|o| {
                s(o, "kind") == "NetworkPolicy"
                    && s(&o["metadata"], "namespace") == namespace
                    && o["spec"]["podSelector"]["matchLabels"]
                        .as_object()
                        .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
            })
            .unwrap_or_else(|| panic!("{name}: no NetworkPolicy selects the controller's pods"));
        assert!(
            strings(&policy["spec"]["policyTypes"]).contains(&"Ingress".to_string()),
            "{name}: the policy does not restrict ingress"
        );
        let rules = policy["spec"]["ingress"].as_array().expect("rules");
        // Who may reach `port`: `None` for everyone, else the `from` peers of the rules.
        let reach = |port: u64| -> Vec<Option<Value>> {
            rules
                .iter()
                .filter(|r| {
                    rule_ports(r)
                        .is_none_or(|ranges| ranges.iter().any(|(a, b)| (*a..=*b).contains(&port)))
                })
                .map(|r| r.get("from").cloned())
                .collect()
        };
        let pod = &workload["spec"]["template"]["spec"];
        let all = containers(pod);
        let haproxy = all
            .iter()
            .find(|c| s(c, "name") == "haproxy")
            .expect("an haproxy container");
        for port in haproxy["ports"].as_array().expect("ports") {
            let number = port["containerPort"].as_u64().expect("a port number");
            let who = reach(number);
            match s(port, "name") {
                "http" | "https" => assert!(
                    who.iter().any(Option::is_none),
                    "{name}: port {number} is not open to everyone"
                ),
                "peers" => {
                    assert!(!who.is_empty(), "{name}: peers port closed");
                    for from in &who {
                        let from = from.as_ref().expect("the peers port is not open to all");
                        for peer in from.as_array().expect("peers") {
                            assert!(
                                peer.get("podSelector").is_some()
                                    && peer.get("namespaceSelector").is_none()
                                    && peer.get("ipBlock").is_none(),
                                "{name}: peers port open beyond the replicas: {peer:?}"
                            );
                        }
                    }
                }
                other => panic!("{name}: an HAProxy port {other} the test does not know"),
            }
        }
        let controller = all
            .iter()
            .find(|c| s(c, "name") == "portcullis")
            .expect("a portcullis container");
        let args = strings(&controller["args"]);
        let (_, admin) = listen_flag(&args, "--admin-addr").expect("--admin-addr");
        let who = reach(admin);
        assert!(
            !who.is_empty(),
            "{name}: the admin port is closed to Prometheus"
        );
        for from in who {
            let from = from.expect("the admin port is not open to everyone");
            for peer in from.as_array().expect("peers") {
                let selector = &peer["namespaceSelector"]["matchLabels"];
                assert_eq!(
                    selector
                        .get("portcullis.io/monitoring")
                        .and_then(Value::as_str),
                    Some("true"),
                    "{name}: the admin port is open to {peer:?}"
                );
                assert!(peer.get("ipBlock").is_none() && peer.get("podSelector").is_none());
            }
        }
        let (debug, debug_port) = listen_flag(&args, "--debug-addr").expect("--debug-addr");
        assert_eq!(
            debug, "127.0.0.1",
            "{name}: the debug pages are off loopback"
        );
        assert!(
            reach(debug_port).is_empty(),
            "{name}: the policy opens the debug port"
        );
    }
}

/// The webhook overlays: their flags exist; with cert-manager it mounts no token and has no
/// role, managing its own certificate it may touch its one Secret and the caBundle of its one
/// configuration; it is called for the same objects the generated policy checks.
#[test]
fn the_admission_webhook_overlays_are_consistent() {
    let help = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["webhook", "--help"])
        .output()
        .expect("portcullis webhook --help");
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    for (name, manages) in [
        ("admission-webhook", true),
        ("admission-webhook-cert-manager", false),
    ] {
        let objects = overlay(name);
        let deployment = objects
            .iter()
            .find(|o| s(o, "kind") == "Deployment")
            .expect("a Deployment");
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(manages));
        let args = strings(&containers(pod)[0]["args"]);
        assert_eq!(args[0], "webhook");
        for arg in &args[1..] {
            let flag = arg.split('=').next().unwrap_or(arg);
            assert!(
                help.lines()
                    .any(|l| l.trim_start().split([' ', ',']).any(|w| w == flag)),
                "{name}: portcullis webhook has no flag {flag}"
            );
        }
        assert_eq!(
            args.iter().any(|a| a.starts_with("--certificate-secret=")),
            manages
        );
        let granted: BTreeSet<Grant> = objects
            .iter()
            .filter(|o| s(o, "kind").ends_with("Role"))
            .flat_map(|o| grants(&o["rules"]))
            .collect();
        let expected: BTreeSet<Grant> = if manages {
            [
                ("", "secrets", "get"),
                ("", "secrets", "update"),
                ("", "secrets", "create"),
                (
                    "admissionregistration.k8s.io",
                    "validatingwebhookconfigurations",
                    "get",
                ),
                (
                    "admissionregistration.k8s.io",
                    "validatingwebhookconfigurations",
                    "update",
                ),
            ]
            .into_iter()
            .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
            .collect()
        } else {
            BTreeSet::new()
        };
        assert_eq!(granted, expected, "{name}");
    }
    let objects = overlay("admission-webhook");
    let configuration = objects
        .iter()
        .find(|o| s(o, "kind") == "ValidatingWebhookConfiguration")
        .expect("a ValidatingWebhookConfiguration");
    let hook = &configuration["webhooks"][0];
    assert_eq!(s(hook, "sideEffects"), "None");
    assert_eq!(s(hook, "failurePolicy"), "Ignore");
    assert!(hook["timeoutSeconds"].as_u64().is_some_and(|t| t <= 10));
    let policy = documents(&root().join("deploy/overlays/admission-policy/policy.yaml"))
        .into_iter()
        .find(|o| s(o, "kind") == "ValidatingAdmissionPolicy")
        .expect("the generated policy");
    let normalized = |v: &Value| {
        v.as_array()
            .expect("match conditions")
            .iter()
            .map(|c| {
                let words: Vec<&str> = s(c, "expression").split_whitespace().collect();
                (s(c, "name").to_string(), words.join(" "))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        normalized(&hook["matchConditions"]),
        normalized(&policy["spec"]["matchConditions"]),
        "the webhook is called for other objects than the policy checks"
    );
}
