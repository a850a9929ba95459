//! Prometheus metrics without global state.
//!
//! A [`Registry`] is created by the binary and handed to whoever records metrics, so tests
//! can run servers side by side without sharing counters. [`Registry::render`] writes the text
//! exposition format 0.0.4 with the exact shape of Go's client_golang (families sorted by
//! name, label pairs sorted by label name, series sorted by label values, Go's float
//! formatting, no `_total` added to counter names), because upstream's tests parse it.
//!
//! Registering a name twice, an invalid name, or passing the wrong number of label values
//! are programming errors and panic; nothing that arrives over the network reaches them.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

mod process;
mod text;

pub use process::{open_fds, resident_memory_bytes};

/// The content type of [`Registry::render`]'s output, as promhttp announces it.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A count that only goes up. An integer, which is all the proxy needs; rendered the way
/// Go renders client_golang's float counters (`1e+06` from a million on).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A value that goes up and down, such as a number of open connections.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Relaxed);
    }

    pub fn inc(&self) {
        self.add(1);
    }

    pub fn dec(&self) {
        self.add(-1);
    }

    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Relaxed)
    }
}

/// Observations counted into fixed buckets, with their sum.
#[derive(Debug)]
pub struct Histogram {
    /// Strictly increasing finite bounds; `+Inf` is implicit.
    upper_bounds: Arc<[f64]>,
    /// Per-bucket (not cumulative) counts; the extra last slot is the `+Inf` bucket. The
    /// total count is their sum, so `_count` always equals the `+Inf` bucket.
    counts: Box<[AtomicU64]>,
    /// The f64 sum, as bits so it can be updated atomically.
    sum_bits: AtomicU64,
}

impl Histogram {
    fn new(upper_bounds: Arc<[f64]>) -> Self {
        Histogram {
            counts: (0..=upper_bounds.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            upper_bounds,
            sum_bits: AtomicU64::new(0.0f64.to_bits()),
        }
    }

    /// Records `v` in the first bucket whose bound is >= `v` (NaN lands in `+Inf`, as in Go).
    pub fn observe(&self, v: f64) {
        let bucket = if v.is_nan() {
            self.upper_bounds.len()
        } else {
            self.upper_bounds.partition_point(|&bound| bound < v)
        };
        self.counts[bucket].fetch_add(1, Relaxed);
        let _ = self.sum_bits.fetch_update(Relaxed, Relaxed, |bits| {
            Some((f64::from_bits(bits) + v).to_bits())
        });
    }

    /// Records a duration in seconds, the unit of every `_seconds` histogram.
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    pub fn sample_count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    pub fn sample_sum(&self) -> f64 {
        f64::from_bits(self.sum_bits.load(Relaxed))
    }
}

/// A family of metrics of one kind, told apart by the values of a fixed list of labels.
pub struct MetricVec<M> {
    name: String,
    label_names: Box<[String]>,
    /// Indices into `label_names` in name order: client_golang sorts label pairs by name.
    label_order: Box<[usize]>,
    new_child: Box<dyn Fn() -> M + Send + Sync>,
    /// Sorted by label values (declaration order), so a lookup is a binary search that
    /// allocates nothing.
    children: Mutex<Vec<Child<M>>>,
}

/// A child's label values (in declaration order) and the child.
type Child<M> = (Box<[String]>, Arc<M>);

pub type CounterVec = MetricVec<Counter>;
pub type GaugeVec = MetricVec<Gauge>;
pub type HistogramVec = MetricVec<Histogram>;

impl<M> MetricVec<M> {
    fn new(name: &str, label_names: &[&str], new_child: Box<dyn Fn() -> M + Send + Sync>) -> Self {
        for (i, label) in label_names.iter().enumerate() {
            assert!(
                text::is_label_name(label),
                "metric {name}: invalid label name {label:?}"
            );
            assert!(
                !label_names[..i].contains(label),
                "metric {name}: duplicate label name {label:?}"
            );
        }
        let mut label_order: Vec<usize> = (0..label_names.len()).collect();
        label_order.sort_by_key(|&i| label_names[i]);
        MetricVec {
            name: name.to_owned(),
            label_names: label_names.iter().map(|&l| l.to_owned()).collect(),
            label_order: label_order.into(),
            new_child,
            children: Mutex::new(Vec::new()),
        }
    }

