//! What repair asks the model: the system prompt for the reply's form, the budget the prompt is
//! planned in, and the prompt itself.

use crate::cli::RepairReply;
use crate::session::Session;

use super::{focus, localise};

/// The context the prompt is planned for, in tokens: the local model's (`scripts/serve-local-model`
/// serves Qwen2.5-Coder-1.5B with 16384), the smallest agentbox is meant to work with. Larger
/// models have more; the prompt stays this small anyway, which also keeps it fast on a CPU.
pub const CONTEXT_TOKENS: u32 = 16384;
/// Room for the reply: whole files, however low `--max-tokens` is (the small-model preset's
/// 1024 is for a loop's short calls).
pub(super) const MIN_REPLY_TOKENS: u32 = 4096;
/// The system prompt, the task and the instructions, in tokens, with room to spare.
const PROMPT_OVERHEAD_TOKENS: u32 = 1200;
/// Bytes per token of source code: a deliberately low figure (code usually runs 3 to 4), so
/// that the budget errs on the small side.
const BYTES_PER_TOKEN: u32 = 3;

/// The system prompt, before the sentence that says how files come back.
const SYSTEM: &str = "You fix bugs in code. You are given a task, the output of the project's failing \
     tests, the test files and the source files. The tests are the specification: never change them. \
     Find the bug, then reply with the complete corrected content of each source file you change: \
     the whole file, every line of it, not only the changed part. Change as little as needed and keep \
     everything else exactly as it is.";
const SYSTEM_TEXT: &str = " For each file you change, write its path on a line of its own, then the \
     whole file in a fenced code block.";
const SYSTEM_TOOLS: &str = " Call write_file once for each file you change, with the whole file as content.";
/// The system prompt for `--repair-reply blocks`: only the lines that change come back.
const SYSTEM_BLOCKS: &str = "You fix bugs in code. You are given a task, the output of the project's failing \
     tests, the test files and the source files. The tests are the specification: never change them. \
     Find the bug, then reply with one search/replace block for each change, in this form:\n\n\
     path/of/the/file.py\n\
     <<<<<<< SEARCH\n\
     the lines to change, copied exactly from the file\n\
     =======\n\
     the corrected lines\n\
     >>>>>>> REPLACE\n\n\
     Copy whole lines into SEARCH, with their indentation, and enough of them to find the place. \
     Fix every bug the failing tests show; change as little as needed.";
/// The system prompt for `--repair-reply functions`: only the functions that change
/// ([`super::splice`] writes them into their files). A 1.5B model asked for whole files mostly
/// gave them back unchanged, 30-60 s each on 2 cores; a function is a few seconds. Asked to say
/// first which line is wrong, it wrote only that sentence, in 9 of 13 replies (no code at all).
const SYSTEM_FUNCTIONS: &str = "You fix bugs in code. You are given a task, the output of the project's failing \
     tests, the test files and the source files. The tests are the specification: never change them. \
     The source code as shown fails those tests, so some line of it must change. Reply with each \
     function you change: the file's path on a line of its own, then the whole corrected function, \
     from its first line to its last, in a fenced code block. Give back only the functions you \
     change, and change as little as needed.";
/// The reply's room beyond the files it may rewrite: a whole file comes back a little longer
/// than it went out (JSON escapes, a fence, a changed line), and a reply that runs on past
/// that is a runaway (one ran to 4 096 tokens, 7 minutes on 2 cores).
const REPLY_SLACK_TOKENS: u32 = 256;

/// The system prompt for `reply`, with the project's own notes (AGENTS.md) as the loop's system
/// prompt has them: conventions a fix must follow ("money is integer cents").
pub(super) async fn system(session: &Session, reply: RepairReply) -> String {
    let mut system = match reply {
        RepairReply::Text => format!("{SYSTEM}{SYSTEM_TEXT}"),
        RepairReply::Tools => format!("{SYSTEM}{SYSTEM_TOOLS}"),
        RepairReply::Blocks => SYSTEM_BLOCKS.to_string(),
        RepairReply::Functions => SYSTEM_FUNCTIONS.to_string(),
    };
    if let Ok(Some(text)) = crate::session::prompt::project_instructions(&session.sandbox).await {
        system.push_str("\n\n# Instructions from the project (its AGENTS.md)\n\n");
        system.push_str(text.trim());
        system.push('\n');
    }
    system
}

