//! The auto-deploy folder (`<data-dir>/server/manifests/`) and `--disable`
//! against a real `ferrok server`, driven with kubectl: files applied,
//! changed, removed, skipped and broken; each packaged part turned off and
//! back on across restarts.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Once;
use std::time::{Duration, Instant};

use common::{eventually, kubectl, ApiServer};

fn manifests(s: &ApiServer) -> PathBuf {
    s.dir.path().join("server").join("manifests")
}

fn write(s: &ApiServer, name: &str, body: &str) {
    // Written beside and renamed in, as editors and tools do.
    let tmp = s.dir.path().join(format!(".{name}.tmp"));
    std::fs::write(&tmp, body).expect("write manifest");
    std::fs::rename(&tmp, manifests(s).join(name)).expect("rename manifest");
}

fn exists(s: &ApiServer, what: &[&str]) -> bool {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    kubectl(s, &args).0
}

fn get(s: &ApiServer, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let jp = format!("jsonpath={path}");
    args.extend(["-o", &jp]);
    kubectl(s, &args).1
}

fn config_map(name: &str, value: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\ndata:\n  k: {value}\n")
}

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: deployed
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: c
        image: docker.io/library/busybox:1
";

#[test]
fn manifests_are_applied_changed_pruned_and_skipped() {
    let s = ApiServer::start();
    // A file with a namespace, a Deployment in it, and a ConfigMap.
    let ns = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: deployed\n";
    write(&s, "a.yaml", &format!("{}---\n{DEPLOYMENT}---\n{ns}", config_map("cm-a", "one")));
    eventually("a.yaml's objects", || {
        exists(&s, &["cm", "cm-a"]) && exists(&s, &["deployment", "web", "-n", "deployed"])
    });
    let managers = get(&s, &["cm", "cm-a"], "{.metadata.managedFields[*].manager}");
    assert!(managers.contains("ferrok-deploy"), "field managers: {managers}");

    // Changed: the ConfigMap follows, the dropped Deployment goes.
    write(&s, "a.yaml", &format!("{}---\n{ns}", config_map("cm-a", "two")));
    eventually("cm-a updated and web deleted", || {
        get(&s, &["cm", "cm-a"], "{.data.k}") == "two" && !exists(&s, &["deployment", "web", "-n", "deployed"])
    });

    // `.skip` leaves b.yaml alone; c.yaml (after it by name) shows the folder was read.
    std::fs::write(manifests(&s).join("b.yaml.skip"), "").expect("skip");
    write(&s, "b.yaml", &config_map("cm-b", "x"));
    write(&s, "c.json", r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-c"}}"#);
    eventually("cm-c", || exists(&s, &["cm", "cm-c"]));
    assert!(!exists(&s, &["cm", "cm-b"]), "b.yaml was applied despite b.yaml.skip");

    // A broken file: a Warning Event naming it; the good one beside it applies.
    write(&s, "bad.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: [\n");
    write(&s, "d.yaml", &config_map("cm-d", "x"));
    eventually("cm-d", || exists(&s, &["cm", "cm-d"]));
    eventually("an ApplyManifestFailed event naming bad.yaml", || {
        get(
            &s,
            &["events", "-n", "kube-system", "--field-selector", "reason=ApplyManifestFailed"],
            "{.items[*].message}",
        )
        .contains("bad.yaml")
    });
    let logs: String = std::fs::read_dir(s.dir.path())
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("server-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert!(logs.contains("bad.yaml"), "no log line names bad.yaml");

    // Removed: its objects go; the skipped file's record is kept.
    std::fs::remove_file(manifests(&s).join("a.yaml")).expect("rm");
    eventually("cm-a and the namespace deleted", || !exists(&s, &["cm", "cm-a"]) && !exists(&s, &["ns", "deployed"]));

    // Removed while the server is down: deleted at the next start.
    let (dir, port) = s.stop();
    std::fs::remove_file(dir.path().join("server/manifests/c.json")).expect("rm");
    let s = ApiServer::start_in(dir, port);
    eventually("cm-c deleted after the restart", || !exists(&s, &["cm", "cm-c"]));
    assert!(exists(&s, &["cm", "cm-d"]));
    // A hand-deleted object of an unchanged file comes back at start.
    let (dir, port) = s.stop();
    let s = ApiServer::start_in(dir, port);
    assert!(kubectl(&s, &["delete", "cm", "cm-d"]).0);
    let (dir, port) = s.stop();
    let s = ApiServer::start_in(dir, port);
    eventually("cm-d re-applied at start", || exists(&s, &["cm", "cm-d"]));
}

fn fake_node_env() {
    static ENV: Once = Once::new();
    // The fake node sends no heartbeats: keep node lifecycle from marking it Unknown.
    ENV.call_once(|| unsafe {
        std::env::set_var("FERROK_NODE_MONITOR_GRACE_PERIOD", "600s");
        std::env::set_var("FERROK_NODE_STARTUP_GRACE_PERIOD", "600s");
    });
}

fn ready_node(s: &ApiServer) {
    if !exists(s, &["node", "n1"]) {
        common::apply(s, "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n");
    }
    let out = Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]).output().expect("date");
    let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let status = format!(
        r#"{{"status":{{"conditions":[{{"type":"Ready","status":"True","reason":"Test","lastHeartbeatTime":"{t}","lastTransitionTime":"{t}"}}],"addresses":[{{"type":"InternalIP","address":"10.0.0.1"}}]}}}}"#
    );
    assert!(kubectl(s, &["patch", "node", "n1", "--subresource=status", "--type=merge", "-p", &status]).0);
}

