//! Site scripts are hot, from a ConfigMap-style volume: the `..data` symlink swap Kubernetes
//! uses to update a mounted ConfigMap is seen, a new script applies within 2 s while traffic
//! flows, a broken one leaves the last good one in force (named with file and line in
//! `/readyz`), and a fix applies, all without a restart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::*;

const NS: &str = "shop";

/// Lays out `dir` as the kubelet does for a ConfigMap volume: the files live in a timestamped
/// directory, `..data` points at it, and each visible name is a symlink through `..data`.
/// Publishing a new version writes a new directory and swaps `..data` atomically.
struct ConfigMapVolume<'a> {
    dir: &'a Path,
    version: u32,
}

impl ConfigMapVolume<'_> {
    fn publish(&mut self, files: &[(&str, &str)]) {
        self.version += 1;
        let data = format!("..2026_11_29_{:04}", self.version);
        std::fs::create_dir(self.dir.join(&data)).unwrap();
        for (name, text) in files {
            std::fs::write(self.dir.join(&data).join(name), text).unwrap();
            let link = self.dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
            }
        }
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&data, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

fn header_script(value: &str) -> String {
    format!(
        "// site: tag every response of Ingresses annotated example.com/tagged.\n\
         // Scope: route\n// Risk: low\n\
         // Read: tagged bool from Ingress default false: tag the responses.\n\
         fn route(ctx) {{\n    if ctx.bool(\"tagged\") == true {{\n        #{{ response_headers: [[\"X-Site\", \"{value}\"]] }}\n    }}\n}}\n"
    )
}

#[test]
fn site_scripts_from_a_configmap_volume_are_hot_and_fail_safe() {
    let mut h = Harness::new();
    let site = h.work().join("scripts");
    std::fs::create_dir(&site).unwrap();
    let mut volume = ConfigMapVolume {
        dir: &site,
        version: 0,
    };
    volume.publish(&[(
        "readme.rhai",
        "// nothing yet\n// Scope: route\n// Risk: low\n",
    )]);
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    let ingress = ingress(
        NS,
        "tagged",
        &[route(Some("site.example.com"), "/", "Prefix", "web")],
        None,
        &[],
    );
    h.write(
        "ingress.yaml",
        &with_metadata(
            &ingress,
            "  annotations: {portcullis.io/tagged: \"true\"}\n",
        ),
    );
    h.start(&["--scripts-dir", site.to_str().unwrap()]);
    let pid = h.pid();
    assert_eq!(h.get("site.example.com", "/").header("x-site"), None);

    // A new script appears: within 2 s every response carries the header.
    let published = Instant::now();
    volume.publish(&[
        (
            "readme.rhai",
            "// nothing yet\n// Scope: route\n// Risk: low\n",
        ),
        ("tag.rhai", &header_script("v1")),
    ]);
    wait_until(Duration::from_secs(2), "the new script applies", || {
        h.get("site.example.com", "/").header("x-site") == Some("v1")
    });
    eprintln!("site script applied after {:?}", published.elapsed());

    // A syntax error: the last good script stays in force, and /readyz names file and line.
    volume.publish(&[
        (
            "readme.rhai",
            "// nothing yet\n// Scope: route\n// Risk: low\n",
        ),
        (
            "tag.rhai",
            "// Scope: route\n// Risk: low\nfn route(ctx) {\n    let = ;\n}\n",
        ),
    ]);
    wait_until(APPLY_TIMEOUT, "the error is reported", || {
        h.readyz().is_some_and(|(status, r)| {
            status == 200
                && r["site_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("tag.rhai") && e.contains("line 4"))
        })
    });
    assert_eq!(h.get("site.example.com", "/").header("x-site"), Some("v1"));

    // A read the header does not declare is refused like a syntax error.
    volume.publish(&[
        (
            "readme.rhai",
            "// nothing yet\n// Scope: route\n// Risk: low\n",
        ),
        (
            "tag.rhai",
            &header_script("v3").replace("ctx.bool(\"tagged\")", "ctx.bool(\"tagged-too\")"),
        ),
    ]);
    wait_until(APPLY_TIMEOUT, "the undeclared read is reported", || {
        h.readyz().is_some_and(|(status, r)| {
            status == 200
                && r["site_error"].as_str().is_some_and(|e| {
                    e.contains(
                        "tag.rhai: line 6: reads \"tagged-too\" (ctx.bool) without declaring it",
                    )
                })
        })
    });
    assert_eq!(h.get("site.example.com", "/").header("x-site"), Some("v1"));

    // The fix applies; the process never restarted.
    volume.publish(&[
        (
            "readme.rhai",
            "// nothing yet\n// Scope: route\n// Risk: low\n",
        ),
        ("tag.rhai", &header_script("v2")),
    ]);
    wait_until(APPLY_TIMEOUT, "the fixed script applies", || {
        h.get("site.example.com", "/").header("x-site") == Some("v2")
    });
    assert!(h.readyz().is_some_and(|(_, r)| r["site_error"].is_null()));
    assert_eq!(h.pid(), pid);
}
