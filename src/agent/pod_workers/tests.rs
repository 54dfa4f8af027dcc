//! Pod workers against a recording syncer (the order of a pod's steps),
//! and against the kubelet over the in-memory runtime (restarts, back-off,
//! admission): no root, no containerd.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;
use crate::agent::cri::api::ContainerState;
use crate::agent::pod_status::FailureKind;
use crate::agent::testing::{pod, TestNode};
use crate::sync::LockExt;

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Sync(String),
    Terminate { pod: String, grace: i64, in_api: bool, failure: Option<FailureKind> },
    Cleanup { pod: String, deleted: bool },
    FinishDeletion(String),
}

/// A syncer that records each step and succeeds.
#[derive(Default)]
struct Steps {
    log: Mutex<Vec<Step>>,
}

impl Steps {
    fn push(&self, step: Step) {
        self.log.locked().push(step);
    }

    fn log(&self) -> Vec<Step> {
        self.log.locked().clone()
    }
}

#[async_trait::async_trait]
impl PodSyncer for Steps {
    async fn sync_pod(&self, pod: &Pod, _st: &mut PodState) -> Result<SyncResult, CriError> {
        self.push(Step::Sync(pod_util::name(pod).into()));
        Ok(SyncResult::default())
    }

    async fn terminate_pod(&self, pod: &Pod, st: &mut PodState, grace: i64, in_api: bool) -> Result<(), CriError> {
        let failure = st.failure.as_ref().map(|f| f.kind);
        self.push(Step::Terminate { pod: pod_util::name(pod).into(), grace, in_api, failure });
        Ok(())
    }

    async fn cleanup_pod(&self, pod: &Pod, deleted: bool) -> Result<(), CriError> {
        self.push(Step::Cleanup { pod: pod_util::name(pod).into(), deleted });
        Ok(())
    }

    async fn finish_deletion(&self, pod: &Pod) {
        self.push(Step::FinishDeletion(pod_util::name(pod).into()));
    }
}

/// Waits (at most 10 s, looking every 10 ms) until `check` holds.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn web(name: &str) -> Arc<Pod> {
    Arc::new(pod(name, json!({"containers": [{"name": "app", "image": "busybox:1"}]})))
}

#[tokio::test]
async fn a_pod_deleted_in_the_api_is_stopped_with_its_grace_then_cleaned_up_and_deleted() {
    let steps = Arc::new(Steps::default());
    let workers = PodWorkers::new(steps.clone());
    let p = web("web");
    workers.update(p.clone());
    eventually("the first sync", || steps.log() == [Step::Sync("web".into())]).await;
    let mut deleted = (*p).clone();
    deleted.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    deleted.metadata.deletion_grace_period_seconds = Some(7);
    workers.update(Arc::new(deleted));
    eventually("the worker's end", || workers.is_empty()).await;
    assert_eq!(
        steps.log()[1..],
        [
            Step::Terminate { pod: "web".into(), grace: 7, in_api: true, failure: None },
            Step::Cleanup { pod: "web".into(), deleted: true },
            Step::FinishDeletion("web".into()),
        ]
    );
}

#[tokio::test]
async fn a_pod_gone_from_its_source_is_stopped_without_a_last_status() {
    let steps = Arc::new(Steps::default());
    let workers = PodWorkers::new(steps.clone());
    let p = web("static");
    workers.update(p.clone());
    eventually("the first sync", || !steps.log().is_empty()).await;
    workers.remove(p);
    eventually("the worker's end", || workers.is_empty()).await;
    assert_eq!(
        steps.log()[1..],
        [
            Step::Terminate { pod: "static".into(), grace: 30, in_api: false, failure: None },
            Step::Cleanup { pod: "static".into(), deleted: true },
        ]
    );
}

