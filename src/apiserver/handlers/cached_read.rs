//! list and watch served from the watch cache, with upstream's
//! resourceVersion semantics: unset is a consistent read (the cache waits
//! until it has the store's current revision), `0` is whatever the cache
//! has, `N` waits until the cache has reached N (504 after a few seconds).
//! `resourceVersionMatch=Exact` and continue tokens read the store at
//! their revision (`list.rs`, `watch.rs`), as does a watch from a revision older than
//! the cache that the cache never held (first use, after a restart).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::{json, Value};

use super::list_body::{ListBody, ListItems};
use super::read::{bookmark, event, list_response, partial_of, wants_metadata, Filters, WatchParams};
use super::Call;
use crate::apiserver::field_order;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::storage::encode_continue;
use crate::apiserver::table::wants_table;
use crate::apiserver::watch_cache::cacher::{too_old, Listed, NotServed, StartAt};
use crate::apiserver::watch_cache::object::{partial_event_line, CachedObject, EventType, Omit};
use crate::apiserver::watch_cache::watcher::{Delivery, Filter, Inbox};
use crate::apiserver::watch_cache::{Cacher, NODE_NAME};

/// The watcher's view of the resource, from the request.
fn filter_of(cacher: &Cacher, filters: &Filters, key: String, exact: bool) -> Filter {
    let trigger = cacher.shape.index.and_then(|f| filters.required_field(f.label)).map(str::to_string);
    let predicate = (!filters.is_empty()).then(|| {
        let f = filters.clone();
        Arc::new(move |v: &Value| f.matches(v)) as crate::apiserver::watch_cache::watcher::Predicate
    });
    Filter {
        key,
        exact,
        predicate,
        trigger: trigger.filter(|_| cacher.shape.index.is_some_and(|f| f.label == NODE_NAME)),
    }
}

fn parse_rv(v: &str) -> ApiResult<i64> {
    v.parse::<i64>().map_err(|_| ApiError::bad_request(format!("invalid resource version: {v:?}")))
}

/// A list from the cache; None when the store must answer it (the cache
/// is off, Exact, a continue token, a consistent read the cache could not
/// catch up with in time, or one it cannot tell it has caught up with).
pub(super) async fn list(call: &Call, filters: &Filters, limit: Option<i64>) -> ApiResult<Option<Response>> {
    let Some(cacher) = call.api.watch_cache.cacher(&call.resource) else { return Ok(None) };
    if call.param("continue").is_some() {
        return Ok(None);
    }
    let rv = call.param("resourceVersion").filter(|v| !v.is_empty());
    match call.param("resourceVersionMatch") {
        None => {}
        Some("NotOlderThan") if rv.is_some() => {}
        Some(_) => return Ok(None),
    }
    match rv {
        None => {
            if cacher.wait_fresh().await?.is_none() {
                tracing::debug!(prefix = %cacher.shape.prefix, "consistent list from the store: the cache lags");
                return Ok(None);
            }
        }
        Some("0") => {
            cacher.ready().await?;
        }
        Some(v) => {
            if cacher.wait_not_older_than(parse_rv(v)?).await?.is_none() {
                return Ok(None);
            }
        }
    }
    let prefix = call.resource.list_prefix(call.namespace());
    let filter = filter_of(&cacher, filters, prefix.clone(), false);
    let listed = cacher.list(&filter, None, limit.map_or(0, |l| l as usize));
    let mut meta = json!({"resourceVersion": listed.rev.to_string()});
    if let Some(key) = &listed.next_key {
        meta["continue"] = json!(encode_continue(listed.rev, &prefix, key));
        if let Some(n) = listed.remaining.filter(|n| *n > 0) {
            meta["remainingItemCount"] = json!(n);
        }
    }
    let (api_version, kind) = (call.resource.api_version(), call.resource.kind.clone());
    if !wants_table(call.accept()) && !wants_metadata(call.accept()) && !call.wants_yaml() {
        // The objects' JSON is shared; only the list around it is made here.
        let head = json!({"kind": call.resource.list_kind, "apiVersion": api_version, "metadata": meta});
        let head = field_order::to_json(&head);
        let omit = call.omit;
        let body = if !listed.iter().all(|o| o.is_in(&api_version) && call.resource.serves_as_stored(o.api_version())) {
            let encoded = served_json(call, &listed, &api_version, &kind, omit).await?;
            Body::new(ListBody::new(head.as_bytes(), ListedJson::Encoded(encoded)))
        } else if let Some(writes) = listed.shared_writes(omit) {
            Body::new(ListBody::<ListedJson>::shared(head.as_bytes(), writes))
        } else {
            Body::new(ListBody::new(head.as_bytes(), ListedJson::Cached(listed, omit)))
        };
        return Ok(Some(call.respond_json_body(StatusCode::OK, body)));
    }
    if wants_metadata(call.accept()) && !wants_table(call.accept()) {
        let items: Vec<Value> = listed.iter().map(|o| partial_of(o.metadata(call.omit))).collect();
        let list = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items});
        return Ok(Some(call.respond(StatusCode::OK, &list)));
    }
    let items = call.resource.from_storage(listed.iter().map(|o| o.value()).collect()).await?;
    Ok(Some(list_response(call, items, meta)))
}