    /// The child for these label values (in the order the label names were registered),
    /// created on first use. Lookups take a short lock; cache the result on hot paths.
    ///
    /// # Panics
    ///
    /// If the number of values differs from the number of label names.
    pub fn with(&self, values: &[&str]) -> Arc<M> {
        assert_eq!(
            values.len(),
            self.label_names.len(),
            "metric {}: label values {values:?} do not match label names {:?}",
            self.name,
            self.label_names,
        );
        let mut children = lock(&self.children);
        let found = children.binary_search_by(|(key, _)| {
            key.iter().map(String::as_str).cmp(values.iter().copied())
        });
        match found {
            Ok(i) => Arc::clone(&children[i].1),
            Err(i) => {
                let child = Arc::new((self.new_child)());
                let key = values.iter().map(|&v| v.to_owned()).collect();
                children.insert(i, (key, Arc::clone(&child)));
                child
            }
        }
    }

    /// Drops the child for these label values, e.g. when the agent a series described left.
    /// A handle obtained earlier keeps working but is no longer exported.
    pub fn remove(&self, values: &[&str]) {
        let mut children = lock(&self.children);
        if let Ok(i) = children
            .binary_search_by(|(key, _)| key.iter().map(String::as_str).cmp(values.iter().copied()))
        {
            children.remove(i);
        }
    }

    /// Writes the family, or nothing at all when it has no children (as client_golang does).
    fn render(
        &self,
        out: &mut String,
        help: &str,
        kind: &str,
        write: impl Fn(&mut String, &str, &[(&str, &str)], &M),
    ) {
        let children = lock(&self.children);
        if children.is_empty() {
            return;
        }
        let mut series: Vec<(Vec<(&str, &str)>, &M)> = children
            .iter()
            .map(|(values, child)| {
                let labels = self
                    .label_order
                    .iter()
                    .map(|&i| (self.label_names[i].as_str(), values[i].as_str()))
                    .collect();
                (labels, &**child)
            })
            .collect();
        series.sort_by(|(a, _), (b, _)| a.iter().map(|l| l.1).cmp(b.iter().map(|l| l.1)));
        write_header(out, &self.name, help, kind);
        for (labels, child) in series {
            write(out, &self.name, &labels, child);
        }
    }
}

impl<M> fmt::Debug for MetricVec<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricVec")
            .field("name", &self.name)
            .field("label_names", &self.label_names)
            .field("children", &lock(&self.children).len())
            .finish()
    }
}

/// A registered family, as [`Registry::families`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyInfo {
    pub name: String,
    /// `counter`, `gauge` or `histogram`, as in `# TYPE`.
    pub kind: &'static str,
    pub help: String,
    /// Label names in the order they were registered.
    pub labels: Vec<String>,
}

/// The set of metrics one process exposes. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    families: Arc<Mutex<BTreeMap<String, Family>>>,
}

#[derive(Debug)]
struct Family {
    help: String,
    metric: Metric,
}

#[derive(Debug)]
enum Metric {
    Counter(Arc<Counter>),
    Gauge(Arc<Gauge>),
    Histogram(Arc<Histogram>),
    CounterVec(Arc<CounterVec>),
    GaugeVec(Arc<GaugeVec>),
    HistogramVec(Arc<HistogramVec>),
    Process(process::Metric),
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn counter(&self, name: &str, help: &str) -> Arc<Counter> {
        let counter = Arc::new(Counter::default());
        self.register(name, help, Metric::Counter(Arc::clone(&counter)));
        counter
    }

