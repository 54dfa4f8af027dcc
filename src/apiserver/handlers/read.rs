//! get, and what every read shares: the request's label and field
//! selectors, a watch's parameters, and the answers (an object, a list, a
//! watch event) as JSON, a Table or metadata only. `list` and `watch` take
//! them from the watch cache (`cached_read`) or from the store.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::Call;
use crate::apiserver::selector::{FieldSelector, LabelSelector};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::table::wants_table;

/// Fills in apiVersion and kind, which every answer carries.
pub fn typed(call: &Call, mut obj: Value) -> Value {
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(call.resource.api_version()));
        m.insert("kind".into(), json!(call.resource.kind));
    }
    obj
}

/// Whether the client asked for metadata only (client-go's metadata
/// informers, `kube`'s metadata watchers).
pub(super) fn wants_metadata(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.replace(' ', "").contains("as=PartialObjectMetadata"))
}

/// An object reduced to its metadata.
pub(super) fn partial(obj: &Value) -> Value {
    partial_of(obj.get("metadata").cloned().unwrap_or_else(|| json!({})))
}

/// A PartialObjectMetadata of `metadata`.
pub(super) fn partial_of(metadata: Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata})
}

/// An object answer, as a Table or metadata only when asked so.
pub fn object_response(call: &Call, code: StatusCode, obj: Value) -> Response {
    let obj = typed(call, obj);
    if wants_metadata(call.accept()) {
        return call.respond(code, &partial(&obj));
    }
    if wants_table(call.accept()) {
        let rv = obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""));
        let t = call.resource.table(
            std::slice::from_ref(&obj),
            json!({"resourceVersion": rv}),
            call.param("includeObject").unwrap_or("Metadata"),
        );
        return call.respond(code, &t);
    }
    call.respond(code, &obj)
}

pub async fn get(call: &Call) -> ApiResult<Response> {
    let stored = call.load_object().await?;
    Ok(object_response(call, StatusCode::OK, stored.object))
}

pub async fn get_scale(call: &Call) -> ApiResult<Response> {
    let stored = call.load_object().await?;
    Ok(call.respond(StatusCode::OK, &scale_of(call, &stored.object)))
}

/// The `autoscaling/v1` Scale view of an object.
pub fn scale_of(call: &Call, obj: &Value) -> Value {
    let paths = call.resource.scale.clone();
    let get = |p: &str| obj.pointer(&p.replace('.', "/")).and_then(Value::as_i64).unwrap_or(0);
    let (spec, status) = paths.as_ref().map(|p| (get(&p.spec_replicas), get(&p.status_replicas))).unwrap_or((0, 0));
    // A custom resource's selector is the string its labelSelectorPath
    // names ("" without one); a built-in kind's is made from spec.selector.
    let custom = call.resource.strategy.is_custom();
    let custom_selector = paths.as_ref().filter(|_| custom).map(|p| {
        let at = p.label_selector.as_deref().map(|l| l.replace('.', "/"));
        at.and_then(|l| obj.pointer(&l)).and_then(Value::as_str).unwrap_or_default().to_string()
    });
    let selector = custom_selector
        .or_else(|| {
            obj.pointer("/spec/selector").map(|s| {
                if s.get("matchLabels").is_some() || s.get("matchExpressions").is_some() {
                    crate::apiserver::kinds::selector_string(Some(s))
                } else {
                    crate::apiserver::kinds::map_selector_string(Some(s))
                }
            })
        })
        .unwrap_or_default();
    let meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
            "creationTimestamp": meta.get("creationTimestamp"),
        },
        "spec": {"replicas": spec},
        "status": {"replicas": status, "selector": selector},
    })
}

