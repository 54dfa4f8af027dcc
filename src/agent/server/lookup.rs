//! From the names in a kubelet API path to what the runtime knows: the
//! running container of a pod (exec, attach) and the network namespace of
//! its sandbox (port-forward). Asked of CRI by the kubelet's labels, so a
//! container started before a restart of ferrok is found as well.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::agent::cri::{api, labels, Cri, CriError};

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("pod does not exist")]
    PodNotFound,
    #[error("container not found ({0:?})")]
    ContainerNotFound(String),
    #[error("cannot find the network namespace of pod {0:?}")]
    NoNetworkNamespace(String),
    #[error(transparent)]
    Cri(#[from] CriError),
}

impl LookupError {
    pub fn status(&self) -> u16 {
        match self {
            LookupError::PodNotFound | LookupError::ContainerNotFound(_) => 404,
            LookupError::NoNetworkNamespace(_) | LookupError::Cri(_) => 500,
        }
    }
}

fn pod_labels(namespace: &str, pod: &str, uid: Option<&str>) -> HashMap<String, String> {
    let mut l = HashMap::from([
        (labels::POD_NAMESPACE.to_string(), namespace.to_string()),
        (labels::POD_NAME.to_string(), pod.to_string()),
    ]);
    if let Some(uid) = uid {
        l.insert(labels::POD_UID.to_string(), uid.to_string());
    }
    l
}

/// The id of the running container `container` of a pod.
pub async fn running_container(
    cri: &Cri,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
    container: &str,
) -> Result<String, LookupError> {
    let mut selector = pod_labels(namespace, pod, uid);
    selector.insert(labels::CONTAINER_NAME.to_string(), container.to_string());
    let filter = api::ContainerFilter { label_selector: selector, ..crate::agent::cri::running() };
    let found = cri.list_containers(Some(filter)).await?;
    if let Some(c) = found.into_iter().max_by_key(|c| c.created_at) {
        return Ok(c.id);
    }
    // Tell a missing pod from a missing container, as the kubelet does.
    if ready_sandbox(cri, namespace, pod, uid).await?.is_none() {
        return Err(LookupError::PodNotFound);
    }
    Err(LookupError::ContainerNotFound(container.to_string()))
}

async fn ready_sandbox(
    cri: &Cri,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<Option<api::PodSandbox>, LookupError> {
    let filter = api::PodSandboxFilter {
        label_selector: pod_labels(namespace, pod, uid),
        state: Some(api::PodSandboxStateValue { state: api::PodSandboxState::SandboxReady as i32 }),
        ..Default::default()
    };
    Ok(cri.list_pod_sandboxes(Some(filter)).await?.into_iter().max_by_key(|s| s.created_at))
}

/// The network namespace (a path) of a pod's ready sandbox.
pub async fn pod_network_namespace(
    cri: &Cri,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<PathBuf, LookupError> {
    let sandbox = ready_sandbox(cri, namespace, pod, uid).await?.ok_or(LookupError::PodNotFound)?;
    let req = api::PodSandboxStatusRequest { pod_sandbox_id: sandbox.id.clone(), verbose: true };
    let status = cri.runtime().pod_sandbox_status(req).await.map_err(CriError::call("PodSandboxStatus"))?.into_inner();
    status
        .info
        .get("info")
        .and_then(|info| network_namespace_of(info))
        .ok_or_else(|| LookupError::NoNetworkNamespace(format!("{namespace}/{pod}")))
}

/// The network namespace in containerd's verbose sandbox info: the OCI
/// spec's network namespace path, else the sandbox process's own.
fn network_namespace_of(info: &str) -> Option<PathBuf> {
    let v: serde_json::Value = serde_json::from_str(info).ok()?;
    let from_spec = v
        .pointer("/runtimeSpec/linux/namespaces")
        .and_then(|n| n.as_array())
        .and_then(|ns| ns.iter().find(|n| n["type"] == "network"))
        .and_then(|n| n["path"].as_str())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    from_spec.or_else(|| {
        let pid = v["pid"].as_u64().filter(|p| *p > 0)?;
        Some(PathBuf::from(format!("/proc/{pid}/ns/net")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_namespace_from_the_spec_or_the_pid() {
        let info = r#"{"pid":42,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/run/netns/cni-1"}]}}}"#;
        assert_eq!(network_namespace_of(info), Some(PathBuf::from("/run/netns/cni-1")));
        let host_net = r#"{"pid":42,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"}]}}}"#;
        assert_eq!(network_namespace_of(host_net), Some(PathBuf::from("/proc/42/ns/net")));
        assert_eq!(network_namespace_of("{}"), None);
    }
}
