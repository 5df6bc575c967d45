//! The ValidatingAdmissionPolicy `portcullis admission-policy` generates: the committed overlay
//! is its output, and its CEL, evaluated by a CEL implementation as the API server would,
//! refuses the values the controller refuses and never one the controller accepts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/apiserver.rs"]
mod apiserver;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cel::{Context, Program, Value as CelValue};
use proptest::prelude::*;
use serde_json::{Value, json};

use portcullis::objects::Key;
use portcullis::tools::admission_policy::{self, PolicyOptions};
use portcullis::tools::annotations;

fn overlay() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/overlays/admission-policy/policy.yaml")
}

fn options() -> PolicyOptions {
    PolicyOptions {
        ingress_class: "portcullis".to_string(),
        config_map: Some(Key::new("portcullis", "portcullis")),
        deny: false,
    }
}

fn rows() -> Vec<annotations::Row> {
    let engine = portcullis::source::site::load_policy(None).expect("the bundled scripts load");
    annotations::rows(&engine)
}

#[test]
fn the_overlay_is_the_generated_policy() {
    let generated = admission_policy::yaml(&rows(), &options());
    if std::env::var_os("UPDATE_DEPLOY").is_some() {
        std::fs::write(overlay(), &generated).unwrap();
    }
    let committed = std::fs::read_to_string(overlay()).unwrap_or_default();
    assert!(
        committed == generated,
        "deploy/overlays/admission-policy/policy.yaml is stale: run \
         `UPDATE_DEPLOY=1 cargo test --test admission_policy`"
    );
    // The command prints the same.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["admission-policy", "--configmap", "portcullis/portcullis"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), generated);
}

/// The generated policy, compiled: its match conditions, its `settings` variable and its
/// validations with their messages.
struct Compiled {
    conditions: Vec<Program>,
    settings: Program,
    validations: Vec<(Program, String)>,
}

fn compile() -> Compiled {
    let [policy, _binding] = admission_policy::documents(&rows(), &options());
    compile_documents(&policy)
}

/// What the API server would do with `object` of `kind` in `namespace`: `None` when the policy
/// does not apply, else the messages of the validations that fail.
fn admit(policy: &Compiled, kind: &str, namespace: &str, object: &Value) -> Option<Vec<String>> {
    let mut context = Context::default();
    let request = json!({
        "kind": {"group": "", "version": "v1", "kind": kind},
        "namespace": namespace,
        "name": object["metadata"]["name"],
        "operation": "CREATE",
    });
    context.add_variable("request", request).unwrap();
    context.add_variable("object", object.clone()).unwrap();
    for condition in &policy.conditions {
        if condition.execute(&context).unwrap() != CelValue::Bool(true) {
            return None;
        }
    }
    let settings = policy.settings.execute(&context).unwrap();
    let mut variables = std::collections::HashMap::new();
    variables.insert("settings".to_string(), settings);
    context.add_variable_from_value("variables", variables);
    Some(
        policy
            .validations
            .iter()
            .filter(|(program, _)| program.execute(&context).unwrap() != CelValue::Bool(true))
            .map(|(_, message)| message.clone())
            .collect(),
    )
}

fn ingress(class: &str, annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
        "spec": {"ingressClassName": class},
    })
}

