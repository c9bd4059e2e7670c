# agentbox in-container executor.
#
# The sandbox container's main process: PID 1 of its PID namespace, started as
# `python3 -I -S -c <this file>` with stdin and stdout attached to agentbox through the Docker
# API. Each request spawns one command directly (no runc round trip), so a tool call costs about
# as much as a process spawn. Everything that bounds a command is enforced here, next to the
# command: the timeout, the kill of everything it started, the output caps.
#
# Being PID 1 matters: the kernel delivers no signal to a namespace's init from inside the
# namespace unless init handles it, so not even `kill -9 -1` or `kill -9 1` from a command can
# end us. As init we also reap every orphan, which is what docker-init would otherwise do. When
# agentbox goes away, stdin reaches EOF, we exit, and the container stops.
#
# Wire format, both directions: a 4-byte big-endian length, then that many bytes of JSON.
# Byte payloads (stdin, captured output) are base64 inside the JSON.
#
# Invariant after every request: no process of the sandbox user is left running except this
# one and the background processes the host asked for (jobs, below), each a tree under a helper
# of ours. That is what makes a timeout real (a background child holding stdout is killed too)
# and, once the host has stopped the jobs (before its scans, the read-back and its own test
# run), what lets it reason about files without racing a stray writer.
# Imports are few and mostly built into the interpreter on purpose: they are read when the
# sandbox starts, through the container's storage driver, and on fuse-overlayfs each Python
# module file cost ~10 ms of a cold start (`subprocess`, `selectors`, `signal`'s enums, `re`
# under `json` and `base64`). Measured: the import line took 100-500 ms of a cold start under
# load with those modules and 20-40 ms without. The stand-ins below are small.
import binascii
import os
import select
import struct
import time

import _signal as signal

try:
    import _json
except ImportError:  # an interpreter without the C accelerator: the pure-Python module
    _json = None

PROTOCOL = 2
READ_CHUNK = 1 << 16


# Our own /proc/self/oom_score_adj and the score the engine gave us. Opened before we make
# ourselves undumpable: from then on the file belongs to root, and only this descriptor can
# still write it (nor can a command of our uid raise our score through /proc/1).
own_oom_fd = None
own_oom_score = None


def lower_rlimits(libc):
    """Set the limits AGENTBOX_RLIMITS names ("fsize:N,nofile:N,core:N"), soft and hard, for
    us and every command we start. The engine sets them too, but rootless Podman 4.3's
    compatible API drops a request's ulimits (measured: file size unlimited, open files 20000);
    lowering a limit needs no privilege, so here they hold on any engine."""
    import ctypes

    class Rlimit(ctypes.Structure):
        _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]

    resources = {"fsize": 1, "core": 4, "nofile": 7}  # RLIMIT_* on Linux
    for item in os.environ.get("AGENTBOX_RLIMITS", "").split(","):
        name, _, value = item.partition(":")
        if name in resources and value.isdigit():
            limit = Rlimit(int(value), int(value))
            libc.setrlimit(resources[name], ctypes.byref(limit))


def harden():
    """Returns whether we are undumpable. If not (no ctypes in a minimal image), the host does
    not use us: a command of the same uid could write forged frames to /proc/1/fd/1."""
    global own_oom_fd, own_oom_score
    try:
        own_oom_fd = os.open("/proc/self/oom_score_adj", os.O_RDWR)
        own_oom_score = os.pread(own_oom_fd, 16, 0).strip()
    except OSError:
        own_oom_fd = None
    hardened = False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        hardened = libc.prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE
        lower_rlimits(libc)
        libc.prctl(15, b"agentbox-exec", 0, 0, 0)  # PR_SET_NAME: `pkill python3` spares us
    except Exception:
        pass
    # Catch (not ignore) the polite signals: a command's `kill -TERM -1` must not end us, and a
    # caught handler is reset to the default in the children at exec, unlike SIG_IGN.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda *_: None)
    return hardened


# Bytes read from stdin while a command ran (the host sends nothing then, but be exact).
pending_input = bytearray()


def b64(data):
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def json_codec():
    """`json.loads` and compact `json.dumps`, straight from the C accelerator the `json` package
    itself uses, without importing the package (and `re` with it); the package if that fails."""
    if _json is not None:
        try:
            class Context:
                strict = True
                object_hook = None
                object_pairs_hook = None
                parse_float = float
                parse_int = int
                parse_constant = float  # NaN and Infinity, as json.loads reads them
                memo = {}

            scan = _json.make_scanner(Context())

            def default(obj):
                raise TypeError(f"{type(obj).__name__} is not JSON serializable")

            encode = _json.make_encoder(None, default, _json.encode_basestring_ascii, None,
                                        ":", ",", False, False, True)

            def loads(data):
                try:
                    return scan(data.decode("utf-8"), 0)[0]
                except StopIteration:
                    raise ValueError("not a JSON document") from None

            def dumps(obj):
                return "".join(encode(obj, 0))

            probe = {"a": [1, 2.5, None, True, False, "\u00e9\n\"", {}]}
            if loads(dumps(probe).encode()) == probe:
                return loads, dumps
        except Exception:
            pass
    import json

    return json.loads, lambda obj: json.dumps(obj, separators=(",", ":"))


