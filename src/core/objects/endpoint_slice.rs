//! EndpointSlices as Portcullis holds them: only what choosing a backend's servers reads.
//!
//! EndpointSlices are the most numerous objects a controller holds, and `k8s-openapi`'s type
//! keeps every field the API defines: about 3 KiB for a slice of three endpoints (each
//! endpoint's topology, hints and target reference, every label the Service's pods carry).
//! This one keeps, per slice, its identity, its Service, its address type and port numbers,
//! and per endpoint its first address, its conditions and its pod's name: a fifth of that.
//!
//! It reads and writes the API's JSON, as `k8s-openapi` does: unknown fields are ignored and
//! a missing or null list is empty.

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// An EndpointSlice (`discovery.k8s.io/v1`).
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointSlice {
    /// Name, namespace, uid and resourceVersion; the rest of the API's metadata is dropped.
    pub metadata: ObjectMeta,
    /// The Service it belongs to: its `kubernetes.io/service-name` label.
    pub service: Option<String>,
    pub address_type: AddressType,
    pub endpoints: Vec<Endpoint>,
    pub ports: Vec<EndpointPort>,
}

/// What an EndpointSlice's addresses are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressType {
    Ipv4,
    Ipv6,
    /// `FQDN`, or a type this version does not know, as written.
    Other(String),
}

impl AddressType {
    fn parse(s: String) -> Self {
        match s.as_str() {
            "IPv4" => Self::Ipv4,
            "IPv6" => Self::Ipv6,
            _ => Self::Other(s),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Ipv4 => "IPv4",
            Self::Ipv6 => "IPv6",
            Self::Other(s) => s,
        }
    }

    /// Whether the addresses are IP addresses (not DNS names).
    pub fn is_ip(&self) -> bool {
        matches!(self, Self::Ipv4 | Self::Ipv6)
    }
}

/// One endpoint of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The first address, when it is an IP address written in canonical form (the only form
    /// the API accepts for IPv4 and IPv6 slices; Rust's parser refuses other IPv4 forms, and
    /// IPv6 is written canonically again). The API gives later addresses no meaning.
    pub address: Option<IpAddr>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    /// The name its `targetRef` gives (a pod's).
    pub target: Option<Box<str>>,
}

/// One port of a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointPort {
    pub name: Option<String>,
    pub port: Option<i32>,
}

// The API's JSON, as far as it is read.

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSlice {
    #[serde(default)]
    metadata: Option<ObjectMeta>,
    #[serde(default)]
    address_type: Option<String>,
    #[serde(default)]
    endpoints: Option<Vec<WireEndpoint>>,
    #[serde(default)]
    ports: Option<Vec<WirePort>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireEndpoint {
    #[serde(default)]
    addresses: Option<Vec<String>>,
    #[serde(default)]
    conditions: Option<WireConditions>,
    #[serde(default)]
    target_ref: Option<WireTarget>,
}

#[derive(Default, Deserialize, Serialize)]
struct WireConditions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    serving: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    terminating: Option<bool>,
}

#[derive(Deserialize)]
struct WireTarget {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct WirePort {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    port: Option<i32>,
}

impl<'de> Deserialize<'de> for EndpointSlice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireSlice::deserialize(deserializer)?;
        let mut read = wire.metadata.unwrap_or_default();
        let service = read
            .labels
            .as_mut()
            .and_then(|labels| labels.remove(SERVICE_NAME_LABEL));
        let metadata = ObjectMeta {
            name: read.name,
            namespace: read.namespace,
            uid: read.uid,
            resource_version: read.resource_version,
            ..ObjectMeta::default()
        };
        let endpoints = wire
            .endpoints
            .unwrap_or_default()
            .into_iter()
            .map(|e| {
                let conditions = e.conditions.unwrap_or_default();
                Endpoint {
                    address: e
                        .addresses
                        .as_deref()
                        .and_then(<[String]>::first)
                        .and_then(|a| a.parse().ok()),
                    ready: conditions.ready,
                    serving: conditions.serving,
                    terminating: conditions.terminating,
                    target: e
                        .target_ref
                        .and_then(|t| t.name)
                        .map(String::into_boxed_str),
                }
            })
            .collect();
        let ports = wire
            .ports
            .unwrap_or_default()
            .into_iter()
            .map(|p| EndpointPort {
                name: p.name,
                port: p.port,
            })
            .collect();
        Ok(Self {
            metadata,
            service,
            address_type: AddressType::parse(wire.address_type.unwrap_or_default()),
            endpoints,
            ports,
        })
    }
}

