//! The space quota, as etcd's `--quota-backend-bytes`: a write that would
//! take the database past the quota raises the NOSPACE alarm, and while the
//! alarm is raised every request that adds data (a put, a txn with a put, a
//! lease grant) is refused with etcd's "database space exceeded". Reads,
//! deletes, lease revokes and compaction go on, so an operator can free
//! space, then disarm the alarm (`etcdctl alarm disarm`), as with etcd.
//!
//! The size that counts is the part of the file holding live pages: pages
//! freed by compaction count as free at once, before the vacuum hands them
//! back to the file system.

use crate::store::proto::{request_op::Request, AlarmMember, AlarmType, RequestOp, TxnRequest};

/// etcd's default quota (2 GiB), used when the quota is given as 0.
pub const DEFAULT_QUOTA_BYTES: i64 = 2 * 1024 * 1024 * 1024;
/// What etcd counts for the bookkeeping of one key beyond its bytes.
const KV_OVERHEAD: i64 = 256;

/// The bytes a request would add: its puts (nested ones included), the
/// costlier branch of a txn, as etcd counts them. Zero for a request that
/// only reads or deletes.
pub fn txn_cost(req: &TxnRequest) -> i64 {
    branch_cost(&req.success).max(branch_cost(&req.failure))
}

fn branch_cost(ops: &[RequestOp]) -> i64 {
    ops.iter()
        .map(|op| match &op.request {
            Some(Request::RequestPut(p)) => KV_OVERHEAD + p.key.len() as i64 + p.value.len() as i64,
            Some(Request::RequestTxn(t)) => txn_cost(t),
            _ => 0,
        })
        .sum()
}

/// The cost etcd gives a lease grant.
pub const LEASE_GRANT_COST: i64 = 8 + 8;

/// The writer's view of the quota.
#[derive(Debug)]
pub struct Quota {
    /// None: no quota.
    limit: Option<i64>,
    /// Bytes of live pages after the last commit.
    in_use: i64,
    /// What the writes admitted since then may add.
    pending: i64,
}

/// What `Quota::admit` decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// Refused; the alarm is already raised.
    Refused,
    /// Refused, and the NOSPACE alarm must be raised now.
    RaiseAlarm,
}

impl Quota {
    /// `bytes`: 0 for etcd's default, negative for no quota.
    pub fn new(bytes: i64) -> Self {
        let limit = match bytes {
            0 => Some(DEFAULT_QUOTA_BYTES),
            b if b < 0 => None,
            b => Some(b),
        };
        Quota { limit, in_use: 0, pending: 0 }
    }

    /// Decides on a request costing `cost` bytes, `nospace` telling whether
    /// the alarm is raised.
    pub fn admit(&mut self, cost: i64, nospace: bool) -> Admission {
        if cost == 0 {
            return Admission::Admitted;
        }
        if nospace {
            return Admission::Refused;
        }
        match self.limit {
            Some(limit) if self.in_use + self.pending + cost > limit => Admission::RaiseAlarm,
            _ => {
                self.pending += cost;
                Admission::Admitted
            }
        }
    }

    /// Whether the size in use should be measured again after a commit:
    /// once the writes admitted since the last measure may have taken a
    /// 64th of the room that was left. Far below the quota that is rarely
    /// (measuring costs three pragma reads, a tenth of a small commit);
    /// near it, after every commit, so that the alarm is raised where a
    /// measure at every commit would raise it.
    pub fn stale(&self) -> bool {
        match self.limit {
            Some(limit) => self.pending.saturating_mul(64) >= (limit - self.in_use).max(0),
            None => false,
        }
    }

    /// Records the size in use after a commit (or a rollback).
    pub fn measured(&mut self, in_use: i64) {
        self.in_use = in_use;
        self.pending = 0;
    }

    pub fn enabled(&self) -> bool {
        self.limit.is_some()
    }
}

/// Whether `alarms` holds a NOSPACE alarm of any member.
pub fn nospace(alarms: &[AlarmMember]) -> bool {
    alarms.iter().any(|a| a.alarm == AlarmType::Nospace as i32)
}

/// etcd's `Status.errors` entry for an alarm.
pub fn describe(a: &AlarmMember) -> String {
    let name = AlarmType::try_from(a.alarm).map(|t| t.as_str_name()).unwrap_or("UNKNOWN");
    format!("memberID:{} alarm:{name} ", a.member_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::proto::PutRequest;

    fn put(key: &str, value: usize) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: key.into(),
                value: vec![0; value],
                ..Default::default()
            })),
        }
    }

    #[test]
    fn costs_count_puts_of_the_costlier_branch() {
        let reads_only = TxnRequest::default();
        assert_eq!(txn_cost(&reads_only), 0);
        let txn = TxnRequest {
            success: vec![put("a", 10)],
            failure: vec![put("bb", 100), put("c", 0)],
            ..Default::default()
        };
        assert_eq!(txn_cost(&txn), (256 + 2 + 100) + (256 + 1));
    }

    #[test]
    fn the_alarm_is_raised_once_the_quota_would_be_passed() {
        let mut q = Quota::new(1000);
        q.measured(600);
        assert_eq!(q.admit(300, false), Admission::Admitted);
        assert_eq!(q.admit(0, true), Admission::Admitted, "reads and deletes always pass");
        assert_eq!(q.admit(200, false), Admission::RaiseAlarm, "600 + 300 + 200 is over 1000");
        assert_eq!(q.admit(1, true), Admission::Refused);
        q.measured(100);
        assert_eq!(q.admit(200, false), Admission::Admitted);
        let mut none = Quota::new(-1);
        assert_eq!(none.admit(i64::MAX / 2, false), Admission::Admitted);
        assert_eq!(Quota::new(0).limit, Some(DEFAULT_QUOTA_BYTES));
    }

    #[test]
    fn the_size_is_measured_more_often_as_the_quota_nears() {
        let mut q = Quota::new(64_000);
        q.measured(0);
        assert!(!q.stale(), "nothing admitted since the measure");
        assert_eq!(q.admit(900, false), Admission::Admitted);
        assert!(!q.stale(), "900 bytes of 64,000 left");
        assert_eq!(q.admit(100, false), Admission::Admitted);
        assert!(q.stale(), "a 64th of the room left");
        q.measured(63_000);
        assert_eq!(q.admit(16, false), Admission::Admitted);
        assert!(q.stale(), "near the quota, every write");
        assert!(!Quota::new(-1).stale(), "no quota, no measure");
    }

    #[test]
    fn status_errors_read_like_etcd() {
        let a = AlarmMember { member_id: 42, alarm: AlarmType::Nospace as i32 };
        assert_eq!(describe(&a), "memberID:42 alarm:NOSPACE ");
        assert!(nospace(&[a]));
    }
}
