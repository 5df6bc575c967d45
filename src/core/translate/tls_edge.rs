//! TLS at the edge beyond offload certificates: which hosts an Ingress' TLS entries apply to
//! (only those it routes), `ssl-passthrough` routes (TLS server name → TCP backend), the CA
//! that verifies client certificates (`client-ca`), and verified TLS to the pods
//! (`server-ca`, `server-crt`).
//!
//! Scripts only name Secrets; the Secrets are read here. File names come from the Secret's
//! namespace and name (validated DNS names), never from other user strings:
//! `certs/ca/<namespace>_<name>.pem` for CA bundles, `certs/client/<namespace>_<name>.pem`
//! for client certificates to the pods.

use std::collections::{BTreeMap, BTreeSet};

use crate::diagnostics::{Diagnostics, Severity};
use crate::model::{BackendSettings, CertPath, MapEntry, PassthroughAccess, PemFile};
#[cfg(test)]
use crate::objects::Kind;
use crate::objects::{Key, ObjectRef};
use crate::store::Store;

use super::tls;

/// The hosts one Ingress routes (its rules that made a route or an ssl-passthrough claim):
/// the only hosts its `spec.tls` may speak for.
#[derive(Debug, Default)]
pub struct RoutedHosts(BTreeSet<String>);

impl RoutedHosts {
    /// Notes a rule's host (the empty host of rules without one covers no TLS host).
    pub fn insert(&mut self, host: &str) {
        if !host.is_empty() && !self.0.contains(host) {
            self.0.insert(host.to_string());
        }
    }

    /// Whether TLS host `host` is routed here: by a rule for that very name, or, for a name
    /// that is not a wildcard, by the wildcard rule of its first label (`a.example.com` by
    /// `*.example.com`; a wildcard covers exactly one label, as in routing).
    pub fn covers(&self, host: &str) -> bool {
        self.0.contains(host)
            || (!host.starts_with("*.")
                && host
                    .split_once('.')
                    .is_some_and(|(_, rest)| self.0.contains(&format!("*.{rest}"))))
    }

    /// Every routed host, sorted.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

/// The hosts TLS entry `spec.tls[index]` of `ingress` speaks for: its valid `hosts` that the
/// Ingress routes (see [`RoutedHosts::covers`]) and that do not belong to another namespace
/// (`foreign`, under `--host-ownership=namespace`); an entry without hosts speaks for every
/// host the Ingress routes, but those. Sorted, without repeats. Every host left out is
/// reported on its field; an empty result means the entry has no effect at all (not even its
/// certificate is loaded: a crt-list line without names would serve it for whatever names it
/// holds).
pub fn entry_hosts<'o>(
    listed: Option<&[String]>,
    index: usize,
    routed: &RoutedHosts,
    foreign: impl Fn(&str) -> Option<&'o str>,
    ingress: &ObjectRef,
    diags: &mut Diagnostics,
) -> Vec<String> {
    let field = format!("spec.tls[{index}]");
    let mut hosts = Vec::new();
    let Some(listed) = listed.filter(|l| !l.is_empty()) else {
        hosts.extend(
            routed
                .hosts()
                .filter(|h| foreign(h).is_none())
                .map(str::to_string),
        );
        if hosts.is_empty() {
            diags.object(
                Severity::Warning,
                ingress,
                format!("{field}.hosts"),
                "no hosts, and the Ingress routes no host name of its own; entry ignored",
            );
        }
        return hosts;
    };
    for (j, raw) in listed.iter().enumerate() {
        let field = format!("{field}.hosts[{j}]");
        let host = match crate::values::parse_host(raw) {
            Ok(host) => host,
            Err(e) => {
                diags.object(
                    Severity::Error,
                    ingress,
                    field,
                    format!("{e}; host skipped"),
                );
                continue;
            }
        };
        if let Some(owner) = foreign(&host) {
            diags.object(
                Severity::Error,
                ingress,
                field,
                format!(
                    "host {host} belongs to namespace {owner} (--host-ownership=namespace); ignored"
                ),
            );
        } else if !routed.covers(&host) {
            diags.object(
                Severity::Warning,
                ingress,
                field,
                format!(
                    "host {host} is not routed by this Ingress (no rule for it); a TLS entry speaks only for the Ingress' own hosts; ignored"
                ),
            );
        } else {
            hosts.push(host);
        }
    }
    hosts.sort();
    hosts.dedup();
    hosts
}

/// A host an Ingress path asks to pass through to a TCP backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassthroughClaim {
    pub host: String,
    /// `tcp_<namespace>_<service>_<port>`.
    pub backend: String,
    /// The Service port, registered as a TCP backend only if the claim wins.
    pub service: (Key, super::backends::ResolvedPort),
    /// The Ingress' age rank: the older claim wins.
    pub rank: usize,
    pub ingress: ObjectRef,
    pub field: String,
    /// The route's access lists (`allow-list`, `deny-list`), if it has any.
    pub access: Option<PassthroughAccess>,
}

