//! The incumbent's value forms and annotation names against hostile input: quoted header
//! values, sample fetches, several `path-rewrite` rules, `load-balance` options, `check-http`
//! with a version and headers, bare and `haproxy.com/` names. Every break-out attempt is
//! refused with an error naming the object and the annotation, nothing of it reaches an
//! output file, the accepted forms render exactly as HAProxy must read them, and HAProxy
//! accepts the result. Unknown annotations are reported once per object, with a suggestion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::needless_pass_by_value)]

use portcullis::objects::Object;
use portcullis::pipeline::{Output, Pipeline};
use portcullis::store::Store;
use portcullis::translate::TranslateConfig;
use portcullis::values;
use serde_json::json;

fn object(v: serde_json::Value) -> Object {
    Object::from_value(v).unwrap()
}

/// A Service `name` (one endpoint) with these annotations, and an Ingress `name` routing
/// `<name>.example.com` to it with those.
fn site(name: &str, service: serde_json::Value, ingress: serde_json::Value) -> Vec<Object> {
    vec![
        object(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "forms", "annotations": service},
            "spec": {"ports": [{"name": "http", "port": 80}]}
        })),
        object(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "forms",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.0.0.1"]}]
        })),
        object(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": "forms", "annotations": ingress},
            "spec": {"ingressClassName": "portcullis", "rules": [{
                "host": format!("{name}.example.com"),
                "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": name, "port": {"number": 80}}}}]}}]}
        })),
    ]
}

fn run(mut objects: Vec<Object>) -> Output {
    // The IngressClass the Ingresses name: without it they are not served.
    objects.push(object(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": "portcullis"}, "spec": {"controller": "portcullis.io/ingress"}
    })));
    Pipeline::load(None, None, TranslateConfig::default())
        .unwrap()
        .run(&Store::from_objects(objects))
        .unwrap()
}

fn haproxy_cfg(output: &Output) -> String {
    output.rendered.haproxy_cfg().into_owned()
}

/// Break-out attempts in each new form; each carries `PWN`, which must reach no file.
const INGRESS_PAYLOADS: &[(&str, &str)] = &[
    ("request-set-header", "X-A \"PWN\" \n  lua-load /x"),
    ("request-set-header", "X-A \"PWN\\\" lua-load /x"),
    ("request-set-header", "X-A \"a\" PWN\""),
    ("request-set-header", "X-A %[env(PWN)]"),
    ("request-set-header", "X-A %[src,map(/PWN)]"),
    ("request-set-header", "X-A %[lua.PWN]"),
    ("request-set-header", "X-A %[hdr(PWN x)]"),
    ("request-set-header", "X-A \"${PWN}\""),
    ("request-set-header", "X-A \"PWN\\nX-B: 1\""),
    ("request-set-header", "X-A %[src] 100% PWN"),
    ("request-set-header", "X-A %{+Q}[PWN]"),
    ("request-set-header", "X-A %[src\nPWN"),
    ("response-set-header", "X-A %[req.hdr(PWN)]"),
    ("request-set-header", "X-A %[status] PWN"),
    ("path-rewrite", "/a /b\n/c' PWN"),
    ("path-rewrite", "/a /b\n/c /d PWN"),
    ("path-rewrite", "/a /b\n\"/PWN\""),
];

const SERVICE_PAYLOADS: &[(&str, &str)] = &[
    ("load-balance", "uri whole PWN"),
    ("load-balance", "uri len PWN"),
    ("load-balance", "url_param x check_post PWN"),
    ("load-balance", "hdr(X) PWN"),
    ("load-balance", "random(PWN)"),
    ("load-balance", "rdp-cookie(PWN;x)"),
    ("load-balance", "uri whole\n  lua-load /PWN"),
    ("check-http", "GET / HTTP/PWN"),
    ("check-http", "GET / HTTP/1.1\\r\\nPWN"),
    ("check-http", "GET / HTTP/1.1\\r\\nHost:\\ $PWN"),
    ("check-http", "GET / HTTP/1.1\\r\\nHost:\\ %[env(PWN)]"),
    ("check-http", "GET / HTTP/1.1 PWN"),
];

