"""The `daytona` backend: Daytona sandboxes through the SDK's async surface (`daytona`).

How the contract maps onto the SDK (checked against daytona==0.226.1):

- Start: `AsyncDaytona(DaytonaConfig(...))`, then `create()` a sandbox with a unique
  name, or `get(sandbox_id)` to attach. If creating fails or is cancelled half-way, the
  sandbox is looked up by that name and deleted, so nothing is left on the provider.
  A one-time `process.exec` learns the working directory and makes a private state
  directory for the pid files described below.
- `tty=True`: a PTY session (`process.create_pty_session`). Daytona runs an interactive
  shell there, so the command is typed into it with `ShellTrap` in exec mode: the shell
  is replaced by the command, whose own exit ends the PTY; everything before the trap's
  start marker (prompt, echo) is dropped. The PTY's output arrives as bytes.
- `tty=False`: one session per process (`process.create_session`), the command sent
  with `execute_session_command(run_async=True)`, output streamed by
  `get_session_command_logs_async`, the exit code read with `get_session_command`.
  The command runs with stdin from /dev/null, in its own session and process group
  (`setsid`), recording that group's id in a pid file: interrupt is SIGINT to the group
  and terminate kills the group, each done by a second, short `process.exec`.
- Terminating a PTY kills its process group (and session) the same way: the command
  writes its pid (its group's and session's id) to a pid file before it execs.

What the SDK makes impossible, and what is done instead:

- Session logs reach us as text: the SDK decodes each stream with an incremental UTF-8
  decoder (so a character split across chunks is kept whole), but bytes that are not
  UTF-8 are replaced by U+FFFD before we see them. Pipe output (tty=False and `exec`)
  is therefore exact for UTF-8 text only. PTY output is exact: the SDK hands us bytes.
- The exit status of a PTY command killed by signal N is whatever the daemon reports:
  a code of 128+N is used as is; a negative code (Go's -1 for a signal death) is
  mapped to 128+N from the reason text (`signal: killed`, `SIGKILL`, `signal 9`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import re
import secrets
import shlex
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from daytona import (
    AsyncDaytona,
    CreateSandboxFromSnapshotParams,
    DaytonaAuthenticationError,
    DaytonaBadGatewayError,
    DaytonaBadRequestError,
    DaytonaConfig,
    DaytonaConflictError,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaForbiddenError,
    DaytonaGoneError,
    DaytonaInternalServerError,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaServiceUnavailableError,
    DaytonaTimeoutError,
    DaytonaUnprocessableEntityError,
    PtySize,
    SandboxState,
    SessionExecuteRequest,
)

from .. import arguments, remote_files
from ..command_check import CommandCheck, wait_for_verdict
from ..credentials import Secret, require_credential
from ..errors import (
    ConnectionLostError,
    FileTooLargeError,
    InvalidArgumentError,
    ProcessExitedError,
    ProviderError,
    SandboxFileNotFoundError,
)
from ..exec_output import ExecCapture
from ..process_entry import CommandSpec, PtyEntry
from ..remote_files import Entry
from ..session import BaseSandboxSession, SessionState
from ..settle import settle
from ..shell_trap import ShellTrap
from ..types import ExecResult

logger = logging.getLogger("sandbox.daytona")

T = TypeVar("T")

API_KEY_ENV = "DAYTONA_API_KEY"
DEFAULT_TERM = "xterm-256color"
# A trap line longer than this is not typed: the command goes to a script file first,
# because a terminal in canonical mode silently truncates lines beyond 4095 bytes.
MAX_TYPED_LINE = 1024
# How long a kill/interrupt script waits for a just-started command's pid file.
PIDFILE_WAIT_S = 0.5
# After a session command's output ended, how long to wait for its exit code.
EXIT_CODE_WAIT_S = 30.0

_RETRYABLE = (
    DaytonaRateLimitError,
    DaytonaTimeoutError,
    DaytonaConnectionError,
    DaytonaServiceUnavailableError,
    DaytonaBadGatewayError,
)
_NOT_RETRYABLE = (
    DaytonaNotFoundError,
    DaytonaAuthenticationError,
    DaytonaForbiddenError,
    DaytonaBadRequestError,
    DaytonaConflictError,
    DaytonaUnprocessableEntityError,
    DaytonaGoneError,
    DaytonaInternalServerError,
)
_RETRYABLE_STATUS = {408, 429, 502, 503, 504}

# Go's names for signals, as the daemon may report a PTY process's death.
_GO_SIGNALS = {
    "hangup": 1,
    "interrupt": 2,
    "quit": 3,
    "illegal instruction": 4,
    "trace/breakpoint trap": 5,
    "aborted": 6,
    "bus error": 7,
    "floating point exception": 8,
    "killed": 9,
    "user defined signal 1": 10,
    "segmentation fault": 11,
    "user defined signal 2": 12,
    "broken pipe": 13,
    "alarm clock": 14,
    "terminated": 15,
}


def _typed_cause(exc: BaseException) -> BaseException:
    """The most specific Daytona error in `exc`'s cause chain (some SDK calls re-wrap a
    typed error in a plain `DaytonaError`)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DaytonaError) and type(current) is not DaytonaError:
            return current
        current = current.__cause__
    return exc


