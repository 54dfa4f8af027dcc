//! From the replicas the metrics ask for to the replicas set: upstream's
//! stabilization (the highest recommendation of the scale-down window, the
//! lowest of the scale-up window), the scaling policies of `behavior` (how
//! many pods, or what percentage, may be added or removed per period,
//! counted from the scale events of the period), and minReplicas /
//! maxReplicas. Each outcome names the AbleToScale and ScalingLimited
//! reasons and messages upstream sets.

use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v2::{HPAScalingPolicy, HPAScalingRules, HorizontalPodAutoscalerBehavior};

/// Upstream's `--horizontal-pod-autoscaler-downscale-stabilization` (5 min).
pub const DOWNSCALE_STABILIZATION: Duration = Duration::from_secs(300);

/// What an HPA's recent past holds, kept between syncs.
#[derive(Debug, Default)]
pub struct History {
    recommendations: Vec<(i32, Instant)>,
    scale_up: Vec<ScaleEvent>,
    scale_down: Vec<ScaleEvent>,
}

#[derive(Debug, Clone, Copy)]
struct ScaleEvent {
    /// Pods added or removed (never negative).
    change: i32,
    at: Instant,
    outdated: bool,
}

/// The replicas decided and the conditions that tell why.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    pub replicas: i32,
    /// AbleToScale (True): reason and message.
    pub able: (&'static str, &'static str),
    /// ScalingLimited: whether it limited, reason and message.
    pub limited: (bool, &'static str, &'static str),
}

fn older_than(at: Instant, now: Instant, age: Duration) -> bool {
    now.checked_sub(age).is_some_and(|cutoff| at < cutoff)
}

fn newer_than(at: Instant, now: Instant, age: Duration) -> bool {
    now.checked_sub(age).is_none_or(|cutoff| at > cutoff)
}

/// Upstream's scale-up defaults (`GenerateHPAScaleUpRules`): no window,
/// the larger of 4 pods and 100 % every 15 s.
pub fn default_scale_up() -> HPAScalingRules {
    HPAScalingRules {
        stabilization_window_seconds: Some(0),
        select_policy: Some("Max".into()),
        policies: Some(vec![
            HPAScalingPolicy { type_: "Pods".into(), value: 4, period_seconds: 15 },
            HPAScalingPolicy { type_: "Percent".into(), value: 100, period_seconds: 15 },
        ]),
        tolerance: None,
    }
}

/// Upstream's scale-down defaults (`GenerateHPAScaleDownRules`): 100 %
/// every 15 s; the window is the controller's (`DOWNSCALE_STABILIZATION`).
pub fn default_scale_down() -> HPAScalingRules {
    HPAScalingRules {
        stabilization_window_seconds: None,
        select_policy: Some("Max".into()),
        policies: Some(vec![HPAScalingPolicy { type_: "Percent".into(), value: 100, period_seconds: 15 }]),
        tolerance: None,
    }
}

/// `rules` with upstream's defaults in what it leaves unset.
fn filled(rules: Option<&HPAScalingRules>, defaults: HPAScalingRules) -> HPAScalingRules {
    let Some(r) = rules else { return defaults };
    HPAScalingRules {
        stabilization_window_seconds: r.stabilization_window_seconds.or(defaults.stabilization_window_seconds),
        select_policy: r.select_policy.clone().or(defaults.select_policy),
        policies: r.policies.clone().or(defaults.policies),
        tolerance: r.tolerance.clone(),
    }
}

fn policies(rules: &HPAScalingRules) -> &[HPAScalingPolicy] {
    rules.policies.as_deref().unwrap_or_default()
}

fn change_in_period(period_seconds: i32, events: &[ScaleEvent], now: Instant) -> i32 {
    let period = Duration::from_secs(u64::try_from(period_seconds).unwrap_or(0));
    events.iter().filter(|e| newer_than(e.at, now, period)).map(|e| e.change).sum()
}

impl History {
    /// The first recommendation is the current size.
    pub fn record_initial(&mut self, current: i32, now: Instant) {
        if self.recommendations.is_empty() {
            self.recommendations.push((current, now));
        }
    }

