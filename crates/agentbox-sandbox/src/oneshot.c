/*
 * agentbox-init: PID 1 of a one-shot sandbox (`agentbox exec`'s fast path). It runs one
 * command and ends with it.
 *
 * Built static by build.rs and bind-mounted read-only from the host, so it needs nothing from
 * the image (no shell, no python, no libc) and starts in about a millisecond.
 *
 * It is PID 1 and the sandbox user, as the executor is: no signal from inside the sandbox can
 * end it, and when it exits the kernel ends everything left in the sandbox. It makes itself
 * undumpable before the command exists, so a command of its uid can neither ptrace it nor read
 * its memory. Its stdin is agentbox's attach connection and carries nothing: end-of-input
 * means agentbox is gone (even SIGKILLed), and then the command goes too, so no container
 * outlives its run.
 *
 * The hello is written before the command exists, so the first bytes of stdout are always
 * ours: a container that ends without them never ran the command, and agentbox starts it the
 * usual way instead.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

static const char HELLO[] = "agentbox-oneshot 1\n";

/* What the command left running goes with it, as after any command. */
static void end(int code) {
    kill(-1, SIGKILL);
    _exit(code);
}

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(3);
        p += w;
        n -= (size_t)w;
    }
}

static void set_limit(int resource, unsigned long long value) {
    struct rlimit r = {(rlim_t)value, (rlim_t)value};
    setrlimit(resource, &r);
}

/*
 * The limits the per-call wrapper sets (see `RLIMITS` in docker/exec.rs): AGENTBOX_RLIMITS's
 * "fsize:N,nofile:N,core:N" (rootless Podman drops a container's ulimits; lowering one needs
 * no privilege), then at most 4096 open files and no core files.
 */
static void lower_limits(void) {
    const char *spec = getenv("AGENTBOX_RLIMITS");
    while (spec && *spec) {
        const char *colon = strchr(spec, ':');
        if (!colon)
            break;
        char *after;
        errno = 0;
        unsigned long long value = strtoull(colon + 1, &after, 10);
        size_t name = (size_t)(colon - spec);
        if (errno == 0 && after != colon + 1) {
            if (name == 5 && strncmp(spec, "fsize", 5) == 0)
                set_limit(RLIMIT_FSIZE, value);
            else if (name == 6 && strncmp(spec, "nofile", 6) == 0)
                set_limit(RLIMIT_NOFILE, value);
            else if (name == 4 && strncmp(spec, "core", 4) == 0)
                set_limit(RLIMIT_CORE, value);
        }
        const char *comma = strchr(spec, ',');
        spec = comma ? comma + 1 : NULL;
    }
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && (r.rlim_cur == RLIM_INFINITY || r.rlim_cur > 4096))
        set_limit(RLIMIT_NOFILE, 4096);
    set_limit(RLIMIT_CORE, 0);
}

int main(int argc, char **argv) {
    if (argc < 2)
        _exit(2);
    /*
     * The highest OOM score, inherited by the command at fork: when the sandbox runs out of
     * memory the kernel takes the command. Set before we are undumpable (then the file is
     * root's); if we are taken instead, the sandbox ends, which is the command's end too.
     */
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "1000", 4) < 0) {
            /* Best effort, as in the per-call wrapper. */
        }
        close(fd);
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 || prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
        _exit(3);
    prctl(PR_SET_NAME, "agentbox-init", 0, 0, 0);
    lower_limits();

    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        _exit(3);

    write_all(1, HELLO, sizeof HELLO - 1);
    pid_t pid = fork();
    if (pid < 0) {
        static const char msg[] = "agentbox: cannot start the command: fork failed\n";
        write_all(2, msg, sizeof msg - 1);
        end(126);
    }
    if (pid == 0) {
        sigprocmask(SIG_UNBLOCK, &chld, NULL);
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) {
            dup2(null, 0);
            if (null != 0)
                close(null);
        }
        execvp(argv[1], argv + 1);
        int e = errno;
        dprintf(2, "agentbox: %s: %s\n", argv[1], strerror(e));
        _exit(e == ENOENT ? 127 : 126);
    }

    struct pollfd fds[2] = {{.fd = 0, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            end(1);
        }
        if (fds[0].revents) {
            char buf[256];
            ssize_t n = read(0, buf, sizeof buf);
            if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
                end(137);
        }
        if (fds[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {
            }
        }
        /* Orphans are reaped here too: PID 1 is every orphan's parent. */
        int st;
        pid_t reaped;
        while ((reaped = waitpid(-1, &st, WNOHANG)) > 0) {
            if (reaped == pid)
                end(WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1);
        }
    }
}
