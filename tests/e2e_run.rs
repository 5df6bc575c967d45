//! End-to-end tests of `portcullis run`: the real binary drives a real HAProxy, requests go
//! through it over loopback to echo backends that say who they are, and the master CLI's reload
//! counter shows whether a change needed a reload.
//!
//! Every test has its own ports, directories and processes, so they run in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use support::{
    APPLY_TIMEOUT, Harness, copy_dir, endpoint_slices, endpoint_slices_with, fingerprint,
    holds_for, https_get, ingress, poll, process_exists, route, self_signed, served_certificate,
    service, tls_secret, wait_until, with_metadata, write_atomically, write_tls_site,
};

const NS: &str = "shop";
/// The body of the built-in default backend.
const NOT_FOUND_BODY: &str = "404 Not Found: no route for this host and path";

/// `(host, path, who answers)`: who is a backend name or `status <n>`.
type Row = (&'static str, &'static str, &'static str);

/// Checks every row with a real request and reports all mismatches at once.
fn check_table(h: &Harness, table: &[Row]) {
    let mut wrong = Vec::new();
    for (host, path, want) in table {
        let answer = h.get(host, path);
        let got = answer.who();
        if got != *want {
            wrong.push(format!(
                "  Host: {host:<24} {path:<22} want {want:<14} got {got}"
            ));
        } else if answer.status == 404 && answer.body != NOT_FOUND_BODY {
            wrong.push(format!(
                "  Host: {host:<24} {path:<22} 404 body {:?}",
                answer.body
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} rows routed wrongly:\n{}",
        wrong.len(),
        table.len(),
        wrong.join("\n")
    );
}

/// Case 1: Ingress path and host semantics, request by request.
#[test]
fn routing_table() {
    let mut h = Harness::new();
    let services = [
        "foo-exact",
        "foo-prefix",
        "api",
        "api-v2",
        "static",
        "docs",
        "wild",
        "wild-api",
        "root",
        "nohost",
        "nohost-exact",
        "fallback",
    ];
    let mut backends = Vec::new();
    for s in services {
        backends.push(h.backend(NS, s));
    }
    h.write("services.yaml", &backends.join("---\n"));
    let app = Some("app.example.com");
    let wild = Some("*.example.com");
    h.write(
        "hosts.yaml",
        &ingress(
            NS,
            "hosts",
            &[
                route(app, "/foo", "Exact", "foo-exact"),
                route(app, "/foo", "Prefix", "foo-prefix"),
                route(app, "/api", "Prefix", "api"),
                route(app, "/api/v2", "Prefix", "api-v2"),
                route(app, "/static", "ImplementationSpecific", "static"),
                route(app, "/docs/", "Prefix", "docs"),
                route(wild, "/", "Prefix", "wild"),
                route(wild, "/api", "Prefix", "wild-api"),
                route(Some("root.example.com"), "/", "Prefix", "root"),
            ],
            None,
            &[],
        ),
    );
    let shared = |default_backend| {
        ingress(
            NS,
            "shared",
            &[
                route(None, "/shared", "Prefix", "nohost"),
                route(None, "/exact-only", "Exact", "nohost-exact"),
            ],
            default_backend,
            &[],
        )
    };
    h.write("shared.yaml", &shared(Some("fallback")));
    // Another controller's Ingress: not ours.
    h.write(
        "other-class.yaml",
        &ingress(
            NS,
            "other-class",
            &[route(Some("ignored.test"), "/", "Prefix", "api")],
            None,
            &[],
        )
        .replace("ingressClassName: portcullis", "ingressClassName: other"),
    );
    // Two Ingresses claim the same host and path: the older one wins, whatever the names.
    let dup = |name: &str, created: &str, service: &str| {
        with_metadata(
            &ingress(
                NS,
                name,
                &[route(app, "/dup", "Prefix", service)],
                None,
                &[],
            ),
            &format!("  creationTimestamp: \"{created}\"\n"),
        )
    };
    h.write("dup-a.yaml", &dup("a-newer", "2021-01-01T00:00:00Z", "api"));
    h.write(
        "dup-b.yaml",
        &dup("b-older", "2020-01-01T00:00:00Z", "static"),
    );
    h.start(&[]);

    let table: &[Row] = &[
        // Exact beats Prefix on the same path; Prefix is element-wise.
        ("app.example.com", "/foo", "foo-exact"),
        ("app.example.com", "/foo?x=1", "foo-exact"),
        ("app.example.com", "/foo/", "foo-prefix"),
        ("app.example.com", "/foo/bar", "foo-prefix"),
        // No rule of app.example.com matches: the wildcard host's `/` does.
        ("app.example.com", "/foobar", "wild"),
        // Longest prefix wins, element by element.
        ("app.example.com", "/api", "api"),
        ("app.example.com", "/api/", "api"),
        ("app.example.com", "/api/users", "api"),
        ("app.example.com", "/api/v2", "api-v2"),
        ("app.example.com", "/api/v2/", "api-v2"),
        ("app.example.com", "/api/v2/items/7", "api-v2"),
        ("app.example.com", "/api/v2x", "api"),
        ("app.example.com", "/apix", "wild"),
        // ImplementationSpecific is a plain string prefix in Portcullis.
        ("app.example.com", "/static", "static"),
        ("app.example.com", "/static/app.css", "static"),
        ("app.example.com", "/staticfiles", "static"),
        // A Prefix path's trailing slash is ignored.
        ("app.example.com", "/docs", "docs"),
        ("app.example.com", "/docs/", "docs"),
        ("app.example.com", "/docs/guide", "docs"),
        ("app.example.com", "/docsx", "wild"),
        // Host: case-insensitive, port ignored.
        ("APP.EXAMPLE.COM", "/foo", "foo-exact"),
        ("App.Example.Com", "/api/v2/x", "api-v2"),
        ("app.example.com:8080", "/foo", "foo-exact"),
        ("APP.example.com:80", "/foo/x", "foo-prefix"),
        // The wildcard covers exactly one label.
        ("a.example.com", "/", "wild"),
        ("a.example.com", "/anything/at/all", "wild"),
        ("a.example.com", "/api", "wild-api"),
        ("a.example.com", "/api/x", "wild-api"),
        ("A.Example.Com:81", "/api/x", "wild-api"),
        ("a.b.example.com", "/", "fallback"),
        ("a.b.example.com", "/shared/x", "nohost"),
        ("example.com", "/", "fallback"),
        ("example.com", "/shared", "nohost"),
        // An exact host beats the wildcard; a wildcard match beats rules without a host.
        ("root.example.com", "/", "root"),
        ("root.example.com", "/api/x", "root"),
        ("Root.Example.Com:8443", "/x", "root"),
        ("app.example.com", "/shared", "wild"),
        // Rules without a host, then spec.defaultBackend.
        ("unknown.test", "/shared", "nohost"),
        ("unknown.test", "/shared/", "nohost"),
        ("unknown.test", "/shared/deep/path", "nohost"),
        ("unknown.test", "/sharedx", "fallback"),
        ("unknown.test", "/exact-only", "nohost-exact"),
        ("unknown.test", "/exact-only/", "fallback"),
        ("unknown.test", "/exact-only/x", "fallback"),
        ("127.0.0.1", "/shared", "nohost"),
        ("unknown.test", "/", "fallback"),
        // Not our class; and the older of two Ingresses for one path.
        ("ignored.test", "/", "fallback"),
        ("app.example.com", "/dup", "static"),
        ("app.example.com", "/dup/x", "static"),
        // A Host holding '/' could move the host/path boundary: refused.
        ("evil.test/shared", "/x", "status 400"),
    ];
    check_table(&h, table);

    // Without spec.defaultBackend, what matches nothing gets the built-in 404.
    h.write("shared.yaml", &shared(None));
    wait_until(APPLY_TIMEOUT, "the default backend is gone", || {
        h.who("unknown.test", "/") == "status 404"
    });
    // That was a reload: the previous workers may still take a connection for a moment.
    h.wait_old_workers_gone();
    let table: &[Row] = &[
        ("unknown.test", "/", "status 404"),
        ("unknown.test", "/sharedx", "status 404"),
        ("unknown.test", "/exact-only/", "status 404"),
        ("a.b.example.com", "/", "status 404"),
        ("example.com", "/foo", "status 404"),
        ("unknown.test", "/shared/x", "nohost"),
        ("app.example.com", "/foo", "foo-exact"),
        ("a.example.com", "/x", "wild"),
        ("ignored.test", "/", "status 404"),
    ];
    check_table(&h, table);
}

/// Case 1b: the wildcard and host-less lookup steps are in haproxy.cfg only while some route
/// needs them. Without them, a Host header that is not lower-case or has a port is still
/// looked up as its normalized form; the first route that needs a step reloads HAProxy, and
/// a new path of a kind already looked up does not.
#[test]
fn lookup_steps_follow_the_routes() {
    let mut h = Harness::new();
    let mut backends = Vec::new();
    for s in ["app", "app-exact", "wild", "nohost"] {
        backends.push(h.backend(NS, s));
    }
    h.write("services.yaml", &backends.join("---\n"));
    let app = Some("app.example.com");
    h.write(
        "app.yaml",
        &ingress(
            NS,
            "app",
            &[
                route(app, "/", "Prefix", "app"),
                route(app, "/exact", "Exact", "app-exact"),
            ],
            None,
            &[],
        ),
    );
    h.start(&[]);
    let config = || std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    let steps = || {
        let cfg = config();
        (
            cfg.contains("var(txn.wildpath),map_str"),
            cfg.contains("set-var(txn.route) path,map_str"),
        )
    };
    assert_eq!(steps(), (false, false), "no route needs either step");
    check_table(
        &h,
        &[
            ("app.example.com", "/", "app"),
            ("app.example.com", "/exact", "app-exact"),
            ("app.example.com", "/exact/x", "app"),
            // Looked up again as the normalized host.
            ("APP.Example.com", "/exact", "app-exact"),
            ("app.example.com:8080", "/exact", "app-exact"),
            ("App.Example.Com:80", "/x", "app"),
            ("a.example.com", "/", "status 404"),
            ("unknown.test", "/shared", "status 404"),
            ("evil.test/exact", "/x", "status 400"),
        ],
    );

    let (reloads, _) = h.reloads();
    let wild_and_nohost = |wild_path: &str| {
        ingress(
            NS,
            "more",
            &[
                route(Some("*.example.com"), wild_path, "Prefix", "wild"),
                route(None, "/shared", "Prefix", "nohost"),
            ],
            None,
            &[],
        )
    };
    h.write("more.yaml", &wild_and_nohost("/"));
    wait_until(APPLY_TIMEOUT, "the wildcard host routes", || {
        h.who("A.Example.Com:8443", "/x") == "wild"
    });
    h.wait_old_workers_gone();
    assert_eq!(steps(), (true, true));
    assert!(h.reloads().0 > reloads, "a new lookup step is a reload");
    check_table(
        &h,
        &[
            ("a.example.com", "/", "wild"),
            ("unknown.test", "/shared/x", "nohost"),
            ("a.example.com", "/shared", "wild"),
            ("app.example.com", "/shared", "app"),
            ("APP.Example.com:80", "/exact", "app-exact"),
        ],
    );

    // Another path for a wildcard host: map entries, no reload.
    let (reloads, _) = h.reloads();
    h.write("more.yaml", &wild_and_nohost("/wild-only"));
    wait_until(APPLY_TIMEOUT, "the wildcard path moved", || {
        h.who("a.example.com", "/") == "status 404"
            && h.who("a.example.com", "/wild-only/x") == "wild"
    });
    assert_eq!(h.reloads().0, reloads, "the same steps: no reload");

    h.remove("more.yaml");
    // Whether HAProxy has reloaded yet or not, the routes are gone from its maps.
    wait_until(APPLY_TIMEOUT, "the steps and the routes are gone", || {
        steps() == (false, false) && h.who("a.example.com", "/wild-only") == "status 404"
    });
    h.wait_old_workers_gone();
    check_table(
        &h,
        &[
            ("a.example.com", "/wild-only", "status 404"),
            ("unknown.test", "/shared", "status 404"),
            ("App.example.com:8080", "/exact", "app-exact"),
        ],
    );
}

/// EndpointSlices for the `pool` Service: every echo server listed, ready when in `ready`.
fn pool_slices(pool: &[(String, u16)], ready: &[&str]) -> String {
    let endpoints: Vec<(&str, u16, bool)> = pool
        .iter()
        .map(|(name, port)| (name.as_str(), *port, ready.contains(&name.as_str())))
        .collect();
    endpoint_slices(NS, "pool", &endpoints)
}

/// Case 2: Endpoints come and go through the runtime API; only outgrowing the slots reloads.
#[test]
fn endpoint_scaling_without_reloads() {
    let mut h = Harness::new();
    let pool: Vec<(String, u16)> = ["a", "b", "c", "d", "e", "f", "g", "h"]
        .iter()
        .map(|s| (s.to_string(), h.echo(&format!("pool-{s}"))))
        .collect();
    let grow: Vec<(String, u16)> = (1..=5)
        .map(|i| (i.to_string(), h.echo(&format!("grow-{i}"))))
        .collect();
    let grow_slices = |n: usize| {
        let endpoints: Vec<(&str, u16, bool)> = grow[..n]
            .iter()
            .map(|(s, port)| (s.as_str(), *port, true))
            .collect();
        endpoint_slices(NS, "grow", &endpoints)
    };
    h.write(
        "services.yaml",
        &format!(
            "{}---\n{}",
            service(NS, "pool", &[]),
            service(NS, "grow", &[("haproxy.org/scale-server-slots", "4")])
        ),
    );
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "pools",
            &[
                route(Some("pool.example.com"), "/", "Prefix", "pool"),
                route(Some("grow.example.com"), "/", "Prefix", "grow"),
            ],
            None,
            &[],
        ),
    );
    h.write(
        "pool-endpoints.yaml",
        &pool_slices(&pool, &["a", "b", "c", "d"]),
    );
    h.write("grow-endpoints.yaml", &grow_slices(3));
    h.start(&[]);
    let start = h.reloads();

    let steps: [&[&str]; 5] = [
        &["a", "b", "c", "d"],
        &["a", "b", "c", "d", "e", "f", "g", "h"],
        &["b", "g"],
        &[],
        &["a", "d", "h"],
    ];
    for ready in steps {
        h.write("pool-endpoints.yaml", &pool_slices(&pool, ready));
        let want: BTreeSet<String> = if ready.is_empty() {
            BTreeSet::from(["status 503".to_string()])
        } else {
            ready.iter().map(|s| format!("pool-{s}")).collect()
        };
        // Round robin: three rounds over the ready servers show every one of them.
        let requests = 3 * ready.len().max(2);
        let seen = poll(APPLY_TIMEOUT, || {
            let seen = h.answering("pool.example.com", "/", requests);
            (seen == want).then_some(seen)
        });
        assert!(
            seen.is_some(),
            "{} ready endpoints: want {want:?}, still answering {:?}",
            ready.len(),
            h.answering("pool.example.com", "/", requests)
        );
        // Stable, not a moment in a transition.
        assert_eq!(h.answering("pool.example.com", "/", requests), want);
        assert_eq!(h.reloads(), start, "after going to {ready:?}");
    }
    // Those runs redid only the pool's backend (four steps changed the endpoints); the first
    // run was a full one.
    let endpoint_runs = h.metric("portcullis_pipeline_runs_total{path=\"endpoints\"}");
    assert!(endpoint_runs >= 4.0, "endpoint-path runs: {endpoint_runs}");
    assert!(h.metric("portcullis_pipeline_runs_total{path=\"full\"}") >= 1.0);
    assert_eq!(
        h.metric("portcullis_pipeline_duration_seconds_count{path=\"endpoints\"}"),
        h.metric("portcullis_pipeline_runs_total{path=\"endpoints\"}")
    );
    // With no ready endpoint, the terminating ones that still serve take over...
    const SERVING: &str = "{ready: false, serving: true, terminating: true}";
    const GONE: &str = "{ready: false, serving: false, terminating: true}";
    let conditions = |of: &dyn Fn(&str) -> &'static str| {
        let endpoints: Vec<(&str, u16, &str)> = pool
            .iter()
            .map(|(name, port)| (name.as_str(), *port, of(name)))
            .collect();
        endpoint_slices_with(NS, "pool", &endpoints)
    };
    h.write(
        "pool-endpoints.yaml",
        &conditions(&|name| match name {
            "a" | "b" => SERVING,
            "c" => GONE,
            _ => "{ready: false}",
        }),
    );
    let want = BTreeSet::from(["pool-a".to_string(), "pool-b".to_string()]);
    wait_until(
        APPLY_TIMEOUT,
        "the serving terminating endpoints answer",
        || h.answering("pool.example.com", "/", 6) == want,
    );
    // ...but only while there is no ready one.
    h.write(
        "pool-endpoints.yaml",
        &conditions(&|name| match name {
            "a" | "b" => SERVING,
            "h" => "{ready: true}",
            _ => "{ready: false}",
        }),
    );
    let only_h = BTreeSet::from(["pool-h".to_string()]);
    wait_until(APPLY_TIMEOUT, "only the ready endpoint answers", || {
        h.answering("pool.example.com", "/", 6) == only_h
    });
    assert_eq!(h.reloads(), start);

    // The grow Service has slots in blocks of 4: 3 endpoints fit, 5 need a second block.
    assert_eq!(
        h.answering("grow.example.com", "/", 9),
        BTreeSet::from(["grow-1", "grow-2", "grow-3"].map(String::from))
    );
    h.write("grow-endpoints.yaml", &grow_slices(5));
    let want: BTreeSet<String> = (1..=5).map(|i| format!("grow-{i}")).collect();
    wait_until(APPLY_TIMEOUT, "5 grow endpoints answer", || {
        h.answering("grow.example.com", "/", 15) == want
    });
    assert_eq!(
        h.reloads(),
        (start.0 + 1, start.1),
        "one reload for the new slot block"
    );
    assert_eq!(h.answering("pool.example.com", "/", 6), only_h);
}

