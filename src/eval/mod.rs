//! `agentbox eval TASKS_DIR`: every task in its own isolated sandbox, several at once; a task
//! counts as fixed only if agentbox's own final test run passes **and** no test file changed.
//!
//! A task is a subdirectory holding a project, its instruction in `TASK.md` (or `TASK.txt`),
//! and optionally `task.toml` and, for the scripted provider, `script.json`:
//!
//! ```toml
//! test_cmd = "python3 -m pytest -q"     # or a list, all of which must pass; default: detected
//! image = "agentbox/python:3"           # default: --image, else chosen as for `run`
//! max_steps = 20                        # default: --max-steps
//! test_files = ["spec/**"]              # test files besides the usual names
//! ```

pub mod compare;
pub mod engines;
pub mod html;
pub mod markdown;
pub mod stamp;
pub mod strategy;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::config::{AgentSettings, IsolateSettings, UsageError};
use crate::events::{EventSink, Fanout, Redactor, TrajectoryWriter};
use crate::report::Outcome;
use crate::session::Session;

/// Files of a task directory that are about the task, not part of the project.
pub const TASK_FILES: &[&str] = &["TASK.md", "TASK.txt", "task.toml", "script.json"];

/// A string, or a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMore {
    One(String),
    More(Vec<String>),
}

impl OneOrMore {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            OneOrMore::One(s) => vec![s.clone()],
            OneOrMore::More(v) => v.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskToml {
    pub test_cmd: Option<OneOrMore>,
    pub image: Option<String>,
    pub max_steps: Option<u32>,
    #[serde(default)]
    pub test_files: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Task {
    pub name: String,
    pub dir: PathBuf,
    pub instruction: String,
    pub toml: TaskToml,
}

/// The subdirectories of `dir` that hold a TASK.md or TASK.txt, sorted by name.
pub fn discover(dir: &Path) -> Result<Vec<Task>, UsageError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| UsageError(format!("cannot read {}: {e}", dir.display())))?;
    let mut tasks = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let instruction = ["TASK.md", "TASK.txt"]
            .iter()
            .find_map(|f| std::fs::read_to_string(path.join(f)).ok());
        let Some(instruction) = instruction else { continue };
        let toml: TaskToml = match std::fs::read_to_string(path.join("task.toml")) {
            Ok(text) => {
                toml::from_str(&text).map_err(|e| UsageError(format!("task {name}: task.toml: {e}")))?
            }
            Err(_) => TaskToml::default(),
        };
        if let Some(cmds) = &toml.test_cmd
            && (cmds.to_vec().is_empty() || cmds.to_vec().iter().any(|c| c.trim().is_empty()))
        {
            return Err(UsageError(format!(
                "task {name}: task.toml: test_cmd must be a command or a list of commands, none empty"
            )));
        }
        tasks.push(Task {
            name,
            dir: path,
            instruction: instruction.trim().to_string(),
            toml,
        });
    }
    tasks.sort_by(|a, b| a.name.cmp(&b.name));
    if tasks.is_empty() {
        return Err(UsageError(format!(
            "{} holds no tasks: a task is a subdirectory with a TASK.md (or TASK.txt)",
            dir.display()
        )));
    }
    Ok(tasks)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskResult {
    pub task: String,
    pub fixed: bool,
    pub tests_passed: Option<bool>,
    pub tests_changed: bool,
    pub changed_files: Vec<String>,
    pub steps: u32,
    #[serde(default = "one")]
    pub attempts: u32,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: Option<f64>,
    pub wall_secs: f64,
    /// How the run ended: finished, step_limit or error.
    pub exit_reason: Outcome,
    pub error: Option<String>,
    pub model: String,
    pub summary: Option<String>,
    pub started_at: f64,
    pub finished_at: f64,
    // Results written before these fields existed still load (`serde(default)`).
    /// The command of agentbox's own final test run; `None` when it knew none or never got
    /// that far.
    #[serde(default)]
    pub test_command: Option<String>,
    #[serde(default)]
    pub test_exit_code: Option<i64>,
    /// The end of that run's output, at most [`TEST_OUTPUT_MAX`] bytes.
    #[serde(default)]
    pub test_output: String,
    /// `--strategy` (results from before strategies existed: the loop).
    #[serde(default)]
    pub strategy: crate::cli::Strategy,
    /// `--strategy repair`/`auto`: every candidate and its verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<crate::report::CandidateReport>,
    /// `--engine`: the engine the result came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// `--engine`: the engines that died while running this task, in order; the result is
    /// from `engine`, the first one it completed on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retried_from: Vec<String>,
}

