//! `agentbox eval TASKS_DIR`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::cli::{CompareArgs, EvalArgs, EvalCommand};
use crate::config::{AgentSettings, UsageError};
use crate::eval::{self, OutDir, ResultLog, TaskResult};
use crate::events::{StatusLine, for_terminal};
use crate::image::{ensure_image, stderr_progress};
use crate::sandbox::Cleanup;
use crate::sandbox::connect_docker;

#[derive(Default)]
struct Progress {
    done: AtomicUsize,
    running: AtomicUsize,
    failed: AtomicUsize,
}

fn bar(p: &Progress, total: usize, started: Instant) -> String {
    let secs = started.elapsed().as_secs();
    format!(
        "[{}/{} done | {} running | {} not fixed | {:02}:{:02}]",
        p.done.load(Ordering::Relaxed),
        total,
        p.running.load(Ordering::Relaxed),
        p.failed.load(Ordering::Relaxed),
        secs / 60,
        secs % 60
    )
}

/// A finished task's line: its name, its mark and why it is not fixed, made safe for a terminal
/// (task names and errors come from the tasks directory and the model).
fn task_line(result: &TaskResult) -> String {
    let mark = if result.fixed {
        "fixed"
    } else if result.exit_reason == crate::report::Outcome::Error {
        "ERROR"
    } else {
        "not fixed"
    };
    let detail = match (&result.error, result.tests_changed) {
        (Some(e), _) => format!(": {}", e.lines().next().unwrap_or_default()),
        (None, true) => ": the tests were changed".into(),
        _ => String::new(),
    };
    for_terminal(&format!(
        "  {:<28} {mark} ({} steps, {:.1}s){detail}\n",
        result.task, result.steps, result.wall_secs
    ))
}

/// A task the agent works on: counted as running while this lives, and holding its job slot.
struct Running {
    progress: Arc<Progress>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Running {
    fn start(progress: Arc<Progress>, permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        progress.running.fetch_add(1, Ordering::Relaxed);
        Running {
            progress,
            _slot: permit,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.progress.running.fetch_sub(1, Ordering::Relaxed);
    }
}

pub async fn run(args: EvalArgs, cleanup: Cleanup) -> anyhow::Result<u8> {
    if let Some(EvalCommand::Compare(c)) = &args.command {
        return compare(c);
    }
    let Some(tasks_dir) = args.tasks_dir.clone() else {
        return Err(UsageError("eval needs a TASKS_DIR".into()).into());
    };
    let mut base = AgentSettings::resolve(&args.agent, true)?;
    base.sandbox.cleanup = cleanup;
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
        return run_strategy(&args, &tasks_dir, base, &tasks, &title, OutDir { root }).await;
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
        code = code.max(run_strategy(&args, &tasks_dir, settings, &tasks, &title, out).await?);
        let loaded = eval::load_results(&root.join(strategy.as_str()).join("results.jsonl"));
        sides.push(eval::compare::Side {
            label: strategy.as_str().to_string(),
            results: tasks
                .iter()
                .filter_map(|t| loaded.get(&t.name).cloned())
                .collect(),
        });
    }
    let table = eval::compare::table(&sides);
    std::fs::write(
        root.join("summary.md"),
        format!(
            "# agentbox eval: {}, by strategy\n\nEach cell: fixed or not, wall seconds, tokens (in + out). \
             Each strategy's own summary and report are in its directory.\n\n{table}",
            eval::markdown::inline(&title)
        ),
    )?;
    outln!("\n{table}\nsummary: {}", root.join("summary.md").display());
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
    out.create()?;

    // Resume: tasks with a result are done unless --force.
    let previous = if args.force {
        Default::default()
    } else {
        eval::load_results(&out.results())
    };
    let todo: Vec<eval::Task> = tasks
        .iter()
        .filter(|t| !previous.contains_key(&t.name))
        .cloned()
        .collect();
    let log = Arc::new(ResultLog::open(&out.results(), args.force)?);
    let jobs = args
        .jobs
        .map(|j| j as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));

    // Fail early, once, on what every task needs: Docker, and the image when one was given
    // (otherwise each task's is chosen from its project, as for `run`).
    let docker = connect_docker().await?;
    if base.sandbox.image_source.is_some() {
        ensure_image(
            &docker,
            &base.sandbox.image,
            &base.sandbox.cleanup,
            &mut stderr_progress,
        )
        .await?;
    }

