//! ferrok's built-in API surface held against upstream v1.33's, read from
//! `fixtures/upstream_v1_33_surface.json` (a table made from the
//! release-1.33 OpenAPI document and upstream's field label conversions):
//! every resource of every group/version upstream serves by default is
//! served with the same kind, scope, verbs, short names, categories and
//! subresources; every listed verb of every subresource is routed; no verb
//! upstream refuses is taken; and every field selector upstream accepts is
//! accepted (with the values upstream's typed objects give), every other
//! one refused in upstream's words.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use http_body_util::BodyExt;
use serde_json::{json, Value};

const FIXTURE: &str = include_str!("fixtures/upstream_v1_33_surface.json");

/// Group/versions a default v1.33 apiserver serves that ferrok does not,
/// each with its reason. Nothing else may be missing.
const NOT_SERVED: &[(&str, &str)] = &[];

/// Upstream's connect subresources, answered by proxying to the node's
/// kubelet API (logs, exec, attach, port-forward) or to the object (proxy).
/// Discovery lists them, and the test compares that listing, but their verbs
/// are not exercised here (this server has no node): tests/kubelet_api.rs,
/// tests/exec.rs and tests/logs.rs drive them against a real one.
/// A PKCS#10 request (CN=csr-1, P-256), base64: the API checks it.
const CSR_REQUEST: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0KTUlITE1ISUNBUUF3RURFT01Bd0dBMVVFQXd3RlkzTnlMVEV3V1RBVEJnY3Foa2pPUFFJQkJnZ3Foa2pPUFFNQgpCd05DQUFRUkRwZUQyb2dWVGpWbUtpRm9JckY2Qm1lbmFlajV3SFhwY3FkZnAzamp2ZGkrcTVFUUsyS2ZHRjdhCnhtNWtqdmcrcDZvL0JxZjVHQWJIR2FvdFAzK3ZvQUF3Q2dZSUtvWkl6ajBFQXdJRFNRQXdSZ0loQU8yN0JRVG4KT3R2QUQ2cXdTZStrdzI1SStSSlcxYTA2WTk1Y2ZZaTJYNEpPQWlFQStTczZONEdzTmxqUGlTWk1FVElmL2tuTApNOG5xcytUMVFTbjUvZHNIdWhzPQotLS0tLUVORCBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0K";

const THROUGH_THE_NODE: &[&str] = &["log", "exec", "attach", "portforward", "proxy"];

const ALL_VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

fn fixture() -> Value {
    serde_json::from_str(FIXTURE).expect("fixture is JSON")
}

async fn send(c: &kube::Client, method: &str, uri: &str, accept: &str, body: Option<&Value>) -> (u16, Value) {
    let ct = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
    let req = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("Accept", accept)
        .header("Content-Type", ct)
        .body(kube::client::Body::from(body.map(|b| b.to_string().into_bytes()).unwrap_or_default()))
        .expect("request");
    let resp = c.send(req).await.unwrap_or_else(|e| panic!("{method} {uri}: {e}"));
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())))
}

async fn get(c: &kube::Client, uri: &str) -> (u16, Value) {
    send(c, "GET", uri, "application/json", None).await
}

async fn post(c: &kube::Client, uri: &str, body: Value) -> Value {
    let (code, v) = send(c, "POST", uri, "application/json", Some(&body)).await;
    assert!(code == 201 || code == 200, "POST {uri}: {code} {v}");
    v
}

fn strs(v: &Value) -> BTreeSet<String> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

fn base(group_version: &str) -> String {
    if group_version.contains('/') {
        format!("/apis/{group_version}")
    } else {
        format!("/api/{group_version}")
    }
}

/// The default-served group/versions of the fixture that ferrok must serve.
fn served_group_versions(fx: &Value) -> Vec<&Value> {
    fx["groupVersions"]
        .as_array()
        .expect("groupVersions")
        .iter()
        .filter(|gv| gv["servedByDefault"] == true)
        .filter(|gv| !NOT_SERVED.iter().any(|(n, _)| gv["groupVersion"] == *n))
        .collect()
}

