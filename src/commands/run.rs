//! `agentbox run PROJECT [TASK]...`

use std::path::Path;

use crate::cli::RunArgs;
use crate::config::{AgentSettings, IsolateSettings};
use crate::events::{Event, EventSink, Redactor, for_terminal};
use crate::report::Report;
use crate::sandbox::Cleanup;
use crate::session::{Session, event_sinks};

pub const DEFAULT_TASK: &str = "The test suite is failing. Find out why and fix the code.";

pub async fn run(args: RunArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    crate::config::project_arg(&args.project)?;
    let mut settings = AgentSettings::from_args(&args.agent, &args.session)?;
    settings.sandbox.cleanup = cleanup;
    if (args.apply || args.patch.is_some()) && !args.isolate && !crate::sandbox::engine::current().is_remote()
    {
        return Err(crate::config::UsageError(
            "--apply and --patch go with --isolate (implied on a remote engine)".into(),
        )
        .into());
    }
    if args.isolate || super::copy_for_remote_engine(&args.project) {
        settings.isolate = Some(IsolateSettings {
            exclude: Vec::new(),
            patch: args.patch.clone(),
            write_patch: true,
            apply: args.apply,
            env: None,
        });
    }
    if let Some(name) = &args.env {
        // Checked before anything is created.
        let name = crate::envs::EnvName::parse(name).map_err(|e| crate::config::UsageError(e.to_string()))?;
        if args.apply || args.isolate {
            return Err(crate::config::UsageError(
                "--env keeps its own copy of the project: not with --isolate or --apply (see `agentbox env merge`)"
                    .into(),
            )
            .into());
        }
        settings.isolate = Some(IsolateSettings {
            exclude: Vec::new(),
            patch: args.patch.clone(),
            write_patch: true,
            apply: false,
            env: Some(name),
        });
    }
    // Held until this run is over (dropped on return).
    let mut _env_lock = None;
    let made_here = match settings.isolate.as_ref().and_then(|i| i.env.clone()) {
        Some(name) => {
            _env_lock = Some(crate::envs::lock(&crate::envs::envs_dir()?, &name)?);
            super::env_turn::keep_flags(&mut settings.setup, &mut settings.sandbox, &name)?
        }
        None => false,
    };
    let task = if args.task.is_empty() {
        DEFAULT_TASK.to_string()
    } else {
        args.task.join(" ")
    };
    let published = super::publish::Published::start(&args.publish)?;
    settings.published = published.forwards();
    let report = run_task(&settings, &args.project, &task, &published).await?;
    if let Some(name) = settings.isolate.as_ref().and_then(|i| i.env.as_ref()) {
        if made_here {
            crate::envs::record_flags(name, &super::env_turn::given_flags(&settings.setup))?;
        }
        crate::envs::record_turn(name, &task, &report)?;
    }
    print_report(&report, args.json, settings.model.secrets())?;
    Ok(report.exit_code)
}

/// An environment's conversation after a turn, whatever its end: the next `run --env`
/// continues from here.
fn keep_conversation(settings: &AgentSettings, session: &Session, task: &str) {
    let Some(name) = settings.isolate.as_ref().and_then(|i| i.env.as_ref()) else {
        return;
    };
    let kept = crate::envs::envs_dir()
        .and_then(|base| crate::envs::save_conversation(&base, name, &session.conversation(task)));
    if let Err(e) = kept {
        session.events.emit(&Event::Note {
            message: format!("WARNING: the conversation was not kept: {e}"),
        });
    }
}

/// A turn of an environment that failed once its session was open: in the log all the same,
/// its error as its verdict.
fn keep_failed_turn(settings: &AgentSettings, session: &Session, task: &str, error: &dyn std::fmt::Display) {
    let Some(name) = settings.isolate.as_ref().and_then(|i| i.env.as_ref()) else {
        return;
    };
    keep_conversation(settings, session, task);
    if let Err(e) = crate::envs::record_turn_as(name, task, format!("error: {error}"), Vec::new()) {
        session.events.emit(&Event::Note {
            message: format!("WARNING: the turn was not recorded: {e}"),
        });
    }
}

/// Open a session on `project`, let the model work on `task`, check, report, clean up.
pub async fn run_task(
    settings: &AgentSettings,
    project: &Path,
    task: &str,
    published: &super::publish::Published,
) -> anyhow::Result<Report> {
    let mut settings = settings.clone();
    if settings.isolate.is_none() && settings.strategy != crate::cli::Strategy::Loop {
        // Candidates are tested in copies of the project; the winner reaches a bind-mounted
        // project the way `--isolate --apply` brings changes back (all or nothing, refusing
        // anything that would touch what git runs), not through a bind mount.
        settings.isolate = Some(IsolateSettings {
            exclude: Vec::new(),
            patch: None,
            write_patch: false,
            apply: true,
            env: None,
        });
    }
    let settings = &settings;
    let events = event_sinks(settings)?;
    let session = Session::open(settings, project, events.clone()).await?;
    if let Err(e) = published.announce(&session.sandbox).await {
        keep_failed_turn(settings, &session, task, &e);
        let _ = session.close().await;
        return Err(e.into());
    }
    if let Err(e) = session.tests_before(project).await {
        keep_failed_turn(settings, &session, task, &e);
        // The project's own tests ran: the host's check of the project still comes first.
        if let Some(check) = session.close().await {
            for w in check.warnings {
                events.emit(&Event::Note {
                    message: format!("WARNING: {w}"),
                });
            }
        }
        return Err(e.into());
    }
    let work = crate::repair::work(&session, settings, project, task).await;
    keep_conversation(settings, &session, task);
    let mut report = session.report(&work.result).await;
    report.attempts = work.attempts;
    if settings.strategy != crate::cli::Strategy::Loop {
        report.strategy = Some(settings.strategy.as_str().to_string());
    }
    report.candidates = work.candidates;
    // Its failure is already in the report (a warning, or the apply error).
    let _ = session.finish_isolated(&mut report).await;
    if let Some(check) = session.close().await {
        report.add_host_check(check);
    }
    events.emit(&Event::Finished { report: &report });
    Ok(report)
}

/// The report on stdout: JSON (which escapes control characters itself), or text made safe
/// for a terminal. Either way with the API key redacted, should an error message echo it.
pub fn print_report(report: &Report, json: bool, secrets: Vec<String>) -> anyhow::Result<()> {
    let redactor = Redactor::new(secrets);
    if json {
        outln!(
            "{}",
            crate::output::Escaped::json(&redactor.redact(&serde_json::to_string_pretty(report)?))
        );
    } else {
        out!("{}", for_terminal(&redactor.redact(&report.render(200))));
    }
    Ok(())
}
