//! The `replicationcontroller` and `horizontalpodautoscaling` controllers
//! on a real node, and autoscaling/v1 served through its conversion to the
//! stored autoscaling/v2:
//! - a ReplicationController keeps its pods (owned by it, named after it),
//!   scales through `kubectl scale rc` (its `scale` subresource), replaces a
//!   deleted pod, reports upstream's status and events, and takes its pods
//!   with it on `kubectl delete rc`;
//! - an autoscaler of a Deployment whose pods burn CPU scales it up to its
//!   maximum at the pace its behavior allows, and back down once the load
//!   stops and its (short) scale-down window has passed, with upstream's
//!   conditions and events;
//! - `kubectl autoscale` of kubectl 1.27 and of the default kubectl makes
//!   autoscalers that act, read the same through autoscaling/v1 and v2;
//! - autoscalers whose target or metrics cannot be read say so as upstream;
//! - custom resources with a scale subresource are scale targets too.

mod common;

use std::time::{Duration, Instant};

use common::node::{Node, BUSYBOX};
use serde_json::{json, Value};

fn kubectl_version(minor: u32) -> String {
    let out =
        std::process::Command::new("sh").args(["-c", "readlink -f $(command -v kubectl)"]).output().expect("readlink");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    std::path::Path::new(&path)
        .parent()
        .expect("kubectl folder")
        .join(format!("kubectl.1.{minor}"))
        .display()
        .to_string()
}

fn json_of(node: &Node, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = node.ok(&a);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// `kubectl get --raw path`, decoded.
fn raw(node: &Node, path: &str) -> Value {
    let out = node.ok(&["get", "--raw", path]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{path}: {e}: {out}"))
}

/// The Events about `kind`/`name` as `reason|component|message` lines.
fn events(node: &Node, kind: &str, name: &str) -> Vec<String> {
    let out = node.ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.kind={kind},involvedObject.name={name}"),
        "-o",
        r#"jsonpath={range .items[*]}{.reason}|{.source.component}|{.message}{"\n"}{end}"#,
    ]);
    out.lines().map(str::to_string).collect()
}

