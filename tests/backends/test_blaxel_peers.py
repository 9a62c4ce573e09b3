"""blaxel against peers that send too much or too slowly: every answer, every terminal
message is bounded (`backends/blaxel/bounds.py`), every call has a deadline; the
client keeps at most about the bound, whatever the peer sends."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest

pytest.importorskip("blaxel", reason="the blaxel extra is not installed")
pytest.importorskip("aiohttp", reason="the blaxel extra is not installed")

import sandbox
from sandbox.backends.blaxel import BlaxelSession
from sandbox.testing.blaxel_server import BlaxelServer
from tests.backends.test_blaxel import make_session, server
from tests.helpers import eventually

__all__ = ["server"]

MIB = 1024 * 1024
BOUND = 1 * MIB
# What a flood sends at most here: far past the bound, so an unbounded client shows.
FLOOD = 48 * MIB
# What the client may hold beyond the bound (httpx's chunks, the SDK, the stand-in).
SLACK = 6 * MIB


@pytest.fixture
async def bounded(server: BlaxelServer, tmp_path: Path) -> AsyncIterator[BlaxelSession]:
    async with make_session(server, tmp_path, max_response_bytes=BOUND) as s:
        yield s


async def peak_while(call: Awaitable[object], error: type[BaseException]) -> tuple[int, str]:
    """Run `call`, which must raise `error`: (peak traced bytes, the error's text)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(error) as caught:
            await call
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, str(caught.value)


async def test_an_endless_exec_answer_fails_within_the_bound(
    server: BlaxelServer, bounded: BlaxelSession
) -> None:
    peer = server.flood("exec", limit=FLOOD)
    peak, text = await peak_while(bounded.exec("true"), sandbox.ProviderError)
    assert f"over the bound of {BOUND} bytes" in text
    assert peak < BOUND + SLACK, f"the client held {peak} bytes"
    assert peer.sent < FLOOD, "the client read the whole flood"
    assert (await bounded.exec("echo", "still", "fine", shell=False)).stdout == b"still fine\n"


async def test_a_huge_create_answer_fails_within_the_bound(
    server: BlaxelServer, tmp_path: Path
) -> None:
    server.flood("create", limit=FLOOD)
    s = make_session(server, tmp_path, max_response_bytes=BOUND)
    try:
        peak, text = await peak_while(s.start(), sandbox.ProviderError)
    finally:
        await s.aclose()
    assert "create the Blaxel sandbox" in text and "over the bound" in text
    assert peak < BOUND + SLACK, f"the client held {peak} bytes"


async def test_a_file_that_grew_past_max_bytes_is_too_large_not_read_whole(
    server: BlaxelServer, bounded: BlaxelSession
) -> None:
    await bounded.write_file("f", b"small")
    server.flood("read", skip=1, limit=FLOOD)  # the listing first, then the body floods
    peak, text = await peak_while(
        bounded.read_file("f", max_bytes=BOUND), sandbox.FileTooLargeError
    )
    assert "over the read limit" in text
    assert peak < BOUND + SLACK, f"the client held {peak} bytes"


async def test_a_listing_answer_is_bounded_too(
    server: BlaxelServer, bounded: BlaxelSession
) -> None:
    server.flood("read", limit=FLOOD)
    peak, text = await peak_while(bounded.read_file("f"), sandbox.ProviderError)
    assert "over the bound" in text
    assert peak < BOUND + SLACK


async def test_a_compressed_answer_is_refused_unread(
    server: BlaxelServer, bounded: BlaxelSession
) -> None:
    """Answers are asked uncompressed: decoding one could grow past any bound."""
    peer = server.flood("exec", limit=FLOOD, content_encoding="gzip")
    with pytest.raises(sandbox.ProviderError, match="compressed answer"):
        await bounded.exec("true")
    assert peer.sent < FLOOD


async def test_a_peer_that_never_answers_fails_at_the_deadline(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with make_session(server, tmp_path, call_timeout_s=2) as s:
        blocked = server.stall("read")
        with pytest.raises(sandbox.ConnectionLostError, match="did not answer in time"):
            await s.read_file("f")
        assert blocked.is_set()
        server.release()


async def test_a_trickling_peer_fails_at_the_deadline(server: BlaxelServer, tmp_path: Path) -> None:
    """One byte every 50 ms never trips a read timeout; the whole call's deadline ends
    it."""
    async with make_session(server, tmp_path, call_timeout_s=2) as s:
        peer = server.trickle("read", interval_s=0.05, limit=100_000)
        with pytest.raises(sandbox.ConnectionLostError, match="did not answer in time"):
            await s.read_file("f")
        assert peer.sent < peer.limit


async def test_a_terminal_message_over_the_bound_ends_the_process(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with make_session(server, tmp_path, max_terminal_frame_bytes=BOUND) as s:
        update = await s.pty_exec_start("echo ready; exec sleep 30", tty=True, until="ready")
        pid = update.process_id
        assert pid is not None
        assert await server.send_terminal_frame(4 * BOUND) == 1
        final = await s.pty_write_stdin(pid, "", yield_time_s=20)
        assert (final.process_id, final.exit_code) == (None, None)
        assert f"a message over the bound of {BOUND} bytes" in final.output
        assert "x" * 1000 not in final.output
    assert await eventually(lambda: server.live_processes() == 0)


async def test_terminal_output_is_unbounded_in_total(server: BlaxelServer, tmp_path: Path) -> None:
    """The bound is per message: a stream far longer than it still arrives whole."""
    async with make_session(server, tmp_path, max_terminal_frame_bytes=64 * 1024) as s:
        total = 2 * MIB
        update = await s.pty_exec_start(
            f"head -c {total} /dev/zero | tr '\\0' y | wc -c", tty=False, yield_time_s=20
        )
        assert update.exit_code == 0
        assert update.output.strip().endswith(str(total))


async def test_a_terminal_handshake_never_answered_fails_at_its_deadline(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with make_session(server, tmp_path, connect_timeout_s=2) as s:
        blocked = server.stall("terminal")
        with pytest.raises(sandbox.ConnectionLostError, match="did not answer in time"):
            await s.pty_exec_start("echo never", tty=True)
        assert blocked.is_set()
        assert s.pty_processes() == []
        server.release()
    assert await eventually(lambda: server.live_processes() == 0)
