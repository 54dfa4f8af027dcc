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

#[test]
fn webhooks_and_builtin_plugins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
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

    let server = common::ApiServer::start();
    let _procs = Procs(vec![hook]);
    let kc = server.kubeconfig();

    let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(d.join("ca.crt")).expect("ca"));
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
    // What the patch adds that a ConfigMap does not have is dropped, as
    // upstream decodes the patched object (pruned, for a custom resource).
    let (ok, json, err) = kubectl(&kc, &["get", "cm", "a", "-o", "json"], None);
    assert!(ok, "{err}");
    assert!(!json.contains("mutationUnknown"), "{json}");
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
}
