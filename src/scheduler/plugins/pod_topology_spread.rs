//! PodTopologySpread: `topologySpreadConstraints` with
//! `whenUnsatisfiable: DoNotSchedule` filter nodes where placing the pod
//! would make the skew between topology domains exceed `maxSkew`;
//! `ScheduleAnyway` constraints score nodes, fewer matching pods better.
//! Domains are counted only over nodes the constraint's inclusion policies
//! admit (`nodeAffinityPolicy` Honor and `nodeTaintsPolicy` Ignore by default).
//!
//! Pods without constraints of their own that belong to a Service,
//! ReplicationController, ReplicaSet or StatefulSet are spread by upstream's
//! system defaults (hostname maxSkew 3, zone maxSkew 5, ScheduleAnyway) over
//! the selector the scheduler builds from those objects (`default_selector`,
//! written into the cycle state under `DEFAULT_SELECTOR_KEY`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::node_affinity::required_matches;
use super::taint_toleration::{taints, tolerates, tolerations};
use crate::client::labels;
use crate::scheduler::framework::{CycleState, FilterPlugin, ScorePlugin, Snapshot, Status, MAX_NODE_SCORE};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

pub const NAME: &str = "PodTopologySpread";
pub const ERR_CONSTRAINTS: &str = "node(s) didn't match pod topology spread constraints";
pub const ERR_MISSING_LABEL: &str = "node(s) didn't match pod topology spread constraints (missing required label)";
const SCORE_KEY: &str = "PreScorePodTopologySpread";
const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
/// Where the scheduler leaves the selector of the pod's Services and
/// controller for the system default constraints.
pub const DEFAULT_SELECTOR_KEY: &str = "PodTopologySpreadDefaultSelector";
/// Marks nodes left out of scoring until normalize.
const IGNORED: i64 = -1;

#[derive(Debug, Clone)]
struct Constraint {
    max_skew: i64,
    topology_key: String,
    /// `None` (no labelSelector) selects no pod.
    selector: Option<LabelSelector>,
    min_domains: i64,
    honor_node_affinity: bool,
    honor_taints: bool,
}

impl Constraint {
    fn new(c: &TopologySpreadConstraint, pod: &PodInfo) -> Self {
        let mut selector = c.label_selector.clone();
        // matchLabelKeys: the pod's values of those keys narrow the selector.
        if let (Some(sel), Some(pod_labels)) = (selector.as_mut(), pod.labels()) {
            for key in c.match_label_keys.iter().flatten() {
                if let Some(v) = pod_labels.get(key) {
                    sel.match_expressions.get_or_insert_with(Vec::new).push(LabelSelectorRequirement {
                        key: key.clone(),
                        operator: "In".into(),
                        values: Some(vec![v.clone()]),
                    });
                }
            }
        }
        Constraint {
            max_skew: i64::from(c.max_skew),
            topology_key: c.topology_key.clone(),
            selector,
            min_domains: i64::from(c.min_domains.unwrap_or(1)),
            honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        }
    }

    fn selects(&self, pod: &PodInfo) -> bool {
        self.selector.as_ref().is_some_and(|s| labels::matches(s, pod.labels()))
    }

    /// Whether the node counts for this constraint (its inclusion policies).
    fn includes(&self, pod: &PodInfo, node: &NodeInfo) -> bool {
        if self.honor_node_affinity && !required_matches(pod, node) {
            return false;
        }
        if self.honor_taints {
            let tols = tolerations(pod);
            let untolerated = taints(node).iter().any(|t| {
                matches!(t.effect.as_str(), "NoSchedule" | "NoExecute") && !tols.iter().any(|tol| tolerates(tol, t))
            });
            if untolerated {
                return false;
            }
        }
        true
    }

    /// Pods on the node this constraint selects (same namespace, not terminating).
    fn count_on(&self, pod: &PodInfo, node: &NodeInfo) -> i64 {
        node.pods
            .iter()
            .filter(|p| p.namespace == pod.namespace && p.pod.metadata.deletion_timestamp.is_none() && self.selects(p))
            .count() as i64
    }
}

fn constraints(pod: &PodInfo, when: &str) -> Vec<Constraint> {
    let all = pod.pod.spec.as_ref().and_then(|s| s.topology_spread_constraints.as_deref()).unwrap_or_default();
    all.iter().filter(|c| c.when_unsatisfiable == when).map(|c| Constraint::new(c, pod)).collect()
}

