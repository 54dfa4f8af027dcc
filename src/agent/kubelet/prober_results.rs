//! The prober as the kubelet's sync sees it ([`ProbeResults`]) and as the
//! runtime manager tells it about containers ([`ProbeRegistry`]): which
//! running containers must restart (liveness or startup failed, and which
//! probe), which are started and ready; over the prober's `ProbeManager`
//! (upstream's prober_manager `UpdatePodStatus` and results managers).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::ProbeResults;
use crate::agent::kuberuntime::actions::ProbeState;
use crate::agent::kuberuntime::manager::ProbeRegistry;
use crate::agent::kuberuntime::runtime_status::{ContainerRunState, RuntimePod};
use crate::agent::pod_util;
use crate::agent::prober::{ProbeManager, ProbeOutcome, ProbeType};

/// The prober's manager behind the kubelet's and the runtime manager's traits.
pub struct KubeletProber {
    pub manager: ProbeManager,
}

fn started_at(nanos: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos.max(0) as u64)
}

impl ProbeRegistry for KubeletProber {
    fn add_container(&self, pod: &Pod, container: &Container, container_id: &str, pod_ip: Option<IpAddr>) {
        self.manager.add_container(pod, container, container_id, SystemTime::now(), pod_ip);
    }

    fn remove_container(&self, pod_uid: &str, container_name: &str) {
        self.manager.remove_container(pod_uid, container_name);
    }

    fn remove_pod(&self, pod_uid: &str) {
        self.manager.remove_pod(pod_uid);
    }
}

impl KubeletProber {
    /// Whether the prober follows this very instance of the container.
    fn tracks(&self, uid: &str, name: &str, id: &str) -> bool {
        self.manager.container_id(uid, name).as_deref() == Some(id)
    }
}

impl ProbeResults for KubeletProber {
    fn ensure(&self, pod: &Pod, rt: &RuntimePod, pod_ip: Option<IpAddr>) {
        self.manager.update_pod(pod);
        for c in rt.running() {
            if let Some((_, spec)) = pod_util::find_container(pod, &c.name) {
                // Idempotent for a known id; after a restart of ferrok it
                // picks up containers that kept running.
                self.manager.add_container(pod, spec, &c.id, started_at(c.started_at), pod_ip);
            }
        }
        // Probes of instances that ended stop (a new instance replaces them anyway).
        let uid = pod_util::uid(pod);
        for c in rt.containers.iter().filter(|c| c.state != ContainerRunState::Running) {
            if self.tracks(uid, &c.name, &c.id) {
                self.manager.remove_container(uid, &c.name);
            }
        }
    }

    fn state(&self, pod: &Pod, rt: &RuntimePod) -> ProbeState {
        let uid = pod_util::uid(pod);
        let mut must_restart = HashMap::new();
        let mut started = HashSet::new();
        for c in rt.containers.iter().filter(|c| c.state == ContainerRunState::Running) {
            if !self.tracks(uid, &c.name, &c.id) {
                // Not probed (yet): no startup probe can hold it back.
                let has_startup =
                    pod_util::find_container(pod, &c.name).is_some_and(|(_, s)| s.startup_probe.is_some());
                if !has_startup {
                    started.insert(c.id.clone());
                }
                continue;
            }
            if self.manager.is_started(uid, &c.name) {
                started.insert(c.id.clone());
            }
            for t in [ProbeType::Liveness, ProbeType::Startup] {
                if self.manager.result(uid, &c.name, t) == Some(ProbeOutcome::Failure) {
                    must_restart.insert(c.id.clone(), t);
                }
            }
        }
        ProbeState { must_restart, started }
    }

    fn ready(&self, pod: &Pod, rt: &RuntimePod) -> HashSet<String> {
        let uid = pod_util::uid(pod);
        rt.running()
            .filter(|c| {
                if self.tracks(uid, &c.name, &c.id) {
                    self.manager.is_ready(uid, &c.name)
                } else {
                    pod_util::find_container(pod, &c.name).is_some_and(|(_, s)| s.readiness_probe.is_none())
                }
            })
            .map(|c| c.id.clone())
            .collect()
    }
}