/// The pods of `app` that are not being deleted, as (name, phase).
fn live_pods(node: &Node, app: &str) -> Vec<(String, String)> {
    let list = json_of(node, &["get", "pods", "-l", &format!("app={app}")]);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                p["status"]["phase"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn running(node: &Node, app: &str, n: usize) -> bool {
    let pods = live_pods(node, app);
    pods.len() == n && pods.iter().all(|(_, phase)| phase == "Running")
}

/// A condition of an autoscaler as `status reason message`.
fn condition(hpa: &Value, type_: &str) -> (String, String, String) {
    let c = hpa["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or(Value::Null);
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

#[test]
fn replication_controller_keeps_scales_replaces_and_takes_its_pods() {
    let node = Node::start(&[]);
    // No selector: upstream's defaulting takes the template's labels.
    node.apply(&format!(
        r#"
apiVersion: v1
kind: ReplicationController
metadata: {{name: web, namespace: default}}
spec:
  replicas: 2
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
      - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"]}}
"#
    ));
    let rc = json_of(&node, &["get", "rc", "web"]);
    assert_eq!(rc["spec"]["selector"], json!({"app": "web"}));
    assert_eq!(rc["metadata"]["labels"], json!({"app": "web"}));
    node.eventually("two pods of the RC run", 90, || running(&node, "web", 2));
    let uid = rc["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let pods = json_of(&node, &["get", "pods", "-l", "app=web"]);
    for p in pods["items"].as_array().into_iter().flatten() {
        let owner = &p["metadata"]["ownerReferences"][0];
        assert_eq!(owner["apiVersion"], "v1", "{p}");
        assert_eq!(owner["kind"], "ReplicationController");
        assert_eq!((owner["name"].as_str(), owner["uid"].as_str()), (Some("web"), Some(uid.as_str())));
        assert_eq!((owner["controller"].as_bool(), owner["blockOwnerDeletion"].as_bool()), (Some(true), Some(true)));
        assert_eq!(p["metadata"]["generateName"], "web-");
    }
    node.eventually("the RC's status counts its ready pods", 30, || {
        let s = json_of(&node, &["get", "rc", "web"])["status"].clone();
        s == json!({"replicas": 2, "fullyLabeledReplicas": 2, "readyReplicas": 2, "availableReplicas": 2, "observedGeneration": 1})
    });
    let created: Vec<String> = events(&node, "ReplicationController", "web")
        .into_iter()
        .filter(|e| e.starts_with("SuccessfulCreate|"))
        .collect();
    assert_eq!(created.len(), 2, "{created:?}");
    assert!(
        created.iter().all(|e| e.starts_with("SuccessfulCreate|replication-controller|Created pod: web-")),
        "{created:?}"
    );

    // The scale subresource, through kubectl scale.
    let scale = raw(&node, "/api/v1/namespaces/default/replicationcontrollers/web/scale");
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!((scale["spec"]["replicas"].as_i64(), scale["status"]["replicas"].as_i64()), (Some(2), Some(2)));
    assert_eq!(scale["status"]["selector"], "app=web");
    node.ok(&["scale", "rc", "web", "--replicas=3"]);
    node.eventually("three pods run", 90, || running(&node, "web", 3));
    node.ok(&["scale", "rc", "web", "--replicas=1"]);
    node.eventually("one pod is left", 90, || live_pods(&node, "web").len() == 1);
    node.eventually("deletions are evented", 30, || {
        events(&node, "ReplicationController", "web")
            .iter()
            .filter(|e| e.starts_with("SuccessfulDelete|replication-controller|Deleted pod: web-"))
            .count()
            == 2
    });

    // A deleted pod is replaced.
    let (gone, _) = live_pods(&node, "web").remove(0);
    node.ok(&["delete", "pod", &gone, "--wait=false"]);
    node.eventually("the pod is replaced", 90, || {
        let pods = live_pods(&node, "web");
        pods.len() == 1 && pods[0].0 != gone && pods[0].1 == "Running"
    });

    // kubectl delete rc cascades: the collector deletes its pods.
    node.ok(&["delete", "rc", "web", "--wait=false"]);
    node.eventually("the RC's pods are gone", 90, || {
        node.ok(&["get", "pods", "-l", "app=web", "-o", "name"]).trim().is_empty()
    });
}

/// A Deployment whose pods burn a CPU each until `/tmp/stop` exists.
fn busy_deployment(name: &str, replicas: i32) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: burn
        image: {BUSYBOX}
        command: ["sh", "-c", "while [ ! -e /tmp/stop ]; do :; done; exec sleep 3600"]
        resources: {{requests: {{cpu: 20m}}}}
"#
    )
}

#[test]
fn autoscaler_scales_a_busy_deployment_up_to_max_and_down_after_its_window() {
    let node = Node::start(&[]);
    node.apply(&busy_deployment("big", 1));
    node.eventually("the busy pod runs", 90, || running(&node, "big", 1));
    // One pod more per 15 s at most; down again 20 s after the load stops.
    node.apply(
        r#"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: big, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: big}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
  behavior:
    scaleUp:
      policies: [{type: Pods, value: 1, periodSeconds: 15}]
    scaleDown:
      stabilizationWindowSeconds: 20
"#,
    );
    let hpa = json_of(&node, &["get", "hpa", "big"]);
    assert_eq!(hpa["spec"]["behavior"]["scaleUp"]["selectPolicy"], "Max", "defaulted: {hpa}");
    assert_eq!(hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"], 0);
    assert_eq!(
        hpa["spec"]["behavior"]["scaleDown"]["policies"],
        json!([{"type": "Percent", "value": 100, "periodSeconds": 15}])
    );

    // Up to max, one pod at a time, never past max.
    let started = Instant::now();
    let mut most = 0;
    node.eventually("the deployment is scaled to 3", 240, || {
        let replicas: i64 = node.get(&["deploy", "big"], "{.spec.replicas}").trim().parse().unwrap_or(0);
        most = most.max(replicas);
        replicas == 3
    });
    assert!(most <= 3, "scaled past maxReplicas: {most}");
    let rescales: Vec<String> = events(&node, "HorizontalPodAutoscaler", "big")
        .into_iter()
        .filter(|e| e.starts_with("SuccessfulRescale|"))
        .collect();
    let reason = "reason: cpu resource utilization (percentage of request) above target";
    assert_eq!(
        rescales,
        [
            format!("SuccessfulRescale|horizontal-pod-autoscaler|New size: 2; {reason}"),
            format!("SuccessfulRescale|horizontal-pod-autoscaler|New size: 3; {reason}"),
        ],
        "one pod per period ({:?})",
        started.elapsed()
    );
    node.eventually("three busy pods run", 120, || running(&node, "big", 3));
    node.eventually("the autoscaler reports its state at max", 60, || {
        let hpa = json_of(&node, &["get", "hpa", "big"]);
        let s = &hpa["status"];
        let cpu = &s["currentMetrics"][0]["resource"];
        s["currentReplicas"] == 3
            && s["desiredReplicas"] == 3
            && !s["lastScaleTime"].is_null()
            && cpu["name"] == "cpu"
            && cpu["current"]["averageUtilization"].as_i64().unwrap_or(0) > 50
            && condition(&hpa, "AbleToScale").0 == "True"
            && condition(&hpa, "ScalingActive")
                == (
                    "True".into(),
                    "ValidMetricFound".into(),
                    "the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)".into(),
                )
            && condition(&hpa, "ScalingLimited")
                == (
                    "True".into(),
                    "TooManyReplicas".into(),
                    "the desired replica count is more than the maximum replica count".into(),
                )
    });
    let row = node.ok(&["get", "hpa", "big", "--no-headers"]);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], "Deployment/big", "{row}");
    assert!(cells[2].starts_with("cpu:") && cells[3].ends_with("/50%"), "{row}");
    assert_eq!(&cells[4..7], ["1", "3", "3"], "{row}");

    // The load stops: down to min once the 20 s window has passed.
    for (pod, _) in live_pods(&node, "big") {
        node.exec("default", &pod, "burn", "touch /tmp/stop");
    }
    let stopped = Instant::now();
    node.eventually("the deployment is scaled back to 1", 180, || {
        node.get(&["deploy", "big"], "{.spec.replicas}").trim() == "1"
    });
    assert!(stopped.elapsed() >= Duration::from_secs(15), "scaled down within the window: {:?}", stopped.elapsed());
    assert!(
        events(&node, "HorizontalPodAutoscaler", "big").contains(
            &"SuccessfulRescale|horizontal-pod-autoscaler|New size: 1; reason: All metrics below target".to_string()
        ),
        "{:?}",
        events(&node, "HorizontalPodAutoscaler", "big")
    );
    node.eventually("one pod is left", 90, || live_pods(&node, "big").len() == 1);
}

#[test]
fn kubectl_autoscale_of_kubectl_1_27_and_1_33_makes_autoscalers_that_act() {
    let node = Node::start(&[]);
    for name in ["old", "new"] {
        node.apply(&format!(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"], resources: {{requests: {{cpu: 50m}}}}}}
"#
        ));
    }
    for (kubectl, name) in [(kubectl_version(27), "old"), (kubectl_version(33), "new")] {
        let (ok, out) =
            node.kubectl_with(&kubectl, &["autoscale", "deployment", name, "--min=2", "--max=4", "--cpu-percent=60"]);
        assert!(ok, "{kubectl}: {out}");
        assert!(out.contains(&format!("horizontalpodautoscaler.autoscaling/{name} autoscaled")), "{out}");
    }
    for name in ["old", "new"] {
        // Below minReplicas: scaled up to it.
        node.eventually(&format!("{name} is scaled to its minimum"), 60, || {
            node.get(&["deploy", name], "{.spec.replicas}").trim() == "2"
        });
        let v1 = json_of(&node, &["get", "horizontalpodautoscalers.v1.autoscaling", name]);
        assert_eq!(v1["apiVersion"], "autoscaling/v1");
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 60, "{v1}");
        assert_eq!((v1["spec"]["minReplicas"].as_i64(), v1["spec"]["maxReplicas"].as_i64()), (Some(2), Some(4)));
        let v2 = json_of(&node, &["get", "horizontalpodautoscalers.v2.autoscaling", name]);
        assert_eq!(
            v2["spec"]["metrics"],
            json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}}])
        );
        assert!(
            events(&node, "HorizontalPodAutoscaler", name).contains(
                &"SuccessfulRescale|horizontal-pod-autoscaler|New size: 2; reason: Current number of replicas below Spec.MinReplicas"
                    .to_string()
            ),
            "{:?}",
            events(&node, "HorizontalPodAutoscaler", name)
        );
        // Idle pods want fewer than the minimum: limited to it.
        node.eventually(&format!("{name} settles at its minimum"), 120, || {
            let hpa = json_of(&node, &["get", "horizontalpodautoscalers.v2.autoscaling", name]);
            hpa["status"]["currentReplicas"] == 2
                && condition(&hpa, "ScalingLimited")
                    == (
                        "True".into(),
                        "TooFewReplicas".into(),
                        "the desired replica count is less than the minimum replica count".into(),
                    )
                && condition(&hpa, "ScalingActive").1 == "ValidMetricFound"
                && condition(&hpa, "AbleToScale").0 == "True"
        });
        let v1 = json_of(&node, &["get", "horizontalpodautoscalers.v1.autoscaling", name]);
        assert_eq!(v1["status"]["currentReplicas"], 2, "{v1}");
        assert!(v1["status"]["currentCPUUtilizationPercentage"].is_i64(), "{v1}");
        let conditions = v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/conditions"].as_str();
        assert!(conditions.is_some_and(|c| c.contains("TooFewReplicas")), "{v1}");
    }
}

