"""`RunnerClient` against a scripted peer on a real socket pair: replies reach their
calls, output reaches its sink, and a hostile runner (garbage, stalls, floods, absurd
lengths, a connection dropped mid-call) can neither hang a call past its deadline nor
swell the client's memory."""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from sandbox.errors import InvalidArgumentError
from sandbox.runner import frames
from sandbox.runner.client import INPUT_CHUNK, INPUT_WINDOW, RunnerClient
from sandbox.runner.errors import (
    RunnerConnectionLost,
    RunnerProtocolError,
    RunnerRequestError,
    RunnerTimeout,
)
from sandbox.runner.frames import FrameType, SignalScope, Stream

from .peer import STEP, Peer, Sink, connected, socket_pair

OUT, ERR = Stream.STDOUT, Stream.STDERR


async def _spawned(client: RunnerClient, peer: Peer, process_id: int, sink: Sink) -> None:
    spawning = asyncio.ensure_future(client.spawn(process_id, ["x"], env={}, sink=sink))
    message = await peer.recv()
    assert isinstance(message, frames.Spawn)
    peer.send(frames.Spawned(process_id, 1000 + process_id))
    assert await spawning == 1000 + process_id


async def _ping_through(client: RunnerClient, peer: Peer) -> None:
    """A round trip the peer answers: everything the peer sent before is routed."""
    pinging = asyncio.ensure_future(client.ping(b"sync"))
    message = await peer.recv()
    assert isinstance(message, frames.Ping), message
    peer.send(frames.Pong(message.id, message.payload))
    await pinging


# --- the handshake ----------------------------------------------------------------------


async def test_open_says_hello_and_keeps_the_runners_answer() -> None:
    async with connected() as (client, _peer):
        assert client.hello == frames.HelloOk(1, "0.0-test", 4242, frames.MAX_PAYLOAD)
        assert not client.closed


@pytest.mark.parametrize(
    ("answer", "error", "match"),
    [
        (frames.ErrorReply(0, "protocol", "version 1 unknown"), RunnerRequestError, "version"),
        (frames.HelloOk(2, "9", 1, 4096), RunnerProtocolError, "protocol 2"),
        (frames.Pong(0, b""), RunnerProtocolError, "before HELLO_OK"),
        (b"\xff" * 20, RunnerProtocolError, "over the bound"),
        (b"", RunnerConnectionLost, "closed"),
    ],
)
async def test_a_bad_hello_answer_fails_open(
    answer: frames.RunnerMessage | bytes, error: type[Exception], match: str
) -> None:
    async with socket_pair() as (reader, writer, peer):
        opening = asyncio.ensure_future(RunnerClient.open(reader, writer, timeout=STEP))
        assert await peer.recv() == frames.Hello()
        peer.send(answer)
        if answer == b"":
            peer.close()
        with pytest.raises(error, match=match):
            await opening
        assert writer.is_closing()


async def test_a_silent_runner_fails_open_at_its_deadline() -> None:
    async with socket_pair() as (reader, writer, peer):
        with pytest.raises(RunnerTimeout, match="HELLO"):
            await RunnerClient.open(reader, writer, timeout=0.05)
        assert await peer.recv() == frames.Hello()


# --- routing ----------------------------------------------------------------------------


async def test_spawn_routes_output_gaps_and_exit_to_its_sink() -> None:
    async with connected() as (client, peer):
        sink = Sink()
        spawning = asyncio.ensure_future(
            client.spawn(
                5,
                ["sh", "-c", "x"],
                env={"A": "1"},
                sink=sink,
                tty=True,
                rows=30,
                cols=90,
                stdin_open=True,
                ring_bytes=100,
            )
        )
        request = await peer.recv()
        assert request == frames.Spawn(
            5, ("sh", "-c", "x"), {"A": "1"}, None, True, 30, 90, True, False, 100
        )
        assert client.attached == {5}
        peer.send(
            frames.Spawned(5, 99),
            frames.Output(5, OUT, 0, b"he"),
            frames.Output(5, ERR, 0, b"oops"),
            frames.Output(5, OUT, 2, b"llo"),
            frames.Gap(5, OUT, 5, 50),
            frames.Output(5, OUT, 50, b"!"),
            frames.Exit(5, 130),
        )
        assert await spawning == 99
        await sink.ended()
        assert sink.data == {OUT: b"hello!", ERR: b"oops"}
        assert sink.gaps == [(5, 50, OUT)]
        assert sink.code == 130
        assert client.attached == frozenset()


