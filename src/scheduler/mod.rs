//! The scheduler: watches pods and nodes, keeps every node's placed pods in
//! a cache, takes pods without a node from the scheduling queue one at a
//! time, runs the pod's profile (filter and score plugins) over the nodes,
//! assumes the pod on the best one and binds it through `pods/binding` in
//! the background, so the next pod is scheduled while the binding is
//! written. Pods that fit nowhere get the `PodScheduled=False` condition and
//! a FailedScheduling event in upstream's words, may preempt lower-priority
//! pods, and wait for a cluster event. Runs while this server holds the
//! `kube-scheduler` Lease.

pub mod cache;
pub mod config;
mod event_handlers;
pub mod framework;
pub mod node_info;
pub mod plugins;
pub mod preemption;
pub mod profile;
pub mod queue;
pub mod resources;
pub mod volume_binding;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod, ReplicationController, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Semaphore;

use crate::client::events::{EventRecorder, EventType};
use crate::client::indexer::Index;
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::predicates::node_heartbeat_only;
use crate::sync::LockExt;

use cache::SchedulerCache;
use framework::{Code, CycleState, NodeFailure, Snapshot};
use node_info::PodInfo;
use profile::{fit_error_message, Profile};
use queue::SchedulingQueue;

pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// How many bindings may be in flight at once.
const CONCURRENT_BINDINGS: usize = 64;

struct Scheduler {
    client: kube::Client,
    recorder: EventRecorder,
    profiles: HashMap<String, Arc<Profile>>,
    cache: Mutex<SchedulerCache>,
    queue: SchedulingQueue,
    next_start: AtomicUsize,
    pdbs: Store<PodDisruptionBudget>,
    services: Index<Service>,
    replication_controllers: Store<ReplicationController>,
    replica_sets: Store<ReplicaSet>,
    stateful_sets: Store<StatefulSet>,
    bindings: Arc<Semaphore>,
    rng: AtomicU64,
}

/// What one scheduling cycle decided.
enum Decision {
    Bind(String),
    /// `rejected_by`: the filter plugins that rejected it (their queueing
    /// hints decide which cluster events wake it). `clear_nomination`:
    /// preemption found no node, so the pod's earlier nomination is
    /// dropped (as upstream's empty PostFilter nomination).
    Unschedulable {
        message: String,
        candidate: Option<preemption::Candidate>,
        rejected_by: Vec<&'static str>,
        clear_nomination: bool,
    },
    Error(String),
}

