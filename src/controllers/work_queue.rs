//! The controllers' work queue, as client-go's `workqueue` keeps it: keys
//! (`namespace/name`), each queued at most once, never synced twice at the
//! same time (a key asked for while its sync runs waits for it to end),
//! with delayed requeues of which the earliest wins.
//!
//! It replaces kube-runtime's `Controller` and `applier`, whose scheduler,
//! runner and stream adapters are built again for every kind they drive
//! (about 0.8 MB of the binary for ferrok's controllers). Here only the
//! small parts that know the kind are generic: turning watched objects into
//! keys and a key back into the cached object. The queue and the loop that
//! runs syncs are written once.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, FuturesUnordered};
use futures_util::{FutureExt, Stream, StreamExt};
use kube::runtime::controller::ReconcileRequest;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;
use tokio::time::Instant;

/// What a sync asks of the queue when it ends: nothing until the object
/// changes, or another sync after a while (kube-runtime's `Action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Sync again after `duration` (sooner if the object changes).
    pub const fn requeue(duration: Duration) -> Action {
        Action { requeue_after: Some(duration) }
    }

    /// Sync again only when the object (or what maps to it) changes.
    pub const fn await_change() -> Action {
        Action { requeue_after: None }
    }

    /// When to sync again without a change.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// client-go's key of an object: `namespace/name`, or `name`.
pub fn key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

fn key_of_ref<K: Resource>(r: &ObjectRef<K>) -> String {
    key(r.namespace.as_deref(), &r.name)
}

fn ref_of_key<K: Resource<DynamicType = ()>>(key: &str) -> ObjectRef<K> {
    match key.split_once('/') {
        Some((ns, name)) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(key),
    }
}

/// The keys waiting, due or running. Time comes in from the caller, so
/// the rules are tested without a clock.
#[derive(Default)]
struct Queue {
    /// Due keys in the order they became due (each once: `queued`).
    ready: VecDeque<String>,
    queued: HashSet<String>,
    /// Keys whose sync runs now.
    running: HashSet<String>,
    /// Running keys asked for again: due as soon as their sync ends.
    held: HashSet<String>,
    /// Keys due later, and when.
    later: HashMap<String, Instant>,
    timers: BTreeSet<(Instant, String)>,
}

impl Queue {
    /// Asks for a sync of `key` at `at`; the earliest request wins.
    fn add(&mut self, key: String, at: Instant, now: Instant) {
        if at <= now {
            return self.make_due(key);
        }
        if self.queued.contains(&key) || self.held.contains(&key) {
            return;
        }
        match self.later.get(&key) {
            Some(when) if *when <= at => return,
            Some(when) => {
                self.timers.remove(&(*when, key.clone()));
            }
            None => {}
        }
        self.timers.insert((at, key.clone()));
        self.later.insert(key, at);
    }

    fn make_due(&mut self, key: String) {
        if let Some(when) = self.later.remove(&key) {
            self.timers.remove(&(when, key.clone()));
        }
        if self.running.contains(&key) {
            self.held.insert(key);
        } else if self.queued.insert(key.clone()) {
            self.ready.push_back(key);
        }
    }

    /// Makes due every key whose time has come.
    fn fire(&mut self, now: Instant) {
        while let Some((when, _)) = self.timers.first() {
            if *when > now {
                break;
            }
            if let Some((_, key)) = self.timers.pop_first() {
                self.later.remove(&key);
                self.make_due(key);
            }
        }
    }

    /// When the next later key is due.
    fn next_timer(&self) -> Option<Instant> {
        self.timers.first().map(|(when, _)| *when)
    }

    /// The next due key, now running.
    fn pop(&mut self) -> Option<String> {
        let key = self.ready.pop_front()?;
        self.queued.remove(&key);
        self.running.insert(key.clone());
        Some(key)
    }

    /// The sync of `key` ended; asks for another at `again` if it wants one.
    fn done(&mut self, key: String, again: Option<Instant>, now: Instant) {
        self.running.remove(&key);
        if self.held.remove(&key) {
            self.make_due(key);
        } else if let Some(at) = again {
            self.add(key, at, now);
        }
    }
}

/// The sync of one key: None when the cache does not hold its object (the
/// request is dropped, as kube-runtime's applier drops it); else the sync,
/// which ends with when to sync again.
type SyncKey = Box<dyn FnMut(&str) -> Option<BoxFuture<'static, Option<Duration>>> + Send>;

