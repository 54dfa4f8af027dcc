//! Upstream's rollingUpdate for a DaemonSet: replaces the pods of older
//! revisions Node by Node, within maxSurge (a new pod first) or
//! maxUnavailable (the old pod first).

use k8s_openapi::api::apps::v1::RollingUpdateDaemonSet;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::manage::Plan;
use super::Availability;

/// An int-or-percent of `total`, rounded up as upstream's daemon util does.
pub fn scaled(value: Option<&IntOrString>, total: i32) -> i32 {
    match value {
        None => 0,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            i32::try_from((pct * i64::from(total) + 99) / 100).unwrap_or(i32::MAX)
        }
    }
}

/// Adds to `plan` the creates and deletes that move the Nodes still
/// running old pods along, for a DaemonSet that wants `desired` pods.
pub(super) fn rolling_update(
    ru: Option<&RollingUpdateDaemonSet>,
    desired: i32,
    plan: &mut Plan,
    availability: &Availability,
) {
    let max_surge = scaled(ru.and_then(|r| r.max_surge.as_ref()), desired);
    let mut max_unavailable = scaled(ru.and_then(|r| r.max_unavailable.as_ref()), desired);
    if max_surge == 0 && max_unavailable == 0 {
        max_unavailable = 1;
    }
    let mut surged = plan.old_on.values().filter(|(_, new)| new.is_some()).count() as i32;
    for (node, (old, new)) in &plan.old_on {
        let old_available = old.iter().any(|p| availability.of(p));
        match new {
            // A new pod exists: the old ones go once it is available
            // (or at once if none of them was available either).
            Some(n) if availability.of(n) || !old_available => plan.delete.extend(old.iter().cloned()),
            Some(_) => {}
            None if !old_available => plan.delete.extend(old.iter().cloned()),
            None if max_surge > 0 => {
                if surged < max_surge {
                    surged += 1;
                    plan.create_on.push(node.clone());
                }
            }
            None => {
                if plan.unavailable < max_unavailable {
                    plan.unavailable += 1;
                    plan.delete.extend(old.iter().cloned());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_or_percent_rounds_up() {
        assert_eq!(scaled(Some(&IntOrString::String("25%".into())), 5), 2);
        assert_eq!(scaled(Some(&IntOrString::String("10%".into())), 10), 1);
        assert_eq!(scaled(Some(&IntOrString::Int(3)), 10), 3);
        assert_eq!(scaled(None, 10), 0);
    }
}
