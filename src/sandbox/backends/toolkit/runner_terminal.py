"""The runner's link over a terminal process of the backend's own (docs/runner.md,
"Over a terminal"), for providers whose only two-way stream into a sandbox is a
terminal with a shell in it (Blaxel's and Cloudflare's terminal sockets).

The backend spawns the bridge as it spawns any terminal process (its own socket, its
typed and trapped line, its kill), with a `LinkSink` in place of a session's record:
the terminal's output goes to a `TextLink`, not to a process table. The typed argv is
`env -u TAG PATH connect --text --start --ready TOKEN --socket SOCK`: the bridge puts
the terminal in raw mode and prints its ready line (the link drops the prompt and echo
before it and types nothing until then), then carries the protocol as base64 lines,
which survive a server that decodes the terminal's output as UTF-8 (Blaxel's does, one
replacement character per byte of a split character). The tag is taken out of the
bridge's environment, so the runner it starts (and every process of the runner) is
never found by the kill script of the link's terminal. `END_LINE` ends the bridge; the
runner and its processes stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shlex
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from ...errors import SandboxError
from ...process_entry import CommandSpec, ProcessSpec
from ...process_handle import Process
from ...runner import TextLink
from ...runner.text_link import END_LINE
from .shell import TAG_VARIABLE

H = TypeVar("H", bound=Process)

# The process id a link's terminal carries in the backend's errors and logs (no
# session process ever has it: theirs start at 1).
LINK_PROCESS_ID = 0
# What the link's terminal may hold of its output before the link reads it: the text
# link takes each chunk as it comes, so this only bounds a sink nobody reads.
LINK_OUTPUT_LIMIT = 1 << 20
# How long the bridge has to end after the end line before its terminal is killed.
CLOSE_WAIT_S = 5.0


class LinkSink(Generic[H]):
    """An `OutputSink` for the link's own terminal: every chunk of output goes to the
    `TextLink` (as text: non-ASCII ends the link), the terminal's exit or loss ends the
    link's stream. Not a session's process: nothing lists, windows or keeps it."""

    def __init__(self, spec: ProcessSpec, text: TextLink) -> None:
        self.handle: H | None = None
        self._spec = spec
        self._text = text
        self._fed = 0
        self._exit_code: int | None = None
        self._lost: str | None = None
        self._ended = False
        self._changed = asyncio.Event()
        self.sandbox_stopping = False

    @property
    def process_id(self) -> int:
        """`LINK_PROCESS_ID`: the link is no process of the session."""
        return LINK_PROCESS_ID

    @property
    def spec(self) -> ProcessSpec:
        """The bridge's command, on a terminal."""
        return self._spec

    @property
    def tty(self) -> bool:
        """Always True: the link is a terminal."""
        return True

    @property
    def stdin_open(self) -> bool:
        """False: a terminal takes input without it."""
        return False

    @property
    def output_limit(self) -> int:
        """`LINK_OUTPUT_LIMIT`."""
        return LINK_OUTPUT_LIMIT

    @property
    def exited(self) -> bool:
        """Whether the terminal's exit (or loss) was reported."""
        return self._exit_code is not None or self._lost is not None

    @property
    def exit_code(self) -> int | None:
        """The bridge's exit status, once reported."""
        return self._exit_code

    @property
    def lost_reason(self) -> str | None:
        """Why the terminal was reported lost, if it was."""
        return self._lost

    @property
    def output_done(self) -> bool:
        """Exited and the output ended."""
        return self.exited and self._ended

    @property
    def fed_position(self) -> int:
        """Bytes of output seen so far."""
        return self._fed

    @property
    def returned_position(self) -> int:
        """The same: the link takes each chunk as it comes."""
        return self._fed

    def require_handle(self) -> H:
        """The backend's handle of the link's terminal."""
        if self.handle is None:
            raise SandboxError("the runner's link has no terminal yet")
        return self.handle

    def feed(self, data: bytes) -> None:
        """The terminal's output, into the text link."""
        self._fed += len(data)
        self._text.feed_text(data.decode("ascii", "replace"))
        self._changed.set()

    def report_exit(self, exit_code: int) -> None:
        """The bridge ended: so did the link's stream."""
        if not self.exited:
            self._exit_code = exit_code
        self.report_eof()

    def report_eof(self) -> None:
        """No more output: the link's stream ends."""
        self._ended = True
        self._text.feed_eof()
        self._changed.set()

    def report_lost(self, reason: str) -> None:
        """The terminal was lost: the link ends with `reason`."""
        if not self.exited:
            self._lost = reason
        self._ended = True
        self._text.fail(ConnectionResetError(f"the runner's link was lost: {reason}"))
        self._changed.set()

    def count_input(self, accepted: int) -> None:
        """Nothing to count: the link's writes are whole lines."""

    async def wait_for_change(self, deadline: float, *, wants_data: bool) -> None:
        """Until `deadline` (loop time), new output or the end."""
        self._changed.clear()
        delay = deadline - asyncio.get_running_loop().time()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, delay)):
                await self._changed.wait()


