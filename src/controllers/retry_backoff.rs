//! Per-object retry delays for failed syncs, as client-go's per-item
//! exponential rate limiter gives them: doubling from a short base on each
//! failure of the same object, capped, and forgotten on its next success.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

const BASE: Duration = Duration::from_millis(100);
const MAX: Duration = Duration::from_secs(300);

#[derive(Default)]
pub struct RetryBackoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl RetryBackoff {
    /// The delay before retrying `key` after one more failure.
    pub fn next(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_string()).or_default();
        *n = n.saturating_add(1);
        BASE.saturating_mul(1u32 << (*n - 1).min(20)).min(MAX)
    }

    /// `key` synced: its next failure starts from the base delay again.
    pub fn forget(&self, key: &str) {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_forgets() {
        let b = RetryBackoff::default();
        assert_eq!(b.next("a"), Duration::from_millis(100));
        assert_eq!(b.next("a"), Duration::from_millis(200));
        assert_eq!(b.next("b"), Duration::from_millis(100));
        for _ in 0..30 {
            b.next("a");
        }
        assert_eq!(b.next("a"), MAX);
        b.forget("a");
        assert_eq!(b.next("a"), Duration::from_millis(100));
    }
}
