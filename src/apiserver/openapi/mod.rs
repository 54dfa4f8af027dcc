//! OpenAPI documents. `/openapi/v3` lists one document per group/version,
//! and each document describes the resources' paths and operations with
//! their `x-kubernetes-group-version-kind` and query parameters. kubectl
//! reads the PATCH operations to learn that the server validates fields
//! itself (`fieldValidation`), so it sends manifests without validating
//! them client-side.
//!
//! `/openapi/v2` is the whole API in one Swagger 2.0 document (`swagger`),
//! as JSON or as gnostic's protobuf (`gnostic`), which kubectl up to 1.2x
//! reads for `explain`, validation and its dry-run check, and which the
//! conformance tests poll for custom resources' definitions.

mod definitions;
mod gnostic;
mod parameters;
mod paths;
mod swagger;

use std::sync::{Arc, Weak};

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::registry::Registry;
use super::resource::Resource;
use crate::sync::LockExt;

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
///
/// The v2 document is about 1.6 MiB (JSON) or 1.3 MiB (protobuf) and takes
/// tens of milliseconds to build: it is built on request, on a thread that
/// ends with the build, and held only while responses are sending it (a
/// `Weak`), so that concurrent requests share one copy and an idle server
/// keeps none; its ETag comes from the registry's generation, so a client
/// that has the current document gets a 304 without a build.
#[derive(Default)]
pub struct DocumentCache {
    docs: std::sync::Mutex<std::collections::HashMap<GroupVersion, CachedDocument>>,
    swagger: std::sync::Mutex<SwaggerBodies>,
    /// One v2 build at a time: requests that arrive meanwhile wait and
    /// share its body.
    swagger_build: tokio::sync::Mutex<()>,
    /// The size of the last v2 body built in each form.
    swagger_sizes: [std::sync::atomic::AtomicUsize; 2],
}

/// The v2 bodies being sent, by form, and the generation they were built at.
#[derive(Default)]
struct SwaggerBodies {
    generation: u64,
    json: Weak<Vec<u8>>,
    protobuf: Weak<Vec<u8>>,
}

type GroupVersion = (String, String);
/// The registry generation a document was built at, and its text.
type CachedDocument = (u64, std::sync::Arc<String>);

impl DocumentCache {
    fn get(&self, registry: &Registry, group: &str, version: &str) -> Option<std::sync::Arc<String>> {
        let generation = registry.generation();
        let key = (group.to_string(), version.to_string());
        if let Some((g, doc)) = self.docs.locked().get(&key) {
            if *g == generation {
                return Some(doc.clone());
            }
        }
        let doc = std::sync::Arc::new(document(registry, group, version)?.to_string());
        self.docs.locked().insert(key, (generation, doc.clone()));
        Some(doc)
    }
}

/// The two forms of the v2 document.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SwaggerForm {
    Json,
    Protobuf,
}

impl SwaggerForm {
    fn content_type(self) -> &'static str {
        match self {
            SwaggerForm::Json => "application/json",
            SwaggerForm::Protobuf => "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        }
    }

    /// The first form `accept` names (no header: JSON); None when it
    /// names neither (upstream answers 406).
    fn negotiate(accept: &str) -> Option<SwaggerForm> {
        if accept.trim().is_empty() {
            return Some(SwaggerForm::Json);
        }
        accept.split(',').find_map(|clause| {
            let mut parts = clause.split(';');
            let media = parts.next().unwrap_or_default().trim();
            if parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000")) {
                return None;
            }
            match media {
                "application/json" | "application/*" | "*/*" => Some(SwaggerForm::Json),
                "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
                | "application/com.github.proto-openapi.spec.v2.v1.0+protobuf" => Some(SwaggerForm::Protobuf),
                _ => None,
            }
        })
    }
}

