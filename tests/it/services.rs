//! Services for tests (`--service`): a server in the sandbox's own network namespace, reached on
//! 127.0.0.1, locked down, one per sandbox, removed with it.

use serde_json::json;

use crate::support::scripted::{bash, done, hostile};
use crate::support::{Project, agentbox, docker, run, text};

/// A PostgreSQL client in the standard library only (the wire protocol's startup, trust
/// authentication, simple queries): the sandbox image has no driver, and the test must not
/// download one.
const PG_TEST: &str = r#"
import os, socket, struct

def exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("closed")
        b += c
    return b

def messages(s):
    while True:
        kind = exact(s, 1)
        (n,) = struct.unpack("!i", exact(s, 4))
        yield kind, exact(s, n - 4)

def query(sql):
    env = os.environ.get
    s = socket.create_connection((env("PGHOST", "127.0.0.1"), int(env("PGPORT", "5432"))), 5)
    params = b"user\0" + env("PGUSER", "postgres").encode() + b"\0database\0" + env("PGDATABASE", "postgres").encode() + b"\0\0"
    s.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
    for kind, body in messages(s):
        if kind == b"E":
            raise RuntimeError(body)
        if kind == b"Z":
            break
    q = sql.encode() + b"\0"
    s.sendall(b"Q" + struct.pack("!i", 4 + len(q)) + q)
    rows = []
    for kind, body in messages(s):
        if kind == b"E":
            raise RuntimeError(body)
        if kind == b"D":
            (cols,) = struct.unpack("!h", body[:2])
            at, row = 2, []
            for _ in range(cols):
                (n,) = struct.unpack("!i", body[at:at + 4])
                row.append(body[at + 4:at + 4 + n].decode())
                at += 4 + n
            rows.append(row)
        if kind == b"Z":
            break
    s.close()
    return rows

def test_a_table_round_trip():
    query("CREATE TABLE items (n integer)")
    query("INSERT INTO items VALUES (41), (1)")
    assert query("SELECT sum(n) FROM items") == [["42"]]
"#;

/// The first line a spawned agentbox writes (its command's: the services were ready before it).
async fn first_line(child: &mut std::process::Child) -> String {
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap());
    tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut lines, &mut line).unwrap();
        line
    })
    .await
    .unwrap()
}