/// Case 3: Hundreds of new paths on a live host are map entries, not a reload.
#[test]
fn five_hundred_new_paths_without_reloads() {
    const N: usize = 500;
    const BACKENDS: usize = 7;
    let mut h = Harness::new();
    let mut docs = vec![h.backend(NS, "base")];
    for b in 0..BACKENDS {
        docs.push(h.backend(NS, &format!("b{b}")));
    }
    h.write("services.yaml", &docs.join("---\n"));
    let host = Some("bulk.example.com");
    let names: Vec<String> = (0..BACKENDS).map(|b| format!("b{b}")).collect();
    let seeds: Vec<String> = (0..BACKENDS).map(|b| format!("/seed-{b}")).collect();
    let mut routes = vec![route(host, "/", "Prefix", "base")];
    // Every backend is in use from the start: the new paths add no backend.
    for b in 0..BACKENDS {
        routes.push(route(host, &seeds[b], "Exact", &names[b]));
    }
    h.write("bulk.yaml", &ingress(NS, "bulk", &routes, None, &[]));
    h.start(&[]);
    let start = h.reloads();
    assert_eq!(h.who("bulk.example.com", "/p499/x"), "base");

    let paths: Vec<String> = (0..N).map(|i| format!("/p{i}")).collect();
    for (i, path) in paths.iter().enumerate() {
        routes.push(route(host, path, "Prefix", &names[i % BACKENDS]));
    }
    h.write("bulk.yaml", &ingress(NS, "bulk", &routes, None, &[]));
    // Every path, and for every fifth one the path itself and a sibling that is not under it.
    let wrong = || {
        let mut wrong = Vec::new();
        for i in 0..N {
            let want = format!("b{}", i % BACKENDS);
            let mut check = |path: String, want: &str| {
                let got = h.who("bulk.example.com", &path);
                if got != want {
                    wrong.push(format!("{path}: want {want}, got {got}"));
                }
            };
            check(format!("/p{i}/x"), &want);
            if i % 5 == 0 {
                check(format!("/p{i}"), &want);
                // Prefix is element-wise: /p{i}z is not under /p{i}.
                check(format!("/p{i}z"), "base");
            }
        }
        wrong
    };
    // The map entries arrive one runtime command at a time; wait until the last one is in.
    let settled = poll(APPLY_TIMEOUT, || wrong().is_empty().then_some(()));
    let wrong = wrong();
    assert!(
        settled.is_some() && wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(h.who("bulk.example.com", "/seed-3"), "b3");
    assert_eq!(h.reloads(), start, "500 new paths must not reload");
    // Only an Ingress changed: the run took the unchanged backends from the last one.
    let parts_runs = h.metric("portcullis_pipeline_runs_total{path=\"parts\"}");
    assert!(parts_runs >= 1.0, "runs that took parts: {parts_runs}");
}

/// Writes the Secret `secure-tls` with `cert` (certificate PEM, key PEM).
fn secure_manifests(h: &Harness, cert: &(String, String)) {
    h.write(
        "secret.yaml",
        &tls_secret(NS, "secure-tls", &cert.0, &cert.1),
    );
}

/// The fingerprint of what HAProxy serves for `sni`.
fn served_fingerprint(h: &Harness, sni: &str) -> Option<String> {
    served_certificate(h.https_port, sni).map(|pem| fingerprint(&h.work(), &pem))
}

/// Case 4a: Rotating the only certificate (so also the default one) is a runtime change.
#[test]
fn certificate_rotation_without_reload() {
    let mut h = Harness::new();
    let a = self_signed(&h.work(), "secure.example.com", "first");
    let b = self_signed(&h.work(), "secure.example.com", "second");
    let (fp_a, fp_b) = (fingerprint(&h.work(), &a.0), fingerprint(&h.work(), &b.0));
    assert_ne!(fp_a, fp_b);
    write_tls_site(&mut h, NS, "secure.example.com", "secure-tls");
    secure_manifests(&h, &a);
    h.start(&[]);
    assert_eq!(
        served_fingerprint(&h, "secure.example.com"),
        Some(fp_a.clone())
    );
    let start = h.reloads();

    secure_manifests(&h, &b);
    let served = poll(APPLY_TIMEOUT, || {
        served_fingerprint(&h, "secure.example.com").filter(|fp| *fp == fp_b)
    });
    assert_eq!(
        served,
        Some(fp_b),
        "the new certificate is not served; last served {:?}",
        served_fingerprint(&h, "secure.example.com")
    );
    assert_eq!(h.reloads(), start, "rotating a certificate must not reload");
    // And back: the first certificate again.
    secure_manifests(&h, &a);
    wait_until(
        APPLY_TIMEOUT,
        "the first certificate is served again",
        || served_fingerprint(&h, "secure.example.com").as_deref() == Some(fp_a.as_str()),
    );
    assert_eq!(h.reloads(), start, "rotating a certificate must not reload");
    // HTTPS routes like HTTP, and says so to the backend.
    let answer = https_get(
        h.https_port,
        "secure.example.com",
        "secure.example.com",
        "/x",
    )
    .expect("an answer over HTTPS");
    assert_eq!(answer.who(), "web");
    assert!(
        answer.body.contains("x-forwarded-proto: https\n"),
        "{}",
        answer.body
    );
    // A Host header with capitals and the port is looked up normalized, over HTTPS too.
    let answer = https_get(
        h.https_port,
        "secure.example.com",
        "Secure.Example.COM:443",
        "/x",
    )
    .expect("an answer over HTTPS");
    assert_eq!(answer.who(), "web");
    // Plain HTTP for a TLS host is redirected (ssl-redirect defaults to on).
    assert_eq!(h.who("secure.example.com", "/x"), "status 302");
    assert_eq!(h.who("other.example.com", "/x"), "status 404");
}

/// Case 4b: Rotating a certificate beside a `--default-ssl-certificate`; the default stays.
#[test]
fn certificate_rotation_beside_a_default_certificate() {
    let mut h = Harness::new();
    let default = self_signed(&h.work(), "default.example.com", "default");
    let a = self_signed(&h.work(), "secure.example.com", "first");
    let b = self_signed(&h.work(), "secure.example.com", "second");
    let fp = |c: &(String, String)| fingerprint(&h.work(), &c.0);
    let (fp_default, fp_a, fp_b) = (fp(&default), fp(&a), fp(&b));
    write_tls_site(&mut h, NS, "secure.example.com", "secure-tls");
    h.write(
        "default-secret.yaml",
        &tls_secret(NS, "default-tls", &default.0, &default.1),
    );
    secure_manifests(&h, &a);
    h.start(&["--default-ssl-certificate", "shop/default-tls"]);
    assert_eq!(served_fingerprint(&h, "secure.example.com"), Some(fp_a));
    assert_eq!(
        served_fingerprint(&h, "other.example.com"),
        Some(fp_default.clone())
    );
    let start = h.reloads();

    secure_manifests(&h, &b);
    wait_until(APPLY_TIMEOUT, "the new certificate is served", || {
        served_fingerprint(&h, "secure.example.com").as_deref() == Some(fp_b.as_str())
    });
    assert_eq!(
        served_fingerprint(&h, "other.example.com"),
        Some(fp_default)
    );
    assert_eq!(h.reloads(), start, "rotating a certificate must not reload");
}

/// Case 4c: A new TLS host gets its certificate at run time, and loses it again, without a
/// reload.
#[test]
fn certificates_come_and_go_without_reload() {
    let mut h = Harness::new();
    let secure = self_signed(&h.work(), "secure.example.com", "secure");
    let other = self_signed(&h.work(), "other.example.com", "other");
    let fp_secure = fingerprint(&h.work(), &secure.0);
    let fp_other = fingerprint(&h.work(), &other.0);
    write_tls_site(&mut h, NS, "secure.example.com", "secure-tls");
    secure_manifests(&h, &secure);
    h.start(&[]);
    // The only certificate is also the default one.
    assert_eq!(
        served_fingerprint(&h, "other.example.com"),
        Some(fp_secure.clone())
    );
    let start = h.reloads();

    // Newer than the `secure` Ingress (without creation timestamps, the name decides the
    // age order): its certificate is appended to the crt-list. The first line is the default
    // certificate, and changing it needs a reload (docs/architecture.md, TLS).
    h.write(
        "other-secret.yaml",
        &tls_secret(NS, "zz-other-tls", &other.0, &other.1),
    );
    h.write(
        "other.yaml",
        &ingress(
            NS,
            "zz-other",
            &[route(Some("other.example.com"), "/", "Prefix", "web")],
            None,
            &[("zz-other-tls", &["other.example.com"])],
        ),
    );
    wait_until(
        APPLY_TIMEOUT,
        "other.example.com has its certificate",
        || served_fingerprint(&h, "other.example.com").as_deref() == Some(fp_other.as_str()),
    );
    assert_eq!(
        served_fingerprint(&h, "secure.example.com"),
        Some(fp_secure.clone())
    );
    assert_eq!(h.reloads(), start, "a new certificate must not reload");

    h.remove("other.yaml");
    h.remove("other-secret.yaml");
    wait_until(
        APPLY_TIMEOUT,
        "other.example.com gets the default again",
        || served_fingerprint(&h, "other.example.com").as_deref() == Some(fp_secure.as_str()),
    );
    assert_eq!(
        served_fingerprint(&h, "secure.example.com"),
        Some(fp_secure)
    );
    assert_eq!(h.reloads(), start, "removing a certificate must not reload");
}

/// Case 5: A burst of changes is coalesced.
#[test]
fn burst_of_changes_is_coalesced() {
    const CHANGES: usize = 200;
    let mut h = Harness::new();
    let mut docs = Vec::new();
    for s in 0..4 {
        docs.push(h.backend(NS, &format!("s{s}")));
    }
    h.write("services.yaml", &docs.join("---\n"));
    let host = Some("burst.example.com");
    // State i: /burst goes to s(i % 4) and /marker-i exists. Consecutive states use different
    // sets of backends, so each one alone would need a reload.
    let state = |i: usize| {
        let target = format!("s{}", i % 4);
        let marker = format!("/marker-{i}");
        ingress(
            NS,
            "burst",
            &[
                route(host, "/burst", "Prefix", &target),
                route(host, &marker, "Exact", "s0"),
            ],
            None,
            &[],
        )
    };
    h.write("burst.yaml", &state(1000));
    h.start(&[]);
    assert_eq!(h.who("burst.example.com", "/burst"), "s0");
    let start = h.reloads();

    let states: Vec<String> = (0..CHANGES).map(state).collect();
    // Spread over about 300 ms, longer than the debounce; a busy machine that falls behind
    // this schedule writes without pausing.
    let began = Instant::now();
    for (i, text) in states.iter().enumerate() {
        h.write("burst.yaml", text);
        let due = began + Duration::from_micros(1_500) * u32::try_from(i + 1).unwrap();
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let took = began.elapsed();
    assert!(took < Duration::from_secs(1), "the burst took {took:?}");

    let last = CHANGES - 1;
    let final_marker = format!("/marker-{last}");
    let final_target = format!("s{}", last % 4);
    let is_final = || {
        h.who("burst.example.com", "/burst/x") == final_target
            && h.who("burst.example.com", &final_marker) == "s0"
    };
    wait_until(APPLY_TIMEOUT, "the final state is served", is_final);
    h.wait_old_workers_gone();
    // Nothing more happens once the final state is served.
    holds_for(Duration::from_millis(500), "the final state", is_final);
    assert_eq!(h.who("burst.example.com", "/marker-198"), "status 404");
    assert_eq!(h.who("burst.example.com", "/marker-1000"), "status 404");
    let (reloads, failed) = h.reloads();
    eprintln!(
        "a burst of {CHANGES} changes over {took:?}: {} reloads",
        reloads - start.0
    );
    assert_eq!(failed, start.1);
    assert!(
        reloads - start.0 <= 2,
        "{} reloads for a burst of {CHANGES} changes",
        reloads - start.0
    );
}

/// `old` and `new` Services (echo servers named after them, `old` with one endpoint per name in
/// `old`) and an Ingress routing all of `keep.example.com` to `old`.
fn keep_cluster(h: &mut Harness, old: &[&str]) {
    let old_endpoints: Vec<(String, u16)> = old
        .iter()
        .map(|name| (name.to_string(), h.echo(name)))
        .collect();
    let new_port = h.echo("new");
    write_keep_services(h, &old_endpoints, new_port);
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "keep",
            &[route(Some("keep.example.com"), "/", "Prefix", "old")],
            None,
            &[],
        ),
    );
}

