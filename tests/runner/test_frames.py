"""The runner protocol's frames: every type round-trips, and the reader and decoders
hold their bounds against anything a hostile peer can send (fuzzed: random bytes,
truncations and mutations of valid streams, absurd lengths)."""

from __future__ import annotations

import asyncio
import json
import random
import struct
import tracemalloc

import pytest

from sandbox.errors import InvalidArgumentError
from sandbox.runner import frames
from sandbox.runner.errors import RunnerProtocolError
from sandbox.runner.frames import (
    CLIENT_TYPES,
    MAX_LENGTH,
    MAX_PAYLOAD,
    RUNNER_TYPES,
    Frame,
    FrameReader,
    FrameType,
    SignalScope,
    Stream,
    StreamOffsets,
)

CLIENT_MESSAGES: list[frames.ClientMessage] = [
    frames.Hello(),
    frames.Spawn(
        id=7,
        argv=("sh", "-c", "echo é"),
        env={"PATH": "/bin", "LANG": "C.UTF-8"},
        cwd="/tmp",
        tty=True,
        rows=40,
        cols=132,
        stdin_open=True,
        merge_stderr=True,
        ring_bytes=4096,
    ),
    frames.Spawn(id=8, argv=("true",), env={}),
    frames.Input(7, b"hello\x00\xff"),
    frames.Input(7, b""),
    frames.CloseStdin(7),
    frames.Resize(7, 50, 200),
    frames.Signal(7, 15, SignalScope.TREE),
    frames.Signal(7, 2, SignalScope.GROUP),
    frames.Attach(7, 123, 2**64 - 1),
    frames.Detach(7),
    frames.ListProcesses(0x8000_0001),
    frames.Forget(7),
    frames.Ping(0x8000_0002, b"x" * 64),
    frames.FileRequest(0x8000_0003, "read", {"path": "/etc/hostname", "max_bytes": 10}),
    frames.FileRequest(0x8000_0004, "write", {"path": "a", "parents": True, "mode": 0o600}),
    frames.UploadData(0x8000_0004, b"\x00" * 1000),
    frames.UploadEnd(0x8000_0004),
]

STAT = frames.FileStat("a", "/w/a", "symlink", 3, 0o120777, 1.5, link_target="b")
RUNNER_MESSAGES: list[frames.RunnerMessage] = [
    frames.HelloOk(version=1, runner="0.1.0", pid=42, max_frame=MAX_PAYLOAD),
    frames.Spawned(7, 1234),
    frames.Output(7, Stream.STDOUT, 0, b"hi\n"),
    frames.Output(7, Stream.STDERR, 2**40, b"\xff" * 100),
    frames.Exit(7, 0),
    frames.Exit(7, 137),
    frames.Gap(7, Stream.STDOUT, 10, 20),
    frames.Listed(
        0x8000_0001,
        (
            frames.ProcessInfo(7, 1234, ("sh", "-c", "x"), False, True, None, 10, 0),
            frames.ProcessInfo(8, 1235, ("true",), True, False, 0, 0, 0),
        ),
    ),
    frames.Listed(0x8000_0001, ()),
    frames.Pong(0x8000_0002, b"x" * 64),
    frames.Ok(7),
    frames.Ok(7, {"delivered": False}, FrameType.SIGNAL),
    frames.Ok(0x8000_0005, STAT.as_json()),
    frames.DownloadData(0x8000_0003, b"data"),
    frames.DownloadEnd(0x8000_0003),
    frames.ErrorReply(7, "command_not_found", "no such program: nope"),
    frames.ErrorReply(7, "io", "the process has ended", FrameType.INPUT),
]


def test_every_frame_type_has_a_message_under_test() -> None:
    client = {
        frames.decode_from_client(_one(m.encode(), CLIENT_TYPES)).__class__ for m in CLIENT_MESSAGES
    }
    runner = {
        frames.decode_from_runner(_one(m.encode(), RUNNER_TYPES)).__class__ for m in RUNNER_MESSAGES
    }
    assert len(client) == len(CLIENT_TYPES)
    assert len(runner) == len(RUNNER_TYPES)