#[test]
fn valid_and_invalid_annotations_are_told_apart() {
    let policy = compile();
    let table: &[(&str, &str, bool)] = &[
        ("haproxy.org/timeout-server", "30s", true),
        ("haproxy.org/timeout-server", " 500ms ", true),
        ("haproxy.org/timeout-server", "forever", false),
        ("portcullis.io/timeout-server", "5 minutes", false),
        ("timeout-server", "1h", true),
        ("haproxy.org/ssl-redirect", "true", true),
        ("haproxy.org/ssl-redirect", "Enabled", true),
        ("haproxy.org/ssl-redirect", "yes", false),
        ("haproxy.org/allow-list", "10.0.0.0/8, 192.168.1.1", true),
        ("haproxy.org/allow-list", "2001:db8::/32 127.0.0.1", true),
        ("haproxy.org/allow-list", "everyone", false),
        ("haproxy.org/whitelist", "10.0.0.0/8;rm", false),
        ("haproxy.org/load-balance", "roundrobin", true),
        ("haproxy.org/auth-type", "basic-auth", true),
        ("haproxy.org/auth-type", "oauth", false),
        ("haproxy.org/pod-maxconn", "500", true),
        ("haproxy.org/pod-maxconn", "0", false),
        ("haproxy.org/pod-maxconn", "2000000", false),
        ("haproxy.org/pod-maxconn", "many", false),
        ("haproxy.org/rate-limit-size", "100k", true),
        ("haproxy.org/rate-limit-size", "1 TB", false),
        // Not checked by the policy (no exact CEL form): left to the controller.
        ("haproxy.org/request-set-header", "X-A \"b\"", true),
        ("haproxy.org/no-such-annotation", "anything", true),
    ];
    for (key, value, ok) in table {
        let object = ingress("portcullis", &[(key, value)]);
        let failed = admit(&policy, "Ingress", "shop", &object).expect("the policy applies");
        assert_eq!(failed.is_empty(), *ok, "{key}: {value:?} gave {failed:?}");
    }
    // The message names the setting and what it must be.
    let failed = admit(
        &policy,
        "Ingress",
        "shop",
        &ingress("portcullis", &[("haproxy.org/timeout-server", "forever")]),
    )
    .unwrap();
    assert!(
        failed
            .iter()
            .any(|m| m.starts_with("timeout-server") && m.contains("duration")),
        "{failed:?}"
    );
}

#[test]
fn only_our_class_and_our_configmap_are_checked() {
    let policy = compile();
    let bad = [("haproxy.org/timeout-server", "forever")];
    assert_eq!(
        admit(&policy, "Ingress", "shop", &ingress("nginx", &bad)),
        None
    );
    let mut legacy = ingress("portcullis", &bad);
    legacy["spec"] = json!({});
    legacy["metadata"]["annotations"]["kubernetes.io/ingress.class"] = json!("portcullis");
    assert!(
        !admit(&policy, "Ingress", "shop", &legacy)
            .unwrap()
            .is_empty()
    );

    let config_map = |namespace: &str, name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": namespace},
               "data": {"timeout-server": "forever", "ssl-redirect": "true"}})
    };
    let ours = admit(
        &policy,
        "ConfigMap",
        "portcullis",
        &config_map("portcullis", "portcullis"),
    );
    assert_eq!(ours.map(|f| f.len()), Some(1));
    assert_eq!(
        admit(
            &policy,
            "ConfigMap",
            "apps",
            &config_map("apps", "settings")
        ),
        None
    );

    // A Service is checked under Portcullis' own prefix only.
    let service = |key: &str| {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "shop", "annotations": {key: "forever"}}})
    };
    assert!(
        !admit(
            &policy,
            "Service",
            "shop",
            &service("portcullis.io/timeout-server")
        )
        .unwrap()
        .is_empty()
    );
    assert!(
        admit(
            &policy,
            "Service",
            "shop",
            &service("haproxy.org/timeout-server")
        )
        .unwrap()
        .is_empty()
    );
}

