//! The CustomResourceDefinition of the TCP resource, generated from the Rust types that read it.
//!
//! `portcullis crd` prints it; `deploy/base/crd-tcp.yaml` is that output, committed, and
//! `tests/crd.rs` fails when the two differ. The schema is not written by hand: the shape of a
//! `spec` entry is traced from [`TcpService`]'s serde `Deserialize` implementation with
//! `serde-reflection` (field names as serde spells them, their types, nesting), and which
//! fields are required is found by asking serde itself: a field is required when a complete
//! sample document without it does not deserialize. So a field added to the types, renamed or
//! given `#[serde(default)]` changes the output.
//!
//! Every object in the schema keeps unknown fields (`x-kubernetes-preserve-unknown-fields`),
//! because serde ignores them too (the types do not deny unknown fields; translation reports
//! them), and because the resource is shared with haproxytech/kubernetes-ingress, whose TCP
//! objects have frontend settings Portcullis does not read: the API server must not prune
//! them. A type whose documents take more than one shape (the binds: a map by name or a list)
//! is an untyped node that keeps what it holds, so the schema stays a superset of the
//! incumbent's.
//!
//! kube's `CustomResource` derive with `schemars` is not used: its root schema requires
//! `spec` (a TCP object without one is accepted today) and drops `apiVersion`, `kind` and
//! `metadata`, it adds `format: uint16` and float bounds (`maximum: 65535.0`), and it would
//! rebuild serde, tokio and the kube crates with eleven more crates for one schema.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use serde_reflection::{ContainerFormat, Format, Registry, Tracer, TracerConfig};

use crate::objects::{TCP_API_VERSION, Tcp, TcpService};

/// The resource's API group.
pub const TCP_GROUP: &str = "ingress.v3.haproxy.org";
/// The resource's version.
pub const TCP_VERSION: &str = "v3";
/// The resource's plural name.
pub const TCP_PLURAL: &str = "tcps";

/// The first lines of the printed YAML.
const HEADER: &str = "\
# The TCP custom resource (ingress.v3.haproxy.org/v3), generated from the Rust types in
# src/core/objects.rs by `portcullis crd`. Do not edit: regenerate with
#   cargo run -q -- crd > deploy/base/crd-tcp.yaml
# (tests/crd.rs fails while this file differs from the output).
";

/// Why a schema could not be generated: the types use a serde shape this generator does not
/// translate. It fails rather than guess.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CrdError {
    #[error("tracing the serde shape failed: {0}")]
    Trace(String),
    #[error("{0}: no OpenAPI schema for this serde shape")]
    Unsupported(String),
    #[error("writing the CRD as YAML failed: {0}")]
    Yaml(String),
}

/// The CRD of the TCP resource as YAML, with a header comment: what `portcullis crd` prints.
pub fn tcp_crd_yaml() -> Result<String, CrdError> {
    let crd = tcp_crd()?;
    let yaml = serde_saphyr::to_string(&crd).map_err(|e| CrdError::Yaml(e.to_string()))?;
    Ok(format!("{HEADER}{yaml}"))
}

/// The CRD of the TCP resource as a JSON value.
pub fn tcp_crd() -> Result<Value, CrdError> {
    debug_assert_eq!(TCP_API_VERSION, format!("{TCP_GROUP}/{TCP_VERSION}"));
    let item = schema_of::<TcpService>()?;
    Ok(crd(&item))
}

/// The CRD around `item`, the schema of one entry of `spec` (a TCP object's `spec` is a list,
/// as in haproxytech/kubernetes-ingress, see [`Tcp`]).
fn crd(item: &Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{TCP_PLURAL}.{TCP_GROUP}"),
            "labels": {"app.kubernetes.io/name": "portcullis"},
        },
        "spec": {
            "group": TCP_GROUP,
            "names": {
                "kind": "TCP",
                "listKind": "TCPList",
                "plural": TCP_PLURAL,
                "singular": "tcp",
            },
            "scope": "Namespaced",
            "versions": [{
                "name": TCP_VERSION,
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "description": "TCP services: each a frontend with its binds, and the Service it forwards to.",
                    "type": "object",
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": {"type": "array", "items": item},
                    },
                }},
            }],
        },
    })
}

/// The OpenAPI v3 schema (as the Kubernetes structural-schema subset) of the serde shape of
/// `T`, a struct.
pub fn schema_of<T: DeserializeOwned>() -> Result<Value, CrdError> {
    let mut tracer = Tracer::new(TracerConfig::default());
    let (format, _) = tracer
        .trace_simple_type::<T>()
        .map_err(|e| CrdError::Trace(e.to_string()))?;
    let registry = tracer
        .registry()
        .map_err(|e| CrdError::Trace(e.to_string()))?;
    let sample = sample(&registry, &format)?;
    let mut schema = schema(&registry, &format)?;
    mark_required::<T>(&registry, &format, &sample, &mut Vec::new(), &mut schema)?;
    Ok(schema)
}

