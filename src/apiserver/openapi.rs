//! OpenAPI v3 documents: `/openapi/v3` lists one document per
//! group/version, and each document describes the resources' paths and
//! operations with their `x-kubernetes-group-version-kind` and query
//! parameters. kubectl reads the PATCH operations to learn that the server
//! validates fields itself (`fieldValidation`), so it sends manifests
//! without validating them client-side.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::registry::Registry;
use super::resource::Resource;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn all_versions(registry: &Registry) -> Vec<(String, String)> {
    let mut out = vec![(String::new(), "v1".to_string())];
    for g in registry.groups() {
        for v in g.versions {
            out.push((g.name.clone(), v));
        }
    }
    out
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params() -> Vec<Value> {
    vec![
        query_param("dryRun", "When present, indicates that modifications should not be persisted."),
        query_param("fieldManager", "fieldManager is a name associated with the actor or entity that is making these changes."),
        query_param("fieldValidation", "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields: Ignore, Warn or Strict."),
    ]
}

fn operation(r: &Resource, action: &str, id: &str, params: Vec<Value>) -> Value {
    let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
    let reference = format!("#/components/schemas/{}", component_name(r));
    json!({
        "operationId": id,
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": reference}}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
    })
}

/// The component that describes a resource's type (`io.k8s.api.core.v1.Pod`).
fn component_name(r: &Resource) -> String {
    r.strategy.openapi_name().unwrap_or_else(|| format!("{}.{}", r.version, r.kind))
}

fn document(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let resources = registry.in_version(group, version);
    if resources.is_empty() {
        return None;
    }
    let base = format!("/{}", gv_path(group, version));
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for r in &resources {
        let collection = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{base}/{}", r.plural)
        };
        let item = format!("{collection}/{{name}}");
        let op = |action: &str, params: Vec<Value>| operation(r, action, &format!("{action}{}", r.kind), params);
        paths.insert(
            collection,
            json!({
                "get": op("list", vec![query_param("labelSelector", ""), query_param("fieldSelector", ""), query_param("limit", ""), query_param("continue", "")]),
                "post": op("post", write_params()),
                "delete": op("deletecollection", vec![query_param("labelSelector", "")]),
            }),
        );
        let mut patch_params = write_params();
        patch_params.push(query_param("force", "Force is going to \"force\" Apply requests."));
        paths.insert(
            item,
            json!({
                "get": op("get", vec![]),
                "put": op("put", write_params()),
                "patch": op("patch", patch_params),
                "delete": op("delete", vec![query_param("dryRun", ""), query_param("gracePeriodSeconds", ""), query_param("propagationPolicy", "")]),
            }),
        );
        if let Some((name, components)) = r.strategy.openapi_schemas() {
            for (k, v) in components {
                schemas.entry(k).or_insert(v);
            }
            if let Some(Value::Object(root)) = schemas.get_mut(&name) {
                root.insert(
                    "x-kubernetes-group-version-kind".into(),
                    json!([{"group": r.group, "version": r.version, "kind": r.kind}]),
                );
            }
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": super::discovery::KUBE_VERSION.2},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// When this process started, in nanoseconds, for document hashes.
static STARTED: std::sync::LazyLock<u128> = std::sync::LazyLock::new(|| {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
});

fn hash(doc: &str) -> String {
    let digest = Sha256::digest(doc.as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02X}")).collect()
}

fn json_response(v: &Value) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// Serialized per-version documents, kept while the registry is unchanged.
/// Only versions someone asked for are built; a document is a few hundred
/// KiB of text, far less than the JSON values it is made from.
#[derive(Default)]
pub struct DocumentCache {
    docs: std::sync::Mutex<std::collections::HashMap<GroupVersion, CachedDocument>>,
}

type GroupVersion = (String, String);
/// The registry generation a document was built at, and its text.
type CachedDocument = (u64, std::sync::Arc<String>);

impl DocumentCache {
    fn get(&self, registry: &Registry, group: &str, version: &str) -> Option<std::sync::Arc<String>> {
        let generation = registry.generation();
        let key = (group.to_string(), version.to_string());
        if let Some((g, doc)) = self.docs.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            if *g == generation {
                return Some(doc.clone());
            }
        }
        let doc = std::sync::Arc::new(document(registry, group, version)?.to_string());
        self.docs.lock().unwrap_or_else(|e| e.into_inner()).insert(key, (generation, doc.clone()));
        Some(doc)
    }
}

/// `/openapi/v2`: a Swagger 2.0 document without definitions, as protobuf
/// (gnostic's Document: swagger = 1, info = 2 with title = 1, version = 2)
/// when asked so, else JSON. kubectl falls back to it to validate `List`s;
/// kinds it has no schema for are left to the server's own validation.
fn swagger(accept: &str) -> Response {
    let version = super::discovery::KUBE_VERSION.2;
    if accept.contains("protobuf") {
        let field = |tag: u8, data: &[u8]| {
            let mut out = vec![tag, data.len() as u8];
            out.extend_from_slice(data);
            out
        };
        let mut info = field(0x0a, b"Kubernetes");
        info.extend(field(0x12, version.as_bytes()));
        let mut doc = field(0x0a, b"2.0");
        doc.extend(field(0x12, &info));
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")],
            doc,
        )
            .into_response();
    }
    json_response(
        &json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": version}, "paths": {}, "definitions": {}}),
    )
}

/// Serves `/openapi/v2`, `/openapi/v3` and `/openapi/v3/<gv path>`.
pub fn serve(registry: &Registry, cache: &DocumentCache, path: &str, accept: &str) -> Option<Response> {
    if path == "/openapi/v2" {
        return Some(swagger(accept));
    }
    let rest = path.strip_prefix("/openapi/v3")?;
    let rest = rest.trim_start_matches('/');
    if rest.is_empty() {
        let mut paths = serde_json::Map::new();
        // The hash only has to change when a document may: it covers the
        // version's resources, the registry's generation and this process's
        // start, so the index is answered without building any document.
        for (g, v) in all_versions(registry) {
            let resources = registry.in_version(&g, &v);
            if resources.is_empty() {
                continue;
            }
            let mut key = format!("{g}/{v}@{}:{}", registry.generation(), *STARTED);
            for r in &resources {
                key.push_str(&format!(";{}={}", r.plural, r.kind));
            }
            let p = gv_path(&g, &v);
            paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", hash(&key))}));
        }
        return Some(json_response(&json!({"paths": paths})));
    }
    let (group, version) = match rest.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    cache
        .get(registry, &group, &version)
        .map(|d| (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], d.as_str().to_string()).into_response())
}