/// How much of the final test run's output a result keeps: the end, where test runners put
/// their failures and counts.
pub const TEST_OUTPUT_MAX: usize = 3000;

#[cfg(test)]
impl TaskResult {
    /// A task that finished with its tests failing: the fields tests do not care about.
    pub(crate) fn for_test(task: &str) -> TaskResult {
        TaskResult {
            task: task.into(),
            fixed: false,
            tests_passed: Some(false),
            tests_changed: false,
            changed_files: vec![],
            steps: 1,
            attempts: 1,
            input_tokens: 1,
            output_tokens: 1,
            cost_usd: None,
            wall_secs: 1.0,
            exit_reason: Outcome::Finished,
            error: None,
            model: "m".into(),
            summary: None,
            started_at: 1.0,
            finished_at: 2.0,
            test_command: Some("pytest -q".into()),
            test_exit_code: Some(1),
            test_output: "1 failed".into(),
            strategy: Default::default(),
            candidates: Vec::new(),
            engine: None,
            retried_from: Vec::new(),
        }
    }
}

impl TaskResult {
    /// Why the run ended, in words (the error itself is in `error`).
    pub fn ended(&self) -> &'static str {
        match self.exit_reason {
            Outcome::Finished => "the model finished",
            Outcome::StepLimit => "the step limit was reached",
            Outcome::Repeating => "the model only repeated itself (ended early)",
            Outcome::Error => "an error stopped it",
        }
    }

    /// The final test run's verdict, in words.
    pub fn test_verdict(&self) -> String {
        let exit = self
            .test_exit_code
            .map(|c| format!(" (exit {c})"))
            .unwrap_or_default();
        match (self.tests_passed, &self.test_command) {
            (Some(true), _) => format!("passed{exit}"),
            (Some(false), _) => format!("failed{exit}"),
            (None, Some(_)) => "not run to the end".into(),
            (None, None) => "no test run".into(),
        }
    }
}

/// The last `max` bytes of `s` at most, cut at a character boundary, marked when cut.
fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("[… {start} bytes before]\n{}", &s[start..])
}

fn one() -> u32 {
    1
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Where one eval's files go.
#[derive(Debug, Clone)]
pub struct OutDir {
    pub root: PathBuf,
}

impl OutDir {
    pub fn results(&self) -> PathBuf {
        self.root.join("results.jsonl")
    }
    pub fn summary(&self) -> PathBuf {
        self.root.join("summary.md")
    }
    pub fn report(&self) -> PathBuf {
        self.root.join("report.html")
    }
    pub fn diff(&self, task: &str) -> PathBuf {
        self.root.join("diffs").join(format!("{task}.diff"))
    }
    pub fn trajectory(&self, task: &str) -> PathBuf {
        self.root.join("trajectories").join(format!("{task}.jsonl"))
    }
    pub fn create(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(self.root.join("diffs"))?;
        std::fs::create_dir_all(self.root.join("trajectories"))
    }
}

/// The results recorded so far, by task (the last line for a task wins).
pub fn load_results(path: &Path) -> BTreeMap<String, TaskResult> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<TaskResult>(l).ok())
        .map(|r| (r.task.clone(), r))
        .collect()
}

