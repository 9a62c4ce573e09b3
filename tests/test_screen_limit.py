"""Screens are rendered up to `MAX_SCREEN_CELLS`: past it a clear error, the process and
its output unaffected, and a blank screen again once resized within the bound."""

from __future__ import annotations

from pathlib import Path

import pytest

import sandbox
from sandbox.terminal.screen import TerminalScreen
from sandbox.terminal.screen_limit import MAX_SCREEN_CELLS, ScreenTooLargeError, too_large


def test_the_bound_is_on_cells() -> None:
    assert not too_large(500, 500) and not too_large(250, 1000)
    assert too_large(501, 500) and too_large(1000, 1000)
    assert MAX_SCREEN_CELLS == 250_000


async def test_a_screen_at_the_bound_renders_all_of_it() -> None:
    screen = TerminalScreen(500, 500)
    screen.feed(b"".join(b"%03d" % n + b"x" * 496 + b"\r\n" for n in range(499)) + b"end")
    snap = await screen.render()
    assert (snap.rows, snap.cols) == (500, 500)
    assert snap.lines[0] == "000" + "x" * 496 and snap.lines[-1] == "end"
    assert snap.skipped_bytes == 0


async def test_past_the_bound_it_says_so_and_emulates_nothing() -> None:
    screen = TerminalScreen(1000, 1000)
    assert screen.too_large
    screen.feed(b"x" * 10_000)
    assert screen.pending_bytes == 0 and screen.skipped_bytes == 10_000
    with pytest.raises(ScreenTooLargeError, match=r"1000x1000 = 1,000,000 cells"):
        await screen.render()
    with pytest.raises(sandbox.UnsupportedOperationError, match="resize it smaller"):
        screen.snapshot()


async def test_resized_past_the_bound_and_back_it_starts_blank() -> None:
    screen = TerminalScreen(24, 80)
    screen.feed(b"before\r\n")
    assert (await screen.render()).lines[0] == "before"
    screen.feed(b"queued for the small size")
    screen.resize(800, 800)
    screen.feed(b"printed while huge")
    with pytest.raises(ScreenTooLargeError):
        await screen.render()
    screen.resize(30, 100)
    screen.feed(b"after")
    snap = await screen.render()
    assert (snap.rows, snap.cols) == (30, 100)
    assert snap.lines[0] == "after" and all(not line for line in snap.lines[1:])
    assert snap.skipped_bytes == len(b"queued for the small size") + len(b"printed while huge")


async def test_a_session_on_a_huge_terminal_runs_and_refuses_only_the_screen(
    tmp_path: Path,
) -> None:
    async with sandbox.open_session("unix_local", workdir=tmp_path) as s:
        with pytest.raises(ScreenTooLargeError):
            await s.pty_exec_start("true", tty=True, rows=1000, cols=1000, until_screen="x")
        start = await s.pty_exec_start(
            "echo up; read x; echo got $x; read y; echo done",
            tty=True,
            rows=1000,
            cols=1000,
            until="up",
        )
        pid = start.process_id
        assert pid is not None and "up" in start.output
        with pytest.raises(ScreenTooLargeError, match="1000x1000"):
            await s.pty_screen(pid)
        with pytest.raises(ScreenTooLargeError):
            await s.pty_write_stdin(pid, "lost?\n", until_screen="got")
        # The refused write wrote nothing: the process still waits for its first line.
        reply = await s.pty_write_stdin(pid, "one\n", until="got one")
        assert "got one" in reply.output
        await s.pty_resize(pid, rows=24, cols=80)
        reply = await s.pty_write_stdin(pid, "two\n", until_screen="done", yield_time_s=10)
        assert reply.screen is not None and "done" in reply.screen.text()
        assert (reply.screen.rows, reply.screen.cols) == (24, 80)
