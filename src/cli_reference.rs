//! The book's command reference (`docs/src/reference/`), written from the clap definitions so it
//! cannot drift from `--help`: one page per command, its options under the headings `--help`
//! shows. `just docs` writes the pages; the test below fails while they are stale.

use std::fmt::Write as _;

/// Where the pages go, relative to the repository's root.
pub const DIR: &str = "docs/src/reference";

/// Every page of the reference: (file name, markdown), the index first.
pub fn pages() -> Vec<(String, String)> {
    let mut root = crate::cli::command();
    root.build();
    let mut index = String::from(
        "# Command reference\n\n\
         Written from agentbox's own command-line definitions by `just docs` (a test fails while \
         these pages are stale), so each page says what `agentbox COMMAND --help` says. \
         `-h` shows the few options a user needs first; `--help` shows every one.\n\n",
    );
    let _ = writeln!(index, "```text\n{}\n```\n", usage(&root));
    index.push_str("| command | what it does |\n|---|---|\n");
    let mut pages = Vec::new();
    for sub in root.get_subcommands().filter(|s| listed(s)) {
        let name = sub.get_name();
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        let _ = writeln!(index, "| [`{name}`]({name}.md) | {} |", inline(&about));
        let mut page = String::new();
        command_section(&mut page, sub, 1);
        pages.push((format!("{name}.md"), page));
    }
    index.push_str("\nOptions of every command:\n\n");
    for arg in root.get_arguments().filter(|a| shown(a)) {
        arg_item(&mut index, arg);
    }
    pages.insert(0, ("index.md".to_string(), index));
    pages
}

fn usage(cmd: &clap::Command) -> String {
    cmd.clone().render_usage().to_string()
}

/// Not clap's own `help` subcommand, nor a hidden one.
fn listed(cmd: &clap::Command) -> bool {
    !cmd.is_hide_set() && cmd.get_name() != "help"
}

/// Not the generated `--help`/`--version`, nor what is hidden from `--help`.
fn shown(arg: &clap::Arg) -> bool {
    !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
}

fn command_section(out: &mut String, cmd: &clap::Command, level: usize) {
    let hashes = "#".repeat(level);
    let _ = writeln!(
        out,
        "{hashes} `{}`\n",
        cmd.get_bin_name().unwrap_or(cmd.get_name())
    );
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        let _ = writeln!(out, "{}\n", inline(&about.to_string()));
    }
    let _ = writeln!(out, "```text\n{}\n```\n", usage(cmd));
    // The headings in the order `--help` shows them: arguments, options, then each named one
    // where its first option comes.
    let args: Vec<&clap::Arg> = cmd.get_arguments().filter(|a| shown(a)).collect();
    let mut headings: Vec<&str> = Vec::new();
    if args.iter().any(|a| a.is_positional()) {
        headings.push("Arguments");
    }
    if args
        .iter()
        .any(|a| !a.is_positional() && a.get_help_heading().is_none())
    {
        headings.push("Options");
    }
    for arg in &args {
        if let Some(h) = arg.get_help_heading()
            && !headings.contains(&h)
        {
            headings.push(h);
        }
    }
    for heading in headings {
        let _ = writeln!(out, "{hashes}# {heading}\n");
        for arg in &args {
            let under = match (arg.is_positional(), arg.get_help_heading()) {
                (true, _) => "Arguments",
                (false, None) => "Options",
                (false, Some(h)) => h,
            };
            if under == heading {
                arg_item(out, arg);
            }
        }
        out.push('\n');
    }
    for sub in cmd.get_subcommands().filter(|s| listed(s)) {
        command_section(out, sub, level + 1);
    }
}

