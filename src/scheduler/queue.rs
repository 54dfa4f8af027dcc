//! The scheduling queue, as upstream's PriorityQueue: an active queue
//! ordered by priority then age; a backoff queue for pods that failed
//! recently (1 s doubling to 10 s), from which the next pod is taken early
//! when nothing else is active (upstream's SchedulerPopFromBackoffQ, KEP
//! 5142; pods that failed with an error wait out their backoff); and the
//! unschedulable pods, each remembering the plugins that rejected it, which
//! a cluster event moves only when those plugins' queueing hints say it may
//! help (or after five minutes). Nothing here polls: `pop` sleeps until a
//! pod is added or the next backoff or flush deadline.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::sync::LockExt;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::framework::{EventKind, EVENT_KINDS};
use super::node_info::PodInfo;

const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
const MAX_UNSCHEDULABLE: Duration = Duration::from_secs(300);
/// How often the unschedulable pods are looked at for the five-minute
/// flush (upstream's 30 s), rather than at every pop.
const FLUSH_INTERVAL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Active,
    Backoff,
    Unschedulable,
    InFlight,
}

struct Queued {
    info: Arc<PodInfo>,
    place: Place,
    attempts: u32,
    /// When it was first queued (orders pods of equal priority).
    seq: u64,
    backoff_until: Instant,
    unschedulable_since: Instant,
    /// The pod changed while it was being scheduled.
    updated_in_flight: bool,
    /// The filter plugins that rejected it in its last cycle (empty: none
    /// did, as when there was no node at all).
    rejected_by: Vec<&'static str>,
}

/// Max-heap entry: higher priority first, then the older pod.
#[derive(PartialEq, Eq)]
struct ActiveEntry {
    priority: i32,
    seq: u64,
    uid: String,
}

impl Ord for ActiveEntry {
    fn cmp(&self, o: &Self) -> Ordering {
        self.priority.cmp(&o.priority).then_with(|| o.seq.cmp(&self.seq))
    }
}
impl PartialOrd for ActiveEntry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

type BackoffHeap = BinaryHeap<Reverse<(Instant, String)>>;

struct Inner {
    pods: HashMap<String, Queued>,
    active: BinaryHeap<ActiveEntry>,
    /// Pods that fit nowhere and were moved by an event before their
    /// backoff ended; taken early when nothing is active.
    backoff: BackoffHeap,
    /// Pods whose cycle or binding failed with an error.
    error_backoff: BackoffHeap,
    /// Pods with `status.nominatedNodeName` set.
    nominated: HashSet<String>,
    /// The pods in `Place::Unschedulable` (events look only at these).
    unschedulable: HashSet<String>,
    next_seq: u64,
    /// Counts pops; an event during a pod's cycle that may help it sends it
    /// to backoff rather than to the unschedulable pods.
    cycle: u64,
    /// The cycle at which each kind of cluster event last happened.
    event_cycle: [u64; EVENT_KINDS],
    next_flush: Instant,
}

pub struct SchedulingQueue {
    inner: Mutex<Inner>,
    wake: Notify,
}

/// A pod's back-off after `attempts` tries: 1 s doubling to 10 s.
fn backoff_for(attempts: u32) -> Duration {
    crate::backoff::exponential(INITIAL_BACKOFF, MAX_BACKOFF, attempts.saturating_sub(1))
}

fn nominated_node(info: &PodInfo) -> Option<&str> {
    info.pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).filter(|n| !n.is_empty())
}

/// Whether an update of a pod can change where it fits: a change of its
/// labels, annotations or spec (its status, written by the scheduler
/// itself after a failure, cannot), as upstream's isPodUpdated.
fn scheduling_properties_changed(old: &PodInfo, new: &PodInfo) -> bool {
    let (old, new) = (&old.pod, &new.pod);
    old.metadata.labels != new.metadata.labels
        || old.metadata.annotations != new.metadata.annotations
        || old.spec != new.spec
}

