//! The kubelet's Prometheus endpoints written from a stats summary:
//! `/metrics/resource` (the resource metrics, upstream's
//! `collectors/resource_metrics.go`), `/metrics/cadvisor` (cAdvisor's
//! container series for the same cgroups) and `/metrics` (the kubelet's
//! own: what it runs).

use std::fmt::Write;

use k8s_openapi::jiff::Timestamp;

use super::summary::{CpuStats, MemoryStats, Summary};
use crate::metrics::{format_float, labels, write_header};

fn millis(time: &str) -> Option<i64> {
    time.parse::<Timestamp>().ok().map(|t| t.as_millisecond())
}

fn sample(out: &mut String, name: &str, labels: &str, value: f64, time: &str) {
    let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
    match millis(time) {
        Some(ms) => {
            let _ = writeln!(out, "{name}{braces} {} {ms}", format_float(value));
        }
        None => {
            let _ = writeln!(out, "{name}{braces} {}", format_float(value));
        }
    }
}

fn cpu_seconds(cpu: &Option<CpuStats>) -> Option<(f64, &str)> {
    let c = cpu.as_ref()?;
    Some((c.usage_core_nano_seconds? as f64 / 1e9, c.time.as_str()))
}

fn working_set(m: &Option<MemoryStats>) -> Option<(f64, &str)> {
    let m = m.as_ref()?;
    Some((m.working_set_bytes? as f64, m.time.as_str()))
}

/// One metric family over the node, pods or containers of a summary.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
}

/// `/metrics/resource`; `scrape_error` says the summary could not be had.
pub fn resource_metrics(summary: Option<&Summary>) -> String {
    let mut out = String::new();
    let empty = Summary::default();
    let s = summary.unwrap_or(&empty);
    let fam = |out: &mut String, f: &Family| write_header(out, f.name, f.help, f.kind);
    let containers = || {
        s.pods.iter().flat_map(|p| {
            p.containers.iter().map(move |c| {
                (labels(&[("container", &c.name), ("namespace", &p.pod_ref.namespace), ("pod", &p.pod_ref.name)]), c)
            })
        })
    };
    let pods = || s.pods.iter().map(|p| (labels(&[("namespace", &p.pod_ref.namespace), ("pod", &p.pod_ref.name)]), p));
    if summary.is_some() {
        fam(
            &mut out,
            &Family {
                name: "container_cpu_usage_seconds_total",
                help: "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
                kind: "counter",
            },
        );
        for (l, c) in containers() {
            if let Some((v, t)) = cpu_seconds(&c.cpu) {
                sample(&mut out, "container_cpu_usage_seconds_total", &l, v, t);
            }
        }
        fam(
            &mut out,
            &Family {
                name: "container_memory_working_set_bytes",
                help: "[STABLE] Current working set of the container in bytes",
                kind: "gauge",
            },
        );
        for (l, c) in containers() {
            if let Some((v, t)) = working_set(&c.memory) {
                sample(&mut out, "container_memory_working_set_bytes", &l, v, t);
            }
        }
        fam(
            &mut out,
            &Family {
                name: "container_start_time_seconds",
                help: "[STABLE] Start time of the container since unix epoch in seconds",
                kind: "gauge",
            },
        );
        for (l, c) in containers() {
            if let Ok(t) = c.start_time.parse::<Timestamp>() {
                let secs = t.as_nanosecond() as f64 / 1e9;
                let _ = writeln!(out, "container_start_time_seconds{{{l}}} {}", format_float(secs));
            }
        }
        fam(
            &mut out,
            &Family {
                name: "node_cpu_usage_seconds_total",
                help: "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
                kind: "counter",
            },
        );
        if let Some((v, t)) = cpu_seconds(&s.node.cpu) {
            sample(&mut out, "node_cpu_usage_seconds_total", "", v, t);
        }
        fam(
            &mut out,
            &Family {
                name: "node_memory_working_set_bytes",
                help: "[STABLE] Current working set of the node in bytes",
                kind: "gauge",
            },
        );
        if let Some((v, t)) = working_set(&s.node.memory) {
            sample(&mut out, "node_memory_working_set_bytes", "", v, t);
        }
        fam(
            &mut out,
            &Family {
                name: "pod_cpu_usage_seconds_total",
                help: "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
                kind: "counter",
            },
        );
        for (l, p) in pods() {
            if let Some((v, t)) = cpu_seconds(&p.cpu) {
                sample(&mut out, "pod_cpu_usage_seconds_total", &l, v, t);
            }
        }
        fam(
            &mut out,
            &Family {
                name: "pod_memory_working_set_bytes",
                help: "[STABLE] Current working set of the pod in bytes",
                kind: "gauge",
            },
        );
        for (l, p) in pods() {
            if let Some((v, t)) = working_set(&p.memory) {
                sample(&mut out, "pod_memory_working_set_bytes", &l, v, t);
            }
        }
    }
    write_header(
        &mut out,
        "resource_scrape_error",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
    );
    let _ = writeln!(out, "resource_scrape_error {}", if summary.is_some() { 0 } else { 1 });
    out
}