/// A fixture group/version's resources by name, as discovery should list them.
fn expected_resources(gv: &Value) -> BTreeMap<String, Value> {
    gv["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| (r["name"].as_str().unwrap_or_default().to_string(), expected_resource(r)))
        .collect()
}

/// One resource's facts in a comparable shape, from the fixture.
fn expected_resource(r: &Value) -> Value {
    let subs: BTreeMap<String, Value> = r["subresources"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let gv = s["group"].as_str().map(|g| format!("{g}/{}", s["version"].as_str().unwrap_or_default()));
            (
                s["name"].as_str().unwrap_or_default().to_string(),
                json!({"kind": s["kind"], "gv": gv, "verbs": strs(&s["verbs"])}),
            )
        })
        .collect();
    json!({
        "singularName": r["singularName"], "namespaced": r["namespaced"], "kind": r["kind"],
        "verbs": strs(&r["verbs"]), "shortNames": strs(&r["shortNames"]), "categories": strs(&r["categories"]),
        "subresources": subs,
    })
}

/// The same facts from ferrok's APIResourceList (`/api/v1`, `/apis/g/v`).
fn served_resources(list: &Value) -> BTreeMap<String, Value> {
    let entries = list["resources"].as_array().cloned().unwrap_or_default();
    let mut out: BTreeMap<String, Value> = BTreeMap::new();
    for e in entries.iter().filter(|e| !e["name"].as_str().unwrap_or_default().contains('/')) {
        let name = e["name"].as_str().unwrap_or_default();
        let subs: BTreeMap<String, Value> = entries
            .iter()
            .filter_map(|s| {
                let (parent, sub) = s["name"].as_str()?.split_once('/')?;
                (parent == name).then(|| {
                    let gv = s["group"].as_str().map(|g| format!("{g}/{}", s["version"].as_str().unwrap_or_default()));
                    let gv = gv.or_else(|| s["version"].as_str().map(|v| v.to_string())).filter(|gv| gv != "v1");
                    (sub.to_string(), json!({"kind": s["kind"], "gv": gv, "verbs": strs(&s["verbs"])}))
                })
            })
            .collect();
        out.insert(
            name.to_string(),
            json!({
                "singularName": e["singularName"], "namespaced": e["namespaced"], "kind": e["kind"],
                "verbs": strs(&e["verbs"]), "shortNames": strs(&e["shortNames"]), "categories": strs(&e["categories"]),
                "subresources": subs,
            }),
        );
    }
    out
}

/// Served by ferrok itself, where upstream's cluster has metrics-server
/// register it through aggregation (k3s ships one): not kube-apiserver's.
const METRICS_GV: &str = "metrics.k8s.io/v1beta1";

