//! A SQLite VFS that writes a commit's WAL frames in a few large `pwrite`s.
//!
//! SQLite appends each WAL frame as two writes (its 24-byte header, then
//! the page), so a commit of 70 pages is 140 system calls, and since a
//! frame is 4,120 bytes every write straddles page-cache pages. Under 16
//! writers those writes were 15 % of the store's CPU. This VFS is the
//! platform's own ("unix") with one change: appends to a WAL file are
//! gathered in memory and written together, in writes of up to 124 KiB,
//! before anything can look at them — the sync that ends the commit, a
//! read, a truncate, a size query, a file control, a write elsewhere in the
//! file, or the close.
//!
//! Why that is enough: with `synchronous = FULL`, SQLite writes all of a
//! commit's frames, then syncs the WAL, and only then publishes the new
//! frames in the WAL index for readers (`walFrames` in sqlite3.c). So every
//! frame another connection can see has been through the sync, and so
//! through this file's flush. Under `synchronous = NORMAL` a commit has no
//! sync to flush at, so only the FULL writer connection uses this VFS
//! (`schema::open_writer`); readers, the checkpointer and NORMAL writers
//! use the platform's VFS, and all of them share its locks, since the files
//! underneath are the platform VFS's own.
//!
//! The writer may also take a commit's sync off its thread
//! (`arm_deferred_sync`, `take_deferred_sync`): the sync that ends the next
//! commit then only writes the gathered frames, and the writer syncs the
//! file on another thread before anyone is told of the commit. SQLite still
//! publishes those frames to other connections at once, so the store keeps
//! its readers from answering with a commit until that sync is done
//! (`Shared::published`). Every other sync (the WAL header's after a
//! restart, a checkpoint's) stays the platform's own.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::ffi::OsStrExt;
use std::ptr;
use std::sync::{Arc, OnceLock};

use rusqlite::ffi;

/// The name connections open with to get this VFS.
pub const NAME: &CStr = c"ferrok-wal";

/// Gathered bytes past which a write goes out without waiting for the sync
/// (a commit is rarely more than a few hundred KiB); a buffer grown past it
/// is given back after the write.
const MAX_PENDING: usize = 1 << 20;

/// The most the platform VFS writes in one call is 128 KiB less a byte
/// (`seekAndWriteFd` masks the length with 0x1ffff).
const MAX_WRITE: usize = 124 << 10;

/// Registers the VFS (once per process); `Err` carries SQLite's code.
pub fn register() -> Result<(), c_int> {
    static REGISTERED: OnceLock<Result<(), c_int>> = OnceLock::new();
    *REGISTERED.get_or_init(|| unsafe {
        let real = ffi::sqlite3_vfs_find(ptr::null());
        if real.is_null() {
            return Err(ffi::SQLITE_ERROR);
        }
        let mut vfs: ffi::sqlite3_vfs = ptr::read(real);
        vfs.szOsFile = std::mem::size_of::<File>() as c_int;
        vfs.zName = NAME.as_ptr();
        vfs.pNext = ptr::null_mut();
        vfs.pAppData = real.cast();
        vfs.xOpen = Some(open);
        // Every other method of the platform VFS ignores its VFS argument,
        // so they are shared as they are.
        let vfs = Box::leak(Box::new(vfs));
        match ffi::sqlite3_vfs_register(vfs, 0) {
            ffi::SQLITE_OK => Ok(()),
            rc => Err(rc),
        }
    })
}

