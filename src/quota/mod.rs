//! Resource quota accounting shared by the ResourceQuota admission plugin
//! and the ResourceQuotaController, as upstream's `pkg/quota/v1`: resource
//! lists of exact quantities, and what one object of a kind uses (its
//! evaluator).

pub mod evaluator;
pub mod pods;

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::quantity::Amount;

/// Resource name → quantity (upstream's `corev1.ResourceList`).
pub type ResourceList = BTreeMap<String, Amount>;

/// A list from its JSON map (`spec.hard`, `status.used`); entries that do
/// not parse are left out (stored objects were validated on the way in).
pub fn parse_list(v: Option<&Value>) -> ResourceList {
    let Some(map) = v.and_then(Value::as_object) else { return ResourceList::new() };
    map.iter()
        .filter_map(|(k, q)| {
            let text = match q {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return None,
            };
            Amount::parse(&text).ok().map(|a| (k.clone(), a))
        })
        .collect()
}

/// The list as JSON, every quantity in canonical form.
pub fn to_json(list: &ResourceList) -> Value {
    Value::Object(list.iter().map(|(k, v)| (k.clone(), Value::String(v.to_string()))).collect::<Map<_, _>>())
}

/// `a + b`, key by key.
pub fn add(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let mut out = a.clone();
    for (k, v) in b {
        let sum = out.get(k).copied().unwrap_or_default().plus(*v);
        out.insert(k.clone(), sum);
    }
    out
}

/// Only the entries named in `names`.
pub fn mask<'a>(list: &ResourceList, names: impl IntoIterator<Item = &'a String>) -> ResourceList {
    names.into_iter().filter_map(|n| list.get(n).map(|v| (n.clone(), *v))).collect()
}

/// `a - b` key by key over the keys of `a`, never below zero (what an
/// update adds to the usage of the object it replaces).
pub fn subtract_non_negative(a: &ResourceList, b: &ResourceList) -> ResourceList {
    a.iter()
        .map(|(k, v)| {
            let d = b.get(k).map_or(*v, |old| v.minus(*old));
            (k.clone(), if d < Amount::default() { Amount::default() } else { d })
        })
        .collect()
}

/// Without the zero entries.
pub fn remove_zeros(list: ResourceList) -> ResourceList {
    list.into_iter().filter(|(_, v)| !v.is_zero()).collect()
}

/// The names of `a` whose value exceeds the one in `b` (missing in `b`: not limited).
pub fn exceeded(a: &ResourceList, b: &ResourceList) -> Vec<String> {
    a.iter().filter(|(k, v)| b.get(*k).is_some_and(|limit| *v > limit)).map(|(k, _)| k.clone()).collect()
}

/// `cpu=1,memory=1Gi`, sorted by name, as upstream's quota messages print lists.
pub fn pretty_print(list: &ResourceList) -> String {
    list.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// `count/<resource>` for the core group, `count/<resource>.<group>` otherwise.
pub fn object_count_name(group: &str, plural: &str) -> String {
    if group.is_empty() {
        format!("count/{plural}")
    } else {
        format!("count/{plural}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_add_mask_and_print() {
        let a = parse_list(Some(&json!({"pods": "2", "requests.cpu": "500m"})));
        let b = parse_list(Some(&json!({"pods": "1", "requests.cpu": "500m", "requests.memory": "1Gi"})));
        let sum = add(&a, &b);
        assert_eq!(pretty_print(&sum), "pods=3,requests.cpu=1,requests.memory=1Gi");
        let hard = parse_list(Some(&json!({"pods": "3", "requests.cpu": "900m"})));
        assert_eq!(exceeded(&sum, &hard), vec!["requests.cpu".to_string()]);
        let names = vec!["pods".to_string()];
        assert_eq!(to_json(&mask(&sum, &names)), json!({"pods": "3"}));
        assert_eq!(object_count_name("apps", "deployments"), "count/deployments.apps");
        assert_eq!(object_count_name("", "configmaps"), "count/configmaps");
        let grown = subtract_non_negative(&b, &a);
        assert_eq!(pretty_print(&remove_zeros(grown)), "requests.memory=1Gi");
    }
}
