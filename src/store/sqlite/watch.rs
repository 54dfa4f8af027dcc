//! One task per watch stream. Watchers that are level with the store take
//! their events straight from the commits the writer hands the stream
//! (only those with a key in one of its watchers' ranges: `fanout`); watchers
//! that start in the past, or fell behind because the client read slowly,
//! catch up from the log in bounded reads and then rejoin.
//! Nothing polls: the task sleeps until a request, a commit, a finished read
//! or the progress-notify tick wakes it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

use super::fanout::{Received, Subscription};
use super::read::{self, Changes};
use super::schema::{self, first_id, rev_of};
use super::{Committed, Readers, Shared};
use crate::store::proto::watch_create_request::FilterType;
use crate::store::proto::{watch_request::RequestUnion, *};
use crate::store::{KeyRange, Result, StoreError, WatchRequestStream, WatchResponseStream};

const CATCH_UP_ROWS: i64 = 1000;
const CATCH_UP_BYTES: usize = 4 << 20;

struct Watcher {
    range: KeyRange,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    progress_notify: bool,
    fragment: bool,
    /// The first log id this watcher has not been sent yet.
    next_id: i64,
    synced: bool,
    sent_since_tick: bool,
}

impl Watcher {
    fn wants(&self, ev: &Event) -> bool {
        let key = ev.kv.as_ref().map_or(&[][..], |kv| kv.key.as_slice());
        let is_put = ev.r#type == EventType::Put as i32;
        self.range.contains(key) && !(is_put && self.no_put) && (is_put || !self.no_delete)
    }

    fn shape(&self, ev: &Event) -> Event {
        Event { r#type: ev.r#type, kv: ev.kv.clone(), prev_kv: if self.prev_kv { ev.prev_kv.clone() } else { None } }
    }
}

type CatchUp = (i64, oneshot::Receiver<Result<Changes>>);

struct WatchStream {
    shared: Arc<Shared>,
    readers: Arc<Readers>,
    out: mpsc::Sender<Result<WatchResponse>>,
    commits: Subscription,
    /// Every commit up to this revision that the watchers want has been
    /// dispatched.
    processed: i64,
    watchers: BTreeMap<i64, Watcher>,
    next_watch_id: i64,
    progress_pending: bool,
    catching_up: Option<CatchUp>,
    max_response_bytes: usize,
}

/// Starts a watch stream over the embedded store.
pub(super) fn spawn(
    shared: Arc<Shared>,
    readers: Arc<Readers>,
    requests: WatchRequestStream,
    progress_interval: Duration,
    max_response_bytes: usize,
) -> WatchResponseStream {
    let (out, rx) = mpsc::channel(64);
    let commits = shared.fanout.subscribe();
    let processed = commits.level();
    let stream = WatchStream {
        shared,
        readers,
        out,
        commits,
        processed,
        watchers: BTreeMap::new(),
        next_watch_id: 0,
        progress_pending: false,
        catching_up: None,
        max_response_bytes,
    };
    tokio::spawn(stream.run(requests, progress_interval));
    Box::pin(ReceiverStream::new(rx))
}

/// The stream's client went away.
struct Gone;

impl WatchStream {
    async fn run(mut self, mut requests: WatchRequestStream, progress_interval: Duration) {
        let start = tokio::time::Instant::now() + progress_interval;
        let mut ticker = tokio::time::interval_at(start, progress_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let step = tokio::select! {
                req = requests.next() => match req {
                    Some(req) => self.handle(req).await,
                    None => break,
                },
                commit = self.commits.recv() => match commit {
                    Received::Commit(commit) => self.dispatch(&commit).await,
                    Received::Lagged => {
                        self.fall_behind();
                        Ok(())
                    }
                    Received::Closed => break,
                },
                done = wait_catch_up(&mut self.catching_up), if self.catching_up.is_some() => {
                    self.finish_catch_up(done).await
                }
                _ = ticker.tick() => self.progress_tick().await,
            };
            if step.is_err() {
                break;
            }
            self.start_catch_up();
            if self.finish_progress_request().await.is_err() {
                break;
            }
        }
    }

    async fn send(&self, resp: WatchResponse) -> Result<(), Gone> {
        self.out.send(Ok(resp)).await.map_err(|_| Gone)
    }

    fn response(&self, watch_id: i64) -> WatchResponse {
        WatchResponse { header: Some(self.shared.header(self.processed)), watch_id, ..Default::default() }
    }

