//! apiextensions.k8s.io: the CustomResourceDefinition kind's own rules
//! (the resources a CRD defines are served by `crate::apiserver::crd`).

use serde_json::{json, Value};

use crate::apiserver::meta;
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

/// Defaulting and validation of CustomResourceDefinition objects.
pub fn crd_hooks() -> Hooks {
    Hooks {
        generation: true,
        default: |o| {
            let fins = meta::metadata_mut(o).entry("finalizers").or_insert_with(|| json!([]));
            if let Some(list) = fins.as_array_mut() {
                if !list.iter().any(|f| f == "customresourcecleanup.apiextensions.k8s.io") {
                    list.push(json!("customresourcecleanup.apiextensions.k8s.io"));
                }
            }
            if let Some(names) = o.pointer_mut("/spec/names") {
                if names.get("singular").is_none() {
                    let kind = names["kind"].as_str().unwrap_or_default().to_ascii_lowercase();
                    names["singular"] = json!(kind);
                }
                if names.get("listKind").is_none() {
                    let kind = names["kind"].as_str().unwrap_or_default();
                    names["listKind"] = json!(format!("{kind}List"));
                }
            }
        },
        validate: |o| {
            let mut causes = Vec::new();
            let group = o.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
            let plural = o.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default();
            if group.is_empty() {
                causes.push(Cause::required("spec.group"));
            }
            if plural.is_empty() {
                causes.push(Cause::required("spec.names.plural"));
            }
            if o.pointer("/spec/names/kind").and_then(Value::as_str).unwrap_or_default().is_empty() {
                causes.push(Cause::required("spec.names.kind"));
            }
            let want = format!("{plural}.{group}");
            if meta::name_of(o) != want {
                causes.push(Cause::invalid(
                    "metadata.name",
                    format!("Invalid value: {:?}: must be spec.names.plural+\".\"+spec.group", meta::name_of(o)),
                ));
            }
            let versions = o.pointer("/spec/versions").and_then(Value::as_array).cloned().unwrap_or_default();
            if versions.is_empty() {
                causes.push(Cause::required("spec.versions"));
            }
            if versions.iter().filter(|v| v["storage"] == true).count() != 1 && !versions.is_empty() {
                causes.push(Cause::invalid(
                    "spec.versions",
                    "Invalid value: must have exactly one version marked as storage version",
                ));
            }
            match o.pointer("/spec/scope").and_then(Value::as_str) {
                Some("Namespaced") | Some("Cluster") => {}
                other => causes.push(Cause {
                    reason: "FieldValueNotSupported",
                    message: format!(
                        "Unsupported value: {:?}: supported values: \"Cluster\", \"Namespaced\"",
                        other.unwrap_or("")
                    ),
                    field: "spec.scope".into(),
                }),
            }
            causes
        },
        columns: || vec![Column { name: "Created At", kind: "date", format: "", description: "", priority: 0 }],
        cells: |o| vec![json!(meta::str_at(o, &["metadata", "creationTimestamp"]).unwrap_or_default())],
        ..Hooks::default()
    }
}
