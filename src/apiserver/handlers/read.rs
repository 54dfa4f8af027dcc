//! get, list and watch.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::Call;
use crate::apiserver::selector::{FieldSelector, LabelSelector};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::storage::{decode_continue, encode_continue, Change, Decoding, ReadAt};
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

/// How far a list or watch's resourceVersion lets us go.
fn read_at(call: &Call) -> ApiResult<ReadAt> {
    match (call.param("resourceVersion"), call.param("resourceVersionMatch")) {
        (Some(rv), Some("Exact")) => {
            let rev =
                rv.parse::<i64>().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?;
            Ok(ReadAt::Exact(rev))
        }
        (None, Some(m)) => Err(ApiError::bad_request(format!(
            "resourceVersionMatch is forbidden unless resourceVersion is provided (got {m})"
        ))),
        _ => Ok(ReadAt::Latest),
    }
}

pub async fn list(call: &Call) -> ApiResult<Response> {
    let r = &call.resource;
    let prefix = r.list_prefix(call.namespace());
    let filters = Filters::of(call)?;
    let limit = call.param("limit").and_then(|l| l.parse::<i64>().ok()).filter(|l| *l > 0);
    if let Some(resp) = super::cached_read::list(call, &filters, limit).await? {
        return Ok(resp);
    }
    let (mut at, mut start) = (read_at(call)?, None);
    if let Some(token) = call.param("continue") {
        let (rev, key) = decode_continue(token, &prefix)?;
        at = ReadAt::Exact(rev);
        start = Some(key);
    }
    let mut items = Vec::new();
    let mut list_rev;
    let mut next;
    let mut remaining;
    loop {
        let want = limit.map(|l| l - items.len() as i64).unwrap_or(0);
        // With selectors, read in larger pages: most rows may not match.
        let page_size = if filters.is_empty() { want } else { want.max(500) };
        let page = call.api.storage.list(&prefix, start.take(), page_size, at).await?;
        list_rev = page.rev;
        remaining = page.remaining;
        next = page.next_key;
        // Selectors read the served form (an events.k8s.io Event's
        // `reportingController` is its stored `reportingComponent`).
        for stored in call.served_all(page.items).await? {
            if !filters.matches(&stored.object) {
                continue;
            }
            items.push(stored.object);
            if limit.is_some_and(|l| items.len() as i64 >= l) {
                break;
            }
        }
        let full = limit.is_some_and(|l| items.len() as i64 >= l);
        if full || next.is_none() {
            if full && !filters.is_empty() {
                // The next page starts after the last item returned.
                if let Some(last) = items.last() {
                    let name = last.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
                    let ns = last.pointer("/metadata/namespace").and_then(Value::as_str);
                    let mut key = r.key(ns, name).into_bytes();
                    key.push(0);
                    next = Some(key);
                    remaining = None;
                }
            }
            break;
        }
        at = ReadAt::Exact(list_rev);
        start = next.take();
    }
    let mut meta = json!({"resourceVersion": list_rev.to_string()});
    if let (Some(_), Some(key)) = (limit, &next) {
        meta["continue"] = json!(encode_continue(list_rev, &prefix, key));
        if let Some(n) = remaining.filter(|n| *n > 0 && filters.is_empty()) {
            meta["remainingItemCount"] = json!(n);
        }
    }
    Ok(list_response(call, items, meta))
}

