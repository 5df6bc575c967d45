//! Gateway API objects (`gateway.networking.k8s.io/v1`): `GatewayClass`, `Gateway`,
//! `HTTPRoute`, `TLSRoute` and `TCPRoute` (`v1alpha2` too, their version before v1.6),
//! `ReferenceGrant` (`v1beta1` too, its served version in older CRDs), and the
//! `Namespace`s whose labels `allowedRoutes` selectors read.
//!
//! These are Portcullis' own serde structs for the fields it reads, not generated bindings:
//! the maintained `gateway-api` crate builds against another kube release than ours and
//! would bring kube into this crate. They are tolerant: unknown fields are ignored, absent
//! ones take their API default, so a newer CRD version still reads. Values are checked where
//! they are used (translation), so that a bad one is reported on its field.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::Deserialize;

use super::{Kind, ParseError, decode_ref};

/// The API group of every Gateway API kind.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// One Gateway API object, or a Namespace (only its labels are read).
#[derive(Debug, Clone, PartialEq)]
pub enum GatewayApi {
    GatewayClass(GatewayClass),
    Gateway(Gateway),
    HttpRoute(HttpRoute),
    ReferenceGrant(ReferenceGrant),
    TlsRoute(L4Route),
    TcpRoute(L4Route),
    Namespace(Namespace),
}

impl GatewayApi {
    pub fn kind(&self) -> Kind {
        match self {
            GatewayApi::GatewayClass(_) => Kind::GatewayClass,
            GatewayApi::Gateway(_) => Kind::Gateway,
            GatewayApi::HttpRoute(_) => Kind::HttpRoute,
            GatewayApi::ReferenceGrant(_) => Kind::ReferenceGrant,
            GatewayApi::TlsRoute(_) => Kind::TlsRoute,
            GatewayApi::TcpRoute(_) => Kind::TcpRoute,
            GatewayApi::Namespace(_) => Kind::Namespace,
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            GatewayApi::GatewayClass(o) => &o.metadata,
            GatewayApi::Gateway(o) => &o.metadata,
            GatewayApi::HttpRoute(o) => &o.metadata,
            GatewayApi::ReferenceGrant(o) => &o.metadata,
            GatewayApi::TlsRoute(o) | GatewayApi::TcpRoute(o) => &o.metadata,
            GatewayApi::Namespace(o) => &o.metadata,
        }
    }

    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            GatewayApi::GatewayClass(o) => &mut o.metadata,
            GatewayApi::Gateway(o) => &mut o.metadata,
            GatewayApi::HttpRoute(o) => &mut o.metadata,
            GatewayApi::ReferenceGrant(o) => &mut o.metadata,
            GatewayApi::TlsRoute(o) | GatewayApi::TcpRoute(o) => &mut o.metadata,
            GatewayApi::Namespace(o) => &mut o.metadata,
        }
    }

    /// Parses a document of `kind` (one of the Gateway API kinds or `Namespace`).
    pub fn from_value(kind: Kind, value: &serde_json::Value) -> Result<Self, ParseError> {
        let name = kind.as_str();
        Ok(match kind {
            Kind::GatewayClass => GatewayApi::GatewayClass(decode_ref(value, name)?),
            Kind::Gateway => GatewayApi::Gateway(decode_ref(value, name)?),
            Kind::HttpRoute => GatewayApi::HttpRoute(decode_ref(value, name)?),
            Kind::ReferenceGrant => GatewayApi::ReferenceGrant(decode_ref(value, name)?),
            Kind::TlsRoute => GatewayApi::TlsRoute(decode_ref(value, name)?),
            Kind::TcpRoute => GatewayApi::TcpRoute(decode_ref(value, name)?),
            _ => GatewayApi::Namespace(decode_ref(value, Kind::Namespace.as_str())?),
        })
    }

    /// The kind a Gateway API `apiVersion`/`kind` pair names, when Portcullis reads it.
    pub fn kind_of(api_version: &str, kind: &str) -> Option<Kind> {
        let version = api_version.strip_prefix(GATEWAY_GROUP)?.strip_prefix('/')?;
        match (version, kind) {
            ("v1", "GatewayClass") => Some(Kind::GatewayClass),
            ("v1", "Gateway") => Some(Kind::Gateway),
            ("v1", "HTTPRoute") => Some(Kind::HttpRoute),
            ("v1" | "v1beta1", "ReferenceGrant") => Some(Kind::ReferenceGrant),
            ("v1" | "v1alpha2", "TLSRoute") => Some(Kind::TlsRoute),
            ("v1" | "v1alpha2", "TCPRoute") => Some(Kind::TcpRoute),
            _ => None,
        }
    }
}