/// The SNI map: one entry per host, the oldest Ingress' claim winning; a younger claim for
/// another backend gets a warning. Sorted by host. Returns the winning claims.
pub fn sni_map(
    mut claims: Vec<PassthroughClaim>,
    diags: &mut Diagnostics,
) -> (Vec<MapEntry>, Vec<PassthroughClaim>) {
    // Claims for the same host and backend from younger Ingresses fold into the oldest one;
    // their access lists are not merged: the oldest claim's lists (or none) decide, as for
    // every other route setting.
    claims.sort_by(|a, b| a.rank.cmp(&b.rank).then_with(|| a.field.cmp(&b.field)));
    let mut chosen: BTreeMap<String, PassthroughClaim> = BTreeMap::new();
    for claim in claims {
        match chosen.get(&claim.host) {
            None => {
                chosen.insert(claim.host.clone(), claim);
            }
            Some(first) if first.backend != claim.backend => diags.object(
                Severity::Warning,
                &claim.ingress,
                claim.field.clone(),
                format!(
                    "ssl-passthrough for host {} is already claimed by {} ({}), which takes precedence",
                    claim.host, first.ingress, first.field
                ),
            ),
            Some(first) if first.access != claim.access => diags.object(
                Severity::Warning,
                &claim.ingress,
                claim.field.clone(),
                format!(
                    "ssl-passthrough for host {} takes its access lists from {} ({}), which takes precedence; this path's allow-list/deny-list are not applied",
                    claim.host, first.ingress, first.field
                ),
            ),
            Some(_) => {}
        }
    }
    let entries = chosen
        .iter()
        .map(|(host, claim)| MapEntry {
            key: host.as_str().into(),
            value: claim.backend.as_str().into(),
        })
        .collect();
    (entries, chosen.into_values().collect())
}

/// `"namespace/name"` (as the settings parser returns it) → a key.
pub fn secret_key(reference: &str) -> Key {
    let (ns, name) = reference.split_once('/').unwrap_or(("", reference));
    Key::new(ns, name)
}

/// The CA bundle of Secret `reference`, or why it cannot be used.
pub fn ca_file(store: &Store, reference: &str) -> Result<PemFile, String> {
    let key = secret_key(reference);
    let secret = store
        .secret(&key)
        .ok_or_else(|| format!("Secret {key} does not exist"))?;
    tls::ca_file(&key, secret).map_err(|e| format!("Secret {key}: {e}"))
}

/// The client certificate (chain and key) of `kubernetes.io/tls` Secret `reference`.
pub fn client_certificate(store: &Store, reference: &str) -> Result<PemFile, String> {
    let key = secret_key(reference);
    let secret = store
        .secret(&key)
        .ok_or_else(|| format!("Secret {key} does not exist"))?;
    let pem = tls::pem_file(&key, secret).map_err(|e| format!("Secret {key}: {e}"))?;
    Ok(PemFile {
        path: tls::file_path("certs/client", &key, &pem.content),
        content: pem.content,
    })
}

