//! haproxytech/kubernetes-ingress' own end-to-end suites for what happens to a request on its
//! route, re-expressed against Portcullis: `set-header` (request and response headers,
//! `set-host`), the `path-rewrite` examples of its documentation (it has no suite for them),
//! `cors` (annotations on the Ingress), `rate-limiting`, `basic-auth`, `source-ip` and
//! `access-control`. One test per suite case, in the suites' shape: an `http-echo` app and an
//! Ingress of class `haproxy` per suite namespace, annotations as the suites set them (bare
//! names), and their assertions polled until they hold, as their `Eventually` does.
//!
//! The tests share one `portcullis run` (serving the incumbent's class) and differ by
//! namespace and host. Where Portcullis deliberately differs, the step says so and
//! `docs/migration.md` lists it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod incumbent;
mod support;

use std::sync::Arc;
use std::time::Duration;

use incumbent::*;
use support::{APPLY_TIMEOUT, Answer, Harness, base64, wait_until};

static SHARED: Shared = Shared::new();

fn harness() -> Arc<Harness> {
    SHARED.get(
        |h| h.write("ingressclass.yaml", &ingress_class()),
        &CLASS_FLAGS,
    )
}

// ---------------------------------------------------------------------------------------------
// set-header

fn request_set_header_case(suite: &Suite, h: &Harness, annotation: &str) {
    for (name, value) in [
        ("Cache-Control", "no-store,no-cache,private"),
        ("X-Custom-Header", "haproxy-ingress-controller"),
    ] {
        let setting = format!("{name} {value}");
        suite.ingress(h, &[(annotation, &setting)]);
        let lower = name.to_ascii_lowercase();
        suite.eventually(
            h,
            &format!("the pod receives {name}: {value}"),
            || suite.get(h, &[]),
            |a| a.status == 200 && received(a, &lower).as_deref() == Some(value),
        );
    }
}

/// set-header `Test_Request_Set_Header`.
#[test]
fn set_header_request_set_header() {
    let h = harness();
    let suite = Suite::new("set-header-request");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    request_set_header_case(&suite, &h, &org("request-set-header"));
}

/// set-header `Test_Request_Set_Header` with the annotation under the incumbent's two
/// documented prefixes.
#[test]
fn set_header_request_set_header_prefixed() {
    let h = harness();
    for prefix in ["haproxy.org", "haproxy.com"] {
        let suite = Suite::new(&format!("set-header-{}", prefix.replace('.', "-")));
        let pod = Pod::start("http-echo", Reply::Echo);
        suite.app(&h, &pod);
        request_set_header_case(&suite, &h, &format!("{prefix}/request-set-header"));
    }
}

/// set-header `Test_Response_Set_Header`.
#[test]
fn set_header_response_set_header() {
    let h = harness();
    let suite = Suite::new("set-header-response");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    for (name, value) in [
        ("Cache-Control", "no-store,no-cache,private"),
        ("X-Custom-Header", "haproxy-ingress-controller"),
    ] {
        let setting = format!("{name} {value}");
        suite.ingress(&h, &[(&org("response-set-header"), &setting)]);
        let lower = name.to_ascii_lowercase();
        suite.eventually(
            &h,
            &format!("the answer carries {name}: {value}"),
            || suite.get(&h, &[]),
            |a| a.status == 200 && a.header(&lower) == Some(value),
        );
    }
}

/// The incumbent's documentation quotes header values (`Cache-Control
/// "no-store,no-cache,private"`); HAProxy strips the quotes, so the pod sees the bare value.
#[test]
fn set_header_quoted_values() {
    let h = harness();
    let suite = Suite::new("set-header-quoted");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    suite.ingress(
        &h,
        &[
            (
                &org("request-set-header"),
                "Cache-Control \"no-store,no-cache,private\"",
            ),
            (
                &org("response-set-header"),
                "X-Custom-Header \"haproxy ingress\"",
            ),
        ],
    );
    suite.eventually(
        &h,
        "the quoted values arrive without their quotes",
        || suite.get(&h, &[]),
        |a| {
            received(a, "cache-control").as_deref() == Some("no-store,no-cache,private")
                && a.header("x-custom-header") == Some("haproxy ingress")
        },
    );
}

