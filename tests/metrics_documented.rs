//! Observability of a running `portcullis run`: the metrics table of docs/operations.md lists
//! exactly the metric families `/metrics` exports (names, types, label names and help texts),
//! certificate expiry is exported per Secret, logs come out as JSON lines with
//! `--log-format json`, and the log filter can be changed through the admin endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use portcullis::metrics::Metrics;
use support::{
    APPLY_TIMEOUT, Harness, holds_for, ingress, route, self_signed, tls_secret, wait_until,
};

const NS: &str = "shop";

/// A metric family as documented or as exported.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Family {
    /// `counter`, `gauge` or `histogram`.
    kind: String,
    /// Label names, in order (`le` of histogram buckets not included).
    labels: Vec<String>,
    help: String,
}

/// The metrics table of docs/operations.md: metric name → the first word of its "type,
/// labels" column (`counter`, `gauge`, `histogram`), the label names that column gives (the
/// first backquoted word of each `;`-separated part after the type), and the help column.
fn documented_metrics() -> BTreeMap<String, Family> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("reading docs/operations.md");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Metrics\n"))
        .expect("a `## Metrics` section in docs/operations.md");
    let mut metrics = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cells.len() >= 5, "a metrics row has four columns: {line}");
        let name = cells[1].trim_matches('`');
        let mut parts = cells[2].split(';');
        let kind = parts
            .next()
            .unwrap_or_default()
            .split(|c: char| !c.is_ascii_alphabetic())
            .next()
            .unwrap_or_default();
        let labels = parts
            .map(|part| {
                part.split('`')
                    .nth(1)
                    .unwrap_or_else(|| panic!("{name}: no `label` in {part:?}"))
                    .to_string()
            })
            .collect();
        let family = Family {
            kind: kind.to_string(),
            labels,
            help: cells[3].to_string(),
        };
        assert!(
            metrics.insert(name.to_string(), family).is_none(),
            "{name} is documented twice"
        );
    }
    assert!(metrics.len() > 10, "too few metrics parsed: {metrics:?}");
    metrics
}

/// The families of a Prometheus text exposition (0.0.4): name → type and help from the
/// `# TYPE` and `# HELP` lines, and labels from the family's first sample; with the names of
/// the families that have a sample (label names show only on those).
fn exported_families(text: &str) -> (BTreeMap<String, Family>, BTreeSet<String>) {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut sampled = BTreeSet::new();
    fn entry<'a>(families: &'a mut BTreeMap<String, Family>, name: &str) -> &'a mut Family {
        families.entry(name.to_string()).or_insert_with(|| Family {
            kind: String::new(),
            labels: Vec::new(),
            help: String::new(),
        })
    }
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("`# HELP name text`");
            entry(&mut families, name).help = help.replace("\\n", "\n").replace("\\\\", "\\");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("`# TYPE name kind`");
            entry(&mut families, name).kind = kind.to_string();
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).expect("`name{labels} value`");
            let series = &line[..end];
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|suffix| series.strip_suffix(suffix))
                .find(|base| families.get(*base).is_some_and(|f| f.kind == "histogram"))
                .unwrap_or(series);
            let family = families
                .get_mut(name)
                .unwrap_or_else(|| panic!("a sample before its `# TYPE` line: {line}"));
            if sampled.insert(name.to_string()) {
                let histogram = family.kind == "histogram";
                family.labels = label_names(&line[end..])
                    .into_iter()
                    .filter(|l| !(histogram && l == "le"))
                    .collect();
            }
        }
    }
    (families, sampled)
}

/// The label names of a sample line's `{a="x",b="y\"z"} value` part, in order.
fn label_names(rest: &str) -> Vec<String> {
    let Some(mut rest) = rest.strip_prefix('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    while let Some((name, after)) = rest.split_once("=\"") {
        names.push(name.to_string());
        // Skip the value, whose `\"` and `\\` escapes do not end it.
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        rest = &after[end + 1..];
        match rest.strip_prefix(',') {
            Some(next) => rest = next,
            None => break,
        }
    }
    names
}

