//! One eval of a strategy over the tasks, in steps: [`plan`] (resume what is done, choose where
//! the tasks run: the local engine or the `--engine`s), [`run`] (every task, with a progress
//! line), [`write_reports`] (the summary and the HTML report). The command prints around them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::engines::{self, Slot};
use super::{OutDir, ResultLog, Task, TaskResult, Totals};
use crate::config::{AgentSettings, UsageError};
use crate::events::{StatusLine, for_terminal};
use crate::output::stderr_progress;
use crate::sandbox::image::ensure_image;
use crate::sandbox::{SandboxError, connect_docker};

/// Why an eval could not run (a task's own failure is its result, never this).
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Image(#[from] crate::sandbox::image::ImageError),
    #[error(transparent)]
    Usage(#[from] UsageError),
    #[error("no --engine can take tasks (see above)")]
    NoEngine,
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
}

/// What the command line asks of the run.
pub struct Options<'a> {
    /// Run every task again, results so far dropped.
    pub force: bool,
    pub jobs: Option<u32>,
    pub prepare_ahead: Option<u32>,
    /// `--engine` arguments, unparsed.
    pub engines: &'a [String],
}

/// Where the tasks not done yet run, and how many at a time.
pub struct Plan {
    pub todo: Vec<Task>,
    pub jobs: usize,
    log: Arc<ResultLog>,
    /// `--engine`: the engines that can take tasks; `None` for the local engine.
    slots: Option<Arc<Vec<Slot>>>,
}

/// Resume (tasks with a result are done unless `--force`) and choose where the rest run; `say`
/// hears about each engine.
pub async fn plan(
    options: &Options<'_>,
    base: &AgentSettings,
    tasks: &[Task],
    out: &OutDir,
    say: &(dyn Fn(String) + Sync),
) -> Result<Plan, EvalError> {
    out.create()?;
    let previous = if options.force {
        Default::default()
    } else {
        super::load_results(&out.results())
    };
    let todo: Vec<Task> = tasks
        .iter()
        .filter(|t| !previous.contains_key(&t.name))
        .cloned()
        .collect();
    let log = Arc::new(ResultLog::open(&out.results(), options.force)?);
    if options.engines.is_empty() {
        check_local(base).await?;
        let jobs = options
            .jobs
            .map(|j| j as usize)
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        return Ok(Plan {
            todo,
            jobs,
            log,
            slots: None,
        });
    }
    let slots = engine_slots(options, base, &todo, say).await?;
    Ok(Plan {
        todo,
        jobs: slots.iter().map(|s| s.jobs).sum(),
        log,
        slots: Some(Arc::new(slots)),
    })
}

/// Fail early, once, on what every task needs: Docker, and the image when one was given
/// (otherwise each task's is chosen from its project, as for `run`).
async fn check_local(base: &AgentSettings) -> Result<(), EvalError> {
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
    crate::session::ensure_service_images(&docker, &base.sandbox).await?;
    Ok(())
}

