//! Store leases for objects that expire (Events, `--event-ttl`), handed out
//! as upstream's etcd3 lease manager does: one lease is shared by every
//! object written within a short window, granted a little longer than the
//! TTL asked for (5 % of it, at most a minute), so that a burst of Events
//! costs one lease rather than one each, and no object outlives its TTL by
//! more than that margin.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::store::proto::LeaseGrantRequest;
use crate::store::{Store, StoreError};

/// Upstream's bound on the extra time a shared lease is granted.
const REUSE_SECONDS_MAX: i64 = 60;
/// Upstream's share of the TTL a lease may be reused for.
const REUSE_PERCENT: f64 = 0.05;

pub struct LeaseManager {
    store: Arc<dyn Store>,
    /// The lease last granted and when it expires.
    prev: Mutex<Option<(i64, Instant)>>,
}

fn reuse_seconds(ttl: i64) -> i64 {
    ((ttl as f64 * REUSE_PERCENT) as i64).min(REUSE_SECONDS_MAX)
}

/// Whether a lease expiring at `expires` may carry an object that must
/// live `ttl` seconds from `now`: it outlives the TTL, by no more than the
/// reuse margin.
fn reusable(now: Instant, expires: Instant, ttl: i64) -> bool {
    let secs = |s: i64| Duration::from_secs(s.max(0) as u64);
    now + secs(ttl) < expires && now + secs(ttl + reuse_seconds(ttl)) > expires
}

impl LeaseManager {
    pub fn new(store: Arc<dyn Store>) -> Self {
        LeaseManager { store, prev: Mutex::new(None) }
    }

    /// A lease that keeps an object at least `ttl` seconds.
    pub async fn lease_for(&self, ttl: i64) -> Result<i64, StoreError> {
        let mut prev = self.prev.lock().await;
        let now = Instant::now();
        if let Some((id, expires)) = *prev {
            if reusable(now, expires, ttl) {
                return Ok(id);
            }
        }
        let granted = ttl + reuse_seconds(ttl);
        let resp = self.store.lease_grant(LeaseGrantRequest { ttl: granted, id: 0 }).await?;
        *prev = Some((resp.id, now + Duration::from_secs(resp.ttl.max(0) as u64)));
        tracing::debug!(lease = resp.id, ttl = resp.ttl, "granted a lease for expiring objects");
        Ok(resp.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_reused_within_its_margin_only() {
        assert_eq!(reuse_seconds(3600), 60);
        assert_eq!(reuse_seconds(100), 5);
        let now = Instant::now();
        let expires = now + Duration::from_secs(3630);
        assert!(reusable(now, expires, 3600));
        assert!(!reusable(now + Duration::from_secs(31), expires, 3600), "too short for a full TTL");
        assert!(!reusable(now, now + Duration::from_secs(3700), 3600), "would outlive the TTL by too much");
    }

    #[tokio::test]
    async fn objects_written_together_share_a_lease() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = crate::store::sqlite::SqliteStore::open(crate::store::sqlite::SqliteOptions::new(
            dir.path().join("state.db"),
        ))
        .expect("open");
        let leases = LeaseManager::new(store.clone());
        let a = leases.lease_for(3600).await.expect("lease");
        let b = leases.lease_for(3600).await.expect("lease");
        assert_eq!(a, b);
        let other = leases.lease_for(10).await.expect("lease");
        assert_ne!(a, other, "a much shorter TTL needs its own lease");
    }
}
