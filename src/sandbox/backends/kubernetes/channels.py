"""One pods/exec WebSocket: the channel protocol (apimachinery
`pkg/util/httpstream/wsstream/doc.go`, `conn.go`).

Each binary message is one channel byte and a payload: 0 stdin, 1 stdout, 2 stderr,
3 error (the final `Status` JSON), 4 resize (`{"Width": W, "Height": H}`). The server's
first message is an empty one on its lowest writable channel. `v5.channel.k8s.io` adds
255, CLOSE: `[255, 0]` closes stdin while the output goes on; under
`v4.channel.k8s.io` stdin cannot be closed, so `close_stdin` says so (the backend then
never needs it: pipes processes get no stdin at all and file writes count their bytes).

The Status comes only once the process exited AND its stdout/stderr reached EOF
(containerd waits for the output copies; a background child holding stdout keeps the
stream open): the toolkit's wrapper kills what is left of its session at exit for that
reason, and a teardown kills the tagged tree, which ends the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

import aiohttp

from ...errors import ConnectionLostError, ProviderError
from . import bounds
from .client import V5_PROTOCOL
from .errors import exit_code_from_status, parse_status

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
# How long our close frame may wait for the server's.
CLOSE_TIMEOUT_S = 5.0

OnData = Callable[[bytes], None]


class ExecStream:
    """Reads an exec's socket on the event loop (one task) and writes to it.

    `on_stdout`/`on_stderr` get each payload; `wait()` returns the exit code from the
    final Status, or raises `ConnectionLostError` when the socket ended without one
    (and `ExecFailed` for a failure that is not an exit code).
    """

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        *,
        what: str,
        on_stdout: OnData,
        on_stderr: OnData | None = None,
        on_end: Callable[[int | BaseException], None] | None = None,
    ) -> None:
        self._ws = ws
        self._on_end = on_end
        self._closing = False
        self.protocol = ws.protocol or ""
        self._what = what
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr or on_stdout
        self._status = bytearray()
        self._status_too_long = False
        self._done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._write_lock = asyncio.Lock()
        self.ended = False
        self._reader = asyncio.ensure_future(self._read())

    @property
    def can_close_stdin(self) -> bool:
        """Whether stdin can be closed while the output goes on (v5)."""
        return self.protocol == V5_PROTOCOL

    async def _read(self) -> None:
        try:
            while True:
                msg = await self._ws.receive()
                if msg.type == aiohttp.WSMsgType.BINARY:
                    self._frame(msg.data)
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    continue  # the base64 protocols are never offered
                else:
                    break
        except (aiohttp.ClientError, OSError) as exc:
            self._finish(ConnectionLostError(f"the exec stream broke ({type(exc).__name__})"))
        except asyncio.CancelledError:
            self._finish(ConnectionLostError("the exec stream was closed"))
            raise
        except Exception as exc:  # a callback's bug must still end the stream
            self._finish(exc)
        else:
            self._finish_from_status()

    def _frame(self, data: bytes) -> None:
        if not data:
            return
        channel, payload = data[0], data[1:]
        if not payload:
            return  # the opening empty frame, or an empty write
        if channel == STDOUT:
            self._on_stdout(payload)
        elif channel == STDERR:
            self._on_stderr(payload)
        elif channel == ERROR:
            room = bounds.MAX_STATUS_BYTES - len(self._status)
            if len(payload) > room:
                self._status_too_long = True
            self._status.extend(payload[: max(0, room)])

    def _finish_from_status(self) -> None:
        if self._status_too_long:
            self._finish(ProviderError(f"could not {self._what}: the exec's status was too long"))
            return
        status = parse_status(bytes(self._status)) if self._status else None
        if status is None:
            reason = "the exec stream ended without an exit status"
            if self._ws.close_code not in (None, 1000):
                reason += f" (close code {self._ws.close_code})"
            self._finish(ConnectionLostError(reason))
            return
        try:
            self._finish(exit_code_from_status(status, self._what))
        except ProviderError as exc:
            self._finish(exc)

    def _finish(self, outcome: int | BaseException) -> None:
        self.ended = True
        if self._done.done():
            return
        if isinstance(outcome, BaseException):
            self._done.set_exception(outcome)
            self._done.exception()  # retrieved: a teardown may never ask
        else:
            self._done.set_result(outcome)
        if self._on_end is not None and not self._closing:
            self._on_end(outcome)

    async def wait(self) -> int:
        """The exit code, once the stream ended (see the class docstring)."""
        return await asyncio.shield(self._done)

    def outcome(self) -> int | BaseException | None:
        """The exit code or the failure once ended, else None (not waiting)."""
        if not self._done.done():
            return None
        exc = self._done.exception()
        return exc if exc is not None else self._done.result()

    async def _send(self, channel: int, payload: bytes) -> None:
        if self.ended or self._ws.closed:
            raise ConnectionLostError("the exec stream is closed")
        async with self._write_lock:
            try:
                await self._ws.send_bytes(bytes([channel]) + payload)
            except (aiohttp.ClientError, OSError, RuntimeError) as exc:
                raise ConnectionLostError(f"the exec stream broke ({type(exc).__name__})") from None

    async def write(self, data: bytes) -> None:
        """Send `data` on stdin, in frames of at most `STDIN_FRAME_BYTES`."""
        view = memoryview(data)
        for start in range(0, len(view), bounds.STDIN_FRAME_BYTES):
            await self._send(STDIN, bytes(view[start : start + bounds.STDIN_FRAME_BYTES]))

    async def close_stdin(self) -> None:
        """v5's CLOSE of stdin (`[255, 0]`); `ProviderError` under v4."""
        if not self.can_close_stdin:
            raise ProviderError(f"{self.protocol} cannot close stdin")
        await self._send(CLOSE, bytes([STDIN]))

    async def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size on the resize channel."""
        await self._send(RESIZE, json.dumps({"Width": cols, "Height": rows}).encode())

    async def close(self) -> None:
        """Close the socket and stop the reader (idempotent). Closing does not stop the
        process (a tty one keeps running): kill it first."""
        self._closing = True
        if not self._reader.done():
            self._reader.cancel()
        await asyncio.wait([self._reader])
        self._finish(ConnectionLostError("the exec stream was closed"))
        if not self._ws.closed:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await self._ws.close()
