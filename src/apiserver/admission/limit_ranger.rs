//! LimitRanger: the LimitRanges of a namespace give a new pod's containers
//! their default limits and requests (`default`, `defaultRequest` of a
//! `Container` limit), and then hold pods and claims to their bounds:
//! `min`, `max` and `maxLimitRequestRatio` per container, per pod (its
//! containers' sum, or its largest init container), and `min`/`max`
//! storage per PersistentVolumeClaim. A pod or claim out of bounds is
//! refused as upstream refuses it (403, every violation named).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::Operation;
use crate::apiserver::call::Call;
use crate::apiserver::meta;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::quantity::Amount;

/// Upstream's resource.MaxMilliValue: beyond it, quantities compare in
/// whole units.
const MAX_MILLI_VALUE: i64 = (i64::MAX / 1000) - 1;

/// A container's or a pod's requests or limits, by resource.
type Amounts = BTreeMap<String, Amount>;

/// The LimitRanges of the request's namespace.
fn limit_ranges(call: &Call) -> Vec<std::sync::Arc<Value>> {
    match call.namespace() {
        Some(ns) => call.api.caches.limit_ranges.in_namespace(ns),
        None => Vec::new(),
    }
}

/// The `limits` items of `ranges` of one `type`.
fn items<'a>(ranges: &'a [std::sync::Arc<Value>], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    ranges
        .iter()
        .flat_map(|r| r.pointer("/spec/limits").and_then(Value::as_array).into_iter().flatten())
        .filter(move |l| l.get("type").and_then(Value::as_str) == Some(kind))
}

/// Sets the containers' missing limits and requests from the `Container`
/// limits' `default` and `defaultRequest` (a new pod's).
pub fn default_pod(call: &Call, pod: &mut Value) {
    let ranges = limit_ranges(call);
    for limit in items(&ranges, "Container") {
        for key in ["containers", "initContainers"] {
            for c in pod.pointer_mut(&format!("/spec/{key}")).and_then(Value::as_array_mut).into_iter().flatten() {
                for (field, source) in [("limits", "default"), ("requests", "defaultRequest")] {
                    let Some(Value::Object(defaults)) = limit.get(source) else { continue };
                    let Some(res) = c.as_object_mut().map(|m| m.entry("resources").or_insert_with(|| json!({}))) else {
                        continue;
                    };
                    if !res.get(field).is_some_and(Value::is_object) {
                        res[field] = json!({});
                    }
                    for (r, q) in defaults {
                        if res[field].get(r).is_none() {
                            res[field][r] = q.clone();
                        }
                    }
                }
            }
        }
        let annotations = meta::metadata_mut(pod).entry("annotations").or_insert_with(|| json!({}));
        annotations["kubernetes.io/limit-ranger"] = json!("LimitRanger plugin set: defaults for containers");
    }
}

/// Refuses a new pod, or a new or changed claim, that a LimitRange of its
/// namespace does not allow.
pub fn validate(call: &Call, obj: &Value, op: Operation) -> ApiResult<()> {
    let r = &call.resource;
    if !r.group.is_empty() || call.path.subresource.is_some() {
        return Ok(());
    }
    let violations = match (r.plural.as_str(), op) {
        ("pods", Operation::Create) => pod_violations(&limit_ranges(call), obj),
        ("persistentvolumeclaims", Operation::Create | Operation::Update) => {
            if obj.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
                return Ok(());
            }
            claim_violations(&limit_ranges(call), obj)
        }
        _ => return Ok(()),
    };
    if violations.is_empty() {
        return Ok(());
    }
    // upstream's aggregate error: one message as it is, several in brackets.
    let why = if violations.len() == 1 { violations[0].clone() } else { format!("[{}]", violations.join(", ")) };
    Err(ApiError::forbidden_object(&r.group, &r.plural, meta::name_of(obj), &why))
}

/// A resource list (`requests`, `limits`, `min`, ...) read as amounts.
fn amounts(list: Option<&Value>) -> Amounts {
    list.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), Amount::parse(v.as_str()?).ok()?)))
        .collect()
}

/// `list` of a container's `resources` (requests or limits).
fn container_amounts(c: &Value, list: &str) -> Amounts {
    amounts(c.pointer(&format!("/resources/{list}")))
}

fn pod_violations(ranges: &[std::sync::Arc<Value>], pod: &Value) -> Vec<String> {
    let containers = |key: &str| pod.pointer(&format!("/spec/{key}")).and_then(Value::as_array).cloned();
    let all: Vec<Value> = containers("containers")
        .into_iter()
        .flatten()
        .chain(containers("initContainers").into_iter().flatten())
        .collect();
    let mut out = Vec::new();
    for limit in items(ranges, "Container") {
        for c in &all {
            bounds(&mut out, "Container", limit, &container_amounts(c, "requests"), &container_amounts(c, "limits"));
        }
    }
    for limit in items(ranges, "Pod") {
        bounds(&mut out, "Pod", limit, &pod_total(pod, "requests"), &pod_total(pod, "limits"));
    }
    out
}

