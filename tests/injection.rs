//! Hostile input never reaches an output file. Every annotation, ConfigMap key, host, path and
//! reference carrying a break-out attempt is refused with an error naming the object and the
//! field; everything else still renders and passes `haproxy -c`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::needless_pass_by_value, clippy::type_complexity)]

use clap::Parser;
use portcullis::cli::{Cli, Command};
use portcullis::objects::Object;
use portcullis::pipeline::Pipeline;
use portcullis::store::Store;
use portcullis::values;
use serde_json::json;

/// Break-out attempts; each carries the marker `PWN`, which must appear in no output file.
const PAYLOADS: &[&str] = &[
    "1\nPWN /x",
    "1s\n  lua-load /PWN",
    "1 #PWN",
    "'PWN'",
    "\"PWN\"",
    "%[env(PWN)]",
    "$PWN",
    "${PWN}",
    " PWN /x",
    "1\rPWN",
    "1\u{0}PWN",
];

/// Backend-scope annotations, set on a Service.
const SERVICE_ANNOTATIONS: &[&str] = &[
    "load-balance",
    "check",
    "check-http",
    "check-interval",
    "timeout-server",
    "timeout-connect",
    "timeout-queue",
    "timeout-tunnel",
    "timeout-check",
    "pod-maxconn",
    "server-ssl",
    "server-proto",
    "forwarded-for",
    "scale-server-slots",
    // Read by route hooks, from the Service a path routes to.
    "route-acl",
    "standalone-backend",
    "cookie-persistence",
    "cookie-persistence-no-dynamic",
    "send-proxy-protocol",
];

/// Route-scope annotations, set on an Ingress.
const INGRESS_ANNOTATIONS: &[&str] = &[
    "set-host",
    "request-set-header",
    "response-set-header",
    "path-rewrite",
    "allow-list",
    "deny-list",
    "ssl-redirect",
    "ssl-redirect-code",
    "request-redirect",
    "request-capture",
    "src-ip-header",
    "standalone-backend",
    "rate-limit-requests",
    "rate-limit-period",
    "rate-limit-size",
    "rate-limit-status-code",
    "rate-limit-whitelist",
    // Only these are read while their feature is off; the other auth-, cors- and hsts-
    // settings are read once it is on (their parsers are covered by hostile_inputs.rs).
    "auth-type",
    "auth-realm",
    "cors-enable",
    "hsts",
];

/// Global keys, set in the controller ConfigMap.
const CONFIGMAP_KEYS: &[&str] = &[
    "timeout-client",
    "timeout-http-request",
    "timeout-http-keep-alive",
    "timeout-server",
];

fn object(v: serde_json::Value) -> Object {
    Object::from_value(v).unwrap()
}

/// `objects` and the IngressClass their Ingresses name (without it they are not served).
fn with_class(mut objects: Vec<Object>) -> Vec<Object> {
    objects.push(object(json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "portcullis"}, "spec": {"controller": "portcullis.io/ingress"}})));
    objects
}

fn service(name: &str, annotations: serde_json::Value) -> Vec<Object> {
    vec![
        object(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "inj", "annotations": annotations},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        })),
        object(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "inj",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.0.0.1"]}]
        })),
    ]
}

fn path(p: &str, service: &str) -> serde_json::Value {
    json!({"path": p, "pathType": "Prefix",
           "backend": {"service": {"name": service, "port": {"number": 80}}}})
}

/// One Ingress per case: a good rule that must survive, plus the hostile parts.
fn ingress(
    name: &str,
    annotations: serde_json::Value,
    extra_rules: serde_json::Value,
    tls: serde_json::Value,
    service: &str,
) -> Object {
    let mut rules = vec![json!({"host": format!("{name}.example.com"),
                                 "http": {"paths": [path("/ok", service)]}})];
    rules.extend(extra_rules.as_array().cloned().unwrap_or_default());
    object(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": "inj", "annotations": annotations},
        "spec": {"ingressClassName": "portcullis", "rules": rules, "tls": tls}
    }))
}

/// (object, field) pairs that must each be named by a diagnostic.
type Expected = Vec<(String, String)>;

