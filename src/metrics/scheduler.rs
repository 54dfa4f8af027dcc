//! The scheduler's series, under upstream's names:
//! `scheduler_schedule_attempts_total{result,profile}` (a cycle that bound
//! the pod, found no node, or failed with an error) and
//! `scheduler_queue_incoming_pods_total{event,queue}` (pods a cluster event
//! moved out of the unschedulable pods). Served by the API server's
//! /metrics, as the controllers' work queues are.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use super as metrics;

use crate::sync::LockExt;

/// Counts by the values of two labels, in the order they are written.
type Series = Mutex<BTreeMap<(String, String), u64>>;

fn attempts() -> &'static Series {
    static ATTEMPTS: OnceLock<Series> = OnceLock::new();
    ATTEMPTS.get_or_init(Default::default)
}

fn incoming() -> &'static Series {
    static INCOMING: OnceLock<Series> = OnceLock::new();
    INCOMING.get_or_init(Default::default)
}

fn add(series: &Series, key: (String, String), by: u64) {
    *series.locked().entry(key).or_default() += by;
}

/// One scheduling cycle of a pod of `profile` ended with `result`
/// (`scheduled`, `unschedulable` or `error`).
pub fn schedule_attempt(result: &'static str, profile: &str) {
    add(attempts(), (profile.to_string(), result.to_string()), 1);
}

/// `event` moved `count` pods to the `active` or `backoff` queue.
pub fn incoming_pods(event: &'static str, queue: &'static str, count: u64) {
    if count > 0 {
        add(incoming(), (event.to_string(), queue.to_string()), count);
    }
}

/// Writes one counter family whose series are keyed by two label values.
fn write_counter(out: &mut String, name: &str, help: &str, series: &Series, keys: [&str; 2]) {
    metrics::write_header(out, name, help, "counter");
    for ((a, b), n) in series.locked().iter() {
        let labels = metrics::labels(&[(keys[0], a), (keys[1], b)]);
        out.push_str(&format!("{name}{{{labels}}} {n}\n"));
    }
}

/// Writes the scheduler's series in the text format.
pub fn write_all(out: &mut String) {
    write_counter(
        out,
        "scheduler_schedule_attempts_total",
        "Number of attempts to schedule pods, by the result.",
        attempts(),
        ["profile", "result"],
    );
    write_counter(
        out,
        "scheduler_queue_incoming_pods_total",
        "Number of pods added to scheduling queues by event and queue type.",
        incoming(),
        ["event", "queue"],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_are_counted_by_result_and_profile() {
        schedule_attempt("unschedulable", "test-profile");
        schedule_attempt("unschedulable", "test-profile");
        incoming_pods("NodeAdd", "active", 3);
        let mut out = String::new();
        write_all(&mut out);
        assert!(
            out.contains("scheduler_schedule_attempts_total{profile=\"test-profile\",result=\"unschedulable\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("scheduler_queue_incoming_pods_total{event=\"NodeAdd\",queue=\"active\"} 3\n"), "{out}");
    }
}