/// An open file: the platform VFS's file, and for a WAL the bytes
/// appended but not yet written.
#[repr(C)]
struct File {
    /// SQLite's view: must come first.
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// The `u64`s that hold `real` (the platform VFS's file size, rounded up).
    real_words: usize,
    wal: bool,
    pending: Vec<u8>,
    /// The file offset of `pending[0]`.
    pending_at: i64,
    /// A WAL's own descriptor, which another thread may sync (None when it
    /// could not be opened: then every sync is the platform's).
    wal_fd: Option<Arc<std::fs::File>>,
    /// The next sync after frames were written is to be left to the caller.
    defer: bool,
    /// Frames were written since the last sync (not just the header, which
    /// alone sits at offset 0).
    framed: bool,
    /// A sync was left to the caller since `defer` was set.
    deferred: bool,
    #[cfg(test)]
    writes: u64,
    #[cfg(test)]
    syncs: u64,
    /// Where the last real write ended, at the last real sync.
    #[cfg(test)]
    synced_to: i64,
    #[cfg(test)]
    written_to: i64,
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

unsafe fn file<'a>(f: *mut ffi::sqlite3_file) -> &'a mut File {
    &mut *f.cast::<File>()
}

unsafe fn real_methods(f: &File) -> &ffi::sqlite3_io_methods {
    &*(*f.real).pMethods
}

unsafe extern "C" fn open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    out: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real_vfs = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
    let real_words = ((*real_vfs).szOsFile as usize).div_ceil(8);
    let real = Box::into_raw(vec![0u64; real_words].into_boxed_slice()).cast::<ffi::sqlite3_file>();
    let rc = match (*real_vfs).xOpen {
        Some(open) => open(real_vfs, name, real, flags, out_flags),
        None => ffi::SQLITE_CANTOPEN,
    };
    if rc != ffi::SQLITE_OK || (*real).pMethods.is_null() {
        free_real(real, real_words);
        // SQLite closes a file only when its methods are set.
        (*out).pMethods = ptr::null();
        return if rc == ffi::SQLITE_OK { ffi::SQLITE_CANTOPEN } else { rc };
    }
    let wal = flags & ffi::SQLITE_OPEN_WAL != 0;
    let wal_fd = if wal && !name.is_null() {
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(CStr::from_ptr(name).to_bytes()));
        // Read-only, and never locked: closing it cannot drop a lock of
        // SQLite's (the platform VFS locks the database and its -shm, not the WAL).
        std::fs::File::open(path).ok().map(Arc::new)
    } else {
        None
    };
    ptr::write(
        out.cast::<File>(),
        File {
            base: ffi::sqlite3_file { pMethods: &METHODS },
            real,
            real_words,
            wal,
            pending: Vec::new(),
            pending_at: 0,
            wal_fd,
            defer: false,
            framed: false,
            deferred: false,
            #[cfg(test)]
            writes: 0,
            #[cfg(test)]
            syncs: 0,
            #[cfg(test)]
            synced_to: 0,
            #[cfg(test)]
            written_to: 0,
        },
    );
    ffi::SQLITE_OK
}

unsafe fn free_real(real: *mut ffi::sqlite3_file, words: usize) {
    drop(Box::from_raw(ptr::slice_from_raw_parts_mut(real.cast::<u64>(), words)));
}

/// Writes the gathered bytes, in as few calls as the platform VFS takes
/// (it writes under 128 KiB a call); each piece but the last ends on a
/// 4 KiB boundary of the file, so no page-cache page is written twice.
unsafe fn flush(f: &mut File) -> c_int {
    let mut done = 0;
    let mut rc = ffi::SQLITE_OK;
    while done < f.pending.len() && rc == ffi::SQLITE_OK {
        let at = f.pending_at + done as i64;
        let mut n = (f.pending.len() - done).min(MAX_WRITE);
        if done + n < f.pending.len() {
            n -= ((at + n as i64) % 4096) as usize;
        }
        rc = real_write(f, f.pending.as_ptr().add(done).cast(), n as c_int, at);
        done += n;
    }
    if f.pending.capacity() > MAX_PENDING {
        f.pending = Vec::new();
    } else {
        f.pending.clear();
    }
    rc
}

unsafe fn real_write(f: &mut File, data: *const c_void, n: c_int, at: i64) -> c_int {
    #[cfg(test)]
    {
        f.writes += 1;
        f.written_to = at + i64::from(n);
    }
    match real_methods(f).xWrite {
        Some(write) => write(f.real, data, n, at),
        None => ffi::SQLITE_IOERR_WRITE,
    }
}

