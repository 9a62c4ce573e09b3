"""The size of a terminal: one rule for rows and columns on every backend.

A leaf (it imports only `sandbox.errors`), so the screen, the recorder and the argument
checks can all use it without importing one another.
"""

from __future__ import annotations

from ..errors import InvalidArgumentError

# Rows and columns accepted for a terminal, on every backend: more than any real display
# shows (a 4K monitor at a 6-pixel font is 640 columns by 270 rows), while a screen's
# cost (memory, emulation per line, a snapshot's text) stays bounded at 1000 x 1000
# cells (docs/contract.md, "Screens").
MAX_TERMINAL_SIDE = 1000


def check_terminal_size(rows: int, cols: int) -> tuple[int, int]:
    """Rows and columns must be ints in [1, MAX_TERMINAL_SIDE]."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(f"{name} must be an int, not {value!r}")
        if not 1 <= value <= MAX_TERMINAL_SIDE:
            raise InvalidArgumentError(
                f"{name} must be between 1 and {MAX_TERMINAL_SIDE}, got {value}"
            )
    return rows, cols
