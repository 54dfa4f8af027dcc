//! Admission webhooks over HTTPS and the built-in plugins, driven by
//! kubectl against `ferrok server`; the webhook is a small Python server.

mod common;

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use base64::Engine;

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out =
        Command::new("openssl").current_dir(dir).args(args).output().expect("openssl is installed (scripts/deps)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().expect("dir"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    if let Some(s) = stdin {
        child.stdin.take().expect("stdin").write_all(s.as_bytes()).expect("write");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The test's webhook (tests/fixtures/webhook.py) on a free port, serving
/// a certificate for 127.0.0.1 from a CA of its own in `d`: the process,
/// its port and the CA (base64 PEM, a caBundle).
fn start_webhook(d: &Path) -> (Child, u16, String) {
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=hook-ca",
        ],
    );
    std::fs::write(d.join("ext"), "subjectAltName=IP:127.0.0.1\n").expect("ext");
    openssl(
        d,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "hook.key",
            "-out",
            "hook.csr",
            "-subj",
            "/CN=hook",
        ],
    );
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "hook.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "hook.crt",
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );

    let hook_port = common::free_port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/webhook.py");
    let mut hook = Command::new("python3")
        .arg(&script)
        .arg(hook_port.to_string())
        .arg(d.join("hook.crt"))
        .arg(d.join("hook.key"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 webhook");
    let mut line = String::new();
    std::io::BufReader::new(hook.stdout.take().expect("stdout")).read_line(&mut line).expect("webhook ready line");
    assert_eq!(line.trim(), "ready");

    let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(d.join("ca.crt")).expect("ca"));
    (hook, hook_port, ca)
}