async def test_each_process_gets_its_own_output_and_calls_their_own_replies() -> None:
    async with connected() as (client, peer):
        sinks = {1: Sink(), 2: Sink()}
        for pid, sink in sinks.items():
            await _spawned(client, peer, pid, sink)
        resizing = asyncio.ensure_future(client.resize(1, 10, 20))
        signalling = asyncio.ensure_future(client.signal(2, 15, SignalScope.TREE))
        listing = asyncio.ensure_future(client.list())
        assert await peer.recv() == frames.Resize(1, 10, 20)
        assert await peer.recv() == frames.Signal(2, 15, SignalScope.TREE)
        list_request = await peer.recv()
        assert isinstance(list_request, frames.ListProcesses)
        assert list_request.id > 0x7FFF_FFFF  # request ids never meet process ids
        info = frames.ProcessInfo(1, None, ("x",), False, True, None, 0, 0)
        peer.send(
            frames.Output(2, OUT, 0, b"two"),
            frames.Listed(list_request.id, (info,)),
            frames.ErrorReply(2, "not_found", "gone"),
            frames.Output(1, OUT, 0, b"one"),
            frames.Ok(1),
        )
        await resizing
        with pytest.raises(RunnerRequestError) as refused:
            await signalling
        assert (refused.value.kind, refused.value.detail) == ("not_found", "gone")
        assert await listing == [info]
        await _ping_through(client, peer)
        assert sinks[1].data[OUT] == b"one"
        assert sinks[2].data[OUT] == b"two"


async def test_a_refused_spawn_is_not_attached() -> None:
    async with connected() as (client, peer):
        spawning = asyncio.ensure_future(client.spawn(3, ["nope"], env={}, sink=Sink()))
        await peer.recv()
        peer.send(frames.ErrorReply(3, "command_not_found", "nope: not found"))
        with pytest.raises(RunnerRequestError, match="command_not_found"):
            await spawning
        assert client.attached == frozenset()
        assert not client.closed


async def _answer_silent_call(
    peer: Peer, expected: frames.ClientMessage, *before: frames.RunnerMessage
) -> None:
    """ATTACH and DETACH are answered only when refused: the client follows each with a
    PING, and the call is done at its PONG."""
    assert await peer.recv() == expected
    barrier = await peer.recv()
    assert isinstance(barrier, frames.Ping)
    peer.send(*before, frames.Pong(barrier.id, barrier.payload))


async def test_attach_from_offsets_and_detach() -> None:
    async with connected() as (client, peer):
        sink = Sink()
        attaching = asyncio.ensure_future(
            client.attach(9, sink, stdout_offset=100, stderr_offset=7)
        )
        await _answer_silent_call(peer, frames.Attach(9, 100, 7))
        peer.send(
            frames.Gap(9, OUT, 100, 120),
            frames.Output(9, OUT, 120, b"x"),
            frames.Output(9, ERR, 7, b"y"),
        )
        await attaching
        detaching = asyncio.ensure_future(client.detach(9))
        # Output the runner sent before it took the DETACH still arrives; after, none.
        await _answer_silent_call(peer, frames.Detach(9), frames.Output(9, OUT, 121, b"z"))
        peer.send(frames.Output(9, OUT, 122, b"w"))
        await detaching
        await _ping_through(client, peer)
        assert sink.data == {OUT: b"xz", ERR: b"y"}
        assert sink.gaps == [(100, 120, OUT)]
        assert client.dropped_frames == 1
        assert not sink.done.is_set()
        assert not client.closed


async def test_attach_past_the_end_starts_where_the_stream_ends() -> None:
    """The runner starts an ATTACH past a stream's end at its end: the first chunk may
    start before the offset asked for, the next ones must follow it."""
    async with connected() as (client, peer):
        sink = Sink()
        attaching = asyncio.ensure_future(client.attach(9, sink, stdout_offset=500))
        await _answer_silent_call(peer, frames.Attach(9, 500, 0))
        await attaching
        peer.send(frames.Output(9, OUT, 20, b"ab"), frames.Output(9, OUT, 22, b"c"))
        await _ping_through(client, peer)
        assert sink.data[OUT] == b"abc"
        peer.send(frames.Output(9, OUT, 0, b"again"))
        await sink.ended()
        assert sink.lost_reason is not None and "goes back" in sink.lost_reason


