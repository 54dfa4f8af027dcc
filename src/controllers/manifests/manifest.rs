//! A manifest file of the auto-deploy folder: which files count (`.yaml`,
//! `.yml`, `.json`; a `<file>.skip` beside one leaves it alone), and the
//! objects a file holds (multi-document YAML, a JSON object, `kind: List`
//! flattened), with the identity each object is remembered by.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a manifest file could not give.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read it: {0}")]
    Read(#[from] std::io::Error),
    #[error("document {doc}: {message}")]
    Parse { doc: usize, message: String },
    #[error("document {doc}: {message}")]
    Invalid { doc: usize, message: String },
}

/// A manifest file of the folder, by name.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry {
    /// Its content.
    File(Vec<u8>),
    /// `<name>.skip` exists: neither applied nor pruned.
    Skipped,
}

/// Whether a file name is a manifest (`.yaml`, `.yml`, `.json`; no dotfiles).
pub fn is_manifest(name: &str) -> bool {
    !name.starts_with('.') && [".yaml", ".yml", ".json"].iter().any(|e| name.ends_with(e) && name.len() > e.len())
}

/// The manifests of `dir` by file name (sorted: k3s applies by name).
/// Subfolders are not read.
pub fn scan(dir: &Path) -> std::io::Result<BTreeMap<String, Result<Entry, ManifestError>>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()) {
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    for name in names.iter().filter(|n| is_manifest(n)) {
        let entry = if names.contains(&format!("{name}.skip")) {
            Ok(Entry::Skipped)
        } else {
            std::fs::read(dir.join(name)).map(Entry::File).map_err(ManifestError::from)
        };
        out.insert(name.clone(), entry);
    }
    // A `.skip` whose file is gone still keeps the file's objects.
    for skip in names.iter().filter_map(|n| n.strip_suffix(".skip")).filter(|n| is_manifest(n)) {
        out.entry(skip.to_string()).or_insert(Ok(Entry::Skipped));
    }
    Ok(out)
}

/// How an applied object is remembered: its group (not version, so a
/// file may move an object to a newer version), kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectId {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
}

impl ObjectId {
    pub fn group(&self) -> &str {
        self.api_version.split_once('/').map(|(g, _)| g).unwrap_or("")
    }

    pub fn version(&self) -> &str {
        self.api_version.split_once('/').map(|(_, v)| v).unwrap_or(&self.api_version)
    }

    /// Whether both name the same object, whatever the version.
    pub fn same_object(&self, other: &ObjectId) -> bool {
        (self.group(), &self.kind, &self.namespace, &self.name)
            == (other.group(), &other.kind, &other.namespace, &other.name)
    }
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.namespace.as_str() {
            "" => write!(f, "{} {}", self.kind, self.name),
            ns => write!(f, "{} {ns}/{}", self.kind, self.name),
        }
    }
}

/// The objects of a manifest, Namespaces and CustomResourceDefinitions
/// first (what the others may need), otherwise in file order.
pub fn parse(name: &str, content: &[u8]) -> Result<Vec<Value>, ManifestError> {
    let text = std::str::from_utf8(content)
        .map_err(|e| ManifestError::Parse { doc: 1, message: format!("not UTF-8: {e}") })?;
    let mut docs = Vec::new();
    if name.ends_with(".json") {
        let v: Value =
            serde_json::from_str(text).map_err(|e| ManifestError::Parse { doc: 1, message: e.to_string() })?;
        docs.push(v);
    } else {
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let v = Value::deserialize(doc).map_err(|e| ManifestError::Parse { doc: i + 1, message: e.to_string() })?;
            docs.push(v);
        }
    }
    let mut objects = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        match doc {
            Value::Null => {}
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str).is_some_and(|k| k.ends_with("List")) => {
                let items = o.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
                for item in items {
                    check(&item, i + 1)?;
                    objects.push(item);
                }
            }
            Value::Object(_) => {
                check(&doc, i + 1)?;
                objects.push(doc);
            }
            _ => return Err(ManifestError::Invalid { doc: i + 1, message: "not an object".into() }),
        }
    }
    let first = |o: &Value| match o.get("kind").and_then(Value::as_str) {
        Some("Namespace") => 0,
        Some("CustomResourceDefinition") => 1,
        _ => 2,
    };
    objects.sort_by_key(first);
    Ok(objects)
}

fn check(obj: &Value, doc: usize) -> Result<(), ManifestError> {
    let field = |f: &str| obj.get(f).and_then(Value::as_str).filter(|s| !s.is_empty());
    let missing = |what: &str| ManifestError::Invalid { doc, message: format!("{what} is missing") };
    field("apiVersion").ok_or_else(|| missing("apiVersion"))?;
    field("kind").ok_or_else(|| missing("kind"))?;
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| missing("metadata.name"))?;
    Ok(())
}

/// The identity of a parsed object (namespace as written; the caller
/// defaults it for namespaced kinds).
pub fn id_of(obj: &Value) -> ObjectId {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    ObjectId {
        api_version: s("/apiVersion"),
        kind: s("/kind"),
        namespace: s("/metadata/namespace"),
        name: s("/metadata/name"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_lists_and_order() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: x}\n---\n---\n\
                    apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: x}}\n";
        let objs = parse("a.yaml", text.as_bytes()).unwrap();
        let ids: Vec<String> = objs.iter().map(|o| id_of(o).to_string()).collect();
        assert_eq!(ids, ["Namespace x", "ConfigMap x/a"]);
        let err = parse("b.yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n").unwrap_err();
        assert_eq!(err.to_string(), "document 1: metadata.name is missing");
        assert!(matches!(parse("c.yaml", b"a: [\n"), Err(ManifestError::Parse { .. })));
        assert!(matches!(parse("d.json", b"{\"kind\": "), Err(ManifestError::Parse { .. })));
    }

    #[test]
    fn skip_files_and_names() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["a.yaml", "a.yaml.skip", "b.json", "c.txt", ".hidden.yaml", "gone.yaml.skip"] {
            std::fs::write(dir.path().join(f), "{}").unwrap();
        }
        let got = scan(dir.path()).unwrap();
        let names: Vec<&str> = got.keys().map(String::as_str).collect();
        assert_eq!(names, ["a.yaml", "b.json", "gone.yaml"]);
        assert_eq!(got["a.yaml"].as_ref().unwrap(), &Entry::Skipped);
        assert_eq!(got["gone.yaml"].as_ref().unwrap(), &Entry::Skipped);
        assert_eq!(got["b.json"].as_ref().unwrap(), &Entry::File(b"{}".to_vec()));
    }

    #[test]
    fn versions_do_not_change_identity() {
        let a = ObjectId {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "d".into(),
            name: "x".into(),
        };
        let b = ObjectId { api_version: "apps/v1beta2".into(), ..a.clone() };
        assert!(a.same_object(&b));
        assert_eq!(a.group(), "apps");
        assert_eq!(ObjectId { api_version: "v1".into(), ..a }.group(), "");
    }
}
