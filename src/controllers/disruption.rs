//! DisruptionController: the status of each PodDisruptionBudget —
//! expectedPods, currentHealthy, desiredHealthy, disruptionsAllowed and the
//! DisruptionAllowed condition — from the pods it selects and, for
//! percentages and maxUnavailable, the scale of the pods' controllers.
//! Entries of `status.disruptedPods` (written by the eviction subresource)
//! are dropped once the pod is deleting or gone, or after two minutes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::{Action, Controller};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::controller_utils::{controller_of, is_pod_ready, relabelled};
use super::informers::reflected;
use super::queue_metrics::{drain, QueueMetrics};
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::labels;

/// How long an eviction's entry in `disruptedPods` waits for the pod to go.
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// upstream's `GetScaledValueFromIntOrPercent` (rounding up).
pub fn scaled_value(v: &IntOrString, total: i32) -> Result<i32, ControllerError> {
    match v {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let pct: i64 = s.strip_suffix('%').and_then(|p| p.parse().ok()).ok_or_else(|| {
                ControllerError::Invalid(format!("invalid value for IntOrString: invalid value {s:?}"))
            })?;
            Ok(((pct * i64::from(total) + 99) / 100) as i32)
        }
    }
}

/// (expectedCount, desiredHealthy) from the spec and the controllers' scale.
pub fn expected_and_desired(
    min_available: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    pod_count: i32,
    scale: impl FnOnce() -> Result<i32, ControllerError>,
) -> Result<(i32, i32), ControllerError> {
    if let Some(max) = max_unavailable {
        let expected = scale()?;
        let max = scaled_value(max, expected)?;
        Ok((expected, (expected - max).max(0)))
    } else if let Some(min) = min_available {
        match min {
            IntOrString::Int(n) => Ok((pod_count, *n)),
            IntOrString::String(_) => {
                let expected = scale()?;
                Ok((expected, scaled_value(min, expected)?))
            }
        }
    } else {
        Ok((pod_count, 0))
    }
}

struct Context {
    client: kube::Client,
    pods: Store<Pod>,
    recorder: EventRecorder,
}

/// The scale of each distinct controller of `pods` (a ReplicaSet owned by
/// a Deployment counts as that Deployment), and the unmanaged pods.
async fn expected_scale(ctx: &Context, ns: &str, pods: &[Arc<Pod>]) -> Result<(i32, Vec<String>), ControllerError> {
    let mut scales: HashMap<String, i32> = HashMap::new();
    let mut unmanaged = Vec::new();
    let mut seen: HashMap<String, ()> = HashMap::new();
    for pod in pods {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let Some(owner) = controller_of(&pod.metadata) else {
            unmanaged.push(pod_name);
            continue;
        };
        if seen.insert(owner.uid.clone(), ()).is_some() {
            continue;
        }
        let not_found = || ControllerError::Invalid(format!("found no controllers for pod {pod_name:?}"));
        let found = match (owner.api_version.as_str(), owner.kind.as_str()) {
            ("apps/v1", "ReplicaSet") => {
                let rs = Api::<ReplicaSet>::namespaced(ctx.client.clone(), ns).get_opt(&owner.name).await?;
                let rs = rs.filter(|r| r.metadata.uid.as_deref() == Some(&owner.uid)).ok_or_else(not_found)?;
                match controller_of(&rs.metadata).filter(|o| o.kind == "Deployment" && o.api_version == "apps/v1") {
                    Some(d) => {
                        let dep = Api::<Deployment>::namespaced(ctx.client.clone(), ns).get_opt(&d.name).await?;
                        let dep = dep.filter(|x| x.metadata.uid.as_deref() == Some(&d.uid)).ok_or_else(not_found)?;
                        (d.uid.clone(), dep.spec.and_then(|s| s.replicas).unwrap_or(1))
                    }
                    None => (owner.uid.clone(), rs.spec.and_then(|s| s.replicas).unwrap_or(1)),
                }
            }
            ("apps/v1", "StatefulSet") => {
                let ss = Api::<StatefulSet>::namespaced(ctx.client.clone(), ns).get_opt(&owner.name).await?;
                let ss = ss.filter(|r| r.metadata.uid.as_deref() == Some(&owner.uid)).ok_or_else(not_found)?;
                (owner.uid.clone(), ss.spec.and_then(|s| s.replicas).unwrap_or(1))
            }
            ("v1", "ReplicationController") => {
                let rc = Api::<ReplicationController>::namespaced(ctx.client.clone(), ns).get_opt(&owner.name).await?;
                let rc = rc.filter(|r| r.metadata.uid.as_deref() == Some(&owner.uid)).ok_or_else(not_found)?;
                (owner.uid.clone(), rc.spec.and_then(|s| s.replicas).unwrap_or(1))
            }
            _ => return Err(not_found()),
        };
        scales.insert(found.0, found.1);
    }
    Ok((scales.values().sum(), unmanaged))
}

