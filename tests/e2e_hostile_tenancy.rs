//! End-to-end tests of host containment between tenants, on a real HAProxy driven by
//! `portcullis run` over a manifest directory, with loopback echo servers as pods:
//!
//! - a TLS host claim: an Ingress that lists another team's host in `spec.tls` (with a Secret
//!   that does not exist, then with a real one for that name) takes nothing from it;
//! - a path whose Service does not exist answers 503 instead of falling through to the host's
//!   `/` route, and goes to the Service once it exists;
//! - `--host-ownership=namespace` refuses another namespace's rule for a host, and without it
//!   the documented default (paths of one host from several namespaces merge) holds.
//!
//! After each hostile object, a new good Ingress from another namespace must go live promptly
//! while the victim keeps answering as before. Every test has its own ports, directories and
//! processes, so they run in parallel; every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::{
    APPLY_TIMEOUT, Harness, fingerprint, ingress, route, self_signed, served_certificate,
    tls_secret, wait_until, with_metadata,
};

/// How soon a new good Ingress must answer once its manifest is written.
const GOES_LIVE: Duration = Duration::from_secs(5);

/// `doc` (an Ingress made by `support`) created at `day` of January 2024: the age order of the
/// Ingresses does not depend on their names.
fn created(doc: &str, day: u8) -> String {
    with_metadata(
        doc,
        &format!("  creationTimestamp: \"2024-01-{day:02}T00:00:00Z\"\n"),
    )
}

/// An Ingress `ns/name` routing each `(host, path)` (Prefix) to Service `service`, with these
/// TLS entries, created at `day`.
fn site(
    ns: &str,
    name: &str,
    routes: &[(&str, &str)],
    service: &str,
    tls: &[(&str, &[&str])],
    day: u8,
) -> String {
    let routes: Vec<_> = routes
        .iter()
        .map(|(host, path)| route(Some(host), path, "Prefix", service))
        .collect();
    created(&ingress(ns, name, &routes, None, tls), day)
}

/// Waits until a line of the log has every one of `parts`.
fn wait_for_diagnostic(h: &Harness, parts: &[&str]) {
    wait_until(
        APPLY_TIMEOUT,
        &format!("a diagnostic with {parts:?}"),
        || h.log().lines().any(|l| parts.iter().all(|p| l.contains(p))),
    );
}

/// A new Ingress from namespace `newcomer` (its own Service) goes live within [`GOES_LIVE`].
fn newcomer_goes_live(h: &mut Harness) {
    let pods = h.backend("newcomer", "newcomer");
    h.write("newcomer-pods.yaml", &pods);
    h.write(
        "newcomer.yaml",
        &site(
            "newcomer",
            "app",
            &[("newcomer.example", "/")],
            "newcomer",
            &[],
            20,
        ),
    );
    let took = wait_until(GOES_LIVE, "the newcomer's Ingress answers", || {
        h.try_get("newcomer.example", "/")
            .is_some_and(|a| a.who() == "newcomer")
    });
    eprintln!("newcomer/app went live in {took:?}");
}

/// The victim: Ingress `victim/site` routing `victim.example` to its pods `victim`, plain
/// HTTP; and the pods `evil` of namespace `evil`.
fn victim_and_evil_pods(h: &mut Harness) {
    let victim = h.backend("victim", "victim");
    h.write("victim-pods.yaml", &victim);
    h.write(
        "victim.yaml",
        &site(
            "victim",
            "site",
            &[("victim.example", "/")],
            "victim",
            &[],
            1,
        ),
    );
    let evil = h.backend("evil", "evil");
    h.write("evil-pods.yaml", &evil);
}

