"""Processes on the Worker's terminals: one bridge *session* per process, its PTY
WebSocket, and the reader that moves its output through a `ShellTrap` into the entry.

`.../{id}/pty` with `Session-Id` is a WebSocket to that session's shell (pty-ws-handler.ts):
a `ready` text frame (buffered output may come before it), raw bytes both ways in binary
frames, `error` text frames, `resize` frames from us. No `exit` frame comes (older
bridges sent one; it is still accepted) and closing the socket leaves the shell running.
So each command is typed into the shell through `ShellTrap` in report mode (isolated),
and its status comes back in-band as the end marker.

`PtyHandle`, a process's handle, is a `Process`: the base session's hooks write to its
terminal, resize and interrupt it, drain its socket and kill it through its methods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ...backend import OutputSink, Process, cancel_and_wait
from ...errors import ConnectionLostError, ProviderError, SandboxError
from ..toolkit import ShellTrap
from .bounds import (
    MAX_PRE_READY,
    MAX_TYPED_LINE,
    MAX_WS_MESSAGE,
    SCRIPT_ARG_BYTES,
    SCRIPT_ARGS_PER_EXEC,
    WS_CLOSE_TIMEOUT_S,
)
from .client import WorkerClient
from .errors import exit_status, status_error, transport_failure, worker_text
from .scripts import (
    MAX_PID_SCAN,
    PID_MARKER,
    kill_session_argv,
    script_path,
    write_script_argv,
)

logger = logging.getLogger("sandbox.cloudflare")


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
        ws: aiohttp.ClientWebSocketResponse,
        redact: Callable[[str], str] = str,
        *,
        max_early: int = MAX_PRE_READY,
    ) -> list[bytes]:
        """Read frames until `ready`; return the output that came before it.

        Raises `ProviderError` for an `error` frame (its message passed through
        `redact`) or more than `max_early` bytes of output before `ready`,
        `ConnectionLostError` when the socket closes first.
        """
        early: list[bytes] = []
        kept = 0
        while True:
            msg = await ws.receive()
            data: bytes | None = None
            control: dict[str, Any] | None = None
            if msg.type is aiohttp.WSMsgType.BINARY:
                data = msg.data
            elif msg.type is aiohttp.WSMsgType.TEXT:
                control = _control_frame(msg.data)
                if control is None:
                    data = msg.data.encode()
            if data is not None:
                kept += len(data)
                if kept > max_early:
                    raise ProviderError(
                        f"the Worker sent more than {max_early} bytes before the terminal "
                        "was ready",
                        retryable=False,
                    )
                early.append(data)
                continue
            if control is not None:
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
            if _too_big(msg):
                raise ProviderError(
                    f"the terminal WebSocket closed before it was ready ({_close_reason(ws, msg)})",
                    retryable=False,
                )
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
                    return TerminalEvent("exit", code=exit_status(control.get("code")))
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
    # Unredacted here: the callers redact (they hold the key).
    return value if isinstance(value, str) else json.dumps(value)


def _too_big(msg: aiohttp.WSMessage) -> bool:
    """Whether the socket ended because a message went past `max_msg_size`."""
    return (
        msg.type is aiohttp.WSMsgType.ERROR
        and isinstance(msg.data, aiohttp.WebSocketError)
        and msg.data.code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    )


def _close_reason(ws: aiohttp.ClientWebSocketResponse, msg: aiohttp.WSMessage) -> str:
    if _too_big(msg):
        return f"the Worker sent a message larger than {MAX_WS_MESSAGE} bytes"
    if msg.type is aiohttp.WSMsgType.ERROR:
        return f"connection error: {type(msg.data).__name__}"
    code = ws.close_code
    return f"closed by the Worker, code {code}" if code is not None else "connection dropped"


@dataclass(eq=False)
class PtyHandle(Process):
    """Our state for one process: its session, trap, socket and reader task. As a
    `Process` it is what the base session's hooks write to, resize, interrupt, drain and
    kill; it keeps what those need from the spawn: the session's `client` and `keep`
    (the session keeps the sandbox at close: its deletion does not end this process)."""

    client: WorkerClient = field(repr=False)
    keep: bool
    trap: ShellTrap
    session_id: str
    session_confirmed: bool = False
    terminal: WorkerTerminal | None = None
    ws: aiohttp.ClientWebSocketResponse | None = None
    reader: asyncio.Task[None] | None = None
    errors: list[str] = field(default_factory=list)
    closing: bool = False
    drop: bool = False
    shell_pid: int | None = None
    pid_scan: bytes = b""
    # Where this client's positions start (a resume: the ref's output position and the
    # command's bytes already returned by then), and the notes of our own fed since
    # (absolute position, length): a ref counts only the command's bytes (`durable`).
    base_position: int = 0
    base_command: int = 0
    notes: list[tuple[int, int]] = field(default_factory=list)
    # Set once a kill went through whole: a second one has nothing left to do.
    killed: bool = False

    def note(self, entry: OutputSink[PtyHandle], text: bytes) -> None:
        """Feed a note of ours (not the command's output) into the entry."""
        self.notes.append((entry.fed_position, len(text)))
        entry.feed(text)

    def scan_for_pid(self, raw: bytes) -> None:
        """Look for the shell's pid marker in the output before the trap's start."""
        self.pid_scan = (self.pid_scan + raw)[-MAX_PID_SCAN:]
        match = re.search(PID_MARKER % self.trap.token.encode(), self.pid_scan)
        if match is not None:
            self.shell_pid = int(match.group(1))
            self.pid_scan = b""

    # ---- the `Process` controls ------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """Bytes to the terminal, one binary frame."""
        await send_frame(self, data, "write to the terminal")

    async def resize(self, rows: int, cols: int) -> None:
        """A `resize` control frame."""
        frame = json.dumps({"type": "resize", "cols": cols, "rows": rows})
        await send_frame(self, frame, "resize the terminal")

    async def interrupt(self) -> None:
        """^C on the terminal for tty=False too (a tty's comes through `write`): the
        command still runs on the Worker's terminal (with echo and output processing off
        but signals on), as the foreground process group after the shell exec'd it, so
        the line discipline turns ^C into SIGINT."""
        await send_frame(self, b"\x03", "write to the terminal")

    async def drain(self) -> None:
        """Frames already received sit in aiohttp's queue: let the reader take them."""
        for _ in range(3):
            await asyncio.sleep(0)

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """Kill the session's tree, delete the session, then close the socket: closing
        it alone would leave the shell and the command running (pty-ws-handler.ts
        `onClose` only unsubscribes), and deleting the session only ends its shell.
        When the sandbox is deleted next (`sandbox_stopping`, not kept), that ends
        everything in it: only our side (socket, reader) is released."""
        if self.killed:
            return
        self.closing = True
        client = self.client
        failure: SandboxError | None = None
        sandbox_goes = sandbox_stopping and not self.keep
        if not sandbox_goes and self.shell_pid is not None and client.http is not None:
            try:
                await client.control(
                    kill_session_argv(self.shell_pid), "stop the terminal's processes"
                )
            except SandboxError as exc:
                # The session delete below still ends the shell.
                logger.warning("cloudflare: could not kill a terminal's processes: %s", exc)
        if not sandbox_goes and client.http is not None and client.sandbox_id is not None:
            try:
                await client.call(
                    "DELETE",
                    client.sandbox_url("session", self.session_id),
                    "end the terminal session",
                )
            except SandboxError as exc:
                # A session whose create never answered may not exist: that is no failure.
                if self.session_confirmed and exc.retryable is False:
                    failure = exc
                else:
                    # Unconfirmed (may not exist) or the Worker's busy/502 answer: the
                    # sandbox delete at close ends the session anyway.
                    logger.warning("cloudflare: terminal session not deleted: %s", exc)
        await close_socket(self)
        if failure is not None:
            raise failure
        self.killed = True

    async def release(self) -> None:
        """Stop following the process: close its socket, stop its reader. The session,
        its shell and its command stay (pty-ws-handler.ts `onClose` only unsubscribes)."""
        self.closing = True
        await close_socket(self)


async def typed_line(client: WorkerClient, token: str, line: str) -> str:
    """What to type for `line` (one keystroke-safe shell line ending in a newline): the
    line itself when short enough to type (`MAX_TYPED_LINE`), else `. <file>` after the
    line was written to a file in /tmp that removes itself when sourced."""
    if len(line.encode()) <= MAX_TYPED_LINE:
        return line
    path = script_path(token)
    text = f"rm -f {path}\n{line}"
    parts = [text[at : at + SCRIPT_ARG_BYTES] for at in range(0, len(text), SCRIPT_ARG_BYTES)]
    for first in range(0, len(parts), SCRIPT_ARGS_PER_EXEC):
        batch = parts[first : first + SCRIPT_ARGS_PER_EXEC]
        code, _ = await client.control(
            write_script_argv(path, batch, append=first > 0), "write the command to the sandbox"
        )
        if code != 0:
            raise ProviderError(
                f"could not write the command to the sandbox (exit status {code})",
                retryable=False,
            )
    return f". {path}\n"


async def connect(
    client: WorkerClient,
    handle: PtyHandle,
    *,
    rows: int,
    cols: int,
    ready_timeout_s: float,
    heartbeat_s: float | None,
) -> list[bytes]:
    """Open the session's PTY WebSocket (kept in `handle.ws` at once, for the teardown)
    and wait for `ready`; return the output that came before it."""
    url = client.sandbox_url("pty").with_query(cols=str(cols), rows=str(rows))
    http = client.session()
    failure: SandboxError | None = None
    early: list[bytes] = []
    try:
        async with asyncio.timeout(ready_timeout_s):
            try:
                handle.ws = await http.ws_connect(
                    url,
                    headers={**client.headers(), "Session-Id": handle.session_id},
                    heartbeat=heartbeat_s,
                    max_msg_size=MAX_WS_MESSAGE,
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=WS_CLOSE_TIMEOUT_S),
                )
                early = await WorkerTerminal.wait_ready(
                    handle.ws, lambda text: worker_text(text, client.key)
                )
            except ProviderError:
                handle.drop = True  # it broke the protocol: no handshake with it
                raise
            except aiohttp.WSServerHandshakeError as exc:
                failure = status_error(exc.status, "open a terminal", b"", client.key)
            except aiohttp.ClientError as exc:
                failure = transport_failure(exc, "open a terminal")
    except TimeoutError:
        failure = transport_failure(
            None, "open a terminal", reason=f"not ready within {ready_timeout_s:g}s"
        )
    if failure is not None:
        handle.drop = True
        raise failure  # outside the except block: the aiohttp error is not chained
    return early


