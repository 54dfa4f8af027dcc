//! Leases in memory: their TTLs and deadlines. Grants and revokes are made
//! durable by the writer; renewals live here only (a restart renews every
//! lease to its full TTL, as etcd does).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::sync::LockExt;

#[derive(Debug, Clone, Copy)]
struct LeaseState {
    ttl: i64,
    deadline: Instant,
    /// A revoke for this lease is on its way to the writer.
    revoking: bool,
}

#[derive(Debug, Default)]
pub struct Leases {
    table: Mutex<HashMap<i64, LeaseState>>,
    changed: Notify,
}

fn deadline(ttl: i64) -> Instant {
    Instant::now() + Duration::from_secs(ttl.max(0) as u64)
}

impl Leases {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<i64, LeaseState>> {
        // A panic while holding this lock cannot leave the map half-updated.
        self.table.locked()
    }

    pub fn insert(&self, id: i64, ttl: i64) {
        self.table().insert(id, LeaseState { ttl, deadline: deadline(ttl), revoking: false });
        self.changed.notify_one();
    }

    pub fn remove(&self, id: i64) {
        self.table().remove(&id);
        self.changed.notify_one();
    }

    /// Pushes a live lease's deadline to a full TTL from now.
    pub fn renew(&self, id: i64) -> Option<i64> {
        let mut table = self.table();
        let lease = table.get_mut(&id).filter(|l| !l.revoking && l.deadline > Instant::now())?;
        lease.deadline = deadline(lease.ttl);
        Some(lease.ttl)
    }

    /// The granted TTL and the whole seconds left of a live lease.
    pub fn remaining(&self, id: i64) -> Option<(i64, i64)> {
        let table = self.table();
        let lease = table.get(&id).filter(|l| !l.revoking)?;
        let left = lease.deadline.saturating_duration_since(Instant::now()).as_secs() as i64;
        Some((lease.ttl, left))
    }

    pub fn ids(&self) -> Vec<i64> {
        let mut ids: Vec<i64> = self.table().keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Marks the leases past their deadline as being revoked and returns
    /// them, with the next deadline still to come.
    pub fn take_expired(&self) -> (Vec<i64>, Option<Instant>) {
        let now = Instant::now();
        let mut expired = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, lease) in self.table().iter_mut() {
            if lease.revoking {
                continue;
            }
            if lease.deadline <= now {
                lease.revoking = true;
                expired.push(*id);
            } else {
                next = Some(next.map_or(lease.deadline, |n| n.min(lease.deadline)));
            }
        }
        (expired, next)
    }

    /// Waits until a lease is granted, renewed or removed, or `until` passes.
    pub async fn wait(&self, until: Option<Instant>) {
        let notified = self.changed.notified();
        match until {
            Some(t) => {
                let _ = tokio::time::timeout_at(t.into(), notified).await;
            }
            None => notified.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_and_renewal() {
        let leases = Leases::default();
        leases.insert(1, 0);
        leases.insert(2, 100);
        let (expired, next) = leases.take_expired();
        assert_eq!(expired, vec![1]);
        assert!(next.is_some());
        assert_eq!(leases.renew(1), None, "a lease being revoked cannot be renewed");
        assert_eq!(leases.renew(2), Some(100));
        assert_eq!(leases.remaining(2).map(|r| r.0), Some(100));
        leases.remove(2);
        assert_eq!(leases.ids(), vec![1]);
    }
}
