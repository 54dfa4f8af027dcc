//! Per-resource behaviour: decoding as the typed kind (which also finds
//! unknown fields and prunes them), defaulting, validation, and the columns
//! `kubectl get` shows. The status fields upstream's Go types always
//! write are put back by the typed strategy (`always_written`).

pub mod always_written;

use std::marker::PhantomData;

use futures_util::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::apiserver::patch::patch_meta::InvalidQuantity;
use crate::apiserver::status::{ApiResult, Cause};
use crate::apiserver::table::Column;

/// Why an object does not decode as its kind; the API server answers it as
/// a BadRequest that quotes this text.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("the object must be a JSON object")]
    NotAnObject,
    #[error("metadata: expected an object")]
    MetadataNotAnObject,
    /// The object as a whole does not decode (serde's own words).
    #[error("{0}")]
    Invalid(String),
    /// A field does not decode: its path (`spec.containers[0].ports`) and why.
    #[error("{path}: {message}")]
    InvalidField { path: String, message: String },
    /// The decoded object does not encode back.
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    #[error(transparent)]
    Quantity(#[from] InvalidQuantity),
}

/// How names of a resource are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain (most resources).
    Subdomain,
    /// RFC 1123 label (namespaces, services).
    Label,
    /// Anything that is a valid path segment (RBAC objects).
    PathSegment,
}

pub trait Strategy: Send + Sync {
    /// Decodes `obj` as the resource's type and encodes it back: the result
    /// is the object with unknown fields dropped; those fields are listed
    /// (as `.spec.foo` paths) in the second element.
    fn decode(&self, obj: &Value) -> Result<(Value, Vec<String>), DecodeError>;

    /// `decode` of an update's new object, `old` being the stored one.
    fn decode_update(&self, new: Value, _old: &Value) -> Result<(Value, Vec<String>), DecodeError> {
        self.decode(&new)
    }

    /// Fills in defaults, as upstream's defaulting functions do.
    fn default(&self, _obj: &mut Value) {}

    /// Checks an object about to be stored.
    fn validate(&self, _obj: &Value) -> Vec<Cause> {
        Vec::new()
    }

    fn name_rule(&self) -> NameRule {
        NameRule::Subdomain
    }

    /// The key prefix of the resource whose objects these are, when they
    /// live under another resource's keys (upstream's cohabitating
    /// resources: events.k8s.io Events are the core Events, under
    /// `/registry/events/`); None for the resource's own prefix.
    fn stored_under(&self) -> Option<&'static str> {
        None
    }

    /// Whether `metadata.generation` tracks changes to the spec.
    fn tracks_generation(&self) -> bool {
        false
    }

    /// What a newly created object's status starts as (status subresource only).
    fn initial_status(&self, _obj: &Value) -> Option<Value> {
        None
    }

    /// The columns `kubectl get` shows, after NAME.
    fn columns(&self) -> Vec<Column> {
        Vec::new()
    }

    /// The cells for `columns`, after the name.
    fn cells(&self, _obj: &Value) -> Vec<Value> {
        Vec::new()
    }

    /// The OpenAPI v3 schema of the resource's type: its component name and
    /// every component it needs (itself included), for `kubectl explain`.
    fn openapi_schemas(&self) -> Option<(String, serde_json::Map<String, Value>)> {
        None
    }

    /// The schema set patches are merged by (built once, then shared).
    fn patch_schema(&self) -> Option<crate::apiserver::patch::patch_meta::SharedSchema> {
        None
    }

    /// A custom resource: strategic merge patch is refused, as upstream.
    fn is_custom(&self) -> bool {
        false
    }

    /// The component name alone (cheap; no schema is generated).
    fn openapi_name(&self) -> Option<String> {
        None
    }

    /// Adds a built-in kind's components to `generator` and names its root
    /// (the test that checks the embedded components generates them so).
    #[cfg(test)]
    fn describe(&self, _generator: &mut schemars::SchemaGenerator) -> Option<String> {
        None
    }

    /// How the kind's objects are deleted.
    fn delete_rules(&self) -> DeleteRules {
        DeleteRules::default()
    }

    /// The object an update through `subresource` stores, from the request's
    /// object and the stored one (a namespace's `finalize` takes only
    /// spec.finalizers); the request's object itself by default.
    fn subresource_update(&self, _subresource: &str, new: Value, _old: &Value) -> Value {
        new
    }

    /// Checks what a write may change, beyond `validate` of the object
    /// alone: `old` is None on create; `subresource` names the one written
    /// through (upstream's ValidateUpdate of the subresource's strategy).
    fn validate_change(&self, _subresource: Option<&str>, _new: &Value, _old: Option<&Value>) -> Vec<Cause> {
        Vec::new()
    }

    /// How the served version's objects are read from and written to the
    /// store, when they are not served as they are stored.
    fn conversion(&self) -> Option<&dyn Converter> {
        None
    }
}

