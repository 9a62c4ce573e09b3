"""The runner protocol's frames (docs/runner.md): encode, decode, and a bounded reader.

A frame is `u32 length | u8 type | u32 id | payload` (big-endian), length = 5 + the
payload's size, the payload at most `MAX_PAYLOAD` bytes. Each frame type has a message
class here with `encode()`; `decode_from_runner` / `decode_from_client` turn a `Frame`
into its message, checking every field.

Everything the runner sends is untrusted (the sandbox can replace the runner), so
decoding bounds what a peer controls: the frame length (checked on its first four
bytes, before anything is buffered), JSON payload sizes, the number of containers and
items in a JSON payload (counted on the raw bytes before parsing, so parsing itself
cannot swell), its nesting depth, string lengths and list counts, and integer ranges.
Any violation raises `RunnerProtocolError` and nothing else; the client then closes the
connection. `StreamOffsets` checks that output offsets only move forward, each byte once.
"""

from __future__ import annotations

import asyncio
import enum
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from sandbox.errors import InvalidArgumentError

from .errors import RunnerProtocolError

PROTOCOL_VERSION = 1
MAX_PAYLOAD = 1_048_576
"""The largest payload a frame may carry, either way (1 MiB)."""
HEADER = struct.Struct(">IBI")
HEADER_SIZE = HEADER.size  # 9: length, type, id
MIN_LENGTH = 5  # type + id: the length field counts these
MAX_LENGTH = MIN_LENGTH + MAX_PAYLOAD
MAX_ID = 0xFFFF_FFFF

# JSON bounds. Counts are taken on the raw bytes before parsing: every object or array
# opens with "{" or "[", and every value after the first in a container follows a ",",
# so these counts bound what `json.loads` can build (a "," inside a string counts too:
# the bound errs on the safe side). With them a 1 MiB payload parses into at most a few
# tens of MiB of Python objects, briefly.
MAX_SMALL_JSON = 65_536
"""The largest JSON payload of a small answer (HELLO_OK, SPAWNED, EXIT, ERROR)."""
MAX_JSON_CONTAINERS = 16_384
MAX_JSON_COMMAS = 131_072
MAX_JSON_DEPTH = 8
MAX_JSON_NUMBER_CHARS = 32  # a number's text: int64 fits in 20, a float's repr in 24

# Field bounds.
MAX_PROCESSES = 8_192
"""The most process records a LISTED answer may carry."""
MAX_ENTRIES = 10_000
"""The most entries a file list answer may carry (and the most a client may ask for)."""
MAX_ARGV = 4_096
MAX_STRING = 131_072
"""The longest string field (an argv item, a path, a link target)."""
MAX_ERROR_MESSAGE = 8_192
MAX_WORD = 64  # an error kind, a version word, a file kind
MAX_PING = 64
MAX_EXIT_CODE = 255
MAX_PID = 0x7FFF_FFFF
MAX_OFFSET = 0xFFFF_FFFF_FFFF_FFFF
MAX_RING_BYTES = 64 * 1024 * 1024
"""The runner keeps at most this much output per stream of a process."""

JsonObject: TypeAlias = dict[str, Any]


class FrameType(enum.IntEnum):
    """Every frame type of protocol version 1."""

    # client -> runner
    HELLO = 0x01
    SPAWN = 0x02
    INPUT = 0x03
    CLOSE_STDIN = 0x04
    RESIZE = 0x05
    SIGNAL = 0x06
    ATTACH = 0x07
    DETACH = 0x08
    LIST = 0x09
    FORGET = 0x0A
    PING = 0x0B
    FILE = 0x10
    UPLOAD_DATA = 0x11
    UPLOAD_END = 0x12
    # runner -> client
    HELLO_OK = 0x81
    SPAWNED = 0x82
    OUTPUT = 0x83
    EXIT = 0x84
    GAP = 0x85
    LISTED = 0x89
    PONG = 0x8B
    OK = 0x90
    DOWNLOAD_DATA = 0x91
    DOWNLOAD_END = 0x92
    ERROR = 0xFF


CLIENT_TYPES = frozenset(t for t in FrameType if t < 0x80)
"""The types a client sends."""
RUNNER_TYPES = frozenset(t for t in FrameType if t >= 0x80)
"""The types a runner sends."""


class Stream(enum.IntEnum):
    """An output stream: stdout (or the PTY) and stderr."""

    STDOUT = 1
    STDERR = 2