/// set-header `Test_Set_Host`.
#[test]
fn set_header_set_host() {
    let h = harness();
    let suite = Suite::new("set-host");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    for host in ["foo", "bar"] {
        suite.ingress(&h, &[(&org("set-host"), host)]);
        suite.eventually(
            &h,
            &format!("the pod receives Host: {host}"),
            || suite.get(&h, &[]),
            |a| a.status == 200 && received_host(a).as_deref() == Some(host),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// path-rewrite (the examples of the incumbent's annotation documentation)

/// Each single-rule example of the incumbent's `path-rewrite` documentation, with the
/// rewrite it promises.
#[test]
fn path_rewrite_documented_examples() {
    let h = harness();
    let suite = Suite::new("path-rewrite");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    for (rule, sent, seen) in [
        ("/", "/bar?q=1", "/?q=1"),
        ("(.*) /foo\\1", "/bar?q=1", "/foo/bar?q=1"),
        ("([^?]*)(\\?(.*))? \\1/foo\\2", "/bar?q=1", "/bar/foo?q=1"),
        ("/foo/(.*) /\\1", "/foo/bar?q=1", "/bar?q=1"),
    ] {
        suite.ingress(&h, &[(&org("path-rewrite"), rule)]);
        let expected = format!("http-echo GET {seen} ");
        suite.eventually(
            &h,
            &format!("{rule:?} turns {sent} into {seen}"),
            || suite.send(&h, "GET", sent, &[]),
            |a| a.status == 200 && a.body.starts_with(&expected),
        );
    }
}

/// The multi-line example: one rule per line, applied in order.
#[test]
fn path_rewrite_documented_multiline_example() {
    let h = harness();
    let suite = Suite::new("path-rewrite-multiline");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    suite.ingress(
        &h,
        &[(&org("path-rewrite"), "/foo/(.*) /\\1\n/bar/(.*) /baz/\\1\n")],
    );
    for (sent, seen) in [
        ("/foo/bar?q=1", "/bar?q=1"),
        ("/bar/x", "/baz/x"),
        ("/foo/bar/x", "/baz/x"),
    ] {
        let expected = format!("http-echo GET {seen} ");
        suite.eventually(
            &h,
            &format!("{sent} becomes {seen}"),
            || suite.send(&h, "GET", sent, &[]),
            |a| a.status == 200 && a.body.starts_with(&expected),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// cors (Test_Ingress_Alone)

const ACAO: &str = "access-control-allow-origin";
const ACAM: &str = "access-control-allow-methods";
const ACAH: &str = "access-control-allow-headers";
const ACMA: &str = "access-control-max-age";
const ACAC: &str = "access-control-allow-credentials";

/// Whether `answer` carries each expected header exactly once with its value, and none of
/// the unexpected ones.
fn cors_headers_are(answer: &Answer, expected: &[(&str, &str)], unexpected: &[&str]) -> bool {
    expected
        .iter()
        .all(|(n, v)| header_values(answer, n) == [*v])
        && unexpected.iter().all(|n| answer.header(n).is_none())
}

/// A setting: `(name, value)`.
type Setting<'a> = (&'a str, &'a str);
/// Settings as `(name, value)` pairs.
type Settings<'a> = Vec<Setting<'a>>;
/// A case of the cors suite: its name, the settings, the headers expected with their values,
/// the headers that must be absent.
type CorsCase<'a> = (&'a str, Settings<'a>, Settings<'a>, Vec<&'a str>);

/// The cases of the cors suite, for the Ingress (`annotate`) or the ConfigMap.
fn cors_cases(suite: &Suite, h: &Harness, annotate: &dyn Fn(&[Setting<'_>])) {
    let origin = format!("http://{}", suite.host);
    let star = [(ACAO, "*"), (ACAM, "*"), (ACAH, "*"), (ACMA, "5")];
    let cases: Vec<CorsCase<'_>> = vec![
        (
            "Default",
            vec![("cors-enable", "true")],
            star.to_vec(),
            vec![ACAC],
        ),
        (
            "CorsOriginAlone",
            vec![("cors-enable", "true"), ("cors-allow-origin", &origin)],
            vec![(ACAO, &origin), (ACAM, "*"), (ACAH, "*"), (ACMA, "5")],
            vec![ACAC],
        ),
        (
            "CorsMethodsAlone",
            vec![("cors-enable", "true"), ("cors-allow-methods", "GET")],
            vec![(ACAO, "*"), (ACAM, "GET"), (ACAH, "*"), (ACMA, "5")],
            vec![ACAC],
        ),
        (
            "CorsMethodsHeadersAlone",
            vec![("cors-enable", "true"), ("cors-allow-headers", "Accept")],
            vec![(ACAO, "*"), (ACAM, "*"), (ACAH, "Accept"), (ACMA, "5")],
            vec![ACAC],
        ),
        (
            "CorsMethodsAgeAlone",
            vec![("cors-enable", "true"), ("cors-max-age", "500s")],
            vec![(ACAO, "*"), (ACAM, "*"), (ACAH, "*"), (ACMA, "500")],
            vec![ACAC],
        ),
        (
            "CorsMethodsCredentialAlone",
            vec![("cors-enable", "true"), ("cors-allow-credentials", "true")],
            vec![
                (ACAO, "*"),
                (ACAM, "*"),
                (ACAH, "*"),
                (ACAC, "true"),
                (ACMA, "5"),
            ],
            vec![],
        ),
        (
            "CorsDisable",
            vec![
                ("cors-enable", "false"),
                ("cors-allow-origin", "http://wrong.com"),
                ("cors-allow-credentials", "true"),
                ("cors-allow-methods", "GET"),
                ("cors-allow-headers", "Accept"),
            ],
            vec![],
            vec![ACAO, ACAM, ACAH, ACMA, ACAC],
        ),
        (
            "CorsMethodsCredentialDisable",
            vec![("cors-enable", "true"), ("cors-allow-credentials", "false")],
            star.to_vec(),
            vec![ACAC],
        ),
    ];
    for (name, settings, expected, unexpected) in cases {
        annotate(&settings);
        suite.eventually(
            h,
            &format!("{name}: {expected:?} and none of {unexpected:?}"),
            || suite.get(h, &[]),
            |a| a.status == 200 && cors_headers_are(a, &expected, &unexpected),
        );
    }

    // DefaultWithNoContent: with cors-respond-to-options, HAProxy answers a preflight itself
    // with 204 and the headers. The suite sends a bare OPTIONS; Portcullis answers only real
    // preflights (with Access-Control-Request-Method, as browsers send them) and passes a
    // bare OPTIONS on to the pod, headers added.
    annotate(&[("cors-enable", "true"), ("cors-respond-to-options", "true")]);
    let expected = [(ACAO, "*"), (ACAM, "*"), (ACAH, "*")];
    suite.eventually(
        h,
        "DefaultWithNoContent: a preflight gets 204 and the headers from HAProxy",
        || {
            suite.send(
                h,
                "OPTIONS",
                "/",
                &[("Access-Control-Request-Method", "GET")],
            )
        },
        |a| a.status == 204 && cors_headers_are(a, &expected, &[ACAC]),
    );
    let bare = suite.send(h, "OPTIONS", "/", &[]).expect("an answer");
    assert_eq!(bare.status, 200, "a bare OPTIONS reaches the pod: {bare:?}");
    assert!(bare.body.starts_with("http-echo OPTIONS /"), "{bare:?}");
    assert!(cors_headers_are(&bare, &expected, &[ACAC]), "{bare:?}");
}

/// cors `Test_Ingress_Alone`.
#[test]
fn cors_ingress_alone() {
    let h = harness();
    let suite = Suite::new("cors-ingress");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    let annotate = |settings: &[(&str, &str)]| {
        let named: Vec<(String, &str)> = settings.iter().map(|(k, v)| (org(k), *v)).collect();
        let refs: Vec<(&str, &str)> = named.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        suite.ingress(&h, &refs);
    };
    cors_cases(&suite, &h, &annotate);
}

/// cors `Test_Configmap_Alone`: the same cases with the settings in the controller
/// ConfigMap, which apply to every route. A `portcullis run` of its own (the ConfigMap is
/// everyone's).
#[test]
fn cors_configmap_alone() {
    let mut h = Harness::new();
    h.write("ingressclass.yaml", &ingress_class());
    let base = include_str!("fixtures/incumbent/configmap.yaml");
    h.write("configmap.yaml", base);
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend(CONFIGMAP_FLAGS);
    h.start(&flags);
    let suite = Suite::new("cors-configmap");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    suite.ingress(&h, &[]);
    let annotate = |settings: &[(&str, &str)]| {
        let mut cm = base.to_string();
        for (k, v) in settings {
            cm.push_str(&format!("  {k}: {v:?}\n"));
        }
        h.write("configmap.yaml", &cm);
    };
    cors_cases(&suite, &h, &annotate);
}

// ---------------------------------------------------------------------------------------------
// rate-limiting

/// rate-limiting `Test_Rate_Limiting`: a client gets exactly `rate-limit-requests` 200s, then
/// the status code, on a fresh host per case.
#[test]
fn rate_limiting() {
    let h = harness();
    let suite = Suite::new("rate-limiting");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    for (case, requests, period_s, code) in [
        ("5req1s", 5u32, 1u64, 403u16),
        ("20req2s", 20, 2, 403),
        ("customcode", 1, 1, 429),
    ] {
        let host = format!("{case}.test");
        let period = format!("{period_s}s");
        let requests_text = requests.to_string();
        let code_text = code.to_string();
        suite.ingress_for(
            &h,
            case,
            &host,
            &[
                (&org("rate-limit-period"), &period),
                (&org("rate-limit-requests"), &requests_text),
                (&org("rate-limit-status-code"), &code_text),
            ],
        );
        let get = || request(h.http_port, "GET", &host, "/", &[]);
        // The route exists once its host stops getting the default backend's 404; those
        // probes count against the limit too, so the window must pass before counting.
        wait_until(APPLY_TIMEOUT, "the rate-limited route is served", || {
            get().is_some_and(|a| a.status != 404)
        });
        let mut counted = None;
        for _attempt in 0..5 {
            // HAProxy's rate is a sliding estimate over the current and the previous period.
            std::thread::sleep(Duration::from_secs(2 * period_s) + Duration::from_millis(100));
            let mut ok = 0u32;
            let mut status = 0;
            for _ in 0..requests * 3 + 10 {
                status = get().map_or(0, |a| a.status);
                if status == 200 {
                    ok += 1;
                } else {
                    break;
                }
            }
            if status == code && ok == requests {
                counted = Some(ok);
                break;
            }
        }
        assert_eq!(
            counted,
            Some(requests),
            "{case}: {requests} requests then {code}\n{}",
            support::log_tail(&h.log(), 30)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// basic-auth

/// basic-auth `Test_BasicAuth`: without credentials 401; each user of the Secret (one per
/// crypt(3) scheme) gets in with the password `password`.
#[test]
fn basic_auth() {
    let h = harness();
    let suite = Suite::new("basic-auth");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    h.write(
        "basic-auth-secret.yaml",
        include_str!("fixtures/incumbent/basic-auth-secret.yaml"),
    );
    suite.ingress(
        &h,
        &[
            (&org("auth-secret"), "basic-auth"),
            (&org("auth-type"), "basic-auth"),
        ],
    );
    suite.eventually(
        &h,
        "Denied: 401",
        || suite.get(&h, &[]),
        |a| a.status == 401,
    );
    for user in ["des", "md5", "sha-256", "sha-512"] {
        let credentials = format!("Basic {}", base64(format!("{user}:password").as_bytes()));
        suite.eventually(
            &h,
            &format!("Allowed: {user} gets 200"),
            || suite.get(&h, &[("Authorization", &credentials)]),
            |a| a.status == 200,
        );
    }
    let wrong = format!("Basic {}", base64(b"md5:wrong"));
    let answer = suite.get(&h, &[("Authorization", &wrong)]).unwrap();
    assert_eq!(answer.status, 401, "a wrong password");
}

// ---------------------------------------------------------------------------------------------
// source-ip

/// source-ip `Test_Set_Source_Ip`: the address in `src-ip-header` is the one the deny-list
/// sees.
#[test]
fn source_ip_set_source_ip() {
    let h = harness();
    let suite = Suite::new("source-ip");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    for (header, ip) in [("X-Client-IP", "10.0.0.1"), ("X-Real-IP", "62.1.87.32")] {
        suite.ingress(
            &h,
            &[(&org("src-ip-header"), header), (&org("blacklist"), ip)],
        );
        suite.eventually(
            &h,
            &format!("{header}: {ip} is refused"),
            || suite.get(&h, &[(header, ip)]),
            |a| a.status == 403,
        );
        // Not part of the suite: another address in the header still gets in.
        let other = suite.get(&h, &[(header, "192.0.2.1")]).unwrap();
        assert_eq!(other.status, 200, "{header}: 192.0.2.1 gets in");
    }
}

// ---------------------------------------------------------------------------------------------
// access-control

/// Applies `annotations` (with `src-ip-header: X-Client-IP`) and polls until each client
/// address gets its status.
fn access_case(suite: &Suite, h: &Harness, annotations: &[(&str, &str)], want: &[(&str, u16)]) {
    let mut named: Vec<(String, &str)> = vec![(org("src-ip-header"), "X-Client-IP")];
    named.extend(annotations.iter().map(|(k, v)| (org(k), *v)));
    let refs: Vec<(&str, &str)> = named.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    suite.ingress(h, &refs);
    for (ip, status) in want {
        suite.eventually(
            h,
            &format!("{annotations:?}: {ip} gets {status}"),
            || suite.get(h, &[("X-Client-IP", ip)]),
            |a| a.status == *status,
        );
    }
}

/// access-control `Test_Whitelist`, its inline cases.
#[test]
fn access_control_whitelist() {
    let h = harness();
    let suite = Suite::new("access-control-allow");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    // Inline
    access_case(
        &suite,
        &h,
        &[("allow-list", "192.168.2.0/24")],
        &[("192.168.2.3", 200), ("192.168.5.3", 403)],
    );
    // Inline deprecated annotation name
    access_case(
        &suite,
        &h,
        &[("whitelist", "192.168.4.0/24")],
        &[("192.168.4.3", 200), ("192.168.5.3", 403)],
    );
    // Inline: when new and deprecated annotation names are defined then only new name is
    // considered
    access_case(
        &suite,
        &h,
        &[
            ("whitelist", "192.168.4.0/24"),
            ("allow-list", "192.168.5.0/24"),
        ],
        &[("192.168.5.3", 200), ("192.168.4.3", 403)],
    );
}

/// A `portcullis run` of its own with the access-control suite's pattern files
/// (`--configmap-patternfiles`).
fn with_pattern_files() -> Harness {
    let mut h = Harness::new();
    h.write("ingressclass.yaml", &ingress_class());
    h.write(
        "patternfiles.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: patternfiles\n  \
         namespace: haproxy-controller\ndata:\n  ips: |\n    192.168.0.0/24\n    192.168.1.0/24\n  \
         ips2: |\n    192.169.0.0/24\n    192.169.1.0/24\n  loopback: |\n    127.0.0.2\n",
    );
    let mut flags = CLASS_FLAGS.to_vec();
    flags.extend([
        "--configmap-patternfiles",
        "haproxy-controller/patternfiles",
    ]);
    h.start(&flags);
    h
}

/// Applies `annotations` without `src-ip-header` and polls until each client, connecting from
/// its own loopback address, gets its status.
fn source_case(suite: &Suite, h: &Harness, annotations: &[(&str, &str)], want: &[(&str, u16)]) {
    let named: Vec<(String, &str)> = annotations.iter().map(|(k, v)| (org(k), *v)).collect();
    let refs: Vec<(&str, &str)> = named.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    suite.ingress(h, &refs);
    for (ip, status) in want {
        let from: std::net::IpAddr = ip.parse().unwrap();
        suite.eventually(
            h,
            &format!("{annotations:?}: a client at {ip} gets {status}"),
            || support::http_get_from(from, h.http_port, &suite.host, "/"),
            |a| a.status == *status,
        );
    }
}

/// access-control `Test_Whitelist`, its pattern-file cases.
#[test]
fn access_control_whitelist_pattern_files() {
    let h = with_pattern_files();
    let suite = Suite::new("access-control-allow-patterns");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    // Patternfile
    access_case(
        &suite,
        &h,
        &[("allow-list", "patterns/ips")],
        &[("192.168.0.3", 200), ("192.168.2.3", 403)],
    );
    // Patternfile deprecated annotation name
    access_case(
        &suite,
        &h,
        &[("whitelist", "patterns/ips2")],
        &[("192.169.0.3", 200), ("192.168.2.3", 403)],
    );
    // Patternfile: when new and deprecated annotation names are defined then only new name is
    // considered
    access_case(
        &suite,
        &h,
        &[
            ("whitelist", "patterns/ips2"),
            ("allow-list", "patterns/ips"),
        ],
        &[("192.168.0.3", 200), ("192.168.2.3", 403)],
    );
    // Not part of the suite: the clients' own addresses, without src-ip-header.
    source_case(
        &suite,
        &h,
        &[("allow-list", "patterns/loopback")],
        &[("127.0.0.2", 200), ("127.0.0.3", 403), ("127.0.0.1", 403)],
    );
}

/// access-control `Test_Blacklist`, its pattern-file cases.
#[test]
fn access_control_blacklist_pattern_files() {
    let h = with_pattern_files();
    let suite = Suite::new("access-control-deny-patterns");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    access_case(
        &suite,
        &h,
        &[("deny-list", "patterns/ips")],
        &[("192.168.0.3", 403), ("192.168.2.3", 200)],
    );
    access_case(
        &suite,
        &h,
        &[("blacklist", "patterns/ips2")],
        &[("192.169.0.3", 403), ("192.168.2.3", 200)],
    );
    access_case(
        &suite,
        &h,
        &[
            ("blacklist", "patterns/ips2"),
            ("deny-list", "patterns/ips"),
        ],
        &[("192.168.0.3", 403), ("192.169.2.3", 200)],
    );
    // Not part of the suite: the clients' own addresses, without src-ip-header.
    source_case(
        &suite,
        &h,
        &[("deny-list", "patterns/loopback")],
        &[("127.0.0.2", 403), ("127.0.0.3", 200), ("127.0.0.1", 200)],
    );
}

/// access-control `Test_Blacklist`, its inline cases.
#[test]
fn access_control_blacklist() {
    let h = harness();
    let suite = Suite::new("access-control-deny");
    let pod = Pod::start("http-echo", Reply::Echo);
    suite.app(&h, &pod);
    access_case(
        &suite,
        &h,
        &[("deny-list", "192.168.2.0/24")],
        &[("192.168.2.3", 403), ("192.168.5.3", 200)],
    );
    access_case(
        &suite,
        &h,
        &[("blacklist", "192.168.4.0/24")],
        &[("192.168.4.3", 403), ("192.168.5.3", 200)],
    );
    access_case(
        &suite,
        &h,
        &[
            ("blacklist", "192.168.4.0/24"),
            ("deny-list", "192.168.5.0/24"),
        ],
        &[("192.168.5.3", 403), ("192.168.4.3", 200)],
    );
}
