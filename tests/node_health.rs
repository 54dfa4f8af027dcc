//! Keeping a node healthy, against the real `ferrok server` with its node
//! role (`common::node::Node`: its own network namespace, cgroup root and
//! data dir): container log rotation, node-pressure eviction with the
//! pressure conditions and taints, admission under pressure, node-level
//! reclaim (unused images, orphaned pods), and local-storage limit
//! evictions. Needs root, containerd, runc and the CNI plugins (scripts/deps).

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::node::{Node, BUSYBOX};
use sha2::{Digest, Sha256};

const IMAGE: &str = BUSYBOX;
/// Keeps a container running (the test image's own command is `sh`).
const SLEEP: &str = r#""command": ["sleep", "1000000"]"#;

/// A one-layer OCI image-layout tarball whose single file holds `name`, so
/// that images of different names are different images. Never run.
fn tiny_image(dir: &Path, name: &str) -> PathBuf {
    let sha = |b: &[u8]| format!("sha256:{:x}", Sha256::digest(b));
    let root = dir.join("tiny");
    let rootfs = root.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    std::fs::write(rootfs.join("name"), name).unwrap();
    let layer_path = root.join("layer.tar");
    let ok = Command::new("tar")
        .args(["--owner=0", "--group=0", "-C"])
        .arg(&rootfs)
        .arg("-cf")
        .arg(&layer_path)
        .arg(".")
        .status();
    assert!(ok.unwrap().success());
    let layer = std::fs::read(&layer_path).unwrap();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({"architecture": arch, "os": "linux", "config": {"Cmd": ["/name"]},
        "rootfs": {"type": "layers", "diff_ids": [sha(&layer)]}})
    .to_string();
    let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(config.as_bytes()), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha(&layer), "size": layer.len()}]})
    .to_string();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": sha(manifest.as_bytes()), "size": manifest.len(), "platform": {"architecture": arch, "os": "linux"},
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "test"}}]})
    .to_string();
    let layout = root.join("layout");
    let blobs = layout.join("blobs").join("sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for blob in [&layer[..], config.as_bytes(), manifest.as_bytes()] {
        std::fs::write(blobs.join(&sha(blob)["sha256:".len()..]), blob).unwrap();
    }
    std::fs::write(layout.join("index.json"), index).unwrap();
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let tarball = root.join("image.tar");
    assert!(Command::new("tar").arg("-C").arg(&layout).arg("-cf").arg(&tarball).arg(".").status().unwrap().success());
    tarball
}

fn pod_logs_dir(node: &Node) -> PathBuf {
    node.dir.path().join("agent").join("logs").join("pods")
}

fn server_log(node: &Node) -> String {
    let log = node.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The files in a container's log folder, leftovers of a pass in progress excluded.
fn log_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.retain(|n| !n.ends_with(".tmp"));
    names.sort();
    names
}

/// The sequence numbers the container printed, from a CRI log's text.
fn numbers(text: &str) -> Vec<u64> {
    text.lines().filter_map(|l| l.splitn(4, ' ').nth(3)?.split(' ').next()?.parse().ok()).collect()
}

