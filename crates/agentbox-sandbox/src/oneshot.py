# PID 1 of a one-shot sandbox (`agentbox exec`'s fast path): runs one command and ends with it.
#
# It is PID 1 and the sandbox user, as the executor is: no signal from inside the sandbox can
# end it, and when it exits the kernel ends everything left in the sandbox. Its stdin is
# agentbox's attach connection and carries nothing: end-of-input means agentbox is gone (even
# SIGKILLed), and then the command goes too, so no container outlives its run.
#
# The hello is written before the command exists, so the first bytes of stdout are always ours:
# a container that ends without them never ran the command (no python3 in the image), and
# agentbox starts it the usual way instead. So does a refusal: without ctypes we cannot make
# ourselves undumpable, and a command of our uid could then ptrace us and outlive agentbox.
import os
import select
import signal
import sys

HELLO = b"agentbox-oneshot 1\n"
REFUSAL = b"agentbox-oneshot 0\n"


def harden():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        libc.prctl(15, b"agentbox-exec", 0, 0, 0)  # PR_SET_NAME: `pkill python3` spares us
        return libc.prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE
    except Exception:
        return False


def end(code):
    # What the command left running goes with it, as after any command.
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    os._exit(code)


def status_code(st):
    if os.WIFEXITED(st):
        return os.WEXITSTATUS(st)
    if os.WIFSIGNALED(st):
        return 128 + os.WTERMSIG(st)
    return 1


def main():
    argv = sys.argv[1:]
    if not argv:
        os._exit(2)
    if not harden():
        os.write(1, REFUSAL)
        os._exit(3)
    rd, wr = os.pipe()
    os.set_blocking(wr, False)
    signal.set_wakeup_fd(wr)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    os.write(1, HELLO)
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(rd)
            os.close(wr)
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    status = None
    while status is None:
        ready, _, _ = select.select([0, rd], [], [])
        if 0 in ready:
            try:
                data = os.read(0, 4096)
            except OSError:
                data = b""
            if not data:
                end(137)
        if rd in ready:
            try:
                os.read(rd, 4096)
            except BlockingIOError:
                pass
        # Orphans are reaped here too: PID 1 is every orphan's parent.
        while True:
            try:
                reaped, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if reaped == 0:
                break
            if reaped == pid:
                status = st
    end(status_code(status))


main()