fn write_keep_services(h: &Harness, old: &[(String, u16)], new_port: u16) {
    let old: Vec<(&str, u16, bool)> = old.iter().map(|(n, p)| (n.as_str(), *p, true)).collect();
    h.write(
        "services.yaml",
        &[
            service(NS, "old", &[]),
            endpoint_slices(NS, "old", &old),
            service(NS, "new", &[]),
            endpoint_slices(NS, "new", &[("0", new_port, true)]),
        ]
        .join("---\n"),
    );
}

/// The bundled templates, copied to be the site's templates.
fn site_templates(h: &Harness) -> std::path::PathBuf {
    let templates = h.work().join("templates");
    copy_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates"),
        &templates,
    );
    templates
}

/// Edits a site template file in place.
fn edit_template(templates: &std::path::Path, file: &str, edit: impl FnOnce(String) -> String) {
    let file = templates.join(file);
    let text = std::fs::read_to_string(&file).unwrap();
    write_atomically(&file, &edit(text));
}

/// Makes the site's `parts/defaults.j2` render a keyword HAProxy does not know.
fn break_defaults_template(templates: &std::path::Path) {
    edit_template(templates, "parts/defaults.j2", |t| {
        t + "  no-such-keyword\n"
    });
}

/// Whether HAProxy rejected the broken template and the failed apply is counted (the count
/// comes after /readyz reports the error), so that a later failure or fix is told from it.
fn broken_template_rejected(h: &Harness) -> bool {
    h.try_metric("portcullis_config_check_failures_total")
        .is_some_and(|v| v >= 1.0)
        && h.try_metric("portcullis_applies_total{outcome=\"failed\"}")
            .is_some_and(|v| v >= 1.0)
}

