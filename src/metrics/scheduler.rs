//! The scheduler's series, under upstream's names:
//! `scheduler_schedule_attempts_total{result,profile}` (a cycle that bound
//! the pod, found no node, or failed with an error) and
//! `scheduler_queue_incoming_pods_total{event,queue}` (pods a cluster event
//! moved out of the unschedulable pods). Served by the API server's
//! /metrics, as the controllers' work queues are.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use super as metrics;

type Series = Mutex<BTreeMap<(&'static str, String), u64>>;

fn attempts() -> &'static Series {
    static ATTEMPTS: OnceLock<Series> = OnceLock::new();
    ATTEMPTS.get_or_init(Default::default)
}

fn incoming() -> &'static Series {
    static INCOMING: OnceLock<Series> = OnceLock::new();
    INCOMING.get_or_init(Default::default)
}

fn add(series: &Series, key: (&'static str, String), by: u64) {
    *series.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default() += by;
}

/// One scheduling cycle of a pod of `profile` ended with `result`
/// (`scheduled`, `unschedulable` or `error`).
pub fn schedule_attempt(result: &'static str, profile: &str) {
    add(attempts(), (result, profile.to_string()), 1);
}

/// `event` moved `count` pods to the `active` or `backoff` queue.
pub fn incoming_pods(event: &'static str, queue: &'static str, count: u64) {
    if count > 0 {
        add(incoming(), (event, queue.to_string()), count);
    }
}

/// Writes the scheduler's series in the text format.
pub fn write_all(out: &mut String) {
    metrics::write_header(
        out,
        "scheduler_schedule_attempts_total",
        "Number of attempts to schedule pods, by the result.",
        "counter",
    );
    for ((result, profile), n) in attempts().lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let labels = metrics::labels(&[("profile", profile), ("result", result)]);
        out.push_str(&format!("scheduler_schedule_attempts_total{{{labels}}} {n}\n"));
    }
    metrics::write_header(
        out,
        "scheduler_queue_incoming_pods_total",
        "Number of pods added to scheduling queues by event and queue type.",
        "counter",
    );
    for ((event, queue), n) in incoming().lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let labels = metrics::labels(&[("event", event), ("queue", queue)]);
        out.push_str(&format!("scheduler_queue_incoming_pods_total{{{labels}}} {n}\n"));
    }
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
