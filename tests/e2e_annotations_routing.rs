//! End-to-end tests of the routing annotations (issue 8): `request-redirect`,
//! `request-capture`, `src-ip-header`, `route-acl` (canary routing) and `standalone-backend`.
//! The real `portcullis run` drives a real HAProxy; requests go through it to loopback echo
//! pods, with and without each annotation, and with a bad value for it (reported, ignored, the
//! rest still works).
//!
//! Every loop here is bounded in count and time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::annotated;

use support::{
    APPLY_TIMEOUT, Answer, Harness, https_get, ingress, poll, route, self_signed, service,
    tls_secret, wait_until,
};

const NS: &str = "shop";

/// An Ingress `name` routing `host` + `path` (Prefix) to `service`, with annotations.
fn host_ingress(
    name: &str,
    host: &str,
    path: &str,
    service: &str,
    annotations: &[(&str, &str)],
) -> String {
    annotated(
        &ingress(
            NS,
            name,
            &[route(Some(host), path, "Prefix", service)],
            None,
            &[],
        ),
        annotations,
    )
}

/// A Service `name` with one echo pod named `name`, and these annotations on the Service.
fn echo_service(h: &mut Harness, name: &str, annotations: &[(&str, &str)]) -> String {
    let backend = h.backend(NS, name);
    if annotations.is_empty() {
        return backend;
    }
    backend.replacen(&service(NS, name, &[]), &service(NS, name, annotations), 1)
}

/// Whether some line of the log holds all of `parts`.
fn log_has(h: &Harness, parts: &[&str]) -> bool {
    h.log()
        .lines()
        .any(|line| parts.iter().all(|p| line.contains(p)))
}

/// Asserts that a diagnostic naming `object` and `annotation` (and `what`) was reported, and
/// that it is counted in the error metric.
fn assert_reported(h: &Harness, object: &str, annotation: &str, what: &str) {
    assert!(
        log_has(h, &[object, annotation, what]),
        "no diagnostic {object} {annotation} {what:?}:\n{}",
        h.log()
    );
    let errors = h.metric("portcullis_input_diagnostics{severity=\"error\"}");
    assert!(errors >= 1.0, "error diagnostics counted: {errors}");
}

/// The value of header `name` (any case) the echo pod received, from its body.
fn received_header(answer: &Answer, name: &str) -> Option<String> {
    answer.body.lines().find_map(|line| {
        let (n, v) = line.split_once(": ")?;
        n.eq_ignore_ascii_case(name).then(|| v.to_string())
    })
}

// ---------------------------------------------------------------------------------------------
// request-redirect

