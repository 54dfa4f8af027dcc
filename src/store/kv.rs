//! Plain reads, a first-writer-wins create and a guarded move, for callers that keep bytes
//! of their own beside the API's objects (the cluster's bootstrap data).

use super::proto::{request_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest};
use super::{prefix_end, Result, Store};

/// The value of `key`, if it exists.
pub async fn get(store: &dyn Store, key: &[u8]) -> Result<Option<Vec<u8>>> {
    let resp = store.range(RangeRequest { key: key.to_vec(), ..Default::default() }).await?;
    Ok(resp.kvs.into_iter().next().map(|kv| kv.value))
}

/// The keys under `prefix` (no values).
pub async fn keys_under(store: &dyn Store, prefix: &[u8]) -> Result<Vec<Vec<u8>>> {
    let req =
        RangeRequest { key: prefix.to_vec(), range_end: prefix_end(prefix), keys_only: true, ..Default::default() };
    Ok(store.range(req).await?.kvs.into_iter().map(|kv| kv.key).collect())
}

/// Writes `key` only while no key exists under `prefix` (which holds
/// `key`), in one txn: of several writers racing, exactly one succeeds.
/// True when this one wrote.
pub async fn create_first_under(store: &dyn Store, prefix: &[u8], key: &[u8], value: Vec<u8>) -> Result<bool> {
    let put = PutRequest { key: key.to_vec(), value, ..Default::default() };
    let req = TxnRequest {
        compare: vec![Compare::none_in_range(prefix, &prefix_end(prefix))],
        success: vec![RequestOp { request: Some(request_op::Request::RequestPut(put)) }],
        failure: vec![],
    };
    Ok(store.txn(req).await?.succeeded)
}

/// Moves the value at `from` to `to` as `value`, in one txn guarded by
/// `from`'s revision: false when `from` is gone or changed meanwhile.
pub async fn replace(store: &dyn Store, from: &[u8], to: &[u8], value: Vec<u8>) -> Result<bool> {
    let resp = store.range(RangeRequest { key: from.to_vec(), ..Default::default() }).await?;
    let Some(current) = resp.kvs.into_iter().next() else { return Ok(false) };
    let put = PutRequest { key: to.to_vec(), value, ..Default::default() };
    let mut success = vec![RequestOp { request: Some(request_op::Request::RequestPut(put)) }];
    if from != to {
        let delete = DeleteRangeRequest { key: from.to_vec(), ..Default::default() };
        success.push(RequestOp { request: Some(request_op::Request::RequestDeleteRange(delete)) });
    }
    let req =
        TxnRequest { compare: vec![Compare::mod_revision_is(from, current.mod_revision)], success, failure: vec![] };
    Ok(store.txn(req).await?.succeeded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_first_create_under_a_prefix_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = crate::store::sqlite::SqliteStore::open(crate::store::sqlite::SqliteOptions::new(
            dir.path().join("state.db"),
        ))
        .expect("open");
        assert!(create_first_under(store.as_ref(), b"/b/", b"/b/one", b"1".to_vec()).await.unwrap());
        assert!(!create_first_under(store.as_ref(), b"/b/", b"/b/two", b"2".to_vec()).await.unwrap());
        assert!(!create_first_under(store.as_ref(), b"/b/", b"/b/one", b"3".to_vec()).await.unwrap());
        assert_eq!(get(store.as_ref(), b"/b/one").await.unwrap(), Some(b"1".to_vec()));
        assert_eq!(get(store.as_ref(), b"/b/two").await.unwrap(), None);
        assert_eq!(keys_under(store.as_ref(), b"/b/").await.unwrap(), vec![b"/b/one".to_vec()]);

        assert!(replace(store.as_ref(), b"/b/one", b"/b/two", b"2".to_vec()).await.unwrap());
        assert_eq!(keys_under(store.as_ref(), b"/b/").await.unwrap(), vec![b"/b/two".to_vec()]);
        assert_eq!(get(store.as_ref(), b"/b/two").await.unwrap(), Some(b"2".to_vec()));
        assert!(!replace(store.as_ref(), b"/b/one", b"/b/three", b"3".to_vec()).await.unwrap());
    }
}
