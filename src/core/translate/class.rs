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

/// Which Ingresses this controller serves, as the incumbent decides it:
///
/// - `spec.ingressClassName` must name an IngressClass object whose `spec.controller` is
///   `--controller-class`. The name alone is not enough: deleting the IngressClass, or giving
///   it to another controller, takes its Ingresses away from this one.
/// - The legacy annotations (`kubernetes.io/ingress.class`, `ingress.class`) name the class
///   directly: `--ingress-class`, or one of our IngressClass objects.
/// - An Ingress naming no class is ours when `--watch-ingress-without-class` is set, or when
///   one of our IngressClasses is the cluster default.
#[derive(Debug, Clone)]
pub struct ClassFilter {
    /// Our IngressClass objects, by name.
    resources: Vec<String>,
    /// What the legacy annotations may name: `--ingress-class` and `resources`.
    annotation_names: Vec<String>,
    take_unclassed: bool,
    /// `--ingress-class` and `--controller-class`, for the diagnostics.
    ingress_class: String,
    controller_class: String,
}

/// Why an Ingress naming `--ingress-class` in `spec.ingressClassName` is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unserved {
    /// No IngressClass object of that name exists.
    NoIngressClass,
    /// The IngressClass belongs to another controller (its `spec.controller`).
    OtherController(String),
}

impl ClassFilter {
    pub fn new(
        store: &Store,
        ingress_class: &str,
        controller_class: &str,
        watch_without_class: bool,
    ) -> Self {
        let mut resources = Vec::new();
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
            resources.push(key.name.clone());
            let is_default = class
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true");
            default_is_ours |= is_default;
        }
        resources.sort();
        resources.dedup();
        let mut annotation_names = resources.clone();
        annotation_names.push(ingress_class.to_string());
        annotation_names.sort();
        annotation_names.dedup();
        Self {
            resources,
            annotation_names,
            take_unclassed: watch_without_class || default_is_ours,
            ingress_class: ingress_class.to_string(),
            controller_class: controller_class.to_string(),
        }
    }

    /// For objects without `spec.ingressClassName` (the TCP resource): the `ingress.class`
    /// or legacy class annotation, then the default rule.
    pub fn accepts_meta(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> bool {
        match annotated_class(meta) {
            Some(name) => self.annotation_names.iter().any(|n| n == name),
            None => self.take_unclassed,
        }
    }

    /// `spec.ingressClassName` first (an IngressClass of ours), then the legacy annotations,
    /// then the default rule.
    pub fn accepts(&self, ingress: &Ingress) -> bool {
        if let Some(name) = spec_class(ingress) {
            return self.resources.iter().any(|n| n == name);
        }
        self.accepts_meta(&ingress.metadata)
    }

    /// Why `ingress` is not served although its `spec.ingressClassName` is `--ingress-class`
    /// (an operator who names the class expects it served, and gets a diagnostic instead);
    /// `None` for Ingresses that are served or name another class.
    pub fn unserved(&self, store: &Store, ingress: &Ingress) -> Option<Unserved> {
        let name = spec_class(ingress).filter(|n| *n == self.ingress_class)?;
        if self.resources.iter().any(|n| n == name) {
            return None;
        }
        let class = store.ingress_classes().find(|(k, _)| k.name == name);
        Some(match class {
            None => Unserved::NoIngressClass,
            Some((_, class)) => Unserved::OtherController(
                class
                    .spec
                    .as_ref()
                    .and_then(|s| s.controller.clone())
                    .unwrap_or_default(),
            ),
        })
    }

    /// The diagnostic's text for [`ClassFilter::unserved`].
    pub fn unserved_message(&self, why: &Unserved) -> String {
        let name = &self.ingress_class;
        match why {
            Unserved::NoIngressClass => format!(
                "IngressClass {name} does not exist; the Ingress is not served until an IngressClass {name} with spec.controller {} exists",
                self.controller_class
            ),
            Unserved::OtherController(other) => format!(
                "IngressClass {name} belongs to controller {other:?}, not {}; the Ingress is not served",
                self.controller_class
            ),
        }
    }
}

fn spec_class(ingress: &Ingress) -> Option<&str> {
    ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
}