/// The listed objects' JSON as the call serves them: the cache's (its
/// apiVersion set) for those served as stored, the others converted
/// together (one conversion for the list) and encoded anew.
async fn served_json(call: &Call, listed: &Listed, api_version: &str, kind: &str, omit: Omit) -> ApiResult<Vec<Bytes>> {
    let r = &call.resource;
    let converted: Vec<usize> =
        (0..listed.len()).filter(|i| listed.get(*i).is_some_and(|o| !r.serves_as_stored(o.api_version()))).collect();
    let values = converted.iter().filter_map(|i| listed.get(*i).map(|o| o.value())).collect();
    let mut served = r.from_storage(values).await?.into_iter();
    let mut next_converted = converted.into_iter().peekable();
    let mut out = Vec::with_capacity(listed.len());
    for (i, o) in listed.iter().enumerate() {
        if next_converted.next_if_eq(&i).is_none() {
            out.push(o.json_for(api_version, kind, omit));
            continue;
        }
        let obj = served.next().ok_or_else(|| ApiError::internal("a conversion returned fewer objects"))?;
        out.push(encode_served(call, obj, omit));
    }
    Ok(out)
}

/// An object in the call's served form as JSON, without managedFields
/// when the reader drops them.
fn encode_served(call: &Call, obj: Value, omit: Omit) -> Bytes {
    let mut obj = super::read::typed(call, obj);
    if omit == Omit::ManagedFields {
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
    }
    Bytes::from(field_order::to_json(&obj))
}

/// The listed objects' JSON: the cache's own bytes, copied straight into
/// the list's writes (the list holds the cache's snapshot, not a share of
/// each object), or encoded anew for another apiVersion.
enum ListedJson {
    Cached(Listed, Omit),
    Encoded(Vec<Bytes>),
}

impl ListedJson {
    fn slices(&self, i: usize) -> [&[u8]; 2] {
        match self {
            ListedJson::Cached(listed, omit) => listed.get(i).map_or([&[], &[]], |o| o.json_slices(*omit)),
            ListedJson::Encoded(items) => [items.get(i).map_or(&[], |b| b), &[]],
        }
    }
}

impl ListItems for ListedJson {
    fn count(&self) -> usize {
        match self {
            ListedJson::Cached(listed, _) => listed.len(),
            ListedJson::Encoded(items) => items.len(),
        }
    }

    fn json_len(&self, i: usize) -> usize {
        self.slices(i).iter().map(|s| s.len()).sum()
    }

    fn write_json(&self, i: usize, out: &mut Vec<u8>) {
        for s in self.slices(i) {
            out.extend_from_slice(s);
        }
    }
}

