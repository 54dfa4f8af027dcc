//! The scheduler inside `ferrok server`, driven with kubectl: Node objects
//! are created through the API (with status.allocatable, labels and
//! taints; no kubelet runs), pods are created and checked for
//! `spec.nodeName`, `PodScheduled` and FailedScheduling events.

mod common;

use common::{eventually, kubectl};

use serde_json::{json, Value};

fn create(s: &common::ApiServer, obj: &Value) {
    common::create(s, &obj.to_string());
}

fn get(s: &common::ApiServer, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let (ok, out) = kubectl(s, &all);
    assert!(ok, "{out}");
    serde_json::from_str(&out).expect("json")
}

/// A node with 110 pods' room, `cpu` cores and 4Gi of memory a core, the
/// hostname label and `labels`.
fn node(s: &common::ApiServer, name: &str, cpu: &str, labels: Value, taints: Value) {
    let memory = format!("{}Gi", 4 * cpu.parse::<u32>().expect("whole cores"));
    let mut all = json!({"kubernetes.io/hostname": name});
    all.as_object_mut().expect("labels").extend(labels.as_object().cloned().unwrap_or_default());
    create(
        s,
        &json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": all},
            "spec": {"taints": taints},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                "capacity": {"cpu": cpu, "memory": memory, "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]
            }
        }),
    );
}

/// A pod whose spec is `extra` over one container asking for `cpu`.
fn pod(s: &common::ApiServer, name: &str, labels: Value, cpu: &str, extra: Value) {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox:1.36",
        "resources": {"requests": {"cpu": cpu}}}]});
    spec.as_object_mut().expect("spec").extend(extra.as_object().cloned().unwrap_or_default());
    create(s, &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}));
}

fn node_of(s: &common::ApiServer, pod: &str) -> String {
    let (_, out) = kubectl(s, &["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"]);
    out
}

fn wait_bound(s: &common::ApiServer, pod: &str) -> String {
    eventually(&format!("{pod} to be scheduled"), || !node_of(s, pod).is_empty());
    node_of(s, pod)
}

/// Waits for the pod's FailedScheduling event and returns its message.
fn failed_scheduling(s: &common::ApiServer, pod: &str) -> String {
    let selector = format!("involvedObject.name={pod},reason=FailedScheduling");
    let mut message = String::new();
    eventually(&format!("FailedScheduling for {pod}"), || {
        let events = get(s, &["get", "events", "--field-selector", &selector]);
        match events["items"].as_array().and_then(|i| i.last()) {
            Some(e) => {
                message = e["message"].as_str().unwrap_or_default().to_string();
                true
            }
            None => false,
        }
    });
    assert!(node_of(s, pod).is_empty());
    let cond = get(s, &["get", "pod", pod]);
    let scheduled =
        cond["status"]["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "PodScheduled"));
    let scheduled = scheduled.expect("PodScheduled condition");
    assert_eq!(scheduled["status"], "False");
    assert_eq!(scheduled["reason"], "Unschedulable");
    message
}

#[test]
fn resources_taints_selectors_and_unknown_schedulers() {
    let s = common::ApiServer::start();
    node(&s, "n1", "2", json!({}), json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]));
    node(&s, "n2", "2", json!({}), json!(null));
    node(&s, "n3", "4", json!({"disk": "ssd"}), json!(null));

    pod(&s, "ssd", json!({}), "100m", json!({"nodeSelector": {"disk": "ssd"}}));
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}});
    let toleration = json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]);
    pod(&s, "gpu", json!({}), "100m", json!({"affinity": affinity, "tolerations": toleration}));
    pod(&s, "untolerated", json!({}), "100m", json!({"affinity": affinity}));
    pod(&s, "big", json!({}), "5", json!({}));
    pod(&s, "other-scheduler", json!({}), "100m", json!({"schedulerName": "my-scheduler"}));

    assert_eq!(wait_bound(&s, "ssd"), "n3");
    assert_eq!(wait_bound(&s, "gpu"), "n1");
    let (_, events) = kubectl(&s, &["get", "events", "--field-selector", "involvedObject.name=gpu,reason=Scheduled"]);
    assert!(events.contains("Successfully assigned default/gpu to n1"), "{events}");
    assert_eq!(
        failed_scheduling(&s, "untolerated"),
        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, \
         2 node(s) didn't match Pod's node affinity/selector. \
         preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.."
    );
    // n2 and n3 are too small and hold nothing of lower priority; n1 is tainted.
    assert_eq!(
        failed_scheduling(&s, "big"),
        "0/3 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 2 Insufficient cpu. \
         preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, \
         2 No preemption victims found for incoming pod.."
    );
    // No scheduler of that name: the pod is left alone.
    assert!(node_of(&s, "other-scheduler").is_empty());
    let p = get(&s, &["get", "pod", "other-scheduler"]);
    assert!(p["status"]["conditions"].is_null(), "{p}");
    let (_, events) = kubectl(&s, &["get", "events", "--field-selector", "involvedObject.name=other-scheduler"]);
    assert!(events.contains("No resources found"), "{events}");
}

