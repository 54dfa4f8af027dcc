//! Prometheus metrics, hand-written and small: counters, gauges and
//! fixed-bucket histograms over atomics, and the text exposition format
//! (`text/plain; version=0.0.4`) they are scraped in. The components that
//! record metrics (the API server, the controllers' work queues) keep their
//! own series and write them out with the helpers here. Apart from
//! `workqueue` (client-go's work queue series, which every controller
//! reports and the API server's /metrics serves) and `scheduler` (the
//! scheduler's attempts and queue moves), this module knows no
//! Kubernetes names, so every floor may use it.

pub mod scheduler;
pub mod workqueue;

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The media type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn add(&self, d: i64) {
        self.0.fetch_add(d, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A histogram over fixed upper bounds (seconds). Each observation lands in
/// the first bucket whose bound it does not exceed; cumulative counts are
/// computed when written out. The sum is kept in nanoseconds so that it can
/// be an atomic integer.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One per bound, then one for +Inf.
    buckets: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = self.bounds.iter().position(|b| secs <= *b).unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Writes `<name>_bucket{…,le=…}`, `<name>_sum{…}` and `<name>_count{…}`;
    /// `labels` is the series' rendered label list without braces (may be empty).
    pub fn write(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{}\"}} {cumulative}", format_float(*bound));
        }
        cumulative += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{} {}", braced(labels), format_float(sum));
        let _ = writeln!(out, "{name}_count{} {cumulative}", braced(labels));
    }
}

fn braced(labels: &str) -> String {
    if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    }
}

/// A float as Prometheus writes it (`0.005`, `1`, `1e-08`).
pub fn format_float(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// `# HELP` and `# TYPE` lines of one metric family.
pub fn write_header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Appends `key="value"` to a label list, escaping the value as the text
/// format requires (backslash, double quote, newline).
pub fn push_label(out: &mut String, key: &str, value: &str) {
    if !out.is_empty() {
        out.push(',');
    }
    out.push_str(key);
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

/// A label list from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        push_label(&mut out, k, v);
    }
    out
}

/// client-go's work queue buckets: `ExponentialBuckets(10e-9, 10, 12)`.
pub const WORKQUEUE_BUCKETS: &[f64] = &[1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0];

/// The API server's request and etcd latency buckets (v1.33).
pub const APISERVER_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0,
    45.0, 60.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_with_sum_and_count() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        let mut out = String::new();
        h.write(&mut out, "x", "a=\"b\"");
        assert_eq!(
            out,
            "x_bucket{a=\"b\",le=\"0.1\"} 1\nx_bucket{a=\"b\",le=\"1\"} 2\nx_bucket{a=\"b\",le=\"+Inf\"} 3\n\
             x_sum{a=\"b\"} 5.55\nx_count{a=\"b\"} 3\n"
        );
        assert_eq!(h.count(), 3);
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(labels(&[("a", "x\"y\\z\n"), ("b", "")]), "a=\"x\\\"y\\\\z\\n\",b=\"\"");
    }

    #[test]
    fn floats_print_as_prometheus_does() {
        assert_eq!(format_float(1.0), "1");
        assert_eq!(format_float(0.005), "0.005");
        assert_eq!(format_float(1e-8), "0.00000001");
    }
}
