"""The ownership rules: exactly one owner when a close races a creation.

Each test parks the real backend hook at a gate (`sandbox.testing.faults.park_calls`:
before the hook does anything, or after it made its resource but before its caller
knows), closes the session there, and checks that `aclose()` returned only once nothing
was left (the backend's own factory then runs its leak checks), that the state is
`closed` for good, and that the losing call raised. Star-import it like `suite` (see
`sandbox.testing.conformance`); tests/test_conformance_ownership.py runs it in-tree.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import sandbox
from sandbox import SessionClosedError, SessionState

from ..faults import park_calls
from . import Backend, ProcessLister, eventually, unique_seconds
from ._fixtures import (
    backend_under_test_fixture,
    call_in_progress,
    mark_async_tests,
    need_process_lister,
    processes_with_arg_fixture,
    reserved_ids,
)

__all__ = [
    "backend_under_test_fixture",
    "processes_with_arg_fixture",
    "test_cancel_start_at_every_step",
    "test_cancelled_start_leaves_nothing_and_can_start_again",
    "test_close_while_exec_runs",
    "test_close_while_poll_waits",
    "test_close_while_spawn_is_parked",
    "test_close_while_start_is_parked",
]


async def _nothing_left(backend: Backend, marker: str) -> None:
    """No process with `marker` in its argv: at once for a backend whose close waits for
    its processes, within moments for others (a SIGKILL is sent, not awaited)."""
    lister = backend.processes_with_arg
    if lister is None:
        return
    if backend.waits_for_processes:
        assert list(lister(marker)) == []
    assert await eventually(lambda: not lister(marker))


async def _closed_for_good(s: sandbox.BaseSandboxSession) -> None:
    assert s.state is SessionState.CLOSED
    with pytest.raises(SessionClosedError):
        await s.exec("true")
    with pytest.raises(SessionClosedError):
        await s.pty_exec_start("true")
    with pytest.raises(SessionClosedError):
        await s.start()


@pytest.mark.parametrize("after", [False, True], ids=["before-create", "after-create"])
async def test_close_while_start_is_parked(
    backend_under_test: Backend, tmp_path: Path, after: bool
) -> None:
    async with backend_under_test.session(tmp_path, start=False) as s:
        gate = park_calls(s, "_start_backend", after=after)
        starting = asyncio.ensure_future(s.start())
        await gate.reached.wait()
        await s.aclose()
        assert starting.done(), "aclose() returned before the start it cancelled ended"
        with pytest.raises(SessionClosedError):
            await starting
        await _closed_for_good(s)


@pytest.mark.parametrize("after", [False, True], ids=["before-create", "after-create"])
async def test_cancelled_start_leaves_nothing_and_can_start_again(
    backend_under_test: Backend, tmp_path: Path, after: bool
) -> None:
    async with backend_under_test.session(tmp_path, start=False) as s:
        gate = park_calls(s, "_start_backend", after=after)
        starting = asyncio.ensure_future(s.start())
        await gate.reached.wait()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert s.state is SessionState.NEW
        gate.release()
        await s.start()
        assert (await s.exec("echo again")).stdout == b"again\n"


async def test_cancel_start_at_every_step(backend_under_test: Backend, tmp_path: Path) -> None:
    async with backend_under_test.session(tmp_path, start=False) as s:
        for steps in (0, 1, 2, 3, 5, 8, 13):
            task = asyncio.ensure_future(s.start())
            for _ in range(steps):
                if task.done():
                    break
                await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                assert s.state is SessionState.NEW
            else:
                assert s.state is SessionState.RUNNING
                break
        await s.start()
        assert (await s.exec("echo up")).stdout == b"up\n"
    # The fixture's checks: no sandbox, container, stream or process was left.


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "pipes"])
@pytest.mark.parametrize("after", [False, True], ids=["before-spawn", "after-spawn"])
async def test_close_while_spawn_is_parked(
    backend_under_test: Backend, tmp_path: Path, tty: bool, after: bool
) -> None:
    marker = unique_seconds()
    async with backend_under_test.session(tmp_path) as s:
        gate = park_calls(s, "_spawn_process", after=after)
        starting = asyncio.ensure_future(s.pty_exec_start(f"exec sleep {marker}", tty=tty))
        await gate.reached.wait()
        await s.aclose()
        await _nothing_left(backend_under_test, marker)
        with pytest.raises(SessionClosedError):
            await starting
        assert reserved_ids(s) == set()
        await _closed_for_good(s)


async def test_close_while_exec_runs(
    backend_under_test: Backend, tmp_path: Path, processes_with_arg: ProcessLister
) -> None:
    marker = unique_seconds()
    async with backend_under_test.session(tmp_path) as s:
        need_process_lister(backend_under_test)
        running = asyncio.ensure_future(s.exec(f"sleep {marker} & sleep {marker}; wait"))
        assert await eventually(lambda: len(processes_with_arg(marker)) == 2, timeout=30)
        await s.aclose()
        await _nothing_left(backend_under_test, marker)
        with pytest.raises(SessionClosedError):
            await running
        await _closed_for_good(s)


async def test_close_while_poll_waits(backend_under_test: Backend, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with backend_under_test.session(tmp_path) as s:
        update = await s.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
        pid = update.process_id
        assert pid is not None
        polling = asyncio.ensure_future(s.pty_write_stdin(pid, "", yield_time_s=30))
        assert await eventually(lambda: call_in_progress(s, pid))
        await s.aclose()
        assert polling.done(), "the poll still waits after the close returned"
        try:
            result = polling.result()
        except SessionClosedError:
            pass
        else:
            assert result.process_id is None
        await _nothing_left(backend_under_test, marker)
        await _closed_for_good(s)


mark_async_tests(globals())
