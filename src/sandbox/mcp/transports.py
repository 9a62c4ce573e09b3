"""Transports of `sandbox mcp`: stdio that never blocks a stop, and streamable HTTP.

Both serve an MCP `Server` until the peer leaves or `stop()` is called (from a signal
handler's task), and both finish promptly when stopped, so the session can be closed
right after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import anyio
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from sse_starlette.sse import AppStatus

from ..backends.toolkit.credentials import Secret
from .http_guard import AccessPolicy, RequestGuard, require_token_for

logger = logging.getLogger("sandbox.mcp")

HTTP_PATH = "/mcp"
# How long an HTTP server waits for open requests to finish when it is told to stop;
# after that uvicorn cancels them (each cancelled call tears its own process down).
HTTP_GRACEFUL_STOP_S = 3
# Lines read ahead from stdin before the server has consumed them.
STDIN_READ_AHEAD = 64


# ---- stdio without blocking threads --------------------------------------------------
#
# The SDK's default stdio streams read stdin in a worker thread that cannot be
# cancelled, so a server told to stop by a signal while the client keeps stdin open
# would wait for the client's next line. These streams read and write the same
# descriptors in daemon threads and hand the lines over through the event loop, so
# stopping never waits for the client.


class _StdinLines:
    """Async iterator of the lines read from `fd` by a daemon thread."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._room = threading.Semaphore(STDIN_READ_AHEAD)
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, name="mcp-stdin", daemon=True).start()

    def _read(self) -> None:
        stream = open(self._fd, "rb", closefd=False)
        try:
            while True:
                self._room.acquire()
                line = stream.readline()
                self._loop.call_soon_threadsafe(self._queue.put_nowait, line or None)
                if not line:
                    return
        except RuntimeError:
            return  # the loop is closed: nobody is listening any more
        except OSError as exc:
            logger.warning("reading stdin failed: %s", exc)
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._queue.put_nowait, None)

    def __aiter__(self) -> _StdinLines:
        return self

    async def __anext__(self) -> str:
        line = await self._queue.get()
        if line is None:
            self._queue.put_nowait(None)  # stay at EOF
            raise StopAsyncIteration
        self._room.release()
        return line.decode("utf-8", "replace")


class _StdoutWriter:
    """Writes to `fd` in a daemon thread; `flush()` waits (cancellably) for the write.

    A write that fails (the client closed its end: EPIPE) calls `on_broken` once and
    drops everything after it: the client is gone, so the server should stop, not
    crash.
    """

    def __init__(self, fd: int, on_broken: Callable[[], None]) -> None:
        self._fd = fd
        self._on_broken = on_broken
        self._broken = False
        self._pending: list[bytes] = []
        self._jobs: queue.SimpleQueue[tuple[bytes, asyncio.Future[None]]] = queue.SimpleQueue()
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._write, name="mcp-stdout", daemon=True).start()

    def _write(self) -> None:
        while True:
            data, done = self._jobs.get()
            broken = False
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError as exc:
                logger.info("writing to stdout failed (%s): the client is gone", exc)
                broken = True
            try:
                self._loop.call_soon_threadsafe(self._written, done, broken)
            except RuntimeError:
                return  # the loop is closed
            if broken:
                return

    def _written(self, done: asyncio.Future[None], broken: bool) -> None:
        if not done.done():
            done.set_result(None)
        if broken and not self._broken:
            self._broken = True
            self._on_broken()

    async def write(self, text: str) -> None:
        if not self._broken:
            self._pending.append(text.encode("utf-8"))

    async def flush(self) -> None:
        data = b"".join(self._pending)
        self._pending.clear()
        if not data or self._broken:
            return
        done: asyncio.Future[None] = self._loop.create_future()
        self._jobs.put((data, done))
        await done


@contextlib.contextmanager
def _claim_stdio() -> Iterator[tuple[int, int]]:
    """Move the protocol's stdin/stdout to private descriptors and point fds 0 and 1 at
    /dev/null and stderr, so nothing else in the process (a stray print, a provider
    SDK) can read or corrupt the protocol stream. Restored on exit."""
    wire_in = os.dup(0)
    wire_out = os.dup(1)
    os.set_inheritable(wire_in, False)
    os.set_inheritable(wire_out, False)
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    try:
        yield wire_in, wire_out
    finally:
        sys.stdout.flush()
        os.dup2(wire_in, 0)
        os.dup2(wire_out, 1)
        # The reader thread may still be blocked on wire_in; closing it under the
        # thread could hand the number to an unrelated file, so both stay open until
        # the process exits (they are close-on-exec).


# ---- transports ----------------------------------------------------------------------


