//! Upstream's ReplicaCalculator: how many replicas a metric asks for, from
//! the per-pod samples and the pods the target's selector picks. Pods being
//! deleted or failed are ignored, Pending ones and (for CPU) ones still
//! starting up count as unready, pods without a sample are missing; a
//! change within the tolerance is no change, and unready or missing pods
//! are counted so as to damp a scale in the direction the ready ones ask
//! for (0 % on a scale-up, 100 % of their request on a scale-down).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::controllers::controller_utils::pod_phase;

/// Why no replica count follows from the samples, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalcError {
    #[error("no pods returned by selector while calculating replica count")]
    NoPods,
    #[error("did not receive metrics for targeted pods (pods might be unready)")]
    NoMetricsForPods,
    #[error("missing request for {resource} in container {container} of Pod {pod}")]
    MissingRequest { resource: String, container: String, pod: String },
    #[error("no metrics returned matched known pods")]
    NoMatchingMetrics,
    #[error("unable to calculate ready pods: no pods returned by selector while calculating replica count")]
    NoReadyPods,
}

/// One pod's sample of a metric.
#[derive(Debug, Clone, PartialEq)]
pub struct PodMetric {
    pub timestamp: Timestamp,
    pub window: Duration,
    /// In thousandths (millicores, millibytes).
    pub value: i64,
}

/// Samples by pod name.
pub type PodMetricsInfo = HashMap<String, PodMetric>;