def is_retryable(exc: BaseException) -> bool:
    """Whether a retry may help, from the SDK's typed exception (or its HTTP status)."""
    typed = _typed_cause(exc)
    if isinstance(typed, _RETRYABLE):
        return True
    if isinstance(typed, _NOT_RETRYABLE):
        return False
    status = getattr(typed, "status_code", None)
    return status in _RETRYABLE_STATUS


def _refused(exc: BaseException) -> bool:
    """Whether the API refused a request outright (so it created nothing): a client
    error other than a request timeout, or an error raised before any request."""
    typed = _typed_cause(exc)
    if isinstance(
        typed,
        DaytonaAuthenticationError
        | DaytonaForbiddenError
        | DaytonaBadRequestError
        | DaytonaConflictError
        | DaytonaUnprocessableEntityError
        | DaytonaRateLimitError,
    ):
        return True
    status = getattr(typed, "status_code", None)
    return status is not None and 400 <= status < 500 and status != 408


def pty_exit_status(code: int | None, reason: str | None) -> int | None:
    """A PTY's exit status as the contract reports it (128+N for signal N), from what
    the daemon reported; None when it reported nothing usable."""
    if code is not None and code >= 0:
        return code
    number = _signal_number(reason or "")
    if number is not None:
        return 128 + number
    return None if code is None else 255


def _signal_number(reason: str) -> int | None:
    text = reason.strip().lower()
    match = re.search(r"signal[:\s]+(\d{1,2})\b", text)
    if match:
        return int(match.group(1))
    match = re.search(r"\bsig([a-z]+[0-9]*)\b", text)
    if match:
        with contextlib.suppress(KeyError):
            return int(signal.Signals["SIG" + match.group(1).upper()])
    match = re.search(r"signal:\s*(.+)$", text)
    if match:
        return _GO_SIGNALS.get(match.group(1).strip())
    return None


def _q(text: str) -> str:
    return shlex.quote(text)


# The pid files hold "<pid> <start time>": the pid of the process that leads the
# command's session and process group, and its start time (field 22 of /proc/<pid>/stat)
# so that a pid reused by an unrelated process is never signalled.
_RECORD_SELF = (
    "s=; l=; read -r l </proc/$$/stat 2>/dev/null && { r=${l##*) }; set -- $r; s=${20}; }; "
)

# Shell functions for the kill and interrupt scripts (POSIX sh: dash, bash, busybox).
# `st PID` prints a live process's start time; `desc PID` prints PID and every live
# descendant (found through the parent pids in /proc, so children that left the group
# or session with setsid are found while their parent lives).
_FUNCTIONS = (
    "st() { _l=; read -r _l </proc/$1/stat 2>/dev/null || return 0; "
    '_r=${_l##*) }; set -- $_r; echo "${20}"; }; '
    "desc() { _root=$1; _pairs=; for _s in /proc/[0-9]*/stat; do "
    'read -r _l <"$_s" 2>/dev/null || continue; _r=${_l##*) }; set -- $_r; '
    '_q=${_s#/proc/}; _pairs="$_pairs ${_q%/stat}:$2"; done; '
    '_t=" $_root "; _c=1; while [ $_c = 1 ]; do _c=0; for _x in $_pairs; do '
    'case $_t in *" ${_x#*:} "*) case $_t in *" ${_x%:*} "*) ;; '
    '*) _t="$_t${_x%:*} "; _c=1;; esac;; esac; done; done; echo $_t; }; '
)


def _read_pidfile_script() -> str:
    """Read "$f" into $p (pid) and $s (start time), or stop: never signal group 0 or 1
    (that would be every process we may signal), nor a pid now used by another process.
    Sets $mine=1 when $p is alive and is ours, 0 when it has exited (its group and
    session may live on: their ids cannot be reused while they have members)."""
    return (
        'p=; s=; read -r p s <"$f" 2>/dev/null; '
        "case $p in ''|*[!0-9]*) echo none; exit 0;; esac; "
        '[ "$p" -gt 1 ] || { echo none; exit 0; }; '
        "now=$(st $p); mine=0; "
        'if [ -n "$now" ]; then '
        'if [ -n "$s" ] && [ "$now" != "$s" ]; then rm -f "$f"; echo none; exit 0; fi; '
        "mine=1; fi; "
    )


def _wait_pidfile_script(wait_s: float) -> str:
    steps = max(0, round(wait_s / 0.05))
    if not steps:
        return ""
    return f'i=0; while [ ! -s "$f" ] && [ $i -lt {steps} ]; do sleep 0.05; i=$((i+1)); done; '


def interrupt_script(pidfile: str, *, wait_s: float) -> str:
    """`sh -c` text: SIGINT to the process group recorded in `pidfile` (waiting up to
    `wait_s` for a just-started command to write it). Prints `done` or `none`."""
    body = (
        f"f={_q(pidfile)}; "
        + _FUNCTIONS
        + _wait_pidfile_script(wait_s)
        + _read_pidfile_script()
        + '[ "$mine" = 1 ] || { echo none; exit 0; }; '
        + "kill -INT -$p 2>/dev/null || kill -INT $p 2>/dev/null; echo done"
    )
    return f"sh -c {_q(body)}"


