//! An invalid Secret update never takes a certificate away: the previous good certificate
//! stays in force, and the problem is reported (diagnostic and metric).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::*;

const NS: &str = "shop";

#[test]
fn an_invalid_secret_update_keeps_the_previous_certificate() {
    let mut h = Harness::new();
    let (crt, key) = self_signed(&h.work(), "secure.example.com", "good");
    write_tls_site(&mut h, NS, "secure.example.com", "secure-tls");
    h.write("secret.yaml", &tls_secret(NS, "secure-tls", &crt, &key));
    h.start(&[]);
    let good = fingerprint(&h.work(), &crt);
    let served = |h: &Harness| {
        served_certificate(h.https_port, "secure.example.com").map(|c| fingerprint(&h.work(), &c))
    };
    assert_eq!(served(&h).as_deref(), Some(good.as_str()));
    let reloads = h.reloads();

    // The key of another certificate: not a usable pair.
    let (_, other_key) = self_signed(&h.work(), "secure.example.com", "other");
    h.write(
        "secret.yaml",
        &tls_secret(NS, "secure-tls", &crt, &other_key),
    );
    wait_until(APPLY_TIMEOUT, "the invalid Secret is reported", || {
        h.try_metric("portcullis_input_diagnostics{severity=\"error\"}")
            .is_some_and(|v| v >= 1.0)
    });
    holds_for(
        Duration::from_millis(500),
        "the good certificate is still served",
        || served(&h).as_deref() == Some(good.as_str()),
    );
    assert!(h.log().contains("the previous certificate stays in force"));
    assert_eq!(h.reloads(), reloads);

    // A valid new certificate replaces it.
    let (crt2, key2) = self_signed(&h.work(), "secure.example.com", "new");
    h.write("secret.yaml", &tls_secret(NS, "secure-tls", &crt2, &key2));
    let new = fingerprint(&h.work(), &crt2);
    wait_until(APPLY_TIMEOUT, "the new certificate is served", || {
        served(&h).as_deref() == Some(new.as_str())
    });
    assert_eq!(h.reloads(), reloads);
}
