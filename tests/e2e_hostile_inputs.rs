//! End-to-end: hostile values from one tenant hurt only that tenant. The real `portcullis run`
//! drives a real HAProxy; a victim Ingress in namespace `victim` answers; each hostile object is
//! added in namespace `evil` (regexes PCRE2 refuses in `path-rewrite`, `cors-allow-origin` and
//! `route-acl … -m reg`; config snippets outside the allowlist, with both snippet flags on; a
//! 10 MB annotation); then a new Ingress in namespace `newcomer` must go live within seconds
//! while the victim keeps answering, nothing leaks into any answer, the controller keeps
//! running, and the hostile object gets a diagnostic naming it and its field.
//!
//! One harness per test function, many vectors per harness: the vectors accumulate, so the
//! last newcomer goes live with all of them in place. Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::{APPLY_TIMEOUT, Answer, Harness, annotated_site, process_exists, wait_until};

/// Regexes HAProxy's PCRE2 10.42 refuses (all but the last pass Rust's regex syntax; the last
/// passes PCRE2 10.43 and later).
const REGEX_VECTORS: &[&str] = &[
    "(?u)^/x",
    "^/a{65536}",
    r"\u0041",
    r"\U00000041",
    r"^/(?<=ab?)c",
];

/// Snippet lines that would read files, keys or the environment, rewrite other tenants'
/// routes, or run preprocessor directives.
const SNIPPET_VECTORS: &[&str] = &[
    "http-request return status 200 content-type text/plain lf-file /etc/passwd",
    "http-request return status 200 file certs/crt-list.txt",
    "http-request return status 200 file certs/victim_victim.pem",
    "http-response set-header X-Home \"'$HOME'\"",
    "http-request set-map(maps/exact.map) victim.example.com/ evil",
    ".if defined(HOME)",
    ".alert PWN",
    ".diag PWN",
    "filter spoe engine x config /etc/passwd",
];

/// How long a new good Ingress may take to answer after a hostile object was taken in.
const GO_LIVE: Duration = Duration::from_secs(10);

/// What no answer may carry: file contents, keys, the controller's environment.
fn assert_nothing_leaks(what: &str, answer: &Answer) {
    let home = std::env::var("HOME").unwrap_or_default();
    let mut text = answer.body.clone();
    for (name, value) in &answer.headers {
        text.push_str(&format!("\n{name}: {value}"));
    }
    assert!(
        !text.contains("root:x:0:0"),
        "{what} served /etc/passwd:\n{text}"
    );
    assert!(
        !text.contains("PRIVATE KEY"),
        "{what} served a key:\n{text}"
    );
    assert!(
        home.is_empty() || !text.contains(&format!("'{home}'")),
        "{what} served the environment:\n{text}"
    );
}

/// Starts a harness with the victim answering.
fn start(extra: &[&str]) -> Harness {
    let mut h = Harness::new();
    let victim = annotated_site(&mut h, ("victim", "victim", "victim.example.com"), &[], &[]);
    h.write("victim.yaml", &victim);
    h.start(extra);
    wait_until(APPLY_TIMEOUT, "the victim answers", || {
        h.try_get("victim.example.com", "/")
            .is_some_and(|a| a.who() == "victim")
    });
    h
}

/// Adds one hostile object (`evil-<n>.yaml`), waits for its diagnostic (every one of
/// `diagnostic`'s parts on one log line), then adds a good Ingress in `newcomer` and checks
/// that it goes live, that the victim still answers, that nothing leaks and that the
/// controller runs.
fn hostile_then_newcomer(h: &mut Harness, n: usize, evil: &str, diagnostic: &[&str]) {
    h.write(&format!("evil-{n}.yaml"), evil);
    wait_until(
        APPLY_TIMEOUT,
        &format!("vector {n}: a diagnostic with {diagnostic:?}"),
        || {
            h.log()
                .lines()
                .any(|l| diagnostic.iter().all(|p| l.contains(p)))
        },
    );
    let name = format!("newcomer{n}");
    let host = format!("{name}.example.com");
    let newcomer = annotated_site(h, ("newcomer", &name, &host), &[], &[]);
    h.write(&format!("newcomer-{n}.yaml"), &newcomer);
    wait_until(
        GO_LIVE,
        &format!("vector {n}: the newcomer {host} goes live"),
        || h.try_get(&host, "/").is_some_and(|a| a.who() == name),
    );
    let victim = h.get("victim.example.com", "/");
    assert_eq!(victim.who(), "victim", "vector {n}: the victim moved");
    assert_nothing_leaks(&format!("vector {n}: the victim"), &victim);
    assert_nothing_leaks(&format!("vector {n}: the newcomer"), &h.get(&host, "/"));
    assert!(
        process_exists(h.pid()),
        "vector {n}: the controller stopped:\n{}",
        h.log()
    );
}

