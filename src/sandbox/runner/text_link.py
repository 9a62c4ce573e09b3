"""The runner's protocol over a stream that carries text only (docs/runner.md, `connect
--text`): each direction is lines of standard base64 (RFC 4648, padded), each of at
most `LINE_DATA` bytes of data, ended by `\\n`.

Some providers hand a command's stdout over as decoded text (E2B decodes it as UTF-8,
replacing what is not), so the protocol's bytes cannot ride it as they are; base64 is
ASCII and survives any such decoding. `TextLink` turns such a stream into the
`asyncio.StreamReader` and writer pair `RunnerClient.open` takes: the provider's output
callback calls `feed_text`, its end `feed_eof`; the writer encodes what the client writes
and hands it, one send at a time (in order), to the provider's input call.

What the sandbox sends is not trusted: a character outside base64 or a line longer than
`MAX_LINE` ends the link (the reader raises `RunnerProtocolError`, which ends the
client), and nothing waits for a newline beyond that bound, so memory stays bounded.

Over a terminal (a bridge typed into a provider's shell, `connect --text --ready
TOKEN`), the shell's prompt and echo come first: a link made with `ready=TOKEN` drops
everything up to the bridge's ready line (at most `MAX_BEFORE_READY` characters, else
the link ends), and sends nothing before it (the terminal is in raw mode only then).
The input of such a bridge is ended by `END_LINE` (a raw terminal has no end of file).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
from collections.abc import Awaitable, Callable

from .errors import RunnerProtocolError

# The most bytes of data one line carries (the runner's `textlink::LINE_DATA`).
LINE_DATA = 48 * 1024
# The longest line accepted, its `\r\n` included (the runner's `textlink::MAX_LINE`).
MAX_LINE = LINE_DATA // 3 * 4 + 2
# How much data one call of the provider's input takes at most (a few lines).
SEND_BYTES = 4 * LINE_DATA
# The most text a terminal may show before the bridge's ready line (a prompt, the echo
# of the typed line, a login banner).
MAX_BEFORE_READY = 64 * 1024
# The line that ends the bridge's input (the runner's `textlink::END_LINE`).
END_LINE = ".\n"
# The reader's buffer limit (what `RunnerClient` reads is framed: this only bounds how
# far its reads may lag; the client reads all the time).
READER_LIMIT = 2**20


class TextLinkError(RunnerProtocolError):
    """The text from the sandbox is not what `connect --text` sends."""


def ready_line(token: str) -> str:
    """What the bridge prints once its terminal is raw (`--ready TOKEN`)."""
    return f"sandbox-runner-ready {token}"


def encode_lines(data: bytes) -> str:
    """`data` as base64 lines of at most `LINE_DATA` bytes each, each ended by `\\n`."""
    return "".join(
        binascii.b2a_base64(data[at : at + LINE_DATA]).decode("ascii")
        for at in range(0, len(data), LINE_DATA)
    )


class LineDecoder:
    """Base64 lines to bytes, fed in chunks split anywhere (a `\\r` before a `\\n` is
    allowed, empty lines are nothing). Holds at most `max_line` characters of an
    unfinished line."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._pending = ""

    def feed(self, text: str) -> bytes:
        """The bytes of every line `text` completes; `TextLinkError` on bad text."""
        if "\n" not in text:
            self._pending += text
            self._check_pending()
            return b""
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        self._check_pending()
        return b"".join(self._decode(line) for line in lines)

    def finish(self) -> bytes:
        """At the end of the stream: a last line without its `\\n` counts too."""
        rest, self._pending = self._pending, ""
        return self._decode(rest)

    def _check_pending(self) -> None:
        if len(self._pending) > self.max_line:
            raise TextLinkError(
                f"the runner's text link sent a line longer than {self.max_line} characters"
            )

    def _decode(self, line: str) -> bytes:
        if line.endswith("\r"):
            line = line[:-1]
        if len(line) + 2 > self.max_line:
            raise TextLinkError(
                f"the runner's text link sent a line of {len(line)} characters "
                f"(at most {self.max_line - 2})"
            )
        try:
            return binascii.a2b_base64(line, strict_mode=True)
        except (binascii.Error, ValueError) as exc:
            raise TextLinkError(f"the runner's text link sent what is not base64 ({exc})") from None


