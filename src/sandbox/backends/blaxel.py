"""The `blaxel` backend: a Blaxel sandbox, driven by the Blaxel SDK and its terminal.

- The sandbox is created, or attached to, by name through the SDK
  (`SandboxInstance.create_if_not_exists`) and deleted on close unless `keep=True`.
- One-shot `exec` uses the SDK's process API (`process.exec` with
  `wait_for_completion`); files use `fs.read_binary` / `fs.write_binary` / `fs.mkdir`.
  The edge in front of the sandbox cuts a request silent for about 60 s with a 504
  while the command keeps running: the session then follows the process (`process.wait`)
  until it ends or our deadline passes, and kills it at the deadline. The server's own
  timeout (whole seconds) answers 422 "process timed out" and does not kill: that is
  our timeout too, and we kill. The server reports a death by signal as -1 (Go's
  `ExitCode()`), so the command runs under a small `sh` wrapper that exits with 128+N
  (its own "Killed" notice goes to /dev/null).
- PTYs use the sandbox's terminal WebSocket (`/terminal/ws`) with aiohttp. The terminal
  runs an interactive shell and never reports an exit, so the command is typed into it
  wrapped by `ShellTrap` (isolated report mode): its exit status comes back in-band and
  everything the wrapper adds is stripped. The wrapper also prints the shell's pid
  before the start marker; terminating a running process kills that terminal session
  with a one-shot command, because closing the socket does not stop it (the server keeps
  a session without clients for ten minutes).
- The terminal socket does not close when the shell exits: the server notices only
  between client messages. So while a command runs and the terminal is silent, an empty
  `input` frame is sent every `probe_interval_s`; a shell that died without the end
  marker then gets its socket closed, and the process is reported lost.
- Output: the server reads the PTY 4096 bytes at a time and sends each read through
  `string(buf[:n])` and Go's JSON encoder, so a UTF-8 character split between reads
  arrives as one U+FFFD per byte. That is not recoverable here; the U+FFFDs are passed
  through as they are (never more of them).
- `tty=False` runs the command on real pipes inside that terminal (stdin /dev/null,
  stdout and stderr merged); Ctrl-C still reaches it through the terminal's line
  discipline, which keeps signal generation on.

The Blaxel API key travels in the terminal URL (`?token=`): that URL is never logged,
raised or shown, aiohttp exceptions (whose text includes the URL) are converted to our
errors without chaining, and every provider text we surface is scrubbed of the key.

The SDK keeps ONE process-wide client and credential set. The session re-applies its
own (`configure_sdk`) before each SDK call, and reaches the sandbox with an instance
bound to the sandbox URL and this session's headers, so sessions with different
credentials can coexist in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import posixpath
import re
import secrets
import shlex
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import aiohttp
import httpx
import yarl

from .. import arguments, remote_files
from ..command_check import CommandCheck, wait_for_verdict
from ..credentials import Secret, require_credential
from ..errors import (
    ConnectionLostError,
    CredentialsMissingError,
    FileTooLargeError,
    InvalidArgumentError,
    NotAFileError,
    ProviderError,
    SandboxError,
    SandboxFileNotFoundError,
)
from ..exec_output import ExecCapture
from ..process_entry import CommandSpec, PtyEntry
from ..remote_files import Entry
from ..session import BaseSandboxSession, SessionState
from ..settle import settle
from ..shell_trap import ShellTrap
from ..types import ExecResult


@contextlib.contextmanager
def _logging_untouched() -> Iterator[None]:
    """Importing the Blaxel SDK calls `logging.basicConfig` and silences httpx: a library
    must not reconfigure its user's logging, so whatever it changed is put back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, old in levels.items():
            logging.getLogger(name).setLevel(old)


with _logging_untouched():
    from blaxel.core.authentication.apikey import ApiKey
    from blaxel.core.authentication.types import CredentialsError, CredentialsType
    from blaxel.core.client.client import client as sdk_client
    from blaxel.core.common.settings import settings as sdk_settings
    from blaxel.core.sandbox import SandboxInstance


logger = logging.getLogger("sandbox.blaxel")

T = TypeVar("T")

DEFAULT_WORKDIR = "/workspace"
API_KEY_ENV = "BL_API_KEY"
WORKSPACE_ENV = "BL_WORKSPACE"

