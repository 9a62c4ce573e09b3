"""`RunnerClient`: one connection to a runner (docs/runner.md), over any asyncio stream
pair (a unix socket locally, a provider's exec stream elsewhere).

One task reads frames and routes them: replies resolve the call that waits for them
(each call keeps a future with a deadline its caller chose), and each attached
process's OUTPUT, GAP and EXIT go to its `ProcessSink`, in order, on the event loop
thread. When the connection ends, for whatever reason, every waiting call raises
`RunnerConnectionLost` and every sink hears `lost(reason)`.

Ids: HELLO uses 0; a process's id is chosen by the caller in [1, `MAX_PROCESS_ID`];
request ids (LIST, PING, FILE) come from the upper half of the id space, so the two can
never meet. A process id can have several calls in flight, answered out of order (an
INPUT once its bytes were written, a RESIZE at once); every OK and ERROR names the type
of the call it answers ("for"), and calls of one type on one id are answered in order,
so a reply pairs with the oldest call of its (id, type). (Without "for", from a runner
that does not send it, the oldest call of the id is taken.) ATTACH and DETACH are
answered only when refused: a PING right behind each is its barrier.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import logging
import math
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from sandbox.errors import InvalidArgumentError

from . import frames
from .errors import (
    RunnerConnectionLost,
    RunnerError,
    RunnerProtocolError,
    RunnerRequestError,
    RunnerTimeout,
)
from .frames import (
    FileStat,
    FrameReader,
    FrameType,
    HelloOk,
    ProcessInfo,
    RunnerMessage,
    SignalScope,
    Stream,
    StreamOffsets,
)

logger = logging.getLogger(__name__)

MAX_PROCESS_ID = 0x7FFF_FFFF
"""The largest process id a caller may choose (ids above are request ids)."""
_REQUEST_IDS = range(0x8000_0000, 0x1_0000_0000)

DEFAULT_CALL_TIMEOUT = 30.0
INPUT_CHUNK = 65_536
"""Input is sent in INPUT frames of at most this many bytes..."""
INPUT_WINDOW = 4
"""...with at most this many of one process's frames not yet acknowledged (the runner
answers each once its bytes reached the process): a process that reads nothing holds
back at most 256 KiB in the runner, and the writer waits."""
UPLOAD_CHUNK = 262_144
MAX_PENDING_CALLS = 65_536
"""Calls awaiting an answer on one connection. A runner that stops answering makes
callers time out; their entries stay until the answer or the end of the connection,
and this bounds how many can pile up."""
MAX_FORGIVEN = 256
"""Request ids whose call ended early (an upload refused midway): late frames for
them are dropped. Remembered in a bounded ring."""
_YIELD_EVERY = 64  # frames routed between two yields to the event loop

_T = TypeVar("_T")


class ProcessSink(Protocol):
    """Where one attached process's output goes. Called on the event loop thread, in the
    order the runner sent; none of these may block. After `exited` or `lost` nothing
    more is called."""

    def feed(self, data: bytes, stream: Stream) -> None:
        """Bytes of `stream`, following exactly what came before (or the last gap)."""

    def gap(self, start: int, end: int, stream: Stream) -> None:
        """Bytes [start, end) of `stream` are gone from the runner's ring: never seen."""

    def exited(self, code: int) -> None:
        """The process ended (`code`, 128+N for signal N) and its output was all fed."""

    def lost(self, reason: str) -> None:
        """The connection ended before the process did (it may still run in the runner:
        a new connection can attach to it)."""


@dataclass(slots=True, eq=False)
class _Call:
    """One call awaiting its answer: a reply of a type in `ends`, or ERROR."""

    request: FrameType
    ends: frozenset[FrameType]
    future: asyncio.Future[RunnerMessage]
    on_data: Callable[[bytes], None] | None = None  # downloads: DATA goes here
    on_answer: Callable[[], None] | None = None  # run when answered (not ERROR)
    settled: bool = False  # off its queue


# Calls the runner answers only when they fail.
_SILENT_ON_SUCCESS = frozenset({FrameType.ATTACH, FrameType.DETACH})


@dataclass(slots=True)
class _Route:
    """An attached process: its sink and where each stream must continue."""

    sink: ProcessSink
    offsets: StreamOffsets


