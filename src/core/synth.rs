//! A deterministic, seeded synthetic cluster for benchmarks: N Ingresses with 1–3 hosts and
//! 1–3 paths per host, one Service per Ingress with k ready endpoints, a mix of annotations the
//! bundled scripts handle, and TLS (`kubernetes.io/tls` Secrets) on a share of the Ingresses.
//!
//! Every object of Ingress `i` is generated from its own random stream (derived from the seed
//! and `i`), so a single object can be regenerated, or changed, without the rest.

use serde_json::{Value, json};

use crate::objects::{Object, ParseError};

/// SplitMix64: a tiny, good-enough, seedable PRNG (no dependency needed).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0; 0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        let i = usize::try_from(self.below(items.len() as u64)).unwrap_or_default();
        items.get(i).copied().unwrap_or_default()
    }
}

/// A certificate and its private key, PEM, reused by every generated TLS Secret.
#[derive(Debug, Clone)]
pub struct TlsPem {
    pub cert: String,
    pub key: String,
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct SynthConfig {
    pub seed: u64,
    /// N: Ingresses (and Services).
    pub ingresses: usize,
    /// k: ready endpoints per Service.
    pub endpoints: usize,
    /// Namespaces the Ingresses are spread over (at least 1).
    pub namespaces: usize,
    /// Percentage of Ingresses with a `spec.tls` section and a Secret (needs `tls`).
    pub tls_percent: u64,
    pub tls: Option<TlsPem>,
}

impl SynthConfig {
    pub fn new(seed: u64, ingresses: usize, endpoints: usize) -> Self {
        Self {
            seed,
            ingresses,
            endpoints,
            namespaces: 50,
            tls_percent: 30,
            tls: None,
        }
    }
}

/// The generated cluster and its shape.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub objects: Vec<Object>,
    pub ingresses: usize,
    pub services: usize,
    pub endpoint_slices: usize,
    pub endpoints: usize,
    pub secrets: usize,
    pub hosts: usize,
    pub paths: usize,
}

/// The most endpoints one EndpointSlice holds (the Kubernetes default).
const SLICE_MAX: usize = 100;
const PREFIXES: [&str; 2] = ["haproxy.org/", "portcullis.io/"];

/// Generates the whole cluster: an IngressClass, then per Ingress its Service, slices and
/// Secret. Same config, same objects.
pub fn generate(config: &SynthConfig) -> Result<Cluster, ParseError> {
    let mut cluster = Cluster {
        objects: Vec::new(),
        ingresses: 0,
        services: 0,
        endpoint_slices: 0,
        endpoints: 0,
        secrets: 0,
        hosts: 0,
        paths: 0,
    };
    cluster.objects.push(Object::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "IngressClass",
        "metadata": {"name": "portcullis"},
        "spec": {"controller": "portcullis.io/ingress"},
    }))?);
    for i in 0..config.ingresses {
        let app = App::new(config, i);
        cluster.hosts += app.hosts.len();
        cluster.paths += app.hosts.len() * app.paths.len();
        cluster
            .objects
            .push(Object::from_value(app.ingress(config, 0))?);
        cluster.ingresses += 1;
        cluster.objects.push(Object::from_value(app.service())?);
        cluster.services += 1;
        for slice in app.endpoint_slices(config, 0) {
            cluster.objects.push(Object::from_value(slice)?);
            cluster.endpoint_slices += 1;
        }
        cluster.endpoints += config.endpoints;
        if let Some(secret) = app.secret(config) {
            cluster.objects.push(Object::from_value(secret)?);
            cluster.secrets += 1;
        }
    }
    Ok(cluster)
}

/// Ingress `i` as generated, with a change numbered `generation` (> 0): one more path
/// (`/gen<generation>`) and a different `timeout-server`. Generation 0 is the original.
pub fn changed_ingress(
    config: &SynthConfig,
    i: usize,
    generation: u64,
) -> Result<Object, ParseError> {
    Object::from_value(App::new(config, i).ingress(config, generation))
}

/// The first EndpointSlice of Service `i` with one endpoint's address replaced (a pod
/// rescheduled), numbered `generation` (> 0). Generation 0 is the original.
pub fn changed_endpoint_slice(
    config: &SynthConfig,
    i: usize,
    generation: u64,
) -> Result<Option<Object>, ParseError> {
    App::new(config, i)
        .endpoint_slices(config, generation)
        .into_iter()
        .next()
        .map(Object::from_value)
        .transpose()
}

/// One Ingress and everything it routes to, decided by its own random stream.
struct App {
    index: usize,
    namespace: String,
    name: String,
    hosts: Vec<String>,
    /// (path, pathType), the same under every host.
    paths: Vec<(&'static str, &'static str)>,
    tls: bool,
    ingress_annotations: serde_json::Map<String, Value>,
    service_annotations: serde_json::Map<String, Value>,
}

