//! Pods: defaulting, validation, QoS class, initial status, graceful
//! deletion and the `kubectl get pods` columns.

use serde_json::{json, Value};

use super::{default_field, len, or_none, pod_ephemeral};
use crate::apiserver::meta::{self, age, at, str_at};
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::{check_name, DeleteRules, Hooks, NameRule};
use crate::apiserver::table::Column;

pub fn pod_hooks() -> Hooks {
    Hooks {
        default: default_pod,
        validate: validate_pod,
        initial_status: |obj| Some(json!({"phase": "Pending", "qosClass": qos_class(obj)})),
        columns: || {
            vec![
                Column::new("Ready", "string", 0),
                Column::new("Status", "string", 0),
                Column::new("Restarts", "string", 0),
                Column::age(),
                Column::new("IP", "string", 1),
                Column::new("Node", "string", 1),
                Column::new("Nominated Node", "string", 1),
                Column::new("Readiness Gates", "string", 1),
            ]
        },
        cells: pod_cells,
        delete: DeleteRules { grace_period: pod_grace_period, waits: pod_waits, ..DeleteRules::default() },
        subresource_update: |sub, new, old| match sub {
            pod_ephemeral::SUBRESOURCE => pod_ephemeral::ephemeral_containers_update(new, old),
            _ => new,
        },
        validate_change: pod_ephemeral::validate_pod_change,
        ..Hooks::default()
    }
}

/// Upstream's pod CheckGracefulDelete: a pod bound to a node waits for the
/// node to stop it, for DeleteOptions.gracePeriodSeconds or else its
/// spec.terminationGracePeriodSeconds (30 by default); an unbound pod, or
/// a grace period of 0, goes at once.
fn pod_grace_period(pod: &Value, requested: Option<i64>) -> Option<i64> {
    let on_node = str_at(pod, &["spec", "nodeName"]).is_some_and(|n| !n.is_empty());
    let grace = requested
        .unwrap_or_else(|| pod.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(30));
    (on_node && grace > 0).then_some(grace)
}

/// A pod marked for deletion with a grace period waits for its node, which
/// deletes it with a grace period of 0 once its containers are stopped.
fn pod_waits(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0) > 0
}

fn default_container(c: &mut Value) {
    default_field(c, "terminationMessagePath", json!("/dev/termination-log"));
    default_field(c, "terminationMessagePolicy", json!("File"));
    let image = c.get("image").and_then(Value::as_str).unwrap_or_default().to_string();
    let last = image.rsplit('/').next().unwrap_or_default();
    let latest = !image.contains('@') && (!last.contains(':') || last.ends_with(":latest"));
    default_field(c, "imagePullPolicy", json!(if latest { "Always" } else { "IfNotPresent" }));
    default_field(c, "resources", json!({}));
    if let Some(Value::Array(ports)) = c.get_mut("ports") {
        for p in ports {
            default_field(p, "protocol", json!("TCP"));
        }
    }
}

/// Upstream's pod spec defaults.
pub fn default_pod_spec(spec: &mut Value) {
    default_field(spec, "restartPolicy", json!("Always"));
    default_field(spec, "terminationGracePeriodSeconds", json!(30));
    default_field(spec, "dnsPolicy", json!("ClusterFirst"));
    default_field(spec, "securityContext", json!({}));
    default_field(spec, "schedulerName", json!("default-scheduler"));
    default_field(spec, "enableServiceLinks", json!(true));
    for key in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(key) {
            cs.iter_mut().for_each(default_container);
        }
    }
}

fn default_pod(obj: &mut Value) {
    if let Some(spec) = obj.get_mut("spec") {
        default_pod_spec(spec);
        default_field(spec, "priority", json!(0));
        for key in ["containers", "initContainers"] {
            if let Some(Value::Array(cs)) = spec.get_mut(key) {
                cs.iter_mut().for_each(default_requests_to_limits);
            }
        }
    }
}