fn hostile_cluster() -> (Vec<Object>, Expected, Vec<String>) {
    let mut objects = service("web", json!({}));
    let mut expected = Vec::new();
    let mut good_hosts = Vec::new();
    let mut configmap = serde_json::Map::new();
    for (i, payload) in PAYLOADS.iter().enumerate() {
        // Backend scope: a Service per payload carrying every backend annotation.
        let svc = format!("svc{i}");
        let mut svc_annotations = serde_json::Map::new();
        for a in SERVICE_ANNOTATIONS {
            svc_annotations.insert(format!("haproxy.org/{a}"), json!(payload));
            expected.push((
                format!("Service inj/{svc}"),
                format!("annotation haproxy.org/{a}"),
            ));
        }
        objects.extend(service(&svc, serde_json::Value::Object(svc_annotations)));

        // Route scope, hosts, paths, TLS hosts and references on an Ingress per payload.
        let name = format!("ing{i}");
        let mut ing_annotations = serde_json::Map::new();
        for a in INGRESS_ANNOTATIONS {
            ing_annotations.insert(format!("ingress.kubernetes.io/{a}"), json!(payload));
            if !accepted_as_quoted_text(a, payload) {
                expected.push((
                    format!("Ingress inj/{name}"),
                    format!("annotation ingress.kubernetes.io/{a}"),
                ));
            }
        }
        let rules = json!([
            {"host": format!("h{i}{payload}.example.com"), "http": {"paths": [path("/", "web")]}},
            {"host": format!("p{i}.example.com"), "http": {"paths": [
                path(&format!("/{payload}"), "web"),
                {"path": "/svc", "pathType": "Prefix",
                 "backend": {"service": {"name": format!("web{payload}"), "port": {"number": 80}}}},
                {"path": "/port", "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"name": format!("http{payload}")}}}},
            ]}},
        ]);
        // With the Ingress' own host besides the hostile one: an entry left with no host the
        // Ingress routes is ignored whole, and the hostile Secret name would not be read.
        let tls = json!([{"hosts": [format!("t{i}{payload}"), format!("{name}.example.com")],
                          "secretName": format!("s{payload}")}]);
        for field in [
            "spec.rules[1].host",
            "spec.rules[2].http.paths[0].path",
            "spec.rules[2].http.paths[1].backend.service.name",
            "spec.rules[2].http.paths[2].backend.service.port",
            "spec.tls[0].hosts[0]",
            "spec.tls[0].secretName",
        ] {
            expected.push((format!("Ingress inj/{name}"), field.to_string()));
        }
        objects.push(ingress(
            &name,
            serde_json::Value::Object(ing_annotations),
            rules,
            tls,
            &svc,
        ));
        good_hosts.push(format!("{name}.example.com/ok"));

        configmap.insert(
            CONFIGMAP_KEYS[i % CONFIGMAP_KEYS.len()].to_string(),
            json!(payload),
        );
    }
    for key in configmap.keys() {
        expected.push(("ConfigMap inj/config".to_string(), format!("key {key}")));
    }
    objects.push(object(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "config", "namespace": "inj"},
        "data": configmap
    })));
    (objects, expected, good_hosts)
}

/// Whether `payload` is a valid value of `annotation` whose text is written only inside
/// quotes: several `path-rewrite` rules (one per line) and header values (which may hold `#`
/// and quotes). Such a value is not refused; [`only_quoted`] checks where it lands.
fn accepted_as_quoted_text(annotation: &str, payload: &str) -> bool {
    match annotation {
        "path-rewrite" => portcullis::values::parse_rewrites(payload).is_ok(),
        "request-set-header" => {
            values::parse_header_lines(payload, Some(values::Direction::Request)).is_ok()
        }
        "response-set-header" => {
            values::parse_header_lines(payload, Some(values::Direction::Response)).is_ok()
        }
        _ => false,
    }
}

/// Whether every `PWN` in `line` is inside a single-quoted word of a header or path rewrite
/// rule, where HAProxy reads it as text: the quotes are balanced and nothing is outside them
/// but the rule's own words.
fn only_quoted(line: &str) -> bool {
    let line = line.trim();
    let rule = [
        "http-request set-header ",
        "http-response set-header ",
        "http-request replace-path ",
    ]
    .iter()
    .any(|p| line.starts_with(p));
    if !rule || !line.matches('\'').count().is_multiple_of(2) {
        return false;
    }
    // The parts outside single quotes are the even ones.
    line.split('\'')
        .step_by(2)
        .all(|outside| !outside.contains("PWN"))
}

/// The pipeline as `portcullis render --configmap inj/config` builds it.
fn pipeline() -> Pipeline {
    let cli = Cli::try_parse_from([
        "portcullis",
        "render",
        "--manifests",
        "unused",
        "--configmap",
        "inj/config",
    ])
    .unwrap();
    let Command::Render(args) = cli.command else {
        unreachable!("parsed a render command")
    };
    Pipeline::load(None, None, args.pipeline.translate_config()).unwrap()
}

#[test]
fn hostile_values_are_refused_named_and_contained() {
    let (objects, expected, good_hosts) = hostile_cluster();
    let output = pipeline()
        .run(&Store::from_objects(with_class(objects)))
        .unwrap();

    // 1. Nothing hostile in any output file, but as quoted text where text is accepted.
    for (name, bytes) in output.rendered.files() {
        let text = String::from_utf8_lossy(&bytes.bytes()).into_owned();
        for line in text.lines().filter(|l| l.contains("PWN")) {
            assert!(
                name == "haproxy.cfg" && only_quoted(line),
                "{name} carries a payload: {line}\n{text}"
            );
        }
    }

    // 2. Every hostile field is reported against its object and field.
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    let mut missing = Vec::new();
    for (object, field) in &expected {
        let found = diagnostics
            .iter()
            .any(|d| d.contains(&format!("{object}: {field}")));
        if !found {
            missing.push(format!("{object}: {field}"));
        }
    }
    assert!(
        missing.is_empty(),
        "not reported:\n{}\n\ndiagnostics:\n{}",
        missing.join("\n"),
        diagnostics.join("\n")
    );

    // 3. The rest still renders: every good route is there, with its backend.
    let exact: Vec<&str> = output.model.maps.exact.iter().map(|e| &*e.key).collect();
    for host in &good_hosts {
        assert!(
            exact.contains(&host.as_str()),
            "{host} missing from {exact:?}"
        );
    }
    // One backend per payload Service; `web` is only referenced by refused paths.
    assert_eq!(output.model.backends.len(), PAYLOADS.len());

    // 4. And HAProxy accepts it.
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}

