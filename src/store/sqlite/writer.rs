//! The one writer: a thread that owns the read-write connection, applies
//! queued requests in group commits (one SQLite transaction for everything
//! that arrived together, one revision per request that changed something),
//! and only after the commit is durable answers the callers and hands the
//! events to the watchers (`wal_sync`, which syncs a commit while the next
//! batch is applied).

mod txn;
mod wal_sync;

use std::sync::Arc;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::quota::{self, Admission, Quota};
use super::read;
use super::schema::{self, Meta};
use super::{wal_vfs, Shared};
use crate::store::proto::*;
use crate::store::{Result, StoreError, MAX_LEASE_TTL};
use wal_sync::{unless, Batch, WalSync};

/// Requests applied in one group commit, at most.
const MAX_BATCH: usize = 256;

pub enum Command {
    Txn {
        req: TxnRequest,
        reply: oneshot::Sender<Result<TxnResponse>>,
    },
    Compact {
        rev: i64,
        physical: bool,
        reply: oneshot::Sender<Result<i64>>,
    },
    LeaseGrant {
        id: i64,
        ttl: i64,
        reply: oneshot::Sender<Result<(i64, i64, i64)>>,
    },
    LeaseRevoke {
        id: i64,
        reply: Option<oneshot::Sender<Result<i64>>>,
    },
    Defragment {
        reply: oneshot::Sender<Result<i64>>,
    },
    /// etcd's Alarm: list, raise or disarm alarms.
    Alarm {
        req: AlarmRequest,
        reply: oneshot::Sender<Result<Vec<AlarmMember>>>,
    },
    /// Stop after the batch this arrives in.
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

/// What a command left to do once its transaction has committed.
enum Done {
    Txn(oneshot::Sender<Result<TxnResponse>>, Result<TxnResponse>),
    Compact(oneshot::Sender<Result<i64>>, bool, Result<i64>),
    LeaseGrant(oneshot::Sender<Result<(i64, i64, i64)>>, Result<(i64, i64, i64)>),
    LeaseRevoke(Option<oneshot::Sender<Result<i64>>>, i64, Result<i64>),
    Alarm(oneshot::Sender<Result<Vec<AlarmMember>>>, Result<Vec<AlarmMember>>),
}

impl Done {
    /// Answers the caller once the commit is durable (or its sync failed),
    /// with the lease table brought up to date first.
    fn answer(self, shared: &Shared, failed: Option<&str>) {
        match self {
            Done::Txn(reply, res) => drop(reply.send(unless(failed, res))),
            Done::Compact(reply, _, res) => drop(reply.send(unless(failed, res))),
            Done::LeaseGrant(reply, res) => {
                if let Ok((id, ttl, _)) = &res {
                    shared.leases.insert(*id, *ttl);
                }
                let _ = reply.send(unless(failed, res));
            }
            Done::Alarm(reply, res) => drop(reply.send(unless(failed, res))),
            Done::LeaseRevoke(reply, id, res) => {
                if res.is_ok() {
                    shared.leases.remove(id);
                }
                if let Some(reply) = reply {
                    let _ = reply.send(unless(failed, res));
                }
            }
        }
    }

    fn storage_failed(&self) -> bool {
        match self {
            Done::Txn(_, r) => is_storage_error(r),
            Done::Compact(_, _, r) | Done::LeaseRevoke(_, _, r) => is_storage_error(r),
            Done::LeaseGrant(_, r) => is_storage_error(r),
            Done::Alarm(_, r) => is_storage_error(r),
        }
    }

    fn fail(self, why: &str) {
        let err = || StoreError::Internal(why.to_string());
        match self {
            Done::Txn(reply, _) => drop(reply.send(Err(err()))),
            Done::Compact(reply, _, _) => drop(reply.send(Err(err()))),
            Done::LeaseGrant(reply, _) => drop(reply.send(Err(err()))),
            Done::Alarm(reply, _) => drop(reply.send(Err(err()))),
            Done::LeaseRevoke(reply, _, _) => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(err()));
                }
            }
        }
    }
}

