//! The Swagger 2.0 document of `/openapi/v2`, built from the registry: the
//! paths of every served resource (`paths`), the discovery paths (`/api/`,
//! `/apis/`, each group and group version, `/version/`), the definitions
//! of every built-in kind and served custom resource version, and the
//! shared parameters and bearer-token security.
//!
//! Parameters every operation of a kind repeats (`pretty`, `namespace`,
//! the list options, the DeleteOptions and Patch bodies) are shared under
//! `#/parameters/`; the write options (`dryRun`, `fieldManager`,
//! `fieldValidation`, `force`) are written inline in each operation, as
//! upstream does: kubectl up to 1.25 decides whether a kind supports
//! server-side dry-run by finding `dryRun` among the parameters of its
//! PATCH operation.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use super::definitions;
use super::parameters::shared_parameters;
use super::paths::{operation_name, ResourcePaths, SCALE};
use crate::apiserver::crd::openapi_v2;
use crate::apiserver::registry::Registry;
use crate::apiserver::resource::Resource;

/// The built-in kind whose `apiVersion`, `kind` and `metadata` the
/// definitions made here copy.
const CONFIG_MAP: &str = "io.k8s.api.core.v1.ConfigMap";
const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
/// The meta kinds every group version serves.
const GROUP_VERSION_KINDS: &[&str] = &["DeleteOptions", "WatchEvent"];

/// The definition name of a resource's kind, and of its list kind.
fn definition_names(r: &Resource) -> (String, String) {
    let name = r.strategy.openapi_name().unwrap_or_else(|| {
        let group = if r.group.is_empty() { "core" } else { r.group.as_str() };
        format!("{}.{}.{}", group.split('.').rev().collect::<Vec<_>>().join("."), r.version, r.kind)
    });
    let list = match name.strip_suffix(r.kind.as_str()) {
        Some(prefix) => format!("{prefix}{}", r.list_kind),
        None => format!("{name}List"),
    };
    (name, list)
}

/// Where the document goes as it is made: its small fields first, then
/// every definition, then every path, one at a time. Building the document
/// as one JSON value took tens of MiB, which the allocator then held on
/// to; written so, the output buffer is most of what is ever held.
pub trait DocumentWriter {
    /// `head` holds the fields other than definitions and paths.
    fn start(&mut self, head: &Value);
    fn definition(&mut self, name: &str, schema: &Value);
    /// Every path comes after every definition.
    fn path(&mut self, name: &str, item: &Value);
    fn finish(self) -> Vec<u8>;
}

/// The document as JSON text, written into one buffer.
pub struct JsonWriter {
    out: Vec<u8>,
    /// The section being written: 0 none yet, 1 definitions, 2 paths.
    section: u8,
}

impl JsonWriter {
    /// A writer whose buffer starts at `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> JsonWriter {
        JsonWriter { out: Vec::with_capacity(capacity), section: 0 }
    }

    fn entry(&mut self, section: u8, name: &str, value: &Value) {
        if self.section != section {
            if self.section != 0 {
                self.out.push(b'}');
            }
            self.out.extend_from_slice(if section == 1 { b",\"definitions\":{" } else { b",\"paths\":{" });
            self.section = section;
        } else {
            self.out.push(b',');
        }
        // Writing JSON into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.out, name);
        self.out.push(b':');
        let _ = serde_json::to_writer(&mut self.out, value);
    }
}

impl DocumentWriter for JsonWriter {
    fn start(&mut self, head: &Value) {
        let _ = serde_json::to_writer(&mut self.out, head);
        // Left open for the sections.
        if self.out.last() == Some(&b'}') {
            self.out.pop();
        }
    }

    fn definition(&mut self, name: &str, schema: &Value) {
        self.entry(1, name, schema);
    }

    fn path(&mut self, name: &str, item: &Value) {
        self.entry(2, name, item);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.section != 0 {
            self.out.push(b'}');
        }
        self.out.push(b'}');
        self.out
    }
}