#[test]
fn a_script_cannot_smuggle_raw_text_past_the_settings_parser() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("evil.rhai"),
        r#"// Scope: backend, route
        // Risk: low
        fn backend(ctx) { #{ balance: "roundrobin\n  lua-load /PWN", maxconn: 10 } }
        fn route(ctx) { #{ request_headers: [["X-A", "b'\n  lua-load /PWN '"]], set_host: "a.com" } }
        "#,
    )
    .unwrap();
    let mut config = pipeline().config;
    config.config_map = None;
    let pipeline = portcullis::source::site::load_pipeline(Some(dir.path()), None, config).unwrap();
    let (objects, _, _) = hostile_cluster();
    let output = pipeline
        .run(&Store::from_objects(with_class(objects)))
        .unwrap();
    for (name, bytes) in output.rendered.files() {
        let text = String::from_utf8_lossy(&bytes.bytes()).into_owned();
        for line in text.lines().filter(|l| l.contains("PWN")) {
            assert!(name == "haproxy.cfg" && only_quoted(line), "{name}: {line}");
        }
    }
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    assert!(
        diagnostics
            .iter()
            .any(|d| d.contains("evil.rhai") && d.contains("setting balance")),
        "{diagnostics:?}"
    );
    assert!(
        diagnostics
            .iter()
            .any(|d| d.contains("evil.rhai") && d.contains("setting request_headers")),
        "{diagnostics:?}"
    );
    // The script's valid settings still apply.
    assert!(
        output
            .model
            .backends
            .iter()
            .all(|b| b.settings.maxconn == Some(10))
    );
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}

/// The pipeline as `portcullis render` builds it with both snippet flags on.
fn pipeline_with_snippets() -> Pipeline {
    let cli = Cli::try_parse_from([
        "portcullis",
        "render",
        "--manifests",
        "unused",
        "--configmap",
        "inj/config",
        "--allow-config-snippets",
        "--allow-config-snippets-in-annotations",
    ])
    .unwrap();
    let Command::Render(args) = cli.command else {
        unreachable!("parsed a render command")
    };
    Pipeline::load(None, None, args.pipeline.translate_config()).unwrap()
}

/// Regexes Rust's regex syntax accepts and HAProxy's PCRE2 refuses: each would make
/// `haproxy -c` fail, and with it every later change.
const PCRE2_REFUSED: &[&str] = &[
    "(?u)^/x",
    "^/a{65536}",
    r"\u0041",
    r"\U00000041",
    r"^/\N{U+0041}",
    r"^/(?<=a+)b",
    r"^/\L",
];

/// Regexes PCRE2 accepts (some of which Rust's regex syntax does not).
const PCRE2_ACCEPTED: &[&str] = &[
    r"^/api/(.*)$",
    r"^/(a|b)\d{2}$",
    r"^/\x41\x{42}",
    r"^/(?<=/)v1",
    r"^/\Q.*\E",
    r"(*LIMIT_MATCH=1000)^/x",
    r"^/(?<id>\d+)/\k<id>",
    r"^/a{65535}",
];

