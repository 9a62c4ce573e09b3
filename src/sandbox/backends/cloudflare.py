"""The `cloudflare` backend: a user-deployed Cloudflare Sandbox Worker, over HTTP and
WebSocket with aiohttp.

One `aiohttp.ClientSession` per sandbox session carries every request (created on start,
closed on close). The protocol is the bridge Worker of cloudflare/sandbox-sdk (see
docs/providers.md, "Cloudflare", for each fact and its upstream source):

- `POST {worker}/v1/sandbox` creates a sandbox, `DELETE .../{id}` deletes it (404 counts
  as already gone), `GET .../{id}/running` answers ``{"running": bool}`` (always 200);
  ids match ``^[a-z2-7]{1,128}$``;
- `POST .../{id}/exec` runs a one-shot command and answers a server-sent-event stream
  (base64 `stdout`/`stderr`, then `exit` or `error`), decoded incrementally. The bridge
  gives the command no abort signal and no timeout: every command carries a random tag
  in its environment, and one that did not finish (cancelled, timed out, stream lost)
  is killed by a second exec that finds the tag in /proc;
- `GET|PUT .../{id}/file/<path>` reads and writes raw bytes at ``'/' + <path>`` under
  /workspace: a relative path is sent as ``workspace/<path>``; what the path names is
  asked first (a `stat` exec), since the bridge would open a FIFO and wait;
- `POST .../{id}/session` / `DELETE .../{id}/session/{sid}`: a PTY belongs to a session
  and a session has one PTY (shared by every socket, its buffer replayed to each), so
  every process gets a session of its own, named by us before it is created (so a
  cancelled spawn can still delete it);
- `.../{id}/pty` with `Session-Id` is a WebSocket to that session's shell: a `ready`
  text frame (buffered output may come before it), raw bytes both ways in binary
  frames, `error` text frames, `resize` frames from us. No `exit` frame comes (older
  bridges sent one; it is still accepted) and closing the socket leaves the shell
  running.

Because the PTY is a shell that never reports an exit, each command is typed into it
through `ShellTrap` in report mode (isolated): its status comes back in-band as an end
marker. The line first prints the shell's pid, so a terminate can kill the session's
whole tree (a second exec) before it deletes the session.

The API key travels only in the `Authorization` header. It is held in a `Secret` whose
repr hides it, provider text is redacted before it reaches a message, and aiohttp
exceptions (which carry request headers) are never chained to the errors we raise.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import json
import logging
import posixpath
import re
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from .. import arguments
from ..command_check import CommandCheck, wait_for_verdict
from ..credentials import Secret, require_credential
from ..errors import (
    ConnectionLostError,
    FileTooLargeError,
    InvalidArgumentError,
    ProviderError,
    SandboxError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)
from ..exec_output import ExecCapture
from ..process_entry import CommandSpec, PtyEntry
from ..remote_files import Entry, explain_write_failure, regular_file
from ..session import BaseSandboxSession
from ..shell_trap import ShellTrap
from ..types import ExecResult
from .cloudflare_support.sse import SseDecoder, SseEvent

logger = logging.getLogger("sandbox.cloudflare")

WORKER_URL_ENV = "CLOUDFLARE_SANDBOX_WORKER_URL"
API_KEY_ENV = "CLOUDFLARE_SANDBOX_API_KEY"

# Statuses after which the same request may succeed later.
RETRYABLE_STATUSES = frozenset({408, 425, 429, 502, 503, 504})
# The Worker is told to kill a timed-out command this long after our own deadline: the
# client normally gives up first (and closing the stream kills the command); the
# server-side limit is the backstop if the Worker keeps running it.
SERVER_TIMEOUT_GRACE_MS = 1000
MAX_DETAIL_CHARS = 300
# routes.ts: the bridge refuses any other sandbox id with 400.
SANDBOX_ID_RE = re.compile(r"[a-z2-7]{1,128}")
WORKSPACE = "/workspace"
# The environment variable that tags a one-shot command and its descendants.
EXEC_TAG_VAR = "SANDBOX_CF_EXEC"
# Bound on the kill of an unfinished command: it runs while its caller is being
# cancelled, so a stuck Worker must not hold the cancel for a whole request timeout.
KILL_TIMEOUT_S = 5.0
# Output kept from a control exec (stat, kill): they print a line or nothing.
MAX_CONTROL_OUTPUT = 64 * 1024
# What prints the PTY shell's pid before the trap's line, and how we find it.
_PID_MARKER = b"\x1eP%s:(\\d{1,10})\x1e"
_MAX_PID_SCAN = 64 * 1024
# Kills every process whose environment holds the tag given as $1.
_KILL_TAGGED = (
    "exec 2>/dev/null; "  # before any redirection: a process gone mid-scan is no news
    'for d in /proc/[0-9]*; do tr "\\000" "\\n" < "$d/environ" 2>/dev/null '
    '| grep -qxF "$1" && kill -KILL "${d#/proc/}" 2>/dev/null; done; true'
)
# Kills the session (and process group) led by pid $1: the PTY shell and whatever it
# started, even in a group of its own.
_KILL_SESSION = (
    "exec 2>/dev/null; "
    'kill -KILL -- "-$1" 2>/dev/null; for d in /proc/[0-9]*; do '
    'st=$(cat "$d/stat" 2>/dev/null) || continue; st=${st##*) }; set -- "$1" $st; '
    '[ "$5" = "$1" ] && kill -KILL "${d#/proc/}" 2>/dev/null; done; true'
)
# What a path names, relative to the exec's cwd (/workspace): "<%F>|<size>".
_STAT = (
    'if [ -e "$1" ]; then stat -L -c "%F|%s" -- "$1"; '
    'elif [ -L "$1" ]; then echo "symlink|"; else echo "none|"; fi'
)


@dataclass(frozen=True, slots=True)
class TerminalEvent:
    """One thing that happened on a PTY WebSocket.

    `kind` is "output" (`data`), "exit" (`code`, None if the frame had no usable code),
    "error" (`message`) or "closed" (`message` says how).
    """

    kind: str
    data: bytes = b""
    code: int | None = None
    message: str = ""


class WorkerTerminal:
    """The client side of one PTY WebSocket: the `ready` handshake, then events.

    Binary frames that arrive before `ready` are kept and handed out first by
    `next_event()`, so nothing the shell printed early is lost.
    """

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, early: list[bytes]) -> None:
        self.ws = ws
        self._early = early

    @staticmethod
    async def wait_ready(
        ws: aiohttp.ClientWebSocketResponse, redact: Callable[[str], str] = str
    ) -> list[bytes]:
        """Read frames until `ready`; return the output that came before it.

        Raises `ProviderError` for an `error` frame (its message passed through
        `redact`), `ConnectionLostError` when the socket closes first.
        """
        early: list[bytes] = []
        while True:
            msg = await ws.receive()
            if msg.type is aiohttp.WSMsgType.BINARY:
                early.append(msg.data)
                continue
            if msg.type is aiohttp.WSMsgType.TEXT:
                control = _control_frame(msg.data)
                if control is None:
                    early.append(msg.data.encode())
                    continue
                kind = control.get("type")
                if kind == "ready":
                    return early
                if kind == "error":
                    raise ProviderError(
                        "the Worker could not open a terminal: "
                        + redact(_text(control.get("message"))),
                        retryable=False,
                    )
                if kind == "exit":
                    raise ProviderError(
                        "the Worker's terminal exited before it was ready "
                        f"(code {control.get('code')!r})",
                        retryable=True,
                    )
                continue  # an unknown control frame: not ours to act on
            raise ConnectionLostError(
                f"the terminal WebSocket closed before it was ready ({_close_reason(ws, msg)})"
            )

    async def next_event(self) -> TerminalEvent:
        """The next output, exit, error or close."""
        if self._early:
            return TerminalEvent("output", data=self._early.pop(0))
        while True:
            msg = await self.ws.receive()
            if msg.type is aiohttp.WSMsgType.BINARY:
                return TerminalEvent("output", data=msg.data)
            if msg.type is aiohttp.WSMsgType.TEXT:
                control = _control_frame(msg.data)
                if control is None:
                    return TerminalEvent("output", data=msg.data.encode())
                kind = control.get("type")
                if kind == "exit":
                    return TerminalEvent("exit", code=_exit_code(control.get("code")))
                if kind == "error":
                    return TerminalEvent("error", message=_text(control.get("message")))
                continue  # `ready` again, or a control frame we do not know
            if msg.type in (aiohttp.WSMsgType.PING, aiohttp.WSMsgType.PONG):
                continue
            return TerminalEvent("closed", message=_close_reason(self.ws, msg))


def _control_frame(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        return value
    return None


def _text(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:MAX_DETAIL_CHARS]


def _exit_code(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    # Some runtimes report a death by signal N as -N: the contract says 128+N.
    return 128 - value if value < 0 else value


def _close_reason(ws: aiohttp.ClientWebSocketResponse, msg: aiohttp.WSMessage) -> str:
    if msg.type is aiohttp.WSMsgType.ERROR:
        return f"connection error: {type(msg.data).__name__}"
    code = ws.close_code
    return f"closed by the Worker, code {code}" if code is not None else "connection dropped"


@dataclass(eq=False)
class _PtyHandle:
    """Our state for one process: its trap, socket and reader task."""

    trap: ShellTrap
    session_id: str
    session_confirmed: bool = False
    terminal: WorkerTerminal | None = None
    ws: aiohttp.ClientWebSocketResponse | None = None
    reader: asyncio.Task[None] | None = None
    errors: list[str] = field(default_factory=list)
    closing: bool = False
    shell_pid: int | None = None
    pid_scan: bytes = b""

    def scan_for_pid(self, raw: bytes) -> None:
        """Look for the shell's pid marker in the output before the trap's start."""
        self.pid_scan = (self.pid_scan + raw)[-_MAX_PID_SCAN:]
        match = re.search(_PID_MARKER % self.trap.token.encode(), self.pid_scan)
        if match is not None:
            self.shell_pid = int(match.group(1))
            self.pid_scan = b""


class CloudflareSession(BaseSandboxSession):
    """Runs commands in a sandbox of a user-deployed Cloudflare Sandbox Worker.

    Options:

    - `worker_url`: the Worker's base URL (else `$CLOUDFLARE_SANDBOX_WORKER_URL`);
    - `api_key`: the Worker's bearer key (else `$CLOUDFLARE_SANDBOX_API_KEY`);
    - `sandbox_id`: attach to this existing sandbox instead of creating one;
    - `keep`: do not delete the sandbox on close (by default it is deleted, whether it
      was created or attached to);
    - `request_timeout_s` (default 60): limit for each plain HTTP request;
    - `connect_timeout_s` (default 15): limit for opening a connection;
    - `ready_timeout_s` (default 30): limit for a terminal's WebSocket handshake and
      `ready` frame;
    - `heartbeat_s` (default 30): WebSocket ping interval, so a silently dead connection
      ends its process instead of hanging (None disables it);

    plus the base session's options.
    """

    backend_name = "cloudflare"

    def __init__(
        self,
        *,
        worker_url: str | None = None,
        api_key: str | None = None,
        sandbox_id: str | None = None,
        keep: bool = False,
        request_timeout_s: float = 60.0,
        connect_timeout_s: float = 15.0,
        ready_timeout_s: float = 30.0,
        heartbeat_s: float | None = 30.0,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        url_text = require_credential(
            worker_url, WORKER_URL_ENV, backend="cloudflare", what="the Worker's URL (worker_url)"
        )
        key = require_credential(
            api_key, API_KEY_ENV, backend="cloudflare", what="the Worker's API key (api_key)"
        )
        self._key = Secret(key)
        try:
            url = URL(url_text)
        except (TypeError, ValueError):
            url = URL()
        if url.scheme not in ("http", "https") or not url.host:
            # The URL itself is not shown: it could carry a token of its own.
            raise InvalidArgumentError("worker_url must be an http:// or https:// URL")
        if sandbox_id is not None and (
            not isinstance(sandbox_id, str) or not SANDBOX_ID_RE.fullmatch(sandbox_id)
        ):
            # The bridge answers 400 for any other id (routes.ts): say so before asking.
            raise InvalidArgumentError(
                "sandbox_id must be 1 to 128 characters from a-z and 2-7 (the bridge's "
                "sandbox id format)"
            )
        for name, value in (
            ("request_timeout_s", request_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("ready_timeout_s", ready_timeout_s),
        ):
            arguments.check_seconds(name, value)
        arguments.check_seconds("heartbeat_s", heartbeat_s, allow_none=True)
        self._api_root = url.with_query(None).with_fragment(None).with_user(None)
        self._origin = f"{url.scheme}://{url.host}" + (f":{url.port}" if url.explicit_port else "")
        self._requested_id = sandbox_id
        self.keep = bool(keep)
        self.request_timeout_s = float(request_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.ready_timeout_s = float(ready_timeout_s)
        self.heartbeat_s = heartbeat_s
        self._http: aiohttp.ClientSession | None = None
        self._sandbox_id: str | None = None
        self._create_task: asyncio.Future[tuple[int, bytes]] | None = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} backend={self.backend_name!r} state={self.state.value} "
            f"worker={self._origin!r} sandbox={self._sandbox_id!r} "
            f"processes={len(self.pty_processes())}>"
        )

    @property
    def sandbox_id(self) -> str | None:
        """The id of the sandbox in use (after start)."""
        return self._sandbox_id

    # ---- plumbing ------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key.reveal()}"}

    def _url(self, *segments: str) -> URL:
        path = "/".join(_quote_segment(s) for s in ("v1", "sandbox", *segments))
        base = self._api_root.raw_path.rstrip("/")
        return self._api_root.with_path(f"{base}/{path}", encoded=True)

    def _sandbox_url(self, *segments: str) -> URL:
        if self._sandbox_id is None:
            raise ProviderError("the sandbox has not been created", retryable=False)
        return self._url(self._sandbox_id, *segments)

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise ProviderError("the Worker connection is closed", retryable=False)
        return self._http

    def _detail(self, body: bytes) -> str:
        """A short, redacted description of an error body (JSON `error`/`message`, else
        the text itself)."""
        text = body[:4096].decode("utf-8", "replace").strip()
        with contextlib.suppress(ValueError):
            value = json.loads(text)
            if isinstance(value, dict):
                for key in ("error", "message", "detail"):
                    if isinstance(value.get(key), str):
                        text = value[key]
                        break
        return self._key.redact(text)[:MAX_DETAIL_CHARS]

    def _status_error(self, status: int, what: str, body: bytes = b"") -> ProviderError:
        detail = self._detail(body)
        suffix = f": {detail}" if detail else ""
        if status == 401:
            return ProviderError(
                f"could not {what}: the Worker rejected the API key (HTTP 401); check "
                f"{API_KEY_ENV} / api_key{suffix}",
                retryable=False,
            )
        if status == 403:
            return ProviderError(
                f"could not {what}: forbidden by the Worker (HTTP 403){suffix}", retryable=False
            )
        if status == 404:
            return ProviderError(f"could not {what}: not found (HTTP 404){suffix}", retryable=False)
        retryable = status in RETRYABLE_STATUSES
        busy = " (the Worker is unavailable; try again)" if retryable else ""
        return ProviderError(f"could not {what}: HTTP {status}{busy}{suffix}", retryable=retryable)

    def _transport_error(self, what: str, exc: BaseException) -> ProviderError:
        # Only the type and the (redacted) text: the exception object may reference the
        # request and its headers, so it is never attached to our error.
        text = self._key.redact(str(exc))[:MAX_DETAIL_CHARS]
        return ProviderError(
            f"could not {what}: {type(exc).__name__}: {text}"
            if text
            else f"could not {what}: {type(exc).__name__}",
            retryable=True,
        )

    async def _call(
        self,
        method: str,
        url: URL,
        what: str,
        *,
        json_body: Any = None,
        data: bytes | None = None,
        special: dict[int, SandboxError] | None = None,
        accept: frozenset[int] = frozenset(),
    ) -> tuple[int, bytes]:
        """One plain request: returns (status, body) for a 2xx or an `accept`ed status;
        raises the `special` error for its status, else the mapped provider error."""
        http = self._client()
        failure: SandboxError | None = None
        status, body = 0, b""
        try:
            async with asyncio.timeout(self.request_timeout_s):
                async with http.request(
                    method,
                    url,
                    headers=self._headers(),
                    json=json_body,
                    data=data,
                    allow_redirects=False,
                ) as resp:
                    status = resp.status
                    body = await resp.read()
        except TimeoutError:
            failure = ProviderError(
                f"could not {what}: the Worker did not answer within {self.request_timeout_s:g}s",
                retryable=True,
            )
        except aiohttp.ClientError as exc:
            failure = self._transport_error(what, exc)
        if failure is not None:
            raise failure
        if 200 <= status < 300 or status in accept:
            return status, body
        if special and status in special:
            raise special[status]
        raise self._status_error(status, what, body)

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        self._sandbox_id = None
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.connect_timeout_s, connect=self.connect_timeout_s
            ),
        )
        if self._requested_id is not None:
            # The id is adopted only once the check succeeded: a failed attach must not
            # make the cleanup delete a sandbox we never held.
            _, body = await self._call(
                "GET", self._url(self._requested_id, "running"), "attach to the sandbox"
            )
            # The bridge answers 200 either way; `running` says whether the sandbox's
            # container answered a `true` exec.
            if _json_object(body.decode("utf-8", "replace")).get("running") is not True:
                raise ProviderError(
                    f"could not attach to the sandbox {self._requested_id!r}: it is not "
                    "running (stopped, or no such sandbox)",
                    retryable=False,
                )
            self._sandbox_id = self._requested_id
            return
        # The create runs as our own task: if this caller is cancelled after the Worker
        # made the sandbox, `_stop_backend` waits for the answer and deletes it.
        create = asyncio.ensure_future(
            self._call("POST", self._url(), "create a sandbox", json_body={})
        )
        self._create_task = create
        _, body = await asyncio.shield(create)
        self._create_task = None
        self._sandbox_id = _created_id(body)
        logger.debug("created cloudflare sandbox %s", self._sandbox_id)

    async def _stop_backend(self) -> None:
        create, self._create_task = self._create_task, None
        if create is not None and self._sandbox_id is None:
            await asyncio.wait({create})
            if not create.cancelled() and create.exception() is None:
                with contextlib.suppress(ProviderError):
                    self._sandbox_id = _created_id(create.result()[1])
        await self._delete_and_release()

    async def _delete_and_release(self) -> None:
        http, sandbox_id = self._http, self._sandbox_id
        try:
            if http is not None and sandbox_id is not None and not self.keep:
                # Idempotence: forget the id first, so the delete is attempted only once.
                self._sandbox_id = None
                status, _ = await self._call(
                    "DELETE", self._url(sandbox_id), "delete the sandbox", accept=frozenset({404})
                )
                logger.debug("deleted cloudflare sandbox %s (HTTP %d)", sandbox_id, status)
        finally:
            self._http = None
            if http is not None:
                await http.close()

    # ---- one-shot commands ---------------------------------------------------------

    async def _exec(
        self, spec: CommandSpec, timeout: float | None, capture: ExecCapture
    ) -> ExecResult:
        """One `exec` request; its SSE stream is decoded chunk by chunk straight into
        the bounded capture. The bridge does not stop a command whose client went away,
        so one that did not finish is killed through its tag."""
        capture.check = CommandCheck.needed(spec, cwd=spec.cwd)
        tag = f"{EXEC_TAG_VAR}={secrets.token_hex(12)}"
        body: dict[str, Any] = {"argv": ["env", tag, *_exec_argv(spec, capture.check)]}
        if timeout is not None:
            body["timeout_ms"] = int(timeout * 1000) + SERVER_TIMEOUT_GRACE_MS
        http = self._client()
        url = self._sandbox_url("exec")
        resp: aiohttp.ClientResponse | None = None
        failure: SandboxError | None = None
        code: int | None = None
        reusable = False
        finished = False
        try:
            async with asyncio.timeout(timeout) as deadline:
                try:
                    resp = await http.post(
                        url, headers=self._headers(), json=body, allow_redirects=False
                    )
                    if resp.status != 200:
                        failure = self._status_error(
                            resp.status, "run the command", await resp.content.read(4096)
                        )
                    else:
                        code = await self._read_exec_stream(resp, capture)
                        finished = True
                        reusable = resp.content.at_eof()
                except _ExecFailed as exc:
                    failure = exc.as_error(timeout, spec, capture)
                except aiohttp.ClientError as exc:
                    if resp is not None and resp.status == 200:
                        failure = ConnectionLostError(
                            "the command's output stream broke before its exit status "
                            f"arrived ({type(exc).__name__})"
                        )
                    else:
                        failure = self._transport_error("run the command", exc)
        except TimeoutError:
            if not deadline.expired():
                raise
            failure = capture.timeout_error(spec.display, timeout)
        finally:
            if resp is not None:
                if reusable:
                    resp.release()
                else:
                    resp.close()
            if not finished and (resp is None or resp.status == 200):
                # Cancelled, timed out or cut off: the command may still run.
                await self._kill_exec(tag)
        if failure is not None:
            raise failure
        assert code is not None
        return capture.result(code)

    async def _kill_exec(self, tag: str) -> None:
        """Kill every process carrying `tag` (a one-shot command and what it started)."""
        try:
            await self._control(
                ["sh", "-c", _KILL_TAGGED, "sh", tag],
                "stop the command",
                limit=min(KILL_TIMEOUT_S, self.request_timeout_s),
            )
        except SandboxError as exc:
            logger.debug("cloudflare: could not kill a command: %s", exc)

    async def _control(
        self, argv: list[str], what: str, *, limit: float | None = None
    ) -> tuple[int, bytes]:
        """Run a short command of our own (kill, stat) and return (status, stdout),
        within `limit` seconds (default: the request timeout)."""
        limit = self.request_timeout_s if limit is None else limit
        http = self._client()
        out = bytearray()
        failure: SandboxError | None = None
        code: int | None = None
        try:
            async with asyncio.timeout(limit):
                async with http.post(
                    self._sandbox_url("exec"),
                    headers=self._headers(),
                    json={"argv": argv},
                    allow_redirects=False,
                ) as resp:
                    if resp.status != 200:
                        failure = self._status_error(
                            resp.status, what, await resp.content.read(4096)
                        )
                    else:
                        decoder = SseDecoder()
                        async for chunk in resp.content.iter_any():
                            for event in decoder.feed(chunk):
                                if event.event == "stdout" and len(out) < MAX_CONTROL_OUTPUT:
                                    out += binascii.a2b_base64(
                                        event.data.encode("ascii"), strict_mode=False
                                    )
                                elif event.event == "exit":
                                    payload = _json_object(event.data)
                                    code = _exit_code(payload.get("exit_code"))
                                elif event.event == "error":
                                    failure = ProviderError(
                                        f"could not {what}: the Worker reported an error",
                                        retryable=False,
                                    )
        except TimeoutError:
            failure = ProviderError(
                f"could not {what}: the Worker did not answer within {limit:g}s",
                retryable=True,
            )
        except (aiohttp.ClientError, binascii.Error, UnicodeEncodeError) as exc:
            failure = self._transport_error(what, exc)
        if failure is None and code is None:
            failure = ConnectionLostError(f"could not {what}: no exit status arrived")
        if failure is not None:
            raise failure
        assert code is not None
        return code, bytes(out)

    async def _read_exec_stream(self, resp: aiohttp.ClientResponse, capture: ExecCapture) -> int:
        decoder = SseDecoder()
        async for chunk in resp.content.iter_any():
            for event in decoder.feed(chunk):
                code = self._exec_event(event, capture)
                if code is not None:
                    return code
        for event in decoder.finish():
            code = self._exec_event(event, capture)
            if code is not None:
                return code
        raise ConnectionLostError(
            "the command's output stream ended without an exit status (transport error)"
        )

    def _exec_event(self, event: SseEvent, capture: ExecCapture) -> int | None:
        if event.event in ("stdout", "stderr"):
            try:
                data = binascii.a2b_base64(event.data.encode("ascii"), strict_mode=False)
            except (binascii.Error, UnicodeEncodeError):
                raise ProviderError(
                    f"the Worker sent a malformed {event.event} event (not base64)",
                    retryable=False,
                ) from None
            (capture.add_stdout if event.event == "stdout" else capture.add_stderr)(data)
            return None
        if event.event == "exit":
            payload = _json_object(event.data)
            raw = payload.get("exit_code", payload.get("exitCode", payload.get("code")))
            code = _exit_code(raw)
            if code is None:
                raise ProviderError(
                    "the Worker sent an exit event without an exit code", retryable=False
                )
            return code
        if event.event == "error":
            payload = _json_object(event.data)
            message = payload.get("error", payload.get("message", event.data))
            raise _ExecFailed(self._key.redact(_text(message)), bool(payload.get("timeout")))
        return None  # keep-alives and events we do not know

    # ---- processes -----------------------------------------------------------------

    async def _spawn_process(self, entry: PtyEntry) -> None:
        spec = entry.spec
        # The session is named here, before it exists, and recorded at once: if this
        # call is cancelled while the create is in flight, the teardown still knows
        # which session to delete.
        handle = _PtyHandle(
            trap=ShellTrap(report_exit=True), session_id=f"sandbox-py-{secrets.token_hex(8)}"
        )
        entry.handle = handle
        await self._call(
            "POST",
            self._sandbox_url("session"),
            "create a terminal session",
            json_body={"id": handle.session_id},
        )
        handle.session_confirmed = True
        url = self._sandbox_url("pty").with_query(cols=str(spec.cols), rows=str(spec.rows))
        http = self._client()
        failure: SandboxError | None = None
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                try:
                    handle.ws = await http.ws_connect(
                        url,
                        headers={**self._headers(), "Session-Id": handle.session_id},
                        heartbeat=self.heartbeat_s,
                        max_msg_size=0,
                        timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0),
                    )
                    early = await WorkerTerminal.wait_ready(handle.ws, self._key.redact)
                except aiohttp.WSServerHandshakeError as exc:
                    failure = self._status_error(exc.status, "open a terminal")
                except aiohttp.ClientError as exc:
                    failure = self._transport_error("open a terminal", exc)
        except TimeoutError:
            failure = ProviderError(
                f"could not open a terminal: not ready within {self.ready_timeout_s:g}s",
                retryable=True,
            )
        if failure is not None:
            raise failure
        assert handle.ws is not None
        handle.terminal = WorkerTerminal(handle.ws, early)
        handle.reader = asyncio.create_task(self._pump(entry, handle))
        check = CommandCheck.needed(spec.command, cwd=spec.command.cwd, token=handle.trap.token)
        # The shell's pid first (so a terminate can kill its whole session), then the
        # trapped command, isolated: an interactive shell drops the rest of a line after
        # Ctrl-C, which would lose the end marker.
        line = f"printf '\\036P%s:%d\\036' {handle.trap.token} $$; " + handle.trap.line(
            _pty_command(spec.command, check),
            tty=spec.tty,
            isolate=True,
            announced=check is not None,
        )
        await self._send(handle, line.encode())
        if check is not None:
            await wait_for_verdict(entry, handle.trap, check)

    async def _pump(self, entry: PtyEntry, handle: _PtyHandle) -> None:
        """The reader: moves terminal output through the trap into the entry until the
        trap's end marker (the command's status) or the socket's end. An `exit` frame
        (older bridges) after the marker changes nothing; one before it means the
        shell died without reporting."""
        terminal = handle.terminal
        trap = handle.trap
        assert terminal is not None
        try:
            while True:
                event = await terminal.next_event()
                if event.kind == "output":
                    if handle.shell_pid is None and not trap.started:
                        handle.scan_for_pid(event.data)
                    if trap.done:
                        continue
                    entry.feed(trap.feed(event.data))
                    if trap.done:
                        assert trap.exit_code is not None
                        entry.report_exit(trap.exit_code)
                        entry.report_eof()
                elif event.kind == "exit":
                    if not trap.done and not handle.closing:
                        entry.feed(trap.flush())
                        entry.report_lost(
                            "the Worker's terminal exited before the command's status arrived"
                        )
                    return
                elif event.kind == "error":
                    message = self._key.redact(event.message)
                    handle.errors.append(message)
                    logger.warning("cloudflare terminal error: %s", message)
                    eol = "\r\n" if entry.tty else "\n"
                    note = f"{eol}[sandbox: the Worker reported an error: {message}]{eol}"
                    entry.feed(note.encode())
                else:
                    if not entry.exited and not handle.closing:
                        last = f"; last error: {handle.errors[-1]}" if handle.errors else ""
                        entry.report_lost(
                            "the terminal WebSocket to the Cloudflare Worker closed before "
                            f"the process exited ({event.message}{last})"
                        )
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a reader must end its process, never die silently
            entry.report_lost(
                f"the terminal connection to the Cloudflare Worker failed ({type(exc).__name__})"
            )

    async def _send(self, handle: _PtyHandle, data: bytes) -> None:
        ws = handle.ws
        failure: SandboxError | None = None
        if ws is None or ws.closed:
            failure = ConnectionLostError("the terminal connection to the Worker is closed")
        else:
            try:
                await ws.send_bytes(data)
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                failure = ConnectionLostError(
                    f"could not write to the terminal: {type(exc).__name__}"
                )
        if failure is not None:
            raise failure

    async def _write_stdin(self, entry: PtyEntry, data: bytes) -> None:
        await self._send(entry.handle, data)

    async def _resize(self, entry: PtyEntry, rows: int, cols: int) -> None:
        handle: _PtyHandle = entry.handle
        ws = handle.ws
        failure: SandboxError | None = None
        if ws is None or ws.closed:
            failure = ConnectionLostError("the terminal connection to the Worker is closed")
        else:
            try:
                await ws.send_str(json.dumps({"type": "resize", "cols": cols, "rows": rows}))
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                failure = ConnectionLostError(
                    f"could not resize the terminal: {type(exc).__name__}"
                )
        if failure is not None:
            raise failure

    async def _interrupt(self, entry: PtyEntry) -> None:
        # Also for tty=False: the command still runs on the Worker's terminal (with echo
        # and output processing off but signals on), as the foreground process group
        # after the shell exec'd it, so the line discipline turns ^C into SIGINT.
        await self._send(entry.handle, b"\x03")

    async def _terminate_pty_entry(self, entry: PtyEntry) -> None:
        """Kill the session's tree, delete the session, then close the socket: closing
        it alone would leave the shell and the command running (pty-ws-handler.ts
        `onClose` only unsubscribes), and deleting the session only ends its shell."""
        handle: _PtyHandle | None = entry.handle
        if handle is None:
            return
        handle.closing = True
        failure: SandboxError | None = None
        if handle.shell_pid is not None and self._http is not None:
            try:
                await self._control(
                    ["sh", "-c", _KILL_SESSION, "sh", str(handle.shell_pid)],
                    "stop the terminal's processes",
                )
            except SandboxError as exc:
                # The session delete below still ends the shell.
                logger.warning("cloudflare: could not kill a terminal's processes: %s", exc)
        if self._http is not None and self._sandbox_id is not None:
            try:
                await self._call(
                    "DELETE",
                    self._sandbox_url("session", handle.session_id),
                    "end the terminal session",
                )
            except SandboxError as exc:
                # A session whose create never answered may not exist: that is no failure.
                if handle.session_confirmed and exc.retryable is False:
                    failure = exc
                else:
                    # Unconfirmed (may not exist) or the Worker's busy/502 answer: the
                    # sandbox delete at close ends the session anyway.
                    logger.warning("cloudflare: terminal session not deleted: %s", exc)
        ws = handle.ws
        if ws is not None and not ws.closed:
            # Close with the reader still waiting: aiohttp wakes its receive() and does
            # the close handshake (bounded by ws_close).
            try:
                await ws.close()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                logger.debug("closing a cloudflare terminal failed: %s", type(exc).__name__)
        reader, handle.reader = handle.reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.wait([reader])
            if not reader.cancelled() and reader.exception() is not None:
                logger.debug("cloudflare reader ended with %r", type(reader.exception()))
        if failure is not None:
            raise failure

    async def _final_drain(self, entry: PtyEntry) -> None:
        # Frames already received sit in aiohttp's queue: let the reader take them.
        for _ in range(3):
            await asyncio.sleep(0)

    # ---- files ---------------------------------------------------------------------

    async def _stat(self, relative: str) -> Entry | None:
        """What `relative` (to /workspace, the exec's cwd) names, by a `stat` exec."""
        code, out = await self._control(
            ["sh", "-c", _STAT, "sh", "./" + relative], f"look at {relative!r}"
        )
        kind, _, size = out.decode("utf-8", "replace").strip().partition("|")
        if code != 0 or kind == "none":
            return None
        if kind == "symlink":
            return Entry("symlink")
        known = int(size) if size.isdigit() else None
        if kind.startswith("regular"):
            return Entry("file", known)
        return Entry("dir" if kind == "directory" else "other")

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        """Stat first (the bridge would open a FIFO and wait), then GET the file."""
        relative = _workspace_relative(path)
        size = await regular_file(self._stat, relative, write=False, shown=path)
        if size is not None and size > max_bytes:
            raise FileTooLargeError.over(path, size, max_bytes)
        _, body = await self._call(
            "GET",
            self._file_url(relative),
            f"read {path!r}",
            special={
                404: SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}"),
                403: WorkspacePathError(f"path {path!r} is outside the sandbox's /workspace"),
            },
        )
        if len(body) > max_bytes:
            raise FileTooLargeError.over(path, len(body), max_bytes)
        return body

    async def _write_file(self, path: str, data: bytes) -> None:
        """Stat first (refusing what is not a regular file), then PUT the bytes; a
        failed PUT under a file is explained as such."""
        relative = _workspace_relative(path)
        await regular_file(self._stat, relative, write=True, shown=path)
        try:
            await self._call(
                "PUT",
                self._file_url(relative),
                f"write {path!r}",
                data=data,
                special={
                    403: WorkspacePathError(f"path {path!r} is outside the sandbox's /workspace")
                },
            )
        except ProviderError as exc:
            raise await explain_write_failure(self._stat, relative, exc) from None

    def _file_url(self, relative: str) -> URL:
        """The bridge resolves ``'/' + <path>``: a workspace path is sent as
        ``workspace/<relative>``, each segment percent-encoded on its own."""
        url = self._sandbox_url("file")
        segments = ["workspace", *([] if relative == "." else relative.split("/"))]
        encoded = "/".join(_quote_segment(s) for s in segments)
        return url.with_path(f"{url.raw_path}/{encoded}", encoded=True)