/// A Namespace: only its labels matter (`allowedRoutes.namespaces.selector`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct Namespace {
    pub metadata: ObjectMeta,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct GatewayClass {
    pub metadata: ObjectMeta,
    pub spec: GatewayClassSpec,
    /// As the API server holds it: the status writer compares with it.
    pub status: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayClassSpec {
    pub controller_name: String,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct Gateway {
    pub metadata: ObjectMeta,
    pub spec: GatewaySpec,
    /// As the API server holds it: the status writer compares with it.
    pub status: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewaySpec {
    pub gateway_class_name: String,
    pub listeners: Vec<Listener>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Listener {
    pub name: String,
    pub hostname: Option<String>,
    pub port: i64,
    pub protocol: String,
    pub tls: Option<ListenerTls>,
    pub allowed_routes: Option<AllowedRoutes>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListenerTls {
    /// `Terminate` (the default) or `Passthrough`.
    pub mode: Option<String>,
    pub certificate_refs: Vec<ObjectReference>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AllowedRoutes {
    pub namespaces: Option<RouteNamespaces>,
    pub kinds: Vec<GroupKind>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `Same` (the default), `All` or `Selector`.
    pub from: Option<String>,
    pub selector: Option<LabelSelector>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GroupKind {
    pub group: Option<String>,
    pub kind: String,
}

/// A reference to an object by group, kind, namespace and name (certificate refs, backend
/// refs, parent refs), with the fields of each use.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ObjectReference {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    /// Parent refs: the listener's name.
    pub section_name: Option<String>,
    /// Parent refs: the listener's port; backend refs: the Service port.
    pub port: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct HttpRoute {
    pub metadata: ObjectMeta,
    pub spec: HttpRouteSpec,
    /// As the API server holds it: the status writer compares with it.
    pub status: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteSpec {
    pub parent_refs: Vec<ObjectReference>,
    pub hostnames: Vec<String>,
    pub rules: Vec<HttpRouteRule>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteRule {
    pub matches: Vec<HttpRouteMatch>,
    pub filters: Vec<HttpRouteFilter>,
    pub backend_refs: Vec<HttpBackendRef>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteMatch {
    pub path: Option<PathMatch>,
    pub headers: Vec<ValueMatch>,
    pub query_params: Vec<ValueMatch>,
    pub method: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct PathMatch {
    /// `Exact`, `PathPrefix` (the default) or `RegularExpression`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub value: Option<String>,
}

/// A header or query parameter match.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct ValueMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub kind: String,
    pub request_header_modifier: Option<HeaderModifier>,
    pub response_header_modifier: Option<HeaderModifier>,
    pub request_redirect: Option<RequestRedirect>,
    #[serde(rename = "urlRewrite")]
    pub url_rewrite: Option<UrlRewrite>,
    pub cors: Option<CorsFilter>,
}

/// The `CORS` filter (standard since v1.6).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CorsFilter {
    pub allow_origins: Vec<String>,
    pub allow_credentials: Option<bool>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    /// Seconds; the API's default is 5.
    pub max_age: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct HeaderModifier {
    pub set: Vec<NameValue>,
    pub add: Vec<NameValue>,
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct NameValue {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RequestRedirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<i64>,
    pub status_code: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct UrlRewrite {
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(rename = "type")]
    pub kind: String,
    pub replace_full_path: Option<String>,
    pub replace_prefix_match: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpBackendRef {
    #[serde(flatten)]
    pub reference: ObjectReference,
    pub weight: Option<i64>,
    pub filters: Vec<HttpRouteFilter>,
}

/// A `TLSRoute` or a `TCPRoute`: the same fields (a TCPRoute has no `hostnames`), read
/// alike from `v1` and `v1alpha2`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct L4Route {
    pub metadata: ObjectMeta,
    pub spec: L4RouteSpec,
    /// As the API server holds it: the status writer compares with it.
    pub status: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct L4RouteSpec {
    pub parent_refs: Vec<ObjectReference>,
    /// TLSRoute only: the TLS server names routed.
    pub hostnames: Vec<String>,
    pub rules: Vec<L4RouteRule>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct L4RouteRule {
    pub backend_refs: Vec<L4BackendRef>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct L4BackendRef {
    #[serde(flatten)]
    pub reference: ObjectReference,
    pub weight: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct ReferenceGrant {
    pub metadata: ObjectMeta,
    pub spec: ReferenceGrantSpec,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct ReferenceGrantSpec {
    pub from: Vec<GrantFrom>,
    pub to: Vec<GrantTo>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct GrantFrom {
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default)]
pub struct GrantTo {
    pub group: String,
    pub kind: String,
    pub name: Option<String>,
}

impl ReferenceGrant {
    /// Whether this grant (in the namespace of the target) lets objects of `from_kind` in
    /// `from_namespace` refer to the core-group object of `to_kind` named `to_name`.
    pub fn permits(
        &self,
        from_kind: &str,
        from_namespace: &str,
        to_kind: &str,
        to_name: &str,
    ) -> bool {
        let from = self.spec.from.iter().any(|f| {
            f.group == GATEWAY_GROUP && f.kind == from_kind && f.namespace == from_namespace
        });
        let to = self.spec.to.iter().any(|t| {
            t.group.is_empty()
                && t.kind == to_kind
                && t.name
                    .as_deref()
                    .is_none_or(|n| n.is_empty() || n == to_name)
        });
        from && to
    }
}

/// The labels of an object, for selectors.
pub fn labels(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_httproute_ignoring_unknown_fields() {
        let v = serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "r", "namespace": "app"},
            "spec": {"parentRefs": [{"name": "gw", "sectionName": "http"}],
                "hostnames": ["a.example.com"],
                "futureField": {"x": 1},
                "rules": [{"matches": [{"path": {"type": "Exact", "value": "/x"},
                    "headers": [{"name": "v", "value": "2"}]}],
                    "filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "b"}}],
                    "backendRefs": [{"name": "svc", "port": 80, "weight": 3}]}]}
        });
        let GatewayApi::HttpRoute(r) = GatewayApi::from_value(Kind::HttpRoute, &v).unwrap() else {
            panic!("not a route")
        };
        assert_eq!(r.spec.parent_refs[0].section_name.as_deref(), Some("http"));
        let rule = &r.spec.rules[0];
        assert_eq!(rule.backend_refs[0].reference.port, Some(80));
        assert_eq!(rule.backend_refs[0].weight, Some(3));
        assert_eq!(rule.matches[0].headers[0].name, "v");
        assert_eq!(
            rule.filters[0]
                .url_rewrite
                .as_ref()
                .unwrap()
                .hostname
                .as_deref(),
            Some("b")
        );
    }

    #[test]
    fn kinds_by_api_version() {
        assert_eq!(
            GatewayApi::kind_of("gateway.networking.k8s.io/v1", "HTTPRoute"),
            Some(Kind::HttpRoute)
        );
        assert_eq!(
            GatewayApi::kind_of("gateway.networking.k8s.io/v1beta1", "ReferenceGrant"),
            Some(Kind::ReferenceGrant)
        );
        assert_eq!(
            GatewayApi::kind_of("gateway.networking.k8s.io/v1alpha2", "TCPRoute"),
            Some(Kind::TcpRoute)
        );
        assert_eq!(
            GatewayApi::kind_of("gateway.networking.k8s.io/v1", "TLSRoute"),
            Some(Kind::TlsRoute)
        );
        assert_eq!(
            GatewayApi::kind_of("gateway.networking.k8s.io/v1alpha2", "UDPRoute"),
            None
        );
    }
}