impl App {
    fn new(config: &SynthConfig, index: usize) -> Self {
        let mut rng =
            SplitMix64::new(config.seed ^ (index as u64).wrapping_mul(0xA24B_AED4_963E_E407));
        let namespace = format!("ns{}", index % config.namespaces.max(1));
        let name = format!("app{index}");
        let host_count = 1 + rng.below(3);
        let hosts = (0..host_count)
            .map(|h| match h {
                0 => format!("{name}.example.com"),
                _ => format!("h{h}.{name}.example.com"),
            })
            .collect();
        let all_paths: [(&str, &str); 3] =
            [("/", "Prefix"), ("/api", "Prefix"), ("/healthz", "Exact")];
        let path_count = 1 + rng.below(3);
        let paths = all_paths
            .into_iter()
            .take(usize::try_from(path_count).unwrap_or(1))
            .collect();
        let tls = config.tls.is_some() && rng.chance(config.tls_percent);

        let mut ing = serde_json::Map::new();
        let mut svc = serde_json::Map::new();
        let prefix = rng.pick(&PREFIXES);
        let put = |map: &mut serde_json::Map<String, Value>, name: &str, value: String| {
            map.insert(format!("{prefix}{name}"), Value::String(value));
        };
        if rng.chance(40) {
            let v = rng.pick(&["5s", "30s", "1m", "90s"]);
            put(&mut ing, "timeout-server", v.to_string());
        }
        if rng.chance(30) {
            let v = rng.pick(&["leastconn", "roundrobin", "source", "url_param uid"]);
            put(&mut svc, "load-balance", v.to_string());
        }
        if tls && rng.chance(20) {
            put(&mut ing, "ssl-redirect", "false".to_string());
        }
        if rng.chance(15) {
            put(&mut ing, "set-host", format!("{name}.internal"));
        }
        if rng.chance(25) {
            put(
                &mut ing,
                "request-set-header",
                format!("X-Env prod\nX-App {name}"),
            );
        }
        if rng.chance(15) {
            put(
                &mut ing,
                "allow-list",
                "10.0.0.0/8, 192.168.1.0/24".to_string(),
            );
        }
        if rng.chance(10) {
            put(&mut ing, "path-rewrite", r"^/api/(.*) /\1".to_string());
        }
        if rng.chance(20) {
            let v = rng.pick(&["50", "100", "500"]);
            put(&mut svc, "pod-maxconn", v.to_string());
        }
        if rng.chance(10) {
            put(&mut svc, "check", "false".to_string());
        } else if rng.chance(20) {
            put(&mut svc, "check-http", "GET /healthz".to_string());
            put(&mut svc, "check-interval", "5s".to_string());
        }
        Self {
            index,
            namespace,
            name,
            hosts,
            paths,
            tls,
            ingress_annotations: ing,
            service_annotations: svc,
        }
    }

