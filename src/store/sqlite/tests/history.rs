//! Reads at older revisions against a model, and the upgrade of a schema-3
//! store: the log has no index by key, so history is walked back from
//! `current` (`read::Latest`).

use super::*;

/// Every key of a prefix as it was at every revision, against a model: keys
/// put, deleted and created again in a pseudo-random order, read at each
/// older revision with and without a limit and as a count, before and after
/// a compaction; and a watch from the start sees a created-again key's put
/// without a prev_kv, as etcd sends it.
#[tokio::test]
async fn reads_at_older_revisions_follow_each_key_back_from_current() {
    use std::collections::BTreeMap;
    let (_dir, s) = store().await;
    // states[r]: what each key held after revision r.
    let mut states: Vec<BTreeMap<String, String>> = vec![BTreeMap::new(), BTreeMap::new()];
    let mut seed = 7u64;
    for i in 0..400 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let key = format!("p/{}", (seed >> 33) % 12);
        let mut state = states.last().cloned().unwrap_or_default();
        let delete = (seed >> 20).is_multiple_of(3);
        if delete && state.contains_key(&key) {
            s.delete_range(DeleteRangeRequest { key: key.clone().into(), ..Default::default() }).await.unwrap();
            state.remove(&key);
        } else if !delete {
            s.put(put(&key, &i.to_string())).await.unwrap();
            state.insert(key, i.to_string());
        } else {
            continue;
        }
        states.push(state);
    }
    s.put(put("q", "outside the prefix")).await.unwrap();
    let head = states.len() as i64;
    let check = |s: Arc<SqliteStore>, states: Vec<BTreeMap<String, String>>, from: i64| async move {
        for rev in from..head {
            let want: Vec<(String, String)> =
                states[rev as usize].iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let range = |limit, count_only| RangeRequest {
                key: b"p/".to_vec(),
                range_end: b"p0".to_vec(),
                revision: rev,
                limit,
                count_only,
                ..Default::default()
            };
            let all = s.range(range(0, false)).await.unwrap();
            let got: Vec<(String, String)> = all
                .kvs
                .iter()
                .map(|kv| (String::from_utf8_lossy(&kv.key).into(), String::from_utf8_lossy(&kv.value).into()))
                .collect();
            assert_eq!(got, want, "at revision {rev}");
            assert_eq!(all.count, want.len() as i64, "count at revision {rev}");
            assert!(all.kvs.iter().all(|kv| kv.mod_revision <= rev));
            let two = s.range(range(2, false)).await.unwrap();
            assert_eq!(two.kvs.len(), want.len().min(2), "limit at revision {rev}");
            assert_eq!((two.more, two.count), (want.len() > 2, want.len() as i64), "more at revision {rev}");
            assert_eq!(s.range(range(0, true)).await.unwrap().count, want.len() as i64);
        }
    };
    check(s.clone(), states.clone(), 1).await;

    let create = WatchCreateRequest {
        key: b"p/".to_vec(),
        range_end: b"p0".to_vec(),
        start_revision: 2,
        prev_kv: true,
        ..Default::default()
    };
    let (_tx, mut stream) = watch(&s, create).await;
    assert!(next(&mut stream).await.created);
    let mut seen = 0;
    while seen < states.len() - 2 {
        for ev in next(&mut stream).await.events {
            let kv = ev.kv.unwrap();
            let before = &states[kv.mod_revision as usize - 1];
            let key = String::from_utf8_lossy(&kv.key).to_string();
            let prev = ev.prev_kv.map(|p| String::from_utf8_lossy(&p.value).to_string());
            assert_eq!(prev.as_ref(), before.get(&key), "prev_kv at revision {}", kv.mod_revision);
            seen += 1;
        }
    }

    let compact_at = head / 2;
    s.compact(CompactionRequest { revision: compact_at, physical: true }).await.unwrap();
    check(s.clone(), states.clone(), compact_at).await;
    // The keys deleted at or below the compact revision have no entry left.
    let entries = query_i64(&s, "SELECT count(*) FROM current WHERE id < 0").await;
    let deleted_since = (0..12)
        .filter(|k| {
            let key = format!("p/{k}");
            let deleted_at =
                (1..states.len()).rev().find(|&r| states[r - 1].contains_key(&key) && !states[r].contains_key(&key));
            let live = states.last().is_some_and(|st| st.contains_key(&key));
            !live && deleted_at.is_some_and(|r| r as i64 > compact_at)
        })
        .count() as i64;
    assert_eq!(entries, deleted_since, "entries of keys deleted since the compaction");
}

