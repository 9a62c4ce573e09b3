"""The `e2b` backend: E2B cloud sandboxes through the `e2b` SDK's async surface.

How the contract maps onto E2B:

- The session creates a sandbox (`AsyncSandbox.create`) or attaches to one by id
  (`AsyncSandbox.connect`), and kills it on close unless `keep=True`.
- `tty=True` processes use `sandbox.pty.create()`, which starts an interactive login
  bash, not our command. A `ShellTrap` line is typed into it in exec mode: the shell is
  replaced by a small `sh` wrapper that runs the command and exits with its status, so
  the PTY's own end reports the command's exit code. E2B reports a death by signal as -1
  without the signal number, so the wrapper catches the terminal's signals for itself
  (its child, the command, keeps the default dispositions) and exits with 128+N when the
  command died of signal N. The wrapper's own stderr goes to /dev/null, so a shell that
  reports "Killed" never shows that; the command's stderr is the terminal.
- `tty=False` processes (and one-shot `exec`) use `commands.run(background=True,
  stdin=False)`. E2B's `kill` only SIGKILLs the process it started, so the command runs
  as a job in its own process group (`set -m` in the wrapper bash), whose id the wrapper
  writes to a file in /tmp; interrupt and terminate signal that group with a second
  command. When the command ends, the wrapper kills what is left of its group (as the
  local backend does when it collects an exited process) and removes the file.
- Output: terminal output arrives as bytes. Pipe output arrives as `str`: the SDK
  decodes each stream with an incremental UTF-8 decoder (so characters split across
  chunks are kept whole) and we encode it back. What cannot be recovered: bytes that are
  not valid UTF-8 reach us as U+FFFD, so binary output on pipes is not byte-exact (use a
  terminal or `read_file` for that).
- Every SDK call that creates something remote (a sandbox, a process) runs as a task the
  session owns; if the caller is cancelled meanwhile, the teardown waits for that task and
  deletes what it made. A create that failed in a way that leaves its outcome unknown (a
  timeout, a dropped connection) is followed by a search for the sandbox by a metadata
  tag, and what is found is killed. Every create carries an idempotency key (the SDK's
  `idempotency_key`, sent as the `Idempotency-Key` header): the SDK's transport retries
  a create answered by a gateway error (502/503/504, `e2b.retry`), and without the key
  such a retry makes a second sandbox that nobody holds.
- Background commands run with `retain_output=False`: the SDK would otherwise keep every
  character a command printed in its handle for as long as the handle lives (we get the
  output through the callbacks and never read the handle's copy).
- Failures of envd's transport (a `connectrpc` `ConnectError` whose cause is a
  connection error, or an `UNAVAILABLE` answer; httpx transport errors on the file API)
  are `ConnectionLostError` with `retryable=True`; deadline and resource errors are
  retryable `ProviderError`s.

Options: `api_key` (else `E2B_API_KEY`), `sandbox_id` (attach), `template`, `keep`,
`sandbox_timeout_s` (the sandbox's lifetime on E2B), `request_timeout_s` (each API
request), `start_timeout_s` (bound on creating/attaching and on starting a process),
`kill_timeout_s` (bound on each teardown call), `process_timeout_s` (the lifetime E2B
gives each process stream; 0 means unlimited), `metadata` and `envs` (for a new
sandbox), and `sandbox_class` (default `e2b.AsyncSandbox`; pass
`sandbox.testing.e2b_fake.FakeE2B().AsyncSandbox` to run against the fake).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import shlex
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import httpx
from connectrpc.code import Code as RpcCode
from connectrpc.errors import ConnectError
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    NotEnoughSpaceException,
    NotFoundException,
    PtySize,
    RateLimitException,
    SandboxException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxUnreachableException,
    ServiceBusyException,
    TemplateException,
    TimeoutException,
)

from .. import arguments, remote_files
from ..command_check import CommandCheck, wait_for_verdict
from ..credentials import require_credential
from ..errors import (
    ConnectionLostError,
    FileTooLargeError,
    InvalidArgumentError,
    ProcessExitedError,
    ProviderError,
    SandboxError,
    SandboxFileNotFoundError,
)
from ..exec_output import ExecCapture
from ..process_entry import CommandSpec, PtyEntry
from ..remote_files import Entry, Kind
from ..session import BaseSandboxSession, SessionState
from ..settle import settle
from ..shell_trap import ShellTrap
from ..types import ExecResult

T = TypeVar("T")

API_KEY_ENV = "E2B_API_KEY"
# Metadata key that tags a sandbox with the start attempt that created it, so a create
# whose answer was lost can still be found and deleted.
START_TAG = "agent-sandbox-pty-start"
# Terminal input is sent in pieces of at most this size (one request each).
STDIN_CHUNK = 32 * 1024
# E2B reports a death by signal as -1 without the signal: only the wrapper (which catches
# the signals a terminal or a group kill sends) can die that way, and then by SIGKILL.
UNKNOWN_SIGNAL_EXIT = 128 + 9
# How long a one-shot command's stream may outlive its own timeout before E2B cuts it.
EXEC_STREAM_MARGIN_S = 30.0

# Errors that say the provider refused the create before doing anything: no sandbox can
# have been made, so there is nothing to look for afterwards.
_REFUSED = (
    AuthenticationException,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    ServiceBusyException,
    TemplateException,
    NotEnoughSpaceException,
)
# Errors that mean the thing we wanted to stop is already gone.
_GONE = (SandboxNotRunningException, NotFoundException)
# envd RPC codes that say the connection (not the request) failed, and codes a retry of
# the same request may get past.
_RPC_LOST = frozenset({RpcCode.UNAVAILABLE})
_RPC_RETRYABLE = frozenset(
    {RpcCode.DEADLINE_EXCEEDED, RpcCode.RESOURCE_EXHAUSTED, RpcCode.ABORTED, RpcCode.CANCELED}
)
# What pyqwest (the SDK's HTTP client) raises when a connection breaks: a connectrpc
# `ConnectError` carries one of these as its cause (`e2b.envd.rpc.is_transport_failure`).
_TRANSPORT_CAUSES: tuple[type[BaseException], ...] = (OSError,)
try:
    from pyqwest import ReadError, StreamError, WriteError

    _TRANSPORT_CAUSES = (OSError, ReadError, WriteError, StreamError)
except ImportError:  # pragma: no cover - an SDK release without pyqwest
    pass


def rpc_failure(exc: ConnectError) -> tuple[type[ProviderError], bool]:
    """Our error class and retryability for an envd RPC error the SDK passed on as is
    (it does so for transport failures, which its code mapping does not cover)."""
    if isinstance(exc.__cause__, _TRANSPORT_CAUSES) and exc.code is not RpcCode.DEADLINE_EXCEEDED:
        return ConnectionLostError, True
    if exc.code in _RPC_LOST:
        return ConnectionLostError, True
    return ProviderError, exc.code in _RPC_RETRYABLE


def exit_status(code: int | None) -> int:
    """The contract's exit status from E2B's (-1: killed by a signal it does not name)."""
    if code is None or code < 0:
        return UNKNOWN_SIGNAL_EXIT
    return code


def text_to_bytes(chunk: str | bytes | bytearray) -> bytes:
    """Bytes for an output chunk the SDK handed over as text (or already as bytes).

    `surrogateescape` gives back the original bytes should the SDK ever decode that way;
    text that cannot be encoded so (lone surrogates) is replaced, never raised on.
    """
    if isinstance(chunk, bytes | bytearray):
        return bytes(chunk)
    try:
        return chunk.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return chunk.encode("utf-8", "replace")


def pipe_wrapper(command: str, pgid_file: str) -> str:
    """The bash script (run by E2B as `bash -l -c`) that runs `command` on pipes as a job
    in its own process group, records the group id in `pgid_file`, and exits with the
    job's status (128+N for signal N)."""
    f = shlex.quote(pgid_file)
    return (
        "exec 3>&2 2>/dev/null; set -m; "
        f"sh -c {shlex.quote(command)} </dev/null 2>&3 3>&- & "
        f"echo $! >{f}; wait $!; s=$?; kill -KILL -- -$! 2>/dev/null; rm -f {f}; exit $s"
    )


