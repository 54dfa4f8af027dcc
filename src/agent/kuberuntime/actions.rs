//! What to do next for a pod, from its spec and what the runtime holds:
//! upstream's computePodActions. A pure function, so every rule is tested
//! without a runtime: (re)create the sandbox, which init container or
//! sidecar to start, which containers to start or kill.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;

use super::runtime_status::{ContainerRunState, RuntimeContainer, RuntimePod};
use crate::agent::pod_util::{self, ContainerKind};
use crate::agent::prober::ProbeType;

/// A container of the spec to create and start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToStart {
    pub kind: ContainerKind,
    pub name: String,
}

/// Why a running container is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Its liveness or startup probe failed past its threshold (the probe's
    /// own grace period, if it has one, applies).
    ProbeFailed(ProbeType),
    /// Its spec changed (the hash on the runtime container differs).
    DefinitionChanged,
    /// The runtime reports a state that is neither running nor exited.
    UnknownState,
}

/// A running (or stuck) runtime container to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToKill {
    pub id: String,
    pub name: String,
    pub reason: KillReason,
}

impl ToKill {
    /// Why, for the Killing event ("Container app failed liveness probe, will be restarted").
    pub fn message(&self) -> String {
        match self.reason {
            KillReason::ProbeFailed(t) => {
                let word = match t {
                    ProbeType::Liveness => "liveness",
                    ProbeType::Startup => "startup",
                    ProbeType::Readiness => "readiness",
                };
                format!("Container {} failed {word} probe, will be restarted", self.name)
            }
            KillReason::DefinitionChanged => format!("Container {} definition changed, will be restarted", self.name),
            KillReason::UnknownState => "Container is in an unknown state, will be restarted".into(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and the sandbox first (the sandbox is gone or changed).
    pub kill_pod: bool,
    pub create_sandbox: bool,
    /// The ready sandbox to create containers in (None with create_sandbox).
    pub sandbox_id: Option<String>,
    /// The attempt number of a sandbox to create.
    pub attempt: u32,
    pub start: Vec<ToStart>,
    pub kill: Vec<ToKill>,
    /// All regular init containers succeeded and sidecars started.
    pub initialized: bool,
}

/// What the prober knows about running containers, by container id.
#[derive(Debug, Clone, Default)]
pub struct ProbeState {
    /// Liveness or startup probe failed past its threshold: restart; the
    /// probe that failed.
    pub must_restart: HashMap<String, ProbeType>,
    /// Containers whose startup probe succeeded (or that have none).
    pub started: HashSet<String>,
}

/// Computes the next actions for `pod` given the runtime's view `rt`.
pub fn compute(pod: &Pod, rt: &RuntimePod, probes: &ProbeState) -> PodActions {
    let mut actions = PodActions::default();
    let Some(sandbox) = rt.ready_sandbox() else {
        return new_sandbox(pod, rt);
    };
    actions.sandbox_id = Some(sandbox.id.clone());
    // Only containers of the current sandbox count; older ones are history.
    let current = |name: &str| rt.containers.iter().find(|c| c.name == name && c.sandbox_id == sandbox.id);
    let spec = pod_util::spec(pod);

    // Ephemeral containers start once, ahead of init containers (so they
    // run even when those fail, as upstream), and never again: any
    // instance of one, in any sandbox, means it ran.
    for ec in pod_util::ephemeral_containers(pod) {
        if rt.latest(&ec.name).is_none() {
            actions.start.push(ToStart { kind: ContainerKind::Ephemeral, name: ec.name.clone() });
        }
    }

    // Init containers, in order, until one is not done.
    let regular_seen = spec.containers.iter().any(|c| current(&c.name).is_some());
    let mut initialized = true;
    for c in spec.init_containers.iter().flatten() {
        let sidecar = pod_util::is_sidecar(c);
        let kind = if sidecar { ContainerKind::Sidecar } else { ContainerKind::Init };
        let status = current(&c.name);
        if sidecar {
            match status {
                Some(s) if s.state == ContainerRunState::Running => {
                    if let Some(probe) = probes.must_restart.get(&s.id) {
                        actions.kill.push(kill(s, KillReason::ProbeFailed(*probe)));
                        actions.start.push(ToStart { kind, name: c.name.clone() });
                        if !regular_seen {
                            initialized = false;
                            break;
                        }
                    } else if !probes.started.contains(&s.id) && !regular_seen {
                        initialized = false;
                        break;
                    }
                }
                Some(s) => {
                    if s.state != ContainerRunState::Exited {
                        actions.kill.push(kill(s, KillReason::UnknownState));
                    }
                    actions.start.push(ToStart { kind, name: c.name.clone() });
                    if !regular_seen {
                        initialized = false;
                        break;
                    }
                }
                None => {
                    actions.start.push(ToStart { kind, name: c.name.clone() });
                    if !regular_seen {
                        initialized = false;
                        break;
                    }
                }
            }
            continue;
        }
        if regular_seen {
            // Init containers ran before the regular ones; they are not rerun.
            continue;
        }
        match status {
            None => {
                actions.start.push(ToStart { kind, name: c.name.clone() });
                initialized = false;
                break;
            }
            Some(s) if s.state == ContainerRunState::Running => {
                initialized = false;
                break;
            }
            Some(s) if s.state == ContainerRunState::Exited && s.exit_code == 0 => continue,
            Some(s) if s.state == ContainerRunState::Exited => {
                initialized = false;
                if pod_util::should_restart(pod, kind, s.exit_code) {
                    actions.start.push(ToStart { kind, name: c.name.clone() });
                } else {
                    // The pod has failed: nothing more starts.
                    actions.kill_pod = true;
                }
                break;
            }
            Some(s) => {
                actions.kill.push(kill(s, KillReason::UnknownState));
                actions.start.push(ToStart { kind, name: c.name.clone() });
                initialized = false;
                break;
            }
        }
    }
    actions.initialized = initialized;
    if !initialized {
        return actions;
    }

    // Regular containers.
    let mut keep = 0;
    for c in &spec.containers {
        let kind = ContainerKind::Regular;
        match current(&c.name) {
            None => actions.start.push(ToStart { kind, name: c.name.clone() }),
            Some(s) if s.state == ContainerRunState::Running => {
                if s.hash != pod_util::container_hash(c) {
                    actions.kill.push(kill(s, KillReason::DefinitionChanged));
                    actions.start.push(ToStart { kind, name: c.name.clone() });
                } else if let Some(probe) = probes.must_restart.get(&s.id) {
                    actions.kill.push(kill(s, KillReason::ProbeFailed(*probe)));
                    // A container killed by its probe failed: it restarts unless the policy is Never.
                    if pod_util::restart_policy(pod) != "Never" {
                        actions.start.push(ToStart { kind, name: c.name.clone() });
                    }
                } else {
                    keep += 1;
                }
            }
            Some(s) if s.state == ContainerRunState::Exited => {
                if pod_util::should_restart(pod, kind, s.exit_code) {
                    actions.start.push(ToStart { kind, name: c.name.clone() });
                }
            }
            Some(s) => {
                actions.kill.push(kill(s, KillReason::UnknownState));
                actions.start.push(ToStart { kind, name: c.name.clone() });
            }
        }
    }
    let regular_to_start = actions.start.iter().any(|s| s.kind == ContainerKind::Regular);
    if keep == 0 && !regular_to_start {
        // Every regular container is done and none restarts: the pod is
        // finished; stop what is left (sidecars) and the sandbox.
        actions.kill_pod = true;
        actions.start.clear();
        actions.kill.clear();
    }
    actions
}

fn kill(c: &RuntimeContainer, reason: KillReason) -> ToKill {
    ToKill { id: c.id.clone(), name: c.name.clone(), reason }
}

/// No ready sandbox: make one and start from the beginning, unless the
/// pod already ran to its end and must not restart.
fn new_sandbox(pod: &Pod, rt: &RuntimePod) -> PodActions {
    let mut actions = PodActions {
        kill_pod: rt.running().next().is_some() || rt.sandboxes.iter().any(|s| s.ready),
        ..Default::default()
    };
    let had_sandbox = !rt.sandboxes.is_empty();
    if had_sandbox && pod_util::restart_policy(pod) == "Never" && !rt.containers.is_empty() {
        actions.kill_pod = true;
        return actions;
    }
    actions.create_sandbox = true;
    actions.attempt = rt.sandboxes.first().map(|s| s.attempt + 1).unwrap_or(0);
    let spec = pod_util::spec(pod);
    if let Some(first) = spec.init_containers.iter().flatten().next() {
        let kind = if pod_util::is_sidecar(first) { ContainerKind::Sidecar } else { ContainerKind::Init };
        actions.start.push(ToStart { kind, name: first.name.clone() });
        return actions;
    }
    let succeeded =
        |name: &str| rt.latest(name).is_some_and(|c| c.state == ContainerRunState::Exited && c.exit_code == 0);
    for c in &spec.containers {
        if pod_util::restart_policy(pod) == "OnFailure" && succeeded(&c.name) {
            continue;
        }
        actions.start.push(ToStart { kind: ContainerKind::Regular, name: c.name.clone() });
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::super::runtime_status::RuntimeSandbox;
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": v})).unwrap()
    }

    fn sandbox(ready: bool) -> RuntimeSandbox {
        RuntimeSandbox { id: "sb".into(), attempt: 0, ready, created_at: 1, ips: vec![] }
    }

    fn container(p: &Pod, name: &str, state: ContainerRunState, exit: i32) -> RuntimeContainer {
        let hash = pod_util::find_container(p, name).map(|(_, c)| pod_util::container_hash(c)).unwrap_or_default();
        RuntimeContainer {
            id: format!("id-{name}"),
            name: name.into(),
            sandbox_id: "sb".into(),
            restart_count: 0,
            state,
            created_at: 1,
            started_at: 1,
            finished_at: 0,
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
            image_ref: String::new(),
            hash,
            log_path: String::new(),
            annotations: Default::default(),
            mounts: vec![],
        }
    }

    fn names(a: &PodActions) -> Vec<&str> {
        a.start.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn a_new_pod_gets_a_sandbox_and_all_containers() {
        let p = pod(json!({"containers": [{"name": "a"}, {"name": "b"}]}));
        let a = compute(&p, &RuntimePod::default(), &ProbeState::default());
        assert!(a.create_sandbox && !a.kill_pod);
        assert_eq!(names(&a), ["a", "b"]);
    }

    #[test]
    fn init_containers_run_one_at_a_time() {
        let p = pod(json!({"initContainers": [{"name": "i1"}, {"name": "i2"}], "containers": [{"name": "a"}]}));
        let a = compute(&p, &RuntimePod::default(), &ProbeState::default());
        assert_eq!(names(&a), ["i1"]);
        let rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![container(&p, "i1", ContainerRunState::Running, 0)],
        };
        let a = compute(&p, &rt, &ProbeState::default());
        assert!(a.start.is_empty() && !a.initialized);
        let rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![container(&p, "i1", ContainerRunState::Exited, 0)],
        };
        assert_eq!(names(&compute(&p, &rt, &ProbeState::default())), ["i2"]);
        let rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![
                container(&p, "i2", ContainerRunState::Exited, 0),
                container(&p, "i1", ContainerRunState::Exited, 0),
            ],
        };
        let a = compute(&p, &rt, &ProbeState::default());
        assert!(a.initialized);
        assert_eq!(names(&a), ["a"]);
    }

    #[test]
    fn a_failed_init_container_fails_a_never_pod_and_restarts_otherwise() {
        let spec = json!({"restartPolicy": "Never", "initContainers": [{"name": "i"}], "containers": [{"name": "a"}]});
        let p = pod(spec);
        let rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![container(&p, "i", ContainerRunState::Exited, 1)],
        };
        let a = compute(&p, &rt, &ProbeState::default());
        assert!(a.kill_pod && a.start.is_empty());
        let p = pod(json!({"initContainers": [{"name": "i"}], "containers": [{"name": "a"}]}));
        assert_eq!(names(&compute(&p, &rt, &ProbeState::default())), ["i"]);
    }