#[test]
fn anti_affinity_and_topology_spread() {
    let s = common::ApiServer::start();
    node(&s, "n1", "4", json!({"topology.kubernetes.io/zone": "a"}), json!(null));
    node(&s, "n2", "4", json!({"topology.kubernetes.io/zone": "a"}), json!(null));
    node(&s, "n3", "4", json!({"topology.kubernetes.io/zone": "b"}), json!(null));

    // Replicas that must not share a host.
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}}});
    for i in 1..=4 {
        pod(&s, &format!("web-{i}"), json!({"app": "web"}), "100m", anti.clone());
    }
    let mut hosts: Vec<String> = Vec::new();
    eventually("three web replicas on three hosts", || {
        hosts = (1..=4).map(|i| node_of(&s, &format!("web-{i}"))).filter(|n| !n.is_empty()).collect();
        hosts.len() == 3
    });
    hosts.sort();
    assert_eq!(hosts, ["n1", "n2", "n3"]);
    let pending = (1..=4).map(|i| format!("web-{i}")).find(|p| node_of(&s, p).is_empty()).expect("a pending replica");
    assert_eq!(
        failed_scheduling(&s, &pending),
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules. \
         preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.."
    );

    // Pods that follow a web pod into its zone (pod affinity).
    let follow = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "topology.kubernetes.io/zone"}]}}});
    pod(&s, "follower", json!({}), "100m", follow);
    wait_bound(&s, "follower");
    let nowhere = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "nothing"}}, "topologyKey": "topology.kubernetes.io/zone"}]}}});
    pod(&s, "lonely", json!({}), "100m", nowhere);
    assert_eq!(
        failed_scheduling(&s, "lonely"),
        "0/3 nodes are available: 3 node(s) didn't match pod affinity rules. \
         preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.."
    );
    // A matching pod placed anywhere wakes it, and it follows into that zone.
    pod(&s, "target", json!({"app": "nothing"}), "100m", json!({"nodeSelector": {"kubernetes.io/hostname": "n3"}}));
    assert_eq!(wait_bound(&s, "target"), "n3");
    assert_eq!(wait_bound(&s, "lonely"), "n3");

    // Spread evenly over the two zones.
    let spread = |key: &str| {
        json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "spread"}}}]})
    };
    for i in 1..=4 {
        pod(&s, &format!("spread-{i}"), json!({"app": "spread"}), "100m", spread("topology.kubernetes.io/zone"));
    }
    let mut zones = Vec::new();
    eventually("four spread pods scheduled", || {
        zones = (1..=4).map(|i| node_of(&s, &format!("spread-{i}"))).collect();
        zones.iter().all(|n| !n.is_empty())
    });
    let in_b = zones.iter().filter(|n| *n == "n3").count();
    assert_eq!(in_b, 2, "{zones:?}");
    pod(&s, "no-rack", json!({"app": "spread"}), "100m", spread("rack"));
    assert_eq!(
        failed_scheduling(&s, "no-rack"),
        "0/3 nodes are available: 3 node(s) didn't match pod topology spread constraints (missing required label). \
         preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.."
    );
}

#[test]
fn a_high_priority_pod_preempts_a_low_priority_one() {
    let s = common::ApiServer::start();
    node(&s, "n1", "2", json!({}), json!(null));
    for (name, value) in [("low", 100), ("high", 1000)] {
        create(
            &s,
            &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value}),
        );
    }
    pod(&s, "victim", json!({"app": "batch"}), "1500m", json!({"priorityClassName": "low"}));
    assert_eq!(wait_bound(&s, "victim"), "n1");
    let victim_uid = get(&s, &["get", "pod", "victim"])["metadata"]["uid"].as_str().expect("uid").to_string();

    // An equal-priority pod cannot preempt.
    pod(&s, "peer", json!({}), "1500m", json!({"priorityClassName": "low"}));
    assert_eq!(
        failed_scheduling(&s, "peer"),
        "0/1 nodes are available: 1 Insufficient cpu. \
         preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.."
    );

    // Nor can one that may not preempt.
    pod(&s, "polite", json!({}), "1500m", json!({"priorityClassName": "high", "preemptionPolicy": "Never"}));
    assert_eq!(
        failed_scheduling(&s, "polite"),
        "0/1 nodes are available: 1 Insufficient cpu. preemption: not eligible due to preemptionPolicy=Never.."
    );

    pod(&s, "preemptor", json!({}), "1500m", json!({"priorityClassName": "high"}));
    eventually("the preemptor to be nominated to n1", || {
        let p = get(&s, &["get", "pod", "preemptor"]);
        p["status"]["nominatedNodeName"] == "n1"
    });
    let preemptor_uid = get(&s, &["get", "pod", "preemptor"])["metadata"]["uid"].as_str().expect("uid").to_string();
    // The victim is terminating (no kubelet here finishes it) and says why.
    let victim = get(&s, &["get", "pod", "victim"]);
    assert_eq!(victim["metadata"]["uid"], victim_uid.as_str());
    assert!(victim["metadata"]["deletionTimestamp"].is_string(), "{victim}");
    let target = victim["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "DisruptionTarget"))
        .cloned()
        .expect("DisruptionTarget condition");
    assert_eq!(target["reason"], "PreemptionByScheduler");
    assert_eq!(target["message"], "default-scheduler: preempting to accommodate a higher priority pod");
    let mut events = String::new();
    eventually("the Preempted event", || {
        events = kubectl(&s, &["get", "events", "--field-selector", "involvedObject.name=victim,reason=Preempted"]).1;
        events.contains("Preempted by pod")
    });
    assert!(events.contains(&format!("Preempted by pod {preemptor_uid} on node n1")), "{events}");
    // The peer does not take the room nominated to the preemptor.
    assert!(node_of(&s, "peer").is_empty());

    // A cordoned node cannot be preempted on: the nomination is dropped,
    // and taken again once the node is back.
    let nominated = || get(&s, &["get", "pod", "preemptor"])["status"]["nominatedNodeName"].clone();
    assert!(kubectl(&s, &["cordon", "n1"]).0);
    eventually("the nomination to be cleared", || nominated().is_null());
    assert!(kubectl(&s, &["uncordon", "n1"]).0);
    eventually("the preemptor to be nominated again", || nominated() == "n1");

    // Once the victim is gone the preemptor is bound there.
    assert!(kubectl(&s, &["delete", "pod", "victim", "--grace-period=0", "--force"]).0);
    assert_eq!(wait_bound(&s, "preemptor"), "n1");
    assert!(node_of(&s, "peer").is_empty());
}

