//! A scheduling profile: the plugins a `schedulerName` runs, and how one
//! pod goes through them (PreFilter, Filter over the nodes, PreScore, Score,
//! NormalizeScore, weights).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::framework::{
    ClusterEvent, Code, CycleState, EventKind, FilterPlugin, NodeFailure, ScorePlugin, Snapshot, Status, EVENT_KINDS,
};
use super::node_info::{NodeInfo, PodInfo};
use super::plugins::{self, node_resources_fit::ScoringStrategy};

pub struct Profile {
    pub scheduler_name: String,
    pub filters: Vec<Arc<dyn FilterPlugin>>,
    pub scores: Vec<(Arc<dyn ScorePlugin>, i64)>,
    /// Whether DefaultPreemption runs for pods that fit nowhere.
    pub preemption: bool,
    /// percentageOfNodesToScore; `None` is upstream's adaptive default.
    pub percentage_of_nodes_to_score: Option<u32>,
}

/// What filtering found for one pod.
pub struct Feasible {
    /// Indexes into the snapshot's nodes.
    pub nodes: Vec<usize>,
    pub failures: Vec<NodeFailure>,
    /// How many nodes were looked at (for the round-robin start).
    pub processed: usize,
}

impl Profile {
    /// The default profile with upstream's plugins and weights.
    pub fn new(scheduler_name: &str, strategy: ScoringStrategy) -> Self {
        Profile {
            scheduler_name: scheduler_name.to_string(),
            filters: plugins::DEFAULT_FILTERS.iter().filter_map(|n| plugins::filter_plugin(n, strategy)).collect(),
            scores: plugins::DEFAULT_SCORES
                .iter()
                .filter_map(|(n, w)| plugins::score_plugin(n, strategy).map(|p| (p, *w)))
                .collect(),
            preemption: true,
            percentage_of_nodes_to_score: None,
        }
    }