    errln!(
        "agentbox eval: {} task(s) in {}, {} already done{}, {} at a time; results in {}",
        tasks.len(),
        tasks_dir.display(),
        tasks.len() - todo.len(),
        if args.force { " (--force: all again)" } else { "" },
        jobs,
        out.root.display()
    );
    let started = Instant::now();
    let progress = Arc::new(Progress::default());
    // The one writer of stderr from here on: the progress line, and each task's line above it.
    let status = StatusLine::stderr();
    let total = todo.len();
    // Aborted when this future is dropped too (Ctrl-C), so no progress line outlives the eval.
    let ticker = {
        let (progress, status) = (progress.clone(), status.clone());
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            let live = status.is_live();
            loop {
                tokio::time::sleep(Duration::from_millis(if live { 250 } else { 10_000 })).await;
                let line = bar(&progress, total, started);
                if live {
                    status.show(&line);
                } else {
                    // Without a terminal, a plain line now and then shows it is alive.
                    status.print(&format!("{line}\n"));
                }
            }
        }))
    };
    // Two gates, both first come first served: `open` bounds the sandboxes that exist (running
    // or ready), `running` the tasks the agent works on. A task makes its sandbox as soon as it
    // passes the first, then waits for the second.
    let ahead = args.prepare_ahead.map(|n| n as usize).unwrap_or(jobs);
    let open = Arc::new(tokio::sync::Semaphore::new(jobs + ahead));
    let semaphore = Arc::new(tokio::sync::Semaphore::new(jobs));
    let base = Arc::new(base);
    let out = Arc::new(out);
    let mut set = tokio::task::JoinSet::new();
    for task in todo {
        let (open, semaphore, base, out, log, progress, status) = (
            open.clone(),
            semaphore.clone(),
            base.clone(),
            out.clone(),
            log.clone(),
            progress.clone(),
            status.clone(),
        );
        set.spawn(async move {
            #[allow(clippy::expect_used, reason = "the semaphore is never closed")]
            let _sandbox = open.acquire_owned().await.expect("semaphore");
            let turn = async {
                #[allow(clippy::expect_used, reason = "the semaphore is never closed")]
                let permit = semaphore.acquire_owned().await.expect("semaphore");
                Running::start(progress.clone(), permit)
            };
            let result = eval::run_task_when(&base, &task, &out, turn).await;
            progress.done.fetch_add(1, Ordering::Relaxed);
            if !result.fixed {
                progress.failed.fetch_add(1, Ordering::Relaxed);
            }
            if let Err(e) = log.append(&result) {
                status.print(&format!("agentbox eval: cannot record {}: {e}\n", result.task));
            }
            status.print(&task_line(&result));
            result
        });
    }
    while let Some(joined) = set.join_next().await {
        joined?;
    }
    ticker.abort();
    // Wait for it to stop, or its last tick could draw the line again after the clear.
    let _ = ticker.await;
    status.clear();

    let all: Vec<TaskResult> = {
        let loaded = eval::load_results(&out.results());
        tasks
            .iter()
            .filter_map(|t| loaded.get(&t.name).cloned())
            .collect()
    };
    let totals = eval::totals(&all);
    let model = all
        .iter()
        .map(|r| r.model.clone())
        .find(|m| !m.is_empty())
        .unwrap_or_default();
    std::fs::write(
        out.root.join("summary.md"),
        eval::markdown::summary(title, &all, &totals),
    )?;
    std::fs::write(
        out.root.join("report.html"),
        eval::html::report(title, &model, &all, &totals, &out),
    )?;
    outln!(
        "{} of {} fixed ({} with changed tests, {} errors); median {:.1}s per task; this run: {} task(s) in {:.1}s",
        totals.fixed,
        totals.tasks,
        totals.tests_changed,
        totals.errors,
        totals.median_secs,
        total,
        started.elapsed().as_secs_f64()
    );
    outln!(
        "results: {}\nsummary: {}\nreport:  {}",
        out.results().display(),
        out.root.join("summary.md").display(),
        out.root.join("report.html").display()
    );
    Ok(if totals.fixed == totals.tasks { 0 } else { 1 })
}