unsafe extern "C" fn close(f: *mut ffi::sqlite3_file) -> c_int {
    let me = file(f);
    let flushed = flush(me);
    let rc = match real_methods(me).xClose {
        Some(close) => close(me.real),
        None => ffi::SQLITE_IOERR_CLOSE,
    };
    free_real(me.real, me.real_words);
    ptr::drop_in_place(f.cast::<File>());
    (*f).pMethods = ptr::null();
    if flushed != ffi::SQLITE_OK {
        flushed
    } else {
        rc
    }
}

unsafe extern "C" fn write(f: *mut ffi::sqlite3_file, data: *const c_void, n: c_int, at: i64) -> c_int {
    let me = file(f);
    if !me.wal {
        return real_write(me, data, n, at);
    }
    if at > 0 {
        me.framed = true;
    }
    let end = me.pending_at + me.pending.len() as i64;
    if !me.pending.is_empty() && at != end {
        let rc = flush(me);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    if me.pending.is_empty() {
        me.pending_at = at;
    }
    me.pending.extend_from_slice(std::slice::from_raw_parts(data.cast::<u8>(), n as usize));
    if me.pending.len() >= MAX_PENDING {
        return flush(me);
    }
    ffi::SQLITE_OK
}

/// Forwards a call after writing what was gathered, so that the file
/// underneath is exactly what SQLite has written.
macro_rules! flushed {
    ($name:ident ( $($arg:ident : $ty:ty),* ) => $method:ident) => {
        unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            let me = file(f);
            let rc = flush(me);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            match real_methods(me).$method {
                Some(m) => m(me.real $(, $arg)*),
                None => ffi::SQLITE_IOERR,
            }
        }
    };
}

/// Forwards a call that does not look at the file's bytes.
macro_rules! forwarded {
    ($name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty => $method:ident, $missing:expr) => {
        unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> $ret {
            let me = file(f);
            match real_methods(me).$method {
                Some(m) => m(me.real $(, $arg)*),
                None => $missing,
            }
        }
    };
}

flushed!(read(data: *mut c_void, n: c_int, at: i64) => xRead);
flushed!(truncate(size: i64) => xTruncate);
flushed!(file_size(size: *mut i64) => xFileSize);
flushed!(file_control(op: c_int, arg: *mut c_void) => xFileControl);
forwarded!(lock(level: c_int) -> c_int => xLock, ffi::SQLITE_IOERR_LOCK);
forwarded!(unlock(level: c_int) -> c_int => xUnlock, ffi::SQLITE_IOERR_UNLOCK);
forwarded!(check_reserved_lock(out: *mut c_int) -> c_int => xCheckReservedLock, ffi::SQLITE_IOERR_CHECKRESERVEDLOCK);
forwarded!(sector_size() -> c_int => xSectorSize, 4096);
forwarded!(device_characteristics() -> c_int => xDeviceCharacteristics, 0);
forwarded!(shm_map(region: c_int, size: c_int, extend: c_int, out: *mut *mut c_void) -> c_int => xShmMap, ffi::SQLITE_IOERR_SHMMAP);
forwarded!(shm_lock(offset: c_int, n: c_int, flags: c_int) -> c_int => xShmLock, ffi::SQLITE_IOERR_SHMLOCK);
forwarded!(shm_unmap(delete: c_int) -> c_int => xShmUnmap, ffi::SQLITE_OK);
forwarded!(fetch(at: i64, n: c_int, out: *mut *mut c_void) -> c_int => xFetch, {
    *out = ptr::null_mut();
    ffi::SQLITE_OK
});
forwarded!(unfetch(at: i64, p: *mut c_void) -> c_int => xUnfetch, ffi::SQLITE_OK);

