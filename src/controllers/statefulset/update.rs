//! Upstream's updateStatefulSet: the set's pods by ordinal, the scale steps
//! (create missing ordinals, replace finished pods, delete the condemned
//! from the highest ordinal), then one step of the rolling update, carried
//! out in order until the first wait.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};

use super::pod_control::StatefulPodControl;
use super::pods::{is_failed, is_running_and_ready, is_succeeded, is_terminating, ordinal_of, revision_of};
use super::{Context, SetRevisions};
use crate::controllers::ControllerError;

/// What one pass decided to do, in upstream's order.
pub(super) enum Step {
    Create(i32),
    Delete(Arc<Pod>, &'static str),
    Wait,
}

/// The set's pods by ordinal: those in range, and the condemned beyond it.
pub(super) struct SetPods {
    pub start: i32,
    pub replicas: i32,
    pub slots: BTreeMap<i32, Arc<Pod>>,
    /// Highest ordinal first.
    pub condemned: Vec<(i32, Arc<Pod>)>,
}

impl SetPods {
    pub fn by_ordinal(name: &str, spec: &StatefulSetSpec, owned: Vec<Arc<Pod>>) -> Self {
        let start = spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0);
        let replicas = spec.replicas.unwrap_or(1).max(0);
        let mut slots: BTreeMap<i32, Arc<Pod>> = BTreeMap::new();
        let mut condemned: Vec<(i32, Arc<Pod>)> = Vec::new();
        for pod in owned {
            let Some(ord) = ordinal_of(name, pod.metadata.name.as_deref().unwrap_or_default()) else { continue };
            if ord >= start && ord < start + replicas {
                slots.insert(ord, pod);
            } else {
                condemned.push((ord, pod));
            }
        }
        condemned.sort_by_key(|c| std::cmp::Reverse(c.0));
        SetPods { start, replicas, slots, condemned }
    }
}

/// How the spec says to update: its podManagementPolicy and updateStrategy.
pub(super) struct UpdatePolicy {
    /// OrderedReady (not Parallel).
    pub monotonic: bool,
    /// RollingUpdate (not OnDelete).
    pub rolling: bool,
    /// RollingUpdate without its parameters (as older objects have it).
    pub rolling_without_parameters: bool,
    pub partition: i32,
}

impl UpdatePolicy {
    pub fn of(spec: &StatefulSetSpec) -> Self {
        let strategy = spec.update_strategy.as_ref();
        UpdatePolicy {
            monotonic: spec.pod_management_policy.as_deref() != Some("Parallel"),
            rolling: strategy.and_then(|s| s.type_.as_deref()) != Some("OnDelete"),
            rolling_without_parameters: strategy.and_then(|s| s.rolling_update.as_ref()).is_none(),
            partition: strategy.and_then(|s| s.rolling_update.as_ref()).and_then(|r| r.partition).unwrap_or(0),
        }
    }
}

/// Carries out the scale steps, or when there are none one step of the
/// rolling update, stopping at the first wait.
pub(super) async fn update_statefulset(
    ctx: &Context,
    set: &StatefulSet,
    revisions: &SetRevisions,
    pods: &SetPods,
    policy: &UpdatePolicy,
) -> Result<(), ControllerError> {
    let mut steps = plan(&pods.slots, &pods.condemned, pods.start, pods.replicas, policy.monotonic);
    if policy.rolling && steps.is_empty() && pods.condemned.is_empty() {
        steps.extend(rolling_update(pods, policy.partition, &revisions.update));
    }
    let control = StatefulPodControl::new(ctx, set);
    for step in steps {
        match step {
            Step::Create(ord) => {
                let (template, revision) = revision_for(ord, revisions, pods.start, policy);
                control.create(template, revision, ord).await?
            }
            Step::Delete(pod, why) => control.delete(&pod, why).await?,
            Step::Wait => break,
        }
    }
    Ok(())
}