/// The ids of the service containers named `service` of the agentbox process `pid`.
async fn service_containers(docker: &bollard::Docker, pid: u32, service: &str) -> Vec<String> {
    let filters = std::collections::HashMap::from([(
        "label".to_string(),
        vec![
            format!("agentbox.pid={pid}"),
            format!("agentbox.service={service}"),
        ],
    )]);
    agentbox::sandbox::gc::list_labelled(docker, &filters)
        .await
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

const CI: &str = "on: push\njobs:\n  test:\n    runs-on: ubuntu-latest\n    services:\n      db:\n        \
                  image: postgres:16\n    steps:\n      - run: pytest\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tests_reach_postgres_on_the_sandboxs_loopback_and_nothing_else_is_reachable() {
    if crate::support::under_gvisor() {
        return; // refused under gVisor, said in docs/src/engines/gvisor.md
    }
    let project = Project::new(&[("test_db.py", PG_TEST), (".github/workflows/ci.yml", CI)]);
    let path = project.path().to_str().unwrap();

    let with = run(agentbox().args([
        "exec",
        "--service",
        "postgres",
        path,
        "--",
        "python3",
        "-m",
        "pytest",
        "-q",
    ]));
    let out = text(&with.stdout);
    assert_eq!(with.status.code(), Some(0), "{out}\n{}", text(&with.stderr));
    assert!(out.contains("1 passed"), "{out}");
    assert!(
        !text(&with.stderr).contains("hint:"),
        "no hint once the service is given"
    );

    let without = run(agentbox().args(["exec", path, "--", "python3", "-m", "pytest", "-q"]));
    assert_ne!(without.status.code(), Some(0));
    assert!(
        text(&without.stdout).contains("Connection refused"),
        "{}",
        text(&without.stdout)
    );
    let stderr = text(&without.stderr);
    assert!(
        stderr.contains(
            "hint: tests may need postgres (.github/workflows/ci.yml names it): --service postgres"
        ),
        "{stderr}"
    );

    // While a session runs: the sandbox still has only `lo`, and the service, in that
    // namespace, reaches neither the host's loopback nor the engine's socket.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let host_port = host.local_addr().unwrap().port();
    let mut session = agentbox()
        .args([
            "exec",
            "--service",
            "postgres",
            path,
            "--",
            "sh",
            "-c",
            "ls /sys/class/net; sleep 30",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The command's first line: the service was ready before it ran.
    let first = first_line(&mut session).await;
    assert_eq!(first, "lo\n", "the sandbox has only its loopback");
    let docker = docker().await;
    let id = service_containers(&docker, session.id(), "postgres")
        .await
        .into_iter()
        .next()
        .expect("the service container");
    let inspected = docker
        .inspect_container(&id, None::<bollard::query_parameters::InspectContainerOptions>)
        .await
        .unwrap();
    let hc = inspected.host_config.unwrap();
    let config = inspected.config.unwrap();
    assert_eq!(config.user.as_deref(), Some("postgres"));
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    assert_eq!(hc.readonly_rootfs, Some(true));
    assert!(hc.network_mode.unwrap_or_default().starts_with("container:"));
    assert!(
        hc.security_opt
            .unwrap_or_default()
            .iter()
            .any(|o| o.starts_with("seccomp"))
    );
    assert!(hc.memory.unwrap_or(0) > 0 && hc.pids_limit.unwrap_or(0) > 0);
    let inside = std::process::Command::new("docker")
        .args(["exec", &id, "sh", "-c"])
        .arg(format!(
            "ls /sys/class/net; test -e /var/run/docker.sock && echo SOCKET; \
             PATH=$(echo /usr/lib/postgresql/*/bin):$PATH; pg_isready -t 3 -h 127.0.0.1 -p {host_port}; echo \"probe $?\""
        ))
        .output()
        .unwrap();
    let seen = text(&inside.stdout);
    assert!(seen.starts_with("lo\n") && !seen.contains("eth"), "{seen}");
    assert!(!seen.contains("SOCKET"), "{seen}");
    assert!(
        seen.contains("probe 2"),
        "the host's listener must not answer: {seen}"
    );
    assert!(host.accept().is_err(), "a connection reached the host's loopback");
    // Interrupted: the run's cleanup removes the service with the sandbox.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &session.id().to_string()])
        .status();
    let _ = session.wait();
    assert!(
        !crate::support::container_exists(&docker, &id).await,
        "the service outlived its session"
    );
}

/// `r 'CMD'`: an inline Redis command over bash's /dev/tcp, its answer on one line (a bulk
/// reply's length and value together).
fn redis_fn() -> &'static str {
    r#"r() {
    exec 3<>/dev/tcp/127.0.0.1/6379
    printf '%s\r\n' "$1" >&3
    read -r a <&3; a=${a%$'\r'}
    if [[ $a == '$'[0-9]* ]]; then read -r b <&3; a="$a ${b%$'\r'}"; fi
    echo "$a"
    exec 3>&-
}"#
}

const REDIS_SCRIPT: &str = r#"
echo "before: $(r 'GET owner')"
r 'SET owner OWNER' >/dev/null
sleep 2
echo "after: $(r 'GET owner')"
echo "url: $REDIS_URL"
"#;

