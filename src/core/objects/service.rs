//! Services as Portcullis holds them: only what routing to a Service and publishing its
//! address read.
//!
//! `k8s-openapi`'s Service keeps every field the API defines: 824 bytes inline (this one 504,
//! most of it the metadata), and a cluster's Services carry selectors, IP families, session
//! affinity, labels and the like, on the heap, that nothing here reads. This one keeps its
//! identity and annotations (the scripts read them), its type, external name, cluster IP,
//! external IPs and ports, and its load balancer's addresses.
//!
//! It reads and writes the API's JSON, as `k8s-openapi` does: unknown fields are ignored and
//! a missing or null list is empty; a port without its number is refused.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A Service (`v1`).
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    /// Name, namespace, uid, resourceVersion and annotations; the rest of the API's metadata
    /// is dropped.
    pub metadata: ObjectMeta,
    /// `spec.type` (`ClusterIP` when unset).
    pub type_: Option<String>,
    /// `spec.externalName`, for an `ExternalName` Service.
    pub external_name: Option<String>,
    /// `spec.clusterIP` (`None` for a headless Service).
    pub cluster_ip: Option<String>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<String>,
    pub ports: Vec<ServicePort>,
    /// `status.loadBalancer.ingress`: the addresses a load balancer gave the Service.
    pub load_balancer: Vec<LoadBalancerAddress>,
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: Option<String>,
    pub port: i32,
    pub target_port: Option<IntOrString>,
}

/// One address of a Service's load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize)]
pub struct LoadBalancerAddress {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

// The API's JSON, as far as it is read.

#[derive(Deserialize)]
struct WireService {
    #[serde(default)]
    metadata: Option<ObjectMeta>,
    #[serde(default)]
    spec: Option<WireSpec>,
    #[serde(default)]
    status: Option<WireStatus>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSpec {
    #[serde(default, rename = "type")]
    type_: Option<String>,
    #[serde(default)]
    external_name: Option<String>,
    #[serde(default, rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(default, rename = "externalIPs")]
    external_ips: Option<Vec<String>>,
    #[serde(default)]
    ports: Option<Vec<WirePort>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePort {
    #[serde(default)]
    name: Option<String>,
    port: i32,
    #[serde(default)]
    target_port: Option<IntOrString>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStatus {
    #[serde(default)]
    load_balancer: Option<WireLoadBalancer>,
}

#[derive(Default, Deserialize)]
struct WireLoadBalancer {
    #[serde(default)]
    ingress: Option<Vec<LoadBalancerAddress>>,
}

impl<'de> Deserialize<'de> for Service {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = WireService::deserialize(deserializer)?;
        let read = wire.metadata.unwrap_or_default();
        let metadata = ObjectMeta {
            name: read.name,
            namespace: read.namespace,
            uid: read.uid,
            resource_version: read.resource_version,
            annotations: read.annotations,
            ..ObjectMeta::default()
        };
        let spec = wire.spec.unwrap_or_default();
        let ports = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .map(|p| ServicePort {
                name: p.name,
                port: p.port,
                target_port: p.target_port,
            })
            .collect();
        let load_balancer = wire
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .unwrap_or_default();
        Ok(Self {
            metadata,
            type_: spec.type_,
            external_name: spec.external_name,
            cluster_ip: spec.cluster_ip,
            external_ips: spec.external_ips.unwrap_or_default(),
            ports,
            load_balancer,
        })
    }
}

impl Serialize for Service {
    /// The API's JSON of what is held (so a held Service written out reads back the same).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut spec = serde_json::Map::new();
        let mut put = |name: &str, value: Option<serde_json::Value>| {
            if let Some(value) = value {
                spec.insert(name.into(), value);
            }
        };
        put("type", self.type_.clone().map(Into::into));
        put("externalName", self.external_name.clone().map(Into::into));
        put("clusterIP", self.cluster_ip.clone().map(Into::into));
        put(
            "externalIPs",
            (!self.external_ips.is_empty()).then(|| self.external_ips.clone().into()),
        );
        let ports: Vec<serde_json::Value> = self
            .ports
            .iter()
            .map(|p| {
                let mut out = serde_json::Map::new();
                if let Some(name) = &p.name {
                    out.insert("name".into(), name.clone().into());
                }
                out.insert("port".into(), p.port.into());
                if let Some(target) = &p.target_port {
                    out.insert(
                        "targetPort".into(),
                        serde_json::to_value(target).unwrap_or_default(),
                    );
                }
                serde_json::Value::Object(out)
            })
            .collect();
        put("ports", Some(ports.into()));
        let mut out = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.metadata,
            "spec": spec,
        });
        if !self.load_balancer.is_empty() {
            out["status"] = serde_json::json!({"loadBalancer": {"ingress": self.load_balancer}});
        }
        out.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(value: serde_json::Value) -> Result<Service, serde_json::Error> {
        serde_json::from_value(value)
    }