fn claim_violations(ranges: &[std::sync::Arc<Value>], claim: &Value) -> Vec<String> {
    let requests = amounts(claim.pointer("/spec/resources/requests"));
    let mut out = Vec::new();
    for limit in items(ranges, "PersistentVolumeClaim") {
        for (resource, enforced) in amounts(limit.get("min")) {
            out.extend(min_constraint("PersistentVolumeClaim", &resource, enforced, &requests, &Amounts::new()));
        }
        for (resource, enforced) in amounts(limit.get("max")) {
            out.extend(max_request_constraint("PersistentVolumeClaim", &resource, enforced, &requests));
        }
    }
    out
}

/// The `min`, `max` and `maxLimitRequestRatio` of one limit item checked
/// against one container's (or pod's) requests and limits.
fn bounds(out: &mut Vec<String>, kind: &str, limit: &Value, requests: &Amounts, limits: &Amounts) {
    for (resource, enforced) in amounts(limit.get("min")) {
        out.extend(min_constraint(kind, &resource, enforced, requests, limits));
    }
    for (resource, enforced) in amounts(limit.get("max")) {
        out.extend(max_constraint(kind, &resource, enforced, requests, limits));
    }
    for (resource, enforced) in amounts(limit.get("maxLimitRequestRatio")) {
        out.extend(ratio_constraint(kind, &resource, enforced, requests, limits));
    }
}

