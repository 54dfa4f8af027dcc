//! The fields each kind can be selected by (`?fieldSelector=`), as
//! upstream v1.33's field label conversions and `GetAttrs` define them: the
//! label a client writes, where the value lives in the object, and the
//! value an unset field reads as (`spec.unschedulable=false` matches a
//! Node that never set it, as upstream's typed zero values do).

use serde_json::Value;

/// What an unset field reads as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unset {
    /// A string field: "".
    Empty,
    /// A bool field: "false".
    False,
    /// An integer field: "0".
    Zero,
}

/// One selectable field of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectableField {
    pub label: &'static str,
    /// JSON path of the value in the object.
    /// An empty path: the label is accepted but upstream's field set has
    /// no value for it, so it always reads as "".
    pub path: &'static [&'static str],
    pub unset: Unset,
    /// Where the value comes from when `path` is unset or empty.
    pub fallback: &'static [&'static str],
}

const fn field(label: &'static str, path: &'static [&'static str], unset: Unset) -> SelectableField {
    SelectableField { label, path, unset, fallback: &[] }
}

const fn field_or(
    label: &'static str,
    path: &'static [&'static str],
    fallback: &'static [&'static str],
) -> SelectableField {
    SelectableField { label, path, unset: Unset::Empty, fallback }
}

const NAME: SelectableField = field("metadata.name", &["metadata", "name"], Unset::Empty);
const NAMESPACE: SelectableField = field("metadata.namespace", &["metadata", "namespace"], Unset::Empty);

const POD: &[SelectableField] = &[
    NAME,
    NAMESPACE,
    field("spec.nodeName", &["spec", "nodeName"], Unset::Empty),
    field("spec.restartPolicy", &["spec", "restartPolicy"], Unset::Empty),
    field("spec.schedulerName", &["spec", "schedulerName"], Unset::Empty),
    field("spec.serviceAccountName", &["spec", "serviceAccountName"], Unset::Empty),
    field("spec.hostNetwork", &["spec", "hostNetwork"], Unset::False),
    field("status.phase", &["status", "phase"], Unset::Empty),
    // The first pod IP, as upstream's podIP field set.
    field_or("status.podIP", &["status", "podIPs", "0", "ip"], &["status", "podIP"]),
    // Accepted by the conversion, absent from upstream's field set: always "".
    field("status.podIPs", &[], Unset::Empty),
    field("status.nominatedNodeName", &["status", "nominatedNodeName"], Unset::Empty),
];
const NODE: &[SelectableField] = &[NAME, field("spec.unschedulable", &["spec", "unschedulable"], Unset::False)];
const REPLICATION_CONTROLLER: &[SelectableField] =
    &[NAME, NAMESPACE, field("status.replicas", &["status", "replicas"], Unset::Zero)];
const EVENT: &[SelectableField] = &[
    field("involvedObject.kind", &["involvedObject", "kind"], Unset::Empty),
    field("involvedObject.namespace", &["involvedObject", "namespace"], Unset::Empty),
    field("involvedObject.name", &["involvedObject", "name"], Unset::Empty),
    field("involvedObject.uid", &["involvedObject", "uid"], Unset::Empty),
    field("involvedObject.apiVersion", &["involvedObject", "apiVersion"], Unset::Empty),
    field("involvedObject.resourceVersion", &["involvedObject", "resourceVersion"], Unset::Empty),
    field("involvedObject.fieldPath", &["involvedObject", "fieldPath"], Unset::Empty),
    field("reason", &["reason"], Unset::Empty),
    field("reportingComponent", &["reportingComponent"], Unset::Empty),
    // The source component, else the reporting controller.
    field_or("source", &["source", "component"], &["reportingComponent"]),
    field("type", &["type"], Unset::Empty),
    NAMESPACE,
    NAME,
];
/// events.k8s.io/v1 Events share the core Event's field set under the
/// new names (`regarding.*`, `reportingController`).
const EVENTS_V1_EVENT: &[SelectableField] = &[
    field("reason", &["reason"], Unset::Empty),
    field("regarding.kind", &["regarding", "kind"], Unset::Empty),
    field("regarding.namespace", &["regarding", "namespace"], Unset::Empty),
    field("regarding.name", &["regarding", "name"], Unset::Empty),
    field("regarding.uid", &["regarding", "uid"], Unset::Empty),
    field("regarding.apiVersion", &["regarding", "apiVersion"], Unset::Empty),
    field("regarding.resourceVersion", &["regarding", "resourceVersion"], Unset::Empty),
    field("regarding.fieldPath", &["regarding", "fieldPath"], Unset::Empty),
    field("reportingController", &["reportingController"], Unset::Empty),
    field_or("source", &["deprecatedSource", "component"], &["reportingController"]),
    field("type", &["type"], Unset::Empty),
    NAMESPACE,
    NAME,
];
const NAMESPACE_KIND: &[SelectableField] = &[field("status.phase", &["status", "phase"], Unset::Empty), NAME];
const SECRET: &[SelectableField] = &[field("type", &["type"], Unset::Empty), NAMESPACE, NAME];
const SERVICE: &[SelectableField] = &[
    NAMESPACE,
    NAME,
    field("spec.clusterIP", &["spec", "clusterIP"], Unset::Empty),
    field("spec.type", &["spec", "type"], Unset::Empty),
];
// The label says "successful"; the value is status.succeeded.
const JOB: &[SelectableField] = &[NAME, NAMESPACE, field("status.successful", &["status", "succeeded"], Unset::Zero)];
const CSR: &[SelectableField] = &[NAME, field("spec.signerName", &["spec", "signerName"], Unset::Empty)];
/// Every other kind: upstream's DefaultMetaV1FieldSelectorConversion.
const DEFAULT: &[SelectableField] = &[NAME, NAMESPACE];

