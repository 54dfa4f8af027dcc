//! The semantics clients lean on, each as upstream v1.33 answers it: what
//! typed clients send for unset fields, deletes racing a writer, server-side
//! apply after an empty map, base64 with line breaks, `name` beside
//! `generateName`, the status fields upstream always writes, the bytes of
//! an error, and `/version`.

mod common;

use common::raw;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

async fn start() -> (common::ApiServer, kube::Client) {
    let server = tokio::task::spawn_blocking(common::ApiServer::start).await.expect("start");
    let client = common::kube_client_without_retry(&server.kubeconfig()).await;
    (server, client)
}

async fn post(client: &kube::Client, uri: &str, body: &Value) -> (u16, Value) {
    let (code, bytes) = raw(client, "POST", uri, "application/json", &body.to_string()).await;
    (code, serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("POST {uri}: {e}: {bytes:?}")))
}

#[tokio::test(flavor = "multi_thread")]
async fn unset_values_typed_clients_send_are_defaulted() {
    let (_server, client) = start().await;
    // A Go client sends an unset IntOrString as 0.
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [
            {"name": "a", "port": 80, "targetPort": 0}, {"name": "b", "port": 81, "targetPort": ""},
            {"name": "c", "port": 82, "targetPort": 8082}]}});
    let (code, created) = post(&client, "/api/v1/namespaces/default/services", &svc).await;
    assert_eq!(code, 201, "{created}");
    let targets: Vec<&Value> =
        created["spec"]["ports"].as_array().expect("ports").iter().map(|p| &p["targetPort"]).collect();
    assert_eq!(targets, [&json!(80), &json!(81), &json!(8082)]);
    // A Go client sends an unset Quantity as "0": a valid divisor.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "CPU",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "0"}}}]}]}});
    let (code, created) = post(&client, "/api/v1/namespaces/default/pods", &pod).await;
    assert_eq!(code, 201, "{created}");
}

#[tokio::test(flavor = "multi_thread")]
async fn version_names_a_commit() {
    let (_server, client) = start().await;
    let (code, body) = raw(&client, "GET", "/version", "application/json", "").await;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_slice(&body).expect("json");
    let commit = v["gitCommit"].as_str().expect("gitCommit");
    assert!(commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()), "{commit}");
    assert!(v["buildDate"].as_str().is_some_and(|d| d.ends_with('Z')), "{v}");
}

