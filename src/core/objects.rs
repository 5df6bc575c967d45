//! The Kubernetes objects Portcullis reads, parsed from JSON values into typed objects.
//!
//! Both sources (a directory of manifests, the Kubernetes API) produce [`Object`]s. Names and
//! namespaces are validated here, once, because they later become parts of backend names and
//! file names.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

mod endpoint_slice;
pub mod gateway;
pub mod incumbent;
mod service;
mod tcp;

pub use endpoint_slice::{AddressType, Endpoint, EndpointPort, EndpointSlice, SERVICE_NAME_LABEL};
pub use gateway::GatewayApi;
pub use incumbent::Resource;
pub use service::{LoadBalancerAddress, Service, ServicePort};
pub use tcp::{
    Tcp, TcpAcl, TcpBind, TcpBinds, TcpFrontend, TcpRequestRule, TcpService, TcpSwitchingRule,
    TcpTarget,
};

/// API group and version of the TCP custom resource and of the incumbent's Backend, Defaults
/// and Global resources (shared with the incumbent controller).
pub const TCP_API_VERSION: &str = "ingress.v3.haproxy.org/v3";

/// The kinds of object the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Kind {
    Ingress,
    IngressClass,
    Service,
    EndpointSlice,
    Secret,
    ConfigMap,
    Pod,
    #[serde(rename = "TCP")]
    Tcp,
    /// The incumbent's `Backend` resource (same API group as TCP).
    Backend,
    /// The incumbent's `Defaults` resource.
    Defaults,
    /// The incumbent's `Global` resource.
    Global,
    GatewayClass,
    Gateway,
    #[serde(rename = "HTTPRoute")]
    HttpRoute,
    ReferenceGrant,
    #[serde(rename = "TLSRoute")]
    TlsRoute,
    #[serde(rename = "TCPRoute")]
    TcpRoute,
    /// Read for the labels `allowedRoutes` selectors match.
    Namespace,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 18] = [
        Kind::Ingress,
        Kind::IngressClass,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Secret,
        Kind::ConfigMap,
        Kind::Pod,
        Kind::Tcp,
        Kind::Backend,
        Kind::Defaults,
        Kind::Global,
        Kind::GatewayClass,
        Kind::Gateway,
        Kind::HttpRoute,
        Kind::ReferenceGrant,
        Kind::TlsRoute,
        Kind::TcpRoute,
        Kind::Namespace,
    ];

    /// The Gateway API kinds (and Namespace, which their selectors read).
    pub const GATEWAY_API: [Kind; 7] = [
        Kind::GatewayClass,
        Kind::Gateway,
        Kind::HttpRoute,
        Kind::ReferenceGrant,
        Kind::TlsRoute,
        Kind::TcpRoute,
        Kind::Namespace,
    ];

    /// The incumbent's resources read as sources of settings.
    pub const RESOURCES: [Kind; 3] = [Kind::Backend, Kind::Defaults, Kind::Global];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Ingress => "Ingress",
            Kind::IngressClass => "IngressClass",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
            Kind::Pod => "Pod",
            Kind::Tcp => "TCP",
            Kind::Backend => "Backend",
            Kind::Defaults => "Defaults",
            Kind::Global => "Global",
            Kind::GatewayClass => "GatewayClass",
            Kind::Gateway => "Gateway",
            Kind::HttpRoute => "HTTPRoute",
            Kind::ReferenceGrant => "ReferenceGrant",
            Kind::TlsRoute => "TLSRoute",
            Kind::TcpRoute => "TCPRoute",
            Kind::Namespace => "Namespace",
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(
            self,
            Kind::IngressClass | Kind::GatewayClass | Kind::Namespace
        )
    }
}

/// A namespace/name pair; the namespace is empty for cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `NAMESPACE/NAME` as given on the command line.
    pub fn parse_namespaced(s: &str) -> Result<Self, String> {
        let (ns, name) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not of the form NAMESPACE/NAME"))?;
        validate_dns_label(ns).map_err(|e| format!("namespace in {s:?}: {e}"))?;
        validate_dns_subdomain(name).map_err(|e| format!("name in {s:?}: {e}"))?;
        Ok(Self::new(ns, name))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}", self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// Names an object in messages: `Ingress default/web`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectRef {
    pub fn new(kind: Kind, key: &Key) -> Self {
        Self {
            kind,
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind.as_str(), self.name)
        } else {
            write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
        }
    }
}

