//! Unit tests of the embedded backend against a temporary database.

use super::*;

async fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(SqliteOptions::new(dir.path().join("state.db"))).expect("open");
    (dir, store)
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest { key: key.into(), value: value.into(), ..Default::default() }
}

#[tokio::test]
async fn fresh_store_is_at_revision_one() {
    let (_dir, s) = store().await;
    let resp = s.range(RangeRequest { key: b"a".to_vec(), ..Default::default() }).await.unwrap();
    assert_eq!(resp.header.unwrap().revision, 1);
    assert!(resp.kvs.is_empty());
}
