"""A real program on a real PTY, its raw output fed to a `TerminalScreen` in random pieces.

The session API hands out decoded text; the screen is meant to be fed raw bytes as the
reader gets them, split anywhere. This harness reads the PTY master itself, so the
screen sees exactly what a terminal would, cut at random points (seeded: a failure is
reproducible), with `process()` calls at random points in between.
"""

from __future__ import annotations

import fcntl
import os
import random
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Sequence

from sandbox.terminal.screen import ScreenSnapshot, TerminalScreen

WAIT_S = 30.0  # generous: the machine running the tests may be loaded

# A curses program with colours, the alternate screen, a title (set before curses starts)
# and a line of wide characters; it waits for a key.
CURSES_PROGRAM = """
import curses, locale, sys
locale.setlocale(locale.LC_ALL, "")
sys.stdout.write("\\x1b]2;curses demo title\\x07")
sys.stdout.flush()

def main(window):
    curses.start_color()
    curses.use_default_colors()
    curses.init_pair(1, curses.COLOR_RED, -1)
    curses.init_pair(2, curses.COLOR_WHITE, curses.COLOR_BLUE)
    window.addstr(0, 0, "Curses demo", curses.color_pair(1) | curses.A_BOLD)
    window.addstr(2, 2, "wide: 漢字テスト 🙂 ok", curses.color_pair(2))
    window.addstr(4, 0, "-" * 30)
    window.addstr(6, 4, "press a key> ")
    window.refresh()
    window.getch()

curses.wrapper(main)
print("curses finished")
"""


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtyProgram:
    """Runs `argv` as the session leader of a new PTY of `rows` x `cols`."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        rows: int = 24,
        cols: int = 80,
        env: dict[str, str] | None = None,
        seed: int = 0,
        on_output: Callable[[bytes], None] | None = None,
    ) -> None:
        self.master, slave = os.openpty()
        _set_size(slave, rows, cols)
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": cwd,
        }
        environment.update(env or {})
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=environment,
                start_new_session=True,
                # The PTY must be the controlling terminal: less and vim read keys from
                # /dev/tty, and ^C must reach the foreground group.
                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
            )
        finally:
            os.close(slave)
        self.screen = TerminalScreen(rows, cols)
        self.raw = bytearray()
        self.eof = False
        self._rng = random.Random(seed)
        self._on_output = on_output

    def write(self, keys: str | bytes) -> None:
        """Type `keys` (str is UTF-8 encoded)."""
        os.write(self.master, keys.encode() if isinstance(keys, str) else keys)

    def _read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every process holding the slave is gone
            data = b""
        if not data:
            self.eof = True
            return
        self.raw += data
        if self._on_output is not None:
            self._on_output(data)
        start = 0
        while start < len(data):
            end = start + self._rng.randint(1, 64)
            self.screen.feed(data[start:end])
            start = end
            if self._rng.random() < 0.3:
                self.screen.process()
        while not self.screen.process():
            pass

    def wait_for(
        self, predicate: Callable[[ScreenSnapshot], bool], timeout: float = WAIT_S
    ) -> ScreenSnapshot:
        """Read output until the screen satisfies `predicate` (fails on timeout or EOF)."""
        deadline = time.monotonic() + timeout
        while True:
            snap = self.screen.snapshot()
            if predicate(snap):
                return snap
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                why = "the program exited" if self.eof else f"{timeout} s passed"
                raise AssertionError(f"{why}; the screen shows:\n{snap.text('█')}")
            self._read(min(left, 1.0))

    def wait_exit(self, timeout: float = WAIT_S) -> int:
        """Read output until EOF, then reap the program; returns its exit status."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                shown = self.screen.snapshot().text("█")
                raise AssertionError(f"no exit; the screen shows:\n{shown}")
            self._read(min(left, 1.0))
        return self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))

    def replayed(self) -> ScreenSnapshot:
        """The snapshot of a fresh screen of the same size fed all the output at once
        (for programs never resized): how reads were split must not change the screen."""
        snap = self.screen.snapshot()
        screen = TerminalScreen(snap.rows, snap.cols, max_pending=len(self.raw) + 1)
        screen.feed(bytes(self.raw))
        while not screen.process():
            pass
        return screen.snapshot()

    def close(self) -> None:
        """Kill the program's process group, reap it and close the master."""
        if self.proc.poll() is None:  # once reaped, its pid (= group id) may be reused
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=WAIT_S)
        os.close(self.master)
