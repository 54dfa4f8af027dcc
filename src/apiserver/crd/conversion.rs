//! How a served version of a custom resource reads and writes the objects
//! its CRD stores (upstream's CRD storage codec): objects are stored in
//! the CRD's storage version and keep the version they were stored in when
//! the storage version changes. A read applies the defaults of the version
//! an object was stored in, then converts it to the served version by the
//! CRD's `spec.conversion.strategy` (`None`: only apiVersion changes;
//! `Webhook`: the CRD's conversion webhook converts), then prunes what the
//! served version's schema does not know. A write through a version other
//! than the storage version is converted to the storage version first.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};

use super::schema;
use crate::apiserver::meta;
use crate::apiserver::status::{summary, ApiError, ApiResult, Cause};
use crate::apiserver::storage::Storage;
use crate::apiserver::strategy::Converter;
use crate::apiserver::webhook_client;

/// How long a conversion webhook may take (upstream's webhook clients'
/// 30 s).
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(30);

/// The ConversionReview versions ferrok speaks, in the order it prefers.
const REVIEW_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// What a CRD's versions share: its group, every version's schema, the
/// storage version, and the conversion strategy.
pub struct Versions {
    group: String,
    /// Every version's structural schema, by version name, and whether it
    /// has defaults.
    schemas: HashMap<String, (Value, bool)>,
    storage_version: String,
    strategy: Strategy,
}

/// `spec.conversion.strategy`.
enum Strategy {
    None,
    Webhook { client_config: Value, review_versions: Vec<String>, storage: Storage },
}

impl Versions {
    /// The versions of `crd`; `storage` is where a webhook's Service is
    /// looked up.
    pub fn of(crd: &Value, storage: Storage) -> Versions {
        let spec = &crd["spec"];
        let mut schemas = HashMap::new();
        let mut storage_version = String::new();
        for v in spec["versions"].as_array().into_iter().flatten() {
            let name = v["name"].as_str().unwrap_or_default().to_string();
            if v["storage"] == true {
                storage_version = name.clone();
            }
            let schema = version_schema(v);
            let defaults = schema::has_defaults(&schema);
            schemas.insert(name, (schema, defaults));
        }
        let conversion = &spec["conversion"];
        let strategy = match conversion["strategy"].as_str() {
            Some("Webhook") => Strategy::Webhook {
                client_config: conversion.pointer("/webhook/clientConfig").cloned().unwrap_or(Value::Null),
                review_versions: conversion
                    .pointer("/webhook/conversionReviewVersions")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                    .unwrap_or_default(),
                storage,
            },
            _ => Strategy::None,
        };
        Versions { group: spec["group"].as_str().unwrap_or_default().to_string(), schemas, storage_version, strategy }
    }

    /// Whether the objects of `version` are served otherwise than stored:
    /// the CRD has other versions to convert from, or defaults to apply.
    pub fn converts(&self, version: &str) -> bool {
        self.schemas.len() > 1 || self.schemas.get(version).is_some_and(|(_, defaults)| *defaults)
    }

    fn api_version(&self, version: &str) -> String {
        format!("{}/{version}", self.group)
    }

