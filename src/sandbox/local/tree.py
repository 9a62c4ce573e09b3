"""The tag containment: everything a local process started, found through /proc.

Used where no cgroup can be made (`containment="tag"`, see `local.cgroups`
for the exact way). A process group is not a tree: an interactive shell gives each
background job a group of its own, and `nohup`/`setsid` children leave the group too.
What they keep is the parent link, until their parent dies. So a tree is the leader
and its descendants, walked through the kernel's children files from the leader down
(a cost that follows the tree, not the host; without those files, the whole process
table is read and the leader's session taken from it). The leader's pid stays reserved
while it is an unreaped zombie (`process` waits with WNOWAIT).

A process that lost its parent (a double fork with `setsid`, a daemon, a background job
of a shell that exited) has no link left. What it usually keeps is its environment:
every process we start carries `SANDBOX_PROCESS_TAG=<session>.<process>` (see
`LocalProcess.spawn`). An orphan is re-parented to the nearest subreaper above its dead
parent: one of our ancestors (pid 1 at the latest) or inside a tree we walk anyway. So
the children of our ancestors that sit at a session boundary and carry the tag are
taken back, with their descendants; only those have their environment read. What also
clears its environment is out of reach without cgroups; confined sessions do not have
that gap (the jail's PID namespace dies with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterable

# One name for the tag on every backend: the remote wrappers set the same variable.
from ..backends.toolkit.shell import TAG_VARIABLE as TAG_VARIABLE

GONE_WAIT_S = 2.0
SHARED_SCAN_S = 0.005
KILL_ROUNDS = 16  # a forking process is killed before it forks again, so this converges
ENVIRON_READ_LIMIT = 1 << 20  # an environment larger than this is not searched further
KERNEL_THREADS_PARENT = 2  # kthreadd: its children have no environment to read


Table = dict[int, tuple[int, int, bytes]]


def _stat(pid: int | str) -> tuple[int, int, bytes] | None:
    """(ppid, sid, start time) of a live (non-zombie) process (the start time tells a
    reused pid from the process it replaced); None if it is gone or a zombie."""
    # Raw fd reads: this runs at every teardown, and io's file objects cost twice.
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            data = os.read(fd, 1024)
        finally:
            os.close(fd)
    except OSError:
        return None
    # After "pid (comm) ": state ppid pgrp session ... starttime (the 20th); comm may
    # hold ")" itself.
    fields = data[data.rfind(b")") + 2 :].split(b" ", 20)
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[1]), int(fields[3]), fields[19]


def _read_table() -> Table:
    """pid -> `_stat` for every live process on this host."""
    table: Table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (row := _stat(name)) is not None:
            table[int(name)] = row
    return table


def _orphan_table() -> Table | None:
    """`_stat` of where an escapee can be: an orphan is re-parented to the nearest
    subreaper above its dead parent, which is one of our ancestors (up to pid 1), or
    inside a tree we walk anyway. So: our ancestors and their children, a cost that
    follows our ancestry, not the host. None without the kernel's children files."""
    table: Table = {}
    pid = os.getppid()
    while pid > 0 and pid not in table:
        row = _stat(pid)
        if row is None:
            break
        table[pid] = row
        pid = row[0]
    for ancestor in list(table):
        kids = _children(ancestor)
        if kids is None:
            return None
        for kid in kids:
            if kid not in table and (row := _stat(kid)) is not None:
                table[kid] = row
    return table


_shared: tuple[float, Table] | None = None
# pid -> (start time, tag): a process's environment block is fixed at exec, so each is
# read once (a terminate-all of 64 processes would otherwise read 64 x 64 of them).
_tags: dict[int, tuple[bytes, bytes | None]] = {}


def _recent_table() -> Table:
    """A table at most `SHARED_SCAN_S` old: the polite signals of a batch of teardowns
    (64 at once in terminate-all) share one look at /proc instead of one each. Only
    for best-effort signals; the SIGKILL sweep always looks afresh."""
    global _shared
    now = time.monotonic()
    if _shared is None or now - _shared[0] > SHARED_SCAN_S:
        _shared = (now, _read_table())
    return _shared[1]


def new_tag(session_tag: str) -> str:
    """A fresh process tag within `session_tag` (the value of `TAG_VARIABLE`)."""
    return f"{session_tag}.{secrets.token_hex(6)}"


def new_session_tag() -> str:
    """A fresh tag for one session's processes (the part before the dot)."""
    return secrets.token_hex(6)


def _environ_tag(pid: int) -> bytes | None:
    """The value of `TAG_VARIABLE` in `pid`'s environment (None: absent, unreadable)."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = b""
        while len(data) < ENVIRON_READ_LIMIT:
            piece = os.read(fd, 65536)
            if not piece:
                break
            data += piece
    except OSError:
        return None
    finally:
        os.close(fd)
    key = TAG_VARIABLE.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :]
    return None


def _cached_tag(pid: int, start: bytes) -> bytes | None:
    known = _tags.get(pid)
    if known is not None and known[0] == start:
        return known[1]
    tag = _environ_tag(pid)
    _tags[pid] = (start, tag)
    return tag


def _escaped_roots(table: Table, matches: Callable[[bytes], bool], known: set[int]) -> set[int]:
    """Processes not in `known`, at a session boundary (parent gone or in another
    session), whose tag `matches`: where a `setsid` child that lost its parent ends up."""
    roots: set[int] = set()
    for pid, (ppid, sid, start) in table.items():
        if pid in known or ppid == KERNEL_THREADS_PARENT or pid == KERNEL_THREADS_PARENT:
            continue
        parent = table.get(ppid)
        if parent is not None and parent[1] == sid:
            continue
        tag = _cached_tag(pid, start)
        if tag is not None and matches(tag):
            roots.add(pid)
    if len(_tags) > 2 * len(table) + 64:
        for pid in [pid for pid in _tags if pid not in table]:
            del _tags[pid]
    return roots


def _with_descendants(table: Table, roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    members = set(roots)
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in members:
                members.add(child)
                todo.append(child)
    members.discard(os.getpid())
    return members


def _children(pid: int) -> list[int] | None:
    """`pid`'s children from /proc/<pid>/task/*/children (None: the kernel has no such
    file); [] when it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY)
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None
        except OSError:
            continue
        try:
            data = b""
            while piece := os.read(fd, 65536):
                data += piece
        except OSError:
            data = b""
        finally:
            os.close(fd)
        kids.extend(int(p) for p in data.split())
    return kids