/// Where `exported` and `documented` differ, one line each (empty when equal).
fn differences(
    exported: &BTreeMap<String, Family>,
    documented: &BTreeMap<String, Family>,
    compare_labels: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for name in exported.keys().filter(|m| !documented.contains_key(*m)) {
        out.push(format!(
            "{name}: exported but not in the docs/operations.md metrics table"
        ));
    }
    for name in documented.keys().filter(|m| !exported.contains_key(*m)) {
        out.push(format!("{name}: documented but not exported"));
    }
    for (name, e) in exported {
        let Some(d) = documented.get(name) else {
            continue;
        };
        // `portcullis_cluster_watch_errors_total` is a gauge despite its name, and documented
        // as one.
        if e.kind != d.kind {
            out.push(format!(
                "{name}: exported {}, documented {}",
                e.kind, d.kind
            ));
        }
        if e.help != d.help {
            out.push(format!(
                "{name}: help text exported {:?}, documented {:?}",
                e.help, d.help
            ));
        }
        if compare_labels(name) && e.labels != d.labels {
            out.push(format!(
                "{name}: labels exported {:?}, documented {:?}",
                e.labels, d.labels
            ));
        }
    }
    out
}

#[test]
fn documented_metrics_are_exactly_the_exported_ones() {
    let mut h = Harness::new();
    h.start(&[]);
    let answer = h.admin("/metrics").expect("/metrics answers");
    assert_eq!(answer.status, 200);
    // The header names the format the body is written in, so Prometheus parses it as such.
    assert_eq!(
        answer.header("content-type"),
        Some(portcullis::metrics::CONTENT_TYPE)
    );
    let (exported, sampled) = exported_families(&answer.body);
    // Label names show only on families with a series; the registered families are held to
    // the table, labels included, by `the_families_registered_are_the_documented_ones`.
    let wrong = differences(&exported, &documented_metrics(), |name| {
        sampled.contains(name)
    });
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", answer.body);
}

#[test]
fn the_families_registered_are_the_documented_ones() {
    let registered: BTreeMap<String, Family> = Metrics::new()
        .describe()
        .iter()
        .map(|d| {
            let family = Family {
                kind: d.kind.clone(),
                labels: d.labels.clone(),
                help: d.help.clone(),
            };
            (d.name.clone(), family)
        })
        .collect();
    let wrong = differences(&registered, &documented_metrics(), |_| true);
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn label_names_of_a_sample_line() {
    assert!(label_names(" 1").is_empty());
    assert_eq!(
        label_names(r#"{a="x",b="y\"z,c=\\",le="+Inf"} 3"#),
        ["a", "b", "le"]
    );
}

#[test]
fn certificate_expiry_is_exported_per_secret_and_removed_with_it() {
    let mut h = Harness::new();
    let host = "secure.example.com";
    support::write_tls_site(&mut h, NS, host, "secure-tls");
    let (crt, key) = self_signed(&h.work(), host, "expiry");
    h.write("secret.yaml", &tls_secret(NS, "secure-tls", &crt, &key));
    h.start(&[]);

    let series = "portcullis_certificate_expiry_timestamp_seconds{secret=\"shop/secure-tls\"}";
    let expiry = h.metric(series);
    // `openssl req -days 2`: notAfter is two days from now.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let expected = now + 2.0 * 86_400.0;
    assert!(
        (expiry - expected).abs() < 3_600.0,
        "{series} = {expiry}, expected about {expected}"
    );

    // The Secret goes away (its Ingress stays, now without a certificate): so does the series.
    h.remove("secret.yaml");
    wait_until(APPLY_TIMEOUT, "the expiry series is removed", || {
        h.admin("/metrics").is_some_and(|a| {
            a.body
                .contains("# TYPE portcullis_certificate_expiry_timestamp_seconds gauge")
                && !a
                    .body
                    .contains("portcullis_certificate_expiry_timestamp_seconds{")
        })
    });
}

/// Sends a raw request to the admin endpoint and returns `(status, body)`.
fn admin_raw(h: &Harness, request: &str) -> (u16, String) {
    let addr = SocketAddr::from(([127, 0, 0, 1], h.admin_port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, body.to_string())
}

fn put_log_level(h: &Harness, filter: &str) -> (u16, String) {
    admin_raw(
        h,
        &format!(
            "PUT /debug/log-level HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{filter}",
            filter.len()
        ),
    )
}

/// Every line of the log that parsed as JSON, and those that did not.
fn json_lines(log: &str) -> (Vec<serde_json::Value>, Vec<String>) {
    let mut json = Vec::new();
    let mut other = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) if v.is_object() => json.push(v),
            _ => other.push(line.to_string()),
        }
    }
    (json, other)
}

