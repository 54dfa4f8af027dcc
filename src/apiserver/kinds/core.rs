//! ConfigMaps, Secrets, Namespaces, Services, ServiceAccounts and Nodes
//! (Pods have `pod.rs`).

use serde_json::{json, Value};

use super::{default_field, int, len, map_selector_string, or_none};
use crate::apiserver::meta::{self, age, at, str_at};
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::{DeleteRules, Hooks, NameRule};
use crate::apiserver::table::Column;

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

/// `stringData` is write-only, as upstream: its entries are written into
/// `data` (base64), over keys of the same name, and it is not stored.
fn merge_string_data(o: &mut Value) {
    use base64::Engine;
    let Some(Value::Object(strings)) = o.as_object_mut().and_then(|m| m.remove("stringData")) else { return };
    if !o.get("data").is_some_and(Value::is_object) {
        o["data"] = json!({});
    }
    if let Some(data) = o.get_mut("data").and_then(Value::as_object_mut) {
        for (k, v) in strings {
            let text = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            data.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(text)));
        }
    }
}

pub fn secret_hooks() -> Hooks {
    Hooks {
        default: |o| {
            default_field(o, "type", json!("Opaque"));
            merge_string_data(o);
        },
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
        // A namespace is deleted in two steps: Terminating while the namespace
        // controller empties it, then gone once spec.finalizers are removed
        // through /finalize.
        delete: DeleteRules {
            terminate: Some(|ns| ns["status"]["phase"] = json!("Terminating")),
            waits: |ns| ns.pointer("/spec/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty()),
            ..DeleteRules::default()
        },
        subresource_update: namespace_finalize,
        ..Hooks::default()
    }
}

/// `namespaces/finalize` writes spec.finalizers alone.
fn namespace_finalize(subresource: &str, new: Value, old: &Value) -> Value {
    if subresource != "finalize" {
        return new;
    }
    let mut merged = old.clone();
    merged["spec"]["finalizers"] = new.pointer("/spec/finalizers").cloned().unwrap_or(json!([]));
    merged
}

pub fn service_hooks() -> Hooks {
    Hooks {
        name_rule: NameRule::Label,
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                default_field(spec, "type", json!("ClusterIP"));
                default_field(spec, "sessionAffinity", json!("None"));
                let external_name = spec.get("type").and_then(Value::as_str) == Some("ExternalName");
                let ty = spec.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
                if ty == "NodePort" || ty == "LoadBalancer" {
                    default_field(spec, "externalTrafficPolicy", json!("Cluster"));
                }
                if ty == "LoadBalancer" {
                    default_field(spec, "allocateLoadBalancerNodePorts", json!(true));
                }
                if spec.get("sessionAffinity").and_then(Value::as_str) == Some("ClientIP") {
                    default_field(spec, "sessionAffinityConfig", json!({"clientIP": {"timeoutSeconds": 10800}}));
                }
                if !external_name {
                    default_field(spec, "internalTrafficPolicy", json!("Cluster"));
                    default_field(spec, "ipFamilyPolicy", json!("SingleStack"));
                    default_field(spec, "ipFamilies", json!(["IPv4"]));
                }
                if let Some(Value::Array(ports)) = spec.get_mut("ports") {
                    for p in ports {
                        default_field(p, "protocol", json!("TCP"));
                        // Unset is also what typed clients send for an
                        // unset IntOrString: 0 or "" (upstream defaults both).
                        let unset = match p.get("targetPort") {
                            None | Some(Value::Null) => true,
                            Some(Value::Number(n)) => n.as_i64() == Some(0),
                            Some(Value::String(s)) => s.is_empty(),
                            Some(_) => false,
                        };
                        if unset {
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

/// A node's podCIDRs as upstream keeps them (`podCIDRs`, else `[podCIDR]`).
fn node_pod_cidrs(o: &Value) -> Vec<&str> {
    let list: Vec<&str> = at(o, &["spec", "podCIDRs"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !list.is_empty() {
        return list;
    }
    str_at(o, &["spec", "podCIDR"]).filter(|c| !c.is_empty()).into_iter().collect()
}

/// Upstream's `ValidateNodeUpdate`: a podCIDR or providerID, once set, stays
/// (pods and routes are built on them).
fn validate_node_change(subresource: Option<&str>, new: &Value, old: Option<&Value>) -> Vec<Cause> {
    let (None, Some(old)) = (subresource, old) else { return Vec::new() };
    let mut causes = Vec::new();
    let old_cidrs = node_pod_cidrs(old);
    if !old_cidrs.is_empty() && old_cidrs != node_pod_cidrs(new) {
        causes.push(Cause::forbidden(
            "spec.podCIDRs",
            "Forbidden: node updates may not change podCIDR except from \"\" to valid",
        ));
    }
    let provider = |o| str_at(o, &["spec", "providerID"]).unwrap_or_default();
    if !provider(old).is_empty() && provider(old) != provider(new) {
        causes.push(Cause::forbidden(
            "spec.providerID",
            "Forbidden: node updates may not change providerID except from \"\" to valid",
        ));
    }
    causes
}

pub fn node_hooks() -> Hooks {
    Hooks {
        validate_change: validate_node_change,
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
mod secret_tests {
    use serde_json::json;

    #[test]
    fn string_data_is_written_into_data() {
        let mut o = json!({"data": {"a": "eA==", "b": "eQ=="}, "stringData": {"b": "z", "c": "hello"}});
        super::merge_string_data(&mut o);
        assert_eq!(o, json!({"data": {"a": "eA==", "b": "eg==", "c": "aGVsbG8="}}));
        let mut o = json!({"stringData": {"k": "v"}});
        super::merge_string_data(&mut o);
        assert_eq!(o, json!({"data": {"k": "dg=="}}));
    }
}

#[cfg(test)]
mod node_tests {
    use serde_json::json;

    use super::validate_node_change;

    #[test]
    fn a_podcidr_once_set_stays() {
        let unset = json!({"spec": {}});
        let a = json!({"spec": {"podCIDR": "10.42.1.0/24", "podCIDRs": ["10.42.1.0/24"]}});
        let b = json!({"spec": {"podCIDR": "10.42.2.0/24", "podCIDRs": ["10.42.2.0/24"]}});
        // From unset to a value: the IPAM controller's allocation.
        assert!(validate_node_change(None, &a, Some(&unset)).is_empty());
        assert!(validate_node_change(None, &a, Some(&a)).is_empty());
        let causes = validate_node_change(None, &b, Some(&a));
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "spec.podCIDRs");
        assert_eq!(causes[0].reason, "FieldValueForbidden");
        // Cleared is a change too; the old single-field form counts.
        assert_eq!(validate_node_change(None, &unset, Some(&a)).len(), 1);
        assert_eq!(validate_node_change(None, &b, Some(&json!({"spec": {"podCIDR": "10.42.1.0/24"}}))).len(), 1);
        // The status subresource keeps the spec anyway; a create has no old.
        assert!(validate_node_change(Some("status"), &b, Some(&a)).is_empty());
        assert!(validate_node_change(None, &b, None).is_empty());
        let p = |id: &str| json!({"spec": {"providerID": id}});
        assert!(validate_node_change(None, &p("k3s://n"), Some(&json!({"spec": {}}))).is_empty());
        assert_eq!(validate_node_change(None, &p("k3s://m"), Some(&p("k3s://n")))[0].field, "spec.providerID");
    }
}