def _workspace_relative(path: str) -> str:
    """`path` relative to /workspace, resolved lexically as the bridge does
    (helpers.ts `resolveWorkspacePath`); raises `WorkspacePathError` outside it."""
    absolute = path if path.startswith("/") else f"{WORKSPACE}/{path}"
    resolved = posixpath.normpath(absolute)
    if resolved.startswith("//"):
        resolved = resolved[1:]
    if resolved == WORKSPACE:
        return "."
    if resolved.startswith(WORKSPACE + "/"):
        return resolved[len(WORKSPACE) + 1 :]
    raise WorkspacePathError(
        f"path {path!r} is outside the sandbox's /workspace (the only place the "
        "Cloudflare bridge reads and writes files)"
    )


class _ExecFailed(ProviderError):
    """Internal: the exec stream ended with an `error` event."""

    def __init__(self, message: str, timed_out: bool) -> None:
        super().__init__(message, retryable=False)
        self.timed_out = timed_out or "timed out" in message or "timeout" in message.lower()

    def as_error(
        self, timeout: float | None, spec: CommandSpec, capture: ExecCapture
    ) -> SandboxError:
        if self.timed_out and timeout is not None:
            return capture.timeout_error(spec.display, timeout)
        return ProviderError(
            f"the Worker could not run the command: {self.message}", retryable=False
        )