/// Runs syncs for the keys `requests` asks for, once `ready` (the cache's
/// first list) has come, until the requests end and the last sync is done.
async fn drive(requests: BoxStream<'static, String>, ready: BoxFuture<'static, ()>, mut sync: SyncKey) {
    let mut queue = Queue::default();
    let mut requests = requests.fuse();
    let mut ready = ready.fuse();
    let mut is_ready = false;
    let mut running = FuturesUnordered::new();
    let mut open = true;
    loop {
        if is_ready {
            while let Some(key) = queue.pop() {
                match sync(&key) {
                    Some(work) => running.push(work.map(move |again| (key, again))),
                    None => queue.done(key, None, Instant::now()),
                }
            }
        }
        if !open && running.is_empty() {
            return;
        }
        let timer = queue.next_timer();
        tokio::select! {
            key = requests.next(), if open => match key {
                Some(key) => queue.add(key, Instant::now(), Instant::now()),
                None => open = false,
            },
            () = &mut ready, if !is_ready => is_ready = true,
            Some((key, again)) = running.next(), if !running.is_empty() => {
                let now = Instant::now();
                queue.done(key, again.map(|d| now + d), now);
            }
            () = tokio::time::sleep_until(timer.unwrap_or_else(Instant::now)), if timer.is_some() => {
                queue.fire(Instant::now());
            }
        }
    }
}

/// A controller of kind `K`: what asks for syncs of its objects, and the
/// cache they are read from (the subset of kube-runtime's `Controller`
/// that ferrok's controllers use).
pub struct Controller<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    requests: Vec<BoxStream<'static, String>>,
}

impl<K> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// Syncs each object `objects` brings (the controller's own watch).
    pub fn for_stream<E>(objects: impl Stream<Item = Result<K, E>> + Send + 'static, store: Store<K>) -> Self {
        let keys =
            objects.filter_map(|o| std::future::ready(o.ok().map(|o| key(o.meta().namespace.as_deref(), name(&o)))));
        Controller { store, requests: vec![keys.boxed()] }
    }

    /// `for_stream` of a stream of cached objects.
    pub fn for_shared_stream(objects: impl Stream<Item = Arc<K>> + Send + 'static, store: Store<K>) -> Self {
        let keys = objects.map(|o| key(o.meta().namespace.as_deref(), name(&*o)));
        Controller { store, requests: vec![keys.boxed()] }
    }

    /// Syncs the objects `map` names for each object of another kind.
    pub fn watches_stream<Other, E, I>(
        mut self,
        objects: impl Stream<Item = Result<Other, E>> + Send + 'static,
        map: impl Fn(Other) -> I + Send + 'static,
    ) -> Self
    where
        Other: Send + 'static,
        E: Send + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let keys = objects
            .filter_map(|o| std::future::ready(o.ok()))
            .flat_map(move |o| stream::iter(map(o).into_iter().map(|r| key_of_ref(&r)).collect::<Vec<_>>()));
        self.requests.push(keys.boxed());
        self
    }

    /// `watches_stream` of a stream of cached objects.
    pub fn watches_shared_stream<Other, I>(
        mut self,
        objects: impl Stream<Item = Arc<Other>> + Send + 'static,
        map: impl Fn(Arc<Other>) -> I + Send + 'static,
    ) -> Self
    where
        Other: Send + Sync + 'static,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let keys =
            objects.flat_map(move |o| stream::iter(map(o).into_iter().map(|r| key_of_ref(&r)).collect::<Vec<_>>()));
        self.requests.push(keys.boxed());
        self
    }

    /// Syncs each object `refs` names.
    pub fn reconcile_on(mut self, refs: impl Stream<Item = ObjectRef<K>> + Send + 'static) -> Self {
        self.requests.push(refs.map(|r| key_of_ref(&r)).boxed());
        self
    }

    /// Runs `reconcile` for each key asked for, `error_policy` saying when
    /// to retry a failed one. The stream ends with the requests, and
    /// yields nothing (it is what `drain` waits on).
    pub fn run<Ctx, E, Fut>(
        self,
        reconcile: impl FnMut(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
        error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
        ctx: Arc<Ctx>,
    ) -> impl Stream<Item = Result<(), Infallible>> + Send
    where
        Ctx: Send + Sync + 'static,
        E: Send + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let requests = stream::select_all(self.requests).boxed();
        stream::once(drive(requests, ready(&self.store), sync_key(self.store, reconcile, error_policy, ctx))).map(Ok)
    }
}

fn name<K: Resource>(o: &K) -> &str {
    o.meta().name.as_deref().unwrap_or_default()
}

/// A future that ends when `store` has its first list.
fn ready<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static>(store: &Store<K>) -> BoxFuture<'static, ()> {
    let store = store.clone();
    async move {
        // A dropped writer is a stopped informer: nothing would ever sync.
        if store.wait_until_ready().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
    .boxed()
}

fn sync_key<K, Ctx, E, Fut>(
    store: Store<K>,
    mut reconcile: impl FnMut(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
    error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
    ctx: Arc<Ctx>,
) -> SyncKey
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let error_policy = Arc::new(error_policy);
    Box::new(move |key: &str| {
        let object = store.get(&ref_of_key::<K>(key))?;
        let sync = reconcile(object.clone(), ctx.clone());
        let (error_policy, ctx) = (error_policy.clone(), ctx.clone());
        Some(
            async move {
                match sync.await {
                    Ok(action) => action.requeue_after(),
                    Err(e) => error_policy(object, &e, ctx).requeue_after(),
                }
            }
            .boxed(),
        )
    })
}

