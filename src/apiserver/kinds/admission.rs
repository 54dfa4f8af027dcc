//! admissionregistration.k8s.io: Mutating and Validating webhook
//! configurations, ValidatingAdmissionPolicies and their bindings, and
//! their `kubectl get` columns.

use serde_json::{json, Value};

use super::{len, str_list};
use crate::apiserver::meta::{age, at, str_at};
use crate::apiserver::strategy::Hooks;
use crate::apiserver::table::Column;

/// Mutating and Validating webhook configurations.
pub fn webhook_configuration_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("Webhooks", "integer", 0), Column::age()],
        cells: |o| vec![json!(len(o, &["webhooks"])), json!(age(o))],
        ..Hooks::default()
    }
}

pub fn validatingadmissionpolicy_hooks() -> Hooks {
    Hooks {
        columns: || {
            vec![Column::new("Validations", "integer", 0), Column::new("ParamKind", "string", 0), Column::age()]
        },
        cells: |o| {
            let param_kind = match at(o, &["spec", "paramKind"]) {
                Some(k) => format!(
                    "{}/{}",
                    str_at(k, &["apiVersion"]).unwrap_or_default(),
                    str_at(k, &["kind"]).unwrap_or_default()
                ),
                None => "<unset>".into(),
            };
            vec![json!(len(o, &["spec", "validations"])), json!(param_kind), json!(age(o))]
        },
        ..Hooks::default()
    }
}

pub fn validatingadmissionpolicybinding_hooks() -> Hooks {
    Hooks {
        columns: || vec![Column::new("PolicyName", "string", 0), Column::new("ParamRef", "string", 0), Column::age()],
        cells: |o| {
            vec![json!(str_at(o, &["spec", "policyName"]).unwrap_or_default()), json!(param_ref(o)), json!(age(o))]
        },
        ..Hooks::default()
    }
}

/// `namespace/name` of the parameter (`*/name` when any namespace), or its
/// selector as upstream's Go value prints it.
fn param_ref(o: &Value) -> String {
    let Some(pr) = at(o, &["spec", "paramRef"]) else { return "<unset>".into() };
    match (str_at(pr, &["name"]).filter(|n| !n.is_empty()), str_at(pr, &["namespace"]).filter(|ns| !ns.is_empty())) {
        (Some(name), Some(ns)) => format!("{ns}/{name}"),
        (Some(name), None) => format!("*/{name}"),
        (None, _) => match pr.get("selector") {
            Some(sel) => go_label_selector(sel),
            None => "<unset>".into(),
        },
    }
}

/// A LabelSelector in the form of its generated Go `String()` method.
fn go_label_selector(sel: &Value) -> String {
    let labels: String = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}: {},", v.as_str().unwrap_or_default()))
        .collect();
    let exprs: String = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "LabelSelectorRequirement{{Key:{},Operator:{},Values:[{}],}},",
                str_at(e, &["key"]).unwrap_or_default(),
                str_at(e, &["operator"]).unwrap_or_default(),
                str_list(e, &["values"]).join(" ")
            )
        })
        .collect();
    format!("&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[]LabelSelectorRequirement{{{exprs}}},}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_and_binding_cells() {
        let vap = json!({"spec": {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}, "validations": [{"expression": "true"}, {"expression": "1 == 1"}]}});
        assert_eq!((validatingadmissionpolicy_hooks().cells)(&vap)[..2], [json!(2), json!("v1/ConfigMap")]);
        assert_eq!((validatingadmissionpolicy_hooks().cells)(&json!({"spec": {}}))[..2], [json!(0), json!("<unset>")]);

        let named = json!({"spec": {"policyName": "p", "paramRef": {"name": "cfg"}}});
        assert_eq!((validatingadmissionpolicybinding_hooks().cells)(&named)[..2], [json!("p"), json!("*/cfg")]);
        let selected = json!({"spec": {"policyName": "p", "paramRef": {"selector": {
            "matchLabels": {"b": "2", "a": "1"}, "matchExpressions": [{"key": "env", "operator": "In", "values": ["x", "y"]}]}}}});
        assert_eq!(
            param_ref(&selected),
            "&LabelSelector{MatchLabels:map[string]string{a: 1,b: 2,},MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:env,Operator:In,Values:[x y],},},}"
        );
        assert_eq!(param_ref(&json!({"spec": {}})), "<unset>");
    }
}
