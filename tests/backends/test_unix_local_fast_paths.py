"""unix_local's fast paths: a spawn and a teardown that never await.

A start on unix_local is one synchronous clone (its `_spawn_process` returns None:
nothing to await), and a process that exited in its window with nothing of it left
alive in its cgroup leaf is torn down at once by its handle (`LocalHandle.finish_now`):
no owned task, no settled batch. Each test counts, on its session, the spawns that
returned something to await and the calls of the settled teardown hook (wrappers on the
instance; the real hooks still run) to tell which path ran, and checks what either
path must leave: the output and the exit status, no zombie, no fd, nothing alive, an
empty registry. Where the fast path must refuse (a child still alive in the leaf, tag
containment, a jail's command check), the awaiting path runs and the same holds. A gate
or a subclass's hook is called as it is: the fast paths are the hook's own return and
the handle's method, not a second hook beside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from sandbox.backends.unix_local import UnixLocalSession, confine
from sandbox.process_entry import PtyEntry
from tests.conftest import skip_or_fail
from tests.helpers import (
    HookGate,
    children_of_me,
    eventually,
    host_pids_with_arg,
    open_fds,
    unique_seconds,
)


class HookCalls:
    """Counts, on one session, the spawns that left something to await (an owned task)
    and the calls of the settled teardown hook."""

    def __init__(self, session: UnixLocalSession) -> None:
        self.spawns = 0
        self.teardowns = 0
        real_spawn = session._spawn_process
        real_teardown = session._terminate_pty_entry

        def spawn(entry: PtyEntry[Any]) -> Awaitable[None] | None:
            pending = real_spawn(entry)
            self.spawns += pending is not None
            return pending

        async def teardown(entry: PtyEntry[Any]) -> None:
            self.teardowns += 1
            await real_teardown(entry)

        session._spawn_process = spawn  # type: ignore[method-assign]
        session._terminate_pty_entry = teardown  # type: ignore[method-assign]


@pytest.fixture
async def cgroup_session(tmp_path: Path) -> AsyncIterator[UnixLocalSession]:
    s = UnixLocalSession(workdir=tmp_path / "ws", terminate_grace_s=0.3)
    async with s:
        if s.containment != "cgroup":
            skip_or_fail("no cgroup can be made here: the fast teardown needs a leaf")
        yield s


def shell_pid(output: str) -> int:
    return int(output.split()[0])


@pytest.mark.parametrize("tty", [False, True])
async def test_a_command_that_ends_in_its_window_takes_the_fast_paths(
    cgroup_session: UnixLocalSession, tty: bool
) -> None:
    s = cgroup_session
    calls = HookCalls(s)
    await s.pty_exec_start("true", tty=tty)  # the first start opens what later ones reuse
    fds = open_fds()
    for _ in range(20):
        update = await s.pty_exec_start("echo $$; exit 3", tty=tty)
        assert update.process_id is None and update.exit_code == 3
        assert shell_pid(update.output) not in children_of_me(), "reaped at once"
    assert (calls.spawns, calls.teardowns) == (0, 0)
    assert open_fds() == fds
    assert s.pty_processes() == [] and s._core.processes.reserved == set()


async def test_a_child_left_alive_in_the_leaf_goes_through_the_settled_teardown(
    cgroup_session: UnixLocalSession,
) -> None:
    s = cgroup_session
    calls = HookCalls(s)
    marker = unique_seconds()
    update = await s.pty_exec_start(f"sleep {marker} > /dev/null 2>&1 & echo started")
    assert update.process_id is None and update.output == "started\n"
    assert calls.teardowns == 1, "a live child in the leaf: the teardown must wait for it"
    assert host_pids_with_arg(marker) == []
    assert s.pty_processes() == [] and s._core.processes.reserved == set()


async def test_tag_containment_takes_the_settled_teardown(tmp_path: Path) -> None:
    async with UnixLocalSession(
        workdir=tmp_path / "ws", terminate_grace_s=0.3, containment="tag"
    ) as s:
        calls = HookCalls(s)
        fds = open_fds()
        update = await s.pty_exec_start("echo $$")
        assert update.process_id is None and update.exit_code == 0
        assert shell_pid(update.output) not in children_of_me()
        # No leaf to say nothing is left: the tree sweep (and its wait) runs.
        assert (calls.spawns, calls.teardowns) == (0, 1)
        assert open_fds() == fds


async def test_a_jail_s_command_check_takes_the_owned_spawn(tmp_path: Path) -> None:
    ok, reason = confine.availability()
    if not ok:
        skip_or_fail(f"confinement unavailable: {reason}")
    async with UnixLocalSession(workdir=tmp_path / "ws", confine=True, terminate_grace_s=0.3) as s:
        calls = HookCalls(s)
        await s.write_file("sub/keep", b"")
        update = await s.pty_exec_start("pwd", cwd="sub")
        assert update.exit_code == 0 and update.output.strip().endswith("/sub")
        assert calls.spawns == 1, "the check's verdict is awaited: the owned spawn task"
        no_check = await s.pty_exec_start("echo plain")
        assert no_check.output == "plain\n"
        assert calls.spawns == 1, "no check needed: the spawn is synchronous"


async def test_a_gated_spawn_runs_as_an_owned_task_and_the_handle_still_ends_it(
    cgroup_session: UnixLocalSession,
) -> None:
    # A gate on the spawn hook (what the ownership races use) holds the start in a task
    # the session owns; the exited process is still ended by its handle at once: the
    # fast teardown is the handle's own method, the same with or without a gate.
    s = cgroup_session
    calls = HookCalls(s)
    gate = HookGate(s, "_spawn_process")
    start = asyncio.ensure_future(s.pty_exec_start("echo $$"))
    await gate.reached.wait()
    assert not start.done() and s._core.processes.spawn_tasks(), "the spawn is an owned task"
    gate.release()
    update = await start
    assert update.process_id is None and update.exit_code == 0
    assert shell_pid(update.output) not in children_of_me()
    assert (calls.spawns, calls.teardowns) == (0, 0)  # the real hook: one synchronous clone


class TracedSession(UnixLocalSession):
    """A subclass with its own spawn hook (it must be called, not skipped)."""

    spawned = 0

    async def _spawn_process(self, entry: PtyEntry[Any]) -> None:
        TracedSession.spawned += 1
        pending = super()._spawn_process(entry)  # None: the clone is done
        if pending is not None:
            await pending


async def test_a_subclass_s_own_spawn_hook_is_called(tmp_path: Path) -> None:
    async with TracedSession(workdir=tmp_path / "ws", terminate_grace_s=0.3) as s:
        update = await s.pty_exec_start("echo sub")
        assert update.output == "sub\n"
    assert TracedSession.spawned == 1


@pytest.mark.parametrize("cancels", [1, 3])
async def test_a_fast_started_process_cancelled_in_its_window_is_torn_down(
    cgroup_session: UnixLocalSession, cancels: int
) -> None:
    # The spawn took the fast path (no task); the cancellation lands in the window, and
    # the start's own teardown of the entry still runs to the end (settled: the process
    # is alive, so not the fast teardown).
    s = cgroup_session
    marker = unique_seconds()
    await s.pty_exec_start("true")  # the leaf it reuses exists, its events file open
    calls = HookCalls(s)
    fds = open_fds()
    task = asyncio.ensure_future(s.pty_exec_start(f"exec sleep {marker}", yield_time_s=30))
    assert await eventually(lambda: bool(host_pids_with_arg(marker)))
    for index in range(cancels):
        task.cancel(f"stop-{index}")
        await asyncio.sleep(0)  # let each cancellation land before the next
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls.spawns == 0 and calls.teardowns == 1
    assert host_pids_with_arg(marker) == []
    assert s.pty_processes() == [] and s._core.processes.reserved == set()
    assert open_fds() == fds
