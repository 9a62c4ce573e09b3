"""Conformance: exactly one owner when a close races a creation, on every backend.

Each test parks the real backend hook at a gate (`tests.helpers.HookGate`: before the
hook does anything, or after it made its resource but before its caller knows), closes
the session there, and checks that `aclose()` returned only once nothing was left (the
fixture's own checks then look at the fake's records, the engine or /proc), that the
state is `closed` for good, and that the losing call raised.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import ModuleType

import pytest

import sandbox
from sandbox import SessionClosedError, SessionState
from tests.helpers import HookGate, eventually, host_pids_with_arg, unique_seconds

LOCAL = ("unix_local", "unix_local_confined", "unix_local_tag")


async def _nothing_left(backend: ModuleType, marker: str) -> None:
    """No process with `marker` in its argv: at once for local processes (the close
    waited for them), within moments for remote ones (a SIGKILL is sent, not awaited)."""
    if backend.NAME in LOCAL:
        assert host_pids_with_arg(marker) == []
    assert await eventually(lambda: not host_pids_with_arg(marker))


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
    backend: ModuleType, tmp_path: Path, after: bool
) -> None:
    async with backend.session(tmp_path, start=False) as s:
        gate = HookGate(s, "_start_backend", after=after)
        starting = asyncio.ensure_future(s.start())
        await gate.reached.wait()
        await s.aclose()
        assert starting.done(), "aclose() returned before the start it cancelled ended"
        with pytest.raises(SessionClosedError):
            await starting
        await _closed_for_good(s)


@pytest.mark.parametrize("after", [False, True], ids=["before-create", "after-create"])
async def test_cancelled_start_leaves_nothing_and_can_start_again(
    backend: ModuleType, tmp_path: Path, after: bool
) -> None:
    async with backend.session(tmp_path, start=False) as s:
        gate = HookGate(s, "_start_backend", after=after)
        starting = asyncio.ensure_future(s.start())
        await gate.reached.wait()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert s.state is SessionState.NEW
        gate.release()
        await s.start()
        assert (await s.exec("echo again")).stdout == b"again\n"


async def test_cancel_start_at_every_step(backend: ModuleType, tmp_path: Path) -> None:
    async with backend.session(tmp_path, start=False) as s:
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
    backend: ModuleType, tmp_path: Path, tty: bool, after: bool
) -> None:
    marker = unique_seconds()
    async with backend.session(tmp_path) as s:
        gate = HookGate(s, "_spawn_process", after=after)
        starting = asyncio.ensure_future(s.pty_exec_start(f"exec sleep {marker}", tty=tty))
        await gate.reached.wait()
        await s.aclose()
        await _nothing_left(backend, marker)
        with pytest.raises(SessionClosedError):
            await starting
        assert s._processes.reserved == set()
        await _closed_for_good(s)


async def test_close_while_exec_runs(backend: ModuleType, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with backend.session(tmp_path) as s:
        running = asyncio.ensure_future(s.exec(f"sleep {marker} & sleep {marker}; wait"))
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2, timeout=30)
        await s.aclose()
        await _nothing_left(backend, marker)
        with pytest.raises(SessionClosedError):
            await running
        await _closed_for_good(s)


async def test_close_while_poll_waits(backend: ModuleType, tmp_path: Path) -> None:
    marker = unique_seconds()
    async with backend.session(tmp_path) as s:
        update = await s.pty_exec_start(f"echo ready; exec sleep {marker}", until="ready")
        pid = update.process_id
        assert pid is not None
        polling = asyncio.ensure_future(s.pty_write_stdin(pid, "", yield_time_s=30))
        assert await eventually(lambda: s._processes.lookup(pid).call_lock.locked())
        await s.aclose()
        assert polling.done(), "the poll still waits after the close returned"
        try:
            result = polling.result()
        except SessionClosedError:
            pass
        else:
            assert result.process_id is None
        await _nothing_left(backend, marker)
        await _closed_for_good(s)