/// What a served version does to the objects the store holds, when they
/// are not served as stored (upstream's storage codec): another version
/// to convert from or to (autoscaling/v1 HorizontalPodAutoscalers stored
/// as v2; a custom resource's versions, through its CRD's conversion
/// strategy), defaults applied on read. Handlers see and strategies check
/// the served form; the store and the watch cache hold what was stored.
/// Conversions may call out (a CRD's conversion webhook), so they await,
/// and convert many objects at once (one review for a list).
pub trait Converter: Send + Sync {
    /// The apiVersion objects written through this version are stored in.
    fn storage_api_version(&self) -> &str;

    /// Whether an object stored in `api_version` is served exactly as it
    /// is stored (the watch cache's bytes are sent as they are).
    fn serves_as_stored(&self, api_version: &str) -> bool;

    /// Stored objects (each in the apiVersion it was stored in) in the
    /// served form, in their order.
    fn served(&self, stored: Vec<Value>) -> BoxFuture<'_, ApiResult<Vec<Value>>>;

    /// A served object in the form it is stored in.
    fn stored(&self, served: Value) -> BoxFuture<'_, ApiResult<Value>>;
}

/// A served version of a built-in kind stored in another version
/// (upstream's conversion through the internal version, as autoscaling/v1
/// HorizontalPodAutoscalers are stored as v2), by two functions.
#[derive(Clone, Copy)]
pub struct Conversion {
    /// The apiVersion objects are stored (and cached) in.
    pub storage_api_version: &'static str,
    /// The served form of an object to its storage form.
    pub to_storage: fn(Value) -> Value,
    /// The storage form of an object to its served form.
    pub from_storage: fn(Value) -> Value,
}

impl Converter for Conversion {
    fn storage_api_version(&self) -> &str {
        self.storage_api_version
    }

    fn serves_as_stored(&self, _api_version: &str) -> bool {
        false
    }

    fn served(&self, stored: Vec<Value>) -> BoxFuture<'_, ApiResult<Vec<Value>>> {
        let served = stored.into_iter().map(self.from_storage).collect();
        Box::pin(std::future::ready(Ok(served)))
    }

    fn stored(&self, served: Value) -> BoxFuture<'_, ApiResult<Value>> {
        Box::pin(std::future::ready(Ok((self.to_storage)(served))))
    }
}

/// How objects of a kind are deleted beyond what every kind shares
/// (preconditions, metadata.finalizers, propagation): upstream's
/// RESTGracefulDeleteStrategy and the namespace's own delete.
#[derive(Clone, Copy)]
pub struct DeleteRules {
    /// The grace period when deleting `obj` must wait for something to stop
    /// first (a pod on a node), given DeleteOptions.gracePeriodSeconds;
    /// None deletes at once.
    pub grace_period: fn(obj: &Value, requested: Option<i64>) -> Option<i64>,
    /// Marks the object when its delete always begins with a terminating
    /// phase (a namespace); None when the kind has none.
    pub terminate: Option<fn(&mut Value)>,
    /// Whether an object marked for deletion still waits once its
    /// metadata.finalizers are gone (a namespace on spec.finalizers, a pod
    /// on its grace period).
    pub waits: fn(&Value) -> bool,
}

impl Default for DeleteRules {
    fn default() -> Self {
        DeleteRules { grace_period: |_, _| None, terminate: None, waits: |_| false }
    }
}

