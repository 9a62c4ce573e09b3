"""Screens and recordings through the session API (unix_local, real programs on PTYs).

`pty_screen()` renders what a tty process printed; `until_screen` ends a window when a
pattern shows on that screen; `record=` / `record_dir=` write asciicast v2 files that
asciinema's own parser reads, also after a kill or a cancelled close.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox import BaseSandboxSession
from tests.helpers import DeadlineCount, eventually
from tests.terminal.test_recording import assert_times_monotonic, read_cast
from tests.test_screen import need

PROMPT = "prompt$ "
# Long windows that only `until`/`until_screen` end early; a test fails if one runs out.
LONG = 20.0


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[BaseSandboxSession]:
    """A started unix_local session, closed after the test."""
    async with sandbox.open_session(
        "unix_local", workdir=tmp_path / "ws", terminate_grace_s=0.5
    ) as s:
        yield s


async def start_bash(session: BaseSandboxSession, **options: Any) -> int:
    """An interactive bash with a known prompt, started once the prompt shows."""
    update = await session.pty_exec_start(
        "exec bash --norc --noprofile -i",
        tty=True,
        env={"PS1": PROMPT, "LESSHISTFILE": "-"},
        until_screen=PROMPT.strip(),
        yield_time_s=LONG,
        **options,
    )
    assert update.process_id is not None
    assert update.screen is not None and update.screen.lines[0] == PROMPT.strip()
    return update.process_id


def entry_handles(session: BaseSandboxSession, process_id: int) -> list[asyncio.Handle]:
    """Live (not cancelled) loop callbacks bound to the process's entry."""
    loop = asyncio.get_running_loop()
    # asyncio's own queues: ready callbacks, and timers.
    queued = [*getattr(loop, "_ready", ()), *getattr(loop, "_scheduled", ())]
    return [
        h
        for h in queued
        if not h.cancelled()
        and getattr(h._callback, "__self__", None) is not None
        and getattr(h._callback.__self__, "process_id", None) == process_id
    ]


async def test_less_pages_with_until_screen_and_gives_the_shell_back(
    session: BaseSandboxSession,
) -> None:
    need("less")
    await session.write_file("f.txt", "".join(f"line {i:03d}\n" for i in range(200)))
    pid = await start_bash(session)
    update = await session.pty_write_stdin(
        pid, "less f.txt\r", until_screen=re.compile(r"^f\.txt", re.M), yield_time_s=LONG
    )
    assert update.screen is not None and update.screen.alternate_screen
    deadlines = DeadlineCount(session)
    update = await session.pty_write_stdin(pid, " ", until_screen="line 045", yield_time_s=LONG)
    assert deadlines.count == 0, "until_screen must end the window early"
    deadlines.close()
    snap = update.screen
    assert snap is not None and snap.alternate_screen
    assert snap.lines[:23] == tuple(f"line {i:03d}" for i in range(23, 46))
    assert await session.pty_screen(pid) == snap  # nothing new arrived since
    update = await session.pty_write_stdin(
        pid, "q", until_screen=re.compile(r"less f\.txt\nprompt\$"), yield_time_s=LONG
    )
    snap = await session.pty_screen(pid)
    assert not snap.alternate_screen
    assert snap.lines[:2] == ("prompt$ less f.txt", "prompt$")
    assert (snap.cursor_row, snap.cursor_col) == (1, len(PROMPT))


async def test_vim_insert_mode_and_cursor(session: BaseSandboxSession) -> None:
    vim = need("vim.tiny", "vi")
    update = await session.pty_exec_start(
        f"exec {vim} -u NONE -i NONE -n -N -c 'set showmode' new.txt",
        tty=True,
        until_screen="new.txt",
        yield_time_s=LONG,
    )
    pid = update.process_id
    assert pid is not None
    update = await session.pty_write_stdin(pid, "i", until_screen="-- INSERT --", yield_time_s=LONG)
    assert update.screen is not None and update.screen.lines[-1].startswith("-- INSERT --")
    update = await session.pty_write_stdin(
        pid, "hello 漢字\rworld", until_screen="\nworld", yield_time_s=LONG
    )
    snap = update.screen
    assert snap is not None and snap.alternate_screen
    assert snap.lines[:3] == ("hello 漢字", "world", "~")
    assert (snap.cursor_row, snap.cursor_col) == (1, 5)
    # vim hides the cursor while it redraws: the marker shows once it is back (a window
    # may end mid-redraw, after "world" and before the cursor's return).
    for _ in range(500):
        if snap.cursor_visible:
            break
        await asyncio.sleep(0.01)
        snap = await session.pty_screen(pid)
    assert snap.text("█").splitlines()[1] == "world█"
    update = await session.pty_write_stdin(pid, "\x1b:q!\r", yield_time_s=LONG)
    if update.exit_code is None:
        update = await session.pty_write_stdin(pid, "", yield_time_s=LONG)
    assert update.exit_code == 0 and update.process_id is None


