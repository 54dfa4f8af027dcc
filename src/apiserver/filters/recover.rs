//! The last line of defence, as upstream's `WithPanicRecovery`: a panic
//! while serving a request is caught, logged with the request (method,
//! path, user) and answered as a 500 Status; the connection and the server
//! keep serving. A panic is always a bug: the fuzz tests expect none.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::{FutureExt, StreamExt};

use crate::apiserver::auth::User;
use crate::apiserver::status::ApiError;
use crate::sync::LockExt;

/// Who a request runs as, filled in once authentication has decided, so a
/// panic afterwards is logged with the user (a bearer token's user is only
/// known inside the handler).
#[derive(Clone, Default)]
pub struct RequestUser(Arc<Mutex<Option<String>>>);

impl RequestUser {
    pub fn set(&self, name: &str) {
        *self.0.locked() = Some(name.to_string());
    }

    fn get(&self) -> Option<String> {
        self.0.locked().clone()
    }
}

/// What a panic carried, as text.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

/// The answer to a request whose handler panicked.
fn internal_error() -> Response {
    ApiError::new(500, "InternalError", "This request caused apiserver to panic. Look in the logs for details.")
        .into_response()
}

/// Middleware: runs the rest of the stack under `catch_unwind`, and the
/// response body too (a streamed watch), which ends at a panic instead of
/// taking the connection with it.
pub async fn catch_panics(mut req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let slot = RequestUser::default();
    if let Some(u) = req.extensions().get::<User>() {
        if !u.is_anonymous() {
            slot.set(&u.name);
        }
    }
    req.extensions_mut().insert(slot.clone());
    let response = match AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(r) => r,
        Err(payload) => {
            let user = slot.get().unwrap_or_else(|| "system:anonymous".into());
            tracing::error!(%method, %path, %user, panic = %panic_message(payload.as_ref()), "request handler panicked");
            return internal_error();
        }
    };
    // A body already in memory runs no code as it is sent (and keeps its
    // Content-Length); only streamed ones are guarded.
    if axum::body::HttpBody::size_hint(response.body()).exact().is_some() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let stream = AssertUnwindSafe(body.into_data_stream()).catch_unwind().map(move |item| match item {
        Ok(chunk) => chunk,
        Err(payload) => {
            tracing::error!(%method, %path, panic = %panic_message(payload.as_ref()), "response body panicked");
            Err(axum::Error::new(std::io::Error::other("the response stream panicked")))
        }
    });
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::Router;
    use tower::ServiceExt;

    async fn boom() -> Response {
        let s = String::from("ab\u{e9}");
        // Slicing inside a multi-byte character: a panic at run time.
        let cut = s.len() - 1;
        s[..cut].to_string().into_response()
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_500_and_the_router_keeps_serving() {
        let app = Router::new()
            .route("/boom", axum::routing::get(boom))
            .route("/ok", axum::routing::get(|| async { "fine" }))
            .layer(axum::middleware::from_fn(catch_panics));
        let resp = app
            .clone()
            .oneshot(Request::builder().uri("/boom").body(axum::body::Body::empty()).expect("request"))
            .await
            .expect("response");
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("body");
        let status: serde_json::Value = serde_json::from_slice(&body).expect("a Status");
        assert_eq!((status["kind"].as_str(), status["code"].as_i64()), (Some("Status"), Some(500)));
        let ok = app
            .oneshot(Request::builder().uri("/ok").body(axum::body::Body::empty()).expect("request"))
            .await
            .expect("response");
        assert_eq!(ok.status(), StatusCode::OK);
    }
}
