"""A fake of the part of the `e2b` SDK that the e2b backend uses, driven by real processes.

`FakeE2B` is a pretend E2B service. Its `AsyncSandbox` attribute stands in for
`e2b.AsyncSandbox`; hand it to the backend (or to your own code that uses the SDK):

```python
from sandbox.testing.e2b_fake import FakeE2B

async with FakeE2B(api_key="test-key") as fake:
    session = sandbox.open_session("e2b", api_key="test-key", sandbox_class=fake.AsyncSandbox)
    async with session:
        await session.exec("echo hi")
```

Only the SDK surface the backend uses is imitated (`AsyncSandbox.create/connect/kill/list`,
`create_snapshot/delete_snapshot`,
`.commands.run/connect/send_stdin/close_stdin/kill`,
`.pty.create/connect/send_stdin/resize/kill`, `.files.read/write/get_info`, the
command handle's `pid/exit_code/wait/kill/disconnect`), with the SDK's own names,
parameters and async-ness; `tests/backends/test_e2b.py` checks that against the installed
SDK with `sandbox.testing.drift`, so an SDK upgrade that changes it fails the tests. The
fake raises the SDK's own exception classes and returns its own data types.

Behind the surface every process is a real local process (`sandbox.local.process`), the
way envd runs them: `commands.run(cmd)` is `/bin/bash -l -c cmd` on pipes with stdin
closed; `pty.create()` is an interactive login `/bin/bash -i -l` on a real terminal (so
whatever is typed into it really goes through a shell). A process killed by a signal
ends with exit code -1, as envd reports it. `kill()` sends SIGKILL to the process
itself only, never to its children (as envd does). Killing a sandbox kills every process
started in it. A sandbox's home directory (the default cwd, and the base of relative
file paths) is a temporary directory; absolute paths are this machine's.

The runner (docs/runner.md) runs in a fake sandbox as in a real one: written by
`files.write`, started detached by a background `connect --text --start` command, reached
again by the next client's command. A real sandbox's /tmp is its own; here /tmp is this
machine's, shared by every fake sandbox, so each sandbox's processes see
`SANDBOX_RUNNER_DIR`, a short folder name of its own (made by whoever puts a runner
there, removed when the sandbox is killed) where the backend puts its runner. The runner
leaves the session of the command that started it (`setsid`), so killing a sandbox also
kills every local process whose environment names the sandbox (`E2B_SANDBOX_ID`, which
every process of the sandbox inherits), as the VM's end would.

Fault knobs, for tests of the code that uses the SDK (`point` names are in
`FAULT_POINTS`; thin wrappers over `fake.faults`, a `sandbox.testing.faults.FaultPlan`):

- `fail(point, exc, times=1, after=False, where=None)`: the next call(s) at `point`
  raise `exc` (an SDK exception), before doing anything or, with `after=True`, after
  doing their work (a sandbox created, a process started, but the answer lost).
- `block(point, after=False, where=None) -> Gate`: calls at `point` stop and set
  `gate.reached` (an `asyncio.Event` a test waits on to cancel deterministically) until
  `gate.release()`; a gate never released is a call that never returns.
- `fail("stream", exc)`: the event stream of the next process dies with `exc` right after
  it started (the "reader that dies"); `FakeProcess.break_stream(exc)` does it to a running
  process.

- `retry_creates(n)`: the next create is answered by a gateway error n times after the
  sandbox was made and retried by the SDK's transport: without an `idempotency_key`
  each retry makes another sandbox (what `e2b.retry.AsyncRetryableTransport` does to a
  502/503/504); with one, the same sandbox comes back.

Exceptions, as the SDK (2.63) raises them in each situation the fake models:

- no API key, or a wrong one: `AuthenticationException` (any call that reaches the API);
- `connect` to an unknown or killed sandbox: `SandboxNotFoundException`;
- a call on a killed sandbox (`commands.*`, `pty.*`, `files.*`):
  `SandboxNotRunningException` (envd's connection refused, the health probe says gone);
- `commands.run` in a missing `cwd`: `SandboxException` ("failed to start process");
  with `stdin=True` the command's stdin is a pipe that `commands.send_stdin` writes and
  `commands.close_stdin` ends (EOF), as envd's (0.5.2 and later) is; `send_stdin` /
  `close_stdin` of an ended or unknown pid: `NotFoundException`; of a command started
  without stdin, or after its close: the fake raises `InvalidArgumentException` (not
  modelled);
- `handle.wait()` on a non-zero exit: `CommandExitException` (its `stdout`/`stderr` are
  None with `retain_output=False`); a stream that outlived its `timeout`:
  `TimeoutException`; a stream cut by a dropped connection: whatever `fail("stream")`
  armed (the SDK passes on a `connectrpc` `ConnectError` for a transport failure, or
  `SandboxUnreachableException` when its health probe fails too);
- `pty.send_stdin`/`pty.resize` to an ended process: `NotFoundException`;
  `commands.kill`/`pty.kill` of an unknown pid: `False`, no exception;
- `files.read` of a missing path: `FileNotFoundException`, of a directory:
  `InvalidArgumentException`; `files.write` over a directory: `InvalidArgumentException`,
  under a file: `SandboxException`; `files.get_info` of a missing path:
  `FileNotFoundException`, under a file: `SandboxException`;
- an invalid `idempotency_key`: `InvalidArgumentException` (the SDK's own check);
- `create_snapshot` of an unknown or killed sandbox: `SandboxNotFoundException` (the
  API's 404), an unknown `mode`: `InvalidArgumentException` (the SDK's own check).

Snapshots (`create_snapshot`, e2b `sandbox_async/main.py`) copy the sandbox's home
folder (symlinks kept, FIFOs made anew, sockets and devices left out) under an id
`<name>:v<n>` (`SnapshotInfo.snapshot_id`); `create(template=<that id>)`, or the bare
name for its newest build, starts a sandbox with those files. The fake keeps no memory,
so a "full" snapshot (the API's default) restores no process. `snapshot_ids()` lists
the snapshots not deleted (they outlive their sandbox, as on E2B).

`where` is a predicate on the `FakeProcess` the call concerns (for process calls), so a
knob can target, say, only terminal processes. Leak checks: `leftover_pids()` lists
local processes still alive in any session the fake started, `open_streams()` the
handles whose event task still runs, `live_sandbox_ids()` the sandboxes not killed.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import getpass
import inspect
import io
import os
import secrets
import shutil
import signal
import stat as stat_module
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, overload

from e2b import (
    AuthenticationException,
    CommandExitException,
    CommandResult,
    FileNotFoundException,
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SnapshotInfo,
    TimeoutException,
)
from e2b.retry import resolve_idempotency_key
from e2b.sandbox.filesystem.filesystem import EntryInfo, FileType, WriteInfo
from e2b.sandbox.sandbox_api import resolve_snapshot_memory

from ..files.remove_tree import discard_tree
from ..local.process import LocalProcess
from . import faults, procfs
from .special_files import wait_forever_on_special_file

if TYPE_CHECKING:
    from e2b.sandbox.filesystem.filesystem import AsyncFileStreamReader

FAULT_POINTS = frozenset(
    {
        "create",
        "connect",
        "kill",
        "get_info",
        "list",
        "commands.run",
        "commands.kill",
        "commands.send_stdin",
        "commands.close_stdin",
        "pty.create",
        "pty.send_stdin",
        "pty.resize",
        "pty.kill",
        "wait",
        "disconnect",
        "files.read",
        "files.write",
        "files.get_info",
        "create_snapshot",
        "stream",
    }
)

# A streamed download's chunk size (httpx hands on what each socket read gave).
STREAM_CHUNK = 64 * 1024

# After a process died, how long its output may still take to arrive (a terminal flushes
# asynchronously) before the end event is sent anyway (children may hold the pipe open).
EXIT_OUTPUT_GRACE_S = 0.2

# Where the backend puts the runner (its `$SANDBOX_RUNNER_DIR`): each fake sandbox gets a
# folder of its own, since they all share this machine's /tmp (see the module docstring).
RUNNER_DIR_ENV = "SANDBOX_RUNNER_DIR"
# The variable every process of a fake sandbox carries (as envd sets it): how the
# sandbox's end finds the processes that left their session (the runner's).
SANDBOX_ID_ENV = "E2B_SANDBOX_ID"

# What the SDK's `Pty.create` adds to the environment (client side, before the request).
PTY_ENV_DEFAULTS = {"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

_Event = tuple[Any, ...]
# Picks the call a `Gate` or fault applies to (the process it is about, if any).
Predicate = Callable[["FakeProcess | None"], bool]


# ---- fault knobs ------------------------------------------------------------------------


# The gate every `block` returns (`sandbox.testing.faults.Gate`), under its old name here.
Gate = faults.Gate


# ---- processes ------------------------------------------------------------------------


class FakeProcess:
    """A process in a fake sandbox: a real local process, plus the event stream envd
    would send about it (output chunks, then an end event with the exit code)."""

    def __init__(
        self,
        knobs: faults.FaultPlan,
        sandbox: _SandboxState,
        argv: list[str],
        *,
        tty: bool,
        env: dict[str, str],
        cwd: str,
        rows: int,
        cols: int,
        lifetime: float | None,
        stdin: bool = False,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._knobs = knobs
        self.sandbox_id = sandbox.sandbox_id
        self.argv = list(argv)
        self.tty = tty
        self.lifetime = lifetime
        self.ended = False
        self.detached = False
        self.exit_code: int | None = None
        self.closed = False
        self._events: asyncio.Queue[_Event] = asyncio.Queue()
        self._finisher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.local = LocalProcess.spawn(
            argv,
            tty=tty,
            env=env,
            cwd=cwd,
            rows=rows,
            cols=cols,
            stdin=stdin and not tty,
            on_stdout=self._on_pty if tty else self._on_stdout,
            on_stderr=None if tty else self._on_stderr,
            on_exit=self._on_exit,
        )
        self.pid = self.local.pid
        if lifetime:
            # The SDK's `timeout`: the stream is cut when it elapses (the process stays).
            self._timer = self._loop.call_later(lifetime, self._lifetime_over)

    def __repr__(self) -> str:
        return f"<FakeProcess pid={self.pid} tty={self.tty} ended={self.ended}>"

    @property
    def running(self) -> bool:
        """True until the local process died."""
        return not self.local.exited

    def _emit(self, event: _Event) -> None:
        if not self.detached:
            self._events.put_nowait(event)

    def _on_pty(self, data: bytes) -> None:
        self._emit(("data", "pty", data))

    def _on_stdout(self, data: bytes) -> None:
        self._emit(("data", "stdout", data))

    def _on_stderr(self, data: bytes) -> None:
        self._emit(("data", "stderr", data))

    def _on_exit(self, code: int) -> None:
        self._finisher = self._loop.create_task(self._finish(code))

    def _lifetime_over(self) -> None:
        self.break_stream(
            TimeoutException(
                "deadline_exceeded: the process stream reached its 'timeout' (fake E2B)"
            )
        )

    async def _finish(self, local_code: int) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(EXIT_OUTPUT_GRACE_S):
                await self.local.wait_eof()
        self.local.drain_now()
        code = self._envd_exit_code(local_code)
        self.exit_code = code
        self.ended = True
        if self._timer is not None:
            self._timer.cancel()
        self._emit(("end", code))
        if not self._group_busy():
            self._close_local()

    def _envd_exit_code(self, local_code: int) -> int:
        """envd's exit code: the status of a normal exit, -1 for a death by signal."""
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return local_code
        if info is None:
            return local_code
        return info.si_status if info.si_code == os.CLD_EXITED else -1

    def _group_busy(self) -> bool:
        return bool(procfs.pids_where(lambda p: p.pgrp == self.pid))

    def _close_local(self) -> None:
        if not self.closed:
            self.closed = True
            self.local.close()

    async def next_event(self) -> _Event:
        """The next event of the stream (for the fake command handle)."""
        return await self._events.get()

    def subscribe(self, lifetime: float | None) -> None:
        """A new client connects (`commands.connect` / `pty.connect`): like envd's
        `Connect` (its request selects the process only, with no output offset), it gets
        the events from now on; what the process printed while nobody was connected was
        read and dropped. The new stream has its own `timeout`."""
        self._events = asyncio.Queue()
        self.detached = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if lifetime:
            self._timer = self._loop.call_later(lifetime, self._lifetime_over)

    def break_stream(self, exc: BaseException) -> None:
        """Make the event stream fail with `exc` now: the SDK's reader dies (the process
        itself keeps running, as when a connection drops)."""
        self._emit(("error", exc))
        self.detached = True

    def session_pids(self) -> list[int]:
        """Live local processes in this process's session (it and all it started)."""
        return procfs.pids_where(lambda p: p.session == self.pid)

    def kill_leader(self) -> bool:
        """SIGKILL the process itself (envd's kill); False if it is already gone."""
        if self.ended or self.local.exited or self.closed:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return True

    async def destroy(self) -> None:
        """Kill everything in the process's session and release its local resources."""
        if self._timer is not None:
            self._timer.cancel()
        for pid in self.session_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not self.closed:
            self.closed = True
            await self.local.terminate(0)
        if self._finisher is not None and not self._finisher.done():
            self._finisher.cancel()
            await asyncio.wait([self._finisher])
        self.detached = True


