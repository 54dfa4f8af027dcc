//! What the runtime holds for one pod, read back from CRI: its sandboxes
//! and containers (newest first), found by the pod-uid label the kubelet
//! puts on everything it creates. This is the only memory of a pod that
//! survives a restart of ferrok.

use std::collections::HashMap;

use super::super::cri::{api, labels, CriError, RuntimeService};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerRunState {
    Created,
    Running,
    Exited,
    Unknown,
}

impl From<i32> for ContainerRunState {
    fn from(state: i32) -> Self {
        match api::ContainerState::try_from(state) {
            Ok(api::ContainerState::ContainerCreated) => ContainerRunState::Created,
            Ok(api::ContainerState::ContainerRunning) => ContainerRunState::Running,
            Ok(api::ContainerState::ContainerExited) => ContainerRunState::Exited,
            _ => ContainerRunState::Unknown,
        }
    }
}

/// One runtime container of the pod.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeContainer {
    pub id: String,
    pub name: String,
    pub sandbox_id: String,
    pub restart_count: i32,
    pub state: ContainerRunState,
    /// Nanoseconds since the epoch; 0 when not reached.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub image: String,
    pub image_ref: String,
    pub hash: String,
    pub log_path: String,
    pub annotations: HashMap<String, String>,
    pub mounts: Vec<api::Mount>,
}

/// One sandbox of the pod.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeSandbox {
    pub id: String,
    pub attempt: u32,
    pub ready: bool,
    pub created_at: i64,
    /// The pod's addresses, for the newest sandbox only.
    pub ips: Vec<String>,
}

/// Everything the runtime has for one pod uid.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimePod {
    pub sandboxes: Vec<RuntimeSandbox>,
    pub containers: Vec<RuntimeContainer>,
}

impl RuntimePod {
    /// The newest sandbox, when it is ready.
    pub fn ready_sandbox(&self) -> Option<&RuntimeSandbox> {
        self.sandboxes.first().filter(|s| s.ready)
    }

    /// The newest instance of a container (by creation), of any state.
    pub fn latest(&self, name: &str) -> Option<&RuntimeContainer> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The instance before the newest one (the status' `lastState`).
    pub fn previous(&self, name: &str) -> Option<&RuntimeContainer> {
        self.containers.iter().filter(|c| c.name == name).nth(1)
    }

    pub fn running(&self) -> impl Iterator<Item = &RuntimeContainer> {
        self.containers.iter().filter(|c| c.state == ContainerRunState::Running)
    }

    pub fn is_empty(&self) -> bool {
        self.sandboxes.is_empty() && self.containers.is_empty()
    }
}

fn uid_filter(uid: &str) -> HashMap<String, String> {
    HashMap::from([(labels::POD_UID.to_string(), uid.to_string())])
}

/// Reads the pod's sandboxes and containers from the runtime.
pub async fn read(cri: &dyn RuntimeService, uid: &str) -> Result<RuntimePod, CriError> {
    let sandboxes = cri
        .list_pod_sandboxes(Some(api::PodSandboxFilter { label_selector: uid_filter(uid), ..Default::default() }))
        .await?;
    let mut out = RuntimePod::default();
    for s in sandboxes {
        out.sandboxes.push(RuntimeSandbox {
            ready: s.state == api::PodSandboxState::SandboxReady as i32,
            attempt: s.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
            created_at: s.created_at,
            ips: Vec::new(),
            id: s.id,
        });
    }
    out.sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    if let Some(newest) = out.sandboxes.first_mut().filter(|s| s.ready) {
        match cri.pod_sandbox_status(&newest.id).await {
            Ok(status) => {
                if let Some(net) = status.and_then(|s| s.network) {
                    if !net.ip.is_empty() {
                        newest.ips.push(net.ip);
                    }
                    newest.ips.extend(net.additional_ips.into_iter().map(|i| i.ip).filter(|i| !i.is_empty()));
                }
            }
            Err(e) if e.is_not_found() => newest.ready = false,
            Err(e) => return Err(e),
        }
    }
    let containers = cri
        .list_containers(Some(api::ContainerFilter { label_selector: uid_filter(uid), ..Default::default() }))
        .await?;
    for c in containers {
        let status = match cri.container_status(&c.id).await {
            Ok(status) => status,
            // Removed between the list and now.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        let Some(st) = status else { continue };
        let name = c.labels.get(labels::CONTAINER_NAME).cloned().unwrap_or_default();
        let restart_count = st
            .annotations
            .get(labels::CONTAINER_RESTART_COUNT)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| st.metadata.as_ref().map(|m| m.attempt as i32).unwrap_or(0));
        out.containers.push(RuntimeContainer {
            id: c.id,
            name,
            sandbox_id: c.pod_sandbox_id,
            restart_count,
            state: ContainerRunState::from(st.state),
            created_at: st.created_at,
            started_at: st.started_at,
            finished_at: st.finished_at,
            exit_code: st.exit_code,
            reason: st.reason,
            message: st.message,
            image: st.image.map(|i| i.image).unwrap_or_default(),
            image_ref: st.image_ref,
            hash: c.labels.get(labels::CONTAINER_HASH).cloned().unwrap_or_default(),
            log_path: st.log_path,
            annotations: st.annotations,
            mounts: st.mounts,
        });
    }
    out.containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    Ok(out)
}
