//! The programs a Node project's `npm test` runs: the words that start each command of its
//! `test` script (and of the scripts it runs with `npm run NAME`), for the preflight, which
//! looks for each in `node_modules/.bin` and the image before any model request. A
//! devDependency that setup did not install (`--no-setup`, a failed fill) is then named,
//! instead of a `sh: 1: tsc: not found` the model would spend its turns on.

/// Scripts followed through `npm run NAME`, at most this deep.
const MAX_DEPTH: usize = 3;

/// Shell words that are no program to look for.
fn builtin(word: &str) -> bool {
    matches!(
        word,
        "cd" | "echo"
            | "exit"
            | "true"
            | "false"
            | "test"
            | "["
            | "export"
            | "set"
            | "exec"
            | "env"
            | "!"
            | "{"
            | "}"
            | "("
            | ")"
            | "if"
            | "then"
            | "else"
            | "fi"
            | "for"
            | "do"
            | "done"
            | "while"
            | "sh"
            | "bash"
            | "node"
            | "npm"
            | "npx"
    )
}

/// A plain program name (no path, no shell syntax): only those are looked for.
fn plain(word: &str) -> bool {
    !word.is_empty()
        && word.len() <= 100
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
        && !word.starts_with(['-', '.'])
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=')
        .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// The programs `npm test` runs, from `package.json`'s text, in order, each once.
pub fn test_programs(package_json: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(package_json) else {
        return Vec::new();
    };
    let scripts = v.get("scripts").and_then(|s| s.as_object());
    let script = |name: &str| scripts.and_then(|s| s.get(name)).and_then(|s| s.as_str());
    let mut out = Vec::new();
    let mut todo: Vec<(String, usize)> = ["pretest", "test", "posttest"]
        .iter()
        .filter_map(|n| script(n).map(|s| (s.to_string(), 0)))
        .collect();
    todo.reverse();
    while let Some((text, depth)) = todo.pop() {
        for command in text.split(['&', '|', ';', '\n']) {
            let mut words = command
                .split_whitespace()
                .skip_while(|w| is_assignment(w) || *w == "env" || *w == "!" || *w == "(");
            let Some(first) = words.next() else { continue };
            let rest: Vec<&str> = words.collect();
            match first {
                // `npm run NAME`, `npm run-script NAME`, `npm test`: that script's programs.
                "npm" | "yarn" | "pnpm" => {
                    let name = match rest.first() {
                        Some(&"run") | Some(&"run-script") => rest.get(1).copied(),
                        Some(&"test") | Some(&"t") => Some("test"),
                        Some(n) if first != "npm" => Some(*n),
                        _ => None,
                    };
                    if let Some(body) = name.and_then(script)
                        && depth < MAX_DEPTH
                        && name != Some("test")
                    {
                        todo.push((body.to_string(), depth + 1));
                    }
                }
                "npx" => {
                    if let Some(p) = rest.iter().find(|w| !w.starts_with('-'))
                        && plain(p)
                        && !out.iter().any(|o| o == p)
                    {
                        out.push(p.to_string());
                    }
                }
                p if plain(p) && !builtin(p) && !out.iter().any(|o| o == p) => out.push(p.to_string()),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_a_test_script_runs() {
        let pkg = br#"{"scripts": {
            "test": "xo && NODE_ENV=test c8 ava; npm run build",
            "build": "tsc -p . && echo built",
            "pretest": "npx eslint ."
        }}"#;
        // `ava` is c8's argument: c8 is the program.
        assert_eq!(test_programs(pkg), ["eslint", "xo", "c8", "tsc"]);
        assert_eq!(
            test_programs(br#"{"scripts": {"test": "node test.js"}}"#),
            Vec::<String>::new()
        );
        assert_eq!(
            test_programs(br#"{"scripts": {"test": "./run.sh $(whoami) | tee out"}}"#),
            ["tee"]
        );
        assert!(test_programs(b"not json").is_empty());
        // A script that runs itself ends.
        assert_eq!(
            test_programs(br#"{"scripts": {"test": "jest", "a": "npm run a"}}"#),
            ["jest"]
        );
    }
}