    /// The counter already registered under `name`, or a new one: for a metric that two
    /// owners share and that either may register first (the server's placeholder for
    /// `culled_leases_count` and the Lease garbage collector that counts it).
    ///
    /// # Panics
    ///
    /// If `name` is registered as another kind of metric.
    pub fn shared_counter(&self, name: &str, help: &str) -> Arc<Counter> {
        assert!(text::is_metric_name(name), "invalid metric name {name:?}");
        let mut families = lock(&self.families);
        let family = families.entry(name.to_owned()).or_insert_with(|| Family {
            help: help.to_owned(),
            metric: Metric::Counter(Arc::default()),
        });
        match &family.metric {
            Metric::Counter(c) => Arc::clone(c),
            _ => panic!("metric {name:?} is registered, but not as a counter"),
        }
    }

    pub fn gauge(&self, name: &str, help: &str) -> Arc<Gauge> {
        let gauge = Arc::new(Gauge::default());
        self.register(name, help, Metric::Gauge(Arc::clone(&gauge)));
        gauge
    }

    /// A histogram with the given finite, strictly increasing bucket bounds (a trailing
    /// `+Inf` is accepted and dropped, as client_golang does; it is always rendered).
    pub fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Arc<Histogram> {
        let histogram = Arc::new(Histogram::new(upper_bounds(name, buckets)));
        self.register(name, help, Metric::Histogram(Arc::clone(&histogram)));
        histogram
    }

    pub fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> Arc<CounterVec> {
        let vec = Arc::new(MetricVec::new(name, labels, Box::new(Counter::default)));
        self.register(name, help, Metric::CounterVec(Arc::clone(&vec)));
        vec
    }

    pub fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> Arc<GaugeVec> {
        let vec = Arc::new(MetricVec::new(name, labels, Box::new(Gauge::default)));
        self.register(name, help, Metric::GaugeVec(Arc::clone(&vec)));
        vec
    }

    pub fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: &[f64],
    ) -> Arc<HistogramVec> {
        assert!(
            !labels.contains(&"le"),
            "histogram {name}: the label name \"le\" is reserved"
        );
        let bounds = upper_bounds(name, buckets);
        let new_child = Box::new(move || Histogram::new(Arc::clone(&bounds)));
        let vec = Arc::new(MetricVec::new(name, labels, new_child));
        self.register(name, help, Metric::HistogramVec(Arc::clone(&vec)));
        vec
    }

    /// Adds client_golang's standard `process_*` metrics, read from procfs on every render.
    pub fn register_process_metrics(&self) {
        for (metric, name, help) in process::Metric::ALL {
            self.register(name, help, Metric::Process(metric));
        }
    }

    /// What is registered, sorted by name, whether or not it has a value yet (a labelled
    /// family without series renders nothing): the generated metrics reference reads it.
    pub fn families(&self) -> Vec<FamilyInfo> {
        let families = lock(&self.families);
        families
            .iter()
            .map(|(name, family)| {
                let (kind, labels) = match &family.metric {
                    Metric::Counter(_) => ("counter", &[][..]),
                    Metric::Gauge(_) => ("gauge", &[][..]),
                    Metric::Histogram(_) => ("histogram", &[][..]),
                    Metric::CounterVec(v) => ("counter", &v.label_names[..]),
                    Metric::GaugeVec(v) => ("gauge", &v.label_names[..]),
                    Metric::HistogramVec(v) => ("histogram", &v.label_names[..]),
                    Metric::Process(metric) => (metric.kind(), &[][..]),
                };
                FamilyInfo {
                    name: name.clone(),
                    kind,
                    help: family.help.clone(),
                    labels: labels.to_vec(),
                }
            })
            .collect()
    }

    /// The current values in the text exposition format (see [`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let families = lock(&self.families);
        let mut out = String::with_capacity(4096);
        let mut process = None;
        for (name, family) in families.iter() {
            let help = &family.help;
            match &family.metric {
                Metric::Counter(c) => {
                    write_header(&mut out, name, help, "counter");
                    write_counter(&mut out, name, &[], c);
                }
                Metric::Gauge(g) => {
                    write_header(&mut out, name, help, "gauge");
                    write_gauge(&mut out, name, &[], g);
                }
                Metric::Histogram(h) => {
                    write_header(&mut out, name, help, "histogram");
                    write_histogram(&mut out, name, &[], h);
                }
                Metric::CounterVec(v) => v.render(&mut out, help, "counter", write_counter),
                Metric::GaugeVec(v) => v.render(&mut out, help, "gauge", write_gauge),
                Metric::HistogramVec(v) => v.render(&mut out, help, "histogram", write_histogram),
                Metric::Process(metric) => {
                    let snapshot = process.get_or_insert_with(process::Snapshot::read);
                    if let Some(value) = snapshot.value(*metric) {
                        write_header(&mut out, name, help, metric.kind());
                        write_sample(&mut out, name, "", &[], None, &text::go_float(value));
                    }
                }
            }
        }
        out
    }

    fn register(&self, name: &str, help: &str, metric: Metric) {
        assert!(text::is_metric_name(name), "invalid metric name {name:?}");
        match lock(&self.families).entry(name.to_owned()) {
            Entry::Occupied(_) => panic!("metric {name:?} is already registered"),
            Entry::Vacant(slot) => {
                slot.insert(Family {
                    help: help.to_owned(),
                    metric,
                });
            }
        }
    }
}