    fn ingress(&self, config: &SynthConfig, generation: u64) -> Value {
        let backend = json!({"service": {"name": self.name, "port": {"number": 80}}});
        let mut paths: Vec<Value> = self
            .paths
            .iter()
            .map(|(p, t)| json!({"path": p, "pathType": t, "backend": backend}))
            .collect();
        let mut annotations = self.ingress_annotations.clone();
        if generation > 0 {
            paths.push(json!({"path": format!("/gen{generation}"), "pathType": "Prefix", "backend": backend}));
            annotations.insert(
                "haproxy.org/timeout-server".to_string(),
                Value::String(format!("{}s", 10 + generation % 50)),
            );
        }
        let rules: Vec<Value> = self
            .hosts
            .iter()
            .map(|h| json!({"host": h, "http": {"paths": paths}}))
            .collect();
        let mut spec = json!({"ingressClassName": "portcullis", "rules": rules});
        if self.tls && config.tls.is_some() {
            spec["tls"] =
                json!([{"hosts": self.hosts, "secretName": format!("{}-tls", self.name)}]);
        }
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": {"name": self.name, "namespace": self.namespace, "annotations": annotations},
            "spec": spec,
        })
    }

    fn service(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": self.name, "namespace": self.namespace, "annotations": self.service_annotations},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
        })
    }

    /// k endpoints in slices of at most [`SLICE_MAX`]; addresses are unique in 10.0.0.0/8.
    /// A `generation` > 0 moves the first endpoint to an address in 10.255.0.0/16.
    fn endpoint_slices(&self, config: &SynthConfig, generation: u64) -> Vec<Value> {
        let base = self.index as u64 * config.endpoints as u64;
        let address = |n: u64| format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
        let mut slices = Vec::new();
        let mut start = 0usize;
        while start < config.endpoints {
            let end = (start + SLICE_MAX).min(config.endpoints);
            let endpoints: Vec<Value> = (start..end)
                .map(|e| {
                    let ip = if e == 0 && generation > 0 {
                        format!(
                            "10.255.{}.{}",
                            (generation >> 8) & 0xff,
                            generation & 0xff
                        )
                    } else {
                        address(base + e as u64)
                    };
                    json!({
                        "addresses": [ip],
                        "conditions": {"ready": true, "serving": true, "terminating": false},
                        "targetRef": {"kind": "Pod", "name": format!("{}-{e}", self.name), "namespace": self.namespace},
                    })
                })
                .collect();
            slices.push(json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{}-{}", self.name, start / SLICE_MAX),
                    "namespace": self.namespace,
                    "labels": {"kubernetes.io/service-name": self.name},
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": endpoints,
            }));
            start = end;
        }
        slices
    }

    fn secret(&self, config: &SynthConfig) -> Option<Value> {
        let pem = config.tls.as_ref().filter(|_| self.tls)?;
        Some(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": format!("{}-tls", self.name), "namespace": self.namespace},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pem.cert.as_bytes()), "tls.key": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pem.key.as_bytes())},
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::objects::Kind;

    fn tls() -> TlsPem {
        TlsPem {
            cert: include_str!("../../tests/fixtures/tls/ec.crt").to_string(),
            key: include_str!("../../tests/fixtures/tls/ec.key").to_string(),
        }
    }

    fn config(seed: u64, n: usize, k: usize) -> SynthConfig {
        SynthConfig {
            tls: Some(tls()),
            ..SynthConfig::new(seed, n, k)
        }
    }

    fn as_json(cluster: &Cluster) -> Vec<String> {
        cluster.objects.iter().map(|o| format!("{o:?}")).collect()
    }

    #[test]
    fn same_seed_same_objects() {
        let a = generate(&config(7, 200, 5)).unwrap();
        let b = generate(&config(7, 200, 5)).unwrap();
        assert_eq!(as_json(&a), as_json(&b));
        let c = generate(&config(8, 200, 5)).unwrap();
        assert_ne!(as_json(&a), as_json(&c));
    }

    #[test]
    fn shape() {
        let cluster = generate(&config(1, 300, 150)).unwrap();
        let count = |kind: Kind| cluster.objects.iter().filter(|o| o.kind() == kind).count();
        assert_eq!(count(Kind::Ingress), 300);
        assert_eq!(count(Kind::Service), 300);
        assert_eq!(count(Kind::IngressClass), 1);
        // 150 endpoints: two slices (100 + 50) per Service.
        assert_eq!(count(Kind::EndpointSlice), 600);
        assert_eq!(cluster.endpoint_slices, 600);
        assert_eq!(cluster.endpoints, 300 * 150);
        assert_eq!(count(Kind::Secret), cluster.secrets);
        // About 30 % TLS, 1–3 hosts and 1–3 paths each.
        assert!((40..=140).contains(&cluster.secrets), "{}", cluster.secrets);
        assert!((300..=900).contains(&cluster.hosts));
        assert!(cluster.hosts > 300 && cluster.hosts < 900);
        assert!(cluster.paths >= cluster.hosts && cluster.paths <= 3 * cluster.hosts);
        let annotated = cluster
            .objects
            .iter()
            .filter(|o| {
                o.kind() == Kind::Ingress
                    && o.metadata()
                        .annotations
                        .as_ref()
                        .is_some_and(|a| !a.is_empty())
            })
            .count();
        assert!(annotated > 100, "{annotated}");
    }

    #[test]
    fn no_tls_without_certificate() {
        let cluster = generate(&SynthConfig::new(1, 50, 3)).unwrap();
        assert_eq!(cluster.secrets, 0);
    }

    #[test]
    fn changes_differ_from_the_original() {
        let cfg = config(3, 10, 3);
        let cluster = generate(&cfg).unwrap();
        let original = cluster
            .objects
            .iter()
            .find(|o| o.kind() == Kind::EndpointSlice)
            .unwrap();
        let same = changed_endpoint_slice(&cfg, 0, 0).unwrap().unwrap();
        let changed = changed_endpoint_slice(&cfg, 0, 1).unwrap().unwrap();
        assert_eq!(format!("{original:?}"), format!("{same:?}"));
        assert_ne!(format!("{original:?}"), format!("{changed:?}"));
        let ingress = changed_ingress(&cfg, 0, 2).unwrap();
        assert_eq!(ingress.key(), crate::objects::Key::new("ns0", "app0"));
    }
}
