//! End-to-end tests of two containment promises, on a real HAProxy driven by `portcullis run`
//! over a directory of manifests:
//!
//! - a bad value of a setting that guards access fails closed: the protected route keeps
//!   refusing (403, 401, 503), never answers 200 as if the setting were absent;
//! - the last good input stays: a manifest file with a YAML syntax error, in one document or
//!   whole, keeps the victim's routes serving, and `/readyz` shows the error until it is fixed.
//!
//! After each hostile change a new good Ingress in namespace `newcomer` must go live within a
//! few seconds, so every assertion is made on a configuration that has taken the change.
//! Every test has its own ports, directories and processes; every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::annotated;

use std::time::Duration;

use support::{Harness, base64, holds_for, ingress, route, wait_until};

/// How soon a newcomer's Ingress must answer after it is written.
const GO_LIVE: Duration = Duration::from_secs(8);
/// How long a status that must not change is watched.
const WATCH: Duration = Duration::from_millis(300);

/// An Ingress `name` in `ns` routing `<name>.example.com/` to Service `service`.
fn site(ns: &str, name: &str, service: &str, annotations: &[(&str, &str)]) -> String {
    let host = format!("{name}.example.com");
    let doc = ingress(
        ns,
        name,
        &[route(Some(&host), "/", "Prefix", service)],
        None,
        &[],
    );
    if annotations.is_empty() {
        doc
    } else {
        annotated(&doc, annotations)
    }
}

/// Writes the `n`th newcomer (its own echo pod and Ingress in namespace `newcomer`) and waits
/// until it answers, within [`GO_LIVE`].
fn newcomer_goes_live(h: &mut Harness, n: usize) {
    let name = format!("newcomer{n}");
    let backend = h.backend("newcomer", &name);
    h.write(
        &format!("{name}.yaml"),
        &format!("{backend}---\n{}", site("newcomer", &name, &name, &[])),
    );
    let host = format!("{name}.example.com");
    let took = wait_until(GO_LIVE, &format!("{host} answers"), || {
        h.try_get(&host, "/").is_some_and(|a| a.who() == name)
    });
    eprintln!("{name} live after {took:?}");
}

/// Waits until a log line holds every one of `parts`.
fn wait_for_log(h: &Harness, parts: &[&str]) {
    wait_until(GO_LIVE, &format!("a log line with {parts:?}"), || {
        h.log().lines().any(|l| parts.iter().all(|p| l.contains(p)))
    });
}

/// The status `host` answers with, watched for a while: it must not change.
fn steady_status(h: &Harness, host: &str, expected: u16, extra: &[(&str, &str)]) {
    holds_for(WATCH, &format!("{host} answering {expected}"), || {
        let status = h.get_with(host, "/", extra).status;
        assert_ne!(status, 200, "{host} opened up:\n{}", h.log());
        status == expected
    });
}

