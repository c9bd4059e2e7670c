//! `agentbox eval TASKS_DIR`: the command line's side (which tasks, which strategies, what is
//! printed, the exit code); the eval itself is `eval::strategy`'s.

use std::sync::Arc;

use crate::cli::{CompareArgs, EvalArgs, EvalCommand};
use crate::config::{AgentSettings, UsageError};
use crate::eval::strategy::{self, EvalError, Options};
use crate::eval::{self, OutDir};
use crate::events::for_terminal;
use crate::sandbox::Cleanup;

pub async fn run(args: EvalArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    if let Some(EvalCommand::Compare(c)) = &args.command {
        return compare(c);
    }
    let mut base = AgentSettings::resolve(&args.agent, true)?;
    base.sandbox.cleanup = cleanup;
    if args.pool > 0 {
        if !args.engines.is_empty() {
            return Err(UsageError("--pool works on the local engine only, not with --engine".into()).into());
        }
        let docker = crate::sandbox::connect_docker().await?;
        base.sandbox.pool = Some(crate::sandbox::Pool::new(&docker, args.pool as usize).await?);
    }
    let pool = base.sandbox.pool.clone();
    let code = run_strategies(&args, base).await;
    if let Some(pool) = pool {
        // What was never handed out goes now (an interruption leaves it to the run's cleanup).
        pool.close().await;
    }
    code
}

/// Every `--strategy` over the tasks.
async fn run_strategies(args: &EvalArgs, base: AgentSettings) -> anyhow::Result<u8> {
    let Some(tasks_dir) = args.tasks_dir.clone() else {
        return Err(UsageError("eval needs a TASKS_DIR".into()).into());
    };
    let mut tasks = eval::discover(&tasks_dir)?;
    if !args.tasks.is_empty() {
        let unknown: Vec<&String> = args
            .tasks
            .iter()
            .filter(|n| !tasks.iter().any(|t| &t.name == *n))
            .collect();
        if !unknown.is_empty() {
            return Err(UsageError(format!(
                "no such task: {}",
                unknown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ))
            .into());
        }
        tasks.retain(|t| args.tasks.contains(&t.name));
    }
    let title = tasks_dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "tasks".into());
    let root = args
        .out
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("eval-results").join(&title));
    if base.strategies.len() <= 1 {
        return run_strategy(args, &tasks_dir, base, &tasks, &title, OutDir { root }).await;
    }
    // Each strategy over every task, into its own directory; then one table of them all.
    let mut code = 0;
    let mut sides = Vec::new();
    for strategy in base.strategies.clone() {
        let mut settings = base.clone();
        settings.strategy = strategy;
        let out = OutDir {
            root: root.join(strategy.as_str()),
        };
        errln!("agentbox eval: --strategy {}", strategy.as_str());
        code = code.max(run_strategy(args, &tasks_dir, settings, &tasks, &title, out).await?);
        let loaded = eval::load_results(&root.join(strategy.as_str()).join("results.jsonl"));
        sides.push(eval::compare::Side {
            label: strategy.as_str().to_string(),
            results: tasks
                .iter()
                .filter_map(|t| loaded.get(&t.name).cloned())
                .collect(),
        });
    }
    let stamp = eval::stamp::Stamp::now(&base.model);
    let (summary, table) = strategy::write_comparison(&root, &title, &stamp, &sides)?;
    outln!(
        "\n{}\nsummary: {}",
        for_terminal(&table),
        crate::output::escaped(summary.display())
    );
    Ok(code)
}

/// `agentbox eval compare DIR...`: the table, on stdout.
fn compare(args: &CompareArgs) -> anyhow::Result<u8> {
    let mut sides = Vec::new();
    for dir in &args.dirs {
        let label = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string());
        let Some(side) = eval::compare::load(dir, &label) else {
            return Err(UsageError(format!(
                "{}: no results (it should hold the results.jsonl of an eval)",
                dir.display()
            ))
            .into());
        };
        sides.push(side);
    }
    out!("{}", for_terminal(&eval::compare::table(&sides)));
    Ok(0)
}

/// One eval of `tasks` with `base` (its strategy), results in `out`.
async fn run_strategy(
    args: &EvalArgs,
    tasks_dir: &std::path::Path,
    base: AgentSettings,
    tasks: &[eval::Task],
    title: &str,
    out: OutDir,
) -> anyhow::Result<u8> {
    let options = Options {
        force: args.force,
        jobs: args.jobs,
        prepare_ahead: args.prepare_ahead,
        engines: &args.engines,
    };
    let say = |line: String| errln!("agentbox eval: {}", for_terminal(&line));
    let plan = strategy::plan(&options, &base, tasks, &out, &say)
        .await
        .map_err(usage_stays_usage)?;
    errln!(
        "agentbox eval: {} task(s) in {}, {} already done{}, {} at a time; results in {}",
        tasks.len(),
        crate::output::escaped(tasks_dir.display()),
        tasks.len() - plan.todo.len(),
        if args.force { " (--force: all again)" } else { "" },
        plan.jobs,
        crate::output::escaped(out.root.display())
    );
    let out = Arc::new(out);
    let model = base.model.clone();
    let ran = strategy::run(plan, &options, Arc::new(base), out.clone()).await?;
    // Stamped when written: the end of the run.
    let stamp = eval::stamp::Stamp::now(&model);
    let totals = strategy::write_reports(title, &stamp, tasks, &out, &ran)?;
    outln!(
        "{} of {} fixed ({} with changed tests, {} errors); median {:.1}s per task; this run: {} task(s) in {:.1}s",
        totals.fixed,
        totals.tasks,
        totals.tests_changed,
        totals.errors,
        totals.median_secs,
        ran.total,
        ran.started.elapsed().as_secs_f64()
    );
    for (name, n, per_min) in &ran.engine_rows {
        outln!(
            "engine {}: {} task(s), {:.1} tasks/min{}",
            for_terminal(name),
            n,
            per_min,
            crate::output::escaped(match ran.retried.get(name) {
                Some(k) => format!(", died under {k} (run again elsewhere)"),
                None => String::new(),
            })
        );
    }
    outln!(
        "results: {}\nsummary: {}\nreport:  {}",
        crate::output::escaped(out.results().display()),
        crate::output::escaped(out.summary().display()),
        crate::output::escaped(out.report().display())
    );
    Ok(if totals.fixed == totals.tasks { 0 } else { 1 })
}

/// A bad `--engine` is a usage error for the exit code too (`app::report_error` looks for a
/// [`UsageError`]), not an error that holds one.
fn usage_stays_usage(e: EvalError) -> anyhow::Error {
    match e {
        EvalError::Usage(u) => u.into(),
        other => other.into(),
    }
}
