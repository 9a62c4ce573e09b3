"""`sandbox.runner.LinkWriter` alone, over a provider's exec of ours kept in memory."""

from __future__ import annotations

import asyncio

import pytest

from sandbox.runner import LinkWriter


class MemoryExec(LinkWriter):
    """Sends into a list; a send can be held at a gate; `ended` is a switch."""

    max_chunk = 4

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.sending = asyncio.Event()
        self.ended = False
        self.end_calls = 0

    async def _send(self, data: bytes) -> None:
        self.sending.set()
        await self.gate.wait()
        if self.ended:
            raise ConnectionResetError("gone")
        self.sent.append(data)

    def _ended(self) -> bool:
        return self.ended

    async def _end(self) -> None:
        self.end_calls += 1


async def test_drain_sends_in_order_cut_at_max_chunk() -> None:
    w = MemoryExec()
    w.write(b"abcdef")
    w.write(b"gh")
    await w.drain()
    assert w.sent == [b"abcd", b"efgh"]
    assert w.transport is w


async def test_close_waits_for_the_send_in_flight_then_ends_once() -> None:
    w = MemoryExec()
    w.gate.clear()
    w.write(b"abcdefgh")
    draining = asyncio.ensure_future(w.drain())
    await w.sending.wait()
    w.close()
    w.abort()  # a second end is the same one
    assert w.is_closing()
    with pytest.raises(ConnectionResetError):
        w.write(b"x")
    await asyncio.sleep(0)
    assert w.end_calls == 0  # the send in flight comes first
    w.gate.set()
    await draining  # the rest was dropped by the close: a closed link sends nothing more
    await w.wait_closed()
    assert w.sent == [b"abcd"] and w.end_calls == 1


async def test_an_ended_exec_refuses_writes() -> None:
    w = MemoryExec()
    w.ended = True
    assert w.is_closing()
    with pytest.raises(ConnectionResetError):
        w.write(b"x")
    await w.wait_closed()  # never closed: returns at once
    assert w.end_calls == 0
