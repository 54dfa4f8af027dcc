//! The paths of one served resource in the v2 document: its collection,
//! its objects, each subresource discovery lists, the list across
//! namespaces and the deprecated `/watch/` paths, with upstream's
//! operations (operationId, tags, `x-kubernetes-action`,
//! `x-kubernetes-group-version-kind`, parameters, responses).

use serde_json::{json, Map, Value};

use super::definitions::reference;
use super::parameters::{self, delete_options, shared, write_options, LIST_OPTIONS};
use super::swagger::DocumentWriter;
use crate::apiserver::discovery::{self, SubKind};
use crate::apiserver::resource::Resource;

const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
const WATCH_EVENT: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent";
pub(super) const SCALE: &str = "io.k8s.api.autoscaling.v1.Scale";

/// The definition of a built-in kind by its group, version and kind, named
/// after its Go package as upstream's are (`policy`/`v1`/`Eviction` is
/// `io.k8s.api.policy.v1.Eviction`).
fn builtin_definition(group: &str, version: &str, kind: &str) -> String {
    let package = if group.is_empty() { "core" } else { group.trim_end_matches(".k8s.io") };
    format!("io.k8s.api.{package}.{version}.{kind}")
}

/// Capitalises after every character that is not a letter, underscore or
/// (past the first) digit, and drops those characters, as upstream names
/// operations (`rbac.authorization` → `RbacAuthorization`).
pub(super) fn operation_name(s: &str, capitalize_first: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut capitalize = capitalize_first;
    for (i, c) in s.chars().enumerate() {
        if c.is_alphabetic() || c == '_' || (i != 0 && c.is_ascii_digit()) {
            if capitalize {
                out.extend(c.to_uppercase());
                capitalize = false;
            } else {
                out.push(c);
            }
        } else {
            capitalize = true;
        }
    }
    out
}

fn article(kind: &str) -> &'static str {
    match kind.chars().next().map(|c| c.to_ascii_lowercase()) {
        Some('a' | 'e' | 'i' | 'o' | 'u') => "an",
        _ => "a",
    }
}

/// The paths of one resource.
pub(super) struct ResourcePaths<'a> {
    r: &'a Resource,
    /// The operationId's group and version (`AppsV1`) and the tag (`apps_v1`).
    group_version: String,
    tag: String,
    definition: String,
    list: String,
    produces: Vec<&'static str>,
    patch_types: Vec<&'static str>,
}

impl<'a> ResourcePaths<'a> {
    pub(super) fn new(r: &'a Resource, definition: String, list: String) -> Self {
        let group = if r.group.is_empty() { "core" } else { r.group.trim_end_matches(".k8s.io") };
        let custom = r.strategy.is_custom();
        let mut produces = vec!["application/json", "application/yaml"];
        let mut patch_types = vec!["application/json-patch+json", "application/merge-patch+json"];
        if !custom {
            produces.push("application/vnd.kubernetes.protobuf");
            patch_types.push("application/strategic-merge-patch+json");
        }
        patch_types.push("application/apply-patch+yaml");
        ResourcePaths {
            r,
            group_version: operation_name(group, true) + &operation_name(&r.version, true),
            tag: format!("{}_{}", operation_name(group, false), operation_name(&r.version, false)),
            definition,
            list,
            produces,
            patch_types,
        }
    }

    fn gvk(&self) -> Value {
        json!({"group": self.r.group, "kind": self.r.kind, "version": self.r.version})
    }

    fn has(&self, verb: &str) -> bool {
        self.r.verbs.iter().any(|v| v == verb)
    }

    /// One operation: `verb` starts the operationId, `rest` ends it.
    #[allow(clippy::too_many_arguments)]
    fn operation(
        &self,
        verb: &str,
        rest: &str,
        action: &str,
        description: String,
        params: Vec<Value>,
        responses: Value,
        gvk: Value,
    ) -> Value {
        let mut produces = self.produces.clone();
        let consumes = match action {
            "patch" => self.patch_types.clone(),
            _ => vec!["*/*"],
        };
        if action == "list" || action.starts_with("watch") {
            produces.extend(["application/json;stream=watch", "application/vnd.kubernetes.protobuf;stream=watch"]);
            if self.r.strategy.is_custom() {
                produces.pop();
            }
        }
        let mut op = json!({
            "consumes": consumes,
            "description": description,
            "operationId": format!("{verb}{}{}", self.group_version, operation_name(rest, true)),
            "produces": produces,
            "responses": responses,
            "schemes": ["https"],
            "tags": [self.tag],
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
        });
        if !params.is_empty() {
            op["parameters"] = Value::Array(params);
        }
        op
    }