# ---- the SDK's data types and handles ----------------------------------------------------


class _InstanceOrClassMethod:
    """Like the SDK's `class_method_variant`: `instance.method(...)` calls the method,
    `Class.method(sandbox_id, ...)` calls the class-level implementation named
    `class_method_name`. Same shape (`method`, `class_method_name`), so the drift check
    compares both forms with the SDK's."""

    def __init__(self, class_method_name: str) -> None:
        self.class_method_name = class_method_name
        self.method: Any = None

    def __call__(self, method: Any) -> Any:
        self.method = method
        return self

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        @functools.wraps(self.method)
        def bound(*args: Any, **kwargs: Any) -> Any:
            """Dispatch to the instance method or the class-level implementation."""
            if obj is not None:
                return self.method(obj, *args, **kwargs)
            if args and objtype is not None and isinstance(args[0], objtype):
                return self.method(args[0], *args[1:], **kwargs)
            return getattr(objtype, self.class_method_name)(*args, **kwargs)

        return bound


class FakeCommandHandle:
    """Imitates `e2b.AsyncCommandHandle`: a task that reads the process's event stream and
    calls the output callbacks (stdout/stderr decoded to `str` with incremental UTF-8
    decoders, as the SDK does; terminal output as `bytes`)."""

    def __init__(
        self,
        service: FakeE2B,
        process: FakeProcess,
        kill: Callable[[], Awaitable[bool]],
        *,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        on_pty: Callable[[bytes], Any] | None = None,
        retain_output: bool = True,
    ) -> None:
        self._service = service
        self._process = process
        self._pid = process.pid
        self._handle_kill = kill
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._on_pty = on_pty
        # As the SDK: with `retain_output=False` nothing is accumulated (result: None).
        self._stdout: list[str] | None = [] if retain_output else None
        self._stderr: list[str] | None = [] if retain_output else None
        self._stdout_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stderr_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._result: CommandResult[str | None] | None = None
        self._iteration_exception: Exception | None = None
        self._wait = asyncio.ensure_future(self._handle_events())
        service._handles.add(self)

    @property
    def pid(self) -> int:
        """The process id (in the sandbox: here, on this machine)."""
        return self._pid

    @property
    def exit_code(self) -> int | None:
        """The exit code once the end event arrived, else None."""
        return None if self._result is None else self._result.exit_code

    async def _deliver(self, callback: Callable[[Any], Any] | None, chunk: Any) -> None:
        if callback is not None:
            result = callback(chunk)
            if inspect.isawaitable(result):
                await result

    @staticmethod
    def _keep(chunks: list[str] | None, text: str) -> None:
        if chunks is not None:
            chunks.append(text)

    @staticmethod
    def _joined(chunks: list[str] | None) -> str | None:
        return None if chunks is None else "".join(chunks)

    def _retained_chars(self) -> int:
        return sum(len(c) for chunks in (self._stdout, self._stderr) if chunks for c in chunks)

    async def _flush(self) -> None:
        out = self._stdout_decoder.decode(b"", final=True)
        if out:
            self._keep(self._stdout, out)
            await self._deliver(self._on_stdout, out)
        err = self._stderr_decoder.decode(b"", final=True)
        if err:
            self._keep(self._stderr, err)
            await self._deliver(self._on_stderr, err)

    async def _handle_events(self) -> None:
        try:
            while True:
                event = await self._process.next_event()
                if event[0] == "data":
                    _, stream, chunk = event
                    if stream == "pty":
                        await self._deliver(self._on_pty, chunk)
                    elif stream == "stdout":
                        text = self._stdout_decoder.decode(chunk)
                        if text:
                            self._keep(self._stdout, text)
                            await self._deliver(self._on_stdout, text)
                    else:
                        text = self._stderr_decoder.decode(chunk)
                        if text:
                            self._keep(self._stderr, text)
                            await self._deliver(self._on_stderr, text)
                elif event[0] == "end":
                    await self._flush()
                    self._result = CommandResult(
                        stdout=self._joined(self._stdout),
                        stderr=self._joined(self._stderr),
                        exit_code=event[1],
                        error=None,
                    )
                    return
                else:
                    await self._flush()
                    raise event[1]
        except Exception as exc:
            self._iteration_exception = exc

    async def wait(self) -> CommandResult[str | None]:
        """Wait for the end; `CommandExitException` on a non-zero exit code."""
        await self._service._knobs.checkpoint("wait", after=False, subject=self._process)
        await self._wait
        if self._iteration_exception is not None:
            raise self._iteration_exception
        if self._result is None:
            raise Exception("Command ended without an end event")
        if self._result.exit_code != 0:
            raise CommandExitException(
                stdout=self._joined(self._stdout),
                stderr=self._joined(self._stderr),
                exit_code=self._result.exit_code,
                error=self._result.error,
            )
        return self._result

    async def kill(self) -> bool:
        """SIGKILL the process (only the process, not its children)."""
        return await self._handle_kill()

    async def disconnect(self) -> None:
        """Stop receiving events; the process keeps running."""
        await self._service._knobs.checkpoint("disconnect", after=False, subject=self._process)
        self._stop_reading()
        await asyncio.wait([self._wait])

    def _stop_reading(self) -> None:
        self._wait.cancel()
        self._process.detached = True