/// A watch from the cache; Err(call) when the store must serve it (the
/// cache is off, or the revision is from before the cache began).
pub(super) async fn watch(call: Call) -> ApiResult<Result<Response, Call>> {
    let Some(cacher) = call.api.watch_cache.cacher(&call.resource) else { return Ok(Err(call)) };
    let filters = Filters::of(&call)?;
    let p = WatchParams::of(&call);
    let start = match p.start_rev()? {
        Some(rev) => {
            if cacher.wait_not_older_than(rev).await?.is_none() {
                return Ok(Err(call));
            }
            StartAt::Rev(rev)
        }
        None => {
            if p.rv.as_deref().is_none_or(str::is_empty) {
                // Unset: the newest state, as a consistent read.
                cacher.wait_fresh().await?;
            } else {
                cacher.ready().await?;
            }
            StartAt::Now
        }
    };
    let filter = filter_of(&cacher, &filters, p.key.clone(), p.exact);
    let registered = match cacher.watch(start, filter, p.bookmarks) {
        Ok(r) => r,
        Err(NotServed::BeforeCache) => return Ok(Err(call)),
        Err(NotServed::TooOld(t)) => {
            let rev = p.start_rev()?.unwrap_or_default();
            let line = json!({"type": "ERROR", "object": too_old(rev, t).to_status()});
            let mut bytes = crate::apiserver::field_order::to_json(&line).into_bytes();
            bytes.push(b'\n');
            let body = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from(bytes))]);
            return Ok(Ok(streamed(Body::from_stream(body))));
        }
    };
    let render = Render {
        plain: !wants_table(call.accept()) && !wants_metadata(call.accept()),
        metadata_only: wants_metadata(call.accept()),
        as_table: wants_table(call.accept()),
        api_version: call.resource.api_version(),
        kind: call.resource.kind.clone(),
        omit: call.omit,
        call: Arc::new(call),
    };
    let mut first = render.initial(&registered.initial).await?;
    if p.send_initial == Some(true) {
        first.push(render.bookmark(registered.rev, true));
    }
    for (t, ev) in &registered.replay {
        first.push(render.event(*t, ev).await?);
    }
    let body = lines(first, registered.inbox, render, tokio::time::sleep(p.timeout));
    Ok(Ok(streamed(Body::from_stream(body))))
}

fn streamed(body: Body) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache, private")], body)
        .into_response()
}

/// How one watcher's events are written.
struct Render {
    /// Plain JSON: the cache's shared lines are sent as they are for the
    /// objects served as stored (the others are converted, one by one).
    plain: bool,
    /// PartialObjectMetadata: only the metadata is decoded.
    metadata_only: bool,
    as_table: bool,
    api_version: String,
    kind: String,
    omit: Omit,
    call: Arc<Call>,
}

impl Render {
    /// Whether `obj`'s line is the cache's own.
    fn as_cached(&self, obj: &CachedObject) -> bool {
        self.plain && self.call.resource.serves_as_stored(obj.api_version())
    }

    /// The ADDED lines a watch starts with; the objects that need it are
    /// converted together.
    async fn initial(&self, objects: &[Arc<CachedObject>]) -> ApiResult<Vec<Bytes>> {
        if self.metadata_only {
            let line = |o: &Arc<CachedObject>| partial_event_line(EventType::Added, o.metadata_slices(self.omit));
            return Ok(objects.iter().map(line).collect());
        }
        let converted = objects.iter().filter(|o| !self.as_cached(o)).map(|o| o.value()).collect();
        let mut served = self.call.resource.from_storage(converted).await?.into_iter();
        let mut out = Vec::with_capacity(objects.len());
        for obj in objects {
            if self.as_cached(obj) {
                out.push(obj.event_line(EventType::Added, &self.api_version, &self.kind, self.omit));
                continue;
            }
            let value = served.next().ok_or_else(|| ApiError::internal("a conversion returned fewer objects"))?;
            out.push(self.value_line(EventType::Added, value));
        }
        Ok(out)
    }

