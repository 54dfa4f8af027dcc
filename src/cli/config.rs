//! The config file (`--config`, else `FERROK_CONFIG_FILE`, default
//! /etc/ferrok/config.yaml): a YAML map whose keys are long flag names. Its entries go before the command
//! line's flags, so flags given on the command line win.

use std::ffi::OsString;
use std::path::PathBuf;

const DEFAULT: &str = "/etc/ferrok/config.yaml";
/// The environment variable naming the config file (the installer's).
const CONFIG_ENV: &str = "FERROK_CONFIG_FILE";

fn config_path(args: &[OsString]) -> (PathBuf, bool) {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--config" {
            if let Some(v) = it.next() {
                return (PathBuf::from(v), true);
            }
        } else if let Some(v) = s.strip_prefix("--config=") {
            return (PathBuf::from(v), true);
        }
    }
    match std::env::var_os(CONFIG_ENV) {
        // Named by the environment (the service's env file): may not exist yet.
        Some(v) if !v.is_empty() => (PathBuf::from(v), false),
        _ => (PathBuf::from(DEFAULT), false),
    }
}

fn scalar(v: &serde_yaml_ng::Value) -> Option<String> {
    match v {
        serde_yaml_ng::Value::String(s) => Some(s.clone()),
        serde_yaml_ng::Value::Bool(b) => Some(b.to_string()),
        serde_yaml_ng::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The command line with the config file's flags inserted after the
/// subcommand, for `server` and `agent`.
pub fn with_config_file(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let Some(sub) = args.get(1).map(|s| s.to_string_lossy().into_owned()) else {
        return Ok(args);
    };
    if sub != "server" && sub != "agent" {
        return Ok(args);
    }
    let (path, explicit) = config_path(&args);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(args),
        Err(e) => return Err(format!("--config: cannot read {}: {e}", path.display())),
    };
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("--config: {}: {e}", path.display()))?;
    let map = match doc {
        serde_yaml_ng::Value::Mapping(m) => m,
        serde_yaml_ng::Value::Null => return Ok(args),
        _ => return Err(format!("--config: {}: expected a map of flag names to values", path.display())),
    };
    let mut extra = Vec::new();
    for (k, v) in map {
        let key = scalar(&k).ok_or_else(|| format!("--config: {}: keys must be flag names", path.display()))?;
        if key == "config" {
            continue;
        }
        let flag = format!("--{key}");
        match &v {
            serde_yaml_ng::Value::Sequence(items) => {
                for item in items {
                    let s = scalar(item)
                        .ok_or_else(|| format!("--config: {}: {key}: list items must be scalars", path.display()))?;
                    extra.push(OsString::from(format!("{flag}={s}")));
                }
            }
            serde_yaml_ng::Value::Bool(true) => extra.push(OsString::from(flag)),
            serde_yaml_ng::Value::Bool(false) => {}
            other => {
                let s = scalar(other)
                    .ok_or_else(|| format!("--config: {}: {key}: expected a scalar or a list", path.display()))?;
                extra.push(OsString::from(format!("{flag}={s}")));
            }
        }
    }
    let mut out = Vec::with_capacity(args.len() + extra.len());
    out.extend(args[..2].iter().cloned());
    out.extend(extra);
    out.extend(args[2..].iter().cloned());
    Ok(out)
}