/// With every vector added so far still in place, the victim and every newcomer answer.
fn all_still_answer(h: &Harness, vectors: usize) {
    assert_eq!(h.get("victim.example.com", "/").who(), "victim");
    for n in 0..vectors {
        let name = format!("newcomer{n}");
        assert_eq!(h.get(&format!("{name}.example.com"), "/").who(), name);
    }
}

/// Regexes PCRE2 refuses, each in the three places a regex is written.
#[test]
fn regexes_haproxy_refuses_hurt_only_their_object() {
    let mut h = start(&[]);
    for (n, re) in REGEX_VECTORS.iter().enumerate() {
        let name = format!("evil{n}");
        let host = format!("{name}.example.com");
        let acl = format!("path -m reg {re}");
        let rewrite = format!("{re} /x");
        let origin = format!("^https://{}$", re.trim_start_matches('^'));
        let evil = annotated_site(
            &mut h,
            ("evil", &name, &host),
            &[("haproxy.org/route-acl", &acl)],
            &[
                ("haproxy.org/path-rewrite", &rewrite),
                ("haproxy.org/cors-enable", "true"),
                ("haproxy.org/cors-allow-origin", &origin),
            ],
        );
        let ingress = format!("Ingress evil/{name}");
        hostile_then_newcomer(
            &mut h,
            n,
            &evil,
            &[&ingress, "haproxy.org/path-rewrite", "PCRE2"],
        );
        for (object, field) in [
            (ingress.clone(), "haproxy.org/cors-allow-origin"),
            (format!("Service evil/{name}"), "haproxy.org/route-acl"),
        ] {
            assert!(
                h.log()
                    .lines()
                    .any(|l| l.contains(&object) && l.contains(field) && l.contains("PCRE2")),
                "no diagnostic for {object} {field}:\n{}",
                h.log()
            );
        }
        // The hostile object's own route still answers, without the refused settings.
        assert_eq!(h.get(&host, "/").who(), name);
    }
    all_still_answer(&h, REGEX_VECTORS.len());
}

/// Snippet lines outside the allowlist, with both snippet flags on.
#[test]
fn snippets_outside_the_allowlist_hurt_only_their_object() {
    let mut h = start(&[
        "--allow-config-snippets",
        "--allow-config-snippets-in-annotations",
    ]);
    for (n, line) in SNIPPET_VECTORS.iter().enumerate() {
        let name = format!("evil{n}");
        let host = format!("{name}.example.com");
        let evil = annotated_site(
            &mut h,
            ("evil", &name, &host),
            &[],
            &[("haproxy.org/backend-config-snippet", line)],
        );
        hostile_then_newcomer(
            &mut h,
            n,
            &evil,
            &[
                &format!("Ingress evil/{name}"),
                "haproxy.org/backend-config-snippet",
                "snippet ignored",
            ],
        );
        let own = h.get(&host, "/");
        assert_eq!(own.who(), name, "{line:?}");
        assert_nothing_leaks(&format!("{line:?} on its own host"), &own);
    }
    all_still_answer(&h, SNIPPET_VECTORS.len());
    assert!(!h.log().contains("root:x:0:0"), "the log shows /etc/passwd");
}

/// A 10 MB annotation value: one short diagnostic, and the rest carries on.
#[test]
fn a_huge_annotation_is_refused_briefly() {
    let mut h = start(&[]);
    let huge = "x".repeat(10 * 1024 * 1024);
    let evil = annotated_site(
        &mut h,
        ("evil", "huge", "huge.example.com"),
        &[],
        &[("haproxy.org/path-rewrite", &huge)],
    );
    hostile_then_newcomer(
        &mut h,
        0,
        &evil,
        &[
            "Ingress evil/huge",
            "haproxy.org/path-rewrite",
            "10485760 bytes",
        ],
    );
    assert_eq!(h.get("huge.example.com", "/").who(), "huge");
    let log = h.log();
    assert!(
        log.len() < 1024 * 1024,
        "the log grew to {} bytes",
        log.len()
    );
    for line in log.lines().filter(|l| l.contains("evil/huge")) {
        assert!(line.len() < 2048, "a {} byte line", line.len());
    }
}
