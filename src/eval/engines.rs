//! `eval --engine`: tasks spread over several Docker engines.
//!
//! Before scheduling, each engine must answer and hold the images the tasks need (an image it
//! lacks is copied from the local engine, `DOCKER_HOST`, through the API: export there, load
//! there); one that cannot is left out, with the reason. Each engine runs as many tasks at once
//! as its capacity (`URL=JOBS`, else `--jobs`, else its CPU count), workers taking the next
//! task from one queue, so a faster engine takes more. After each task its engine is asked
//! whether it still answers: if not, the engine is out for the rest of the run and the task
//! goes back to the queue for another engine (its result records `retried_from`). A task is
//! recorded exactly once: the result of its first run on an engine that was still there at
//! the end of it, or an error when no engine is left.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bollard::Docker;
use futures_util::StreamExt;

use super::TaskResult;
use crate::sandbox::engine::Engine;

/// An engine that passed the checks, with the tasks it runs at once.
pub struct Slot {
    pub engine: Engine,
    pub jobs: usize,
    pub docker: Docker,
    /// Set when it stops answering: its workers take no more tasks.
    pub dead: AtomicBool,
}

impl Slot {
    /// Its endpoint, as results and the summary name it.
    pub fn name(&self) -> String {
        self.engine.host.clone()
    }

    /// Still answers: up to three pings a second apart (5 s each at most), so one slow answer
    /// from a loaded engine does not take it out of the run.
    pub async fn answers(&self) -> bool {
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            if matches!(
                tokio::time::timeout(Duration::from_secs(5), self.docker.ping()).await,
                Ok(Ok(_))
            ) {
                return true;
            }
        }
        false
    }
}