fn failed_applies(h: &Harness) -> f64 {
    h.metric("portcullis_applies_total{outcome=\"failed\"}")
}

/// Case 6: A configuration HAProxy rejects is never loaded; traffic keeps its routes, and
/// endpoint changes still reach HAProxy through the runtime API.
#[test]
fn rejected_configuration_keeps_traffic() {
    let mut h = Harness::new();
    let templates = site_templates(&h);
    keep_cluster(&mut h, &["old"]);
    h.start(&["--templates-dir", templates.to_str().unwrap()]);
    assert_eq!(h.who("keep.example.com", "/"), "old");
    let start = h.reloads();
    assert_eq!(h.metric("portcullis_config_check_failures_total"), 0.0);

    break_defaults_template(&templates);
    wait_until(APPLY_TIMEOUT, "HAProxy rejects the broken template", || {
        broken_template_rejected(&h)
    });
    let failed = failed_applies(&h);
    // A change that needs a reload: a new backend.
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "keep",
            &[
                route(Some("keep.example.com"), "/", "Prefix", "old"),
                route(Some("keep.example.com"), "/new", "Prefix", "new"),
            ],
            None,
            &[],
        ),
    );
    wait_until(APPLY_TIMEOUT, "the manifest change is rejected", || {
        failed_applies(&h) > failed
    });

    assert_eq!(h.reloads(), start, "nothing was reloaded");
    assert!(h.metric("portcullis_config_check_failures_total") >= 1.0);
    assert_eq!(h.who("keep.example.com", "/"), "old");
    assert_eq!(h.who("keep.example.com", "/new"), "old");
    let (status, ready) = h.readyz().unwrap();
    assert_eq!(status, 200, "{ready}");
    let last_error = ready["last_error"].as_str().unwrap_or_default();
    assert!(
        last_error.contains("rejected") && last_error.contains("no-such-keyword"),
        "last_error: {last_error:?}"
    );

    // While the configuration cannot be loaded, endpoints still change at run time.
    let old_2 = h.echo("old-2");
    let old_1 = h.echo("old-1");
    let new_port = h.echo("new-2");
    write_keep_services(
        &h,
        &[("1".to_string(), old_1), ("2".to_string(), old_2)],
        new_port,
    );
    let want = BTreeSet::from(["old-1".to_string(), "old-2".to_string()]);
    wait_until(APPLY_TIMEOUT, "the new endpoints of old answer", || {
        h.answering("keep.example.com", "/", 6) == want
    });
    assert_eq!(h.reloads(), start, "nothing was reloaded");

    // Fixing the template brings in everything that waited for a reload, in one reload.
    edit_template(&templates, "parts/defaults.j2", |t| {
        t.replace("  no-such-keyword\n", "")
    });
    wait_until(APPLY_TIMEOUT, "the new backend is served", || {
        h.who("keep.example.com", "/new") == "new-2"
    });
    // HAProxy serves the new configuration a moment before Portcullis has verified the reload.
    wait_until(APPLY_TIMEOUT, "the reload is reported", || {
        h.readyz()
            .is_some_and(|(status, ready)| status == 200 && ready["last_error"].is_null())
    });
    assert_eq!(h.reloads(), (start.0 + 1, start.1));
    h.wait_old_workers_gone();
    assert_eq!(h.answering("keep.example.com", "/", 6), want);
    assert_eq!(h.who("keep.example.com", "/new/x"), "new-2");
}

