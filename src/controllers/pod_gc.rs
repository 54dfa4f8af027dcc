//! PodGCController (podgc), as upstream's pkg/controller/podgc, acting as
//! `pod-garbage-collector`. It force-deletes (grace period 0):
//! - terminated pods (Succeeded or Failed) beyond
//!   `--terminated-pod-gc-threshold` (12500 by default; 0 turns this part
//!   off), evicted ones first, then the oldest;
//! - pods bound to a node that no longer exists: a node missing from the
//!   cache is quarantined for 40 s, then looked up through the API; when it
//!   is gone for good its pods are marked Failed with the condition
//!   `DisruptionTarget` (reason `DeletionByPodGC`) and deleted;
//! - terminating pods never scheduled to a node;
//! - terminating pods on a node that is not Ready and carries the
//!   `node.kubernetes.io/out-of-service` taint.
//!
//! A pod not yet Succeeded or Failed is patched to Failed first, so that a
//! pod with no kubelet left to report on it does not stay Running for
//! ever. Upstream records no Events here, nor does this.
//!
//! Upstream scans its caches every 20 s; this wakes on the pod and node
//! changes that can matter (a pod terminated or terminating, a pod bound to
//! a node the cache lacks, a node deleted or changed) and when a
//! quarantine ends, and scans the same caches then.

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;
use tokio::time::Instant;

use super::controller_utils::pod_phase;
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::predicates::node_heartbeat_only;

/// The service account it acts as.
pub const NAME: &str = "pod-garbage-collector";
/// Upstream's `--terminated-pod-gc-threshold` default.
pub const DEFAULT_TERMINATED_POD_THRESHOLD: usize = 12_500;
/// How long a node missing from the cache is given to show up before it
/// is looked up through the API (upstream's quarantineTime).
const QUARANTINE: Duration = Duration::from_secs(40);
/// Changes arriving together are handled in one scan.
const SETTLE: Duration = Duration::from_secs(1);
/// The taint that lets pods terminating on a dead node go.
pub const TAINT_OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

struct PodGc {
    client: kube::Client,
    pods: Store<Pod>,
    nodes: Store<Node>,
    threshold: usize,
    /// Nodes pods are bound to that the cache lacks, and when their quarantine ends.
    quarantined: HashMap<String, Instant>,
}

/// Runs until aborted. `threshold` is `--terminated-pod-gc-threshold`.
pub async fn run(client: kube::Client, informers: SharedInformerFactory, threshold: usize) {
    let (nodes, node_changes) =
        informers.informer::<Node>().subscribe().skip_updates(node_heartbeat_only).into_shared_parts();
    let known = nodes.clone();
    let (pods, pod_changes) =
        informers.informer::<Pod>().subscribe().only(move |p| may_concern_gc(p, &known)).into_shared_parts();
    let mut changes = futures_util::stream::select(pod_changes.map(|_| ()), node_changes.map(|_| ()));
    let mut gc = PodGc { client, pods, nodes, threshold, quarantined: HashMap::new() };
    if crate::client::cache_sync::wait_for_cache_sync(&gc.pods).await.is_err()
        || crate::client::cache_sync::wait_for_cache_sync(&gc.nodes).await.is_err()
    {
        return;
    }
    loop {
        gc.gc().await;
        let next_quarantine_end = gc.quarantined.values().min().copied();
        tokio::select! {
            change = changes.next() => {
                if change.is_none() {
                    return;
                }
                // Let a burst of changes settle, then scan once.
                tokio::time::sleep(SETTLE).await;
                while let Some(Some(())) = changes.next().now_or_never() {}
            }
            _ = sleep_until(next_quarantine_end) => {}
        }
    }
}

/// Sleeps until `at`, or for ever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Whether a change of `pod` can give the collector work.
fn may_concern_gc(pod: &Pod, nodes: &Store<Node>) -> bool {
    if is_terminated(pod) || pod.metadata.deletion_timestamp.is_some() {
        return true;
    }
    let node = node_name(pod);
    !node.is_empty() && nodes.get(&ObjectRef::new(node)).is_none()
}

fn node_name(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default()
}

