//! The one generic path every resource request takes: parse the path, find
//! the resource in the registry, check the verb, and hand over to the read,
//! write or patch handler. Bodies come in as JSON or YAML; answers go out as
//! JSON, YAML or a Table.

mod admit;
mod assign_pod;
mod binding;
mod cached_read;
mod computed;
mod connect;
mod connect_options;
mod delete;
mod eviction;
mod list;
mod list_body;
mod options;
mod patch;
mod proxy;
mod proxy_rewrite;
mod read;
mod resource_metrics;
mod reviews;
mod watch;
mod write;

pub use patch::apply_json_patch;

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::request::Parts;
use axum::http::Method;
use axum::response::{IntoResponse, Response};

use super::auth::{DecisionRecord, User};
use super::call::{decode_body, Call, OmitManagedFields};
use super::request::{parse_query, ResourcePath};
use super::status::{ApiError, ApiResult};
use super::watch_cache::object::Omit;
use super::Api;

/// Serves one resource request.
pub async fn serve(api: Arc<Api>, user: User, path: ResourcePath, mut parts: Parts, body: Bytes) -> Response {
    let Some(resource) = api.registry.get(&path.group, &path.version, &path.plural) else {
        return ApiError::new(404, "NotFound", "the server could not find the requested resource").into_response();
    };
    let call = Call {
        api,
        user,
        resource,
        path,
        query: parse_query(parts.uri.query()),
        decision: parts.extensions.get::<DecisionRecord>().cloned(),
        raw_query: parts.uri.query().map(str::to_string),
        upgrade: parts.extensions.remove::<hyper::upgrade::OnUpgrade>(),
        headers: parts.headers,
        warnings: Vec::new(),
        omit: if parts.extensions.get::<OmitManagedFields>().is_some() { Omit::ManagedFields } else { Omit::Nothing },
    };
    match dispatch(call, parts.method, body).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn dispatch(mut call: Call, method: Method, body: Bytes) -> ApiResult<Response> {
    let r = call.resource.clone();
    if call.path.namespace.is_some() && !r.namespaced {
        return Err(ApiError::new(404, "NotFound", "the server could not find the requested resource"));
    }
    let watching = call.path.watch_prefix || call.flag("watch");
    let sub = call.path.subresource.clone();
    if let Some(sub) = &sub {
        let known = (sub == "status" && r.status)
            || (sub == "scale" && r.scale.is_some())
            || r.subresources.iter().any(|s| s == sub);
        if !known {
            return Err(ApiError::new(404, "NotFound", "the server could not find the requested resource"));
        }
    }
    let Some(verb) = super::request::verb(&method, call.path.name.is_some(), watching) else {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    };
    // Only the verbs discovery lists (a namespace has no deletecollection,
    // a status no create): upstream routes no others.
    if !super::discovery::serves_verb(&r, sub.as_deref(), verb) {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    }
    call.api.authorize(&call, verb).await?;
    options::check(&call, verb)?;
    if r.computed {
        return computed::serve(&mut call, verb).await;
    }
    if r.ephemeral {
        // Nothing of these converts to a Table (upstream's storage has no
        // TableConvertor): a client that will take only a Table gets 406.
        if crate::apiserver::table::only_table_accepted(call.accept()) {
            return Err(ApiError::new(
                406,
                "NotAcceptable",
                "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf",
            ));
        }
        return match verb {
            // The legacy `bindings` collection: pods/binding of the pod the body names.
            "create" if r.group.is_empty() && r.plural == "bindings" => binding::bind_named(&mut call, body).await,
            "create" => reviews::create(&mut call, body).await,
            _ => Err(ApiError::method_not_allowed(format!("{verb} is not supported on {}", r.plural))),
        };
    }
    match (verb, sub.as_deref()) {
        // Subresources that read as the whole object, as upstream serves them.
        ("get", None | Some("status") | Some("approval") | Some("ephemeralcontainers") | Some("resize")) => {
            read::get(&call).await
        }
        ("get", Some("scale")) => read::get_scale(&call).await,
        ("get", Some("log")) => connect::pod_log(&mut call).await,
        ("get" | "create", Some("exec" | "attach" | "portforward")) => connect::pod_stream(&mut call, &method).await,
        (_, Some("proxy")) if r.plural == "nodes" => connect::node_proxy(&mut call, &method, body).await,
        (_, Some("proxy")) if r.plural == "pods" => proxy::pod_proxy(&mut call, &method, body).await,
        (_, Some("proxy")) if r.plural == "services" => proxy::service_proxy(&mut call, &method, body).await,
        ("list", None) => list::list(&call).await,
        ("watch", None) => watch::watch(call).await,
        ("create", None) => write::create(&mut call, body).await,
        ("create", Some("binding")) => binding::bind(&mut call, body).await,
        ("create", Some("token")) => reviews::token_request(&mut call, body).await,
        (
            "update",
            None | Some("status") | Some("approval") | Some("finalize") | Some("ephemeralcontainers") | Some("resize"),
        ) => write::update(&mut call, body).await,
        ("create", Some("eviction")) => eviction::evict(&mut call, body).await,
        ("update", Some("scale")) => write::update_scale(&mut call, body).await,
        ("patch", None | Some("status") | Some("approval") | Some("ephemeralcontainers") | Some("resize")) => {
            patch::patch(&mut call, body).await
        }
        ("patch", Some("scale")) => patch::patch_scale(&mut call, body).await,
        ("delete", None) => delete::delete(&mut call, body).await,
        ("deletecollection", None) => delete::delete_collection(&mut call, body).await,
        _ => Err(ApiError::method_not_allowed(format!(
            "{verb} is not supported on {}{}",
            r.plural,
            sub.map(|s| format!("/{s}")).unwrap_or_default()
        ))),
    }
}
