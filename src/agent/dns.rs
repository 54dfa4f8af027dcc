//! A pod's name resolution, as upstream's kubelet/network/dns: the
//! resolv.conf its sandbox gets (per `dnsPolicy` and `dnsConfig`) and the
//! /etc/hosts file the kubelet writes for each pod.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

use super::cri::api;
use super::pod_util;
use crate::host::resolv_conf::ResolvConf;

/// Upstream's limits: three nameservers, 32 search domains of 2048 characters in all.
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCHES: usize = 32;
const MAX_SEARCH_CHARS: usize = 2048;

/// What the node knows for pods' DNS.
#[derive(Debug, Clone)]
pub struct DnsSettings {
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: String,
    pub host: ResolvConf,
}

fn merge_options(base: &mut Vec<String>, extra: impl IntoIterator<Item = String>) {
    for opt in extra {
        let name = opt.split(':').next().unwrap_or("").to_string();
        base.retain(|o| o.split(':').next() != Some(name.as_str()));
        base.push(opt);
    }
}

/// The sandbox's DNS config for the pod.
pub fn pod_dns_config(pod: &Pod, dns: &DnsSettings) -> api::DnsConfig {
    let spec = pod_util::spec(pod);
    let host_network = spec.host_network == Some(true);
    let mut policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    if policy == "ClusterFirst" && host_network {
        policy = "Default";
    }
    if (policy == "ClusterFirst" || policy == "ClusterFirstWithHostNet") && dns.cluster_dns.is_empty() {
        policy = "Default";
    }
    let mut out = match policy {
        "None" => api::DnsConfig::default(),
        "Default" => api::DnsConfig {
            servers: dns.host.nameservers.clone(),
            searches: dns.host.searches.clone(),
            options: dns.host.options.clone(),
        },
        _ => {
            let ns = pod_util::namespace(pod);
            let d = &dns.cluster_domain;
            let mut searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
            searches.extend(dns.host.searches.iter().filter(|s| !searches.contains(s)).cloned().collect::<Vec<_>>());
            api::DnsConfig {
                servers: dns.cluster_dns.iter().map(|ip| ip.to_string()).collect(),
                searches,
                options: vec!["ndots:5".to_string()],
            }
        }
    };
    if let Some(cfg) = &spec.dns_config {
        for ns in cfg.nameservers.iter().flatten() {
            if !out.servers.contains(ns) {
                out.servers.push(ns.clone());
            }
        }
        for s in cfg.searches.iter().flatten() {
            if !out.searches.contains(s) {
                out.searches.push(s.clone());
            }
        }
        let extra = cfg.options.iter().flatten().map(|o| match &o.value {
            Some(v) => format!("{}:{v}", o.name.as_deref().unwrap_or_default()),
            None => o.name.clone().unwrap_or_default(),
        });
        merge_options(&mut out.options, extra.collect::<Vec<_>>());
    }
    out.servers.truncate(MAX_NAMESERVERS);
    out.searches.truncate(MAX_SEARCHES);
    while out.searches.iter().map(|s| s.len() + 1).sum::<usize>() > MAX_SEARCH_CHARS {
        out.searches.pop();
    }
    out
}

/// The /etc/hosts the kubelet writes for a pod (upstream's managed hosts file).
pub fn hosts_file(pod: &Pod, pod_ips: &[String], cluster_domain: &str, host_hosts: Option<&str>) -> String {
    let spec = pod_util::spec(pod);
    let mut out = String::new();
    if spec.host_network == Some(true) {
        out.push_str("# Kubernetes-managed hosts file (host network).\n");
        out.push_str(host_hosts.unwrap_or_default());
        if !out.ends_with('\n') {
            out.push('\n');
        }
    } else {
        out.push_str("# Kubernetes-managed hosts file.\n");
        out.push_str("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
        out.push_str(
            "fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
        );
        let hostname = pod_util::hostname(pod);
        let names = match spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => format!("{hostname}.{sub}.{}.svc.{cluster_domain}\t{hostname}", pod_util::namespace(pod)),
            None => hostname,
        };
        for ip in pod_ips {
            out.push_str(&format!("{ip}\t{names}\n"));
        }
    }
    if let Some(aliases) = spec.host_aliases.as_ref().filter(|a| !a.is_empty()) {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            out.push_str(&format!(
                "{}\t{}\n",
                a.ip,
                a.hostnames.iter().flatten().cloned().collect::<Vec<_>>().join("\t")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings() -> DnsSettings {
        DnsSettings {
            cluster_dns: vec!["10.43.0.10".parse().unwrap()],
            cluster_domain: "cluster.local".into(),
            host: ResolvConf::parse("nameserver 192.168.1.1\nsearch lan\noptions edns0\n"),
        }
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": spec})).unwrap()
    }

    #[test]
    fn cluster_first_uses_cluster_dns() {
        let c = pod_dns_config(&pod(json!({"containers": []})), &settings());
        assert_eq!(c.servers, ["10.43.0.10"]);
        assert_eq!(c.searches, ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "lan"]);
        assert_eq!(c.options, ["ndots:5"]);
    }

    #[test]
    fn host_network_falls_back_to_the_host_unless_asked() {
        let c = pod_dns_config(&pod(json!({"hostNetwork": true, "containers": []})), &settings());
        assert_eq!(c.servers, ["192.168.1.1"]);
        let c = pod_dns_config(
            &pod(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet", "containers": []})),
            &settings(),
        );
        assert_eq!(c.servers, ["10.43.0.10"]);
    }

    #[test]
    fn none_takes_dns_config_only() {
        let c = pod_dns_config(
            &pod(json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["a.b"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}, "containers": []})),
            &settings(),
        );
        assert_eq!(c.servers, ["1.1.1.1"]);
        assert_eq!(c.searches, ["a.b"]);
        assert_eq!(c.options, ["ndots:2", "edns0"]);
    }

    #[test]
    fn dns_config_options_override_by_name() {
        let c = pod_dns_config(
            &pod(json!({"dnsConfig": {"options": [{"name": "ndots", "value": "1"}]}, "containers": []})),
            &settings(),
        );
        assert_eq!(c.options, ["ndots:1"]);
    }

    #[test]
    fn hosts_file_names_the_pod_and_aliases() {
        let p = pod(
            json!({"hostname": "h", "subdomain": "s", "hostAliases": [{"ip": "1.2.3.4", "hostnames": ["a", "b"]}], "containers": []}),
        );
        let text = hosts_file(&p, &["10.42.0.9".to_string()], "cluster.local", None);
        assert!(text.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(text.contains("10.42.0.9\th.s.shop.svc.cluster.local\th\n"));
        assert!(text.ends_with("# Entries added by HostAliases.\n1.2.3.4\ta\tb\n"));
    }
}
