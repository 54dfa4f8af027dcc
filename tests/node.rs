//! The node role for real: `ferrok server` with containerd, runc and the
//! CNI bridge, in a network namespace of its own, driven with kubectl.
//! Every pod runs the busybox image the test drops into the node's images
//! folder; the pause image is ferrok's own. Needs root and the packages
//! `scripts/deps` installs; nothing here skips itself.

mod common;

use std::collections::HashSet;

use common::node::{Node, BUSYBOX};

fn ns(node: &Node, name: &str) {
    node.ok(&["create", "namespace", name]);
}

fn phase(node: &Node, ns: &str, pod: &str) -> String {
    node.get(&["pod", "-n", ns, pod], "{.status.phase}")
}

#[test]
fn deployment_rolls_out_with_readiness_probes_and_env_from_every_source() {
    let node = Node::start(&[]);
    ns(&node, "app");
    node.apply(&format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: cfg, namespace: app}}
data: {{greeting: hello, colour: blue}}
---
apiVersion: v1
kind: Secret
metadata: {{name: sec, namespace: app}}
stringData: {{password: s3cret, token: t0k}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: app}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
      - name: httpd
        image: {BUSYBOX}
        command: ["sh", "-c", "mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p 8080 -h /www"]
        resources: {{requests: {{cpu: 50m, memory: 16Mi}}, limits: {{cpu: 200m, memory: 64Mi}}}}
        env:
        - {{name: LITERAL, value: "plain"}}
        - {{name: EXPANDED, value: "$(LITERAL)-x"}}
        - {{name: GREETING, valueFrom: {{configMapKeyRef: {{name: cfg, key: greeting}}}}}}
        - {{name: PASSWORD, valueFrom: {{secretKeyRef: {{name: sec, key: password}}}}}}
        - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
        - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
        - {{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
        - {{name: MEM_LIMIT, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}}}
        envFrom:
        - {{configMapRef: {{name: cfg}}, prefix: CM_}}
        - {{secretRef: {{name: sec}}}}
        readinessProbe: {{httpGet: {{path: /healthz, port: 8080}}, periodSeconds: 1}}
"#
    ));
    let (ok, out) = node.kubectl(&["rollout", "status", "deploy/web", "-n", "app", "--timeout=60s"]);
    assert!(ok, "rollout: {out}\n{}", node.log());
    let pods = node.get(&["pods", "-n", "app", "-l", "app=web"], "{.items[*].metadata.name}");
    let pods: Vec<&str> = pods.split_whitespace().collect();
    assert_eq!(pods.len(), 2);
    let ips: HashSet<String> = pods.iter().map(|p| node.get(&["pod", "-n", "app", p], "{.status.podIP}")).collect();
    assert_eq!(ips.len(), 2, "each pod has its own address: {ips:?}");
    for ip in &ips {
        assert!(ip.starts_with("10.42."), "pod IP {ip} is from the node's podCIDR");
    }
    let env = node.exec("app", pods[0], "httpd", "env");
    let has = |line: &str| env.lines().any(|l| l == line);
    for want in [
        "LITERAL=plain".to_string(),
        "EXPANDED=plain-x".to_string(),
        "GREETING=hello".to_string(),
        "PASSWORD=s3cret".to_string(),
        format!("POD_NAME={}", pods[0]),
        format!("NODE={}", node.name),
        "MEM_LIMIT=64".to_string(),
        "CM_colour=blue".to_string(),
        "token=t0k".to_string(),
        "KUBERNETES_SERVICE_HOST=10.43.0.1".to_string(),
    ] {
        assert!(has(&want), "{want} missing from the environment:\n{env}");
    }
    assert!(env.contains("POD_IP=10.42."), "{env}");
    // Resources reached the container's cgroup.
    let limit = node.exec("app", pods[0], "httpd", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes");
    assert_eq!(limit.trim(), (64u64 << 20).to_string());
    // The pods answer on their addresses (readiness needs it too).
    let ip = node.get(&["pod", "-n", "app", pods[1]], "{.status.podIP}");
    let body = node.exec("app", pods[0], "httpd", &format!("wget -q -O- http://{ip}:8080/healthz"));
    assert_eq!(body.trim(), "ok");
    // A rolling update replaces the pods, one ready pod at a time.
    node.ok(&["set", "env", "deploy/web", "-n", "app", "ROLL=2"]);
    let (ok, out) = node.kubectl(&["rollout", "status", "deploy/web", "-n", "app", "--timeout=60s"]);
    assert!(ok, "second rollout: {out}");
    // Old pods may still be terminating; the ones not being deleted are all new.
    let listing = node.get(
        &["pods", "-n", "app", "-l", "app=web"],
        "{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    );
    let live: Vec<&str> = listing.lines().filter(|l| l.split_whitespace().count() == 1).collect();
    assert_eq!(live.len(), 2, "{listing}");
    assert!(live.iter().all(|p| !pods.contains(&p.trim())), "old pods remain: {listing}");
}

#[test]
fn config_map_volumes_follow_changes_and_missing_sources_say_why() {
    let node = Node::start(&[]);
    ns(&node, "vol");
    node.apply(&format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: settings, namespace: vol}}
data: {{mode: one}}
---
apiVersion: v1
kind: Pod
metadata: {{name: reader, namespace: vol}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sleep", "100000"]
    volumeMounts:
    - {{name: s, mountPath: /etc/settings}}
    - {{name: scratch, mountPath: /scratch}}
  volumes:
  - {{name: s, configMap: {{name: settings}}}}
  - {{name: scratch, emptyDir: {{}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: waiting, namespace: vol}}
spec:
  containers:
  - {{name: c, image: {BUSYBOX}, command: ["sleep", "100000"], volumeMounts: [{{name: s, mountPath: /s}}]}}
  volumes:
  - {{name: s, configMap: {{name: not-there}}}}
"#
    ));
    node.eventually("reader running", 60, || phase(&node, "vol", "reader") == "Running");
    assert_eq!(node.exec("vol", "reader", "c", "cat /etc/settings/mode").trim(), "one");
    node.exec("vol", "reader", "c", "echo data > /scratch/f");
    node.ok(&["patch", "configmap", "settings", "-n", "vol", "--type=merge", "-p", r#"{"data":{"mode":"two"}}"#]);
    node.eventually("the new value in the volume", 30, || {
        node.exec("vol", "reader", "c", "cat /etc/settings/mode").trim() == "two"
    });
    // The pod missing its ConfigMap waits with upstream's event.
    node.eventually("FailedMount event", 30, || {
        let ev = node
            .get(&["events", "-n", "vol", "--field-selector", "involvedObject.name=waiting"], "{.items[*].message}");
        ev.contains("MountVolume.SetUp failed for volume \"s\" : configmap \"not-there\" not found")
    });
    assert_eq!(phase(&node, "vol", "waiting"), "Pending");
    let reason = node.get(&["pod", "-n", "vol", "waiting"], "{.status.containerStatuses[0].state.waiting.reason}");
    assert_eq!(reason, "ContainerCreating");
    node.ok(&["create", "configmap", "not-there", "-n", "vol", "--from-literal=k=v"]);
    node.eventually("the waiting pod to start", 60, || phase(&node, "vol", "waiting") == "Running");
}

#[test]
fn jobs_complete_crash_loops_back_off_and_liveness_restarts() {
    let node = Node::start(&[]);
    ns(&node, "life");
    node.apply(&format!(
        r#"
apiVersion: batch/v1
kind: Job
metadata: {{name: once, namespace: life}}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{{name: c, image: {BUSYBOX}, command: ["sh", "-c", "echo finished > /dev/termination-log; echo done"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: crasher, namespace: life}}
spec:
  containers: [{{name: c, image: {BUSYBOX}, command: ["sh", "-c", "echo bye; exit 3"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: sick, namespace: life}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh", "-c", "touch /tmp/healthy; sleep 100000"]
    livenessProbe: {{exec: {{command: ["test", "-e", "/tmp/healthy"]}}, periodSeconds: 1, failureThreshold: 2}}
"#
    ));
    let (ok, out) = node.kubectl(&["wait", "-n", "life", "--for=condition=complete", "job/once", "--timeout=60s"]);
    assert!(ok, "job: {out}");
    let job_pod = node.get(&["pods", "-n", "life", "-l", "job-name=once"], "{.items[0].metadata.name}");
    assert_eq!(phase(&node, "life", &job_pod), "Succeeded");
    let term = node.get(&["pod", "-n", "life", &job_pod], "{.status.containerStatuses[0].state.terminated.reason}/{.status.containerStatuses[0].state.terminated.message}");
    assert_eq!(term.trim(), "Completed/finished");

    node.eventually("crash loop back-off", 60, || {
        node.get(&["pod", "-n", "life", "crasher"], "{.status.containerStatuses[0].state.waiting.reason}")
            == "CrashLoopBackOff"
    });
    let restarts: i32 =
        node.get(&["pod", "-n", "life", "crasher"], "{.status.containerStatuses[0].restartCount}").parse().unwrap_or(0);
    assert!(restarts >= 1, "restarted before backing off: {restarts}");
    let last =
        node.get(&["pod", "-n", "life", "crasher"], "{.status.containerStatuses[0].lastState.terminated.exitCode}");
    assert_eq!(last, "3");
    let msg = node.get(&["pod", "-n", "life", "crasher"], "{.status.containerStatuses[0].state.waiting.message}");
    assert!(msg.starts_with("back-off ") && msg.contains("restarting failed container=c pod=crasher_life("), "{msg}");

    node.eventually("sick running", 60, || phase(&node, "life", "sick") == "Running");
    node.exec("life", "sick", "c", "rm /tmp/healthy");
    node.eventually("a liveness restart", 60, || {
        node.get(&["pod", "-n", "life", "sick"], "{.status.containerStatuses[0].restartCount}") == "1"
    });
    let events = node.get(
        &["events", "-n", "life", "--field-selector", "involvedObject.name=sick"],
        "{range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    );
    assert!(events.contains("Unhealthy: Liveness probe failed"), "{events}");
    assert!(events.contains("Killing: Container c failed liveness probe, will be restarted"), "{events}");
}

#[test]
fn sidecars_run_beside_the_app_and_init_containers_go_first() {
    let node = Node::start(&[]);
    ns(&node, "side");
    node.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: p, namespace: side}}
spec:
  initContainers:
  - {{name: setup, image: {BUSYBOX}, command: ["sh", "-c", "echo prepared > /work/ready"], volumeMounts: [{{name: w, mountPath: /work}}]}}
  - name: logger
    image: {BUSYBOX}
    restartPolicy: Always
    command: ["sh", "-c", "while true; do date >> /work/log; sleep 1; done"]
    volumeMounts: [{{name: w, mountPath: /work}}]
  containers:
  - {{name: app, image: {BUSYBOX}, command: ["sh", "-c", "cat /work/ready; sleep 100000"], volumeMounts: [{{name: w, mountPath: /work}}]}}
  volumes: [{{name: w, emptyDir: {{}}}}]
"#
    ));
    node.eventually("the pod ready", 60, || {
        node.get(&["pod", "-n", "side", "p"], "{.status.conditions[?(@.type==\"Ready\")].status}") == "True"
    });
    let ready = node.get(
        &["pod", "-n", "side", "p"],
        "{.status.initContainerStatuses[1].ready}/{.status.initContainerStatuses[1].started}",
    );
    assert_eq!(ready, "true/true");
    let setup = node.get(
        &["pod", "-n", "side", "p"],
        "{.status.initContainerStatuses[0].state.terminated.reason}/{.status.initContainerStatuses[0].ready}",
    );
    // An init container done with exit 0 is ready, as upstream reports it.
    assert_eq!(setup, "Completed/true");
    assert_eq!(node.exec("side", "p", "app", "cat /work/ready").trim(), "prepared");
    node.eventually("the sidecar writing", 20, || {
        node.exec("side", "p", "app", "wc -l < /work/log").trim().parse::<u32>().unwrap_or(0) >= 2
    });
    let (_, out) = node.kubectl(&["get", "pod", "-n", "side", "p", "--no-headers"]);
    assert!(out.contains("2/2"), "kubectl counts the sidecar: {out}");
}

#[test]
fn static_pods_run_from_manifests_with_mirror_pods() {
    let node = Node::start(&[]);
    let manifest = node.dir.path().join("agent").join("pod-manifests").join("web.yaml");
    std::fs::write(
        &manifest,
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-web\n  namespace: kube-system\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sleep\", \"100000\"]\n"),
    )
    .expect("write manifest");
    let mirror = format!("static-web-{}", node.name);
    node.eventually("the mirror pod running", 60, || phase(&node, "kube-system", &mirror) == "Running");
    let ann =
        node.get(&["pod", "-n", "kube-system", &mirror], "{.metadata.annotations.kubernetes\\.io/config\\.mirror}");
    assert_eq!(ann.len(), 32, "config.mirror hash: {ann}");
    let owner = node.get(
        &["pod", "-n", "kube-system", &mirror],
        "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
    );
    assert_eq!(owner, format!("Node/{}", node.name));
    let id = node.container_id("kube-system", &mirror, "c");
    // Deleting the mirror does not stop the static pod; the mirror comes back.
    node.ok(&["delete", "pod", "-n", "kube-system", &mirror, "--wait=false"]);
    node.eventually("the mirror recreated", 60, || {
        let uid = node.get(&["pod", "-n", "kube-system", &mirror], "{.metadata.deletionTimestamp}");
        phase(&node, "kube-system", &mirror) == "Running" && uid.is_empty()
    });
    assert_eq!(node.container_id("kube-system", &mirror, "c"), id, "the static pod kept running");
    // Removing the manifest removes the pod and its mirror.
    std::fs::remove_file(&manifest).expect("remove manifest");
    node.eventually("the mirror gone", 60, || !node.kubectl(&["get", "pod", "-n", "kube-system", &mirror]).0);
    node.eventually("the container gone", 30, || !node.runtime_containers().contains(&id));
}

#[test]
fn namespace_delete_leaves_nothing_and_kill_9_keeps_every_container() {
    let mut node = Node::start(&[]);
    ns(&node, "keep");
    ns(&node, "gone");
    for (ns, n) in [("keep", 3), ("gone", 2)] {
        node.apply(&format!(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: d, namespace: {ns}}}
spec:
  replicas: {n}
  selector: {{matchLabels: {{app: d}}}}
  template:
    metadata: {{labels: {{app: d}}}}
    spec:
      terminationGracePeriodSeconds: 2
      containers: [{{name: c, image: {BUSYBOX}, command: ["sleep", "100000"], volumeMounts: [{{name: t, mountPath: /t}}]}}]
      volumes: [{{name: t, emptyDir: {{medium: Memory}}}}]
"#
        ));
        let (ok, out) = node.kubectl(&["rollout", "status", "deploy/d", "-n", ns, "--timeout=60s"]);
        assert!(ok, "{out}");
    }
    let ids = |node: &Node, ns: &str| -> Vec<String> {
        let out = node.get(&["pods", "-n", ns], "{.items[*].status.containerStatuses[0].containerID}");
        let mut v: Vec<String> =
            out.split_whitespace().map(|s| s.trim_start_matches("containerd://").to_string()).collect();
        v.sort();
        v
    };
    let keep_before = ids(&node, "keep");
    let gone_ids = ids(&node, "gone");
    let gone_uids = node.get(&["pods", "-n", "gone"], "{.items[*].metadata.uid}");
    let pids_before = node.container_pids();

    // kill -9 of ferrok: every container keeps running, nothing restarts.
    node.restart(true);
    node.eventually("statuses after the restart", 30, || {
        ids(&node, "keep") == keep_before
            && node
                .get(&["pods", "-n", "keep"], "{.items[*].status.containerStatuses[0].restartCount}")
                .split_whitespace()
                .all(|r| r == "0")
    });
    let pids_after = node.container_pids();
    for p in &pids_before {
        assert!(pids_after.contains(p), "container process {p} did not survive the restart");
    }
    node.ok(&["wait", "-n", "keep", "--for=condition=Ready", "pods", "--all", "--timeout=30s"]);

    // A namespace delete removes its pods' containers, sandboxes, mounts, cgroups and folders.
    node.ok(&["delete", "namespace", "gone", "--timeout=90s"]);
    let runtime = node.runtime_containers();
    for id in &gone_ids {
        assert!(!runtime.contains(id), "container {id} of the deleted namespace remains");
    }
    for uid in gone_uids.split_whitespace() {
        let pod_dir = node.dir.path().join("agent").join("pods").join(uid);
        assert!(!pod_dir.exists(), "{} remains", pod_dir.display());
        assert!(common::node::mounts_under(&pod_dir).is_empty(), "mounts of {uid} remain");
        for q in ["", "besteffort/", "burstable/"] {
            let cg = std::path::Path::new("/sys/fs/cgroup/memory")
                .join(node.cgroup_root.trim_start_matches('/'))
                .join(format!("{q}pod{uid}"));
            assert!(!cg.exists(), "{} remains", cg.display());
        }
        let logs = std::fs::read_dir(node.dir.path().join("agent").join("logs").join("pods")).expect("logs dir");
        for l in logs.filter_map(Result::ok) {
            assert!(!l.file_name().to_string_lossy().contains(uid), "logs of {uid} remain");
        }
    }
    assert_eq!(ids(&node, "keep"), keep_before, "the other namespace is untouched");
}