fn arg_item(out: &mut String, arg: &clap::Arg) {
    let value = arg
        .get_value_names()
        .map(|names| {
            names
                .iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("<{}>", arg.get_id().as_str().to_uppercase()));
    let takes_value = arg.get_action().takes_values();
    let name = match (arg.get_short(), arg.get_long()) {
        _ if arg.is_positional() => value.clone(),
        (Some(s), Some(l)) => format!("-{s}, --{l}"),
        (None, Some(l)) => format!("--{l}"),
        (Some(s), None) => format!("-{s}"),
        (None, None) => arg.get_id().to_string(),
    };
    let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
    let name = match (
        takes_value && !arg.is_positional(),
        arg.is_require_equals_set(),
        optional,
    ) {
        (false, ..) => name,
        (true, true, true) => format!("{name}[={value}]"),
        (true, true, false) => format!("{name}={value}"),
        (true, false, _) => format!("{name} {value}"),
    };
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let mut line = format!("- `{name}`: {}", sentence(&inline(&help)));
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    // A flag's default (false, 0) says nothing.
    if !defaults.is_empty() && takes_value && !arg.is_hide_default_value_set() {
        let _ = write!(line, " Default: `{}`.", defaults.join(","));
    }
    if let Some(env) = arg.get_env()
        && !arg.is_hide_env_set()
    {
        let _ = write!(line, " Environment: `{}`.", env.to_string_lossy());
    }
    let values: Vec<String> = if arg.is_hide_possible_values_set() {
        Vec::new()
    } else {
        arg.get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| match v.get_help() {
                Some(h) => format!("`{}` ({})", v.get_name(), inline(&h.to_string())),
                None => format!("`{}`", v.get_name()),
            })
            .collect()
    };
    // A flag's "true"/"false" are not worth listing.
    if !values.is_empty() && takes_value {
        let _ = write!(line, " Values: {}.", values.join(", "));
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

/// Text that ends as a sentence does, so what follows it reads as the next one.
fn sentence(text: &str) -> String {
    match text.chars().last() {
        None => String::new(),
        Some('.' | '!' | '?' | ':') => text.to_string(),
        Some(_) => format!("{text}."),
    }
}

/// Help text as one markdown line: newlines joined, and outside `code spans` the characters
/// markdown would take for markup escaped.
fn inline(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(joined.len());
    for (i, part) in joined.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        if i % 2 == 1 {
            out.push_str(part);
            continue;
        }
        let chars: Vec<char> = part.chars().collect();
        for (j, &c) in chars.iter().enumerate() {
            let word = |k: Option<usize>| k.and_then(|k| chars.get(k)).is_some_and(|c| c.is_alphanumeric());
            match c {
                '<' => out.push_str("&lt;"),
                '>' => out.push_str("&gt;"),
                // Inside a word (RUST_LOG) an underscore is no emphasis.
                '_' if word(j.checked_sub(1)) && word(Some(j + 1)) => out.push(c),
                '*' | '_' | '\\' | '|' => {
                    out.push('\\');
                    out.push(c);
                }
                c => out.push(c),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(DIR)
    }

    /// `just docs` runs this with AGENTBOX_WRITE_REFERENCE=1 to write the pages; otherwise it
    /// fails while any page differs from what the definitions say, or is not in the book.
    #[test]
    fn reference_pages_are_current() {
        let pages = pages();
        let dir = dir();
        if std::env::var_os("AGENTBOX_WRITE_REFERENCE").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "md") {
                    std::fs::remove_file(path).unwrap();
                }
            }
            for (name, text) in &pages {
                std::fs::write(dir.join(name), text).unwrap();
            }
            return;
        }
        let stale = "stale: run `just docs` and commit docs/src/reference";
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut expected: Vec<String> = pages.iter().map(|(n, _)| n.clone()).collect();
        expected.sort();
        assert_eq!(on_disk, expected, "{stale}");
        for (name, text) in &pages {
            let found = std::fs::read_to_string(dir.join(name)).unwrap();
            assert!(found == *text, "{name} is {stale}");
        }
        let summary =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/SUMMARY.md"))
                .unwrap();
        for (name, _) in &pages {
            assert!(
                summary.contains(&format!("(reference/{name})")),
                "docs/src/SUMMARY.md does not link reference/{name}"
            );
        }
    }

    #[test]
    fn every_option_of_run_is_on_its_page() {
        let pages = pages();
        let run = &pages.iter().find(|(n, _)| n == "run.md").unwrap().1;
        for long in [
            "--small-model",
            "--memory",
            "--allow-host",
            "--isolate",
            "--strategy",
        ] {
            assert!(run.contains(&format!("`{long}")), "{long} missing:\n{run}");
        }
        assert!(
            run.contains("## Model\n") && run.contains("## Sandbox\n"),
            "{run}"
        );
    }

    fn help(args: &[&str]) -> String {
        match crate::cli::command().try_get_matches_from(args) {
            Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.render().to_string(),
            other => panic!("{args:?} did not print help: {other:?}"),
        }
    }

    #[test]
    fn short_help_shows_the_first_needs_and_long_help_every_option_under_its_heading() {
        let short = help(&["agentbox", "run", "-h"]);
        let long = help(&["agentbox", "run", "--help"]);
        for shown in [
            "--model",
            "--small-model",
            "--image",
            "--test-cmd",
            "--isolate",
            "--json",
        ] {
            assert!(short.contains(shown) && long.contains(shown), "{shown}:\n{short}");
        }
        for hidden in [
            "--memory",
            "--pids-limit",
            "--tmp-size",
            "--candidate-jobs",
            "--ca-cert",
        ] {
            assert!(
                !short.contains(hidden) && long.contains(hidden),
                "{hidden}:\n{short}"
            );
        }
        // The model's options come before the sandbox's resource knobs.
        let at = |text: &str, what: &str| text.find(what).unwrap();
        assert!(at(&long, "\nModel:") < at(&long, "\nSandbox:"), "{long}");
        assert!(at(&long, "--model ") < at(&long, "--memory "), "{long}");
        // Positionals stay under Arguments, not under a flattened struct's heading.
        assert!(at(&long, "\nArguments:") < at(&long, "\n  <PROJECT>"), "{long}");
        assert!(at(&long, "\n  <PROJECT>") < at(&long, "\nOptions:"), "{long}");
    }

    #[test]
    fn markup_outside_code_is_escaped() {
        assert_eq!(
            inline("a *.SUFFIX and `x*y`\n  <FILE>"),
            "a \\*.SUFFIX and `x*y` &lt;FILE&gt;"
        );
    }
}
