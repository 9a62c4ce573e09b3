"""Small C sources built with the host's C compiler at first use, kept in a private cache.

Two parts of the library are a few lines of C each: the process-start helper
(`sandbox.local.spawn_helper`) and the text accumulator of large windows
(`sandbox.output.ascii_text`). Neither ships compiled: each is built the first time a
process needs it, into a cache directory (`SANDBOX_CACHE_DIR`, else
`$XDG_CACHE_HOME/sandbox`, else `~/.cache/sandbox`; mode 0700), under a name derived
from its source and build flags. A library someone else could write or swap would run
their code in this process (often root), so:

- Every folder from / down to the cache is opened one component at a time with
  O_NOFOLLOW relative to its parent's fd, and checked on that fd: owned by root or by us,
  and not writable by group or others unless sticky (like /tmp; each component below is
  then ours or root's, so nobody else can rename it away). The cache itself must be ours
  and private. The path is resolved (`realpath`) first: what is checked is where the
  walk really went, and a component swapped for a link meanwhile fails the walk.
- The library is opened once, relative to the cache's fd (O_NOFOLLOW), checked on that
  fd (a regular file of ours or root's nobody else can write) and loaded through that
  fd, never re-opened by name. The name given to the loader is
  `/proc/self/task/<loading thread>/fd/N`, not `/proc/self/fd/N`: the dynamic loader
  hands back a library already loaded under the same name, and the two parts would
  often get the same `N` (each is loaded in its own thread, so the names differ).
- A build runs in a private folder made inside the checked cache; the compiler's
  output is opened and checked there, then renamed into place relative to the fds.
- The compiler runs in its own process group under one deadline for the whole build
  (`BUILD_DEADLINE_S`); at the deadline, or once it exits, the whole group is killed,
  so nothing it started is left behind (nor at interpreter exit).
- `NativePart.prepare` builds in a background thread. A session start waits for it at
  most `START_WAIT_S` and otherwise starts on the pure-Python path; the part is used
  from the moment it is ready. A start cancelled during that wait has made nothing.

Every failure (no compiler, a compiler error, a cache or a folder above it others
control) raises `Unusable` with a one-line reason, kept in `NativePart.reason()`; the
callers then keep their pure-Python path.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

CACHE_VARIABLE = "SANDBOX_CACHE_DIR"
BUILD_DEADLINE_S = 30.0
"""The whole build of one part (the compiler's run included) must end within this."""
START_WAIT_S = 0.5
"""The longest a session start waits for one part being built (two parts: 1 s)."""

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC

T = TypeVar("T")


class Unusable(Exception):
    """A native part cannot be built or loaded here (the message says why)."""


class NativePart(Generic[T]):
    """One native part in this process: built and loaded at most once, in a background
    thread started by the first `prepare()`, or the reason it is not in use.

    `lock` is held by that thread for the whole build and load (and by anyone setting
    `tried`, `value` and `why` by hand)."""

    def __init__(self, load: Callable[[], T]) -> None:
        self.lock = threading.Lock()
        self.tried = False
        self.value: T | None = None
        self.why = "not built yet"
        self._load = load
        self._starting = threading.Lock()
        self._done: threading.Event | None = None

    def prepare(self, wait_s: float | None = None) -> T | None:
        """Start the build and load the first time, then wait for it at most `wait_s`
        seconds (None: until it ends); the part, or None if it is not ready or not
        usable. Never raises: a failure is kept in `reason()` and the caller's
        pure-Python path runs."""
        with self._starting:
            if not self.tried:
                self.tried = True
                self._done = threading.Event()
                threading.Thread(
                    target=self._run, args=(self._done,), name="sandbox-native", daemon=True
                ).start()
            done = self._done
        if done is not None:
            done.wait(wait_s)
        return self.value

    def _run(self, done: threading.Event) -> None:
        try:
            with self.lock:
                try:
                    value = self._load()
                except Exception as exc:  # kept as the reason: a thread has no caller
                    self.value = None
                    self.why = str(exc) or type(exc).__name__
                else:
                    self.value = value
                    self.why = ""
        finally:
            done.set()

    def reason(self) -> str:
        """Why it is not in use ("" when it is)."""
        return "" if self.value is not None else self.why

    def disable(self, why: str) -> None:
        """Stop using it in this process."""
        self.value = None
        self.why = why


@contextlib.contextmanager
def cached_library(
    stem: str, source: str, flags: Sequence[str], suffix: str = ".so"
) -> Iterator[str]:
    """`source` built with `flags` as a shared library (built now into the cache if it
    is not there yet: blocking, call it off the event loop), checked, and open: yields a
    `/proc/self/task/<this thread>/fd/N` path to load it from in this thread, valid
    inside the `with`. Raises `Unusable`."""
    deadline = time.monotonic() + BUILD_DEADLINE_S
    digest = hashlib.sha256("\0".join([source, *flags, suffix]).encode()).hexdigest()[:16]
    name = f"{stem}-{digest}{suffix}"
    directory, where = open_cache_directory()
    try:
        fd = _open_library(directory, name, where)
        if fd is None:
            fd = _build(directory, where, name, source, flags, deadline)
    finally:
        os.close(directory)
    try:
        yield _fd_path(fd, os.path.join(where, name))
    finally:
        os.close(fd)  # a loaded library stays mapped without it


def open_cache_directory() -> tuple[int, str]:
    """An fd of the private cache directory (made if missing) and its path, after the
    walk from / described in the module docstring. `Unusable` if it or a folder above
    it is not safe."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if not chosen:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(base, "sandbox")
    real = os.path.realpath(chosen)
    names = [name for name in real.split("/") if name]
    fd = os.open("/", _DIRECTORY_FLAGS)
    where = "/"
    try:
        _check_folder(fd, where, last=not names)
        for index, name in enumerate(names):
            where = os.path.join(where, name)
            child = _open_or_make(fd, name, where)
            os.close(fd)
            fd = child
            _check_folder(fd, where, last=index == len(names) - 1)
    except BaseException:
        os.close(fd)
        raise
    return fd, where


def _open_or_make(parent: int, name: str, where: str) -> int:
    for _ in range(2):
        try:
            return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):  # made meanwhile: open that
                os.mkdir(name, 0o700, dir_fd=parent)
        except OSError as exc:  # ELOOP, ENOTDIR: a link or a file where a folder goes
            raise Unusable(f"{where} is not a folder ({exc.strerror})") from None
    raise Unusable(f"{where} keeps disappearing")


def _check_folder(fd: int, where: str, *, last: bool) -> None:
    info = os.fstat(fd)
    me = os.geteuid()
    mode = stat.S_IMODE(info.st_mode)
    if last:
        if info.st_uid != me or mode & 0o022:
            raise Unusable(
                f"{where} is not a private directory of ours (owner uid {info.st_uid},"
                f" mode {mode:o})"
            )
    elif info.st_uid not in (0, me):
        raise Unusable(f"{where}, above the cache, is owned by uid {info.st_uid} (not us or root)")
    elif mode & 0o022 and not mode & stat.S_ISVTX:
        raise Unusable(f"{where}, above the cache, is writable by others (mode {mode:o})")


def _check_file(fd: int, where: str) -> None:
    info = os.fstat(fd)
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, os.geteuid()) or mode & 0o022:
        raise Unusable(f"{where} is not a private file of ours (owner uid {info.st_uid})")


def _open_library(directory: int, name: str, where: str) -> int | None:
    """The cached library opened and checked, None if there is none yet."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=directory)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Unusable(f"{os.path.join(where, name)} cannot be opened ({exc.strerror})") from None
    try:
        _check_file(fd, os.path.join(where, name))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fd_path(fd: int, where: str) -> str:
    """The /proc path that opens the very file `fd` is (checked: /proc must be there)."""
    path = f"/proc/self/task/{threading.get_native_id()}/fd/{fd}"
    held, named = os.fstat(fd), None
    with contextlib.suppress(OSError):
        named = os.stat(path)
    if named is None or (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
        raise Unusable(f"no /proc/self/task/*/fd to load {where} from its checked fd")
    return path


def _build(
    directory: int, where: str, name: str, source: str, flags: Sequence[str], deadline: float
) -> int:
    """Compile into a private folder of the cache; the checked output, renamed into
    place, is returned open."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise Unusable("no C compiler (cc or gcc) to build it with")
    scratch = f"build-{secrets.token_hex(8)}"
    os.mkdir(scratch, 0o700, dir_fd=directory)
    try:
        work = os.open(scratch, _DIRECTORY_FLAGS, dir_fd=directory)
        try:
            _check_folder(work, os.path.join(where, scratch), last=True)
            written = os.open(
                "source.c", os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o600, dir_fd=work
            )
            with open(written, "w", encoding="utf-8") as handle:
                handle.write(source)
            errors = os.open(
                "errors.txt", os.O_RDWR | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o600, dir_fd=work
            )
            try:
                argv = [compiler, *flags, "-shared", "-fPIC", "-o", "library.so", "source.c"]
                status = _compile(argv, work, errors, deadline)
                # pread: the compiler's writes moved the offset this fd shares with it.
                said = os.pread(errors, 4096, 0) if status != 0 else b""
            finally:
                os.close(errors)
            if status != 0:
                first = said.decode(errors="replace").strip().splitlines()[:1]
                raise Unusable(f"{compiler} failed: {' '.join(first)}")
            fd = os.open("library.so", _FILE_FLAGS, dir_fd=work)
            try:
                os.fchmod(fd, 0o700)
                _check_file(fd, os.path.join(where, scratch, "library.so"))
                # Atomic: a concurrent build of the same source renames the same bytes.
                os.rename("library.so", name, src_dir_fd=work, dst_dir_fd=directory)
            except BaseException:
                os.close(fd)
                raise
            return fd
        finally:
            os.close(work)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch, dir_fd=directory)


_RUNNING: set[int] = set()
_RUNNING_LOCK = threading.Lock()


def _compile(argv: list[str], work: int, errors: int, deadline: float) -> int:
    """Run the compiler in `work` (its own process group) until it exits or the deadline
    passes; its group is killed either way. Its exit status (-9 when it was killed)."""
    try:
        # The child chdirs through its own copy of `work` before exec (cwd is resolved
        # there), so the folder is the one checked, not one found again by name.
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            cwd=f"/proc/self/fd/{work}",
            start_new_session=True,
        )
    except OSError as exc:
        raise Unusable(f"could not run {argv[0]}: {exc}") from None
    with _RUNNING_LOCK:
        _RUNNING.add(process.pid)
    try:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            watch = os.pidfd_open(process.pid)
        except OSError:
            watch = -1
        if watch >= 0:
            # Readable once it exits; it stays unreaped (so its group id cannot be reused)
            # until the group is killed below.
            try:
                poller = select.poll()  # not select(): the fd may be past FD_SETSIZE
                poller.register(watch, select.POLLIN)
                exited = bool(poller.poll(remaining * 1000))
            finally:
                os.close(watch)
            _kill_group(process.pid)
        else:
            try:
                process.wait(remaining)
                exited = True
            except subprocess.TimeoutExpired:
                exited = False
                _kill_group(process.pid)
        status = process.wait()
    except BaseException:
        _kill_group(process.pid)
        process.wait()
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(process.pid)
    if not exited:
        raise Unusable(f"{argv[0]} did not finish within {BUILD_DEADLINE_S:g} s (killed)")
    return status


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@atexit.register
def _kill_running_builds() -> None:
    # Build threads are daemons: a compiler still running at exit goes with us.
    with _RUNNING_LOCK:
        for pid in _RUNNING:
            _kill_group(pid)