#[test]
fn a_pod_deleted_while_ferrok_is_down_is_cleaned_up_when_it_returns() {
    let mut node = Node::start(&[]);
    node.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: doomed}}\nspec:\n  containers: [{{name: c, image: {BUSYBOX}, command: [\"sleep\", \"100000\"]}}]\n"
    ));
    node.eventually("doomed running", 60, || phase(&node, "default", "doomed") == "Running");
    let id = node.container_id("default", "doomed", "c");
    let pids = node.container_pids();
    assert!(!pids.is_empty());
    node.stop(false);
    // The API object goes while no kubelet watches: a force delete through the store-backed API is
    // only possible with the server up, so restart without the node role for a moment.
    let dir = node.dir.path().to_path_buf();
    let port = common::free_port();
    let mut api_only = std::process::Command::new(common::ferrok_bin())
        .args(["server", "--disable-agent", "--data-dir"])
        .arg(&dir)
        .args(["--https-listen-port", &port.to_string(), "--bind-address", "127.0.0.1", "--write-kubeconfig"])
        .arg(dir.join("api-only.yaml"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the API alone");
    let kubectl = |args: &[&str]| {
        std::process::Command::new("kubectl")
            .env("KUBECONFIG", dir.join("api-only.yaml"))
            .args(args)
            .output()
            .expect("kubectl")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !kubectl(&["delete", "pod", "doomed", "--grace-period=0", "--force"]).status.success() {
        assert!(std::time::Instant::now() < deadline, "could not delete the pod through the API alone");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(api_only.id() as i32, libc::SIGTERM) };
    let _ = api_only.wait();
    let alive = |pid: &u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    assert!(pids.iter().all(alive), "the container ran on while ferrok was down");
    node.restart(false);
    node.eventually("the orphan removed", 30, || !node.runtime_containers().contains(&id));
    node.eventually("its processes gone", 10, || !pids.iter().any(alive));
}

#[test]
fn images_pull_from_a_local_registry_with_and_without_a_pull_secret() {
    use common::images::{busybox_oci_tar, Registry};
    let mut node = Node::new(&[]);
    let open = Registry::start_at(&node.dir.path().join("reg-open"), None, &node.ip, Some(&node.netns));
    let locked = Registry::start_at(
        &node.dir.path().join("reg-locked"),
        Some(("puller", "s3cret")),
        &node.ip,
        Some(&node.netns),
    );
    let tar = node.dir.path().join("push.tar");
    busybox_oci_tar(&tar, "docker.io/library/busybox:push");
    open.push(&tar, "library/busybox:pushed");
    locked.push(&tar, "team/private:1");
    // Both registries speak plain HTTP, which containerd uses only when told.
    let etc = node.dir.path().join("agent").join("etc");
    std::fs::create_dir_all(&etc).expect("etc");
    std::fs::write(
        etc.join("registries.yaml"),
        format!(
            "mirrors:\n  \"{o}\":\n    endpoint: [\"http://{o}\"]\n  \"{l}\":\n    endpoint: [\"http://{l}\"]\n",
            o = open.host(),
            l = locked.host()
        ),
    )
    .expect("registries.yaml");
    node.launch();
    ns(&node, "pull");
    let pod = |name: &str, image: &str, secret: Option<&str>| {
        let secrets = secret.map(|s| format!("  imagePullSecrets: [{{name: {s}}}]\n")).unwrap_or_default();
        node.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: pull}}\nspec:\n{secrets}  containers: [{{name: c, image: \"{image}\", command: [\"sleep\", \"100000\"]}}]\n"
        ));
    };
    let waiting =
        |name: &str| node.get(&["pod", "-n", "pull", name], "{.status.containerStatuses[0].state.waiting.reason}");
    let events = |name: &str| {
        node.get(
            &["events", "-n", "pull", "--field-selector", &format!("involvedObject.name={name}")],
            "{range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
        )
    };

    pod("anonymous", &format!("{}/library/busybox:pushed", open.host()), None);
    node.eventually("the pulled image running", 60, || phase(&node, "pull", "anonymous") == "Running");
    let ev = events("anonymous");
    assert!(ev.contains(&format!("Pulling: Pulling image \"{}/library/busybox:pushed\"", open.host())), "{ev}");
    assert!(ev.contains("Pulled: Successfully pulled image"), "{ev}");

    let private = format!("{}/team/private:1", locked.host());
    pod("no-secret", &private, None);
    node.eventually("ErrImagePull then ImagePullBackOff", 60, || waiting("no-secret") == "ImagePullBackOff");
    let ev = events("no-secret");
    assert!(ev.contains("Failed: Failed to pull image") && ev.to_lowercase().contains("unauthorized"), "{ev}");
    assert!(ev.contains("Failed: Error: ErrImagePull"), "{ev}");
    assert!(ev.contains("BackOff: Back-off pulling image"), "{ev}");

    node.ok(&[
        "create",
        "secret",
        "docker-registry",
        "regcred",
        "-n",
        "pull",
        &format!("--docker-server={}", locked.host()),
        "--docker-username=puller",
        "--docker-password=s3cret",
    ]);
    pod("with-secret", &private, Some("regcred"));
    node.eventually("the private image running", 60, || phase(&node, "pull", "with-secret") == "Running");

    pod("missing", &format!("{}/library/nothing:1", open.host()), None);
    node.eventually("a failed pull", 60, || matches!(waiting("missing").as_str(), "ErrImagePull" | "ImagePullBackOff"));
    let msg = node.get(&["pod", "-n", "pull", "missing"], "{.status.containerStatuses[0].state.waiting.message}");
    let ev = events("missing");
    assert!(ev.contains("not found") || msg.contains("not found"), "the registry's reason is shown: {msg}\n{ev}");
}

#[test]
fn the_node_registers_as_upstream_and_keeps_its_lease() {
    let node = Node::start(&["--node-label", "site=lab", "--node-taint", "edge=true:PreferNoSchedule"]);
    let get = |path: &str| node.get(&["node", &node.name], path);
    assert_eq!(get("{.metadata.labels.kubernetes\\.io/hostname}"), node.name);
    assert_eq!(get("{.metadata.labels.kubernetes\\.io/os}"), "linux");
    assert_eq!(get("{.metadata.labels.node-role\\.kubernetes\\.io/control-plane}"), "true");
    assert_eq!(get("{.metadata.labels.site}"), "lab");
    assert!(get("{.spec.taints[*].key}").contains("edge"));
    assert!(get("{.spec.podCIDR}").starts_with("10.42."));
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    assert_eq!(get("{.status.capacity.cpu}"), cpus.to_string());
    assert_eq!(get("{.status.capacity.pods}"), "110");
    assert!(get("{.status.capacity.memory}").ends_with('i'));
    assert!(!get("{.status.allocatable.ephemeral-storage}").is_empty());
    assert!(get("{.status.nodeInfo.containerRuntimeVersion}").starts_with("containerd://"));
    assert!(get("{.status.nodeInfo.kubeletVersion}").starts_with("v1.33."));
    assert_eq!(get("{.status.addresses[?(@.type==\"InternalIP\")].address}"), node.ip);
    for (kind, reason) in [
        ("Ready", "KubeletReady"),
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    ] {
        assert_eq!(get(&format!("{{.status.conditions[?(@.type==\"{kind}\")].reason}}")), reason);
    }
    assert!(get("{.status.images[*].names}").contains("docker.io/library/busybox:1"));
    let renew = || node.get(&["lease", "-n", "kube-node-lease", &node.name], "{.spec.renewTime}");
    let first = renew();
    assert!(!first.is_empty(), "the node has a Lease");
    node.eventually("the lease renewed", 20, || renew() != first);
    // An extended resource patched into capacity (as a device plugin or an
    // operator advertises one) becomes allocatable, and goes when removed.
    let fake = "{.status.allocatable.example\\.com/fakecpu}";
    let add = r#"[{"op": "add", "path": "/status/capacity/example.com~1fakecpu", "value": "1000"}]"#;
    node.ok(&["patch", "node", &node.name, "--subresource=status", "--type=json", "-p", add]);
    // (1000 reads back in canonical form, as upstream's quantities do.)
    node.eventually("the extended resource allocatable", 20, || get(fake) == "1k");
    // A pod asking for it is scheduled and admitted by the node, which
    // counts what the Node advertises, not only what it measured itself.
    ns(&node, "ext");
    node.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: wants-fake, namespace: ext}}\nspec:\n  containers: [{{name: c, image: {BUSYBOX}, command: [\"sleep\", \"100000\"], resources: {{requests: {{example.com/fakecpu: \"2\"}}, limits: {{example.com/fakecpu: \"2\"}}}}}}]\n"
    ));
    node.eventually("the pod asking for the extended resource running", 60, || {
        phase(&node, "ext", "wants-fake") == "Running"
    });
    node.ok(&["delete", "pod", "-n", "ext", "wants-fake", "--wait=false"]);
    let remove = r#"[{"op": "remove", "path": "/status/capacity/example.com~1fakecpu"}]"#;
    node.ok(&["patch", "node", &node.name, "--subresource=status", "--type=json", "-p", remove]);
    node.eventually("the extended resource gone from allocatable", 20, || get(fake).is_empty());
    assert!(get("{.status.capacity.cpu}") == cpus.to_string(), "the node's own resources stay");
    // Runtime classes: runc always; crun when installed (scripts/deps installs it) and
    // usable: crun refuses hybrid cgroups whose v2 tree holds controllers.
    assert_eq!(node.get(&["runtimeclass", "runc"], "{.handler}"), "runc");
    ns(&node, "rc");
    match ferrok::agent::containerd::crun_unusable_because() {
        None => {
            assert_eq!(node.get(&["runtimeclass", "crun"], "{.handler}"), "crun");
            node.apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: on-crun, namespace: rc}}\nspec:\n  runtimeClassName: crun\n  containers: [{{name: c, image: {BUSYBOX}, command: [\"sleep\", \"100000\"]}}]\n"
            ));
            node.eventually("the crun pod running", 60, || phase(&node, "rc", "on-crun") == "Running");
            let info = node.ctr(&["containers", "info", &node.container_id("rc", "on-crun", "c")]);
            assert!(info.contains("/usr/bin/crun"), "runs with crun: {info}");
        }
        Some(why) => {
            let (found, _) = node.kubectl(&["get", "runtimeclass", "crun"]);
            assert!(!found, "no crun RuntimeClass where crun cannot run ({why})");
            assert!(node.log().contains("crun is installed but cannot run containers here"), "the server says why");
        }
    }
    // A pod naming a RuntimeClass that does not exist says so.
    node.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: no-class, namespace: rc}}\nspec:\n  runtimeClassName: gvisor\n  containers: [{{name: c, image: {BUSYBOX}}}]\n"
    ));
    node.eventually("FailedCreatePodSandBox", 30, || {
        node.get(&["events", "-n", "rc", "--field-selector", "involvedObject.name=no-class"], "{.items[*].message}")
            .contains("RuntimeClass \"gvisor\" not found")
    });
}

