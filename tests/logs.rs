//! `kubectl logs` through the API server and the node's kubelet API:
//! the options (`--tail`, `--since`, `--timestamps`, `--limit-bytes`,
//! `-c`, `--all-containers`, `-l`, `deploy/NAME`, `--previous`), following
//! a container until it exits and across a rotation of its log, reading
//! rotated files, and the kubelet's refusal for a container not started.
//! kubectl 1.33 and 1.27 both.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::node::{Node, BUSYBOX};

fn kubectl_dir() -> std::path::PathBuf {
    let out = Command::new("sh").args(["-c", "readlink -f $(command -v kubectl)"]).output().expect("readlink");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    std::path::Path::new(&path).parent().expect("kubectl folder").to_path_buf()
}

fn kubectl_version(minor: u32) -> String {
    kubectl_dir().join(format!("kubectl.1.{minor}")).display().to_string()
}

fn pods(node: &Node) {
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: counter, namespace: default, labels: {{app: counter}}}}
spec:
  containers:
  - name: app
    image: {BUSYBOX}
    # stdout and stderr reach the log through two pipes the shim reads
    # apart: a pause keeps the stderr line after the last stdout one.
    command: ["sh", "-c", "i=0; while [ $i -lt 5 ]; do echo line-$i; i=$((i+1)); done; sleep 1; echo err-line >&2; exec sleep 3600"]
---
apiVersion: v1
kind: Pod
metadata: {{name: two, namespace: default}}
spec:
  containers:
  - {{name: a, image: {BUSYBOX}, command: ["sh", "-c", "echo from-a; exec sleep 3600"]}}
  - {{name: b, image: {BUSYBOX}, command: ["sh", "-c", "echo from-b; exec sleep 3600"]}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: dep, namespace: default}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: dep}}}}
  template:
    metadata: {{labels: {{app: dep}}}}
    spec:
      containers:
      - {{name: app, image: {BUSYBOX}, command: ["sh", "-c", "echo dep-line; exec sleep 3600"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: crasher, namespace: default}}
spec:
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "n=$(cat /d/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /d/n; echo attempt-$n; sleep 5; exit 1"]
    volumeMounts: [{{name: d, mountPath: /d}}]
  volumes: [{{name: d, emptyDir: {{}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: stuck, namespace: default}}
spec:
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sleep", "3600"]
    volumeMounts: [{{name: c, mountPath: /c}}]
  volumes: [{{name: c, configMap: {{name: absent}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: chatty, namespace: default}}
spec:
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "i=0; while [ $i -lt 400 ]; do echo chatty-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; exec sleep 3600"]
---
apiVersion: v1
kind: Pod
metadata: {{name: stream, namespace: default}}
spec:
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "i=0; while :; do echo stream-$i-yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy; i=$((i+1)); usleep 20000; done"]
"#
    ));
}

fn running(node: &Node, pod: &str) {
    node.eventually(&format!("{pod} runs"), 60, || node.get(&["pod", pod], "{.status.phase}") == "Running");
}