/// A request's label and field selectors.
#[derive(Clone)]
pub(super) struct Filters {
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filters {
    pub(super) fn of(call: &Call) -> ApiResult<Filters> {
        Ok(Filters {
            labels: LabelSelector::parse(call.param("labelSelector").unwrap_or_default())?,
            fields: FieldSelector::parse(
                call.param("fieldSelector").unwrap_or_default(),
                &call.resource.group,
                &call.resource.kind,
            )?,
        })
    }

    pub(super) fn matches(&self, obj: &Value) -> bool {
        self.labels.matches_object(obj) && self.fields.matches(obj)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// The value a field selector requires `label` to have, if any.
    pub(super) fn required_field(&self, label: &str) -> Option<&str> {
        self.fields.required(label)
    }
}

/// A list answer: the objects with the list's metadata, as a Table or
/// metadata only when asked so.
pub(super) fn list_response(call: &Call, items: Vec<Value>, meta: Value) -> Response {
    let r = &call.resource;
    if wants_table(call.accept()) {
        let objs: Vec<Value> = items.into_iter().map(|o| typed(call, o)).collect();
        let t = r.table(&objs, meta, call.param("includeObject").unwrap_or("Metadata"));
        return call.respond(StatusCode::OK, &t);
    }
    if wants_metadata(call.accept()) {
        let items: Vec<Value> = items.iter().map(partial).collect();
        let list = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items});
        return call.respond(StatusCode::OK, &list);
    }
    let items: Vec<Value> = items.into_iter().map(|o| typed(call, o)).collect();
    let list = json!({
        "kind": r.list_kind,
        "apiVersion": r.api_version(),
        "metadata": meta,
        "items": items,
    });
    call.respond(StatusCode::OK, &list)
}

/// A watch event of an object in the call's served form.
pub(super) fn event(call: &Call, kind: &str, obj: Value, as_table: bool) -> Value {
    let obj = typed(call, obj);
    if wants_metadata(call.accept()) {
        return json!({"type": kind, "object": partial(&obj)});
    }
    if as_table {
        let rv = obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(json!(""));
        let t = call.resource.table(
            std::slice::from_ref(&obj),
            json!({"resourceVersion": rv}),
            call.param("includeObject").unwrap_or("Metadata"),
        );
        return json!({"type": kind, "object": t});
    }
    json!({"type": kind, "object": obj})
}

pub(super) fn bookmark(call: &Call, rev: i64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rev.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": {"kind": call.resource.kind, "apiVersion": call.resource.api_version(), "metadata": meta}})
}

/// What a watch asks for.
pub(super) struct WatchParams {
    pub bookmarks: bool,
    pub rv: Option<String>,
    pub send_initial: Option<bool>,
    /// A single named object (kubectl get NAME -w) watches its key only.
    pub single: Option<String>,
    pub key: String,
    pub exact: bool,
    pub timeout: Duration,
}

impl WatchParams {
    pub(super) fn of(call: &Call) -> WatchParams {
        let r = &call.resource;
        let single = call.path.name.clone();
        let (key, exact) = match &single {
            Some(name) => (r.key(call.namespace(), name), true),
            None => (r.list_prefix(call.namespace()), false),
        };
        WatchParams {
            bookmarks: call.flag("allowWatchBookmarks"),
            rv: call.param("resourceVersion").map(str::to_string),
            send_initial: call.param("sendInitialEvents").map(|v| v == "true"),
            single,
            key,
            exact,
            timeout: call
                .param("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_secs)
                .unwrap_or(DEFAULT_WATCH_TIMEOUT),
        }
    }

    /// The revision the watch resumes after; None when it starts with the
    /// current state as ADDED events (upstream: no resourceVersion, "0",
    /// or sendInitialEvents=true).
    pub(super) fn start_rev(&self) -> ApiResult<Option<i64>> {
        match (self.rv.as_deref(), self.send_initial) {
            (Some(v), Some(false)) | (Some(v), None) if v != "0" && !v.is_empty() => v
                .parse::<i64>()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {v:?}"))),
            _ => Ok(None),
        }
    }
}

/// How long a watch lasts when the client does not say.
pub(super) const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(30 * 60);
