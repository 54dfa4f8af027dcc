//! The OpenAPI components of the built-in kinds: `k8s-openapi`'s
//! descriptions of its types (upstream's field docs, formats, `$ref`s), with
//! upstream's patch strategies written in by `tests::annotate`.
//!
//! They are not generated at run time. A test,
//! `the_embedded_components_are_what_k8s_openapi_describes`, generates them
//! from the types with `schemars` and requires them to equal
//! `builtin_schemas.json` (one component a line, so that a change reads as
//! a diff); `FERROK_WRITE_SCHEMAS=1` makes it write the file instead.
//! `build.rs` deflates the file into the binary: about 140 KB there, where
//! the generating code was 3 MB. The file is inflated once, on first use;
//! every built-in kind shares its components, and each component is parsed
//! when a walk first reaches it.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::apiserver::patch::patch_meta::{Components, SchemaSet, SharedSchema};

/// `builtin_schemas.json`, deflated by `build.rs`.
static EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/builtin_schemas.json.deflate"));

/// The file's shape.
#[derive(Deserialize)]
struct Embedded {
    /// `apiVersion/kind` → the component that describes the kind.
    roots: HashMap<String, String>,
    components: HashMap<String, Box<RawValue>>,
}

struct Builtin {
    roots: HashMap<String, String>,
    components: Arc<Components>,
}

static BUILTIN: LazyLock<Option<Builtin>> = LazyLock::new(|| match load() {
    Ok(builtin) => Some(builtin),
    Err(e) => {
        // Only a broken build gets here: the test reads the same bytes.
        tracing::error!("the built-in OpenAPI components do not load ({e}); patches merge lists atomically");
        None
    }
});

/// Why the embedded components do not load (a broken build).
#[derive(Debug, thiserror::Error)]
enum LoadError {
    #[error("inflate: {0}")]
    Inflate(miniz_oxide::inflate::DecompressError),
    #[error("{0}")]
    Parse(#[from] serde_json::Error),
}

fn inflate() -> Result<Vec<u8>, LoadError> {
    miniz_oxide::inflate::decompress_to_vec(EMBEDDED).map_err(LoadError::Inflate)
}

fn load() -> Result<Builtin, LoadError> {
    let file: Embedded = serde_json::from_slice(&inflate()?)?;
    Ok(Builtin { roots: file.roots, components: Arc::new(Components::from_text(file.components)) })
}

fn key(api_version: &str, kind: &str) -> String {
    format!("{api_version}/{kind}")
}

/// The name of the component that describes a built-in kind
/// (`io.k8s.api.core.v1.Pod` for `v1`, `Pod`).
pub fn root_name(api_version: &str, kind: &str) -> Option<String> {
    BUILTIN.as_ref()?.roots.get(&key(api_version, kind)).cloned()
}

/// The components every built-in kind shares: the kinds', and the meta
/// types their operations refer to (`ListMeta`, `Status`, `DeleteOptions`,
/// `Patch`, `WatchEvent`, autoscaling/v1 `Scale`).
pub fn components() -> Option<Arc<Components>> {
    Some(BUILTIN.as_ref()?.components.clone())
}

/// A built-in kind's schema set, over the components every kind shares.
pub fn schema_set(api_version: &str, kind: &str) -> Option<SharedSchema> {
    let builtin = BUILTIN.as_ref()?;
    let root = builtin.roots.get(&key(api_version, kind))?;
    Some(Arc::new(SchemaSet::sharing(root.clone(), builtin.components.clone())))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Map, Value};

    use super::*;
    use crate::apiserver::registry::Registry;