/// `/metrics/cadvisor`: the container series, per container, per pod
/// (`container=""`) and for the root cgroup (`id="/"`).
pub fn cadvisor_metrics(s: &Summary) -> String {
    let mut out = String::new();
    // (labels, cpu, memory) of every cgroup in the summary.
    let mut rows: Vec<(String, &Option<CpuStats>, &Option<MemoryStats>)> =
        vec![(labels(&[("container", ""), ("id", "/"), ("namespace", ""), ("pod", "")]), &s.node.cpu, &s.node.memory)];
    for p in &s.pods {
        let (ns, pod) = (p.pod_ref.namespace.as_str(), p.pod_ref.name.as_str());
        let pod_id = format!("/pod{}", p.pod_ref.uid);
        rows.push((labels(&[("container", ""), ("id", &pod_id), ("namespace", ns), ("pod", pod)]), &p.cpu, &p.memory));
        for c in &p.containers {
            rows.push((labels(&[("container", &c.name), ("namespace", ns), ("pod", pod)]), &c.cpu, &c.memory));
        }
    }
    type Pick = fn(&Option<CpuStats>, &Option<MemoryStats>) -> Option<(f64, String)>;
    let families: [(&str, &str, &str, Pick); 4] = [
        ("container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds.", "counter", |c, _| {
            cpu_seconds(c).map(|(v, t)| (v, t.to_string()))
        }),
        (
            "container_memory_usage_bytes",
            "Current memory usage in bytes, including all memory regardless of when it was accessed",
            "gauge",
            |_, m| m.as_ref().and_then(|m| Some((m.usage_bytes? as f64, m.time.clone()))),
        ),
        ("container_memory_working_set_bytes", "Current working set in bytes.", "gauge", |_, m| {
            working_set(m).map(|(v, t)| (v, t.to_string()))
        }),
        ("container_memory_rss", "Size of RSS in bytes.", "gauge", |_, m| {
            m.as_ref().and_then(|m| Some((m.rss_bytes? as f64, m.time.clone())))
        }),
    ];
    for (name, help, kind, pick) in families {
        write_header(&mut out, name, help, kind);
        for (l, cpu, mem) in &rows {
            if let Some((v, t)) = pick(cpu, mem) {
                sample(&mut out, name, l, v, &t);
            }
        }
    }
    out
}

