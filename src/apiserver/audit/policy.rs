//! The audit policy (`--audit-policy-file`, audit.k8s.io/v1 Policy): the
//! first rule matching a request decides its level, the stages left out and
//! whether managedFields are dropped, as upstream's policy checker.

use serde::Deserialize;

/// How much of a request is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Default)]
pub enum Level {
    #[default]
    None,
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }
}

/// A point in a request's life at which an Event is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Stage {
    RequestReceived,
    ResponseStarted,
    ResponseComplete,
    Panic,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::RequestReceived => "RequestReceived",
            Stage::ResponseStarted => "ResponseStarted",
            Stage::ResponseComplete => "ResponseComplete",
            Stage::Panic => "Panic",
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupResources {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub resource_names: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    pub level: Level,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub user_groups: Vec<String>,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub resources: Vec<GroupResources>,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
    #[serde(default)]
    pub omit_stages: Vec<Stage>,
    pub omit_managed_fields: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
    #[serde(default)]
    pub omit_stages: Vec<Stage>,
    #[serde(default)]
    pub omit_managed_fields: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read the audit policy {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("the audit policy {path} is not a valid Policy: {message}")]
    Parse { path: String, message: String },
    #[error(
        "the audit policy {path} has kind {kind:?} apiVersion {api_version:?}, want kind Policy of audit.k8s.io/v1"
    )]
    Kind { path: String, kind: String, api_version: String },
}

/// What a request is, as the policy sees it (upstream's authorizer attributes).
#[derive(Debug, Clone, Default)]
pub struct Attributes<'a> {
    pub user: &'a str,
    pub groups: &'a [String],
    pub verb: &'a str,
    /// `None` for a non-resource request (`/healthz`, `/api`).
    pub resource: Option<ResourceAttributes<'a>>,
    pub path: &'a str,
}

#[derive(Debug, Clone, Default)]
pub struct ResourceAttributes<'a> {
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// What the policy says of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub level: Level,
    pub omit_stages: Vec<Stage>,
    pub omit_managed_fields: bool,
}

impl Decision {
    pub fn records(&self, stage: Stage) -> bool {
        self.level != Level::None && !self.omit_stages.contains(&stage)
    }
}

impl Policy {
    pub fn load(path: &std::path::Path) -> Result<Policy, PolicyError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read { path: shown.clone(), source })?;
        Policy::parse(&text).map_err(|e| match e {
            PolicyError::Parse { message, .. } => PolicyError::Parse { path: shown.clone(), message },
            PolicyError::Kind { kind, api_version, .. } => PolicyError::Kind { path: shown.clone(), kind, api_version },
            other => other,
        })
    }

    /// From YAML or JSON text.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        let policy: Policy = serde_yaml_ng::from_str(text)
            .map_err(|e| PolicyError::Parse { path: String::new(), message: e.to_string() })?;
        let kind_ok = policy.kind == "Policy";
        let version_ok = matches!(policy.api_version.as_str(), "audit.k8s.io/v1" | "audit.k8s.io/v1beta1");
        if !kind_ok || !version_ok {
            return Err(PolicyError::Kind { path: String::new(), kind: policy.kind, api_version: policy.api_version });
        }
        Ok(policy)
    }

    /// The first matching rule's level and stages; `None` when no rule matches.
    pub fn decide(&self, attrs: &Attributes<'_>) -> Decision {
        let Some(rule) = self.rules.iter().find(|r| r.matches(attrs)) else {
            return Decision::default();
        };
        let mut omit_stages = self.omit_stages.clone();
        omit_stages.extend(rule.omit_stages.iter().copied().filter(|s| !self.omit_stages.contains(s)));
        Decision {
            level: rule.level,
            omit_stages,
            omit_managed_fields: rule.omit_managed_fields.unwrap_or(self.omit_managed_fields),
        }
    }
}

fn has(list: &[String], s: &str) -> bool {
    list.iter().any(|x| x == s)
}

impl PolicyRule {
    fn matches(&self, a: &Attributes<'_>) -> bool {
        if !self.users.is_empty() && !has(&self.users, a.user) {
            return false;
        }
        if !self.user_groups.is_empty() && !a.groups.iter().any(|g| has(&self.user_groups, g)) {
            return false;
        }
        if !self.verbs.is_empty() && !has(&self.verbs, a.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return self.matches_resource(a);
        }
        if !self.non_resource_urls.is_empty() {
            return self.matches_non_resource(a);
        }
        true
    }

    fn matches_non_resource(&self, a: &Attributes<'_>) -> bool {
        if a.resource.is_some() {
            return false;
        }
        self.non_resource_urls.iter().any(|u| match u.strip_suffix('*') {
            Some(prefix) => a.path.starts_with(prefix),
            None => a.path == u,
        })
    }

