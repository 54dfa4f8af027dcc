//! The on-disk layout of the embedded store.
//!
//! `log` holds one row per change, keyed by `id = revision << 24 | sub`, so
//! the rows of a revision are contiguous and a revision range is an id range.
//! A tombstone is a row with `version = 0`. `prev_id` points at the row this
//! one superseded (0 for the key's first row), which gives watchers their
//! `prev_kv` and tells compaction what a row made obsolete; a key created
//! again after a delete links to its tombstone. `current` maps each live key
//! to its newest row, so reads at the head revision never scan history, and
//! each deleted key to its tombstone's id negated, until compaction sweeps
//! it: reads at an older revision walk `prev_id` back from there, so the log
//! needs no index by key (which would cost every write a page of its own).

use std::path::Path;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::store::Result;

pub const SCHEMA_VERSION: i64 = 4;
const SUB_BITS: u32 = 24;
/// The most changes one revision may carry (a delete of a huge range or a
/// lease revoke with more attached keys fails rather than wrap).
pub const MAX_SUB: i64 = (1 << SUB_BITS) - 1;

pub fn row_id(rev: i64, sub: i64) -> i64 {
    (rev << SUB_BITS) | sub
}

pub fn rev_of(id: i64) -> i64 {
    id >> SUB_BITS
}

/// The first row id of a revision; `first_id(rev + 1)` bounds it above.
pub fn first_id(rev: i64) -> i64 {
    row_id(rev, 0)
}

/// How commits reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// fsync the WAL on every commit: an acknowledged write survives power loss.
    Full,
    /// fsync only at checkpoints: survives a crash of the process, a power
    /// loss may roll back the newest commits (never corrupts).
    Normal,
}

impl SyncMode {
    fn pragma(self) -> &'static str {
        match self {
            SyncMode::Full => "FULL",
            SyncMode::Normal => "NORMAL",
        }
    }
}

/// The single row of `meta`: what the store knows about itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta {
    pub rev: i64,
    pub compact_rev: i64,
    /// Every log row with an id below this one has been through compaction.
    pub compact_cursor: i64,
    pub cluster_id: u64,
    pub member_id: u64,
}

/// SQLite's automatic checkpoint, in pages (8 MiB of WAL). It runs inside
/// the commit that crosses it, and is what lets the WAL start over; the
/// checkpointer thread (`checkpoint`) has by then copied all but the last
/// few frames, so that commit has little left to copy.
pub const AUTOCHECKPOINT_PAGES: i64 = 2000;

pub fn open_writer(path: &Path, sync: SyncMode) -> Result<Connection> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let conn = match sync {
        // A FULL commit ends with a sync of the WAL, where `wal_vfs` writes
        // the commit's frames in a few large writes; a NORMAL one has no such point.
        SyncMode::Full => match super::wal_vfs::register() {
            Ok(()) => Connection::open_with_flags_and_vfs(path, OpenFlags::default(), super::wal_vfs::NAME)?,
            Err(rc) => {
                tracing::warn!(code = rc, "cannot register the WAL-gathering VFS; writing frames one by one");
                Connection::open(path)?
            }
        },
        SyncMode::Normal => Connection::open(path)?,
    };
    // auto_vacuum must be chosen before the first table exists.
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL;")?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", sync.pragma())?;
    conn.execute_batch(
        "PRAGMA busy_timeout = 10000;
         PRAGMA cache_size = -4096;
         PRAGMA journal_size_limit = 8388608;
         PRAGMA temp_store = MEMORY;",
    )?;
    conn.pragma_update(None, "wal_autocheckpoint", AUTOCHECKPOINT_PAGES)?;
    plan_once(&conn)?;
    Ok(conn)
}

/// Each statement keeps the plan it was prepared with. Without this,
/// SQLite plans `LIMIT ?N` with the value bound at prepare time and marks
/// the statement expired whenever that parameter is bound again, so every
/// cached range read was parsed and planned anew on each use (4.7 % of
/// the server's CPU under a stream of pod patches).
fn plan_once(conn: &Connection) -> Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

pub fn open_reader(path: &Path) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
    )?;
    conn.execute_batch("PRAGMA busy_timeout = 10000; PRAGMA cache_size = -1024; PRAGMA temp_store = MEMORY;")?;
    plan_once(&conn)?;
    Ok(conn)
}

