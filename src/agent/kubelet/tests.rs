//! The kubelet's steps of a pod's life against the in-memory runtime and a
//! recording API server: no root, no containerd.

use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::agent::cri::api::ContainerState;
use crate::agent::pod_workers::{PodState, PodSyncer};
use crate::agent::prober::ProbeType;
use crate::agent::testing::{pod, TestNode};
use crate::agent::volume_manager::mounter::FakeMount;

fn app(extra: Value) -> Value {
    let mut c = json!({"name": "app", "image": "busybox:1"});
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    json!({"containers": [c]})
}

fn states(node: &TestNode, name: &str) -> Vec<ContainerState> {
    node.runtime.containers_named(name).into_iter().map(|(_, s)| s).collect()
}

/// The newest status the API was sent for pod `name` that `check` accepts.
async fn status_where(node: &TestNode, name: &str, check: impl Fn(&Value) -> bool) -> Value {
    node.api.wait_for("the pod's status", |api| api.status_writes(name).into_iter().rev().find(|s| check(s))).await
}

#[tokio::test]
async fn a_new_pod_gets_a_sandbox_and_running_containers() {
    let node = TestNode::start();
    let p = pod("web", app(json!({})));
    let mut st = PodState::default();
    let r = node.kubelet.sync_pod(&p, &mut st).await.expect("sync");
    assert!(!r.terminal);
    assert_eq!(node.runtime.sandbox_count(), (1, 1));
    assert_eq!(states(&node, "app"), [ContainerState::ContainerRunning]);
    let status = status_where(&node, "web", |s| s["phase"] == "Running").await;
    assert_eq!(status["containerStatuses"][0]["ready"], true);
    assert_eq!(status["podIP"], "10.42.0.2");
    let events = node.api.wait_for("Started", |a| Some(a.event_reasons()).filter(|r| r.contains(&"Started".into())));
    let events = events.await;
    assert!(events.contains(&"Pulled".to_string()) && events.contains(&"Created".to_string()), "{events:?}");
}

#[tokio::test]
async fn a_crashed_container_restarts_once_then_backs_off() {
    let node = TestNode::start();
    let p = pod("web", app(json!({})));
    let mut st = PodState::default();
    node.kubelet.sync_pod(&p, &mut st).await.expect("first sync");
    let (first, _) = node.runtime.containers_named("app")[0].clone();
    node.runtime.exit(&first, 1);
    node.kubelet.sync_pod(&p, &mut st).await.expect("second sync");
    assert_eq!(states(&node, "app"), [ContainerState::ContainerExited, ContainerState::ContainerRunning]);
    let (second, _) = node.runtime.containers_named("app")[1].clone();
    node.runtime.exit(&second, 1);
    let r = node.kubelet.sync_pod(&p, &mut st).await.expect("third sync");
    assert_eq!(node.runtime.containers_named("app").len(), 2, "no third instance within the back-off");
    assert_eq!(st.waiting["app"].reason, "CrashLoopBackOff");
    assert!(st.waiting["app"].message.starts_with("back-off 10s restarting failed container=app"));
    let next = r.next.expect("a sync when the back-off ends");
    assert!(next > Duration::from_secs(5) && next <= Duration::from_secs(10), "{next:?}");
    let status = status_where(&node, "web", |s| s["containerStatuses"][0]["state"]["waiting"].is_object()).await;
    assert_eq!(status["containerStatuses"][0]["state"]["waiting"]["reason"], "CrashLoopBackOff");
    assert_eq!(status["containerStatuses"][0]["restartCount"], 1);
}

#[tokio::test]
async fn a_failed_liveness_probe_restarts_the_container_with_the_probes_grace_period() {
    let node = TestNode::start();
    let probe = json!({"livenessProbe": {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 5}});
    let mut spec = app(probe);
    spec["terminationGracePeriodSeconds"] = json!(60);
    let p = pod("web", spec);
    let mut st = PodState::default();
    node.kubelet.sync_pod(&p, &mut st).await.expect("sync");
    let (first, _) = node.runtime.containers_named("app")[0].clone();
    node.probes.fail("app", ProbeType::Liveness);
    node.kubelet.sync_pod(&p, &mut st).await.expect("sync after the probe failed");
    assert_eq!(node.runtime.stops(), [(first, 5)], "the probe's own grace period, not the pod's 60 s");
    let killing = node.api.wait_for("Killing", |a| {
        a.requests().into_iter().find(|r| r.body["reason"] == "Killing").map(|r| r.body["message"].clone())
    });
    assert_eq!(killing.await, "Container app failed liveness probe, will be restarted");
    assert_eq!(states(&node, "app"), [ContainerState::ContainerExited, ContainerState::ContainerRunning]);
}

