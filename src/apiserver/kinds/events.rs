//! Events, core/v1 and events.k8s.io/v1: one table for both, as upstream
//! serves both from the same storage. The two versions name some fields
//! differently (`involvedObject` / `regarding`, `message` / `note`, ...).

use serde_json::{json, Value};

use super::since;
use crate::apiserver::meta::{at, str_at};
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

/// Where an Event version keeps the fields the table shows.
struct Fields {
    regarding: &'static str,
    message: &'static str,
    source: &'static str,
    first: &'static str,
    last: &'static str,
    count: &'static str,
    reporting_controller: &'static str,
}

const CORE: Fields = Fields {
    regarding: "involvedObject",
    message: "message",
    source: "source",
    first: "firstTimestamp",
    last: "lastTimestamp",
    count: "count",
    reporting_controller: "reportingComponent",
};

const EVENTS_V1: Fields = Fields {
    regarding: "regarding",
    message: "note",
    source: "deprecatedSource",
    first: "deprecatedFirstTimestamp",
    last: "deprecatedLastTimestamp",
    count: "deprecatedCount",
    reporting_controller: "reportingController",
};

/// Upstream's wide table ends with a NAME column too; the table already
/// starts with one, so it is left out here.
fn columns() -> Vec<Column> {
    vec![
        Column::new("Last Seen", "string", 0),
        Column::new("Type", "string", 0),
        Column::new("Reason", "string", 0),
        Column::new("Object", "string", 0),
        Column::new("Subobject", "string", 1),
        Column::new("Source", "string", 1),
        Column::new("Message", "string", 0),
        Column::new("First Seen", "string", 1),
        Column::new("Count", "string", 1),
    ]
}

fn cells(o: &Value, f: &Fields) -> Vec<Value> {
    let first = since(o, &[f.first]).or_else(|| since(o, &["eventTime"])).unwrap_or_else(|| "<unknown>".into());
    let mut last = since(o, &[f.last]).unwrap_or_else(|| first.clone());
    let mut count = at(o, &[f.count]).and_then(Value::as_i64).unwrap_or(0);
    if let Some(series) = o.get("series").filter(|s| s.is_object()) {
        last = since(series, &["lastObservedTime"]).unwrap_or_else(|| "<unknown>".into());
        count = series.get("count").and_then(Value::as_i64).unwrap_or(0);
    } else if count == 0 {
        // Singleton events of the new API carry no count.
        count = 1;
    }
    let kind = str_at(o, &[f.regarding, "kind"]).unwrap_or_default().to_lowercase();
    let object = match str_at(o, &[f.regarding, "name"]).filter(|n| !n.is_empty()) {
        Some(name) => format!("{kind}/{name}"),
        None => kind,
    };
    let non_empty = |path: &[&str]| str_at(o, path).filter(|s| !s.is_empty());
    let component = non_empty(&[f.source, "component"]).or(non_empty(&[f.reporting_controller])).unwrap_or_default();
    let source = match non_empty(&[f.source, "host"]).or(non_empty(&["reportingInstance"])) {
        Some(instance) => format!("{component}, {instance}"),
        None => component.to_string(),
    };
    vec![
        json!(last),
        json!(str_at(o, &["type"]).unwrap_or_default()),
        json!(str_at(o, &["reason"]).unwrap_or_default()),
        json!(object),
        json!(str_at(o, &[f.regarding, "fieldPath"]).unwrap_or_default()),
        json!(source),
        json!(str_at(o, &[f.message]).unwrap_or_default().trim()),
        json!(first),
        json!(count),
    ]
}

/// core/v1 Events.
pub fn event_hooks() -> Hooks {
    Hooks { columns, cells: |o| cells(o, &CORE), ..Hooks::default() }
}

/// events.k8s.io/v1 Events.
pub fn events_v1_event_hooks() -> Hooks {
    Hooks { columns, cells: |o| cells(o, &EVENTS_V1), ..Hooks::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::meta::{rfc3339, unix_now};

    #[test]
    fn core_and_v1_events_print_alike() {
        let ago = |s: i64| rfc3339(unix_now() - s);
        let core = json!({
            "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{app}"},
            "type": "Normal", "reason": "Pulled", "message": " pulled \n",
            "source": {"component": "kubelet", "host": "node1"},
            "firstTimestamp": ago(600), "lastTimestamp": ago(30), "count": 4
        });
        let v1 = json!({
            "regarding": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{app}"},
            "type": "Normal", "reason": "Pulled", "note": " pulled \n",
            "reportingController": "kubelet", "reportingInstance": "node1",
            "deprecatedFirstTimestamp": ago(600), "deprecatedLastTimestamp": ago(30), "deprecatedCount": 4
        });
        let want = vec![
            json!("30s"),
            json!("Normal"),
            json!("Pulled"),
            json!("pod/web"),
            json!("spec.containers{app}"),
            json!("kubelet, node1"),
            json!("pulled"),
            json!("10m"),
            json!(4),
        ];
        assert_eq!((event_hooks().cells)(&core), want);
        assert_eq!((events_v1_event_hooks().cells)(&v1), want);
        assert_eq!((event_hooks().columns)().len(), want.len());
    }

    #[test]
    fn series_and_singletons() {
        let e =
            json!({"regarding": {"kind": "Node"}, "eventTime": rfc3339(unix_now() - 90), "reportingController": "c"});
        let cells = (events_v1_event_hooks().cells)(&e);
        assert_eq!(
            (&cells[0], &cells[3], &cells[5], &cells[7], &cells[8]),
            (&json!("90s"), &json!("node"), &json!("c"), &json!("90s"), &json!(1))
        );
        let e = json!({"eventTime": rfc3339(unix_now() - 90), "series": {"count": 7, "lastObservedTime": rfc3339(unix_now() - 5)}});
        let cells = (events_v1_event_hooks().cells)(&e);
        assert_eq!((&cells[0], &cells[8]), (&json!("5s"), &json!(7)));
        let e = json!({"reportingComponent": "ctrl", "source": {"host": "h"}});
        assert_eq!((event_hooks().cells)(&e)[5], json!("ctrl, h"));
    }
}