@pytest.mark.parametrize("answers", [None, FrameType.ATTACH])
async def test_a_refused_attach_raises_and_is_not_attached(answers: int | None) -> None:
    async with connected() as (client, peer):
        attaching = asyncio.ensure_future(client.attach(9, Sink()))
        refusal = frames.ErrorReply(9, "not_found", "no such process", answers)
        await _answer_silent_call(peer, frames.Attach(9, 0, 0), refusal)
        with pytest.raises(RunnerRequestError, match="not_found"):
            await attaching
        assert client.attached == frozenset()
        await _ping_through(client, peer)
        assert not client.closed


async def test_replies_marked_for_their_call_pair_exactly_out_of_order() -> None:
    """INPUT is answered once written, a SIGNAL at once: with "for", a signal sent while
    input waits gets its own answer, and the input its own later failure."""
    async with connected() as (client, peer):
        await _spawned(client, peer, 4, Sink())
        writing = asyncio.ensure_future(client.write(4, b"data"))
        assert await peer.recv() == frames.Input(4, b"data")
        signalling = asyncio.ensure_future(client.signal(4, 9, SignalScope.TREE))
        assert await peer.recv() == frames.Signal(4, 9, SignalScope.TREE)
        peer.send(
            frames.Ok(4, {"delivered": True}, FrameType.SIGNAL),
            frames.ErrorReply(4, "io", "the process has ended", FrameType.INPUT),
        )
        assert await signalling is True
        with pytest.raises(RunnerRequestError, match="has ended"):
            await writing


async def test_an_answer_for_a_call_not_made_is_a_protocol_error() -> None:
    async with connected() as (client, peer):
        await _spawned(client, peer, 4, Sink())
        writing = asyncio.ensure_future(client.write(4, b"data"))
        await peer.recv()
        peer.send(frames.Ok(4, {}, FrameType.RESIZE))
        with pytest.raises(RunnerConnectionLost, match="RESIZE of id 4, which awaits none"):
            await writing


async def test_a_failing_sink_is_detached_alone() -> None:
    class Broken(Sink):
        def feed(self, data: bytes, stream: Stream) -> None:
            raise RuntimeError("sink bug")

    async with connected() as (client, peer):
        broken, fine = Broken(), Sink()
        await _spawned(client, peer, 1, broken)
        await _spawned(client, peer, 2, fine)
        peer.send(frames.Output(1, OUT, 0, b"a"), frames.Output(2, OUT, 0, b"b"))
        await broken.ended()
        assert broken.lost_reason is not None and "sink bug" in broken.lost_reason
        peer.send(frames.Output(1, OUT, 1, b"c"), frames.Output(2, OUT, 1, b"d"))
        await _ping_through(client, peer)
        assert fine.data[OUT] == b"bd"
        assert client.attached == {2}


# --- input flow control -----------------------------------------------------------------


async def test_write_keeps_at_most_a_window_of_input_unacknowledged() -> None:
    async with connected() as (client, peer):
        chunks = 10
        writing = asyncio.ensure_future(client.write(4, b"x" * (chunks * INPUT_CHUNK)))
        received = [await peer.recv() for _ in range(INPUT_WINDOW)]
        # The writer waits for an OK now: the next frame the peer reads is this PING.
        await _ping_through(client, peer)
        assert not writing.done()
        while len(received) < chunks:
            peer.send(frames.Ok(4))
            received.append(await peer.recv())
        peer.send(*[frames.Ok(4)] * INPUT_WINDOW)
        await writing
        assert all(isinstance(m, frames.Input) and m.id == 4 for m in received)
        data = b"".join(m.data for m in received if isinstance(m, frames.Input))
        assert data == b"x" * (chunks * INPUT_CHUNK)