#[tokio::test]
async fn a_pod_past_its_active_deadline_fails_without_starting() {
    let node = TestNode::start();
    let mut p = pod("job", app(json!({})));
    p.spec.as_mut().expect("spec").active_deadline_seconds = Some(1);
    let hour_ago = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(3600);
    p.status = Some(PodStatus {
        start_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(hour_ago)),
        ..Default::default()
    });
    let mut st = PodState::default();
    let r = node.kubelet.sync_pod(&p, &mut st).await.expect("sync");
    assert!(r.terminal);
    assert_eq!(st.failure.as_ref().map(|f| f.kind), Some(FailureKind::DeadlineExceeded));
    assert_eq!(node.runtime.sandbox_count(), (0, 0));
    node.kubelet.terminate_pod(&p, &mut st, 30, true).await.expect("terminate");
    let status = status_where(&node, "job", |s| s["phase"] == "Failed").await;
    assert_eq!(status["reason"], "DeadlineExceeded");
    assert!(status["conditions"].as_array().is_some_and(|c| c.iter().all(|c| c["type"] != "DisruptionTarget")));
}

#[tokio::test]
async fn an_evicted_pod_shows_the_disruption_target_a_rejected_one_does_not() {
    let node = TestNode::start();
    let p = pod("web", app(json!({})));
    let mut st = PodState::default();
    node.kubelet.sync_pod(&p, &mut st).await.expect("sync");
    let message = "The node was low on resource: memory. ";
    st.failure = Some(PodFailure { kind: FailureKind::Evicted, reason: "Evicted".into(), message: message.into() });
    node.kubelet.terminate_pod(&p, &mut st, 1, true).await.expect("terminate");
    assert_eq!(node.runtime.stops().len(), 1);
    assert_eq!(node.runtime.sandbox_count(), (1, 0), "the sandbox is stopped");
    let status = status_where(&node, "web", |s| s["phase"] == "Failed").await;
    assert_eq!((status["reason"].as_str(), status["message"].as_str()), (Some("Evicted"), Some(message)));
    let target = status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "DisruptionTarget"));
    assert_eq!(target.map(|c| c["reason"].clone()), Some(json!("TerminationByKubelet")));

    // The same words from admission: the pod never ran, no condition.
    let q = pod("late", app(json!({})));
    let mut st = PodState {
        failure: Some(PodFailure { kind: FailureKind::Rejected, reason: "Evicted".into(), message: message.into() }),
        ..Default::default()
    };
    node.kubelet.terminate_pod(&q, &mut st, 0, true).await.expect("terminate");
    let status = status_where(&node, "late", |s| s["phase"] == "Failed").await;
    assert_eq!(status["reason"], "Evicted");
    assert!(status["conditions"].as_array().is_some_and(|c| c.iter().all(|c| c["type"] != "DisruptionTarget")));
}

#[tokio::test]
async fn a_deleted_pod_leaves_nothing_in_the_runtime_or_on_disk() {
    let node = TestNode::start();
    let p = pod("web", app(json!({})));
    let mut st = PodState::default();
    node.kubelet.sync_pod(&p, &mut st).await.expect("sync");
    let pod_dir = node.kubelet.pods_dir().join("uid-web");
    assert!(pod_dir.join("etc-hosts").is_file());
    node.kubelet.terminate_pod(&p, &mut st, 30, false).await.expect("terminate");
    node.kubelet.cleanup_pod(&p, true).await.expect("cleanup");
    assert_eq!(node.runtime.sandbox_count(), (0, 0));
    assert!(node.runtime.containers_named("app").is_empty());
    assert!(!pod_dir.exists());
    assert!(node.kubelet.known_uids().await.expect("uids").is_empty());
}

#[tokio::test]
async fn a_pods_memory_volume_and_sub_path_are_mounted_and_released_without_root() {
    let node = TestNode::start();
    let p = pod(
        "web",
        json!({
            "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}],
            "containers": [{"name": "app", "image": "busybox:1",
                "volumeMounts": [{"name": "scratch", "mountPath": "/data"},
                                 {"name": "scratch", "mountPath": "/logs", "subPath": "logs"}]}],
        }),
    );
    let mut st = PodState::default();
    node.kubelet.sync_pod(&p, &mut st).await.expect("sync");
    let (id, _) = node.runtime.containers_named("app")[0].clone();
    let mounts = node.runtime.mounts_of(&id);
    let host_of = |path: &str| mounts.iter().find(|m| m.container_path == path).map(|m| m.host_path.clone());
    let volume = node.kubelet.pods_dir().join("uid-web/volumes/kubernetes.io~empty-dir/scratch");
    assert_eq!(host_of("/data"), Some(volume.to_string_lossy().into_owned()));
    let sub_target = host_of("/logs").expect("the subPath's mount");
    assert!(sub_target.contains("/volume-subpaths/scratch/app/1"), "{sub_target}");
    assert!(volume.join("logs").is_dir(), "the subPath is made in the volume");
    assert_eq!(node.mounter.mounts_on(&volume), [FakeMount::Tmpfs { size: Some(16 << 20) }]);
    let logs = std::fs::canonicalize(volume.join("logs")).expect("canonical");
    let bind = FakeMount::Bind { source: logs, read_only: false };
    assert_eq!(node.mounter.mounts_on(std::path::Path::new(&sub_target)), [bind]);

    node.kubelet.terminate_pod(&p, &mut st, 30, false).await.expect("terminate");
    node.kubelet.cleanup_pod(&p, true).await.expect("cleanup");
    assert!(node.mounter.table().is_empty(), "every mount released: {:?}", node.mounter.table());
    assert!(!node.kubelet.pods_dir().join("uid-web").exists());
}
