//! `--env NAME` on the commands besides `run` (`exec`, `shell`): the environment's lock and
//! flags before the sandbox, and after it the turn in the log with its checkpoint. `run` shares
//! the flag rules.

use crate::config::SetupSettings;
use crate::envs::{EnvLock, EnvName, Flags};
use crate::output::escaped;

/// The flags of `setup` as an environment keeps them.
pub(crate) fn given_flags(setup: &SetupSettings) -> Flags {
    Flags {
        agent_network: setup.agent_network,
        allow_hosts: setup.allow.iter().map(|r| r.to_string()).collect(),
        setup: setup.commands.clone(),
    }
}

/// A resumed environment's flags: those it was made with unless given again; given wider ones
/// are the user's to ask for, and said once on stderr. Its image likewise: the one it was made
/// with unless one is given. Whether the environment is new.
pub(crate) fn keep_flags(
    setup: &mut SetupSettings,
    sandbox: &mut crate::config::SandboxConfig,
    name: &EnvName,
) -> anyhow::Result<bool> {
    let record = match crate::envs::EnvRecord::load(&crate::envs::envs_dir()?, name) {
        Ok(r) => r,
        Err(crate::envs::EnvError::NotFound(_)) => return Ok(true),
        Err(e) => return Err(e.into()),
    };
    match &sandbox.image_source {
        None => {
            sandbox.image = record.image.clone();
            sandbox.image_source = Some(format!("environment {name}"));
        }
        Some(source) if sandbox.image != record.image => errln!(
            "environment {} was made with the image {}; this run uses {} ({})",
            escaped(name.as_str()),
            escaped(&record.image),
            escaped(&sandbox.image),
            escaped(source)
        ),
        Some(_) => {}
    }
    let kept = Flags::of(&record);
    let given = given_flags(setup);
    let wider = kept.widened_by(&given);
    if !wider.is_empty() {
        errln!(
            "WARNING: environment {} was made without {}: this run has them because they were given",
            escaped(name.as_str()),
            escaped(wider.join(", "))
        );
    }
    if !given.agent_network {
        setup.agent_network = kept.agent_network;
    }
    if given.allow_hosts.is_empty() && !kept.allow_hosts.is_empty() {
        setup.allow = kept
            .allow_hosts
            .iter()
            .map(|h| h.parse::<crate::egress::Rule>())
            .collect::<Result<_, _>>()?;
    }
    if given.setup.is_empty() {
        setup.commands = kept.setup.clone();
    }
    let inherited = Flags::default().widened_by(&kept);
    if !inherited.is_empty() {
        errln!(
            "environment {} resumes with the flags it was made with: {}",
            escaped(name.as_str()),
            escaped(inherited.join(", "))
        );
    }
    Ok(false)
}

/// An environment held by `exec --env` or `shell --env` from before its setup to its log line.
pub(crate) struct EnvTurn {
    pub name: EnvName,
    made_here: bool,
    _lock: EnvLock,
}

impl EnvTurn {
    /// Checked, locked (refused while another process works in it), and `setup` and `sandbox`
    /// given the flags and image it was made with unless they are given again.
    pub fn begin(
        name: &str,
        setup: &mut SetupSettings,
        sandbox: &mut crate::config::SandboxConfig,
    ) -> anyhow::Result<EnvTurn> {
        let name = EnvName::parse(name).map_err(|e| crate::config::UsageError(e.to_string()))?;
        let lock = crate::envs::lock(&crate::envs::envs_dir()?, &name)?;
        let made_here = keep_flags(setup, sandbox, &name)?;
        Ok(EnvTurn {
            name,
            made_here,
            _lock: lock,
        })
    }

    /// The turn in the log (`env show`): the command as its task, its end as its verdict; a
    /// new environment's flags kept. A failure here is a warning: the files are in the volume.
    pub fn end(&self, setup: &SetupSettings, task: &str, verdict: String, changed: Vec<String>) {
        let mut kept = Ok(());
        if self.made_here {
            kept = crate::envs::record_flags(&self.name, &given_flags(setup));
        }
        let kept = kept.and_then(|()| crate::envs::record_turn_as(&self.name, task, verdict, changed));
        if let Err(e) = kept {
            errln!(
                "agentbox: WARNING: environment {}: this turn was not logged: {}",
                escaped(self.name.as_str()),
                escaped(e)
            );
        }
    }

    /// The turn is over: what the read-back `kept` (changed paths, warnings) said on stderr
    /// after `lead` ("" or "sandbox removed; "), and the turn logged with `verdict` (an error's
    /// message when the changes could not be told).
    pub fn close(
        &self,
        setup: &SetupSettings,
        task: &str,
        verdict: String,
        kept: Result<(Vec<String>, Vec<String>), crate::session::SessionError>,
        lead: &str,
    ) {
        match kept {
            Ok((changed, warnings)) => {
                for w in &warnings {
                    errln!("agentbox: WARNING: {}", crate::events::for_terminal(w));
                }
                errln!(
                    "agentbox: {}{}",
                    escaped(lead),
                    escaped(self.summary(changed.len()))
                );
                self.end(setup, task, verdict, changed);
            }
            Err(e) => {
                errln!(
                    "agentbox: {}cannot tell what changed in environment {}: {}",
                    escaped(lead),
                    escaped(self.name.as_str()),
                    escaped(&e)
                );
                self.end(setup, task, format!("error: {e}"), Vec::new());
            }
        }
    }

    /// What the user reads at the end: where the changes are, and how to see or take them.
    pub fn summary(&self, changed: usize) -> String {
        summary(&self.name, changed)
    }
}

/// `changed` files in environment `name`, and how to see or take them.
pub(crate) fn summary(name: &EnvName, changed: usize) -> String {
    let n = name.as_str();
    format!(
        "{changed} file{} changed in environment {n} since it was made; see them with `agentbox env diff {n}`, take them with `agentbox env merge {n}`",
        if changed == 1 { "" } else { "s" }
    )
}
