"""The cgroup v2 side of the unix_local limits (`cgroup_limits`).

Two halves: the v2 file writes, against a temporary directory standing for our cgroup
and the session's (plain files where cgroupfs has control files: what is written is
what the kernel would be told); and the limits in force on a real host whose own cgroup
offers the v2 memory, pids and cpu controllers (skipped with the reason elsewhere, such
as on a hybrid host whose cgroup2 mount has no controllers).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sandbox.backends.unix_local import UnixLocalSession
from sandbox.backends.unix_local import cgroup_limits as cl
from sandbox.local import cgroups as cg

V2_FILES = ("memory.max", "memory.swap.max", "memory.events", "pids.max", "cpu.max")


def _stand_in(tmp_path: Path, *, offered: str, enabled: str) -> cg.SessionCgroup:
    """Our cgroup (`home`) and a session cgroup in it, as plain files."""
    home = tmp_path / "home"
    session = home / cg.new_name()
    session.mkdir(parents=True)
    (home / "cgroup.procs").write_text("")
    (home / "cgroup.controllers").write_text(offered + "\n")
    (home / "cgroup.subtree_control").write_text(enabled + "\n")
    for name in V2_FILES:
        (session / name).write_text("max\n" if name != "memory.events" else "oom_kill 0\n")
    return cg.SessionCgroup(str(session), str(home))


def _read(session: cg.SessionCgroup, name: str) -> str:
    return Path(session.path, name).read_text()


def test_all_three_limits_are_written_to_the_session_cgroup(tmp_path: Path) -> None:
    session = _stand_in(tmp_path, offered="cpuset cpu io memory pids", enabled="cpu memory pids")
    limits = cl.check_limit_options(256 << 20, 64, 1.5)
    applied = cl.apply(limits, session)
    try:
        assert applied.enforced == {
            "memory_limit_bytes": "cgroup v2",
            "process_limit": "cgroup v2",
            "cpu_limit": "cgroup v2",
        }
        assert _read(session, "memory.max") == str(256 << 20)
        assert _read(session, "memory.swap.max") == "0", "no swapping around the limit"
        assert _read(session, "pids.max") == "64"
        assert _read(session, "cpu.max") == "150000 100000"
        assert applied.join_fds == [], "v2: nothing to join beside the session's leaf"
        assert session.limited, "this process must never hop into a limited cgroup"
        # Controllers already enabled for our children: subtree_control is not touched.
        assert Path(session.home, "cgroup.subtree_control").read_text() == "cpu memory pids\n"
    finally:
        applied.remove()
        session.remove()


def test_a_controller_not_yet_enabled_is_enabled_for_our_children(tmp_path: Path) -> None:
    session = _stand_in(tmp_path, offered="cpu memory pids", enabled="")
    applied = cl.apply(cl.check_limit_options(None, 10, None), session)
    try:
        assert Path(session.home, "cgroup.subtree_control").read_text() == "+pids"
        assert _read(session, "pids.max") == "10"
        assert _read(session, "memory.max") == "max\n", "a limit not asked for is not set"
    finally:
        applied.remove()
        session.remove()


def test_the_oom_counter_of_memory_events_says_when_the_limit_killed(tmp_path: Path) -> None:
    session = _stand_in(tmp_path, offered="memory", enabled="memory")
    events = Path(session.path, "memory.events")
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    applied = cl.apply(cl.check_limit_options(64 << 20, None, None), session)
    try:
        assert not applied.memory_killed(), "kills before the session are not its own"
        events.write_text("low 0\nhigh 0\nmax 5\noom 2\noom_kill 3\n")
        assert applied.memory_killed()
        assert not applied.memory_killed(), "each kill is reported once"
    finally:
        applied.remove()
        session.remove()


def test_a_controller_v2_does_not_offer_goes_to_v1_or_is_refused(tmp_path: Path) -> None:
    session = _stand_in(tmp_path, offered="cpu", enabled="cpu")
    limits = cl.check_limit_options(None, 10, 0.5)
    try:
        applied = cl.apply(limits, session)
    except cl.UnsupportedOperationError as exc:
        # No v1 pids hierarchy here either: refused by name, and nothing stays set.
        assert "process_limit" in str(exc)
        assert _read(session, "cpu.max") in ("max\n", "50000 100000")
    else:
        try:
            assert applied.enforced == {"cpu_limit": "cgroup v2", "process_limit": "cgroup v1"}
            assert _read(session, "cpu.max") == "50000 100000"
            assert _read(session, "pids.max") == "max\n", "pids went to v1, not to v2"
            assert len(applied.join_fds) == 1
        finally:
            applied.remove()
    session.remove()


def _v2_controllers_reason() -> str | None:
    try:
        home = cg.own_v2_directory()
    except cg.CgroupUnavailable as exc:
        return str(exc)
    offered = set(cg.read_file(os.path.join(home, "cgroup.controllers")).split())
    missing = {"memory", "pids", "cpu"} - offered
    if missing:
        return f"our cgroup v2 ({home}) offers no {', '.join(sorted(missing))} controller"
    return None


V2_REASON = _v2_controllers_reason()


@pytest.mark.skipif(V2_REASON is not None, reason=f"no cgroup v2 controllers: {V2_REASON}")
async def test_v2_limits_are_in_force_where_the_controllers_exist(tmp_path: Path) -> None:
    async with UnixLocalSession(
        workdir=tmp_path, memory_limit_bytes=64 << 20, process_limit=32, cpu_limit=0.5
    ) as s:
        if set(s.limits_enforced.values()) != {"cgroup v2"}:
            pytest.skip(f"our cgroup may not delegate them: {s.limits_enforced}")
        update = await s.pty_exec_start("echo up; exec sleep 60", until="up")
        assert update.process_id is not None
        cgroup = s._cgroup
        assert cgroup is not None
        files = [Path(cgroup.path, n).read_text().strip() for n in ("memory.max", "pids.max")]
        assert files == [str(64 << 20), "32"]
        assert Path(cgroup.path, "cpu.max").read_text().split() == ["50000", "100000"]
        hog = await s.exec(f"{sys.executable} -c 'b = bytearray(512 << 20)'")
        assert hog.exit_code == 137
        assert b"memory limit" in hog.stderr
