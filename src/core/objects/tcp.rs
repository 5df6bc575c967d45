//! The TCP custom resource (`ingress.v3.haproxy.org/v3`, kind `TCP`), shared with
//! haproxytech/kubernetes-ingress: a list of TCP services, each a frontend (the incumbent's
//! frontend model: binds as a map by name, ACLs, backend switching and `tcp-request` rules,
//! log settings) in front of a default Service and optional further Services.
//!
//! The types read the fields Portcullis renders. Every other field of `spec` is kept by name
//! in [`Tcp::unread`], so translation can report it instead of dropping it silently.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ParseError;

/// The TCP custom resource: a list of TCP services.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tcp {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Vec<TcpService>,
    /// Paths of the fields under `spec` the types do not read (`spec[0].frontend.capture_list`),
    /// in document order.
    #[serde(skip)]
    pub unread: Vec<String>,
}

impl Tcp {
    /// Decodes a TCP object and notes the fields of its `spec` that nothing reads.
    pub(super) fn from_value(value: &Value) -> Result<Tcp, ParseError> {
        let raw_spec = value.get("spec").cloned();
        let mut tcp: Tcp = super::decode_ref(value, "TCP")?;
        if let Some(raw) = raw_spec {
            let read = serde_json::to_value(&tcp.spec).unwrap_or(Value::Null);
            unread_fields(&raw, &read, "spec", &mut tcp.unread);
        }
        Ok(tcp)
    }
}

/// Appends to `out` the path of every field of `raw` that `read` (the same document
/// deserialized into typed values and serialized again) does not have.
pub(crate) fn unread_fields(raw: &Value, read: &Value, path: &str, out: &mut Vec<String>) {
    match (raw, read) {
        (Value::Object(raw), Value::Object(read)) => {
            for (k, v) in raw {
                let p = format!("{path}.{k}");
                match read.get(k) {
                    Some(r) => unread_fields(v, r, &p, out),
                    None => out.push(p),
                }
            }
        }
        (Value::Array(raw), Value::Array(read)) => {
            for (i, (v, r)) in raw.iter().zip(read).enumerate() {
                unread_fields(v, r, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// One entry of a TCP resource's `spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TcpService {
    pub name: String,
    pub frontend: TcpFrontend,
    /// The default Service (`default_backend`).
    pub service: TcpTarget,
    /// Further Services, reached through `backend_switching_rule_list`.
    #[serde(default)]
    pub services: Vec<TcpTarget>,
}

/// The frontend of a TCP service: the fields of the incumbent's frontend model Portcullis
/// renders.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TcpFrontend {
    pub name: String,
    /// Only `tcp` is possible.
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub tcplog: Option<bool>,
    #[serde(default)]
    pub log_format: Option<String>,
    #[serde(default)]
    pub maxconn: Option<i64>,
    /// Milliseconds.
    #[serde(default)]
    pub client_timeout: Option<i64>,
    /// Milliseconds.
    #[serde(default)]
    pub client_fin_timeout: Option<i64>,
    #[serde(default)]
    pub backlog: Option<i64>,
    /// `enabled` or `disabled`: `option dontlognull` or `no option dontlognull`; the same
    /// for the options below.
    #[serde(default)]
    pub dontlognull: Option<String>,
    #[serde(default)]
    pub dontlog_normal: Option<String>,
    #[serde(default)]
    pub logasap: Option<String>,
    #[serde(default)]
    pub clitcpka: Option<String>,
    #[serde(default)]
    pub tcpka: Option<String>,
    #[serde(default)]
    pub nolinger: Option<String>,
    #[serde(default)]
    pub binds: TcpBinds,
    #[serde(default)]
    pub acl_list: Vec<TcpAcl>,
    #[serde(default)]
    pub backend_switching_rule_list: Vec<TcpSwitchingRule>,
    #[serde(default)]
    pub tcp_request_rule_list: Vec<TcpRequestRule>,
}

/// A frontend's binds: the incumbent's map by bind name, or a list of binds. Map entries are
/// kept in key order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TcpBinds {
    /// The binds, each with its key in the map (`None` in a list).
    pub entries: Vec<(Option<String>, TcpBind)>,
}

impl TcpBinds {
    /// How messages name the `i`th bind: `binds.v4` or `binds[0]`.
    pub fn field(&self, i: usize) -> String {
        match self.entries.get(i).and_then(|(k, _)| k.as_deref()) {
            Some(key) => format!("binds.{key}"),
            None => format!("binds[{i}]"),
        }
    }
}

impl Serialize for TcpBinds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.entries.iter().any(|(k, _)| k.is_some()) {
            let mut m = s.serialize_map(Some(self.entries.len()))?;
            for (k, bind) in &self.entries {
                m.serialize_entry(k.as_deref().unwrap_or_default(), bind)?;
            }
            m.end()
        } else {
            let mut q = s.serialize_seq(Some(self.entries.len()))?;
            for (_, bind) in &self.entries {
                q.serialize_element(bind)?;
            }
            q.end()
        }
    }
}