/// Runs the scheduler with `profiles` (one per schedulerName) until
/// aborted. It reads pods, nodes and what its plugins look up from the
/// process' shared informers, and writes (bindings, status, Events) with
/// `client`, as itself.
pub async fn run(client: kube::Client, informers: SharedInformerFactory, profiles: Vec<Arc<Profile>>) {
    let pdbs = informers.informer().store();
    // For PodTopologySpread's system default constraints.
    let services = informers.by_namespace();
    let replication_controllers = informers.informer().store();
    let replica_sets = informers.informer().store();
    let stateful_sets = informers.informer().store();
    let sched = Arc::new(Scheduler {
        recorder: EventRecorder::new(client.clone(), DEFAULT_SCHEDULER_NAME),
        profiles: profiles.into_iter().map(|p| (p.scheduler_name.clone(), p)).collect(),
        cache: Mutex::new(SchedulerCache::default()),
        queue: SchedulingQueue::new(),
        next_start: AtomicUsize::new(0),
        pdbs,
        services,
        replication_controllers,
        replica_sets,
        stateful_sets,
        bindings: Arc::new(Semaphore::new(CONCURRENT_BINDINGS)),
        rng: AtomicU64::new(seed()),
        client,
    });
    let (nodes_synced_tx, mut nodes_synced) = tokio::sync::watch::channel(false);
    let (pods_synced_tx, mut pods_synced) = tokio::sync::watch::channel(false);
    let nodes = informers.informer::<Node>().subscribe().skip_updates(node_heartbeat_only).into_changes().1;
    let pods = informers.informer::<Pod>().subscribe().into_changes().1;
    let _nodes = AbortOnDrop(tokio::spawn(event_handlers::watch_nodes(sched.clone(), nodes, nodes_synced_tx)));
    let _pods = AbortOnDrop(tokio::spawn(event_handlers::watch_pods(sched.clone(), pods, pods_synced_tx)));
    if nodes_synced.wait_for(|s| *s).await.is_err() || pods_synced.wait_for(|s| *s).await.is_err() {
        return;
    }
    // Scoring and preemption only: do not wait long for these.
    let others = async {
        let _ = crate::client::cache_sync::wait_for_cache_sync(&sched.pdbs).await;
        let _ = crate::client::cache_sync::wait_for_cache_sync(sched.services.store()).await;
        let _ = crate::client::cache_sync::wait_for_cache_sync(&sched.replication_controllers).await;
        let _ = crate::client::cache_sync::wait_for_cache_sync(&sched.replica_sets).await;
        let _ = crate::client::cache_sync::wait_for_cache_sync(&sched.stateful_sets).await;
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), others).await;
    tracing::debug!("scheduler caches synced");
    loop {
        let (pod, cycle) = sched.queue.pop().await;
        schedule_one(&sched, pod, cycle).await;
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn seed() -> u64 {
    crate::host::random::u64() | 1
}

impl Scheduler {
    fn cache(&self) -> std::sync::MutexGuard<'_, SchedulerCache> {
        self.cache.locked()
    }

    fn random(&self) -> u64 {
        // xorshift64: only for breaking ties between equally good nodes.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    fn profile_for(&self, pod: &Pod) -> Option<&Arc<Profile>> {
        let name = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()).unwrap_or(DEFAULT_SCHEDULER_NAME);
        self.profiles.get(name)
    }

    /// The selector PodTopologySpread's system default constraints spread a
    /// pod without constraints of its own by: its Services' and its
    /// controller's (upstream's DefaultSelector).
    fn default_spread_selector(&self, pod: &PodInfo) -> Option<LabelSelector> {
        use plugins::pod_topology_spread::{default_selector, OwnerSelector};
        let spec = pod.pod.spec.as_ref();
        if spec.and_then(|s| s.topology_spread_constraints.as_ref()).is_some_and(|c| !c.is_empty()) {
            return None;
        }
        let services = self.services.get(&pod.namespace);
        let owner = pod.pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
        let ns = pod.namespace.as_str();
        let (rc, rs, sts) = match owner.map(|o| (o.api_version.as_str(), o.kind.as_str(), o.name.as_str())) {
            Some(("v1", "ReplicationController", name)) => {
                (self.replication_controllers.get(&ObjectRef::new(name).within(ns)), None, None)
            }
            Some(("apps/v1", "ReplicaSet", name)) => {
                (None, self.replica_sets.get(&ObjectRef::new(name).within(ns)), None)
            }
            Some(("apps/v1", "StatefulSet", name)) => {
                (None, None, self.stateful_sets.get(&ObjectRef::new(name).within(ns)))
            }
            _ => (None, None, None),
        };
        let owner = if let Some(labels) = rc.as_ref().and_then(|rc| rc.spec.as_ref()).and_then(|s| s.selector.as_ref())
        {
            Some(OwnerSelector::Labels(labels))
        } else if let Some(rs) = rs.as_ref().and_then(|rs| rs.spec.as_ref()) {
            Some(OwnerSelector::Selector(&rs.selector))
        } else {
            sts.as_ref().and_then(|s| s.spec.as_ref()).map(|s| OwnerSelector::Selector(&s.selector))
        };
        default_selector(pod, &services, owner)
    }
}