class SignalScope(enum.IntEnum):
    """Whom a SIGNAL reaches."""

    PROCESS = 0
    GROUP = 1
    TREE = 2
    """The process and every descendant, those that double-forked or left its session
    included."""


FILE_OPS = frozenset(
    {"read", "write", "stat", "list", "remove", "make_dir", "archive_out", "archive_in"}
)
FILE_KINDS = frozenset({"file", "dir", "symlink", "other"})


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame as read from the wire: its type, id and raw payload."""

    type: FrameType
    id: int
    payload: bytes


def encode_frame(kind: int, frame_id: int, payload: bytes = b"") -> bytes:
    """The bytes of one frame. Raises `InvalidArgumentError` for a payload over
    `MAX_PAYLOAD` or an id out of range (our own bug, never sent)."""
    if len(payload) > MAX_PAYLOAD:
        raise InvalidArgumentError(
            f"a runner frame carries at most {MAX_PAYLOAD} bytes, not {len(payload)}"
        )
    if not 0 <= frame_id <= MAX_ID:
        raise InvalidArgumentError(f"frame id out of range: {frame_id}")
    return HEADER.pack(MIN_LENGTH + len(payload), kind, frame_id) + payload


def _protocol(message: str) -> RunnerProtocolError:
    return RunnerProtocolError(f"runner protocol error: {message}")


# --- reading frames -------------------------------------------------------------------


def _check_header(length: int, kind: int, allowed: frozenset[FrameType]) -> FrameType:
    if length < MIN_LENGTH:
        raise _protocol(f"frame length {length} is below {MIN_LENGTH}")
    if length > MAX_LENGTH:
        raise _protocol(f"frame length {length} is over the bound {MAX_LENGTH}")
    try:
        frame_type = FrameType(kind)
    except ValueError:
        raise _protocol(f"unknown frame type 0x{kind:02x}") from None
    if frame_type not in allowed:
        raise _protocol(f"frame type {frame_type.name} is not one this side receives")
    return frame_type


class FrameReader:
    """Splits a byte stream into frames, holding at most one frame's bytes plus what the
    last `feed` gave.

    Incrementally: `feed(data)` returns the frames that `data` completed. From an
    asyncio stream: `await read(reader)` returns the next frame, or None at a clean end.
    A length over the bound is refused as soon as its four bytes arrive. After a
    `RunnerProtocolError` the reader stays broken (every later call raises it again):
    the caller must close the connection.
    """

    def __init__(self, allowed: frozenset[FrameType] = RUNNER_TYPES) -> None:
        self._allowed = allowed
        self._buffer = bytearray()
        self._error: RunnerProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._buffer)

    def _fail(self, error: RunnerProtocolError) -> RunnerProtocolError:
        self._error = error
        self._buffer = bytearray()
        return error

    def feed(self, data: bytes) -> list[Frame]:
        """Add `data` and return every frame it completed, in order. Feed chunks of a
        bounded size (what one socket read returns): the list holds at most one frame
        per 9 bytes of `data`."""
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        buffer += data
        frames: list[Frame] = []
        start = 0
        end = len(buffer)
        while end - start >= 4:
            length = int.from_bytes(buffer[start : start + 4], "big")
            if length < MIN_LENGTH or length > MAX_LENGTH:
                raise self._fail(self._length_error(length))
            if end - start < HEADER_SIZE:
                break
            _, kind, frame_id = HEADER.unpack_from(buffer, start)
            try:
                frame_type = _check_header(length, kind, self._allowed)
            except RunnerProtocolError as error:
                raise self._fail(error) from None
            stop = start + 4 + length
            if stop > end:
                break
            frames.append(Frame(frame_type, frame_id, bytes(buffer[start + HEADER_SIZE : stop])))
            start = stop
        if start:
            del buffer[:start]
        return frames

    @staticmethod
    def _length_error(length: int) -> RunnerProtocolError:
        if length < MIN_LENGTH:
            return _protocol(f"frame length {length} is below {MIN_LENGTH}")
        return _protocol(f"frame length {length} is over the bound {MAX_LENGTH}")

    def end(self) -> None:
        """The stream ended: raises `RunnerProtocolError` if it stopped inside a frame."""
        if self._error is not None:
            raise self._error
        if self._buffer:
            raise self._fail(_protocol(f"the stream ended inside a frame ({self.buffered} bytes)"))

    async def read(self, reader: asyncio.StreamReader) -> Frame | None:
        """The next frame from `reader`, or None when it ends between frames. Waits as
        long as the stream gives nothing: the caller puts a deadline around it where a
        frame is owed. Do not mix with `feed` on the same reader."""
        if self._error is not None:
            raise self._error
        try:
            header = await reader.readexactly(HEADER_SIZE)
        except asyncio.IncompleteReadError as short:
            if short.partial:
                raise self._fail(_protocol("the stream ended inside a frame header")) from None
            return None
        length, kind, frame_id = HEADER.unpack(header)
        try:
            frame_type = _check_header(length, kind, self._allowed)
        except RunnerProtocolError as error:
            raise self._fail(error) from None
        size = length - MIN_LENGTH
        try:
            payload = await reader.readexactly(size) if size else b""
        except asyncio.IncompleteReadError:
            raise self._fail(_protocol("the stream ended inside a frame")) from None
        return Frame(frame_type, frame_id, payload)


# --- JSON payloads ----------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _bounded_int(text: str) -> int:
    if len(text) > MAX_JSON_NUMBER_CHARS:
        raise ValueError("number too long")
    return int(text)


def _bounded_float(text: str) -> float:
    if len(text) > MAX_JSON_NUMBER_CHARS:
        raise ValueError("number too long")
    return float(text)


def _depth(value: object) -> int:
    """The nesting depth of a parsed JSON value (1 for a flat object), iteratively."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item)
    return deepest


