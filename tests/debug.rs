//! `kubectl debug` against a real node: ephemeral containers added to a
//! running pod through `pods/ephemeralcontainers` (sharing the target's
//! process namespace), the updates upstream refuses, a copy of a pod, and
//! a node debugging pod with the host's namespaces and `/` at `/host`;
//! with the default kubectl and the oldest and newest ones beside it.
//! Needs root and the packages `scripts/deps` installs.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::node::{Node, BUSYBOX};

/// `kubectl.1.NN`, beside the file `kubectl` links to.
fn kubectl_version(minor: u32) -> String {
    let out = Command::new("sh").args(["-c", "readlink -f $(command -v kubectl)"]).output().expect("readlink");
    let main = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let path = main.with_file_name(format!("kubectl.1.{minor}"));
    assert!(path.exists(), "{} is missing", path.display());
    path.to_string_lossy().into_owned()
}

fn ephemeral_state(node: &Node, ns: &str, pod: &str, container: &str) -> String {
    node.get(
        &["pod", "-n", ns, pod],
        &format!("{{.status.ephemeralContainerStatuses[?(@.name==\"{container}\")].state}}"),
    )
}

/// The exit code of a terminated ephemeral container, once it has one.
fn ephemeral_exit(node: &Node, ns: &str, pod: &str, container: &str) -> Option<i64> {
    let state = ephemeral_state(node, ns, pod, container);
    let v: serde_json::Value = serde_json::from_str(&state).ok()?;
    v.pointer("/terminated/exitCode").and_then(serde_json::Value::as_i64)
}

fn wait_exit(node: &Node, ns: &str, pod: &str, container: &str) -> i64 {
    let mut code = None;
    node.eventually(&format!("ephemeral container {container} to terminate"), 60, || {
        code = ephemeral_exit(node, ns, pod, container);
        code.is_some()
    });
    code.unwrap_or(-1)
}

/// PUT of `pod` (JSON) to the pod's ephemeralcontainers subresource.
fn put_ephemeral(node: &Node, ns: &str, pod: &serde_json::Value) -> (bool, String) {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let file = node.dir.path().join("ephemeral-put.json");
    std::fs::write(&file, pod.to_string()).expect("write body");
    let url = format!("/api/v1/namespaces/{ns}/pods/{name}/ephemeralcontainers");
    node.kubectl(&["replace", "--raw", &url, "-f", file.to_str().unwrap_or_default()])
}

fn pod_json(node: &Node, ns: &str, pod: &str) -> serde_json::Value {
    let out = node.ok(&["get", "pod", "-n", ns, pod, "-o", "json"]);
    serde_json::from_str(&out).expect("pod JSON")
}

