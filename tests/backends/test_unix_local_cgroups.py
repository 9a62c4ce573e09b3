"""unix_local containment and limits: a cgroup per session, a leaf per process, limits.

These run where this process may create cgroups (root, or a delegated subtree); with
`SANDBOX_REQUIRE_ALL=1` (CI) a host without them fails instead of skipping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import UnixLocalSession
from sandbox.local import cgroups as cg
from tests.helpers import (
    HookGate,
    eventually,
    host_pids_with_arg,
    open_fds,
    unique_seconds,
)


def _cgroup_reason() -> str | None:
    try:
        session = cg.SessionCgroup.create()
    except (cg.CgroupUnavailable, OSError) as exc:
        return f"no cgroup can be made here: {exc}"
    session.remove()
    return None


REASON = _cgroup_reason()
if REASON is not None and os.environ.get("SANDBOX_REQUIRE_ALL") != "1":
    pytestmark = pytest.mark.skip(reason=REASON)


def _v2_cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"{pid} is in no cgroup v2")


def _session_directory(s: UnixLocalSession) -> str:
    cgroup = s._cgroup
    assert cgroup is not None
    return cgroup.path


# A child that leaves the session, loses its parent and clears its environment: no
# session id, no parent link and no tag lead back to it; only its cgroup does.
FULL_ESCAPE = (
    "(env -i setsid sh -c 'echo > {m}.up; exec sleep {m}' </dev/null >/dev/null 2>&1 &); "
    "until [ -e {m}.up ]; do sleep 0.01; done"
)


def _escaped_untagged(marker: str) -> bool:
    pids = host_pids_with_arg(marker)
    if len(pids) != 1:
        return False
    fields = Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()
    environ = Path(f"/proc/{pids[0]}/environ").read_bytes()
    return int(fields[3]) == pids[0] and int(fields[1]) != os.getpid() and b"SANDBOX" not in environ


@pytest.mark.parametrize("confine", [False, True])
async def test_an_env_i_setsid_child_dies_with_the_session(tmp_path: Path, confine: bool) -> None:
    if confine:
        from sandbox.backends.unix_local import confine as jail

        ok, why = jail.availability()
        if not ok:
            pytest.skip(why)
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path, confine=confine) as s:
        assert s.containment == "cgroup"
        update = await s.pty_exec_start(
            f"{FULL_ESCAPE.format(m=marker)}; echo ready; exec sleep {marker}0",
            tty=True,
            until="ready",
        )
        assert update.process_id is not None
        assert await eventually(lambda: _escaped_untagged(marker))
        if not confine:  # (in a jail it dies with the jail when the command ends)
            # One-shot too: what it leaves running lives as long as the session.
            assert (await s.exec(FULL_ESCAPE.format(m=f"{marker}1"))).ok
            assert await eventually(lambda: _escaped_untagged(f"{marker}1"))
        directory = _session_directory(s)
    assert host_pids_with_arg(marker) == []
    assert host_pids_with_arg(f"{marker}1") == []
    assert host_pids_with_arg(f"{marker}0") == []
    assert not os.path.exists(directory), "the session's cgroup is removed at close"


async def test_terminate_kills_an_env_i_setsid_child_of_that_process(tmp_path: Path) -> None:
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.3) as s:
        update = await s.pty_exec_start(
            f"{FULL_ESCAPE.format(m=marker)}; echo ready; exec sleep {marker}0",
            tty=True,
            until="ready",
        )
        assert update.process_id is not None
        other = await s.pty_exec_start(f"echo go; exec sleep {marker}2", until="go")
        assert await eventually(lambda: _escaped_untagged(marker))
        await s.pty_terminate(update.process_id)
        assert host_pids_with_arg(marker) == []
        assert len(host_pids_with_arg(f"{marker}2")) == 1, "another process's leaf was killed"
        assert other.process_id is not None


async def test_every_process_is_in_a_leaf_of_the_session_before_it_runs(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        directory = _session_directory(s)
        mount_relative = "/" + os.path.relpath(directory, cg.own_v2_directory()).lstrip("./")
        for tty in (True, False):
            update = await s.pty_exec_start("cat /proc/self/cgroup", tty=tty, yield_time_s=5)
            assert update.exit_code == 0
            line = next(x for x in update.output.splitlines() if x.startswith("0::"))
            assert os.path.basename(directory) in line, line
            assert line.strip().rsplit("/", 1)[0].endswith(mount_relative.rstrip("/"))
        result = await s.exec("cat /proc/self/cgroup")
        assert os.path.basename(directory).encode() in result.stdout
        # This process went back to its own cgroup after every start.
        assert _v2_cgroup_of(os.getpid()) == "/" + os.path.relpath(
            cg.own_v2_directory(), _mount_point()
        ).lstrip("./")


def _mount_point() -> str:
    return next(m.point for m in cg.cgroup_mounts() if m.fstype == "cgroup2")


async def test_a_crashed_runs_empty_cgroups_are_cleaned_up(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = os.path.join(cg.own_v2_directory(), f"sandbox-{dead.pid}-0badc0de")
    os.mkdir(stale)
    os.mkdir(os.path.join(stale, "p1"))
    async with UnixLocalSession(workdir=tmp_path) as s:
        assert s.containment == "cgroup"
        assert not os.path.exists(stale)


async def test_containment_cgroup_and_tag_options(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path / "a", containment="cgroup") as s:
        assert s.containment == "cgroup"
    async with UnixLocalSession(workdir=tmp_path / "b", containment="tag") as s:
        assert s.containment == "tag"
        update = await s.pty_exec_start("cat /proc/self/cgroup", yield_time_s=5)
        assert "sandbox-" not in update.output
    with pytest.raises(sandbox.InvalidArgumentError, match="containment"):
        UnixLocalSession(containment="jail")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("memory_limit_bytes", 0),
        ("memory_limit_bytes", "1G"),
        ("process_limit", True),
        ("process_limit", -3),
        ("cpu_limit", 0.001),
        ("cpu_limit", float("nan")),
        ("cpu_limit", "2"),
    ],
)
def test_bad_limits_are_invalid_arguments(option: str, value: object) -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match=option):
        UnixLocalSession(**{option: value})


HOG = f"{sys.executable} -c 'b = bytearray(512 << 20); print(len(b))'"


async def test_a_memory_hog_is_killed_with_137_and_the_window_says_why(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path, memory_limit_bytes=64 << 20) as s:
        update = await s.pty_exec_start(HOG, tty=True, yield_time_s=30)
        assert update.exit_code == 137, update.output
        assert "memory limit" in update.output
        result = await s.exec(HOG)
        assert result.exit_code == 137
        assert b"memory limit" in result.stderr
        # Below the limit all is well, and no note.
        small = await s.exec(f"{sys.executable} -c 'b = bytearray(8 << 20); print(len(b))'")
        assert small.exit_code == 0 and b"memory limit" not in small.stderr


async def test_a_fork_bomb_stops_at_the_process_limit_and_close_ends(tmp_path: Path) -> None:
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path, process_limit=40) as s:
        script = f"b() {{ sleep {marker} & b & }}; b; echo started; wait"
        update = await s.pty_exec_start(script, tty=False, until="started", yield_time_s=10)
        assert update.process_id is not None
        # The bomb is held at the limit: at most 40 processes and threads at any time.
        assert await eventually(lambda: len(host_pids_with_arg(marker)) >= 5)
        assert len(host_pids_with_arg(marker)) <= 40
        directory = _session_directory(s)
    assert host_pids_with_arg(marker) == []
    assert not os.path.exists(directory)


def _limit_file_of(pid: int, controller: str, v1_name: str, v2_name: str) -> str:
    """The value of a limit file of `pid`'s cgroup, v2 or v1, as the kernel shows it."""
    paths = dict(
        (line.split(":", 2)[1], line.split(":", 2)[2])
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    )
    for mount in cg.cgroup_mounts():
        if mount.fstype == "cgroup" and controller in mount.options:
            key = next(k for k in paths if controller in k.split(","))
            directory = cg.own_directory(mount, paths[key])
            assert directory is not None
            path = os.path.join(directory, v1_name)
            if os.path.exists(path):
                return Path(path).read_text().strip()
    directory = cg.own_directory(
        next(m for m in cg.cgroup_mounts() if m.fstype == "cgroup2"), paths[""]
    )
    assert directory is not None
    # The limit sits on the session's cgroup, the leaf's parent.
    return Path(os.path.dirname(directory), v2_name).read_text().strip()