async def test_a_runner_that_never_acknowledges_input_times_the_write_out() -> None:
    async with connected() as (client, peer):
        with pytest.raises(RunnerTimeout, match="write"):
            await client.write(4, b"y" * (100 * INPUT_CHUNK), timeout=0.2)
        # Only the window went out.
        for _ in range(INPUT_WINDOW):
            assert isinstance(await peer.recv(), frames.Input)
        await _ping_through(client, peer)
        # The late answers are taken for the abandoned chunks, not for later calls.
        peer.send(*[frames.Ok(4)] * INPUT_WINDOW)
        closing = asyncio.ensure_future(client.close_stdin(4))
        assert await peer.recv() == frames.CloseStdin(4)
        peer.send(frames.ErrorReply(4, "unsupported", "a tty has no end of input"))
        with pytest.raises(RunnerRequestError, match="unsupported"):
            await closing


async def test_a_runner_that_reads_nothing_times_the_write_out() -> None:
    async with connected() as (client, _peer):
        data = b"z" * (64 << 20)
        with pytest.raises(RunnerTimeout):
            await client.write_file("/big", data, timeout=0.3)


# --- files ------------------------------------------------------------------------------


async def test_read_file_gathers_data_until_end() -> None:
    async with connected() as (client, peer):
        reading = asyncio.ensure_future(client.read_file("/etc/x", max_bytes=10))
        request = await peer.recv()
        assert request == frames.FileRequest(
            request.id, "read", {"path": "/etc/x", "max_bytes": 10}
        )
        peer.send(
            frames.DownloadData(request.id, b"abc"),
            frames.DownloadData(request.id, b"defghij"),
            frames.DownloadEnd(request.id),
        )
        assert await reading == b"abcdefghij"
        refused = asyncio.ensure_future(client.read_file("/big", max_bytes=10))
        request = await peer.recv()
        peer.send(frames.ErrorReply(request.id, "too_large", "12 bytes"))
        with pytest.raises(RunnerRequestError, match="too_large"):
            await refused


async def test_read_file_never_holds_more_than_max_bytes() -> None:
    async with connected() as (client, peer):
        reading = asyncio.ensure_future(client.read_file("/etc/x", max_bytes=10))
        request = await peer.recv()
        peer.send(
            frames.DownloadData(request.id, b"0123456789"), frames.DownloadData(request.id, b"!")
        )
        with pytest.raises(RunnerConnectionLost, match="more than 10 bytes"):
            await reading
        assert client.closed
        await peer.recv_eof()


async def test_file_calls_send_their_ops_and_read_their_answers() -> None:
    stat = frames.FileStat("f", "/w/f", "file", 3, 0o100644, 10.0)
    async with connected() as (client, peer):
        calls = [
            (client.stat("/w/f"), "stat", {"path": "/w/f"}, frames.Ok(0, stat.as_json())),
            (
                client.list_dir("/w", max_entries=2),
                "list",
                {"path": "/w", "max_entries": 2},
                frames.Ok(0, {"entries": [stat.as_json()]}),
            ),
            (
                client.remove("/w/f", recursive=True),
                "remove",
                {"path": "/w/f", "recursive": True},
                frames.Ok(0),
            ),
            (
                client.make_dir("/w/d", parents=True),
                "make_dir",
                {"path": "/w/d", "parents": True},
                frames.Ok(0),
            ),
        ]
        results = []
        for call, op, args, answer in calls:
            task = asyncio.ensure_future(call)
            request = await peer.recv()
            assert isinstance(request, frames.FileRequest)
            assert (request.op, dict(request.args)) == (op, args)
            peer.send(frames.Ok(request.id, answer.body))
            results.append(await task)
        assert results == [stat, [stat], None, None]


async def test_list_dir_refuses_more_entries_than_asked() -> None:
    entry = frames.FileStat("f", "/w/f", "file", 3, 0o100644, 10.0).as_json()
    async with connected() as (client, peer):
        listing = asyncio.ensure_future(client.list_dir("/w", max_entries=1))
        request = await peer.recv()
        peer.send(frames.Ok(request.id, {"entries": [entry, entry]}))
        with pytest.raises(RunnerProtocolError, match="at most 1"):
            await listing