#[test]
fn ephemeral_containers_join_a_running_pod_and_existing_ones_stay() {
    let node = Node::start(&[]);
    node.ok(&["create", "namespace", "dbg"]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: app, namespace: dbg}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sleep", "3600"]
"#
    ));
    node.eventually("app to run", 60, || {
        !node.get(&["pod", "-n", "dbg", "app"], "{.status.containerStatuses[0].state.running.startedAt}").is_empty()
    });

    // With --target the debug container sees the target's processes.
    let (ok, out) = node.kubectl(&[
        "debug",
        "app",
        "-n",
        "dbg",
        "--image",
        BUSYBOX,
        "--target=app",
        "-c",
        "dbg1",
        "--",
        "sh",
        "-c",
        "ps; pidof sleep",
    ]);
    assert!(ok, "kubectl debug: {out}\n{}", node.log());
    assert_eq!(wait_exit(&node, "dbg", "app", "dbg1"), 0, "dbg1 sees the target's sleep");
    // Its output is the container's log: the target's processes in `ps`.
    let logs = node.ok(&["logs", "app", "-n", "dbg", "-c", "dbg1"]);
    assert!(logs.contains("sleep 3600"), "{logs}");
    // Without a target it has a process namespace of its own.
    let (ok, out) =
        node.kubectl(&["debug", "app", "-n", "dbg", "--image", BUSYBOX, "-c", "dbg2", "--", "sh", "-c", "pidof sleep"]);
    assert!(ok, "kubectl debug: {out}");
    assert_eq!(wait_exit(&node, "dbg", "app", "dbg2"), 1, "dbg2 does not see the target's sleep");
    let pod = pod_json(&node, "dbg", "app");
    assert_eq!(pod["spec"]["ephemeralContainers"][0]["targetContainerName"], "app");
    assert_eq!(pod["spec"]["ephemeralContainers"][0]["terminationMessagePolicy"], "File", "defaulted");
    assert_eq!(pod["status"]["phase"], "Running");
    // Never restarted: the finished containers stay terminated, once.
    let statuses = pod["status"]["ephemeralContainerStatuses"].as_array().cloned().unwrap_or_default();
    assert_eq!(statuses.len(), 2, "{statuses:?}");
    assert!(statuses.iter().all(|s| s["restartCount"] == 0 && s["ready"] == false), "{statuses:?}");
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0);

    // An existing ephemeral container may not change.
    let mut changed = pod.clone();
    changed["spec"]["ephemeralContainers"][0]["image"] = serde_json::json!("docker.io/library/busybox:2");
    let (ok, out) = put_ephemeral(&node, "dbg", &changed);
    assert!(!ok, "a change of dbg1 was accepted: {out}");
    assert!(
        out.contains(
            r#"spec.ephemeralContainers[dbg1]: Forbidden: existing ephemeral containers \"dbg1\" may not be changed"#
        ) || out.contains(
            r#"spec.ephemeralContainers[dbg1]: Forbidden: existing ephemeral containers "dbg1" may not be changed"#
        ),
        "{out}"
    );
    assert!(out.contains(r#"The Pod "app" is invalid"#), "{out}");
    // Nor be removed.
    let mut removed = pod.clone();
    removed["spec"]["ephemeralContainers"] = serde_json::json!([]);
    let (ok, out) = put_ephemeral(&node, "dbg", &removed);
    assert!(!ok && out.contains("may not be removed"), "{out}");
    // Ports, probes and resources are not for ephemeral containers.
    let mut ports = pod.clone();
    ports["spec"]["ephemeralContainers"].as_array_mut().expect("list").push(serde_json::json!({
        "name": "dbg3", "image": BUSYBOX, "ports": [{"containerPort": 80}],
        "resources": {"limits": {"cpu": "100m"}}
    }));
    let (ok, out) = put_ephemeral(&node, "dbg", &ports);
    assert!(!ok, "ports were accepted: {out}");
    assert!(
        out.contains("spec.ephemeralContainers[2].ports: Forbidden: cannot be set for an Ephemeral Container"),
        "{out}"
    );
    assert!(out.contains("spec.ephemeralContainers[2].resources: Forbidden"), "{out}");
    // A target that is not a container of the pod.
    let (ok, out) =
        node.kubectl(&["debug", "app", "-n", "dbg", "--image", BUSYBOX, "--target=nope", "-c", "dbg4", "--", "true"]);
    assert!(!ok && out.contains(r#"spec.ephemeralContainers[2].targetContainerName: Not found: "nope""#), "{out}");
    // Not through the pod itself.
    let mut direct = pod.clone();
    direct["spec"]["ephemeralContainers"].as_array_mut().expect("list").push(serde_json::json!({
        "name": "dbg5", "image": BUSYBOX
    }));
    let file = node.dir.path().join("direct.json");
    std::fs::write(&file, direct.to_string()).expect("write");
    let (ok, out) = node.kubectl(&["replace", "-f", file.to_str().unwrap_or_default()]);
    assert!(!ok && out.contains("spec: Forbidden: pod updates may not change fields other than"), "{out}");
    // Nothing refused was stored.
    let names = node.get(&["pod", "-n", "dbg", "app"], "{.spec.ephemeralContainers[*].name}");
    assert_eq!(names, "dbg1 dbg2");

    // A pod not on a node yet takes them as well; a static pod's mirror none.
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: pending, namespace: dbg}}
spec:
  nodeSelector: {{no-such-label: "true"}}
  containers: [{{name: app, image: {BUSYBOX}}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: mirror
  namespace: dbg
  annotations: {{kubernetes.io/config.mirror: "x"}}
spec:
  nodeSelector: {{no-such-label: "true"}}
  containers: [{{name: app, image: {BUSYBOX}}}]
"#
    ));
    let (ok, out) = node.kubectl(&["debug", "pending", "-n", "dbg", "--image", BUSYBOX, "-c", "d", "--", "true"]);
    assert!(ok, "{out}");
    assert_eq!(node.get(&["pod", "-n", "dbg", "pending"], "{.spec.ephemeralContainers[*].name}"), "d");
    let (ok, out) = node.kubectl(&["debug", "mirror", "-n", "dbg", "--image", BUSYBOX, "-c", "d", "--", "true"]);
    assert!(!ok && out.contains("[]: Forbidden: static pods do not support ephemeral containers"), "{out}");

    // The oldest and newest kubectl beside the default one.
    // (1.33 with the general profile, which adds SYS_PTRACE.)
    for (minor, name, profile) in [(27, "dbg27", "--profile=legacy"), (33, "dbg33", "--profile=general")] {
        let kubectl = kubectl_version(minor);
        let args =
            ["debug", "app", "-n", "dbg", "--image", BUSYBOX, "--target=app", "-c", name, profile, "--", "sh", "-c"];
        let mut args = args.to_vec();
        args.push("pidof sleep");
        let (ok, out) = node.kubectl_with(&kubectl, &args);
        assert!(ok, "kubectl 1.{minor} debug: {out}");
        assert_eq!(wait_exit(&node, "dbg", "app", name), 0, "kubectl 1.{minor}");
    }
    let caps =
        node.get(&["pod", "-n", "dbg", "app"], "{.spec.ephemeralContainers[?(@.name==\"dbg33\")].securityContext}");
    assert!(caps.contains("SYS_PTRACE"), "{caps}");

    // Deleting the pod stops a running ephemeral container with it.
    let (ok, out) =
        node.kubectl(&["debug", "app", "-n", "dbg", "--image", BUSYBOX, "-c", "long", "--", "sleep", "3600"]);
    assert!(ok, "{out}");
    node.eventually("the long ephemeral container to run", 60, || {
        ephemeral_state(&node, "dbg", "app", "long").contains("running")
    });
    node.ok(&["delete", "pod", "-n", "dbg", "app", "--wait=true", "--timeout=60s"]);
    node.eventually("the pod's containers to be gone", 60, || node.runtime_containers().is_empty());
}

#[test]
fn debugging_a_node_and_a_copy_of_a_pod() {
    let node = Node::start(&[]);
    let hostname =
        String::from_utf8_lossy(&Command::new("hostname").output().expect("hostname").stdout).trim().to_string();
    // The host's namespaces and its / at /host (profile legacy, kubectl's
    // default, and general, netadmin and sysadmin); baseline's pod is
    // isolated from the host.
    let host =
        format!("test -d /host/proc && test -d /host/etc && pidof containerd && test \"$(hostname)\" = {hostname}");
    let host_namespaces = format!("pidof containerd && test \"$(hostname)\" = {hostname}");
    let isolated = format!("! pidof containerd && ! test -d /host/proc && test \"$(hostname)\" != {hostname}");
    let (v27, v33) = (kubectl_version(27), kubectl_version(33));
    let cases = [
        ("kubectl", None, &host),
        ("kubectl", Some("general"), &host),
        ("kubectl", Some("netadmin"), &host_namespaces),
        ("kubectl", Some("baseline"), &isolated),
        (v33.as_str(), Some("sysadmin"), &host),
        (v27.as_str(), None, &host),
    ];
    for (kubectl, profile, script) in cases {
        let target = format!("node/{}", node.name);
        let mut args = vec!["debug", target.as_str(), "--image", BUSYBOX];
        let flag = profile.map(|p| format!("--profile={p}"));
        if let Some(f) = &flag {
            args.push(f);
        }
        args.extend(["--", "sh", "-c", script.as_str()]);
        let (ok, out) = node.kubectl_with(kubectl, &args);
        assert!(ok, "{kubectl} debug node: {out}");
        let pod = out
            .split_whitespace()
            .find(|w| w.starts_with("node-debugger-"))
            .unwrap_or_else(|| panic!("no pod name in {out:?}"))
            .to_string();
        let spec = pod_json(&node, "default", &pod)["spec"].clone();
        assert_eq!(spec["nodeName"], node.name.as_str());
        node.eventually(&format!("{pod} to finish"), 60, || {
            matches!(node.get(&["pod", pod.as_str()], "{.status.phase}").as_str(), "Succeeded" | "Failed")
        });
        let state = node.get(&["pod", pod.as_str()], "{.status.containerStatuses[0].state.terminated.exitCode}");
        assert_eq!(
            state,
            "0",
            "{kubectl} {profile:?}: {pod}: {script}\n{}",
            node.get(&["pod", pod.as_str()], "{.status}")
        );
    }

    // A copy of a pod with a debug container beside the original ones.
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: orig, namespace: default, labels: {{app: orig}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sleep", "3600"]
"#
    ));
    node.eventually("orig to run", 60, || node.get(&["pod", "orig"], "{.status.phase}") == "Running");
    let (ok, out) =
        node.kubectl(&["debug", "orig", "-n", "default", "--image", BUSYBOX, "-c", "dbg", "--", "sh", "-c", "true"]);
    assert!(ok, "{out}");
    wait_exit(&node, "default", "orig", "dbg");
    let (ok, out) = node.kubectl(&[
        "debug",
        "orig",
        "--copy-to=orig-copy",
        "--image",
        BUSYBOX,
        "--share-processes",
        "-c",
        "dbgc",
        "--",
        "sh",
        "-c",
        "pidof sleep && exec sleep 3600",
    ]);
    assert!(ok, "kubectl debug --copy-to: {out}");
    let copy = pod_json(&node, "default", "orig-copy");
    let names: Vec<&str> =
        copy["spec"]["containers"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["app", "dbgc"]);
    assert_eq!(copy["spec"]["shareProcessNamespace"], true);
    assert!(copy["spec"].get("ephemeralContainers").is_none(), "{copy}");
    node.eventually("the copy's containers to be ready", 60, || {
        node.get(&["pod", "orig-copy"], "{.status.containerStatuses[*].ready}") == "true true"
    });
}

