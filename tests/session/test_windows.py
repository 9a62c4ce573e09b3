"""`sandbox.session.windows`: one collection window over a real `PtyEntry`, no session.

The entry is fed the way a backend's reader feeds it; `final_drain` is a plain
function of ours standing in for the backend hook (it records its calls).
"""

from __future__ import annotations

import asyncio
import re

import pytest

from sandbox import arguments
from sandbox.errors import InvalidArgumentError
from sandbox.process_entry import ProcessSpec, PtyEntry
from sandbox.session.windows import (
    check_until_screen,
    collect_window,
    render_by,
    screen_matches,
)

LONG = 3600.0  # a window that only an event can end (pytest's timeout catches a hang)


def _entry(*, tty: bool = False, screen: bool = False, rows: int = 5, cols: int = 20) -> PtyEntry:
    command = arguments.build_command(("true",), shell=True, env=None, cwd=None)
    spec = ProcessSpec(command=command, tty=tty, rows=rows, cols=cols, screen=screen)
    return PtyEntry(1234, spec)


class Drains:
    """A final drain that feeds `late` into the entry, as a transport's last bytes."""

    def __init__(self, late: bytes = b"") -> None:
        self.calls = 0
        self.late = late

    async def __call__(self, entry: PtyEntry) -> None:
        self.calls += 1
        entry.feed(self.late)


async def test_until_ends_the_window_on_output_already_there() -> None:
    entry = _entry()
    entry.feed(b"booting\nREADY\nmore")
    drain = Drains()
    update, finished = await collect_window(entry, LONG, "READY", None, final_drain=drain)
    assert not finished
    assert update.process_id == 1234
    assert update.output == "booting\nREADY\nmore"
    assert update.exit_code is None
    assert drain.calls == 0  # ended by the match, not the deadline


async def test_until_matches_output_that_arrives_while_waiting() -> None:
    entry = _entry()
    drain = Drains()
    window = asyncio.ensure_future(
        collect_window(entry, LONG, re.compile(r"port \d+"), None, final_drain=drain)
    )
    entry.feed(b"listening on ")
    await asyncio.sleep(0)
    assert not window.done()  # no match yet: the window goes on
    entry.feed(b"port 8080\n")
    update, finished = await window
    assert (update.output, finished) == ("listening on port 8080\n", False)


async def test_until_never_takes_dropped_output_for_a_window_start() -> None:
    # 16 bytes kept (8 head, 8 tail): "\A" and "^" may match the window's first byte,
    # never the text after the bytes the bound dropped, though it shows after a line.
    entry = PtyEntry(1234, _entry().spec, output_limit=16)
    entry.feed(b"x" * 8 + b"y" * 40 + b"tail1234")  # the tail kept starts at "tail"
    drain = Drains()
    window = asyncio.ensure_future(
        collect_window(entry, LONG, re.compile(r"(?m)\Atail|^tail|^DONE"), None, final_drain=drain)
    )
    await asyncio.sleep(0)
    assert not window.done()  # "tail" after the gap is no start: the window goes on
    entry.feed(b"\nDONE")  # a real line start ends the window
    update, _ = await window
    assert update.output.startswith("x" * 8 + "\n[... ")
    assert update.output.endswith("\nDONE")


async def test_until_is_not_joined_across_output_dropped_between_two_looks() -> None:
    # The window saw "rea"; then more arrived at once than the tail keeps, so what it
    # sees next ("dy...") does not follow "rea": "ready" was never printed.
    entry = PtyEntry(1234, _entry().spec, output_limit=16)  # 8 of head, 8 of tail
    entry.feed(b"x" * 8 + b"rea")
    window = asyncio.ensure_future(collect_window(entry, LONG, "ready", None, final_drain=Drains()))
    await asyncio.sleep(0)
    assert not window.done()
    entry.feed(b"Z" * 20 + b"dy123456")  # the tail keeps "dy123456" only
    await asyncio.sleep(0)
    assert not window.done(), "matched text that was never printed"
    entry.feed(b"ready")
    update, _ = await window
    assert update.output.endswith("ready")


async def test_the_deadline_drains_once_and_keeps_what_the_drain_brought() -> None:
    entry = _entry()
    entry.feed(b"early ")
    drain = Drains(late=b"late")
    update, finished = await collect_window(entry, 0.0, None, None, final_drain=drain)
    assert drain.calls == 1
    assert update.output == "early late"
    assert not finished and update.process_id == 1234
    # The output was drained: the next window starts empty.
    again, _ = await collect_window(entry, 0.0, None, None, final_drain=Drains())
    assert again.output == ""


async def test_an_exit_with_eof_finishes_the_entry() -> None:
    entry = _entry()
    entry.feed(b"bye\n")
    entry.report_exit(3)
    entry.report_eof()
    drain = Drains()
    update, finished = await collect_window(entry, LONG, None, None, final_drain=drain)
    assert finished
    assert update.process_id is None
    assert (update.output, update.exit_code) == ("bye\n", 3)
    assert drain.calls == 0


async def test_an_exit_reported_while_waiting_ends_the_window() -> None:
    entry = _entry()
    window = asyncio.ensure_future(collect_window(entry, LONG, None, None, final_drain=Drains()))
    await asyncio.sleep(0)
    entry.feed(b"x")
    entry.report_exit(0)
    entry.report_eof()
    update, finished = await window
    assert finished and update.exit_code == 0 and update.output == "x"


