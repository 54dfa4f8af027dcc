//! The workers' state machine, on a clock moved by hand and a prober that
//! answers from a script.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ExecAction, ObjectReference, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::agent::prober::clock::{settle, FakeClock};
use crate::agent::prober::ProbeResult;
use crate::client::events::EventType;

#[derive(Default)]
struct Script {
    queued: Mutex<HashMap<ProbeType, VecDeque<ProbeResult>>>,
    always: Mutex<HashMap<ProbeType, ProbeResult>>,
    calls: Mutex<Vec<(ProbeType, String, Instant)>>,
    clock: Option<Arc<FakeClock>>,
}

impl Script {
    fn then(&self, t: ProbeType, results: impl IntoIterator<Item = ProbeResult>) {
        self.queued.lock().unwrap().entry(t).or_default().extend(results);
    }

    fn always(&self, t: ProbeType, result: ProbeResult) {
        self.always.lock().unwrap().insert(t, result);
    }

    fn calls(&self, t: ProbeType) -> usize {
        self.calls.lock().unwrap().iter().filter(|c| c.0 == t).count()
    }

    fn calls_for(&self, id: &str) -> usize {
        self.calls.lock().unwrap().iter().filter(|c| c.1 == id).count()
    }
}

#[async_trait::async_trait]
impl Prober for Script {
    async fn probe(&self, t: ProbeType, _spec: &Probe, target: &ProbeTarget) -> ProbeResult {
        let now = self.clock.as_ref().map(|c| c.now()).unwrap_or_else(Instant::now);
        self.calls.lock().unwrap().push((t, target.container_id.clone(), now));
        let queued = self.queued.lock().unwrap().get_mut(&t).and_then(VecDeque::pop_front);
        queued.or_else(|| self.always.lock().unwrap().get(&t).cloned()).unwrap_or(ProbeResult::Success)
    }
}

#[derive(Default)]
struct Events(Mutex<Vec<(String, String, Option<String>)>>);

impl EventSink for Events {
    fn event(&self, regarding: ObjectReference, event_type: EventType, reason: &str, message: &str) {
        assert_eq!(event_type, EventType::Warning);
        self.0.lock().unwrap().push((reason.into(), message.into(), regarding.field_path));
    }
}

impl Events {
    fn messages(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().map(|e| format!("{}: {}", e.0, e.1)).collect()
    }
}

struct Fixture {
    clock: Arc<FakeClock>,
    script: Arc<Script>,
    events: Arc<Events>,
    manager: ProbeManager,
    updates: mpsc::UnboundedReceiver<ProbeUpdate>,
}

fn fixture() -> Fixture {
    fixture_with(false)
}

fn fixture_with(jitter: bool) -> Fixture {
    let clock = Arc::new(FakeClock::new());
    let script = Arc::new(Script { clock: Some(clock.clone()), ..Default::default() });
    let events = Arc::new(Events::default());
    let (manager, updates) = ProbeManager::build(script.clone(), events.clone(), clock.clone(), jitter);
    Fixture { clock, script, events, manager, updates }
}

const UID: &str = "uid-1";

fn pod() -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("web".into());
    pod.metadata.namespace = Some("default".into());
    pod.metadata.uid = Some(UID.into());
    pod
}

fn probe(period: i32, initial_delay: i32, success: i32, failure: i32) -> Probe {
    Probe {
        exec: Some(ExecAction { command: Some(vec!["true".into()]) }),
        period_seconds: Some(period),
        initial_delay_seconds: Some(initial_delay),
        success_threshold: Some(success),
        failure_threshold: Some(failure),
        ..Default::default()
    }
}

fn container(name: &str, liveness: Option<Probe>, readiness: Option<Probe>, startup: Option<Probe>) -> Container {
    Container {
        name: name.into(),
        liveness_probe: liveness,
        readiness_probe: readiness,
        startup_probe: startup,
        ..Default::default()
    }
}

