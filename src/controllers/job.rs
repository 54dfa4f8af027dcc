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
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};

use super::controller_utils::{is_pod_ready, patch_status, pod_phase};
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

/// Upstream's syncJob, step by step.
async fn reconcile(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    wait_synced(&ctx.pods).await?;
    let ns = job.metadata.namespace.clone().unwrap_or_default();
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
        return Ok(while_expecting(&job, spec, now));
    }
    let pods = claim_job_pods(&ctx, &job, spec).await?;
    let mut pass = JobPass::new(&job, spec, &pods, now);
    let verdict = pass.verdict();
    let changes = match verdict.failure {
        Some((reason, message)) => pass.fail(&ctx, reason, message),
        None if verdict.success => pass.complete(&ctx),
        None if pass.suspended => pass.suspend(&ctx),
        None => {
            pass.resume_if_suspended(&ctx);
            pass.manage_job()
        }
    };
    sync_job_pods(&ctx, &job, &changes).await?;
    pass.update_status(&ctx, &verdict, &changes).await?;
    Ok(verdict.requeue.map_or_else(Action::await_change, Action::requeue))
}

/// While the cache has not yet seen this controller's own creates and
/// deletes: nothing to do but wait. A requeue handed back earlier is
/// dropped when another request was already waiting (kube's scheduler
/// keeps only the waiting one), so the deadline's own requeue is kept
/// through the wait (at least a second away once it has passed: no busy
/// loop).
fn while_expecting(job: &Job, spec: &JobSpec, now: Timestamp) -> Action {
    let start = job.status.as_ref().and_then(|s| s.start_time.as_ref());
    match deadline_left(spec, start, now) {
        Some(left) => Action::requeue(Duration::from_secs(left.max(1).unsigned_abs())),
        None => Action::await_change(),
    }
}

/// Its own pods, after adopting the orphans its selector matches and
/// releasing those it no longer matches (upstream's ClaimPods).
async fn claim_job_pods(ctx: &Context, job: &Job, spec: &JobSpec) -> Result<Vec<Arc<Pod>>, ControllerError> {
    let ns = job.metadata.namespace.as_deref().unwrap_or_default();
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    let candidates: Vec<Arc<Pod>> =
        controlled_by(&ctx.pods_by_owner, ns, uid).into_iter().chain(ctx.orphan_pods.get(ns)).collect();
    match spec.selector.as_ref() {
        Some(selector) => ref_manager::claim_pods(&ctx.client, job, selector, candidates).await,
        None => Ok(Vec::new()),
    }
}

/// The Job's pods as one pass counts them (upstream's getStatus).
struct JobPods {
    /// Neither finished nor being deleted.
    active: Vec<Arc<Pod>>,
    /// Not finished, being deleted.
    terminating: usize,
    failed: i32,
    succeeded: i32,
    /// An Indexed Job's indexes that succeeded.
    completed_indexes: BTreeSet<i32>,
}

impl JobPods {
    /// Finished pods are counted from the cache; counts never go back, so
    /// a finished pod deleted by someone else stays counted.
    fn count(pods: &[Arc<Pod>], old: &JobStatus, indexed: bool, completions: Option<i32>) -> Self {
        let active: Vec<Arc<Pod>> =
            pods.iter().filter(|p| !is_finished_pod(p) && p.metadata.deletion_timestamp.is_none()).cloned().collect();
        let terminating =
            pods.iter().filter(|p| !is_finished_pod(p) && p.metadata.deletion_timestamp.is_some()).count();
        let failed = (pods.iter().filter(|p| pod_phase(p) == "Failed").count() as i32).max(old.failed.unwrap_or(0));
        let mut completed_indexes = parse_intervals(old.completed_indexes.as_deref().unwrap_or_default());
        let succeeded = if indexed {
            let n = completions.unwrap_or(0);
            let done = pods.iter().filter(|p| pod_phase(p) == "Succeeded").filter_map(|p| index_of(p));
            completed_indexes.extend(done.filter(|i| *i < n));
            completed_indexes.len() as i32
        } else {
            (pods.iter().filter(|p| pod_phase(p) == "Succeeded").count() as i32).max(old.succeeded.unwrap_or(0))
        };
        JobPods { active, terminating, failed, succeeded, completed_indexes }
    }

    /// No pod left running or terminating.
    fn none_left(&self) -> bool {
        self.active.is_empty() && self.terminating == 0
    }
}

/// How the Job ends, if it does: a failure (reason and message) or success,
/// sticky once met; and when to look at its deadline again.
struct Verdict {
    failure: Option<(&'static str, &'static str)>,
    success: bool,
    requeue: Option<Duration>,
}

/// What a pass does to the Job's pods: these deleted, then these created
/// (with their completion index when the Job is Indexed).
#[derive(Default)]
struct PodChanges {
    delete: Vec<Arc<Pod>>,
    create: Vec<Option<i32>>,
}

