//! Resources that are computed, never stored (`componentstatuses`): get
//! and list only, answered as JSON, YAML or a Table like any other read.

use axum::http::StatusCode;
use axum::response::Response;

use super::list::computed_list;
use super::read::object_response;
use super::Call;
use crate::apiserver::component_status;
use crate::apiserver::status::{ApiError, ApiResult};

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
            computed_list(call, items)
        }
        _ => Err(ApiError::method_not_allowed(format!("{verb} is not supported on {}", r.plural))),
    }
}