/// Runs `reconcile` over the requests made (kube-runtime's `applier`).
pub fn applier<K, Ctx, E, Fut, QE>(
    reconcile: impl FnMut(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
    error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
    ctx: Arc<Ctx>,
    store: Store<K>,
    requests: impl Stream<Item = Result<ReconcileRequest<K>, QE>> + Send + 'static,
) -> impl Stream<Item = Result<(), Infallible>> + Send
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let keys = requests.filter_map(|r| std::future::ready(r.ok().map(|r| key_of_ref(&r.obj_ref)))).boxed();
    stream::once(drive(keys, ready(&store), sync_key(store, reconcile, error_policy, ctx))).map(Ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::LockExt;

    fn at(start: Instant, secs: u64) -> Instant {
        start + Duration::from_secs(secs)
    }

    #[test]
    fn a_key_is_queued_once_and_never_runs_twice_at_a_time() {
        let now = Instant::now();
        let mut q = Queue::default();
        q.add("a".into(), now, now);
        q.add("b".into(), now, now);
        q.add("a".into(), now, now);
        assert_eq!(q.pop().as_deref(), Some("a"));
        // Asked for while running: held, not handed out again.
        q.add("a".into(), now, now);
        assert_eq!(q.pop().as_deref(), Some("b"));
        assert_eq!(q.pop(), None);
        // Its sync ends: due again, once, even with a requeue asked for.
        q.done("a".into(), Some(at(now, 60)), now);
        assert_eq!(q.pop().as_deref(), Some("a"));
        assert_eq!(q.next_timer(), None);
    }

    #[test]
    fn the_earliest_requeue_wins_and_a_change_comes_before_it() {
        let now = Instant::now();
        let mut q = Queue::default();
        q.add("a".into(), at(now, 30), now);
        q.add("a".into(), at(now, 10), now);
        q.add("a".into(), at(now, 20), now);
        assert_eq!(q.next_timer(), Some(at(now, 10)));
        q.fire(at(now, 9));
        assert_eq!(q.pop(), None);
        q.fire(at(now, 10));
        assert_eq!(q.pop().as_deref(), Some("a"));
        q.done("a".into(), Some(at(now, 100)), at(now, 10));
        // A change asks for it now: the timer is dropped, one sync runs.
        q.add("a".into(), at(now, 11), at(now, 11));
        assert_eq!(q.next_timer(), None);
        assert_eq!(q.pop().as_deref(), Some("a"));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn keys_round_trip_to_object_refs() {
        use k8s_openapi::api::core::v1::{ConfigMap, Node};
        assert_eq!(key(Some("ns"), "a"), "ns/a");
        assert_eq!(key(None, "a"), "a");
        let r = ref_of_key::<ConfigMap>("ns/a");
        assert_eq!((r.namespace.as_deref(), r.name.as_str()), (Some("ns"), "a"));
        let r = ref_of_key::<Node>("n1");
        assert_eq!((r.namespace, r.name.as_str()), (None, "n1"));
    }

    /// Waits until `done`, failing with `what` after 10 s.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn syncs_wait_for_the_cache_run_each_object_and_requeue() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::reflector;
        use kube::runtime::watcher::Event;
        use std::sync::Mutex;

        let cm = |name: &str| ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<ConfigMap, Infallible>>();
        let requests = stream::poll_fn(move |cx| rx.poll_recv(cx));
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let record = seen.clone();
        let controller = Controller::for_stream(requests, store).run(
            move |o: Arc<ConfigMap>, _ctx: Arc<()>| {
                let record = record.clone();
                async move {
                    let name = o.metadata.name.clone().unwrap_or_default();
                    record.locked().push(name.clone());
                    match name.as_str() {
                        "again" => Ok(Action::requeue(Duration::from_millis(50))),
                        "fails" => Err(()),
                        _ => Ok(Action::await_change()),
                    }
                }
            },
            |_, _: &(), _| Action::requeue(Duration::from_millis(300)),
            Arc::new(()),
        );
        let task = tokio::spawn(controller.for_each(|_| std::future::ready(())));
        for name in ["a", "again", "fails", "gone"] {
            tx.send(Ok(cm(name))).expect("send");
        }
        let count = |name: &str| seen.locked().iter().filter(|n| *n == name).count();
        // Nothing can sync before the cache's first list (a wait for an
        // absence: the requests are in, the loop is idle).
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(seen.locked().len(), 0, "no sync before the first list");
        writer.apply_watcher_event(&Event::Init);
        for name in ["a", "again", "fails"] {
            writer.apply_watcher_event(&Event::InitApply(cm(name)));
        }
        writer.apply_watcher_event(&Event::InitDone);
        until("requeued every 50 ms", || count("again") >= 4).await;
        until("the error policy's retry", || count("fails") >= 2).await;
        assert_eq!((count("a"), count("gone")), (1, 0), "one sync per change; an uncached object none");
        // The requests end: so does the controller, requeues pending or not
        // (as kube-runtime's applier shuts down).
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("ends").expect("no panic");
    }
}