def load_json_object(payload: bytes, *, max_bytes: int = MAX_PAYLOAD, what: str) -> JsonObject:
    """Parse a JSON object payload within the bounds above, or raise
    `RunnerProtocolError` (never another error)."""
    if len(payload) > max_bytes:
        raise _protocol(f"{what}: JSON payload of {len(payload)} bytes, over {max_bytes}")
    containers = payload.count(b"{") + payload.count(b"[")
    if containers > MAX_JSON_CONTAINERS:
        raise _protocol(f"{what}: {containers} JSON containers, over {MAX_JSON_CONTAINERS}")
    if payload.count(b",") > MAX_JSON_COMMAS:
        raise _protocol(f"{what}: more than {MAX_JSON_COMMAS} JSON items")
    try:
        text = payload.decode("utf-8")
        value = json.loads(
            text,
            parse_constant=_reject_constant,
            parse_int=_bounded_int,
            parse_float=_bounded_float,
        )
    except (ValueError, RecursionError) as error:
        raise _protocol(f"{what}: not a valid JSON payload ({type(error).__name__})") from None
    if not isinstance(value, dict):
        raise _protocol(f"{what}: the JSON payload is not an object")
    if _depth(value) > MAX_JSON_DEPTH:
        raise _protocol(f"{what}: JSON nested deeper than {MAX_JSON_DEPTH}")
    return value