/// The knobs of upstream's `--horizontal-pod-autoscaler-*` flags.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaCalculator {
    /// `--horizontal-pod-autoscaler-tolerance` (0.1).
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-cpu-initialization-period` (5 min).
    pub cpu_initialization_period: Duration,
    /// `--horizontal-pod-autoscaler-initial-readiness-delay` (30 s).
    pub delay_of_initial_readiness_status: Duration,
}

impl Default for ReplicaCalculator {
    fn default() -> Self {
        ReplicaCalculator {
            tolerance: 0.1,
            cpu_initialization_period: Duration::from_secs(300),
            delay_of_initial_readiness_status: Duration::from_secs(30),
        }
    }
}

/// The pods of a calculation, sorted as upstream's `groupPods` sorts them.
#[derive(Debug, Default)]
struct Grouped {
    ready: usize,
    unready: HashSet<String>,
    missing: HashSet<String>,
    ignored: HashSet<String>,
}

fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)).unwrap_or(Timestamp::MAX)
}

fn group_pods(
    pods: &[Arc<Pod>],
    metrics: &PodMetricsInfo,
    resource: &str,
    calc: &ReplicaCalculator,
    now: Timestamp,
) -> Grouped {
    let mut g = Grouped::default();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() || pod_phase(pod) == "Failed" {
            g.ignored.insert(name);
            continue;
        }
        if pod_phase(pod) == "Pending" {
            g.unready.insert(name);
            continue;
        }
        let Some(metric) = metrics.get(&name) else {
            g.missing.insert(name);
            continue;
        };
        if resource == "cpu" {
            let condition = ready_condition(pod);
            let start = pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
            let unready = match (condition, start) {
                (Some(c), Some(start)) => {
                    let changed = c.last_transition_time.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
                    if plus(start, calc.cpu_initialization_period) > now {
                        // Still starting: unready, or no whole window sampled since it changed.
                        c.status == "False" || metric.timestamp < plus(changed, metric.window)
                    } else {
                        // Unready and never ready since it started.
                        c.status == "False" && plus(start, calc.delay_of_initial_readiness_status) > changed
                    }
                }
                _ => true,
            };
            if unready {
                g.unready.insert(name);
                continue;
            }
        }
        g.ready += 1;
    }
    g
}

/// Each pod's request of `resource` in thousandths, summed over its
/// containers (or the one named `container`) and sidecars; a container
/// without one is an error, as upstream's `calculatePodRequests`.
fn pod_requests(pods: &[Arc<Pod>], container: &str, resource: &str) -> Result<HashMap<String, i64>, CalcError> {
    let mut requests = HashMap::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let sidecars = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let containers = spec.map(|s| s.containers.iter()).into_iter().flatten().chain(sidecars);
        let mut sum = 0i64;
        for c in containers.filter(|c| container.is_empty() || c.name == container) {
            let request = c.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get(resource));
            match request.and_then(crate::quantity::milli_value) {
                Some(v) => sum += v,
                None => {
                    return Err(CalcError::MissingRequest {
                        resource: resource.to_string(),
                        container: c.name.clone(),
                        pod: name,
                    })
                }
            }
        }
        requests.insert(name, sum);
    }
    Ok(requests)
}

/// Upstream's `GetResourceUtilizationRatio`: usage over requests of the
/// pods that have both, as (ratio to the target, utilization in percent,
/// average usage).
fn utilization_ratio(
    metrics: &PodMetricsInfo,
    requests: &HashMap<String, i64>,
    target: i32,
) -> Result<(f64, i32, i64), CalcError> {
    let (mut used, mut requested, mut entries) = (0i64, 0i64, 0i64);
    for (pod, m) in metrics {
        let Some(r) = requests.get(pod) else { continue };
        used += m.value;
        requested += r;
        entries += 1;
    }
    if requested == 0 {
        return Err(CalcError::NoMatchingMetrics);
    }
    let utilization = i32::try_from(used * 100 / requested).unwrap_or(i32::MAX);
    Ok((f64::from(utilization) / f64::from(target), utilization, used / entries))
}

/// Upstream's `GetMetricUsageRatio`: the average usage and its ratio to the target.
fn usage_ratio(metrics: &PodMetricsInfo, target: i64) -> (f64, i64) {
    let total: i64 = metrics.values().map(|m| m.value).sum();
    let average = total / (metrics.len().max(1) as i64);
    (average as f64 / target as f64, average)
}

fn remove(metrics: &mut PodMetricsInfo, pods: &HashSet<String>) {
    for p in pods {
        metrics.remove(p);
    }
}

fn ceil(x: f64) -> i32 {
    let c = x.ceil();
    if c >= f64::from(i32::MAX) {
        i32::MAX
    } else {
        c as i32
    }
}

/// What a utilization target asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Utilization {
    pub replicas: i32,
    /// Percent of the request.
    pub utilization: i32,
    /// The average usage, in thousandths.
    pub raw: i64,
}

impl ReplicaCalculator {
    /// Upstream's `GetResourceReplicas` once the samples are in hand.
    pub fn resource_replicas(
        &self,
        current: i32,
        target: i32,
        resource: &str,
        container: &str,
        mut metrics: PodMetricsInfo,
        pods: &[Arc<Pod>],
        now: Timestamp,
    ) -> Result<Utilization, CalcError> {
        if pods.is_empty() {
            return Err(CalcError::NoPods);
        }
        let g = group_pods(pods, &metrics, resource, self, now);
        remove(&mut metrics, &g.ignored);
        remove(&mut metrics, &g.unready);
        if metrics.is_empty() {
            return Err(CalcError::NoMetricsForPods);
        }
        let requests = pod_requests(pods, container, resource)?;
        let (ratio, utilization, raw) = utilization_ratio(&metrics, &requests, target)?;
        let unchanged = Utilization { replicas: current, utilization, raw };
        let scale_up_with_unready = !g.unready.is_empty() && ratio > 1.0;
        if !scale_up_with_unready && g.missing.is_empty() {
            if (1.0 - ratio).abs() <= self.tolerance {
                return Ok(unchanged);
            }
            return Ok(Utilization { replicas: ceil(ratio * g.ready as f64), utilization, raw });
        }
        if !g.missing.is_empty() {
            // Missing pods use 100 % (or the target, when higher) on a
            // scale-down, nothing on a scale-up.
            let fallback = i64::from(target.max(100));
            for pod in &g.missing {
                let value = if ratio < 1.0 { requests.get(pod).copied().unwrap_or(0) * fallback / 100 } else { 0 };
                if ratio != 1.0 {
                    metrics.insert(pod.clone(), PodMetric { timestamp: now, window: Duration::ZERO, value });
                }
            }
        }
        if scale_up_with_unready {
            for pod in &g.unready {
                metrics.insert(pod.clone(), PodMetric { timestamp: now, window: Duration::ZERO, value: 0 });
            }
        }
        let (new_ratio, _, _) = utilization_ratio(&metrics, &requests, target)?;
        Ok(Utilization { replicas: self.damped(current, ratio, new_ratio, metrics.len()), utilization, raw })
    }

    /// Upstream's `calcPlainMetricReplicas` (an AverageValue target, in
    /// thousandths): the replicas and the average usage.
    pub fn plain_replicas(
        &self,
        current: i32,
        target: i64,
        resource: &str,
        mut metrics: PodMetricsInfo,
        pods: &[Arc<Pod>],
        now: Timestamp,
    ) -> Result<(i32, i64), CalcError> {
        if pods.is_empty() {
            return Err(CalcError::NoPods);
        }
        let g = group_pods(pods, &metrics, resource, self, now);
        remove(&mut metrics, &g.ignored);
        remove(&mut metrics, &g.unready);
        if metrics.is_empty() {
            return Err(CalcError::NoMetricsForPods);
        }
        let (ratio, usage) = usage_ratio(&metrics, target);
        let scale_up_with_unready = !g.unready.is_empty() && ratio > 1.0;
        if !scale_up_with_unready && g.missing.is_empty() {
            if (1.0 - ratio).abs() <= self.tolerance {
                return Ok((current, usage));
            }
            return Ok((ceil(ratio * g.ready as f64), usage));
        }
        if !g.missing.is_empty() && ratio != 1.0 {
            // Missing pods use exactly the target on a scale-down, nothing on a scale-up.
            let value = if ratio < 1.0 { target } else { 0 };
            for pod in &g.missing {
                metrics.insert(pod.clone(), PodMetric { timestamp: now, window: Duration::ZERO, value });
            }
        }
        if scale_up_with_unready {
            for pod in &g.unready {
                metrics.insert(pod.clone(), PodMetric { timestamp: now, window: Duration::ZERO, value: 0 });
            }
        }
        let (new_ratio, _) = usage_ratio(&metrics, target);
        Ok((self.damped(current, ratio, new_ratio, metrics.len()), usage))
    }

    /// The replicas of the ratio recomputed with unready and missing pods
    /// counted: none when that falls within the tolerance or turns the
    /// direction of the scale.
    fn damped(&self, current: i32, ratio: f64, new_ratio: f64, counted: usize) -> i32 {
        if (1.0 - new_ratio).abs() <= self.tolerance
            || (ratio < 1.0 && new_ratio > 1.0)
            || (ratio > 1.0 && new_ratio < 1.0)
        {
            return current;
        }
        let replicas = ceil(new_ratio * counted as f64);
        if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
            return current;
        }
        replicas
    }

    /// Upstream's `getUsageRatioReplicaCount` (Object and External Value
    /// targets): from the ready pods, or straight from the ratio at zero.
    pub fn usage_ratio_replicas(&self, current: i32, ratio: f64, pods: &[Arc<Pod>]) -> Result<i32, CalcError> {
        if current == 0 {
            return Ok(ceil(ratio));
        }
        if (1.0 - ratio).abs() <= self.tolerance {
            return Ok(current);
        }
        if pods.is_empty() {
            return Err(CalcError::NoReadyPods);
        }
        let ready = pods
            .iter()
            .filter(|p| pod_phase(p) == "Running" && crate::controllers::controller_utils::is_pod_ready(p))
            .count();
        Ok(ceil(ratio * ready as f64))
    }

    /// Upstream's per-pod average of an Object or External metric against
    /// `statusReplicas`: the replicas and the per-pod usage.
    pub fn per_pod_replicas(&self, status_replicas: i32, usage: i64, target_per_pod: i64) -> (i32, i64) {
        let mut replicas = status_replicas;
        let ratio = usage as f64 / (target_per_pod as f64 * f64::from(status_replicas));
        if (1.0 - ratio).abs() > self.tolerance {
            replicas = ceil(usage as f64 / target_per_pod as f64);
        }
        let per_pod = (usage as f64 / f64::from(status_replicas)).ceil();
        (replicas, if per_pod.is_finite() { per_pod as i64 } else { 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    /// A Running pod, ready since `ready_at`, started at `started`, asking `cpu_m` millicores.
    fn pod(name: &str, phase: &str, ready: bool, started: i64, ready_at: i64, cpu_m: Option<i64>) -> Arc<Pod> {
        let requests = cpu_m.map(|m| serde_json::json!({"cpu": format!("{m}m")}));
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]},
                "status": {"phase": phase, "startTime": t(started).to_string(),
                           "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                                           "lastTransitionTime": t(ready_at).to_string()}]}
            }))
            .unwrap(),
        )
    }

    fn sample(at: i64, value: i64) -> PodMetric {
        PodMetric { timestamp: t(at), window: Duration::from_secs(15), value }
    }

    fn metrics(entries: &[(&str, i64)], at: i64) -> PodMetricsInfo {
        entries.iter().map(|(n, v)| (n.to_string(), sample(at, *v))).collect()
    }

    #[test]
    fn cpu_utilization_scales_with_the_ready_pods() {
        let calc = ReplicaCalculator::default();
        let pods = vec![pod("a", "Running", true, 0, 10, Some(100)), pod("b", "Running", true, 0, 10, Some(100))];
        // 150 % of a 50 % target on two pods: six replicas.
        let r = calc.resource_replicas(2, 50, "cpu", "", metrics(&[("a", 150), ("b", 150)], 1000), &pods, t(1000));
        assert_eq!(r, Ok(Utilization { replicas: 6, utilization: 150, raw: 150 }));
        // Within the tolerance: unchanged.
        let r = calc.resource_replicas(2, 50, "cpu", "", metrics(&[("a", 54), ("b", 52)], 1000), &pods, t(1000));
        assert_eq!(r.unwrap().replicas, 2);
    }

    #[test]
    fn a_container_target_counts_that_container_s_request_only() {
        let pod: Arc<Pod> = Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "a"},
                "spec": {"containers": [
                    {"name": "app", "resources": {"requests": {"cpu": "100m"}}},
                    {"name": "sidecar-less", "resources": {}}
                ]},
                "status": {"phase": "Running", "startTime": t(0).to_string(),
                           "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": t(10).to_string()}]}
            }))
            .unwrap(),
        );
        let calc = ReplicaCalculator::default();
        let pods = vec![pod];
        let r = calc.resource_replicas(1, 50, "cpu", "app", metrics(&[("a", 100)], 1000), &pods, t(1000));
        assert_eq!(r, Ok(Utilization { replicas: 2, utilization: 100, raw: 100 }));
        let e = calc.resource_replicas(1, 50, "cpu", "", metrics(&[("a", 100)], 1000), &pods, t(1000));
        assert_eq!(e.unwrap_err().to_string(), "missing request for cpu in container sidecar-less of Pod a");
    }

    #[test]
    fn missing_and_unready_pods_damp_the_scale() {
        let calc = ReplicaCalculator::default();
        // b has no sample: on a scale-up it counts as 0 %.
        let pods = vec![pod("a", "Running", true, 0, 10, Some(100)), pod("b", "Running", true, 0, 10, Some(100))];
        let r = calc.resource_replicas(2, 50, "cpu", "", metrics(&[("a", 100)], 1000), &pods, t(1000)).unwrap();
        assert_eq!((r.replicas, r.utilization), (2, 100), "(100+0)/200 = 50 %: on target");
        // On a scale-down it counts as 100 % of its request.
        let r = calc.resource_replicas(2, 50, "cpu", "", metrics(&[("a", 10)], 1000), &pods, t(1000)).unwrap();
        assert_eq!(r.replicas, 2, "(10+100)/200 = 55 % turns the direction: no change");
        // A pod still starting (within the CPU initialization period, its
        // sample older than a window after it turned ready) is unready, and
        // on a scale-up counts as 0 %.
        let pods = vec![pod("a", "Running", true, 0, 10, Some(100)), pod("b", "Running", true, 990, 995, Some(100))];
        let r = calc.resource_replicas(2, 50, "cpu", "", metrics(&[("a", 300), ("b", 300)], 1000), &pods, t(1000));
        assert_eq!(r.unwrap().replicas, 6, "(300+0)/200 = 150 %, three times 50 %, on 2 pods");
        // Pending pods are unready, deleted and failed ones ignored.
        let pods = vec![pod("a", "Running", true, 0, 10, Some(100)), pod("p", "Pending", false, 0, 0, Some(100))];
        let r = calc.resource_replicas(1, 50, "cpu", "", metrics(&[("a", 100)], 1000), &pods, t(1000));
        assert_eq!(r.unwrap().replicas, 1, "(100+0)/200 = 50 %: on target once the pending pod counts");
    }

    #[test]
    fn errors_are_upstreams() {
        let calc = ReplicaCalculator::default();
        let none: Vec<Arc<Pod>> = Vec::new();
        let e = calc.resource_replicas(1, 50, "cpu", "", metrics(&[], 0), &none, t(0)).unwrap_err();
        assert_eq!(e.to_string(), "no pods returned by selector while calculating replica count");
        let pods = vec![pod("a", "Running", true, 0, 10, None)];
        let e = calc.resource_replicas(1, 50, "cpu", "", metrics(&[("a", 1)], 1000), &pods, t(1000)).unwrap_err();
        assert_eq!(e.to_string(), "missing request for cpu in container c of Pod a");
        let pods = vec![pod("a", "Pending", false, 0, 0, Some(100))];
        let e = calc.resource_replicas(1, 50, "cpu", "", metrics(&[("a", 1)], 1000), &pods, t(1000)).unwrap_err();
        assert_eq!(e.to_string(), "did not receive metrics for targeted pods (pods might be unready)");
    }

    #[test]
    fn average_values_and_per_pod_averages() {
        let calc = ReplicaCalculator::default();
        let pods = vec![pod("a", "Running", true, 0, 10, None), pod("b", "Running", true, 0, 10, None)];
        let r = calc.plain_replicas(2, 100, "memory", metrics(&[("a", 300), ("b", 100)], 1000), &pods, t(1000));
        assert_eq!(r, Ok((4, 200)));
        assert_eq!(calc.per_pod_replicas(2, 1000, 100), (10, 500));
        assert_eq!(calc.per_pod_replicas(2, 210, 100), (2, 105));
        assert_eq!(calc.usage_ratio_replicas(0, 2.5, &pods), Ok(3));
    }
}
