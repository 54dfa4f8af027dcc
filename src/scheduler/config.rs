//! KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1), the file
//! `--kube-scheduler-arg config=FILE` names: one profile per schedulerName,
//! each the default plugin set with plugins disabled or enabled (and
//! weighted) per extension point, NodeResourcesFit's scoring strategy, and
//! percentageOfNodesToScore.

use serde::Deserialize;

use super::plugins::{self, node_resources_fit::ScoringStrategy};
use super::profile::Profile;
use super::DEFAULT_SCHEDULER_NAME;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Parse(String),
    #[error("{0}")]
    Invalid(String),
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Configuration {
    api_version: Option<String>,
    kind: Option<String>,
    percentage_of_nodes_to_score: Option<u32>,
    #[serde(default)]
    profiles: Vec<ProfileConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ProfileConfig {
    scheduler_name: Option<String>,
    percentage_of_nodes_to_score: Option<u32>,
    #[serde(default)]
    plugins: Plugins,
    #[serde(default)]
    plugin_config: Vec<PluginConfig>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Plugins {
    #[serde(default)]
    multi_point: PluginSet,
    #[serde(default)]
    filter: PluginSet,
    #[serde(default)]
    score: PluginSet,
    #[serde(default)]
    post_filter: PluginSet,
}

#[derive(Deserialize, Default)]
struct PluginSet {
    #[serde(default)]
    enabled: Vec<PluginRef>,
    #[serde(default)]
    disabled: Vec<PluginRef>,
}

#[derive(Deserialize)]
struct PluginRef {
    name: String,
    weight: Option<i64>,
}

#[derive(Deserialize)]
struct PluginConfig {
    name: String,
    #[serde(default)]
    args: serde_json::Value,
}

impl PluginSet {
    fn disables(&self, name: &str) -> bool {
        self.disabled.iter().any(|d| d.name == "*" || d.name == name)
    }
}

/// Reads a KubeSchedulerConfiguration; the default profile is kept unless
/// the file lists `default-scheduler` itself.
pub fn profiles_from(text: &str) -> Result<Vec<Profile>, ConfigError> {
    let config: Configuration = serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
    if config.kind.as_deref().is_some_and(|k| k != "KubeSchedulerConfiguration") {
        return Err(ConfigError::Invalid(format!("kind {:?} is not KubeSchedulerConfiguration", config.kind)));
    }
    if let Some(v) = config.api_version.as_deref().filter(|v| *v != "kubescheduler.config.k8s.io/v1") {
        return Err(ConfigError::Invalid(format!("apiVersion {v:?} is not kubescheduler.config.k8s.io/v1")));
    }
    let mut profiles = Vec::new();
    for p in &config.profiles {
        let name = p.scheduler_name.clone().unwrap_or_else(|| DEFAULT_SCHEDULER_NAME.to_string());
        if profiles.iter().any(|x: &Profile| x.scheduler_name == name) {
            return Err(ConfigError::Invalid(format!("profiles: duplicate schedulerName {name:?}")));
        }
        profiles.push(profile(p, &name, config.percentage_of_nodes_to_score)?);
    }
    if !profiles.iter().any(|p| p.scheduler_name == DEFAULT_SCHEDULER_NAME) {
        let mut default = Profile::new(DEFAULT_SCHEDULER_NAME, ScoringStrategy::LeastAllocated);
        default.percentage_of_nodes_to_score = config.percentage_of_nodes_to_score;
        profiles.insert(0, default);
    }
    Ok(profiles)
}

fn profile(p: &ProfileConfig, name: &str, global_percentage: Option<u32>) -> Result<Profile, ConfigError> {
    let mut strategy = ScoringStrategy::LeastAllocated;
    for c in &p.plugin_config {
        if c.name == "NodeResourcesFit" {
            match c.args.pointer("/scoringStrategy/type").and_then(|t| t.as_str()) {
                None | Some("LeastAllocated") => {}
                Some("MostAllocated") => strategy = ScoringStrategy::MostAllocated,
                Some(other) => {
                    return Err(ConfigError::Invalid(format!(
                        "profile {name}: NodeResourcesFit scoringStrategy.type {other:?} is not supported \
                         (LeastAllocated, MostAllocated)"
                    )))
                }
            }
        }
    }
    let mut out = Profile::new(name, strategy);
    out.percentage_of_nodes_to_score = p.percentage_of_nodes_to_score.or(global_percentage);
    let plugins = &p.plugins;
    out.filters.retain(|f| !plugins.multi_point.disables(f.name()) && !plugins.filter.disables(f.name()));
    out.scores.retain(|(s, _)| !plugins.multi_point.disables(s.name()) && !plugins.score.disables(s.name()));
    if plugins.post_filter.disables("DefaultPreemption") || plugins.multi_point.disables("DefaultPreemption") {
        out.preemption = false;
    }
    for e in plugins.multi_point.enabled.iter().chain(&plugins.filter.enabled) {
        if e.name == "DefaultPreemption" {
            out.preemption = true;
            continue;
        }
        match plugins::filter_plugin(&e.name, strategy) {
            Some(f) if !out.filters.iter().any(|x| x.name() == f.name()) => out.filters.push(f),
            Some(_) => {}
            None if plugins.filter.enabled.iter().any(|x| x.name == e.name) => {
                return Err(ConfigError::Invalid(format!("profile {name}: unknown filter plugin {:?}", e.name)))
            }
            None => {}
        }
    }
    for e in plugins.multi_point.enabled.iter().chain(&plugins.score.enabled) {
        let Some(s) = plugins::score_plugin(&e.name, strategy) else {
            if plugins.score.enabled.iter().any(|x| x.name == e.name) {
                return Err(ConfigError::Invalid(format!("profile {name}: unknown score plugin {:?}", e.name)));
            }
            continue;
        };
        let weight = e.weight.unwrap_or(1);
        match out.scores.iter_mut().find(|(x, _)| x.name() == s.name()) {
            Some(existing) => existing.1 = e.weight.unwrap_or(existing.1),
            None => out.scores.push((s, weight)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_by_scheduler_name() {
        let text = r#"
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: bin-packing
  plugins:
    score:
      disabled: [{name: NodeResourcesBalancedAllocation}]
      enabled: [{name: NodeResourcesFit, weight: 5}]
  pluginConfig:
  - name: NodeResourcesFit
    args: {scoringStrategy: {type: MostAllocated}}
- schedulerName: no-taints
  plugins:
    filter:
      disabled: [{name: TaintToleration}]
    postFilter:
      disabled: [{name: DefaultPreemption}]
"#;
        let profiles = profiles_from(text).unwrap();
        let names: Vec<&str> = profiles.iter().map(|p| p.scheduler_name.as_str()).collect();
        assert_eq!(names, ["default-scheduler", "bin-packing", "no-taints"]);
        let packing = &profiles[1];
        assert!(!packing.scores.iter().any(|(s, _)| s.name() == "NodeResourcesBalancedAllocation"));
        assert_eq!(packing.scores.iter().find(|(s, _)| s.name() == "NodeResourcesFit").map(|x| x.1), Some(5));
        assert!(!profiles[2].filters.iter().any(|f| f.name() == "TaintToleration"));
        assert!(!profiles[2].preemption);
        assert!(profiles_from("kind: Other").is_err());
        assert!(profiles_from("profiles: [{schedulerName: a}, {schedulerName: a}]").is_err());
    }
}