/// Case 6b: A site template edit on its own reaches HAProxy.
#[test]
fn site_template_edit_takes_effect() {
    let mut h = Harness::new();
    let templates = site_templates(&h);
    keep_cluster(&mut h, &["old"]);
    h.start(&["--templates-dir", templates.to_str().unwrap()]);
    assert_eq!(h.get("nothing.example.com", "/").body, NOT_FOUND_BODY);
    let start = h.reloads();

    edit_template(&templates, "parts/default-backend.j2", |t| {
        t.replace(NOT_FOUND_BODY, "404 custom: nothing here")
    });
    let served = poll(APPLY_TIMEOUT, || {
        Some(h.get("nothing.example.com", "/").body).filter(|b| b == "404 custom: nothing here")
    });
    assert!(
        served.is_some(),
        "the edited template is not served: body {:?}; /readyz {:?}",
        h.get("nothing.example.com", "/").body,
        h.readyz()
    );
    assert_eq!(h.reloads(), (start.0 + 1, start.1));
}

/// Case 6c: A site template edit that HAProxy rejects is reported, and the configuration on disk
/// stays the one HAProxy runs.
#[test]
fn broken_site_template_alone_is_rejected() {
    let mut h = Harness::new();
    let templates = site_templates(&h);
    keep_cluster(&mut h, &["old"]);
    h.start(&["--templates-dir", templates.to_str().unwrap()]);
    let start = h.reloads();

    break_defaults_template(&templates);
    // The rejection is counted during the apply and reported in /readyz just after it: wait for
    // the report, the last of the two.
    let rejection_reported = || {
        h.readyz().is_some_and(|(_, r)| {
            r["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("no-such-keyword"))
        })
    };
    wait_until(
        APPLY_TIMEOUT,
        "the rejection is reported",
        rejection_reported,
    );
    let on_disk = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    let (_, ready) = h.readyz().unwrap();
    assert!(
        !on_disk.contains("no-such-keyword"),
        "a configuration HAProxy rejects was written to haproxy.cfg; /readyz: {ready}"
    );
    assert!(
        h.metric("portcullis_config_check_failures_total") >= 1.0,
        "the broken template was not checked; /readyz: {ready}"
    );
    assert_eq!(h.reloads(), start);
    assert_eq!(h.who("keep.example.com", "/"), "old");
}

/// Case 7a: SIGTERM: exit 0, and HAProxy is gone.
#[test]
fn sigterm_exits_zero_and_stops_haproxy() {
    let mut h = Harness::new();
    keep_cluster(&mut h, &["old"]);
    h.start(&[]);
    let proc = h.show_proc();
    assert!(process_exists(proc.master_pid));
    assert!(!proc.workers.is_empty());
    let status = h.terminate(Duration::from_secs(20));
    let status = status.unwrap_or_else(|| panic!("no exit within 20s after SIGTERM\n{}", h.log()));
    assert_eq!(status.code(), Some(0), "{}", h.log());
    for pid in std::iter::once(proc.master_pid).chain(proc.workers) {
        wait_until(
            Duration::from_secs(5),
            "HAProxy's processes are gone",
            || !process_exists(pid),
        );
    }
    assert!(
        h.try_get("keep.example.com", "/").is_none(),
        "something still serves"
    );
}

/// Case 7c: HAProxy dying under Portcullis ends `run` with status 5, and no worker is left
/// serving.
#[test]
fn haproxy_killed_ends_run_with_status_5() {
    let mut h = Harness::new();
    keep_cluster(&mut h, &["old"]);
    h.start(&[]);
    let proc = h.show_proc();
    support::signal(proc.master_pid, "KILL");
    let status = h
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("run did not notice HAProxy was gone\n{}", h.log()));
    assert_eq!(status.code(), Some(5), "{}", h.log());
    assert!(
        h.log().contains("HAProxy exited unexpectedly"),
        "{}",
        h.log()
    );
    for pid in proc.workers {
        wait_until(Duration::from_secs(5), "the workers are gone", || {
            !process_exists(pid)
        });
    }
}

