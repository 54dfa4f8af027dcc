//! The default RBAC policy, made and kept at every start as upstream's API
//! server does in its `rbac/bootstrap-roles` post-start hook: every
//! ClusterRole, ClusterRoleBinding, Role and RoleBinding of upstream
//! v1.33's bootstrap policy (`cluster_roles.rs`, `controller_roles.rs`,
//! `namespace_roles.rs`) plus ferrok's own few, reconciled as
//! `reconcile.rs` says. The aggregated roles (admin, edit, view) are
//! written without rules; the clusterrole-aggregation controller fills
//! them. The controllers' service accounts in kube-system are created here
//! too when missing (a deleted one comes back at the next start; the
//! controllers act in process regardless).

use serde_json::{json, Value};

use super::reconcile::{reconcile_binding, reconcile_role, BindingChange};
use crate::apiserver::meta;
use crate::apiserver::status::ApiResult;
use crate::apiserver::storage::{Storage, WriteError};

/// A write lost to a concurrent one (another server starting) is tried
/// again from a fresh read, a few times.
const ATTEMPTS: usize = 3;

fn key_of(resource: &str, object: &Value) -> String {
    let name = meta::name_of(object);
    match object.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!("/registry/rbac.authorization.k8s.io/{resource}/{ns}/{name}"),
        None => format!("/registry/rbac.authorization.k8s.io/{resource}/{name}"),
    }
}

/// Whether a write lost a race, so the object is read again.
fn lost_race(result: Result<i64, WriteError>) -> ApiResult<bool> {
    match result {
        Ok(_) => Ok(false),
        Err(WriteError::Exists) | Err(WriteError::Changed(_)) => Ok(true),
        Err(WriteError::Api(e)) => Err(e),
    }
}

async fn ensure_role(storage: &Storage, resource: &str, expected: &Value) -> ApiResult<()> {
    let key = key_of(resource, expected);
    for _ in 0..ATTEMPTS {
        let written = match storage.get(&key).await? {
            None => storage.create(&key, expected).await,
            Some(current) => match reconcile_role(&current.object, expected) {
                None => return Ok(()),
                Some(updated) => storage.update(&key, &updated, current.rev).await,
            },
        };
        if !lost_race(written)? {
            return Ok(());
        }
    }
    tracing::warn!(key, "default RBAC role not reconciled: it kept changing");
    Ok(())
}

async fn ensure_binding(storage: &Storage, resource: &str, expected: &Value) -> ApiResult<()> {
    let key = key_of(resource, expected);
    for _ in 0..ATTEMPTS {
        let written = match storage.get(&key).await? {
            None => storage.create(&key, expected).await,
            Some(current) => match reconcile_binding(&current.object, expected) {
                BindingChange::None => return Ok(()),
                BindingChange::Update(updated) => storage.update(&key, &updated, current.rev).await,
                BindingChange::Recreate(replacement) => {
                    tracing::info!(key, "recreating a default binding whose roleRef changed");
                    match storage.delete(&key, current.rev).await {
                        Ok(_) => storage.create(&key, &replacement).await,
                        Err(e) => Err(e),
                    }
                }
            },
        };
        if !lost_race(written)? {
            return Ok(());
        }
    }
    tracing::warn!(key, "default RBAC binding not reconciled: it kept changing");
    Ok(())
}

/// Upstream's `primeAggregatedClusterRoles`: a role that became aggregated
/// (admin, edit, view of a cluster made before) hands its rules, with any
/// the user added, to the `system:aggregate-to-*` role it now aggregates,
/// when that role does not exist yet.
async fn prime_aggregated_cluster_roles(storage: &Storage) -> ApiResult<()> {
    let key = |name: &str| format!("/registry/rbac.authorization.k8s.io/clusterroles/{name}");
    for (old, new) in [
        ("admin", "system:aggregate-to-admin"),
        ("edit", "system:aggregate-to-edit"),
        ("view", "system:aggregate-to-view"),
    ] {
        if storage.get(&key(new)).await?.is_some() {
            continue;
        }
        let Some(existing) = storage.get(&key(old)).await? else { continue };
        if existing.object.get("aggregationRule").is_some_and(|r| !r.is_null()) {
            // Already aggregated: no rules of its own to hand over.
            return Ok(());
        }
        let mut copy = existing.object;
        copy["metadata"] = json!({
            "name": new,
            "uid": meta::new_uid(),
            "creationTimestamp": meta::now_rfc3339(),
            "labels": copy["metadata"]["labels"].clone(),
            "annotations": copy["metadata"]["annotations"].clone(),
        });
        tracing::info!(from = old, to = new, "moving the rules of a role that is now aggregated");
        lost_race(storage.create(&key(new), &copy).await)?;
    }
    Ok(())
}

pub async fn run(storage: &Storage) -> ApiResult<()> {
    prime_aggregated_cluster_roles(storage).await?;
    for role in super::cluster_roles::cluster_roles() {
        ensure_role(storage, "clusterroles", &role).await?;
    }
    for binding in super::cluster_roles::cluster_role_bindings() {
        ensure_binding(storage, "clusterrolebindings", &binding).await?;
    }
    for role in super::namespace_roles::roles() {
        ensure_role(storage, "roles", &role).await?;
    }
    for binding in super::namespace_roles::role_bindings() {
        ensure_binding(storage, "rolebindings", &binding).await?;
    }
    // The service accounts the controllers act as, in kube-system (made by
    // the API server's bootstrap before this runs).
    for name in super::controller_roles::CONTROLLERS {
        let key = format!("/registry/serviceaccounts/kube-system/{name}");
        lost_race(storage.create(&key, &super::controller_roles::service_account_object(name)).await)?;
    }
    Ok(())
}
