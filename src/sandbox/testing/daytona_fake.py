"""A fake of the part of the `daytona` async SDK the daytona backend uses, driven by real
local processes.

`FakeDaytona` is a pretend Daytona service. Its `AsyncDaytona` attribute stands in for
`daytona.AsyncDaytona`; hand it to the backend with the `daytona_class` option (or to your
own code that uses the SDK):

```python
from sandbox.testing.daytona_fake import FakeDaytona

async with FakeDaytona(api_key="test-key") as fake:
    session = sandbox.open_session("daytona", api_key="test-key", daytona_class=fake.AsyncDaytona)
    async with session:
        await session.exec("echo hi")
```

Only the SDK surface the backend uses is imitated, with the SDK's own names, parameters
and async-ness: `AsyncDaytona(config).create/get/close`; the sandbox's `id`, `name`,
`state`, `process`, `fs`, `start()` and `delete()`; `process.exec`,
`create_session/execute_session_command/get_session_command_logs_async/
get_session_command/send_session_command_input/delete_session`,
`create_pty_session/connect_pty_session/kill_pty_session/resize_pty_session/
get_pty_session_info/list_pty_sessions`; the PTY handle's
`send_input/wait/disconnect/exit_code/error`;
`fs.download_file/upload_file`; `sandbox.create_snapshot` and the client's
`snapshot.delete`. `tests/backends/test_daytona.py` checks that surface
against the installed SDK with `sandbox.testing.drift`, so an SDK upgrade that changes it
fails the tests. The fake raises the SDK's own exception classes and returns the SDK's
own data types (`ExecuteResponse`, `SessionExecuteResponse`, `Command`, `PtyResult`,
`PtySessionInfo`).

Behind the surface every process is a real local process (`sandbox.local.process`), run
the way the Daytona daemon runs them, as pessimistically as it plausibly behaves:

- a PTY session is an interactive shell (`bash -i`, else `sh -i`) on a real terminal, so
  whatever is typed into it really goes through a shell; `kill_pty_session` SIGKILLs the
  shell process only, never its children; a process that died of signal N is reported
  like Go's `exec` reports it (exit code -1, reason `signal: <name>`; pass
  `signal_exit="shell"` for 128+N instead);
- a PTY session outlives its connections, as the daemon's does (daytona v0.190.0,
  `apps/daemon/pkg/toolbox/process/pty/`): `disconnect()` (or a client that dies)
  only unregisters that connection; what the terminal prints is sent to the clients
  connected at that moment and kept nowhere else (`broadcast`), so output printed
  while none is connected is lost; `connect_pty_session(id, on_data)` registers a new
  connection that sees output from then on, and the exit status when the process
  ends. When the process ends the daemon deletes the session (`ptyManager.Delete`):
  the exit status is lost with it for anyone not connected then, a later
  `connect_pty_session` fails the way the SDK reports the daemon's error control
  message (`DaytonaConnectionError("... PTY session <id> not found")`) and
  `get_pty_session_info` is a 404 (`DaytonaNotFoundError`);
- a session command is run by a shell whose stdin is a pipe that never reaches EOF (the
  daemon's session shell), so a command that reads stdin hangs unless it redirects it;
  stdout and stderr are streamed as text decoded per stream by an incremental UTF-8
  decoder with `errors="replace"`, exactly as the SDK's demultiplexer does (invalid bytes
  become U+FFFD); `delete_session` SIGKILLs each command's shell only;
- an uploaded file's parent directory must already exist.

A sandbox's working directory (the default cwd, and the base of relative file paths) is a
temporary directory, its `TMPDIR` a folder inside it; absolute paths are this machine's.
Its `SANDBOX_RUNNER_DIR` is a short folder of its own under /tmp (where the backend puts
the runner: a unix socket's path is short), removed with the sandbox.
`send_session_command_input` writes to the session shell's stdin pipe, which the
running command reads (it never ends: the daemon's sessions give no EOF).
Deleting a sandbox kills every process that still carries its marker in its environment
(the runner, started detached by a session command, and what it keeps included).

Fault knobs, for tests of code that uses the SDK (`point` names are in `FAULT_POINTS`,
which are the SDK method names; `ALIASES` maps connect/send/kill/logs to them;
thin wrappers over `fake.faults`, a `sandbox.testing.faults.FaultPlan`):

- `fail(point, exc, times=1, after=False)`: the next call(s) at `point` raise `exc`
  (an SDK exception instance), before doing anything or, with `after=True`, after doing
  their work (a sandbox created, a shell started, but the answer lost);
- `block(point, after=False) -> Gate`: calls at `point` stop and set `gate.reached` (an
  `asyncio.Event` a test waits on to cancel deterministically) until `gate.release()`;
  a gate never released is a call that never returns;
- `fail("stream", exc)`: the next PTY or log stream dies with `exc` right after it
  starts (the "reader that dies"); `drop_streams(reason)` does it to every open stream
  now. The processes behind a dead stream keep running, as on a real provider.

Exceptions, as the SDK (0.226.1) raises them in each situation the fake models: a wrong
API key: `DaytonaAuthenticationError` (401); `get` of an unknown sandbox and calls on a
deleted one: `DaytonaNotFoundError` (404); `create` with a name in use:
`DaytonaConflictError` (409); `send_input` to a PTY that is not connected (its process
exited, or the connection dropped): `DaytonaConnectionError("PTY is not connected")`,
a failed send: `DaytonaConnectionError("Failed to send input to PTY: ...")`; a PTY or log
stream that drops: `DaytonaConnectionError` (recorded in the handle's `error` for a
PTY); `kill_pty_session`/`resize_pty_session`/`get_pty_session_info` of an unknown PTY:
`DaytonaNotFoundError`; `connect_pty_session` to one: `DaytonaConnectionError`;
`download_file` of a missing path or a directory: `DaytonaFileNotFoundError` (404,
code FILE_NOT_FOUND), or a plain `DaytonaError` without status with
`download_error_details=False`; `upload_file` into a missing folder:
`DaytonaNotFoundError`, over a directory: `DaytonaBadRequestError` (400);
`get_file_info` of a missing path: `DaytonaNotFoundError`, under a file:
`DaytonaBadRequestError`; `create_snapshot` with a name in use: `DaytonaConflictError`
(409), `snapshot.delete` of an unknown one: `DaytonaNotFoundError`.

Snapshots: `sandbox.create_snapshot(name)` (daytona `_async/sandbox.py`, `POST
/sandbox/{id}/snapshot`, "captures the Sandbox's filesystem into a reusable snapshot")
copies the sandbox's folder (symlinks kept, FIFOs made anew); `create()` with
`CreateSandboxFromSnapshotParams(snapshot=<that name>)` starts a sandbox with those
files (another snapshot name is taken as a stock snapshot: an empty folder);
`daytona.snapshot.delete(name)` removes it. `snapshots` maps the names to the folders.

Leak checks: `leftover_pids()` lists live local processes started in any sandbox of the
fake, `open_streams()` the PTY handles and log streams still running,
`live_sandbox_ids()` the sandboxes not deleted.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import datetime
import inspect
import os
import secrets
import shutil
import signal
import stat as stat_module
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, overload

from daytona import (
    DaytonaAuthenticationError,
    DaytonaBadRequestError,
    DaytonaConflictError,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaNotFoundError,
    DaytonaTimeoutError,
    SandboxState,
)
from daytona.common.errors import SOURCE_DAEMON, DaytonaFileNotFoundError
from daytona.common.filesystem import CancelEvent, DownloadProgress
from daytona.common.process import ExecuteResponse, ExecutionArtifacts, SessionExecuteResponse
from daytona.common.pty import PtyResult, PtySize
from daytona_api_client_async import PortPreviewUrl
from daytona_toolbox_api_client_async import Command, FileInfo, PtySessionInfo

from ..files.remove_tree import discard_tree
from ..local.process import LocalProcess
from . import faults, procfs
from .preview_proxy import PreviewProxy
from .special_files import wait_forever_on_special_file

FAULT_POINTS = (
    "create",
    "get",
    "start",
    "delete",
    "exec",
    "create_session",
    "execute_session_command",
    "get_session_command_logs_async",
    "get_session_command",
    "delete_session",
    "send_session_command_input",
    "create_pty_session",
    "connect_pty_session",
    "kill_pty_session",
    "resize_pty_session",
    "get_pty_session_info",
    "list_pty_sessions",
    "send_input",
    "wait",
    "download_file",
    "upload_file",
    "get_file_info",
    "create_snapshot",
    "delete_snapshot",
    "stream",
)
ALIASES = {
    "connect": "create_pty_session",
    "send": "send_input",
    "kill": "kill_pty_session",
    "logs": "get_session_command_logs_async",
    "reconnect": "connect_pty_session",
}

# Set in every fake process's environment, so a leak check can find them by it.
MARKER_ENV = "SANDBOX_FAKE_DAYTONA"
# Where the backend puts the runner (its `$SANDBOX_RUNNER_DIR`): each fake sandbox gets a
# short folder of its own (a unix socket's path is at most 107 bytes, and the sandbox's
# TMPDIR under a test's temporary folder is too long for one).
RUNNER_DIR_ENV = "SANDBOX_RUNNER_DIR"
# A streamed download's chunk size (the SDK reads its response 64 KiB at a time).
DOWNLOAD_CHUNK = 64 * 1024
# How long an exited process's output may still trickle in before its end is reported.
EXIT_OUTPUT_GRACE_S = 0.05

# Go's names for signals (`syscall.Signal.String()` on Linux), as the daemon reports them.
GO_SIGNAL_NAMES = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
}


def _canonical(point: str) -> str:
    point = ALIASES.get(point, point)
    if point not in FAULT_POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(FAULT_POINTS)}")
    return point


# The gate every `block` returns (`sandbox.testing.faults.Gate`), under its old name here.
Gate = faults.Gate


async def _call(callback: Callable[[Any], Any], value: Any) -> None:
    """Call an SDK user callback, awaiting it when it is async (as the SDK does)."""
    result = callback(value)
    if inspect.isawaitable(result):
        await result


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _split(data: bytes, size: int | None) -> list[bytes]:
    if not size or len(data) <= size:
        return [data]
    return [data[i : i + size] for i in range(0, len(data), size)]


def _death_signal(pid: int) -> int | None:
    """The signal an exited (unreaped) child died of, or None for a normal exit."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None or info.si_code == os.CLD_EXITED:
        return None
    return info.si_status


