//! The embedded backend: etcd's model over one SQLite database in WAL mode.
//! Writes go through one writer thread (`writer`), reads through a small
//! pool of read-only connections, each read inside its own snapshot.

pub mod backup;
mod checkpoint;
mod compact;
mod fanout;
mod lease;
mod quota;
mod read;
mod schema;
mod wal_vfs;
mod watch;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};

pub use quota::DEFAULT_QUOTA_BYTES;
pub use schema::SyncMode;
use writer::{Command, Writer};

use super::proto::*;
use super::{check_put, check_txn, Result, SnapshotStream, Store, StoreError, WatchRequestStream, WatchResponseStream};
use super::{DEFAULT_MAX_REQUEST_BYTES, ETCD_API_VERSION, MAX_LEASE_TTL};
use crate::sync::LockExt;

/// Commits kept for watchers that are slow to take them; past this a
/// watcher re-reads from the log instead of holding memory.
const COMMIT_BACKLOG: usize = 256;
/// Read connections: at most this many reads run at once, each on a
/// connection kept open for the next. Reads are CPU-bound on the file's
/// pages, so more than a few at once only adds threads: when every
/// informer listed at start, each read took a blocking thread and a
/// connection of its own (32 threads, 32 opened and closed connections).
const MAX_READERS: usize = 4;
const SNAPSHOT_CHUNK: usize = 32 * 1024;

#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// The database file; its folder is created when missing.
    pub path: PathBuf,
    pub sync: SyncMode,
    pub max_request_bytes: usize,
    /// Leases are granted for at least this many seconds.
    pub min_lease_ttl: i64,
    pub progress_notify_interval: Duration,
    /// How MemberList names this member and where clients reach it.
    pub member_name: String,
    pub client_urls: Vec<String>,
    /// etcd's `--quota-backend-bytes`: 0 for etcd's default (2 GiB),
    /// negative for no quota.
    pub quota_backend_bytes: i64,
}

impl SqliteOptions {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteOptions {
            path: path.into(),
            sync: SyncMode::Normal,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            min_lease_ttl: 2,
            progress_notify_interval: Duration::from_secs(600),
            member_name: "default".into(),
            client_urls: Vec::new(),
            quota_backend_bytes: 0,
        }
    }
}

/// What committed: the head revision after the batch and its events.
pub struct Committed {
    pub rev: i64,
    pub events: Vec<Event>,
}

/// State the writer publishes and everyone else reads.
pub struct Shared {
    /// The newest revision that is durable and told: a read's snapshot may
    /// be ahead while the WAL sync of its newest commit runs.
    head: AtomicI64,
    head_moved: tokio::sync::Notify,
    /// Held by a test to keep `wal_sync` from syncing.
    #[cfg(test)]
    sync_hold: Mutex<()>,
    compact_rev: AtomicI64,
    /// Hands commits to the watch streams that want them.
    fanout: Arc<fanout::Fanout>,
    leases: lease::Leases,
    /// The alarms raised, as the writer last stored them.
    alarms: Mutex<Vec<AlarmMember>>,
    cluster_id: u64,
    member_id: u64,
}

impl Shared {
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader { cluster_id: self.cluster_id, member_id: self.member_id, revision, raft_term: 2 }
    }

    fn head(&self) -> i64 {
        self.head.load(Ordering::Acquire)
    }

    fn compact_rev(&self) -> i64 {
        self.compact_rev.load(Ordering::Acquire)
    }

    fn set_alarms(&self, alarms: &[AlarmMember]) {
        let mut held = self.alarms.locked();
        if held.as_slice() != alarms {
            *held = alarms.to_vec();
        }
    }

    fn alarms(&self) -> Vec<AlarmMember> {
        self.alarms.locked().clone()
    }

    fn publish_head(&self, rev: i64, compact_rev: i64) {
        self.compact_rev.store(compact_rev, Ordering::Release);
        self.head.store(rev, Ordering::Release);
        self.head_moved.notify_waiters();
    }

    /// Waits until `rev` is published: a read that saw a commit whose WAL
    /// sync still runs answers only once that commit is durable.
    async fn published(&self, rev: i64) {
        // Nearly always so: no waiter is registered then.
        if self.head() >= rev {
            return;
        }
        loop {
            let moved = self.head_moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if self.head() >= rev {
                return;
            }
            moved.await;
        }
    }
}