def link_argv(path: str, sock: str, token: str) -> list[str]:
    """The bridge's argv as typed into the terminal: without the kill script's tag, in
    text mode, starting the runner when none accepts, with a ready line."""
    return [
        "env", "-u", TAG_VARIABLE,
        path, "connect", "--text", "--start", "--ready", token, "--socket", sock,
    ]  # fmt: skip


class TerminalLink(Generic[H]):
    """The runner's text link over one terminal process of the backend: `spawn` is the
    backend's own spawn of a terminal process for a sink (its handle a `Process`);
    `text` the link (reader and writer for `hello_through`)."""

    def __init__(
        self,
        spawn: Callable[[LinkSink[H]], Awaitable[None]],
        *,
        rows: int = 24,
        cols: int = 80,
        close_wait_s: float = CLOSE_WAIT_S,
    ) -> None:
        self._spawn = spawn
        self._close_wait_s = close_wait_s
        self._size = (rows, cols)
        self.token = secrets.token_hex(8)
        self.text = TextLink(self._send, self._end, close_wait_s=close_wait_s, ready=self.token)
        self.sink: LinkSink[H] | None = None

    def said(self) -> str:
        """What explains a link that never came up: the link's error, or the end of
        what the terminal showed before the bridge's ready line."""
        return self.text.error or self.text.before_ready

    async def start(self, path: str, sock: str) -> None:
        """Spawn the bridge's terminal (the sink is recorded first: a cancelled spawn
        still leaves `close` a handle to kill, if the spawn stored one)."""
        argv = link_argv(path, sock, self.token)
        command = CommandSpec(
            argv=tuple(argv),
            shell_command=shlex.join(argv),
            display="sandbox-runner connect --text",
            shell=False,
        )
        rows, cols = self._size
        self.sink = LinkSink(
            ProcessSpec(command=command, tty=True, rows=rows, cols=cols), self.text
        )
        await self._spawn(self.sink)

    async def _send(self, text: str) -> None:
        assert self.sink is not None
        await self.sink.require_handle().write(text.encode("ascii"))

    async def _end(self) -> None:
        sink = self.sink
        # Before the ready line the terminal is not raw yet: nothing is typed into it.
        if self.text.ready and sink is not None and sink.handle is not None and not sink.exited:
            await sink.handle.write(END_LINE.encode("ascii"))

    async def close(self) -> None:
        """End the bridge (the end line, once what was sent is through), wait for its
        terminal to end (bounded), then the handle's kill (the tree of a terminal that
        lingers; the socket and reader either way). The runner and its processes stay."""
        self.text.writer.close()
        await self.text.writer.wait_closed()
        sink = self.sink
        if sink is None or sink.handle is None:
            self.text.feed_eof()
            return
        # A bridge that never printed its ready line was not sent the end line: it is
        # not waited for.
        wait_s = self._close_wait_s if self.text.ready else 0.0
        deadline = asyncio.get_running_loop().time() + wait_s
        while not sink.exited and asyncio.get_running_loop().time() < deadline:
            await sink.wait_for_change(deadline, wants_data=False)
        try:
            # An ended terminal's kill only releases its socket and reader (the
            # handle's own teardown); a lingering one's kills its tree first.
            await sink.handle.kill()
        finally:
            if not self.text.ended:
                self.text.feed_eof()