impl TaskResult {
    /// A task that never ran: only its name and why.
    pub fn not_run(task: &str, strategy: crate::cli::Strategy, error: String) -> TaskResult {
        let now = now_secs();
        TaskResult {
            task: task.to_string(),
            fixed: false,
            tests_passed: None,
            tests_changed: false,
            changed_files: Vec::new(),
            steps: 0,
            attempts: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: None,
            wall_secs: 0.0,
            exit_reason: Outcome::Error,
            error: Some(error),
            model: String::new(),
            summary: None,
            started_at: now,
            finished_at: now,
            test_command: None,
            test_exit_code: None,
            test_output: String::new(),
            strategy,
            candidates: Vec::new(),
            engine: None,
            retried_from: Vec::new(),
        }
    }
}

/// Run one task in its own isolated sandbox. Never fails: a failure is the task's result.
pub async fn run_task(base: &AgentSettings, task: &Task, out: &OutDir) -> TaskResult {
    run_task_when(base, task, out, std::future::ready(())).await
}

/// Runs `task` as [`run_task`] does, but prepares its sandbox first and starts the agent only
/// once `turn` resolves: `eval` creates the next task's sandbox while the current one runs
/// (the daemon's create and start, the copy into the sandbox and the baseline are then off the
/// critical path). Whatever `turn` yields (a job slot) is held until the task is done. The
/// wait for the turn is not counted in the task's time.
pub async fn run_task_when<G>(
    base: &AgentSettings,
    task: &Task,
    out: &OutDir,
    turn: impl std::future::Future<Output = G>,
) -> TaskResult {
    let mut started = Instant::now();
    let mut started_at = now_secs();
    let mut settings = base.clone();
    if let Some(cmds) = &task.toml.test_cmd {
        settings.test_cmd = cmds.to_vec();
    }
    if let Some(image) = &task.toml.image {
        settings.sandbox.image = image.clone();
        settings.sandbox.image_source = Some("task.toml".into());
    }
    if let Some(n) = task.toml.max_steps {
        settings.max_steps = n;
    }
    if settings.model.is_scripted() && settings.model.script.is_none() {
        settings.model.script = Some(task.dir.join("script.json"));
    }
    settings.isolate = Some(IsolateSettings {
        exclude: TASK_FILES.iter().map(|s| s.to_string()).collect(),
        patch: None,
        write_patch: false,
        apply: false,
        env: None,
    });
    let fail = |error: String| TaskResult {
        wall_secs: started.elapsed().as_secs_f64(),
        started_at,
        ..TaskResult::not_run(&task.name, settings.strategy, error)
    };
    let writer = match TrajectoryWriter::create(
        &out.trajectory(&task.name),
        Redactor::new(settings.model.secrets()),
    ) {
        Ok(w) => w,
        Err(e) => return fail(format!("cannot write the trajectory: {e}")),
    };
    let events: Arc<Fanout> = Arc::new(Fanout(vec![Box::new(writer) as Box<dyn EventSink>]));
    let mut session = match Session::open(&settings, &task.dir, events.clone()).await {
        Ok(s) => s,
        Err(e) => return fail(format!("{e:#}")),
    };
    // The task's own test files are tests too: for --protect-tests, and for repair, whose
    // candidates must leave them as they are.
    session.tool_settings.test_patterns = task.toml.test_files.clone();
    let prepared_in = started.elapsed();
    let _slot = turn.await;
    // The task's clock counts its preparation and its own run, not the wait in between.
    started = Instant::now()
        .checked_sub(prepared_in)
        .unwrap_or_else(Instant::now);
    started_at = now_secs() - prepared_in.as_secs_f64();
    session.restart_clock(prepared_in);
    if let Err(e) = session.tests_before(&task.dir).await {
        session.close().await;
        return TaskResult {
            wall_secs: started.elapsed().as_secs_f64(),
            started_at,
            ..TaskResult::not_run(&task.name, settings.strategy, e.0)
        };
    }
    let work = crate::repair::work(&session, &settings, &task.dir, &task.instruction).await;
    let mut report = session.report(&work.result).await;
    report.attempts = work.attempts;
    report.candidates = work.candidates;
    // What changed, as the host tells it (the sandbox cannot hide a rewritten test).
    let changes = session
        .finish_isolated(&mut report)
        .await
        .map_err(|e| e.to_string());
    events.emit(&crate::events::Event::Finished { report: &report });
    session.close().await;
    let (changed, changes_error) = match &changes {
        Ok(_) => (
            report
                .changed_files
                .iter()
                .map(|c| c.path.clone())
                .collect::<Vec<_>>(),
            None,
        ),
        Err(e) => (Vec::new(), Some(e.clone())),
    };
    let test_code = changes.as_ref().map(|t| t.as_slice()).unwrap_or_default();
    let tests_changed = changes_error.is_some()
        || !test_code.is_empty()
        || changed
            .iter()
            .any(|p| crate::project::is_test_file(p, &task.toml.test_files));
    if let Some(diff) = &report.diff {
        let _ = std::fs::write(out.diff(&task.name), diff);
    }
    TaskResult {
        task: task.name.clone(),
        fixed: report.tests.passed == Some(true) && !tests_changed,
        tests_passed: report.tests.passed,
        tests_changed,
        changed_files: changed,
        steps: report.steps,
        attempts: report.attempts,
        input_tokens: report.usage.total_input(),
        output_tokens: report.usage.output_tokens,
        cost_usd: report.cost_usd,
        wall_secs: started.elapsed().as_secs_f64(),
        exit_reason: report.outcome,
        error: report.error.or(changes_error),
        model: report.model,
        summary: report.summary,
        started_at,
        finished_at: now_secs(),
        test_command: report.tests.command_line(),
        test_exit_code: report.tests.exit_code(),
        test_output: tail(&report.tests.failure_output_or_last(), TEST_OUTPUT_MAX),
        strategy: settings.strategy,
        candidates: report.candidates,
        engine: None,
        retried_from: Vec::new(),
    }
}