async def _write_turn(entry: PtyEntry) -> None:
    async with entry.call_turn(write=True):
        pass


async def test_a_poll_ends_at_once_while_a_write_waits_for_the_entry() -> None:
    entry = _entry(tty=True)
    entry.feed(b"partial")
    drain = Drains()
    await entry.call_lock.acquire()  # an earlier call holds the entry: the write waits
    write = asyncio.ensure_future(_write_turn(entry))
    await asyncio.sleep(0)
    assert entry.writers_waiting == 1
    # A poll whose window begins while the write waits (it took the lock first).
    update, finished = await collect_window(entry, LONG, None, None, final_drain=drain, poll=True)
    assert (update.output, finished, drain.calls) == ("partial", False, 0)
    entry.call_lock.release()
    await write
    assert entry.writers_waiting == 0 and not entry.call_lock.locked()


async def test_a_write_that_starts_waiting_wakes_a_poll_in_progress() -> None:
    entry = _entry(tty=True)
    drain = Drains()
    await entry.call_lock.acquire()  # the poll's call holds the entry
    poll = asyncio.ensure_future(
        collect_window(entry, LONG, None, None, final_drain=drain, poll=True)
    )
    await asyncio.sleep(0)
    assert not poll.done()
    write = asyncio.ensure_future(_write_turn(entry))
    update, finished = await poll
    assert (update.output, finished, drain.calls) == ("", False, 0)
    entry.call_lock.release()
    await write
    assert entry.writers_waiting == 0


async def test_a_waiting_write_does_not_end_a_write_window() -> None:
    entry = _entry(tty=True)
    entry.writers_waiting = 1  # another write queued behind this one
    window = asyncio.ensure_future(collect_window(entry, LONG, "done", None, final_drain=Drains()))
    await asyncio.sleep(0)
    assert not window.done()
    entry.feed(b"done")
    update, _ = await window
    assert update.output == "done"


async def test_a_poll_runs_its_window_once_no_write_waits() -> None:
    entry = _entry(tty=True)
    drain = Drains()
    await collect_window(entry, 0.0, None, None, final_drain=drain, poll=True)
    assert drain.calls == 1  # its deadline, not a preemption, ended it


async def test_max_tokens_truncates_and_reports_the_original_count() -> None:
    entry = _entry()
    entry.feed(("word " * 400).encode())
    update, _ = await collect_window(entry, 0.0, None, 10, final_drain=Drains())
    assert update.original_token_count is not None and update.original_token_count > 10
    assert len(update.output) < len("word " * 400)
    full, _ = await collect_window(entry, 0.0, None, None, final_drain=Drains())
    assert full.original_token_count is None


async def test_until_screen_matches_the_rendered_screen_not_the_raw_bytes() -> None:
    entry = _entry(tty=True, screen=True)
    # "abc" is overwritten on the screen: only the rendered text says "xyz".
    entry.feed(b"abc\rxyz")
    drain = Drains(late=b"\r\nprompt$ ")
    missed, _ = await collect_window(entry, 0.0, None, None, final_drain=drain, until_screen="abc")
    assert drain.calls == 1  # no match: the deadline ended it, the bytes said "abc"
    assert missed.screen is not None and missed.screen.text().splitlines()[:2] == ["xyz", "prompt$"]
    entry.feed(b"\r\nagain")
    update, finished = await collect_window(
        entry, LONG, None, None, final_drain=drain, until_screen="prompt$"
    )
    assert not finished
    assert update.screen is not None
    assert update.screen.text().splitlines()[:3] == ["xyz", "prompt$", "again"]
    assert drain.calls == 1  # the match ended this one


async def test_an_until_screen_window_without_output_does_not_check_the_old_screen() -> None:
    # A write window waits for output it returns; a poll checks the screen at once.
    entry = _entry(tty=True, screen=True)
    entry.feed(b"ready>")
    await collect_window(entry, 0.0, None, None, final_drain=Drains())  # drained
    polled, _ = await collect_window(
        entry, LONG, None, None, final_drain=Drains(), poll=True, until_screen="ready>"
    )
    assert polled.screen is not None and "ready>" in polled.screen.text()


async def test_render_by_is_none_without_a_screen_and_a_snapshot_with_one() -> None:
    assert (
        await render_by(_entry(tty=True, screen=False), asyncio.get_running_loop().time()) is None
    )
    entry = _entry(tty=True, screen=True, rows=3, cols=10)
    entry.feed(b"hi")
    snapshot = await render_by(entry, asyncio.get_running_loop().time() + LONG)
    assert snapshot is not None and snapshot.text().startswith("hi")


async def test_screen_matches_substrings_and_regexes() -> None:
    entry = _entry(tty=True, screen=True, rows=3, cols=20)
    entry.feed(b"count: 42")
    snapshot = await render_by(entry, asyncio.get_running_loop().time() + LONG)
    assert snapshot is not None
    assert screen_matches("count: 42", snapshot)
    assert not screen_matches("count: 43", snapshot)
    assert screen_matches(re.compile(r"count: \d+"), snapshot)
    assert not screen_matches(re.compile(r"^42"), snapshot)


def test_check_until_screen_needs_a_screen() -> None:
    assert check_until_screen(None, False) is None
    assert check_until_screen("x", True) == "x"
    with pytest.raises(InvalidArgumentError, match="needs a rendered screen"):
        check_until_screen("x", False)
    with pytest.raises(InvalidArgumentError):
        check_until_screen(42, True)
