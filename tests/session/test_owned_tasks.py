"""`sandbox.session.ownership.OwnedTasks`, alone: a real registry and real entries.

`Teardowns` is the backend's `_terminate_pty_entry` as a test writes it: it records
each entry, can park on an event (it says when it is parked) and can fail.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from sandbox import arguments
from sandbox.errors import CleanupError, ConnectionLostError, SessionClosedError
from sandbox.process_entry import ProcessSpec, PtyEntry
from sandbox.session.ownership import OwnedTasks
from sandbox.session.registry import ProcessRegistry

SPEC = ProcessSpec(
    command=arguments.build_command(("true",), shell=True, env=None, cwd=None),
    tty=True,
    rows=24,
    cols=80,
)


def _open() -> None:
    """`check_open` of a running session."""


class Teardowns:
    def __init__(self, *, park: bool = False, fail: set[int] | None = None) -> None:
        self.done: list[int] = []
        self.running = 0
        self.most_at_once = 0
        self.parked = asyncio.Event()
        self.go = asyncio.Event()
        if not park:
            self.go.set()
        self.fail = fail or set()

    async def __call__(self, entry: PtyEntry) -> None:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            self.parked.set()
            await self.go.wait()
            for _ in range(3):  # yield, as a real teardown's I/O does: others may start
                await asyncio.sleep(0)
            if entry.process_id in self.fail:
                raise ConnectionLostError(f"teardown of {entry.process_id} failed")
            self.done.append(entry.process_id)
        finally:
            self.running -= 1


# An admission (the session's lifecycle) whose session is not closing.
OPEN = SimpleNamespace(closing=False)


class Session:
    """The two collaborators wired as `BaseSandboxSession` wires them (the session is
    their admission here: `closing` is a switch the test flips)."""

    def __init__(self, teardowns: Teardowns, *, concurrency: int = 8) -> None:
        self.closing = False
        self.processes: ProcessRegistry = ProcessRegistry("test", output_limit_bytes=4096)
        self.owned: OwnedTasks = OwnedTasks(
            self.processes, teardowns, admission=self, concurrency=concurrency
        )

    async def admitted(self, n: int) -> list[PtyEntry]:
        entries = []
        for _ in range(n):
            entry, _ = await self.processes.reserve(SPEC, check_open=_open)
            assert self.processes.admit(entry)
            entries.append(entry)
        return entries


async def test_a_batch_tears_every_entry_down_and_releases_its_id() -> None:
    teardowns = Teardowns()
    s = Session(teardowns)
    entries = await s.admitted(3)
    await s.owned.settle_batch(s.processes.take_all())
    assert sorted(teardowns.done) == sorted(e.process_id for e in entries)
    assert s.processes.reserved == set()
    assert all(e.exited and e.eof for e in entries)  # waiting windows end
    assert not s.owned.busy


async def test_a_batch_runs_at_most_concurrency_teardowns_at_once() -> None:
    teardowns = Teardowns()
    s = Session(teardowns, concurrency=2)
    await s.admitted(5)
    await s.owned.settle_batch(s.processes.take_all())
    assert len(teardowns.done) == 5 and teardowns.most_at_once == 2


async def test_every_entry_is_attempted_and_failures_come_back_together() -> None:
    s = Session(Teardowns())
    entries = await s.admitted(3)
    failing = {entries[0].process_id, entries[2].process_id}
    s.owned = OwnedTasks(s.processes, Teardowns(fail=failing), admission=OPEN)
    with pytest.raises(CleanupError) as caught:
        await s.owned.settle_batch(s.processes.take_all())
    assert len(caught.value.errors) == 2
    assert s.processes.reserved == set()  # released even when the teardown failed


async def test_one_failure_is_raised_as_itself_or_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = Session(Teardowns())
    first, second = await s.admitted(2)
    s.owned = OwnedTasks(
        s.processes, Teardowns(fail={first.process_id, second.process_id}), admission=OPEN
    )
    with pytest.raises(ConnectionLostError, match=f"teardown of {first.process_id}"):
        await s.owned.settle_batch([s.processes.take(first.process_id)])
    with caplog.at_level(logging.WARNING, logger="sandbox"):
        await s.owned.settle_batch([s.processes.take(second.process_id)], log_errors=True)
    assert f"a teardown failed: teardown of {second.process_id}" in caplog.text


async def test_a_cancelled_caller_waits_for_its_batch_and_the_close_does_too() -> None:
    teardowns = Teardowns(park=True)
    s = Session(teardowns)
    (entry,) = await s.admitted(1)
    caller = asyncio.ensure_future(s.owned.settle_batch(s.processes.take_all()))
    await teardowns.parked.wait()
    caller.cancel()
    await asyncio.sleep(0)
    assert not caller.done()  # settled: the cancellation waits for the teardown
    close = asyncio.ensure_future(s.owned.wait_teardowns())
    await asyncio.sleep(0)
    assert not close.done() and s.owned.busy
    teardowns.go.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await close
    assert teardowns.done == [entry.process_id] and s.processes.reserved == set()


async def test_a_pending_write_is_ended_before_the_backends_teardown() -> None:
    order: list[str] = []

    async def terminate(entry: PtyEntry) -> None:
        assert entry.write_task is not None
        order.append("write done" if entry.write_task.done() else "write pending")

    s = Session(Teardowns())
    s.owned = OwnedTasks(s.processes, terminate, admission=OPEN)
    (entry,) = await s.admitted(1)
    entry.write_task = asyncio.ensure_future(asyncio.Event().wait())
    await s.owned.settle_batch(s.processes.take_all())
    assert order == ["write done"] and entry.write_task.cancelled()


async def test_discard_tears_down_only_an_entry_still_registered() -> None:
    teardowns = Teardowns()
    s = Session(teardowns)
    first, second = await s.admitted(2)
    await s.owned.discard(first)
    assert teardowns.done == [first.process_id]
    await s.owned.discard(first)  # already gone: nothing happens twice
    taken = s.processes.take(second.process_id)
    await s.owned.discard(second)  # someone else owns it now
    assert teardowns.done == [first.process_id]
    await s.owned.settle_batch([taken])
    assert teardowns.done == [first.process_id, second.process_id]


async def test_a_cancelled_caller_cancels_and_awaits_its_owned_task() -> None:
    s = Session(Teardowns())
    started = asyncio.Event()
    unwound: list[str] = []

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # an undo that itself awaits
            unwound.append("undone")

    caller = asyncio.ensure_future(s.owned.run(work()))
    await started.wait()
    assert s.owned.busy
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert unwound == ["undone"] and not s.owned.busy


async def test_a_task_the_close_cancels_makes_its_caller_lose() -> None:
    s = Session(Teardowns())
    started = asyncio.Event()

    async def work() -> int:
        started.set()
        await asyncio.Event().wait()
        return 1

    caller = asyncio.ensure_future(s.owned.run(work()))
    await started.wait()
    s.closing = True
    await s.owned.cancel_in_flight()
    assert not s.owned.busy
    with pytest.raises(SessionClosedError, match="the test session was closed"):
        await caller


async def test_a_task_that_fails_during_the_close_loses_with_its_error_as_cause() -> None:
    s = Session(Teardowns())
    broken = ConnectionLostError("cut by the close")

    async def work() -> None:
        s.closing = True
        raise broken

    with pytest.raises(SessionClosedError) as caught:
        await s.owned.run(work())
    assert caught.value.__cause__ is broken


async def test_outside_a_close_results_and_errors_pass_through() -> None:
    s = Session(Teardowns())

    async def fine() -> str:
        return "ok"

    async def bad() -> None:
        raise ConnectionLostError("its own")

    assert await s.owned.run(fine()) == "ok"
    with pytest.raises(ConnectionLostError, match="its own"):
        await s.owned.run(bad())


async def test_cancel_in_flight_cancels_the_spawns_of_starting_entries() -> None:
    s = Session(Teardowns())
    entry, _ = await s.processes.reserve(SPEC, check_open=_open)
    spawned = asyncio.Event()

    async def spawn() -> None:
        spawned.set()
        await asyncio.Event().wait()

    entry.spawn_task = asyncio.ensure_future(spawn())
    await spawned.wait()
    await s.owned.cancel_in_flight()
    assert entry.spawn_task.cancelled()


class Spawner:
    """The `_spawn_process` hook: parks until `go` (saying so), then fails or returns."""

    def __init__(self, *, fail: BaseException | None = None, park: bool = False) -> None:
        self.fail = fail
        self.parked = asyncio.Event()
        self.go = asyncio.Event()
        if not park:
            self.go.set()
        self.spawned: list[int] = []
        self.cancelled = False

    async def __call__(self, entry: PtyEntry) -> None:
        self.parked.set()
        try:
            await self.go.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.fail is not None:
            raise self.fail
        self.spawned.append(entry.process_id)


async def _reserved(s: Session) -> PtyEntry:
    entry, victim = await s.processes.reserve(SPEC, check_open=_open)
    assert victim is None
    return entry


async def test_start_process_tears_the_victim_down_prepares_spawns_and_admits() -> None:
    teardowns = Teardowns(fail=set())
    s = Session(teardowns)
    (old,) = await s.admitted(1)
    victim = s.processes.take(old.process_id)
    teardowns.fail.add(victim.process_id)  # its failure is not this start's
    entry = await _reserved(s)
    order: list[str] = []
    spawner = Spawner()

    def prepare() -> None:
        order.append("prepared" if old.process_id not in s.processes.reserved else "too early")

    await s.owned.start_process(entry, victim, prepare=prepare, spawn=spawner)
    assert order == ["prepared"] and spawner.spawned == [entry.process_id]
    assert s.processes.lookup(entry.process_id) is entry and not entry.removed


async def test_a_failed_spawn_tears_the_entry_down_and_raises() -> None:
    teardowns = Teardowns()
    s = Session(teardowns)
    entry = await _reserved(s)
    lost = ConnectionLostError("spawn failed")
    with pytest.raises(ConnectionLostError):
        await s.owned.start_process(entry, None, prepare=lambda: None, spawn=Spawner(fail=lost))
    assert teardowns.done == [entry.process_id] and s.processes.reserved == set()


async def test_a_failing_prepare_tears_the_entry_down_without_spawning() -> None:
    teardowns = Teardowns()
    s = Session(teardowns)
    entry = await _reserved(s)
    spawner = Spawner()

    def prepare() -> None:
        raise ConnectionLostError("no recording")

    with pytest.raises(ConnectionLostError, match="no recording"):
        await s.owned.start_process(entry, None, prepare=prepare, spawn=spawner)
    assert spawner.spawned == [] and teardowns.done == [entry.process_id]


async def test_a_cancelled_start_cancels_the_spawn_and_tears_the_entry_down() -> None:
    teardowns = Teardowns()
    s = Session(teardowns)
    entry = await _reserved(s)
    spawner = Spawner(park=True)
    start = asyncio.ensure_future(
        s.owned.start_process(entry, None, prepare=lambda: None, spawn=spawner)
    )
    await spawner.parked.wait()
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert spawner.cancelled and teardowns.done == [entry.process_id]
    assert s.processes.reserved == set() and len(s.processes) == 0


async def test_a_start_whose_entry_the_close_took_loses() -> None:
    teardowns = Teardowns()
    s = Session(teardowns)
    entry = await _reserved(s)
    spawner = Spawner(park=True)
    start = asyncio.ensure_future(
        s.owned.start_process(entry, None, prepare=lambda: None, spawn=spawner)
    )
    await spawner.parked.wait()
    s.closing = True
    taken = s.processes.take_everything()  # the close's batch owns it now
    spawner.go.set()
    with pytest.raises(SessionClosedError):
        await start
    assert teardowns.done == []  # not ours to tear down: the close does
    await s.owned.settle_batch(taken)
    assert teardowns.done == [entry.process_id]


async def test_a_spawn_that_wins_against_the_close_is_undone_by_the_start() -> None:
    teardowns = Teardowns()
    s = Session(teardowns)
    entry = await _reserved(s)

    async def spawn(entry: PtyEntry) -> None:
        s.closing = True  # the close began while the spawn finished

    with pytest.raises(SessionClosedError):
        await s.owned.start_process(entry, None, prepare=lambda: None, spawn=spawn)
    assert teardowns.done == [entry.process_id] and len(s.processes) == 0


async def test_let_go_entries_are_released_not_ended_and_changed_is_called() -> None:
    ended, released = Teardowns(), Teardowns()
    changes: list[int] = []
    s = Session(ended)
    s.owned = OwnedTasks(
        s.processes,
        ended,
        admission=OPEN,
        release=released,
        changed=lambda: changes.append(len(s.processes)),
    )
    entries = await s.admitted(3)
    kept = {entries[0].process_id, entries[2].process_id}
    errors = await s.owned.settle_all(s.processes.take_all(), let_go=kept)
    assert errors == []
    assert sorted(released.done) == sorted(kept)
    assert ended.done == [entries[1].process_id]
    assert changes == [0] and s.processes.reserved == set()
    # The let-go mark is used up: the same id later is ended as usual.
    again = await s.admitted(1)
    await s.owned.settle_batch(s.processes.take_all())
    assert ended.done[-1] == again[0].process_id


async def test_settle_all_returns_the_failures_instead_of_raising() -> None:
    s = Session(Teardowns())
    entries = await s.admitted(2)
    failing = {entries[0].process_id}
    s.owned = OwnedTasks(s.processes, Teardowns(fail=failing), admission=OPEN)
    errors = await s.owned.settle_all(s.processes.take_all())
    assert [str(e) for e in errors] == [f"teardown of {entries[0].process_id} failed"]
    assert s.processes.reserved == set()
