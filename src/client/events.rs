//! EventRecorder: how controllers and the scheduler record core/v1 Events on
//! the objects they act on, as client-go's record package does. Recording
//! never blocks the caller: events go through a bounded queue to one writer
//! task, and are dropped (with a debug log) when the queue is full. A repeat
//! of the same event (same object, type, reason and message) bumps the
//! existing Event's `count` and `lastTimestamp` instead of creating another,
//! and, as client-go's spam filter does, an event repeated beyond a burst of
//! 25 is written at most once every 5 minutes (a pod that cannot be
//! scheduled writes no FailedScheduling at every attempt).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Resource;
use tokio::sync::mpsc;

/// `Normal` or `Warning`, the two types kubectl knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

struct Record {
    regarding: ObjectReference,
    kind: EventType,
    reason: String,
    message: String,
}

/// A cheap, cloneable handle; the writer task lives as long as any handle.
#[derive(Clone)]
pub struct EventRecorder {
    tx: mpsc::Sender<Record>,
}

/// How many recorded-but-unwritten events may wait before new ones are dropped.
const QUEUE: usize = 1000;
/// How many distinct events the writer remembers for aggregation.
const REMEMBERED: usize = 4096;

impl EventRecorder {
    /// Starts the writer task. `component` is what `kubectl describe` shows
    /// as the event's source (`deployment-controller`, `default-scheduler`).
    pub fn new(client: kube::Client, component: &str) -> Self {
        Self::with_host(client, component, hostname())
    }

    /// A recorder whose events name `host` as their source (a kubelet names its node).
    pub fn with_host(client: kube::Client, component: &str, host: Option<String>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write_events(client, component.to_string(), host, rx));
        EventRecorder { tx }
    }

    /// Records an event about `obj`.
    pub fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, kind: EventType, reason: &str, message: &str) {
        self.publish_ref(obj.object_ref(&()), kind, reason, message);
    }

    /// Records an event about the object `regarding` names.
    pub fn publish_ref(&self, regarding: ObjectReference, kind: EventType, reason: &str, message: &str) {
        let record = Record { regarding, kind, reason: reason.to_string(), message: message.to_string() };
        if self.tx.try_send(record).is_err() {
            tracing::debug!(reason, "event queue full; event dropped");
        }
    }
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty())
}

/// client-go's `EventSourceObjectSpamFilter`: a token bucket per event
/// (`defaultSpamBurst` 25, one token back every 5 minutes).
struct SpamFilter {
    buckets: HashMap<Key, (f64, std::time::Instant)>,
}

const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

impl SpamFilter {
    fn new() -> Self {
        SpamFilter { buckets: HashMap::new() }
    }

    /// Whether the event of `key` may be written at `now` (taking a token).
    fn allow(&mut self, key: &Key, now: std::time::Instant) -> bool {
        if self.buckets.len() >= REMEMBERED && !self.buckets.contains_key(key) {
            // Forget buckets that have filled up again; they hold nothing.
            let full = |(tokens, at): &(f64, std::time::Instant)| {
                tokens + now.duration_since(*at).as_secs_f64() / SPAM_REFILL_EVERY.as_secs_f64() >= SPAM_BURST
            };
            self.buckets.retain(|_, b| !full(b));
            if self.buckets.len() >= REMEMBERED {
                self.buckets.clear();
            }
        }
        let (tokens, at) = self.buckets.entry(key.clone()).or_insert((SPAM_BURST, now));
        let refilled = now.duration_since(*at).as_secs_f64() / SPAM_REFILL_EVERY.as_secs_f64();
        *tokens = (*tokens + refilled).min(SPAM_BURST);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What makes two events the same one, for aggregation.
type Key = (String, String, String, String, EventType, String, String);

fn key(r: &Record) -> Key {
    let o = &r.regarding;
    (
        o.namespace.clone().unwrap_or_default(),
        o.kind.clone().unwrap_or_default(),
        o.name.clone().unwrap_or_default(),
        o.uid.clone().unwrap_or_default(),
        r.kind,
        r.reason.clone(),
        r.message.clone(),
    )
}

async fn write_events(client: kube::Client, component: String, host: Option<String>, mut rx: mpsc::Receiver<Record>) {
    // Key → (event name, namespace, count so far).
    let mut seen: HashMap<Key, (String, String, i32)> = HashMap::new();
    let mut spam = SpamFilter::new();
    while let Some(record) = rx.recv().await {
        let k = key(&record);
        if !spam.allow(&k, std::time::Instant::now()) {
            tracing::debug!(reason = %record.reason, object = ?record.regarding.name, "event repeated too often; dropped");
            continue;
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        if let Some((name, ns, count)) = seen.get_mut(&k) {
            let events: Api<Event> = Api::namespaced(client.clone(), ns);
            let patch = serde_json::json!({"count": *count + 1, "lastTimestamp": now});
            match events.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    *count += 1;
                    continue;
                }
                Err(e) => tracing::debug!(error = %e, event = %name, "cannot update an event; creating it anew"),
            }
        }
        let namespace =
            record.regarding.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into());
        let object_name = record.regarding.name.clone().unwrap_or_default();
        let nanos = now.0.as_nanosecond();
        let name = format!("{object_name}.{nanos:x}");
        let event = Event {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(namespace.clone()), ..Default::default() },
            involved_object: record.regarding,
            reason: Some(record.reason),
            message: Some(record.message),
            type_: Some(record.kind.as_str().to_string()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now.clone()),
            event_time: None::<MicroTime>,
            source: Some(EventSource { component: Some(component.clone()), host: host.clone() }),
            reporting_component: Some(component.clone()),
            reporting_instance: host.clone(),
            ..Default::default()
        };
        match create(&client, &namespace, &event).await {
            Ok(()) => {
                if seen.len() >= REMEMBERED {
                    seen.clear();
                }
                seen.insert(k, (name, namespace, 1));
            }
            Err(e) => tracing::debug!(error = %e, "cannot record an event"),
        }
    }
}

/// Creates `event`. The created Event the server answers is read as text
/// and dropped: nothing here needs it decoded.
async fn create(client: &kube::Client, namespace: &str, event: &Event) -> Result<(), kube::Error> {
    let body = serde_json::to_vec(event).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(Event::url_path(&(), Some(namespace)))
        .create(&PostParams::default(), body)
        .map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, message: &str) -> Record {
        Record {
            regarding: ObjectReference { name: Some(name.into()), ..Default::default() },
            kind: EventType::Warning,
            reason: "FailedScheduling".into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_repeated_event_is_written_25_times_then_once_per_5_minutes() {
        let mut spam = SpamFilter::new();
        let t0 = std::time::Instant::now();
        let k = key(&record("p", "0/3 nodes are available"));
        assert_eq!((0..100).filter(|_| spam.allow(&k, t0)).count(), 25);
        // Another object, or another message, has its own burst.
        assert!(spam.allow(&key(&record("q", "0/3 nodes are available")), t0));
        assert!(spam.allow(&key(&record("p", "0/4 nodes are available")), t0));
        assert!(!spam.allow(&k, t0 + std::time::Duration::from_secs(299)));
        // Ten minutes give two tokens back.
        let later = t0 + std::time::Duration::from_secs(600);
        assert!(spam.allow(&k, later));
        assert!(spam.allow(&k, later));
        assert!(!spam.allow(&k, later));
    }
}
