//! NodeLifecycleController: watches each Node's heartbeats — its Lease in
//! `kube-node-lease` and the Ready condition's lastHeartbeatTime — and when
//! neither moves for the grace period marks the node's conditions Unknown
//! ("Kubelet stopped posting node status."). From the conditions it keeps
//! the node's taints: `node.kubernetes.io/unreachable` (Ready Unknown) and
//! `node.kubernetes.io/not-ready` (Ready False) as NoExecute and NoSchedule,
//! the pressure conditions as NoSchedule, and `node.kubernetes.io/unschedulable`
//! mirroring spec.unschedulable. Pods on a node that is not Ready are marked
//! Ready=False. The TaintEvictionController (taint_eviction.rs) evicts the
//! pods that do not tolerate the NoExecute taints.
//!
//! No periodic monitor: each node is requeued at the exact moment its
//! heartbeat would expire.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::controllers::work_queue::{Action, Controller};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::informers::reflected;
use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::sync::LockExt;

/// `--node-monitor-grace-period`: how long a node may go without a heartbeat
/// before it is considered unreachable (40 s upstream).
pub const NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(40);
/// `--node-startup-grace-period`: the same for a node that never reported.
pub const NODE_STARTUP_GRACE_PERIOD: Duration = Duration::from_secs(60);
/// Overrides NODE_MONITOR_GRACE_PERIOD (`"40s"`, `"500ms"` or seconds), for tests.
pub const GRACE_PERIOD_ENV: &str = "FERROK_NODE_MONITOR_GRACE_PERIOD";
/// Overrides NODE_STARTUP_GRACE_PERIOD, for tests.
pub const STARTUP_GRACE_PERIOD_ENV: &str = "FERROK_NODE_STARTUP_GRACE_PERIOD";
/// Where kubelets keep their heartbeat Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
const TAINT_MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
const TAINT_DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
const TAINT_PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// Conditions the controller sets Unknown when the kubelet goes silent.
const KUBELET_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

fn env_duration(name: &str, default: Duration) -> Duration {
    std::env::var(name).ok().and_then(|v| crate::duration::parse_seconds_or_go(&v).ok()).unwrap_or(default)
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

/// The taints the node's conditions and spec call for: (key, effect).
pub fn desired_taints(node: &Node) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    let status = |t: &str| condition(node, t).map(|c| c.status.as_str());
    match status("Ready") {
        Some("False") => out.extend([(TAINT_NOT_READY, "NoExecute"), (TAINT_NOT_READY, "NoSchedule")]),
        Some("Unknown") => out.extend([(TAINT_UNREACHABLE, "NoExecute"), (TAINT_UNREACHABLE, "NoSchedule")]),
        _ => {}
    }
    for (cond, key) in [
        ("MemoryPressure", TAINT_MEMORY_PRESSURE),
        ("DiskPressure", TAINT_DISK_PRESSURE),
        ("PIDPressure", TAINT_PID_PRESSURE),
        ("NetworkUnavailable", TAINT_NETWORK_UNAVAILABLE),
    ] {
        if status(cond) == Some("True") {
            out.push((key, "NoSchedule"));
        }
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        out.push((TAINT_UNSCHEDULABLE, "NoSchedule"));
    }
    out
}

/// The node's taints with the controller-managed ones brought in line with
/// `desired`; `None` when nothing changes.
pub fn reconcile_taints(current: &[Taint], desired: &[(&str, &str)], now: Timestamp) -> Option<Vec<Taint>> {
    const MANAGED: [&str; 7] = [
        TAINT_NOT_READY,
        TAINT_UNREACHABLE,
        TAINT_UNSCHEDULABLE,
        TAINT_MEMORY_PRESSURE,
        TAINT_DISK_PRESSURE,
        TAINT_PID_PRESSURE,
        TAINT_NETWORK_UNAVAILABLE,
    ];
    let managed = |t: &Taint| {
        MANAGED.contains(&t.key.as_str())
            && (t.effect == "NoSchedule"
                || (t.effect == "NoExecute" && (t.key == TAINT_NOT_READY || t.key == TAINT_UNREACHABLE)))
    };
    let mut out: Vec<Taint> = current
        .iter()
        .filter(|t| !managed(t) || desired.iter().any(|(k, e)| t.key == *k && t.effect == *e))
        .cloned()
        .collect();
    for (key, effect) in desired {
        if !out.iter().any(|t| t.key == *key && t.effect == *effect) {
            out.push(Taint {
                key: (*key).into(),
                effect: (*effect).into(),
                time_added: (*effect == "NoExecute").then_some(Time(now)),
                value: None,
            });
        }
    }
    (out != current).then_some(out)
}

/// The last heartbeat seen for a node, and when this controller saw it move.
struct Health {
    probe: (Option<String>, Option<String>),
    observed: Instant,
}

struct Context {
    client: kube::Client,
    nodes: Store<Node>,
    leases: Store<Lease>,
    pods: Store<Pod>,
    health: Mutex<HashMap<String, Health>>,
    grace: Duration,
    startup_grace: Duration,
    recorder: EventRecorder,
}

