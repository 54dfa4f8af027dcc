//! The API status of a pod, from its spec and what the runtime holds
//! (upstream's generateAPIPodStatus): container states with reasons and
//! exit codes, lastState, restartCount, readiness, the phase, and the
//! conditions PodReadyToStartContainers, Initialized, ContainersReady and
//! Ready. Pure: the pod worker gathers the inputs.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, HostIP,
    Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::kuberuntime::manager::Waiting;
use super::kuberuntime::runtime_status::{ContainerRunState, RuntimeContainer, RuntimePod};
use super::pod_util::{self, ContainerKind};

/// Who decided a pod's end on the node, and so what its status shows
/// besides the reason and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Refused at admission (node pressure, host ports, resources): it
    /// never ran, and gets no DisruptionTarget condition.
    Rejected,
    /// Evicted while running (node pressure, local storage limits): it
    /// gets the DisruptionTarget condition.
    Evicted,
    /// Active on the node longer than its `activeDeadlineSeconds`.
    DeadlineExceeded,
}

/// A pod-level end decided by the node (admission, eviction, active deadline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFailure {
    pub kind: FailureKind,
    pub reason: String,
    pub message: String,
}

pub struct StatusInputs<'a> {
    pub pod: &'a Pod,
    pub rt: &'a RuntimePod,
    /// Waiting reasons by container name.
    pub waiting: &'a HashMap<String, Waiting>,
    /// Ready container ids (readiness probe passing, or no probe).
    pub ready: &'a HashSet<String>,
    /// Started container ids (startup probe passed, or no probe).
    pub started: &'a HashSet<String>,
    pub host_ips: &'a [String],
    /// `containerd`, for container ids like `containerd://…`.
    pub runtime_name: &'a str,
    /// Termination messages by container id.
    pub termination_messages: &'a HashMap<String, String>,
    pub failure: Option<&'a PodFailure>,
    /// The pod's containers are all stopped for good (deleted or finished).
    pub terminal: bool,
}

fn time(ns: i64) -> Option<Time> {
    if ns <= 0 {
        return None;
    }
    Timestamp::from_nanosecond(ns as i128).ok().map(Time)
}

fn terminated(c: &RuntimeContainer, runtime: &str, message: Option<&String>) -> ContainerStateTerminated {
    let reason = if !c.reason.is_empty() {
        c.reason.clone()
    } else if c.exit_code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    let msg = match (c.message.is_empty(), message.filter(|m| !m.is_empty())) {
        (true, Some(m)) => Some(m.clone()),
        (false, Some(m)) => Some(format!("{}: {m}", c.message)),
        (false, None) => Some(c.message.clone()),
        (true, None) => None,
    };
    ContainerStateTerminated {
        exit_code: c.exit_code,
        reason: Some(reason),
        message: msg,
        started_at: time(c.started_at),
        finished_at: time(c.finished_at),
        container_id: Some(format!("{runtime}://{}", c.id)),
        signal: None,
    }
}

fn waiting(reason: &str, message: Option<&str>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: message.filter(|m| !m.is_empty()).map(str::to_string),
        }),
        ..Default::default()
    }
}

