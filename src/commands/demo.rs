//! `agentbox demo`: the bundled example, fixed by a live model when a key is set, otherwise by
//! a scripted replay that says so.

use std::path::PathBuf;

use crate::cli::{DemoArgs, Provider};
use crate::config::{AgentSettings, UsageError};
use crate::sandbox::Cleanup;

use super::run::{DEFAULT_TASK, print_report, run_task};

/// The example project, compiled in so `agentbox demo` works from any directory.
const FILES: &[(&str, &str)] = &[
    ("library.py", include_str!("../../examples/demo/library.py")),
    (
        "test_library.py",
        include_str!("../../examples/demo/test_library.py"),
    ),
    ("AGENTS.md", include_str!("../../examples/demo/AGENTS.md")),
];
const SCRIPT: &str = include_str!("../../examples/demo.script.json");

pub async fn run(mut args: DemoArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    let keys = ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"]
        .iter()
        .any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()));
    let model = &mut args.agent.model;
    let script_file = tempfile::Builder::new()
        .prefix("demo-script-")
        .suffix(".json")
        .tempfile()?;
    let replay = args.replay || (model.provider.is_none() && model.script.is_none() && !keys);
    if replay {
        std::fs::write(script_file.path(), SCRIPT)?;
        model.provider = Some(Provider::Scripted);
        model.script = Some(script_file.path().to_path_buf());
        // The recording is of the loop with exact edits: replayed as it was made.
        args.agent.strategy = vec![crate::cli::Strategy::Loop];
        args.agent.edit_format = Some(crate::tools::EditFormat::Exact);
        let why = if args.replay {
            "--replay was given"
        } else {
            "no model is configured (ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENAI_BASE_URL)"
        };
        errln!(
            "agentbox demo: {}, so this is a SCRIPTED REPLAY of a model's turns, not a live model. \
             The sandbox, the tools, the diff and the final test run are all real.\n",
            why
        );
    }
    let mut settings = AgentSettings::from_args(&args.agent, &args.session)?;
    settings.sandbox.cleanup = cleanup;

    let temp = tempfile::Builder::new().prefix("agentbox-demo-").tempdir()?;
    let dir: PathBuf = match &args.dir {
        Some(d) => {
            if d.exists() && std::fs::read_dir(d)?.next().is_some() {
                return Err(UsageError(format!("--dir {}: exists and is not empty", d.display())).into());
            }
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => temp.path().to_path_buf(),
    };
    for (name, body) in FILES {
        std::fs::write(dir.join(name), body)?;
    }
    errln!(
        "agentbox demo: a copy of the example (3 of its 5 tests fail) is in {}\n",
        crate::output::escaped(dir.display())
    );
    let report = run_task(&settings, &dir, DEFAULT_TASK, &Default::default()).await?;
    print_report(&report, args.json, settings.model.secrets())?;
    if replay {
        errln!(
            "\nagentbox demo: that was a scripted replay. `just demo` without --replay sets up a local model \
             and lets it work for real; or set ANTHROPIC_API_KEY (or OPENAI_API_KEY) to watch a hosted one."
        );
    }
    if args.dir.is_some() {
        errln!(
            "agentbox demo: the fixed copy is in {}",
            crate::output::escaped(dir.display())
        );
    }
    Ok(report.exit_code)
}
