//! The worked examples of docs/scripting.md ("New directives: site settings and hook points"),
//! read from the page's own blocks: each a site script and a site template part. Their
//! `portcullis test` cases pass with the site layers and fail without them; added to a running
//! controller's site directories (no restart), they compress one Service's responses, answer
//! one Ingress' requests with a maintenance page and refuse one Ingress' paths by pattern on a
//! real HAProxy, and a hostile pattern is refused with a diagnostic naming object and
//! annotation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::*;

const PAGE: &str = include_str!("../docs/scripting.md");
const SECTION: &str = "## New directives: site settings and hook points";

/// The files the section shows: every fenced block introduced by a line "`PATH`:" (or
/// "`PATH` (…):"), as (PATH, text).
fn page_files() -> Vec<(String, String)> {
    let start = PAGE.find(SECTION).expect("the section is on the page");
    let rest = &PAGE[start + SECTION.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut files = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        let Some((path, after)) = line.strip_prefix('`').and_then(|l| l.split_once('`')) else {
            continue;
        };
        let label = after == ":" || (after.starts_with(" (") && after.ends_with("):"));
        if !label || !path.contains('/') || path.contains(' ') {
            continue;
        }
        let fence = lines.by_ref().find(|l| !l.trim().is_empty()).unwrap();
        assert!(fence.starts_with("```"), "{path}: no block after its label");
        let mut text = String::new();
        for l in lines.by_ref() {
            if l == "```" {
                break;
            }
            text.push_str(l);
            text.push('\n');
        }
        files.push((path.to_string(), text));
    }
    files
}

fn write_files(root: &Path, files: &[(String, String)], prefix: &str) {
    for (path, text) in files.iter().filter(|(p, _)| p.starts_with(prefix)) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        write_atomically(&path, text);
    }
}

#[test]
fn the_page_shows_three_directive_families() {
    let files = page_files();
    let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    for family in ["compression", "maintenance", "path-deny"] {
        for path in [
            format!("site/scripts/{family}.rhai"),
            format!("cases/{family}/manifests.yaml"),
            format!("cases/{family}/expect.txt"),
        ] {
            assert!(names.contains(&path.as_str()), "{path} in {names:?}");
        }
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("site/templates/parts/site/")
                    && n.ends_with(&format!("/{family}.j2"))),
            "{family}'s template part in {names:?}"
        );
    }
}

/// `portcullis test` on the page's cases: all pass with the page's site layers, and each
/// fails without them (the cases can fail).
#[test]
fn the_documented_cases_pass_with_the_site_layers_only() {
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &page_files(), "");
    let run = |layers: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_portcullis"));
        cmd.current_dir(dir.path()).args(["test", "cases"]);
        if layers {
            cmd.args([
                "--scripts-dir",
                "site/scripts",
                "--templates-dir",
                "site/templates",
            ]);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, out) = run(true);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("3 passed, 0 failed"), "{out}");
    let (code, out) = run(false);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("0 passed, 3 failed"), "{out}");
}

/// A GET with `Accept-Encoding: gzip`: (status line and headers lowercased, body bytes after
/// de-chunking).
fn gzip_get(port: u16, host: &str, path: &str) -> Option<(String, Vec<u8>)> {
    let mut stream = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(5),
    )
    .ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let mut rest = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Some((head, rest.to_vec()));
    }
    let mut body = Vec::new();
    loop {
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..end]).ok()?.trim(), 16).ok()?;
        if size == 0 {
            return Some((head, body));
        }
        body.extend_from_slice(rest.get(end + 2..end + 2 + size)?);
        rest = rest.get(end + 4 + size..)?;
    }
}

