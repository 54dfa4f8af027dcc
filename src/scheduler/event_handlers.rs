//! How the scheduler follows the cluster (upstream's eventhandlers.go):
//! pods and nodes from the shared informers feed its cache and its queue,
//! and each change that may let a waiting pod fit is a `ClusterEvent` the
//! queue judges with the rejecting plugins' queueing hints.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};

use super::framework::ClusterEvent;
use super::node_info::PodInfo;
use super::Scheduler;
use crate::client::informer::Change;

/// A subscription's changes, each object shared with the informer's cache
/// (the scheduler keeps no copy of its own).
pub(super) type Changes<K> = futures_util::stream::BoxStream<'static, Change<K>>;

impl Scheduler {
    /// A pod as the watch shows it now.
    pub(super) fn on_pod(&self, pod: Arc<Pod>) {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
        let finished = matches!(phase, "Succeeded" | "Failed");
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if finished {
            return self.on_pod_deleted(&uid);
        }
        match node {
            Some(node) => {
                self.queue.delete(&uid);
                let info = Arc::new(PodInfo::new(pod));
                let newly_assigned = {
                    let mut cache = self.cache();
                    let newly = !cache.contains(&uid) || cache.is_assumed(&uid);
                    cache.add_pod(info.clone(), &node);
                    newly
                };
                // A pod placed: pods waiting for pod affinity or a better
                // spread may fit now (upstream's AssignedPodAdd event).
                if newly_assigned {
                    self.on_cluster_event(&ClusterEvent::AssignedPodAdded(&info), "AssignedPodAdd");
                }
            }
            None => {
                let gated = pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| !g.is_empty());
                if pod.metadata.deletion_timestamp.is_some() || gated || self.profile_for(&pod).is_none() {
                    self.queue.delete(&uid);
                } else {
                    self.queue.add_or_update(Arc::new(PodInfo::new(pod)));
                }
            }
        }
    }

    pub(super) fn on_pod_deleted(&self, uid: &str) {
        self.queue.delete(uid);
        let removed = self.cache().remove_pod(uid);
        if let Some(pod) = removed {
            // Room was freed: pods that did not fit may now.
            self.on_cluster_event(&ClusterEvent::AssignedPodDeleted(&pod), "AssignedPodDelete");
        }
    }

    /// Moves the unschedulable pods that `event` may help, as the queueing
    /// hints of the plugins that rejected each say. A pod nominated to a
    /// node is also woken by any change of that node,
    /// so a nomination the node can no longer honour (it was cordoned,
    /// tainted) is dropped at once rather than at the five-minute flush.
    /// `label` names the event in `scheduler_queue_incoming_pods_total`.
    fn on_cluster_event(&self, event: &ClusterEvent, label: &'static str) {
        let (active, backoff) = self.queue.on_event(event.kind(), |pod, rejected_by| {
            let nominated_here = match event {
                ClusterEvent::Node(node) => {
                    pod.pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()) == Some(node.name.as_str())
                }
                _ => false,
            };
            nominated_here
                || self.profile_for(&pod.pod).is_some_and(|p| p.is_schedulable_after(pod, rejected_by, event))
        });
        crate::metrics::scheduler::incoming_pods(label, "active", active);
        crate::metrics::scheduler::incoming_pods(label, "backoff", backoff);
    }

    fn on_node(&self, node: Arc<Node>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let (changed, label) = {
            let mut cache = self.cache();
            let (changed, label) = match cache.node(&name) {
                Some(old) => (scheduling_relevant_change(&old.node, &node), "NodeUpdate"),
                None => (true, "NodeAdd"),
            };
            cache.set_node(node);
            // The node with its pods, for the hints (outside the lock).
            (changed.then(|| cache.node(&name).cloned()).flatten(), label)
        };
        if let Some(info) = changed {
            self.on_cluster_event(&ClusterEvent::Node(&info), label);
        }
    }
}

/// Whether a node update could make a pod fit that did not (heartbeats that
/// only touch conditions' times do not).
fn scheduling_relevant_change(old: &Node, new: &Node) -> bool {
    let allocatable = |n: &Node| n.status.as_ref().and_then(|s| s.allocatable.clone());
    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|c| c.iter().map(|c| (c.type_.clone(), c.status.clone())).collect::<Vec<_>>())
    };
    old.metadata.labels != new.metadata.labels
        || old.spec != new.spec
        || allocatable(old) != allocatable(new)
        || ready(old) != ready(new)
}

/// Feeds the queue and the cache from the shared pod informer (finished
/// pods count as deleted: `on_pod` drops them).
pub(super) async fn watch_pods(
    sched: Arc<Scheduler>,
    mut changes: Changes<Pod>,
    synced: tokio::sync::watch::Sender<bool>,
) {
    let mut seen: Option<HashSet<String>> = None;
    while let Some(change) = changes.next().await {
        match change {
            Change::Applied { new, .. } => sched.on_pod(new),
            Change::Deleted(pod) => sched.on_pod_deleted(pod.metadata.uid.as_deref().unwrap_or_default()),
            Change::Relist => seen = Some(HashSet::new()),
            Change::Listed(pod) => {
                if let Some(s) = seen.as_mut() {
                    s.insert(pod.metadata.uid.clone().unwrap_or_default());
                }
                sched.on_pod(pod);
            }
            Change::Synced => {
                // Pods deleted while the watch was down were never reported.
                if let Some(seen) = seen.take() {
                    let stale: Vec<String> =
                        sched.cache().pod_uids().filter(|u| !seen.contains(*u)).map(str::to_string).collect();
                    for uid in stale {
                        if !sched.cache().is_assumed(&uid) {
                            sched.on_pod_deleted(&uid);
                        }
                    }
                }
                let _ = synced.send(true);
            }
        }
    }
}

/// Feeds the cache from the shared node informer (heartbeats skipped).
pub(super) async fn watch_nodes(
    sched: Arc<Scheduler>,
    mut changes: Changes<Node>,
    synced: tokio::sync::watch::Sender<bool>,
) {
    let mut seen: Option<HashSet<String>> = None;
    while let Some(change) = changes.next().await {
        match change {
            Change::Applied { new, .. } => sched.on_node(new),
            Change::Deleted(node) => sched.cache().remove_node(node.metadata.name.as_deref().unwrap_or_default()),
            Change::Relist => seen = Some(HashSet::new()),
            Change::Listed(node) => {
                if let Some(s) = seen.as_mut() {
                    s.insert(node.metadata.name.clone().unwrap_or_default());
                }
                sched.on_node(node);
            }
            Change::Synced => {
                if let Some(seen) = seen.take() {
                    let mut cache = sched.cache();
                    let stale: Vec<String> =
                        cache.node_names().filter(|n| !seen.contains(*n)).map(str::to_string).collect();
                    for name in stale {
                        cache.remove_node(&name);
                    }
                }
                let _ = synced.send(true);
            }
        }
    }
}
