//! Pattern files of `--configmap-patternfiles` in access lists, against a real HAProxy:
//! `allow-list: patterns/<key>` and `deny-list: patterns/<key>` on HTTP routes and on an
//! `ssl-passthrough` host, a change of the ConfigMap applied without restarting the
//! controller, and the files that cannot be used (a bad line, a missing key) closing their
//! routes to everyone. Clients are told apart by their loopback source address (127.0.0.x).
//! Against a Kubernetes API server too: the ConfigMap is watched by name, outside the
//! namespaces served.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/apiserver.rs"]
mod apiserver;
mod support;

use std::net::{IpAddr, Ipv4Addr};

use support::*;

const NS: &str = "shop";
const FLAGS: &[&str] = &["--configmap-patternfiles", "ops/patternfiles"];
const DEFAULT: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const OFFICE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const BLOCKED: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
const LATE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4));

/// The pattern-file ConfigMap `ops/patternfiles` with these keys and contents.
fn pattern_files(files: &[(&str, &str)]) -> String {
    let mut out = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: patternfiles\n  namespace: ops\ndata:\n",
    );
    for (key, content) in files {
        out.push_str(&format!("  {key}: {content:?}\n"));
    }
    out
}

/// An Ingress `name` routing `host` to the Service `app`, with these annotations.
fn site(name: &str, host: &str, annotations: &[(&str, &str)]) -> String {
    annotated(
        &ingress(
            NS,
            name,
            &[route(Some(host), "/", "Prefix", "app")],
            None,
            &[],
        ),
        annotations,
    )
}

/// The status `from` gets for `host`, 0 when the request failed.
fn status(h: &Harness, from: IpAddr, host: &str) -> u16 {
    http_get_from(from, h.http_port, host, "/").map_or(0, |a| a.status)
}

fn wait_status(h: &Harness, from: IpAddr, host: &str, want: u16) {
    wait_until(
        APPLY_TIMEOUT,
        &format!("{from} gets {want} on {host}"),
        || status(h, from, host) == want,
    );
}

/// Thousands of blocks that are none of the test's clients, then `last`: more than one
/// HAProxy line could hold inline.
fn many_blocks(last: &str) -> String {
    let mut out = String::from("# generated\n");
    for i in 0..4000u32 {
        out.push_str(&format!("10.{}.{}.0/24\n", i / 256, i % 256));
    }
    out.push_str(last);
    out.push('\n');
    out
}

#[test]
fn pattern_files_guard_routes_and_follow_their_configmap() {
    let mut h = Harness::new();
    let work = h.work();
    let app = h.backend(NS, "app");
    h.write("app.yaml", &app);
    h.write(
        "patternfiles.yaml",
        &pattern_files(&[
            ("office", &many_blocks("127.0.0.2")),
            ("blocked", "# known abusers\n127.0.0.3/32\n"),
        ]),
    );
    h.write(
        "allow.yaml",
        &site(
            "allow",
            "allow.example.com",
            &[("haproxy.org/allow-list", "patterns/office")],
        ),
    );
    h.write(
        "deny.yaml",
        &site(
            "deny",
            "deny.example.com",
            &[("haproxy.org/blacklist", "patterns/blocked")],
        ),
    );
    // An ssl-passthrough host behind the same allow-list file: the pod is an openssl
    // s_server with its own certificate.
    let (pod_crt, _) = self_signed(&work, "vault.example.com", "vault-pod");
    let pod_port = free_port();
    let _pod = TlsPod::start(
        pod_port,
        &work.join("vault-pod.crt"),
        &work.join("vault-pod.key"),
    );
    let pod_fp = fingerprint(&work, &pod_crt);
    h.write(
        "vault.yaml",
        &format!(
            "{}---\n{}---\n{}",
            service(NS, "vault", &[("haproxy.org/ssl-passthrough", "true")]),
            endpoint_slices(NS, "vault", &[("0", pod_port, true)]),
            annotated(
                &ingress(
                    NS,
                    "vault",
                    &[route(Some("vault.example.com"), "/", "Prefix", "vault")],
                    None,
                    &[],
                ),
                &[("haproxy.org/allow-list", "patterns/office")],
            ),
        ),
    );
    h.start(FLAGS);
    let pid = h.pid();
    let reaches_vault = |from: IpAddr| {
        served_certificate_der_from(Some(from), h.https_port, "vault.example.com")
            .is_some_and(|der| fingerprint(&work, &pem_encode("CERTIFICATE", &der)) == pod_fp)
    };

    wait_status(&h, OFFICE, "allow.example.com", 200);
    assert_eq!(status(&h, DEFAULT, "allow.example.com"), 403);
    assert_eq!(status(&h, BLOCKED, "allow.example.com"), 403);
    assert_eq!(status(&h, LATE, "allow.example.com"), 403);
    assert_eq!(status(&h, BLOCKED, "deny.example.com"), 403);
    assert_eq!(status(&h, OFFICE, "deny.example.com"), 200);
    assert_eq!(status(&h, DEFAULT, "deny.example.com"), 200);
    assert!(reaches_vault(OFFICE), "{}", h.log());
    assert!(!reaches_vault(DEFAULT));
    assert!(!reaches_vault(BLOCKED));
    // The addresses stay in the file: haproxy.cfg names it.
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(cfg.contains("!{ src -f patterns/office }"), "{cfg}");
    assert!(cfg.contains("{ src -f patterns/blocked }"), "{cfg}");
    assert!(
        cfg.contains("{ req_ssl_sni,lower -m str vault.example.com } !{ src -f patterns/office }"),
        "{cfg}"
    );
    assert!(!cfg.contains("10.0.1.0/24"), "the blocks are not inlined");
    let written = std::fs::read_to_string(h.config_dir().join("patterns/office")).unwrap();
    assert_eq!(written, many_blocks("127.0.0.2"));

    // The ConfigMap changes: the same controller applies the new lists to the HTTP routes
    // and the passthrough host.
    let (reloads_before, _) = h.reloads();
    h.write(
        "patternfiles.yaml",
        &pattern_files(&[
            ("office", &many_blocks("127.0.0.4")),
            ("blocked", "127.0.0.2\n"),
        ]),
    );
    wait_status(&h, LATE, "allow.example.com", 200);
    wait_status(&h, OFFICE, "allow.example.com", 403);
    assert_eq!(status(&h, OFFICE, "deny.example.com"), 403);
    assert_eq!(status(&h, BLOCKED, "deny.example.com"), 200);
    assert!(reaches_vault(LATE), "{}", h.log());
    assert!(!reaches_vault(OFFICE));
    assert_eq!(h.pid(), pid, "the controller was not restarted");
    let (reloads_after, failed) = h.reloads();
    assert!(reloads_after > reloads_before, "a reload applied the files");
    assert_eq!(failed, 0, "no reload failed");
    wait_until(APPLY_TIMEOUT, "the reload names its reason", || {
        h.log()
            .contains("reloaded: pattern file patterns/blocked (--configmap-patternfiles) changed")
    });
}

