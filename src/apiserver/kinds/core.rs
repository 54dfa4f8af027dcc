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
pub fn pod_status_word(pod: &Value) -> String {
    let mut reason =
        str_at(pod, &["status", "reason"]).or(str_at(pod, &["status", "phase"])).unwrap_or("Pending").to_string();
    let statuses = at(pod, &["status", "containerStatuses"]).and_then(Value::as_array);
    if let Some(statuses) = statuses {
        for cs in statuses.iter().rev() {
            if let Some(r) = at(cs, &["state", "waiting", "reason"]).and_then(Value::as_str).filter(|r| !r.is_empty()) {
                reason = r.to_string();
            } else if let Some(term) = at(cs, &["state", "terminated"]) {
                reason = match term.get("reason").and_then(Value::as_str).filter(|r| !r.is_empty()) {
                    Some(r) => r.to_string(),
                    None => match term.get("signal").and_then(Value::as_i64).filter(|s| *s != 0) {
                        Some(sig) => format!("Signal:{sig}"),
                        None => format!("ExitCode:{}", term.get("exitCode").and_then(Value::as_i64).unwrap_or(0)),
                    },
                };
            }
        }
    }
    if at(pod, &["metadata", "deletionTimestamp"]).is_some() {
        reason = if str_at(pod, &["status", "reason"]) == Some("NodeLost") {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    reason
}

fn pod_cells(pod: &Value) -> Vec<Value> {
    let total = len(pod, &["spec", "containers"]);
    let statuses = at(pod, &["status", "containerStatuses"]).and_then(Value::as_array).cloned().unwrap_or_default();
    let ready = statuses.iter().filter(|s| s.get("ready").and_then(Value::as_bool).unwrap_or(false)).count();
    let restarts: i64 = statuses.iter().map(|s| s.get("restartCount").and_then(Value::as_i64).unwrap_or(0)).sum();
    let gates = len(pod, &["spec", "readinessGates"]);
    vec![
        json!(format!("{ready}/{total}")),
        json!(pod_status_word(pod)),
        json!(restarts.to_string()),
        json!(age(pod)),
        or_none(str_at(pod, &["status", "podIP"]).unwrap_or_default()),
        or_none(str_at(pod, &["spec", "nodeName"]).unwrap_or_default()),
        or_none(str_at(pod, &["status", "nominatedNodeName"]).unwrap_or_default()),
        if gates == 0 { json!("<none>") } else { json!(format!("0/{gates}")) },
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