    #[test]
    fn sidecars_must_start_before_the_next_init_container() {
        let p = pod(
            json!({"initContainers": [{"name": "s", "restartPolicy": "Always"}, {"name": "i"}], "containers": [{"name": "a"}]}),
        );
        let rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![container(&p, "s", ContainerRunState::Running, 0)],
        };
        let mut probes = ProbeState::default();
        assert!(compute(&p, &rt, &probes).start.is_empty());
        probes.started.insert("id-s".into());
        assert_eq!(names(&compute(&p, &rt, &probes)), ["i"]);
        // Later, a dead sidecar is restarted beside running containers.
        let rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![
                container(&p, "a", ContainerRunState::Running, 0),
                container(&p, "s", ContainerRunState::Exited, 1),
            ],
        };
        assert_eq!(names(&compute(&p, &rt, &probes)), ["s"]);
    }

    #[test]
    fn restart_policy_decides_on_exit() {
        for (policy, exit, restart) in
            [("Always", 0, true), ("OnFailure", 0, false), ("OnFailure", 2, true), ("Never", 2, false)]
        {
            let p = pod(json!({"restartPolicy": policy, "containers": [{"name": "a"}, {"name": "b"}]}));
            let rt = RuntimePod {
                sandboxes: vec![sandbox(true)],
                containers: vec![
                    container(&p, "a", ContainerRunState::Exited, exit),
                    container(&p, "b", ContainerRunState::Running, 0),
                ],
            };
            let a = compute(&p, &rt, &ProbeState::default());
            assert_eq!(names(&a) == ["a"], restart, "{policy} exit {exit}");
        }
    }

    #[test]
    fn a_finished_pod_is_killed_not_restarted() {
        let p = pod(json!({"restartPolicy": "Never", "containers": [{"name": "a"}]}));
        let rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![container(&p, "a", ContainerRunState::Exited, 0)],
        };
        let a = compute(&p, &rt, &ProbeState::default());
        assert!(a.kill_pod && a.start.is_empty());
        // And its sandbox is not made again.
        let rt = RuntimePod { sandboxes: vec![sandbox(false)], containers: rt.containers };
        let a = compute(&p, &rt, &ProbeState::default());
        assert!(!a.create_sandbox);
    }

    #[test]
    fn liveness_failure_and_spec_change_restart_a_running_container() {
        let p = pod(json!({"containers": [{"name": "a", "image": "x:1"}]}));
        let mut c = container(&p, "a", ContainerRunState::Running, 0);
        let rt = RuntimePod { sandboxes: vec![sandbox(true)], containers: vec![c.clone()] };
        let mut probes = ProbeState::default();
        probes.must_restart.insert("id-a".into(), ProbeType::Liveness);
        let a = compute(&p, &rt, &probes);
        assert_eq!(a.kill.len(), 1);
        assert_eq!(a.kill[0].reason, KillReason::ProbeFailed(ProbeType::Liveness));
        assert_eq!(a.kill[0].message(), "Container a failed liveness probe, will be restarted");
        assert_eq!(names(&a), ["a"]);
        c.hash = "old".into();
        let rt = RuntimePod { sandboxes: vec![sandbox(true)], containers: vec![c] };
        let a = compute(&p, &rt, &ProbeState::default());
        assert_eq!(a.kill.len(), 1);
        assert!(a.kill[0].message().contains("definition changed"));
    }

    #[test]
    fn ephemeral_containers_start_once_in_a_ready_sandbox() {
        let p = pod(json!({
            "initContainers": [{"name": "i"}], "containers": [{"name": "a"}],
            "ephemeralContainers": [{"name": "d", "targetContainerName": "a"}]
        }));
        // Not with a new sandbox: the next sync starts it.
        let a = compute(&p, &RuntimePod::default(), &ProbeState::default());
        assert_eq!(names(&a), ["i"]);
        let running = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![
                container(&p, "a", ContainerRunState::Running, 0),
                container(&p, "i", ContainerRunState::Exited, 0),
            ],
        };
        let a = compute(&p, &running, &ProbeState::default());
        assert_eq!(names(&a), ["d"]);
        assert_eq!(a.start[0].kind, ContainerKind::Ephemeral);
        // Done (whatever its exit): never started again.
        let mut rt = running.clone();
        rt.containers.insert(0, container(&p, "d", ContainerRunState::Exited, 1));
        assert!(compute(&p, &rt, &ProbeState::default()).start.is_empty());
        // A stuck init container does not hold it back.
        let rt = RuntimePod {
            sandboxes: vec![sandbox(true)],
            containers: vec![container(&p, "i", ContainerRunState::Running, 0)],
        };
        assert_eq!(names(&compute(&p, &rt, &ProbeState::default())), ["d"]);
    }

    #[test]
    fn a_lost_sandbox_is_made_again_with_the_next_attempt() {
        let p = pod(json!({"containers": [{"name": "a"}]}));
        let mut sb = sandbox(false);
        sb.attempt = 2;
        let rt =
            RuntimePod { sandboxes: vec![sb], containers: vec![container(&p, "a", ContainerRunState::Exited, 137)] };
        let a = compute(&p, &rt, &ProbeState::default());
        assert!(a.create_sandbox);
        assert_eq!(a.attempt, 3);
        assert_eq!(names(&a), ["a"]);
    }
}