class FakeCommands:
    """Imitates `e2b.sandbox_async.commands.command.Commands` (`sandbox.commands`)."""

    def __init__(self, service: FakeE2B, state: _SandboxState) -> None:
        self._service = service
        self._state = state

    @overload
    async def run(
        self,
        cmd: str,
        background: Literal[False] | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: Literal[False],
    ) -> CommandResult[None]: ...
    @overload
    async def run(
        self,
        cmd: str,
        background: Literal[False] | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: Literal[True] = True,
    ) -> CommandResult[str]: ...
    @overload
    async def run(
        self,
        cmd: str,
        background: Literal[False] | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: bool,
    ) -> CommandResult[str | None]: ...
    @overload
    async def run(
        self,
        cmd: str,
        background: Literal[True],
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: Literal[False],
    ) -> FakeCommandHandle: ...
    @overload
    async def run(
        self,
        cmd: str,
        background: Literal[True],
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: Literal[True] = True,
    ) -> FakeCommandHandle: ...
    @overload
    async def run(
        self,
        cmd: str,
        background: Literal[True],
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: bool,
    ) -> FakeCommandHandle: ...

    async def run(
        self,
        cmd: str,
        background: bool | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: bool = True,
    ) -> Any:
        """`/bin/bash -l -c cmd` on pipes, stdin closed unless `stdin`; a handle if
        `background`, else the result (`CommandExitException` on a non-zero exit)."""
        knobs = self._service._knobs
        await knobs.checkpoint("commands.run", after=False, subject=None)
        process = self._service._spawn(
            self._state,
            ["/bin/bash", "-l", "-c", cmd],
            tty=False,
            envs=envs,
            cwd=cwd,
            lifetime=timeout,
            stdin=bool(stdin),
        )
        handle = FakeCommandHandle(
            self._service,
            process,
            lambda: self.kill(process.pid),
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            retain_output=retain_output,
        )
        try:
            await knobs.checkpoint("commands.run", after=True, subject=process)
        except BaseException:
            handle._stop_reading()  # the answer was lost: nobody holds this handle
            raise
        if background:
            return handle
        return await handle.wait()

    @overload
    async def connect(
        self,
        pid: int,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        *,
        retain_output: Literal[False],
    ) -> FakeCommandHandle: ...
    @overload
    async def connect(
        self,
        pid: int,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        *,
        retain_output: Literal[True] = True,
    ) -> FakeCommandHandle: ...
    @overload
    async def connect(
        self,
        pid: int,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        *,
        retain_output: bool,
    ) -> FakeCommandHandle: ...

    async def connect(
        self,
        pid: int,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        *,
        retain_output: bool = True,
    ) -> FakeCommandHandle:
        """Connect to the running command `pid` (its output from now on); a process that
        ended (envd forgets it with its exit) or never was: `NotFoundException`."""
        process = self._state.processes.get(pid)
        knobs = self._service._knobs
        await knobs.checkpoint("commands.connect", after=False, subject=process)
        self._service._check_alive(self._state)
        if process is None or process.ended or process.tty:
            raise NotFoundException(f"process with pid {pid} not found")
        process.subscribe(timeout)
        handle = FakeCommandHandle(
            self._service,
            process,
            lambda: self.kill(process.pid),
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            retain_output=retain_output,
        )
        try:
            await knobs.checkpoint("commands.connect", after=True, subject=process)
        except BaseException:
            handle._stop_reading()
            raise
        return handle

    def _with_stdin(self, pid: int) -> FakeProcess:
        self._service._check_alive(self._state)
        process = self._state.processes.get(pid)
        if process is None or process.ended or process.tty:
            raise NotFoundException(f"process with pid {pid} not found")
        if process.local.stdin_fd is None:
            raise InvalidArgumentException(
                f"the fake E2B does not model input to process {pid}: it has no open stdin"
            )
        return process

    async def send_stdin(
        self, pid: int, data: str | bytes, request_timeout: float | None = None
    ) -> None:
        """Write `data` (a str as UTF-8) to the stdin of the command `pid`."""
        process = self._state.processes.get(pid)
        knobs = self._service._knobs
        await knobs.checkpoint("commands.send_stdin", after=False, subject=process)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await self._with_stdin(pid).local.write(payload)
        await knobs.checkpoint("commands.send_stdin", after=True, subject=process)

    async def close_stdin(self, pid: int, request_timeout: float | None = None) -> None:
        """Close the stdin of the command `pid`: it reads end-of-file."""
        process = self._state.processes.get(pid)
        knobs = self._service._knobs
        await knobs.checkpoint("commands.close_stdin", after=False, subject=process)
        self._with_stdin(pid).local.close_stdin()
        await knobs.checkpoint("commands.close_stdin", after=True, subject=process)

    async def kill(self, pid: int, request_timeout: float | None = None) -> bool:
        """SIGKILL the command `pid`; False if there is no such running command."""
        process = self._state.processes.get(pid)
        await self._service._knobs.checkpoint("commands.kill", after=False, subject=process)
        self._service._check_alive(self._state)
        killed = process.kill_leader() if process is not None else False
        await self._service._knobs.checkpoint("commands.kill", after=True, subject=process)
        return killed