/// Which parser of the controller reads a declared type, for the types the policy checks.
fn controller_accepts(value_type: &str, value: &str) -> Option<bool> {
    use portcullis::values;
    Some(match value_type {
        "bool" => values::parse_bool(value).is_ok(),
        "duration" => values::parse_duration(value).is_ok(),
        "size" => values::parse_size(value).is_ok(),
        "cidrs" => values::parse_cidr_list(value).is_ok(),
        "int(1..1000000)" => values::parse_int(value, 1, 1_000_000).is_ok(),
        _ => return None,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    /// Whatever a value, if the controller's parser accepts it the policy does too: turning
    /// `Deny` on never refuses a working object.
    #[test]
    fn the_policy_never_refuses_what_the_controller_accepts(
        value in prop_oneof![
            "[ ]{0,2}[0-9]{1,6}(ms|s|m|h|d|k|K|m|M|g|G)?[ ]{0,2}",
            "(true|false|TRUE|Enabled|disabled|yes|1)",
            "([0-9]{1,3}\\.){3}[0-9]{1,3}(/[0-9]{1,2})?([, ]{1,2}[0-9a-f:]{2,12}(/[0-9]{1,3})?){0,2}",
            "[+-]?[0-9]{1,20}",
            ".{0,12}",
        ],
    ) {
        let policy = compile_cached();
        for (key, value_type) in [
            ("haproxy.org/timeout-server", "duration"),
            ("haproxy.org/ssl-redirect", "bool"),
            ("haproxy.org/allow-list", "cidrs"),
            ("haproxy.org/rate-limit-size", "size"),
            ("haproxy.org/pod-maxconn", "int(1..1000000)"),
        ] {
            let Some(accepted) = controller_accepts(value_type, &value) else { continue };
            if !accepted {
                continue;
            }
            let failed = admit(policy, "Ingress", "shop", &ingress("portcullis", &[(key, &value)]))
                .unwrap();
            prop_assert!(failed.is_empty(), "{key}: {value:?} accepted by the controller, refused by the policy: {failed:?}");
        }
    }
}

fn compile_cached() -> &'static Compiled {
    static POLICY: std::sync::OnceLock<Compiled> = std::sync::OnceLock::new();
    POLICY.get_or_init(compile)
}

/// The policy as the API server runs it, through the test API server: the real kube client
/// creates objects, and the bound action decides (`Deny`: 422 with the rule's message; `Warn`:
/// stored, with the message as a warning).
#[tokio::test]
async fn the_api_server_refuses_or_warns_as_the_binding_says() {
    let server = apiserver::ApiServer::start().await;
    let client = server.client(None).await;
    let ingresses: kube::Api<k8s_openapi::api::networking::v1::Ingress> =
        kube::Api::namespaced(client, "shop");
    let warned = Arc::new(Mutex::new(Vec::<String>::new()));
    let install = |deny: bool| {
        let [policy, binding] =
            admission_policy::documents(&rows(), &PolicyOptions { deny, ..options() });
        let compiled = compile_documents(&policy);
        let actions: Vec<String> = binding["spec"]["validationActions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let warned = warned.clone();
        let check: apiserver::AdmissionCheck =
            Arc::new(move |kind, namespace, _operation, object| {
                let failed = admit(&compiled, kind, namespace, object).unwrap_or_default();
                let mut verdict = apiserver::AdmissionVerdict::default();
                if failed.is_empty() {
                    return verdict;
                }
                let text = format!(
                    "ValidatingAdmissionPolicy '{0}' with binding '{0}' denied request: {1}",
                    admission_policy::POLICY_NAME,
                    failed.join(", ")
                );
                if actions.iter().any(|a| a == "Deny") {
                    verdict.denied = Some(text);
                } else {
                    warned.lock().unwrap().push(text.clone());
                    verdict.warnings.push(text);
                }
                verdict
            });
        server.set_admission(Some(check));
    };
    let object = |name: &str, value: &str| {
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": "shop",
                         "annotations": {"haproxy.org/timeout-server": value}},
            "spec": {"ingressClassName": "portcullis"},
        }))
        .unwrap()
    };
    let create = kube::api::PostParams::default();

    install(true);
    let refused = ingresses
        .create(&create, &object("bad", "forever"))
        .await
        .unwrap_err();
    match refused {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422);
            assert!(
                status.message.contains("timeout-server: a duration"),
                "{}",
                status.message
            );
        }
        other => panic!("{other}"),
    }
    assert!(
        ingresses.get_opt("bad").await.unwrap().is_none(),
        "a refused object was stored"
    );
    ingresses
        .create(&create, &object("good", "30s"))
        .await
        .unwrap();

    install(false);
    ingresses
        .create(&create, &object("bad", "forever"))
        .await
        .unwrap();
    assert!(ingresses.get_opt("bad").await.unwrap().is_some());
    let warned = warned.lock().unwrap().clone();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("timeout-server"));
}

fn compile_documents(policy: &Value) -> Compiled {
    let program = |e: &Value| Program::compile(e.as_str().unwrap()).unwrap();
    let spec = &policy["spec"];
    Compiled {
        conditions: spec["matchConditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| program(&c["expression"]))
            .collect(),
        settings: program(&spec["variables"][0]["expression"]),
        validations: spec["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    program(&v["expression"]),
                    v["message"].as_str().unwrap().to_string(),
                )
            })
            .collect(),
    }
}
