"""Reading this host's /proc, for leak checks in tests and in the stand-ins.

Processes behind the stand-ins and fakes, and those in Docker containers, all run on
this kernel, so a test finds what any backend left behind by looking here: by a unique
argument (`pids_with_arg`), by an environment tag (`pids_with_env`), by session or
process group (`pids_where`). "Live" means present and not a zombie: a zombie has
exited and only waits to be reaped. Every read tolerates a process that vanishes
between the listing and the read (it is simply not listed).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "ProcStat",
    "alive",
    "children",
    "cmdline",
    "describe",
    "environ",
    "fd_targets",
    "open_fds",
    "pids",
    "pids_where",
    "pids_with_arg",
    "pids_with_env",
    "rss_bytes",
    "stat",
]


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the tests use (see proc(5))."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start_time: int

    @property
    def zombie(self) -> bool:
        """Whether the process exited and waits to be reaped."""
        return self.state == "Z"


def pids() -> list[int]:
    """Every process id /proc lists now."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def stat(pid: int) -> ProcStat | None:
    """The stat fields of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold ") ": split at the last.
    fields = raw.rsplit(b")", 1)[-1].split()
    try:
        return ProcStat(
            pid, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
        )
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    info = stat(pid)
    return info is not None and not info.zombie


def _read_list(path: str) -> list[bytes] | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data.split(b"\0")[:-1] if data.endswith(b"\0") else data.split(b"\0")


def cmdline(pid: int) -> list[bytes] | None:
    """The argv of `pid` (None when it is gone or unreadable)."""
    return _read_list(f"/proc/{pid}/cmdline")


def environ(pid: int) -> list[bytes] | None:
    """The environment of `pid` as `NAME=value` items (None when gone or unreadable)."""
    return _read_list(f"/proc/{pid}/environ")


def pids_where(match: Callable[[ProcStat], bool], *, include_self: bool = False) -> list[int]:
    """Live processes whose stat fields `match` (this test process left out unless
    `include_self`)."""
    me = os.getpid()
    found = []
    for pid in pids():
        if pid == me and not include_self:
            continue
        info = stat(pid)
        if info is not None and not info.zombie and match(info):
            found.append(pid)
    return found


def pids_with_arg(arg: str) -> list[int]:
    """Live processes whose argv holds `arg` as one whole argument."""
    wanted = arg.encode()
    found = []
    for pid in pids():
        argv = cmdline(pid)
        if argv is not None and wanted in argv and alive(pid):
            found.append(pid)
    return found


def pids_with_env(name: str, value: str, *, prefix: bool = False) -> list[int]:
    """Live processes whose environment sets `name` to `value` (with `prefix`: to a
    value starting with it). This test process is left out."""
    wanted = f"{name}={value}".encode()
    me = os.getpid()
    found = []
    for pid in pids():
        if pid == me:
            continue
        items = environ(pid)
        if items is None:
            continue
        hit = any(i.startswith(wanted) for i in items) if prefix else wanted in items
        if hit and alive(pid):
            found.append(pid)
    return found


def children(pid: int | None = None) -> set[int]:
    """Direct children of `pid` (default: this process), zombies included."""
    parent = os.getpid() if pid is None else pid
    kids = set()
    for candidate in pids():
        info = stat(candidate)
        if info is not None and info.ppid == parent:
            kids.add(candidate)
    return kids


def describe(ids: Iterable[int]) -> str:
    """`pid state argv` for each pid, one a line (for assertion messages)."""
    lines = []
    for pid in ids:
        info, argv = stat(pid), cmdline(pid)
        if info is None or argv is None:
            lines.append(f"{pid} - (gone)")
            continue
        text = b" ".join(argv).decode(errors="replace").strip()
        lines.append(f"{pid} {info.state} {text}")
    return "\n".join(lines) or "(none)"


def open_fds() -> list[str]:
    """The fd numbers this process has open (as /proc/self/fd names them)."""
    return os.listdir("/proc/self/fd")


def fd_targets() -> set[str]:
    """`fd->target` for each fd this process has open (what each one points at)."""
    found = set()
    for name in open_fds():
        try:
            found.add(f"{name}->{os.readlink(f'/proc/self/fd/{name}')}")
        except OSError:
            continue
    return found


def rss_bytes() -> int:
    """This process's resident set size now, in bytes: the `Rss` of
    /proc/self/smaps_rollup, counted from the page tables at the moment of the read
    (the `VmRSS` of /proc/self/status is kept from counters the kernel may fold in
    late)."""
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/smaps_rollup has no Rss line")