/// The selector of a controller that owns a pod, for `default_selector`.
pub enum OwnerSelector<'a> {
    /// A ReplicationController's plain label map.
    Labels(&'a BTreeMap<String, String>),
    /// A ReplicaSet's or StatefulSet's selector.
    Selector(&'a LabelSelector),
}

/// Upstream's DefaultSelector: the labels of every Service in the pod's
/// namespace that selects it, narrowed by its controller's selector;
/// `None` when there is none.
pub fn default_selector(
    pod: &PodInfo,
    services: &[Arc<Service>],
    owner: Option<OwnerSelector>,
) -> Option<LabelSelector> {
    let pod_labels = pod.labels();
    let mut merged = BTreeMap::new();
    for svc in services.iter().filter(|s| s.metadata.namespace.as_deref() == Some(pod.namespace.as_str())) {
        let Some(sel) = svc.spec.as_ref().and_then(|s| s.selector.as_ref()).filter(|s| !s.is_empty()) else { continue };
        if crate::client::labels::matches_map(sel, pod_labels) {
            merged.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
    }
    let mut expressions = Vec::new();
    match owner {
        Some(OwnerSelector::Labels(l)) => merged.extend(l.iter().map(|(k, v)| (k.clone(), v.clone()))),
        Some(OwnerSelector::Selector(sel)) => {
            expressions.extend(sel.match_labels.iter().flatten().map(|(k, v)| LabelSelectorRequirement {
                key: k.clone(),
                operator: "In".into(),
                values: Some(vec![v.clone()]),
            }));
            expressions.extend(sel.match_expressions.iter().flatten().cloned());
        }
        None => {}
    }
    if merged.is_empty() && expressions.is_empty() {
        return None;
    }
    Some(LabelSelector {
        match_labels: (!merged.is_empty()).then_some(merged),
        match_expressions: (!expressions.is_empty()).then_some(expressions),
    })
}

/// Upstream's system default constraints over `selector`.
fn system_defaults(selector: &LabelSelector) -> Vec<Constraint> {
    [(HOSTNAME, 3), (ZONE, 5)]
        .into_iter()
        .map(|(key, max_skew)| Constraint {
            max_skew,
            topology_key: key.to_string(),
            selector: Some(selector.clone()),
            min_domains: 1,
            honor_node_affinity: true,
            honor_taints: false,
        })
        .collect()
}

fn has_all_keys(node: &NodeInfo, constraints: &[Constraint]) -> bool {
    let labels = node.labels();
    constraints.iter().all(|c| labels.is_some_and(|l| l.contains_key(&c.topology_key)))
}

/// PreFilter's counts: per constraint, topology value → matching pods.
#[derive(Debug, Clone)]
struct PreFilterState {
    constraints: Vec<Constraint>,
    counts: Vec<HashMap<String, i64>>,
    /// The smallest count over each constraint's domains (upstream's
    /// critical path), `i64::MAX` when there is no domain.
    min: Vec<i64>,
}

impl PreFilterState {
    fn refresh_min(&mut self, i: usize) {
        self.min[i] = self.counts[i].values().copied().min().unwrap_or(i64::MAX);
    }

    fn update_with_pod(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, delta: i64) {
        if other.namespace != pod.namespace || !has_all_keys(node, &self.constraints) {
            return;
        }
        for i in 0..self.constraints.len() {
            let c = &self.constraints[i];
            if !c.selects(other) || !c.includes(pod, node) {
                continue;
            }
            let Some(value) = node.labels().and_then(|l| l.get(&c.topology_key)) else { continue };
            *self.counts[i].entry(value.clone()).or_default() += delta;
            self.refresh_min(i);
        }
    }
}

pub struct PodTopologySpread;

impl FilterPlugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        NAME
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, snapshot: &Snapshot) -> Status {
        let constraints = constraints(pod, "DoNotSchedule");
        if constraints.is_empty() {
            return Status::skip();
        }
        let mut counts = vec![HashMap::new(); constraints.len()];
        for node in snapshot.nodes.iter().filter(|n| has_all_keys(n, &constraints)) {
            for (i, c) in constraints.iter().enumerate() {
                if !c.includes(pod, node) {
                    continue;
                }
                let value = node.labels().and_then(|l| l.get(&c.topology_key)).cloned().unwrap_or_default();
                *counts[i].entry(value).or_default() += c.count_on(pod, node);
            }
        }
        let mut s = PreFilterState { min: vec![i64::MAX; constraints.len()], constraints, counts };
        for i in 0..s.constraints.len() {
            s.refresh_min(i);
        }
        state.write(NAME, s);
        Status::success()
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>(NAME) else {
            return Status::error("PodTopologySpread: no PreFilter state");
        };
        let labels = node.labels();
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = labels.and_then(|l| l.get(&c.topology_key)) else {
                return Status::unresolvable(ERR_MISSING_LABEL);
            };
            // Fewer domains than minDomains: the global minimum is 0.
            let min = if (s.counts[i].len() as i64) < c.min_domains { 0 } else { s.min[i] };
            let matching = s.counts[i].get(value).copied().unwrap_or(0);
            let skew = matching.saturating_add(i64::from(c.selects(pod))).saturating_sub(min);
            if skew > c.max_skew {
                return Status::unschedulable(ERR_CONSTRAINTS);
            }
        }
        Status::success()
    }

    fn add_pod(&self, state: &mut CycleState, pod: &PodInfo, added: &PodInfo, node: &NodeInfo) {
        if let Some(s) = state.read_mut::<PreFilterState>(NAME) {
            s.update_with_pod(pod, added, node, 1);
        }
    }

    fn remove_pod(&self, state: &mut CycleState, pod: &PodInfo, removed: &PodInfo, node: &NodeInfo) {
        if let Some(s) = state.read_mut::<PreFilterState>(NAME) {
            s.update_with_pod(pod, removed, node, -1);
        }
    }
}