fn annotated_class(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&str> {
    let annotations = meta.annotations.as_ref()?;
    annotations
        .get("ingress.class")
        .or_else(|| annotations.get(LEGACY_CLASS_ANNOTATION))
        .map(String::as_str)
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
pub(crate) mod tests {
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

    /// The IngressClass `portcullis` of the default `--controller-class`.
    pub(crate) fn our_class() -> Object {
        Object::from_value(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "portcullis"},
            "spec": {"controller": "portcullis.io/ingress"}}),
        )
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
            our_class(),
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
        let mut partial_runs = 0;
        for round in 0..4 {
            if round % 2 == 1 {
                store.delete(Kind::Ingress, &victim_key);
            } else if round > 0 {
                store.upsert(victim());
            }
            let (warm, report) = pipeline.run_with(&store, &Default::default()).unwrap();
            partial_runs += u32::from(matches!(report, crate::pipeline::RunReport::Partial { .. }));
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
        assert!(partial_runs >= 3, "the later runs took parts");
    }

    fn class(name: &str, controller: &str, default: bool) -> Object {
        let annotations = if default {
            json!({DEFAULT_CLASS_ANNOTATION: "true"})
        } else {
            json!({})
        };
        Object::from_value(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"controller": controller}}),
        )
        .unwrap()
    }

    fn classed(name: &str, spec: Option<&str>, annotation: Option<&str>) -> Ingress {
        let mut value = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": "ns"}, "spec": {}});
        if let Some(c) = spec {
            value["spec"]["ingressClassName"] = json!(c);
        }
        if let Some(c) = annotation {
            value["metadata"]["annotations"] = json!({LEGACY_CLASS_ANNOTATION: c});
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn spec_class_names_need_an_ingress_class_of_ours() {
        let filter = |objects: Vec<Object>, without_class: bool| {
            let store = Store::from_objects(objects);
            (
                ClassFilter::new(&store, "portcullis", "portcullis.io/ingress", without_class),
                store,
            )
        };
        let by_spec = classed("a", Some("portcullis"), None);
        let by_annotation = classed("b", None, Some("portcullis"));
        let classless = classed("c", None, None);

        // No IngressClass object: the name alone serves nothing, and says why.
        let (f, store) = filter(vec![], false);
        assert!(!f.accepts(&by_spec));
        assert_eq!(f.unserved(&store, &by_spec), Some(Unserved::NoIngressClass));
        assert!(
            f.accepts(&by_annotation),
            "the legacy annotation names the class"
        );
        assert!(!f.accepts(&classless));
        assert_eq!(f.unserved(&store, &by_annotation), None);

        // Ours: served, no diagnostic.
        let (f, store) = filter(vec![our_class()], false);
        assert!(f.accepts(&by_spec));
        assert_eq!(f.unserved(&store, &by_spec), None);

        // The same name given to another controller: not ours any more.
        let (f, store) = filter(vec![class("portcullis", "example.com/other", false)], false);
        assert!(!f.accepts(&by_spec));
        assert_eq!(
            f.unserved(&store, &by_spec),
            Some(Unserved::OtherController("example.com/other".into()))
        );
        assert!(
            f.unserved_message(&Unserved::NoIngressClass)
                .contains("IngressClass portcullis does not exist")
        );

        // Class-less Ingresses: ours when our class is the default, or with the flag, even
        // while another controller's class is the default (the operator asked for them).
        let (f, _) = filter(vec![class("edge", "portcullis.io/ingress", true)], false);
        assert!(f.accepts(&classless));
        assert!(f.accepts(&classed("d", Some("edge"), None)));
        let (f, _) = filter(vec![class("nginx", "k8s.io/ingress-nginx", true)], false);
        assert!(!f.accepts(&classless));
        let (f, _) = filter(vec![class("nginx", "k8s.io/ingress-nginx", true)], true);
        assert!(f.accepts(&classless));
        assert!(!f.accepts(&classed("e", Some("nginx"), None)));
    }

    /// Deleting the IngressClass takes its Ingresses' routes away, run after run (warm runs
    /// equal fresh ones), and leaves an Ingress of the class by annotation alone.
    #[test]
    fn deleting_the_ingress_class_unserves_its_ingresses_only() {
        let config = crate::translate::TranslateConfig::default();
        let annotated = Object::from_value(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "legacy", "namespace": "b",
                "annotations": {LEGACY_CLASS_ANNOTATION: "portcullis"}},
            "spec": {"rules": [{"host": "legacy.example", "http": {"paths": [{"path": "/",
                "pathType": "Prefix",
                "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}
        }))
        .unwrap();
        let mut store = Store::from_objects([
            our_class(),
            service("a"),
            service("b"),
            ingress("a", "site", 1, &[("site.example", "/")]),
            annotated,
        ]);
        let pipeline = crate::pipeline::Pipeline::load(None, None, config.clone()).unwrap();
        let class_key = Key::new("", "portcullis");
        for round in 0..4 {
            let present = round % 2 == 0;
            if round > 0 {
                if present {
                    store.upsert(our_class());
                } else {
                    store.delete(Kind::IngressClass, &class_key);
                }
            }
            let (warm, _) = pipeline.run_with(&store, &Default::default()).unwrap();
            let cold = crate::pipeline::Pipeline::load(None, None, config.clone())
                .unwrap()
                .run(&store)
                .unwrap();
            assert_eq!(warm.rendered.haproxy_cfg(), cold.rendered.haproxy_cfg());
            let maps: String = warm
                .rendered
                .files()
                .iter()
                .filter(|(name, _)| name.ends_with(".map"))
                .filter_map(|(_, content)| content.text())
                .collect();
            assert_eq!(
                maps.contains("site.example/"),
                present,
                "round {round}: {maps}"
            );
            assert!(maps.contains("legacy.example/"), "round {round}: {maps}");
            let said = warm.diagnostics.iter().any(|d| {
                let d = d.to_string();
                d.contains("Ingress a/site") && d.contains("IngressClass portcullis does not exist")
            });
            assert_eq!(said, !present, "round {round}");
        }
    }
}