#[test]
fn json_logs_and_log_level_changed_at_run_time() {
    let mut h = Harness::new();
    let web = h.backend(NS, "web");
    h.write("web.yaml", &web);
    h.write(
        "ingress.yaml",
        &ingress(
            NS,
            "web",
            &[route(Some("app.example.com"), "/", "Prefix", "web")],
            None,
            &[],
        ),
    );
    h.start(&["--log-format", "json"]);
    // A request through HAProxy makes it log one line (`log stdout`), passed on as `haproxy`.
    assert_eq!(h.who("app.example.com", "/"), "web");
    wait_until(APPLY_TIMEOUT, "HAProxy's request log line", || {
        json_lines(&h.log())
            .0
            .iter()
            .any(|v| v["target"] == "haproxy" && v["message"].as_str().is_some())
    });

    let (json, other) = json_lines(&h.log());
    assert!(
        other.is_empty(),
        "lines that are not JSON objects: {other:#?}"
    );
    for v in &json {
        for key in ["timestamp", "level", "target"] {
            assert!(v[key].is_string(), "no {key} in {v}");
        }
    }
    assert!(
        json.iter()
            .any(|v| v["level"] == "INFO" && v["message"] == "admin endpoint listening"),
        "{json:#?}"
    );

    // The filter in force, then a new one.
    let (status, body) = admin_raw(&h, "GET /debug/log-level HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    assert!(body.contains("info"), "{body}");
    let debug_lines = |h: &Harness| {
        json_lines(&h.log())
            .0
            .into_iter()
            .filter(|v| v["level"] == "DEBUG" && v["message"] == "admin request")
            .count()
    };
    assert_eq!(debug_lines(&h), 0);
    let (status, body) = put_log_level(&h, "portcullis=debug");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("portcullis=debug"), "{body}");
    assert!(
        json_lines(&h.log())
            .0
            .iter()
            .any(|v| v["message"] == "log filter changed"),
        "{}",
        h.log()
    );
    // Admin requests are logged at DEBUG: they show now.
    assert_eq!(h.admin("/healthz").unwrap().status, 200);
    wait_until(APPLY_TIMEOUT, "a DEBUG line", || debug_lines(&h) > 0);

    // An invalid filter is refused and the one in force stays.
    let (status, body) = put_log_level(&h, "portcullis=loud");
    assert_eq!(status, 400, "{body}");
    let (_, in_force) = admin_raw(&h, "GET /debug/log-level HTTP/1.1\r\n\r\n");
    assert!(in_force.contains("portcullis=debug"), "{in_force}");

    // Back to info: admin requests are not logged any more.
    let (status, _) = put_log_level(&h, "info");
    assert_eq!(status, 200);
    let before = debug_lines(&h);
    for _ in 0..3 {
        assert_eq!(h.admin("/healthz").unwrap().status, 200);
    }
    holds_for(Duration::from_millis(200), "no DEBUG lines at info", || {
        debug_lines(&h) == before
    });

    // Text is the default: a plain `run` logs no JSON.
    let mut t = Harness::new();
    t.start(&[]);
    let (json, other) = json_lines(&t.log());
    assert!(json.is_empty() && !other.is_empty(), "{}", t.log());
}