    fn ok(&self, definition: &str, more: &[(&str, &str)]) -> Value {
        let mut out = json!({"200": {"description": "OK", "schema": reference(definition)}, "401": {"description": "Unauthorized"}});
        for (code, what) in more {
            out[*code] = json!({"description": what, "schema": reference(definition)});
        }
        out
    }

    fn body(&self, definition: &str) -> Value {
        json!({"in": "body", "name": "body", "required": true, "schema": reference(definition)})
    }

    /// The parameters a path gives all of its operations.
    fn path_parameters(&self, name: bool, namespace: bool, extra: &[&str]) -> Value {
        let mut out = Vec::new();
        if name {
            out.push(json!({"description": format!("name of the {}", self.r.kind), "in": "path", "name": "name",
                            "required": true, "type": "string", "uniqueItems": true}));
        }
        if namespace {
            out.push(shared("namespace"));
        }
        out.push(shared("pretty"));
        out.extend(extra.iter().map(|p| shared(p)));
        Value::Array(out)
    }

    pub(super) fn write(&self, w: &mut impl DocumentWriter) {
        let r = self.r;
        let kind = r.kind.as_str();
        let base =
            if r.group.is_empty() { format!("/api/{}", r.version) } else { format!("/apis/{}/{}", r.group, r.version) };
        let (scope, ns) =
            if r.namespaced { ("Namespaced", format!("/namespaces/{{namespace}}")) } else { ("", String::new()) };
        let collection = format!("{base}{ns}/{}", r.plural);
        let item = format!("{collection}/{{name}}");
        let def = self.definition.as_str();

        let mut coll = Map::new();
        if self.has("list") {
            let params = LIST_OPTIONS.iter().map(|p| shared(p)).collect();
            let description = format!("list or watch objects of kind {kind}");
            coll.insert(
                "get".into(),
                self.operation(
                    "list",
                    &format!("{scope}{kind}"),
                    "list",
                    description,
                    params,
                    self.ok(&self.list, &[]),
                    self.gvk(),
                ),
            );
        }
        if self.has("create") {
            let mut params = vec![self.body(def)];
            params.extend(write_options(false));
            let responses = self.ok(def, &[("201", "Created"), ("202", "Accepted")]);
            let description = format!("create {} {kind}", article(kind));
            coll.insert(
                "post".into(),
                self.operation("create", &format!("{scope}{kind}"), "post", description, params, responses, self.gvk()),
            );
        }
        if self.has("deletecollection") {
            let description = format!("delete collection of {kind}");
            let rest = format!("Collection{scope}{kind}");
            let op = self.operation(
                "delete",
                &rest,
                "deletecollection",
                description,
                delete_options(true),
                self.ok(STATUS, &[]),
                self.gvk(),
            );
            coll.insert("delete".into(), op);
        }
        if !coll.is_empty() {
            coll.insert("parameters".into(), self.path_parameters(false, r.namespaced, &[]));
            w.path(&collection, &Value::Object(coll));
        }

        let mut obj = Map::new();
        let rest = format!("{scope}{kind}");
        self.object_operations(&mut obj, &rest, "", def, &["get", "update", "patch"], self.gvk());
        if self.has("delete") {
            let description = format!("delete {} {kind}", article(kind));
            let responses = json!({"200": {"description": "OK", "schema": reference(STATUS)},
                                   "202": {"description": "Accepted", "schema": reference(STATUS)},
                                   "401": {"description": "Unauthorized"}});
            obj.insert(
                "delete".into(),
                self.operation("delete", &rest, "delete", description, delete_options(false), responses, self.gvk()),
            );
        }
        if !obj.is_empty() {
            obj.insert("parameters".into(), self.path_parameters(true, r.namespaced, &[]));
            w.path(&item, &Value::Object(obj));
        }

        for (sub, verbs, sub_kind) in discovery::subresources(r) {
            self.write_subresource(w, &item, &rest, &sub, &verbs, sub_kind);
        }
        if self.has("list") && r.namespaced {
            let description = format!("list or watch objects of kind {kind}");
            let op = self.operation(
                "list",
                &format!("{kind}ForAllNamespaces"),
                "list",
                description,
                Vec::new(),
                self.ok(&self.list, &[]),
                self.gvk(),
            );
            w.path(
                &format!("{base}/{}", r.plural),
                &json!({"get": op, "parameters": self.path_parameters(false, false, LIST_OPTIONS)}),
            );
        }
        if self.has("watch") {
            self.write_watches(w, &base, &ns, scope);
        }
    }

