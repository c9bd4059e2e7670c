//! `agentbox eval TASKS_DIR`

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::cli::{CompareArgs, EvalArgs, EvalCommand};
use crate::config::{AgentSettings, UsageError};
use crate::eval::{self, OutDir, ResultLog, TaskResult, engines};
use crate::events::{StatusLine, for_terminal};
use crate::output::stderr_progress;
use crate::sandbox::Cleanup;
use crate::sandbox::connect_docker;
use crate::sandbox::image::ensure_image;

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
fn task_line(result: &TaskResult) -> crate::output::Escaped {
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
    outln!(
        "\n{}\nsummary: {}",
        for_terminal(&table),
        crate::output::escaped(root.join("summary.md").display())
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
    let mut jobs = args
        .jobs
        .map(|j| j as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));

    let slots = if args.engines.is_empty() {
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
        None
    } else {
        let wanted = args
            .engines
            .iter()
            .map(|a| crate::sandbox::engine::parse_engine_arg(a))
            .collect::<Result<Vec<_>, _>>()
            .map_err(UsageError)?;
        let images = images_for(&base, &todo).await;
        let say = |line: String| errln!("agentbox eval: {}", for_terminal(&line));
        let slots = engines::prepare(wanted, args.jobs.map(|j| j as usize), &images, &say).await;
        if slots.is_empty() {
            anyhow::bail!("no --engine can take tasks (see above)");
        }
        for s in &slots {
            errln!(
                "agentbox eval: engine {}: {} at a time",
                for_terminal(&s.name()),
                s.jobs
            );
        }
        jobs = slots.iter().map(|s| s.jobs).sum();
        Some(Arc::new(slots))
    };

    errln!(
        "agentbox eval: {} task(s) in {}, {} already done{}, {} at a time; results in {}",
        tasks.len(),
        crate::output::escaped(tasks_dir.display()),
        tasks.len() - todo.len(),
        if args.force { " (--force: all again)" } else { "" },
        jobs,
        crate::output::escaped(out.root.display())
    );
    let started = Instant::now();
    let progress = Arc::new(Progress::default());
    let mut engine_rows = Vec::new();
    let mut retried: HashMap<String, usize> = HashMap::new();
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
                    status.show(&for_terminal(&line));
                } else {
                    // Without a terminal, a plain line now and then shows it is alive.
                    status.print(&for_terminal(&format!("{line}\n")));
                }
            }
        }))
    };
    let base = Arc::new(base);
    let out = Arc::new(out);
    if let Some(slots) = slots {
        let record = {
            let (progress, log, status) = (progress.clone(), log.clone(), status.clone());
            move |result: &TaskResult| {
                progress.done.fetch_add(1, Ordering::Relaxed);
                if !result.fixed {
                    progress.failed.fetch_add(1, Ordering::Relaxed);
                }
                if let Err(e) = log.append(result) {
                    status.print(&for_terminal(&format!(
                        "agentbox eval: cannot record {}: {e}\n",
                        result.task
                    )));
                }
                status.print(&task_line(result));
            }
        };
        let ran = on_engines(
            slots,
            todo,
            base.clone(),
            out.clone(),
            &progress,
            &status,
            &record,
        )
        .await?;
        engine_rows = engines::throughput(&ran);
        retried = HashMap::new();
        for r in &ran {
            for e in &r.retried_from {
                *retried.entry(e.clone()).or_insert(0) += 1;
            }
        }
    } else {
        // Two gates, both first come first served: `open` bounds the sandboxes that exist (running
        // or ready), `running` the tasks the agent works on. A task makes its sandbox as soon as it
        // passes the first, then waits for the second.
        let ahead = args.prepare_ahead.map(|n| n as usize).unwrap_or(jobs);
        let open = Arc::new(tokio::sync::Semaphore::new(jobs + ahead));
        let semaphore = Arc::new(tokio::sync::Semaphore::new(jobs));
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
                    status.print(&for_terminal(&format!(
                        "agentbox eval: cannot record {}: {e}\n",
                        result.task
                    )));
                }
                status.print(&task_line(&result));
                result
            });
        }
        while let Some(joined) = set.join_next().await {
            joined?;
        }
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
    let mut summary = eval::markdown::summary(title, &all, &totals);
    if !engine_rows.is_empty() {
        summary.push_str(&engines::markdown(&engine_rows, &retried));
    }
    std::fs::write(out.root.join("summary.md"), summary)?;
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
    for (name, n, per_min) in &engine_rows {
        outln!(
            "engine {}: {} task(s), {:.1} tasks/min{}",
            for_terminal(name),
            n,
            per_min,
            crate::output::escaped(match retried.get(name) {
                Some(k) => format!(", died under {k} (run again elsewhere)"),
                None => String::new(),
            })
        );
    }
    outln!(
        "results: {}\nsummary: {}\nreport:  {}",
        crate::output::escaped(out.results().display()),
        crate::output::escaped(out.root.join("summary.md").display()),
        crate::output::escaped(out.root.join("report.html").display())
    );
    Ok(if totals.fixed == totals.tasks { 0 } else { 1 })
}

