//! NodeAffinity: `spec.nodeSelector` and required node affinity filter
//! nodes; preferred node affinity terms score them by weight.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm};

use crate::scheduler::framework::{default_normalize, CycleState, FilterPlugin, ScorePlugin, Status};
use crate::scheduler::node_info::{NodeInfo, PodInfo};

pub const ERR_REASON: &str = "node(s) didn't match Pod's node affinity/selector";

/// One node selector requirement against a label value (or field value).
fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (value.and_then(number), values.first().and_then(|s| number(s))) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// A term matches when all its label and field requirements do; a term
/// with none matches nothing, as upstream.
pub fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.labels();
    exprs.iter().all(|r| requirement(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(node.name.as_str());
            requirement(r, value)
        })
}

/// nodeSelector and required node affinity, as upstream's
/// `GetRequiredNodeAffinity(pod).Match(node)`.
pub fn required_matches(pod: &PodInfo, node: &NodeInfo) -> bool {
    let spec = pod.pod.spec.as_ref();
    let selector: Option<&BTreeMap<String, String>> = spec.and_then(|s| s.node_selector.as_ref());
    let labels = node.labels();
    if !selector.into_iter().flatten().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)) {
        return false;
    }
    let required = spec
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    match required {
        Some(r) => r.node_selector_terms.iter().any(|t| term_matches(t, node)),
        None => true,
    }
}

pub struct NodeAffinity;

impl FilterPlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn filter(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        if required_matches(pod, node) {
            Status::success()
        } else {
            Status::unresolvable(ERR_REASON)
        }
    }
}

fn preferred(pod: &PodInfo) -> &[PreferredSchedulingTerm] {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_deref())
        .unwrap_or_default()
}

impl ScorePlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn score(&self, _state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        preferred(pod)
            .iter()
            .filter(|t| t.weight != 0 && term_matches(&t.preference, node))
            .map(|t| i64::from(t.weight))
            .sum()
    }

    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, scores: &mut [i64]) {
        default_normalize(scores, false);
    }
}