    /// The path of one subresource, by what it does: reads and writes of
    /// the object's own kind (`status`, `approval`, ...) or of a Scale, a
    /// create of another kind (`binding`, `eviction`, `token`), the pod
    /// log, or a connection (`exec`, `attach`, `portforward`, `proxy`).
    fn write_subresource(
        &self,
        w: &mut impl DocumentWriter,
        item: &str,
        rest: &str,
        sub: &str,
        verbs: &[&str],
        sub_kind: SubKind,
    ) {
        let r = self.r;
        let path = format!("{item}/{sub}");
        let rest = format!("{rest}{}", capitalized(sub));
        let mut ops = Map::new();
        match (sub, sub_kind) {
            ("scale", _) => {
                let gvk = json!({"group": "autoscaling", "kind": "Scale", "version": "v1"});
                self.object_operations(&mut ops, &rest, sub, SCALE, verbs, gvk);
            }
            ("log", _) => {
                let responses = json!({"200": {"description": "OK", "schema": {"type": "string"}}, "401": {"description": "Unauthorized"}});
                let description = format!("read log of the specified {}", r.kind);
                let mut op = self.operation("read", &rest, "get", description, Vec::new(), responses, self.gvk());
                op["produces"] = json!([
                    "text/plain",
                    "application/json",
                    "application/yaml",
                    "application/vnd.kubernetes.protobuf"
                ]);
                ops.insert("get".into(), op);
                let mut params = parameters::log_options();
                params.push(parameters::path("name", &format!("name of the {}", r.kind)));
                if r.namespaced {
                    params.push(shared("namespace"));
                }
                params.push(shared("pretty"));
                ops.insert("parameters".into(), Value::Array(params));
                return w.path(&path, &Value::Object(ops));
            }
            ("exec" | "attach" | "portforward" | "proxy", Some((_, _, options))) => {
                return self.write_connect(w, &path, &rest, sub, options);
            }
            (_, Some((group, version, kind))) => {
                let def = builtin_definition(group, version, kind);
                let gvk = json!({"group": group, "kind": kind, "version": version});
                let responses = self.ok(&def, &[("201", "Created"), ("202", "Accepted")]);
                let description = format!("create {sub} of {} {}", article(&r.kind), r.kind);
                ops.insert(
                    "post".into(),
                    self.operation("create", &rest, "post", description, vec![self.body(&def)], responses, gvk),
                );
                let mut params = write_options(false);
                params.push(parameters::path("name", &format!("name of the {kind}")));
                if r.namespaced {
                    params.push(shared("namespace"));
                }
                params.push(shared("pretty"));
                ops.insert("parameters".into(), Value::Array(params));
                return w.path(&path, &Value::Object(ops));
            }
            (_, None) => self.object_operations(&mut ops, &rest, sub, &self.definition, verbs, self.gvk()),
        }
        if !ops.is_empty() {
            ops.insert("parameters".into(), self.path_parameters(true, r.namespaced, &[]));
            w.path(&path, &Value::Object(ops));
        }
    }

    /// The paths of a connect subresource: every method its options kind
    /// takes, and for a proxy the same again under `/{path}`.
    fn write_connect(&self, w: &mut impl DocumentWriter, path: &str, rest: &str, sub: &str, options: &str) {
        let r = self.r;
        let methods: &[&str] = match sub {
            "proxy" => &["delete", "get", "head", "options", "patch", "post", "put"],
            _ => &["get", "post"],
        };
        let gvk = json!({"group": "", "kind": options, "version": "v1"});
        let responses =
            json!({"200": {"description": "OK", "schema": {"type": "string"}}, "401": {"description": "Unauthorized"}});
        let with_path: &[bool] = if sub == "proxy" { &[false, true] } else { &[false] };
        for &with_path in with_path {
            let mut ops = Map::new();
            for method in methods {
                let rest = format!("{}{rest}{}", capitalized(method), if with_path { "WithPath" } else { "" });
                let description = format!("connect {} requests to {sub} of {}", method.to_uppercase(), r.kind);
                let mut op = self.operation(
                    "connect",
                    &rest,
                    "connect",
                    description,
                    Vec::new(),
                    responses.clone(),
                    gvk.clone(),
                );
                op["produces"] = json!(["*/*"]);
                ops.insert(method.to_string(), op);
            }
            let mut params = vec![parameters::path("name", &format!("name of the {options}"))];
            if r.namespaced {
                params.push(shared("namespace"));
            }
            if with_path {
                params.push(parameters::path("path", "path to the resource"));
            }
            params.extend(parameters::connect_options(options));
            ops.insert("parameters".into(), Value::Array(params));
            let at = if with_path { format!("{path}/{{path}}") } else { path.to_string() };
            w.path(&at, &Value::Object(ops));
        }
    }

