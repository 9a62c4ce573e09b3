"""`BaseSandboxSession`: the public face of a session, orchestrating its collaborators.

Options, the lifecycle (`start`, `aclose`) and the public calls (`exec`, files, `pty_*`)
live here, each a few steps handed to a collaborator that owns its state: the
`ProcessRegistry` (`self._processes`: ids, slots, who owns each entry), `OwnedTasks`
(`self._owned`: owned tasks and every teardown), `Recordings`, `collect_window`,
`run_one_shot` and `write_within`. The hooks a backend implements are inherited from
`SessionHooks` (`hooks.py`); a backend never touches anything else here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import os
import warnings
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from .. import arguments
from ..durable import ops as durable_ops
from ..durable.refs import SessionRef
from ..durable.state import DurableState
from ..errors import (
    CleanupError,
    FileTooLargeError,
    InvalidArgumentError,
    ProcessExitedError,
    SandboxError,
    SessionClosedError,
    SessionNotStartedError,
    SessionStateError,
    StdinClosedError,
    UnsupportedOperationError,
)
from ..exec_output import DEFAULT_EXEC_OUTPUT_LIMIT, ExecCapture
from ..files import arguments as files
from ..output.buffer import DEFAULT_OUTPUT_LIMIT
from ..output.until import UntilPattern, check_until
from ..process_entry import H, ProcessSpec, PtyEntry
from ..settle import DEFAULT_BATCH_CONCURRENCY, settle
from ..terminal.screen_limit import check_screen_cells
from ..types import ExecResult, PtyProcessInfo, PtyUpdate
from ..workspace import calls as ws_calls
from ..workspace import extract as ws_extract
from ..workspace import ports as ws_ports
from ..workspace.info import FileInfo
from ..workspace.ports import ExposedPort
from ..workspace.snapshots import SnapshotRef
from .hooks import SessionHooks
from .oneshot import run_one_shot
from .ownership import OwnedTasks, closed_error, finished
from .recordings import Recordings
from .registry import MAX_PROCESSES, PROTECTED_RECENT, ProcessRegistry
from .windows import SCREEN_CHECK_SLICE_S, check_until_screen, collect_window
from .writes import write_within

if TYPE_CHECKING:  # the emulator (pyte) is imported only when a screen is made
    from ..terminal.screen import ScreenSnapshot


class SessionState(enum.Enum):
    """Where a session is in its life."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class BaseSandboxSession(SessionHooks[H]):
    """A sandbox session: start it, run commands and PTYs in it, close it.

    Use it as `async with session:` (or call `start()` and `aclose()`). Closing tears
    down every process and the sandbox itself (unless the backend was told to keep it),
    also when the closing task is cancelled.

    `record_dir`: record every tty process to `<record_dir>/<process_id>.cast`
    (asciicast v2) unless its `pty_exec_start` names its own `record` file. The folder
    is opened once, by `start()` (before the sandbox runs anything), and each recording
    is created new relative to it (`sandbox.files.host`); ids are picked so that their
    name is free in it, and one that is taken anyway fails the start (`HostPathError`).

    `ref_file`: keep this session's `SessionRef` current in that file (a crashed client
    is resumed from it; see docs/durable-sessions.md); a backend that cannot make refs
    refuses it (`UnsupportedOperationError`).
    """

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
        recordings = Recordings(record_dir)
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
        self.output_limit_bytes = output_limit_bytes
        self.read_limit_bytes = files.check_byte_count(read_limit_bytes, "read_limit_bytes")
        # Per stream, for one-shot `exec` (head + tail kept, see `sandbox.exec_output`).
        self.exec_output_limit_bytes = arguments.check_output_limit(
            "exec_output_limit_bytes", exec_output_limit_bytes
        )
        self._state = SessionState.NEW
        # Which processes exist and who owns each (`registry.py` states the rule).
        self._processes: ProcessRegistry[H] = ProcessRegistry(
            self.backend_name, max_processes=max_processes, output_limit_bytes=output_limit_bytes
        )
        # The start, spawn and one-shot tasks it owns, and every teardown batch.
        self._owned: OwnedTasks[H] = OwnedTasks(
            self._processes,
            # Looked up at each teardown: a test's `HookGate` may wrap the hook later.
            lambda entry: self._terminate_pty_entry(entry),
            closing=self._is_closing,
            concurrency=teardown_concurrency,
            release=lambda entry: self._release_entry(entry),
            changed=self._durable_changed,
        )
        # `record_dir` and its fd, from `start()` to the close.
        self._recordings = recordings
        self._closing: asyncio.Future[Any] | None = None
        # Refs, the lease and the ref file (`sandbox.durable`); the file's folder is
        # opened now, before the sandbox runs anything.
        if ref_file is not None and type(self)._ref_sandbox is SessionHooks._ref_sandbox:
            raise UnsupportedOperationError(
                f"ref_file: the {self.backend_name} backend cannot detach or resume sessions"
            )
        self._durable = DurableState(ref_file)

    @property
    def record_dir(self) -> str | None:
        """Where tty processes are recorded (`<process_id>.cast`), if anywhere."""
        return self._recordings.record_dir

    @property
    def max_processes(self) -> int:
        """At most this many processes at once; one more prunes the least recently used."""
        return self._processes.max_processes

    @property
    def teardown_concurrency(self) -> int:
        """How many processes one teardown batch tears down at a time."""
        return self._owned.concurrency

    @property
    def warn_processes(self) -> int:
        """How many processes make the session warn that pruning is near."""
        return self._processes.warn_processes

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} backend={self.backend_name!r} state={self._state.value} "
            f"processes={len(self._processes)}>"
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
        self._recordings.open()  # before the sandbox runs anything (`recordings.py`)
        self._state = SessionState.STARTING
        task = asyncio.ensure_future(self._run_start())
        self._owned.start_task = task
        try:
            await self._owned.wait(task)
        except BaseException as exc:
            if self._state is SessionState.STARTING:
                if task.done() and not task.cancelled() and task.exception() is None:
                    # The backend came up just as our caller was cancelled: undo it.
                    try:
                        await settle(self._durable_undo_start())
                    except Exception as cleanup_exc:
                        exc.add_note(f"stopping the started backend failed: {cleanup_exc}")
                self._state = SessionState.NEW
                self._recordings.close()
            raise
        finally:
            if self._owned.start_task is task:
                self._owned.start_task = None
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
            await settle(finished(self._closing))
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
        start = self._owned.start_task
        if previous is SessionState.STARTING and start is not None:
            start.cancel()  # the start's own failure path stops what it made
            await asyncio.wait({start})
            backend_up = not start.cancelled() and start.exception() is None
        # Calls in flight lose: their hooks see the cancellation and undo what they made.
        await self._owned.cancel_in_flight()
        entries = self._processes.take_everything()
        if backend_up and not await durable_ops.close_or_let_go(self, entries):
            return  # another client resumed the sandbox: it was only let go of
        for entry in entries:
            entry.sandbox_stopping = True
        try:
            await self._owned.settle_batch(entries)
        except CleanupError as exc:
            errors.extend(exc.errors)
        except Exception as exc:
            errors.append(exc)
        # Teardowns other calls own (a terminate, a prune) finish before the backend stops.
        await self._owned.wait_teardowns()
        if backend_up:
            try:
                await self._stop_backend()
            except Exception as exc:
                errors.append(exc)
        self._recordings.close()
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
        work = run_one_shot(self._start_exec, spec, checked_timeout, capture)
        return await self._owned.run(work)

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

    # ---- workspace -----------------------------------------------------------------
    # File operations, archives, ports and snapshots (`sandbox.workspace`; the rules are
    # in docs/workspaces.md). Paths follow the file calls' rules: relative ones are in
    # the workspace, nothing outside it is reached.

    async def stat(self, path: str) -> FileInfo:
        """What `path` names (a symlink is described, not followed): a `FileInfo`.
        `SandboxFileNotFoundError` when nothing is there."""
        self._require_running()
        return await self._stat(files.check_path(path))

    async def list_dir(self, path: str = ".") -> list[FileInfo]:
        """The entries of the directory `path` (not `.`/`..`), sorted by name."""
        self._require_running()
        entries = await self._list_dir(files.check_path(path))
        return sorted(entries, key=lambda info: info.name)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, symlink (not its target) or directory; a non-empty directory
        needs `recursive=True` (else `InvalidArgumentError`, nothing removed).
        `SandboxFileNotFoundError` when nothing is there."""
        self._require_running()
        await self._remove(files.check_path(path), ws_calls.check_flag(recursive, "recursive"))

    async def make_dir(self, path: str, *, parents: bool = True) -> None:
        """Make the directory `path`; with `parents` (the default) missing parents are
        made and an existing directory is fine, like `mkdir -p`."""
        self._require_running()
        await self._make_dir(files.check_path(path), ws_calls.check_flag(parents, "parents"))

    def persist_workspace(self, path: str = ".") -> AsyncIterator[bytes]:
        """Stream the workspace (or the subtree `path`) as a POSIX pax tar: relative
        member names, modes, symlinks (stored, not followed) and empty directories
        kept; FIFOs, sockets and devices left out. Memory stays bounded."""
        self._require_running()
        return self._persist_workspace(files.check_path(path))

    async def hydrate_workspace(
        self,
        chunks: AsyncIterable[bytes | bytearray | memoryview]
        | Iterable[bytes | bytearray | memoryview],
        path: str = ".",
        *,
        max_members: int = ws_extract.DEFAULT_MAX_MEMBERS,
        max_bytes: int = ws_extract.DEFAULT_MAX_BYTES,
    ) -> int:
        """Extract a tar (such as `persist_workspace` makes) into the folder `path` of the
        workspace; the member count. Absolute names, `..`, symlinks pointing out, hard
        links, devices, FIFOs and members through a symlink the archive made are refused
        with an `InvalidArgumentError` naming the member, before it lands; so are more
        than `max_members` members or `max_bytes` of file data."""
        self._require_running()
        root = files.check_path(path)
        limits = (
            ws_calls.check_limit(max_members, "max_members"),
            ws_calls.check_limit(max_bytes, "max_bytes"),
        )
        return await self._hydrate_workspace(ws_calls.archive_chunks(chunks), root, *limits)

    async def expose_port(self, port: int) -> ExposedPort:
        """How a client outside the sandbox reaches a server listening on `port`
        inside: an `ExposedPort` (url, host, port, tls, headers to send). A port the
        backend cannot expose is an `UnsupportedOperationError` saying why."""
        self._require_running()
        return await self._expose_port(ws_ports.check_port(port))

    async def snapshot(self) -> SnapshotRef:
        """Snapshot the sandbox with the provider's own means (docker: an image); open
        it later with `open_session(backend, snapshot=ref)`. Backends without one raise
        `UnsupportedOperationError` (`persist_workspace` is the portable way)."""
        self._require_running()
        return await self._snapshot()

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
        `record` path, fails the start with `HostPathError` (`sandbox.files.host`).
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
        screen_pattern = check_until_screen(until_screen, spec.screen)
        if screen_pattern is not None:
            check_screen_cells(rows, cols)

        entry, victim = await self._processes.reserve(
            spec,
            check_open=self._require_running,
            name_taken=self._recordings.name_taken if spec.tty and record is None else None,
        )

        def prepare() -> None:  # after the victim went, before the spawn
            if spec.tty:
                self._recordings.start(entry, record, record_input, closed=self._closed_error())

        await self._owned.start_process(entry, victim, prepare=prepare, spawn=self._spawn_process)
        try:
            async with entry.call_lock:
                return await self._collect(
                    entry, window, pattern, max_tokens, until_screen=screen_pattern
                )
        except asyncio.CancelledError:
            await self._owned.discard(entry)
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
        screen_pattern = check_until_screen(until_screen, entry.screen is not None)
        if screen_pattern is not None and entry.screen is not None:
            entry.screen.check_size()
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
                unwritten = await write_within(
                    entry,
                    data,
                    window_end,
                    write_nowait=self._write_stdin_nowait,
                    write=self._write_stdin,
                    gone=self._gone,
                )
            remaining = max(0.0, window_end - asyncio.get_running_loop().time())
            update = await self._collect(
                entry, remaining, pattern, max_tokens, poll=not data, until_screen=screen_pattern
            )
            if unwritten:
                update = dataclasses.replace(update, unwritten_bytes=unwritten)
            return update

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
        await self._owned.settle_batch([self._processes.take(process_id)])

    async def pty_terminate_all(self) -> None:
        """Tear down every registered process as one settled batch."""
        self._require_running()
        await self._durable_guard()
        await self._owned.settle_batch(self._processes.take_all())

    def pty_processes(self) -> list[PtyProcessInfo]:
        """The live registry, oldest first, so an agent can find processes it forgot."""
        return self._processes.infos()

    # ---- durable sessions (the work is in `sandbox.durable.ops`) ---------------------

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

    def _durable_changed(self) -> None:
        # After a process was admitted or a teardown batch ended: the ref file follows.
        if self._state is SessionState.RUNNING:
            durable_ops.changed(self)

    async def _durable_undo_start(self) -> None:
        # A start that failed or was cancelled: a resume lets go (the sandbox stays the
        # ref's), a fresh start stops what it made.
        if self._durable.resuming:
            await durable_ops.abandon_resume(self)
        else:
            await self._stop_backend()

    # ---- what the calls share ------------------------------------------------------

    def _closed_error(self) -> SessionClosedError:
        return closed_error(self.backend_name)

    def _is_closing(self) -> bool:
        return self._state in (SessionState.CLOSING, SessionState.CLOSED)

    def _gone(self, entry: PtyEntry[H]) -> SandboxError:
        """The error for a call that finds its process removed while it waited."""
        return self._closed_error() if self._is_closing() else self._processes.gone(entry)

    def _lookup(self, process_id: int) -> PtyEntry[H]:
        self._require_running()
        return self._processes.lookup(process_id)

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
            self._abandon(self._processes.entries())

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
        """One window over `entry` (`windows.collect_window`); a finished entry leaves."""
        update, finished = await collect_window(
            entry,
            window_s,
            until,
            max_tokens,
            final_drain=self._final_drain,
            poll=poll,
            until_screen=until_screen,
        )
        if finished:
            await self._owned.discard(entry)
        return update