    /// Records `recommendation`, reusing the slot of one older than `keep`.
    fn record(&mut self, recommendation: i32, now: Instant, old_slot: Option<usize>) {
        match old_slot {
            Some(i) => self.recommendations[i] = (recommendation, now),
            None => self.recommendations.push((recommendation, now)),
        }
    }

    /// Without `behavior`: the highest recommendation of the downscale
    /// window, then at most twice the current size (or 4) and within
    /// [min, max] (upstream's `normalizeDesiredReplicas`).
    pub fn normalize(
        &mut self,
        current: i32,
        desired: i32,
        min: i32,
        max: i32,
        window: Duration,
        now: Instant,
    ) -> Normalized {
        let mut stabilized = desired;
        let mut old_slot = None;
        for (i, (rec, at)) in self.recommendations.iter().enumerate() {
            if older_than(*at, now, window) {
                old_slot = Some(i);
            } else if *rec > stabilized {
                stabilized = *rec;
            }
        }
        self.record(desired, now, old_slot);
        let able = if stabilized != desired {
            (
                "ScaleDownStabilized",
                "recent recommendations were higher than current one, applying the highest recent recommendation",
            )
        } else {
            ("ReadyForNewScale", "recommended size matches current size")
        };
        let scale_up_limit = (2.0 * f64::from(current)).max(4.0) as i32;
        let (maximum, max_reason, max_message) = if max > scale_up_limit {
            (
                scale_up_limit,
                "ScaleUpLimit",
                "the desired replica count is increasing faster than the maximum scale rate",
            )
        } else {
            (max, "TooManyReplicas", "the desired replica count is more than the maximum replica count")
        };
        let (replicas, reason, message) = if stabilized < min {
            (min, "TooFewReplicas", "the desired replica count is less than the minimum replica count")
        } else if stabilized > maximum {
            (maximum, max_reason, max_message)
        } else {
            (stabilized, "DesiredWithinRange", "the desired count is within the acceptable range")
        };
        Normalized { replicas, able, limited: (replicas != stabilized, reason, message) }
    }

    /// With `behavior` (upstream's `normalizeDesiredReplicasWithBehaviors`):
    /// stabilized between the lowest recommendation of the scale-up window
    /// and the highest of the scale-down window, then held to the policies'
    /// rate and to [min, max].
    #[allow(clippy::too_many_arguments)]
    pub fn normalize_with_behavior(
        &mut self,
        behavior: &HorizontalPodAutoscalerBehavior,
        current: i32,
        desired: i32,
        min: i32,
        max: i32,
        downscale_window: Duration,
        now: Instant,
    ) -> Normalized {
        let up = filled(behavior.scale_up.as_ref(), default_scale_up());
        let mut down = filled(behavior.scale_down.as_ref(), default_scale_down());
        if down.stabilization_window_seconds.is_none() {
            down.stabilization_window_seconds = Some(downscale_window.as_secs() as i32);
        }
        let seconds = |r: &HPAScalingRules| {
            Duration::from_secs(u64::try_from(r.stabilization_window_seconds.unwrap_or(0)).unwrap_or(0))
        };
        let (up_window, down_window) = (seconds(&up), seconds(&down));
        let (mut up_rec, mut down_rec) = (desired, desired);
        let mut old_slot = None;
        for (i, (rec, at)) in self.recommendations.iter().enumerate() {
            if newer_than(*at, now, up_window) {
                up_rec = up_rec.min(*rec);
            }
            if newer_than(*at, now, down_window) {
                down_rec = down_rec.max(*rec);
            }
            if older_than(*at, now, up_window) && older_than(*at, now, down_window) {
                old_slot = Some(i);
            }
        }
        let stabilized = current.max(up_rec).min(down_rec);
        self.record(desired, now, old_slot);
        let able = if stabilized == desired {
            ("ReadyForNewScale", "recommended size matches current size")
        } else if desired >= current {
            (
                "ScaleUpStabilized",
                "recent recommendations were lower than current one, applying the lowest recent recommendation",
            )
        } else {
            (
                "ScaleDownStabilized",
                "recent recommendations were higher than current one, applying the highest recent recommendation",
            )
        };
        let (replicas, reason, message) = self.rate_limited(&up, &down, current, stabilized, min, max, now);
        Normalized { replicas, able, limited: (replicas != stabilized, reason, message) }
    }

