//! CustomResourceDefinitions: each served version of an established CRD
//! becomes a resource in the registry, with a strategy built from its
//! structural schema, printer columns and subresources, and the conversion
//! of its objects from and to the other versions (`conversion`). A task
//! follows the CRDs in the store, registers and unregisters their
//! resources, and sets their `NamesAccepted` and `Established` conditions.

pub mod conversion;
pub mod openapi_v2;
pub mod schema;

use std::sync::Arc;

use serde_json::{json, Value};

use super::meta;
use super::resource::{Resource, ScalePaths, CRUD_VERBS};
use super::status::Cause;
use super::storage::Storage;
use super::storage::{Followed, Follower, ReadAt};
use super::strategy::{Converter, DecodeError, Strategy};
use super::table::Column;
use super::Api;

const PREFIX: &str = "/registry/apiextensions.k8s.io/customresourcedefinitions/";

/// One printer column of a CRD version.
struct PrinterColumn {
    name: &'static str,
    kind: &'static str,
    priority: i32,
    json_path: String,
}

/// The strategy of one version of a custom resource.
pub struct CustomStrategy {
    schema: Value,
    /// Component name in OpenAPI documents (`com.example.v1.Widget`).
    schema_name: String,
    columns: Vec<PrinterColumn>,
    has_status: bool,
    /// The schema as patches and managed fields walk it, built at the first write.
    patch: std::sync::OnceLock<crate::apiserver::patch::patch_meta::SharedSchema>,
    /// How stored objects are served, when not as they are stored (other
    /// versions, defaults applied on read).
    conversion: Option<conversion::CrdConversion>,
}

/// Strings in columns are leaked once per CRD version, which is bounded by
/// the number of CRDs ever served by this process.
fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

impl CustomStrategy {
    /// The version's schema as the only component of its set, and its name.
    fn schemas(&self) -> (String, serde_json::Map<String, Value>) {
        let mut schemas = serde_json::Map::new();
        schemas.insert(self.schema_name.clone(), self.schema.clone());
        (self.schema_name.clone(), schemas)
    }
}

impl Strategy for CustomStrategy {
    fn decode(&self, obj: &Value) -> Result<(Value, Vec<String>), DecodeError> {
        if !obj.is_object() {
            return Err(DecodeError::NotAnObject);
        }
        if obj.get("metadata").is_some_and(|m| !m.is_object()) {
            return Err(DecodeError::MetadataNotAnObject);
        }
        let mut pruned = obj.clone();
        let mut dropped = Vec::new();
        schema::prune(&mut pruned, &self.schema, "", true, &mut dropped);
        Ok((pruned, dropped))
    }

    fn default(&self, obj: &mut Value) {
        schema::apply_defaults(obj, &self.schema);
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut causes = Vec::new();
        schema::validate(obj, &self.schema, "", &mut causes);
        causes
    }

    fn tracks_generation(&self) -> bool {
        self.has_status
    }

    fn openapi_schemas(&self) -> Option<(String, serde_json::Map<String, Value>)> {
        Some(self.schemas())
    }

    fn openapi_name(&self) -> Option<String> {
        Some(self.schema_name.clone())
    }

    fn patch_schema(&self) -> Option<crate::apiserver::patch::patch_meta::SharedSchema> {
        let set = self.patch.get_or_init(|| {
            let (root, components) = self.schemas();
            std::sync::Arc::new(crate::apiserver::patch::patch_meta::SchemaSet::new(root, components))
        });
        Some(set.clone())
    }

    fn is_custom(&self) -> bool {
        true
    }

    fn conversion(&self) -> Option<&dyn Converter> {
        self.conversion.as_ref().map(|c| c as &dyn Converter)
    }

    fn columns(&self) -> Vec<Column> {
        if self.columns.is_empty() {
            return Vec::new();
        }
        let mut cols: Vec<Column> = self.columns.iter().map(|c| Column::new(c.name, c.kind, c.priority)).collect();
        if !self.columns.iter().any(|c| c.json_path == ".metadata.creationTimestamp") {
            cols.push(Column::age());
        }
        cols
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let mut cells: Vec<Value> = self
            .columns
            .iter()
            .map(|c| {
                let v = schema::json_path(obj, &c.json_path).cloned().unwrap_or(Value::Null);
                if c.json_path == ".metadata.creationTimestamp" {
                    return json!(meta::age(obj));
                }
                match (c.kind, v) {
                    ("date", Value::String(s)) => {
                        json!(meta::parse_rfc3339(&s).map(|t| meta::human_duration(meta::unix_now() - t)).unwrap_or(s))
                    }
                    (_, Value::Null) => json!("<none>"),
                    (_, other) => other,
                }
            })
            .collect();
        if !self.columns.is_empty() && !self.columns.iter().any(|c| c.json_path == ".metadata.creationTimestamp") {
            cells.push(json!(meta::age(obj)));
        }
        cells
    }
}

