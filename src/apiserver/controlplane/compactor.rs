//! Compaction as kube-apiserver runs it (`--etcd-compaction-interval`):
//! every interval, the store is compacted to the revision it was at one
//! interval earlier, so watchers and paged lists have one interval of
//! history to catch up with and nothing older is kept.
//!
//! Several API servers may share one etcd. They agree through the version
//! of the key `compact_rev_key`, as upstream's servers do: each remembers
//! the version it last saw and writes the key only if nobody else has since
//! (a compare on the version); whoever wins the write compacts, the others
//! learn the new version and try again one interval later. So a cluster
//! compacts once per interval whatever the number of servers, and when the
//! server that did it goes away another takes over within two intervals.
//!
//! One difference from upstream: while the store refuses writes for lack
//! of space (etcd's NOSPACE alarm) the handshake cannot be written, and
//! upstream stops compacting at the moment it is needed most. Here the
//! compaction is then made without the handshake (a second server doing
//! the same is refused harmlessly as already compacted), so the space can
//! be recovered.

use std::sync::Arc;
use std::time::Duration;

use crate::store::proto::*;
use crate::store::{Store, StoreError};

/// The key whose version the API servers sharing a store agree through.
pub const COMPACT_REV_KEY: &[u8] = b"compact_rev_key";

/// What one compactor remembers between rounds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CompactState {
    /// The version of `compact_rev_key` last seen (upstream's "compact time").
    pub version: i64,
    /// The store's revision at the last round: the next compaction's target.
    pub rev: i64,
}

/// Starts the compactor; `None` when `interval` is zero (compaction off).
pub fn start(store: Arc<dyn Store>, interval: Duration) -> Option<tokio::task::JoinHandle<()>> {
    if interval.is_zero() {
        tracing::info!("etcd compaction is off (--etcd-compaction-interval=0)");
        return None;
    }
    Some(tokio::spawn(async move {
        let mut state = CompactState::default();
        loop {
            tokio::time::sleep(interval).await;
            match compact(store.as_ref(), &mut state).await {
                Ok(Some(rev)) => tracing::debug!(revision = rev, "compacted the store"),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "compaction failed"),
            }
        }
    }))
}

/// One round: the handshake, then (when this server won it and knows a
/// revision from the round before) the compaction. Answers the revision
/// compacted to, if any.
pub async fn compact(store: &dyn Store, state: &mut CompactState) -> Result<Option<i64>, StoreError> {
    let handshake = TxnRequest {
        compare: vec![Compare::version_is(COMPACT_REV_KEY, state.version)],
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: COMPACT_REV_KEY.to_vec(),
                value: state.rev.to_string().into_bytes(),
                ..Default::default()
            })),
        }],
        failure: vec![RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: COMPACT_REV_KEY.to_vec(),
                ..Default::default()
            })),
        }],
    };
    let resp = match store.txn(handshake).await {
        Ok(resp) => resp,
        Err(StoreError::NoSpace) => return compact_without_handshake(store, state).await,
        Err(e) => return Err(e),
    };
    let current = resp.header.as_ref().map_or(0, |h| h.revision);
    if !resp.succeeded {
        // Another server compacted since: follow it and wait a round.
        state.version = resp
            .responses
            .iter()
            .find_map(|op| match &op.response {
                Some(response_op::Response::ResponseRange(r)) => r.kvs.first().map(|kv| kv.version),
                _ => None,
            })
            .unwrap_or(0);
        state.rev = current;
        return Ok(None);
    }
    state.version += 1;
    let target = std::mem::replace(&mut state.rev, current);
    if target == 0 {
        // Nothing is compacted on the first round after a start.
        return Ok(None);
    }
    run(store, target).await
}

/// Under NOSPACE: compacts to the remembered revision without writing.
async fn compact_without_handshake(store: &dyn Store, state: &mut CompactState) -> Result<Option<i64>, StoreError> {
    let head = store.range(RangeRequest { key: COMPACT_REV_KEY.to_vec(), ..Default::default() }).await?;
    let current = head.header.as_ref().map_or(0, |h| h.revision);
    let target = std::mem::replace(&mut state.rev, current);
    if target == 0 {
        return Ok(None);
    }
    tracing::warn!(revision = target, "the store is out of space: compacting without the compact_rev_key handshake");
    run(store, target).await
}

async fn run(store: &dyn Store, target: i64) -> Result<Option<i64>, StoreError> {
    match store.compact(CompactionRequest { revision: target, physical: false }).await {
        Ok(_) => Ok(Some(target)),
        // Someone compacted further already (by hand, or without the handshake).
        Err(StoreError::Compacted { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::{SqliteOptions, SqliteStore};

    async fn put(store: &dyn Store, key: &str) -> i64 {
        let req = PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() };
        store.put(req).await.expect("put").header.expect("header").revision
    }

    #[tokio::test]
    async fn two_servers_compact_once_per_round_to_the_revision_of_the_round_before() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("state.db"))).expect("open");
        let (mut a, mut b) = (CompactState::default(), CompactState::default());
        put(store.as_ref(), "k").await;
        // Round 1: a wins the handshake but has no revision yet; b learns a's version.
        assert_eq!(compact(store.as_ref(), &mut a).await.expect("a1"), None);
        assert_eq!(compact(store.as_ref(), &mut b).await.expect("b1"), None);
        assert_eq!(b.version, 1);
        let seen = a.rev;
        put(store.as_ref(), "k").await;
        // Round 2: a compacts to what it saw in round 1; b, behind, waits.
        assert_eq!(compact(store.as_ref(), &mut a).await.expect("a2"), Some(seen));
        assert_eq!(compact(store.as_ref(), &mut b).await.expect("b2"), None);
        assert_eq!((a.version, b.version), (2, 2));
        // a goes away: b takes over on its next round.
        put(store.as_ref(), "k").await;
        let next = b.rev;
        assert_eq!(compact(store.as_ref(), &mut b).await.expect("b3"), Some(next));
        let old = RangeRequest { key: b"k".to_vec(), revision: seen - 1, ..Default::default() };
        assert!(matches!(store.range(old).await, Err(StoreError::Compacted { .. })));
    }
}
