//! Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs, CronJobs,
//! ReplicationControllers, PodTemplates and ControllerRevisions.

use serde_json::{json, Value};

use super::core::ready_of;
use super::pod::{default_pod_spec, validate_pod_spec};
use super::{default_field, int, map_selector_string, selector_string};
use crate::apiserver::meta::{age, at, str_at};
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

fn default_template(spec: &mut Value) {
    if let Some(pod_spec) = spec.get_mut("template").and_then(|t| t.get_mut("spec")) {
        default_pod_spec(pod_spec);
    }
}

/// A workload's selector must be given and match its template's labels.
fn validate_workload(o: &Value, needs_selector: bool) -> Vec<Cause> {
    let mut causes = validate_pod_spec(at(o, &["spec", "template", "spec"]), "spec.template.spec");
    let selector = at(o, &["spec", "selector"]);
    if needs_selector && selector.is_none() {
        causes.push(Cause::required("spec.selector"));
    }
    if let (Some(Value::Object(want)), labels) =
        (selector.and_then(|s| s.get("matchLabels")), at(o, &["spec", "template", "metadata", "labels"]))
    {
        let ok = want.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
        if !ok {
            causes.push(Cause::invalid(
                "spec.template.metadata.labels",
                "Invalid value: `selector` does not match template `labels`",
            ));
        }
    }
    if int(o, &["spec", "replicas"]) < 0 {
        causes.push(Cause::invalid("spec.replicas", "Invalid value: must be greater than or equal to 0"));
    }
    causes
}

/// The `-o wide` columns every pod-template workload shows last.
fn with_template_columns(mut cols: Vec<Column>) -> Vec<Column> {
    cols.extend([
        Column::new("Containers", "string", 1),
        Column::new("Images", "string", 1),
        Column::new("Selector", "string", 1),
    ]);
    cols
}

fn with_template_cells(o: &Value, mut cells: Vec<Value>) -> Vec<Value> {
    let (c, i) = images(o, &["spec", "template", "spec"]);
    cells.extend([json!(c), json!(i), json!(selector_string(at(o, &["spec", "selector"])))]);
    cells
}

fn images(o: &Value, template: &[&str]) -> (String, String) {
    let cs = at(o, template).and_then(|t| t.get("containers")).and_then(Value::as_array).cloned().unwrap_or_default();
    let names: Vec<&str> = cs.iter().filter_map(|c| c.get("name").and_then(Value::as_str)).collect();
    let imgs: Vec<&str> = cs.iter().filter_map(|c| c.get("image").and_then(Value::as_str)).collect();
    (names.join(","), imgs.join(","))
}

pub fn deployment_hooks() -> Hooks {
    Hooks {
        generation: true,
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                default_field(spec, "replicas", json!(1));
                default_field(spec, "revisionHistoryLimit", json!(10));
                default_field(spec, "progressDeadlineSeconds", json!(600));
                default_field(spec, "strategy", json!({"type": "RollingUpdate"}));
                if spec["strategy"]["type"] == "RollingUpdate" {
                    let ru = &mut spec["strategy"];
                    default_field(ru, "rollingUpdate", json!({}));
                    default_field(&mut ru["rollingUpdate"], "maxUnavailable", json!("25%"));
                    default_field(&mut ru["rollingUpdate"], "maxSurge", json!("25%"));
                }
                default_template(spec);
            }
        },
        validate: |o| validate_workload(o, true),
        columns: || {
            with_template_columns(vec![
                Column::new("Ready", "string", 0),
                Column::new("Up-to-date", "string", 0),
                Column::new("Available", "string", 0),
                Column::age(),
            ])
        },
        cells: |o| {
            with_template_cells(
                o,
                vec![
                    json!(ready_of(o, &["status", "readyReplicas"])),
                    json!(int(o, &["status", "updatedReplicas"])),
                    json!(int(o, &["status", "availableReplicas"])),
                    json!(age(o)),
                ],
            )
        },
        ..Hooks::default()
    }
}