/// The `--engine`s that answer and hold (or were given) the images `todo` needs.
async fn engine_slots(
    options: &Options<'_>,
    base: &AgentSettings,
    todo: &[Task],
    say: &(dyn Fn(String) + Sync),
) -> Result<Vec<Slot>, EvalError> {
    let wanted = options
        .engines
        .iter()
        .map(|a| crate::sandbox::engine::parse_engine_arg(a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(UsageError)?;
    let images = images_for(base, todo).await;
    let slots = engines::prepare(wanted, options.jobs.map(|j| j as usize), &images, say).await;
    if slots.is_empty() {
        return Err(EvalError::NoEngine);
    }
    for s in &slots {
        say(format!("engine {}: {} at a time", s.name(), s.jobs));
    }
    Ok(slots)
}

/// The images the tasks will run: each task's `image`, else the one given, else the one its
/// project is given as for `run`.
async fn images_for(base: &AgentSettings, tasks: &[Task]) -> Vec<String> {
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

/// What a run did besides the results it recorded.
pub struct Ran {
    /// The tasks it ran.
    pub total: usize,
    pub started: Instant,
    /// `--engine`: each engine's name, tasks and tasks per minute.
    pub engine_rows: Vec<(String, usize, f64)>,
    /// `--engine`: how many tasks each engine died under.
    pub retried: HashMap<String, usize>,
}

/// Run every task of `plan`, each result recorded as it comes, with a progress line on stderr
/// (the one writer of stderr meanwhile).
pub async fn run(
    plan: Plan,
    options: &Options<'_>,
    base: Arc<AgentSettings>,
    out: Arc<OutDir>,
) -> Result<Ran, EvalError> {
    let started = Instant::now();
    let progress = Arc::new(Progress::default());
    let status = StatusLine::stderr();
    let total = plan.todo.len();
    let ticker = ticker(progress.clone(), status.clone(), total, started);
    let recorder = Arc::new(Recorder {
        progress: progress.clone(),
        log: plan.log,
        status: status.clone(),
    });
    let mut ran = Ran {
        total,
        started,
        engine_rows: Vec::new(),
        retried: HashMap::new(),
    };
    if let Some(slots) = plan.slots {
        let results = on_engines(slots, plan.todo, base, out, &progress, &status, &recorder).await?;
        ran.engine_rows = engines::throughput(&results);
        for r in &results {
            for e in &r.retried_from {
                *ran.retried.entry(e.clone()).or_insert(0) += 1;
            }
        }
    } else {
        let ahead = options.prepare_ahead.map(|n| n as usize).unwrap_or(plan.jobs);
        on_local(plan.todo, plan.jobs, ahead, base, out, &progress, &recorder).await?;
    }
    ticker.abort();
    // Wait for it to stop, or its last tick could draw the line again after the clear.
    let _ = ticker.await;
    status.clear();
    Ok(ran)
}

/// What is done, running and not fixed, counted for the progress line.
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

/// The progress line, drawn until aborted; aborted when dropped too (Ctrl-C), so no progress
/// line outlives the eval.
fn ticker(
    progress: Arc<Progress>,
    status: StatusLine,
    total: usize,
    started: Instant,
) -> tokio_util::task::AbortOnDropHandle<()> {
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
}

/// Each finished task: counted, appended to the results, and its line printed.
struct Recorder {
    progress: Arc<Progress>,
    log: Arc<ResultLog>,
    status: StatusLine,
}

impl Recorder {
    fn record(&self, result: &TaskResult) {
        self.progress.done.fetch_add(1, Ordering::Relaxed);
        if !result.fixed {
            self.progress.failed.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(e) = self.log.append(result) {
            self.status.print(&for_terminal(&format!(
                "agentbox eval: cannot record {}: {e}\n",
                result.task
            )));
        }
        self.status.print(&task_line(result));
    }
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

/// The local engine: `jobs` tasks at a time, and `ahead` more with their sandbox made.
async fn on_local(
    todo: Vec<Task>,
    jobs: usize,
    ahead: usize,
    base: Arc<AgentSettings>,
    out: Arc<OutDir>,
    progress: &Arc<Progress>,
    recorder: &Arc<Recorder>,
) -> Result<(), EvalError> {
    // Two gates, both first come first served: `open` bounds the sandboxes that exist (running
    // or ready), `running` the tasks the agent works on. A task makes its sandbox as soon as it
    // passes the first, then waits for the second.
    let open = Arc::new(tokio::sync::Semaphore::new(jobs + ahead));
    let semaphore = Arc::new(tokio::sync::Semaphore::new(jobs));
    let mut set = tokio::task::JoinSet::new();
    for task in todo {
        let (open, semaphore, base, out, progress, recorder) = (
            open.clone(),
            semaphore.clone(),
            base.clone(),
            out.clone(),
            progress.clone(),
            recorder.clone(),
        );
        set.spawn(async move {
            #[allow(clippy::expect_used, reason = "the semaphore is never closed")]
            let _sandbox = open.acquire_owned().await.expect("semaphore");
            let turn = async {
                #[allow(clippy::expect_used, reason = "the semaphore is never closed")]
                let permit = semaphore.acquire_owned().await.expect("semaphore");
                Running::start(progress.clone(), permit)
            };
            let result = super::run_task_when(&base, &task, &out, turn).await;
            recorder.record(&result);
            result
        });
    }
    while let Some(joined) = set.join_next().await {
        joined?;
    }
    Ok(())
}

/// `--engine`: each engine's workers take tasks from one queue (see `eval::engines`). Returns
/// the results recorded by this run.
async fn on_engines(
    slots: Arc<Vec<Slot>>,
    todo: Vec<Task>,
    base: Arc<AgentSettings>,
    out: Arc<OutDir>,
    progress: &Arc<Progress>,
    status: &StatusLine,
    recorder: &Recorder,
) -> Result<Vec<TaskResult>, EvalError> {
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
                    let run = super::run_task(&base, &q.task, &out);
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
                recorder.record(&result);
                ran.push(result);
            }
            joined = set.join_next() => match joined {
                Some(j) => j?,
                None => break,
            },
        }
    }
    while let Ok(result) = rx.try_recv() {
        recorder.record(&result);
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
        recorder.record(&result);
        ran.push(result);
    }
    Ok(ran)
}

/// Every task's result (this run's and earlier ones'), counted; the summary and the HTML
/// report written into `out`.
pub fn write_reports(
    title: &str,
    stamp: &super::stamp::Stamp,
    tasks: &[Task],
    out: &OutDir,
    ran: &Ran,
) -> Result<Totals, EvalError> {
    let all: Vec<TaskResult> = {
        let loaded = super::load_results(&out.results());
        tasks
            .iter()
            .filter_map(|t| loaded.get(&t.name).cloned())
            .collect()
    };
    let totals = super::totals(&all);
    let mut summary = super::markdown::summary(title, stamp, &all, &totals);
    if !ran.engine_rows.is_empty() {
        summary.push_str(&engines::markdown(&ran.engine_rows, &ran.retried));
    }
    std::fs::write(out.summary(), summary)?;
    std::fs::write(
        out.report(),
        super::html::report(title, stamp, &all, &totals, out),
    )?;
    Ok(totals)
}

/// One table of each strategy's results (`sides`), written as the summary under `root`; its
/// path and the table.
pub fn write_comparison(
    root: &std::path::Path,
    title: &str,
    stamp: &super::stamp::Stamp,
    sides: &[super::compare::Side],
) -> Result<(PathBuf, String), EvalError> {
    let table = super::compare::table(sides);
    let path = root.join("summary.md");
    std::fs::write(
        &path,
        format!(
            "# agentbox eval: {}, by strategy\n\n{}\n\nEach cell: fixed or not, wall seconds, tokens (in + out). \
             Each strategy's own summary and report are in its directory.\n\n{table}",
            super::markdown::inline(title),
            super::markdown::inline(&stamp.line())
        ),
    )?;
    Ok((path, table))
}
