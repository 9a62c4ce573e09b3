"""`sandbox.session.writes.write_within`, alone: a real entry and a terminal of ours.

`Terminal` is the entry's handle, a `Process` over a terminal with `room` bytes free:
`try_write` takes what fits at once, `write` (what the `_write_stdin` hook calls) takes
more as `drain()` frees room (counting it with `entry.count_input`), and it can be
made to fail.
"""

from __future__ import annotations

import asyncio

import pytest

from sandbox import arguments
from sandbox.errors import ConnectionLostError
from sandbox.process_entry import ProcessSpec, PtyEntry
from sandbox.process_handle import Process
from sandbox.session.writes import EntryRemoved, write_within

LONG = 3600.0


def _entry() -> PtyEntry:
    command = arguments.build_command(("cat",), shell=True, env=None, cwd=None)
    return PtyEntry(1001, ProcessSpec(command=command, tty=True, rows=24, cols=80))


class Terminal(Process):
    def __init__(self, entry: PtyEntry, room: int, *, fail: BaseException | None = None) -> None:
        self.entry = entry
        self.room = room
        self.fail = fail
        self.written = b""
        self.waiting = asyncio.Event()
        self.freed = asyncio.Event()
        entry.handle = self

    def try_write(self, data: bytes) -> int:
        taken = data[: self.room]
        self.written += taken
        self.room -= len(taken)
        return len(taken)

    async def write(self, data: bytes) -> None:
        if self.fail is not None:
            raise self.fail
        while data:
            if not self.room:
                self.waiting.set()
                await self.freed.wait()
                self.freed.clear()
            taken = data[: self.room]
            self.written += taken
            self.room -= len(taken)
            self.entry.count_input(len(taken))
            data = data[len(taken) :]

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """Nothing runs behind it."""

    def drain(self, n: int) -> None:
        self.room += n
        self.freed.set()


async def _write_stdin(entry: PtyEntry, data: bytes) -> None:
    """The base session's default `_write_stdin`: the handle's `write`."""
    await entry.require_handle().write(data)


async def _write(terminal: Terminal, entry: PtyEntry, data: bytes, within: float) -> int:
    end = asyncio.get_running_loop().time() + within
    return await write_within(entry, data, end, write=_write_stdin)


async def test_what_fits_goes_at_once_without_a_task() -> None:
    entry = _entry()
    terminal = Terminal(entry, room=100)
    assert await _write(terminal, entry, b"hello", LONG) == 0
    assert terminal.written == b"hello" and entry.write_task is None


async def test_the_rest_goes_through_the_write_task_within_the_window() -> None:
    entry = _entry()
    terminal = Terminal(entry, room=3)
    writing = asyncio.ensure_future(_write(terminal, entry, b"abcdefgh", LONG))
    await terminal.waiting.wait()
    assert entry.write_task is not None  # a terminate or an interrupt can end it
    terminal.drain(10)
    assert await writing == 0
    assert terminal.written == b"abcdefgh" and entry.write_task is None


async def test_the_windows_end_cancels_the_write_and_counts_what_was_not_taken() -> None:
    entry = _entry()
    terminal = Terminal(entry, room=3)
    # The window is already over: the fast path's 3 bytes and nothing else.
    assert await _write(terminal, entry, b"abcdefgh", 0.0) == 5
    assert terminal.written == b"abc" and entry.write_task is None


async def test_a_write_ended_part_way_reports_the_bytes_it_did_not_write() -> None:
    entry = _entry()
    terminal = Terminal(entry, room=2)
    writing = asyncio.ensure_future(_write(terminal, entry, b"0123456789", LONG))
    await terminal.waiting.wait()
    terminal.waiting.clear()
    terminal.drain(3)  # 3 more taken, then it waits again
    await terminal.waiting.wait()
    assert entry.write_task is not None
    entry.write_task.cancel()  # what an interrupt or a terminate does
    assert await writing == 5
    assert terminal.written == b"01234"


async def test_a_failed_write_raises_its_error_or_entry_removed_once_removed() -> None:
    lost = ConnectionLostError("socket closed")
    entry = _entry()
    terminal = Terminal(entry, room=0, fail=lost)
    with pytest.raises(ConnectionLostError) as caught:
        await _write(terminal, entry, b"x", LONG)
    assert caught.value is lost
    entry.removed = True
    with pytest.raises(EntryRemoved) as gone:  # the caller says why (`PtyCalls.gone`)
        await _write(terminal, entry, b"x", LONG)
    assert gone.value.__cause__ is lost


async def test_a_cancelled_caller_ends_the_write_before_leaving() -> None:
    entry = _entry()
    terminal = Terminal(entry, room=0)
    writing = asyncio.ensure_future(_write(terminal, entry, b"stuck", LONG))
    await terminal.waiting.wait()
    task = entry.write_task
    assert task is not None
    writing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writing
    assert task.cancelled() and entry.write_task is None
