//! Prometheus metrics: a small thread-safe registry and the controller's own metric set.
//!
//! No metrics crate: counters, gauges and histograms keyed by label values, rendered in the
//! Prometheus text exposition format 0.0.4. Output is deterministic (families sorted by name,
//! series sorted by label values) so it can be compared byte for byte in tests.
//!
//! Recording never panics. An observation whose label count does not match the family's label
//! names is dropped and counted in `portcullis_metrics_errors_total` instead.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Name of the registry's own counter of dropped observations and refused registrations.
pub const ERRORS_METRIC: &str = "portcullis_metrics_errors_total";

/// Histogram buckets (seconds) for the controller's latency metrics.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A set of metric families rendered together.
///
/// Cloning is cheap and yields a handle to the same registry.
#[derive(Clone)]
pub struct Registry {
    families: Arc<Mutex<Vec<Arc<dyn Collect>>>>,
    errors: Arc<AtomicU64>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = lock(&self.families)
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
        f.debug_struct("Registry")
            .field("families", &names)
            .field("errors", &self.errors())
            .finish()
    }
}

impl Registry {
    /// An empty registry; it always exports [`ERRORS_METRIC`].
    pub fn new() -> Self {
        let errors = Arc::new(AtomicU64::new(0));
        let own: Arc<dyn Collect> = Arc::new(ErrorsCollector(errors.clone()));
        Self {
            families: Arc::new(Mutex::new(vec![own])),
            errors,
        }
    }

    /// Registers a counter family.
    pub fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> CounterVec {
        CounterVec(self.register(name, help, labels, ()))
    }

    /// Registers a gauge family.
    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        GaugeVec(self.register(name, help, labels, ()))
    }

    /// Registers a histogram family with the given bucket upper bounds.
    ///
    /// Bounds are sorted and deduplicated; non-finite ones are dropped because `+Inf` is
    /// always added.
    pub fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> HistogramVec {
        let mut bounds: Vec<f64> = buckets.iter().copied().filter(|b| b.is_finite()).collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        HistogramVec(self.register(name, help, labels, bounds.into()))
    }

    /// Observations dropped and registrations refused so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Every family in the text exposition format 0.0.4.
    pub fn render(&self) -> String {
        // Snapshot the family list so rendering does not hold the registry lock.
        let mut families: Vec<Arc<dyn Collect>> = lock(&self.families).clone();
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = String::new();
        for family in families {
            family.collect(&mut out);
        }
        out
    }

    /// Creates a family and adds it to the registry. An invalid or duplicate name is counted
    /// as an error and the family stays detached: it records but is never rendered, so a
    /// mistake cannot corrupt the exposition.
    fn register<S: Series>(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        config: S::Config,
    ) -> Arc<Family<S>> {
        let family = Arc::new(Family::<S> {
            name: name.to_owned(),
            help: help.to_owned(),
            label_names: labels.iter().map(|l| (*l).to_owned()).collect(),
            config,
            series: Mutex::new(BTreeMap::new()),
            errors: self.errors.clone(),
        });
        // A family without labels has exactly one series; export it (at zero) from the
        // start so rate() and absent() work before the first event.
        if labels.is_empty() {
            family.update(&[], |_| {});
        }
        let valid = is_valid_name(name) && labels.iter().all(|l| is_valid_label_name(l));
        let mut families = lock(&self.families);
        if !valid || families.iter().any(|f| f.name() == name) {
            drop(families);
            self.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                metric = name,
                "metric not registered: invalid or duplicate name"
            );
        } else {
            families.push(family.clone());
        }
        family
    }
}

/// A monotonically increasing count per label set.
#[derive(Clone)]
pub struct CounterVec(Arc<Family<u64>>);

impl CounterVec {
    /// Adds one.
    pub fn inc(&self, labels: &[&str]) {
        self.inc_by(labels, 1);
    }

    /// Adds `n`.
    pub fn inc_by(&self, labels: &[&str], n: u64) {
        self.0.update(labels, |v| *v = v.saturating_add(n));
    }

    /// Exports the series at zero before its first event.
    pub fn init(&self, labels: &[&str]) {
        self.0.update(labels, |_| {});
    }

