//! The one nftables table ferrok owns (`inet ferrok`). Nothing outside it
//! is touched, so host firewalls keep working. Today it holds the pods'
//! outbound masquerade; it is loaded whole, in one `nft -f` transaction.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use super::cni::Ipv4Net;

pub const TABLE: &str = "ferrok";

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("nft is not installed (Debian package: nftables)")]
    Missing,
    #[error("cannot run nft: {0}")]
    Io(#[from] std::io::Error),
    #[error("nft -f refused the ruleset: {0}")]
    Refused(String),
}

/// What the table is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRules {
    /// `--cluster-cidr`: traffic between pods is never masqueraded.
    pub cluster_cidr: Ipv4Net,
    /// This node's podCIDR: its pods' traffic to anywhere else is.
    pub pod_cidr: Ipv4Net,
}

/// The whole table, made idempotent: declared, deleted, declared again.
pub fn render(rules: &NodeRules) -> String {
    format!(
        "table inet {TABLE}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr {pod} ip daddr != {cluster} masquerade fully-random\n\
         \t}}\n\
         }}\n",
        pod = rules.pod_cidr,
        cluster = rules.cluster_cidr,
    )
}

/// Loads a ruleset in one transaction.
pub async fn load(ruleset: &str) -> Result<(), NftError> {
    let nft = crate::host::find_binary("nft").ok_or(NftError::Missing)?;
    let mut child = tokio::process::Command::new(nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(ruleset.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
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
        let text = render(&NodeRules {
            cluster_cidr: Ipv4Net::parse("10.42.0.0/16").unwrap(),
            pod_cidr: Ipv4Net::parse("10.42.1.0/24").unwrap(),
        });
        assert!(text.starts_with("table inet ferrok\ndelete table inet ferrok\n"));
        assert!(text.contains("ip saddr 10.42.1.0/24 ip daddr != 10.42.0.0/16 masquerade"));
    }
}
