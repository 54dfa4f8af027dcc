//! Where the prober's events go: the API's Events through the
//! [`EventRecorder`] (which queues and never blocks), or anything else that
//! implements [`EventSink`] (tests). Events name the container by its field
//! path in the pod, as upstream's `GenerateContainerRef`.

use k8s_openapi::api::core::v1::{Container, ObjectReference, Pod};

use crate::client::events::{EventRecorder, EventType};

/// Upstream's reason for a failed probe (`events.ContainerUnhealthy`).
pub const CONTAINER_UNHEALTHY: &str = "Unhealthy";
/// Upstream's reason for a probe that succeeded with a warning.
pub const CONTAINER_PROBE_WARNING: &str = "ProbeWarning";

/// Records events; must return at once.
pub trait EventSink: Send + Sync + 'static {
    fn event(&self, regarding: ObjectReference, event_type: EventType, reason: &str, message: &str);
}

impl EventSink for EventRecorder {
    fn event(&self, regarding: ObjectReference, event_type: EventType, reason: &str, message: &str) {
        self.publish_ref(regarding, event_type, reason, message);
    }
}

/// The reference to a container of a pod: the Pod, with the field path
/// `spec.containers{name}` (or `spec.initContainers{name}`).
pub fn container_ref(pod: &Pod, container: &Container) -> ObjectReference {
    let spec = pod.spec.as_ref();
    let is_init =
        spec.and_then(|s| s.init_containers.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.name == container.name));
    let is_ephemeral = spec
        .and_then(|s| s.ephemeral_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == container.name));
    let field = if is_init {
        "initContainers"
    } else if is_ephemeral {
        "ephemeralContainers"
    } else {
        "containers"
    };
    ObjectReference {
        field_path: Some(format!("spec.{field}{{{}}}", container.name)),
        ..crate::agent::events::Events::pod_ref(pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn references_carry_the_field_path() {
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container { name: "app".into(), ..Default::default() }],
                init_containers: Some(vec![Container { name: "sidecar".into(), ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let app = Container { name: "app".into(), ..Default::default() };
        let sidecar = Container { name: "sidecar".into(), ..Default::default() };
        assert_eq!(container_ref(&pod, &app).field_path.as_deref(), Some("spec.containers{app}"));
        assert_eq!(container_ref(&pod, &sidecar).field_path.as_deref(), Some("spec.initContainers{sidecar}"));
        assert_eq!(container_ref(&pod, &app).kind.as_deref(), Some("Pod"));
    }
}
