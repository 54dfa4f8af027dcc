//! apiextensions.k8s.io: the CustomResourceDefinition kind's own rules
//! (the resources a CRD defines are served by `crate::apiserver::crd`).

use serde_json::{json, Value};

use crate::apiserver::meta;
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;
use crate::apiserver::validation::quote;

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
            if let Some(spec) = o.get_mut("spec").and_then(Value::as_object_mut) {
                let conversion = spec.entry("conversion").or_insert_with(|| json!({"strategy": "None"}));
                if let Some(service) =
                    conversion.pointer_mut("/webhook/clientConfig/service").and_then(Value::as_object_mut)
                {
                    service.entry("port").or_insert(json!(443));
                }
            }
            for v in o.pointer_mut("/spec/versions").and_then(Value::as_array_mut).into_iter().flatten() {
                if let Some(schema) = v.pointer_mut("/schema/openAPIV3Schema") {
                    whole_bounds_as_integers(schema);
                }
            }
            let stored = stored_versions(o);
            if let Some(status) = o.get_mut("status").and_then(Value::as_object_mut) {
                if !stored.is_empty() {
                    status.insert("storedVersions".into(), json!(stored));
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
            causes.extend(validate_conversion(o));
            causes
        },
        validate_change: |subresource, new, _| match subresource {
            None => validate_stored_versions(new),
            Some(_) => Vec::new(),
        },
        columns: || vec![Column { name: "Created At", kind: "date", format: "", description: "", priority: 0 }],
        cells: |o| vec![json!(meta::str_at(o, &["metadata", "creationTimestamp"]).unwrap_or_default())],
        ..Hooks::default()
    }
}

/// The keywords of a JSONSchemaProps that hold a float64.
const FLOAT_KEYWORDS: &[&str] = &["maximum", "minimum", "multipleOf"];

/// Writes the float keywords of a schema that hold whole numbers as
/// integers (`minimum: 1`, not `1.0`), as Go encodes a float64, through
/// every sub-schema. `default`, `enum` and `example` are left as written:
/// upstream keeps their JSON as it came.
fn whole_bounds_as_integers(schema: &mut Value) {
    let Some(m) = schema.as_object_mut() else { return };
    for key in FLOAT_KEYWORDS {
        if let Some(n) = m.get_mut(*key) {
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15) {
                *n = json!(f as i64);
            }
        }
    }
    for (key, sub) in m.iter_mut() {
        match (key.as_str(), sub) {
            ("properties" | "patternProperties" | "definitions" | "dependencies", Value::Object(named)) => {
                named.values_mut().for_each(whole_bounds_as_integers)
            }
            ("allOf" | "anyOf" | "oneOf" | "items", Value::Array(list)) => {
                list.iter_mut().for_each(whole_bounds_as_integers)
            }
            ("items" | "additionalProperties" | "additionalItems" | "not", s @ Value::Object(_)) => {
                whole_bounds_as_integers(s)
            }
            _ => {}
        }
    }
}

/// `status.storedVersions` as a write leaves it (upstream's
/// PrepareForCreate and PrepareForUpdate): the versions objects have been
/// stored in, the current storage version added when it is new.
pub fn stored_versions(crd: &Value) -> Vec<Value> {
    let mut stored: Vec<Value> =
        crd.pointer("/status/storedVersions").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut versions = crd.pointer("/spec/versions").and_then(Value::as_array).into_iter().flatten();
    if let Some(storage) = versions.find(|v| v["storage"] == true).map(|v| v["name"].clone()) {
        if !stored.contains(&storage) {
            stored.push(storage);
        }
    }
    stored
}

/// Every stored version must still be a version of the CRD, and the
/// storage version must be a stored one (upstream's
/// ValidateCustomResourceDefinitionStoredVersions).
fn validate_stored_versions(crd: &Value) -> Vec<Cause> {
    const FIELD: &str = "status.storedVersions";
    let stored: Vec<&str> = crd
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if stored.is_empty() {
        return vec![Cause::invalid(FIELD, "Invalid value: []string{}: must have at least one stored version")];
    }
    let versions: Vec<&Value> = crd.pointer("/spec/versions").and_then(Value::as_array).into_iter().flatten().collect();
    let mut causes = Vec::new();
    for v in &versions {
        let name = v["name"].as_str().unwrap_or_default();
        if v["storage"] == true && !stored.contains(&name) {
            causes.push(Cause::invalid(
                FIELD,
                format!("Invalid value: {}: must have the storage version {name}", quote(name)),
            ));
        }
    }
    for (i, name) in stored.iter().enumerate() {
        if !versions.iter().any(|v| v["name"].as_str() == Some(name)) {
            causes.push(Cause::invalid(
                format!("{FIELD}[{i}]"),
                format!("Invalid value: {}: must appear in spec.versions", quote(name)),
            ));
        }
    }
    causes
}

