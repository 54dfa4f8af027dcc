//! JobController: runs pods until `completions` succeed (NonIndexed, or one
//! per index for Indexed Jobs), `parallelism` at a time; fails the Job when
//! more than `backoffLimit` pods failed (BackoffLimitExceeded) or it ran
//! past `activeDeadlineSeconds` (DeadlineExceeded); suspends and resumes.
//! As in v1.33 a finishing Job first gets SuccessCriteriaMet or
//! FailureTarget, then Complete or Failed once no pod is left running.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::controller_utils::{is_pod_ready, pod_phase};
use super::expectations::Expectations;
use super::informers::{self, controlled_by, wait_synced};
use super::job_pods::{format_intervals, index_of, is_indexed, new_pod, parse_intervals};
use super::ref_manager;
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::indexer::Index;
use crate::client::informer_factory::SharedInformerFactory;

struct Context {
    client: kube::Client,
    pods: Store<Pod>,
    pods_by_owner: Index<Pod>,
    orphan_pods: Index<Pod>,
    expectations: Expectations,
    recorder: EventRecorder,
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (jobs, job_events) = informers.informer::<Job>().subscribe().trigger_self();
    // A pod wakes its Job, or when it has no controller every Job whose
    // selector matches it (which may adopt it).
    let (pods, pod_events) = informers
        .informer::<Pod>()
        .subscribe()
        .trigger_owner_or_selecting(jobs.clone(), |j: &Job| j.spec.as_ref()?.selector.as_ref());
    let recorder = EventRecorder::new(client.clone(), "job-controller");
    let ctx = Arc::new(Context {
        client,
        pods,
        pods_by_owner: informers.by_controller(),
        orphan_pods: informers.orphans_by_namespace(),
        expectations: Expectations::default(),
        recorder,
    });
    informers::run("job", jobs, vec![job_events, pod_events], reconcile, ctx).await;
}

/// Whether the Job has a condition of `type_` with status True.
pub fn has_condition(status: Option<&JobStatus>, type_: &str) -> bool {
    status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Complete or Failed.
pub fn is_finished(job: &Job) -> bool {
    has_condition(job.status.as_ref(), "Complete") || has_condition(job.status.as_ref(), "Failed")
}

/// Sets a condition, keeping its transition time if its status is unchanged.
fn set_condition(
    conditions: &mut Vec<JobCondition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) {
    let t = Some(Time(now));
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = t.clone();
        }
        c.status = status.into();
        c.reason = Some(reason.into());
        c.message = Some(message.into());
        c.last_probe_time = t;
        return;
    }
    conditions.push(JobCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: t.clone(),
        last_transition_time: t,
    });
}

fn is_finished_pod(p: &Pod) -> bool {
    matches!(pod_phase(p), "Succeeded" | "Failed")
}

