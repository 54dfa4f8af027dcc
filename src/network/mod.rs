//! The node's network: the pod network on this host (a CNI bridge config
//! for the node's podCIDR, read by containerd) and the nftables table ferrok
//! owns (outbound masquerade for pods; services come later), and the
//! cluster DNS every node serves.

pub mod cni;
pub mod dns;
pub mod nftables;
