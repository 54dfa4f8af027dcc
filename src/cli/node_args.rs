//! The node role's flags, with k3s' names, shared by `ferrok server` and
//! `ferrok agent`: addresses, labels and taints, the runtime, the pause
//! image, resolv.conf and `--kubelet-arg`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::core::v1::Taint;

use crate::agent::{AgentConfig, KubeletConfig};
use crate::net::Ipv4Net;
use crate::network::overlay::FlannelBackend;

#[derive(Debug, Clone, Args, Default)]
pub struct NodeArgs {
    /// This node's internal address (default: the address the host reaches others from; repeatable).
    #[arg(long, value_delimiter = ',')]
    pub node_ip: Vec<IpAddr>,
    /// This node's external address (repeatable).
    #[arg(long, value_delimiter = ',')]
    pub node_external_ip: Vec<IpAddr>,
    /// A label for the node at registration, `key=value` (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub node_label: Vec<String>,
    /// A taint for the node at registration, `key=value:Effect` (repeatable).
    #[arg(long, value_name = "KEY=VALUE:EFFECT")]
    pub node_taint: Vec<String>,
    /// The sandbox (pause) image; ferrok's built-in one by default.
    #[arg(long, value_name = "IMAGE")]
    pub pause_image: Option<String>,
    /// The resolv.conf pods with dnsPolicy Default get, and whose nameservers
    /// the cluster DNS forwards other names to (default: the host's).
    #[arg(long, value_name = "FILE")]
    pub resolv_conf: Option<PathBuf>,
    /// A kubelet setting, `key=value` with upstream's flag names (repeatable):
    /// max-pods, eviction-hard, eviction-soft, eviction-soft-grace-period,
    /// image-gc-high-threshold, image-gc-low-threshold, container-log-max-size,
    /// container-log-max-files, cgroup-root, port, …
    #[arg(long, value_name = "KEY=VALUE")]
    pub kubelet_arg: Vec<String>,
    /// Use this CRI socket (`unix:///run/containerd/containerd.sock`) instead of starting containerd.
    #[arg(long, value_name = "ENDPOINT")]
    pub container_runtime_endpoint: Option<String>,
    /// How pods reach other nodes' pods: vxlan (the default), host-gw (every
    /// node on one directly connected subnet) or none (bring your own). An
    /// agent that is not told follows its server's.
    #[arg(long, value_name = "BACKEND")]
    pub flannel_backend: Option<FlannelBackend>,
    /// The interface that carries the pod network between nodes (default:
    /// the one holding the node's internal address).
    #[arg(long, value_name = "IFACE")]
    pub flannel_iface: Option<String>,
}

fn parse_label(s: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = s.split_once('=').with_context(|| format!("--node-label {s:?}: expected key=value"))?;
    if k.is_empty() {
        anyhow::bail!("--node-label {s:?}: the key is empty");
    }
    Ok((k.to_string(), v.to_string()))
}

/// `key=value:Effect` or `key:Effect`.
pub fn parse_taint(s: &str) -> anyhow::Result<Taint> {
    let (kv, effect) = s.rsplit_once(':').with_context(|| format!("--node-taint {s:?}: expected key=value:Effect"))?;
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        anyhow::bail!("--node-taint {s:?}: the effect must be NoSchedule, PreferNoSchedule or NoExecute");
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    if key.is_empty() {
        anyhow::bail!("--node-taint {s:?}: the key is empty");
    }
    Ok(Taint { key: key.to_string(), value, effect: effect.to_string(), time_added: None })
}

impl NodeArgs {
    /// The node role's config from the flags.
    #[allow(clippy::too_many_arguments)]
    pub fn agent_config(
        &self,
        data_dir: &Path,
        node_name: &str,
        default_ip: IpAddr,
        control_plane: bool,
        cluster_dns: &IpAddr,
        cluster_domain: &str,
        cluster_cidr: &Ipv4Net,
        service_cidr: &Ipv4Net,
        default_data_dir: bool,
    ) -> anyhow::Result<AgentConfig> {
        let mut kubelet = KubeletConfig::default();
        kubelet.apply_args(&self.kubelet_arg)?;
        let labels: BTreeMap<String, String> =
            self.node_label.iter().map(|l| parse_label(l)).collect::<anyhow::Result<_>>()?;
        let taints = self.node_taint.iter().map(|t| parse_taint(t)).collect::<anyhow::Result<Vec<_>>>()?;
        if let Some(f) = &self.resolv_conf {
            std::fs::metadata(f).with_context(|| format!("--resolv-conf: cannot read {}", f.display()))?;
        }
        let dir = data_dir.join("agent");
        let pod_logs_dir = if default_data_dir && super::is_root() {
            PathBuf::from("/var/log/pods")
        } else {
            dir.join("logs").join("pods")
        };
        Ok(AgentConfig {
            dir,
            node_name: node_name.to_string(),
            node_ips: if self.node_ip.is_empty() { vec![default_ip] } else { self.node_ip.clone() },
            external_ips: self.node_external_ip.clone(),
            labels,
            taints,
            control_plane,
            pause_image: self.pause_image.clone(),
            resolv_conf: self.resolv_conf.clone(),
            runtime_endpoint: self.container_runtime_endpoint.clone(),
            cluster_dns: vec![*cluster_dns],
            dns_server: true,
            cluster_domain: cluster_domain.to_string(),
            cluster_cidr: *cluster_cidr,
            service_cidr: *service_cidr,
            flannel_backend: self.flannel_backend.unwrap_or_default(),
            flannel_iface: self.flannel_iface.clone(),
            pod_logs_dir,
            kubelet,
            kubelet_tls: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_and_labels() {
        let t = parse_taint("dedicated=gpu:NoSchedule").unwrap();
        assert_eq!((t.key.as_str(), t.value.as_deref(), t.effect.as_str()), ("dedicated", Some("gpu"), "NoSchedule"));
        let t = parse_taint("edge:NoExecute").unwrap();
        assert_eq!((t.key.as_str(), t.value, t.effect.as_str()), ("edge", None, "NoExecute"));
        assert!(parse_taint("x=y:Sometimes").unwrap_err().to_string().contains("effect must be"));
        assert!(parse_label("a").is_err());
        assert_eq!(parse_label("a=b").unwrap(), ("a".to_string(), "b".to_string()));
    }
}