#[test]
fn webhooks_and_builtin_plugins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (hook, hook_port, ca) = start_webhook(dir.path());
    let server = common::ApiServer::start();
    let _procs = Procs(vec![hook]);
    let kc = server.kubeconfig();

    let hooks = format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
  {{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration","metadata":{{"name":"deny"}},
    "webhooks":[{{"name":"deny.example.com","clientConfig":{{"url":"https://127.0.0.1:{hook_port}/validate","caBundle":"{ca}"}},
      "rules":[{{"operations":["CREATE","UPDATE"],"apiGroups":[""],"apiVersions":["v1"],"resources":["configmaps"]}}],
      "sideEffects":"None","admissionReviewVersions":["v1"]}}]}},
  {{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingWebhookConfiguration","metadata":{{"name":"mutate"}},
    "webhooks":[{{"name":"mutate.example.com","clientConfig":{{"url":"https://127.0.0.1:{hook_port}/mutate","caBundle":"{ca}"}},
      "rules":[{{"operations":["CREATE"],"apiGroups":[""],"apiVersions":["v1"],"resources":["configmaps"]}}],
      "objectSelector":{{"matchExpressions":[{{"key":"skip","operator":"DoesNotExist"}}]}},
      "sideEffects":"None","admissionReviewVersions":["v1"]}}]}}
]}}"#
    );
    let (ok, _, err) = kubectl(&kc, &["apply", "-f", "-"], Some(&hooks));
    assert!(ok, "{err}");

    let (ok, _, err) =
        kubectl(&kc, &["create", "-f", "-"], Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#));
    assert!(ok, "{err}");
    let (_, labels, _) = kubectl(&kc, &["get", "cm", "a", "-o", "jsonpath={.metadata.labels.mutated}"], None);
    assert_eq!(labels, "yes");
    let (ok, _, err) = kubectl(
        &kc,
        &["create", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b","labels":{"deny":"yes"}}}"#),
    );
    assert!(!ok);
    assert!(err.contains("admission webhook \"deny.example.com\" denied the request: labelled deny=yes"), "{err}");
    // A refusal with only a reason (and no code) reads its reason, as a 400.
    let (ok, _, err) = kubectl(
        &kc,
        &["create", "-f", "-", "-v=6"],
        Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b","labels":{"deny":"reason"}}}"#),
    );
    assert!(!ok);
    assert!(
        err.contains("admission webhook \"deny.example.com\" denied the request: the configmap is unwanted"),
        "{err}"
    );
    assert!(err.contains("400 Bad Request"), "{err}");
    let (ok, _, _) = kubectl(
        &kc,
        &["create", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","labels":{"skip":"1"}}}"#),
    );
    assert!(ok);
    let (_, labels, _) = kubectl(&kc, &["get", "cm", "c", "-o", "jsonpath={.metadata.labels}"], None);
    assert!(!labels.contains("mutated"), "{labels}");
    // An update that adds the label is denied too; nothing half-written stays.
    let (ok, _, _) = kubectl(&kc, &["label", "cm", "a", "deny=yes"], None);
    assert!(!ok);
    let (_, labels, _) = kubectl(&kc, &["get", "cm", "a", "-o", "jsonpath={.metadata.labels}"], None);
    assert!(!labels.contains("deny"), "{labels}");

    // ResourceQuota and LimitRanger.
    let quota = r#"{"apiVersion":"v1","kind":"List","items":[
  {"apiVersion":"v1","kind":"ResourceQuota","metadata":{"name":"q"},"spec":{"hard":{"count/secrets":"1"}}},
  {"apiVersion":"v1","kind":"LimitRange","metadata":{"name":"l"},"spec":{"limits":[{"type":"Container","default":{"cpu":"200m"},"defaultRequest":{"cpu":"100m"}}]}}
]}"#;
    let (ok, _, err) = kubectl(&kc, &["apply", "-f", "-"], Some(quota));
    assert!(ok, "{err}");
    // As upstream, a quota constrains once the controller has computed its usage.
    common::eventually("the quota's usage computed", || {
        let (_, used, _) = kubectl(&kc, &["get", "quota", "q", "-o", "jsonpath={.status.used['count/secrets']}"], None);
        !used.is_empty()
    });
    let (ok, _, err) = kubectl(&kc, &["create", "secret", "generic", "s1", "--from-literal=a=b"], None);
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&kc, &["create", "secret", "generic", "s2", "--from-literal=a=b"], None);
    assert!(!ok);
    assert!(err.contains("exceeded quota: q"), "{err}");
    let (ok, _, err) = kubectl(&kc, &["run", "p", "--image=busybox:1.36"], None);
    assert!(ok, "{err}");
    let (_, res, _) = kubectl(&kc, &["get", "pod", "p", "-o", "jsonpath={.spec.containers[0].resources.requests.cpu} {.spec.containers[0].resources.limits.cpu} {.spec.serviceAccountName}"], None);
    assert_eq!(res, "100m 200m default");
    // A container's limits are its requests where it names none (upstream's
    // pod defaulting, before LimitRanger): cpu is requested at its own
    // limit, not at the LimitRange's defaultRequest.
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"partial"},"spec":{
  "initContainers":[{"name":"i","image":"busybox:1.36","resources":{"limits":{"memory":"64Mi"}}}],
  "containers":[{"name":"c","image":"busybox:1.36","resources":{"requests":{"memory":"150Mi"},"limits":{"cpu":"300m","memory":"200Mi"}}}]}}"#;
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(pod));
    assert!(ok, "{err}");
    let (_, res, _) = kubectl(
        &kc,
        &[
            "get",
            "pod",
            "partial",
            "-o",
            "jsonpath={.spec.containers[0].resources.requests} {.spec.initContainers[0].resources.requests}",
        ],
        None,
    );
    let (requests, init_requests) = res.split_once(' ').expect("two maps");
    let requests: serde_json::Value = serde_json::from_str(requests).expect("requests");
    let init_requests: serde_json::Value = serde_json::from_str(init_requests).expect("init requests");
    assert_eq!(requests, serde_json::json!({"cpu": "300m", "memory": "150Mi"}), "{res}");
    assert_eq!(init_requests, serde_json::json!({"cpu": "100m", "memory": "64Mi"}), "{res}");
    // A template is not defaulted so: its pods are, when they are made.
    let template = r#"{"apiVersion":"v1","kind":"PodTemplate","metadata":{"name":"t"},"template":{"spec":{
  "containers":[{"name":"c","image":"busybox:1.36","resources":{"limits":{"cpu":"300m"}}}]}}}"#;
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(template));
    assert!(ok, "{err}");
    let (_, res, _) =
        kubectl(&kc, &["get", "podtemplate", "t", "-o", "jsonpath={.template.spec.containers[0].resources}"], None);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&res).ok(),
        Some(serde_json::json!({"limits": {"cpu": "300m"}})),
        "{res}"
    );

    // LimitRanger's bounds: a container under its min or over its max, and
    // a claim over its max, are refused, each for what it breaks.
    let bounds = r#"{"apiVersion":"v1","kind":"LimitRange","metadata":{"name":"bounds"},"spec":{"limits":[
  {"type":"Container","min":{"cpu":"50m"},"max":{"cpu":"500m"}},
  {"type":"PersistentVolumeClaim","max":{"storage":"1Gi"}}]}}"#;
    let (ok, _, err) = kubectl(&kc, &["apply", "-f", "-"], Some(bounds));
    assert!(ok, "{err}");
    let sized = |name: &str, resources: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}"}},"spec":{{
  "containers":[{{"name":"c","image":"busybox:1.36","resources":{resources}}}]}}}}"#
        )
    };
    common::eventually("the bounds to hold", || {
        let (ok, _, _) = kubectl(
            &kc,
            &["create", "--dry-run=server", "-f", "-"],
            Some(&sized("probe", r#"{"requests":{"cpu":"10m"}}"#)),
        );
        !ok
    });
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(&sized("small", r#"{"requests":{"cpu":"10m"}}"#)));
    assert!(!ok);
    assert!(
        err.contains(r#"pods "small" is forbidden: minimum cpu usage per Container is 50m, but request is 10m"#),
        "{err}"
    );
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(&sized("big", r#"{"limits":{"cpu":"600m"}}"#)));
    assert!(!ok);
    assert!(
        err.contains(r#"pods "big" is forbidden: maximum cpu usage per Container is 500m, but limit is 600m"#),
        "{err}"
    );
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(&sized("fits", r#"{"limits":{"cpu":"400m"}}"#)));
    assert!(ok, "{err}");
    let claim = r#"{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"huge"},
  "spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"2Gi"}}}}"#;
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(claim));
    assert!(!ok);
    assert!(
        err.contains(
            r#"persistentvolumeclaims "huge" is forbidden: maximum storage usage per PersistentVolumeClaim is 1Gi, but request is 2Gi"#
        ),
        "{err}"
    );
}

/// The Status of a refused request: its code and message.
async fn refused(client: &kube::Client, method: &str, uri: &str) -> (u16, String) {
    let (code, body) = common::raw(client, method, uri, "application/json", "").await;
    let status: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    (code, status["message"].as_str().unwrap_or_default().to_string())
}

/// What the test's webhook saw of a CONNECT it denied (it denies with the
/// review's request as its message).
fn seen_by_webhook(message: &str) -> serde_json::Value {
    let (_, seen) = message.split_once("denied the request: ").unwrap_or_else(|| panic!("not a denial: {message}"));
    serde_json::from_str(seen).unwrap_or_else(|e| panic!("{e}: {seen}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_requests_are_admitted_with_their_options() {
    use serde_json::json;
    let dir = tempfile::tempdir().expect("tempdir");
    let (hook, hook_port, ca) = start_webhook(dir.path());
    let server = common::ApiServer::start();
    let _procs = Procs(vec![hook]);
    let kc = server.kubeconfig();
    let client = common::kube_client(&kc).await;
    let connects = r#"["pods/attach","pods/exec","pods/portforward","pods/proxy","services/proxy","nodes/proxy"]"#;
    let hooks = format!(
        r#"{{"apiVersion":"v1","kind":"List","items":[
  {{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration","metadata":{{"name":"connect"}},
    "webhooks":[{{"name":"connect.example.com","clientConfig":{{"url":"https://127.0.0.1:{hook_port}/validate","caBundle":"{ca}"}},
      "rules":[{{"operations":["CONNECT"],"apiGroups":[""],"apiVersions":["v1"],"resources":{connects}}}],
      "sideEffects":"None","admissionReviewVersions":["v1"]}}]}},
  {{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingWebhookConfiguration","metadata":{{"name":"connect-exec"}},
    "webhooks":[{{"name":"connect-exec.example.com","clientConfig":{{"url":"https://127.0.0.1:{hook_port}/mutate","caBundle":"{ca}"}},
      "rules":[{{"operations":["*"],"apiGroups":[""],"apiVersions":["v1"],"resources":["pods/exec"]}}],
      "sideEffects":"None","admissionReviewVersions":["v1"]}}]}}
]}}"#
    );
    let (ok, _, err) = kubectl(&kc, &["apply", "-f", "-"], Some(&hooks));
    assert!(ok, "{err}");
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"to-be-attached-pod"},
  "spec":{"containers":[{"name":"container1","image":"busybox:1.36"}]}}"#;
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(pod));
    assert!(ok, "{err}");

    // Attach (as `kubectl attach -i -c container1` asks it, by POST or by a
    // WebSocket's GET): the webhook reviews a PodAttachOptions and refuses.
    let pods = "/api/v1/namespaces/default/pods/to-be-attached-pod";
    for method in ["POST", "GET"] {
        let (code, message) =
            refused(&client, method, &format!("{pods}/attach?container=container1&stdin=true&stdout=true")).await;
        assert_eq!(code, 403, "{message}");
        assert!(message.starts_with("admission webhook \"connect.example.com\" denied the request: "), "{message}");
        assert_eq!(
            seen_by_webhook(&message),
            json!({"kind": {"group": "", "version": "v1", "kind": "PodAttachOptions"},
                "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "attach",
                "name": "to-be-attached-pod", "namespace": "default", "operation": "CONNECT",
                "object": {"kind": "PodAttachOptions", "apiVersion": "v1", "stdin": true, "stdout": true,
                    "container": "container1"}})
        );
    }
    let (_, message) = refused(&client, "POST", &format!("{pods}/portforward?ports=8080&ports=9090")).await;
    assert_eq!(
        seen_by_webhook(&message)["object"],
        json!({"kind": "PodPortForwardOptions", "apiVersion": "v1", "ports": [8080, 9090]})
    );
    let (_, message) = refused(&client, "GET", &format!("{pods}/proxy/some/path?q=1")).await;
    let seen = seen_by_webhook(&message);
    assert_eq!((&seen["subResource"], &seen["name"]), (&json!("proxy"), &json!("to-be-attached-pod")), "{seen}");
    assert_eq!(seen["object"], json!({"kind": "PodProxyOptions", "apiVersion": "v1", "path": "/some/path"}));
    let (_, message) = refused(&client, "GET", "/api/v1/namespaces/default/services/https:web:443/proxy/healthz").await;
    let seen = seen_by_webhook(&message);
    assert_eq!(seen["name"], "https:web:443", "the name as the path gives it: {seen}");
    assert_eq!(seen["object"], json!({"kind": "ServiceProxyOptions", "apiVersion": "v1", "path": "/healthz"}));
    let (_, message) = refused(&client, "GET", "/api/v1/nodes/n1/proxy/stats/summary").await;
    let seen = seen_by_webhook(&message);
    assert_eq!(seen["namespace"], serde_json::Value::Null, "a node has none: {seen}");
    assert_eq!(seen["object"], json!({"kind": "NodeProxyOptions", "apiVersion": "v1", "path": "/stats/summary"}));

    // An attach the webhook allows goes on to the pod (which has no node).
    let (code, message) = refused(&client, "POST", &format!("{pods}/attach?container=allowed&stdin=true")).await;
    assert_eq!((code, message.as_str()), (400, "container allowed is not valid for pod to-be-attached-pod"));
    // The mutating webhook makes every exec's container "allowed": the
    // validating one then lets it through, and the pod has no such container.
    let (code, message) =
        refused(&client, "POST", &format!("{pods}/exec?container=container1&command=ls&stdout=true")).await;
    assert_eq!((code, message.as_str()), (400, "container allowed is not valid for pod to-be-attached-pod"));
}

#[test]
fn webhook_call_errors_read_as_upstreams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (hook, hook_port, ca) = start_webhook(dir.path());
    let server = common::ApiServer::start();
    let _procs = Procs(vec![hook]);
    let kc = server.kubeconfig();
    // A webhook slower than its timeout, and one behind a Service that does
    // not exist, each for the ConfigMaps labelled for it.
    let hooks = format!(
        r#"{{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration","metadata":{{"name":"failing"}},
    "webhooks":[
      {{"name":"slow.example.com","clientConfig":{{"url":"https://127.0.0.1:{hook_port}/slow","caBundle":"{ca}"}},
        "rules":[{{"operations":["CREATE"],"apiGroups":[""],"apiVersions":["v1"],"resources":["configmaps"]}}],
        "objectSelector":{{"matchLabels":{{"hook":"slow"}}}},"timeoutSeconds":1,"failurePolicy":"Fail",
        "sideEffects":"None","admissionReviewVersions":["v1"]}},
      {{"name":"gone.example.com","clientConfig":{{"service":{{"namespace":"default","name":"gone","path":"/check"}},"caBundle":"{ca}"}},
        "rules":[{{"operations":["CREATE"],"apiGroups":[""],"apiVersions":["v1"],"resources":["configmaps"]}}],
        "objectSelector":{{"matchLabels":{{"hook":"gone"}}}},"failurePolicy":"Fail",
        "sideEffects":"None","admissionReviewVersions":["v1"]}}]}}"#
    );
    let (ok, _, err) = kubectl(&kc, &["apply", "-f", "-"], Some(&hooks));
    assert!(ok, "{err}");
    let cm = |name: &str, hook: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","labels":{{"hook":"{hook}"}}}}}}"#
        )
    };
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(&cm("a", "slow")));
    assert!(!ok);
    let want = format!(
        "Internal error occurred: failed calling webhook \"slow.example.com\": failed to call webhook: \
         Post \"https://127.0.0.1:{hook_port}/slow?timeout=1s\": context deadline exceeded"
    );
    assert!(err.contains(&want), "{err}");
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(&cm("b", "gone")));
    assert!(!ok);
    let want = "Internal error occurred: failed calling webhook \"gone.example.com\": failed to call webhook: \
                Post \"https://gone.default.svc:443/check?timeout=10s\": ";
    assert!(err.contains(want), "{err}");
}