    /// The version of an object of this CRD stored in `api_version`;
    /// upstream's error for one that is not a version of the CRD.
    fn version_of<'a>(&self, api_version: &'a str) -> ApiResult<&'a str> {
        match api_version.split_once('/') {
            Some((group, version)) if group == self.group && self.schemas.contains_key(version) => Ok(version),
            _ => Err(ApiError::internal(format!("request to convert CR from an invalid group/version: {api_version}"))),
        }
    }

    /// `objects` (each of this CRD, in a version of it) converted to
    /// `to`; the objects already in `to` are left as they are.
    async fn convert(&self, mut objects: Vec<Value>, to: &str) -> ApiResult<Vec<Value>> {
        let pending: Vec<usize> = (0..objects.len()).filter(|i| objects[*i]["apiVersion"] != to).collect();
        if pending.is_empty() {
            return Ok(objects);
        }
        match &self.strategy {
            Strategy::None => {
                for i in pending {
                    objects[i]["apiVersion"] = json!(to);
                }
            }
            Strategy::Webhook { client_config, review_versions, storage } => {
                let sent: Vec<Value> = pending.iter().map(|i| objects[*i].clone()).collect();
                let gvk = gvk_of(&sent[0]);
                let hook = Webhook { client_config, review_versions, storage };
                let converted = hook.convert(&sent, to).await.map_err(|e| match e {
                    Refusal::Failed(why) => ApiError::internal(format!("conversion webhook for {gvk} failed: {why}")),
                    Refusal::Returned(why) => ApiError::internal(format!("conversion webhook for {gvk} {why}")),
                })?;
                for (i, obj) in pending.into_iter().zip(converted) {
                    objects[i] = obj;
                }
            }
        }
        Ok(objects)
    }
}

/// A version's schema, or one that keeps everything when it has none.
pub(super) fn version_schema(version: &Value) -> Value {
    version
        .pointer("/schema/openAPIV3Schema")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}))
}

/// Go's GroupVersionKind as `%v` prints it: `group/version, Kind=kind`.
fn gvk_string(api_version: &str, kind: &str) -> String {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    format!("{group}/{version}, Kind={kind}")
}

fn gvk_of(obj: &Value) -> String {
    gvk_string(obj["apiVersion"].as_str().unwrap_or_default(), obj["kind"].as_str().unwrap_or_default())
}

/// One served version's conversion: the Converter of its resource.
pub struct CrdConversion {
    versions: Arc<Versions>,
    /// The served version's name and apiVersion.
    served: String,
    served_api_version: String,
    storage_api_version: String,
}

impl CrdConversion {
    pub fn new(versions: Arc<Versions>, served: &str) -> CrdConversion {
        CrdConversion {
            served_api_version: versions.api_version(served),
            storage_api_version: versions.api_version(&versions.storage_version),
            served: served.to_string(),
            versions,
        }
    }

    /// What the served version's schema does not know, dropped (upstream
    /// coerces every converted object to its new version's schema).
    fn prune_served(&self, obj: &mut Value, version: &str) {
        if let Some((s, _)) = self.versions.schemas.get(version) {
            schema::prune(obj, s, "", true, &mut Vec::new());
        }
    }
}

impl Converter for CrdConversion {
    fn storage_api_version(&self) -> &str {
        &self.storage_api_version
    }

    fn serves_as_stored(&self, api_version: &str) -> bool {
        api_version == self.served_api_version && !self.versions.schemas.get(&self.served).is_some_and(|(_, d)| *d)
    }

    fn served(&self, mut stored: Vec<Value>) -> BoxFuture<'_, ApiResult<Vec<Value>>> {
        Box::pin(async move {
            let v = &self.versions;
            for obj in stored.iter_mut() {
                let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
                let version = v.version_of(&api_version)?;
                if let Some((s, true)) = v.schemas.get(version) {
                    schema::apply_defaults(obj, s);
                }
            }
            let converted: Vec<bool> =
                stored.iter().map(|o| o["apiVersion"] != self.served_api_version.as_str()).collect();
            let mut served = v.convert(stored, &self.served_api_version).await?;
            for (obj, _) in served.iter_mut().zip(converted).filter(|(_, c)| *c) {
                self.prune_served(obj, &self.served);
            }
            Ok(served)
        })
    }

    fn stored(&self, served: Value) -> BoxFuture<'_, ApiResult<Value>> {
        Box::pin(async move {
            if self.served_api_version == self.storage_api_version {
                return Ok(served);
            }
            let mut out = self.versions.convert(vec![served], &self.storage_api_version).await?;
            let mut stored = out.pop().ok_or_else(|| ApiError::internal("a conversion returned no object"))?;
            self.prune_served(&mut stored, &self.versions.storage_version);
            Ok(stored)
        })
    }
}

