//! `ferrok server` driven by real kubectl (1.32 and 1.33): startup objects,
//! apply/get/patch/scale/delete, errors, watch, paging, CRDs, restart.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::ApiServer as Server;

fn kubectl_binaries() -> Vec<PathBuf> {
    let k = which("kubectl");
    let real = std::fs::canonicalize(&k).expect("resolve kubectl");
    let k133 = real.parent().expect("kubectl folder").join("kubectl.1.33");
    assert!(k133.exists(), "kubectl.1.33 is not beside {}", real.display());
    vec![k, k133]
}

fn which(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").expect("PATH");
    std::env::split_paths(&path)
        .map(|p| p.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not installed"))
}

/// Runs kubectl; returns (success, stdout, stderr).
fn run(kubectl: &Path, s: &Server, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    let mut cmd = Command::new(kubectl);
    cmd.env("KUBECONFIG", s.kubeconfig()).env("HOME", s.dir.path()).args(args);
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run kubectl");
    if let Some(input) = stdin {
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    }
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(kubectl: &Path, s: &Server, args: &[&str]) -> String {
    let (success, out, err) = run(kubectl, s, args, None);
    assert!(success, "kubectl {args:?} failed: {err}");
    out
}

fn ok_stdin(kubectl: &Path, s: &Server, args: &[&str], stdin: &str) -> String {
    let (success, out, err) = run(kubectl, s, args, Some(stdin));
    assert!(success, "kubectl {args:?} failed: {err}");
    out
}

fn fails(kubectl: &Path, s: &Server, args: &[&str], stdin: Option<&str>) -> String {
    let (success, out, err) = run(kubectl, s, args, stdin);
    assert!(!success, "kubectl {args:?} succeeded: {out}");
    err
}

const APP: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: web, image: "busybox:1.36", ports: [{containerPort: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg}
data: {a: "1"}
"#;

#[test]
fn a_new_cluster_has_its_builtin_objects() {
    let s = Server::start();
    let k = &kubectl_binaries()[0];
    let ns = ok(k, &s, &["get", "ns", "-o", "name"]);
    for want in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(ns.contains(&format!("namespace/{want}")), "{ns}");
    }
    let svc = ok(k, &s, &["get", "svc", "kubernetes", "-o", "jsonpath={.spec.clusterIP} {.spec.ports[0].port}"]);
    assert_eq!(svc, "10.43.0.1 443");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(s.kubeconfig()).expect("kubeconfig").permissions());
    assert_eq!(mode & 0o777, 0o600);
    let explained = ok(k, &s, &["explain", "pods.spec.restartPolicy"]);
    assert!(
        explained.contains("FIELD: restartPolicy <string>") && explained.contains("Restart policy for all containers"),
        "{explained}"
    );
    let version = ok(k, &s, &["version", "-o", "json"]);
    assert!(version.contains("\"gitVersion\": \"v1.33"), "{version}");
    // Anonymous requests reach the health endpoints only.
    let url = format!("https://127.0.0.1:{}", s.port);
    let anon = Command::new("curl").args(["-sk", &format!("{url}/api/v1/namespaces")]).output().expect("curl");
    assert!(String::from_utf8_lossy(&anon.stdout).contains("\"code\":401"));
    let livez = Command::new("curl").args(["-sk", &format!("{url}/livez?verbose")]).output().expect("curl");
    assert!(String::from_utf8_lossy(&livez.stdout).contains("livez check passed"));
    // Each built-in group/version has its local APIService, always available.
    let apiservices = ok(k, &s, &["get", "apiservices", "--no-headers"]);
    for name in ["v1.", "v1.apps", "v2.autoscaling", "v1.apiregistration.k8s.io", "v1.flowcontrol.apiserver.k8s.io"] {
        let line = apiservices.lines().find(|l| l.split_whitespace().next() == Some(name));
        let columns: Vec<&str> =
            line.unwrap_or_else(|| panic!("no {name} in {apiservices}")).split_whitespace().collect();
        assert_eq!(columns[1..3], ["Local", "True"], "{apiservices}");
    }
    let apps = ok(
        k,
        &s,
        &["get", "apiservice", "v1.apps", "-o", "jsonpath={.spec.groupPriorityMinimum}/{.spec.versionPriority}"],
    );
    assert_eq!(apps, "17800/15");
    // One of an extension server's is stored; a misnamed one is refused.
    let apiservice = |name: &str| {
        format!(
            "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {{name: {name}}}\nspec: {{group: metrics.k8s.io, \
             version: v1beta1, groupPriorityMinimum: 100, versionPriority: 100, service: {{namespace: kube-system, name: metrics-server}}}}\n"
        )
    };
    ok_stdin(k, &s, &["apply", "-f", "-"], &apiservice("v1beta1.metrics.k8s.io"));
    let service = ok(k, &s, &["get", "apiservice", "v1beta1.metrics.k8s.io", "--no-headers"]);
    assert!(service.contains("kube-system/metrics-server"), "{service}");
    let err = fails(k, &s, &["apply", "-f", "-"], Some(&apiservice("v1beta1.wrong")));
    assert!(
        err.contains("metadata.name: Invalid value") || err.contains("must be `spec.version+\".\"+spec.group`"),
        "{err}"
    );
}

#[test]
fn apply_get_patch_scale_delete_with_both_kubectls() {
    let s = Server::start();
    for (i, k) in kubectl_binaries().iter().enumerate() {
        let ns = format!("t{i}");
        ok(k, &s, &["create", "namespace", &ns]);
        let out = ok_stdin(k, &s, &["apply", "-n", &ns, "-f", "-"], APP);
        assert!(out.contains("deployment.apps/web created") && out.contains("service/web created"), "{out}");
        let again = ok_stdin(k, &s, &["apply", "-n", &ns, "-f", "-"], APP);
        assert!(again.contains("deployment.apps/web unchanged"), "{again}");
        let table = ok(k, &s, &["get", "deploy", "-n", &ns]);
        assert!(table.starts_with("NAME   READY   UP-TO-DATE   AVAILABLE   AGE"), "{table}");
        let svc = ok(k, &s, &["get", "svc", "web", "-n", &ns, "-o", "jsonpath={.spec.clusterIP}"]);
        assert!(svc.starts_with("10.43."), "{svc}");
        ok(k, &s, &["label", "cm", "cfg", "-n", &ns, "tier=x"]);
        ok(k, &s, &["annotate", "cm", "cfg", "-n", &ns, "note=y"]);
        ok(
            k,
            &s,
            &["patch", "cm", "cfg", "-n", &ns, "--type=json", "-p", r#"[{"op":"add","path":"/data/b","value":"2"}]"#],
        );
        ok(k, &s, &["patch", "cm", "cfg", "-n", &ns, "--type=merge", "-p", r#"{"data":{"c":"3"}}"#]);
        ok(
            k,
            &s,
            &[
                "patch",
                "deploy",
                "web",
                "-n",
                &ns,
                "-p",
                r#"{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"busybox:1.37"}]}}}}"#,
            ],
        );
        let data = ok(
            k,
            &s,
            &["get", "cm", "cfg", "-n", &ns, "-o", "jsonpath={.data.a}{.data.b}{.data.c} {.metadata.labels.tier}"],
        );
        assert_eq!(data, "123 x");
        let dep = ok(k, &s, &["get", "deploy", "web", "-n", &ns, "-o", "jsonpath={.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].ports[0].containerPort} {.metadata.generation}"]);
        assert_eq!(dep, "busybox:1.37 80 2");
        ok(k, &s, &["scale", "deploy", "web", "-n", &ns, "--replicas=5"]);
        let replicas = ok(k, &s, &["get", "deploy", "web", "-n", &ns, "-o", "jsonpath={.spec.replicas}"]);
        assert_eq!(replicas, "5");
        let described = ok(k, &s, &["describe", "cm", "cfg", "-n", &ns]);
        assert!(described.contains("Labels:       tier=x"), "{described}");
        let deleted = ok_stdin(k, &s, &["delete", "-n", &ns, "-f", "-"], APP);
        assert!(deleted.contains("deployment.apps \"web\" deleted"), "{deleted}");
        let none = run(k, &s, &["get", "deploy,svc,cm", "-n", &ns, "-o", "name"], None).1;
        assert!(!none.contains("web"), "{none}");
    }
}

#[test]
fn errors_read_like_upstream() {
    let s = Server::start();
    let k = &kubectl_binaries()[0];
    let err = fails(k, &s, &["get", "cm", "missing"], None);
    assert!(err.contains("Error from server (NotFound): configmaps \"missing\" not found"), "{err}");
    let err = fails(
        k,
        &s,
        &["apply", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"}}"#),
    );
    assert!(err.contains("is invalid: metadata.name: Invalid value: \"Bad_Name\""), "{err}");
    let err = fails(
        k,
        &s,
        &["apply", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"bogus":1}"#),
    );
    assert!(err.contains("strict decoding error: unknown field \"bogus\""), "{err}");
    let err = fails(
        k,
        &s,
        &["apply", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{}}"#),
    );
    assert!(err.contains("The Pod \"p\" is invalid: spec.containers: Required value"), "{err}");
    let err = fails(
        k,
        &s,
        &["apply", "-n", "nowhere", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#),
    );
    assert!(err.contains("namespaces \"nowhere\" not found"), "{err}");
    // A stale resourceVersion is a conflict.
    ok_stdin(
        k,
        &s,
        &["apply", "-f", "-"],
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"v":"1"}}"#,
    );
    let stale =
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","resourceVersion":"1"},"data":{"v":"2"}}"#;
    let err = fails(k, &s, &["replace", "-f", "-"], Some(stale));
    assert!(err.contains("Operation cannot be fulfilled on configmaps \"c\": the object has been modified"), "{err}");
    // A body over 3 MiB is refused with 413.
    let big = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"big"}},"data":{{"x":"{}"}}}}"#,
        "y".repeat(3_200_000)
    );
    let err = fails(k, &s, &["create", "-f", "-"], Some(&big));
    assert!(err.contains("Request entity too large"), "{err}");
    let err = fails(k, &s, &["get", "nonsense"], None);
    assert!(err.contains("the server doesn't have a resource type \"nonsense\""), "{err}");
}

