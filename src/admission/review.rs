//! One AdmissionReview answered: the object's declared-annotation checks and the hooks of the
//! bundled and site scripts that read it alone, under their budgets. Errors refuse the object
//! with the controller's own diagnostic text; warnings come back as admission warnings.
//!
//! It sees one object and nothing else: no store, no Secrets, no HAProxy. What depends on other
//! objects (the Service a path names, a host another Ingress holds) is the controller's to
//! decide when it translates, so nothing here refuses an object for it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::diagnostics::{Diagnostic, Diagnostics, Severity, Subject};
use crate::objects::{Key, Object, ObjectRef};
use crate::policy::{Budget, HookContext, PolicyEngine, ValueSource};
use crate::snippets::SnippetPolicy;

/// The operations every hook call of one review may spend together: an Ingress of a hundred
/// paths, each through every route hook, with room to spare; each call is also held to
/// [`crate::policy::budget::MAX_OPERATIONS_PER_CALL`].
pub const REVIEW_OPERATIONS: u64 = 20_000_000;

/// What the webhook checks and with which limits.
#[derive(Debug, Clone)]
pub struct ReviewConfig {
    /// The class of the Ingresses reviewed (`--ingress-class`); others are allowed untouched.
    pub ingress_class: String,
    /// The controller ConfigMap; other ConfigMaps are allowed untouched.
    pub config_map: Option<Key>,
    pub snippets: SnippetPolicy,
    /// The operations every hook call of one review may spend together.
    pub budget: u64,
}

/// Why a request is not an AdmissionReview this endpoint answers (HTTP 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadReview {
    #[error("not an AdmissionReview admission.k8s.io/v1")]
    NotAReview,
    #[error("the AdmissionReview has no request.uid")]
    NoUid,
}

/// The AdmissionReview answering `review` (an AdmissionReview v1 with a request).
pub fn answer(
    engine: &PolicyEngine,
    config: &ReviewConfig,
    review: &Value,
) -> Result<Value, BadReview> {
    if review["apiVersion"] != "admission.k8s.io/v1" || review["kind"] != "AdmissionReview" {
        return Err(BadReview::NotAReview);
    }
    let request = &review["request"];
    let uid = request["uid"].as_str().ok_or(BadReview::NoUid)?;
    let verdict = match request["operation"].as_str() {
        Some("CREATE" | "UPDATE") => check(engine, config, request),
        // Deleting or connecting leaves nothing to check.
        _ => Verdict::default(),
    };
    let mut response = json!({"uid": uid, "allowed": verdict.refusals.is_empty()});
    if !verdict.refusals.is_empty() {
        response["status"] = json!({
            "code": 422,
            "reason": "Invalid",
            "message": verdict.refusals.join("; "),
        });
    }
    if !verdict.warnings.is_empty() {
        response["warnings"] = json!(verdict.warnings);
    }
    Ok(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    }))
}

/// What a review found: messages that refuse the object, and warnings.
#[derive(Debug, Default)]
struct Verdict {
    refusals: Vec<String>,
    warnings: Vec<String>,
}