fn compare(what: &str, expected: &BTreeMap<String, Value>, served: &BTreeMap<String, Value>, gaps: &mut Vec<String>) {
    for (name, want) in expected {
        match served.get(name) {
            None => gaps.push(format!("{what}: {name} is not served")),
            Some(got) if got != want => gaps.push(format!("{what}: {name}\n  upstream: {want}\n  ferrok:   {got}")),
            Some(_) => {}
        }
    }
    for name in served.keys().filter(|n| !expected.contains_key(*n)) {
        gaps.push(format!("{what}: {name} is served, upstream has no such resource"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_matches_upstream_v1_33() {
    let server = tokio::task::spawn_blocking(ApiServer::start).await.expect("start");
    let c = kube_client(&server.kubeconfig()).await;
    let fx = fixture();
    let mut gaps = Vec::new();

    for gv in served_group_versions(&fx) {
        let name = gv["groupVersion"].as_str().expect("groupVersion");
        let (code, list) = get(&c, &base(name)).await;
        if code != 200 {
            gaps.push(format!("{name}: not served ({code})"));
            continue;
        }
        compare(name, &expected_resources(gv), &served_resources(&list), &mut gaps);
    }
    // Alpha and beta group/versions (off in a default upstream server) need
    // not be served; one that is served must match upstream's too.
    for gv in fx["groupVersions"].as_array().into_iter().flatten().filter(|gv| gv["servedByDefault"] == false) {
        let name = gv["groupVersion"].as_str().expect("groupVersion");
        let (code, list) = get(&c, &base(name)).await;
        if code == 404 {
            continue;
        }
        compare(name, &expected_resources(gv), &served_resources(&list), &mut gaps);
    }
    // Nothing served beyond upstream's group/versions.
    let (_, groups) = get(&c, "/apis").await;
    let known: BTreeSet<&str> =
        fx["groupVersions"].as_array().into_iter().flatten().filter_map(|g| g["groupVersion"].as_str()).collect();
    for g in groups["groups"].as_array().into_iter().flatten() {
        for v in g["versions"].as_array().into_iter().flatten() {
            let gv = v["groupVersion"].as_str().unwrap_or_default();
            if !known.contains(gv) && gv != METRICS_GV {
                gaps.push(format!("{gv}: served, upstream v1.33 has no such group/version"));
            }
        }
    }

    // The aggregated form (apidiscovery.k8s.io/v2) says the same.
    let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    let mut aggregated: BTreeMap<String, Value> = BTreeMap::new();
    for path in ["/api", "/apis"] {
        let (code, doc) = send(&c, "GET", path, accept, None).await;
        assert_eq!(code, 200, "{path}: {doc}");
        for item in doc["items"].as_array().into_iter().flatten() {
            let group = item["metadata"]["name"].as_str().unwrap_or_default();
            for v in item["versions"].as_array().into_iter().flatten() {
                let version = v["version"].as_str().unwrap_or_default();
                let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
                if gv == METRICS_GV {
                    continue;
                }
                for r in v["resources"].as_array().into_iter().flatten() {
                    let subs: BTreeMap<String, Value> = r["subresources"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|s| {
                            (
                                s["subresource"].as_str().unwrap_or_default().to_string(),
                                json!({"kind": s["responseKind"]["kind"], "verbs": strs(&s["verbs"])}),
                            )
                        })
                        .collect();
                    aggregated.insert(
                        format!("{gv} {}", r["resource"].as_str().unwrap_or_default()),
                        json!({
                            "singularName": r["singularResource"], "namespaced": r["scope"] == "Namespaced",
                            "kind": r["responseKind"]["kind"], "verbs": strs(&r["verbs"]),
                            "shortNames": strs(&r["shortNames"]), "categories": strs(&r["categories"]),
                            "subresources": subs,
                        }),
                    );
                }
            }
        }
    }
    let mut expected = BTreeMap::new();
    for gv in served_group_versions(&fx) {
        for r in gv["resources"].as_array().into_iter().flatten() {
            let mut e = expected_resource(r);
            for s in e["subresources"].as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
                s.as_object_mut().map(|o| o.remove("gv"));
            }
            expected.insert(
                format!(
                    "{} {}",
                    gv["groupVersion"].as_str().unwrap_or_default(),
                    r["name"].as_str().unwrap_or_default()
                ),
                e,
            );
        }
    }
    compare("aggregated discovery", &expected, &aggregated, &mut gaps);
    assert!(gaps.is_empty(), "{} differences from upstream v1.33:\n{}", gaps.len(), gaps.join("\n"));
}

/// The path of one (missing) object of resource `r` in group/version `gv`.
fn object_path(gv: &str, r: &Value, name: &str) -> String {
    let plural = r["name"].as_str().unwrap_or_default();
    if r["namespaced"] == true {
        format!("{}/namespaces/default/{plural}/{name}", base(gv))
    } else {
        format!("{}/{plural}/{name}", base(gv))
    }
}

fn method_of(verb: &str) -> &'static str {
    match verb {
        "get" | "list" | "watch" => "GET",
        "create" => "POST",
        "update" => "PUT",
        "patch" => "PATCH",
        _ => "DELETE",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_upstream_lists_is_routed_and_no_other() {
    let server = tokio::task::spawn_blocking(ApiServer::start).await.expect("start");
    let c = kube_client(&server.kubeconfig()).await;
    let fx = fixture();
    let mut gaps = Vec::new();
    const MISSING: &str = "surface-missing";

    for gv in served_group_versions(&fx) {
        let gv_name = gv["groupVersion"].as_str().unwrap_or_default();
        for r in gv["resources"].as_array().into_iter().flatten() {
            let plural = r["name"].as_str().unwrap_or_default();
            let verbs = strs(&r["verbs"]);
            // A verb upstream does not list is refused with 405, not served.
            for verb in ALL_VERBS.iter().filter(|v| !verbs.contains(**v)) {
                let named = matches!(*verb, "get" | "update" | "patch" | "delete");
                let uri = if named {
                    object_path(gv_name, r, MISSING)
                } else {
                    let p = object_path(gv_name, r, MISSING);
                    let mut p = p.rsplit_once('/').map(|(a, _)| a.to_string()).unwrap_or(p);
                    if *verb == "watch" {
                        p.push_str("?watch=true&timeoutSeconds=1");
                    }
                    p
                };
                let (code, body) = send(&c, method_of(verb), &uri, "application/json", Some(&json!({}))).await;
                if code != 405 {
                    gaps.push(format!("{gv_name} {plural}: {verb} answered {code}, upstream 405: {body}"));
                }
            }
            // Every subresource verb reaches the object: a missing one is a
            // NotFound naming it, not an unknown path or a refused method.
            for s in r["subresources"].as_array().into_iter().flatten() {
                let sub = s["name"].as_str().unwrap_or_default();
                if THROUGH_THE_NODE.contains(&sub) {
                    continue;
                }
                let uri = format!("{}/{sub}", object_path(gv_name, r, MISSING));
                let sub_verbs = strs(&s["verbs"]);
                for verb in ALL_VERBS.iter().filter(|v| !matches!(**v, "list" | "watch" | "deletecollection")) {
                    let body = json!({
                        "apiVersion": match s["group"].as_str() { Some(g) => format!("{g}/{}", s["version"].as_str().unwrap_or_default()), None => gv_name.to_string() },
                        "kind": s["kind"],
                        "metadata": {"name": MISSING, "namespace": "default"},
                        "target": {"kind": "Node", "name": "n"},
                    });
                    let (code, answer) = send(&c, method_of(verb), &uri, "application/json", Some(&body)).await;
                    let not_found = code == 404 && answer["details"]["name"] == MISSING;
                    if sub_verbs.contains(*verb) && !not_found {
                        gaps.push(format!(
                            "{gv_name} {plural}/{sub}: {verb} answered {code}, want NotFound for {MISSING}: {answer}"
                        ));
                    }
                    if !sub_verbs.contains(*verb) && code != 405 {
                        gaps.push(format!("{gv_name} {plural}/{sub}: {verb} answered {code}, upstream 405: {answer}"));
                    }
                }
            }
        }
    }
    assert!(gaps.is_empty(), "{} differences from upstream v1.33:\n{}", gaps.len(), gaps.join("\n"));

    // The subresources that read as their object give that object.
    let pods = "/api/v1/namespaces/default/pods";
    post(&c, pods, json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}))
        .await;
    for sub in ["status", "ephemeralcontainers", "resize"] {
        let (code, pod) = get(&c, &format!("{pods}/web/{sub}")).await;
        assert_eq!((code, &pod["kind"], &pod["metadata"]["name"]), (200, &json!("Pod"), &json!("web")), "{sub}: {pod}");
    }
    let csrs = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
    post(&c, csrs, json!({"metadata": {"name": "csr-1"}, "spec": {"request": CSR_REQUEST, "signerName": "example.com/s", "usages": ["client auth"]}})).await;
    for sub in ["approval", "status"] {
        let (code, csr) = get(&c, &format!("{csrs}/csr-1/{sub}")).await;
        assert_eq!((code, &csr["kind"]), (200, &json!("CertificateSigningRequest")), "{sub}: {csr}");
    }
    let (code, ns) = get(&c, "/api/v1/namespaces/default/status").await;
    assert_eq!((code, &ns["kind"]), (200, &json!("Namespace")), "{ns}");

    // The legacy bindings collection binds the pod its body names.
    let (code, answer) = send(&c, "POST", "/api/v1/namespaces/default/bindings", "application/json", Some(&json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "web"}, "target": {"kind": "Node", "name": "n1"},
    }))).await;
    assert_eq!(code, 201, "{answer}");
    let (_, pod) = get(&c, &format!("{pods}/web")).await;
    assert_eq!(pod["spec"]["nodeName"], "n1", "{pod}");

    // Namespaces have no deletecollection: the request deletes nothing.
    let (code, answer) = send(&c, "DELETE", "/api/v1/namespaces", "application/json", None).await;
    assert_eq!((code, &answer["reason"]), (405, &json!("MethodNotAllowed")), "{answer}");
    assert_eq!(get(&c, "/api/v1/namespaces/default").await.0, 200);
}