async def test_resize_then_the_screen_follows(session: BaseSandboxSession) -> None:
    pid = await start_bash(session)
    await session.pty_resize(pid, rows=30, cols=100)
    snap = await session.pty_screen(pid)
    assert (snap.rows, snap.cols) == (30, 100)
    update = await session.pty_write_stdin(
        pid, "stty size\r", until_screen=re.compile(r"\n30 100\nprompt\$"), yield_time_s=LONG
    )
    assert update.screen is not None
    assert update.screen.lines[:3] == ("prompt$ stty size", "30 100", "prompt$")


async def test_terminal_sizes_are_bounded_on_start_and_resize(
    session: BaseSandboxSession,
) -> None:
    pid = await start_bash(session)
    for rows, cols in ((1001, 80), (24, 1001), (10_000, 10_000)):
        with pytest.raises(sandbox.InvalidArgumentError, match="between 1 and 1000"):
            await session.pty_resize(pid, rows=rows, cols=cols)
        with pytest.raises(sandbox.InvalidArgumentError, match="between 1 and 1000"):
            await session.pty_exec_start("true", tty=True, rows=rows, cols=cols)
    await session.pty_resize(pid, rows=1000, cols=1000)  # the largest accepted
    update = await session.pty_write_stdin(pid, "stty size\r", until="1000 1000", yield_time_s=LONG)
    assert "1000 1000" in update.output
    with pytest.raises(sandbox.UnsupportedOperationError, match="1,000,000 cells"):
        await session.pty_screen(pid)  # past the cells a screen is rendered for
    await session.pty_resize(pid, rows=500, cols=500)  # the largest rendered
    update = await session.pty_write_stdin(
        pid, "stty size\r", until_screen="500 500", yield_time_s=LONG
    )
    assert update.screen is not None and (update.screen.rows, update.screen.cols) == (500, 500)
    assert len(session.pty_processes()) == 1


async def test_a_flood_is_not_emulated_until_the_screen_is_asked_for(
    session: BaseSandboxSession,
) -> None:
    last = 1_000_000
    update = await session.pty_exec_start(
        f"seq 1 {last}; echo done; exec sleep 600", tty=True, until="done", yield_time_s=LONG
    )
    assert update.process_id is not None and "done" in update.output
    screen = session._core.processes.lookup(update.process_id).screen
    assert screen is not None
    # Nothing was emulated while the output streamed: the screen is as it started.
    assert screen.snapshot().lines == ("",) * 24
    snap = await session.pty_screen(update.process_id)
    assert snap.lines == (*(str(n) for n in range(last - 21, last + 1)), "done", "")
    assert (snap.cursor_row, snap.cursor_col, snap.pending_bytes) == (23, 0, 0)
    # Rebuilt from the last screenful of lines: the rest of the flood was skipped.
    fed = len("".join(f"{n}\r\n" for n in range(1, last + 1))) + len("done\r\n")
    assert snap.skipped_bytes >= fed - 1024


async def test_ctrl_c_shows_on_the_screen_and_the_prompt_returns(
    session: BaseSandboxSession,
) -> None:
    pid = await start_bash(session)
    # The child prints, so when that shows it is the foreground job and ^C reaches it.
    command = "sh -c 'echo started; exec sleep 600'"
    await session.pty_write_stdin(pid, command + "\r", until_screen="\nstarted", yield_time_s=LONG)
    await session.pty_interrupt(pid)
    deadlines = DeadlineCount(session)
    update = await session.pty_write_stdin(
        pid, "", until_screen=re.compile(r"\^C\nprompt\$"), yield_time_s=LONG
    )
    assert deadlines.count == 0, "until_screen must end the window early"
    deadlines.close()
    assert update.screen is not None
    assert update.screen.lines[:4] == ("prompt$ " + command, "started", "^C", "prompt$")