async def test_write_file_streams_chunks_then_end() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"ab"
        yield b"c" * 300_000

    async with connected() as (client, peer):
        writing = asyncio.ensure_future(
            client.write_file("/w/f", chunks(), mode=0o600, parents=True)
        )
        request = await peer.recv()
        assert request == frames.FileRequest(
            request.id, "write", {"path": "/w/f", "parents": True, "mode": 0o600}
        )
        data = b""
        while not isinstance(message := await peer.recv(), frames.UploadEnd):
            assert isinstance(message, frames.UploadData) and message.id == request.id
            assert len(message.data) <= frames.MAX_PAYLOAD
            data += message.data
        assert data == b"ab" + b"c" * 300_000
        peer.send(frames.Ok(request.id))
        await writing


async def test_an_upload_refused_midway_stops_sending() -> None:
    gate = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"first"
        await gate.wait()
        yield b"second"

    async with connected() as (client, peer):
        writing = asyncio.ensure_future(client.archive_in("/w", chunks()))
        request = await peer.recv()
        assert await peer.recv() == frames.UploadData(request.id, b"first")
        peer.send(frames.ErrorReply(request.id, "unsupported", "archive_in"))
        await _ping_through(client, peer)  # the client has seen the ERROR
        gate.set()
        with pytest.raises(RunnerRequestError, match="unsupported"):
            await writing
        # Nothing more was sent for it, and a late frame for it is no protocol error.
        peer.send(frames.ErrorReply(request.id, "invalid", "late"))
        await _ping_through(client, peer)
        assert not client.closed


async def test_late_answers_to_a_refused_upload_are_dropped() -> None:
    async with connected() as (client, peer):
        writing = asyncio.ensure_future(client.write_file("/w/f", b"abc"))
        request = await peer.recv()
        assert await peer.recv() == frames.UploadData(request.id, b"abc")
        assert await peer.recv() == frames.UploadEnd(request.id)
        peer.send(
            frames.ErrorReply(request.id, "not_a_file", "a folder", FrameType.FILE),
            frames.ErrorReply(request.id, "not_found", "no upload", FrameType.UPLOAD_DATA),
            frames.ErrorReply(request.id, "not_found", "no upload", FrameType.UPLOAD_END),
        )
        with pytest.raises(RunnerRequestError, match="not_a_file"):
            await writing
        await _ping_through(client, peer)
        assert not client.closed


async def test_archive_out_streams_to_its_callback_within_its_bound() -> None:
    async with connected() as (client, peer):
        got: list[bytes] = []
        out = asyncio.ensure_future(client.archive_out("/w", got.append, max_bytes=6))
        request = await peer.recv()
        peer.send(
            frames.DownloadData(request.id, b"tar"),
            frames.DownloadData(request.id, b"123"),
            frames.DownloadEnd(request.id),
        )
        assert await out == 6
        assert got == [b"tar", b"123"]
        over = asyncio.ensure_future(client.archive_out("/w", got.append, max_bytes=6))
        request = await peer.recv()
        peer.send(frames.DownloadData(request.id, b"1234567"))
        with pytest.raises(RunnerConnectionLost, match="over 6 bytes"):
            await over


# --- a hostile or failing runner --------------------------------------------------------


async def test_a_stalled_call_times_out_and_its_late_answer_is_dropped() -> None:
    async with connected() as (client, peer):
        with pytest.raises(RunnerTimeout, match="ping"):
            await client.ping(b"a", timeout=0.05)
        late = await peer.recv()
        assert isinstance(late, frames.Ping)
        peer.send(frames.Pong(late.id, b"a"))
        await _ping_through(client, peer)
        assert not client.closed


async def test_half_a_frame_then_silence_times_calls_out_and_keeps_the_connection() -> None:
    async with connected() as (client, peer):
        frame = frames.Pong(0x8000_0000, b"").encode()
        peer.send(frame[:5])
        with pytest.raises(RunnerTimeout):
            await client.list(timeout=0.1)
        assert not client.closed


async def test_endless_output_does_not_starve_deadlines() -> None:
    async with connected() as (client, peer):
        sink = Sink(keep=False)
        await _spawned(client, peer, 3, sink)

        async def flood() -> None:
            offset = 0
            chunk = b"x" * 65_536
            while True:
                peer.send(frames.Output(3, OUT, offset, chunk))
                offset += len(chunk)
                await peer.writer.drain()

        flooding = asyncio.ensure_future(flood())
        try:
            await asyncio.wait_for(sink.fed.wait(), STEP)
            with pytest.raises(RunnerTimeout):
                await client.ping(timeout=0.2)
        finally:
            flooding.cancel()
        assert sink.count > 0
        assert not client.closed


