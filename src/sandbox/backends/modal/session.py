"""The `modal` backend: Modal sandboxes through the SDK's async (`.aio`) calls.

Every process is a `sandbox.exec.aio(...)` (`pty=True` for a terminal): the command
itself is the process, so its exit status comes straight from `process.wait.aio()` and
no shell trap is needed. Modal has no per-process kill, signal or resize call, so every
command carries a per-process token in its environment and is started through a tiny
`sh` wrapper; interrupting a pipe process and tearing any process down is a second exec
of a control script that signals every process carrying the token (the whole tree, also
children that left the process group) and the groups they lead. A terminal is
interrupted with `\\x03`; resizing raises `UnsupportedOperationError`.

With `pty=True` the SDK describes the terminal from the *client* process
(`modal._output.pty.get_pty_info`, called by `Sandbox.exec` through
`modal.sandbox._common.default_pty_info`): `TERM`, `COLORTERM` and `TERM_PROGRAM` from
`os.environ`, the window size from `sys.stdin`'s terminal. A server process has no TERM
and no terminal, so every terminal command gets `TERM` explicitly in its environment
(option `term`, default `xterm-256color`; a `TERM` in `env` or the command's own env
wins) and the wrapper applies the requested size with `stty`.

The wrapper and the control script also close the race with a start that is cancelled
while its exec is in flight: the teardown of a command whose exec never answered leaves
a marker file that the wrapper checks (and removes) before anything else, so a process
that starts after its teardown exits at once. Nothing is written for other commands.

Tests run this backend against `sandbox.testing.modal_fake.FakeModal` (option `sdk`),
a fake of the SDK surface used here, driven by real local processes and checked against
the installed SDK.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import posixpath
import secrets
import stat as stat_module
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import modal
from modal import exception as modal_exception
from modal.types import FileType

from ... import arguments, remote_files
from ...command_check import CommandCheck, wait_for_verdict
from ...errors import (
    ConnectionLostError,
    CredentialsMissingError,
    FileTooLargeError,
    InvalidArgumentError,
    NotAFileError,
    ProviderError,
    SandboxError,
    SandboxFileNotFoundError,
)
from ...exec_output import ExecCapture
from ...process_entry import CommandSpec, PtyEntry
from ...remote_files import Entry
from ...session import BaseSandboxSession, SessionState
from ...settle import settle
from ...shell_trap import ShellTrap
from ...types import ExecResult

logger = logging.getLogger("sandbox.modal")

T = TypeVar("T")

DEFAULT_APP_NAME = "agent-sandbox-pty"
DEFAULT_WORKDIR = "/root"
DEFAULT_SANDBOX_TIMEOUT_S = 3600
DEFAULT_TERM = "xterm-256color"
STATE_ROOT = "/tmp/.agent-sandbox-pty"
TOKEN_ENV = "AGENT_SANDBOX_PTY_TOKEN"
TOKEN_ID_ENV = "MODAL_TOKEN_ID"
TOKEN_SECRET_ENV = "MODAL_TOKEN_SECRET"
TOKEN_ENVS = (TOKEN_ID_ENV, TOKEN_SECRET_ENV)

# The exec's own (server-side) timeout has 1 s granularity: it is only a backstop, set a
# little after the client-side deadline, which is what really ends a one-shot command.
SERVER_TIMEOUT_MARGIN_S = 2
SERVER_TIMEOUT_CODE = -1  # what `ContainerProcess.wait()` returns when that backstop fired
# Output and exit status travel on different RPC streams: after one of them ends, how long
# to wait for the other before giving up on it.
EXIT_OUTPUT_GRACE_S = 1.0
EXIT_STATUS_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 30.0  # a control exec (signal, kill) beyond the terminate grace
STOP_TIMEOUT_S = 60.0  # each call made while stopping the sandbox
WRITE_CHUNK = 1024 * 1024
CONTROL_POLL_S = 0.05

# Runs every command: `sh -c WRAPPER sandbox-pty DIR TOKEN MODE ROWS COLS ARGV...`.
# Exits at once if a teardown already ran for it (and consumes that marker), applies the
# terminal size, makes a pipe process the leader of its own process group (so that
# SIGINT and SIGKILL reach its whole group), then becomes the command. It writes nothing
# for a command that starts normally.
WRAPPER = r"""d=$1 t=$2 m=$3 r=$4 c=$5
shift 5
if [ -e "$d/$t.kill" ]; then rm -f "$d/$t.kill"; exit 143; fi
if [ "$m" = tty ]; then
  stty rows "$r" cols "$c" 2>/dev/null
