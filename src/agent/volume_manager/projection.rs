//! Keys of a ConfigMap or Secret projected to files, as upstream's
//! `MakePayload`: every key under its own name with the default mode, or
//! only the listed items at their paths, each with its mode.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath, Secret};

use super::atomic_writer::{FileProjection, Payload};
use super::error::SetUpError;

/// What `defaultMode` is when the API left it out.
pub const DEFAULT_MODE: i32 = 0o644;

/// The key → bytes content of a ConfigMap (data and binaryData) or a Secret.
pub type SourceData = BTreeMap<String, Vec<u8>>;

/// The two kinds of object a volume can project keys of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    ConfigMap,
    Secret,
}

impl SourceKind {
    /// The word upstream's messages use (`configmap "x" not found`).
    pub fn noun(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "configmap",
            SourceKind::Secret => "secret",
        }
    }

    /// The word of the missing-key message (`non-existent config key`).
    fn key_noun(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "config",
            SourceKind::Secret => "secret",
        }
    }
}

pub fn config_map_data(cm: &ConfigMap) -> SourceData {
    let mut out: SourceData = cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.entry(k.clone()).or_insert_with(|| v.0.clone());
    }
    out
}

/// A Secret's data; `stringData` (write-only upstream, merged into data
/// by the API server) wins over data when a server kept it apart.
pub fn secret_data(secret: &Secret) -> SourceData {
    let mut out: SourceData = secret.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    for (k, v) in secret.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone().into_bytes());
    }
    out
}

/// A mode from the API (an int32 with only permission bits meaningful).
pub fn file_mode(mode: i32) -> u32 {
    (mode as u32) & 0o7777
}

/// The files a ConfigMap or Secret volume (or projected source) holds.
/// `data` is None when the object does not exist (only reached when the
/// source is optional).
pub fn make_payload(
    kind: SourceKind,
    items: Option<&[KeyToPath]>,
    data: Option<&SourceData>,
    default_mode: i32,
    optional: bool,
) -> Result<Payload, SetUpError> {
    let empty = SourceData::new();
    let data = data.unwrap_or(&empty);
    let mut payload = Payload::new();
    match items {
        None | Some([]) => {
            for (key, bytes) in data {
                payload.insert(key.clone(), FileProjection { data: bytes.clone(), mode: file_mode(default_mode) });
            }
        }
        Some(items) => {
            for item in items {
                let Some(bytes) = data.get(&item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(SetUpError::KeyNotFound {
                        kind: kind.noun(),
                        what: kind.key_noun(),
                        key: item.key.clone(),
                    });
                };
                let mode = file_mode(item.mode.unwrap_or(default_mode));
                payload.insert(item.path.clone(), FileProjection { data: bytes.clone(), mode });
            }
        }
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath { key: key.into(), path: path.into(), mode }
    }

    fn data() -> SourceData {
        [("a".to_string(), b"1".to_vec()), ("b".to_string(), b"2".to_vec())].into_iter().collect()
    }

    #[test]
    fn every_key_with_the_default_mode() {
        let p = make_payload(SourceKind::ConfigMap, None, Some(&data()), 0o600, false).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p["a"], FileProjection { data: b"1".to_vec(), mode: 0o600 });
    }

    #[test]
    fn items_choose_keys_paths_and_modes() {
        let items = [item("a", "dir/x", Some(0o400)), item("b", "y", None)];
        let p = make_payload(SourceKind::Secret, Some(&items), Some(&data()), 0o644, false).unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["dir/x", "y"]);
        assert_eq!(p["dir/x"].mode, 0o400);
        assert_eq!(p["y"].mode, 0o644);
    }

    #[test]
    fn missing_keys_fail_unless_optional() {
        let items = [item("a", "x", None), item("zz", "y", None)];
        let e = make_payload(SourceKind::ConfigMap, Some(&items), Some(&data()), 0o644, false).unwrap_err();
        assert_eq!(e.to_string(), "configmap references non-existent config key: zz");
        let e = make_payload(SourceKind::Secret, Some(&items), Some(&data()), 0o644, false).unwrap_err();
        assert_eq!(e.to_string(), "secret references non-existent secret key: zz");
        let p = make_payload(SourceKind::ConfigMap, Some(&items), Some(&data()), 0o644, true).unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["x"]);
        let p = make_payload(SourceKind::ConfigMap, Some(&items), None, 0o644, true).unwrap();
        assert!(p.is_empty(), "a missing optional object is an empty volume");
    }

    #[test]
    fn binary_data_and_secret_bytes() {
        let cm = ConfigMap {
            data: Some([("t".to_string(), "text".to_string())].into_iter().collect()),
            binary_data: Some([("b".to_string(), ByteString(vec![0, 1, 2]))].into_iter().collect()),
            ..Default::default()
        };
        let d = config_map_data(&cm);
        assert_eq!(d["t"], b"text");
        assert_eq!(d["b"], vec![0, 1, 2]);
        let s = Secret {
            data: Some([("k".to_string(), ByteString(b"v".to_vec()))].into_iter().collect()),
            string_data: Some([("s".to_string(), "plain".to_string())].into_iter().collect()),
            ..Default::default()
        };
        assert_eq!(secret_data(&s)["k"], b"v");
        assert_eq!(secret_data(&s)["s"], b"plain");
    }
}
