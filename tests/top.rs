//! `kubectl top` with no metrics-server: the API server serves
//! `metrics.k8s.io/v1beta1` from each node's `/stats/summary`. A pod that
//! burns CPU shows a plausible non-zero CPU, and its memory agrees with its
//! container's cgroup files. The kubelet's stats and resource metrics are
//! read through `nodes/proxy` too.

mod common;

use common::node::{Node, BUSYBOX};

fn kubectl_version(minor: u32) -> String {
    let out =
        std::process::Command::new("sh").args(["-c", "readlink -f $(command -v kubectl)"]).output().expect("readlink");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    std::path::Path::new(&path)
        .parent()
        .expect("kubectl folder")
        .join(format!("kubectl.1.{minor}"))
        .display()
        .to_string()
}

/// `250m` → 250, `1` → 1000 (millicores); `12Mi` → bytes.
fn millicores(q: &str) -> Option<u64> {
    if let Some(n) = q.strip_suffix('n') {
        return n.parse::<u64>().ok().map(|n| n / 1_000_000);
    }
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    q.parse::<u64>().ok().map(|c| c * 1000)
}

fn bytes(q: &str) -> Option<u64> {
    for (suffix, mult) in [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)] {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().ok().map(|n| n * mult);
        }
    }
    q.parse().ok()
}

/// The working set of a cgroup v1 memory folder, as the kernel tells it.
fn cgroup_working_set(dir: &std::path::Path) -> u64 {
    let usage: u64 = std::fs::read_to_string(dir.join("memory.usage_in_bytes")).unwrap().trim().parse().unwrap();
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap();
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    usage.saturating_sub(inactive)
}