async def test_cpu_and_process_limits_are_in_force_for_the_process(tmp_path: Path) -> None:
    async with UnixLocalSession(workdir=tmp_path, cpu_limit=0.5, process_limit=100) as s:
        update = await s.pty_exec_start("echo up; exec sleep 60", until="up")
        assert update.process_id is not None
        pid = next(p.process_id for p in s.pty_processes())
        entry = s._core.processes.lookup(pid)
        proc_pid = entry.handle.pid  # type: ignore[union-attr]
        assert set(s.limits_enforced) == {"cpu_limit", "process_limit"}
        cpu = _limit_file_of(proc_pid, "cpu", "cpu.cfs_quota_us", "cpu.max")
        assert cpu.split()[0] == "50000", cpu
        pids = _limit_file_of(proc_pid, "pids", "pids.max", "pids.max")
        assert pids == "100"


def test_sandbox_backends_says_which_containment_and_limits() -> None:
    from sandbox.cli.backends_report import backend_rows

    notes = next(row[3] for row in backend_rows() if row[0] == "unix_local")
    assert "containment: cgroup" in notes
    assert "memory_limit_bytes (cgroup v" in notes


async def test_a_cancelled_start_removes_its_cgroup(tmp_path: Path) -> None:
    s = UnixLocalSession(workdir=tmp_path)
    gate = HookGate(s, "_start_backend", after=True)
    start = asyncio.create_task(s.start())
    await gate.reached.wait()
    directory = _session_directory(s)
    assert os.path.isdir(directory)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert not os.path.exists(directory)
    await s.aclose()


