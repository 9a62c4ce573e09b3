"""Streamed one-shot commands: `session.exec_stream(...)`.

The same skeleton as `exec` (`run_one_shot` over the backend's one hook `_start_exec`,
run as a task the session owns), with a capture that queues each chunk for the caller
instead of keeping it: every backend streams, with no work of its own.

Memory is bounded by `max_buffered_bytes`: what the caller has not taken yet. The
chunks of one stream that arrive back to back while the caller is busy are joined into
one piece; a caller that falls further behind loses the excess, and is told where and
how much by an omission chunk (`ExecChunk(stream, b"", omitted=N)`), never silently. A
caller that handles each chunk without awaiting (the CLI writes to its pipe) never
falls behind: the readers run on the same event loop, only while it waits.

When the command runs behind a `CommandCheck` (a `cwd`, or `shell=False`), the bytes
that may begin its failure marker are held back until they cannot be one, so a failed
check is the error it means (`WorkdirError`, `CommandNotFoundError`), never output.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from ..errors import ExecTimeoutError, SessionStateError
from ..exec_output import START_BYTES, BoundedBytes, ExecCapture
from ..process_entry import CommandSpec
from ..settle import settle
from ..types import ExecResult
from .admission import Admission
from .oneshot import StartExec, run_one_shot
from .ownership import OwnedTasks, finished

StreamName = Literal["stdout", "stderr"]

DEFAULT_STREAM_BUFFER = 8 * 1024 * 1024
# What each waiting piece counts against the bound beside its bytes, so a flood of
# tiny chunks (one byte each, the streams alternating) is bounded too.
PIECE_COST = 64
# Chunks of one stream are joined while the caller is busy, up to this size a piece.
MAX_PIECE = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ExecChunk:
    """One piece of a streamed command's output: `stream` ("stdout" or "stderr") and its
    `data`, in the order the command wrote that stream. An omission chunk has empty
    `data` and `omitted` > 0: that many bytes of `stream` were dropped at this point
    because the caller fell more than `max_buffered_bytes` behind."""

    stream: StreamName
    data: bytes
    omitted: int = 0


class _Piece:
    """A queued chunk (several joined while the caller was busy), or an omission."""

    __slots__ = ("omitted", "parts", "size", "stream")

    def __init__(self, stream: StreamName) -> None:
        self.stream: StreamName = stream
        self.parts: list[bytes] = []
        self.size = 0
        self.omitted = 0

    def chunk(self) -> ExecChunk:
        data = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        return ExecChunk(self.stream, data, self.omitted)


def marker_cut(data: bytes, prefix: bytes) -> int:
    """Where in `data` a failure marker (beginning with `prefix`) begins or may begin:
    the index of `prefix`, else of a trailing part of `data` that `prefix` starts with,
    else `len(data)` (nothing need be held)."""
    at = data.find(prefix)
    if at >= 0:
        return at
    at = data.find(prefix[:1], max(0, len(data) - len(prefix) + 1))
    while at >= 0:
        if prefix.startswith(data[at:]):
            return at
        at = data.find(prefix[:1], at + 1)
    return len(data)


class StreamCapture(ExecCapture):
    """An `ExecCapture` that queues each chunk for the caller (bounded to `bound` bytes
    not yet taken) and keeps only the first bytes of each stream (the command check's
    verdict is read there). `wake()` is called whenever something was queued."""

    def __init__(self, bound: int, *, timeout: float | None, wake: Callable[[], None]) -> None:
        super().__init__(0, timeout=timeout)
        self.bound = bound
        self.omitted: dict[StreamName, int] = {"stdout": 0, "stderr": 0}
        self._wake = wake
        self._pieces: deque[_Piece] = deque()
        self._buffered = 0
        # Per stream: the omission piece still queued with no data of that stream after
        # it (more dropped bytes are added to it), and the bytes held back as a possible
        # check marker.
        self._open_omission: dict[StreamName, _Piece | None] = {"stdout": None, "stderr": None}
        self._held: dict[StreamName, bytes] = {"stdout": b"", "stderr": b""}

    def add_stdout(self, data: bytes | bytearray | memoryview) -> None:
        """Queue a stdout chunk."""
        self._add("stdout", self.stdout, data)

    def add_stderr(self, data: bytes | bytearray | memoryview) -> None:
        """Queue a stderr chunk."""
        self._add("stderr", self.stderr, data)

    def take(self) -> ExecChunk | None:
        """The oldest queued chunk, or None."""
        if not self._pieces:
            return None
        piece = self._pieces.popleft()
        if piece.omitted:
            if self._open_omission[piece.stream] is piece:
                self._open_omission[piece.stream] = None
        else:
            self._buffered -= piece.size + PIECE_COST
        return piece.chunk()

    def result(self, exit_code: int) -> ExecResult:
        """The end of a command that ran to its end: the check's error if it failed,
        else an `ExecResult` without output (it was streamed) whose `*_omitted` count
        what the caller lost by falling behind."""
        error = self.check_error(exit_code)
        if error is not None:
            raise error
        self._release_held()
        return ExecResult(
            stdout=b"",
            stderr=b"",
            exit_code=exit_code,
            stdout_omitted=self.omitted["stdout"],
            stderr_omitted=self.omitted["stderr"],
        )

    def timeout_error(self, display: str, timeout: float | None) -> ExecTimeoutError:
        """The `ExecTimeoutError` for a command killed at its timeout, without output:
        what it printed was streamed already."""
        self._release_held()
        return ExecTimeoutError.killed(display, timeout, b"", b"")

    def _add(
        self, name: StreamName, kept: BoundedBytes, chunk: bytes | bytearray | memoryview
    ) -> None:
        data = bytes(chunk)  # a backend may reuse its buffer once we return
        if not data:
            return
        seen = kept.total
        kept.total += len(data)
        if seen < START_BYTES:
            kept.start += data[: START_BYTES - seen]
            if self.check is not None:
                # A failure marker is looked for in the first bytes only: hold back
                # what may begin one until it cannot, or the command's end says.
                data = self._held[name] + data
                cut = marker_cut(data, self.check.failure_prefix)
                self._held[name] = data[cut:]
                data = data[:cut]
        elif self._held[name]:
            data = self._held[name] + data
            self._held[name] = b""
        self._queue(name, data)

    def _release_held(self) -> None:
        for name in ("stdout", "stderr"):
            held = self._held[name]
            if held:
                self._held[name] = b""
                self._queue(name, held)

    def _queue(self, name: StreamName, data: bytes) -> None:
        if not data:
            return
        last = self._pieces[-1] if self._pieces else None
        join = (
            last is not None and last.stream == name and not last.omitted and last.size < MAX_PIECE
        )
        room = self.bound - self._buffered - (0 if join else PIECE_COST)
        keep = len(data) if len(data) <= room else max(0, room)
        if keep:
            if join:
                assert last is not None
                piece = last
            else:
                piece = _Piece(name)
                self._pieces.append(piece)
                self._buffered += PIECE_COST
            piece.parts.append(data if keep == len(data) else data[:keep])
            piece.size += keep
            self._buffered += keep
            self._open_omission[name] = None
        dropped = len(data) - keep
        if dropped:
            self.omitted[name] += dropped
            omission = self._open_omission[name]
            if omission is None:
                omission = self._open_omission[name] = _Piece(name)
                self._pieces.append(omission)
            omission.omitted += dropped
        self._wake()


class ExecStream:
    """A command whose output is taken as it comes: `session.exec_stream(...)`.

    Use it as::

        async with session.exec_stream("make") as stream:
            async for chunk in stream:  # ExecChunk(stream, data, omitted)
                ...
        print(stream.exit_code)

    The command starts when the `async with` is entered. Its chunks come in the order
    each stream was written (stdout and stderr apart); the iteration then ends, and
    `exit_code` holds its exit status. Instead of ending, the iteration raises what
    `exec` raises: `ExecTimeoutError` at the timeout (the tree killed first; its
    `stdout`/`stderr` are empty, the chunks were yielded already), `WorkdirError` or
    `CommandNotFoundError` for a command that could not start, `SessionClosedError`
    if the session was closed. Leaving the `async with` before the end (a `break`, an
    error), or a cancellation while waiting for a chunk, kills the command's tree,
    settled, before going on.
    """

    def __init__(
        self,
        start: StartExec,
        spec: CommandSpec,
        *,
        timeout: float | None,
        max_buffered_bytes: int,
        admission: Admission,
        owned: OwnedTasks[Any],
    ) -> None:
        self._start = start
        self._spec = spec
        self._timeout = timeout
        self._bound = max_buffered_bytes
        self._admission = admission
        self._owned = owned
        self._capture: StreamCapture | None = None
        self._task: asyncio.Task[ExecResult] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self.exit_code: int | None = None
        """The command's exit status once the iteration ended (128+N for a death by
        signal N); None before, or if the stream ended with an error."""

    @property
    def stdout_omitted(self) -> int:
        """Bytes of stdout dropped so far because the caller fell behind."""
        return 0 if self._capture is None else self._capture.omitted["stdout"]

    @property
    def stderr_omitted(self) -> int:
        """Bytes of stderr dropped so far because the caller fell behind."""
        return 0 if self._capture is None else self._capture.omitted["stderr"]

    async def __aenter__(self) -> ExecStream:
        if self._task is not None:
            raise SessionStateError("an exec_stream runs its command once: make a new one")
        await self._admission.admit()
        capture = StreamCapture(self._bound, timeout=self._timeout, wake=self._wake)
        self._capture = capture
        # The session owns the command: its close cancels the task (the tree is killed).
        self._task = self._owned.begin(
            run_one_shot(self._start, self._spec, self._timeout, capture)
        )
        self._task.add_done_callback(lambda _: self._wake())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop()

    def __aiter__(self) -> ExecStream:
        return self

    async def __anext__(self) -> ExecChunk:
        capture, task = self._capture, self._task
        if capture is None or task is None:
            raise SessionStateError(
                "iterate an exec_stream inside `async with session.exec_stream(...) as s:`"
            )
        while True:
            chunk = capture.take()
            if chunk is not None:
                return chunk
            if task.done():
                break
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            except asyncio.CancelledError:
                await self._stop()
                raise
            finally:
                self._waiter = None
        if self._ended:
            raise StopAsyncIteration
        self._ended = True
        result = await self._owned.wait(task)  # done: its outcome, or SessionClosedError
        self.exit_code = result.exit_code
        raise StopAsyncIteration

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _stop(self) -> None:
        """Kill the command if it still runs (cancel its task, settled); the caller's own
        exit or cancellation is what goes on."""
        task = self._task
        if task is None:
            return
        self._ended = True
        if not task.done():
            task.cancel()
            await settle(finished(task))
        if not task.cancelled():
            task.exception()  # taken: the caller left, its own outcome is the one that counts
