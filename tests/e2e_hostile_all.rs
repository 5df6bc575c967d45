//! Every hostile-tenant vector at once, on a real HAProxy: regexes HAProxy refuses, snippets
//! outside the allowlist (both snippet flags on), TCP binds on the admin port, the HTTP port
//! and a port another process holds, an ExternalName and an endpoint aimed at the admin
//! endpoint, a TLS claim on another team's host, a 10 MB annotation, a manifest file with a
//! broken document, and an access list turned invalid. Next to them a victim, a guarded host
//! and a host with a path whose Service is missing keep answering exactly as before, a
//! newcomer goes live within the usual latency, nothing leaks, the controller stays up, and
//! each hostile object has a diagnostic naming it and its field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use support::{
    APPLY_TIMEOUT, Answer, Harness, annotated_site, endpoint_slices, ingress, route, service,
    wait_until,
};

/// How long the newcomer may take to answer once every vector is in.
const GO_LIVE: Duration = Duration::from_secs(10);

fn tcp(name: &str, port: u16) -> String {
    format!(
        "apiVersion: ingress.v3.haproxy.org/v3\nkind: TCP\nmetadata:\n  name: {name}\n  \
         namespace: evil\n  annotations: {{ingress.class: portcullis}}\nspec:\n  - name: {name}\n    \
         frontend:\n      name: {name}\n      binds:\n        - {{name: b, address: 127.0.0.1, port: {port}}}\n    \
         service: {{name: regex, port: 80}}\n"
    )
}

/// What no answer may carry: file contents, keys, the environment, the admin endpoint.
fn assert_nothing_leaks(what: &str, answer: &Answer) {
    let home = std::env::var("HOME").unwrap_or_default();
    let mut text = answer.body.clone();
    for (name, value) in &answer.headers {
        text.push_str(&format!("\n{name}: {value}"));
    }
    for (needle, leak) in [
        ("root:x:0:0", "/etc/passwd"),
        ("PRIVATE KEY", "a private key"),
        ("portcullis_", "metrics"),
        ("\"backends\"", "the model"),
        ("\"last_outcome\"", "readiness detail"),
        ("\nglobal\n", "the configuration"),
    ] {
        assert!(!text.contains(needle), "{what} served {leak}:\n{text}");
    }
    assert!(
        home.len() < 2 || !text.contains(&format!("'{home}'")),
        "{what} served the environment:\n{text}"
    );
}