/// A typed object of one of the watched kinds. Objects are shared, never mutated.
#[derive(Debug, Clone)]
pub enum Object {
    Ingress(Arc<Ingress>),
    IngressClass(Arc<IngressClass>),
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Secret(Arc<Secret>),
    ConfigMap(Arc<ConfigMap>),
    Pod(Arc<Pod>),
    Tcp(Arc<Tcp>),
    /// A `Backend`, `Defaults` or `Global` resource.
    Resource(Arc<Resource>),
    /// A Gateway API object or a Namespace.
    GatewayApi(Arc<GatewayApi>),
}

/// Why a document could not become an [`Object`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("missing field {0}")]
    MissingField(&'static str),
    #[error("{kind} {name:?}: {field}: {reason}")]
    InvalidName {
        kind: &'static str,
        name: String,
        field: &'static str,
        reason: String,
    },
    /// A field of the wrong shape: `field` is its path in the document (`spec[0].frontend`),
    /// empty for the document itself.
    #[error("{kind} {object}: {}{reason}", field_prefix(field))]
    Decode {
        kind: &'static str,
        object: String,
        field: String,
        reason: String,
    },
    /// A kind Portcullis does not read; callers skip these quietly.
    #[error("kind {0} is not read by Portcullis")]
    UnsupportedKind(String),
}