/// One pass over a Job: what it counted, and the status it builds.
struct JobPass<'a> {
    job: &'a Job,
    spec: &'a JobSpec,
    pods: JobPods,
    indexed: bool,
    suspended: bool,
    now: Timestamp,
    old: JobStatus,
    status: JobStatus,
    conditions: Vec<JobCondition>,
}

impl<'a> JobPass<'a> {
    fn new(job: &'a Job, spec: &'a JobSpec, pods: &[Arc<Pod>], now: Timestamp) -> Self {
        let old = job.status.clone().unwrap_or_default();
        let indexed = is_indexed(job);
        let mut status = old.clone();
        let conditions = status.conditions.take().unwrap_or_default();
        let suspended = spec.suspend == Some(true);
        if !suspended && status.start_time.is_none() {
            status.start_time = Some(Time(now));
        }
        let pods = JobPods::count(pods, &old, indexed, spec.completions);
        JobPass { job, spec, pods, indexed, suspended, now, old, status, conditions }
    }

    fn has(&self, type_: &str) -> bool {
        self.conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
    }

    fn set_condition(&mut self, type_: &str, status: &str, reason: &str, message: &str) {
        set_condition(&mut self.conditions, type_, status, reason, message, self.now);
    }

    /// The failure and success criteria, sticky once met: upstream's
    /// pastBackoffLimitOnFailure, pastActiveDeadline, then completions.
    fn verdict(&self) -> Verdict {
        let sticky = self.conditions.iter().find(|c| c.type_ == "FailureTarget" && c.status == "True");
        let mut failure = sticky
            .map(|c| {
                if c.reason.as_deref() == Some("DeadlineExceeded") {
                    "DeadlineExceeded"
                } else {
                    "BackoffLimitExceeded"
                }
            })
            .map(|r| (r, failure_message(r)));
        let mut success = self.has("SuccessCriteriaMet");
        let mut requeue = None;
        if failure.is_none() && !success {
            if self.pods.failed > self.spec.backoff_limit.unwrap_or(6) {
                failure = Some(("BackoffLimitExceeded", failure_message("BackoffLimitExceeded")));
            } else if let Some(left) = deadline_left(self.spec, self.status.start_time.as_ref(), self.now) {
                if left <= 0 {
                    failure = Some(("DeadlineExceeded", failure_message("DeadlineExceeded")));
                } else {
                    requeue = Some(Duration::from_secs(left.unsigned_abs()));
                }
            }
            success = failure.is_none()
                && match self.spec.completions {
                    Some(n) => self.pods.succeeded >= n,
                    None => self.pods.succeeded > 0 && self.pods.active.is_empty(),
                };
        }
        Verdict { failure, success, requeue }
    }

    /// FailureTarget, then Failed once no pod is left; every active pod goes.
    fn fail(&mut self, ctx: &Context, reason: &str, message: &str) -> PodChanges {
        self.set_condition("FailureTarget", "True", reason, message);
        if self.pods.none_left() {
            self.set_condition("Failed", "True", reason, message);
            ctx.recorder.publish(self.job, EventType::Warning, reason, message);
        }
        PodChanges { delete: self.pods.active.clone(), create: Vec::new() }
    }

    /// SuccessCriteriaMet, then Complete once no pod is left; every active
    /// pod goes.
    fn complete(&mut self, ctx: &Context) -> PodChanges {
        let message = "Reached expected number of succeeded pods";
        self.set_condition("SuccessCriteriaMet", "True", "CompletionsReached", message);
        if self.pods.none_left() {
            self.set_condition("Complete", "True", "CompletionsReached", message);
            self.status.completion_time = Some(Time(self.now));
            ctx.recorder.publish(self.job, EventType::Normal, "Completed", "Job completed");
        }
        PodChanges { delete: self.pods.active.clone(), create: Vec::new() }
    }

    /// Suspended: every active pod goes.
    fn suspend(&mut self, ctx: &Context) -> PodChanges {
        if !self.has("Suspended") {
            self.set_condition("Suspended", "True", "JobSuspended", "Job suspended");
            ctx.recorder.publish(self.job, EventType::Normal, "Suspended", "Job suspended");
        }
        PodChanges { delete: self.pods.active.clone(), create: Vec::new() }
    }

    /// A resumed Job starts its clock again.
    fn resume_if_suspended(&mut self, ctx: &Context) {
        if self.has("Suspended") {
            self.set_condition("Suspended", "False", "JobResumed", "Job resumed");
            ctx.recorder.publish(self.job, EventType::Normal, "Resumed", "Job resumed");
            self.status.start_time = Some(Time(self.now));
        }
    }

    /// Upstream's manageJob: `parallelism` pods at a time until enough
    /// succeeded.
    fn manage_job(&self) -> PodChanges {
        let parallelism = self.spec.parallelism.unwrap_or(1).max(0);
        if self.indexed {
            manage_indexed(&self.pods, self.spec.completions.unwrap_or(0), parallelism)
        } else {
            manage_non_indexed(&self.pods, self.spec.completions, parallelism)
        }
    }