async def test_a_cancelled_close_still_kills_everything_and_removes_the_cgroup(
    tmp_path: Path,
) -> None:
    marker = unique_seconds()
    s = UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.2)
    await s.start()
    directory = _session_directory(s)
    update = await s.pty_exec_start(
        f"{FULL_ESCAPE.format(m=marker)}; echo ready; exec sleep {marker}0", until="ready"
    )
    assert update.process_id is not None
    assert await eventually(lambda: _escaped_untagged(marker))
    gate = HookGate(s, "_terminate_pty_entry")
    close = asyncio.create_task(s.aclose())
    await gate.reached.wait()
    close.cancel()
    gate.release()
    with contextlib.suppress(asyncio.CancelledError):
        await close
    await s.aclose()
    assert host_pids_with_arg(marker) == []
    assert not os.path.exists(directory)


async def test_a_leaf_s_kept_events_file_follows_its_process(tmp_path: Path) -> None:
    # The file is opened once and read again at offset 0: each read is the state now.
    session = cg.SessionCgroup.create()
    try:
        leaf = session.new_leaf()
        assert leaf._keep_events_open
        assert not leaf.populated() and leaf._events_fd >= 0
        kept = leaf._events_fd
        child = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
        try:
            Path(leaf.path, "cgroup.procs").write_text(str(child.pid))
            leaf.occupy()
            assert leaf.populated()
        finally:
            child.kill()
            child.wait()
        assert await leaf.wait_empty(5)
        assert not leaf.populated() and leaf._events_fd == kept
    finally:
        session.remove()
    assert leaf._events_fd == -1  # closed with its session


async def test_a_session_keeps_a_bounded_number_of_events_files(tmp_path: Path) -> None:
    fds = open_fds()
    count = cg.KEPT_EVENTS_FILES + 8
    marker = unique_seconds()
    async with UnixLocalSession(
        workdir=tmp_path, terminate_grace_s=0.3, max_processes=2 * count
    ) as s:
        updates = await asyncio.gather(
            *(s.pty_exec_start(f"echo r; exec sleep {marker}", until="r") for _ in range(count))
        )
        # After "r" a shell may not have exec'd its `sleep` yet (slower on the Popen path).
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == count)
        assert all(u.process_id is not None for u in updates)
        await s.pty_terminate_all()
        cgroup = s._cgroup
        assert cgroup is not None
        held = sum(leaf._events_fd >= 0 for leaf in cgroup._keeping)
        assert held == cg.KEPT_EVENTS_FILES
        # The leaves past the bound read the file by path: their processes ended too.
        assert host_pids_with_arg(marker) == []
        assert (await s.exec("true")).exit_code == 0
    assert open_fds() == fds


async def test_a_kept_events_file_whose_directory_went_falls_back_to_the_path(
    tmp_path: Path,
) -> None:
    session = cg.SessionCgroup.create()
    try:
        leaf = session.new_leaf()
        assert not leaf.populated() and leaf._events_fd >= 0
        fds = open_fds()
        os.rmdir(leaf.path)  # removed under the open file, as a stranger could
        leaf.occupy()
        assert not leaf.populated()
        assert leaf._events_fd == -1 and open_fds() == fds - 1
    finally:
        session.remove()
