//! `portcullis test`, the site author's test kit, as a site author runs it: the real binary on
//! the bundled cases in `scripts/tests/` (which must all pass), and on cases written to fail,
//! to prove the kit reports what is wrong and where.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

const BUNDLED_CASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/tests");

fn portcullis(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_portcullis"));
    command.args(args);
    // The pipeline flags read these; a developer's environment must not change the cases.
    for (name, _) in std::env::vars() {
        if name.starts_with("PORTCULLIS_") || name.starts_with("POD_") {
            command.env_remove(name);
        }
    }
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// One Service (two ready pods) behind one Ingress of class `portcullis`, with the given
/// Service annotations (YAML lines, indented for `metadata.annotations`).
fn manifests(service_annotations: &str) -> String {
    let annotations = if service_annotations.is_empty() {
        String::new()
    } else {
        format!("  annotations:\n{service_annotations}")
    };
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
{annotations}spec:
  ports:
    - {{name: http, port: 80, targetPort: 8080}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports:
  - {{name: http, port: 8080}}
endpoints:
  - addresses: [\"10.0.0.1\"]
    conditions: {{ready: true}}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: portcullis
spec:
  controller: portcullis.io/ingress
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
spec:
  ingressClassName: portcullis
  rules:
    - host: shop.example.com
      http:
        paths:
          - {{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}
"
    )
}

/// Writes a case directory `dir/name` with `manifests.yaml` and the given extra files.
fn write_case(dir: &Path, name: &str, manifests: &str, files: &[(&str, &str)]) {
    let case = dir.join(name);
    std::fs::create_dir_all(&case).unwrap();
    std::fs::write(case.join("manifests.yaml"), manifests).unwrap();
    for (file, content) in files {
        std::fs::write(case.join(file), content).unwrap();
    }
}

#[test]
fn the_bundled_cases_pass() {
    let out = portcullis(&["test", BUNDLED_CASES]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.ends_with(" passed, 0 failed"), "{stdout}");
    // Every bundled script has at least one case of its own name.
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rhai") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            assert!(
                stdout.lines().any(|l| l == format!("ok   {name}")),
                "no passing case named {name} in scripts/tests:\n{stdout}"
            );
        }
    }
}