def _quote_segment(segment: str) -> str:
    if segment in (".", ".."):
        return segment.replace(".", "%2E")
    return quote(segment, safe="")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _exec_argv(spec: CommandSpec, check: CommandCheck | None) -> list[str]:
    """The argv sent to the Worker: the command, behind the command check that applies
    `cwd` (and checks the program for `shell=False`), after `env` is set (so the
    program is looked up in the command's PATH).

    The wrappers `exec` into the command, so signals and exit statuses are its own.
    """
    argv = list(spec.argv) if check is None else check.argv(spec.argv, announce=False)
    if spec.env:
        argv = ["env", *(f"{key}={value}" for key, value in spec.env.items()), *argv]
    return argv


def _pty_command(spec: CommandSpec, check: CommandCheck | None) -> str:
    """The shell string typed (through the trap) into the Worker's terminal; with a
    check, it is what prints the trap's start marker (see `ShellTrap.line`)."""
    argv = list(spec.argv) if check is None else check.argv(spec.argv, announce=True)
    if spec.env:
        return shlex.join(["env", *(f"{k}={v}" for k, v in spec.env.items()), *argv])
    return spec.shell_command if check is None else shlex.join(argv)


def _created_id(body: bytes) -> str:
    """The new sandbox's id from the Worker's answer to a create."""
    try:
        sandbox_id = json.loads(body)["id"]
    except (ValueError, KeyError, TypeError):
        sandbox_id = None
    if not isinstance(sandbox_id, str) or not sandbox_id:
        raise ProviderError(
            "could not create a sandbox: the Worker's answer has no id", retryable=False
        )
    return sandbox_id
