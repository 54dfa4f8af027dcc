//! Authorization (upstream's `WithAuthorization` filter, asked here by
//! each handler once it knows the verb): the request's attributes (verb,
//! group, resource, subresource, namespace, name) put to this server's
//! authorizers (`auth::union`), and upstream's Forbidden message when they
//! refuse. The decision is recorded for the audit log.

use crate::apiserver::auth::rbac::Attributes;
use crate::apiserver::auth::union::Authorizers;
use crate::apiserver::auth::{Decision, DecisionRecord, User};
use crate::apiserver::call::Call;
use crate::apiserver::request;
use crate::apiserver::status::ApiError;
use crate::apiserver::Api;

impl Api {
    /// The authorizers of this server, over its caches.
    pub fn authorizers(&self) -> Authorizers<'_> {
        Authorizers { rbac: &self.rbac, node_graph: &self.node_graph }
    }

    /// Whether `user` may do what `attrs` describe, and why (`auth::union`).
    pub fn decide(&self, user: &User, attrs: &Attributes) -> Decision {
        self.authorizers().decide(user, attrs)
    }

    /// `decide`, recorded for the audit log when `record` is given.
    pub fn allowed_recorded(&self, user: &User, attrs: &Attributes, record: Option<&DecisionRecord>) -> bool {
        let decision = self.decide(user, attrs);
        if let Some(r) = record {
            r.set(&decision);
        }
        decision.allowed
    }

    pub fn allowed(&self, user: &User, attrs: &Attributes) -> bool {
        self.decide(user, attrs).allowed
    }

    /// Authorization: members of system:masters may do anything; RBAC for
    /// everyone else.
    pub async fn authorize(&self, call: &Call, verb: &str) -> Result<(), ApiError> {
        let r = &call.resource;
        let mut name = call.path.name.clone().unwrap_or_default();
        if name.is_empty() && matches!(verb, "list" | "watch") {
            // A list or watch of one object names it, as upstream's request info does.
            name = call.param("fieldSelector").and_then(request::selected_name).unwrap_or_default();
        }
        let attrs = Attributes {
            verb: verb.to_string(),
            group: r.group.clone(),
            resource: r.plural.clone(),
            subresource: call.path.subresource.clone().unwrap_or_default(),
            namespace: call.namespace().unwrap_or_default().to_string(),
            name,
            path: None,
        };
        let decision = self.authorizers().decide_waiting_for_graph(&call.user, &attrs).await;
        if let Some(record) = call.decision.as_ref() {
            record.set(&decision);
        }
        if decision.allowed {
            return Ok(());
        }
        let because = if decision.reason.is_empty() { String::new() } else { format!(": {}", decision.reason) };
        let scope = match call.namespace() {
            Some(ns) => format!(" in the namespace \"{ns}\""),
            None => " at the cluster scope".into(),
        };
        let resource = match &call.path.subresource {
            Some(s) => format!("{}/{s}", r.plural),
            None => r.plural.clone(),
        };
        let name = call.path.name.as_deref().map(|n| format!("{resource} \"{n}\"")).unwrap_or_else(|| resource.clone());
        let qualified =
            if r.group.is_empty() { name } else { name.replacen(&resource, &format!("{resource}.{}", r.group), 1) };
        let mut e = ApiError::forbidden(format!(
            "{qualified} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{}\"{scope}{because}",
            call.user.name, r.group
        ));
        e.kind = r.plural.clone();
        e.group = r.group.clone();
        e.name = call.path.name.clone().unwrap_or_default();
        Err(e)
    }
}