#[test]
fn kubectl_top_shows_node_and_pod_usage() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: burn, namespace: default, labels: {{app: burn}}}}
spec:
  containers:
  - {{name: burn, image: {BUSYBOX}, command: ["sh", "-c", "while :; do :; done"]}}
  - {{name: idle, image: {BUSYBOX}, command: ["sleep", "3600"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: other, namespace: default, labels: {{app: other}}}}
spec:
  containers:
  - {{name: app, image: {BUSYBOX}, command: ["sleep", "3600"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: crash, namespace: default, labels: {{app: crash}}}}
spec:
  containers:
  - {{name: app, image: {BUSYBOX}, command: ["sh", "-c", "exit 1"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: divisor, namespace: default, labels: {{app: divisor}}}}
spec:
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "echo cpu=$CPU; exec sleep 3600"]
    resources: {{limits: {{cpu: "2"}}}}
    # What typed clients send for an unset divisor: "0", read as 1.
    env: [{{name: CPU, valueFrom: {{resourceFieldRef: {{resource: limits.cpu, divisor: "0"}}}}}}]
"#
    ));
    for p in ["burn", "other", "divisor"] {
        node.eventually(&format!("{p} runs"), 60, || node.get(&["pod", p], "{.status.phase}") == "Running");
    }

    // Discovery and the local APIService.
    let resources = node.ok(&["api-resources", "--api-group=metrics.k8s.io"]);
    assert!(
        resources.contains("nodes") && resources.contains("pods") && resources.contains("PodMetrics"),
        "{resources}"
    );
    let available =
        node.get(&["apiservice", "v1beta1.metrics.k8s.io"], "{.status.conditions[?(@.type==\"Available\")].status}");
    assert_eq!(available, "True");

    // kubectl top node: the node with a non-zero CPU and memory.
    for kubectl in ["kubectl".to_string(), kubectl_version(33), kubectl_version(27)] {
        let (ok, out) = node.kubectl_with(&kubectl, &["top", "node"]);
        assert!(ok, "{kubectl}: {out}");
        let row: Vec<&str> =
            out.lines().find(|l| l.starts_with(&node.name)).expect("the node's row").split_whitespace().collect();
        assert!(millicores(row[1]).unwrap_or(0) > 0, "{kubectl}: {out}");
        assert!(bytes(row[3]).unwrap_or(0) > 0, "{kubectl}: {out}");
    }

    // kubectl top pod --containers: the burning container uses CPU.
    node.eventually("burn shows CPU", 30, || {
        let (ok, out) = node.kubectl(&["top", "pod", "--containers", "-A"]);
        let burn = out.lines().find(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 5 && f[1] == "burn" && f[2] == "burn"
        });
        ok && burn.is_some_and(|l| millicores(l.split_whitespace().nth(3).unwrap_or("")).unwrap_or(0) >= 50)
    });
    let (ok, out) = node.kubectl(&["top", "pod", "-l", "app=burn"]);
    assert!(ok && out.contains("burn") && !out.contains("other"), "{out}");
    assert_eq!(node.ok(&["logs", "divisor"]).trim(), "cpu=2");
    // A crash-looping pod has no usage: left out, and the namespace's list
    // still reads (kubectl failed on a PodMetrics without window or timestamp).
    node.eventually("crash restarted", 60, || {
        node.get(&["pod", "crash"], "{.status.containerStatuses[0].restartCount}").parse::<u32>().unwrap_or(0) >= 1
    });
    for kubectl in ["kubectl".to_string(), kubectl_version(27)] {
        let (ok, out) = node.kubectl_with(&kubectl, &["top", "pod"]);
        assert!(ok && out.contains("burn") && !out.contains("crash"), "{kubectl}: {out}");
    }
    let (ok, out) = node.kubectl(&["top", "pod", "missing"]);
    assert!(!ok && out.contains("NotFound"), "{out}");

    // The memory reported is the container cgroup's working set.
    let uid = node.get(&["pod", "burn"], "{.metadata.uid}");
    let id = node.container_id("default", "burn", "burn");
    let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/memory{}/besteffort/pod{uid}/{id}", node.cgroup_root));
    assert!(dir.is_dir(), "no cgroup folder {}", dir.display());
    node.eventually("memory agrees with the cgroup", 30, || {
        let raw = node.ok(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/burn"]);
        let v: serde_json::Value = serde_json::from_str(&raw).expect("PodMetrics");
        let reported = v["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == "burn"))
            .and_then(|c| c["usage"]["memory"].as_str())
            .and_then(bytes)
            .unwrap_or(0);
        let actual = cgroup_working_set(&dir);
        // The window is the time between the kubelet's two CPU readings.
        let window = v["window"].as_str().unwrap_or_default();
        assert!(window.ends_with("ms") || window.ends_with('s'), "window {window:?} in {v}");
        reported > 0 && reported.abs_diff(actual) <= actual / 10 + 64 * 1024
    });

    // The kubelet's own answers, through nodes/proxy.
    let summary = node.ok(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/stats/summary", node.name)]);
    let summary: serde_json::Value = serde_json::from_str(&summary).expect("summary");
    assert_eq!(summary["node"]["nodeName"], node.name.as_str());
    assert!(summary["node"]["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0) > 0);
    let pod = summary["pods"].as_array().unwrap().iter().find(|p| p["podRef"]["name"] == "burn").expect("burn");
    assert_eq!(pod["containers"].as_array().map(Vec::len), Some(2), "{pod}");
    let resource = node.ok(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/metrics/resource", node.name)]);
    assert!(
        resource.contains(r#"container_cpu_usage_seconds_total{container="burn",namespace="default",pod="burn"}"#),
        "{resource}"
    );
    assert!(resource.contains("resource_scrape_error 0"), "{resource}");
    let cadvisor = node.ok(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/metrics/cadvisor", node.name)]);
    assert!(cadvisor.contains(r#"container_memory_working_set_bytes{container="idle",namespace="default",pod="burn"}"#));

    // Who may read metrics: view (aggregated from system:aggregated-metrics-reader).
    node.ok(&["create", "serviceaccount", "viewer"]);
    node.ok(&["create", "rolebinding", "viewer", "--clusterrole=view", "--serviceaccount=default:viewer"]);
    let can =
        node.kubectl(&["auth", "can-i", "list", "pods.metrics.k8s.io", "--as=system:serviceaccount:default:viewer"]).1;
    assert_eq!(can.trim(), "yes");
    let (ok, _) = node.kubectl(&["get", "clusterrole", "system:aggregated-metrics-reader"]);
    assert!(ok);
}
