//! The scheduling framework: the extension points a plugin implements
//! (PreFilter, Filter, PostFilter, PreScore, Score, NormalizeScore), the
//! state a cycle carries between them, and what a plugin answers.

use std::any::Any;
use std::sync::Arc;

use super::node_info::{NodeInfo, PodInfo};

/// The most a Score plugin gives a node (after normalizing).
pub const MAX_NODE_SCORE: i64 = 100;

/// Upstream's status codes, as far as the scheduler acts on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Success,
    /// The node does not fit now; preemption may help.
    Unschedulable,
    /// The node does not fit, and removing pods would not change that.
    UnschedulableAndUnresolvable,
    /// The plugin could not decide (a bug or bad input); the pod is retried.
    Error,
    /// PreFilter: this plugin has nothing to check for this pod.
    Skip,
}

/// A plugin's answer: a code and the reasons shown to users
/// ("Insufficient cpu", "node(s) didn't match Pod's node affinity/selector").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub reasons: Vec<String>,
    /// The plugin that answered (set by the profile that ran it), so a pod
    /// that fit nowhere knows which plugins to ask about cluster events.
    pub plugin: &'static str,
}

impl Status {
    pub fn success() -> Self {
        Status { code: Code::Success, reasons: Vec::new(), plugin: "" }
    }
    pub fn skip() -> Self {
        Status { code: Code::Skip, reasons: Vec::new(), plugin: "" }
    }
    pub fn unschedulable(reason: impl Into<String>) -> Self {
        Status { code: Code::Unschedulable, reasons: vec![reason.into()], plugin: "" }
    }
    pub fn unresolvable(reason: impl Into<String>) -> Self {
        Status { code: Code::UnschedulableAndUnresolvable, reasons: vec![reason.into()], plugin: "" }
    }
    pub fn error(reason: impl Into<String>) -> Self {
        Status { code: Code::Error, reasons: vec![reason.into()], plugin: "" }
    }
    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }
    /// The same answer, naming the plugin that gave it.
    pub fn from_plugin(mut self, plugin: &'static str) -> Self {
        self.plugin = plugin;
        self
    }
}

/// A change in the cluster that may let a pod that fit nowhere fit now
/// (upstream's ClusterEvent, with the object it is about).
pub enum ClusterEvent<'a> {
    /// A node was added, or changed in what scheduling looks at (labels,
    /// spec, allocatable, conditions); with the pods placed on it.
    Node(&'a NodeInfo),
    /// A pod was placed on a node.
    AssignedPodAdded(&'a PodInfo),
    /// A placed pod left its node (deleted or finished).
    AssignedPodDeleted(&'a PodInfo),
}

/// The kinds of `ClusterEvent`, for plugins to say which they care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Node = 0,
    AssignedPodAdded = 1,
    AssignedPodDeleted = 2,
}

/// How many kinds of `ClusterEvent` there are.
pub const EVENT_KINDS: usize = 3;

impl EventKind {
    /// Every kind, in the order of their indexes.
    pub const ALL: [EventKind; EVENT_KINDS] =
        [EventKind::Node, EventKind::AssignedPodAdded, EventKind::AssignedPodDeleted];
}

impl ClusterEvent<'_> {
    pub fn kind(&self) -> EventKind {
        match self {
            ClusterEvent::Node(_) => EventKind::Node,
            ClusterEvent::AssignedPodAdded(_) => EventKind::AssignedPodAdded,
            ClusterEvent::AssignedPodDeleted(_) => EventKind::AssignedPodDeleted,
        }
    }
}

/// Data a plugin keeps for one scheduling cycle (PreFilter → Filter, PreScore
/// → Score). Cloned when preemption tries the pod on a node with victims
/// removed.
pub trait StateData: Any + Send + Sync {
    fn clone_data(&self) -> Box<dyn StateData>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any + Clone + Send + Sync> StateData for T {
    fn clone_data(&self) -> Box<dyn StateData> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// What plugins write during one cycle, keyed by plugin name. A profile
/// has about ten plugins and Filter reads this for every node, so both are
/// short lists, not hash maps (hashing the names was 5 % of the server's
/// CPU in SchedulingBasic).
#[derive(Default)]
pub struct CycleState {
    data: Vec<(&'static str, Box<dyn StateData>)>,
    /// Filter plugins whose PreFilter answered `Skip`.
    skipped_filters: Vec<&'static str>,
}

impl Clone for CycleState {
    fn clone(&self) -> Self {
        CycleState {
            data: self.data.iter().map(|(k, v)| (*k, v.as_ref().clone_data())).collect(),
            skipped_filters: self.skipped_filters.clone(),
        }
    }
}

impl CycleState {
    pub fn write<T: StateData>(&mut self, key: &'static str, value: T) {
        match self.data.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = Box::new(value),
            None => self.data.push((key, Box::new(value))),
        }
    }
    pub fn read<T: 'static>(&self, key: &'static str) -> Option<&T> {
        self.data.iter().find(|(k, _)| *k == key).and_then(|(_, d)| d.as_ref().as_any().downcast_ref())
    }
    pub fn read_mut<T: 'static>(&mut self, key: &'static str) -> Option<&mut T> {
        self.data.iter_mut().find(|(k, _)| *k == key).and_then(|(_, d)| d.as_mut().as_any_mut().downcast_mut())
    }