def _marked_pids(prefix: str) -> list[int]:
    """Live local processes whose environment carries a marker starting with `prefix`."""
    return procfs.pids_with_env(MARKER_ENV, prefix, prefix=True)


def _shell_argv() -> list[str]:
    bash = shutil.which("bash")
    if bash:
        return [bash, "--noprofile", "--norc", "-i"]
    return ["sh", "-i"]


# ---- server-side state -------------------------------------------------------------------


class _SandboxState:
    """One sandbox of the fake service: its directory, terminals and sessions."""

    def __init__(self, service: FakeDaytona, name: str) -> None:
        self.service = service
        self.id = secrets.token_hex(8)
        self.name = name
        self.root = tempfile.mkdtemp(prefix=f"sandbox-{self.id}-", dir=service.root)
        self.root = os.path.realpath(self.root)
        self.tmp = os.path.join(self.root, ".tmp")
        os.makedirs(self.tmp)
        self.marker = f"{service.token}/{self.id}"
        # Made here: an uploaded file's parent must exist (as in /tmp of a real sandbox).
        self.runner_dir = tempfile.mkdtemp(prefix="drun-", dir="/tmp")
        service.runner_dirs.append(self.runner_dir)
        self.state: Any = SandboxState.STARTED
        self.ptys: dict[str, _FakePty] = {}
        self.sessions: dict[str, _FakeSession] = {}
        self.retired: list[_FakeSession] = []  # deleted sessions whose shells may linger
        self.deleted = False
        self.params: Any = None
        # What the create was given, as the API keeps it (`SandboxDto.labels`).
        self.labels: dict[str, str] = {}
        self.previews: dict[int, PreviewProxy] = {}  # port -> its preview forwarder

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": self.root,
            "TMPDIR": self.tmp,
            "LANG": "C.UTF-8",
            MARKER_ENV: self.marker,
            RUNNER_DIR_ENV: self.runner_dir,
        }
        if extra:
            env.update(extra)
        return env

    def resolve(self, path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(self.root, path)

    def require_alive(self) -> None:
        if self.deleted:
            raise DaytonaNotFoundError(f"Sandbox {self.id} not found", status_code=404)

    async def destroy(self) -> None:
        """Kill every process started in the sandbox and remove its directory."""
        self.deleted = True
        self.state = SandboxState.DESTROYED
        ptys = list(self.ptys.values())
        sessions = list(self.sessions.values()) + self.retired
        for pty in ptys:
            pty.kill_leader()
        for session in sessions:
            session.close()
        for _ in range(50):
            pids = _marked_pids(self.marker)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.01)
        for pty in ptys:
            await pty.destroy()
        for session in sessions:
            await session.destroy()
        self.ptys.clear()
        self.sessions.clear()
        self.retired.clear()
        await asyncio.to_thread(shutil.rmtree, self.runner_dir, True)
        await asyncio.to_thread(discard_tree, self.root)


