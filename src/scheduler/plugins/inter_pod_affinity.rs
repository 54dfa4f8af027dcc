//! InterPodAffinity: required pod affinity and anti-affinity terms filter
//! nodes (the pod's own terms, and existing pods' required anti-affinity
//! against the pod); preferred terms (the pod's and existing pods') and
//! existing pods' required affinity score them.
//!
//! Namespace selectors are matched against the one label every namespace
//! carries, `kubernetes.io/metadata.name`: the scheduler has no namespace
//! informer, so selectors on other namespace labels select nothing (an
//! empty selector `{}` still selects every namespace, as upstream).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{PodAffinityTerm, WeightedPodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use crate::client::labels;
use crate::scheduler::framework::{CycleState, FilterPlugin, ScorePlugin, Snapshot, Status, MAX_NODE_SCORE};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

pub const NAME: &str = "InterPodAffinity";
pub const ERR_AFFINITY: &str = "node(s) didn't match pod affinity rules";
pub const ERR_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
pub const ERR_EXISTING_ANTI_AFFINITY: &str = "node(s) didn't satisfy existing pods anti-affinity rules";

/// Upstream's default `hardPodAffinityWeight`.
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;
const SCORE_KEY: &str = "PreScoreInterPodAffinity";

/// A pod affinity term with its namespaces resolved for the pod that owns it.
#[derive(Debug, Clone)]
pub struct AffinityTerm {
    /// `None` selects no pod (a term without labelSelector).
    selector: Option<LabelSelector>,
    namespaces: Vec<String>,
    /// `None` selects no namespace beyond `namespaces`.
    namespace_selector: Option<LabelSelector>,
    pub topology_key: String,
    pub weight: i64,
}

/// The labels the scheduler knows of a namespace.
fn namespace_labels(namespace: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("kubernetes.io/metadata.name".to_string(), namespace.to_string())])
}

impl AffinityTerm {
    fn new(term: &PodAffinityTerm, owner: &PodInfo, weight: i64) -> Self {
        let mut namespaces = term.namespaces.clone().unwrap_or_default();
        if namespaces.is_empty() && term.namespace_selector.is_none() {
            namespaces.push(owner.namespace.clone());
        }
        // matchLabelKeys / mismatchLabelKeys: the owner's values of those
        // labels join the selector (In / NotIn), as the API server merges them.
        let mut selector = term.label_selector.clone();
        if let (Some(sel), Some(owner_labels)) = (selector.as_mut(), owner.labels()) {
            let keys = |k: &Option<Vec<String>>, op: &str| -> Vec<LabelSelectorRequirement> {
                k.iter()
                    .flatten()
                    .filter_map(|key| {
                        owner_labels.get(key).map(|v| LabelSelectorRequirement {
                            key: key.clone(),
                            operator: op.to_string(),
                            values: Some(vec![v.clone()]),
                        })
                    })
                    .collect()
            };
            let extra: Vec<_> = keys(&term.match_label_keys, "In")
                .into_iter()
                .chain(keys(&term.mismatch_label_keys, "NotIn"))
                .collect();
            if !extra.is_empty() {
                sel.match_expressions.get_or_insert_with(Vec::new).extend(extra);
            }
        }
        AffinityTerm {
            selector,
            namespaces,
            namespace_selector: term.namespace_selector.clone(),
            topology_key: term.topology_key.clone(),
            weight,
        }
    }

    /// Whether `pod` is one of the pods this term selects.
    pub fn matches(&self, pod: &PodInfo) -> bool {
        let in_namespace = self.namespaces.contains(&pod.namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| labels::matches(s, Some(&namespace_labels(&pod.namespace))));
        in_namespace && self.selector.as_ref().is_some_and(|s| labels::matches(s, pod.labels()))
    }
}

/// A pod's affinity terms, resolved.
#[derive(Debug, Clone, Default)]
pub struct PodTerms {
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
    pub preferred_affinity: Vec<AffinityTerm>,
    pub preferred_anti_affinity: Vec<AffinityTerm>,
}