#[test]
fn unusable_pattern_files_close_their_routes() {
    let mut h = Harness::new();
    let app = h.backend(NS, "app");
    h.write("app.yaml", &app);
    h.write(
        "patternfiles.yaml",
        &pattern_files(&[("office", "127.0.0.2\n127.0.0.300\n")]),
    );
    h.write(
        "badline.yaml",
        &site(
            "badline",
            "badline.example.com",
            &[("haproxy.org/allow-list", "patterns/office")],
        ),
    );
    h.write(
        "nokey.yaml",
        &site(
            "nokey",
            "nokey.example.com",
            &[("haproxy.org/deny-list", "patterns/abusers")],
        ),
    );
    h.write("open.yaml", &site("open", "open.example.com", &[]));
    h.start(FLAGS);

    // Every client is refused on both, the address the file allows too; the other route is
    // untouched.
    wait_status(&h, DEFAULT, "open.example.com", 200);
    for from in [DEFAULT, OFFICE, BLOCKED] {
        assert_eq!(status(&h, from, "badline.example.com"), 403, "{from}");
        assert_eq!(status(&h, from, "nokey.example.com"), 403, "{from}");
    }
    let diagnostic = |needles: &[&str]| {
        h.log()
            .lines()
            .any(|l| needles.iter().all(|n| l.contains(n)))
    };
    wait_until(APPLY_TIMEOUT, "the bad line is reported", || {
        diagnostic(&[
            "Ingress shop/badline",
            "allow-list",
            "patterns/office line 2",
            "127.0.0.300",
            "ConfigMap ops/patternfiles",
        ])
    });
    wait_until(APPLY_TIMEOUT, "the missing key is reported", || {
        diagnostic(&[
            "Ingress shop/nokey",
            "deny-list",
            "patterns/abusers",
            "has no key \"abusers\"",
        ])
    });

    // Fixed, the file opens its route to the address it names, and only to it; the key added,
    // the deny-list refuses only its addresses.
    h.write(
        "patternfiles.yaml",
        &pattern_files(&[("office", "127.0.0.2\n"), ("abusers", "127.0.0.3\n")]),
    );
    wait_status(&h, OFFICE, "badline.example.com", 200);
    assert_eq!(status(&h, DEFAULT, "badline.example.com"), 403);
    wait_status(&h, DEFAULT, "nokey.example.com", 200);
    assert_eq!(status(&h, BLOCKED, "nokey.example.com"), 403);

    // The ConfigMap deleted: both close again rather than open.
    h.remove("patternfiles.yaml");
    wait_status(&h, OFFICE, "badline.example.com", 403);
    wait_status(&h, BLOCKED, "nokey.example.com", 403);
    assert_eq!(status(&h, DEFAULT, "nokey.example.com"), 403);
    assert_eq!(status(&h, DEFAULT, "open.example.com"), 200);
    assert_eq!(h.reloads().1, 0, "no reload failed");
}

/// From a cluster: the ConfigMap lives in a namespace `--namespace` does not serve, and is
/// watched by name; its changes reach HAProxy through the watch.
#[test]
fn the_configmap_is_watched_by_name_in_a_cluster() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(
        apiserver::ApiServer::builder()
            .list_items_without_type_meta()
            .start(),
    );
    server.apply_yaml(INGRESS_CLASS);
    let mut h = Harness::new();
    server.apply_yaml(&h.backend(NS, "app"));
    server.apply_yaml(&pattern_files(&[("office", "127.0.0.2\n")]));
    server.apply_yaml(&site(
        "allow",
        "allow.example.com",
        &[("haproxy.org/allow-list", "patterns/office")],
    ));
    let kubeconfig = h.work().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig, None);
    h.use_kubeconfig(&kubeconfig);
    let mut flags = FLAGS.to_vec();
    flags.extend(["--namespace", NS, "--allow-local-endpoints"]);
    h.start(&flags);

    wait_status(&h, OFFICE, "allow.example.com", 200);
    assert_eq!(status(&h, DEFAULT, "allow.example.com"), 403);
    server.apply_yaml(&pattern_files(&[("office", "127.0.0.4\n")]));
    wait_status(&h, LATE, "allow.example.com", 200);
    assert_eq!(status(&h, OFFICE, "allow.example.com"), 403);
    assert_eq!(h.reloads().1, 0, "no reload failed");
}
