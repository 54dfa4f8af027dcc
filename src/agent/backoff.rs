//! Per-key exponential back-off, as client-go's flowcontrol.Backoff that
//! the kubelet uses for crash loops (10 s doubling to 5 min) and image
//! pulls: an entry untouched for twice the maximum is forgotten, so a
//! container that ran for ten minutes starts again from the initial delay.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Entry {
    delay: Duration,
    last_update: Instant,
}

#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, entries: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn expired(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.last_update) > self.max * 2
    }

    /// Records a failure now: the next delay doubles (or starts over).
    pub fn next(&self, key: &str, now: Instant) -> Duration {
        let mut entries = self.lock();
        let entry = entries.entry(key.to_string()).or_insert(Entry { delay: Duration::ZERO, last_update: now });
        entry.delay = if entry.delay.is_zero() || now.saturating_duration_since(entry.last_update) > self.max * 2 {
            self.initial
        } else {
            (entry.delay * 2).min(self.max)
        };
        entry.last_update = now;
        entry.delay
    }

    /// The current delay for `key`, if one is recorded and not expired.
    pub fn get(&self, key: &str, now: Instant) -> Option<Duration> {
        let entries = self.lock();
        entries.get(key).filter(|e| !self.expired(e, now)).map(|e| e.delay)
    }

    /// Whether `event_time` (when the container last finished, say) is
    /// still within the back-off: how long is left, when it is.
    pub fn remaining_since(&self, key: &str, event_time: Instant, now: Instant) -> Option<Duration> {
        let entries = self.lock();
        let e = entries.get(key).filter(|e| !self.expired(e, now))?;
        let until = event_time + e.delay;
        (now < until).then(|| until - now)
    }

    pub fn reset(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Forgets entries that expired (called now and then to bound memory).
    pub fn gc(&self, now: Instant) {
        let max = self.max;
        self.lock().retain(|_, e| now.saturating_duration_since(e.last_update) <= max * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_maximum_and_forgets() {
        let b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let t0 = Instant::now();
        assert_eq!(b.next("k", t0), Duration::from_secs(10));
        assert_eq!(b.next("k", t0), Duration::from_secs(20));
        for _ in 0..10 {
            b.next("k", t0);
        }
        assert_eq!(b.get("k", t0), Some(Duration::from_secs(300)));
        let later = t0 + Duration::from_secs(601);
        assert_eq!(b.get("k", later), None);
        assert_eq!(b.next("k", later), Duration::from_secs(10));
    }

    #[test]
    fn remaining_counts_from_the_event() {
        let b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let t0 = Instant::now();
        b.next("k", t0);
        assert_eq!(b.remaining_since("k", t0, t0 + Duration::from_secs(4)), Some(Duration::from_secs(6)));
        assert_eq!(b.remaining_since("k", t0, t0 + Duration::from_secs(11)), None);
        assert_eq!(b.remaining_since("other", t0, t0), None);
    }
}