    async fn event(
        &self,
        as_type: EventType,
        ev: &crate::apiserver::watch_cache::object::CachedEvent,
    ) -> ApiResult<Bytes> {
        if self.as_cached(&ev.object) {
            return Ok(ev.line(as_type, &self.api_version, &self.kind, self.omit));
        }
        if self.metadata_only {
            return Ok(partial_event_line(as_type, ev.object.metadata_slices(self.omit)));
        }
        let mut served = self.call.resource.from_storage(vec![ev.object.value()]).await?;
        let value = served.pop().ok_or_else(|| ApiError::internal("a conversion returned no object"))?;
        Ok(self.value_line(as_type, value))
    }

    fn value_line(&self, as_type: EventType, obj: Value) -> Bytes {
        let v = event(&self.call, as_type.as_str(), obj, self.as_table);
        line_of(&v)
    }

    async fn delivery(&self, d: Delivery) -> ApiResult<Bytes> {
        match d {
            Delivery::Event(t, ev) => self.event(t, &ev).await,
            Delivery::Bookmark(rev) => Ok(self.bookmark(rev, false)),
        }
    }

    fn bookmark(&self, rev: i64, initial_end: bool) -> Bytes {
        line_of(&bookmark(&self.call, rev, initial_end))
    }
}

fn line_of(v: &Value) -> Bytes {
    let mut bytes = field_order::to_json(v).into_bytes();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// The watch's body: what was sent first, then the inbox, until the
/// timeout or until the cache ends the watcher; an event that cannot be
/// put in the served form (a failing conversion webhook) ends it with an
/// ERROR event.
fn lines(
    first: Vec<Bytes>,
    inbox: Inbox,
    render: Render,
    deadline: tokio::time::Sleep,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    struct State {
        first: std::vec::IntoIter<Bytes>,
        inbox: Inbox,
        render: Render,
        deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
        failed: bool,
    }
    let state =
        State { first: coalesce(first).into_iter(), inbox, render, deadline: Box::pin(deadline), failed: false };
    futures_util::stream::unfold(state, |mut st| async move {
        if let Some(b) = st.first.next() {
            return Some((Ok(b), st));
        }
        if st.failed {
            return None;
        }
        let item = tokio::select! {
            _ = &mut st.deadline => None,
            d = st.inbox.recv() => d,
        }?;
        let first = match st.render.delivery(item).await {
            Ok(line) => line,
            Err(e) => {
                st.failed = true;
                return Some((Ok(error_line(e)), st));
            }
        };
        // Events that arrived together leave together: one write (one TLS
        // record, one frame) for a burst instead of one per event.
        let Some(second) = st.inbox.try_recv() else { return Some((Ok(first), st)) };
        let mut out = Vec::with_capacity(first.len() * 2);
        out.extend_from_slice(&first);
        let mut next = Some(second);
        while let Some(d) = next.take() {
            match st.render.delivery(d).await {
                Ok(line) => out.extend_from_slice(&line),
                Err(e) => {
                    out.extend_from_slice(&error_line(e));
                    st.failed = true;
                    break;
                }
            }
            if out.len() < COALESCE_BYTES {
                next = st.inbox.try_recv();
            }
        }
        Some((Ok(Bytes::from(out)), st))
    })
}

/// The ERROR event that ends a watch.
fn error_line(e: ApiError) -> Bytes {
    line_of(&json!({"type": "ERROR", "object": e.to_status()}))
}

/// Lines joined into writes of about `COALESCE_BYTES`.
fn coalesce(lines: Vec<Bytes>) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    for line in lines {
        if !buf.is_empty() && buf.len() + line.len() > COALESCE_BYTES {
            out.push(Bytes::from(std::mem::take(&mut buf)));
        }
        buf.extend_from_slice(&line);
    }
    if !buf.is_empty() {
        out.push(Bytes::from(buf));
    }
    out
}

/// How many bytes of waiting events a watch sends in one write.
const COALESCE_BYTES: usize = 64 << 10;