/// When the node's heartbeat runs out (as an Instant).
fn heartbeat_deadline(ctx: &Context, node: &Node, now: Instant) -> Result<Instant, ControllerError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let lease = ctx.leases.get(&ObjectRef::new(&name).within(NODE_LEASE_NAMESPACE));
    let renew = lease.and_then(|l| l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0.to_string()));
    let ready = condition(node, "Ready");
    let heartbeat = ready.and_then(|c| c.last_heartbeat_time.as_ref().map(|t| t.0.to_string()));
    let probe = (renew, heartbeat);
    let mut health = ctx.health.locked();
    // Forget nodes that are gone.
    health.retain(|n, _| ctx.nodes.get(&ObjectRef::new(n)).is_some());
    let entry = health.entry(name).or_insert_with(|| {
        // A node that never reported counts from its creation.
        let age = match (ready, node.metadata.creation_timestamp.as_ref()) {
            (None, Some(created)) => {
                let ms = Timestamp::now().as_millisecond() - created.0.as_millisecond();
                Duration::from_millis(ms.max(0) as u64)
            }
            _ => Duration::ZERO,
        };
        Health { probe: probe.clone(), observed: now.checked_sub(age).unwrap_or(now) }
    });
    if entry.probe != probe {
        entry.probe = probe;
        entry.observed = now;
    }
    let grace = if ready.is_none() { ctx.startup_grace } else { ctx.grace };
    Ok(entry.observed + grace)
}

/// The node's status with the kubelet's conditions set Unknown.
fn mark_unknown(node: &Node, now: Timestamp) -> Option<Node> {
    let mut updated = node.clone();
    let status = updated.status.get_or_insert_with(Default::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let mut changed = false;
    for type_ in KUBELET_CONDITIONS {
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) if c.status != "Unknown" => {
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                c.last_transition_time = Some(Time(now));
                changed = true;
            }
            Some(_) => {}
            None => {
                conditions.push(NodeCondition {
                    type_: type_.into(),
                    status: "Unknown".into(),
                    reason: Some("NodeStatusNeverUpdated".into()),
                    message: Some("Kubelet never posted node status.".into()),
                    last_heartbeat_time: node.metadata.creation_timestamp.clone(),
                    last_transition_time: Some(Time(now)),
                });
                changed = true;
            }
        }
    }
    changed.then_some(updated)
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    if node.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.leases).await;
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.pods).await;
    let api: Api<Node> = Api::all(ctx.client.clone());
    let now = Instant::now();
    let deadline = heartbeat_deadline(&ctx, &node, now)?;
    let was_ready = condition(&node, "Ready").map(|c| c.status.clone());

    // 1. Heartbeats ran out: the kubelet's conditions become Unknown.
    if now >= deadline {
        if let Some(updated) = mark_unknown(&node, Timestamp::now()) {
            match api.replace_status(&name, &PostParams::default(), &updated).await {
                Ok(_) => {
                    tracing::info!(node = %name, "node stopped posting status; marked Unknown");
                    if was_ready.as_deref() == Some("True") {
                        ctx.recorder.publish(
                            &*node,
                            EventType::Normal,
                            "NodeNotReady",
                            &format!("Node {name} status is now: NodeNotReady"),
                        );
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Action::requeue(Duration::from_millis(100))),
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
                Err(e) => return Err(e.into()),
            }
            // The write comes back through the watch, and the taints follow.
            return Ok(Action::await_change());
        }
    }

    // 2. Taints follow the conditions and spec.unschedulable.
    let current = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    if let Some(taints) = reconcile_taints(&current, &desired_taints(&node), Timestamp::now()) {
        let mut updated = (*node).clone();
        updated.spec.get_or_insert_with(Default::default).taints = (!taints.is_empty()).then_some(taints);
        updated.metadata.managed_fields = None;
        match api.replace(&name, &PostParams::default(), &updated).await {
            Ok(_) => tracing::info!(node = %name, "updated node taints"),
            Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Action::requeue(Duration::from_millis(100))),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }

    // 3. Pods on a node that is not Ready are not ready either.
    if matches!(was_ready.as_deref(), Some("False") | Some("Unknown")) {
        mark_pods_not_ready(&ctx, &name).await?;
    }

    if now >= deadline {
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(deadline - now + Duration::from_millis(10)))
}

