//! The kubelet's events: on a pod, or on one of its containers (the
//! reference's fieldPath names it, `spec.containers{app}`), with the
//! `kubelet` component and the node as their source.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};

use super::pod_util::{self, ContainerKind};
use crate::client::events::{EventRecorder, EventType};

#[derive(Clone)]
pub struct Events {
    recorder: EventRecorder,
}

impl Events {
    pub fn new(client: kube::Client, node_name: &str) -> Self {
        Events { recorder: EventRecorder::with_host(client, "kubelet", Some(node_name.to_string())) }
    }

    pub fn pod_ref(pod: &Pod) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..Default::default()
        }
    }

    pub fn container_ref(pod: &Pod, kind: ContainerKind, name: &str) -> ObjectReference {
        ObjectReference { field_path: Some(kind.field_path(name)), resource_version: None, ..Self::pod_ref(pod) }
    }

    pub fn pod(&self, pod: &Pod, kind: EventType, reason: &str, message: &str) {
        self.recorder.publish_ref(Self::pod_ref(pod), kind, reason, message);
    }

    pub fn container(&self, r: &ObjectReference, kind: EventType, reason: &str, message: &str) {
        self.recorder.publish_ref(r.clone(), kind, reason, message);
    }

    pub fn for_container(&self, pod: &Pod, name: &str, kind: EventType, reason: &str, message: &str) {
        let ckind = pod_util::find_any_container(pod, name).map(|(k, _)| k).unwrap_or(ContainerKind::Regular);
        self.container(&Self::container_ref(pod, ckind, name), kind, reason, message);
    }

    pub fn recorder(&self) -> &EventRecorder {
        &self.recorder
    }
}