/// A list answer: the objects with the list's metadata, as a Table or
/// metadata only when asked so.
pub(super) fn list_response(call: &Call, items: Vec<Value>, meta: Value) -> Response {
    let r = &call.resource;
    if wants_table(call.accept()) {
        let objs: Vec<Value> = items.into_iter().map(|o| super::read::typed(call, o)).collect();
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
                .unwrap_or(super::cached_read::DEFAULT_WATCH_TIMEOUT),
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

/// What a watch from the store sends of one change, in the served form.
enum Picked {
    Bookmark(i64),
    Event(&'static str, crate::apiserver::storage::Stored),
}

/// What a selecting watch sends of a modified object: ADDED when it
/// enters the selection, DELETED when it leaves it.
async fn modified(
    call: &Call,
    filters: &Filters,
    new: crate::apiserver::storage::Stored,
    old: Option<crate::apiserver::storage::Stored>,
) -> ApiResult<Option<Picked>> {
    let new = call.served(new).await?;
    let now = filters.matches(&new.object);
    if filters.is_empty() {
        return Ok(Some(Picked::Event("MODIFIED", new)));
    }
    let before = match old {
        Some(o) => filters.matches(&call.served(o).await?.object),
        None => false,
    };
    Ok(match (before, now) {
        (false, true) => Some(Picked::Event("ADDED", new)),
        (true, true) => Some(Picked::Event("MODIFIED", new)),
        (true, false) => Some(Picked::Event("DELETED", new)),
        (false, false) => None,
    })
}

/// A streamed watch: JSON lines of `{"type": ..., "object": ...}`.
pub async fn watch(call: Call) -> ApiResult<Response> {
    let call = match super::cached_read::watch(call).await? {
        Ok(served) => return Ok(served),
        Err(call) => call,
    };
    let filters = Filters::of(&call)?;
    let as_table = wants_table(call.accept());
    let params = WatchParams::of(&call);
    let start_rev = params.start_rev()?;
    let WatchParams { bookmarks, send_initial, single, key, exact, timeout, .. } = params;
    let mut initial: Vec<Value> = Vec::new();
    let start = match start_rev {
        Some(rev) => rev,
        None => {
            // The key of one object is also a prefix of longer names: filter by name.
            let (items, rev) = call.api.storage.list_all(&key).await?;
            let named: Vec<_> = items
                .into_iter()
                .filter(|s| {
                    single
                        .as_deref()
                        .is_none_or(|n| s.object.pointer("/metadata/name").and_then(Value::as_str) == Some(n))
                })
                .collect();
            // Selectors read the served form (an events.k8s.io Event's
            // `regarding.name` is its stored `involvedObject.name`).
            for s in call.served_all(named).await? {
                if filters.matches(&s.object) {
                    initial.push(event(&call, "ADDED", s.object, as_table));
                }
            }
            if send_initial == Some(true) {
                initial.push(bookmark(&call, rev, true));
            }
            rev
        }
    };
    let progress_every = if bookmarks { Duration::from_secs(60) } else { Duration::from_secs(3600) };
    // Only a selector needs the old object: to tell an object entering it
    // from one leaving it.
    let decoding = if filters.is_empty() { Decoding::NEW } else { Decoding::NEW_AND_OLD };
    let changes = call.api.storage.watch(&key, exact, start, progress_every, decoding).await?;
    let call = std::sync::Arc::new(call);
    let filters = std::sync::Arc::new(filters);
    let picked = changes.then(move |change| {
        let call = call.clone();
        let filters = filters.clone();
        async move {
            // Selectors read the served form (an events.k8s.io Event's
            // `regarding.name` is its stored `involvedObject.name`).
            let picked = match change {
                Err(e) => Err(e),
                Ok(Change::Progress(rev)) => Ok(bookmarks.then(|| Picked::Bookmark(rev))),
                Ok(Change::Added(s)) => {
                    let s = call.served(s).await;
                    s.map(|s| filters.matches(&s.object).then_some(Picked::Event("ADDED", s)))
                }
                Ok(Change::Deleted(s)) => {
                    let s = call.served(s).await;
                    s.map(|s| filters.matches(&s.object).then_some(Picked::Event("DELETED", s)))
                }
                Ok(Change::Modified { new, old }) => modified(&call, &filters, new, old).await,
            };
            match picked {
                Err(e) => Some(json!({"type": "ERROR", "object": e.to_status()})),
                Ok(None) => None,
                Ok(Some(Picked::Bookmark(rev))) => Some(bookmark(&call, rev, false)),
                Ok(Some(Picked::Event(kind, s))) => Some(event(&call, kind, s.object, as_table)),
            }
        }
    });
    let lines = futures_util::stream::iter(initial.into_iter().map(Ok::<Value, ApiError>))
        .chain(picked.filter_map(|line| std::future::ready(line.map(Ok))));
    // End the stream with the timeout, and after an ERROR event.
    let deadline = tokio::time::sleep(timeout);
    let body = async_stream_lines(lines, deadline);
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache, private")],
        Body::from_stream(body),
    )
        .into_response())
}

fn async_stream_lines<S>(
    lines: S,
    deadline: tokio::time::Sleep,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send
where
    S: futures_util::Stream<Item = Result<Value, ApiError>> + Send + 'static,
{
    let lines = Box::pin(lines);
    let deadline = Box::pin(deadline);
    futures_util::stream::unfold((lines, deadline, false), |(mut lines, mut deadline, done)| async move {
        if done {
            return None;
        }
        tokio::select! {
            _ = &mut deadline => None,
            item = lines.next() => match item {
                None => None,
                Some(Ok(v)) => {
                    let is_error = v.get("type").and_then(Value::as_str) == Some("ERROR");
                    let mut bytes = crate::apiserver::field_order::to_json(&v).into_bytes();
                    bytes.push(b'\n');
                    Some((Ok(bytes), (lines, deadline, is_error)))
                }
                Some(Err(e)) => {
                    let event = json!({"type": "ERROR", "object": e.to_status()});
                    let mut bytes = crate::apiserver::field_order::to_json(&event).into_bytes();
                    bytes.push(b'\n');
                    Some((Ok(bytes), (lines, deadline, true)))
                }
            }
        }
    })
}