/// Every refused regex, in each of the three places a regex is written, is named with its
/// object and field, and what is left passes `haproxy -c`; every accepted one is rendered and
/// passes too.
#[test]
fn regexes_are_checked_with_pcre2_as_haproxy_compiles_them() {
    let mut objects = service("web", json!({}));
    let mut expected = Vec::new();
    let mut good_hosts = Vec::new();
    for (i, re) in PCRE2_REFUSED.iter().enumerate() {
        let svc = format!("acl{i}");
        objects.extend(service(
            &svc,
            json!({"haproxy.org/route-acl": format!("path -m reg {re}")}),
        ));
        expected.push((
            format!("Service inj/{svc}"),
            "annotation haproxy.org/route-acl".to_string(),
        ));
        let name = format!("re{i}");
        let origin = format!("^https://{}$", re.trim_start_matches('^'));
        objects.push(ingress(
            &name,
            json!({
                "haproxy.org/path-rewrite": format!("{re} /x"),
                "haproxy.org/cors-enable": "true",
                "haproxy.org/cors-allow-origin": origin,
            }),
            json!([{"host": format!("acl{i}.example.com"), "http": {"paths": [path("/", &svc)]}}]),
            json!([]),
            "web",
        ));
        for field in ["path-rewrite", "cors-allow-origin"] {
            expected.push((
                format!("Ingress inj/{name}"),
                format!("annotation haproxy.org/{field}"),
            ));
        }
        good_hosts.push(format!("{name}.example.com/ok"));
    }
    for (i, re) in PCRE2_ACCEPTED.iter().enumerate() {
        let svc = format!("okacl{i}");
        objects.extend(service(
            &svc,
            json!({"haproxy.org/route-acl": format!("path -i -m reg {re}")}),
        ));
        objects.push(ingress(
            &format!("ok{i}"),
            json!({"haproxy.org/path-rewrite": format!("{re} /x")}),
            json!([{"host": format!("okacl{i}.example.com"), "http": {"paths": [path("/", &svc)]}}]),
            json!([]),
            "web",
        ));
    }
    // Anchored origin regexes PCRE2 accepts, in CORS's ACL.
    let cors_accepted = [
        r"^https://(.+\.)?example\.com(:\d{1,5})?$",
        r"^https://\x61pp\.example\.com$",
        r"^https?://[a-z]{1,10}\.example\.(com|net)$",
    ];
    for (i, origin) in cors_accepted.iter().enumerate() {
        objects.push(ingress(
            &format!("cors{i}"),
            json!({"haproxy.org/cors-enable": "true", "haproxy.org/cors-allow-origin": origin}),
            json!([]),
            json!([]),
            "web",
        ));
    }
    let output = pipeline()
        .run(&Store::from_objects(with_class(objects)))
        .unwrap();
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    for (object, field) in &expected {
        let found = diagnostics
            .iter()
            .find(|d| d.contains(&format!("{object}: {field}")));
        let d =
            found.unwrap_or_else(|| panic!("{object}: {field} not reported:\n{diagnostics:#?}"));
        assert!(d.contains("PCRE2"), "{d}");
    }
    let config = haproxy_cfg(&output);
    for re in PCRE2_ACCEPTED {
        assert!(
            config.contains(&format!("replace-path '{re}'")),
            "{re} not in replace-path"
        );
        assert!(
            config.contains(&format!("-i -m reg '{re}'")),
            "{re} not in a route-acl"
        );
    }
    for origin in cors_accepted {
        assert!(
            config.contains(&format!("-m reg '{origin}'")),
            "{origin} not in a CORS rule"
        );
    }
    for re in PCRE2_REFUSED {
        assert!(!config.contains(re), "{re} was rendered");
    }
    let exact: Vec<&str> = output.model.maps.exact.iter().map(|e| &*e.key).collect();
    for host in &good_hosts {
        assert!(exact.contains(&host.as_str()), "{host} missing");
    }
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}

/// The rendered haproxy.cfg.
fn haproxy_cfg(output: &portcullis::pipeline::Output) -> String {
    String::from_utf8_lossy(&output.rendered.files()["haproxy.cfg"].bytes()).into_owned()
}

/// Snippet lines that would read files or the environment, rewrite other tenants' routes or
/// run preprocessor directives, each with what must not reach the output.
const SNIPPET_VECTORS: &[(&str, &str)] = &[
    (
        "http-request return status 200 content-type text/plain lf-file /etc/passwd",
        "/etc/passwd",
    ),
    (
        "http-request return status 200 file certs/crt-list.txt",
        "crt-list.txt",
    ),
    (
        "http-request return status 200 file certs/victim.pem",
        "victim.pem",
    ),
    ("http-response set-header X-Home \"'$HOME'\"", "$HOME"),
    (
        "http-request set-map(maps/exact.map) %[req.hdr(host)] evil",
        "set-map",
    ),
    (".if defined(HOME)", ".if"),
    (".alert PWN", ".alert"),
    (".diag PWN", ".diag"),
    ("filter spoe engine x config /etc/passwd", "spoe"),
    (
        "http-request set-var(txn.x) path,map_beg(maps/prefix.map)",
        "txn.x",
    ),
    ("http-request set-header X %[env(HOME)]", "env(HOME)"),
    ("http-request set-dst-port int(6060)", "set-dst-port"),
    (
        "http-request use-service prometheus-exporter",
        "use-service",
    ),
];

