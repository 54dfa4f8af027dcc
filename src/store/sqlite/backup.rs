//! Snapshots of the embedded store, and restoring one: etcd's `snapshot
//! save` and `etcdutl snapshot restore --bump-revision --mark-compacted`
//! for the SQLite file.
//!
//! A snapshot is a plain SQLite database written by `VACUUM INTO` on a
//! connection of its own: one read transaction, so it is consistent while
//! the server goes on writing (or when no server runs at all), compact (no
//! free pages, no WAL) and checkable with SQLite's own `quick_check`.
//!
//! A restore replaces the store of a stopped server with a snapshot and
//! moves the revision past every revision a client can have seen, marking
//! it compacted: a watch or a list resumed from a revision of the replaced
//! store gets etcd's compacted error and relists, instead of waiting for a
//! revision that this store will reach with other contents.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::schema::{self, Meta};

/// The first bytes of every SQLite database.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// bbolt's magic number in its meta page: the file is etcd's own snapshot.
const BOLT_MAGIC: u32 = 0xED0C_DAED;
/// How far past the replaced store's revision a restore moves the head:
/// clients saw nothing newer than that store's head, so any gap works; a
/// wide one keeps revisions of the two histories apart in logs.
const BUMP_PAST_REPLACED: i64 = 1_000;
/// How far past the snapshot's revision a restore moves the head when there
/// is no readable store to replace (what Kubernetes' documentation suggests
/// for `etcdutl snapshot restore --bump-revision`).
const BUMP_UNKNOWN: i64 = 1_000_000_000;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("no datastore at {}", .0.display())]
    NoDatastore(PathBuf),
    #[error("{}: this is an etcd snapshot (bbolt), not one of ferrok's embedded store; restore it into etcd with etcdutl snapshot restore", .0.display())]
    EtcdSnapshot(PathBuf),
    #[error("{}: not a snapshot of ferrok's embedded store: {reason}", path.display())]
    Invalid { path: PathBuf, reason: NotASnapshot },
    #[error("the datastore {} is in use: stop ferrok server first", .0.display())]
    InUse(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Sqlite { path: PathBuf, source: rusqlite::Error },
}

/// Why a file is not a snapshot of the embedded store.
#[derive(Debug, thiserror::Error)]
pub enum NotASnapshot {
    #[error("no SQLite header")]
    NoHeader,
    /// SQLite cannot open or read it.
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    /// SQLite's quick check found damage (its own words).
    #[error("damaged: {0}")]
    Damaged(String),
    #[error("no ferrok schema in it")]
    NoSchema,
    #[error("schema {0} is newer than this ferrok understands ({understood})", understood = schema::SCHEMA_VERSION)]
    NewerSchema(i64),
    #[error("no store metadata: {0}")]
    NoMeta(#[source] rusqlite::Error),
}

type Result<T, E = SnapshotError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io { path: path.to_path_buf(), source }
}

fn sql(path: &Path) -> impl FnOnce(rusqlite::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Sqlite { path: path.to_path_buf(), source }
}

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The store's revision when the snapshot was taken.
    pub revision: i64,
    pub size: u64,
}

/// Writes a consistent copy of the store at `db` to `to` (which must not
/// exist), whether or not a server is writing to it.
pub fn save(db: &Path, to: &Path) -> Result<SnapshotInfo> {
    if !db.is_file() {
        return Err(SnapshotError::NoDatastore(db.to_path_buf()));
    }
    // Read-write without create: a WAL database can then be read whether
    // or not its server runs (a read-only connection cannot make the
    // shared-memory file a stopped server removed).
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(sql(db))?;
    conn.busy_timeout(Duration::from_secs(10)).map_err(sql(db))?;
    conn.execute("VACUUM INTO ?1", [to.to_string_lossy().as_ref()]).map_err(sql(db))?;
    drop(conn);
    std::fs::File::open(to).and_then(|f| f.sync_all()).map_err(io(to))?;
    check(to)
}

/// Checks that `file` is a whole snapshot of the embedded store and says
/// what it holds; the file is only read.
pub fn check(file: &Path) -> Result<SnapshotInfo> {
    let invalid = |reason: NotASnapshot| SnapshotError::Invalid { path: file.to_path_buf(), reason };
    let mut head = [0u8; 32];
    let mut f = std::fs::File::open(file).map_err(io(file))?;
    let size = f.metadata().map_err(io(file))?.len();
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]).map_err(io(file))? {
            0 => break,
            read => n += read,
        }
    }
    if n >= 20 && u32::from_le_bytes([head[16], head[17], head[18], head[19]]) == BOLT_MAGIC {
        return Err(SnapshotError::EtcdSnapshot(file.to_path_buf()));
    }
    if n < SQLITE_MAGIC.len() || &head[..SQLITE_MAGIC.len()] != SQLITE_MAGIC {
        return Err(invalid(NotASnapshot::NoHeader));
    }
    let conn = Connection::open_with_flags(file, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| invalid(e.into()))?;
    let meta = read_checked(&conn).map_err(invalid)?;
    Ok(SnapshotInfo { revision: meta.rev, size })
}