#[test]
fn the_documented_directives_work_when_added_to_a_running_controller() {
    let mut h = Harness::new();
    let site = h.work().join("site");
    std::fs::create_dir_all(site.join("scripts")).unwrap();
    std::fs::create_dir_all(site.join("templates")).unwrap();
    let ns = "shop";

    // Compression on `web`, not on `api`.
    let web = h.echo("web");
    let api = h.echo("api");
    h.write(
        "web.yaml",
        &format!(
            "{}---\n{}",
            service(ns, "web", &[("portcullis.io/compression", "gzip")]),
            endpoint_slices(ns, "web", &[("0", web, true)])
        ),
    );
    h.write(
        "api.yaml",
        &format!(
            "{}---\n{}",
            service(ns, "api", &[]),
            endpoint_slices(ns, "api", &[("0", api, true)])
        ),
    );
    h.write(
        "shop.yaml",
        &ingress(
            ns,
            "shop",
            &[
                route(Some("shop.example.com"), "/", "Prefix", "web"),
                route(Some("shop.example.com"), "/api", "Prefix", "api"),
            ],
            None,
            &[],
        ),
    );
    // A maintenance page on `down`, not on `up`, both to `web`.
    for (name, annotations) in [
        (
            "down",
            &[("portcullis.io/maintenance", "Back at 14:00 UTC.")][..],
        ),
        ("up", &[][..]),
    ] {
        let host = format!("{name}.example.com");
        let doc = ingress(
            ns,
            name,
            &[route(Some(&host), "/", "Prefix", "web")],
            None,
            &[],
        );
        h.write(&format!("{name}.yaml"), &annotated(&doc, annotations));
    }
    // A path pattern on `guarded`; hostile ones on `broken` (PCRE2 refuses it) and
    // `smuggler` (it would leave its quotes and add a rule).
    for (name, pattern) in [
        ("guarded", r"^/(admin|\.git)(/|$)"),
        ("broken", "^/(admin"),
        (
            "smuggler",
            "^/x' }\n  http-request return status 200 if TRUE #",
        ),
    ] {
        let host = format!("{name}.example.com");
        let doc = ingress(
            ns,
            name,
            &[route(Some(&host), "/", "Prefix", "web")],
            None,
            &[],
        );
        h.write(
            &format!("{name}.yaml"),
            &annotated(&doc, &[("portcullis.io/deny-path", pattern)]),
        );
    }

    h.start(&[
        "--scripts-dir",
        site.join("scripts").to_str().unwrap(),
        "--templates-dir",
        site.join("templates").to_str().unwrap(),
    ]);
    let pid = h.pid();
    // Nothing of it yet: the annotations are unknown, nothing is compressed or refused.
    let (head, _) = gzip_get(h.http_port, "shop.example.com", "/").unwrap();
    assert!(!head.contains("content-encoding"), "{head}");
    assert_eq!(h.get("down.example.com", "/").status, 200);
    assert_eq!(h.get("guarded.example.com", "/admin").status, 200);

    // The page's files, templates first, then scripts, into the running controller's site
    // directories.
    let files = page_files();
    write_files(&h.work(), &files, "site/templates/");
    write_files(&h.work(), &files, "site/scripts/");

    wait_until(APPLY_TIMEOUT, "the maintenance page", || {
        h.try_get("down.example.com", "/")
            .is_some_and(|a| a.status == 503 && a.body == "Back at 14:00 UTC.")
    });
    wait_until(APPLY_TIMEOUT, "compression", || {
        gzip_get(h.http_port, "shop.example.com", "/")
            .is_some_and(|(head, _)| head.contains("content-encoding: gzip"))
    });
    assert_eq!(h.pid(), pid, "no restart");

    // Compression: `web`'s answers are gzip, `api`'s are not, and without Accept-Encoding
    // neither is.
    let (head, body) = gzip_get(h.http_port, "shop.example.com", "/").unwrap();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(body.starts_with(&[0x1f, 0x8b]), "not gzip: {body:?}");
    let (head, body) = gzip_get(h.http_port, "shop.example.com", "/api/x").unwrap();
    assert!(!head.contains("content-encoding"), "{head}");
    assert!(body.starts_with(b"api GET /api/x"), "{body:?}");
    let plain = h.get("shop.example.com", "/");
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(plain.who(), "web");

    // Maintenance: only `down`'s routes.
    let down = h.get("down.example.com", "/any/path");
    assert_eq!(
        (down.status, down.body.as_str()),
        (503, "Back at 14:00 UTC.")
    );
    assert_eq!(down.header("content-type"), Some("text/plain"));
    assert_eq!(h.who("up.example.com", "/"), "web");

    // Path deny: matching paths of `guarded` get 403, the others pass.
    for (path, status) in [
        ("/admin", 403),
        ("/admin/users", 403),
        ("/.git/config", 403),
        ("/administrator", 200),
        ("/", 200),
        ("/shop/admin", 200),
    ] {
        assert_eq!(h.get("guarded.example.com", path).status, status, "{path}");
    }
    // The hostile patterns are refused, named with object and annotation, and their routes
    // fail closed; nothing they held reached haproxy.cfg.
    for name in ["broken", "smuggler"] {
        wait_until(APPLY_TIMEOUT, "the hostile pattern's diagnostic", || {
            h.log().lines().any(|l| {
                l.contains(&format!(
                    "Ingress shop/{name}: annotation portcullis.io/deny-path:"
                )) && l.contains("every request of these routes gets 403")
            })
        });
        let host = format!("{name}.example.com");
        assert_eq!(h.get(&host, "/").status, 403, "{name}");
        assert_eq!(h.get(&host, "/x").status, 403, "{name}");
    }
    let cfg = std::fs::read_to_string(h.config_dir().join("haproxy.cfg")).unwrap();
    assert!(!cfg.contains("if TRUE"), "{cfg}");
    assert!(!cfg.contains("(admin'"), "{cfg}");
    // Everyone else is served.
    assert_eq!(h.who("up.example.com", "/"), "web");

    // A part that prints text bare is refused when it is loaded, named with its file and
    // line, and the parts in force stay.
    let maintenance = h
        .work()
        .join("site/templates/parts/site/route-policy/maintenance.j2");
    let good = std::fs::read_to_string(&maintenance).unwrap();
    write_atomically(
        &maintenance,
        &good.replace("site.maintenance|q", "site.maintenance"),
    );
    wait_until(APPLY_TIMEOUT, "the bare text refused", || {
        h.readyz().is_some_and(|(_, r)| {
            r["site_error"].as_str().is_some_and(|e| {
                e.contains(&format!(
                    "{}: line 2: refusing to print",
                    maintenance.display()
                ))
            })
        })
    });
    assert_eq!(h.get("down.example.com", "/").status, 503);
    write_atomically(&maintenance, &good);

    // A part printing a line HAProxy refuses is named with its file and line; fixed, every
    // object it touched is back.
    let compression = h
        .work()
        .join("site/templates/parts/site/backend/compression.j2");
    let good = std::fs::read_to_string(&compression).unwrap();
    write_atomically(
        &compression,
        &good.replace(
            "{{ site.compression.algo }}",
            "{{ site.compression.algo }}-fast",
        ),
    );
    wait_until(APPLY_TIMEOUT, "the refused part named", || {
        h.readyz().is_some_and(|(_, r)| {
            r["site_error"].as_str().is_some_and(|e| {
                e.contains(&format!(
                    "{}: line 2: HAProxy refused",
                    compression.display()
                )) && e.contains("gzip-fast")
            })
        })
    });
    write_atomically(&compression, &good);
    wait_until(APPLY_TIMEOUT, "the fixed part in force", || {
        h.readyz().is_some_and(|(_, r)| r["site_error"].is_null())
            && h.try_get("up.example.com", "/")
                .is_some_and(|a| a.who() == "web")
            && gzip_get(h.http_port, "shop.example.com", "/")
                .is_some_and(|(head, _)| head.contains("content-encoding: gzip"))
    });
    assert_eq!(h.get("down.example.com", "/").status, 503);
    assert_eq!(h.who("up.example.com", "/"), "web");
    assert_eq!(h.pid(), pid, "no restart");
}