impl Serialize for EndpointSlice {
    /// The API's JSON of what is held (so a held slice written out reads back the same).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut metadata = self.metadata.clone();
        if let Some(service) = &self.service {
            metadata.labels = Some([(SERVICE_NAME_LABEL.to_string(), service.clone())].into());
        }
        let endpoints: Vec<serde_json::Value> = self
            .endpoints
            .iter()
            .map(|e| {
                let mut out = serde_json::Map::new();
                let addresses: Vec<String> = e.address.iter().map(IpAddr::to_string).collect();
                out.insert("addresses".into(), addresses.into());
                if e.ready.is_some() || e.serving.is_some() || e.terminating.is_some() {
                    let conditions = WireConditions {
                        ready: e.ready,
                        serving: e.serving,
                        terminating: e.terminating,
                    };
                    out.insert(
                        "conditions".into(),
                        serde_json::to_value(conditions).unwrap_or_default(),
                    );
                }
                if let Some(target) = &e.target {
                    out.insert(
                        "targetRef".into(),
                        serde_json::json!({"kind": "Pod", "name": target}),
                    );
                }
                serde_json::Value::Object(out)
            })
            .collect();
        let ports: Vec<serde_json::Value> = self
            .ports
            .iter()
            .map(|p| {
                let mut out = serde_json::Map::new();
                if let Some(name) = &p.name {
                    out.insert("name".into(), name.clone().into());
                }
                if let Some(port) = p.port {
                    out.insert("port".into(), port.into());
                }
                serde_json::Value::Object(out)
            })
            .collect();
        serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": metadata,
            "addressType": self.address_type.as_str(),
            "endpoints": endpoints,
            "ports": ports,
        })
        .serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(value: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn keeps_what_choosing_servers_reads_and_drops_the_rest() {
        let s = slice(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": "web-abc", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                "labels": {SERVICE_NAME_LABEL: "web", "app": "web",
                           "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "s-1"}]
            },
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1", "10.0.0.9"],
                 "conditions": {"ready": true, "serving": true, "terminating": false},
                 "targetRef": {"kind": "Pod", "name": "web-0", "namespace": "ns", "uid": "p-1"},
                 "nodeName": "n1", "zone": "z1", "hints": {"forZones": [{"name": "z1"}]}},
                {"addresses": ["010.0.0.2"], "conditions": {"ready": false}},
                {"addresses": [], "conditions": null},
                {"addresses": ["2001:DB8::1"]}
            ],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"}, {}]
        }));
        assert_eq!(s.metadata.name.as_deref(), Some("web-abc"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(s.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(s.metadata.labels, None);
        assert_eq!(s.metadata.annotations, None);
        assert_eq!(s.metadata.owner_references, None);
        assert_eq!(s.service.as_deref(), Some("web"));
        assert_eq!(s.address_type, AddressType::Ipv4);
        assert_eq!(
            s.endpoints,
            vec![
                Endpoint {
                    address: Some("10.0.0.1".parse().unwrap()),
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                    target: Some("web-0".into()),
                },
                // Not canonical: no address, as the servers' choice skipped it before.
                Endpoint {
                    address: None,
                    ready: Some(false),
                    serving: None,
                    terminating: None,
                    target: None,
                },
                Endpoint {
                    address: None,
                    ready: None,
                    serving: None,
                    terminating: None,
                    target: None,
                },
                Endpoint {
                    address: Some("2001:db8::1".parse().unwrap()),
                    ready: None,
                    serving: None,
                    terminating: None,
                    target: None,
                },
            ]
        );
        assert_eq!(
            s.ports,
            vec![
                EndpointPort {
                    name: Some("http".into()),
                    port: Some(8080),
                },
                EndpointPort {
                    name: None,
                    port: None,
                },
            ]
        );
    }

    #[test]
    fn missing_or_null_lists_are_empty_and_other_address_types_are_kept_as_written() {
        let s = slice(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "ext", "namespace": "ns"},
            "addressType": "FQDN",
            "endpoints": null
        }));
        assert_eq!(s.address_type, AddressType::Other("FQDN".into()));
        assert!(!s.address_type.is_ip());
        assert!(s.endpoints.is_empty());
        assert!(s.ports.is_empty());
        assert_eq!(s.service, None);
    }

    #[test]
    fn a_field_of_the_wrong_type_is_an_error_naming_it() {
        let err = serde_json::from_value::<EndpointSlice>(json!({
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": "yes"}}]
        }))
        .unwrap_err()
        .to_string();
        assert!(err.contains("invalid type"), "{err}");
        let err = serde_json::from_value::<EndpointSlice>(json!({
            "addressType": "IPv4", "ports": [{"port": "http"}]
        }))
        .unwrap_err()
        .to_string();
        assert!(err.contains("invalid type"), "{err}");
    }

    #[test]
    fn written_out_it_reads_back_the_same() {
        let s = slice(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abc", "namespace": "ns", "uid": "u-1",
                         "labels": {SERVICE_NAME_LABEL: "web", "app": "web"}},
            "addressType": "IPv6",
            "endpoints": [
                {"addresses": ["fd00::1"], "conditions": {"serving": true, "terminating": true},
                 "targetRef": {"kind": "Pod", "name": "web-1"}},
                {"addresses": ["fd00::2"]}
            ],
            "ports": [{"name": "http", "port": 8080}]
        }));
        let written = serde_json::to_value(&s).unwrap();
        assert_eq!(
            written["metadata"]["labels"],
            json!({SERVICE_NAME_LABEL: "web"})
        );
        assert_eq!(slice(written), s);
    }
}
