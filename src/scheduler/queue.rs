//! The scheduling queue: an active queue ordered by priority then age, a
//! backoff queue for pods that failed recently (1 s doubling to 10 s), and
//! the unschedulable pods, which wait for a cluster event that may help them
//! (a node added or changed, a pod deleted) or for five minutes. Nothing
//! here polls: `pop` sleeps until a pod is added or the next backoff or
//! flush deadline.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::node_info::PodInfo;

const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
const MAX_UNSCHEDULABLE: Duration = Duration::from_secs(300);

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
    /// It last failed for lack of other pods (pod affinity, spread).
    waits_for_pods: bool,
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

#[derive(Default)]
struct Inner {
    pods: HashMap<String, Queued>,
    active: BinaryHeap<ActiveEntry>,
    backoff: BinaryHeap<Reverse<(Instant, String)>>,
    next_seq: u64,
    /// Counts pops; a cluster event during a cycle sends a failing pod to
    /// backoff rather than to the unschedulable pods.
    cycle: u64,
    moved_at_cycle: u64,
    /// The same for a pod being placed (only pods waiting for pods care).
    pods_moved_at_cycle: u64,
}

pub struct SchedulingQueue {
    inner: Mutex<Inner>,
    wake: Notify,
}

fn backoff_for(attempts: u32) -> Duration {
    let shift = attempts.saturating_sub(1).min(8);
    (INITIAL_BACKOFF * (1u32 << shift)).min(MAX_BACKOFF)
}

