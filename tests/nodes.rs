//! Node lifecycle, node IPAM, endpoints, disruption budgets and quotas,
//! against a real `ferrok server` driven with kubectl. There is no kubelet:
//! the tests play it by renewing the node's Lease and patching node and pod
//! status.

mod common;

use common::{apply, eventually, kubectl};

use std::process::Command;
use std::sync::Once;
use std::time::{Duration, Instant};

/// The heartbeat grace period the server runs with here (40 s upstream).
const GRACE: &str = "5s";

fn start() -> common::ApiServer {
    static ENV: Once = Once::new();
    // Every test passes here before starting anything, so no other thread
    // reads the environment while it is written.
    ENV.call_once(|| unsafe { std::env::set_var("FERROK_NODE_MONITOR_GRACE_PERIOD", GRACE) });
    common::ApiServer::start()
}

fn ok(s: &common::ApiServer, args: &[&str]) -> String {
    let (ok, out) = kubectl(s, args);
    assert!(ok, "kubectl {args:?} failed: {out}");
    out
}

fn get(s: &common::ApiServer, args: &[&str], path: &str) -> String {
    let mut a: Vec<&str> = vec!["get"];
    a.extend(args);
    let jp = format!("jsonpath={path}");
    a.extend(["-o", &jp]);
    kubectl(s, &a).1
}

fn now() -> String {
    let out = Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%S.%6NZ"]).output().expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn now_seconds() -> String {
    let out = Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]).output().expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The kubelet's heartbeat: the Lease renewed and the Ready condition posted.
fn heartbeat(s: &common::ApiServer, node: &str, ready: &str) {
    apply(
        s,
        &format!(
            r#"{{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{{"name":"{node}","namespace":"kube-node-lease"}},"spec":{{"holderIdentity":"{node}","leaseDurationSeconds":40,"renewTime":"{}"}}}}"#,
            now()
        ),
    );
    let t = now_seconds();
    ok(
        s,
        &[
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                r#"{{"status":{{"conditions":[{{"type":"Ready","status":"{ready}","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":"{t}","lastTransitionTime":"{t}"}}]}}}}"#
            ),
        ],
    );
}

fn node(s: &common::ApiServer, name: &str) {
    apply(s, &format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{name}"}}}}"#));
}

/// A pod bound to `node`, with a named container port and tolerations.
fn pod(s: &common::ApiServer, name: &str, labels: &str, node: &str, port: u16, tolerations: &str) {
    apply(
        s,
        &format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","labels":{labels}}},"spec":{{"nodeName":"{node}","tolerations":{tolerations},"containers":[{{"name":"c","image":"busybox:1.36","ports":[{{"name":"http","containerPort":{port}}}],"resources":{{"requests":{{"cpu":"250m","memory":"64Mi"}}}}}}]}}}}"#
        ),
    );
}

/// The kubelet's pod status: running with an IP, Ready or not.
fn pod_status(s: &common::ApiServer, name: &str, ip: &str, ready: bool) {
    let ready = if ready { "True" } else { "False" };
    ok(
        s,
        &[
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"conditions":[{{"type":"Ready","status":"{ready}"}}]}}}}"#
            ),
        ],
    );
}

fn taints(s: &common::ApiServer, node: &str) -> String {
    get(s, &["node", node], "{range .spec.taints[*]}{.key}:{.effect} {end}")
}

/// Evicted: gone, or deleting (a pod bound to a node waits for its kubelet).
fn evicted(s: &common::ApiServer, pod: &str) -> bool {
    let (found, out) = kubectl(s, &["get", "pod", pod, "-o", "jsonpath={.metadata.deletionTimestamp}"]);
    !found && out.contains("NotFound") || found && !out.trim().is_empty()
}