#[derive(Debug, Clone)]
struct ScoreState {
    constraints: Vec<Constraint>,
    ignored: HashSet<String>,
    /// Per constraint, topology value → matching pods (not for hostname,
    /// which is counted on the node itself).
    counts: Vec<HashMap<String, i64>>,
    weights: Vec<f64>,
}

impl ScorePlugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        NAME
    }

    fn pre_score(&self, state: &mut CycleState, pod: &PodInfo, nodes: &[&NodeInfo], snapshot: &Snapshot) -> Status {
        let own =
            pod.pod.spec.as_ref().and_then(|s| s.topology_spread_constraints.as_ref()).is_some_and(|c| !c.is_empty());
        // Nodes must have every topology key, unless spreading by default.
        let (constraints, require_all) = if own {
            (constraints(pod, "ScheduleAnyway"), true)
        } else {
            (state.read::<LabelSelector>(DEFAULT_SELECTOR_KEY).map(system_defaults).unwrap_or_default(), false)
        };
        if constraints.is_empty() || nodes.is_empty() {
            return Status::skip();
        }
        let mut ignored = HashSet::new();
        let mut counts = vec![HashMap::new(); constraints.len()];
        for node in nodes {
            if require_all && !has_all_keys(node, &constraints) {
                ignored.insert(node.name.clone());
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if c.topology_key == HOSTNAME {
                    continue;
                }
                if let Some(v) = node.labels().and_then(|l| l.get(&c.topology_key)) {
                    counts[i].entry(v.clone()).or_insert(0i64);
                }
            }
        }
        let weights = constraints
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let size = if c.topology_key == HOSTNAME { nodes.len() - ignored.len() } else { counts[i].len() };
                ((size + 2) as f64).ln()
            })
            .collect();
        for node in snapshot.nodes.iter().filter(|n| !require_all || has_all_keys(n, &constraints)) {
            for (i, c) in constraints.iter().enumerate() {
                if !c.includes(pod, node) {
                    continue;
                }
                let Some(v) = node.labels().and_then(|l| l.get(&c.topology_key)) else { continue };
                if counts[i].contains_key(v) {
                    let n = c.count_on(pod, node);
                    if let Some(count) = counts[i].get_mut(v) {
                        *count += n;
                    }
                }
            }
        }
        state.write(SCORE_KEY, ScoreState { constraints, ignored, counts, weights });
        Status::success()
    }

    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let Some(s) = state.read::<ScoreState>(SCORE_KEY) else { return 0 };
        if s.ignored.contains(&node.name) {
            return IGNORED;
        }
        let labels = node.labels();
        let mut score = 0.0;
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(v) = labels.and_then(|l| l.get(&c.topology_key)) else { continue };
            let count = if c.topology_key == HOSTNAME {
                c.count_on(pod, node)
            } else {
                s.counts[i].get(v).copied().unwrap_or(0)
            };
            score += count as f64 * s.weights[i] + (c.max_skew - 1) as f64;
        }
        score.round() as i64
    }

    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, scores: &mut [i64]) {
        let valid = || scores.iter().copied().filter(|s| *s != IGNORED);
        let min = valid().min().unwrap_or(0);
        let max = valid().max().unwrap_or(0);
        for s in scores.iter_mut() {
            *s = if *s == IGNORED {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - *s) / max
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::framework::Code;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::json;
    use std::sync::Arc;

    fn node(name: &str, labels: serde_json::Value, taints: serde_json::Value) -> NodeInfo {
        let n: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}))
                .unwrap();
        NodeInfo::new(Arc::new(n))
    }

    fn pod(name: &str, spec: serde_json::Value) -> Arc<PodInfo> {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c"}]);
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"app": "web"}},
            "spec": spec
        }))
        .unwrap();
        Arc::new(PodInfo::new(Arc::new(p)))
    }

    fn spread(key: &str, when: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut c = json!({"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": when,
            "labelSelector": {"matchLabels": {"app": "web"}}});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        json!({"topologySpreadConstraints": [c]})
    }

    fn cluster() -> Vec<NodeInfo> {
        let n = |name: &str, zone: &str| node(name, json!({"zone": zone, HOSTNAME: name}), json!(null));
        vec![n("a1", "a"), n("a2", "a"), n("b1", "b"), node("bare", json!({}), json!(null))]
    }

    fn filter_all(pod: &PodInfo, nodes: &[NodeInfo]) -> (CycleState, Vec<Status>) {
        let mut state = CycleState::default();
        let pre = PodTopologySpread.pre_filter(&mut state, pod, &Snapshot { nodes });
        assert_eq!(pre.code, Code::Success);
        let st = nodes.iter().map(|n| PodTopologySpread.filter(&state, pod, n)).collect();
        (state, st)
    }

    #[test]
    fn do_not_schedule_keeps_skew_within_max() {
        let mut nodes = cluster();
        nodes[0].add_pod(pod("w1", json!({})));
        let p = pod("w2", spread("zone", "DoNotSchedule", json!({})));
        let (mut state, st) = filter_all(&p, &nodes);
        assert_eq!(st[0], Status::unschedulable(ERR_CONSTRAINTS));
        assert_eq!(st[1], Status::unschedulable(ERR_CONSTRAINTS));
        assert!(st[2].is_success());
        assert_eq!(st[3], Status::unresolvable(ERR_MISSING_LABEL));
        // Preemption's dry run removing w1 makes zone a fit again.
        let w1 = nodes[0].pods[0].clone();
        PodTopologySpread.remove_pod(&mut state, &p, &w1, &nodes[0]);
        assert!(PodTopologySpread.filter(&state, &p, &nodes[0]).is_success());
        PodTopologySpread.add_pod(&mut state, &p, &w1, &nodes[0]);
        assert!(!PodTopologySpread.filter(&state, &p, &nodes[0]).is_success());
    }

    #[test]
    fn no_constraints_skip() {
        let mut state = CycleState::default();
        let nodes = cluster();
        assert_eq!(
            PodTopologySpread.pre_filter(&mut state, &pod("p", json!({})), &Snapshot { nodes: &nodes }).code,
            Code::Skip
        );
    }

    #[test]
    fn min_domains_and_inclusion_policies() {
        let mut nodes = cluster();
        nodes[0].add_pod(pod("w1", json!({})));
        nodes[2].add_pod(pod("w2", json!({})));
        // Two zones with one pod each: fine, unless minDomains asks for three.
        let p = pod("w3", spread("zone", "DoNotSchedule", json!({})));
        assert!(filter_all(&p, &nodes).1[0].is_success());
        let p = pod("w3", spread("zone", "DoNotSchedule", json!({"minDomains": 3})));
        assert!(!filter_all(&p, &nodes).1[0].is_success());
        // Zone b filtered out by the pod's node selector: zone a is the only
        // domain, so skew there is 2 - 2 = 0.
        let mut spec = spread("zone", "DoNotSchedule", json!({}));
        spec["nodeSelector"] = json!({"zone": "a"});
        nodes[1].add_pod(pod("w4", json!({})));
        assert!(filter_all(&pod("w5", spec.clone()), &nodes).1[0].is_success());
        // With nodeAffinityPolicy Ignore, zone b counts: 2 + 1 - 1 > 1.
        let mut spec = spread("zone", "DoNotSchedule", json!({"nodeAffinityPolicy": "Ignore"}));
        spec["nodeSelector"] = json!({"zone": "a"});
        assert!(!filter_all(&pod("w5", spec), &nodes).1[0].is_success());
        // A tainted zone b counts only when taints are honored.
        nodes[2] = node("b1", json!({"zone": "b", HOSTNAME: "b1"}), json!([{"key": "k", "effect": "NoSchedule"}]));
        nodes[2].add_pod(pod("w2", json!({})));
        let p = pod("w6", spread("zone", "DoNotSchedule", json!({})));
        assert!(!filter_all(&p, &nodes).1[0].is_success());
        let p = pod("w6", spread("zone", "DoNotSchedule", json!({"nodeTaintsPolicy": "Honor"})));
        assert!(filter_all(&p, &nodes).1[0].is_success());
    }

    #[test]
    fn match_label_keys_narrow_the_selector() {
        let mut nodes = cluster();
        let mut old: Pod = (*pod("old", json!({})).pod).clone();
        old.metadata.labels.as_mut().unwrap().insert("pod-template-hash".into(), "v1".into());
        nodes[0].add_pod(Arc::new(PodInfo::new(Arc::new(old))));
        let mut new: Pod =
            (*pod("new", spread("zone", "DoNotSchedule", json!({"matchLabelKeys": ["pod-template-hash"]}))).pod)
                .clone();
        new.metadata.labels.as_mut().unwrap().insert("pod-template-hash".into(), "v2".into());
        let (_, st) = filter_all(&PodInfo::new(Arc::new(new)), &nodes);
        assert!(st[0].is_success());
    }

    #[test]
    fn system_defaults_spread_pods_of_a_service_and_replica_set() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"}, "spec": {"selector": {"app": "web"}}
        }))
        .unwrap();
        let other: Service = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "default"}, "spec": {"selector": {"app": "db"}}
        }))
        .unwrap();
        let rs: LabelSelector = serde_json::from_value(json!({"matchLabels": {"hash": "1"}})).unwrap();
        let p = pod("w3", json!({}));
        assert!(default_selector(&p, &[], None).is_none());
        let sel = default_selector(&p, &[Arc::new(svc), Arc::new(other)], Some(OwnerSelector::Selector(&rs))).unwrap();
        assert_eq!(labels::to_query(&sel), "app=web,hash in (1)");
        let sel: LabelSelector = serde_json::from_value(json!({"matchLabels": {"app": "web"}})).unwrap();
        let mut nodes = cluster();
        nodes[0].add_pod(pod("w1", json!({})));
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let mut state = CycleState::default();
        state.write(DEFAULT_SELECTOR_KEY, sel);
        assert!(PodTopologySpread.pre_score(&mut state, &p, &refs, &Snapshot { nodes: &nodes }).is_success());
        let mut scores: Vec<i64> = nodes.iter().map(|n| PodTopologySpread.score(&state, &p, n)).collect();
        // Nodes lack the zone label, so only hostname counts: ln(4 + 2) ≈ 1.79
        // for a1's pod, plus maxSkew - 1 = 2; "bare" (no labels at all) is
        // not ignored but gets nothing.
        assert_eq!(scores, [4, 2, 2, 0]);
        PodTopologySpread.normalize(&state, &p, &mut scores);
        assert_eq!(scores, [0, 50, 50, 100]);
    }

    #[test]
    fn schedule_anyway_prefers_emptier_domains() {
        let mut nodes = cluster();
        nodes[0].add_pod(pod("w1", json!({})));
        nodes[1].add_pod(pod("w2", json!({})));
        let p = pod("w3", spread("zone", "ScheduleAnyway", json!({})));
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let mut state = CycleState::default();
        assert!(PodTopologySpread.pre_score(&mut state, &p, &refs, &Snapshot { nodes: &nodes }).is_success());
        let mut scores: Vec<i64> = nodes.iter().map(|n| PodTopologySpread.score(&state, &p, n)).collect();
        // ln(2 zones + 2) * 2 pods ≈ 2.77 → 3; zone b 0; "bare" ignored.
        assert_eq!(scores, [3, 3, 0, IGNORED]);
        PodTopologySpread.normalize(&state, &p, &mut scores);
        assert_eq!(scores, [0, 0, 100, 0]);
        // Hostname spreading counts on the node itself.
        let p = pod("w3", spread(HOSTNAME, "ScheduleAnyway", json!({})));
        let mut state = CycleState::default();
        assert!(PodTopologySpread.pre_score(&mut state, &p, &refs[..3], &Snapshot { nodes: &nodes }).is_success());
        let scores: Vec<i64> = nodes[..3].iter().map(|n| PodTopologySpread.score(&state, &p, n)).collect();
        assert_eq!(scores, [2, 2, 0]);
    }
}
