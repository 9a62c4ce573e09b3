"""The runner binary shipped as package data (`sandbox/runner/bin/`), its content hash
(what delivery into a sandbox checks), and why it is missing when it is.

The install builds `sandbox-runner-linux-<arch>` from the crate in runner/ (setup.py's
`build_runner`, run by `pip install .`, `python -m build` and `make install`; `make
runner` alone too). Where it could not, the build may leave `bin/NOT-BUILT`, one line saying why
(cargo missing, ...): `unavailable_reason()` passes it on for `sandbox backends`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import stat
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

BINARY_PREFIX = "sandbox-runner-linux-"
NOT_BUILT_NOTE = "NOT-BUILT"
_MAX_NOTE = 200  # characters of the note passed on
# `uname -m` spellings of the architectures a build may exist for.
_ARCHES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


@dataclass(frozen=True, slots=True)
class RunnerBinary:
    """The packaged runner for one architecture: where it is and its content."""

    path: Path
    sha256: str
    size: int


def binary_name(machine: str | None = None) -> str | None:
    """The packaged file name for a sandbox whose `uname -m` is `machine` (this host's
    when omitted), or None for an architecture no build exists for."""
    arch = _ARCHES.get((machine or platform.machine()).lower())
    return None if arch is None else BINARY_PREFIX + arch


def bin_dir() -> Path:
    """The folder of the packaged binaries (it may hold none)."""
    return Path(str(resources.files("sandbox.runner").joinpath("bin")))


# path -> (identity of the file when hashed, its hash): hashing 1-2 MB once per process.
_hashes: dict[Path, tuple[tuple[int, int, int, int], str]] = {}


def _sha256(path: Path, st: os.stat_result) -> str:
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _hashes.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    _hashes[path] = (key, digest.hexdigest())
    return digest.hexdigest()


def runner_binary(machine: str | None = None) -> RunnerBinary | None:
    """The packaged runner for `machine` (this host's when omitted), or None when the
    package holds none (`unavailable_reason` says why)."""
    name = binary_name(machine)
    if name is None:
        return None
    path = bin_dir() / name
    try:
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    return RunnerBinary(path, _sha256(path, st), st.st_size)


def unavailable_reason(machine: str | None = None) -> str | None:
    """Why there is no runner for `machine`, as one line for `sandbox backends`
    ("runner: not built (cargo missing at install)"), or None when there is one."""
    name = binary_name(machine)
    if name is None:
        return f"runner: no build for {machine or platform.machine()}"
    if runner_binary(machine) is not None:
        return None
    try:
        with (bin_dir() / NOT_BUILT_NOTE).open("r", encoding="utf-8", errors="replace") as note:
            why = " ".join(note.read(_MAX_NOTE).split())
    except OSError:
        why = ""
    if not why:
        # No note: the likely cause is the usual one, said the way `sandbox backends` does.
        why = (
            "cargo missing at install"
            if shutil.which("cargo") is None
            else f"no {name} in the package; `make runner` builds it"
        )
    return f"runner: not built ({why})"