/// The template and revision a new pod of ordinal `ord` gets: the current
/// revision's below the partition (or, for a RollingUpdate without
/// parameters, among the current replicas), else the update revision's.
fn revision_for<'a>(
    ord: i32,
    revisions: &'a SetRevisions,
    start: i32,
    policy: &UpdatePolicy,
) -> (&'a PodTemplateSpec, &'a str) {
    let partitioned = policy.rolling && ord < start + policy.partition;
    let legacy = policy.rolling && policy.rolling_without_parameters && ord < start + revisions.current_replicas;
    if revisions.current != revisions.update && (partitioned || legacy) {
        (&revisions.current_template, revisions.current.as_str())
    } else {
        (&revisions.update_template, revisions.update.as_str())
    }
}

/// RollingUpdate: from the highest ordinal down to the partition, one pod
/// at a time, each only once its successors are healthy.
fn rolling_update(pods: &SetPods, partition: i32, update_revision: &str) -> Option<Step> {
    for ord in (pods.start + partition.max(0)..pods.start + pods.replicas).rev() {
        let pod = pods.slots.get(&ord)?;
        if revision_of(pod) != Some(update_revision) && !is_terminating(pod) {
            return Some(Step::Delete(pod.clone(), "update"));
        }
        if !is_running_and_ready(pod) {
            return Some(Step::Wait);
        }
    }
    None
}

/// Scale steps: create missing ordinals, replace finished pods, delete the
/// condemned from the highest ordinal; OrderedReady stops at the first pod
/// that is missing or not yet Running and Ready.
pub(super) fn plan(
    slots: &BTreeMap<i32, Arc<Pod>>,
    condemned: &[(i32, Arc<Pod>)],
    start: i32,
    replicas: i32,
    monotonic: bool,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for ord in start..start + replicas {
        match slots.get(&ord) {
            None => {
                steps.push(Step::Create(ord));
                if monotonic {
                    return steps;
                }
            }
            Some(pod) if is_failed(pod) || is_succeeded(pod) => {
                if !is_terminating(pod) {
                    steps.push(Step::Delete(pod.clone(), "finished"));
                }
                if monotonic {
                    return steps;
                }
            }
            Some(pod) if monotonic && !is_running_and_ready(pod) => {
                steps.push(Step::Wait);
                return steps;
            }
            Some(_) => {}
        }
    }
    for (_, pod) in condemned {
        if is_terminating(pod) {
            if monotonic {
                steps.push(Step::Wait);
                return steps;
            }
            continue;
        }
        steps.push(Step::Delete(pod.clone(), "scale down"));
        if monotonic {
            return steps;
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use kube::api::ObjectMeta;

    fn pod(name: &str, ready: bool) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: None,
            status: Some(PodStatus {
                phase: Some(if ready { "Running" } else { "Pending" }.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        })
    }

    fn describe(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Step::Create(o) => format!("create {o}"),
                Step::Delete(p, _) => format!("delete {}", p.metadata.name.clone().unwrap_or_default()),
                Step::Wait => "wait".into(),
            })
            .collect()
    }

    #[test]
    fn ordered_ready_creates_one_at_a_time_and_deletes_from_the_top() {
        let mut slots = BTreeMap::new();
        assert_eq!(describe(&plan(&slots, &[], 0, 3, true)), ["create 0"]);
        slots.insert(0, pod("web-0", false));
        assert_eq!(describe(&plan(&slots, &[], 0, 3, true)), ["wait"]);
        slots.insert(0, pod("web-0", true));
        assert_eq!(describe(&plan(&slots, &[], 0, 3, true)), ["create 1"]);
        assert_eq!(describe(&plan(&BTreeMap::new(), &[], 0, 3, false)), ["create 0", "create 1", "create 2"]);
        let condemned = vec![(2, pod("web-2", true)), (1, pod("web-1", true))];
        assert_eq!(describe(&plan(&slots, &condemned, 0, 1, true)), ["delete web-2"]);
        assert_eq!(describe(&plan(&slots, &condemned, 0, 1, false)), ["delete web-2", "delete web-1"]);
    }
}
