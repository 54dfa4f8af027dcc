//! The node's network: the pod network on this host (the pods' bridge and
//! the CNI config for the node's podCIDR, read by containerd), the
//! nftables table ferrok owns and what is written into it (outbound
//! masquerade, the service proxy, network policies), the overlay that
//! reaches other nodes' pods, and cluster DNS.

pub mod bridge;
pub mod cni;
pub mod conntrack;
pub mod ctnetlink;
pub mod dns;
pub mod network_policy;
pub mod nftables;
pub mod overlay;
pub mod protocol;
pub mod service_proxy;