class _FakePty:
    """A PTY session on the fake daemon: an interactive shell on a real terminal."""

    def __init__(
        self,
        sandbox: _SandboxState,
        pty_id: str,
        *,
        cwd: str | None,
        envs: dict[str, str] | None,
        rows: int,
        cols: int,
    ) -> None:
        self.sandbox = sandbox
        self.id = pty_id
        self.cwd = sandbox.resolve(cwd) if cwd else sandbox.root
        self.rows = rows
        self.cols = cols
        self.created_at = datetime.datetime.now(datetime.UTC).isoformat()
        # One queue per connected client (the daemon's `clients`): output goes to those
        # connected now and nowhere else; None marks the end, a str a dropped connection.
        self.clients: list[asyncio.Queue[bytes | str | None]] = []
        self.exit_code: int | None = None
        self.exit_reason: str | None = None
        self.finished = asyncio.Event()
        self._finisher: asyncio.Task[None] | None = None
        env = sandbox.env({"PS1": "$ ", "TERM": "xterm-256color", **(envs or {})})
        self.local = LocalProcess.spawn(
            _shell_argv(),
            tty=True,
            env=env,
            cwd=self.cwd,
            rows=rows,
            cols=cols,
            on_stdout=self._on_output,
            on_exit=self._on_exit,
        )
        self.pid = self.local.pid

    def attach(self) -> asyncio.Queue[bytes | str | None]:
        """Register a connection; its queue gets the output from now on."""
        queue: asyncio.Queue[bytes | str | None] = asyncio.Queue()
        self.clients.append(queue)
        return queue

    def detach(self, queue: asyncio.Queue[bytes | str | None]) -> None:
        """Unregister a connection (the process keeps running)."""
        if queue in self.clients:
            self.clients.remove(queue)

    def info(self) -> PtySessionInfo:
        """The session as `get_pty_session_info` describes it."""
        return PtySessionInfo(
            active=not self.finished.is_set(),
            cols=self.cols,
            created_at=self.created_at,
            cwd=self.cwd,
            envs={},
            id=self.id,
            lazy_start=False,
            rows=self.rows,
        )

    def _on_output(self, data: bytes) -> None:
        # The daemon's broadcast: the connected clients get it, nobody keeps it.
        for queue in self.clients:
            queue.put_nowait(data)

    def _on_exit(self, code: int) -> None:
        self._finisher = asyncio.get_running_loop().create_task(self._finish(code))

    async def _finish(self, local_code: int) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(EXIT_OUTPUT_GRACE_S):
                await self.local.wait_eof()
        self.local.drain_now()
        sig = _death_signal(self.pid)
        if sig is None:
            self.exit_code = local_code
        elif self.sandbox.service.signal_exit == "shell":
            self.exit_code = 128 + sig
        else:
            self.exit_code = -1
            self.exit_reason = f"signal: {GO_SIGNAL_NAMES.get(sig, f'signal {sig}')}"
        # The daemon reaps its shell; children the shell left behind stay alive.
        self.local.close(kill_group=False)
        self.sandbox.ptys.pop(self.id, None)
        clients, self.clients = self.clients, []
        for queue in clients:
            queue.put_nowait(None)
        self.finished.set()

    async def write(self, data: bytes) -> None:
        await self.local.write(data)

    def kill_leader(self) -> bool:
        if self.local.exited:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return True

    async def destroy(self) -> None:
        self.kill_leader()
        if self._finisher is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self.local.wait()
        if self._finisher is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await asyncio.shield(self._finisher)
            if not self._finisher.done():
                self._finisher.cancel()
                await asyncio.wait([self._finisher])
        self.local.close()


