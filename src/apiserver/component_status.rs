//! `componentstatuses` (v1, deprecated upstream since 1.19 but still what
//! `kubectl get cs` reads): `scheduler`, `controller-manager` and `etcd-0`,
//! computed on every read, never stored. Upstream probes each component's
//! health endpoint; here the components live in this process, so each is
//! judged from the state that shows it working: the store answers a read
//! (`etcd-0`), and the leader Lease of the scheduler and of the controller
//! manager is held and not expired.

use serde_json::{json, Value};

use super::health::CheckFailed;
use super::meta::{parse_rfc3339, unix_now};
use super::status::ApiError;
use super::Api;

/// The warning upstream sends with every read of the resource.
pub const DEPRECATION_WARNING: &str = "v1 ComponentStatus is deprecated in v1.19+";

/// The components, in upstream's order, and the leader Lease that shows
/// each control loop running (none for the store).
const COMPONENTS: &[(&str, Option<&str>)] =
    &[("scheduler", Some("kube-scheduler")), ("controller-manager", Some("kube-controller-manager")), ("etcd-0", None)];

/// Why a component counts as unhealthy.
#[derive(Debug, thiserror::Error)]
pub enum Unhealthy {
    #[error(transparent)]
    Store(#[from] CheckFailed),
    #[error("{0}")]
    Read(#[source] ApiError),
    #[error("leader lease {0} is not held")]
    LeaseNotHeld(String),
}

/// Whether a Lease object names a holder whose renewal has not yet expired
/// at `now` (seconds since the epoch).
pub fn lease_held(lease: &Value, now: i64) -> bool {
    let spec = &lease["spec"];
    let holder = spec["holderIdentity"].as_str().unwrap_or_default();
    let renewed = spec["renewTime"].as_str().and_then(parse_rfc3339);
    let duration = spec["leaseDurationSeconds"].as_i64().unwrap_or(0);
    !holder.is_empty() && renewed.is_some_and(|at| at + duration >= now)
}

async fn probe(api: &Api, lease: Option<&str>) -> Result<(), Unhealthy> {
    let Some(name) = lease else {
        return api.health.store_answers().await.map_err(Unhealthy::Store);
    };
    let key = format!("/registry/coordination.k8s.io/leases/kube-system/{name}");
    match api.storage.get(&key).await {
        Ok(Some(stored)) if lease_held(&stored.object, unix_now()) => Ok(()),
        Ok(_) => Err(Unhealthy::LeaseNotHeld(name.to_string())),
        Err(e) => Err(Unhealthy::Read(e)),
    }
}

/// A ComponentStatus object as upstream writes it.
pub fn object(name: &str, health: &Result<(), Unhealthy>) -> Value {
    let condition = match health {
        Ok(()) => json!({"type": "Healthy", "status": "True", "message": "ok"}),
        Err(e) => json!({"type": "Healthy", "status": "False", "error": e.to_string()}),
    };
    json!({"metadata": {"name": name}, "conditions": [condition]})
}

/// Every component's status, probed now.
pub async fn list(api: &Api) -> Vec<Value> {
    let mut out = Vec::with_capacity(COMPONENTS.len());
    for (name, lease) in COMPONENTS {
        let health = probe(api, *lease).await;
        if let Err(e) = &health {
            tracing::debug!(component = name, error = %e, "component unhealthy");
        }
        out.push(object(name, &health));
    }
    out
}

/// One component's status, or None when there is no such component.
pub async fn get(api: &Api, name: &str) -> Option<Value> {
    let (name, lease) = COMPONENTS.iter().find(|(n, _)| *n == name)?;
    Some(object(name, &probe(api, *lease).await))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_held_until_its_renewal_expires() {
        let lease = json!({"spec": {"holderIdentity": "n1", "renewTime": "2026-01-01T00:00:00.000000Z", "leaseDurationSeconds": 15}});
        let renewed = parse_rfc3339("2026-01-01T00:00:00Z").unwrap_or_default();
        assert!(lease_held(&lease, renewed + 10));
        assert!(!lease_held(&lease, renewed + 16));
        assert!(!lease_held(
            &json!({"spec": {"renewTime": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 15}}),
            renewed
        ));
        assert!(!lease_held(&json!({}), renewed));
    }

    #[test]
    fn objects_carry_one_healthy_condition() {
        let ok = object("etcd-0", &Ok(()));
        assert_eq!(ok["conditions"][0], json!({"type": "Healthy", "status": "True", "message": "ok"}));
        let bad = object("scheduler", &Err(Unhealthy::LeaseNotHeld("kube-scheduler".into())));
        assert_eq!(bad["conditions"][0]["status"], "False");
        assert_eq!(bad["conditions"][0]["error"], "leader lease kube-scheduler is not held");
    }
}