/// Why a webhook's conversion is refused: the call or its answer failed
/// (`conversion webhook for <gvk> failed: <why>`), or it returned objects
/// that do not fit (`conversion webhook for <gvk> <why>`).
enum Refusal {
    Failed(String),
    Returned(String),
}

/// A CRD's conversion webhook.
struct Webhook<'a> {
    client_config: &'a Value,
    review_versions: &'a [String],
    storage: &'a Storage,
}

impl Webhook<'_> {
    /// `objects` converted to `to` by one ConversionReview, checked as
    /// upstream checks them (count, apiVersion, kind, name, namespace and
    /// uid), with their metadata restored but for labels and annotations.
    async fn convert(&self, objects: &[Value], to: &str) -> Result<Vec<Value>, Refusal> {
        let review_version = self
            .review_versions
            .iter()
            .find(|v| REVIEW_VERSIONS.contains(&v.as_str()))
            .ok_or_else(|| Refusal::Failed("no supported conversion review versions".into()))?;
        let review_api_version = format!("apiextensions.k8s.io/{review_version}");
        let uid = meta::new_uid();
        let review = json!({
            "kind": "ConversionReview",
            "apiVersion": review_api_version,
            "request": {"uid": uid, "desiredAPIVersion": to, "objects": objects},
            "response": {"uid": "", "convertedObjects": null, "result": {"metadata": {}}},
        });
        let failed = |e: webhook_client::CallError| Refusal::Failed(e.to_string());
        let target = webhook_client::target(self.storage, self.client_config).await.map_err(failed)?;
        let ca = self.client_config.get("caBundle").and_then(Value::as_str);
        let body = webhook_client::post(&target, ca, &review, WEBHOOK_TIMEOUT).await.map_err(failed)?;
        let answer: Value = serde_json::from_slice(&body).map_err(|e| Refusal::Failed(e.to_string()))?;
        let converted = converted_objects(&answer, review_version == "v1", &review_api_version, &uid)?;
        if converted.len() != objects.len() {
            return Err(Refusal::Returned(format!("returned {} objects, expected {}", converted.len(), objects.len())));
        }
        let single = objects.len() == 1;
        let mut out = Vec::with_capacity(objects.len());
        for (i, (original, mut obj)) in objects.iter().zip(converted).enumerate() {
            // Upstream names a list's objects by their index counted from 1.
            let (what, at) = if single { ("invalid object", 0) } else { ("invalid converted object", i + 1) };
            let invalid = |why: String| Refusal::Returned(format!("returned {what} at index {at}: {why}"));
            let got = obj["apiVersion"].as_str().unwrap_or_default();
            if got != to {
                return Err(invalid(format!("invalid groupVersion (expected {to}, received {got})")));
            }
            let (want_kind, got_kind) =
                (original["kind"].as_str().unwrap_or_default(), obj["kind"].as_str().unwrap_or_default());
            if want_kind != got_kind {
                return Err(invalid(format!("invalid kind (expected {want_kind}, received {got_kind})")));
            }
            same_identity(original, &obj).map_err(|e| invalid(e.to_string()))?;
            restore_metadata(original, &mut obj).map_err(|why| {
                let what = if single {
                    "invalid metadata".to_string()
                } else {
                    format!("invalid metadata in object at index {at}")
                };
                Refusal::Returned(format!("returned {what}: {why}"))
            })?;
            out.push(obj);
        }
        Ok(out)
    }
}