    async fn handle(&mut self, req: WatchRequest) -> Result<(), Gone> {
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
            Some(RequestUnion::CancelRequest(c)) => {
                if self.watchers.remove(&c.watch_id).is_some() {
                    self.subscribe_ranges(None);
                    let mut resp = self.response(c.watch_id);
                    resp.canceled = true;
                    self.send(resp).await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                self.progress_pending = true;
                Ok(())
            }
            None => Ok(()),
        }
    }

    async fn create(&mut self, c: WatchCreateRequest) -> Result<(), Gone> {
        let id = if c.watch_id != 0 {
            c.watch_id
        } else {
            while self.watchers.contains_key(&self.next_watch_id) {
                self.next_watch_id += 1;
            }
            self.next_watch_id
        };
        if self.watchers.contains_key(&id) || id < 0 {
            let mut resp = self.response(id);
            resp.created = true;
            resp.canceled = true;
            resp.cancel_reason = "mvcc: duplicate watch ID provided on the WatchStream".into();
            return self.send(resp).await;
        }
        let key = if c.key.is_empty() { vec![0] } else { c.key };
        let range = KeyRange::new(&key, &c.range_end);
        // From here on the stream is handed the commits in this range;
        // those before are in the log. Level with the store, so that a
        // watch from now starts at the store's revision.
        let level = self.subscribe_ranges(Some(&range));
        self.catch_level(level).await?;
        let next_id = if c.start_revision > 0 { first_id(c.start_revision) } else { first_id(self.processed + 1) };
        let watcher = Watcher {
            range,
            prev_kv: c.prev_kv,
            no_put: c.filters.contains(&(FilterType::Noput as i32)),
            no_delete: c.filters.contains(&(FilterType::Nodelete as i32)),
            progress_notify: c.progress_notify,
            fragment: c.fragment,
            next_id,
            synced: rev_of(next_id) > self.processed,
            sent_since_tick: false,
        };
        let mut resp = self.response(id);
        resp.created = true;
        self.send(resp).await?;
        let compact_rev = self.shared.compact_rev();
        if c.start_revision > 0 && c.start_revision < compact_rev {
            return self.send_compacted(id, compact_rev).await;
        }
        self.watchers.insert(id, watcher);
        Ok(())
    }

    /// Subscribes to the ranges of the watchers, and `extra`; answers the
    /// newest revision handed out (`Subscription::set_ranges`).
    fn subscribe_ranges(&self, extra: Option<&KeyRange>) -> i64 {
        let ranges = self.watchers.values().map(|w| &w.range).chain(extra).cloned().collect();
        self.commits.set_ranges(ranges)
    }

    /// Brings the stream level with `level`, a revision handed out: the
    /// commits queued for it are dispatched, and the stream then has every
    /// event up to `level` its watchers want (commits it was not handed
    /// held none).
    async fn catch_level(&mut self, level: i64) -> Result<(), Gone> {
        while let Some(commit) = self.commits.try_recv() {
            self.dispatch(&commit).await?;
        }
        if self.commits.take_lagged() {
            self.fall_behind();
            return Ok(());
        }
        self.processed = self.processed.max(level);
        let next = first_id(self.processed + 1);
        for w in self.watchers.values_mut().filter(|w| w.synced) {
            w.next_id = w.next_id.max(next);
        }
        Ok(())
    }

    async fn send_compacted(&mut self, id: i64, compact_rev: i64) -> Result<(), Gone> {
        self.watchers.remove(&id);
        self.subscribe_ranges(None);
        let mut resp = self.response(id);
        // etcd sends this one with a header whose revision is 0.
        resp.header = Some(self.shared.header(0));
        resp.canceled = true;
        resp.compact_revision = compact_rev;
        self.send(resp).await
    }

    /// Hands a commit's events to every watcher that is level with the store.
    async fn dispatch(&mut self, commit: &Committed) -> Result<(), Gone> {
        if commit.rev <= self.processed {
            return Ok(());
        }
        let after = self.processed;
        self.processed = commit.rev;
        let mut outgoing = Vec::new();
        for (&id, w) in self.watchers.iter_mut() {
            if !w.synced {
                continue;
            }
            let from = rev_of(w.next_id).max(after + 1);
            let events: Vec<Event> = commit
                .events
                .iter()
                .filter(|ev| ev.kv.as_ref().is_some_and(|kv| kv.mod_revision >= from) && w.wants(ev))
                .map(|ev| w.shape(ev))
                .collect();
            w.next_id = w.next_id.max(first_id(commit.rev + 1));
            if !events.is_empty() {
                w.sent_since_tick = true;
                outgoing.push((id, w.fragment, events));
            }
        }
        for (id, fragment, events) in outgoing {
            self.send_events(id, fragment, events).await?;
        }
        Ok(())
    }