/// Redis, a service stopped mid-session (by the project itself, as a test suite could), and
/// two sandboxes at once: each has its own server and data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandbox_has_its_own_redis_and_a_stopped_one_is_told_to_the_model() {
    if crate::support::under_gvisor() {
        return;
    }
    let project = Project::new(&[("a.txt", "a\n")]);
    let path = project.path().to_str().unwrap();
    // bash's /dev/tcp: an inline Redis command, its one-line answer.
    let both = (0..2).map(|i| {
        let path = path.to_string();
        std::thread::spawn(move || {
            let script = format!(
                "{}\n{}",
                redis_fn(),
                REDIS_SCRIPT.replace("OWNER", &format!("s{i}"))
            );
            run(agentbox().args(["exec", "--service", "redis", &path, "--", "bash", "-c", &script]))
        })
    });
    for (i, h) in both.collect::<Vec<_>>().into_iter().enumerate() {
        let out = h.join().unwrap();
        let seen = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{seen}{}", text(&out.stderr));
        assert!(seen.contains("before: $-1"), "a fresh server has no key: {seen}");
        assert!(
            seen.contains(&format!("after: $2 s{i}")),
            "its own value, never the other's: {seen}"
        );
        assert!(seen.contains("url: redis://127.0.0.1:6379\n"), "{seen}");
    }

    // A stop is told to the model once.
    let turns = json!([
        {"tool_calls": [bash("exec 3<>/dev/tcp/127.0.0.1/6379; printf 'SHUTDOWN NOSAVE\\r\\n' >&3; sleep 1")]},
        {"tool_calls": [bash("echo still here")]},
        {"tool_calls": [bash("echo and then")]},
        done("done"),
    ]);
    let ran = hostile(&project, turns, &["--service", "redis", "--test-cmd", "true"]).await;
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let (_, told, is_error) = ran.result(1);
    assert!(is_error, "{told}");
    assert!(
        told.contains("the service redis exited with status") && told.contains("This call was not run"),
        "{told}"
    );
    let (_, next, is_error) = ran.result(2);
    assert!(!is_error && next.contains("and then"), "{next}");

    // The model plants what the tests look for in the database instead of fixing anything:
    // the verdict's redis is a new one, without it.
    std::fs::write(
        project.file("check.sh"),
        format!("{}\n[ \"$(r 'GET fixed')\" = '$3 yes' ]\n", redis_fn()),
    )
    .unwrap();
    let turns = json!([
        {"tool_calls": [bash(&format!("{}\nr 'SET fixed yes'; bash check.sh && echo planted", redis_fn()))]},
        done("Fixed."),
    ]);
    let ran = hostile(
        &project,
        turns,
        &["--service", "redis", "--test-cmd", "bash check.sh"],
    )
    .await;
    assert!(ran.result(0).1.contains("planted"), "{}", ran.result(0).1);
    let report = ran.report.as_ref().expect("a report");
    assert_eq!(report["tests"]["passed"], false, "{report}");
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
}

/// Two `eval` tasks at once, each with `--service redis`: each sandbox has its own server, so
/// neither sees the other's data (a task's verdict never depends on another's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_tasks_at_once_each_have_their_own_service() {
    if crate::support::under_gvisor() {
        return;
    }
    let tasks = tempfile::tempdir().unwrap();
    let test = "import os\n\ndef test_done_and_never_saw_another_tasks_value():\n    \
                assert os.path.exists('DONE')\n    assert not os.path.exists('CLASH')\n";
    for name in ["svc-a", "svc-b"] {
        let dir = tasks.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("TASK.md"), "Make the test pass.\n").unwrap();
        std::fs::write(dir.join("test_task.py"), test).unwrap();
        // Its own value in, a wait long enough for the other task's to land, then read back.
        let command = format!(
            "{}\nr 'SET owner {name}' >/dev/null; sleep 4; \
             if [ \"$(r 'GET owner')\" = '$5 {name}' ]; then touch DONE; else touch CLASH; fi",
            redis_fn()
        );
        let script = json!({"turns": [{"tool_calls": [bash(&command)]}, done("Done.")]});
        std::fs::write(dir.join("script.json"), script.to_string()).unwrap();
    }
    let out = tempfile::tempdir().unwrap();
    let ran = run(agentbox()
        .args([
            "eval",
            "--provider",
            "scripted",
            "--service",
            "redis",
            "--jobs",
            "2",
            "--out",
        ])
        .arg(out.path())
        .arg(tasks.path()));
    let stdout = text(&ran.stdout);
    let results: Vec<serde_json::Value> = std::fs::read_to_string(out.path().join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results.len(), 2, "{stdout}{}", text(&ran.stderr));
    for r in &results {
        assert_eq!(r["fixed"], true, "{r}\n{}", text(&ran.stderr));
    }
    // They ran at once, or the test says nothing.
    let (a, b) = (&results[0], &results[1]);
    let overlap = a["started_at"].as_f64().unwrap() < b["finished_at"].as_f64().unwrap()
        && b["started_at"].as_f64().unwrap() < a["finished_at"].as_f64().unwrap();
    assert!(overlap, "the tasks ran one after another: {results:?}");
    assert_eq!(ran.status.code(), Some(0), "{stdout}");
}

