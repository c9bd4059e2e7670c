//! `agentbox shell` and `exec -it/-i` driven as a person would: agentbox on a pseudo-terminal
//! the test opens, keys typed into it, the screen read back. Real Docker, real image.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::pty::{Pty, WAIT, termios_of};
use crate::support::{Project, agentbox, containers_of_pid, docker, eventually, run, text};

async fn assert_no_container_of(pid: u32) {
    let docker = docker().await;
    let gone = eventually(Duration::from_secs(30), || {
        let docker = docker.clone();
        async move { containers_of_pid(&docker, pid).await == 0 }
    })
    .await;
    assert!(gone, "a container of the shell session is left");
}

#[tokio::test]
async fn a_shell_on_a_terminal_behaves_like_one() {
    let _ = docker().await;
    let project = Project::new(&[("hello.txt", "hi\n")]);
    let path = project.path().to_str().unwrap().to_string();
    let name = project.path().file_name().unwrap().to_str().unwrap().to_string();
    let mut pty = Pty::spawn(&["shell", &path]);
    let before = termios_of(pty.slave.as_raw_fd());
    let pid = pty.child.id();

    // The prompt says where the user is, even after bash's start-up files ran.
    let prompt = format!("[agentbox {name}] /workspace $ ");
    let mut at = pty.wait_for(&prompt, 0);

    pty.type_keys("id -u; tty; cat hello.txt\r");
    at = pty.wait_for(&prompt, at);
    let screen = pty.screen();
    let expected_uid = if crate::support::is_root() {
        crate::support::TEST_UID.to_string()
    } else {
        unsafe { libc::getuid() }.to_string()
    };
    assert!(
        screen.contains(&format!("{expected_uid}\r\n/dev/pts/")),
        "{screen}"
    );
    assert!(screen.contains("/dev/pts/"), "not a terminal inside: {screen}");

    // A resize of the host terminal reaches the shell's.
    pty.resize(41, 101);
    let start = Instant::now();
    loop {
        pty.type_keys("stty size\r");
        at = pty.wait_for(&prompt, at);
        if pty.screen().contains("41 101") {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "the resize never arrived: {}",
            pty.screen()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Ctrl-C ends the running command, not the session.
    pty.type_keys("echo started-$((1+2)); sleep 300; echo after-$((2+2))\r");
    at = pty.wait_for("started-3", at);
    pty.type_keys("\x03");
    at = pty.wait_for(&prompt, at);
    pty.type_keys("echo still-$((2+3))\r");
    at = pty.wait_for("still-5", at);
    assert!(!pty.screen().contains("after-4"), "{}", pty.screen());

    // The file the user made is named first, not buried under what pytest writes.
    pty.type_keys(
        "mkdir -p .pytest_cache/v/cache && touch .pytest_cache/{a,b,c,d,e,f}; echo new > made.txt; exit 3\r",
    );
    let _ = at;
    assert_eq!(pty.wait_exit(), 3, "{}", pty.screen());
    std::thread::sleep(Duration::from_millis(200));
    let screen = pty.screen();
    assert!(
        screen.contains("agentbox: sandbox removed; 1 path changed in ")
            && screen
                .contains(": made.txt\r\nagentbox: and 9 paths in caches and build output (.pytest_cache)"),
        "no summary of the change: {screen}"
    );
    assert_eq!(project.read("made.txt"), "new\n");

    // The terminal is as it was before agentbox made it raw.
    let after = termios_of(pty.slave.as_raw_fd());
    assert_eq!(before.c_lflag, after.c_lflag, "local modes not restored");
    assert_eq!(before.c_iflag, after.c_iflag, "input modes not restored");
    assert_eq!(before.c_oflag, after.c_oflag, "output modes not restored");
    assert_no_container_of(pid).await;
}

#[tokio::test]
async fn a_read_only_shell_cannot_write_and_exec_it_runs_a_command() {
    let _ = docker().await;
    let project = Project::new(&[("keep.txt", "kept\n")]);
    let path = project.path().to_str().unwrap().to_string();
    let mut pty = Pty::spawn(&[
        "shell",
        "--read-only",
        &path,
        "--",
        "sh",
        "-c",
        "cat keep.txt; echo x > keep.txt || exit 7",
    ]);
    let pid = pty.child.id();
    assert_eq!(pty.wait_exit(), 7, "{}", pty.screen());
    assert!(pty.screen().contains("kept"), "{}", pty.screen());
    assert!(pty.screen().contains("Read-only file system"), "{}", pty.screen());
    assert_eq!(project.read("keep.txt"), "kept\n");
    assert_no_container_of(pid).await;

    // `exec -it` is the same with a command, on a terminal.
    let mut pty = Pty::spawn(&["exec", "-it", &path, "--", "sh", "-c", "tty; exit 4"]);
    assert_eq!(pty.wait_exit(), 4, "{}", pty.screen());
    assert!(pty.screen().contains("/dev/pts/"), "{}", pty.screen());
}

#[tokio::test]
async fn exec_of_a_bare_shell_on_a_terminal_points_to_agentbox_shell() {
    let project = Project::new(&[]);
    let path = project.path().to_str().unwrap().to_string();
    let mut pty = Pty::spawn(&["exec", &path, "--", "bash"]);
    let code = pty.wait_exit();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(code, 2, "{}", pty.screen());
    assert!(pty.screen().contains("agentbox shell"), "{}", pty.screen());
}

#[test]
fn shell_without_a_terminal_refuses() {
    let project = Project::new(&[]);
    let out = agentbox()
        .args(["shell"])
        .arg(project.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("needs a terminal"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn exec_i_forwards_stdin() {
    let _ = docker().await;
    let project = Project::new(&[]);
    let mut child = agentbox()
        .args(["exec", "-i"])
        .arg(project.path())
        .args(["--", "sh", "-c", "tr a-z A-Z; echo done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\nworld\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "HELLO\nWORLD\ndone\n");
}

#[tokio::test]
async fn sigterm_restores_the_terminal_and_removes_the_sandbox() {
    let _ = docker().await;
    let project = Project::new(&[]);
    let path = project.path().to_str().unwrap().to_string();
    let name = project.path().file_name().unwrap().to_str().unwrap().to_string();
    let mut pty = Pty::spawn(&["shell", &path]);
    let before = termios_of(pty.slave.as_raw_fd());
    let pid = pty.child.id();
    pty.wait_for(&format!("[agentbox {name}] /workspace $ "), 0);
    // Raw now: the shell runs.
    assert_ne!(termios_of(pty.slave.as_raw_fd()).c_lflag, before.c_lflag);
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert_eq!(pty.wait_exit(), 143, "{}", pty.screen());
    let after = termios_of(pty.slave.as_raw_fd());
    assert_eq!(before.c_lflag, after.c_lflag, "local modes not restored");
    assert_eq!(before.c_iflag, after.c_iflag, "input modes not restored");
    assert_eq!(before.c_oflag, after.c_oflag, "output modes not restored");
    assert_no_container_of(pid).await;
}

/// `exec` writes output as it comes: a line printed before the command waits is read while the
/// command still runs (it waits for a file the test makes only after reading that line).
#[tokio::test]
async fn exec_streams_output_as_it_comes() {
    use std::io::BufRead;
    let _ = docker().await;
    let project = Project::new(&[]);
    let mut child = agentbox()
        .arg("exec")
        .arg(project.path())
        .args([
            "--",
            "sh",
            "-c",
            "echo early; while [ ! -e go ]; do sleep 0.1; done; echo late",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "early\n");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the command ended before its output came"
    );
    std::fs::write(project.file("go"), "").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "late\n");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[tokio::test]
async fn an_isolated_shell_leaves_the_project_alone_and_writes_a_patch() {
    let _ = docker().await;
    let project = Project::new(&[("a.txt", "one\n")]);
    let out = tempfile::tempdir().unwrap();
    let patch = out.path().join("shell.patch");
    let path = project.path().to_str().unwrap().to_string();
    let mut pty = Pty::spawn(&[
        "shell",
        "--isolate",
        "--patch",
        patch.to_str().unwrap(),
        &path,
        "--",
        "sh",
        "-c",
        "echo two > a.txt; echo new > b.txt",
    ]);
    let pid = pty.child.id();
    assert_eq!(pty.wait_exit(), 0, "{}", pty.screen());
    assert_eq!(project.read("a.txt"), "one\n");
    assert!(!project.file("b.txt").exists());
    let written = std::fs::read_to_string(&patch).unwrap();
    assert!(written.contains("+two") && written.contains("+new"), "{written}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(pty.screen().contains(patch.to_str().unwrap()), "{}", pty.screen());
    assert_no_container_of(pid).await;
}

#[tokio::test]
async fn a_shell_in_an_environment_resumes_it_and_leaves_the_project_alone() {
    let _ = docker().await;
    let project = Project::new(&[("a.txt", "one\n")]);
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap().to_string();
    let env = format!("it-shell-{}", uuid::Uuid::new_v4().simple());
    let path = project.path().to_str().unwrap().to_string();
    let shell = |script: &str| {
        let mut pty = Pty::spawn_with(
            &["shell", "--env", &env, &path, "--", "sh", "-c", script],
            &[("AGENTBOX_DATA_DIR", &data_dir)],
        );
        let pid = pty.child.id();
        let code = pty.wait_exit();
        std::thread::sleep(Duration::from_millis(200));
        (code, pty.screen(), pid)
    };
    let (code, screen, pid) = shell("echo two > a.txt");
    assert_eq!(code, 0, "{screen}");
    assert!(
        screen.contains(&format!("1 file changed in environment {env}")),
        "{screen}"
    );
    assert_eq!(project.read("a.txt"), "one\n");
    assert_no_container_of(pid).await;

    // The second session is in the same copy.
    let (code, screen, _) = shell("grep -q two a.txt");
    assert_eq!(code, 0, "{screen}");

    let mut cmd = agentbox();
    cmd.env("AGENTBOX_DATA_DIR", data.path())
        .args(["env", "show", &env]);
    let shown = text(&run(&mut cmd).stdout);
    assert!(
        shown.contains("shell: sh -c echo two > a.txt") && shown.contains("exit 0"),
        "{shown}"
    );
    let mut cmd = agentbox();
    cmd.env("AGENTBOX_DATA_DIR", data.path())
        .args(["env", "rm", &env]);
    assert_eq!(run(&mut cmd).status.code(), Some(0));
}