/// Writes what was gathered, then syncs, unless this is the commit sync
/// the caller armed to take over.
unsafe extern "C" fn sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let me = file(f);
    let rc = flush(me);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    if me.defer && me.framed && me.wal_fd.is_some() {
        me.defer = false;
        me.framed = false;
        me.deferred = true;
        return ffi::SQLITE_OK;
    }
    let rc = match real_methods(me).xSync {
        Some(m) => m(me.real, flags),
        None => ffi::SQLITE_IOERR_FSYNC,
    };
    if rc == ffi::SQLITE_OK {
        me.framed = false;
    }
    #[cfg(test)]
    {
        me.syncs += 1;
        me.synced_to = me.written_to;
    }
    rc
}

/// Runs `f` on the WAL of `conn`'s main database, when this VFS opened it.
fn with_wal<T>(conn: &rusqlite::Connection, f: impl FnOnce(&mut File) -> T) -> Option<T> {
    let mut fd: *mut ffi::sqlite3_file = ptr::null_mut();
    // SAFETY: JOURNAL_POINTER is answered by SQLite itself with the pager's
    // WAL file (or null); it is ours when its methods are, and it is used
    // only on the thread that owns the connection, between statements.
    unsafe {
        let rc = ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_JOURNAL_POINTER,
            (&mut fd as *mut *mut ffi::sqlite3_file).cast(),
        );
        if rc != ffi::SQLITE_OK || fd.is_null() || !ptr::eq((*fd).pMethods, &METHODS) {
            return None;
        }
        let me = file(fd);
        me.wal.then(|| f(me))
    }
}

/// Makes the sync that ends `conn`'s next commit only write its frames,
/// leaving the sync to the caller (`take_deferred_sync`). False when that
/// cannot be done (another VFS, no WAL open yet, no descriptor of its own):
/// the commit then syncs as usual.
pub fn arm_deferred_sync(conn: &rusqlite::Connection) -> bool {
    with_wal(conn, |me| {
        me.defer = me.wal_fd.is_some();
        me.defer
    })
    .unwrap_or(false)
}

/// Disarms `arm_deferred_sync`; when a sync was left undone since, the WAL
/// file to sync before the commit may be called durable.
pub fn take_deferred_sync(conn: &rusqlite::Connection) -> Option<Arc<std::fs::File>> {
    with_wal(conn, |me| {
        me.defer = false;
        if std::mem::take(&mut me.deferred) {
            me.wal_fd.clone()
        } else {
            None
        }
    })
    .flatten()
}

