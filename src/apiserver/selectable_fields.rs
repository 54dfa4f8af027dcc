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
    pub path: &'static [&'static str],
    pub unset: Unset,
}

const fn field(label: &'static str, path: &'static [&'static str], unset: Unset) -> SelectableField {
    SelectableField { label, path, unset }
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
    field("status.podIP", &["status", "podIPs", "0", "ip"], Unset::Empty),
    field("status.podIPs", &["status", "podIPs", "0", "ip"], Unset::Empty),
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
    field("source", &["source", "component"], Unset::Empty),
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
const REPLICA_SET: &[SelectableField] =
    &[NAME, NAMESPACE, field("status.replicas", &["status", "replicas"], Unset::Zero)];
// The label says "successful"; the value is status.succeeded.
const JOB: &[SelectableField] = &[NAME, NAMESPACE, field("status.successful", &["status", "succeeded"], Unset::Zero)];
const CSR: &[SelectableField] = &[NAME, field("spec.signerName", &["spec", "signerName"], Unset::Empty)];
/// Every other kind: upstream's DefaultMetaV1FieldSelectorConversion.
const DEFAULT: &[SelectableField] = &[NAME, NAMESPACE];

/// The kinds with their own field label conversion: `(group, kind, fields)`.
pub const CONVERSIONS: &[(&str, &str, &[SelectableField])] = &[
    ("", "Pod", POD),
    ("", "Node", NODE),
    ("", "ReplicationController", REPLICATION_CONTROLLER),
    ("", "Event", EVENT),
    ("", "Namespace", NAMESPACE_KIND),
    ("", "Secret", SECRET),
    ("", "Service", SERVICE),
    ("apps", "ReplicaSet", REPLICA_SET),
    ("batch", "Job", JOB),
    ("certificates.k8s.io", "CertificateSigningRequest", CSR),
];

/// The selectable fields of a kind, and whether it has its own conversion.
pub fn of(group: &str, kind: &str) -> (&'static [SelectableField], bool) {
    CONVERSIONS
        .iter()
        .find(|(g, k, _)| *g == group && *k == kind)
        .map(|(_, _, f)| (*f, true))
        .unwrap_or((DEFAULT, false))
}

/// Why a label cannot be selected by, in upstream's words.
pub fn unsupported(label: &str, own_conversion: bool) -> String {
    if own_conversion {
        format!("field label not supported: {label}")
    } else {
        format!("{label:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"")
    }
}

impl SelectableField {
    /// The field's value in `obj` as a selector compares it.
    pub fn value_in(&self, obj: &Value) -> String {
        let mut v = Some(obj);
        for p in self.path {
            v = v.and_then(|x| match x {
                Value::Array(a) => p.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => x.get(p),
            });
        }
        match v {
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
        let (node, own) = of("", "Node");
        assert!(own);
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
        assert_eq!(of("", "ConfigMap"), (DEFAULT, false));
        assert!(unsupported("spec.x", false).starts_with("\"spec.x\" is not a known field selector"));
    }
}