    /// Sends events, split into fragments when the watcher allows it and the
    /// response would be larger than a request may be.
    async fn send_events(&self, id: i64, fragment: bool, events: Vec<Event>) -> Result<(), Gone> {
        let mut resp = self.response(id);
        if !fragment {
            resp.events = events;
            return self.send(resp).await;
        }
        let mut size = 0;
        let mut chunk = Vec::new();
        let total = events.len();
        for (i, ev) in events.into_iter().enumerate() {
            size += ev.encoded_len();
            chunk.push(ev);
            if size >= self.max_response_bytes && i + 1 < total {
                let mut part = resp.clone();
                part.fragment = true;
                part.events = std::mem::take(&mut chunk);
                self.send(part).await?;
                size = 0;
            }
        }
        resp.events = chunk;
        self.send(resp).await
    }

    /// Commits for this stream were dropped (its queue was full, or they
    /// were made without events): everyone re-reads from the log.
    fn fall_behind(&mut self) {
        self.processed = self.commits.level();
        for w in self.watchers.values_mut() {
            w.synced = false;
        }
    }

    fn start_catch_up(&mut self) {
        if self.catching_up.is_some() {
            return;
        }
        let Some((&id, w)) = self.watchers.iter().find(|(_, w)| !w.synced) else {
            return;
        };
        let (range, from, to) = (w.range.clone(), w.next_id, first_id(self.processed + 1));
        let (tx, rx) = oneshot::channel();
        let readers = self.readers.clone();
        tokio::spawn(async move {
            let res = readers
                .run(move |conn| {
                    let snapshot = conn.unchecked_transaction()?;
                    let meta = schema::read_meta(&snapshot)?;
                    if rev_of(from) < meta.compact_rev {
                        return Err(StoreError::Compacted { compact_revision: meta.compact_rev });
                    }
                    read::changes(&snapshot, &range, from, to, CATCH_UP_ROWS, CATCH_UP_BYTES)
                })
                .await;
            let _ = tx.send(res);
        });
        self.catching_up = Some((id, rx));
    }

    async fn finish_catch_up(&mut self, (id, res): (i64, Result<Changes>)) -> Result<(), Gone> {
        let Some(w) = self.watchers.get_mut(&id) else {
            return Ok(());
        };
        match res {
            Ok(changes) => {
                let events: Vec<Event> = changes.events.iter().filter(|ev| w.wants(ev)).map(|ev| w.shape(ev)).collect();
                w.next_id = changes.next_id;
                w.synced = rev_of(w.next_id) > self.processed;
                let fragment = w.fragment;
                if !events.is_empty() {
                    w.sent_since_tick = true;
                    self.send_events(id, fragment, events).await?;
                }
                Ok(())
            }
            Err(StoreError::Compacted { compact_revision }) => self.send_compacted(id, compact_revision).await,
            Err(e) => {
                tracing::warn!(error = %e, watch_id = id, "watch catch-up failed");
                self.watchers.remove(&id);
                self.subscribe_ranges(None);
                let mut resp = self.response(id);
                resp.canceled = true;
                resp.cancel_reason = e.to_string();
                self.send(resp).await
            }
        }
    }

    /// Answers a progress request once every watcher is level with the store,
    /// so that its revision promises nothing older is still on its way.
    async fn finish_progress_request(&mut self) -> Result<(), Gone> {
        if !self.progress_pending || !self.watchers.values().all(|w| w.synced) {
            return Ok(());
        }
        self.catch_level(self.commits.level()).await?;
        if self.watchers.values().all(|w| w.synced) {
            self.progress_pending = false;
            self.send(self.response(-1)).await?;
        }
        Ok(())
    }

    async fn progress_tick(&mut self) -> Result<(), Gone> {
        self.catch_level(self.commits.level()).await?;
        let due: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.progress_notify && w.synced && !w.sent_since_tick)
            .map(|(&id, _)| id)
            .collect();
        for w in self.watchers.values_mut() {
            w.sent_since_tick = false;
        }
        for id in due {
            self.send(self.response(id)).await?;
        }
        Ok(())
    }
}

async fn wait_catch_up(slot: &mut Option<CatchUp>) -> (i64, Result<Changes>) {
    let Some((id, rx)) = slot.as_mut() else {
        return std::future::pending().await;
    };
    let id = *id;
    let res = rx.await.unwrap_or_else(|_| Err(StoreError::Internal("catch-up read was dropped".into())));
    *slot = None;
    (id, res)
}