# Longest line typed into the terminal as is. Shells that read the terminal in canonical
# mode (dash, busybox) get at most 4095 bytes per line; longer wrappers are written to a
# file through the filesystem API and sourced.
MAX_TYPED_LINE = 1024
# Input frames are cut to this many characters (a str slice never splits a character).
INPUT_FRAME_CHARS = 16 * 1024
# Output the SDK returns as one str is converted to bytes this many characters at a time.
TEXT_SLICE_CHARS = 1024 * 1024
# How long a teardown waits for the shell's pid to arrive, when the command was typed
# but the pid marker was not seen yet (a start cancelled right after connecting).
PID_WAIT_S = 2.0
# Bound on the best-effort kill of a terminal whose connection was lost.
LOST_KILL_TIMEOUT_S = 5.0
# The server reports a death by signal as -1 (Go's `ExitCode()`). The wrapper reports
# the command's signal exactly; a -1 left means the wrapper itself was killed, which only
# a group kill (SIGKILL) does.
UNKNOWN_SIGNAL_EXIT = 128 + 9
# What the terminal is sent to make the server look at the session: writing nothing to
# the PTY is harmless, and the server checks whether the shell ended after each message.
PROBE_FRAME = json.dumps({"type": "input", "data": ""})
# Status codes and provider codes after which the same call may succeed later.
RETRYABLE_STATUS = frozenset({408, 425, 429, 502, 503, 504})
RETRYABLE_CODES = frozenset(
    {
        "WORKLOAD_UNAVAILABLE",
        "ROUTING_UNAVAILABLE",
        "SERVICE_UNAVAILABLE",
        "AUTHENTICATION_UNAVAILABLE",
        "UPSTREAM_CONNECT_FAILED",
        "UPSTREAM_CONNECT_TIMEOUT",
        "UPSTREAM_ERROR",
        "UPSTREAM_TIMEOUT",
        "GATEWAY_INTERNAL_ERROR",
        "RATE_LIMIT_EXCEEDED",
        "WORKSPACE_RATE_LIMIT_EXCEEDED",
        "LOCK_ACQUISITION_FAILED",
        "SANDBOX_DELETION_IN_PROGRESS",
        "CREATION_TIMEOUT",
        "UPLOAD_UNAVAILABLE",
    }
)
FINAL_CODES = frozenset(
    {
        "ROUTE_NOT_FOUND",
        "WORKLOAD_NOT_FOUND",
        "WORKSPACE_NOT_FOUND",
        "WORKLOAD_FAILED",
        "AUTHENTICATION_REQUIRED",
        "AUTHENTICATION_FAILED",
        "TOKEN_REVOKED",
        "FORBIDDEN",
        "UNAUTHORIZED",
        "UNAUTHORIZED_WORKSPACE",
        "WORKSPACE_REQUIRED",
        "BAD_REQUEST",
        "USAGE_LIMIT_EXCEEDED",
        "QUOTA_EXCEEDED",
        "VALIDATION_FAILED",
        "VALIDATION_ERROR",
        "INVALID_INPUT",
        "INVALID_IMAGE",
        "IMAGE_NOT_FOUND",
        "INVALID_REGION",
        "SANDBOX_ALREADY_EXISTS",
        "SANDBOX_DELETED",
        "POLICY_VIOLATION",
    }
)
_CODE_RE = re.compile(r"[A-Z][A-Z0-9_]{1,63}")
# The SDK's write_binary raises a bare Exception("Failed to write binary: <status> ...").
_STATUS_IN_TEXT_RE = re.compile(r"^Failed to [a-z ]+: (\d{3})\b")

# Sessions started on each event loop: the last one to stop on a loop closes the SDK's
# shared HTTP client there (it would otherwise keep pooled sockets open).
_LIVE_SESSIONS: weakref.WeakSet[BlaxelSession] = weakref.WeakSet()


class BlaxelAPIError(ProviderError):
    """A Blaxel API call failed. `status` is the HTTP status (None for a transport
    failure) and `code` the provider's error code when it sent one."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.status = status
        self.code = code


def configure_sdk(*, api_key: str, workspace: str, api_url: str | None = None) -> None:
    """Point the Blaxel SDK's process-wide client at `api_url` with these credentials.

    The SDK reads its credentials and control-plane URL once, at import, into globals;
    this replaces them (e.g. to talk to `sandbox.testing.blaxel_server.BlaxelServer`).
    `api_url` defaults to the SDK's own (`https://api.blaxel.ai/v0`, or the dev API
    with `BL_ENV=dev`).
    """
    url = api_url or sdk_settings.base_url
    auth = ApiKey(CredentialsType(api_key=api_key, workspace=workspace), workspace, url)
    sdk_settings.auth = auth
    sdk_client.with_auth(auth)
    sdk_client.with_base_url(url)


def parse_terminal_frame(payload: str | bytes) -> tuple[str, str] | None:
    """Decode one server frame of the terminal WebSocket into `(kind, data)`.

    `kind` is "output" or "error". Text and binary frames carry the same JSON; keys may
    be capitalised (`Type`, `Data`). Anything else (not UTF-8, not JSON, not an object,
    an unknown type, a non-string payload) is malformed and returns None: the caller
    skips it.
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        try:
            payload = bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    kind = _get_key(obj, "type")
    if not isinstance(kind, str):
        return None
    kind = kind.lower()
    data = _get_key(obj, "data")
    if kind == "error":
        if data is None:
            data = _get_key(obj, "message")
        if data is None:
            data = ""
    if kind not in ("output", "error") or not isinstance(data, str):
        return None
    return kind, data


def _get_key(obj: Mapping[str, Any], key: str) -> Any:
    if key in obj:
        return obj[key]
    for name, value in obj.items():
        if isinstance(name, str) and name.lower() == key:
            return value
    return None


def _looks_like_a_listing(data: bytes) -> bool:
    """Whether `data` has the shape of the sandbox API's JSON listing of a directory
    (its answer to a GET of one); `_is_directory` confirms."""
    if not data.startswith(b"{") or len(data) > 64 * 1024 * 1024:
        return False
    try:
        value = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(value, dict)
        and isinstance(value.get("files"), list)
        and isinstance(value.get("subdirectories"), list)
        and "path" in value
    )