elif [ -r /proc/$$/stat ] && command -v setsid >/dev/null 2>&1; then
  read -r s </proc/$$/stat
  s=${s##*) }; s=${s#* }; s=${s#* }; s=${s%% *}
  [ "$s" = $$ ] || exec setsid "$@"
fi
exec "$@"
"""

# `sh -c CONTROL sandbox-pty-control DIR TOKEN MODE TICKS MARK`. The process tree is
# every live process whose environment holds the token (also children that left the
# process group); the groups it leads are signalled too. MODE `int` sends SIGINT to
# those groups (to the processes when they lead none), `kill` sends SIGKILL, `term`
# sends SIGHUP/TERM/CONT, polls up to TICKS times for the tree to go, then SIGKILL.
# MARK=1 (the exec that started the command never answered, so it may start later)
# first leaves the marker the wrapper checks.
CONTROL = r"""d=$1 t=$2 mode=$3 ticks=$4 mark=$5
k="AGENT_SANDBOX_PTY_TOKEN=$t"
if [ "$mark" = 1 ]; then
  [ -d "$d" ] || mkdir -p "$d" 2>/dev/null
  : 2>/dev/null >"$d/$t.kill"
fi
if printf 'x\000' | grep -qzx x 2>/dev/null; then
  ours() {
    grep -lzx "$k" /proc/[0-9]*/environ 2>/dev/null | sed -n 's,^/proc/\([0-9]*\)/environ$,\1,p'
  }
else
  ours() {
    for f in /proc/[0-9]*/environ; do
      tr '\000' '\n' <"$f" 2>/dev/null | grep -qx "$k" && { f=${f#/proc/}; echo "${f%/environ}"; }
    done
  }
fi
leaders() {
  for x in $1; do
    read -r s 2>/dev/null </proc/$x/stat || continue
    s=${s##*) }; s=${s#* }; s=${s#* }; s=${s%% *}
    [ "$s" = "$x" ] && echo "$x"
  done
}
hit() {
  p=$(ours)
  [ -n "$p" ] || return 1
  for g in $(leaders "$p"); do kill -s "$1" -- "-$g" 2>/dev/null; done
  kill -s "$1" $p 2>/dev/null
  return 0
}
case $mode in
  int)
    p=$(ours); g=$(leaders "$p")
    if [ -n "$g" ]; then
      for x in $g; do kill -s INT -- "-$x" 2>/dev/null; done
    elif [ -n "$p" ]; then
      kill -s INT $p 2>/dev/null
    fi ;;
  kill) hit KILL ;;
  term)
    if hit HUP; then
      hit TERM; hit CONT
      i=0
      while [ $i -lt "$ticks" ] && [ -n "$(ours)" ]; do sleep 0.05; i=$((i+1)); done
    fi
    hit KILL ;;
esac
exit 0
"""

# Typed SDK exceptions that say a retry may succeed (rate limits, timeouts, an unavailable
# service, dropped connections), and those among them that do not (the sandbox's own
# lifetime ran out: retrying on it cannot help).
_RETRYABLE: tuple[type[BaseException], ...] = (
    modal_exception.ResourceExhaustedError,
    modal_exception.TimeoutError,
    modal_exception.ServiceError,
    modal_exception.InternalFailure,
    TimeoutError,
    OSError,
)
_NOT_RETRYABLE: tuple[type[BaseException], ...] = (modal_exception.SandboxTimeoutError,)
_CONNECTION: tuple[type[BaseException], ...] = (modal_exception.ConnectionError, ConnectionError)
# What the SDK raises for a failed call (its own errors, transport errors, and the
# ValueError/BufferError of a closed or overfull stdin writer). Anything else (a
# TypeError for a wrong option, say) is a bug and propagates unchanged.
_SDK_ERRORS: tuple[type[BaseException], ...] = (
    modal_exception.Error,
    OSError,
    TimeoutError,
    ValueError,
    BufferError,
)
try:  # the transport's errors; grpclib comes with modal
    from grpclib.exceptions import GRPCError, StreamTerminatedError

    _CONNECTION += (StreamTerminatedError,)
    _SDK_ERRORS += (GRPCError, StreamTerminatedError)
except ImportError:  # pragma: no cover - depends on modal's transport
    pass
# Raised by calls on a sandbox that already finished: there is nothing left to signal.
_SANDBOX_GONE: tuple[type[BaseException], ...] = (
    modal_exception.ConflictError,
    modal_exception.NotFoundError,
)


@dataclass(eq=False)
class _Process:
    """The backend's handle on one process (`PtyEntry.handle`)."""

    token: str
    tty: bool
    process: Any = None
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    watcher: asyncio.Task[None] | None = None
    exited: bool = False
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ModalSession(BaseSandboxSession):
    """Runs commands in a Modal sandbox.

    Options:

    - `app_name`: the Modal app the sandbox belongs to (looked up, created if missing);
    - `image`: a `modal.Image`, or a registry tag such as `"python:3.12-slim"`; default
      Modal's stock image (Debian slim with Python);
    - `sandbox_id`: attach to this existing sandbox instead of creating one;
    - `keep`: do not terminate the sandbox on close (created or attached: by default
      both are terminated); `sandbox_id` then lets a later session attach to it;
    - `token_id`, `token_secret`: the Modal token (default `MODAL_TOKEN_ID` and
      `MODAL_TOKEN_SECRET`), or `client`: a ready `modal.Client` (not closed by us);
    - `workdir`: the sandbox's working directory, where relative paths and `cwd` point
      (default `/root`); `env`: variables added to every command;
    - `sandbox_timeout_s`: the sandbox's maximum lifetime (default 1 h), a backstop
      should a session never be closed; `create_options`: more `Sandbox.create` options
      (`cpu`, `memory`, `secrets`, ...);
    - `terminate_grace_s`: time between the polite signals and SIGKILL (default 1 s);
    - `term`: the `TERM` of terminal commands (default `xterm-256color`; the SDK would
      otherwise copy the client process's own `TERM`, or none);
    - `state_dir`: where, in the sandbox, a start cancelled mid-flight leaves its marker
      (default `/tmp/.agent-sandbox-pty`; with the fake, that is this machine);
    - `sdk`: the object providing `Sandbox`, `App`, `Client` and `Image` (default the
      `modal` module; tests pass a `sandbox.testing.modal_fake.FakeModal`);

    plus the base session's options.

    Every command runs through a small `sh` wrapper (see the module docstring) and sees
    one extra variable, `AGENT_SANDBOX_PTY_TOKEN`, which identifies its process tree for
    teardown. A one-shot
    `exec` that leaves a daemon with its output redirected leaves it running (like
    `docker exec`); one still holding the output pipes is killed after a short grace.
    """

    backend_name = "modal"

    def __init__(
        self,
        *,
        app_name: str = DEFAULT_APP_NAME,
        image: Any = None,
        sandbox_id: str | None = None,
        keep: bool = False,
        token_id: str | None = None,
        token_secret: str | None = None,
        client: Any = None,
        workdir: str = DEFAULT_WORKDIR,
        env: Mapping[str, str] | None = None,
        sandbox_timeout_s: int = DEFAULT_SANDBOX_TIMEOUT_S,
        create_options: Mapping[str, Any] | None = None,
        terminate_grace_s: float = 1.0,
        state_dir: str = STATE_ROOT,
        term: str = DEFAULT_TERM,
        sdk: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if not isinstance(workdir, str) or not workdir.startswith("/"):
            raise InvalidArgumentError(f"workdir must be an absolute path, not {workdir!r}")
        # Every option is checked now, not when first used (a bad grace period would
        # otherwise surface as a raw TypeError in a teardown).
        arguments.check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
        if (
            isinstance(sandbox_timeout_s, bool)
            or not isinstance(sandbox_timeout_s, int)
            or sandbox_timeout_s <= 0
        ):
            raise InvalidArgumentError(
                f"sandbox_timeout_s must be a positive int (seconds), not {sandbox_timeout_s!r}"
            )
        for name, text in (
            ("app_name", app_name),
            ("sandbox_id", sandbox_id),
            ("token_id", token_id),
            ("token_secret", token_secret),
            ("state_dir", state_dir),
            ("term", term),
        ):
            arguments.check_str(name, text)
        if not term or "\0" in term:
            raise InvalidArgumentError("term must be a non-empty terminal type, such as 'xterm'")
        env = arguments.check_env(env)
        if create_options is not None and not isinstance(create_options, Mapping):
            raise InvalidArgumentError("create_options must be a mapping of option names")
        self.app_name = app_name
        self.keep = keep
        self.workdir = workdir
        self.sandbox_timeout_s = sandbox_timeout_s
        self.terminate_grace_s = terminate_grace_s
        self.exit_output_grace_s = EXIT_OUTPUT_GRACE_S
        self.exit_status_timeout_s = EXIT_STATUS_TIMEOUT_S
        self._image = image
        self._sandbox_id_option = sandbox_id
        self._token_id = token_id
        self._token_secret = token_secret
        self._client_option = client
        self._env = dict(env or {})
        self._term = term
        self._create_options = dict(create_options or {})
        self._sdk: Any = sdk if sdk is not None else modal
        self._client: Any = None
        self._owns_client = False
        self._sandbox: Any = None
        self._create_name: str | None = None
        self._state_dir = f"{state_dir}/{secrets.token_hex(8)}"
        self._marked = False  # whether a marker may have been left in `_state_dir`

    @property
    def sandbox_id(self) -> str | None:
        """The Modal sandbox id (once started), for attaching to it again later."""
        return self._sandbox.object_id if self._sandbox is not None else None

    # ---- errors ------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        candidates = (self._token_secret, self._token_id, *map(os.environ.get, TOKEN_ENVS))
        for secret in candidates:
            if secret and len(secret) >= 4:
                text = text.replace(secret, "***")
        return text

    def _describe(self, exc: BaseException) -> str:
        detail = self._redact(str(exc)).strip()
        if len(detail) > 300:
            detail = detail[:300] + "..."
        return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__

    def _map_error(self, what: str, exc: BaseException) -> SandboxError:
        """Our error for an SDK exception: its kind decides `retryable`."""
        if isinstance(exc, SandboxError):
            return exc
        message = f"modal: could not {what}: {self._describe(exc)}"
        if isinstance(exc, modal_exception.SandboxFilesystemNotFoundError):
            return SandboxFileNotFoundError(message)
        if isinstance(exc, _CONNECTION):
            return ConnectionLostError(message)
        retryable = isinstance(exc, _RETRYABLE) and not isinstance(exc, _NOT_RETRYABLE)
        return ProviderError(message, retryable=retryable)

    async def _call(
        self, what: str, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any
    ) -> T:
        """Await one SDK call, mapping its exceptions (never the caller's cancellation)."""
        try:
            return await call(*args, **kwargs)
        except _SDK_ERRORS as exc:
            raise self._map_error(what, exc) from None

    # ---- lifecycle -----------------------------------------------------------------

    def _credentials(self) -> tuple[str, str]:
        token_id = self._token_id or os.environ.get(TOKEN_ID_ENV)
        token_secret = self._token_secret or os.environ.get(TOKEN_SECRET_ENV)
        missing = [
            name
            for name, value in ((TOKEN_ID_ENV, token_id), (TOKEN_SECRET_ENV, token_secret))
            if not value
        ]
        if missing or token_id is None or token_secret is None:
            raise CredentialsMissingError(
                f"the modal backend needs a Modal token: set {' and '.join(missing)} "
                "(or pass token_id= and token_secret=, or client=)"
            )
        return token_id, token_secret

    async def _start_backend(self) -> None:
        """Connect with the token (or the given client), then attach to `sandbox_id` or
        look up the app and create a sandbox with a unique name."""
        if self._client_option is not None:
            self._client = self._client_option
        else:
            token_id, token_secret = self._credentials()
            self._owns_client = True
            self._client = await self._call(
                "connect to Modal", self._sdk.Client.from_credentials.aio, token_id, token_secret
            )
        if self._sandbox_id_option is not None:
            self._sandbox = await self._call(
                "attach to the sandbox",
                self._sdk.Sandbox.from_id.aio,
                self._sandbox_id_option,
                client=self._client,
            )
            return
        app = await self._call(
            "look up the app",
            self._sdk.App.lookup.aio,
            self.app_name,
            create_if_missing=True,
            client=self._client,
        )
        image = self._image
        if isinstance(image, str):
            image = self._sdk.Image.from_registry(image)
        # A unique name lets a start that fails or is cancelled while the create call is
        # in flight find, and terminate, a sandbox the provider created anyway.
        self._create_name = f"sandbox-pty-{secrets.token_hex(8)}"
        self._sandbox = await self._call(
            "create the sandbox",
            self._sdk.Sandbox.create.aio,
            app=app,
            name=self._create_name,
            image=image,
            timeout=self.sandbox_timeout_s,
            workdir=self.workdir,
            client=self._client,
            **self._create_options,
        )

    async def _stop_backend(self) -> None:
        """Terminate the sandbox unless kept (also one a failed or cancelled create left
        behind, found by its name), detach, and close the client we opened."""
        sandbox = self._sandbox
        try:
            if not self.keep:
                if sandbox is None and self._create_name is not None:
                    sandbox = await self._find_created_sandbox()
                if sandbox is not None:
                    await self._terminate_sandbox(sandbox)
            elif sandbox is not None and self._marked:
                await self._remove_state_dir(sandbox)
            if sandbox is not None:
                await self._detach(sandbox)
        finally:
            self._sandbox = None
            self._create_name = None
            client, self._client = self._client, None
            if self._owns_client and client is not None:
                self._owns_client = False
                try:
                    async with asyncio.timeout(STOP_TIMEOUT_S):
                        await client.close.aio()
                except Exception as exc:
                    logger.debug("closing the Modal client failed: %s", self._describe(exc))

    async def _find_created_sandbox(self) -> Any:
        """The sandbox a failed or cancelled create may have left, or None."""
        assert self._create_name is not None
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                return await self._sdk.Sandbox.from_name.aio(
                    self.app_name, self._create_name, client=self._client
                )
        except modal_exception.NotFoundError:
            return None
        except _SDK_ERRORS as exc:
            raise self._map_error("find the sandbox of a failed start", exc) from None

    async def _terminate_sandbox(self, sandbox: Any) -> None:
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await sandbox.terminate.aio()
        except _SANDBOX_GONE:
            return
        except _SDK_ERRORS as exc:
            raise self._map_error("terminate the sandbox", exc) from None

    async def _detach(self, sandbox: Any) -> None:
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await sandbox.detach.aio()
        except Exception as exc:  # the sandbox is terminated or kept either way
            logger.debug("detaching from the Modal sandbox failed: %s", self._describe(exc))

    async def _remove_state_dir(self, sandbox: Any) -> None:
        """A kept sandbox keeps running: remove the markers we left in it."""
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                process = await sandbox.exec.aio("rm", "-rf", self._state_dir, text=False)
                await process.wait.aio()
        except Exception as exc:
            logger.debug("removing the state directory failed: %s", self._describe(exc))

    def _require_sandbox(self) -> Any:
        if self._sandbox is None:
            raise SandboxError("the modal sandbox is not available")
        return self._sandbox

    # ---- starting, signalling and stopping commands ---------------------------------

    def _cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.workdir
        return cwd if cwd.startswith("/") else posixpath.join(self.workdir, cwd)

    async def _start_command(
        self,
        spec: CommandSpec,
        handle: _Process,
        *,
        rows: int = 24,
        cols: int = 80,
        server_timeout: int | None = None,
        check: CommandCheck | None = None,
        announce: bool = False,
    ) -> Any:
        """Exec `spec` through the wrapper (`handle.process` is set as soon as the exec
        answers); a pipe process then gets its stdin closed. Behind a `check` the exec
        starts in `workdir` and the check enters `cwd`."""
        sandbox = self._require_sandbox()
        tty = handle.tty
        command = spec.argv if check is None else check.argv(spec.argv, announce=announce)
        argv = (
            "sh", "-c", WRAPPER, "sandbox-pty", self._state_dir, handle.token,
            "tty" if tty else "pipes", str(rows), str(cols), *command,
        )  # fmt: skip
        # The SDK sends the client's own TERM (or none) with a terminal: ours is explicit.
        term = {"TERM": self._term} if tty else {}
        env = {**term, **self._env, **(spec.env or {}), TOKEN_ENV: handle.token}
        handle.process = process = await self._call(
            "start a command",
            sandbox.exec.aio,
            *argv,
            pty=tty,
            text=False,
            timeout=server_timeout,
            workdir=self._cwd(spec.cwd) if check is None else self.workdir,
            env=env,
        )
        if not tty:
            process.stdin.write_eof()
            await self._call("close the command's stdin", process.stdin.drain.aio)
        return process

    async def _control(self, token: str, mode: str, *, mark: bool = False) -> None:
        """Signal a command's tree with a second exec of the control script (`mark`: its
        own exec never answered, so make it exit should it start later)."""
        sandbox = self._sandbox
        if sandbox is None:
            return
        ticks = max(0, round(self.terminate_grace_s / CONTROL_POLL_S)) if mode == "term" else 0
        self._marked = self._marked or mark
        argv = (
            "sh",
            "-c",
            CONTROL,
            "sandbox-pty-control",
            self._state_dir,
            token,
            mode,
            str(ticks),
            "1" if mark else "0",
        )
        what = "interrupt the process" if mode == "int" else "kill the process"
        try:
            async with asyncio.timeout(self.terminate_grace_s + CONTROL_TIMEOUT_S):
                process = await sandbox.exec.aio(*argv, text=False)
                await process.wait.aio()
        except _SANDBOX_GONE:
            return  # the sandbox finished: its processes are gone with it
        except TimeoutError:
            raise ProviderError(
                f"modal: could not {what}: the control command timed out", retryable=True
            ) from None
        except _SDK_ERRORS as exc:
            raise self._map_error(what, exc) from None

    async def _finish_command(
        self, handle: _Process, tasks: list[asyncio.Task[Any]], *, kill: bool
    ) -> None:
        """Kill a command's tree (if asked), then stop and await its tasks."""
        try:
            if kill:
                await self._control(handle.token, "kill", mark=handle.process is None)
        finally:
            await _cancel_and_wait(tasks)

    # ---- one-shot commands -------------------------------------------------------------

    async def _exec(
        self, spec: CommandSpec, timeout: float | None, capture: ExecCapture
    ) -> ExecResult:
        """One exec through the wrapper, stdin closed, both streams read chunk by chunk
        into the bounded capture. The timeout is enforced here (the server-side one is
        only a backstop); on expiry or cancellation the command's tree is killed by
        token, never the sandbox."""
        handle = _Process(token=secrets.token_hex(12), tty=False)
        server_timeout = None if timeout is None else math.ceil(timeout) + SERVER_TIMEOUT_MARGIN_S
        check = capture.check = CommandCheck.needed(spec, cwd=self._cwd(spec.cwd))
        readers: list[asyncio.Task[None]] = []
        finished = False
        try:
            timed_out = False
            code = 0
            try:
                async with asyncio.timeout(timeout):
                    process = await self._start_command(
                        spec, handle, server_timeout=server_timeout, check=check
                    )
                    readers = [
                        asyncio.create_task(
                            self._collect_stream(process.stdout, capture.add_stdout)
                        ),
                        asyncio.create_task(
                            self._collect_stream(process.stderr, capture.add_stderr)
                        ),
                    ]
                    code = await self._call("wait for the command", process.wait.aio)
            except TimeoutError:
                timed_out = True  # SDK timeouts are mapped by `_call`: this is ours
            if timed_out or (server_timeout is not None and code == SERVER_TIMEOUT_CODE):
                finished = True
                await settle(self._finish_command(handle, readers, kill=True))
                raise capture.timeout_error(spec.display, timeout)
            if code == SERVER_TIMEOUT_CODE:
                raise ProviderError("modal: the command ended without an exit status")
            # The exit status may overtake the last output: wait a little for the streams.
            # If something in the background still holds them open, its tree is killed.
            _, pending = await asyncio.wait(readers, timeout=self.exit_output_grace_s)
            finished = True
            await settle(self._finish_command(handle, readers, kill=bool(pending)))
            for reader in readers:
                error = None if reader.cancelled() else reader.exception()
                if error is not None:
                    raise error
        except BaseException:
            if not finished:
                await settle(self._finish_command(handle, readers, kill=True))
            raise
        return capture.result(_exit_code(code))

    async def _collect_stream(self, stream: Any, sink: Callable[[bytes], None]) -> None:
        """Collect a one-shot's output stream, mapping the SDK's errors."""
        try:
            await _read_stream(stream, sink)
        except _SDK_ERRORS as exc:
            raise self._map_error("read the command's output", exc) from None

    # ---- processes -------------------------------------------------------------------

    async def _spawn_process(self, entry: PtyEntry) -> None:
        """Exec the command (`pty=True` for a terminal), then one reader task per
        stream and a watcher task for the exit."""
        spec = entry.spec
        handle = _Process(token=secrets.token_hex(12), tty=spec.tty)
        entry.handle = handle  # from here on, teardown can find (and kill) it by token
        check = CommandCheck.needed(spec.command, cwd=self._cwd(spec.command.cwd))
        trap = None if check is None else ShellTrap(report_exit=False, token=check.token)
        process = await self._start_command(
            spec.command, handle, rows=spec.rows, cols=spec.cols, check=check, announce=True
        )
        streams = [process.stdout]
        if not spec.tty:  # with a terminal, stderr is merged into stdout
            streams.append(process.stderr)
        handle.readers = [
            # The check's markers come on stdout only: that is the stream the trap filters.
            asyncio.create_task(self._pump(entry, s, trap if s is process.stdout else None))
            for s in streams
        ]
        handle.watcher = asyncio.create_task(self._watch(entry, handle))
        if check is not None and trap is not None:
            await wait_for_verdict(entry, trap, check)

    async def _pump(self, entry: PtyEntry, stream: Any, trap: ShellTrap | None = None) -> None:
        """Feed one output stream into the entry (through `trap` behind a check); a
        stream that fails loses the process."""

        def feed(data: bytes) -> None:
            shown = data if trap is None else trap.feed(data)
            if shown:
                entry.feed(shown)

        try:
            await _read_stream(stream, feed)
        except Exception as exc:
            entry.report_lost(f"reading its output from Modal failed ({self._describe(exc)})")

    async def _watch(self, entry: PtyEntry, handle: _Process) -> None:
        """Report the exit once it is known and the output has ended (or a grace passed):
        reporting the exit first could end a window before the last output arrived."""
        waiter = asyncio.ensure_future(self._call("wait for the process", handle.process.wait.aio))
        readers: set[asyncio.Task[Any]] = set(handle.readers)
        try:
            while readers and not waiter.done():
                done, _ = await asyncio.wait(
                    {waiter, *readers}, return_when=asyncio.FIRST_COMPLETED
                )
                readers -= done
            if waiter.done():
                if readers:
                    await asyncio.wait(readers, timeout=self.exit_output_grace_s)
                if all(reader.done() for reader in handle.readers):
                    entry.report_eof()
                self._report_exit(entry, handle, waiter)
                return
            entry.report_eof()
            await asyncio.wait({waiter}, timeout=self.exit_status_timeout_s)
            if waiter.done():
                self._report_exit(entry, handle, waiter)
            else:
                entry.report_lost(
                    f"Modal did not report its exit status within "
                    f"{self.exit_status_timeout_s:g}s of its output ending"
                )
        finally:
            await _cancel_and_wait([waiter])

    def _report_exit(self, entry: PtyEntry, handle: _Process, waiter: asyncio.Future[int]) -> None:
        exc = asyncio.CancelledError() if waiter.cancelled() else waiter.exception()
        if exc is not None:
            entry.report_lost(f"waiting for its exit failed ({self._describe(exc)})")
            return
        handle.exited = True
        code = waiter.result()
        if code == SERVER_TIMEOUT_CODE:
            entry.report_lost("Modal reported no exit status")
        else:
            entry.report_exit(_exit_code(code))

    async def _write_stdin(self, entry: PtyEntry, data: bytes) -> None:
        """Write to the terminal through the SDK's stdin writer, in bounded chunks."""
        handle: _Process = entry.handle
        # One writer at a time: the SDK's writer keeps one buffer and one stream offset,
        # and an interrupt (`\x03`) may arrive while a write is draining.
        async with handle.write_lock:
            for start in range(0, len(data), WRITE_CHUNK):
                chunk = data[start : start + WRITE_CHUNK]
                await self._call("write to the process", _send, handle.process, chunk)

    async def _interrupt(self, entry: PtyEntry) -> None:
        """`\\x03` on a terminal; SIGINT to a pipe process's group by a control exec."""
        if entry.tty:
            await self._write_stdin(entry, b"\x03")
            return
        handle: _Process = entry.handle
        await self._control(handle.token, "int")

    async def _terminate_pty_entry(self, entry: PtyEntry) -> None:
        """Kill the process tree by token (polite signals, grace, SIGKILL), then stop
        and await the reader and watcher tasks, whatever happened before."""
        handle: _Process | None = entry.handle
        if handle is None:
            return
        tasks: list[asyncio.Task[Any]] = list(handle.readers)
        if handle.watcher is not None:
            tasks.append(handle.watcher)
        try:
            if self.state is SessionState.CLOSING and not self.keep and self._sandbox is not None:
                # Terminating the sandbox next ends every process: one call, not one per
                # process (stopping our tasks is all that is left to do here).
                return
            # Also after the leader's exit: its background children may still be there.
            mode = "kill" if handle.exited else "term"
            await self._control(handle.token, mode, mark=handle.process is None)
        finally:
            await _cancel_and_wait(tasks)

    # ---- files -------------------------------------------------------------------------

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.workdir, path)

    async def _stat(self, path: str) -> Entry | None:
        """`Sandbox.filesystem.stat` (the entry itself, not a symlink's target) as an
        `Entry`; a FILE whose mode carries file-type bits must be a regular one."""
        sandbox = self._require_sandbox()
        try:
            info = await sandbox.filesystem.stat.aio(path)
        except modal_exception.SandboxFilesystemNotFoundError:
            return None
        except ValueError:
            return Entry("other")  # a type the SDK has no name for: not a regular file
        except _SDK_ERRORS as exc:
            raise self._map_error(f"inspect {path!r}", exc) from None
        if info.type is FileType.DIRECTORY:
            return Entry("dir")
        if info.type is FileType.SYMLINK:
            return Entry("symlink", target=info.symlink_target)
        mode = int(info.mode or 0)
        regular = mode <= 0o7777 or stat_module.S_ISREG(mode)
        return Entry("file" if regular else "other", size=info.size)

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        """`Sandbox.filesystem.read_bytes` (relative paths are in `workdir`), after
        `filesystem.stat` says it is a regular file within `max_bytes`."""
        sandbox = self._require_sandbox()
        full = self._path(path)
        size = await remote_files.regular_file(self._stat, full, write=False, shown=path)
        if size is not None and size > max_bytes:
            raise FileTooLargeError.over(path, size, max_bytes)
        try:
            data: bytes = await sandbox.filesystem.read_bytes.aio(full)
        except modal_exception.SandboxFilesystemNotFoundError:
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from None
        except modal_exception.SandboxFilesystemIsADirectoryError:
            raise NotAFileError(f"{path!r} is a directory, not a regular file") from None
        except _SDK_ERRORS as exc:
            raise self._map_error(f"read {path!r}", exc) from None
        return bytes(data)

    async def _write_file(self, path: str, data: bytes) -> None:
        """`Sandbox.filesystem.write_bytes`, which creates parent directories, after
        `filesystem.stat` says nothing or a regular file is there."""
        sandbox = self._require_sandbox()
        full = self._path(path)
        await remote_files.regular_file(self._stat, full, write=True, shown=path)
        try:
            await sandbox.filesystem.write_bytes.aio(data, full)
        except modal_exception.SandboxFilesystemIsADirectoryError:
            raise NotAFileError(f"{path!r} is a directory, not a regular file") from None
        except modal_exception.SandboxFilesystemNotADirectoryError:
            raise remote_files.under_a_file(path) from None
        except _SDK_ERRORS as exc:
            raise self._map_error(f"write {path!r}", exc) from None


# ---- helpers ---------------------------------------------------------------------------


def _exit_code(code: int) -> int:
    """The contract's exit code: the SDK reports 128+N for signal N already; a negative
    value (-N, as subprocess reports a signal) is normalised the same way."""
    return 128 - code if code < 0 else code


async def _send(process: Any, chunk: bytes) -> None:
    process.stdin.write(chunk)
    await process.stdin.drain.aio()


async def _read_stream(stream: Any, sink: Callable[[bytes], object]) -> None:
    """Iterate an SDK output stream to its end, closing the iterator however it ends."""
    iterator = stream.__aiter__()
    try:
        async for chunk in iterator:
            sink(chunk.encode() if isinstance(chunk, str) else bytes(chunk))
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception as exc:  # closing a broken stream: the first error is what counts
                logger.debug("closing a Modal output stream failed: %s", type(exc).__name__)


async def _cancel_and_wait(tasks: list[asyncio.Task[Any]] | list[asyncio.Future[Any]]) -> None:
    """Cancel the tasks and wait until every one has finished (results are consumed)."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():  # our own cancellation, not the task's
                raise
        except Exception as exc:
            logger.debug("a Modal background task failed: %s", type(exc).__name__)