/// The images the tasks will run: each task's `image`, else the one given, else the one its
/// project is given as for `run`.
async fn images_for(base: &AgentSettings, tasks: &[eval::Task]) -> Vec<String> {
    let mut images = std::collections::BTreeSet::new();
    for task in tasks {
        let image = match &task.toml.image {
            Some(i) => i.clone(),
            None if base.sandbox.image_source.is_some() => base.sandbox.image.clone(),
            None => {
                let dir = task.dir.clone();
                let detection = tokio::task::spawn_blocking(move || crate::project::detect(&dir))
                    .await
                    .unwrap_or_default();
                crate::session::choose_image(&base.sandbox, &task.dir, &detection)
                    .await
                    .image
            }
        };
        images.insert(image);
    }
    images.into_iter().collect()
}

/// `--engine`: each engine's workers take tasks from one queue (see `eval::engines`). Returns
/// the results recorded by this run.
async fn on_engines(
    slots: Arc<Vec<engines::Slot>>,
    todo: Vec<eval::Task>,
    base: Arc<AgentSettings>,
    out: Arc<OutDir>,
    progress: &Arc<Progress>,
    status: &StatusLine,
    record: &(dyn Fn(&TaskResult) + Send + Sync),
) -> anyhow::Result<Vec<TaskResult>> {
    let queue = Arc::new(engines::Queue::new(todo));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<TaskResult>();
    let mut set = tokio::task::JoinSet::new();
    for index in 0..slots.len() {
        for _ in 0..slots[index].jobs {
            let (slots, queue, base, out, progress, status, tx) = (
                slots.clone(),
                queue.clone(),
                base.clone(),
                out.clone(),
                progress.clone(),
                status.clone(),
                tx.clone(),
            );
            set.spawn(async move {
                let slot = &slots[index];
                while let Some(mut q) = queue.take(&slot.dead).await {
                    progress.running.fetch_add(1, Ordering::Relaxed);
                    let run = eval::run_task(&base, &q.task, &out);
                    let mut result = crate::sandbox::engine::scope(slot.engine.clone(), run).await;
                    progress.running.fetch_sub(1, Ordering::Relaxed);
                    if !slot.answers().await {
                        if !slot.dead.swap(true, Ordering::AcqRel) {
                            status.print(&crate::escaped!(
                                "agentbox eval: engine {} stopped answering: its tasks go to the other engines\n",
                                for_terminal(&slot.name())
                            ));
                        }
                        // A task that finished with its verdict keeps it: only one the engine's
                        // end cut short (an error) runs again elsewhere.
                        if result.error.is_some() {
                            if slots.iter().any(|s| !s.dead.load(Ordering::Acquire)) {
                                q.retried_from.push(slot.name());
                                queue.hand_back(q);
                                continue;
                            }
                            // No engine left to run it again: this run's result stands, whatever
                            // it is worth, with the engine's end said.
                            let note =
                                format!("its engine {} stopped answering, and no other is left", slot.name());
                            result.error = result.error.take().map(|e| format!("{e}; {note}"));
                        }
                    }
                    result.engine = Some(slot.name());
                    result.retried_from = q.retried_from;
                    let _ = tx.send(result);
                    queue.done();
                }
            });
        }
    }
    drop(tx);
    let mut ran = Vec::new();
    loop {
        tokio::select! {
            Some(result) = rx.recv() => {
                record(&result);
                ran.push(result);
            }
            joined = set.join_next() => match joined {
                Some(j) => j?,
                None => break,
            },
        }
    }
    while let Ok(result) = rx.try_recv() {
        record(&result);
        ran.push(result);
    }
    // Every engine died: what none of them took is recorded as not run, once.
    for q in queue.drain() {
        let mut result = TaskResult::not_run(
            &q.task.name,
            base.strategy,
            "no engine left to run it: every --engine stopped answering".into(),
        );
        result.retried_from = q.retried_from;
        record(&result);
        ran.push(result);
    }
    Ok(ran)
}
