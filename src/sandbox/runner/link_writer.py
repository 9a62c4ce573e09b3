"""`LinkWriter`: the writer half of a link to the runner carried by a provider's exec.

`RunnerClient` writes to an `asyncio.StreamWriter`; where the link is a provider's exec
(a kubernetes exec channel, a Modal exec's stdin, ...), a subclass of this class stands
in for one: `write` queues, `drain` hands what is queued to the provider in order (one
sender at a time, at most `max_chunk` bytes a send), `close`/`abort` end the exec's
input once the send in flight, if any, is done (bounded: one that never returns does
not keep the link open), and `wait_closed` waits for that end. A subclass says how to
send (`_send`), whether the exec ended (`_ended`) and how to end it (`_end`).
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from typing import ClassVar, Self

# How long a close waits for the send in flight before it ends the link anyway.
CLOSE_WAIT_S = 5.0


class LinkWriter(ABC):
    """An `asyncio.StreamWriter` as far as `RunnerClient` uses one (see the module)."""

    # The most bytes one `_send` is given (None: all that is queued).
    max_chunk: ClassVar[int | None] = None

    def __init__(self) -> None:
        self._queued = bytearray()
        self._lock = asyncio.Lock()
        self._closing: asyncio.Task[None] | None = None

    @abstractmethod
    async def _send(self, data: bytes) -> None:
        """Hand `data` to the provider; `ConnectionResetError` when it cannot."""

    @abstractmethod
    def _ended(self) -> bool:
        """Whether the exec's stream ended (then nothing more can be sent)."""

    @abstractmethod
    async def _end(self) -> None:
        """End the exec's input (the bridge then exits; the runner stays)."""

    @property
    def transport(self) -> Self:
        """Itself: `abort()` is all the client asks of a transport."""
        return self

    def write(self, data: bytes) -> None:
        """Queue `data` (sent by the next `drain`)."""
        if self.is_closing():
            raise ConnectionResetError("the runner's exec stream is closed")
        self._queued += data

    async def drain(self) -> None:
        """Send everything queued, in order; returns once the provider took it."""
        async with self._lock:
            while self._queued:
                if self.is_closing():
                    raise ConnectionResetError("the runner's exec stream is closed")
                size = self.max_chunk or len(self._queued)
                data = bytes(self._queued[:size])
                del self._queued[:size]
                await self._send(data)

    def is_closing(self) -> bool:
        """True once closed (or the exec's stream ended)."""
        return self._closing is not None or self._ended()

    def close(self) -> None:
        """End the exec's input after the send in flight (nothing queued is sent)."""
        if self._closing is None:
            self._queued.clear()
            self._closing = asyncio.ensure_future(self._close())

    def abort(self) -> None:
        """The same as `close` (nothing is flushed either way)."""
        self.close()

    async def _close(self) -> None:
        acquired = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await self._lock.acquire()
                acquired = True
        try:
            await self._end()
        finally:
            if acquired:
                self._lock.release()

    async def wait_closed(self) -> None:
        """Wait until the exec's input is ended (see `_end`)."""
        if self._closing is not None:
            await asyncio.shield(self._closing)