/// What a mutating webhook returns is read back as the resource: fields
/// the type, or a custom resource's schema, does not know are dropped (the
/// conformance spec "should mutate custom resource with pruning").
#[test]
fn a_webhooks_mutation_is_pruned_to_the_resource() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (hook, hook_port, ca) = start_webhook(dir.path());
    let server = common::ApiServer::start();
    let _procs = Procs(vec![hook]);
    let kc = server.kubeconfig();
    let crd = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
  "metadata":{"name":"widgets.hooks.example.com"},
  "spec":{"group":"hooks.example.com","scope":"Namespaced","names":{"plural":"widgets","singular":"widget","kind":"Widget"},
    "versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object",
      "properties":{"spec":{"type":"object","properties":{"size":{"type":"string"},"stage":{"type":"string"}}}}}}}]}}"#;
    let (ok, _, err) = kubectl(&kc, &["create", "-f", "-"], Some(crd));
    assert!(ok, "{err}");
    let hooks = format!(
        r#"{{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingWebhookConfiguration","metadata":{{"name":"fields"}},
    "webhooks":[{{"name":"fields.example.com","clientConfig":{{"url":"https://127.0.0.1:{hook_port}/mutate-fields","caBundle":"{ca}"}},
      "rules":[{{"operations":["CREATE"],"apiGroups":["","hooks.example.com"],"apiVersions":["v1"],"resources":["widgets","configmaps"]}}],
      "sideEffects":"None","admissionReviewVersions":["v1"]}}]}}"#
    );
    let (ok, _, err) = kubectl(&kc, &["apply", "-f", "-"], Some(&hooks));
    assert!(ok, "{err}");
    let widget = r#"{"apiVersion":"hooks.example.com/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"size":"s"}}"#;
    common::eventually("widgets to be served", || kubectl(&kc, &["create", "-f", "-"], Some(widget)).0);
    let (_, out, _) = kubectl(&kc, &["get", "widget", "w", "-o", "json"], None);
    let w: serde_json::Value = serde_json::from_str(&out).expect("widget");
    assert_eq!(w["spec"], serde_json::json!({"size": "s", "stage": "mutated"}), "{w}");
    assert!(w.get("unknownTop").is_none(), "{w}");
    let (ok, _, err) = kubectl(
        &kc,
        &["create", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"a":"b"}}"#),
    );
    assert!(ok, "{err}");
    let (_, out, _) = kubectl(&kc, &["get", "cm", "c", "-o", "json"], None);
    let c: serde_json::Value = serde_json::from_str(&out).expect("configmap");
    assert!(c.get("unknownTop").is_none(), "{c}");
    assert_eq!(c["data"], serde_json::json!({"a": "b"}));
}