/// MariaDB (also by the name `mysql`): its greeting on 127.0.0.1:3306, its variables set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_greets_on_the_sandboxs_loopback() {
    if crate::support::under_gvisor() {
        return;
    }
    let project = Project::new(&[("a.txt", "a\n")]);
    let out = run(agentbox().args([
        "exec",
        "--service",
        "mysql",
        project.path().to_str().unwrap(),
        "--",
        "bash",
        "-c",
        "exec 3<>/dev/tcp/127.0.0.1/3306 && head -c 60 <&3 | tr -cd '[:print:]'; echo; echo \"$DATABASE_URL $MYSQL_TCP_PORT\"",
    ]));
    let seen = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{seen}{}", text(&out.stderr));
    assert!(seen.contains("MariaDB"), "{seen}");
    assert!(seen.contains("mysql://root@127.0.0.1:3306 3306"), "{seen}");
}

/// A service has no tie to its sandbox's keep-alive: when agentbox is killed outright its
/// service runs on — until the next agentbox that starts services on this machine removes it
/// (or `agentbox gc`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runs_service_is_removed_by_the_next_run_with_services() {
    if crate::support::under_gvisor() {
        return;
    }
    let project = Project::new(&[("a.txt", "a\n")]);
    let path = project.path().to_str().unwrap();
    let mut killed = agentbox()
        .args([
            "exec",
            "--service",
            "redis",
            path,
            "--",
            "sh",
            "-c",
            "echo up; sleep 60",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let first = first_line(&mut killed).await;
    assert_eq!(first, "up\n");
    let docker = docker().await;
    let found = service_containers(&docker, killed.id(), "redis").await;
    assert_eq!(found.len(), 1, "{found:?}");
    let id = found[0].clone();
    killed.kill().unwrap();
    killed.wait().unwrap();
    // Not asserted here that it is still there: another test's run with services, at once in
    // this binary, may already have removed it — by the same sweep.
    let next = run(agentbox().args(["exec", "--service", "redis", path, "--", "true"]));
    assert_eq!(next.status.code(), Some(0), "{}", text(&next.stderr));
    assert!(
        !crate::support::container_exists(&docker, &id).await,
        "the orphan is still there"
    );
}

/// Another image, from the config file: its declared volume is a tmpfs (never a volume on the
/// host's disk), its user from the table, readiness by a TCP connect to the given port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_images_volume_is_a_tmpfs_and_its_port_is_probed() {
    if crate::support::under_gvisor() {
        return;
    }
    let tag = format!("agentbox-test/svc-volume:{}", std::process::id());
    let mut build = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &tag, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        build.stdin.as_mut().unwrap(),
        b"FROM agentbox/redis:1\nVOLUME /data\n",
    )
    .unwrap();
    drop(build.stdin.take());
    assert!(build.wait().unwrap().success());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[services.cache]\nimage = \"{tag}\"\nport = 6380\nuser = \"redis\"\n\
             command = [\"redis-server\", \"--bind\", \"127.0.0.1\", \"--port\", \"6380\", \"--save\", \"\", \"--dir\", \"/data\"]\n\
             sandbox-env = {{ CACHE_PORT = \"6380\" }}\n"
        ),
    )
    .unwrap();
    let project = Project::new(&[("a.txt", "a\n")]);
    let mut session = agentbox()
        .env("AGENTBOX_CONFIG", &config)
        .args([
            "exec",
            project.path().to_str().unwrap(),
            "--",
            "bash",
            "-c",
            "exec 3<>/dev/tcp/127.0.0.1/$CACHE_PORT && echo open; sleep 30",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let first = first_line(&mut session).await;
    let docker = docker().await;
    let found = service_containers(&docker, session.id(), "cache").await;
    let inspected = match found.first() {
        Some(id) => docker
            .inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>)
            .await
            .ok(),
        None => None,
    };
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &session.id().to_string()])
        .status();
    let _ = session.wait();
    let _ = std::process::Command::new("docker")
        .args(["rmi", "-f", &tag])
        .output();
    assert_eq!(first, "open\n", "the service was not ready before the command");
    let inspected = inspected.expect("the service container");
    let tmpfs = inspected.host_config.and_then(|h| h.tmpfs).unwrap_or_default();
    assert!(tmpfs.contains_key("/data"), "{tmpfs:?}");
    let mounts = inspected.mounts.unwrap_or_default();
    assert!(
        mounts.iter().all(|m| m.typ.as_deref() != Some("volume")),
        "a volume on the host's disk: {mounts:?}"
    );
}
