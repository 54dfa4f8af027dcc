//! Resources that are computed, never stored (`componentstatuses`): get
//! and list only, answered as JSON, YAML or a Table like any other read.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::read::{object_response, typed, Filters};
use super::Call;
use crate::apiserver::component_status;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::table::wants_table;

pub async fn serve(call: &mut Call, verb: &str) -> ApiResult<Response> {
    let r = call.resource.clone();
    if r.group == "metrics.k8s.io" {
        return super::resource_metrics::serve(call, verb).await;
    }
    call.warn(component_status::DEPRECATION_WARNING.to_string());
    match verb {
        "get" => {
            let name = call.path.name.clone().unwrap_or_default();
            match component_status::get(&call.api, &name).await {
                Some(obj) => Ok(object_response(call, StatusCode::OK, obj)),
                None => {
                    let mut e = ApiError::new(404, "NotFound", format!("{} \"{name}\" not found", r.plural));
                    e.kind = r.plural.clone();
                    e.name = name;
                    Err(e)
                }
            }
        }
        "list" => {
            let items = component_status::list(&call.api).await;
            list_response(call, items)
        }
        _ => Err(ApiError::method_not_allowed(format!("{verb} is not supported on {}", r.plural))),
    }
}

/// Computed objects as a list: filtered by the call's label and field
/// selectors, answered as a List or a Table.
pub(super) fn list_response(call: &Call, items: Vec<serde_json::Value>) -> ApiResult<Response> {
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