/// Upstream's SetDefaults_Pod (a Pod's, not a template's): a resource a
/// container limits but does not request is requested at its limit, before
/// any admission plugin (LimitRanger) fills in what is still missing.
fn default_requests_to_limits(container: &mut Value) {
    let Some(resources) = container.get_mut("resources").and_then(Value::as_object_mut) else { return };
    let Some(limits) = resources.get("limits").and_then(Value::as_object).filter(|l| !l.is_empty()).cloned() else {
        return;
    };
    let requests = resources.entry("requests").or_insert_with(|| json!({}));
    if !requests.is_object() {
        *requests = json!({});
    }
    if let Some(requests) = requests.as_object_mut() {
        for (key, value) in limits {
            requests.entry(key).or_insert(value);
        }
    }
}

pub fn validate_pod_spec(spec: Option<&Value>, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let containers = spec.and_then(|s| s.get("containers")).and_then(Value::as_array);
    match containers {
        None => causes.push(Cause::required(format!("{path}.containers"))),
        Some(cs) if cs.is_empty() => causes.push(Cause::required(format!("{path}.containers"))),
        Some(cs) => {
            let mut names = std::collections::HashSet::new();
            for (i, c) in cs.iter().enumerate() {
                let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
                if name.is_empty() {
                    causes.push(Cause::required(format!("{path}.containers[{i}].name")));
                } else if !check_name(NameRule::Label, name).is_empty() {
                    causes.push(Cause::invalid(format!("{path}.containers[{i}].name"), format!("Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")));
                } else if !names.insert(name.to_string()) {
                    causes.push(Cause {
                        reason: "FieldValueDuplicate",
                        message: format!("Duplicate value: {name:?}"),
                        field: format!("{path}.containers[{i}].name"),
                    });
                }
                if c.get("image").and_then(Value::as_str).unwrap_or_default().is_empty() {
                    causes.push(Cause::required(format!("{path}.containers[{i}].image")));
                }
            }
        }
    }
    if let Some(policy) = spec.and_then(|s| s.get("restartPolicy")).and_then(Value::as_str) {
        if !["Always", "OnFailure", "Never"].contains(&policy) {
            causes.push(Cause {
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: {policy:?}: supported values: \"Always\", \"OnFailure\", \"Never\""
                ),
                field: format!("{path}.restartPolicy"),
            });
        }
    }
    causes.extend(pod_ephemeral::validate_ephemeral_containers(spec, path));
    causes.extend(super::quantities::validate_pod_resources(spec, path));
    causes
}

fn validate_pod(obj: &Value) -> Vec<Cause> {
    validate_pod_spec(obj.get("spec"), "spec")
}

