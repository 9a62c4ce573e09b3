"""Processes on the sandbox's terminal WebSocket (`/terminal/ws`), one socket each.

- The terminal runs an interactive shell and never reports an exit, so the command is
  typed into it wrapped by `ShellTrap` (isolated report mode: an interactive shell drops
  the rest of a line after Ctrl-C): its exit status comes back in-band and everything
  the wrapper adds is stripped. Long lines go through a file in /tmp (dash cuts typed
  lines at 4095 bytes).
- Killing: closing the socket does not stop the shell (the server keeps a session
  without clients for ten minutes). The typed line exports the toolkit's tag, and the
  isolated trap line `exec`s its own `sh`, so the terminal session's leader (the shell's
  pid) carries the tag from then on: the toolkit's kill script, run as a one-shot exec,
  finds the whole terminal session through it. The tag is there only once the line ran,
  so a teardown first waits (briefly) for the trap's start marker.
- The socket does not close when the shell exits: the server notices only between
  client messages. So while a command runs and the terminal is silent, an empty `input`
  frame is sent every `probe_interval_s`; a shell that died without the end marker then
  gets its socket closed, and the process is reported lost.
- Output: the server reads the PTY 4096 bytes at a time and sends each read through
  `string(buf[:n])` and Go's JSON encoder, so a UTF-8 character split between reads
  arrives as one U+FFFD per byte. That is not recoverable here; the U+FFFDs are passed
  through as they are (never more of them).
- `tty=False` runs the command on real pipes inside that terminal (stdin /dev/null,
  stdout and stderr merged); Ctrl-C still reaches it through the terminal's line
  discipline, which keeps signal generation on.
- Lingering: the server forgets a session's output once its shell exits
  (`watchShellExit` closes it, a later connection to its id starts a new shell), so
  the wrapper does not exit after the end marker: it waits for the release line (the
  trap's token), which the reader types as soon as it saw the marker. A command that
  ends while no client is attached thus keeps its output and exit status in the
  session's ring until a resume reads them (`durable`), or until the server's idle
  cleanup closes the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yarl

from ...backend import CommandSpec, OutputSink
from ...errors import ConnectionLostError, ProviderError, SandboxError
from ..toolkit import (
    TAG_VARIABLE,
    CommandCheck,
    ShellTrap,
    command_line,
    grace_ticks,
    kill_script,
    new_tag,
    parse_kill_report,
    transport_error,
)
from .errors import SERVICE, api_error

logger = logging.getLogger("sandbox.blaxel")

# Longest line typed into the terminal as is. Shells that read the terminal in canonical
# mode (dash, busybox) get at most 4095 bytes per line; longer lines are written to a
# file through the filesystem API and sourced.
MAX_TYPED_LINE = 1024
# Input frames are cut to this many characters (a str slice never splits a character).
INPUT_FRAME_CHARS = 16 * 1024
# Output the SDK returns as one str is converted to bytes this many characters at a time.
TEXT_SLICE_CHARS = 1024 * 1024
# How long a teardown waits for the trap's start marker (the tag is in place then), when
# the line was typed but the marker not seen yet (a start cancelled right after).
START_WAIT_S = 2.0
# Bound on the best-effort kill of a terminal whose connection was lost.
LOST_KILL_TIMEOUT_S = 5.0
# What the terminal is sent to make the server look at the session: writing nothing to
# the PTY is harmless, and the server checks whether the shell ended after each message.
PROBE_FRAME = json.dumps({"type": "input", "data": ""})


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


def text_to_bytes(text: str) -> bytes:
    """Provider text as bytes. Lone surrogates from `surrogateescape` on the server side
    map back to the original bytes; any other lone surrogate becomes U+FFFD."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def append_text(sink: Callable[[bytes], None], text: str) -> None:
    """Append `text` as bytes (as `text_to_bytes`), a slice at a time, so that a huge
    output the SDK handed over as one str is not also held as one bytes object."""
    for at in range(0, len(text), TEXT_SLICE_CHARS):
        sink(text_to_bytes(text[at : at + TEXT_SLICE_CHARS]))


