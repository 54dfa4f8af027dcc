//! Impersonation (upstream's `WithImpersonation` filter): with
//! `Impersonate-User` and `Impersonate-Group` (kubectl --as, --as-group) a
//! request acts as those, when its user may `impersonate` each of them.
//! The audit log names both the user and the one it acts as.

use axum::http::request::Parts;
use axum::http::HeaderMap;

use crate::apiserver::audit::AuditSlot;
use crate::apiserver::auth::{rbac::Attributes, DecisionRecord, User};
use crate::apiserver::status::ApiError;
use crate::apiserver::Api;

/// The user a request acts as: the impersonated one when it asks to and
/// may, else its own.
pub fn acting_user(api: &Api, user: User, parts: &Parts) -> Result<User, ApiError> {
    let audit_slot = parts.extensions.get::<AuditSlot>();
    match impersonate(api, &user, &parts.headers, parts.extensions.get::<DecisionRecord>()) {
        Ok(Some(as_user)) => {
            if let Some(slot) = audit_slot {
                slot.set_user(&user, Some(&as_user));
            }
            Ok(as_user)
        }
        Ok(None) => {
            if let Some(slot) = audit_slot {
                slot.set_user(&user, None);
            }
            Ok(user)
        }
        Err(e) => {
            if let Some(slot) = audit_slot {
                slot.set_user(&user, None);
            }
            Err(e)
        }
    }
}

/// `Impersonate-User` and `Impersonate-Group`: allowed when the caller may
/// `impersonate` those users and groups.
fn impersonate(
    api: &Api,
    user: &User,
    headers: &HeaderMap,
    record: Option<&DecisionRecord>,
) -> Result<Option<User>, ApiError> {
    let Some(name) = headers.get("Impersonate-User").and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let groups: Vec<String> =
        headers.get_all("Impersonate-Group").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect();
    let check = |resource: &str, target: &str| {
        let attrs = Attributes {
            verb: "impersonate".into(),
            resource: resource.into(),
            name: target.into(),
            ..Default::default()
        };
        if api.allowed_recorded(user, &attrs, record) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!("{resource} \"{target}\" is forbidden: User \"{}\" cannot impersonate resource \"{resource}\" in API group \"\" at the cluster scope", user.name)))
        }
    };
    let (resource, target) = match name.strip_prefix("system:serviceaccount:") {
        Some(_) => ("serviceaccounts", name),
        None => ("users", name),
    };
    check(resource, target)?;
    for g in &groups {
        check("groups", g)?;
    }
    let mut all = groups;
    if let Some(rest) = name.strip_prefix("system:serviceaccount:") {
        let ns = rest.split(':').next().unwrap_or_default();
        all.push("system:serviceaccounts".into());
        all.push(format!("system:serviceaccounts:{ns}"));
    }
    all.push("system:authenticated".into());
    Ok(Some(User { name: name.to_string(), groups: all }))
}