def tty_wrapper(command: str) -> str:
    """The `sh` script that replaces E2B's interactive shell: runs `command` in a child
    shell and exits with its status, surviving the terminal's signals itself so that a
    command killed by signal N is reported as 128+N.

    The child is a subshell that execs the command: a caught trap is reset there (the
    command gets the default Ctrl-C), and its stderr redirection is made in the child, so
    the "Quit"/"Killed" notice the waiting shell prints goes to the wrapper's own stderr,
    /dev/null (dash applies a simple command's redirections while it waits for it)."""
    return (
        "exec 3>&2 2>/dev/null; trap : INT QUIT TERM HUP; "
        f"(exec sh -c {shlex.quote(command)} 2>&3 3>&-); exit $?"
    )


def group_signal_script(pgid_file: str, signame: str, leader: int, *, finish: bool) -> str:
    """A script that sends `signame` to the process group recorded in `pgid_file` by the
    wrapper `leader` (waiting briefly for the file while the wrapper is alive); with
    `finish`, also SIGKILLs the wrapper and removes the file."""
    f = shlex.quote(pgid_file)
    lines = [
        f"f={f}; i=0",
        f'while [ ! -s "$f" ] && kill -0 {leader} 2>/dev/null && [ $i -lt 100 ]; do '
        "sleep 0.01; i=$((i+1)); done",
        'g=$(cat "$f" 2>/dev/null)',
        'case "$g" in ""|*[!0-9]*) ;; *) '
        f'[ "$g" -gt 1 ] && kill -{signame} -- "-$g" 2>/dev/null;; esac',
    ]
    if finish:
        lines.append(f'kill -KILL {leader} 2>/dev/null; rm -f "$f"')
    lines.append("exit 0")
    return "\n".join(lines)


