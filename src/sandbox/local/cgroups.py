"""A cgroup v2 per session and one per process: exact membership, one-write kills.

Where the host lets us create cgroups (root, or a delegated subtree such as a systemd
user slice), a session makes `sandbox-<our pid>-<random>` beneath our own cgroup (found
from /proc/self/cgroup and the cgroup2 mount in /proc/self/mountinfo) and a leaf in it
for each process. A process enters its leaf before it runs its command (see
`Leaf.join_fd` and `LocalProcess.spawn`), so whatever it forks, with or without
`setsid`, with or without its environment, stays in it: a teardown signals what the
leaf's `cgroup.procs` lists, kills it all with one write to `cgroup.kill`, and waits for
`populated 0` in `cgroup.events`, without ever reading /proc. No controller is enabled
for membership and kills, so the "no internal processes" rule does not apply.

Leaves are reused once empty (a start/exit cycle then costs no mkdir/rmdir) and every
directory is removed when the session stops. Directories a crashed run left behind
(named with a pid that is no longer alive) are removed when empty by the next session.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import re
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from .tree import outside_group

KILL_WAIT_S = 5.0
RMDIR_TRIES = 50  # the kernel may need a moment after the last exit before rmdir works
_NAME = re.compile(r"sandbox-(\d+)-[0-9a-f]+")
_IN_MODIFY = 0x2
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# The pipe path moves this whole process into a leaf around a vfork (see `hop`): two
# threads doing it at once would start each other's children in the wrong leaf.
HOP_LOCK = threading.Lock()


class CgroupUnavailable(Exception):
    """No cgroup can be made here; the message says why (for reports, never raised to
    users as is)."""


@dataclass(frozen=True, slots=True)
class Mount:
    """One cgroup hierarchy: where it is mounted, the path its root stands for, and its
    filesystem type with its super options (the v1 controllers)."""

    point: str
    root: str
    fstype: str
    options: frozenset[str]


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_mounts() -> list[Mount]:
    """Every cgroup and cgroup2 mount seen by this process."""
    mounts: list[Mount] = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return mounts
    for line in lines:
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            Mount(
                _unescape(fields[4]), _unescape(fields[3]), tail[0], frozenset(tail[2].split(","))
            )
        )
    return mounts


def own_cgroups() -> dict[str, str]:
    """Our cgroup path per hierarchy from /proc/self/cgroup: "" for v2, else each v1
    controller name (and `name=...`)."""
    paths: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return paths
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and not parts[1]:
            paths[""] = parts[2]
        for name in filter(None, parts[1].split(",")):
            paths[name] = parts[2]
    return paths


def own_directory(mount: Mount, path: str) -> str | None:
    """Where our cgroup `path` is in `mount`'s tree (None: outside what it shows)."""
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    return os.path.join(mount.point, path[len(root) :].lstrip("/"))


def own_v2_directory() -> str:
    """Our own cgroup v2 directory; raises `CgroupUnavailable` saying why not."""
    path = own_cgroups().get("")
    if path is None:
        raise CgroupUnavailable("this process is in no cgroup v2 hierarchy")
    for mount in cgroup_mounts():
        if mount.fstype == "cgroup2":
            directory = own_directory(mount, path)
            if directory is not None and os.path.isdir(directory):
                return directory
    raise CgroupUnavailable("no cgroup2 mount shows this process's cgroup")