class _FakeCommand:
    """A command run in a session: its output (kept, like the daemon's log) and exit."""

    def __init__(
        self, session: _FakeSession, command: str, argv: list[str], env: dict[str, str]
    ) -> None:
        self.id = secrets.token_hex(6)
        self.command = command
        self.session = session
        self.chunks: list[tuple[str, bytes]] = []
        self.exit_code: int | None = None
        self.done = asyncio.Event()
        self._waiters: list[asyncio.Future[None]] = []
        self._finisher: asyncio.Task[None] | None = None
        self.local = LocalProcess.spawn(
            argv,
            tty=False,
            env=env,
            cwd=session.sandbox.root,
            on_stdout=lambda data: self._append("stdout", data),
            on_stderr=lambda data: self._append("stderr", data),
            on_exit=self._on_exit,
        )
        self.pid = self.local.pid

    def _append(self, stream: str, data: bytes) -> None:
        self.chunks.append((stream, data))
        self._notify()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def change(self) -> asyncio.Future[None]:
        """A future resolved at the next output chunk or the end."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def _on_exit(self, code: int) -> None:
        self._finisher = asyncio.get_running_loop().create_task(self._finish(code))

    async def _finish(self, code: int) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(EXIT_OUTPUT_GRACE_S):
                await self.local.wait_eof()
        self.local.drain_now()
        self.exit_code = code
        self.local.close(kill_group=False)
        self.done.set()
        self._notify()

    def kill_leader(self) -> None:
        if not self.local.exited:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    async def destroy(self) -> None:
        self.kill_leader()
        if self._finisher is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self.local.wait()
        if self._finisher is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await asyncio.shield(self._finisher)
            if not self._finisher.done():
                self._finisher.cancel()
                await asyncio.wait([self._finisher])
        self.local.close()


class _FakeSession:
    """A daemon session: a shell whose stdin is a pipe that stays open."""

    def __init__(self, sandbox: _SandboxState, session_id: str) -> None:
        self.sandbox = sandbox
        self.id = session_id
        self.commands: dict[str, _FakeCommand] = {}
        self.fifo = os.path.join(sandbox.tmp, f".session-{secrets.token_hex(6)}")
        os.mkfifo(self.fifo, 0o600)
        # Held open for reading and writing: readers of the fifo never see EOF.
        self.fifo_fd: int | None = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)

    def run(self, command: str) -> _FakeCommand:
        argv = ["sh", "-c", 'exec 0<"$1"; eval "$2"', "daytona-session", self.fifo, command]
        cmd = _FakeCommand(self, command, argv, self.sandbox.env())
        self.commands[cmd.id] = cmd
        return cmd

    async def write(self, data: bytes) -> None:
        """Write to the session shell's stdin pipe (what its running command reads),
        waiting while the pipe is full."""
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        while view:
            fd = self.fifo_fd
            if fd is None:
                raise DaytonaNotFoundError(f"session {self.id} not found", status_code=404)
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                ready: asyncio.Future[None] = loop.create_future()
                loop.add_writer(fd, _resolve, ready)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)

    def close(self) -> None:
        for cmd in self.commands.values():
            cmd.kill_leader()
        if self.fifo_fd is not None:
            os.close(self.fifo_fd)
            self.fifo_fd = None
            with contextlib.suppress(OSError):
                os.unlink(self.fifo)

    async def destroy(self) -> None:
        self.close()
        for cmd in self.commands.values():
            await cmd.destroy()


# ---- the SDK surface ------------------------------------------------------------------------


class FakeAsyncPtyHandle:
    """Stands in for `daytona.handle.async_pty_handle.AsyncPtyHandle`."""

    def __init__(
        self,
        service: FakeDaytona,
        pty: _FakePty,
        on_data: Callable[[bytes], None] | Callable[[bytes], Awaitable[None]],
    ) -> None:
        self._service = service
        self._pty = pty
        self._queue = pty.attach()
        self._on_data = on_data
        self._exit_code: int | None = None
        self._error: str | None = None
        self._connected = True
        self._wait: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._reader())
        service._handles.append(self)

    @property
    def exit_code(self) -> int | None:
        """Exit code of the PTY process (if it exited)."""
        return self._exit_code

    @property
    def error(self) -> str | None:
        """Error message if the PTY failed or the connection broke."""
        return self._error

    async def _reader(self) -> None:
        try:
            failure = self._service._knobs.take("stream", after=False)
            if isinstance(failure, BaseException):
                raise failure
            while True:
                item = await self._queue.get()
                if isinstance(item, str):
                    raise DaytonaConnectionError(item)
                if item is None:
                    self._exit_code = self._pty.exit_code
                    if self._pty.exit_reason is not None:
                        self._error = self._pty.exit_reason
                    return
                for piece in _split(item, self._service.max_chunk):
                    await _call(self._on_data, piece)
        except Exception as exc:  # the SDK's reader records any failure and ends
            self._error = f"Unexpected error: {exc}"
        finally:
            self._connected = False

    def _break(self, reason: str) -> None:
        if not self._wait.done():
            self._queue.put_nowait(reason)

    async def send_input(self, data: str | bytes) -> None:
        """Send input to the terminal."""
        await self._service._knobs.checkpoint("send_input")
        if not self._connected:
            raise DaytonaConnectionError("PTY is not connected")
        try:
            await self._pty.write(data.encode("utf-8") if isinstance(data, str) else data)
        except Exception as exc:
            raise DaytonaConnectionError(f"Failed to send input to PTY: {exc}") from exc
        await self._service._knobs.checkpoint("send_input", after=True)

    async def wait(self) -> PtyResult:
        """Wait until the PTY process exits (or the connection ends)."""
        await self._service._knobs.checkpoint("wait")
        await asyncio.shield(self._wait)
        await self._service._knobs.checkpoint("wait", after=True)
        return PtyResult(exit_code=self._exit_code, error=self._error)

    async def disconnect(self) -> None:
        """Close the connection; the process on the daemon keeps running."""
        self._pty.detach(self._queue)
        if not self._wait.done():
            self._wait.cancel()
            await asyncio.wait([self._wait])


class FakeAsyncProcess:
    """Stands in for `daytona._async.process.AsyncProcess` (a sandbox's `.process`)."""

    def __init__(self, service: FakeDaytona, sandbox: _SandboxState) -> None:
        self._service = service
        self._sandbox = sandbox

    async def _check(self, point: str) -> None:
        await self._service._knobs.checkpoint(point)
        self._sandbox.require_alive()

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: int | None = None,
    ) -> ExecuteResponse:
        """Run a shell command to completion; stdout and stderr come back combined."""
        await self._check("exec")
        output = bytearray()
        local = LocalProcess.spawn(
            ["sh", "-c", command],
            tty=False,
            env=self._sandbox.env(env),
            cwd=self._sandbox.resolve(cwd) if cwd else self._sandbox.root,
            on_stdout=output.extend,
        )
        try:
            async with asyncio.timeout(timeout or None):
                code = await local.wait()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(EXIT_OUTPUT_GRACE_S):
                        await local.wait_eof()
                local.drain_now()
        except TimeoutError:
            raise DaytonaTimeoutError(
                f"Failed to execute command: timed out after {timeout}s"
            ) from None
        finally:
            local.close()
        await self._service._knobs.checkpoint("exec", after=True)
        text = bytes(output).decode("utf-8", "replace")
        return ExecuteResponse.model_construct(
            exit_code=code,
            result=text,
            artifacts=ExecutionArtifacts(stdout=text, charts=[]),
            additional_properties={},
        )

    async def create_session(self, session_id: str, request_timeout: float | None = None) -> None:
        """Create a background session (a shell with an open stdin pipe)."""
        await self._check("create_session")
        if session_id in self._sandbox.sessions:
            raise DaytonaConflictError(
                f"Failed to create session: session {session_id} already exists", status_code=409
            )
        self._sandbox.sessions[session_id] = _FakeSession(self._sandbox, session_id)
        await self._service._knobs.checkpoint("create_session", after=True)

    def _session(self, session_id: str) -> _FakeSession:
        session = self._sandbox.sessions.get(session_id)
        if session is None:
            raise DaytonaNotFoundError(f"session {session_id} not found", status_code=404)
        return session

    def _command(self, session_id: str, command_id: str) -> _FakeCommand:
        cmd = self._session(session_id).commands.get(command_id)
        if cmd is None:
            raise DaytonaNotFoundError(f"command {command_id} not found", status_code=404)
        return cmd

    async def execute_session_command(
        self, session_id: str, req: Any, timeout: int | None = None
    ) -> SessionExecuteResponse:
        """Run `req.command` in the session; with `req.run_async` return at once."""
        await self._check("execute_session_command")
        cmd = self._session(session_id).run(req.command)
        await self._service._knobs.checkpoint("execute_session_command", after=True)
        if req.run_async:
            return SessionExecuteResponse.model_construct(
                cmd_id=cmd.id,
                output=None,
                stdout="",
                stderr="",
                exit_code=None,
                additional_properties={},
            )
        await cmd.done.wait()
        out = b"".join(d for s, d in cmd.chunks if s == "stdout").decode("utf-8", "replace")
        err = b"".join(d for s, d in cmd.chunks if s == "stderr").decode("utf-8", "replace")
        return SessionExecuteResponse.model_construct(
            cmd_id=cmd.id,
            output=out + err,
            stdout=out,
            stderr=err,
            exit_code=cmd.exit_code,
            additional_properties={},
        )

    async def get_session_command_logs_async(
        self,
        session_id: str,
        command_id: str,
        on_stdout: Callable[[str], Any],
        on_stderr: Callable[[str], Any],
    ) -> None:
        """Stream a command's output from its start until it ends (as text)."""
        await self._check("get_session_command_logs_async")
        cmd = self._command(session_id, command_id)
        decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")(errors="replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")(errors="replace"),
        }
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        stream = asyncio.current_task()
        assert stream is not None
        drop: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._service._log_streams[stream] = drop
        try:
            failure = self._service._knobs.take("stream", after=False)
            if isinstance(failure, BaseException):
                raise failure
            index = 0
            while True:
                while index < len(cmd.chunks):
                    if drop.done():
                        raise DaytonaConnectionError(drop.result())
                    name, data = cmd.chunks[index]
                    index += 1
                    for piece in _split(data, self._service.max_chunk):
                        text = decoders[name].decode(piece, final=False)
                        if text:
                            await _call(callbacks[name], text)
                if cmd.done.is_set() and index >= len(cmd.chunks):
                    break
                watched: list[asyncio.Future[Any]] = [cmd.change(), drop]
                await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
                if drop.done():
                    raise DaytonaConnectionError(drop.result())
        finally:
            self._service._log_streams.pop(stream, None)
        for name, decoder in decoders.items():
            tail = decoder.decode(b"", final=True)
            if tail:
                await _call(callbacks[name], tail)
        await self._service._knobs.checkpoint("get_session_command_logs_async", after=True)

    async def get_session_command(
        self, session_id: str, command_id: str, request_timeout: float | None = None
    ) -> Command:
        """A command's state; `exit_code` is None while it runs."""
        await self._check("get_session_command")
        cmd = self._command(session_id, command_id)
        await self._service._knobs.checkpoint("get_session_command", after=True)
        return Command(id=cmd.id, command=cmd.command, exit_code=cmd.exit_code)

    async def send_session_command_input(
        self, session_id: str, command_id: str, data: str, request_timeout: float | None = None
    ) -> None:
        """Send `data` to the command's stdin (the session shell's pipe, which the
        command reads); a command that ended takes no more."""
        await self._check("send_session_command_input")
        session = self._session(session_id)
        cmd = self._command(session_id, command_id)
        if cmd.exit_code is not None:
            raise DaytonaError(f"command {command_id} is not running")
        await session.write(data.encode("utf-8"))
        await self._service._knobs.checkpoint("send_session_command_input", after=True)

    async def delete_session(self, session_id: str, request_timeout: float | None = None) -> None:
        """Delete a session, SIGKILLing its commands' shells (not their children)."""
        await self._check("delete_session")
        session = self._session(session_id)
        del self._sandbox.sessions[session_id]
        session.close()
        self._sandbox.retired.append(session)
        await self._service._knobs.checkpoint("delete_session", after=True)

    async def create_pty_session(
        self,
        id: str,
        on_data: Callable[[bytes], None] | Callable[[bytes], Awaitable[None]],
        cwd: str | None = None,
        envs: dict[str, str] | None = None,
        pty_size: PtySize | None = None,
    ) -> FakeAsyncPtyHandle:
        """Start an interactive shell on a new terminal and connect to it."""
        await self._check("create_pty_session")
        if id in self._sandbox.ptys:
            raise DaytonaConflictError("WebSocket upgrade failed with HTTP 409", status_code=409)
        if cwd and not await asyncio.to_thread(os.path.isdir, self._sandbox.resolve(cwd)):
            raise DaytonaBadRequestError(f"invalid cwd {cwd!r}", status_code=400)
        pty = _FakePty(
            self._sandbox,
            id,
            cwd=cwd,
            envs=envs,
            rows=pty_size.rows if pty_size else 24,
            cols=pty_size.cols if pty_size else 80,
        )
        self._sandbox.ptys[id] = pty
        handle = FakeAsyncPtyHandle(self._service, pty, on_data)
        try:
            await self._service._knobs.checkpoint("create_pty_session", after=True)
        except BaseException:
            # As the SDK does: the connection is closed, the daemon's shell lives on.
            await handle.disconnect()
            raise
        return handle

    async def connect_pty_session(
        self,
        session_id: str,
        on_data: Callable[[bytes], None] | Callable[[bytes], Awaitable[None]],
    ) -> FakeAsyncPtyHandle:
        """Connect to a running PTY session: its output from now on, then its exit. The
        daemon upgrades the WebSocket first and reports an unknown (or ended, hence
        deleted) session in an error control message, which the SDK raises from
        `wait_for_connection` as a `DaytonaConnectionError` (no status code)."""
        await self._check("connect_pty_session")
        pty = self._sandbox.ptys.get(session_id)
        if pty is None:
            raise DaytonaConnectionError(
                "Failed to connect PTY session: Failed to connect to PTY session: "
                f"PTY session {session_id} not found"
            )
        handle = FakeAsyncPtyHandle(self._service, pty, on_data)
        try:
            await self._service._knobs.checkpoint("connect_pty_session", after=True)
        except BaseException:
            # As the SDK does: a connect that fails or is cancelled closes its socket.
            await handle.disconnect()
            raise
        return handle

    async def list_pty_sessions(self, request_timeout: float | None = None) -> list[PtySessionInfo]:
        """The sandbox's PTY sessions (those whose process has not ended)."""
        await self._check("list_pty_sessions")
        infos = [pty.info() for pty in self._sandbox.ptys.values()]
        await self._service._knobs.checkpoint("list_pty_sessions", after=True)
        return infos

    async def get_pty_session_info(
        self, session_id: str, request_timeout: float | None = None
    ) -> PtySessionInfo:
        """One PTY session; an unknown (or ended, hence deleted) one is a 404."""
        await self._check("get_pty_session_info")
        pty = self._sandbox.ptys.get(session_id)
        if pty is None:
            raise DaytonaNotFoundError(
                "Failed to get PTY session info: PTY session not found", status_code=404
            )
        await self._service._knobs.checkpoint("get_pty_session_info", after=True)
        return pty.info()

    async def kill_pty_session(self, session_id: str, request_timeout: float | None = None) -> None:
        """SIGKILL a PTY session's shell (its children are left alone, as the daemon does)."""
        await self._check("kill_pty_session")
        pty = self._sandbox.ptys.get(session_id)
        if pty is None or not pty.kill_leader():
            raise DaytonaNotFoundError(f"PTY session {session_id} not found", status_code=404)
        await self._service._knobs.checkpoint("kill_pty_session", after=True)

    async def resize_pty_session(
        self, session_id: str, pty_size: PtySize, request_timeout: float | None = None
    ) -> PtySessionInfo:
        """Resize a PTY session's terminal."""
        await self._check("resize_pty_session")
        pty = self._sandbox.ptys.get(session_id)
        if pty is None:
            raise DaytonaNotFoundError(f"PTY session {session_id} not found", status_code=404)
        pty.local.resize(pty_size.rows, pty_size.cols)
        pty.rows, pty.cols = pty_size.rows, pty_size.cols
        await self._service._knobs.checkpoint("resize_pty_session", after=True)
        return pty.info()


