//! References to the incumbent's `Backend`, `Defaults` and `Global` resources: `cr-backend`
//! on a Service, an Ingress or the controller ConfigMap, `cr-defaults` and `cr-global` in the
//! controller ConfigMap. A referenced resource becomes a source of settings
//! ([`ValueSource::resource`]) placed where the incumbent gives it precedence: a Backend before
//! the annotations of the backend it configures, Defaults and Global before the ConfigMap.
//! A reference that does not parse or names a missing resource is reported and ignored; the
//! fields of a referenced resource that map onto no setting are reported, each by path.

use std::collections::BTreeMap;

use super::Translator;
use crate::diagnostics::Severity;
use crate::objects::{Key, Kind, ObjectRef};
use crate::policy::ValueSource;
use crate::policy::names::ANNOTATION_PREFIXES;

/// The annotation (or ConfigMap key) naming a Backend resource.
pub const CR_BACKEND: &str = "cr-backend";
/// The ConfigMap key naming a Defaults resource.
pub const CR_DEFAULTS: &str = "cr-defaults";
/// The ConfigMap key naming a Global resource.
pub const CR_GLOBAL: &str = "cr-global";

/// The value of annotation `name` among an object's annotations, with the key that holds it:
/// under an accepted prefix (most specific first), else without a prefix (as the incumbent
/// reads annotations too).
fn annotation<'m>(
    annotations: &'m BTreeMap<String, String>,
    name: &str,
) -> Option<(&'m str, String)> {
    ANNOTATION_PREFIXES
        .iter()
        .map(|p| format!("{p}{name}"))
        .chain(std::iter::once(name.to_string()))
        .find_map(|key| {
            let v = annotations.get(&key)?;
            Some((v.as_str(), format!("annotation {key}")))
        })
}

impl Translator<'_> {
    /// The Backend resource for a backend: named by `cr-backend` on its Service, else on the
    /// Ingress that registered it, else in the controller ConfigMap. Annotations of the
    /// Service and Ingress that it overrides are reported.
    pub(super) fn backend_resource(
        &mut self,
        service: (&ObjectRef, &BTreeMap<String, String>),
        ingress: Option<(&ObjectRef, &BTreeMap<String, String>)>,
    ) -> Option<ValueSource> {
        let annotated = std::iter::once(service).chain(ingress);
        let source = match annotated
            .clone()
            .find_map(|(object, a)| Some((object, annotation(a, CR_BACKEND)?)))
        {
            Some((object, (value, field))) => {
                self.resource_source(Kind::Backend, value, object, field)
            }
            None => self.config_map_reference(Kind::Backend, CR_BACKEND),
        }?;
        let key = Key::new(source.object.namespace.clone(), source.object.name.clone());
        if let Some(resource) = self.store.resource(Kind::Backend, &key) {
            for (object, annotations) in annotated {
                for (setting, from) in &resource.settings {
                    if let Some((_, field)) = annotation(annotations, setting) {
                        self.diags.object(
                            Severity::Warning,
                            object,
                            field,
                            format!(
                                "{} ({}) sets this and takes precedence; ignored",
                                source.object, from.field
                            ),
                        );
                    }
                }
            }
        }
        Some(source)
    }

    /// The Global and Defaults resources the controller ConfigMap names, in that order.
    pub(super) fn config_resources(&mut self) -> Vec<ValueSource> {
        [(Kind::Global, CR_GLOBAL), (Kind::Defaults, CR_DEFAULTS)]
            .into_iter()
            .filter_map(|(kind, key)| self.config_map_reference(kind, key))
            .collect()
    }

    fn config_map_reference(&mut self, kind: Kind, key: &str) -> Option<ValueSource> {
        let config_map = self.ctx.config_map.as_ref()?;
        // The plain key first, then under a prefix (the ConfigMap's keys may carry one).
        let (name, value) = std::iter::once(key.to_string())
            .chain(ANNOTATION_PREFIXES.iter().map(|p| format!("{p}{key}")))
            .find_map(|name| Some((name.clone(), config_map.values.get(&name)?.clone())))?;
        let object = config_map.object.clone();
        self.resource_source(kind, &value, &object, format!("key {name}"))
    }

    /// The resource of `kind` that `value` (`NAMESPACE/NAME`, or `NAME` in the namespace of
    /// `referrer`) names, as a source of settings.
    fn resource_source(
        &mut self,
        kind: Kind,
        value: &str,
        referrer: &ObjectRef,
        field: String,
    ) -> Option<ValueSource> {
        let parsed = match value.split_once('/') {
            Some(_) => Key::parse_namespaced(value),
            None => crate::objects::validate_dns_subdomain(value)
                .map(|()| Key::new(referrer.namespace.clone(), value)),
        };
        let key = match parsed {
            Ok(key) => key,
            Err(e) => {
                self.diags.object(
                    Severity::Error,
                    referrer,
                    field,
                    format!(
                        "{e}: a {} resource is named NAMESPACE/NAME or NAME; ignored",
                        kind.as_str()
                    ),
                );
                return None;
            }
        };
        let object = ObjectRef::new(kind, &key);
        let Some(resource) = self.store.resource(kind, &key) else {
            self.diags.object(
                Severity::Error,
                referrer,
                field,
                format!("{object} does not exist (or its resource is not installed); ignored"),
            );
            return None;
        };
        for path in &resource.unread {
            self.diags.object(
                Severity::Warning,
                &object,
                path.clone(),
                "Portcullis maps no setting onto this field; ignored",
            );
        }
        Some(ValueSource::resource(object, resource))
    }
}
