//! TaintEvictionController: a pod bound to a node with NoExecute taints is
//! deleted unless it tolerates all of them; when it tolerates them only for
//! a while (`tolerationSeconds`), it is deleted once the shortest of those
//! runs out, counted from when the taints were added. Before deleting, the
//! pod gets the DisruptionTarget condition, as upstream does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::controllers::work_queue::{Action, Controller};
use k8s_openapi::api::core::v1::{Node, Pod, PodCondition, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};

use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::scheduling::tolerates;
use crate::sync::LockExt;

/// How long the pod may stay: `None` = evict now, `Some(None)` = forever,
/// `Some(Some(d))` = for `d` (upstream's GetMatchingTolerations and
/// getMinTolerationTime: the first toleration matching each taint counts).
pub fn toleration_time(taints: &[&Taint], tolerations: &[Toleration]) -> Option<Option<Duration>> {
    let mut min: Option<Duration> = None;
    for taint in taints {
        let used = tolerations.iter().find(|t| tolerates(t, taint))?;
        if let Some(secs) = used.toleration_seconds {
            let d = Duration::from_secs(secs.max(0) as u64);
            min = Some(min.map_or(d, |m| m.min(d)));
        }
    }
    Some(min)
}

struct Context {
    client: kube::Client,
    nodes: Store<Node>,
    /// When a pod was first seen on a tainted node, for taints without timeAdded.
    first_seen: Mutex<HashMap<String, Timestamp>>,
    recorder: EventRecorder,
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(Action::await_change());
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.nodes).await;
    let node = ctx.nodes.get(&ObjectRef::new(&node_name));
    let taints: Vec<Taint> = node.and_then(|n| n.spec.as_ref()?.taints.clone()).unwrap_or_default();
    match decide(&ctx, &uid, &no_execute_of(&taints), &pod)? {
        Some(action) => Ok(action),
        None => {
            evict(&ctx, &pod).await?;
            Ok(Action::await_change())
        }
    }
}

fn no_execute_of(taints: &[Taint]) -> Vec<&Taint> {
    taints.iter().filter(|t| t.effect == "NoExecute").collect()
}

/// What to do with the pod: `None` = evict now.
fn decide(ctx: &Context, uid: &str, no_execute: &[&Taint], pod: &Pod) -> Result<Option<Action>, ControllerError> {
    let mut seen = ctx.first_seen.locked();
    if no_execute.is_empty() {
        seen.remove(uid);
        return Ok(Some(Action::await_change()));
    }
    let now = Timestamp::now();
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.clone()).unwrap_or_default();
    match toleration_time(no_execute, &tolerations) {
        None => Ok(None),
        Some(None) => {
            seen.remove(uid);
            Ok(Some(Action::await_change()))
        }
        Some(Some(d)) => {
            let added = no_execute.iter().filter_map(|t| t.time_added.as_ref().map(|t| t.0)).min();
            let since = match added {
                Some(t) => {
                    seen.remove(uid);
                    t
                }
                None => *seen.entry(uid.to_string()).or_insert(now),
            };
            let due = since.as_millisecond() + d.as_millis() as i64;
            if due > now.as_millisecond() {
                return Ok(Some(Action::requeue(Duration::from_millis((due - now.as_millisecond()) as u64 + 10))));
            }
            Ok(None)
        }
    }
}

async fn evict(ctx: &Context, pod: &Pod) -> Result<(), ControllerError> {
    let (ns, name) =
        (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default());
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    ctx.recorder.publish(
        pod,
        EventType::Normal,
        "TaintManagerEviction",
        &format!("Marking for deletion Pod {ns}/{name}"),
    );
    let mut updated = pod.clone();
    let conditions = updated.status.get_or_insert_with(Default::default).conditions.get_or_insert_with(Vec::new);
    if !conditions.iter().any(|c| c.type_ == "DisruptionTarget" && c.status == "True") {
        conditions.retain(|c| c.type_ != "DisruptionTarget");
        conditions.push(PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("DeletionByTaintManager".into()),
            message: Some("Taint manager: deleting due to NoExecute taint".into()),
            last_transition_time: Some(Time(Timestamp::now())),
            ..Default::default()
        });
        updated.metadata.managed_fields = None;
        match api.replace_status(&name, &PostParams::default(), &updated).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Err(ControllerError::Invalid(format!("pod {ns}/{name} changed; retrying its eviction")))
            }
            Err(e) => return Err(e.into()),
        }
    }
    let dp = crate::controllers::controller_utils::delete_only_uid(pod.metadata.uid.clone());
    match api.delete(&name, &dp).await {
        Ok(_) => tracing::info!(pod = %name, namespace = %ns, "evicted pod from a NoExecute-tainted node"),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

fn error_policy(_pod: Arc<Pod>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "taint eviction reconcile failed; retrying");
    Action::requeue(Duration::from_secs(1))
}

/// Whether a Node update leaves its NoExecute taints as they were (a
/// heartbeat, a label): nothing for this controller to look at again.
fn same_no_execute_taints(old: &Node, new: &Node) -> bool {
    let taints = |n: &Node| n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    let (old, new) = (taints(old), taints(new));
    no_execute_of(&old) == no_execute_of(&new)
}