async def pump(
    entry: OutputSink[PtyHandle], handle: PtyHandle, redact: Callable[[str], str]
) -> None:
    """The reader: moves terminal output through the trap into the entry until the
    trap's end marker (the command's status) or the socket's end. An `exit` frame
    (older bridges) after the marker changes nothing; one before it means the shell
    died without reporting."""
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
                message = redact(event.message)
                handle.errors.append(message)
                logger.warning("cloudflare terminal error: %s", message)
                eol = "\r\n" if entry.tty else "\n"
                handle.note(
                    entry, f"{eol}[sandbox: the Worker reported an error: {message}]{eol}".encode()
                )
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


async def send_frame(handle: PtyHandle | None, data: bytes | str, what: str) -> None:
    """Send bytes (a binary frame) or a control frame (text) on the terminal socket."""
    ws = None if handle is None else handle.ws
    failure: SandboxError | None = None
    if ws is None or ws.closed:
        failure = ConnectionLostError("the terminal connection to the Worker is closed")
    else:
        try:
            if isinstance(data, bytes):
                await ws.send_bytes(data)
            else:
                await ws.send_str(data)
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            failure = ConnectionLostError(f"could not {what}: {type(exc).__name__}")
    if failure is not None:
        raise failure


async def close_socket(handle: PtyHandle) -> None:
    """Close the socket with the reader still waiting (aiohttp wakes its receive() and
    does the close handshake), then cancel and await the reader.

    The handshake reads what the Worker still sends until its close frame, each read
    bounded by ws_close: a Worker that keeps sending would hold it forever, so the whole
    close is bounded by `WS_CLOSE_TIMEOUT_S` (aiohttp drops the connection when it is
    cancelled), and a socket whose Worker broke the protocol is dropped at once."""
    ws = handle.ws
    if ws is not None and not ws.closed:
        try:
            async with asyncio.timeout(0 if handle.drop else WS_CLOSE_TIMEOUT_S):
                await ws.close()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            logger.debug("closing a cloudflare terminal failed: %s", type(exc).__name__)
    reader, handle.reader = handle.reader, None
    if reader is not None:
        await cancel_and_wait([reader])