#[test]
fn unreachable_nodes_are_tainted_and_their_pods_evicted() {
    let s = start();
    node(&s, "edge-1");
    heartbeat(&s, "edge-1", "True");
    let unreachable =
        r#"[{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":4}]"#;
    let forever = r#"[{"operator":"Exists","effect":"NoExecute"}]"#;
    let not_at_all =
        r#"[{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":0}]"#;
    pod(&s, "plain", r#"{"app":"a"}"#, "edge-1", 80, not_at_all);
    // A pod that says nothing gets DefaultTolerationSeconds' 300 s.
    pod(&s, "defaulted", r#"{"app":"a"}"#, "edge-1", 80, "[]");
    let defaults = get(
        &s,
        &["pod", "defaulted"],
        "{.spec.tolerations[?(@.key==\"node.kubernetes.io/unreachable\")].tolerationSeconds}",
    );
    assert_eq!(defaults, "300");
    pod(&s, "brief", r#"{"app":"a"}"#, "edge-1", 80, unreachable);
    pod(&s, "patient", r#"{"app":"a"}"#, "edge-1", 80, forever);
    pod_status(&s, "patient", "10.42.0.9", true);
    // While the kubelet keeps posting, nothing happens.
    let mut silent = Instant::now();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1000));
        // Taken before the post: under load kubectl's round trip can
        // last a second, which the grace period check must not count.
        silent = Instant::now();
        heartbeat(&s, "edge-1", "True");
    }
    assert_eq!(taints(&s, "edge-1"), "", "a healthy node got taints");
    assert!(!evicted(&s, "plain"));

    // The kubelet goes silent: after the grace period the node is Unknown and unreachable.
    eventually("the node to be marked Unknown", || {
        get(&s, &["node", "edge-1"], "{.status.conditions[?(@.type==\"Ready\")].status}") == "Unknown"
    });
    assert!(silent.elapsed() >= Duration::from_millis(4500), "marked Unknown before the grace period");
    let message = get(&s, &["node", "edge-1"], "{.status.conditions[?(@.type==\"Ready\")].message}");
    assert_eq!(message, "Kubelet stopped posting node status.");
    eventually("the unreachable taints", || {
        let t = taints(&s, "edge-1");
        t.contains("node.kubernetes.io/unreachable:NoExecute")
            && t.contains("node.kubernetes.io/unreachable:NoSchedule")
    });
    eventually("the pod without tolerations to be evicted", || evicted(&s, "plain"));
    let reason = get(&s, &["pod", "plain"], "{.status.conditions[?(@.type==\"DisruptionTarget\")].reason}");
    assert!(reason.is_empty() || reason == "DeletionByTaintManager" || reason.contains("NotFound"), "{reason}");
    eventually("pods on the node to be marked not ready", || {
        get(&s, &["pod", "patient"], "{.status.conditions[?(@.type==\"Ready\")].status}") == "False"
    });
    assert!(!evicted(&s, "brief"), "a pod tolerating the taint for 4s was evicted at once");
    eventually("the pod tolerating 4s to be evicted", || evicted(&s, "brief"));
    assert!(silent.elapsed() >= Duration::from_secs(6), "tolerationSeconds not honoured");
    assert!(!evicted(&s, "patient"), "a pod tolerating the taint forever was evicted");
    assert!(!evicted(&s, "defaulted"), "a pod with the default 300 s toleration was evicted");

    // The kubelet reports NotReady: the taint becomes not-ready.
    heartbeat(&s, "edge-1", "False");
    eventually("the not-ready taints", || {
        let t = taints(&s, "edge-1");
        t.contains("node.kubernetes.io/not-ready:NoExecute") && !t.contains("unreachable")
    });
    // Back to Ready: the taints go.
    heartbeat(&s, "edge-1", "True");
    eventually("the taints to go", || taints(&s, "edge-1").is_empty());
    assert!(!evicted(&s, "patient"));
}

#[test]
fn nodes_get_distinct_pod_cidrs_and_cordon_taints() {
    let s = start();
    for n in ["a", "b", "c"] {
        node(&s, n);
    }
    let cidr = |n: &str| get(&s, &["node", n], "{.spec.podCIDR}");
    eventually("podCIDRs for every node", || ["a", "b", "c"].iter().all(|n| !cidr(n).is_empty()));
    let mut all: Vec<String> = ["a", "b", "c"].iter().map(|n| cidr(n)).collect();
    for c in &all {
        assert!(c.starts_with("10.42.") && c.ends_with(".0/24"), "{c}");
    }
    assert_eq!(get(&s, &["node", "a"], "{.spec.podCIDRs[0]}"), cidr("a"));
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 3, "podCIDRs are not distinct: {all:?}");
    // A deleted node's CIDR is handed out again.
    let freed = cidr("b");
    ok(&s, &["delete", "node", "b"]);
    node(&s, "d");
    eventually("the freed podCIDR for the new node", || cidr("d") == freed);

    // Cordon mirrors into the unschedulable taint.
    ok(&s, &["cordon", "a"]);
    eventually("the unschedulable taint", || taints(&s, "a") == "node.kubernetes.io/unschedulable:NoSchedule ");
    ok(&s, &["uncordon", "a"]);
    eventually("the unschedulable taint to go", || taints(&s, "a").is_empty());
}