#[test]
fn pods_of_a_service_are_spread_by_default() {
    let s = common::ApiServer::start();
    // The big node wins on free resources alone.
    node(&s, "big", "64", json!({}), json!(null));
    node(&s, "small", "4", json!({}), json!(null));
    for i in 1..=2 {
        let name = format!("plain-{i}");
        pod(&s, &name, json!({"app": "plain"}), "100m", json!({}));
        assert_eq!(wait_bound(&s, &name), "big");
    }
    // Pods a Service selects get upstream's system default spreading.
    create(
        &s,
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"},
            "spec": {"selector": {"app": "svc"}, "ports": [{"port": 80}]}}),
    );
    eventually("the Service", || kubectl(&s, &["get", "service", "svc"]).0);
    let hosts: Vec<String> = (1..=2)
        .map(|i| {
            let name = format!("svc-{i}");
            pod(&s, &name, json!({"app": "svc"}), "100m", json!({}));
            wait_bound(&s, &name)
        })
        .collect();
    assert!(hosts.contains(&"small".to_string()), "{hosts:?}");
}

/// `scheduler_schedule_attempts_total` of the default profile with `result`.
fn attempts(s: &common::ApiServer, result: &str) -> u64 {
    let (ok, out) = kubectl(s, &["get", "--raw", "/metrics"]);
    assert!(ok, "{out}");
    let series = format!("scheduler_schedule_attempts_total{{profile=\"default-scheduler\",result=\"{result}\"}} ");
    out.lines().find_map(|l| l.strip_prefix(series.as_str())).map_or(0, |n| n.parse().expect("a count"))
}

/// Upstream's queueing hints: a pod that fit nowhere is tried again only
/// for a cluster event that may help it, as the plugins that rejected it
/// judge; other node events leave it waiting.
#[test]
fn a_waiting_pod_is_woken_only_by_a_node_that_may_take_it() {
    let s = common::ApiServer::start();
    node(&s, "n1", "1", json!({}), json!(null));
    pod(&s, "ssd", json!({}), "100m", json!({"nodeSelector": {"disk": "ssd"}}));
    pod(&s, "probe", json!({}), "100m", json!({"nodeSelector": {"probe": "yes"}}));
    failed_scheduling(&s, "ssd");
    failed_scheduling(&s, "probe");
    let failed = attempts(&s, "unschedulable");
    assert!(failed >= 2, "{failed}");

    // Neither a new node without the label, nor one with another value,
    // nor a label change on n1 can let either pod fit.
    node(&s, "n2", "1", json!({}), json!(null));
    node(&s, "n3", "1", json!({"disk": "hdd"}), json!(null));
    let (ok, out) = kubectl(&s, &["label", "node", "n1", "zone=a"]);
    assert!(ok, "{out}");
    // The scheduler reads node events in order: once `probe` is placed on
    // n4, the events before it have been judged (and `ssd`, had it been
    // woken by one, tried first, being older).
    node(&s, "n4", "1", json!({"probe": "yes"}), json!(null));
    assert_eq!(wait_bound(&s, "probe"), "n4");
    assert_eq!(attempts(&s, "unschedulable"), failed, "a node that cannot take a pod woke it");
    assert!(node_of(&s, "ssd").is_empty());

    // A label that matches wakes it.
    let (ok, out) = kubectl(&s, &["label", "node", "n2", "disk=ssd"]);
    assert!(ok, "{out}");
    assert_eq!(wait_bound(&s, "ssd"), "n2");
    let (_, metrics) = kubectl(&s, &["get", "--raw", "/metrics"]);
    assert!(metrics.contains("scheduler_queue_incoming_pods_total{event=\"NodeUpdate\","), "{metrics}");
}
