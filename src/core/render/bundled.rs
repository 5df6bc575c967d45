//! The templates compiled into the binary, from the repository's `templates/` directory.

/// (name, source) of every bundled template.
pub(crate) const TEMPLATES: &[(&str, &str)] = &[
    (
        "haproxy.cfg.j2",
        include_str!("../../../templates/haproxy.cfg.j2"),
    ),
    (
        "parts/backend.j2",
        include_str!("../../../templates/parts/backend.j2"),
    ),
    (
        "parts/basic-auth.j2",
        include_str!("../../../templates/parts/basic-auth.j2"),
    ),
    (
        "parts/client-certificate.j2",
        include_str!("../../../templates/parts/client-certificate.j2"),
    ),
    (
        "parts/cors.j2",
        include_str!("../../../templates/parts/cors.j2"),
    ),
    (
        "parts/default-backend.j2",
        include_str!("../../../templates/parts/default-backend.j2"),
    ),
    (
        "parts/defaults.j2",
        include_str!("../../../templates/parts/defaults.j2"),
    ),
    (
        "parts/frontend-gateway-http.j2",
        include_str!("../../../templates/parts/frontend-gateway-http.j2"),
    ),
    (
        "parts/frontend-http.j2",
        include_str!("../../../templates/parts/frontend-http.j2"),
    ),
    (
        "parts/frontend-https.j2",
        include_str!("../../../templates/parts/frontend-https.j2"),
    ),
    (
        "parts/frontend-passthrough.j2",
        include_str!("../../../templates/parts/frontend-passthrough.j2"),
    ),
    (
        "parts/global.j2",
        include_str!("../../../templates/parts/global.j2"),
    ),
    (
        "parts/healthz.j2",
        include_str!("../../../templates/parts/healthz.j2"),
    ),
    (
        "parts/hsts.j2",
        include_str!("../../../templates/parts/hsts.j2"),
    ),
    (
        "parts/https-bind-options.j2",
        include_str!("../../../templates/parts/https-bind-options.j2"),
    ),
    (
        "parts/peers.j2",
        include_str!("../../../templates/parts/peers.j2"),
    ),
    (
        "parts/proxy-protocol.j2",
        include_str!("../../../templates/parts/proxy-protocol.j2"),
    ),
    (
        "parts/request-capture.j2",
        include_str!("../../../templates/parts/request-capture.j2"),
    ),
    (
        "parts/request-redirect.j2",
        include_str!("../../../templates/parts/request-redirect.j2"),
    ),
    (
        "parts/route-acl.j2",
        include_str!("../../../templates/parts/route-acl.j2"),
    ),
    (
        "parts/routing.j2",
        include_str!("../../../templates/parts/routing.j2"),
    ),
    (
        "parts/servers.j2",
        include_str!("../../../templates/parts/servers.j2"),
    ),
    (
        "parts/site/backend.j2",
        include_str!("../../../templates/parts/site/backend.j2"),
    ),
    (
        "parts/site/defaults.j2",
        include_str!("../../../templates/parts/site/defaults.j2"),
    ),
    (
        "parts/site/frontend.j2",
        include_str!("../../../templates/parts/site/frontend.j2"),
    ),
    (
        "parts/site/global.j2",
        include_str!("../../../templates/parts/site/global.j2"),
    ),
    (
        "parts/site/route-policy.j2",
        include_str!("../../../templates/parts/site/route-policy.j2"),
    ),
    (
        "parts/src-ip-header.j2",
        include_str!("../../../templates/parts/src-ip-header.j2"),
    ),
    (
        "parts/stats.j2",
        include_str!("../../../templates/parts/stats.j2"),
    ),
    (
        "parts/tcp.j2",
        include_str!("../../../templates/parts/tcp.j2"),
    ),
    (
        "parts/use-backend.j2",
        include_str!("../../../templates/parts/use-backend.j2"),
    ),
    (
        "parts/userlists.j2",
        include_str!("../../../templates/parts/userlists.j2"),
    ),
];

#[cfg(test)]
mod tests {
    fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "j2") {
                out.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }

    #[test]
    fn every_file_in_templates_is_bundled() {
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../templates"));
        let mut on_disk = Vec::new();
        walk(root, root, &mut on_disk);
        on_disk.sort();
        let bundled: Vec<&str> = super::TEMPLATES.iter().map(|(n, _)| *n).collect();
        assert_eq!(on_disk, bundled);
    }
}