    /// Writes the status when it changed (a Job gone meanwhile is fine).
    async fn update_status(
        mut self,
        ctx: &Context,
        verdict: &Verdict,
        changes: &PodChanges,
    ) -> Result<(), ControllerError> {
        let (pods, status) = (&self.pods, &mut self.status);
        let deleted = changes.delete.len();
        status.active = Some(pods.active.len().saturating_sub(deleted) as i32 + changes.create.len() as i32);
        status.ready = Some(pods.active.iter().filter(|p| is_pod_ready(p)).count() as i32);
        status.terminating = Some((pods.terminating + deleted) as i32);
        status.succeeded = Some(pods.succeeded);
        status.failed = Some(pods.failed);
        if self.indexed {
            status.completed_indexes = Some(format_intervals(&pods.completed_indexes));
        }
        if self.suspended && verdict.failure.is_none() && !verdict.success {
            status.start_time = None;
        }
        status.conditions = (!self.conditions.is_empty()).then_some(self.conditions);
        let new = serde_json::to_value(&*status).unwrap_or_default();
        if new == serde_json::to_value(&self.old).unwrap_or_default() {
            return Ok(());
        }
        let mut body = new;
        // A merge patch removes what is gone.
        if status.start_time.is_none() {
            body["startTime"] = serde_json::Value::Null;
        }
        Ok(patch_status(&ctx.client, self.job, body).await?)
    }
}

/// An Indexed Job: one pod per index not yet completed, at most
/// `parallelism` at a time; duplicates, pods of indexes out of range or
/// done, and those beyond `parallelism` (highest index first) go.
fn manage_indexed(pods: &JobPods, completions: i32, parallelism: i32) -> PodChanges {
    let mut changes = PodChanges::default();
    let done = &pods.completed_indexes;
    let mut running: BTreeMap<i32, Vec<Arc<Pod>>> = BTreeMap::new();
    for p in &pods.active {
        match index_of(p) {
            Some(i) if i < completions && !done.contains(&i) => running.entry(i).or_default().push(p.clone()),
            _ => changes.delete.push(p.clone()),
        }
    }
    for pods in running.values() {
        changes.delete.extend(pods.iter().skip(1).cloned());
    }
    let mut slots = parallelism - running.len() as i32;
    let mut excess: Vec<i32> = running.keys().copied().collect();
    while slots < 0 {
        if let Some(i) = excess.pop() {
            changes.delete.extend(running[&i].iter().cloned());
        }
        slots += 1;
    }
    for i in (0..completions).filter(|i| !done.contains(i) && !running.contains_key(i)) {
        if slots <= 0 {
            break;
        }
        changes.create.push(Some(i));
        slots -= 1;
    }
    changes
}

/// A NonIndexed Job: `parallelism` pods, fewer once the remaining
/// completions need fewer; the newest go first.
fn manage_non_indexed(pods: &JobPods, completions: Option<i32>, parallelism: i32) -> PodChanges {
    let mut changes = PodChanges::default();
    let want = match completions {
        Some(n) => parallelism.min((n - pods.succeeded).max(0)),
        None if pods.succeeded > 0 => pods.active.len() as i32,
        None => parallelism,
    };
    let have = pods.active.len() as i32;
    if have < want {
        changes.create.extend((0..want - have).map(|_| None));
    } else if have > want {
        let mut newest = pods.active.clone();
        newest.sort_by(|a, b| b.metadata.creation_timestamp.cmp(&a.metadata.creation_timestamp));
        changes.delete.extend(newest.into_iter().take((have - want) as usize));
    }
    changes
}

/// Deletes then creates pods as `changes` says, recording what it expects
/// to see (manageJob's API calls).
async fn sync_job_pods(ctx: &Context, job: &Job, changes: &PodChanges) -> Result<(), ControllerError> {
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), job.metadata.namespace.as_deref().unwrap_or_default());
    for pod in &changes.delete {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        ctx.expectations.expect_delete(uid, &pod_name);
        match pods_api.delete(&pod_name, &DeleteParams::background()).await {
            Ok(_) => {
                ctx.recorder.publish(job, EventType::Normal, "SuccessfulDelete", &format!("Deleted pod: {pod_name}"))
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    for index in &changes.create {
        match pods_api.create(&PostParams::default(), &new_pod(job, *index)).await {
            Ok(pod) => {
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                ctx.expectations.expect_create(uid, &pod_name);
                ctx.recorder.publish(job, EventType::Normal, "SuccessfulCreate", &format!("Created pod: {pod_name}"));
            }
            Err(e) => {
                ctx.recorder.publish(job, EventType::Warning, "FailedCreate", &format!("Error creating: {e}"));
                return Err(e.into());
            }
        }
    }
    Ok(())
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