class TextLinkWriter:
    """The writer half (what `RunnerClient` calls on an `asyncio.StreamWriter`): `write`
    queues, `drain` encodes what is queued and sends it through the provider's input
    call, one send at a time (the lines must arrive in order), `close`/`abort` end the
    input (the bridge then exits; the runner stays).

    A send is never cancelled half-way: a provider call cut short may have delivered
    part of a line, or all of it, nobody knows, and the next line would then be
    garbage to the bridge. So each send runs as a task of its own; a cancelled `drain`
    leaves it going and the next `drain` (or the close) waits for it first. A send that
    fails breaks the link for good (`ConnectionResetError` from then on)."""

    def __init__(self, link: TextLink) -> None:
        self._link = link
        self._queued = bytearray()
        self._lock = asyncio.Lock()
        self._closing: asyncio.Task[None] | None = None
        self._sending: asyncio.Future[None] | None = None
        self._broken: str | None = None

    @property
    def transport(self) -> TextLinkWriter:
        """Itself: `abort()` is all the client asks of a transport."""
        return self

    def write(self, data: bytes) -> None:
        """Queue `data` (sent by the next `drain`)."""
        if self.is_closing():
            raise ConnectionResetError(self._broken or "the runner's text link is closed")
        self._queued += data

    async def drain(self) -> None:
        """Send everything queued; returns once the provider took it."""
        async with self._lock:
            while True:
                if self._sending is not None:
                    await asyncio.shield(self._sending)
                    self._sending = None
                if self._broken is not None:
                    raise ConnectionResetError(self._broken)
                if not self._queued:
                    return
                if self.is_closing():
                    raise ConnectionResetError("the runner's text link is closed")
                data = bytes(self._queued[:SEND_BYTES])
                del self._queued[:SEND_BYTES]
                self._sending = asyncio.ensure_future(self._send(encode_lines(data)))

    async def _send(self, text: str) -> None:
        try:
            await self._link.wait_ready()
            await self._link.send(text)
        except Exception as exc:  # whatever the provider raised: the link is over
            self._broken = f"writing to the runner's text link failed: {type(exc).__name__}"
            self._link.fail(ConnectionResetError(self._broken))

    def is_closing(self) -> bool:
        """True once closed, broken, or the link's output ended."""
        return self._closing is not None or self._broken is not None or self._link.ended

    def close(self) -> None:
        """End the link's input (after a send in flight, bounded)."""
        if self._closing is None:
            self._queued.clear()
            self._closing = asyncio.ensure_future(self._close())

    async def _close(self) -> None:
        # After the send in flight, if any (its line must not be cut by the end of the
        # input); one that never returns does not keep the link open.
        acquired = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._link.close_wait_s):
                await self._lock.acquire()
                acquired = True
                if self._sending is not None:
                    await asyncio.shield(self._sending)
        try:
            await self._link.end()
        finally:
            if acquired:
                self._lock.release()

    def abort(self) -> None:
        """The same as `close` (nothing is flushed either way)."""
        self.close()

    async def wait_closed(self) -> None:
        """Wait until the input is ended (and the link's end handled)."""
        if self._closing is not None:
            await asyncio.shield(self._closing)