/// (Each on its own port: ServiceLB gives a node's port to one Service only.)
fn load_balancer(s: &ApiServer, name: &str, port: u16) {
    common::apply(
        s,
        &format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  type: LoadBalancer\n  selector: {{app: x}}\n  ports:\n  - port: {port}\n"),
    );
}

fn ingress(s: &ApiServer, svc: &str) -> String {
    get(s, &["svc", svc], "{.status.loadBalancer.ingress[*].ip}")
}

/// What each packaged part shows in the API.
struct Parts {
    dns: bool,
    metrics: bool,
    storage: bool,
}

fn parts(s: &ApiServer) -> Parts {
    Parts {
        dns: exists(s, &["svc", "-n", "kube-system", "kube-dns"]),
        metrics: exists(s, &["apiservice", "v1beta1.metrics.k8s.io"])
            || kubectl(s, &["get", "--raw", "/apis/metrics.k8s.io/v1beta1"]).0,
        storage: get(s, &["storageclass", "local-path"], "{.provisioner}") == "rancher.io/local-path",
    }
}

#[test]
fn disable_stops_each_part_until_it_is_dropped() {
    fake_node_env();
    // An unknown name: one line naming the flag, nothing started.
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(common::ferrok_bin())
        .args(["server", "--disable", "servicelb,ingress", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("ferrok");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--disable") && err.contains("ingress"), "{err}");
    assert!(!dir.path().join("server").exists(), "a refused start left state behind");

    // Everything on.
    let s = ApiServer::start();
    eventually("kube-dns, metrics.k8s.io and the local-path class", || {
        let p = parts(&s);
        p.dns && p.metrics && p.storage
    });
    assert_eq!(
        get(
            &s,
            &["storageclass", "local-path"],
            "{.metadata.annotations.storageclass\\.kubernetes\\.io/is-default-class}"
        ),
        "true"
    );
    ready_node(&s);
    load_balancer(&s, "lb1", 80);
    eventually("lb1's ingress", || ingress(&s, "lb1") == "10.0.0.1");

    // Everything off (traefik: accepted, nothing to do).
    let (dir, port) = s.stop();
    let flags = ["--disable", "coredns,servicelb", "--disable", "local-storage", "--disable", "metrics-server,traefik"];
    let s = ApiServer::start_with(dir, port, &flags);
    eventually("kube-dns, metrics.k8s.io and the local-path class gone", || {
        let p = parts(&s);
        !p.dns && !p.metrics && !p.storage
    });
    assert!(!manifests(&s).join("local-storage.yaml").exists());
    let (_, resources) = kubectl(&s, &["api-resources", "--api-group=metrics.k8s.io", "--no-headers"]);
    assert!(resources.trim().is_empty(), "metrics.k8s.io still served: {resources}");
    ready_node(&s);
    load_balancer(&s, "lb2", 81);
    // No ServiceLB: lb2 stays pending (watched for 3 s).
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        assert_eq!(ingress(&s, "lb2"), "", "ServiceLB ran with --disable servicelb");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Back on at the next start.
    let (dir, port) = s.stop();
    let s = ApiServer::start_in(dir, port);
    ready_node(&s);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let p = parts(&s);
        let lb = ingress(&s, "lb2");
        if p.dns && p.metrics && p.storage && lb == "10.0.0.1" {
            break;
        }
        let seen = format!("dns {} metrics {} storage {} lb2 {lb:?}", p.dns, p.metrics, p.storage);
        assert!(Instant::now() < deadline, "not every part came back: {seen}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