fn container_status(
    i: &StatusInputs<'_>,
    kind: ContainerKind,
    spec: &k8s_openapi::api::core::v1::Container,
    default_waiting: &str,
) -> ContainerStatus {
    let latest = i.rt.latest(&spec.name);
    let mut status = ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        image_id: String::new(),
        ready: false,
        restart_count: 0,
        started: Some(false),
        ..Default::default()
    };
    let pending = i.waiting.get(&spec.name);
    match latest {
        None => {
            let (reason, message) =
                pending.map(|w| (w.reason.as_str(), Some(w.message.as_str()))).unwrap_or((default_waiting, None));
            status.state = Some(waiting(reason, message));
        }
        Some(c) => {
            status.restart_count = c.restart_count;
            if !c.image.is_empty() {
                status.image = c.image.clone();
            }
            status.image_id = c.image_ref.clone();
            status.container_id = Some(format!("{}://{}", i.runtime_name, c.id));
            let message = i.termination_messages.get(&c.id);
            match c.state {
                ContainerRunState::Running => {
                    status.state = Some(ContainerState {
                        running: Some(ContainerStateRunning { started_at: time(c.started_at) }),
                        ..Default::default()
                    });
                    let started = i.started.contains(&c.id);
                    status.started = Some(started);
                    status.ready = started
                        && i.ready.contains(&c.id)
                        && !matches!(kind, ContainerKind::Init | ContainerKind::Ephemeral);
                    if let Some(prev) = i.rt.previous(&spec.name).filter(|p| p.state == ContainerRunState::Exited) {
                        status.last_state = Some(ContainerState {
                            terminated: Some(terminated(prev, i.runtime_name, i.termination_messages.get(&prev.id))),
                            ..Default::default()
                        });
                    }
                }
                ContainerRunState::Exited => {
                    let term = terminated(c, i.runtime_name, message);
                    match pending.filter(|_| !i.terminal) {
                        // About to be started again: waiting, with the exit as lastState.
                        Some(w) => {
                            status.state = Some(waiting(&w.reason, Some(&w.message)));
                            status.last_state = Some(ContainerState { terminated: Some(term), ..Default::default() });
                        }
                        None => {
                            // An init container that ran to completion is
                            // ready (upstream's prober manager).
                            status.ready = matches!(kind, ContainerKind::Init) && term.exit_code == 0;
                            status.state = Some(ContainerState { terminated: Some(term), ..Default::default() });
                            if let Some(prev) =
                                i.rt.previous(&spec.name).filter(|p| p.state == ContainerRunState::Exited)
                            {
                                status.last_state = Some(ContainerState {
                                    terminated: Some(terminated(
                                        prev,
                                        i.runtime_name,
                                        i.termination_messages.get(&prev.id),
                                    )),
                                    ..Default::default()
                                });
                            }
                        }
                    }
                }
                ContainerRunState::Created | ContainerRunState::Unknown => {
                    let (reason, message) = pending
                        .map(|w| (w.reason.as_str(), Some(w.message.as_str())))
                        .unwrap_or(("ContainerCreating", None));
                    status.state = Some(waiting(reason, message));
                }
            }
        }
    }
    status
}

fn is_running(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.running.is_some())
}

fn exit_code(s: &ContainerStatus) -> Option<i32> {
    s.state.as_ref().and_then(|st| st.terminated.as_ref()).map(|t| t.exit_code)
}

fn last_exit(s: &ContainerStatus) -> Option<i32> {
    s.last_state.as_ref().and_then(|st| st.terminated.as_ref()).map(|t| t.exit_code)
}