/// `/metrics`: the kubelet's own series that ferrok keeps.
pub fn kubelet_metrics(node_name: &str, s: Option<&Summary>) -> String {
    let mut out = String::new();
    write_header(&mut out, "kubelet_node_name", "[ALPHA] The node's name. The count is always 1.", "gauge");
    let _ = writeln!(out, "kubelet_node_name{{{}}} 1", labels(&[("node", node_name)]));
    if let Some(s) = s {
        write_header(
            &mut out,
            "kubelet_running_pods",
            "[ALPHA] Number of pods that have a running pod sandbox",
            "gauge",
        );
        let _ = writeln!(out, "kubelet_running_pods {}", s.pods.len());
        write_header(&mut out, "kubelet_running_containers", "[ALPHA] Number of containers currently running", "gauge");
        let running: usize = s.pods.iter().map(|p| p.containers.len()).sum();
        let _ = writeln!(out, "kubelet_running_containers{{container_state=\"running\"}} {running}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::stats::summary::{ContainerStats, NodeStats, PodReference, PodStats};

    fn summary() -> Summary {
        let t = "2026-11-24T04:00:00Z".to_string();
        let cpu = |ns| {
            Some(CpuStats {
                time: t.clone(),
                usage_nano_cores: Some(1),
                usage_core_nano_seconds: Some(ns),
                usage_window_nano_seconds: None,
            })
        };
        let mem = |ws| {
            Some(MemoryStats {
                time: t.clone(),
                working_set_bytes: Some(ws),
                usage_bytes: Some(ws * 2),
                ..Default::default()
            })
        };
        Summary {
            node: NodeStats {
                node_name: "n1".into(),
                start_time: t.clone(),
                cpu: cpu(10_500_000_000),
                memory: mem(1000),
            },
            pods: vec![PodStats {
                pod_ref: PodReference { name: "web".into(), namespace: "default".into(), uid: "u1".into() },
                start_time: t.clone(),
                containers: vec![ContainerStats {
                    name: "app".into(),
                    start_time: t.clone(),
                    cpu: cpu(2_000_000_000),
                    memory: mem(300),
                }],
                cpu: cpu(2_500_000_000),
                memory: mem(400),
            }],
        }
    }

    #[test]
    fn resource_metrics_carry_upstreams_names_and_labels() {
        let text = resource_metrics(Some(&summary()));
        let ms = 1_795_492_800_000i64;
        for line in [
            format!("container_cpu_usage_seconds_total{{container=\"app\",namespace=\"default\",pod=\"web\"}} 2 {ms}"),
            format!(
                "container_memory_working_set_bytes{{container=\"app\",namespace=\"default\",pod=\"web\"}} 300 {ms}"
            ),
            format!("node_cpu_usage_seconds_total 10.5 {ms}"),
            format!("node_memory_working_set_bytes 1000 {ms}"),
            format!("pod_cpu_usage_seconds_total{{namespace=\"default\",pod=\"web\"}} 2.5 {ms}"),
            format!("pod_memory_working_set_bytes{{namespace=\"default\",pod=\"web\"}} 400 {ms}"),
            "container_start_time_seconds{container=\"app\",namespace=\"default\",pod=\"web\"} 1795492800".to_string(),
            "resource_scrape_error 0".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        assert_eq!(resource_metrics(None).lines().last(), Some("resource_scrape_error 1"));
    }

    #[test]
    fn cadvisor_metrics_cover_containers_pods_and_the_root() {
        let text = cadvisor_metrics(&summary());
        assert!(
            text.contains("container_cpu_usage_seconds_total{container=\"app\",namespace=\"default\",pod=\"web\"} 2 ")
        );
        assert!(text.contains("container_memory_usage_bytes{container=\"\",id=\"/\",namespace=\"\",pod=\"\"} 2000 "));
        assert!(text.contains(
            "container_memory_working_set_bytes{container=\"\",id=\"/podu1\",namespace=\"default\",pod=\"web\"} 400 "
        ));
        let k = kubelet_metrics("n1", Some(&summary()));
        assert!(k.contains("kubelet_node_name{node=\"n1\"} 1\n"));
        assert!(k.contains("kubelet_running_containers{container_state=\"running\"} 1\n"));
    }
}