/// Writes the whole document for what `registry` serves now to `w`.
pub fn write<W: DocumentWriter>(registry: &Registry, mut w: W) -> Vec<u8> {
    w.start(&json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": crate::apiserver::discovery::KUBE_VERSION.2},
        "parameters": shared_parameters(),
        "security": [{"BearerToken": []}],
        "securityDefinitions": {"BearerToken": {"description": "Bearer Token authentication", "in": "header", "name": "authorization", "type": "apiKey"}},
    }));
    let resources = registry.all();
    let mut groups = vec![(String::new(), vec!["v1".to_string()])];
    groups.extend(registry.groups().into_iter().map(|g| (g.name, g.versions)));
    // The kinds each built-in definition describes.
    let mut gvks: HashMap<String, Vec<[&str; 3]>> = HashMap::new();
    gvks.entry(SCALE.to_string()).or_default().push(["autoscaling", "v1", "Scale"]);
    for (group, versions) in &groups {
        for version in versions {
            for kind in GROUP_VERSION_KINDS {
                gvks.entry(format!("{META}.{kind}")).or_default().push([group.as_str(), version.as_str(), kind]);
            }
        }
    }
    for r in resources.iter().filter(|r| !r.strategy.is_custom()) {
        let (name, _) = definition_names(r);
        gvks.entry(name).or_default().push([r.group.as_str(), r.version.as_str(), r.kind.as_str()]);
    }
    let mut written: HashSet<String> = HashSet::new();
    let mut object = None;
    if let Some(components) = crate::apiserver::builtin_schemas::components() {
        let config_map = components.get(CONFIG_MAP).map(|c| definitions::from_component(CONFIG_MAP, c));
        object = config_map.as_ref().map(definitions::object_properties);
        components.each(|name, schema| {
            let mut v2 = definitions::from_component(name, schema);
            for gvk in gvks.get(name).into_iter().flatten() {
                definitions::add_gvk(&mut v2, *gvk);
            }
            w.definition(name, &v2);
            written.insert(name.to_string());
        });
    }
    let object = object.unwrap_or_else(|| definitions::object_properties(&Value::Null));
    let mut named = Vec::with_capacity(resources.len());
    for r in &resources {
        let (name, list) = definition_names(r);
        let gvk = [r.group.as_str(), r.version.as_str(), r.kind.as_str()];
        if r.strategy.is_custom() {
            let schema = r.strategy.openapi_schemas().and_then(|(root, mut c)| c.remove(&root)).unwrap_or(Value::Null);
            w.definition(&name, &openapi_v2::definition(&schema, gvk, &object));
            written.insert(name.clone());
        } else if written.insert(name.clone()) {
            let mut def = json!({"type": "object"});
            for gvk in gvks.get(&name).into_iter().flatten() {
                definitions::add_gvk(&mut def, *gvk);
            }
            w.definition(&name, &def);
        }
        if r.verbs.iter().any(|v| v == "list") && !r.list_kind.is_empty() && written.insert(list.clone()) {
            let list_gvk = [r.group.as_str(), r.version.as_str(), r.list_kind.as_str()];
            w.definition(&list, &definitions::list(list_gvk, &r.kind, &name, &object));
        }
        named.push((name, list));
    }
    for (r, (name, list)) in resources.iter().zip(named) {
        ResourcePaths::new(r, name, list).write(&mut w);
    }
    write_discovery_paths(&mut w, &groups);
    w.finish()
}

/// A discovery path's operation, answered with `definition`.
fn discovery_operation(id: String, tag: &str, description: &str, definition: &str, json_only: bool) -> Value {
    let media: &[&str] = if json_only {
        &["application/json"]
    } else {
        &["application/json", "application/yaml", "application/vnd.kubernetes.protobuf"]
    };
    json!({"get": {
        "consumes": media,
        "description": description,
        "operationId": id,
        "produces": media,
        "responses": {"200": {"description": "OK", "schema": definitions::reference(definition)}, "401": {"description": "Unauthorized"}},
        "schemes": ["https"],
        "tags": [tag],
    }})
}