/// With both snippet flags on, every vector is refused and named; allowed lines are printed
/// in their section; HAProxy accepts the result.
#[test]
fn snippets_outside_the_allowlist_are_refused_and_named() {
    let mut objects = service("web", json!({}));
    let mut expected = Vec::new();
    for (i, (line, _)) in SNIPPET_VECTORS.iter().enumerate() {
        let svc = format!("snip{i}");
        objects.extend(service(
            &svc,
            json!({"haproxy.org/backend-config-snippet": line}),
        ));
        expected.push((
            format!("Service inj/{svc}"),
            "annotation haproxy.org/backend-config-snippet".to_string(),
        ));
        let name = format!("sn{i}");
        objects.push(ingress(
            &name,
            json!({"haproxy.org/backend-config-snippet": line}),
            json!([]),
            json!([]),
            &svc,
        ));
        expected.push((
            format!("Ingress inj/{name}"),
            "annotation haproxy.org/backend-config-snippet".to_string(),
        ));
    }
    objects.extend(service(
        "good",
        json!({"haproxy.org/backend-config-snippet": "http-response set-header X-Snippet 'ok $5'"}),
    ));
    objects.push(ingress("good", json!({}), json!([]), json!([]), "good"));
    // The ConfigMap: a global snippet with one bad line is refused whole.
    objects.push(object(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "config", "namespace": "inj"},
        "data": {
            "global-config-snippet": "tune.bufsize 32768\n.if defined(HOME)\n",
            "frontend-config-snippet": "http-response set-header X-Frontend yes\n",
        }
    })));
    expected.push((
        "ConfigMap inj/config".to_string(),
        "key global-config-snippet".to_string(),
    ));
    let output = pipeline_with_snippets()
        .run(&Store::from_objects(with_class(objects)))
        .unwrap();
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    for (object, field) in &expected {
        assert!(
            diagnostics
                .iter()
                .any(|d| d.contains(&format!("{object}: {field}"))),
            "{object}: {field} not reported:\n{diagnostics:#?}"
        );
    }
    for (name, bytes) in output.rendered.files() {
        let text = String::from_utf8_lossy(&bytes.bytes()).into_owned();
        for (line, marker) in SNIPPET_VECTORS {
            assert!(!text.contains(marker), "{name} carries {line:?}");
        }
    }
    let config = haproxy_cfg(&output);
    assert!(config.contains("http-response set-header X-Snippet 'ok $5'"));
    assert!(config.contains("http-response set-header X-Frontend yes"));
    assert!(
        !config.contains("tune.bufsize 32768"),
        "a refused snippet is refused whole"
    );
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}

/// A 10 MB value gets one short diagnostic; capture slots over the global caps are refused on
/// the youngest Ingress that asks, and the older ones keep theirs.
#[test]
fn values_and_totals_are_bounded() {
    let huge = "x".repeat(10 * 1024 * 1024);
    let mut objects = service("web", json!({}));
    objects.push(ingress(
        "huge",
        json!({
            "haproxy.org/path-rewrite": huge,
            "haproxy.org/request-set-header": huge,
            "haproxy.org/allow-list": huge,
        }),
        json!([]),
        json!([]),
        "web",
    ));
    // 3 Ingresses × 1 capture of 8192 bytes: the third is over 16 KiB.
    for (i, age) in [
        "2020-01-01T00:00:00Z",
        "2021-01-01T00:00:00Z",
        "2022-01-01T00:00:00Z",
    ]
    .iter()
    .enumerate()
    {
        let name = format!("cap{i}");
        objects.push(object(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": "inj", "creationTimestamp": age,
                "annotations": {
                    "haproxy.org/request-capture": format!("hdr(X-Cap-{i})"),
                    "haproxy.org/request-capture-len": "8192",
                }},
            "spec": {"ingressClassName": "portcullis", "rules": [
                {"host": format!("{name}.example.com"), "http": {"paths": [path("/", "web")]}}
            ]}
        })));
    }
    // One host over the cap of hosts per Ingress (`ingress` adds a first rule of its own).
    let rules: Vec<serde_json::Value> = (0..values::MAX_HOSTS_PER_INGRESS)
        .map(
            |i| json!({"host": format!("m{i}.example.com"), "http": {"paths": [path("/", "web")]}}),
        )
        .collect();
    objects.push(ingress("many", json!({}), json!(rules), json!([]), "web"));
    let output = pipeline()
        .run(&Store::from_objects(with_class(objects)))
        .unwrap();
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    let last = values::MAX_HOSTS_PER_INGRESS;
    let on_many: Vec<&String> = diagnostics
        .iter()
        .filter(|d| d.contains("Ingress inj/many"))
        .collect();
    assert_eq!(on_many.len(), 1, "{on_many:#?}");
    assert!(
        on_many[0].contains(&format!("spec.rules[{last}].host")),
        "{on_many:#?}"
    );
    let exact: Vec<&str> = output.model.maps.exact.iter().map(|e| &*e.key).collect();
    let prefix: Vec<&str> = output.model.maps.prefix.iter().map(|e| &*e.key).collect();
    let routed = |i: usize| {
        let host = format!("m{i}.example.com");
        exact.iter().chain(&prefix).any(|k| k.starts_with(&host))
    };
    assert!(routed(0) && routed(values::MAX_HOSTS_PER_INGRESS - 2));
    assert!(!routed(values::MAX_HOSTS_PER_INGRESS - 1));
    let on_huge: Vec<&String> = diagnostics
        .iter()
        .filter(|d| d.contains("Ingress inj/huge"))
        .collect();
    assert_eq!(on_huge.len(), 3, "{on_huge:#?}");
    // An access setting too large to read closes, as any bad value of it does.
    assert!(
        on_huge
            .iter()
            .any(|d| d.contains("allow-list") && d.contains("403")),
        "{on_huge:#?}"
    );
    for d in &on_huge {
        assert!(d.len() < 300, "{} bytes: {}", d.len(), &d[..300]);
        assert!(d.contains("10485760 bytes"), "{d}");
    }
    let captured: Vec<&str> = output
        .model
        .frontend_rules
        .captures
        .iter()
        .map(|c| c.sample.as_str())
        .collect();
    assert_eq!(captured, ["hdr(X-Cap-0)", "hdr(X-Cap-1)"]);
    assert!(
        diagnostics
            .iter()
            .any(|d| d.contains("Ingress inj/cap2: annotation request-capture")),
        "{diagnostics:#?}"
    );
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}

