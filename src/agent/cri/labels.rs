//! The labels and annotations the kubelet puts on sandboxes and containers
//! (upstream's `kuberuntime/labels.go`), so ferrok can find its pods again
//! after a restart and tools that read them (crictl) see what they expect.

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Set on sandboxes by the kubelet ("true" for ferrok-made ones).
pub const CONTAINER_TYPE_KUBELET: &str = "io.cri-containerd.kind";
/// `io.kubernetes.container.hash`: the spec hash the container was created from.
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const POD_DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
pub const CONTAINER_PRESTOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
/// Which kind of container of the pod: `init`, `sidecar`, `regular` or `ephemeral` (ferrok's own).
pub const CONTAINER_KIND: &str = "ferrok.io/container-kind";
/// The label every sandbox a kubelet makes carries.
pub const KUBERNETES_MANAGED: &str = "io.kubernetes.managed";