class FakeAsyncFileSystem:
    """Stands in for `daytona._async.filesystem.AsyncFileSystem` (a sandbox's `.fs`)."""

    def __init__(self, service: FakeDaytona, sandbox: _SandboxState) -> None:
        self._service = service
        self._sandbox = sandbox

    @overload
    async def download_file(self, remote_path: str, timeout: int = 30 * 60) -> bytes: ...

    @overload
    async def download_file(
        self, remote_path: str, local_path: str, timeout: int = 30 * 60
    ) -> None: ...

    async def download_file(self, *args: str) -> bytes | None:  # type: ignore[misc]
        """Read a file (the one-argument form: returns its bytes). A directory is "not
        found"; a FIFO or device is opened and waited on forever, as the daemon does."""
        await self._service._knobs.checkpoint("download_file")
        self._sandbox.require_alive()
        path = self._sandbox.resolve(args[0])
        await wait_forever_on_special_file(path)

        def read() -> bytes:
            with open(path, "rb") as handle:
                return handle.read()

        try:
            data = await asyncio.to_thread(read)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            if not self._service.download_error_details:
                raise DaytonaError(
                    f"Failed to download file: open {path}: {(exc.strerror or str(exc)).lower()}"
                ) from None
            raise DaytonaFileNotFoundError(
                f"Failed to download file: file not found: {args[0]}",
                status_code=404,
                code="FILE_NOT_FOUND",
                source=SOURCE_DAEMON,
            ) from None
        await self._service._knobs.checkpoint("download_file", after=True)
        return data

    async def download_file_stream(
        self,
        remote_path: str,
        timeout: int = 30 * 60,
        on_progress: Callable[[DownloadProgress], Awaitable[None] | None] | None = None,
        cancel_event: CancelEvent | None = None,
    ) -> AsyncIterator[bytes]:
        """The file's chunks as the daemon streams them (read from the file as it is
        now, so one that grew after its stat streams on). As in the SDK, the request and
        its errors come with the first chunk, the same errors `download_file` raises,
        and a file that gave no data at all is `DaytonaError("No file data received")`."""
        path = self._sandbox.resolve(remote_path)

        async def chunks() -> AsyncIterator[bytes]:
            await self._service._knobs.checkpoint("download_file")
            self._sandbox.require_alive()
            await wait_forever_on_special_file(path)
            try:
                handle = await asyncio.to_thread(open, path, "rb")
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
                raise self._download_error(remote_path, path, exc) from None
            sent = False
            try:
                while chunk := await asyncio.to_thread(handle.read, DOWNLOAD_CHUNK):
                    sent = True
                    yield chunk
            finally:
                handle.close()
            if not sent:
                raise DaytonaError(f"No file data received for: {remote_path}")

        return chunks()

    def _download_error(self, remote_path: str, path: str, exc: OSError) -> DaytonaError:
        if not self._service.download_error_details:
            return DaytonaError(
                f"Failed to download file: open {path}: {(exc.strerror or str(exc)).lower()}"
            )
        return DaytonaFileNotFoundError(
            f"Failed to download file: file not found: {remote_path}",
            status_code=404,
            code="FILE_NOT_FOUND",
            source=SOURCE_DAEMON,
        )

    @overload
    async def upload_file(self, file: bytes, remote_path: str, timeout: int = 30 * 60) -> None: ...

    @overload
    async def upload_file(
        self, local_path: str, remote_path: str, timeout: int = 30 * 60
    ) -> None: ...

    async def upload_file(  # type: ignore[misc]
        self, src: str | bytes, dst: str, timeout: int = 30 * 60
    ) -> None:
        """Write a file (from bytes, or from a local path). The parent must exist. As the
        daemon does, the data goes to a temporary file renamed over `dst` (so a FIFO
        there is replaced); a directory there is a 400."""
        await self._service._knobs.checkpoint("upload_file")
        self._sandbox.require_alive()
        path = self._sandbox.resolve(dst)

        def write() -> None:
            if isinstance(src, bytes):
                data = src
            else:
                with open(src, "rb") as source:
                    data = source.read()
            fd, temporary = tempfile.mkstemp(prefix=".daytona-upload-", dir=os.path.dirname(path))
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.chmod(temporary, 0o644)
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise

        try:
            await asyncio.to_thread(write)
        except (FileNotFoundError, NotADirectoryError):
            raise DaytonaNotFoundError(
                f"Failed to upload files: parent directory of {dst} does not exist",
                status_code=404,
            ) from None
        except (IsADirectoryError, FileExistsError, OSError) as exc:
            raise DaytonaBadRequestError(
                f"Failed to upload files: {dst}: rename: {exc.strerror}", status_code=400
            ) from None
        await self._service._knobs.checkpoint("upload_file", after=True)

    async def get_file_info(self, path: str, request_timeout: float | None = None) -> FileInfo:
        """The daemon's os.Stat (symlinks followed); `mode` is Go's FileMode.String()."""
        await self._service._knobs.checkpoint("get_file_info")
        self._sandbox.require_alive()
        real = self._sandbox.resolve(path)
        try:
            info = await asyncio.to_thread(os.stat, real)
        except FileNotFoundError:
            raise DaytonaNotFoundError(
                f"Failed to get file info: stat {path}: no such file or directory",
                status_code=404,
            ) from None
        except OSError as exc:
            raise DaytonaBadRequestError(
                f"Failed to get file info: stat {path}: {exc.strerror}", status_code=400
            ) from None
        return FileInfo(
            name=os.path.basename(real),
            is_dir=stat_module.S_ISDIR(info.st_mode),
            size=info.st_size,
            mode=_go_mode_string(info.st_mode),
            mod_time=str(info.st_mtime),
            permissions=f"{stat_module.S_IMODE(info.st_mode):04o}",
            owner=str(info.st_uid),
            group=str(info.st_gid),
        )


