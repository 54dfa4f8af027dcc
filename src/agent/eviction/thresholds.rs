//! Threshold arithmetic (upstream's eviction helpers): which thresholds an
//! observation meets, since when, which have been met for their grace
//! period (soft ones), and which node conditions hold — a condition stays
//! true for `evictionPressureTransitionPeriod` after its last threshold
//! stopped being met, so the node does not flap.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::signals::Observations;
use crate::agent::config::{KubeletConfig, Signal, Threshold};
use crate::agent::node_status::NodePressure;

/// A configured threshold: hard (no grace) or soft (with its grace period).
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionThreshold {
    pub threshold: Threshold,
    pub hard: bool,
    pub grace: Duration,
}

impl EvictionThreshold {
    pub fn signal(&self) -> Signal {
        self.threshold.signal
    }

    /// The amount below which the signal meets this threshold.
    pub fn amount(&self, capacity: i64) -> i64 {
        self.threshold.value.amount(capacity)
    }

    fn key(&self) -> (Signal, bool) {
        (self.threshold.signal, self.hard)
    }
}

/// The hard and soft thresholds of the kubelet settings.
pub fn configured(config: &KubeletConfig) -> Vec<EvictionThreshold> {
    let hard = config.eviction_hard.iter().map(|t| EvictionThreshold {
        threshold: t.clone(),
        hard: true,
        grace: Duration::ZERO,
    });
    let soft = config.eviction_soft.iter().map(|t| EvictionThreshold {
        threshold: t.clone(),
        hard: false,
        grace: config.eviction_soft_grace_period.get(&t.signal).copied().unwrap_or_default(),
    });
    hard.chain(soft).collect()
}

/// Whether the observation is past the threshold (available strictly below it).
pub fn is_met(t: &EvictionThreshold, observations: &Observations) -> bool {
    observations.get(&t.signal()).is_some_and(|o| t.amount(o.capacity) > o.available)
}

/// The thresholds met now.
pub fn met(thresholds: &[EvictionThreshold], observations: &Observations) -> Vec<EvictionThreshold> {
    thresholds.iter().filter(|t| is_met(t, observations)).cloned().collect()
}

/// The node condition a signal drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pressure {
    Memory,
    Disk,
    Pid,
}

pub fn pressure_of(signal: Signal) -> Pressure {
    match signal {
        Signal::MemoryAvailable => Pressure::Memory,
        Signal::PidAvailable => Pressure::Pid,
        _ => Pressure::Disk,
    }
}

/// What the manager remembers between passes.
#[derive(Debug, Default)]
pub struct ThresholdState {
    /// When each threshold (signal, hard) was first seen met, while it stays met.
    first_observed: HashMap<(Signal, bool), Instant>,
    /// When each condition was last seen.
    condition_last_observed: HashMap<Pressure, Instant>,
}

impl ThresholdState {
    /// Records the thresholds met now; returns those met for at least their grace period.
    pub fn met_for_grace(&mut self, met: &[EvictionThreshold], now: Instant) -> Vec<EvictionThreshold> {
        self.first_observed.retain(|k, _| met.iter().any(|t| t.key() == *k));
        for t in met {
            self.first_observed.entry(t.key()).or_insert(now);
        }
        met.iter()
            .filter(|t| {
                self.first_observed.get(&t.key()).is_some_and(|since| now.saturating_duration_since(*since) >= t.grace)
            })
            .cloned()
            .collect()
    }

    /// The node's conditions: those of the thresholds met now (grace periods
    /// do not delay them), kept for `transition` after they were last seen.
    pub fn pressure(&mut self, met: &[EvictionThreshold], now: Instant, transition: Duration) -> NodePressure {
        for t in met {
            self.condition_last_observed.insert(pressure_of(t.signal()), now);
        }
        self.condition_last_observed
            .retain(|_, seen| now.saturating_duration_since(*seen) < transition || *seen == now);
        let on = |p: Pressure| self.condition_last_observed.contains_key(&p);
        NodePressure { memory: on(Pressure::Memory), disk: on(Pressure::Disk), pid: on(Pressure::Pid) }
    }
}

/// The order thresholds are acted on: memory before everything else (upstream's byEvictionPriority).
pub fn by_eviction_priority(thresholds: &mut [EvictionThreshold]) {
    thresholds.sort_by_key(|t| t.signal() != Signal::MemoryAvailable);
}

