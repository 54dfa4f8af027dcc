//! The host-gw backend, as flannel's: a plain route to each peer's podCIDR
//! through its InternalIP. Only works when every node is on one directly
//! connected subnet; a peer that is not gets a clear error instead.

use super::ip;
use super::plan::PeerEntries;
use super::OverlayError;

/// Puts one peer's route in place.
pub async fn install(peer: &PeerEntries) -> Result<(), OverlayError> {
    let r = &peer.route;
    let (dst, via) = (r.dst.to_string(), r.via.to_string());
    match ip::ip(&["route", "replace", &dst, "via", &via]).await {
        // The kernel refuses a gateway no connected route covers; a route
        // through the peer's earlier address must not stay behind.
        Err(OverlayError::Command { message, .. }) if message.contains("invalid gateway") => {
            ip::ip_delete(&["route", "del", &dst]).await?;
            Err(OverlayError::NotDirectlyConnected { pod_cidr: dst, via })
        }
        other => other.map(|_| ()),
    }
}
