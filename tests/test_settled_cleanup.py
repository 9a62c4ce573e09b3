"""Every ownership transfer goes through the settled cleanup.

Shape (the same for each transfer): the session's `_terminate_pty_entry` is replaced by
one that signals it started and then blocks on an event; the operation runs in a task;
once the signal fires the entry must already have left the registry; the task is
cancelled (once, or three times); the teardown is released; then every teardown must
have completed, the task must end in CancelledError with its message, and the registry
must be as expected. The teardown still runs the real backend teardown, so the real
processes must be gone too.

These are the owned-task paths, which every transfer below takes as it is. The one
fast path on them, an exited process's handle ending it at once (`Process.finish_now`,
which never awaits, so it has nothing to cancel), cannot end a process that left a
child alive: the exited process's test leaves one, so its teardown must wait.
tests/backends/test_unix_local_fast_paths.py covers the fast paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.backends.unix_local import UnixLocalSession
from sandbox.process_entry import PtyEntry
from tests.helpers import eventually, host_pids_with_arg, unique_seconds


class BlockingTeardown:
    """Stands in for `_terminate_pty_entry`: signals, blocks, then runs the real one."""

    def __init__(self, session: UnixLocalSession, *, fail_with: Exception | None = None) -> None:
        self.real = session._terminate_pty_entry
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.begun: list[int] = []
        self.completed: list[int] = []
        self.fail_with = fail_with
        session._terminate_pty_entry = self.teardown  # type: ignore[method-assign]
        _blockers.append(self)

    async def teardown(self, entry: PtyEntry) -> None:
        self.begun.append(entry.process_id)
        self.started.set()
        await self.release.wait()
        await self.real(entry)
        self.completed.append(entry.process_id)
        if self.fail_with is not None:
            raise self.fail_with


# Every BlockingTeardown of the running test. A test that fails while a teardown is blocked
# must not hang the suite: the settled teardown outlives any cancellation, so the event
# loop's shutdown would wait for it forever. `release_blockers` lets it run instead.
_blockers: list[BlockingTeardown] = []


@pytest.fixture(autouse=True)
async def release_blockers() -> AsyncIterator[None]:
    """Release every blocked teardown when the test ends (an async fixture: torn down on
    the test's event loop, before the loop cancels what is left and waits for it)."""
    _blockers.clear()
    yield
    for blocker in _blockers:
        blocker.release.set()


class Outcome:
    """What came out of the operation's coroutine, seen from inside the task (so the
    cancellation message is observed exactly as raised)."""

    error: BaseException | None = None
    value: Any = None


def run_task(make: Callable[[], Awaitable[Any]]) -> tuple[asyncio.Task[None], Outcome]:
    outcome = Outcome()

    async def runner() -> None:
        try:
            outcome.value = await make()
        except BaseException as exc:
            outcome.error = exc
            raise

    return asyncio.ensure_future(runner()), outcome


async def cancel_repeatedly(task: asyncio.Task[None], times: int) -> None:
    for index in range(times):
        task.cancel(f"stop-{index}")
        await asyncio.sleep(0)  # let the cancellation land before the next one


async def finish(task: asyncio.Task[None]) -> None:
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[UnixLocalSession]:
    s = sandbox.open_session("unix_local", workdir=tmp_path, terminate_grace_s=0.2)
    assert isinstance(s, UnixLocalSession)
    async with s:
        yield s


async def start_sleeper(session: UnixLocalSession, marker: str, tty: bool = True) -> int:
    update = await session.pty_exec_start(
        f"echo ready; exec sleep {marker}", tty=tty, until="ready"
    )
    assert update.process_id is not None
    return update.process_id


CANCELS = [1, 3]


@pytest.mark.parametrize("cancels", CANCELS)
async def test_finalizing_an_exited_process(session: UnixLocalSession, cancels: int) -> None:
    # cat exits on ^D, leaving a child alive (off its terminal, so the output ends, and
    # deaf to the terminal's hangup): its handle cannot end it at once, the settled
    # teardown must.
    marker = unique_seconds()
    child = f"(trap '' HUP; exec sleep {marker}) < /dev/null > /dev/null 2>&1 &"
    update = await session.pty_exec_start(f"{child} echo ready; exec cat", tty=True, until="ready")
    pid = update.process_id
    assert pid is not None
    assert await eventually(lambda: bool(host_pids_with_arg(marker)))  # it ignores SIGHUP now
    blocker = BlockingTeardown(session)
    task, outcome = run_task(lambda: session.pty_write_stdin(pid, "\x04", yield_time_s=10))
    await blocker.started.wait()
    assert session.pty_processes() == [], "finalized entry leaves the registry before teardown"
    await cancel_repeatedly(task, cancels)
    assert not task.done(), "the caller waits for the teardown it owns"
    blocker.release.set()
    await finish(task)
    assert isinstance(outcome.error, asyncio.CancelledError)
    assert outcome.error.args == ("stop-0",)
    assert blocker.completed == [pid]
    assert session.pty_processes() == [] and session._core.processes.reserved == set()
    assert not host_pids_with_arg(marker)


@pytest.mark.parametrize("cancels", CANCELS)
async def test_pruning_a_full_registry(tmp_path: Path, cancels: int) -> None:
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path, max_processes=9, terminate_grace_s=0.2) as s:
        pids = [await start_sleeper(s, marker, tty=False) for _ in range(9)]
        blocker = BlockingTeardown(s)
        task, outcome = run_task(lambda: s.pty_exec_start(f"exec sleep {marker}"))
        await blocker.started.wait()
        victim = blocker.begun[0]
        assert victim == pids[0], "the least recently used goes"
        assert victim not in {i.process_id for i in s.pty_processes()}
        await cancel_repeatedly(task, cancels)
        blocker.release.set()
        await finish(task)
        assert isinstance(outcome.error, asyncio.CancelledError)
        assert outcome.error.args == ("stop-0",)
        assert victim in blocker.completed
        assert set(blocker.begun) == set(blocker.completed)
        assert {i.process_id for i in s.pty_processes()} == set(pids[1:])
        assert s._core.processes.reserved == set(pids[1:])
    assert await eventually(lambda: not host_pids_with_arg(marker))