def write_file(path: str, data: str) -> None:
    """Write one control file in a single write (how cgroupfs wants it; O_TRUNC, as a
    shell's `>` does, is a no-op there and leaves a plain file holding just `data`)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def read_file(path: str) -> str:
    """Read one control file ("" if it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return ""
    try:
        return os.read(fd, 65536).decode(errors="replace")
    finally:
        os.close(fd)


def pids_in(directory: str) -> list[int]:
    """The processes of one cgroup (not of its children)."""
    return [int(p) for p in read_file(os.path.join(directory, "cgroup.procs")).split()]


def populated(directory: str) -> bool:
    """Whether the cgroup or a descendant still has a live process."""
    return _populated_in(read_file(os.path.join(directory, "cgroup.events")), directory)


def _populated_in(events: str, directory: str) -> bool:
    """`populated` from the text of `directory`'s `cgroup.events`."""
    for line in events.splitlines():
        if line.startswith("populated "):
            return line.split()[1] != "0"
    return bool(pids_in(directory))  # no cgroup.events: older kernel


def kill_all(directory: str) -> None:
    """SIGKILL every process of the cgroup and its descendants.

    `cgroup.kill` (Linux 5.14) does it atomically; before it, every listed process is
    killed until the list is empty (bounded: a killed process cannot fork again).
    """
    try:
        write_file(os.path.join(directory, "cgroup.kill"), "1")
        return
    except FileNotFoundError:
        pass
    for _ in range(16):
        found = False
        for sub in _tree(directory):
            for pid in pids_in(sub):
                found = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if not found:
            return


def _tree(directory: str) -> Iterator[str]:
    """`directory` and its cgroup descendants, deepest first (the order rmdir needs)."""
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            yield from _tree(entry.path)
    yield directory


def remove_tree(directory: str, *, retry: bool = True) -> bool:
    """rmdir `directory` and its child cgroups (they must be empty). The kernel lets the
    last exits finish before rmdir succeeds: EBUSY is retried briefly with `retry`.
    Returns False if something is left."""
    try:
        subs = list(_tree(directory))
    except FileNotFoundError:
        return True
    for sub in subs:
        for attempt in range(RMDIR_TRIES if retry else 1):
            try:
                os.rmdir(sub)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or attempt == RMDIR_TRIES - 1 or not retry:
                    return False
                time.sleep(0.001)
    return True


def clean_stale(parent: str) -> None:
    """Remove the empty `sandbox-<pid>-*` directories under `parent` whose pid is dead
    (a run that crashed before its close); live runs' and populated ones stay."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        if _pid_alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            if not populated(entry.path):
                remove_tree(entry.path, retry=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_name() -> str:
    """A fresh session directory name: our pid (for `clean_stale`) and a random part."""
    return f"sandbox-{os.getpid()}-{secrets.token_hex(4)}"


class _Inotify:
    """libc's inotify through ctypes (the stdlib has none), for `cgroup.events`."""

    _libc: ctypes.CDLL | None = None
    _failed = False

    @classmethod
    def libc(cls) -> ctypes.CDLL | None:
        if cls._libc is None and not cls._failed:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.inotify_init1.argtypes = [ctypes.c_int]
                libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
                cls._libc = libc
            except (OSError, AttributeError):
                cls._failed = True
        return cls._libc


async def wait_unpopulated(directory: str, timeout: float = KILL_WAIT_S) -> bool:
    """Wait (bounded) until the cgroup holds no live process; True if it emptied.

    Woken by the file-modified event the kernel raises on `cgroup.events` (inotify),
    or, without inotify, by a short poll.
    """
    if not populated(directory):
        return True
    loop = asyncio.get_running_loop()
    libc = _Inotify.libc()
    fd = -1 if libc is None else libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    events = os.path.join(directory, "cgroup.events").encode()
    if fd >= 0 and libc is not None and libc.inotify_add_watch(fd, events, _IN_MODIFY) < 0:
        os.close(fd)
        fd = -1
    try:
        async with asyncio.timeout(timeout):
            while populated(directory):
                if fd < 0:
                    await asyncio.sleep(0.002)
                    continue
                ready: asyncio.Future[None] = loop.create_future()
                loop.add_reader(fd, _set_once, ready)
                try:
                    # The watch exists since before the check above: a change in
                    # between is already queued on `fd`.
                    await ready
                finally:
                    loop.remove_reader(fd)
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 4096)
        return True
    except TimeoutError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# Leaves of a session that keep their `cgroup.events` open. Opening a cgroup file costs
# 25 to 30 us here, reading an open one again 5 or 6: a start's teardown reads it once.
# Bounded, so a session of thousands of processes does not hold thousands of fds.
KEPT_EVENTS_FILES = 64


