"""An exec's hijacked socket, read and written by the event loop without a thread.

`POST /exec/{id}/start` upgrades the HTTP connection to a raw byte stream. The SDK hands
the socket over in blocking mode; `RawStream` makes it non-blocking and reads it with
`loop.add_reader`, so 64 open PTYs cost 64 file descriptors and no thread at all. Bytes
the HTTP client had already buffered past the response headers are handed over too
(`leftover`), so nothing the process printed first is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable

READ_CHUNK = 256 * 1024
READS_PER_WAKEUP = 8
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class StreamClosedError(Exception):
    """Raised by `RawStream.write` when the socket is closed or the peer went away."""


class RawStream:
    """Loop-driven I/O on one hijacked socket.

    `on_data(bytes)` gets every chunk in order; `on_end(error)` is called once, with None
    for a clean end of stream or the socket error that ended it. `keep` holds objects that
    must live as long as the socket (the SDK's response, whose collection closes it).
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        on_data: Callable[[bytes], None],
        on_end: Callable[[BaseException | None], None],
        leftover: bytes = b"",
        keep: tuple[object, ...] = (),
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._fd = sock.fileno()
        self._on_data = on_data
        self._on_end = on_end
        self._leftover = leftover
        self._keep = keep
        self._reading = False
        self._ended = False
        self._closed = False
        self._write_lock = asyncio.Lock()
        self._write_waiter: asyncio.Future[None] | None = None

    @property
    def ended(self) -> bool:
        """True once the read side reached its end (EOF or error)."""
        return self._ended

    @property
    def closed(self) -> bool:
        """True once `close()` ran."""
        return self._closed

    def start(self) -> None:
        """Deliver the leftover bytes, then start reading on the loop."""
        self._sock.setblocking(False)
        if self._leftover:
            data, self._leftover = self._leftover, b""
            self._on_data(data)
        self._loop.add_reader(self._fd, self._on_readable)
        self._reading = True
        # A TLS socket may hold decrypted bytes that no readiness event will announce.
        self._loop.call_soon(self._on_readable)

    def _on_readable(self) -> None:
        for _ in range(READS_PER_WAKEUP):
            if self._ended or self._closed:
                return
            try:
                data = self._sock.recv(READ_CHUNK)
            except _WOULD_BLOCK:
                return
            except OSError as exc:
                self._end(exc)
                return
            if not data:
                self._end(None)
                return
            self._on_data(data)

    def drain_now(self) -> None:
        """Read whatever already arrived, without waiting."""
        if self._reading and not self._ended and not self._closed:
            self._on_readable()

    def _end(self, error: BaseException | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._stop_reading()
        self._on_end(error)

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    async def write(self, data: bytes) -> None:
        """Send all of `data`, waiting for room when the socket buffer is full."""
        async with self._write_lock:
            view = memoryview(data)
            while view:
                if self._closed:
                    raise StreamClosedError("the stream is closed")
                try:
                    sent = self._sock.send(view)
                except _WOULD_BLOCK:
                    await self._writable()
                    continue
                except OSError as exc:
                    raise StreamClosedError(f"the stream is closed: {exc}") from exc
                view = view[sent:]

    async def _writable(self) -> None:
        ready: asyncio.Future[None] = self._loop.create_future()
        self._write_waiter = ready
        self._loop.add_writer(self._fd, _resolve, ready)
        try:
            await ready
        finally:
            self._write_waiter = None
            if not self._closed:
                self._loop.remove_writer(self._fd)

    def shutdown_write(self) -> None:
        """Half-close: the process reads end-of-file on its stdin. Refused over TLS,
        where a half-close would end the TLS session the reads still need."""
        if isinstance(self._sock, ssl.SSLSocket):
            raise StreamClosedError("a TLS stream cannot be half-closed")
        if not self._closed:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stop reading and close the socket and everything kept for it. Idempotent."""
        if self._closed:
            return
        self._stop_reading()
        self._closed = True
        self._loop.remove_writer(self._fd)
        if self._write_waiter is not None:
            _resolve(self._write_waiter)  # a blocked write wakes up and sees the close
        with contextlib.suppress(OSError):
            self._sock.close()
        for obj in self._keep:
            close = getattr(obj, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()
        self._keep = ()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