/// Autoscalers whose target or metrics cannot be read, as upstream reports them.
#[test]
fn autoscalers_report_missing_targets_and_metrics_apis_as_upstream() {
    let node = Node::start(&[]);
    node.apply(&format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: app, namespace: default}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: app}}}}
  template:
    metadata: {{labels: {{app: app}}}}
    spec:
      containers:
      - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"]}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: other, namespace: default}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: other}}}}
  template:
    metadata: {{labels: {{app: other}}}}
    spec:
      containers:
      - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"]}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: shared, namespace: default}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: shared}}}}
  template:
    metadata: {{labels: {{app: shared}}}}
    spec:
      containers:
      - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"], resources: {{requests: {{cpu: 10m}}}}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: first, namespace: default}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: shared}}
  maxReplicas: 3
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: second, namespace: default}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: shared}}
  maxReplicas: 3
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: multi, namespace: default}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: multi}}}}
  template:
    metadata: {{labels: {{app: multi}}}}
    spec:
      containers:
      - {{name: c, image: {BUSYBOX}, command: ["sleep", "3600"], resources: {{requests: {{cpu: 10m}}}}}}
      - {{name: d, image: {BUSYBOX}, command: ["sleep", "3600"]}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: multi, namespace: default}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: multi}}
  maxReplicas: 2
  metrics:
  - type: ContainerResource
    containerResource: {{name: cpu, container: c, target: {{type: Utilization, averageUtilization: 50}}}}
  - type: Resource
    resource: {{name: memory, target: {{type: AverageValue, averageValue: 1Gi}}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: nowhere, namespace: default}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: nope}}
  maxReplicas: 3
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: external, namespace: default}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: app}}
  maxReplicas: 3
  metrics:
  - type: External
    external: {{metric: {{name: queue}}, target: {{type: AverageValue, averageValue: "5"}}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: object, namespace: default}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: other}}
  maxReplicas: 3
  metrics:
  - type: Object
    object:
      describedObject: {{apiVersion: v1, kind: Service, name: front}}
      metric: {{name: requests}}
      target: {{type: Value, value: "10"}}
