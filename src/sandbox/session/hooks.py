"""`SessionHooks`: the contract a backend implements, and nothing else.

A backend is a `BaseSandboxSession[H]` subclass (`H`: its own per-process state, kept
in `OutputSink.handle`) that overrides some of the hooks below; the base session calls
them and does everything around them: argument checks, the registry, windows,
timeouts, cancellation and the settled teardown. Each docstring is the hook's
contract. The bodies only raise `UnsupportedOperationError` or do the default.

A backend's own state lives in its own attributes (`_client`, `_files`); the base
session keeps all of its state in one object out of the subclass's reach
(`SessionCore`), and a subclass that redefines anything of the base but these hooks is
refused when its class is made (`BaseSandboxSession.__init_subclass__`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, ClassVar, Generic

from ..errors import UnsupportedOperationError
from ..exec_output import ExecCapture, OneShotProcess
from ..process_entry import CommandSpec, H, OutputSink
from ..process_handle import Process, overrides
from .capabilities import Durability, FileAccess, Ports, Snapshots, WorkspaceAccess


class SessionHooks(Generic[H]):
    """The hooks of a backend session, with their defaults (see the module docstring).

    Hooks run in tasks the session owns, not in their caller's task (but for what a
    spawn does before it returns: see `_spawn_process`); a hook that is cancelled must
    undo what it made before the cancellation propagates.
    """

    backend_name: ClassVar[str] = "base"

    if TYPE_CHECKING:  # the base session's read-only options (properties there)

        @property
        def read_limit_bytes(self) -> int: ...

        @property
        def output_limit_bytes(self) -> int: ...

        @property
        def exec_output_limit_bytes(self) -> int: ...

        @property
        def max_processes(self) -> int: ...

        @property
        def teardown_concurrency(self) -> int: ...

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Create or attach to the sandbox. Called once by `start()`; if it raises or is
        cancelled, `_stop_backend()` is called (settled) to undo whatever it did."""

    async def _stop_backend(self) -> None:
        """Stop the sandbox (delete it unless told to keep it) and release clients.
        Must tolerate a partially completed `_start_backend()`. Called at most once per
        start attempt, after every process has been torn down."""

    # ---- one-shot commands ---------------------------------------------------------

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

    # ---- processes -----------------------------------------------------------------

    def _spawn_process(self, entry: OutputSink[H]) -> Awaitable[None] | None:
        """Start `entry.spec` and arrange for its output to flow into `entry.feed()` and
        its end into `entry.report_exit()` / `report_eof()` / `report_lost()`.

        Store the backend's state in `entry.handle` as soon as anything exists, so that
        `_terminate_pty_entry` can undo a spawn that failed or was cancelled half-way.
        For `tty=False`, stdin must be closed (EOF) for the process, unless
        `entry.stdin_open` (`stdin=True`): then keep a way to write to its stdin
        (`_write_stdin`) and to end it (`_close_stdin`). The base session asks for that
        only of a backend that overrides `_close_stdin` or sets `_stdin_stays_open`; one
        that can do it only in some setups raises `UnsupportedOperationError` here,
        before anything starts.

        Returns what is left to await, run as a task the session owns: an `async def`
        hook's coroutine is all of it (the usual case). A spawn that can finish without
        awaiting (unix_local's one synchronous clone) is a plain `def` that returns None
        then, and an awaitable only when it must wait: nothing can interleave with a
        call that never awaits, so it needs no task. What it does before returning runs
        in the caller's task, so whatever binds to the current task (`asyncio.timeout`)
        belongs in the awaitable. (Not an eager task start: Python 3.11 has none, and
        stepping a coroutine by hand would run its first step with the caller as its
        current task.) A subclass that extends such a hook awaits what `super()`
        returns unless it is None.
        """
        raise UnsupportedOperationError(f"{self.backend_name} cannot start processes")

    async def _write_stdin(self, entry: OutputSink[H], data: bytes) -> None:
        """Write bytes to the terminal of a running tty process, or to the open stdin of
        a process on pipes (`entry.stdin_open`). Default: the handle's `Process.write`.
        What a `Process` handle's `try_write` took at once never comes here: the base
        session asks it first, and sends only the rest."""
        handle = entry.require_handle()
        if not overrides(handle, "write"):
            raise UnsupportedOperationError(f"{self.backend_name} cannot write to processes")
        assert isinstance(handle, Process)
        await handle.write(data)

    async def _close_stdin(self, entry: OutputSink[H]) -> None:
        """End the input of a process started on pipes with `stdin=True`: it reads
        end-of-file once it has read every byte written before (the base session calls
        this only after every earlier write finished). Idempotent: a close cancelled
        half-way is asked again. Overriding it is how a backend says it can keep stdin
        open (`pty_exec_start(stdin=True)` is refused at start otherwise), unless its
        handles are `Process`es and it sets `_stdin_stays_open`: then the default calls
        the handle's `Process.close_stdin`."""
        handle = entry.require_handle()
        if not overrides(handle, "close_stdin"):
            raise UnsupportedOperationError(
                f"the {self.backend_name} backend cannot close the stdin of a process"
            )
        assert isinstance(handle, Process)
        await handle.close_stdin()

    # Whether the backend's handles can keep the stdin of a process on pipes open and
    # end it (`Process.close_stdin`): `pty_exec_start(stdin=True)` is refused before
    # anything starts otherwise (a backend that overrides `_close_stdin` says so too).
    _stdin_stays_open: ClassVar[bool] = False

    async def _resize(self, entry: OutputSink[H], rows: int, cols: int) -> None:
        """Resize the process's terminal. Default: the handle's `Process.resize`."""
        handle = entry.require_handle()
        if not overrides(handle, "resize"):
            raise UnsupportedOperationError(
                f"the {self.backend_name} backend cannot resize a terminal"
            )
        assert isinstance(handle, Process)
        await handle.resize(rows, cols)

    async def _interrupt(self, entry: OutputSink[H]) -> None:
        """Ctrl-C. Default: the interrupt character for a tty, unless the handle's
        `Process.interrupts_terminal` says its `interrupt` serves a terminal too; without
        one, the handle's `Process.interrupt` (SIGINT to the process group)."""
        handle = entry.require_handle()
        if entry.tty and not (isinstance(handle, Process) and handle.interrupts_terminal):
            await self._write_stdin(entry, b"\x03")
            return
        if overrides(handle, "interrupt"):
            assert isinstance(handle, Process)
            await handle.interrupt()
            return
        raise UnsupportedOperationError(
            f"the {self.backend_name} backend cannot interrupt a process without a terminal"
        )

    async def _terminate_pty_entry(self, entry: OutputSink[H]) -> None:
        """Tear down one process: kill its whole tree, stop and await its reader tasks,
        close its sockets and fds. Called exactly once per entry, always through the
        settled cleanup, after the entry left the registry. Must cope with an entry whose
        spawn failed or was cancelled half-way (`entry.handle` may be None or partial).
        `entry.sandbox_stopping` says the whole sandbox is being stopped right after (the
        session's close): a backend whose sandbox deletion kills every process may skip
        the per-process kill then; it never reads the session's state itself. A
        backend whose handles are `Process`es writes `await kill_handle(entry)`.
        Not called for an exited process that a window hands over when its `Process`
        handle's `finish_now` ended it at once (nothing of it was left to wait for)."""

    def _abandon(self, entries: Sequence[OutputSink[H]]) -> None:
        """Called (synchronously, best effort) when a session that was never closed is
        garbage-collected, with its processes: kill what can be killed without awaiting
        (no event loop may be running). Default: nothing."""

    async def _final_drain(self, entry: OutputSink[H]) -> None:
        """At a window's deadline, move output that already arrived at the transport into
        the entry. Default: the handle's `Process.drain`, else let pending callbacks run
        once."""
        handle = entry.handle
        if isinstance(handle, Process):
            await handle.drain()
        else:
            await asyncio.sleep(0)

    # ---- capabilities (`capabilities.py`): one attribute each, None where absent ----
    # Each names a capability type; the base session builds it once with the session
    # (`Capabilities.of`) and calls it. Durable sessions: docs/durable-sessions.md.

    _file_access: ClassVar[type[FileAccess] | None] = None
    _workspace_access: ClassVar[type[WorkspaceAccess] | None] = None
    _ports: ClassVar[type[Ports] | None] = None
    _snapshots: ClassVar[type[Snapshots] | None] = None
    _durability: ClassVar[type[Durability] | None] = None