/// The schema of `format`, without `required` lists (see [`mark_required`]).
fn schema(registry: &Registry, format: &Format) -> Result<Value, CrdError> {
    let integer = |min: i64, max: i64| json!({"type": "integer", "minimum": min, "maximum": max});
    Ok(match format {
        Format::Bool => json!({"type": "boolean"}),
        Format::Str | Format::Char => json!({"type": "string"}),
        Format::U8 => integer(0, u8::MAX.into()),
        Format::U16 => integer(0, u16::MAX.into()),
        Format::U32 => integer(0, u32::MAX.into()),
        Format::I8 => integer(i8::MIN.into(), i8::MAX.into()),
        Format::I16 => integer(i16::MIN.into(), i16::MAX.into()),
        Format::I32 => json!({"type": "integer", "format": "int32"}),
        Format::I64 => json!({"type": "integer", "format": "int64"}),
        Format::F32 | Format::F64 => json!({"type": "number"}),
        Format::Option(inner) => {
            let mut s = schema(registry, inner)?;
            if let Value::Object(m) = &mut s {
                m.insert("nullable".into(), Value::Bool(true));
            }
            s
        }
        Format::Seq(inner) => json!({"type": "array", "items": schema(registry, inner)?}),
        Format::Map { key, value } if **key == Format::Str => json!({
            "type": "object",
            "additionalProperties": schema(registry, value)?,
        }),
        Format::TypeName(name) => match registry.get(name) {
            _ if open_shape(name).is_some() => json!({
                "description": open_shape(name),
                "x-kubernetes-preserve-unknown-fields": true,
            }),
            Some(ContainerFormat::Struct(fields)) => {
                let mut properties = Map::new();
                for field in fields {
                    properties.insert(field.name.clone(), schema(registry, &field.value)?);
                }
                json!({
                    "type": "object",
                    "properties": properties,
                    "x-kubernetes-preserve-unknown-fields": true,
                })
            }
            Some(ContainerFormat::NewTypeStruct(inner)) => schema(registry, inner)?,
            _ => return Err(CrdError::Unsupported(name.clone())),
        },
        other => return Err(CrdError::Unsupported(format!("{other:?}"))),
    })
}

/// Types whose documents take more than one JSON shape, which a structural schema cannot
/// state: their node has no type and keeps whatever it holds, described in words; their
/// reader checks it.
const OPEN_SHAPES: &[(&str, &str)] = &[(
    "TcpBinds",
    "The binds: a map of binds by name (each with name, address, port, ssl, ssl_certificate, alpn, v4v6, v6only, accept_proxy), or a list of such binds.",
)];

fn open_shape(name: &str) -> Option<&'static str> {
    OPEN_SHAPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, description)| *description)
}

/// A complete sample document of `format`: every field present, every list one entry long.
fn sample(registry: &Registry, format: &Format) -> Result<Value, CrdError> {
    Ok(match format {
        Format::Bool => Value::Bool(true),
        Format::Str => json!("x"),
        Format::Char => json!("x"),
        Format::U8 | Format::U16 | Format::U32 | Format::I8 | Format::I16 | Format::I32 => {
            json!(1)
        }
        Format::I64 | Format::F32 | Format::F64 => json!(1),
        Format::Option(inner) => sample(registry, inner)?,
        Format::Seq(inner) => Value::Array(vec![sample(registry, inner)?]),
        Format::Map { .. } => Value::Object(Map::new()),
        Format::TypeName(name) => match registry.get(name) {
            Some(ContainerFormat::Struct(fields)) => {
                let mut m = Map::new();
                for field in fields {
                    m.insert(field.name.clone(), sample(registry, &field.value)?);
                }
                Value::Object(m)
            }
            Some(ContainerFormat::NewTypeStruct(inner)) => sample(registry, inner)?,
            _ => return Err(CrdError::Unsupported(name.clone())),
        },
        other => return Err(CrdError::Unsupported(format!("{other:?}"))),
    })
}

/// One step into a sample document: a field of an object, or the first entry of a list.
#[derive(Debug, Clone)]
enum Step {
    Field(String),
    First,
}