    /// The current count; 0 for a series never touched.
    pub fn get(&self, labels: &[&str]) -> u64 {
        self.0.read(labels, |v| *v).unwrap_or(0)
    }
}

/// A value that can go up and down, per label set.
#[derive(Clone)]
pub struct GaugeVec(Arc<Family<f64>>);

impl GaugeVec {
    /// Sets the value.
    pub fn set(&self, labels: &[&str], value: f64) {
        self.0.update(labels, |v| *v = value);
    }

    /// The current value; 0 for a series never set.
    pub fn get(&self, labels: &[&str]) -> f64 {
        self.0.read(labels, |v| *v).unwrap_or(0.0)
    }

    /// Stops exporting the series for `labels` (nothing happens if it does not exist).
    pub fn remove(&self, labels: &[&str]) {
        self.0.remove(labels);
    }

    /// Makes the family hold exactly `series`: each is set, every other series is removed.
    /// Label sets of the wrong length are dropped and counted as errors.
    pub fn replace_all(&self, series: &[(Vec<String>, f64)]) {
        self.0.replace_all(series);
    }

    /// The label values of every series, sorted.
    pub fn label_sets(&self) -> Vec<Vec<String>> {
        lock(&self.0.series).keys().cloned().collect()
    }
}

/// Observations counted into buckets, per label set.
#[derive(Clone)]
pub struct HistogramVec(Arc<Family<Histogram>>);

impl HistogramVec {
    /// Records one observation.
    pub fn observe(&self, labels: &[&str], value: f64) {
        self.0.update(labels, |h| h.observe(value));
    }

    /// Number of observations; 0 for a series never touched.
    pub fn count(&self, labels: &[&str]) -> u64 {
        self.0.read(labels, |h| h.count).unwrap_or(0)
    }

    /// Sum of observations; 0 for a series never touched.
    pub fn sum(&self, labels: &[&str]) -> f64 {
        self.0.read(labels, |h| h.sum).unwrap_or(0.0)
    }
}

macro_rules! debug_by_name {
    ($($ty:ident),*) => {$(
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($ty)).field(&self.0.name).finish()
            }
        }
    )*};
}
debug_by_name!(CounterVec, GaugeVec, HistogramVec);

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
        let r = Registry::new();
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
        for path in ["full", "parts", "endpoints"] {
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

    /// Observations dropped because of a label mismatch, and registrations refused.
    pub fn errors(&self) -> u64 {
        self.registry.errors()
    }
}

/// One metric family: metadata plus its series keyed by label values.
struct Family<S: Series> {
    name: String,
    help: String,
    label_names: Vec<String>,
    config: S::Config,
    series: Mutex<BTreeMap<Vec<String>, S>>,
    errors: Arc<AtomicU64>,
}

impl<S: Series> Family<S> {
    /// Applies `f` to the series for `labels`, creating it if needed.
    fn update(&self, labels: &[&str], f: impl FnOnce(&mut S)) {
        if labels.len() != self.label_names.len() {
            self.errors.fetch_add(1, Ordering::Relaxed);
            // debug, not warn: a wrong call site would otherwise flood the log on every event.
            tracing::debug!(
                metric = %self.name,
                expected = self.label_names.len(),
                got = labels.len(),
                "metric observation dropped: label count mismatch"
            );
            return;
        }
        let key: Vec<String> = labels.iter().map(|l| (*l).to_owned()).collect();
        let mut series = lock(&self.series);
        let value = series.entry(key).or_insert_with(|| S::new(&self.config));
        f(value);
    }

    fn remove(&self, labels: &[&str]) {
        lock(&self.series).retain(|k, _| !k.iter().map(String::as_str).eq(labels.iter().copied()));
    }

    fn read<R>(&self, labels: &[&str], f: impl FnOnce(&S) -> R) -> Option<R> {
        let series = lock(&self.series);
        series
            .iter()
            .find(|(k, _)| k.iter().map(String::as_str).eq(labels.iter().copied()))
            .map(|(_, v)| f(v))
    }
}