impl Object {
    /// The address of the shared object: tells apart objects held at the same time without
    /// comparing them (two held objects never share one).
    pub fn address(&self) -> usize {
        fn of<T>(o: &std::sync::Arc<T>) -> usize {
            std::sync::Arc::as_ptr(o).cast::<()>() as usize
        }
        match self {
            Object::Ingress(o) => of(o),
            Object::IngressClass(o) => of(o),
            Object::Service(o) => of(o),
            Object::EndpointSlice(o) => of(o),
            Object::Secret(o) => of(o),
            Object::ConfigMap(o) => of(o),
            Object::Pod(o) => of(o),
            Object::Tcp(o) => of(o),
            Object::Resource(o) => of(o),
            Object::GatewayApi(o) => of(o),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Object::Ingress(_) => Kind::Ingress,
            Object::IngressClass(_) => Kind::IngressClass,
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::Secret(_) => Kind::Secret,
            Object::ConfigMap(_) => Kind::ConfigMap,
            Object::Pod(_) => Kind::Pod,
            Object::Tcp(_) => Kind::Tcp,
            Object::Resource(o) => o.kind,
            Object::GatewayApi(o) => o.kind(),
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Ingress(o) => &o.metadata,
            Object::IngressClass(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::EndpointSlice(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
            Object::Tcp(o) => &o.metadata,
            Object::Resource(o) => &o.metadata,
            Object::GatewayApi(o) => o.metadata(),
        }
    }

    pub fn key(&self) -> Key {
        let m = self.metadata();
        Key::new(
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        )
    }

    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef::new(self.kind(), &self.key())
    }

    /// Parses one decoded manifest document. Namespaced objects without a namespace are put in
    /// `default`, as kubectl does. Names are validated here so that nothing downstream has to.
    #[expect(
        clippy::needless_pass_by_value,
        reason = "a document is handed over whole; it is read in place so that one that fails can be read again for the path of its error"
    )]
    pub fn from_value(value: serde_json::Value) -> Result<Object, ParseError> {
        let api_version = value
            .get("apiVersion")
            .and_then(|v| v.as_str())
            .ok_or(ParseError::MissingField("apiVersion"))?
            .to_string();
        let kind = value
            .get("kind")
            .and_then(|v| v.as_str())
            .ok_or(ParseError::MissingField("kind"))?
            .to_string();
        let mut object = match (api_version.as_str(), kind.as_str()) {
            ("networking.k8s.io/v1", "Ingress") => Object::Ingress(decode(&value, "Ingress")?),
            ("networking.k8s.io/v1", "IngressClass") => {
                Object::IngressClass(decode(&value, "IngressClass")?)
            }
            ("v1", "Service") => Object::Service(decode(&value, "Service")?),
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                Object::EndpointSlice(decode(&value, "EndpointSlice")?)
            }
            ("v1", "Secret") => Object::Secret(decode(&value, "Secret")?),
            ("v1", "ConfigMap") => Object::ConfigMap(decode(&value, "ConfigMap")?),
            ("v1", "Pod") => Object::Pod(decode(&value, "Pod")?),
            (TCP_API_VERSION, "TCP") => Object::Tcp(Arc::new(Tcp::from_value(&value)?)),
            (TCP_API_VERSION, "Backend") => {
                Object::Resource(Arc::new(Resource::from_value(Kind::Backend, &value)?))
            }
            (TCP_API_VERSION, "Defaults") => {
                Object::Resource(Arc::new(Resource::from_value(Kind::Defaults, &value)?))
            }
            (TCP_API_VERSION, "Global") => {
                Object::Resource(Arc::new(Resource::from_value(Kind::Global, &value)?))
            }
            ("v1", "Namespace") => {
                Object::GatewayApi(Arc::new(GatewayApi::from_value(Kind::Namespace, &value)?))
            }
            (v, k) => match GatewayApi::kind_of(v, k) {
                Some(kind) => Object::GatewayApi(Arc::new(GatewayApi::from_value(kind, &value)?)),
                None => return Err(ParseError::UnsupportedKind(format!("{api_version}/{kind}"))),
            },
        };
        object.normalize()?;
        Ok(object)
    }

    /// Fills in the default namespace, strips managed fields and validates names.
    fn normalize(&mut self) -> Result<(), ParseError> {
        let kind = self.kind();
        let meta = match self {
            Object::Ingress(o) => &mut Arc::make_mut(o).metadata,
            Object::IngressClass(o) => &mut Arc::make_mut(o).metadata,
            Object::Service(o) => &mut Arc::make_mut(o).metadata,
            Object::EndpointSlice(o) => &mut Arc::make_mut(o).metadata,
            Object::Secret(o) => &mut Arc::make_mut(o).metadata,
            Object::ConfigMap(o) => &mut Arc::make_mut(o).metadata,
            Object::Pod(o) => &mut Arc::make_mut(o).metadata,
            Object::Tcp(o) => &mut Arc::make_mut(o).metadata,
            Object::Resource(o) => &mut Arc::make_mut(o).metadata,
            Object::GatewayApi(o) => Arc::make_mut(o).metadata_mut(),
        };
        meta.managed_fields = None;
        let name = meta
            .name
            .clone()
            .ok_or(ParseError::MissingField("metadata.name"))?;
        let invalid = |field: &'static str, reason: String| ParseError::InvalidName {
            kind: kind.as_str(),
            name: name.clone(),
            field,
            reason,
        };
        // Service names become part of backend names: they must be single DNS labels (no
        // dots), as the API server enforces. Other names are DNS-1123 subdomains.
        match kind {
            Kind::Service => validate_dns_label(&name),
            _ => validate_dns_subdomain(&name),
        }
        .map_err(|e| invalid("metadata.name", e))?;
        if kind.namespaced() {
            let ns = meta.namespace.get_or_insert_with(|| "default".to_string());
            validate_dns_label(ns).map_err(|e| invalid("metadata.namespace", e))?;
        } else {
            meta.namespace = None;
        }
        Ok(())
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
    kind: &'static str,
) -> Result<Arc<T>, ParseError> {
    decode_ref(value, kind).map(Arc::new)
}

/// `value` as a `T`; an error names the object and the path of the field that failed.
pub(crate) fn decode_ref<T: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
    kind: &'static str,
) -> Result<T, ParseError> {
    // Tracking the path costs on every field, so only a document that fails is read again
    // with it.
    T::deserialize(value).map_err(|plain| {
        let (field, reason) = match serde_path_to_error::deserialize::<_, T>(value) {
            Err(e) => (e.path().to_string(), e.inner().to_string()),
            Ok(_) => (String::new(), plain.to_string()),
        };
        ParseError::Decode {
            kind,
            object: document_name(value),
            field: if field == "." { String::new() } else { field },
            reason,
        }
    })
}

