//! Prometheus metrics: the controller's metric set on prometheus-client's typed families,
//! exposed in the Prometheus text format 0.0.4.
//!
//! A thin layer keeps call sites short (`metrics.applies.inc(&["reload"])`): each family knows
//! its label names, and an observation whose label count does not match them is dropped and
//! counted in `portcullis_metrics_errors_total` instead of panicking. Families are registered as
//! collectors rather than as plain metrics, for two reasons: a family with no series yet still
//! shows its `# HELP` and `# TYPE` lines (prometheus-client leaves empty registered metrics out,
//! and dashboards and the documented contract expect every family from the start), and the help
//! text is exported exactly as written (registration would append a full stop).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// The `Content-Type` of what [`Metrics::render`] writes: the Prometheus text format 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Name of the registry's own counter of dropped observations and refused registrations.
pub const ERRORS_METRIC: &str = "portcullis_metrics_errors_total";

/// Histogram buckets (seconds) for the controller's latency metrics.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A series' labels, names with values, in the family's label order.
type LabelSet = Vec<(String, String)>;

/// A float gauge (prometheus-client stores its bits in an `AtomicU64`).
type FloatGauge = Gauge<f64, AtomicU64>;

/// What a family exports besides its series: the contract `docs/operations.md` documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The exposed name (`_total` included for counters).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: String,
    /// The `# HELP` text.
    pub help: String,
    /// Label names, in order (`le` of histogram buckets not included).
    pub labels: Vec<String>,
}

/// A set of metric families rendered together. Families are added while it is built
/// (`&mut self`); recording through their handles needs no access to the registry.
#[derive(Debug)]
pub struct Registry {
    inner: prometheus_client::registry::Registry,
    described: Vec<Description>,
    names: BTreeSet<String>,
    errors: Counter,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// An empty registry; it always exports [`ERRORS_METRIC`].
    pub fn new() -> Self {
        let family = Family::<LabelSet, Counter>::default();
        let errors = family.get_or_create_owned(&Vec::new());
        let mut registry = Self {
            inner: prometheus_client::registry::Registry::default(),
            described: Vec::new(),
            names: BTreeSet::new(),
            errors,
        };
        registry.register(
            ERRORS_METRIC,
            "Metric observations dropped because of a label count mismatch, and metrics refused at registration.",
            &[],
            family,
        );
        registry
    }

    /// Registers a counter family. The name ends in `_total`, as exposed.
    pub fn counter_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        CounterVec(self.register(name, help, labels, Family::default()))
    }

    /// Registers a gauge family.
    pub fn gauge_vec(&mut self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        GaugeVec(self.register(name, help, labels, Family::default()))
    }

    /// Registers a histogram family with the given bucket upper bounds.
    ///
    /// Bounds are sorted and deduplicated; non-finite ones are dropped because `+Inf` is
    /// always added.
    pub fn histogram_vec(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> HistogramVec {
        let mut bounds: Vec<f64> = buckets.iter().copied().filter(|b| b.is_finite()).collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let family = Family::new_with_constructor(Buckets(bounds.into()));
        HistogramVec(self.register(name, help, labels, family))
    }

    /// Observations dropped and registrations refused so far.
    pub fn errors(&self) -> u64 {
        self.errors.get()
    }

    /// What every family exports, in registration order.
    pub fn describe(&self) -> &[Description] {
        &self.described
    }

    /// Every family in the text exposition format 0.0.4, in registration order.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail, nor can the families' encoders.
        if let Err(e) = prometheus_text::encode(&mut out, &self.inner) {
            tracing::warn!(error = %e, "metrics not rendered completely");
        }
        out
    }

    /// Wraps `family` and adds it to the registry. An invalid or duplicate name (or a counter
    /// name without `_total`) is counted as an error and the family stays detached: it records
    /// but is never rendered, so a mistake cannot corrupt the exposition.
    fn register<M, C>(
        &mut self,
        name: &str,
        help: &str,
        labels: &[&str],
        family: Family<LabelSet, M, C>,
    ) -> Arc<Shared<M, C>>
    where
        C: MetricConstructor<M>,
        Shared<M, C>: Collector,
        Family<LabelSet, M, C>: EncodeMetric,
    {
        let kind = family.metric_type();
        // prometheus-client writes a counter's name with `_total` appended.
        let stem = match kind {
            MetricType::Counter => name.strip_suffix("_total"),
            _ => Some(name),
        };
        let shared = Arc::new(Shared {
            stem: stem.unwrap_or(name).to_owned(),
            help: help.to_owned(),
            label_names: labels.iter().map(|l| (*l).to_owned()).collect(),
            family,
            whole: RwLock::new(()),
            errors: self.errors.clone(),
        });
        // A family without labels has exactly one series; export it (at zero) from the
        // start so rate() and absent() work before the first event.
        if labels.is_empty() {
            drop(shared.family.get_or_create(&Vec::new()));
        }
        let valid = stem.is_some_and(|s| !s.is_empty())
            && is_valid_name(name)
            && labels.iter().all(|l| is_valid_label_name(l));
        if !valid || !self.names.insert(name.to_owned()) {
            self.errors.inc();
            tracing::warn!(
                metric = name,
                "metric not registered: invalid or duplicate name"
            );
        } else {
            self.described.push(Description {
                name: name.to_owned(),
                kind: kind.as_str().to_owned(),
                help: help.to_owned(),
                labels: shared.label_names.clone(),
            });
            self.inner.register_collector(Box::new(shared.clone()));
        }
        shared
    }
}