/// Case 7b: A missing HAProxy binary is a quick, clear failure.
#[test]
fn missing_haproxy_binary_fails_fast() {
    let mut h = Harness::new();
    keep_cluster(&mut h, &["old"]);
    let began = Instant::now();
    let out = support::output_within(
        h.command(&["--haproxy-bin", "/nonexistent/haproxy"]),
        Duration::from_secs(10),
    );
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "took {:?}",
        began.elapsed()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exited with {}", out.status);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("/nonexistent/haproxy"), "{stderr}");
}

/// Case 8: A manifest edit routes within about a second.
#[test]
fn live_edit_applies_within_a_second() {
    let mut h = Harness::new();
    keep_cluster(&mut h, &["old"]);
    h.start(&[]);
    let host = Some("keep.example.com");
    let mut worst = Duration::ZERO;
    for (i, path) in ["/one", "/two", "/three"].iter().enumerate() {
        h.write(
            "ingress.yaml",
            &ingress(
                NS,
                "keep",
                &[
                    route(host, "/", "Prefix", "old"),
                    route(host, path, "Exact", "new"),
                ],
                None,
                &[],
            ),
        );
        let written = Instant::now();
        wait_until(Duration::from_secs(5), "the edited path routes", || {
            h.who("keep.example.com", path) == "new"
        });
        let took = written.elapsed();
        worst = worst.max(took);
        assert!(took < Duration::from_millis(1500), "edit {i} took {took:?}");
    }
    assert_eq!(h.who("keep.example.com", "/one"), "old");
    assert_eq!(h.who("keep.example.com", "/three"), "new");
    assert!(worst < Duration::from_millis(1500), "{worst:?}");
    eprintln!("live edits routed within {worst:?} at worst");

    // Removing the Ingress removes its routes.
    h.remove("ingress.yaml");
    wait_until(APPLY_TIMEOUT, "the routes are gone", || {
        h.who("keep.example.com", "/three") == "status 404"
    });
    h.wait_old_workers_gone();
    assert_eq!(h.who("keep.example.com", "/"), "status 404");
}

/// A TLS Secret whose key belongs to another certificate, and an Ingress for `bad.example.com`
/// that uses it.
fn write_mismatched_tls(h: &Harness) {
    let a = self_signed(&h.work(), "bad.example.com", "bad-cert");
    let b = self_signed(&h.work(), "bad.example.com", "bad-key");
    h.write("bad-secret.yaml", &tls_secret(NS, "bad-tls", &a.0, &b.1));
    h.write(
        "bad.yaml",
        &ingress(
            NS,
            "bad",
            &[route(Some("bad.example.com"), "/", "Prefix", "old")],
            None,
            &[("bad-tls", &["bad.example.com"])],
        ),
    );
}

/// An Ingress routing `fresh.example.com` to the `new` Service (a new backend: a reload).
fn write_fresh_ingress(h: &Harness) {
    h.write(
        "fresh.yaml",
        &ingress(
            NS,
            "fresh",
            &[route(Some("fresh.example.com"), "/", "Prefix", "new")],
            None,
            &[],
        ),
    );
}