def dump_json(value: Mapping[str, object]) -> bytes:
    """A JSON payload (compact, UTF-8)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _get(obj: JsonObject, key: str, what: str) -> object:
    try:
        return obj[key]
    except KeyError:
        raise _protocol(f"{what}: missing field {key!r}") from None


def _int(obj: JsonObject, key: str, what: str, low: int, high: int) -> int:
    value = _get(obj, key, what)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _protocol(f"{what}: field {key!r} is not an integer in [{low}, {high}]")
    return value


def _opt_int(obj: JsonObject, key: str, what: str, low: int, high: int) -> int | None:
    if obj.get(key) is None:
        return None
    return _int(obj, key, what, low, high)


def _str(obj: JsonObject, key: str, what: str, max_len: int = MAX_STRING) -> str:
    value = _get(obj, key, what)
    if not isinstance(value, str) or len(value) > max_len:
        raise _protocol(f"{what}: field {key!r} is not a string of at most {max_len} chars")
    return value


def _opt_str(obj: JsonObject, key: str, what: str, max_len: int = MAX_STRING) -> str | None:
    if obj.get(key) is None:
        return None
    return _str(obj, key, what, max_len)


def _bool(obj: JsonObject, key: str, what: str) -> bool:
    value = _get(obj, key, what)
    if not isinstance(value, bool):
        raise _protocol(f"{what}: field {key!r} is not a boolean")
    return value


def _list(obj: JsonObject, key: str, what: str, max_items: int) -> list[object]:
    value = _get(obj, key, what)
    if not isinstance(value, list) or len(value) > max_items:
        raise _protocol(f"{what}: field {key!r} is not a list of at most {max_items} items")
    return value


def _str_list(obj: JsonObject, key: str, what: str, max_items: int) -> tuple[str, ...]:
    items = _list(obj, key, what, max_items)
    if not all(isinstance(i, str) and len(i) <= MAX_STRING for i in items):
        raise _protocol(f"{what}: field {key!r} holds something other than short strings")
    return tuple(items)  # type: ignore[arg-type]  # checked just above


def _object(value: object, what: str) -> JsonObject:
    if not isinstance(value, dict):
        raise _protocol(f"{what}: not a JSON object")
    return value


def _fixed(payload: bytes, shape: struct.Struct, what: str) -> tuple[Any, ...]:
    if len(payload) != shape.size:
        raise _protocol(f"{what}: payload of {len(payload)} bytes, expected {shape.size}")
    return shape.unpack(payload)


def _no_payload(payload: bytes, what: str) -> None:
    if payload:
        raise _protocol(f"{what}: unexpected payload of {len(payload)} bytes")


def _stream(value: int, what: str) -> Stream:
    try:
        return Stream(value)
    except ValueError:
        raise _protocol(f"{what}: unknown stream {value}") from None


_U16_PAIR = struct.Struct(">HH")
_U8_PAIR = struct.Struct(">BB")
_U64_PAIR = struct.Struct(">QQ")
_OUTPUT_HEAD = struct.Struct(">BQ")
_GAP = struct.Struct(">BQQ")


# --- client -> runner -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """HELLO: the first frame of a connection."""

    version: int = PROTOCOL_VERSION

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.HELLO, 0, dump_json({"version": self.version}))


@dataclass(frozen=True, slots=True)
class Spawn:
    """SPAWN: start `argv` with exactly the environment `env` (nothing inherited)."""

    id: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None = None
    tty: bool = False
    rows: int = 24
    cols: int = 80
    stdin_open: bool = False
    merge_stderr: bool = False
    ring_bytes: int = 1_048_576
    backpressure: bool = False
    """An addition to v1: while an attached connection is a whole ring behind, the
    runner stops reading the process's output instead of dropping bytes."""

    def encode(self) -> bytes:
        """The frame's bytes (`InvalidArgumentError` when they exceed a frame)."""
        body: JsonObject = {
            "argv": list(self.argv),
            "env": dict(self.env),
            "cwd": self.cwd,
            "tty": self.tty,
            "rows": self.rows,
            "cols": self.cols,
            "stdin": "open" if self.stdin_open else "closed",
            "merge_stderr": self.merge_stderr,
            "ring_bytes": self.ring_bytes,
        }
        if self.backpressure:  # sent only when asked: a runner without it then refuses nothing
            body["backpressure"] = True
        return encode_frame(FrameType.SPAWN, self.id, dump_json(body))


@dataclass(frozen=True, slots=True)
class Input:
    """INPUT: bytes for a process's stdin or PTY."""

    id: int
    data: bytes

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.INPUT, self.id, self.data)


@dataclass(frozen=True, slots=True)
class CloseStdin:
    """CLOSE_STDIN: end a process's input (EOF on its stdin pipe)."""

    id: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.CLOSE_STDIN, self.id)


@dataclass(frozen=True, slots=True)
class Resize:
    """RESIZE: a PTY's new size."""

    id: int
    rows: int
    cols: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.RESIZE, self.id, _U16_PAIR.pack(self.rows, self.cols))


@dataclass(frozen=True, slots=True)
class Signal:
    """SIGNAL: deliver `signal` to the process, its group or its whole tree."""

    id: int
    signal: int
    scope: SignalScope = SignalScope.PROCESS

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.SIGNAL, self.id, _U8_PAIR.pack(self.signal, self.scope))


@dataclass(frozen=True, slots=True)
class Attach:
    """ATTACH: stream a process's output to this connection from these offsets."""

    id: int
    stdout_offset: int = 0
    stderr_offset: int = 0

    def encode(self) -> bytes:
        """The frame's bytes."""
        payload = _U64_PAIR.pack(self.stdout_offset, self.stderr_offset)
        return encode_frame(FrameType.ATTACH, self.id, payload)


@dataclass(frozen=True, slots=True)
class Detach:
    """DETACH: stop streaming a process to this connection."""

    id: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.DETACH, self.id)