/// One scheduling cycle, under the cache lock (no await inside).
fn decide(sched: &Scheduler, profile: &Profile, pod: &Arc<PodInfo>) -> Decision {
    let mut cache = sched.cache();
    let chosen = {
        let snapshot = Snapshot { nodes: &cache.nodes };
        let all = snapshot.nodes.len();
        if all == 0 {
            return Decision::Unschedulable {
                message: fit_error_message(0, &[]),
                candidate: None,
                rejected_by: Vec::new(),
                clear_nomination: false,
            };
        }
        let mut state = CycleState::default();
        if let Err(status) = profile.pre_filter(&mut state, pod, &snapshot) {
            if status.code == Code::Error {
                return Decision::Error(status.reasons.join(", "));
            }
            let failures: Vec<NodeFailure> =
                snapshot.nodes.iter().map(|n| NodeFailure { node: n.name.clone(), status: status.clone() }).collect();
            let message = fit_error_message(all, &failures);
            return Decision::Unschedulable {
                message,
                candidate: None,
                rejected_by: vec![status.plugin],
                clear_nomination: false,
            };
        }
        let start = sched.next_start.load(Ordering::Relaxed) % all;
        let nominated = sched.queue.nominated_pods();
        let feasible = profile.find_feasible(&state, pod, &snapshot, start, &nominated);
        sched.next_start.store((start + feasible.processed) % all, Ordering::Relaxed);
        if let Some(err) = feasible.failures.iter().find(|f| f.status.code == Code::Error) {
            return Decision::Error(err.status.reasons.join(", "));
        }
        if feasible.nodes.is_empty() {
            let mut message = fit_error_message(all, &feasible.failures);
            let mut candidate = None;
            let mut clear_nomination = false;
            let policy = pod.pod.spec.as_ref().and_then(|s| s.preemption_policy.as_deref()).unwrap_or_default();
            if profile.preemption && policy == "Never" {
                message.push_str(" preemption: not eligible due to preemptionPolicy=Never..");
            } else if profile.preemption {
                let pdbs = sched.pdbs.state();
                match preemption::find_candidate(
                    profile,
                    &state,
                    pod,
                    snapshot.nodes,
                    &feasible.failures,
                    &pdbs,
                    &nominated,
                ) {
                    Ok(mut c) => {
                        c.lower_priority_nominated = nominated
                            .get(&c.node)
                            .into_iter()
                            .flatten()
                            .filter(|p| p.priority < pod.priority && p.uid != pod.uid)
                            .cloned()
                            .collect();
                        candidate = Some(c);
                    }
                    // Upstream's FitError appends the PostFilter message as " %v.".
                    Err(post) => {
                        let nominated_now = pod.pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref());
                        clear_nomination = !matches!(post, preemption::NoCandidate::NotEligible)
                            && nominated_now.is_some_and(|n| !n.is_empty());
                        message.push(' ');
                        message.push_str(&post.to_string());
                        message.push('.');
                    }
                }
            }
            let mut rejected_by: Vec<&'static str> = Vec::new();
            for f in &feasible.failures {
                if !rejected_by.contains(&f.status.plugin) {
                    rejected_by.push(f.status.plugin);
                }
            }
            return Decision::Unschedulable { message, candidate, rejected_by, clear_nomination };
        }
        if let Some(selector) = sched.default_spread_selector(pod) {
            state.write(plugins::pod_topology_spread::DEFAULT_SELECTOR_KEY, selector);
        }
        let scores = profile.score(&mut state, pod, &snapshot, &feasible.nodes);
        // The best score wins; ties are broken at random (reservoir sampling).
        let mut best = 0;
        let mut ties = 0u64;
        for (i, s) in scores.iter().enumerate() {
            if *s > scores[best] {
                best = i;
                ties = 1;
            } else if *s == scores[best] {
                ties += 1;
                if sched.random().is_multiple_of(ties) {
                    best = i;
                }
            }
        }
        snapshot.nodes[feasible.nodes[best]].name.clone()
    };
    cache.assume(pod.clone(), &chosen);
    Decision::Bind(chosen)
}

async fn schedule_one(sched: &Arc<Scheduler>, pod: Arc<PodInfo>, cycle: u64) {
    let Some(profile) = sched.profile_for(&pod.pod).cloned() else {
        sched.queue.done(&pod.uid);
        return;
    };
    let decision = decide(sched, &profile, &pod);
    let result = match &decision {
        Decision::Bind(_) => "scheduled",
        Decision::Unschedulable { .. } => "unschedulable",
        Decision::Error(_) => "error",
    };
    crate::metrics::scheduler::schedule_attempt(result, &profile.scheduler_name);
    match decision {
        Decision::Bind(node) => {
            let Ok(permit) = sched.bindings.clone().acquire_owned().await else { return };
            let sched = sched.clone();
            tokio::spawn(async move {
                let _permit = permit;
                bind(&sched, &pod, &node).await;
            });
        }
        Decision::Unschedulable { message, candidate, rejected_by, clear_nomination } => {
            let nomination = match candidate {
                Some(c) => match preemption::preempt(&sched.client, &sched.recorder, &pod, &c).await {
                    Ok(()) => Nomination::Set(c.node),
                    Err(e) => {
                        tracing::debug!(pod = %pod.key, error = %e, "preemption failed");
                        Nomination::Keep
                    }
                },
                None if clear_nomination => Nomination::Clear,
                None => Nomination::Keep,
            };
            record_failure(sched, &pod, "Unschedulable", &message, nomination).await;
            let registered = profile.registered_kinds(&rejected_by);
            sched.queue.unschedulable(&pod.uid, cycle, rejected_by, registered);
        }
        Decision::Error(message) => {
            tracing::warn!(pod = %pod.key, error = %message, "scheduling failed");
            record_failure(sched, &pod, "SchedulerError", &message, Nomination::Keep).await;
            sched.queue.retry(&pod.uid);
        }
    }
}