impl<'de> Deserialize<'de> for TcpBinds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            d.deserialize_any(MapOrList)
        } else {
            // A format that cannot say which it holds (a schema tracer among them) reads the
            // incumbent's shape.
            d.deserialize_newtype_struct("TcpBinds", MapOrList)
        }
    }
}

struct MapOrList;

impl<'de> Visitor<'de> for MapOrList {
    type Value = TcpBinds;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of binds by name, or a list of binds")
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<TcpBinds, D::Error> {
        let map = BTreeMap::<String, TcpBind>::deserialize(d)?;
        Ok(TcpBinds {
            entries: map.into_iter().map(|(k, b)| (Some(k), b)).collect(),
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<TcpBinds, A::Error> {
        let mut map = BTreeMap::new();
        while let Some((k, bind)) = access.next_entry::<String, TcpBind>()? {
            if map.insert(k.clone(), bind).is_some() {
                return Err(de::Error::custom(format!("bind {k:?} appears twice")));
            }
        }
        Ok(TcpBinds {
            entries: map.into_iter().map(|(k, b)| (Some(k), b)).collect(),
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut access: A) -> Result<TcpBinds, A::Error> {
        let mut entries = Vec::new();
        while let Some(bind) = access.next_element::<TcpBind>()? {
            entries.push((None, bind));
        }
        Ok(TcpBinds { entries })
    }

    fn visit_unit<E: de::Error>(self) -> Result<TcpBinds, E> {
        Ok(TcpBinds::default())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TcpBind {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub address: Option<String>,
    /// 1 to 65535; checked by translation, so a bad port costs the bind, not the object.
    #[serde(default)]
    pub port: Option<i64>,
    #[serde(default)]
    pub ssl: Option<bool>,
    #[serde(default)]
    pub ssl_certificate: Option<String>,
    #[serde(default)]
    pub alpn: Option<String>,
    /// `::` takes IPv4 connections too (`v4v6`).
    #[serde(default)]
    pub v4v6: Option<bool>,
    /// An IPv6 address takes IPv6 connections only (`v6only`).
    #[serde(default)]
    pub v6only: Option<bool>,
    /// Clients send a PROXY protocol header (`accept-proxy`).
    #[serde(default)]
    pub accept_proxy: Option<bool>,
}

/// `acl <acl_name> <criterion> <value>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TcpAcl {
    #[serde(default)]
    pub acl_name: Option<String>,
    #[serde(default)]
    pub criterion: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
}

/// `use_backend <name> <cond> <cond_test>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TcpSwitchingRule {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub cond: Option<String>,
    #[serde(default)]
    pub cond_test: Option<String>,
}

/// `tcp-request <type> ...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TcpRequestRule {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub action: Option<String>,
    /// Milliseconds, for `inspect-delay`.
    #[serde(default)]
    pub timeout: Option<i64>,
    #[serde(default)]
    pub cond: Option<String>,
    #[serde(default)]
    pub cond_test: Option<String>,
}

/// A Service and port number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TcpTarget {
    pub name: String,
    pub port: u16,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tcp(spec: Value) -> Result<Tcp, ParseError> {
        let mut object = json!({
            "apiVersion": "ingress.v3.haproxy.org/v3", "kind": "TCP",
            "metadata": {"name": "tcp-1", "namespace": "app"},
        });
        object["spec"] = spec;
        Tcp::from_value(&object)
    }

    /// The incumbent's documented example: binds as a map, `v4v6`, `log_format`, more
    /// Services.
    #[test]
    fn the_incumbents_map_of_binds_loads() {
        let t = tcp(json!([{
            "name": "tcp-echo",
            "frontend": {
                "name": "fe-echo", "tcplog": true, "log_format": "%{+Q}o %t %s",
                "binds": {
                    "v4v6": {"name": "v4v6", "address": "::", "port": 32766, "v4v6": true},
                    "v4": {"name": "v4", "port": 32766, "ssl": true, "ssl_certificate": "c"},
                },
            },
            "service": {"name": "echo", "port": 80},
            "services": [{"name": "echo-2", "port": 443}],
        }]))
        .unwrap();
        let fe = &t.spec[0].frontend;
        // Key order, whatever the document's.
        let keys: Vec<_> = fe.binds.entries.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(keys, [Some("v4".into()), Some("v4v6".into())]);
        assert_eq!(fe.binds.entries[1].1.v4v6, Some(true));
        assert_eq!(fe.binds.field(1), "binds.v4v6");
        assert_eq!(fe.log_format.as_deref(), Some("%{+Q}o %t %s"));
        assert_eq!(t.spec[0].services[0].port, 443);
        assert!(t.unread.is_empty(), "{:?}", t.unread);
    }

    #[test]
    fn a_list_of_binds_still_loads() {
        let t = tcp(json!([{"name": "a", "frontend": {"name": "fe", "binds": [
            {"name": "b", "port": 2053}]}, "service": {"name": "s", "port": 80}}]))
        .unwrap();
        assert_eq!(t.spec[0].frontend.binds.entries[0].0, None);
        assert_eq!(t.spec[0].frontend.binds.field(0), "binds[0]");
        // Written back in the form it was read in.
        let back = serde_json::to_value(&t.spec[0].frontend.binds).unwrap();
        assert!(back.is_array());
    }

    /// The incumbent's full example: rules and lists Portcullis reads, and some it does not,
    /// named by path.
    #[test]
    fn fields_nothing_reads_are_named() {
        let t = tcp(json!([{
            "name": "tcp-test",
            "frontend": {
                "name": "fe", "binds": {"v4": {"name": "v4", "port": 32766, "backlog": 10}},
                "acl_list": [{"acl_name": "a", "criterion": "req_ssl_sni", "value": "-i x"}],
                "backend_switching_rule_list": [{"name": "b", "cond": "if", "cond_test": "a"}],
                "tcp_request_rule_list": [{"type": "inspect-delay", "timeout": 5000},
                    {"type": "content", "action": "accept", "cond": "if",
                     "cond_test": "{ req_ssl_hello_type 1 }"}],
                "capture_list": [{"type": "request", "length": 1}],
                "filter_list": [{"type": "compression"}],
            },
            "service": {"name": "echo", "port": 443},
        }]))
        .unwrap();
        assert_eq!(
            t.unread,
            [
                "spec[0].frontend.binds.v4.backlog",
                "spec[0].frontend.capture_list",
                "spec[0].frontend.filter_list",
            ]
        );
        let rules = &t.spec[0].frontend.tcp_request_rule_list;
        assert_eq!(rules[0].kind.as_deref(), Some("inspect-delay"));
        assert_eq!(
            rules[1].cond_test.as_deref(),
            Some("{ req_ssl_hello_type 1 }")
        );
    }

    #[test]
    fn a_bind_named_twice_is_refused() {
        // JSON documents cannot repeat a key, so decode text.
        let err = serde_json::from_str::<TcpBinds>(r#"{"v4": {"port": 1}, "v4": {"port": 2}}"#)
            .unwrap_err();
        assert!(err.to_string().contains("appears twice"), "{err}");
    }
}