/// Succeeded or Failed (upstream: any phase but Pending, Running, Unknown).
fn is_terminated(pod: &Pod) -> bool {
    matches!(pod_phase(pod), "Succeeded" | "Failed")
}

/// Evicted by its kubelet: Failed with the reason `Evicted`.
fn is_evicted(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Failed")
        && status.and_then(|s| s.reason.as_deref()) == Some("Evicted")
}

/// Upstream's byEvictionAndCreationTimestamp: evicted pods first, then the
/// oldest, names breaking ties.
fn by_eviction_and_age(a: &Arc<Pod>, b: &Arc<Pod>) -> Ordering {
    is_evicted(b)
        .cmp(&is_evicted(a))
        .then_with(|| created(a).cmp(&created(b)))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

fn created(pod: &Pod) -> Option<Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

fn is_node_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

fn out_of_service(node: &Node) -> bool {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    taints.into_iter().flatten().any(|t| t.key == TAINT_OUT_OF_SERVICE)
}

/// The terminated pods to delete: those beyond `threshold`, in upstream's order.
fn terminated_beyond(pods: &[Arc<Pod>], threshold: usize) -> Vec<Arc<Pod>> {
    let mut terminated: Vec<Arc<Pod>> = pods.iter().filter(|p| is_terminated(p)).cloned().collect();
    let excess = terminated.len().saturating_sub(threshold);
    if excess == 0 {
        return Vec::new();
    }
    terminated.sort_by(by_eviction_and_age);
    terminated.truncate(excess);
    terminated
}

/// Why a pod is deleted, for the log.
#[derive(Debug, Clone, Copy)]
enum Reason {
    Terminated,
    TerminatingOutOfService,
    Orphaned,
    TerminatingUnscheduled,
}

impl PodGc {
    async fn gc(&mut self) {
        let pods = self.pods.state();
        if self.threshold > 0 {
            for pod in terminated_beyond(&pods, self.threshold) {
                self.delete(&pod, Reason::Terminated).await;
            }
        }
        self.gc_terminating_out_of_service(&pods).await;
        self.gc_orphaned(&pods).await;
        for pod in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_some() && node_name(p).is_empty()) {
            self.delete(pod, Reason::TerminatingUnscheduled).await;
        }
    }

    async fn gc_terminating_out_of_service(&self, pods: &[Arc<Pod>]) {
        let mut terminating: Vec<Arc<Pod>> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .filter(|p| {
                self.nodes.get(&ObjectRef::new(node_name(p))).is_some_and(|n| !is_node_ready(&n) && out_of_service(&n))
            })
            .cloned()
            .collect();
        terminating.sort_by(by_eviction_and_age);
        for pod in terminating {
            self.delete(&pod, Reason::TerminatingOutOfService).await;
        }
    }

    /// Pods bound to nodes that are gone, once their quarantine is over.
    async fn gc_orphaned(&mut self, pods: &[Arc<Pod>]) {
        let now = Instant::now();
        let missing: BTreeSet<&str> = pods
            .iter()
            .map(|p| node_name(p))
            .filter(|n| !n.is_empty() && self.nodes.get(&ObjectRef::new(n)).is_none())
            .collect();
        // Nodes that showed up, or whose pods went, leave quarantine.
        self.quarantined.retain(|n, _| missing.contains(n.as_str()));
        for node in &missing {
            self.quarantined.entry(node.to_string()).or_insert(now + QUARANTINE);
        }
        let due: Vec<String> = self.quarantined.iter().filter(|(_, at)| **at <= now).map(|(n, _)| n.clone()).collect();
        let mut deleted_nodes = BTreeSet::new();
        for node in due {
            self.quarantined.remove(&node);
            match Api::<Node>::all(self.client.clone()).get_opt(&node).await {
                Ok(None) => {
                    deleted_nodes.insert(node);
                }
                Ok(Some(_)) => {}
                // Looked at again on a later scan, when its pods are still there.
                Err(e) => tracing::warn!(node = %node, error = %e, "pod GC cannot look up a node"),
            }
        }
        for pod in pods.iter().filter(|p| deleted_nodes.contains(node_name(p))) {
            tracing::info!(pod = ?pod.metadata.name, node = node_name(pod), "orphaned pod on a deleted node");
            self.delete(pod, Reason::Orphaned).await;
        }
    }

    /// Marks the pod Failed (with the DisruptionTarget condition for an
    /// orphan) unless it already finished, then force-deletes it.
    async fn delete(&self, pod: &Pod, reason: Reason) {
        let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) else { return };
        tracing::info!(namespace = ns, pod = name, ?reason, "pod GC force-deleting a pod");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        if !is_terminated(pod) {
            let patch = failed_status(pod, matches!(reason, Reason::Orphaned), Timestamp::now());
            match api.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => {
                    tracing::warn!(namespace = ns, pod = name, error = %e, "pod GC cannot mark a pod Failed");
                    return;
                }
            }
        }
        match api.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => tracing::warn!(namespace = ns, pod = name, error = %e, "pod GC cannot delete a pod"),
        }
    }
}