@dataclass(frozen=True)
class TerminalOptions:
    """The session's bounds that a terminal uses (see `BlaxelSession`)."""

    connect_timeout_s: float
    close_timeout_s: float
    heartbeat_s: float | None
    probe_interval_s: float
    terminate_grace_s: float
    # Bound on one message from the server (`bounds.MAX_TERMINAL_FRAME_BYTES`).
    max_frame_bytes: int


@dataclass(eq=False)
class Terminal:
    """The per-process state of one terminal WebSocket (kept in `entry.handle`)."""

    trap: ShellTrap
    session_id: str = field(default_factory=lambda: secrets.token_hex(8))
    tag: str = field(default_factory=new_tag)
    ws: aiohttp.ClientWebSocketResponse | None = None
    reader: asyncio.Task[None] | None = None
    line_sent: bool = False
    # Set once the trap's start marker was seen (the tag is in place), or can no longer
    # arrive (the reader ended).
    started: asyncio.Event = field(default_factory=asyncio.Event)
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closing: bool = False
    # A liveness probe was sent and no frame came since.
    probed: bool = False
    # The release line was typed (the lingering wrapper may exit).
    released: bool = False
    # Output bytes still to drop before showing any (a reattach skips what the earlier
    # client had returned, counted from the command's start).
    skip: int = 0

    def visible(self, shown: bytes) -> bytes:
        """`shown` (what the trap let through) minus what is still to be skipped."""
        if self.skip <= 0:
            return shown
        dropped = min(self.skip, len(shown))
        self.skip -= dropped
        return shown[dropped:]

    def typed_line(self, spec: CommandSpec, tty: bool, cwd: str, check: CommandCheck | None) -> str:
        """The line to type: the tag exported, then the trap line. With a `check`, the
        command runs behind it (it enters `cwd` and prints the trap's start marker)."""
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
        line = self.trap.line(
            command,
            tty=tty,
            cwd=None if check else cwd,
            isolate=True,
            announced=bool(check),
            linger=linger_step(self.trap.token),
        )
        return f"export {TAG_VARIABLE}={self.tag}; {line}"

    def kill_argv(self, grace_s: float) -> list[str]:
        """The toolkit's kill script for this terminal's tagged session."""
        return kill_script([self.tag], ticks=grace_ticks(grace_s))


def linger_step(token: str) -> str:
    """The wrapper's last step: read lines until the release line (`token`) or the end
    of input, so the session outlives the command until a client saw its end."""
    return f'while read -r line; do [ "$line" = {token} ] && break; done'


async def release_shell(entry: OutputSink[Terminal], timeout: float | None = None) -> None:
    """Type the release line once (best effort, within `timeout`): the lingering
    wrapper exits, and the server closes the terminal session."""
    term = entry.handle
    if not isinstance(term, Terminal) or term.released or term.ws is None or term.ws.closed:
        return
    term.released = True
    with contextlib.suppress(SandboxError, TimeoutError):
        async with asyncio.timeout(timeout):
            await send_input(entry, f"{term.trap.token}\n".encode())


async def connect(
    http: aiohttp.ClientSession,
    url: yarl.URL,
    headers: dict[str, str],
    options: TerminalOptions,
    what: str,
) -> aiohttp.ClientWebSocketResponse:
    """Open the terminal socket (trying to `what`); the URL holds the key, so no
    exception text is kept (only a refused handshake's status)."""
    error: SandboxError
    try:
        async with asyncio.timeout(options.connect_timeout_s):
            return await http.ws_connect(
                url,
                headers=headers,
                heartbeat=options.heartbeat_s,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=options.close_timeout_s),
                max_msg_size=options.max_frame_bytes,
            )
    except TimeoutError:
        error = transport_error(None, what, service=SERVICE, timed_out=True)
    except aiohttp.WSServerHandshakeError as exc:
        error = api_error(exc.status, what, "the handshake was refused")
    except (aiohttp.ClientError, OSError) as exc:
        error = transport_error(exc, what, service=SERVICE, reason=type(exc).__name__)
    raise error