/// A redirect answers with the configured code and a Location that keeps the path and query
/// string; without a scheme it keeps the request's (HTTP or HTTPS); a bad code falls back to
/// 302 and a bad target is ignored, both reported.
#[test]
fn request_redirect_answers_with_the_code_and_keeps_the_path() {
    let mut h = Harness::new();
    let web = echo_service(&mut h, "web", &[]);
    h.write("web.yaml", &web);
    let (crt, key) = self_signed(&h.work(), "example.com", "www");
    h.write("secret.yaml", &tls_secret(NS, "www-tls", &crt, &key));
    h.write(
        "moved.yaml",
        &host_ingress(
            "moved",
            "old.example.com",
            "/",
            "web",
            &[
                (
                    "haproxy.org/request-redirect",
                    "https://new.example.com:8443",
                ),
                ("haproxy.org/request-redirect-code", "301"),
            ],
        ),
    );
    // A bare host, on a TLS host (without ssl-redirect, so that plain HTTP is answered too).
    h.write(
        "www.yaml",
        &annotated(
            &ingress(
                NS,
                "www",
                &[route(Some("example.com"), "/", "Prefix", "web")],
                None,
                &[("www-tls", &["example.com"])],
            ),
            &[
                ("haproxy.org/request-redirect", "www.example.com"),
                ("haproxy.org/ssl-redirect", "false"),
            ],
        ),
    );
    h.write(
        "badcode.yaml",
        &host_ingress(
            "badcode",
            "code.example.com",
            "/",
            "web",
            &[
                ("haproxy.org/request-redirect", "elsewhere.example.com"),
                ("haproxy.org/request-redirect-code", "399"),
            ],
        ),
    );
    h.write(
        "badtarget.yaml",
        &host_ingress(
            "badtarget",
            "target.example.com",
            "/",
            "web",
            &[("haproxy.org/request-redirect", "ftp://files.example.com")],
        ),
    );
    h.write(
        "plain.yaml",
        &host_ingress("plain", "plain.example.com", "/", "web", &[]),
    );
    h.start(&[]);

    let answer = h.get("old.example.com", "/a/b?x=1&y=2");
    assert_eq!(answer.status, 301, "{answer:?}");
    assert_eq!(
        answer.header("location"),
        Some("https://new.example.com:8443/a/b?x=1&y=2")
    );

    let answer = h.get("example.com", "/p/q?r=s");
    assert_eq!(answer.status, 302, "the default code: {answer:?}");
    assert_eq!(
        answer.header("location"),
        Some("http://www.example.com/p/q?r=s")
    );
    let over_tls = poll(APPLY_TIMEOUT, || {
        https_get(h.https_port, "example.com", "example.com", "/p/q?r=s")
    })
    .expect("an answer over HTTPS");
    assert_eq!(over_tls.status, 302, "{over_tls:?}");
    assert_eq!(
        over_tls.header("location"),
        Some("https://www.example.com/p/q?r=s"),
        "a target without a scheme keeps the request's"
    );

    // A bad code: reported, and the redirect uses 302.
    let answer = h.get("code.example.com", "/z");
    assert_eq!(answer.status, 302, "{answer:?}");
    assert_eq!(
        answer.header("location"),
        Some("http://elsewhere.example.com/z")
    );
    assert_reported(
        &h,
        "Ingress shop/badcode",
        "annotation haproxy.org/request-redirect-code",
        "is not one of",
    );
    // A bad target: reported and ignored; the route serves as without it.
    assert_eq!(h.who("target.example.com", "/"), "web");
    assert_reported(
        &h,
        "Ingress shop/badtarget",
        "annotation haproxy.org/request-redirect",
        "only http:// and https://",
    );
    // Without the annotation: served.
    let answer = h.get("plain.example.com", "/a/b");
    assert_eq!((answer.status, answer.who()), (200, "web".to_string()));
    assert_eq!(answer.header("location"), None);
}

// ---------------------------------------------------------------------------------------------
// request-capture

/// The lines of HAProxy's request log for requests to `path`.
fn request_log_lines(h: &Harness, path: &str) -> Vec<String> {
    let needle = format!(" {path} HTTP/1.1\"");
    h.log()
        .lines()
        .filter(|l| l.contains(&needle))
        .map(str::to_string)
        .collect()
}