impl Default for SchedulingQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl SchedulingQueue {
    pub fn new() -> Self {
        SchedulingQueue { inner: Mutex::new(Inner::default()), wake: Notify::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pod that needs a node was added or changed.
    pub fn add_or_update(&self, info: Arc<PodInfo>) {
        let mut q = self.lock();
        let inner = &mut *q;
        let now = Instant::now();
        match inner.pods.get_mut(&info.uid) {
            Some(queued) => {
                queued.info = info;
                match queued.place {
                    Place::InFlight => queued.updated_in_flight = true,
                    // A change to the pod may make it fit: try it again.
                    Place::Unschedulable => {
                        queued.place = Place::Active;
                        inner.active.push(ActiveEntry {
                            priority: queued.info.priority,
                            seq: queued.seq,
                            uid: queued.info.uid.clone(),
                        });
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
                        waits_for_pods: false,
                    },
                );
                self.wake.notify_one();
            }
        }
    }

    /// The pod is gone or has a node; forget it.
    pub fn delete(&self, uid: &str) {
        self.lock().pods.remove(uid);
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
        for q in self.lock().pods.values().filter(|q| q.place != Place::InFlight) {
            let status = q.info.pod.status.as_ref();
            if let Some(node) = status.and_then(|s| s.nominated_node_name.as_deref()).filter(|n| !n.is_empty()) {
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
                flush_unschedulable(inner, now);
                while let Some(entry) = inner.active.pop() {
                    let Some(queued) = inner.pods.get_mut(&entry.uid) else { continue };
                    if queued.place != Place::Active || queued.seq != entry.seq {
                        continue;
                    }
                    queued.place = Place::InFlight;
                    queued.updated_in_flight = false;
                    inner.cycle += 1;
                    return (queued.info.clone(), inner.cycle);
                }
                let backoff = inner.backoff.peek().map(|Reverse((t, _))| *t);
                let flush = inner
                    .pods
                    .values()
                    .filter(|p| p.place == Place::Unschedulable)
                    .map(|p| p.unschedulable_since + MAX_UNSCHEDULABLE)
                    .min();
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
        self.lock().pods.remove(uid);
    }

    /// The pod fit nowhere in cycle `cycle`. It waits among the
    /// unschedulable pods, unless the cluster changed meanwhile (or the pod
    /// itself did), in which case it is retried after its backoff.
    pub fn unschedulable(&self, uid: &str, cycle: u64, waits_for_pods: bool) {
        let mut q = self.lock();
        let moved = q.moved_at_cycle >= cycle || (waits_for_pods && q.pods_moved_at_cycle >= cycle);
        let now = Instant::now();
        let Some(queued) = q.pods.get_mut(uid) else { return };
        queued.attempts += 1;
        queued.waits_for_pods = waits_for_pods;
        queued.backoff_until = now + backoff_for(queued.attempts);
        if moved || queued.updated_in_flight {
            queued.place = Place::Backoff;
            let entry = Reverse((queued.backoff_until, uid.to_string()));
            q.backoff.push(entry);
            self.wake.notify_one();
        } else {
            queued.place = Place::Unschedulable;
            queued.unschedulable_since = now;
        }
    }

    /// Scheduling or binding failed for another reason: retry after backoff.
    pub fn retry(&self, uid: &str) {
        let mut q = self.lock();
        let now = Instant::now();
        let Some(queued) = q.pods.get_mut(uid) else { return };
        queued.attempts += 1;
        queued.place = Place::Backoff;
        queued.backoff_until = now + backoff_for(queued.attempts);
        let entry = Reverse((queued.backoff_until, uid.to_string()));
        q.backoff.push(entry);
        self.wake.notify_one();
    }

    /// A cluster event that may let unschedulable pods fit: move them all
    /// to the active queue (or to backoff if they failed very recently).
    pub fn move_all_to_active_or_backoff(&self) {
        self.move_to_active_or_backoff(false);
    }

    /// A pod was placed: move the pods that wait for other pods.
    pub fn move_pods_waiting_for_pods(&self) {
        self.move_to_active_or_backoff(true);
    }

    fn move_to_active_or_backoff(&self, only_waiting_for_pods: bool) {
        let mut q = self.lock();
        let inner = &mut *q;
        if only_waiting_for_pods {
            inner.pods_moved_at_cycle = inner.cycle;
        } else {
            inner.moved_at_cycle = inner.cycle;
        }
        let now = Instant::now();
        let mut moved = false;
        let eligible = |p: &Queued| p.place == Place::Unschedulable && (!only_waiting_for_pods || p.waits_for_pods);
        for queued in inner.pods.values_mut().filter(|p| eligible(p)) {
            moved = true;
            if queued.backoff_until > now {
                queued.place = Place::Backoff;
                inner.backoff.push(Reverse((queued.backoff_until, queued.info.uid.clone())));
            } else {
                queued.place = Place::Active;
                inner.active.push(ActiveEntry {
                    priority: queued.info.priority,
                    seq: queued.seq,
                    uid: queued.info.uid.clone(),
                });
            }
        }
        if moved {
            self.wake.notify_one();
        }
    }
}

fn flush_backoff(inner: &mut Inner, now: Instant) {
    while let Some(Reverse((at, _))) = inner.backoff.peek() {
        if *at > now {
            break;
        }
        let Some(Reverse((at, uid))) = inner.backoff.pop() else { break };
        if let Some(q) = inner.pods.get_mut(&uid) {
            if q.place == Place::Backoff && q.backoff_until == at {
                q.place = Place::Active;
                inner.active.push(ActiveEntry { priority: q.info.priority, seq: q.seq, uid });
            }
        }
    }
}

fn flush_unschedulable(inner: &mut Inner, now: Instant) {
    for q in inner.pods.values_mut() {
        if q.place == Place::Unschedulable && now >= q.unschedulable_since + MAX_UNSCHEDULABLE {
            q.place = Place::Active;
            inner.active.push(ActiveEntry { priority: q.info.priority, seq: q.seq, uid: q.info.uid.clone() });
        }
    }
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

    #[tokio::test]
    async fn unschedulable_pods_wait_for_a_cluster_event() {
        let q = SchedulingQueue::new();
        q.add_or_update(pod("a", 0));
        let (p, cycle) = q.pop().await;
        q.unschedulable(&p.uid, cycle, false);
        assert!(tokio::time::timeout(Duration::from_millis(50), q.pop()).await.is_err());
        q.move_all_to_active_or_backoff();
        // Its one-second backoff has to pass first.
        let started = Instant::now();
        let (again, _) = q.pop().await;
        assert_eq!(again.uid, "a");
        assert!(started.elapsed() >= Duration::from_millis(500));
    }

    #[tokio::test]
    async fn placed_pods_move_only_pods_waiting_for_pods() {
        let q = SchedulingQueue::new();
        q.add_or_update(pod("cpu", 0));
        q.add_or_update(pod("affinity", 0));
        let (a, c1) = q.pop().await;
        let (b, c2) = q.pop().await;
        q.unschedulable(&a.uid, c1, a.uid == "affinity");
        q.unschedulable(&b.uid, c2, b.uid == "affinity");
        q.move_pods_waiting_for_pods();
        let (again, _) = q.pop().await;
        assert_eq!(again.uid, "affinity");
        assert!(tokio::time::timeout(Duration::from_millis(1500), q.pop()).await.is_err());
    }

    #[test]
    fn backoff_doubles_to_ten_seconds() {
        assert_eq!(backoff_for(1), Duration::from_secs(1));
        assert_eq!(backoff_for(3), Duration::from_secs(4));
        assert_eq!(backoff_for(9), Duration::from_secs(10));
    }
}