#[test]
fn container_logs_rotate_gzip_and_stay_bounded() {
    let node =
        Node::start(&["--kubelet-arg", "container-log-max-size=1Mi", "--kubelet-arg", "container-log-max-files=3"]);
    // About 200 KB/s of numbered 100-byte lines.
    let script = r#"n=0; while :; do n=$((n+1)); echo "$n xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"; [ $((n % 20)) -eq 0 ] && usleep 10000; done"#;
    node.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "chatty", "namespace": "default"}},
            "spec": {{"nodeName": "{}", "terminationGracePeriodSeconds": 1, "containers": [{{"name": "app", "image": "{IMAGE}",
              "command": ["sh", "-c", {}]}}]}}}}"#,
        node.name,
        serde_json::to_string(script).unwrap()
    ));
    node.eventually("chatty running", 60, || node.get(&["pod", "chatty"], "{.status.phase}") == "Running");
    let uid = node.get(&["pod", "chatty"], "{.metadata.uid}");
    let dir: PathBuf = pod_logs_dir(&node).join(format!("default_chatty_{uid}")).join("app");
    // Watch several rotations: never more than 3 files, the older rotated ones gzipped.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut rotations_seen = std::collections::BTreeSet::new();
    loop {
        let files = log_files(&dir);
        assert!(files.len() <= 3, "more than 3 log files: {files:?}");
        for f in files.iter().filter(|f| f.starts_with("0.log.")) {
            rotations_seen.insert(f.trim_end_matches(".gz").to_string());
        }
        let gz = files.iter().filter(|f| f.ends_with(".gz")).count();
        let plain_rotated = files.iter().filter(|f| f.starts_with("0.log.") && !f.ends_with(".gz")).count();
        if rotations_seen.len() >= 4 && gz == 1 && plain_rotated == 1 && files.contains(&"0.log".to_string()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rotation not seen: {files:?}, rotations {rotations_seen:?}\n{}",
            server_log(&node)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // The gzipped file is a whole CRI log; the live log goes on where the rotated one ended.
    let files = log_files(&dir);
    let gz_name = files.iter().find(|f| f.ends_with(".gz")).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(dir.join(gz_name)).unwrap()).read_to_string(&mut text).unwrap();
    let old = numbers(&text);
    assert!(old.len() > 1000, "{} lines in {gz_name}", old.len());
    assert!(text.lines().all(|l| l.contains(" stdout F ")), "not a CRI log");
    let rotated = files.iter().find(|f| f.starts_with("0.log.") && !f.ends_with(".gz")).unwrap();
    let newer = numbers(&std::fs::read_to_string(dir.join(rotated)).unwrap());
    assert!(old.last() < newer.first(), "gz before plain rotated file");
    std::thread::sleep(Duration::from_millis(500));
    let live = numbers(&std::fs::read_to_string(dir.join("0.log")).unwrap_or_default());
    let (Some(last_rotated), Some(first_live)) = (newer.last(), live.first()) else {
        panic!("empty logs: rotated {rotated}, live {}", live.len())
    };
    assert_eq!(*first_live, last_rotated + 1, "lines lost or duplicated across the rotation");
    // `kubectl logs` reads the live file through the kubelet API.
    let (ok, out) = node.kubectl(&["logs", "chatty", "--tail=3"]);
    assert!(ok, "kubectl logs --tail=3: {out}");
    let tail = numbers(&out.lines().map(|l| format!("t s F {l}")).collect::<Vec<_>>().join("\n"));
    // As upstream's kubelet, a read without --follow goes on to the end of
    // the file, which grows by ~2 lines a millisecond while it is read: the
    // last 3 lines at the start of the read, and what followed them.
    assert!((3..200).contains(&tail.len()), "{} lines for --tail=3: {out}", tail.len());
    assert!(tail.windows(2).all(|w| w[1] == w[0] + 1), "not consecutive lines: {out}");
    assert!(tail[0] > *last_rotated, "kubectl logs shows old lines: {out}");
}