#[test]
fn every_vector_at_once_hurts_only_its_own_object() {
    let mut h = Harness::new();
    let victim = annotated_site(&mut h, ("victim", "victim", "victim.example.com"), &[], &[]);
    h.write("victim.yaml", &victim);
    let guarded_doc = |h: &mut Harness, list: &str| {
        annotated_site(
            h,
            ("guarded", "guarded", "guarded.example.com"),
            &[],
            &[("haproxy.org/allow-list", list)],
        )
    };
    let guarded = guarded_doc(&mut h, "10.0.0.0/8");
    h.write("guarded.yaml", &guarded);
    // A host whose `/admin` names a Service that does not exist.
    let split_pod = h.backend("split", "split");
    h.write("split.yaml", &split_pod);
    h.write(
        "split-ingress.yaml",
        &ingress(
            "split",
            "split",
            &[
                route(Some("split.example.com"), "/", "Prefix", "split"),
                route(Some("split.example.com"), "/admin", "Prefix", "gone"),
            ],
            None,
            &[],
        ),
    );
    h.start(&[
        "--allow-config-snippets",
        "--allow-config-snippets-in-annotations",
        "--allow-external-name-services",
    ]);
    let before = |h: &Harness| {
        assert_eq!(h.who("victim.example.com", "/"), "victim");
        assert_eq!(h.get("guarded.example.com", "/").status, 403);
        assert_eq!(h.who("split.example.com", "/"), "split");
        assert_eq!(h.get("split.example.com", "/admin").status, 503);
    };
    before(&h);

    // Every vector, written one after the other without waiting.
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let held_port = holder.local_addr().unwrap().port();
    let mut hostile_hosts = Vec::new();
    let regex = annotated_site(
        &mut h,
        ("evil", "regex", "regex.example.com"),
        &[("haproxy.org/route-acl", "path -m reg (?u)^/x")],
        &[
            ("haproxy.org/path-rewrite", "(?u)^/x /y"),
            ("haproxy.org/cors-enable", "true"),
            ("haproxy.org/cors-allow-origin", "^https://a{65536}$"),
        ],
    );
    h.write("evil-regex.yaml", &regex);
    hostile_hosts.push("regex.example.com");
    let snippets = annotated_site(
        &mut h,
        ("evil", "snip", "snip.example.com"),
        &[(
            "haproxy.org/backend-config-snippet",
            "http-request set-map(maps/exact.map) victim.example.com/ evil_snip_80",
        )],
        &[(
            "haproxy.org/backend-config-snippet",
            "http-request return status 200 content-type text/plain lf-file /etc/passwd",
        )],
    );
    h.write("evil-snippets.yaml", &snippets);
    hostile_hosts.push("snip.example.com");
    h.write("evil-tcp-admin.yaml", &tcp("tcpadmin", h.admin_port));
    h.write("evil-tcp-http.yaml", &tcp("tcphttp", h.http_port));
    h.write("evil-tcp-held.yaml", &tcp("tcpheld", held_port));
    let extname = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: extname\n  namespace: evil\nspec:\n  \
         type: ExternalName\n  externalName: localhost\n  ports:\n    - {{name: http, port: 80, targetPort: {}}}\n---\n{}",
        h.admin_port,
        ingress(
            "evil",
            "extname",
            &[route(Some("extname.example.com"), "/", "Prefix", "extname")],
            None,
            &[],
        )
    );
    h.write("evil-extname.yaml", &extname);
    hostile_hosts.push("extname.example.com");
    let endpoint = format!(
        "{}---\n{}---\n{}",
        service("evil", "toadmin", &[]),
        endpoint_slices("evil", "toadmin", &[("0", h.admin_port, true)]),
        ingress(
            "evil",
            "toadmin",
            &[route(Some("toadmin.example.com"), "/", "Prefix", "toadmin")],
            None,
            &[],
        )
    );
    h.write("evil-endpoint.yaml", &endpoint);
    hostile_hosts.push("toadmin.example.com");
    h.write(
        "evil-tls.yaml",
        &ingress(
            "evil",
            "claim",
            &[route(Some("claim.example.com"), "/", "Prefix", "regex")],
            None,
            &[("stolen", &["victim.example.com", "claim.example.com"])],
        ),
    );
    hostile_hosts.push("claim.example.com");
    let huge = "x".repeat(10 * 1024 * 1024);
    let huge_doc = annotated_site(
        &mut h,
        ("evil", "huge", "huge.example.com"),
        &[],
        &[("haproxy.org/path-rewrite", &huge)],
    );
    h.write("evil-huge.yaml", &huge_doc);
    hostile_hosts.push("huge.example.com");
    let half = annotated_site(&mut h, ("evil", "half", "half.example.com"), &[], &[]);
    h.write(
        "evil-broken.yaml",
        &format!("{half}---\nkind: Ingress\nmetadata: {{name: [unclosed\n"),
    );
    hostile_hosts.push("half.example.com");
    let banana = guarded_doc(&mut h, "banana");
    h.write("guarded.yaml", &banana);

    // A newcomer from another namespace goes live within the usual latency.
    let started = Instant::now();
    let newcomer = h.backend("newcomer", "newcomer");
    h.write("newcomer.yaml", &newcomer);
    h.write(
        "newcomer-ingress.yaml",
        &ingress(
            "newcomer",
            "newcomer",
            &[route(
                Some("newcomer.example.com"),
                "/",
                "Prefix",
                "newcomer",
            )],
            None,
            &[],
        ),
    );
    wait_until(GO_LIVE, "the newcomer goes live", || {
        h.try_get("newcomer.example.com", "/")
            .is_some_and(|a| a.who() == "newcomer")
    });
    eprintln!("newcomer live {:?} after it was written", started.elapsed());

    // Each hostile object is named, with its field.
    let expected: &[&[&str]] = &[
        &["Ingress evil/regex", "haproxy.org/path-rewrite", "PCRE2"],
        &["Ingress evil/regex", "haproxy.org/cors-allow-origin"],
        &["Service evil/regex", "haproxy.org/route-acl", "PCRE2"],
        &["Ingress evil/snip", "backend-config-snippet", "lf-file"],
        &[
            "Service evil/snip",
            "backend-config-snippet",
            "snippet ignored",
        ],
        &["TCP evil/tcpadmin", "binds[0]"],
        &["TCP evil/tcphttp", "binds[0]"],
        &["TCP evil/tcpheld", "left out until it changes"],
        &["Service evil/extname", "externalName"],
        &["EndpointSlice evil/toadmin", "endpoints[0]"],
        &["Ingress evil/claim", "spec.tls[0].hosts[0]"],
        &[
            "Ingress evil/huge",
            "haproxy.org/path-rewrite",
            "10485760 bytes",
        ],
        &["evil-broken.yaml (document 4)"],
        &["Ingress guarded/guarded", "haproxy.org/allow-list"],
    ];
    for parts in expected {
        wait_until(
            APPLY_TIMEOUT,
            &format!("a diagnostic with {parts:?}"),
            || h.log().lines().any(|l| parts.iter().all(|p| l.contains(p))),
        );
    }

    // Everyone else answers exactly as before, and nothing leaks anywhere.
    before(&h);
    assert_eq!(h.who("half.example.com", "/"), "half");
    for host in [
        "victim.example.com",
        "guarded.example.com",
        "split.example.com",
    ]
    .into_iter()
    .chain(hostile_hosts.iter().copied())
    {
        for path in [
            "/",
            "/x",
            "/debug/config",
            "/debug/model",
            "/metrics",
            "/readyz",
        ] {
            if let Some(answer) = h.try_get(host, path) {
                assert_nothing_leaks(&format!("http://{host}{path}"), &answer);
            }
        }
    }
    assert!(
        h.wait_exit(Duration::ZERO).is_none(),
        "the controller exited:\n{}",
        h.log()
    );
    let (status, readyz) = h.readyz().expect("the admin endpoint answers");
    assert_eq!(status, 200, "{readyz}");
    let log = h.log();
    assert!(
        log.len() < 4 * 1024 * 1024,
        "the log grew to {} bytes",
        log.len()
    );
    drop(holder);
}
