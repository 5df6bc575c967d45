//! The Grafana dashboard and the Prometheus rules in deploy/observability parse, and every
//! metric they use is in the metrics table of docs/operations.md (which
//! tests/metrics_documented.rs holds equal to what `/metrics` exports), so neither can drift
//! from the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The metric names in the first column of the metrics table of docs/operations.md.
fn documented_metrics() -> BTreeSet<String> {
    let doc = read("docs/operations.md");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Metrics\n"))
        .expect("a `## Metrics` section in docs/operations.md");
    let names: BTreeSet<String> = section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('|').nth(1))
        .map(|cell| cell.trim().trim_matches('`').to_string())
        .collect();
    assert!(names.len() > 10, "too few metrics parsed: {names:?}");
    names
}

/// The `portcullis_*` names a PromQL expression uses, with the `_bucket`, `_sum` and `_count`
/// series of a histogram named by their family.
fn metrics_in(expr: &str, documented: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_name_byte(bytes[i - 1]);
        if starts_word && expr[i..].starts_with("portcullis_") {
            let end = expr[i..]
                .find(|c: char| !is_name_byte(c as u8) || !c.is_ascii())
                .map_or(expr.len(), |n| i + n);
            let name = &expr[i..end];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|base| documented.contains(*base))
                })
                .unwrap_or(name);
            out.insert(family.to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// Every string under an `expr` key, anywhere in the JSON.
fn exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// The undocumented metrics `exprs` use, each with the expression.
fn undocumented(exprs: &[String], documented: &BTreeSet<String>) -> Vec<String> {
    exprs
        .iter()
        .flat_map(|e| {
            metrics_in(e, documented)
                .into_iter()
                .filter(|m| !documented.contains(m))
                .map(move |m| format!("{m} in {e}"))
        })
        .collect()
}

#[test]
fn the_checker_finds_metric_names() {
    let documented: BTreeSet<String> = ["portcullis_a_seconds", "portcullis_b_total"]
        .map(String::from)
        .into();
    let found = metrics_in(
        "histogram_quantile(0.9, rate(portcullis_a_seconds_bucket{x=\"y\"}[5m])) \
         + portcullis_b_total + portcullis_c_total_count + my_portcullis_d",
        &documented,
    );
    let want: BTreeSet<String> = [
        "portcullis_a_seconds",
        "portcullis_b_total",
        "portcullis_c_total_count",
    ]
    .map(String::from)
    .into();
    assert_eq!(found, want);
    assert_eq!(
        undocumented(&["portcullis_nope > 1".to_string()], &documented),
        ["portcullis_nope in portcullis_nope > 1"]
    );
}

#[test]
fn dashboard_is_importable_and_uses_documented_metrics() {
    let text = read("deploy/observability/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "portcullis-overview");
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(dashboard["schemaVersion"].as_u64().is_some());
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(
            panel["title"].is_string(),
            "a panel without a title: {panel}"
        );
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{panel}");
        let id = panel["id"].as_u64().expect("a panel id");
        assert!(ids.insert(id), "panel id {id} is used twice");
        if panel["type"] != "row" {
            let targets = panel["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{}", panel["title"]);
            for t in targets {
                assert!(t["expr"].is_string(), "{}: {t}", panel["title"]);
                assert!(t["refId"].is_string(), "{}: {t}", panel["title"]);
            }
        }
    }

    let documented = documented_metrics();
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    let wrong = undocumented(&all, &documented);
    assert!(wrong.is_empty(), "undocumented metrics: {wrong:#?}");

    // What the dashboard is for.
    let used: BTreeSet<String> = all
        .iter()
        .flat_map(|e| metrics_in(e, &documented))
        .collect();
    for metric in [
        "portcullis_applies_total",
        "portcullis_reloads_total",
        "portcullis_reload_failures_total",
        "portcullis_event_to_applied_seconds",
        "portcullis_cluster_watch_stale_seconds",
        "portcullis_script_errors_total",
        "portcullis_input_diagnostics",
        "portcullis_certificate_expiry_timestamp_seconds",
        "portcullis_cluster_leader",
        "portcullis_ready",
    ] {
        assert!(used.contains(metric), "no panel shows {metric}");
    }
    assert!(
        all.iter().any(|e| e.contains("histogram_quantile(")
            && e.contains("portcullis_event_to_applied_seconds_bucket")),
        "no quantiles of the event-to-applied latency"
    );
}

#[test]
fn alert_rules_parse_and_use_documented_metrics() {
    let text = read("deploy/observability/prometheus-rules.yaml");
    let doc: serde_json::Value = serde_saphyr::from_str(&text).expect("the rules are YAML");
    // A PrometheusRule, or a plain Prometheus rules file.
    let groups = if doc["kind"].as_str() == Some("PrometheusRule") {
        assert_eq!(doc["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
        assert!(doc["metadata"]["name"].as_str().is_some());
        &doc["spec"]["groups"]
    } else {
        &doc["groups"]
    };
    let groups = groups.as_array().expect("rule groups");
    assert!(!groups.is_empty());

    let documented = documented_metrics();
    let mut alerts = std::collections::BTreeMap::new();
    let mut all = Vec::new();
    for group in groups {
        assert!(group["name"].as_str().is_some(), "a group without a name");
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().expect("an alert name");
            let expr = rule["expr"].as_str().expect("an expr").to_string();
            assert!(
                rule["labels"]["severity"].as_str().is_some(),
                "{name} has no severity"
            );
            assert!(
                rule["annotations"]["summary"].as_str().is_some(),
                "{name} has no summary"
            );
            if let Some(duration) = rule["for"].as_str() {
                assert!(
                    duration.ends_with(['s', 'm', 'h']),
                    "{name}: for: {duration}"
                );
            }
            all.push(expr.clone());
            assert!(
                alerts.insert(name.to_string(), expr).is_none(),
                "{name} twice"
            );
        }
    }
    let wrong = undocumented(&all, &documented);
    assert!(wrong.is_empty(), "undocumented metrics: {wrong:#?}");

    // The alerts the operator needs, on the metrics and thresholds that define them.
    let has = |alert: &str, needle: &str| {
        let expr = alerts
            .get(alert)
            .unwrap_or_else(|| panic!("no alert {alert}"));
        assert!(expr.contains(needle), "{alert}: {expr} lacks {needle}");
    };
    has(
        "PortcullisReloadFailures",
        "portcullis_reload_failures_total",
    );
    has(
        "PortcullisWatchStale",
        "portcullis_cluster_watch_stale_seconds) > 60",
    );
    has("PortcullisScriptErrors", "portcullis_script_errors_total");
    has(
        "PortcullisCertificateExpiringSoon",
        "portcullis_certificate_expiry_timestamp_seconds",
    );
    has("PortcullisCertificateExpiringSoon", "< 14 * 86400");
    has("PortcullisNotReady", "portcullis_ready");
}
