"""`BaseSandboxSession`: lifecycle, one-shot exec, the PTY API and the process registry.

Everything that is the same for every provider lives here: the registry and its lock,
id reservation and pruning, collection windows (bounded output, incremental UTF-8,
`until`, token truncation), and the settled cleanup through which every teardown goes.
A backend subclass implements only the hooks in the "backend hooks" section below; it
never touches the registry or the lock, and never awaits a teardown itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import os
import re
import secrets
import warnings
from collections.abc import AsyncIterable, AsyncIterator, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar

from . import arguments
from . import file_arguments as files
from .durable import ops as durable_ops
from .durable.lease import LeaseStore
from .durable.refs import SessionRef
from .durable.state import DurableState
from .errors import (
    CleanupError,
    ExecTimeoutError,
    FileTooLargeError,
    HostPathError,
    InvalidArgumentError,
    ProcessExitedError,
    PtyProcessNotFoundError,
    SandboxError,
    SessionClosedError,
    SessionNotStartedError,
    SessionStateError,
    StdinClosedError,
    UnsupportedOperationError,
)
from .exec_output import DEFAULT_EXEC_OUTPUT_LIMIT, ExecCapture, OneShotProcess
from .host_files import HostDirectory
from .output_buffer import DEFAULT_OUTPUT_LIMIT
from .process_entry import CommandSpec, H, ProcessSpec, PtyEntry
from .recording import AsciicastRecorder
from .settle import DEFAULT_BATCH_CONCURRENCY, attempt_all, settle
from .truncation import truncate_to_tokens
from .types import ExecResult, PtyProcessInfo, PtyUpdate
from .until_match import UntilMatcher, UntilPattern, check_until

if TYPE_CHECKING:  # the emulator (pyte) is imported only when a screen is made
    from .screen import ScreenSnapshot

logger = logging.getLogger("sandbox")

MAX_PROCESSES = 64
WARN_PROCESSES = 60
# One turn of a screen's emulation or rendering (`pty_screen`, an `until_screen` check)
# works at most about this long before yielding to the event loop.
SCREEN_CHECK_SLICE_S = 0.005
PROTECTED_RECENT = 8
ID_RANGE = (1000, 100_000)
# Ids tried for a free `<id>.cast` name in `record_dir` before one is taken anyway (its
# recording is then refused): a folder full of old recordings must not hang a start.
RECORD_NAME_TRIES = 256
PRUNED_MEMORY = 256  # how many pruned ids an error can still explain

T = TypeVar("T")


def _record_name(process_id: int) -> str:
    """The name of a process's recording in `record_dir`."""
    return f"{process_id}.cast"


async def _kill_noting(process: OneShotProcess, error: BaseException | list[str]) -> None:
    """Kill a one-shot command (settled) on the way out with `error`: a kill that fails
    is noted on `error` (or appended to a list of notes), which stays the one raised
    (it says what happened first)."""
    try:
        await settle(process.kill())
    except Exception as kill_error:
        note = f"killing the command's tree also failed: {kill_error}"
        if isinstance(error, list):
            error.append(note)
        else:
            error.add_note(note)


async def _killed_at_timeout(
    process: OneShotProcess, capture: ExecCapture, display: str, timeout: float | None
) -> ExecTimeoutError:
    """Kill a timed-out one-shot command (settled), then the `ExecTimeoutError` with what
    it printed, the kill's own output collection included, and a note if the kill failed."""
    notes: list[str] = []
    await _kill_noting(process, notes)
    error = capture.timeout_error(display, timeout)
    for note in notes:
        error.add_note(note)
    return error


async def _finished(task: asyncio.Future[Any]) -> None:
    """Wait until `task` is done, without taking over its result or exception."""
    await asyncio.wait({task})


def _screen_matches(pattern: UntilPattern, snapshot: ScreenSnapshot) -> bool:
    text = snapshot.text()
    if isinstance(pattern, re.Pattern):
        return pattern.search(text) is not None
    return pattern in text