pub fn replicaset_hooks() -> Hooks {
    Hooks {
        generation: true,
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                default_field(spec, "replicas", json!(1));
                default_template(spec);
            }
        },
        validate: |o| validate_workload(o, true),
        columns: || {
            with_template_columns(vec![
                Column::new("Desired", "integer", 0),
                Column::new("Current", "integer", 0),
                Column::new("Ready", "integer", 0),
                Column::age(),
            ])
        },
        cells: |o| {
            with_template_cells(
                o,
                vec![
                    json!(int(o, &["spec", "replicas"])),
                    json!(int(o, &["status", "replicas"])),
                    json!(int(o, &["status", "readyReplicas"])),
                    json!(age(o)),
                ],
            )
        },
        ..Hooks::default()
    }
}

pub fn statefulset_hooks() -> Hooks {
    Hooks {
        generation: true,
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                default_field(spec, "replicas", json!(1));
                default_field(spec, "podManagementPolicy", json!("OrderedReady"));
                default_field(spec, "revisionHistoryLimit", json!(10));
                default_field(
                    spec,
                    "updateStrategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
                );
                default_field(
                    spec,
                    "persistentVolumeClaimRetentionPolicy",
                    json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
                );
                default_template(spec);
            }
        },
        validate: |o| validate_workload(o, true),
        columns: || {
            vec![
                Column::new("Ready", "string", 0),
                Column::age(),
                Column::new("Containers", "string", 1),
                Column::new("Images", "string", 1),
            ]
        },
        cells: |o| {
            let (c, i) = images(o, &["spec", "template", "spec"]);
            vec![json!(ready_of(o, &["status", "readyReplicas"])), json!(age(o)), json!(c), json!(i)]
        },
        ..Hooks::default()
    }
}

pub fn daemonset_hooks() -> Hooks {
    Hooks {
        generation: true,
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                default_field(spec, "revisionHistoryLimit", json!(10));
                default_field(
                    spec,
                    "updateStrategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
                );
                default_template(spec);
            }
        },
        validate: |o| validate_workload(o, true),
        columns: || {
            with_template_columns(vec![
                Column::new("Desired", "integer", 0),
                Column::new("Current", "integer", 0),
                Column::new("Ready", "integer", 0),
                Column::new("Up-to-date", "integer", 0),
                Column::new("Available", "integer", 0),
                Column::new("Node Selector", "string", 0),
                Column::age(),
            ])
        },
        cells: |o| {
            let ns = at(o, &["spec", "template", "spec", "nodeSelector"])
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
            with_template_cells(
                o,
                vec![
                    json!(int(o, &["status", "desiredNumberScheduled"])),
                    json!(int(o, &["status", "currentNumberScheduled"])),
                    json!(int(o, &["status", "numberReady"])),
                    json!(int(o, &["status", "updatedNumberScheduled"])),
                    json!(int(o, &["status", "numberAvailable"])),
                    json!(ns),
                    json!(age(o)),
                ],
            )
        },
        ..Hooks::default()
    }
}