/// Kind-specific hooks of a typed strategy.
#[derive(Clone, Copy)]
pub struct Hooks {
    pub default: fn(&mut Value),
    pub validate: fn(&Value) -> Vec<Cause>,
    pub name_rule: NameRule,
    pub stored_under: Option<&'static str>,
    pub generation: bool,
    pub initial_status: fn(&Value) -> Option<Value>,
    pub columns: fn() -> Vec<Column>,
    pub cells: fn(&Value) -> Vec<Value>,
    pub delete: DeleteRules,
    pub subresource_update: fn(&str, Value, &Value) -> Value,
    pub validate_change: fn(Option<&str>, &Value, Option<&Value>) -> Vec<Cause>,
    pub conversion: Option<Conversion>,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            default: |_| {},
            validate: |_| Vec::new(),
            name_rule: NameRule::Subdomain,
            stored_under: None,
            generation: false,
            initial_status: |_| None,
            columns: Vec::new,
            cells: |_| Vec::new(),
            delete: DeleteRules::default(),
            subresource_update: |_, new, _| new,
            validate_change: |_, _, _| Vec::new(),
            conversion: None,
        }
    }
}

/// A strategy for a built-in kind, decoding through its `k8s-openapi` type.
pub struct Typed<K> {
    hooks: Hooks,
    kind: PhantomData<fn() -> K>,
    schema: std::sync::OnceLock<Option<crate::apiserver::patch::patch_meta::SharedSchema>>,
}

impl<K> Typed<K> {
    pub fn new(hooks: Hooks) -> Self {
        Typed { hooks, kind: PhantomData, schema: std::sync::OnceLock::new() }
    }
}

/// What a built-in kind's type must also be in the tests: described by
/// `schemars`, whose output the embedded components are checked against
/// (`builtin_schemas`). The tests' dev-dependency turns on `k8s-openapi`'s
/// `schemars` feature; the binary carries none of that code.
#[cfg(test)]
pub trait Described: schemars::JsonSchema {}
#[cfg(test)]
impl<K: schemars::JsonSchema> Described for K {}
#[cfg(not(test))]
pub trait Described {}
#[cfg(not(test))]
impl<K> Described for K {}

impl<K> Strategy for Typed<K>
where
    K: k8s_openapi::Resource + DeserializeOwned + Serialize + Described + 'static,
{
    fn openapi_schemas(&self) -> Option<(String, serde_json::Map<String, Value>)> {
        let set = self.patch_schema()?;
        Some((set.root.clone(), set.components()))
    }

    fn patch_schema(&self) -> Option<crate::apiserver::patch::patch_meta::SharedSchema> {
        self.schema.get_or_init(|| crate::apiserver::builtin_schemas::schema_set(K::API_VERSION, K::KIND)).clone()
    }

    fn openapi_name(&self) -> Option<String> {
        crate::apiserver::builtin_schemas::root_name(K::API_VERSION, K::KIND)
    }

    #[cfg(test)]
    fn describe(&self, generator: &mut schemars::SchemaGenerator) -> Option<String> {
        let _ = generator.subschema_for::<K>();
        Some(K::schema_name().into_owned())
    }

    fn decode(&self, obj: &Value) -> Result<(Value, Vec<String>), DecodeError> {
        let (mut back, unknown) = match round_trip::<K>(obj, "") {
            Ok(decoded) => decoded,
            // Base64 with line breaks, which Go's decoder accepts: taken
            // out and decoded again (only when a decode failed, so the
            // common write walks nothing).
            Err(e) => match self.patch_schema() {
                Some(set) => {
                    let mut unwrapped = obj.clone();
                    let root = crate::apiserver::patch::patch_meta::SchemaNode::root(&set);
                    if !root.strip_base64_line_breaks(&mut unwrapped) {
                        return Err(e);
                    }
                    round_trip::<K>(&unwrapped, "")?
                }
                None => return Err(e),
            },
        };
        // Quantities are strings to serde; upstream refuses those that do not
        // parse, and stores the others in canonical form.
        if let Some(set) = self.patch_schema() {
            let root = crate::apiserver::patch::patch_meta::SchemaNode::root(&set);
            root.canonicalize_quantities(&mut back)?;
        }
        Ok((back, unknown))
    }

    /// An update whose every field but metadata is the stored object's
    /// (labels, annotations, finalizers, owners: what most controllers
    /// write) has only its metadata decoded again: the rest was decoded
    /// when it was stored, and a typed decode treats each top-level field
    /// on its own. Every kind's metadata is an ObjectMeta.
    fn decode_update(&self, new: Value, old: &Value) -> Result<(Value, Vec<String>), DecodeError> {
        if only_metadata_differs(&new, old) {
            return decode_metadata(new, old);
        }
        self.decode(&new)
    }

    fn default(&self, obj: &mut Value) {
        (self.hooks.default)(obj);
        always_written::fill_status(K::GROUP, K::KIND, obj);
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        (self.hooks.validate)(obj)
    }

    fn name_rule(&self) -> NameRule {
        self.hooks.name_rule
    }

    fn stored_under(&self) -> Option<&'static str> {
        self.hooks.stored_under
    }

    fn tracks_generation(&self) -> bool {
        self.hooks.generation
    }

    /// A built-in kind's status starts as its Go type's zero value, which
    /// upstream writes as `{}` at least (a struct is never left out).
    fn initial_status(&self, obj: &Value) -> Option<Value> {
        (self.hooks.initial_status)(obj).or_else(|| Some(Value::Object(serde_json::Map::new())))
    }

    fn columns(&self) -> Vec<Column> {
        (self.hooks.columns)()
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        (self.hooks.cells)(obj)
    }

    fn delete_rules(&self) -> DeleteRules {
        self.hooks.delete
    }

    fn subresource_update(&self, subresource: &str, new: Value, old: &Value) -> Value {
        (self.hooks.subresource_update)(subresource, new, old)
    }

    fn validate_change(&self, subresource: Option<&str>, new: &Value, old: Option<&Value>) -> Vec<Cause> {
        (self.hooks.validate_change)(subresource, new, old)
    }

    fn conversion(&self) -> Option<&dyn Converter> {
        self.hooks.conversion.as_ref().map(|c| c as &dyn Converter)
    }
}