/// How a kind's field label conversion words a label it refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `field label not supported: X` (core, certificates, events).
    NotSupported,
    /// `field label "X" not supported for batchv1.Job`.
    NotSupportedFor(&'static str),
    /// upstream's DefaultMetaV1FieldSelectorConversion.
    NotKnown,
}

/// The kinds with their own field label conversion: `(group, kind, fields,
/// refusal)`. Every other kind (apps/v1 ReplicaSet included: apps/v1
/// registers no conversion) takes upstream's default.
pub const CONVERSIONS: &[(&str, &str, &[SelectableField], Refusal)] = &[
    ("", "Pod", POD, Refusal::NotSupported),
    ("", "Node", NODE, Refusal::NotSupported),
    ("", "ReplicationController", REPLICATION_CONTROLLER, Refusal::NotSupported),
    ("", "Event", EVENT, Refusal::NotSupported),
    ("", "Namespace", NAMESPACE_KIND, Refusal::NotSupported),
    ("", "Secret", SECRET, Refusal::NotSupported),
    ("", "Service", SERVICE, Refusal::NotSupported),
    ("batch", "Job", JOB, Refusal::NotSupportedFor("batchv1.Job")),
    ("certificates.k8s.io", "CertificateSigningRequest", CSR, Refusal::NotSupported),
    ("events.k8s.io", "Event", EVENTS_V1_EVENT, Refusal::NotSupported),
];

/// The selectable fields of a kind, and how its conversion refuses others.
pub fn of(group: &str, kind: &str) -> (&'static [SelectableField], Refusal) {
    CONVERSIONS
        .iter()
        .find(|(g, k, _, _)| *g == group && *k == kind)
        .map(|(_, _, f, r)| (*f, *r))
        .unwrap_or((DEFAULT, Refusal::NotKnown))
}

/// What selectors of `kind` can read of `obj` (its labels, and every
/// selectable field of any group's `kind`, at the paths they have in the
/// object): a small stand-in on which `LabelSelector` and `value_in` answer
/// as they do on the whole object, for caches that keep objects encoded.
pub fn selector_view(obj: &Value, kind: &str) -> Value {
    let mut view = serde_json::Map::new();
    if let Some(labels) = obj.get("metadata").and_then(|m| m.get("labels")) {
        let mut meta = serde_json::Map::new();
        meta.insert("labels".into(), labels.clone());
        view.insert("metadata".into(), Value::Object(meta));
    }
    for path in field_paths(kind) {
        if let Some(v) = at(obj, path) {
            put(&mut view, path, v.clone());
        }
    }
    Value::Object(view)
}

/// Where an object's labels are.
pub const LABELS: &[&str] = &["metadata", "labels"];

/// Every path `selector_view` reads of a `kind` object besides its labels:
/// each selectable field's path and fallback, of any group's `kind`.
pub fn field_paths(kind: &str) -> impl Iterator<Item = &'static [&'static str]> + '_ {
    CONVERSIONS
        .iter()
        .filter(move |(_, k, _, _)| *k == kind)
        .flat_map(|(_, _, f, _)| f.iter())
        .chain(DEFAULT)
        .flat_map(|f| [f.path, f.fallback])
        .filter(|p| !p.is_empty())
}

/// The value at `path` in `obj`, unless it is missing, null or "".
fn at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a Value> {
    if path.is_empty() {
        return None;
    }
    let mut v = Some(obj);
    for p in path {
        v = v.and_then(|x| match x {
            Value::Array(a) => p.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => x.get(p),
        });
    }
    v.filter(|v| !v.is_null() && v.as_str() != Some(""))
}

