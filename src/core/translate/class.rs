//! Which Ingresses are ours (ingress class selection), and which hosts each may route (host
//! ownership, `--host-ownership`).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;

use crate::objects::Key;
use crate::store::Store;

/// The legacy class annotation, still common in manifests.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// The annotation that makes an IngressClass the cluster default.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

/// The class names this controller serves, and whether it takes class-less Ingresses.
#[derive(Debug, Clone)]
pub struct ClassFilter {
    names: Vec<String>,
    take_unclassed: bool,
}

impl ClassFilter {
    /// Our classes are `ingress_class` plus every IngressClass whose `spec.controller` is
    /// `controller_class`. Ingresses without a class are ours when one of our IngressClasses is
    /// the default class, or when `watch_without_class` is set.
    pub fn new(
        store: &Store,
        ingress_class: &str,
        controller_class: &str,
        watch_without_class: bool,
    ) -> Self {
        let mut names = vec![ingress_class.to_string()];
        let mut default_is_ours = false;
        for (key, class) in store.ingress_classes() {
            let ours = class
                .spec
                .as_ref()
                .and_then(|s| s.controller.as_deref())
                .is_some_and(|c| c == controller_class);
            if !ours {
                continue;
            }
            names.push(key.name.clone());
            let is_default = class
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true");
            default_is_ours |= is_default;
        }
        names.sort();
        names.dedup();
        Self {
            names,
            take_unclassed: watch_without_class || default_is_ours,
        }
    }

    /// For objects without `spec.ingressClassName` (the TCP resource): the `ingress.class`
    /// or legacy class annotation, then the default rule.
    pub fn accepts_meta(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> bool {
        let annotations = meta.annotations.as_ref();
        let class = annotations.and_then(|a| {
            a.get("ingress.class")
                .or_else(|| a.get(LEGACY_CLASS_ANNOTATION))
        });
        match class {
            Some(name) => self.names.iter().any(|n| n == name),
            None => self.take_unclassed,
        }
    }

    /// `spec.ingressClassName` first, then the legacy annotation, then the default rule.
    pub fn accepts(&self, ingress: &Ingress) -> bool {
        let class = ingress
            .spec
            .as_ref()
            .and_then(|s| s.ingress_class_name.as_deref())
            .or_else(|| {
                ingress
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
                    .map(String::as_str)
            });
        match class {
            Some(name) => self.names.iter().any(|n| n == name),
            None => self.take_unclassed,
        }
    }
}

/// `--host-ownership`: who may route a host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostOwnership {
    /// Any Ingress of the class may route any host; paths of one host from several
    /// namespaces merge, and the oldest Ingress wins a path both name.
    #[default]
    Shared,
    /// A host belongs to the namespace of its oldest Ingress; rules and TLS hosts for it from
    /// other namespaces are refused.
    Namespace,
}

impl HostOwnership {
    /// The flag's words: `shared` or `namespace`.
    pub fn parse(v: &str) -> Result<Self, String> {
        match v {
            "shared" => Ok(HostOwnership::Shared),
            "namespace" => Ok(HostOwnership::Namespace),
            other => Err(format!("{other:?} is not shared or namespace")),
        }
    }
}

/// Under `--host-ownership=namespace`, the namespace each host belongs to: that of the oldest
/// Ingress with a rule for it (creation time, then namespace and name: the order every claim
/// is decided in). A host is its exact name: a wildcard (`*.example.com`) is a name of its own,
/// owned apart from the names it covers, and so is the empty host of rules without one.
#[derive(Debug, Default)]
pub struct HostOwners(HashMap<String, Arc<str>>);

