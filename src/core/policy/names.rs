//! How an annotation key names a setting: an accepted prefix, then the setting's name.

/// Annotation prefixes accepted on objects, most specific first. The incumbent controller's
/// prefixes are accepted so its manifests work unchanged; it strips `haproxy.org/`,
/// `ingress.kubernetes.io/` and `haproxy.com/` alike (in that order) and also reads the bare
/// name, so an annotation without a prefix (and without a `/`) is read too, after them.
pub const ANNOTATION_PREFIXES: &[&str] = &[
    "portcullis.io/",
    "haproxy.org/",
    "ingress.kubernetes.io/",
    "haproxy.com/",
];

/// The accepted prefix of an annotation key (its index in [`ANNOTATION_PREFIXES`]) and the
/// name after it; `None` for a key without one.
pub fn annotation_name(key: &str) -> Option<(usize, &str)> {
    ANNOTATION_PREFIXES
        .iter()
        .position(|p| key.starts_with(p))
        .map(|i| (i, &key[ANNOTATION_PREFIXES[i].len()..]))
}