#[test]
fn a_tls_host_claim_takes_nothing_from_the_victim() {
    let mut h = Harness::new();
    // A default certificate, so that an HTTPS frontend exists whatever the claim does.
    let (fallback_crt, fallback_key) = self_signed(&h.work(), "fallback.example", "fallback");
    h.write(
        "fallback.yaml",
        &tls_secret("default", "fallback", &fallback_crt, &fallback_key),
    );
    victim_and_evil_pods(&mut h);
    // evil/claim routes evil.example only, and lists victim.example in spec.tls with a
    // Secret that does not exist.
    h.write(
        "claim.yaml",
        &site(
            "evil",
            "claim",
            &[("evil.example", "/")],
            "evil",
            &[("missing", &["victim.example"])],
            2,
        ),
    );
    h.start(&["--default-ssl-certificate", "default/fallback"]);

    wait_for_diagnostic(
        &h,
        &[
            "Ingress evil/claim",
            "spec.tls[0].hosts[0]",
            "victim.example",
            "not routed",
        ],
    );
    let plain = h.get("victim.example", "/");
    assert_eq!(
        (plain.status, plain.who()),
        (200, "victim".to_string()),
        "plain HTTP for the victim is not redirected: {plain:?}"
    );
    assert_eq!(h.who("evil.example", "/"), "evil");
    let redirects = std::fs::read_to_string(h.config_dir().join("maps/ssl-redirect.map")).unwrap();
    assert!(
        !redirects.contains("victim.example"),
        "ssl-redirect.map: {redirects}"
    );

    // Again with a real certificate for victim.example, listed with evil's own host.
    let (evil_crt, evil_key) = self_signed(&h.work(), "victim.example", "evil");
    h.write(
        "evil-tls.yaml",
        &tls_secret("evil", "evil-tls", &evil_crt, &evil_key),
    );
    h.write(
        "claim.yaml",
        &site(
            "evil",
            "claim",
            &[("evil.example", "/")],
            "evil",
            &[("evil-tls", &["victim.example", "evil.example"])],
            2,
        ),
    );
    let evil_fp = fingerprint(&h.work(), &evil_crt);
    let fallback_fp = fingerprint(&h.work(), &fallback_crt);
    // The claim is applied: evil's certificate is served for its own host.
    wait_until(
        APPLY_TIMEOUT,
        "evil.example is served its certificate",
        || {
            served_certificate(h.https_port, "evil.example")
                .is_some_and(|pem| fingerprint(&h.work(), &pem) == evil_fp)
        },
    );
    let served = served_certificate(h.https_port, "victim.example").expect("a TLS handshake");
    assert_eq!(
        fingerprint(&h.work(), &served),
        fallback_fp,
        "victim.example is served the default certificate, not evil's"
    );
    let plain = h.get("victim.example", "/");
    assert_eq!(
        (plain.status, plain.who()),
        (200, "victim".to_string()),
        "{plain:?}"
    );
    // evil's own host is redirected to HTTPS, as its TLS entry asks.
    assert_eq!(h.get("evil.example", "/").status, 302);
    let crt_list = std::fs::read_to_string(h.config_dir().join("certs/crt-list.txt")).unwrap();
    assert!(!crt_list.contains("victim.example"), "crt-list: {crt_list}");

    newcomer_goes_live(&mut h);
    assert_eq!(h.who("victim.example", "/"), "victim");
}

