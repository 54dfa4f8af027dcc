//! The kubelet's runtime manager over CRI (upstream's kuberuntime): the
//! sandbox and container configs, what the runtime holds for a pod, and
//! the actions that bring it to the spec.

pub mod actions;
pub mod container;
pub mod manager;
pub mod resources;
pub mod runtime_status;
pub mod sandbox;
pub mod security;