impl Family<f64> {
    /// Replaces every series at once, so a scrape never sees half of an update.
    fn replace_all(&self, series: &[(Vec<String>, f64)]) {
        let mut next = BTreeMap::new();
        for (labels, value) in series {
            if labels.len() == self.label_names.len() {
                next.insert(labels.clone(), *value);
            } else {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        *lock(&self.series) = next;
    }
}

/// What the registry needs from a family: its name and its text.
trait Collect: Send + Sync {
    fn name(&self) -> &str;
    fn collect(&self, out: &mut String);
}

impl<S: Series> Collect for Family<S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn collect(&self, out: &mut String) {
        write_header(out, &self.name, &self.help, S::TYPE);
        for (values, series) in lock(&self.series).iter() {
            let labels = Labels {
                names: &self.label_names,
                values,
            };
            series.write(&self.name, &labels, out);
        }
    }
}

/// The registry's own error counter, exported like any other counter.
struct ErrorsCollector(Arc<AtomicU64>);

impl Collect for ErrorsCollector {
    fn name(&self) -> &str {
        ERRORS_METRIC
    }

    fn collect(&self, out: &mut String) {
        write_header(
            out,
            ERRORS_METRIC,
            "Metric observations dropped because of a label count mismatch, and metrics refused at registration.",
            "counter",
        );
        let _ = writeln!(out, "{ERRORS_METRIC} {}", self.0.load(Ordering::Relaxed));
    }
}

/// The value kept per label set, and how it is written out.
trait Series: Send + 'static {
    /// The `# TYPE` keyword.
    const TYPE: &'static str;
    /// Family-wide settings needed to create a series (histogram bounds).
    type Config: Send + Sync + 'static;
    fn new(config: &Self::Config) -> Self;
    fn write(&self, name: &str, labels: &Labels<'_>, out: &mut String);
}

impl Series for u64 {
    const TYPE: &'static str = "counter";
    type Config = ();

    fn new((): &()) -> Self {
        0
    }

    fn write(&self, name: &str, labels: &Labels<'_>, out: &mut String) {
        out.push_str(name);
        labels.write(out, None);
        let _ = writeln!(out, " {self}");
    }
}

impl Series for f64 {
    const TYPE: &'static str = "gauge";
    type Config = ();

    fn new((): &()) -> Self {
        0.0
    }

    fn write(&self, name: &str, labels: &Labels<'_>, out: &mut String) {
        out.push_str(name);
        labels.write(out, None);
        out.push(' ');
        write_float(out, *self);
        out.push('\n');
    }
}

/// One histogram series. `buckets[i]` counts observations in `(bounds[i-1], bounds[i]]`; they
/// are made cumulative when written.
struct Histogram {
    bounds: Arc<[f64]>,
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, value: f64) {
        // One slot per finite bound; values above all of them (and NaN) are only in `count`,
        // which is what the `+Inf` bucket shows.
        if let Some(slot) = self.bounds.iter().position(|b| value <= *b) {
            self.buckets[slot] += 1;
        }
        self.sum += value;
        self.count += 1;
    }
}

impl Series for Histogram {
    const TYPE: &'static str = "histogram";
    type Config = Arc<[f64]>;

    fn new(bounds: &Arc<[f64]>) -> Self {
        Self {
            bounds: bounds.clone(),
            buckets: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn write(&self, name: &str, labels: &Labels<'_>, out: &mut String) {
        let mut cumulative = 0u64;
        let mut le = String::new();
        for (bound, n) in self.bounds.iter().zip(&self.buckets) {
            cumulative += n;
            le.clear();
            write_float(&mut le, *bound);
            let _ = write!(out, "{name}_bucket");
            labels.write(out, Some(("le", &le)));
            let _ = writeln!(out, " {cumulative}");
        }
        let _ = write!(out, "{name}_bucket");
        labels.write(out, Some(("le", "+Inf")));
        let _ = writeln!(out, " {}", self.count);
        let _ = write!(out, "{name}_sum");
        labels.write(out, None);
        out.push(' ');
        write_float(out, self.sum);
        out.push('\n');
        let _ = write!(out, "{name}_count");
        labels.write(out, None);
        let _ = writeln!(out, " {}", self.count);
    }
}

/// A series' label names and values, written as `{a="1",b="2"}` (nothing when empty).
struct Labels<'a> {
    names: &'a [String],
    values: &'a [String],
}

impl Labels<'_> {
    fn write(&self, out: &mut String, extra: Option<(&str, &str)>) {
        let pairs = self
            .names
            .iter()
            .map(String::as_str)
            .zip(self.values.iter().map(String::as_str))
            .chain(extra);
        let mut first = true;
        for (name, value) in pairs {
            out.push(if first { '{' } else { ',' });
            first = false;
            out.push_str(name);
            out.push_str("=\"");
            for c in value.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        if !first {
            out.push('}');
        }
    }
}

fn write_header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = write!(out, "# HELP {name} ");
    // HELP text escapes only backslash and newline; quotes stay as they are.
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    let _ = writeln!(out, "\n# TYPE {name} {kind}");
}

