"""Small C sources built with the host's C compiler at first use, kept in a private cache.

Two parts of the library are a few lines of C each: the process-start helper
(`sandbox.local.spawn_helper`) and the text accumulator of large windows
(`sandbox.output.ascii_text`). Neither ships compiled: each is built the first time a
process needs it, into a cache directory (`SANDBOX_CACHE_DIR`, else
`$XDG_CACHE_HOME/sandbox`, else `~/.cache/sandbox`; mode 0700), under a name derived
from its source and build flags, and loaded only if we own it and nobody else can
write it: a library someone else could swap would run their code in this process.

Every failure (no compiler, a compiler error, a cache others can write) raises
`Unusable` with a one-line reason; the callers then keep their pure-Python path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

CACHE_VARIABLE = "SANDBOX_CACHE_DIR"
BUILD_TIMEOUT_S = 60.0


T = TypeVar("T")


class Unusable(Exception):
    """A native part cannot be built or loaded here (the message says why)."""


class NativePart(Generic[T]):
    """One native part in this process: built and loaded at most once, by `prepare()`
    (blocking: sessions call it from a thread), or the reason it is not in use."""

    def __init__(self, load: Callable[[], T]) -> None:
        self.lock = threading.Lock()
        self.tried = False
        self.value: T | None = None
        self.why = "not built yet"
        self._load = load

    def prepare(self) -> T | None:
        """Build and load it the first time (later calls return what that found). Never
        raises: a failure is kept in `reason()` and the caller's pure-Python path runs."""
        with self.lock:
            if not self.tried:
                self.tried = True
                try:
                    self.value = self._load()
                    self.why = ""
                except (OSError, ImportError, Unusable) as exc:
                    self.value = None
                    self.why = str(exc)
            return self.value

    def reason(self) -> str:
        """Why it is not in use ("" when it is)."""
        return "" if self.value is not None else self.why

    def disable(self, why: str) -> None:
        """Stop using it in this process."""
        self.value = None
        self.why = why


def cached_library(stem: str, source: str, flags: Sequence[str], suffix: str = ".so") -> str:
    """The path of `source` built with `flags` as a shared library: built now into the
    cache if it is not there yet (blocking: call it off the event loop), checked private
    either way. Raises `Unusable`."""
    directory = cache_directory()
    digest = hashlib.sha256("\0".join([source, *flags, suffix]).encode()).hexdigest()[:16]
    path = os.path.join(directory, f"{stem}-{digest}{suffix}")
    if not os.path.exists(path):
        _build(directory, path, source, flags)
    check_private(path, directory=False)
    return path


def cache_directory() -> str:
    """The private cache directory (made if missing); `Unusable` if others can write it."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if not chosen:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(base, "sandbox")
    os.makedirs(chosen, mode=0o700, exist_ok=True)
    check_private(chosen, directory=True)
    return chosen


def check_private(path: str, *, directory: bool) -> None:
    """`Unusable` unless `path` is a directory (or regular file) of ours that nobody
    else can write."""
    info = os.lstat(path)
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if not kind_ok or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise Unusable(f"{path} is not a private {'directory' if directory else 'file'} of ours")


def _build(directory: str, target: str, source: str, flags: Sequence[str]) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise Unusable("no C compiler (cc or gcc) to build it with")
    with tempfile.TemporaryDirectory(dir=directory, prefix="build-") as work:
        source_path = os.path.join(work, "source.c")
        output = os.path.join(work, "library.so")
        with open(source_path, "w", encoding="utf-8") as handle:
            handle.write(source)
        try:
            done = subprocess.run(
                [compiler, *flags, "-shared", "-fPIC", "-o", output, source_path],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unusable(f"could not run {compiler}: {exc}") from None
        if done.returncode != 0:
            first = done.stderr.decode(errors="replace").strip().splitlines()[:1]
            raise Unusable(f"{compiler} failed: {' '.join(first)}")
        os.chmod(output, 0o700)
        # Atomic: a concurrent build of the same source renames the same bytes.
        os.replace(output, target)