/// A pool of read-only connections used from blocking threads.
pub struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    running: Arc<tokio::sync::Semaphore>,
}

impl Readers {
    pub fn new(path: PathBuf) -> Self {
        Readers { path, idle: Mutex::new(Vec::new()), running: Arc::new(tokio::sync::Semaphore::new(MAX_READERS)) }
    }

    /// Runs `f` with a read connection on a blocking thread.
    pub async fn run<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let this = self.clone();
        let permit = self
            .running
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| StoreError::Internal(format!("read slots closed: {e}")))?;
        tokio::task::spawn_blocking(move || {
            let _running = permit;
            let conn = match this.idle().pop() {
                Some(conn) => conn,
                None => schema::open_reader(&this.path)?,
            };
            let res = f(&conn);
            let mut idle = this.idle();
            if idle.len() < MAX_READERS {
                idle.push(conn);
            }
            res
        })
        .await
        .map_err(|e| StoreError::Internal(format!("read task failed: {e}")))?
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.idle.locked()
    }
}

pub struct SqliteStore {
    opts: SqliteOptions,
    shared: Arc<Shared>,
    readers: Arc<Readers>,
    commands: mpsc::UnboundedSender<Command>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl SqliteStore {
    /// Opens (or creates) the store and starts its writer thread and lease
    /// timer. Must be called within a tokio runtime.
    pub fn open(opts: SqliteOptions) -> Result<Arc<Self>> {
        let conn = schema::open_writer(&opts.path, opts.sync)?;
        let meta = schema::init(&conn, crate::host::random::u64)?;
        let shared = Arc::new(Shared {
            head: AtomicI64::new(meta.rev),
            head_moved: tokio::sync::Notify::new(),
            #[cfg(test)]
            sync_hold: Mutex::new(()),
            compact_rev: AtomicI64::new(meta.compact_rev),
            fanout: Arc::new(fanout::Fanout::new(meta.rev, COMMIT_BACKLOG)),
            leases: lease::Leases::default(),
            alarms: Mutex::new(Vec::new()),
            cluster_id: meta.cluster_id,
            member_id: meta.member_id,
        });
        // A restart renews every lease to its full TTL, as etcd does.
        {
            let mut stmt = conn.prepare("SELECT id, ttl FROM lease")?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))?;
            for row in rows {
                let (id, ttl) = row?;
                shared.leases.insert(id, ttl);
            }
        }
        tracing::info!(path = %opts.path.display(), revision = meta.rev, compact_revision = meta.compact_rev, "datastore opened");
        let (commands, rx) = mpsc::unbounded_channel();
        let checkpointer = checkpoint::Checkpointer::start(&opts.path)?;
        let writer =
            Writer::new(conn, meta, shared.clone(), opts.min_lease_ttl, opts.quota_backend_bytes, checkpointer)?;
        let handle = std::thread::Builder::new().name("store-writer".into()).spawn(move || writer.run(rx))?;
        let readers = Arc::new(Readers::new(opts.path.clone()));
        let store = Arc::new(SqliteStore { opts, shared, readers, commands, writer: Mutex::new(Some(handle)) });
        tokio::spawn(expire_leases(store.shared.clone(), store.commands.downgrade()));
        Ok(store)
    }

    /// Finishes queued writes, checkpoints the WAL and stops the writer.
    /// Requests made afterwards fail with `Closed`.
    pub async fn close(&self) {
        let handle = self.writer.locked().take();
        if let Some(handle) = handle {
            let (tx, rx) = oneshot::channel();
            // The writer stops after the batch that carries this.
            let _ = self.commands.send(Command::Shutdown { reply: tx });
            let _ = rx.await;
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        }
    }

    async fn command<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(make(tx)).map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    fn check_size(&self, req: &impl prost::Message) -> Result<()> {
        if req.encoded_len() > self.opts.max_request_bytes {
            return Err(StoreError::RequestTooLarge);
        }
        Ok(())
    }

    async fn single_op(&self, op: request_op::Request) -> Result<(ResponseHeader, response_op::Response)> {
        let req =
            TxnRequest { compare: Vec::new(), success: vec![RequestOp { request: Some(op) }], failure: Vec::new() };
        self.check_size(&req)?;
        let mut resp = self.command(|reply| Command::Txn { req, reply }).await?;
        let header = resp.header.take().unwrap_or_default();
        let op = resp
            .responses
            .pop()
            .and_then(|r| r.response)
            .ok_or_else(|| StoreError::Internal("empty txn response".into()))?;
        Ok((header, op))
    }

    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Shared) -> Result<T> + Send + 'static,
    {
        let shared = self.shared.clone();
        self.readers.run(move |conn| f(conn, &shared)).await
    }
}

