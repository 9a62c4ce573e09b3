"""`sandbox.terminal.screen`: rendered terminal screens, from raw bytes and from real programs."""

from __future__ import annotations

import asyncio
import functools
import gc
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.terminal.screen import ScreenSnapshot, TerminalScreen
from sandbox.testing import procfs
from tests.conftest import skip_or_fail
from tests.pty_harness import CURSES_PROGRAM, PtyProgram

# ---- bytes in, screen out -----------------------------------------------------------


def drain(screen: TerminalScreen) -> ScreenSnapshot:
    """Process everything queued; the snapshot after it."""
    while not screen.process():
        pass
    return screen.snapshot()


def render(data: bytes, rows: int = 5, cols: int = 20) -> ScreenSnapshot:
    screen = TerminalScreen(rows, cols)
    screen.feed(data)
    return drain(screen)


SAMPLE = (
    "plain ascii\r\n"
    "héllo wörld 漢字テスト 🙂 ok\r\n"
    "\x1b]2;the title\x07"
    "\x1b[31;1mred bold\x1b[0m\x1b[3;12Hmoved"
    "\x1b[4;1Hcombining e\u0301 zwj a\u200db vs ❤\ufe0f!"
    "\x1b[5;1H\x1b[?25l\x1bPzz\x1b\\after dcs"
).encode()