@dataclass(frozen=True, slots=True)
class ListProcesses:
    """LIST: every process record the runner keeps."""

    id: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.LIST, self.id)


@dataclass(frozen=True, slots=True)
class Forget:
    """FORGET: drop an ended process's record."""

    id: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.FORGET, self.id)


@dataclass(frozen=True, slots=True)
class Ping:
    """PING: answered by a PONG with the same payload (at most 64 bytes)."""

    id: int
    payload: bytes = b""

    def encode(self) -> bytes:
        """The frame's bytes."""
        if len(self.payload) > MAX_PING:
            raise InvalidArgumentError(f"a PING carries at most {MAX_PING} bytes")
        return encode_frame(FrameType.PING, self.id, self.payload)


@dataclass(frozen=True, slots=True)
class FileRequest:
    """FILE: a file operation, `{"op": op, **args}`."""

    id: int
    op: str
    args: Mapping[str, object] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.FILE, self.id, dump_json({"op": self.op, **self.args}))


@dataclass(frozen=True, slots=True)
class UploadData:
    """DATA from the client: bytes of a write or archive_in upload."""

    id: int
    data: bytes

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.UPLOAD_DATA, self.id, self.data)


@dataclass(frozen=True, slots=True)
class UploadEnd:
    """END from the client: the upload is complete."""

    id: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.UPLOAD_END, self.id)


ClientMessage: TypeAlias = (
    Hello
    | Spawn
    | Input
    | CloseStdin
    | Resize
    | Signal
    | Attach
    | Detach
    | ListProcesses
    | Forget
    | Ping
    | FileRequest
    | UploadData
    | UploadEnd
)


def _decode_spawn(frame: Frame) -> Spawn:
    what = "SPAWN"
    body = load_json_object(frame.payload, what=what)
    env = _get(body, "env", what)
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise _protocol(f"{what}: env is not an object of strings")
    stdin = _str(body, "stdin", what, MAX_WORD)
    if stdin not in ("open", "closed"):
        raise _protocol(f"{what}: stdin is neither 'open' nor 'closed'")
    return Spawn(
        id=frame.id,
        argv=_str_list(body, "argv", what, MAX_ARGV),
        env=env,
        cwd=_opt_str(body, "cwd", what),
        tty=_bool(body, "tty", what),
        rows=_int(body, "rows", what, 0, 0xFFFF),
        cols=_int(body, "cols", what, 0, 0xFFFF),
        stdin_open=stdin == "open",
        merge_stderr=_bool(body, "merge_stderr", what),
        ring_bytes=_int(body, "ring_bytes", what, 0, MAX_OFFSET),
        backpressure=body.get("backpressure") is True,
    )


def decode_from_client(frame: Frame) -> ClientMessage:
    """The message a client frame carries (what a runner, or a test peer, reads)."""
    kind, fid, payload = frame.type, frame.id, frame.payload
    name = kind.name
    if kind == FrameType.HELLO:
        body = load_json_object(payload, max_bytes=MAX_SMALL_JSON, what=name)
        return Hello(_int(body, "version", name, 0, MAX_ID))
    if kind == FrameType.SPAWN:
        return _decode_spawn(frame)
    if kind == FrameType.INPUT:
        return Input(fid, payload)
    if kind == FrameType.CLOSE_STDIN:
        _no_payload(payload, name)
        return CloseStdin(fid)
    if kind == FrameType.RESIZE:
        rows, cols = _fixed(payload, _U16_PAIR, name)
        return Resize(fid, rows, cols)
    if kind == FrameType.SIGNAL:
        number, scope = _fixed(payload, _U8_PAIR, name)
        try:
            return Signal(fid, number, SignalScope(scope))
        except ValueError:
            raise _protocol(f"{name}: unknown scope {scope}") from None
    if kind == FrameType.ATTACH:
        out, err = _fixed(payload, _U64_PAIR, name)
        return Attach(fid, out, err)
    if kind == FrameType.DETACH:
        _no_payload(payload, name)
        return Detach(fid)
    if kind == FrameType.LIST:
        _no_payload(payload, name)
        return ListProcesses(fid)
    if kind == FrameType.FORGET:
        _no_payload(payload, name)
        return Forget(fid)
    if kind == FrameType.PING:
        if len(payload) > MAX_PING:
            raise _protocol(f"{name}: payload over {MAX_PING} bytes")
        return Ping(fid, payload)
    if kind == FrameType.FILE:
        body = load_json_object(payload, what=name)
        op = _str(body, "op", name, MAX_WORD)
        if op not in FILE_OPS:
            raise _protocol(f"{name}: unknown op {op!r}")
        del body["op"]
        return FileRequest(fid, op, body)
    if kind == FrameType.UPLOAD_DATA:
        return UploadData(fid, payload)
    if kind == FrameType.UPLOAD_END:
        _no_payload(payload, name)
        return UploadEnd(fid)
    raise _protocol(f"{name} is not a client frame")


