//! Pattern files (`--configmap-patternfiles`): the ConfigMap read once per run into the files
//! written next to haproxy.cfg, and the access lists that name one (`allow-list:
//! patterns/<key>`) checked against them.
//!
//! Scripts return the reference as it is written; it is resolved here, after the hook, so that
//! a hook's remembered result never depends on a file it did not read. A reference that cannot
//! be used (no such ConfigMap or key, a key refused, a line that is not an address) fails
//! closed exactly as a bad inline value does.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Translator;
use crate::diagnostics::Severity;
use crate::model::{DenyAll, PatternFile};
use crate::objects::{Key, Kind, ObjectRef};
use crate::policy::RouteOutcome;
use crate::values;

/// The pattern files of one run.
#[derive(Debug, Clone, Default)]
pub struct PatternFiles {
    /// The ConfigMap `--configmap-patternfiles` names, and whether it exists.
    source: Option<(Key, bool)>,
    /// Every key, with its file or why it was refused.
    keys: BTreeMap<String, Result<Entry, String>>,
}

#[derive(Debug, Clone)]
struct Entry {
    file: PatternFile,
    /// Whether every line is an IP address or CIDR block, or the first line that is not.
    addresses: Result<usize, (usize, String)>,
}

impl PatternFiles {
    /// The files of `key`'s ConfigMap in `store` (none without the flag), and the problems
    /// with its keys, each against the ConfigMap and the key.
    pub fn load(
        store: &crate::store::Store,
        key: Option<&Key>,
        diags: &mut crate::diagnostics::Diagnostics,
    ) -> Self {
        let Some(key) = key else {
            return Self::default();
        };
        let object = ObjectRef::new(Kind::ConfigMap, key);
        let Some(cm) = store.config_map(key) else {
            diags.object(
                Severity::Warning,
                &object,
                "--configmap-patternfiles",
                "the ConfigMap does not exist; access lists naming a pattern file refuse every request",
            );
            return Self {
                source: Some((key.clone(), false)),
                keys: BTreeMap::new(),
            };
        };
        let mut keys = BTreeMap::new();
        for (name, content) in cm.data.iter().flatten() {
            let entry = values::parse_pattern_key(name)
                .and_then(|_| values::check_pattern_content(content))
                .map(|()| Entry {
                    file: PatternFile {
                        key: name.clone(),
                        path: values::pattern_path(name),
                        content: Arc::from(content.as_str()),
                    },
                    addresses: values::check_address_patterns(content),
                });
            if let Err(e) = &entry {
                diags.object(
                    Severity::Error,
                    &object,
                    format!("key {name}"),
                    format!("{e}; pattern file not written"),
                );
            }
            keys.insert(name.clone(), entry);
        }
        for name in cm.binary_data.iter().flatten().map(|(k, _)| k) {
            diags.object(
                Severity::Warning,
                &object,
                format!("binaryData.{name}"),
                "pattern files are read from data only; ignored",
            );
        }
        Self {
            source: Some((key.clone(), true)),
            keys,
        }
    }

    /// The files to write, by key.
    pub fn files(&self) -> Vec<PatternFile> {
        self.keys
            .values()
            .filter_map(|e| e.as_ref().ok())
            .map(|e| e.file.clone())
            .collect()
    }

    /// Whether `path` (`patterns/<key>`) names a pattern file of IP addresses and CIDR
    /// blocks, which an access list may use with `-f`: how many it holds, or why not.
    pub fn check_addresses(&self, path: &str) -> Result<usize, String> {
        let key = values::parse_pattern_ref(path)?;
        let Some((cm, exists)) = &self.source else {
            return Err(format!(
                "{path} names a pattern file, but no --configmap-patternfiles ConfigMap is set"
            ));
        };
        let cm = format!("ConfigMap {}/{}", cm.namespace, cm.name);
        if !exists {
            return Err(format!(
                "{path}: the {cm} (--configmap-patternfiles) does not exist"
            ));
        }
        match self.keys.get(&key) {
            None => Err(format!("{path}: the {cm} has no key {key:?}")),
            Some(Err(e)) => Err(format!("{path}: key {key:?} of the {cm} is refused: {e}")),
            Some(Ok(entry)) => entry
                .addresses
                .clone()
                .map_err(|(line, e)| format!("{path} line {line} (key {key:?} of the {cm}): {e}")),
        }
    }
}