    /// Reads, replaces and patches of the object or one of its
    /// subresources (`sub`), whichever of `verbs` the resource serves.
    fn object_operations(
        &self,
        ops: &mut Map<String, Value>,
        rest: &str,
        sub: &str,
        def: &str,
        verbs: &[&str],
        gvk: Value,
    ) {
        let kind = &self.r.kind;
        let of = if sub.is_empty() { String::new() } else { format!(" {sub} of") };
        let served = |verb: &str| verbs.contains(&verb) && self.has(verb);
        if served("get") {
            let description = format!("read{of} the specified {kind}");
            ops.insert(
                "get".into(),
                self.operation("read", rest, "get", description, Vec::new(), self.ok(def, &[]), gvk.clone()),
            );
        }
        if served("update") {
            let mut params = vec![self.body(def)];
            params.extend(write_options(false));
            let description = format!("replace{of} the specified {kind}");
            let op = self.operation(
                "replace",
                rest,
                "put",
                description,
                params,
                self.ok(def, &[("201", "Created")]),
                gvk.clone(),
            );
            ops.insert("put".into(), op);
        }
        if served("patch") {
            let mut params = vec![shared("body-patch")];
            params.extend(write_options(true));
            let description = format!("partially update{of} the specified {kind}");
            let op =
                self.operation("patch", rest, "patch", description, params, self.ok(def, &[("201", "Created")]), gvk);
            ops.insert("patch".into(), op);
        }
    }

    /// The deprecated `/watch/` paths.
    fn write_watches(&self, w: &mut impl DocumentWriter, base: &str, ns: &str, scope: &str) {
        let r = self.r;
        let kind = r.kind.as_str();
        let responses = self.ok(WATCH_EVENT, &[]);
        let collection = format!("{base}/watch{ns}/{}", r.plural);
        let deprecated = "deprecated: use the 'watch' parameter with a list operation instead";
        let description = format!("watch individual changes to a list of {kind}. {deprecated}.");
        let op = self.operation(
            "watch",
            &format!("{scope}{kind}List"),
            "watchlist",
            description,
            Vec::new(),
            responses.clone(),
            self.gvk(),
        );
        w.path(&collection, &json!({"get": op, "parameters": self.path_parameters(false, r.namespaced, LIST_OPTIONS)}));
        let description = format!("watch changes to an object of kind {kind}. {deprecated}, filtered to a single item with the 'fieldSelector' parameter.");
        let op = self.operation(
            "watch",
            &format!("{scope}{kind}"),
            "watch",
            description,
            Vec::new(),
            responses.clone(),
            self.gvk(),
        );
        w.path(
            &format!("{collection}/{{name}}"),
            &json!({"get": op, "parameters": self.path_parameters(true, r.namespaced, LIST_OPTIONS)}),
        );
        if r.namespaced {
            let description = format!("watch individual changes to a list of {kind}. {deprecated}.");
            let op = self.operation(
                "watch",
                &format!("{kind}ListForAllNamespaces"),
                "watchlist",
                description,
                Vec::new(),
                responses,
                self.gvk(),
            );
            w.path(
                &format!("{base}/watch/{}", r.plural),
                &json!({"get": op, "parameters": self.path_parameters(false, false, LIST_OPTIONS)}),
            );
        }
    }
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_follow_upstream() {
        assert_eq!(operation_name("rbac.authorization", true), "RbacAuthorization");
        assert_eq!(operation_name("core", false), "core");
        assert_eq!(operation_name("v1beta1", true), "V1beta1");
        assert_eq!(operation_name("NamespacedE2e-test-crd", true), "NamespacedE2eTestCrd");
    }

    #[test]
    fn subresource_kinds_are_named_after_their_packages() {
        assert_eq!(builtin_definition("policy", "v1", "Eviction"), "io.k8s.api.policy.v1.Eviction");
        assert_eq!(
            builtin_definition("authentication.k8s.io", "v1", "TokenRequest"),
            "io.k8s.api.authentication.v1.TokenRequest"
        );
        assert_eq!(builtin_definition("", "v1", "Binding"), "io.k8s.api.core.v1.Binding");
    }
}