impl Fixture {
    async fn add(&self, c: &Container, id: &str) {
        self.manager.add_container(&pod(), c, id, SystemTime::now(), "10.42.0.5".parse().ok());
        settle().await;
    }

    async fn advance(&self, secs: u64) {
        self.clock.advance(Duration::from_secs(secs)).await;
    }

    fn updates(&mut self) -> Vec<(ProbeType, ProbeOutcome)> {
        let mut out = Vec::new();
        while let Ok(u) = self.updates.try_recv() {
            assert_eq!(u.pod_uid, UID);
            out.push((u.probe_type, u.result));
        }
        out
    }
}

use ProbeOutcome::{Failure, Success};
use ProbeType::{Liveness, Readiness, Startup};

#[tokio::test]
async fn readiness_starts_failed_and_waits_out_the_initial_delay() {
    let mut f = fixture();
    f.add(&container("app", None, Some(probe(10, 15, 1, 3)), None), "c1").await;
    assert!(!f.manager.is_ready(UID, "app"));
    assert!(f.manager.is_started(UID, "app"));
    assert_eq!(f.manager.result(UID, "app", Readiness), Some(Failure));
    f.advance(10).await;
    assert_eq!(f.script.calls(Readiness), 0, "probed within the initial delay");
    f.advance(9).await;
    assert_eq!(f.script.calls(Readiness), 0, "probed between periods");
    f.advance(1).await;
    assert_eq!(f.script.calls(Readiness), 1);
    assert!(f.manager.is_ready(UID, "app"));
    assert_eq!(f.updates(), [(Readiness, Success)]);
}

#[tokio::test]
async fn liveness_fails_after_the_threshold_and_then_holds() {
    let mut f = fixture();
    f.script.always(Liveness, ProbeResult::Failure("boom".into()));
    f.add(&container("app", Some(probe(1, 0, 1, 3)), None, None), "c1").await;
    assert_eq!(f.script.calls(Liveness), 1);
    assert_eq!(f.manager.result(UID, "app", Liveness), Some(Success), "alive until the threshold");
    f.advance(1).await;
    assert_eq!(f.updates(), []);
    f.advance(1).await;
    assert_eq!(f.script.calls(Liveness), 3);
    assert_eq!(f.manager.result(UID, "app", Liveness), Some(Failure));
    let update = vec![(Liveness, Failure)];
    assert_eq!(f.updates(), update);
    f.advance(5).await;
    assert_eq!(f.script.calls(Liveness), 3, "a failed liveness probe waits for a new container");
    assert_eq!(f.events.messages(), vec!["Unhealthy: Liveness probe failed: boom"; 3]);
    let paths: Vec<_> = f.events.0.lock().unwrap().iter().map(|e| e.2.clone()).collect();
    assert_eq!(paths, vec![Some("spec.containers{app}".to_string()); 3]);
    assert_eq!(f.manager.worker_count(), 0);
}

#[tokio::test]
async fn readiness_needs_successes_in_a_row() {
    let mut f = fixture();
    use ProbeResult::Success as S;
    f.script.then(Readiness, [S, ProbeResult::Failure("no".into()), S, S]);
    f.add(&container("app", None, Some(probe(1, 0, 2, 1)), None), "c1").await;
    assert!(!f.manager.is_ready(UID, "app"));
    f.advance(1).await; // failure: still not ready, nothing changed
    f.advance(1).await; // one success
    assert!(!f.manager.is_ready(UID, "app"));
    f.advance(1).await; // two in a row
    assert!(f.manager.is_ready(UID, "app"));
    assert_eq!(f.updates(), [(Readiness, Success)]);
    assert_eq!(f.events.messages(), ["Unhealthy: Readiness probe failed: no"]);
}