json_loads, json_dumps = json_codec()


class HostGone(Exception):
    """stdin reached EOF: agentbox is gone, and so must we be."""


def read_exact(fd, n):
    buf = bytearray(pending_input[:n])
    del pending_input[:n]
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def watch_host():
    """Called when stdin is readable during a command: EOF means agentbox went away (even by
    SIGKILL), so the sandbox ends now rather than when the command would have. Returns whether
    the host asks for the command to be interrupted: its next frame is `{"interrupt": ID}`
    (answered after the command's own reply; see `Executor::interrupt`)."""
    chunk = os.read(0, 65536)
    if not chunk:
        raise HostGone()
    pending_input.extend(chunk)
    if len(pending_input) < 4:
        return False
    (length,) = struct.unpack(">I", bytes(pending_input[:4]))
    if len(pending_input) < 4 + length:
        return False
    try:
        return "interrupt" in json_loads(bytes(pending_input[4:4 + length]))
    except (ValueError, TypeError):
        return False


def recv():
    header = read_exact(0, 4)
    if header is None:
        return None
    (length,) = struct.unpack(">I", header)
    body = read_exact(0, length)
    if body is None:
        return None
    return json_loads(body)


def send(obj):
    data = json_dumps(obj).encode()
    out = struct.pack(">I", len(data)) + data
    view = memoryview(out)
    while view:
        written = os.write(1, view)
        view = view[written:]


class Capture:
    """Keeps the first `head` and the last `tail` bytes; counts the rest (and, for `Lines`,
    the newlines: only then, a scan of every byte costs a 1 GiB flood about half a second)."""

    def __init__(self, head, tail, count_lines=False):
        self.head_max = head
        self.tail_max = tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.count_lines = count_lines
        self.lines = 0
        self.last = None

    def add(self, data):
        self.total += len(data)
        if self.count_lines:
            self.lines += data.count(b"\n")
            self.last = data[-1]
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.tail_max > 0:
            self.tail += data
            extra = len(self.tail) - self.tail_max
            if extra > 0:
                del self.tail[:extra]

    def to_json(self):
        return {
            "head": b64(self.head),
            "tail": b64(self.tail),
            "total": self.total,
        }


def oom_kills():
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"),
                      ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except OSError:
            continue
    return None


class Proc:
    """The little of `subprocess.Popen` a command needs: its pid, its pipes (raw descriptors),
    and its exit status, which `reap` may collect first (we are init: every child is ours)."""

    def __init__(self, pid, stdin, stdout, stderr):
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        while self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                # Reaped by `reap` in the meantime, which recorded the status.
                break
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def find_program(name, env):
    """The program `name` names, searched on the command's own PATH, as execvpe would."""
    if "/" in name:
        return name
    denied = None
    for d in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep):
        path = os.path.join(d or ".", name)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            denied = path
    if denied is not None:
        raise PermissionError(13, os.strerror(13), denied)
    raise FileNotFoundError(2, os.strerror(2), name)