/// A body shared with the cache while it is sent.
struct SharedBody(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedBody {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// The v2 document's ETag at `generation`, in `form`.
fn swagger_etag(generation: u64, form: SwaggerForm) -> String {
    let form = match form {
        SwaggerForm::Json => "json",
        SwaggerForm::Protobuf => "protobuf",
    };
    format!("\"{}\"", hash(&format!("v2@{generation}:{}:{form}", *STARTED)))
}

/// Whether `If-None-Match` names `etag` (or `*`).
fn none_match(headers: &HeaderMap, etag: &str) -> bool {
    headers.get_all(header::IF_NONE_MATCH).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
        |tag| {
            let tag = tag.trim();
            tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag
        },
    )
}

impl DocumentCache {
    fn swagger_body(&self, generation: u64, form: SwaggerForm) -> Option<Arc<Vec<u8>>> {
        let bodies = self.swagger.locked();
        if bodies.generation != generation {
            return None;
        }
        match form {
            SwaggerForm::Json => bodies.json.upgrade(),
            SwaggerForm::Protobuf => bodies.protobuf.upgrade(),
        }
    }

    fn keep_swagger_body(&self, generation: u64, form: SwaggerForm, body: &Arc<Vec<u8>>) {
        let mut bodies = self.swagger.locked();
        if bodies.generation != generation {
            *bodies = SwaggerBodies { generation, ..Default::default() };
        }
        match form {
            SwaggerForm::Json => bodies.json = Arc::downgrade(body),
            SwaggerForm::Protobuf => bodies.protobuf = Arc::downgrade(body),
        }
    }
}

/// Builds the v2 document in `form` for what `api` serves now, with the
/// generation it was built at.
fn build_swagger(api: &super::Api, form: SwaggerForm) -> (u64, Vec<u8>) {
    let generation = api.registry.generation();
    let started = std::time::Instant::now();
    // The last build's size, so that the buffer is allocated once.
    let size = &api.openapi.swagger_sizes[form as usize];
    let capacity = size.load(std::sync::atomic::Ordering::Relaxed) + 64 * 1024;
    let body = match form {
        SwaggerForm::Json => swagger::write(&api.registry, swagger::JsonWriter::with_capacity(capacity)),
        SwaggerForm::Protobuf => swagger::write(&api.registry, gnostic::ProtobufWriter::with_capacity(capacity)),
    };
    size.store(body.len(), std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(bytes = body.len(), elapsed = ?started.elapsed(), "built the OpenAPI v2 document");
    (generation, body)
}

/// The v2 body in `form` for what `api` serves now, and the generation it
/// was built at: the one being sent if there is one, else a new build.
async fn swagger_body(api: &Arc<super::Api>, form: SwaggerForm) -> Option<(u64, Arc<Vec<u8>>)> {
    let cached = |api: &super::Api| {
        let generation = api.registry.generation();
        api.openapi.swagger_body(generation, form).map(|body| (generation, body))
    };
    if let Some(found) = cached(api) {
        return Some(found);
    }
    let _building = api.openapi.swagger_build.lock().await;
    if let Some(found) = cached(api) {
        return Some(found);
    }
    // Built on a thread of its own, which ends with the build: a build
    // allocates and frees some MiB in small pieces, which the allocator
    // would keep for each thread that did one; a thread that ends hands
    // its memory back.
    let (reply, built) = tokio::sync::oneshot::channel();
    let builder = api.clone();
    let spawned = std::thread::Builder::new().name("openapi-v2".into()).spawn(move || {
        let _ = reply.send(build_swagger(&builder, form));
    });
    if let Err(e) = spawned {
        tracing::error!("cannot start a thread to build the OpenAPI v2 document: {e}");
        return None;
    }
    let (generation, body) = built.await.ok()?;
    let body = Arc::new(body);
    api.openapi.keep_swagger_body(generation, form, &body);
    Some((generation, body))
}

/// Serves `/openapi/v2`: JSON or protobuf as `Accept` asks, with an ETag,
/// and 304 to a client whose `If-None-Match` holds the current one.
pub async fn serve_swagger(api: Arc<super::Api>, headers: &HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let Some(form) = SwaggerForm::negotiate(accept) else {
        let message = "only application/json and the gnostic protobuf are served";
        return super::status::ApiError::new(406, "NotAcceptable", message).into_response();
    };
    let etag = swagger_etag(api.registry.generation(), form);
    if none_match(headers, &etag) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag), (header::VARY, "Accept".to_string())])
            .into_response();
    }
    let Some((generation, body)) = swagger_body(&api, form).await else {
        let message = "the OpenAPI document could not be built";
        return super::status::ApiError::new(500, "InternalError", message).into_response();
    };
    let mut resp = axum::body::Body::from(axum::body::Bytes::from_owner(SharedBody(body))).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(form.content_type()));
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    if let Ok(v) = HeaderValue::from_str(&swagger_etag(generation, form)) {
        h.insert(header::ETAG, v);
    }
    resp
}

/// Serves `/openapi/v3` and `/openapi/v3/<gv path>`.
pub fn serve(registry: &Registry, cache: &DocumentCache, path: &str) -> Option<Response> {
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
