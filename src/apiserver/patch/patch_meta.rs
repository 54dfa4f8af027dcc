//! How lists and maps merge, read from the schema, as upstream's PatchMeta:
//! `x-kubernetes-patch-strategy` and `x-kubernetes-patch-merge-key` for
//! strategic merge patch, `x-kubernetes-list-type` and
//! `x-kubernetes-list-map-keys` for server-side apply. Never from a
//! field's name: `ports` merge by `containerPort` in a Container and by
//! `port` in a ServiceSpec, and `tolerations` do not merge at all.
//!
//! The `k8s-openapi` schemas carry no patch extensions, so the built-in
//! types' strategies (upstream's `patchStrategy`/`patchMergeKey` struct
//! tags of Kubernetes v1.33) are written into the embedded components
//! when the test that generates them runs (`builtin_schemas::tests::annotate`);
//! the served OpenAPI documents then carry them too, as upstream's do.
//! Custom resources bring theirs in the CRD's schema.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A quantity that does not parse, at `path` (`.spec.containers[0].resources.limits.cpu`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'", .path.trim_start_matches('.'))]
pub struct InvalidQuantity {
    pub path: String,
}

impl InvalidQuantity {
    /// The same quantity seen from the field `segment` up.
    fn under(mut self, segment: &str) -> InvalidQuantity {
        self.path.insert_str(0, segment);
        self
    }
}

/// The component every `resource.Quantity` refers to.
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

/// The components of an OpenAPI document, by name, with what is known of
/// them: every built-in kind shares one set, a CRD version has its own.
#[derive(Debug, Default)]
pub struct Components {
    /// By name: every step through a `$ref` looks one up, and a hash beats
    /// a tree walk comparing names that share their first 20 bytes.
    by_name: HashMap<String, Component>,
    /// The components under which no quantity can be found (an ObjectMeta,
    /// a Probe), which canonicalizing a write does not walk.
    quantity_free: HashSet<String>,
}

/// One component: its JSON text, parsed the first time a walk reaches it.
/// Writes reach few of the built-in kinds' 437 components (those of the
/// fields that objects set); all of them parsed held 3.4 MiB.
#[derive(Debug)]
struct Component {
    text: Option<Box<RawValue>>,
    parsed: OnceLock<Value>,
}

impl Component {
    fn value(&self) -> &Value {
        self.parsed.get_or_init(|| self.parse())
    }

    /// A parsed copy, leaving the one walks use as it was.
    fn to_value(&self) -> Value {
        self.parsed.get().cloned().unwrap_or_else(|| self.parse())
    }

    fn parse(&self) -> Value {
        let Some(text) = &self.text else { return Value::Null };
        serde_json::from_str(text.get()).unwrap_or_else(|e| {
            tracing::error!("an OpenAPI component does not parse: {e}");
            Value::Null
        })
    }
}

impl Components {
    /// Components already parsed (a CRD's).
    pub fn new(components: Map<String, Value>) -> Components {
        let referenced = components
            .iter()
            .map(|(name, schema)| {
                let mut out = Vec::new();
                refs(schema, &mut out);
                (name.clone(), out.into_iter().map(str::to_string).collect())
            })
            .collect();
        let quantity_free = quantity_free(referenced);
        let by_name = components
            .into_iter()
            .map(|(name, schema)| (name, Component { text: None, parsed: OnceLock::from(schema) }))
            .collect();
        Components { by_name, quantity_free }
    }

    /// Components as JSON text (the built-in kinds'), each parsed when
    /// first reached.
    pub fn from_text(components: HashMap<String, Box<RawValue>>) -> Components {
        let referenced = components.iter().map(|(name, text)| (name.clone(), text_refs(text.get()))).collect();
        let quantity_free = quantity_free(referenced);
        let by_name = components
            .into_iter()
            .map(|(name, text)| (name, Component { text: Some(text), parsed: OnceLock::new() }))
            .collect();
        Components { by_name, quantity_free }
    }
}

impl Components {
    /// Hands `f` every component in name order, a parsed copy at a time
    /// (for the OpenAPI v2 document, which lists them all).
    pub fn each(&self, mut f: impl FnMut(&str, Value)) {
        let mut names: Vec<&String> = self.by_name.keys().collect();
        names.sort();
        for name in names {
            f(name, self.by_name[name].to_value());
        }
    }

    /// A parsed copy of one component.
    pub fn get(&self, name: &str) -> Option<Value> {
        self.by_name.get(name).map(Component::to_value)
    }
}

