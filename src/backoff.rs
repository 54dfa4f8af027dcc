//! Exponential back-off, one helper for every component, after upstream's
//! `k8s.io/client-go/util/flowcontrol.Backoff` and the work queue's
//! per-item exponential rate limiter.
//!
//! - [`exponential`]: the delay after a number of failures,
//!   `initial · 2ⁿ` capped at a maximum (the scheduler's 1 s → 10 s pod
//!   back-off, the node lease's 200 ms → 7 s retries).
//! - [`doubled`]: one step of a retry loop that keeps its current delay
//!   (the kubelet's volume and sandbox retries, containerd's restarts).
//! - [`Backoff`]: per-key delays, each doubling on the key's failures up to
//!   a maximum, reset on success, forgotten after a quiet period, with GC
//!   of old entries (the kubelet's 10 s → 300 s crash loops and image
//!   pulls, the controllers' 100 ms → 300 s sync retries).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::LockExt;

/// The delay after `steps` doublings of `initial`: `initial · 2^steps`,
/// never more than `max` (and never overflowing on a long run of failures).
pub fn exponential(initial: Duration, max: Duration, steps: u32) -> Duration {
    initial.saturating_mul(2u32.saturating_pow(steps)).min(max)
}

/// The delay after `delay`: twice as long, never more than `max`.
pub fn doubled(delay: Duration, max: Duration) -> Duration {
    exponential(delay, max, 1)
}

#[derive(Debug)]
struct Entry {
    delay: Duration,
    last_update: Instant,
}