#[tokio::test]
async fn a_refused_pod_ends_before_it_ever_syncs() {
    let steps = Arc::new(Steps::default());
    let workers = PodWorkers::new(steps.clone());
    let seen_running = Arc::new(Mutex::new(Vec::new()));
    let seen = seen_running.clone();
    workers.add_admit_handler(Arc::new(move |pod: &Pod, running: &[Arc<Pod>]| {
        let names: Vec<String> = running.iter().map(|p| pod_util::name(p).to_string()).collect();
        seen.locked().push(names);
        (pod_util::name(pod) == "second").then(|| PodFailure {
            kind: FailureKind::Rejected,
            reason: "OutOfcpu".into(),
            message: "Pod was rejected: no room".into(),
        })
    }));
    workers.update(web("first"));
    eventually("the first pod's sync", || steps.log().contains(&Step::Sync("first".into()))).await;
    workers.update(web("second"));
    let rejected =
        Step::Terminate { pod: "second".into(), grace: 0, in_api: true, failure: Some(FailureKind::Rejected) };
    eventually("the refusal", || steps.log().contains(&rejected)).await;
    assert!(!steps.log().contains(&Step::Sync("second".into())), "{:?}", steps.log());
    assert_eq!(*seen_running.locked(), [vec![], vec!["first".to_string()]]);
}

#[tokio::test]
async fn an_evicted_pod_is_stopped_with_the_eviction_grace() {
    let steps = Arc::new(Steps::default());
    let workers = PodWorkers::new(steps.clone());
    let p = web("hog");
    workers.update(p.clone());
    eventually("the first sync", || !steps.log().is_empty()).await;
    let failure = PodFailure { kind: FailureKind::Evicted, reason: "Evicted".into(), message: "low on memory".into() };
    assert!(workers.evict("uid-hog", failure.clone(), 7));
    assert!(!workers.evict("uid-other", failure, 7), "no worker, nothing to evict");
    let evicted = Step::Terminate { pod: "hog".into(), grace: 7, in_api: true, failure: Some(FailureKind::Evicted) };
    eventually("the eviction", || steps.log().contains(&evicted)).await;
    eventually("the cleanup", || steps.log().contains(&Step::Cleanup { pod: "hog".into(), deleted: false })).await;
    assert!(workers.knows("uid-hog"), "a finished pod keeps its worker until it is deleted");
}

#[tokio::test]
async fn a_pod_worker_restarts_a_crashed_container_then_backs_off() {
    let node = TestNode::start();
    let workers = PodWorkers::new(node.kubelet.clone());
    workers.update(web("web"));
    let running = |n: usize| {
        move |rt: &crate::agent::cri::fake::FakeRuntime| {
            let all = rt.containers_named("app");
            (all.len() == n && all.last().is_some_and(|(_, s)| *s == ContainerState::ContainerRunning))
                .then(|| all.last().map(|(id, _)| id.clone()))
                .flatten()
        }
    };
    let first = node.runtime.wait_for("the container running", running(1)).await;
    node.runtime.exit(&first, 1);
    workers.container_died("uid-web", &first);
    let second = node.runtime.wait_for("the container running again", running(2)).await;
    node.runtime.exit(&second, 2);
    workers.container_died("uid-web", &second);
    node.api
        .wait_for("the BackOff event", |api| api.event_reasons().contains(&"BackOff".to_string()).then_some(()))
        .await;
    let states: Vec<ContainerState> = node.runtime.containers_named("app").into_iter().map(|(_, s)| s).collect();
    assert_eq!(states, [ContainerState::ContainerExited, ContainerState::ContainerExited]);
}

#[tokio::test]
async fn the_node_refuses_a_pod_that_does_not_fit_and_never_runs_it() {
    let node = TestNode::start();
    let allocatable: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> =
        [("cpu", "1"), ("memory", "1Gi"), ("pods", "10")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.into())))
            .collect();
    let (_keep, allocatable) = watch::channel(allocatable);
    let workers = PodWorkers::new(node.kubelet.clone());
    workers.add_admit_handler(crate::agent::predicate_admission::handler(allocatable, node.kubelet.events.clone()));
    let big = pod(
        "big",
        json!({"containers": [{"name": "app", "image": "busybox:1",
        "resources": {"requests": {"cpu": "2"}}}]}),
    );
    workers.update(Arc::new(big));
    let status = node
        .api
        .wait_for("the Failed status", |api| api.status_writes("big").into_iter().find(|s| s["phase"] == "Failed"))
        .await;
    assert_eq!(status["reason"], "OutOfcpu");
    assert!(status["message"].as_str().is_some_and(|m| m.starts_with("Pod was rejected: ")), "{status}");
    assert!(!node.runtime.calls().contains(&"RunPodSandbox"), "{:?}", node.runtime.calls());
    node.api
        .wait_for("the OutOfcpu event", |api| api.event_reasons().contains(&"OutOfcpu".to_string()).then_some(()))
        .await;
}