@dataclass(slots=True)
class _Writer:
    """A process's input side: one write at a time, so chunks never interleave."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


def _retrieve(future: asyncio.Future[RunnerMessage]) -> None:
    # An answer may arrive after its caller gave up (a deadline); mark its exception
    # retrieved so asyncio does not log it as forgotten.
    if not future.cancelled():
        future.exception()


def _check_timeout(timeout: float) -> float:
    if not (math.isfinite(timeout) and timeout > 0):
        raise InvalidArgumentError(f"a runner call's timeout must be a positive number: {timeout}")
    return timeout


def _check_process_id(process_id: int) -> int:
    if not 1 <= process_id <= MAX_PROCESS_ID:
        raise InvalidArgumentError(f"a runner process id is in [1, {MAX_PROCESS_ID}]")
    return process_id


class RunnerClient:
    """A connection to a runner. Make one with `await RunnerClient.open(reader, writer)`
    (it says HELLO and starts routing) and end it with `aclose()`.

    Every call takes `timeout` (seconds; the client's `call_timeout` when omitted) and
    raises `RunnerTimeout` when the runner does not answer in time,
    `RunnerRequestError` when it answers ERROR, and `RunnerConnectionLost` when the
    connection ends first (a protocol error ends it too: `lost_reason` says which).
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.call_timeout = _check_timeout(call_timeout)
        self._frames = FrameReader()
        self._calls: dict[int, collections.deque[_Call]] = {}
        self._pending = 0
        self._routes: dict[int, _Route] = {}
        self._writers: dict[int, _Writer] = {}
        self._forgiven: collections.deque[int] = collections.deque(maxlen=MAX_FORGIVEN)
        self._next_request = _REQUEST_IDS.start
        self._reader_task: asyncio.Task[None] | None = None
        self._lost: str | None = None
        self._max_payload = frames.MAX_PAYLOAD
        self.hello: HelloOk | None = None
        """The runner's HELLO_OK (its version and pid), once `open` returned."""
        self.dropped_frames = 0
        """OUTPUT/GAP/EXIT frames for a process not attached here (after a detach, or
        a spawn whose caller gave up): dropped, counted."""

    # --- lifetime -----------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        timeout: float | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> RunnerClient:
        """Say HELLO on the stream pair and return the client once the runner accepted
        it (within `timeout`), routing frames from then on. On any failure the writer is
        closed and the error raised."""
        client = cls(reader, writer, call_timeout=call_timeout)
        try:
            await client._handshake(client._seconds(timeout))
        except BaseException:
            client._close_transport()
            raise
        client._reader_task = asyncio.get_running_loop().create_task(
            client._read_loop(), name="runner-client-reader"
        )
        return client

    async def _handshake(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                self._writer.write(frames.Hello().encode())
                await self._writer.drain()
                frame = await self._frames.read(self._reader)
        except TimeoutError:
            raise RunnerTimeout(f"the runner did not answer HELLO within {timeout} s") from None
        except (OSError, EOFError) as error:
            raise RunnerConnectionLost(f"the runner connection failed at HELLO: {error}") from None
        if frame is None:
            raise RunnerConnectionLost("the runner closed the connection at HELLO")
        message = frames.decode_from_runner(frame)
        if isinstance(message, frames.ErrorReply):
            raise RunnerRequestError(message.kind, message.message)
        if not isinstance(message, HelloOk):
            raise RunnerProtocolError(f"runner protocol error: {frame.type.name} before HELLO_OK")
        if message.version != frames.PROTOCOL_VERSION:
            raise RunnerProtocolError(
                f"runner speaks protocol {message.version}, this client {frames.PROTOCOL_VERSION}"
            )
        # A runner that takes smaller frames gets smaller chunks; never below 4 KiB.
        self._max_payload = max(4096, min(frames.MAX_PAYLOAD, message.max_frame))
        self.hello = message

    @property
    def closed(self) -> bool:
        """True once the connection ended (`lost_reason` says why)."""
        return self._lost is not None

    @property
    def lost_reason(self) -> str | None:
        """Why the connection ended, or None while it is up."""
        return self._lost

    @property
    def attached(self) -> frozenset[int]:
        """The ids of the processes whose output this connection routes now."""
        return frozenset(self._routes)

    async def aclose(self) -> None:
        """End the connection: waiting calls raise `RunnerConnectionLost`, sinks hear
        `lost`. The runner's processes live on (detach first to say so explicitly)."""
        self._shutdown("the client closed the connection")
        task = self._reader_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            # Shielded: cancelling `wait_closed` would cancel the writer's own future.
            await asyncio.wait_for(asyncio.shield(self._writer.wait_closed()), 1.0)

    async def wait_closed(self) -> str:
        """Wait until the connection ends (no deadline: the caller adds one) and return
        why."""
        if self._reader_task is not None:
            await asyncio.shield(self._reader_task)
        return self._lost or "the client closed the connection"

    async def __aenter__(self) -> RunnerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _close_transport(self) -> None:
        # Abort, not close: a close waits to flush what is buffered, and a runner that
        # reads nothing would keep the socket (and that buffer) forever.
        with contextlib.suppress(OSError, RuntimeError):
            self._writer.transport.abort()

    def _shutdown(self, reason: str) -> None:
        """Fail everything waiting, tell every sink; once."""
        if self._lost is not None:
            return
        self._lost = reason
        self._close_transport()
        calls, self._calls = self._calls, {}
        self._pending = 0
        for queue in calls.values():
            for call in queue:
                if not call.future.done():
                    call.future.set_exception(
                        RunnerConnectionLost(f"runner connection lost: {reason}")
                    )
        routes, self._routes = self._routes, {}
        for process_id, route in routes.items():
            try:
                route.sink.lost(reason)
            except Exception:
                logger.exception("the sink of runner process %d failed on lost()", process_id)

    # --- reading --------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        reason = "the runner closed the connection"
        try:
            routed = 0
            while True:
                frame = await self._frames.read(self._reader)
                if frame is None:
                    break
                self._dispatch(frames.decode_from_runner(frame))
                routed += 1
                if routed % _YIELD_EVERY == 0:
                    # A runner that floods must not starve the callers' deadlines.
                    await asyncio.sleep(0)
        except RunnerProtocolError as error:
            reason = str(error)
        except (OSError, EOFError) as error:
            reason = f"the runner connection failed: {error!r}"
        except Exception as error:
            # A bug of ours: end the connection loudly rather than leave calls waiting.
            logger.exception("the runner client's reader failed")
            reason = f"the runner client failed: {error!r}"
        except asyncio.CancelledError:
            reason = "the client closed the connection"
            raise
        finally:
            self._shutdown(reason)

    def _dispatch(self, message: RunnerMessage) -> None:
        if isinstance(message, frames.Output):
            route = self._routes.get(message.id)
            if route is None:
                self.dropped_frames += 1
                return
            route.offsets.output(message.stream, message.offset, len(message.data))
            if message.data:
                self._tell(message.id, route, lambda s: s.feed(message.data, message.stream))
        elif isinstance(message, frames.Gap):
            route = self._routes.get(message.id)
            if route is None:
                self.dropped_frames += 1
                return
            route.offsets.gap(message.stream, message.start, message.end)
            self._tell(
                message.id, route, lambda s: s.gap(message.start, message.end, message.stream)
            )
        elif isinstance(message, frames.Exit):
            route = self._routes.pop(message.id, None)
            if route is None:
                self.dropped_frames += 1
                return
            self._tell(message.id, route, lambda s: s.exited(message.code))
        elif isinstance(message, frames.DownloadData):
            call = self._find(message.id, message)
            if call is None:
                return
            if call.on_data is None:
                raise RunnerProtocolError(
                    f"runner protocol error: DATA for call {message.id}, which is no download"
                )
            call.on_data(message.data)
        else:
            self._answer(message)

    def _tell(self, process_id: int, route: _Route, call: Callable[[ProcessSink], None]) -> None:
        try:
            call(route.sink)
        except Exception as error:
            # Our own sink failed: stop routing this process rather than end every
            # other one's connection.
            logger.exception("the sink of runner process %d failed; detached", process_id)
            if self._routes.get(process_id) is route:
                del self._routes[process_id]
            with contextlib.suppress(Exception):
                route.sink.lost(f"the sink failed: {error!r}")

    def _find(self, frame_id: int, message: RunnerMessage) -> _Call | None:
        """The call `message` answers, or None for a late frame of a forgiven id."""
        queue = self._calls.get(frame_id)
        if not queue:
            if frame_id in self._forgiven:
                return None
            if isinstance(message, frames.ErrorReply):
                raise RunnerProtocolError(
                    f"runner protocol error: unsolicited ERROR {message.kind}: {message.message}"
                )
            raise RunnerProtocolError(
                f"runner protocol error: {type(message).__name__} for id {frame_id}, "
                "which awaits no answer"
            )
        if frame_id > MAX_PROCESS_ID:
            return queue[0]  # a request id has one call at a time
        # A process id can have several calls in flight, answered out of order (an
        # INPUT's OK comes once its bytes were written, a RESIZE's at once): the "for"
        # field, where the runner sends it, names the call's type exactly.
        want: int | None = FrameType.SPAWN if isinstance(message, frames.Spawned) else None
        if isinstance(message, frames.Ok | frames.ErrorReply):
            want = message.answers
        if want is not None:
            for call in queue:
                if call.request == want:
                    return call
            raise RunnerProtocolError(
                f"runner protocol error: {type(message).__name__} for a "
                f"{FrameType(want).name} of id {frame_id}, which awaits none"
            )
        # Without "for": first come, first answered (an OK skips the calls that are
        # answered only when they fail).
        if isinstance(message, frames.ErrorReply):
            return queue[0]
        kind = _frame_type(message)
        for call in queue:
            if kind in call.ends and call.request not in _SILENT_ON_SUCCESS:
                return call
        return queue[0]  # reported as the wrong answer by _answer

    def _answer(self, message: RunnerMessage) -> None:
        frame_id = message.id
        call = self._find(frame_id, message)
        if call is None:
            return
        if not isinstance(message, frames.ErrorReply) and _frame_type(message) not in call.ends:
            raise RunnerProtocolError(
                f"runner protocol error: {type(message).__name__} for id {frame_id}, "
                f"which awaits {'/'.join(sorted(t.name for t in call.ends))}"
            )
        self._settle(frame_id, call)
        if frame_id > MAX_PROCESS_ID and isinstance(message, frames.ErrorReply):
            # A refused request (an upload whose DATA was on its way) may draw more
            # answers: they are dropped, not taken for a protocol error.
            self._forgiven.append(frame_id)
        if not isinstance(message, frames.ErrorReply) and call.on_answer is not None:
            call.on_answer()
        if call.future.done():  # its caller gave up
            return
        if isinstance(message, frames.ErrorReply):
            call.future.set_exception(RunnerRequestError(message.kind, message.message))
        else:
            call.future.set_result(message)

    def _settle(self, frame_id: int, call: _Call) -> None:
        """Take `call` off its id's queue (once)."""
        if call.settled:
            return
        call.settled = True
        queue = self._calls.get(frame_id)
        if queue is None:
            return  # the connection ended: the queues are gone
        if queue[0] is call:
            queue.popleft()
        else:
            queue.remove(call)
        if not queue:
            del self._calls[frame_id]
        self._pending -= 1

    # --- sending ----------------------------------------------------------------------------

    def _expect(
        self,
        frame_id: int,
        request: FrameType,
        *ends: FrameType,
        on_data: Callable[[bytes], None] | None = None,
        on_answer: Callable[[], None] | None = None,
    ) -> _Call:
        """Register a call of type `request` awaiting an answer on `frame_id` (before its
        frame is sent, so the answer can never come first). `on_answer` runs when a
        non-ERROR answer is routed, before any later frame is (a detach stops routing
        right there)."""
        self._check_open()
        if self._pending >= MAX_PENDING_CALLS:
            raise RunnerError(f"{MAX_PENDING_CALLS} runner calls already await an answer")
        future: asyncio.Future[RunnerMessage] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        call = _Call(request, frozenset(ends), future, on_data, on_answer)
        self._calls.setdefault(frame_id, collections.deque()).append(call)
        self._pending += 1
        return call

    def _check_open(self) -> None:
        if self._lost is not None:
            raise RunnerConnectionLost(f"runner connection lost: {self._lost}")

    def _request_id(self) -> int:
        """A request id not awaiting an answer now."""
        for _ in range(len(self._calls) + 1):
            rid = self._next_request
            self._next_request = rid + 1 if rid + 1 < _REQUEST_IDS.stop else _REQUEST_IDS.start
            if rid not in self._calls and rid not in self._forgiven:
                return rid
        raise RunnerError("no free runner request id")  # pragma: no cover - 2**31 calls

    async def _send(self, data: bytes) -> None:
        """Queue `data` and wait until the transport took it (the caller's deadline
        bounds the wait: a runner that reads nothing stalls this)."""
        self._check_open()
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (OSError, RuntimeError) as error:
            self._shutdown(f"writing to the runner failed: {error!r}")
            raise RunnerConnectionLost(f"runner connection lost: {self._lost}") from None

    def _seconds(self, timeout: float | None) -> float:
        return _check_timeout(self.call_timeout if timeout is None else timeout)

    async def _within(self, seconds: float, what: str, work: Callable[[], Awaitable[_T]]) -> _T:
        try:
            async with asyncio.timeout(seconds):
                return await work()
        except TimeoutError:
            raise RunnerTimeout(f"runner {what}: no answer within {seconds} s") from None

    async def _call(
        self,
        frame_id: int,
        frame: bytes,
        ends: tuple[FrameType, ...],
        timeout: float | None,
        what: str,
        on_answer: Callable[[], None] | None = None,
    ) -> RunnerMessage:
        seconds = self._seconds(timeout)
        future = self._expect(frame_id, FrameType(frame[4]), *ends, on_answer=on_answer).future

        async def run() -> RunnerMessage:
            await self._send(frame)
            return await future

        try:
            return await self._within(seconds, what, run)
        finally:
            if not future.done():
                future.cancel()  # the entry stays until its answer comes, then is dropped

    # --- processes ----------------------------------------------------------------------

    async def spawn(
        self,
        process_id: int,
        argv: Iterable[str],
        *,
        env: Mapping[str, str],
        sink: ProcessSink,
        cwd: str | None = None,
        tty: bool = False,
        rows: int = 24,
        cols: int = 80,
        stdin_open: bool | None = None,
        merge_stderr: bool = False,
        ring_bytes: int = 1_048_576,
        backpressure: bool = False,
        timeout: float | None = None,
    ) -> int:
        """Start `argv` as process `process_id` with exactly the environment `env`, its
        output routed to `sink` from offset 0; return its pid (in the runner's pid
        namespace). A missing `cwd` raises `RunnerRequestError` kind "workdir", a
        missing program kind "command_not_found". `stdin_open`: writes go to the
        process (the default on a PTY); otherwise its stdin is at EOF from the start.
        `backpressure`: while this connection is a whole ring behind, the runner stops
        reading the process's output (it blocks) rather than dropping bytes."""
        _check_process_id(process_id)
        if process_id in self._routes:
            raise InvalidArgumentError(f"runner process {process_id} is attached already")
        if not 0 <= ring_bytes <= frames.MAX_RING_BYTES:
            raise InvalidArgumentError(f"ring_bytes must be in [0, {frames.MAX_RING_BYTES}]")
        request = frames.Spawn(
            id=process_id,
            argv=frames.check_argv(list(argv)),
            env=env,
            cwd=cwd,
            tty=tty,
            rows=rows,
            cols=cols,
            stdin_open=tty if stdin_open is None else stdin_open,
            merge_stderr=merge_stderr,
            ring_bytes=ring_bytes,
            backpressure=backpressure,
        )
        frame = request.encode()
        route = _Route(sink, StreamOffsets())
        self._check_open()
        self._routes[process_id] = route
        try:
            reply = await self._call(
                process_id, frame, (FrameType.SPAWNED,), timeout, f"spawn {request.argv[0]!r}"
            )
        except RunnerRequestError:
            if self._routes.get(process_id) is route:
                del self._routes[process_id]
            raise
        assert isinstance(reply, frames.Spawned)
        return reply.pid

    async def write(self, process_id: int, data: bytes, *, timeout: float | None = None) -> None:
        """Write `data` to the process's stdin or PTY, returning once the runner wrote it
        all to the process. At most `INPUT_WINDOW` chunks wait in the runner at a time,
        so a process that reads nothing makes this wait (until `timeout`), never makes
        the runner buffer without bound. Writes to one process do not interleave."""
        _check_process_id(process_id)
        if not data:
            return
        seconds = self._seconds(timeout)
        writer = self._writers.setdefault(process_id, _Writer())
        writer.users += 1
        try:
            await self._within(
                seconds, "write", lambda: self._write_locked(process_id, writer, data)
            )
        finally:
            writer.users -= 1
            if writer.users == 0 and self._writers.get(process_id) is writer:
                del self._writers[process_id]

    async def _write_locked(self, process_id: int, writer: _Writer, data: bytes) -> None:
        async with writer.lock:
            chunk = min(INPUT_CHUNK, self._max_payload)
            waiting: collections.deque[asyncio.Future[RunnerMessage]] = collections.deque()
            try:
                view = memoryview(data)
                for start in range(0, len(data), chunk):
                    while len(waiting) >= INPUT_WINDOW:
                        await waiting.popleft()
                    waiting.append(self._expect(process_id, FrameType.INPUT, FrameType.OK).future)
                    await self._send(
                        frames.Input(process_id, bytes(view[start : start + chunk])).encode()
                    )
                while waiting:
                    await waiting.popleft()
            finally:
                for future in waiting:
                    if not future.done():
                        future.cancel()

    async def close_stdin(self, process_id: int, *, timeout: float | None = None) -> None:
        """End the process's input: EOF on its stdin pipe (kind "unsupported" on a PTY,
        which has no end of input)."""
        _check_process_id(process_id)
        frame = frames.CloseStdin(process_id).encode()
        await self._call(process_id, frame, (FrameType.OK,), timeout, "close_stdin")

    async def resize(
        self, process_id: int, rows: int, cols: int, *, timeout: float | None = None
    ) -> None:
        """Set the process's PTY size."""
        _check_process_id(process_id)
        if not (1 <= rows <= 0xFFFF and 1 <= cols <= 0xFFFF):
            raise InvalidArgumentError(f"a terminal size is 1..65535 each way: {rows}x{cols}")
        frame = frames.Resize(process_id, rows, cols).encode()
        await self._call(process_id, frame, (FrameType.OK,), timeout, "resize")

    async def signal(
        self,
        process_id: int,
        signal: int,
        scope: SignalScope = SignalScope.PROCESS,
        *,
        timeout: float | None = None,
    ) -> bool:
        """Send `signal` to the process, its group, or its whole tree (every descendant,
        escapees included); returns once done, whether it reached anyone (False when
        everything had ended already)."""
        _check_process_id(process_id)
        if not 1 <= signal <= 64:
            raise InvalidArgumentError(f"not a signal number: {signal}")
        frame = frames.Signal(process_id, signal, SignalScope(scope)).encode()
        reply = await self._call(process_id, frame, (FrameType.OK,), timeout, "signal")
        assert isinstance(reply, frames.Ok)
        return reply.body.get("delivered") is not False

    async def attach(
        self,
        process_id: int,
        sink: ProcessSink,
        *,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        timeout: float | None = None,
    ) -> None:
        """Route the process's output to `sink` from these offsets (a GAP first for what
        the ring no longer holds), then live, then its EXIT (at once if it ended)."""
        _check_process_id(process_id)
        if process_id in self._routes:
            raise InvalidArgumentError(f"runner process {process_id} is attached already")
        for offset in (stdout_offset, stderr_offset):
            if not 0 <= offset <= frames.MAX_OFFSET:
                raise InvalidArgumentError(f"an output offset is a u64: {offset}")
        frame = frames.Attach(process_id, stdout_offset, stderr_offset).encode()
        route = _Route(sink, StreamOffsets(stdout_offset, stderr_offset, first_may_rewind=True))
        self._check_open()
        self._routes[process_id] = route
        try:
            await self._silent_call(process_id, frame, timeout, "attach")
        except RunnerRequestError:
            if self._routes.get(process_id) is route:
                del self._routes[process_id]
            raise

    async def detach(self, process_id: int, *, timeout: float | None = None) -> None:
        """Stop routing the process's output here (it runs on, and keeps its ring). Output
        the runner sent before it took the DETACH still reaches the sink; none after."""
        _check_process_id(process_id)
        frame = frames.Detach(process_id).encode()
        route = self._routes.get(process_id)

        def stop() -> None:
            if route is not None and self._routes.get(process_id) is route:
                del self._routes[process_id]

        try:
            await self._silent_call(process_id, frame, timeout, "detach", stop)
        except RunnerRequestError:
            stop()
            raise

    async def _silent_call(
        self,
        process_id: int,
        frame: bytes,
        timeout: float | None,
        what: str,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        """A call the runner answers only when it fails (ATTACH, DETACH). A PING sent
        right behind it bounds the wait: the runner handles frames in order, so any
        answer to the call comes before the PONG. `on_done` runs in the reader when
        the PONG is routed, the call not refused: no frame after it is routed before."""
        seconds = self._seconds(timeout)
        call = self._expect(process_id, FrameType(frame[4]), FrameType.OK)
        rid = self._request_id()

        def settled() -> None:
            refused = call.future.done() and not call.future.cancelled() and call.future.exception()
            self._settle(process_id, call)  # no answer came: none will
            if on_done is not None and not refused:
                on_done()

        barrier = self._expect(rid, FrameType.PING, FrameType.PONG, on_answer=settled)

        async def run() -> None:
            await self._send(frame + frames.Ping(rid).encode())
            await barrier.future
            if call.future.done():
                call.future.result()  # raises the runner's ERROR

        try:
            await self._within(seconds, what, run)
        finally:
            for future in (call.future, barrier.future):
                if not future.done():
                    future.cancel()

    async def forget(self, process_id: int, *, timeout: float | None = None) -> None:
        """Drop an ended process's record in the runner (kind "invalid" or similar while
        it runs)."""
        _check_process_id(process_id)
        frame = frames.Forget(process_id).encode()
        await self._call(process_id, frame, (FrameType.OK,), timeout, "forget")

    async def list(self, *, timeout: float | None = None) -> builtins.list[ProcessInfo]:
        """Every process record the runner keeps (running or ended, not forgotten)."""
        rid = self._request_id()
        reply = await self._call(
            rid, frames.ListProcesses(rid).encode(), (FrameType.LISTED,), timeout, "list"
        )
        assert isinstance(reply, frames.Listed)
        return list(reply.processes)

    async def ping(self, payload: bytes = b"", *, timeout: float | None = None) -> None:
        """A round trip: returns when the runner echoed `payload` (at most 64 bytes)."""
        rid = self._request_id()
        reply = await self._call(
            rid, frames.Ping(rid, payload).encode(), (FrameType.PONG,), timeout, "ping"
        )
        assert isinstance(reply, frames.Pong)
        if reply.payload != payload:
            error = RunnerProtocolError("runner protocol error: PONG with another payload")
            self._shutdown(str(error))
            raise error

    # --- files --------------------------------------------------------------------------

    async def _file_call(
        self, op: str, args: dict[str, object], ends: tuple[FrameType, ...], timeout: float | None
    ) -> RunnerMessage:
        rid = self._request_id()
        frame = frames.FileRequest(rid, op, args).encode()
        return await self._call(rid, frame, ends, timeout, f"file {op}")

    async def _download(
        self,
        op: str,
        args: dict[str, object],
        on_data: Callable[[bytes], None],
        timeout: float | None,
    ) -> None:
        seconds = self._seconds(timeout)
        rid = self._request_id()
        frame = frames.FileRequest(rid, op, args).encode()
        future = self._expect(rid, FrameType.FILE, FrameType.DOWNLOAD_END, on_data=on_data).future

        async def run() -> None:
            await self._send(frame)
            await future

        try:
            await self._within(seconds, f"file {op}", run)
        finally:
            if not future.done():
                future.cancel()

    async def read_file(self, path: str, *, max_bytes: int, timeout: float | None = None) -> bytes:
        """The content of the regular file at `path`, at most `max_bytes` (kind
        "too_large" when it is larger, "not_a_file", "not_found"). A runner that sends
        more than `max_bytes` anyway breaks the protocol: the connection ends."""
        if max_bytes < 0:
            raise InvalidArgumentError("max_bytes must be >= 0")
        received = bytearray()

        def on_data(data: bytes) -> None:
            if len(received) + len(data) > max_bytes:
                raise RunnerProtocolError(
                    f"runner protocol error: read of {path!r} sent more than {max_bytes} bytes"
                )
            received.extend(data)

        await self._download("read", {"path": path, "max_bytes": max_bytes}, on_data, timeout)
        return bytes(received)

    async def archive_out(
        self,
        path: str,
        on_data: Callable[[bytes], None],
        *,
        max_bytes: int,
        timeout: float | None = None,
    ) -> int:
        """Stream a tar of the folder at `path` to `on_data` (called on the event loop
        thread, must not block), at most `max_bytes` in all (more ends the connection:
        the runner could not stop otherwise); returns the byte count."""
        total = 0

        def take(data: bytes) -> None:
            nonlocal total
            total += len(data)
            if total > max_bytes:
                raise RunnerProtocolError(
                    f"runner protocol error: archive of {path!r} is over {max_bytes} bytes"
                )
            on_data(data)

        await self._download("archive_out", {"path": path}, take, timeout)
        return total

    async def _upload(
        self,
        op: str,
        args: dict[str, object],
        data: bytes | Iterable[bytes] | AsyncIterable[bytes],
        timeout: float | None,
    ) -> RunnerMessage:
        seconds = self._seconds(timeout)
        rid = self._request_id()
        frame = frames.FileRequest(rid, op, args).encode()
        future = self._expect(rid, FrameType.FILE, FrameType.OK).future
        chunk = min(UPLOAD_CHUNK, self._max_payload)

        async def send_all(piece: bytes) -> None:
            view = memoryview(piece)
            for start in range(0, len(piece), chunk):
                if future.done():  # refused midway: stop sending
                    return
                await self._send(
                    frames.UploadData(rid, bytes(view[start : start + chunk])).encode()
                )

        async def run() -> RunnerMessage:
            await self._send(frame)
            if isinstance(data, bytes | bytearray | memoryview):
                await send_all(data if isinstance(data, bytes) else bytes(data))
            elif isinstance(data, AsyncIterable):
                async for piece in data:
                    await send_all(piece)
                    if future.done():
                        break
            else:
                for piece in data:
                    await send_all(piece)
                    if future.done():
                        break
            if future.done():
                return future.result()  # refused before END: no END is sent
            await self._send(frames.UploadEnd(rid).encode())
            return await future

        try:
            return await self._within(seconds, f"file {op}", run)
        finally:
            if not future.done():
                future.cancel()

    async def write_file(
        self,
        path: str,
        data: bytes | Iterable[bytes] | AsyncIterable[bytes],
        *,
        mode: int | None = None,
        parents: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Write `data` (bytes, or chunks) to the file at `path`, replacing it as a whole
        once complete (the runner writes a temporary file and renames it)."""
        args: dict[str, object] = {"path": path, "parents": parents}
        if mode is not None:
            args["mode"] = mode
        await self._upload("write", args, data, timeout)

    async def archive_in(
        self,
        path: str,
        data: bytes | Iterable[bytes] | AsyncIterable[bytes],
        *,
        timeout: float | None = None,
    ) -> int:
        """Unpack a tar stream into the folder at `path`; returns the member count."""
        reply = await self._upload("archive_in", {"path": path}, data, timeout)
        assert isinstance(reply, frames.Ok)
        members = reply.body.get("members")
        if not isinstance(members, int) or isinstance(members, bool) or members < 0:
            raise RunnerProtocolError("runner protocol error: archive_in answered no member count")
        return members

    async def stat(self, path: str, *, timeout: float | None = None) -> FileStat:
        """What is at `path` (a final symlink is not followed)."""
        reply = await self._file_call("stat", {"path": path}, (FrameType.OK,), timeout)
        assert isinstance(reply, frames.Ok)
        return frames.decode_stat(reply.body)

    async def list_dir(
        self, path: str, *, max_entries: int = frames.MAX_ENTRIES, timeout: float | None = None
    ) -> builtins.list[FileStat]:
        """The entries of the folder at `path`, at most `max_entries`."""
        if not 0 <= max_entries <= frames.MAX_ENTRIES:
            raise InvalidArgumentError(f"max_entries must be in [0, {frames.MAX_ENTRIES}]")
        args: dict[str, object] = {"path": path, "max_entries": max_entries}
        reply = await self._file_call("list", args, (FrameType.OK,), timeout)
        assert isinstance(reply, frames.Ok)
        return frames.decode_entries(reply.body, max_entries)

    async def remove(
        self, path: str, *, recursive: bool = False, timeout: float | None = None
    ) -> None:
        """Remove the file, link or (with `recursive`, non-empty) folder at `path`."""
        args: dict[str, object] = {"path": path, "recursive": recursive}
        await self._file_call("remove", args, (FrameType.OK,), timeout)

    async def make_dir(
        self, path: str, *, parents: bool = False, timeout: float | None = None
    ) -> None:
        """Create the folder `path` (and its missing parents with `parents`)."""
        args: dict[str, object] = {"path": path, "parents": parents}
        await self._file_call("make_dir", args, (FrameType.OK,), timeout)


def _frame_type(message: RunnerMessage) -> FrameType:
    return _TYPES[type(message)]


_TYPES: dict[type, FrameType] = {
    frames.HelloOk: FrameType.HELLO_OK,
    frames.Spawned: FrameType.SPAWNED,
    frames.Output: FrameType.OUTPUT,
    frames.Exit: FrameType.EXIT,
    frames.Gap: FrameType.GAP,
    frames.Listed: FrameType.LISTED,
    frames.Pong: FrameType.PONG,
    frames.Ok: FrameType.OK,
    frames.DownloadData: FrameType.DOWNLOAD_DATA,
    frames.DownloadEnd: FrameType.DOWNLOAD_END,
    frames.ErrorReply: FrameType.ERROR,
}