/// One registered family: its metadata, its series, and the checks of the thin layer.
struct Shared<M, C> {
    /// The name given to the encoder (a counter's without `_total`).
    stem: String,
    help: String,
    label_names: Vec<String>,
    family: Family<LabelSet, M, C>,
    /// Held for writing while every series is replaced, and for reading while the family is
    /// encoded, so a scrape never sees half of a replacement.
    whole: RwLock<()>,
    errors: Counter,
}

impl<M, C> fmt::Debug for Shared<M, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Family")
            .field("name", &self.stem)
            .field("labels", &self.label_names)
            .finish()
    }
}

impl<M, C> Collector for Shared<M, C>
where
    M: Send + Sync + 'static,
    C: Send + Sync + 'static,
    Family<LabelSet, M, C>: EncodeMetric,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let _whole = self.whole.read().unwrap_or_else(PoisonError::into_inner);
        let metric =
            encoder.encode_descriptor(&self.stem, &self.help, None, self.family.metric_type())?;
        self.family.encode(metric)
    }
}

impl<M, C> Shared<M, C> {
    /// The label set for `values`, or `None` (counted as an error) when their number does
    /// not match the family's label names.
    fn labels(&self, values: &[&str]) -> Option<LabelSet> {
        let labels = self.lookup(values);
        if labels.is_none() {
            self.errors.inc();
            // debug, not warn: a wrong call site would otherwise flood the log on every event.
            tracing::debug!(
                metric = %self.stem,
                expected = self.label_names.len(),
                got = values.len(),
                "metric observation dropped: label count mismatch"
            );
        }
        labels
    }

    /// The label set for `values`, for reading: a mismatch is simply no series.
    fn lookup(&self, values: &[&str]) -> Option<LabelSet> {
        (values.len() == self.label_names.len()).then(|| {
            self.label_names
                .iter()
                .zip(values)
                .map(|(name, value)| (name.clone(), (*value).to_owned()))
                .collect()
        })
    }
}

/// Creates a family's histograms with its bucket bounds.
#[derive(Debug, Clone)]
struct Buckets(Arc<[f64]>);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// A monotonically increasing count per label set.
#[derive(Debug, Clone)]
pub struct CounterVec(Arc<Shared<Counter, fn() -> Counter>>);

impl CounterVec {
    /// Adds one.
    pub fn inc(&self, labels: &[&str]) {
        self.inc_by(labels, 1);
    }