/// A kind's accepted labels and refusal wording, from the fixture.
fn selectors_of<'a>(fx: &'a Value, group: &str, kind: &str) -> (BTreeSet<String>, &'a str) {
    let fs = &fx["fieldSelectors"];
    let own = fs["kinds"].as_array().into_iter().flatten().find(|k| k["group"] == group && k["kind"] == kind);
    let entry = own.unwrap_or(&fs["default"]);
    (strs(&entry["labels"]), entry["refusal"].as_str().unwrap_or_default())
}

async fn names_selected(c: &kube::Client, list: &str, selector: &str) -> BTreeSet<String> {
    let (code, body) = get(c, &format!("{list}?fieldSelector={selector}")).await;
    assert_eq!(code, 200, "{list} {selector}: {body}");
    body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_selectors_match_upstream_v1_33() {
    let server = tokio::task::spawn_blocking(ApiServer::start).await.expect("start");
    let c = kube_client(&server.kubeconfig()).await;
    let fx = fixture();
    let mut gaps = Vec::new();

    // Every list takes exactly its kind's labels; others get upstream's 400.
    for gv in served_group_versions(&fx) {
        let gv_name = gv["groupVersion"].as_str().unwrap_or_default();
        let group = gv_name.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        for r in gv["resources"].as_array().into_iter().flatten().filter(|r| strs(&r["verbs"]).contains("list")) {
            let list = format!("{}/{}", base(gv_name), r["name"].as_str().unwrap_or_default());
            let (labels, refusal) = selectors_of(&fx, group, r["kind"].as_str().unwrap_or_default());
            for label in &labels {
                let (code, body) = get(&c, &format!("{list}?fieldSelector={label}%3Dsurface-none")).await;
                if code != 200 {
                    gaps.push(format!("{list}: {label} refused ({code}), upstream accepts it: {body}"));
                }
            }
            for label in ["bogus.field", "metadata.namespace", "spec.nodeName", "status.replicas"] {
                if labels.contains(label) {
                    continue;
                }
                let (code, body) = get(&c, &format!("{list}?fieldSelector={label}%3Dx")).await;
                let want = refusal.replace("{label}", label);
                if code != 400 || body["message"] != want {
                    gaps.push(format!("{list}: {label} answered {code} {}, upstream 400 {want:?}", body["message"]));
                }
            }
        }
    }
    assert!(gaps.is_empty(), "{} differences from upstream v1.33:\n{}", gaps.len(), gaps.join("\n"));

    // Values read as upstream's typed objects give them: an unset field is
    // its zero value.
    post(&c, "/api/v1/nodes", json!({"metadata": {"name": "plain"}})).await;
    post(&c, "/api/v1/nodes", json!({"metadata": {"name": "cordoned"}, "spec": {"unschedulable": true}})).await;
    assert_eq!(
        names_selected(&c, "/api/v1/nodes", "spec.unschedulable%3Dfalse").await,
        BTreeSet::from(["plain".to_string()])
    );
    assert_eq!(
        names_selected(&c, "/api/v1/nodes", "spec.unschedulable%3Dtrue").await,
        BTreeSet::from(["cordoned".to_string()])
    );
    let pods = "/api/v1/namespaces/default/pods";
    post(&c, pods, json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}))
        .await;
    for selector in [
        "status.phase%3DPending",
        "spec.hostNetwork%3Dfalse",
        "spec.nodeName%3D",
        "spec.restartPolicy%3DAlways",
        "spec.schedulerName%3Ddefault-scheduler",
        "status.podIPs%3D",
    ] {
        assert!(names_selected(&c, pods, selector).await.contains("web"), "{selector}");
    }
    let secrets = "/api/v1/namespaces/default/secrets";
    post(&c, secrets, json!({"metadata": {"name": "s"}})).await;
    assert!(names_selected(&c, secrets, "type%3DOpaque").await.contains("s"));
    let jobs = "/apis/batch/v1/namespaces/default/jobs";
    post(&c, jobs, json!({"metadata": {"name": "j"}, "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "pause"}]}}}})).await;
    assert!(names_selected(&c, jobs, "status.successful%3D0").await.contains("j"));
    assert!(names_selected(&c, "/api/v1/namespaces", "status.phase%3DActive").await.contains("default"));
    let services = "/api/v1/namespaces/default/services";
    post(&c, services, json!({"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}})).await;
    assert!(names_selected(&c, services, "spec.type%3DClusterIP").await.contains("svc"));
    let rcs = "/api/v1/namespaces/default/replicationcontrollers";
    post(&c, rcs, json!({"metadata": {"name": "rc"}, "spec": {"replicas": 0, "selector": {"app": "rc"}, "template": {"metadata": {"labels": {"app": "rc"}}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}}})).await;
    assert!(names_selected(&c, rcs, "status.replicas%3D0").await.contains("rc"));
    let csrs = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
    post(&c, csrs, json!({"metadata": {"name": "csr-1"}, "spec": {"request": CSR_REQUEST, "signerName": "example.com/s", "usages": ["client auth"]}})).await;
    assert_eq!(
        names_selected(&c, csrs, "spec.signerName%3Dexample.com/s").await,
        BTreeSet::from(["csr-1".to_string()])
    );
    // A core Event without a source selects by its reporting controller.
    let events = "/api/v1/namespaces/default/events";
    post(
        &c,
        events,
        json!({
            "metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
            "reason": "Tested", "type": "Normal", "reportingComponent": "surface-ctl", "reportingInstance": "i",
        }),
    )
    .await;
    assert!(names_selected(&c, events, "source%3Dsurface-ctl").await.contains("e1"));
    // events.k8s.io selects by its own field names.
    let events_v1 = "/apis/events.k8s.io/v1/namespaces/default/events";
    post(
        &c,
        events_v1,
        json!({
            "metadata": {"name": "e2"}, "eventTime": "2025-01-01T00:00:00.000000Z", "action": "Test",
            "regarding": {"kind": "Pod", "name": "web", "namespace": "default"}, "reason": "Tested", "type": "Normal",
            "reportingController": "surface-ctl", "reportingInstance": "i",
        }),
    )
    .await;
    for selector in ["regarding.name%3Dweb", "reportingController%3Dsurface-ctl", "regarding.kind%3DPod,type%3DNormal"]
    {
        assert!(names_selected(&c, events_v1, selector).await.contains("e2"), "{selector}");
    }
}
