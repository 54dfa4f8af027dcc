//! CronJobController (upstream's v2): creates a Job `<cronjob>-<minutes
//! since the epoch>` at each schedule time within startingDeadlineSeconds,
//! honouring concurrencyPolicy and suspend, tracks active Jobs and the last
//! schedule and success times, prunes finished Jobs beyond the history
//! limits, and requeues itself for exactly the next schedule time.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::batch::v1::{CronJob, CronJobSpec, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::reflector::Store;
use kube::Resource;

use super::controller_utils::{controller_ref, patch_status};
use super::cron_schedule::{due, time_zone, Schedule, ScheduleError};
use super::informers::{self, controlled_by, wait_synced};
use super::job::has_condition;
use super::ControllerError;
use crate::client::events::{EventRecorder, EventType};
use crate::client::indexer::Index;
use crate::client::informer_factory::SharedInformerFactory;

const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// Upstream requeues a little after the schedule time, so it has passed.
const NEXT_SCHEDULE_DELTA: Duration = Duration::from_millis(100);
/// More missed times than this get a warning.
const MAX_MISSED: usize = 100;

struct Context {
    client: kube::Client,
    jobs: Store<Job>,
    jobs_by_owner: Index<Job>,
    recorder: EventRecorder,
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let (cronjobs, cronjob_events) = informers.informer::<CronJob>().subscribe().trigger_self();
    let (jobs, job_events) = informers.informer::<Job>().subscribe().trigger_owner::<CronJob>();
    let recorder = EventRecorder::new(client.clone(), "cronjob-controller");
    let ctx = Arc::new(Context { client, jobs, jobs_by_owner: informers.by_controller(), recorder });
    informers::run("cronjob", cronjobs, vec![cronjob_events, job_events], reconcile, ctx).await;
}

/// The finished condition of a Job, if any.
fn finished(job: &Job) -> Option<&'static str> {
    let status = job.status.as_ref();
    if has_condition(status, "Complete") {
        Some("Complete")
    } else if has_condition(status, "Failed") {
        Some("Failed")
    } else {
        None
    }
}

