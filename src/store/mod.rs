//! The datastore: etcd's data model (a global revision, per-key create and
//! mod revisions, versions and leases, ranges, transactions, watches,
//! compaction) behind one trait, with an embedded SQLite backend and an
//! external etcd backend, and the etcd v3 gRPC face that serves either one.
//!
//! The store knows keys and bytes only, never Kubernetes objects. Its
//! vocabulary is etcd's own wire types (`proto`), so the gRPC face and the
//! external-etcd backend pass requests through without translation.

pub mod compare;
pub mod error;
pub mod etcd;
pub mod grpc;
pub mod keys;
pub mod kv;
pub mod proto;
pub mod sqlite;

use std::pin::Pin;

use async_trait::async_trait;
use futures_util::Stream;

pub use error::{Result, StoreError};
pub use keys::{prefix_end, KeyRange};
use proto::*;

/// The largest request the store accepts, as etcd's `--max-request-bytes`.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// etcd's bound on operations in one branch of a transaction.
pub const MAX_TXN_OPS: usize = 128;
/// etcd's bound on a lease's TTL, in seconds.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;
/// The etcd API version reported by `Status`; watch progress requests are
/// answered with 3.5.13+ semantics (only once every watcher is synced).
pub const ETCD_API_VERSION: &str = "3.5.16";

pub type WatchRequestStream = Pin<Box<dyn Stream<Item = WatchRequest> + Send>>;
pub type WatchResponseStream = Pin<Box<dyn Stream<Item = Result<WatchResponse>> + Send>>;
pub type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse>> + Send>>;

/// A key-value store with etcd's semantics. Every response carries a header
/// whose revision is the store's current revision, historical reads included.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse>;
    async fn put(&self, req: PutRequest) -> Result<PutResponse>;
    async fn delete_range(&self, req: DeleteRangeRequest) -> Result<DeleteRangeResponse>;
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse>;
    async fn compact(&self, req: CompactionRequest) -> Result<CompactionResponse>;

    /// One multiplexed watch stream, as etcd's `Watch` RPC: create, cancel and
    /// progress requests go in; created, event, progress and cancel responses
    /// come out. The stream ends when `requests` ends.
    async fn watch(&self, requests: WatchRequestStream) -> Result<WatchResponseStream>;

    async fn lease_grant(&self, req: LeaseGrantRequest) -> Result<LeaseGrantResponse>;
    async fn lease_revoke(&self, req: LeaseRevokeRequest) -> Result<LeaseRevokeResponse>;
    /// Renews a lease once; a lease that is gone answers with `ttl == 0`.
    async fn lease_keep_alive(&self, req: LeaseKeepAliveRequest) -> Result<LeaseKeepAliveResponse>;
    /// A lease that is gone answers with `ttl == -1`.
    async fn lease_time_to_live(&self, req: LeaseTimeToLiveRequest) -> Result<LeaseTimeToLiveResponse>;
    async fn lease_leases(&self, req: LeaseLeasesRequest) -> Result<LeaseLeasesResponse>;

    async fn status(&self) -> Result<StatusResponse>;
    async fn alarm(&self, req: AlarmRequest) -> Result<AlarmResponse>;
    async fn member_list(&self, req: MemberListRequest) -> Result<MemberListResponse>;
    async fn defragment(&self) -> Result<DefragmentResponse>;
    /// A consistent copy of the whole database, streamed in chunks and ended
    /// by the SHA-256 of what came before, as etcd's snapshot is.
    async fn snapshot(&self) -> Result<SnapshotStream>;
}

/// Rejects requests etcd would reject before they reach the backend.
pub(crate) fn check_txn(req: &TxnRequest) -> Result<()> {
    if req.success.len() > MAX_TXN_OPS || req.failure.len() > MAX_TXN_OPS {
        return Err(StoreError::TooManyOps);
    }
    for c in &req.compare {
        if c.key.is_empty() {
            return Err(StoreError::EmptyKey);
        }
    }
    for branch in [&req.success, &req.failure] {
        check_ops(branch)?;
    }
    Ok(())
}

fn check_ops(ops: &[RequestOp]) -> Result<()> {
    use request_op::Request;
    let mut written: Vec<KeyRange> = Vec::new();
    let mut deleted: Vec<KeyRange> = Vec::new();
    for op in ops {
        match &op.request {
            Some(Request::RequestRange(r)) if r.key.is_empty() => return Err(StoreError::EmptyKey),
            Some(Request::RequestPut(p)) => {
                check_put(p)?;
                let k = KeyRange::Single(p.key.clone());
                if written.iter().any(|w| w == &k) {
                    return Err(StoreError::DuplicateKey);
                }
                written.push(k);
            }
            Some(Request::RequestDeleteRange(d)) => {
                if d.key.is_empty() {
                    return Err(StoreError::EmptyKey);
                }
                deleted.push(KeyRange::new(&d.key, &d.range_end));
            }
            Some(Request::RequestTxn(t)) => check_txn(t)?,
            _ => {}
        }
    }
    if written.iter().any(|w| deleted.iter().any(|d| d.overlaps(w))) {
        return Err(StoreError::DuplicateKey);
    }
    Ok(())
}

pub(crate) fn check_put(p: &PutRequest) -> Result<()> {
    if p.key.is_empty() {
        return Err(StoreError::EmptyKey);
    }
    if p.ignore_value && !p.value.is_empty() {
        return Err(StoreError::ValueProvided);
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(StoreError::LeaseProvided);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str) -> RequestOp {
        RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest { key: key.into(), ..Default::default() })),
        }
    }

    #[test]
    fn txn_checks_match_etcd() {
        let dup = TxnRequest { success: vec![put("a"), put("a")], ..Default::default() };
        assert!(matches!(check_txn(&dup), Err(StoreError::DuplicateKey)));
        let ok = TxnRequest { success: vec![put("a")], failure: vec![put("a")], ..Default::default() };
        assert!(check_txn(&ok).is_ok());
        let many = TxnRequest { success: (0..129).map(|i| put(&i.to_string())).collect(), ..Default::default() };
        assert!(matches!(check_txn(&many), Err(StoreError::TooManyOps)));
        let del = RequestOp {
            request: Some(request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                key: b"a".to_vec(),
                range_end: b"b".to_vec(),
                prev_kv: false,
            })),
        };
        let overlap = TxnRequest { success: vec![put("a1"), del], ..Default::default() };
        assert!(matches!(check_txn(&overlap), Err(StoreError::DuplicateKey)));
    }
}
