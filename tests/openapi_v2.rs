//! `/openapi/v2`: the whole API as one Swagger 2.0 document, as JSON and as
//! gnostic's protobuf, built from what the server serves. The Deployment
//! PATCH operation carries `dryRun` and its group-version-kind (what
//! kubectl's server-side dry-run check looks for); a CRD version's
//! definition appears under upstream's name and content and goes with
//! the CRD; ETags give 304s; kubectl 1.27 reads the protobuf form for
//! `explain --output plaintext-openapiv2` and `diff`.
//!
//! kubectl 1.20 (the conformance kit's, which validates manifests and
//! explains kinds from this document alone), 1.27 and 1.33 explain,
//! validate, diff and dry-run built-in kinds and custom resources.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use axum::http::HeaderMap;
use serde_json::{json, Value};

const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const WIDGET: &str = "com.example.openapi.v1.Widget";

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.openapi.example.com}
spec:
  group: openapi.example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        description: Widget for testing
        type: object
        properties:
          spec:
            type: object
            description: Specification of the widget
            required: [size, color]
            properties:
              size: {type: integer, description: How big the widget is., default: 3, minimum: 1}
              color: {type: string, nullable: true, description: Its color.}
              extra: {type: object, x-kubernetes-preserve-unknown-fields: true, properties: {a: {type: string}}}
              choice: {type: string, anyOf: [{pattern: "^a"}, {pattern: "^b"}]}
"#;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: example.com/httpd:2.4
        env: [{name: A, value: "1"}]
"#;

/// `kubectl.1.NN` beside the file `kubectl` links to.
fn kubectl_minor(minor: u32) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    let kubectl = path
        .split(':')
        .map(|d| std::path::PathBuf::from(d).join("kubectl"))
        .find(|p| p.exists())
        .expect("kubectl on PATH");
    let real = std::fs::canonicalize(kubectl).expect("kubectl");
    real.with_file_name(format!("kubectl.1.{minor}")).to_string_lossy().into_owned()
}