#[test]
fn hostile_values_in_the_new_forms_are_refused_named_and_contained() {
    let mut objects = Vec::new();
    let mut expected = Vec::new();
    // One object per payload and per spelling of the name: prefixed, haproxy.com/, bare.
    for (i, (name, payload)) in INGRESS_PAYLOADS.iter().enumerate() {
        for (j, key) in [
            format!("haproxy.org/{name}"),
            format!("haproxy.com/{name}"),
            name.to_string(),
        ]
        .into_iter()
        .enumerate()
        {
            let site_name = format!("i{i}-{j}");
            objects.extend(site(&site_name, json!({}), json!({ &key: payload })));
            expected.push(format!("Ingress forms/{site_name}: annotation {key}:"));
        }
    }
    for (i, (name, payload)) in SERVICE_PAYLOADS.iter().enumerate() {
        for (j, key) in [format!("haproxy.org/{name}"), name.to_string()]
            .into_iter()
            .enumerate()
        {
            let site_name = format!("s{i}-{j}");
            objects.extend(site(&site_name, json!({ &key: payload }), json!({})));
            expected.push(format!("Service forms/{site_name}: annotation {key}:"));
        }
    }
    let output = run(objects);
    for (name, bytes) in output.rendered.files() {
        let text = String::from_utf8_lossy(&bytes.bytes()).into_owned();
        assert!(!text.contains("PWN"), "{name} carries a payload:\n{text}");
    }
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    for want in &expected {
        assert!(
            diagnostics
                .iter()
                .any(|d| d.starts_with("error: ") && d.contains(want.as_str())),
            "not reported: {want}\n{}",
            diagnostics.join("\n")
        );
    }
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}

#[test]
fn the_accepted_forms_render_as_haproxy_must_read_them() {
    let mut objects = site(
        "headers",
        json!({}),
        json!({
            "haproxy.org/request-set-header":
                "X-Quoted \"it's \\\"x\\\" #1 \\\\ 50%%\"\nX-Client \"%[src] %[ssl_c_s_dn(cn),lower]\"",
            "haproxy.org/response-set-header": "Cache-Control \"no-store,no-cache,private\"",
            "haproxy.org/path-rewrite": "/foo/(.*) /\\1\n\n/bar/(.*) /baz/\\1",
        }),
    );
    objects.extend(site(
        "balance",
        json!({
            "haproxy.org/load-balance": "url_param uid  check_post 64",
            "haproxy.org/check-http": "HEAD /healthz HTTP/1.1\\r\\nHost:\\ health.example.com",
        }),
        json!({}),
    ));
    let output = run(objects);
    let cfg = haproxy_cfg(&output);
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    for line in [
        r#"http-request set-header X-Quoted "it's \"x\" #1 \\ 50%%" if"#,
        "http-request set-header X-Client '%[src] %[ssl_c_s_dn(cn),lower]' if",
        "http-response set-header Cache-Control 'no-store,no-cache,private' if",
        "http-request replace-path '/foo/(.*)' '/\\1' if",
        "http-request replace-path '/bar/(.*)' '/baz/\\1' if",
        "balance url_param uid check_post 64",
        "http-check send meth HEAD uri /healthz ver HTTP/1.1 hdr Host 'health.example.com'",
    ] {
        assert!(cfg.contains(line), "{line}\nnot in\n{cfg}");
    }
    // The rewrites in the order written.
    let first = cfg.find("replace-path '/foo").unwrap();
    let second = cfg.find("replace-path '/bar").unwrap();
    assert!(first < second);
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}

/// Unknown annotations under each accepted prefix are reported once per object with the
/// closest known name; bare names, other prefixes and known names are not; a name read only
/// elsewhere says where it is read.
#[test]
fn unknown_annotations_are_reported_with_a_suggestion() {
    let objects = site(
        "web",
        json!({
            "haproxy.org/load-balanse": "leastconn",
            "haproxy.org/check": "true",
            "haproxy.org/route-acl": "path_beg /x",
        }),
        json!({
            "haproxy.org/timeout-sever": "5s",
            "haproxy.com/whitelist": "10.0.0.0/8",
            "haproxy.com/ssl-redirect-cod": "301",
            "ingress.kubernetes.io/rewrite-target": "/",
            "portcullis.io/frobnicate": "yes",
            "haproxy.org/global-config-snippet": "maxconn 10",
            "timeout-sever": "5s",
            "nginx.ingress.kubernetes.io/rewrite-target": "/",
        }),
    );
    let output = run(objects);
    let mut warnings: Vec<String> = output
        .diagnostics
        .iter()
        .map(ToString::to_string)
        .filter(|d| d.contains("no script reads"))
        .collect();
    warnings.sort();
    assert_eq!(
        warnings,
        [
            "warning: Ingress forms/web: annotation haproxy.com/ssl-redirect-cod: ignored: no script reads this annotation; did you mean ssl-redirect-code?",
            "warning: Ingress forms/web: annotation haproxy.org/global-config-snippet: ignored: no script reads it on an Ingress (only on ConfigMap)",
            "warning: Ingress forms/web: annotation haproxy.org/timeout-sever: ignored: no script reads this annotation; did you mean timeout-server?",
            "warning: Ingress forms/web: annotation ingress.kubernetes.io/rewrite-target: ignored: no script reads this annotation",
            "warning: Ingress forms/web: annotation portcullis.io/frobnicate: ignored: no script reads this annotation",
            "warning: Service forms/web: annotation haproxy.org/load-balanse: ignored: no script reads this annotation; did you mean load-balance?",
        ]
    );
}

