"""Finding and killing everything a local process started, not just its process group.

A process group is not a tree: an interactive shell gives each background job a group
of its own, and `nohup`/`setsid` children leave the group too. What they keep is either
the session (job-control groups stay in the shell's session) or the parent link (until
their parent dies and they are re-parented). So a tree is taken as: every process whose
session id is the leader's (the leader started a new session: its pid is the sid), plus
every descendant of those by parent link. The leader's pid stays reserved while it is an
unreaped zombie (`local_process` waits with WNOWAIT), so the session id is never another
process's. A process that both left the session and lost its parent before we looked is
out of reach without cgroups; confined sessions do not have that gap (the jail's PID
namespace dies with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

GONE_WAIT_S = 2.0
SHARED_SCAN_S = 0.005
KILL_ROUNDS = 16  # a forking process is killed before it forks again, so this converges


def _read_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, sid) for every live (non-zombie) process on this host."""
    table: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        # Raw fd reads: this runs at every teardown, and io's file objects cost twice.
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
            try:
                data = os.read(fd, 1024)
            finally:
                os.close(fd)
        except OSError:
            continue
        # After "pid (comm) ": state ppid pgrp session ...; comm may hold ")" itself.
        fields = data[data.rfind(b")") + 2 :].split(b" ", 4)
        if len(fields) < 4 or fields[0] in (b"Z", b"X"):
            continue
        table[int(name)] = (int(fields[1]), int(fields[3]))
    return table


_shared: tuple[float, dict[int, tuple[int, int]]] | None = None


def _recent_table() -> dict[int, tuple[int, int]]:
    """A table at most `SHARED_SCAN_S` old: the polite signals of a batch of teardowns
    (64 at once in terminate-all) share one look at /proc instead of one each. Only
    for best-effort signals; the SIGKILL sweep always looks afresh."""
    global _shared
    now = time.monotonic()
    if _shared is None or now - _shared[0] > SHARED_SCAN_S:
        _shared = (now, _read_table())
    return _shared[1]


def tree_members(leader: int, *, fresh: bool = True) -> set[int]:
    """The live processes of `leader`'s session and their descendants (leader included
    if it is still alive), never this process itself. `fresh=False` may reuse a look
    taken a moment ago (see `_recent_table`)."""
    if not os.path.isdir("/proc"):
        return set()
    table = _read_table() if fresh else _recent_table()
    members = {pid for pid, (_, sid) in table.items() if sid == leader}
    if leader in table:
        members.add(leader)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(members)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in members:
                members.add(child)
                todo.append(child)
    members.discard(os.getpid())
    return members


def _send(pids: set[int], signals: tuple[int, ...]) -> None:
    for pid in pids:
        for sig in signals:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def signal_session(sid: int, *signals: int) -> None:
    """Send each of `signals` to every live process whose session id is `sid`."""
    _send({pid for pid, (_, s) in _read_table().items() if s == sid}, signals)


def signal_tree(leader: int, *signals: int) -> None:
    """Send each of `signals` to every member of `leader`'s tree, as of a recent look at
    /proc (best effort: for the polite signals before a sweep)."""
    _send(tree_members(leader, fresh=False), signals)


def kill_tree(leader: int) -> set[int]:
    """SIGKILL `leader`'s whole tree, looking again until a look finds nobody new: a
    killed process cannot fork, so only a fork that raced the previous look can appear
    (bounded: a fork bomb in the sandbox must not hang the host). Returns the pids
    killed (they may take a moment to die: see `wait_gone`)."""
    killed: set[int] = set()
    for _ in range(KILL_ROUNDS):
        fresh = tree_members(leader) - killed
        if not fresh:
            break
        _send(fresh, (signal.SIGKILL,))
        killed |= fresh
    return killed


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


async def wait_gone(pids: set[int], timeout: float = GONE_WAIT_S) -> None:
    """Wait (bounded) until every pid in `pids` has died: a SIGKILL is delivered, not
    finished, when `kill` returns, and a teardown must not report done before."""
    deadline = time.monotonic() + timeout
    left = {pid for pid in pids if _alive(pid)}
    while left and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
        left = {pid for pid in left if _alive(pid)}