/// Runs `bin` against `s` with `stdin`: exit code and stdout+stderr.
fn run_kubectl(s: &common::ApiServer, bin: &str, args: &[&str], stdin: &str) -> (i32, String) {
    use std::io::Write;
    let mut child = Command::new(bin)
        .env("KUBECONFIG", s.kubeconfig())
        .env("HOME", s.dir.path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("wait");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// GET /openapi/v2 with `accept` and, when given, `If-None-Match`.
async fn get(client: &kube::Client, accept: &str, etag: Option<&str>) -> (u16, HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt;
    let mut req = axum::http::Request::builder().uri("/openapi/v2");
    if !accept.is_empty() {
        req = req.header("Accept", accept);
    }
    if let Some(etag) = etag {
        req = req.header("If-None-Match", etag);
    }
    let req = req.body(kube::client::Body::empty()).expect("request");
    let resp = client.send(req).await.expect("GET /openapi/v2");
    let (code, headers) = (resp.status().as_u16(), resp.headers().clone());
    (code, headers, resp.into_body().collect().await.expect("body").to_bytes().to_vec())
}

fn etag_of(headers: &HeaderMap) -> String {
    headers.get("etag").and_then(|v| v.to_str().ok()).expect("an ETag").to_string()
}

/// The document as JSON, polling with the last ETag until `pred` holds.
async fn wait_for_document(client: &kube::Client, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (mut etag, mut doc): (Option<String>, Value) = (None, Value::Null);
    loop {
        let (code, headers, body) = get(client, "", etag.as_deref()).await;
        match code {
            304 => {}
            200 => {
                etag = Some(etag_of(&headers));
                doc = serde_json::from_slice(&body).expect("JSON document");
            }
            other => panic!("GET /openapi/v2 answered {other}"),
        }
        if pred(&doc) {
            return doc;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn without_added_properties(mut d: Value) -> Value {
    for p in ["apiVersion", "kind", "metadata"] {
        d["properties"].as_object_mut().expect("properties").remove(p);
    }
    d.as_object_mut().expect("definition").remove("x-kubernetes-group-version-kind");
    d
}

#[tokio::test(flavor = "multi_thread")]
async fn swagger_document_as_json_and_protobuf_follows_the_registry() {
    let server = tokio::task::spawn_blocking(common::ApiServer::start).await.expect("start");
    let client = common::kube_client(&server.kubeconfig()).await;

    // JSON: the Deployment PATCH operation and definition.
    let (code, headers, body) = get(&client, "application/json", None).await;
    assert_eq!(code, 200);
    assert_eq!(headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/json"));
    let doc: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(doc["swagger"], "2.0");
    assert_eq!(doc["info"]["title"], "Kubernetes");
    let patch = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    assert_eq!(patch["operationId"], "patchAppsV1NamespacedDeployment");
    assert_eq!(patch["x-kubernetes-action"], "patch");
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({"group": "apps", "kind": "Deployment", "version": "v1"})
    );
    let dry_run = patch["parameters"].as_array().expect("parameters").iter().find(|p| p["name"] == "dryRun").cloned();
    assert_eq!(dry_run.expect("an inline dryRun")["in"], "query");
    let deployment = &doc["definitions"]["io.k8s.api.apps.v1.Deployment"];
    assert_eq!(
        deployment["x-kubernetes-group-version-kind"],
        json!([{"group": "apps", "kind": "Deployment", "version": "v1"}])
    );
    assert_eq!(
        deployment["properties"]["metadata"]["$ref"],
        "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    assert_eq!(doc["securityDefinitions"]["BearerToken"]["type"], "apiKey");

    // The same document again: 304, JSON and protobuf each with their ETag.
    let etag = etag_of(&headers);
    let (code, again, body) = get(&client, "application/json", Some(&etag)).await;
    assert_eq!((code, body.len()), (304, 0));
    assert_eq!(etag_of(&again), etag);
    let (code, proto_headers, proto) = get(&client, PROTOBUF, None).await;
    assert_eq!(code, 200);
    assert_eq!(
        proto_headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
    );
    assert!(proto.starts_with(b"\x0a\x032.0"), "field 1 (swagger) comes first");
    assert_ne!(etag_of(&proto_headers), etag);
    assert_eq!(get(&client, PROTOBUF, Some(&etag_of(&proto_headers))).await.0, 304);
    assert_eq!(get(&client, "application/yaml", None).await.0, 406);

    // A CRD version's definition: upstream's name and content.
    common::apply(&server, CRD);
    let doc = wait_for_document(&client, "the Widget definition", |d| d["definitions"].get(WIDGET).is_some()).await;
    assert_ne!(get(&client, "application/json", Some(&etag)).await.0, 304, "the ETag changed with the CRD");
    let widget = doc["definitions"][WIDGET].clone();
    assert_eq!(
        widget["x-kubernetes-group-version-kind"],
        json!([{"group": "openapi.example.com", "kind": "Widget", "version": "v1"}])
    );
    assert_eq!(
        widget["properties"]["metadata"]["$ref"],
        "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    assert_eq!(widget["properties"]["apiVersion"]["type"], "string");
    assert_eq!(
        without_added_properties(widget),
        json!({"description": "Widget for testing", "type": "object", "properties": {"spec": {
        "type": "object", "description": "Specification of the widget", "required": ["size"], "properties": {
            "size": {"type": "integer", "description": "How big the widget is.", "minimum": 1},
            "color": {"description": "Its color."},
            "extra": {"x-kubernetes-preserve-unknown-fields": true},
            "choice": {"type": "string"},
        }}}})
    );
    assert!(doc["definitions"].get("com.example.openapi.v1.WidgetList").is_some());
    let status_patch =
        &doc["paths"]["/apis/openapi.example.com/v1/namespaces/{namespace}/widgets/{name}/status"]["patch"];
    assert_eq!(status_patch["operationId"], "patchOpenapiExampleComV1NamespacedWidgetStatus");

    // kubectl 1.27 reads the protobuf form.
    let kubectl = kubectl_minor(27);
    let (code, out) =
        run_kubectl(&server, &kubectl, &["explain", "widgets.spec", "--output", "plaintext-openapiv2"], "");
    assert_eq!(code, 0, "{out}");
    for want in ["Specification of the widget", "size\t<integer> -required-", "How big the widget is.", "color\t<>"] {
        assert!(out.contains(want), "explain lacks {want:?}:\n{out}");
    }
    let (code, out) = run_kubectl(
        &server,
        &kubectl,
        &["explain", "deployments.spec.template.spec.containers.env", "--output", "plaintext-openapiv2"],
        "",
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("valueFrom\t<Object>") && out.contains("EnvVar represents"), "{out}");
    let (code, out) =
        run_kubectl(&server, &kubectl, &["explain", "widgets.spec.nothing", "--output", "plaintext-openapiv2"], "");
    assert!(code != 0 && out.contains("does not exist"), "{out}");

    // kubectl 1.27 diff downloads /openapi/v2 and shows the change.
    let (code, out) = run_kubectl(&server, &kubectl, &["create", "-f", "-"], DEPLOYMENT);
    assert_eq!(code, 0, "{out}");
    let changed = DEPLOYMENT.replace("example.com/httpd:2.4", "example.com/busybox:1.36");
    let (code, out) = run_kubectl(&server, &kubectl, &["diff", "-v=6", "-f", "-"], &changed);
    assert_eq!(code, 1, "a difference: {out}");
    let read_v2 = out.lines().any(|l| l.contains("/openapi/v2") && l.contains("200 OK"));
    assert!(read_v2, "kubectl diff read the v2 document: {out}");
    assert!(out.contains("-        image: example.com/httpd:2.4"), "{out}");
    assert!(out.contains("+        image: example.com/busybox:1.36"), "{out}");
    let (code, out) = run_kubectl(&server, &kubectl, &["diff", "-f", "-"], DEPLOYMENT);
    assert_eq!(code, 0, "no difference: {out}");

    // The definition goes with the CRD.
    let (ok, out) = common::kubectl(&server, &["delete", "crd", "widgets.openapi.example.com"]);
    assert!(ok, "{out}");
    let doc =
        wait_for_document(&client, "the Widget definition to go", |d| d["definitions"].get(WIDGET).is_none()).await;
    assert!(doc["paths"].get("/apis/openapi.example.com/v1/namespaces/{namespace}/widgets").is_none());
    assert!(doc["definitions"].get("io.k8s.api.apps.v1.Deployment").is_some());
}

/// The conformance kit's kubectl 1.20, which reads only `/openapi/v2`.
const KUBECTL_1_20: &str = "/var/tmp/ferrok-conformance/kubectl";

const FOO_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: foos.clients.example.com}
spec:
  group: clients.example.com
  scope: Namespaced
  names: {plural: foos, singular: foo, kind: Foo}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        description: Foo CRD for testing
        type: object
        properties:
          spec:
            type: object
            description: Specification of Foo
            properties:
              bars:
                description: List of Bars and their specs.
                type: array
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {type: string, description: Name of Bar.}
                    age: {type: string, description: Age of Bar.}
"#;

const BAD_DEPLOYMENT: &str = r#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bad", "namespace": "default"},
 "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
  "spec": {"containers": [{"name": "c", "image": "example.com/c:1", "imagePullPolicyy": "Always"}]}}}}"#;

fn foo(spec: &str) -> String {
    format!(
        r#"{{"apiVersion": "clients.example.com/v1", "kind": "Foo", "metadata": {{"name": "f", "namespace": "default"}}, "spec": {spec}}}"#
    )
}

/// The image of the Deployment `web`.
fn image_of_web(s: &common::ApiServer) -> String {
    let args = ["get", "deployment", "web", "-o", "jsonpath={.spec.template.spec.containers[0].image}"];
    let (ok, out) = common::kubectl(s, &args);
    assert!(ok, "{out}");
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn old_and_new_kubectl_explain_validate_diff_and_dry_run() {
    let server = tokio::task::spawn_blocking(common::ApiServer::start).await.expect("start");
    let client = common::kube_client(&server.kubeconfig()).await;
    common::apply(&server, FOO_CRD);
    wait_for_document(&client, "the Foo definition", |d| d["definitions"].get("com.example.clients.v1.Foo").is_some())
        .await;
    common::create(&server, DEPLOYMENT);

    let mut clients = vec![(27, kubectl_minor(27)), (33, kubectl_minor(33))];
    if std::path::Path::new(KUBECTL_1_20).exists() {
        clients.insert(0, (20, KUBECTL_1_20.to_string()));
    } else {
        eprintln!("{KUBECTL_1_20} is missing (scripts/conformance builds it): kubectl 1.20 is not tried");
    }
    for (minor, kubectl) in &clients {
        let run = |args: &[&str], stdin: &str| run_kubectl(&server, kubectl, args, stdin);
        // explain, from the v2 document (1.20 reads nothing else; the others when asked).
        let v2: &[&str] = if *minor == 20 { &[] } else { &["--output", "plaintext-openapiv2"] };
        let explain = |what: &str| run(&[&["explain", what][..], v2].concat(), "");
        let (code, out) = explain("deployments");
        assert_eq!(code, 0, "1.{minor}: {out}");
        assert!(out.contains("Deployment enables declarative updates"), "1.{minor}: {out}");
        assert!(out.contains("metadata\t<Object>\n"), "1.{minor}: metadata is not required: {out}");
        let (code, out) = explain("deployments.spec.strategy");
        assert!(code == 0 && out.contains("rollingUpdate\t<Object>"), "1.{minor}: {out}");
        let (code, out) = explain("foos.spec.bars");
        assert_eq!(code, 0, "1.{minor}: {out}");
        for want in ["List of Bars and their specs.", "name\t<string> -required-", "Name of Bar."] {
            assert!(out.contains(want), "1.{minor}: explain lacks {want:?}: {out}");
        }
        let (code, out) = explain("foos.spec.bars2");
        assert!(code != 0 && out.contains(r#"field "bars2" does not exist"#), "1.{minor}: {out}");
        if *minor != 20 {
            // From the v3 documents, kubectl's default since 1.27.
            let (code, out) = run(&["explain", "deployments.spec.strategy"], "");
            assert!(code == 0 && out.contains("rollingUpdate"), "1.{minor}: {out}");
        }

        // --validate=true: kubectl 1.20 checks the manifest against the v2
        // document; later ones ask the server for strict field validation.
        let (code, out) = run(&["create", "--validate=true", "-f", "-"], BAD_DEPLOYMENT);
        assert!(code != 0 && out.contains("unknown field") && out.contains("imagePullPolicyy"), "1.{minor}: {out}");
        let (code, out) = run(&["create", "--validate=true", "-f", "-"], &foo(r#"{"foo": true}"#));
        assert!(code != 0 && out.contains("unknown field") && out.contains("foo"), "1.{minor}: {out}");
        let (code, out) = run(&["create", "--validate=true", "-f", "-"], &foo(r#"{"bars": [{"age": "10"}]}"#));
        let missing =
            if *minor == 20 { r#"missing required field "name""# } else { "spec.bars[0].name: Required value" };
        assert!(code != 0 && out.contains(missing), "1.{minor}: {out}");
        let (code, out) = run(&["create", "--validate=true", "-f", "-"], &foo(r#"{"bars": [{"name": "b"}]}"#));
        assert_eq!(code, 0, "1.{minor}: {out}");
        let (ok, out) = common::kubectl(&server, &["delete", "foos", "f"]);
        assert!(ok, "{out}");

        // diff and server-side dry-run change nothing.
        let changed = DEPLOYMENT.replace("example.com/httpd:2.4", "example.com/busybox:1.36");
        let (code, out) = run(&["diff", "-f", "-"], &changed);
        assert_eq!(code, 1, "1.{minor}: a difference: {out}");
        assert!(out.contains("example.com/httpd:2.4") && out.contains("example.com/busybox:1.36"), "1.{minor}: {out}");
        let (code, out) = run(&["apply", "--dry-run=server", "-f", "-"], &changed);
        assert!(code == 0 && out.contains("(server dry run)"), "1.{minor}: {out}");
        let patch =
            r#"{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"example.com/busybox:1.36"}]}}}}"#;
        // kubectl 1.20 patches with dryRun=All only when the v2 document's
        // PATCH operation of the kind takes `dryRun`, else it refuses.
        let (code, out) = run(&["patch", "deployment", "web", "-p", patch, "--dry-run=server"], "");
        assert!(code == 0 && out.contains("patched"), "1.{minor}: {out}");
        assert_eq!(image_of_web(&server), "example.com/httpd:2.4", "1.{minor}: dry runs changed nothing");
        let (code, out) = run(&["apply", "--dry-run=server", "-f", "-"], &foo(r#"{"bars": [{"name": "b"}]}"#));
        assert!(code == 0 && out.contains("(server dry run)"), "1.{minor}: {out}");
        let (ok, out) = common::kubectl(&server, &["get", "foos"]);
        assert!(ok && out.contains("No resources found"), "1.{minor}: the dry-run made no Foo: {out}");
    }
}