/// The bytes of files the prompt may show: the context less the reply, the overhead and the
/// system prompt.
pub(super) fn budget(reply_tokens: u32, system: &str) -> usize {
    (CONTEXT_TOKENS.saturating_sub(reply_tokens + PROMPT_OVERHEAD_TOKENS) * BYTES_PER_TOKEN)
        .saturating_sub(system.len() as u32) as usize
}

/// The reply's `max_tokens`: room for every shown source file rewritten (at the budget's
/// bytes per token, half as much again, and some slack), within what the budget planned, and
/// never below the user's own `--max-tokens`.
pub(super) fn reply_limit(loc: &localise::Localised, planned: u32, max_tokens: u32) -> u32 {
    let bytes: usize = loc.shown.iter().filter(|f| !f.test).map(|f| f.text.len()).sum();
    let files = u32::try_from(bytes).unwrap_or(u32::MAX) / BYTES_PER_TOKEN;
    files
        .saturating_add(files / 2)
        .saturating_add(REPLY_SLACK_TOKENS)
        .min(planned)
        .max(max_tokens)
}

/// The prompt: the task, the failing output, the tests (read-only), the sources to rewrite;
/// in a later round, first what the round before fixed (`progress`).
/// With `focus`, a paragraph about that one failing test comes last before the reply's form:
/// the rest of the prompt is the round's first candidate's, a prefix the model's server can
/// keep in its cache.
pub(super) fn prompt(
    task: &str,
    loc: &localise::Localised,
    reply: RepairReply,
    progress: Option<&str>,
    focus: Option<&str>,
) -> String {
    let mut s = match progress {
        Some(p) => format!(
            "{task}\n\n{p}\n\nThe tests that still fail:\n{}\n",
            loc.failing.trim_end()
        ),
        None => format!("{task}\n\nThe tests fail now:\n{}\n", loc.failing.trim_end()),
    };
    let block =
        |f: &localise::Shown| format!("\n### {}\n```\n{}\n```\n", f.path, f.text.trim_end_matches('\n'));
    let tests: Vec<String> = loc.shown.iter().filter(|f| f.test).map(block).collect();
    if !tests.is_empty() {
        s.push_str("\nThe test files (the specification: do not change them):\n");
        s.push_str(&tests.concat());
    }
    s.push_str("\nThe source files:\n");
    s.push_str(
        &loc.shown
            .iter()
            .filter(|f| !f.test)
            .map(block)
            .collect::<String>(),
    );
    if !loc.left_out.is_empty() {
        s.push_str(&format!(
            "\nOther source files, not shown: {}\n",
            loc.left_out.join(", ")
        ));
    }
    if let Some(test) = focus {
        s.push_str(&focus::paragraph(loc, test));
    }
    s.push_str(match reply {
        RepairReply::Text => {
            "\nReply with each source file you change: its path on a line of its own, then the complete \
             corrected file in a fenced code block.\n"
        }
        RepairReply::Tools => {
            "\nReply with write_file calls, one for each source file you change, each with the complete \
             corrected file. If you cannot call tools, write each changed file's path on a line of its \
             own followed by the whole file in a fenced code block.\n"
        }
        RepairReply::Functions => {
            "\nReply with each function you change, code first: the file's path on a line of its own, then \
             the whole corrected function in a fenced code block.\n"
        }
        RepairReply::Blocks => {
            "\nReply with a search/replace block for each change: the file's path on a line of its own, \
             then <<<<<<< SEARCH, the lines as they are, =======, the corrected lines, >>>>>>> REPLACE.\n"
        }
    });
    s
}
