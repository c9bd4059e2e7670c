//! The checks between `agentbox run` and the first model request, in this order, each able to
//! stop the run before the model is asked anything:
//!
//! 1. [`Step::ModelEndpoint`]: the model's endpoint accepts a connection (TCP, and the TLS
//!    handshake for https; no request). Before any sandbox work, so an unreachable model fails
//!    in seconds with exit 4. Skipped for the scripted provider.
//! 2. [`Step::Setup`]: the project's setup phase (see `setup_phase`), in a container of its
//!    own with egress through the allowlisting proxy, or its cache; a failure stops the run
//!    with exit 4 and the setup's output. It may install what the tests need, so it comes
//!    before the program check.
//! 3. [`Step::Sandbox`]: the agent's sandbox starts, its image present or built.
//! 4. [`Step::TestPrograms`]: each test command's program exists in the sandbox (`command -v
//!    cargo`; for `python3 -m pytest` the module; for a detected `npm test`, the programs its
//!    script starts, in `node_modules/.bin` or the image). Otherwise the run stops with exit 2,
//!    naming the image, the programs and the fix, without a model request.
//! 5. [`Step::TestsBefore`]: the tests run once (see `before`): their counts for the report
//!    and the verdict; when they cannot start for want of a dependency the project declares,
//!    the run stops with exit 2, naming it and how to install it.
//!
//! Each step reports itself as an [`Event::Preflight`], so a trajectory shows how far a run got.

use std::time::Duration;

use crate::config::{ModelConfig, UsageError};
use crate::events::{Event, EventSink};
use crate::model::ModelError;
use crate::project::{Ecosystem, TestCommand, program_check};
use crate::sandbox::image::KnownImage;
use crate::sandbox::{ExecRequest, Sandbox, SandboxError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    ModelEndpoint,
    Setup,
    Sandbox,
    TestPrograms,
    TestsBefore,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::ModelEndpoint => "model_endpoint",
            Step::Setup => "setup",
            Step::Sandbox => "sandbox",
            Step::TestPrograms => "test_programs",
            Step::TestsBefore => "tests_before",
        }
    }
}

/// What one step found: passed, or failed and why, each with the words the report shows.
pub enum Outcome {
    Passed(String),
    Failed(String),
}

impl Outcome {
    /// A step's result in the report's words: what passed, or the error's message.
    pub fn of<T, E: std::fmt::Display>(result: &Result<T, E>, passed: impl FnOnce(&T) -> String) -> Self {
        match result {
            Ok(t) => Outcome::Passed(passed(t)),
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

pub fn report(events: &dyn EventSink, step: Step, outcome: Outcome) {
    let (ok, detail) = match outcome {
        Outcome::Passed(d) => (true, d),
        Outcome::Failed(d) => (false, d),
    };
    events.emit(&Event::Preflight {
        step: step.as_str(),
        ok,
        detail,
    });
}

/// Step 1.
pub async fn model_endpoint(model: &ModelConfig, events: &dyn EventSink) -> Result<(), ModelError> {
    if model.is_scripted() {
        report(
            events,
            Step::ModelEndpoint,
            Outcome::Passed("scripted: no endpoint".into()),
        );
        return Ok(());
    }
    let result =
        crate::model::preflight::check_endpoint(&model.base_url, crate::model::preflight::CONNECT_TIMEOUT)
            .await;
    report(
        events,
        Step::ModelEndpoint,
        Outcome::of(&result, |_| format!("{} accepts connections", model.base_url)),
    );
    result
}

/// How long one program check may take: `command -v` is instant, importing a module is not
/// much slower.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Which agentbox image has a program, for the hint.
fn image_with(program: &str) -> Option<String> {
    let eco = match program.split_whitespace().next()? {
        "cargo" | "rustc" => Ecosystem::Rust,
        "go" => Ecosystem::Go,
        "npm" | "node" | "npx" | "yarn" => Ecosystem::Node,
        p if p.starts_with("python") || p == "pytest" => Ecosystem::Python,
        _ => return None,
    };
    KnownImage::sandbox_named(eco.image_name()).map(|k| k.tag.to_string())
}

/// Step 4. `Err(Ok(..))`: a program is missing (a usage error, exit 2); `Err(Err(..))`: the
/// sandbox failed.
pub async fn test_programs(
    sandbox: &dyn Sandbox,
    project: &std::path::Path,
    commands: &[TestCommand],
    given: bool,
    image: &str,
    events: &dyn EventSink,
) -> Result<(), Result<UsageError, SandboxError>> {
    let mut missing = Vec::new();
    let mut checked = Vec::new();
    let mut script_missing: Vec<String> = Vec::new();
    for c in commands {
        // `npm test` runs its script's programs: each from node_modules/.bin (what setup
        // installed) or the image.
        if c.command == "npm test"
            && !given
            && let Ok(data) = crate::project::detect::read_project_file(project, "package.json")
        {
            for program in crate::project::node::test_programs(&data) {
                let check =
                    format!("[ -x node_modules/.bin/{program} ] || command -v {program} >/dev/null 2>&1");
                let out = sandbox
                    .exec(ExecRequest::argv(["sh", "-c", check.as_str()], CHECK_TIMEOUT).capture(1024, 1024))
                    .await
                    .map_err(Err)?;
                if !out.success() {
                    script_missing.push(program);
                }
            }
        }
        let Some((program, check)) = program_check(&c.command) else {
            continue;
        };
        let out = sandbox
            .exec(ExecRequest::argv(["sh", "-c", check.as_str()], CHECK_TIMEOUT).capture(1024, 1024))
            .await
            .map_err(Err)?;
        if out.success() {
            checked.push(program);
        } else {
            missing.push((program, c));
        }
    }
    if missing.is_empty() && !script_missing.is_empty() {
        let message = format!(
            "`npm test` (package.json's test script) runs {}, found neither in node_modules/.bin nor in \
             the sandbox image {image}. They are the project's devDependencies: setup installs them \
             (npm ci, or npm install without a lockfile) unless --no-setup is given; or give a test \
             command this image can run (--test-cmd CMD). No model request was made.",
            script_missing.join(", ")
        );
        report(events, Step::TestPrograms, Outcome::Failed(message.clone()));
        return Err(Ok(UsageError(message)));
    }
    if missing.is_empty() {
        report(
            events,
            Step::TestPrograms,
            Outcome::Passed(format!("found: {}", checked.join(", "))),
        );
        return Ok(());
    }
    let what: Vec<String> = missing
        .iter()
        .map(|(program, c)| {
            let from = if given || c.based_on.is_empty() {
                "given".to_string()
            } else {
                format!("detected from {}", c.based_on.join(", "))
            };
            format!("no {program}, which `{}` needs ({from})", c.command)
        })
        .collect();
    let other = missing
        .iter()
        .find_map(|(p, _)| image_with(p))
        .filter(|i| i != image)
        .map(|i| format!("--image {i}"))
        .unwrap_or_else(|| "--image IMAGE with an image that has it".into());
    let message = format!(
        "the sandbox image {image} has {}. Choose an image that has it ({other}), or give a test \
         command this image can run (--test-cmd CMD). No model request was made.",
        what.join("; and ")
    );
    report(events, Step::TestPrograms, Outcome::Failed(message.clone()));
    Err(Ok(UsageError(message)))
}