    fn matches_resource(&self, a: &Attributes<'_>) -> bool {
        let Some(r) = &a.resource else {
            return false;
        };
        if !self.namespaces.is_empty() && !has(&self.namespaces, r.namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        let combined =
            if r.subresource.is_empty() { r.resource.to_string() } else { format!("{}/{}", r.resource, r.subresource) };
        self.resources.iter().filter(|gr| gr.group == r.group).any(|gr| {
            if gr.resources.is_empty() {
                return true;
            }
            if !gr.resource_names.is_empty() && !has(&gr.resource_names, r.name) {
                return false;
            }
            gr.resources.iter().any(|res| {
                res == &combined
                    || res == "*"
                    // `*/scale`: that subresource of any resource.
                    || (!r.subresource.is_empty() && res.strip_prefix("*/") == Some(r.subresource))
                    // `pods/*`: any subresource of pods.
                    || (!r.subresource.is_empty() && res.strip_suffix("/*") == Some(r.resource))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  users: ["system:kube-proxy"]
- level: None
  nonResourceURLs: ["/healthz*", "/version"]
- level: RequestResponse
  resources:
  - group: ""
    resources: ["pods/log", "secrets"]
    resourceNames: ["keep"]
- level: Request
  verbs: ["create"]
  namespaces: ["team"]
  omitStages: [ResponseComplete]
- level: Metadata
  resources:
  - group: apps
    resources: ["*/scale", "deployments/*"]
- level: Metadata
  userGroups: ["auditors"]
  omitManagedFields: true
"#;

    fn res<'a>(group: &'a str, resource: &'a str, sub: &'a str, ns: &'a str, name: &'a str) -> ResourceAttributes<'a> {
        ResourceAttributes { group, resource, subresource: sub, namespace: ns, name }
    }

    fn decide(
        p: &Policy,
        user: &str,
        groups: &[String],
        verb: &str,
        r: Option<ResourceAttributes<'_>>,
        path: &str,
    ) -> Level {
        p.decide(&Attributes { user, groups, verb, resource: r, path }).level
    }

    #[test]
    fn first_matching_rule_decides() {
        let p = Policy::parse(POLICY).expect("policy");
        let none: Vec<String> = vec![];
        assert_eq!(decide(&p, "system:kube-proxy", &none, "get", None, "/api"), Level::None);
        assert_eq!(decide(&p, "alice", &none, "get", None, "/healthz/etcd"), Level::None);
        assert_eq!(decide(&p, "alice", &none, "get", None, "/versions"), Level::None, "no rule matches");
        assert_eq!(
            decide(&p, "alice", &none, "get", Some(res("", "pods", "log", "a", "keep")), ""),
            Level::RequestResponse
        );
        assert_eq!(decide(&p, "alice", &none, "get", Some(res("", "pods", "", "a", "keep")), ""), Level::None);
        assert_eq!(decide(&p, "alice", &none, "get", Some(res("", "secrets", "", "a", "other")), ""), Level::None);
        assert_eq!(
            decide(&p, "alice", &none, "create", Some(res("", "configmaps", "", "team", "x")), ""),
            Level::Request
        );
        assert_eq!(
            decide(&p, "alice", &none, "create", Some(res("", "configmaps", "", "other", "x")), ""),
            Level::None
        );
        assert_eq!(
            decide(&p, "alice", &none, "update", Some(res("apps", "replicasets", "scale", "a", "x")), ""),
            Level::Metadata
        );
        assert_eq!(
            decide(&p, "alice", &none, "update", Some(res("apps", "deployments", "status", "a", "x")), ""),
            Level::Metadata
        );
        assert_eq!(
            decide(&p, "alice", &none, "update", Some(res("apps", "deployments", "", "a", "x")), ""),
            Level::None
        );
        let auditors = vec!["auditors".to_string()];
        assert_eq!(decide(&p, "bob", &auditors, "list", None, "/apis"), Level::Metadata);
    }

    #[test]
    fn stages_and_managed_fields_combine_policy_and_rule() {
        let p = Policy::parse(POLICY).expect("policy");
        let d = p.decide(&Attributes {
            user: "a",
            groups: &[],
            verb: "create",
            resource: Some(res("", "configmaps", "", "team", "x")),
            path: "",
        });
        assert!(!d.records(Stage::RequestReceived) && !d.records(Stage::ResponseComplete));
        assert!(d.records(Stage::ResponseStarted));
        let groups = vec!["auditors".to_string()];
        let d = p.decide(&Attributes { user: "b", groups: &groups, verb: "get", resource: None, path: "/x" });
        assert!(d.omit_managed_fields);
    }

    #[test]
    fn rejects_other_kinds() {
        assert!(matches!(Policy::parse("apiVersion: v1\nkind: ConfigMap\n"), Err(PolicyError::Kind { .. })));
        assert!(matches!(
            Policy::parse("kind: Policy\napiVersion: audit.k8s.io/v1\nrules: [{level: Loud}]"),
            Err(PolicyError::Parse { .. })
        ));
    }
}