/// Writes a sample value the way Prometheus parses it: `+Inf`, `-Inf`, `NaN`, or Rust's
/// shortest round-trip decimal (which never uses an exponent).
fn write_float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
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

/// Metric state stays consistent even if a holder panicked (every update is a single step),
/// so a poisoned lock is simply taken over.
fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_small_registry_exactly() {
        let r = Registry::new();
        let requests = r.counter_vec(
            "test_requests_total",
            "Requests served.\nBy \\ code.",
            &["code", "path"],
        );
        requests.inc(&["200", "/a\"b\\c\nd"]);
        requests.inc_by(&["200", "/"], 3);
        requests.inc(&["500", "/"]);
        requests.inc(&["200"]); // wrong label count: dropped and counted
        let latency = r.histogram_vec("test_latency_seconds", "Latency.", &[], &[1.0, 0.25]);
        for v in [0.0625, 0.25, 0.5, 4.0] {
            latency.observe(&[], v);
        }
        let temp = r.gauge_vec("test_temperature", "Temperature.", &["room"]);
        temp.set(&["b"], 2.5);
        temp.set(&["a"], -1.0);
        r.gauge_vec("test_unused", "Never set.", &["x"]);

        let expected = r#"# HELP portcullis_metrics_errors_total Metric observations dropped because of a label count mismatch, and metrics refused at registration.
# TYPE portcullis_metrics_errors_total counter
portcullis_metrics_errors_total 1
# HELP test_latency_seconds Latency.
# TYPE test_latency_seconds histogram
test_latency_seconds_bucket{le="0.25"} 2
test_latency_seconds_bucket{le="1"} 3
test_latency_seconds_bucket{le="+Inf"} 4
test_latency_seconds_sum 4.8125
test_latency_seconds_count 4
# HELP test_requests_total Requests served.\nBy \\ code.
# TYPE test_requests_total counter
test_requests_total{code="200",path="/"} 3
test_requests_total{code="200",path="/a\"b\\c\nd"} 1
test_requests_total{code="500",path="/"} 1
# HELP test_temperature Temperature.
# TYPE test_temperature gauge
test_temperature{room="a"} -1
test_temperature{room="b"} 2.5
# HELP test_unused Never set.
# TYPE test_unused gauge
"#;
        assert_eq!(r.render(), expected);
    }

    #[test]
    fn histogram_with_labels_is_cumulative() {
        let r = Registry::new();
        let h = r.histogram_vec("h_seconds", "H.", &["op"], &[0.1, 1.0]);
        h.observe(&["x"], 0.1); // on the bound: counts in that bucket
        h.observe(&["x"], 0.1);
        h.observe(&["x"], 20.0);
        h.observe(&["x", "y"], 1.0); // dropped
        assert_eq!(h.count(&["x"]), 3);
        assert_eq!(h.count(&["y"]), 0);
        assert!((h.sum(&["x"]) - 20.2).abs() < 1e-9);
        let text = r.render();
        assert!(
            text.contains("h_seconds_bucket{op=\"x\",le=\"0.1\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("h_seconds_bucket{op=\"x\",le=\"1\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("h_seconds_bucket{op=\"x\",le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("h_seconds_count{op=\"x\"} 3\n"), "{text}");
        assert_eq!(r.errors(), 1);
    }

    #[test]
    fn getters_and_mismatches() {
        let r = Registry::new();
        let c = r.counter_vec("c_total", "C.", &["a"]);
        c.inc(&["x"]);
        c.inc_by(&["x"], 4);
        c.inc(&[]);
        c.inc(&["x", "y"]);
        assert_eq!(c.get(&["x"]), 5);
        assert_eq!(c.get(&["nope"]), 0);
        let g = r.gauge_vec("g", "G.", &[]);
        assert_eq!(g.get(&[]), 0.0);
        g.set(&[], 7.5);
        assert_eq!(g.get(&[]), 7.5);
        g.set(&["extra"], 1.0);
        assert_eq!(r.errors(), 3);
    }

    #[test]
    fn bad_registrations_are_counted_not_rendered() {
        let r = Registry::new();
        let first = r.counter_vec("dup_total", "First.", &[]);
        let second = r.counter_vec("dup_total", "Second.", &[]);
        let bad = r.gauge_vec("bad name", "Bad.", &[]);
        let bad_label = r.gauge_vec("bad_label", "Bad.", &["le"]);
        first.inc(&[]);
        second.inc_by(&[], 10);
        bad.set(&[], 1.0);
        bad_label.set(&["1"], 1.0);
        let text = r.render();
        assert!(text.contains("dup_total 1\n"), "{text}");
        assert!(!text.contains("Second."), "{text}");
        assert!(!text.contains("bad"), "{text}");
        assert_eq!(r.errors(), 3);
    }

    #[test]
    fn gauge_series_can_be_removed_and_replaced() {
        let r = Registry::new();
        let g = r.gauge_vec("expiry", "E.", &["secret"]);
        g.set(&["a/x"], 1.0);
        g.set(&["a/y"], 2.0);
        g.remove(&["a/x"]);
        g.remove(&["nope"]);
        assert_eq!(g.label_sets(), vec![vec!["a/y".to_string()]]);
        g.replace_all(&[
            (vec!["b/z".to_string()], 3.0),
            (vec!["a/y".to_string()], 4.0),
            (vec![], 5.0), // wrong label count: dropped and counted
        ]);
        let text = r.render();
        assert!(
            text.contains(
                "# TYPE expiry gauge\nexpiry{secret=\"a/y\"} 4\nexpiry{secret=\"b/z\"} 3\n#"
            ),
            "{text}"
        );
        g.replace_all(&[]);
        assert!(text.contains("# TYPE expiry gauge"), "{text}");
        assert!(!r.render().contains("expiry{"));
        assert_eq!(r.errors(), 1);
    }

    #[test]
    fn floats_render_as_prometheus_parses_them() {
        let mut out = String::new();
        for v in [
            1.0,
            0.001,
            1.5e9,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ] {
            write_float(&mut out, v);
            out.push(' ');
        }
        assert_eq!(out, "1 0.001 1500000000 +Inf -Inf NaN ");
    }

    #[test]
    fn metrics_render_every_product_metric() {
        let m = Metrics::new();
        m.reloads.inc(&["endpoints"]);
        m.runtime_commands.inc(&["set server", "ok"]);
        m.script_errors.inc(&["policy/10-auth.rhai"]);
        let text = m.render();
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
        assert!(text.contains("portcullis_reload_failures_total{stage=\"verify\"} 0\n"));
        assert!(text.contains("portcullis_applies_total{outcome=\"unchanged\"} 0\n"));
        assert!(text.contains("portcullis_input_diagnostics{severity=\"error\"} 0\n"));
        assert!(text.contains("portcullis_config_check_failures_total 0\n"));
        assert!(text.contains("portcullis_ready 0\n"));
        assert!(text.contains("portcullis_apply_duration_seconds_bucket{le=\"0.001\"} 0\n"));
        assert!(text.contains("portcullis_apply_duration_seconds_bucket{le=\"10\"} 0\n"));
        assert!(text.contains(
            "portcullis_runtime_commands_total{command=\"set server\",outcome=\"ok\"} 1\n"
        ));
        assert_eq!(m.errors(), 0);
        // Families come out sorted by name.
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }
}