fn gib_above_total_memory() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 =
        text.lines().find(|l| l.starts_with("MemTotal:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / (1024 * 1024) + 2
}

#[test]
fn memory_pressure_taints_the_node_and_evicts_best_effort_pods_not_critical_ones() {
    let gib = gib_above_total_memory();
    let threshold = format!("eviction-hard=memory.available<{gib}Gi");
    let node = Node::start(&["--kubelet-arg", &threshold, "--kubelet-arg", "image-gc-high-threshold=100"]);
    node.eventually("MemoryPressure", 60, || {
        node.get(&["node", &node.name], "{.status.conditions[?(@.type==\"MemoryPressure\")].status}") == "True"
    });
    node.eventually("memory-pressure taint", 60, || {
        let taints = node.get(&["node", &node.name], "{range .spec.taints[*]}{.key}:{.effect} {end}");
        taints.contains("node.kubernetes.io/memory-pressure:NoSchedule")
    });
    assert_eq!(node.get(&["node", &node.name], "{.status.conditions[?(@.type==\"DiskPressure\")].status}"), "False");
    // The threshold above the machine's memory leaves an allocatable of
    // no memory at all: a pod requesting memory would not fit (the node's
    // own admission, as upstream's), so the critical pod asks for CPU only.
    node.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "critical", "namespace": "kube-system"}},
            "spec": {{"nodeName": "{n}", "priorityClassName": "system-node-critical", "terminationGracePeriodSeconds": 1,
              "containers": [{{"name": "app", "image": "{IMAGE}", {SLEEP},
                "resources": {{"requests": {{"cpu": "50m"}}, "limits": {{"cpu": "50m"}}}}}}]}}}}"#,
        n = node.name
    ));
    node.eventually("critical pod running", 60, || {
        node.get(&["pod", "critical", "-n", "kube-system"], "{.status.phase}") == "Running"
    });
    assert_eq!(node.get(&["pod", "critical", "-n", "kube-system"], "{.status.qosClass}"), "Burstable");
    node.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "besteffort", "namespace": "default"}},
            "spec": {{"nodeName": "{n}", "terminationGracePeriodSeconds": 30,
              "tolerations": [{{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}}],
              "containers": [{{"name": "app", "image": "{IMAGE}", {SLEEP}}}]}}}}"#,
        n = node.name
    ));
    // It tolerates the memory-pressure taint, so it is admitted (as upstream), then evicted.
    node.eventually("the BestEffort pod evicted", 60, || {
        node.get(&["pod", "besteffort"], "{.status.phase}") == "Failed"
    });
    assert_eq!(node.get(&["pod", "besteffort"], "{.status.reason}"), "Evicted");
    let message = node.get(&["pod", "besteffort"], "{.status.message}");
    let prefix = format!("The node was low on resource: memory. Threshold quantity: {gib}Gi, available: ");
    assert!(message.starts_with(&prefix), "{message}");
    let condition = node.get(&["pod", "besteffort"], "{.status.conditions[?(@.type==\"DisruptionTarget\")].reason}");
    assert_eq!(condition, "TerminationByKubelet");
    node.eventually("the Evicted event", 20, || {
        let reasons = node.get(&["events", "--field-selector", "involvedObject.name=besteffort"], "{.items[*].reason}");
        reasons.split(' ').any(|r| r == "Evicted")
    });
    // Stopped with no grace (hard threshold), not its 30 s.
    node.eventually("the evicted pod's container stopped", 15, || {
        !node.get(&["pod", "besteffort"], "{.status.containerStatuses[0].state.terminated.reason}").is_empty()
    });
    // A new BestEffort pod is turned away while the pressure lasts, before it starts.
    node.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "late", "namespace": "default"}},
            "spec": {{"nodeName": "{n}", "containers": [{{"name": "app", "image": "{IMAGE}", {SLEEP}}}]}}}}"#,
        n = node.name
    ));
    node.eventually("the late pod rejected", 30, || node.get(&["pod", "late"], "{.status.phase}") == "Failed");
    assert_eq!(node.get(&["pod", "late"], "{.status.reason}"), "Evicted");
    assert_eq!(node.get(&["pod", "late"], "{.status.message}"), "The node had condition: [MemoryPressure]. ");
    assert_eq!(node.get(&["pod", "late"], "{.status.containerStatuses[0].state.running}"), "");
    assert_eq!(node.get(&["pod", "late"], "{.status.conditions[?(@.type==\"DisruptionTarget\")].status}"), "");
    // The critical pod stays through several more passes.
    let until = Instant::now() + Duration::from_secs(25);
    while Instant::now() < until {
        assert_eq!(node.get(&["pod", "critical", "-n", "kube-system"], "{.status.phase}"), "Running");
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn ephemeral_storage_overruns_evict_the_pod() {
    let node = Node::start(&[]);
    let fill = |mb: u32| format!("dd if=/dev/zero of=/tmp/fill bs=1M count={mb} && sleep 1000000");
    // One container: the pod's total limit is its limit, checked first (as upstream).
    node.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "filler", "namespace": "default"}},
            "spec": {{"nodeName": "{n}", "terminationGracePeriodSeconds": 30, "containers": [{{"name": "app", "image": "{IMAGE}",
              "command": ["sh", "-c", "{cmd}"], "resources": {{"limits": {{"ephemeral-storage": "5Mi"}}}}}}]}}}}"#,
        n = node.name,
        cmd = fill(20)
    ));
    // Two containers: one over its own limit, the pod within the sum.
    node.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "pair", "namespace": "default"}},
            "spec": {{"nodeName": "{n}", "terminationGracePeriodSeconds": 30, "containers": [
              {{"name": "small", "image": "{IMAGE}", "command": ["sh", "-c", "{cmd}"],
                "resources": {{"limits": {{"ephemeral-storage": "5Mi"}}}}}},
              {{"name": "big", "image": "{IMAGE}", {SLEEP}, "resources": {{"limits": {{"ephemeral-storage": "100Mi"}}}}}}]}}}}"#,
        n = node.name,
        cmd = fill(12)
    ));
    for pod in ["filler", "pair"] {
        node.eventually(&format!("{pod} evicted"), 90, || node.get(&["pod", pod], "{.status.phase}") == "Failed");
        assert_eq!(node.get(&["pod", pod], "{.status.reason}"), "Evicted");
    }
    assert_eq!(
        node.get(&["pod", "filler"], "{.status.message}"),
        "Pod ephemeral local storage usage exceeds the total limit of containers 5Mi. "
    );
    assert_eq!(
        node.get(&["pod", "pair"], "{.status.message}"),
        "Container small exceeded its local ephemeral storage limit \"5Mi\". "
    );
}