/// Appends each result as it arrives, so an interrupted eval keeps what it finished.
pub struct ResultLog {
    file: Mutex<std::fs::File>,
}

impl ResultLog {
    pub fn open(path: &Path, truncate: bool) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(!truncate)
            .write(true)
            .truncate(truncate)
            .open(path)?;
        Ok(ResultLog {
            file: Mutex::new(file),
        })
    }

    pub fn append(&self, r: &TaskResult) -> std::io::Result<()> {
        // A panic elsewhere while holding the lock left the file as it was: still usable.
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(f, "{}", serde_json::to_string(r).map_err(std::io::Error::other)?)?;
        f.flush()
    }
}

/// Totals over a set of results.
#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    pub tasks: usize,
    pub fixed: usize,
    pub errors: usize,
    pub tests_changed: usize,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: Option<f64>,
    pub median_secs: f64,
    /// First start to last finish, for tasks per minute.
    pub span_secs: f64,
}

pub fn totals(results: &[TaskResult]) -> Totals {
    let mut secs: Vec<f64> = results.iter().map(|r| r.wall_secs).collect();
    secs.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let costs: Vec<f64> = results.iter().filter_map(|r| r.cost_usd).collect();
    let first = results.iter().map(|r| r.started_at).fold(f64::INFINITY, f64::min);
    let last = results.iter().map(|r| r.finished_at).fold(0.0, f64::max);
    Totals {
        tasks: results.len(),
        fixed: results.iter().filter(|r| r.fixed).count(),
        errors: results.iter().filter(|r| r.exit_reason == Outcome::Error).count(),
        tests_changed: results.iter().filter(|r| r.tests_changed).count(),
        input_tokens: results.iter().map(|r| r.input_tokens).sum(),
        output_tokens: results.iter().map(|r| r.output_tokens).sum(),
        cost_usd: (!costs.is_empty()).then(|| costs.iter().sum()),
        median_secs: if secs.is_empty() {
            0.0
        } else {
            secs[secs.len() / 2]
        },
        span_secs: if results.is_empty() {
            0.0
        } else {
            (last - first).max(0.0)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_reads_tasks_and_their_toml() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("b-task")).unwrap();
        std::fs::write(d.path().join("b-task/TASK.md"), "Fix it.\n").unwrap();
        std::fs::write(
            d.path().join("b-task/task.toml"),
            "max_steps = 7\ntest_files = [\"spec/**\"]\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.path().join("a-task")).unwrap();
        std::fs::write(d.path().join("a-task/TASK.txt"), "Do it.").unwrap();
        std::fs::create_dir_all(d.path().join("not-a-task")).unwrap();
        std::fs::write(d.path().join("README.md"), "x").unwrap();
        let tasks = discover(d.path()).unwrap();
        let names: Vec<&str> = tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a-task", "b-task"]);
        assert_eq!(tasks[1].toml.max_steps, Some(7));
        std::fs::write(
            d.path().join("b-task/task.toml"),
            "test_cmd = [\"cargo test\", \"make test\"]\n",
        )
        .unwrap();
        assert_eq!(
            discover(d.path()).unwrap()[1]
                .toml
                .test_cmd
                .as_ref()
                .unwrap()
                .to_vec(),
            ["cargo test", "make test"]
        );
        std::fs::write(
            d.path().join("b-task/task.toml"),
            "test_cmd = \"go test ./...\"\n",
        )
        .unwrap();
        assert_eq!(
            discover(d.path()).unwrap()[1].toml.test_cmd,
            Some(OneOrMore::One("go test ./...".into()))
        );
        std::fs::write(d.path().join("b-task/task.toml"), "test_cmd = []\n").unwrap();
        assert!(discover(d.path()).unwrap_err().0.contains("none empty"));
        std::fs::write(d.path().join("b-task/task.toml"), "max_step = 7\n").unwrap();
        assert!(
            discover(d.path())
                .unwrap_err()
                .0
                .contains("task b-task: task.toml")
        );
    }

    #[test]
    fn results_round_trip_and_the_last_line_wins() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("r.jsonl");
        let log = ResultLog::open(&path, false).unwrap();
        let mut r = TaskResult::for_test("t");
        log.append(&r).unwrap();
        r.fixed = true;
        log.append(&r).unwrap();
        let loaded = load_results(&path);
        assert_eq!(loaded.len(), 1);
        assert!(loaded["t"].fixed);
        let t = totals(&loaded.values().cloned().collect::<Vec<_>>());
        assert_eq!((t.tasks, t.fixed), (1, 1));
        assert_eq!(loaded["t"].test_command.as_deref(), Some("pytest -q"));
        assert_eq!(loaded["t"].test_output, "1 failed");
    }

    #[test]
    fn results_written_before_the_test_run_was_kept_still_load() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("r.jsonl");
        std::fs::write(
            &path,
            r#"{"task":"old","fixed":true,"tests_passed":true,"tests_changed":false,"changed_files":["a.py"],"steps":3,"attempts":1,"input_tokens":5,"output_tokens":6,"cost_usd":null,"wall_secs":1.5,"exit_reason":"finished","error":null,"model":"m","summary":"done","started_at":1.0,"finished_at":2.5}"#,
        )
        .unwrap();
        let old = &load_results(&path)["old"];
        assert!(old.fixed);
        assert_eq!((old.test_command.as_deref(), old.test_exit_code), (None, None));
        assert_eq!(old.test_output, "");
        assert_eq!(old.test_verdict(), "passed");
    }

    #[test]
    fn the_test_output_keeps_its_end() {
        assert_eq!(tail("short", 10), "short");
        let long = format!("{}é end", "x".repeat(20));
        let kept = tail(&long, 6);
        assert!(
            kept.ends_with("é end") && kept.starts_with("[… 20 bytes before]"),
            "{kept}"
        );
        // Cutting inside a character moves to the next boundary.
        assert!(tail(&long, 5).ends_with("\n end"), "{}", tail(&long, 5));
    }
}