async fn reconcile(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    wait_synced(&ctx.pods).await?;
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    let uid = job.metadata.uid.clone().unwrap_or_default();
    if job.metadata.deletion_timestamp.is_some() || is_finished(&job) {
        ctx.expectations.remove(&uid);
        return Ok(Action::await_change());
    }
    let seen =
        |pod: &str| ctx.pods.get(&ObjectRef::new(pod).within(&ns)).map(|p| p.metadata.deletion_timestamp.is_some());
    let Some(spec) = job.spec.as_ref() else { return Ok(Action::await_change()) };
    let now = Timestamp::now();
    if !ctx.expectations.satisfied(&uid, seen) {
        // A requeue handed back earlier is dropped when another request
        // was already waiting (kube's scheduler keeps only the waiting
        // one), so the deadline's own requeue is kept through the wait
        // (at least a second away once it has passed: no busy loop).
        let start = job.status.as_ref().and_then(|s| s.start_time.as_ref());
        return Ok(match deadline_left(spec, start, now) {
            Some(left) => Action::requeue(Duration::from_secs(left.max(1).unsigned_abs())),
            None => Action::await_change(),
        });
    }
    let old = job.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let indexed = is_indexed(&job);
    let completions = spec.completions;
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    let suspended = spec.suspend == Some(true);

    // Its own pods, after adopting the orphans its selector matches and
    // releasing those it no longer matches (upstream's ClaimPods).
    let candidates: Vec<Arc<Pod>> =
        controlled_by(&ctx.pods_by_owner, &ns, &uid).into_iter().chain(ctx.orphan_pods.get(&ns)).collect();
    let pods = match spec.selector.as_ref() {
        Some(selector) => ref_manager::claim_pods(&ctx.client, &*job, selector, candidates).await?,
        None => Vec::new(),
    };
    let active: Vec<Arc<Pod>> =
        pods.iter().filter(|p| !is_finished_pod(p) && p.metadata.deletion_timestamp.is_none()).cloned().collect();
    let terminating = pods.iter().filter(|p| !is_finished_pod(p) && p.metadata.deletion_timestamp.is_some()).count();
    // Finished pods are counted from the cache; counts never go back, so a
    // finished pod deleted by someone else stays counted.
    let failed = (pods.iter().filter(|p| pod_phase(p) == "Failed").count() as i32).max(old.failed.unwrap_or(0));
    let mut completed_indexes: BTreeSet<i32> = parse_intervals(old.completed_indexes.as_deref().unwrap_or_default());
    let succeeded = if indexed {
        let n = completions.unwrap_or(0);
        completed_indexes
            .extend(pods.iter().filter(|p| pod_phase(p) == "Succeeded").filter_map(|p| index_of(p)).filter(|i| *i < n));
        completed_indexes.len() as i32
    } else {
        (pods.iter().filter(|p| pod_phase(p) == "Succeeded").count() as i32).max(old.succeeded.unwrap_or(0))
    };

    let mut conditions = status.conditions.take().unwrap_or_default();
    let has = |conds: &Vec<JobCondition>, t: &str| conds.iter().any(|c| c.type_ == t && c.status == "True");
    if !suspended && status.start_time.is_none() {
        status.start_time = Some(Time(now));
    }
    let mut requeue: Option<Duration> = None;

    // Success and failure criteria, sticky once met.
    let mut failure: Option<(&str, &str)> =
        conditions
            .iter()
            .find(|c| c.type_ == "FailureTarget" && c.status == "True")
            .map(|c| {
                if c.reason.as_deref() == Some("DeadlineExceeded") {
                    "DeadlineExceeded"
                } else {
                    "BackoffLimitExceeded"
                }
            })
            .map(|r| (r, failure_message(r)));
    let mut success = has(&conditions, "SuccessCriteriaMet");
    if failure.is_none() && !success {
        if failed > spec.backoff_limit.unwrap_or(6) {
            failure = Some(("BackoffLimitExceeded", failure_message("BackoffLimitExceeded")));
        } else if let Some(left) = deadline_left(spec, status.start_time.as_ref(), now) {
            if left <= 0 {
                failure = Some(("DeadlineExceeded", failure_message("DeadlineExceeded")));
            } else {
                requeue = Some(Duration::from_secs(left.unsigned_abs()));
            }
        }
        success = failure.is_none()
            && match completions {
                Some(n) => succeeded >= n,
                None => succeeded > 0 && active.is_empty(),
            };
    }

    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut to_delete: Vec<Arc<Pod>> = Vec::new();
    let mut to_create: Vec<Option<i32>> = Vec::new();
    if let Some((reason, message)) = failure {
        set_condition(&mut conditions, "FailureTarget", "True", reason, message, now);
        to_delete.extend(active.iter().cloned());
        if active.is_empty() && terminating == 0 {
            set_condition(&mut conditions, "Failed", "True", reason, message, now);
            ctx.recorder.publish(&*job, EventType::Warning, reason, message);
        }
    } else if success {
        let message = "Reached expected number of succeeded pods";
        set_condition(&mut conditions, "SuccessCriteriaMet", "True", "CompletionsReached", message, now);
        to_delete.extend(active.iter().cloned());
        if active.is_empty() && terminating == 0 {
            set_condition(&mut conditions, "Complete", "True", "CompletionsReached", message, now);
            status.completion_time = Some(Time(now));
            ctx.recorder.publish(&*job, EventType::Normal, "Completed", "Job completed");
        }
    } else if suspended {
        to_delete.extend(active.iter().cloned());
        if !has(&conditions, "Suspended") {
            set_condition(&mut conditions, "Suspended", "True", "JobSuspended", "Job suspended", now);
            ctx.recorder.publish(&*job, EventType::Normal, "Suspended", "Job suspended");
        }
    } else {
        if has(&conditions, "Suspended") {
            set_condition(&mut conditions, "Suspended", "False", "JobResumed", "Job resumed", now);
            ctx.recorder.publish(&*job, EventType::Normal, "Resumed", "Job resumed");
            status.start_time = Some(Time(now));
        }
        if indexed {
            let n = completions.unwrap_or(0);
            let mut running: BTreeMap<i32, Vec<Arc<Pod>>> = BTreeMap::new();
            for p in &active {
                match index_of(p) {
                    Some(i) if i < n && !completed_indexes.contains(&i) => {
                        running.entry(i).or_default().push(p.clone())
                    }
                    _ => to_delete.push(p.clone()),
                }
            }
            for pods in running.values() {
                to_delete.extend(pods.iter().skip(1).cloned());
            }
            let mut slots = parallelism - running.len() as i32;
            let mut excess: Vec<i32> = running.keys().copied().collect();
            while slots < 0 {
                if let Some(i) = excess.pop() {
                    to_delete.extend(running[&i].iter().cloned());
                }
                slots += 1;
            }
            for i in (0..n).filter(|i| !completed_indexes.contains(i) && !running.contains_key(i)) {
                if slots <= 0 {
                    break;
                }
                to_create.push(Some(i));
                slots -= 1;
            }
        } else {
            let want = match completions {
                Some(n) => parallelism.min((n - succeeded).max(0)),
                None if succeeded > 0 => active.len() as i32,
                None => parallelism,
            };
            let have = active.len() as i32;
            if have < want {
                to_create.extend((0..want - have).map(|_| None));
            } else if have > want {
                let mut newest = active.clone();
                newest.sort_by(|a, b| b.metadata.creation_timestamp.cmp(&a.metadata.creation_timestamp));
                to_delete.extend(newest.into_iter().take((have - want) as usize));
            }
        }
    }

    for pod in &to_delete {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        ctx.expectations.expect_delete(&uid, &pod_name);
        match pods_api.delete(&pod_name, &DeleteParams::background()).await {
            Ok(_) => {
                ctx.recorder.publish(&*job, EventType::Normal, "SuccessfulDelete", &format!("Deleted pod: {pod_name}"))
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    for index in &to_create {
        match pods_api.create(&PostParams::default(), &new_pod(&job, *index)).await {
            Ok(pod) => {
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                ctx.expectations.expect_create(&uid, &pod_name);
                ctx.recorder.publish(&*job, EventType::Normal, "SuccessfulCreate", &format!("Created pod: {pod_name}"));
            }
            Err(e) => {
                ctx.recorder.publish(&*job, EventType::Warning, "FailedCreate", &format!("Error creating: {e}"));
                return Err(e.into());
            }
        }
    }

    let deleted = to_delete.len();
    status.active = Some(active.len().saturating_sub(deleted) as i32 + to_create.len() as i32);
    status.ready = Some(active.iter().filter(|p| is_pod_ready(p)).count() as i32);
    status.terminating = Some((terminating + deleted) as i32);
    status.succeeded = Some(succeeded);
    status.failed = Some(failed);
    if indexed {
        status.completed_indexes = Some(format_intervals(&completed_indexes));
    }
    if suspended && failure.is_none() && !success {
        status.start_time = None;
    }
    status.conditions = (!conditions.is_empty()).then_some(conditions);
    let new = serde_json::to_value(&status).unwrap_or_default();
    if new != serde_json::to_value(&old).unwrap_or_default() {
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
        let mut body = new;
        // A merge patch removes what is gone.
        if status.start_time.is_none() {
            body["startTime"] = serde_json::Value::Null;
        }
        match jobs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": body}))).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Seconds left before `activeDeadlineSeconds` of a Job that started at
/// `start` and is not suspended (zero or less once past).
fn deadline_left(spec: &JobSpec, start: Option<&Time>, now: Timestamp) -> Option<i64> {
    if spec.suspend == Some(true) {
        return None;
    }
    Some(start?.0.as_second() + spec.active_deadline_seconds? - now.as_second())
}

fn failure_message(reason: &str) -> &'static str {
    match reason {
        "DeadlineExceeded" => "Job was active longer than specified deadline",
        _ => "Job has reached the specified backoff limit",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_counts_from_the_start_unless_suspended() {
        let start = Time("2026-01-01T00:00:10Z".parse().expect("time"));
        let at = |s: &str| -> Timestamp { s.parse().expect("time") };
        let spec = JobSpec { active_deadline_seconds: Some(5), ..JobSpec::default() };
        assert_eq!(deadline_left(&spec, Some(&start), at("2026-01-01T00:00:12Z")), Some(3));
        assert_eq!(deadline_left(&spec, Some(&start), at("2026-01-01T00:00:16Z")), Some(-1));
        assert_eq!(deadline_left(&spec, None, at("2026-01-01T00:00:12Z")), None);
        let suspended = JobSpec { suspend: Some(true), ..spec.clone() };
        assert_eq!(deadline_left(&suspended, Some(&start), at("2026-01-01T00:00:12Z")), None);
        assert_eq!(deadline_left(&JobSpec::default(), Some(&start), at("2026-01-01T00:00:12Z")), None);
    }
}
