//! An autoscaler's status conditions as upstream's `setCondition` keeps
//! them: one per type, in the order first set, the transition time moved
//! only when the status changes.

use k8s_openapi::api::autoscaling::v2::{HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

pub const ABLE_TO_SCALE: &str = "AbleToScale";
pub const SCALING_ACTIVE: &str = "ScalingActive";
pub const SCALING_LIMITED: &str = "ScalingLimited";

/// A condition as a reconcile decides it, before it lands in the status.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl Condition {
    pub fn new(type_: &'static str, status: bool, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Condition { type_, status, reason: reason.into(), message: message.into() }
    }
}

/// Sets `c` on `hpa`'s status.
pub fn set(hpa: &mut HorizontalPodAutoscaler, c: &Condition, now: Timestamp) {
    let status = hpa.status.get_or_insert_with(Default::default);
    let list = status.conditions.get_or_insert_with(Vec::new);
    let want = if c.status { "True" } else { "False" };
    let i = match list.iter().position(|e| e.type_ == c.type_) {
        Some(i) => i,
        None => {
            list.push(HorizontalPodAutoscalerCondition { type_: c.type_.to_string(), ..Default::default() });
            list.len() - 1
        }
    };
    let existing = &mut list[i];
    if existing.status != want {
        existing.last_transition_time = Some(Time(now));
    }
    existing.status = want.to_string();
    existing.reason = Some(c.reason.clone());
    existing.message = Some(c.message.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_move_the_time_only_when_the_status_changes() {
        let mut hpa = HorizontalPodAutoscaler::default();
        let t1 = Timestamp::from_second(1_800_000_000).unwrap();
        let t2 = Timestamp::from_second(1_800_000_060).unwrap();
        set(&mut hpa, &Condition::new(ABLE_TO_SCALE, true, "SucceededGetScale", "ok"), t1);
        set(&mut hpa, &Condition::new(SCALING_ACTIVE, false, "FailedGetResourceMetric", "no"), t1);
        set(&mut hpa, &Condition::new(ABLE_TO_SCALE, true, "ReadyForNewScale", "ready"), t2);
        set(&mut hpa, &Condition::new(SCALING_ACTIVE, true, "ValidMetricFound", "yes"), t2);
        let list = hpa.status.unwrap().conditions.unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(
            (list[0].reason.as_deref(), list[0].last_transition_time.as_ref().map(|t| t.0)),
            (Some("ReadyForNewScale"), Some(t1))
        );
        assert_eq!((list[1].status.as_str(), list[1].last_transition_time.as_ref().map(|t| t.0)), ("True", Some(t2)));
    }
}