/// Revokes leases as their deadlines pass; sleeps until the next one.
async fn expire_leases(shared: Arc<Shared>, commands: mpsc::WeakUnboundedSender<Command>) {
    loop {
        let (expired, next) = shared.leases.take_expired();
        for id in expired {
            let Some(commands) = commands.upgrade() else { return };
            tracing::debug!(lease = id, "lease expired");
            if commands.send(Command::LeaseRevoke { id, reply: None }).is_err() {
                return;
            }
        }
        if commands.upgrade().is_none() {
            return;
        }
        shared.leases.wait(next).await;
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        if req.key.is_empty() {
            return Err(StoreError::EmptyKey);
        }
        let (resp, seen) = self
            .read(move |conn, shared| {
                let snapshot = conn.unchecked_transaction()?;
                let meta = schema::read_meta(&snapshot)?;
                let mut resp = read::range(&snapshot, &req, meta.rev, meta.compact_rev)?;
                resp.header = Some(shared.header(meta.rev));
                Ok((resp, meta.rev))
            })
            .await?;
        self.shared.published(seen).await;
        Ok(resp)
    }

    async fn put(&self, req: PutRequest) -> Result<PutResponse> {
        check_put(&req)?;
        match self.single_op(request_op::Request::RequestPut(req)).await? {
            (header, response_op::Response::ResponsePut(mut resp)) => {
                resp.header = Some(header);
                Ok(resp)
            }
            _ => Err(StoreError::Internal("unexpected response to put".into())),
        }
    }

    async fn delete_range(&self, req: DeleteRangeRequest) -> Result<DeleteRangeResponse> {
        if req.key.is_empty() {
            return Err(StoreError::EmptyKey);
        }
        match self.single_op(request_op::Request::RequestDeleteRange(req)).await? {
            (header, response_op::Response::ResponseDeleteRange(mut resp)) => {
                resp.header = Some(header);
                Ok(resp)
            }
            _ => Err(StoreError::Internal("unexpected response to delete".into())),
        }
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        check_txn(&req)?;
        self.check_size(&req)?;
        self.command(|reply| Command::Txn { req, reply }).await
    }

    async fn compact(&self, req: CompactionRequest) -> Result<CompactionResponse> {
        let head = self.command(|reply| Command::Compact { rev: req.revision, physical: req.physical, reply }).await?;
        Ok(CompactionResponse { header: Some(self.shared.header(head)) })
    }

    async fn watch(&self, requests: WatchRequestStream) -> Result<WatchResponseStream> {
        Ok(watch::spawn(
            self.shared.clone(),
            self.readers.clone(),
            requests,
            self.opts.progress_notify_interval,
            self.opts.max_request_bytes,
        ))
    }

    async fn lease_grant(&self, req: LeaseGrantRequest) -> Result<LeaseGrantResponse> {
        if req.ttl > MAX_LEASE_TTL {
            return Err(StoreError::LeaseTtlTooLarge);
        }
        let (id, ttl, head) = self.command(|reply| Command::LeaseGrant { id: req.id, ttl: req.ttl, reply }).await?;
        Ok(LeaseGrantResponse { header: Some(self.shared.header(head)), id, ttl, error: String::new() })
    }

    async fn lease_revoke(&self, req: LeaseRevokeRequest) -> Result<LeaseRevokeResponse> {
        let head = self.command(|reply| Command::LeaseRevoke { id: req.id, reply: Some(reply) }).await?;
        Ok(LeaseRevokeResponse { header: Some(self.shared.header(head)) })
    }

    async fn lease_keep_alive(&self, req: LeaseKeepAliveRequest) -> Result<LeaseKeepAliveResponse> {
        let ttl = self.shared.leases.renew(req.id).unwrap_or(0);
        Ok(LeaseKeepAliveResponse { header: Some(self.shared.header(self.shared.head())), id: req.id, ttl })
    }

    async fn lease_time_to_live(&self, req: LeaseTimeToLiveRequest) -> Result<LeaseTimeToLiveResponse> {
        let header = Some(self.shared.header(self.shared.head()));
        let Some((granted_ttl, ttl)) = self.shared.leases.remaining(req.id) else {
            return Ok(LeaseTimeToLiveResponse { header, id: req.id, ttl: -1, granted_ttl: 0, keys: Vec::new() });
        };
        let keys = if req.keys {
            let id = req.id;
            self.read(move |conn, _| read::lease_keys(conn, id)).await?
        } else {
            Vec::new()
        };
        Ok(LeaseTimeToLiveResponse { header, id: req.id, ttl, granted_ttl, keys })
    }

    async fn lease_leases(&self, _req: LeaseLeasesRequest) -> Result<LeaseLeasesResponse> {
        let leases = self.shared.leases.ids().into_iter().map(|id| LeaseStatus { id }).collect();
        Ok(LeaseLeasesResponse { header: Some(self.shared.header(self.shared.head())), leases })
    }

    async fn status(&self) -> Result<StatusResponse> {
        let (db_size, in_use) = self.read(|conn, _| Ok(schema::db_size(conn)?)).await?;
        let head = self.shared.head();
        Ok(StatusResponse {
            header: Some(self.shared.header(head)),
            version: ETCD_API_VERSION.into(),
            db_size,
            leader: self.shared.member_id,
            raft_index: head as u64,
            raft_term: 2,
            raft_applied_index: head as u64,
            errors: self.shared.alarms().iter().map(quota::describe).collect(),
            db_size_in_use: in_use,
            is_learner: false,
        })
    }

    async fn alarm(&self, req: AlarmRequest) -> Result<AlarmResponse> {
        let alarms = self.command(|reply| Command::Alarm { req, reply }).await?;
        Ok(AlarmResponse { header: Some(self.shared.header(self.shared.head())), alarms })
    }

    async fn member_list(&self, _req: MemberListRequest) -> Result<MemberListResponse> {
        let me = Member {
            id: self.shared.member_id,
            name: self.opts.member_name.clone(),
            peer_ur_ls: Vec::new(),
            client_ur_ls: self.opts.client_urls.clone(),
            is_learner: false,
        };
        Ok(MemberListResponse { header: Some(self.shared.header(self.shared.head())), members: vec![me] })
    }

    async fn defragment(&self) -> Result<DefragmentResponse> {
        let head = self.command(|reply| Command::Defragment { reply }).await?;
        Ok(DefragmentResponse { header: Some(self.shared.header(head)) })
    }

    async fn snapshot(&self) -> Result<SnapshotStream> {
        let target = self.opts.path.with_extension(format!("snapshot-{:016x}", crate::host::random::u64()));
        let into = target.clone();
        let head = self
            .read(move |conn, _| {
                let snapshot = conn.unchecked_transaction()?;
                let meta = schema::read_meta(&snapshot)?;
                drop(snapshot);
                conn.execute("VACUUM INTO ?1", [into.to_string_lossy().as_ref()])?;
                Ok(meta.rev)
            })
            .await?;
        self.shared.published(head).await;
        let header = self.shared.header(head);
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let res = stream_file(&target, header, &tx).await;
            let _ = tokio::fs::remove_file(&target).await;
            if let Err(e) = res {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// Streams a file in chunks, then its SHA-256, as etcd's Snapshot does.
async fn stream_file(path: &Path, header: ResponseHeader, tx: &mpsc::Sender<Result<SnapshotResponse>>) -> Result<()> {
    let mut file = tokio::fs::File::open(path).await?;
    let size = file.metadata().await?.len();
    let mut remaining = size + 32;
    let mut hasher = Sha256::new();
    let mut first = true;
    loop {
        let mut buf = vec![0u8; SNAPSHOT_CHUNK];
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        buf.truncate(n);
        hasher.update(&buf);
        remaining -= n as u64;
        let resp = SnapshotResponse { header: first.then_some(header), remaining_bytes: remaining, blob: buf };
        first = false;
        if tx.send(Ok(resp)).await.is_err() {
            return Ok(());
        }
    }
    let resp =
        SnapshotResponse { header: first.then_some(header), remaining_bytes: 0, blob: hasher.finalize().to_vec() };
    let _ = tx.send(Ok(resp)).await;
    Ok(())
}

#[cfg(test)]
mod tests;