async def send_frames(entry: OutputSink[Terminal], frames: Iterable[str]) -> None:
    """Send `frames` on the entry's terminal, one writer at a time."""
    term = entry.require_handle()
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


async def send_input(entry: OutputSink[Terminal], data: bytes) -> None:
    """Type `data` into the entry's terminal (in frames of `INPUT_FRAME_CHARS`)."""
    text = data.decode("utf-8", "replace")
    await send_frames(
        entry,
        (
            json.dumps({"type": "input", "data": text[at : at + INPUT_FRAME_CHARS]})
            for at in range(0, len(text), INPUT_FRAME_CHARS)
        ),
    )


class TerminalReader:
    """Pumps one terminal's frames into its entry until the socket closes, probing a
    silent terminal (see the module docstring)."""

    def __init__(
        self,
        entry: OutputSink[Terminal],
        term: Terminal,
        options: TerminalOptions,
        redact: Callable[[str], str],
    ) -> None:
        self._entry = entry
        self._term = term
        self._options = options
        self._redact = redact

    async def run(self) -> None:
        """The reader task's body: the frames, then the end (exit or loss)."""
        entry, term = self._entry, self._term
        ws = term.ws
        assert ws is not None
        reason: str | None = None
        try:
            reason = await self._pump(ws)
        except Exception as exc:  # a dropped connection must end the process, not hang it
            reason = f"reading the terminal failed ({type(exc).__name__})"
        finally:
            term.started.set()
        if term.trap.done or term.closing:
            return
        tail = term.visible(term.trap.flush())
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

    async def _pump(self, ws: aiohttp.ClientWebSocketResponse) -> str | None:
        """Feed frames to the entry until the socket closes; returns why it failed, or
        None for a plain close."""
        while True:
            try:
                msg = await ws.receive(timeout=self._options.probe_interval_s)
            except TimeoutError:
                await self._probe(ws)
                continue
            if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                self._term.probed = False
                self._on_frame(msg.data)
                if self._term.trap.done and not self._term.released:
                    await release_shell(self._entry)
            elif msg.type is aiohttp.WSMsgType.ERROR:
                if (
                    isinstance(msg.data, aiohttp.WebSocketError)
                    and msg.data.code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
                ):
                    return (
                        f"the Blaxel terminal sent a message over the bound of "
                        f"{self._options.max_frame_bytes} bytes"
                    )
                return f"the terminal connection failed ({type(msg.data).__name__})"
            elif msg.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.CLOSED,
            ):
                return None

    async def _probe(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Make the server look at a silent terminal's session: it checks whether the
        shell ended only after a client message, and then closes the socket. Skipped
        while a write is under way (that write is such a message) or once the command
        ended; a probe that cannot be sent is left to the next one."""
        term = self._term
        if term.trap.done or term.closing or term.send_lock.locked() or not term.line_sent:
            return
        async with term.send_lock:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, ConnectionError):
                async with asyncio.timeout(self._options.probe_interval_s):
                    await ws.send_str(PROBE_FRAME)
                    term.probed = True

    def _on_frame(self, payload: str | bytes) -> None:
        entry, term = self._entry, self._term
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
        if term.trap.done:
            return
        shown = term.visible(term.trap.feed(text_to_bytes(data)))
        if term.trap.started:
            term.started.set()
        if shown:
            entry.feed(shown)
        if term.trap.done:
            assert term.trap.exit_code is not None
            entry.report_exit(term.trap.exit_code)
            entry.report_eof()


def kill_command(term: Terminal, grace_s: float) -> str:
    """The one-shot command that kills the terminal's tagged session."""
    return command_line(term.kill_argv(grace_s))


def check_kill_report(stdout: str | None, what: str) -> None:
    """Raise when the kill script did not report `done` (it did not run to its end, or
    some process outlived SIGKILL)."""
    report = parse_kill_report(stdout or "")
    if report != "done":
        raise ProviderError(f"could not {what}: the kill reported {report!r}", retryable=True)


async def close(term: Terminal, close_timeout_s: float) -> None:
    """Stop the reader (awaited) and close the socket."""
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
            async with asyncio.timeout(close_timeout_s):
                await ws.close()
