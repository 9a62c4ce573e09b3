"""One registered process: its output buffer, exit state and the backend's handle.

A backend's reader only ever calls `feed()`, `report_exit()`, `report_eof()` and
`report_lost()` (always on the event loop's thread). The base session's collection
windows wait on the entry with `wait_for_change()`; the entry wakes a waiter only for
what it asked for, so a reader that streams megabytes does not wake a window that only
waits for the deadline or the exit.

A tty entry started with a screen (the default) also feeds every chunk to its
`TerminalScreen` (a bounded tail of raw bytes: nothing is emulated on the reader's path)
and, if recorded, to its `AsciicastRecorder`. The emulator runs only when a screen is
asked for (`pty_screen`, an `until_screen` window), so a flood nobody looks at costs a
list append per read. `close_terminal()` (from the teardown) closes the recording.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol

from .output.buffer import DEFAULT_OUTPUT_LIMIT, BoundedOutput

if TYPE_CHECKING:
    from .terminal.recording import AsciicastRecorder
    from .terminal.screen import TerminalScreen
from .output.decoding import StreamDecoder


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """A command as the caller asked for it, in both shapes a backend may need.

    `argv` is what to execute (for `shell=True` it is `["sh", "-c", shell_command]`);
    `shell_command` is the same command as one POSIX shell string, for providers that
    only take a string. `display` is how it is shown in `pty_processes()`.
    """

    argv: tuple[str, ...]
    shell_command: str
    display: str
    shell: bool
    env: dict[str, str] | None = None
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """A `CommandSpec` plus the terminal settings of a `pty_exec_start`.

    `screen` says whether the base session keeps a rendered screen of the terminal (only
    ever True with `tty`). `stdin` says whether a process on pipes keeps its stdin open
    (`pty_write_stdin` writes to it, `pty_close_stdin` ends it); only ever True without
    `tty` (a terminal always takes input). It lives here, not in `CommandSpec`, because
    a one-shot command never has an open stdin.
    """

    command: CommandSpec
    tty: bool
    rows: int
    cols: int
    screen: bool = False
    stdin: bool = False


# How long a window waits, after a process's exit is known, for the end of its output.
EXIT_DRAIN_GRACE_S = 0.05


# The type of a backend's own per-process state (`PtyEntry.handle`); Any for a backend
# that does not say (a TypeVar default keeps a bare `PtyEntry` valid under mypy strict).
if TYPE_CHECKING:
    # A default (PEP 696) for the type checker only: `import sandbox` needs nothing
    # beyond the standard library at run time.
    from typing_extensions import TypeVar

    H = TypeVar("H", default=Any)
else:
    from typing import TypeVar

    H = TypeVar("H")


@dataclass(eq=False)
class PtyEntry(Generic[H]):
    """A process in the registry (or being started, or being torn down).

    `handle` is the backend's own state for the process; the base session never looks
    inside it. Everything else belongs to the base session, apart from the four
    `report`/`feed` methods a backend calls.
    """

    process_id: int
    spec: ProcessSpec
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    handle: H | None = None
    started_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    last_used_mono: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    exited: bool = False
    exited_at: float | None = None
    eof: bool = False
    lost_reason: str | None = None
    removed: bool = False
    # How many writes wait for `call_lock` now: while any does, every poll window of the
    # entry ends at once, so keystrokes never wait behind a poll (`call_turn`).
    writers_waiting: int = 0
    # Set by the base session: the in-flight spawn and write (a close or terminate
    # cancels them), and how many bytes of the current write the terminal took (a
    # backend that writes in parts may count them here; see `count_input`).
    # Set by the base session when the entry is torn down because the whole sandbox is
    # going away (the close): a backend may then skip per-process kills the sandbox's
    # own deletion makes moot. Backends read this, never the session's state.
    sandbox_stopping: bool = False
    spawn_task: asyncio.Future[None] | None = None
    write_task: asyncio.Future[None] | None = None
    input_accepted: int = 0
    # Set by the base session for a process started with `stdin=True`: `stdin_ended`
    # once `pty_close_stdin` was asked (no write is accepted from then on),
    # `stdin_closed` once the backend's `_close_stdin` completed (a second close is then
    # a no-op; one whose first was cancelled half-way calls the hook again).
    stdin_ended: bool = False
    stdin_closed: bool = False
    # Set by the base session after the reservation, before the spawn.
    recorder: AsciicastRecorder | None = None

    def __post_init__(self) -> None:
        self.output = BoundedOutput(self.output_limit)
        self.decoder = StreamDecoder()
        self.call_lock = asyncio.Lock()
        self._waiter: asyncio.Future[None] | None = None
        self._waiter_wants_data = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.screen: TerminalScreen | None = None
        if self.spec.tty and self.spec.screen:
            # Imported here: `screen` imports `arguments`, which imports this module.
            from .terminal.screen import TerminalScreen

            self.screen = TerminalScreen(self.spec.rows, self.spec.cols)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the entry's calls run in, looked up once: on Linux
        `asyncio.get_running_loop()` makes a `getpid` system call each time, several
        times a round trip otherwise."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    # ---- what a backend calls -------------------------------------------------------

    def require_handle(self) -> H:
        """The backend's handle, for a hook that runs only after the spawn stored it
        (write, resize, interrupt, drain); a teardown must cope with None instead."""
        handle = self.handle
        if handle is None:
            raise RuntimeError(f"process {self.process_id} has no backend handle yet")
        return handle

    @property
    def tty(self) -> bool:
        """Whether the process runs on a terminal (else on pipes, stdin closed unless
        `stdin_open`)."""
        return self.spec.tty

    @property
    def stdin_open(self) -> bool:
        """Whether the process runs on pipes with its stdin open (`stdin=True`): the
        spawn keeps a way to write to it and to end it (`_close_stdin`)."""
        return self.spec.stdin

    @property
    def running(self) -> bool:
        """True until the process's exit (or loss) has been reported."""
        return not self.exited

    def feed(self, data: bytes) -> None:
        """Append output bytes (stdout and stderr alike, in arrival order)."""
        if data:
            self.output.append(data)
            if self.screen is not None:
                self.screen.feed(data)
            if self.recorder is not None:
                self.recorder.output(data)
            if self._waiter_wants_data:
                self._wake()

    def report_exit(self, exit_code: int) -> None:
        """Record the process's exit status (128+N for a death by signal N). Idempotent."""
        if not self.exited:
            self.exited = True
            self.exit_code = exit_code
            self.exited_at = time.monotonic()
            self._wake()

    def report_eof(self) -> None:
        """Record that no more output will come (the stream closed)."""
        if not self.eof:
            self.eof = True
            self._wake()

    def report_lost(self, reason: str) -> None:
        """End the process without an exit status: the provider connection dropped.

        The reason is appended to the output so the reader of the next window sees it.
        It must not contain secrets.
        """
        if self.exited:
            return
        self.lost_reason = reason
        self.feed(f"\n[sandbox: process lost: {reason}]\n".encode())
        self.exited = True
        self.exited_at = time.monotonic()
        self.eof = True
        self._wake()

    def count_input(self, accepted: int) -> None:
        """Record that the terminal took `accepted` more bytes of the current write (so a
        write cut short at its window can say how much was not written)."""
        self.input_accepted += accepted

    # ---- what the base session uses -------------------------------------------------

    def report_torn_down(self) -> None:
        """Mark the entry finished after its teardown (exit status unknown if it was
        never reported), waking any window still waiting on it."""
        if not self.exited:
            self.exited = True
            self.exited_at = time.monotonic()
        self.eof = True
        self._wake()

    def call_turn(self, *, write: bool) -> CallTurn:
        """`async with entry.call_turn(write=...)`: hold `call_lock` for one call. A write
        counts itself in `writers_waiting` (and wakes a poll in progress) for as long as
        it waits, so a poll that holds the lock or takes it meanwhile ends its window at
        once, whichever came first; the lock is FIFO, so without that a write queued
        behind a poll would wait out the poll's whole window."""
        return CallTurn(self, write)

    def record_input(self, data: bytes) -> None:
        """Record keystrokes sent to the terminal (kept only if the recording asked)."""
        if self.recorder is not None:
            self.recorder.input(data)

    def resize_terminal(self, rows: int, cols: int) -> None:
        """Follow a resize of the terminal in the screen and the recording."""
        if self.screen is not None:
            self.screen.resize(rows, cols)
        if self.recorder is not None:
            self.recorder.resize(rows, cols)

    def close_terminal(self) -> None:
        """Close the recording (the teardown calls it once the backend's readers are
        stopped). The screen stays readable."""
        if self.recorder is not None:
            self.recorder.close()

    def touch(self) -> None:
        """Mark the entry as used now (for the prune rule and `pty_processes()`)."""
        self.last_used = time.time()
        self.last_used_mono = time.monotonic()

    @property
    def fed_position(self) -> int:
        """How many bytes were fed so far (an absolute position in the output)."""
        return self.output.end_pos

    @property
    def returned_position(self) -> int:
        """How many bytes of the output the client has been returned (or dropped past
        the bound): the absolute position the next window starts at."""
        return self.output.start_pos

    @property
    def output_done(self) -> bool:
        """Exited, and either the output ended or the drain grace after exit elapsed."""
        if not self.exited:
            return False
        if self.eof:
            return True
        assert self.exited_at is not None
        return time.monotonic() >= self.exited_at + EXIT_DRAIN_GRACE_S

    async def wait_for_change(self, deadline: float, *, wants_data: bool) -> None:
        """Sleep until the loop time `deadline`, an exit/EOF report, or (if `wants_data`)
        new output. Only one waiter at a time: calls on one entry are serialized."""
        loop = self.loop
        if self.exited and not self.eof:
            deadline = min(deadline, self._exit_grace_loop_deadline(loop))
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        self._waiter_wants_data = wants_data
        timer = loop.call_at(deadline, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if self._waiter is waiter:
                self._waiter = None
                self._waiter_wants_data = False

    def _exit_grace_loop_deadline(self, loop: asyncio.AbstractEventLoop) -> float:
        assert self.exited_at is not None
        return loop.time() + max(0.0, self.exited_at + EXIT_DRAIN_GRACE_S - time.monotonic())

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            self._waiter_wants_data = False
            _resolve(waiter)


class CallTurn:
    """The async context of `PtyEntry.call_turn`: `call_lock` held, taken by a write
    counted in `writers_waiting` while it waits (a cancelled wait uncounts it too)."""

    __slots__ = ("_entry", "_write")

    def __init__(self, entry: PtyEntry[Any], write: bool) -> None:
        self._entry = entry
        self._write = write

    async def __aenter__(self) -> None:
        entry = self._entry
        if not self._write:
            await entry.call_lock.acquire()
            return
        entry.writers_waiting += 1
        entry._wake()
        try:
            await entry.call_lock.acquire()
        finally:
            entry.writers_waiting -= 1

    async def __aexit__(self, *exc_info: object) -> None:
        self._entry.call_lock.release()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class OutputSink(Protocol[H]):
    """All a backend sees of a process's record: what it may tell (`feed`,
    `report_exit`, `report_eof`, `report_lost`, `count_input`), what it was asked to
    start (`spec`, `process_id`), its own state (`handle`), and the few facts of the
    record a backend may read. Every hook and capability takes this, never `PtyEntry`
    (the session's record, with its locks, tasks and windows).

    The record satisfies it structurally and is passed as it is: a separate object in
    front of it would cost an attribute lookup more on `feed`, the call made per chunk
    of output, for what the type checker already enforces (mypy strict runs on every
    backend; tests/meta/test_hooks_contract.py keeps `PtyEntry` out of the backends).
    """

    # The backend's own per-process state, set by its spawn (the base never reads it).
    handle: H | None

    @property
    def process_id(self) -> int:
        """The process's id in the session (never reused by it)."""

    @property
    def spec(self) -> ProcessSpec:
        """What to start: the command and the terminal settings."""

    @property
    def tty(self) -> bool:
        """Whether the process runs on a terminal."""

    @property
    def stdin_open(self) -> bool:
        """Whether a process on pipes keeps its stdin open (`stdin=True`)."""

    @property
    def output_limit(self) -> int:
        """The bound of the process's output buffer (a backend's own ring may follow it)."""

    @property
    def sandbox_stopping(self) -> bool:
        """Set on a teardown because the whole sandbox is going away (the close)."""

    @property
    def exited(self) -> bool:
        """Whether the process's exit (or loss) has been reported."""

    @property
    def lost_reason(self) -> str | None:
        """Why the process was reported lost, if it was."""

    @property
    def output_done(self) -> bool:
        """Exited, and the output ended (or the drain grace after the exit elapsed)."""

    @property
    def fed_position(self) -> int:
        """How many bytes were fed so far."""

    @property
    def returned_position(self) -> int:
        """How many bytes of the output the client has been returned."""

    def require_handle(self) -> H:
        """The backend's handle; raises when the spawn has not stored one yet."""

    def feed(self, data: bytes) -> None:
        """Append output bytes (stdout and stderr alike, in arrival order)."""

    def report_exit(self, exit_code: int) -> None:
        """Record the process's exit status (128+N for a death by signal N)."""

    def report_eof(self) -> None:
        """Record that no more output will come."""

    def report_lost(self, reason: str) -> None:
        """End the process without an exit status (no secret in `reason`)."""

    def count_input(self, accepted: int) -> None:
        """Record that the terminal took `accepted` more bytes of the current write."""

    async def wait_for_change(self, deadline: float, *, wants_data: bool) -> None:
        """Sleep until the loop time `deadline`, an exit/EOF report, or new output."""
