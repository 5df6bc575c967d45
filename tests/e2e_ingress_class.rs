//! The IngressClass object decides, against a real HAProxy: an Ingress naming a class in
//! `spec.ingressClassName` is served only while an IngressClass of that name exists with this
//! controller's `spec.controller`. Deleting it, or handing it to another controller, takes
//! that Ingress' routes away (with a diagnostic on the Ingress) and leaves every other
//! Ingress alone; bringing it back serves the Ingress again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

const NS: &str = "shop";

fn said(h: &Harness, parts: &[&str]) -> bool {
    h.log().lines().any(|l| parts.iter().all(|p| l.contains(p)))
}

#[test]
fn deleting_the_ingress_class_unserves_its_ingresses_and_no_others() {
    let mut h = Harness::new();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    h.write(
        "web-ingress.yaml",
        &ingress(
            NS,
            "web",
            &[route(Some("web.example.com"), "/", "Prefix", "web")],
            None,
            &[],
        ),
    );
    // Of the class by the legacy annotation, which names the class itself.
    let legacy = ingress(
        NS,
        "legacy",
        &[route(Some("legacy.example.com"), "/", "Prefix", "web")],
        None,
        &[],
    )
    .replace("  ingressClassName: portcullis\n", "");
    h.write(
        "legacy-ingress.yaml",
        &annotated(&legacy, &[("kubernetes.io/ingress.class", "portcullis")]),
    );
    h.start(&[]);
    assert_eq!(h.who("web.example.com", "/"), "web");
    assert_eq!(h.who("legacy.example.com", "/"), "web");

    // The IngressClass goes away: its Ingress is no longer served, and says why.
    h.remove("00-ingressclass.yaml");
    wait_until(APPLY_TIMEOUT, "web.example.com is no longer routed", || {
        h.try_get("web.example.com", "/")
            .is_some_and(|a| a.status == 404)
    });
    wait_until(APPLY_TIMEOUT, "a diagnostic on the Ingress", || {
        said(
            &h,
            &[
                "Ingress shop/web",
                "spec.ingressClassName",
                "IngressClass portcullis does not exist",
            ],
        )
    });
    assert_eq!(h.who("legacy.example.com", "/"), "web", "{}", h.log());

    // The same name given to another controller: still not ours.
    h.write(
        "00-ingressclass.yaml",
        &INGRESS_CLASS.replace("portcullis.io/ingress", "example.com/other"),
    );
    wait_until(APPLY_TIMEOUT, "the other controller is named", || {
        said(&h, &["Ingress shop/web", "example.com/other"])
    });
    assert_eq!(h.try_get("web.example.com", "/").unwrap().status, 404);
    assert_eq!(h.who("legacy.example.com", "/"), "web");

    // Ours again: served again.
    h.write("00-ingressclass.yaml", INGRESS_CLASS);
    wait_until(APPLY_TIMEOUT, "web.example.com is routed again", || {
        h.try_get("web.example.com", "/")
            .is_some_and(|a| a.who() == "web")
    });
    assert_eq!(h.reloads().1, 0, "no reload failed");
}