@pytest.mark.parametrize("cancels", CANCELS)
async def test_terminate_one(session: UnixLocalSession, cancels: int) -> None:
    marker = unique_seconds()
    pid = await start_sleeper(session, marker)
    blocker = BlockingTeardown(session)
    task, outcome = run_task(lambda: session.pty_terminate(pid))
    await blocker.started.wait()
    assert session.pty_processes() == []
    await cancel_repeatedly(task, cancels)
    blocker.release.set()
    await finish(task)
    assert isinstance(outcome.error, asyncio.CancelledError)
    assert outcome.error.args == ("stop-0",)
    assert blocker.completed == [pid]
    assert session._core.processes.reserved == set()
    assert not host_pids_with_arg(marker)


@pytest.mark.parametrize("cancels", CANCELS)
async def test_terminate_all_is_one_batch(tmp_path: Path, cancels: int) -> None:
    marker = unique_seconds()
    async with UnixLocalSession(
        workdir=tmp_path, teardown_concurrency=1, terminate_grace_s=0.2
    ) as s:
        pids = [await start_sleeper(s, marker), await start_sleeper(s, marker, tty=False)]
        blocker = BlockingTeardown(s)
        task, outcome = run_task(s.pty_terminate_all)
        await blocker.started.wait()
        assert len(blocker.begun) == 1, "cancelled during the FIRST entry"
        assert s.pty_processes() == []
        await cancel_repeatedly(task, cancels)
        blocker.release.set()
        await finish(task)
        assert isinstance(outcome.error, asyncio.CancelledError)
        assert outcome.error.args == ("stop-0",)
        assert sorted(blocker.completed) == sorted(pids), "the second entry is torn down too"
        assert s._core.processes.reserved == set()
        assert not host_pids_with_arg(marker)