# --- runner -> client -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HelloOk:
    """HELLO_OK: the runner accepted the connection."""

    version: int
    runner: str
    pid: int
    max_frame: int

    @property
    def id(self) -> int:
        """HELLO_OK always carries id 0."""
        return 0

    def encode(self) -> bytes:
        """The frame's bytes."""
        body = {
            "version": self.version,
            "runner": self.runner,
            "pid": self.pid,
            "max_frame": self.max_frame,
        }
        return encode_frame(FrameType.HELLO_OK, 0, dump_json(body))


@dataclass(frozen=True, slots=True)
class Spawned:
    """SPAWNED: the process runs, with this pid (in the runner's pid namespace)."""

    id: int
    pid: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.SPAWNED, self.id, dump_json({"pid": self.pid}))


@dataclass(frozen=True, slots=True)
class Output:
    """OUTPUT: `data` of `stream`, its first byte at `offset` in the stream."""

    id: int
    stream: Stream
    offset: int
    data: bytes

    def encode(self) -> bytes:
        """The frame's bytes."""
        head = _OUTPUT_HEAD.pack(self.stream, self.offset)
        return encode_frame(FrameType.OUTPUT, self.id, head + self.data)


@dataclass(frozen=True, slots=True)
class Exit:
    """EXIT: the process ended with `code` (128+N for signal N), its output drained."""

    id: int
    code: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.EXIT, self.id, dump_json({"code": self.code}))


@dataclass(frozen=True, slots=True)
class Gap:
    """GAP: bytes [start, end) of `stream` are gone from the runner's ring."""

    id: int
    stream: Stream
    start: int
    end: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.GAP, self.id, _GAP.pack(self.stream, self.start, self.end))


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One record of a LISTED answer."""

    id: int
    pid: int | None
    """None while the process is still starting."""
    argv: tuple[str, ...]
    tty: bool
    running: bool
    code: int | None
    stdout_end: int
    stderr_end: int

    def as_json(self) -> JsonObject:
        """The record as the runner sends it."""
        return {
            "id": self.id,
            "pid": self.pid,
            "argv": list(self.argv),
            "tty": self.tty,
            "running": self.running,
            "code": self.code,
            "stdout_end": self.stdout_end,
            "stderr_end": self.stderr_end,
        }


@dataclass(frozen=True, slots=True)
class Listed:
    """LISTED: every process record the runner keeps."""

    id: int
    processes: tuple[ProcessInfo, ...]
    truncated: bool = False
    """The runner left records out to fit one frame."""

    def encode(self) -> bytes:
        """The frame's bytes."""
        body = {"processes": [p.as_json() for p in self.processes], "truncated": self.truncated}
        return encode_frame(FrameType.LISTED, self.id, dump_json(body))


@dataclass(frozen=True, slots=True)
class Pong:
    """PONG: the answer to a PING, with its payload."""

    id: int
    payload: bytes

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.PONG, self.id, self.payload)


@dataclass(frozen=True, slots=True)
class Ok:
    """OK: the call succeeded; `body` is its JSON answer (often empty). `answers` is
    the frame type of the call it answers, when the runner says (its "for" field)."""

    id: int
    body: JsonObject = field(default_factory=dict)
    answers: int | None = None

    def encode(self) -> bytes:
        """The frame's bytes."""
        body = self.body if self.answers is None else {**self.body, "for": self.answers}
        return encode_frame(FrameType.OK, self.id, dump_json(body))


@dataclass(frozen=True, slots=True)
class DownloadData:
    """DATA from the runner: bytes of a read or archive_out download."""

    id: int
    data: bytes

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.DOWNLOAD_DATA, self.id, self.data)