def _one(data: bytes, allowed: frozenset[FrameType]) -> Frame:
    reader = FrameReader(allowed)
    [frame] = reader.feed(data)
    assert reader.buffered == 0
    return frame


@pytest.mark.parametrize("message", CLIENT_MESSAGES, ids=lambda m: type(m).__name__)
def test_client_messages_round_trip(message: frames.ClientMessage) -> None:
    data = message.encode()
    length, kind, _ = frames.HEADER.unpack_from(data)
    assert length == len(data) - 4
    assert kind in CLIENT_TYPES
    assert frames.decode_from_client(_one(data, CLIENT_TYPES)) == message


@pytest.mark.parametrize("message", RUNNER_MESSAGES, ids=lambda m: type(m).__name__)
def test_runner_messages_round_trip(message: frames.RunnerMessage) -> None:
    data = message.encode()
    assert frames.decode_from_runner(_one(data, RUNNER_TYPES)) == message


def test_wire_layout_is_big_endian_as_documented() -> None:
    data = frames.Output(0x01020304, Stream.STDERR, 5, b"ab").encode()
    assert data == (
        b"\x00\x00\x00\x10"  # length = 5 + 1 + 8 + 2
        b"\x83"
        b"\x01\x02\x03\x04"
        b"\x02"
        b"\x00\x00\x00\x00\x00\x00\x00\x05"
        b"ab"
    )
    assert frames.Resize(1, 24, 80).encode()[9:] == b"\x00\x18\x00\x50"
    assert frames.Signal(1, 9, SignalScope.TREE).encode()[9:] == b"\x09\x02"
    assert json.loads(frames.Hello().encode()[9:]) == {"version": 1}
    body = json.loads(frames.Spawn(3, ("a",), {"K": "V"}).encode()[9:])
    assert body == {
        "argv": ["a"],
        "env": {"K": "V"},
        "cwd": None,
        "tty": False,
        "rows": 24,
        "cols": 80,
        "stdin": "closed",
        "merge_stderr": False,
        "ring_bytes": 1_048_576,
    }


def test_file_answers_decode() -> None:
    assert frames.decode_stat(STAT.as_json()) == STAT
    body = {"entries": [STAT.as_json()] * 3}
    assert frames.decode_entries(body, 3) == [STAT] * 3
    with pytest.raises(RunnerProtocolError, match="at most 2"):
        frames.decode_entries(body, 2)
    with pytest.raises(RunnerProtocolError, match="kind"):
        frames.decode_stat({**STAT.as_json(), "kind": "socket"})
    with pytest.raises(RunnerProtocolError, match="mtime"):
        frames.decode_stat({**STAT.as_json(), "mtime": "yesterday"})


def test_encoders_refuse_what_a_frame_cannot_carry() -> None:
    with pytest.raises(InvalidArgumentError):
        frames.Input(1, b"x" * (MAX_PAYLOAD + 1)).encode()
    frames.Input(1, b"x" * MAX_PAYLOAD).encode()
    with pytest.raises(InvalidArgumentError):
        frames.Ping(1, b"x" * 65).encode()
    with pytest.raises(InvalidArgumentError):
        frames.encode_frame(FrameType.PING, 2**32)
    with pytest.raises(InvalidArgumentError):
        frames.check_argv([])


# --- the reader ---------------------------------------------------------------------------


def _stream_of(messages: list[frames.RunnerMessage]) -> bytes:
    return b"".join(m.encode() for m in messages)


def test_feed_byte_by_byte_gives_the_same_frames() -> None:
    data = _stream_of(RUNNER_MESSAGES)
    whole = FrameReader().feed(data)
    reader = FrameReader()
    pieces = [f for i in range(len(data)) for f in reader.feed(data[i : i + 1])]
    assert pieces == whole
    assert len(whole) == len(RUNNER_MESSAGES)
    reader.end()


