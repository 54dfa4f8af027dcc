//! Pods, ConfigMaps, Secrets, Namespaces, Services, ServiceAccounts and
//! Nodes.

use serde_json::{json, Value};

use super::{default_field, int, len, map_selector_string, or_none};
use crate::apiserver::meta::{self, age, at, str_at};
use crate::apiserver::registry::strategy::{check_name, Hooks, NameRule};
use crate::apiserver::status::Cause;
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
        ..Hooks::default()
    }
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
    for key in ["containers", "initContainers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(key) {
            cs.iter_mut().for_each(default_container);
        }
    }
}

fn default_pod(obj: &mut Value) {
    if let Some(spec) = obj.get_mut("spec") {
        default_pod_spec(spec);
        default_field(spec, "priority", json!(0));
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

pub fn configmap_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Data", "integer", 0), Column::age()],
        cells: |o| vec![json!(len(o, &["data"]) + len(o, &["binaryData"])), json!(age(o))],
        validate: |o| validate_data_keys(o, &["data", "binaryData"]),
        ..Hooks::default()
    }
}

fn validate_data_keys(obj: &Value, fields: &[&str]) -> Vec<Cause> {
    let mut causes = Vec::new();
    for f in fields {
        if let Some(Value::Object(m)) = obj.get(*f) {
            for k in m.keys() {
                let ok = !k.is_empty()
                    && k.len() <= 253
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
                    && k != "."
                    && k != "..";
                if !ok {
                    causes.push(Cause::invalid(format!("{f}[{k}]"), format!("Invalid value: {k:?}: a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')")));
                }
            }
        }
    }
    causes
}

pub fn secret_hooks() -> Hooks {
    Hooks {
        default: |o| default_field(o, "type", json!("Opaque")),
        validate: |o| validate_data_keys(o, &["data", "stringData"]),
        columns: || vec![Column::new("Type", "string", 0), Column::new("Data", "string", 0), Column::age()],
        cells: |o| vec![json!(str_at(o, &["type"]).unwrap_or("Opaque")), json!(len(o, &["data"])), json!(age(o))],
        ..Hooks::default()
    }
}

pub fn namespace_hooks() -> Hooks {
    Hooks {
        name_rule: NameRule::Label,
        default: |o| {
            let name = meta::name_of(o).to_string();
            let labels = meta::metadata_mut(o).entry("labels").or_insert_with(|| json!({}));
            if let Some(m) = labels.as_object_mut() {
                m.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
            if let Some(Value::Object(spec)) = o.get_mut("spec") {
                spec.entry("finalizers").or_insert_with(|| json!(["kubernetes"]));
            } else {
                o["spec"] = json!({"finalizers": ["kubernetes"]});
            }
        },
        initial_status: |_| Some(json!({"phase": "Active"})),
        columns: || vec![Column::new("Status", "string", 0), Column::age()],
        cells: |o| vec![json!(str_at(o, &["status", "phase"]).unwrap_or("Active")), json!(age(o))],
        ..Hooks::default()
    }
}

pub fn service_hooks() -> Hooks {
    Hooks {
        name_rule: NameRule::Label,
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                default_field(spec, "type", json!("ClusterIP"));
                default_field(spec, "sessionAffinity", json!("None"));
                let external_name = spec.get("type").and_then(Value::as_str) == Some("ExternalName");
                if !external_name {
                    default_field(spec, "internalTrafficPolicy", json!("Cluster"));
                    default_field(spec, "ipFamilyPolicy", json!("SingleStack"));
                    default_field(spec, "ipFamilies", json!(["IPv4"]));
                }
                if let Some(Value::Array(ports)) = spec.get_mut("ports") {
                    for p in ports {
                        default_field(p, "protocol", json!("TCP"));
                        if p.get("targetPort").is_none() {
                            let port = p.get("port").cloned().unwrap_or(json!(0));
                            p["targetPort"] = port;
                        }
                    }
                }
            }
        },
        validate: |o| {
            let mut causes = Vec::new();
            let ty = str_at(o, &["spec", "type"]).unwrap_or("ClusterIP");
            if ty != "ExternalName"
                && len(o, &["spec", "ports"]) == 0
                && str_at(o, &["spec", "clusterIP"]) != Some("None")
            {
                causes.push(Cause::required("spec.ports"));
            }
            if let Some(Value::Array(ports)) = at(o, &["spec", "ports"]) {
                for (i, p) in ports.iter().enumerate() {
                    let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                    if !(1..=65535).contains(&port) {
                        causes.push(Cause::invalid(
                            format!("spec.ports[{i}].port"),
                            format!("Invalid value: {port}: must be between 1 and 65535, inclusive"),
                        ));
                    }
                    if ports.len() > 1 && p.get("name").and_then(Value::as_str).unwrap_or_default().is_empty() {
                        causes.push(Cause::required(format!("spec.ports[{i}].name")));
                    }
                }
            }
            causes
        },
        initial_status: |_| Some(json!({"loadBalancer": {}})),
        columns: || {
            vec![
                Column::new("Type", "string", 0),
                Column::new("Cluster-IP", "string", 0),
                Column::new("External-IP", "string", 0),
                Column::new("Port(s)", "string", 0),
                Column::age(),
                Column::new("Selector", "string", 1),
            ]
        },
        cells: service_cells,
        ..Hooks::default()
    }
}