pub fn job_hooks() -> Hooks {
    Hooks {
        generation: true,
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                default_field(spec, "backoffLimit", json!(6));
                default_field(spec, "completionMode", json!("NonIndexed"));
                default_field(spec, "suspend", json!(false));
                default_field(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
                if spec.get("completions").is_none() && spec.get("parallelism").is_none() {
                    spec["completions"] = json!(1);
                }
                default_field(spec, "parallelism", json!(1));
                if let Some(tspec) = spec.get_mut("template").and_then(|t| t.get_mut("spec")) {
                    default_pod_spec(tspec);
                }
            }
            generate_job_selector(o);
        },
        validate: |o| {
            let mut causes = validate_pod_spec(at(o, &["spec", "template", "spec"]), "spec.template.spec");
            match str_at(o, &["spec", "template", "spec", "restartPolicy"]) {
                Some("OnFailure") | Some("Never") => {}
                other => causes.push(Cause {
                    reason: "FieldValueNotSupported",
                    message: format!(
                        "Unsupported value: {:?}: supported values: \"OnFailure\", \"Never\"",
                        other.unwrap_or("Always")
                    ),
                    field: "spec.template.spec.restartPolicy".into(),
                }),
            }
            causes
        },
        columns: || {
            with_template_columns(vec![
                Column::new("Status", "string", 0),
                Column::new("Completions", "string", 0),
                Column::new("Duration", "string", 0),
                Column::age(),
            ])
        },
        cells: |o| {
            let completions = match at(o, &["spec", "completions"]).and_then(Value::as_i64) {
                Some(n) => format!("{}/{n}", int(o, &["status", "succeeded"])),
                None => format!("{}/1 of {}", int(o, &["status", "succeeded"]), int(o, &["spec", "parallelism"])),
            };
            let conds = at(o, &["status", "conditions"]).and_then(Value::as_array).cloned().unwrap_or_default();
            let has = |t: &str| {
                conds.iter().any(|c| {
                    c.get("type").and_then(Value::as_str) == Some(t)
                        && c.get("status").and_then(Value::as_str) == Some("True")
                })
            };
            let status = if has("Complete") {
                "Complete"
            } else if has("Failed") {
                "Failed"
            } else if at(o, &["metadata", "deletionTimestamp"]).is_some() {
                "Terminating"
            } else if has("Suspended") {
                "Suspended"
            } else {
                "Running"
            };
            let start = str_at(o, &["status", "startTime"]).and_then(crate::apiserver::meta::parse_rfc3339);
            let end = str_at(o, &["status", "completionTime"])
                .and_then(crate::apiserver::meta::parse_rfc3339)
                .unwrap_or_else(crate::apiserver::meta::unix_now);
            let duration = start.map(|s| crate::apiserver::meta::human_duration(end - s)).unwrap_or_default();
            with_template_cells(o, vec![json!(status), json!(completions), json!(duration), json!(age(o))])
        },
        ..Hooks::default()
    }
}

/// As upstream's Job strategy does on create: unless `manualSelector`, the
/// selector is the Job's own uid, and the template carries it and the name.
fn generate_job_selector(o: &mut Value) {
    let uid = str_at(o, &["metadata", "uid"]).unwrap_or_default().to_string();
    let name = str_at(o, &["metadata", "name"]).unwrap_or_default().to_string();
    let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) else { return };
    if uid.is_empty() || spec.get("selector").is_some_and(|s| !s.is_null()) {
        return;
    }
    if spec.get("manualSelector").and_then(Value::as_bool) == Some(true) {
        return;
    }
    spec.insert("selector".into(), json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}));
    let template = spec.entry("template").or_insert_with(|| json!({}));
    if let Some(t) = template.as_object_mut() {
        let meta = t.entry("metadata").or_insert_with(|| json!({}));
        if let Some(m) = meta.as_object_mut() {
            let labels = m.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                for (k, v) in [
                    ("batch.kubernetes.io/controller-uid", &uid),
                    ("batch.kubernetes.io/job-name", &name),
                    ("controller-uid", &uid),
                    ("job-name", &name),
                ] {
                    l.insert(k.into(), json!(v));
                }
            }
        }
    }
}

