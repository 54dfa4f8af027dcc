//! The control plane's own machinery: leader election between two servers
//! sharing one etcd (one active scheduler and controller manager, handed
//! over when the leader dies), and scheduler profiles from a
//! KubeSchedulerConfiguration given with `--kube-scheduler-arg config=FILE`.

mod common;

use common::{apply, eventually_within, kubectl};

use std::process::Command;
use std::time::Duration;

fn node(name: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{name}"}},"status":{{"allocatable":{{"cpu":"4","memory":"8Gi","pods":"110"}},"capacity":{{"cpu":"4","memory":"8Gi","pods":"110"}}}}}}"#
    )
}

fn pod(name: &str, scheduler: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}"}},"spec":{{"schedulerName":"{scheduler}","containers":[{{"name":"c","image":"busybox","resources":{{"requests":{{"cpu":"1"}}}}}}]}}}}"#
    )
}

fn node_of(s: &common::ApiServer, pod: &str) -> String {
    kubectl(s, &["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"]).1
}

fn holder(s: &common::ApiServer, lease: &str) -> String {
    kubectl(s, &["get", "lease", lease, "-n", "kube-system", "-o", "jsonpath={.spec.holderIdentity}"]).1
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_election_hands_over_between_servers() {
    let etcd = common::start_etcd().await;
    let endpoint = format!("http://{}", etcd.endpoint);
    let dir = || tempfile::tempdir().expect("tempdir");
    let a = common::ApiServer::start_with(
        dir(),
        common::free_port(),
        &["--datastore-endpoint", &endpoint, "--node-name", "server-a", "--token", "shared-test-token"],
    );
    eventually_within("server-a to lead", Duration::from_secs(10), || {
        holder(&a, "kube-scheduler") == "server-a" && holder(&a, "kube-controller-manager") == "server-a"
    });
    let b = common::ApiServer::start_with(
        dir(),
        common::free_port(),
        &["--datastore-endpoint", &endpoint, "--node-name", "server-b", "--token", "shared-test-token"],
    );
    // b sees a's objects and does not take the leases while a renews them.
    apply(&b, &node("worker"));
    apply(&b, &pod("first", "default-scheduler"));
    eventually_within("the first pod to be bound", Duration::from_secs(10), || node_of(&b, "first") == "worker");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(holder(&b, "kube-scheduler"), "server-a");
    let transitions = |s: &common::ApiServer| {
        kubectl(s, &["get", "lease", "kube-scheduler", "-n", "kube-system", "-o", "jsonpath={.spec.leaseTransitions}"])
            .1
    };
    assert_eq!(transitions(&b), "0");

    drop(a); // SIGKILL: the lease is left to expire.
    eventually_within("server-b to take the leases", Duration::from_secs(30), || {
        holder(&b, "kube-scheduler") == "server-b" && holder(&b, "kube-controller-manager") == "server-b"
    });
    assert_eq!(transitions(&b), "1");
    apply(&b, &pod("second", "default-scheduler"));
    eventually_within("the second pod to be bound by server-b", Duration::from_secs(10), || {
        node_of(&b, "second") == "worker"
    });
}

#[test]
fn scheduler_profiles_from_a_configuration_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("scheduler.yaml");
    std::fs::write(
        &config,
        r#"apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: bin-packing
  plugins:
    score:
      disabled: [{name: NodeResourcesBalancedAllocation}, {name: ImageLocality}]
      enabled: [{name: NodeResourcesFit, weight: 10}]
  pluginConfig:
  - name: NodeResourcesFit
    args: {scoringStrategy: {type: MostAllocated}}
"#,
    )
    .expect("config");
    let arg = format!("config={}", config.display());
    let s = common::ApiServer::start_with(dir, common::free_port(), &["--kube-scheduler-arg", &arg]);
    for n in ["n1", "n2", "n3"] {
        apply(&s, &node(n));
    }
    // Bin-packing: each pod goes where the most is already used.
    let mut packed = Vec::new();
    for i in 0..3 {
        let name = format!("packed-{i}");
        apply(&s, &pod(&name, "bin-packing"));
        eventually_within("a bin-packed pod to be bound", Duration::from_secs(10), || !node_of(&s, &name).is_empty());
        packed.push(node_of(&s, &name));
    }
    assert!(packed.iter().all(|n| *n == packed[0]), "bin-packing spread its pods: {packed:?}");
    // The default profile spreads to the least allocated nodes.
    let mut spread = Vec::new();
    for i in 0..2 {
        let name = format!("spread-{i}");
        apply(&s, &pod(&name, "default-scheduler"));
        eventually_within("a default pod to be bound", Duration::from_secs(10), || !node_of(&s, &name).is_empty());
        spread.push(node_of(&s, &name));
    }
    assert!(!spread.contains(&packed[0]), "default profile chose the full node: {spread:?} vs {packed:?}");
    assert_ne!(spread[0], spread[1]);
}

#[test]
fn a_bad_scheduler_argument_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(common::ferrok_bin())
        .args(["server", "--disable-agent", "--data-dir"])
        .arg(dir.path())
        .args(["--https-listen-port", &common::free_port().to_string(), "--bind-address", "127.0.0.1"])
        .args(["--kube-scheduler-arg", "config=/nonexistent/scheduler.yaml"])
        .output()
        .expect("run ferrok");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kube-scheduler-arg config"), "{err}");
}

#[test]
fn deployment_pods_are_bound_to_fitting_nodes() {
    let s = common::ApiServer::start();
    apply(&s, &node("small"));
    let tainted = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"gpu"},"spec":{"taints":[{"key":"dedicated","value":"gpu","effect":"NoSchedule"}]},"status":{"allocatable":{"cpu":"4","memory":"8Gi","pods":"110"},"capacity":{"cpu":"4","memory":"8Gi","pods":"110"}}}"#;
    apply(&s, tainted);
    let deployment = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":3,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"busybox","resources":{"requests":{"cpu":"1"}}}]}}}}"#;
    apply(&s, deployment);
    let nodes = || kubectl(&s, &["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].spec.nodeName}"]).1;
    eventually_within("three pods bound to the untainted node", Duration::from_secs(20), || {
        nodes().split_whitespace().filter(|n| *n == "small").count() == 3
    });
    // Four fit on the 4-CPU node; the fifth has nowhere to go.
    assert!(kubectl(&s, &["scale", "deployment", "web", "--replicas=5"]).0);
    eventually_within("four pods bound", Duration::from_secs(20), || nodes().split_whitespace().count() == 4);
    let pending = || {
        kubectl(&s, &["get", "pods", "-l", "app=web", "--field-selector=spec.nodeName=", "-o", "name"])
            .1
            .trim()
            .to_string()
    };
    eventually_within("one pending pod", Duration::from_secs(20), || pending().lines().count() == 1);
    let pod = pending().trim_start_matches("pod/").to_string();
    eventually_within("the FailedScheduling event", Duration::from_secs(20), || {
        let (_, out) = kubectl(&s, &["describe", "pod", &pod]);
        out.contains("0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {dedicated: gpu}.")
    });
}
