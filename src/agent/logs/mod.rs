//! Container logs: the CRI log files containerd writes
//! (`<pod-logs>/<namespace>_<name>_<uid>/<container>/<restart>.log`, one
//! `<time> <stream> <F|P> <text>` line each), as the kubelet keeps and
//! serves them.
//!
//! - [`rotation`]: upstream's `pkg/kubelet/logs` ContainerLogManager, which
//!   rotates, compresses and bounds them, and removes them with their
//!   container;
//! - [`reader`] and [`options`]: upstream's `kuberuntime/logs`, which read
//!   them for `kubectl logs` (tail, since, timestamps, follow across
//!   rotations);
//! - [`endpoint`]: the kubelet API's `/containerLogs`, which picks the
//!   container instance to read from the pod's status.

pub mod endpoint;
pub mod options;
pub mod reader;
pub mod rotation;