fn service_cells(o: &Value) -> Vec<Value> {
    let ty = str_at(o, &["spec", "type"]).unwrap_or("ClusterIP");
    let external =
        match ty {
            "ExternalName" => str_at(o, &["spec", "externalName"]).unwrap_or("<none>").to_string(),
            _ => {
                let mut ips: Vec<String> = at(o, &["spec", "externalIPs"])
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                    .unwrap_or_default();
                if ty == "LoadBalancer" {
                    if let Some(Value::Array(ing)) = at(o, &["status", "loadBalancer", "ingress"]) {
                        ips.extend(ing.iter().filter_map(|i| {
                            i.get("ip").or(i.get("hostname")).and_then(Value::as_str).map(str::to_string)
                        }));
                    }
                    if ips.is_empty() {
                        ips.push("<pending>".into());
                    }
                }
                if ips.is_empty() {
                    "<none>".into()
                } else {
                    ips.join(",")
                }
            }
        };
    let ports = at(o, &["spec", "ports"])
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                    let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
                    match p.get("nodePort").and_then(Value::as_i64) {
                        Some(np) if np > 0 => format!("{port}:{np}/{proto}"),
                        _ => format!("{port}/{proto}"),
                    }
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "<none>".into());
    vec![
        json!(ty),
        or_none(str_at(o, &["spec", "clusterIP"]).unwrap_or_default()),
        json!(external),
        json!(ports),
        json!(age(o)),
        json!(map_selector_string(at(o, &["spec", "selector"]))),
    ]
}

pub fn serviceaccount_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Secrets", "string", 0), Column::age()],
        cells: |o| vec![json!(len(o, &["secrets"])), json!(age(o))],
        ..Hooks::default()
    }
}

pub fn node_hooks() -> Hooks {
    Hooks {
        // A kubelet registers its node with the status filled in; upstream
        // keeps all of it on create.
        initial_status: |obj| Some(obj.get("status").cloned().unwrap_or_else(|| json!({}))),
        columns: || {
            vec![
                Column::new("Status", "string", 0),
                Column::new("Roles", "string", 0),
                Column::age(),
                Column::new("Version", "string", 0),
                Column::new("Internal-IP", "string", 1),
                Column::new("External-IP", "string", 1),
                Column::new("OS-Image", "string", 1),
                Column::new("Kernel-Version", "string", 1),
                Column::new("Container-Runtime", "string", 1),
            ]
        },
        cells: |o| {
            let conds = at(o, &["status", "conditions"]).and_then(Value::as_array).cloned().unwrap_or_default();
            let ready = conds.iter().find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"));
            let mut status = match ready.and_then(|c| c.get("status")).and_then(Value::as_str) {
                Some("True") => "Ready".to_string(),
                Some(_) => "NotReady".to_string(),
                None => "Unknown".to_string(),
            };
            if at(o, &["spec", "unschedulable"]).and_then(Value::as_bool) == Some(true) {
                status.push_str(",SchedulingDisabled");
            }
            let mut roles: Vec<String> = at(o, &["metadata", "labels"])
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| {
                            k.strip_prefix("node-role.kubernetes.io/").map(str::to_string).or_else(|| {
                                (k == "kubernetes.io/role").then(|| v.as_str().unwrap_or_default().to_string())
                            })
                        })
                        .filter(|r| !r.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            roles.sort();
            let addr = |ty: &str| {
                at(o, &["status", "addresses"])
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().find(|x| x.get("type").and_then(Value::as_str) == Some(ty)))
                    .and_then(|x| x.get("address"))
                    .and_then(Value::as_str)
                    .unwrap_or("<none>")
                    .to_string()
            };
            let info = |k: &str| str_at(o, &["status", "nodeInfo", k]).unwrap_or("<unknown>").to_string();
            vec![
                json!(status),
                json!(if roles.is_empty() { "<none>".to_string() } else { roles.join(",") }),
                json!(age(o)),
                json!(str_at(o, &["status", "nodeInfo", "kubeletVersion"]).unwrap_or_default()),
                json!(addr("InternalIP")),
                json!(addr("ExternalIP")),
                json!(info("osImage")),
                json!(info("kernelVersion")),
                json!(info("containerRuntimeVersion")),
            ]
        },
        ..Hooks::default()
    }
}

/// Ready / total of a workload, for its READY column.
pub(crate) fn ready_of(o: &Value, ready_path: &[&str]) -> String {
    format!("{}/{}", int(o, ready_path), int(o, &["spec", "replicas"]))
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