fn condition(
    allowed: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    old: Option<&Condition>,
) -> Condition {
    let status = if allowed { "True" } else { "False" };
    let since = old.filter(|c| c.status == status).map(|c| c.last_transition_time.clone());
    Condition {
        type_: "DisruptionAllowed".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: since.unwrap_or(Time(Timestamp::now())),
    }
}

async fn reconcile(pdb: Arc<PodDisruptionBudget>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    let (Some(ns), Some(name)) = (pdb.metadata.namespace.clone(), pdb.metadata.name.clone()) else {
        return Ok(Action::await_change());
    };
    if pdb.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let _ = crate::client::cache_sync::wait_for_cache_sync(&ctx.pods).await;
    let spec = pdb.spec.clone().unwrap_or_default();
    let pods: Vec<Arc<Pod>> = match &spec.selector {
        // policy/v1: a null selector selects nothing, an empty one everything.
        None => Vec::new(),
        Some(sel) => ctx.pods.state_filter(|p| {
            p.metadata.namespace.as_deref() == Some(ns.as_str()) && labels::matches(sel, p.metadata.labels.as_ref())
        }),
    };
    if pods.is_empty() {
        ctx.recorder.publish(&*pdb, EventType::Normal, "NoPods", "No matching pods found");
    }
    let old = pdb.status.clone().unwrap_or_default();
    let generation = pdb.metadata.generation;
    let old_condition = old.conditions.iter().flatten().find(|c| c.type_ == "DisruptionAllowed");
    let now = Timestamp::now();

    let mut unmanaged = Vec::new();
    let counts =
        expected_and_desired(spec.min_available.as_ref(), spec.max_unavailable.as_ref(), pods.len() as i32, || Ok(0));
    let needs_scale = spec.max_unavailable.is_some() || matches!(spec.min_available, Some(IntOrString::String(_)));
    let counts = match (counts, needs_scale) {
        (Err(e), _) => Err(e),
        (Ok(c), false) => Ok(c),
        (Ok(_), true) => match expected_scale(&ctx, &ns, &pods).await {
            Ok((scale, u)) => {
                unmanaged = u;
                expected_and_desired(
                    spec.min_available.as_ref(),
                    spec.max_unavailable.as_ref(),
                    pods.len() as i32,
                    || Ok(scale),
                )
            }
            Err(ControllerError::Kube(e)) => return Err(ControllerError::Kube(e)),
            Err(e) => Err(e),
        },
    };
    if !unmanaged.is_empty() {
        ctx.recorder.publish(
            &*pdb,
            EventType::Warning,
            "UnmanagedPods",
            &format!(
                "Pods selected by this PodDisruptionBudget (selector: {}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.",
                spec.selector.as_ref().map(labels::to_query).unwrap_or_default()
            ),
        );
    }

    // disruptedPods: keep entries of selected pods that are not deleting yet
    // and whose two minutes have not run out.
    let mut disrupted = BTreeMap::new();
    let mut recheck: Option<Timestamp> = None;
    for pod in &pods {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let Some(at) = old.disrupted_pods.as_ref().and_then(|m| m.get(&pod_name)) else { continue };
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let expires = at.0 + DELETION_TIMEOUT;
        if expires <= now {
            ctx.recorder.publish(
                &**pod,
                EventType::Warning,
                "NotDeleted",
                &format!("Pod was expected by PDB {ns}/{name} to be deleted but it wasn't"),
            );
            continue;
        }
        recheck = Some(recheck.map_or(expires, |r| r.min(expires)));
        disrupted.insert(pod_name, at.clone());
    }
    let current_healthy = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !disrupted.contains_key(p.metadata.name.as_deref().unwrap_or_default()))
        .filter(|p| is_pod_ready(p))
        .count() as i32;

    let status = match counts {
        Ok((expected, desired)) => {
            let allowed = if expected <= 0 { 0 } else { (current_healthy - desired).max(0) };
            let (reason, ok) = if allowed > 0 { ("SufficientPods", true) } else { ("InsufficientPods", false) };
            PodDisruptionBudgetStatus {
                current_healthy,
                desired_healthy: desired,
                expected_pods: expected,
                disruptions_allowed: allowed,
                disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
                observed_generation: generation,
                conditions: Some(vec![condition(ok, reason, "", generation, old_condition)]),
            }
        }
        Err(e) => {
            ctx.recorder.publish(
                &*pdb,
                EventType::Warning,
                "CalculateExpectedPodCountFailed",
                &format!("Failed to calculate the number of expected pods: {e}"),
            );
            PodDisruptionBudgetStatus {
                current_healthy,
                desired_healthy: old.desired_healthy,
                expected_pods: old.expected_pods,
                disruptions_allowed: 0,
                disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
                observed_generation: generation,
                conditions: Some(vec![condition(false, "SyncFailed", &e.to_string(), generation, old_condition)]),
            }
        }
    };
    let next = recheck.map(|r| {
        Action::requeue(Duration::from_millis((r.as_millisecond() - now.as_millisecond()).max(0) as u64 + 10))
    });
    if pdb.status.as_ref() == Some(&status) {
        return Ok(next.unwrap_or_else(Action::await_change));
    }
    let mut updated = (*pdb).clone();
    updated.status = Some(status);
    updated.metadata.managed_fields = None;
    let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), &ns);
    match api.replace_status(&name, &PostParams::default(), &updated).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Action::requeue(Duration::from_millis(200))),
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
        Err(e) => return Err(e.into()),
    }
    Ok(next.unwrap_or_else(Action::await_change))
}

