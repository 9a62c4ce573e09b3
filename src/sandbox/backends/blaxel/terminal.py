"""Processes on the sandbox's terminal WebSocket (`/terminal/ws`), one socket each:
the facts, the frames and the lines typed. The handle of one such process (a
`Process`), its reader and its spawn are in `process`.

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
import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import yarl

from ...backend import CommandSpec
from ...errors import ProviderError, SandboxError
from ..toolkit import (
    TAG_VARIABLE,
    CommandCheck,
    ShellTrap,
    command_line,
    grace_ticks,
    kill_script,
    parse_kill_report,
    transport_error,
)
from .errors import SERVICE, api_error

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


def typed_line(
    trap: ShellTrap, tag: str, spec: CommandSpec, tty: bool, cwd: str, check: CommandCheck | None
) -> str:
    """The line to type into a new terminal: the `tag` exported, then `trap`'s line.
    With a `check`, the command runs behind it (it enters `cwd` and prints the trap's
    start marker)."""
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
    line = trap.line(
        command,
        tty=tty,
        cwd=None if check else cwd,
        isolate=True,
        announced=bool(check),
        linger=linger_step(trap.token),
    )
    return f"export {TAG_VARIABLE}={tag}; {line}"


def linger_step(token: str) -> str:
    """The wrapper's last step: read lines until the release line (`token`) or the end
    of input, so the session outlives the command until a client saw its end."""
    return f'while read -r line; do [ "$line" = {token} ] && break; done'


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


def kill_command(tag: str, grace_s: float) -> str:
    """The one-shot command that kills the terminal session tagged `tag`: the
    toolkit's kill script, polite signals for `grace_s`, then SIGKILL."""
    return command_line(kill_script([tag], ticks=grace_ticks(grace_s)))


def check_kill_report(stdout: str | None, what: str) -> None:
    """Raise when the kill script did not report `done` (it did not run to its end, or
    some process outlived SIGKILL)."""
    report = parse_kill_report(stdout or "")
    if report != "done":
        raise ProviderError(f"could not {what}: the kill reported {report!r}", retryable=True)