/// Each hook point includes its site parts where the docs say, in name order (the overridden
/// `<point>.j2` first), with the variables the docs list; haproxy.cfg stays valid.
#[test]
fn hook_points_include_site_parts_in_place_and_order() {
    let dir = tempfile::tempdir().unwrap();
    let parts = dir.path().join("parts/site");
    let files: &[(&str, &str)] = &[
        ("global.j2", "  # global {{ site.level }}\n"),
        ("defaults.j2", "  # defaults {{ site.level }}\n"),
        ("frontend/b.j2", "  # frontend {{ frontend }} b\n"),
        ("frontend/a.j2", "  # frontend {{ frontend }} a\n"),
        (
            "backend.j2",
            "  # backend {{ backend.name }} {{ site|length }}\n",
        ),
        ("backend/x.j2", "  # backend x\n"),
        (
            "route-policy/deny.j2",
            "  # policy {{ p.id }} {{ site.tag if site.tag is defined else \"none\" }}\n  http-request deny if {{ applies }} FALSE\n",
        ),
    ];
    for (name, text) in files {
        let path = parts.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let scripts = tempfile::tempdir().unwrap();
    std::fs::write(
        scripts.path().join("tag.rhai"),
        "// Scope: global, route\n// Risk: low\nfn global(ctx) { #{ site: #{ level: 3 } } }\nfn route(ctx) { #{ site: #{ tag: \"t1\" } } }\n",
    )
    .unwrap();
    let manifests = tempfile::tempdir().unwrap();
    let case = page_files()
        .into_iter()
        .find(|(p, _)| p == "cases/maintenance/manifests.yaml")
        .unwrap()
        .1;
    std::fs::write(manifests.path().join("m.yaml"), case).unwrap();
    let with_layers = |command: &str| {
        Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .args([command, "--manifests"])
            .arg(manifests.path())
            .arg("--scripts-dir")
            .arg(scripts.path())
            .arg("--templates-dir")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let out = with_layers("check");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let render = with_layers("render");
    let cfg = String::from_utf8(render.stdout).unwrap();
    let lines: Vec<&str> = cfg.lines().collect();
    let after = |line: &str| {
        let at = lines
            .iter()
            .position(|l| l.trim() == line)
            .unwrap_or_else(|| panic!("{line}:\n{cfg}"));
        lines[at + 1].trim()
    };
    // The end of global and defaults (a blank line, then the next section).
    assert_eq!(after("# global 3"), "");
    assert_eq!(after("# defaults 3"), "");
    // Before routing, in name order.
    assert_eq!(after("# frontend http a"), "# frontend http b");
    assert!(
        after("# frontend http b").starts_with("http-request deny deny_status 400"),
        "{cfg}"
    );
    // The overridden part, then the family's, then default-server.
    assert_eq!(after("# backend shop_web_80 0"), "# backend x");
    assert!(after("# backend x").starts_with("default-server"), "{cfg}");
    // One per route policy, with its site settings and the ready condition.
    let policy = lines
        .iter()
        .find(|l| l.trim().starts_with("# policy p"))
        .unwrap_or_else(|| panic!("{cfg}"));
    let id = policy.trim().split(' ').nth(2).unwrap();
    assert_eq!(policy.trim(), format!("# policy {id} t1"));
    assert_eq!(
        after(policy.trim()),
        format!("http-request deny if {{ var(txn.policy) -m str {id} }} FALSE")
    );
}