/// Case 6d: one unusable TLS Secret (its key does not match its certificate) is skipped like
/// any bad object; it does not block the rest of the cluster.
#[test]
fn mismatched_tls_secret_does_not_block_other_changes() {
    let mut h = Harness::new();
    keep_cluster(&mut h, &["old"]);
    h.start(&[]);
    write_mismatched_tls(&h);
    wait_until(APPLY_TIMEOUT, "the bad Secret is taken in", || {
        h.try_metric("portcullis_applies_total{outcome=\"failed\"}")
            .is_some_and(|v| v >= 1.0)
            || h.readyz()
                .is_some_and(|(_, r)| r["diagnostics"].as_u64() > Some(0))
    });
    write_fresh_ingress(&h);
    let served = poll(APPLY_TIMEOUT, || {
        Some(h.who("fresh.example.com", "/")).filter(|w| w == "new")
    });
    assert!(
        served.is_some(),
        "fresh.example.com is not served; /readyz: {:?}",
        h.readyz()
    );
    assert_eq!(h.metric("portcullis_config_check_failures_total"), 0.0);
    let (_, ready) = h.readyz().unwrap();
    assert!(
        ready["diagnostics"].as_u64() > Some(0),
        "the bad Secret is not reported: {ready}"
    );
}

/// Case 6e: the same unusable Secret present at start-up does not keep HAProxy from starting.
#[test]
fn mismatched_tls_secret_at_start_up_does_not_stop_the_rest() {
    let mut h = Harness::new();
    keep_cluster(&mut h, &["old"]);
    write_mismatched_tls(&h);
    h.start(&[]);
    assert_eq!(h.who("keep.example.com", "/"), "old");
}

/// Case 9: Route-scope annotations act only on the routes of their Ingress, even where another
/// Ingress reaches the same backend, and change at run time.
#[test]
fn route_policies_apply_to_their_own_routes() {
    let mut h = Harness::new();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    let host = Some("policy.example.com");
    let tagged = |env: &str| {
        with_metadata(
            &ingress(
                NS,
                "tagged",
                &[route(host, "/tagged", "Prefix", "web")],
                None,
                &[],
            ),
            &format!(
                "  annotations:\n    haproxy.org/request-set-header: \"X-Env {env}\"\n    \
                 haproxy.org/response-set-header: \"Cache-Control no-store\"\n"
            ),
        )
    };
    h.write("tagged.yaml", &tagged("prod"));
    h.write(
        "plain.yaml",
        &ingress(
            NS,
            "plain",
            &[route(host, "/plain", "Prefix", "web")],
            None,
            &[],
        ),
    );
    h.write(
        "blocked.yaml",
        &with_metadata(
            &ingress(
                NS,
                "blocked",
                &[route(host, "/blocked", "Prefix", "web")],
                None,
                &[],
            ),
            "  annotations:\n    haproxy.org/allow-list: \"10.0.0.0/8\"\n",
        ),
    );
    h.start(&[]);

    let tagged_answer = h.get_with("policy.example.com", "/tagged/a", &[("X-Env", "forged")]);
    assert_eq!(tagged_answer.who(), "web");
    assert!(
        tagged_answer.body.contains("x-env: prod\n"),
        "{}",
        tagged_answer.body
    );
    assert!(
        !tagged_answer.body.contains("forged"),
        "{}",
        tagged_answer.body
    );
    assert!(
        tagged_answer
            .body
            .contains("x-forwarded-for: 127.0.0.1\nx-forwarded-proto: http\n"),
        "{}",
        tagged_answer.body
    );
    assert_eq!(tagged_answer.header("cache-control"), Some("no-store"));

    let plain = h.get("policy.example.com", "/plain/a");
    assert_eq!(plain.who(), "web");
    assert!(!plain.body.contains("x-env"), "{}", plain.body);
    assert_eq!(plain.header("cache-control"), None);

    assert_eq!(h.who("policy.example.com", "/blocked"), "status 403");
    assert_eq!(h.who("policy.example.com", "/plain"), "web");

    // A new value for the annotation.
    h.write("tagged.yaml", &tagged("staging"));
    wait_until(APPLY_TIMEOUT, "the new header value is set", || {
        h.get("policy.example.com", "/tagged")
            .body
            .contains("x-env: staging\n")
    });
    h.wait_old_workers_gone();
    assert!(!h.get("policy.example.com", "/plain").body.contains("x-env"));
    assert_eq!(h.who("policy.example.com", "/blocked/x"), "status 403");
}

/// Case 6f: `portcullis_reloads_total`, summed over its `reason` label, counts reloads.
#[test]
fn reloads_metric_counts_each_reload_once() {
    let mut h = Harness::new();
    let templates = site_templates(&h);
    keep_cluster(&mut h, &["old"]);
    h.start(&["--templates-dir", templates.to_str().unwrap()]);
    // A rejected configuration, then a fix: the fixing reload has two reasons.
    break_defaults_template(&templates);
    wait_until(APPLY_TIMEOUT, "HAProxy rejects the broken template", || {
        broken_template_rejected(&h)
    });
    let failed = failed_applies(&h);
    write_fresh_ingress(&h);
    wait_until(APPLY_TIMEOUT, "the manifest change is rejected", || {
        failed_applies(&h) > failed
    });
    edit_template(&templates, "parts/defaults.j2", |t| {
        t.replace("  no-such-keyword\n", "")
    });
    wait_until(APPLY_TIMEOUT, "the fix is applied", || {
        h.who("fresh.example.com", "/") == "new"
            && h.readyz().is_some_and(|(_, r)| r["last_error"].is_null())
    });
    let metrics = h.admin("/metrics").unwrap().body;
    let counted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("portcullis_reloads_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    // The master counts reloads after its start; the start is one more.
    let reloads = h.reloads().0 as f64 + 1.0;
    assert_eq!(
        counted,
        reloads,
        "portcullis_reloads_total sums to {counted}, HAProxy did {reloads} loads:\n{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("portcullis_reloads_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        h.metric("portcullis_applies_total{outcome=\"reload\"}"),
        reloads
    );
}

/// Case 6g: reverting a rejected change needs no reload: what is wanted is again what HAProxy
/// loaded.
#[test]
fn reverting_a_rejected_change_does_not_reload() {
    let mut h = Harness::new();
    let templates = site_templates(&h);
    keep_cluster(&mut h, &["old"]);
    h.start(&["--templates-dir", templates.to_str().unwrap()]);
    let start = h.reloads();
    let loaded = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    break_defaults_template(&templates);
    // The revert below is then waited for, not the report of the rejection.
    wait_until(APPLY_TIMEOUT, "HAProxy rejects the broken template", || {
        broken_template_rejected(&h)
    });
    let applies = h.metric("portcullis_applies_total{outcome=\"failed\"}");
    edit_template(&templates, "parts/defaults.j2", |t| {
        t.replace("  no-such-keyword\n", "")
    });
    wait_until(APPLY_TIMEOUT, "the revert is applied", || {
        h.readyz()
            .is_some_and(|(_, r)| r["last_error"].is_null() && r["site_error"].is_null())
    });
    let now = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert_eq!(
        now, loaded,
        "the wanted configuration is the loaded one again"
    );
    assert_eq!(h.reloads(), start, "{:?}", h.readyz());
    assert_eq!(
        h.metric("portcullis_applies_total{outcome=\"failed\"}"),
        applies
    );
    assert_eq!(h.who("keep.example.com", "/"), "old");
}

/// Case 10: Paths with every character the path parser accepts route, whether they go through
/// the runtime API or (`;`, which the CLI would read as a command separator) a reload.
#[test]
fn unusual_path_characters_route() {
    let mut h = Harness::new();
    keep_cluster(&mut h, &["old"]);
    h.start(&[]);
    let host = Some("keep.example.com");
    let odd = [
        "/matrix;v=1",
        "/at@sign",
        "/bang!and&amp",
        "/paren(s)",
        "/star*plus+comma,",
        "/colon:tilde~",
        "/pct%41",
        "/under_score.dot-dash",
    ];
    let mut routes = vec![route(host, "/", "Prefix", "old")];
    for path in odd {
        routes.push(route(host, path, "Exact", "new"));
    }
    h.write("ingress.yaml", &ingress(NS, "keep", &routes, None, &[]));
    wait_until(APPLY_TIMEOUT, "the odd paths route", || {
        odd.iter().all(|p| h.who("keep.example.com", p) == "new")
    });
    h.wait_old_workers_gone();
    for path in odd {
        assert_eq!(h.who("keep.example.com", path), "new", "{path}");
        // Exact: a longer path is not the same path.
        assert_eq!(
            h.who("keep.example.com", &format!("{path}x")),
            "old",
            "{path}x"
        );
    }
    // `%41` is not decoded: `/pctA` is another path.
    assert_eq!(h.who("keep.example.com", "/pctA"), "old");
}

/// Case 11: Reloads lose no request: a client keeps sending requests while the configuration
/// is reloaded several times, and every one of them is answered by the backend.
#[test]
fn reloads_lose_no_requests() {
    let mut h = Harness::new();
    keep_cluster(&mut h, &["old"]);
    h.start(&[]);
    let start = h.reloads();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], h.http_port));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            // Bounded: at most this many requests, and it stops when told.
            for _ in 0..100_000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                answers.push(
                    support::http_get(addr, "keep.example.com", "/")
                        .map(|a| a.who())
                        .map_err(|e| e.to_string()),
                );
            }
            answers
        })
    };
    // Each state adds or removes a backend: a reload each time.
    let host = Some("keep.example.com");
    for i in 0..4 {
        let mut routes = vec![route(host, "/", "Prefix", "old")];
        if i % 2 == 0 {
            routes.push(route(host, "/new", "Prefix", "new"));
        }
        h.write("ingress.yaml", &ingress(NS, "keep", &routes, None, &[]));
        let want = if i % 2 == 0 { "new" } else { "old" };
        wait_until(APPLY_TIMEOUT, "the change is served", || {
            h.who("keep.example.com", "/new") == want
        });
        wait_until(APPLY_TIMEOUT, "the reload is done", || {
            h.reloads().0 == start.0 + i + 1
        });
        h.wait_old_workers_gone();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = client.join().unwrap();
    let bad: Vec<_> = answers
        .iter()
        .filter(|a| a.as_deref() != Ok("old"))
        .collect();
    eprintln!("{} requests during 4 reloads", answers.len());
    assert!(
        answers.len() > 20,
        "only {} requests were made",
        answers.len()
    );
    assert!(
        bad.is_empty(),
        "{} of {} requests failed during reloads: {:?}",
        bad.len(),
        answers.len(),
        &bad[..bad.len().min(10)]
    );
    assert_eq!(h.reloads(), (start.0 + 4, start.1));
}