/// Guaranteed, Burstable or BestEffort, from the containers' resources.
pub fn qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| at(pod, &["spec", k]).and_then(Value::as_array))
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        let requests = at(c, &["resources", "requests"]).and_then(Value::as_object);
        let limits = at(c, &["resources", "limits"]).and_then(Value::as_object);
        if requests.is_some_and(|r| !r.is_empty()) || limits.is_some_and(|l| !l.is_empty()) {
            any = true;
        }
        for res in ["cpu", "memory"] {
            let l = limits.and_then(|l| l.get(res));
            let r = requests.and_then(|r| r.get(res)).or(l);
            if l.is_none() || r != l {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed && !containers.is_empty() {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The STATUS column: the pod's reason, a waiting or terminated container's
/// reason, or its phase, worded as kubectl shows it.
/// READY, STATUS and RESTARTS of a pod as upstream's printPod computes
/// them: sidecars (restartable init containers) count as containers, an
/// init container that has not finished shows as `Init:…`, restarts show
/// when the last one was.
fn pod_summary(pod: &Value) -> (String, String, String) {
    let array = |path: &[&str]| at(pod, path).and_then(Value::as_array).cloned().unwrap_or_default();
    let init_specs = array(&["spec", "initContainers"]);
    let is_sidecar = |name: &str| {
        init_specs.iter().any(|c| {
            c.get("name").and_then(Value::as_str) == Some(name)
                && c.get("restartPolicy").and_then(Value::as_str) == Some("Always")
        })
    };
    let mut total = len(pod, &["spec", "containers"]);
    total += init_specs.iter().filter(|c| c.get("restartPolicy").and_then(Value::as_str) == Some("Always")).count();
    let mut ready = 0;
    let mut reason =
        str_at(pod, &["status", "reason"]).or(str_at(pod, &["status", "phase"])).unwrap_or("Pending").to_string();
    let gated = array(&["status", "conditions"]).iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("PodScheduled")
            && c.get("reason").and_then(Value::as_str) == Some("SchedulingGated")
    });
    if gated {
        reason = "SchedulingGated".into();
    }
    let finished = |c: &Value| {
        at(c, &["lastState", "terminated", "finishedAt"]).and_then(Value::as_str).and_then(meta::parse_rfc3339)
    };
    let (mut restarts, mut last_restart) = (0i64, None::<i64>);
    let (mut sidecar_restarts, mut sidecar_last) = (0i64, None::<i64>);
    let later = |a: Option<i64>, b: Option<i64>| a.max(b);
    let mut initializing = false;
    let init_statuses = array(&["status", "initContainerStatuses"]);
    for (i, c) in init_statuses.iter().enumerate() {
        let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
        let count = c.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
        restarts += count;
        last_restart = later(last_restart, finished(c));
        let sidecar = is_sidecar(name);
        if sidecar {
            sidecar_restarts += count;
            sidecar_last = later(sidecar_last, finished(c));
        }
        let term = at(c, &["state", "terminated"]);
        let waiting = at(c, &["state", "waiting", "reason"]).and_then(Value::as_str).filter(|r| !r.is_empty());
        if term.is_some_and(|t| t.get("exitCode").and_then(Value::as_i64) == Some(0)) {
            continue;
        }
        if sidecar && c.get("started").and_then(Value::as_bool) == Some(true) {
            if c.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        reason = if let Some(t) = term {
            match t.get("reason").and_then(Value::as_str).filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None => match t.get("signal").and_then(Value::as_i64).filter(|s| *s != 0) {
                    Some(sig) => format!("Init:Signal:{sig}"),
                    None => format!("Init:ExitCode:{}", t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)),
                },
            }
        } else if let Some(w) = waiting.filter(|w| *w != "PodInitializing") {
            format!("Init:{w}")
        } else {
            format!("Init:{i}/{}", init_specs.len())
        };
        initializing = true;
        break;
    }
    let initialized = array(&["status", "conditions"]).iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("Initialized")
            && c.get("status").and_then(Value::as_str) == Some("True")
    });
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = sidecar_last;
        let mut running = false;
        for c in array(&["status", "containerStatuses"]).iter().rev() {
            restarts += c.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
            last_restart = later(last_restart, finished(c));
            let waiting = at(c, &["state", "waiting", "reason"]).and_then(Value::as_str).filter(|r| !r.is_empty());
            let term = at(c, &["state", "terminated"]);
            if let Some(w) = waiting {
                reason = w.to_string();
            } else if let Some(t) = term {
                reason = match t.get("reason").and_then(Value::as_str).filter(|r| !r.is_empty()) {
                    Some(r) => r.to_string(),
                    None => match t.get("signal").and_then(Value::as_i64).filter(|s| *s != 0) {
                        Some(sig) => format!("Signal:{sig}"),
                        None => format!("ExitCode:{}", t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)),
                    },
                };
            } else if c.get("ready").and_then(Value::as_bool) == Some(true) && at(c, &["state", "running"]).is_some() {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            let has_ready = array(&["status", "conditions"]).iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            });
            reason = if has_ready { "Running".into() } else { "NotReady".into() };
        }
    }
    let terminal = matches!(str_at(pod, &["status", "phase"]), Some("Succeeded") | Some("Failed"));
    if at(pod, &["metadata", "deletionTimestamp"]).is_some() {
        if str_at(pod, &["status", "reason"]) == Some("NodeLost") {
            reason = "Unknown".into();
        } else if !terminal {
            reason = "Terminating".into();
        }
    }
    let restarts = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", meta::human_duration(meta::unix_now() - t)),
        _ => restarts.to_string(),
    };
    (format!("{ready}/{total}"), reason, restarts)
}