class FakePty:
    """Imitates `e2b.sandbox_async.commands.pty.Pty` (`sandbox.pty`)."""

    def __init__(self, service: FakeE2B, state: _SandboxState) -> None:
        self._service = service
        self._state = state

    async def create(
        self,
        size: Any,
        on_data: Callable[[bytes], Any],
        user: str | None = None,
        cwd: str | None = None,
        envs: dict[str, str] | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
    ) -> FakeCommandHandle:
        """Start an interactive login bash (`/bin/bash -i -l`) on a terminal of `size`."""
        knobs = self._service._knobs
        await knobs.checkpoint("pty.create", after=False, subject=None)
        environment = dict(envs) if envs else {}
        for key, value in PTY_ENV_DEFAULTS.items():
            environment.setdefault(key, value)
        process = self._service._spawn(
            self._state,
            ["/bin/bash", "-i", "-l"],
            tty=True,
            envs=environment,
            cwd=cwd,
            rows=size.rows,
            cols=size.cols,
            lifetime=timeout,
        )
        handle = FakeCommandHandle(
            self._service, process, lambda: self.kill(process.pid), on_pty=on_data
        )
        try:
            await knobs.checkpoint("pty.create", after=True, subject=process)
        except BaseException:
            handle._stop_reading()
            raise
        return handle

    async def connect(
        self,
        pid: int,
        on_data: Callable[[bytes], Any],
        timeout: float | None = 60,
        request_timeout: float | None = None,
    ) -> FakeCommandHandle:
        """Connect to the running terminal `pid` (its output from now on, as envd's
        `Connect`); one that ended or never was: `NotFoundException`."""
        process = self._state.processes.get(pid)
        knobs = self._service._knobs
        await knobs.checkpoint("pty.connect", after=False, subject=process)
        self._terminal(pid)
        assert process is not None
        process.subscribe(timeout)
        handle = FakeCommandHandle(
            self._service, process, lambda: self.kill(process.pid), on_pty=on_data
        )
        try:
            await knobs.checkpoint("pty.connect", after=True, subject=process)
        except BaseException:
            handle._stop_reading()
            raise
        return handle

    def _terminal(self, pid: int) -> FakeProcess:
        self._service._check_alive(self._state)
        process = self._state.processes.get(pid)
        if process is None or process.ended or not process.tty:
            raise NotFoundException(f"process with pid {pid} not found")
        return process

    async def send_stdin(self, pid: int, data: bytes, request_timeout: float | None = None) -> None:
        """Write `data` to the terminal of `pid`."""
        process = self._state.processes.get(pid)
        knobs = self._service._knobs
        await knobs.checkpoint("pty.send_stdin", after=False, subject=process)
        await self._terminal(pid).local.write(bytes(data))
        await knobs.checkpoint("pty.send_stdin", after=True, subject=process)

    async def resize(self, pid: int, size: Any, request_timeout: float | None = None) -> None:
        """Resize the terminal of `pid`."""
        process = self._state.processes.get(pid)
        await self._service._knobs.checkpoint("pty.resize", after=False, subject=process)
        self._terminal(pid).local.resize(size.rows, size.cols)

    async def kill(self, pid: int, request_timeout: float | None = None) -> bool:
        """SIGKILL the terminal's process (not its children); False if it is gone."""
        process = self._state.processes.get(pid)
        await self._service._knobs.checkpoint("pty.kill", after=False, subject=process)
        self._service._check_alive(self._state)
        killed = process.kill_leader() if process is not None else False
        await self._service._knobs.checkpoint("pty.kill", after=True, subject=process)
        return killed


