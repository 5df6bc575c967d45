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

/// Certificate files are named by Secret and content: a rotation writes a new file and never
/// rewrites one a configuration names. HAProxy takes the new content at run time under the
/// name it loaded (the default certificate included, which it will not remove from a
/// crt-list), so nothing reloads; the old file stays while HAProxy holds that name, and goes
/// with the next reload. Files of contents that were never loaded go at once.
#[test]
fn a_rotation_is_a_new_file_and_the_old_one_goes_after_the_next_reload() {
    let mut h = Harness::new();
    let default = self_signed(&h.work(), "default.example.com", "default-1");
    let secure = self_signed(&h.work(), "secure.example.com", "secure-1");
    write_tls_site(&mut h, NS, "secure.example.com", "secure-tls");
    // Written later, to cause a reload.
    let api = h.backend(NS, "api");
    h.write(
        "default.yaml",
        &tls_secret(NS, "default-tls", &default.0, &default.1),
    );
    h.write(
        "secret.yaml",
        &tls_secret(NS, "secure-tls", &secure.0, &secure.1),
    );
    h.start(&["--default-ssl-certificate", "shop/default-tls"]);
    let config = h.config_dir();
    let files = |name: &str| secret_files(&config, "certs", NS, name);
    let (d1, s1) = (files("default-tls"), files("secure-tls"));
    assert_eq!((d1.len(), s1.len()), (1, 1), "{d1:?} {s1:?}");
    let served =
        |sni: &str| served_certificate(h.https_port, sni).map(|c| fingerprint(&h.work(), &c));
    let reloads = h.reloads();

    // The default certificate rotates once, the other one twice.
    let default2 = self_signed(&h.work(), "default.example.com", "default-2");
    let secure2 = self_signed(&h.work(), "secure.example.com", "secure-2");
    let secure3 = self_signed(&h.work(), "secure.example.com", "secure-3");
    let put = |file: &str, secret: &str, c: &(String, String)| {
        h.write(file, &tls_secret(NS, secret, &c.0, &c.1));
    };
    put("default.yaml", "default-tls", &default2);
    put("secret.yaml", "secure-tls", &secure2);
    let fp = |c: &(String, String)| fingerprint(&h.work(), &c.0);
    // HAProxy serves the new content as soon as it is committed; the disk follows in the
    // same apply, just after.
    wait_until(
        APPLY_TIMEOUT,
        "both new certificates are served and written",
        || {
            served("other.example.com") == Some(fp(&default2))
                && served("secure.example.com") == Some(fp(&secure2))
                && files("default-tls").len() == 2
                && files("secure-tls").len() == 2
        },
    );
    let s2: Vec<String> = files("secure-tls")
        .into_iter()
        .filter(|f| !s1.contains(f))
        .collect();
    assert_eq!(s2.len(), 1, "{:?}", files("secure-tls"));
    put("secret.yaml", "secure-tls", &secure3);
    wait_until(
        APPLY_TIMEOUT,
        "the third certificate is served and written",
        || {
            let now = files("secure-tls");
            served("secure.example.com") == Some(fp(&secure3))
                && now.len() == 2
                && !now.contains(&s2[0])
        },
    );
    assert_eq!(h.reloads(), reloads, "rotations must not reload");

    // HAProxy still names the files it loaded; they exist, untouched.
    let held = h.runtime("show ssl cert\n");
    for file in d1.iter().chain(&s1) {
        assert!(held.contains(file.as_str()), "{file} not in:\n{held}");
        let text = std::fs::read_to_string(config.join(file)).unwrap();
        let first = if d1.contains(file) { &default } else { &secure };
        assert_eq!(
            fingerprint(&h.work(), &text),
            fp(first),
            "{file} was rewritten"
        );
    }
    // The disk names the new contents; the never-loaded second content is gone.
    let list = std::fs::read_to_string(config.join("certs/crt-list.txt")).unwrap();
    let (d_now, s_now) = (files("default-tls"), files("secure-tls"));
    assert_eq!(d_now.len(), 2, "{d_now:?}");
    assert_eq!(s_now.len(), 2, "{s_now:?}");
    assert!(!s_now.contains(&s2[0]), "{s_now:?}");
    for file in d_now
        .iter()
        .chain(&s_now)
        .filter(|f| !d1.contains(f) && !s1.contains(f))
    {
        assert!(
            list.contains(file.as_str()),
            "{file} not in crt-list:\n{list}"
        );
    }

    // A reload (a new backend) loads the disk: the old files are not named by anything now.
    h.write("api.yaml", &api);
    h.write("api-ingress.yaml", &api_ingress(NS));
    wait_until(APPLY_TIMEOUT, "the new backend reloads", || {
        h.reloads().0 > reloads.0
    });
    h.wait_old_workers_gone();
    wait_until(APPLY_TIMEOUT, "the loaded-only files are removed", || {
        files("default-tls").len() == 1 && files("secure-tls").len() == 1
    });
    assert_eq!(h.reloads().1, reloads.1, "no reload failed");
    let held = h.runtime("show ssl cert\n");
    for file in files("default-tls").iter().chain(&files("secure-tls")) {
        assert!(held.contains(file.as_str()), "{file} not in:\n{held}");
    }
    assert_eq!(served("other.example.com"), Some(fp(&default2)));
    assert_eq!(served("secure.example.com"), Some(fp(&secure3)));
}

