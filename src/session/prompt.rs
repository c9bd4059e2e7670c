//! The system prompt, and the project's own instructions (AGENTS.md / CLAUDE.md).

use crate::sandbox::Sandbox;
use crate::workspace::{FsError, Workspace};

/// Largest AGENTS.md appended to the prompt; more is cut, and the cut said.
pub const MAX_PROJECT_INSTRUCTIONS: usize = 16 * 1024;

pub fn system_prompt(
    test_commands: &[String],
    finish_tool: bool,
    shell: bool,
    project_instructions: Option<&str>,
) -> String {
    let mut s = String::from(
        "You are a careful software engineer working on a project. The project is at /workspace in \
         an isolated container with no network access; you work on it only through the tools.\n\n\
         How to work:\n\
         - Work in small steps. First look around: list the files and read the ones that matter.\n\
         - Read a file before you edit it, and make the smallest change that does the job, in the \
         project's own style.\n\
         - After editing, run the tests and read the result.\n\
         - Never edit a test to make it pass, unless the task says that the test itself is wrong.\n\
         - Paths are relative to the project root.\n",
    );
    if !shell {
        s.push_str("- There is no shell: use the file tools and run_tests.\n");
    }
    match test_commands {
        [] => s.push_str("- No test command is known for this project.\n"),
        [cmd] => s.push_str(&format!("- run_tests runs `{cmd}`.\n")),
        many => s.push_str(&format!(
            "- run_tests runs each of {}; the tests pass only when all of them pass.\n",
            many.iter()
                .map(|c| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
    if finish_tool {
        s.push_str(
            "\nWhen the task is done, or you cannot make progress, call finish with a short summary of \
             what you changed and why.\n",
        );
    } else {
        s.push_str(
            "\nWhen the task is done, or you cannot make progress, reply without calling a tool: a \
             short summary of what you changed and why.\n",
        );
    }
    if let Some(text) = project_instructions {
        s.push_str("\n# Instructions from the project (its AGENTS.md)\n\n");
        s.push_str(text.trim());
        s.push('\n');
    }
    s
}

/// AGENTS.md, else CLAUDE.md, at the project root, read through the sandbox and size-capped.
pub async fn project_instructions(sandbox: &dyn Sandbox) -> Result<Option<String>, FsError> {
    let ws = Workspace::new(sandbox);
    for name in ["AGENTS.md", "CLAUDE.md"] {
        match ws.read(name, MAX_PROJECT_INSTRUCTIONS).await {
            Ok(file) => {
                let mut text = String::from_utf8_lossy(&file.data).into_owned();
                if !file.complete() {
                    text.push_str(&format!("\n[... {name} cut at {MAX_PROJECT_INSTRUCTIONS} bytes]"));
                }
                return Ok(Some(text));
            }
            Err(
                FsError::NotFound(_)
                | FsError::IsDirectory(_)
                | FsError::NotRegular(_)
                | FsError::Outside { .. },
            ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_carries_the_rules() {
        let p = system_prompt(&["pytest -q".into()], true, true, Some("Use integer cents."));
        assert!(p.contains("Never edit a test to make it pass"));
        assert!(p.contains("run_tests runs `pytest -q`"));
        assert!(p.contains("call finish"));
        assert!(p.ends_with("Use integer cents.\n"));
        assert!(system_prompt(&[], false, false, None).contains("There is no shell"));
        let both = system_prompt(&["cargo test".into(), "make test".into()], false, true, None);
        assert!(
            both.contains("run_tests runs each of `cargo test`, `make test`; the tests pass only when all")
        );
    }
}
