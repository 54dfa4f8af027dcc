//! The node role: what upstream's kubelet does, in ferrok's process. It
//! registers the Node and renews its Lease, supervises containerd, imports
//! images, and runs one worker per pod bound here, driving it through CRI
//! and reporting its status through the API. `ferrok server` runs it for
//! its own host; `ferrok agent` runs it alone against a remote server.
//!
//! The pieces carry the kubelet's names: `pod_workers`, `status_manager`,
//! `pleg`, `prober`, `volume_manager`, `image_manager`, `eviction`, `cri`.

pub mod config;
pub mod containerd;
pub mod cri;
pub mod images;

pub use config::{AgentConfig, KubeletConfig};
