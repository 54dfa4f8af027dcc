//! The ResourceQuota admission plugin, as upstream's
//! `plugin/pkg/admission/resourcequota`: a create in a namespace with
//! quotas (or an update of a service or claim, for what it adds) is checked against each quota that matches it (by the resources
//! of `status.hard` and the quota's scopes), refused with upstream's 403
//! when it would exceed one, and otherwise charged to the quota's
//! `status.used` by a compare-and-swap write at the quota's revision. A
//! conflicting write re-reads the quota and checks again, so concurrent
//! creates can never overshoot; the ResourceQuotaController's recount
//! releases what deletes free. Creates in one namespace are checked one at
//! a time on this server (upstream batches them per namespace), so the
//! compare-and-swap only meets writers from elsewhere: the controller and
//! other servers.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use tokio::sync::OwnedMutexGuard;

use super::Operation;
use crate::apiserver::handlers::Call;
use crate::apiserver::meta::name_of;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::storage::{Stored, WriteError};
use crate::quota::evaluator::Evaluator;
use crate::quota::{
    add, exceeded, mask, parse_list, pretty_print, remove_zeros, subtract_non_negative, to_json, ResourceList,
};

/// How often a charge is retried after losing a compare-and-swap.
const RETRIES: usize = 8;

/// One lock per namespace: this server checks and charges a namespace's
/// quotas for one create at a time.
#[derive(Default)]
pub struct QuotaLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl QuotaLocks {
    async fn lock(&self, namespace: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            // Forget the locks nobody holds or waits for.
            map.retain(|_, l| Arc::strong_count(l) > 1);
            map.entry(namespace.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

/// A quota to charge: its key, the revision it was read at, its new body.
struct Charge {
    name: String,
    key: String,
    rev: i64,
    object: Value,
}

/// Checks and charges a create, or an update of a kind whose usage an
/// update can grow (`old` is then the object it replaces).
pub async fn admit(call: &Call, obj: &Value, old: Option<&Value>, op: Operation) -> ApiResult<()> {
    if !call.resource.namespaced || call.path.subresource.is_some() {
        return Ok(());
    }
    let evaluator = Evaluator::for_resource(&call.resource.group, &call.resource.plural);
    let previous = match op {
        Operation::Create => None,
        Operation::Update if evaluator.handles_update() => old,
        _ => return Ok(()),
    };
    let Some(ns) = call.namespace() else { return Ok(()) };
    if call.api.caches.resource_quotas.in_namespace(ns).is_empty() {
        return Ok(());
    }
    let _held = call.api.quota_locks.lock(ns).await;
    let prefix = format!("/registry/resourcequotas/{ns}/");
    // Quotas already charged by an earlier round of this create.
    let mut charged: HashSet<String> = HashSet::new();
    for attempt in 0..RETRIES {
        let (quotas, _) = call.api.storage.list_all(&prefix).await?;
        let charges = check(call, &evaluator, obj, previous, &quotas, &charged)?;
        if charges.is_empty() || call.dry_run() {
            return Ok(());
        }
        let mut lost = false;
        for c in charges {
            match call.api.storage.update(&c.key, &c.object, c.rev).await {
                Ok(_) => {
                    charged.insert(c.name);
                }
                Err(WriteError::Changed(_)) => {
                    tracing::debug!(quota = %c.key, attempt, "quota changed while charging it; checking again");
                    lost = true;
                }
                Err(WriteError::Exists) => return Err(ApiError::internal("unexpected create conflict on a quota")),
                Err(WriteError::Api(e)) => return Err(e),
            }
        }
        if !lost {
            return Ok(());
        }
    }
    Err(ApiError::internal("resource quota evaluation timed out"))
}

/// Checks the create against every matching quota not yet charged, and
/// returns the quotas to charge; a refusal is upstream's 403.
fn check(
    call: &Call,
    evaluator: &Evaluator,
    obj: &Value,
    previous: Option<&Value>,
    quotas: &[Stored],
    charged: &HashSet<String>,
) -> ApiResult<Vec<Charge>> {
    let r = &call.resource;
    let forbidden = |why: String| ApiError::forbidden_object(&r.group, &r.plural, name_of(obj), &why);
    let mut interesting: Vec<(&Stored, String, ResourceList, ResourceList)> = Vec::new();
    for stored in quotas {
        let Ok(quota) = serde_json::from_value::<ResourceQuota>(stored.object.clone()) else { continue };
        let name = quota.metadata.name.clone().unwrap_or_default();
        if charged.contains(&name) {
            continue;
        }
        let hard = parse_list(stored.object.pointer("/status/hard"));
        let restricted = evaluator.matching_resources(hard.keys());
        if restricted.is_empty() || !evaluator.matches_scopes(&quota, obj) {
            continue;
        }
        evaluator.constraints(&restricted, obj).map_err(|e| forbidden(format!("failed quota: {name}: {e}")))?;
        let used = parse_list(stored.object.pointer("/status/used"));
        if restricted.iter().any(|res| !used.contains_key(res)) {
            return Err(forbidden(format!("status unknown for quota: {name}, resources: {}", restricted.join(","))));
        }
        interesting.push((stored, name, hard, used));
    }
    if interesting.is_empty() {
        return Ok(Vec::new());
    }
    let now = Timestamp::now();
    let mut delta = evaluator.usage(obj, now);
    if let Some(prev) = previous {
        delta = subtract_non_negative(&delta, &evaluator.usage(prev, now));
    }
    let delta = remove_zeros(delta);
    if delta.is_empty() {
        return Ok(Vec::new());
    }
    let mut charges = Vec::new();
    for (stored, name, hard, used) in interesting {
        let requested = mask(&delta, hard.keys());
        let new_used = add(&used, &requested);
        let over = exceeded(&mask(&new_used, requested.keys()), &hard);
        if !over.is_empty() {
            return Err(forbidden(format!(
                "exceeded quota: {name}, requested: {}, used: {}, limited: {}",
                pretty_print(&mask(&requested, &over)),
                pretty_print(&mask(&used, &over)),
                pretty_print(&mask(&hard, &over)),
            )));
        }
        if new_used == used {
            continue;
        }
        let mut object = stored.object.clone();
        if let Some(status) = object.get_mut("status").and_then(Value::as_object_mut) {
            status.insert("used".into(), to_json(&new_used));
        }
        let ns = crate::apiserver::meta::namespace_of(&stored.object).unwrap_or_default();
        let key = format!("/registry/resourcequotas/{ns}/{name}");
        charges.push(Charge { name, key, rev: stored.rev, object });
    }
    Ok(charges)
}