async def test_a_flood_passes_through_in_bounded_memory() -> None:
    async with connected() as (client, peer):
        sink = Sink(keep=False)
        await _spawned(client, peer, 3, sink)
        total = 48 << 20
        chunk = b"x" * frames.MAX_PAYLOAD
        tracemalloc.start()
        try:
            for offset in range(0, total, len(chunk) - 9):
                peer.send(frames.Output(3, OUT, offset, chunk[: len(chunk) - 9]))
                await peer.flush()
            await _ping_through(client, peer)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert sink.count >= total
        assert peak < 16 << 20, peak


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (b"\x00\x00\x00\x05\x33\x00\x00\x00\x01", "unknown frame type"),
        (struct.pack(">IBI", 0xFFFF_FFFF, FrameType.OUTPUT, 1), "over the bound"),
        (frames.Output(1, OUT, 5, b"jump").encode(), "jumps ahead"),
        (frames.Gap(1, OUT, 1, 5).encode(), "GAP of STDOUT from 1"),
        (frames.Ok(77).encode(), "awaits no answer"),
        (frames.ErrorReply(0, "protocol", "you sent junk").encode(), "you sent junk"),
        (frames.Pong(1, b"").encode(), "awaits no answer"),
        (frames.DownloadData(1, b"x").encode(), "awaits no answer"),
        (frames.HelloOk(1, "x", 1, 1).encode(), "awaits no answer"),
        (frames.encode_frame(FrameType.EXIT, 1, b'{"code":"0"}'), "code"),
    ],
)
async def test_a_protocol_error_ends_the_connection_for_everyone(bad: bytes, match: str) -> None:
    async with connected() as (client, peer):
        sink = Sink()
        await _spawned(client, peer, 1, sink)
        pinging = asyncio.ensure_future(client.ping())
        await peer.recv()
        peer.send(bad)
        with pytest.raises(RunnerConnectionLost, match=match):
            await pinging
        await sink.ended()
        assert sink.lost_reason is not None and match.split()[0] in sink.lost_reason
        assert client.lost_reason is not None and "protocol error" in client.lost_reason
        await peer.recv_eof()  # the client closed its end
        with pytest.raises(RunnerConnectionLost):
            await client.ping()


async def test_an_answer_of_the_wrong_kind_is_a_protocol_error() -> None:
    async with connected() as (client, peer):
        spawning = asyncio.ensure_future(client.spawn(2, ["x"], env={}, sink=Sink()))
        await peer.recv()
        peer.send(frames.Ok(2))
        with pytest.raises(RunnerConnectionLost, match="awaits SPAWNED"):
            await spawning


async def test_a_pong_with_another_payload_is_a_protocol_error() -> None:
    async with connected() as (client, peer):
        pinging = asyncio.ensure_future(client.ping(b"mine"))
        request = await peer.recv()
        peer.send(frames.Pong(request.id, b"other"))
        with pytest.raises(RunnerProtocolError):
            await pinging
        assert client.closed


async def test_a_connection_dropped_mid_call_fails_every_call_and_sink() -> None:
    async with connected() as (client, peer):
        sinks = [Sink(), Sink()]
        await _spawned(client, peer, 1, sinks[0])
        await _spawned(client, peer, 2, sinks[1])
        calls = [asyncio.ensure_future(client.ping()), asyncio.ensure_future(client.list())]
        await peer.recv()
        await peer.recv()
        peer.send(frames.encode_frame(FrameType.OUTPUT, 1, b"\x01")[:7])  # half a frame
        await peer.flush()
        peer.close()
        for call in calls:
            with pytest.raises(RunnerConnectionLost, match="inside a frame"):
                await call
        for sink in sinks:
            await sink.ended()
            assert sink.lost_reason is not None
        assert await asyncio.wait_for(client.wait_closed(), STEP) == client.lost_reason
        with pytest.raises(RunnerConnectionLost):
            await client.resize(1, 2, 3)


