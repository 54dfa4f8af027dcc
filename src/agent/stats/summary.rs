//! The kubelet's `/stats/summary` (`k8s.io/kubelet/pkg/apis/stats/v1alpha1`,
//! what metrics-server and `metrics.k8s.io` read): CPU and memory of the
//! node (the root cgroup), of each pod with a ready sandbox (its pod
//! cgroup) and of each running container (its cgroup, a child of the
//! pod's named by the container id). Pods and containers come from CRI;
//! numbers from the cgroup files, read when asked.

use std::collections::HashMap;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::cgroup::{CgroupFs, CgroupSample};
use super::rate::{CpuRates, Rate, SAMPLE_INTERVAL};
use crate::agent::cri::{api, labels, Cri, CriError};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
    /// ferrok's own: the nanoseconds between the two readings
    /// `usageNanoCores` came from (metrics.k8s.io's `window`). Readers of
    /// upstream's summary ignore it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_window_nano_seconds: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub start_time: String,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

/// The node's cgroups and how to find its pods'.
pub struct StatsProvider {
    pub cri: Cri,
    pub node_name: String,
    /// `--cgroup-root` (`/kubepods`).
    pub cgroup_root: String,
    pub fs: CgroupFs,
    pub rates: CpuRates,
}

/// A cgroup to read, and what it belongs to.
#[derive(Debug, Clone)]
struct Target {
    key: String,
    cgroup: String,
}

fn rfc3339_nanos(ns: i64) -> String {
    Timestamp::from_nanosecond(ns as i128).map(|t| t.to_string()).unwrap_or_default()
}

/// The host's boot time (`btime` of /proc/stat).
fn boot_time() -> String {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let secs = text.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse::<i64>().ok());
    secs.and_then(|s| Timestamp::from_second(s).ok()).map(|t| t.to_string()).unwrap_or_default()
}

/// CPU and memory stats from a sample, its rate and the time of reading.
pub fn stats_of(sample: &CgroupSample, rate: Option<Rate>, time: &str) -> (Option<CpuStats>, Option<MemoryStats>) {
    let cpu = sample.cpu_usage_ns.map(|ns| CpuStats {
        time: time.to_string(),
        usage_nano_cores: rate.map(|r| r.nano_cores),
        usage_core_nano_seconds: Some(ns),
        usage_window_nano_seconds: rate.map(|r| r.window.as_nanos() as u64),
    });
    let memory = sample.memory.map(|m| MemoryStats {
        time: time.to_string(),
        available_bytes: None,
        usage_bytes: Some(m.usage_bytes),
        working_set_bytes: Some(m.working_set_bytes),
        rss_bytes: Some(m.rss_bytes),
        page_faults: Some(m.page_faults),
        major_page_faults: Some(m.major_page_faults),
    });
    (cpu, memory)
}

impl StatsProvider {
    pub fn new(cri: Cri, node_name: String, cgroup_root: String) -> StatsProvider {
        StatsProvider { cri, node_name, cgroup_root, fs: CgroupFs::default(), rates: CpuRates::default() }
    }

    /// Reads every target, twice a short while apart when some have no
    /// recent reading to rate against; returns samples and rates by key.
    async fn read(&self, targets: &[Target]) -> HashMap<String, (CgroupSample, Option<Rate>)> {
        let now = Instant::now();
        if targets.iter().any(|t| !self.rates.has_fresh(&t.key, now)) {
            for t in targets {
                if let Some(ns) = self.fs.cpu_usage_ns(&t.cgroup) {
                    self.rates.record(&t.key, Instant::now(), ns);
                }
            }
            tokio::time::sleep(SAMPLE_INTERVAL).await;
        }
        let mut out = HashMap::new();
        for t in targets {
            let sample = self.fs.sample(&t.cgroup);
            let rate = sample.cpu_usage_ns.and_then(|ns| self.rates.record(&t.key, Instant::now(), ns));
            out.insert(t.key.clone(), (sample, rate));
        }
        self.rates.retain(&|k| targets.iter().any(|t| t.key == k));
        out
    }