/// Portcullis and HAProxy agree on every probe regex, in a rewrite and in an ACL with and
/// without `-i`: what one refuses the other refuses. Among the probes are patterns only
/// PCRE2 10.43 and later accept, so a build against another PCRE2 than HAProxy's shows here.
#[test]
fn regexes_are_judged_as_haproxy_judges_them() {
    let probes = PCRE2_REFUSED.iter().chain(PCRE2_ACCEPTED).chain(&[
        r"^/(?<=ab?)c",
        r"^/(a)\1$",
        r"^/(a)(?-n)(b)\1$",
        r"^/(a)(?-n)(b)\2$",
        r"(*UTF)^/(a)\1",
        r"^/[[:word:]-z]",
        r"^/\c",
        r"^/(?P=missing)",
        r"^/\8",
        r"^/(?i)x",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("haproxy.cfg");
    let mut disagreements = Vec::new();
    for re in probes {
        for (place, line) in [
            (
                values::RegexPlace::Replace,
                format!("http-request replace-path '{re}' '/x'"),
            ),
            (
                values::RegexPlace::Acl { ignore_case: false },
                format!("http-request deny if {{ path -m reg '{re}' }}"),
            ),
            (
                values::RegexPlace::Acl { ignore_case: true },
                format!("http-request deny if {{ path -i -m reg '{re}' }}"),
            ),
        ] {
            std::fs::write(
                &cfg,
                format!(
                    "defaults\n  mode http\n  timeout client 1s\n  timeout server 1s\n  timeout connect 1s\nfrontend f\n  bind 127.0.0.1:1\n  {line}\n"
                ),
            )
            .unwrap();
            let haproxy = std::process::Command::new("haproxy")
                .arg("-c")
                .arg("-q")
                .arg("-f")
                .arg(&cfg)
                .output()
                .expect("haproxy runs")
                .status
                .success();
            let ours = values::parse_regex_at(re, place).is_ok();
            if haproxy != ours {
                disagreements.push(format!(
                    "{re:?} at {place:?}: HAProxy {haproxy}, Portcullis {ours}"
                ));
            }
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

/// A line per directive, action and option of the snippet allowlists, by section. Each must
/// pass the check for its section, and all of them together, printed where the snippets go,
/// must pass `haproxy -c`: the allowlists name nothing HAProxy 2.6 does not know there.
const GLOBAL_SNIPPET_LINES: &[&str] = &[
    "maxconn 100",
    "maxconnrate 100",
    "maxsessrate 100",
    "maxsslconn 100",
    "maxsslrate 100",
    "maxcomprate 100",
    "maxcompcpuusage 50",
    "maxpipes 100",
    "maxzlibmem 10",
    "spread-checks 5",
    "max-spread-checks 1s",
    "hard-stop-after 30s",
    "grace 1s",
    "ssl-default-bind-ciphers ECDHE-RSA-AES128-GCM-SHA256",
    "ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256",
    "ssl-default-bind-options no-sslv3",
    "ssl-default-bind-curves X25519",
    "ssl-default-server-ciphers ECDHE-RSA-AES128-GCM-SHA256",
    "ssl-default-server-ciphersuites TLS_AES_128_GCM_SHA256",
    "ssl-default-server-options no-sslv3",
    "log-send-hostname",
    "log-tag x",
    "h2-workaround-bogus-websocket-clients",
    "tune.bufsize 32768",
    "tune.maxrewrite 1024",
    "tune.http.maxhdr 100",
    "tune.http.cookielen 63",
    "tune.http.logurilen 1024",
    "tune.h2.header-table-size 4096",
    "tune.h2.initial-window-size 65535",
    "tune.h2.max-concurrent-streams 100",
    "tune.h2.max-frame-size 16384",
    "tune.maxaccept 64",
    "tune.maxpollevents 200",
    "tune.recv_enough 10000",
    "tune.idletimer 1000",
    "tune.ssl.default-dh-param 2048",
    "tune.ssl.cachesize 20000",
    "tune.ssl.lifetime 300",
    "tune.ssl.maxrecord 1400",
    "tune.comp.maxlevel 1",
    "tune.pattern.cache-size 10000",
    "tune.rcvbuf.client 65536",
    "tune.rcvbuf.server 65536",
    "tune.sndbuf.client 65536",
    "tune.sndbuf.server 65536",
    "tune.pipesize 65536",
    "tune.vars.global-max-size 1000",
    "tune.vars.proc-max-size 1000",
    "tune.vars.reqres-max-size 1000",
    "tune.vars.sess-max-size 1000",
    "tune.vars.txn-max-size 1000",
    "tune.buffers.limit 100",
    "tune.buffers.reserve 4",
];
const FRONTEND_SNIPPET_LINES: &[&str] = &[
    "http-request deny if { path_beg /admin }",
    "http-request set-var(txn.mine) str(x)",
    "http-request set-header X-Host %[req.hdr(host),lower]",
    "http-response set-header X-A b",
    r#"http-after-response set-header X-A "b c""#,
    "tcp-request connection reject if { src 10.0.0.1 }",
    "tcp-request session accept",
    "tcp-request content accept",
    "tcp-request inspect-delay 5s",
    "acl admin path_beg /admin",
    "option httplog",
    "no option http-server-close",
    "timeout client 5s",
    "capture request header Host len 32",
    "declare capture request len 32",
    "compression algo gzip",
    "redirect scheme https if !{ ssl_fc }",
    "errorloc 503 http://example.com/",
    "errorloc302 503 http://example.com/",
    "errorloc303 503 http://example.com/",
    "http-error status 503 content-type text/plain string down",
    r#"unique-id-format %{+X}o\ %ci:%cp"#,
    "unique-id-header X-Unique-ID",
    "log-format %ci",
    "maxconn 100",
    "rate-limit sessions 100",
    "filter compression",
];
const BACKEND_SNIPPET_LINES: &[&str] = &[
    "http-response set-header X-Frame-Options DENY",
    "http-request redirect location /login code 302",
    "http-response set-header X-Price '$5'",
    "http-request return status 200 content-type text/plain string ok",
    "http-request set-var(txn.port) src_port,add(1)",
    "http-check expect status 200",
    "http-check send meth GET uri /health",
    "http-check send-state",
    "http-check disable-on-404",
    "filter compression",
    "tcp-request inspect-delay 5s",
    "tcp-request content accept if HTTP",
    "tcp-response content accept",
    "tcp-response inspect-delay 5s",
    "http-reuse safe",
    "http-send-name-header X-Server",
    "retries 3",
    "retry-on conn-failure",
    "balance roundrobin",
    "hash-type consistent",
    "fullconn 100",
    "cookie SRV insert indirect nocache",
    "ignore-persist if { path_beg /static }",
    "force-persist if { path_beg /admin }",
    "option redispatch",
    "option httpchk GET /health",
    "option forwardfor",
    "timeout server 5s",
    "http-request set-path /x",
    r#"http-request replace-path ^/a(.*) /b\1"#,
    "http-request set-timeout server 5s",
    "http-request set-priority-class int(1)",
    "http-request early-hint Link </style.css>",
    "http-request wait-for-body time 1s",
    "http-request strict-mode on",
    "http-request disable-l7-retry",
    "http-request tarpit",
    "http-request auth realm x",
    "http-request set-log-level silent",
    "http-request set-nice 10",
    "http-request set-mark 1",
    "http-request set-tos 0",
    "http-request silent-drop",
    "http-request reject",
    "http-request capture req.hdr(host) id 0",
    "http-response set-status 404",
    "http-response wait-for-body time 1s",
    "http-after-response set-status 404",
    "http-after-response strict-mode on",
    "http-request wait-for-handshake",
];

#[test]
fn what_the_snippet_allowlists_name_haproxy_accepts() {
    use portcullis::snippets::{Section, check_line_in};
    for (lines, section) in [
        (GLOBAL_SNIPPET_LINES, Section::Global),
        (FRONTEND_SNIPPET_LINES, Section::Frontend),
        (BACKEND_SNIPPET_LINES, Section::Backend),
    ] {
        for line in lines {
            assert_eq!(check_line_in(line, section), Ok(()), "{line:?}");
        }
    }
    let mut objects = service("web", json!({}));
    objects.push(ingress("site", json!({}), json!([]), json!([]), "web"));
    objects.push(object(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "config", "namespace": "inj"},
        "data": {
            "global-config-snippet": GLOBAL_SNIPPET_LINES.join("\n"),
            "frontend-config-snippet": FRONTEND_SNIPPET_LINES.join("\n"),
            "backend-config-snippet": BACKEND_SNIPPET_LINES.join("\n"),
        }
    })));
    let output = pipeline_with_snippets()
        .run(&Store::from_objects(with_class(objects)))
        .unwrap();
    let config = haproxy_cfg(&output);
    for line in GLOBAL_SNIPPET_LINES
        .iter()
        .chain(FRONTEND_SNIPPET_LINES)
        .chain(BACKEND_SNIPPET_LINES)
    {
        assert!(config.contains(line), "{line:?} not printed:\n{config}");
    }
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}

/// Site settings are data, whatever a script puts in them: a value that could leave its
/// quotes (a line break, a control character, `'`) is refused with the script, object and key
/// named; everything else reaches the site template parts at every hook point only as a
/// token or as quoted text, and HAProxy accepts the result. A part that prints text bare is
/// refused by the output guard with its file and line.
#[test]
fn site_settings_reach_site_parts_only_as_tokens_or_quoted_text() {
    let dir = tempfile::tempdir().unwrap();
    let scripts = dir.path().join("scripts");
    let parts = dir.path().join("templates/parts/site");
    for point in ["global", "defaults", "frontend", "backend", "route-policy"] {
        std::fs::create_dir_all(parts.join(point)).unwrap();
    }
    std::fs::create_dir_all(&scripts).unwrap();
    // Rust's escapes are Rhai's, but for NUL.
    let payloads: Vec<String> = PAYLOADS
        .iter()
        .map(|p| format!("{p:?}").replace("\\0", "\\x00"))
        .collect();
    let site = format!(
        "#{{ {} , nested: #{{ list: [{}] }} }}",
        payloads
            .iter()
            .enumerate()
            .map(|(i, p)| format!("v{i}: {p}"))
            .collect::<Vec<_>>()
            .join(", "),
        payloads.join(", ")
    );
    std::fs::write(
        scripts.join("evil-site.rhai"),
        format!(
            "// Scope: global, backend, route\n// Risk: low\n\
             fn global(ctx) {{ #{{ site: {site} }} }}\n\
             fn backend(ctx) {{ #{{ site: {site} }} }}\n\
             fn route(ctx) {{ #{{ site: {site} }} }}\n"
        ),
    )
    .unwrap();
    // Every string value, quoted, where HAProxy takes text as it is.
    let each = |line: &str| {
        format!(
            "{{% for k, v in site|items %}}{{% if v is string %}}\n{line}\n{{% endif %}}{{% endfor %}}\n\
             {{% if site.nested is defined %}}{{% for v in site.nested.list %}}\n{line}\n{{% endfor %}}{{% endif %}}\n"
        )
    };
    std::fs::write(
        parts.join("global/env.j2"),
        each("  presetenv SITE_VALUE {{ v|q }}"),
    )
    .unwrap();
    std::fs::write(parts.join("defaults/note.j2"), each("  # {{ v|q }}")).unwrap();
    let unused_return =
        "  http-request return status 503 content-type text/plain string {{ v|q }} if FALSE";
    std::fs::write(parts.join("frontend/note.j2"), each(unused_return)).unwrap();
    std::fs::write(parts.join("backend/note.j2"), each(unused_return)).unwrap();
    std::fs::write(
        parts.join("route-policy/page.j2"),
        each("  http-request return status 503 content-type text/plain string {{ v|q }} if {{ applies }} FALSE"),
    )
    .unwrap();
    let mut config = pipeline().config;
    config.config_map = None;
    let load = || {
        portcullis::source::site::load_pipeline(
            Some(&scripts),
            Some(&dir.path().join("templates")),
            config.clone(),
        )
        .unwrap()
    };
    let (objects, _, _) = hostile_cluster();
    let store = Store::from_objects(with_class(objects));
    let output = load().run(&store).unwrap();
    let cfg = output.rendered.haproxy_cfg();
    let mut places = std::collections::BTreeSet::new();
    for line in cfg.lines().filter(|l| l.contains("PWN")) {
        let outside_quotes = line.split('\'').step_by(2).any(|o| o.contains("PWN"));
        assert!(
            line.matches('\'').count() % 2 == 0 && !outside_quotes,
            "{line}\n{cfg}"
        );
        places.insert(line.trim().split(' ').next().unwrap().to_string());
    }
    // The accepted payloads reached every kind of part (the cluster's own quoted header
    // values and rewrites are there too).
    for place in ["#", "http-request", "presetenv"] {
        assert!(places.contains(place), "{place}: {cfg}");
    }
    assert!(
        cfg.contains("if { var(txn.policy) -m str p"),
        "route policy parts: {cfg}"
    );
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    for (i, payload) in PAYLOADS.iter().enumerate() {
        let breaks_out = payload.contains(['\n', '\r', '\0', '\'']);
        let reported = |hook: &str| {
            diagnostics.iter().any(|d| {
                d.contains("evil-site.rhai")
                    && d.contains(&format!("{hook}() for "))
                    && d.contains(&format!("setting site.v{i}:"))
            })
        };
        for hook in ["global", "backend", "route"] {
            assert_eq!(
                reported(hook),
                breaks_out,
                "{payload:?} in {hook}: {diagnostics:#?}"
            );
        }
    }
    // A list holding one refused value is refused whole.
    assert!(
        diagnostics
            .iter()
            .any(|d| d.contains("setting site.nested:")),
        "{diagnostics:#?}"
    );
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();

    // Printed bare, text is refused by the output guard, naming the part.
    let bare = parts.join("backend/bare.j2");
    std::fs::write(
        &bare,
        "{% if site.v2 is defined %}\n  # {{ site.v2 }}\n{% endif %}\n",
    )
    .unwrap();
    let refused = load().run(&store).unwrap_err().to_string();
    assert!(
        refused.contains(&format!("{}: line 2: refusing to print", bare.display())),
        "{refused}"
    );
}