#[test]
fn bad_node_flags_are_one_line_errors() {
    let out = std::process::Command::new(common::ferrok_bin())
        .args(["server", "--kubelet-arg", "max-pods=lots", "--data-dir", "/nonexistent/x"])
        .output()
        .expect("run ferrok");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kubelet-arg \"max-pods=lots\": expected a positive number"), "{err}");
    let out = std::process::Command::new(common::ferrok_bin())
        .args(["server", "--node-taint", "x=y:Sometimes"])
        .output()
        .expect("run ferrok");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--node-taint"), "{err}");
}

#[test]
fn claims_bind_to_host_path_volumes_and_security_contexts_and_hooks_apply() {
    let node = Node::start(&[]);
    ns(&node, "sec");
    let host_dir = node.dir.path().join("pv-data");
    std::fs::create_dir_all(&host_dir).expect("pv dir");
    node.apply(&format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata: {{name: local-pv}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  hostPath: {{path: {dir}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: sec}}
spec:
  storageClassName: ""  # the static volume above, not the default local-path class
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 100Mi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: locked-down, namespace: sec}}
spec:
  terminationGracePeriodSeconds: 3
  securityContext: {{runAsUser: 65534, runAsGroup: 65534, fsGroup: 2000}}
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh", "-c", "sleep 100000"]
    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}
    lifecycle:
      postStart: {{exec: {{command: ["sh", "-c", "echo started > /scratch/post-start"]}}}}
      preStop: {{exec: {{command: ["sh", "-c", "echo stopping > /data/pre-stop"]}}}}
    volumeMounts:
    - {{name: data, mountPath: /data}}
    - {{name: scratch, mountPath: /scratch}}
  volumes:
  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}
  - {{name: scratch, emptyDir: {{}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: wants-non-root, namespace: sec}}
spec:
  securityContext: {{runAsNonRoot: true}}
  containers: [{{name: c, image: {BUSYBOX}, command: ["sleep", "100000"]}}]
"#,
        dir = host_dir.display()
    ));
    node.eventually("the claim bound", 30, || node.get(&["pvc", "-n", "sec", "data"], "{.status.phase}") == "Bound");
    assert_eq!(node.get(&["pvc", "-n", "sec", "data"], "{.spec.volumeName}"), "local-pv");
    assert_eq!(node.get(&["pv", "local-pv"], "{.status.phase}/{.spec.claimRef.name}"), "Bound/data");
    // The claim's volume is world-writable for the unprivileged user here.
    std::fs::set_permissions(&host_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
    node.eventually("locked-down running", 60, || phase(&node, "sec", "locked-down") == "Running");
    let id = node.exec("sec", "locked-down", "c", "id");
    assert!(id.contains("uid=65534") && id.contains("gid=65534") && id.contains("2000"), "{id}");
    let ro = node.exec("sec", "locked-down", "c", "touch /rootfs-file 2>&1; echo $?");
    assert!(ro.contains("Read-only file system"), "{ro}");
    let caps = node.exec("sec", "locked-down", "c", "grep CapEff /proc/self/status");
    assert!(caps.contains("0000000000000000"), "all capabilities dropped: {caps}");
    let nnp = node.exec("sec", "locked-down", "c", "grep NoNewPrivs /proc/self/status");
    assert!(nnp.contains('1'), "{nnp}");
    assert_eq!(node.exec("sec", "locked-down", "c", "cat /scratch/post-start").trim(), "started");
    node.exec("sec", "locked-down", "c", "echo hello > /data/hello");
    assert_eq!(std::fs::read_to_string(host_dir.join("hello")).expect("written through the PV").trim(), "hello");

    // runAsNonRoot against an image that runs as root: upstream's error.
    node.eventually("CreateContainerConfigError", 30, || {
        node.get(&["pod", "-n", "sec", "wants-non-root"], "{.status.containerStatuses[0].state.waiting.reason}")
            == "CreateContainerConfigError"
    });
    let msg = node.get(&["pod", "-n", "sec", "wants-non-root"], "{.status.containerStatuses[0].state.waiting.message}");
    assert!(msg.contains("container has runAsNonRoot and image will run as root"), "{msg}");

    // Deletion runs preStop, then stops the container within the grace period
    // (sleep as PID 1 ignores SIGTERM, so the grace period runs out).
    let started = std::time::Instant::now();
    node.ok(&["delete", "pod", "-n", "sec", "locked-down"]);
    let took = started.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(2) && took < std::time::Duration::from_secs(15),
        "deletion took {took:?}"
    );
    assert_eq!(std::fs::read_to_string(host_dir.join("pre-stop")).expect("preStop ran").trim(), "stopping");
    node.ok(&["delete", "pod", "-n", "sec", "wants-non-root", "--grace-period=1"]);
    node.ok(&["delete", "pvc", "-n", "sec", "data"]);
    node.eventually("the volume released", 30, || node.get(&["pv", "local-pv"], "{.status.phase}") == "Released");
}

/// A pod bound to the node directly (no scheduler) whose host port another
/// pod holds is rejected by the node, as upstream's kubelet does, and never
/// starts; once the port is free a new one runs.
#[test]
fn the_node_rejects_a_pod_whose_host_port_is_taken() {
    let node = Node::start(&[]);
    let pod = |name: &str| {
        format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  containers:
  - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"], ports: [{{containerPort: 80, hostPort: 21017}}]}}
"#,
            node = node.name
        )
    };
    node.apply(&pod("holder"));
    node.eventually("holder runs", 60, || node.get(&["pod", "holder"], "{.status.phase}") == "Running");
    node.apply(&pod("late"));
    node.eventually("late is rejected", 30, || node.get(&["pod", "late"], "{.status.phase}") == "Failed");
    let why = node.get(&["pod", "late"], "{.status.reason}|{.status.message}");
    assert_eq!(
        why,
        "NodePorts|Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
    );
    assert_eq!(node.get(&["pod", "late"], "{.status.containerStatuses[0].state.running}"), "");
    node.ok(&["delete", "pod", "holder", "late", "--grace-period=1"]);
    node.apply(&pod("after"));
    node.eventually("after runs", 60, || node.get(&["pod", "after"], "{.status.phase}") == "Running");
}