pub fn cronjob_hooks() -> Hooks {
    Hooks {
        generation: true,
        default: |o| {
            if let Some(spec) = o.get_mut("spec") {
                default_field(spec, "concurrencyPolicy", json!("Allow"));
                default_field(spec, "suspend", json!(false));
                default_field(spec, "successfulJobsHistoryLimit", json!(3));
                default_field(spec, "failedJobsHistoryLimit", json!(1));
            }
        },
        validate: |o| {
            let mut causes = Vec::new();
            if str_at(o, &["spec", "schedule"]).unwrap_or_default().is_empty() {
                causes.push(Cause::required("spec.schedule"));
            }
            causes.extend(validate_pod_spec(
                at(o, &["spec", "jobTemplate", "spec", "template", "spec"]),
                "spec.jobTemplate.spec.template.spec",
            ));
            causes
        },
        columns: || {
            vec![
                Column::new("Schedule", "string", 0),
                Column::new("Timezone", "string", 0),
                Column::new("Suspend", "boolean", 0),
                Column::new("Active", "integer", 0),
                Column::new("Last Schedule", "string", 0),
                Column::age(),
            ]
        },
        cells: |o| {
            let last = str_at(o, &["status", "lastScheduleTime"])
                .and_then(crate::apiserver::meta::parse_rfc3339)
                .map(|t| crate::apiserver::meta::human_duration(crate::apiserver::meta::unix_now() - t))
                .unwrap_or_else(|| "<none>".into());
            vec![
                json!(str_at(o, &["spec", "schedule"]).unwrap_or_default()),
                json!(str_at(o, &["spec", "timeZone"]).unwrap_or("<none>")),
                json!(at(o, &["spec", "suspend"]).and_then(Value::as_bool).unwrap_or(false)),
                json!(at(o, &["status", "active"]).and_then(Value::as_array).map_or(0, Vec::len)),
                json!(last),
                json!(age(o)),
            ]
        },
        ..Hooks::default()
    }
}

/// Upstream's `SetDefaults_ReplicationController`: the template's labels
/// stand in for an empty selector and for the RC's own labels, and an unset
/// replica count is 1.
fn default_replicationcontroller(o: &mut Value) {
    let labels = at(o, &["spec", "template", "metadata", "labels"]).filter(|l| l.is_object()).cloned();
    if let Some(labels) = labels {
        if at(o, &["spec", "selector"]).and_then(Value::as_object).is_none_or(|m| m.is_empty()) {
            o["spec"]["selector"] = labels.clone();
        }
        if at(o, &["metadata", "labels"]).and_then(Value::as_object).is_none_or(|m| m.is_empty()) {
            if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                m.insert("labels".into(), labels);
            }
        }
    }
    if let Some(spec) = o.get_mut("spec") {
        default_field(spec, "replicas", json!(1));
        default_template(spec);
    }
}

/// Upstream's `ValidateReplicationControllerSpec`: a non-empty selector the
/// template's labels satisfy, a template, no negative counts.
fn validate_replicationcontroller(o: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let selector = at(o, &["spec", "selector"]).and_then(Value::as_object).filter(|m| !m.is_empty());
    if selector.is_none() {
        causes.push(Cause::required("spec.selector"));
    }
    for field in ["replicas", "minReadySeconds"] {
        if int(o, &["spec", field]) < 0 {
            causes.push(Cause::invalid(
                format!("spec.{field}"),
                format!("Invalid value: {}: must be greater than or equal to 0", int(o, &["spec", field])),
            ));
        }
    }
    if at(o, &["spec", "template"]).is_none_or(Value::is_null) {
        causes.push(Cause::required("spec.template"));
        return causes;
    }
    let labels = at(o, &["spec", "template", "metadata", "labels"]);
    if let Some(want) = selector {
        if !want.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)) {
            causes.push(Cause::invalid(
                "spec.template.metadata.labels",
                format!(
                    "Invalid value: {}: selector does not match labels in spec.template",
                    labels.map_or_else(|| "null".to_string(), Value::to_string)
                ),
            ));
        }
    }
    causes.extend(validate_pod_spec(at(o, &["spec", "template", "spec"]), "spec.template.spec"));
    causes
}