/// A delete without preconditions never answers 409, however often
/// another writer changes the object meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_racing_a_writer_never_conflicts() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for round in 0..30 {
        let name = format!("race-{round}");
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.clone());
        cms.create(&PostParams::default(), &cm).await.expect("create");
        // Writers that change the object until it is gone.
        let writers: Vec<_> = (0..3)
            .map(|w| {
                let cms = cms.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    let mut writes = 0u32;
                    for i in 0.. {
                        let patch = json!({"metadata": {"annotations": {format!("w{w}"): i.to_string()}}});
                        match cms.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                            Ok(_) => writes += 1,
                            Err(kube::Error::Api(s)) if s.code == 404 => return writes,
                            Err(e) => panic!("patch: {e}"),
                        }
                    }
                    writes
                })
            })
            .collect();
        // Let the writers get going.
        loop {
            let cm = cms.get(&name).await.expect("get");
            if cm.metadata.annotations.is_some_and(|a| a.len() == 3) {
                break;
            }
        }
        match cms.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) => panic!("round {round}: an unconditional delete failed: {e}"),
        }
        for w in writers {
            w.await.expect("writer");
        }
    }
    // A failed precondition is still a 409.
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("guarded".into());
    cms.create(&PostParams::default(), &cm).await.expect("create");
    let stale = DeleteParams {
        preconditions: Some(kube::api::Preconditions { resource_version: Some("1".into()), uid: None }),
        ..Default::default()
    };
    match cms.delete("guarded", &stale).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"), "{}", s.message),
        other => panic!("a stale precondition: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_after_an_empty_map_keeps_what_is_applied() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PatchParams::apply("test-manager");
    for (data, want) in [
        (json!({"key1": "a", "key2": "b"}), json!({"key1": "a", "key2": "b"})),
        (json!({"key2": "b", "key3": "c"}), json!({"key2": "b", "key3": "c"})),
        (json!({}), json!(null)),
        (json!({"key1": "new value"}), json!({"key1": "new value"})),
    ] {
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": data});
        let applied = cms.patch("ssa", &pp, &Patch::Apply(&config)).await.expect("apply");
        let got = serde_json::to_value(&applied.data).expect("data");
        // `data: {}` reads back as an empty map or none at all.
        let got = if got == json!({}) { json!(null) } else { got };
        assert_eq!(got, want, "after applying {data}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn base64_with_line_breaks_is_accepted_as_go_decodes_it() {
    let (_server, client) = start().await;
    let value = "x".repeat(100);
    let encoded = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(&value)
    };
    // Wrapped at 76 columns, as `base64` prints it, with a CRLF too.
    let wrapped = format!("{}\n{}\r\n", &encoded[..76], &encoded[76..]);
    let secret =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls"}, "data": {"tls.crt": wrapped}});
    let (code, created) = post(&client, "/api/v1/namespaces/default/secrets", &secret).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["data"]["tls.crt"], json!(encoded), "stored without the line breaks");
    // Not base64 at all is still refused.
    let bad = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bad"}, "data": {"k": "!!\n"}});
    let (code, status) = post(&client, "/api/v1/namespaces/default/secrets", &bad).await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_given_beside_generate_name_is_used_and_conflicts() {
    let (_server, client) = start().await;
    let body =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "taken-x", "generateName": "taken-"}});
    let (code, first) = post(&client, "/api/v1/namespaces/default/configmaps", &body).await;
    assert_eq!((code, first["metadata"]["name"].as_str()), (201, Some("taken-x")), "{first}");
    let (code, second) = post(&client, "/api/v1/namespaces/default/configmaps", &body).await;
    assert_eq!((code, second["reason"].as_str()), (409, Some("AlreadyExists")), "{second}");
    // generateName alone still finds a free name.
    let generated = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "taken-"}});
    let (code, third) = post(&client, "/api/v1/namespaces/default/configmaps", &generated).await;
    assert_eq!(code, 201, "{third}");
    assert!(third["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("taken-") && n.len() == 11), "{third}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fresh_objects_carry_the_status_fields_upstream_always_writes() {
    let (_server, client) = start().await;
    let labels = json!({"app": "s"});
    let template = json!({"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let cases = [
        (
            "/apis/apps/v1/namespaces/default/statefulsets",
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s"},
                "spec": {"replicas": 0, "serviceName": "s", "selector": {"matchLabels": labels}, "template": template}}),
            json!({"replicas": 0, "availableReplicas": 0}),
        ),
        (
            "/apis/apps/v1/namespaces/default/replicasets",
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "r"},
                "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": template}}),
            json!({"replicas": 0}),
        ),
        (
            "/apis/apps/v1/namespaces/default/daemonsets",
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"},
                "spec": {"selector": {"matchLabels": labels}, "template": template}}),
            json!({"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0, "numberReady": 0}),
        ),
        (
            "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "p"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}}),
            json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}),
        ),
        (
            "/apis/batch/v1/namespaces/default/jobs",
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}),
            json!({}),
        ),
    ];
    for (uri, body, want) in cases {
        let (code, created) = post(&client, uri, &body).await;
        assert_eq!(code, 201, "{created}");
        assert_eq!(created["status"], want, "{uri}");
    }
    // A status written later without those fields keeps them.
    let req = axum::http::Request::builder()
        .method("PATCH")
        .uri("/apis/apps/v1/namespaces/default/statefulsets/s/status")
        .header("Content-Type", "application/json-patch+json")
        .body(br#"[{"op":"remove","path":"/status/availableReplicas"}]"#.to_vec())
        .expect("request");
    let patched: Value = client.request(req).await.expect("patch status");
    assert_eq!(patched["status"]["availableReplicas"], json!(0), "{patched}");
}

