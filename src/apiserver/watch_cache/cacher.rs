//! One resource's cache (upstream's Cacher): a reflector lists the
//! resource once and then follows one store watch, keeping the current
//! objects, a window of recent events and the revision it has reached;
//! lists and watches of the resource are served from it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::list_writes::ListWrites;
use super::object::{CachedEvent, CachedObject, EventType, Form, Omit};
use super::snapshot::{Snapshot, SnapshotSlot};
use super::watcher::{Filter, Inbox, Views, Watchers};
use super::window::{TooOld, Window};
use crate::apiserver::selector::selectable_fields::SelectableField;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::storage::{raw, Change, Decoding, Raw, Storage, Stored};

/// How often watchers that allow bookmarks are told how far the cache is
/// (upstream sends one about every minute).
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// The test hook that holds each change back (`Cacher::lag`).
const LAG_VARIABLE: &str = "FERROK_TEST_WATCH_CACHE_LAG_MS";

/// What a resource is, as far as its cache needs to know.
pub struct Shape {
    /// `/registry/<resource>/`: every key of the resource.
    pub prefix: String,
    pub namespaced: bool,
    /// The apiVersion objects are cached in; None: the one each was stored in.
    pub api_version: Option<String>,
    pub kind: String,
    /// A field the cache indexes (pods by spec.nodeName).
    pub index: Option<SelectableField>,
}

pub struct Cacher {
    pub shape: Shape,
    form: Form,
    pub(super) storage: Storage,
    window_size: usize,
    pub(super) state: RwLock<State>,
    /// The cache's revision; 0 while it (re)lists.
    pub(super) rev: watch::Sender<i64>,
    /// Asks the store watch for a progress notification; None while the
    /// cache lists, and for a store that answers such requests out of
    /// order (`Storage::progress_requests_ordered`).
    pub(super) asks: Mutex<Option<mpsc::Sender<()>>>,
    /// How long each change (not a progress notification) waits before
    /// the cache applies it: unset unless `FERROK_TEST_WATCH_CACHE_LAG_MS`
    /// asks, so that tests can hold the cache behind the store, which it
    /// otherwise is for only moments at a time.
    lag: Option<Duration>,
}

pub(super) struct State {
    objects: BTreeMap<String, Arc<CachedObject>>,
    /// Keys by the value of the indexed field.
    by_index: HashMap<String, BTreeSet<String>>,
    /// The objects as one array, for lists.
    snapshot: SnapshotSlot,
    pub(super) rev: i64,
    window: Window,
    watchers: Watchers,
    bookmark_due: bool,
}

impl State {
    /// A bookmark at the cache's revision to the watchers that asked for
    /// one, when one is due.
    fn bookmark_if_due(&mut self) {
        if std::mem::take(&mut self.bookmark_due) {
            let rev = self.rev;
            self.watchers.bookmark(rev);
        }
    }
}

/// Some of the objects, at one revision: positions in a snapshot that
/// the list holds while it is sent.
pub struct Listed {
    objects: Arc<Snapshot>,
    picked: Picked,
    pub rev: i64,
    /// The key the next page starts at.
    pub next_key: Option<Vec<u8>>,
    /// Objects after this page (counted when there are no selectors).
    pub remaining: Option<i64>,
}

/// Which of the snapshot's objects a list has.
enum Picked {
    /// All of one run of them.
    Run(Range<usize>),
    /// Those the selectors admitted.
    At(Vec<u32>),
}

