//! The scripts compiled into the binary, from the repository's `scripts/` directory.

/// (file name, source) of every bundled script.
pub(crate) const SCRIPTS: &[(&str, &str)] = &[
    (
        "abortonclose.rhai",
        include_str!("../../../scripts/abortonclose.rhai"),
    ),
    (
        "access-list.rhai",
        include_str!("../../../scripts/access-list.rhai"),
    ),
    (
        "basic-auth.rhai",
        include_str!("../../../scripts/basic-auth.rhai"),
    ),
    ("check.rhai", include_str!("../../../scripts/check.rhai")),
    (
        "client-ca.rhai",
        include_str!("../../../scripts/client-ca.rhai"),
    ),
    (
        "config-snippets.rhai",
        include_str!("../../../scripts/config-snippets.rhai"),
    ),
    (
        "cookie-persistence.rhai",
        include_str!("../../../scripts/cookie-persistence.rhai"),
    ),
    ("cors.rhai", include_str!("../../../scripts/cors.rhai")),
    (
        "forwarded-for.rhai",
        include_str!("../../../scripts/forwarded-for.rhai"),
    ),
    (
        "global-settings.rhai",
        include_str!("../../../scripts/global-settings.rhai"),
    ),
    ("hsts.rhai", include_str!("../../../scripts/hsts.rhai")),
    (
        "load-balance.rhai",
        include_str!("../../../scripts/load-balance.rhai"),
    ),
    (
        "path-rewrite.rhai",
        include_str!("../../../scripts/path-rewrite.rhai"),
    ),
    (
        "pod-maxconn.rhai",
        include_str!("../../../scripts/pod-maxconn.rhai"),
    ),
    (
        "proxy-protocol.rhai",
        include_str!("../../../scripts/proxy-protocol.rhai"),
    ),
    (
        "rate-limit.rhai",
        include_str!("../../../scripts/rate-limit.rhai"),
    ),
    (
        "request-capture.rhai",
        include_str!("../../../scripts/request-capture.rhai"),
    ),
    (
        "request-redirect.rhai",
        include_str!("../../../scripts/request-redirect.rhai"),
    ),
    (
        "request-set-header.rhai",
        include_str!("../../../scripts/request-set-header.rhai"),
    ),
    (
        "response-set-header.rhai",
        include_str!("../../../scripts/response-set-header.rhai"),
    ),
    (
        "route-acl.rhai",
        include_str!("../../../scripts/route-acl.rhai"),
    ),
    (
        "scale-server-slots.rhai",
        include_str!("../../../scripts/scale-server-slots.rhai"),
    ),
    (
        "send-proxy-protocol.rhai",
        include_str!("../../../scripts/send-proxy-protocol.rhai"),
    ),
    (
        "server-ca.rhai",
        include_str!("../../../scripts/server-ca.rhai"),
    ),
    (
        "server-ssl.rhai",
        include_str!("../../../scripts/server-ssl.rhai"),
    ),
    (
        "set-host.rhai",
        include_str!("../../../scripts/set-host.rhai"),
    ),
    (
        "source-ip-persistence.rhai",
        include_str!("../../../scripts/source-ip-persistence.rhai"),
    ),
    (
        "src-ip-header.rhai",
        include_str!("../../../scripts/src-ip-header.rhai"),
    ),
    (
        "ssl-offloading.rhai",
        include_str!("../../../scripts/ssl-offloading.rhai"),
    ),
    (
        "ssl-passthrough.rhai",
        include_str!("../../../scripts/ssl-passthrough.rhai"),
    ),
    (
        "ssl-redirect.rhai",
        include_str!("../../../scripts/ssl-redirect.rhai"),
    ),
    (
        "standalone-backend.rhai",
        include_str!("../../../scripts/standalone-backend.rhai"),
    ),
    (
        "timeouts.rhai",
        include_str!("../../../scripts/timeouts.rhai"),
    ),
];

#[cfg(test)]
mod tests {
    #[test]
    fn every_file_in_scripts_is_bundled() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".rhai"))
            .collect();
        on_disk.sort();
        let bundled: Vec<&str> = super::SCRIPTS.iter().map(|(n, _)| *n).collect();
        assert_eq!(on_disk, bundled);
    }
}
