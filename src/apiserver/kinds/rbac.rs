//! Roles, ClusterRoles, RoleBindings and ClusterRoleBindings: names that
//! are path segments (`system:admin`), and their `kubectl get` columns.

use serde_json::{json, Value};

use super::created_at_hooks;
use crate::apiserver::meta::{age, at, str_at};
use crate::apiserver::strategy::{Hooks, NameRule};
use crate::apiserver::table::Column;

/// Roles and ClusterRoles: upstream has no printer, so NAME and CREATED AT.
pub fn role_hooks() -> Hooks {
    Hooks { name_rule: NameRule::PathSegment, ..created_at_hooks() }
}

/// RoleBindings and ClusterRoleBindings.
pub fn role_binding_hooks() -> Hooks {
    Hooks {
        name_rule: NameRule::PathSegment,
        columns: || {
            vec![
                Column::new("Role", "string", 0),
                Column::age(),
                Column::new("Users", "string", 1),
                Column::new("Groups", "string", 1),
                Column::new("ServiceAccounts", "string", 1),
            ]
        },
        cells: role_binding_cells,
        ..Hooks::default()
    }
}

fn role_binding_cells(o: &Value) -> Vec<Value> {
    let role = format!(
        "{}/{}",
        str_at(o, &["roleRef", "kind"]).unwrap_or_default(),
        str_at(o, &["roleRef", "name"]).unwrap_or_default()
    );
    let (mut users, mut groups, mut sas) = (Vec::new(), Vec::new(), Vec::new());
    for s in at(o, &["subjects"]).and_then(Value::as_array).into_iter().flatten() {
        let name = str_at(s, &["name"]).unwrap_or_default();
        match str_at(s, &["kind"]).unwrap_or_default() {
            "ServiceAccount" => sas.push(format!("{}/{name}", str_at(s, &["namespace"]).unwrap_or_default())),
            "User" => users.push(name.to_string()),
            "Group" => groups.push(name.to_string()),
            _ => {}
        }
    }
    vec![json!(role), json!(age(o)), json!(users.join(", ")), json!(groups.join(", ")), json!(sas.join(", "))]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_cells_split_subjects() {
        let rb = json!({
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [
                {"kind": "User", "name": "alice"}, {"kind": "User", "name": "bob"},
                {"kind": "Group", "name": "devs"},
                {"kind": "ServiceAccount", "namespace": "kube-system", "name": "default"}
            ]
        });
        let cells = role_binding_cells(&rb);
        assert_eq!(cells[0], json!("ClusterRole/view"));
        assert_eq!(&cells[2..], &[json!("alice, bob"), json!("devs"), json!("kube-system/default")]);
    }

    #[test]
    fn roles_show_created_at() {
        let h = role_hooks();
        assert_eq!(h.name_rule, NameRule::PathSegment);
        let cols = (h.columns)();
        assert_eq!((cols[0].name, cols[0].kind), ("Created At", "date"));
        let cells = (h.cells)(&json!({"metadata": {"creationTimestamp": "2024-05-06T07:08:09Z"}}));
        assert_eq!(cells, vec![json!("2024-05-06T07:08:09Z")]);
    }
}