def spawn(argv, cwd, env, stdin, merge):
    """Starts `argv` in a new session with its stdout (and stderr, or both on one pipe when
    `merge`) on pipes, and stdin a pipe when `stdin` else /dev/null. posix_spawn: a vfork and an
    exec, as `subprocess` does, without importing it. Our descriptors are all close-on-exec
    (Python opens them so), so the command inherits exactly 0, 1 and 2.

    The command starts at the highest OOM score: when the sandbox runs out of memory the
    kernel's OOM killer must pick a command, never us (we are PID 1: without us the session
    ends). Memory that belongs to no process, such as files in the tmpfs mounts, is charged to
    the container too, and at equal scores the killer takes the largest process, which is
    often us.

    The child inherits our score at fork, so we raise our own for the instant of the spawn and
    put it back. Raising needs no privilege, and the kernel never refuses going back to the
    score we started with (its floor is at most what the engine set). Setting it in the child
    instead cannot work: until exec the child is undumpable like us and may not open its own
    /proc files, and it would cost a fork instead of a vfork, ~2 ms a command."""
    ours, theirs = [], []
    try:
        if stdin:
            child_in, parent_in = os.pipe()
            ours.append(parent_in)
            theirs.append(child_in)
        else:
            child_in, parent_in = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC), None
            theirs.append(child_in)
        parent_out, child_out = os.pipe()
        ours.append(parent_out)
        theirs.append(child_out)
        if merge:
            parent_err, child_err = None, child_out
        else:
            parent_err, child_err = os.pipe()
            ours.append(parent_err)
            theirs.append(child_err)
        actions = [(os.POSIX_SPAWN_DUP2, child_in, 0), (os.POSIX_SPAWN_DUP2, child_out, 1),
                   (os.POSIX_SPAWN_DUP2, child_err, 2)]
        # posix_spawn has no working directory of its own: ours, for the instant of the spawn
        # (one thread; every path we use elsewhere is absolute). The program is looked up from
        # there too, as execvp in the command's directory would.
        os.chdir(cwd)
        try:
            program = find_program(argv[0], env)
        except BaseException:
            os.chdir("/")
            raise
        if own_oom_fd is not None:
            try:
                os.pwrite(own_oom_fd, b"1000", 0)
            except OSError:
                pass
        try:
            # SIGPIPE and SIGXFSZ back to their defaults: the interpreter ignores them, and an
            # ignored signal stays ignored across exec (`yes | head` must end).
            pid = os.posix_spawn(program, argv, env, file_actions=actions, setsid=True,
                                 setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        finally:
            os.chdir("/")
            if own_oom_fd is not None:
                try:
                    os.pwrite(own_oom_fd, own_oom_score, 0)
                except OSError:
                    pass
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return Proc(pid, parent_in, parent_out, parent_err)


class Poller:
    """What the command loop needs of `selectors`, over poll(2): a payload per descriptor, and
    every event (hang-up and error included) reported as ready, so the read or write that
    follows finds out what happened."""

    def __init__(self):
        self.poll = select.poll()
        self.data = {}

    def register(self, fd, events, data):
        self.poll.register(fd, events)
        self.data[fd] = data

    def unregister(self, fd):
        if self.data.pop(fd, None) is not None:
            self.poll.unregister(fd)

    def select(self, timeout):
        ready = self.poll.poll(timeout * 1000.0)
        return [(fd, self.data[fd]) for fd, _ in ready if fd in self.data]


def reap(proc=None):
    """Reap every exited child (as init, orphans are ours too). The running command's own exit
    status is handed to its Popen, which would otherwise find it already reaped."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if proc is not None and pid == proc.pid and proc.returncode is None:
            proc.returncode = os.waitstatus_to_exitcode(status)
        job = job_pids.pop(pid, None)
        if job is not None:
            job.ended(os.waitstatus_to_exitcode(status))


def survivors():
    """Live processes of our uid other than us and init (zombies are dead; init reaps them)."""
    me, uid = os.getpid(), os.getuid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid:
                continue
            with open("/proc/" + name + "/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rindex(b")") + 2:][:1] != b"Z":
            found.append(int(name))
    return found


def sweep(spare_jobs=True):
    """SIGKILL every process this uid may signal, except us (the caller, and init) and, unless
    `spare_jobs` is false, the trees of the running jobs.

    kill(-1) reports success whenever any process exists, even one it may not signal, so
    whether anything is left is read from /proc. Repeat until nothing is: a fork bomb spawns
    between rounds.
    """
    if spare_jobs and job_pids:
        return sweep_around_jobs()
    deadline = time.monotonic() + 5.0
    rounds = 0
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        reap()
        rounds += 1
        if not survivors() or time.monotonic() > deadline:
            reap()
            return rounds
        time.sleep(0.001 * min(rounds, 20))


def process_table():
    """Every live process we can see: pid -> (parent pid, ours). Zombies are left out (dead;
    their parent reaps them)."""
    uid = os.getuid()
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ours = os.stat("/proc/" + name).st_uid == uid
            with open("/proc/" + name + "/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split(b" ", 2)
        if fields[0] != b"Z":
            table[int(name)] = (int(fields[1]), ours)
    return table


def trees(table, roots):
    """root -> every live process at or below it (a job's helper is a subreaper: whatever its
    command starts, even after setsid and a double fork, stays below it)."""
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found = {}
    for root in roots:
        members, todo = [], [root] if root in table else []
        while todo:
            pid = todo.pop()
            members.append(pid)
            todo.extend(children.get(pid, ()))
        found[root] = members
    return found


def sweep_around_jobs():
    """`sweep`, sparing the jobs' trees: each process is killed by its pid, since kill(-1)
    would take the jobs too. What a killed process had forked meanwhile is orphaned to us, so
    outside every tree, and goes in the next round."""
    me = os.getpid()
    deadline = time.monotonic() + 5.0
    rounds = 0
    while True:
        table = process_table()
        spared = set()
        for members in trees(table, list(job_pids)).values():
            spared.update(members)
        victims = [pid for pid, (_, ours) in table.items()
                   if ours and pid not in spared and pid not in (1, me)]
        if not victims:
            reap()
            return rounds
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
        rounds += 1
        if time.monotonic() > deadline:
            return rounds
        time.sleep(0.001 * min(rounds, 20))


# --- Background processes (jobs) --------------------------------------------------------------
#
# A job is a command that outlives the request that started it (a server, a watcher). It runs
# under a helper of its own, which makes itself a child subreaper: every process the command
# starts, daemonised or not, is the helper's descendant until it dies, so the job is exactly
# the helper's tree, and the sweep after each request spares it and nothing else. The helper
# waits for its whole tree, then exits as the command did. Its output (stdout and stderr on one
# pipe) is read by us, between requests and during them, into a bounded head and tail. The
# host stops jobs (before its own test run, the read-back, at the end); so does a job's tree
# growing past half of the sandbox's process limit.

JOB_HELPER = r"""
import os, sys
import _signal as signal
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
# PR_SET_CHILD_SUBREAPER: orphans below us come to us, not to init (the executor). If the
# kernel refuses, say so: the job would not be tracked past its own children.
if libc.prctl(36, 1, 0, 0, 0) != 0:
    os.write(2, b"agentbox-job: cannot become a child subreaper\n")
    os._exit(126)
libc.prctl(15, b"agentbox-job", 0, 0, 0)  # PR_SET_NAME
argv = sys.argv[1:]
try:
    pid = os.posix_spawnp(argv[0], argv, os.environ,
                          setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
except OSError as e:
    os.write(2, f"{argv[0]}: {e.strerror or e}\n".encode())
    os._exit(127 if e.errno == 2 else 126)
except (ValueError, TypeError) as e:
    os.write(2, f"{argv[0]}: {e}\n".encode())
    os._exit(126)
code = 0
while True:
    try:
        done, status = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    except InterruptedError:
        continue
    if done == pid:
        code = os.waitstatus_to_exitcode(status)
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code & 255)
"""

# Running at once, and kept (the oldest finished are forgotten first; the host keeps its own
# record of every job).
MAX_JOBS = 16
KEPT_JOBS = 64

jobs = {}  # job id -> Job, in the order started
job_pids = {}  # helper pid -> Job, while the helper lives
job_count = [0]


def pids_max():
    for path in ("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"):
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit():
            return int(value)
    return None


class Job:
    def __init__(self, proc, head, tail):
        job_count[0] += 1
        self.id = f"p{job_count[0]}"
        self.pid = proc.pid
        self.fd = proc.stdout
        self.out = Capture(head, tail)
        self.started = time.monotonic()
        self.finished = None
        self.code = None
        self.stopped = None
        self.oom_before = oom_kills()
        self.oom_after = None

    def ended(self, code):
        self.code = code
        self.finished = time.monotonic()
        self.oom_after = oom_kills()

    def running(self):
        return self.pid in job_pids

    def drain(self, wait=0.0):
        """Read what its pipe holds (a flood at most 1 MiB at a time: the host's next request
        must not wait for it); with `wait`, until the pipe's end or that long."""
        until = time.monotonic() + wait
        chunks = 0
        while self.fd is not None:
            chunks += 1
            if chunks > 16 and time.monotonic() >= until:
                return
            try:
                chunk = os.read(self.fd, READ_CHUNK)
            except BlockingIOError:
                left = until - time.monotonic()
                if left <= 0:
                    return
                select.select([self.fd], [], [], min(left, 0.05))
                continue
            except OSError:
                chunk = b""
            if not chunk:
                os.close(self.fd)
                self.fd = None
                return
            self.out.add(chunk)

    def state(self, counts, output):
        s = {
            "job_id": self.id,
            "pid": self.pid,
            "running": self.running(),
            "stopped": self.stopped,
            "procs": len(counts.get(self.pid, ())),
            "elapsed": (self.finished or time.monotonic()) - self.started,
            "exit": None,
            "signal": None,
            "oom_kills": None,
            "total": self.out.total,
        }
        if self.code is not None:
            s["exit"] = self.code if self.code >= 0 else 128 - self.code
            s["signal"] = -self.code if self.code < 0 else None
        if None not in (self.oom_before, self.oom_after):
            s["oom_kills"] = self.oom_after - self.oom_before
        if output:
            s["out"] = self.out.to_json()
        return s


def job_fds():
    return {j.fd: j for j in jobs.values() if j.fd is not None}


def stop_job(job, why):
    """Kill the job's tree: everything below the helper first (orphans come to the helper
    while it lives, so none escapes), then the helper. Whatever still escaped, a command
    that killed the helper itself for instance, is orphaned to us and swept."""
    if job.running():
        job.stopped = why
        deadline = time.monotonic() + 5.0
        rounds = 0
        while job.running():
            members = trees(process_table(), [job.pid]).get(job.pid, [])
            below = [p for p in members if p != job.pid]
            for pid in below if below and time.monotonic() < deadline else [job.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            reap()
            rounds += 1
            time.sleep(0.001 * min(rounds, 20))
        sweep()
    job.drain(0.5)


def police_jobs():
    """Keep the jobs together under half of the sandbox's process limit, so that a runaway
    one (a fork bomb) leaves room for the next command: the largest is stopped."""
    if not job_pids:
        return
    limit = pids_max()
    cap = limit // 2 if limit else 256
    counts = trees(process_table(), list(job_pids))
    total = sum(len(m) for m in counts.values())
    if total > cap:
        pid = max(counts, key=lambda p: len(counts[p]))
        job = job_pids.get(pid)
        if job is not None:
            stop_job(job, f"it had {len(counts[pid])} processes; background processes may "
                          f"use at most half of the sandbox's process limit ({cap} of "
                          f"{limit or 'no limit'}, --pids-limit)")


def job_request(req):
    """The host's requests about jobs: start, output, stop, stop_all, list."""
    op = req.get("job") or {}
    what = op.get("op")
    if what == "start":
        return start_job(req, op)
    wanted = op.get("job_id")
    picked = [j for j in jobs.values() if wanted is None or j.id == wanted]
    if wanted is not None and not picked:
        return {"job_error": f"no background process {wanted!r}"}
    if what in ("stop", "stop_all"):
        for job in picked:
            stop_job(job, str(op.get("why") or "stopped"))
    elif what not in ("output", "list"):
        return {"job_error": f"unknown job request {what!r}"}
    for job in picked:
        job.drain()
    reap()
    counts = trees(process_table(), list(job_pids)) if job_pids else {}
    return {"jobs": [j.state(counts, bool(op.get("output"))) for j in picked]}


def start_job(req, op):
    if len(job_pids) >= MAX_JOBS:
        return {"job_error": f"{MAX_JOBS} background processes are running already; stop one first"}
    argv = req["argv"]
    native = req.get("native")
    if native and native.get("op") == "shell":
        args = native.get("args")
        if isinstance(args, list) and len(args) == 1 and isinstance(args[0], str):
            argv = ["bash", "-c", args[0]]
    python = sys_executable()
    env = dict(os.environ)
    env.update(req.get("env") or {})
    try:
        proc = spawn([python, "-I", "-S", "-c", JOB_HELPER] + list(argv),
                     req.get("cwd") or "/workspace", env, False, True)
    except OSError as e:
        return {"job_error": f"cannot start the background process: {e.strerror or e}"}
    except (ValueError, TypeError, IndexError) as e:
        return {"job_error": f"cannot start the background process: {e}"}
    os.set_blocking(proc.stdout, False)
    job = Job(proc, int(req.get("head", 16384)), int(req.get("tail", 65536)))
    jobs[job.id] = job
    job_pids[job.pid] = job
    forget_old_jobs()
    # A moment for its first words, or its end: a typo or a port in use shows at once.
    settle_until = time.monotonic() + max(0.0, min(float(op.get("settle") or 0.0), 30.0))
    while job.running() and time.monotonic() < settle_until:
        job.drain(min(0.05, max(0.0, settle_until - time.monotonic())))
        reap()
    job.drain()
    reap()
    counts = trees(process_table(), list(job_pids)) if job_pids else {}
    return {"jobs": [job.state(counts, True)]}


def forget_old_jobs():
    finished = [j for j in jobs.values() if not j.running()]
    for job in finished[: max(0, len(jobs) - KEPT_JOBS)]:
        if job.fd is not None:
            os.close(job.fd)
        del jobs[job.id]


def sys_executable():
    import sys

    return sys.executable or find_program("python3", os.environ)


def wait_for_host():
    """Until the host sends its next request: the jobs' output keeps flowing in, their ends
    are reaped, and their process count is kept in check."""
    while not pending_input and (job_pids or job_fds()):
        fds = job_fds()
        poll = select.poll()
        poll.register(0, select.POLLIN)
        for fd in fds:
            poll.register(fd, select.POLLIN)
        ready = [fd for fd, _ in poll.poll(500)]
        for fd in ready:
            if fd in fds:
                fds[fd].drain()
        reap()
        police_jobs()
        if 0 in ready:
            return


def resolve(path):
    """Like `realpath -m` from /workspace: symlinks resolved inside the container. Returns
    (absolute path, None) or (None, error response)."""
    try:
        full = os.path.realpath(os.path.join("/workspace", path))
    except (OSError, ValueError, RecursionError):
        # A link chain deep enough to exhaust the resolver, or a name the OS refuses.
        return None, result(E_CANNOT_RESOLVE)
    if full != "/workspace" and not full.startswith("/workspace/"):
        return None, result(E_OUTSIDE, err=full.encode())
    return full, None


def result(code, out=b"", err=b""):
    return {
        "exit": code,
        "signal": None,
        "timed_out": False,
        "stdout": {"head": b64(out), "tail": "", "total": len(out)},
        "stderr": {"head": b64(err), "tail": "", "total": len(err)},
        "oom_kills": 0,
        "elapsed": 0.0,
    }


def native_read(path, limit):
    """The workspace's read script, without spawning anything: same exit codes, same output."""
    p, bad = resolve(path)
    if bad:
        return bad
    if not os.path.exists(p):
        return result(E_NOT_FOUND)
    if os.path.isdir(p):
        return result(E_IS_DIRECTORY)
    if not os.path.isfile(p):
        return result(E_NOT_REGULAR)
    if not os.access(p, os.R_OK):
        return result(E_PERMISSION_DENIED)
    try:
        size = os.stat(p).st_size
        with open(p, "rb") as f:
            data = f.read(int(limit))
    except PermissionError:
        return result(E_PERMISSION_DENIED)
    except OSError as e:
        return result(E_FAILED, err=(e.strerror or str(e)).encode())
    return result(0, out=data, err=f"{size}\n".encode())


def native_write(path, mode, data):
    """The workspace's atomic write script, natively: a temporary file next to the target, then
    rename(2) over it."""
    p, bad = resolve(path)
    if bad:
        return bad
    if p == "/workspace/.git" or p.startswith("/workspace/.git/"):
        return result(E_FAILED, err=b"the project's .git is read-only in the sandbox")
    d = os.path.dirname(p)
    if mode == "create":
        if os.path.lexists(p):
            return result(E_EXISTS)
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            return result(E_FAILED, err=(e.strerror or str(e)).encode())
        umask = os.umask(0)
        os.umask(umask)
        perm = 0o666 & ~umask
    else:
        if not os.path.exists(p):
            return result(E_NOT_FOUND)
        if os.path.isdir(p):
            return result(E_IS_DIRECTORY)
        if not os.path.isfile(p):
            return result(E_NOT_REGULAR)
        if not os.access(p, os.W_OK):
            return result(E_PERMISSION_DENIED)
        perm = os.stat(p).st_mode & 0o7777
    tmp = None
    try:
        for _ in range(100):
            tmp = os.path.join(d, ".agentbox-" + os.urandom(4).hex())
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileExistsError:
                continue
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, perm)
        finally:
            os.close(fd)
        os.replace(tmp, p)
    except OSError as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return result(E_FAILED, err=(e.strerror or str(e)).encode())
    return result(0)


def on_path(name):
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if d and os.access(os.path.join(d, name), os.X_OK):
            return True
    return False


class Lines:
    """Cuts ripgrep's output to the first `limit` lines and counts them all: what the list and
    search scripts pipe through `awk 'NR <= max { print } END { print "total=" NR }'`."""

    def __init__(self, op, limit):
        self.op = op
        self.limit = limit

    def finish(self, resp, out, err):
        kept = bytes(out.head).split(b"\n")[: self.limit]
        text = b"".join(line + b"\n" for line in kept if line) if self.limit > 0 else b""
        total = out.lines + (1 if out.total and out.last != 10 else 0)
        tail = b""
        if self.op == "search":
            tail += f"rg={resp['exit']}\n".encode()
        tail += f"total={total}\n".encode()
        resp["stdout"] = result(0, out=text)["stdout"]
        resp["stderr"] = result(0, err=bytes(err.head) + bytes(err.tail) + tail)["stderr"]
        # The script's status is awk's, the last of its pipeline.
        resp["exit"], resp["signal"] = 0, None


def rg_native(native):
    """`list` and `search` natively: the path resolved here instead of by `realpath`, ripgrep
    spawned directly (the host sends its arguments), its output cut and counted here instead of
    by `awk`; three spawns fewer. Returns (argv, Lines), (None, response) when the path is wrong
    (the script's exit codes), or (None, None) to run the script: no ripgrep, or bad arguments."""
    op, args = native.get("op"), native.get("args")
    if not isinstance(args, list) or len(args) < 3 or not all(isinstance(a, str) for a in args):
        return None, None
    if not on_path("rg"):
        return None, None
    try:
        limit = int(args[1])
    except ValueError:
        return None, None
    p, bad = resolve(args[0])
    if bad:
        return None, bad
    rel = "." if p == "/workspace" else p[len("/workspace/"):]
    if not os.path.exists(p):
        return None, result(E_NOT_FOUND)
    if op == "list" and not os.path.isdir(p):
        return None, result(0, out=(rel + "\n").encode(), err=b"total=1\n")
    argv = list(args[2:]) + ([] if rel == "." else ["--", rel])
    return argv, Lines(op, limit)


def native_oom_kills():
    """The memory cgroup's OOM-kill count, as the host's `READ_OOM_KILLS` prints it; read here
    so that the host need not start a Docker exec for it."""
    n = oom_kills()
    return result(0, out=b"" if n is None else ("oom_kill %d\n" % n).encode())


NATIVE = {
    "read": lambda args, data: native_read(args[0], args[1]),
    "write": lambda args, data: native_write(args[0], args[1], data or b""),
    "oom_kills": lambda args, data: native_oom_kills(),
}


def run(req):
    native = req.get("native")
    if native and native.get("op") in NATIVE:
        data = binascii.a2b_base64(req["stdin"]) if req.get("stdin") is not None else None
        started = time.monotonic()
        resp = NATIVE[native["op"]](native.get("args") or [], data)
        resp["elapsed"] = time.monotonic() - started
        return resp
    argv = req["argv"]
    # The `bash` tool's command line. The host's argv, for one exec per call, is
    # `/bin/sh -c 'exec 2>&1; exec bash -c "$1"' sh COMMAND`; here the same bash gets the same
    # single pipe for stdout and stderr directly, one exec (about a millisecond) fewer.
    merge = False
    lines = None
    if native and native.get("op") in ("list", "search"):
        started = time.monotonic()
        rg_argv, job = rg_native(native)
        if isinstance(job, Lines):
            argv, lines = rg_argv, job
        elif job is not None:
            job["elapsed"] = time.monotonic() - started
            return job
    if native and native.get("op") == "shell":
        args = native.get("args")
        if isinstance(args, list) and len(args) == 1 and isinstance(args[0], str):
            argv = ["bash", "-c", args[0]]
            merge = True
    timeout = float(req.get("timeout", 120))
    stdin_data = binascii.a2b_base64(req["stdin"]) if req.get("stdin") is not None else None
    out = Capture(int(req.get("head", 65536)), int(req.get("tail", 65536)), lines is not None)
    err = Capture(int(req.get("head", 65536)), int(req.get("tail", 65536)))
    env = dict(os.environ)
    env.update(req.get("env") or {})
    oom_before = oom_kills()
    started = time.monotonic()
    try:
        proc = spawn(argv, req.get("cwd") or "/workspace", env, stdin_data is not None, merge)
    except OSError as e:
        return {"spawn_error": f"{argv[0]}: {e.strerror or e}", "errno": e.errno}
    except (ValueError, TypeError, IndexError) as e:
        # E.g. an argument with a NUL byte: the command cannot exist, say so like a shell would.
        return {"spawn_error": f"{argv[0] if argv else ''}: {e}", "errno": None}

    sel = Poller()
    pipes = [(proc.stdout, out)] + ([] if proc.stderr is None else [(proc.stderr, err)])
    for fd, capture in pipes:
        os.set_blocking(fd, False)
        sel.register(fd, select.POLLIN, capture)
    pending = memoryview(stdin_data) if stdin_data is not None else None
    stdin_fd = proc.stdin
    if pending is not None:
        os.set_blocking(stdin_fd, False)
        if len(pending) == 0:
            os.close(stdin_fd)
            stdin_fd = None
            pending = None
        else:
            sel.register(stdin_fd, select.POLLOUT, "stdin")
    sel.register(0, select.POLLIN, "host")
    for fd, job in job_fds().items():
        sel.register(fd, select.POLLIN, job)
    policed = time.monotonic()
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(proc.pid)
            sel.register(pidfd, select.POLLIN, "exit")
        except OSError:
            pidfd = None

    deadline = started + timeout
    timed_out = False
    swept = False
    drain_until = None
    streams = {fd for fd, _ in pipes}
    while True:
        now = time.monotonic()
        reap(proc)
        if job_pids and now - policed > 0.5:
            police_jobs()
            policed = now
        if not swept and proc.poll() is not None:
            # The command is done; whatever it left behind (a daemon holding stdout open) goes.
            sweep()
            swept = True
            drain_until = time.monotonic() + 2.0
        if swept and not streams:
            break
        if not swept and now >= deadline:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            sweep()
            swept = True
            drain_until = time.monotonic() + 2.0
            continue
        if drain_until is not None and now >= drain_until:
            break
        until = drain_until if drain_until is not None else deadline
        # Wake up now and then to reap orphans that exit while the command runs.
        wait = min(max(0.0, until - now), 0.05 if pidfd is None else 0.25)
        if not sel.data:
            time.sleep(wait)
            continue
        for fd, data in sel.select(wait):
            if data == "host":
                try:
                    interrupted = watch_host()
                except HostGone:
                    sweep(spare_jobs=False)
                    raise
                if interrupted and not swept:
                    # As its timeout would; the host gave up waiting and drops the reply.
                    deadline = now
                continue
            if isinstance(data, Job):
                data.drain()
                if data.fd is None:
                    sel.unregister(fd)
                continue
            if data == "exit":
                sel.unregister(fd)
                continue
            if data == "stdin":
                try:
                    written = os.write(fd, pending[:READ_CHUNK])
                    pending = pending[written:]
                except BlockingIOError:
                    continue
                except OSError:
                    pending = pending[:0]
                if len(pending) == 0:
                    sel.unregister(fd)
                    os.close(fd)
                    stdin_fd = None
                continue
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                data.add(chunk)
            else:
                sel.unregister(fd)
                streams.discard(fd)
    if pidfd is not None:
        os.close(pidfd)
    if stdin_fd is not None:
        try:
            os.close(stdin_fd)
        except OSError:
            pass
    for fd, _ in pipes:
        os.close(fd)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait()
    if not swept:
        sweep()
    elapsed = time.monotonic() - started
    oom_after = oom_kills()
    resp = {
        "exit": code if code >= 0 else 128 - code,
        "signal": -code if code < 0 else None,
        "timed_out": timed_out,
        "stdout": out.to_json(),
        "stderr": err.to_json(),
        "oom_kills": (oom_after - oom_before) if None not in (oom_before, oom_after) else None,
        "elapsed": elapsed,
    }
    if lines is not None and not timed_out:
        lines.finish(resp, out, err)
    return resp


class Forwarder:
    """The sandbox's side of every forward to or from the host (AGENTBOX_FORWARD, see `Forward`
    in policy.rs): the container keeps network "none", and each host service is a Unix socket
    the host listens on, mounted read-only here. Threads, so the command loop is untouched;
    they die with us. Built-in modules only, like the rest of this file (and only when asked).

        out:PORT:PATH  listen on this sandbox's own 127.0.0.1:PORT; each connection is joined
                       to a new connection to the socket PATH (the egress proxy, a gateway)
        in:PORT:PATH   a published port: the host listens on the socket PATH too, and never
                       connects to anything of ours. Keep IDLE connections open to it; when
                       the host writes GO on one (a client arrived on its side), connect to
                       127.0.0.1:PORT here, answer JOINED or REFUSED, and join the two
    """

    # The inbound handshake (see `publish.rs`): one byte each way.
    GO = b"c"
    JOINED = b"+"
    REFUSED = b"-"
    IDLE = 2

    # Each connection costs two threads, which count against the pids limit: bound them.
    MAX_CONNECTIONS = 64

    def __init__(self, socket_module, thread_module):
        self.socket = socket_module
        self.thread = thread_module
        self.lock = thread_module.allocate_lock()
        self.open = 0

    def warn(self, message):
        os.write(2, f"agentbox-exec: {message}\n".encode())

    def take_slot(self):
        with self.lock:
            if self.open >= self.MAX_CONNECTIONS:
                return False
            self.open += 1
            return True

    def give_slot(self):
        with self.lock:
            self.open -= 1

    def spawn(self, fn, *args):
        try:
            self.thread.start_new_thread(fn, args)
            return True
        except RuntimeError:
            return False

    def pipe(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(self.socket.SHUT_WR)
        except OSError:
            pass

    def join(self, a, b):
        """Copy both ways until both directions end, then close both."""
        done = self.thread.allocate_lock()
        done.acquire()

        def back():
            try:
                self.pipe(b, a)
            finally:
                done.release()

        if self.spawn(back):
            self.pipe(a, b)
            done.acquire()
        a.close()
        b.close()

    def unix(self, path):
        s = self.socket.socket(self.socket.AF_UNIX, self.socket.SOCK_STREAM)
        try:
            s.connect(path)
        except OSError:
            s.close()
            raise
        return s

    def outbound(self, port, path):
        S = self.socket
        try:
            srv = S.socket(S.AF_INET, S.SOCK_STREAM)
            srv.setsockopt(S.SOL_SOCKET, S.SO_REUSEADDR, 1)
            srv.bind(("127.0.0.1", port))
            srv.listen(64)
        except (OSError, ValueError) as e:
            self.warn(f"cannot listen on 127.0.0.1:{port} for {path}: {e}")
            return

        def serve(client):
            try:
                try:
                    upstream = self.unix(path)
                except OSError:
                    client.close()
                    return
                self.join(client, upstream)
            finally:
                self.give_slot()

        def accept():
            while True:
                try:
                    fd, _ = srv._accept()
                except OSError:
                    time.sleep(0.05)
                    continue
                client = S.socket(fileno=fd)
                if not self.take_slot():
                    client.close()
                elif not self.spawn(serve, client):
                    client.close()
                    self.give_slot()

        self.spawn(accept)

    def inbound(self, port, path):
        S = self.socket

        def wait_for_client():
            # One idle connection: it waits for the host's GO, then starts the next one.
            delay = 0.05
            while True:
                try:
                    host = self.unix(path)
                    break
                except OSError:
                    # The host's side is not there (yet, or any more): try again, slowly.
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
            try:
                go = host.recv(1)
            except OSError:
                go = b""
            if go != self.GO:
                # The host closed it (it keeps only so many idle, or it is going away): not
                # at once again.
                host.close()
                time.sleep(0.5)
            # Whatever happens to this one, the next client needs a waiting connection.
            while not self.spawn(wait_for_client):
                time.sleep(0.5)
            if go != self.GO:
                return
            if not self.take_slot():
                host.close()
                return
            try:
                try:
                    server = S.socket(S.AF_INET, S.SOCK_STREAM)
                    server.connect(("127.0.0.1", port))
                except OSError:
                    server.close()
                    try:
                        host.sendall(self.REFUSED)
                    except OSError:
                        pass
                    host.close()
                    return
                try:
                    host.sendall(self.JOINED)
                except OSError:
                    server.close()
                    host.close()
                    return
                self.join(host, server)
            finally:
                self.give_slot()

        for _ in range(self.IDLE):
            self.spawn(wait_for_client)

    def start(self, spec):
        for item in spec.split(","):
            kind, _, rest = item.partition(":")
            try:
                if kind == "out":
                    port, _, path = rest.partition(":")
                    self.outbound(int(port), path)
                elif kind == "in":
                    port, _, path = rest.partition(":")
                    self.inbound(int(port), path)
                elif item:
                    self.warn(f"unknown forward {item!r}")
            except ValueError:
                self.warn(f"bad forward {item!r}")


def start_forwarders():
    spec = os.environ.get("AGENTBOX_FORWARD")
    if not spec:
        return
    import _socket
    import _thread

    Forwarder(_socket, _thread).start(spec)


def main():
    hardened = harden()
    start_forwarders()
    # Start from a clean slate: a previous executor may have died mid-command.
    sweep()
    send({"ready": True, "protocol": PROTOCOL, "pid": os.getpid(), "uid": os.getuid(), "hardened": hardened})
    while True:
        wait_for_host()
        req = recv()
        if req is None:
            return
        try:
            if "interrupt" in req:
                # What it interrupted, if anything, was ended (and answered) before this.
                resp = {"interrupted": req["interrupt"]}
            elif req.get("job"):
                resp = job_request(req)
            else:
                resp = run(req)
        except HostGone:
            return
        except Exception as e:  # a bug here must not take the session down
            sweep()
            resp = {"internal_error": f"{type(e).__name__}: {e}"}
        resp["id"] = req.get("id")
        send(resp)


main()