def kill_script(pidfile: str, *, wait_s: float, grace_s: float) -> str:
    """`sh -c` text: stop the process tree recorded in `pidfile`: its process group, its
    session and its descendants get SIGHUP/SIGTERM/SIGCONT, up to `grace_s` to go, then
    SIGKILL; the file is removed. Prints `done`, or `none` when there was nothing of
    ours to signal."""
    steps = max(0, round(grace_s / 0.05))
    polite = (
        "if alive; then sig HUP; sig TERM; sig CONT; "
        '[ -n "$d" ] && kill -TERM $d 2>/dev/null; i=0; '
        f"while alive && [ $i -lt {steps} ]; do sleep 0.05; i=$((i+1)); done; fi; "
    )
    body = (
        f"f={_q(pidfile)}; "
        + _FUNCTIONS
        + _wait_pidfile_script(wait_s)
        + _read_pidfile_script()
        + 'sig() { kill -$1 -$p 2>/dev/null; [ "$mine" = 1 ] && kill -$1 $p 2>/dev/null; '
        + "return 0; }; "
        + 'alive() { kill -0 -$p 2>/dev/null || { [ "$mine" = 1 ] && kill -0 $p 2>/dev/null; }; }; '
        + 'd=; [ "$mine" = 1 ] && d=$(desc $p); '
        + (polite if steps else "")
        + '[ "$mine" = 1 ] && d="$d $(desc $p)"; '
        + 'sig KILL; [ -n "$d" ] && kill -KILL $d 2>/dev/null; '
        + "if command -v pkill >/dev/null 2>&1; then pkill -KILL -s $p 2>/dev/null; fi; "
        + 'rm -f "$f"; echo done'
    )
    return f"sh -c {_q(body)}"


def piped_command(command: str, *, pidfile: str, cwd: str, env: Mapping[str, str]) -> str:
    """The session command for a pipe process: `command` with stdin from /dev/null, in
    its own session and process group whose id goes to `pidfile`; when it ends, what is
    left of its group is killed (as the local backend does) and its exit status (128+N
    for a signal) is the session command's."""
    leader = "f=$1; c=$2; " + _RECORD_SELF + 'printf "%s %s" "$$" "$s" >"$f"; exec sh -c "$c"'
    env_prefix = ""
    if env:
        env_prefix = "env " + " ".join(_q(f"{k}={v}") for k, v in env.items()) + " "
    launch = f'{env_prefix}sh -c {_q(leader)} sh "$f" {_q(command)} </dev/null 2>&3 3>&-'
    body = (
        # The waiting shell reports a child killed by a signal ("Killed") on its stderr,
        # which is /dev/null here; the command keeps the real stderr (fd 3). Its
        # redirections live inside a subshell that execs it, so the report cannot use
        # them.
        "exec 3>&2 2>/dev/null; "
        f"cd {_q(cwd)} 2>&3 || exit 1; f={_q(pidfile)}; "
        "if command -v setsid >/dev/null 2>&1; "
        f"then (exec setsid {launch}); else (exec {launch}); fi; "
        # The leader was reaped above: while members of its group live, the group id
        # cannot be reused, so this kills only what the command left behind.
        's=$?; p=; read -r p x <"$f" 2>/dev/null; '
        "case $p in ''|*[!0-9]*) ;; *) [ \"$p\" -gt 1 ] && kill -KILL -$p 2>/dev/null;; esac; "
        'rm -f "$f"; exit $s'
    )
    return f"sh -c {_q(body)}"


def pty_inner_command(command: str, *, pidfile: str, cwd: str, script: str | None = None) -> str:
    """What the PTY's shell execs (through `ShellTrap`): record its pid (the terminal's
    session and process group id) and start time, change directory, exec the command."""
    parts = []
    if script is not None:
        parts.append(f"rm -f {_q(script)}")
    parts.append(_RECORD_SELF + f'printf "%s %s" "$$" "$s" >{_q(pidfile)} 2>/dev/null')
    parts.append(f"cd {_q(cwd)} || exit 1")
    parts.append(f"exec sh -c {_q(command)}")
    return "; ".join(parts)


@dataclass(eq=False)
class _PtyState:
    """A tty process: its PTY session, the trap filtering its output, its waiter."""

    pty_id: str
    pidfile: str
    trap: ShellTrap
    handle: Any = None
    connect_attempted: bool = False
    line_sent: bool = False
    waiter: asyncio.Task[None] | None = None
    script: str | None = None


@dataclass(eq=False)
class _PipeState:
    """A pipe process (or one-shot command): its session, command id and reader."""

    session_id: str
    pidfile: str
    session_attempted: bool = False
    execute_attempted: bool = False
    cmd_id: str | None = None
    finished: bool = False
    pump: asyncio.Task[None] | None = None


