//! StatefulSetController: pods with stable names `<set>-<ordinal>` and
//! stable claims, created in order (OrderedReady: ordinal i only once 0..i
//! are Running and Ready; scale down from the highest ordinal, one at a
//! time) or all at once (Parallel); updates by RollingUpdate (highest
//! ordinal first, down to the partition) or OnDelete, tracked through
//! ControllerRevisions.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::controller_utils::{controller_ref, is_pod_available, look_again_for_available};
use super::expectations::Expectations;
use super::history::{self, NewRevision};
use super::informers::{self, controlled_by, wait_synced};
use super::statefulset_pods::{
    create_claims, is_failed, is_running_and_ready, is_succeeded, is_terminating, new_pod, ordinal_of,
    release_claims_on_scale_down, revision_of,
};
use super::{ref_manager, ControllerError};
use crate::client::events::{EventRecorder, EventType};
use crate::client::indexer::Index;
use crate::client::informer_factory::SharedInformerFactory;

struct Context {
    client: kube::Client,
    pods: Store<Pod>,
    pods_by_owner: Index<Pod>,
    orphan_pods: Index<Pod>,
    revisions: Store<ControllerRevision>,
    revisions_by_owner: Index<ControllerRevision>,
    expectations: Expectations,
    recorder: EventRecorder,
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let pods = informers.informer::<Pod>().subscribe();
    let revisions = informers.informer::<ControllerRevision>().subscribe();
    let (sets, set_events) = informers.informer::<StatefulSet>().subscribe().trigger_self();
    let (pods, pod_events) =
        pods.trigger_owner_or_selecting(sets.clone(), |s: &StatefulSet| s.spec.as_ref().map(|s| &s.selector));
    let (revisions, revision_events) = revisions.trigger_owner::<StatefulSet>();
    let recorder = EventRecorder::new(client.clone(), "statefulset-controller");
    let ctx = Arc::new(Context {
        client,
        pods,
        pods_by_owner: informers.by_controller(),
        orphan_pods: informers.orphans_by_namespace(),
        revisions,
        revisions_by_owner: informers.by_controller(),
        expectations: Expectations::default(),
        recorder,
    });
    informers::run("statefulset", sets, vec![set_events, pod_events, revision_events], reconcile, ctx).await;
}

/// What one pass decided to do, in upstream's order.
enum Step {
    Create(i32),
    Delete(Arc<Pod>, &'static str),
    Wait,
}

async fn reconcile(set: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    wait_synced(&ctx.pods).await?;
    wait_synced(&ctx.revisions).await?;
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let name = set.metadata.name.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    if set.metadata.deletion_timestamp.is_some() {
        ctx.expectations.remove(&uid);
        return Ok(Action::await_change());
    }
    let seen =
        |pod: &str| ctx.pods.get(&ObjectRef::new(pod).within(&ns)).map(|p| p.metadata.deletion_timestamp.is_some());
    if !ctx.expectations.satisfied(&uid, seen) {
        // A requeue handed back earlier is dropped when another request
        // was already waiting (kube's scheduler keeps only the waiting
        // one), so the minReadySeconds look-again is kept through the
        // wait, as the Job keeps its deadline's.
        let min_ready = set.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0);
        let now = k8s_openapi::jiff::Timestamp::now();
        let becoming_available = controlled_by(&ctx.pods_by_owner, &ns, &uid).iter().any(|p| {
            ordinal_of(&name, p.metadata.name.as_deref().unwrap_or_default()).is_some()
                && is_running_and_ready(p)
                && !is_pod_available(p, min_ready, now)
        });
        return Ok(if becoming_available {
            Action::requeue(look_again_for_available(min_ready))
        } else {
            Action::await_change()
        });
    }
    let Some(spec) = set.spec.as_ref() else { return Ok(Action::await_change()) };
    let orphans = ref_manager::orphans(&ctx.orphan_pods, &ns, &spec.selector);
    if !orphans.is_empty() {
        // The adopted pods come back as watch events and another pass.
        ref_manager::adopt(&ctx.client, &ns, &orphans, &controller_ref(&*set)).await?;
        return Ok(Action::await_change());
    }
    let status = set.status.clone().unwrap_or_default();

