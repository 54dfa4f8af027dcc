//! CPU usage as a rate (`usageNanoCores`) without a sampling loop: each
//! request's reading of a cgroup is kept, and the next request divides the
//! CPU time used since by the time passed. When there is no earlier
//! reading, or it is too old to say what "now" is, the caller takes two
//! readings a short interval apart instead.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sync::LockExt;

/// Readings older than this do not make a current rate.
pub const STALE: Duration = Duration::from_secs(120);
/// Readings closer than this give too noisy a rate: the last rate stands.
pub const MIN_INTERVAL: Duration = Duration::from_millis(200);
/// The interval between two fresh readings.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    usage_ns: u64,
    rate: Option<Rate>,
}

/// A CPU rate and the time between the two readings it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub nano_cores: u64,
    pub window: Duration,
}

/// The last reading of each cgroup, by a key naming it.
#[derive(Debug, Default)]
pub struct CpuRates {
    readings: Mutex<HashMap<String, Reading>>,
}

/// `delta usage / delta time` in nanocores.
pub fn nano_cores(prev_ns: u64, now_ns: u64, elapsed: Duration) -> Option<u64> {
    let dt = elapsed.as_nanos();
    if dt == 0 || now_ns < prev_ns {
        return None;
    }
    Some(((now_ns - prev_ns) as u128 * 1_000_000_000 / dt) as u64)
}

impl CpuRates {
    /// Whether `key` has a reading recent enough to rate against at `now`.
    pub fn has_fresh(&self, key: &str, now: Instant) -> bool {
        let readings = self.readings.locked();
        readings.get(key).is_some_and(|r| now.saturating_duration_since(r.at) < STALE)
    }

    /// Records a reading and gives the rate since the last one.
    pub fn record(&self, key: &str, now: Instant, usage_ns: u64) -> Option<Rate> {
        let mut readings = self.readings.locked();
        let prev = readings.get(key).copied();
        let rate = match prev {
            Some(p) if now.saturating_duration_since(p.at) < MIN_INTERVAL => return p.rate,
            Some(p) if now.saturating_duration_since(p.at) < STALE => {
                let window = now.saturating_duration_since(p.at);
                nano_cores(p.usage_ns, usage_ns, window).map(|nano_cores| Rate { nano_cores, window })
            }
            _ => None,
        };
        readings.insert(key.to_string(), Reading { at: now, usage_ns, rate });
        rate
    }

    /// Forgets cgroups not in `keep` (pods and containers that are gone).
    pub fn retain(&self, keep: &dyn Fn(&str) -> bool) {
        let mut readings = self.readings.locked();
        readings.retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_cpu_time_over_wall_time() {
        assert_eq!(nano_cores(0, 500_000_000, Duration::from_secs(1)), Some(500_000_000));
        assert_eq!(nano_cores(0, 1_000_000, Duration::from_millis(250)), Some(4_000_000));
        // A counter that went back (a new cgroup of the same name) gives none.
        assert_eq!(nano_cores(10, 5, Duration::from_secs(1)), None);
    }

    #[test]
    fn readings_rate_against_the_previous_one() {
        let rates = CpuRates::default();
        let t0 = Instant::now();
        assert!(!rates.has_fresh("a", t0));
        assert_eq!(rates.record("a", t0, 1_000), None);
        assert!(rates.has_fresh("a", t0 + Duration::from_secs(1)));
        let t1 = t0 + Duration::from_secs(2);
        let rate = Rate { nano_cores: 1_000_000_000, window: Duration::from_secs(2) };
        assert_eq!(rates.record("a", t1, 1_000 + 2_000_000_000), Some(rate));
        // Too close: the last rate is repeated, the reading not replaced.
        assert_eq!(rates.record("a", t1 + Duration::from_millis(10), 9_999_999_999), Some(rate));
        // Too old: no rate.
        assert!(!rates.has_fresh("a", t1 + STALE));
        assert_eq!(rates.record("a", t1 + STALE, 5_000_000_000), None);
        rates.retain(&|k| k != "a");
        assert!(!rates.has_fresh("a", t1 + STALE));
    }
}