    /// Runs every PreFilter; an error or rejection ends the cycle.
    pub fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, snapshot: &Snapshot) -> Result<(), Status> {
        for f in &self.filters {
            let status = f.pre_filter(state, pod, snapshot);
            match status.code {
                Code::Success => {}
                Code::Skip => {
                    state.skip_filter(f.name());
                }
                _ => return Err(status.from_plugin(f.name())),
            }
        }
        Ok(())
    }

    /// Runs the Filter plugins on one node; the first failure answers.
    pub fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        run_filters(&self.active_filters(state), state, pod, node)
    }

    /// The Filter plugins PreFilter left in this cycle, found once for all
    /// the nodes the cycle filters.
    fn active_filters(&self, state: &CycleState) -> Vec<&dyn FilterPlugin> {
        self.filters.iter().filter(|f| !state.skips_filter(f.name())).map(|f| &**f).collect()
    }

    /// The filter plugin called `name`, if this profile runs it.
    fn filter_named(&self, name: &str) -> Option<&Arc<dyn FilterPlugin>> {
        self.filters.iter().find(|f| f.name() == name)
    }

    /// Whether `event` may let `pod` fit, asking the plugins that rejected
    /// it in its last cycle (upstream's queueing hints). A pod no plugin
    /// rejected (there was no node at all) is woken by any event.
    pub fn is_schedulable_after(&self, pod: &PodInfo, rejected_by: &[&'static str], event: &ClusterEvent) -> bool {
        rejected_by.is_empty()
            || rejected_by.iter().any(|name| {
                self.filter_named(name).is_none_or(|f| f.registers(event.kind()) && f.is_schedulable_after(pod, event))
            })
    }

    /// Which kinds of event may let a pod rejected by `rejected_by` fit,
    /// indexed by `EventKind as usize`.
    pub fn registered_kinds(&self, rejected_by: &[&'static str]) -> [bool; EVENT_KINDS] {
        EventKind::ALL.map(|kind| {
            rejected_by.is_empty()
                || rejected_by.iter().any(|name| self.filter_named(name).is_none_or(|f| f.registers(kind)))
        })
    }

    /// The Filter plugins with the pods nominated to this node that are at
    /// least as important as `pod` counted as if already there (upstream's
    /// RunFilterPluginsWithNominatedPods: the pod must fit both with and
    /// without them).
    pub fn filter_with_nominated(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        nominated: &[Arc<PodInfo>],
    ) -> Status {
        let mut relevant = nominated.iter().filter(|p| p.uid != pod.uid && p.priority >= pod.priority).peekable();
        if relevant.peek().is_some() {
            let mut node = node.clone();
            let mut state = state.clone();
            for p in relevant {
                node.add_pod(p.clone());
                for f in &self.filters {
                    f.add_pod(&mut state, pod, p, &node);
                }
            }
            let status = self.filter(&state, pod, &node);
            if !status.is_success() {
                return status;
            }
        }
        self.filter(state, pod, node)
    }

    /// How many feasible nodes are enough, as upstream's
    /// `numFeasibleNodesToFind`.
    pub fn nodes_to_find(&self, all: usize) -> usize {
        const MIN_FEASIBLE: usize = 100;
        if all < MIN_FEASIBLE {
            return all;
        }
        let percentage = match self.percentage_of_nodes_to_score {
            Some(p) if p > 0 => p as usize,
            _ => (50usize.saturating_sub(all / 125)).max(5),
        };
        if percentage >= 100 {
            return all;
        }
        (all * percentage / 100).max(MIN_FEASIBLE)
    }

    /// Filters the nodes starting at `start` (round-robin across cycles),
    /// stopping once enough feasible nodes are found. `nominated`: pods
    /// nominated to each node by earlier preemptions.
    pub fn find_feasible(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        start: usize,
        nominated: &HashMap<String, Vec<Arc<PodInfo>>>,
    ) -> Feasible {
        let all = snapshot.nodes.len();
        let want = self.nodes_to_find(all);
        let mut out = Feasible { nodes: Vec::new(), failures: Vec::new(), processed: 0 };
        let filters = self.active_filters(state);
        for i in 0..all {
            let index = (start + i) % all;
            let node = &snapshot.nodes[index];
            out.processed += 1;
            let status = match nominated.get(&node.name) {
                Some(pods) => self.filter_with_nominated(state, pod, node, pods),
                None => run_filters(&filters, state, pod, node),
            };
            if status.is_success() {
                out.nodes.push(index);
                if out.nodes.len() >= want {
                    break;
                }
            } else {
                out.failures.push(NodeFailure { node: node.name.clone(), status });
            }
        }
        out
    }

    /// Weighted, normalized total score of each feasible node.
    pub fn score(&self, state: &mut CycleState, pod: &PodInfo, snapshot: &Snapshot, feasible: &[usize]) -> Vec<i64> {
        let nodes: Vec<&NodeInfo> = feasible.iter().map(|i| &snapshot.nodes[*i]).collect();
        let mut totals = vec![0i64; nodes.len()];
        if nodes.len() < 2 {
            return totals;
        }
        for (plugin, weight) in &self.scores {
            if !plugin.pre_score(state, pod, &nodes, snapshot).is_success() {
                continue;
            }
            let mut scores: Vec<i64> = nodes.iter().map(|n| plugin.score(state, pod, n)).collect();
            plugin.normalize(state, pod, &mut scores);
            for (t, s) in totals.iter_mut().zip(scores) {
                *t += s * weight;
            }
        }
        totals
    }
}

/// Runs `filters` on one node; the first failure answers.
fn run_filters(filters: &[&dyn FilterPlugin], state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
    for f in filters {
        let status = f.filter(state, pod, node);
        if !status.is_success() {
            return status.from_plugin(f.name());
        }
    }
    Status::success()
}

/// Upstream's FitError message: "0/3 nodes are available: 1 Insufficient
/// cpu, 2 node(s) had untolerated taint {a: b}." with reasons counted over
/// nodes and sorted.
pub fn fit_error_message(all_nodes: usize, failures: &[NodeFailure]) -> String {
    if all_nodes == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for f in failures {
        for r in &f.status.reasons {
            *counts.entry(r.as_str()).or_default() += 1;
        }
    }
    let mut reasons: Vec<String> = counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
    reasons.sort();
    format!("0/{all_nodes} nodes are available: {}.", reasons.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feasible_node_count_follows_upstream() {
        let p = Profile::new("default-scheduler", ScoringStrategy::LeastAllocated);
        assert_eq!(p.nodes_to_find(50), 50);
        assert_eq!(p.nodes_to_find(1000), 420);
        assert_eq!(p.nodes_to_find(5000), 500);
        assert_eq!(p.nodes_to_find(150), 100);
    }

    #[test]
    fn fit_error_reads_as_upstream() {
        let f = |node: &str, reason: &str| NodeFailure { node: node.into(), status: Status::unschedulable(reason) };
        let failures = vec![
            f("a", "Insufficient cpu"),
            f("b", "node(s) had untolerated taint {k: v}"),
            f("c", "Insufficient cpu"),
        ];
        assert_eq!(
            fit_error_message(3, &failures),
            "0/3 nodes are available: 1 node(s) had untolerated taint {k: v}, 2 Insufficient cpu."
        );
    }
}