class FakeFilesystem:
    """Imitates `e2b.sandbox_async.filesystem.filesystem.Filesystem` (`sandbox.files`)."""

    def __init__(self, service: FakeE2B, state: _SandboxState) -> None:
        self._service = service
        self._state = state

    @overload
    async def read(
        self,
        path: str,
        format: Literal["text"] = "text",
        user: str | None = None,
        request_timeout: float | None = None,
        gzip: bool = False,
    ) -> str: ...

    @overload
    async def read(
        self,
        path: str,
        format: Literal["bytes"],
        user: str | None = None,
        request_timeout: float | None = None,
        gzip: bool = False,
    ) -> bytearray: ...

    @overload
    async def read(
        self,
        path: str,
        format: Literal["stream"],
        user: str | None = None,
        request_timeout: float | None = None,
        gzip: bool = False,
        stream_idle_timeout: float | None = None,
    ) -> AsyncFileStreamReader: ...

    async def read(
        self,
        path: str,
        format: str = "text",
        user: str | None = None,
        request_timeout: float | None = None,
        gzip: bool = False,
        stream_idle_timeout: float | None = None,
    ) -> Any:
        """The file's content as `str` (format="text"), `bytearray` (format="bytes") or a
        `FakeFileStreamReader` of its chunks (format="stream", read as they are sent)."""
        await self._service._knobs.checkpoint("files.read", after=False, subject=None)
        self._service._check_alive(self._state)
        if format not in ("text", "bytes", "stream"):
            raise InvalidArgumentException(f"the fake E2B does not support format={format!r}")
        real = self._state.resolve(path)
        await wait_forever_on_special_file(real)
        if format == "stream":

            def open_file() -> io.BufferedReader:
                """Open the file for the stream (in a thread); the reader closes it."""
                if os.path.isdir(real):
                    raise InvalidArgumentException(f"path '{path}' is a directory")
                try:
                    return open(real, "rb")
                except (FileNotFoundError, NotADirectoryError):
                    raise FileNotFoundException(f"path '{path}' does not exist") from None

            return FakeFileStreamReader(await asyncio.to_thread(open_file))

        def read() -> bytes:
            """Read the file (in a thread)."""
            if os.path.isdir(real):
                raise InvalidArgumentException(f"path '{path}' is a directory")
            try:
                with open(real, "rb") as handle:
                    return handle.read()
            except (FileNotFoundError, NotADirectoryError):
                raise FileNotFoundException(f"path '{path}' does not exist") from None

        data = await asyncio.to_thread(read)
        return data.decode("utf-8", "replace") if format == "text" else bytearray(data)

    async def write(
        self,
        path: str,
        data: Any,
        user: str | None = None,
        request_timeout: float | None = None,
        gzip: bool = False,
        use_octet_stream: bool | None = None,
        metadata: dict[str, str] | None = None,
    ) -> WriteInfo:
        """Write `data` (str, bytes or a file object), creating parent directories."""
        await self._service._knobs.checkpoint("files.write", after=False, subject=None)
        self._service._check_alive(self._state)
        if isinstance(data, str):
            payload = data.encode()
        elif isinstance(data, bytes | bytearray | memoryview):
            payload = bytes(data)
        elif isinstance(data, io.IOBase):
            raw = data.read()
            payload = raw.encode() if isinstance(raw, str) else bytes(raw)
        else:
            raise InvalidArgumentException("the fake E2B writes str, bytes or file objects")
        real = self._state.resolve(path)
        await wait_forever_on_special_file(real)

        def write() -> None:
            """Write the file (in a thread), answering as envd does: 400 over a
            directory, 500 when a parent cannot be made (a file is in the way)."""
            try:
                os.makedirs(os.path.dirname(real) or ".", exist_ok=True)
            except OSError as exc:
                raise SandboxException(f"error ensuring directories: {exc.strerror}") from None
            if os.path.isdir(real):
                raise InvalidArgumentException(f"path is a directory: {real}")
            with open(real, "wb") as handle:
                handle.write(payload)

        await asyncio.to_thread(write)
        return WriteInfo(name=os.path.basename(real), type=FileType.FILE, path=real)

    async def get_info(
        self, path: str, user: str | None = None, request_timeout: float | None = None
    ) -> EntryInfo:
        """envd's stat: the entry itself (a symlink is reported as one, with its target,
        and the permission bits of what it points at, 0 when dangling), `mode` the
        permission bits only and `permissions` Go's mode string of the entry
        (shared/pkg/filesystem/entry.go); a FIFO, socket or device has no type.
        Missing: `FileNotFoundException`; under a file: a plain `SandboxException`
        (envd answers 500 for ENOTDIR)."""
        await self._service._knobs.checkpoint("files.get_info", after=False, subject=None)
        self._service._check_alive(self._state)
        real = self._state.resolve(path)

        def stat() -> EntryInfo:
            try:
                info = os.lstat(real)
            except FileNotFoundError:
                raise FileNotFoundException(f"path '{path}' does not exist") from None
            except OSError as exc:
                raise SandboxException(f"error getting file info: {exc.strerror}") from None
            kind: FileType | None = None
            target = None
            perm = info.st_mode & 0o777  # Go's FileMode.Perm()
            if stat_module.S_ISREG(info.st_mode):
                kind = FileType.FILE
            elif stat_module.S_ISDIR(info.st_mode):
                kind = FileType.DIR
            elif stat_module.S_ISLNK(info.st_mode):
                kind, target = FileType.SYMLINK, os.readlink(real)
                try:  # envd gives a symlink the permission bits of its target
                    perm = os.stat(real).st_mode & 0o777
                except OSError:
                    perm = 0
            return EntryInfo(
                name=os.path.basename(real),
                type=kind,
                path=real,
                size=info.st_size,
                mode=perm,
                permissions=_go_file_mode(info.st_mode),
                owner=str(info.st_uid),
                group=str(info.st_gid),
                modified_time=datetime.fromtimestamp(info.st_mtime, tz=UTC),
                symlink_target=target,
            )

        return await asyncio.to_thread(stat)


@dataclass
class FakeSandboxInfo:
    """Imitates `e2b.SandboxInfo` (the fields a listing consumer reads)."""

    sandbox_id: str = ""
    template_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


class FakeSandboxPaginator:
    """Imitates `e2b.AsyncSandboxPaginator`: one page with every matching sandbox."""

    def __init__(self, service: FakeE2B, query: Any, opts: dict[str, Any]) -> None:
        self._service = service
        self._query = query
        self._opts = opts
        self._has_next = True

    @property
    def has_next(self) -> bool:
        """True until the (single) page was fetched."""
        return self._has_next

    async def next_items(self, **opts: Any) -> list[FakeSandboxInfo]:
        """The sandboxes (running, not killed) whose metadata matches the query."""
        service = self._service
        service._authorize({**self._opts, **opts})
        await service._knobs.checkpoint("list", after=False, subject=None)
        if not self._has_next:
            raise Exception("No more items to fetch")
        self._has_next = False
        wanted = dict(getattr(self._query, "metadata", None) or {})
        return [
            FakeSandboxInfo(state.sandbox_id, state.template, dict(state.metadata))
            for state in service._sandboxes.values()
            if not state.killed and wanted.items() <= state.metadata.items()
        ]


# ---- the sandbox class and the service -----------------------------------------------------


@dataclass(eq=False)
class _SandboxState:
    sandbox_id: str
    home: str
    template: str
    metadata: dict[str, str]
    envs: dict[str, str]
    processes: dict[int, FakeProcess] = field(default_factory=dict)
    killed: bool = False
    # The sandbox's own runner folder (`RUNNER_DIR_ENV`): short, since a unix socket's
    # path is at most 107 bytes; named here, made by whoever puts a runner there.
    runner_dir: str = field(default_factory=lambda: f"/tmp/erun-{secrets.token_hex(6)}")

    def resolve(self, path: str) -> str:
        """A sandbox path on this machine: relative paths are in the home directory."""
        return os.path.normpath(os.path.join(self.home, os.path.expanduser(path)))


