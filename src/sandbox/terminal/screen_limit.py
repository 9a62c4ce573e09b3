"""The largest screen the emulator renders: `MAX_SCREEN_CELLS` (rows x cols).

A terminal may be up to 1000 x 1000 (`arguments.MAX_TERMINAL_SIDE`), but the emulator
(pure Python) needs seconds for a screenful of a million cells, and no model reads one.
So a screen is rendered only while its terminal has at most 250,000 cells (500 x 500,
or 250 x 1000). Above that, the process runs as usual and its output is returned as
usual, but the screen is off: `pty_screen()` and `until_screen` raise
`ScreenTooLargeError` saying so, and what the process prints meanwhile is not emulated
(counted in `skipped_bytes`). Once the terminal is resized within the bound, the screen
starts again from a blank one at the new size (a full-screen program redraws after the
SIGWINCH of that resize; a shell's next lines appear as they come).
"""

from __future__ import annotations

from ..errors import UnsupportedOperationError

MAX_SCREEN_CELLS = 250_000


class ScreenTooLargeError(UnsupportedOperationError):
    """The terminal has more cells than a screen is rendered for (`MAX_SCREEN_CELLS`)."""


def too_large(rows: int, cols: int) -> bool:
    """Whether a `rows` x `cols` terminal is past what a screen is rendered for."""
    return rows * cols > MAX_SCREEN_CELLS


def check_screen_cells(rows: int, cols: int) -> None:
    """Raise `ScreenTooLargeError` for a terminal past the bound, saying what to do."""
    if too_large(rows, cols):
        raise ScreenTooLargeError(
            f"the terminal is {rows}x{cols} = {rows * cols:,} cells; screens are rendered "
            f"for at most {MAX_SCREEN_CELLS:,} cells (e.g. 500x500): resize it smaller "
            "(pty_resize) to get a screen again"
        )