#[test]
fn a_wrong_expectation_fails_with_a_diff_naming_case_file_and_lines() {
    let dir = tempfile::tempdir().unwrap();
    let annotations = "    haproxy.org/load-balance: leastconn\n";
    // The expectation says roundrobin; the Service asks for leastconn.
    let expect = "# balance of the web backend\ncontains:\n  backend shop_web_80\n  mode http\n  balance roundrobin\n";
    write_case(
        dir.path(),
        "wrong-balance",
        &manifests(annotations),
        &[("expect.txt", expect)],
    );
    let right =
        "contains:\n  backend shop_web_80\n  mode http\n  balance leastconn\nno diagnostics\n";
    write_case(
        dir.path(),
        "right-balance",
        &manifests(annotations),
        &[("expect.txt", right)],
    );
    let out = portcullis(&["test", dir.path().to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("ok   right-balance\n"), "{stdout}");
    assert!(stdout.contains("FAIL wrong-balance\n"), "{stdout}");
    let file = dir.path().join("wrong-balance/expect.txt");
    assert!(
        stdout.contains(&format!("{}:2: ", file.display())),
        "the failure names the file and the block's line:\n{stdout}"
    );
    assert!(stdout.contains("- balance roundrobin"), "{stdout}");
    assert!(stdout.contains("+ balance leastconn"), "{stdout}");
    assert_eq!(
        stdout.lines().last(),
        Some("1 passed, 1 failed"),
        "{stdout}"
    );
}

#[test]
fn a_full_config_mismatch_is_a_unified_diff() {
    let dir = tempfile::tempdir().unwrap();
    let case_manifests = manifests("");
    write_case(dir.path(), "full", &case_manifests, &[]);
    // The real configuration, rendered by the real binary...
    let render = portcullis(&[
        "render",
        "--manifests",
        dir.path().join("full").to_str().unwrap(),
    ]);
    assert_eq!(render.status.code(), Some(0), "{}", text(&render.stderr));
    let real = text(&render.stdout);
    assert!(real.contains("\n  balance roundrobin\n"), "{real}");
    // ... passes as expected.cfg ...
    std::fs::write(dir.path().join("full/expected.cfg"), &real).unwrap();
    let out = portcullis(&["test", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_eq!(text(&out.stdout), "ok   full\n1 passed, 0 failed\n");
    // ... and with one line changed, fails with that line as `-` and the real one as `+`.
    let wrong = real.replace("\n  balance roundrobin\n", "\n  balance first\n");
    std::fs::write(dir.path().join("full/expected.cfg"), wrong).unwrap();
    let out = portcullis(&["test", dir.path().to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.starts_with("FAIL full\n"), "{stdout}");
    let cfg = dir.path().join("full/expected.cfg");
    assert!(stdout.contains(&cfg.display().to_string()), "{stdout}");
    assert!(stdout.contains("\n  @@ -"), "a hunk header:\n{stdout}");
    assert!(stdout.contains("\n  -  balance first\n"), "{stdout}");
    assert!(stdout.contains("\n  +  balance roundrobin\n"), "{stdout}");
    // Context around the change, not the whole file.
    assert!(stdout.contains("\n     mode http\n"), "{stdout}");
    assert!(!stdout.contains("default-path config"), "{stdout}");
}

#[test]
fn a_malformed_case_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write_case(
        dir.path(),
        "typo",
        &manifests(""),
        &[(
            "expect.txt",
            "contains:\n  mode http\ncontian:\n  balance roundrobin\n",
        )],
    );
    write_case(
        dir.path(),
        "bad-args",
        &manifests(""),
        &[
            ("expect.txt", "contains:\n  mode http\n"),
            ("args", "--no-such-flag\n"),
        ],
    );
    write_case(dir.path(), "nothing-to-check", &manifests(""), &[]);
    let out = portcullis(&["test", dir.path().to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let typo = dir.path().join("typo/expect.txt");
    assert!(
        stdout.contains(&format!(
            "{}:3: unknown directive `contian:`",
            typo.display()
        )),
        "{stdout}"
    );
    let args = dir.path().join("bad-args/args");
    assert!(
        stdout.contains(&format!("{}: ", args.display())),
        "{stdout}"
    );
    assert!(stdout.contains("--no-such-flag"), "{stdout}");
    assert!(stdout.contains("FAIL nothing-to-check\n"), "{stdout}");
    assert_eq!(
        stdout.lines().last(),
        Some("0 passed, 3 failed"),
        "{stdout}"
    );
}

#[test]
fn cases_run_against_the_site_layers() {
    // A site script replacing the bundled load-balance.rhai: the bundled case fails against
    // it, and a case of the site's passes.
    let site = tempfile::tempdir().unwrap();
    std::fs::write(
        site.path().join("load-balance.rhai"),
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/load-balance.rhai"
        ))
        .unwrap()
        .replace("\"roundrobin\"", "\"leastconn\""),
    )
    .unwrap();
    let cases = tempfile::tempdir().unwrap();
    write_case(
        cases.path(),
        "site-default",
        &manifests(""),
        &[("expect.txt", "contains:\n  balance leastconn\n")],
    );
    let site_dir = site.path().to_str().unwrap();
    let out = portcullis(&[
        "test",
        cases.path().to_str().unwrap(),
        "--scripts-dir",
        site_dir,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let out = portcullis(&["test", cases.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
}

#[test]
fn case_args_override_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let configmap = "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: portcullis, namespace: ingress}\ndata:\n  timeout-client: 7s\n";
    let with_map = format!("{}{configmap}", manifests(""));
    write_case(
        dir.path(),
        "from-args",
        &with_map,
        &[
            ("expect.txt", "contains:\n  timeout client 7000\n"),
            (
                "args",
                "# the controller ConfigMap\n--configmap ingress/portcullis\n",
            ),
        ],
    );
    write_case(
        dir.path(),
        "without-args",
        &with_map,
        &[("expect.txt", "contains:\n  timeout client 50000\n")],
    );
    let out = portcullis(&["test", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    // From the command line, the ConfigMap applies to every case without its own `args`.
    let out = portcullis(&[
        "test",
        dir.path().to_str().unwrap(),
        "--configmap",
        "ingress/portcullis",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("ok   from-args\n"), "{stdout}");
    assert!(stdout.contains("FAIL without-args\n"), "{stdout}");
}

#[test]
fn usage_errors_exit_2_and_unreadable_directories_1() {
    let out = portcullis(&["test"]);
    assert_eq!(out.status.code(), Some(2));
    let out = portcullis(&["test", "/nonexistent/portcullis-cases"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("/nonexistent/portcullis-cases"),
        "{}",
        text(&out.stderr)
    );
}