/// The status patch that marks `pod` Failed (for its UID only), with
/// upstream's DisruptionTarget condition when its node is gone.
fn failed_status(pod: &Pod, orphaned: bool, now: Timestamp) -> serde_json::Value {
    let mut status = json!({"phase": "Failed"});
    if orphaned {
        let existing = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "DisruptionTarget"));
        // The transition time moves only when the status changes.
        let since = match existing {
            Some(c) if c.status == "True" => c.last_transition_time.as_ref().map(|t| t.0).unwrap_or(now),
            _ => now,
        };
        status["conditions"] = json!([{
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByPodGC",
            "message": "PodGC: node no longer exists",
            "lastTransitionTime": since.to_string(),
        }]);
    }
    json!({"metadata": {"uid": pod.metadata.uid}, "status": status})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, created: i64, phase: &str, reason: Option<&str>) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"),
                             "creationTimestamp": Timestamp::from_second(created).unwrap().to_string()},
                "spec": {"containers": [], "nodeName": "n1"},
                "status": {"phase": phase, "reason": reason},
            }))
            .unwrap(),
        )
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<&str> {
        pods.iter().filter_map(|p| p.metadata.name.as_deref()).collect()
    }

    #[test]
    fn only_terminated_pods_beyond_the_threshold_go_evicted_then_oldest_first() {
        let pods = vec![
            pod("old-done", 10, "Succeeded", None),
            pod("running", 1, "Running", None),
            pod("new-failed", 30, "Failed", None),
            pod("evicted", 40, "Failed", Some("Evicted")),
            pod("b-same-age", 20, "Succeeded", None),
            pod("a-same-age", 20, "Succeeded", None),
        ];
        assert!(terminated_beyond(&pods, 5).is_empty());
        assert_eq!(names(&terminated_beyond(&pods, 2)), ["evicted", "old-done", "a-same-age"]);
        assert_eq!(terminated_beyond(&pods, 0).len(), 5);
    }

    #[test]
    fn an_orphan_is_marked_failed_with_the_disruption_condition() {
        let now: Timestamp = "2025-01-01T00:00:00Z".parse().unwrap();
        let p = pod("web", 1, "Running", None);
        let patch = failed_status(&p, true, now);
        assert_eq!(patch["metadata"]["uid"], "u-web");
        assert_eq!(patch["status"]["phase"], "Failed");
        let c = &patch["status"]["conditions"][0];
        assert_eq!((c["type"].as_str(), c["reason"].as_str()), (Some("DisruptionTarget"), Some("DeletionByPodGC")));
        assert_eq!(c["message"], "PodGC: node no longer exists");
        assert_eq!(c["lastTransitionTime"], "2025-01-01T00:00:00Z");
        assert!(failed_status(&p, false, now)["status"].get("conditions").is_none());
    }

    #[test]
    fn a_node_that_is_out_of_service_and_not_ready() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "spec": {"taints": [{"key": TAINT_OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        }))
        .unwrap();
        assert!(out_of_service(&node) && !is_node_ready(&node));
        assert!(!out_of_service(&Node::default()));
    }
}