    // Revisions: the one for the current template, and the one pods had.
    let revisions_api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), &ns);
    let revisions = history::sorted(controlled_by(&ctx.revisions_by_owner, &ns, &uid));
    let mut collision_count = status.collision_count.unwrap_or(0);
    let update = NewRevision {
        api: &revisions_api,
        owner_name: &name,
        owner_ref: controller_ref(&*set),
        labels: spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default(),
        hash_label: history::REVISION_HASH_LABEL,
        data: history::template_patch(&spec.template),
        revisions: &revisions,
    }
    .ensure(&mut collision_count)
    .await?;
    let update_revision = update.metadata.name.clone().unwrap_or_default();
    let current = status
        .current_revision
        .as_ref()
        .and_then(|c| revisions.iter().find(|r| r.metadata.name.as_ref() == Some(c)))
        .map(|r| (**r).clone())
        .unwrap_or_else(|| update.clone());
    let current_revision = current.metadata.name.clone().unwrap_or_default();
    let current_template = history::template_of(&current).unwrap_or_else(|| spec.template.clone());

    // Pods: those in range by ordinal, and the condemned beyond it.
    let start = spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0);
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let mut slots: BTreeMap<i32, Arc<Pod>> = BTreeMap::new();
    let mut condemned: Vec<(i32, Arc<Pod>)> = Vec::new();
    for pod in controlled_by(&ctx.pods_by_owner, &ns, &uid) {
        let Some(ord) = ordinal_of(&name, pod.metadata.name.as_deref().unwrap_or_default()) else { continue };
        if ord >= start && ord < start + replicas {
            slots.insert(ord, pod);
        } else {
            condemned.push((ord, pod));
        }
    }
    condemned.sort_by_key(|c| std::cmp::Reverse(c.0));
    let monotonic = spec.pod_management_policy.as_deref() != Some("Parallel");
    let rolling = spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref()) != Some("OnDelete");
    let partition =
        spec.update_strategy.as_ref().and_then(|s| s.rolling_update.as_ref()).and_then(|r| r.partition).unwrap_or(0);
    let min_ready = spec.min_ready_seconds.unwrap_or(0);

    let steps = plan(&slots, &condemned, start, replicas, monotonic);
    let mut steps = steps;
    if rolling && steps.is_empty() && condemned.is_empty() {
        // RollingUpdate: from the highest ordinal down to the partition,
        // one pod at a time, each only once its successors are healthy.
        for ord in (start + partition.max(0)..start + replicas).rev() {
            let Some(pod) = slots.get(&ord) else { break };
            if revision_of(pod) != Some(update_revision.as_str()) && !is_terminating(pod) {
                steps.push(Step::Delete(pod.clone(), "update"));
                break;
            }
            if !is_running_and_ready(pod) {
                steps.push(Step::Wait);
                break;
            }
        }
    }

    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for step in steps {
        match step {
            Step::Create(ord) => {
                let partitioned = rolling && ord < start + partition;
                let legacy = rolling
                    && spec.update_strategy.as_ref().and_then(|s| s.rolling_update.as_ref()).is_none()
                    && ord < start + status.current_replicas.unwrap_or(0);
                let (template, revision) = if current_revision != update_revision && (partitioned || legacy) {
                    (&current_template, current_revision.as_str())
                } else {
                    (&spec.template, update_revision.as_str())
                };
                let pod = new_pod(&set, template, revision, ord);
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                for claim in create_claims(&ctx.client, &set, ord).await? {
                    ctx.recorder.publish(
                        &*set,
                        EventType::Normal,
                        "SuccessfulCreate",
                        &format!("create Claim {claim} Pod {pod_name} in StatefulSet {name} success"),
                    );
                }
                ctx.expectations.expect_create(&uid, &pod_name);
                match pods_api.create(&PostParams::default(), &pod).await {
                    Ok(_) => ctx.recorder.publish(
                        &*set,
                        EventType::Normal,
                        "SuccessfulCreate",
                        &format!("create Pod {pod_name} in StatefulSet {name} successful"),
                    ),
                    Err(e) => {
                        ctx.expectations.forget_create(&uid, &pod_name);
                        if !matches!(&e, kube::Error::Api(s) if s.code == 409) {
                            ctx.recorder.publish(
                                &*set,
                                EventType::Warning,
                                "FailedCreate",
                                &format!("create Pod {pod_name} in StatefulSet {name} failed error: {e}"),
                            );
                            return Err(e.into());
                        }
                    }
                }
            }
            Step::Delete(pod, why) => {
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                if why == "scale down" {
                    if let Some(ord) = ordinal_of(&name, &pod_name) {
                        release_claims_on_scale_down(&ctx.client, &set, &pod, ord).await?;
                    }
                }
                tracing::debug!(statefulset = %name, pod = %pod_name, why, "deleting pod");
                ctx.expectations.expect_delete(&uid, &pod_name);
                match pods_api.delete(&pod_name, &DeleteParams::default()).await {
                    Ok(_) => ctx.recorder.publish(
                        &*set,
                        EventType::Normal,
                        "SuccessfulDelete",
                        &format!("delete Pod {pod_name} in StatefulSet {name} successful"),
                    ),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => {
                        ctx.recorder.publish(
                            &*set,
                            EventType::Warning,
                            "FailedDelete",
                            &format!("delete Pod {pod_name} in StatefulSet {name} failed error: {e}"),
                        );
                        return Err(e.into());
                    }
                }
            }
            Step::Wait => break,
        }
    }

    // Status, from the cache as it stands (changes made above arrive as
    // watch events and trigger another pass).
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut counts = Counts::default();
    let mut requeue: Option<Duration> = None;
    for pod in slots.values().chain(condemned.iter().map(|(_, p)| p)) {
        if is_terminating(pod) {
            continue;
        }
        counts.replicas += 1;
        if is_running_and_ready(pod) {
            counts.ready += 1;
            if is_pod_available(pod, min_ready, now) {
                counts.available += 1;
            } else {
                requeue = Some(look_again_for_available(min_ready));
            }
        }
        match revision_of(pod) {
            Some(r) if r == current_revision => counts.current += 1,
            _ => {}
        }
        if revision_of(pod) == Some(update_revision.as_str()) {
            counts.updated += 1;
        }
    }
    let (mut current_revision, mut current_replicas) = (current_revision, counts.current);
    if rolling && counts.updated == counts.replicas && counts.ready == counts.replicas && counts.replicas == replicas {
        current_revision = update_revision.clone();
        current_replicas = counts.updated;
    }
    let new_status = json!({
        "observedGeneration": set.metadata.generation,
        "replicas": counts.replicas,
        "readyReplicas": counts.ready,
        "currentReplicas": current_replicas,
        "updatedReplicas": counts.updated,
        "availableReplicas": counts.available,
        "currentRevision": current_revision,
        "updateRevision": update_revision,
        "collisionCount": collision_count,
    });
    let old = serde_json::to_value(&status).unwrap_or_default();
    let changed = new_status
        .as_object()
        .into_iter()
        .flatten()
        .any(|(k, v)| old.get(k).unwrap_or(&json!(0)) != v && !(v.is_null() && old.get(k).is_none()));
    if changed {
        let sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &ns);
        match sets.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": new_status}))).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }

    // History: keep revisions pods use, the current and update ones, and
    // revisionHistoryLimit others.
    let mut live: HashSet<String> = slots.values().filter_map(|p| revision_of(p).map(str::to_string)).collect();
    live.insert(current_revision);
    live.insert(update_revision);
    history::truncate(&revisions_api, &revisions, &live, spec.revision_history_limit.unwrap_or(10)).await?;

    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

#[derive(Default)]
struct Counts {
    replicas: i32,
    ready: i32,
    available: i32,
    current: i32,
    updated: i32,
}

/// Scale steps: create missing ordinals, replace finished pods, delete the
/// condemned from the highest ordinal; OrderedReady stops at the first pod
/// that is missing or not yet Running and Ready.
fn plan(
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