async def test_read_from_a_stream_reader() -> None:
    stream = asyncio.StreamReader()
    stream.feed_data(_stream_of(RUNNER_MESSAGES))
    stream.feed_eof()
    reader = FrameReader()
    got = []
    while (frame := await reader.read(stream)) is not None:
        got.append(frames.decode_from_runner(frame))
    assert got == RUNNER_MESSAGES


@pytest.mark.parametrize("cut", [1, 4, 8, 9, 12])
async def test_read_refuses_a_stream_ending_inside_a_frame(cut: int) -> None:
    data = frames.Output(1, Stream.STDOUT, 0, b"abcdef").encode()
    stream = asyncio.StreamReader()
    stream.feed_data(data[:cut])
    stream.feed_eof()
    with pytest.raises(RunnerProtocolError, match="ended inside"):
        await FrameReader().read(stream)


@pytest.mark.parametrize("length", [MAX_LENGTH + 1, 0xFFFF_FFFF, 2**31])
async def test_an_absurd_length_is_refused_on_its_four_bytes(length: int) -> None:
    reader = FrameReader()
    with pytest.raises(RunnerProtocolError, match="over the bound"):
        reader.feed(struct.pack(">I", length))
    assert reader.buffered == 0
    # Broken for good: the connection must close.
    with pytest.raises(RunnerProtocolError):
        reader.feed(frames.Ok(1).encode())
    # From a stream: refused on the header, before reading (or waiting for) the payload.
    stream = asyncio.StreamReader()
    stream.feed_data(struct.pack(">IBI", length, FrameType.OUTPUT, 1))
    with pytest.raises(RunnerProtocolError, match="over the bound"):
        await FrameReader().read(stream)


def test_the_largest_frame_passes_and_one_more_byte_does_not() -> None:
    data = frames.Output(1, Stream.STDOUT, 0, b"x" * (MAX_PAYLOAD - 9)).encode()
    assert len(data) == 4 + MAX_LENGTH
    [frame] = FrameReader().feed(data)
    assert len(frame.payload) == MAX_PAYLOAD
    with pytest.raises(RunnerProtocolError):
        FrameReader().feed(struct.pack(">I", MAX_LENGTH + 1))


@pytest.mark.parametrize("length", [0, 1, 4])
def test_a_length_below_the_header_is_refused(length: int) -> None:
    with pytest.raises(RunnerProtocolError, match="below"):
        FrameReader().feed(struct.pack(">I", length) + b"\x90" * 8)


@pytest.mark.parametrize("kind", [0x00, 0x13, 0x80, 0x86, 0xFE])
def test_an_unknown_type_is_a_protocol_error(kind: int) -> None:
    with pytest.raises(RunnerProtocolError, match="unknown frame type"):
        FrameReader().feed(frames.encode_frame(kind, 1))


def test_a_frame_of_the_wrong_direction_is_a_protocol_error() -> None:
    with pytest.raises(RunnerProtocolError, match="not one this side receives"):
        FrameReader().feed(frames.Input(1, b"x").encode())
    with pytest.raises(RunnerProtocolError, match="not one this side receives"):
        FrameReader(CLIENT_TYPES).feed(frames.Exit(1, 0).encode())


def test_end_inside_a_frame_is_a_protocol_error() -> None:
    reader = FrameReader()
    reader.feed(frames.Exit(1, 0).encode()[:-1])
    with pytest.raises(RunnerProtocolError, match="ended inside"):
        reader.end()


# --- payload bounds -------------------------------------------------------------------------


def _runner(kind: FrameType, payload: bytes, fid: int = 1) -> frames.RunnerMessage:
    return frames.decode_from_runner(Frame(kind, fid, payload))