/// `spec.conversion` as upstream's validateCustomResourceConversion
/// checks it (its field paths are those of the internal type).
fn validate_conversion(crd: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(conversion) = crd.pointer("/spec/conversion").filter(|c| c.is_object()) else { return causes };
    let strategy = conversion["strategy"].as_str().unwrap_or_default();
    match strategy {
        "" => causes.push(Cause::required("spec.conversion.strategy")),
        "None" | "Webhook" => {}
        other => causes.push(Cause {
            reason: "FieldValueNotSupported",
            message: format!("Unsupported value: {}: supported values: \"None\", \"Webhook\"", quote(other)),
            field: "spec.conversion.strategy".into(),
        }),
    }
    if strategy != "None" && crd.pointer("/spec/preserveUnknownFields") == Some(&json!(true)) {
        causes.push(Cause::invalid(
            "spec.conversion.strategy",
            format!("Invalid value: {}: must be None if spec.preserveUnknownFields is true", quote(strategy)),
        ));
    }
    let webhook = conversion.get("webhook").filter(|w| !w.is_null());
    let client_config = webhook.and_then(|w| w.get("clientConfig")).filter(|c| !c.is_null());
    let review_versions: Vec<&str> = webhook
        .and_then(|w| w["conversionReviewVersions"].as_array())
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    const CLIENT_CONFIG: &str = "spec.conversion.webhookClientConfig";
    const REVIEW_VERSIONS: &str = "spec.conversion.conversionReviewVersions";
    if strategy != "Webhook" {
        if client_config.is_some() {
            causes.push(Cause::forbidden(
                CLIENT_CONFIG,
                "Forbidden: should not be set when strategy is not set to Webhook",
            ));
        }
        if !review_versions.is_empty() {
            causes.push(Cause::forbidden(
                REVIEW_VERSIONS,
                "Forbidden: should not be set when strategy is not set to Webhook",
            ));
        }
        return causes;
    }
    let required = |field: &str, why: &str| Cause {
        reason: "FieldValueRequired",
        message: format!("Required value: {why}"),
        field: field.into(),
    };
    match client_config {
        None => causes.push(required(CLIENT_CONFIG, "required when strategy is set to Webhook")),
        Some(cc) => match (cc.get("url").and_then(Value::as_str), cc.get("service").filter(|s| s.is_object())) {
            (Some(_), Some(_)) | (None, None) => {
                causes.push(required(CLIENT_CONFIG, "exactly one of url or service is required"))
            }
            (Some(url), None) => causes.extend(validate_webhook_url(&format!("{CLIENT_CONFIG}.url"), url)),
            (None, Some(service)) => {
                let at = format!("{CLIENT_CONFIG}.service");
                for key in ["name", "namespace"] {
                    if service[key].as_str().unwrap_or_default().is_empty() {
                        causes.push(required(&format!("{at}.{key}"), &format!("service {key} is required")));
                    }
                }
            }
        },
    }
    if review_versions.is_empty() {
        causes.push(Cause::required(REVIEW_VERSIONS));
    } else if !review_versions.iter().any(|v| *v == "v1" || *v == "v1beta1") {
        let list: Vec<String> = review_versions.iter().map(|v| quote(v)).collect();
        causes.push(Cause::invalid(
            REVIEW_VERSIONS,
            format!("Invalid value: []string{{{}}}: must include at least one of v1, v1beta1", list.join(", ")),
        ));
    }
    causes
}

/// A webhook's `url` as upstream's ValidateWebhookURL checks it (https only).
fn validate_webhook_url(field: &str, url: &str) -> Vec<Cause> {
    const FORM: &str = "; desired format: https://host[/path]";
    let mut causes = Vec::new();
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    if scheme != "https" {
        causes.push(Cause::invalid(
            field,
            format!("Invalid value: {}: 'https' is the only allowed URL scheme{FORM}", quote(scheme)),
        ));
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if scheme.is_empty() || host.is_empty() {
        causes.push(Cause::invalid(field, format!("Invalid value: \"\": host must be provided{FORM}")));
    }
    if let Some((_, fragment)) = rest.split_once('#') {
        causes.push(Cause::invalid(
            field,
            format!("Invalid value: {}: fragments are not permitted in the URL", quote(fragment)),
        ));
    }
    if let Some((_, query)) = rest.split('#').next().unwrap_or_default().split_once('?') {
        causes.push(Cause::invalid(
            field,
            format!("Invalid value: {}: query parameters are not permitted in the URL", quote(query)),
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_float_bounds_are_written_as_go_writes_them() {
        let mut schema = json!({"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 1.0, "maximum": 10.5, "default": 2.0},
            "l": {"type": "array", "items": {"type": "number", "multipleOf": 3.0, "enum": [1.0]}},
            "x": {"anyOf": [{"minimum": 0.0}], "additionalProperties": {"maximum": 4.0}},
        }});
        whole_bounds_as_integers(&mut schema);
        assert_eq!(schema["properties"]["a"]["minimum"].to_string(), "1");
        assert_eq!(schema["properties"]["a"]["maximum"].to_string(), "10.5");
        assert_eq!(schema["properties"]["a"]["default"].to_string(), "2.0", "defaults stay as written");
        assert_eq!(schema["properties"]["l"]["items"]["multipleOf"].to_string(), "3");
        assert_eq!(schema["properties"]["l"]["items"]["enum"].to_string(), "[1.0]");
        assert_eq!(schema["properties"]["x"]["anyOf"][0]["minimum"].to_string(), "0");
        assert_eq!(schema["properties"]["x"]["additionalProperties"]["maximum"].to_string(), "4");
    }
}