#[test]
fn watch_and_paging() {
    let s = Server::start();
    let k = kubectl_binaries()[1].clone();
    for i in 0..7 {
        ok_stdin(
            &k,
            &s,
            &["apply", "-f", "-"],
            &format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm{i}"}}}}"#),
        );
    }
    let all = ok(&k, &s, &["get", "cm", "--chunk-size=2", "-o", "name"]);
    assert_eq!(all.lines().filter(|l| l.starts_with("configmap/cm")).count(), 7, "{all}");
    // kube-root-ca.crt is there too: count what the namespace holds.
    let whole = ok(&k, &s, &["get", "--raw", "/api/v1/namespaces/default/configmaps"]);
    let total =
        serde_json::from_str::<serde_json::Value>(&whole).expect("list JSON")["items"].as_array().map_or(0, Vec::len);
    assert!(total >= 7, "{whole}");
    let page = ok(&k, &s, &["get", "--raw", "/api/v1/namespaces/default/configmaps?limit=2"]);
    let page: serde_json::Value = serde_json::from_str(&page).expect("list JSON");
    assert_eq!(page["items"].as_array().map(Vec::len), Some(2));
    assert!(page["metadata"]["continue"].is_string());
    assert_eq!(page["metadata"]["remainingItemCount"], total - 2);
    let token = page["metadata"]["continue"].as_str().unwrap_or_default();
    let next =
        ok(&k, &s, &["get", "--raw", &format!("/api/v1/namespaces/default/configmaps?limit=10&continue={token}")]);
    let next: serde_json::Value = serde_json::from_str(&next).expect("list JSON");
    assert_eq!(next["items"].as_array().map(Vec::len), Some(total - 2));
    let labelled = ok(&k, &s, &["get", "ns", "-l", "kubernetes.io/metadata.name=default", "-o", "name"]);
    assert_eq!(labelled.trim(), "namespace/default");

    let mut watch = Command::new(&k)
        .env("KUBECONFIG", s.kubeconfig())
        .env("HOME", s.dir.path())
        .args(["get", "cm", "-w", "--output-watch-events", "--request-timeout=0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl watch");
    std::thread::sleep(Duration::from_millis(700));
    ok_stdin(&k, &s, &["apply", "-f", "-"], r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"late"}}"#);
    ok(&k, &s, &["delete", "cm", "cm0"]);
    std::thread::sleep(Duration::from_millis(700));
    let _ = watch.kill();
    let out = watch.wait_with_output().expect("watch output");
    let text = String::from_utf8_lossy(&out.stdout);
    let has = |event: &str, name: &str| text.lines().any(|l| l.split_whitespace().take(2).eq([event, name]));
    assert!(has("ADDED", "cm3"), "{text}");
    assert!(has("ADDED", "late"), "{text}");
    assert!(has("DELETED", "cm0"), "{text}");
}

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}, scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1}
              color: {type: string, default: blue}
              replicas: {type: integer}
          status:
            type: object
            properties: {replicas: {type: integer}}