def _text_to_bytes(text: str) -> bytes:
    """Terminal text as bytes. Lone surrogates from `surrogateescape` on the server side
    map back to the original bytes; any other lone surrogate becomes U+FFFD."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def _append_text(sink: Callable[[bytes], None], text: str) -> None:
    """Append `text` as bytes (as `_text_to_bytes`), a slice at a time, so that a huge
    output the SDK handed over as one str is not also held as one bytes object."""
    for at in range(0, len(text), TEXT_SLICE_CHARS):
        sink(_text_to_bytes(text[at : at + TEXT_SLICE_CHARS]))


def exact_status_command(command: str) -> str:
    """The script run for a one-shot `command` (a POSIX shell string): `command` in a
    child, the script exiting with its status, so a death by signal N is 128+N where
    the server would report -1. The waiting shell's stderr is /dev/null, so its
    "Killed" notice never shows; the command keeps the real stderr (as fd 3 meanwhile).
    The redirections sit inside a subshell: dash applies a simple command's redirections
    in the parent and still has them in place when it reports the death.
    """
    return f"exec 3>&2 2>/dev/null; (exec {command} 2>&3 3>&-); exit $?"


def exit_status(code: object) -> int:
    """The contract's exit status from the server's (-1: killed by a signal it does not
    name; only the wrapper's own group kill leaves that)."""
    if not isinstance(code, int) or isinstance(code, bool):
        return 255
    if code < 0:
        return UNKNOWN_SIGNAL_EXIT
    return code


def is_server_timeout(error: SandboxError | None) -> bool:
    """Whether `error` is the sandbox API's own timeout of a waited-for process: 422
    "process timed out after N seconds" (the process still runs), or 408 from older
    gateways."""
    if not isinstance(error, BlaxelAPIError):
        return False
    return error.status == 408 or (error.status == 422 and "timed out" in str(error))


def _int_status(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
        return value
    return None


def _status_of(exc: BaseException) -> int | None:
    for attr in ("status", "status_code"):
        status = _int_status(getattr(exc, attr, None))
        if status is not None:
            return status
    status = _int_status(getattr(getattr(exc, "response", None), "status_code", None))
    if status is not None:
        return status
    match = _STATUS_IN_TEXT_RE.match(str(exc))
    return int(match.group(1)) if match else None


def _code_of(exc: BaseException) -> str | None:
    candidates: list[object] = [getattr(exc, "code", None)]
    for body in (getattr(exc, "body", None), getattr(exc, "data", None)):
        if isinstance(body, Mapping):
            nested = body.get("error")
            if isinstance(nested, Mapping):
                candidates.append(nested.get("code"))
            candidates.extend((body.get("code"), nested))
    for candidate in candidates:
        if isinstance(candidate, str) and _CODE_RE.fullmatch(candidate):
            return candidate
    return None


def _detail_of(exc: BaseException) -> str:
    for body in (getattr(exc, "body", None), getattr(exc, "data", None)):
        if isinstance(body, Mapping):
            nested = body.get("error")
            for source in (nested, body):
                if isinstance(source, Mapping):
                    message = source.get("message")
                    if isinstance(message, str) and message:
                        return message
            if isinstance(nested, str) and nested:
                return nested
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message:
        return message
    return str(exc) or type(exc).__name__


def is_retryable(status: int | None, code: str | None, hint: object = None) -> bool:
    """Whether a failed Blaxel call may succeed if tried again: an unavailable workload,
    a rate limit or a gateway timeout may; not-found, auth, forbidden, bad requests and
    quotas may not. The provider's code wins over the status."""
    if code in RETRYABLE_CODES:
        return True
    if code in FINAL_CODES:
        return False
    if isinstance(hint, bool):
        return hint
    return status in RETRYABLE_STATUS


@dataclass(eq=False)
class _Terminal:
    """The per-process state of one terminal WebSocket (kept in `entry.handle`)."""

    trap: ShellTrap
    session_id: str
    ws: aiohttp.ClientWebSocketResponse | None = None
    reader: asyncio.Task[None] | None = None
    line_sent: bool = False
    shell_pid: int | None = None
    # Set once the shell's pid is known, or can no longer arrive (the reader ended).
    pid_settled: asyncio.Event = field(default_factory=asyncio.Event)
    pid_scan: bytes = b""
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closing: bool = False
    # A liveness probe was sent and no frame came since.
    probed: bool = False

    def __post_init__(self) -> None:
        self.pid_marker = re.compile(rb"\x1eP" + self.trap.token.encode() + rb":(\d{1,10})\x1e")

    def scan_for_pid(self, raw: bytes) -> None:
        """Look for the shell-pid marker printed before the trap's start marker."""
        data = self.pid_scan + raw
        match = self.pid_marker.search(data)
        if match is None:
            self.pid_scan = data[-256:]
            return
        self.pid_scan = b""
        pid = int(match.group(1))
        if pid > 1:
            self.shell_pid = pid
        self.pid_settled.set()


class BlaxelSession(BaseSandboxSession):
    """A Blaxel sandbox.

    Options:
    - `name` (alias `sandbox_id`): the sandbox to create or attach to (default: a new
      `sandbox-<random>`); it is deleted on close unless `keep=True`;
    - `api_key` / `workspace`: credentials (default: `BL_API_KEY` / `BL_WORKSPACE`);
    - `api_url`: the control-plane API (default: the SDK's; point it at a
      `BlaxelServer` for provider-free tests);
    - `image`, `memory` (MB), `region`, `ttl`, `labels`, `create_timeout_s` (1-50 s):
      passed to the sandbox creation;
    - `workdir`: the directory relative paths, `cwd`s and commands start in (created at
      start; default `/workspace`);
    - `api_timeout_s` (default 120): bound on each API call; `connect_timeout_s`
      (default 30): bound on a terminal handshake; `close_timeout_s` (default 2): bound
      on a WebSocket close; `heartbeat_s` (default 30): WebSocket ping interval, so a
      silently dead connection is noticed; `terminate_grace_s` (default 1): time between
      the polite signals and SIGKILL when a running process is terminated;
      `probe_interval_s` (default 5): after that long without a frame from a running
      process's terminal, it is probed, so a shell that died without reporting is
      found lost within about twice that;
    - plus the base session's options.
    """

    backend_name = "blaxel"

    def __init__(
        self,
        *,
        name: str | None = None,
        sandbox_id: str | None = None,
        keep: bool = False,
        api_key: str | None = None,
        workspace: str | None = None,
        api_url: str | None = None,
        image: str | None = None,
        memory: int | None = None,
        region: str | None = None,
        ttl: str | None = None,
        labels: Mapping[str, str] | None = None,
        create_timeout_s: int | None = None,
        workdir: str = DEFAULT_WORKDIR,
        api_timeout_s: float = 120.0,
        connect_timeout_s: float = 30.0,
        close_timeout_s: float = 2.0,
        heartbeat_s: float | None = 30.0,
        terminate_grace_s: float = 1.0,
        probe_interval_s: float = 5.0,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if name is not None and sandbox_id is not None and name != sandbox_id:
            raise InvalidArgumentError("give the sandbox's name once (name= or sandbox_id=)")
        key = require_credential(
            api_key, API_KEY_ENV, backend="blaxel", what="an API key (api_key)"
        )
        space = require_credential(
            workspace, WORKSPACE_ENV, backend="blaxel", what="a workspace (workspace)"
        )
        if not isinstance(workdir, str) or not workdir.startswith("/"):
            raise InvalidArgumentError("workdir must be an absolute path in the sandbox")
        # Every option is checked now, not when first used (a bad grace period would
        # otherwise surface as a raw TypeError in a teardown).
        for option, seconds in (
            ("api_timeout_s", api_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("close_timeout_s", close_timeout_s),
            ("probe_interval_s", probe_interval_s),
        ):
            arguments.check_seconds(option, seconds)
        arguments.check_seconds("heartbeat_s", heartbeat_s, allow_none=True)
        arguments.check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
        for option, text in (
            ("name", name),
            ("sandbox_id", sandbox_id),
            ("image", image),
            ("region", region),
            ("ttl", ttl),
        ):
            arguments.check_str(option, text)
        labels = arguments.check_env(labels, name="labels")
        for option, number in (("memory", memory), ("create_timeout_s", create_timeout_s)):
            if number is not None and (
                isinstance(number, bool) or not isinstance(number, int) or number <= 0
            ):
                raise InvalidArgumentError(f"{option} must be a positive int, not {number!r}")
        self.sandbox_name = name or sandbox_id or f"sandbox-{secrets.token_hex(6)}"
        self.keep = keep
        self.workdir = posixpath.normpath(workdir)
        self.api_timeout_s = api_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.close_timeout_s = close_timeout_s
        self.heartbeat_s = heartbeat_s
        self.terminate_grace_s = terminate_grace_s
        self.probe_interval_s = probe_interval_s
        self._api_key = Secret(key)
        self._workspace_name = space
        self._api_url = api_url
        self._create_config: dict[str, Any] = {"name": self.sandbox_name}
        for option, value in (
            ("image", image),
            ("memory", memory),
            ("region", region),
            ("ttl", ttl),
            ("labels", dict(labels) if labels else None),
        ):
            if value is not None:
                self._create_config[option] = value
        self._create_timeout_s = create_timeout_s
        self._http: aiohttp.ClientSession | None = None
        self._instance: SandboxInstance | None = None
        self._sandbox_url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._create_attempted = False
        self._deleted = False

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} sandbox={self.sandbox_name!r} "
            f"workspace={self._workspace_name!r} state={self.state.value} "
            f"processes={len(self.pty_processes())}>"
        )

    # ---- helpers: credentials, errors, SDK calls ------------------------------------

    def _redact(self, text: str) -> str:
        """`text` with every form of the API key replaced (provider texts may echo it)."""
        key = self._api_key.reveal()
        for form in {key, quote(key, safe=""), quote(key)}:
            if form:
                text = text.replace(form, "***")
        return text

    def _auth_headers(self) -> dict[str, str]:
        return {
            "X-Blaxel-Authorization": f"Bearer {self._api_key.reveal()}",
            "X-Blaxel-Workspace": self._workspace_name,
        }

    def _apply_sdk_config(self) -> None:
        configure_sdk(
            api_key=self._api_key.reveal(), workspace=self._workspace_name, api_url=self._api_url
        )

    def _map_error(self, exc: BaseException, what: str) -> SandboxError:
        """Our error for an SDK/transport failure. Never chains: texts are rebuilt from
        the status, the provider code and a scrubbed message."""
        if isinstance(exc, CredentialsError):
            return CredentialsMissingError(f"{what}: Blaxel credentials are incomplete")
        if isinstance(exc, httpx.TimeoutException):
            return BlaxelAPIError(f"{what}: the Blaxel API timed out", retryable=True)
        if isinstance(exc, httpx.TransportError | aiohttp.ClientConnectionError | OSError):
            return BlaxelAPIError(
                f"{what}: could not reach Blaxel ({type(exc).__name__})", retryable=True
            )
        status, code = _status_of(exc), _code_of(exc)
        retryable = is_retryable(status, code, getattr(exc, "retryable", None))
        detail = self._redact(_detail_of(exc)).strip().replace("\n", " ")[:300]
        where = " ".join(p for p in (f"HTTP {status}" if status else "", code or "") if p)
        message = f"{what}: Blaxel answered {where or 'with an error'}: {detail}"
        if retryable:
            message += " (this may succeed if retried)"
        return BlaxelAPIError(message, retryable=retryable, status=status, code=code)

    async def _call(
        self, what: str, fn: Callable[[], Awaitable[T]], *, timeout: float | None = None
    ) -> T:
        """Run one SDK call with the session's credentials applied, bounded in time,
        converting every failure to our errors (raised outside the `except` block, so
        the SDK's exception, which may hold request headers, is not chained)."""
        self._apply_sdk_config()
        limit = self.api_timeout_s if timeout is None else timeout
        error: SandboxError
        try:
            async with asyncio.timeout(None if math.isinf(limit) else limit):
                return await fn()
        except TimeoutError:
            error = BlaxelAPIError(
                f"{what}: Blaxel did not answer within {limit:g}s", retryable=True
            )
        except Exception as exc:
            error = self._map_error(exc, what)
        raise error

    @property
    def instance(self) -> SandboxInstance:
        """The SDK's `SandboxInstance` for this sandbox (after start)."""
        if self._instance is None:
            raise SandboxError(f"the {self.backend_name} session is not started")
        return self._instance

    def _abs_path(self, path: str) -> str:
        """A sandbox path: relative ones are in `workdir`."""
        return posixpath.normpath(posixpath.join(self.workdir, path))

    @staticmethod
    def _url_path(path: str) -> str:
        """`path` as the SDK must get it: it pastes paths into URLs unescaped, so a `#`,
        `?` or `%` in a file name would otherwise cut or corrupt the request."""
        return quote(path, safe="/")

    def _cwd(self, cwd: str | None) -> str:
        return self.workdir if cwd is None else self._abs_path(cwd)

    # ---- lifecycle -------------------------------------------------------------------

    async def _start_backend(self) -> None:
        self._loop = asyncio.get_running_loop()
        _LIVE_SESSIONS.add(self)
        self._http = aiohttp.ClientSession()
        self._create_attempted = True
        self._deleted = False
        config = dict(self._create_config)
        create_timeout = self._create_timeout_s
        created = await self._call(
            f"creating the Blaxel sandbox {self.sandbox_name!r}",
            lambda: SandboxInstance.create_if_not_exists(config, timeout=create_timeout),
        )
        # `process.url` honours the sandbox's own URL and BL_SANDBOXES_<NAME>_URL.
        url: str = created.process.url
        self._sandbox_url = url
        self._instance = SandboxInstance(
            created.sandbox, force_url=url, headers=self._auth_headers()
        )
        instance = self._instance
        await self._call(
            f"creating the working directory {self.workdir!r}",
            lambda: instance.fs.mkdir(self._url_path(self.workdir)),
        )

    async def _stop_backend(self) -> None:
        errors: list[BaseException] = []
        try:
            if self._create_attempted and not self.keep and not self._deleted:
                try:
                    await self._call(
                        f"deleting the Blaxel sandbox {self.sandbox_name!r}",
                        lambda: SandboxInstance.delete(self.sandbox_name),
                    )
                except BlaxelAPIError as exc:
                    if exc.status != 404:
                        errors.append(exc)
                    else:
                        self._deleted = True
                else:
                    self._deleted = True
        finally:
            await self._release_clients()
        if errors:
            raise errors[0]

    async def _release_clients(self) -> None:
        instance, self._instance = self._instance, None
        http, self._http = self._http, None
        try:
            if instance is not None:
                # The SDK opens one httpx client per helper and never closes them.
                for action in (instance.process, instance.fs):
                    with contextlib.suppress(Exception):
                        await action.get_client().aclose()
        finally:
            if http is not None:
                await http.close()
            _LIVE_SESSIONS.discard(self)
            loop = self._loop
            if loop is not None and not any(s._loop is loop for s in _LIVE_SESSIONS):
                await _close_shared_sdk_client(loop)

    # ---- one-shot commands -------------------------------------------------------------

    async def _exec(
        self, spec: CommandSpec, timeout: float | None, capture: ExecCapture
    ) -> ExecResult:
        """One `process.exec` that waits for completion. The SDK returns the whole output
        at once (no stream to read it from as it comes): only what is kept of it is
        bounded. A `cwd` (or `shell=False`) runs behind the command check, started in
        `workdir`, so a bad one is reported as on every backend.

        The edge cuts a wait silent for about 60 s with a 504 while the command runs on:
        the process is then followed until it ends, up to our deadline. At our deadline,
        or when the server's own timeout answers first (422), the process is killed."""
        instance = self.instance
        name = f"exec-{secrets.token_hex(6)}"
        check = capture.check = CommandCheck.needed(spec, cwd=self._cwd(spec.cwd))
        argv = spec.argv if check is None else check.argv(spec.argv, announce=False)
        request: dict[str, Any] = {
            "command": exact_status_command(shlex.join(argv)),
            "name": name,
            "working_dir": self.workdir,
            "wait_for_completion": True,
        }
        if spec.env:
            request["env"] = dict(spec.env)
        if timeout is not None:
            # A server-side backstop a second after ours, should our kill not get through.
            request["timeout"] = math.ceil(timeout) + 1
        what = f"running {spec.display[:80]!r} in the Blaxel sandbox"
        self._apply_sdk_config()
        error: SandboxError | None = None
        timed_out = False
        try:
            async with asyncio.timeout(timeout):
                try:
                    response = await instance.process.exec(request)
                except Exception as exc:
                    error = self._map_error(exc, what)
                if isinstance(error, BlaxelAPIError) and error.status == 504:
                    # The edge cut a silent request; the command is still running.
                    error = None
                    response = await self._wait_for_process(name, what)
        except TimeoutError:
            timed_out = True
        except BaseException:
            await settle(self._kill_process(name))
            raise
        if timed_out or is_server_timeout(error):
            await settle(self._kill_process(name))
            stdout, stderr = await self._partial_output(name)
            capture.add_stdout(stdout)
            capture.add_stderr(stderr)
            raise capture.timeout_error(spec.display, timeout)
        if error is not None:
            if isinstance(error, BlaxelAPIError) and error.status is None:
                # The connection failed mid-call: the command may be running without us.
                with contextlib.suppress(SandboxError):
                    await settle(self._kill_process(name))
            raise error
        stdout_text = response.stdout or ""
        stderr_text = response.stderr or ""
        if not stdout_text and not stderr_text and response.logs:
            stdout_text = response.logs  # older sandbox APIs only return combined logs
        code = exit_status(response.exit_code)
        _append_text(capture.add_stdout, stdout_text)
        _append_text(capture.add_stderr, stderr_text)
        return capture.result(code)

    async def _wait_for_process(self, name: str, what: str) -> Any:
        instance = self.instance
        await self._call(
            what, lambda: instance.process.wait(name, max_wait=-1, interval=1000), timeout=math.inf
        )
        final = await self._call(what, lambda: instance.process.get(name))
        stdout = await self._call(what, lambda: instance.process.logs(name, "stdout"))
        stderr = await self._call(what, lambda: instance.process.logs(name, "stderr"))
        final.stdout, final.stderr = stdout, stderr
        return final

    async def _kill_process(self, name: str) -> None:
        """Kill a one-shot process by name (gone already is fine)."""
        instance = self.instance
        try:
            await self._call(
                f"killing the process {name!r}",
                lambda: instance.process.kill(name),
                timeout=min(self.api_timeout_s, 30.0),
            )
        except BlaxelAPIError as exc:
            if exc.status not in (404, 409, 400):
                raise

    async def _partial_output(self, name: str) -> tuple[bytes, bytes]:
        """What a killed one-shot command printed (best effort: at most the SDK's 64 KB
        tail of each stream)."""
        instance = self.instance
        try:
            state = await self._call(
                f"reading the output of {name!r}", lambda: instance.process.get(name), timeout=5.0
            )
        except SandboxError:
            return b"", b""
        return _text_to_bytes(state.stdout or ""), _text_to_bytes(state.stderr or "")

    # ---- files ---------------------------------------------------------------------------

    async def _stat(self, path: str) -> Entry | None:
        """What the listing of the parent folder says `path` is: the sandbox API lists
        each entry's Go FileMode in octal, type bits included (its GET of a FIFO would
        open it and wait forever, so nothing else can ask)."""
        if path == "/":
            return Entry("dir")
        parent, name = posixpath.split(path)
        instance = self.instance
        try:
            listing = await self._call(
                f"listing {parent!r}", lambda: instance.fs.ls(self._url_path(parent))
            )
        except BlaxelAPIError as exc:
            if exc.status == 404:
                return None
            raise
        if any(sub.name == name for sub in listing.subdirectories or []):
            return Entry("dir")
        for entry in listing.files or []:
            if entry.name == name:
                try:
                    mode = int(str(entry.permissions), 8)
                except ValueError:
                    mode = 0
                return Entry(remote_files.go_file_mode_kind(mode), size=entry.size)
        return None

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        """`fs.read_binary`, after the parent's listing says it is a regular file within
        `max_bytes`. The API answers a GET of a directory with its JSON listing as if it
        were the file's bytes: such an answer is checked, and refused."""
        instance = self.instance
        target = self._abs_path(path)
        size = await remote_files.regular_file(self._stat, target, write=False, shown=path)
        if size is not None and size > max_bytes:
            raise FileTooLargeError.over(path, size, max_bytes)
        try:
            data: bytes = await self._call(
                f"reading {target!r}", lambda: instance.fs.read_binary(self._url_path(target))
            )
        except BlaxelAPIError as exc:
            if exc.status == 404:
                raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from None
            raise
        if _looks_like_a_listing(data) and await self._is_directory(target):
            raise NotAFileError(f"{path!r} is a directory, not a regular file")
        return data

    async def _is_directory(self, target: str) -> bool:
        """Whether `target` lists as a directory now (a file that merely holds JSON
        shaped like a listing does not: the API answers it as a file)."""
        instance = self.instance
        try:
            await self._call(f"listing {target!r}", lambda: instance.fs.ls(self._url_path(target)))
        except SandboxError:
            return False
        return True

    async def _write_file(self, path: str, data: bytes) -> None:
        """`fs.write_binary` (its parent made first), after the parent's listing says
        nothing or a regular file is there (the API's upload over a FIFO would wait
        forever, over a directory it fails with a 422)."""
        instance = self.instance
        target = self._abs_path(path)
        await remote_files.regular_file(self._stat, target, write=True, shown=path)
        parent = posixpath.dirname(target)
        try:
            if parent not in ("/", self.workdir):
                await self._call(
                    f"creating {parent!r}", lambda: instance.fs.mkdir(self._url_path(parent))
                )
            await self._call(
                f"writing {target!r}",
                lambda: instance.fs.write_binary(self._url_path(target), data),
            )
        except BlaxelAPIError as failure:
            error = await remote_files.explain_write_failure(self._stat, target, failure)
            if isinstance(error, NotAFileError):
                raise remote_files.under_a_file(path) from None
            raise

    # ---- terminal processes ------------------------------------------------------------

    def _terminal_url(self, term: _Terminal, rows: int, cols: int, cwd: str) -> yarl.URL:
        """The terminal WebSocket URL. It holds the API key: never log or raise it."""
        base = urlsplit(self._sandbox_url or "")
        scheme = {"https": "wss", "http": "ws"}.get(base.scheme, base.scheme)
        query = urlencode(
            {
                "token": self._api_key.reveal(),
                "cols": cols,
                "rows": rows,
                "sessionId": term.session_id,
                "workingDir": cwd,
            },
            quote_via=quote,
        )
        path = base.path.rstrip("/") + "/terminal/ws"
        return yarl.URL(urlunsplit((scheme, base.netloc, path, query, "")), encoded=True)

    async def _typed_line(
        self,
        term: _Terminal,
        spec: CommandSpec,
        tty: bool,
        cwd: str,
        check: CommandCheck | None = None,
    ) -> str:
        """What to type into the terminal's shell: the pid marker, then the trap line
        (sourced from a file written through the API when it is too long to type).
        With a `check`, the command runs behind it (it changes to `cwd` and prints the
        trap's start marker) and the shell starts in `workdir`."""
        if check is None:
            command = spec.shell_command
            if spec.env:
                assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in spec.env.items())
                command = f"exec env {assignments} sh -c {shlex.quote(command)}"
        else:
            argv = check.argv(spec.argv, announce=True)
            if spec.env:
                argv = ["env", *(f"{k}={v}" for k, v in spec.env.items()), *argv]
            command = "exec " + shlex.join(argv)
        token = term.trap.token
        line = f"printf '\\036P%s:%d\\036' {token} $$; " + term.trap.line(
            command, tty=tty, cwd=None if check else cwd, isolate=True, announced=bool(check)
        )
        if len(line.encode()) <= MAX_TYPED_LINE:
            return line
        script = f"/tmp/.sandbox-pty-{token}"
        body = f"rm -f {script}\n{line}".encode()
        instance = self.instance
        await self._call(
            "writing the command to the sandbox", lambda: instance.fs.write_binary(script, body)
        )
        return f". {script}\n"

    async def _spawn_process(self, entry: PtyEntry) -> None:
        spec = entry.spec
        term = _Terminal(trap=ShellTrap(report_exit=True), session_id=secrets.token_hex(8))
        entry.handle = term
        cwd = self._cwd(spec.command.cwd)
        check = CommandCheck.needed(spec.command, cwd=cwd, token=term.trap.token)
        line = await self._typed_line(term, spec.command, spec.tty, cwd, check)
        # With a check the terminal starts in `workdir` (it exists) and the check enters
        # `cwd`: a missing `workingDir` is not reported by the terminal.
        start_dir = cwd if check is None else self.workdir
        term.ws = await self._connect_terminal(
            self._terminal_url(term, spec.rows, spec.cols, start_dir)
        )
        term.reader = asyncio.create_task(
            self._read_terminal(entry, term), name=f"blaxel-terminal-{entry.process_id}"
        )
        await self._send_input(entry, line.encode())
        term.line_sent = True
        if check is not None:
            await wait_for_verdict(entry, term.trap, check)

    async def _connect_terminal(self, url: yarl.URL) -> aiohttp.ClientWebSocketResponse:
        http = self._http
        if http is None:
            raise SandboxError(f"the {self.backend_name} session is not started")
        error: SandboxError
        what = f"opening a terminal in the Blaxel sandbox {self.sandbox_name!r}"
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await http.ws_connect(
                    url,
                    headers=self._auth_headers(),
                    heartbeat=self.heartbeat_s,
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=self.close_timeout_s),
                    max_msg_size=0,
                )
        except TimeoutError:
            error = BlaxelAPIError(
                f"{what}: no answer within {self.connect_timeout_s:g}s", retryable=True
            )
        except aiohttp.WSServerHandshakeError as exc:
            # Its text includes the URL, and so the key: only the status is kept.
            status = exc.status
            error = BlaxelAPIError(
                f"{what}: the handshake was refused with HTTP {status}",
                retryable=is_retryable(status, None),
                status=status,
            )
        except (aiohttp.ClientError, OSError) as exc:
            error = BlaxelAPIError(f"{what}: {type(exc).__name__}", retryable=True)
        raise error

    async def _send_input(self, entry: PtyEntry, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        await self._send_frames(
            entry,
            (
                json.dumps({"type": "input", "data": text[at : at + INPUT_FRAME_CHARS]})
                for at in range(0, len(text), INPUT_FRAME_CHARS)
            ),
        )

    async def _send_frames(self, entry: PtyEntry, frames: Iterable[str]) -> None:
        term: _Terminal = entry.handle
        ws = term.ws
        if ws is None or ws.closed:
            raise ConnectionLostError(
                f"the terminal of process {entry.process_id} is disconnected", retryable=False
            )
        error: SandboxError | None = None
        async with term.send_lock:
            try:
                for frame in frames:
                    await ws.send_str(frame)
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                error = ConnectionLostError(
                    f"writing to the terminal of process {entry.process_id} failed "
                    f"({type(exc).__name__})",
                    retryable=False,
                )
        if error is not None:
            raise error

    async def _resize(self, entry: PtyEntry, rows: int, cols: int) -> None:
        """The terminal's `resize` message (`handler/terminal.go`; the server ignores a
        size of zero and answers nothing)."""
        await self._send_frames(entry, [json.dumps({"type": "resize", "cols": cols, "rows": rows})])

    async def _read_terminal(self, entry: PtyEntry, term: _Terminal) -> None:
        """Pump terminal frames into the entry until the socket closes."""
        ws = term.ws
        assert ws is not None
        reason: str | None = None
        try:
            reason = await self._pump_frames(entry, term, ws)
        except Exception as exc:  # a dropped connection must end the process, not hang it
            reason = f"reading the terminal failed ({type(exc).__name__})"
        finally:
            term.pid_settled.set()
        if term.trap.done or term.closing:
            return
        tail = term.trap.flush()
        if tail:
            entry.feed(tail)
        if reason is None and term.probed:
            # Closed in answer to a probe: the server found the shell gone.
            reason = "the Blaxel terminal's shell ended without reporting the command's exit"
        if reason is None:
            code = ws.close_code
            reason = "the Blaxel terminal connection closed before the command finished"
            if code is not None:
                reason += f" (close code {code})"
        if not term.trap.started:
            reason += "; the command never started"
        entry.report_lost(reason)

    async def _pump_frames(
        self, entry: PtyEntry, term: _Terminal, ws: aiohttp.ClientWebSocketResponse
    ) -> str | None:
        """Feed frames to the entry until the socket closes; returns why it failed, or
        None for a plain close."""
        while True:
            try:
                msg = await ws.receive(timeout=self.probe_interval_s)
            except TimeoutError:
                await self._probe(term, ws)
                continue
            if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                term.probed = False
                self._on_frame(entry, term, msg.data)
            elif msg.type is aiohttp.WSMsgType.ERROR:
                return f"the terminal connection failed ({type(msg.data).__name__})"
            elif msg.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.CLOSED,
            ):
                return None

    async def _probe(self, term: _Terminal, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Make the server look at a silent terminal's session: it checks whether the
        shell ended only after a client message, and then closes the socket (a shell
        that died without our end marker would otherwise be waited on forever). Skipped
        while a write is under way (that write is such a message) or once the command
        ended; a probe that cannot be sent is left to the next one."""
        if term.trap.done or term.closing or term.send_lock.locked() or not term.line_sent:
            return
        async with term.send_lock:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, ConnectionError):
                async with asyncio.timeout(self.probe_interval_s):
                    await ws.send_str(PROBE_FRAME)
                    term.probed = True

    def _on_frame(self, entry: PtyEntry, term: _Terminal, payload: str | bytes) -> None:
        frame = parse_terminal_frame(payload)
        if frame is None:
            logger.debug("skipping a malformed Blaxel terminal frame (%d bytes)", len(payload))
            return
        kind, data = frame
        if kind == "error":
            text = self._redact(data).strip()[:500]
            logger.warning("Blaxel terminal error (process %d): %s", entry.process_id, text)
            entry.feed(f"\n[sandbox: Blaxel terminal error: {text}]\n".encode())
            return
        raw = _text_to_bytes(data)
        if not term.pid_settled.is_set():
            term.scan_for_pid(raw)
        if term.trap.done:
            return
        shown = term.trap.feed(raw)
        if shown:
            entry.feed(shown)
        if term.trap.done:
            assert term.trap.exit_code is not None
            entry.report_exit(term.trap.exit_code)
            entry.report_eof()

    async def _write_stdin(self, entry: PtyEntry, data: bytes) -> None:
        await self._send_input(entry, data)

    async def _interrupt(self, entry: PtyEntry) -> None:
        # Also for tty=False: the command runs in the terminal's foreground process
        # group, signal generation stays on, so the interrupt character signals it.
        await self._send_input(entry, b"\x03")

    async def _final_drain(self, entry: PtyEntry) -> None:
        # Frames already received sit in aiohttp's queue: let the reader take them.
        for _ in range(3):
            await asyncio.sleep(0)

    async def _terminate_pty_entry(self, entry: PtyEntry) -> None:
        term = entry.handle
        if not isinstance(term, _Terminal):
            return
        term.closing = True
        error: SandboxError | None = None
        try:
            if self._must_kill_remotely(term):
                if term.shell_pid is None and term.line_sent:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(PID_WAIT_S):
                            await term.pid_settled.wait()
                if term.shell_pid is not None:
                    # A lost terminal may mean Blaxel is unreachable: do not hold the
                    # window that reports the loss for long.
                    bound = LOST_KILL_TIMEOUT_S if entry.lost_reason is not None else None
                    try:
                        await self._kill_terminal_session(term.shell_pid, bound)
                    except SandboxError as exc:
                        if entry.lost_reason is None:
                            error = exc
                        else:  # its connection was already gone: best effort only
                            logger.info("could not kill a lost Blaxel terminal: %s", exc)
        finally:
            await self._close_terminal(term)
        if error is not None:
            raise error

    def _must_kill_remotely(self, term: _Terminal) -> bool:
        if term.trap.done or self._instance is None or not term.line_sent:
            return False
        # Closing deletes the sandbox right after, which stops everything in it.
        return not (self.state is SessionState.CLOSING and not self.keep)

    async def _kill_terminal_session(self, shell_pid: int, timeout: float | None) -> None:
        """Kill every process of the terminal session led by `shell_pid`: polite
        signals, up to `terminate_grace_s`, then SIGKILL."""
        steps = max(1, math.ceil(self.terminate_grace_s / 0.05))
        script = _KILL_SESSION_SCRIPT.format(pid=shell_pid, steps=steps)
        instance = self.instance
        response = await self._call(
            f"stopping terminal session {shell_pid}",
            lambda: instance.process.exec(
                {
                    "command": script,
                    "name": f"kill-{secrets.token_hex(6)}",
                    "wait_for_completion": True,
                    "timeout": math.ceil(self.terminate_grace_s) + 10,
                }
            ),
            timeout=timeout or min(self.api_timeout_s, self.terminate_grace_s + 30.0),
        )
        if response.exit_code not in (0, None):
            raise BlaxelAPIError(
                f"stopping terminal session {shell_pid} failed (exit {response.exit_code})",
                retryable=True,
            )

    async def _close_terminal(self, term: _Terminal) -> None:
        reader = term.reader
        if reader is not None:
            reader.cancel()
            outcomes = await asyncio.gather(reader, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, Exception):
                    logger.debug("Blaxel terminal reader failed: %s", type(outcome).__name__)
        ws = term.ws
        if ws is not None and not ws.closed:
            # On timeout (or cancellation) aiohttp drops the connection itself.
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError, RuntimeError):
                async with asyncio.timeout(self.close_timeout_s):
                    await ws.close()


# Kills the members of session `pid` (the terminal's shell leads it): HUP, TERM and CONT,
# up to `steps` twentieths of a second for them to go (zombies count as gone), then KILL
# to whatever is still in the session. /proc is read directly so nothing beyond a POSIX
# shell is needed in the image; it is walked twice, not once per check.
_KILL_SESSION_SCRIPT = """p={pid}
members() {{
  for d in /proc/[0-9]*; do
    {{ read -r l < "$d/stat"; }} 2>/dev/null || continue
    set -- ${{l##*) }}
    [ "$4" = "$p" ] && [ "$1" != Z ] && echo "${{d#/proc/}}"
  done
}}
alive() {{
  for q in $m; do
    {{ read -r l < "/proc/$q/stat"; }} 2>/dev/null || continue
    set -- ${{l##*) }}
    [ "$4" = "$p" ] && [ "$1" != Z ] && return 0
  done
  return 1
}}
m=$(members)
[ -n "$m" ] || exit 0
for s in HUP TERM CONT; do kill -"$s" $m 2>/dev/null; done
i=0
while [ "$i" -lt {steps} ] && alive; do sleep 0.05; i=$((i + 1)); done
m=$(members)
[ -z "$m" ] || kill -KILL $m 2>/dev/null
exit 0
"""


async def _close_shared_sdk_client(loop: asyncio.AbstractEventLoop) -> None:
    """Close the SDK's process-wide async HTTP client if it belongs to `loop` (the SDK
    has no public call for it; the next SDK call simply creates a new one)."""
    http = getattr(sdk_client, "_async_client", None)
    if http is None or getattr(sdk_client, "_async_client_loop", None) is not loop:
        return
    sdk_client._async_client = None
    sdk_client._async_client_loop = None
    with contextlib.suppress(Exception):
        await http.aclose()