def _walk(roots: set[int]) -> set[int] | None:
    """`roots` and all their descendants by parent link, reading only their own
    /proc entries (a cost that follows the tree, not the host); None without the
    kernel's children files."""
    members = set(roots)
    todo = list(roots)
    while todo:
        kids = _children(todo.pop())
        if kids is None:
            return None
        for kid in kids:
            if kid not in members:
                members.add(kid)
                todo.append(kid)
    members.discard(os.getpid())
    return members


def tree_members(leader: int, *, tag: str | None = None, fresh: bool = True) -> set[int]:
    """`leader` (if alive) and its descendants, plus, with `tag`, the escaped processes
    carrying it and their descendants; never this process itself.

    The descendants are walked from the leader through its children files and the
    escapees (with `tag`) looked for among the orphans (`_orphan_table`), so a
    teardown's cost follows its tree and our ancestry, not the host. Without children
    files (an old kernel), the whole table is read, and the leader's session taken from
    it (`fresh=False` reuses a recent one).
    """
    if not os.path.isdir("/proc"):
        return set()
    walked = _walk({leader})
    orphans = None if walked is None or tag is None else _orphan_table()
    if walked is not None and (tag is None or orphans is not None):
        if tag is None or orphans is None:
            return walked
        escaped = _escaped_roots(orphans, tag.encode().__eq__, walked)
        more = _walk(escaped) if escaped else set()
        return walked | (more or set())
    table = _read_table() if fresh else _recent_table()
    roots = {pid for pid, (_, sid, _) in table.items() if sid == leader}
    if leader in table:
        roots.add(leader)
    if tag is not None:
        roots |= _escaped_roots(table, tag.encode().__eq__, roots)
    return _with_descendants(table, roots)


def session_members(session_tag: str) -> set[int]:
    """Every live process tagged within `session_tag` that escaped its own tree, with
    its descendants (what a session sweeps when it stops)."""
    if not os.path.isdir("/proc"):
        return set()
    prefix = session_tag.encode() + b"."
    orphans = _orphan_table()
    if orphans is not None:
        escaped = _escaped_roots(orphans, lambda t: t.startswith(prefix), set())
        walked = _walk(escaped) if escaped else set()
        if walked is not None:
            return walked
    table = _read_table()
    return _with_descendants(table, _escaped_roots(table, lambda t: t.startswith(prefix), set()))


def _send(pids: set[int], signals: tuple[int, ...]) -> None:
    for pid in pids:
        for sig in signals:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def signal_session(sid: int, *signals: int) -> None:
    """Send each of `signals` to every live process whose session id is `sid`."""
    _send({pid for pid, (_, s, _) in _read_table().items() if s == sid}, signals)


def outside_group(pids: Iterable[int], group: int | None) -> set[int]:
    """The `pids` not in the process group `group` (all of them for None): those a
    signal already sent to that group did not reach. A process that is gone is left
    out too."""
    if group is None:
        return set(pids)
    outside: set[int] = set()
    for pid in pids:
        try:
            if os.getpgid(pid) != group:
                outside.add(pid)
        except ProcessLookupError:
            pass
    return outside


def signal_tree(
    leader: int, *signals: int, tag: str | None = None, signalled_group: int | None = None
) -> None:
    """Send each of `signals` to every member of `leader`'s tree, as of a recent look at
    /proc (best effort: for the polite signals before a sweep). Members of
    `signalled_group`, which the caller already sent them to, are skipped: a program
    must not see one polite signal twice."""
    _send(outside_group(tree_members(leader, tag=tag, fresh=False), signalled_group), signals)


def kill_tree(leader: int, *, tag: str | None = None) -> set[int]:
    """SIGKILL `leader`'s whole tree (with `tag`: and its escaped processes), looking
    again until a look finds nobody new: a killed process cannot fork, so only a fork
    that raced the previous look can appear (bounded: a fork bomb in the sandbox must
    not hang the host). Returns the pids killed (they may take a moment to die: see
    `wait_gone`)."""
    return _kill_until_none(lambda: tree_members(leader, tag=tag))


def kill_session(session_tag: str) -> set[int]:
    """SIGKILL every escaped process of the session `session_tag` and its descendants
    (as `kill_tree` does for one tree). Returns the pids killed."""
    return _kill_until_none(lambda: session_members(session_tag))


def _kill_until_none(look: Callable[[], set[int]]) -> set[int]:
    killed: set[int] = set()
    for _ in range(KILL_ROUNDS):
        fresh = look() - killed
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