/// Resolves `server-ca` and `server-crt` of an HTTP backend into files. Either turns TLS to
/// the pods on. A Secret that cannot be used is reported on the Service and makes the
/// backend refuse every request (503): it must not fall back to unverified TLS, or to TLS
/// without the certificate the pods expect.
pub fn resolve_server_tls(
    settings: &mut std::sync::Arc<BackendSettings>,
    store: &Store,
    service: &ObjectRef,
    diags: &mut Diagnostics,
    files: &mut BTreeMap<CertPath, std::sync::Arc<str>>,
) {
    // Settings without TLS to the pods stay shared.
    if settings.server_ca.is_none() && settings.server_crt.is_none() {
        return;
    }
    let settings = std::sync::Arc::make_mut(settings);
    settings.server_ssl = true;
    if let Some(reference) = settings.server_ca.clone() {
        match ca_file(store, &reference) {
            Ok(pem) => {
                settings.server_ca_file = Some(pem.path.to_string());
                files.insert(pem.path, pem.content);
            }
            Err(e) => {
                diags.object(
                    Severity::Error,
                    service,
                    "server-ca",
                    format!("{e}; the backend answers 503 until it is fixed"),
                );
                settings.server_tls_unusable = true;
            }
        }
    }
    if let Some(reference) = settings.server_crt.clone() {
        match client_certificate(store, &reference) {
            Ok(pem) => {
                settings.server_crt_file = Some(pem.path.to_string());
                files.insert(pem.path, pem.content);
            }
            Err(e) => {
                diags.object(
                    Severity::Error,
                    service,
                    "server-crt",
                    format!("{e}; the backend answers 503 until it is fixed"),
                );
                settings.server_tls_unusable = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(hosts: &[&str]) -> RoutedHosts {
        let mut routed = RoutedHosts::default();
        for h in hosts {
            routed.insert(h);
        }
        routed
    }

    /// The hosts of an entry and the fields reported, with `owners` (host, namespace) as
    /// the foreign owners.
    fn entry(
        listed: Option<&[&str]>,
        routed: &RoutedHosts,
        owners: &[(&str, &str)],
    ) -> (Vec<String>, Vec<String>) {
        let listed: Option<Vec<String>> = listed.map(|l| l.iter().map(|h| h.to_string()).collect());
        let ingress = ObjectRef::new(Kind::Ingress, &Key::new("evil", "claim"));
        let mut diags = Diagnostics::new();
        let foreign = |host: &str| owners.iter().find(|(h, _)| *h == host).map(|(_, ns)| *ns);
        let hosts = entry_hosts(listed.as_deref(), 2, routed, foreign, &ingress, &mut diags);
        let fields = diags
            .into_sorted()
            .into_iter()
            .map(|d| format!("{:?} {}", d.severity, d.field.unwrap_or_default()))
            .collect();
        (hosts, fields)
    }

    #[test]
    fn wildcard_rules_cover_exactly_one_label() {
        let r = routed(&["a.example.com", "*.apps.example.com", ""]);
        assert!(r.covers("a.example.com"));
        assert!(r.covers("x.apps.example.com"));
        assert!(r.covers("*.apps.example.com"));
        assert!(!r.covers("x.y.apps.example.com"));
        assert!(!r.covers("apps.example.com"));
        // A name rule does not cover the wildcard, nor a rule without host any name.
        assert!(!r.covers("*.example.com"));
        assert!(!r.covers("b.example.com"));
        assert_eq!(
            r.hosts().collect::<Vec<_>>(),
            ["*.apps.example.com", "a.example.com"]
        );
    }

    #[test]
    fn tls_hosts_the_ingress_does_not_route_are_reported_and_dropped() {
        let r = routed(&["evil.example", "*.apps.evil.example"]);
        let (hosts, fields) = entry(
            Some(&[
                "victim.example",
                "evil.example",
                "x.apps.evil.example",
                "evil.example",
                "Bad Host",
            ]),
            &r,
            &[],
        );
        assert_eq!(hosts, ["evil.example", "x.apps.evil.example"]);
        assert_eq!(
            fields,
            ["Warning spec.tls[2].hosts[0]", "Error spec.tls[2].hosts[4]"]
        );
        // Only hosts of others: the entry has no effect at all.
        let (hosts, fields) = entry(Some(&["victim.example"]), &r, &[]);
        assert!(hosts.is_empty());
        assert_eq!(fields, ["Warning spec.tls[2].hosts[0]"]);
    }

    #[test]
    fn an_entry_without_hosts_speaks_for_the_ingress_own_hosts() {
        let r = routed(&["b.example", "a.example", "*.w.example"]);
        for listed in [None, Some(&[][..])] {
            let (hosts, fields) = entry(listed, &r, &[]);
            assert_eq!(hosts, ["*.w.example", "a.example", "b.example"]);
            assert!(fields.is_empty(), "{fields:?}");
        }
        // An Ingress with rules without a host alone: nothing to speak for.
        let (hosts, fields) = entry(None, &routed(&[""]), &[]);
        assert!(hosts.is_empty());
        assert_eq!(fields, ["Warning spec.tls[2].hosts"]);
    }

    #[test]
    fn hosts_of_another_namespace_are_refused_even_under_a_wildcard() {
        // Under --host-ownership=namespace `a.w.example` belongs to victim: the wildcard
        // rule of evil covers it, but its TLS entry may not speak for it.
        let r = routed(&["*.w.example", "b.example"]);
        let owners = [("a.w.example", "victim")];
        let (hosts, fields) = entry(Some(&["a.w.example", "c.w.example"]), &r, &owners);
        assert_eq!(hosts, ["c.w.example"]);
        assert_eq!(fields, ["Error spec.tls[2].hosts[0]"]);
        let (hosts, _) = entry(None, &routed(&["a.w.example", "b.example"]), &owners);
        assert_eq!(hosts, ["b.example"]);
    }

    #[test]
    fn the_oldest_claim_for_a_host_wins() {
        let claim = |host: &str, backend: &str, rank: usize| PassthroughClaim {
            host: host.to_string(),
            backend: backend.to_string(),
            service: (
                Key::new("ns", "s"),
                super::super::backends::ResolvedPort {
                    number: 443,
                    name: String::new(),
                    external: None,
                    endpoints: super::super::exposure::EndpointRule::default(),
                },
            ),
            rank,
            ingress: ObjectRef::new(Kind::Ingress, &Key::new("ns", format!("i{rank}"))),
            field: "spec.rules[0]".to_string(),
            access: None,
        };
        let mut diags = Diagnostics::new();
        let (map, _) = sni_map(
            vec![
                claim("b.example.com", "tcp_ns_b_443", 1),
                claim("a.example.com", "tcp_ns_a_443", 2),
                claim("b.example.com", "tcp_ns_c_443", 0),
            ],
            &mut diags,
        );
        let lines: Vec<String> = map
            .iter()
            .map(|e| format!("{} {}", e.key, e.value))
            .collect();
        assert_eq!(
            lines,
            ["a.example.com tcp_ns_a_443", "b.example.com tcp_ns_c_443"]
        );
        assert_eq!(diags.len(), 1);
    }

    /// A certificate file HAProxy refused, given to the run, is left out as if its Secret
    /// had none, with an error on the Secret and none on the Ingress; without a certificate
    /// left there is no redirect to HTTPS. A warm pipeline gives what a fresh one does, and
    /// serves the certificate again once the refusal is gone.
    #[test]
    fn a_refused_certificate_is_left_out_and_reported_on_its_secret() {
        use crate::objects::Object;
        use crate::pipeline::Pipeline;
        use crate::translate::{RunInputs, TranslateConfig};
        use serde_json::json;
        let objects = [
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                   "metadata": {"name": "a-tls", "namespace": "ns"},
                   "stringData": {"tls.crt": include_str!("../../../tests/fixtures/tls/rsa.crt"),
                                  "tls.key": include_str!("../../../tests/fixtures/tls/rsa.key")}}),
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": "web", "namespace": "ns"},
                   "spec": {"ports": [{"name": "http", "port": 80}]}}),
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                   "metadata": {"name": "web", "namespace": "ns"},
                   "spec": {"tls": [{"hosts": ["a.com"], "secretName": "a-tls"}],
                            "rules": [{"host": "a.com", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                                "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}}),
        ];
        let store = Store::from_objects(objects.map(|v| Object::from_value(v).unwrap()));
        let pipeline = || {
            let config = TranslateConfig {
                version: "test".into(),
                watch_ingress_without_class: true,
                ..TranslateConfig::default()
            };
            Pipeline::load(None, None, config).unwrap()
        };
        let warm = pipeline();
        let (served, _) = warm.run_with(&store, &RunInputs::default()).unwrap();
        assert!(served.model.tls.enabled());
        assert!(!served.model.maps.ssl_redirect.is_empty());
        let path = served.model.tls.crt_list[0].path.clone();
        assert_eq!(path.secret(), &Key::new("ns", "a-tls"));

        let inputs = RunInputs {
            refused_certificates: std::sync::Arc::new(
                [(path.clone(), "unable to load certificate".to_string())].into(),
            ),
            ..RunInputs::default()
        };
        let (refused, _) = warm.run_with(&store, &inputs).unwrap();
        let (fresh, _) = pipeline().run_with(&store, &inputs).unwrap();
        assert_eq!(refused.model, fresh.model);
        assert_eq!(refused.rendered, fresh.rendered);
        assert_eq!(refused.diagnostics, fresh.diagnostics);
        assert!(!refused.model.tls.enabled());
        assert!(refused.model.tls.pem_files.is_empty());
        assert!(refused.model.maps.ssl_redirect.is_empty());
        assert!(refused.model.redirect_codes.is_empty());
        let mut expected = served.diagnostics.clone();
        expected.push(crate::diagnostics::Diagnostic {
            severity: crate::diagnostics::Severity::Error,
            subject: crate::diagnostics::Subject::Object(ObjectRef::new(
                Kind::Secret,
                &Key::new("ns", "a-tls"),
            )),
            field: Some("data".to_string()),
            message: "HAProxy refused this certificate; its hosts are served without it: unable to load certificate".to_string(),
        });
        expected.sort();
        assert_eq!(refused.diagnostics, expected);

        // A refusal of another content of the Secret leaves this one served.
        let other = crate::translate::tls::file_path("certs", path.secret(), "older content");
        let inputs = RunInputs {
            refused_certificates: std::sync::Arc::new([(other, "refused".to_string())].into()),
            ..RunInputs::default()
        };
        assert_eq!(
            warm.run_with(&store, &inputs).unwrap().0.model,
            served.model
        );
        assert_eq!(warm.run(&store).unwrap().model, served.model);
    }
}