class DaytonaSession(BaseSandboxSession):
    """Runs commands in a Daytona sandbox through the async SDK.

    Options:

    - `api_key`: the API key (default: the `DAYTONA_API_KEY` environment variable);
      `api_url`, `target`: passed to `DaytonaConfig` (the SDK falls back to
      `DAYTONA_API_URL` / `DAYTONA_TARGET`);
    - `sandbox_id`: attach to this existing sandbox (id or name) instead of creating one;
    - `keep`: leave the sandbox alive on close (default False: closing deletes it, be it
      created or attached, as the other cloud backends do). A start that fails or is
      cancelled deletes what it created and never an attached sandbox;
    - `snapshot`, `create_options` (extra `CreateSandboxFromSnapshotParams` fields, e.g.
      `{"auto_stop_interval": 30}`), `create_timeout_s`: how to create the sandbox;
    - `terminate_grace_s`: time between the polite signals and SIGKILL (default 1 s);
    - `teardown_timeout_s`: bound on each provider call made while tearing down, so a
      provider that stops answering cannot hang `pty_terminate` or `aclose` (default 30 s);
    - `daytona_class`: the client class, default the SDK's `AsyncDaytona`. Tests pass
      `sandbox.testing.daytona_fake.FakeDaytona(...).AsyncDaytona`;
    - plus the base session's options.
    """

    backend_name = "daytona"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_url: str | None = None,
        target: str | None = None,
        sandbox_id: str | None = None,
        keep: bool = False,
        snapshot: str | None = None,
        create_options: Mapping[str, Any] | None = None,
        create_timeout_s: float = 120.0,
        terminate_grace_s: float = 1.0,
        teardown_timeout_s: float = 30.0,
        daytona_class: Callable[..., Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        key = require_credential(
            api_key, API_KEY_ENV, backend="daytona", what="an API key (api_key)"
        )
        for name, value in (
            ("create_timeout_s", create_timeout_s),
            ("teardown_timeout_s", teardown_timeout_s),
        ):
            arguments.check_seconds(name, value)
        arguments.check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
        for name, text in (
            ("api_url", api_url),
            ("target", target),
            ("sandbox_id", sandbox_id),
            ("snapshot", snapshot),
        ):
            arguments.check_str(name, text)
        if create_options is not None and not isinstance(create_options, Mapping):
            raise InvalidArgumentError("create_options must be a mapping of option names")
        self._api_key = Secret(key)
        self._api_url = api_url
        self._target = target
        self._attach_id = sandbox_id
        self.keep = bool(keep)
        self._snapshot = snapshot
        self._create_options = dict(create_options or {})
        self.create_timeout_s = create_timeout_s
        self.terminate_grace_s = terminate_grace_s
        self.teardown_timeout_s = teardown_timeout_s
        self._daytona_class: Callable[..., Any] = daytona_class or AsyncDaytona
        self._client: Any = None
        self._sandbox: Any = None
        self._create_name: str | None = None
        self._created_id: str | None = None
        self._ready = False
        self._state_dir = "/tmp"
        self._workdir = "/"

    @property
    def sandbox_id(self) -> str | None:
        """The id of the sandbox (after start)."""
        return getattr(self._sandbox, "id", None)

    @property
    def workdir(self) -> str:
        """The sandbox's working directory: the default cwd and base of relative paths."""
        return self._workdir

    # ---- errors ----------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        return self._api_key.redact(text)

    def _error(self, exc: BaseException, action: str) -> ProviderError:
        typed = _typed_cause(exc)
        detail = self._scrub(getattr(exc, "message", None) or str(exc) or type(exc).__name__)
        message = f"daytona: {action} failed: {detail}"
        if isinstance(typed, DaytonaAuthenticationError):
            message += f" (check the API key, e.g. {API_KEY_ENV})"
        cls = ConnectionLostError if isinstance(typed, DaytonaConnectionError) else ProviderError
        return cls(message, retryable=is_retryable(exc))

    async def _call(self, action: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except DaytonaError as exc:
            raise self._error(exc, action) from None

    async def _bounded(self, call: Awaitable[T]) -> T:
        async with asyncio.timeout(self.teardown_timeout_s):
            return await call

    async def _bounded_retry(self, make_call: Callable[[], Awaitable[T]]) -> T:
        """A bounded teardown call, tried once more when the SDK says a retry may help
        (a kill that is not made leaves the process running)."""
        try:
            return await self._bounded(make_call())
        except DaytonaError as exc:
            if not is_retryable(exc):
                raise
            logger.debug("daytona: retrying a teardown call after: %s", self._describe(exc))
        return await self._bounded(make_call())

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Create the sandbox (or attach to one), then prepare it (see `_prepare`)."""
        config = DaytonaConfig(
            api_key=self._api_key.reveal(), api_url=self._api_url, target=self._target
        )
        try:
            self._client = self._daytona_class(config)
        except DaytonaError as exc:
            raise self._error(exc, "connecting to the API") from None
        if self._attach_id is not None:
            sandbox = await self._call(
                f"finding sandbox {self._attach_id!r}", self._client.get(self._attach_id)
            )
            self._sandbox = sandbox
            if getattr(sandbox, "state", SandboxState.STARTED) != SandboxState.STARTED:
                await self._call(
                    "starting the sandbox", sandbox.start(timeout=self.create_timeout_s)
                )
        else:
            self._create_name = f"sandbox-pty-{secrets.token_hex(6)}"
            params = CreateSandboxFromSnapshotParams(
                name=self._create_name,
                snapshot=self._snapshot,
                labels={"created-by": "agent-sandbox-pty"},
                **self._create_options,
            )
            try:
                self._sandbox = await self._client.create(params, timeout=self.create_timeout_s)
            except DaytonaError as exc:
                self._created_id = getattr(exc, "sandbox_id", None)
                if _refused(exc):  # nothing was created: nothing to look for
                    self._create_name = None
                raise self._error(exc, "creating the sandbox") from None
        await self._prepare()
        self._ready = True

    async def _prepare(self) -> None:
        """Learn the working directory; make the private directory for pid files."""
        script = (
            'd="${TMPDIR:-/tmp}/.sandbox-pty-$(id -u)"; mkdir -p "$d" && chmod 700 "$d" '
            '&& printf "%s\\n%s\\n" "$d" "$PWD"'
        )
        response = await self._call(
            "preparing the sandbox", self._sandbox.process.exec(f"sh -c {_q(script)}")
        )
        lines = (response.result or "").strip().splitlines()
        if response.exit_code != 0 or len(lines) < 2:
            raise ProviderError(
                "daytona: preparing the sandbox failed: "
                f"exit code {response.exit_code}: {self._scrub(response.result or '')[:300]}"
            )
        self._state_dir, self._workdir = lines[-2].strip(), lines[-1].strip()

    def _deletes_sandbox(self) -> bool:
        if not self._ready:  # a failed start: undo only what it created
            return self._attach_id is None
        return not self.keep

    async def _stop_backend(self) -> None:
        """Delete the sandbox unless it is kept (a half-created one is found by name and
        deleted), then close the client. Every call is bounded by `teardown_timeout_s`."""
        client, sandbox = self._client, self._sandbox
        delete = self._deletes_sandbox()
        errors: list[BaseException] = []
        try:
            if client is not None and sandbox is None and self._create_name is not None:
                # Creating failed or was cancelled: the sandbox may exist anyway.
                try:
                    sandbox = await self._bounded(self._find_created(client))
                except Exception as exc:
                    errors.append(exc)
            if sandbox is not None and delete:
                try:
                    await self._bounded(sandbox.delete())
                except DaytonaNotFoundError:
                    pass
                except Exception as exc:
                    errors.append(exc)
        finally:
            self._sandbox = None
            self._client = None
            self._create_name = None
            self._created_id = None
            self._ready = False
            if client is not None:
                try:
                    await self._bounded(client.close())
                except Exception as exc:
                    errors.append(exc)
        if errors:
            first = errors[0]
            if isinstance(first, DaytonaError):
                raise self._error(first, "deleting the sandbox")
            if isinstance(first, TimeoutError):
                raise ProviderError(
                    "daytona: deleting the sandbox did not finish within "
                    f"{self.teardown_timeout_s:g}s",
                    retryable=True,
                )
            raise first

    async def _find_created(self, client: Any) -> Any:
        for key in (self._created_id, self._create_name):
            if not key:
                continue
            try:
                return await client.get(key)
            except DaytonaNotFoundError:
                continue
        return None

    def _sandbox_going_away(self) -> bool:
        """True while closing a session whose sandbox will be deleted: killing its
        processes one by one first would only cost round trips."""
        return self.state is SessionState.CLOSING and self._deletes_sandbox()

    # ---- helpers ---------------------------------------------------------------------

    def _cwd(self, cwd: str | None) -> str:
        if not cwd:
            return self._workdir
        return posixpath.join(self._workdir, cwd)

    def _new_id(self, kind: str) -> str:
        return f"sandbox-pty-{kind}-{secrets.token_hex(6)}"

    def _pidfile(self, name: str) -> str:
        return posixpath.join(self._state_dir, f"{name}.pid")

    async def _signal_group(self, pidfile: str, *, wait_s: float, grace_s: float) -> bool:
        """Kill the group in `pidfile`; True if there was a pid to kill."""
        response = await self._sandbox.process.exec(
            kill_script(pidfile, wait_s=wait_s, grace_s=grace_s)
        )
        return "done" in (response.result or "")

    # ---- one-shot commands -----------------------------------------------------------

    async def _exec(
        self, spec: CommandSpec, timeout: float | None, capture: ExecCapture
    ) -> ExecResult:
        """Run a one-shot command in its own session, its logs streamed into the bounded
        capture; on timeout or cancellation its process tree is killed and the session
        deleted (the sandbox is untouched)."""
        session_id = self._new_id("exec")
        state = _PipeState(session_id=session_id, pidfile=self._pidfile(session_id))
        capture.check = CommandCheck.needed(spec, cwd=self._cwd(spec.cwd))
        try:
            async with asyncio.timeout(timeout):
                await self._start_pipe(state, spec, capture.check, announce=False)
                await self._read_logs(
                    state,
                    lambda text: capture.add_stdout(text.encode("utf-8")),
                    lambda text: capture.add_stderr(text.encode("utf-8")),
                )
                code = await self._exit_code(state)
        except TimeoutError:
            await settle(self._teardown_pipe(state))
            raise capture.timeout_error(spec.display, timeout) from None
        except BaseException as exc:
            await settle(self._teardown_pipe(state))
            if isinstance(exc, DaytonaError):
                raise self._error(exc, "running the command") from None
            raise
        state.finished = True
        try:
            await settle(self._teardown_pipe(state))
        except Exception as exc:  # the result is in hand; a leftover session is minor
            logger.warning(
                "daytona: deleting a finished command's session failed: %s", self._describe(exc)
            )
        return capture.result(code)

    async def _start_pipe(
        self, state: _PipeState, spec: CommandSpec, check: CommandCheck | None, *, announce: bool
    ) -> None:
        """Start the session command; behind `check` it starts in the working directory
        and the check enters `cwd`."""
        process = self._sandbox.process
        state.session_attempted = True
        await process.create_session(state.session_id)
        if check is None:
            shell_command, cwd = spec.shell_command, self._cwd(spec.cwd)
        else:
            shell_command, cwd = check.shell(spec.argv, announce=announce), self._workdir
        command = piped_command(shell_command, pidfile=state.pidfile, cwd=cwd, env=spec.env or {})
        state.execute_attempted = True
        response = await process.execute_session_command(
            state.session_id, SessionExecuteRequest(command=command, run_async=True)
        )
        state.cmd_id = response.cmd_id

    async def _read_logs(
        self, state: _PipeState, on_stdout: Callable[[str], None], on_stderr: Callable[[str], None]
    ) -> None:
        await self._sandbox.process.get_session_command_logs_async(
            state.session_id, state.cmd_id, on_stdout, on_stderr
        )

    async def _exit_code(self, state: _PipeState) -> int:
        """The command's exit code, once the daemon has it (shortly after its output
        ended): polled with a growing interval, bounded."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + EXIT_CODE_WAIT_S
        delay = 0.01
        while True:
            command = await self._sandbox.process.get_session_command(
                state.session_id, state.cmd_id
            )
            if command.exit_code is not None:
                return int(command.exit_code)
            if loop.time() >= deadline:
                raise ProviderError(
                    f"daytona: the command's output ended but no exit code came within "
                    f"{EXIT_CODE_WAIT_S:g}s",
                    retryable=True,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)

    async def _teardown_pipe(self, state: _PipeState) -> None:
        """Stop the reader, kill the command's group unless it finished (its wrapper
        then killed the group itself), delete the session. Every provider call is
        bounded; the first failure is raised after all steps ran."""
        errors: list[BaseException] = []
        pump = state.pump
        if pump is not None and not pump.done():
            pump.cancel()
        if pump is not None:
            await asyncio.wait([pump])
        local_only = self._sandbox_going_away()
        if state.execute_attempted and not state.finished and not local_only:
            try:
                await self._bounded_retry(
                    lambda: self._signal_group(
                        state.pidfile,
                        wait_s=PIDFILE_WAIT_S if state.cmd_id is None else PIDFILE_WAIT_S * 2,
                        grace_s=self.terminate_grace_s,
                    )
                )
            except Exception as exc:
                errors.append(exc)
        if state.session_attempted and not local_only:
            try:
                await self._bounded_retry(
                    lambda: self._sandbox.process.delete_session(state.session_id)
                )
            except DaytonaNotFoundError:
                pass
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise self._teardown_error(errors[0])

    def _teardown_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, DaytonaError):
            return self._error(exc, "stopping a process")
        if isinstance(exc, TimeoutError):
            return ProviderError(
                f"daytona: stopping a process did not finish within {self.teardown_timeout_s:g}s",
                retryable=True,
            )
        return exc

    # ---- processes -------------------------------------------------------------------

    async def _spawn_process(self, entry: PtyEntry) -> None:
        """A PTY session for `tty=True`, a session command for pipes."""
        if entry.tty:
            await self._spawn_pty(entry)
        else:
            await self._spawn_pipe(entry)

    async def _spawn_pipe(self, entry: PtyEntry) -> None:
        session_id = self._new_id(f"p{entry.process_id}")
        state = _PipeState(session_id=session_id, pidfile=self._pidfile(session_id))
        entry.handle = state
        command = entry.spec.command
        check = CommandCheck.needed(command, cwd=self._cwd(command.cwd))
        trap = None if check is None else ShellTrap(report_exit=False, token=check.token)
        try:
            await self._start_pipe(state, command, check, announce=True)
        except DaytonaError as exc:
            raise self._error(exc, "starting the process") from None
        state.pump = asyncio.create_task(self._pump_pipe(entry, state, trap))
        if check is not None and trap is not None:
            await wait_for_verdict(entry, trap, check)

    async def _pump_pipe(
        self, entry: PtyEntry, state: _PipeState, trap: ShellTrap | None = None
    ) -> None:
        """Stream the command's output into the entry, then report its exit. Stdout goes
        through `trap` when the command runs behind a check (it strips the markers)."""

        def feed(text: str) -> None:
            entry.feed(text.encode("utf-8"))

        def feed_stdout(text: str) -> None:
            assert trap is not None
            shown = trap.feed(text.encode("utf-8"))
            if shown:
                entry.feed(shown)

        try:
            await self._read_logs(state, feed if trap is None else feed_stdout, feed)
        except Exception as exc:  # the log stream died: did the command end?
            code = await self._exit_code_if_known(state)
            if code is None:
                entry.report_lost(f"the daytona log stream failed: {self._describe(exc)}")
                return
            entry.feed(
                b"\n[sandbox: output may be incomplete: the daytona log stream failed: "
                + self._describe(exc).encode()
                + b"]\n"
            )
        else:
            try:
                code = await self._exit_code(state)
            except Exception as exc:
                entry.report_lost(f"no exit code from daytona: {self._describe(exc)}")
                return
        state.finished = True
        entry.report_eof()
        entry.report_exit(code)

    async def _exit_code_if_known(self, state: _PipeState) -> int | None:
        try:
            command = await self._bounded(
                self._sandbox.process.get_session_command(state.session_id, state.cmd_id)
            )
        except Exception:
            return None
        return None if command.exit_code is None else int(command.exit_code)

    def _describe(self, exc: BaseException) -> str:
        text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return self._scrub(str(text))[:300]

    async def _spawn_pty(self, entry: PtyEntry) -> None:
        spec = entry.spec
        pty_id = self._new_id(f"t{entry.process_id}")
        check = CommandCheck.needed(spec.command, cwd=self._cwd(spec.command.cwd))
        state = _PtyState(
            pty_id=pty_id,
            pidfile=self._pidfile(pty_id),
            trap=ShellTrap(report_exit=False, token=None if check is None else check.token),
        )
        # Behind a check the shell starts in the working directory, the check enters
        # `cwd` and prints the trap's start marker (or a failure marker) itself.
        if check is None:
            shell_command, cwd = spec.command.shell_command, self._cwd(spec.command.cwd)
        else:
            shell_command, cwd = check.shell(spec.command.argv, announce=True), self._workdir
        entry.handle = state
        process = self._sandbox.process

        def on_data(data: bytes) -> None:
            shown = state.trap.feed(data)
            if shown:
                entry.feed(shown)

        envs = {"TERM": DEFAULT_TERM, **(spec.command.env or {})}
        inner = pty_inner_command(shell_command, pidfile=state.pidfile, cwd=cwd)
        announced = check is not None
        line = state.trap.line(inner, tty=True, announced=announced)
        try:
            if len(line.encode()) > MAX_TYPED_LINE:
                # Too long to type safely: the shell runs it from a file instead.
                state.script = posixpath.join(self._state_dir, f"{pty_id}.sh")
                inner = pty_inner_command(
                    shell_command, pidfile=state.pidfile, cwd=cwd, script=state.script
                )
                await self._sandbox.fs.upload_file(inner.encode(), state.script)
                line = state.trap.line(f". {_q(state.script)}", tty=True, announced=announced)
            state.connect_attempted = True
            state.handle = await process.create_pty_session(
                id=pty_id,
                on_data=on_data,
                envs=envs,
                pty_size=PtySize(rows=spec.rows, cols=spec.cols),
            )
            state.waiter = asyncio.create_task(self._wait_pty(entry, state))
            state.line_sent = True
            await state.handle.send_input(line)
        except DaytonaError as exc:
            raise self._error(exc, "starting the terminal") from None
        if check is not None:
            await wait_for_verdict(entry, state.trap, check)

    async def _wait_pty(self, entry: PtyEntry, state: _PtyState) -> None:
        """Wait for the PTY's end and report it (or the lost connection)."""
        try:
            result = await state.handle.wait()
        except Exception as exc:
            entry.report_lost(f"the daytona terminal failed: {self._describe(exc)}")
            return
        tail = state.trap.flush()
        if tail:
            entry.feed(tail)
        code = pty_exit_status(result.exit_code, result.error)
        if code is None:
            reason = self._scrub(result.error or "no exit status was reported")
            entry.report_lost(f"the daytona terminal connection ended: {reason[:300]}")
            return
        entry.report_eof()
        entry.report_exit(code)

    async def _write_stdin(self, entry: PtyEntry, data: bytes) -> None:
        """Send bytes to the PTY. A PTY whose process exited is no longer "connected" in
        the SDK (`AsyncPtyHandle.send_input` raises `DaytonaConnectionError("PTY is not
        connected")` once the daemon said "exited"), which is not a lost connection: the
        handle then has its exit code, and the write is a `ProcessExitedError`."""
        state: _PtyState = entry.handle
        try:
            await state.handle.send_input(data)
        except DaytonaError as exc:
            if entry.exited or getattr(state.handle, "exit_code", None) is not None:
                raise ProcessExitedError(
                    "the process has exited; poll it with empty chars to collect its "
                    "remaining output and exit code"
                ) from None
            raise self._error(exc, "writing to the terminal") from None

    async def _resize(self, entry: PtyEntry, rows: int, cols: int) -> None:
        """Resize through `process.resize_pty_session` (typed errors, unlike the handle's
        `resize`, which re-wraps them in a plain `DaytonaError`)."""
        state: _PtyState = entry.handle
        await self._call(
            "resizing the terminal",
            self._sandbox.process.resize_pty_session(state.pty_id, PtySize(rows=rows, cols=cols)),
        )

    async def _interrupt(self, entry: PtyEntry) -> None:
        """Ctrl-C on a terminal; SIGINT to the process group of a pipe process."""
        if entry.tty:
            await self._write_stdin(entry, b"\x03")
            return
        state: _PipeState = entry.handle
        await self._call(
            "interrupting the process",
            self._sandbox.process.exec(interrupt_script(state.pidfile, wait_s=PIDFILE_WAIT_S * 4)),
        )

    async def _terminate_pty_entry(self, entry: PtyEntry) -> None:
        """Tear one process down (see `_teardown_pty` and `_teardown_pipe`)."""
        state = entry.handle
        if state is None:
            return
        if isinstance(state, _PipeState):
            await self._teardown_pipe(state)
        else:
            await self._teardown_pty(entry, state)

    async def _teardown_pty(self, entry: PtyEntry, state: _PtyState) -> None:
        """Stop our waiter and the SDK's reader, kill the terminal's process group and
        session (even after the command exited: it may have left children), and kill
        the PTY session itself when that did not already end it."""
        errors: list[BaseException] = []
        waiter = state.waiter
        if waiter is not None and not waiter.done():
            waiter.cancel()
        if waiter is not None:
            await asyncio.wait([waiter])
        if state.handle is not None:
            try:
                await self._bounded(state.handle.disconnect())
            except Exception as exc:
                errors.append(exc)
        if self._sandbox_going_away():
            if errors:
                raise self._teardown_error(errors[0])
            return
        clean_exit = entry.exited and entry.lost_reason is None
        group_killed = False
        if state.line_sent:
            try:
                group_killed = await self._bounded_retry(
                    lambda: self._signal_group(
                        state.pidfile,
                        wait_s=0 if clean_exit else PIDFILE_WAIT_S,
                        grace_s=0 if clean_exit else self.terminate_grace_s,
                    )
                )
            except Exception as exc:
                errors.append(exc)
        if state.connect_attempted and not (group_killed or clean_exit):
            try:
                try:
                    await self._bounded_retry(
                        lambda: self._sandbox.process.kill_pty_session(state.pty_id)
                    )
                except DaytonaNotFoundError:
                    pass  # the shell is gone already
            except Exception as exc:
                errors.append(exc)
            else:
                if errors:
                    # The shell is dead, but children that ignore SIGHUP may have survived.
                    logger.warning(
                        "daytona: could not kill the process group of a terminal (%s); "
                        "killed its shell only",
                        self._describe(errors[0]),
                    )
                    errors.clear()
        if errors:
            raise self._teardown_error(errors[0])

    # ---- files -------------------------------------------------------------------------

    async def _stat(self, path: str) -> Entry | None:
        """`fs.get_file_info` (Go's os.Stat: symlinks followed) as an `Entry`."""
        try:
            info = await self._sandbox.fs.get_file_info(path)
        except DaytonaError as exc:
            typed = _typed_cause(exc)
            if isinstance(typed, DaytonaNotFoundError) or getattr(typed, "status_code", 0) == 404:
                return None
            raise self._error(exc, f"inspecting {path!r}") from None
        if info.is_dir:
            return Entry("dir")
        # Go's FileMode.String(): "-rw-r--r--" for a regular file, "prw-..." for a FIFO,
        # "Srw-..." for a socket, "Dcrw-..." for a device.
        mode = str(info.mode or "-")
        return Entry("file" if mode.startswith("-") else "other", size=info.size)

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        """Download a file (relative paths are in the working directory), after
        `fs.get_file_info` says it is a regular file within `max_bytes` (the daemon's
        download of a FIFO would wait forever; of a directory, it says "not found")."""
        size = await remote_files.regular_file(self._stat, path, write=False)
        if size is not None and size > max_bytes:
            raise FileTooLargeError.over(path, size, max_bytes)
        try:
            data = await self._sandbox.fs.download_file(path)
        except DaytonaError as exc:
            typed = _typed_cause(exc)
            if isinstance(typed, DaytonaNotFoundError) or getattr(typed, "status_code", 0) == 404:
                raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from None
            error = self._error(exc, f"reading {path!r}")
            if type(typed) is DaytonaError and getattr(typed, "status_code", None) is None:
                # No error details (a daemon that sends only text, or "No data received
                # for this file"): the SDK raises a plain `DaytonaError`
                # (`common.filesystem.create_file_download_error`). What is there now
                # decides: gone is not-found, a directory or FIFO is not-a-file.
                await remote_files.regular_file(self._stat, path, write=False)
            raise error from None
        return bytes(data or b"")

    async def _write_file(self, path: str, data: bytes) -> None:
        """Upload a file, creating its folder first (the SDK does not promise that an
        upload creates missing folders), after `fs.get_file_info` says nothing or a
        regular file is there."""
        await remote_files.regular_file(self._stat, path, write=True)
        parent = posixpath.dirname(path)
        if parent and parent != "/":
            script = f"mkdir -p -- {_q(posixpath.join(self._workdir, parent))}"
            response = await self._call(
                f"creating the folder of {path!r}", self._sandbox.process.exec(script)
            )
            if response.exit_code != 0:
                failure = ProviderError(
                    f"daytona: cannot create the folder of {path!r}: "
                    f"{self._scrub(response.result or '')[:300]}"
                )
                raise await remote_files.explain_write_failure(self._stat, path, failure)
        try:
            await self._call(f"writing {path!r}", self._sandbox.fs.upload_file(data, path))
        except ProviderError as failure:
            raise await remote_files.explain_write_failure(self._stat, path, failure) from None