class FakeAsyncSandbox:
    """Imitates `e2b.AsyncSandbox`. Use a `FakeE2B`'s `AsyncSandbox` attribute: a subclass
    bound to that fake service."""

    _service: ClassVar[FakeE2B | None] = None

    def __init__(self, state: _SandboxState) -> None:
        service = type(self)._bound()
        self._state = state
        self._commands = FakeCommands(service, state)
        self._pty = FakePty(service, state)
        self._filesystem = FakeFilesystem(service, state)

    def __repr__(self) -> str:
        return f"<fake AsyncSandbox {self._state.sandbox_id}>"

    @classmethod
    def _bound(cls) -> FakeE2B:
        if cls._service is None:
            raise TypeError("use FakeE2B().AsyncSandbox, not FakeAsyncSandbox itself")
        return cls._service

    @property
    def sandbox_id(self) -> str:
        """Unique identifier of the sandbox."""
        return self._state.sandbox_id

    @property
    def commands(self) -> FakeCommands:
        """Running commands."""
        return self._commands

    @property
    def pty(self) -> FakePty:
        """Terminals."""
        return self._pty

    @property
    def files(self) -> FakeFilesystem:
        """Files."""
        return self._filesystem

    def get_host(self, port: int) -> str:
        """The SDK's answer in debug mode (`ConnectionConfig.debug`: `localhost:<port>`,
        plain HTTP): this fake's processes listen on this host."""
        return f"localhost:{port}"

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        timeout: int | None = None,
        metadata: dict[str, str] | None = None,
        envs: dict[str, str] | None = None,
        secure: bool | None = None,
        allow_internet_access: bool | None = None,
        mcp: Any = None,
        network: Any = None,
        iam: Any = None,
        lifecycle: Any = None,
        volume_mounts: Any = None,
        logger: Any = None,
        idempotency_key: str | None = None,
        **opts: Any,
    ) -> FakeAsyncSandbox:
        """Create a sandbox (a fresh home directory; a `template` naming a snapshot of
        `create_snapshot`: a copy of the snapshot's files). With `idempotency_key`, a
        key seen before returns that sandbox (as the API does for the SDK's retries);
        see `FakeE2B.retry_creates` for the retries that make a second sandbox without
        one."""
        service = cls._bound()
        key = resolve_idempotency_key(idempotency_key)  # the SDK's own validation
        service._authorize(opts)
        await service._knobs.checkpoint("create", after=False, subject=None)
        template = template or "base"
        snapshot = service._snapshot_of(template)
        state = await service._create(template, metadata or {}, envs or {}, key, snapshot)
        for _ in range(service._take_create_retries()):
            # The answer was a gateway error: the SDK's transport sends the same request
            # again (same Idempotency-Key header, if any).
            state = await service._create(template, metadata or {}, envs or {}, key, snapshot)
        await service._knobs.checkpoint("create", after=True, subject=None)
        return cls(state)

    @overload  # type: ignore[misc]  # the SDK mixes an instance and a static form
    async def connect(
        self, timeout: int | None = None, *, on_resume: str = "restore", **opts: Any
    ) -> FakeAsyncSandbox: ...

    @overload
    @staticmethod
    async def connect(
        sandbox_id: str,
        timeout: int | None = None,
        logger: Any = None,
        *,
        on_resume: str = "restore",
        **opts: Any,
    ) -> FakeAsyncSandbox: ...

    @_InstanceOrClassMethod("_cls_connect_sandbox")
    async def connect(
        self, timeout: int | None = None, *, on_resume: str = "restore", **opts: Any
    ) -> FakeAsyncSandbox:
        """Connect again to this sandbox."""
        return await type(self)._cls_connect_sandbox(self.sandbox_id, timeout, **opts)

    @classmethod
    async def _cls_connect_sandbox(
        cls,
        sandbox_id: str,
        timeout: int | None = None,
        logger: Any = None,
        *,
        on_resume: str = "restore",
        **opts: Any,
    ) -> FakeAsyncSandbox:
        service = cls._bound()
        service._authorize(opts)
        await service._knobs.checkpoint("connect", after=False, subject=None)
        state = service._sandboxes.get(sandbox_id)
        if state is None or state.killed:
            raise SandboxNotFoundException(f"Paused sandbox {sandbox_id} not found")
        await service._knobs.checkpoint("connect", after=True, subject=None)
        return cls(state)

    @overload  # type: ignore[misc]  # the SDK mixes an instance and a static form
    async def kill(self, **opts: Any) -> bool: ...

    @overload
    @staticmethod
    async def kill(sandbox_id: str, **opts: Any) -> bool: ...

    @_InstanceOrClassMethod("_cls_kill")
    async def kill(self, **opts: Any) -> bool:
        """Kill this sandbox and everything running in it."""
        return bool(await type(self)._cls_kill(self.sandbox_id, **opts))

    @classmethod
    async def _cls_kill(cls, sandbox_id: str, **opts: Any) -> bool:
        service = cls._bound()
        service._authorize(opts)
        await service._knobs.checkpoint("kill", after=False, subject=None)
        found = await service._kill_sandbox(sandbox_id)
        await service._knobs.checkpoint("kill", after=True, subject=None)
        return found

    @overload  # type: ignore[misc]  # the SDK mixes an instance and a static form
    async def get_info(self, **opts: Any) -> FakeSandboxInfo: ...

    @overload
    @staticmethod
    async def get_info(sandbox_id: str, **opts: Any) -> FakeSandboxInfo: ...

    @_InstanceOrClassMethod("_cls_get_info")
    async def get_info(self, **opts: Any) -> FakeSandboxInfo:
        """This sandbox's id, template and metadata (`GET /sandboxes/{id}`)."""
        return await type(self)._cls_get_info(self.sandbox_id, **opts)

    @classmethod
    async def _cls_get_info(cls, sandbox_id: str, **opts: Any) -> FakeSandboxInfo:
        # e2b==2.63.0 `SandboxApi._cls_get_info`: 404 is `SandboxNotFoundException`;
        # the answer carries the metadata the create was given, as stored.
        service = cls._bound()
        service._authorize(opts)
        await service._knobs.checkpoint("get_info", after=False, subject=None)
        state = service._sandboxes.get(sandbox_id)
        if state is None or state.killed:
            raise SandboxNotFoundException(f"Sandbox {sandbox_id} not found")
        await service._knobs.checkpoint("get_info", after=True, subject=None)
        return FakeSandboxInfo(state.sandbox_id, state.template, dict(state.metadata))

    @overload  # type: ignore[misc]  # the SDK mixes an instance and a static form
    async def create_snapshot(
        self, name: str | None = None, *, mode: str | None = None, **opts: Any
    ) -> SnapshotInfo: ...

    @overload
    @staticmethod
    async def create_snapshot(
        sandbox_id: str, name: str | None = None, *, mode: str | None = None, **opts: Any
    ) -> SnapshotInfo: ...

    @_InstanceOrClassMethod("_cls_create_snapshot")
    async def create_snapshot(
        self, name: str | None = None, *, mode: str | None = None, **opts: Any
    ) -> SnapshotInfo:
        """Snapshot this sandbox (`POST /sandboxes/{id}/snapshots`): a template new
        sandboxes are created from; it outlives the sandbox."""
        return await type(self)._cls_create_snapshot(self.sandbox_id, name, mode=mode, **opts)

    @classmethod
    async def _cls_create_snapshot(
        cls, sandbox_id: str, name: str | None = None, *, mode: str | None = None, **opts: Any
    ) -> SnapshotInfo:
        service = cls._bound()
        resolve_snapshot_memory("mode", mode)  # type: ignore[arg-type]  # the SDK checks it
        service._authorize(opts)
        await service._knobs.checkpoint("create_snapshot", after=False, subject=None)
        info = await service._take_snapshot(sandbox_id, name, mode or "full")
        await service._knobs.checkpoint("create_snapshot", after=True, subject=None)
        return info

    @classmethod
    async def delete_snapshot(cls, snapshot_id: str, **opts: Any) -> bool:
        """Delete a snapshot (`DELETE /templates/{id}`): False when there is none."""
        service = cls._bound()
        service._authorize(opts)
        return await service._delete_snapshot(snapshot_id)

    @classmethod
    def list(
        cls,
        query: Any = None,
        limit: int | None = None,
        next_token: str | None = None,
        order: str | None = None,
        **opts: Any,
    ) -> FakeSandboxPaginator:
        """List sandboxes (filtered by `query.metadata`)."""
        return FakeSandboxPaginator(cls._bound(), query, opts)


