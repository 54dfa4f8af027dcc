//! The pods' bridge, made by ferrok before the first pod rather than by the
//! CNI bridge plugin on the first pod: it carries the node's pod-network
//! gateway address from the start (where node-local services such as the
//! cluster DNS listen) and the route that keeps service addresses on this
//! host. The kernel settings the service proxy relies on are set here too.

use std::net::Ipv4Addr;

use super::cni::{Ipv4Net, BRIDGE};
use super::overlay::{ip as iproute, OverlayError};

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("`ip` is not installed (Debian package: iproute2)")]
    Missing,
    #[error("ip {args}: {message}")]
    Failed { args: String, message: String },
    #[error("cannot set {path}: {source}")]
    Sysctl { path: String, source: std::io::Error },
    #[error(transparent)]
    Ip(#[from] OverlayError),
}

async fn ip(args: &[&str]) -> Result<(), BridgeError> {
    let bin = crate::host::find_binary("ip").ok_or(BridgeError::Missing)?;
    let failed = |message: String| BridgeError::Failed { args: args.join(" "), message };
    let out = tokio::process::Command::new(bin).args(args).output().await.map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        return Err(failed(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(())
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
    let addr = format!("{}/{}", gateway(pod_cidr), pod_cidr.prefix);
    ip(&["addr", "replace", &addr, "dev", BRIDGE]).await?;
    // The CNI bridge plugin refuses a bridge with any other IPv4 address
    // (an earlier podCIDR's gateway), so every new pod would fail.
    for stale in iproute::other_ipv4_addrs(BRIDGE, &addr).await? {
        tracing::warn!(address = %stale, "removing an address of another podCIDR from the pods' bridge");
        iproute::ip_delete(&["addr", "del", &stale, "dev", BRIDGE]).await?;
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
