/* sandbox._native._spawn: a process start without fork (clone3 with CLONE_VM |
   CLONE_VFORK | CLONE_PIDFD | CLONE_INTO_CGROUP), the child set up without Python.

   Built at install time as an optional extension (setup.py); where it was not built,
   or SANDBOX_NO_EXTENSIONS is set, sandbox.local.spawn_helper finds none and
   LocalProcess starts processes through Popen. Why this is safe in a threaded Python
   and what the child does: docs/process-start.md and sandbox/local/spawn_helper.py.
   One function, spawn(), called by spawn_helper.Helper.spawn only. */

#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first: it sets _GNU_SOURCE and the feature macros */
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

static long sandbox_spawn(struct sandbox_spawn_request *req, int *pidfd) {
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


/* The number of NUL bytes in a bytes object's buffer: split_block walks `n` strings,
   so a block must hold at least `n` terminators (Python checks it holds exactly `n`;
   this keeps a wrong count from reading past the buffer). */
static Py_ssize_t count_nuls(const char *p, Py_ssize_t size) {
    Py_ssize_t count = 0;
    const char *end = p + size;
    while (p < end) {
        const char *nul = memchr(p, 0, (size_t)(end - p));
        if (nul == NULL) break;
        count++;
        p = nul + 1;
    }
    return count;
}

static int as_int(PyObject *obj, int *out) {
    long value = PyLong_AsLong(obj);
    if (value == -1 && PyErr_Occurred()) return -1;
    if (value < INT_MIN || value > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "value out of range for a C int");
        return -1;
    }
    *out = (int)value;
    return 0;
}

#define MAX_JOINS 64

/* spawn(paths, n_paths, argv, n_argv, envp, n_envp, cwd, fd0, fd1, fd2, tty, cgroup_fd,
         join_fds) -> (pid, pidfd, err, stage)
   Each of paths/argv/envp is one bytes block of n NUL-terminated strings; cwd is bytes
   or None; join_fds a tuple of ints. pid > 0: started, pidfd is ours to close. Else
   err is the errno and stage where it failed (0 clone3, 1 setup, 2 chdir, 3 exec). */
static PyObject *py_spawn(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 13) {
        PyErr_Format(PyExc_TypeError, "spawn() takes 13 arguments (%zd given)", nargs);
        return NULL;
    }
    struct sandbox_spawn_request req;
    memset(&req, 0, sizeof req);
    const char *blocks[3];
    int counts[3];
    for (int i = 0; i < 3; i++) {
        PyObject *block = args[2 * i];
        if (!PyBytes_Check(block)) {
            PyErr_SetString(PyExc_TypeError, "a string block must be bytes");
            return NULL;
        }
        if (as_int(args[2 * i + 1], &counts[i]) < 0) return NULL;
        if (counts[i] < 0 ||
            count_nuls(PyBytes_AS_STRING(block), PyBytes_GET_SIZE(block)) < counts[i]) {
            PyErr_SetString(PyExc_ValueError, "a block holds fewer strings than its count");
            return NULL;
        }
        blocks[i] = PyBytes_AS_STRING(block);
    }
    if (counts[1] < 1) {
        PyErr_SetString(PyExc_ValueError, "argv must not be empty");
        return NULL;
    }
    req.paths = blocks[0];
    req.n_paths = counts[0];
    req.argv = blocks[1];
    req.n_argv = counts[1];
    req.envp = blocks[2];
    req.n_envp = counts[2];
    PyObject *cwd = args[6];
    if (cwd == Py_None) {
        req.cwd = NULL;
    } else if (PyBytes_Check(cwd) && strlen(PyBytes_AS_STRING(cwd)) == (size_t)PyBytes_GET_SIZE(cwd)) {
        req.cwd = PyBytes_AS_STRING(cwd);
    } else {
        PyErr_SetString(PyExc_ValueError, "cwd must be bytes without a NUL, or None");
        return NULL;
    }
    for (int i = 0; i < 3; i++)
        if (as_int(args[7 + i], &req.fds[i]) < 0) return NULL;
    if (as_int(args[10], &req.tty) < 0 || as_int(args[11], &req.cgroup_fd) < 0) return NULL;
    PyObject *joins = args[12];
    if (!PyTuple_Check(joins) || PyTuple_GET_SIZE(joins) > MAX_JOINS) {
        PyErr_SetString(PyExc_ValueError, "join_fds must be a tuple of at most 64 fds");
        return NULL;
    }
    int join_fds[MAX_JOINS];
    req.n_join = (int)PyTuple_GET_SIZE(joins);
    for (int i = 0; i < req.n_join; i++)
        if (as_int(PyTuple_GET_ITEM(joins, i), &join_fds[i]) < 0) return NULL;
    req.join_fds = join_fds;
    int pidfd = -1;
    long pid;
    /* The caller's references keep every buffer alive; the calling thread waits in the
       kernel until the child execs or exits, the other threads run meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    pid = sandbox_spawn(&req, &pidfd);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(liii)", pid, pidfd, req.err, req.stage);
}

static PyMethodDef methods[] = {
    {"spawn", (PyCFunction)(void (*)(void))py_spawn, METH_FASTCALL,
     "Start one process (see spawn.c); (pid, pidfd, err, stage)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sandbox._native._spawn",
    "A process start without fork (clone3); see sandbox.local.spawn_helper.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__spawn(void) {
    return PyModule_Create(&module_def);
}