/// The meta row of a database that passes SQLite's quick check and has
/// ferrok's schema.
fn read_checked(conn: &Connection) -> std::result::Result<Meta, NotASnapshot> {
    let verdict: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    if verdict != "ok" {
        return Err(NotASnapshot::Damaged(verdict));
    }
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version < 1 {
        return Err(NotASnapshot::NoSchema);
    }
    if version > schema::SCHEMA_VERSION {
        return Err(NotASnapshot::NewerSchema(version));
    }
    schema::read_meta(conn).map_err(NotASnapshot::NoMeta)
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The revision the snapshot was taken at.
    pub snapshot_revision: i64,
    /// The store's revision now, also its compact revision.
    pub revision: i64,
    /// Where the replaced store was moved, if there was one.
    pub replaced: Option<PathBuf>,
}

/// Replaces the store at `db` with the snapshot `snapshot`, moves the
/// revision past every one a client can have seen and marks it compacted.
/// The store must not be open (no server running on it); the replaced
/// store is kept beside it as `<stem>-old-<unix time>.db`. A snapshot that
/// fails its check changes nothing.
pub fn restore(snapshot: &Path, db: &Path) -> Result<Restored> {
    let info = check(snapshot)?;
    let dir = db.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let guard = if db.exists() { lock(db)? } else { None };
    let replaced_rev = guard.as_ref().and_then(|conn| schema::read_meta(conn).optional().ok().flatten()).map(|m| m.rev);
    let revision = match replaced_rev {
        Some(old) => old.max(info.revision) + BUMP_PAST_REPLACED,
        None => info.revision + BUMP_UNKNOWN,
    };

    let staged = with_suffix(db, ".restoring");
    let _ = std::fs::remove_file(&staged);
    let result = stage(snapshot, &staged, revision);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&staged);
        return Err(e);
    }
    // The lock goes with the connection; the replaced store (checkpointed,
    // so one file) moves aside and the staged one takes its place.
    drop(guard);
    let replaced = if db.exists() {
        let stem = db.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "state".into());
        let old = db.with_file_name(format!("{stem}-old-{}.db", unix_now()));
        std::fs::rename(db, &old).map_err(io(db))?;
        for side in ["-wal", "-journal"] {
            let from = with_suffix(db, side);
            if from.exists() {
                std::fs::rename(&from, with_suffix(&old, side)).map_err(io(&from))?;
            }
        }
        Some(old)
    } else {
        None
    };
    let _ = std::fs::remove_file(with_suffix(db, "-shm"));
    std::fs::rename(&staged, db).map_err(io(db))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    tracing::info!(
        snapshot = %snapshot.display(), snapshot_revision = info.revision, revision,
        "datastore restored from a snapshot"
    );
    Ok(Restored { snapshot_revision: info.revision, revision, replaced })
}

/// Takes the store at `db` for ourselves, or says it is in use: a server
/// keeps its connections open, and SQLite refuses an exclusive lock while
/// any other connection holds the database. The WAL is folded into the
/// file. A file that is no database at all (damaged beyond SQLite's
/// header) gives no connection: it is replaced as it is.
fn lock(db: &Path) -> Result<Option<Connection>> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(sql(db))?;
    conn.busy_timeout(Duration::from_millis(500)).map_err(sql(db))?;
    conn.query_row("PRAGMA locking_mode = EXCLUSIVE", [], |_| Ok(())).map_err(sql(db))?;
    if let Err(e) = conn.execute_batch("BEGIN EXCLUSIVE; COMMIT;") {
        return match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                Err(SnapshotError::InUse(db.to_path_buf()))
            }
            Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
                tracing::warn!(error = %e, db = %db.display(), "the replaced store is damaged");
                Ok(None)
            }
            _ => Err(SnapshotError::Sqlite { path: db.to_path_buf(), source: e }),
        };
    }
    // A damaged store can still be replaced: only the lock is required.
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, db = %db.display(), "cannot checkpoint the replaced store");
    }
    Ok(Some(conn))
}