    #[allow(clippy::too_many_arguments)]
    fn rate_limited(
        &self,
        up: &HPAScalingRules,
        down: &HPAScalingRules,
        current: i32,
        desired: i32,
        min: i32,
        max: i32,
        now: Instant,
    ) -> (i32, &'static str, &'static str) {
        if desired > current {
            let limit = self.scale_up_limit(current, up, now).max(current);
            let (maximum, reason, message) = if max > limit {
                (limit, "ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate")
            } else {
                (max, "TooManyReplicas", "the desired replica count is more than the maximum replica count")
            };
            if desired > maximum {
                return (maximum, reason, message);
            }
        } else if desired < current {
            let limit = self.scale_down_limit(current, down, now).min(current);
            let (minimum, reason, message) = if min < limit {
                (limit, "ScaleDownLimit", "the desired replica count is decreasing faster than the maximum scale rate")
            } else {
                (min, "TooFewReplicas", "the desired replica count is less than the minimum replica count")
            };
            if desired < minimum {
                return (minimum, reason, message);
            }
        }
        (desired, "DesiredWithinRange", "the desired count is within the acceptable range")
    }

    /// The most replicas the scale-up policies allow now.
    fn scale_up_limit(&self, current: i32, rules: &HPAScalingRules, now: Instant) -> i32 {
        let select = rules.select_policy.as_deref().unwrap_or("Max");
        if select == "Disabled" {
            return current;
        }
        let proposals = policies(rules).iter().map(|p| {
            let start = current - change_in_period(p.period_seconds, &self.scale_up, now)
                + change_in_period(p.period_seconds, &self.scale_down, now);
            match p.type_.as_str() {
                "Pods" => start.saturating_add(p.value),
                _ => (f64::from(start) * (1.0 + f64::from(p.value) / 100.0)).ceil() as i32,
            }
        });
        if select == "Min" {
            proposals.min().unwrap_or(i32::MAX)
        } else {
            proposals.max().unwrap_or(i32::MIN)
        }
    }

    /// The fewest replicas the scale-down policies allow now.
    fn scale_down_limit(&self, current: i32, rules: &HPAScalingRules, now: Instant) -> i32 {
        let select = rules.select_policy.as_deref().unwrap_or("Max");
        if select == "Disabled" {
            return current;
        }
        let proposals = policies(rules).iter().map(|p| {
            let start = current - change_in_period(p.period_seconds, &self.scale_up, now)
                + change_in_period(p.period_seconds, &self.scale_down, now);
            match p.type_.as_str() {
                "Pods" => start.saturating_sub(p.value),
                _ => (f64::from(start) * (1.0 - f64::from(p.value) / 100.0)) as i32,
            }
        });
        if select == "Min" {
            proposals.max().unwrap_or(i32::MIN)
        } else {
            proposals.min().unwrap_or(i32::MAX)
        }
    }

