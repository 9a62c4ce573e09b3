"""`sandbox.session.lifecycle.Lifecycle`, alone: real collaborators, steerable hooks.

`Host` is a session as the lifecycle sees it: a real `ProcessRegistry`, `OwnedTasks`,
`Recordings` and `DurableState` in a `_core` as a session's, and backend hooks a test
steers (the start can park on an event and fail; each hook records that it ran).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sandbox import arguments
from sandbox.durable.refs import ProcessRef, SessionRef
from sandbox.durable.state import DurableState
from sandbox.errors import (
    ConnectionLostError,
    SessionClosedError,
    SessionNotStartedError,
    SessionStateError,
    SessionTakenOverError,
)
from sandbox.process_entry import ProcessSpec, PtyEntry
from sandbox.session.capabilities import Durability
from sandbox.session.lifecycle import Lifecycle, SessionState
from sandbox.session.options import SessionOptions
from sandbox.session.ownership import OwnedTasks
from sandbox.session.recordings import Recordings
from sandbox.session.registry import ProcessRegistry

SPEC = ProcessSpec(
    command=arguments.build_command(("true",), shell=True, env=None, cwd=None),
    tty=True,
    rows=24,
    cols=80,
)


class Host:
    """The part of a session `Lifecycle` uses, with hooks that record their calls."""

    backend_name = "test"
    output_limit_bytes = 4096
    keeps_processes = False

    def __init__(
        self, *, park_start: bool = False, fail_start: BaseException | None = None
    ) -> None:
        self.calls: list[str] = []
        self.start_entered = asyncio.Event()
        self.start_go = asyncio.Event()
        if not park_start:
            self.start_go.set()
        self.fail_start = fail_start
        self.teardown_entered = asyncio.Event()
        self.teardown_go = asyncio.Event()
        self.teardown_go.set()
        self.abandoned: list[int] = []
        processes: ProcessRegistry[None] = ProcessRegistry("test", output_limit_bytes=4096)
        self._core = SimpleNamespace(
            durable=DurableState(None),
            options=SessionOptions(),
            capabilities=SimpleNamespace(durability=HostDurability(self)),
            processes=processes,
            recordings=Recordings(None),
        )
        self.lifecycle = self._core.lifecycle = Lifecycle(self)
        self._core.owned = OwnedTasks(
            processes,
            self._terminate,
            admission=self.lifecycle,
            changed=self.lifecycle.changed,
        )

    async def admitted(self) -> PtyEntry[None]:
        processes = self._core.processes
        entry, _ = await processes.reserve(SPEC, check_open=self.lifecycle.admit_now)
        assert processes.admit(entry)
        return entry

    async def _terminate(self, entry: PtyEntry[None]) -> None:
        self.teardown_entered.set()
        await self.teardown_go.wait()
        self.calls.append(f"terminate {entry.process_id}")

    async def _start_backend(self) -> None:
        self.calls.append("start")
        self.start_entered.set()
        await self.start_go.wait()
        if self.fail_start is not None:
            raise self.fail_start

    async def _stop_backend(self) -> None:
        self.calls.append("stop")

    def _abandon(self, entries: list[PtyEntry[None]]) -> None:
        self.abandoned.extend(e.process_id for e in entries)


class HostDurability(Durability):
    """The test host's refs: one sandbox, no options of its own, no lease."""

    def ref_sandbox(self) -> dict[str, Any]:
        return {"sandbox": "one"}

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def resume(self, ref: SessionRef) -> None:
        raise AssertionError("not resumed here")

    async def reattach(self, entry: PtyEntry[Any], process: ProcessRef) -> None:
        raise AssertionError("not resumed here")

    async def detach(self) -> None:
        self.session.calls.append("detach")


async def test_calls_are_refused_before_the_start_and_after_the_close() -> None:
    host = Host()
    life = host.lifecycle
    assert life.state is SessionState.NEW and not life.closing
    with pytest.raises(SessionNotStartedError, match="test session is not started"):
        life.admit_now()
    with pytest.raises(SessionNotStartedError):
        await life.admit()
    await life.start()
    assert life.state is SessionState.RUNNING
    life.admit_now()
    await life.admit()
    await life.start()  # a no-op when running
    assert host.calls == ["start"]
    await life.close()
    assert life.state is SessionState.CLOSED and life.closing
    assert host.calls == ["start", "stop"]
    with pytest.raises(SessionClosedError, match="test session is closed"):
        await life.admit()
    with pytest.raises(SessionClosedError):
        await life.start()
    await life.close()  # idempotent: the backend is stopped once
    assert host.calls == ["start", "stop"]


async def test_a_failed_start_is_undone_and_may_be_retried() -> None:
    host = Host(fail_start=ConnectionLostError("no sandbox"))
    with pytest.raises(ConnectionLostError, match="no sandbox"):
        await host.lifecycle.start()
    assert host.lifecycle.state is SessionState.NEW
    assert host.calls == ["start", "stop"]  # what it half made is stopped
    assert host._core.owned.start_task is None
    host.fail_start = None
    await host.lifecycle.start()
    assert host.lifecycle.state is SessionState.RUNNING
    await host.lifecycle.close()