"#;

#[test]
fn custom_resources() {
    let s = Server::start();
    let k = &kubectl_binaries()[0];
    ok_stdin(k, &s, &["apply", "-f", "-"], CRD);
    ok(k, &s, &["wait", "--for", "condition=established", "crd/widgets.example.com", "--timeout=10s"]);
    ok_stdin(
        k,
        &s,
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3, replicas: 1}\n",
    );
    let table = ok(k, &s, &["get", "wd"]);
    assert!(table.starts_with("NAME   SIZE   AGE") && table.contains("w1     3"), "{table}");
    assert_eq!(ok(k, &s, &["get", "widget", "w1", "-o", "jsonpath={.spec.color}"]), "blue");
    ok(k, &s, &["scale", "widget", "w1", "--replicas=4"]);
    assert_eq!(ok(k, &s, &["get", "widget", "w1", "-o", "jsonpath={.spec.replicas}"]), "4");
    let err = fails(
        k,
        &s,
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w2}\nspec: {size: 0}\n"),
    );
    assert!(err.contains("spec.size"), "{err}");
    ok(k, &s, &["delete", "crd", "widgets.example.com"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, _, err) = run(k, &s, &["get", "widgets"], None);
        if err.contains("the server doesn't have a resource type")
            || err.contains(
                "Unable to list \"example.com/v1, Resource=widgets\": the server could not find the requested resource",
            )
        {
            break;
        }
        assert!(Instant::now() < deadline, "widgets still served after the CRD was deleted: {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn restart_keeps_objects_and_resource_versions_grow() {
    let s = Server::start();
    let k = &kubectl_binaries()[0];
    ok_stdin(
        k,
        &s,
        &["apply", "-f", "-"],
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"keep"},"data":{"a":"1"}}"#,
    );
    ok_stdin(k, &s, &["apply", "-f", "-"], CRD);
    ok(k, &s, &["wait", "--for", "condition=established", "crd/widgets.example.com", "--timeout=10s"]);
    ok_stdin(
        k,
        &s,
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3}\n",
    );
    let rv1: i64 = ok(k, &s, &["get", "cm", "keep", "-o", "jsonpath={.metadata.resourceVersion}"]).parse().expect("rv");
    let uid = ok(k, &s, &["get", "cm", "keep", "-o", "jsonpath={.metadata.uid}"]);
    let (dir, port) = s.stop();
    let s = Server::start_in(dir, port);
    assert_eq!(ok(k, &s, &["get", "cm", "keep", "-o", "jsonpath={.metadata.uid} {.data.a}"]), format!("{uid} 1"));
    assert_eq!(ok(k, &s, &["get", "widget", "w1", "-o", "jsonpath={.spec.size}"]), "3");
    ok(k, &s, &["label", "cm", "keep", "x=y"]);
    let rv2: i64 = ok(k, &s, &["get", "cm", "keep", "-o", "jsonpath={.metadata.resourceVersion}"]).parse().expect("rv");
    assert!(rv2 > rv1, "resourceVersion went from {rv1} to {rv2}");
}

