//! watch: from the watch cache (`cached_read`) when it can serve it, else
//! from the store; the choice is made here, once.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::cached_read;
use super::read::{bookmark, event, Filters, WatchParams};
use super::Call;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::storage::{Change, Decoding, Stored};
use crate::apiserver::table::wants_table;

/// A streamed watch: JSON lines of `{"type": ..., "object": ...}`, from
/// the watch cache when it can serve it, else from the store.
pub async fn watch(call: Call) -> ApiResult<Response> {
    match cached_read::watch(call).await? {
        Ok(served) => Ok(served),
        Err(call) => watch_from_store(call).await,
    }
}

/// A watch of the store: from the request's revision, or from the
/// current state, sent first as ADDED events.
async fn watch_from_store(call: Call) -> ApiResult<Response> {
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

/// What a watch from the store sends of one change, in the served form.
enum Picked {
    Bookmark(i64),
    Event(&'static str, Stored),
}

/// What a selecting watch sends of a modified object: ADDED when it
/// enters the selection, DELETED when it leaves it.
async fn modified(call: &Call, filters: &Filters, new: Stored, old: Option<Stored>) -> ApiResult<Option<Picked>> {
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
