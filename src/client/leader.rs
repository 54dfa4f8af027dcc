//! Leader election through a coordination.k8s.io/v1 Lease, as client-go's
//! leaderelection package does it: several servers sharing one datastore
//! run one active controller manager and one active scheduler. The holder
//! renews the Lease every retry period; another candidate takes it over
//! only after it has seen the same record unchanged for a whole lease
//! duration (by its own clock, so clock skew between servers does not
//! matter). Losing the Lease stops the work; it starts again when the
//! Lease is won back.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::task::JoinHandle;

const NAMESPACE: &str = "kube-system";
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const RETRY_PERIOD: Duration = Duration::from_secs(2);

pub struct LeaderElection {
    leases: Api<Lease>,
    name: String,
    identity: String,
    /// The holder and renew time last seen, and when they were first seen.
    observed: Option<(String, Option<MicroTime>, Instant)>,
}

impl LeaderElection {
    /// `identity` should be stable across restarts of the same server (its
    /// node name), so that a restarted server takes its own Lease back at
    /// once instead of waiting for it to expire.
    pub fn new(client: kube::Client, name: &str, identity: &str) -> Self {
        LeaderElection {
            leases: Api::namespaced(client, NAMESPACE),
            name: name.to_string(),
            identity: identity.to_string(),
            observed: None,
        }
    }

    /// Runs `work` whenever this candidate holds the Lease; the tasks it
    /// returns are aborted when the Lease is lost. Never returns.
    pub async fn run(mut self, work: impl Fn() -> Vec<JoinHandle<()>>) {
        loop {
            while !self.try_acquire_or_renew().await {
                tokio::time::sleep(RETRY_PERIOD).await;
            }
            tracing::info!(lease = %self.name, identity = %self.identity, "acquired the leader lease");
            let tasks = work();
            let mut renewed = Instant::now();
            loop {
                tokio::time::sleep(RETRY_PERIOD).await;
                if self.try_acquire_or_renew().await {
                    renewed = Instant::now();
                } else if renewed.elapsed() > RENEW_DEADLINE {
                    break;
                }
            }
            tracing::warn!(lease = %self.name, "lost the leader lease; stopping until it is won back");
            for t in tasks {
                t.abort();
            }
        }
    }

    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// True when this candidate holds the Lease after the call.
    async fn try_acquire_or_renew(&mut self) -> bool {
        let current = match self.leases.get_opt(&self.name).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, lease = %self.name, "cannot read the leader lease");
                return false;
            }
        };
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                spec: Some(self.spec(0, None)),
            };
            return self.leases.create(&PostParams::default(), &lease).await.is_ok();
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let transitions = spec.lease_transitions.unwrap_or(0);
        let new_spec = if holder == self.identity {
            self.spec(transitions, spec.acquire_time.clone())
        } else {
            if !holder.is_empty() && !self.expired(&holder, &spec) {
                return false;
            }
            self.spec(transitions + 1, None)
        };
        lease.spec = Some(new_spec);
        match self.leases.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(error = %e, lease = %self.name, "cannot take or renew the leader lease");
                false
            }
        }
    }

    /// Whether `holder` has let its Lease go unrenewed for its whole duration,
    /// as far as this candidate has watched it.
    fn expired(&mut self, holder: &str, spec: &LeaseSpec) -> bool {
        let duration =
            spec.lease_duration_seconds.map(|s| Duration::from_secs(s.max(1) as u64)).unwrap_or(LEASE_DURATION);
        match &self.observed {
            Some((h, renew, since)) if h == holder && *renew == spec.renew_time => since.elapsed() > duration,
            _ => {
                self.observed = Some((holder.to_string(), spec.renew_time.clone(), Instant::now()));
                false
            }
        }
    }
}
