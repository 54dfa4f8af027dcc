//! ResourceQuota admission against `ferrok server`, driven by the `kube`
//! crate: many concurrent creates against a quota of 5 create exactly 5
//! (admission charges `status.used` by compare-and-swap), a delete is
//! released by the controller's recount, and quantities that do not parse
//! are refused with the field named.

mod common;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

async fn start() -> (common::ApiServer, kube::Client) {
    let server = tokio::task::spawn_blocking(common::ApiServer::start).await.expect("start");
    let client = common::kube_client(&server.kubeconfig()).await;
    (server, client)
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}
    }))
    .expect("pod")
}

/// `status.used[key]` of the quota, once the controller has written it.
async fn used(quotas: &Api<ResourceQuota>, name: &str, key: &str) -> Option<String> {
    let q = quotas.get(name).await.ok()?;
    q.status?.used?.get(key).map(|v| v.0.clone())
}

async fn wait_used(quotas: &Api<ResourceQuota>, name: &str, key: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = used(quotas, name, key).await;
        if now.as_deref() == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "status.used.{key} of {name} is {now:?}, waited for {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_creates_never_overshoot_a_quota() {
    let (_server, client) = start().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    let quota: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": "five"}, "spec": {"hard": {"pods": "5"}}})).expect("quota");
    quotas.create(&PostParams::default(), &quota).await.expect("create quota");
    wait_used(&quotas, "five", "pods", "0").await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = race(std::slice::from_ref(&client)).await;
    assert_eq!(created, 5, "creates admitted against a quota of 5");
    assert_eq!(pods.list(&ListParams::default()).await.expect("list").items.len(), 5);
    assert_eq!(used(&quotas, "five", "pods").await.as_deref(), Some("5"));
    // The controller's recount agrees, and stays there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(used(&quotas, "five", "pods").await.as_deref(), Some("5"));

    // A delete is released by the recount; then there is room for one more.
    let first = pods.list(&ListParams::default()).await.expect("list").items[0].metadata.name.clone();
    let first = first.expect("name");
    pods.delete(&first, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.expect("delete");
    wait_used(&quotas, "five", "pods", "4").await;
    pods.create(&PostParams::default(), &pod("again")).await.expect("room again after the delete");
    let err = pods.create(&PostParams::default(), &pod("over")).await.expect_err("full again");
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 403), "{err:?}");
}