/// `namespace/name` of a document as written, for messages about a document that is not an
/// object yet.
pub(crate) fn document_name(value: &serde_json::Value) -> String {
    let meta = value.get("metadata");
    let field = |k: &str| meta.and_then(|m| m.get(k)).and_then(|v| v.as_str());
    match (field("namespace"), field("name")) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.to_string(),
        _ => "(unnamed)".to_string(),
    }
}

fn field_prefix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("field {field}: ")
    }
}

/// A DNS-1123 label: at most 63 lowercase alphanumerics or '-', starting and ending alphanumeric.
pub fn validate_dns_label(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 63 {
        return Err(format!("{s:?} must be 1 to 63 characters"));
    }
    let ok_chars = s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ends_ok = !s.starts_with('-') && !s.ends_with('-');
    if ok_chars && ends_ok {
        Ok(())
    } else {
        Err(format!(
            "{s:?} is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit)"
        ))
    }
}

/// A DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn validate_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err(format!("{s:?} must be 1 to 253 characters"));
    }
    for label in s.split('.') {
        validate_dns_label(label).map_err(|_| {
            format!("{s:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.')")
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_of_the_wrong_shape_is_named_with_its_object_and_path() {
        let tcp = serde_json::json!({
            "apiVersion": TCP_API_VERSION, "kind": "TCP",
            "metadata": {"name": "bad", "namespace": "shop"},
            "spec": [{"name": "a", "frontend": {"name": "fa",
                      "binds": {"v4": {"name": "v4", "port": "notaport"}}},
                      "service": {"name": "svc", "port": 80}}]
        });
        let err = Object::from_value(tcp).unwrap_err().to_string();
        assert!(
            err.starts_with("TCP shop/bad: field spec[0].frontend.binds.v4.port: invalid type"),
            "{err}"
        );
        let ingress = serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web"},
            "spec": {"rules": [{"host": "a.example", "http": {"paths": "/"}}]}
        });
        let err = Object::from_value(ingress).unwrap_err().to_string();
        assert!(
            err.starts_with("Ingress web: field spec.rules[0].http.paths: invalid type"),
            "{err}"
        );
        let backend = serde_json::json!({
            "apiVersion": TCP_API_VERSION, "kind": "Backend",
            "metadata": {"name": "b", "namespace": "shop"}, "spec": ["no"]
        });
        let err = Object::from_value(backend).unwrap_err().to_string();
        assert_eq!(err, "Backend shop/b: field spec: not an object");
    }

    #[test]
    fn parses_ingress_and_defaults_namespace() {
        let v = serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web", "managedFields": [{"manager": "kubectl"}]},
            "spec": {}
        });
        let o = Object::from_value(v).unwrap();
        assert_eq!(o.object_ref().to_string(), "Ingress default/web");
        assert!(o.metadata().managed_fields.is_none());
    }

    #[test]
    fn rejects_names_that_could_break_out() {
        let v = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web\nbackend x", "namespace": "default"}
        });
        let err = Object::from_value(v).unwrap_err();
        assert!(err.to_string().contains("metadata.name"), "{err}");
    }

    #[test]
    fn parses_tcp_resource() {
        let v = serde_json::json!({
            "apiVersion": TCP_API_VERSION, "kind": "TCP",
            "metadata": {"name": "app", "namespace": "app"},
            "spec": [{"name": "tcp-app", "frontend": {"name": "fe", "binds": [
                {"name": "b", "port": 2053, "ssl": true, "ssl_certificate": "app-tls"}]},
                "service": {"name": "app", "port": 8443}}]
        });
        let Object::Tcp(tcp) = Object::from_value(v).unwrap() else {
            panic!("not a TCP object")
        };
        assert_eq!(tcp.spec[0].frontend.binds.entries[0].1.port, Some(2053));
    }

    #[test]
    fn unsupported_kinds_are_named() {
        let v = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "x"}});
        assert_eq!(
            Object::from_value(v).unwrap_err(),
            ParseError::UnsupportedKind("apps/v1/Deployment".into())
        );
    }
}
