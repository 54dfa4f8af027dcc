//! Events, core/v1 and events.k8s.io/v1: one set of objects, as upstream
//! serves both from the core Events' storage (`/registry/events/`): an
//! events.k8s.io/v1 Event is a core Event with some fields named
//! differently (`involvedObject` / `regarding`, `message` / `note`, ...),
//! converted on every read and write. Both are checked as upstream's
//! `ValidateEventCreate` checks the core Event, more strictly when created
//! through events.k8s.io/v1; and both print one table.

use serde_json::{json, Value};

use super::since;
use crate::apiserver::meta::{at, namespace_of, str_at};
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::{Conversion, Hooks};
use crate::apiserver::table::Column;
use crate::apiserver::validation::{qualified_name, quote};

/// Where Events of both groups live (and expire, `--event-ttl`).
pub const EVENTS_KEY_PREFIX: &str = "/registry/events/";

/// The core/v1 fields events.k8s.io/v1 names otherwise (upstream's
/// `Convert_core_Event_To_v1_Event`); the others (metadata, eventTime,
/// series, related, action, reason, type, reportingInstance) are the same.
const RENAMED: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// `obj` with each field of one version renamed to the other's.
fn renamed(mut obj: Value, to_v1: bool, api_version: &str) -> Value {
    if let Some(m) = obj.as_object_mut() {
        for (core, v1) in RENAMED {
            let (from, to) = if to_v1 { (core, v1) } else { (v1, core) };
            match m.remove(from) {
                Some(v) => m.insert(to.to_string(), v),
                None => m.remove(to),
            };
        }
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!("Event"));
    }
    obj
}

/// A core/v1 Event as events.k8s.io/v1 serves it.
pub fn core_to_v1(core: Value) -> Value {
    renamed(core, true, "events.k8s.io/v1")
}

/// An events.k8s.io/v1 Event as the core/v1 Event it is stored as.
pub fn v1_to_core(v1: Value) -> Value {
    renamed(v1, false, "v1")
}

/// Whether a timestamp field is set (Go's zero time is written as null).
fn time_set(o: &Value, field: &str) -> bool {
    o.get(field).is_some_and(|t| !t.is_null() && t.as_str() != Some(""))
}

fn text<'a>(o: &'a Value, path: &[&str]) -> &'a str {
    str_at(o, path).unwrap_or_default()
}

/// `Invalid value: "<value>": <detail>` at `field`.
fn invalid(field: &str, value: &str, detail: &str) -> Cause {
    Cause::invalid(field, format!("Invalid value: {}: {detail}", quote(value)))
}

/// Upstream's `legacyValidateEvent` of a core Event, whatever the API it
/// came through: an event of the old kind (no eventTime) names an object
/// of its own namespace (or a cluster-scoped one from "default"); a new
/// one says who reported what.
fn validate_core(o: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let ns = namespace_of(o).unwrap_or_default();
    let regarding_ns = text(o, &["involvedObject", "namespace"]);
    let mismatch = || invalid("involvedObject.namespace", regarding_ns, "does not match event.namespace");
    if !time_set(o, "eventTime") {
        let agrees = if regarding_ns.is_empty() { ns.is_empty() || ns == "default" } else { ns == regarding_ns };
        if !agrees {
            causes.push(mismatch());
        }
        return causes;
    }
    if regarding_ns.is_empty() && ns != "default" && ns != "kube-system" {
        causes.push(mismatch());
    }
    let controller = text(o, &["reportingComponent"]);
    if controller.is_empty() {
        causes.push(Cause::required("reportingController"));
    }
    for msg in qualified_name(controller) {
        causes.push(invalid("reportingController", controller, &msg));
    }
    let limited = |causes: &mut Vec<Cause>, field: &str, value: &str, required: bool, limit: usize| {
        if required && value.is_empty() {
            causes.push(Cause::required(field));
        }
        if value.len() > limit {
            causes.push(invalid(field, "", &format!("can have at most {limit} characters")));
        }
    };
    limited(&mut causes, "reportingInstance", text(o, &["reportingInstance"]), true, 128);
    limited(&mut causes, "action", text(o, &["action"]), true, 128);
    limited(&mut causes, "reason", text(o, &["reason"]), true, 128);
    limited(&mut causes, "message", text(o, &["message"]), false, 1024);
    causes
}

/// What upstream's `ValidateEventCreate` adds for an Event created through
/// events.k8s.io/v1 (given as the core Event it is stored as): a series
/// that says something, an eventTime and a type, and none of the fields
/// that API deprecates.
fn validate_v1_create(o: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if let Some(series) = o.get("series").filter(|s| s.is_object()) {
        if series.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
            causes.push(invalid("series.count", "", "should be at least 2"));
        }
        if !time_set(series, "lastObservedTime") {
            causes.push(Cause::required("series.lastObservedTime"));
        }
    }
    if !time_set(o, "eventTime") {
        causes.push(Cause::required("eventTime"));
    }
    let kind = text(o, &["type"]);
    if kind != "Normal" && kind != "Warning" {
        causes.push(invalid("type", "", &format!("has invalid value: {kind}")));
    }
    for field in ["firstTimestamp", "lastTimestamp"] {
        if time_set(o, field) {
            causes.push(invalid(field, "", "needs to be unset"));
        }
    }
    if o.get("count").and_then(Value::as_i64).unwrap_or(0) != 0 {
        causes.push(invalid("count", "", "needs to be unset"));
    }
    if !text(o, &["source", "component"]).is_empty() || !text(o, &["source", "host"]).is_empty() {
        causes.push(invalid("source", "", "needs to be unset"));
    }
    causes
}

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
    Hooks { columns, cells: |o| cells(o, &CORE), validate: validate_core, ..Hooks::default() }
}