    /// Adds `n`.
    pub fn inc_by(&self, labels: &[&str], n: u64) {
        if let Some(labels) = self.0.labels(labels) {
            self.0.family.get_or_create(&labels).inc_by(n);
        }
    }

    /// Exports the series at zero before its first event.
    pub fn init(&self, labels: &[&str]) {
        if let Some(labels) = self.0.labels(labels) {
            drop(self.0.family.get_or_create(&labels));
        }
    }

    /// The current count; 0 for a series never touched.
    pub fn get(&self, labels: &[&str]) -> u64 {
        self.0
            .lookup(labels)
            .and_then(|l| self.0.family.get(&l).map(|c| c.get()))
            .unwrap_or(0)
    }
}

/// A value that can go up and down, per label set.
#[derive(Debug, Clone)]
pub struct GaugeVec(Arc<Shared<FloatGauge, fn() -> FloatGauge>>);

impl GaugeVec {
    /// Sets the value.
    pub fn set(&self, labels: &[&str], value: f64) {
        if let Some(labels) = self.0.labels(labels) {
            self.0.family.get_or_create(&labels).set(value);
        }
    }

    /// The current value; 0 for a series never set.
    pub fn get(&self, labels: &[&str]) -> f64 {
        self.0
            .lookup(labels)
            .and_then(|l| self.0.family.get(&l).map(|g| g.get()))
            .unwrap_or(0.0)
    }

    /// Stops exporting the series for `labels` (nothing happens if it does not exist).
    pub fn remove(&self, labels: &[&str]) {
        if let Some(labels) = self.0.lookup(labels) {
            self.0.family.remove(&labels);
        }
    }

    /// Makes the family hold exactly `series`: each is set, every other series is removed, and
    /// a scrape sees either the old set or the new one. Label sets of the wrong length are
    /// dropped and counted as errors.
    pub fn replace_all(&self, series: &[(Vec<String>, f64)]) {
        let _whole = self.0.whole.write().unwrap_or_else(PoisonError::into_inner);
        self.0.family.clear();
        for (values, value) in series {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            if let Some(labels) = self.0.labels(&values) {
                self.0.family.get_or_create(&labels).set(*value);
            }
        }
    }
}

/// Observations counted into buckets, per label set.
#[derive(Debug, Clone)]
pub struct HistogramVec(Arc<Shared<Histogram, Buckets>>);

impl HistogramVec {
    /// Records one observation.
    pub fn observe(&self, labels: &[&str], value: f64) {
        if let Some(labels) = self.0.labels(labels) {
            self.0.family.get_or_create(&labels).observe(value);
        }
    }
}