/// The discovery paths of `groups` (core first) and `/version/`.
fn write_discovery_paths<W: DocumentWriter>(w: &mut W, groups: &[(String, Vec<String>)]) {
    for (group, versions) in groups {
        let (name, tag) = if group.is_empty() {
            ("Core".to_string(), "core".to_string())
        } else {
            let trimmed = group.trim_end_matches(".k8s.io");
            (operation_name(trimmed, true), operation_name(trimmed, false))
        };
        let base = if group.is_empty() { "/api".to_string() } else { format!("/apis/{group}") };
        if group.is_empty() {
            let op = discovery_operation(
                format!("get{name}APIVersions"),
                &tag,
                "get available API versions",
                &format!("{META}.APIVersions"),
                false,
            );
            w.path("/api/", &op);
        } else {
            let op = discovery_operation(
                format!("get{name}APIGroup"),
                &tag,
                "get information of a group",
                &format!("{META}.APIGroup"),
                false,
            );
            w.path(&format!("{base}/"), &op);
        }
        for version in versions {
            let id = format!("get{name}{}APIResources", operation_name(version, true));
            let tag = format!("{tag}_{}", operation_name(version, false));
            let op =
                discovery_operation(id, &tag, "get available resources", &format!("{META}.APIResourceList"), false);
            w.path(&format!("{base}/{version}/"), &op);
        }
    }
    let op = discovery_operation(
        "getAPIVersions".into(),
        "apis",
        "get available API versions",
        &format!("{META}.APIGroupList"),
        false,
    );
    w.path("/apis/", &op);
    let op = discovery_operation(
        "getCodeVersion".into(),
        "version",
        "get the code version",
        "io.k8s.apimachinery.pkg.version.Info",
        true,
    );
    w.path("/version/", &op);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reference_resolves_and_deployments_patch_with_dry_run() {
        let doc: Value =
            serde_json::from_slice(&write(&Registry::builtin(), JsonWriter::with_capacity(0))).expect("JSON");
        let defs = doc["definitions"].as_object().expect("definitions");
        let params = doc["parameters"].as_object().expect("parameters");
        fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
            match v {
                Value::Object(m) => m.iter().for_each(|(k, v)| match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r),
                    _ => refs(v, out),
                }),
                Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        refs(&doc, &mut all);
        for r in all {
            let ok = match (r.strip_prefix("#/definitions/"), r.strip_prefix("#/parameters/")) {
                (Some(d), _) => defs.contains_key(d),
                (_, Some(p)) => params.contains_key(p),
                _ => false,
            };
            assert!(ok, "{r} does not resolve");
        }
        let patch = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(patch["operationId"], "patchAppsV1NamespacedDeployment");
        assert_eq!(
            patch["x-kubernetes-group-version-kind"],
            json!({"group": "apps", "kind": "Deployment", "version": "v1"})
        );
        assert!(patch["parameters"].as_array().expect("params").iter().any(|p| p["name"] == "dryRun"));
        let deployment = &defs["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(
            deployment["x-kubernetes-group-version-kind"],
            json!([{"group": "apps", "kind": "Deployment", "version": "v1"}])
        );
        assert!(defs.contains_key("io.k8s.api.apps.v1.DeploymentList"));
        assert_eq!(doc["paths"]["/api/v1/pods"]["get"]["operationId"], "listCoreV1PodForAllNamespaces");
        let paths = &doc["paths"];
        let eviction = &paths["/api/v1/namespaces/{namespace}/pods/{name}/eviction"]["post"];
        assert_eq!(eviction["operationId"], "createCoreV1NamespacedPodEviction");
        assert_eq!(
            eviction["x-kubernetes-group-version-kind"],
            json!({"group": "policy", "kind": "Eviction", "version": "v1"})
        );
        let proxy = &paths["/api/v1/nodes/{name}/proxy/{path}"]["head"];
        assert_eq!(proxy["operationId"], "connectCoreV1HeadNodeProxyWithPath");
        assert_eq!(proxy["x-kubernetes-group-version-kind"]["kind"], "NodeProxyOptions");
        assert_eq!(
            paths["/api/v1/namespaces/{namespace}/pods/{name}/portforward"]["post"]["operationId"],
            "connectCoreV1PostNamespacedPodPortforward"
        );
        assert_eq!(
            paths["/api/v1/namespaces/{namespace}/pods/{name}/log"]["get"]["operationId"],
            "readCoreV1NamespacedPodLog"
        );
        assert_eq!(paths["/apis/apps/"]["get"]["operationId"], "getAppsAPIGroup");
        assert_eq!(
            paths["/apis/rbac.authorization.k8s.io/v1/"]["get"]["operationId"],
            "getRbacAuthorizationV1APIResources"
        );
        assert_eq!(paths["/version/"]["get"]["operationId"], "getCodeVersion");
        assert!(defs["io.k8s.api.apps.v1.Deployment"].get("required").is_none(), "metadata is not required");
        let delete_options = defs["io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"]
            ["x-kubernetes-group-version-kind"]
            .as_array()
            .expect("gvks");
        assert!(delete_options.contains(&json!({"group": "apps", "kind": "DeleteOptions", "version": "v1"})));
    }
}