/// The converted objects of a ConversionReview answer, after upstream's
/// checks of its type (v1 only), uid (v1 only) and result.
fn converted_objects(answer: &Value, v1: bool, api_version: &str, uid: &str) -> Result<Vec<Value>, Refusal> {
    let failed = |why: String| Refusal::Failed(why);
    if v1 {
        let (got_av, got_kind) =
            (answer["apiVersion"].as_str().unwrap_or_default(), answer["kind"].as_str().unwrap_or_default());
        if got_av != api_version || got_kind != "ConversionReview" {
            return Err(failed(format!(
                "expected webhook response of {}, got {}",
                gvk_string(api_version, "ConversionReview"),
                gvk_string(got_av, got_kind)
            )));
        }
    }
    let response =
        answer.get("response").filter(|r| r.is_object()).ok_or_else(|| failed("no response provided".into()))?;
    if v1 {
        let got = response["uid"].as_str().unwrap_or_default();
        if got != uid {
            return Err(failed(format!("expected response.uid={uid:?}, got {got:?}")));
        }
    }
    let status = response.pointer("/result/status").and_then(Value::as_str).unwrap_or_default();
    if status != "Success" {
        let message = response.pointer("/result/message").and_then(Value::as_str).unwrap_or_default();
        return Err(failed(match message {
            "" => format!("response.result.status was '{status}', not 'Success'"),
            m => m.to_string(),
        }));
    }
    Ok(response["convertedObjects"].as_array().cloned().unwrap_or_default())
}