def _copy_tree(source: str, target: str) -> None:
    """Copy a sandbox's files as a snapshot keeps them: symlinks as links, FIFOs made
    anew (never opened), sockets and devices left out."""

    def copy(src: str, dst: str) -> None:
        info = os.lstat(src)
        if stat_module.S_ISFIFO(info.st_mode):
            os.mkfifo(dst, stat_module.S_IMODE(info.st_mode))
        elif stat_module.S_ISREG(info.st_mode):
            shutil.copy2(src, dst)

    shutil.copytree(source, target, symlinks=True, copy_function=copy, dirs_exist_ok=True)


def _go_mode_string(mode: int) -> str:
    """Go's `os.FileMode.String()` for an st_mode (the type letters Go uses)."""
    if stat_module.S_ISDIR(mode):
        kind = "d"
    elif stat_module.S_ISFIFO(mode):
        kind = "p"
    elif stat_module.S_ISSOCK(mode):
        kind = "S"
    elif stat_module.S_ISCHR(mode):
        kind = "Dc"
    elif stat_module.S_ISBLK(mode):
        kind = "D"
    else:
        kind = "-"
    return kind + stat_module.filemode(mode)[1:]


class FakeAsyncSandbox:
    """Stands in for `daytona.AsyncSandbox`."""

    id: str = ""
    name: str = ""
    state: Any = None
    labels: dict[str, str]

    def __init__(self, service: FakeDaytona, state: _SandboxState) -> None:
        self._service = service
        self._state = state
        self.id = state.id
        self.name = state.name
        self.state = state.state
        # A copy, as each SDK object holds the labels of the answer it was made from.
        self.labels = dict(state.labels)
        self._process = FakeAsyncProcess(service, state)
        self._fs = FakeAsyncFileSystem(service, state)

    def __repr__(self) -> str:
        return f"<FakeAsyncSandbox id={self.id} name={self.name}>"

    @property
    def process(self) -> FakeAsyncProcess:
        """Process execution (commands, sessions, PTYs)."""
        return self._process

    @property
    def fs(self) -> FakeAsyncFileSystem:
        """File system operations."""
        return self._fs

    async def start(self, timeout: float | None = 60) -> None:
        """Start a stopped sandbox."""
        await self._service._knobs.checkpoint("start")
        self._state.require_alive()
        self._state.state = self.state = SandboxState.STARTED
        await self._service._knobs.checkpoint("start", after=True)

    async def get_preview_link(
        self, port: int, request_timeout: float | None = None
    ) -> PortPreviewUrl:
        """The preview URL of `port` and its token: a loopback forwarder that answers
        401 unless `X-Daytona-Preview-Token` carries the token (Daytona's private
        sandboxes), one per port, closed with the sandbox."""
        await self._service._knobs.checkpoint("get_preview_link")
        self._state.require_alive()
        proxy = self._state.previews.get(port)
        if proxy is None:
            proxy = PreviewProxy(
                port, header="X-Daytona-Preview-Token", token=secrets.token_urlsafe(16)
            )
            self._state.previews[port] = await proxy.start()
        return PortPreviewUrl(sandbox_id=self.id, url=proxy.url, token=proxy._token)

    async def create_snapshot(self, name: str, timeout: float | None = 60) -> None:
        """Capture the sandbox's files as the snapshot `name` (`POST
        /sandbox/{id}/snapshot`); the sandbox is `SNAPSHOTTING` meanwhile and then back
        in its state. A name in use: `DaytonaConflictError` (409)."""
        await self._service._knobs.checkpoint("create_snapshot")
        self._state.require_alive()
        if name in self._service.snapshots:
            raise DaytonaConflictError(
                f"Failed to create snapshot: snapshot with name {name} already exists",
                status_code=409,
            )
        before, self._state.state = self._state.state, SandboxState.SNAPSHOTTING
        folder = os.path.join(self._service.root, "snapshots", secrets.token_hex(8))
        try:
            await asyncio.to_thread(_copy_tree, self._state.root, folder)
        finally:
            self._state.state = before
        self._service.snapshots[name] = folder
        await self._service._knobs.checkpoint("create_snapshot", after=True)

    async def delete(self, timeout: float | None = 60, wait: bool = False) -> None:
        """Delete the sandbox and everything running in it."""
        await self._service._knobs.checkpoint("delete")
        self._state.require_alive()
        await self._service._delete(self._state)
        self.state = SandboxState.DESTROYED
        await self._service._knobs.checkpoint("delete", after=True)