#[tokio::test]
async fn readiness_fails_again_after_the_failure_threshold() {
    let mut f = fixture();
    f.script.then(Readiness, [ProbeResult::Success]);
    f.script.always(Readiness, ProbeResult::Failure("down".into()));
    f.add(&container("app", None, Some(probe(1, 0, 1, 2)), None), "c1").await;
    assert!(f.manager.is_ready(UID, "app"));
    f.advance(1).await;
    assert!(f.manager.is_ready(UID, "app"), "one failure is under the threshold");
    f.advance(1).await;
    assert!(!f.manager.is_ready(UID, "app"));
    f.advance(3).await;
    assert_eq!(f.script.calls(Readiness), 6, "readiness keeps probing while failed");
    assert_eq!(f.updates(), [(Readiness, Success), (Readiness, Failure)]);
}

#[tokio::test]
async fn startup_holds_back_liveness_and_readiness() {
    let mut f = fixture();
    let failed = || ProbeResult::Failure("starting".into());
    f.script.then(Startup, [failed(), failed(), ProbeResult::Success]);
    let c = container("app", Some(probe(1, 0, 1, 1)), Some(probe(10, 0, 1, 3)), Some(probe(1, 0, 1, 5)));
    f.add(&c, "c1").await;
    assert!(!f.manager.is_started(UID, "app"));
    f.advance(1).await;
    assert_eq!((f.script.calls(Startup), f.script.calls(Liveness), f.script.calls(Readiness)), (2, 0, 0));
    assert!(!f.manager.is_ready(UID, "app"));
    f.advance(1).await;
    assert!(f.manager.is_started(UID, "app"));
    // The readiness probe runs as soon as the container has started, not
    // at its next period.
    assert_eq!(f.script.calls(Readiness), 1);
    assert!(f.manager.is_ready(UID, "app"));
    assert_eq!(f.updates(), [(Startup, Success), (Readiness, Success)]);
    f.advance(3).await;
    assert_eq!(f.script.calls(Startup), 3, "the startup probe stops once started");
    // Liveness runs on its own period after startup (its tick in the very
    // second startup succeeded may come before or after the success).
    assert!((3..=4).contains(&f.script.calls(Liveness)), "{}", f.script.calls(Liveness));
}

#[tokio::test]
async fn a_failed_startup_probe_asks_for_a_restart() {
    let mut f = fixture();
    f.script.always(Startup, ProbeResult::Failure("not yet".into()));
    f.add(&container("app", Some(probe(1, 0, 1, 1)), None, Some(probe(1, 0, 1, 2))), "c1").await;
    f.advance(1).await;
    assert_eq!(f.updates(), [(Startup, Failure)]);
    assert!(!f.manager.is_started(UID, "app"));
    f.advance(3).await;
    assert_eq!(f.script.calls(Startup), 2);
    assert_eq!(f.script.calls(Liveness), 0);
    assert_eq!(f.events.messages(), vec!["Unhealthy: Startup probe failed: not yet"; 2]);
}

#[tokio::test]
async fn a_new_container_id_starts_over() {
    let f = fixture();
    let c = container("app", None, Some(probe(1, 0, 1, 3)), None);
    f.add(&c, "c1").await;
    assert!(f.manager.is_ready(UID, "app"));
    f.add(&c, "c1").await;
    assert_eq!(f.script.calls_for("c1"), 1, "adding the same container again changes nothing");
    assert_eq!(f.manager.worker_count(), 1);

    f.script.then(Readiness, [ProbeResult::Failure("warming up".into())]);
    f.manager.add_container(&pod(), &c, "c2", SystemTime::now(), None);
    assert!(!f.manager.is_ready(UID, "app"), "a restarted container is not ready");
    assert_eq!(f.manager.container_id(UID, "app").as_deref(), Some("c2"));
    settle().await;
    f.advance(3).await;
    assert_eq!(f.script.calls_for("c1"), 1, "the old instance's worker stopped");
    assert_eq!(f.script.calls_for("c2"), 4);
    assert!(f.manager.is_ready(UID, "app"));
    assert_eq!(f.manager.worker_count(), 1);
}