impl PodTerms {
    pub fn of(pod: &PodInfo) -> Self {
        let Some(affinity) = pod.pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
            return PodTerms::default();
        };
        let required = |terms: Option<&Vec<PodAffinityTerm>>| {
            terms.into_iter().flatten().map(|t| AffinityTerm::new(t, pod, 1)).collect()
        };
        let preferred = |terms: Option<&Vec<WeightedPodAffinityTerm>>| {
            terms
                .into_iter()
                .flatten()
                .map(|t| AffinityTerm::new(&t.pod_affinity_term, pod, i64::from(t.weight)))
                .collect()
        };
        let a = affinity.pod_affinity.as_ref();
        let anti = affinity.pod_anti_affinity.as_ref();
        PodTerms {
            required_affinity: required(a.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())),
            required_anti_affinity: required(
                anti.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()),
            ),
            preferred_affinity: preferred(
                a.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
            ),
            preferred_anti_affinity: preferred(
                anti.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
            ),
        }
    }
}

/// (topology key, value) → how many matching pods (or terms) are there.
type TopologyCounts = HashMap<(String, String), i64>;

fn bump(counts: &mut TopologyCounts, key: &str, node: &NodeInfo, delta: i64) {
    let Some(value) = node.labels().and_then(|l| l.get(key)) else { return };
    let entry = counts.entry((key.to_string(), value.clone())).or_default();
    *entry += delta;
    if *entry == 0 {
        counts.remove(&(key.to_string(), value.clone()));
    }
}

/// `existing` on `node` counts for every affinity term's topology when it
/// matches all the terms.
fn update_with_affinity_terms(
    counts: &mut TopologyCounts,
    existing: &PodInfo,
    node: &NodeInfo,
    terms: &[AffinityTerm],
    delta: i64,
) {
    if terms.iter().all(|t| t.matches(existing)) {
        for t in terms {
            bump(counts, &t.topology_key, node, delta);
        }
    }
}

/// Each anti-affinity term that selects `target` counts for its topology.
fn update_with_anti_affinity_terms(
    counts: &mut TopologyCounts,
    target: &PodInfo,
    node: &NodeInfo,
    terms: &[AffinityTerm],
    delta: i64,
) {
    for t in terms.iter().filter(|t| t.matches(target)) {
        bump(counts, &t.topology_key, node, delta);
    }
}

/// What PreFilter computed for the incoming pod.
#[derive(Debug, Clone)]
struct PreFilterState {
    terms: PodTerms,
    /// Topologies where an existing pod's required anti-affinity selects the pod.
    existing_anti_affinity: TopologyCounts,
    /// Topologies holding pods that match all the pod's required affinity terms.
    affinity: TopologyCounts,
    /// Topologies holding pods that one of the pod's anti-affinity terms selects.
    anti_affinity: TopologyCounts,
}

impl PreFilterState {
    fn update_with_pod(&mut self, incoming: &PodInfo, other: &PodInfo, node: &NodeInfo, delta: i64) {
        if other.has_required_anti_affinity {
            let terms = PodTerms::of(other);
            update_with_anti_affinity_terms(
                &mut self.existing_anti_affinity,
                incoming,
                node,
                &terms.required_anti_affinity,
                delta,
            );
        }
        update_with_affinity_terms(&mut self.affinity, other, node, &self.terms.required_affinity, delta);
        update_with_anti_affinity_terms(
            &mut self.anti_affinity,
            other,
            node,
            &self.terms.required_anti_affinity,
            delta,
        );
    }
}

pub struct InterPodAffinity;

impl InterPodAffinity {
    fn satisfies_affinity(s: &PreFilterState, pod: &PodInfo, node: &NodeInfo) -> bool {
        let labels = node.labels();
        let mut pods_exist = true;
        for t in &s.terms.required_affinity {
            // The node must have every topology the terms name.
            let Some(value) = labels.and_then(|l| l.get(&t.topology_key)) else { return false };
            if s.affinity.get(&(t.topology_key.clone(), value.clone())).copied().unwrap_or(0) <= 0 {
                pods_exist = false;
            }
        }
        // The first pod of a group with affinity to itself may go anywhere
        // the topologies exist, when no pod anywhere matches yet.
        pods_exist || (s.affinity.is_empty() && s.terms.required_affinity.iter().all(|t| t.matches(pod)))
    }

    fn satisfies_anti_affinity(s: &PreFilterState, node: &NodeInfo) -> bool {
        let labels = node.labels();
        !s.terms.required_anti_affinity.iter().any(|t| {
            labels
                .and_then(|l| l.get(&t.topology_key))
                .is_some_and(|v| s.anti_affinity.get(&(t.topology_key.clone(), v.clone())).is_some_and(|n| *n > 0))
        })
    }

