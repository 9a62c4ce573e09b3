"""A keystroke never waits behind a poll of the same process, whatever the interleaving.

Each test drives a real unix_local session with a line filter on a PTY (a `cat` that
drops lines of only x's; the terminal does not echo, so each line written comes back
once, from the filter). A write in flight (W1) holds the entry: its process is stopped
(SIGSTOP), so the terminal does not read its input, and W1 writes more than the
terminal has room for: what the handle's `try_write` takes at once is part of it, the
rest goes through the backend's `_write_stdin`, held there by a `HookGate` until the
test releases it and continues the process. Polls have a 30 s window. Nothing reads a
clock: a window that ran to its deadline is counted by `DeadlineCount`, and the order
in which the calls complete says who waited for whom.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from pathlib import Path

import pytest

from sandbox import PtyUpdate
from sandbox.backends.unix_local import UnixLocalSession
from sandbox.process_entry import PtyEntry
from sandbox.testing.faults import Gate
from tests.helpers import DeadlineCount, HookGate, eventually

LONG_POLL_S = 30.0  # the longest window a poll may ask for
SHORTEST_POLL_S = 5.0  # the shortest (a poll's window is clamped to [5 s, 30 s])
WRITE_WINDOW_S = 20.0  # ended by `until` long before
# Lines the filter drops, ahead of W1's own: many times what a terminal whose reader
# stopped takes at once (about 14 KiB on Linux: the line discipline's and the flip
# buffers), so the write cannot finish without its process reading.
FILLER = ("x" * 79 + "\n") * 4096


def queued(entry: PtyEntry) -> int:
    """How many calls wait for the entry's call lock. asyncio.Lock keeps its queue in
    `_waiters` (futures; None before the first wait): no public name says it."""
    waiters = entry.call_lock._waiters or ()
    return sum(1 for waiter in waiters if not waiter.done())


def queued_is(entry: PtyEntry, count: int) -> bool:
    return queued(entry) == count


async def start_cat(s: UnixLocalSession) -> tuple[int, PtyEntry]:
    update = await s.pty_exec_start(
        "stty -echo; echo r; exec grep --line-buffered -vx 'x*'", tty=True, until="r"
    )
    assert update.process_id is not None
    return update.process_id, s._core.processes.lookup(update.process_id)


def write(
    s: UnixLocalSession, pid: int, line: str, *, filler: str = ""
) -> asyncio.Future[PtyUpdate]:
    """A write of `line` (after `filler`) whose window ends when the filter has written
    it back."""
    return asyncio.ensure_future(
        s.pty_write_stdin(
            pid, filler + line + "\n", until=f"{line}\r\n", yield_time_s=WRITE_WINDOW_S
        )
    )


async def write_in_flight(
    s: UnixLocalSession, pid: int, entry: PtyEntry, line: str
) -> tuple[asyncio.Future[PtyUpdate], Gate]:
    """W1: a write of `line` behind `FILLER` to a process that does not read, held in
    `_write_stdin` (the terminal took part of it at once): release the gate, then
    `resume` the process."""
    os.kill(entry.require_handle().pid, signal.SIGSTOP)
    gate = HookGate(s, "_write_stdin")
    w1 = write(s, pid, line, filler=FILLER)
    await gate.reached.wait()
    assert 0 < entry.input_accepted < len(FILLER), "the terminal took only part of it"
    return w1, gate


def resume(entry: PtyEntry) -> None:
    """The process reads its input again."""
    os.kill(entry.require_handle().pid, signal.SIGCONT)


def poll(s: UnixLocalSession, pid: int) -> asyncio.Future[PtyUpdate]:
    return asyncio.ensure_future(s.pty_write_stdin(pid, "", yield_time_s=LONG_POLL_S))


# The calls in the order they reach the entry. "W1": a write held in flight (it holds
# the entry); "P": a poll; a first "P" holds the entry in its window, a later one is
# queued for it; "W2": the write that must not wait behind any poll.
ORDERS = [
    "W1 P W2",  # the reported case: W2 queued behind a poll queued behind a write
    "W1 P P W2",  # two polls queued ahead of the write
    "W1 W2 P",  # the poll queued behind the write
    "P W2",  # a poll in its window, then the write
    "P P W2",  # a poll in its window and one queued, then the write
]


@pytest.mark.parametrize("order", ORDERS)
async def test_a_write_never_waits_behind_a_poll(tmp_path: Path, order: str) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        pid, entry = await start_cat(s)
        deadlines = DeadlineCount(s)
        first, *rest = order.split()
        gate = None
        calls: dict[str, asyncio.Future[PtyUpdate]] = {}
        polls: list[asyncio.Future[PtyUpdate]] = []
        if first == "W1":
            w1, gate = await write_in_flight(s, pid, entry, "one")  # W1 holds the entry
            calls["W1"] = w1
        else:
            polls.append(poll(s, pid))
            assert await eventually(entry.call_lock.locked)  # the poll is in its window
        polls_ahead = 0  # polls queued before W2
        for i, name in enumerate(rest):
            if name == "P":
                polls.append(poll(s, pid))
                polls_ahead += "W2" not in rest[:i]
            else:
                calls["W2"] = write(s, pid, "two")
            if gate is not None:  # each call is queued behind W1 before the next comes
                assert await eventually(functools.partial(queued_is, entry, i + 1))
        if gate is not None:
            gate.release()
            resume(entry)
        w2 = await calls["W2"]
        assert "two\r\n" in w2.output
        if gate is not None:
            assert "one\r\n" in (await w1).output
        # Every poll that held the entry or was queued ahead of W2 had already returned
        # when W2 did (each ended at once, with W2 waiting); none ran to its deadline.
        ahead = polls[: polls_ahead + (first == "P")]
        assert all(p.done() for p in ahead), "W2 waited for a poll's window"
        assert deadlines.count == 0, "a window ran to its deadline: W2 waited for it"
        behind = polls[len(ahead) :]
        assert not any(p.done() for p in behind), "a poll queued after W2 runs its window"
        if behind:  # a later write ends it
            await write(s, pid, "three")
        for p in polls:
            assert (await p).process_id == pid
        assert deadlines.count == 0
        assert entry.writers_waiting == 0
        deadlines.close()


async def test_a_write_cancelled_while_it_waits_leaves_no_preemption_behind(
    tmp_path: Path,
) -> None:
    async with UnixLocalSession(workdir=tmp_path) as s:
        pid, entry = await start_cat(s)
        w1, gate = await write_in_flight(s, pid, entry, "one")
        w2 = write(s, pid, "two")
        assert await eventually(lambda: queued(entry) == 1)
        assert entry.writers_waiting == 1
        w2.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w2
        assert entry.writers_waiting == 0
        gate.release()
        resume(entry)
        assert "one\r\n" in (await w1).output
        # Nothing waits now: a poll runs its whole (shortest) window, to its deadline.
        deadlines = DeadlineCount(s)
        update = await s.pty_write_stdin(pid, "", yield_time_s=SHORTEST_POLL_S)
        assert update.process_id == pid and "two" not in update.output
        assert deadlines.count == 1
        deadlines.close()