/// 40 creates against a quota of 5, spread over `clients`; how many were admitted.
async fn race(clients: &[kube::Client]) -> usize {
    let creates = (0..40).map(|i| {
        let pods: Api<Pod> = Api::namespaced(clients[i % clients.len()].clone(), "default");
        tokio::spawn(async move { pods.create(&PostParams::default(), &pod(&format!("p{i}"))).await })
    });
    let mut created = 0;
    for r in join_all(creates).await {
        match r.expect("task") {
            Ok(_) => created += 1,
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"), "{s:?}");
                assert!(
                    s.message.ends_with(
                        "is forbidden: exceeded quota: five, requested: pods=1, used: pods=5, limited: pods=5"
                    ),
                    "{}",
                    s.message
                );
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    created
}

/// Two servers sharing one etcd do not share the per-namespace admission
/// lock: only the compare-and-swap on the quota keeps them within it.
#[tokio::test(flavor = "multi_thread")]
async fn two_servers_sharing_etcd_never_overshoot_a_quota() {
    let etcd = common::start_etcd().await;
    let endpoint = format!("http://{}", etcd.endpoint);
    let start = |name: &'static str| {
        let endpoint = endpoint.clone();
        tokio::task::spawn_blocking(move || {
            let dir = tempfile::tempdir().expect("tempdir");
            common::ApiServer::start_with(
                dir,
                common::free_port(),
                &["--datastore-endpoint", &endpoint, "--node-name", name, "--token", "shared-test-token"],
            )
        })
    };
    let a = start("server-a").await.expect("server a");
    let b = start("server-b").await.expect("server b");
    let clients = [common::kube_client(&a.kubeconfig()).await, common::kube_client(&b.kubeconfig()).await];
    let quotas: Api<ResourceQuota> = Api::namespaced(clients[0].clone(), "default");
    let quota: ResourceQuota =
        serde_json::from_value(json!({"metadata": {"name": "five"}, "spec": {"hard": {"pods": "5"}}})).expect("quota");
    quotas.create(&PostParams::default(), &quota).await.expect("create quota");
    wait_used(&quotas, "five", "pods", "0").await;
    // Both servers' caches know the quota before the race starts.
    let other: Api<ResourceQuota> = Api::namespaced(clients[1].clone(), "default");
    wait_used(&other, "five", "pods", "0").await;
    assert_eq!(race(&clients).await, 5, "creates admitted against a quota of 5 by two servers");
    let pods: Api<Pod> = Api::namespaced(clients[1].clone(), "default");
    assert_eq!(pods.list(&ListParams::default()).await.expect("list").items.len(), 5);
    assert_eq!(used(&quotas, "five", "pods").await.as_deref(), Some("5"));
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_are_charged_exactly_and_printed_canonically() {
    let (_server, client) = start().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "compute"},
        "spec": {"hard": {"requests.cpu": "1", "requests.memory": "1Gi"}}
    }))
    .expect("quota");
    quotas.create(&PostParams::default(), &quota).await.expect("create quota");
    wait_used(&quotas, "compute", "requests.cpu", "0").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let sized = |name: &str, cpu: &str, memory: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
        }))
        .expect("pod")
    };
    // A container without requests is refused while the quota constrains them.
    let err = pods.create(&PostParams::default(), &pod("bare")).await.expect_err("no requests");
    match err {
        kube::Error::Api(s) => assert_eq!(
            s.message,
            "pods \"bare\" is forbidden: failed quota: compute: must specify requests.cpu for: c; requests.memory for: c"
        ),
        other => panic!("{other:?}"),
    }
    // 0.1 + 0.2 + 0.7 is exactly 1 core: no float drift refuses the third.
    let a = pods.create(&PostParams::default(), &sized("a", "0.1", "512Mi")).await.expect("a");
    // Stored as upstream stores it: in canonical form.
    let requests = a.spec.and_then(|s| s.containers[0].resources.clone()).and_then(|r| r.requests);
    assert_eq!(requests.and_then(|r| r.get("cpu").cloned()).map(|q| q.0).as_deref(), Some("100m"));
    pods.create(&PostParams::default(), &sized("b", "200m", "256Mi")).await.expect("b");
    assert_eq!(used(&quotas, "compute", "requests.cpu").await.as_deref(), Some("300m"));
    assert_eq!(used(&quotas, "compute", "requests.memory").await.as_deref(), Some("768Mi"));
    pods.create(&PostParams::default(), &sized("c", "0.7", "256Mi")).await.expect("c");
    assert_eq!(used(&quotas, "compute", "requests.cpu").await.as_deref(), Some("1"));
    assert_eq!(used(&quotas, "compute", "requests.memory").await.as_deref(), Some("1Gi"));
    match pods.create(&PostParams::default(), &sized("d", "1m", "1")).await.expect_err("over") {
        kube::Error::Api(s) => assert_eq!(
            s.message,
            "pods \"d\" is forbidden: exceeded quota: compute, requested: requests.cpu=1m,requests.memory=1, \
             used: requests.cpu=1,requests.memory=1Gi, limited: requests.cpu=1,requests.memory=1Gi"
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn quantities_that_do_not_parse_are_refused_with_the_field() {
    let (_server, client) = start().await;
    let post = |plural: &str, body: serde_json::Value| {
        let client = client.clone();
        let uri = format!("/api/v1/namespaces/default/{plural}");
        async move {
            let req = axum::http::Request::post(uri)
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).expect("json"))
                .expect("request");
            client.request::<serde_json::Value>(req).await
        }
    };
    let cases = [
        (
            "pods",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"},
                "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1x"}}}]}}),
            "spec.containers[0].resources.requests.cpu",
        ),
        (
            "resourcequotas",
            json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "bad"},
                "spec": {"hard": {"pods": "five"}}}),
            "spec.hard.pods",
        ),
        (
            "limitranges",
            json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "bad"},
                "spec": {"limits": [{"type": "Container", "max": {"memory": "1Gib"}}]}}),
            "spec.limits[0].max.memory",
        ),
        (
            "persistentvolumeclaims",
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "bad"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1..5Gi"}}}}),
            "spec.resources.requests.storage",
        ),
    ];
    for (plural, body, field) in cases {
        match post(plural, body).await.expect_err(plural) {
            kube::Error::Api(s) => {
                assert!(s.code == 400 || s.code == 422, "{plural}: {s:?}");
                assert!(s.message.contains(field), "{plural}: {}", s.message);
                assert!(s.message.contains("quantities must match the regular expression"), "{}", s.message);
            }
            other => panic!("{plural}: {other:?}"),
        }
    }
    // Quantities that parse but make no sense are 422 Invalid, the field named
    // and the value in canonical form, as upstream prints it.
    let negative = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "neg"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "-1"}}}]}});
    match post("pods", negative).await.expect_err("negative") {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
            assert!(
                s.message.contains(
                    "spec.containers[0].resources.requests[cpu]: Invalid value: \"-1\": must be greater than or equal to 0"
                ),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
    let fractional = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "half"},
        "spec": {"hard": {"pods": "1.5"}}});
    match post("resourcequotas", fractional).await.expect_err("fractional") {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(
                s.message.contains("spec.hard[pods]: Invalid value: \"1500m\": must be an integer"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_update_is_charged_for_what_it_adds() {
    use k8s_openapi::api::core::v1::Service;
    let (_server, client) = start().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "ports"},
        "spec": {"hard": {"services.nodeports": "1"}}
    }))
    .expect("quota");
    quotas.create(&PostParams::default(), &quota).await.expect("create quota");
    wait_used(&quotas, "ports", "services.nodeports", "0").await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 443}]}
    }))
    .expect("service");
    let mut svc = services.create(&PostParams::default(), &svc).await.expect("a ClusterIP service uses no node port");
    if let Some(spec) = svc.spec.as_mut() {
        spec.type_ = Some("NodePort".into());
    }
    match services.replace("web", &PostParams::default(), &svc).await.expect_err("two node ports") {
        kube::Error::Api(s) => assert_eq!(
            s.message,
            "services \"web\" is forbidden: exceeded quota: ports, requested: services.nodeports=2, \
             used: services.nodeports=0, limited: services.nodeports=1"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(used(&quotas, "ports", "services.nodeports").await.as_deref(), Some("0"));
}

/// ConfigMaps and Secrets are watched by the controller only from the first
/// quota that counts them: objects made before that quota are counted by
/// its first recount, and later creates and deletes move the count.
#[tokio::test(flavor = "multi_thread")]
async fn configmaps_and_secrets_made_before_their_quota_are_counted() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let (_server, client) = start().await;
    let ns = "counted";
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    namespaces.create(&PostParams::default(), &namespace).await.expect("namespace");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let cm = |name: &str| serde_json::from_value::<ConfigMap>(json!({"metadata": {"name": name}})).expect("cm");
    let secret = |name: &str| serde_json::from_value::<Secret>(json!({"metadata": {"name": name}})).expect("secret");
    for name in ["a", "b", "c"] {
        configmaps.create(&PostParams::default(), &cm(name)).await.expect("configmap");
    }
    for name in ["s1", "s2"] {
        secrets.create(&PostParams::default(), &secret(name)).await.expect("secret");
    }
    // A pods-only quota first, and a scoped one: neither counts these kinds.
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    let quota = |name: &str, hard: serde_json::Value| -> ResourceQuota {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"hard": hard}})).expect("quota")
    };
    quotas.create(&PostParams::default(), &quota("pods", json!({"pods": "9"}))).await.expect("quota");
    wait_used(&quotas, "pods", "pods", "0").await;

    let hard = json!({"configmaps": "10", "count/secrets": "10"});
    quotas.create(&PostParams::default(), &quota("objects", hard)).await.expect("quota");
    // kube-root-ca.crt is published into every namespace as well.
    let root_ca = configmaps.get_opt("kube-root-ca.crt").await.expect("get").is_some();
    let cms = if root_ca { "4" } else { "3" };
    wait_used(&quotas, "objects", "configmaps", cms).await;
    wait_used(&quotas, "objects", "count/secrets", "2").await;

    secrets.create(&PostParams::default(), &secret("s3")).await.expect("secret");
    wait_used(&quotas, "objects", "count/secrets", "3").await;
    configmaps.delete("a", &DeleteParams::default()).await.expect("delete");
    let fewer = if root_ca { "3" } else { "2" };
    wait_used(&quotas, "objects", "configmaps", fewer).await;
    secrets.delete("s1", &DeleteParams::default()).await.expect("delete");
    wait_used(&quotas, "objects", "count/secrets", "2").await;
}