/// Whether `new` and `old` are objects with the same fields, all equal but
/// metadata (an object in `new`).
fn only_metadata_differs(new: &Value, old: &Value) -> bool {
    let (Some(n), Some(o)) = (new.as_object(), old.as_object()) else { return false };
    n.len() == o.len()
        && n.get("metadata").is_some_and(Value::is_object)
        && n.iter().all(|(k, v)| k == "metadata" || o.get(k) == Some(v))
}

/// `new` with its metadata decoded as an ObjectMeta and encoded back, as
/// the whole object's decode would; managedFields equal to the stored
/// ones (a patch that leaves them alone) are kept as they are.
fn decode_metadata(mut new: Value, old: &Value) -> Result<(Value, Vec<String>), DecodeError> {
    let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Err(DecodeError::MetadataNotAnObject);
    };
    let same_managed_fields = meta.get("managedFields") == old.pointer("/metadata/managedFields");
    let managed_fields = if same_managed_fields { meta.remove("managedFields") } else { None };
    let input = Value::Object(std::mem::take(meta));
    let (mut back, unknown) = round_trip::<ObjectMeta>(&input, "metadata")?;
    if let (Some(m), Some(fields)) = (back.as_object_mut(), managed_fields) {
        m.insert("managedFields".into(), fields);
    }
    new["metadata"] = back;
    Ok((new, unknown))
}

/// `input` (the field `at` of an object, "" for the whole) decoded as a
/// `T` and encoded back, with the paths of the fields `T` does not know;
/// a decode error names the field's path as upstream does.
///
/// It decodes through `crate::decode`, the binary's one decoder of each
/// type (see there why).
fn round_trip<T: DeserializeOwned + Serialize>(input: &Value, at: &str) -> Result<(Value, Vec<String>), DecodeError> {
    let typed: T = crate::decode::from_value(input).map_err(|e| {
        let path = [at, e.path.as_str()].into_iter().filter(|p| !p.is_empty()).collect::<Vec<_>>();
        match path.is_empty() {
            true => DecodeError::Invalid(e.message),
            false => DecodeError::InvalidField { path: path.join("."), message: e.message },
        }
    })?;
    let back = serde_json::to_value(&typed).map_err(DecodeError::Encode)?;
    let mut unknown = Vec::new();
    let mut prefix = if at.is_empty() { String::new() } else { format!(".{at}") };
    unknown_fields(input, &back, &mut prefix, &mut unknown);
    Ok((back, unknown))
}

