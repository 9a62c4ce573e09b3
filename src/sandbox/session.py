"""`BaseSandboxSession`: lifecycle, one-shot exec, the PTY API and the process registry.

Everything that is the same for every provider lives here: the registry and its lock,
id reservation and pruning, collection windows (bounded output, incremental UTF-8,
`until`, token truncation), and the settled cleanup through which every teardown goes.
A backend subclass implements only the hooks in the "backend hooks" section below; it
never touches the registry or the lock, and never awaits a teardown itself.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
from collections.abc import Mapping
from types import TracebackType
from typing import ClassVar, Self

from . import arguments
from .errors import (
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
from .output_buffer import DEFAULT_OUTPUT_LIMIT
from .process_entry import CommandSpec, ProcessSpec, PtyEntry
from .settle import DEFAULT_BATCH_CONCURRENCY, attempt_all, settle, settle_each
from .truncation import truncate_to_tokens
from .types import ExecResult, PtyProcessInfo, PtyUpdate
from .until_match import UntilMatcher, UntilPattern, check_until

logger = logging.getLogger("sandbox")

MAX_PROCESSES = 64
WARN_PROCESSES = 60
PROTECTED_RECENT = 8
ID_RANGE = (1000, 100_000)


class SessionState(enum.Enum):
    """Where a session is in its life."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class BaseSandboxSession:
    """A sandbox session: start it, run commands and PTYs in it, close it.

    Use it as `async with session:` (or call `start()` and `aclose()`). Closing tears
    down every process and the sandbox itself (unless the backend was told to keep it),
    also when the closing task is cancelled.
    """

    backend_name: ClassVar[str] = "base"

    def __init__(
        self,
        *,
        max_processes: int = MAX_PROCESSES,
        output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT,
        teardown_concurrency: int = DEFAULT_BATCH_CONCURRENCY,
    ) -> None:
        if max_processes < PROTECTED_RECENT + 1:
            raise InvalidArgumentError(f"max_processes must be at least {PROTECTED_RECENT + 1}")
        if output_limit_bytes < 1024:
            raise InvalidArgumentError("output_limit_bytes must be at least 1024")
        self.max_processes = max_processes
        self.warn_processes = max(1, max_processes - (MAX_PROCESSES - WARN_PROCESSES))
        self.output_limit_bytes = output_limit_bytes
        self.teardown_concurrency = teardown_concurrency
        self._state = SessionState.NEW
        self._registry: dict[int, PtyEntry] = {}
        self._reserved: set[int] = set()
        self._lock = asyncio.Lock()
        self._closing: asyncio.Future[None] | None = None

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
        """
        if self._state is SessionState.RUNNING:
            return
        if self._state in (SessionState.CLOSING, SessionState.CLOSED):
            raise SessionClosedError(f"the {self.backend_name} session is closed")
        if self._state is SessionState.STARTING:
            raise SessionStateError("start() is already in progress")
        self._state = SessionState.STARTING
        try:
            await self._start_backend()
        except BaseException as exc:
            try:
                await settle(self._stop_backend())
            except Exception as cleanup_exc:
                exc.add_note(f"cleaning up the failed start also failed: {cleanup_exc}")
            finally:
                self._state = SessionState.NEW
            raise
        self._state = SessionState.RUNNING

    async def aclose(self) -> None:
        """Terminate every process and stop the sandbox. Idempotent; safe after a failed
        start; completes even if the caller is cancelled (then re-raises that)."""
        if self._state is SessionState.CLOSED:
            return
        if self._closing is not None:
            await settle(self._closing)
            return
        was_started = self._state is SessionState.RUNNING
        self._state = SessionState.CLOSING
        entries = list(self._registry.values())
        self._registry.clear()
        for entry in entries:
            entry.removed = True
        closing = asyncio.ensure_future(self._close_everything(entries, was_started))
        self._closing = closing
        try:
            await settle(closing)
        finally:
            self._state = SessionState.CLOSED

    async def _close_everything(self, entries: list[PtyEntry], was_started: bool) -> None:
        errors: list[BaseException] = []
        try:
            await attempt_all(entries, self._teardown_entry, self.teardown_concurrency)
        except Exception as exc:
            errors.append(exc)
        if was_started:
            try:
                await self._stop_backend()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

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
    ) -> ExecResult:
        """Run a command to completion and return its output and exit code.

        A non-zero exit is a result, not an error. When `timeout` expires the whole
        process tree is killed and `ExecTimeoutError` is raised.
        """
        self._require_running()
        spec = arguments.build_command(command, shell=shell, env=env, cwd=cwd)
        return await self._exec(spec, arguments.check_timeout(timeout))

    async def read_file(self, path: str) -> bytes:
        """Read a file from the sandbox (relative paths are in the workspace)."""
        self._require_running()
        if not isinstance(path, str) or not path:
            raise InvalidArgumentError("path must be a non-empty str")
        return await self._read_file(path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file in the sandbox (str is UTF-8 encoded), creating parent folders."""
        self._require_running()
        if not isinstance(path, str) or not path:
            raise InvalidArgumentError("path must be a non-empty str")
        payload = arguments.to_input_bytes(data)
        await self._write_file(path, payload)

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
    ) -> PtyUpdate:
        """Start a process (on a terminal if `tty`, else on pipes with stdin closed) and
        return what it printed within the first window.

        The window ends at `yield_time_s` (default 10 s), when the process exits, or
        when `until` appears. `process_id` is None in the result if it already exited.
        If this call is cancelled before it returns, the process is torn down: nobody
        would know its id.
        """
        self._require_running()
        spec = ProcessSpec(
            command=arguments.build_command(command, shell=shell, env=env, cwd=cwd),
            tty=bool(tty),
            rows=rows,
            cols=cols,
        )
        arguments.check_terminal_size(rows, cols)
        window = arguments.yield_window(yield_time_s, arguments.START_YIELD_S)
        max_tokens = arguments.check_max_tokens(max_output_tokens)
        pattern = check_until(until)

        process_id, victim = await self._reserve_id()
        entry = PtyEntry(process_id, spec, output_limit=self.output_limit_bytes)
        try:
            if victim is not None:
                await settle(self._teardown_entry(victim))
            await self._spawn_process(entry)
            async with self._lock:
                if self._state is not SessionState.RUNNING:
                    raise SessionClosedError(f"the {self.backend_name} session was closed")
                self._registry[process_id] = entry
                live = len(self._registry)
        except BaseException:
            entry.removed = True
            await settle(self._teardown_entry(entry))
            raise
        if live == self.warn_processes:  # once, when the registry crosses the mark
            logger.warning(
                "%s session has %d of %d processes: the least recently used will be pruned",
                self.backend_name,
                live,
                self.max_processes,
            )
        try:
            async with entry.call_lock:
                return await self._collect(entry, window, pattern, max_tokens)
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
    ) -> PtyUpdate:
        """Write keystrokes to a process and return the output of the next window.

        Empty `chars` is a poll: its window lasts at least 5 s unless the process exits
        or `until` appears. A write's window defaults to 0.25 s.
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
                raise PtyProcessNotFoundError(f"process {process_id} was terminated")
            entry.touch()
            if data:
                if entry.exited:
                    raise ProcessExitedError(
                        f"process {process_id} has exited; poll it with empty chars to "
                        "collect its remaining output and exit code"
                    )
                await self._write_stdin(entry, data)
            return await self._collect(entry, window, pattern, max_tokens, poll=not data)

    async def pty_resize(self, process_id: int, *, rows: int, cols: int) -> None:
        """Resize a process's terminal (`UnsupportedOperationError` where the provider
        cannot, `InvalidArgumentError` for a process without a terminal)."""
        arguments.check_terminal_size(rows, cols)
        entry = self._lookup(process_id)
        if not entry.tty:
            raise InvalidArgumentError(f"process {process_id} has no terminal (tty=False)")
        entry.touch()
        if entry.exited:
            return
        await self._resize(entry, rows, cols)

    async def pty_interrupt(self, process_id: int) -> None:
        """Send Ctrl-C: the interrupt character on a terminal, SIGINT to a pipe process's
        group. Does not wait for a window: poll afterwards to see the effect."""
        entry = self._lookup(process_id)
        entry.touch()
        if entry.exited:
            return
        await self._interrupt(entry)

    async def pty_terminate(self, process_id: int) -> None:
        """Tear one process down (its whole tree) and remove it from the registry."""
        self._require_running()
        async with self._lock:
            entry = self._registry.pop(process_id, None)
            if entry is None:
                raise self._not_found(process_id)
            entry.removed = True
        await settle(self._teardown_entry(entry))

    async def pty_terminate_all(self) -> None:
        """Tear down every registered process as one settled batch."""
        self._require_running()
        async with self._lock:
            entries = list(self._registry.values())
            self._registry.clear()
            for entry in entries:
                entry.removed = True
        await settle_each(entries, self._teardown_entry, concurrency=self.teardown_concurrency)

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
            )
            for entry in sorted(self._registry.values(), key=lambda e: e.started_at)
        ]

    # ---- registry internals --------------------------------------------------------

    def _not_found(self, process_id: object) -> PtyProcessNotFoundError:
        return PtyProcessNotFoundError(
            f"no process with id {process_id!r} (it exited and was collected, was "
            "terminated, or never existed); pty_processes() lists the live ones"
        )

    def _lookup(self, process_id: int) -> PtyEntry:
        self._require_running()
        if isinstance(process_id, bool) or not isinstance(process_id, int):
            raise InvalidArgumentError(f"process_id must be an int, not {process_id!r}")
        entry = self._registry.get(process_id)
        if entry is None:
            raise self._not_found(process_id)
        return entry

    async def _reserve_id(self) -> tuple[int, PtyEntry | None]:
        async with self._lock:
            self._require_running()
            victim = None
            if len(self._reserved) >= self.max_processes:
                victim = self._prune_victim()
                if victim is None:
                    raise SandboxError(
                        f"{self.max_processes} processes are already starting; "
                        "wait for some to finish",
                        retryable=True,
                    )
                del self._registry[victim.process_id]
                victim.removed = True
                logger.info(
                    "%s session is full: pruning process %d (%s)",
                    self.backend_name,
                    victim.process_id,
                    "exited" if victim.exited else "running",
                )
            low, high = ID_RANGE
            while True:
                process_id = low + secrets.randbelow(high - low)
                if process_id not in self._reserved:
                    break
            self._reserved.add(process_id)
            return process_id, victim

    def _prune_victim(self) -> PtyEntry | None:
        by_recency = sorted(self._registry.values(), key=lambda e: e.last_used_mono)
        candidates = by_recency[: max(0, len(by_recency) - PROTECTED_RECENT)]
        for entry in candidates:
            if entry.exited:
                return entry
        return candidates[0] if candidates else None

    async def _teardown_entry(self, entry: PtyEntry) -> None:
        """Run the backend's teardown, then release the id. Only called via settle."""
        try:
            await self._terminate_pty_entry(entry)
        finally:
            self._reserved.discard(entry.process_id)
            # A window still waiting on this entry (a poll racing a terminate) must end
            # now, even if the backend could not report an exit status.
            entry.report_torn_down()

    async def _discard(self, entry: PtyEntry) -> None:
        """Remove `entry` from the registry if it is still there, and tear it down."""
        async with self._lock:
            if self._registry.get(entry.process_id) is not entry:
                return
            del self._registry[entry.process_id]
            entry.removed = True
        await settle(self._teardown_entry(entry))

    # ---- collection windows --------------------------------------------------------

    async def _collect(
        self,
        entry: PtyEntry,
        window_s: float,
        until: UntilPattern | None,
        max_tokens: int | None,
        *,
        poll: bool = False,
    ) -> PtyUpdate:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + window_s
        matcher = UntilMatcher(until, entry.decoder.snapshot()) if until is not None else None
        scanned = entry.output.start_pos
        if not poll:
            entry.poll_preempted = False
        while True:
            if poll and entry.poll_preempted:
                entry.poll_preempted = False
                break
            if matcher is not None:
                segments = entry.output.since(scanned)
                scanned = entry.output.end_pos
                if segments and matcher.feed(segments):
                    break
            if entry.output_done:
                break
            if loop.time() >= deadline:
                await self._final_drain(entry)
                break
            await entry.wait_for_change(deadline, wants_data=matcher is not None)
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
        )

    # ---- backend hooks ---------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Create or attach to the sandbox. Called once by `start()`; if it raises or is
        cancelled, `_stop_backend()` is called (settled) to undo whatever it did."""

    async def _stop_backend(self) -> None:
        """Stop the sandbox (delete it unless told to keep it) and release clients.
        Must tolerate a partially completed `_start_backend()`. Called at most once per
        start attempt, after every process has been torn down."""

    async def _exec(self, spec: CommandSpec, timeout: float | None) -> ExecResult:
        """Run a one-shot command to completion. On timeout: kill the command's whole
        tree (never the sandbox) and raise `ExecTimeoutError`."""
        raise UnsupportedOperationError(f"{self.backend_name} cannot run one-shot commands")

    async def _spawn_process(self, entry: PtyEntry) -> None:
        """Start `entry.spec` and arrange for its output to flow into `entry.feed()` and
        its end into `entry.report_exit()` / `report_eof()` / `report_lost()`.

        Store the backend's state in `entry.handle` as soon as anything exists, so that
        `_terminate_pty_entry` can undo a spawn that failed or was cancelled half-way.
        For `tty=False`, stdin must be closed (EOF) for the process.
        """
        raise UnsupportedOperationError(f"{self.backend_name} cannot start processes")

    async def _write_stdin(self, entry: PtyEntry, data: bytes) -> None:
        """Write bytes to the terminal of a running tty process."""
        raise UnsupportedOperationError(f"{self.backend_name} cannot write to processes")

    async def _resize(self, entry: PtyEntry, rows: int, cols: int) -> None:
        """Resize the process's terminal; default: unsupported."""
        raise UnsupportedOperationError(f"the {self.backend_name} backend cannot resize a terminal")

    async def _interrupt(self, entry: PtyEntry) -> None:
        """Ctrl-C. Default: the interrupt character for a tty; backends must override
        for tty=False processes (SIGINT to the process group)."""
        if entry.tty:
            await self._write_stdin(entry, b"\x03")
            return
        raise UnsupportedOperationError(
            f"the {self.backend_name} backend cannot interrupt a process without a terminal"
        )

    async def _terminate_pty_entry(self, entry: PtyEntry) -> None:
        """Tear down one process: kill its whole tree, stop and await its reader tasks,
        close its sockets and fds. Called exactly once per entry, always through the
        settled cleanup, after the entry left the registry. Must cope with an entry whose
        spawn failed or was cancelled half-way (`entry.handle` may be None or partial)."""

    async def _final_drain(self, entry: PtyEntry) -> None:
        """At a window's deadline, move output that already arrived at the transport into
        the entry. Default: let pending callbacks run once."""
        await asyncio.sleep(0)

    async def _read_file(self, path: str) -> bytes:
        """Read a file from the sandbox."""
        raise UnsupportedOperationError(f"the {self.backend_name} backend cannot read files")

    async def _write_file(self, path: str, data: bytes) -> None:
        """Write a file in the sandbox."""
        raise UnsupportedOperationError(f"the {self.backend_name} backend cannot write files")