/// Validates bucket bounds once at registration, so `observe` can binary-search them.
fn upper_bounds(name: &str, buckets: &[f64]) -> Arc<[f64]> {
    let buckets = match buckets {
        [rest @ .., last] if *last == f64::INFINITY => rest,
        all => all,
    };
    assert!(
        buckets.iter().all(|b| b.is_finite()) && buckets.windows(2).all(|w| w[0] < w[1]),
        "histogram {name}: buckets must be finite and strictly increasing, got {buckets:?}"
    );
    buckets.into()
}

/// A poisoned lock only means another thread panicked mid-update of plain counters; the data
/// is still usable, and metrics must not turn one panic into many.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn write_header(out: &mut String, name: &str, help: &str, kind: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    text::push_help(out, help);
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind);
    out.push('\n');
}

/// One sample line: `name_suffix{labels,le="bound"} value`.
fn write_sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    le: Option<&str>,
    value: &str,
) {
    out.push_str(name);
    out.push_str(suffix);
    let pairs = labels.iter().copied().chain(le.map(|le| ("le", le)));
    for (i, (label, v)) in pairs.enumerate() {
        out.push(if i == 0 { '{' } else { ',' });
        out.push_str(label);
        out.push_str("=\"");
        text::push_label_value(out, v);
        out.push('"');
    }
    if !labels.is_empty() || le.is_some() {
        out.push('}');
    }
    out.push(' ');
    out.push_str(value);
    out.push('\n');
}

fn write_counter(out: &mut String, name: &str, labels: &[(&str, &str)], c: &Counter) {
    write_sample(out, name, "", labels, None, &text::go_float(c.get() as f64));
}

fn write_gauge(out: &mut String, name: &str, labels: &[(&str, &str)], g: &Gauge) {
    write_sample(out, name, "", labels, None, &text::go_float(g.get() as f64));
}