/// `source_errors` of `/readyz`, joined.
fn source_errors(h: &Harness) -> String {
    h.readyz()
        .and_then(|(_, json)| json.get("source_errors").cloned())
        .and_then(|v| v.as_array().cloned())
        .map(|lines| {
            lines
                .iter()
                .filter_map(|l| l.as_str().map(str::to_string))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// alice's password hash (`openssl passwd -6 alice-pw`).
const ALICE: &str = "$6$aliceSalt$X2b53EFzySBqhWCVNZEEZXodjGcJirtaxIv/ymrKDCfnlKTKkuvMYzGHCmuEHx5gSzlQC16EMBOdofzP3q01U1";

#[test]
fn settings_that_guard_access_fail_closed() {
    let mut h = Harness::new();
    // The victims: one pod behind an allow-list that excludes the test client (127.0.0.1),
    // one behind basic authentication, one the pods reach in TLS.
    let victim = h.backend("victim", "victim");
    h.write("victim-backend.yaml", &victim);
    let allow = |value: &str| {
        site(
            "victim",
            "guarded",
            "victim",
            &[("haproxy.org/allow-list", value)],
        )
    };
    h.write("guarded.yaml", &allow("10.0.0.0/8"));
    h.write(
        "vault-users.yaml",
        &format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: vault-users\n  namespace: victim\n\
             type: Opaque\nstringData:\n  alice: {ALICE:?}\n"
        ),
    );
    let vault = |secret: &str| {
        site(
            "victim",
            "vault",
            "victim",
            &[
                ("haproxy.org/auth-type", "basic-auth"),
                ("haproxy.org/auth-secret", secret),
            ],
        )
    };
    h.write("vault.yaml", &vault("vault-users"));
    h.start(&[]);
    let alice = format!("Basic {}", base64(b"alice:alice-pw"));
    let as_alice = [("Authorization", alice.as_str())];

    assert_eq!(h.get("guarded.example.com", "/").status, 403);
    assert_eq!(h.get("vault.example.com", "/").status, 401);
    assert_eq!(
        h.get_with("vault.example.com", "/", &as_alice).who(),
        "victim"
    );

    // The allow-list turns into "banana": still 403, and the Ingress' field is named.
    h.write("guarded.yaml", &allow("banana"));
    // A deny-list that does not parse refuses everyone too.
    h.write(
        "blocked.yaml",
        &site(
            "victim",
            "blocked",
            "victim",
            &[("haproxy.org/deny-list", "10.0.0.0/33")],
        ),
    );
    newcomer_goes_live(&mut h, 1);
    wait_for_log(
        &h,
        &[
            "Ingress victim/guarded",
            "annotation haproxy.org/allow-list",
            "everyone gets 403",
        ],
    );
    steady_status(&h, "guarded.example.com", 403, &[]);
    wait_for_log(
        &h,
        &["Ingress victim/blocked", "annotation haproxy.org/deny-list"],
    );
    steady_status(&h, "blocked.example.com", 403, &[]);

    // The auth Secret goes missing: nobody logs in, alice included.
    h.write("vault.yaml", &vault("gone"));
    newcomer_goes_live(&mut h, 2);
    wait_for_log(
        &h,
        &[
            "Ingress victim/vault",
            "auth-secret",
            "Secret victim/gone does not exist",
        ],
    );
    steady_status(&h, "vault.example.com", 401, &as_alice);
    // And a value that is not a Secret name at all: the same.
    h.write("vault.yaml", &vault("Not A Name"));
    newcomer_goes_live(&mut h, 3);
    wait_for_log(
        &h,
        &[
            "Ingress victim/vault",
            "annotation haproxy.org/auth-secret",
            "nobody can log in",
        ],
    );
    steady_status(&h, "vault.example.com", 401, &as_alice);

    // TLS to the pods asked for with a bad value: 503, not plain text to the pods.
    let plain = h.echo("plain");
    h.write(
        "plain.yaml",
        &format!(
            "{}---\n{}---\n{}",
            support::service(
                "victim",
                "plain",
                &[("haproxy.org/server-ssl", "yes please")]
            ),
            support::endpoint_slices("victim", "plain", &[("0", plain, true)]),
            site("victim", "plain", "plain", &[])
        ),
    );
    newcomer_goes_live(&mut h, 4);
    wait_for_log(
        &h,
        &["Service victim/plain", "annotation haproxy.org/server-ssl"],
    );
    steady_status(&h, "plain.example.com", 503, &[]);

    // Fixed, each answers again as it should.
    h.write("guarded.yaml", &allow("127.0.0.1"));
    h.write("vault.yaml", &vault("vault-users"));
    wait_until(GO_LIVE, "the fixed allow-list lets 127.0.0.1 in", || {
        h.get("guarded.example.com", "/").who() == "victim"
    });
    wait_until(GO_LIVE, "alice logs in again", || {
        h.get_with("vault.example.com", "/", &as_alice).who() == "victim"
    });
}

#[test]
fn a_broken_manifest_file_keeps_its_last_good_objects() {
    let mut h = Harness::new();
    let victim = h.backend("victim", "victim");
    let good = format!("{victim}---\n{}", site("victim", "victim", "victim", &[]));
    h.write("victim.yaml", &good);
    h.start(&[]);
    assert_eq!(h.who("victim.example.com", "/"), "victim");
    assert_eq!(source_errors(&h), "");

    // A fourth document with a YAML syntax error: the three before it still load.
    let broken_document = "apiVersion: v1\nkind: Service\nmetadata: {name: [broken\n";
    h.write("victim.yaml", &format!("{good}---\n{broken_document}"));
    newcomer_goes_live(&mut h, 1);
    wait_until(GO_LIVE, "/readyz names the broken document", || {
        source_errors(&h).contains("victim.yaml (document 4)")
    });
    holds_for(WATCH, "the victim answering", || {
        h.who("victim.example.com", "/") == "victim"
    });

    // The whole file stops parsing: its objects stay, and /readyz says why.
    h.write("victim.yaml", "apiVersion: v1\nkind: [Service\n---\n: {\n");
    newcomer_goes_live(&mut h, 2);
    wait_until(GO_LIVE, "/readyz names the file kept", || {
        let errors = source_errors(&h);
        errors.contains("victim.yaml (document 1)")
            && errors.contains("victim.yaml: a document does not parse")
            && errors.contains("Ingress victim/victim")
    });
    holds_for(WATCH, "the victim answering", || {
        h.who("victim.example.com", "/") == "victim"
    });
    let (status, _) = h.readyz().unwrap();
    assert_eq!(status, 200);

    // Fixed: the error clears, and the victim still answers.
    h.write("victim.yaml", &good);
    newcomer_goes_live(&mut h, 3);
    wait_until(GO_LIVE, "/readyz has no source errors", || {
        source_errors(&h).is_empty()
    });
    assert_eq!(h.who("victim.example.com", "/"), "victim");

    // Removed, the file's objects go.
    h.remove("victim.yaml");
    wait_until(GO_LIVE, "the victim is gone", || {
        h.get("victim.example.com", "/").status == 404
    });
}
