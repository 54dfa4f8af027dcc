//! The pods' bridge, made by ferrok before the first pod rather than by the
//! CNI bridge plugin on the first pod: it carries the node's pod-network
//! gateway address from the start (where node-local services such as the
//! cluster DNS listen) and the route that keeps service addresses on this
//! host. The kernel settings the service proxy relies on are set here too.

use std::net::Ipv4Addr;

use super::cni::BRIDGE;
use super::overlay::ip::{ip, ip_delete, other_ipv4_addrs};
use super::overlay::OverlayError;
use crate::net::{Ipv4Net, NthAddr};

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// `ip` is missing or refused a change.
    #[error(transparent)]
    Ip(#[from] OverlayError),
    #[error("cannot set {path}: {source}")]
    Sysctl { path: String, source: std::io::Error },
}

fn sysctl(path: &str, value: &str) -> Result<(), BridgeError> {
    let current = std::fs::read_to_string(path).unwrap_or_default();
    if current.trim() == value {
        return Ok(());
    }
    std::fs::write(path, value).map_err(|source| BridgeError::Sysctl { path: path.to_string(), source })
}

/// The gateway address of a podCIDR (its first host address).
pub fn gateway(pod_cidr: Ipv4Net) -> Ipv4Addr {
    pod_cidr.nth(1)
}

/// Makes the bridge with the gateway address of `pod_cidr`, up, with the
/// service CIDR routed onto it.
pub async fn ensure(pod_cidr: Ipv4Net, service_cidr: Ipv4Net) -> Result<(), BridgeError> {
    if ip(&["link", "show", BRIDGE]).await.is_err() {
        ip(&["link", "add", BRIDGE, "type", "bridge"]).await?;
    }
    let addr = format!("{}/{}", gateway(pod_cidr), pod_cidr.prefix_len());
    ip(&["addr", "replace", &addr, "dev", BRIDGE]).await?;
    // The CNI bridge plugin refuses a bridge with any other IPv4 address,
    // so every new pod would fail: the gateway of the podCIDR this node had
    // before its Node was deleted and registered again, say.
    for stale in other_ipv4_addrs(BRIDGE, &addr).await? {
        tracing::warn!(address = %stale, "removing an address of another podCIDR from the pods' bridge");
        ip_delete(&["addr", "del", &stale, "dev", BRIDGE]).await?;
    }
    ip(&["link", "set", BRIDGE, "up"]).await?;
    ip(&["route", "replace", &service_cidr.to_string(), "dev", BRIDGE]).await?;
    sysctl("/proc/sys/net/ipv4/ip_forward", "1")?;
    // Traffic between pods on the bridge passes nftables, so that a reply
    // from a service's endpoint is translated back for a client on the same
    // bridge, and network policies see it.
    sysctl("/proc/sys/net/bridge/bridge-nf-call-iptables", "1")?;
    sysctl("/proc/sys/net/bridge/bridge-nf-call-ip6tables", "1")?;
    Ok(())
}