fn check(engine: &PolicyEngine, config: &ReviewConfig, request: &Value) -> Verdict {
    let mut object = request["object"].clone();
    // The API server fills the namespace in after admission on create.
    if object["metadata"]["namespace"].is_null() {
        if let Some(ns) = request["namespace"].as_str() {
            object["metadata"]["namespace"] = json!(ns);
        }
    }
    let object = match Object::from_value(object) {
        Ok(o) => o,
        Err(e) => {
            return Verdict {
                refusals: vec![e.to_string()],
                warnings: Vec::new(),
            };
        }
    };
    let key = object.key();
    let subject = ObjectRef::new(object.kind(), &key);
    let mut diags = Diagnostics::new();
    let mut budget = Budget::new(config.budget);
    let vocabulary = engine.vocabulary();
    match &object {
        Object::Ingress(ingress) => {
            if !of_class(ingress, &config.ingress_class) {
                return Verdict::default();
            }
            let annotations = Arc::new(ingress.metadata.annotations.clone().unwrap_or_default());
            vocabulary.check_annotations(&subject, &annotations, &mut diags);
            let source = ValueSource::annotations(subject.clone(), annotations);
            for (host, path, path_type) in paths(ingress, &subject, &mut diags) {
                let facts =
                    BTreeMap::from([("host", host), ("path", path), ("path_type", path_type)]);
                let ctx = HookContext::new(subject.clone(), vec![source.clone()], facts)
                    .with_snippets(config.snippets);
                let run = engine.run_route(&ctx, budget);
                budget = run.budget;
                diags.extend(run.diagnostics);
            }
        }
        Object::GatewayApi(api) => {
            let crate::objects::GatewayApi::HttpRoute(route) = &**api else {
                return Verdict::default();
            };
            let annotations = Arc::new(route.metadata.annotations.clone().unwrap_or_default());
            vocabulary.check_annotations(&subject, &annotations, &mut diags);
            let source = ValueSource::annotations(subject.clone(), annotations);
            let (hosts, matches) =
                crate::translate::gateway::http::review(route, &subject, &mut diags);
            for host in &hosts {
                for (path, path_type) in &matches {
                    let facts = BTreeMap::from([
                        ("host", host.clone()),
                        ("path", path.clone()),
                        ("path_type", path_type.clone()),
                    ]);
                    let ctx = HookContext::new(subject.clone(), vec![source.clone()], facts)
                        .with_snippets(config.snippets);
                    let run = engine.run_route(&ctx, budget);
                    budget = run.budget;
                    diags.extend(run.diagnostics);
                }
            }
        }
        Object::Service(service) => {
            let annotations = Arc::new(service.metadata.annotations.clone().unwrap_or_default());
            vocabulary.check_annotations(&subject, &annotations, &mut diags);
            let source = ValueSource::annotations(subject.clone(), annotations);
            let ctx = HookContext::new(subject.clone(), vec![source], BTreeMap::new())
                .with_snippets(config.snippets);
            diags.extend(engine.run_backend(&ctx, budget).diagnostics);
        }
        Object::ConfigMap(config_map) => {
            if config.config_map.as_ref() != Some(&key) {
                return Verdict::default();
            }
            let data: BTreeMap<String, String> = config_map.data.clone().unwrap_or_default();
            vocabulary.check_config_map(&subject, &data, &mut diags);
            let source = ValueSource::config_map(subject.clone(), Arc::new(data));
            let ctx = HookContext::new(subject.clone(), vec![source], BTreeMap::new())
                .with_snippets(config.snippets);
            diags.extend(engine.run_global(&ctx, budget).diagnostics);
        }
        _ => {}
    }
    let mut verdict = Verdict::default();
    for d in diags.into_sorted() {
        let text = message(&d, &subject);
        match d.severity {
            Severity::Error => verdict.refusals.push(text),
            _ => verdict.warnings.push(text),
        }
    }
    verdict
}

/// A diagnostic as the controller logs it, without the object under review (the request
/// names it), with any other subject (the script that failed).
fn message(d: &Diagnostic, reviewed: &ObjectRef) -> String {
    let mut out = match &d.subject {
        Subject::Object(o) if o == reviewed => String::new(),
        other => format!("{other}: "),
    };
    if let Some(field) = &d.field {
        out.push_str(field);
        out.push_str(": ");
    }
    out.push_str(&d.message);
    out
}

fn of_class(ingress: &k8s_openapi::api::networking::v1::Ingress, class: &str) -> bool {
    let named = ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref());
    let annotated = ingress
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubernetes.io/ingress.class"))
        .map(String::as_str);
    named.or(annotated) == Some(class)
}

/// Each path of the Ingress' rules as a route hook sees it: host, path, path type. A host,
/// path or path type that does not parse is reported as the controller reports it and left
/// out. An Ingress with no rule still gets its route hooks run once (its annotations apply to
/// its default backend).
fn paths(
    ingress: &k8s_openapi::api::networking::v1::Ingress,
    subject: &ObjectRef,
    diags: &mut Diagnostics,
) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut error = |field: String, message: String| {
        diags.object(Severity::Error, subject, field, message);
    };
    for (i, rule) in ingress
        .spec
        .iter()
        .flat_map(|s| s.rules.iter().flatten())
        .enumerate()
    {
        let host = match rule.host.as_deref() {
            None | Some("") => String::new(),
            Some(h) => match crate::values::parse_host(h) {
                Ok(h) => h,
                Err(e) => {
                    error(
                        format!("spec.rules[{i}].host"),
                        format!("{e}; rule skipped"),
                    );
                    continue;
                }
            },
        };
        for (j, path) in rule.http.iter().flat_map(|h| &h.paths).enumerate() {
            let field = format!("spec.rules[{i}].http.paths[{j}]");
            let kind = match crate::translate::routes::PathKind::parse(&path.path_type) {
                Ok(k) => k,
                Err(e) => {
                    error(format!("{field}.pathType"), format!("{e}; path skipped"));
                    continue;
                }
            };
            let raw = path
                .path
                .as_deref()
                .filter(|p| !p.is_empty())
                .unwrap_or("/");
            match crate::values::parse_path(raw) {
                Ok(p) => out.push((host.clone(), p, kind.as_str().to_string())),
                Err(e) => error(format!("{field}.path"), format!("{e}; path skipped")),
            }
        }
    }
    if out.is_empty() {
        out.push((String::new(), "/".to_string(), "Prefix".to_string()));
    }
    out
}