@dataclass(frozen=True, slots=True)
class DownloadEnd:
    """END from the runner: the download is complete."""

    id: int

    def encode(self) -> bytes:
        """The frame's bytes."""
        return encode_frame(FrameType.DOWNLOAD_END, self.id)


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """ERROR: the call failed (`kind` says how, `message` for people)."""

    id: int
    kind: str
    message: str
    answers: int | None = None
    """The frame type of the call it answers, when the runner says ("for")."""

    def encode(self) -> bytes:
        """The frame's bytes."""
        body: JsonObject = {"kind": self.kind, "message": self.message}
        if self.answers is not None:
            body["for"] = self.answers
        return encode_frame(FrameType.ERROR, self.id, dump_json(body))


RunnerMessage: TypeAlias = (
    HelloOk
    | Spawned
    | Output
    | Exit
    | Gap
    | Listed
    | Pong
    | Ok
    | DownloadData
    | DownloadEnd
    | ErrorReply
)


def _decode_process(value: object) -> ProcessInfo:
    what = "LISTED process"
    obj = _object(value, what)
    return ProcessInfo(
        id=_int(obj, "id", what, 0, MAX_ID),
        pid=_opt_int(obj, "pid", what, 1, MAX_PID),
        argv=_str_list(obj, "argv", what, MAX_ARGV),
        tty=_bool(obj, "tty", what),
        running=_bool(obj, "running", what),
        code=_opt_int(obj, "code", what, 0, MAX_EXIT_CODE),
        stdout_end=_int(obj, "stdout_end", what, 0, MAX_OFFSET),
        stderr_end=_int(obj, "stderr_end", what, 0, MAX_OFFSET),
    )


def _answers(body: JsonObject, what: str) -> int | None:
    """The "for" field of an OK or ERROR (popped from `body`): the call's frame type."""
    if "for" not in body:
        return None
    value = body.pop("for")
    if not isinstance(value, int) or isinstance(value, bool) or value not in CLIENT_TYPES:
        raise _protocol(f"{what}: field 'for' is not a client frame type")
    return value


def decode_from_runner(frame: Frame) -> RunnerMessage:
    """The message a runner frame carries, every field checked and bounded."""
    kind, fid, payload = frame.type, frame.id, frame.payload
    name = kind.name
    if kind == FrameType.OUTPUT:  # the hot path first
        if len(payload) < _OUTPUT_HEAD.size:
            raise _protocol(f"{name}: payload of {len(payload)} bytes is too short")
        stream, offset = _OUTPUT_HEAD.unpack_from(payload)
        return Output(fid, _stream(stream, name), offset, payload[_OUTPUT_HEAD.size :])
    if kind == FrameType.OK:
        body = load_json_object(payload, what=name) if payload else {}
        return Ok(fid, body, _answers(body, name))
    if kind == FrameType.DOWNLOAD_DATA:
        return DownloadData(fid, payload)
    if kind == FrameType.DOWNLOAD_END:
        _no_payload(payload, name)
        return DownloadEnd(fid)
    if kind == FrameType.GAP:
        stream, start, end = _fixed(payload, _GAP, name)
        if start >= end:
            raise _protocol(f"{name}: empty or reversed range [{start}, {end})")
        return Gap(fid, _stream(stream, name), start, end)
    if kind == FrameType.EXIT:
        body = load_json_object(payload, max_bytes=MAX_SMALL_JSON, what=name)
        return Exit(fid, _int(body, "code", name, 0, MAX_EXIT_CODE))
    if kind == FrameType.SPAWNED:
        body = load_json_object(payload, max_bytes=MAX_SMALL_JSON, what=name)
        return Spawned(fid, _int(body, "pid", name, 1, MAX_PID))
    if kind == FrameType.ERROR:
        body = load_json_object(payload, max_bytes=MAX_SMALL_JSON, what=name)
        return ErrorReply(
            fid,
            _str(body, "kind", name, MAX_WORD),
            _str(body, "message", name, MAX_ERROR_MESSAGE),
            _answers(body, name),
        )
    if kind == FrameType.PONG:
        if len(payload) > MAX_PING:
            raise _protocol(f"{name}: payload over {MAX_PING} bytes")
        return Pong(fid, payload)
    if kind == FrameType.LISTED:
        body = load_json_object(payload, what=name)
        items = _list(body, "processes", name, MAX_PROCESSES)
        truncated = body.get("truncated", False)
        if not isinstance(truncated, bool):
            raise _protocol(f"{name}: field 'truncated' is not a boolean")
        return Listed(fid, tuple(_decode_process(p) for p in items), truncated)
    if kind == FrameType.HELLO_OK:
        body = load_json_object(payload, max_bytes=MAX_SMALL_JSON, what=name)
        return HelloOk(
            version=_int(body, "version", name, 0, MAX_ID),
            runner=_str(body, "runner", name, MAX_WORD),
            pid=_int(body, "pid", name, 1, MAX_PID),
            max_frame=_int(body, "max_frame", name, 0, MAX_ID),
        )
    raise _protocol(f"{name} is not a runner frame")


