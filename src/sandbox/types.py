"""Plain result types returned by the public API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the emulator (pyte) is imported only when a screen is made
    from .terminal.screen import ScreenSnapshot


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of a one-shot `exec`: its captured streams and exit code.

    A process killed by signal N reports `exit_code` 128+N.

    Each stream is bounded (`max_output_bytes`, default 16 MiB per stream): beyond the
    bound, the first half of it and a rolling tail of the other half are kept, and
    `stdout_omitted` / `stderr_omitted` count the bytes dropped in between. When they
    are non-zero, `stdout[:limit // 2]` is the head and the rest the tail.
    """

    stdout: bytes
    stderr: bytes
    exit_code: int
    stdout_omitted: int = 0
    stderr_omitted: int = 0

    @property
    def ok(self) -> bool:
        """True when the command exited with code 0."""
        return self.exit_code == 0


@dataclass(frozen=True, slots=True)
class PtyUpdate:
    """What one collection window saw of a process.

    `process_id` is None once the process has exited (it has then left the registry);
    `exit_code` is set once it exited (None if it is still running, or if the provider
    lost it without an exit status); `original_token_count` is set only when `output`
    was truncated to `max_output_tokens`. `screen` is the rendered screen at the end of
    the window, set only when the call waited with `until_screen`.
    """

    process_id: int | None
    output: str
    exit_code: int | None
    original_token_count: int | None = None
    unwritten_bytes: int = 0
    screen: ScreenSnapshot | None = None


@dataclass(frozen=True, slots=True)
class PtyProcessInfo:
    """A snapshot of one registered process, as listed by `pty_processes()`.

    `started_at` and `last_used` are wall-clock UNIX timestamps. `has_screen` says
    whether `pty_screen()` can show its terminal.
    """

    process_id: int
    command: str
    tty: bool
    running: bool
    exit_code: int | None
    started_at: float
    last_used: float
    has_screen: bool = False
