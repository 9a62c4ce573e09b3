"""A process start without fork: clone3 with CLONE_VM|CLONE_VFORK, born in its cgroup.

`subprocess.Popen` can vfork only when it runs no Python in the child; a terminal needs
`TIOCSCTTY` (a preexec, so a full fork of this process's page tables), and a cgroup leaf
needs the child to move itself (a write to `cgroup.procs`, which waits for the kernel's
cgroup lock) or this process to hop into the leaf around the vfork. This helper, a few
lines of C compiled with the host's C compiler at first use, does what both need in the
child between clone and exec, without Python: `setsid`, the three standard fds,
`TIOCSCTTY`, `chdir`, signal dispositions reset, every other fd closed, then `execve`
along the PATH. `clone3` places the child straight into its leaf (`CLONE_INTO_CGROUP`,
Linux 5.7) and hands back a pidfd (`CLONE_PIDFD`).

Why this is safe in a threaded Python: the child shares our memory only until it
execs, runs on a stack of its own (so no return address is shared, the trap of a plain
`vfork()` called from C), with every signal blocked until its handlers are reset to
the default, and calls nothing but system-call wrappers (no allocation, no lock). The
calling thread is suspended by the kernel until the child execs or exits; the GIL is
released meanwhile (a ctypes call).

Where it cannot be used (no compiler, not x86_64 Linux, `clone3` refused by a seccomp
filter, `SANDBOX_SPAWN_HELPER=0`), `LocalProcess.spawn` keeps the `Popen` path. The
library is built and cached by `sandbox.native` (a private cache directory, a name
derived from the source, loaded only if we own it and nobody else can write it).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import platform
import sys
from collections.abc import Mapping, Sequence

from .. import native

DISABLE_VARIABLE = "SANDBOX_SPAWN_HELPER"
CACHE_VARIABLE = native.CACHE_VARIABLE
STAGE_CLONE, STAGE_SETUP, STAGE_CHDIR, STAGE_EXEC = 0, 1, 2, 3

SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#ifndef __x86_64__
#error "the clone3 call below is written for x86_64"
#endif

#define F_CLONE_VM 0x00000100ULL
#define F_CLONE_PIDFD 0x00001000ULL
#define F_CLONE_VFORK 0x00004000ULL
#define F_CLONE_INTO_CGROUP 0x200000000ULL
#define STACK_SIZE (128 * 1024)
#define GUARD_SIZE 4096

struct clone3_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls,
        set_tid, set_tid_size, cgroup;
};

/* Each list (the program's candidate paths, argv, the environment) comes as one block
   of NUL-terminated strings and their count: one bytes object from Python, where an
   array of pointers built through ctypes cost a start more than all the rest. */
struct sandbox_spawn_request {
    const char *paths;
    int n_paths;
    const char *argv;
    int n_argv;
    const char *envp;
    int n_envp;
    const char *cwd;
    int fds[3];
    int tty;
    int cgroup_fd;
    const int *join_fds;
    int n_join;
    int err;
    int stage;
};

struct child_args {
    struct sandbox_spawn_request *req;
    sigset_t *old_mask;
    char **paths, **argv, **envp;
};

/* The pointer array of a block's `n` strings, NULL-terminated (freed by the caller). */
static char **split_block(const char *block, int n) {
    char **out = malloc((size_t)(n + 1) * sizeof *out);
    if (out == NULL) return NULL;
    const char *p = block;
    for (int i = 0; i < n; i++) {
        out[i] = (char *)p;
        p += strlen(p) + 1;
    }
    out[n] = NULL;
    return out;
}

static void fail(struct sandbox_spawn_request *req, int stage) {
    req->err = errno ? errno : EINVAL;
    req->stage = stage;
    syscall(SYS_exit_group, 127);
}

/* Runs on its own stack, in the parent's memory, while the parent thread is suspended
   (CLONE_VFORK): system-call wrappers only, nothing that allocates or takes a lock. */
static int child_main(void *arg) {
    struct child_args *ca = arg;
    struct sandbox_spawn_request *req = ca->req;
    struct sigaction dfl, old;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &old) != 0) continue;
        /* Python's handlers must never run here; Python ignores SIGPIPE and SIGXFSZ
           and a caller may ignore SIGINT/SIGQUIT: the command gets the defaults. A
           signal already at its default needs no call (most of them: half the calls
           this loop made, all inside the parent's vfork wait). */
        if (old.sa_handler == SIG_DFL) continue;
        int force = sig == SIGPIPE || sig == SIGXFSZ || sig == SIGINT || sig == SIGQUIT;
        if (force || old.sa_handler != SIG_IGN) sigaction(sig, &dfl, NULL);
    }
    if (setsid() < 0) fail(req, 1);
    int high[3];
    for (int i = 0; i < 3; i++) {
        int src = req->fds[i];
        if (src < 0 && (src = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) fail(req, 1);
        /* Above 2 first: a source that is itself 0, 1 or 2 survives the dup2s. */
        if ((high[i] = fcntl(src, F_DUPFD_CLOEXEC, 10)) < 0) fail(req, 1);
    }
    for (int i = 0; i < 3; i++)
        if (dup2(high[i], i) < 0) fail(req, 1);
    if (req->tty && ioctl(0, TIOCSCTTY, 0) < 0) fail(req, 1);
    if (req->cwd != NULL && chdir(req->cwd) < 0) fail(req, 2);
    for (int i = 0; i < req->n_join; i++)
        if (write(req->join_fds[i], "0", 1) != 1) fail(req, 1);
    if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
        struct rlimit lim;
        long top = 65536;
        if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 65536) top = (long)lim.rlim_cur;
        for (long fd = 3; fd < top; fd++) close((int)fd);
    }
    sigprocmask(SIG_SETMASK, ca->old_mask, NULL);
    int saved = 0;
    for (char **p = ca->paths; *p != NULL; p++) {
        execve(*p, ca->argv, ca->envp);
        if (errno != ENOENT && errno != ENOTDIR && saved == 0) saved = errno;
    }
    if (saved) errno = saved;
    fail(req, 3);
    return 127;
}

/* clone3 onto a fresh stack: the child starts there and calls child_main; the
   parent's stack and callee-saved registers are left as they were. */
static long clone3_run(struct clone3_args *cl, struct child_args *ca) {
    long ret;
    register long fn __asm__("r12") = (long)child_main;
    register long fa __asm__("r13") = (long)ca;
    __asm__ volatile(
        "syscall\n\t"
        "test %%rax, %%rax\n\t"
        "jnz 1f\n\t"
        "xor %%ebp, %%ebp\n\t"
        "mov %%r13, %%rdi\n\t"
        "call *%%r12\n\t"
        "mov %%eax, %%edi\n\t"
        "mov $231, %%eax\n\t"
        "syscall\n\t"
        "hlt\n\t"
        "1:\n\t"
        : "=a"(ret)
        : "0"((long)SYS_clone3), "D"(cl), "S"(sizeof *cl), "r"(fn), "r"(fa)
        : "rcx", "r11", "memory", "cc");
    return ret;
}

static long spawn_split(struct sandbox_spawn_request *req, int *pidfd, struct child_args *ca);

long sandbox_spawn(struct sandbox_spawn_request *req, int *pidfd) {
    req->err = 0;
    req->stage = 0;
    struct child_args ca = {req, NULL, NULL, NULL, NULL};
    ca.paths = split_block(req->paths, req->n_paths);
    ca.argv = split_block(req->argv, req->n_argv);
    ca.envp = split_block(req->envp, req->n_envp);
    long pid = -1;
    if (ca.paths == NULL || ca.argv == NULL || ca.envp == NULL) {
        req->err = ENOMEM;
        req->stage = 1;
    } else {
        pid = spawn_split(req, pidfd, &ca);
    }
    free(ca.paths);
    free(ca.argv);
    free(ca.envp);
    return pid;
}

/* One child stack is kept for the next spawn: a stack is free again once clone3
   returns (CLONE_VFORK: the child has exec'd or exited), and a fresh mapping, its guard
   and its first faults cost each start a few microseconds. A spawn that finds the
   spare taken (another thread's, at the same moment) maps its own. */
static char *spare_stack;

static char *take_stack(void) {
    char *stack = __atomic_exchange_n(&spare_stack, NULL, __ATOMIC_ACQ_REL);
    if (stack != NULL) return stack;
    stack = mmap(NULL, STACK_SIZE, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) return NULL;
    mprotect(stack, GUARD_SIZE, PROT_NONE); /* an overflow faults instead of corrupting */
    return stack;
}

static void give_back_stack(char *stack) {
    char *none = NULL;
    if (!__atomic_compare_exchange_n(&spare_stack, &none, stack, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        munmap(stack, STACK_SIZE);
}

static long spawn_split(struct sandbox_spawn_request *req, int *pidfd, struct child_args *cap) {
    char *stack = take_stack();
    if (stack == NULL) {
        req->err = errno;
        return -1;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    struct child_args ca = *cap;
    ca.old_mask = &old;
    struct clone3_args cl;
    memset(&cl, 0, sizeof cl);
    int fd = -1;
    cl.flags = F_CLONE_VM | F_CLONE_VFORK | F_CLONE_PIDFD;
    cl.pidfd = (uint64_t)(uintptr_t)&fd;
    cl.exit_signal = SIGCHLD;
    cl.stack = (uint64_t)(uintptr_t)stack;
    cl.stack_size = STACK_SIZE;
    if (req->cgroup_fd >= 0) {
        cl.flags |= F_CLONE_INTO_CGROUP;
        cl.cgroup = (uint64_t)req->cgroup_fd;
    }
    long pid = clone3_run(&cl, &ca);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    give_back_stack(stack);
    if (pid < 0) {
        req->err = (int)-pid;
        req->stage = 0;
        return -1;
    }
    if (req->err != 0) {
        int status;
        while (waitpid((pid_t)pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (fd >= 0) close(fd);
        return -1;
    }
    *pidfd = fd;
    return pid;
}
"""