/// A kind's root schema, among the components.
#[derive(Debug, Default, Clone)]
pub struct SchemaSet {
    pub root: String,
    pub components: Arc<Components>,
}

impl SchemaSet {
    pub fn new(root: String, components: Map<String, Value>) -> SchemaSet {
        SchemaSet::sharing(root, Arc::new(Components::new(components)))
    }

    pub fn sharing(root: String, components: Arc<Components>) -> SchemaSet {
        SchemaSet { root, components }
    }

    /// The components the root reaches through `$ref`s (itself included),
    /// as an OpenAPI document lists them.
    pub fn components(&self) -> Map<String, Value> {
        let mut out = Map::new();
        let mut pending = vec![self.root.clone()];
        while let Some(name) = pending.pop() {
            if out.contains_key(&name) {
                continue;
            }
            let Some(component) = self.components.by_name.get(&name) else { continue };
            let schema = component.to_value();
            let mut to = Vec::new();
            refs(&schema, &mut to);
            pending.extend(to.into_iter().filter(|r| !out.contains_key(*r)).map(str::to_string));
            out.insert(name, schema);
        }
        out
    }

    fn component(&self, name: &str) -> Option<&Value> {
        self.components.by_name.get(name).map(Component::value)
    }
}

/// The component names `schema` refers to, however deep.
fn refs<'a>(schema: &'a Value, out: &mut Vec<&'a str>) {
    match schema {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push(r.rsplit('/').next().unwrap_or_default()),
                    _ => refs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

/// The component names in a component's JSON text. In JSON text a quote
/// inside a string is escaped, so `"$ref":"` can only be a key and its value.
fn text_refs(text: &str) -> Vec<String> {
    const KEY: &str = "\"$ref\":\"";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(KEY) {
        rest = &rest[at + KEY.len()..];
        let end = rest.find('"').unwrap_or(rest.len());
        out.push(rest[..end].rsplit('/').next().unwrap_or_default().to_string());
        rest = &rest[end..];
    }
    out
}

/// The names of the components that reach no `Quantity` through their
/// `$ref`s, however deep, from what each component refers to.
fn quantity_free(referenced: Vec<(String, Vec<String>)>) -> HashSet<String> {
    let mut holding: HashSet<&str> = HashSet::from([QUANTITY]);
    loop {
        let before = holding.len();
        for (name, to) in &referenced {
            if !holding.contains(name.as_str()) && to.iter().any(|r| holding.contains(r.as_str())) {
                holding.insert(name);
            }
        }
        if holding.len() == before {
            break;
        }
    }
    referenced.iter().filter(|(n, _)| !holding.contains(n.as_str())).map(|(n, _)| n.clone()).collect()
}

/// How a list merges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListMerge {
    /// Items are objects, merged by these keys.
    ByKey(Vec<String>),
    /// A list of scalars merged as a set.
    Set,
    /// Replaced as a whole (atomic), the default.
    Replace,
}

/// A place in a schema: the schema of one value, or none (unknown shape:
/// every list atomic, as upstream treats fields without patch metadata).
#[derive(Clone, Copy)]
pub struct SchemaNode<'a> {
    set: Option<&'a SchemaSet>,
    schema: Option<&'a Value>,
    /// The component last referenced on the way here.
    component: Option<&'a str>,
    /// The property's own schema before references were followed: where
    /// the patch extensions of a referenced type's field sit.
    declared: Option<&'a Value>,
}

