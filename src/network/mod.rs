//! The node's network: the pod network on this host (a CNI bridge config
//! for the node's podCIDR, read by containerd) and the nftables table ferrok
//! owns (outbound masquerade for pods; services come later).

pub mod cni;
pub mod conntrack;
pub mod ctnetlink;
pub mod nftables;