async fn bind(sched: &Scheduler, pod: &PodInfo, node: &str) {
    if let Err(e) = volume_binding::pre_bind(&sched.client, &pod.pod, node).await {
        sched.cache().forget(&pod.uid);
        let message = format!("running PreBind plugin \"VolumeBinding\": {e}");
        sched.recorder.publish(pod.pod.as_ref(), EventType::Warning, "FailedScheduling", &message);
        sched.queue.retry(&pod.uid);
        return;
    }
    let name = pod.pod.metadata.name.clone().unwrap_or_default();
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()),
            ..Default::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_string()),
            ..Default::default()
        },
    };
    let pods: Api<Pod> = Api::namespaced(sched.client.clone(), &pod.namespace);
    match pods.create_subresource::<_, serde_json::Value>("binding", &name, &PostParams::default(), &binding).await {
        Ok(_) => {
            sched.queue.done(&pod.uid);
            let message = format!("Successfully assigned {} to {node}", pod.key);
            sched.recorder.publish(pod.pod.as_ref(), EventType::Normal, "Scheduled", &message);
        }
        Err(e) => {
            sched.cache().forget(&pod.uid);
            match &e {
                // The pod is gone, or someone else bound it: nothing to retry.
                kube::Error::Api(s) if s.code == 404 || s.code == 409 => sched.queue.done(&pod.uid),
                _ => {
                    let message = format!("Binding rejected: {e}");
                    sched.recorder.publish(pod.pod.as_ref(), EventType::Warning, "FailedScheduling", &message);
                    sched.queue.retry(&pod.uid);
                }
            }
        }
    }
}

/// What a failed cycle does to the pod's `status.nominatedNodeName`.
enum Nomination {
    Keep,
    Set(String),
    Clear,
}

/// `PodScheduled=False` with the reason and message (written only when they
/// change), `nominatedNodeName` after preemption, and a FailedScheduling event.
async fn record_failure(sched: &Scheduler, pod: &PodInfo, reason: &str, message: &str, nomination: Nomination) {
    sched.recorder.publish(pod.pod.as_ref(), EventType::Warning, "FailedScheduling", message);
    let current = pod
        .pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
    let same = current.is_some_and(|c| {
        c.status == "False" && c.reason.as_deref() == Some(reason) && c.message.as_deref() == Some(message)
    });
    let nominated_now =
        pod.pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).filter(|n| !n.is_empty());
    let nomination_changes = match &nomination {
        Nomination::Keep => false,
        Nomination::Set(node) => nominated_now != Some(node.as_str()),
        Nomination::Clear => nominated_now.is_some(),
    };
    if same && !nomination_changes {
        return;
    }
    let mut status = serde_json::json!({"conditions": [{
        "type": "PodScheduled",
        "status": "False",
        "reason": reason,
        "message": message,
        "lastProbeTime": null,
        "lastTransitionTime": Time(k8s_openapi::jiff::Timestamp::now()),
    }]});
    match nomination {
        Nomination::Set(node) => status["nominatedNodeName"] = serde_json::Value::String(node),
        Nomination::Clear => status["nominatedNodeName"] = serde_json::Value::Null,
        Nomination::Keep => {}
    }
    let pods: Api<Pod> = Api::namespaced(sched.client.clone(), &pod.namespace);
    let name = pod.pod.metadata.name.as_deref().unwrap_or_default();
    let patch = serde_json::json!({ "status": status });
    if let Err(e) = pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
        tracing::debug!(pod = %pod.key, error = %e, "cannot record the PodScheduled condition");
    }
}

/// The profile `ferrok server` runs unless a KubeSchedulerConfiguration
/// says otherwise: the default scheduler.
pub fn default_profiles() -> Vec<Profile> {
    vec![Profile::new(DEFAULT_SCHEDULER_NAME, plugins::node_resources_fit::ScoringStrategy::LeastAllocated)]
}