/// Per-key exponential back-off. Each [`next`](Backoff::next) of a key
/// records a failure: its delay starts at the initial one and doubles up to
/// the maximum. A key untouched for the quiet period (by default twice the
/// maximum, as flowcontrol.Backoff: a container that ran for ten minutes
/// starts again from the initial delay) is forgotten.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    /// How long a key may go without a failure before it starts over;
    /// `None`: only [`reset`](Backoff::reset) forgets it.
    reset_after: Option<Duration>,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Backoff {
    /// flowcontrol.NewBackOff: `initial` doubling to `max`, each key
    /// forgotten after twice `max` without a failure.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, reset_after: Some(max.saturating_mul(2)), entries: Mutex::new(HashMap::new()) }
    }

    /// The work queue's per-item exponential failure rate limiter:
    /// `initial` doubling to `max`, each key kept until it is
    /// [`reset`](Backoff::reset) (the item synced: upstream's `Forget`).
    pub fn per_item(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, reset_after: None, entries: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.locked()
    }

    fn expired(&self, e: &Entry, now: Instant) -> bool {
        self.reset_after.is_some_and(|quiet| now.saturating_duration_since(e.last_update) > quiet)
    }

    /// Records a failure of `key` at `now`: the delay before its next try,
    /// doubled from the last one (or the initial one, for a new or
    /// forgotten key).
    pub fn next(&self, key: &str, now: Instant) -> Duration {
        let mut entries = self.lock();
        let delay = match entries.get(key) {
            Some(e) if !self.expired(e, now) => doubled(e.delay, self.max),
            _ => self.initial,
        };
        entries.insert(key.to_string(), Entry { delay, last_update: now });
        delay
    }

    /// The current delay of `key`, if one is recorded and not forgotten.
    pub fn get(&self, key: &str, now: Instant) -> Option<Duration> {
        let entries = self.lock();
        entries.get(key).filter(|e| !self.expired(e, now)).map(|e| e.delay)
    }

    /// Whether `event_time` (when the container last finished, say) is
    /// still within `key`'s back-off: how long is left, when it is.
    pub fn remaining_since(&self, key: &str, event_time: Instant, now: Instant) -> Option<Duration> {
        let entries = self.lock();
        let e = entries.get(key).filter(|e| !self.expired(e, now))?;
        let until = event_time + e.delay;
        (now < until).then(|| until - now)
    }

    /// `key` succeeded: its next failure starts from the initial delay.
    pub fn reset(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Drops the entries that were forgotten (called now and then to bound
    /// memory).
    pub fn gc(&self, now: Instant) {
        let mut entries = self.lock();
        entries.retain(|_, e| !self.expired(e, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn exponential_doubles_from_the_initial_delay_and_caps() {
        assert_eq!(exponential(S, 10 * S, 0), S);
        assert_eq!(exponential(S, 10 * S, 2), 4 * S);
        assert_eq!(exponential(S, 10 * S, 3), 8 * S);
        assert_eq!(exponential(S, 10 * S, 4), 10 * S);
        // A long run of failures neither overflows nor passes the cap.
        assert_eq!(exponential(S, 10 * S, u32::MAX), 10 * S);
        assert_eq!(exponential(Duration::MAX / 2, Duration::MAX, 40), Duration::MAX);
    }

    #[test]
    fn doubled_is_one_step() {
        assert_eq!(doubled(S, 30 * S), 2 * S);
        assert_eq!(doubled(16 * S, 30 * S), 30 * S);
        assert_eq!(doubled(30 * S, 30 * S), 30 * S);
    }

    #[test]
    fn doubles_to_the_maximum_and_forgets_after_a_quiet_period() {
        let b = Backoff::new(10 * S, 300 * S);
        let t0 = Instant::now();
        assert_eq!(b.next("k", t0), 10 * S);
        assert_eq!(b.next("k", t0), 20 * S);
        for _ in 0..10 {
            b.next("k", t0);
        }
        assert_eq!(b.get("k", t0), Some(300 * S));
        // Twice the maximum without a failure: the key starts over.
        assert_eq!(b.get("k", t0 + 600 * S), Some(300 * S));
        let later = t0 + 601 * S;
        assert_eq!(b.get("k", later), None);
        assert_eq!(b.next("k", later), 10 * S);
    }

    #[test]
    fn keys_are_independent_and_reset_starts_over() {
        let b = Backoff::new(10 * S, 300 * S);
        let t0 = Instant::now();
        b.next("a", t0);
        assert_eq!(b.next("a", t0), 20 * S);
        assert_eq!(b.next("b", t0), 10 * S);
        b.reset("a");
        assert_eq!(b.get("a", t0), None);
        assert_eq!(b.next("a", t0), 10 * S);
    }

    #[test]
    fn remaining_counts_from_the_event() {
        let b = Backoff::new(10 * S, 300 * S);
        let t0 = Instant::now();
        b.next("k", t0);
        assert_eq!(b.remaining_since("k", t0, t0 + 4 * S), Some(6 * S));
        assert_eq!(b.remaining_since("k", t0, t0 + 11 * S), None);
        assert_eq!(b.remaining_since("other", t0, t0), None);
    }

    #[test]
    fn per_item_keeps_a_key_until_it_is_reset() {
        let ms = Duration::from_millis(1);
        let b = Backoff::per_item(100 * ms, 300 * S);
        let t0 = Instant::now();
        assert_eq!(b.next("a", t0), 100 * ms);
        assert_eq!(b.next("a", t0), 200 * ms);
        assert_eq!(b.next("b", t0), 100 * ms);
        for _ in 0..30 {
            b.next("a", t0);
        }
        assert_eq!(b.next("a", t0), 300 * S);
        // No quiet period: a day later the key still backs off at the cap.
        let day = t0 + 86_400 * S;
        b.gc(day);
        assert_eq!(b.next("a", day), 300 * S);
        b.reset("a");
        assert_eq!(b.next("a", day), 100 * ms);
    }

    #[test]
    fn gc_drops_only_forgotten_keys() {
        let b = Backoff::new(S, 10 * S);
        let t0 = Instant::now();
        b.next("old", t0);
        b.next("new", t0 + 15 * S);
        b.gc(t0 + 21 * S);
        assert_eq!(b.lock().len(), 1);
        assert_eq!(b.get("new", t0 + 21 * S), Some(S));
    }
}