    /// `(component, property, x-kubernetes-patch-strategy, x-kubernetes-patch-merge-key)`
    /// of the built-in types ferrok serves.
    pub(crate) const PATCH_STRATEGIES: &[(&str, &str, &str, Option<&str>)] = &[
        ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "finalizers", "merge", None),
        ("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "ownerReferences", "merge", Some("uid")),
        ("io.k8s.api.core.v1.Container", "ports", "merge", Some("containerPort")),
        ("io.k8s.api.core.v1.Container", "env", "merge", Some("name")),
        ("io.k8s.api.core.v1.Container", "volumeMounts", "merge", Some("mountPath")),
        ("io.k8s.api.core.v1.Container", "volumeDevices", "merge", Some("devicePath")),
        ("io.k8s.api.core.v1.EphemeralContainer", "ports", "merge", Some("containerPort")),
        ("io.k8s.api.core.v1.EphemeralContainer", "env", "merge", Some("name")),
        ("io.k8s.api.core.v1.EphemeralContainer", "volumeMounts", "merge", Some("mountPath")),
        ("io.k8s.api.core.v1.EphemeralContainer", "volumeDevices", "merge", Some("devicePath")),
        ("io.k8s.api.core.v1.ContainerStatus", "volumeMounts", "merge", Some("mountPath")),
        ("io.k8s.api.core.v1.ContainerStatus", "allocatedResourcesStatus", "merge", Some("name")),
        ("io.k8s.api.core.v1.PodSpec", "volumes", "merge,retainKeys", Some("name")),
        ("io.k8s.api.core.v1.PodSpec", "initContainers", "merge", Some("name")),
        ("io.k8s.api.core.v1.PodSpec", "containers", "merge", Some("name")),
        ("io.k8s.api.core.v1.PodSpec", "ephemeralContainers", "merge", Some("name")),
        ("io.k8s.api.core.v1.PodSpec", "imagePullSecrets", "merge", Some("name")),
        ("io.k8s.api.core.v1.PodSpec", "hostAliases", "merge", Some("ip")),
        ("io.k8s.api.core.v1.PodSpec", "topologySpreadConstraints", "merge", Some("topologyKey")),
        ("io.k8s.api.core.v1.PodSpec", "schedulingGates", "merge", Some("name")),
        ("io.k8s.api.core.v1.PodSpec", "resourceClaims", "merge,retainKeys", Some("name")),
        ("io.k8s.api.core.v1.PodStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.core.v1.PodStatus", "hostIPs", "merge", Some("ip")),
        ("io.k8s.api.core.v1.PodStatus", "podIPs", "merge", Some("ip")),
        ("io.k8s.api.core.v1.PodStatus", "resourceClaimStatuses", "merge,retainKeys", Some("name")),
        ("io.k8s.api.core.v1.PersistentVolumeClaimStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.core.v1.ReplicationControllerStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.core.v1.ServiceSpec", "ports", "merge", Some("port")),
        ("io.k8s.api.core.v1.ServiceStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.core.v1.ServiceAccount", "secrets", "merge", Some("name")),
        ("io.k8s.api.core.v1.NodeSpec", "podCIDRs", "merge", None),
        ("io.k8s.api.core.v1.NodeStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.core.v1.NodeStatus", "addresses", "merge", Some("type")),
        ("io.k8s.api.core.v1.NamespaceStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.core.v1.ComponentStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.apps.v1.StatefulSetStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.apps.v1.DeploymentSpec", "strategy", "retainKeys", None),
        ("io.k8s.api.apps.v1.DeploymentStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.apps.v1.DaemonSetStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.apps.v1.ReplicaSetStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.batch.v1.JobStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.flowcontrol.v1.FlowSchemaStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.flowcontrol.v1.PriorityLevelConfigurationStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.networking.v1.ServiceCIDRStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.policy.v1.PodDisruptionBudgetSpec", "selector", "replace", None),
        ("io.k8s.api.policy.v1.PodDisruptionBudgetStatus", "conditions", "merge", Some("type")),
        ("io.k8s.api.storage.v1.CSINodeSpec", "drivers", "merge", Some("name")),
        ("io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicySpec", "matchConditions", "merge", Some("name")),
        ("io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicySpec", "variables", "merge", Some("name")),
        ("io.k8s.api.admissionregistration.v1.ValidatingWebhookConfiguration", "webhooks", "merge", Some("name")),
        ("io.k8s.api.admissionregistration.v1.MutatingWebhookConfiguration", "webhooks", "merge", Some("name")),
        ("io.k8s.api.admissionregistration.v1.ValidatingWebhook", "matchConditions", "merge", Some("name")),
        ("io.k8s.api.admissionregistration.v1.MutatingWebhook", "matchConditions", "merge", Some("name")),
    ];

    /// Writes the built-in patch strategies and list types into `components`,
    /// and leaves `metadata` out of every kind's `required` (k8s-openapi's
    /// types hold an ObjectMeta, never optional; upstream's schemas do not
    /// require it).
    pub(crate) fn annotate(components: &mut Map<String, Value>) {
        for schema in components.values_mut() {
            let Some(m) = schema.as_object_mut() else { continue };
            if let Some(Value::Array(required)) = m.get_mut("required") {
                required.retain(|r| r != "metadata");
                if required.is_empty() {
                    m.remove("required");
                }
            }
        }
        for (component, property, strategy, key) in PATCH_STRATEGIES {
            let Some(p) = property_mut(components, component, property) else { continue };
            p.insert("x-kubernetes-patch-strategy".into(), serde_json::json!(strategy));
            if let Some(k) = key {
                p.insert("x-kubernetes-patch-merge-key".into(), serde_json::json!(k));
                p.insert("x-kubernetes-list-type".into(), serde_json::json!("map"));
                p.insert("x-kubernetes-list-map-keys".into(), serde_json::json!([k]));
            } else if strategy.contains("merge") {
                p.insert("x-kubernetes-list-type".into(), serde_json::json!("set"));
            }
        }
    }

