"""`Terminal`: one process on the sandbox's terminal WebSocket, the `Process` its spawn
(or a resume's reattach) stores in `entry.handle`, so the base session's hooks write,
resize, interrupt and kill through it; `TerminalReader` pumps its socket's frames into
the entry. How a terminal is typed into, probed, kept lingering and killed: `terminal`.
With the runner, `spawn_on_runner` is the spawn's twin: the runner's process, its handle
a `RunnerProcess`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar, cast

import aiohttp

from ...backend import OutputSink, Process
from ...errors import ConnectionLostError, SandboxError
from ...runner import RunnerClient
from ..toolkit import (
    CommandCheck,
    RunnerProcess,
    ShellTrap,
    new_tag,
    spawn_through_runner,
    wait_for_verdict,
)
from . import terminal
from .client import BlaxelClient
from .terminal import (
    INPUT_FRAME_CHARS,
    LOST_KILL_TIMEOUT_S,
    MAX_TYPED_LINE,
    PROBE_FRAME,
    START_WAIT_S,
    TerminalOptions,
    parse_terminal_frame,
    text_to_bytes,
)

logger = logging.getLogger("sandbox.blaxel")


async def spawn_on_runner(
    entry: OutputSink[Terminal],
    client: RunnerClient,
    env: Mapping[str, str],
    cwd: str,
    grace_s: float,
) -> None:
    """Start the entry's command (pipes or a terminal) as a process of the runner
    `client` reaches (its handle a `RunnerProcess`, killed with its tree, SIGTERM to
    SIGKILL in `grace_s`), in `cwd` with exactly `env` (`BlaxelRunner.environment`)."""
    await spawn_through_runner(
        client, cast(OutputSink[RunnerProcess], entry), env=env, cwd=cwd, grace_s=grace_s
    )


class Terminal(Process):
    """The handle of one process on its own terminal WebSocket: the terminal session's
    id, the tag its tree carries, the trap that reads the wrapper's markers, the socket
    and its reader. As a `Process` it keeps what its controls need from the spawn: the
    `sink` it reports to (its process id names it in errors; a loss bounds the kill),
    the session's `client` (the kill's exec, a long line's file), the terminal
    `options` (the kill's grace, the close's bound) and `keep` (the session keeps the
    sandbox at close: its deletion does not end this terminal)."""

    # `interrupt` types the interrupt character, as a terminal's Ctrl-C is: one method
    # serves both (the command runs in the terminal's foreground process group).
    interrupts_terminal: ClassVar[bool] = True

    def __init__(
        self,
        sink: OutputSink[Terminal],
        client: BlaxelClient,
        options: TerminalOptions,
        *,
        keep: bool,
        token: str | None = None,
        session_id: str | None = None,
        tag: str | None = None,
    ) -> None:
        self._sink = sink
        self._client = client
        self._options = options
        self._keep = keep
        self.trap = ShellTrap(report_exit=True, token=token)
        self.session_id = session_id if session_id is not None else secrets.token_hex(8)
        self.tag = tag if tag is not None else new_tag()
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.reader: asyncio.Task[None] | None = None
        self.line_sent = False
        # Set once the trap's start marker was seen (the tag is in place), or can no
        # longer arrive (the reader ended).
        self.started = asyncio.Event()
        self.send_lock = asyncio.Lock()
        self.closing = False
        # A liveness probe was sent and no frame came since.
        self.probed = False
        # The release line was typed (the lingering wrapper may exit).
        self.released = False
        # Output bytes still to drop before showing any (a reattach skips what the
        # earlier client had returned, counted from the command's start).
        self.skip = 0

    def __repr__(self) -> str:
        return f"Terminal(session_id={self.session_id}, tag={self.tag})"

    def visible(self, shown: bytes) -> bytes:
        """`shown` (what the trap let through) minus what is still to be skipped."""
        if self.skip <= 0:
            return shown
        dropped = min(self.skip, len(shown))
        self.skip -= dropped
        return shown[dropped:]

    # ---- start ---------------------------------------------------------------------

    async def start(self, cwd: str, workdir: str, sandbox_name: str) -> None:
        """The spawn: type the sink's command into a new terminal, in `cwd`; with a
        command check, wait for its verdict (the terminal then starts in `workdir`)."""
        spec = self._sink.spec
        check = CommandCheck.needed(spec.command, cwd=cwd, token=self.trap.token)
        typed = terminal.typed_line(self.trap, self.tag, spec.command, spec.tty, cwd, check)
        line = await self._line_to_type(typed)
        # With a check the terminal starts in `workdir` (it exists) and the check enters
        # `cwd`: a missing `workingDir` is not reported by the terminal.
        start_dir = cwd if check is None else workdir
        client = self._client
        http = client.http
        if http is None:
            raise SandboxError("the blaxel session is not started")
        self.ws = await terminal.connect(
            http,
            client.terminal_url(self.session_id, spec.rows, spec.cols, start_dir),
            client.auth_headers(),
            self._options,
            f"open a terminal in the Blaxel sandbox {sandbox_name!r}",
        )
        self.follow()
        await self.send_input(line.encode())
        self.line_sent = True
        if check is not None:
            await wait_for_verdict(self._sink, self.trap, check)

    async def _line_to_type(self, line: str) -> str:
        """`line` as typed, or, when too long to type, a file written through the API
        (it removes itself) and sourced."""
        if len(line.encode()) <= MAX_TYPED_LINE:
            return line
        script = f"/tmp/.sandbox-pty-{self.trap.token}"
        body = f"rm -f {script}\n{line}".encode()
        instance = self._client.sandbox()
        await self._client.call(
            "write the command to the sandbox", lambda: instance.fs.write_binary(script, body)
        )
        return f". {script}\n"

    def follow(self) -> None:
        """Start the reader task on the connected socket."""
        reader = TerminalReader(self._sink, self, self._options, self._client.redact)
        self.reader = asyncio.create_task(
            reader.run(), name=f"blaxel-terminal-{self._sink.process_id}"
        )

    # ---- the socket ----------------------------------------------------------------

    async def send_frames(self, frames: Iterable[str]) -> None:
        """Send `frames` on the terminal, one writer at a time."""
        process_id = self._sink.process_id
        ws = self.ws
        if ws is None or ws.closed:
            raise ConnectionLostError(
                f"the terminal of process {process_id} is disconnected", retryable=False
            )
        error: SandboxError | None = None
        async with self.send_lock:
            try:
                for frame in frames:
                    await ws.send_str(frame)
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                error = ConnectionLostError(
                    f"writing to the terminal of process {process_id} failed "
                    f"({type(exc).__name__})",
                    retryable=False,
                )
        if error is not None:
            raise error

    async def send_input(self, data: bytes) -> None:
        """Type `data` into the terminal (in frames of `INPUT_FRAME_CHARS`)."""
        text = data.decode("utf-8", "replace")
        await self.send_frames(
            json.dumps({"type": "input", "data": text[at : at + INPUT_FRAME_CHARS]})
            for at in range(0, len(text), INPUT_FRAME_CHARS)
        )

    async def release_shell(self, timeout: float | None = None) -> None:
        """Type the release line once (best effort, within `timeout`): the lingering
        wrapper exits, and the server closes the terminal session."""
        if self.released or self.ws is None or self.ws.closed:
            return
        self.released = True
        with contextlib.suppress(SandboxError, TimeoutError):
            async with asyncio.timeout(timeout):
                await self.send_input(f"{self.trap.token}\n".encode())

    async def close(self) -> None:
        """Stop following: the reader (awaited; a loss is no longer reported) and the
        socket. Nothing is killed and no release line typed."""
        self.closing = True
        reader = self.reader
        if reader is not None:
            reader.cancel()
            outcomes = await asyncio.gather(reader, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, Exception):
                    logger.debug("Blaxel terminal reader failed: %s", type(outcome).__name__)
        ws = self.ws
        if ws is not None and not ws.closed:
            # On timeout (or cancellation) aiohttp drops the connection itself.
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, OSError, RuntimeError):
                async with asyncio.timeout(self._options.close_timeout_s):
                    await ws.close()

    # ---- `Process` -----------------------------------------------------------------

    async def write(self, data: bytes) -> None:
        """`input` frames on the terminal."""
        await self.send_input(data)

    async def resize(self, rows: int, cols: int) -> None:
        """The terminal's `resize` message (`handler/terminal.go`; the server ignores a
        size of zero and answers nothing)."""
        await self.send_frames([json.dumps({"type": "resize", "cols": cols, "rows": rows})])

    async def interrupt(self) -> None:
        """The interrupt character, also for tty=False: the command runs in the
        terminal's foreground process group, signal generation stays on."""
        await self.send_input(b"\x03")

    async def drain(self) -> None:
        """Frames already received sit in aiohttp's queue: let the reader take them."""
        for _ in range(3):
            await asyncio.sleep(0)

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """Kill the terminal's tagged session (unless the sandbox's deletion follows),
        then stop the reader and close the socket."""
        self.closing = True
        error: SandboxError | None = None
        try:
            if self._must_kill_remotely(sandbox_stopping):
                if not self.trap.started:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(START_WAIT_S):
                            await self.started.wait()
                # A lost terminal may mean Blaxel is unreachable: do not hold the
                # window that reports the loss for long.
                lost = self._sink.lost_reason is not None
                try:
                    await self._kill_session(LOST_KILL_TIMEOUT_S if lost else None)
                except SandboxError as exc:
                    if self._sink.lost_reason is None:
                        error = exc
                    else:  # its connection was already gone: best effort only
                        logger.info("could not kill a lost Blaxel terminal: %s", exc)
        finally:
            if self.trap.done:  # the wrapper lingers until released (see `terminal`)
                await self.release_shell(self._options.close_timeout_s)
            await self.close()
        if error is not None:
            raise error

    def _must_kill_remotely(self, sandbox_stopping: bool) -> bool:
        if self.trap.done or self._client.instance is None or not self.line_sent:
            return False
        # Closing deletes the sandbox right after, which stops everything in it.
        return not (sandbox_stopping and not self._keep)

    async def _kill_session(self, timeout: float | None) -> None:
        """The toolkit's kill script for the terminal's tag, as a one-shot exec: polite
        signals, up to the options' `terminate_grace_s`, then SIGKILL."""
        what = f"stop the terminal {self.session_id}"
        client = self._client
        grace = self._options.terminate_grace_s
        instance = client.sandbox()
        response = await client.call(
            what,
            lambda: instance.process.exec(
                {
                    "command": terminal.kill_command(self.tag, grace),
                    "name": f"kill-{secrets.token_hex(6)}",
                    "wait_for_completion": True,
                    "timeout": math.ceil(grace) + 10,
                }
            ),
            timeout=timeout or min(client.api_timeout_s, grace + 30.0),
        )
        terminal.check_kill_report(response.stdout, what)


class TerminalReader:
    """Pumps one terminal's frames into its entry until the socket closes, probing a
    silent terminal (see `terminal`)."""

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
                    await self._term.release_shell()
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