fn strs(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

/// The resources a CRD serves, one per served version; `storage` is where
/// its conversion webhook's Service is looked up.
pub fn resources_of(crd: &Value, storage: &Storage) -> Vec<Resource> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default().to_string();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default().to_string();
    let kind = names["kind"].as_str().unwrap_or_default().to_string();
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return Vec::new();
    }
    let singular = names["singular"].as_str().map(str::to_string).unwrap_or_else(|| kind.to_ascii_lowercase());
    let list_kind = names["listKind"].as_str().map(str::to_string).unwrap_or_else(|| format!("{kind}List"));
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let versions = Arc::new(conversion::Versions::of(crd, storage.clone()));
    let mut out = Vec::new();
    for v in spec["versions"].as_array().into_iter().flatten() {
        if v["served"].as_bool() != Some(true) {
            continue;
        }
        let version = v["name"].as_str().unwrap_or_default().to_string();
        let schema = conversion::version_schema(v);
        let columns = v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| PrinterColumn {
                name: leak(c["name"].as_str().unwrap_or_default()),
                kind: leak(c["type"].as_str().unwrap_or("string")),
                priority: c["priority"].as_i64().unwrap_or(0) as i32,
                json_path: c["jsonPath"].as_str().unwrap_or_default().to_string(),
            })
            .collect();
        let has_status = v.pointer("/subresources/status").is_some();
        let scale = v.pointer("/subresources/scale").map(|s| ScalePaths {
            spec_replicas: s["specReplicasPath"].as_str().unwrap_or(".spec.replicas").to_string(),
            status_replicas: s["statusReplicasPath"].as_str().unwrap_or(".status.replicas").to_string(),
            label_selector: s["labelSelectorPath"].as_str().map(str::to_string),
        });
        out.push(Resource {
            group: group.clone(),
            version: version.clone(),
            kind: kind.clone(),
            list_kind: list_kind.clone(),
            plural: plural.clone(),
            singular: singular.clone(),
            namespaced,
            verbs: CRUD_VERBS.iter().map(|s| s.to_string()).collect(),
            short_names: strs(names.get("shortNames")),
            categories: strs(names.get("categories")),
            status: has_status,
            scale,
            subresources: Vec::new(),
            ephemeral: false,
            computed: false,
            begin_write: None,
            strategy: Arc::new(CustomStrategy {
                schema_name: format!("{}.{}.{}", group.split('.').rev().collect::<Vec<_>>().join("."), version, kind),
                schema,
                columns,
                has_status,
                patch: std::sync::OnceLock::new(),
                conversion: versions
                    .converts(&version)
                    .then(|| conversion::CrdConversion::new(versions.clone(), &version)),
            }),
        });
    }
    // The storage version's peers come first in discovery's version order.
    out
}

/// Registers a CRD's resources (replacing older ones) and marks it established.
async fn register(api: &Api, crd: &Value, rev: i64) {
    let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default().to_string();
    let plural = crd.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default().to_string();
    if crd.pointer("/metadata/deletionTimestamp").is_some() {
        api.registry.remove(&group, &plural);
        return;
    }
    api.registry.replace(&group, &plural, resources_of(crd, &api.storage));
    establish(api, crd, rev).await;
}

/// Sets acceptedNames and the NamesAccepted/Established conditions.
async fn establish(api: &Api, crd: &Value, rev: i64) {
    let established = crd
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Established" && c["status"] == "True"))
        && crd.pointer("/status/acceptedNames") == crd.pointer("/spec/names");
    if established {
        return;
    }
    let now = meta::now_rfc3339();
    let mut updated = crd.clone();
    updated["status"] = json!({
        "acceptedNames": crd["spec"]["names"],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now, "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": now, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
        ],
        "storedVersions": crate::apiserver::kinds::stored_versions(crd),
    });
    let name = meta::name_of(crd).to_string();
    if let Err(e) = api.storage.update(&format!("{PREFIX}{name}"), &updated, rev).await {
        tracing::debug!(crd = %name, error = ?e, "CRD status update lost a race; the next event retries");
    }
}

/// Deletes a CRD whose deletion began: its objects first, then the CRD.
async fn finish_deletion(api: &Api, crd: &Value, rev: i64) {
    let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
    let plural = crd.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default();
    let prefix = format!("/registry/{group}/{plural}/");
    loop {
        let page = match api.storage.list(&prefix, None, 500, ReadAt::Latest).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list custom resources to delete");
                return;
            }
        };
        if page.items.is_empty() {
            break;
        }
        for item in page.items {
            let ns = meta::namespace_of(&item.object).map(|n| format!("{n}/")).unwrap_or_default();
            let key = format!("{prefix}{ns}{}", meta::name_of(&item.object));
            let _ = api.storage.delete(&key, item.rev).await;
        }
    }
    let name = meta::name_of(crd);
    let _ = api.storage.delete(&format!("{PREFIX}{name}"), rev).await;
}

async fn handle(api: &Api, crd: &Value, rev: i64) {
    if crd.pointer("/metadata/deletionTimestamp").is_some() {
        let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
        let plural = crd.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default();
        api.registry.remove(group, plural);
        let only_ours = crd
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|f| f.iter().all(|x| x == "customresourcecleanup.apiextensions.k8s.io"));
        if only_ours {
            finish_deletion(api, crd, rev).await;
        }
        return;
    }
    register(api, crd, rev).await;
}

/// Loads the stored CRDs (so their resources are served before the server
/// reports ready), then follows changes in a task.
pub async fn start(api: Arc<Api>) -> Result<tokio::task::JoinHandle<()>, super::status::ApiError> {
    let mut follower = Follower::new(api.storage.clone(), PREFIX);
    for crd in follower.list().await? {
        handle(&api, &crd.object, crd.rev).await;
    }
    Ok(tokio::spawn(follow(api, follower)))
}

async fn follow(api: Arc<Api>, mut follower: Follower) {
    loop {
        match follower.next().await {
            Followed::Listed(crds) => {
                for crd in crds {
                    handle(&api, &crd.object, crd.rev).await;
                }
            }
            Followed::Put(s) => handle(&api, &s.object, s.rev).await,
            Followed::Deleted(s) => {
                let group = s.object.pointer("/spec/group").and_then(Value::as_str).unwrap_or_default();
                let plural = s.object.pointer("/spec/names/plural").and_then(Value::as_str).unwrap_or_default();
                api.registry.remove(group, plural);
            }
        }
    }
}
