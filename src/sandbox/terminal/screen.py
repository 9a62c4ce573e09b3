"""A rendered terminal screen for one tty process: what a person at the terminal would see.

Interface (everything else in this module is private)::

    screen = TerminalScreen(rows=24, cols=80)      # max_pending=256 KiB by default
    screen.feed(chunk)             # raw output bytes, exactly as read: cheap, never blocks
    screen.resize(rows, cols)      # queued in order with the output (see below)
    done = screen.process(0.01)    # emulate queued output for about 10 ms; True: caught up
    snap = screen.snapshot()       # the screen as emulated so far (a ScreenSnapshot)
    snap = await screen.render()   # process everything fed so far (yielding to the event
                                   # loop between slices), then snapshot
    snap.text(cursor_marker="█")   # the lines for a model, with the cursor marked

How a session wires it: the reader calls `feed()` with every chunk it reads; nothing
else happens until a screen is asked for: `pty_screen()` awaits `render()`, and an
`until_screen` window renders after every change. `resize()` goes with the PTY resize.

Cost. `feed()` only appends to a tail of raw bytes, so a flood nobody looks at costs the
reader a list append per read. The tail is bounded by `max_pending` (or two bytes per
cell, if more: a big terminal's screenful of text must fit): once it holds twice that,
whole chunks are dropped from its front down to the bound (one join and a few byte
searches over what was dropped, `skipped_bytes` counts it). The emulator (pyte,
pure Python) is slow: about 0.4 MB/s on `yes`-like output and 1-1.5 MB/s on curses
redraws on one core. `process()` works in slices whose size adapts to the measured cost
(a slice aims at 1 ms, at most 1 KiB of input) and stops once its budget is spent, so
the event loop is held for the budget plus at most one slice (plus what the garbage
collector or a busy machine adds). A snapshot renders only the rows the emulator marked
changed since the last one (`render()` in slices that yield, too). Terminals are at
most 1000 x 1000 (`check_terminal_size`), which bounds the cost of one operation (a
scroll, an erase: O(rows) or O(cols)) and of a snapshot (a million cells).

Rebuilding after an overflow. When bytes were dropped, the next `process()` does not
emulate the whole tail: it walks back over the tail's lines until they fill the screen
(a line of printable ASCII takes a row per `cols` characters, any other line one row;
the line the tail starts in counts the printable bytes of it that came before, tracked
with byte searches) and draws from there on a blank screen, or from the last clear of
the screen (`ESC [ 2 J`, with the `ESC [ H` before it) if that comes later; the bytes
before that point are skipped. Exact: line-oriented output (a flood of lines, wrapped
lines, one long line of printable ASCII), and anything after a clear (full-screen
programs redraw after one). Alternate-screen switches and window titles inside the
skipped bytes are still applied (found with a byte search, not emulated), so
`alternate_screen` and `title` stay right. Best effort: with neither (a full-screen
program's diffs, or lines with escapes that wrap), the newest 64 KiB are emulated over
the picture kept (the previous picture plus the newest diffs is closer to the truth
than the diffs alone), from the next escape sequence or line break; the main screen
brought back when a program leaves the alternate screen is the one emulated last.
Memory is bounded by twice the tail's bound plus the screen cells (rows x cols).

Order. Bytes fed before a `resize()` are emulated at the old size and bytes after it at
the new size, as on a real terminal (the program only redraws after its SIGWINCH). A
snapshot shows the state after the bytes processed so far: `pending_bytes` says how many
are still queued.

Emulation (on top of pyte's VT100/xterm subset): the alternate screen (DEC private modes
47, 1047 and 1049; 1049 also saves and restores the cursor; leaving restores the main
screen as it was, like xterm, so after `vim` or `less` quits the shell's screen is back;
the alternate screen is always entered blank), the window title (OSC 0 and 2), mode 1048
(save/restore cursor), wide characters in two cells (a wide character that does not fit
in the last column wraps, like xterm), zero-width characters (ZWJ, variation selectors,
combining marks) kept with the previous character, DEC line drawing (`ESC ( 0`), the
sequences pyte lacks that ncurses uses (SU/SD scrolling, REP, HPA, SCOSC/SCORC), DCS,
APC, PM and SOS strings skipped (terminal queries, inline images), and malformed or
runaway sequences dropped without losing the text that follows. Not emulated: scrollback
(ED 3 is a no-op), DECCOLM (ignored, as by xterm's default), and answers to queries (a
cursor-position or device-attributes request gets no reply; vim, less, top, nano and
curses programs do not wait for one). Colours and attributes are emulated but not
reported: a snapshot is text.
"""

from __future__ import annotations

import asyncio
import codecs
import copy
import functools
import logging
import time
import unicodedata
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import pyte
from pyte.screens import Char, Cursor, StaticDefaultDict
from wcwidth import wcwidth

from .screen_limit import check_screen_cells, too_large
from .size import check_terminal_size

logger = logging.getLogger("sandbox")

DEFAULT_MAX_PENDING = 256 * 1024
"""Default bound of the bytes queued for the emulator (`TerminalScreen(max_pending=)`)."""