fn job_ref(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some(Job::api_version(&()).into_owned()),
        kind: Some(Job::kind(&()).into_owned()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        resource_version: job.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// RFC 3339 in the CronJob's time zone, as upstream writes the scheduled
/// timestamp annotation.
fn in_zone(t: Timestamp, tz: &TimeZone) -> String {
    let zoned = t.to_zoned(tz.clone());
    if zoned.offset().seconds() == 0 {
        t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    } else {
        zoned.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string()
    }
}

fn until(t: Timestamp, now: Timestamp) -> Duration {
    let nanos = t.as_nanosecond() - now.as_nanosecond();
    Duration::from_nanos(u64::try_from(nanos.max(0)).unwrap_or(0)) + NEXT_SCHEDULE_DELTA
}

/// Upstream's syncCronJob, step by step.
async fn reconcile(cj: Arc<CronJob>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    wait_synced(&ctx.jobs).await?;
    if cj.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = cj.metadata.namespace.clone().unwrap_or_default();
    let uid = cj.metadata.uid.clone().unwrap_or_default();
    let now = Timestamp::now();
    let jobs = controlled_by(&ctx.jobs_by_owner, &ns, &uid);
    let Some((cj, old)) = fresh_if_unlisted(&ctx, cj, &jobs).await? else { return Ok(Action::await_change()) };
    let Some(spec) = cj.spec.as_ref() else { return Ok(Action::await_change()) };
    let mut pass = CronJobPass::new(&ctx, &cj, spec, jobs, &old, now);
    pass.sync_active_list();
    cleanup_finished_jobs(&cj, &pass.jobs, &pass.jobs_api, &ctx).await?;
    let requeue = match parse_schedule(&ctx, &cj, spec) {
        Some(_) if spec.suspend == Some(true) => None,
        Some((tz, schedule)) => pass.sync_schedule(&tz, &schedule).await?,
        None => None,
    };
    pass.update_status(&old).await?;
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// The CronJob and its status to work from. An unfinished Job missing from
/// the active list may only mean the cached CronJob predates our last
/// status write: it is read afresh then (`None`: gone or replaced).
async fn fresh_if_unlisted(
    ctx: &Context,
    cj: Arc<CronJob>,
    jobs: &[Arc<Job>],
) -> Result<Option<(Arc<CronJob>, CronJobStatus)>, ControllerError> {
    let old = cj.status.clone().unwrap_or_default();
    let unlisted = jobs.iter().any(|j| {
        finished(j).is_none()
            && j.metadata.deletion_timestamp.is_none()
            && !old.active.iter().flatten().any(|r| r.uid == j.metadata.uid)
    });
    if !unlisted {
        return Ok(Some((cj, old)));
    }
    let cronjobs: Api<CronJob> =
        Api::namespaced(ctx.client.clone(), cj.metadata.namespace.as_deref().unwrap_or_default());
    Ok(match cronjobs.get_opt(cj.metadata.name.as_deref().unwrap_or_default()).await? {
        Some(fresh) if fresh.metadata.uid == cj.metadata.uid => {
            let status = fresh.status.clone().unwrap_or_default();
            Some((Arc::new(fresh), status))
        }
        _ => None,
    })
}

/// The schedule and its time zone; an unparseable one is reported.
fn parse_schedule(ctx: &Context, cj: &CronJob, spec: &CronJobSpec) -> Option<(TimeZone, Schedule)> {
    let parsed = time_zone(spec.time_zone.as_deref()).and_then(|tz| Ok((tz, Schedule::parse(&spec.schedule)?)));
    match parsed {
        Ok(parsed) => Some(parsed),
        Err(e) => {
            let reason = if spec.time_zone.is_some() && matches!(e, ScheduleError::TimeZone(_)) {
                "UnknownTimeZone"
            } else {
                "UnparseableSchedule"
            };
            let message = format!("unparseable schedule: {:?} : {e}", spec.schedule);
            ctx.recorder.publish(cj, EventType::Warning, reason, &message);
            None
        }
    }
}

/// One pass over a CronJob: its Jobs, and the status it builds.
struct CronJobPass<'a> {
    ctx: &'a Context,
    cj: &'a CronJob,
    spec: &'a CronJobSpec,
    jobs: Vec<Arc<Job>>,
    jobs_api: Api<Job>,
    status: CronJobStatus,
    active: Vec<ObjectReference>,
    now: Timestamp,
}

impl<'a> CronJobPass<'a> {
    fn new(
        ctx: &'a Context,
        cj: &'a CronJob,
        spec: &'a CronJobSpec,
        jobs: Vec<Arc<Job>>,
        old: &CronJobStatus,
        now: Timestamp,
    ) -> Self {
        let jobs_api = Api::namespaced(ctx.client.clone(), cj.metadata.namespace.as_deref().unwrap_or_default());
        let mut status = old.clone();
        let active = status.active.take().unwrap_or_default();
        CronJobPass { ctx, cj, spec, jobs, jobs_api, status, active, now }
    }

    fn event(&self, type_: EventType, reason: &str, message: &str) {
        self.ctx.recorder.publish(self.cj, type_, reason, message);
    }

    /// The active list against the Jobs this CronJob controls: finished
    /// ones leave it (a completion is the last successful time), missing
    /// ones too, and Jobs it does not list are reported.
    fn sync_active_list(&mut self) {
        for job in &self.jobs {
            let job_uid = job.metadata.uid.as_deref();
            let listed = self.active.iter().any(|r| r.uid.as_deref() == job_uid);
            let job_name = job.metadata.name.clone().unwrap_or_default();
            match finished(job) {
                None if !listed && job.metadata.deletion_timestamp.is_none() => {
                    // As upstream: reported (a manual `kubectl create job
                    // --from=cronjob/…` too), never adopted into the active list.
                    let message = format!("Saw a job that the controller did not create or forgot: {job_name}");
                    self.event(EventType::Warning, "UnexpectedJob", &message);
                }
                Some(condition) if listed => {
                    self.active.retain(|r| r.uid.as_deref() != job_uid);
                    let message = format!("Saw completed job: {job_name}, condition: {condition}");
                    self.event(EventType::Normal, "SawCompletedJob", &message);
                    if condition == "Complete" {
                        let done = job.status.as_ref().and_then(|s| s.completion_time.clone());
                        let last = &self.status.last_successful_time;
                        if done.as_ref().is_some_and(|d| last.as_ref().is_none_or(|l| l.0 < d.0)) {
                            self.status.last_successful_time = done;
                        }
                    }
                }
                _ => {}
            }
        }
        let (jobs, ctx, cj) = (&self.jobs, self.ctx, self.cj);
        self.active.retain(|r| {
            let present = jobs.iter().any(|j| j.metadata.uid == r.uid);
            if !present {
                let message = format!("Active job went missing: {}", r.name.clone().unwrap_or_default());
                ctx.recorder.publish(cj, EventType::Normal, "MissingJob", &message);
            }
            present
        });
    }

    /// The most recent schedule time not yet run (within
    /// startingDeadlineSeconds) gets its Job as concurrencyPolicy allows;
    /// returns when to look again (the next schedule time).
    async fn sync_schedule(&mut self, tz: &TimeZone, schedule: &Schedule) -> Result<Option<Duration>, ControllerError> {
        let now = self.now;
        let created = self.cj.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
        let mut earliest = self.status.last_schedule_time.as_ref().map_or(created, |t| t.0);
        if let Some(deadline) = self.spec.starting_deadline_seconds {
            let window = Timestamp::from_second(now.as_second() - deadline).unwrap_or(now);
            earliest = earliest.max(window);
        }
        let d = due(schedule, tz, earliest, now);
        if d.missed > MAX_MISSED {
            self.event(
                EventType::Warning,
                "TooManyMissedTimes",
                "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew",
            );
        }
        let requeue = d.next.map(|n| until(n, now));
        if let Some(scheduled) = d.most_recent {
            self.start_job(scheduled, tz).await?;
        }
        Ok(requeue)
    }

    /// The Job of the schedule time `scheduled`, unless it is too late, it
    /// exists, or concurrencyPolicy forbids it; Replace deletes the active
    /// Jobs first.
    async fn start_job(&mut self, scheduled: Timestamp, tz: &TimeZone) -> Result<(), ControllerError> {
        let job_name =
            format!("{}-{}", self.cj.metadata.name.as_deref().unwrap_or_default(), scheduled.as_second() / 60);
        let too_late =
            self.spec.starting_deadline_seconds.is_some_and(|s| scheduled.as_second() + s < self.now.as_second());
        let already = self.jobs.iter().any(|j| j.metadata.name.as_deref() == Some(job_name.as_str()));
        let policy = self.spec.concurrency_policy.as_deref().unwrap_or("Allow");
        match decide(policy, too_late, already, self.active.len()) {
            Decision::MissedDeadline => {
                let message = format!("Missed scheduled time to start a job: {}", in_zone(scheduled, tz));
                self.event(EventType::Warning, "MissSchedule", &message);
                Ok(())
            }
            Decision::AlreadyCreated => Ok(()),
            Decision::Forbidden => {
                self.event(
                    EventType::Normal,
                    "JobAlreadyActive",
                    "Not starting job because prior execution is running and concurrency policy is Forbid",
                );
                Ok(())
            }
            Decision::ReplaceAndStart => {
                self.delete_active().await?;
                self.create_job(&job_name, scheduled, tz).await
            }
            Decision::Start => self.create_job(&job_name, scheduled, tz).await,
        }
    }

    /// Deletes the active Jobs (concurrencyPolicy Replace).
    async fn delete_active(&mut self) -> Result<(), ControllerError> {
        for r in std::mem::take(&mut self.active) {
            let n = r.name.clone().unwrap_or_default();
            match self.jobs_api.delete(&n, &DeleteParams::background()).await {
                Ok(_) => self.event(EventType::Normal, "SuccessfulDelete", &format!("Deleted job {n}")),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Creates the Job of `scheduled` and lists it as active; one that
    /// exists already only moves the last schedule time.
    async fn create_job(&mut self, job_name: &str, scheduled: Timestamp, tz: &TimeZone) -> Result<(), ControllerError> {
        let job = job_from_template(self.cj, job_name, &in_zone(scheduled, tz));
        match self.jobs_api.create(&PostParams::default(), &job).await {
            Ok(created) => {
                self.event(EventType::Normal, "SuccessfulCreate", &format!("Created job {job_name}"));
                self.active.push(job_ref(&created));
                self.status.last_schedule_time = Some(Time(scheduled));
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.status.last_schedule_time = Some(Time(scheduled));
                Ok(())
            }
            Err(e) => {
                self.event(EventType::Warning, "FailedCreate", &format!("Error creating job: {e}"));
                Err(e.into())
            }
        }
    }

    /// Writes the status when it changed from `old` (a CronJob gone
    /// meanwhile is fine).
    async fn update_status(mut self, old: &CronJobStatus) -> Result<(), ControllerError> {
        self.status.active = (!self.active.is_empty()).then_some(self.active);
        let new = serde_json::to_value(&self.status).unwrap_or_default();
        if new == serde_json::to_value(old).unwrap_or_default() {
            return Ok(());
        }
        let mut body = new;
        if self.status.active.is_none() {
            body["active"] = serde_json::Value::Null;
        }
        Ok(patch_status(&self.ctx.client, self.cj, body).await?)
    }
}

/// What to do about the most recent schedule time.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    MissedDeadline,
    AlreadyCreated,
    Forbidden,
    ReplaceAndStart,
    Start,
}

fn decide(policy: &str, too_late: bool, already: bool, active: usize) -> Decision {
    if too_late {
        Decision::MissedDeadline
    } else if already {
        Decision::AlreadyCreated
    } else if active > 0 && policy == "Forbid" {
        Decision::Forbidden
    } else if active > 0 && policy == "Replace" {
        Decision::ReplaceAndStart
    } else {
        Decision::Start
    }
}

/// A Job from the CronJob's jobTemplate.
fn job_from_template(cj: &CronJob, name: &str, scheduled: &str) -> Job {
    let template = cj.spec.as_ref().map(|s| s.job_template.clone()).unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(SCHEDULED_TIMESTAMP.into(), scheduled.into());
    Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: cj.metadata.namespace.clone(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(cj)]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// Upstream's cleanupFinishedJobs: deletes the oldest finished Jobs beyond
/// the history limits.
async fn cleanup_finished_jobs(
    cj: &CronJob,
    jobs: &[Arc<Job>],
    api: &Api<Job>,
    ctx: &Context,
) -> Result<(), ControllerError> {
    let spec = cj.spec.as_ref();
    for (condition, limit) in [
        ("Complete", spec.and_then(|s| s.successful_jobs_history_limit)),
        ("Failed", spec.and_then(|s| s.failed_jobs_history_limit)),
    ] {
        let Some(limit) = limit else { continue };
        let mut done: Vec<&Arc<Job>> =
            jobs.iter().filter(|j| finished(j) == Some(condition) && j.metadata.deletion_timestamp.is_none()).collect();
        let excess = done.len().saturating_sub(usize::try_from(limit.max(0)).unwrap_or(0));
        done.sort_by_key(|j| {
            j.status.as_ref().and_then(|s| s.start_time.as_ref().map(|t| t.0)).or(j
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0))
        });
        for job in done.into_iter().take(excess) {
            let n = job.metadata.name.clone().unwrap_or_default();
            match api.delete(&n, &DeleteParams::background()).await {
                Ok(_) => ctx.recorder.publish(cj, EventType::Normal, "SuccessfulDelete", &format!("Deleted job {n}")),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_policies_and_deadlines() {
        assert_eq!(decide("Allow", false, false, 2), Decision::Start);
        assert_eq!(decide("Forbid", false, false, 1), Decision::Forbidden);
        assert_eq!(decide("Forbid", false, false, 0), Decision::Start);
        assert_eq!(decide("Replace", false, false, 1), Decision::ReplaceAndStart);
        assert_eq!(decide("Replace", false, false, 0), Decision::Start);
        assert_eq!(decide("Allow", false, true, 0), Decision::AlreadyCreated);
        assert_eq!(decide("Allow", true, false, 0), Decision::MissedDeadline);
    }

    #[test]
    fn job_names_and_scheduled_timestamps() {
        let t: Timestamp = "2024-01-01T00:10:00Z".parse().unwrap();
        assert_eq!(t.as_second() / 60, 28_401_130);
        assert_eq!(in_zone(t, &k8s_openapi::jiff::tz::TimeZone::UTC), "2024-01-01T00:10:00Z");
        let tz = crate::controllers::cron_schedule::time_zone(Some("Etc/GMT-2")).unwrap();
        assert_eq!(in_zone(t, &tz), "2024-01-01T02:10:00+02:00");
    }
}