/// Check each engine and copy missing images in; `say` gets one line per engine left out or
/// given an image. The engines that can take tasks, in the order given.
pub async fn prepare(
    wanted: Vec<(Engine, Option<usize>)>,
    default_jobs: Option<usize>,
    images: &[String],
    say: &(dyn Fn(String) + Sync),
) -> Vec<Slot> {
    let mut slots = Vec::new();
    let mut local: Option<Docker> = None;
    for (engine, jobs) in wanted {
        let name = engine.describe();
        if slots.iter().any(|s: &Slot| s.engine == engine) {
            say(format!("--engine {name} is given twice: once is used"));
            continue;
        }
        let docker = match engine.connect().await {
            Ok(d) => d,
            Err(e) => {
                say(format!("engine {name} left out: {e}"));
                continue;
            }
        };
        let mut ok = true;
        for image in images {
            if crate::sandbox::image::image_exists(&docker, image)
                .await
                .unwrap_or(false)
            {
                continue;
            }
            if local.is_none() {
                local = Engine::from_env().connect().await.ok();
            }
            let copied = match &local {
                Some(src) => copy_image(src, &docker, image).await,
                None => Err(CopyError::NoLocalEngine),
            };
            match copied {
                Ok(()) => say(format!("engine {name}: {image} copied from the local engine")),
                Err(e) => {
                    say(format!(
                        "engine {name} left out: it has no {image}, and it cannot be copied: {e}"
                    ));
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            continue;
        }
        let jobs = match jobs.or(default_jobs) {
            Some(j) => j,
            None => docker
                .info()
                .await
                .ok()
                .and_then(|i| i.ncpu)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
                .unwrap_or(1),
        };
        slots.push(Slot {
            engine,
            jobs,
            docker,
            dead: AtomicBool::new(false),
        });
    }
    slots
}

/// Why an image could not be copied to an engine.
#[derive(Debug, thiserror::Error)]
enum CopyError {
    #[error("the local engine (DOCKER_HOST) does not answer")]
    NoLocalEngine,
    #[error("the local engine has no {0} either")]
    NotLocal(String),
    #[error(transparent)]
    Docker(#[from] bollard::errors::Error),
    #[error("{0}")]
    Load(String),
    #[error("{0} is not there after the load")]
    NotLoaded(String),
}

/// `docker save IMAGE | DOCKER_HOST=… docker load`, through the API, streamed.
async fn copy_image(from: &Docker, to: &Docker, image: &str) -> Result<(), CopyError> {
    if !crate::sandbox::image::image_exists(from, image)
        .await
        .unwrap_or(false)
    {
        return Err(CopyError::NotLocal(image.to_string()));
    }
    let tar = from.export_image(image);
    let opts = bollard::query_parameters::ImportImageOptionsBuilder::default()
        .quiet(true)
        .build();
    let mut load = to.import_image_stream(opts, tar, None);
    while let Some(step) = load.next().await {
        // The engine's own words: what the load said went wrong.
        if let Some(e) = step?.error_detail.and_then(|d| d.message) {
            return Err(CopyError::Load(e));
        }
    }
    if crate::sandbox::image::image_exists(to, image)
        .await
        .unwrap_or(false)
    {
        Ok(())
    } else {
        Err(CopyError::NotLoaded(image.to_string()))
    }
}

/// A task waiting for an engine, with the engines that died under it.
pub struct Queued<T> {
    pub task: T,
    pub retried_from: Vec<String>,
}

/// The queue the engines' workers share, and the count of tasks not yet recorded (a worker
/// with nothing to take waits while some are out: a dying engine may hand one back).
pub struct Queue<T> {
    items: Mutex<VecDeque<Queued<T>>>,
    outstanding: AtomicUsize,
    changed: tokio::sync::Notify,
}

impl<T> Queue<T> {
    pub fn new(tasks: impl IntoIterator<Item = T>) -> Queue<T> {
        let items: VecDeque<Queued<T>> = tasks
            .into_iter()
            .map(|task| Queued {
                task,
                retried_from: Vec::new(),
            })
            .collect();
        Queue {
            outstanding: AtomicUsize::new(items.len()),
            items: Mutex::new(items),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued<T>>> {
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next task, waiting while others are still out; `None` when all are recorded (or
    /// `stop` says this worker's engine is gone).
    pub async fn take(&self, stop: &AtomicBool) -> Option<Queued<T>> {
        loop {
            let notified = self.changed.notified();
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(q) = self.lock().pop_front() {
                return Some(q);
            }
            if self.outstanding.load(Ordering::Acquire) == 0 {
                return None;
            }
            // A timeout too: a wake-up between the check and the wait is not lost for long.
            let _ = tokio::time::timeout(Duration::from_millis(500), notified).await;
        }
    }

    /// Back to the front of the queue, for another engine.
    pub fn hand_back(&self, q: Queued<T>) {
        self.lock().push_front(q);
        self.changed.notify_waiters();
    }

    /// The task is recorded: one fewer out.
    pub fn done(&self) {
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// What no engine took (every engine died).
    pub fn drain(&self) -> Vec<Queued<T>> {
        self.lock().drain(..).collect()
    }
}

/// Per engine, over the results of this run: tasks, and tasks per minute from its first start
/// to its last finish.
pub fn throughput(results: &[TaskResult]) -> Vec<(String, usize, f64)> {
    let mut by: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
    for r in results {
        let Some(engine) = &r.engine else { continue };
        let e = by
            .entry(engine.clone())
            .or_insert((0, f64::INFINITY, f64::NEG_INFINITY));
        e.0 += 1;
        e.1 = e.1.min(r.started_at);
        e.2 = e.2.max(r.finished_at);
    }
    by.into_iter()
        .map(|(name, (n, first, last))| {
            let span = last - first;
            let per_min = if span > 0.0 { n as f64 * 60.0 / span } else { 0.0 };
            (name, n, per_min)
        })
        .collect()
}

/// The engines section of summary.md.
pub fn markdown(rows: &[(String, usize, f64)], retried: &HashMap<String, usize>) -> String {
    let mut s = String::from(
        "\n## Engines\n\n| engine | tasks | tasks/min | tasks retried elsewhere after it died |\n|---|---|---|---|\n",
    );
    for (name, n, per_min) in rows {
        s.push_str(&format!(
            "| {} | {n} | {per_min:.1} | {} |\n",
            super::markdown::inline(name),
            retried.get(name).copied().unwrap_or(0)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_handed_back_task_is_taken_again_and_the_queue_ends_when_all_are_done() {
        let q = std::sync::Arc::new(Queue::new([1, 2]));
        let running = AtomicBool::new(false);
        let a = q.take(&running).await.unwrap();
        let b = q.take(&running).await.unwrap();
        // A worker waits while two are out; one comes back and it gets that one.
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.take(&AtomicBool::new(false)).await.map(|t| t.task) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        q.hand_back(Queued {
            task: a.task,
            retried_from: vec!["x".into()],
        });
        assert_eq!(waiter.await.unwrap(), Some(1));
        q.done();
        q.done();
        let _ = b;
        assert!(
            q.take(&running).await.is_none(),
            "all recorded: nothing left to wait for"
        );
        assert!(
            q.take(&AtomicBool::new(true)).await.is_none(),
            "a stopped worker takes nothing"
        );
    }

    #[test]
    fn throughput_is_per_engine() {
        let mut a = TaskResult::for_test("a");
        a.engine = Some("e1".into());
        a.started_at = 0.0;
        a.finished_at = 30.0;
        let mut b = a.clone();
        b.started_at = 30.0;
        b.finished_at = 60.0;
        let mut c = TaskResult::for_test("c");
        c.engine = Some("e2".into());
        c.started_at = 0.0;
        c.finished_at = 60.0;
        let rows = throughput(&[a, b, c]);
        assert_eq!(rows, vec![("e1".into(), 2, 2.0), ("e2".into(), 1, 1.0)]);
    }
}
