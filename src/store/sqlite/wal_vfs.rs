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

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::OnceLock;

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
    #[cfg(test)]
    writes: u64,
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
    ptr::write(
        out.cast::<File>(),
        File {
            base: ffi::sqlite3_file { pMethods: &METHODS },
            real,
            real_words,
            wal: flags & ffi::SQLITE_OPEN_WAL != 0,
            pending: Vec::new(),
            pending_at: 0,
            #[cfg(test)]
            writes: 0,
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
flushed!(sync(flags: c_int) => xSync);
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
        unsafe {
            let mut fd: *mut ffi::sqlite3_file = ptr::null_mut();
            let rc = ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_FCNTL_JOURNAL_POINTER,
                (&mut fd as *mut *mut ffi::sqlite3_file).cast(),
            );
            assert_eq!(rc, ffi::SQLITE_OK);
            assert!(!fd.is_null() && std::ptr::eq((*fd).pMethods, &METHODS), "the WAL is this VFS's file");
            file(fd).writes
        }
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
}