/// Creates the tables on first start and returns the stored meta row.
pub fn init(conn: &Connection, new_id: impl Fn() -> u64) -> Result<Meta> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(crate::store::StoreError::Internal(format!(
            "database schema {version} is newer than this ferrok understands ({SCHEMA_VERSION})"
        )));
    }
    if version == 0 {
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE IF NOT EXISTS log (
                 id INTEGER PRIMARY KEY,
                 key BLOB NOT NULL,
                 create_rev INTEGER NOT NULL,
                 version INTEGER NOT NULL,
                 lease INTEGER NOT NULL,
                 value BLOB NOT NULL,
                 prev_id INTEGER NOT NULL
             );
             CREATE INDEX IF NOT EXISTS log_lease ON log (lease) WHERE lease != 0;
             CREATE TABLE IF NOT EXISTS current (
                 key BLOB PRIMARY KEY,
                 id INTEGER NOT NULL
             ) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS lease (
                 id INTEGER PRIMARY KEY,
                 ttl INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS meta (
                 one INTEGER PRIMARY KEY CHECK (one = 0),
                 rev INTEGER NOT NULL,
                 compact_rev INTEGER NOT NULL,
                 compact_cursor INTEGER NOT NULL,
                 cluster_id INTEGER NOT NULL,
                 member_id INTEGER NOT NULL
             );
             PRAGMA user_version = 1;
             COMMIT;",
        )?;
    }
    if version < 2 {
        // Version 2: the alarms raised (etcd's alarm bucket).
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE IF NOT EXISTS alarm (
                 member_id INTEGER NOT NULL,
                 alarm INTEGER NOT NULL,
                 PRIMARY KEY (member_id, alarm)
             );
             PRAGMA user_version = 2;
             COMMIT;",
        )?;
    }
    if version < 3 {
        // Version 3: `meta.rev` is stored only with compaction's marks; the
        // log's newest row gives the revision (`read_meta`). An older ferrok
        // would read a stale revision and reuse it, so it must refuse the file.
        conn.execute_batch("PRAGMA user_version = 3;")?;
    }
    if version < 4 {
        // Version 4: no index of the log by key, which cost each write a
        // page of its own; a deleted key keeps its entry in `current` (the
        // tombstone's id, negated) until compaction sweeps the tombstone,
        // and a key created again links to its tombstone, so reads at an
        // older revision follow `prev_id` from `current` (`read::Latest`).
        // Made from version 3 with the index it drops.
        if version > 0 {
            tracing::info!("upgrading the store's schema to version 4 (drops the log's index by key)");
        }
        conn.execute_batch(
            "BEGIN;
             UPDATE log SET prev_id = coalesce(
                 (SELECT max(o.id) FROM log o WHERE o.key = log.key AND o.id < log.id), 0)
             WHERE prev_id = 0 AND version > 0
                 AND EXISTS (SELECT 1 FROM log o WHERE o.key = log.key AND o.id < log.id);
             INSERT OR IGNORE INTO current (key, id)
                 SELECT l.key, -l.id FROM log l
                 WHERE l.version = 0 AND l.id = (SELECT max(o.id) FROM log o WHERE o.key = l.key);
             DROP INDEX IF EXISTS log_key;
             PRAGMA user_version = 4;
             COMMIT;",
        )?;
    }
    if let Some(meta) = read_meta(conn).optional()? {
        return Ok(meta);
    }
    // A fresh store is at revision 1, as a fresh etcd is.
    let meta = Meta { rev: 1, compact_rev: 0, compact_cursor: 0, cluster_id: new_id(), member_id: new_id() };
    conn.execute(
        "INSERT INTO meta (one, rev, compact_rev, compact_cursor, cluster_id, member_id) VALUES (0, ?1, ?2, ?3, ?4, ?5)",
        (meta.rev, meta.compact_rev, meta.compact_cursor, meta.cluster_id as i64, meta.member_id as i64),
    )?;
    Ok(meta)
}