@pytest.mark.parametrize("cancels", CANCELS)
async def test_start_that_fails_before_registration(
    session: UnixLocalSession, cancels: int
) -> None:
    blocker = BlockingTeardown(session)
    task, outcome = run_task(lambda: session.pty_exec_start("true", cwd="/no/such/dir"))
    await blocker.started.wait()
    assert session.pty_processes() == []
    await cancel_repeatedly(task, cancels)
    blocker.release.set()
    await finish(task)
    assert isinstance(outcome.error, asyncio.CancelledError)
    assert outcome.error.args == ("stop-0",)
    assert len(blocker.completed) == 1
    assert session._core.processes.reserved == set()


@pytest.mark.parametrize("cancels", CANCELS)
async def test_start_cancelled_before_registration(session: UnixLocalSession, cancels: int) -> None:
    marker = unique_seconds()
    spawned = asyncio.Event()
    real_spawn = session._spawn_process

    async def spawn_then_block(entry: PtyEntry) -> None:
        pending = real_spawn(entry)  # the real process now exists...
        if pending is not None:
            await pending
        spawned.set()
        await asyncio.Event().wait()  # ...and the start is stuck before registration

    session._spawn_process = spawn_then_block  # type: ignore[method-assign]
    blocker = BlockingTeardown(session)
    task, outcome = run_task(lambda: session.pty_exec_start(f"exec sleep {marker}"))
    await spawned.wait()
    # Spawned is not exec'd: `sh -c "exec sleep N"` shows the marker once sh has exec'd.
    assert await eventually(lambda: bool(host_pids_with_arg(marker)))
    await cancel_repeatedly(task, 1)
    await blocker.started.wait()
    assert session.pty_processes() == []
    await cancel_repeatedly(task, cancels - 1)
    blocker.release.set()
    await finish(task)
    assert isinstance(outcome.error, asyncio.CancelledError)
    assert outcome.error.args == ("stop-0",)
    assert len(blocker.completed) == 1
    assert session._core.processes.reserved == set()
    assert not host_pids_with_arg(marker)


@pytest.mark.parametrize("cancels", CANCELS)
async def test_session_close(tmp_path: Path, cancels: int) -> None:
    marker = unique_seconds()
    s = UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.2)
    await s.start()
    pids = [await start_sleeper(s, marker), await start_sleeper(s, marker, tty=False)]
    blocker = BlockingTeardown(s)
    task, outcome = run_task(s.aclose)
    await blocker.started.wait()
    assert s.pty_processes() == []
    await cancel_repeatedly(task, cancels)
    blocker.release.set()
    await finish(task)
    assert isinstance(outcome.error, asyncio.CancelledError)
    assert outcome.error.args == ("stop-0",)
    assert sorted(blocker.completed) == sorted(pids)
    assert s.state is sandbox.SessionState.CLOSED
    assert not host_pids_with_arg(marker)
    await s.aclose()  # idempotent after a cancelled close


async def test_cleanup_error_surfaces_even_when_cancelled(session: UnixLocalSession) -> None:
    marker = unique_seconds()
    pid = await start_sleeper(session, marker)
    blocker = BlockingTeardown(session, fail_with=RuntimeError("teardown broke"))
    task, outcome = run_task(lambda: session.pty_terminate(pid))
    await blocker.started.wait()
    await cancel_repeatedly(task, 2)
    blocker.release.set()
    with pytest.raises(RuntimeError, match="teardown broke"):
        await task
    assert isinstance(outcome.error, RuntimeError)
    assert blocker.completed == [pid]
    assert session._core.processes.reserved == set()


async def test_batch_attempts_every_entry_when_one_fails(tmp_path: Path) -> None:
    marker = unique_seconds()
    async with UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.2) as s:
        pids = [await start_sleeper(s, marker) for _ in range(3)]
        real = s._terminate_pty_entry
        failed: list[int] = []

        async def flaky(entry: PtyEntry) -> None:
            await real(entry)
            if entry.process_id == pids[1]:
                failed.append(entry.process_id)
                raise OSError("one teardown failed")

        s._terminate_pty_entry = flaky  # type: ignore[method-assign]
        with pytest.raises(OSError, match="one teardown failed"):
            await s.pty_terminate_all()
        assert failed == [pids[1]]
        assert s.pty_processes() == [] and s._core.processes.reserved == set()
        assert not host_pids_with_arg(marker)