/// events.k8s.io/v1 Events: the core Events, converted. An update is
/// checked as any core Event is: upstream's stricter update rules compare
/// the new Event with itself (its strategy passes the new object as the
/// old), so the conformance suite changes an Event's note through this API.
pub fn events_v1_event_hooks() -> Hooks {
    Hooks {
        columns,
        cells: |o| cells(o, &EVENTS_V1),
        validate: |o| validate_core(&v1_to_core(o.clone())),
        validate_change: |_, new, old| match old {
            None => validate_v1_create(&v1_to_core(new.clone())),
            Some(_) => Vec::new(),
        },
        stored_under: Some(EVENTS_KEY_PREFIX),
        conversion: Some(Conversion { storage_api_version: "v1", to_storage: v1_to_core, from_storage: core_to_v1 }),
        ..Hooks::default()
    }
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
    fn the_two_versions_are_one_event_named_two_ways() {
        let v1 = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e", "namespace": "ns"},
            "regarding": {"kind": "Pod", "name": "web"}, "note": "n", "deprecatedSource": {"host": "h"},
            "deprecatedFirstTimestamp": "2024-01-01T00:00:00Z", "deprecatedLastTimestamp": "2024-01-01T00:01:00Z",
            "deprecatedCount": 2, "reportingController": "c", "reportingInstance": "i", "action": "A", "reason": "R",
            "type": "Normal", "eventTime": "2024-01-01T00:00:00.000000Z", "related": {"kind": "Node"},
            "series": {"count": 3, "lastObservedTime": "2024-01-01T00:02:00.000000Z"}
        });
        let core = v1_to_core(v1.clone());
        assert_eq!((&core["apiVersion"], &core["kind"]), (&json!("v1"), &json!("Event")));
        assert_eq!((&core["involvedObject"]["name"], &core["message"]), (&json!("web"), &json!("n")));
        assert_eq!((&core["source"]["host"], &core["count"]), (&json!("h"), &json!(2)));
        assert_eq!((&core["reportingComponent"], &core["series"]["count"]), (&json!("c"), &json!(3)));
        assert_eq!(core["firstTimestamp"], v1["deprecatedFirstTimestamp"]);
        assert!(core.get("note").is_none() && core.get("regarding").is_none());
        assert_eq!(core_to_v1(core), v1);
    }

    #[test]
    fn events_are_checked_as_upstream_checks_them() {
        let messages = |causes: Vec<Cause>| -> Vec<String> {
            causes.into_iter().map(|c| format!("{}: {}", c.field, c.message)).collect()
        };
        // Old-style Events name an object of their namespace, or a
        // cluster-scoped one from "default".
        let old = |ns: &str, regarding: &str| json!({"metadata": {"namespace": ns}, "involvedObject": {"namespace": regarding}});
        assert!(validate_core(&old("a", "a")).is_empty());
        assert!(validate_core(&old("default", "")).is_empty());
        assert_eq!(
            messages(validate_core(&old("a", "b"))),
            ["involvedObject.namespace: Invalid value: \"b\": does not match event.namespace"]
        );
        // New-style ones say who reported what.
        let new = json!({"metadata": {"namespace": "a"}, "involvedObject": {"namespace": "a"},
            "eventTime": "2024-01-01T00:00:00.000000Z", "reportingComponent": "ctl", "reportingInstance": "i",
            "action": "A", "reason": "R", "type": "Normal"});
        assert!(validate_core(&new).is_empty() && validate_v1_create(&new).is_empty());
        let mut bad = new.clone();
        bad["reportingComponent"] = json!("");
        bad["action"] = json!("x".repeat(129));
        bad["count"] = json!(4);
        bad["source"] = json!({"component": "k"});
        bad["type"] = json!("Odd");
        let mut got = messages(validate_core(&bad));
        got.extend(messages(validate_v1_create(&bad)));
        assert_eq!(got[0], "reportingController: Required value");
        for want in [
            "action: Invalid value: \"\": can have at most 128 characters",
            "type: Invalid value: \"\": has invalid value: Odd",
            "count: Invalid value: \"\": needs to be unset",
            "source: Invalid value: \"\": needs to be unset",
        ] {
            assert!(got.iter().any(|g| g == want), "{want} not in {got:?}");
        }
        let mut bare = new;
        bare.as_object_mut().unwrap().remove("eventTime");
        assert_eq!(messages(validate_v1_create(&bare)), ["eventTime: Required value"]);
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