/// The meta row, with the revision the log has reached. The writer stores
/// `meta.rev` only when it writes the row for another reason (compaction):
/// every revision made since has rows in the log, and compaction removes
/// none of them before it writes the row again, so the newest row's
/// revision answers the rest.
pub fn read_meta(conn: &Connection) -> rusqlite::Result<Meta> {
    conn.prepare_cached(
        "SELECT rev, compact_rev, compact_cursor, cluster_id, member_id, (SELECT max(id) FROM log)
         FROM meta WHERE one = 0",
    )?
    .query_row([], |r| {
        let newest_row: Option<i64> = r.get(5)?;
        Ok(Meta {
            rev: r.get::<_, i64>(0)?.max(newest_row.map_or(0, rev_of)),
            compact_rev: r.get(1)?,
            compact_cursor: r.get(2)?,
            cluster_id: r.get::<_, i64>(3)? as u64,
            member_id: r.get::<_, i64>(4)? as u64,
        })
    })
}

/// Stores the meta row (see `read_meta` for when the writer needs to).
pub fn write_meta(conn: &Connection, meta: &Meta) -> rusqlite::Result<()> {
    conn.prepare_cached("UPDATE meta SET rev = ?1, compact_rev = ?2, compact_cursor = ?3 WHERE one = 0")?.execute((
        meta.rev,
        meta.compact_rev,
        meta.compact_cursor,
    ))?;
    Ok(())
}

/// The alarms raised, as etcd lists them.
pub fn read_alarms(conn: &Connection) -> rusqlite::Result<Vec<crate::store::proto::AlarmMember>> {
    let mut stmt = conn.prepare("SELECT member_id, alarm FROM alarm ORDER BY member_id, alarm")?;
    let rows = stmt.query_map([], |r| {
        Ok(crate::store::proto::AlarmMember { member_id: r.get::<_, i64>(0)? as u64, alarm: r.get(1)? })
    })?;
    rows.collect()
}

/// Size of the database in bytes and the part of it holding live pages.
/// The writer asks after every batch (for the quota): one statement,
/// prepared once, whose pragma functions are read when it runs.
pub fn db_size(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.prepare_cached(
        "SELECT s.page_size, c.page_count, f.freelist_count
         FROM pragma_page_size() s, pragma_page_count() c, pragma_freelist_count() f",
    )?
    .query_row([], |r| {
        let (page_size, pages, free): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
        Ok((pages * page_size, (pages - free) * page_size))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_size_follows_the_file_with_one_prepared_statement() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open_writer(&dir.path().join("db"), SyncMode::Normal).expect("open");
        conn.execute_batch("CREATE TABLE t (x BLOB)").expect("table");
        let (before, _) = db_size(&conn).expect("size");
        conn.execute("INSERT INTO t VALUES (zeroblob(100000))", []).expect("insert");
        let (after, in_use) = db_size(&conn).expect("size");
        assert!(after > before + 90_000, "{before} -> {after}");
        conn.execute("DELETE FROM t", []).expect("delete");
        let (same, less) = db_size(&conn).expect("size");
        assert_eq!(same, after);
        assert!(less < in_use, "{in_use} -> {less}");
    }

    #[test]
    fn a_cached_statement_is_not_prepared_again_when_bound_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let writer = open_writer(&path, SyncMode::Normal).expect("open");
        writer.execute_batch("CREATE TABLE t (k BLOB PRIMARY KEY, v BLOB)").expect("table");
        writer.execute("INSERT INTO t VALUES (x'01', x'aa'), (x'02', x'bb')", []).expect("insert");
        let reader = open_reader(&path).expect("reader");
        for conn in [&writer, &reader] {
            let sql = "SELECT v FROM t WHERE k >= ?1 ORDER BY k LIMIT ?2";
            for (key, limit) in [(1u8, -1i64), (2, 1), (1, -1)] {
                let mut stmt = conn.prepare_cached(sql).expect("prepare");
                let got: Vec<Vec<u8>> = stmt
                    .query_map(rusqlite::params![[key], limit], |r| r.get(0))
                    .expect("query")
                    .collect::<rusqlite::Result<_>>()
                    .expect("rows");
                assert_eq!(got.len(), if limit == 1 { 1 } else { 3 - key as usize });
            }
            let stmt = conn.prepare_cached(sql).expect("prepare");
            assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0);
        }
    }

    #[test]
    fn ids_order_by_revision_then_sub() {
        assert!(row_id(5, MAX_SUB) < row_id(6, 0));
        assert_eq!(rev_of(row_id(123_456, 77)), 123_456);
    }
}