@pytest.mark.parametrize(
    ("kind", "payload", "match"),
    [
        (FrameType.OUTPUT, b"\x01\x00", "too short"),
        (FrameType.OUTPUT, b"\x03" + bytes(8), "unknown stream"),
        (FrameType.GAP, b"\x01" + bytes(16), "empty or reversed"),
        (FrameType.GAP, b"\x01" + struct.pack(">QQ", 9, 3), "empty or reversed"),
        (FrameType.GAP, b"\x01" + bytes(15), "expected 17"),
        (FrameType.EXIT, b'{"code": 256}', "code"),
        (FrameType.EXIT, b'{"code": true}', "code"),
        (FrameType.EXIT, b'{"code": 1.0}', "code"),
        (FrameType.EXIT, b"{}", "missing"),
        (FrameType.EXIT, b"[]", "not an object"),
        (FrameType.EXIT, b'{"code": NaN}', "not a valid JSON"),
        (FrameType.EXIT, b'{"code": 1' + b"0" * 40 + b"}", "not a valid JSON"),
        (FrameType.EXIT, b'{"code": 0, "x": "\xff"}', "not a valid JSON"),
        (FrameType.EXIT, b'{"code": 0', "not a valid JSON"),
        (FrameType.EXIT, b'{"code":0,"pad":"' + b"x" * 70_000 + b'"}', "over 65536"),
        (FrameType.SPAWNED, b'{"pid": 0}', "pid"),
        (FrameType.ERROR, b'{"kind": "' + b"k" * 65 + b'", "message": ""}', "kind"),
        (FrameType.ERROR, b'{"kind": "io", "message": "' + b"m" * 9000 + b'"}', "message"),
        (FrameType.HELLO_OK, b'{"version": 1, "runner": "x", "pid": 1}', "max_frame"),
        (FrameType.PONG, b"p" * 65, "over 64"),
        (FrameType.DOWNLOAD_END, b"x", "unexpected payload"),
        (FrameType.LISTED, b'{"processes": {}}', "not a list"),
        (FrameType.LISTED, b'{"processes": [{"id": 1}]}', "missing"),
        (FrameType.LISTED, b'{"processes": [1]}', "not a JSON object"),
        (FrameType.OK, b"[" * 10 + b"]" * 10, "containers|not an object|deeper"),
        (FrameType.OK, b'{"for": 129}', "'for'"),
        (FrameType.ERROR, b'{"kind": "io", "message": "", "for": "3"}', "'for'"),
        (FrameType.LISTED, b'{"processes": [], "truncated": 1}', "truncated"),
    ],
)
def test_malformed_payloads_are_protocol_errors(
    kind: FrameType, payload: bytes, match: str
) -> None:
    with pytest.raises(RunnerProtocolError, match=match):
        _runner(kind, payload)


def test_listed_bounds_counts_and_argv() -> None:
    process = frames.ProcessInfo(1, 2, ("a",), False, True, None, 0, 0).as_json()
    too_many = {"processes": [process] * (frames.MAX_PROCESSES + 1)}
    with pytest.raises(RunnerProtocolError):
        _runner(FrameType.LISTED, frames.dump_json(too_many))
    long_argv = {"processes": [{**process, "argv": ["a"] * (frames.MAX_ARGV + 1)}]}
    with pytest.raises(RunnerProtocolError, match="argv"):
        _runner(FrameType.LISTED, frames.dump_json(long_argv))
    long_item = {"processes": [{**process, "argv": ["a" * (frames.MAX_STRING + 1)]}]}
    with pytest.raises(RunnerProtocolError, match="argv"):
        _runner(FrameType.LISTED, frames.dump_json(long_item))


@pytest.mark.parametrize(
    "payload",
    [
        b'{"a":' * 9 + b"1" + b"}" * 9,  # one level too deep
        b'{"a":[' + b"{}," * 20_000 + b"{}]}",  # too many containers
        b'{"a":[' + b"0," * 200_000 + b"0]}",  # too many items
        b"[" * 500_000 + b"]" * 500_000,  # deep enough to exhaust a recursive parser
    ],
    ids=["depth", "containers", "items", "recursion"],
)
def test_json_shape_bounds(payload: bytes) -> None:
    with pytest.raises(RunnerProtocolError):
        frames.load_json_object(payload, what="OK")


