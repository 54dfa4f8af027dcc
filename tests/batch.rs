//! StatefulSets, DaemonSets, Jobs, CronJobs and finished-Job TTLs against a
//! real `ferrok server`, driven with kubectl; the kubelet is simulated by
//! patching pod status.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn kubectl(s: &common::ApiServer, args: &[&str]) -> (bool, String) {
    let out = Command::new("kubectl")
        .env("KUBECONFIG", s.kubeconfig())
        .env("HOME", s.dir.path())
        .args(args)
        .output()
        .expect("kubectl");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

fn get(s: &common::ApiServer, args: &[&str]) -> String {
    let (ok, out) = kubectl(s, args);
    assert!(ok, "kubectl {args:?}: {out}");
    out
}

fn apply(s: &common::ApiServer, yaml: &str) {
    let mut child = Command::new("kubectl")
        .env("KUBECONFIG", s.kubeconfig())
        .env("HOME", s.dir.path())
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("kubectl");
    child.stdin.take().expect("stdin").write_all(yaml.as_bytes()).expect("write");
    assert!(child.wait().expect("wait").success(), "apply failed: {yaml}");
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pod names matching `selector`, sorted.
fn pods(s: &common::ApiServer, selector: &str) -> Vec<String> {
    let out = get(s, &["get", "pods", "-l", selector, "-o", "jsonpath={.items[*].metadata.name}"]);
    let mut names: Vec<String> = out.split_whitespace().map(str::to_string).collect();
    names.sort();
    names
}

/// What a kubelet would report for a pod.
fn set_phase(s: &common::ApiServer, pod: &str, phase: &str) {
    let ready = if phase == "Running" { "True" } else { "False" };
    let patch = format!(r#"{{"status":{{"phase":"{phase}","conditions":[{{"type":"Ready","status":"{ready}"}}]}}}}"#);
    let (ok, out) = kubectl(s, &["patch", "pod", pod, "--subresource=status", "--type=merge", "-p", &patch]);
    assert!(ok, "{out}");
}

#[test]
fn statefulset_creates_in_order_and_scales_down_from_the_top() {
    let s = common::ApiServer::start();
    apply(
        &s,
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
  volumeClaimTemplates:
  - metadata: {name: www}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
"#,
    );
    eventually("web-0", || pods(&s, "app=web") == ["web-0"]);
    // web-1 waits until web-0 is Running and Ready.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(pods(&s, "app=web"), ["web-0"]);
    let labels = get(&s, &["get", "pod", "web-0", "-o", "jsonpath={.metadata.labels}"]);
    assert!(labels.contains(r#""statefulset.kubernetes.io/pod-name":"web-0""#), "{labels}");
    assert!(labels.contains(r#""apps.kubernetes.io/pod-index":"0""#), "{labels}");
    assert!(labels.contains(r#""controller-revision-hash":"web-"#), "{labels}");
    assert!(get(&s, &["get", "pvc", "www-web-0", "-o", "name"]).contains("www-web-0"));
    let claim = get(&s, &["get", "pod", "web-0", "-o", "jsonpath={.spec.volumes[?(@.name=='www')].persistentVolumeClaim.claimName}"]);
    assert_eq!(claim.trim(), "www-web-0");
    for i in 0..3 {
        let pod = format!("web-{i}");
        eventually(&pod, || pods(&s, "app=web").contains(&pod));
        set_phase(&s, &pod, "Running");
    }
    let (ok, out) = kubectl(&s, &["rollout", "status", "statefulset/web", "--timeout=15s"]);
    assert!(ok, "{out}");
    let status = get(&s, &["get", "sts", "web", "-o", "jsonpath={.status.readyReplicas}/{.status.currentReplicas}/{.status.updatedReplicas}"]);
    assert_eq!(status, "3/3/3");
    let events = get(&s, &["get", "events", "--field-selector", "involvedObject.name=web", "-o", "jsonpath={.items[*].message}"]);
    assert!(events.contains("create Pod web-0 in StatefulSet web successful"), "{events}");
    // Scale down from the top (the order itself is unit-tested).
    get(&s, &["scale", "sts", "web", "--replicas=1"]);
    eventually("web-2 and web-1 to be deleted", || pods(&s, "app=web") == ["web-0"]);
    let events = get(&s, &["get", "events", "--field-selector", "involvedObject.name=web", "-o", "jsonpath={.items[*].message}"]);
    assert!(events.contains("delete Pod web-2 in StatefulSet web successful"), "{events}");
    eventually("status replicas 1", || get(&s, &["get", "sts", "web", "-o", "jsonpath={.status.replicas}"]) == "1");
}

fn node_yaml(name: &str, labels: &str, taints: &str) -> String {
    format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{{labels}}}}}\nspec: {{taints: [{taints}]}}\n")
}

/// The node each pod of `selector` is pinned to, sorted.
fn pinned_nodes(s: &common::ApiServer, selector: &str) -> Vec<String> {
    let out = get(
        s,
        &[
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            "jsonpath={range .items[*]}{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values[0]}{\"\\n\"}{end}",
        ],
    );
    let mut nodes: Vec<String> = out.lines().map(str::to_string).filter(|l| !l.is_empty()).collect();
    nodes.sort();
    nodes
}

#[test]
fn daemonset_runs_one_pod_per_fitting_node() {
    let s = common::ApiServer::start();
    apply(&s, &node_yaml("n1", "disk: ssd", ""));
    apply(&s, &node_yaml("n2", "disk: ssd", "{key: node.kubernetes.io/not-ready, effect: NoExecute}"));
    apply(&s, &node_yaml("n3", "disk: ssd", "{key: dedicated, value: db, effect: NoSchedule}"));
    apply(&s, &node_yaml("n4", "disk: hdd", ""));
    apply(
        &s,
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      nodeSelector: {disk: ssd}
      containers: [{name: c, image: busybox}]
"#,
    );
    // n1 fits; n2's not-ready taint is tolerated by default; n3's taint is
    // not tolerated; n4 has the wrong label.
    eventually("pods on n1 and n2", || pinned_nodes(&s, "app=agent") == ["n1", "n2"]);
    let tolerations = get(&s, &["get", "pods", "-l", "app=agent", "-o", "jsonpath={.items[0].spec.tolerations[*].key}"]);
    assert!(tolerations.contains("node.kubernetes.io/unreachable"), "{tolerations}");
    assert!(get(&s, &["get", "pods", "-l", "app=agent", "-o", "jsonpath={.items[0].metadata.labels}"])
        .contains("controller-revision-hash"));
    eventually("desiredNumberScheduled 2", || {
        get(&s, &["get", "ds", "agent", "-o", "jsonpath={.status.desiredNumberScheduled}/{.status.currentNumberScheduled}"])
            == "2/2"
    });
    // A toleration admits n3 too.
    let (ok, out) = kubectl(
        &s,
        &[
            "patch",
            "ds",
            "agent",
            "--type=merge",
            "-p",
            r#"{"spec":{"template":{"spec":{"tolerations":[{"key":"dedicated","operator":"Equal","value":"db","effect":"NoSchedule"}]}}}}"#,
        ],
    );
    assert!(ok, "{out}");
    // Rolling update: the old pods are replaced (one unavailable at a time);
    // pods that never became ready are replaced at once.
    eventually("updated pods on n1, n2 and n3", || {
        pinned_nodes(&s, "app=agent") == ["n1", "n2", "n3"]
            && get(&s, &["get", "ds", "agent", "-o", "jsonpath={.status.updatedNumberScheduled}"]) == "3"
    });
    for pod in pods(&s, "app=agent") {
        set_phase(&s, &pod, "Running");
    }
    let (ok, out) = kubectl(&s, &["rollout", "status", "ds/agent", "--timeout=15s"]);
    assert!(ok, "{out}");
    // A new fitting node gets a pod; a deleted node loses it.
    apply(&s, &node_yaml("n5", "disk: ssd", ""));
    eventually("a pod on n5", || pinned_nodes(&s, "app=agent").contains(&"n5".to_string()));
    get(&s, &["delete", "node", "n1"]);
    eventually("no pod on n1", || pinned_nodes(&s, "app=agent") == ["n2", "n3", "n5"]);
}