class Transport:
    """Serves the MCP server until the peer leaves or `stop()` is called."""

    async def serve(self, server: Server[Any]) -> None:
        """Serve `server`; return when the peer has left or after `stop()`."""
        raise NotImplementedError

    def stop(self) -> None:
        """Make `serve()` return soon (callable before it started, and repeatedly)."""
        raise NotImplementedError


class StdioTransport(Transport):
    """One client on this process's stdin/stdout; done when it closes stdin, when
    stdout breaks under a write, or when stopped."""

    def __init__(self) -> None:
        self._scope: anyio.CancelScope | None = None
        self._stopped = False

    async def serve(self, server: Server[Any]) -> None:
        self._scope = anyio.CancelScope()
        if self._stopped:
            self._scope.cancel()
        with self._scope, _claim_stdio() as (wire_in, wire_out):
            # The SDK types these as anyio files; it only iterates lines from one and
            # calls write/flush on the other, which these provide.
            stdin = cast("anyio.AsyncFile[str]", _StdinLines(wire_in))
            stdout = cast("anyio.AsyncFile[str]", _StdoutWriter(wire_out, self.stop))
            async with stdio_server(stdin=stdin, stdout=stdout) as (read, write):
                await server.run(read, write, server.create_initialization_options())

    def stop(self) -> None:
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()


class _QuietUvicorn(uvicorn.Server):
    """A uvicorn server that leaves signals to us: we stop it, then close the session."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _CutStreamFilter(logging.Filter):
    """Once we stop, the event streams we end on purpose are reported by uvicorn as
    responses that did not complete: expected then, so not logged as errors."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            self.stopping
            and record.getMessage().startswith("ASGI callable returned without completing")
        )


class HttpTransport(Transport):
    """Streamable HTTP at `http://HOST:PORT/mcp` (uvicorn), for any number of clients,
    until stopped. Port 0 binds a free port; the address is announced on stderr once
    the socket listens (the readiness line).

    Every request passes `http_guard.RequestGuard` first (Host, Origin, the bearer
    `token`); `allow_hosts` and `allow_origins` widen what it accepts. The address is
    resolved here, and a non-loopback one without a token is refused here
    (`InvalidArgumentError`), before anything is started; a name that does not resolve
    raises `OSError`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token: Secret | None = None,
        allow_hosts: tuple[str, ...] = (),
        allow_origins: tuple[str, ...] = (),
    ) -> None:
        self.host = host
        self.port = port
        self._token = token
        self._allow_hosts = allow_hosts
        self._allow_origins = allow_origins
        self._address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        require_token_for(str(self._address[4][0]), token)
        self._uvicorn: _QuietUvicorn | None = None
        self._stopped = False
        self._cut_streams = _CutStreamFilter()

    def __repr__(self) -> str:
        return (
            f"HttpTransport({self.host!r}, {self.port}, token={'set' if self._token else 'none'})"
        )

    def _bind(self) -> socket.socket:
        family, kind, proto, _, address = self._address
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    async def serve(self, server: Server[Any]) -> None:
        sock = self._bind()
        try:
            await self._serve_on(server, sock)
        finally:
            sock.close()

    async def _serve_on(self, server: Server[Any], sock: socket.socket) -> None:
        host, port = sock.getsockname()[:2]
        policy = AccessPolicy.for_bind(
            host,
            port,
            names=(self.host, *self._allow_hosts),
            allow_origins=self._allow_origins,
            token=self._token,
        )
        # The SDK's own Host/Origin check is off: ours runs first, for every address, and
        # the SDK's (on only for three bind names, any port) would refuse what
        # --allow-origin admits.
        app = server.streamable_http_app(
            streamable_http_path=HTTP_PATH,
            host=self.host,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        config = uvicorn.Config(
            RequestGuard(app, policy),
            log_level="warning",
            lifespan="on",
            log_config=None,  # our logging setup (stderr, one format) applies
            timeout_graceful_shutdown=HTTP_GRACEFUL_STOP_S,
        )
        self._uvicorn = _QuietUvicorn(config)
        self._uvicorn.should_exit = self._stopped
        shown = f"[{host}]" if ":" in host else host
        # The readiness line: the socket is listening, connections queue from now on.
        print(
            f"sandbox mcp: serving MCP over streamable HTTP at http://{shown}:{port}{HTTP_PATH}",
            file=sys.stderr,
            flush=True,
        )
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addFilter(self._cut_streams)
        try:
            await self._uvicorn.serve(sockets=[sock])
        finally:
            uvicorn_log.removeFilter(self._cut_streams)

    def stop(self) -> None:
        self._stopped = True
        self._cut_streams.stopping = True
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        # A client's open event stream (GET) would hold uvicorn's graceful shutdown until
        # its timeout: tell the SDK's event-stream library to end its streams now. It
        # learns of uvicorn's exit by itself only through uvicorn's signal handlers,
        # which we do not install.
        AppStatus.should_exit = True
