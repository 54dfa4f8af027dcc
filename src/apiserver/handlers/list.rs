//! list: from the watch cache (`cached_read`) when it can answer, else
//! from the store; the choice is made here, once. And the list of objects
//! that are computed, never stored.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::cached_read;
use super::read::{list_response, typed, Filters};
use super::Call;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::storage::{decode_continue, encode_continue, ReadAt};
use crate::apiserver::table::wants_table;

/// A list, from the watch cache when it can answer it, else from the store.
pub async fn list(call: &Call) -> ApiResult<Response> {
    let filters = Filters::of(call)?;
    let limit = call.param("limit").and_then(|l| l.parse::<i64>().ok()).filter(|l| *l > 0);
    match cached_read::list(call, &filters, limit).await? {
        Some(resp) => Ok(resp),
        None => list_from_store(call, &filters, limit).await,
    }
}

/// A list read from the store in pages, at the revision the request
/// asks for (Exact, or a continue token's) or the newest.
async fn list_from_store(call: &Call, filters: &Filters, limit: Option<i64>) -> ApiResult<Response> {
    let r = &call.resource;
    let prefix = r.list_prefix(call.namespace());
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

/// Computed objects as a list: filtered by the call's label and field
/// selectors, answered as a List or a Table.
pub(super) fn computed_list(call: &Call, items: Vec<Value>) -> ApiResult<Response> {
    let r = &call.resource;
    let filters = Filters::of(call)?;
    let objs: Vec<_> = items.into_iter().filter(|o| filters.matches(o)).map(|o| typed(call, o)).collect();
    let meta = json!({"resourceVersion": ""});
    if wants_table(call.accept()) {
        let t = r.table(&objs, meta, call.param("includeObject").unwrap_or("Metadata"));
        return Ok(call.respond(StatusCode::OK, &t));
    }
    let list = json!({"kind": r.list_kind, "apiVersion": r.api_version(), "metadata": meta, "items": objs});
    Ok(call.respond(StatusCode::OK, &list))
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
