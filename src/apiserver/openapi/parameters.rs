//! The parameters of the v2 document's operations: those shared under
//! `#/parameters/` (`pretty`, `namespace`, the list and delete options, the
//! DeleteOptions and Patch bodies), the write options each create, update
//! and patch carries inline, and the query options of the pod log and of
//! the connect subresources (exec, attach, port-forward, proxy).

use serde_json::{json, Map, Value};

use super::definitions::reference;

const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";

/// The shared list options, by name.
pub(super) const LIST_OPTIONS: &[&str] = &[
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
];

pub(super) fn query(name: &str, ty: &str, description: &str) -> Value {
    json!({"description": description, "in": "query", "name": name, "type": ty, "uniqueItems": true})
}

/// The parameters shared through `#/parameters/<name>`.
pub(super) fn shared_parameters() -> Value {
    let mut out = Map::new();
    let mut add = |p: Value| {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        out.insert(name, p);
    };
    add(query("allowWatchBookmarks", "boolean", "Asks a watch for BOOKMARK events, which the server may send."));
    add(query("continue", "string", "The continue token of the previous page of a chunked list."));
    add(query("fieldSelector", "string", "Selects the objects by their fields. Everything by default."));
    add(query("labelSelector", "string", "Selects the objects by their labels. Everything by default."));
    add(query("limit", "integer", "The most objects a list returns; the rest follows with `continue`."));
    add(query("resourceVersion", "string", "Which resource version a read may be served from."));
    add(query("resourceVersionMatch", "string", "How `resourceVersion` applies to a list: Exact or NotOlderThan."));
    add(query("sendInitialEvents", "boolean", "Starts a watch with the current state as synthetic ADDED events."));
    add(query("timeoutSeconds", "integer", "How long a list or watch call may last."));
    add(query("watch", "boolean", "Watches the objects and streams add, update and delete events."));
    add(query("pretty", "string", "If 'true', the output is pretty printed."));
    add(query("gracePeriodSeconds", "integer", "Seconds before the object is deleted; zero deletes at once."));
    add(query(
        "ignoreStoreReadErrorWithClusterBreakingPotential",
        "boolean",
        "Deletes an object that cannot be read from storage (unsafe).",
    ));
    add(query("orphanDependents", "boolean", "Deprecated: whether dependents are orphaned; use propagationPolicy."));
    add(query("propagationPolicy", "string", "How dependents are collected: Orphan, Background or Foreground."));
    out.insert(
        "namespace".into(),
        json!({"description": "The namespace, the scope of the object's name.", "in": "path", "name": "namespace",
               "required": true, "type": "string", "uniqueItems": true}),
    );
    out.insert(
        "body-delete-options".into(),
        json!({"in": "body", "name": "body", "schema": reference("io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions")}),
    );
    out.insert(
        "body-patch".into(),
        json!({"in": "body", "name": "body", "required": true, "schema": reference(PATCH)}),
    );
    Value::Object(out)
}

pub(super) fn shared(name: &str) -> Value {
    json!({"$ref": format!("#/parameters/{name}")})
}

pub(super) fn dry_run() -> Value {
    query("dryRun", "string", "When present, the changes are not persisted. Valid value: All.")
}

/// The inline options of a create, update or patch.
pub(super) fn write_options(patch: bool) -> Vec<Value> {
    let mut out = vec![
        dry_run(),
        query("fieldManager", "string", "The name of the actor or entity making these changes."),
        query(
            "fieldValidation",
            "string",
            "How unknown or duplicate fields in the object are handled: Ignore, Warn or Strict.",
        ),
    ];
    if patch {
        out.push(query("force", "boolean", "Applies even when fields are managed by others, taking them over."));
    }
    out
}

/// The options of a delete, or of a delete of a collection.
pub(super) fn delete_options(collection: bool) -> Vec<Value> {
    let mut out = vec![shared("body-delete-options")];
    if collection {
        out.extend(["continue"].map(shared));
    }
    out.push(dry_run());
    if collection {
        out.push(shared("fieldSelector"));
    }
    out.extend(["gracePeriodSeconds", "ignoreStoreReadErrorWithClusterBreakingPotential"].map(shared));
    if collection {
        out.extend(["labelSelector", "limit"].map(shared));
    }
    out.extend(["orphanDependents", "propagationPolicy"].map(shared));
    if collection {
        out.extend(["resourceVersion", "resourceVersionMatch", "sendInitialEvents", "timeoutSeconds"].map(shared));
    }
    out
}

/// A required path parameter.
pub(super) fn path(name: &str, description: &str) -> Value {
    json!({"description": description, "in": "path", "name": name, "required": true, "type": "string", "uniqueItems": true})
}

/// The query options of `pods/log` (PodLogOptions).
pub(super) fn log_options() -> Vec<Value> {
    vec![
        query("container", "string", "The container whose log is read; the only one by default."),
        query("follow", "boolean", "Streams the log as it grows."),
        query(
            "insecureSkipTLSVerifyBackend",
            "boolean",
            "Reads the log without checking the kubelet's serving certificate.",
        ),
        query("limitBytes", "integer", "The most bytes read; the last line may be cut."),
        query("previous", "boolean", "Reads the log of the container's previous instance."),
        query("sinceSeconds", "integer", "Reads only what was logged in the last this many seconds."),
        query("tailLines", "integer", "Reads only this many lines from the end."),
        query("timestamps", "boolean", "Starts each line with its RFC3339 timestamp."),
    ]
}

/// The query options of a connect subresource (`exec`, `attach`,
/// `portforward`, `proxy`), by its options kind, in name order.
pub(super) fn connect_options(options_kind: &str) -> Vec<Value> {
    let streams = || {
        vec![
            query("stderr", "boolean", "Streams the container's standard error."),
            query("stdin", "boolean", "Streams to the container's standard input."),
            query("stdout", "boolean", "Streams the container's standard output."),
            query("tty", "boolean", "Allocates a terminal for the call."),
        ]
    };
    let container = || query("container", "string", "The container; the only one by default.");
    match options_kind {
        "PodExecOptions" => {
            let mut out = vec![
                query("command", "string", "The command to run, one argument per value, without a shell."),
                container(),
            ];
            out.extend(streams());
            out
        }
        "PodAttachOptions" => {
            let mut out = vec![container()];
            out.extend(streams());
            out
        }
        "PodPortForwardOptions" => vec![query("ports", "integer", "The ports of the pod to forward.")],
        _ => vec![query("path", "string", "The URL path of the proxied request.")],
    }
}