#[tokio::test]
async fn removed_containers_and_pods_stop_probing() {
    let f = fixture();
    f.add(&container("a", Some(probe(1, 0, 1, 3)), Some(probe(1, 0, 1, 3)), None), "ca").await;
    f.add(&container("b", None, Some(probe(1, 0, 1, 3)), None), "cb").await;
    assert_eq!(f.manager.worker_count(), 3);
    f.manager.remove_container(UID, "a");
    assert!(!f.manager.is_ready(UID, "a"));
    assert!(f.manager.is_ready(UID, "b"));
    f.advance(2).await;
    assert_eq!(f.script.calls_for("ca"), 2);
    f.manager.remove_pod(UID);
    assert_eq!(f.manager.worker_count(), 0);
    let before = f.script.calls_for("cb");
    f.advance(3).await;
    assert_eq!(f.script.calls_for("cb"), before);
    assert!(!f.manager.is_ready(UID, "b"));
}

#[tokio::test]
async fn a_deleted_pod_is_not_killed_for_liveness() {
    let mut f = fixture();
    f.script.always(Liveness, ProbeResult::Failure("shutting down".into()));
    f.add(&container("app", Some(probe(1, 0, 1, 2)), Some(probe(1, 0, 1, 3)), None), "c1").await;
    let mut deleted = pod();
    deleted.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    f.manager.update_pod(&deleted);
    f.advance(3).await;
    assert_eq!(f.script.calls(Liveness), 1, "liveness stops once the pod is deleted");
    assert_eq!(f.manager.result(UID, "app", Liveness), Some(Success));
    assert_eq!(f.script.calls(Readiness), 4, "readiness keeps going");
    assert!(!f.updates().contains(&(Liveness, Failure)));
}

#[tokio::test]
async fn probes_that_cannot_run_are_retried_and_thrown_away() {
    let mut f = fixture();
    let unknown = || ProbeResult::Unknown("no such container".into());
    f.script.then(Liveness, [unknown(), unknown(), unknown(), ProbeResult::Failure("dead".into())]);
    f.add(&container("app", Some(probe(1, 0, 1, 1)), None, None), "c1").await;
    assert_eq!(f.script.calls(Liveness), 3, "tried three times in one period");
    assert_eq!(f.updates(), []);
    assert_eq!(
        f.events.messages(),
        ["Unhealthy: Liveness probe errored and resulted in unknown state: no such container"]
    );
    f.advance(1).await;
    assert_eq!(f.updates(), [(Liveness, Failure)]);
}

#[tokio::test]
async fn a_redirect_elsewhere_succeeds_with_a_warning() {
    let f = fixture();
    f.script.always(Readiness, ProbeResult::Warning("Probe terminated redirects, Response body: ".into()));
    f.add(&container("app", None, Some(probe(1, 0, 1, 3)), None), "c1").await;
    assert!(f.manager.is_ready(UID, "app"));
    assert_eq!(
        f.events.messages(),
        ["ProbeWarning: Readiness probe warning: Probe terminated redirects, Response body: "]
    );
}

#[tokio::test]
async fn containers_without_probes_are_ready_once_added() {
    let f = fixture();
    assert!(!f.manager.is_ready(UID, "app"), "unknown containers are not ready");
    f.add(&container("app", None, None, None), "c1").await;
    assert!(f.manager.is_ready(UID, "app") && f.manager.is_started(UID, "app"));
    assert_eq!(f.manager.worker_count(), 0);
}

#[tokio::test]
async fn first_probes_spread_over_a_period_after_the_node_starts() {
    let f = fixture_with(true);
    f.add(&container("app", None, Some(probe(10, 0, 1, 3)), None), "c1").await;
    let mut first = None;
    for second in 1..=10 {
        f.advance(1).await;
        if first.is_none() && f.script.calls(Readiness) > 0 {
            first = Some(second);
        }
    }
    assert!(first.is_some(), "probed within the first period");
    // Long after the start, a new container is probed at once.
    f.add(&container("late", None, Some(probe(10, 0, 1, 3)), None), "c2").await;
    assert_eq!(f.script.calls_for("c2"), 1);
}