/// Case 12: After a clean exit, `run` starts again on the same directories.
#[test]
fn restarts_on_the_same_directories() {
    let mut h = Harness::new();
    keep_cluster(&mut h, &["old"]);
    h.start(&[]);
    assert_eq!(h.who("keep.example.com", "/"), "old");
    let status = h.terminate(Duration::from_secs(20)).expect("an exit");
    assert_eq!(status.code(), Some(0));
    // Something changed while it was down.
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "keep",
            &[route(Some("keep.example.com"), "/", "Prefix", "new")],
            None,
            &[],
        ),
    );
    h.start(&[]);
    assert_eq!(h.who("keep.example.com", "/"), "new");
    assert_eq!(h.reloads(), (0, 0));
}

/// The controller reads `show servers state` line by line after a reload (to repair servers);
/// against the real HAProxy, the lines read that way are the whole answer, and the endpoints
/// are in them.
#[test]
fn servers_state_read_line_by_line_is_the_whole_answer() {
    use portcullis::apply::plan::parse_server_state_line;
    use portcullis::haproxy::client::Client;
    use portcullis::haproxy::command::Command;

    let mut h = Harness::new();
    let a = h.echo("pool-a");
    let b = h.echo("pool-b");
    h.write(
        "app.yaml",
        &format!(
            "{}---\n{}---\n{}",
            service(NS, "pool", &[("haproxy.org/scale-server-slots", "4")]),
            ingress(
                NS,
                "pools",
                &[route(Some("pool.example.com"), "/", "Prefix", "pool")],
                None,
                &[],
            ),
            endpoint_slices(NS, "pool", &[("a", a, true), ("b", b, true)]),
        ),
    );
    h.start(&[]);
    let want = BTreeSet::from(["pool-a".to_string(), "pool-b".to_string()]);
    assert!(
        poll(APPLY_TIMEOUT, || (h.answering("pool.example.com", "/", 6)
            == want)
            .then_some(()))
        .is_some()
    );
    let client = Client::new(h.runtime_dir().join("admin.sock"), Duration::from_secs(10));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let whole = runtime
        .block_on(client.execute(&Command::ShowServersState))
        .unwrap();
    let mut lines = Vec::new();
    runtime
        .block_on(client.execute_lines(&Command::ShowServersState, |l| lines.push(l.to_string())))
        .unwrap();
    assert_eq!(lines, whole.lines().collect::<Vec<_>>());
    let pool: Vec<(Option<std::net::IpAddr>, u16)> = lines
        .iter()
        .filter_map(|l| parse_server_state_line(l))
        .filter(|(backend, _, state)| backend.contains("_pool_") && !state.maintenance)
        .map(|(_, _, state)| (state.address, state.port))
        .collect();
    assert_eq!(pool.len(), 2, "{lines:?}");
    assert!(
        pool.iter()
            .all(|(address, _)| *address == Some(std::net::Ipv4Addr::LOCALHOST.into())),
        "{pool:?}"
    );
    let ports: BTreeSet<u16> = pool.iter().map(|p| p.1).collect();
    assert_eq!(ports, BTreeSet::from([a, b]));
}

/// `/readyz` shows the outcome of the last apply, an unchanged one included.
#[test]
fn readiness_reports_an_unchanged_apply() {
    let mut h = Harness::new();
    let backend = h.backend(NS, "web");
    h.write("web.yaml", &backend);
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "web",
            &[route(Some("web.example.com"), "/", "Prefix", "web")],
            None,
            &[],
        ),
    );
    h.start(&[]);
    let outcome = |h: &Harness| {
        h.readyz()
            .and_then(|(_, r)| r["last_outcome"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    assert!(outcome(&h).starts_with("reloaded: "), "{}", outcome(&h));
    // An Ingress of another class changes nothing Portcullis serves.
    h.write(
        "other.yaml",
        &ingress(
            NS,
            "other",
            &[route(Some("other.example.com"), "/", "Prefix", "web")],
            None,
            &[],
        )
        .replace("ingressClassName: portcullis", "ingressClassName: nginx"),
    );
    wait_until(APPLY_TIMEOUT, "an unchanged apply is reported", || {
        outcome(&h) == "unchanged"
    });
    assert_eq!(h.who("web.example.com", "/"), "web");
}