    /// Leaves the filter plugin `name` out of this cycle's Filter.
    pub fn skip_filter(&mut self, name: &'static str) {
        if !self.skips_filter(name) {
            self.skipped_filters.push(name);
        }
    }

    /// Whether PreFilter left the filter plugin `name` out of this cycle.
    pub fn skips_filter(&self, name: &'static str) -> bool {
        self.skipped_filters.contains(&name)
    }
}

/// All nodes of the cluster as the scheduler sees them in this cycle.
pub struct Snapshot<'a> {
    pub nodes: &'a [NodeInfo],
}

/// A plugin that decides whether a pod fits a node.
pub trait FilterPlugin: Send + Sync {
    fn name(&self) -> &'static str;

    /// Runs once per cycle before any Filter. May write state, reject the
    /// pod outright, or answer `Skip` to be left out of Filter.
    fn pre_filter(&self, _state: &mut CycleState, _pod: &PodInfo, _snapshot: &Snapshot) -> Status {
        Status::success()
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status;

    /// PreFilterExtensions: keep the PreFilter state right when preemption
    /// adds or removes a pod on `node` (victims, nominated pods).
    fn add_pod(&self, _state: &mut CycleState, _pod: &PodInfo, _added: &PodInfo, _node: &NodeInfo) {}
    fn remove_pod(&self, _state: &mut CycleState, _pod: &PodInfo, _removed: &PodInfo, _node: &NodeInfo) {}

    /// Upstream's EventsToRegister: whether events of `kind` can ever let a
    /// pod this plugin rejected pass it. The default is every kind.
    fn registers(&self, _kind: EventKind) -> bool {
        true
    }

    /// Upstream's QueueingHint: whether `event` (of a kind the plugin
    /// registers) may let `pod`, which this plugin rejected, pass it now.
    /// `false` leaves the pod waiting for a better event.
    fn is_schedulable_after(&self, _pod: &PodInfo, _event: &ClusterEvent) -> bool {
        true
    }
}

/// The hint of a plugin that looks only at the node object: a node event
/// helps when the plugin lets the pod through on that node.
pub fn node_event_passes(plugin: &dyn FilterPlugin, pod: &PodInfo, event: &ClusterEvent) -> bool {
    match event {
        ClusterEvent::Node(node) => plugin.filter(&CycleState::default(), pod, node).is_success(),
        ClusterEvent::AssignedPodAdded(_) | ClusterEvent::AssignedPodDeleted(_) => false,
    }
}

/// A plugin that ranks the nodes a pod fits on.
pub trait ScorePlugin: Send + Sync {
    fn name(&self) -> &'static str;

    /// Runs once per cycle with the nodes that passed filtering.
    fn pre_score(&self, _state: &mut CycleState, _pod: &PodInfo, _nodes: &[&NodeInfo], _snapshot: &Snapshot) -> Status {
        Status::success()
    }

    /// 0..=MAX_NODE_SCORE, or any number if `normalize` rescales it.
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64;

    /// Rescales the scores of all nodes in place to 0..=MAX_NODE_SCORE.
    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, _scores: &mut [i64]) {}
}

/// Upstream's DefaultNormalizeScore: scales to 0..=MAX_NODE_SCORE by the
/// highest score, reversed when lower is better.
pub fn default_normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| *s = MAX_NODE_SCORE);
        }
        return;
    }
    for s in scores.iter_mut() {
        let v = MAX_NODE_SCORE * *s / max;
        *s = if reverse { MAX_NODE_SCORE - v } else { v };
    }
}

/// A node that failed filtering, and why.
#[derive(Debug, Clone)]
pub struct NodeFailure {
    pub node: String,
    pub status: Status,
}

/// What preemption needs to judge a pod that fit nowhere.
pub struct FitError<'a> {
    pub pod: &'a Arc<PodInfo>,
    pub failures: &'a [NodeFailure],
}