/// upstream's `MarkPodsNotReady`: each pod bound to the node gets Ready=False.
async fn mark_pods_not_ready(ctx: &Context, node: &str) -> Result<(), ControllerError> {
    let pods = ctx.pods.state_filter(|p| {
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node) && super::controller_utils::is_pod_ready(p)
    });
    for pod in pods {
        let mut updated = (*pod).clone();
        let now = Timestamp::now();
        for c in updated.status.iter_mut().flat_map(|s| s.conditions.iter_mut().flatten()) {
            if c.type_ == "Ready" {
                c.status = "False".into();
                c.last_transition_time = Some(Time(now));
            }
        }
        updated.metadata.managed_fields = None;
        let (ns, name) =
            (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default());
        match Api::<Pod>::namespaced(ctx.client.clone(), &ns)
            .replace_status(&name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {
                tracing::debug!(pod = %name, namespace = %ns, %node, "marked pod not ready");
                ctx.recorder.publish(&*pod, EventType::Warning, "NodeNotReady", "Node is not ready");
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn error_policy(_node: Arc<Node>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "node lifecycle reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// A pod bound to a node and Ready: the pods this controller marks when
/// their node is not.
fn ready_on_node(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty())
        && super::controller_utils::is_pod_ready(pod)
}

/// `client` is the controller's own (`node-controller`); `informers` the
/// controller manager's, through which it watches the node Leases (which
/// upstream's node-controller role does not cover: it reads them from the
/// manager's shared informer too).
pub async fn run(
    client: kube::Client,
    informers: crate::client::informer_factory::SharedInformerFactory,
    pod_informer: super::informers::Informer<Pod>,
) {
    let (leases, lease_events) = reflected(
        Api::<Lease>::namespaced(informers.client().clone(), NODE_LEASE_NAMESPACE),
        watcher::Config::default(),
    );
    // A pod that is Ready on a node that is not gets marked: other pod
    // changes are not sent here.
    let (pods, pod_events) = pod_informer.only(ready_on_node).into_shared_parts();
    let (nodes, node_events) = informers.informer::<Node>().subscribe().into_parts();
    let queue = QueueMetrics::new("node_lifecycle_controller", nodes.clone());
    let ctx = Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), "node-controller"),
        client: client.clone(),
        nodes: nodes.clone(),
        leases,
        pods,
        health: Mutex::new(HashMap::new()),
        grace: env_duration(GRACE_PERIOD_ENV, NODE_MONITOR_GRACE_PERIOD),
        startup_grace: env_duration(STARTUP_GRACE_PERIOD_ENV, NODE_STARTUP_GRACE_PERIOD),
    });
    let results = Controller::for_stream(queue.primary(node_events), nodes)
        .watches_stream(
            lease_events,
            queue.mapped(|lease: Lease| lease.metadata.name.map(|n| ObjectRef::<Node>::new(&n))),
        )
        .watches_shared_stream(
            pod_events,
            queue.mapped(|pod: Arc<Pod>| {
                let node = pod.spec.as_ref()?.node_name.as_deref()?;
                ready_on_node(&pod).then(|| ObjectRef::<Node>::new(node))
            }),
        )
        .run(queue.timed(reconcile), queue.retried(error_policy), ctx);
    drain("node_lifecycle_controller", results).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: Option<&str>, unschedulable: bool) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"unschedulable": unschedulable},
            "status": {"conditions": ready.map(|s| vec![serde_json::json!({"type": "Ready", "status": s})]).unwrap_or_default()}
        }))
        .unwrap()
    }

    #[test]
    fn taints_follow_conditions() {
        assert!(desired_taints(&node(Some("True"), false)).is_empty());
        assert!(desired_taints(&node(None, false)).is_empty());
        assert_eq!(
            desired_taints(&node(Some("Unknown"), true)),
            vec![
                (TAINT_UNREACHABLE, "NoExecute"),
                (TAINT_UNREACHABLE, "NoSchedule"),
                (TAINT_UNSCHEDULABLE, "NoSchedule")
            ]
        );
        let now = Timestamp::now();
        let user =
            Taint { key: "dedicated".into(), effect: "NoSchedule".into(), value: Some("x".into()), time_added: None };
        let t =
            reconcile_taints(std::slice::from_ref(&user), &desired_taints(&node(Some("False"), false)), now).unwrap();
        assert_eq!(t.len(), 3);
        assert!(t.iter().any(|t| t.key == TAINT_NOT_READY && t.effect == "NoExecute" && t.time_added.is_some()));
        // Recovery removes the managed taints, keeps the user's.
        assert_eq!(reconcile_taints(&t, &[], now).unwrap(), vec![user.clone()]);
        assert_eq!(reconcile_taints(&[user], &[], now), None);
    }

    #[test]
    fn durations() {
        assert_eq!(crate::duration::parse_seconds_or_go("40s").ok(), Some(Duration::from_secs(40)));
        assert_eq!(crate::duration::parse_seconds_or_go("1500ms").ok(), Some(Duration::from_millis(1500)));
        assert_eq!(crate::duration::parse_seconds_or_go("3").ok(), Some(Duration::from_secs(3)));
        assert_eq!(crate::duration::parse_seconds_or_go("2m").ok(), Some(Duration::from_secs(120)));
        assert_eq!(crate::duration::parse_seconds_or_go("x").ok(), None);
    }

    #[test]
    fn silent_kubelet_conditions_become_unknown() {
        let n = node(Some("True"), false);
        let u = mark_unknown(&n, Timestamp::now()).unwrap();
        let ready = condition(&u, "Ready").unwrap();
        assert_eq!(ready.status, "Unknown");
        assert_eq!(ready.message.as_deref(), Some("Kubelet stopped posting node status."));
        assert_eq!(condition(&u, "MemoryPressure").unwrap().reason.as_deref(), Some("NodeStatusNeverUpdated"));
        assert!(mark_unknown(&u, Timestamp::now()).is_none());
    }
}
