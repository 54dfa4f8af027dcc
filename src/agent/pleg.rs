//! The pod lifecycle event generator: instead of relisting the runtime
//! every second as upstream's generic PLEG does, ferrok subscribes to
//! containerd's task events (exits and OOM kills) and wakes the worker of
//! the pod the container belongs to. When the stream breaks (containerd
//! restarted) it resubscribes and wakes every pod, which then reads the
//! runtime afresh.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use containerd_client::events::{TaskExit, TaskOom};
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::services::v1::SubscribeRequest;
use futures_util::StreamExt;
use prost::Message;

use super::cri::Cri;
use crate::sync::LockExt;

/// Which pod a runtime container or sandbox id belongs to.
#[derive(Debug, Default)]
pub struct ContainerIndex {
    ids: Mutex<HashMap<String, String>>,
}

impl ContainerIndex {
    pub fn insert(&self, id: &str, pod_uid: &str) {
        self.ids.locked().insert(id.to_string(), pod_uid.to_string());
    }

    pub fn pod_of(&self, id: &str) -> Option<String> {
        self.ids.locked().get(id).cloned()
    }

    pub fn forget_pod(&self, pod_uid: &str) {
        self.ids.locked().retain(|_, uid| uid != pod_uid);
    }
}

/// What the PLEG tells the pod workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodLifecycleEvent {
    /// A container (or the sandbox) of the pod exited.
    ContainerDied { pod_uid: String, container_id: String },
    /// Events may have been missed: every pod should look again.
    Relist,
}

/// Runs until aborted, handing events to `sink`.
pub async fn run(cri: Cri, index: Arc<ContainerIndex>, sink: impl Fn(PodLifecycleEvent) + Send + Sync + 'static) {
    let mut first = true;
    loop {
        let mut client = EventsClient::new(cri.channel());
        let req = SubscribeRequest {
            filters: vec![
                r#"namespace=="k8s.io",topic=="/tasks/exit""#.to_string(),
                r#"namespace=="k8s.io",topic=="/tasks/oom""#.to_string(),
            ],
        };
        match client.subscribe(req).await {
            Ok(resp) => {
                if !first {
                    sink(PodLifecycleEvent::Relist);
                }
                let mut stream = resp.into_inner();
                while let Some(item) = stream.next().await {
                    let Ok(envelope) = item else { break };
                    let Some(any) = envelope.event else { continue };
                    let container = match envelope.topic.as_str() {
                        "/tasks/exit" => match TaskExit::decode(any.value.as_slice()) {
                            // Exits of exec'd processes (probes, kubectl exec) are not the container's.
                            Ok(e) if e.id == e.container_id || e.id.is_empty() => e.container_id,
                            _ => continue,
                        },
                        "/tasks/oom" => match TaskOom::decode(any.value.as_slice()) {
                            Ok(e) => e.container_id,
                            Err(_) => continue,
                        },
                        _ => continue,
                    };
                    if let Some(pod_uid) = index.pod_of(&container) {
                        sink(PodLifecycleEvent::ContainerDied { pod_uid, container_id: container });
                    }
                }
                tracing::debug!("containerd event stream ended; resubscribing");
            }
            Err(status) => tracing::debug!(error = %status.message(), "cannot subscribe to containerd events"),
        }
        first = false;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