/// Kinds the controller has no informer of its own for (ReplicaSets,
/// ReplicationControllers, Jobs: `count/<resource>`) are counted from the
/// quota monitor's watches, started by the first quota that counts them:
/// objects made before the quota are counted, and a delete is released at
/// once (upstream's replenishment), not at the next resync minutes later.
#[tokio::test(flavor = "multi_thread")]
async fn deletes_of_other_kinds_release_their_usage_at_once() {
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::ReplicationController;
    let (_server, client) = start().await;
    let ns = "lives";
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    namespaces.create(&PostParams::default(), &namespace).await.expect("namespace");
    let template = json!({"metadata": {"labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}});
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    let replica_set = |name: &str| -> ReplicaSet {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"replicas": 0,
            "selector": {"matchLabels": {"app": "x"}}, "template": template}}))
        .expect("replicaset")
    };
    let controllers: Api<ReplicationController> = Api::namespaced(client.clone(), ns);
    let rc: ReplicationController = serde_json::from_value(
        json!({"metadata": {"name": "rc"}, "spec": {"replicas": 0, "selector": {"app": "x"}, "template": template}}),
    )
    .expect("rc");
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let mut job_template = template.clone();
    job_template["spec"]["restartPolicy"] = json!("Never");
    let job: Job = serde_json::from_value(
        json!({"metadata": {"name": "job"}, "spec": {"suspend": true, "template": job_template}}),
    )
    .expect("job");

    replicasets.create(&PostParams::default(), &replica_set("early")).await.expect("replicaset");
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    let hard = json!({"count/replicasets.apps": "5", "replicationcontrollers": "5", "count/jobs.batch": "5"});
    let quota = serde_json::from_value(json!({"metadata": {"name": "life"}, "spec": {"hard": hard}})).expect("quota");
    quotas.create(&PostParams::default(), &quota).await.expect("quota");
    wait_used(&quotas, "life", "count/replicasets.apps", "1").await;
    wait_used(&quotas, "life", "replicationcontrollers", "0").await;

    replicasets.create(&PostParams::default(), &replica_set("late")).await.expect("replicaset");
    controllers.create(&PostParams::default(), &rc).await.expect("rc");
    jobs.create(&PostParams::default(), &job).await.expect("job");
    wait_used(&quotas, "life", "count/replicasets.apps", "2").await;
    wait_used(&quotas, "life", "replicationcontrollers", "1").await;
    wait_used(&quotas, "life", "count/jobs.batch", "1").await;

    for name in ["early", "late"] {
        replicasets.delete(name, &DeleteParams::default()).await.expect("delete");
    }
    controllers.delete("rc", &DeleteParams::default()).await.expect("delete");
    jobs.delete("job", &DeleteParams::background()).await.expect("delete");
    wait_used(&quotas, "life", "count/replicasets.apps", "0").await;
    wait_used(&quotas, "life", "replicationcontrollers", "0").await;
    wait_used(&quotas, "life", "count/jobs.batch", "0").await;
}
