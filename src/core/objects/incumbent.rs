//! The incumbent controller's `Backend`, `Defaults` and `Global` resources
//! (`ingress.v3.haproxy.org/v3`), read as sources of Portcullis settings.
//!
//! Each kind has a table of the fields of its model that map onto a setting Portcullis
//! already has (a `Backend`'s `server_timeout` is the `timeout-server` setting): the value is
//! kept as text under the setting's name, and the hooks parse it with the same typed parser
//! as an annotation or ConfigMap key, so a bad value is reported naming the field. Every
//! other field is kept by path in [`Resource::unread`], for a diagnostic.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::{Kind, ParseError};

/// How a field's value becomes a setting's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Text or a number, as written.
    Plain,
    /// Milliseconds (an integer): a duration without unit, which the duration parser reads
    /// as milliseconds.
    Millis,
    /// `enabled` or `disabled`: `true` or `false`.
    Switch,
}

/// One mapped field: its path under `spec`, the setting it feeds, how.
type Mapping = (&'static str, &'static str, Form);

const BACKEND_TIMEOUTS: &[Mapping] = &[
    ("server_timeout", "timeout-server", Form::Millis),
    ("connect_timeout", "timeout-connect", Form::Millis),
    ("queue_timeout", "timeout-queue", Form::Millis),
    ("tunnel_timeout", "timeout-tunnel", Form::Millis),
    ("check_timeout", "timeout-check", Form::Millis),
];

const BACKEND_SERVERS: &[Mapping] = &[
    ("balance.algorithm", "load-balance", Form::Plain),
    ("default_server.check", "check", Form::Switch),
    ("default_server.inter", "check-interval", Form::Millis),
    ("forwardfor.enabled", "forwarded-for", Form::Switch),
];

const DEFAULTS_ONLY: &[Mapping] = &[
    ("client_timeout", "timeout-client", Form::Millis),
    ("client_fin_timeout", "timeout-client-fin", Form::Millis),
    ("server_fin_timeout", "timeout-server-fin", Form::Millis),
    ("http_request_timeout", "timeout-http-request", Form::Millis),
    (
        "http_keep_alive_timeout",
        "timeout-http-keep-alive",
        Form::Millis,
    ),
    ("http_connection_mode", "http-connection-mode", Form::Plain),
    ("log_format", "log-format", Form::Plain),
    ("dontlognull", "dontlognull", Form::Switch),
    ("logasap", "logasap", Form::Switch),
    ("dontlog_normal", "dontlog-normal", Form::Switch),
];

const GLOBAL: &[Mapping] = &[
    ("performance_options.maxconn", "maxconn", Form::Plain),
    ("nbthread", "nbthread", Form::Plain),
    ("hard_stop_after", "hard-stop-after", Form::Millis),
];

/// The mapped fields of a kind, and the fields read without effect (the section's name and
/// mode, which the controller sets itself, as the incumbent does).
fn table(kind: Kind) -> (Vec<Mapping>, &'static [&'static str]) {
    match kind {
        Kind::Backend => (
            [BACKEND_TIMEOUTS, BACKEND_SERVERS].concat(),
            &["name", "mode"],
        ),
        Kind::Defaults => (
            [BACKEND_TIMEOUTS, BACKEND_SERVERS, DEFAULTS_ONLY].concat(),
            &["name", "mode"],
        ),
        Kind::Global => (GLOBAL.to_vec(), &[]),
        _ => (Vec::new(), &[]),
    }
}

/// Every field a kind maps, with its setting: for the documentation and its test.
pub fn mapped_fields(kind: Kind) -> Vec<(&'static str, &'static str)> {
    table(kind).0.into_iter().map(|(f, s, _)| (f, s)).collect()
}

/// A setting read from a resource: its value as text and the field it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldValue {
    pub value: String,
    /// `spec.balance.algorithm`.
    pub field: String,
}

/// A `Backend`, `Defaults` or `Global` resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub kind: Kind,
    pub metadata: ObjectMeta,
    /// By setting name (`timeout-server`).
    pub settings: BTreeMap<String, FieldValue>,
    /// Paths of the fields of `spec` that map onto no setting, in document order.
    pub unread: Vec<String>,
}

impl Resource {
    /// Reads a resource of `kind` (one of `Backend`, `Defaults`, `Global`).
    pub(super) fn from_value(kind: Kind, value: &Value) -> Result<Resource, ParseError> {
        let metadata: ObjectMeta = match value.get("metadata") {
            Some(m) => super::decode_ref(m, kind.as_str()).map_err(|e| match e {
                ParseError::Decode {
                    kind,
                    field,
                    reason,
                    ..
                } => ParseError::Decode {
                    kind,
                    object: super::document_name(value),
                    field: if field.is_empty() {
                        "metadata".to_string()
                    } else {
                        format!("metadata.{field}")
                    },
                    reason,
                },
                other => other,
            })?,
            None => ObjectMeta::default(),
        };
        let spec = value.get("spec").cloned().unwrap_or(Value::Null);
        if !matches!(spec, Value::Object(_) | Value::Null) {
            return Err(ParseError::Decode {
                kind: kind.as_str(),
                object: super::document_name(value),
                field: "spec".to_string(),
                reason: "not an object".to_string(),
            });
        }
        let (mappings, ignored) = table(kind);
        let mut settings = BTreeMap::new();
        for (path, setting, form) in &mappings {
            let Some(raw) = path.split('.').try_fold(&spec, |v, k| v.get(k)) else {
                continue;
            };
            settings.insert(
                setting.to_string(),
                FieldValue {
                    value: text(raw, *form),
                    field: format!("spec.{path}"),
                },
            );
        }
        let mut unread = Vec::new();
        unmapped(&spec, "", &mappings, ignored, &mut unread);
        Ok(Resource {
            kind,
            metadata,
            settings,
            unread,
        })
    }
}