impl Translator<'_> {
    /// Checks the pattern files `outcome`'s access lists and rate-limit whitelist name,
    /// reporting against `object` each one that cannot be used: a bad access list refuses
    /// every request of the routes (403), a bad whitelist exempts nobody.
    pub(super) fn check_pattern_refs(&mut self, object: &ObjectRef, outcome: &mut RouteOutcome) {
        let s = &outcome.settings;
        let whitelist = s
            .rate_limit
            .as_ref()
            .and_then(|r| r.whitelist_file.as_ref());
        if s.allow_file.is_none() && s.deny_file.is_none() && whitelist.is_none() {
            return;
        }
        let patterns = self.ctx.patterns.clone();
        let settings = Arc::make_mut(&mut outcome.settings);
        let mut because = Vec::new();
        for (name, file) in [
            ("allow-list", &mut settings.allow_file),
            ("deny-list", &mut settings.deny_file),
        ] {
            let Some(path) = file.as_deref() else {
                continue;
            };
            let checked = patterns.check_addresses(path);
            if name == "allow-list" && checked == Ok(0) {
                self.diags.object(
                    Severity::Warning,
                    object,
                    name,
                    format!("{path} holds no address: everyone gets 403 on these routes"),
                );
            }
            if let Err(e) = checked {
                self.diags.object(
                    Severity::Error,
                    object,
                    name,
                    format!("{e}; everyone gets 403 on these routes until it is fixed"),
                );
                // Nothing names a file HAProxy would refuse to load.
                *file = None;
                because.push(name.to_string());
            }
        }
        if !because.is_empty() {
            settings
                .deny_all
                .get_or_insert_with(|| DenyAll {
                    status: 403,
                    because: Vec::new(),
                })
                .because
                .extend(because);
        }
        if let Some(limit) = settings.rate_limit.as_mut() {
            if let Some(path) = limit.whitelist_file.as_deref() {
                if let Err(e) = patterns.check_addresses(path) {
                    self.diags.object(
                        Severity::Error,
                        object,
                        "rate-limit-whitelist",
                        format!("{e}; nobody is exempt from the rate limit until it is fixed"),
                    );
                    limit.whitelist_file = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::Diagnostics;
    use crate::store::Store;

    fn config_map() -> Store {
        let object = crate::objects::Object::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "patternfiles", "namespace": "ops"},
            "data": {
                "ips": "# office\n192.168.0.0/24\n192.168.1.1\n",
                "mapping": "alpha 0\n",
                "bad": "10.0.0.1\n10.0.0.300\n",
                ".hidden": "x",
            }
        }))
        .unwrap();
        Store::from_objects(vec![object])
    }

    #[test]
    fn files_are_read_and_references_checked() {
        let store = config_map();
        let key = Key::new("ops", "patternfiles");
        let mut diags = Diagnostics::new();
        let files = PatternFiles::load(&store, Some(&key), &mut diags);
        let written: Vec<_> = files.files().into_iter().map(|f| f.path).collect();
        assert_eq!(
            written,
            ["patterns/bad", "patterns/ips", "patterns/mapping"]
        );
        let reported: Vec<_> = diags.iter().map(|d| d.field.clone()).collect();
        assert_eq!(reported, [Some("key .hidden".to_string())]);
        assert_eq!(files.check_addresses("patterns/ips"), Ok(2));
        let e = files.check_addresses("patterns/bad").unwrap_err();
        assert!(
            e.contains("patterns/bad line 2") && e.contains("\"10.0.0.300\""),
            "{e}"
        );
        let e = files.check_addresses("patterns/mapping").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = files.check_addresses("patterns/nope").unwrap_err();
        assert!(e.contains("has no key \"nope\""), "{e}");
        let e = files.check_addresses("patterns/.hidden").unwrap_err();
        assert!(e.contains("not a pattern file name"), "{e}");
    }

    #[test]
    fn without_the_configmap_nothing_resolves() {
        let store = Store::default();
        let mut diags = Diagnostics::new();
        let none = PatternFiles::load(&store, None, &mut diags);
        assert!(diags.is_empty());
        let e = none.check_addresses("patterns/ips").unwrap_err();
        assert!(e.contains("no --configmap-patternfiles"), "{e}");
        let key = Key::new("ops", "patternfiles");
        let missing = PatternFiles::load(&store, Some(&key), &mut diags);
        assert_eq!(diags.iter().count(), 1);
        let e = missing.check_addresses("patterns/ips").unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }
}
