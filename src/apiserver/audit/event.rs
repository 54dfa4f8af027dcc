//! One audit record, as upstream's audit.k8s.io/v1 Event encodes it.

use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    pub username: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// metav1.Status as upstream records it: the code, and for failures the
/// status, reason and message.
#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResponseStatus {
    pub metadata: serde_json::Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub code: u16,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub level: &'static str,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: &'static str,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub verb: String,
    pub user: UserInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonated_user: Option<UserInfo>,
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectReference>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Value>,
    pub request_received_timestamp: String,
    pub stage_timestamp: String,
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub annotations: serde_json::Map<String, Value>,
}

impl Event {
    /// The JSON line written to the log.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// `metadata.managedFields` removed from an object or from each item of a list.
pub fn omit_managed_fields(v: &mut Value) {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        for item in items {
            if let Some(meta) = item.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("managedFields");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_upstream_field_names() {
        let e = Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: "Metadata",
            audit_id: "id".into(),
            stage: "ResponseComplete",
            request_uri: "/api/v1/pods".into(),
            verb: "list".into(),
            user: UserInfo { username: "alice".into(), groups: vec!["g".into()] },
            impersonated_user: None,
            source_ips: vec!["127.0.0.1".into()],
            user_agent: String::new(),
            object_ref: Some(ObjectReference {
                resource: "pods".into(),
                api_version: "v1".into(),
                ..Default::default()
            }),
            response_status: Some(ResponseStatus { code: 200, ..Default::default() }),
            request_object: None,
            response_object: None,
            request_received_timestamp: "t0".into(),
            stage_timestamp: "t1".into(),
            annotations: Default::default(),
        };
        let v: Value = serde_json::from_slice(&e.to_line()).expect("json");
        assert_eq!(v["auditID"], "id");
        assert_eq!(v["requestURI"], "/api/v1/pods");
        assert_eq!(v["sourceIPs"][0], "127.0.0.1");
        assert_eq!(v["objectRef"]["apiVersion"], "v1");
        assert_eq!(v["responseStatus"]["code"], 200);
        assert!(v.get("requestObject").is_none() && v.get("userAgent").is_none());
    }

    #[test]
    fn managed_fields_are_dropped_from_lists_too() {
        let mut v = serde_json::json!({"items": [{"metadata": {"name": "a", "managedFields": []}}]});
        omit_managed_fields(&mut v);
        assert_eq!(v, serde_json::json!({"items": [{"metadata": {"name": "a"}}]}));
    }
}