/// A pod's requests or limits as upstream's LimitRanger adds them up: its
/// containers' sum (sidecars, restartable init containers, included), or
/// any init container's (with the sidecars started before it) when larger.
fn pod_total(pod: &Value, list: &str) -> Amounts {
    let add = |to: &mut Amounts, from: &Amounts| {
        for (k, v) in from {
            let sum = to.get(k).copied().unwrap_or_default().plus(*v);
            to.insert(k.clone(), sum);
        }
    };
    let max = |to: &mut Amounts, from: &Amounts| {
        for (k, v) in from {
            let larger = to.get(k).map_or(*v, |have| Amount::max(*have, *v));
            to.insert(k.clone(), larger);
        }
    };
    let containers = |key: &str| pod.pointer(&format!("/spec/{key}")).and_then(Value::as_array).cloned();
    let mut total = Amounts::new();
    for c in containers("containers").into_iter().flatten() {
        add(&mut total, &container_amounts(&c, list));
    }
    let mut sidecars = Amounts::new();
    let mut init = Amounts::new();
    for c in containers("initContainers").into_iter().flatten() {
        let own = container_amounts(&c, list);
        let during = if c.get("restartPolicy").and_then(Value::as_str) == Some("Always") {
            add(&mut total, &own);
            add(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut with_sidecars = own;
            add(&mut with_sidecars, &sidecars);
            with_sidecars
        };
        max(&mut init, &during);
    }
    max(&mut total, &init);
    total
}

/// Two amounts and the bound at one precision (upstream's
/// requestLimitEnforcedValues): thousandths unless one would overflow.
fn comparable(request: Amount, limit: Amount, enforced: Amount) -> (i64, i64, i64) {
    let (r, l, e) = (request.value(), limit.value(), enforced.value());
    if r <= MAX_MILLI_VALUE && l <= MAX_MILLI_VALUE && e <= MAX_MILLI_VALUE {
        (request.milli_value(), limit.milli_value(), enforced.milli_value())
    } else {
        (r, l, e)
    }
}

fn min_constraint(
    kind: &str,
    resource: &str,
    enforced: Amount,
    requests: &Amounts,
    limits: &Amounts,
) -> Option<String> {
    let (req, lim) = (requests.get(resource), limits.get(resource));
    let (r, l, e) = comparable(req.copied().unwrap_or_default(), lim.copied().unwrap_or_default(), enforced);
    match (req, lim) {
        (None, _) => Some(format!("minimum {resource} usage per {kind} is {enforced}.  No request is specified")),
        (Some(req), _) if r < e => {
            Some(format!("minimum {resource} usage per {kind} is {enforced}, but request is {req}"))
        }
        (_, Some(lim)) if l < e => {
            Some(format!("minimum {resource} usage per {kind} is {enforced}, but limit is {lim}"))
        }
        _ => None,
    }
}

fn max_constraint(
    kind: &str,
    resource: &str,
    enforced: Amount,
    requests: &Amounts,
    limits: &Amounts,
) -> Option<String> {
    let (req, lim) = (requests.get(resource), limits.get(resource));
    let (r, l, e) = comparable(req.copied().unwrap_or_default(), lim.copied().unwrap_or_default(), enforced);
    match (req, lim) {
        (_, None) => Some(format!("maximum {resource} usage per {kind} is {enforced}.  No limit is specified")),
        (_, Some(lim)) if l > e => {
            Some(format!("maximum {resource} usage per {kind} is {enforced}, but limit is {lim}"))
        }
        (Some(req), _) if r > e => {
            Some(format!("maximum {resource} usage per {kind} is {enforced}, but request is {req}"))
        }
        _ => None,
    }
}

/// `max` for a kind without limits (a claim's storage).
fn max_request_constraint(kind: &str, resource: &str, enforced: Amount, requests: &Amounts) -> Option<String> {
    let Some(req) = requests.get(resource) else {
        return Some(format!("maximum {resource} usage per {kind} is {enforced}.  No request is specified"));
    };
    let (r, _, e) = comparable(*req, Amount::default(), enforced);
    (r > e).then(|| format!("maximum {resource} usage per {kind} is {enforced}, but request is {req}"))
}

fn ratio_constraint(
    kind: &str,
    resource: &str,
    enforced: Amount,
    requests: &Amounts,
    limits: &Amounts,
) -> Option<String> {
    let (req, lim) = (requests.get(resource), limits.get(resource));
    let (r, l, _) = comparable(req.copied().unwrap_or_default(), lim.copied().unwrap_or_default(), enforced);
    let head = format!("{resource} max limit to request ratio per {kind} is {enforced}");
    if req.is_none() || r == 0 {
        return Some(format!("{head}, but no request is specified or request is 0"));
    }
    if lim.is_none() || l == 0 {
        return Some(format!("{head}, but no limit is specified or limit is 0"));
    }
    let shown = l as f64 / r as f64;
    let (observed, allowed) = if enforced.value() <= MAX_MILLI_VALUE {
        (shown * 1000.0, enforced.milli_value() as f64)
    } else {
        (shown, enforced.value() as f64)
    };
    (observed > allowed).then(|| format!("{head}, but provided ratio is {shown:.6}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn range(limits: Value) -> Vec<Arc<Value>> {
        vec![Arc::new(json!({"spec": {"limits": limits}}))]
    }

    fn pod(containers: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"containers": containers}})
    }

    #[test]
    fn containers_are_held_to_min_max_and_ratio() {
        let ranges = range(json!([{"type": "Container",
            "min": {"cpu": "50m", "memory": "100Mi"}, "max": {"cpu": "500m"}, "maxLimitRequestRatio": {"cpu": "2"}}]));
        let fits =
            pod(json!([{"resources": {"requests": {"cpu": "100m", "memory": "100Mi"}, "limits": {"cpu": "200m"}}}]));
        assert!(pod_violations(&ranges, &fits).is_empty(), "{:?}", pod_violations(&ranges, &fits));
        let small =
            pod(json!([{"resources": {"requests": {"cpu": "10m", "memory": "50Mi"}, "limits": {"cpu": "20m"}}}]));
        assert_eq!(
            pod_violations(&ranges, &small),
            [
                "minimum cpu usage per Container is 50m, but request is 10m",
                "minimum memory usage per Container is 100Mi, but request is 50Mi"
            ]
        );
        let big =
            pod(json!([{"resources": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"cpu": "600m"}}}]));
        assert_eq!(
            pod_violations(&ranges, &big),
            [
                "maximum cpu usage per Container is 500m, but limit is 600m",
                "cpu max limit to request ratio per Container is 2, but provided ratio is 6.000000"
            ]
        );
        let bare = pod(json!([{"name": "c"}]));
        assert_eq!(
            pod_violations(&ranges, &bare),
            [
                "minimum cpu usage per Container is 50m.  No request is specified",
                "minimum memory usage per Container is 100Mi.  No request is specified",
                "maximum cpu usage per Container is 500m.  No limit is specified",
                "cpu max limit to request ratio per Container is 2, but no request is specified or request is 0"
            ]
        );
    }

    #[test]
    fn a_pod_adds_up_its_containers_or_takes_its_largest_init_container() {
        let p = json!({"spec": {
            "containers": [{"resources": {"requests": {"cpu": "100m"}}}, {"resources": {"requests": {"cpu": "200m"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"restartPolicy": "Always", "resources": {"requests": {"cpu": "50m"}}}]}});
        let total = pod_total(&p, "requests");
        assert_eq!((total["cpu"].to_string(), total["memory"].to_string()), ("500m".into(), "1Gi".into()));
        let ranges = range(json!([{"type": "Pod", "max": {"cpu": "400m"}}]));
        assert_eq!(pod_violations(&ranges, &p), ["maximum cpu usage per Pod is 400m.  No limit is specified"]);
    }

    #[test]
    fn claims_are_held_to_their_storage_bounds() {
        let ranges =
            range(json!([{"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}, "max": {"storage": "2Gi"}}]));
        let claim = |size: &str| json!({"spec": {"resources": {"requests": {"storage": size}}}});
        assert!(claim_violations(&ranges, &claim("1536Mi")).is_empty());
        assert_eq!(
            claim_violations(&ranges, &claim("512Mi")),
            ["minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 512Mi"]
        );
        assert_eq!(
            claim_violations(&ranges, &claim("3Gi")),
            ["maximum storage usage per PersistentVolumeClaim is 2Gi, but request is 3Gi"]
        );
    }
}