    pub(crate) fn property_mut<'a>(
        components: &'a mut Map<String, Value>,
        component: &str,
        property: &str,
    ) -> Option<&'a mut Map<String, Value>> {
        components.get_mut(component)?.get_mut("properties")?.get_mut(property)?.as_object_mut()
    }

    const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/apiserver/builtin_schemas.json");

    /// One component a line, sorted, so that a regenerated file diffs well.
    fn render(roots: &BTreeMap<String, String>, components: &Map<String, Value>) -> String {
        let line = |(k, v): (String, String)| format!("{k}: {v}");
        let roots: Vec<String> = roots
            .iter()
            .map(|(k, v)| line((Value::from(k.as_str()).to_string(), Value::from(v.as_str()).to_string())))
            .collect();
        let components: Vec<String> =
            components.iter().map(|(k, v)| line((Value::from(k.as_str()).to_string(), v.to_string()))).collect();
        format!("{{\"roots\": {{\n{}\n}},\n\"components\": {{\n{}\n}}}}\n", roots.join(",\n"), components.join(",\n"))
    }

    /// The types the OpenAPI v2 document's operations take and return
    /// besides the kinds themselves: the meta types, the kinds of the
    /// subresources that create one (Eviction, TokenRequest) and what the
    /// discovery paths answer.
    fn describe_operation_types(generator: &mut schemars::SchemaGenerator) {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
        let _ = generator.subschema_for::<k8s_openapi::api::policy::v1::Eviction>();
        let _ = generator.subschema_for::<k8s_openapi::api::authentication::v1::TokenRequest>();
        let _ = generator.subschema_for::<meta::APIGroup>();
        let _ = generator.subschema_for::<meta::APIGroupList>();
        let _ = generator.subschema_for::<meta::APIResourceList>();
        let _ = generator.subschema_for::<meta::APIVersions>();
        let _ = generator.subschema_for::<k8s_openapi::apimachinery::pkg::version::Info>();
        let _ = generator.subschema_for::<meta::ListMeta>();
        let _ = generator.subschema_for::<meta::Status>();
        let _ = generator.subschema_for::<meta::DeleteOptions>();
        let _ = generator.subschema_for::<meta::Patch>();
        let _ = generator.subschema_for::<meta::WatchEvent<Value>>();
        let _ = generator.subschema_for::<k8s_openapi::api::autoscaling::v1::Scale>();
    }

    #[test]
    fn the_embedded_components_are_what_k8s_openapi_describes() {
        let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
        let mut roots = BTreeMap::new();
        for r in Registry::builtin().all() {
            if let Some(name) = r.strategy.describe(&mut generator) {
                roots.insert(key(&r.api_version(), &r.kind), name);
            }
        }
        assert!(roots.len() > 50, "every built-in kind is described: {roots:?}");
        describe_operation_types(&mut generator);
        let mut components = generator.take_definitions(true);
        annotate(&mut components);
        let text = render(&roots, &components);
        if std::env::var_os("FERROK_WRITE_SCHEMAS").is_some() {
            std::fs::write(FILE, &text).expect("write builtin_schemas.json");
            return;
        }
        let embedded = String::from_utf8(inflate().expect("inflate")).expect("utf-8");
        assert!(
            embedded == text,
            "src/apiserver/builtin_schemas.json is not what k8s-openapi describes: \
             run `FERROK_WRITE_SCHEMAS=1 cargo test --lib builtin_schemas` and rebuild"
        );
    }

    #[test]
    fn every_built_in_kind_has_its_schema_and_shares_the_components() {
        let registry = Registry::builtin();
        let mut described = 0;
        for r in registry.all() {
            if r.strategy.describe(&mut schemars::generate::SchemaSettings::openapi3().into_generator()).is_none() {
                continue;
            }
            described += 1;
            let name = r.strategy.openapi_name().expect("a built-in kind names its component");
            let set = r.strategy.patch_schema().expect("a built-in kind has a schema");
            assert_eq!(set.root, name);
            let (root, components) = r.strategy.openapi_schemas().expect("and serves it");
            assert_eq!(root, name);
            assert!(components.contains_key(&name), "{name}");
            assert!(components.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), "{name}");
        }
        assert!(described > 50);
        // A kind's document lists what its root reaches, not every component.
        let cm = registry.get("", "v1", "configmaps").expect("configmaps");
        let (_, components) = cm.strategy.openapi_schemas().expect("schemas");
        assert!(!components.contains_key("io.k8s.api.core.v1.PodSpec"));
        let pods = registry.get("", "v1", "pods").expect("pods");
        let (_, components) = pods.strategy.openapi_schemas().expect("schemas");
        assert!(components.contains_key("io.k8s.api.core.v1.PodSpec"));
        assert!(components.contains_key("io.k8s.apimachinery.pkg.api.resource.Quantity"));
        assert!(!components.contains_key("io.k8s.api.apps.v1.DeploymentSpec"));
        // One copy of the components, however many kinds use them.
        assert!(Arc::ptr_eq(
            &cm.strategy.patch_schema().expect("cm").components,
            &pods.strategy.patch_schema().expect("pods").components
        ));
    }
}