    /// Records a scale from `prev` to `new` (with `behavior` only, as
    /// upstream), reusing a slot older than the longest policy period.
    pub fn store_scale_event(
        &mut self,
        behavior: Option<&HorizontalPodAutoscalerBehavior>,
        prev: i32,
        new: i32,
        now: Instant,
    ) {
        let Some(behavior) = behavior else { return };
        let (rules, events, change) = if new > prev {
            (filled(behavior.scale_up.as_ref(), default_scale_up()), &mut self.scale_up, new - prev)
        } else {
            (filled(behavior.scale_down.as_ref(), default_scale_down()), &mut self.scale_down, prev - new)
        };
        let longest = policies(&rules).iter().map(|p| p.period_seconds).max().unwrap_or(0);
        let longest = Duration::from_secs(u64::try_from(longest).unwrap_or(0));
        for e in events.iter_mut() {
            if older_than(e.at, now, longest) {
                e.outdated = true;
            }
        }
        let event = ScaleEvent { change, at: now, outdated: false };
        match events.iter().rposition(|e| e.outdated) {
            Some(i) => events[i] = event,
            None => events.push(event),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn behavior(json: serde_json::Value) -> HorizontalPodAutoscalerBehavior {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn without_behavior_scale_downs_wait_out_the_window_and_scale_ups_double_at_most() {
        let t0 = Instant::now();
        let mut h = History::default();
        h.record_initial(2, t0);
        let n = h.normalize(2, 10, 1, 20, DOWNSCALE_STABILIZATION, t0);
        assert_eq!((n.replicas, n.limited.1), (4, "ScaleUpLimit"));
        let n = h.normalize(4, 1, 1, 20, DOWNSCALE_STABILIZATION, t0 + Duration::from_secs(15));
        assert_eq!((n.replicas, n.able.0), (8, "ScaleDownStabilized"), "the window holds 10; twice 4 at most");
        let n = h.normalize(4, 1, 2, 20, DOWNSCALE_STABILIZATION, t0 + Duration::from_secs(400));
        assert_eq!(n.replicas, 2, "past the window: down to min");
        assert_eq!(
            n.limited,
            (true, "TooFewReplicas", "the desired replica count is less than the minimum replica count")
        );
        let n = h.normalize(2, 30, 1, 20, DOWNSCALE_STABILIZATION, t0 + Duration::from_secs(401));
        assert_eq!(n.replicas, 4);
    }

    #[test]
    fn policies_limit_the_rate_and_windows_stabilize() {
        let b = behavior(serde_json::json!({
            "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}]},
            "scaleDown": {"stabilizationWindowSeconds": 30, "selectPolicy": "Max",
                          "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}
        }));
        let t0 = Instant::now();
        let mut h = History::default();
        h.record_initial(1, t0);
        let n = h.normalize_with_behavior(&b, 1, 3, 1, 3, DOWNSCALE_STABILIZATION, t0);
        assert_eq!((n.replicas, n.limited.1), (2, "ScaleUpLimit"));
        h.store_scale_event(Some(&b), 1, 2, t0);
        // Within the same period the pod already added uses the policy up.
        let n = h.normalize_with_behavior(&b, 2, 3, 1, 3, DOWNSCALE_STABILIZATION, t0 + Duration::from_secs(5));
        assert_eq!(n.replicas, 2);
        let n = h.normalize_with_behavior(&b, 2, 3, 1, 3, DOWNSCALE_STABILIZATION, t0 + Duration::from_secs(16));
        assert_eq!(n.replicas, 3);
        h.store_scale_event(Some(&b), 2, 3, t0 + Duration::from_secs(16));
        // Over max: TooManyReplicas.
        let n = h.normalize_with_behavior(&b, 3, 9, 1, 3, DOWNSCALE_STABILIZATION, t0 + Duration::from_secs(40));
        assert_eq!((n.replicas, n.limited.1), (3, "TooManyReplicas"));
        // Load gone: held by the 30 s scale-down window, then down to min.
        let n = h.normalize_with_behavior(&b, 3, 1, 1, 3, DOWNSCALE_STABILIZATION, t0 + Duration::from_secs(50));
        assert_eq!((n.replicas, n.able.0), (3, "ScaleDownStabilized"));
        let n = h.normalize_with_behavior(&b, 3, 1, 1, 3, DOWNSCALE_STABILIZATION, t0 + Duration::from_secs(90));
        assert_eq!((n.replicas, n.able.0), (1, "ReadyForNewScale"));
        assert_eq!(n.limited, (false, "DesiredWithinRange", "the desired count is within the acceptable range"));
    }

    #[test]
    fn a_disabled_direction_never_moves() {
        let b = behavior(serde_json::json!({"scaleDown": {"selectPolicy": "Disabled"}}));
        let t0 = Instant::now();
        let mut h = History::default();
        let n = h.normalize_with_behavior(&b, 5, 1, 1, 10, Duration::ZERO, t0);
        assert_eq!((n.replicas, n.limited.1), (5, "ScaleDownLimit"));
        let n = h.normalize_with_behavior(&b, 5, 20, 1, 10, Duration::ZERO, t0);
        assert_eq!((n.replicas, n.limited.1), (10, "TooManyReplicas"), "scale-up keeps its defaults");
    }
}