/// Copies the snapshot to `staged` and sets its revision.
fn stage(snapshot: &Path, staged: &Path, revision: i64) -> Result<()> {
    std::fs::copy(snapshot, staged).map_err(io(staged))?;
    let conn = Connection::open(staged).map_err(sql(staged))?;
    let mut meta = schema::read_meta(&conn).map_err(sql(staged))?;
    meta.rev = revision;
    meta.compact_rev = revision;
    schema::write_meta(&conn, &meta).map_err(sql(staged))?;
    drop(conn);
    std::fs::File::open(staged).and_then(|f| f.sync_all()).map_err(io(staged))
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::proto::*;
    use crate::store::sqlite::{SqliteOptions, SqliteStore};
    use crate::store::{Store, StoreError};

    fn put(key: &str, value: &str) -> PutRequest {
        PutRequest { key: key.into(), value: value.into(), ..Default::default() }
    }

    async fn get(s: &SqliteStore, key: &str) -> Option<Vec<u8>> {
        let resp = s.range(RangeRequest { key: key.into(), ..Default::default() }).await.expect("range");
        resp.kvs.into_iter().next().map(|kv| kv.value)
    }

    #[tokio::test]
    async fn save_then_restore_brings_back_the_saved_state_at_a_later_revision() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("db").join("state.db");
        let store = SqliteStore::open(SqliteOptions::new(&db)).expect("open");
        store.put(put("/a", "1")).await.expect("put");
        store.put(put("/gone-later", "x")).await.expect("put");
        let snap = dir.path().join("snap");
        let saved = {
            let (db, snap) = (db.clone(), snap.clone());
            tokio::task::spawn_blocking(move || save(&db, &snap)).await.expect("join").expect("save")
        };
        assert_eq!(saved.revision, 3);
        assert_eq!(check(&snap).expect("check"), saved);
        store.put(put("/b", "after")).await.expect("put");
        store.delete_range(DeleteRangeRequest { key: "/gone-later".into(), ..Default::default() }).await.expect("del");
        let head = store.put(put("/a", "2")).await.expect("put").header.expect("header").revision;

        // A running store is not replaced.
        assert!(matches!(restore(&snap, &db), Err(SnapshotError::InUse(_))));
        store.close().await;
        drop(store);

        let restored = restore(&snap, &db).expect("restore");
        assert_eq!(restored.snapshot_revision, 3);
        assert_eq!(restored.revision, head + BUMP_PAST_REPLACED);
        let old = restored.replaced.expect("replaced store kept");
        assert!(old.exists());

        let store = SqliteStore::open(SqliteOptions::new(&db)).expect("reopen");
        assert_eq!(get(&store, "/a").await.as_deref(), Some(&b"1"[..]));
        assert_eq!(get(&store, "/gone-later").await.as_deref(), Some(&b"x"[..]));
        assert_eq!(get(&store, "/b").await, None);
        // Reads and watches from the replaced history are compacted away.
        let err = store.range(RangeRequest { key: "/a".into(), revision: head, ..Default::default() }).await;
        assert!(matches!(err, Err(StoreError::Compacted { .. })), "{err:?}");
        let next = store.put(put("/c", "new")).await.expect("put").header.expect("header").revision;
        assert_eq!(next, restored.revision + 1);
        store.close().await;
    }

    #[test]
    fn bad_snapshots_are_refused_and_change_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("state.db");
        std::fs::write(&db, b"the store").expect("write");
        let text = dir.path().join("text");
        std::fs::write(&text, b"hello, this is not a database at all").expect("write");
        assert!(matches!(restore(&text, &db), Err(SnapshotError::Invalid { .. })));
        let mut bolt = vec![0u8; 4096];
        bolt[16..20].copy_from_slice(&BOLT_MAGIC.to_le_bytes());
        let etcd = dir.path().join("etcd.db");
        std::fs::write(&etcd, &bolt).expect("write");
        assert!(matches!(restore(&etcd, &db), Err(SnapshotError::EtcdSnapshot(_))));
        let other = dir.path().join("other.db");
        Connection::open(&other).and_then(|c| c.execute_batch("CREATE TABLE t(x);")).expect("other db");
        let err = restore(&other, &db).expect_err("no ferrok schema");
        assert!(err.to_string().contains("no ferrok schema"), "{err}");
        assert!(matches!(restore(&dir.path().join("missing"), &db), Err(SnapshotError::Io { .. })));
        assert_eq!(std::fs::read(&db).expect("read"), b"the store");
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 4);
        assert!(matches!(save(&dir.path().join("none.db"), &dir.path().join("s")), Err(SnapshotError::NoDatastore(_))));
    }
}