/// The controller's metrics. Names and labels are part of the product: dashboards and alerts
/// depend on them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `portcullis_reloads_total{reason}`
    pub reloads: CounterVec,
    /// `portcullis_reload_failures_total{stage}`, stage = `check`, `reload` or `verify`.
    pub reload_failures: CounterVec,
    /// `portcullis_runtime_commands_total{command,outcome}`, outcome = `ok` or `error`.
    pub runtime_commands: CounterVec,
    /// `portcullis_config_check_failures_total`
    pub config_check_failures: CounterVec,
    /// `portcullis_apply_duration_seconds`
    pub apply_duration: HistogramVec,
    /// `portcullis_event_to_applied_seconds`
    pub event_to_applied: HistogramVec,
    /// `portcullis_script_errors_total{file}`
    pub script_errors: CounterVec,
    /// `portcullis_template_errors_total`
    pub template_errors: CounterVec,
    /// `portcullis_input_diagnostics{severity}`
    pub input_diagnostics: GaugeVec,
    /// `portcullis_applies_total{outcome}`, outcome = `runtime`, `reload`, `unchanged` or `failed`.
    pub applies: CounterVec,
    /// `portcullis_pipeline_runs_total{path}`, path = `full`, `parts` or `endpoints`.
    pub pipeline_runs: CounterVec,
    /// `portcullis_pipeline_duration_seconds{path}`
    pub pipeline_duration: HistogramVec,
    /// `portcullis_last_applied_timestamp_seconds`
    pub last_applied_timestamp: GaugeVec,
    /// `portcullis_ready`, 1 or 0.
    pub ready: GaugeVec,
    /// `portcullis_cluster_watch_stale_seconds{watch}`: how long a watch has been failing.
    pub watch_stale: GaugeVec,
    /// `portcullis_cluster_watch_errors_total{watch}`
    pub watch_errors: GaugeVec,
    /// `portcullis_cluster_leader`, 1 on the replica that writes status and Events.
    pub leader: GaugeVec,
    /// `portcullis_cluster_status_writes_total{outcome}`, outcome = `ok` or `error`.
    pub status_writes: CounterVec,
    /// `portcullis_cluster_events_total{outcome}`, outcome = `emitted`, `suppressed` or `failed`.
    pub events: CounterVec,
    /// `portcullis_certificate_expiry_timestamp_seconds{secret}`: the `notAfter` of each
    /// certificate in the configuration in force, secret = `namespace/name`.
    pub certificate_expiry: GaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric; series with a known, closed set of label values start at zero.
    pub fn new() -> Self {
        let mut r = Registry::new();
        let m = Self {
            reloads: r.counter_vec(
                "portcullis_reloads_total",
                "HAProxy reloads performed, by reason.",
                &["reason"],
            ),
            reload_failures: r.counter_vec(
                "portcullis_reload_failures_total",
                "HAProxy reloads that failed, by stage (check, reload, verify).",
                &["stage"],
            ),
            runtime_commands: r.counter_vec(
                "portcullis_runtime_commands_total",
                "HAProxy runtime API commands sent, by command and outcome (ok, error).",
                &["command", "outcome"],
            ),
            config_check_failures: r.counter_vec(
                "portcullis_config_check_failures_total",
                "Rendered configurations rejected by haproxy -c.",
                &[],
            ),
            apply_duration: r.histogram_vec(
                "portcullis_apply_duration_seconds",
                "Time to apply a new configuration to HAProxy.",
                &[],
                &DURATION_BUCKETS,
            ),
            event_to_applied: r.histogram_vec(
                "portcullis_event_to_applied_seconds",
                "Time from a cluster event to its configuration being applied.",
                &[],
                &DURATION_BUCKETS,
            ),
            script_errors: r.counter_vec(
                "portcullis_script_errors_total",
                "Policy script failures, by script file.",
                &["file"],
            ),
            template_errors: r.counter_vec(
                "portcullis_template_errors_total",
                "Template rendering failures.",
                &[],
            ),
            input_diagnostics: r.gauge_vec(
                "portcullis_input_diagnostics",
                "Diagnostics reported by the last pipeline run, by severity.",
                &["severity"],
            ),
            applies: r.counter_vec(
                "portcullis_applies_total",
                "Configuration applies, by outcome (runtime, reload, unchanged, failed).",
                &["outcome"],
            ),
            pipeline_runs: r.counter_vec(
                "portcullis_pipeline_runs_total",
                "Pipeline runs, by path (full; parts: unchanged Ingresses and backends taken from the last run; endpoints: only the backends of changed endpoints redone).",
                &["path"],
            ),
            pipeline_duration: r.histogram_vec(
                "portcullis_pipeline_duration_seconds",
                "Time of one pipeline run (translate and render), by path (full, parts or endpoints).",
                &["path"],
                &DURATION_BUCKETS,
            ),
            last_applied_timestamp: r.gauge_vec(
                "portcullis_last_applied_timestamp_seconds",
                "Unix time of the last successful apply.",
                &[],
            ),
            ready: r.gauge_vec(
                "portcullis_ready",
                "1 when the controller is ready, 0 otherwise.",
                &[],
            ),
            watch_stale: r.gauge_vec(
                "portcullis_cluster_watch_stale_seconds",
                "Seconds a cluster watch has been failing (0 while healthy): the data served may be this old.",
                &["watch"],
            ),
            watch_errors: r.gauge_vec(
                "portcullis_cluster_watch_errors_total",
                "Errors seen by a cluster watch since start (each is retried with backoff).",
                &["watch"],
            ),
            leader: r.gauge_vec(
                "portcullis_cluster_leader",
                "1 on the replica holding the Lease (it writes Ingress status and Events).",
                &[],
            ),
            status_writes: r.counter_vec(
                "portcullis_cluster_status_writes_total",
                "Ingress status updates written, by outcome (ok, error).",
                &["outcome"],
            ),
            events: r.counter_vec(
                "portcullis_cluster_events_total",
                "Kubernetes Events for rejected settings, by outcome (emitted, suppressed, failed).",
                &["outcome"],
            ),
            certificate_expiry: r.gauge_vec(
                "portcullis_certificate_expiry_timestamp_seconds",
                "Unix time at which each certificate in the configuration in force expires (its notAfter), by Secret (namespace/name).",
                &["secret"],
            ),
            registry: r,
        };
        for outcome in ["ok", "error"] {
            m.status_writes.init(&[outcome]);
        }
        for outcome in ["emitted", "suppressed", "failed"] {
            m.events.init(&[outcome]);
        }
        for stage in ["check", "reload", "verify"] {
            m.reload_failures.init(&[stage]);
        }
        for outcome in ["runtime", "reload", "unchanged", "failed"] {
            m.applies.init(&[outcome]);
        }
        for path in crate::pipeline::RunReport::PATHS {
            m.pipeline_runs.init(&[path]);
        }
        for severity in ["warning", "error"] {
            m.input_diagnostics.set(&[severity], 0.0);
        }
        m
    }

    /// All metrics in the text exposition format 0.0.4.
    pub fn render(&self) -> String {
        self.registry.render()
    }

    /// What every family exports: names, types, help texts and label names.
    pub fn describe(&self) -> &[Description] {
        self.registry.describe()
    }

    /// Observations dropped because of a label mismatch, and registrations refused.
    pub fn errors(&self) -> u64 {
        self.registry.errors()
    }
}