# --- file answers -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FileStat:
    """A `stat` answer, or one entry of a `list` answer."""

    name: str
    path: str
    kind: str
    """"file", "dir", "symlink" or "other"."""
    size: int
    mode: int
    mtime: float
    link_target: str | None = None

    def as_json(self) -> JsonObject:
        """The stat object as the runner sends it."""
        body: JsonObject = {
            "name": self.name,
            "path": self.path,
            "kind": self.kind,
            "size": self.size,
            "mode": self.mode,
            "mtime": self.mtime,
        }
        if self.link_target is not None:
            body["link_target"] = self.link_target
        return body


def decode_stat(value: object) -> FileStat:
    """A stat object of an OK answer, checked."""
    what = "stat"
    obj = _object(value, what)
    kind = _str(obj, "kind", what, MAX_WORD)
    if kind not in FILE_KINDS:
        raise _protocol(f"{what}: unknown kind {kind!r}")
    mtime = _get(obj, "mtime", what)
    if not isinstance(mtime, int | float) or isinstance(mtime, bool):
        raise _protocol(f"{what}: mtime is not a number")
    return FileStat(
        name=_str(obj, "name", what),
        path=_str(obj, "path", what),
        kind=kind,
        size=_int(obj, "size", what, 0, MAX_OFFSET),
        mode=_int(obj, "mode", what, 0, 0o177777),
        mtime=float(mtime),
        link_target=_opt_str(obj, "link_target", what),
    )


def decode_entries(body: JsonObject, max_entries: int) -> list[FileStat]:
    """The entries of a `list` answer: at most `max_entries`, each checked."""
    items = _list(body, "entries", "list", min(max_entries, MAX_ENTRIES))
    return [decode_stat(item) for item in items]


# --- output offsets ---------------------------------------------------------------------


class StreamOffsets:
    """Where each stream of one attached process must continue: every OUTPUT starts
    exactly where the last OUTPUT or GAP of its stream ended. A chunk that goes back
    (bytes seen twice) or jumps ahead without a GAP (bytes lost unsaid) is a protocol
    error."""

    __slots__ = ("_next", "_rewind")

    def __init__(self, stdout: int = 0, stderr: int = 0, *, first_may_rewind: bool = False) -> None:
        self._next = {Stream.STDOUT: stdout, Stream.STDERR: stderr}
        # An ATTACH past a stream's end starts at its end (the runner's stream is
        # shorter than the offset asked for): the first chunk may then start earlier.
        self._rewind = {Stream.STDOUT, Stream.STDERR} if first_may_rewind else set()

    def next(self, stream: Stream) -> int:
        """The offset the next chunk of `stream` must start at."""
        return self._next[stream]

    def output(self, stream: Stream, offset: int, size: int) -> None:
        """Account for an OUTPUT chunk, or raise `RunnerProtocolError`."""
        expected = self._next[stream]
        if stream in self._rewind:
            self._rewind.discard(stream)
            if offset < expected:
                expected = offset
        if offset != expected:
            way = "goes back" if offset < expected else "jumps ahead without a GAP"
            raise _protocol(f"OUTPUT of {stream.name} at {offset} {way} (expected {expected})")
        if offset + size > MAX_OFFSET:
            raise _protocol(f"OUTPUT of {stream.name} runs past the largest offset")
        self._next[stream] = offset + size

    def gap(self, stream: Stream, start: int, end: int) -> None:
        """Account for a GAP, or raise `RunnerProtocolError`."""
        expected = self._next[stream]
        self._rewind.discard(stream)
        if start != expected:
            raise _protocol(f"GAP of {stream.name} from {start}, expected {expected}")
        self._next[stream] = end


def check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` as a tuple, refused (`InvalidArgumentError`) when empty or too long."""
    items = tuple(argv)
    if not items or len(items) > MAX_ARGV:
        raise InvalidArgumentError(f"argv must hold 1 to {MAX_ARGV} strings")
    return items
