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
        // `[services.NAME]`: each defined service starts, as if given with --service NAME
        // (see `services` for the tables themselves).
        if key == "services" {
            let names: Vec<String> = value
                .as_table()
                .map(|t| t.keys().cloned().collect())
                .unwrap_or_default();
            cmd = set_default(cmd, "service", &names);
            continue;
        }
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

/// The keys of a `[services.NAME]` table.
const SERVICE_KEYS: &str = "image, port, user, command, memory, env, sandbox-env";

/// The `[services.NAME]` tables: a server agentbox knows (NAME postgres, redis, mariadb or
/// mysql) with what the table changes, or any image. `image` on a known name starts that image
/// its own way (its entrypoint, unless `command` is given), keeping the port and the connection
/// variables.
pub fn services(
    table: &toml::Table,
    path: &std::path::Path,
) -> Result<Vec<crate::sandbox::services::ServiceSpec>, UsageError> {
    use crate::sandbox::services::{ServiceKind, ServiceSpec};
    let Some(value) = table.get("services") else {
        return Ok(Vec::new());
    };
    let bad = |what: String| UsageError(format!("config file {}: {what}", path.display()));
    let services = value.as_table().ok_or_else(|| {
        bad("`services` must be a table of tables ([services.NAME] image = \"IMAGE\")".into())
    })?;
    let strings = |key: &str, v: &toml::Value| -> Result<Vec<(String, String)>, UsageError> {
        let t = v
            .as_table()
            .ok_or_else(|| bad(format!("`{key}` must be a table of strings")))?;
        t.iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|v| (k.clone(), v.to_string()))
                    .ok_or_else(|| bad(format!("`{key}.{k}` must be a string")))
            })
            .collect()
    };
    let mut out = Vec::new();
    for (name, def) in services {
        let def = def
            .as_table()
            .ok_or_else(|| bad(format!("[services.{name}] must be a table ({SERVICE_KEYS})")))?;
        let kind = ServiceKind::by_name(name);
        let image = match def.get("image") {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .filter(|i| !i.trim().is_empty())
                    .ok_or_else(|| bad(format!("[services.{name}] image must be a non-empty string")))?,
            ),
        };
        let mut spec = match (kind, image) {
            (Some(kind), None) => ServiceSpec::known(kind, name),
            (Some(kind), Some(image)) => ServiceSpec::known_on(kind, name, image),
            (None, Some(image)) => ServiceSpec::image(name, image),
            (None, None) => {
                return Err(bad(format!(
                    "[services.{name}] needs an image: {name} is not a service agentbox knows \
                     (postgres, redis, mariadb, mysql)"
                )));
            }
        };
        for (key, v) in def {
            match key.as_str() {
                "image" => {}
                "port" => {
                    spec.port = Some(
                        v.as_integer()
                            .and_then(|p| u16::try_from(p).ok())
                            .filter(|p| *p > 0)
                            .ok_or_else(|| bad(format!("[services.{name}] port must be 1 to 65535")))?,
                    );
                }
                "user" => {
                    let user = v
                        .as_str()
                        .ok_or_else(|| bad(format!("[services.{name}] user must be a string")))?;
                    if crate::sandbox::services::is_root(user) {
                        return Err(bad(format!(
                            "[services.{name}] user {user:?}: a service never runs as root"
                        )));
                    }
                    spec.user = Some(user.to_string());
                }
                "command" => {
                    let argv: Option<Vec<String>> = v
                        .as_array()
                        .and_then(|a| a.iter().map(|i| i.as_str().map(String::from)).collect());
                    spec.command = Some(argv.filter(|a| !a.is_empty()).ok_or_else(|| {
                        bad(format!(
                            "[services.{name}] command must be a non-empty list of strings"
                        ))
                    })?);
                }
                "memory" => {
                    let text = v.as_str().ok_or_else(|| {
                        bad(format!("[services.{name}] memory must be a size such as \"1g\""))
                    })?;
                    spec.memory_bytes = crate::sandbox::parse_size(text)
                        .map_err(|e| bad(format!("[services.{name}] memory: {e}")))?;
                    if spec.memory_bytes < crate::sandbox::MIN_MEMORY {
                        return Err(bad(format!(
                            "[services.{name}] memory: at least {}m",
                            crate::sandbox::MIN_MEMORY >> 20
                        )));
                    }
                }
                "env" => spec.env = strings(&format!("services.{name}.env"), v)?,
                "sandbox-env" => spec.sandbox_env = strings(&format!("services.{name}.sandbox-env"), v)?,
                other => {
                    return Err(bad(format!(
                        "[services.{name}] has no setting `{other}`; its settings: {SERVICE_KEYS}"
                    )));
                }
            }
        }
        out.push(spec);
    }
    crate::sandbox::services::check_services(&out).map_err(|e| bad(e.to_string()))?;
    Ok(out)
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

    /// `[services.NAME]` tables and `--service` together, as `SandboxConfig` resolves them.
    fn services_of(file: &str, args: &[&str]) -> Result<Vec<crate::sandbox::services::ServiceSpec>, String> {
        let table: toml::Table = file.parse().unwrap();
        let defined = services(&table, std::path::Path::new("test.toml")).map_err(|e| e.to_string())?;
        let Sub::Exec(mut exec) = parse(file, args)?.command else {
            panic!()
        };
        exec.sandbox.service_definitions = defined;
        crate::config::SandboxConfig::from_args(&exec.sandbox)
            .map(|c| c.services)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn services_come_from_the_file_and_flags_and_unknown_ones_are_refused() {
        use crate::sandbox::services::ServiceKind;
        let file = "[services.postgres]\nmemory = \"1g\"\n\n[services.search]\nimage = \"example/search:2\"\nport = 9200\nenv = { MODE = \"single\" }\nsandbox-env = { SEARCH_URL = \"http://127.0.0.1:9200\" }\n";
        // The file's services start unless --service names others.
        let all = services_of(file, &["agentbox", "exec", "p", "--", "true"]).unwrap();
        assert_eq!(all.len(), 2);
        let pg = all.iter().find(|s| s.name == "postgres").unwrap();
        assert_eq!((pg.kind, pg.memory_bytes), (Some(ServiceKind::Postgres), 1 << 30));
        let search = all.iter().find(|s| s.name == "search").unwrap();
        assert_eq!((search.kind, search.port), (None, Some(9200)));
        assert_eq!(search.env, [("MODE".to_string(), "single".to_string())]);
        let named = services_of(
            file,
            &[
                "agentbox",
                "exec",
                "--service",
                "redis",
                "--service-timeout",
                "5",
                "p",
                "--",
                "true",
            ],
        )
        .unwrap();
        assert_eq!(named.len(), 1);
        assert_eq!(
            (named[0].kind, named[0].ready_timeout.as_secs()),
            (Some(ServiceKind::Redis), 5)
        );
        // A known name on another image keeps its port and connection variables.
        let other = services_of(
            "",
            &[
                "agentbox",
                "exec",
                "--service",
                "postgres=example/pg:16",
                "p",
                "--",
                "true",
            ],
        )
        .unwrap();
        assert_eq!(
            (other[0].kind, other[0].port, other[0].image.as_str()),
            (None, Some(5432), "example/pg:16")
        );
        assert!(other[0].sandbox_env.iter().any(|(k, _)| k == "DATABASE_URL"));

        let err =
            services_of("", &["agentbox", "exec", "--service", "mongo", "p", "--", "true"]).unwrap_err();
        assert!(
            err.contains("mongo=IMAGE") && err.contains("[services.mongo]"),
            "{err}"
        );
        let err = services_of(
            "",
            &[
                "agentbox",
                "exec",
                "--service",
                "postgres",
                "--service",
                "pg=example/pg:5432",
                "--service",
                "mysql",
                "p",
                "--",
                "true",
            ],
        );
        assert!(err.is_ok(), "different ports: {err:?}");
        let err = services_of(
            "[services.x]\nimage = \"a\"\nport = 6379\n",
            &[
                "agentbox",
                "exec",
                "--service",
                "x",
                "--service",
                "redis",
                "p",
                "--",
                "true",
            ],
        )
        .unwrap_err();
        assert!(err.contains("port 6379"), "{err}");
        let err = services_of(
            "[services.x]\nimage = \"a\"\ncolour = 1\n",
            &["agentbox", "exec", "p", "--", "true"],
        )
        .unwrap_err();
        assert!(err.contains("`colour`") && err.contains("sandbox-env"), "{err}");
        let err = services_of(
            "[services.x]\nport = 1\n",
            &["agentbox", "exec", "p", "--", "true"],
        )
        .unwrap_err();
        assert!(err.contains("needs an image"), "{err}");
        let err = services_of(
            "[services.x]\nimage = \"a\"\nuser = \"0:0\"\n",
            &["agentbox", "exec", "p", "--", "true"],
        )
        .unwrap_err();
        assert!(err.contains("never runs as root"), "{err}");
        // Another image over a known name's table: the table's memory, not agentbox's start.
        let other = services_of(
            file,
            &[
                "agentbox",
                "exec",
                "--service",
                "postgres=example/pg:16",
                "p",
                "--",
                "true",
            ],
        )
        .unwrap();
        assert_eq!(
            (other[0].kind, other[0].command.as_ref(), other[0].user.as_ref()),
            (None, None, None)
        );
        assert_eq!((other[0].memory_bytes, other[0].port), (1 << 30, Some(5432)));
    }
}
