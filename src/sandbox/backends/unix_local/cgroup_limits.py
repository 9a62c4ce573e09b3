"""Session resource limits: memory, process count and CPU, through cgroups.

Each limit is set on the whole session. cgroup v2 is used where our own cgroup offers
the controller and lets us enable it for its children (`cgroup.subtree_control`; the
"no internal processes" rule refuses that when our cgroup is not the root and holds
processes, ours included). Otherwise the v1 hierarchy of that controller, where one is
mounted (hybrid hosts: cgroup2 for membership, v1 `memory`/`pids`/`cpu` for limits):
a `sandbox-<pid>-<random>` directory beside the session's, which every process of the
session joins before exec as well (`join_fds`). Neither: `UnsupportedOperationError`
naming the option.

A process the memory limit kills dies of SIGKILL (137); the kernel's `oom_kill` counter
(v2 `memory.events`, v1 `memory.oom_control`) tells the session it was the limit. The
process limit kills nothing: a fork past it fails (EAGAIN), and the process that could
not fork usually gives up with an error; the `max` counter of `pids.events` (v1 and v2)
tells the session the limit refused a fork.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...errors import BackendUnavailableError, InvalidArgumentError, UnsupportedOperationError
from ...local import cgroups

CPU_PERIOD_US = 100_000
MIN_CPU = 0.01  # the kernel's smallest quota is 1 ms per 100 ms period
MEMORY_NOTE = b"\n[sandbox: killed by the session's memory limit (memory_limit_bytes)]\n"
PROCESS_NOTE = b"\n[sandbox: the session's process limit (process_limit) refused a new process]\n"


@dataclass(frozen=True, slots=True)
class Limits:
    """What a session asked for (None: no limit)."""

    memory_bytes: int | None = None
    processes: int | None = None
    cpus: float | None = None

    def wanted(self) -> list[tuple[str, str]]:
        """(controller, option name) for each limit asked for."""
        pairs = [
            ("memory", "memory_limit_bytes", self.memory_bytes),
            ("pids", "process_limit", self.processes),
            ("cpu", "cpu_limit", self.cpus),
        ]
        return [(controller, option) for controller, option, value in pairs if value is not None]

    def v2_files(self, controller: str) -> list[tuple[str, str]]:
        """The v2 control files and values for `controller`."""
        if controller == "memory":
            # No swap: a hog must meet the limit, not slow the host down by swapping.
            return [("memory.max", str(self.memory_bytes)), ("memory.swap.max", "0")]
        if controller == "pids":
            return [("pids.max", str(self.processes))]
        assert self.cpus is not None
        return [("cpu.max", f"{round(self.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")]

    def v1_files(self, controller: str) -> list[tuple[str, str]]:
        """The v1 control files and values for `controller` (in the order to write)."""
        if controller == "memory":
            limit = str(self.memory_bytes)
            return [("memory.limit_in_bytes", limit), ("memory.memsw.limit_in_bytes", limit)]
        if controller == "pids":
            return [("pids.max", str(self.processes))]
        assert self.cpus is not None
        return [
            ("cpu.cfs_period_us", str(CPU_PERIOD_US)),
            ("cpu.cfs_quota_us", str(round(self.cpus * CPU_PERIOD_US))),
        ]


class AppliedLimits:
    """The limits in force for one session: the fds its processes join, the way each
    limit is enforced, the OOM counter, and the directories to remove at the end."""

    def __init__(self) -> None:
        self.join_fds: list[int] = []
        self.enforced: dict[str, str] = {}  # option name -> "cgroup v2" / "cgroup v1"
        self._dirs: list[str] = []
        self._oom_file: str | None = None
        self._oom_seen = 0
        self._pids_file: str | None = None
        self._pids_seen = 0

    def _oom_count(self) -> int:
        if self._oom_file is None:
            return 0
        for line in cgroups.read_file(self._oom_file).splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def memory_killed(self) -> bool:
        """Whether the memory limit killed a process since the last call."""
        count = self._oom_count()
        fresh = count > self._oom_seen
        self._oom_seen = count
        return fresh

    def _pids_count(self) -> int:
        if self._pids_file is None:
            return 0
        for line in cgroups.read_file(self._pids_file).splitlines():
            if line.startswith("max "):
                return int(line.split()[1])
        return 0

    def process_limit_hit(self) -> bool:
        """Whether the process limit refused a fork since the last call."""
        count = self._pids_count()
        fresh = count > self._pids_seen
        self._pids_seen = count
        return fresh

    def remove(self) -> None:
        """Close the join fds and remove the v1 directories (their processes are gone)."""
        for fd in self.join_fds:
            os.close(fd)
        self.join_fds.clear()
        for directory in self._dirs:
            cgroups.remove_tree(directory)
        self._dirs.clear()


def apply(limits: Limits, session: cgroups.SessionCgroup | None) -> AppliedLimits:
    """Put `limits` in force for a session (its v2 cgroup if it has one). Raises
    `UnsupportedOperationError` naming the first option the host cannot enforce; what
    was made by then is removed."""
    applied = AppliedLimits()
    try:
        for controller, option in limits.wanted():
            if session is not None and _try_v2(limits, controller, session):
                session.limited = True
                applied.enforced[option] = "cgroup v2"
                if controller == "memory":
                    applied._oom_file = os.path.join(session.path, "memory.events")
                if controller == "pids":
                    applied._pids_file = os.path.join(session.path, "pids.events")
                continue
            directory = _v1_directory(controller, None if session is None else session.path)
            if directory is None:
                raise UnsupportedOperationError(
                    f"{option} needs the cgroup {controller!r} controller, which this host"
                    " does not let us use (neither in cgroup v2 nor as a v1 hierarchy)"
                )
            applied._dirs.append(directory)
            for name, value in limits.v1_files(controller):
                path = os.path.join(directory, name)
                if name == "memory.memsw.limit_in_bytes" and not os.path.exists(path):
                    continue  # no swap accounting on this kernel
                _write_limit(path, value, option)
            applied.join_fds.append(
                os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            )
            applied.enforced[option] = "cgroup v1"
            if controller == "memory":
                applied._oom_file = os.path.join(directory, "memory.oom_control")
            if controller == "pids":
                applied._pids_file = os.path.join(directory, "pids.events")
    except BaseException:
        applied.remove()
        raise
    applied.memory_killed()  # start counting from now
    applied.process_limit_hit()
    return applied


def _write_limit(path: str, value: str, option: str) -> None:
    try:
        cgroups.write_file(path, value)
    except OSError as exc:
        raise UnsupportedOperationError(
            f"{option}: the host refused the limit ({os.path.basename(path)}: {exc.strerror})"
        ) from None


def _try_v2(limits: Limits, controller: str, session: cgroups.SessionCgroup) -> bool:
    """Enable `controller` for our children and set the limit on the session's cgroup;
    False when v2 cannot (no such controller, or our cgroup may not delegate it)."""
    offered = cgroups.read_file(os.path.join(session.home, "cgroup.controllers")).split()
    if controller not in offered:
        return False
    try:
        enabled = cgroups.read_file(os.path.join(session.home, "cgroup.subtree_control"))
        if controller not in enabled.split():
            cgroups.write_file(
                os.path.join(session.home, "cgroup.subtree_control"), f"+{controller}"
            )
        for name, value in limits.v2_files(controller):
            path = os.path.join(session.path, name)
            if name == "memory.swap.max" and not os.path.exists(path):
                continue
            cgroups.write_file(path, value)
    except OSError:
        return False
    return True


def _v1_directory(controller: str, v2_path: str | None) -> str | None:
    """A new session directory in the v1 hierarchy of `controller`, under our own
    cgroup there (named like the v2 one when there is one); None if there is none."""
    own = cgroups.own_cgroups().get(controller)
    if own is None:
        return None
    for mount in cgroups.cgroup_mounts():
        if mount.fstype != "cgroup" or controller not in mount.options:
            continue
        home = cgroups.own_directory(mount, own)
        if home is None or not os.path.isdir(home):
            continue
        cgroups.clean_stale(home)
        name = os.path.basename(v2_path) if v2_path is not None else cgroups.new_name()
        directory = os.path.join(home, name)
        try:
            os.mkdir(directory)
        except FileExistsError:
            pass
        except OSError:
            return None
        return directory
    return None


def check_limit_options(
    memory_limit_bytes: object, process_limit: object, cpu_limit: object
) -> Limits:
    """The limit options, checked (bad types and values are `InvalidArgumentError`s)."""
    counts: list[int | None] = []
    for name, value in (
        ("memory_limit_bytes", memory_limit_bytes),
        ("process_limit", process_limit),
    ):
        if value is None:
            counts.append(None)
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{name} must be a positive int, not {value!r}")
        else:
            counts.append(value)
    cpus: float | None = None
    if cpu_limit is not None:
        if isinstance(cpu_limit, bool) or not isinstance(cpu_limit, int | float):
            raise InvalidArgumentError(f"cpu_limit must be a number of cores, not {cpu_limit!r}")
        if not MIN_CPU <= cpu_limit < float("inf"):
            raise InvalidArgumentError(
                f"cpu_limit must be at least {MIN_CPU} cores, not {cpu_limit!r}"
            )
        cpus = float(cpu_limit)
    return Limits(memory_bytes=counts[0], processes=counts[1], cpus=cpus)


def support() -> dict[str, str | None]:
    """For each limit option, how this host would enforce it ("cgroup v2", "cgroup v1")
    or None; v2 counts when our cgroup offers the controller (whether it may delegate
    it is only known when a session tries)."""
    found: dict[str, str | None] = {}
    own = cgroups.own_cgroups()
    try:
        home = cgroups.own_v2_directory()
        offered = cgroups.read_file(os.path.join(home, "cgroup.controllers")).split()
    except cgroups.CgroupUnavailable:
        offered = []
    mounts = cgroups.cgroup_mounts()
    for controller, option in Limits(1, 1, 1.0).wanted():
        if controller in offered:
            found[option] = "cgroup v2"
        elif controller in own and any(
            m.fstype == "cgroup" and controller in m.options for m in mounts
        ):
            found[option] = "cgroup v1"
        else:
            found[option] = None
    return found


def make_session_cgroup(
    containment: str, limits: Limits
) -> tuple[cgroups.SessionCgroup | None, AppliedLimits | None]:
    """A session's cgroup (per `containment`: none for "tag", none when none can be made
    for "auto", `BackendUnavailableError` then for "cgroup") and its limits in force
    (None: none asked for), in one synchronous step: a cancelled start leaves nothing
    half made."""
    cgroup = None
    if containment != "tag":
        try:
            cgroup = cgroups.SessionCgroup.create()
        except (cgroups.CgroupUnavailable, OSError) as exc:
            if containment == "cgroup":
                raise BackendUnavailableError(
                    f"containment='cgroup' but no cgroup can be made here: {exc}"
                ) from None
    applied = apply(limits, cgroup) if limits.wanted() else None
    return cgroup, applied


async def remove_session_cgroup(cgroup: cgroups.SessionCgroup) -> None:
    """Kill what is in the session's cgroup (everything the session started: one
    write), wait until it is empty, and remove it."""
    cgroup.kill()
    await cgroup.wait_empty()
    cgroup.remove()


def exit_note(applied: AppliedLimits | None, code: int) -> bytes:
    """The note a process killed by the memory limit gets, or one that failed after the
    process limit refused it a fork (b"" otherwise)."""
    if code == 137 and applied is not None and applied.memory_killed():
        return MEMORY_NOTE
    if code != 0 and applied is not None and applied.process_limit_hit():
        return PROCESS_NOTE
    return b""