class SessionState(enum.Enum):
    """Where a session is in its life."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class BaseSandboxSession(Generic[H]):
    """A sandbox session: start it, run commands and PTYs in it, close it.

    Use it as `async with session:` (or call `start()` and `aclose()`). Closing tears
    down every process and the sandbox itself (unless the backend was told to keep it),
    also when the closing task is cancelled.

    `record_dir`: record every tty process to `<record_dir>/<process_id>.cast`
    (asciicast v2) unless its `pty_exec_start` names its own `record` file. The folder
    is opened once, by `start()` (before the sandbox runs anything), and each recording
    is created new relative to it (`sandbox.host_files`); ids are picked so that their
    name is free in it, and one that is taken anyway fails the start (`HostPathError`).
    """

    backend_name: ClassVar[str] = "base"

    def __init__(
        self,
        *,
        max_processes: int = MAX_PROCESSES,
        output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT,
        teardown_concurrency: int = DEFAULT_BATCH_CONCURRENCY,
        read_limit_bytes: int = files.DEFAULT_READ_LIMIT,
        exec_output_limit_bytes: int = DEFAULT_EXEC_OUTPUT_LIMIT,
        record_dir: str | os.PathLike[str] | None = None,
        ref_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if record_dir is not None and not isinstance(record_dir, str | os.PathLike):
            raise InvalidArgumentError(f"record_dir must be a path, not {record_dir!r}")
        self.record_dir = None if record_dir is None else os.fspath(record_dir)
        for name, value, least in (
            ("max_processes", max_processes, PROTECTED_RECENT + 1),
            ("output_limit_bytes", output_limit_bytes, 1024),
            ("teardown_concurrency", teardown_concurrency, 1),
        ):
            # Checked here, not at teardown: a bad option must fail when it is given.
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"{name} must be an int, not {value!r}")
            if value < least:
                raise InvalidArgumentError(f"{name} must be at least {least}, not {value}")
        self.max_processes = max_processes
        self.warn_processes = max(1, max_processes - (MAX_PROCESSES - WARN_PROCESSES))
        self.output_limit_bytes = output_limit_bytes
        self.teardown_concurrency = teardown_concurrency
        self.read_limit_bytes = files.check_byte_count(read_limit_bytes, "read_limit_bytes")
        # Per stream, for one-shot `exec` (head + tail kept, see `sandbox.exec_output`).
        self.exec_output_limit_bytes = arguments.check_output_limit(
            "exec_output_limit_bytes", exec_output_limit_bytes
        )
        self._state = SessionState.NEW
        # Ownership: a process entry belongs to whoever holds it in one of these (the
        # registry: the session; `_starting`: the `pty_exec_start` call spawning it) and
        # passes to a teardown by being popped from it, in one step on the loop thread.
        self._registry: dict[int, PtyEntry[H]] = {}
        self._starting: dict[int, PtyEntry[H]] = {}
        self._retiring: set[int] = set()  # ids being torn down: not reusable, no slot
        self._pruned: dict[int, str] = {}  # recent prune victims, for clear errors
        self._lock = asyncio.Lock()
        self._lifecycle_start: asyncio.Task[None] | None = None
        self._execs: set[asyncio.Task[Any]] = set()
        self._teardowns: set[asyncio.Task[None]] = set()
        self._closing: asyncio.Future[Any] | None = None
        # `record_dir`'s fd: opened by `start()`, closed by a failed start or the close.
        self._record_directory: HostDirectory | None = None
        # Refs, the lease and the ref file (`sandbox.durable`); the file's folder is
        # opened now, before the sandbox runs anything.
        if ref_file is not None and type(self)._ref_sandbox is BaseSandboxSession._ref_sandbox:
            raise UnsupportedOperationError(
                f"ref_file: the {self.backend_name} backend cannot detach or resume sessions"
            )
        self._durable = DurableState(ref_file)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} backend={self.backend_name!r} state={self._state.value} "
            f"processes={len(self._registry)}>"
        )

    # ---- lifecycle -----------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        """The session's lifecycle state."""
        return self._state

    async def start(self) -> None:
        """Start the sandbox. A no-op when already running.

        If starting fails or is cancelled, whatever was half-created is torn down
        (settled) before the error propagates, and the session can be started again.
        If `aclose()` is called meanwhile, the start is cancelled, the close tears down
        whatever it made, and this raises `SessionClosedError`.
        """
        if self._state is SessionState.RUNNING:
            return
        if self._state in (SessionState.CLOSING, SessionState.CLOSED):
            raise SessionClosedError(f"the {self.backend_name} session is closed")
        if self._state is SessionState.STARTING:
            raise SessionStateError("start() is already in progress")
        if self.record_dir is not None and self._record_directory is None:
            # Opened now, its symlinks followed as the caller named them: no sandboxed
            # process has run yet, and later swaps of the path cannot redirect the fd.
            self._record_directory = HostDirectory.open(self.record_dir, what="record to")
        self._state = SessionState.STARTING
        task = asyncio.ensure_future(self._run_start())
        self._lifecycle_start = task
        try:
            await self._await_owned(task)
        except BaseException as exc:
            if self._state is SessionState.STARTING:
                if task.done() and not task.cancelled() and task.exception() is None:
                    # The backend came up just as our caller was cancelled: undo it.
                    try:
                        await settle(self._durable_undo_start())
                    except Exception as cleanup_exc:
                        exc.add_note(f"stopping the started backend failed: {cleanup_exc}")
                self._state = SessionState.NEW
                self._close_record_directory()
            raise
        finally:
            if self._lifecycle_start is task:
                self._lifecycle_start = None
        if self._state is not SessionState.STARTING:
            # The close came after the backend was up: it stops the backend, we lost.
            raise SessionClosedError(f"the {self.backend_name} session was closed while starting")
        self._state = SessionState.RUNNING
        durable_ops.changed(self)

    async def _run_start(self) -> None:
        try:
            if self._durable.resuming:
                await durable_ops.resume(self)
            else:
                await self._start_backend()
        except BaseException as exc:
            try:
                await settle(self._durable_undo_start())
            except Exception as cleanup_exc:
                exc.add_note(f"cleaning up the failed start also failed: {cleanup_exc}")
            raise

    async def aclose(self) -> None:
        """Cancel whatever is starting or running (a `start()`, one-shot commands, spawns),
        terminate every process, then stop the sandbox. Returns only when nothing is
        left. Idempotent; safe after a failed start; completes even if the caller is
        cancelled (then re-raises that). Several failures come back together as a
        `CleanupError`."""
        if self._state is SessionState.CLOSED:
            return
        if self._closing is not None:
            await settle(_finished(self._closing))
            return
        previous = self._state
        self._state = SessionState.CLOSING
        closing = asyncio.ensure_future(self._close_everything(previous))
        self._closing = closing
        try:
            await settle(closing)
        finally:
            self._state = SessionState.CLOSED

    async def _close_everything(self, previous: SessionState) -> None:
        errors: list[BaseException] = []
        backend_up = previous is SessionState.RUNNING
        start = self._lifecycle_start
        if previous is SessionState.STARTING and start is not None:
            start.cancel()  # the start's own failure path stops what it made
            await asyncio.wait({start})
            backend_up = not start.cancelled() and start.exception() is None
        # Calls in flight lose: their hooks see the cancellation and undo what they made.
        in_flight: list[asyncio.Future[Any]] = [*self._execs]
        in_flight += [e.spawn_task for e in self._starting.values() if e.spawn_task is not None]
        for task in in_flight:
            task.cancel()
        if in_flight:
            await asyncio.wait(in_flight)
        entries = [*self._starting.values(), *self._registry.values()]
        self._starting.clear()
        self._registry.clear()
        if backend_up and not await self._durable_claim_close(entries):
            return  # another client resumed the sandbox: it was only let go of
        for entry in entries:
            entry.sandbox_stopping = True
        try:
            await self._settle_batch(entries)
        except CleanupError as exc:
            errors.extend(exc.errors)
        except Exception as exc:
            errors.append(exc)
        # Teardowns other calls own (a terminate, a prune) finish before the backend stops.
        while self._teardowns:
            await asyncio.wait(list(self._teardowns))
        if backend_up:
            try:
                await self._stop_backend()
            except Exception as exc:
                errors.append(exc)
        self._close_record_directory()
        durable_ops.finish_ref_file(self, None)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise CleanupError(
                f"closing the {self.backend_name} session failed {len(errors)} ways: "
                + "; ".join(str(e) for e in errors),
                errors,
            )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _require_running(self) -> None:
        if self._durable.taken_over:
            raise durable_ops.taken_over_error(self)
        if self._state is SessionState.RUNNING:
            return
        if self._state in (SessionState.CLOSING, SessionState.CLOSED):
            raise SessionClosedError(f"the {self.backend_name} session is closed")
        raise SessionNotStartedError(
            f"the {self.backend_name} session is not started: use `async with session:` "
            "or await session.start()"
        )

    # ---- one-shot commands and files -----------------------------------------------

    async def exec(
        self,
        *command: str,
        timeout: float | None = None,
        shell: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run a command to completion and return its output and exit code.

        A non-zero exit is a result, not an error. When `timeout` expires the whole
        process tree is killed and `ExecTimeoutError` is raised.

        Each stream keeps at most `max_output_bytes` (default: the session's
        `exec_output_limit_bytes`, 16 MiB): its first half and a rolling tail, with
        `stdout_omitted` / `stderr_omitted` counting what was dropped in between.

        A `cwd` that is missing or not a directory raises `WorkdirError`; with
        `shell=False`, a program that does not exist or is not executable raises
        `CommandNotFoundError` (with `shell=True` that is the shell's exit 127).
        """
        self._require_running()
        await self._durable_guard()
        spec = arguments.build_command(command, shell=shell, env=env, cwd=cwd)
        checked_timeout = arguments.check_timeout(timeout)
        limit = (
            self.exec_output_limit_bytes
            if max_output_bytes is None
            else arguments.check_output_limit("max_output_bytes", max_output_bytes)
        )
        capture = ExecCapture(limit, timeout=checked_timeout)
        # The session owns the command: close cancels it (its hook kills the tree).
        return await self._run_owned(self._exec(spec, checked_timeout, capture), self._execs)

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a whole regular file from the sandbox (relative paths are in the workspace).

        A directory, FIFO, socket or device raises `NotAFileError` (nothing is opened
        that could block). A file above `max_bytes` (default: the session's
        `read_limit_bytes`, 64 MiB) raises `FileTooLargeError`, before it is read where
        the backend can tell its size; stream big files with `read_file_chunks`.
        """
        self._require_running()
        await self._durable_guard()
        path = files.check_path(path)
        limit = self.read_limit_bytes
        if max_bytes is not None:
            limit = files.check_byte_count(max_bytes, "max_bytes")
        data = await self._read_file(path, limit)
        if len(data) > limit:  # backends that cannot tell the size first
            raise FileTooLargeError.over(path, len(data), limit)
        return data

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a regular file in the sandbox (str is UTF-8 encoded), creating parent
        folders. Writing over a directory, FIFO, socket or device, or under a path whose
        parent is a file, raises `NotAFileError` and changes nothing."""
        self._require_running()
        await self._durable_guard()
        path = files.check_path(path)
        payload = arguments.to_input_bytes(data)
        await self._write_file(path, payload)

    def read_file_chunks(
        self, path: str, *, chunk_size: int = files.DEFAULT_CHUNK_SIZE
    ) -> AsyncIterator[bytes]:
        """Stream a regular file: `async for chunk in session.read_file_chunks(path)`.

        Chunks are at most `chunk_size` bytes (default 1 MiB). No size limit applies on
        backends that stream (unix_local, docker); elsewhere the whole file is fetched
        first, bounded by `read_limit_bytes`. Stop early with `contextlib.aclosing` so the
        file is closed at once. Same errors as `read_file`, raised by the first chunk.
        """
        self._require_running()
        path = files.check_path(path)
        size = files.check_chunk_size(chunk_size)
        return files.at_most(self._read_file_chunks(path, size), size)

    async def write_file_chunks(
        self,
        path: str,
        chunks: AsyncIterable[bytes | bytearray | memoryview | str]
        | Iterable[bytes | bytearray | memoryview | str],
    ) -> None:
        """Write a regular file from an iterable or async iterable of chunks (str is
        UTF-8 encoded), creating parent folders; same rules as `write_file`.

        unix_local and docker never hold the whole file (docker spools it to a temporary
        file first, as its archive needs the size up front); elsewhere the chunks are
        joined, then written. If `chunks` fails, its error propagates and the file may
        hold part of the data."""
        self._require_running()
        await self._durable_guard()
        path = files.check_path(path)
        await self._write_file_chunks(path, files.chunks_of(chunks, path))

    # ---- the PTY API ---------------------------------------------------------------

    async def pty_exec_start(
        self,
        *command: str,
        tty: bool = False,
        shell: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        rows: int = 24,
        cols: int = 80,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
        until: UntilPattern | None = None,
        until_screen: UntilPattern | None = None,
        screen: bool = True,
        record: str | os.PathLike[str] | None = None,
        record_input: bool = False,
    ) -> PtyUpdate:
        """Start a process (on a terminal if `tty`, else on pipes with stdin closed) and
        return what it printed within the first window.

        The window ends at `yield_time_s` (default 10 s), when the process exits, when
        `until` appears in the output, or when `until_screen` appears on the rendered
        screen. `process_id` is None in the result if it already exited. If this call is
        cancelled before it returns, the process is torn down: nobody would know its id.

        A tty process keeps a rendered screen (`pty_screen()`) unless `screen=False`;
        pipes never have one. `record` (or the session's `record_dir`) writes an
        asciicast v2 recording of a tty process, with the keystrokes if `record_input`,
        always to a new file: anything at its name, or a symlink on the way of a
        `record` path, fails the start with `HostPathError` (`sandbox.host_files`).
        """
        self._require_running()
        await self._durable_guard()
        if record is not None and not isinstance(record, str | os.PathLike):
            raise InvalidArgumentError(f"record must be a path, not {record!r}")
        spec = ProcessSpec(
            command=arguments.build_command(command, shell=shell, env=env, cwd=cwd),
            tty=bool(tty),
            rows=rows,
            cols=cols,
            screen=bool(tty) and bool(screen),
        )
        arguments.check_terminal_size(rows, cols)
        window = arguments.yield_window(yield_time_s, arguments.START_YIELD_S)
        max_tokens = arguments.check_max_tokens(max_output_tokens)
        pattern = check_until(until)
        screen_pattern = self._check_until_screen(until_screen, spec.screen)

        entry, victim = await self._reserve(spec, in_record_dir=spec.tty and record is None)
        try:
            if victim is not None:
                # A victim's failed teardown is not this start's failure: logged only.
                await self._settle_batch([victim], log_errors=True)
            if self._starting.get(entry.process_id) is not entry:
                raise self._closed_error()  # closed while the victim went
            if spec.tty:
                self._open_recording(entry, record, record_input)
            spawn = asyncio.ensure_future(self._spawn_process(entry))
            entry.spawn_task = spawn
            await self._await_owned(spawn)
        except BaseException as exc:
            if self._starting.pop(entry.process_id, None) is entry:  # still ours to undo
                entry.removed = True
                try:
                    await self._settle_batch([entry])
                except Exception as cleanup_exc:
                    exc.add_note(f"tearing down the failed start also failed: {cleanup_exc}")
            raise
        if self._starting.pop(entry.process_id, None) is not entry:
            raise self._closed_error()  # the close took it over and tears it down
        if self._state is not SessionState.RUNNING:
            entry.removed = True
            await self._settle_batch([entry])
            raise self._closed_error()
        self._registry[entry.process_id] = entry
        durable_ops.changed(self)
        live = len(self._registry) + len(self._starting)
        if live == self.warn_processes:  # once, when the registry crosses the mark
            logger.warning(
                "%s session has %d of %d processes: the least recently used will be pruned",
                self.backend_name,
                live,
                self.max_processes,
            )
        try:
            async with entry.call_lock:
                return await self._collect(
                    entry, window, pattern, max_tokens, until_screen=screen_pattern
                )
        except asyncio.CancelledError:
            await self._discard(entry)
            raise

    async def pty_write_stdin(
        self,
        process_id: int,
        chars: str | bytes = "",
        *,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
        until: UntilPattern | None = None,
        until_screen: UntilPattern | None = None,
    ) -> PtyUpdate:
        """Write keystrokes to a process and return the output of the next window.

        Empty `chars` is a poll: its window lasts at least 5 s unless the process exits
        or `until` appears (in the output) or `until_screen` appears (on the rendered
        screen; the result then carries the `screen`). A write's window defaults to
        0.25 s.
        """
        data = arguments.to_input_bytes(chars)
        if data:
            window = arguments.yield_window(yield_time_s, arguments.WRITE_YIELD_S)
        else:
            window = arguments.yield_window(
                yield_time_s,
                arguments.EMPTY_POLL_MIN_YIELD_S,
                floor=arguments.EMPTY_POLL_MIN_YIELD_S,
            )
        max_tokens = arguments.check_max_tokens(max_output_tokens)
        pattern = check_until(until)
        entry = self._lookup(process_id)
        await self._durable_guard()
        screen_pattern = self._check_until_screen(until_screen, entry.screen is not None)
        if data and not entry.tty:
            raise StdinClosedError(
                f"process {process_id} was started with tty=False, so its stdin is closed; "
                "start it with tty=True to write to it (empty chars still polls it)"
            )
        if data and entry.call_lock.locked():
            # Keystrokes must not wait behind a long poll of the same process: the poll
            # ends now with what it has, then this write runs.
            entry.preempt_poll()
        async with entry.call_lock:
            if entry.removed:
                raise self._gone(entry)
            entry.touch()
            unwritten = 0
            window_end = asyncio.get_running_loop().time() + window
            if data:
                if entry.exited:
                    raise ProcessExitedError(
                        f"process {process_id} has exited; poll it with empty chars to "
                        "collect its remaining output and exit code"
                    )
                entry.record_input(data)
                unwritten = await self._write_within(entry, data, window_end)
            remaining = max(0.0, window_end - asyncio.get_running_loop().time())
            update = await self._collect(
                entry, remaining, pattern, max_tokens, poll=not data, until_screen=screen_pattern
            )
            if unwritten:
                update = dataclasses.replace(update, unwritten_bytes=unwritten)
            return update

    async def _write_within(self, entry: PtyEntry[H], data: bytes, window_end: float) -> int:
        """Write `data` within the window; return how many bytes the terminal did not
        take. The write is a task of the entry's, so a terminate, a close or an
        interrupt can end it at once instead of waiting behind a full terminal."""
        entry.input_accepted = 0
        taken = self._write_stdin_nowait(entry, data)
        if taken >= len(data):
            return 0  # the common case: the terminal had room, no task needed
        data = data[taken:]
        entry.input_accepted = taken
        write = asyncio.ensure_future(self._write_stdin(entry, data))
        entry.write_task = write
        try:
            timeout = max(0.0, window_end - asyncio.get_running_loop().time())
            done, _ = await asyncio.wait({write}, timeout=timeout)
            if not done:
                write.cancel()
                await asyncio.wait({write})
        except asyncio.CancelledError:
            write.cancel()
            await settle(_finished(write))
            raise
        finally:
            if entry.write_task is write:
                entry.write_task = None
        if write.cancelled():
            accepted = entry.input_accepted - taken
        else:
            error = write.exception()
            if error is not None:
                if entry.removed:
                    raise self._gone(entry) from error
                raise error
            accepted = len(data)
        return len(data) - min(max(accepted, 0), len(data))

    async def pty_resize(self, process_id: int, *, rows: int, cols: int) -> None:
        """Resize a process's terminal (`UnsupportedOperationError` where the provider
        cannot, `InvalidArgumentError` for a process without a terminal)."""
        arguments.check_terminal_size(rows, cols)
        entry = self._lookup(process_id)
        await self._durable_guard()
        if not entry.tty:
            raise InvalidArgumentError(f"process {process_id} has no terminal (tty=False)")
        entry.touch()
        if entry.exited:
            return
        await self._resize(entry, rows, cols)
        entry.resize_terminal(rows, cols)

    async def pty_interrupt(self, process_id: int) -> None:
        """Send Ctrl-C: the interrupt character on a terminal, SIGINT to a pipe process's
        group. Does not wait for a window: poll afterwards to see the effect."""
        entry = self._lookup(process_id)
        await self._durable_guard()
        entry.touch()
        if entry.exited:
            return
        write = entry.write_task
        if write is not None and not write.done():
            # Ctrl-C never queues behind input the process is not reading: the pending
            # write ends (its caller learns how much was not written), then this goes.
            write.cancel()
            await asyncio.wait({write})
        if entry.tty:
            entry.record_input(b"\x03")
        await self._interrupt(entry)

    async def pty_screen(self, process_id: int) -> ScreenSnapshot:
        """The rendered screen of a tty process: what a person at its terminal would see
        now (everything it printed so far is emulated first, a slice at a time).

        `InvalidArgumentError` for a process without a terminal or started with
        `screen=False`. Does not wait for a write or a poll in progress.
        """
        entry = self._lookup(process_id)
        screen = entry.screen
        if screen is None:
            if not entry.tty:
                raise InvalidArgumentError(
                    f"process {process_id} has no terminal (tty=False), so no screen"
                )
            raise InvalidArgumentError(f"process {process_id} was started with screen=False")
        entry.touch()
        return await screen.render(SCREEN_CHECK_SLICE_S)

    async def pty_terminate(self, process_id: int) -> None:
        """Tear one process down (its whole tree) and remove it from the registry."""
        self._require_running()
        await self._durable_guard()
        entry = self._registry.pop(process_id, None)
        if entry is None:
            raise self._not_found(process_id)
        entry.removed = True
        await self._settle_batch([entry])

    async def pty_terminate_all(self) -> None:
        """Tear down every registered process as one settled batch."""
        self._require_running()
        await self._durable_guard()
        entries = list(self._registry.values())
        self._registry.clear()
        await self._settle_batch(entries)

    def pty_processes(self) -> list[PtyProcessInfo]:
        """The live registry, oldest first, so an agent can find processes it forgot."""
        return [
            PtyProcessInfo(
                process_id=entry.process_id,
                command=entry.spec.command.display,
                tty=entry.tty,
                running=entry.running,
                exit_code=entry.exit_code,
                started_at=entry.started_at,
                last_used=entry.last_used,
                has_screen=entry.screen is not None,
            )
            for entry in sorted(self._registry.values(), key=lambda e: e.started_at)
        ]

    # ---- durable -------------------------------------------------------------------

    @property
    def keeps_processes(self) -> bool:
        """Whether this backend's processes keep running, and can be reattached, while
        no client is connected (`detach()`, a crash). False: they are children of this
        client (or of its connection), so `detach()` ends them as `pty_terminate` does."""
        return self._keeps_processes

    def ref(self) -> SessionRef:
        """A `SessionRef` for this session now: enough for `sandbox.resume_session` to
        attach to the same sandbox and processes from another client (never a secret).
        From now on this session checks, at each call, that no other client took the
        sandbox over (`SessionTakenOverError`). A detached session returns its final ref."""
        if self._durable.detached is not None:
            return self._durable.detached
        self._require_running()
        self._durable.shared = True
        return durable_ops.make_ref(self)

    async def detach(self) -> SessionRef:
        """End this client's hold without tearing the sandbox down, and return the ref
        that owns it now. Processes the provider keeps (`keeps_processes`) keep running;
        the others are torn down as by `pty_terminate` and listed as ended with their
        exit codes. Afterwards every call raises `SessionClosedError`. Completes when
        its caller is cancelled (then `ref()` still returns the ref)."""
        self._require_running()
        await self._durable_guard()
        self._state = SessionState.CLOSING
        detaching = asyncio.ensure_future(durable_ops.detach_everything(self))
        self._closing = detaching
        try:
            await settle(detaching)
        finally:
            self._state = SessionState.CLOSED
        return detaching.result()

    async def _durable_guard(self) -> None:
        await durable_ops.guard(self)

    async def _durable_undo_start(self) -> None:
        """Undo a start that failed or was cancelled: a resume lets go (the sandbox stays
        the ref's), a fresh start stops what it made."""
        if self._durable.resuming:
            await durable_ops.abandon_resume(self)
        else:
            await self._stop_backend()

    async def _durable_claim_close(self, entries: list[PtyEntry[H]]) -> bool:
        """Whether this close may tear the sandbox down; if another client took it over,
        let go of `entries` and the backend's clients instead and answer False."""
        if await durable_ops.claim_close(self):
            return True
        errors = await durable_ops.let_go(self, entries)
        self._close_record_directory()
        for error in errors:
            logger.warning("%s session: letting go failed: %s", self.backend_name, error)
        return False

    # ---- registry internals --------------------------------------------------------

    @property
    def _reserved(self) -> set[int]:
        """Every id in use: registered, starting, or being torn down."""
        return {*self._registry, *self._starting, *self._retiring}

    @staticmethod
    def _check_until_screen(until_screen: object, has_screen: bool) -> UntilPattern | None:
        pattern = check_until(until_screen)
        if pattern is not None and not has_screen:
            raise InvalidArgumentError(
                "until_screen needs a rendered screen: a tty process started with screen=True"
            )
        return pattern

    def _open_recording(
        self, entry: PtyEntry[H], record: str | os.PathLike[str] | None, record_input: bool
    ) -> None:
        """Open the entry's recording (its own file, else one in `record_dir`), always a
        new file (`sandbox.host_files`): what is at its name already is refused."""
        if record is None and self.record_dir is None:
            return
        if record is None and self._record_directory is None:
            raise self._closed_error()  # the close released the folder: never unrecorded
        env = entry.spec.command.env or {}
        options: dict[str, Any] = {
            "rows": entry.spec.rows,
            "cols": entry.spec.cols,
            "term": env.get("TERM", "xterm-256color"),
            "command": entry.spec.command.display,
            "record_input": bool(record_input),
        }
        try:
            if record is not None:
                entry.recorder = AsciicastRecorder.open(record, **options)
            elif self._record_directory is not None:
                name = _record_name(entry.process_id)
                entry.recorder = AsciicastRecorder.open_in(self._record_directory, name, **options)
        except OSError as exc:  # the header's write failed (the file was made)
            shown = os.fspath(record) if record is not None else self.record_dir or ""
            raise HostPathError(
                f"cannot record to {shown!r}: {exc.strerror or exc}", path=str(shown)
            ) from None

    def _close_record_directory(self) -> None:
        folder, self._record_directory = self._record_directory, None
        if folder is not None:
            folder.close()

    def _closed_error(self) -> SessionClosedError:
        return SessionClosedError(f"the {self.backend_name} session was closed")

    def _not_found(self, process_id: object) -> PtyProcessNotFoundError:
        pruned = self._pruned.get(process_id) if isinstance(process_id, int) else None
        if pruned is not None:
            return PtyProcessNotFoundError(f"process {process_id} {pruned}")
        return PtyProcessNotFoundError(
            f"no process with id {process_id!r} (it exited and was collected, was "
            "terminated, or never existed); pty_processes() lists the live ones"
        )

    def _gone(self, entry: PtyEntry[H]) -> SandboxError:
        """The error for a call that finds its process removed while it waited."""
        if self._state in (SessionState.CLOSING, SessionState.CLOSED):
            return self._closed_error()
        pruned = self._pruned.get(entry.process_id)
        if pruned is not None:
            return PtyProcessNotFoundError(f"process {entry.process_id} {pruned}")
        return PtyProcessNotFoundError(f"process {entry.process_id} was terminated")

    def _lookup(self, process_id: int) -> PtyEntry[H]:
        self._require_running()
        if isinstance(process_id, bool) or not isinstance(process_id, int):
            raise InvalidArgumentError(f"process_id must be an int, not {process_id!r}")
        entry = self._registry.get(process_id)
        if entry is None:
            raise self._not_found(process_id)
        return entry

    async def _reserve(
        self, spec: ProcessSpec, *, in_record_dir: bool = False
    ) -> tuple[PtyEntry[H], PtyEntry[H] | None]:
        """Take a slot for a new process (pruning one when full): the new entry waits in
        `_starting`, owned by the caller; the victim, if any, is the caller's to tear down.
        `in_record_dir`: it will be recorded in `record_dir`, so prefer an id whose
        recording's name is free there (an earlier session's recording is kept)."""
        async with self._lock:
            self._require_running()
            victim = None
            if len(self._registry) + len(self._starting) >= self.max_processes:
                victim = self._prune_victim()
                if victim is None:
                    raise SandboxError(
                        f"{self.max_processes} processes are already starting; "
                        "wait for some to finish",
                        retryable=True,
                    )
                del self._registry[victim.process_id]
                victim.removed = True
                reason = (
                    f"was pruned: the session was full ({self.max_processes} processes) and "
                    f"it was the least recently used {'exited' if victim.exited else 'running'} one"
                )
                self._remember_pruned(victim.process_id, reason)
                victim.feed(f"\n[sandbox: process {victim.process_id} {reason}]\n".encode())
                logger.info(
                    "%s session: process %d %s", self.backend_name, victim.process_id, reason
                )
            low, high = ID_RANGE
            in_use = self._reserved
            folder = self._record_directory if in_record_dir else None
            tries = 0
            while True:
                process_id = low + secrets.randbelow(high - low)
                if process_id in in_use:
                    continue
                if folder is None or tries >= RECORD_NAME_TRIES:
                    break
                tries += 1
                if not folder.contains(_record_name(process_id)):
                    break
            entry: PtyEntry[H] = PtyEntry(process_id, spec, output_limit=self.output_limit_bytes)
            self._starting[process_id] = entry
            return entry, victim

    def _remember_pruned(self, process_id: int, reason: str) -> None:
        self._pruned[process_id] = reason
        while len(self._pruned) > PRUNED_MEMORY:
            del self._pruned[next(iter(self._pruned))]

    def _prune_victim(self) -> PtyEntry[H] | None:
        by_recency = sorted(self._registry.values(), key=lambda e: e.last_used_mono)
        candidates = by_recency[: max(0, len(by_recency) - PROTECTED_RECENT)]
        for entry in candidates:
            if entry.exited:
                return entry
        return candidates[0] if candidates else None

    async def _settle_batch(self, entries: list[PtyEntry[H]], *, log_errors: bool = False) -> None:
        """THE place where teardowns are handed over, attempted and awaited.

        The caller has already taken `entries` out of the registry (or `_starting`), so
        it owns them; this hands them to one settled task that tears every one down (a
        few at a time), which `aclose()` also waits for before stopping the backend.
        The finalizer, prune, terminate, terminate-all, failed starts and close all come
        here; one entry is a batch of one. Failures are raised (several as a
        `CleanupError`), or only logged with `log_errors`.
        """
        if not entries:
            return
        for entry in entries:
            entry.removed = True
            self._retiring.add(entry.process_id)
        task = asyncio.ensure_future(
            attempt_all(entries, self._teardown_entry, self.teardown_concurrency)
        )
        self._teardowns.add(task)
        task.add_done_callback(self._teardowns.discard)
        try:
            await settle(task)
        except Exception as exc:
            if not log_errors:
                raise
            logger.warning("%s session: a teardown failed: %s", self.backend_name, exc)
        finally:
            if self._state is SessionState.RUNNING:
                durable_ops.changed(self)

    async def _teardown_entry(self, entry: PtyEntry[H]) -> None:
        """End a pending write, run the backend's teardown, then release the id.
        Only called through `_settle_batch`."""
        try:
            write = entry.write_task
            if write is not None and not write.done():
                write.cancel()
                await asyncio.wait({write})
            if entry.process_id in self._durable.releasing:
                self._durable.releasing.discard(entry.process_id)
                await self._release_entry(entry)  # it stays the ref's (detach, takeover)
            else:
                await self._terminate_pty_entry(entry)
        finally:
            # The readers are stopped: the recording is complete (and valid) now.
            entry.close_terminal()
            self._retiring.discard(entry.process_id)
            # A window still waiting on this entry (a poll racing a terminate) must end
            # now, even if the backend could not report an exit status.
            entry.report_torn_down()

    async def _discard(self, entry: PtyEntry[H]) -> None:
        """Remove `entry` from the registry if it is still there, and tear it down."""
        if self._registry.get(entry.process_id) is not entry:
            return
        del self._registry[entry.process_id]
        await self._settle_batch([entry])

    async def _await_owned(self, task: asyncio.Future[T]) -> T:
        """Wait for a task the session owns (a start, a spawn, a one-shot command).

        If the caller is cancelled, the task is cancelled and awaited (settled) before
        the cancellation propagates, so nothing it made outlives the call. If the close
        cancelled it (or broke it while tearing things down), this raises
        `SessionClosedError`: the caller lost the race.
        """
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            await settle(_finished(task))
            raise
        if task.cancelled() or task.exception() is not None:
            if self._state in (SessionState.CLOSING, SessionState.CLOSED):
                error = None if task.cancelled() else task.exception()
                raise self._closed_error() from error
        return task.result()

    async def _run_owned(self, work: Coroutine[Any, Any, T], owner: set[asyncio.Task[Any]]) -> T:
        """Run `work` as a task in `owner` (which `aclose()` cancels and awaits)."""
        task = asyncio.ensure_future(work)
        owner.add(task)
        task.add_done_callback(owner.discard)
        return await self._await_owned(task)

    def __del__(self) -> None:
        # Like an unclosed aiohttp session: say so, and let the backend kill what it can
        # synchronously (unix_local kills its process groups); a remote sandbox is left
        # to the provider's own timeout.
        state = getattr(self, "_state", SessionState.CLOSED)
        if state in (SessionState.NEW, SessionState.CLOSED):
            return
        warnings.warn(
            f"unclosed {self.backend_name} session (state {state.value}): use "
            "`async with session:` or await session.aclose()",
            ResourceWarning,
            source=self,
            stacklevel=1,
        )
        with contextlib.suppress(Exception):
            self._abandon([*self._starting.values(), *self._registry.values()])

    # ---- collection windows --------------------------------------------------------

    async def _collect(
        self,
        entry: PtyEntry[H],
        window_s: float,
        until: UntilPattern | None,
        max_tokens: int | None,
        *,
        poll: bool = False,
        until_screen: UntilPattern | None = None,
    ) -> PtyUpdate:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + window_s
        matcher = UntilMatcher(until, entry.decoder.snapshot()) if until is not None else None
        scanned = entry.output.start_pos
        # The screen is checked once there is output this window returns (like `until`,
        # which searches it), and after every change; a poll checks it at once.
        screen_checked = -1 if poll else entry.output.start_pos
        snapshot: ScreenSnapshot | None = None
        if not poll:
            entry.poll_preempted = False
        while True:
            if poll and entry.poll_preempted:
                entry.poll_preempted = False
                break
            if matcher is not None:
                segments = entry.output.since(scanned)
                scanned = entry.output.end_pos
                if segments and await matcher.feed_async(segments, deadline):
                    break
            if until_screen is not None and entry.output.end_pos != screen_checked:
                screen_checked = entry.output.end_pos
                snapshot = await self._render_by(entry, deadline)
                if snapshot is not None and _screen_matches(until_screen, snapshot):
                    break
            if entry.output_done:
                break
            if loop.time() >= deadline:
                await self._final_drain(entry)
                break
            await entry.wait_for_change(
                deadline, wants_data=matcher is not None or until_screen is not None
            )
        if until_screen is not None:
            # What the model sees with the output: the screen at the window's end.
            snapshot = await self._render_by(entry, loop.time() + SCREEN_CHECK_SLICE_S)
        finished = entry.output_done
        text = entry.decoder.decode_drained(entry.output.drain(), final=finished)
        truncated = truncate_to_tokens(text, max_tokens)
        if finished:
            await self._discard(entry)
        return PtyUpdate(
            process_id=None if finished else entry.process_id,
            output=truncated.text,
            exit_code=entry.exit_code if entry.exited else None,
            original_token_count=truncated.original_token_count,
            screen=snapshot,
        )

    @staticmethod
    async def _render_by(entry: PtyEntry[H], deadline: float) -> ScreenSnapshot | None:
        """Emulate the entry's queued output a slice at a time (yielding between slices)
        until caught up or the loop time `deadline`; then the snapshot (its changed rows
        rendered in slices too)."""
        screen = entry.screen
        if screen is None:
            return None
        return await screen.render(SCREEN_CHECK_SLICE_S, deadline=deadline)

    # ---- backend hooks ---------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Create or attach to the sandbox. Called once by `start()`; if it raises or is
        cancelled, `_stop_backend()` is called (settled) to undo whatever it did."""

    async def _stop_backend(self) -> None:
        """Stop the sandbox (delete it unless told to keep it) and release clients.
        Must tolerate a partially completed `_start_backend()`. Called at most once per
        start attempt, after every process has been torn down."""

    async def _exec(
        self, spec: CommandSpec, timeout: float | None, capture: ExecCapture
    ) -> ExecResult:
        """Run a one-shot command to completion. The default is the base session's own
        skeleton: `_start_exec()`, then wait within `timeout`; at the timeout, on
        cancellation or when the session closes, the command's tree is killed (settled)
        and `capture.timeout_error(...)` / the cancellation is raised. A backend
        implements `_start_exec` (preferred), or overrides this whole hook (the older
        way: then it must do all of the above itself)."""
        process = await self._start_exec(spec, capture)
        try:
            async with asyncio.timeout(timeout) as scope:
                code = await process.wait()
        except TimeoutError as exc:
            if not scope.expired():  # the backend's own timeout, not ours
                await _kill_noting(process, exc)
                raise
            # Built after the kill: a backend may collect the last output while killing.
            raise await _killed_at_timeout(process, capture, spec.display, timeout) from None
        except ExecTimeoutError:
            # The provider's own timeout, which the backend reports the same way: the kill
            # is ours too, and the error is rebuilt after it with whatever it collected.
            raise await _killed_at_timeout(process, capture, spec.display, timeout) from None
        except BaseException as exc:
            await _kill_noting(process, exc)
            raise
        await settle(process.release())
        return capture.result(code)

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """Start a one-shot command whose stdout and stderr chunks are appended to
        `capture` as they arrive (never an unbounded buffer of our own), and return it
        (see `OneShotProcess`). If this is cancelled after the command started, kill it
        before the cancellation propagates: nobody else knows it.

        A missing `spec.cwd`, or (with `shell=False`) a missing program, must raise
        `WorkdirError` / `CommandNotFoundError`: run the command behind a
        `CommandCheck` (set `capture.check`; `capture.result` then raises) or check
        natively."""
        raise UnsupportedOperationError(f"{self.backend_name} cannot run one-shot commands")

    async def _spawn_process(self, entry: PtyEntry[H]) -> None:
        """Start `entry.spec` and arrange for its output to flow into `entry.feed()` and
        its end into `entry.report_exit()` / `report_eof()` / `report_lost()`.

        Store the backend's state in `entry.handle` as soon as anything exists, so that
        `_terminate_pty_entry` can undo a spawn that failed or was cancelled half-way.
        For `tty=False`, stdin must be closed (EOF) for the process.
        """
        raise UnsupportedOperationError(f"{self.backend_name} cannot start processes")

    def _write_stdin_nowait(self, entry: PtyEntry[H], data: bytes) -> int:
        """Optional fast path: write what the terminal takes right now, without waiting,
        and return how many bytes that was (the rest goes through `_write_stdin`).
        Default: 0, everything goes through `_write_stdin`."""
        return 0

    async def _write_stdin(self, entry: PtyEntry[H], data: bytes) -> None:
        """Write bytes to the terminal of a running tty process."""
        raise UnsupportedOperationError(f"{self.backend_name} cannot write to processes")

    async def _resize(self, entry: PtyEntry[H], rows: int, cols: int) -> None:
        """Resize the process's terminal; default: unsupported."""
        raise UnsupportedOperationError(f"the {self.backend_name} backend cannot resize a terminal")

    async def _interrupt(self, entry: PtyEntry[H]) -> None:
        """Ctrl-C. Default: the interrupt character for a tty; backends must override
        for tty=False processes (SIGINT to the process group)."""
        if entry.tty:
            await self._write_stdin(entry, b"\x03")
            return
        raise UnsupportedOperationError(
            f"the {self.backend_name} backend cannot interrupt a process without a terminal"
        )

    async def _terminate_pty_entry(self, entry: PtyEntry[H]) -> None:
        """Tear down one process: kill its whole tree, stop and await its reader tasks,
        close its sockets and fds. Called exactly once per entry, always through the
        settled cleanup, after the entry left the registry. Must cope with an entry whose
        spawn failed or was cancelled half-way (`entry.handle` may be None or partial).
        `entry.sandbox_stopping` says the whole sandbox is being stopped right after (the
        session's close): a backend whose sandbox deletion kills every process may skip
        the per-process kill then; it never reads the session's state itself."""

    def _abandon(self, entries: list[PtyEntry[H]]) -> None:
        """Called (synchronously, best effort) when a session that was never closed is
        garbage-collected, with its processes: kill what can be killed without awaiting
        (no event loop may be running). Default: nothing."""

    async def _final_drain(self, entry: PtyEntry[H]) -> None:
        """At a window's deadline, move output that already arrived at the transport into
        the entry. Default: let pending callbacks run once."""
        await asyncio.sleep(0)

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        """Read a whole regular file (`path` is checked: a non-empty str without NUL).

        Raise `NotAFileError` for anything but a regular file (a directory, FIFO,
        socket, device) without opening what could block, `SandboxFileNotFoundError`
        when it is missing, and `FileTooLargeError` above `max_bytes` where the size is
        known before reading (the base session checks the returned length too)."""
        raise UnsupportedOperationError(f"the {self.backend_name} backend cannot read files")

    async def _write_file(self, path: str, data: bytes) -> None:
        """Write a regular file, creating parent folders. Raise `NotAFileError` (and
        change nothing) over a directory, FIFO, socket or device, or when a parent on
        the path is a file."""
        raise UnsupportedOperationError(f"the {self.backend_name} backend cannot write files")

    async def _read_file_chunks(self, path: str, chunk_size: int) -> AsyncIterator[bytes]:
        """Stream a regular file in chunks of about `chunk_size` bytes (the base session
        re-cuts longer ones); same errors as `_read_file`. Default: `_read_file` bounded
        by `read_limit_bytes`, then sliced."""
        data = await self._read_file(path, self.read_limit_bytes)
        if len(data) > self.read_limit_bytes:
            raise FileTooLargeError.over(path, len(data), self.read_limit_bytes)
        view = memoryview(data)
        for start in range(0, len(view), chunk_size):
            yield bytes(view[start : start + chunk_size])

    async def _write_file_chunks(self, path: str, chunks: AsyncIterator[bytes]) -> None:
        """Write a regular file from `chunks` (bytes, never empty); same rules as
        `_write_file`. Default: join the chunks, then `_write_file`."""
        parts = [chunk async for chunk in chunks]
        await self._write_file(path, b"".join(parts))

    # ---- durable hooks (see docs/durable-sessions.md) ---------------------------------

    # Whether the provider keeps a process running, reattachable, with no client.
    _keeps_processes: ClassVar[bool] = False

    def _ref_sandbox(self) -> dict[str, Any]:
        """Where the sandbox is, for a ref (a container id, a workspace path...): JSON
        data, never a secret. Default: this backend cannot make refs."""
        raise UnsupportedOperationError(
            f"the {self.backend_name} backend cannot detach or resume sessions"
        )

    def _ref_options(self) -> dict[str, Any]:
        """The options a resumed session is made with: an allow-list of options that are
        not secrets (never credentials, never `env` values)."""
        return {
            "max_processes": self.max_processes,
            "output_limit_bytes": self.output_limit_bytes,
            "teardown_concurrency": self.teardown_concurrency,
            "read_limit_bytes": self.read_limit_bytes,
            "exec_output_limit_bytes": self.exec_output_limit_bytes,
        }

    def _ref_process(self, entry: PtyEntry[H]) -> dict[str, Any]:
        """The provider's handle of a running process, for a ref (JSON, no secret)."""
        return {}

    @classmethod
    def _options_from_ref(cls, ref: SessionRef) -> dict[str, Any]:
        """The constructor options of a session resuming `ref` (before the caller's)."""
        return dict(ref.options)

    def _lease_store(self) -> LeaseStore | None:
        """Where this session's lease lives (`sandbox.durable.lease`); None: nowhere
        (no other client can be told apart)."""
        return None

    async def _resume_backend(self, ref: SessionRef) -> None:
        """Attach to `ref`'s sandbox instead of `_start_backend`, so that `_stop_backend`
        deletes it as the first client's close would. Raise `SessionGoneError` when it
        no longer exists. Where the ref lists processes that could not outlive their
        client (it crashed), end what is left of them here. If this raises or is
        cancelled, `_detach_backend()` is called (settled): the sandbox stays."""
        raise UnsupportedOperationError(f"the {self.backend_name} backend cannot resume sessions")

    async def _reattach_process(self, entry: PtyEntry[H], process: Any) -> None:
        """Follow the running process `process` (a `ProcessRef`) again as `entry`, like
        `_spawn_process`: what it printed after `process.output_position` (bounded, the
        omission marker where the provider kept less), then its output and exit. Raise
        `sandbox.durable.ProcessNotReattached(note, exit_code)` when the provider lost it
        (or never keeps processes): it is registered as ended, with the note."""
        raise durable_ops.ProcessNotReattached(
            f"the {self.backend_name} backend cannot reattach a process"
        )

    async def _release_entry(self, entry: PtyEntry[H]) -> None:
        """Stop following a process without ending it (detach, takeover): stop its
        readers, close its sockets. Called instead of `_terminate_pty_entry`, once, by
        the settled teardown. Default: terminate it (nothing outlives its client)."""
        await self._terminate_pty_entry(entry)

    async def _detach_backend(self) -> None:
        """Release the provider's clients and connections, leaving the sandbox running
        (detach, a takeover, an undone resume). Default: nothing."""