    #[test]
    fn keeps_what_routing_and_publishing_read_and_drops_the_rest() {
        let s = service(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {
                "name": "web", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                "annotations": {"portcullis.io/timeout-server": "5s"},
                "labels": {"app": "web"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u"}],
            },
            "spec": {
                "type": "LoadBalancer", "clusterIP": "10.96.0.10",
                "clusterIPs": ["10.96.0.10"], "externalIPs": ["192.0.2.1"],
                "selector": {"app": "web"}, "sessionAffinity": "None",
                "ipFamilies": ["IPv4"],
                "ports": [
                    {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                    {"port": 443, "targetPort": "https", "nodePort": 30443},
                ],
            },
            "status": {"loadBalancer": {"ingress": [
                {"ip": "203.0.113.5", "ipMode": "VIP"}, {"hostname": "lb.example.com"},
            ]}},
        }))
        .unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("web"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(s.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            s.metadata.annotations,
            Some([("portcullis.io/timeout-server".into(), "5s".into())].into())
        );
        assert_eq!(s.metadata.labels, None);
        assert_eq!(s.metadata.owner_references, None);
        assert_eq!(s.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(s.cluster_ip.as_deref(), Some("10.96.0.10"));
        assert_eq!(s.external_ips, ["192.0.2.1"]);
        assert_eq!(
            s.ports,
            [
                ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    target_port: Some(IntOrString::Int(8080)),
                },
                ServicePort {
                    name: None,
                    port: 443,
                    target_port: Some(IntOrString::String("https".into())),
                },
            ]
        );
        assert_eq!(
            s.load_balancer,
            [
                LoadBalancerAddress {
                    ip: Some("203.0.113.5".into()),
                    hostname: None,
                },
                LoadBalancerAddress {
                    ip: None,
                    hostname: Some("lb.example.com".into()),
                },
            ]
        );
    }

    #[test]
    fn missing_or_null_parts_are_empty_and_a_port_needs_its_number() {
        for value in [
            json!({"metadata": {"name": "a"}}),
            json!({"metadata": {"name": "a"}, "spec": null, "status": null}),
            json!({"metadata": {"name": "a"}, "spec": {"ports": null, "externalIPs": null},
                   "status": {"loadBalancer": {"ingress": null}}}),
        ] {
            let s = service(value).unwrap();
            assert!(s.ports.is_empty() && s.external_ips.is_empty() && s.load_balancer.is_empty());
            assert_eq!((s.type_, s.cluster_ip, s.external_name), (None, None, None));
        }
        let err = service(json!({"spec": {"ports": [{"name": "http"}]}})).unwrap_err();
        assert!(err.to_string().contains("missing field `port`"), "{err}");
        let err = service(json!({"spec": {"ports": [{"port": "80"}]}})).unwrap_err();
        assert!(err.to_string().contains("invalid type"), "{err}");
    }

    /// What is held is written as the API's JSON and reads back the same.
    #[test]
    fn round_trips_through_the_api_json() {
        let s = service(json!({
            "metadata": {"name": "ext", "namespace": "ns", "annotations": {"a": "b"}},
            "spec": {"type": "ExternalName", "externalName": "db.example.com",
                     "ports": [{"name": "pg", "port": 5432, "targetPort": 5433}]},
            "status": {"loadBalancer": {"ingress": [{"hostname": "h.example.com"}]}},
        }))
        .unwrap();
        let written = serde_json::to_value(&s).unwrap();
        assert_eq!(written["kind"], "Service");
        assert_eq!(written["spec"]["ports"][0]["targetPort"], 5433);
        assert_eq!(service(written).unwrap(), s);
        let bare = service(json!({"metadata": {"name": "a"}})).unwrap();
        assert_eq!(service(serde_json::to_value(&bare).unwrap()).unwrap(), bare);
    }
}