unsafe extern "C" fn shm_barrier(f: *mut ffi::sqlite3_file) {
    let me = file(f);
    if let Some(m) = real_methods(me).xShmBarrier {
        m(me.real)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    fn open_buffered(path: &std::path::Path) -> Connection {
        register().expect("register");
        let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), NAME).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL").expect("wal");
        conn.pragma_update(None, "synchronous", "FULL").expect("full");
        conn.pragma_update(None, "wal_autocheckpoint", 0).expect("no autocheckpoint");
        conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)").expect("table");
        conn
    }

    /// Real writes made to the connection's WAL file so far.
    fn wal_writes(conn: &Connection) -> u64 {
        with_wal(conn, |me| me.writes).expect("the WAL is this VFS's file")
    }

    /// Real syncs of the connection's WAL file so far.
    fn wal_syncs(conn: &Connection) -> u64 {
        with_wal(conn, |me| me.syncs).expect("the WAL is this VFS's file")
    }

    fn insert(conn: &Connection, keys: std::ops::Range<i64>) {
        let tx = conn.unchecked_transaction().expect("begin");
        for k in keys {
            tx.execute("INSERT INTO t (k, v) VALUES (?1, ?2)", (k, vec![k as u8; 3000])).expect("insert");
        }
        tx.commit().expect("commit");
    }

    #[test]
    fn a_commit_of_many_pages_is_a_few_large_writes() {
        let dir = tempfile::tempdir().expect("dir");
        let wal = dir.path().join("db-wal");
        let conn = open_buffered(&dir.path().join("db"));
        insert(&conn, 0..1);
        let (writes, bytes) = (wal_writes(&conn), std::fs::metadata(&wal).expect("wal").len());
        insert(&conn, 1..60);
        let grown = std::fs::metadata(&wal).expect("wal").len() - bytes;
        let frames = grown / 4120;
        assert!(frames > 50, "the commit spans many pages: {frames}");
        let most = grown.div_ceil((MAX_WRITE - 4096) as u64);
        assert!(wal_writes(&conn) - writes <= most, "{frames} frames in at most {most} writes");
    }

    #[test]
    fn other_connections_see_every_commit_and_the_file_survives_a_spill() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("db");
        let conn = open_buffered(&path);
        let reader = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("reader");
        for round in 0..20i64 {
            insert(&conn, round * 10..round * 10 + 10);
            let n: i64 = reader.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).expect("count");
            assert_eq!(n, round * 10 + 10, "a reader on the platform VFS sees the commit at once");
        }
        // A transaction larger than the page cache spills frames before it
        // commits and writes some pages twice: writes out of order and
        // reads of what was gathered.
        conn.execute_batch("PRAGMA cache_size = 2").expect("tiny cache");
        let tx = conn.unchecked_transaction().expect("begin");
        for k in 0..200i64 {
            tx.execute("UPDATE t SET v = ?2 WHERE k = ?1", (k, vec![(k + 1) as u8; 3000])).expect("update");
        }
        tx.commit().expect("commit");
        let check: String = reader.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("check");
        assert_eq!(check, "ok");
        let mut stmt = reader.prepare("SELECT k, v FROM t ORDER BY k").expect("select");
        let rows: Vec<(i64, Vec<u8>)> =
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).expect("rows").collect::<Result<_, _>>().expect("rows");
        assert_eq!(rows.len(), 200);
        for (k, v) in rows {
            assert_eq!(v, vec![(k + 1) as u8; 3000], "row {k} has its last value");
        }
        drop(conn);
        let reopened = Connection::open(&path).expect("reopen");
        let n: i64 = reopened.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).expect("count");
        assert_eq!(n, 200);
    }

    #[test]
    fn an_armed_commit_leaves_its_own_sync_to_the_caller_and_no_other() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("db");
        let conn = open_buffered(&path);
        let reader = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).expect("reader");
        insert(&conn, 0..1);
        let syncs = wal_syncs(&conn);
        insert(&conn, 1..2);
        assert_eq!(wal_syncs(&conn), syncs + 1, "a commit not armed syncs");
        assert!(take_deferred_sync(&conn).is_none(), "and leaves nothing to sync");

        assert!(arm_deferred_sync(&conn));
        insert(&conn, 2..3);
        let wal = take_deferred_sync(&conn).expect("the armed commit left its sync");
        assert_eq!(wal_syncs(&conn), syncs + 1, "the armed commit did not sync");
        let n: i64 = reader.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).expect("count");
        assert_eq!(n, 3, "its frames are written and published");
        wal.sync_data().expect("the caller syncs the WAL");
        insert(&conn, 3..4);
        assert_eq!(wal_syncs(&conn), syncs + 2, "one commit only: the next syncs again");

        // After a checkpoint lets the WAL start over, the first commit
        // writes a new header and syncs it before any frame: that sync is
        // SQLite's own even when armed, and the commit's is still left.
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).expect("checkpoint");
        assert_eq!(std::fs::metadata(dir.path().join("db-wal")).expect("wal").len(), 0, "the WAL starts over");
        let syncs = wal_syncs(&conn);
        assert!(arm_deferred_sync(&conn));
        insert(&conn, 4..5);
        assert!(take_deferred_sync(&conn).is_some(), "the commit's sync was left");
        assert_eq!(wal_syncs(&conn), syncs + 1, "the header's sync was not");
        assert_eq!(with_wal(&conn, |me| me.synced_to), Some(32), "it synced the header alone");
    }
}