/// Captured headers and cookies appear in HAProxy's request log line, cut at the capture
/// length; a route without the annotation, or with a bad value, captures nothing.
#[test]
fn request_capture_puts_the_values_in_the_log() {
    let mut h = Harness::new();
    let web = echo_service(&mut h, "web", &[]);
    h.write("web.yaml", &web);
    h.write(
        "cap.yaml",
        &host_ingress(
            "cap",
            "cap.example.com",
            "/",
            "web",
            &[(
                "haproxy.org/request-capture",
                "hdr(X-Request-ID)\ncookie(session)\n",
            )],
        ),
    );
    h.write(
        "short.yaml",
        &host_ingress(
            "short",
            "short.example.com",
            "/",
            "web",
            &[
                ("haproxy.org/request-capture", "req.hdr(X-Trace)"),
                ("haproxy.org/request-capture-len", "8"),
            ],
        ),
    );
    h.write(
        "badcap.yaml",
        &host_ingress(
            "badcap",
            "badcap.example.com",
            "/",
            "web",
            &[("haproxy.org/request-capture", "env(SECRET)")],
        ),
    );
    h.write(
        "plain.yaml",
        &host_ingress("plain", "plain.example.com", "/", "web", &[]),
    );
    h.start(&[]);

    let answer = h.get_with(
        "cap.example.com",
        "/captured",
        &[("X-Request-ID", "req-4711"), ("Cookie", "session=s-42")],
    );
    assert_eq!((answer.status, answer.who()), (200, "web".to_string()));
    let line = poll(APPLY_TIMEOUT, || {
        request_log_lines(&h, "/captured").into_iter().next()
    })
    .unwrap_or_else(|| panic!("no log line for /captured:\n{}", h.log()));
    assert!(line.contains("{req-4711|s-42|"), "{line}");

    let answer = h.get_with(
        "short.example.com",
        "/cut",
        &[("X-Trace", "abcdefghijklmnop")],
    );
    assert_eq!(answer.status, 200);
    let line = poll(APPLY_TIMEOUT, || {
        request_log_lines(&h, "/cut").into_iter().next()
    })
    .unwrap_or_else(|| panic!("no log line for /cut:\n{}", h.log()));
    assert!(
        line.contains("|abcdefgh}") && !line.contains("abcdefghi"),
        "cut at 8 characters: {line}"
    );

    // A bad value: reported, nothing captured, the route still serves; same without one.
    assert_reported(
        &h,
        "Ingress shop/badcap",
        "annotation haproxy.org/request-capture",
        "is not a sample expression",
    );
    for (host, path) in [
        ("badcap.example.com", "/not-captured"),
        ("plain.example.com", "/plain"),
    ] {
        let answer = h.get_with(host, path, &[("X-Request-ID", "req-0815")]);
        assert_eq!((answer.status, answer.who()), (200, "web".to_string()));
        let line = poll(APPLY_TIMEOUT, || {
            request_log_lines(&h, path).into_iter().next()
        })
        .unwrap_or_else(|| panic!("no log line for {path}:\n{}", h.log()));
        assert!(!line.contains("req-0815"), "{line}");
        assert!(line.contains("{||}"), "empty slots only: {line}");
    }
}

// ---------------------------------------------------------------------------------------------
// src-ip-header

/// With `src-ip-header`, the allow-list applies to the address in the header, the pod gets it
/// in X-Forwarded-For and the log shows it; without (or with a bad value), the header changes
/// nothing.
#[test]
fn src_ip_header_sets_the_client_address() {
    let mut h = Harness::new();
    let web = echo_service(&mut h, "web", &[]);
    h.write("web.yaml", &web);
    let allow = ("haproxy.org/allow-list", "203.0.113.0/24");
    h.write(
        "cdn.yaml",
        &host_ingress(
            "cdn",
            "cdn.example.com",
            "/",
            "web",
            &[("haproxy.org/src-ip-header", "True-Client-IP"), allow],
        ),
    );
    h.write(
        "direct.yaml",
        &host_ingress("direct", "direct.example.com", "/", "web", &[allow]),
    );
    h.write(
        "badsrc.yaml",
        &host_ingress(
            "badsrc",
            "bad.example.com",
            "/",
            "web",
            &[("haproxy.org/src-ip-header", "True-Client-IP, X-Real-IP")],
        ),
    );
    h.start(&[]);

    let from = |host: &str, path: &str, ip: Option<&str>| {
        let headers: Vec<(&str, &str)> = ip.map(|ip| ("True-Client-IP", ip)).into_iter().collect();
        h.get_with(host, path, &headers)
    };
    // The connection comes from 127.0.0.1, outside the allow-list.
    assert_eq!(from("cdn.example.com", "/", None).status, 403);
    let answer = from("cdn.example.com", "/from-cdn", Some("203.0.113.7"));
    assert_eq!((answer.status, answer.who()), (200, "web".to_string()));
    assert_eq!(
        received_header(&answer, "x-forwarded-for").as_deref(),
        Some("203.0.113.7"),
        "{answer:?}"
    );
    assert_eq!(
        from("cdn.example.com", "/", Some("198.51.100.1")).status,
        403
    );
    // Not an address: the connection's address stays.
    assert_eq!(from("cdn.example.com", "/", Some("nonsense")).status, 403);
    let line = poll(APPLY_TIMEOUT, || {
        h.log()
            .lines()
            .find(|l| l.contains(" /from-cdn HTTP/1.1\""))
            .map(str::to_string)
    })
    .unwrap_or_else(|| panic!("no log line:\n{}", h.log()));
    // HAProxy's line (after the controller's log prefix) starts with the client address.
    assert!(
        line.contains(" 203.0.113.7:") && !line.contains("127.0.0.1:"),
        "{line}"
    );

    // Without the annotation the header is just a header.
    assert_eq!(
        from("direct.example.com", "/", Some("203.0.113.7")).status,
        403
    );
    // A bad value: reported and ignored.
    assert_reported(
        &h,
        "Ingress shop/badsrc",
        "annotation haproxy.org/src-ip-header",
        "is not a header name",
    );
    let answer = from("bad.example.com", "/", Some("203.0.113.7"));
    assert_eq!(answer.status, 200);
    assert_eq!(
        received_header(&answer, "x-forwarded-for").as_deref(),
        Some("127.0.0.1")
    );
}