#[test]
fn rbac_with_service_account_tokens_and_the_join_token() {
    let s = Server::start();
    let k = &kubectl_binaries()[1];
    ok(k, &s, &["create", "serviceaccount", "bot"]);
    let token = ok(k, &s, &["create", "token", "bot"]);
    let token = token.trim();
    assert!(token.starts_with("eyJ"), "{token}");
    let as_bot = |args: &[&str]| {
        let mut full = vec!["--token", token];
        full.extend_from_slice(args);
        run(k, &s, &full, None)
    };
    // No role yet: forbidden, with upstream's wording.
    let (success, _, err) = as_bot(&["get", "pods"]);
    assert!(
        !success && err.contains("User \"system:serviceaccount:default:bot\" cannot list resource \"pods\""),
        "{err}"
    );
    ok(k, &s, &["create", "rolebinding", "bot-view", "--clusterrole=view", "--serviceaccount=default:bot"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !as_bot(&["get", "pods"]).0 {
        assert!(Instant::now() < deadline, "the RoleBinding did not take effect");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(as_bot(&["auth", "can-i", "list", "pods"]).1.trim(), "yes");
    assert_eq!(as_bot(&["auth", "can-i", "delete", "pods"]).1.trim(), "no");
    assert_eq!(
        run(k, &s, &["auth", "can-i", "get", "secrets", "--as=system:serviceaccount:default:bot"], None).1.trim(),
        "no"
    );
    let (success, _, err) = as_bot(&["get", "secrets"]);
    assert!(!success && err.contains("Forbidden"), "{err}");
    let whoami = as_bot(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]).1;
    assert_eq!(whoami, "system:serviceaccount:default:bot");
    // A token that is not ours is refused.
    let (success, _, err) = run(k, &s, &["--token", "not-a-token", "get", "pods"], None);
    assert!(!success && err.contains("Unauthorized"), "{err}");
    // The node join token authenticates as a bootstrapper, which may create CSRs only.
    let join = std::fs::read_to_string(s.dir.path().join("server/token")).expect("token file");
    let (_, whoami, _) =
        run(k, &s, &["--token", join.trim(), "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"], None);
    assert_eq!(whoami, "system:ferrok:node-bootstrap");
    let (_, can, _) =
        run(k, &s, &["--token", join.trim(), "auth", "can-i", "create", "certificatesigningrequests"], None);
    assert_eq!(can.trim(), "yes");
}

#[test]
fn delete_propagation_policies() {
    let s = Server::start();
    let k = &kubectl_binaries()[0];
    for name in ["fg", "orphan", "bg"] {
        ok_stdin(
            k,
            &s,
            &["apply", "-f", "-"],
            &format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}}}}"#),
        );
    }
    // Background deletes at once; Foreground and Orphan go through the
    // garbage collector's finalizers (tests/controllers.rs looks closer).
    ok(k, &s, &["delete", "cm", "bg", "--cascade=background"]);
    assert!(run(k, &s, &["get", "cm", "bg"], None).2.contains("NotFound"));
    ok(k, &s, &["delete", "cm", "fg", "--cascade=foreground"]);
    ok(k, &s, &["delete", "cm", "orphan", "--cascade=orphan"]);
    for name in ["fg", "orphan"] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !run(k, &s, &["get", "cm", name], None).2.contains("NotFound") {
            assert!(Instant::now() < deadline, "{name} was not deleted");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let err = fails(k, &s, &["delete", "cm", "missing", "--cascade=foreground"], None);
    assert!(err.contains("NotFound"), "{err}");
}