def test_json_at_the_depth_bound_passes() -> None:
    payload = b'{"a":' * 7 + b"{}" + b"}" * 7
    assert frames.load_json_object(payload, what="OK")


def test_hostile_json_parses_within_a_memory_bound() -> None:
    """The worst payloads the counts let through, parsed: the peak stays a small
    multiple of the frame bound."""
    worst = [
        # as many containers as allowed, each an object with a key
        b'{"a":[' + b'{"k":0},' * (frames.MAX_JSON_CONTAINERS - 3) + b"{}]}",
        # as many items as allowed
        b'{"a":[' + b"1," * (frames.MAX_JSON_COMMAS - 1) + b"1]}",
        # one big string of 4-byte characters
        b'{"a":"' + "😀".encode() * ((MAX_PAYLOAD - 16) // 4) + b'"}',
    ]
    for payload in worst:
        assert len(payload) <= MAX_PAYLOAD
        tracemalloc.start()
        try:
            try:
                frames.load_json_object(payload, what="OK")
            except RunnerProtocolError:
                pass
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 32 * MAX_PAYLOAD, (len(payload), peak)


# --- output offsets ---------------------------------------------------------------------------


def test_offsets_accept_contiguous_output_and_gaps() -> None:
    offsets = StreamOffsets()
    offsets.output(Stream.STDOUT, 0, 5)
    offsets.output(Stream.STDERR, 0, 2)
    offsets.gap(Stream.STDOUT, 5, 100)
    offsets.output(Stream.STDOUT, 100, 1)
    assert offsets.next(Stream.STDOUT) == 101
    assert offsets.next(Stream.STDERR) == 2
    resumed = StreamOffsets(50, 7)
    resumed.gap(Stream.STDOUT, 50, 60)
    resumed.output(Stream.STDERR, 7, 1)


@pytest.mark.parametrize(
    ("offset", "match"), [(4, "goes back"), (6, "jumps ahead"), (0, "goes back")]
)
def test_offsets_refuse_repeats_and_silent_jumps(offset: int, match: str) -> None:
    offsets = StreamOffsets()
    offsets.output(Stream.STDOUT, 0, 5)
    with pytest.raises(RunnerProtocolError, match=match):
        offsets.output(Stream.STDOUT, offset, 1)


def test_a_gap_must_start_where_the_stream_is() -> None:
    offsets = StreamOffsets()
    offsets.output(Stream.STDOUT, 0, 5)
    with pytest.raises(RunnerProtocolError, match="GAP"):
        offsets.gap(Stream.STDOUT, 6, 10)
    with pytest.raises(RunnerProtocolError, match="GAP"):
        offsets.gap(Stream.STDOUT, 3, 10)


# --- fuzzing ---------------------------------------------------------------------------------


def _consume(data: bytes, rng: random.Random, allowed: frozenset[FrameType] = RUNNER_TYPES) -> int:
    """Feed `data` in random chunks and decode every frame: returns the frame count, or
    -1 when the stream was refused. Only `RunnerProtocolError` may come out, and the
    reader never holds more than one frame's bytes beyond the chunk it was given."""
    reader = FrameReader(allowed)
    decode = frames.decode_from_runner if allowed is RUNNER_TYPES else frames.decode_from_client
    count = 0
    position = 0
    try:
        while position < len(data):
            size = rng.choice((1, 3, 9, 64, 4096, 70_000))
            chunk = data[position : position + size]
            position += size
            for frame in reader.feed(chunk):
                assert len(frame.payload) <= MAX_PAYLOAD
                decode(frame)
                count += 1
            assert reader.buffered < 4 + MAX_LENGTH
        reader.end()
    except RunnerProtocolError:
        return -1
    return count


def test_fuzz_random_bytes() -> None:
    rng = random.Random(3701)
    refused = 0
    for _ in range(4000):
        size = rng.choice((0, 1, 5, 9, 13, 40, 300, 5000))
        data = rng.randbytes(size)
        if _consume(data, rng) < 0:
            refused += 1
    assert refused > 3000  # random bytes are almost never a valid stream


def test_fuzz_random_bytes_behind_valid_headers() -> None:
    """Valid lengths and types with random payloads: reaches every decoder."""
    rng = random.Random(3702)
    types = sorted(RUNNER_TYPES)
    decoded = 0
    for _ in range(4000):
        payload = rng.randbytes(rng.choice((0, 1, 2, 9, 17, 30, 200)))
        if rng.random() < 0.3:
            payload = json.dumps(_random_json(rng)).encode()
        data = frames.encode_frame(rng.choice(types), rng.randrange(2**32), payload)
        if _consume(data, rng) == 1:
            decoded += 1
    assert decoded > 100


def test_fuzz_client_frames() -> None:
    rng = random.Random(3703)
    types = sorted(CLIENT_TYPES)
    for _ in range(2000):
        payload = rng.randbytes(rng.choice((0, 1, 4, 16, 100)))
        if rng.random() < 0.3:
            payload = json.dumps(_random_json(rng)).encode()
        _consume(frames.encode_frame(rng.choice(types), 5, payload), rng, CLIENT_TYPES)


def _random_json(rng: random.Random, depth: int = 0) -> object:
    pick = rng.random()
    if depth > 3 or pick < 0.4:
        return rng.choice([0, -1, 2**40, 1.5, "x", "", True, None, "é" * 3])
    if pick < 0.7:
        keys = ["code", "pid", "kind", "message", "processes", "version", "runner", "max_frame"]
        return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}
    return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]


