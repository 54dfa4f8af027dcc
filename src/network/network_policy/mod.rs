//! NetworkPolicy (networking.k8s.io/v1) enforced for this node's pods in
//! ferrok's nftables table: ingress to the pods here and egress from them,
//! as every node does for its own pods.
//!
//! - [`model`]: policies, pods and namespaces after upstream's defaulting;
//! - [`plan`]: which of this node's pods each policy isolates and what it
//!   allows, over sets of pod addresses (one per distinct selector);
//! - [`render`]: the plan as `np-…` sets and chains, in full or as the
//!   change from what the table holds;
//! - [`controller`]: the watches that keep it in step.
//!
//! Choices where upstream leaves it to the implementation:
//! - Traffic from the node itself to its pods (kubelet probes, `kubectl
//!   port-forward`, hostNetwork pods) is never filtered: the output hook
//!   has no chain of this part. Upstream's implementations do the same
//!   (Calico, Cilium and kube-router allow the host to reach its pods), and
//!   probes must keep working under a default-deny ingress policy.
//! - The cluster DNS runs inside ferrok on the node, with no pod that a
//!   policy could select (manifests that allow egress to the `kube-dns`
//!   pods in kube-system would match nothing). Pods isolated for egress
//!   still reach the cluster DNS Service addresses on port 53 (TCP and
//!   UDP); anything else to the node is subject to their egress policies.
//!   A policy allowing port 53 to any destination works as it reads.
//! - Denied packets are dropped, not rejected.
//! - Only IPv4 is enforced (pods have IPv4 addresses only); IPv6 ipBlocks
//!   match nothing.

pub mod controller;
pub mod model;
pub mod plan;
pub mod render;
#[cfg(test)]
mod semantics_tests;

pub use controller::{run, NetworkPolicyConfig};