/// Adds `required` to every object schema under `schema` (found at `path` in `sample`): the
/// fields without which the sample does not deserialize as `T`.
fn mark_required<T: DeserializeOwned>(
    registry: &Registry,
    format: &Format,
    sample: &Value,
    path: &mut Vec<Step>,
    schema: &mut Value,
) -> Result<(), CrdError> {
    match format {
        Format::Option(inner) => mark_required::<T>(registry, inner, sample, path, schema),
        Format::Seq(inner) => {
            path.push(Step::First);
            let items = schema.get_mut("items").ok_or_else(|| missing(path))?;
            let r = mark_required::<T>(registry, inner, sample, path, items);
            path.pop();
            r
        }
        Format::TypeName(name) => match registry.get(name) {
            Some(ContainerFormat::Struct(fields)) => {
                let mut required = Vec::new();
                for field in fields {
                    let mut without = sample.clone();
                    remove_at(&mut without, path, &field.name);
                    if serde_json::from_value::<T>(without).is_err() {
                        required.push(Value::String(field.name.clone()));
                    }
                    path.push(Step::Field(field.name.clone()));
                    let property = schema
                        .get_mut("properties")
                        .and_then(|p| p.get_mut(&field.name))
                        .ok_or_else(|| missing(path))?;
                    let r = mark_required::<T>(registry, &field.value, sample, path, property);
                    path.pop();
                    r?;
                }
                if !required.is_empty() {
                    if let Value::Object(m) = schema {
                        m.insert("required".into(), Value::Array(required));
                    }
                }
                Ok(())
            }
            Some(ContainerFormat::NewTypeStruct(inner)) => {
                mark_required::<T>(registry, inner, sample, path, schema)
            }
            _ => Err(CrdError::Unsupported(name.clone())),
        },
        _ => Ok(()),
    }
}

fn missing(path: &[Step]) -> CrdError {
    CrdError::Trace(format!("schema and sample disagree at {path:?}"))
}

/// Removes `field` from the object at `path` in `value`.
fn remove_at(value: &mut Value, path: &[Step], field: &str) {
    let mut at = value;
    for step in path {
        let next = match step {
            Step::Field(name) => at.get_mut(name.as_str()),
            Step::First => at.get_mut(0),
        };
        match next {
            Some(v) => at = v,
            None => return,
        }
    }
    if let Value::Object(m) = at {
        m.remove(field);
    }
}

/// The top-level keys a TCP object serializes with (`metadata` and `spec`), which the CRD's
/// top-level schema lists beside `apiVersion` and `kind`.
pub fn tcp_top_level_keys() -> Vec<String> {
    let tcp = Tcp {
        metadata: Default::default(),
        spec: Vec::new(),
        unread: Vec::new(),
    };
    match serde_json::to_value(&tcp) {
        Ok(Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    /// The shape `TcpBind` has, and the same with one more field.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Bind {
        port: u16,
        #[serde(default)]
        name: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct BindWithOneMoreField {
        port: u16,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        backlog: Option<u32>,
    }

    #[test]
    fn adding_a_field_to_a_type_changes_the_schema() {
        let before = schema_of::<Bind>().unwrap();
        let after = schema_of::<BindWithOneMoreField>().unwrap();
        assert_ne!(before, after);
        assert_eq!(
            after["properties"]["backlog"],
            json!({"type": "integer", "minimum": 0, "maximum": u32::MAX, "nullable": true})
        );
        assert!(before["properties"].get("backlog").is_none());
        // And so the CRD around it, which is what the drift test compares.
        let yaml = |s| serde_saphyr::to_string(&crd(&s)).unwrap();
        assert_ne!(yaml(before), yaml(after));
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        #[serde(default)]
        inner: Vec<Inner>,
        #[serde(rename = "renamed-flag")]
        flag: Option<bool>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        port: u16,
        #[serde(default)]
        count: u8,
    }

    #[test]
    fn required_fields_are_the_ones_serde_requires() {
        let s = schema_of::<Outer>().unwrap();
        // `inner` has a default; an Option may be missing; renames are serde's names.
        assert_eq!(s["required"], json!(["name"]));
        assert!(s["properties"].get("renamed-flag").is_some());
        // Inside a list: `count` has a default, `port` does not.
        assert_eq!(
            s["properties"]["inner"]["items"]["required"],
            json!(["port"])
        );
    }

    #[test]
    fn the_tcp_schema_matches_the_types() {
        let crd = tcp_crd().unwrap();
        let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let item = &root["properties"]["spec"]["items"];
        assert_eq!(item["required"], json!(["name", "frontend", "service"]));
        // Binds are a map or a list: an open node, checked by their reader.
        let binds = &item["properties"]["frontend"]["properties"]["binds"];
        assert_eq!(binds["x-kubernetes-preserve-unknown-fields"], json!(true));
        assert!(binds.get("type").is_none());
        let service = &item["properties"]["services"]["items"];
        assert_eq!(service["required"], json!(["name", "port"]));
        assert_eq!(service["properties"]["port"]["maximum"], json!(65535));
        for key in tcp_top_level_keys() {
            assert!(root["properties"].get(&key).is_some(), "{key}");
        }
        assert_eq!(tcp_top_level_keys(), ["metadata", "spec"]);
    }

    #[test]
    fn the_crd_is_a_valid_custom_resource_definition() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crd: CustomResourceDefinition = serde_json::from_value(tcp_crd().unwrap()).unwrap();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("tcps.ingress.v3.haproxy.org")
        );
        assert_eq!(crd.spec.versions[0].name, "v3");
    }

    #[test]
    fn unsupported_shapes_are_refused() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        enum Mode {
            A,
            B(u8),
        }
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct WithEnum {
            mode: Mode,
        }
        assert!(schema_of::<WithEnum>().is_err());
    }
}
