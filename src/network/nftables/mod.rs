//! The one nftables table ferrok owns (`inet ferrok`). Nothing outside it
//! is touched, so host firewalls keep working. Several parts of the node
//! write into it (the pods' outbound masquerade, the service proxy, network
//! policies), each into objects of its own, through one [`TableWriter`]
//! that turns their changes into atomic `nft -f` transactions.

mod table_writer;

use std::process::Stdio;

use tokio::io::AsyncWriteExt;

pub use table_writer::{Part, TableWriter};

use crate::net::Ipv4Net;

pub const TABLE: &str = "ferrok";

#[derive(Debug, Clone, thiserror::Error)]
pub enum NftError {
    #[error("nft is not installed (Debian package: nftables)")]
    Missing,
    #[error("cannot run nft: {0}")]
    Io(String),
    #[error("nft -f refused the ruleset: {0}")]
    Refused(String),
    #[error("the nftables writer has stopped")]
    Stopped,
}

/// What the node part of the table is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRules {
    /// `--cluster-cidr`: traffic between pods is never masqueraded.
    pub cluster_cidr: Ipv4Net,
    /// This node's podCIDR: its pods' traffic to anywhere else is.
    pub pod_cidr: Ipv4Net,
}

/// The node's own objects: the pods' outbound masquerade.
pub fn render_node(rules: &NodeRules) -> String {
    format!(
        "table inet {TABLE} {{\n\
         \tchain pod-egress {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr {pod} ip daddr != {cluster} masquerade fully-random\n\
         \t}}\n\
         }}\n",
        pod = rules.pod_cidr,
        cluster = rules.cluster_cidr,
    )
}

/// The head of a transaction that replaces the whole table: declared,
/// deleted, declared again (so it works whether the table exists or not).
pub fn reset_table() -> String {
    format!("table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE}\n")
}

/// Loads a ruleset in one transaction.
pub async fn load(ruleset: &str) -> Result<(), NftError> {
    let nft = crate::host::find_binary("nft").ok_or(NftError::Missing)?;
    let io = |e: std::io::Error| NftError::Io(e.to_string());
    let mut child = tokio::process::Command::new(nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(io)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(ruleset.as_bytes()).await.map_err(io)?;
    }
    let out = child.wait_with_output().await.map_err(io)?;
    if !out.status.success() {
        return Err(NftError::Refused(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    Ok(())
}

/// Removes ferrok's table (uninstall, tests).
pub async fn remove() -> Result<(), NftError> {
    load(&format!("table inet {TABLE}\ndelete table inet {TABLE}\n")).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masquerades_pod_traffic_leaving_the_cluster() {
        let text = render_node(&NodeRules {
            cluster_cidr: crate::net::parse_pod_cidr("10.42.0.0/16").unwrap(),
            pod_cidr: crate::net::parse_pod_cidr("10.42.1.0/24").unwrap(),
        });
        assert!(text.contains("ip saddr 10.42.1.0/24 ip daddr != 10.42.0.0/16 masquerade"));
        assert!(reset_table().starts_with("table inet ferrok\ndelete table inet ferrok\n"));
    }
}