/// A field's value as a setting's text. What does not fit the form is passed on as written,
/// for the setting's parser to refuse naming the field.
fn text(raw: &Value, form: Form) -> String {
    match (form, raw) {
        (Form::Switch, Value::String(s)) if s == "enabled" => "true".to_string(),
        (Form::Switch, Value::String(s)) if s == "disabled" => "false".to_string(),
        (_, Value::String(s)) => s.clone(),
        (_, other) => other.to_string(),
    }
}

/// Appends the paths under `value` (at `prefix`) that no mapping reads.
fn unmapped(
    value: &Value,
    prefix: &str,
    mappings: &[Mapping],
    ignored: &[&str],
    out: &mut Vec<String>,
) {
    let Value::Object(map) = value else { return };
    for (k, v) in map {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if mappings.iter().any(|(p, _, _)| *p == path) || ignored.contains(&path.as_str()) {
            continue;
        }
        let inner = format!("{path}.");
        if mappings.iter().any(|(p, _, _)| p.starts_with(&inner)) {
            unmapped(v, &path, mappings, ignored, out);
        } else {
            out.push(format!("spec.{path}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The incumbent's own example Backend, as its TCP suite applies it.
    #[test]
    fn a_backend_maps_what_it_can_and_names_the_rest() {
        let r = Resource::from_value(
            Kind::Backend,
            &json!({
                "apiVersion": "ingress.v3.haproxy.org/v3", "kind": "Backend",
                "metadata": {"name": "mybackend", "namespace": "app"},
                "spec": {
                    "name": "foo",
                    "abortonclose": "disabled",
                    "balance": {"algorithm": "leastconn"},
                    "default_server": {"check": "enabled", "inter": 2000, "verify": "none",
                        "check-sni": "example.com"},
                    "server_timeout": 30000,
                },
            }),
        )
        .unwrap();
        let get = |k: &str| {
            r.settings
                .get(k)
                .map(|f| (f.value.as_str(), f.field.as_str()))
        };
        assert_eq!(
            get("load-balance"),
            Some(("leastconn", "spec.balance.algorithm"))
        );
        assert_eq!(get("check"), Some(("true", "spec.default_server.check")));
        assert_eq!(
            get("check-interval"),
            Some(("2000", "spec.default_server.inter"))
        );
        assert_eq!(
            get("timeout-server"),
            Some(("30000", "spec.server_timeout"))
        );
        assert_eq!(
            r.unread,
            [
                "spec.abortonclose",
                "spec.default_server.check-sni",
                "spec.default_server.verify",
            ]
        );
    }

    #[test]
    fn defaults_and_global_map_onto_controller_keys() {
        let d = Resource::from_value(
            Kind::Defaults,
            &json!({"metadata": {"name": "d"}, "spec": {
                "client_timeout": 50000, "log_format": "%ci %ST", "dontlognull": "enabled",
                "redispatch": {"enabled": "enabled"}}}),
        )
        .unwrap();
        assert_eq!(d.settings["timeout-client"].value, "50000");
        assert_eq!(d.settings["log-format"].value, "%ci %ST");
        assert_eq!(d.settings["dontlognull"].value, "true");
        assert_eq!(d.unread, ["spec.redispatch"]);
        let g = Resource::from_value(
            Kind::Global,
            &json!({"metadata": {"name": "g"}, "spec": {
                "performance_options": {"maxconn": 1000, "noepoll": true},
                "nbthread": 2, "hard_stop_after": 30000, "runtime_apis": [{}]}}),
        )
        .unwrap();
        assert_eq!(g.settings["maxconn"].value, "1000");
        assert_eq!(g.settings["hard-stop-after"].value, "30000");
        assert_eq!(
            g.unread,
            ["spec.performance_options.noepoll", "spec.runtime_apis"]
        );
    }

    #[test]
    fn values_of_the_wrong_form_are_passed_on_for_their_parser_to_refuse() {
        let r = Resource::from_value(
            Kind::Backend,
            &json!({"metadata": {"name": "b"}, "spec": {"server_timeout": "soon",
                "default_server": {"check": "maybe"}}}),
        )
        .unwrap();
        assert_eq!(r.settings["timeout-server"].value, "soon");
        assert_eq!(r.settings["check"].value, "maybe");
        assert!(Resource::from_value(Kind::Backend, &json!({"spec": [1]})).is_err());
    }
}