def test_any_split_of_the_bytes_renders_the_same() -> None:
    whole = render(SAMPLE, rows=6, cols=40)
    assert whole.lines == (
        "plain ascii",
        "héllo wörld 漢字テスト 🙂 ok",
        "red bold   moved",
        "combining é zwj a\u200db vs ❤\ufe0f!",
        "after dcs",
        "",
    )
    assert (whole.cursor_row, whole.cursor_col, whole.cursor_visible) == (4, 9, False)
    assert whole.title == "the title"
    assert (whole.skipped_bytes, whole.pending_bytes) == (0, 0)
    rng = random.Random(1)
    splits = [[size] * (len(SAMPLE) // size + 1) for size in (1, 2, 3, 5, 7)]
    splits += [[rng.randint(1, 12) for _ in range(len(SAMPLE))] for _ in range(20)]
    for sizes in splits:
        screen = TerminalScreen(6, 40)
        start = 0
        for size in sizes:
            if start >= len(SAMPLE):
                break
            screen.feed(SAMPLE[start : start + size])
            start += size
            if rng.random() < 0.5:
                screen.process()
        assert drain(screen) == whole, sizes[:10]


def test_wide_characters_take_two_cells() -> None:
    snap = render("漢字🙂x".encode(), rows=3, cols=10)
    assert snap.lines[0] == "漢字🙂x"
    assert (snap.cursor_row, snap.cursor_col) == (0, 7)
    assert snap.text("|") == "漢字🙂x|"
    # No room in the last column: the wide character wraps, as in xterm.
    snap = render("abcdefghi漢".encode(), rows=3, cols=10)
    assert snap.lines[:2] == ("abcdefghi", "漢")
    assert (snap.cursor_row, snap.cursor_col) == (1, 2)
    # Overwriting either half of a wide character blanks the other half.
    assert render("漢字\x1b[1;2Hx".encode()).lines[0] == " x字"
    assert render("漢字\x1b[1;1Hx".encode()).lines[0] == "x 字"
    # The cursor marker goes between characters, counted in cells.
    assert render("漢字\x1b[1;3H".encode()).text("|") == "漢|字"


def test_zero_width_and_control_characters_do_not_swallow_text() -> None:
    # pyte's own draw() stops at any of these and loses the rest of the text.
    snap = render("a\x01b\u200bc\x7fd \u0915\u094d\u0937 ❤\ufe0fe\x90f".encode(), cols=30)
    assert snap.lines[0] == "ab\u200bcd \u0915\u094d\u0937 ❤\ufe0fef"


def test_alternate_screen_restores_the_main_screen() -> None:
    screen = TerminalScreen(5, 20)
    screen.feed(b"shell line 1\r\n$ vim")
    screen.feed(b"\x1b[?1049h")
    snap = drain(screen)
    assert snap.alternate_screen
    assert snap.lines == ("",) * 5  # the alternate screen starts blank
    screen.feed(b"\x1b[H~ editor ~\x1b[3;3H")
    assert drain(screen).lines[0] == "~ editor ~"
    screen.feed(b"\x1b[?1049l")
    snap = drain(screen)
    assert not snap.alternate_screen
    assert snap.lines == ("shell line 1", "$ vim", "", "", "")
    assert (snap.cursor_row, snap.cursor_col) == (1, 5)  # 1049 restores the cursor
    # 47 and 1047 switch screens but leave the cursor where the program put it.
    for mode in (b"47", b"1047"):
        screen.feed(b"\x1b[?" + mode + b"h\x1b[4;1Hfull screen\x1b[?" + mode + b"l")
        snap = drain(screen)
        assert snap.lines == ("shell line 1", "$ vim", "", "", ""), mode
        assert (snap.cursor_row, snap.cursor_col) == (3, 11)
        screen.feed(b"\x1b[2;6H")
    # RIS goes back to the (cleared) main screen.
    screen.feed(b"\x1b[?1049hvisible\x1bc")
    snap = drain(screen)
    assert not snap.alternate_screen
    assert snap.lines == ("",) * 5


def test_title_from_osc_0_and_2() -> None:
    screen = TerminalScreen(3, 20)
    assert screen.snapshot().title is None
    screen.feed(b"\x1b]0;first\x07")
    assert drain(screen).title == "first"
    screen.feed(b"\x1b]2;second \xe6\xbc\xa2\x1b\\\x1b]1;icon only\x07")
    assert drain(screen).title == "second 漢"
    screen.feed(b"\x1bc")  # RIS keeps the title, as in xterm
    assert drain(screen).title == "second 漢"


def test_resize_keeps_the_cursor_row_and_follows_the_output_order() -> None:
    screen = TerminalScreen(5, 20)
    screen.feed(b"one\r\ntwo\r\nthree\r\nfour\r\nfive")
    drain(screen)
    screen.resize(3, 10)  # nothing queued: applies at once
    snap = screen.snapshot()
    assert snap.lines == ("three", "four", "five")  # rows leave at the top for the cursor
    assert (snap.rows, snap.cols, snap.cursor_row, snap.cursor_col) == (3, 10, 2, 4)
    screen.feed(b"\x1b[Htop")
    drain(screen)
    screen.resize(2, 10)
    assert screen.snapshot().lines == ("topee", "four")  # the cursor's row is kept
    # Bytes fed before a resize were written for the old size.
    screen = TerminalScreen(5, 20)
    screen.feed(b"x" * 15)
    screen.resize(3, 10)
    assert screen.snapshot().cols == 20  # queued behind the bytes
    snap = drain(screen)
    assert (snap.rows, snap.cols) == (3, 10)
    assert snap.lines == ("x" * 10, "", "")  # drawn on one 20-column line, then cut
    # A resize while on the alternate screen resizes the main screen too.
    screen = TerminalScreen(4, 20)
    screen.feed(b"a\r\nb\r\nc\r\nlong main line\x1b[?1049hfull screen")
    screen.resize(2, 8)
    screen.feed(b"\x1b[?1049l")
    snap = drain(screen)
    assert snap.lines == ("c", "long mai")
    assert (snap.cursor_row, snap.cursor_col) == (1, 7)


def test_sequences_pyte_cannot_handle_are_dropped_not_drawn() -> None:
    data = (
        b"A\x1b[1;2;3AB"  # more parameters than the handler takes
        b"\x1b[?5;6rC"  # a private flag the handler does not take
        b"\x1b[0%mD\x1b[!pE\x1b[2 qF"  # intermediate bytes
        b"\x1b[>4;2mG\x1b[4:3mH\x1b[<uI\x1b[=5uJ"  # private markers, colon parameters
        b"\x1bP+q436f\x1b\\K"  # DCS (XTGETTCAP)
        b"\x1b_Gf=100;AAAA\x1b\\L"  # APC (an inline image)
        b"\x1bPq#0;2;0;0;0#1!10~-\x1b\\M"  # sixel graphics
        b"\x1b[99999999999999999999999999999999mN"
    )
    snap = render(data, cols=30)
    assert snap.lines[0] == "ABCDEFGHIJKLMN"
    # An unterminated OSC is abandoned after a bounded length; later output shows.
    snap = render(b"\x1b]0;" + b"x" * 10_000 + b"\r\nvisible", rows=3, cols=20)
    assert snap.lines[-1] == "visible"
    assert snap.title is None


def test_sequences_pyte_lacks() -> None:
    assert render(b"=\x1b[4b").lines[0] == "====="  # REP
    snap = render(b"r0\r\nr1\r\nr2\r\nr3\x1b[S", rows=4)  # SU
    assert snap.lines == ("r1", "r2", "r3", "")
    assert (snap.cursor_row, snap.cursor_col) == (3, 2)
    assert render(b"r0\r\nr1\r\nr2\r\nr3\x1b[2T", rows=4).lines == ("", "", "r0", "r1")  # SD
    assert render(b"\x1b[5`X").lines[0] == "    X"  # HPA
    assert render(b"\x1b[2;3H\x1b[s\x1b[HZ\x1b[uY").lines[:2] == ("Z", "  Y")  # SCOSC/SCORC
    assert render(b"\x1b(0lqqk\x1b(Bx").lines[0] == "┌──┐x"  # DEC line drawing
    snap = render(b"kept\x1b[?3h\x1b[?3l")  # DECCOLM: ignored, as xterm does by default
    assert (snap.cols, snap.lines[0]) == (20, "kept")


def test_text_for_a_model() -> None:
    snap = render(b"first\r\n\r\nthird\x1b[2;4H", rows=6)
    assert snap.lines == ("first", "", "third", "", "", "")
    assert snap.text() == "first\n\nthird"  # blank rows at the bottom are left out
    assert snap.text("█") == "first\n   █\nthird"  # padded up to the cursor
    snap = render(b"first\x1b[5;1H", rows=6)
    assert snap.text("█") == "first\n\n\n\n█"
    assert render(b"first\x1b[?25l").text("█") == "first"  # a hidden cursor is not shown


def test_bounded_queue_drops_the_oldest_bytes_and_resynchronises() -> None:
    screen = TerminalScreen(5, 20, max_pending=1024)
    flood = b"\x1b]2;dropped title\x07\x1b[?1049h" + b"\x1b[38;5;196mfiller\r\n" * 500
    screen.feed(flood + b"\x1b[0mlast line")
    snap = screen.snapshot()  # nothing processed yet
    assert snap.pending_bytes <= 1024
    assert snap.skipped_bytes >= len(flood) - 1024
    # Found in the dropped bytes without emulating them.
    assert snap.alternate_screen
    assert snap.title == "dropped title"
    snap = drain(screen)
    assert snap.lines[-1] == "last line"
    # Kept bytes start at a sequence or line start: no tail of a cut sequence is drawn.
    assert set(snap.lines[:-1]) == {"filler"}
    assert screen.skipped_bytes == snap.skipped_bytes
    screen.feed(b"\x1b[?1049l" + b"x" * 5000)
    assert not screen.snapshot().alternate_screen  # a switch back, also in dropped bytes


def _lines(first: int, last: int) -> bytes:
    return b"".join(b"line %d\r\n" % n for n in range(first, last + 1))


def test_an_overflowed_tail_of_lines_is_rebuilt_from_its_last_screenful() -> None:
    screen = TerminalScreen(24, 80)
    screen.feed(b"\x1b[3;5Hstale picture, never scrolled \x1b[?25l")
    assert drain(screen).lines[2] == "    stale picture, never scrolled"
    flood = _lines(1, 200_000)
    for start in range(0, len(flood), 4096):  # what a reader gets per read
        screen.feed(flood[start : start + 4096])
    screen.feed(b"prompt$ ")
    snap = drain(screen)
    assert snap.lines == (*(f"line {n}" for n in range(199_978, 200_001)), "prompt$")
    assert (snap.cursor_row, snap.cursor_col, snap.cursor_visible) == (23, 8, False)
    # Only the last screenful of lines was emulated.
    assert snap.skipped_bytes >= len(flood) - 24 * len(b"line 200000\r\n")
    assert snap.pending_bytes == 0


@pytest.mark.parametrize("cols", [80, 7])
def test_an_overflowed_line_without_breaks_wraps_where_the_terminal_wrapped_it(
    cols: int,
) -> None:
    screen = TerminalScreen(24, cols)
    screen.feed(b"prompt$ cat payload\r\n")
    drain(screen)
    alphabet = bytes(range(33, 127))  # 94 characters: rows do not repeat at 80 columns
    payload = alphabet * 20_000
    for start in range(0, len(payload), 4096):
        screen.feed(payload[start : start + 4096])
    snap = drain(screen)
    # What a terminal shows: the line's last rows, cut every `cols` from its start.
    rows = [payload[i : i + cols].decode() for i in range(0, len(payload), cols)]
    assert snap.lines == (*rows[-24:],)
    assert snap.skipped_bytes >= len(payload) - 24 * cols
    # Then a few short lines (one in colour) after it, the tail overflowing again.
    for start in range(0, len(payload), 4096):
        screen.feed(payload[start : start + 4096])
    screen.feed(b"\r\n\x1b[32mgreen\x1b[0m\r\nend\r\n")
    snap = drain(screen)
    line = payload * 2  # the same line went on
    last_row = (len(line) - 1) // cols * cols
    rows = [line[i : i + cols].decode() for i in range(last_row - 20 * cols, len(line), cols)]
    assert snap.lines == (*rows, "green", "end", "")


def test_an_overflowed_tail_is_rebuilt_from_its_last_clear() -> None:
    screen = TerminalScreen(10, 40)
    frames = [
        b"\x1b[H\x1b[2J\x1b[1;1Hframe %d\x1b[5;10Hmiddle %d\x1b[10;1Hstatus" % (i, i)
        for i in range(20_000)
    ]
    start = b"\x1b]2;top\x07\x1b[?1049h"
    screen.feed(start)
    for frame in frames:
        screen.feed(frame)
    snap = drain(screen)
    assert snap.alternate_screen and snap.title == "top"
    assert snap.lines == ("frame 19999", "", "", "", "         middle 19999", *[""] * 4, "status")
    # Everything before the last frame's clear was skipped, not emulated.
    assert snap.skipped_bytes == len(start) + sum(map(len, frames[:-1]))
    # Leaving the alternate screen inside dropped bytes brings the main screen back.
    screen.feed(b"\x1b[?1049l" + _lines(1, 30_000))
    snap = drain(screen)
    assert not snap.alternate_screen
    assert snap.lines[-2:] == ("line 30000", "")


def test_decaln_on_the_largest_screen_and_only_changed_rows_change() -> None:
    # The largest screen rendered (`screen_limit.MAX_SCREEN_CELLS`); 1000 x 1000 terminals
    # are accepted but get no screen (tests/test_screen_limit.py).
    screen = TerminalScreen(500, 500)
    screen.feed(b"\x1b#8")
    snap = drain(screen)
    assert snap.lines == ("E" * 500,) * 500
    screen.feed(b"\x1b[250;1Hx\x1b[500;500Hy")
    snap = drain(screen)
    assert snap.lines[249] == "x" + "E" * 499
    assert snap.lines[499] == "E" * 499 + "y"
    assert snap.lines[:249] == ("E" * 500,) * 249
    assert len(snap.text()) == 500 * 501 - 1
    with pytest.raises(sandbox.InvalidArgumentError, match="between 1 and 1000"):
        TerminalScreen(1001, 80)
    with pytest.raises(sandbox.InvalidArgumentError, match="between 1 and 1000"):
        screen.resize(24, 1001)


async def test_render_yields_to_the_event_loop_between_slices() -> None:
    screen = TerminalScreen(24, 80)
    screen.feed(b"".join(b"line %d\r\n" % i for i in range(20_000)))
    # Turns of a ticker task during the render (how long they are apart is a figure of
    # `python -m bench`, not asserted here).
    turns = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal turns
        while not stop.is_set():
            await asyncio.sleep(0)
            turns += 1

    task = asyncio.create_task(ticker())
    snap = await screen.render(budget_s=0.001)
    stop.set()
    await task
    assert snap.pending_bytes == 0
    assert snap.lines[-2] == "line 19999"
    assert turns > 2


def _flood_blocks(rng: random.Random) -> list[bytes]:
    yes = b"y\r\n" * 20_000
    lines = b"".join(
        b"%06d the quick brown fox \xe6\xbc\xa2\xe5\xad\x97 jumps\r\n" % i for i in range(1500)
    )
    redraw = [b"\x1b[?1049h"]
    for i in range(3000):
        row, col, colour = rng.randint(1, 24), rng.randint(1, 70), rng.randint(0, 7)
        text = b"abc\xf0\x9f\x99\x82" * rng.randint(1, 3)
        redraw.append(b"\x1b[%d;%dH\x1b[3%d;1m%s\x1b[0m" % (row, col, colour, text))
        if i % 300 == 0:
            redraw.append(b"\x1b[H\x1b[2J\x1b[44m\x1b[2J\x1b[0m\x1b[5@\x1b[3P\x1b[2L\x1b[M\x1b[3S")
    redraw.append(b"\x1b[?1049l")
    return [yes, lines, b"".join(redraw)]


def test_a_50_mb_flood_keeps_memory_bounded_and_ends_on_the_right_screen() -> None:
    rng = random.Random(7)
    blocks = _flood_blocks(rng)
    screen = TerminalScreen(24, 80)
    total = 50 * 1024 * 1024
    fed = 0
    # Per call: wall time (what the event loop would wait, preemption included) and
    # this thread's CPU time (the work itself), printed (bench/ has the figures).
    feeds: list[tuple[float, float]] = []
    processes: list[tuple[float, float]] = []

    def timed(calls: list[tuple[float, float]], call: Callable[[], object]) -> None:
        # The garbage collector is paused around each call: in a long test run the heap
        # is big and a full collection landing in one call costs ~200 ms that is not
        # the emulator's; it runs between calls instead.
        gc.disable()
        try:
            wall, cpu = time.perf_counter(), time.thread_time()
            call()
            calls.append((time.perf_counter() - wall, time.thread_time() - cpu))
        finally:
            gc.enable()

    rss_before = procfs.rss_bytes()
    rss_peak = rss_before
    started = time.perf_counter()
    while fed < total:
        block = blocks[rng.randrange(len(blocks))]
        start = 0
        while start < len(block):
            # What a reader gets per read, then one pump turn of the event loop.
            chunk = block[start : start + rng.randint(1, 128 * 1024)]
            start += len(chunk)
            timed(feeds, functools.partial(screen.feed, chunk))
            timed(processes, screen.process)
            fed += len(chunk)
            assert screen.pending_bytes <= 2 * 256 * 1024  # trimmed back at twice the bound
        rss_peak = max(rss_peak, procfs.rss_bytes())
    tail = b"".join(b"tail %d\r\n" % i for i in range(30))
    screen.feed(tail)
    while screen.pending_bytes:
        timed(processes, screen.process)
    elapsed = time.perf_counter() - started
    snap = screen.snapshot()
    emulated = fed + len(tail) - snap.skipped_bytes
    busy = sum(wall for wall, _ in feeds + processes)

    def spread(calls: list[tuple[float, float]], which: int) -> str:
        values = sorted(call[which] * 1e3 for call in calls)
        p50, p99 = values[len(values) // 2], values[len(values) * 99 // 100]
        return f"p50 {p50:.2f} p99 {p99:.2f} max {values[-1]:.2f} ms"

    print(
        f"\n50 MB flood: fed {fed / 1e6:.1f} MB in {elapsed:.1f} s "
        f"({fed / busy / 1e6:.2f} MB/s through feed+process), emulated {emulated / 1e6:.1f} MB "
        f"({emulated / busy / 1e6:.2f} MB/s), skipped {snap.skipped_bytes / 1e6:.1f} MB, "
        f"RSS growth {(rss_peak - rss_before) / 1e6:.1f} MB\n"
        f"  feed wall {spread(feeds, 0)}; cpu {spread(feeds, 1)}\n"
        f"  process(0.01) [{len(processes)} calls] wall {spread(processes, 0)}; "
        f"cpu {spread(processes, 1)}"
    )
    assert rss_peak - rss_before < 100 * 1024 * 1024
    assert not snap.alternate_screen
    assert snap.lines[-2] == "tail 29"
    assert snap.lines[-24] == "tail 7"


# ---- real programs on a real PTY ----------------------------------------------------


def need(*programs: str) -> str:
    """The first of `programs` installed (scripts/system-deps.sh installs them)."""
    for program in programs:
        path = shutil.which(program)
        if path:
            return path
    skip_or_fail(f"none of {', '.join(programs)} is installed (scripts/system-deps.sh)")
    raise AssertionError("unreachable")


StartProgram = Callable[..., PtyProgram]


@pytest.fixture
def programs() -> Iterator[StartProgram]:
    """Starts programs on PTYs (`PtyProgram` arguments); kills them after the test."""
    started: list[PtyProgram] = []

    def start(argv: list[str], cwd: Path, **kwargs: Any) -> PtyProgram:
        program = PtyProgram(argv, cwd=str(cwd), **kwargs)
        started.append(program)
        return program

    yield start
    for program in started:
        program.close()


def test_less_pages_and_gives_the_shell_screen_back(tmp_path: Path, programs: StartProgram) -> None:
    less = need("less")
    (tmp_path / "f.txt").write_text("".join(f"line {i:03d}\n" for i in range(200)))
    script = f"printf 'before less\\n'; {less} f.txt; printf 'after less\\n'"
    program = programs(["sh", "-c", script], tmp_path, env={"LESSHISTFILE": "-"}, seed=1)
    snap = program.wait_for(lambda s: s.lines[0] == "line 000" and "f.txt" in s.lines[-1])
    assert snap.alternate_screen
    assert snap.lines[:23] == tuple(f"line {i:03d}" for i in range(23))
    program.write(" ")  # a page down
    snap = program.wait_for(lambda s: s.lines[0] == "line 023" and s.lines[-1] == ":")
    assert snap.lines[:23] == tuple(f"line {i:03d}" for i in range(23, 46))
    assert (snap.cursor_row, snap.cursor_col) == (23, 1)
    program.write("q")
    assert program.wait_exit() == 0
    snap = program.screen.snapshot()
    assert not snap.alternate_screen
    assert snap.lines == ("before less", "after less") + ("",) * 22
    assert (snap.cursor_row, snap.cursor_col) == (2, 0)
    assert program.replayed() == snap


def test_vim_insert_mode_shows_and_the_cursor_follows(
    tmp_path: Path, programs: StartProgram
) -> None:
    vim = need("vim.tiny", "vi")
    editor = f"{vim} -u NONE -i NONE -n -N -c 'set showmode' new.txt"
    program = programs(["sh", "-c", f"printf 'before vim\\n'; exec {editor}"], tmp_path, seed=2)
    program.wait_for(lambda s: s.alternate_screen and "new.txt" in s.lines[-1])
    program.write("i")
    snap = program.wait_for(lambda s: "-- INSERT --" in s.lines[-1])
    assert snap.lines[-1].startswith("-- INSERT --")
    program.write("hello 漢字 world\rsecond")
    snap = program.wait_for(lambda s: s.lines[1] == "second")
    assert snap.lines[0] == "hello 漢字 world"
    assert snap.lines[2:23] == ("~",) * 21
    assert (snap.cursor_row, snap.cursor_col) == (1, 6)
    assert snap.text("█").splitlines()[1] == "second█"
    program.write("\x1b:q!\r")
    assert program.wait_exit() == 0
    snap = program.screen.snapshot()
    assert not snap.alternate_screen
    assert snap.lines[0] == "before vim"
    assert not any("hello" in line or line == "~" for line in snap.lines)
    assert program.replayed() == snap


def test_top_draws_its_table_and_quits(tmp_path: Path, programs: StartProgram) -> None:
    top = need("top")
    program = programs([top, "-d", "30"], tmp_path, seed=3)
    snap = program.wait_for(
        lambda s: s.lines[0].startswith("top - ") and any("COMMAND" in line for line in s.lines)
    )
    assert "load average" in snap.lines[0]
    header = next(line for line in snap.lines if "COMMAND" in line)
    assert header.split()[:2] == ["PID", "USER"]
    assert all(len(line) <= 80 for line in snap.lines)
    program.write("q")
    assert program.wait_exit() == 0
    assert program.replayed() == program.screen.snapshot()


def test_nano_edits_a_file(tmp_path: Path, programs: StartProgram) -> None:
    nano = need("nano")
    program = programs([nano, "--ignorercfiles", "notes.txt"], tmp_path, seed=4)
    snap = program.wait_for(lambda s: "GNU nano" in s.lines[0] and "^X Exit" in s.text())
    assert snap.alternate_screen
    program.write("hello nano 漢字")
    snap = program.wait_for(lambda s: "hello nano 漢字" in s.lines)
    row = snap.lines.index("hello nano 漢字")
    assert (snap.cursor_row, snap.cursor_col) == (row, 15)
    assert "Modified" in snap.lines[0]
    program.write("\x18")  # ^X
    program.wait_for(lambda s: any("Save modified buffer" in line for line in s.lines))
    program.write("n")
    assert program.wait_exit() == 0
    snap = program.screen.snapshot()
    assert not snap.alternate_screen
    assert not any("nano" in line for line in snap.lines)
    assert not (tmp_path / "notes.txt").exists()


def test_python_curses_with_colours_title_and_wide_characters(
    tmp_path: Path, programs: StartProgram
) -> None:
    (tmp_path / "demo.py").write_text(CURSES_PROGRAM)
    program = programs([sys.executable, "demo.py"], tmp_path, seed=5)
    snap = program.wait_for(lambda s: "press a key>" in s.text())
    assert snap.alternate_screen
    assert snap.title == "curses demo title"
    assert snap.lines[:7] == (
        "Curses demo",
        "",
        "  wide: 漢字テスト 🙂 ok",
        "",
        "-" * 30,
        "",
        "    press a key>",
    )
    assert (snap.cursor_row, snap.cursor_col) == (6, 17)
    assert snap.text("█").splitlines()[6] == "    press a key> █"
    program.write("x")
    assert program.wait_exit() == 0
    snap = program.screen.snapshot()
    assert not snap.alternate_screen
    assert snap.lines[0] == "curses finished"
    assert snap.title == "curses demo title"
    assert program.replayed() == snap


async def test_session_pty_output_renders_ctrl_c_and_resize(tmp_path: Path) -> None:
    # Through the session API: its windows hand out decoded text, and re-encoding valid
    # UTF-8 gives back the bytes the terminal wrote.
    # A write's window is 0.25 s by default: `until` ends these long ones early.
    window = {"yield_time_s": 30.0}
    screen = TerminalScreen(24, 80)
    async with sandbox.open_session("unix_local", workdir=tmp_path) as session:
        update = await session.pty_exec_start(
            "exec bash --norc --noprofile -i",
            tty=True,
            env={"PS1": "prompt$ "},
            until="prompt$ ",
            **window,
        )
        pid = update.process_id
        assert pid is not None
        screen.feed(update.output.encode())
        # The child prints, so when it shows, it is the terminal's foreground job and
        # ^C reaches it (bash's own `echo` would show before `sleep` is in front).
        command = "sh -c 'echo 漢字; exec sleep 600'"
        update = await session.pty_write_stdin(pid, command + "\r", until="漢字\r\n", **window)
        screen.feed(update.output.encode())
        update = await session.pty_write_stdin(pid, "\x03", until="prompt$ ", **window)
        screen.feed(update.output.encode())
        snap = await screen.render()
        assert snap.lines[:4] == ("prompt$ " + command, "漢字", "^C", "prompt$")
        assert (snap.cursor_row, snap.cursor_col) == (3, 8)
        await session.pty_resize(pid, rows=30, cols=100)
        screen.resize(30, 100)
        update = await session.pty_write_stdin(pid, "stty size\r", until="30 100", **window)
        screen.feed(update.output.encode())
        snap = await screen.render()
        assert (snap.rows, snap.cols) == (30, 100)
        assert snap.lines[3:5] == ("prompt$ stty size", "30 100")
        update = await session.pty_write_stdin(pid, "exit\r", **window)
        assert update.exit_code == 0
