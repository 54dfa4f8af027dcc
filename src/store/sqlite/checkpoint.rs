//! WAL checkpoints mostly off the writer's path. SQLite's automatic
//! checkpoint runs inside the commit that crosses its threshold, so that
//! one commit (and every write queued behind it) waits while megabytes of
//! WAL are copied into the database: tens of milliseconds. Here the writer
//! kicks a thread of its own after each commit; the thread runs a PASSIVE
//! checkpoint on its own connection, which never blocks the writer, at most
//! once per `INTERVAL`. The automatic checkpoint still runs in the writer
//! (it alone can let the WAL start over under steady writes, since nothing
//! writes while it runs), but finds all but the last few frames copied.
//! An idle store kicks nothing and the thread sleeps.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::store::Result;

/// The least time between two checkpoints.
const INTERVAL: Duration = Duration::from_millis(200);

/// The checkpointer thread, and how to kick it.
pub struct Checkpointer {
    kick: Option<SyncSender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts the thread, on a connection of its own to `path`.
    pub fn start(path: &Path) -> Result<Checkpointer> {
        let conn = Connection::open(path)?;
        conn.execute_batch("PRAGMA busy_timeout = 100;")?;
        let (kick, kicked) = mpsc::sync_channel(1);
        let path: PathBuf = path.to_path_buf();
        let handle =
            std::thread::Builder::new().name("store-checkpoint".into()).spawn(move || run(&conn, &kicked, &path))?;
        Ok(Checkpointer { kick: Some(kick), handle: Some(handle) })
    }

    /// Asks for a checkpoint soon; never blocks.
    pub fn kick(&self) {
        if let Some(k) = &self.kick {
            let _ = k.try_send(());
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.kick = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn run(conn: &Connection, kicked: &Receiver<()>, path: &Path) {
    let mut last = Instant::now() - INTERVAL;
    while kicked.recv().is_ok() {
        let wait = INTERVAL.saturating_sub(last.elapsed());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        // A kick that came while waiting is served by this checkpoint.
        let _ = kicked.try_recv();
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!(error = %e, path = %path.display(), "WAL checkpoint did not complete");
        }
        last = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kick_checkpoints_the_wal_without_the_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let writer = Connection::open(&path).expect("open");
        writer
            .execute_batch("PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; CREATE TABLE t(x);")
            .expect("setup");
        let checkpointer = Checkpointer::start(&path).expect("start");
        for i in 0..1000 {
            writer.execute("INSERT INTO t VALUES (?1)", [i]).expect("insert");
        }
        let db_len = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        // Everything is still in the WAL: the writer does not checkpoint.
        let before = db_len();
        checkpointer.kick();
        drop(checkpointer);
        assert!(db_len() > before, "the checkpoint copied nothing into the database ({before} bytes)");
        let count: i64 = writer.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).expect("count");
        assert_eq!(count, 1000);
    }
}
