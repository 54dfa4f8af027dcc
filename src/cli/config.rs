//! The config file (`--config`, else `FERROK_CONFIG_FILE`, default
//! /etc/ferrok/config.yaml): a YAML map whose keys are long flag names. Its entries go before the command
//! line's flags, so flags given on the command line win.
//!
//! `server` and `agent` take every key. `etcd-snapshot` takes the keys it
//! shares with the server (where the data dir, the snapshots and the
//! datastore are), as k3s' does, and ignores the others: the file is the
//! server's.

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

/// The server's keys `etcd-snapshot` takes (all its subcommands').
const ETCD_SNAPSHOT_KEYS: &[&str] = &[
    "data-dir",
    "etcd-snapshot-dir",
    "node-name",
    "datastore-endpoint",
    "datastore-cafile",
    "datastore-certfile",
    "datastore-keyfile",
];
/// The server's keys `etcd-snapshot prune` takes too.
const ETCD_SNAPSHOT_PRUNE_KEYS: &[&str] = &["etcd-snapshot-retention"];

/// Why the config file cannot be read into flags.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("--config: cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("--config: {path}: {source}")]
    Parse { path: PathBuf, source: serde_yaml_ng::Error },
    #[error("--config: {0}: expected a map of flag names to values")]
    NotAMap(PathBuf),
    #[error("--config: {0}: keys must be flag names")]
    NotAFlagName(PathBuf),
    #[error("--config: {path}: {key}: list items must be scalars")]
    NotAScalarItem { path: PathBuf, key: String },
    #[error("--config: {path}: {key}: expected a scalar or a list")]
    NotAScalar { path: PathBuf, key: String },
}

/// The command line with the config file's flags inserted after the
/// subcommand, for `server`, `agent` and `etcd-snapshot` (the keys of
/// `prune` after `prune`).
pub fn with_config_file(args: Vec<OsString>) -> Result<Vec<OsString>, ConfigFileError> {
    let Some(sub) = args.get(1).map(|s| s.to_string_lossy().into_owned()) else {
        return Ok(args);
    };
    let (keys, sub_keys): (Option<&[&str]>, &[&str]) = match sub.as_str() {
        "server" | "agent" => (None, &[]),
        "etcd-snapshot" => (Some(ETCD_SNAPSHOT_KEYS), ETCD_SNAPSHOT_PRUNE_KEYS),
        _ => return Ok(args),
    };
    // Where `prune`'s own flags go: right after it.
    let prune_at = if sub_keys.is_empty() { None } else { args.iter().skip(2).position(|a| a == "prune") };
    let (path, explicit) = config_path(&args);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(args),
        Err(source) => return Err(ConfigFileError::Read { path, source }),
    };
    let doc: serde_yaml_ng::Value = match serde_yaml_ng::from_str(&text) {
        Ok(doc) => doc,
        Err(source) => return Err(ConfigFileError::Parse { path, source }),
    };
    let map = match doc {
        serde_yaml_ng::Value::Mapping(m) => m,
        serde_yaml_ng::Value::Null => return Ok(args),
        _ => return Err(ConfigFileError::NotAMap(path)),
    };
    let (mut extra, mut sub_extra) = (Vec::new(), Vec::new());
    for (k, v) in map {
        let key = scalar(&k).ok_or_else(|| ConfigFileError::NotAFlagName(path.clone()))?;
        if key == "config" {
            continue;
        }
        let for_sub = prune_at.is_some() && sub_keys.contains(&key.as_str());
        if !(for_sub || keys.is_none_or(|k| k.contains(&key.as_str()))) {
            continue;
        }
        let extra = if for_sub { &mut sub_extra } else { &mut extra };
        let flag = format!("--{key}");
        match &v {
            serde_yaml_ng::Value::Sequence(items) => {
                for item in items {
                    let s = scalar(item)
                        .ok_or_else(|| ConfigFileError::NotAScalarItem { path: path.clone(), key: key.clone() })?;
                    extra.push(OsString::from(format!("{flag}={s}")));
                }
            }
            serde_yaml_ng::Value::Bool(true) => extra.push(OsString::from(flag)),
            serde_yaml_ng::Value::Bool(false) => {}
            other => {
                let s = scalar(other)
                    .ok_or_else(|| ConfigFileError::NotAScalar { path: path.clone(), key: key.clone() })?;
                extra.push(OsString::from(format!("{flag}={s}")));
            }
        }
    }
    let mut out = Vec::with_capacity(args.len() + extra.len() + sub_extra.len());
    out.extend(args[..2].iter().cloned());
    out.extend(extra);
    match prune_at {
        Some(i) => {
            out.extend(args[2..=2 + i].iter().cloned());
            out.extend(sub_extra);
            out.extend(args[3 + i..].iter().cloned());
        }
        None => out.extend(args[2..].iter().cloned()),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(file: &str, args: &[&str]) -> Result<Vec<String>, ConfigFileError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, file).unwrap();
        let mut argv: Vec<OsString> = args.iter().map(OsString::from).collect();
        argv.push(OsString::from(format!("--config={}", path.display())));
        let out = with_config_file(argv)?;
        Ok(out.into_iter().map(|a| a.to_string_lossy().into_owned()).filter(|a| !a.starts_with("--config=")).collect())
    }

    #[test]
    fn etcd_snapshot_takes_the_keys_it_shares_with_the_server() {
        let file =
            "data-dir: /d\netcd-snapshot-dir: /s\ntoken: secret\ndisable: [coredns]\netcd-snapshot-retention: 3\n";
        assert_eq!(
            run(file, &["ferrok", "etcd-snapshot", "save"]).unwrap(),
            ["ferrok", "etcd-snapshot", "--data-dir=/d", "--etcd-snapshot-dir=/s", "save"]
        );
        assert_eq!(
            run(file, &["ferrok", "etcd-snapshot", "prune", "--name", "x"]).unwrap(),
            [
                "ferrok",
                "etcd-snapshot",
                "--data-dir=/d",
                "--etcd-snapshot-dir=/s",
                "prune",
                "--etcd-snapshot-retention=3",
                "--name",
                "x"
            ]
        );
        let server = run(file, &["ferrok", "server"]).unwrap();
        assert!(server.contains(&"--token=secret".to_string()) && server.contains(&"--disable=coredns".to_string()));
        // Other commands read no config file.
        assert_eq!(run(file, &["ferrok", "token", "list"]).unwrap(), ["ferrok", "token", "list"]);
        let err = run("data-dir: [", &["ferrok", "etcd-snapshot", "ls"]).unwrap_err().to_string();
        assert!(err.starts_with("--config: ") && err.contains("config.yaml"), "{err}");
    }
}