/// Why an object a webhook converted cannot stand for the original, in
/// upstream's words.
#[derive(Debug, Clone, thiserror::Error)]
enum ConvertedObjectError {
    #[error("must have the same {what}: {original} != {converted}")]
    OtherIdentity { what: &'static str, original: String, converted: String },
    #[error("missing metadata in converted object")]
    NoMetadata,
    #[error("invalid metadata of type {0} in converted object")]
    MetadataType(&'static str),
    #[error("invalid metadata.{field} of type {go_type} in converted object")]
    MapType { field: &'static str, go_type: &'static str },
    #[error("metadata.{field}[{key}] must be a string, but is {go_type} in converted object")]
    NotAString { field: &'static str, key: String, go_type: &'static str },
    /// Labels or annotations that an object may not have.
    #[error("{}", summary(.0))]
    Invalid(Vec<Cause>),
}

/// A converted object must be the same object: kind, name, namespace, uid.
fn same_identity(original: &Value, converted: &Value) -> Result<(), ConvertedObjectError> {
    for (what, at) in
        [("kind", "/kind"), ("name", "/metadata/name"), ("namespace", "/metadata/namespace"), ("UID", "/metadata/uid")]
    {
        let text = |o: &Value| o.pointer(at).and_then(Value::as_str).unwrap_or_default().to_string();
        let (a, b) = (text(original), text(converted));
        if a != b {
            return Err(ConvertedObjectError::OtherIdentity { what, original: a, converted: b });
        }
    }
    Ok(())
}

/// Go's `%T` of a JSON value, as upstream's messages name types.
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int64",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// The original object's metadata put back on the converted one, but for
/// the labels and annotations the webhook answered with (checked as an
/// object's are when they changed).
fn restore_metadata(original: &Value, converted: &mut Value) -> Result<(), ConvertedObjectError> {
    let answered = match converted.get("metadata") {
        None => return Err(ConvertedObjectError::NoMetadata),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => return Err(ConvertedObjectError::MetadataType(go_type(other))),
    };
    let mut metadata = original.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    for field in ["labels", "annotations"] {
        let Some(Value::Object(given)) = answered.get(field).filter(|v| !v.is_null()) else {
            if let Some(v) = answered.get(field).filter(|v| !v.is_null()) {
                return Err(ConvertedObjectError::MapType { field, go_type: go_type(v) });
            }
            metadata.remove(field);
            continue;
        };
        if let Some((k, v)) = given.iter().find(|(_, v)| !v.is_string()) {
            return Err(ConvertedObjectError::NotAString { field, key: k.clone(), go_type: go_type(v) });
        }
        if metadata.get(field) != Some(&Value::Object(given.clone())) {
            let probe = json!({"metadata": {field: given}});
            let errors: Vec<Cause> = crate::apiserver::validation::object_meta_maps(&probe)
                .into_iter()
                .map(|c| Cause { field: c.field.replace("metadata.annotations", "metadata.annotation"), ..c })
                .collect();
            if !errors.is_empty() {
                return Err(ConvertedObjectError::Invalid(errors));
            }
        }
        metadata.insert(field.to_string(), Value::Object(given.clone()));
    }
    converted["metadata"] = Value::Object(metadata);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_as_upstream_checks_them() {
        let ok = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u", "result": {"status": "Success"}, "convertedObjects": [{"a": 1}]}});
        let objects = |r: Result<Vec<Value>, Refusal>| match r {
            Ok(v) => Ok(v),
            Err(Refusal::Failed(m) | Refusal::Returned(m)) => Err(m),
        };
        assert_eq!(objects(converted_objects(&ok, true, "apiextensions.k8s.io/v1", "u")).unwrap().len(), 1);
        assert_eq!(
            objects(converted_objects(&ok, true, "apiextensions.k8s.io/v1", "other")).unwrap_err(),
            r#"expected response.uid="other", got "u""#
        );
        let beta = json!({"apiVersion": "apiextensions.k8s.io/v1beta1", "kind": "ConversionReview", "response": {"uid": "x", "result": {"status": "Success"}}});
        assert_eq!(
            objects(converted_objects(&beta, true, "apiextensions.k8s.io/v1", "u")).unwrap_err(),
            "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got apiextensions.k8s.io/v1beta1, Kind=ConversionReview"
        );
        assert!(objects(converted_objects(&beta, false, "apiextensions.k8s.io/v1beta1", "u")).unwrap().is_empty());
        let refused = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u", "result": {"status": "Failure", "message": "no way"}}});
        assert_eq!(objects(converted_objects(&refused, true, "apiextensions.k8s.io/v1", "u")).unwrap_err(), "no way");
        let silent = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u", "result": {"status": "Failure"}}});
        assert_eq!(
            objects(converted_objects(&silent, true, "apiextensions.k8s.io/v1", "u")).unwrap_err(),
            "response.result.status was 'Failure', not 'Success'"
        );
    }

    #[test]
    fn only_labels_and_annotations_of_the_answer_are_kept() {
        let original = json!({"metadata": {"name": "a", "uid": "1", "resourceVersion": "5", "labels": {"x": "y"}, "annotations": {"k": "v"}}});
        let mut converted = json!({"metadata": {"name": "a", "uid": "1", "resourceVersion": "9", "generation": 7, "labels": {"x": "z"}}});
        restore_metadata(&original, &mut converted).unwrap();
        assert_eq!(
            converted["metadata"],
            json!({"name": "a", "uid": "1", "resourceVersion": "5", "labels": {"x": "z"}})
        );
        let mut bad = json!({"metadata": {"labels": {"x": 1}}});
        assert_eq!(
            restore_metadata(&original, &mut bad).unwrap_err().to_string(),
            "metadata.labels[x] must be a string, but is int64 in converted object"
        );
        let mut invalid = json!({"metadata": {"labels": {"a b": "c"}}});
        assert!(restore_metadata(&original, &mut invalid)
            .unwrap_err()
            .to_string()
            .starts_with("metadata.labels: Invalid value: \"a b\""));
        assert_eq!(
            restore_metadata(&original, &mut json!({})).unwrap_err().to_string(),
            "missing metadata in converted object"
        );
        assert_eq!(
            same_identity(
                &json!({"kind": "K", "metadata": {"name": "a"}}),
                &json!({"kind": "K", "metadata": {"name": "b"}})
            )
            .unwrap_err()
            .to_string(),
            "must have the same name: a != b"
        );
        assert_eq!(gvk_string("stable.example.com/v1", "Foo"), "stable.example.com/v1, Kind=Foo");
    }
}