fn write_histogram(out: &mut String, name: &str, labels: &[(&str, &str)], h: &Histogram) {
    let mut cumulative = 0u64;
    for (bound, count) in h.upper_bounds.iter().zip(&h.counts) {
        cumulative += count.load(Relaxed);
        let le = text::go_float(*bound);
        write_sample(
            out,
            name,
            "_bucket",
            labels,
            Some(&le),
            &cumulative.to_string(),
        );
    }
    if let Some(inf) = h.counts.last() {
        cumulative += inf.load(Relaxed);
    }
    let count = cumulative.to_string();
    write_sample(out, name, "_bucket", labels, Some("+Inf"), &count);
    let sum = text::go_float(h.sample_sum());
    write_sample(out, name, "_sum", labels, None, &sum);
    write_sample(out, name, "_count", labels, None, &count);
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIAL_BUCKETS: [f64; 9] = [1e-6, 1e-5, 1e-4, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];

    #[test]
    fn families_lists_labelled_families_before_their_first_series() {
        let registry = Registry::new();
        registry.counter_vec("b_total", "B.", &["reason", "code"]);
        registry.gauge("a", "A.");
        registry.register_process_metrics();
        let families = registry.families();
        assert_eq!(
            families[0],
            FamilyInfo {
                name: "a".into(),
                kind: "gauge",
                help: "A.".into(),
                labels: vec![],
            }
        );
        assert_eq!(families[1].labels, ["reason", "code"]);
        assert!(!registry.render().contains("b_total"));
        let cpu = families
            .iter()
            .find(|f| f.name == "process_cpu_seconds_total")
            .unwrap();
        assert_eq!(cpu.kind, "counter");
    }

    #[test]
    fn counter_keeps_its_name() {
        let registry = Registry::new();
        let failures = registry.counter(
            "konnectivity_network_proxy_server_culled_leases_count",
            "Count of culled leases.",
        );
        failures.inc();
        failures.add(2);
        assert_eq!(
            registry.render(),
            "# HELP konnectivity_network_proxy_server_culled_leases_count Count of culled leases.\n\
             # TYPE konnectivity_network_proxy_server_culled_leases_count counter\n\
             konnectivity_network_proxy_server_culled_leases_count 3\n"
        );
        failures.add(999_997);
        assert!(registry.render().ends_with("_count 1e+06\n"));
    }

    #[test]
    fn a_shared_counter_is_one_counter_whoever_registers_first() {
        let registry = Registry::new();
        let first = registry.shared_counter("culled_total", "Culled.");
        let second = registry.shared_counter("culled_total", "Culled.");
        second.inc();
        assert_eq!(first.get(), 1);
        assert_eq!(
            registry
                .render()
                .matches("# TYPE culled_total counter")
                .count(),
            1
        );
    }

    #[test]
    #[should_panic(expected = "registered, but not as a counter")]
    fn a_shared_counter_name_taken_by_another_kind_panics() {
        let registry = Registry::new();
        registry.gauge("culled_total", "Culled.");
        registry.shared_counter("culled_total", "Culled.");
    }

    #[test]
    fn gauge_vec_sorts_label_pairs_and_series() {
        let registry = Registry::new();
        let gauges = registry.gauge_vec("ready", "Ready things.", &["zeta", "alpha"]);
        gauges.with(&["1", "b"]).set(5);
        gauges.with(&["2", "a"]).dec();
        gauges.with(&["0", "b"]).inc();
        assert_eq!(gauges.with(&["1", "b"]).get(), 5, "children are cached");
        assert_eq!(
            registry.render(),
            "# HELP ready Ready things.\n\
             # TYPE ready gauge\n\
             ready{alpha=\"a\",zeta=\"2\"} -1\n\
             ready{alpha=\"b\",zeta=\"0\"} 1\n\
             ready{alpha=\"b\",zeta=\"1\"} 5\n"
        );
    }

    #[test]
    fn histogram_with_dial_buckets() {
        let registry = Registry::new();
        let dial = registry.histogram(
            "konnectivity_network_proxy_server_dial_duration_seconds",
            "Latency of dial to the remote endpoint in seconds",
            &DIAL_BUCKETS,
        );
        dial.observe(1e-6);
        dial.observe(0.003);
        dial.observe(0.2);
        dial.observe_duration(Duration::from_secs(20));
        assert_eq!(dial.sample_count(), 4);
        let n = "konnectivity_network_proxy_server_dial_duration_seconds";
        let want = format!(
            "# HELP {n} Latency of dial to the remote endpoint in seconds\n\
             # TYPE {n} histogram\n\
             {n}_bucket{{le=\"1e-06\"}} 1\n\
             {n}_bucket{{le=\"1e-05\"}} 1\n\
             {n}_bucket{{le=\"0.0001\"}} 1\n\
             {n}_bucket{{le=\"0.005\"}} 2\n\
             {n}_bucket{{le=\"0.025\"}} 2\n\
             {n}_bucket{{le=\"0.1\"}} 2\n\
             {n}_bucket{{le=\"0.5\"}} 3\n\
             {n}_bucket{{le=\"2.5\"}} 3\n\
             {n}_bucket{{le=\"12.5\"}} 3\n\
             {n}_bucket{{le=\"+Inf\"}} 4\n\
             {n}_sum 20.203001\n\
             {n}_count 4\n"
        );
        assert_eq!(registry.render(), want);
    }

    #[test]
    fn histogram_vec_puts_le_last() {
        let registry = Registry::new();
        let latency = registry.histogram_vec("lat", "h", &["code"], &[1.0, 30.0, f64::INFINITY]);
        latency.with(&["200"]).observe(30.0);
        assert_eq!(
            registry.render(),
            "# HELP lat h\n# TYPE lat histogram\n\
             lat_bucket{code=\"200\",le=\"1\"} 0\n\
             lat_bucket{code=\"200\",le=\"30\"} 1\n\
             lat_bucket{code=\"200\",le=\"+Inf\"} 1\n\
             lat_sum{code=\"200\"} 30\n\
             lat_count{code=\"200\"} 1\n"
        );
    }

    #[test]
    fn escapes_label_values_and_help() {
        let registry = Registry::new();
        let errors = registry.counter_vec("errs", "Line one\nback\\slash \"q\"", &["reason"]);
        errors.with(&["a\"b\\c\nd"]).inc();
        assert_eq!(
            registry.render(),
            "# HELP errs Line one\\nback\\\\slash \"q\"\n\
             # TYPE errs counter\n\
             errs{reason=\"a\\\"b\\\\c\\nd\"} 1\n"
        );
    }

    #[test]
    fn empty_families_are_omitted_and_families_sorted() {
        let registry = Registry::new();
        registry.counter_vec("b_unused", "never used", &["x"]);
        registry.histogram_vec("c_unused", "never used", &["x"], &[1.0]);
        registry.gauge("c_gauge", "g").set(-7);
        registry.counter("a_counter", "c");
        assert_eq!(
            registry.render(),
            "# HELP a_counter c\n# TYPE a_counter counter\na_counter 0\n\
             # HELP c_gauge g\n# TYPE c_gauge gauge\nc_gauge -7\n"
        );
    }

    #[test]
    fn clones_share_state() {
        let registry = Registry::new();
        let clone = registry.clone();
        clone.gauge("g", "g").set(3);
        assert!(registry.render().contains("\ng 3\n"));
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Registry>();
    }

    #[test]
    #[should_panic(expected = "already registered")]
    fn duplicate_names_panic() {
        let registry = Registry::new();
        registry.counter("x", "x");
        registry.gauge("x", "x");
    }

    #[test]
    #[should_panic(expected = "do not match label names")]
    fn wrong_label_count_panics() {
        Registry::new()
            .counter_vec("x", "x", &["a", "b"])
            .with(&["1"]);
    }

    #[test]
    #[should_panic(expected = "strictly increasing")]
    fn unsorted_buckets_panic() {
        Registry::new().histogram("x", "x", &[1.0, 1.0]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics() {
        let registry = Registry::new();
        registry.register_process_metrics();
        registry.gauge("aaa", "first").set(1);
        let out = registry.render();
        assert!(out.starts_with("# HELP aaa first\n"), "{out}");
        assert!(
            out.contains("# TYPE process_cpu_seconds_total counter\n"),
            "{out}"
        );
        let value = |name: &str| -> f64 {
            let prefix = format!("\n{name} ");
            let start = out
                .find(&prefix)
                .unwrap_or_else(|| panic!("{name} missing: {out}"));
            let line = out[start + prefix.len()..].lines().next().unwrap();
            line.parse().unwrap()
        };
        assert!(value("process_open_fds") > 0.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_virtual_memory_max_bytes") > 0.0);
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(value("process_start_time_seconds") > 1e9);
    }
}