fn error_policy(_pdb: Arc<PodDisruptionBudget>, err: &ControllerError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, "disruption budget reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// Whether `budget` is in `pod`'s namespace and its selector matches the pod.
fn selects(budget: &PodDisruptionBudget, pod: &Pod) -> bool {
    budget.metadata.namespace == pod.metadata.namespace
        && budget
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|s| labels::matches(s, pod.metadata.labels.as_ref()))
}

/// The budgets in `pod`'s namespace that select it.
fn budgets_of(pod: &Pod, budgets: &Store<PodDisruptionBudget>) -> Vec<ObjectRef<PodDisruptionBudget>> {
    budgets.state().iter().filter(|b| selects(b, pod)).map(|b| ObjectRef::from_obj(&**b)).collect()
}

pub async fn run(client: kube::Client, pod_informer: super::informers::Informer<Pod>) {
    let (budgets, budget_events) =
        reflected(Api::<PodDisruptionBudget>::all(client.clone()), watcher::Config::default());
    let selecting = budgets.clone();
    let (pods, pod_events) = pod_informer
        .only(move |pod| selecting.find(|b| selects(b, pod)).is_some())
        .into_shared_parts_and_old(relabelled);
    let queue = QueueMetrics::new("disruption", budgets.clone());
    let ctx = Arc::new(Context { recorder: EventRecorder::new(client.clone(), "controllermanager"), client, pods });
    let by_pod = budgets.clone();
    let results = Controller::for_stream(queue.primary(budget_events), budgets)
        .watches_shared_stream(pod_events, queue.mapped(move |pod: Arc<Pod>| budgets_of(&pod, &by_pod)))
        .run(queue.timed(reconcile), queue.retried(error_policy), ctx);
    drain("disruption", results).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_from_ints_and_percentages() {
        let int = IntOrString::Int;
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(expected_and_desired(Some(&int(2)), None, 3, || Ok(5)).unwrap(), (3, 2));
        assert_eq!(expected_and_desired(Some(&pct("50%")), None, 3, || Ok(5)).unwrap(), (5, 3));
        assert_eq!(expected_and_desired(None, Some(&int(1)), 3, || Ok(4)).unwrap(), (4, 3));
        assert_eq!(expected_and_desired(None, Some(&pct("30%")), 3, || Ok(4)).unwrap(), (4, 2));
        assert_eq!(expected_and_desired(None, Some(&int(9)), 3, || Ok(4)).unwrap(), (4, 0));
        assert!(scaled_value(&pct("x%"), 3).is_err());
    }
}