class FakeAsyncSnapshotService:
    """Stands in for `daytona._async.snapshot.AsyncSnapshotService` (`daytona.snapshot`):
    deleting the snapshots `create_snapshot` made."""

    def __init__(self, client: FakeAsyncDaytona) -> None:
        self._client = client

    async def delete(self, snapshot: Any) -> None:
        """Delete a snapshot by name (or a `Snapshot`'s `name`); unknown:
        `DaytonaNotFoundError` (404)."""
        self._client._authorize()
        service = self._client._service
        await service._knobs.checkpoint("delete_snapshot")
        name = snapshot if isinstance(snapshot, str) else str(getattr(snapshot, "name", ""))
        folder = service.snapshots.pop(name, None)
        if folder is None:
            raise DaytonaNotFoundError(
                f"Failed to delete snapshot: Snapshot {name} not found", status_code=404
            )
        await asyncio.to_thread(discard_tree, folder)


class FakeAsyncDaytona:
    """Stands in for `daytona.AsyncDaytona`; use `FakeDaytona(...).AsyncDaytona`, which is
    bound to that fake service."""

    _service: ClassVar[FakeDaytona]

    def __init__(self, config: Any = None) -> None:
        key = getattr(config, "api_key", None) or os.environ.get("DAYTONA_API_KEY")
        if not key:
            raise DaytonaAuthenticationError(
                "Authentication credentials not found. Set DAYTONA_API_KEY, or both "
                "DAYTONA_JWT_TOKEN and DAYTONA_ORGANIZATION_ID."
            )
        self._key = key
        self._closed = False
        self.snapshot = FakeAsyncSnapshotService(self)

    def __repr__(self) -> str:
        return "<FakeAsyncDaytona>"

    def _authorize(self) -> None:
        if self._closed:
            raise DaytonaError("Session is closed: Daytona client is closed")
        if not secrets.compare_digest(self._key, self._service.api_key):
            raise DaytonaAuthenticationError("Unauthorized: invalid API key", status_code=401)

    @overload
    async def create(self, params: Any = None, *, timeout: float = 60) -> FakeAsyncSandbox: ...

    @overload
    async def create(
        self,
        params: Any = None,
        *,
        timeout: float = 60,
        on_snapshot_create_logs: Callable[[str], None] | None = None,
    ) -> FakeAsyncSandbox: ...

    async def create(
        self,
        params: Any = None,
        *,
        timeout: float = 60,
        on_snapshot_create_logs: Callable[[str], None] | None = None,
    ) -> FakeAsyncSandbox:
        """Create (and start) a sandbox."""
        self._authorize()
        await self._service._knobs.checkpoint("create")
        name = getattr(params, "name", None) or f"sandbox-{secrets.token_hex(4)}"
        if any(s.name == name for s in self._service.sandboxes.values()):
            raise DaytonaConflictError(
                f"Failed to create sandbox: sandbox named {name} already exists",
                status_code=409,
            )
        state = self._service._new_sandbox(name)
        state.params = params  # what the create asked for (resources, labels, ...)
        # daytona `AsyncDaytona._create` adds the language label (`code-toolbox-language`,
        # "python" unless `params.language` says otherwise) to the labels it sends.
        language = str(getattr(params, "language", None) or "python")
        state.labels = {
            **(getattr(params, "labels", None) or {}),
            "code-toolbox-language": language,
        }
        snapshot = self._service.snapshots.get(getattr(params, "snapshot", None) or "")
        if snapshot is not None:  # a snapshot `create_snapshot` made: its files
            await asyncio.to_thread(_copy_tree, snapshot, state.root)
        await self._service._knobs.checkpoint("create", after=True)
        return FakeAsyncSandbox(self._service, state)

    async def get(
        self, sandbox_id_or_name: str, request_timeout: float | None = None
    ) -> FakeAsyncSandbox:
        """Look a sandbox up by id or name."""
        self._authorize()
        await self._service._knobs.checkpoint("get")
        for state in self._service.sandboxes.values():
            if sandbox_id_or_name in (state.id, state.name):
                await self._service._knobs.checkpoint("get", after=True)
                return FakeAsyncSandbox(self._service, state)
        raise DaytonaNotFoundError(
            f"Failed to get sandbox: Sandbox with ID or name {sandbox_id_or_name} not found",
            status_code=404,
        )

    async def close(self) -> None:
        """Release the client's connections."""
        self._closed = True


