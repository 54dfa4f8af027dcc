//! TTLAfterFinishedController: a Job with `ttlSecondsAfterFinished` is
//! deleted (background propagation) that many seconds after it finished,
//! the finish time being its Complete or Failed condition's transition.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions};

use super::informers::{self, Informer};
use super::ControllerError;

pub async fn run(client: kube::Client, jobs: Informer<Job>) {
    let (jobs, events) = jobs.trigger_self();
    informers::run("ttl_jobs_to_delete", jobs, vec![events], reconcile, Arc::new(client)).await;
}

/// When the Job finished, if it did.
fn finish_time(job: &Job) -> Option<Timestamp> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

/// How long until the Job expires (zero or less: now), if it has a TTL and finished.
fn time_left(job: &Job, now: Timestamp) -> Option<i64> {
    let ttl = job.spec.as_ref()?.ttl_seconds_after_finished?;
    if job.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let finished = finish_time(job)?;
    Some(finished.as_millisecond() + i64::from(ttl) * 1000 - now.as_millisecond())
}

async fn reconcile(job: Arc<Job>, client: Arc<kube::Client>) -> Result<Action, ControllerError> {
    let Some(left) = time_left(&job, Timestamp::now()) else { return Ok(Action::await_change()) };
    if left > 0 {
        return Ok(Action::requeue(Duration::from_millis(u64::try_from(left).unwrap_or(0))));
    }
    // Check the newest copy: the TTL may have been changed or removed.
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    let api: Api<Job> = Api::namespaced((*client).clone(), &ns);
    let Some(fresh) = api.get_opt(&name).await? else { return Ok(Action::await_change()) };
    match time_left(&fresh, Timestamp::now()) {
        None => return Ok(Action::await_change()),
        Some(left) if left > 0 => return Ok(Action::requeue(Duration::from_millis(u64::try_from(left).unwrap_or(0)))),
        Some(_) => {}
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: fresh.metadata.uid.clone(),
            resource_version: fresh.metadata.resource_version.clone(),
        }),
        ..DeleteParams::background()
    };
    tracing::debug!(namespace = %ns, job = %name, "deleting finished job whose TTL expired");
    match api.delete(&name, &params).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobSpec, JobStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn expiry_counts_from_the_finish_condition() {
        let finished: Timestamp = "2024-01-01T00:00:00Z".parse().unwrap();
        let job = Job {
            spec: Some(JobSpec { ttl_seconds_after_finished: Some(10), ..Default::default() }),
            status: Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: "Complete".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(finished)),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let now: Timestamp = "2024-01-01T00:00:04Z".parse().unwrap();
        assert_eq!(time_left(&job, now), Some(6000));
        assert_eq!(time_left(&Job::default(), now), None);
    }
}