"#
    ));
    node.eventually("the autoscalers report", 60, || {
        ["nowhere", "external", "object"]
            .iter()
            .all(|n| !json_of(&node, &["get", "hpa", n])["status"]["conditions"].is_null())
    });
    // A container's CPU (only its request counts) and the pods' memory;
    // idle, the CPU asks for no pod and the memory for one, which wins.
    node.eventually("the container and memory metrics are read", 90, || {
        let hpa = json_of(&node, &["get", "hpa", "multi"]);
        let m = &hpa["status"]["currentMetrics"];
        condition(&hpa, "ScalingActive")
            == (
                "True".into(),
                "ValidMetricFound".into(),
                "the HPA was able to successfully calculate a replica count from memory resource".into(),
            )
            && m[0]["type"] == "ContainerResource"
            && m[0]["containerResource"]["container"] == "c"
            && m[0]["containerResource"]["current"]["averageUtilization"].is_i64()
            && m[1]["resource"]["name"] == "memory"
            && m[1]["resource"]["current"]["averageValue"].is_string()
    });
    // Two autoscalers of the same pods: neither acts.
    node.eventually("both autoscalers of the shared pods refuse", 60, || {
        ["first", "second"].iter().all(|n| {
            condition(&json_of(&node, &["get", "hpa", n]), "ScalingActive")
                == (
                    "False".into(),
                    "AmbiguousSelector".into(),
                    "pods by selector app=shared are controlled by multiple HPAs: [default/first default/second]"
                        .into(),
                )
        })
    });
    let hpa = json_of(&node, &["get", "hpa", "nowhere"]);
    assert_eq!(
        condition(&hpa, "AbleToScale"),
        (
            "False".into(),
            "FailedGetScale".into(),
            r#"the HPA controller was unable to get the target's current scale: deployments.apps "nope" not found"#
                .into()
        )
    );
    assert!(events(&node, "HorizontalPodAutoscaler", "nowhere")
        .contains(&r#"FailedGetScale|horizontal-pod-autoscaler|deployments.apps "nope" not found"#.to_string()));

    let hpa = json_of(&node, &["get", "hpa", "external"]);
    assert_eq!(condition(&hpa, "AbleToScale").1, "SucceededGetScale");
    let (status, reason, message) = condition(&hpa, "ScalingActive");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "FailedGetExternalMetric"));
    assert!(
        message.starts_with("the HPA was unable to compute the replica count: unable to get external metric default/queue/nil: unable to fetch metrics from external metrics API: "),
        "{message}"
    );
    assert_eq!(hpa["status"]["currentMetrics"], json!([{"type": ""}]), "{hpa}");
    let evs = events(&node, "HorizontalPodAutoscaler", "external");
    assert!(
        evs.iter()
            .any(|e| e.starts_with("FailedGetExternalMetric|horizontal-pod-autoscaler|unable to get external metric")),
        "{evs:?}"
    );
    assert!(
        evs.iter().any(|e| e.starts_with(
            "FailedComputeMetricsReplicas|horizontal-pod-autoscaler|invalid metrics (1 invalid out of 1), first error is: failed to get queue external metric value: failed to get queue external metric: unable to get external metric"
        )),
        "{evs:?}"
    );

    let hpa = json_of(&node, &["get", "hpa", "object"]);
    assert_eq!(
        condition(&hpa, "ScalingActive"),
        (
            "False".into(),
            "FailedGetObjectMetric".into(),
            "the HPA was unable to compute the replica count: unable to get metric requests: Service on default front/unable to fetch metrics from custom metrics API: no custom metrics API (custom.metrics.k8s.io) registered".into()
        )
    );
}

