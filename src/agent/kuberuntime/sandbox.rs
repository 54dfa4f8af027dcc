//! A pod's sandbox config (upstream's kuberuntime_sandbox.go): metadata,
//! hostname, the log folder, DNS, hostPort mappings, labels and
//! annotations, the cgroup parent and the security context.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use super::{resources, security};
use crate::agent::cri::{api, labels};
use crate::agent::dns::{self, DnsSettings};
use crate::agent::pod_util;

/// `<pod-logs-dir>/<namespace>_<name>_<uid>`, as upstream's BuildPodLogsDirectory.
pub fn pod_log_dir(pod_logs_dir: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
}

/// The labels every sandbox and container of the pod carries.
pub fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    HashMap::from([
        (labels::POD_NAME.to_string(), pod_util::name(pod).to_string()),
        (labels::POD_NAMESPACE.to_string(), pod_util::namespace(pod).to_string()),
        (labels::POD_UID.to_string(), pod_util::uid(pod).to_string()),
    ])
}

fn protocol(p: Option<&str>) -> i32 {
    match p {
        Some("UDP") => api::Protocol::Udp as i32,
        Some("SCTP") => api::Protocol::Sctp as i32,
        _ => api::Protocol::Tcp as i32,
    }
}

/// hostPort mappings of every container.
pub fn port_mappings(pod: &Pod) -> Vec<api::PortMapping> {
    let mut out = Vec::new();
    for (_, c) in pod_util::containers(pod) {
        for p in c.ports.iter().flatten() {
            let Some(host_port) = p.host_port.filter(|h| *h > 0) else { continue };
            out.push(api::PortMapping {
                protocol: protocol(p.protocol.as_deref()),
                container_port: p.container_port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    out
}

/// The sandbox's hostname; empty for host-network pods (they see the host's).
pub fn sandbox_hostname(pod: &Pod, cluster_domain: &str) -> String {
    let spec = pod_util::spec(pod);
    if spec.host_network == Some(true) {
        return String::new();
    }
    let host = pod_util::hostname(pod);
    match (spec.set_hostname_as_fqdn, spec.subdomain.as_deref().filter(|s| !s.is_empty())) {
        (Some(true), Some(sub)) => format!("{host}.{sub}.{}.svc.{cluster_domain}", pod_util::namespace(pod)),
        _ => host,
    }
}

pub struct SandboxInputs<'a> {
    pub pod_logs_dir: &'a Path,
    pub cgroup_root: &'a str,
    pub dns: &'a DnsSettings,
}

pub fn sandbox_config(pod: &Pod, attempt: u32, inputs: &SandboxInputs<'_>) -> api::PodSandboxConfig {
    let meta = &pod.metadata;
    let mut sandbox_labels: HashMap<String, String> = meta.labels.clone().unwrap_or_default().into_iter().collect();
    sandbox_labels.extend(pod_labels(pod));
    let spec = pod_util::spec(pod);
    let sysctls: HashMap<String, String> = spec
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: pod_util::name(pod).to_string(),
            uid: pod_util::uid(pod).to_string(),
            namespace: pod_util::namespace(pod).to_string(),
            attempt,
        }),
        hostname: sandbox_hostname(pod, &inputs.dns.cluster_domain),
        log_directory: pod_log_dir(
            inputs.pod_logs_dir,
            pod_util::namespace(pod),
            pod_util::name(pod),
            pod_util::uid(pod),
        )
        .to_string_lossy()
        .into_owned(),
        dns_config: Some(dns::pod_dns_config(pod, inputs.dns)),
        port_mappings: port_mappings(pod),
        labels: sandbox_labels,
        annotations: meta.annotations.clone().unwrap_or_default().into_iter().collect(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: resources::pod_cgroup_parent(pod, inputs.cgroup_root),
            security_context: Some(security::sandbox_security_context(pod)),
            sysctls,
            ..Default::default()
        }),
        windows: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sandbox_config_carries_identity_ports_and_cgroup() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}
        }))
        .unwrap();
        let dns = DnsSettings { cluster_dns: vec![], cluster_domain: "cluster.local".into(), host: Default::default() };
        let c = sandbox_config(
            &pod,
            2,
            &SandboxInputs { pod_logs_dir: Path::new("/logs"), cgroup_root: "/kubepods", dns: &dns },
        );
        let m = c.metadata.unwrap();
        assert_eq!((m.name.as_str(), m.namespace.as_str(), m.uid.as_str(), m.attempt), ("web", "shop", "u1", 2));
        assert_eq!(c.hostname, "web");
        assert_eq!(c.log_directory, "/logs/shop_web_u1");
        assert_eq!(c.labels["app"], "web");
        assert_eq!(c.labels[labels::POD_UID], "u1");
        assert_eq!(c.port_mappings[0].host_port, 8080);
        assert_eq!(c.linux.unwrap().cgroup_parent, "/kubepods/besteffort/podu1");
    }
}
