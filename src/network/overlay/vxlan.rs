//! The VXLAN backend, as flannel's: one VXLAN device (VNI 1, UDP 8472, no
//! learning, bound to the underlay's address) whose address is the node's
//! podCIDR network address; each peer gets a route onlink through the
//! device to its VTEP address, a permanent neighbour entry (VTEP address →
//! VTEP MAC) and a forwarding entry (VTEP MAC → the peer's public IP), so
//! the kernel never has to learn or flood anything.

use serde_json::Value;

use super::ip::{self, Underlay};
use super::plan::PeerEntries;
use super::OverlayError;
use crate::net::Ipv4Net;

/// The device (flannel's is `flannel.1`).
pub const DEVICE: &str = "ferrok.1";
/// The VXLAN network identifier, flannel's default.
pub const VNI: u32 = 1;
/// flannel's port (the Linux kernel's historical VXLAN port, not IANA's 4789).
pub const PORT: u16 = 8472;
/// Outer IPv4 (20) + UDP (8) + VXLAN (8) + inner Ethernet (14) headers.
pub const OVERHEAD: u32 = 50;

/// The MTU of the device and of the pods' interfaces.
pub fn mtu(underlay: &Underlay) -> u32 {
    underlay.mtu.saturating_sub(OVERHEAD)
}

/// Whether an existing device is the one we would make.
fn matches(details: &Value, underlay: &Underlay) -> bool {
    let Some(info) = details.get("linkinfo") else { return false };
    let data = info.get("info_data");
    let field = |k: &str| data.and_then(|d| d.get(k));
    info.get("info_kind").and_then(Value::as_str) == Some("vxlan")
        && field("id").and_then(Value::as_u64) == Some(VNI as u64)
        && field("port").and_then(Value::as_u64) == Some(PORT as u64)
        && field("local").and_then(Value::as_str) == Some(underlay.address.to_string().as_str())
        && field("learning").and_then(Value::as_bool) == Some(false)
        && field("link").and_then(Value::as_str) == Some(underlay.interface.as_str())
}

/// Makes (or keeps, or remakes when its settings differ) the device with
/// the node's VTEP address; returns its MAC. A device kept across restarts
/// keeps its MAC, so peers' entries for it stay right.
pub async fn ensure_device(underlay: &Underlay, pod_cidr: Ipv4Net) -> Result<String, OverlayError> {
    match ip::link_details(DEVICE).await? {
        Some(d) if matches(&d, underlay) => {}
        existing => {
            if existing.is_some() {
                tracing::info!(device = DEVICE, "VXLAN device settings changed; remaking it");
                ip::ip_delete(&["link", "del", DEVICE]).await?;
            }
            let (vni, port, local) = (VNI.to_string(), PORT.to_string(), underlay.address.to_string());
            ip::ip(&[
                "link",
                "add",
                DEVICE,
                "type",
                "vxlan",
                "id",
                &vni,
                "local",
                &local,
                "dev",
                &underlay.interface,
                "dstport",
                &port,
                "nolearning",
            ])
            .await?;
        }
    }
    ip::ip(&["link", "set", "dev", DEVICE, "mtu", &mtu(underlay).to_string()]).await?;
    let vtep = Ipv4Net::from(pod_cidr.network()).to_string();
    // Any other address (an earlier podCIDR's) goes.
    for have in ip::other_ipv4_addrs(DEVICE, &vtep).await? {
        ip::ip_delete(&["addr", "del", &have, "dev", DEVICE]).await?;
    }
    ip::ip(&["addr", "replace", &vtep, "dev", DEVICE]).await?;
    ip::ip(&["link", "set", "dev", DEVICE, "up"]).await?;
    let details = ip::link_details(DEVICE).await?;
    details
        .as_ref()
        .and_then(|d| d.get("address")?.as_str().map(str::to_string))
        .ok_or_else(|| OverlayError::NoUnderlay(format!("{DEVICE} has no MAC address")))
}

/// Puts one peer's neighbour, forwarding entry and route in place.
pub async fn install(peer: &PeerEntries) -> Result<(), OverlayError> {
    if let Some(n) = &peer.neighbour {
        let ip = n.ip.to_string();
        ip::ip(&["neigh", "replace", &ip, "lladdr", &n.mac, "dev", DEVICE, "nud", "permanent"]).await?;
    }
    if let Some(f) = &peer.fdb {
        let dst = f.dst.to_string();
        ip::run("bridge", &["fdb", "replace", &f.mac, "dev", DEVICE, "dst", &dst, "self", "permanent"]).await?;
    }
    let r = &peer.route;
    let (dst, via) = (r.dst.to_string(), r.via.to_string());
    ip::ip(&["route", "replace", &dst, "via", &via, "dev", DEVICE, "onlink"]).await?;
    Ok(())
}

/// Removes the device (when the node moves to another backend).
pub async fn remove_device() -> Result<(), OverlayError> {
    if ip::link_exists(DEVICE).await {
        tracing::info!(device = DEVICE, "removing the VXLAN device");
        ip::ip_delete(&["link", "del", DEVICE]).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_device_is_kept_only_when_it_is_ours() {
        let u = Underlay { interface: "eth0".into(), address: "10.9.0.2".parse().unwrap(), mtu: 1500 };
        assert_eq!(mtu(&u), 1450);
        let d: Value = serde_json::from_str(
            r#"{"ifname":"ferrok.1","linkinfo":{"info_kind":"vxlan","info_data":
               {"id":1,"local":"10.9.0.2","link":"eth0","port":8472,"learning":false}}}"#,
        )
        .unwrap();
        assert!(matches(&d, &u));
        let moved = Underlay { address: "10.9.0.3".parse().unwrap(), ..u.clone() };
        assert!(!matches(&d, &moved));
        let mut learning = d.clone();
        learning["linkinfo"]["info_data"]["learning"] = Value::Bool(true);
        assert!(!matches(&learning, &u));
        let mut other_port = d;
        other_port["linkinfo"]["info_data"]["port"] = 4789.into();
        assert!(!matches(&other_port, &u));
    }
}
