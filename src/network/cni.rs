//! The CNI config for this node's pods: a bridge with host-local addresses
//! from the node's podCIDR, hostPort mappings and loopback. containerd reads
//! it from its `conf_dir` and reports NetworkReady once it is there.
//! Outbound masquerade is done in ferrok's own nftables table, not by the
//! bridge plugin, so no iptables chains are added to the host.

use std::path::{Path, PathBuf};

use crate::net::{Ipv4Net, NthAddr};

/// The bridge pods attach to.
pub const BRIDGE: &str = "ferrok0";
/// The file name containerd loads (the only one in the folder).
pub const CONF_FILE: &str = "10-ferrok.conflist";

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The conflist for a node's podCIDR; `ipam_dir` keeps host-local's leases.
pub fn render(pod_cidr: Ipv4Net, ipam_dir: &Path, mtu: Option<u32>) -> String {
    let mut bridge = serde_json::json!({
        "type": "bridge",
        "bridge": BRIDGE,
        "isGateway": true,
        "ipMasq": false,
        "hairpinMode": true,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": pod_cidr.to_string(), "gateway": pod_cidr.nth(1).to_string()}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": ipam_dir.to_string_lossy(),
        }
    });
    if let Some(mtu) = mtu {
        bridge["mtu"] = serde_json::json!(mtu);
    }
    let conf = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "ferrok",
        "plugins": [
            bridge,
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
            {"type": "loopback"}
        ]
    });
    serde_json::to_string_pretty(&conf).unwrap_or_default()
}

/// Writes the conflist when it differs from what is there; true when written.
/// `mtu`: the pods' interfaces' (the overlay's), the plugin's default when absent.
pub fn ensure(conf_dir: &Path, pod_cidr: Ipv4Net, ipam_dir: &Path, mtu: Option<u32>) -> Result<bool, CniError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CniError::Io { path, source }
    };
    std::fs::create_dir_all(conf_dir).map_err(io(conf_dir))?;
    std::fs::create_dir_all(ipam_dir).map_err(io(ipam_dir))?;
    let path = conf_dir.join(CONF_FILE);
    let text = render(pod_cidr, ipam_dir, mtu);
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    let tmp = conf_dir.join(".ferrok.conflist.tmp");
    std::fs::write(&tmp, &text).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflist_has_the_subnet_and_no_iptables_masquerade() {
        let text = render(crate::net::parse_pod_cidr("10.42.1.0/24").unwrap(), Path::new("/d/ipam"), None);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.42.1.0/24");
        assert_eq!(v["plugins"][0]["ipam"]["ranges"][0][0]["gateway"], "10.42.1.1");
        assert_eq!(v["plugins"][0]["ipMasq"], false);
        assert_eq!(v["plugins"][1]["type"], "portmap");
    }
}