#[test]
fn a_path_whose_service_is_missing_answers_503() {
    let mut h = Harness::new();
    let web = h.backend("shop", "web");
    h.write("web.yaml", &web);
    h.write(
        "site.yaml",
        &created(
            &ingress(
                "shop",
                "site",
                &[
                    route(Some("shop.example"), "/", "Prefix", "web"),
                    route(Some("shop.example"), "/admin", "Prefix", "admin"),
                ],
                None,
                &[],
            ),
            1,
        ),
    );
    h.start(&[]);

    wait_for_diagnostic(
        &h,
        &[
            "Ingress shop/site",
            "spec.rules[0].http.paths[1].backend.service.name",
            "Service shop/admin does not exist",
            "503",
        ],
    );
    assert_eq!(h.who("shop.example", "/"), "web");
    assert_eq!(h.who("shop.example", "/other"), "web");
    for path in ["/admin", "/admin/", "/admin/users"] {
        let answer = h.get("shop.example", path);
        assert_eq!(
            answer.status, 503,
            "{path} answers 503, not the host's `/`: {answer:?}"
        );
    }
    // Prefix paths are element-wise: /administrator is not under /admin.
    assert_eq!(h.who("shop.example", "/administrator"), "web");

    newcomer_goes_live(&mut h);

    // Once the Service exists, the path goes to it.
    let admin = h.backend("shop", "admin");
    h.write("admin.yaml", &admin);
    wait_until(APPLY_TIMEOUT, "/admin goes to the admin pods", || {
        h.try_get("shop.example", "/admin/users")
            .is_some_and(|a| a.who() == "admin")
    });
    assert_eq!(h.who("shop.example", "/admin"), "admin");
    assert_eq!(h.who("shop.example", "/"), "web");
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(
        !cfg.contains("backend portcullis_unavailable"),
        "the 503 backend is rendered only while some path needs it"
    );
}

/// evil/steal routes `victim.example/x` and its own `evil.example` to the evil pods.
fn steal(h: &Harness) {
    h.write(
        "steal.yaml",
        &site(
            "evil",
            "steal",
            &[("victim.example", "/x"), ("evil.example", "/")],
            "evil",
            &[],
            2,
        ),
    );
}

#[test]
fn with_host_ownership_by_namespace_another_namespace_is_refused() {
    let mut h = Harness::new();
    victim_and_evil_pods(&mut h);
    steal(&h);
    h.start(&["--host-ownership", "namespace"]);

    wait_for_diagnostic(
        &h,
        &[
            "Ingress evil/steal",
            "spec.rules[0].host",
            "belongs to namespace victim",
        ],
    );
    for path in ["/x", "/x/y", "/"] {
        assert_eq!(
            h.who("victim.example", path),
            "victim",
            "{path}: the victim's pods, never the evil ones"
        );
    }
    assert_eq!(h.who("evil.example", "/"), "evil", "evil's own host routes");

    newcomer_goes_live(&mut h);
    assert_eq!(h.who("victim.example", "/x"), "victim");

    // Once the victim's Ingress is gone, the host is free: evil/steal is the oldest for it.
    h.remove("victim.yaml");
    wait_until(APPLY_TIMEOUT, "victim.example/x goes to evil/steal", || {
        h.try_get("victim.example", "/x")
            .is_some_and(|a| a.who() == "evil")
    });
    assert_eq!(h.get("victim.example", "/").status, 404);
}

#[test]
fn without_host_ownership_paths_of_a_host_merge_across_namespaces() {
    let mut h = Harness::new();
    victim_and_evil_pods(&mut h);
    steal(&h);
    h.start(&[]);

    // The documented default: the younger Ingress adds the path the older one does not route.
    wait_until(APPLY_TIMEOUT, "victim.example/x goes to evil/steal", || {
        h.try_get("victim.example", "/x")
            .is_some_and(|a| a.who() == "evil")
    });
    assert_eq!(h.who("victim.example", "/"), "victim");
    assert!(
        !h.log().contains("belongs to namespace"),
        "no ownership refusal without the flag"
    );
    // A path both name goes to the older Ingress.
    h.write(
        "steal.yaml",
        &site(
            "evil",
            "steal",
            &[("victim.example", "/"), ("evil.example", "/")],
            "evil",
            &[],
            2,
        ),
    );
    wait_for_diagnostic(
        &h,
        &[
            "Ingress evil/steal",
            "victim.example path /",
            "Ingress victim/site",
            "takes precedence",
        ],
    );
    for path in ["/", "/x"] {
        assert_eq!(h.who("victim.example", path), "victim", "{path}");
    }
}