#[cfg(test)]
mod tests {
    use super::super::signals::Observation;
    use super::*;
    use crate::agent::config::ThresholdValue;

    fn obs(signal: Signal, available: i64, capacity: i64) -> Observations {
        Observations::from([(signal, Observation { available, capacity })])
    }

    fn threshold(args: &[&str]) -> Vec<EvictionThreshold> {
        let mut c = KubeletConfig::default();
        c.apply_args(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        configured(&c)
    }

    #[test]
    fn quantities_and_percentages() {
        let t = threshold(&["eviction-hard=memory.available<100Mi,nodefs.available<10%"]);
        assert_eq!(t.len(), 2);
        assert!(is_met(&t[0], &obs(Signal::MemoryAvailable, (100 << 20) - 1, 1 << 30)));
        assert!(!is_met(&t[0], &obs(Signal::MemoryAvailable, 100 << 20, 1 << 30)));
        assert!(is_met(&t[1], &obs(Signal::NodeFsAvailable, 99, 1000)));
        assert!(!is_met(&t[1], &obs(Signal::NodeFsAvailable, 100, 1000)));
        // A signal not observed meets nothing.
        assert!(!is_met(&t[1], &obs(Signal::MemoryAvailable, 0, 1000)));
        assert_eq!(t[1].threshold.value, ThresholdValue::Percentage(0.10));
    }

    #[test]
    fn soft_thresholds_wait_their_grace_period() {
        let all = threshold(&[
            "eviction-hard=memory.available<100Mi",
            "eviction-soft=memory.available<1Gi",
            "eviction-soft-grace-period=memory.available=30s",
        ]);
        let mut st = ThresholdState::default();
        let t0 = Instant::now();
        let low = obs(Signal::MemoryAvailable, 500 << 20, 4 << 30);
        let m = met(&all, &low);
        assert_eq!(m.len(), 1);
        assert!(!m[0].hard);
        assert!(st.met_for_grace(&m, t0).is_empty());
        assert!(st.met_for_grace(&m, t0 + Duration::from_secs(29)).is_empty());
        assert_eq!(st.met_for_grace(&m, t0 + Duration::from_secs(30)).len(), 1);
        // Recovering resets the clock.
        assert!(st.met_for_grace(&[], t0 + Duration::from_secs(40)).is_empty());
        assert!(st.met_for_grace(&m, t0 + Duration::from_secs(50)).is_empty());
        // A hard threshold acts at once.
        let very_low = obs(Signal::MemoryAvailable, 50 << 20, 4 << 30);
        let m = met(&all, &very_low);
        let now = st.met_for_grace(&m, t0 + Duration::from_secs(60));
        assert_eq!(now.iter().filter(|t| t.hard).count(), 1);
    }

    #[test]
    fn conditions_outlast_the_signal_by_the_transition_period() {
        let all = threshold(&["eviction-hard=memory.available<100Mi,pid.available<10"]);
        let mut st = ThresholdState::default();
        let t0 = Instant::now();
        let period = Duration::from_secs(300);
        let m = met(&all, &obs(Signal::MemoryAvailable, 1, 1 << 30));
        let p = st.pressure(&m, t0, period);
        assert!(p.memory && !p.disk && !p.pid);
        assert!(st.pressure(&[], t0 + Duration::from_secs(299), period).memory);
        assert!(!st.pressure(&[], t0 + Duration::from_secs(300), period).memory);
        // With no transition period the condition follows the signal.
        let p = st.pressure(&m, t0, Duration::ZERO);
        assert!(p.memory);
        assert!(!st.pressure(&[], t0 + Duration::from_millis(1), Duration::ZERO).memory);
    }

    #[test]
    fn memory_is_reclaimed_first() {
        let mut t = threshold(&["eviction-hard=nodefs.available<10%,pid.available<5,memory.available<1Mi"]);
        by_eviction_priority(&mut t);
        assert_eq!(t[0].signal(), Signal::MemoryAvailable);
        assert_eq!(t[1].signal(), Signal::NodeFsAvailable);
        assert_eq!(pressure_of(Signal::ImageFsInodesFree), Pressure::Disk);
    }
}
