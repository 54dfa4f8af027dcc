//! The reference of `ferrok server`'s and `ferrok agent`'s flags, made
//! from their clap definitions: a Markdown table for the README and the
//! example config file `packaging/config.yaml` (its keys are the long flag
//! names, as the config file takes them). Tests below keep both files in
//! step with the flags; `FERROK_BLESS=1 cargo test --lib config_reference`
//! writes them anew after a flag changes.

use clap::{ArgAction, Command, CommandFactory};

/// The commands whose flags the config file can hold.
const COMMANDS: [&str; 2] = ["server", "agent"];

/// One flag of a command, as the reference shows it.
struct Flag {
    long: String,
    value: Option<String>,
    defaults: Vec<String>,
    env: Option<String>,
    help: String,
    repeated: bool,
}

fn subcommand(name: &'static str) -> Command {
    let mut cli = super::Cli::command();
    cli.build();
    cli.find_subcommand(name).cloned().unwrap_or_else(|| Command::new(name))
}

fn flags(cmd: &Command) -> Vec<Flag> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional() && !a.is_global_set())
        .filter_map(|a| {
            let long = a.get_long()?.to_string();
            if matches!(long.as_str(), "help" | "version" | "config") {
                return None;
            }
            let takes_value = matches!(a.get_action(), ArgAction::Set | ArgAction::Append);
            let value = takes_value.then(|| {
                a.get_value_names()
                    .and_then(|v| v.first())
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| long.to_uppercase().replace('-', "_"))
            });
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            Some(Flag {
                long,
                value,
                defaults: a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect(),
                env: a.get_env().map(|e| e.to_string_lossy().into_owned()),
                help: help.split_whitespace().collect::<Vec<_>>().join(" "),
                repeated: matches!(a.get_action(), ArgAction::Append),
            })
        })
        .collect()
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The README's reference: a table per command.
pub fn markdown() -> String {
    let mut out = String::new();
    for name in COMMANDS {
        let cmd = subcommand(name);
        out += &format!("### `ferrok {name}`\n\n| flag | default | |\n|---|---|---|\n");
        for f in flags(&cmd) {
            let flag = match &f.value {
                Some(v) => format!("`--{} {v}`", f.long),
                None => format!("`--{}`", f.long),
            };
            let default = match (&f.value, f.defaults.is_empty()) {
                (Some(_), false) => format!("`{}`", f.defaults.join(",")),
                _ => String::new(),
            };
            let mut help = f.help.clone();
            if f.repeated && !help.contains("repeatable") {
                help += " (repeatable)";
            }
            if let Some(env) = &f.env {
                help += &format!(" (env `{env}`)");
            }
            out += &format!("| {} | {} | {} |\n", cell(&flag), cell(&default), cell(&help));
        }
        out.push('\n');
    }
    out
}

/// `packaging/config.yaml`: every flag of the server and the agent, commented
/// out, with its help and default.
pub fn example_config() -> String {
    let mut out = String::from(
        "# ferrok's config file: /etc/ferrok/config.yaml (or --config FILE).\n\
         # Keys are the long flag names of `ferrok server` or `ferrok agent`;\n\
         # a list gives a repeatable flag several times; flags on the command\n\
         # line win over this file. Every key is shown here commented out, with\n\
         # its default where it has one. Generated from the flags\n\
         # (src/cli/config_reference.rs).\n",
    );
    let mut seen = std::collections::BTreeSet::new();
    for name in COMMANDS {
        let cmd = subcommand(name);
        let fresh: Vec<Flag> = flags(&cmd).into_iter().filter(|f| !seen.contains(&f.long)).collect();
        if fresh.is_empty() {
            continue;
        }
        let title = if name == "server" { "server (and the node role it runs)" } else { "agent only" };
        out += &format!("\n# --- {title} ---\n");
        for f in fresh {
            out += &format!("\n# {}\n", f.help);
            if let Some(env) = &f.env {
                out += &format!("# (also the environment variable {env})\n");
            }
            let example = match (&f.value, f.defaults.first()) {
                (None, _) => "true".to_string(),
                (Some(_), Some(d)) if f.repeated => format!("[{d}]"),
                (Some(_), Some(d)) => yaml_scalar(d),
                (Some(v), None) if f.repeated => format!("[{v}]"),
                (Some(v), None) => v.clone(),
            };
            out += &format!("#{}: {example}\n", f.long);
            seen.insert(f.long);
        }
    }
    out
}

/// A default as YAML writes it: quoted when YAML would read it otherwise.
fn yaml_scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:,".contains(c))
        && !matches!(s, "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "~")
        && !s.starts_with(['-', ':']);
    if plain {
        s.to_string()
    } else {
        format!("{s:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    const BEGIN: &str = "<!-- config-reference:begin (generated from the flags: src/cli/config_reference.rs) -->\n";
    const END: &str = "<!-- config-reference:end -->";

    fn root() -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    fn bless() -> bool {
        std::env::var_os("FERROK_BLESS").is_some()
    }

    #[test]
    fn the_readme_reference_is_the_flags() {
        let path = root().join("README.md");
        let readme = std::fs::read_to_string(&path).expect("README.md");
        let (head, rest) = readme.split_once(BEGIN).expect("the README has the config-reference markers");
        let (current, tail) = rest.split_once(END).expect("the README has the config-reference end marker");
        let wanted = markdown();
        if bless() {
            std::fs::write(&path, format!("{head}{BEGIN}{wanted}{END}{tail}")).expect("write README.md");
            return;
        }
        assert!(
            current == wanted,
            "README.md's config reference differs from the flags; run FERROK_BLESS=1 cargo test --lib config_reference"
        );
    }

    #[test]
    fn the_example_config_is_the_flags() {
        let path = root().join("packaging").join("config.yaml");
        let wanted = example_config();
        if bless() {
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir packaging");
            std::fs::write(&path, &wanted).expect("write packaging/config.yaml");
            return;
        }
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            current == wanted,
            "packaging/config.yaml differs from the flags; run FERROK_BLESS=1 cargo test --lib config_reference"
        );
    }

    /// The example's keys that show a default, uncommented, load through
    /// the config file and parse as `ferrok server`'s flags.
    #[test]
    fn the_example_config_with_its_defaults_loads() {
        let server: std::collections::BTreeSet<String> =
            flags(&subcommand("server")).into_iter().filter(|f| !f.defaults.is_empty()).map(|f| f.long).collect();
        let example = example_config();
        let uncommented: Vec<&str> = example
            .lines()
            .filter_map(|l| l.strip_prefix('#'))
            .filter(|l| l.split_once(": ").is_some_and(|(k, _)| server.contains(k)))
            .collect();
        assert!(uncommented.len() > 10, "{uncommented:?}");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, uncommented.join("\n")).expect("write");
        let args: Vec<std::ffi::OsString> =
            ["ferrok", "server", "--config", &file.to_string_lossy()].iter().map(Into::into).collect();
        let args = crate::cli::config::with_config_file(args).expect("the config file loads");
        assert!(args.len() > uncommented.len(), "{args:?}");
        if let Err(e) = super::super::Cli::try_parse_from(args) {
            panic!("{e}");
        }
    }

    #[test]
    fn defaults_are_quoted_when_yaml_would_misread_them() {
        assert_eq!(yaml_scalar("10.42.0.0/16"), "10.42.0.0/16");
        assert_eq!(yaml_scalar("0 */12 * * *"), "\"0 */12 * * *\"");
        assert_eq!(yaml_scalar("true"), "\"true\"");
        assert_eq!(yaml_scalar(""), "\"\"");
    }
}