    fn satisfies_existing_anti_affinity(s: &PreFilterState, node: &NodeInfo) -> bool {
        let labels = node.labels();
        !s.existing_anti_affinity.iter().any(|((k, v), n)| *n > 0 && labels.and_then(|l| l.get(k)) == Some(v))
    }
}

impl FilterPlugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        NAME
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, snapshot: &Snapshot) -> Status {
        let terms = PodTerms::of(pod);
        let own = !terms.required_affinity.is_empty() || !terms.required_anti_affinity.is_empty();
        let mut s = PreFilterState {
            terms,
            existing_anti_affinity: TopologyCounts::new(),
            affinity: TopologyCounts::new(),
            anti_affinity: TopologyCounts::new(),
        };
        for node in snapshot.nodes {
            if node.pods_with_required_anti_affinity > 0 {
                for existing in node.pods.iter().filter(|p| p.has_required_anti_affinity) {
                    let terms = PodTerms::of(existing);
                    update_with_anti_affinity_terms(
                        &mut s.existing_anti_affinity,
                        pod,
                        node,
                        &terms.required_anti_affinity,
                        1,
                    );
                }
            }
            if own {
                for existing in &node.pods {
                    update_with_affinity_terms(&mut s.affinity, existing, node, &s.terms.required_affinity, 1);
                    update_with_anti_affinity_terms(
                        &mut s.anti_affinity,
                        existing,
                        node,
                        &s.terms.required_anti_affinity,
                        1,
                    );
                }
            }
        }
        if !own && s.existing_anti_affinity.is_empty() {
            return Status::skip();
        }
        state.write(NAME, s);
        Status::success()
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = state.read::<PreFilterState>(NAME) else {
            return Status::error("InterPodAffinity: no PreFilter state");
        };
        if !Self::satisfies_affinity(s, pod, node) {
            return Status::unresolvable(ERR_AFFINITY);
        }
        if !Self::satisfies_anti_affinity(s, node) {
            return Status::unschedulable(ERR_ANTI_AFFINITY);
        }
        if !Self::satisfies_existing_anti_affinity(s, node) {
            return Status::unschedulable(ERR_EXISTING_ANTI_AFFINITY);
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

/// topology key → value → score every node in that topology gets.
#[derive(Debug, Clone, Default)]
struct ScoreState {
    topology_score: HashMap<String, HashMap<String, i64>>,
}

impl ScoreState {
    fn process_terms(&mut self, terms: &[AffinityTerm], target: &PodInfo, node: &NodeInfo, sign: i64) {
        for t in terms {
            self.process_term(t, t.weight, target, node, sign);
        }
    }

    fn process_term(&mut self, term: &AffinityTerm, weight: i64, target: &PodInfo, node: &NodeInfo, sign: i64) {
        if !term.matches(target) {
            return;
        }
        if let Some(value) = node.labels().and_then(|l| l.get(&term.topology_key)) {
            *self.topology_score.entry(term.topology_key.clone()).or_default().entry(value.clone()).or_default() +=
                weight * sign;
        }
    }

    fn process_existing_pod(&mut self, terms: &PodTerms, incoming: &PodInfo, existing: &PodInfo, node: &NodeInfo) {
        if node.labels().is_none_or(BTreeMap::is_empty) {
            return;
        }
        self.process_terms(&terms.preferred_affinity, existing, node, 1);
        self.process_terms(&terms.preferred_anti_affinity, existing, node, -1);
        if !existing.has_pod_affinity {
            return;
        }
        let theirs = PodTerms::of(existing);
        for t in &theirs.required_affinity {
            self.process_term(t, HARD_POD_AFFINITY_WEIGHT, incoming, node, 1);
        }
        self.process_terms(&theirs.preferred_affinity, incoming, node, 1);
        self.process_terms(&theirs.preferred_anti_affinity, incoming, node, -1);
    }
}

impl ScorePlugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        NAME
    }

    fn pre_score(&self, state: &mut CycleState, pod: &PodInfo, _nodes: &[&NodeInfo], snapshot: &Snapshot) -> Status {
        let terms = PodTerms::of(pod);
        let has_constraints = !terms.preferred_affinity.is_empty() || !terms.preferred_anti_affinity.is_empty();
        let mut s = ScoreState::default();
        for node in snapshot.nodes {
            // Without preferences of its own, only pods with affinity matter.
            if !has_constraints && node.pods_with_affinity == 0 {
                continue;
            }
            for existing in node.pods.iter().filter(|p| has_constraints || p.has_pod_affinity) {
                s.process_existing_pod(&terms, pod, existing, node);
            }
        }
        if s.topology_score.is_empty() {
            return Status::skip();
        }
        state.write(SCORE_KEY, s);
        Status::success()
    }

    fn score(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> i64 {
        let (Some(s), Some(labels)) = (state.read::<ScoreState>(SCORE_KEY), node.labels()) else { return 0 };
        s.topology_score.iter().filter_map(|(key, values)| labels.get(key).and_then(|v| values.get(v))).sum()
    }

    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, scores: &mut [i64]) {
        let (Some(min), Some(max)) = (scores.iter().copied().min(), scores.iter().copied().max()) else { return };
        let diff = max - min;
        for s in scores.iter_mut() {
            *s = if diff > 0 { (MAX_NODE_SCORE as f64 * ((*s - min) as f64 / diff as f64)) as i64 } else { 0 };
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

    pub fn node(name: &str, labels: serde_json::Value) -> NodeInfo {
        let n: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        NodeInfo::new(Arc::new(n))
    }

    pub fn pod(name: &str, labels: serde_json::Value, affinity: serde_json::Value) -> Arc<PodInfo> {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name, "labels": labels},
            "spec": {"containers": [{"name": "c"}], "affinity": affinity}
        }))
        .unwrap();
        Arc::new(PodInfo::new(Arc::new(p)))
    }

    fn term(app: &str, key: &str) -> serde_json::Value {
        json!({"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key})
    }

    fn run(pod: &PodInfo, nodes: &[NodeInfo]) -> (CycleState, Status, Vec<Status>) {
        let mut state = CycleState::default();
        let pre = InterPodAffinity.pre_filter(&mut state, pod, &Snapshot { nodes });
        let statuses = if pre.code == Code::Success {
            nodes.iter().map(|n| InterPodAffinity.filter(&state, pod, n)).collect()
        } else {
            Vec::new()
        };
        (state, pre, statuses)
    }

    fn zones() -> Vec<NodeInfo> {
        vec![
            node("a1", json!({"zone": "a", "kubernetes.io/hostname": "a1"})),
            node("a2", json!({"zone": "a", "kubernetes.io/hostname": "a2"})),
            node("b1", json!({"zone": "b", "kubernetes.io/hostname": "b1"})),
        ]
    }

    #[test]
    fn skipped_when_nobody_has_affinity() {
        let mut nodes = zones();
        nodes[0].add_pod(pod("x", json!({"app": "db"}), json!(null)));
        let (_, pre, _) = run(&pod("p", json!({}), json!(null)), &nodes);
        assert_eq!(pre.code, Code::Skip);
    }

    #[test]
    fn required_affinity_follows_matching_pods_by_topology() {
        let mut nodes = zones();
        nodes[1].add_pod(pod("db", json!({"app": "db"}), json!(null)));
        let p = pod(
            "web",
            json!({"app": "web"}),
            json!({"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term("db", "zone")]}}),
        );
        let (_, _, st) = run(&p, &nodes);
        assert!(st[0].is_success() && st[1].is_success());
        assert_eq!(st[2], Status::unresolvable(ERR_AFFINITY));
        // A node without the topology label never matches.
        nodes.push(node("bare", json!({})));
        let (_, _, st) = run(&p, &nodes);
        assert_eq!(st[3].code, Code::UnschedulableAndUnresolvable);
    }

    #[test]
    fn first_pod_with_affinity_to_itself_may_schedule() {
        let nodes = zones();
        let self_affine = pod(
            "web",
            json!({"app": "web"}),
            json!({"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term("web", "zone")]}}),
        );
        let (_, _, st) = run(&self_affine, &nodes);
        assert!(st.iter().all(Status::is_success));
        let other = pod(
            "web",
            json!({"app": "web"}),
            json!({"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term("db", "zone")]}}),
        );
        let (_, _, st) = run(&other, &nodes);
        assert!(st.iter().all(|s| s.code == Code::UnschedulableAndUnresolvable));
    }

    #[test]
    fn anti_affinity_both_ways_and_preemption_updates() {
        let mut nodes = zones();
        let anti = json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term("web", "kubernetes.io/hostname")]}});
        let first = pod("web-1", json!({"app": "web"}), anti.clone());
        nodes[0].add_pod(first.clone());
        // The incoming pod's own anti-affinity.
        let (mut state, _, st) = run(&pod("web-2", json!({"app": "web"}), anti.clone()), &nodes);
        assert_eq!(st[0], Status::unschedulable(ERR_ANTI_AFFINITY));
        assert!(st[1].is_success() && st[2].is_success());
        // Removing the pod (preemption's dry run) frees the node.
        let incoming = pod("web-2", json!({"app": "web"}), anti.clone());
        let mut copy = nodes[0].clone();
        copy.remove_pod("web-1");
        InterPodAffinity.remove_pod(&mut state, &incoming, &first, &copy);
        assert!(InterPodAffinity.filter(&state, &incoming, &copy).is_success());
        InterPodAffinity.add_pod(&mut state, &incoming, &first, &nodes[0]);
        assert!(!InterPodAffinity.filter(&state, &incoming, &nodes[0]).is_success());
        // The existing pod's anti-affinity against a pod without any.
        let (_, _, st) = run(&pod("plain", json!({"app": "web"}), json!(null)), &nodes);
        assert_eq!(st[0], Status::unschedulable(ERR_EXISTING_ANTI_AFFINITY));
        assert!(st[1].is_success());
        // Other namespaces are not selected by default.
        let mut other_ns = (*pod("plain", json!({"app": "web"}), json!(null)).pod).clone();
        other_ns.metadata.namespace = Some("other".into());
        let (_, pre, _) = run(&PodInfo::new(Arc::new(other_ns)), &nodes);
        assert_eq!(pre.code, Code::Skip);
    }

    #[test]
    fn namespace_selector_and_namespaces() {
        let mut nodes = zones();
        let mut db = (*pod("db", json!({"app": "db"}), json!(null)).pod).clone();
        db.metadata.namespace = Some("data".into());
        nodes[2].add_pod(Arc::new(PodInfo::new(Arc::new(db))));
        let with = |extra: serde_json::Value| {
            let mut t = term("db", "zone");
            t.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            pod(
                "web",
                json!({"app": "web"}),
                json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [t]}}),
            )
        };
        let (_, _, st) = run(&with(json!({})), &nodes);
        assert!(!st[2].is_success());
        let (_, _, st) = run(&with(json!({"namespaces": ["data"]})), &nodes);
        assert!(st[2].is_success() && !st[0].is_success());
        let (_, _, st) = run(&with(json!({"namespaceSelector": {}})), &nodes);
        assert!(st[2].is_success());
        let sel = json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "data"}}});
        let (_, _, st) = run(&with(sel), &nodes);
        assert!(st[2].is_success());
    }

    #[test]
    fn preferred_terms_score_and_normalize() {
        let mut nodes = zones();
        nodes[0].add_pod(pod("db", json!({"app": "db"}), json!(null)));
        nodes[2].add_pod(pod("cache", json!({"app": "cache"}), json!(null)));
        let p = pod(
            "web",
            json!({"app": "web"}),
            json!({
                "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "podAffinityTerm": term("db", "zone")}]},
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 5, "podAffinityTerm": term("cache", "kubernetes.io/hostname")}]}
            }),
        );
        let mut state = CycleState::default();
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        assert!(InterPodAffinity.pre_score(&mut state, &p, &refs, &Snapshot { nodes: &nodes }).is_success());
        let mut scores: Vec<i64> = nodes.iter().map(|n| InterPodAffinity.score(&state, &p, n)).collect();
        assert_eq!(scores, [10, 10, -5]);
        InterPodAffinity.normalize(&state, &p, &mut scores);
        assert_eq!(scores, [100, 100, 0]);
        // An existing pod's preferred anti-affinity against the incoming pod.
        let mut nodes = zones();
        nodes[1].add_pod(pod("loner", json!({}), json!({"podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 7, "podAffinityTerm": term("web", "zone")}]}})));
        let plain = pod("web", json!({"app": "web"}), json!(null));
        let mut state = CycleState::default();
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        assert!(InterPodAffinity.pre_score(&mut state, &plain, &refs, &Snapshot { nodes: &nodes }).is_success());
        let scores: Vec<i64> = nodes.iter().map(|n| InterPodAffinity.score(&state, &plain, n)).collect();
        assert_eq!(scores, [-7, -7, 0]);
    }
}