impl HostOwners {
    /// The owners of the hosts of `ingresses`, given oldest first. Rule hosts that are not
    /// valid host names claim nothing (translation reports them).
    pub fn new<'i>(ingresses: impl Iterator<Item = (&'i Key, &'i Ingress)>) -> Self {
        let mut owners: HashMap<String, Arc<str>> = HashMap::new();
        for (key, ingress) in ingresses {
            let mut namespace: Option<Arc<str>> = None;
            let rules = ingress.spec.as_ref().and_then(|s| s.rules.as_ref());
            for rule in rules.into_iter().flatten() {
                let host = match rule.host.as_deref() {
                    None | Some("") => String::new(),
                    Some(h) => match crate::values::parse_host(h) {
                        Ok(h) => h,
                        Err(_) => continue,
                    },
                };
                owners.entry(host).or_insert_with(|| {
                    namespace
                        .get_or_insert_with(|| key.namespace.as_str().into())
                        .clone()
                });
            }
        }
        HostOwners(owners)
    }

    /// The namespace `host` belongs to, when it is not `namespace`.
    pub fn foreign(&self, host: &str, namespace: &str) -> Option<&Arc<str>> {
        self.0.get(host).filter(|owner| &***owner != namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{Kind, Object};
    use serde_json::json;

    /// An Ingress `namespace/name` created at `created` (a day of January 2024) with a rule
    /// per host, each routing `/path` to Service `web`.
    fn ingress(namespace: &str, name: &str, created: u8, rules: &[(&str, &str)]) -> Object {
        let rules: Vec<serde_json::Value> = rules
            .iter()
            .map(|(host, path)| {
                json!({"host": host, "http": {"paths": [{"path": path, "pathType": "Prefix",
                    "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}})
            })
            .collect();
        Object::from_value(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": namespace,
                "creationTimestamp": format!("2024-01-{created:02}T00:00:00Z")},
            "spec": {"ingressClassName": "portcullis", "rules": rules}
        }))
        .unwrap()
    }

    fn service(namespace: &str) -> Object {
        Object::from_value(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"ports": [{"port": 80}]}}))
        .unwrap()
    }

    #[test]
    fn a_host_belongs_to_the_namespace_of_its_oldest_ingress() {
        let objects = [
            ingress("b", "late", 9, &[("shop.example", "/")]),
            ingress(
                "a",
                "early",
                1,
                &[("shop.example", "/x"), ("*.shop.example", "/")],
            ),
            // The same age: namespace, then name, decide.
            ingress("d", "same", 5, &[("api.example", "/"), ("", "/")]),
            ingress("c", "same", 5, &[("api.example", "/v2"), ("Bad Host", "/")]),
            ingress("e", "wild", 2, &[("a.shop.example", "/")]),
        ];
        let store = Store::from_objects(objects);
        let order = crate::translate::parts::IngressOrder::new(store.ingresses(), |_| true);
        let owners = HostOwners::new(order.iter().map(|o| (&o.key, &*o.ingress)));
        let owner = |host: &str, ns: &str| owners.foreign(host, ns).map(|o| o.to_string());
        assert_eq!(owner("shop.example", "a"), None);
        assert_eq!(owner("shop.example", "b").as_deref(), Some("a"));
        assert_eq!(owner("api.example", "d").as_deref(), Some("c"));
        assert_eq!(owner("api.example", "c"), None);
        // A wildcard and the names under it are owned apart; so is the empty host.
        assert_eq!(owner("*.shop.example", "e").as_deref(), Some("a"));
        assert_eq!(owner("a.shop.example", "a").as_deref(), Some("e"));
        assert_eq!(owner("", "a").as_deref(), Some("d"));
        // A host nobody routes, or that is not a host name, belongs to nobody.
        assert_eq!(owner("other.example", "a"), None);
        assert_eq!(owner("Bad Host", "a"), None);
        assert_eq!(
            HostOwnership::parse("namespace"),
            Ok(HostOwnership::Namespace)
        );
        assert_eq!(HostOwnership::parse("shared"), Ok(HostOwnership::Shared));
        assert!(HostOwnership::parse("Namespace").is_err());
    }

    /// Under `--host-ownership=namespace` a run that takes the unchanged Ingresses from the
    /// last one gives what a fresh run gives, when the owner of a host another namespace also
    /// names comes and goes: the other Ingress is translated again.
    #[test]
    fn warm_runs_follow_ownership_changes() {
        let config = crate::translate::TranslateConfig {
            host_ownership: HostOwnership::Namespace,
            ..crate::translate::TranslateConfig::default()
        };
        let victim = || ingress("victim", "site", 1, &[("victim.example", "/")]);
        let evil = ingress(
            "evil",
            "steal",
            2,
            &[("victim.example", "/x"), ("evil.example", "/")],
        );
        let other = ingress("other", "app", 3, &[("other.example", "/")]);
        let mut store = Store::from_objects([
            service("victim"),
            service("evil"),
            service("other"),
            victim(),
            evil,
            other,
        ]);
        let pipeline = crate::pipeline::Pipeline::load(None, None, config.clone()).unwrap();
        let fresh = |store: &Store| {
            crate::pipeline::Pipeline::load(None, None, config.clone())
                .unwrap()
                .run(store)
                .unwrap()
        };
        let exact = |output: &crate::pipeline::Output| -> String {
            output
                .rendered
                .files()
                .iter()
                .filter(|(name, _)| name.ends_with("exact.map"))
                .filter_map(|(_, content)| content.text())
                .collect()
        };
        let refused = |output: &crate::pipeline::Output| {
            output.diagnostics.iter().any(|d| {
                d.to_string()
                    .contains("Ingress evil/steal: spec.rules[0].host")
            })
        };
        let victim_key = Key::new("victim", "site");
        for round in 0..4 {
            if round % 2 == 1 {
                store.delete(Kind::Ingress, &victim_key);
            } else if round > 0 {
                store.upsert(victim());
            }
            let warm = pipeline.run(&store).unwrap();
            let cold = fresh(&store);
            assert_eq!(exact(&warm), exact(&cold), "round {round}");
            assert_eq!(
                warm.rendered.haproxy_cfg(),
                cold.rendered.haproxy_cfg(),
                "round {round}"
            );
            let victim_there = round % 2 == 0;
            assert_eq!(refused(&warm), victim_there, "round {round}");
            assert_eq!(refused(&cold), victim_there, "round {round}");
            assert_eq!(
                exact(&warm).contains("victim.example/x evil_web_80"),
                !victim_there,
                "round {round}: {}",
                exact(&warm)
            );
        }
        assert!(pipeline.partial_runs() >= 3, "the later runs took parts");
    }
}
