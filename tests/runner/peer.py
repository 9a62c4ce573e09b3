"""A scripted runner for the client's tests: the other end of a real socket pair, which
speaks the protocol well or badly as each test tells it to."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sandbox.runner import frames
from sandbox.runner.client import RunnerClient
from sandbox.runner.frames import CLIENT_TYPES, FrameReader, Stream

STEP = 10.0  # a bound on each wait of the peer itself, so a broken test fails, never hangs


class Peer:
    """The runner's end: reads client frames, sends whatever the test says."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames = FrameReader(CLIENT_TYPES)

    async def recv(self) -> frames.ClientMessage:
        """The next client message (fails the test after STEP seconds)."""
        frame = await asyncio.wait_for(self.frames.read(self.reader), STEP)
        assert frame is not None, "the client closed the connection"
        return frames.decode_from_client(frame)

    async def recv_eof(self) -> None:
        """Wait until the client closed its end."""
        while await asyncio.wait_for(self.reader.read(65536), STEP):
            pass

    def send(self, *messages: frames.RunnerMessage | bytes) -> None:
        """Send messages (or raw bytes) as they are."""
        for message in messages:
            self.writer.write(message if isinstance(message, bytes) else message.encode())

    async def flush(self) -> None:
        await asyncio.wait_for(self.writer.drain(), STEP)

    async def hello(self) -> None:
        """Answer the client's HELLO like a runner would."""
        message = await self.recv()
        assert message == frames.Hello()
        self.send(frames.HelloOk(1, "0.0-test", 4242, frames.MAX_PAYLOAD))
        await self.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()


@dataclass
class Sink:
    """Records what the client routed to one process, and any call made out of order
    (after the end): `ended()` fails on those. (An assertion raised in here would be
    caught by the client, which detaches a failing sink.)"""

    data: dict[Stream, bytearray] = field(
        default_factory=lambda: {Stream.STDOUT: bytearray(), Stream.STDERR: bytearray()}
    )
    gaps: list[tuple[int, int, Stream]] = field(default_factory=list)
    code: int | None = None
    lost_reason: str | None = None
    count: int = 0
    keep: bool = True
    violations: list[str] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    fed: asyncio.Event = field(default_factory=asyncio.Event)

    def _check(self, call: str) -> None:
        if self.done.is_set():
            self.violations.append(f"{call} after the end")

    def feed(self, data: bytes, stream: Stream) -> None:
        self._check("feed")
        if not data:
            self.violations.append("an empty feed")
        self.count += len(data)
        if self.keep:
            self.data[stream] += data
        self.fed.set()

    def gap(self, start: int, end: int, stream: Stream) -> None:
        self._check("gap")
        self.gaps.append((start, end, stream))

    def exited(self, code: int) -> None:
        self._check("exited")
        self.code = code
        self.done.set()

    def lost(self, reason: str) -> None:
        self._check("lost")
        self.lost_reason = reason
        self.done.set()

    async def ended(self) -> None:
        await asyncio.wait_for(self.done.wait(), STEP)
        assert self.violations == []


@contextlib.asynccontextmanager
async def socket_pair() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter, Peer]]:
    """A connected unix socket pair: the client's stream pair and the peer."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    peer_reader, peer_writer = await asyncio.open_unix_connection(sock=theirs)
    peer = Peer(peer_reader, peer_writer)
    try:
        yield reader, writer, peer
    finally:
        peer.close()
        writer.close()
        for w in (peer_writer, writer):
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(w.wait_closed(), STEP)


@contextlib.asynccontextmanager
async def connected(call_timeout: float = STEP) -> AsyncIterator[tuple[RunnerClient, Peer]]:
    """A client that completed its HELLO with a scripted peer."""
    async with socket_pair() as (reader, writer, peer):
        opening = asyncio.ensure_future(
            RunnerClient.open(reader, writer, timeout=STEP, call_timeout=call_timeout)
        )
        await peer.hello()
        client = await opening
        try:
            yield client, peer
        finally:
            await client.aclose()