/// A store written by schema 3 (an index of the log by key, no entry for a
/// deleted key, a key created again with no link to its tombstone) reads its
/// whole history once upgraded.
#[test]
fn a_schema_3_store_is_upgraded_with_its_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let conn = rusqlite::Connection::open(&path).expect("open");
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE log (id INTEGER PRIMARY KEY, key BLOB NOT NULL, create_rev INTEGER NOT NULL,
                 version INTEGER NOT NULL, lease INTEGER NOT NULL, value BLOB NOT NULL, prev_id INTEGER NOT NULL);
             CREATE INDEX log_key ON log (key, id);
             CREATE INDEX log_lease ON log (lease) WHERE lease != 0;
             CREATE TABLE current (key BLOB PRIMARY KEY, id INTEGER NOT NULL) WITHOUT ROWID;
             CREATE TABLE lease (id INTEGER PRIMARY KEY, ttl INTEGER NOT NULL);
             CREATE TABLE meta (one INTEGER PRIMARY KEY CHECK (one = 0), rev INTEGER NOT NULL,
                 compact_rev INTEGER NOT NULL, compact_cursor INTEGER NOT NULL,
                 cluster_id INTEGER NOT NULL, member_id INTEGER NOT NULL);
             CREATE TABLE alarm (member_id INTEGER NOT NULL, alarm INTEGER NOT NULL, PRIMARY KEY (member_id, alarm));
             INSERT INTO meta VALUES (0, 1, 0, 0, 11, 12);
             -- a: put at 2, deleted at 3, created again at 4; b: put at 5, deleted at 6.
             INSERT INTO log VALUES (2 << 24, x'61', 2, 1, 0, x'6131', 0);
             INSERT INTO log VALUES (3 << 24, x'61', 0, 0, 0, x'', 2 << 24);
             INSERT INTO log VALUES (4 << 24, x'61', 4, 1, 0, x'6132', 0);
             INSERT INTO log VALUES (5 << 24, x'62', 5, 1, 0, x'6231', 0);
             INSERT INTO log VALUES (6 << 24, x'62', 0, 0, 0, x'', 5 << 24);
             INSERT INTO current VALUES (x'61', 4 << 24);
             PRAGMA user_version = 3;",
        )
        .expect("schema 3");
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let s = SqliteStore::open(SqliteOptions::new(path.clone())).expect("upgrade");
        assert_eq!(query_i64(&s, "PRAGMA user_version").await, 4);
        assert_eq!(query_i64(&s, "SELECT count(*) FROM sqlite_master WHERE name = 'log_key'").await, 0);
        let values = |resp: RangeResponse| resp.kvs.into_iter().map(|kv| kv.value).collect::<Vec<_>>();
        let all = |rev| RangeRequest { key: vec![0], range_end: vec![0], revision: rev, ..Default::default() };
        assert_eq!(values(s.range(all(2)).await.unwrap()), vec![b"a1".to_vec()]);
        assert!(values(s.range(all(3)).await.unwrap()).is_empty());
        assert_eq!(values(s.range(all(5)).await.unwrap()), vec![b"a2".to_vec(), b"b1".to_vec()]);
        assert_eq!(values(s.range(all(6)).await.unwrap()), vec![b"a2".to_vec()]);
        // b's tombstone has its entry; a new b links to it and starts over.
        s.put(put("b", "b2")).await.unwrap();
        let b = get(&s, "b", 0).await.kvs.remove(0);
        assert_eq!((b.create_revision, b.version), (7, 1));
        assert_eq!(values(s.range(all(5)).await.unwrap()), vec![b"a2".to_vec(), b"b1".to_vec()]);
        s.close().await;
    });
}