/// A certificate HAProxy refuses though Portcullis reads it (an Ed25519 key of another
/// certificate, whose public half is not compared here) is left out of the next run with an
/// error on its Secret; the other host's certificate is served.
#[test]
fn a_certificate_haproxy_refuses_is_left_out_with_an_error_on_its_secret() {
    let mut h = Harness::new();
    let (crt, key) = self_signed(&h.work(), "secure.example.com", "good");
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "secure",
            &[
                route(Some("secure.example.com"), "/", "Prefix", "web"),
                route(Some("bad.example.com"), "/", "Prefix", "web"),
            ],
            None,
            &[
                ("secure-tls", &["secure.example.com"]),
                ("bad-tls", &["bad.example.com"]),
            ],
        ),
    );
    h.write("secret.yaml", &tls_secret(NS, "secure-tls", &crt, &key));
    let other_key = h.work().join("other-ed25519.key");
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["genpkey", "-algorithm", "ed25519", "-out"])
        .arg(&other_key);
    assert!(output_within(cmd, Duration::from_secs(20)).status.success());
    let other_key = std::fs::read_to_string(other_key).unwrap();
    h.write(
        "bad.yaml",
        &tls_secret(
            NS,
            "bad-tls",
            include_str!("fixtures/tls/ed25519.crt"),
            &other_key,
        ),
    );
    h.start(&[]);
    let good = fingerprint(&h.work(), &crt);
    let served =
        served_certificate(h.https_port, "secure.example.com").map(|c| fingerprint(&h.work(), &c));
    assert_eq!(served.as_deref(), Some(good.as_str()));
    let log = h.log();
    assert!(
        log.contains("HAProxy refused this certificate; its hosts are served without it")
            && log.contains("inconsistencies between private key and certificate"),
        "{log}"
    );
    assert!(
        h.try_metric("portcullis_input_diagnostics{severity=\"error\"}")
            .is_some_and(|v| v >= 1.0)
    );

    // Once HAProxy runs, a check loads only the certificates it does not hold yet: a refused
    // one added later is still found, and the rest stays served.
    h.write(
        "late.yaml",
        &tls_secret(
            NS,
            "late-tls",
            include_str!("fixtures/tls/ed25519.crt"),
            &other_key,
        ),
    );
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "secure",
            &[
                route(Some("secure.example.com"), "/", "Prefix", "web"),
                route(Some("bad.example.com"), "/", "Prefix", "web"),
                route(Some("late.example.com"), "/", "Prefix", "web"),
            ],
            None,
            &[
                ("secure-tls", &["secure.example.com"]),
                ("bad-tls", &["bad.example.com"]),
                ("late-tls", &["late.example.com"]),
            ],
        ),
    );
    wait_until(APPLY_TIMEOUT, "the late certificate is refused", || {
        h.log()
            .lines()
            .any(|l| l.contains("HAProxy refused this certificate") && l.contains("late-tls"))
    });
    let served =
        served_certificate(h.https_port, "secure.example.com").map(|c| fingerprint(&h.work(), &c));
    assert_eq!(served.as_deref(), Some(good.as_str()));
}