class TextLink:
    """One connection to the runner over a text stream: `reader` gives the runner's
    bytes (fed by `feed_text`, ended by `feed_eof` or `fail`), `writer` takes ours
    (`send(text)` is the provider's input call, `end_input()` ends that input)."""

    def __init__(
        self,
        send: Callable[[str], Awaitable[object]],
        end_input: Callable[[], Awaitable[object]],
        *,
        max_line: int = MAX_LINE,
        close_wait_s: float = 5.0,
        ready: str | None = None,
    ) -> None:
        self.send = send
        self._end_input = end_input
        self.close_wait_s = close_wait_s
        self.reader = asyncio.StreamReader(limit=READER_LIMIT)
        self.writer = TextLinkWriter(self)
        self._decoder = LineDecoder(max_line)
        self._ending: asyncio.Future[None] | None = None
        self.error: str | None = None
        # With a token: the text before the ready line (None once it was seen).
        self._phrase = None if ready is None else ready_line(ready)
        self._before: str | None = None if ready is None else ""
        # Set once the ready line came, or the link ended before it.
        self._settled = asyncio.Event()
        self._is_ready = ready is None
        if ready is None:
            self._settled.set()

    @property
    def before_ready(self) -> str:
        """The end of what the terminal showed before the ready line (for an error
        message when the bridge never started), control characters taken out."""
        shown = self._before or ""
        return "".join(c if c.isprintable() or c == "\n" else " " for c in shown[-300:])

    @property
    def ready(self) -> bool:
        """Whether the bridge's ready line came (always, without a token)."""
        return self._is_ready

    async def wait_ready(self) -> None:
        """Until the bridge's ready line came (at once without a token); raises the
        link's error if it ended first."""
        await self._settled.wait()
        if not self._is_ready:
            raise ConnectionResetError(
                self.error or "the runner's text link ended before it was ready"
            )

    def _skip_to_ready(self, text: str) -> str | None:
        """Text before the ready line is kept (bounded) and dropped; returns what
        follows the ready line once it is complete."""
        assert self._before is not None and self._phrase is not None
        self._before += text
        at = self._before.find(self._phrase)
        if at >= 0:
            end = self._before.find("\n", at)
            if end >= 0:
                rest = self._before[end + 1 :]
                self._before = self._before[:at]
                self._is_ready = True
                self._settled.set()
                return rest
        if len(self._before) > MAX_BEFORE_READY:
            self.fail(
                TextLinkError(
                    f"the terminal showed more than {MAX_BEFORE_READY} characters and no "
                    "ready line from the runner's bridge"
                )
            )
        return None

    @property
    def ended(self) -> bool:
        """True once the stream from the runner ended (or broke)."""
        return self.reader.at_eof() or self.reader.exception() is not None

    def feed_text(self, text: str) -> None:
        """A chunk of the stream's text, split anywhere (the provider's callback)."""
        if self.ended:
            return
        if not self._is_ready:
            rest = self._skip_to_ready(text)
            if rest is None:
                return
            text = rest
        try:
            data = self._decoder.feed(text)
        except TextLinkError as exc:
            self.fail(exc)
            return
        if data:
            self.reader.feed_data(data)

    def feed_eof(self) -> None:
        """The stream ended (its last line may lack its newline)."""
        if self.ended:
            return
        if not self._is_ready:
            shown = self.before_ready.strip()
            self.fail(
                TextLinkError(
                    "the runner's bridge ended before its ready line"
                    + (f"; the terminal showed: {shown}" if shown else "")
                )
            )
            return
        try:
            data = self._decoder.finish()
        except TextLinkError as exc:
            self.fail(exc)
            return
        if data:
            self.reader.feed_data(data)
        self.reader.feed_eof()
        self._settled.set()

    def fail(self, error: Exception) -> None:
        """End the link with `error`: the client's next read raises it (a
        `RunnerProtocolError` ends the client with its message as the reason)."""
        if not self.ended:
            self.error = str(error)
            if not isinstance(error, RunnerProtocolError):
                error = RunnerProtocolError(str(error))
            self.reader.set_exception(error)
        self._settled.set()

    async def end(self) -> None:
        """End the input (the bridge exits; the runner and its processes go on). Once,
        whoever asks first; a cancelled caller leaves it going."""
        if self._ending is None:
            self._ending = asyncio.ensure_future(self._end())
        await asyncio.shield(self._ending)

    async def _end(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.close_wait_s):
                await self._end_input()