async def test_aclose_fails_what_waits_and_tells_the_sinks() -> None:
    async with connected() as (client, peer):
        sink = Sink()
        await _spawned(client, peer, 1, sink)
        pinging = asyncio.ensure_future(client.ping())
        await peer.recv()
        await client.aclose()
        with pytest.raises(RunnerConnectionLost, match="client closed"):
            await pinging
        assert sink.lost_reason == "the client closed the connection"
        await peer.recv_eof()


async def test_arguments_are_checked_before_anything_is_sent() -> None:
    async with connected() as (client, peer):
        with pytest.raises(InvalidArgumentError):
            await client.spawn(0, ["x"], env={}, sink=Sink())
        with pytest.raises(InvalidArgumentError):
            await client.spawn(0x8000_0000, ["x"], env={}, sink=Sink())
        with pytest.raises(InvalidArgumentError):
            await client.spawn(1, [], env={}, sink=Sink())
        with pytest.raises(InvalidArgumentError):
            await client.ping(timeout=0)
        with pytest.raises(InvalidArgumentError):
            await client.ping(timeout=float("nan"))
        with pytest.raises(InvalidArgumentError):
            await client.resize(1, 0, 80)
        with pytest.raises(InvalidArgumentError):
            await client.signal(1, 0)
        with pytest.raises(InvalidArgumentError):
            await client.ping(b"x" * 65)
        await _ping_through(client, peer)  # the first frame the peer sees


def _random_runner_message(rng: random.Random, ids: list[int]) -> frames.RunnerMessage | bytes:
    fid = rng.choice(ids)
    stream = rng.choice((OUT, ERR))
    offset = rng.choice((0, 1, 5, 2**40))
    answers = rng.choice((None, *frames.CLIENT_TYPES))
    choices: list[frames.RunnerMessage | bytes] = [
        frames.Output(fid, stream, offset, rng.randbytes(rng.randrange(8))),
        frames.Gap(fid, stream, offset, offset + rng.randrange(1, 9)),
        frames.Exit(fid, rng.randrange(256)),
        frames.Spawned(fid, rng.randrange(1, 99)),
        frames.Ok(fid, {}, answers),
        frames.ErrorReply(fid, "io", "x", answers),
        frames.Pong(fid, b""),
        frames.Listed(fid, ()),
        frames.DownloadData(fid, b"d"),
        frames.DownloadEnd(fid),
        frames.HelloOk(1, "x", 1, 4096),
        rng.randbytes(rng.randrange(1, 12)),
    ]
    return rng.choice(choices)


@pytest.mark.parametrize("seed", range(60))
async def test_fuzz_a_runner_answering_at_random(seed: int) -> None:
    """Random frames (most of them wrong for the moment) against live calls and routes:
    the client either goes on or ends the connection with a protocol reason; every call
    ends, every sink hears its end, nothing in the client fails."""
    rng = random.Random(seed)
    async with connected() as (client, peer):
        sinks = [Sink(), Sink()]
        await _spawned(client, peer, 1, sinks[0])
        await _spawned(client, peer, 2, sinks[1])
        calls = [
            asyncio.ensure_future(client.ping(timeout=STEP)),
            asyncio.ensure_future(client.read_file("/f", max_bytes=4, timeout=STEP)),
            asyncio.ensure_future(client.resize(1, 5, 5, timeout=STEP)),
            asyncio.ensure_future(client.write(2, b"in", timeout=STEP)),
            asyncio.ensure_future(client.signal(1, 15, timeout=STEP)),
        ]
        request_ids = []
        for _ in calls:
            message = await peer.recv()
            if message.id > 0x7FFF_FFFF:
                request_ids.append(message.id)
        ids = [1, 2, 3, *request_ids]
        peer.send(*[_random_runner_message(rng, ids) for _ in range(rng.randrange(1, 12))])
        await peer.flush()
        peer.close()  # the end of the stream settles whatever is left
        for call in calls:
            with contextlib.suppress(RunnerRequestError, RunnerConnectionLost):
                await call
        for sink in sinks:
            await sink.ended()
        reason = await asyncio.wait_for(client.wait_closed(), STEP)
        assert "client failed" not in reason, reason