class Leaf:
    """One process's cgroup (inside its session's): joined before exec, killed whole."""

    def __init__(self, path: str, *, keep_events_open: bool = False) -> None:
        self.path = path
        self.killed = False
        # Seen empty since its process started: it stays so (nothing enters a leaf but
        # the process we start in it), so a teardown reads `cgroup.events` once.
        self._seen_empty = False
        self._keep_events_open = keep_events_open
        self._events_fd = -1

    def occupy(self) -> None:
        """Mark it handed to a new process (it is not empty from now on)."""
        self._seen_empty = False

    def open_join(self) -> int:
        """An fd of its `cgroup.procs`, opened by the parent and written by the child
        (or the parent's hop) before exec: no path lookup in the child, and a jail
        cannot hide it. The caller closes it once the process started."""
        return os.open(os.path.join(self.path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    def open_directory(self) -> int:
        """An fd of the leaf directory, for `clone3(CLONE_INTO_CGROUP)` (see
        `spawn_helper`): the child is born in it. The caller closes it."""
        return os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def pids(self) -> list[int]:
        """The processes in it now."""
        return pids_in(self.path)

    def signal(self, *signals: int, signalled_group: int | None = None) -> None:
        """Send each of `signals` to every process in it (the polite part of a kill),
        but not to members of `signalled_group`, which the caller already sent them to
        (a program must not see one polite signal twice)."""
        for pid in outside_group(self.pids(), signalled_group):
            for sig in signals:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def kill(self) -> None:
        """SIGKILL everything in it, at once (nothing to do when it holds nobody).

        A leaf that was killed is never reused: on the kernels we run on (6.x), a
        process cloned into a cgroup with CLONE_INTO_CGROUP after a `cgroup.kill` of it
        is killed at birth (its kill count is compared with the parent's cgroup's).
        """
        with contextlib.suppress(FileNotFoundError):
            if self.populated():
                self.killed = True
                kill_all(self.path)

    def populated(self) -> bool:
        """Whether a live process is still in it."""
        if self._seen_empty:
            return False
        alive = self._read_populated()
        self._seen_empty = not alive
        return alive

    def _read_populated(self) -> bool:
        if not self._keep_events_open:
            return populated(self.path)
        if self._events_fd < 0:
            try:
                self._events_fd = os.open(
                    os.path.join(self.path, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC
                )
            except FileNotFoundError:
                return populated(self.path)  # gone, or an older kernel without the file
        try:
            # A cgroup file read at offset 0 is generated afresh.
            events = os.pread(self._events_fd, 4096, 0)
        except OSError:  # ENODEV: the directory went under it
            self.close_files()
            return populated(self.path)
        return _populated_in(events.decode(), self.path)

    def close_files(self) -> None:
        """Close what it keeps open (before its directory goes, or with its session)."""
        fd, self._events_fd = self._events_fd, -1
        self._keep_events_open = False
        if fd >= 0:
            os.close(fd)

    async def wait_empty(self, timeout: float = KILL_WAIT_S) -> bool:
        """Wait (bounded) until nothing in it is alive."""
        if self._seen_empty:
            return True
        self._seen_empty = await wait_unpopulated(self.path, timeout)
        return self._seen_empty


class SessionCgroup:
    """A session's cgroup: its leaves, a pool of empty ones, and its removal."""

    def __init__(self, path: str, home: str) -> None:
        self.path = path
        self.home = home
        self._home_fd = os.open(os.path.join(home, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        self._count = 0
        self._idle: list[Leaf] = []
        self._keeping: list[Leaf] = []  # the leaves that may keep a file open
        self._closed = False
        # Set when a v2 limit sits on this cgroup: this process must then never hop in
        # (at the memory limit, the OOM killer could pick this process itself).
        self.limited = False

    @classmethod
    def create(cls) -> SessionCgroup:
        """Make a session cgroup under our own; raises `CgroupUnavailable` saying why not."""
        home = own_v2_directory()
        clean_stale(home)
        path = os.path.join(home, new_name())
        try:
            os.mkdir(path)
        except OSError as exc:
            raise CgroupUnavailable(
                f"cannot create a cgroup under {home}: {exc.strerror}"
            ) from None
        try:
            # Moving a process in and out needs write access to both cgroup.procs files.
            if not os.access(os.path.join(home, "cgroup.procs"), os.W_OK):
                raise CgroupUnavailable(f"cannot move processes in {home}")
            return cls(path, home)
        except (OSError, CgroupUnavailable):
            remove_tree(path, retry=False)
            raise

    def new_leaf(self) -> Leaf:
        """An empty leaf for the next process (a reused one if any is free)."""
        if self._idle:
            # Empty when given back, and nothing enters a leaf but the process we start.
            leaf = self._idle.pop()
            leaf.occupy()
            return leaf
        self._count += 1
        path = os.path.join(self.path, f"p{self._count}")
        os.mkdir(path)
        keep = len(self._keeping) < KEPT_EVENTS_FILES
        leaf = Leaf(path, keep_events_open=keep)
        if keep:
            self._keeping.append(leaf)
        return leaf

    def release(self, leaf: Leaf, *, empty: bool = False) -> None:
        """Give back a leaf whose process is gone: reused if empty (`empty`: the caller
        just saw it so), else kept (what is left in it, e.g. a one-shot command's
        daemon, dies with the session)."""
        if self._closed or (not empty and leaf.populated()):
            return
        if not leaf.killed:
            self._idle.append(leaf)
            return
        leaf.close_files()
        if leaf in self._keeping:
            self._keeping.remove(leaf)
        with contextlib.suppress(OSError):  # EBUSY for a moment: it goes at the close
            os.rmdir(leaf.path)

    def hop_in(self, join_fd: int) -> None:
        """Move this process into the leaf `join_fd` opens (hold `HOP_LOCK`; `hop_out`
        right after the vfork): a child started meanwhile is born in it, no preexec."""
        os.write(join_fd, b"0")

    def hop_out(self) -> None:
        """Move this process back to its own cgroup."""
        os.write(self._home_fd, b"0")

    def kill(self) -> None:
        """SIGKILL every process of the session, at once."""
        with contextlib.suppress(FileNotFoundError):
            kill_all(self.path)

    async def wait_empty(self, timeout: float = KILL_WAIT_S) -> bool:
        """Wait (bounded) until no process of the session is alive."""
        return await wait_unpopulated(self.path, timeout)

    def close_files(self) -> None:
        """Close every file it and its leaves keep open (it is being removed, or left
        behind with its session)."""
        for leaf in self._keeping:
            leaf.close_files()
        self._keeping.clear()
        if self._home_fd >= 0:
            os.close(self._home_fd)
            self._home_fd = -1

    def remove(self) -> bool:
        """Remove every directory; False if one stayed (its
        processes did not die in time: the next session cleans it up when empty)."""
        self._closed = True
        self._idle.clear()
        self.close_files()
        return remove_tree(self.path)


def availability() -> tuple[bool, str]:
    """Whether a session here gets cgroup containment (by making and removing one),
    and a short reason when not (for `sandbox backends`)."""
    try:
        session = SessionCgroup.create()
    except (CgroupUnavailable, OSError) as exc:
        return False, str(exc)
    session.remove()
    return True, ""