_SLICE_TARGET_S = 0.001  # what one slice of emulation aims to cost
_MIN_STEP = 64  # bytes per slice, lower and upper bounds of the adaptive size
_MAX_STEP = 1024
_RESYNC_WINDOW = 256  # after a drop, look this far for a sequence or line start
_MAX_SEQUENCE_CHARS = 4096  # an escape sequence longer than this is abandoned
_MAX_CELL_CHARS = 16  # combining characters kept on one cell
_MAX_REPEAT = 2048  # characters one REP draws (a 24x80 screenful is 1920)
# After an overflow with nothing to rebuild the screen from, the newest this many bytes
# are emulated over the picture kept (best effort: a full-screen program's recent diffs).
_FALLBACK_WINDOW = 64 * 1024
_ALTERNATE_MODES = frozenset({47, 1047, 1049})
_SAVE_CURSOR_MODE = 1048
# DECCOLM (80/132 columns): xterm ignores it unless allowColumnMode is set (it is not by
# default); pyte would switch to 132 columns, or clear the screen on `reset`'s ?3l.
_IGNORED_MODES = frozenset({3})

_Buffer = dict[int, StaticDefaultDict[int, Char]]


@dataclass(frozen=True, slots=True)
class ScreenSnapshot:
    """What a terminal screen showed at one moment (after the bytes processed so far).

    `lines` has exactly `rows` entries, one per screen row, each with its trailing blanks
    removed (so `lines[cursor_row]` is the cursor's row); a wide character is one `str`
    character covering two cells. `cursor_row` and `cursor_col` are 0-based cells,
    always on the screen. `alternate_screen` is True while a full-screen program has
    switched to the alternate screen. `title` is the last window title the program set
    (OSC 0 or 2), None if it never set one. `skipped_bytes` counts output bytes dropped
    unrendered because the emulator could not keep up (since the screen was created);
    `pending_bytes` counts bytes fed but not yet processed.
    """

    lines: tuple[str, ...]
    cursor_row: int
    cursor_col: int
    cursor_visible: bool
    rows: int
    cols: int
    alternate_screen: bool
    title: str | None
    skipped_bytes: int
    pending_bytes: int

    def text(self, cursor_marker: str | None = None) -> str:
        """The screen as text: the lines joined by newlines, without the blank lines at
        the bottom. With `cursor_marker`, the marker is inserted where the cursor is (when
        the cursor is visible), padding the row with spaces if the cursor is past its end.
        """
        lines = list(self.lines)
        last = len(lines) - 1
        while last >= 0 and not lines[last]:
            last -= 1
        if cursor_marker is not None and self.cursor_visible:
            row = lines[self.cursor_row]
            index = _index_of_cell(row, self.cursor_col)
            row = row.ljust(index)
            lines[self.cursor_row] = row[:index] + cursor_marker + row[index:]
            last = max(last, self.cursor_row)
        return "\n".join(lines[: last + 1])