// ---------------------------------------------------------------------------------------------
// route-acl

/// Who answers `path` on the canary host with these request headers.
fn who_with(h: &Harness, path: &str, headers: &[(&str, &str)]) -> String {
    h.get_with(CANARY_HOST, path, headers).who()
}

const CANARY_HOST: &str = "canary.example.com";

/// The cookie the canary Service's condition looks for.
const STAGING: &[(&str, &str)] = &[("Cookie", "staging=1")];

/// `(path, request headers, who answers)`.
type Row = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// A canary Service's condition sends matching requests to it and the others to the regular
/// route of the same host and path; a more specific regular route still wins; a canary route
/// with no regular route of its own falls through to the next best one. New regular paths are
/// added at run time, canary part included. A bad condition is reported and ignored.
#[test]
fn route_acl_sends_matching_requests_to_the_canary() {
    let mut h = Harness::new();
    let mut docs = vec![
        echo_service(&mut h, "main", &[]),
        echo_service(&mut h, "api", &[]),
        echo_service(
            &mut h,
            "canary",
            &[("haproxy.org/route-acl", "cookie(staging) -m found")],
        ),
        echo_service(
            &mut h,
            "beta",
            &[("haproxy.org/route-acl", "hdr(X-Beta) -i -m str yes on")],
        ),
        echo_service(
            &mut h,
            "broken",
            &[("haproxy.org/route-acl", "lua.canary(x) -m found")],
        ),
    ];
    h.write("services.yaml", &docs.join("---\n"));
    docs.clear();
    let main_ingress = |extra: bool| {
        let mut routes = vec![
            route(Some(CANARY_HOST), "/", "Prefix", "main"),
            route(Some(CANARY_HOST), "/api", "Prefix", "api"),
        ];
        if extra {
            routes.push(route(Some(CANARY_HOST), "/static", "Prefix", "api"));
        }
        ingress(NS, "main", &routes, None, &[])
    };
    h.write("main.yaml", &main_ingress(false));
    h.write(
        "canary.yaml",
        &host_ingress("canary", CANARY_HOST, "/", "canary", &[]),
    );
    h.write(
        "beta.yaml",
        &host_ingress("beta", CANARY_HOST, "/beta", "beta", &[]),
    );
    h.write(
        "broken.yaml",
        &host_ingress("broken", "broken.example.com", "/", "broken", &[]),
    );
    h.start(&[]);

    let table: &[Row] = &[
        ("/", &[], "main"),
        ("/anything", &[], "main"),
        ("/", STAGING, "canary"),
        ("/anything?x=1", STAGING, "canary"),
        ("/", &[("Cookie", "other=1")], "main"),
        // The more specific regular route wins over the canary's /.
        ("/api/users", STAGING, "api"),
        ("/api", STAGING, "api"),
        ("/api/users", &[], "api"),
        // A canary route alone on its path: taken when its condition holds, else the next
        // best route (/) decides.
        ("/beta/x", &[("X-Beta", "yes")], "beta"),
        ("/beta/x", &[("X-Beta", "ON")], "beta"),
        ("/beta/x", &[("X-Beta", "no")], "main"),
        ("/beta/x", &[], "main"),
    ];
    let check = |h: &Harness| {
        let wrong: Vec<String> = table
            .iter()
            .filter_map(|(path, headers, want)| {
                let got = who_with(h, path, headers);
                (got != *want).then(|| format!("{path} {headers:?}: want {want}, got {got}"))
            })
            .collect();
        assert!(wrong.is_empty(), "{}\n{}", wrong.join("\n"), h.log());
    };
    check(&h);

    // The condition is typed and rendered by Portcullis.
    let config = h
        .admin("/debug/config")
        .expect("/debug/config answers")
        .body;
    assert!(
        config.contains("{ req.cook(staging) -m found }"),
        "{config}"
    );
    assert!(config.contains("{ req.hdr(X-Beta) -i -m str yes on }"));
    // A condition outside the accepted subset: reported, and the path is a regular route.
    assert_reported(
        &h,
        "Service shop/broken",
        "annotation haproxy.org/route-acl",
        "is not a fetch route-acl accepts",
    );
    assert!(!config.contains("lua.canary"));
    assert_eq!(h.who("broken.example.com", "/"), "broken");

    // A new regular path is a runtime map change, in the canary part too: with the staging
    // cookie, /static goes to its own route, not to the canary's /.
    let reloads = h.reloads();
    h.write("main.yaml", &main_ingress(true));
    wait_until(APPLY_TIMEOUT, "/static is routed", || {
        who_with(&h, "/static/app.css", &[]) == "api"
    });
    assert_eq!(who_with(&h, "/static/app.css", STAGING), "api");
    assert_eq!(who_with(&h, "/", STAGING), "canary");
    assert_eq!(h.reloads(), reloads, "a new path reloaded");

    // Without the canary Ingress, the cookie changes nothing.
    h.remove("canary.yaml");
    wait_until(APPLY_TIMEOUT, "the canary route is gone", || {
        who_with(&h, "/", STAGING) == "main"
    });
    h.wait_old_workers_gone();
    assert_eq!(who_with(&h, "/x", STAGING), "main");
    assert_eq!(who_with(&h, "/beta/x", &[("X-Beta", "yes")]), "beta");
}