impl Listed {
    pub fn len(&self) -> usize {
        match &self.picked {
            Picked::Run(r) => r.len(),
            Picked::At(at) => at.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The list's `i`-th object.
    pub fn get(&self, i: usize) -> Option<&Arc<CachedObject>> {
        let at = match &self.picked {
            Picked::Run(r) => r.start + i,
            Picked::At(at) => *at.get(i)? as usize,
        };
        self.objects.get(at)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<CachedObject>> {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// The objects' JSON (in the cache's own apiVersion) joined into writes
    /// that other lists of the same run share; None when the selectors
    /// picked some of a run.
    pub fn shared_writes(&self, omit: Omit) -> Option<Arc<ListWrites>> {
        match &self.picked {
            Picked::Run(r) => Some(self.objects.list_writes(r.clone(), omit)),
            Picked::At(_) => None,
        }
    }
}

/// Where the next page starts: just after `obj`'s key.
fn key_after(obj: &CachedObject) -> Vec<u8> {
    let mut k = obj.key.clone().into_bytes();
    k.push(0);
    k
}

/// Where a watch starts.
pub enum StartAt {
    /// The current objects first, as ADDED events.
    Now,
    /// The events after this revision.
    Rev(i64),
}

/// A watch as registered: what to send first, from which revision on, and
/// the inbox of everything after.
pub struct Registered {
    pub initial: Vec<Arc<CachedObject>>,
    pub replay: Vec<(EventType, Arc<CachedEvent>)>,
    pub rev: i64,
    pub inbox: Inbox,
}

/// Why a watch could not be registered.
pub enum NotServed {
    /// Older than the window (after events left it).
    TooOld(TooOld),
    /// Older than the cache, which has not dropped any event yet: the
    /// revision is from before the cache began (it was created lazily, or
    /// the server restarted), and the store may still have it.
    BeforeCache,
}

impl Cacher {
    /// A cache for `shape`; it lists and starts watching at once.
    pub fn start(storage: Storage, shape: Shape, window_size: usize) -> Arc<Cacher> {
        let form = Form::of(shape.api_version.as_deref(), &shape.kind, shape.index);
        let cacher = Arc::new(Cacher {
            form,
            state: RwLock::new(State {
                objects: BTreeMap::new(),
                by_index: HashMap::new(),
                snapshot: SnapshotSlot::default(),
                rev: 0,
                window: Window::new(window_size, 0),
                watchers: Watchers::default(),
                bookmark_due: false,
            }),
            shape,
            storage,
            window_size,
            rev: watch::channel(0).0,
            asks: Mutex::new(None),
            lag: std::env::var(LAG_VARIABLE).ok().and_then(|v| v.parse().ok()).map(Duration::from_millis),
        });
        tokio::spawn(cacher.clone().reflect());
        cacher
    }

    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read_locked()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write_locked()
    }

    /// Lists and watches for as long as the server runs; when the store
    /// watch ends (compaction past it, a restored store, an etcd restart),
    /// the watchers are ended and the cache lists again.
    async fn reflect(self: Arc<Self>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.list_and_watch().await {
                Ok(()) => tracing::info!(prefix = %self.shape.prefix, "watch cache: the store watch ended; relisting"),
                Err(e) => {
                    tracing::warn!(prefix = %self.shape.prefix, error = %e, "watch cache: relisting")
                }
            }
            self.invalidate();
            tokio::time::sleep(backoff).await;
            backoff = crate::backoff::doubled(backoff, Duration::from_secs(5));
        }
    }

    /// Nothing is served until the cache has listed again.
    fn invalidate(&self) {
        let mut st = self.write();
        st.watchers.end_all();
        self.rev.send_replace(0);
        *self.asks.locked() = None;
    }

    async fn list_and_watch(&self) -> ApiResult<()> {
        let (items, rev) = self.storage.list_all_parsed(&self.shape.prefix, raw).await?;
        let ordered = self.storage.progress_requests_ordered().await;
        // `ask` lives as long as this watch: dropping it would end it.
        let (ask, asks) = mpsc::channel(1);
        let changes =
            self.storage.watch_asking_progress(&self.shape.prefix, false, rev, asks, Decoding::projected(raw)).await?;
        let items = items.into_iter().map(|s| self.cached(s)).collect::<ApiResult<Vec<_>>>()?;
        {
            let mut st = self.write();
            st.objects.clear();
            st.by_index.clear();
            st.snapshot.clear();
            for obj in items {
                let obj = Arc::new(obj);
                if let Some(v) = &obj.index {
                    st.by_index.entry(v.to_string()).or_default().insert(obj.key.clone());
                }
                st.objects.insert(obj.key.clone(), obj);
            }
            st.rev = rev;
            st.window = Window::new(self.window_size, rev);
            st.watchers.end_all();
        }
        *self.asks.locked() = ordered.then(|| ask.clone());
        self.rev.send_replace(rev.max(1));
        tracing::debug!(prefix = %self.shape.prefix, revision = rev, "watch cache: listed");
        let mut changes = std::pin::pin!(changes);
        let mut tick = tokio::time::interval(BOOKMARK_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                change = changes.next() => match change {
                    None => return Ok(()),
                    Some(Err(e)) => return Err(e),
                    Some(Ok(change)) => {
                        if let Some(lag) = self.lag.filter(|_| !matches!(change, Change::Progress(_))) {
                            tokio::time::sleep(lag).await;
                        }
                        self.apply(change)?
                    }
                },
                _ = tick.tick() => {
                    let due = {
                        let mut st = self.write();
                        st.bookmark_due = st.watchers.any_bookmarks();
                        st.bookmark_due
                    };
                    if due && !self.ask_progress() {
                        // Bookmarks at what the cache has seen, without asking.
                        self.write().bookmark_if_due();
                    }
                }
            }
        }
    }

    /// Asks the store watch to confirm how far it is (a progress notify);
    /// false when it cannot be asked.
    pub(super) fn ask_progress(&self) -> bool {
        match self.asks.locked().as_ref() {
            Some(ask) => {
                // Full: an ask is on its way already.
                let _ = ask.try_send(());
                true
            }
            None => false,
        }
    }

    fn key_of(&self, obj: &Value) -> String {
        let meta = obj.get("metadata");
        let field = |f: &str| meta.and_then(|m| m.get(f)).and_then(Value::as_str).unwrap_or_default();
        if self.shape.namespaced {
            format!("{}{}/{}", self.shape.prefix, field("namespace"), field("name"))
        } else {
            format!("{}{}", self.shape.prefix, field("name"))
        }
    }

    /// A stored object as the cache holds it.
    fn cached(&self, s: Stored<Raw>) -> ApiResult<CachedObject> {
        CachedObject::from_stored(&s.object.0, s.rev, &self.form, |o| self.key_of(o)).map_err(|e| {
            ApiError::internal(format!("an object under {} at revision {} is not JSON: {e}", self.shape.prefix, s.rev))
        })
    }

    /// One change from the store: into the objects, the window and every
    /// watcher that sees it, encoded once for all.
    fn apply(&self, change: Change<Raw>) -> ApiResult<()> {
        let (kind, new) = match change {
            Change::Progress(rev) => {
                let mut st = self.write();
                if rev > st.rev {
                    st.rev = rev;
                }
                st.bookmark_if_due();
                let rev = st.rev;
                drop(st);
                self.rev.send_replace(rev);
                return Ok(());
            }
            Change::Added(s) => (EventType::Added, s),
            Change::Modified { new, .. } => (EventType::Modified, new),
            Change::Deleted(s) => (EventType::Deleted, s),
        };
        let rev = new.rev;
        let object = Arc::new(self.cached(new)?);
        let mut st = self.write();
        if rev < st.rev {
            return Ok(());
        }
        let prev = match kind {
            EventType::Deleted => st.objects.remove(&object.key),
            _ => st.objects.insert(object.key.clone(), object.clone()),
        };
        st.snapshot.follow(kind, &object);
        if let Some(p) = &prev {
            if let Some(v) = &p.index {
                if let Some(keys) = st.by_index.get_mut(&**v) {
                    keys.remove(&p.key);
                    if keys.is_empty() {
                        st.by_index.remove(&**v);
                    }
                }
            }
        }
        if kind != EventType::Deleted {
            if let Some(v) = &object.index {
                st.by_index.entry(v.to_string()).or_default().insert(object.key.clone());
            }
        }
        let event = Arc::new(CachedEvent::new(kind, object, prev));
        st.window.push(event.clone());
        st.rev = rev;
        st.watchers.dispatch(&event);
        drop(st);
        self.rev.send_replace(rev);
        Ok(())
    }

    /// The objects under `key_prefix` that `filter` admits, in key order,
    /// from `start` on, at most `limit` (0: all).
    pub fn list(&self, filter: &Filter, start: Option<&[u8]>, limit: usize) -> Listed {
        let from = start.map(|s| String::from_utf8_lossy(s).into_owned()).unwrap_or_default().max(filter.key.clone());
        let (objects, scope, rev) = {
            let st = self.read();
            match &filter.trigger {
                Some(v) => {
                    let objs: Vec<Arc<CachedObject>> = st
                        .by_index
                        .get(v)
                        .map(|keys| {
                            keys.range(from.clone()..)
                                .filter(|k| k.starts_with(&filter.key))
                                .filter_map(|k| st.objects.get(k).cloned())
                                .collect()
                        })
                        .unwrap_or_default();
                    let n = objs.len();
                    (Arc::new(Snapshot::of(objs)), 0..n, st.rev)
                }
                None => {
                    let (objects, scope) = st.snapshot.for_list(&st.objects, &filter.key, &from);
                    (objects, scope, st.rev)
                }
            }
        };
        // The selectors run on the snapshot, with the cache free to change.
        let (mut next_key, mut remaining) = (None, None);
        let picked = if filter.predicate.is_none() && !filter.exact {
            let end = if limit > 0 { scope.start + limit.min(scope.len()) } else { scope.end };
            if end < scope.end {
                next_key = objects.get(end - 1).map(|o| key_after(o));
                remaining = Some((scope.end - end) as i64);
            }
            Picked::Run(scope.start..end)
        } else {
            let mut at = Vec::new();
            for i in scope.clone() {
                let Some(obj) = objects.get(i) else { break };
                if !filter.admits_in_scope(obj) {
                    continue;
                }
                at.push(i as u32);
                if limit > 0 && at.len() >= limit {
                    let left = scope.end - i - 1;
                    if left > 0 {
                        next_key = Some(key_after(obj));
                        remaining = filter.predicate.is_none().then_some(left as i64);
                    }
                    break;
                }
            }
            Picked::At(at)
        };
        Listed { objects, picked, rev, next_key, remaining }
    }

    /// Registers a watcher: under the cache's lock, so that what it is sent
    /// first and what it is sent after follow each other with no gap and no
    /// repeat.
    pub fn watch(&self, from: StartAt, filter: Filter, bookmarks: bool) -> Result<Registered, NotServed> {
        let mut st = self.write();
        let (initial, replay, rev) = match from {
            StartAt::Now => {
                let listed = {
                    let objs: Vec<Arc<CachedObject>> = match (&filter.trigger, filter.exact) {
                        (_, true) => st.objects.get(&filter.key).cloned().into_iter().collect(),
                        (Some(v), false) => st
                            .by_index
                            .get(v)
                            .map(|keys| keys.iter().filter_map(|k| st.objects.get(k).cloned()).collect())
                            .unwrap_or_default(),
                        (None, false) => st
                            .objects
                            .range(filter.key.clone()..)
                            .take_while(|(k, _)| k.starts_with(&filter.key))
                            .map(|(_, o)| o.clone())
                            .collect(),
                    };
                    objs.into_iter().filter(|o| filter.admits(o)).collect()
                };
                (listed, Vec::new(), st.rev)
            }
            StartAt::Rev(rev) => match st.window.since(rev) {
                Ok(events) => {
                    let replay =
                        events.into_iter().filter_map(|e| filter.sees(&Views::of(&e)).map(|t| (t, e))).collect();
                    (Vec::new(), replay, rev)
                }
                Err(_) if !st.window.trimmed() => return Err(NotServed::BeforeCache),
                Err(too_old) => return Err(NotServed::TooOld(too_old)),
            },
        };
        let inbox = st.watchers.add(filter, bookmarks);
        Ok(Registered { initial, replay, rev, inbox })
    }

    /// The object at `key` as the cache holds it; None when the cache has
    /// not listed yet or holds no such object.
    pub fn get(&self, key: &str) -> Option<Arc<CachedObject>> {
        if *self.rev.borrow() == 0 {
            return None;
        }
        self.read().objects.get(key).cloned()
    }

    /// How many objects and watchers the cache holds (for logs and tests).
    pub fn sizes(&self) -> (usize, usize, usize) {
        let st = self.read();
        (st.objects.len(), st.window.len(), st.watchers.len())
    }
}

/// The error upstream's cache answers a watch from a revision it no longer
/// holds with.
pub fn too_old(rev: i64, t: TooOld) -> ApiError {
    ApiError::gone(format!("too old resource version: {rev} ({})", t.oldest))
}
use crate::sync::LockExt;
use crate::sync::RwLockExt;