/// Whether `pod` is bound, not being deleted, to a node that (as the node
/// informer has it) has NoExecute taints.
fn on_tainted_node(nodes: &Store<Node>, pod: &Pod) -> bool {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { return false };
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let node = nodes.get(&ObjectRef::new(node));
    node.is_some_and(|n| n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|t| !no_execute_of(t).is_empty()))
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (nodes, node_events) =
        informers.informer::<Node>().subscribe().skip_updates(same_no_execute_taints).into_parts();
    // A pod asks for a look only when bound to a node that has NoExecute
    // taints (what reconcile would act on); a node whose taints change
    // brings its pods in through the node watch below.
    let tainted = nodes.clone();
    let (pods, pod_events) =
        informers.informer::<Pod>().subscribe().only(move |pod| on_tainted_node(&tainted, pod)).into_shared_parts();
    let pods_by_node = informers.pods_by_node();
    let queue = QueueMetrics::new("noexec_taint_pod", pods.clone());
    let ctx = Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), "taint-eviction-controller"),
        client,
        nodes,
        first_seen: Mutex::new(HashMap::new()),
    });
    let results = Controller::for_shared_stream(queue.primary_shared(pod_events), pods)
        .watches_stream(
            node_events,
            queue.mapped(move |node: Node| {
                let name = node.metadata.name.clone().unwrap_or_default();
                pods_by_node.get(&name).iter().map(|p| ObjectRef::from_obj(&**p)).collect::<Vec<_>>()
            }),
        )
        .run(queue.timed(reconcile), queue.retried(error_policy), ctx);
    drain("noexec_taint_pod", results).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str) -> Taint {
        Taint { key: key.into(), effect: "NoExecute".into(), value: None, time_added: None }
    }

    fn toleration(key: &str, op: &str, secs: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some(op.into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: secs,
            value: None,
        }
    }

    /// Only a change of NoExecute taints wakes the controller for a node's pods.
    #[test]
    fn node_updates_without_no_execute_changes_are_skipped() {
        let node = |taints: Vec<Taint>, heartbeat: &str| {
            let mut n = Node::default();
            n.metadata.resource_version = Some(heartbeat.into());
            n.spec = Some(k8s_openapi::api::core::v1::NodeSpec { taints: Some(taints), ..Default::default() });
            n
        };
        let no_schedule = Taint { effect: "NoSchedule".into(), ..taint("y") };
        assert!(same_no_execute_taints(&node(vec![taint("x")], "1"), &node(vec![taint("x")], "2")));
        assert!(same_no_execute_taints(&node(vec![], "1"), &node(vec![no_schedule], "2")));
        assert!(!same_no_execute_taints(&node(vec![], "1"), &node(vec![taint("x")], "2")));
    }

    /// Pod events reach reconcile only from bound, live pods of NoExecute-tainted nodes.
    #[test]
    fn only_pods_on_tainted_nodes_are_looked_at() {
        use kube::runtime::watcher::Event;
        let mut writer = kube::runtime::reflector::store::Writer::<Node>::default();
        for (name, taints) in
            [("tainted", vec![taint("x")]), ("no-schedule", vec![Taint { effect: "NoSchedule".into(), ..taint("y") }])]
        {
            let mut n = Node::default();
            n.metadata.name = Some(name.into());
            n.spec = Some(k8s_openapi::api::core::v1::NodeSpec { taints: Some(taints), ..Default::default() });
            writer.apply_watcher_event(&Event::Apply(n));
        }
        let nodes = writer.as_reader();
        let pod = |node: Option<&str>, deleting: bool| {
            let spec = k8s_openapi::api::core::v1::PodSpec { node_name: node.map(Into::into), ..Default::default() };
            let mut p = Pod { spec: Some(spec), ..Default::default() };
            p.metadata.deletion_timestamp = deleting.then(|| Time(Timestamp::now()));
            p
        };
        assert!(on_tainted_node(&nodes, &pod(Some("tainted"), false)));
        assert!(!on_tainted_node(&nodes, &pod(Some("tainted"), true)), "being deleted");
        assert!(!on_tainted_node(&nodes, &pod(None, false)), "unbound");
        assert!(!on_tainted_node(&nodes, &pod(Some("no-schedule"), false)), "no NoExecute taint");
        assert!(
            !on_tainted_node(&nodes, &pod(Some("unknown"), false)),
            "a node not seen yet comes in by its own event"
        );
    }

    #[test]
    fn tolerations_as_upstream() {
        let unreachable = taint("node.kubernetes.io/unreachable");
        let other = taint("x");
        assert_eq!(toleration_time(&[&unreachable], &[]), None);
        let t300 = toleration("node.kubernetes.io/unreachable", "Exists", Some(300));
        assert_eq!(toleration_time(&[&unreachable], std::slice::from_ref(&t300)), Some(Some(Duration::from_secs(300))));
        assert_eq!(toleration_time(&[&unreachable, &other], std::slice::from_ref(&t300)), None);
        let all = Toleration { operator: Some("Exists".into()), ..Default::default() };
        assert_eq!(toleration_time(&[&unreachable, &other], &[all]), Some(None));
        // The first matching toleration counts.
        let forever = toleration("node.kubernetes.io/unreachable", "Exists", None);
        assert_eq!(toleration_time(&[&unreachable], &[forever, t300]), Some(None));
        let eq = Toleration { key: Some("x".into()), value: Some("v".into()), ..Default::default() };
        assert!(!tolerates(&eq, &other));
    }
}
