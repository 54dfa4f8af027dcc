//! The pods of a Job, as upstream's job controller makes them: the
//! controller-uid and job-name labels, and for Indexed Jobs the completion
//! index as annotation, label, hostname and `JOB_COMPLETION_INDEX`; plus the
//! `completedIndexes` interval notation ("0-2,5").

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};

use super::controller_utils::{controller_ref, pod_from_template};

pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
pub const LEGACY_CONTROLLER_UID_LABEL: &str = "controller-uid";
pub const LEGACY_JOB_NAME_LABEL: &str = "job-name";
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";

pub fn is_indexed(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.completion_mode.as_deref()) == Some("Indexed")
}

/// The completion index of an Indexed Job's pod.
pub fn index_of(pod: &Pod) -> Option<i32> {
    let from = |m: Option<&BTreeMap<String, String>>| m?.get(COMPLETION_INDEX)?.parse::<i32>().ok();
    from(pod.metadata.annotations.as_ref()).or_else(|| from(pod.metadata.labels.as_ref())).filter(|i| *i >= 0)
}

/// A new pod for `job`, with `index` when the Job is Indexed.
pub fn new_pod(job: &Job, index: Option<i32>) -> Pod {
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let template = job.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let mut pod = pod_from_template(&template, &ns, controller_ref(job));
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in [
        (CONTROLLER_UID_LABEL, &uid),
        (JOB_NAME_LABEL, &name),
        (LEGACY_CONTROLLER_UID_LABEL, &uid),
        (LEGACY_JOB_NAME_LABEL, &name),
    ] {
        labels.entry(k.to_string()).or_insert_with(|| v.clone());
    }
    match index {
        None => pod.metadata.generate_name = Some(format!("{name}-")),
        Some(i) => {
            pod.metadata.generate_name = Some(format!("{name}-{i}-"));
            labels.insert(COMPLETION_INDEX.into(), i.to_string());
            pod.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(COMPLETION_INDEX.into(), i.to_string());
            if let Some(spec) = pod.spec.as_mut() {
                spec.hostname = Some(format!("{name}-{i}"));
                let env = EnvVar {
                    name: COMPLETION_INDEX_ENV.into(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            api_version: Some("v1".into()),
                            field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                        }),
                        ..Default::default()
                    }),
                };
                let containers = spec.init_containers.iter_mut().flatten().chain(spec.containers.iter_mut());
                for c in containers {
                    let vars = c.env.get_or_insert_with(Vec::new);
                    if !vars.iter().any(|e| e.name == COMPLETION_INDEX_ENV) {
                        vars.push(env.clone());
                    }
                }
            }
        }
    }
    pod
}

/// Parses "1,3-5" into its indexes.
pub fn parse_intervals(s: &str) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    out.extend(a..=b);
                }
            }
            None => {
                if let Ok(i) = part.parse() {
                    out.insert(i);
                }
            }
        }
    }
    out
}

/// Formats indexes as upstream's completedIndexes: "0-2,5".
pub fn format_intervals(indexes: &BTreeSet<i32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut iter = indexes.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        parts.push(if end == start { start.to_string() } else { format!("{start}-{end}") });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_round_trip() {
        let set = parse_intervals("0-2,5,7-8");
        assert_eq!(set.iter().copied().collect::<Vec<_>>(), [0, 1, 2, 5, 7, 8]);
        assert_eq!(format_intervals(&set), "0-2,5,7-8");
        assert_eq!(format_intervals(&BTreeSet::new()), "");
        assert_eq!(format_intervals(&parse_intervals("3")), "3");
    }
}