    /// The summary as of now.
    pub async fn summary(&self) -> Result<Summary, CriError> {
        let ready = api::PodSandboxFilter {
            state: Some(api::PodSandboxStateValue { state: api::PodSandboxState::SandboxReady as i32 }),
            ..Default::default()
        };
        let sandboxes = self.cri.list_pod_sandboxes(Some(ready)).await?;
        let containers = self.cri.list_containers(Some(crate::agent::cri::running())).await?;
        let mut targets = vec![Target { key: "/".into(), cgroup: "/".into() }];
        let mut pods = Vec::new();
        for sb in &sandboxes {
            let label = |k: &str| sb.labels.get(k).cloned().unwrap_or_default();
            let uid = label(labels::POD_UID);
            let Some(cgroup) = self.fs.pod_cgroup(&self.cgroup_root, &uid) else { continue };
            targets.push(Target { key: format!("pod/{uid}"), cgroup: cgroup.clone() });
            let mut own = Vec::new();
            for c in containers.iter().filter(|c| c.labels.get(labels::POD_UID) == Some(&uid)) {
                let name = c.labels.get(labels::CONTAINER_NAME).cloned().unwrap_or_default();
                targets.push(Target { key: format!("container/{}", c.id), cgroup: format!("{cgroup}/{}", c.id) });
                own.push((c.id.clone(), name, c.created_at));
            }
            let pod_ref = PodReference { name: label(labels::POD_NAME), namespace: label(labels::POD_NAMESPACE), uid };
            pods.push((pod_ref, sb.created_at, own));
        }
        let read = self.read(&targets).await;
        let time = Timestamp::now().to_string();
        let stats = |key: &str| read.get(key).map(|(s, r)| stats_of(s, *r, &time)).unwrap_or_default();
        let (node_cpu, mut node_memory) = stats("/");
        let capacity = crate::host::meminfo("MemTotal");
        if let Some(m) = node_memory.as_mut() {
            m.available_bytes = capacity.map(|c| c.saturating_sub(m.working_set_bytes.unwrap_or(0)));
        }
        let node = NodeStats {
            node_name: self.node_name.clone(),
            start_time: boot_time(),
            cpu: node_cpu,
            memory: node_memory,
        };
        let pods = pods
            .into_iter()
            .map(|(pod_ref, created, own)| {
                let (cpu, memory) = stats(&format!("pod/{}", pod_ref.uid));
                let containers = own
                    .into_iter()
                    .map(|(id, name, created)| {
                        let (cpu, memory) = stats(&format!("container/{id}"));
                        ContainerStats { name, start_time: rfc3339_nanos(created), cpu, memory }
                    })
                    .collect();
                PodStats { pod_ref, start_time: rfc3339_nanos(created), containers, cpu, memory }
            })
            .collect();
        Ok(Summary { node, pods })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::stats::cgroup::MemoryUsage;

    #[test]
    fn the_summary_has_upstreams_json_shape() {
        let sample = CgroupSample {
            cpu_usage_ns: Some(5_000_000_000),
            memory: Some(MemoryUsage {
                usage_bytes: 300,
                working_set_bytes: 200,
                rss_bytes: 100,
                ..Default::default()
            }),
        };
        let rate = Rate { nano_cores: 250_000_000, window: std::time::Duration::from_millis(1500) };
        let (cpu, memory) = stats_of(&sample, Some(rate), "2026-11-24T04:00:00Z");
        let summary = Summary {
            node: NodeStats {
                node_name: "n1".into(),
                start_time: "2026-11-24T00:00:00Z".into(),
                cpu: cpu.clone(),
                memory: memory.clone(),
            },
            pods: vec![PodStats {
                pod_ref: PodReference { name: "web".into(), namespace: "default".into(), uid: "u1".into() },
                start_time: rfc3339_nanos(1_000_000_000),
                containers: vec![ContainerStats { name: "app".into(), start_time: String::new(), cpu, memory }],
                cpu: None,
                memory: None,
            }],
        };
        let v = serde_json::to_value(&summary).unwrap();
        assert_eq!(v["node"]["nodeName"], "n1");
        assert_eq!(v["node"]["cpu"]["usageNanoCores"], 250_000_000);
        assert_eq!(v["node"]["cpu"]["usageCoreNanoSeconds"], 5_000_000_000u64);
        assert_eq!(v["node"]["memory"]["workingSetBytes"], 200);
        assert_eq!(v["node"]["memory"]["rssBytes"], 100);
        assert_eq!(v["pods"][0]["podRef"]["namespace"], "default");
        assert_eq!(v["pods"][0]["startTime"], "1970-01-01T00:00:01Z");
        assert_eq!(v["pods"][0]["containers"][0]["memory"]["usageBytes"], 300);
        assert!(v["pods"][0].get("cpu").is_none());
        let back: Summary = serde_json::from_value(v).unwrap();
        assert_eq!(back, summary);
    }
}