class _Request(ctypes.Structure):
    _fields_ = [
        ("paths", ctypes.c_char_p),
        ("n_paths", ctypes.c_int),
        ("argv", ctypes.c_char_p),
        ("n_argv", ctypes.c_int),
        ("envp", ctypes.c_char_p),
        ("n_envp", ctypes.c_int),
        ("cwd", ctypes.c_char_p),
        ("fds", ctypes.c_int * 3),
        ("tty", ctypes.c_int),
        ("cgroup_fd", ctypes.c_int),
        ("join_fds", ctypes.POINTER(ctypes.c_int)),
        ("n_join", ctypes.c_int),
        ("err", ctypes.c_int),
        ("stage", ctypes.c_int),
    ]


class CloneRefused(Exception):
    """clone3 itself failed (a seccomp filter, an old kernel, a cgroup that takes no
    process): the caller starts this process the `Popen` way."""


class Helper:
    """The loaded library: `spawn` starts one process."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._spawn = library.sandbox_spawn
        self._spawn.argtypes = [ctypes.POINTER(_Request), ctypes.POINTER(ctypes.c_int)]
        self._spawn.restype = ctypes.c_long

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        fds: tuple[int, int, int],
        tty: bool,
        cgroup_fd: int = -1,
        join_fds: Sequence[int] = (),
    ) -> tuple[int, int]:
        """Start `argv` in a new session with `fds` as its 0, 1 and 2 (-1 for 0:
        /dev/null), fd 0 as its controlling terminal with `tty`, inside the cgroup
        directory `cgroup_fd` opens; returns (pid, pidfd).

        Raises OSError as `Popen` would (`filename` the cwd or the program), ValueError
        for a NUL byte or a bad variable name, `CloneRefused` if clone3 failed.
        """
        program = os.fsencode(argv[0])
        paths, n_paths = _candidates(program, env.get("PATH"))
        args = [os.fsencode(a) for a in argv]
        known = _VARIABLES.get  # the common case inline: a call per variable costs more
        environ = [known(item) or _variable(*item) for item in env.items()]
        place = None if cwd is None else os.fsencode(cwd)
        args_block, environ_block = _block(args), _block(environ)
        # One count per block finds a NUL inside any of its strings.
        if (
            args_block.count(0) != len(args)
            or environ_block.count(0) != len(environ)
            or (place is not None and 0 in place)
        ):
            raise ValueError("embedded null byte")
        joins = (ctypes.c_int * max(len(join_fds), 1))(*join_fds)
        request = _Request(
            paths,
            n_paths,
            args_block,
            len(args),
            environ_block,
            len(environ),
            place,
            (ctypes.c_int * 3)(*fds),
            int(tty),
            cgroup_fd,
            joins,
            len(join_fds),
            0,
            0,
        )
        pidfd = ctypes.c_int(-1)
        pid = self._spawn(ctypes.byref(request), ctypes.byref(pidfd))
        if pid > 0:
            return pid, pidfd.value
        code = request.err or errno.EINVAL
        if request.stage == STAGE_CLONE:
            raise CloneRefused(os.strerror(code))
        filename = cwd if request.stage == STAGE_CHDIR else argv[0]
        raise OSError(code, os.strerror(code), filename)


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


@functools.lru_cache(maxsize=16)
def _exec_dirs(path: str | None) -> tuple[bytes, ...]:
    """The directories `Popen` searches for a program under this PATH (None: the
    default), encoded; cached, it is a pure function of the string."""
    return tuple(os.fsencode(d) for d in os.get_exec_path({} if path is None else {"PATH": path}))


@functools.lru_cache(maxsize=64)
def _candidates(program: bytes, path: str | None) -> tuple[bytes, int]:
    """Where `execve` tries `program` under this PATH, in order, as a block (`_block`)
    and its count; cached, it is a pure function of the two."""
    if b"/" in program:
        return _block([program]), 1
    paths = [os.path.join(d, program) for d in _exec_dirs(path)]
    return _block(paths), len(paths)


# `KEY=value` as bytes, by (key, value): most of a start's environment is the same at
# every start, and encoding it again cost a start about 10 us. Bounded: emptied when full.
_VARIABLES: dict[tuple[str, str], bytes] = {}
_VARIABLES_MAX = 4096


def _variable(key: str, value: str) -> bytes:
    """One environment entry, encoded as `os.fsencode` would; ValueError for a name
    that cannot be one."""
    pair = (key, value)
    encoded = _VARIABLES.get(pair)
    if encoded is None:
        if not key or "=" in key:
            raise ValueError("illegal environment variable name")
        encoded = f"{key}={value}".encode(_FS_ENCODING, _FS_ERRORS)
        if len(_VARIABLES) >= _VARIABLES_MAX:
            _VARIABLES.clear()
        _VARIABLES[pair] = encoded
    return encoded


def _block(items: Sequence[bytes]) -> bytes:
    """`items` as the helper reads a list: each string followed by a NUL (none holds
    one: `spawn` checks)."""
    return b"\0".join(items) + b"\0"


def _load() -> Helper:
    with _library() as path:
        return Helper(ctypes.CDLL(path))


_PART = native.NativePart(_load)


def tried() -> bool:
    """Whether `prepare()` ran in this process (whatever it found)."""
    return _PART.tried


def loaded() -> Helper | None:
    """The helper if `prepare()` made it usable (never builds: no blocking here)."""
    return _PART.value


def reason() -> str:
    """Why the helper is not in use ("" when it is)."""
    return _PART.reason()


def disable(why: str) -> None:
    """Stop using the helper in this process (clone3 was refused)."""
    _PART.disable(why)


def prepare(wait_s: float | None = None) -> Helper | None:
    """Build (once per cache directory and source) and load the helper in the
    background, waiting for it at most `wait_s` (None: until done); blocking, so
    sessions call it from a thread. Never raises: a failure is kept in `reason()`."""
    return _PART.prepare(wait_s)


def prepare_for_start() -> Helper | None:
    """`prepare` as a session start calls it (from a thread): it waits at most
    `native.START_WAIT_S`, and the start goes on without it if it is not ready then (a
    compiler that hangs holds no start up)."""
    return _PART.prepare(native.START_WAIT_S)


def _library() -> contextlib.AbstractContextManager[str]:
    if os.environ.get(DISABLE_VARIABLE, "") == "0":
        raise native.Unusable(f"{DISABLE_VARIABLE}=0")
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "amd64"):
        raise native.Unusable(f"written for x86_64 Linux, not {sys.platform} {platform.machine()}")
    return native.cached_library("spawn", SOURCE, ["-O2"])