class TerminalScreen:
    """The rendered screen of one tty process, fed with its raw output bytes.

    See the module docstring for the cost model and how a session drives it. Not
    thread-safe: call it from the event loop thread (or any single thread).
    """

    def __init__(self, rows: int, cols: int, *, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        check_terminal_size(rows, cols)
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be a positive int, not {max_pending!r}")
        self._max_pending = max_pending
        self._bound = _tail_bound(max_pending, rows, cols)
        self._screen = _Screen(cols, rows)
        self._stream = _Stream(self._screen)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Output chunks and queued resizes, in arrival order; `_head` is how much of the
        # first chunk was already consumed (a chunk is processed a slice at a time).
        self._queue: deque[bytes | tuple[int, int]] = deque()
        self._head = 0
        self._pending = 0
        self._fed = 0
        self._consumed = 0  # processed + dropped: `_fed - _consumed == _pending`
        self._skipped = 0
        self._step = 1024
        self._overflowed = False  # bytes were dropped: rebuild before emulating
        # Printable ASCII bytes consumed since the last CR or LF (None: something else
        # came since): where a line too long for the tail wraps (see `_rebuild`).
        self._line_run: int | None = 0
        # The rendered rows, kept between snapshots: only rows the emulator marked dirty
        # are rendered again.
        self._rendered: list[str] = [""] * rows
        # Past `screen_limit.MAX_SCREEN_CELLS`: nothing is emulated, the size is kept.
        self._too_large = (rows, cols) if too_large(rows, cols) else None

    @property
    def too_large(self) -> bool:
        """The terminal is past `MAX_SCREEN_CELLS`: no screen (see `screen_limit`)."""
        return self._too_large is not None

    def check_size(self) -> None:
        """Raise `ScreenTooLargeError` while the terminal is past the bound."""
        if self._too_large is not None:
            check_screen_cells(*self._too_large)

    @property
    def pending_bytes(self) -> int:
        """Bytes fed but not yet processed."""
        return self._pending

    @property
    def skipped_bytes(self) -> int:
        """Bytes dropped or skipped unrendered so far (the tail overflowed)."""
        return self._skipped

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Queue raw output bytes (any split of characters and escape sequences is fine).

        Cheap: no emulation happens here. If the queue then holds more than
        `max_pending` bytes, the oldest chunks are dropped (see the module docstring).
        """
        if not data:
            return
        if self._too_large is not None:
            self._fed += len(data)
            self._consumed += len(data)
            self._skipped += len(data)
            return
        chunk = bytes(data)  # a copy only if the caller passed a mutable buffer
        self._queue.append(chunk)
        self._pending += len(chunk)
        self._fed += len(chunk)
        if self._pending > 2 * self._bound:
            self._trim()

    def resize(self, rows: int, cols: int) -> None:
        """Resize the screen, after the bytes fed so far (they were written for the old
        size). Takes effect when `process()` reaches it."""
        check_terminal_size(rows, cols)
        if too_large(rows, cols) or self._too_large is not None:
            self._resize_past_bound(rows, cols)
            return
        # Never below what the sizes still queued need: their bytes are in the tail.
        self._bound = max(self._bound, _tail_bound(self._max_pending, rows, cols))
        if self._queue:
            self._queue.append((rows, cols))
        else:
            self._screen.resize(rows, cols)

    def process(self, budget_s: float = 0.01) -> bool:
        """Emulate queued output for about `budget_s` seconds (at least one slice, at
        most the budget plus one slice of about 1 ms). Returns True when nothing is left
        to process."""
        deadline = time.perf_counter() + budget_s
        if self._overflowed:
            self._rebuild()
        while self._queue:
            item = self._queue[0]
            if isinstance(item, tuple):
                self._queue.popleft()
                self._screen.resize(*item)
                continue
            end = min(len(item), self._head + self._step)
            chunk = item[self._head : end]
            if end == len(item):
                self._queue.popleft()
                self._head = 0
            else:
                self._head = end
            self._pending -= len(chunk)
            self._consumed += len(chunk)
            started = time.perf_counter()
            self._track(chunk, 0, len(chunk))
            self._emulate(chunk)
            now = time.perf_counter()
            self._adapt(len(chunk), now - started)
            if now >= deadline:
                break
        return not self._queue

    async def render(
        self, budget_s: float = 0.01, *, deadline: float | None = None
    ) -> ScreenSnapshot:
        """Process everything fed before this call, `budget_s` at a time, yielding to the
        event loop between slices; then render the rows that changed (also in slices)
        and return the snapshot. With `deadline` (loop time), emulation stops there and
        the snapshot shows what was processed by then. Output fed meanwhile may be
        processed too; the wait is bounded because the queue is."""
        self.check_size()
        loop = asyncio.get_running_loop()
        target = self._fed
        while self._consumed < target:
            if self.process(budget_s):
                break
            if deadline is not None and loop.time() >= deadline:
                break
            await asyncio.sleep(0)  # one slice per turn: the reader and others run between
        while True:
            if self._render_dirty(budget_s):
                return self._snapshot()
            await asyncio.sleep(0)  # a big screen renders a slice of rows per turn

    def snapshot(self) -> ScreenSnapshot:
        """The screen as emulated so far (renders the rows changed since the last
        snapshot, in one go; no emulation)."""
        self.check_size()
        self._render_dirty(None)
        return self._snapshot()

    # ---- internals ------------------------------------------------------------------

    def _resize_past_bound(self, rows: int, cols: int) -> None:
        """A resize to or from a size past `MAX_SCREEN_CELLS`: going past it drops what is
        queued (it would be emulated at the huge size); coming back starts blank."""
        if too_large(rows, cols):
            self._skipped += self._pending
            self._consumed += self._pending
            self._pending = 0
            self._queue.clear()
            self._head = 0
            self._too_large = (rows, cols)
            return
        self._too_large = None
        self._screen = _Screen(cols, rows)
        self._stream = _Stream(self._screen)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._bound = _tail_bound(self._max_pending, rows, cols)
        self._overflowed = False
        self._line_run = 0
        self._rendered = [""] * rows

    def _snapshot(self) -> ScreenSnapshot:
        screen = self._screen
        rows, cols = screen.lines, screen.columns
        return ScreenSnapshot(
            lines=tuple(self._rendered),
            cursor_row=min(max(screen.cursor.y, 0), rows - 1),
            cursor_col=min(max(screen.cursor.x, 0), cols - 1),
            cursor_visible=not screen.cursor.hidden,
            rows=rows,
            cols=cols,
            alternate_screen=screen.alternate,
            title=screen.window_title,
            skipped_bytes=self._skipped,
            pending_bytes=self._pending,
        )

    def _render_dirty(self, budget_s: float | None) -> bool:
        """Render the rows the emulator changed since the last call, for about
        `budget_s` (None: all of them). True when every row is up to date."""
        screen = self._screen
        rows, cols = screen.lines, screen.columns
        if len(self._rendered) != rows:
            self._rendered = [""] * rows
            screen.dirty.update(range(rows))
        dirty = screen.dirty
        buffer = screen.buffer
        deadline = None if budget_s is None else time.perf_counter() + budget_s
        while dirty:
            y = dirty.pop()
            if y < rows:
                self._rendered[y] = _render_line(buffer.get(y), cols)
                # A row costs at most `cols` cells: check the clock per row.
                if deadline is not None and time.perf_counter() >= deadline:
                    break
        return not dirty

    def _emulate(self, chunk: bytes) -> None:
        text = self._decoder.decode(chunk)
        if not text:
            return
        try:
            self._stream.feed(text)
        except Exception:
            # The parser's own errors are absorbed by `_Stream`; anything else is an
            # emulator bug on odd input. The session's reader must not die of it: lose
            # the rest of this slice and go on.
            logger.debug("terminal emulator error; slice skipped", exc_info=True)
            self._stream.restart()

    def _adapt(self, size: int, elapsed: float) -> None:
        # Scale the next slice by how far this one was from the target, at most 2x up or
        # 8x down at a time (costs per byte differ by 100x between plain text and
        # redraws, so shrink fast and grow carefully).
        if size < self._step:
            return  # a chunk's tail: says nothing about a full slice
        ratio = _SLICE_TARGET_S / elapsed if elapsed > 0 else 2.0
        step = int(self._step * min(2.0, max(0.125, ratio)))
        self._step = min(_MAX_STEP, max(_MIN_STEP, step))

    def _trim(self) -> None:
        """Drop bytes from the front down to `max_pending` (the hot path, run once the
        queue holds twice that: whole chunks popped, then one join and a few byte
        searches over what was dropped)."""
        queue = self._queue
        dropped: list[bytes] = []
        while len(queue) > 1:
            item = queue[0]
            if isinstance(item, tuple):
                self._account_dropped(dropped)
                queue.popleft()
                self._screen.resize(*item)
                continue
            size = len(item) - self._head
            if self._pending - size < self._bound:
                break
            queue.popleft()
            dropped.append(item[self._head :] if self._head else item)
            self._head = 0
            self._skip(size)
        item = queue[0]
        excess = self._pending - self._bound
        if excess > 0 and isinstance(item, bytes):
            # One chunk bigger than the bound: keep its newest part (an offset, no copy).
            dropped.append(item[self._head : self._head + excess])
            self._head += excess
            self._skip(excess)
        self._account_dropped(dropped)

    def _account_dropped(self, dropped: list[bytes]) -> None:
        """What dropped bytes still change: switches, titles, the line run.

        The pieces are joined and searched once: a terminal is read a few KiB at a
        time, and the dozen byte searches per piece cost more in calls than in bytes
        (following the line run over the join is the same as over each piece in turn).
        """
        if dropped:
            data = dropped[0] if len(dropped) == 1 else b"".join(dropped)
            dropped.clear()
            self._track(data, 0, len(data))
            self._replay_dropped(data, 0, len(data))
            self._overflowed = True

    def _skip(self, count: int) -> None:
        self._pending -= count
        self._consumed += count
        self._skipped += count

    def _rebuild(self) -> None:
        """After an overflow: restart the parser at a point of the kept bytes from which
        the screen can be rebuilt, and skip what comes before it (see the module
        docstring for what is exact and what is best effort)."""
        self._overflowed = False
        self._decoder.reset()
        self._stream.restart()
        items = list(self._queue)
        head, self._head = self._head, 0
        # The bytes after the last queued resize were written for the final size; those
        # before it are skipped (the program redraws after its SIGWINCH), their resizes,
        # switches and titles still applied.
        rows = self._screen.lines
        last_resize = -1
        for index, item in enumerate(items):
            if isinstance(item, tuple):
                last_resize, rows = index, item[0]
        data = b"".join(it for it in items[last_resize + 1 :] if isinstance(it, bytes))
        if last_resize < 0:
            data = data[head:]
        for index, item in enumerate(items[: last_resize + 1]):
            if isinstance(item, tuple):
                self._screen.resize(*item)
            else:
                self._replay_dropped(item, head if index == 0 else 0, len(item))
                self._track(item, head if index == 0 else 0, len(item))
        start, cleared = _rebuild_point(data, rows, self._screen.columns, self._line_run)
        if start < 0:
            # Nothing to rebuild from (a redraw by diffs, text with escapes and no line
            # breaks): keep the picture and emulate the newest bytes from a sequence or line
            # start (best effort).
            window = min(self._max_pending, _FALLBACK_WINDOW)
            start = _resync_point(data, max(0, len(data) - window), last_resize < 0)
            cleared = True
        self._replay_dropped(data, 0, start)
        self._track(data, 0, start)
        if not cleared:
            # Line-oriented output (or one long line): its newest rows are drawn on a
            # blank screen.
            self._screen.erase_in_display(2)
            self._screen.cursor_position()
        self._skip(self._pending - (len(data) - start))
        self._queue = deque([data[start:]] if start < len(data) else [])

    def _track(self, data: bytes, start: int, end: int) -> None:
        """Follow `_line_run` over data[start:end] (byte searches only)."""
        newline = max(data.rfind(b"\r", start, end), data.rfind(b"\n", start, end))
        run = self._line_run if newline < 0 else 0
        if newline >= 0:
            start = newline + 1
        if run is None:
            return  # stays unknown until the next line break
        part = data if start == 0 and end == len(data) else data[start:end]  # no copy: a flood
        self._line_run = run + end - start if _plain(part) else None

    def _replay_dropped(self, data: bytes, start: int, end: int) -> None:
        """Apply the last alternate-screen switch and the last title found in dropped
        bytes (a byte search: sequences split between chunks are missed)."""
        if data.find(b"\x1b", start, end) < 0:
            return  # plain text (the usual flood): nothing to look for
        switch: tuple[int, bool, int] | None = None  # (pos, enter, mode)
        for mode in _ALTERNATE_MODES:
            for enter, final in ((True, b"h"), (False, b"l")):
                pos = data.rfind(b"\x1b[?%d" % mode + final, start, end)
                if pos >= 0 and (switch is None or pos > switch[0]):
                    switch = (pos, enter, mode)
        if switch is not None:
            _, enter, mode = switch
            if enter:
                self._screen.enter_alternate(save_cursor=mode == 1049)
            else:
                self._screen.leave_alternate(restore_cursor=mode == 1049)
        title = _last_title(data, start, end)
        if title is not None:
            self._screen.set_title(title)


def _plain(data: bytes) -> bool:
    """Whether every byte takes one cell: ASCII without escape sequences, the controls
    that move the cursor within a line (BS, HT, VT, FF) or DEL. A few byte searches, no
    copy; the other controls (BEL, NUL) count as cells here, where a terminal ignores
    them: a best-effort case."""
    # Unrolled: this runs for every chunk a flood drops.
    return (
        data.isascii()
        and data.find(b"\x1b") < 0
        and data.find(b"\x08") < 0
        and data.find(b"\t") < 0
        and data.find(b"\x0b") < 0
        and data.find(b"\x0c") < 0
        and data.find(b"\x7f") < 0
    )


def _tail_bound(max_pending: int, rows: int, cols: int) -> int:
    """The tail kept for a screen: `max_pending`, or two bytes per cell if more (a big
    terminal's screenful of text must fit, for the rebuild to be exact)."""
    return max(max_pending, 2 * rows * cols)


def _rebuild_point(data: bytes, rows: int, cols: int, run: int | None) -> tuple[int, bool]:
    """Where in `data` the screen can be rebuilt from: (-1, False) if nowhere; else the
    offset and whether it is a clear of the screen (else the start of the text that
    fills the last `rows` rows, to be drawn on a blank screen). `run` is how many
    printable ASCII bytes of the line `data` starts in came before it (None: unknown)."""
    clear = data.rfind(b"\x1b[2J")
    if clear >= 0:
        for home in (b"\x1b[H", b"\x1b[1;1H", b"\x1b[;H"):
            if data.endswith(home, 0, clear):
                clear -= len(home)
                break
    text = _rows_start(data, rows, cols, run)
    if clear < 0 and text < 0:
        return -1, False
    if clear >= text:
        return clear, True
    return text, False


def _rows_start(data: bytes, rows: int, cols: int, run: int | None) -> int:
    """Walk back over the lines at the end of `data` until they fill `rows` rows; the
    offset to draw from (-1 if the lines run out first, or a partly shown line is not
    plain text, so where it wraps is unknown). A line of printable ASCII takes a row per
    `cols` characters; any other line is counted as one row."""
    need = rows
    end = len(data)
    while True:
        newline = data.rfind(b"\n", 0, end)
        start = newline + 1
        body = data[start:end]
        if body.endswith(b"\r"):
            body = body[:-1]
        plain = _plain(body) and body.find(b"\r") < 0  # a CR inside redraws the row
        width = len(body)
        if newline < 0:
            if run is None or not plain:
                return -1
            width += run
        used = max(1, -(-width // cols)) if plain else 1
        if used >= need:
            # Start where the shown rows of this line begin.
            offset = (used - need) * cols - (width - len(body))
            return start + offset if offset >= 0 else -1
        need -= used
        if newline < 0:
            return -1
        end = newline


def _resync_point(data: bytes, start: int, after_drop: bool) -> int:
    """The first offset at or after `start` where parsing can restart: the next ESC, CR
    or LF when one is near, else a UTF-8 character boundary (0 if nothing was cut)."""
    if start == 0 and not after_drop:
        return 0
    window_end = min(len(data), start + _RESYNC_WINDOW)
    found = [
        p for p in (data.find(b, start, window_end) for b in (b"\x1b", b"\r", b"\n")) if p >= 0
    ]
    if found:
        return min(found)
    for _ in range(3):
        if start < len(data) and 0x80 <= data[start] < 0xC0:
            start += 1
    return start


def _last_title(data: bytes, start: int, end: int) -> str | None:
    """The title of the last complete OSC 0/2 sequence in data[start:end], if any."""
    best = max(data.rfind(b"\x1b]0;", start, end), data.rfind(b"\x1b]2;", start, end))
    if best < 0:
        return None
    body = best + 4
    stops = [p for p in (data.find(b"\x07", body, end), data.find(b"\x1b\\", body, end)) if p >= 0]
    if not stops or min(stops) - body > _MAX_SEQUENCE_CHARS:
        return None
    return data[body : min(stops)].decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=4096)
def _width(char: str) -> int:
    """Cells taken by one character: 2 (wide), 1, 0 (rides on the previous one) or -1
    (a control character, not drawn)."""
    return int(wcwidth(char))


def _index_of_cell(line: str, col: int) -> int:
    """The index in a rendered line where cell `col` starts (past the end: the index the
    cell would have if the line were padded with spaces)."""
    width = 0
    for index, char in enumerate(line):
        cells = 1 if char.isascii() else _width(char)
        if cells <= 0:
            continue  # a combining mark or joiner belongs to the previous character
        if width >= col:
            return index
        width += cells
    return len(line) + max(0, col - width)


def _render_line(line: StaticDefaultDict[int, Char] | None, cols: int) -> str:
    """One screen row as text, trailing blanks removed."""
    if line is None:
        return ""
    # Cells past the last stored one all show the line's default (blank, or the E of
    # DECALN): only the stored ones are looked at.
    stored = min(cols, max(line) + 1) if line else 0
    fill = line.default.data
    tail = fill * (cols - stored) if fill != " " else ""
    text = "".join([line[x].data for x in range(stored)])
    if len(text) == stored and text.isascii():
        return (text + tail).rstrip(" ")  # one character per cell: nothing wide, joined
    return (_render_cells(line, stored) + tail).rstrip(" ")


def _render_cells(line: StaticDefaultDict[int, Char], cols: int) -> str:
    """The first `cols` cells of a row with wide and combining characters."""
    out: list[str] = []
    after_wide = False
    for x in range(cols):
        char = line[x].data
        if char == "":
            # The right half of a wide character: it was drawn with its left half. An
            # orphaned half (its left half was overwritten) shows blank, as in xterm.
            if not after_wide:
                out.append(" ")
            after_wide = False
            continue
        wide = not char.isascii() and _width(char[0]) == 2
        if wide and x + 1 < cols and line[x + 1].data != "":
            # Its right half was overwritten: xterm blanks the left half too.
            out.append(" ")
            after_wide = False
            continue
        out.append(char)
        after_wide = wide
    return "".join(out)


class _Screen(pyte.Screen):
    """pyte's screen with the alternate screen, titles, robust drawing and bounded costs."""

    def __init__(self, columns: int, lines: int) -> None:
        # Set before pyte's __init__, which calls our reset().
        self.alternate = False
        self._saved_main: tuple[_Buffer, Cursor | None] | None = None
        self._saved_1048: Cursor | None = None
        self.window_title: str | None = None
        self._last_char = ""  # for REP
        super().__init__(columns, lines)

    # -- the alternate screen (pyte has none) --

    def enter_alternate(self, *, save_cursor: bool) -> None:
        """Switch to a blank alternate screen, keeping the main one (and, for mode 1049,
        the cursor) to restore when leaving."""
        if self.alternate:
            return
        self._saved_main = (self.buffer, copy.copy(self.cursor) if save_cursor else None)
        self.buffer = self._blank_buffer()
        self.alternate = True
        self.dirty.update(range(self.lines))

    def leave_alternate(self, *, restore_cursor: bool) -> None:
        """Switch back to the main screen as it was when the alternate one was entered."""
        if not self.alternate or self._saved_main is None:
            return
        buffer, cursor = self._saved_main
        self._saved_main = None
        self.alternate = False
        self.buffer = buffer
        if restore_cursor and cursor is not None:
            self.cursor = cursor
            self.ensure_hbounds()
            self.ensure_vbounds()
        self.dirty.update(range(self.lines))

    def _blank_buffer(self) -> _Buffer:
        return defaultdict(lambda: StaticDefaultDict[int, Char](self.default_char))

    def set_mode(self, *modes: int, **kwargs: Any) -> None:
        """Set modes; the private alternate-screen, save-cursor and column modes are
        ours."""
        if kwargs.get("private"):
            rest = []
            for mode in modes:
                if mode in _IGNORED_MODES:
                    continue
                if mode in _ALTERNATE_MODES:
                    self.enter_alternate(save_cursor=mode == 1049)
                elif mode == _SAVE_CURSOR_MODE:
                    self._saved_1048 = copy.copy(self.cursor)
                else:
                    rest.append(mode)
            if not rest:
                return
            modes = tuple(rest)
        super().set_mode(*modes, **kwargs)

    def reset_mode(self, *modes: int, **kwargs: Any) -> None:
        """Reset modes; the private alternate-screen, save-cursor and column modes are
        ours."""
        if kwargs.get("private"):
            rest = []
            for mode in modes:
                if mode in _IGNORED_MODES:
                    continue
                if mode in _ALTERNATE_MODES:
                    self.leave_alternate(restore_cursor=mode == 1049)
                elif mode == _SAVE_CURSOR_MODE:
                    if self._saved_1048 is not None:
                        self.cursor = copy.copy(self._saved_1048)
                        self.ensure_hbounds()
                        self.ensure_vbounds()
                else:
                    rest.append(mode)
            if not rest:
                return
            modes = tuple(rest)
        super().reset_mode(*modes, **kwargs)

    def reset(self) -> None:
        """RIS: like xterm, back to the main screen, cleared; the title stays."""
        if self.alternate and self._saved_main is not None:
            self.buffer = self._saved_main[0]
        self.alternate = False
        self._saved_main = None
        self._saved_1048 = None
        super().reset()

    def set_title(self, param: str) -> None:
        """OSC 0/2: remember the title."""
        super().set_title(param)
        self.window_title = param

    # -- drawing --

    def draw(self, data: str) -> None:
        """Draw text. pyte's own `draw` stops at the first character of width 0 that is
        not a combining mark (ZWJ, a variation selector) or of width -1 (a stray control
        character), losing the rest of the text, and draws a wide character into the last
        column; this handles those characters itself."""
        if data.isascii() and data.isprintable():
            super().draw(data)  # the common case, and pyte's fast path
            self._last_char = data[-1]
            return
        start = 0
        for index, char in enumerate(data):
            if char.isascii() and char.isprintable():
                continue
            cells = _width(char)
            if cells == 1:
                continue
            if start < index:
                super().draw(data[start:index])
            start = index + 1
            if cells == 2:
                self._last_char = char
                if (
                    self.cursor.x == self.columns - 1
                    and pyte.modes.DECAWM in self.mode
                    and self.columns > 1
                ):
                    self.cursor.x = self.columns  # no room: wrap first, like xterm
                super().draw(char)
            elif cells == 0:
                self._attach(char)
            # cells < 0: a control character with no meaning here; xterm ignores it.
        if start < len(data):
            super().draw(data[start:] if start else data)
            self._last_char = data[-1]

    def _attach(self, char: str) -> None:
        """Add a zero-width character to the character before the cursor."""
        x, y = min(self.cursor.x, self.columns), self.cursor.y
        if x == 0:
            return
        line = self.buffer[y]
        x -= 1
        if line[x].data == "" and x > 0:
            x -= 1  # the right half of a wide character: attach to the character
        cell = line[x]
        if cell.data and len(cell.data) < _MAX_CELL_CHARS:
            line[x] = cell._replace(data=unicodedata.normalize("NFC", cell.data + char))
            self.dirty.add(y)

    def repeat_last(self, count: int | None = None, *args: Any, **kwargs: Any) -> None:
        """REP: draw the last drawn character `count` more times (at most a screenful,
        and at most `_MAX_REPEAT`: the cost of one sequence stays bounded on a big
        screen; ncurses repeats only within a line)."""
        if self._last_char and not args and not kwargs:
            count = min(count or 1, self.lines * self.columns, _MAX_REPEAT)
            self.draw(self._last_char * count)

    # -- sequences pyte does not map --

    def scroll_up(self, count: int | None = None) -> None:
        """SU: scroll the scrolling region up `count` lines; the cursor stays."""
        top = self.margins.top if self.margins else 0
        x, y = self.cursor.x, self.cursor.y
        self.cursor.y = top
        self.delete_lines(count)
        self.cursor.x, self.cursor.y = x, y

    def scroll_down(self, count: int | None = None) -> None:
        """SD: scroll the scrolling region down `count` lines; the cursor stays."""
        top = self.margins.top if self.margins else 0
        x, y = self.cursor.x, self.cursor.y
        self.cursor.y = top
        self.insert_lines(count)
        self.cursor.x, self.cursor.y = x, y

    def ansi_save_cursor(self, *params: int, **kwargs: Any) -> None:
        """SCOSC (CSI s), without parameters only (with them it is DECSLRM)."""
        if params in ((), (0,)) and not kwargs:
            self.save_cursor()

    def ansi_restore_cursor(self, *params: int, **kwargs: Any) -> None:
        """SCORC (CSI u), without parameters only (others are keyboard protocols)."""
        if params in ((), (0,)) and not kwargs:
            self.restore_cursor()

    # -- costs bounded per operation --

    def erase_in_display(self, how: int = 0, *args: Any, **kwargs: Any) -> None:
        """ED: erase whole rows by replacing them (O(rows), where pyte rewrites every
        cell). ED 3 erases the scrollback only, as in xterm: we keep none."""
        if how == 0:
            rows = range(self.cursor.y + 1, self.lines)
        elif how == 1:
            rows = range(self.cursor.y)
        elif how == 2:
            rows = range(self.lines)
        else:
            return
        blank = self.cursor.attrs._replace(data=" ")
        for y in rows:
            self.buffer[y] = StaticDefaultDict[int, Char](blank)
        self.dirty.update(rows)
        if how in (0, 1):
            self.erase_in_line(how)

    def alignment_display(self) -> None:
        """DECALN: fill the screen with E (as rows whose every cell is E, O(rows))."""
        filled = self.default_char._replace(data="E")
        for y in range(self.lines):
            self.buffer[y] = StaticDefaultDict[int, Char](filled)
        self.dirty.update(range(self.lines))

    def save_cursor(self) -> None:
        """DECSC: one saved cursor, as in xterm (pyte keeps an unbounded stack)."""
        super().save_cursor()
        del self.savepoints[:-1]

    def resize(self, lines: int | None = None, columns: int | None = None) -> None:
        """Resize like xterm: when rows go, rows leave at the top only as far as needed
        to keep the cursor's row on screen (pyte always drops them at the top, leaving the
        cursor on another row); columns are cut at the right. Both screens are resized."""
        lines = lines or self.lines
        columns = columns or self.columns
        if lines == self.lines and columns == self.columns:
            return
        old_columns = self.columns
        shift = max(0, self.cursor.y - (lines - 1))
        self.buffer = self._fit(self.buffer, shift, lines, columns)
        self.cursor.y -= shift
        if self._saved_main is not None:
            main, cursor = self._saved_main
            main_shift = 0 if cursor is None else max(0, cursor.y - (lines - 1))
            if cursor is not None:
                cursor.y -= main_shift
                cursor.x = min(cursor.x, columns - 1)
            self._saved_main = (self._fit(main, main_shift, lines, columns), cursor)
        self.lines, self.columns = lines, columns
        self.margins = None
        self.cursor.x = min(self.cursor.x, columns - 1)
        self.tabstops = {stop for stop in self.tabstops if stop < columns}
        if columns > old_columns:
            self.tabstops.update(range((old_columns // 8 + 1) * 8, columns, 8))
        self.dirty.update(range(lines))

    def _fit(self, buffer: _Buffer, shift: int, lines: int, columns: int) -> _Buffer:
        fitted = self._blank_buffer()
        for y, line in buffer.items():
            if 0 <= y - shift < lines:
                if line and max(line) >= columns:  # only rows that reach past the edge
                    for x in [x for x in line if x >= columns]:
                        del line[x]
                fitted[y - shift] = line
        return fitted


# The parser's state as `_Stream` tracks it, beside pyte's own (hidden in a generator).
_GROUND, _ESCAPE, _CSI, _DISCARD, _OTHER, _STRING, _STRING_ESC = range(7)
# In a control sequence, pyte takes any of these for the final byte and then draws the
# real final byte and what follows as text: intermediates (CSI ! p, CSI 2 SP q), colon
# sub-parameters (CSI 4:3 m) and the private markers < = > (CSI > 4;2 m, CSI < u).
_CSI_DISCARD = frozenset(" !\"#$%&'()*+,-./:<=>")
_STRING_INTRODUCERS = frozenset("P_^X")  # DCS, APC, PM, SOS: ESC <one of these> ... ST


class _Stream(pyte.Stream):
    """pyte's parser, made tolerant: what it cannot handle is dropped, never drawn.

    pyte has no DCS/APC/PM/SOS strings (it would draw a DCS query's or an inline image's
    payload as text), misreads sequences with intermediate bytes, and re-raises when a
    handler refuses its parameters (losing the rest of the text being fed). A shadow
    state of the parser, updated with every character pyte is sent one at a time (only
    inside sequences: text goes to `draw` in runs), lets us skip those sequences.
    """

    # Sequences pyte does not map: SU/SD (ncurses scrolls with them), HPA with its
    # ECMA-48 final, REP (ncurses repeats characters with it), SCOSC/SCORC.
    csi = {
        **pyte.Stream.csi,
        "S": "scroll_up",
        "T": "scroll_down",
        "`": "cursor_to_column",
        "b": "repeat_last",
        "s": "ansi_save_cursor",
        "u": "ansi_restore_cursor",
    }

    def __init__(self, screen: _Screen) -> None:
        self._state = _GROUND
        self._sequence_length = 0
        super().__init__(screen)
        # Our decoder turns bytes into text; pyte's `use_utf8` would only make it ignore
        # charset selection (ESC ( 0, SO/SI), which xterm honours for line drawing.
        self.use_utf8 = False

    def restart(self) -> None:
        """Forget any partly parsed sequence (the stream was cut)."""
        self._initialize_parser()
        self._state = _GROUND
        self._sequence_length = 0

    def _send(self, char: str) -> bool | None:
        try:
            return super()._send_to_parser(char)
        except Exception:
            # A handler refused its parameters (CSI 1;2;3 A, a private flag it does not
            # take). pyte has restarted its parser, in the ground state; xterm would
            # ignore the sequence the same way.
            return True

    def _send_to_parser(self, data: str) -> bool | None:
        state = self._state
        if state >= _STRING:
            return self._in_string(data)
        if state == _DISCARD:
            return self._in_discarded_sequence(data)
        if state == _CSI and data in _CSI_DISCARD:
            self._state = _DISCARD
            return None
        if state == _ESCAPE and data in _STRING_INTRODUCERS:
            self._send("\x18")  # CAN: pyte leaves its escape state, drawing nothing
            self._state = _STRING
            return None
        ground = self._send(data)
        if ground:
            self._state = _GROUND
            self._sequence_length = 0
            return ground
        if state == _GROUND:
            self._state = _ESCAPE if data == "\x1b" else _CSI if data == "\x9b" else _OTHER
        elif state == _ESCAPE:
            self._state = _CSI if data == "[" else _OTHER
        return self._count_sequence_char()

    def _count_sequence_char(self) -> bool | None:
        self._sequence_length += 1
        if self._sequence_length > _MAX_SEQUENCE_CHARS:
            # An unterminated OSC would swallow all later output and grow without bound
            # inside pyte's parser: give up on it.
            self.restart()
            return True
        return None

    def _in_discarded_sequence(self, char: str) -> bool | None:
        code = ord(char)
        if 0x40 <= code <= 0x7E:  # the final byte: end pyte's sequence without effect
            self._send("\x18")
            self._state = _GROUND
            self._sequence_length = 0
            return True
        if char == "\x1b":  # a new sequence starts: abandon this one
            self._send("\x18")
            self._state = _GROUND
            return self._send_to_parser(char)
        if code < 0x20:  # controls act inside a sequence (CAN and SUB end it)
            if self._send(char):
                self._state = _GROUND
                return True
            return None
        return self._count_sequence_char()

    def _in_string(self, char: str) -> bool | None:
        # A string's payload is skipped without any cost but this call: no length limit.
        if self._state == _STRING_ESC:
            self._state = _GROUND
            if char == "\\":  # ST
                return True
            self._send_to_parser("\x1b")  # ESC + anything else starts a new sequence
            return self._send_to_parser(char)
        if char == "\x1b":
            self._state = _STRING_ESC
        elif char in "\x18\x1a\x9c":  # CAN, SUB abort it; C1 ST ends it
            self._state = _GROUND
            return True
        return None
