//! One object can only hurt itself, when HAProxy is the one to refuse it: a real `portcullis
//! run` drives a real HAProxy; a hostile TCP object binds an address another process holds
//! (which `haproxy -c` passes and every reload then fails on). The object is traced from
//! HAProxy's verdict, left out with an error naming it, and everyone else's changes go live.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::TcpListener;

use support::{APPLY_TIMEOUT, Harness, ingress, route, wait_until};

/// A TCP object in namespace `evil` binding `127.0.0.1:port`, to its own Service.
fn tcp_grab(port: u16, tag: &str) -> String {
    format!(
        "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  name: grab\n  namespace: evil\n  \
         annotations: {{ingress.class: portcullis, tag: {tag}}}\nspec:\n  - name: grab\n    frontend:\n      \
         name: grab\n      binds:\n        - {{name: v4, address: 127.0.0.1, port: {port}}}\n    \
         service: {{name: db, port: 80}}\n"
    )
}

#[test]
fn a_bind_on_an_address_in_use_is_left_out_and_everyone_else_goes_live() {
    let mut h = Harness::new();
    let victim = h.backend("victim", "web");
    h.write("victim.yaml", &victim);
    h.write(
        "victim-ingress.yaml",
        &ingress(
            "victim",
            "site",
            &[route(Some("victim.example"), "/", "Prefix", "web")],
            None,
            &[],
        ),
    );
    h.start(&[]);
    assert_eq!(h.who("victim.example", "/"), "web");

    // Another process holds the port: HAProxy's check passes, a reload would fail.
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let db = h.backend("evil", "db");
    h.write("evil-db.yaml", &db);
    h.write("evil-tcp.yaml", &tcp_grab(port, "one"));
    let newcomer = h.backend("newcomer", "app");
    h.write("newcomer.yaml", &newcomer);
    h.write(
        "newcomer-ingress.yaml",
        &ingress(
            "newcomer",
            "app",
            &[route(Some("new.example"), "/", "Prefix", "app")],
            None,
            &[],
        ),
    );
    wait_until(APPLY_TIMEOUT, "the newcomer goes live", || {
        h.try_get("new.example", "/")
            .is_some_and(|a| a.status == 200)
    });
    assert_eq!(h.who("victim.example", "/"), "web");
    assert_eq!(h.who("new.example", "/"), "app");
    wait_until(APPLY_TIMEOUT, "an error naming the TCP object", || {
        h.log()
            .lines()
            .any(|l| l.contains("error: TCP evil/grab") && l.contains("left out until it changes"))
    });
    let (status, detail) = h.readyz().unwrap();
    assert_eq!(status, 200, "{detail}");
    assert!(
        std::fs::read_to_string(h.config_dir().join("haproxy.cfg"))
            .unwrap()
            .find("tcp_grab")
            .is_none(),
        "the refused frontend is not in the configuration on disk"
    );

    // The port is freed and the object edited: it gets another chance and goes live.
    drop(holder);
    h.write("evil-tcp.yaml", &tcp_grab(port, "two"));
    wait_until(
        APPLY_TIMEOUT,
        "the edited TCP object binds its port",
        || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && std::fs::read_to_string(h.config_dir().join("haproxy.cfg"))
                    .is_ok_and(|c| c.contains("frontend tcp_grab"))
        },
    );
    assert_eq!(h.who("victim.example", "/"), "web");
    assert!(h.readyz().is_some_and(|(s, _)| s == 200));
}