/// A custom resource with a scale subresource is a scale target like any
/// other: found through discovery, scaled through its `scale`, its
/// selector read from its labelSelectorPath.
#[test]
fn autoscalers_scale_custom_resources_through_their_scale_subresource() {
    let node = Node::start(&[]);
    node.apply(
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {replicas: {type: integer}}}
          status: {type: object, properties: {replicas: {type: integer}, selector: {type: string}}}
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
"#,
    );
    node.ok(&["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=30s"]);
    node.apply(
        r#"
apiVersion: example.com/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {replicas: 1}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: widget, namespace: default}
spec:
  scaleTargetRef: {apiVersion: example.com/v1, kind: Widget, name: w}
  minReplicas: 2
  maxReplicas: 3
"#,
    );
    node.eventually("the widget is scaled to the autoscaler's minimum", 60, || {
        node.get(&["widget", "w"], "{.spec.replicas}").trim() == "2"
    });
    assert!(events(&node, "HorizontalPodAutoscaler", "widget").contains(
        &"SuccessfulRescale|horizontal-pod-autoscaler|New size: 2; reason: Current number of replicas below Spec.MinReplicas"
            .to_string()
    ));
    // At its minimum its metrics count, and its scale names no selector.
    node.eventually("the missing selector is reported", 60, || {
        condition(&json_of(&node, &["get", "hpa", "widget"]), "ScalingActive")
            == ("False".into(), "InvalidSelector".into(), "the HPA target's scale is missing a selector".into())
    });
    assert!(events(&node, "HorizontalPodAutoscaler", "widget")
        .contains(&"SelectorRequired|horizontal-pod-autoscaler|selector is required".to_string()));
    let scale = raw(&node, "/apis/example.com/v1/namespaces/default/widgets/w/scale");
    assert_eq!(scale["spec"]["replicas"], 2, "{scale}");
    // With a selector in its status, its scale reports it.
    node.ok(&[
        "patch",
        "widget",
        "w",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":2,"selector":"app=widget"}}"#,
    ]);
    let scale = raw(&node, "/apis/example.com/v1/namespaces/default/widgets/w/scale");
    assert_eq!(
        (scale["status"]["selector"].as_str(), scale["status"]["replicas"].as_i64()),
        (Some("app=widget"), Some(2))
    );
}