pub fn replicationcontroller_hooks() -> Hooks {
    Hooks {
        default: default_replicationcontroller,
        validate: validate_replicationcontroller,
        // `replicas` has no omitempty: a new RC reads `status: {replicas: 0}`.
        initial_status: |_| Some(json!({"replicas": 0})),
        columns: || {
            with_template_columns(vec![
                Column::new("Desired", "integer", 0),
                Column::new("Current", "integer", 0),
                Column::new("Ready", "integer", 0),
                Column::age(),
            ])
        },
        cells: |o| {
            let (c, i) = images(o, &["spec", "template", "spec"]);
            vec![
                // Upstream defaults an unset replica count to 1.
                json!(at(o, &["spec", "replicas"]).and_then(Value::as_i64).unwrap_or(1)),
                json!(int(o, &["status", "replicas"])),
                json!(int(o, &["status", "readyReplicas"])),
                json!(age(o)),
                json!(c),
                json!(i),
                json!(map_selector_string(at(o, &["spec", "selector"]))),
            ]
        },
        ..Hooks::default()
    }
}

/// Upstream shows no age for pod templates.
pub fn podtemplate_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![
                Column::new("Containers", "string", 0),
                Column::new("Images", "string", 0),
                Column::new("Pod Labels", "string", 0),
            ]
        },
        cells: |o| {
            let (c, i) = images(o, &["template", "spec"]);
            vec![json!(c), json!(i), json!(map_selector_string(at(o, &["template", "metadata", "labels"])))]
        },
        ..Hooks::default()
    }
}

pub fn controllerrevision_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Controller", "string", 0), Column::new("Revision", "string", 0), Column::age()],
        cells: |o| vec![json!(controller_of(o)), json!(int(o, &["revision"])), json!(age(o))],
        ..Hooks::default()
    }
}

/// The controlling owner as `kind.group/name` (lowercase kind and group).
fn controller_of(o: &Value) -> String {
    let owner = at(o, &["metadata", "ownerReferences"])
        .and_then(Value::as_array)
        .and_then(|refs| refs.iter().find(|r| r.get("controller").and_then(Value::as_bool) == Some(true)));
    let Some(owner) = owner else { return "<none>".into() };
    let name = str_at(owner, &["name"]).unwrap_or_default();
    let kind = str_at(owner, &["kind"]).unwrap_or_default();
    let group = str_at(owner, &["apiVersion"]).and_then(|v| v.split_once('/')).map_or("", |(g, _)| g);
    match (kind, group) {
        ("", "") => name.to_string(),
        (kind, "") => format!("{}/{name}", kind.to_lowercase()),
        (kind, group) => format!("{}.{}/{name}", kind.to_lowercase(), group.to_lowercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_revision_and_pod_template_cells() {
        let cr = json!({"revision": 3, "metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "x"},
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "controller": true}
        ]}});
        assert_eq!((controllerrevision_hooks().cells)(&cr)[..2], [json!("statefulset.apps/web"), json!(3)]);
        assert_eq!(controller_of(&json!({})), "<none>");

        let pt = json!({"template": {"metadata": {"labels": {"tier": "web", "app": "a"}},
                                     "spec": {"containers": [{"name": "c1", "image": "nginx"}, {"name": "c2", "image": "busybox"}]}}});
        assert_eq!(
            (podtemplate_hooks().cells)(&pt),
            vec![json!("c1,c2"), json!("nginx,busybox"), json!("app=a,tier=web")]
        );
    }

    #[test]
    fn replication_controller_cells() {
        let rc = json!({"spec": {"selector": {"app": "web"}, "template": {"spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
                        "status": {"replicas": 1}});
        let cells = (replicationcontroller_hooks().cells)(&rc);
        assert_eq!(cells.len(), (replicationcontroller_hooks().columns)().len());
        assert_eq!(
            (&cells[..3], &cells[4..]),
            (&[json!(1), json!(1), json!(0)][..], &[json!("c"), json!("nginx"), json!("app=web")][..])
        );
    }
}