fn is_storage_error<T>(r: &Result<T>) -> bool {
    matches!(r, Err(StoreError::Sqlite(_) | StoreError::Io(_)))
}

pub struct Writer {
    pub(super) conn: Connection,
    pub(super) meta: Meta,
    pub(super) shared: Arc<Shared>,
    min_lease_ttl: i64,
    /// `physical` compactions waiting for the log to be swept up to them.
    pub(super) physical_waiters: Vec<(i64, oneshot::Sender<Result<i64>>)>,
    /// Free pages left by compaction still to hand back to the file system.
    pub(super) vacuum_pending: bool,
    /// Defragment requests waiting for the vacuum to finish.
    pub(super) defrag_waiters: Vec<oneshot::Sender<Result<i64>>>,
    quota: Quota,
    /// The alarms raised, as stored.
    alarms: Vec<AlarmMember>,
    /// Checkpoints the WAL off this thread, kicked after each commit.
    pub(super) checkpointer: super::checkpoint::Checkpointer,
    /// Whether this batch makes events: some watch stream was subscribed
    /// when it began.
    collect_events: bool,
    /// Syncs committed batches and then settles them.
    wal_sync: WalSync,
}

impl Writer {
    /// `quota_bytes`: 0 for etcd's default quota, negative for none.
    pub fn new(
        conn: Connection,
        meta: Meta,
        shared: Arc<Shared>,
        min_lease_ttl: i64,
        quota_bytes: i64,
        checkpointer: super::checkpoint::Checkpointer,
    ) -> Result<Self> {
        let alarms = schema::read_alarms(&conn)?;
        shared.set_alarms(&alarms);
        // Commits a crash of the process left unsynced are read back from
        // the page cache: make them durable before anything serves them
        // (a checkpoint syncs the WAL before it copies it).
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "WAL checkpoint at start failed");
        }
        let wal_sync = WalSync::start(shared.clone())?;
        let mut writer = Writer {
            conn,
            meta,
            shared,
            min_lease_ttl,
            physical_waiters: Vec::new(),
            vacuum_pending: false,
            defrag_waiters: Vec::new(),
            quota: Quota::new(quota_bytes),
            alarms,
            checkpointer,
            collect_events: false,
            wal_sync,
        };
        writer.measure();
        Ok(writer)
    }

    /// Records the size in use for the quota.
    pub(super) fn measure(&mut self) {
        if !self.quota.enabled() {
            return;
        }
        match schema::db_size(&self.conn) {
            Ok((_, in_use)) => self.quota.measured(in_use),
            Err(e) => tracing::warn!(error = %e, "cannot measure the database"),
        }
    }

    /// Lets a request costing `cost` bytes through, or refuses it with
    /// NOSPACE, raising the alarm when this request is the one that would
    /// pass the quota.
    fn admit(&mut self, cost: i64) -> Result<()> {
        match self.quota.admit(cost, quota::nospace(&self.alarms)) {
            Admission::Admitted => Ok(()),
            Admission::Refused => Err(StoreError::NoSpace),
            Admission::RaiseAlarm => {
                let member_id = self.meta.member_id;
                tracing::warn!(member_id, "database space exceeded: raising the NOSPACE alarm");
                self.alarm(&AlarmRequest {
                    action: alarm_request::AlarmAction::Activate as i32,
                    member_id,
                    alarm: AlarmType::Nospace as i32,
                })?;
                Err(StoreError::NoSpace)
            }
        }
    }

    /// etcd's Alarm: GET lists every alarm; ACTIVATE raises one and answers
    /// it; DEACTIVATE disarms one and answers what it disarmed.
    fn alarm(&mut self, req: &AlarmRequest) -> Result<Vec<AlarmMember>> {
        use alarm_request::AlarmAction;
        let member = AlarmMember { member_id: req.member_id, alarm: req.alarm };
        let action = AlarmAction::try_from(req.action)
            .map_err(|_| StoreError::InvalidArgument(format!("unknown alarm action {}", req.action)))?;
        match action {
            AlarmAction::Get => Ok(self.alarms.clone()),
            AlarmAction::Activate => {
                if req.alarm == AlarmType::None as i32 {
                    return Ok(Vec::new());
                }
                self.conn
                    .prepare_cached("INSERT OR IGNORE INTO alarm (member_id, alarm) VALUES (?1, ?2)")?
                    .execute((req.member_id as i64, req.alarm))?;
                if !self.alarms.contains(&member) {
                    self.alarms.push(member);
                }
                Ok(vec![member])
            }
            AlarmAction::Deactivate => {
                let removed = self
                    .conn
                    .prepare_cached("DELETE FROM alarm WHERE member_id = ?1 AND alarm = ?2")?
                    .execute((req.member_id as i64, req.alarm))?;
                self.alarms.retain(|a| a != &member);
                if removed > 0 {
                    tracing::info!(member_id = req.member_id, alarm = req.alarm, "alarm disarmed");
                }
                Ok(if removed > 0 { vec![member] } else { Vec::new() })
            }
        }
    }

    /// Runs until every sender of `rx` is gone, then checkpoints the WAL.
    pub fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            let first = if self.compaction_pending() || self.vacuum_pending {
                match rx.try_recv() {
                    Ok(cmd) => cmd,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        if self.compaction_pending() {
                            self.compact_step();
                        } else {
                            self.vacuum_step();
                        }
                        continue;
                    }
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                }
            } else {
                match rx.blocking_recv() {
                    Some(cmd) => cmd,
                    None => break,
                }
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(_) => break,
                }
            }
            if self.apply_batch(batch) {
                break;
            }
        }
        self.wal_sync.finish();
        if let Err(e) = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);") {
            tracing::warn!(error = %e, "final WAL checkpoint failed");
        }
    }

    /// Applies and commits a batch; true when it asked the writer to stop.
    fn apply_batch(&mut self, batch: Vec<Command>) -> bool {
        let mut defrags = Vec::new();
        let mut shutdowns = Vec::new();
        let mut done = Vec::with_capacity(batch.len());
        let mut events = Vec::new();
        let start = self.meta;
        self.collect_events = self.shared.fanout.has_subscribers();
        if let Err(e) = self.exec("BEGIN IMMEDIATE") {
            tracing::error!(error = %e, "cannot start a write transaction");
            let stop = batch.iter().any(|c| matches!(c, Command::Shutdown { .. }));
            for cmd in batch {
                fail_command(cmd, &e.to_string());
            }
            return stop;
        }
        for cmd in batch {
            match cmd {
                Command::Txn { req, reply } => {
                    let res = self.admit(quota::txn_cost(&req)).and_then(|_| {
                        if txn::fails_before_writing(&req) {
                            self.undo_on_error(&mut events, |w, ev| w.apply_txn_request(req, ev))
                        } else {
                            self.in_savepoint(&mut events, |w, ev| w.apply_txn_request(req, ev))
                        }
                    });
                    done.push(Done::Txn(reply, res));
                }
                Command::Compact { rev, physical, reply } => {
                    let res = self.compact(rev);
                    done.push(Done::Compact(reply, physical, res));
                }
                Command::LeaseGrant { id, ttl, reply } => {
                    let res = self
                        .admit(quota::LEASE_GRANT_COST)
                        .and_then(|_| self.in_savepoint(&mut events, |w, _| w.lease_grant(id, ttl)));
                    done.push(Done::LeaseGrant(reply, res));
                }
                Command::LeaseRevoke { id, reply } => {
                    let res = self.in_savepoint(&mut events, |w, ev| w.lease_revoke(id, ev));
                    done.push(Done::LeaseRevoke(reply, id, res));
                }
                Command::Alarm { req, reply } => {
                    let res = self.in_savepoint(&mut events, |w, _| w.alarm(&req));
                    done.push(Done::Alarm(reply, res));
                }
                Command::Defragment { reply } => defrags.push(reply),
                Command::Shutdown { reply } => shutdowns.push(reply),
            }
        }
        let committed = if done.iter().any(Done::storage_failed) {
            Err("a storage error aborted the batch".to_string())
        } else {
            self.write_meta_if_compacted(&start)
                .and_then(|_| {
                    // The commit's sync is left to `wal_sync` (when this
                    // connection's WAL is `wal_vfs`'s: the FULL mode).
                    wal_vfs::arm_deferred_sync(&self.conn);
                    let committed = self.exec("COMMIT");
                    let wal = wal_vfs::take_deferred_sync(&self.conn);
                    committed.map(|_| wal)
                })
                .map_err(|e| e.to_string())
        };
        match committed {
            Ok(wal) => {
                self.checkpointer.kick();
                self.publish(done, events, wal)
            }
            Err(why) => {
                tracing::error!(error = %why, "write batch rolled back");
                let _ = self.exec("ROLLBACK");
                self.meta = start;
                match schema::read_alarms(&self.conn) {
                    Ok(alarms) => self.alarms = alarms,
                    Err(e) => tracing::warn!(error = %e, "cannot read the alarms back"),
                }
                for d in done {
                    d.fail(&why);
                }
            }
        }
        self.shared.set_alarms(&self.alarms);
        if self.quota.stale() {
            self.measure();
        }
        // A defragment is the vacuum run to its end, step by step between
        // writes (never one long VACUUM that would hold every writer).
        if !defrags.is_empty() {
            self.defrag_waiters.extend(defrags);
            self.vacuum_pending = true;
        }
        let stop = !shutdowns.is_empty();
        if stop {
            self.wal_sync.finish();
        }
        for reply in shutdowns {
            let _ = reply.send(());
        }
        stop
    }

    /// Hands a committed batch to `wal_sync`, which makes it seen once it
    /// is durable: revision, events, leases, replies. A `physical`
    /// compaction waits here for the sweep instead.
    fn publish(&mut self, done: Vec<Done>, events: Vec<Event>, wal: Option<Arc<std::fs::File>>) {
        let mut owed = Vec::with_capacity(done.len());
        for d in done {
            match d {
                Done::Compact(reply, true, Ok(_)) => self.physical_waiters.push((self.meta.compact_rev, reply)),
                d => owed.push(d),
            }
        }
        let heads = self.swept_physical_waiters();
        self.wal_sync.settle(Batch {
            rev: self.meta.rev,
            compact_rev: self.meta.compact_rev,
            events: self.collect_events.then_some(events),
            done: owed,
            heads,
            wal,
        });
    }

    /// Answers `replies` with the head revision once every commit made so
    /// far is durable and seen (a compaction or vacuum step runs while the
    /// last batches may still be syncing): settled as a batch with no
    /// change of its own, after them.
    pub(super) fn answer_with_head(&self, replies: Vec<oneshot::Sender<Result<i64>>>) {
        if replies.is_empty() {
            return;
        }
        self.wal_sync.settle(Batch {
            rev: self.meta.rev,
            compact_rev: self.meta.compact_rev,
            events: Some(Vec::new()),
            done: Vec::new(),
            heads: replies,
            wal: None,
        });
    }

    /// Stores the meta row when this batch moved compaction's marks; the
    /// revision alone needs no row write (`schema::read_meta` finds it in
    /// the log), which spares every commit a statement and a page.
    fn write_meta_if_compacted(&self, start: &schema::Meta) -> rusqlite::Result<()> {
        if (self.meta.compact_rev, self.meta.compact_cursor) == (start.compact_rev, start.compact_cursor) {
            return Ok(());
        }
        schema::write_meta(&self.conn, &self.meta)
    }

    /// Runs one statement without rows, prepared once per connection
    /// (`execute_batch` would parse it again on every call).
    fn exec(&self, sql: &str) -> rusqlite::Result<()> {
        self.conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    }

    /// Runs `f` so that an error undoes exactly what `f` wrote.
    fn in_savepoint<T>(
        &mut self,
        events: &mut Vec<Event>,
        f: impl FnOnce(&mut Self, &mut Vec<Event>) -> Result<T>,
    ) -> Result<T> {
        self.exec("SAVEPOINT req")?;
        match self.undo_on_error(events, f) {
            Ok(v) => {
                self.exec("RELEASE req")?;
                Ok(v)
            }
            Err(e) => {
                self.exec("ROLLBACK TO req")?;
                self.exec("RELEASE req")?;
                Err(e)
            }
        }
    }

    /// Runs `f`, which writes nothing to the database before its last
    /// chance to fail (any SQLite error rolls the whole batch back), so
    /// that an error leaves the revision and the events as they were.
    fn undo_on_error<T>(
        &mut self,
        events: &mut Vec<Event>,
        f: impl FnOnce(&mut Self, &mut Vec<Event>) -> Result<T>,
    ) -> Result<T> {
        let (meta, n_events) = (self.meta, events.len());
        let res = f(self, events);
        if res.is_err() {
            self.meta = meta;
            events.truncate(n_events);
        }
        res
    }

    fn want_events(&self) -> bool {
        self.collect_events
    }

    pub(super) fn lease_exists(&self, id: i64) -> Result<bool> {
        let mut stmt = self.conn.prepare_cached("SELECT 1 FROM lease WHERE id = ?1")?;
        Ok(stmt.exists([id])?)
    }

    fn lease_grant(&mut self, id: i64, ttl: i64) -> Result<(i64, i64, i64)> {
        if ttl > MAX_LEASE_TTL {
            return Err(StoreError::LeaseTtlTooLarge);
        }
        let id = if id == 0 {
            loop {
                let candidate = (crate::host::random::u64() >> 1) as i64;
                if candidate != 0 && !self.lease_exists(candidate)? {
                    break candidate;
                }
            }
        } else {
            id
        };
        if id < 0 || self.lease_exists(id)? {
            return Err(StoreError::LeaseExists);
        }
        let ttl = ttl.max(self.min_lease_ttl);
        self.conn.prepare_cached("INSERT INTO lease (id, ttl) VALUES (?1, ?2)")?.execute((id, ttl))?;
        Ok((id, ttl, self.meta.rev))
    }

    fn lease_revoke(&mut self, id: i64, events: &mut Vec<Event>) -> Result<i64> {
        if !self.lease_exists(id)? {
            return Err(StoreError::LeaseNotFound);
        }
        let rev = self.meta.rev + 1;
        let mut sub = 0;
        for key in read::lease_keys(&self.conn, id)? {
            let d = DeleteRangeRequest { key, range_end: Vec::new(), prev_kv: false };
            self.delete_range(&d, rev, &mut sub, events)?;
        }
        self.conn.prepare_cached("DELETE FROM lease WHERE id = ?1")?.execute([id])?;
        if sub > 0 {
            self.meta.rev = rev;
        }
        Ok(self.meta.rev)
    }

    fn compact(&mut self, rev: i64) -> Result<i64> {
        if rev <= self.meta.compact_rev {
            return Err(StoreError::Compacted { compact_revision: self.meta.compact_rev });
        }
        if rev > self.meta.rev {
            return Err(StoreError::FutureRevision);
        }
        self.meta.compact_rev = rev;
        Ok(self.meta.rev)
    }

    pub(super) fn compaction_pending(&self) -> bool {
        self.meta.compact_cursor < schema::first_id(self.meta.compact_rev + 1)
    }
}

fn fail_command(cmd: Command, why: &str) {
    let err = || StoreError::Internal(why.to_string());
    match cmd {
        Command::Txn { reply, .. } => drop(reply.send(Err(err()))),
        Command::Compact { reply, .. } | Command::LeaseRevoke { reply: Some(reply), .. } => {
            drop(reply.send(Err(err())))
        }
        Command::LeaseGrant { reply, .. } => drop(reply.send(Err(err()))),
        Command::Defragment { reply } => drop(reply.send(Err(err()))),
        Command::Alarm { reply, .. } => drop(reply.send(Err(err()))),
        Command::Shutdown { reply } => drop(reply.send(())),
        Command::LeaseRevoke { reply: None, .. } => {}
    }
}
