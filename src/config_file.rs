//! The optional config file: TOML, one key per long flag (`memory = "4g"`, `max-steps = 30`).
//!
//! Precedence is flags > environment > file > built-in defaults. The file's values become the
//! flags' defaults before clap parses, so clap itself applies flags and environment on top.

use std::path::PathBuf;

use clap::Command;

use crate::config::UsageError;

/// `AGENTBOX_CONFIG` (empty: no file), else `$XDG_CONFIG_HOME/agentbox/config.toml`, else
/// `~/.config/agentbox/config.toml`.
pub fn path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("AGENTBOX_CONFIG") {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    let p = base.join("agentbox").join("config.toml");
    p.exists().then_some(p)
}

pub fn load() -> Result<Option<(PathBuf, toml::Table)>, UsageError> {
    let Some(path) = path() else { return Ok(None) };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| UsageError(format!("cannot read the config file {}: {e}", path.display())))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| UsageError(format!("config file {}: {e}", path.display())))?;
    Ok(Some((path, table)))
}

/// Every long flag of `cmd` and its subcommands, by id.
fn flag_ids(cmd: &Command, out: &mut Vec<String>) {
    for a in cmd.get_arguments() {
        if a.get_long().is_some() && !matches!(a.get_id().as_str(), "help" | "version") {
            out.push(a.get_id().to_string());
        }
    }
    for s in cmd.get_subcommands() {
        flag_ids(s, out);
    }
}

fn set_default(cmd: Command, id: &str, values: &[String]) -> Command {
    let mut cmd = if cmd.get_arguments().any(|a| a.get_id() == id) {
        let values = values.to_vec();
        cmd.mut_arg(id, move |a| a.default_values(values))
    } else {
        cmd
    };
    let names: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    for name in names {
        cmd = cmd.mut_subcommand(name, |s| set_default(s, id, values));
    }
    cmd
}

/// Flags that may be given several times (`--test-cmd`): the file may give them a list.
fn repeatable(cmd: &Command, id: &str) -> bool {
    cmd.get_arguments()
        .any(|a| a.get_id() == id && matches!(a.get_action(), clap::ArgAction::Append))
        || cmd.get_subcommands().any(|s| repeatable(s, id))
}

