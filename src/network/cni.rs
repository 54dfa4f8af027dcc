//! The CNI config for this node's pods: a bridge with host-local addresses
//! from the node's podCIDR, hostPort mappings and loopback. containerd reads
//! it from its `conf_dir` and reports NetworkReady once it is there.
//! Outbound masquerade is done in ferrok's own nftables table, not by the
//! bridge plugin, so no iptables chains are added to the host.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The bridge pods attach to.
pub const BRIDGE: &str = "ferrok0";
/// The file name containerd loads (the only one in the folder).
pub const CONF_FILE: &str = "10-ferrok.conflist";

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("invalid podCIDR {0:?}")]
    InvalidCidr(String),
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// An IPv4 network like `10.42.0.0/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Net {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Ipv4Net {
    pub fn parse(s: &str) -> Result<Ipv4Net, CniError> {
        let bad = || CniError::InvalidCidr(s.to_string());
        let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 30).ok_or_else(bad)?;
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        Ok(Ipv4Net { addr: Ipv4Addr::from(u32::from(addr) & mask), prefix })
    }

    /// The n-th address of the network (1 is the gateway).
    pub fn nth(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) + n)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - self.prefix) };
        u32::from(ip) & mask == u32::from(self.addr)
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
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
    fn cidr_math() {
        let n = Ipv4Net::parse("10.42.3.7/24").unwrap();
        assert_eq!(n.to_string(), "10.42.3.0/24");
        assert_eq!(n.nth(1), Ipv4Addr::new(10, 42, 3, 1));
        assert!(n.contains(Ipv4Addr::new(10, 42, 3, 200)));
        assert!(!n.contains(Ipv4Addr::new(10, 42, 4, 1)));
        assert!(Ipv4Net::parse("10.42.0.0").is_err());
        assert!(Ipv4Net::parse("10.42.0.0/33").is_err());
    }

    #[test]
    fn conflist_has_the_subnet_and_no_iptables_masquerade() {
        let text = render(Ipv4Net::parse("10.42.1.0/24").unwrap(), Path::new("/d/ipam"), None);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.42.1.0/24");
        assert_eq!(v["plugins"][0]["ipam"]["ranges"][0][0]["gateway"], "10.42.1.1");
        assert_eq!(v["plugins"][0]["ipMasq"], false);
        assert_eq!(v["plugins"][1]["type"], "portmap");
    }
}
