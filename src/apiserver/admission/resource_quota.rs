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
use crate::apiserver::call::Call;
use crate::apiserver::meta::name_of;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::storage::{Stored, WriteError};
use crate::quota::evaluator::Evaluator;
use crate::quota::{
    add, exceeded, mask, parse_list, pretty_print, remove_zeros, subtract_non_negative, to_json, ResourceList,
};
use crate::sync::LockExt;

/// How often a charge is retried after losing a compare-and-swap.
const RETRIES: usize = 8;

/// One lock per namespace: this server checks and charges a namespace's
/// quotas for one create at a time.
#[derive(Default)]
pub struct QuotaLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl QuotaLocks {
    async fn lock(&self, namespace: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.0.locked();
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
    if !call.api.caches.resource_quotas.any_in_namespace(ns) {
        return Ok(());
    }
    let r = &call.resource;
    let write = Write { group: &r.group, plural: &r.plural, evaluator, obj, previous };
    let _held = call.api.quota_locks.lock(ns).await;
    let prefix = format!("/registry/resourcequotas/{ns}/");
    // Quotas already charged by an earlier round of this create.
    let mut charged: HashSet<String> = HashSet::new();
    for attempt in 0..RETRIES {
        let (quotas, _) = call.api.storage.list_all(&prefix).await?;
        let charges = check(&write, &quotas, &charged)?;
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

/// The write being admitted.
struct Write<'a> {
    group: &'a str,
    plural: &'a str,
    evaluator: Evaluator,
    obj: &'a Value,
    /// The object an update replaces.
    previous: Option<&'a Value>,
}

/// Checks the create against every matching quota not yet charged, and
/// returns the quotas to charge; a refusal is upstream's 403.
fn check(write: &Write, quotas: &[Stored], charged: &HashSet<String>) -> ApiResult<Vec<Charge>> {
    let Write { group, plural, evaluator, obj, previous } = write;
    let (obj, previous) = (*obj, *previous);
    let forbidden = |why: String| ApiError::forbidden_object(group, plural, name_of(obj), &why);
    let mut interesting: Vec<(&Stored, String, ResourceList, ResourceList)> = Vec::new();
    for stored in quotas {
        let Ok(quota) = crate::decode::from_value::<ResourceQuota>(&stored.object) else { continue };
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(name: &str, spec: Value, status: Value) -> Stored {
        Stored {
            object: json!({"metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": status}),
            rev: 7,
        }
    }

    fn pod(name: &str, cpu: Option<&str>) -> Value {
        let resources = cpu.map_or(json!({}), |c| json!({"requests": {"cpu": c}}));
        json!({"metadata": {"name": name, "namespace": "ns"},
               "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}]}})
    }

    fn run(obj: &Value, quotas: &[Stored]) -> ApiResult<Vec<Charge>> {
        let write =
            Write { group: "", plural: "pods", evaluator: Evaluator::for_resource("", "pods"), obj, previous: None };
        check(&write, quotas, &HashSet::new())
    }

    #[test]
    fn charges_refuses_and_waits_for_usage_as_upstream() {
        let q = quota("q", json!({"hard": {"pods": "2"}}), json!({"hard": {"pods": "2"}, "used": {"pods": "1"}}));
        let charges = run(&pod("a", None), &[q]).unwrap_or_default();
        assert_eq!(charges.len(), 1);
        assert_eq!((charges[0].key.as_str(), charges[0].rev), ("/registry/resourcequotas/ns/q", 7));
        assert_eq!(charges[0].object.pointer("/status/used"), Some(&json!({"pods": "2"})));

        let full = quota("q", json!({"hard": {"pods": "2"}}), json!({"hard": {"pods": "2"}, "used": {"pods": "2"}}));
        let err = run(&pod("a", None), &[full]).err().map(|e| (e.code, e.message));
        assert_eq!(
            err,
            Some((
                403,
                "pods \"a\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2".into()
            ))
        );

        // Hard limits the controller has not counted yet: status unknown.
        let unknown = quota("q", json!({"hard": {"pods": "2"}}), json!({"hard": {"pods": "2"}}));
        let err = run(&pod("a", None), &[unknown]).err().map(|e| e.message);
        assert_eq!(err.as_deref(), Some("pods \"a\" is forbidden: status unknown for quota: q, resources: pods"));

        // A quota the controller has not seen at all does not constrain yet.
        let fresh = quota("q", json!({"hard": {"pods": "0"}}), json!({}));
        assert!(run(&pod("a", None), &[fresh]).is_ok_and(|c| c.is_empty()));

        // Quotas on requests oblige every container to state them.
        let cpu = quota(
            "cpu",
            json!({"hard": {"requests.cpu": "1"}}),
            json!({"hard": {"requests.cpu": "1"}, "used": {"requests.cpu": "900m"}}),
        );
        let err = run(&pod("a", None), std::slice::from_ref(&cpu)).err().map(|e| e.message);
        assert_eq!(
            err.as_deref(),
            Some("pods \"a\" is forbidden: failed quota: cpu: must specify requests.cpu for: c")
        );
        let charges = run(&pod("a", Some("0.1")), std::slice::from_ref(&cpu)).unwrap_or_default();
        assert_eq!(charges[0].object.pointer("/status/used/requests.cpu"), Some(&json!("1")));
        assert!(run(&pod("a", Some("101m")), &[cpu]).is_err());
    }

    #[test]
    fn scoped_quotas_select_their_pods() {
        let best_effort = quota(
            "be",
            json!({"hard": {"pods": "1"}, "scopes": ["BestEffort"]}),
            json!({"hard": {"pods": "1"}, "used": {"pods": "1"}}),
        );
        // A pod with requests is not BestEffort: the full quota does not apply.
        assert!(run(&pod("a", Some("1")), std::slice::from_ref(&best_effort)).is_ok_and(|c| c.is_empty()));
        assert!(run(&pod("a", None), &[best_effort]).is_err());
    }
}
