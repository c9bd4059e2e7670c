//! What may reach the terminal is checked by the compiler: the printing macros refuse a raw
//! `String`, a borrowed `&str`, a path and a name captured inside the format literal, and take
//! `Escaped`, numbers and agentbox's own literals (src/output.rs).
//!
//! Each case is compiled by rustc against the agentbox library this test links with (only
//! type-checked, `--emit=metadata`): a second build of every dependency (as trybuild makes, in
//! its own target directory) cost over 20 minutes on the shared 2-core machine.

use std::path::PathBuf;
use std::process::Command;

/// `target/debug/deps`, where this test and the library it links are.
fn deps() -> PathBuf {
    std::env::current_exe().unwrap().parent().unwrap().to_path_buf()
}

/// The newest `libagentbox-*.rlib` there: the one this test was built against.
fn library() -> PathBuf {
    std::fs::read_dir(deps())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("libagentbox-") && n.ends_with(".rlib")
        })
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
        .expect("libagentbox's rlib beside this test")
}

/// Type-check `main` as a binary using agentbox: (compiled, rustc's messages).
fn check(main: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("main.rs");
    std::fs::write(&src, main).unwrap();
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .args([
            "--edition",
            "2024",
            "--crate-type",
            "bin",
            "--emit=metadata",
            "--crate-name",
            "case",
        ])
        .arg("--out-dir")
        .arg(dir.path())
        .arg("--extern")
        .arg(format!("agentbox={}", library().display()))
        .arg("-L")
        .arg(format!("dependency={}", deps().display()))
        .arg(&src)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn refused(what: &str, main: &str, because: &str) {
    let (ok, messages) = check(main);
    assert!(!ok, "{what} compiled:\n{main}");
    assert!(
        messages.contains(because),
        "{what}: not refused for {because:?}:\n{messages}"
    );
}

#[test]
fn raw_text_does_not_compile() {
    refused(
        "a String",
        r#"fn main() { let w = String::from("x"); agentbox::errln!("agentbox: WARNING: {}", w); }"#,
        "may carry text from the sandbox, the repository, the model or the network",
    );
    refused(
        "a path",
        r#"fn main() { let p = std::path::PathBuf::from("x"); agentbox::outln!("patch: {}", p.display()); }"#,
        "may carry text from the sandbox",
    );
    refused(
        "an error",
        r#"fn main() { let e = std::io::Error::other("x"); agentbox::err!("{}", e); }"#,
        "may carry text from the sandbox",
    );
    refused(
        "a borrowed &str",
        r#"fn say(line: &str) { agentbox::outln!("{}", line); } fn main() { say("x"); }"#,
        "borrowed data escapes",
    );
    refused(
        "a name captured inside the literal",
        r#"fn main() { let warning = String::from("x"); agentbox::errln!("agentbox: WARNING: {warning}"); }"#,
        "a name inside the format literal is not checked for the terminal",
    );
    refused(
        "a named width",
        r#"fn main() { let w = 5usize; agentbox::outln!("{:w$}", 1); }"#,
        "a named width or precision",
    );
}

#[test]
fn escaped_text_numbers_and_literals_compile() {
    let (ok, messages) = check(
        r#"
use agentbox::output::{escaped, for_terminal};
fn main() {
    let warning = String::from("from the repository \x1b]0;title\x07");
    let p = std::path::PathBuf::from("x");
    agentbox::errln!("agentbox: WARNING: {} ({} of {:>3})", escaped(&warning), 1, 2usize);
    agentbox::outln!("patch: {}; {}; {}", escaped(p.display()), for_terminal(&warning), true);
    let line: agentbox::output::Escaped = agentbox::escaped!("{} {:.1}", "literal", 2.5);
    agentbox::out!("{}\n", line);
}
"#,
    );
    assert!(ok, "{messages}");
}