#[test]
fn disk_pressure_reclaims_unused_images_and_orphans_first() {
    // Any image filesystem is "full" at 99 %; periodic image GC is off, so
    // only the eviction manager's reclaim can remove images.
    let node = Node::start(&[
        "--kubelet-arg",
        "eviction-hard=imagefs.available<99%",
        "--kubelet-arg",
        "image-gc-high-threshold=100",
        "--kubelet-arg",
        "minimum-image-ttl-duration=1s",
    ]);
    // Leftovers of a pod this node no longer has: a log folder and a pod folder.
    let ghost = "0a0a0a0a-dead-4bad-8bad-0a0a0a0a0a0a";
    let ghost_logs = pod_logs_dir(&node).join(format!("default_ghost_{ghost}"));
    let ghost_pod = node.dir.path().join("agent").join("pods").join(ghost);
    // Made aside and moved in whole: the eviction manager's reclaim may run
    // at any moment and would take a half-made folder away under us.
    let staged = node.dir.path().join("ghost-logs");
    std::fs::create_dir_all(staged.join("app")).unwrap();
    std::fs::write(staged.join("app").join("0.log"), "old\n").unwrap();
    std::fs::create_dir_all(pod_logs_dir(&node)).unwrap();
    std::fs::rename(&staged, &ghost_logs).unwrap();
    std::fs::create_dir_all(&ghost_pod).unwrap();
    let unused = "docker.io/ferrok/unused:test";
    node.ctr(&["images", "import", &tiny_image(node.dir.path(), unused).to_string_lossy()]);
    assert!(node.ctr(&["images", "ls", "-q"]).contains(unused));
    node.eventually("DiskPressure", 60, || {
        node.get(&["node", &node.name], "{.status.conditions[?(@.type==\"DiskPressure\")].status}") == "True"
    });
    node.eventually("disk-pressure taint", 30, || {
        let taints = node.get(&["node", &node.name], "{range .spec.taints[*]}{.key}:{.effect} {end}");
        taints.contains("node.kubernetes.io/disk-pressure:NoSchedule")
    });
    node.eventually("the unused image removed", 60, || !node.ctr(&["images", "ls", "-q"]).contains(unused));
    // The sandbox image stays.
    assert!(node.ctr(&["images", "ls", "-q"]).contains(IMAGE));
    node.eventually("the orphans removed", 30, || !ghost_logs.exists() && !ghost_pod.exists());
    // New pods are turned away while the disk is short.
    node.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "late", "namespace": "default"}},
            "spec": {{"nodeName": "{n}", "containers": [{{"name": "app", "image": "{IMAGE}", {SLEEP},
              "resources": {{"requests": {{"memory": "8Mi"}}}}}}]}}}}"#,
        n = node.name
    ));
    node.eventually("the late pod rejected", 30, || node.get(&["pod", "late"], "{.status.phase}") == "Failed");
    assert_eq!(node.get(&["pod", "late"], "{.status.message}"), "The node had condition: [DiskPressure]. ");
}

#[test]
fn empty_dir_size_limit_overrun_evicts_the_pod() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "scratch", "namespace": "default"}},
            "spec": {{"nodeName": "{n}", "terminationGracePeriodSeconds": 30,
              "volumes": [{{"name": "x", "emptyDir": {{"sizeLimit": "1Mi"}}}}],
              "containers": [{{"name": "app", "image": "{IMAGE}",
                "command": ["sh", "-c", "dd if=/dev/zero of=/x/fill bs=1M count=4 && sleep 1000000"],
                "volumeMounts": [{{"name": "x", "mountPath": "/x"}}]}}]}}}}"#,
        n = node.name
    ));
    node.eventually("the scratch pod evicted", 60, || node.get(&["pod", "scratch"], "{.status.phase}") == "Failed");
    assert_eq!(node.get(&["pod", "scratch"], "{.status.reason}"), "Evicted");
    assert_eq!(
        node.get(&["pod", "scratch"], "{.status.message}"),
        "Usage of EmptyDir volume \"x\" exceeds the limit \"1Mi\". "
    );
    let condition = node.get(&["pod", "scratch"], "{.status.conditions[?(@.type==\"DisruptionTarget\")].status}");
    assert_eq!(condition, "True");
}