/// Upstream's getPhase.
pub fn phase(
    pod: &Pod,
    init: &[(ContainerKind, ContainerStatus)],
    regular: &[ContainerStatus],
    terminal: bool,
) -> &'static str {
    let policy = pod_util::restart_policy(pod);
    let mut pending_init = 0;
    let mut failed_init = 0;
    for (kind, s) in init {
        if *kind == ContainerKind::Sidecar {
            if s.started != Some(true) && !terminal {
                pending_init += 1;
            }
            continue;
        }
        match exit_code(s) {
            Some(0) => {}
            Some(_) => failed_init += 1,
            None if last_exit(s).is_some_and(|e| e != 0) => failed_init += 1,
            None => pending_init += 1,
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for s in regular {
        if is_running(s) {
            running += 1;
        } else if let Some(code) = exit_code(s) {
            stopped += 1;
            if code == 0 {
                succeeded += 1;
            }
        } else if s.state.as_ref().is_some_and(|st| st.waiting.is_some()) {
            if last_exit(s).is_some() {
                stopped += 1;
            } else {
                waiting += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 || failed_init > 0 {
        return if terminal { "Failed" } else { "Pending" };
    }
    if waiting > 0 {
        return if terminal { "Failed" } else { "Pending" };
    }
    if running > 0 && unknown == 0 {
        return if terminal { "Failed" } else { "Running" };
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if terminal {
            return if stopped == succeeded { "Succeeded" } else { "Failed" };
        }
        if policy == "Always" {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if policy == "Never" {
            return "Failed";
        }
        return "Running";
    }
    "Pending"
}

fn condition(kind: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: kind.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: if ok { None } else { reason.map(str::to_string) },
        message: if ok { None } else { message },
        ..Default::default()
    }
}

/// The pod's status; conditions keep their transition times from `pod.status`.
pub fn generate(i: &StatusInputs<'_>) -> PodStatus {
    let pod = i.pod;
    let old = pod.status.clone().unwrap_or_default();
    let spec = pod_util::spec(pod);
    let mut init = Vec::new();
    for (kind, c) in pod_util::containers(pod).filter(|(k, _)| *k != ContainerKind::Regular) {
        init.push((kind, container_status(i, kind, c, "PodInitializing")));
    }
    let initialized = init.iter().all(|(kind, s)| match kind {
        ContainerKind::Sidecar => s.started == Some(true),
        _ => exit_code(s) == Some(0),
    }) || spec.containers.iter().any(|c| i.rt.latest(&c.name).is_some());
    let default_waiting = if initialized { "ContainerCreating" } else { "PodInitializing" };
    let regular: Vec<ContainerStatus> =
        spec.containers.iter().map(|c| container_status(i, ContainerKind::Regular, c, default_waiting)).collect();
    // Ephemeral containers: reported, never part of the phase or readiness.
    let ephemeral: Vec<ContainerStatus> = pod_util::ephemeral_containers(pod)
        .map(|ec| container_status(i, ContainerKind::Ephemeral, &pod_util::ephemeral_as_container(ec), default_waiting))
        .collect();
    let mut phase = phase(pod, &init, &regular, i.terminal || i.failure.is_some());
    if i.failure.is_some() {
        phase = "Failed";
    }
    let sandbox = i.rt.sandboxes.first();
    let host_network = spec.host_network == Some(true);
    let pod_ips: Vec<String> =
        if host_network { i.host_ips.to_vec() } else { sandbox.map(|s| s.ips.clone()).unwrap_or_default() };
    let sandbox_ready = i.rt.ready_sandbox().is_some();

    let mut unready: Vec<String> = regular.iter().filter(|s| !s.ready).map(|s| s.name.clone()).collect();
    for (kind, s) in &init {
        if *kind == ContainerKind::Sidecar && !s.ready {
            unready.push(s.name.clone());
        }
    }
    let incomplete: Vec<String> = init
        .iter()
        .filter(|(kind, s)| match kind {
            ContainerKind::Sidecar => s.started != Some(true),
            _ => exit_code(s) != Some(0),
        })
        .map(|(_, s)| s.name.clone())
        .collect();
    let done = phase == "Succeeded" || phase == "Failed";
    let list = |names: &[String]| format!("[{}]", names.join(" "));
    let containers_ready = if done {
        condition("ContainersReady", false, Some("PodCompleted"), None)
    } else {
        condition(
            "ContainersReady",
            unready.is_empty(),
            Some("ContainersNotReady"),
            Some(format!("containers with unready status: {}", list(&unready))),
        )
    };
    let gates: Vec<String> = spec
        .readiness_gates
        .iter()
        .flatten()
        .map(|g| g.condition_type.clone())
        .filter(|t| !old.conditions.iter().flatten().any(|c| &c.type_ == t && c.status == "True"))
        .collect();
    let ready = if done {
        condition("Ready", false, Some("PodCompleted"), None)
    } else if !unready.is_empty() {
        condition(
            "Ready",
            false,
            Some("ContainersNotReady"),
            Some(format!("containers with unready status: {}", list(&unready))),
        )
    } else {
        condition(
            "Ready",
            gates.is_empty(),
            Some("ReadinessGatesNotReady"),
            Some(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                gates.first().cloned().unwrap_or_default()
            )),
        )
    };
    // Done, or initialized with only sidecars still running.
    let sidecars_only =
        || incomplete.iter().all(|n| init.iter().any(|(k, s)| *k == ContainerKind::Sidecar && &s.name == n));
    let initialized_condition = if (done && incomplete.is_empty()) || (initialized && sidecars_only()) {
        condition("Initialized", true, None, None)
    } else {
        condition(
            "Initialized",
            incomplete.is_empty(),
            Some("ContainersNotInitialized"),
            Some(format!("containers with incomplete status: {}", list(&incomplete))),
        )
    };
    let ours = vec![
        condition("PodReadyToStartContainers", sandbox_ready && !done, None, None),
        initialized_condition,
        ready,
        containers_ready,
    ];
    let now = Time(Timestamp::now());
    let mut conditions: Vec<PodCondition> = Vec::new();
    for mut c in ours {
        let previous = old.conditions.iter().flatten().find(|o| o.type_ == c.type_);
        c.last_transition_time = match previous {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Some(now.clone()),
        };
        conditions.push(c);
    }
    // Conditions others own (PodScheduled, DisruptionTarget, readiness gates) stay.
    for c in old.conditions.iter().flatten() {
        if !conditions.iter().any(|o| o.type_ == c.type_) {
            conditions.push(c.clone());
        }
    }
    let order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"];
    conditions.sort_by_key(|c| order.iter().position(|o| *o == c.type_).unwrap_or(order.len()));
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: i.host_ips.first().cloned(),
        host_ips: Some(i.host_ips.iter().map(|ip| HostIP { ip: ip.clone() }).collect()),
        pod_ip: pod_ips.first().cloned().or_else(|| old.pod_ip.clone()),
        pod_ips: if pod_ips.is_empty() {
            old.pod_ips.clone()
        } else {
            Some(pod_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect())
        },
        start_time: old.start_time.clone().or(Some(now)),
        qos_class: Some(pod_util::qos_class(pod).to_string()),
        init_container_statuses: (!init.is_empty()).then(|| init.into_iter().map(|(_, s)| s).collect()),
        container_statuses: Some(regular),
        reason: i.failure.map(|f| f.reason.clone()).or(old.reason.clone().filter(|_| done)),
        message: i.failure.map(|f| f.message.clone()).or(old.message.clone().filter(|_| done)),
        nominated_node_name: old.nominated_node_name.clone(),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::kuberuntime::runtime_status::RuntimeSandbox;
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "n", "uid": "u"}, "spec": spec})).unwrap()
    }

    fn rc(name: &str, state: ContainerRunState, exit: i32, created: i64) -> RuntimeContainer {
        RuntimeContainer {
            id: format!("{name}-{created}"),
            name: name.into(),
            sandbox_id: "sb".into(),
            restart_count: created as i32 - 1,
            state,
            created_at: created,
            started_at: created * 1_000_000_000,
            finished_at: if state == ContainerRunState::Exited { created * 1_000_000_000 + 1 } else { 0 },
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: "docker.io/library/busybox:1".into(),
            image_ref: "sha256:x".into(),
            hash: String::new(),
            log_path: String::new(),
            annotations: Default::default(),
            mounts: vec![],
        }
    }

    fn gen(p: &Pod, rt: &RuntimePod, waiting: &HashMap<String, Waiting>, ready: &[&str], terminal: bool) -> PodStatus {
        let ready: HashSet<String> = ready.iter().map(|s| s.to_string()).collect();
        generate(&StatusInputs {
            pod: p,
            rt,
            waiting,
            ready: &ready,
            started: &ready,
            host_ips: &["192.168.0.2".to_string()],
            runtime_name: "containerd",
            termination_messages: &HashMap::new(),
            failure: None,
            terminal,
        })
    }

    fn sandbox() -> RuntimeSandbox {
        RuntimeSandbox { id: "sb".into(), attempt: 0, ready: true, created_at: 1, ips: vec!["10.42.0.5".into()] }
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_running_ready_pod() {
        let p = pod(json!({"containers": [{"name": "a", "image": "busybox:1"}]}));
        let rt = RuntimePod { sandboxes: vec![sandbox()], containers: vec![rc("a", ContainerRunState::Running, 0, 1)] };
        let s = gen(&p, &rt, &HashMap::new(), &["a-1"], false);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.42.0.5"));
        assert_eq!(cond(&s, "Ready").status, "True");
        assert_eq!(cond(&s, "PodReadyToStartContainers").status, "True");
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert!(c.ready);
        assert_eq!(c.container_id.as_deref(), Some("containerd://a-1"));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    }

    #[test]
    fn crash_loop_shows_waiting_with_the_last_exit() {
        let p = pod(json!({"containers": [{"name": "a"}]}));
        let rt = RuntimePod { sandboxes: vec![sandbox()], containers: vec![rc("a", ContainerRunState::Exited, 3, 2)] };
        let w = HashMap::from([(
            "a".to_string(),
            Waiting { reason: "CrashLoopBackOff".into(), message: "back-off 10s".into() },
        )]);
        let s = gen(&p, &rt, &w, &[], false);
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(c.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("CrashLoopBackOff"));
        assert_eq!(c.last_state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 3);
        assert_eq!(c.restart_count, 1);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Ready").message.as_deref(), Some("containers with unready status: [a]"));
    }

    #[test]
    fn finished_pods_succeed_or_fail() {
        let p = pod(json!({"restartPolicy": "Never", "containers": [{"name": "a"}, {"name": "b"}]}));
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![rc("a", ContainerRunState::Exited, 0, 1), rc("b", ContainerRunState::Exited, 0, 1)],
        };
        let s = gen(&p, &rt, &HashMap::new(), &[], false);
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
        let t = s.container_statuses.as_ref().unwrap()[0].state.as_ref().unwrap().terminated.clone().unwrap();
        assert_eq!(t.reason.as_deref(), Some("Completed"));
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![rc("a", ContainerRunState::Exited, 1, 1), rc("b", ContainerRunState::Exited, 0, 1)],
        };
        assert_eq!(gen(&p, &rt, &HashMap::new(), &[], false).phase.as_deref(), Some("Failed"));
    }

    #[test]
    fn init_containers_hold_the_pod_pending() {
        let p = pod(json!({"initContainers": [{"name": "i"}], "containers": [{"name": "a"}]}));
        let rt = RuntimePod { sandboxes: vec![sandbox()], containers: vec![rc("i", ContainerRunState::Running, 0, 1)] };
        let s = gen(&p, &rt, &HashMap::new(), &[], false);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(cond(&s, "Initialized").status, "False");
        assert_eq!(cond(&s, "Initialized").message.as_deref(), Some("containers with incomplete status: [i]"));
        let a = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(a.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("PodInitializing"));
        assert!(!s.init_container_statuses.as_ref().unwrap()[0].ready);
        // Done with exit 0: the init container is ready (a failed one is not).
        for (code, ready) in [(0, true), (1, false)] {
            let rt = RuntimePod {
                sandboxes: vec![sandbox()],
                containers: vec![rc("i", ContainerRunState::Exited, code, 1)],
            };
            let s = gen(&p, &rt, &HashMap::new(), &[], false);
            assert_eq!(s.init_container_statuses.as_ref().unwrap()[0].ready, ready, "exit {code}");
        }
    }

    #[test]
    fn a_new_pod_waits_in_container_creating_with_pull_errors_shown() {
        let p = pod(json!({"containers": [{"name": "a", "image": "nope:1"}]}));
        let w =
            HashMap::from([("a".to_string(), Waiting { reason: "ErrImagePull".into(), message: "not found".into() })]);
        let s = gen(&p, &RuntimePod::default(), &w, &[], false);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(c.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("ErrImagePull"));
        assert_eq!(cond(&s, "PodReadyToStartContainers").status, "False");
    }

    #[test]
    fn other_conditions_are_kept() {
        let mut p = pod(json!({"containers": [{"name": "a"}]}));
        p.status =
            Some(serde_json::from_value(json!({"conditions": [{"type": "PodScheduled", "status": "True"}]})).unwrap());
        let s = gen(&p, &RuntimePod::default(), &HashMap::new(), &[], false);
        assert_eq!(cond(&s, "PodScheduled").status, "True");
    }

    #[test]
    fn ephemeral_containers_are_reported_apart() {
        let p = pod(json!({"containers": [{"name": "a"}],
            "ephemeralContainers": [{"name": "d", "image": "busybox:1"}, {"name": "e", "image": "busybox:1"}]}));
        let rt = RuntimePod {
            sandboxes: vec![sandbox()],
            containers: vec![rc("d", ContainerRunState::Exited, 3, 1), rc("a", ContainerRunState::Running, 0, 1)],
        };
        let s = gen(&p, &rt, &HashMap::new(), &["a-1", "d-1"], false);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Ready").status, "True");
        let eph = s.ephemeral_container_statuses.as_ref().unwrap();
        assert_eq!(eph.len(), 2);
        let t = eph[0].state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));
        assert!(!eph[0].ready);
        assert_eq!(
            eph[1].state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(),
            Some("ContainerCreating")
        );
        assert_eq!(s.container_statuses.as_ref().unwrap().len(), 1);
    }
}
