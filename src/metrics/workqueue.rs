//! The work queue metrics client-go's workqueue reports, one set per named
//! queue (`name` label): `workqueue_adds_total`, `workqueue_depth`,
//! `workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds`,
//! `workqueue_retries_total`. As client-go counts them, an add of a key that
//! is already waiting is not counted again, the queue duration is the time
//! from the first add to the start of processing, and a retry is a failed
//! sync put back with back-off.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{self as metrics, Counter, Gauge, Histogram};
use crate::sync::LockExt;

/// One queue's metrics and the keys waiting in it.
#[derive(Debug)]
pub struct WorkQueueMetrics {
    name: &'static str,
    adds: Counter,
    depth: Gauge,
    retries: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    /// Keys added and not yet started, with the time of their first add.
    waiting: Mutex<HashMap<String, Instant>>,
}

fn queues() -> &'static Mutex<Vec<Arc<WorkQueueMetrics>>> {
    static QUEUES: OnceLock<Mutex<Vec<Arc<WorkQueueMetrics>>>> = OnceLock::new();
    QUEUES.get_or_init(Default::default)
}

impl WorkQueueMetrics {
    /// The metrics of the queue called `name`, registered once per process.
    pub fn named(name: &'static str) -> Arc<WorkQueueMetrics> {
        let mut all = queues().locked();
        if let Some(q) = all.iter().find(|q| q.name == name) {
            return q.clone();
        }
        let q = Arc::new(WorkQueueMetrics {
            name,
            adds: Counter::default(),
            depth: Gauge::default(),
            retries: Counter::default(),
            queue_duration: Histogram::new(metrics::WORKQUEUE_BUCKETS),
            work_duration: Histogram::new(metrics::WORKQUEUE_BUCKETS),
            waiting: Mutex::new(HashMap::new()),
        });
        all.push(q.clone());
        q
    }

    /// `key` was put on the queue.
    pub fn add(&self, key: &str) {
        let mut waiting = self.waiting.locked();
        if waiting.contains_key(key) {
            return;
        }
        waiting.insert(key.to_string(), Instant::now());
        self.adds.inc();
        self.depth.add(1);
    }

    /// A worker took `key`; the returned guard records the work's duration
    /// when dropped.
    pub fn start(&self, key: &str) -> WorkTimer<'_> {
        let added = self.waiting.locked().remove(key);
        if let Some(at) = added {
            self.depth.add(-1);
            self.queue_duration.observe(at.elapsed());
        }
        WorkTimer { metrics: self, started: Instant::now() }
    }

    /// A failed sync is retried later.
    pub fn retry(&self) {
        self.retries.inc();
    }

    pub fn adds(&self) -> u64 {
        self.adds.get()
    }

    pub fn depth(&self) -> i64 {
        self.depth.get()
    }

    fn observe_work(&self, d: Duration) {
        self.work_duration.observe(d);
    }
}

/// Times one sync of a key.
pub struct WorkTimer<'a> {
    metrics: &'a WorkQueueMetrics,
    started: Instant,
}

impl Drop for WorkTimer<'_> {
    fn drop(&mut self) {
        self.metrics.observe_work(self.started.elapsed());
    }
}

/// Writes every queue's metrics in the text format.
pub fn write_all(out: &mut String) {
    let all: Vec<Arc<WorkQueueMetrics>> = queues().locked().clone();
    let label = |q: &WorkQueueMetrics| metrics::labels(&[("name", q.name)]);
    metrics::write_header(out, "workqueue_adds_total", "Total number of adds handled by workqueue", "counter");
    for q in &all {
        out.push_str(&format!("workqueue_adds_total{{{}}} {}\n", label(q), q.adds.get()));
    }
    metrics::write_header(out, "workqueue_depth", "Current depth of workqueue", "gauge");
    for q in &all {
        out.push_str(&format!("workqueue_depth{{{}}} {}\n", label(q), q.depth.get()));
    }
    metrics::write_header(
        out,
        "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested.",
        "histogram",
    );
    for q in &all {
        q.queue_duration.write(out, "workqueue_queue_duration_seconds", &label(q));
    }
    metrics::write_header(
        out,
        "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes.",
        "histogram",
    );
    for q in &all {
        q.work_duration.write(out, "workqueue_work_duration_seconds", &label(q));
    }
    metrics::write_header(out, "workqueue_retries_total", "Total number of retries handled by workqueue", "counter");
    for q in &all {
        out.push_str(&format!("workqueue_retries_total{{{}}} {}\n", label(q), q.retries.get()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_key_is_added_once_and_leaves_on_start() {
        let q = WorkQueueMetrics::named("test-queue");
        q.add("ns/a");
        q.add("ns/a");
        q.add("ns/b");
        assert_eq!((q.adds(), q.depth()), (2, 2));
        drop(q.start("ns/a"));
        assert_eq!(q.depth(), 1);
        // A requeue that never passed through add leaves the depth alone.
        drop(q.start("ns/c"));
        assert_eq!(q.depth(), 1);
        q.retry();
        let mut out = String::new();
        write_all(&mut out);
        assert!(out.contains("workqueue_adds_total{name=\"test-queue\"} 2\n"), "{out}");
        assert!(out.contains("workqueue_retries_total{name=\"test-queue\"} 1\n"), "{out}");
        assert!(out.contains("workqueue_work_duration_seconds_count{name=\"test-queue\"} 2\n"), "{out}");
        assert!(out.contains("workqueue_queue_duration_seconds_count{name=\"test-queue\"} 1\n"), "{out}");
    }
}