def test_fuzz_truncations_and_mutations_of_valid_streams() -> None:
    rng = random.Random(3704)
    base = _stream_of(RUNNER_MESSAGES)
    whole = len(RUNNER_MESSAGES)
    assert _consume(base, rng) == whole
    outcomes = set()
    for _ in range(3000):
        data = bytearray(base)
        how = rng.randrange(5)
        if how == 0:  # truncate
            data = data[: rng.randrange(len(data))]
        elif how == 1:  # flip bytes
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif how == 2:  # insert garbage
            at = rng.randrange(len(data))
            data[at:at] = rng.randbytes(rng.randrange(1, 20))
        elif how == 3:  # delete a span
            at = rng.randrange(len(data))
            del data[at : at + rng.randrange(1, 20)]
        else:  # an absurd length on some frame boundary
            data[0:4] = struct.pack(">I", rng.choice((MAX_LENGTH + 1, 2**32 - 1, 2**31)))
        count = _consume(bytes(data), rng)
        assert count <= whole + 20
        outcomes.add(count >= 0)
    assert outcomes == {True, False}


def test_fuzz_memory_stays_bounded() -> None:
    """A stream of hostile frames held to the bound: the peak while reading and
    decoding is a small multiple of one frame, whatever the stream's length."""
    rng = random.Random(3705)
    hostile = [
        frames.encode_frame(FrameType.LISTED, 1, b'{"processes":[' + b"{}," * 16_000 + b"{}]}"),
        frames.encode_frame(FrameType.OK, 1, b'{"a":[' + b"0," * 130_000 + b"0]}"),
        frames.Output(1, Stream.STDOUT, 0, b"x" * (MAX_PAYLOAD - 9)).encode(),
        struct.pack(">IBI", MAX_LENGTH, FrameType.OUTPUT, 1) + b"\x01" * 1000,  # never ends
    ]
    tracemalloc.start()
    try:
        for data in hostile * 4:
            _consume(data, rng)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * MAX_PAYLOAD
