//! The in-process transport: a `kube::Client` whose transport is this API
//! server's own router as a `tower::Service` (no TCP, no TLS), so the
//! components that run in the server's process (controllers, scheduler,
//! the server's own node role) go through the same authentication,
//! authorization, admission and validation as kubectl does. The user each
//! acts as is set on the request, as a client certificate would name it
//! (the identities are `User`'s constructors).

use std::sync::Arc;

use super::auth::User;
use super::call::OmitManagedFields;
use super::{router, Api};

/// A client that acts as `user` against this API server, in process.
pub fn client(api: Arc<Api>, user: User) -> kube::Client {
    let service = router(api).layer(axum::Extension(user)).into_service::<kube::client::Body>();
    kube::Client::new(service, "default")
}

/// `client` for the shared informers, whose caches drop managedFields
/// (`client::transform`): the API server leaves them out of what it lists
/// and watches for this client, instead of sending what is decoded only to
/// be dropped.
pub fn client_for_informers(api: Arc<Api>, user: User) -> kube::Client {
    let service = router(api)
        .layer(axum::Extension(user))
        .layer(axum::Extension(OmitManagedFields))
        .into_service::<kube::client::Body>();
    kube::Client::new(service, "default")
}