/// Paths present (and not null) in `input` but absent from `decoded`.
pub fn unknown_fields(input: &Value, decoded: &Value, path: &mut String, out: &mut Vec<String>) {
    let len = path.len();
    match (input, decoded) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                path.push('.');
                path.push_str(k);
                match b.get(k) {
                    None if !v.is_null() && !is_empty_default(v) => out.push(path.clone()),
                    None => {}
                    Some(bv) => unknown_fields(v, bv, path, out),
                }
                path.truncate(len);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
                use std::fmt::Write;
                let _ = write!(path, "[{i}]");
                unknown_fields(x, y, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// Values a typed encoder leaves out although the field is known.
fn is_empty_default(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Checks a name against a rule; returns the problems, upstream-worded.
pub fn check_name(rule: NameRule, name: &str) -> Vec<String> {
    let mut errs = Vec::new();
    match rule {
        NameRule::PathSegment => {
            if name == "." || name == ".." {
                errs.push(format!("may not be '{name}'"));
            }
            for bad in ["/", "%"] {
                if name.contains(bad) {
                    errs.push(format!("may not contain '{bad}'"));
                }
            }
        }
        NameRule::Label => {
            if name.len() > 63 {
                errs.push("must be no more than 63 characters".into());
            }
            if !crate::apiserver::validation::is_dns1123_label(name) {
                errs.push("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".into());
            }
        }
        NameRule::Subdomain => errs.extend(crate::apiserver::validation::dns1123_subdomain(name)),
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn decode_finds_unknown_fields() {
        let s = Typed::<ConfigMap>::new(Hooks::default());
        let obj = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "labels": {}, "bogus": 1},
            "data": {"k": "v"}, "extra": true, "nothing": null
        });
        let (back, unknown) = s.decode(&obj).unwrap();
        assert_eq!(unknown, vec![".extra".to_string(), ".metadata.bogus".to_string()]);
        assert_eq!(back["data"]["k"], "v");
        let bad = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": 5}});
        let err = s.decode(&bad).unwrap_err();
        assert!(err.to_string().starts_with("data.k:"), "{err}");
        let pods = Typed::<k8s_openapi::api::core::v1::Pod>::new(Hooks::default());
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "a"}, {"name": "b", "bogus": 1, "ports": [{"containerPort": 80, "x": 2}]}]}});
        let (_, unknown) = pods.decode(&pod).unwrap();
        assert_eq!(unknown, vec![".spec.containers[1].bogus", ".spec.containers[1].ports[0].x"]);
    }

    #[test]
    fn an_update_of_metadata_only_decodes_as_the_whole_object_does() {
        let pods = Typed::<k8s_openapi::api::core::v1::Pod>::new(Hooks::default());
        let stored = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "managedFields": [{"manager": "m", "operation": "Update",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"containers": [{"name": "a", "image": "i"}]}});
        let (old, _) = pods.decode(&stored).unwrap();
        let with = |meta: Value, spec: Value| {
            let mut v = old.clone();
            v["metadata"] = meta;
            v["spec"] = spec;
            v
        };
        let spec = old["spec"].clone();
        let mut labelled = old["metadata"].clone();
        labelled["labels"] = serde_json::json!({"a": "b"});
        labelled["bogus"] = serde_json::json!(1);
        labelled["creationTimestamp"] = serde_json::json!(null);
        let mut bad = old["metadata"].clone();
        bad["labels"] = serde_json::json!({"a": 5});
        let mut other_spec = spec.clone();
        other_spec["containers"][0]["bogus"] = serde_json::json!(2);
        assert!(only_metadata_differs(&with(labelled.clone(), spec.clone()), &old));
        assert!(!only_metadata_differs(&with(labelled.clone(), other_spec.clone()), &old));
        for new in [with(labelled.clone(), spec.clone()), with(bad, spec.clone()), with(labelled, other_spec)] {
            let said = |decoded: Result<_, DecodeError>| decoded.map_err(|e| e.to_string());
            assert_eq!(said(pods.decode_update(new.clone(), &old)), said(pods.decode(&new)), "{new}");
        }
        let (_, unknown) = pods.decode_update(with(old["metadata"].clone(), old["spec"].clone()), &old).unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
    }

    #[test]
    fn names() {
        assert!(check_name(NameRule::Subdomain, "a.b-c").is_empty());
        assert!(!check_name(NameRule::Subdomain, "A").is_empty());
        assert!(!check_name(NameRule::Label, "a.b").is_empty());
        assert!(check_name(NameRule::PathSegment, "system:admin").is_empty());
    }
}