/// autoscaling/v1 reads and writes the stored v2 objects: the CPU
/// target is its own field, the rest rides in annotations and survives a
/// write through v1.
#[test]
fn autoscaling_v1_is_served_through_the_conversion_to_v2() {
    let node = Node::start(&[]);
    node.apply(
        r#"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: both, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: absent}
  minReplicas: 1
  maxReplicas: 5
  metrics:
  - type: Resource
    resource: {name: memory, target: {type: AverageValue, averageValue: 100Mi}}
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 70}}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 60}
"#,
    );
    let v1 = json_of(&node, &["get", "horizontalpodautoscalers.v1.autoscaling", "both"]);
    assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 70, "{v1}");
    let annotations = &v1["metadata"]["annotations"];
    assert_eq!(
        annotations["autoscaling.alpha.kubernetes.io/metrics"],
        r#"[{"type":"Resource","resource":{"name":"memory","targetAverageValue":"100Mi"}}]"#
    );
    assert!(annotations["autoscaling.alpha.kubernetes.io/behavior"]
        .as_str()
        .is_some_and(|b| b.contains(r#""StabilizationWindowSeconds":60"#)));
    // A merge patch through v1 changes the v1 fields and keeps the rest.
    node.ok(&[
        "patch",
        "horizontalpodautoscalers.v1.autoscaling",
        "both",
        "--type=merge",
        "-p",
        r#"{"spec":{"maxReplicas":7,"targetCPUUtilizationPercentage":40}}"#,
    ]);
    let v2 = json_of(&node, &["get", "horizontalpodautoscalers.v2.autoscaling", "both"]);
    assert_eq!(v2["spec"]["maxReplicas"], 7);
    assert_eq!(v2["spec"]["metrics"][0]["resource"]["name"], "memory");
    assert_eq!(v2["spec"]["metrics"][1]["resource"]["target"]["averageUtilization"], 40);
    assert_eq!(v2["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"], 60, "{v2}");
    let stored = v2["metadata"]["annotations"].as_object().cloned().unwrap_or_default();
    assert!(
        !stored.keys().any(|k| k.starts_with("autoscaling.alpha.kubernetes.io/")),
        "no round-trip annotation is stored: {v2}"
    );
    // Created through v1 without a target: 80 % CPU, as upstream.
    node.apply(
        r#"
apiVersion: autoscaling/v1
kind: HorizontalPodAutoscaler
metadata: {name: plain, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: absent}
  maxReplicas: 2
"#,
    );
    let v2 = json_of(&node, &["get", "horizontalpodautoscalers.v2.autoscaling", "plain"]);
    assert_eq!(v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 80, "{v2}");
    assert_eq!(v2["spec"]["minReplicas"], 1);
    let list = json_of(&node, &["get", "horizontalpodautoscalers.v1.autoscaling"]);
    let names: Vec<&str> =
        list["items"].as_array().into_iter().flatten().filter_map(|i| i["metadata"]["name"].as_str()).collect();
    assert_eq!(names, ["both", "plain"]);
    assert!(list["items"].as_array().into_iter().flatten().all(|i| i["apiVersion"] == "autoscaling/v1"), "{list}");
    let table = node.ok(&["get", "horizontalpodautoscalers.v1.autoscaling", "plain"]);
    assert!(table.contains("Deployment/absent") && table.contains("/80%"), "{table}");
    // Both versions are discovered, v2 preferred.
    let group = raw(&node, "/apis/autoscaling");
    assert_eq!(group["preferredVersion"]["version"], "v2", "{group}");
    let resources = node.ok(&["get", "--raw", "/apis/autoscaling/v1"]);
    assert!(resources.contains(r#""name":"horizontalpodautoscalers/status""#), "{resources}");
    // Deleting through v1 deletes the one object.
    node.ok(&["delete", "horizontalpodautoscalers.v1.autoscaling", "plain"]);
    let (ok, out) = node.kubectl(&["get", "horizontalpodautoscalers.v2.autoscaling", "plain"]);
    assert!(!ok && out.contains("NotFound"), "{out}");
}