async def test_a_second_start_while_starting_is_refused() -> None:
    host = Host(park_start=True)
    first = asyncio.ensure_future(host.lifecycle.start())
    await host.start_entered.wait()
    assert host.lifecycle.state is SessionState.STARTING
    with pytest.raises(SessionStateError, match="already in progress"):
        await host.lifecycle.start()
    host.start_go.set()
    await first
    assert host.lifecycle.state is SessionState.RUNNING
    await host.lifecycle.close()


async def test_a_close_during_the_start_cancels_it_and_the_starter_loses() -> None:
    host = Host(park_start=True)
    starter = asyncio.ensure_future(host.lifecycle.start())
    await host.start_entered.wait()
    await host.lifecycle.close()
    with pytest.raises(SessionClosedError):
        await starter
    # The cancelled start stopped what it made; the close did not stop it again.
    assert host.calls == ["start", "stop"]
    assert host.lifecycle.state is SessionState.CLOSED


async def test_the_close_tears_every_process_down_before_the_backend_stops() -> None:
    host = Host()
    await host.lifecycle.start()
    first, second = await host.admitted(), await host.admitted()
    await host.lifecycle.close()
    assert sorted(host.calls[1:3]) == sorted(
        [f"terminate {first.process_id}", f"terminate {second.process_id}"]
    )
    assert host.calls[3:] == ["stop"]
    assert host._core.processes.reserved == set() and len(host._core.processes) == 0


async def test_a_cancelled_closer_leaves_the_close_running_and_a_second_close_awaits_it() -> None:
    host = Host()
    await host.lifecycle.start()
    entry = await host.admitted()
    host.teardown_go.clear()
    closer = asyncio.ensure_future(host.lifecycle.close())
    await host.teardown_entered.wait()
    assert host.lifecycle.state is SessionState.CLOSING
    closer.cancel()
    second = asyncio.ensure_future(host.lifecycle.close())
    await asyncio.sleep(0)
    assert not closer.done() and not second.done()  # both wait for the one close task
    host.teardown_go.set()
    with pytest.raises(asyncio.CancelledError):
        await closer
    await second
    assert host.calls == ["start", f"terminate {entry.process_id}", "stop"]
    assert host.lifecycle.state is SessionState.CLOSED


async def test_run_closing_returns_the_result_and_closes_even_when_the_work_fails() -> None:
    host = Host()
    await host.lifecycle.start()

    async def work() -> str:
        assert host.lifecycle.state is SessionState.CLOSING
        return "done"

    assert await host.lifecycle.run_closing(work()) == "done"
    assert host.lifecycle.state is SessionState.CLOSED

    other = Host()
    await other.lifecycle.start()

    async def broken() -> None:
        raise ConnectionLostError("detach failed")

    with pytest.raises(ConnectionLostError):
        await other.lifecycle.run_closing(broken())
    assert other.lifecycle.state is SessionState.CLOSED


async def test_a_taken_over_session_refuses_every_call() -> None:
    host = Host()
    await host.lifecycle.start()
    host._core.durable.taken_over = True
    with pytest.raises(SessionTakenOverError, match="resumed by another client"):
        host.lifecycle.admit_now()
    with pytest.raises(SessionTakenOverError):
        await host.lifecycle.admit()
    await host.lifecycle.close()  # only lets go: the sandbox is the new owner's
    assert host.calls == ["start", "detach"]


async def test_the_ref_file_follows_changes_only_while_running(tmp_path: Path) -> None:
    host = Host()
    ref_path = tmp_path / "ref.json"
    host._core.durable = DurableState(ref_path)
    host.lifecycle.changed()
    assert not ref_path.exists()  # not started: nothing to write yet
    await host.lifecycle.start()
    assert json.loads(ref_path.read_text())["processes"] == []
    entry = await host.admitted()  # `OwnedTasks` is not involved: say it changed
    host.lifecycle.changed()
    processes = json.loads(ref_path.read_text())["processes"]
    assert [p["process_id"] for p in processes] == [entry.process_id]
    await host.lifecycle.close()
    assert not ref_path.exists()  # a closed session's ref file is removed


async def test_an_unclosed_session_warns_and_abandons_its_processes() -> None:
    never_started = Host()
    never_started.lifecycle.unclosed()  # nothing to say, nothing to kill
    assert never_started.abandoned == []
    host = Host()
    await host.lifecycle.start()
    entry = await host.admitted()
    with pytest.warns(ResourceWarning, match=r"unclosed test session \(state running\)"):
        host.lifecycle.unclosed()
    assert host.abandoned == [entry.process_id]
    await host.lifecycle.close()
    host.lifecycle.unclosed()  # closed: silent
