"""Types of the C extension `sandbox._native._spawn` (src/sandbox/_native/spawn.c)."""

def spawn(
    paths: bytes,
    n_paths: int,
    argv: bytes,
    n_argv: int,
    envp: bytes,
    n_envp: int,
    cwd: bytes | None,
    fd0: int,
    fd1: int,
    fd2: int,
    tty: int,
    cgroup_fd: int,
    join_fds: tuple[int, ...],
    /,
) -> tuple[int, int, int, int]:
    """Start one process; (pid, pidfd, err, stage): pid > 0 started it."""
