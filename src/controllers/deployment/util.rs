//! Deployment arithmetic in upstream's deployment/util vocabulary: the
//! pod-template-hash, maxSurge / maxUnavailable fenceposts, replica counts
//! over sets of ReplicaSets, and the orders ReplicaSets are sorted in.

use std::cmp::Ordering;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
const ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Annotations a Deployment never copies onto its ReplicaSets.
pub fn skip_copy_annotation(key: &str) -> bool {
    matches!(key, LAST_APPLIED | REVISION | REVISION_HISTORY | DESIRED_REPLICAS | MAX_REPLICAS | ROLLBACK_TO)
}

pub fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

pub fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

pub fn is_rolling(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.strategy.as_ref()).and_then(|s| s.type_.as_deref()) != Some("Recreate")
}

pub fn is_paused(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false)
}

/// progressDeadlineSeconds, unless unset or "infinite" (MaxInt32).
pub fn progress_deadline(d: &Deployment) -> Option<i32> {
    d.spec.as_ref().and_then(|s| s.progress_deadline_seconds).filter(|s| *s != i32::MAX)
}

/// An IntOrString that is neither an int nor a percentage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for IntOrString: invalid value {0:?}")]
pub struct InvalidIntOrString(pub String);

/// An int or a percentage of `total`, rounded up or down.
pub fn scaled_value(v: &IntOrString, total: i32, round_up: bool) -> Result<i32, InvalidIntOrString> {
    match v {
        IntOrString::Int(i) => Ok(*i),
        IntOrString::String(s) => {
            let percent: i64 =
                s.strip_suffix('%').and_then(|p| p.parse().ok()).ok_or_else(|| InvalidIntOrString(s.clone()))?;
            let scaled = percent * i64::from(total);
            let value = if round_up { (scaled + 99).div_euclid(100) } else { scaled.div_euclid(100) };
            Ok(value as i32)
        }
    }
}

/// (maxSurge, maxUnavailable) for `desired` replicas; both zero becomes an
/// unavailability of one so that a rollout can proceed.
pub fn resolve_fenceposts(surge: Option<&IntOrString>, unavailable: Option<&IntOrString>, desired: i32) -> (i32, i32) {
    let quarter = IntOrString::String("25%".into());
    let surge = scaled_value(surge.unwrap_or(&quarter), desired, true).unwrap_or(0);
    let mut unavailable = scaled_value(unavailable.unwrap_or(&quarter), desired, false).unwrap_or(0);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (surge, unavailable)
}

fn fenceposts(d: &Deployment) -> (i32, i32) {
    let ru = d.spec.as_ref().and_then(|s| s.strategy.as_ref()).and_then(|s| s.rolling_update.as_ref());
    resolve_fenceposts(ru.and_then(|r| r.max_surge.as_ref()), ru.and_then(|r| r.max_unavailable.as_ref()), replicas(d))
}

pub fn max_surge(d: &Deployment) -> i32 {
    if !is_rolling(d) {
        return 0;
    }
    fenceposts(d).0
}

pub fn max_unavailable(d: &Deployment) -> i32 {
    if !is_rolling(d) || replicas(d) == 0 {
        return 0;
    }
    fenceposts(d).1.min(replicas(d))
}

/// Upstream's SafeEncodeString alphabet: no vowels, no look-alikes.
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The pod-template-hash: FNV-1a (32-bit) of the template's canonical JSON
/// and the collision count, written as upstream writes it.
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut bytes = serde_json::to_vec(template).unwrap_or_default();
    if let Some(c) = collision_count {
        bytes.extend_from_slice(&c.to_le_bytes());
    }
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash.to_string().bytes().map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char).collect()
}