fn is_valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

/// Label names are metric names without `:`; `le` is reserved for histogram buckets and
/// `__` prefixes for Prometheus itself.
fn is_valid_label_name(name: &str) -> bool {
    is_valid_name(name) && !name.contains(':') && !name.starts_with("__") && name != "le"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of one series in an exposition, if present.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn renders_small_registry_exactly() {
        let mut r = Registry::new();
        let requests = r.counter_vec(
            "test_requests_total",
            "Requests served.\nBy \\ code.",
            &["code", "path"],
        );
        requests.inc(&["200", "/a\"b\\c\nd"]);
        requests.inc_by(&["200", "/a\"b\\c\nd"], 2);
        requests.inc(&["200"]); // wrong label count: dropped and counted
        let latency = r.histogram_vec("test_latency_seconds", "Latency.", &[], &[1.0, 0.25]);
        for v in [0.0625, 0.25, 0.5, 4.0] {
            latency.observe(&[], v);
        }
        let temp = r.gauge_vec("test_temperature", "Temperature.", &["room"]);
        temp.set(&["b"], 2.5);
        r.gauge_vec("test_unused", "Never set.", &["x"]);

        let expected = r#"# HELP portcullis_metrics_errors_total Metric observations dropped because of a label count mismatch, and metrics refused at registration.
# TYPE portcullis_metrics_errors_total counter
portcullis_metrics_errors_total 1
# HELP test_requests_total Requests served.\nBy \\ code.
# TYPE test_requests_total counter
test_requests_total{code="200",path="/a\"b\\c\nd"} 3
# HELP test_latency_seconds Latency.
# TYPE test_latency_seconds histogram
test_latency_seconds_bucket{le="0.25"} 2
test_latency_seconds_bucket{le="1"} 3
test_latency_seconds_bucket{le="+Inf"} 4
test_latency_seconds_sum 4.8125
test_latency_seconds_count 4
# HELP test_temperature Temperature.
# TYPE test_temperature gauge
test_temperature{room="b"} 2.5
# HELP test_unused Never set.
# TYPE test_unused gauge
"#;
        assert_eq!(r.render(), expected);
    }

    #[test]
    fn histogram_with_labels_is_cumulative() {
        let mut r = Registry::new();
        let h = r.histogram_vec("h_seconds", "H.", &["op"], &[0.1, 1.0]);
        h.observe(&["x"], 0.1); // on the bound: counts in that bucket
        h.observe(&["x"], 0.1);
        h.observe(&["x"], 20.0);
        h.observe(&["x", "y"], 1.0); // dropped
        let text = r.render();
        for (series, value) in [
            ("h_seconds_bucket{op=\"x\",le=\"0.1\"}", 2.0),
            ("h_seconds_bucket{op=\"x\",le=\"1\"}", 2.0),
            ("h_seconds_bucket{op=\"x\",le=\"+Inf\"}", 3.0),
            ("h_seconds_count{op=\"x\"}", 3.0),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series}\n{text}");
        }
        let sum = sample(&text, "h_seconds_sum{op=\"x\"}").unwrap_or_default();
        assert!((sum - 20.2).abs() < 1e-9, "{text}");
        assert!(!text.contains("op=\"y\""), "{text}");
        assert_eq!(r.errors(), 1);
    }

    #[test]
    fn getters_and_mismatches() {
        let mut r = Registry::new();
        let c = r.counter_vec("c_total", "C.", &["a"]);
        c.inc(&["x"]);
        c.inc_by(&["x"], 4);
        c.inc(&[]);
        c.inc(&["x", "y"]);
        assert_eq!(c.get(&["x"]), 5);
        assert_eq!(c.get(&["nope"]), 0);
        assert_eq!(c.get(&[]), 0);
        let g = r.gauge_vec("g", "G.", &[]);
        assert_eq!(g.get(&[]), 0.0);
        g.set(&[], 7.5);
        assert_eq!(g.get(&[]), 7.5);
        g.set(&["extra"], 1.0);
        assert_eq!(r.errors(), 3);
        assert_eq!(sample(&r.render(), ERRORS_METRIC), Some(3.0));
    }

    #[test]
    fn bad_registrations_are_counted_not_rendered() {
        let mut r = Registry::new();
        let first = r.counter_vec("dup_total", "First.", &[]);
        let second = r.counter_vec("dup_total", "Second.", &[]);
        let bad = r.gauge_vec("bad name", "Bad.", &[]);
        let bad_label = r.gauge_vec("bad_label", "Bad.", &["le"]);
        // The encoder would expose `bad_count_total`: a different name than the one given.
        let bad_counter = r.counter_vec("bad_count", "Bad.", &[]);
        let bare_suffix = r.counter_vec("_total", "Bad.", &[]);
        first.inc(&[]);
        second.inc_by(&[], 10);
        bad.set(&[], 1.0);
        bad_label.set(&["1"], 1.0);
        bad_counter.inc(&[]);
        bare_suffix.inc(&[]);
        let text = r.render();
        assert_eq!(sample(&text, "dup_total"), Some(1.0), "{text}");
        assert!(!text.contains("Second."), "{text}");
        assert!(!text.contains("bad"), "{text}");
        assert!(!text.contains("\n_total"), "{text}");
        assert_eq!(r.errors(), 5);
        let names: Vec<&str> = r.describe().iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, [ERRORS_METRIC, "dup_total"]);
    }

    #[test]
    fn gauge_series_can_be_removed_and_replaced() {
        let mut r = Registry::new();
        let g = r.gauge_vec("expiry", "E.", &["secret"]);
        g.set(&["a/x"], 1.0);
        g.set(&["a/y"], 2.0);
        g.remove(&["a/x"]);
        g.remove(&["nope"]);
        g.remove(&[]);
        let text = r.render();
        assert!(!text.contains("a/x"), "{text}");
        assert_eq!(sample(&text, "expiry{secret=\"a/y\"}"), Some(2.0), "{text}");
        g.replace_all(&[
            (vec!["b/z".to_string()], 3.0),
            (vec!["a/y".to_string()], 4.0),
            (vec![], 5.0), // wrong label count: dropped and counted
        ]);
        let text = r.render();
        assert_eq!(sample(&text, "expiry{secret=\"a/y\"}"), Some(4.0), "{text}");
        assert_eq!(sample(&text, "expiry{secret=\"b/z\"}"), Some(3.0), "{text}");
        assert_eq!(text.matches("expiry{").count(), 2, "{text}");
        g.replace_all(&[]);
        let text = r.render();
        assert!(text.contains("# TYPE expiry gauge\n"), "{text}");
        assert!(!text.contains("expiry{"), "{text}");
        assert_eq!(r.errors(), 1);
    }

    #[test]
    fn a_scrape_never_sees_half_a_replacement() {
        let mut r = Registry::new();
        let g = r.gauge_vec("expiry", "E.", &["secret"]);
        let set = |value: f64| -> Vec<(Vec<String>, f64)> {
            (0..50)
                .map(|i| (vec![format!("ns/s{i}-{value}")], value))
                .collect()
        };
        let (a, b) = (set(1.0), set(2.0));
        g.replace_all(&a);
        // The handle moves to the writer; the registry keeps rendering the same family.
        let writer = std::thread::spawn(move || {
            for round in 0..400 {
                g.replace_all(if round % 2 == 0 { &b } else { &a });
            }
        });
        for _ in 0..400 {
            let text = r.render();
            let values: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("expiry{"))
                .filter_map(|l| l.rsplit(' ').next())
                .collect();
            assert_eq!(values.len(), 50, "{text}");
            assert!(values.iter().all(|v| *v == values[0]), "{text}");
        }
        assert!(writer.join().is_ok());
    }

    #[test]
    fn metrics_render_every_product_metric() {
        let m = Metrics::new();
        m.reloads.inc(&["endpoints"]);
        m.runtime_commands.inc(&["set server", "ok"]);
        m.script_errors.inc(&["policy/10-auth.rhai"]);
        let text = m.render();
        let exported: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
            .collect();
        let described: Vec<(&str, &str)> = m
            .describe()
            .iter()
            .map(|d| (d.name.as_str(), d.kind.as_str()))
            .collect();
        assert_eq!(exported, described);
        for name in [
            "portcullis_reloads_total",
            "portcullis_reload_failures_total",
            "portcullis_runtime_commands_total",
            "portcullis_config_check_failures_total",
            "portcullis_apply_duration_seconds",
            "portcullis_event_to_applied_seconds",
            "portcullis_script_errors_total",
            "portcullis_template_errors_total",
            "portcullis_input_diagnostics",
            "portcullis_applies_total",
            "portcullis_last_applied_timestamp_seconds",
            "portcullis_ready",
            "portcullis_certificate_expiry_timestamp_seconds",
            ERRORS_METRIC,
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} missing:\n{text}"
            );
        }
        // Closed label sets and label-less series are exported before any event.
        for series in [
            "portcullis_reload_failures_total{stage=\"verify\"}",
            "portcullis_applies_total{outcome=\"unchanged\"}",
            "portcullis_input_diagnostics{severity=\"error\"}",
            "portcullis_config_check_failures_total",
            "portcullis_ready",
            "portcullis_apply_duration_seconds_bucket{le=\"0.001\"}",
            "portcullis_apply_duration_seconds_bucket{le=\"10\"}",
        ] {
            assert_eq!(sample(&text, series), Some(0.0), "{series}\n{text}");
        }
        assert_eq!(
            sample(
                &text,
                "portcullis_runtime_commands_total{command=\"set server\",outcome=\"ok\"}"
            ),
            Some(1.0)
        );
        // Families without a series yet are announced all the same.
        assert!(text.contains("# TYPE portcullis_cluster_watch_stale_seconds gauge\n"));
        assert_eq!(m.errors(), 0);
    }
}