# The SDK class each fake class stands for, by name (the drift check maps return
# annotations with it).
SDK_NAMES = {
    "FakeAsyncDaytona": "AsyncDaytona",
    "FakeAsyncSnapshotService": "AsyncSnapshotService",
    "FakeAsyncSandbox": "AsyncSandbox",
    "FakeAsyncProcess": "AsyncProcess",
    "FakeAsyncFileSystem": "AsyncFileSystem",
    "FakeAsyncPtyHandle": "AsyncPtyHandle",
}


class FakeDaytona:
    """A pretend Daytona service: sandboxes made of local processes, plus fault knobs.

    `api_key` is the only key it accepts. `root` holds the sandboxes' directories (a
    temporary directory by default). `signal_exit` is how a PTY process killed by a
    signal is reported: "go" (exit code -1 and `signal: <name>`) or "shell" (128+N).
    `max_chunk` splits every output chunk into pieces of at most that many bytes before
    it reaches the SDK's callbacks (to exercise split characters).
    `download_error_details=False` is a daemon that answers a failed download with text
    only: the SDK then raises a plain `DaytonaError("Failed to download file: <text>")`
    without status or code (`daytona.common.filesystem.create_file_download_error`).
    """

    def __init__(
        self,
        *,
        api_key: str = "fake-daytona-key",
        root: str | os.PathLike[str] | None = None,
        signal_exit: str = "go",
        max_chunk: int | None = None,
        download_error_details: bool = True,
    ) -> None:
        if signal_exit not in ("go", "shell"):
            raise ValueError("signal_exit must be 'go' or 'shell'")
        self.api_key = api_key
        self.signal_exit = signal_exit
        self.max_chunk = max_chunk
        self.download_error_details = download_error_details
        self.token = secrets.token_hex(6)
        self._own_root = root is None
        self.root = (
            os.fspath(root) if root is not None else tempfile.mkdtemp(prefix="fake-daytona-")
        )
        os.makedirs(self.root, exist_ok=True)
        self.sandboxes: dict[str, _SandboxState] = {}
        self.snapshots: dict[str, str] = {}  # snapshot name -> the folder of its files
        # Every sandbox's runner folder (`RUNNER_DIR_ENV`), for a leak check: each is
        # removed with its sandbox.
        self.runner_dirs: list[str] = []
        self._knobs = faults.FaultPlan(FAULT_POINTS)
        self._log_streams: dict[asyncio.Task[Any], asyncio.Future[str]] = {}
        self._handles: list[FakeAsyncPtyHandle] = []
        self.AsyncDaytona: type[FakeAsyncDaytona] = type(
            "AsyncDaytona", (FakeAsyncDaytona,), {"_service": self}
        )

    def __repr__(self) -> str:
        return f"<FakeDaytona sandboxes={len(self.sandboxes)}>"

    async def __aenter__(self) -> FakeDaytona:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ---- fault knobs -------------------------------------------------------------------

    @property
    def faults(self) -> faults.FaultPlan:
        """The fault plan behind the knobs below (`sandbox.testing.faults`): arm gates
        and planned failures at any point directly, in the kit's own terms."""
        return self._knobs

    def fail(self, point: str, exc: BaseException, *, times: int = 1, after: bool = False) -> None:
        """Make the next `times` calls at `point` raise `exc` (before or after their work)."""
        self._knobs.fail(_canonical(point), exc, times=times, after=after)

    def block(self, point: str, *, after: bool = False) -> Gate:
        """Hold calls at `point` (before or after their work) until the gate is released."""
        point = _canonical(point)
        # A new block replaces the one armed at the same place (calls parked there stay).
        self._knobs.gates[:] = [
            g for g in self._knobs.gates if (g.point, g.after) != (point, after)
        ]
        return self._knobs.gate(point, after=after)

    def drop_streams(self, reason: str = "connection reset by peer") -> int:
        """Break every open PTY connection and log stream now; returns how many."""
        count = 0
        for handle in self._live_handles():
            handle._break(reason)
            count += 1
        for drop in self._log_streams.values():
            if not drop.done():
                drop.set_result(reason)
                count += 1
        return count

    @property
    def calls(self) -> list[str]:
        """Every SDK call made so far, by fault point name, in order."""
        return self._knobs.calls

    # ---- inspection ----------------------------------------------------------------------

    def _live_handles(self) -> list[FakeAsyncPtyHandle]:
        self._handles = [h for h in self._handles if not h._wait.done()]
        return self._handles

    def live_sandbox_ids(self) -> list[str]:
        """Ids of sandboxes that exist (were not deleted)."""
        return sorted(self.sandboxes)

    def leftover_pids(self) -> list[int]:
        """Live local processes started in any sandbox of this fake."""
        return _marked_pids(self.token + "/")

    def open_streams(self) -> list[str]:
        """PTY connections and log streams still running."""
        names = [f"pty:{h._pty.id}" for h in self._live_handles()]
        names += [f"logs:{t.get_name()}" for t in self._log_streams if not t.done()]
        return names

    def pty_ids(self, sandbox_id: str) -> list[str]:
        """Ids of the PTY sessions whose shell is still running in a sandbox."""
        return sorted(self.sandboxes[sandbox_id].ptys)

    def session_ids(self, sandbox_id: str) -> list[str]:
        """Ids of the sessions that exist in a sandbox."""
        return sorted(self.sandboxes[sandbox_id].sessions)

    def add_sandbox(self, name: str | None = None) -> str:
        """Create a sandbox directly (as if made elsewhere, to attach to); returns its id."""
        return self._new_sandbox(name or f"sandbox-{secrets.token_hex(4)}").id

    # ---- internals -----------------------------------------------------------------------

    def _new_sandbox(self, name: str) -> _SandboxState:
        state = _SandboxState(self, name)
        self.sandboxes[state.id] = state
        return state

    async def _delete(self, state: _SandboxState) -> None:
        self.sandboxes.pop(state.id, None)
        previews, state.previews = list(state.previews.values()), {}
        for proxy in previews:
            await proxy.close()
        await state.destroy()

    async def aclose(self) -> None:
        """Delete every sandbox, stop every stream, remove the fake's files."""
        for state in list(self.sandboxes.values()):
            await self._delete(state)
        tasks = [h._wait for h in self._live_handles()]
        tasks += [t for t in self._log_streams if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if self._own_root:
            await asyncio.to_thread(discard_tree, self.root)


__all__ = [
    "ALIASES",
    "DOWNLOAD_CHUNK",
    "EXIT_OUTPUT_GRACE_S",
    "FAULT_POINTS",
    "GO_SIGNAL_NAMES",
    "MARKER_ENV",
    "RUNNER_DIR_ENV",
    "SDK_NAMES",
    "FakeAsyncDaytona",
    "FakeAsyncFileSystem",
    "FakeAsyncProcess",
    "FakeAsyncPtyHandle",
    "FakeAsyncSandbox",
    "FakeAsyncSnapshotService",
    "FakeDaytona",
    "Gate",
]
