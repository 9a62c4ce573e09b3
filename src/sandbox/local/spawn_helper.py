"""A process start without fork: clone3 with CLONE_VM|CLONE_VFORK, born in its cgroup.

`subprocess.Popen` can vfork only when it runs no Python in the child; a terminal needs
`TIOCSCTTY` (a preexec, so a full fork of this process's page tables), and a cgroup leaf
needs the child to move itself (a write to `cgroup.procs`, which waits for the kernel's
cgroup lock) or this process to hop into the leaf around the vfork. This helper, a few
lines of C built when the package is installed, does what both need in the
child between clone and exec, without Python: `setsid`, the three standard fds,
`TIOCSCTTY`, `chdir`, signal dispositions reset, every other fd closed, then `execve`
along the PATH. `clone3` places the child straight into its leaf (`CLONE_INTO_CGROUP`,
Linux 5.7) and hands back a pidfd (`CLONE_PIDFD`).

Why this is safe in a threaded Python: the child shares our memory only until it
execs, runs on a stack of its own (so no return address is shared, the trap of a plain
`vfork()` called from C), with every signal blocked until its handlers are reset to
the default, and calls nothing but system-call wrappers (no allocation, no lock). The
calling thread is suspended by the kernel until the child execs or exits; the GIL is
released meanwhile.

The C is `src/sandbox/_native/spawn.c`, the extension module `sandbox._native._spawn`
built when the package is installed (setup.py, optional). Where it is not there (the
install had no C compiler, not x86_64 Linux), `SANDBOX_NO_EXTENSIONS=1` is set, or
`clone3` is refused (a seccomp filter), `LocalProcess.spawn` keeps the `Popen` path,
which gives the same results, more slowly (docs/process-start.md).
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from .. import _native

STAGE_CLONE, STAGE_SETUP, STAGE_CHDIR, STAGE_EXEC = 0, 1, 2, 3


class CloneRefused(Exception):
    """clone3 itself failed (a seccomp filter, an old kernel, a cgroup that takes no
    process): the caller starts this process the `Popen` way."""


class Helper:
    """The extension's start, wrapped: `spawn` starts one process."""

    def __init__(self, spawn: Callable[..., tuple[int, int, int, int]]) -> None:
        self._spawn = spawn

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
        pid, pidfd, err, stage = self._spawn(
            paths,
            n_paths,
            args_block,
            len(args),
            environ_block,
            len(environ),
            place,
            *fds,
            int(tty),
            cgroup_fd,
            tuple(join_fds),
        )
        if pid > 0:
            return pid, pidfd
        code = err or errno.EINVAL
        if stage == STAGE_CLONE:
            raise CloneRefused(os.strerror(code))
        filename = cwd if stage == STAGE_CHDIR else argv[0]
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


def _select() -> tuple[Helper | None, str]:
    module, why = _native.load("_spawn")
    return (None, why) if module is None else (Helper(module.spawn), "")


# Chosen once, at import: the extension if the install built it and the switch is off.
_helper, _why = _select()


def loaded() -> Helper | None:
    """The helper, or None when processes start the `Popen` way (`reason()` says why)."""
    return _helper


def reason() -> str:
    """Why the helper is not in use ("" when it is)."""
    return "" if _helper is not None else _why


def disable(why: str) -> None:
    """Stop using the helper in this process (clone3 was refused)."""
    global _helper, _why
    _helper, _why = None, why