class FakeE2B:
    """A fake E2B service: sandboxes, the processes in them, and fault knobs.

    `api_key`: the key every call must carry (`api_key=` or `E2B_API_KEY`), else
    `AuthenticationException`; None accepts any non-empty key. `root`: where sandbox home
    directories go (default: a temporary directory removed by `aclose()`).
    """

    def __init__(
        self, *, api_key: str | None = None, root: str | os.PathLike[str] | None = None
    ) -> None:
        self.api_key = api_key
        self._own_root = root is None
        self.root = os.fspath(root) if root is not None else tempfile.mkdtemp(prefix="fake-e2b-")
        self._knobs = faults.FaultPlan(FAULT_POINTS)
        self._sandboxes: dict[str, _SandboxState] = {}
        self._handles: set[FakeCommandHandle] = set()
        self._idempotent: dict[str, _SandboxState] = {}
        self._create_retries = 0
        self._snapshots: dict[str, str] = {}  # snapshot id -> the folder of its files
        self.snapshot_modes: dict[str, str] = {}  # snapshot id -> "full" / "filesystem"
        self.created: list[str] = []
        self.processes: list[FakeProcess] = []
        self.AsyncSandbox: type[FakeAsyncSandbox] = type(
            "AsyncSandbox",
            (FakeAsyncSandbox,),
            {"_service": self, "__module__": __name__, "__doc__": FakeAsyncSandbox.__doc__},
        )

    def __repr__(self) -> str:
        return f"<FakeE2B sandboxes={len(self.live_sandbox_ids())}>"

    async def __aenter__(self) -> FakeE2B:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ---- knobs ----------------------------------------------------------------------

    @property
    def faults(self) -> faults.FaultPlan:
        """The fault plan behind the knobs below (`sandbox.testing.faults`): arm gates
        and planned failures at any point directly, in the kit's own terms."""
        return self._knobs

    @staticmethod
    def _check_point(point: str) -> None:
        if point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {point!r}; known: {sorted(FAULT_POINTS)}")

    def fail(
        self,
        point: str,
        exc: BaseException,
        *,
        times: int = 1,
        after: bool = False,
        where: Predicate | None = None,
    ) -> None:
        """Make the next `times` calls at `point` raise `exc` (after doing their work if
        `after`). For "stream": the next process's event stream dies with `exc`."""
        self._check_point(point)
        self._knobs.fail(point, exc, times=times, after=after, where=where)

    def block(self, point: str, *, after: bool = False, where: Predicate | None = None) -> Gate:
        """Stop calls at `point` (before, or with `after` after, their work) until the
        returned gate is released; `gate.reached` is set when one arrives."""
        self._check_point(point)
        return self._knobs.gate(point, after=after, where=where)

    def retry_creates(self, retries: int = 1) -> None:
        """The next create is answered with a gateway error (502) `retries` times after
        the sandbox was made, and the SDK's transport (`e2b.retry`) sends it again each
        time: without an `idempotency_key` every retry makes one more sandbox (with the
        same metadata) and only the last one is returned."""
        self._create_retries = retries

    def _take_create_retries(self) -> int:
        retries, self._create_retries = self._create_retries, 0
        return retries

    def release_all(self) -> None:
        """Release every gate (e.g. at the end of a test)."""
        self._knobs.release_all()

    @property
    def calls(self) -> list[str]:
        """Every call point reached so far, in order."""
        return self._knobs.calls

    # ---- inspection -----------------------------------------------------------------

    def live_sandbox_ids(self) -> list[str]:
        """Sandboxes created (or attached) and not killed."""
        return [s.sandbox_id for s in self._sandboxes.values() if not s.killed]

    def snapshot_ids(self) -> list[str]:
        """Snapshots made by `create_snapshot` and not deleted."""
        return list(self._snapshots)

    def sandbox_home(self, sandbox_id: str) -> str:
        """The home directory of a fake sandbox on this machine."""
        return self._sandboxes[sandbox_id].home

    def process(self, pid: int) -> FakeProcess:
        """The fake process with this pid."""
        for process in self.processes:
            if process.pid == pid:
                return process
        raise KeyError(pid)

    def leftover_pids(self) -> list[int]:
        """Live local processes in any session the fake started (leaks, unless their
        sandbox is still meant to run them)."""
        sids = {p.pid for p in self.processes}
        found = set(procfs.pids_where(lambda p: p.session in sids))
        for sandbox_id in self._sandboxes:  # the runner and its processes left their session
            found.update(procfs.pids_with_env(SANDBOX_ID_ENV, sandbox_id))
        return sorted(found)

    def retained_output_chars(self) -> int:
        """Characters of command output the SDK handles still hold (the SDK keeps all of
        a command's output unless it was started with `retain_output=False`)."""
        return sum(h._retained_chars() for h in self._handles)

    def open_streams(self) -> list[FakeCommandHandle]:
        """Handles whose event-reading task is still running."""
        return [h for h in self._handles if not h._wait.done()]

    # ---- the service's internals ----------------------------------------------------------

    def _authorize(self, opts: dict[str, Any]) -> None:
        key = opts.get("api_key") or os.environ.get("E2B_API_KEY")
        if not key:
            raise AuthenticationException(
                "API key is required, please visit the Team tab at https://e2b.dev/dashboard "
                "to get your API key. You can either set the environment variable "
                "`E2B_API_KEY` or you can pass it directly to the method like api_key=..."
            )
        if self.api_key is not None and key != self.api_key:
            raise AuthenticationException("Unauthorized, please check your credentials.")

    async def _create(
        self,
        template: str,
        metadata: dict[str, str],
        envs: dict[str, str],
        key: str | None,
        snapshot: str | None = None,
    ) -> _SandboxState:
        if key is not None and key in self._idempotent:
            return self._idempotent[key]
        state = self._new_sandbox(template, metadata, envs)
        if snapshot is not None:
            # A sandbox created from a snapshot starts with its files (the fake keeps
            # no memory: a "full" snapshot's processes are not restored).
            await asyncio.to_thread(_copy_tree, snapshot, state.home)
        if key is not None:
            self._idempotent[key] = state
        return state

    def _new_sandbox(
        self, template: str, metadata: dict[str, str], envs: dict[str, str]
    ) -> _SandboxState:
        sandbox_id = "i" + secrets.token_hex(10)
        home = os.path.join(self.root, sandbox_id, "home")
        os.makedirs(home)
        state = _SandboxState(sandbox_id, home, template, dict(metadata), dict(envs))
        self._sandboxes[sandbox_id] = state
        self.created.append(sandbox_id)
        return state

    def _snapshot_of(self, template: str) -> str | None:
        """The folder of the snapshot `template` names (its id, or its name for the
        newest build), or None for a plain template."""
        if template in self._snapshots:
            return self._snapshots[template]
        builds = [sid for sid in self._snapshots if sid.rpartition(":")[0] == template]
        return self._snapshots[builds[-1]] if builds else None

    async def _take_snapshot(self, sandbox_id: str, name: str | None, mode: str) -> SnapshotInfo:
        state = self._sandboxes.get(sandbox_id)
        if state is None or state.killed:
            raise SandboxNotFoundException(f"Sandbox {sandbox_id} not found")
        base = name or "snapshot-" + secrets.token_hex(6)
        builds = sum(1 for sid in self._snapshots if sid.rpartition(":")[0] == base)
        snapshot_id = f"{base}:v{builds + 1}"
        folder = os.path.join(self.root, "snapshots", secrets.token_hex(8))
        await asyncio.to_thread(_copy_tree, state.home, folder)
        self._snapshots[snapshot_id] = folder
        self.snapshot_modes[snapshot_id] = mode
        return SnapshotInfo(snapshot_id=snapshot_id, names=[f"fake-team/{snapshot_id}"])

    async def _delete_snapshot(self, snapshot_id: str) -> bool:
        folder = self._snapshots.pop(snapshot_id, None)
        if folder is None:
            return False
        self.snapshot_modes.pop(snapshot_id, None)
        await asyncio.to_thread(discard_tree, folder)
        return True

    def _check_alive(self, state: _SandboxState) -> None:
        if state.killed:
            raise SandboxNotRunningException(
                f"The sandbox {state.sandbox_id} was not found: The sandbox was killed or "
                "reached its timeout."
            )

    def _spawn(
        self,
        state: _SandboxState,
        argv: list[str],
        *,
        tty: bool,
        envs: dict[str, str] | None,
        cwd: str | None,
        lifetime: float | None,
        rows: int = 24,
        cols: int = 80,
        stdin: bool = False,
    ) -> FakeProcess:
        self._check_alive(state)
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": state.home,
            "USER": getpass.getuser(),
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "E2B_SANDBOX": "true",
            SANDBOX_ID_ENV: state.sandbox_id,
            RUNNER_DIR_ENV: state.runner_dir,
        }
        env.update(state.envs)
        env.update(envs or {})
        workdir = state.resolve(cwd) if cwd else state.home
        if not os.path.isdir(workdir):
            raise SandboxException(
                f"unknown: failed to start process: chdir {cwd}: no such file or directory"
            )
        process = FakeProcess(
            self._knobs,
            state,
            argv,
            tty=tty,
            env=env,
            cwd=workdir,
            rows=rows,
            cols=cols,
            lifetime=lifetime,
            stdin=stdin,
        )
        self.processes.append(process)
        state.processes[process.pid] = process
        failure = self._knobs.take("stream", after=False, subject=process)
        if isinstance(failure, BaseException):
            process.break_stream(failure)
        return process

    async def _kill_sandbox(self, sandbox_id: str) -> bool:
        state = self._sandboxes.get(sandbox_id)
        if state is None or state.killed:
            return False
        state.killed = True
        for process in state.processes.values():
            process.break_stream(
                SandboxNotRunningException(
                    f"The sandbox {sandbox_id} was not found: The sandbox was killed or "
                    "reached its timeout."
                )
            )
        # Every process is destroyed whatever another's destroy does (as the VM's end
        # takes them all); the first failure is raised once all are done.
        results = await asyncio.gather(
            *(p.destroy() for p in state.processes.values()), return_exceptions=True
        )
        # What left its session (the runner, and the processes it keeps) ends too.
        for pid in procfs.pids_with_env(SANDBOX_ID_ENV, sandbox_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(shutil.rmtree, state.runner_dir, True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        await asyncio.to_thread(discard_tree, os.path.dirname(state.home))
        return True

    async def aclose(self) -> None:
        """Kill every sandbox (kept ones too), stop every stream task, release gates and
        remove the temporary root."""
        self.release_all()
        for sandbox_id in list(self._sandboxes):
            await self._kill_sandbox(sandbox_id)
        handles = list(self._handles)
        for handle in handles:
            handle._stop_reading()
        if handles:
            await asyncio.wait([h._wait for h in handles])
        self._handles.clear()
        if self._own_root:
            await asyncio.to_thread(discard_tree, self.root)


def _go_file_mode(mode: int) -> str:
    """Go's `os.FileMode.String()` of an lstat mode, as envd sends it in `permissions`
    (type letters in Go's order, then rwx: "drwxr-xr-x", "Lrwxrwxrwx", "urwxr-xr-x")."""
    letters = ""
    if stat_module.S_ISDIR(mode):
        letters += "d"
    if stat_module.S_ISLNK(mode):
        letters += "L"
    if stat_module.S_ISBLK(mode) or stat_module.S_ISCHR(mode):
        letters += "D"
    if stat_module.S_ISFIFO(mode):
        letters += "p"
    if stat_module.S_ISSOCK(mode):
        letters += "S"
    if mode & stat_module.S_ISUID:
        letters += "u"
    if mode & stat_module.S_ISGID:
        letters += "g"
    if stat_module.S_ISCHR(mode):
        letters += "c"
    if mode & stat_module.S_ISVTX:
        letters += "t"
    rwx = "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return (letters or "-") + rwx


def _copy_tree(source: str, target: str) -> None:
    """Copy a sandbox's files as a filesystem snapshot keeps them: symlinks as links,
    FIFOs made anew (never opened), sockets and devices left out."""

    def copy(src: str, dst: str) -> None:
        info = os.lstat(src)
        if stat_module.S_ISFIFO(info.st_mode):
            os.mkfifo(dst, stat_module.S_IMODE(info.st_mode))
        elif stat_module.S_ISREG(info.st_mode):
            shutil.copy2(src, dst)

    shutil.copytree(source, target, symlinks=True, copy_function=copy, dirs_exist_ok=True)


class FakeFileStreamReader:
    """Imitates `e2b.sandbox.filesystem.filesystem.AsyncFileStreamReader`: the chunks of
    a download as the server sends them (here: read from the file as it is now, so a
    file that grows after its stat streams on), released by `aclose()` or at the end."""

    def __init__(self, handle: io.BufferedReader) -> None:
        self._handle = handle
        self._closed = False
        self.chunks_sent = 0

    def __aiter__(self) -> FakeFileStreamReader:
        return self

    async def __anext__(self) -> bytes:
        if self._closed:
            raise StopAsyncIteration
        chunk = await asyncio.to_thread(self._handle.read, STREAM_CHUNK)
        if not chunk:
            await self.aclose()
            raise StopAsyncIteration
        self.chunks_sent += 1
        return chunk

    async def aclose(self) -> None:
        """Release the download (safe to call more than once)."""
        if not self._closed:
            self._closed = True
            self._handle.close()

    async def __aenter__(self) -> FakeFileStreamReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


# Each fake class -> the SDK class it stands in for (checked by `sandbox.testing.drift`).
SDK_NAMES = {
    "FakeFileStreamReader": "AsyncFileStreamReader",
    "FakeCommandHandle": "AsyncCommandHandle",
    "FakeCommands": "Commands",
    "FakePty": "Pty",
    "FakeFilesystem": "Filesystem",
    "FakeSandboxPaginator": "AsyncSandboxPaginator",
    "FakeSandboxInfo": "SandboxInfo",
    "FakeAsyncSandbox": "AsyncSandbox",
}


def fake_classes() -> Iterable[tuple[type, str]]:
    """Each fake class with the dotted path of the SDK class it imitates (for the drift
    check)."""
    return (
        (FakeAsyncSandbox, "e2b.AsyncSandbox"),
        (FakeCommands, "e2b.sandbox_async.commands.command.Commands"),
        (FakePty, "e2b.sandbox_async.commands.pty.Pty"),
        (FakeFilesystem, "e2b.sandbox_async.filesystem.filesystem.Filesystem"),
        (FakeCommandHandle, "e2b.AsyncCommandHandle"),
        (FakeSandboxPaginator, "e2b.AsyncSandboxPaginator"),
        (FakeSandboxInfo, "e2b.SandboxInfo"),
        (FakeFileStreamReader, "e2b.sandbox.filesystem.filesystem.AsyncFileStreamReader"),
    )


__all__ = [
    "EXIT_OUTPUT_GRACE_S",
    "FAULT_POINTS",
    "PTY_ENV_DEFAULTS",
    "RUNNER_DIR_ENV",
    "SANDBOX_ID_ENV",
    "SDK_NAMES",
    "STREAM_CHUNK",
    "FakeAsyncSandbox",
    "FakeCommandHandle",
    "FakeCommands",
    "FakeE2B",
    "FakeFileStreamReader",
    "FakeFilesystem",
    "FakeProcess",
    "FakePty",
    "FakeSandboxInfo",
    "FakeSandboxPaginator",
    "Gate",
    "Predicate",
    "fake_classes",
]