async def test_a_write_preempts_a_poll_waiting_on_the_screen(
    session: BaseSandboxSession,
) -> None:
    update = await session.pty_exec_start("echo r; exec cat", tty=True, until="r")
    pid = update.process_id
    assert pid is not None
    deadlines = DeadlineCount(session)
    poll = asyncio.ensure_future(
        session.pty_write_stdin(pid, "", until_screen="never shown", yield_time_s=LONG)
    )
    assert await eventually(lambda: session._core.processes.lookup(pid).call_lock.locked())
    write = await session.pty_write_stdin(
        pid, "hi\n", until_screen=re.compile(r"hi\nhi"), yield_time_s=LONG
    )
    assert (await poll).process_id == pid
    assert deadlines.count == 0, "the write must end the poll, and until_screen the write"
    deadlines.close()
    assert write.screen is not None and write.screen.lines[:3] == ("r", "hi", "hi")


async def test_pipes_and_screen_false_have_no_screen(session: BaseSandboxSession) -> None:
    pipe = await session.pty_exec_start("echo r; exec sleep 600", until="r")
    plain = await session.pty_exec_start(
        "echo r; exec sleep 600", tty=True, screen=False, until="r"
    )
    assert pipe.process_id is not None and plain.process_id is not None
    for pid in (pipe.process_id, plain.process_id):
        with pytest.raises(sandbox.InvalidArgumentError):
            await session.pty_screen(pid)
        with pytest.raises(sandbox.InvalidArgumentError):
            await session.pty_write_stdin(pid, "", until_screen="x")
        assert session._core.processes.lookup(pid).screen is None
    with pytest.raises(sandbox.InvalidArgumentError):
        await session.pty_exec_start("true", until_screen="x")
    with pytest.raises(sandbox.PtyProcessNotFoundError):
        await session.pty_screen(99)
    infos = {i.process_id: i.has_screen for i in session.pty_processes()}
    assert infos == {pipe.process_id: False, plain.process_id: False}


async def test_recording_of_a_killed_process_and_nothing_left_on_the_loop(
    session: BaseSandboxSession, tmp_path: Path
) -> None:
    path = tmp_path / "killed.cast"
    pid = await start_bash(session, record=path, record_input=True)
    await session.pty_write_stdin(pid, "echo hi\r", until_screen="\nhi\n", yield_time_s=LONG)
    await session.pty_resize(pid, rows=30, cols=100)
    # A flood is under way when the terminate comes.
    await session.pty_write_stdin(pid, "yes\r", until="y\r\ny", yield_time_s=LONG)
    entry = session._core.processes.lookup(pid)
    await session.pty_terminate(pid)
    assert entry_handles(session, pid) == []
    assert entry.recorder is not None and entry.recorder.closed
    header, events = read_cast(path)
    assert (header["width"], header["height"]) == (80, 24)
    assert header["command"] == "exec bash --norc --noprofile -i"
    assert_times_monotonic(events)
    assert [e[2] for e in events if e[1] == "r"] == ["100x30"]
    assert [e[2] for e in events if e[1] == "i"] == ["echo hi\r", "yes\r"]
    output = "".join(e[2] for e in events if e[1] == "o")
    assert "prompt$ echo hi\r\n" in output and "hi\r\n" in output and "y\r\ny\r\n" in output


async def test_recording_survives_a_cancelled_close(tmp_path: Path) -> None:
    record_dir = tmp_path / "casts"
    record_dir.mkdir()
    session = sandbox.open_session(
        "unix_local", workdir=tmp_path / "ws", terminate_grace_s=0.5, record_dir=record_dir
    )
    await session.start()
    pid = await start_bash(session)
    await session.pty_write_stdin(pid, "echo hi\r", until_screen="\nhi\n", yield_time_s=LONG)
    await session.pty_resize(pid, rows=30, cols=100)
    entry = session._core.processes.lookup(pid)
    closing = asyncio.ensure_future(session.aclose())
    await asyncio.sleep(0)  # the close is under way: now its caller is cancelled
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert session.state is sandbox.SessionState.CLOSED
    assert entry.recorder is not None and entry.recorder.closed
    assert entry_handles(session, pid) == []
    header, events = read_cast(record_dir / f"{pid}.cast")
    assert (header["width"], header["height"]) == (80, 24)
    assert [e[2] for e in events if e[1] == "r"] == ["100x30"]
    assert not [e for e in events if e[1] == "i"]  # record_input defaults to False
    output = "".join(e[2] for e in events if e[1] == "o")
    assert "prompt$ echo hi\r\n" in output and "\rhi\r\n" in output


async def test_a_bad_record_path_fails_the_start_cleanly(
    session: BaseSandboxSession, tmp_path: Path
) -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="cannot record"):
        await session.pty_exec_start("true", tty=True, record=tmp_path / "missing" / "x.cast")
    assert session.pty_processes() == []
