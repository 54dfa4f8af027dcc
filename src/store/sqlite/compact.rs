//! Compaction: sweeping the log below the compact revision in bounded
//! batches, each its own short transaction, run by the writer only when no
//! request is waiting, so that writers are never held up for long. Then the
//! freed pages go back to the file system and the WAL is checkpointed.

use std::time::{Duration, Instant};

use super::schema::{self, first_id};
use super::writer::Writer;
use crate::store::Result;

/// Log rows looked at per compaction transaction at the most.
const COMPACT_BATCH: i64 = 500;
/// Pages handed back per vacuum step at the most (1 MiB of 4 KiB pages).
const VACUUM_PAGES: i64 = 256;
/// How long one compaction or vacuum step may work before it commits, so
/// that a write arriving meanwhile waits a few milliseconds at most, however
/// slow the disk or the build.
const STEP_BUDGET: Duration = Duration::from_millis(2);

impl Writer {
    /// Sweeps one batch: a row at or below the compact revision makes the
    /// row it superseded obsolete, and a tombstone at or below it is itself
    /// obsolete, as in etcd. What a read at the compact revision sees is kept.
    pub(super) fn compact_step(&mut self) {
        let target = first_id(self.meta.compact_rev + 1);
        let from = self.meta.compact_cursor;
        match self.sweep(from, target) {
            Ok(cursor) => {
                self.meta.compact_cursor = cursor;
                if cursor >= target {
                    tracing::debug!(revision = self.meta.compact_rev, "compaction finished");
                    self.vacuum_pending = true;
                    self.measure();
                    let swept = self.swept_physical_waiters();
                    self.answer_with_head(swept);
                }
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                tracing::error!(error = %e, "compaction batch failed; retrying in 1s");
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    }

    fn sweep(&mut self, from: i64, target: i64) -> Result<i64> {
        let started = Instant::now();
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let rows: Vec<(i64, i64, i64)> = {
            let mut stmt = self.conn.prepare_cached(
                "SELECT id, prev_id, version FROM log WHERE id >= ?1 AND id < ?2 ORDER BY id LIMIT ?3",
            )?;
            let rows = stmt.query_map((from, target, COMPACT_BATCH), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let mut swept = 0;
        {
            let mut delete = self.conn.prepare_cached("DELETE FROM log WHERE id = ?1")?;
            // A swept tombstone takes the deleted key's entry with it, unless
            // the key has been created again since.
            let mut forget = self
                .conn
                .prepare_cached("DELETE FROM current WHERE key = (SELECT key FROM log WHERE id = ?1) AND id = -?1")?;
            for &(id, prev_id, version) in &rows {
                if prev_id != 0 {
                    delete.execute([prev_id])?;
                }
                if version == 0 {
                    forget.execute([id])?;
                    delete.execute([id])?;
                }
                swept += 1;
                if started.elapsed() >= STEP_BUDGET {
                    break;
                }
            }
        }
        let cursor = match rows.get(swept.max(1) - 1) {
            Some(&(last, _, _)) if swept < rows.len() || rows.len() as i64 == COMPACT_BATCH => last + 1,
            _ => target,
        };
        let mut meta = self.meta;
        meta.compact_cursor = cursor;
        schema::write_meta(&self.conn, &meta)?;
        self.conn.execute_batch("COMMIT")?;
        self.checkpointer.kick();
        Ok(cursor)
    }

    /// Returns one step of free pages to the file system; when none are
    /// left, checkpoints the WAL and truncates it, so the space freed by
    /// compaction does not reappear as a grown WAL.
    pub(super) fn vacuum_step(&mut self) {
        let step = || -> rusqlite::Result<i64> {
            // incremental_vacuum frees one page per step of its statement:
            // run it for the step's budget, in one transaction.
            self.conn.execute_batch("BEGIN IMMEDIATE")?;
            let freed = (|| {
                let mut stmt = self.conn.prepare(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES})"))?;
                let mut rows = stmt.query([])?;
                let started = Instant::now();
                while rows.next()?.is_some() && started.elapsed() < STEP_BUDGET {}
                Ok::<_, rusqlite::Error>(())
            })();
            match freed {
                Ok(()) => self.conn.execute_batch("COMMIT")?,
                Err(e) => {
                    let _ = self.conn.execute_batch("ROLLBACK");
                    return Err(e);
                }
            }
            self.conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))
        };
        match step() {
            Ok(0) | Err(_) => {
                self.vacuum_pending = false;
                // The file shrinks when the vacuum's pages reach it: checkpoint
                // and truncate the WAL now (the checkpointer thread has copied
                // most of it already). TRUNCATE waits for readers to leave the
                // WAL: allow it 100 ms so writers are not held up; the next
                // compaction tries again.
                let _ = self.conn.busy_timeout(std::time::Duration::from_millis(100));
                if let Err(e) = self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
                    tracing::debug!(error = %e, "WAL checkpoint did not complete");
                }
                let _ = self.conn.busy_timeout(std::time::Duration::from_secs(10));
                self.measure();
                let done = std::mem::take(&mut self.defrag_waiters);
                self.answer_with_head(done);
            }
            Ok(_) => {}
        }
    }

    /// Takes the `physical` compactions whose revision has been swept.
    pub(super) fn swept_physical_waiters(&mut self) -> Vec<tokio::sync::oneshot::Sender<Result<i64>>> {
        let swept = if self.compaction_pending() { 0 } else { self.meta.compact_rev };
        let (due, waiting) = std::mem::take(&mut self.physical_waiters).into_iter().partition(|(rev, _)| *rev <= swept);
        self.physical_waiters = waiting;
        due.into_iter().map(|(_, reply)| reply).collect()
    }
}
