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
