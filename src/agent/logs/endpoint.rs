//! The kubelet's `/containerLogs/{namespace}/{pod}/{container}`
//! (upstream's `server.getContainerLogs`, `Kubelet.GetContainerLogs` and
//! `validateContainerLogStatus`): the pod must be bound to this node and
//! have the container; its status says which container instance to read
//! (the running one, the last terminated one, or with `previous` the one
//! before); CRI tells where that instance's log file is. The answer is a
//! streaming body fed by the reader.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use tokio::sync::mpsc;

use super::options::{self, PodLogOptions};
use super::reader;
use crate::agent::cri::{api, Cri};

/// What the logs endpoint needs of the node.
#[derive(Clone)]
pub struct ContainerLogs {
    pub client: kube::Client,
    pub cri: Cri,
    pub node_name: String,
}

/// A refusal: the status and the plain-text body the kubelet sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogsRefusal {
    pub status: StatusCode,
    pub message: String,
}

impl LogsRefusal {
    fn new(status: StatusCode, message: String) -> LogsRefusal {
        LogsRefusal { status, message }
    }

    fn bad_request(message: String) -> LogsRefusal {
        LogsRefusal::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for LogsRefusal {
    fn into_response(self) -> Response {
        (self.status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], self.message).into_response()
    }
}

fn find_status<'a>(pod: &'a Pod, container: &str) -> Option<&'a ContainerStatus> {
    let st = pod.status.as_ref()?;
    [&st.container_statuses, &st.init_container_statuses, &st.ephemeral_container_statuses]
        .into_iter()
        .flatten()
        .flatten()
        .find(|s| s.name == container)
}

/// Whether the pod's spec has the container (regular, init or ephemeral).
fn has_container(pod: &Pod, container: &str) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    spec.containers.iter().any(|c| c.name == container)
        || spec.init_containers.iter().flatten().any(|c| c.name == container)
        || spec.ephemeral_containers.iter().flatten().any(|c| c.name == container)
}

/// `validateContainerLogStatus`: the runtime's id of the instance to read.
pub fn container_to_read(pod: &Pod, container: &str, previous: bool) -> Result<String, LogsRefusal> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let refuse = |what: &str| LogsRefusal::bad_request(format!("container {container:?} in pod {pod_name:?} {what}"));
    let Some(status) = find_status(pod, container) else { return Err(refuse("is not available")) };
    let state = status.state.clone().unwrap_or_default();
    let last_terminated = status.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let last_id = last_terminated.and_then(|t| t.container_id.clone()).filter(|id| !id.is_empty());
    let id = if previous {
        match last_id {
            Some(id) => id,
            None => {
                return Err(LogsRefusal::bad_request(format!(
                    "previous terminated container {container:?} in pod {pod_name:?} not found"
                )))
            }
        }
    } else if state.running.is_some() {
        status.container_id.clone().unwrap_or_default()
    } else if let Some(t) = &state.terminated {
        match t.container_id.clone().filter(|id| !id.is_empty()).or(last_id) {
            Some(id) => id,
            None => return Err(refuse("is terminated")),
        }
    } else if last_terminated.is_some() {
        match last_id {
            Some(id) => id,
            None => return Err(refuse("is terminated")),
        }
    } else if let Some(w) = &state.waiting {
        let reason = w.reason.as_deref().unwrap_or_default();
        return Err(refuse(&match reason {
            "ErrImagePull" => "is waiting to start: image can't be pulled".to_string(),
            "ImagePullBackOff" => "is waiting to start: trying and failing to pull image".to_string(),
            _ => format!("is waiting to start: {reason}"),
        }));
    } else {
        return Err(refuse("is waiting to start - no logs yet"));
    };
    // `containerd://<id>`; a bare id is taken as it is.
    Ok(id.split_once("://").map(|(_, id)| id.to_string()).unwrap_or(id))
}

/// Serves one `/containerLogs` request. `query` is the URL's query string.
pub async fn serve_container_logs(
    logs: &ContainerLogs,
    namespace: &str,
    pod: &str,
    container: &str,
    query: Option<&str>,
) -> Response {
    match open_logs(logs, namespace, pod, container, query).await {
        Ok(r) => r,
        Err(refusal) => refusal.into_response(),
    }
}

