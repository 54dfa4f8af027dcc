//! ClusterRoleAggregationController: a ClusterRole with an
//! `aggregationRule` holds the rules of the ClusterRoles its
//! `clusterRoleSelectors` pick, as upstream's controller makes them: for
//! each selector in turn, the picked roles by name (itself left out), each
//! rule added unless an equal one is there already. Any ClusterRole's
//! change queues every aggregated role (the set is small and the graph of
//! who picks whom unknown: `view` is picked by `edit`, which is picked by
//! `admin`). It acts as its own service account,
//! `clusterrole-aggregation-controller`, writing only the `rules` of the
//! roles, as upstream's apply of the rules alone does.
//!
//! `aggregate_all` runs the same computation once, to a fixed point, for
//! the server's start: the default roles admin, edit and view are written
//! without rules, and must hold them before anyone is bound to them.

use std::sync::Arc;

use crate::controllers::work_queue::Action;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;

use super::informers::wait_synced;
use super::ControllerError;
use crate::client::informer_factory::SharedInformerFactory;
use crate::client::labels;

/// The service account it acts as, and its field manager.
pub const NAME: &str = "clusterrole-aggregation-controller";

/// Upstream's name of its work queue.
const QUEUE: &str = "ClusterRoleAggregator";

/// A rule with unset and empty lists made the same, as upstream's semantic
/// equality sees them.
fn normalized(rule: &PolicyRule) -> [Vec<String>; 5] {
    let list = |v: &Option<Vec<String>>| v.clone().unwrap_or_default();
    [
        list(&rule.api_groups),
        list(&rule.non_resource_urls),
        list(&rule.resource_names),
        list(&rule.resources),
        rule.verbs.clone(),
    ]
}

fn same_rules(a: &[PolicyRule], b: &[PolicyRule]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| normalized(x) == normalized(y))
}

/// The rules `role` aggregates from `all`, or None when it aggregates
/// nothing (no aggregationRule).
pub fn aggregated_rules(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Option<Vec<PolicyRule>> {
    let selectors = role.aggregation_rule.as_ref()?.cluster_role_selectors.clone().unwrap_or_default();
    let mut rules: Vec<PolicyRule> = Vec::new();
    for selector in &selectors {
        let mut picked: Vec<&Arc<ClusterRole>> = all
            .iter()
            .filter(|r| r.name_any() != role.name_any() && labels::matches(selector, r.metadata.labels.as_ref()))
            .collect();
        picked.sort_by_key(|r| r.name_any());
        for rule in picked.iter().flat_map(|r| r.rules.iter().flatten()) {
            let key = normalized(rule);
            if !rules.iter().any(|have| normalized(have) == key) {
                rules.push(rule.clone());
            }
        }
    }
    Some(rules)
}

/// The rules `role` must be given, when they differ from what it holds.
fn needed(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Option<Vec<PolicyRule>> {
    let rules = aggregated_rules(role, all)?;
    let have = role.rules.as_deref().unwrap_or_default();
    (!same_rules(&rules, have)).then_some(rules)
}

/// Writes `rules` as the role's rules (a merge patch of `rules` alone).
async fn write(api: &Api<ClusterRole>, name: &str, rules: Vec<PolicyRule>) -> Result<(), kube::Error> {
    let rules =
        if rules.is_empty() { serde_json::Value::Null } else { serde_json::to_value(rules).unwrap_or_default() };
    let patch = serde_json::json!({"rules": rules});
    match api
        .patch(name, &PatchParams { field_manager: Some(NAME.into()), ..Default::default() }, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Deleted meanwhile: nothing to aggregate into.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

struct Context {
    api: Api<ClusterRole>,
    roles: Store<ClusterRole>,
}

async fn reconcile(role: Arc<ClusterRole>, ctx: Arc<Context>) -> Result<Action, ControllerError> {
    wait_synced(&ctx.roles).await?;
    // The cached role, which the trigger's event may predate.
    let role = ctx.roles.get(&ObjectRef::from_obj(&*role)).unwrap_or(role);
    if let Some(rules) = needed(&role, &ctx.roles.state()) {
        tracing::debug!(role = %role.name_any(), rules = rules.len(), "aggregating rules");
        write(&ctx.api, &role.name_any(), rules).await?;
    }
    Ok(Action::await_change())
}

/// Aggregates every aggregated ClusterRole once, again until nothing
/// changes (a role picked by another one may itself be aggregated), at most
/// a few rounds.
pub async fn aggregate_all(client: kube::Client) -> Result<(), ControllerError> {
    let api: Api<ClusterRole> = Api::all(client);
    for _ in 0..8 {
        let all: Vec<Arc<ClusterRole>> =
            api.list(&ListParams::default()).await?.items.into_iter().map(Arc::new).collect();
        let mut changed = false;
        for role in &all {
            if let Some(rules) = needed(role, &all) {
                write(&api, &role.name_any(), rules).await?;
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
    }
    Err(ControllerError::Invalid("aggregated ClusterRoles kept changing".into()))
}

/// `client` is the controller's own; `informers` the process' shared
/// informers (which watch as the controller manager).
pub async fn run(client: kube::Client, informers: SharedInformerFactory) {
    let informer = informers.informer::<ClusterRole>();
    let cache = informer.store();
    let (roles, trigger) = informer.subscribe().trigger_with(move |_changed: &ClusterRole| {
        cache
            .state()
            .iter()
            .filter(|r| r.aggregation_rule.is_some())
            .map(|r| ObjectRef::from_obj(&**r))
            .collect::<Vec<_>>()
    });
    let ctx = Arc::new(Context { api: Api::all(client), roles: roles.clone() });
    super::informers::run(QUEUE, roles, vec![trigger], reconcile, ctx).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::AggregationRule;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

    fn rule(resource: &str, verbs: &[&str]) -> PolicyRule {
        PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec![resource.into()]),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..Default::default()
        }
    }

    fn role(name: &str, label: Option<&str>, rules: Vec<PolicyRule>, picks: Option<&str>) -> Arc<ClusterRole> {
        Arc::new(ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: label.map(|l| [(l.to_string(), "true".to_string())].into_iter().collect()),
                ..Default::default()
            },
            rules: Some(rules),
            aggregation_rule: picks.map(|l| AggregationRule {
                cluster_role_selectors: Some(vec![LabelSelector {
                    match_labels: Some([(l.to_string(), "true".to_string())].into_iter().collect()),
                    ..Default::default()
                }]),
            }),
        })
    }

    #[test]
    fn rules_come_from_the_picked_roles_by_name_without_duplicates_or_itself() {
        let all = vec![
            role("b", Some("x"), vec![rule("pods", &["get"]), rule("secrets", &["get"])], None),
            role("a", Some("x"), vec![rule("pods", &["get"])], None),
            role("c", None, vec![rule("nodes", &["get"])], None),
            role("agg", Some("x"), vec![rule("old", &["*"])], Some("x")),
        ];
        let rules = aggregated_rules(&all[3], &all).expect("aggregated");
        assert!(same_rules(&rules, &[rule("pods", &["get"]), rule("secrets", &["get"])]));
        assert_eq!(aggregated_rules(&all[0], &all), None);
        // Empty and unset lists are the same rule.
        let mut unset = rule("pods", &["get"]);
        unset.resource_names = Some(Vec::new());
        assert!(same_rules(&[unset], &[rule("pods", &["get"])]));
    }

    #[test]
    fn nothing_picked_means_no_rules() {
        let all = vec![role("agg", None, vec![rule("old", &["*"])], Some("x"))];
        assert_eq!(needed(&all[0], &all).map(|r| r.len()), Some(0));
    }
}