#[tokio::test(flavor = "multi_thread")]
async fn error_bodies_are_upstreams_bytes() {
    let (_server, client) = start().await;
    let (code, body) = raw(&client, "GET", "/api/v1/namespaces/default/configmaps/nope", "application/json", "").await;
    assert_eq!(code, 404);
    let text = String::from_utf8(body).expect("utf-8");
    assert_eq!(
        text,
        "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\
         \"message\":\"configmaps \\\"nope\\\" not found\",\"reason\":\"NotFound\",\
         \"details\":{\"name\":\"nope\",\"kind\":\"configmaps\"},\"code\":404}\n"
    );
    // Causes in StatusCause's order.
    let bad = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name"}});
    let (code, body) =
        raw(&client, "POST", "/api/v1/namespaces/default/configmaps", "application/json", &bad.to_string()).await;
    assert_eq!(code, 422);
    let text = String::from_utf8(body).expect("utf-8");
    assert!(text.contains("\"causes\":[{\"reason\":\"FieldValueInvalid\",\"message\":"), "{text}");
    assert!(text.ends_with(",\"code\":422}\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_status_update_of_a_built_in_kind_keeps_its_metadata_changes() {
    let (_server, client) = start().await;
    let ing = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web"},
        "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}});
    let (code, created) = post(&client, "/apis/networking.k8s.io/v1/namespaces/default/ingresses", &ing).await;
    assert_eq!(code, 201, "{created}");
    let patch = json!({"metadata": {"annotations": {"patchedstatus": "true"}},
        "spec": {"defaultBackend": {"service": {"name": "other", "port": {"number": 81}}}},
        "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}});
    let req = axum::http::Request::builder()
        .method("PATCH")
        .uri("/apis/networking.k8s.io/v1/namespaces/default/ingresses/web/status")
        .header("Content-Type", "application/merge-patch+json")
        .body(patch.to_string().into_bytes())
        .expect("request");
    let patched: Value = client.request(req).await.expect("patch status");
    assert_eq!(patched["metadata"]["annotations"]["patchedstatus"], "true", "{patched}");
    assert_eq!(patched["status"]["loadBalancer"]["ingress"][0]["ip"], "10.0.0.1");
    assert_eq!(patched["spec"]["defaultBackend"]["service"]["name"], "web", "the spec is not the status' to change");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_review_asked_for_only_as_a_table_is_not_acceptable() {
    let (_server, client) = start().await;
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}});
    let uri = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io";
    let (code, body) = raw(&client, "POST", uri, table, &review.to_string()).await;
    assert_eq!(code, 406, "{}", String::from_utf8_lossy(&body));
    let (code, _) = raw(&client, "POST", uri, &format!("{table}, application/json"), &review.to_string()).await;
    assert_eq!(code, 201);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_service_turned_external_name_lets_its_cluster_ip_and_node_ports_go() {
    let (_server, client) = start().await;
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "np"},
        "spec": {"type": "NodePort", "selector": {"app": "np"}, "ports": [{"port": 80}]}});
    let (code, created) = post(&client, "/api/v1/namespaces/default/services", &svc).await;
    assert_eq!(code, 201, "{created}");
    assert!(created["spec"]["clusterIP"].as_str().is_some_and(|ip| !ip.is_empty()), "{created}");
    // What a Go client's read-modify-write sends: the old fields as they were.
    let mut changed = created.clone();
    changed["spec"]["type"] = json!("ExternalName");
    changed["spec"]["externalName"] = json!("example.com");
    let (code, bytes) =
        raw(&client, "PUT", "/api/v1/namespaces/default/services/np", "application/json", &changed.to_string()).await;
    let updated: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(code, 200, "{updated}");
    assert!(updated["spec"].get("clusterIP").is_none() && updated["spec"].get("clusterIPs").is_none(), "{updated}");
    assert!(updated["spec"]["ports"][0].get("nodePort").is_none(), "{updated}");
    assert!(updated["spec"].get("externalTrafficPolicy").is_none(), "{updated}");
}