/// A site script's declared annotation is known, so not reported; the same script without the
/// declaration leaves it reported. A malformed declaration does not compile.
#[test]
fn a_site_scripts_declarations_extend_the_known_names() {
    let objects = || {
        site(
            "web",
            json!({}),
            json!({"portcullis.io/maintenance-page": "down for maintenance"}),
        )
    };
    let script = |read: &str| {
        format!(
            "// zz-maintenance.rhai: answer 503 with a page.\n//\n// Scope:    route\n// Risk:     low\n{read}\n\nfn route(ctx) {{\n    let page = ctx.header_value(\"maintenance-page\");\n    if page != () {{ ctx.warn(page); }}\n}}\n"
        )
    };
    let warnings = |read: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("zz-maintenance.rhai"), script(read)).unwrap();
        let pipeline = portcullis::source::site::load_pipeline(
            Some(dir.path()),
            None,
            TranslateConfig::default(),
        )
        .map_err(|e| format!("{e:?}"))?;
        let mut objects = objects();
        objects.push(object(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "portcullis"}, "spec": {"controller": "portcullis.io/ingress"}
        })));
        let output = pipeline.run(&Store::from_objects(objects)).unwrap();
        Ok::<Vec<String>, String>(output.diagnostics.iter().map(ToString::to_string).collect())
    };
    let declared = warnings(
        "// Read:     maintenance-page header_value from Ingress, ConfigMap default none: the\n//           text of the 503 page.",
    )
    .unwrap();
    assert_eq!(declared.len(), 1, "{declared:?}");
    assert!(
        declared[0].starts_with("warning: Ingress forms/web: script ")
            && declared[0].ends_with("zz-maintenance.rhai: down for maintenance"),
        "{declared:?}"
    );
    let undeclared = warnings("").unwrap();
    assert!(
        undeclared.iter().any(|d| d.contains(
            "annotation portcullis.io/maintenance-page: ignored: no script reads this annotation"
        )),
        "{undeclared:?}"
    );
    let malformed = warnings("// Read:     maintenance-page page from Ingress: the text.");
    assert!(
        malformed
            .as_ref()
            .is_err_and(|e| e.contains("is not one of")),
        "{malformed:?}"
    );
}

/// Every fetch and converter the header allowlist names, in each message it is allowed in,
/// passes `haproxy -c`: an accepted value never makes HAProxy refuse the configuration.
#[test]
fn what_the_header_allowlist_names_haproxy_accepts() {
    let with_arg = |fetch: &str| match fetch {
        "req.hdr" | "hdr" | "res.hdr" => format!("{fetch}(X-A)"),
        "req.cook" => format!("{fetch}(sid)"),
        "ssl_c_s_dn" | "ssl_c_i_dn" => format!("{fetch}(CN,1)"),
        _ => fetch.to_string(),
    };
    let request_only = [
        "method", "path", "base", "url", "query", "req.hdr", "hdr", "req.cook",
    ];
    let response_only = ["status", "res.hdr"];
    let mut request = Vec::new();
    let mut response = Vec::new();
    for fetch in values::header_fetch_names() {
        let sample = with_arg(fetch);
        if !response_only.contains(&fetch) {
            request.push(format!("X-R{} %[{sample}]", request.len()));
        }
        if !request_only.contains(&fetch) {
            response.push(format!("X-S{} %[{sample}]", response.len()));
        }
    }
    for converter in values::header_converter_names() {
        let conv = if converter == "ipmask" {
            "ipmask(24)".to_string()
        } else {
            converter.to_string()
        };
        request.push(format!("X-C{} %[src,{conv}]", request.len()));
    }
    let output = run(site(
        "all",
        json!({}),
        json!({
            "haproxy.org/request-set-header": request.join("\n"),
            "haproxy.org/response-set-header": response.join("\n"),
        }),
    ));
    let diagnostics: Vec<String> = output.diagnostics.iter().map(ToString::to_string).collect();
    assert!(diagnostics.is_empty(), "{diagnostics:?}");
    let cfg = haproxy_cfg(&output);
    assert!(
        cfg.contains("%[ssl_c_s_dn(CN,1)]") && cfg.contains("%[res.hdr(X-A)]"),
        "{cfg}"
    );
    portcullis::check::check_config("haproxy", &output.rendered).unwrap();
}