def group_kill_script(leader: int) -> str:
    """SIGKILL the process group led by `leader` (a terminal's session leader)."""
    return f"kill -KILL -- -{leader} 2>/dev/null; exit 0"


@dataclass(eq=False)
class _E2BProcess:
    """What the session keeps about one process (`entry.handle`)."""

    tty: bool
    start_task: asyncio.Task[Any] | None = None
    handle: Any = None
    waiter: asyncio.Task[None] | None = None
    trap: ShellTrap | None = None
    pgid_file: str | None = None
    ended: bool = False


class E2BSession(BaseSandboxSession):
    """Runs commands in an E2B sandbox (see the module docstring for the options)."""

    backend_name = "e2b"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        sandbox_id: str | None = None,
        template: str | None = None,
        keep: bool = False,
        sandbox_timeout_s: int = 3600,
        request_timeout_s: float | None = None,
        start_timeout_s: float = 120.0,
        kill_timeout_s: float = 15.0,
        process_timeout_s: float = 86_400.0,
        metadata: Mapping[str, str] | None = None,
        envs: Mapping[str, str] | None = None,
        sandbox_class: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        for name, value in (
            ("start_timeout_s", start_timeout_s),
            ("kill_timeout_s", kill_timeout_s),
            ("sandbox_timeout_s", sandbox_timeout_s),
        ):
            if not _positive(value):
                raise InvalidArgumentError(f"{name} must be a positive number of seconds")
        if request_timeout_s is not None and not _positive(request_timeout_s):
            raise InvalidArgumentError("request_timeout_s must be a positive number or None")
        if not (_positive(process_timeout_s) or process_timeout_s == 0):
            raise InvalidArgumentError("process_timeout_s must be >= 0 (0: no limit)")
        if api_key is not None and not isinstance(api_key, str):
            raise InvalidArgumentError("api_key must be a str")
        for name, text in (("sandbox_id", sandbox_id), ("template", template)):
            arguments.check_str(name, text)
        metadata = arguments.check_env(metadata, name="metadata")
        envs = arguments.check_env(envs, name="envs")
        self._api_key_option = api_key
        self._api_key: str | None = None
        self._attach_id = sandbox_id
        self._template = template
        self._keep = bool(keep)
        self._sandbox_timeout = int(sandbox_timeout_s)
        self._request_timeout = request_timeout_s
        self._start_timeout = float(start_timeout_s)
        self._kill_timeout = float(kill_timeout_s)
        self._process_timeout = float(process_timeout_s)
        self._metadata = dict(metadata or {})
        self._envs = dict(envs or {})
        self._sandbox_class: Any = sandbox_class if sandbox_class is not None else AsyncSandbox
        self._sandbox: Any = None
        self._start_task: asyncio.Task[Any] | None = None
        self._start_token: str | None = None

    @property
    def sandbox_id(self) -> str | None:
        """The E2B sandbox id (after start), or the one given to attach to."""
        if self._sandbox is not None:
            return str(self._sandbox.sandbox_id)
        return self._attach_id

    # ---- errors ------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        for secret in (self._api_key, self._api_key_option):
            if secret and len(secret) >= 4:
                text = text.replace(secret, "[redacted]")
        return text

    def _error(self, exc: BaseException, action: str) -> SandboxError:
        """Our error for an SDK failure while doing `action` (retryable from its type)."""
        if isinstance(exc, SandboxError):
            return exc
        raw = str(exc)
        detail = self._redact(raw)
        cls: type[ProviderError] = ProviderError
        if isinstance(exc, RateLimitException | ServiceBusyException):
            retryable = True
        elif isinstance(exc, SandboxNotRunningException):
            retryable = False  # the sandbox is gone (killed, or its lifetime ran out)
        elif isinstance(exc, SandboxUnreachableException):
            cls, retryable = ConnectionLostError, True
        elif isinstance(exc, TimeoutException):
            retryable = True
        elif isinstance(exc, _REFUSED):
            retryable = False
        elif isinstance(exc, ConnectError):
            cls, retryable = rpc_failure(exc)
        elif isinstance(exc, httpx.TimeoutException):
            retryable = True
        elif isinstance(exc, httpx.TransportError | ConnectionError) or (
            isinstance(exc, _TRANSPORT_CAUSES) and not isinstance(exc, TimeoutError)
        ):
            cls, retryable = ConnectionLostError, True
        elif isinstance(exc, TimeoutError):
            retryable = True
        elif isinstance(exc, SandboxException):
            retryable = exc.status_code in (429, 502, 503, 504)
        else:
            retryable = False
        message = f"e2b: could not {action}: {type(exc).__name__}: {detail[:500]}"
        error = cls(message, retryable=retryable)
        # Chain the SDK's exception only when its text is free of the secret.
        error.__cause__ = exc if detail == raw else None
        error.__suppress_context__ = True
        return error

    def _fail(self, exc: BaseException, action: str) -> NoReturn:
        """Raise our error for `exc` (chained to it only when its text holds no secret)."""
        error = self._error(exc, action)
        raise error from error.__cause__

    def _reason(self, exc: BaseException) -> str:
        """A short, secret-free reason for a lost process."""
        return f"e2b stream failed: {type(exc).__name__}: {self._redact(str(exc))[:300]}"

    def _request(self) -> dict[str, Any]:
        return {} if self._request_timeout is None else {"request_timeout": self._request_timeout}

    def _api_params(self) -> dict[str, Any]:
        return {"api_key": self._api_key, **self._request()}

    async def _bounded(self, call: Awaitable[T], seconds: float) -> T:
        async with asyncio.timeout(seconds):
            return await call

    # ---- lifecycle -----------------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Resolve the API key, then attach to `sandbox_id` or create a sandbox (tagged,
        as a task we own, so a cancelled or failed create can be cleaned up)."""
        self._api_key = require_credential(
            self._api_key_option, API_KEY_ENV, backend="e2b", what="an E2B API key (api_key)"
        )
        cls = self._sandbox_class
        if self._attach_id is not None:
            try:
                self._sandbox = await self._bounded(
                    cls.connect(
                        self._attach_id, timeout=self._sandbox_timeout, **self._api_params()
                    ),
                    self._start_timeout,
                )
            except Exception as exc:
                self._fail(exc, f"attach to sandbox {self._attach_id}")
            return
        token = secrets.token_hex(12)
        self._start_token = token
        create = cls.create(
            template=self._template,
            timeout=self._sandbox_timeout,
            metadata={**self._metadata, START_TAG: token},
            envs=self._envs or None,
            # Lowercase letters, digits and hyphens, as the SDK requires: the SDK's own
            # retries of this request then return the same sandbox, never a second one.
            idempotency_key=f"agent-sandbox-pty-{token}",
            **self._api_params(),
        )
        # The create runs as our task: if this caller is cancelled, `_stop_backend` waits
        # for it and deletes the sandbox it made.
        self._start_task = asyncio.ensure_future(self._bounded(create, self._start_timeout))
        try:
            self._sandbox = await asyncio.shield(self._start_task)
        except Exception as exc:
            self._fail(exc, "create a sandbox")
        self._start_task = None

    async def _stop_backend(self) -> None:
        """Kill the sandbox unless kept; after an unfinished start, delete whatever the
        create made (waiting for it, or searching by tag when its outcome is unknown)."""
        task, self._start_task = self._start_task, None
        sandbox, self._sandbox = self._sandbox, None
        token, self._start_token = self._start_token, None
        unfinished_start = task is not None
        if task is not None and sandbox is None:
            # The start failed or its caller was cancelled: the create's outcome decides.
            if not task.done():
                await asyncio.wait([task])
            failure = None if task.cancelled() else task.exception()
            if task.cancelled() or failure is not None:
                if token is not None and not isinstance(failure, _REFUSED):
                    await self._sweep(token)
                return
            sandbox = task.result()
        if sandbox is None or (self._keep and not unfinished_start):
            return
        try:
            await self._bounded(sandbox.kill(**self._api_params()), self._kill_timeout)
        except _GONE:
            pass
        except TimeoutError:
            raise ProviderError(
                f"e2b: killing sandbox {sandbox.sandbox_id} did not finish within "
                f"{self._kill_timeout:g}s (it ends by itself after {self._sandbox_timeout}s)",
                retryable=True,
            ) from None
        except Exception as exc:
            self._fail(exc, f"kill sandbox {sandbox.sandbox_id}")

    async def _sweep(self, token: str) -> None:
        """Kill any sandbox tagged with `token` (a create whose answer was lost)."""
        cls = self._sandbox_class
        params = self._api_params()
        try:
            async with asyncio.timeout(self._kill_timeout * 2):
                paginator = cls.list(query=SandboxQuery(metadata={START_TAG: token}), **params)
                while paginator.has_next:
                    for info in await paginator.next_items():
                        with contextlib.suppress(*_GONE):
                            await cls.kill(info.sandbox_id, **params)
        except TimeoutError:
            raise ProviderError(
                "e2b: could not check whether the failed start left a sandbox behind "
                f"(no answer within {self._kill_timeout * 2:g}s)",
                retryable=True,
            ) from None
        except Exception as exc:
            self._fail(exc, "look for a sandbox left by the failed start")

    def _sandbox_going_away(self) -> bool:
        """True while closing a session whose sandbox will be killed: killing its
        processes one by one first would only cost requests."""
        return self.state is SessionState.CLOSING and not self._keep

    # ---- one-shot commands ---------------------------------------------------------------

    async def _owned_start(
        self, call: Coroutine[Any, Any, T], undo: Callable[[T], Awaitable[None]]
    ) -> T:
        """Run a call that creates something remote as our task; if the caller is
        cancelled meanwhile, wait for it (settled) and `undo` what it made."""
        task = asyncio.ensure_future(self._bounded(call, self._start_timeout))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await settle(self._undo_start(task, undo))
            raise

    async def _undo_start(
        self, task: asyncio.Task[T], undo: Callable[[T], Awaitable[None]]
    ) -> None:
        if not task.done():
            await asyncio.wait([task])
        if not task.cancelled() and task.exception() is None:
            await undo(task.result())

    async def _exec(
        self, spec: CommandSpec, timeout: float | None, capture: ExecCapture
    ) -> ExecResult:
        """Run the command as a background job in its own process group (its output
        streamed into the bounded capture); on timeout or cancellation kill that group
        (never the sandbox). A `cwd` (or `shell=False`) runs behind the command check:
        E2B would refuse a missing `cwd` with an error of its own."""
        sandbox = self._sandbox
        check = capture.check = CommandCheck.needed(spec, cwd=spec.cwd)
        command = spec.shell_command if check is None else check.shell(spec.argv, announce=False)
        pgid_file = _new_pgid_file()
        lifetime = self._process_timeout if timeout is None else timeout + EXEC_STREAM_MARGIN_S
        try:
            handle = await self._owned_start(
                sandbox.commands.run(
                    pipe_wrapper(command, pgid_file),
                    background=True,
                    envs=spec.env,
                    on_stdout=lambda chunk: capture.add_stdout(text_to_bytes(chunk)),
                    on_stderr=lambda chunk: capture.add_stderr(text_to_bytes(chunk)),
                    stdin=False,
                    timeout=lifetime,
                    retain_output=False,
                    **self._request(),
                ),
                lambda h: self._abort_pipe(sandbox, h, pgid_file),
            )
        except Exception as exc:
            self._fail(exc, "start a command")
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                code = await self._wait_code(handle)
        except TimeoutError:
            await settle(self._abort_pipe(sandbox, handle, pgid_file))
            if not deadline.expired():
                self._fail(TimeoutError("the command's stream timed out"), "run a command")
            raise capture.timeout_error(spec.display, timeout) from None
        except asyncio.CancelledError:
            await settle(self._abort_pipe(sandbox, handle, pgid_file))
            raise
        except Exception as exc:
            await settle(self._abort_pipe(sandbox, handle, pgid_file))
            self._fail(exc, "run a command")
        await settle(self._disconnect(handle))
        return capture.result(code)

    async def _abort_pipe(self, sandbox: Any, handle: Any, pgid_file: str) -> None:
        """Kill a pipe command's whole tree and stop reading it."""
        try:
            await self._kill_pipe_tree(sandbox, handle.pid, pgid_file)
        finally:
            await self._disconnect(handle)

    async def _wait_code(self, handle: Any) -> int:
        try:
            result = await handle.wait()
        except CommandExitException as exc:
            return exit_status(exc.exit_code)
        return exit_status(result.exit_code)

    async def _disconnect(self, handle: Any) -> None:
        # Local work in the SDK (cancel its reader task, close the stream); bounded anyway.
        with contextlib.suppress(Exception):
            await self._bounded(handle.disconnect(), self._kill_timeout)

    # ---- killing process trees ------------------------------------------------------------

    async def _helper(self, sandbox: Any, script: str) -> None:
        """Run a short control command (a kill, a signal) in the sandbox."""
        await self._bounded(
            sandbox.commands.run(
                script,
                timeout=self._kill_timeout,
                request_timeout=self._kill_timeout,
                retain_output=False,
            ),
            self._kill_timeout,
        )

    async def _steps(self, steps: list[tuple[str, Callable[[], Awaitable[object]]]]) -> None:
        """Attempt every step (bounded); a target that is already gone is fine; raise the
        first real failure after all were attempted."""
        errors: list[SandboxError] = []
        for action, step in steps:
            try:
                await self._bounded(step(), self._kill_timeout)
            except _GONE:
                pass
            except TimeoutError:
                errors.append(
                    ProviderError(
                        f"e2b: could not {action}: no answer within {self._kill_timeout:g}s",
                        retryable=True,
                    )
                )
            except Exception as exc:
                errors.append(self._error(exc, action))
        if errors:
            raise errors[0]

    async def _kill_pipe_tree(self, sandbox: Any, pid: int, pgid_file: str) -> None:
        if pid <= 1:
            return
        script = group_signal_script(pgid_file, "KILL", pid, finish=True)
        await self._steps(
            [
                ("kill the command's process group", lambda: self._helper(sandbox, script)),
                ("kill the command", lambda: sandbox.commands.kill(pid, **self._request())),
            ]
        )

    async def _kill_tty_tree(self, sandbox: Any, pid: int) -> None:
        if pid <= 1:
            return
        script = group_kill_script(pid)
        await self._steps(
            [
                ("kill the terminal's process group", lambda: self._helper(sandbox, script)),
                ("kill the terminal", lambda: sandbox.pty.kill(pid, **self._request())),
            ]
        )

    # ---- processes --------------------------------------------------------------------------

    async def _spawn_process(self, entry: PtyEntry) -> None:
        """tty: an E2B PTY (a login bash) with the shell-trap line typed in; pipes: a
        background command with stdin closed. Output flows into `entry.feed`."""
        sandbox = self._sandbox
        spec = entry.spec
        command = spec.command
        proc = _E2BProcess(tty=spec.tty)
        entry.handle = proc
        # With a check (a `cwd`, or `shell=False`) the process starts in E2B's default
        # directory and the check enters `cwd`; its verdict is waited for below.
        check = CommandCheck.needed(command, cwd=command.cwd)
        shell_command = (
            command.shell_command if check is None else check.shell(command.argv, announce=True)
        )
        cwd = command.cwd if check is None else None
        if spec.tty:
            trap = ShellTrap(report_exit=False, token=None if check is None else check.token)
            proc.trap = trap

            def on_data(data: bytes) -> None:
                """Terminal output, minus what the shell trap added."""
                shown = trap.feed(bytes(data))
                if shown:
                    entry.feed(shown)

            start: Coroutine[Any, Any, Any] = sandbox.pty.create(
                size=PtySize(rows=spec.rows, cols=spec.cols),
                on_data=on_data,
                cwd=cwd,
                envs=command.env,
                timeout=self._process_timeout,
                **self._request(),
            )
        else:
            proc.pgid_file = _new_pgid_file()
            if check is not None:
                proc.trap = ShellTrap(report_exit=False, token=check.token)
            stdout_trap = proc.trap

            def on_output(chunk: str | bytes) -> None:
                """Pipe output (stdout and stderr, in arrival order) as bytes."""
                entry.feed(text_to_bytes(chunk))

            def on_stdout(chunk: str | bytes) -> None:
                """Stdout behind a check: the trap strips the check's start marker."""
                assert stdout_trap is not None
                shown = stdout_trap.feed(text_to_bytes(chunk))
                if shown:
                    entry.feed(shown)

            start = sandbox.commands.run(
                pipe_wrapper(shell_command, proc.pgid_file),
                background=True,
                envs=command.env,
                cwd=cwd,
                on_stdout=on_output if check is None else on_stdout,
                on_stderr=on_output,
                stdin=False,
                timeout=self._process_timeout,
                retain_output=False,
                **self._request(),
            )
        # Our task, shielded: a cancelled caller leaves it to `_terminate_pty_entry`,
        # which waits for it and kills what it started.
        proc.start_task = asyncio.ensure_future(self._bounded(start, self._start_timeout))
        try:
            proc.handle = await asyncio.shield(proc.start_task)
        except Exception as exc:
            self._fail(exc, "start a process")
        proc.waiter = asyncio.ensure_future(self._watch(entry, proc))
        if spec.tty and proc.trap is not None:
            line = proc.trap.line(tty_wrapper(shell_command), tty=True, announced=bool(check))
            await self._send(proc.handle.pid, line.encode())
        if check is not None and proc.trap is not None:
            await wait_for_verdict(entry, proc.trap, check)

    async def _watch(self, entry: PtyEntry, proc: _E2BProcess) -> None:
        """Wait for the process's end and report it (or report the stream lost)."""
        try:
            code = await self._wait_code(proc.handle)
        except Exception as exc:
            self._flush_trap(entry, proc)
            entry.report_lost(self._reason(exc))
            return
        proc.ended = True
        self._flush_trap(entry, proc)
        entry.report_exit(code)
        entry.report_eof()

    def _flush_trap(self, entry: PtyEntry, proc: _E2BProcess) -> None:
        if proc.trap is not None:
            entry.feed(proc.trap.flush())

    async def _send(self, pid: int, data: bytes) -> None:
        sandbox = self._sandbox
        for at in range(0, len(data), STDIN_CHUNK):
            try:
                await sandbox.pty.send_stdin(pid, data[at : at + STDIN_CHUNK], **self._request())
            except NotFoundException:
                raise ProcessExitedError(
                    "the process has exited; poll it with empty chars to collect its "
                    "remaining output and exit code"
                ) from None
            except Exception as exc:
                self._fail(exc, "write to the terminal")

    async def _write_stdin(self, entry: PtyEntry, data: bytes) -> None:
        """Send keystrokes to the PTY (in pieces of at most `STDIN_CHUNK`)."""
        proc: _E2BProcess = entry.handle
        await self._send(proc.handle.pid, data)

    async def _resize(self, entry: PtyEntry, rows: int, cols: int) -> None:
        """Resize the PTY (`pty.resize`); a process that just exited is left alone."""
        proc: _E2BProcess = entry.handle
        try:
            await self._sandbox.pty.resize(
                proc.handle.pid, PtySize(rows=rows, cols=cols), **self._request()
            )
        except NotFoundException:
            return  # it just exited: nothing to resize
        except Exception as exc:
            self._fail(exc, "resize the terminal")

    async def _interrupt(self, entry: PtyEntry) -> None:
        """tty: the interrupt character; pipes: SIGINT to the command's process group,
        sent by a second command."""
        proc: _E2BProcess = entry.handle
        if entry.tty:
            await self._send(proc.handle.pid, b"\x03")
            return
        assert proc.pgid_file is not None
        script = group_signal_script(proc.pgid_file, "INT", proc.handle.pid, finish=False)
        try:
            await self._helper(self._sandbox, script)
        except TimeoutError:
            raise ProviderError(
                f"e2b: the interrupt got no answer within {self._kill_timeout:g}s",
                retryable=True,
            ) from None
        except Exception as exc:
            self._fail(exc, "interrupt the process")

    async def _terminate_pty_entry(self, entry: PtyEntry) -> None:
        """Wait for an unfinished start, kill the process group and the process, stop
        and await the waiter task, and disconnect the SDK handle (its reader task)."""
        proc: _E2BProcess | None = entry.handle
        if proc is None:
            return
        handle = proc.handle
        if handle is None and proc.start_task is not None:
            # The start was cancelled or failed half-way: what did it start?
            task = proc.start_task
            if not task.done():
                await asyncio.wait([task])  # bounded by start_timeout_s
            if not task.cancelled() and task.exception() is None:
                handle = proc.handle = task.result()
        sandbox = self._sandbox
        error: BaseException | None = None
        if handle is not None and not proc.ended and not self._sandbox_going_away():
            try:
                if proc.tty:
                    await self._kill_tty_tree(sandbox, handle.pid)
                else:
                    assert proc.pgid_file is not None
                    await self._kill_pipe_tree(sandbox, handle.pid, proc.pgid_file)
            except Exception as exc:
                error = exc
        if proc.waiter is not None:
            proc.waiter.cancel()
            await asyncio.wait([proc.waiter])
        if handle is not None:
            await self._disconnect(handle)
        if error is not None:
            raise error

    # ---- files ------------------------------------------------------------------------------

    async def _stat(self, path: str) -> Entry | None:
        """`files.get_info` as an `Entry` (None when nothing is there)."""
        try:
            info = await self._sandbox.files.get_info(path, **self._request())
        except FileNotFoundException:
            return None
        except Exception as exc:
            self._fail(exc, f"inspect {path!r}")
        kinds: dict[object, Kind] = {
            FileType.FILE: "file",
            FileType.DIR: "dir",
            FileType.SYMLINK: "symlink",
        }
        # envd reports no type (None here) for a FIFO, socket or device.
        return Entry(kinds.get(info.type, "other"), size=info.size, target=info.symlink_target)

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        """`files.read` as bytes (relative paths are in the sandbox user's home), after
        `files.get_info` says it is a regular file within `max_bytes` (envd's download
        of a FIFO would wait forever)."""
        size = await remote_files.regular_file(self._stat, path, write=False)
        if size is not None and size > max_bytes:
            raise FileTooLargeError.over(path, size, max_bytes)
        try:
            data = await self._sandbox.files.read(path, format="bytes", **self._request())
        except FileNotFoundException:
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from None
        except Exception as exc:
            self._fail(exc, f"read {path!r}")
        return bytes(data)

    async def _write_file(self, path: str, data: bytes) -> None:
        """`files.write` (E2B creates the parent directories), after `files.get_info`
        says nothing or a regular file is there."""
        await remote_files.regular_file(self._stat, path, write=True)
        try:
            await self._sandbox.files.write(path, data, **self._request())
        except Exception as exc:
            failure = self._error(exc, f"write {path!r}")
            raise await remote_files.explain_write_failure(self._stat, path, failure) from None


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _new_pgid_file() -> str:
    return f"/tmp/.agent-sandbox-pty-{secrets.token_hex(8)}.pgid"