pub fn apply(mut cmd: Command, table: &toml::Table, path: &std::path::Path) -> Result<Command, UsageError> {
    let mut known = Vec::new();
    flag_ids(&cmd, &mut known);
    known.sort();
    known.dedup();
    for (key, value) in table {
        // `[network] allow = [...]`: the allowlist, as if given with --allow-host.
        if key == "network" {
            let Some(net) = value.as_table() else {
                return Err(UsageError(format!(
                    "config file {}: `network` must be a table ([network] allow = [\"HOST\"])",
                    path.display()
                )));
            };
            for (k, v) in net {
                let items = match (k.as_str(), v.as_array()) {
                    ("allow" | "ca_certs", Some(items)) if items.iter().all(|i| i.is_str()) => items
                        .iter()
                        .filter_map(|i| i.as_str().map(String::from))
                        .collect::<Vec<_>>(),
                    _ => {
                        return Err(UsageError(format!(
                            "config file {}: [network] takes `allow`, a list of host names, and \
                             `ca_certs`, a list of PEM files",
                            path.display()
                        )));
                    }
                };
                if k == "allow" {
                    cmd = set_default(cmd, "allow_host", &items);
                } else {
                    // A relative path is the config file's neighbour, wherever agentbox runs.
                    let base = path.parent().unwrap_or(std::path::Path::new("."));
                    let files: Vec<String> = items
                        .iter()
                        .map(|f| base.join(f).to_string_lossy().into_owned())
                        .collect();
                    cmd = set_default(cmd, "ca_cert", &files);
                }
            }
            continue;
        }
        let id = key.replace('-', "_");
        if !known.contains(&id) {
            let list: Vec<String> = known.iter().map(|k| k.replace('_', "-")).collect();
            return Err(UsageError(format!(
                "config file {}: unknown setting `{key}`; settings are the long flags: {}",
                path.display(),
                list.join(", ")
            )));
        }
        let texts = match value {
            toml::Value::String(s) => vec![s.clone()],
            toml::Value::Integer(i) => vec![i.to_string()],
            toml::Value::Float(f) => vec![f.to_string()],
            toml::Value::Boolean(b) => vec![b.to_string()],
            toml::Value::Array(items)
                if repeatable(&cmd, &id) && !items.is_empty() && items.iter().all(|v| v.is_str()) =>
            {
                items
                    .iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            }
            other => {
                return Err(UsageError(format!(
                    "config file {}: `{key}` must be a string, number or boolean{}, not {}",
                    path.display(),
                    if repeatable(&cmd, &id) {
                        ", or a list of strings"
                    } else {
                        ""
                    },
                    other.type_str()
                )));
            }
        };
        cmd = set_default(cmd, &id, &texts);
    }
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command as Sub};
    use clap::{CommandFactory, FromArgMatches};

    fn parse(file: &str, args: &[&str]) -> Result<Cli, String> {
        let table: toml::Table = file.parse().unwrap();
        let cmd =
            apply(Cli::command(), &table, std::path::Path::new("test.toml")).map_err(|e| e.to_string())?;
        let m = cmd.try_get_matches_from(args).map_err(|e| e.to_string())?;
        Cli::from_arg_matches(&m).map_err(|e| e.to_string())
    }

    #[test]
    fn the_file_fills_defaults_and_flags_win() {
        let file = "memory = \"4g\"\nmax-steps = 7\nno_shell = true\n";
        let Sub::Run(run) = parse(file, &["agentbox", "run", "p"]).unwrap().command else {
            panic!()
        };
        assert_eq!(
            (
                run.agent.sandbox.memory.as_str(),
                run.agent.max_steps,
                run.agent.no_shell
            ),
            ("4g", 7, true)
        );
        let Sub::Run(run) = parse(file, &["agentbox", "run", "--max-steps", "9", "p"])
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(run.agent.max_steps, 9);
        let Sub::Exec(exec) = parse(file, &["agentbox", "exec", "p", "--", "true"])
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(exec.sandbox.memory, "4g", "shared flags apply to every command");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let err = parse("colour = \"red\"", &["agentbox", "run", "p"])
            .err()
            .unwrap();
        assert!(
            err.contains("unknown setting `colour`") && err.contains("max-steps"),
            "{err}"
        );
        let err = parse("max-steps = \"lots\"", &["agentbox", "run", "p"])
            .err()
            .unwrap();
        assert!(err.contains("lots"), "{err}");
        assert!(parse("memory = [1]", &["agentbox", "run", "p"]).is_err());
        assert!(parse("memory = [\"1g\"]", &["agentbox", "run", "p"]).is_err());
    }

    #[test]
    fn the_network_table_is_the_allowlist_and_setup_a_list() {
        let file =
            "setup = [\"make deps\"]\n[network]\nallow = [\"registry.example\", \"*.cdn.example:8443\"]\n";
        let Sub::Run(run) = parse(file, &["agentbox", "run", "p"]).unwrap().command else {
            panic!()
        };
        assert_eq!(
            run.agent.setup.allow_host,
            ["registry.example", "*.cdn.example:8443"]
        );
        assert_eq!(run.agent.setup.setup, ["make deps"]);
        assert!(parse("[network]\ndeny = [\"x\"]", &["agentbox", "run", "p"]).is_err());
        let Sub::Run(run) = parse(
            "[network]\nca_certs = [\"corp.pem\", \"/abs/other.pem\"]\n",
            &["agentbox", "run", "--ca-cert", "given.pem", "p"],
        )
        .unwrap()
        .command
        else {
            panic!()
        };
        assert_eq!(
            run.agent.setup.trust.ca_cert,
            [std::path::PathBuf::from("given.pem")],
            "a flag replaces the file's list, as for every list"
        );
        let Sub::Run(run) = parse(
            "[network]\nca_certs = [\"corp.pem\", \"/abs/other.pem\"]\n",
            &["agentbox", "run", "p"],
        )
        .unwrap()
        .command
        else {
            panic!()
        };
        assert_eq!(
            run.agent.setup.trust.ca_cert,
            [std::path::PathBuf::from("corp.pem"), "/abs/other.pem".into()],
            "relative to the config file's directory (here: none)"
        );
        let Sub::Doctor(doctor) = parse("[network]\nca_certs = [\"corp.pem\"]\n", &["agentbox", "doctor"])
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(doctor.trust.ca_cert, [std::path::PathBuf::from("corp.pem")]);
        assert!(parse("[network]\nca_certs = \"corp.pem\"", &["agentbox", "run", "p"]).is_err());
        assert!(parse("network = \"x\"", &["agentbox", "run", "p"]).is_err());
    }

    #[test]
    fn test_commands_may_be_a_list_and_the_image_is_given_or_not() {
        let Sub::Run(run) = parse(
            "test-cmd = [\"cargo test\", \"make check\"]",
            &["agentbox", "run", "p"],
        )
        .unwrap()
        .command
        else {
            panic!()
        };
        assert_eq!(run.agent.test_cmd, ["cargo test", "make check"]);
        assert_eq!(
            run.agent.sandbox.image, None,
            "not given: chosen from the project"
        );
        let Sub::Run(run) = parse(
            "image = \"x:1\"",
            &["agentbox", "run", "--test-cmd", "a", "--test-cmd", "b", "p"],
        )
        .unwrap()
        .command
        else {
            panic!()
        };
        assert_eq!(run.agent.test_cmd, ["a", "b"]);
        assert_eq!(run.agent.sandbox.image.as_deref(), Some("x:1"));
    }
}