impl Default for SchedulingQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl SchedulingQueue {
    pub fn new() -> Self {
        let inner = Inner {
            pods: HashMap::new(),
            active: BinaryHeap::new(),
            backoff: BinaryHeap::new(),
            error_backoff: BinaryHeap::new(),
            nominated: HashSet::new(),
            unschedulable: HashSet::new(),
            next_seq: 0,
            cycle: 0,
            event_cycle: [0; EVENT_KINDS],
            next_flush: Instant::now() + FLUSH_INTERVAL,
        };
        SchedulingQueue { inner: Mutex::new(inner), wake: Notify::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// A pod that needs a node was added or changed.
    pub fn add_or_update(&self, info: Arc<PodInfo>) {
        let mut q = self.lock();
        let inner = &mut *q;
        let now = Instant::now();
        if nominated_node(&info).is_some() {
            inner.nominated.insert(info.uid.clone());
        } else {
            inner.nominated.remove(&info.uid);
        }
        match inner.pods.get_mut(&info.uid) {
            Some(queued) => {
                let changed = scheduling_properties_changed(&queued.info, &info);
                queued.info = info;
                if !changed {
                    return;
                }
                match queued.place {
                    Place::InFlight => queued.updated_in_flight = true,
                    // A change to the pod may make it fit: try it again,
                    // once its backoff is over (upstream's Update): a pod
                    // updated often is not retried, nor its failure
                    // reported, at every update.
                    Place::Unschedulable => {
                        inner.unschedulable.remove(&queued.info.uid);
                        requeue(queued, &mut inner.active, &mut inner.backoff, now);
                        self.wake.notify_one();
                    }
                    Place::Active | Place::Backoff => {}
                }
            }
            None => {
                let seq = inner.next_seq;
                inner.next_seq += 1;
                inner.active.push(ActiveEntry { priority: info.priority, seq, uid: info.uid.clone() });
                inner.pods.insert(
                    info.uid.clone(),
                    Queued {
                        info,
                        place: Place::Active,
                        attempts: 0,
                        seq,
                        backoff_until: now,
                        unschedulable_since: now,
                        updated_in_flight: false,
                        rejected_by: Vec::new(),
                    },
                );
                self.wake.notify_one();
            }
        }
    }

    /// The pod is gone or has a node; forget it.
    pub fn delete(&self, uid: &str) {
        let mut q = self.lock();
        q.pods.remove(uid);
        q.nominated.remove(uid);
        q.unschedulable.remove(uid);
    }

    pub fn len(&self) -> usize {
        self.lock().pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pods waiting with `status.nominatedNodeName` set (preemptors whose
    /// victims are leaving), by node; pods being scheduled or bound are not.
    pub fn nominated_pods(&self) -> HashMap<String, Vec<Arc<PodInfo>>> {
        let mut out: HashMap<String, Vec<Arc<PodInfo>>> = HashMap::new();
        let q = self.lock();
        for q in q.nominated.iter().filter_map(|uid| q.pods.get(uid)).filter(|q| q.place != Place::InFlight) {
            if let Some(node) = nominated_node(&q.info) {
                out.entry(node.to_string()).or_default().push(q.info.clone());
            }
        }
        out
    }

    /// Waits for the next pod to schedule; returns it with the cycle number.
    pub async fn pop(&self) -> (Arc<PodInfo>, u64) {
        loop {
            let next_deadline = {
                let mut q = self.lock();
                let inner = &mut *q;
                let now = Instant::now();
                flush_backoff(inner, now);
                if now >= inner.next_flush {
                    flush_unschedulable(inner, now);
                    inner.next_flush = now + FLUSH_INTERVAL;
                }
                if let Some(popped) = pop_active(inner) {
                    return popped;
                }
                // Nothing active: the pod whose backoff ends first goes now.
                if let Some(popped) = pop_backoff_early(inner) {
                    return popped;
                }
                let backoff = inner.error_backoff.peek().map(|Reverse((t, _))| *t);
                let flush = (!inner.unschedulable.is_empty()).then_some(inner.next_flush);
                backoff.into_iter().chain(flush).min()
            };
            match next_deadline {
                Some(at) => {
                    let _ = tokio::time::timeout_at(at.into(), self.wake.notified()).await;
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// The pod was bound (or handed to the binder): it leaves the queue.
    pub fn done(&self, uid: &str) {
        self.delete(uid);
    }

    /// The pod fit nowhere in cycle `cycle`, rejected by the plugins
    /// `rejected_by`. It waits among the unschedulable pods, unless an event
    /// of a kind in `registered` (those plugins may be helped by it)
    /// happened meanwhile, or the pod itself changed: then it is retried
    /// after its backoff.
    pub fn unschedulable(
        &self,
        uid: &str,
        cycle: u64,
        rejected_by: Vec<&'static str>,
        registered: [bool; EVENT_KINDS],
    ) {
        let mut q = self.lock();
        let moved = q.event_cycle.iter().zip(registered).any(|(at, r)| r && *at >= cycle);
        let now = Instant::now();
        let inner = &mut *q;
        let Some(queued) = inner.pods.get_mut(uid) else { return };
        queued.attempts += 1;
        queued.rejected_by = rejected_by;
        queued.backoff_until = now + backoff_for(queued.attempts);
        if moved || queued.updated_in_flight {
            queued.place = Place::Backoff;
            inner.backoff.push(Reverse((queued.backoff_until, uid.to_string())));
            self.wake.notify_one();
        } else {
            queued.place = Place::Unschedulable;
            queued.unschedulable_since = now;
            inner.unschedulable.insert(uid.to_string());
        }
    }

    /// Scheduling or binding failed for another reason: retry after backoff.
    pub fn retry(&self, uid: &str) {
        let mut q = self.lock();
        let now = Instant::now();
        let inner = &mut *q;
        let Some(queued) = inner.pods.get_mut(uid) else { return };
        queued.attempts += 1;
        queued.place = Place::Backoff;
        queued.backoff_until = now + backoff_for(queued.attempts);
        inner.error_backoff.push(Reverse((queued.backoff_until, uid.to_string())));
        self.wake.notify_one();
    }

    /// A cluster event of `kind` happened: every unschedulable pod for which
    /// `may_help(pod, rejected_by)` holds (its rejecting plugins' queueing
    /// hints) moves to the active queue, or to backoff if it failed very
    /// recently. Returns how many moved to each (active, backoff).
    pub fn on_event(&self, kind: EventKind, may_help: impl Fn(&PodInfo, &[&'static str]) -> bool) -> (u64, u64) {
        let mut q = self.lock();
        let inner = &mut *q;
        inner.event_cycle[kind as usize] = inner.cycle;
        let now = Instant::now();
        let Inner { pods, unschedulable, active, backoff, .. } = inner;
        let (mut to_active, mut to_backoff) = (0, 0);
        unschedulable.retain(|uid| {
            let Some(queued) = pods.get_mut(uid) else { return false };
            if !may_help(&queued.info, &queued.rejected_by) {
                return true;
            }
            match requeue(queued, active, backoff, now) {
                Place::Backoff => to_backoff += 1,
                _ => to_active += 1,
            }
            false
        });
        if to_active + to_backoff > 0 {
            self.wake.notify_one();
        }
        (to_active, to_backoff)
    }
}

/// Moves an unschedulable pod to backoff while its backoff lasts, else to
/// the active queue; returns where it went.
fn requeue(
    queued: &mut Queued,
    active: &mut BinaryHeap<ActiveEntry>,
    backoff: &mut BackoffHeap,
    now: Instant,
) -> Place {
    let uid = queued.info.uid.clone();
    if queued.backoff_until > now {
        queued.place = Place::Backoff;
        backoff.push(Reverse((queued.backoff_until, uid)));
    } else {
        queued.place = Place::Active;
        active.push(ActiveEntry { priority: queued.info.priority, seq: queued.seq, uid });
    }
    queued.place
}

fn pop_active(inner: &mut Inner) -> Option<(Arc<PodInfo>, u64)> {
    while let Some(entry) = inner.active.pop() {
        let Some(queued) = inner.pods.get_mut(&entry.uid) else { continue };
        if queued.place != Place::Active || queued.seq != entry.seq {
            continue;
        }
        return Some(start_cycle(&mut inner.cycle, queued));
    }
    None
}

fn pop_backoff_early(inner: &mut Inner) -> Option<(Arc<PodInfo>, u64)> {
    while let Some(Reverse((at, uid))) = inner.backoff.pop() {
        let Some(queued) = inner.pods.get_mut(&uid) else { continue };
        if queued.place != Place::Backoff || queued.backoff_until != at {
            continue;
        }
        return Some(start_cycle(&mut inner.cycle, queued));
    }
    None
}

fn start_cycle(cycle: &mut u64, queued: &mut Queued) -> (Arc<PodInfo>, u64) {
    queued.place = Place::InFlight;
    queued.updated_in_flight = false;
    *cycle += 1;
    (queued.info.clone(), *cycle)
}

fn flush_backoff(inner: &mut Inner, now: Instant) {
    for heap in [&mut inner.backoff, &mut inner.error_backoff] {
        while let Some(Reverse((at, _))) = heap.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, uid))) = heap.pop() else { break };
            if let Some(q) = inner.pods.get_mut(&uid) {
                if q.place == Place::Backoff && q.backoff_until == at {
                    q.place = Place::Active;
                    inner.active.push(ActiveEntry { priority: q.info.priority, seq: q.seq, uid });
                }
            }
        }
    }
}

fn flush_unschedulable(inner: &mut Inner, now: Instant) {
    let Inner { pods, unschedulable, active, .. } = inner;
    unschedulable.retain(|uid| {
        let Some(q) = pods.get_mut(uid) else { return false };
        if now < q.unschedulable_since + MAX_UNSCHEDULABLE {
            return true;
        }
        q.place = Place::Active;
        active.push(ActiveEntry { priority: q.info.priority, seq: q.seq, uid: uid.clone() });
        false
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(name: &str, priority: i32) -> Arc<PodInfo> {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c"}], "priority": priority}
        }))
        .unwrap();
        Arc::new(PodInfo::new(Arc::new(p)))
    }

    #[tokio::test]
    async fn higher_priority_then_older_first() {
        let q = SchedulingQueue::new();
        q.add_or_update(pod("a", 0));
        q.add_or_update(pod("b", 10));
        q.add_or_update(pod("c", 0));
        let order: Vec<String> =
            [q.pop().await, q.pop().await, q.pop().await].iter().map(|(p, _)| p.uid.clone()).collect();
        assert_eq!(order, ["b", "a", "c"]);
    }

    const ALL_KINDS: [bool; EVENT_KINDS] = [true; EVENT_KINDS];

    #[tokio::test]
    async fn unschedulable_pods_wait_for_a_cluster_event() {
        let q = SchedulingQueue::new();
        q.add_or_update(pod("a", 0));
        let (p, cycle) = q.pop().await;
        q.unschedulable(&p.uid, cycle, vec!["NodeResourcesFit"], ALL_KINDS);
        assert!(tokio::time::timeout(Duration::from_millis(50), q.pop()).await.is_err());
        assert_eq!(q.on_event(EventKind::Node, |_, _| true), (0, 1));
        // Its one-second backoff has not passed, but nothing else is
        // active: it is taken from the backoff queue at once.
        let started = Instant::now();
        let (again, _) = q.pop().await;
        assert_eq!(again.uid, "a");
        assert!(started.elapsed() < Duration::from_millis(500));
    }

    #[tokio::test]
    async fn an_active_pod_goes_before_one_in_backoff() {
        let q = SchedulingQueue::new();
        q.add_or_update(pod("failed", 0));
        let (p, cycle) = q.pop().await;
        q.unschedulable(&p.uid, cycle, vec!["NodeResourcesFit"], ALL_KINDS);
        q.on_event(EventKind::Node, |_, _| true);
        q.add_or_update(pod("new", 0));
        assert_eq!(q.pop().await.0.uid, "new");
        assert_eq!(q.pop().await.0.uid, "failed");
    }

    #[tokio::test]
    async fn hints_choose_which_pods_an_event_moves() {
        let q = SchedulingQueue::new();
        q.add_or_update(pod("cpu", 0));
        q.add_or_update(pod("affinity", 0));
        for _ in 0..2 {
            let (p, cycle) = q.pop().await;
            let plugin = if p.uid == "affinity" { "InterPodAffinity" } else { "NodeResourcesFit" };
            q.unschedulable(&p.uid, cycle, vec![plugin], ALL_KINDS);
        }
        let moved = q.on_event(EventKind::AssignedPodAdded, |_, rejected| rejected.contains(&"InterPodAffinity"));
        assert_eq!(moved, (0, 1));
        assert_eq!(q.pop().await.0.uid, "affinity");
        assert!(tokio::time::timeout(Duration::from_millis(1500), q.pop()).await.is_err());
    }

    #[tokio::test]
    async fn an_event_during_the_cycle_counts_only_if_registered() {
        let q = SchedulingQueue::new();
        q.add_or_update(pod("a", 0));
        q.add_or_update(pod("b", 0));
        let (a, ca) = q.pop().await;
        let (b, cb) = q.pop().await;
        // A pod was placed while both were being scheduled.
        q.on_event(EventKind::AssignedPodAdded, |_, _| true);
        let only_nodes = [true, false, false];
        q.unschedulable(&a.uid, ca, vec!["TaintToleration"], only_nodes);
        q.unschedulable(&b.uid, cb, vec!["InterPodAffinity"], ALL_KINDS);
        // `b` may be helped by it and is retried; `a` waits.
        assert_eq!(q.pop().await.0.uid, b.uid);
        assert!(tokio::time::timeout(Duration::from_millis(100), q.pop()).await.is_err());
    }

    #[tokio::test]
    async fn a_status_only_update_leaves_an_unschedulable_pod_waiting() {
        let q = SchedulingQueue::new();
        q.add_or_update(pod("a", 0));
        let (p, cycle) = q.pop().await;
        q.unschedulable(&p.uid, cycle, vec!["NodeResourcesFit"], ALL_KINDS);
        let mut updated = (*p.pod).clone();
        updated.status = Some(k8s_openapi::api::core::v1::PodStatus {
            nominated_node_name: Some("n1".into()),
            ..Default::default()
        });
        q.add_or_update(Arc::new(PodInfo::new(Arc::new(updated.clone()))));
        assert!(tokio::time::timeout(Duration::from_millis(50), q.pop()).await.is_err());
        assert_eq!(q.nominated_pods().get("n1").map(Vec::len), Some(1));
        updated.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        q.add_or_update(Arc::new(PodInfo::new(Arc::new(updated))));
        assert_eq!(q.pop().await.0.uid, "a");
    }

    #[tokio::test]
    async fn an_update_retries_an_unschedulable_pod_after_its_backoff() {
        let q = SchedulingQueue::new();
        q.add_or_update(pod("a", 0));
        let (p, cycle) = q.pop().await;
        q.unschedulable(&p.uid, cycle, vec!["NodeResourcesFit"], ALL_KINDS);
        let mut updated = (*p.pod).clone();
        updated.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        q.add_or_update(Arc::new(PodInfo::new(Arc::new(updated))));
        // Moved by the update to backoff, not to the active queue: a pod
        // queued after it goes first.
        q.add_or_update(pod("b", 0));
        assert_eq!(q.pop().await.0.uid, "b");
        assert_eq!(q.pop().await.0.uid, "a");
    }

    #[test]
    fn backoff_doubles_to_ten_seconds() {
        assert_eq!(backoff_for(1), Duration::from_secs(1));
        assert_eq!(backoff_for(3), Duration::from_secs(4));
        assert_eq!(backoff_for(9), Duration::from_secs(10));
    }
}