/// The STATUS word `kubectl get pods` shows.
pub fn pod_status_word(pod: &Value) -> String {
    pod_summary(pod).1
}

fn pod_cells(pod: &Value) -> Vec<Value> {
    let (ready, status, restarts) = pod_summary(pod);
    let gates: Vec<String> = at(pod, &["spec", "readinessGates"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|g| g.get("conditionType").and_then(Value::as_str).map(str::to_string))
        .collect();
    let gates_true = gates
        .iter()
        .filter(|g| {
            at(pod, &["status", "conditions"]).and_then(Value::as_array).is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.get("type").and_then(Value::as_str) == Some(g.as_str())
                        && c.get("status").and_then(Value::as_str) == Some("True")
                })
            })
        })
        .count();
    vec![
        json!(ready),
        json!(status),
        json!(restarts),
        json!(age(pod)),
        or_none(str_at(pod, &["status", "podIP"]).unwrap_or_default()),
        or_none(str_at(pod, &["spec", "nodeName"]).unwrap_or_default()),
        or_none(str_at(pod, &["status", "nominatedNodeName"]).unwrap_or_default()),
        if gates.is_empty() { json!("<none>") } else { json!(format!("{gates_true}/{}", gates.len())) },
    ]
}

#[cfg(test)]
mod pod_table_tests {
    use super::*;

    #[test]
    fn sidecars_count_and_init_containers_show_progress() {
        let pod = json!({
            "spec": {"initContainers": [{"name": "i"}, {"name": "s", "restartPolicy": "Always"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i", "restartCount": 0, "state": {"running": {}}},
                {"name": "s", "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
            ], "containerStatuses": [{"name": "a", "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]}
        });
        assert_eq!(pod_summary(&pod), ("0/2".into(), "Init:0/2".into(), "0".into()));
        let pod = json!({
            "spec": {"initContainers": [{"name": "s", "restartPolicy": "Always"}], "containers": [{"name": "a"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Initialized", "status": "True"}],
              "initContainerStatuses": [{"name": "s", "started": true, "ready": true, "restartCount": 0, "state": {"running": {}}}],
              "containerStatuses": [{"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}},
                 "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2020-01-01T00:00:00Z"}}}]}
        });
        let (ready, status, restarts) = pod_summary(&pod);
        assert_eq!((ready.as_str(), status.as_str()), ("2/2", "Running"));
        assert!(restarts.starts_with("2 (") && restarts.ends_with(" ago)"), "{restarts}");
    }

    #[test]
    fn graceful_deletion_waits_for_the_node() {
        let bound = json!({"spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 5}});
        assert_eq!(pod_grace_period(&bound, None), Some(5));
        assert_eq!(pod_grace_period(&bound, Some(0)), None);
        assert_eq!(pod_grace_period(&json!({"spec": {"nodeName": "n1"}}), None), Some(30));
        assert_eq!(pod_grace_period(&json!({"spec": {}}), Some(10)), None);
        assert!(pod_waits(&json!({"metadata": {"deletionGracePeriodSeconds": 5}})));
        assert!(!pod_waits(&json!({"metadata": {"deletionGracePeriodSeconds": 0}})));
    }

    #[test]
    fn crash_loops_and_terminating() {
        let pod = json!({
            "metadata": {"deletionTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "a", "restartCount": 0, "state": {"running": {}}}]}
        });
        assert_eq!(pod_summary(&pod).1, "Terminating");
        let pod = json!({
            "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "a", "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        });
        assert_eq!(pod_summary(&pod).1, "CrashLoopBackOff");
    }
}