/// Sets `path` in `view` to `v`, making objects on the way (an array index
/// becomes a key, which `at` reads back the same way).
fn put(view: &mut serde_json::Map<String, Value>, path: &[&str], v: Value) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut here = view;
    for p in parents {
        let next = here.entry(p.to_string()).or_insert_with(|| Value::Object(serde_json::Map::new()));
        let Value::Object(m) = next else { return };
        here = m;
    }
    here.insert(last.to_string(), v);
}

/// Why a label cannot be selected by, in upstream's words.
pub fn unsupported(label: &str, refusal: Refusal) -> String {
    match refusal {
        Refusal::NotSupported => format!("field label not supported: {label}"),
        Refusal::NotSupportedFor(kind) => format!("field label {label:?} not supported for {kind}"),
        Refusal::NotKnown => {
            format!("{label:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"")
        }
    }
}

impl SelectableField {
    /// The field's value in `obj` as a selector compares it.
    pub fn value_in(&self, obj: &Value) -> String {
        match at(obj, self.path).or_else(|| at(obj, self.fallback)) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => b.to_string(),
            Some(Value::Number(n)) => n.to_string(),
            _ => match self.unset {
                Unset::Empty => String::new(),
                Unset::False => "false".into(),
                Unset::Zero => "0".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unset_fields_read_as_their_zero_value() {
        let (node, refusal) = of("", "Node");
        assert_eq!(refusal, Refusal::NotSupported);
        let unschedulable = node.iter().find(|f| f.label == "spec.unschedulable").expect("field");
        assert_eq!(unschedulable.value_in(&json!({"spec": {}})), "false");
        assert_eq!(unschedulable.value_in(&json!({"spec": {"unschedulable": true}})), "true");
        let (job, _) = of("batch", "Job");
        let successful = job.iter().find(|f| f.label == "status.successful").expect("field");
        assert_eq!(successful.value_in(&json!({"status": {"succeeded": 2}})), "2");
        assert_eq!(successful.value_in(&json!({})), "0");
        let (pod, _) = of("", "Pod");
        let ip = pod.iter().find(|f| f.label == "status.podIP").expect("field");
        assert_eq!(ip.value_in(&json!({"status": {"podIPs": [{"ip": "10.42.0.5"}]}})), "10.42.0.5");
        assert!(pod.iter().any(
            |f| f.label == "status.podIPs" && f.value_in(&json!({"status": {"podIPs": [{"ip": "1"}]}})).is_empty()
        ));
        assert_eq!(of("", "ConfigMap"), (DEFAULT, Refusal::NotKnown));
        assert_eq!(of("apps", "ReplicaSet"), (DEFAULT, Refusal::NotKnown));
        assert!(unsupported("spec.x", Refusal::NotKnown).starts_with("\"spec.x\" is not a known field selector"));
        assert_eq!(
            unsupported("status.active", of("batch", "Job").1),
            "field label \"status.active\" not supported for batchv1.Job"
        );
        let (event, _) = of("", "Event");
        let source = event.iter().find(|f| f.label == "source").expect("field");
        assert_eq!(source.value_in(&json!({"reportingComponent": "kubelet"})), "kubelet");
        assert_eq!(source.value_in(&json!({"source": {"component": "sched"}, "reportingComponent": "x"})), "sched");
    }

    #[test]
    fn the_selector_view_answers_as_the_whole_object() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}, "annotations": {"a": "b"}},
            "spec": {"nodeName": "n1", "hostNetwork": true, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.42.0.7"}], "podIP": "10.42.0.7"}
        });
        let view = selector_view(&pod, "Pod");
        for f in of("", "Pod").0 {
            assert_eq!(f.value_in(&view), f.value_in(&pod), "{}", f.label);
        }
        assert_eq!(view.pointer("/metadata/labels/app"), Some(&json!("web")));
        assert!(view.get("spec").and_then(|s| s.get("containers")).is_none(), "only what selectors read");
        assert!(view.pointer("/metadata/annotations").is_none());
        // Both Event kinds' fields, whichever group's selector reads it.
        let event = json!({"metadata": {"name": "e"}, "involvedObject": {"name": "p"}, "regarding": {"name": "q"}});
        let view = selector_view(&event, "Event");
        for (_, _, fields, _) in CONVERSIONS.iter().filter(|(_, k, _, _)| *k == "Event") {
            for f in fields.iter() {
                assert_eq!(f.value_in(&view), f.value_in(&event), "{}", f.label);
            }
        }
    }
}
