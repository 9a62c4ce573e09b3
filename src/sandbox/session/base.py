"""`BaseSandboxSession`: the public face of a session.

Options, the lifecycle (`start`, `aclose`, `detach`) and the public calls (`exec`,
`exec_stream`, files, workspace, `pty_*`) live here, each an argument check or two
handed to the part of the session's one `SessionCore` (`core.py`) that owns the state it
touches: its `Lifecycle` (admits every call), `ProcessRegistry`, `OwnedTasks`,
`Recordings`, the calls (`FileCalls`, `WorkspaceCalls`, `PtyCalls`) and the functions of
`run_one_shot` and `sandbox.durable.ops`. The hooks a backend implements are inherited
from `SessionHooks` (`hooks.py`); a backend subclass defines nothing else of the base
(refused when its class is made) and never touches the core.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from .. import arguments
from ..durable import ops as durable_ops
from ..durable.refs import SessionRef
from ..errors import InvalidArgumentError, UnsupportedOperationError
from ..exec_output import DEFAULT_EXEC_OUTPUT_LIMIT, ExecCapture
from ..files import arguments as files
from ..output.buffer import DEFAULT_OUTPUT_LIMIT
from ..output.until import UntilPattern, check_until
from ..process_entry import H, ProcessSpec
from ..settle import DEFAULT_BATCH_CONCURRENCY
from ..terminal.screen_limit import check_screen_cells
from ..types import ExecResult, PtyProcessInfo, PtyUpdate
from ..workspace import extract as ws_extract
from ..workspace.info import FileInfo
from ..workspace.ports import ExposedPort
from ..workspace.snapshots import SnapshotRef
from . import file_calls, workspace_calls
from .core import SessionCore
from .exec_stream import DEFAULT_STREAM_BUFFER, ExecStream
from .hooks import SessionHooks
from .lifecycle import Lifecycle, SessionState
from .oneshot import run_one_shot
from .options import SessionOptions
from .registry import MAX_PROCESSES
from .windows import check_until_screen

if TYPE_CHECKING:  # the emulator (pyte) is imported only when a screen is made
    from ..terminal.screen import ScreenSnapshot


# What a backend subclass may define of the base: the hooks and the capability types.
_HOOK_NAMES = frozenset(name for name in vars(SessionHooks) if not name.startswith("__"))


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
        # Checked here, not at teardown: a bad option must fail when it is given.
        options = SessionOptions(
            max_processes=max_processes,
            output_limit_bytes=output_limit_bytes,
            teardown_concurrency=teardown_concurrency,
            read_limit_bytes=read_limit_bytes,
            exec_output_limit_bytes=exec_output_limit_bytes,
        )
        # Name-mangled: no subclass can reach or replace it by accident.
        self.__core: SessionCore[H] = SessionCore(
            self, Lifecycle(self), options, record_dir=record_dir, ref_file=ref_file
        )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A backend implements hooks and keeps its own state; redefining anything else
        # of the base would bypass the checks and the ownership rules its calls keep.
        super().__init_subclass__(**kwargs)
        clashes = sorted(
            name
            for name in vars(cls)
            if not (name.startswith("__") and name.endswith("__"))
            and name not in _HOOK_NAMES
            and hasattr(BaseSandboxSession, name)
        )
        if clashes:
            raise TypeError(
                f"{cls.__qualname__} redefines {', '.join(clashes)} of BaseSandboxSession: "
                "a backend implements only the hooks of SessionHooks (docs/architecture.md)"
            )

    @property
    def _core(self) -> SessionCore[H]:
        """Everything the base session owns (`core.py`); read-only."""
        return self.__core

    @property
    def output_limit_bytes(self) -> int:
        """At most this many bytes of a process's output are kept between two calls."""
        return self.__core.options.output_limit_bytes

    @property
    def read_limit_bytes(self) -> int:
        """The default bound of a file read whole (`read_file`)."""
        return self.__core.options.read_limit_bytes

    @property
    def exec_output_limit_bytes(self) -> int:
        """The default bound of each stream of a one-shot command (`exec`)."""
        return self.__core.options.exec_output_limit_bytes

    @property
    def record_dir(self) -> str | None:
        """Where tty processes are recorded (`<process_id>.cast`), if anywhere."""
        return self.__core.recordings.record_dir

    @property
    def max_processes(self) -> int:
        """At most this many processes at once; one more prunes the least recently used."""
        return self.__core.processes.max_processes

    @property
    def teardown_concurrency(self) -> int:
        """How many processes one teardown batch tears down at a time."""
        return self.__core.owned.concurrency

    @property
    def warn_processes(self) -> int:
        """How many processes make the session warn that pruning is near."""
        return self.__core.processes.warn_processes

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} backend={self.backend_name!r} state={self.state.value} "
            f"processes={len(self.__core.processes)}>"
        )

    # ---- lifecycle -----------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        """The session's lifecycle state."""
        return self.__core.lifecycle.state

    async def start(self) -> None:
        """Start the sandbox. A no-op when already running.

        If starting fails or is cancelled, whatever was half-created is torn down
        (settled) before the error propagates, and the session can be started again.
        If `aclose()` is called meanwhile, the start is cancelled, the close tears down
        whatever it made, and this raises `SessionClosedError`.
        """
        await self.__core.lifecycle.start()

    async def aclose(self) -> None:
        """Cancel whatever is starting or running (a `start()`, one-shot commands, spawns),
        terminate every process, then stop the sandbox. Returns only when nothing is
        left. Idempotent; safe after a failed start; completes even if the caller is
        cancelled (then re-raises that). Several failures come back together as a
        `CleanupError`."""
        await self.__core.lifecycle.close()

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

    # ---- one-shot commands and files (`FileCalls`) ------------------------------------

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
        await self.__core.lifecycle.admit()
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
        return await self.__core.owned.run(work)

    def exec_stream(
        self,
        *command: str,
        timeout: float | None = None,
        shell: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_buffered_bytes: int = DEFAULT_STREAM_BUFFER,
    ) -> ExecStream:
        """Run a command to completion, taking its output as it comes::

            async with session.exec_stream("make") as stream:
                async for chunk in stream:  # ExecChunk("stdout" | "stderr", data, omitted)
                    ...
            stream.exit_code

        The same command, options and errors as `exec` (the arguments are checked here,
        the rest is raised by the iteration). Nothing is kept: memory is bounded by
        `max_buffered_bytes` (8 MiB) of output not yet taken; beyond that the excess is
        dropped and an omission chunk (`data` empty, `omitted` > 0) says so. Leaving the
        `async with` early, or a cancellation, kills the command's tree first.
        """
        spec = arguments.build_command(command, shell=shell, env=env, cwd=cwd)
        bound = arguments.check_output_limit("max_buffered_bytes", max_buffered_bytes)
        return ExecStream(
            self._start_exec,
            spec,
            timeout=arguments.check_timeout(timeout),
            max_buffered_bytes=bound,
            admission=self.__core.lifecycle,
            owned=self.__core.owned,
        )

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a whole regular file from the sandbox (relative paths are in the workspace).

        A directory, FIFO, socket or device raises `NotAFileError` (nothing is opened
        that could block). A file above `max_bytes` (default: the session's
        `read_limit_bytes`, 64 MiB) raises `FileTooLargeError`, before it is read where
        the backend can tell its size; stream big files with `read_file_chunks`.
        """
        return await self.__core.files.read_file(path, max_bytes)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a regular file in the sandbox (str is UTF-8 encoded), creating parent
        folders. Writing over a directory, FIFO, socket or device, or under a path whose
        parent is a file, raises `NotAFileError` and changes nothing."""
        await self.__core.files.write_file(path, data)

    def read_file_chunks(
        self, path: str, *, chunk_size: int = files.DEFAULT_CHUNK_SIZE
    ) -> AsyncIterator[bytes]:
        """Stream a regular file: `async for chunk in session.read_file_chunks(path)`.

        Chunks are at most `chunk_size` bytes (default 1 MiB). No size limit applies on
        backends that stream (unix_local, docker); elsewhere the whole file is fetched
        first, bounded by `read_limit_bytes`. Stop early with `contextlib.aclosing` so the
        file is closed at once. Same errors as `read_file`, raised by the first chunk.
        """
        return self.__core.files.read_file_chunks(path, chunk_size)

    async def write_file_chunks(self, path: str, chunks: file_calls.Chunks) -> None:
        """Write a regular file from an iterable or async iterable of chunks (bytes,
        bytearray, memoryview or str, which is UTF-8 encoded), creating parent folders;
        same rules as `write_file`.

        unix_local and docker never hold the whole file (docker spools it to a temporary
        file first, as its archive needs the size up front); elsewhere the chunks are
        joined, then written. If `chunks` fails, its error propagates and the file may
        hold part of the data."""
        await self.__core.files.write_file_chunks(path, chunks)

    # ---- workspace (`WorkspaceCalls`; the rules are in docs/workspaces.md) ----------
    # Paths follow the file calls' rules: relative ones are in the workspace, nothing
    # outside it is reached.

    async def stat(self, path: str) -> FileInfo:
        """What `path` names (a symlink is described, not followed): a `FileInfo`.
        `SandboxFileNotFoundError` when nothing is there."""
        return await self.__core.workspace.stat(path)

    async def list_dir(self, path: str = ".") -> list[FileInfo]:
        """The entries of the directory `path` (not `.`/`..`), sorted by name."""
        return await self.__core.workspace.list_dir(path)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, symlink (not its target) or directory; a non-empty directory
        needs `recursive=True` (else `InvalidArgumentError`, nothing removed).
        `SandboxFileNotFoundError` when nothing is there."""
        await self.__core.workspace.remove(path, recursive)

    async def make_dir(self, path: str, *, parents: bool = True) -> None:
        """Make the directory `path`; with `parents` (the default) missing parents are
        made and an existing directory is fine, like `mkdir -p`."""
        await self.__core.workspace.make_dir(path, parents)

    def persist_workspace(self, path: str = ".") -> AsyncIterator[bytes]:
        """Stream the workspace (or the subtree `path`) as a POSIX pax tar: relative
        member names, modes, symlinks (stored, not followed) and empty directories
        kept; FIFOs, sockets and devices left out. Memory stays bounded."""
        return self.__core.workspace.persist_workspace(path)

    async def hydrate_workspace(
        self,
        chunks: workspace_calls.Archive,
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
        return await self.__core.workspace.hydrate_workspace(chunks, path, max_members, max_bytes)

    async def expose_port(self, port: int) -> ExposedPort:
        """How a client outside the sandbox reaches a server listening on `port`
        inside: an `ExposedPort` (url, host, port, tls, headers to send). A port the
        backend cannot expose is an `UnsupportedOperationError` saying why."""
        return await self.__core.workspace.expose_port(port)

    async def snapshot(self) -> SnapshotRef:
        """Snapshot the sandbox with the provider's own means (docker: an image); open
        it later with `open_session(backend, snapshot=ref)`. Backends without one raise
        `UnsupportedOperationError` (`persist_workspace` is the portable way)."""
        return await self.__core.workspace.snapshot()

    # ---- the PTY API ---------------------------------------------------------------

    async def pty_exec_start(
        self,
        *command: str,
        tty: bool = False,
        stdin: bool = False,
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

        `stdin=True` (with `tty=False`) keeps the pipe process's stdin open:
        `pty_write_stdin` writes bytes to it and `pty_close_stdin` ends it (the process
        reads end-of-file), for programs that read their input to its end (`sort`, a
        stdio MCP or language server). A backend that cannot keep stdin open raises
        `UnsupportedOperationError` here, before anything starts. With `tty=True` it
        changes nothing: a terminal always takes input.

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
        await self.__core.lifecycle.admit()
        if record is not None and not isinstance(record, str | os.PathLike):
            raise InvalidArgumentError(f"record must be a path, not {record!r}")
        open_stdin = bool(stdin) and not tty
        if (
            open_stdin
            and not self._stdin_stays_open
            and type(self)._close_stdin is SessionHooks._close_stdin
        ):
            raise UnsupportedOperationError(
                f"stdin=True: the {self.backend_name} backend cannot keep the stdin of a "
                "process on pipes open (its provider gives no way to end that input); "
                "use tty=True to type into a process, or write the input to a file and "
                "redirect it (`sort < input.txt`)"
            )
        spec = ProcessSpec(
            command=arguments.build_command(command, shell=shell, env=env, cwd=cwd),
            tty=bool(tty),
            rows=rows,
            cols=cols,
            screen=bool(tty) and bool(screen),
            stdin=open_stdin,
        )
        arguments.check_terminal_size(rows, cols)
        window = arguments.yield_window(yield_time_s, arguments.START_YIELD_S)
        max_tokens = arguments.check_max_tokens(max_output_tokens)
        pattern = check_until(until)
        screen_pattern = check_until_screen(until_screen, spec.screen)
        if screen_pattern is not None:
            check_screen_cells(rows, cols)
        return await self.__core.pty.start(
            spec, window, pattern, max_tokens, screen_pattern, record, record_input
        )

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
        0.25 s. A process on pipes takes writes only when started with `stdin=True` and
        until `pty_close_stdin` (else `StdinClosedError`).
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
        return await self.__core.pty.write(
            process_id, data, window, pattern, max_tokens, until_screen
        )

    async def pty_close_stdin(self, process_id: int) -> None:
        """End the input of a process started with `tty=False, stdin=True`: it reads
        end-of-file after every byte written before this call. Does not wait for a
        window: poll afterwards for what it printed. A second close is a no-op.

        `InvalidArgumentError` for a tty process (a terminal's input has no end),
        `StdinClosedError` for a process started without `stdin=True`,
        `ProcessExitedError` once it exited, `PtyProcessNotFoundError` for an unknown id.
        """
        await self.__core.pty.close_stdin(process_id)

    async def pty_resize(self, process_id: int, *, rows: int, cols: int) -> None:
        """Resize a process's terminal (`UnsupportedOperationError` where the provider
        cannot, `InvalidArgumentError` for a process without a terminal)."""
        arguments.check_terminal_size(rows, cols)
        await self.__core.pty.resize(process_id, rows, cols)

    async def pty_interrupt(self, process_id: int) -> None:
        """Send Ctrl-C: the interrupt character on a terminal, SIGINT to a pipe process's
        group. Does not wait for a window: poll afterwards to see the effect."""
        await self.__core.pty.interrupt(process_id)

    async def pty_screen(self, process_id: int) -> ScreenSnapshot:
        """The rendered screen of a tty process: what a person at its terminal would see
        now (everything it printed so far is emulated first, a slice at a time).

        `InvalidArgumentError` for a process without a terminal or started with
        `screen=False`. Does not wait for a write or a poll in progress.
        """
        return await self.__core.pty.screen(process_id)

    async def pty_terminate(self, process_id: int) -> None:
        """Tear one process down (its whole tree) and remove it from the registry."""
        await self.__core.lifecycle.admit()
        await self.__core.owned.settle_batch([self.__core.processes.take(process_id)])

    async def pty_terminate_all(self) -> None:
        """Tear down every registered process as one settled batch."""
        await self.__core.lifecycle.admit()
        await self.__core.owned.settle_batch(self.__core.processes.take_all())

    def pty_processes(self) -> list[PtyProcessInfo]:
        """The live registry, oldest first, so an agent can find processes it forgot."""
        return self.__core.processes.infos()

    # ---- durable sessions (the work is in `sandbox.durable.ops`) ---------------------

    @property
    def keeps_processes(self) -> bool:
        """Whether this backend's processes keep running, and can be reattached, while
        no client is connected (`detach()`, a crash). False: they are children of this
        client (or of its connection), so `detach()` ends them as `pty_terminate` does."""
        return self.__core.capabilities.durability.keeps_processes

    def ref(self) -> SessionRef:
        """A `SessionRef` for this session now: enough for `sandbox.resume_session` to
        attach to the same sandbox and processes from another client (never a secret).
        From now on this session checks, at each call, that no other client took the
        sandbox over (`SessionTakenOverError`). A detached session returns its final ref."""
        durable = self.__core.durable
        if durable.detached is not None:
            return durable.detached
        self.__core.lifecycle.admit_now()
        durable.shared = True
        return durable_ops.make_ref(self)

    async def detach(self) -> SessionRef:
        """End this client's hold without tearing the sandbox down, and return the ref
        that owns it now. Processes the provider keeps (`keeps_processes`) keep running;
        the others are torn down as by `pty_terminate` and listed as ended with their
        exit codes. Afterwards every call raises `SessionClosedError`. Completes when
        its caller is cancelled (then `ref()` still returns the ref)."""
        await self.__core.lifecycle.admit()
        return await self.__core.lifecycle.run_closing(durable_ops.detach_everything(self))

    def __del__(self) -> None:
        # Warn and kill what can be killed synchronously, if it was started and not closed.
        core = self.__dict__.get("_BaseSandboxSession__core")  # None: the constructor raised
        if core is not None:
            core.lifecycle.unclosed()


def durable_session_id(session: BaseSandboxSession[Any]) -> str:
    """The id that names `session` across its clients: new with the session, or its
    ref's at a resume (then set before `_resume_backend` runs), stable afterwards. A
    backend names its lease and its provider-side marks with it."""
    return session._core.durable.session_id
