//! The Node annotations a node publishes about its end of the pod network,
//! with flannel's names (k3s users and their tools read them): the backend,
//! its data (the VXLAN VNI and VTEP MAC), the address peers send to, and
//! that the subnet comes from the Node's podCIDR.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use super::vxlan::VNI;
use super::FlannelBackend;

pub const BACKEND_TYPE: &str = "flannel.alpha.coreos.com/backend-type";
pub const BACKEND_DATA: &str = "flannel.alpha.coreos.com/backend-data";
pub const PUBLIC_IP: &str = "flannel.alpha.coreos.com/public-ip";
pub const KUBE_SUBNET_MANAGER: &str = "flannel.alpha.coreos.com/kube-subnet-manager";

/// A peer's VXLAN end, as its annotations tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vtep {
    pub mac: String,
    pub public_ip: Ipv4Addr,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct VxlanData {
    #[serde(rename = "VNI")]
    vni: u32,
    #[serde(rename = "VtepMAC")]
    vtep_mac: String,
}

/// The annotations this node publishes (`mac`: its VXLAN device's).
pub fn desired(backend: FlannelBackend, mac: Option<&str>, public_ip: Ipv4Addr) -> BTreeMap<String, String> {
    let data = match (backend, mac) {
        (FlannelBackend::Vxlan, Some(mac)) => {
            serde_json::to_string(&VxlanData { vni: VNI, vtep_mac: mac.to_string() }).unwrap_or_default()
        }
        _ => "null".to_string(),
    };
    BTreeMap::from([
        (BACKEND_TYPE.to_string(), backend.as_str().to_string()),
        (BACKEND_DATA.to_string(), data),
        (PUBLIC_IP.to_string(), public_ip.to_string()),
        (KUBE_SUBNET_MANAGER.to_string(), "true".to_string()),
    ])
}

/// A peer's VTEP, when it publishes a VXLAN backend with our VNI.
pub fn vxlan_peer(node: &Node) -> Option<Vtep> {
    let a = node.metadata.annotations.as_ref()?;
    if a.get(BACKEND_TYPE).map(String::as_str) != Some(FlannelBackend::Vxlan.as_str()) {
        return None;
    }
    let data: VxlanData = serde_json::from_str(a.get(BACKEND_DATA)?).ok()?;
    if data.vni != VNI || !valid_mac(&data.vtep_mac) {
        return None;
    }
    let public_ip = a.get(PUBLIC_IP)?.parse().ok()?;
    Some(Vtep { mac: data.vtep_mac.to_ascii_lowercase(), public_ip })
}

/// `02:aa:bb:cc:dd:ee` (so that nothing else reaches an `ip` command line).
fn valid_mac(mac: &str) -> bool {
    let parts: Vec<&str> = mac.split(':').collect();
    parts.len() == 6 && parts.iter().all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Whether the Node lacks any of `want` (other annotations are not ours).
pub fn differs(node: &Node, want: &BTreeMap<String, String>) -> bool {
    let have = node.metadata.annotations.as_ref();
    want.iter().any(|(k, v)| have.and_then(|a| a.get(k)) != Some(v))
}

/// Merges `want` into the node's own annotations.
pub async fn publish(client: &kube::Client, node_name: &str, want: &BTreeMap<String, String>) -> kube::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let body = serde_json::json!({"metadata": {"annotations": want}});
    api.patch(node_name, &PatchParams::default(), &Patch::Merge(&body)).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vxlan_annotations_read_back_as_a_vtep() {
        let want = desired(FlannelBackend::Vxlan, Some("02:AA:bb:cc:dd:01"), "10.0.0.5".parse().unwrap());
        assert_eq!(want[BACKEND_TYPE], "vxlan");
        assert_eq!(want[BACKEND_DATA], r#"{"VNI":1,"VtepMAC":"02:AA:bb:cc:dd:01"}"#);
        assert_eq!(want[PUBLIC_IP], "10.0.0.5");
        assert_eq!(want[KUBE_SUBNET_MANAGER], "true");
        let mut node = Node::default();
        assert!(differs(&node, &want));
        node.metadata.annotations = Some(want.clone());
        assert!(!differs(&node, &want));
        assert_eq!(
            vxlan_peer(&node),
            Some(Vtep { mac: "02:aa:bb:cc:dd:01".into(), public_ip: "10.0.0.5".parse().unwrap() })
        );
        let hg = desired(FlannelBackend::HostGw, None, "10.0.0.5".parse().unwrap());
        assert_eq!(hg[BACKEND_DATA], "null");
    }

    #[test]
    fn odd_vtep_data_is_ignored() {
        let mut node = Node::default();
        let mut a = desired(FlannelBackend::Vxlan, Some("02:aa:bb:cc:dd:01"), "10.0.0.5".parse().unwrap());
        a.insert(BACKEND_DATA.into(), r#"{"VNI":1,"VtepMAC":"02:aa dev lo"}"#.into());
        node.metadata.annotations = Some(a.clone());
        assert_eq!(vxlan_peer(&node), None);
        a.insert(BACKEND_DATA.into(), r#"{"VNI":2,"VtepMAC":"02:aa:bb:cc:dd:01"}"#.into());
        node.metadata.annotations = Some(a);
        assert_eq!(vxlan_peer(&node), None);
    }
}