#[test]
fn endpoints_and_slices_follow_pod_readiness() {
    let s = start();
    node(&s, "n1");
    ok(&s, &["label", "node", "n1", "topology.kubernetes.io/zone=zone-a"]);
    apply(
        &s,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","labels":{"tier":"front"}},"spec":{"selector":{"app":"web"},"ports":[{"name":"http","port":80,"targetPort":"http"}]}}"#,
    );
    pod(&s, "web-1", r#"{"app":"web"}"#, "n1", 8080, "[]");
    pod(&s, "web-2", r#"{"app":"web"}"#, "n1", 9090, "[]");
    pod(&s, "web-3", r#"{"app":"web"}"#, "n1", 8080, "[]");
    pod(&s, "other", r#"{"app":"db"}"#, "n1", 8080, "[]");
    pod_status(&s, "web-1", "10.42.0.11", true);
    pod_status(&s, "web-2", "10.42.0.12", false);
    pod_status(&s, "other", "10.42.0.13", true);
    // web-3 has no IP yet and is left out.
    let ep = |path: &str| get(&s, &["endpoints", "web"], path);
    eventually("ready and not-ready addresses", || {
        ep("{.subsets[*].addresses[*].ip}") == "10.42.0.11"
            && ep("{.subsets[*].notReadyAddresses[*].ip}") == "10.42.0.12"
    });
    // Named targetPorts resolve per pod.
    let mut ports: Vec<String> =
        ep("{range .subsets[*]}{.ports[0].name}={.ports[0].port} {end}").split_whitespace().map(String::from).collect();
    ports.sort();
    assert_eq!(ports, ["http=8080", "http=9090"]);
    assert_eq!(ep("{.subsets[*].addresses[*].targetRef.name}"), "web-1");
    assert_eq!(ep("{.subsets[*].addresses[*].nodeName}"), "n1");
    assert_eq!(ep("{.metadata.labels.tier}"), "front");

    let slices = |path: &str| get(&s, &["endpointslices", "-l", "kubernetes.io/service-name=web"], path);
    eventually("endpoint slices", || {
        slices("{range .items[*].endpoints[*]}{.addresses[0]}:{.conditions.ready} {end}").split_whitespace().count()
            == 2
    });
    assert_eq!(
        slices("{.items[0].metadata.labels.endpointslice\\.kubernetes\\.io/managed-by}"),
        "endpointslice-controller.k8s.io"
    );
    assert!(slices("{.items[0].metadata.name}").starts_with("web-"));
    assert_eq!(slices("{.items[0].addressType}"), "IPv4");
    assert_eq!(slices("{.items[0].metadata.ownerReferences[0].name}"), "web");
    let conds = slices("{range .items[*].endpoints[*]}{.addresses[0]}:{.conditions.ready}/{.conditions.serving}/{.targetRef.name}/{.nodeName} {end}");
    assert!(conds.contains("10.42.0.11:true/true/web-1/n1"), "{conds}");
    assert!(conds.contains("10.42.0.12:false/false/web-2/n1"), "{conds}");
    assert_eq!(slices("{.items[0].endpoints[0].zone}"), "zone-a");

    // web-2 becomes ready, web-3 gets an IP.
    pod_status(&s, "web-2", "10.42.0.12", true);
    pod_status(&s, "web-3", "10.42.0.14", true);
    eventually("all ready", || {
        let mut ips: Vec<String> = ep("{.subsets[*].addresses[*].ip}").split_whitespace().map(String::from).collect();
        ips.sort();
        ips == ["10.42.0.11", "10.42.0.12", "10.42.0.14"] && ep("{.subsets[*].notReadyAddresses}").is_empty()
    });
    eventually("the slices to follow", || {
        slices("{range .items[*].endpoints[*]}{.conditions.ready} {end}")
            .split_whitespace()
            .filter(|r| *r == "true")
            .count()
            == 3
    });
    // A deleted pod leaves.
    ok(&s, &["delete", "pod", "web-1", "--grace-period=0", "--force"]);
    eventually("web-1 to leave", || !ep("{.subsets[*].addresses[*].ip}").contains("10.42.0.11"));
    // So does a pod relabelled out of the Service's selector.
    ok(&s, &["label", "pod", "web-2", "app=other", "--overwrite"]);
    eventually("web-2 to leave", || !ep("{.subsets[*].addresses[*].ip}").contains("10.42.0.12"));
    eventually("web-2 to leave the slices", || {
        let addresses = slices("{range .items[*].endpoints[*]}{.addresses[0]} {end}");
        !addresses.contains("10.42.0.12") && addresses.contains("10.42.0.14")
    });
    // The API server's own Endpoints are left alone.
    assert!(!get(&s, &["endpoints", "kubernetes"], "{.subsets[0].addresses[0].ip}").is_empty());
    assert!(get(
        &s,
        &["endpointslices", "-l", "kubernetes.io/service-name=kubernetes"],
        "{.items[*].metadata.labels.endpointslice\\.kubernetes\\.io/managed-by}"
    )
    .split_whitespace()
    .all(|m| m != "endpointslice-controller.k8s.io"));
    // Deleting the Service deletes its Endpoints and slices.
    ok(&s, &["delete", "service", "web"]);
    eventually("the Endpoints to go", || kubectl(&s, &["get", "endpoints", "web"]).1.contains("NotFound"));
    eventually("the slices to go", || slices("{.items}") == "[]" || slices("{.items}").is_empty());
}

#[test]
fn disruption_budgets_and_quotas_report_status() {
    let s = start();
    node(&s, "n1");
    apply(
        &s,
        r#"{"apiVersion":"v1","kind":"ResourceQuota","metadata":{"name":"q"},"spec":{"hard":{"pods":"10","requests.cpu":"4","requests.memory":"1Gi","configmaps":"5","services":"3","count/poddisruptionbudgets.policy":"2"}}}"#,
    );
    apply(
        &s,
        r#"{"apiVersion":"policy/v1","kind":"PodDisruptionBudget","metadata":{"name":"db"},"spec":{"minAvailable":2,"selector":{"matchLabels":{"app":"db"}}}}"#,
    );
    for (i, name) in ["db-0", "db-1", "db-2"].iter().enumerate() {
        pod(&s, name, r#"{"app":"db"}"#, "n1", 5432, "[]");
        pod_status(&s, name, &format!("10.42.0.{}", 20 + i), i < 2);
    }
    let pdb = |path: &str| get(&s, &["pdb", "db"], path);
    eventually("the budget with two healthy pods", || {
        pdb("{.status.currentHealthy}/{.status.desiredHealthy}/{.status.expectedPods}/{.status.disruptionsAllowed}")
            == "2/2/3/0"
    });
    assert_eq!(
        pdb("{.status.conditions[0].type}/{.status.conditions[0].status}/{.status.conditions[0].reason}"),
        "DisruptionAllowed/False/InsufficientPods"
    );
    assert_eq!(pdb("{.status.observedGeneration}"), pdb("{.metadata.generation}"));
    pod_status(&s, "db-2", "10.42.0.22", true);
    eventually("a disruption allowed", || {
        pdb("{.status.currentHealthy}/{.status.disruptionsAllowed}/{.status.conditions[0].reason}")
            == "3/1/SufficientPods"
    });
    // The eviction subresource spends the budget; the second one is refused.
    let evict = |pod: &str| {
        let body = format!(r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{pod}"}}}}"#);
        let path = std::env::temp_dir().join(format!("eviction-{}-{pod}.json", s.port));
        std::fs::write(&path, body).expect("write eviction");
        let raw = format!("/api/v1/namespaces/default/pods/{pod}/eviction");
        kubectl(&s, &["create", "--raw", &raw, "-f", path.to_str().expect("path")])
    };
    let (evicted_ok, out) = evict("db-0");
    assert!(evicted_ok, "{out}");
    let (refused, out) = evict("db-1");
    assert!(!refused && out.contains("disruption budget"), "{out}");
    eventually("the budget to count the evicted pod out", || {
        pdb("{.status.currentHealthy}/{.status.disruptionsAllowed}") == "2/0"
    });
    assert_eq!(pdb("{.status.disruptedPods}"), "", "the deleting pod's entry was not cleared");
    // A pod relabelled out of the selector stops counting at once.
    ok(&s, &["label", "pod", "db-1", "app=other", "--overwrite"]);
    eventually("the relabelled pod to stop counting", || pdb("{.status.currentHealthy}") == "1");
    // maxUnavailable counts the pods' controllers' scale: these pods have
    // none, so nothing is expected and a warning says why.
    ok(&s, &["patch", "pdb", "db", "--type=merge", "-p", r#"{"spec":{"minAvailable":null,"maxUnavailable":"50%"}}"#]);
    eventually("the budget of unmanaged pods", || {
        pdb("{.status.expectedPods}/{.status.disruptionsAllowed}/{.status.conditions[0].reason}")
            == "0/0/InsufficientPods"
    });
    eventually("the UnmanagedPods event", || {
        get(&s, &["events", "--field-selector", "reason=UnmanagedPods"], "{.items[*].involvedObject.name}")
            .contains("db")
    });

    let used = |key: &str| get(&s, &["resourcequota", "q"], &format!("{{.status.used.{key}}}"));
    eventually("quota usage", || {
        used("pods") == "3" && used("requests\\.cpu") == "750m" && used("requests\\.memory") == "192Mi"
    });
    assert_eq!(get(&s, &["resourcequota", "q"], "{.status.hard.pods}"), "10");
    assert_eq!(used("count/poddisruptionbudgets\\.policy"), "1");
    // kube-root-ca.crt is one ConfigMap already; the kubernetes Service one Service.
    eventually("configmaps counted", || used("configmaps") == "1");
    assert_eq!(used("services"), "1");
    ok(&s, &["create", "configmap", "x"]);
    eventually("a new configmap counted", || used("configmaps") == "2");
    // A finished pod no longer counts.
    ok(
        &s,
        &["patch", "pod", "db-0", "--subresource=status", "--type=merge", "-p", r#"{"status":{"phase":"Succeeded"}}"#],
    );
    eventually("the finished pod to stop counting", || used("pods") == "2" && used("requests\\.cpu") == "500m");
}