async fn open_logs(
    logs: &ContainerLogs,
    namespace: &str,
    pod_name: &str,
    container: &str,
    query: Option<&str>,
) -> Result<Response, LogsRefusal> {
    if pod_name.is_empty() {
        return Err(LogsRefusal::bad_request(r#"{"message": "Missing podID."}"#.into()));
    }
    if container.is_empty() {
        return Err(LogsRefusal::bad_request(r#"{"message": "Missing container name."}"#.into()));
    }
    let opts = PodLogOptions::from_query(query).map_err(|e| {
        let status = match e {
            options::LogQueryError::Decode => StatusCode::BAD_REQUEST,
            options::LogQueryError::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
        };
        LogsRefusal::new(status, e.to_string())
    })?;
    let not_found = || LogsRefusal::new(StatusCode::NOT_FOUND, format!("pod {pod_name:?} does not exist"));
    let pod = match Api::<Pod>::namespaced(logs.client.clone(), namespace).get_opt(pod_name).await {
        Ok(Some(p)) => p,
        Ok(None) => return Err(not_found()),
        Err(e) => {
            return Err(LogsRefusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot read pod {pod_name:?}: {e}"),
            ))
        }
    };
    if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(logs.node_name.as_str()) {
        return Err(not_found());
    }
    if !has_container(&pod, container) {
        return Err(LogsRefusal::new(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        ));
    }
    let id = container_to_read(&pod, container, opts.previous)?;
    let req = api::ContainerStatusRequest { container_id: id.clone(), verbose: false };
    let status = match logs.cri.runtime().container_status(req).await {
        Ok(r) => r.into_inner().status.unwrap_or_default(),
        Err(s) => {
            return Err(LogsRefusal::bad_request(format!(
                "failed to get container status {:?}: {}",
                format!("containerd://{id}"),
                s.message()
            )))
        }
    };
    let path = PathBuf::from(&status.log_path);
    let file = std::fs::File::open(&path)
        .map_err(|e| LogsRefusal::bad_request(format!("failed to open log file {:?}: {e}", status.log_path)))?;
    let (tx, rx) = mpsc::channel(16);
    let cri = logs.cri.clone();
    let running: reader::Running = Arc::new(move || {
        let (cri, id) = (cri.clone(), id.clone());
        Box::pin(async move { is_running(&cri, &id).await })
    });
    tracing::debug!(pod = %pod_name, %container, log = %path.display(), follow = opts.follow, "serving container logs");
    tokio::spawn(reader::stream_logs(path, file, opts.log_options(Timestamp::now()), tx, running));
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(([(header::CONTENT_TYPE, "text/plain")], body).into_response())
}

/// `isContainerRunning`: a container the runtime no longer knows has stopped.
async fn is_running(cri: &Cri, id: &str) -> bool {
    let req = api::ContainerStatusRequest { container_id: id.to_string(), verbose: false };
    match cri.runtime().container_status(req).await {
        Ok(r) => r.into_inner().status.is_some_and(|s| s.state == api::ContainerState::ContainerRunning as i32),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, PodSpec,
        PodStatus,
    };

    fn pod(status: ContainerStatus) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta { name: Some("web".into()), ..Default::default() },
            spec: Some(PodSpec {
                containers: vec![Container { name: "app".into(), ..Default::default() }],
                ..Default::default()
            }),
            status: Some(PodStatus { container_statuses: Some(vec![status]), ..Default::default() }),
        }
    }

    fn status(state: ContainerState, last: Option<&str>) -> ContainerStatus {
        ContainerStatus {
            name: "app".into(),
            container_id: Some("containerd://cur".into()),
            state: Some(state),
            last_state: last.map(|id| ContainerState {
                terminated: Some(ContainerStateTerminated { container_id: Some(id.into()), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn waiting(reason: &str) -> ContainerState {
        ContainerState {
            waiting: Some(ContainerStateWaiting { reason: Some(reason.into()), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn the_running_instance_or_the_previous_one_is_read() {
        let running = ContainerState { running: Some(ContainerStateRunning::default()), ..Default::default() };
        let p = pod(status(running, Some("containerd://old")));
        assert_eq!(container_to_read(&p, "app", false), Ok("cur".into()));
        assert_eq!(container_to_read(&p, "app", true), Ok("old".into()));
        // Crash-looping: waiting, but the last instance has logs.
        let p = pod(status(waiting("CrashLoopBackOff"), Some("containerd://old")));
        assert_eq!(container_to_read(&p, "app", false), Ok("old".into()));
    }

    #[test]
    fn refusals_carry_the_kubelets_texts() {
        let msg = |p: &Pod, prev| container_to_read(p, "app", prev).unwrap_err().message;
        let p = pod(status(waiting("ContainerCreating"), None));
        assert_eq!(msg(&p, false), r#"container "app" in pod "web" is waiting to start: ContainerCreating"#);
        assert_eq!(msg(&p, true), r#"previous terminated container "app" in pod "web" not found"#);
        let p = pod(status(waiting("ImagePullBackOff"), None));
        assert_eq!(
            msg(&p, false),
            r#"container "app" in pod "web" is waiting to start: trying and failing to pull image"#
        );
        let p = pod(status(ContainerState::default(), None));
        assert_eq!(msg(&p, false), r#"container "app" in pod "web" is waiting to start - no logs yet"#);
        assert_eq!(
            container_to_read(&p, "other", false).unwrap_err().message,
            r#"container "other" in pod "web" is not available"#
        );
        assert_eq!(container_to_read(&p, "app", false).unwrap_err().status, StatusCode::BAD_REQUEST);
    }
}