/// Whether two templates are equal once the pod-template-hash label is
/// left out of both.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let strip = |t: &PodTemplateSpec| {
        let mut t = t.clone();
        if let Some(labels) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            labels.remove(POD_TEMPLATE_HASH);
        }
        let mut v = serde_json::to_value(&t).unwrap_or_default();
        // An emptied label map and an absent one are the same template.
        if let Some(m) = v.pointer_mut("/metadata").and_then(|m| m.as_object_mut()) {
            if m.get("labels").is_some_and(|l| l.as_object().is_some_and(|o| o.is_empty())) {
                m.remove("labels");
            }
        }
        v
    };
    strip(a) == strip(b)
}

pub fn template_of(rs: &ReplicaSet) -> PodTemplateSpec {
    rs.spec.as_ref().and_then(|s| s.template.clone()).unwrap_or_default()
}

pub fn annotation<'a>(rs: &'a ReplicaSet, key: &str) -> Option<&'a str> {
    rs.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

pub fn revision(rs: &ReplicaSet) -> i64 {
    annotation(rs, REVISION).and_then(|r| r.parse().ok()).unwrap_or(0)
}

pub fn status_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().map(|s| s.replicas).unwrap_or(0)
}

pub fn ready_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0)
}

pub fn available_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0)
}

/// Sum of spec.replicas.
pub fn replica_count<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(rs_replicas).sum()
}

/// Sum of status.replicas.
pub fn actual_replica_count<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(status_replicas).sum()
}

pub fn ready_replica_count<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(ready_replicas).sum()
}

pub fn available_replica_count<'a>(rss: impl IntoIterator<Item = &'a ReplicaSet>) -> i32 {
    rss.into_iter().map(available_replicas).sum()
}

fn created(rs: &ReplicaSet) -> Option<k8s_openapi::jiff::Timestamp> {
    rs.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// Oldest first; ties by name.
pub fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    created(a).cmp(&created(b)).then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// Lowest revision first; ties oldest first.
pub fn by_revision(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    revision(a).cmp(&revision(b)).then_with(|| by_creation(a, b))
}

/// Largest first; ties newer first.
pub fn by_size_newer(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    rs_replicas(b).cmp(&rs_replicas(a)).then_with(|| by_creation(b, a))
}

/// Largest first; ties older first.
pub fn by_size_older(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    rs_replicas(b).cmp(&rs_replicas(a)).then_with(|| by_creation(a, b))
}

/// Go's math.Round: halves away from zero.
pub fn round_half_away(x: f64) -> i32 {
    x.round() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenceposts_round_as_upstream() {
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(resolve_fenceposts(Some(&pct("25%")), Some(&pct("25%")), 10), (3, 2));
        assert_eq!(resolve_fenceposts(Some(&pct("25%")), Some(&pct("25%")), 1), (1, 0));
        assert_eq!(resolve_fenceposts(Some(&IntOrString::Int(0)), Some(&IntOrString::Int(0)), 3), (0, 1));
        assert_eq!(resolve_fenceposts(None, None, 4), (1, 1));
        assert_eq!(resolve_fenceposts(Some(&IntOrString::Int(2)), Some(&pct("50%")), 5), (2, 2));
        assert!(scaled_value(&pct("x%"), 4, true).is_err());
    }

    #[test]
    fn hash_is_stable_and_ignored_in_equality() {
        let t: PodTemplateSpec = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}
        }))
        .unwrap();
        let h = compute_hash(&t, None);
        assert_eq!(h, compute_hash(&t.clone(), None));
        assert_ne!(h, compute_hash(&t, Some(1)));
        assert!(h.bytes().all(|b| ALPHANUMS.contains(&b)));
        let mut labeled = t.clone();
        labeled.metadata.as_mut().unwrap().labels.as_mut().unwrap().insert(POD_TEMPLATE_HASH.into(), h);
        assert!(equal_ignore_hash(&t, &labeled));
        let mut other = t.clone();
        other.spec.as_mut().unwrap().containers[0].image = Some("nginx:2".into());
        assert!(!equal_ignore_hash(&t, &other));
    }
}