/// Output of a child process gathered by a thread, for polling.
fn gather(mut from: impl std::io::Read + Send + 'static) -> std::sync::Arc<std::sync::Mutex<String>> {
    let out = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = out.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut s) = sink.lock() {
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    });
    out
}

#[test]
fn an_interactive_debug_shell_sees_the_target() {
    use std::io::Write;
    use std::process::Stdio;
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: app, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sleep", "3600"]
"#
    ));
    node.eventually("app to run", 60, || node.get(&["pod", "app"], "{.status.phase}") == "Running");
    // kubectl -it wants a terminal: `script` gives it one.
    let cmd = format!("kubectl debug -it app --image={BUSYBOX} --target=app -c shell -- sh");
    let mut child = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("KUBECONFIG", node.kubeconfig())
        .env("HOME", node.dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script");
    let out = gather(child.stdout.take().expect("stdout"));
    let err = gather(child.stderr.take().expect("stderr"));
    let mut stdin = child.stdin.take().expect("stdin");
    let text = || out.lock().map(|s| s.clone()).unwrap_or_default();
    node.eventually("the debug container to run", 60, || {
        ephemeral_state(&node, "default", "app", "shell").contains("running")
    });
    // Typed lines echo back; only the shell's answers carry these.
    stdin.write_all(b"echo marker-$((40+2)); ps\n").expect("type");
    stdin.flush().expect("flush");
    node.eventually("the shell's answer", 30, || {
        let t = text();
        t.contains("marker-42") && t.contains("sleep 3600")
    });
    stdin.write_all(b"exit 0\n").expect("type");
    stdin.flush().expect("flush");
    node.eventually("kubectl to return", 30, || matches!(child.try_wait(), Ok(Some(_))));
    let status = child.wait().expect("wait");
    assert!(status.success(), "{}\n{}", text(), err.lock().map(|s| s.clone()).unwrap_or_default());
    assert_eq!(wait_exit(&node, "default", "app", "shell"), 0);
}