// ---------------------------------------------------------------------------------------------
// standalone-backend

/// With `standalone-backend`, an Ingress' backend-scope annotations apply to its own backend
/// only: here `forwarded-for: "false"` of the oldest Ingress no longer reaches the other
/// Ingress sharing the Service. A bad value is reported and the shared backend used.
#[test]
fn standalone_backend_keeps_ingress_settings_to_the_ingress() {
    let mut h = Harness::new();
    let web = echo_service(&mut h, "web", &[]);
    h.write("web.yaml", &web);
    let no_xff = ("haproxy.org/forwarded-for", "false");
    // `admin` sorts first, so it is the oldest Ingress (none has a timestamp).
    let admin = |standalone: &str| {
        host_ingress(
            "admin",
            "admin.example.com",
            "/",
            "web",
            &[("haproxy.org/standalone-backend", standalone), no_xff],
        )
    };
    h.write("admin.yaml", &admin("true"));
    h.write(
        "shop.yaml",
        &host_ingress("shop", "shop.example.com", "/", "web", &[]),
    );
    h.start(&[]);

    let xff = |host: &str| {
        let answer = h.get(host, "/");
        assert_eq!((answer.status, answer.who()), (200, "web".to_string()));
        received_header(&answer, "x-forwarded-for")
    };
    assert_eq!(xff("admin.example.com"), None);
    assert_eq!(xff("shop.example.com").as_deref(), Some("127.0.0.1"));
    let config = h
        .admin("/debug/config")
        .expect("/debug/config answers")
        .body;
    assert!(
        config.contains("\nbackend shop_admin_svc_web_80\n"),
        "{config}"
    );
    assert!(config.contains("\nbackend shop_web_80\n"), "{config}");

    // A bad value: reported; admin shares the backend again, and its forwarded-for (the
    // oldest Ingress') applies to both hosts, as it does without standalone-backend.
    h.write("admin.yaml", &admin("maybe"));
    wait_until(APPLY_TIMEOUT, "the standalone backend is gone", || {
        h.admin("/debug/config")
            .is_some_and(|a| !a.body.contains("shop_admin_svc_web_80"))
    });
    h.wait_old_workers_gone();
    assert_reported(
        &h,
        "Ingress shop/admin",
        "annotation haproxy.org/standalone-backend",
        "is not a boolean",
    );
    assert_eq!(xff("admin.example.com"), None);
    assert_eq!(xff("shop.example.com"), None);
}