impl<'a> SchemaNode<'a> {
    /// No schema at all.
    pub fn none() -> SchemaNode<'static> {
        SchemaNode { set: None, schema: None, component: None, declared: None }
    }

    /// The root of a kind's schema, when it has one.
    pub fn of(set: Option<&'a SchemaSet>) -> SchemaNode<'a> {
        match set {
            Some(set) => SchemaNode::root(set),
            None => SchemaNode::none(),
        }
    }

    /// The root of a kind's schema.
    pub fn root(set: &'a SchemaSet) -> SchemaNode<'a> {
        let node = SchemaNode {
            set: Some(set),
            schema: set.component(&set.root),
            component: Some(set.root.as_str()),
            declared: None,
        };
        node.resolved()
    }

    /// Follows `$ref` (and a single-element `allOf`, as generators wrap references).
    fn resolved(self) -> SchemaNode<'a> {
        let (mut schema, mut component) = (self.schema, self.component);
        for _ in 0..16 {
            let Some(s) = schema else { break };
            if let Some(r) = s.get("$ref").and_then(Value::as_str) {
                let name = r.rsplit('/').next().unwrap_or_default();
                component = Some(name);
                schema = self.set.and_then(|c| c.component(name));
            } else if let Some([only]) = s.get("allOf").and_then(Value::as_array).map(Vec::as_slice) {
                schema = Some(only);
            } else {
                break;
            }
        }
        SchemaNode { set: self.set, schema, component, declared: self.declared }
    }

    fn child(self, schema: Option<&'a Value>) -> SchemaNode<'a> {
        SchemaNode { set: self.set, schema, component: None, declared: schema }.resolved()
    }

    /// Whether this value is a `resource.Quantity`.
    pub fn is_quantity(&self) -> bool {
        self.component == Some(QUANTITY)
    }

    /// Rewrites every quantity under `value` in upstream's canonical form
    /// (`0.5` → `500m`, `1024Mi` → `1Gi`), as a Go apiserver's decode and
    /// encode round trip does; the error names the first quantity that does
    /// not parse (`.spec.containers[0].resources.limits.cpu`). One walk,
    /// and a path is built only for the error.
    pub fn canonicalize_quantities(self, value: &mut Value) -> Result<(), InvalidQuantity> {
        if let (Some(set), Some(component)) = (self.set, self.component) {
            if set.components.quantity_free.contains(component) {
                return Ok(());
            }
        }
        match value {
            Value::String(s) if self.is_quantity() => {
                if !crate::quantity::is_valid(s) {
                    return Err(InvalidQuantity { path: String::new() });
                }
                if let Some(c) = crate::quantity::canonical(s) {
                    *s = c;
                }
            }
            Value::Object(m) if self.schema.is_some() => {
                for (k, v) in m.iter_mut() {
                    self.field(k).canonicalize_quantities(v).map_err(|e| e.under(&format!(".{k}")))?;
                }
            }
            Value::Array(items) if self.schema.is_some() => {
                for (i, v) in items.iter_mut().enumerate() {
                    self.items().canonicalize_quantities(v).map_err(|e| e.under(&format!("[{i}]")))?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn extension(&self, name: &str) -> Option<&'a Value> {
        self.declared.and_then(|d| d.get(name)).or_else(|| self.schema?.get(name))
    }

    /// Takes the line breaks out of every base64 string (`format: byte`)
    /// under `value`, as Go's decoder skips `\r` and `\n` (a Secret's
    /// data pasted from `base64` output wraps at 76 columns); whether any
    /// was taken out.
    pub fn strip_base64_line_breaks(self, value: &mut Value) -> bool {
        let Some(schema) = self.schema else { return false };
        match value {
            Value::String(s) if schema.get("format").and_then(Value::as_str) == Some("byte") => {
                let had = s.contains(['\r', '\n']);
                if had {
                    s.retain(|c| c != '\r' && c != '\n');
                }
                had
            }
            Value::Object(m) => {
                let mut any = false;
                for (k, v) in m.iter_mut() {
                    any |= self.field(k).strip_base64_line_breaks(v);
                }
                any
            }
            Value::Array(items) => {
                let mut any = false;
                for v in items.iter_mut() {
                    any |= self.items().strip_base64_line_breaks(v);
                }
                any
            }
            _ => false,
        }
    }

    /// The schema of an object's field (or of a map's values).
    pub fn field(self, name: &str) -> SchemaNode<'a> {
        let Some(s) = self.schema else { return self.child(None) };
        let prop = s.get("properties").and_then(|p| p.get(name));
        let prop = prop.or_else(|| s.get("additionalProperties").filter(|a| a.is_object()));
        self.child(prop)
    }

    /// The schema of a list's items.
    pub fn items(self) -> SchemaNode<'a> {
        let Some(s) = self.schema else { return self.child(None) };
        self.child(s.get("items"))
    }

    fn patch_strategy(&self) -> &'a str {
        self.extension("x-kubernetes-patch-strategy").and_then(Value::as_str).unwrap_or_default()
    }

    /// Whether a strategic merge patch keeps only the keys it names (`retainKeys`).
    pub fn retains_keys(&self) -> bool {
        self.patch_strategy().split(',').any(|s| s == "retainKeys")
    }

    /// Whether a strategic merge patch replaces this value whole.
    pub fn replaces(&self) -> bool {
        self.patch_strategy().split(',').any(|s| s == "replace")
    }

    /// How a strategic merge patch merges this list: `x-kubernetes-patch-strategy`
    /// with `x-kubernetes-patch-merge-key`; replaced otherwise.
    pub fn patch_list_merge(&self) -> ListMerge {
        if !self.patch_strategy().split(',').any(|s| s == "merge") {
            return ListMerge::Replace;
        }
        match self.extension("x-kubernetes-patch-merge-key").and_then(Value::as_str) {
            Some(k) => ListMerge::ByKey(vec![k.to_string()]),
            None => ListMerge::Set,
        }
    }

    /// How server-side apply merges this list: `x-kubernetes-list-type`
    /// with `x-kubernetes-list-map-keys`; atomic otherwise.
    pub fn apply_list_merge(&self) -> ListMerge {
        match self.extension("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("map") => {
                let keys: Vec<String> = self
                    .extension("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                    .unwrap_or_default();
                if keys.is_empty() {
                    ListMerge::Replace
                } else {
                    ListMerge::ByKey(keys)
                }
            }
            Some("set") => ListMerge::Set,
            _ => ListMerge::Replace,
        }
    }
}

/// A kind's schema set, shared.
pub type SharedSchema = Arc<SchemaSet>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_schema() -> SchemaSet {
        let set = crate::apiserver::builtin_schemas::schema_set("v1", "Pod").expect("the pod's schema");
        Arc::unwrap_or_clone(set)
    }

    #[test]
    fn merge_keys_come_from_the_schema_not_the_field_name() {
        let set = pod_schema();
        let spec = SchemaNode::root(&set).field("spec");
        let containers = spec.field("containers");
        assert_eq!(containers.patch_list_merge(), ListMerge::ByKey(vec!["name".into()]));
        let ports = containers.items().field("ports");
        assert_eq!(ports.patch_list_merge(), ListMerge::ByKey(vec!["containerPort".into()]));
        assert_eq!(ports.apply_list_merge(), ListMerge::ByKey(vec!["containerPort".into()]));
        assert_eq!(spec.field("tolerations").patch_list_merge(), ListMerge::Replace);
        assert_eq!(spec.field("readinessGates").patch_list_merge(), ListMerge::Replace);
        assert!(spec.field("volumes").items().field("name").schema.is_some());
        let meta = SchemaNode::root(&set).field("metadata");
        assert_eq!(meta.field("finalizers").patch_list_merge(), ListMerge::Set);
        assert_eq!(meta.field("ownerReferences").patch_list_merge(), ListMerge::ByKey(vec!["uid".into()]));
        let limits = containers.items().field("resources").field("limits");
        assert!(limits.field("cpu").is_quantity());
        let mut pod = json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "lots"}}}]}});
        assert_eq!(
            SchemaNode::root(&set).canonicalize_quantities(&mut pod),
            Err(InvalidQuantity { path: ".spec.containers[0].resources.limits.cpu".to_string() })
        );
        let mut pod = json!({"spec": {"containers": [{"name": "0.5", "resources": {"limits": {"cpu": "0.5", "memory": "1024Mi"}}}]}});
        assert_eq!(SchemaNode::root(&set).canonicalize_quantities(&mut pod), Ok(()));
        assert_eq!(
            pod,
            json!({"spec": {"containers": [{"name": "0.5", "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}}]}})
        );
        // A map's values: labels are strings, with no list strategy.
        assert_eq!(meta.field("labels").field("anything").patch_list_merge(), ListMerge::Replace);
    }

    #[test]
    fn components_read_as_text_are_those_given_parsed() {
        let components = json!({
            QUANTITY: {"type": "string"},
            "A": {"properties": {"limit": {"$ref": format!("#/components/schemas/{QUANTITY}")}}},
            "B": {"properties": {"a": {"allOf": [{"$ref": "#/components/schemas/A"}]}}},
            // A quote in a string is escaped: this names no component.
            "C": {"description": "not \"$ref\":\"#/components/schemas/A\"", "type": "object"},
            "D": {"properties": {"c": {"$ref": "#/components/schemas/C"}}},
        });
        let Value::Object(parsed) = components else { unreachable!() };
        let text =
            parsed.iter().map(|(k, v)| (k.clone(), RawValue::from_string(v.to_string()).expect("raw"))).collect();
        let (given, read) = (Components::new(parsed.clone()), Components::from_text(text));
        assert_eq!(given.quantity_free, HashSet::from(["C".to_string(), "D".to_string()]));
        assert_eq!(read.quantity_free, given.quantity_free);
        let (given, read) =
            (SchemaSet::sharing("B".into(), Arc::new(given)), SchemaSet::sharing("B".into(), Arc::new(read)));
        assert!(read.components.by_name["B"].parsed.get().is_none(), "parsed only when reached");
        assert_eq!(read.components(), given.components());
        assert_eq!(read.components().keys().collect::<Vec<_>>(), ["A", "B", QUANTITY]);
        let mut b = json!({"a": {"limit": "0.5"}});
        assert_eq!(SchemaNode::root(&read).canonicalize_quantities(&mut b), Ok(()));
        assert_eq!(b, json!({"a": {"limit": "500m"}}));
        assert!(read.components.by_name["A"].parsed.get().is_some());
        assert!(read.components.by_name["D"].parsed.get().is_none());
    }

    #[test]
    fn canonicalizing_walks_only_what_can_hold_a_quantity() {
        let set = pod_schema();
        for name in [
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
            "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry",
            "io.k8s.api.core.v1.Probe",
            "io.k8s.api.core.v1.ContainerPort",
            "io.k8s.api.core.v1.SecurityContext",
            "io.k8s.api.core.v1.PodCondition",
        ] {
            assert!(set.components.quantity_free.contains(name), "{name} holds no quantity");
        }
        for holding in ["Pod", "PodSpec", "PodStatus", "Container", "Volume", "EmptyDirVolumeSource", "ContainerStatus"]
        {
            let name = format!("io.k8s.api.core.v1.{holding}");
            assert!(
                set.component(&name).is_some() && !set.components.quantity_free.contains(&name),
                "{name} holds one"
            );
        }
        assert!(!set.components.quantity_free.contains(QUANTITY));
        // Quantities deep in the spec and the status are still canonicalized.
        let mut pod = json!({
            "metadata": {"name": "p", "labels": {"cpu": "0.5"}},
            "spec": {"volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1024Mi"}}], "overhead": {"cpu": "0.1"},
                     "containers": [{"name": "c", "env": [{"name": "x", "value": "0.5"}]}]},
            "status": {"containerStatuses": [{"name": "c", "allocatedResources": {"memory": "2048Ki"}}]}
        });
        assert_eq!(SchemaNode::root(&set).canonicalize_quantities(&mut pod), Ok(()));
        assert_eq!(pod.pointer("/spec/volumes/0/emptyDir/sizeLimit"), Some(&json!("1Gi")));
        assert_eq!(pod.pointer("/spec/overhead/cpu"), Some(&json!("100m")));
        assert_eq!(pod.pointer("/status/containerStatuses/0/allocatedResources/memory"), Some(&json!("2Mi")));
        assert_eq!(pod.pointer("/metadata/labels/cpu"), Some(&json!("0.5")));
        assert_eq!(pod.pointer("/spec/containers/0/env/0/value"), Some(&json!("0.5")));
        let mut bad = json!({"status": {"containerStatuses": [{"name": "c", "allocatedResources": {"cpu": "x"}}]}});
        assert_eq!(
            SchemaNode::root(&set).canonicalize_quantities(&mut bad),
            Err(InvalidQuantity { path: ".status.containerStatuses[0].allocatedResources.cpu".to_string() })
        );
    }

    #[test]
    fn every_table_entry_names_a_real_property() {
        let mut components = Map::new();
        macro_rules! add {
            ($($t:ty),*) => {$({
                let mut g = schemars::generate::SchemaSettings::openapi3().into_generator();
                let _ = g.subschema_for::<$t>();
                components.extend(g.take_definitions(true));
            })*};
        }
        use k8s_openapi::api::*;
        add!(
            core::v1::Pod,
            core::v1::Service,
            core::v1::ServiceAccount,
            core::v1::Node,
            core::v1::Namespace,
            core::v1::PersistentVolumeClaim,
            core::v1::ReplicationController,
            core::v1::ComponentStatus,
            apps::v1::Deployment,
            apps::v1::StatefulSet,
            apps::v1::DaemonSet,
            apps::v1::ReplicaSet,
            autoscaling::v2::HorizontalPodAutoscaler,
            batch::v1::Job,
            flowcontrol::v1::FlowSchema,
            flowcontrol::v1::PriorityLevelConfiguration,
            networking::v1::ServiceCIDR,
            policy::v1::PodDisruptionBudget,
            storage::v1::CSINode,
            admissionregistration::v1::ValidatingAdmissionPolicy,
            admissionregistration::v1::ValidatingWebhookConfiguration,
            admissionregistration::v1::MutatingWebhookConfiguration
        );
        use crate::apiserver::builtin_schemas::tests::{property_mut, PATCH_STRATEGIES};
        for (component, property, _, _) in PATCH_STRATEGIES {
            assert!(property_mut(&mut components, component, property).is_some(), "{component}.{property}");
        }
    }
}