#[test]
fn kubectl_logs_reads_follows_and_refuses_like_upstream() {
    // Logs over 16 KiB are rotated at the next pass (every 10 s).
    let node =
        Node::start(&["--kubelet-arg", "container-log-max-size=16Ki", "--kubelet-arg", "container-log-max-files=5"]);
    pods(&node);
    for p in ["counter", "two", "chatty", "stream"] {
        running(&node, p);
    }
    let logs = |args: &[&str]| {
        let mut a = vec!["logs"];
        a.extend_from_slice(args);
        node.ok(&a)
    };
    let all = "line-0\nline-1\nline-2\nline-3\nline-4\nerr-line\n";
    node.eventually("counter wrote its lines", 20, || logs(&["counter"]) == all);
    for kubectl in [kubectl_version(33), kubectl_version(27)] {
        let (ok, out) = node.kubectl_with(&kubectl, &["logs", "counter"]);
        assert!(ok && out == all, "{kubectl}: {out}");
        let (ok, out) = node.kubectl_with(&kubectl, &["logs", "counter", "--tail=2"]);
        assert!(ok && out == "line-4\nerr-line\n", "{kubectl}: {out}");
    }
    assert_eq!(logs(&["counter", "--limit-bytes=10"]), "line-0\nlin");
    assert_eq!(logs(&["counter", "--since=1h"]), all);
    let stamped = logs(&["counter", "--timestamps", "--tail=1"]);
    let (ts, text) = stamped.split_once(' ').expect("a timestamp");
    assert_eq!(text, "err-line\n");
    assert!(ts.starts_with("20") && ts.ends_with('Z') && ts.contains('T'), "{stamped}");
    // Lines older than --since are left out.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(logs(&["counter", "--since=2s"]), "");

    // Containers by name, all of them, by label, through a Deployment.
    assert_eq!(logs(&["two", "-c", "b"]), "from-b\n");
    let both = logs(&["two", "--all-containers"]);
    assert!(both.contains("from-a\n") && both.contains("from-b\n"), "{both}");
    // kubectl picks the first container itself; the API asks for one.
    let (ok, out) = node.kubectl(&["logs", "two"]);
    assert!(ok && out.contains("Defaulted container \"a\" out of: a, b") && out.starts_with("from-a\n"), "{out}");
    let (ok, out) = node.kubectl(&["get", "--raw", "/api/v1/namespaces/default/pods/two/log"]);
    assert!(!ok && out.contains("a container name must be specified for pod two, choose one of: [a b]"), "{out}");
    assert_eq!(logs(&["-l", "app=counter", "--tail=1"]), "err-line\n");
    node.eventually("the deployment's pod logs", 60, || node.kubectl(&["logs", "deploy/dep"]).1 == "dep-line\n");

    // --previous: the instance before the current one.
    node.eventually("crasher restarted", 60, || {
        node.get(&["pod", "crasher"], "{.status.containerStatuses[0].restartCount}").parse::<u32>().unwrap_or(0) >= 1
    });
    // While an instance runs, the current log is its own and the previous
    // one its predecessor's (in back-off both name the last instance, as
    // upstream's kubelet does, so the check waits for a running one).
    node.eventually("the previous instance's log", 45, || {
        let (ok, prev) = node.kubectl(&["logs", "crasher", "--previous"]);
        let (ok2, cur) = node.kubectl(&["logs", "crasher"]);
        let n = |s: &str| s.trim().strip_prefix("attempt-").and_then(|n| n.parse::<u32>().ok());
        ok && ok2 && matches!((n(&prev), n(&cur)), (Some(p), Some(c)) if c == p + 1)
    });
    let (ok, out) = node.kubectl(&["logs", "counter", "--previous"]);
    assert!(!ok && out.contains(r#"previous terminated container "app" in pod "counter" not found"#), "{out}");

    // A container not started yet: the kubelet's reason, as a 400.
    node.eventually("stuck waits", 30, || {
        node.get(&["pod", "stuck"], "{.status.containerStatuses[0].state.waiting.reason}") == "ContainerCreating"
    });
    let (ok, out) = node.kubectl(&["logs", "stuck"]);
    assert!(
        !ok && out.contains(
            r#"Error from server (BadRequest): container "app" in pod "stuck" is waiting to start: ContainerCreating"#
        ),
        "{out}"
    );

    // Rotation: the chatty log is rotated; every line is still read, in order.
    let logs_dir = node.dir.path().join("agent").join("logs").join("pods");
    let rotated = || {
        let out = Command::new("find").arg(&logs_dir).args(["-name", "0.log.*"]).output().expect("find");
        String::from_utf8_lossy(&out.stdout).lines().any(|l| l.contains("_chatty_"))
    };
    node.eventually("chatty's log is rotated", 40, rotated);
    let chatty = logs(&["chatty"]);
    let expected: String = (0..400).map(|i| format!("chatty-{i}-{}\n", "x".repeat(40))).collect();
    assert_eq!(chatty, expected);
    assert_eq!(logs(&["chatty", "--tail=2"]), expected.lines().skip(398).map(|l| format!("{l}\n")).collect::<String>());

    // Following across rotations: no line lost, none repeated.
    let mut follower = Command::new("kubectl")
        .env("KUBECONFIG", node.kubeconfig())
        .env("HOME", node.dir.path())
        .args(["logs", "-f", "stream", "--tail=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let stdout = follower.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(25);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(n) =
                line.strip_prefix("stream-").and_then(|r| r.split('-').next()).and_then(|n| n.parse::<u64>().ok())
            {
                seen.push(n);
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        seen
    });
    let seen = reader.join().expect("reader");
    let _ = follower.kill();
    let _ = follower.wait();
    assert!(seen.len() > 200, "too few lines followed: {}", seen.len());
    for w in seen.windows(2) {
        assert_eq!(w[1], w[0] + 1, "a gap or repeat while following: {w:?}");
    }
    let out = Command::new("find").arg(&logs_dir).args(["-name", "0.log.*"]).output().expect("find");
    let stream_rotations = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("_stream_")).count();
    assert!(stream_rotations >= 1, "the followed log was never rotated");
}

#[test]
fn kubectl_logs_follow_ends_when_the_container_exits() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: ender, namespace: default}}
spec:
  restartPolicy: Never
  containers:
  - {{name: app, image: {BUSYBOX}, command: ["sh", "-c", "for i in 1 2 3 4 5 6; do echo tick-$i; sleep 1; done"]}}
"#
    ));
    running(&node, "ender");
    for kubectl in [kubectl_version(33), kubectl_version(27)] {
        let started = Instant::now();
        let (ok, out) = node.kubectl_with(&kubectl, &["logs", "-f", "ender"]);
        assert!(ok, "{kubectl}: {out}");
        assert!(out.ends_with("tick-6\n"), "{kubectl}: {out}");
        assert!(started.elapsed() < Duration::from_secs(30), "the follower did not end with the container");
    }
    assert_eq!(node.ok(&["logs", "ender"]), (1..=6).map(|i| format!("tick-{i}\n")).collect::<String>());
}
