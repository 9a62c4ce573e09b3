"""A loopback Cloudflare Sandbox Worker: test code that uses the `cloudflare` backend
without a Cloudflare account or network access.

`CloudflareWorkerServer` is an aiohttp server on 127.0.0.1 (a free port) that speaks the
Worker protocol the backend uses, over REAL local processes (`sandbox.local_process`):

==========================================  ==============================================
`POST   /v1/sandbox`                        create a sandbox: ``{"id": ...}``; each one
                                            is a fresh directory (its cwd and HOME)
`DELETE /v1/sandbox/{id}`                   delete it: kills its processes, closes its
                                            terminals, removes the directory (404 if
                                            unknown)
`GET    /v1/sandbox/{id}/running`           ``{"running": true}``
`GET|PUT /v1/sandbox/{id}/file/<path>`      raw bytes; relative paths are in the
                                            sandbox directory; 404 missing, 403 outside,
                                            409 not a regular file (a directory, FIFO,
                                            socket, device; for PUT also a parent that
                                            is a file), never opened to wait on; GET
                                            takes ``?max_bytes=N``: 413 ``{"size": S}``
                                            above it, before sending anything
`POST   /v1/sandbox/{id}/exec`              ``{"argv": [...], "timeout_ms": N}`` ->
                                            server-sent events: ``stdout``/``stderr``
                                            (base64), then ``exit`` ``{"exit_code": N}``
                                            or ``error`` ``{"error": "..."}``
`GET    /v1/sandbox/{id}/pty?cols=&rows=`   WebSocket to an interactive shell (bash -i,
                                            TERM set): output before ``{"type":
                                            "ready"}``, raw bytes both ways in binary
                                            frames, ``{"type": "exit", "code": N}``,
                                            ``{"type": "error", "message": ...}``; the
                                            client may send ``{"type": "resize", ...}``
==========================================  ==============================================

Every request must carry ``Authorization: Bearer <api_key>`` (else 401). A one-shot
command is killed (its whole process group) when its timeout expires or its client goes
away; a terminal's processes are killed when its socket closes.

The awkward parts of the real service are reproduced on purpose, always:

- a terminal sends output (a banner, `pre_ready_output`, and the shell's first prompt)
  BEFORE its ``ready`` frame;
- event streams mix CR, LF and CRLF line ends, include comments and ``id:`` lines, and
  are written in pieces cut at random places (mid-line, between CR and LF), so a client
  sees events split across network chunks. `seed` makes the cuts reproducible.

Fault injection (all of it can be changed while the server runs):

- ``server.fail(endpoint, status, times=1, body=None)``: answer the next `times`
  requests of an endpoint (``"create"``, ``"delete"``, ``"running"``, ``"exec"``,
  ``"file_get"``, ``"file_put"``, ``"pty"``) with `status` (503, 401, 404, 500...).
  For ``"pty"`` this refuses the WebSocket handshake.
- ``stall = server.stall(point)``: requests reaching `point` wait until
  ``stall.release()``; ``await stall.reached.wait()`` tells a test that one is blocked
  there, so it can cancel the client deterministically. Points: the endpoints above
  (before anything is done), ``"exec_stream"`` (after the first output event),
  ``"pty_ready"`` (after the early output, before ``ready``), ``"pty_input"`` (holding
  a terminal's input frame before it reaches the shell, so later writes back up) and ``"pty_close"``
  (when the client's close frame arrives, before it is answered).
- ``server.drop_pty_connections()``: abort every open terminal socket (a dropped
  connection, mid-stream).
- ``server.drop_exec_after_events = N``: abort an exec stream after N events.
- ``server.exec_omit_exit = True``: end exec streams cleanly but without ``exit``.
- ``server.exec_error = "message"``: answer exec with an ``error`` event.
- ``server.pty_error_instead_of_ready = "message"``: an ``error`` frame, then close,
  instead of ``ready``.
- ``await server.send_pty_error("message")``: an ``error`` frame to every terminal.

What a test can look at: `sandboxes` (live ones, with their `root` directory),
`deleted` (ids), `requests` (method, path, endpoint, authorized, client port: never
headers), `exec_bodies` (the JSON of each exec request), `live_processes()` and
`open_terminals()`.

Usage::

    async with CloudflareWorkerServer(api_key="test-key") as server:
        async with sandbox.open_session(
            "cloudflare", worker_url=server.url, api_key="test-key"
        ) as session:
            print(await session.exec("echo hi"))
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import os
import random
import secrets
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from .. import local_files
from ..errors import (
    FileTooLargeError,
    NotAFileError,
    ProcessExitedError,
    SandboxError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)
from ..local_process import LocalProcess
from ..settle import settle

ENDPOINTS = ("create", "delete", "running", "exec", "file_get", "file_put", "pty")
STALL_POINTS = (*ENDPOINTS, "exec_stream", "pty_ready", "pty_input", "pty_close")
DEFAULT_PRE_READY_OUTPUT = b"Cloudflare Sandbox terminal\r\n"
# After a process exits, how long its last output may take to arrive.
EXIT_DRAIN_S = 0.05
# How long a terminal waits for the shell's first prompt before sending `ready` anyway.
FIRST_PROMPT_WAIT_S = 2.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Stall:
    """A place where requests wait until `release()`.

    `reached` is set when a request starts waiting here; `abandoned` when a waiting
    request was cancelled (its client went away), so a test knows the server has seen
    the disconnect before it releases the stall.
    """

    def __init__(self, point: str) -> None:
        self.point = point
        self.reached = asyncio.Event()
        self.abandoned = asyncio.Event()
        self.hits = 0
        self._released = asyncio.Event()

    @property
    def released(self) -> bool:
        """True once `release()` was called."""
        return self._released.is_set()

    def release(self) -> None:
        """Let every waiting (and future) request through."""
        self._released.set()

    async def hold(self) -> None:
        """Called by the server at the stall point."""
        self.hits += 1
        self.reached.set()
        try:
            await self._released.wait()
        except asyncio.CancelledError:
            self.abandoned.set()
            raise


@dataclass
class _Failure:
    status: int
    times: int
    body: str | None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as the server saw it (no headers: those carry the key)."""

    method: str
    path: str
    endpoint: str
    authorized: bool
    client_port: int | None = None


@dataclass(eq=False)
class _Connection:
    """A running exec stream or terminal, so a delete can end it."""

    request: web.Request
    done: asyncio.Event = field(default_factory=asyncio.Event)
    proc: LocalProcess | None = None
    ws: web.WebSocketResponse | None = None


@dataclass(eq=False)
class FakeSandbox:
    """One sandbox: a directory, and the exec streams and terminals running in it."""

    id: str
    root: str
    connections: set[_Connection] = field(default_factory=set)


class _SseWriter:
    """Writes events with mixed line ends, cut into randomly sized pieces."""

    _LINE_ENDS = (b"\n", b"\r\n", b"\r")

    def __init__(self, resp: web.StreamResponse, rng: random.Random, split: bool) -> None:
        self._resp = resp
        self._rng = rng
        self._split = split
        self._previous_end = b"\n"
        self._count = 0

    def _line(self, content: bytes) -> bytes:
        end = self._rng.choice(self._LINE_ENDS)
        if not content and self._previous_end == b"\r" and end == b"\n":
            # CR then an empty LF line would read as ONE CRLF line end: the event would
            # not end here. A real server cannot send that either.
            end = b"\r\n"
        self._previous_end = end
        return content + end

    async def event(self, name: str, data: str) -> None:
        """Write one event (with an `id:` line, and now and then a comment)."""
        self._count += 1
        blob = b""
        if self._count % 3 == 1:
            blob += self._line(b": keep-alive")
        blob += self._line(f"event: {name}".encode())
        blob += self._line(f"id: {self._count}".encode())
        blob += self._line(f"data: {data}".encode())
        blob += self._line(b"")
        await self._write(blob)

    async def comment(self, text: str) -> None:
        """Write a comment line (clients ignore it)."""
        await self._write(self._line(f": {text}".encode()))

    async def _write(self, blob: bytes) -> None:
        if not self._split or len(blob) < 2:
            await self._resp.write(blob)
            return
        cuts = sorted(self._rng.sample(range(1, len(blob)), min(3, len(blob) - 1)))
        crlf = blob.find(b"\r\n")
        if crlf >= 0 and self._rng.random() < 0.5:
            cuts = sorted({*cuts, crlf + 1})  # between CR and LF
        start = 0
        for cut in [*cuts, len(blob)]:
            await self._resp.write(blob[start:cut])
            start = cut


class CloudflareWorkerServer:
    """A loopback Cloudflare Sandbox Worker over real local processes (see the module
    docstring for the endpoints and every fault knob).

    `api_key` is the bearer key clients must send. `root` is where sandbox directories
    are made (default: a temporary directory, removed on close). `shell` is the argv of
    the terminal's interactive shell (default bash, else sh). `seed` fixes how event
    streams are cut into pieces; `split_events=False` writes them whole.
    """

    def __init__(
        self,
        api_key: str,
        *,
        root: str | os.PathLike[str] | None = None,
        shell: list[str] | None = None,
        seed: int = 0,
        split_events: bool = True,
        pre_ready_output: bytes = DEFAULT_PRE_READY_OUTPUT,
    ) -> None:
        if not api_key:
            raise ValueError("api_key must be a non-empty str")
        self._api_key = api_key
        self._given_root = os.fspath(root) if root is not None else None
        self._root: str | None = None
        self.shell = shell or _default_shell()
        self.split_events = split_events
        self.pre_ready_output = pre_ready_output
        self.drop_exec_after_events: int | None = None
        self.exec_omit_exit = False
        self.exec_error: str | None = None
        self.pty_error_instead_of_ready: str | None = None
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.deleted: list[str] = []
        self.requests: list[RequestRecord] = []
        self.exec_bodies: list[object] = []
        self._rng = random.Random(seed)
        self._failures: dict[str, list[_Failure]] = {}
        self._stalls: dict[str, Stall] = {}
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._processes: set[LocalProcess] = set()
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __repr__(self) -> str:
        return f"<CloudflareWorkerServer url={self._url!r} sandboxes={len(self.sandboxes)}>"

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The Worker URL to give the backend (``http://127.0.0.1:<port>``)."""
        if self._url is None:
            raise RuntimeError("the server is not started")
        return self._url

    async def start(self) -> None:
        """Bind 127.0.0.1 on a free port and start serving."""
        self._root = _make_root(self._given_root)
        app = web.Application(middlewares=[self._auth_middleware], client_max_size=1 << 30)
        app.add_routes(
            [
                web.post("/v1/sandbox", self._wrap("create", self._create)),
                web.delete("/v1/sandbox/{id}", self._wrap("delete", self._delete)),
                web.get("/v1/sandbox/{id}/running", self._wrap("running", self._running)),
                web.get("/v1/sandbox/{id}/file/{path:.*}", self._wrap("file_get", self._get)),
                web.put("/v1/sandbox/{id}/file/{path:.*}", self._wrap("file_put", self._put)),
                web.post("/v1/sandbox/{id}/exec", self._wrap("exec", self._exec)),
                web.get("/v1/sandbox/{id}/pty", self._wrap("pty", self._pty)),
            ]
        )
        # handler_cancellation: a client that goes away cancels its handler, which is
        # how a timed-out or cancelled exec gets its process group killed.
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self._url = f"http://{host}:{port}"

    async def close(self) -> None:
        """Stop serving: release every stall, end every process and socket, remove the
        sandbox directories (and the root if it was temporary)."""
        for stall in self._stalls.values():
            stall.release()
        for sandbox_id in list(self.sandboxes):
            await self._destroy(sandbox_id)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self._root is not None and self._given_root is None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._url = None

    async def __aenter__(self) -> CloudflareWorkerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ---- fault injection -------------------------------------------------------------

    def fail(self, endpoint: str, status: int, *, times: int = 1, body: str | None = None) -> None:
        """Answer the next `times` requests to `endpoint` with HTTP `status` (and `body`,
        default a JSON error)."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; known: {', '.join(ENDPOINTS)}")
        self._failures.setdefault(endpoint, []).append(_Failure(status, times, body))

    def stall(self, point: str) -> Stall:
        """Make requests wait at `point` until the returned stall is released."""
        if point not in STALL_POINTS:
            raise ValueError(f"unknown stall point {point!r}; known: {', '.join(STALL_POINTS)}")
        stall = Stall(point)
        self._stalls[point] = stall
        return stall

    def drop_pty_connections(self) -> int:
        """Abort every open terminal socket without a close frame; returns how many."""
        dropped = 0
        for sandbox in self.sandboxes.values():
            for conn in sandbox.connections:
                if conn.ws is not None and conn.request.transport is not None:
                    conn.request.transport.abort()
                    dropped += 1
        return dropped

    async def send_pty_error(self, message: str) -> int:
        """Send an ``error`` frame to every open terminal; returns how many got it."""
        sent = 0
        for sandbox in list(self.sandboxes.values()):
            for conn in list(sandbox.connections):
                if conn.ws is not None and not conn.ws.closed:
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await conn.ws.send_str(json.dumps({"type": "error", "message": message}))
                        sent += 1
        return sent

    # ---- observation -------------------------------------------------------------------

    def live_processes(self) -> int:
        """Processes started by the server that are not yet killed and reaped."""
        return len(self._processes)

    async def wait_idle(self) -> None:
        """Wait until no exec stream or terminal is being served (each one's processes
        are then killed and reaped)."""
        await self._idle.wait()

    def open_terminals(self) -> int:
        """Terminal WebSockets currently open."""
        return sum(
            1
            for sandbox in self.sandboxes.values()
            for conn in sandbox.connections
            if conn.ws is not None and not conn.ws.closed
        )

    # ---- request plumbing --------------------------------------------------------------

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {self._api_key}"
        authorized = hmac.compare_digest(given.encode(), expected.encode())
        endpoint = _endpoint_of(request)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        port = peer[1] if isinstance(peer, tuple) else None
        self.requests.append(
            RequestRecord(request.method, request.path, endpoint, authorized, port)
        )
        if not authorized:
            return web.json_response({"error": "unauthorized"}, status=401)
        return await handler(request)

    def _wrap(self, endpoint: str, handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            failures = self._failures.get(endpoint)
            if failures:
                failure = failures[0]
                failure.times -= 1
                if failure.times <= 0:
                    failures.pop(0)
                body = (
                    failure.body
                    if failure.body is not None
                    else json.dumps({"error": f"injected failure {failure.status}"})
                )
                return web.Response(
                    status=failure.status, text=body, content_type="application/json"
                )
            await self._maybe_stall(endpoint)
            return await handler(request)

        return wrapped

    async def _maybe_stall(self, point: str) -> None:
        stall = self._stalls.get(point)
        if stall is not None and not stall.released:
            await stall.hold()

    def _sandbox(self, request: web.Request) -> FakeSandbox:
        sandbox = self.sandboxes.get(request.match_info["id"])
        if sandbox is None:
            raise web.HTTPNotFound(
                text=json.dumps({"error": "no such sandbox"}), content_type="application/json"
            )
        return sandbox

    def _env(self, sandbox: FakeSandbox, *, tty: bool) -> dict[str, str]:
        # A small environment of its own: nothing from the test process (which may hold
        # the real credentials) leaks into the sandbox.
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": sandbox.root,
            "LANG": "C.UTF-8",
            "HISTFILE": "/dev/null",
        }
        if tty:
            env.update({"TERM": "xterm-256color", "PS1": "$ "})
        return env

    def _open_connection(self, sandbox: FakeSandbox, request: web.Request) -> _Connection:
        conn = _Connection(request)
        sandbox.connections.add(conn)
        self._active += 1
        self._idle.clear()
        return conn

    def _close_connection(self, sandbox: FakeSandbox, conn: _Connection) -> None:
        sandbox.connections.discard(conn)
        conn.done.set()
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    def _spawn(self, argv: list[str], **kwargs: Any) -> LocalProcess:
        proc = LocalProcess.spawn(argv, **kwargs)
        self._processes.add(proc)
        return proc

    async def _kill(self, conn: _Connection, grace_s: float) -> None:
        """Kill a connection's process group (after `grace_s` of polite signals), reap."""
        proc = conn.proc
        if proc is None:
            return
        try:
            await proc.terminate(grace_s)
        finally:
            conn.proc = None
            self._processes.discard(proc)

    # ---- sandboxes ----------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.StreamResponse:
        assert self._root is not None
        sandbox_id = "sbx-" + secrets.token_hex(6)
        root = os.path.join(self._root, sandbox_id)
        os.makedirs(root)
        self.sandboxes[sandbox_id] = FakeSandbox(sandbox_id, root)
        return web.json_response({"id": sandbox_id})

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        sandbox_id = request.match_info["id"]
        if sandbox_id not in self.sandboxes:
            return web.json_response({"error": "no such sandbox"}, status=404)
        await self._destroy(sandbox_id)
        return web.json_response({"deleted": True})

    async def _destroy(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            return
        for conn in list(sandbox.connections):
            if conn.request.transport is not None:
                conn.request.transport.abort()
        for conn in list(sandbox.connections):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await conn.done.wait()
        self.sandboxes.pop(sandbox_id, None)
        self.deleted.append(sandbox_id)
        shutil.rmtree(sandbox.root, ignore_errors=True)

    async def _running(self, request: web.Request) -> web.StreamResponse:
        self._sandbox(request)
        return web.json_response({"running": True})

    # ---- files ----------------------------------------------------------------------------

    async def _get(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._sandbox(request)
        path = request.match_info["path"]
        limit = request.query.get("max_bytes")
        if limit is not None and not limit.isdigit():
            return web.json_response({"error": "max_bytes must be an int >= 0"}, status=400)
        try:
            # Opened beneath the sandbox directory in one step, regular files only (a
            # FIFO is refused, never opened to wait on).
            data = await local_files.read_whole(
                sandbox.root, path, int(limit) if limit is not None else sys.maxsize
            )
        except FileTooLargeError as exc:
            return web.json_response({"error": exc.message, "size": exc.size}, status=413)
        except SandboxError as exc:
            return _file_error(exc)
        return web.Response(body=data, content_type="application/octet-stream")

    async def _put(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._sandbox(request)
        data = await request.read()
        try:
            await local_files.write_whole(sandbox.root, request.match_info["path"], data)
        except SandboxError as exc:
            return _file_error(exc)
        return web.json_response({"written": len(data)})

    # ---- one-shot exec ----------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._sandbox(request)
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "body must be JSON"}, status=400)
        self.exec_bodies.append(body)
        argv = body.get("argv") if isinstance(body, dict) else None
        if (
            not isinstance(argv, list)
            or not argv
            or not all(isinstance(a, str) and "\x00" not in a for a in argv)
        ):
            return web.json_response({"error": "argv must be a list of strings"}, status=400)
        timeout_ms = body.get("timeout_ms")
        if timeout_ms is not None and (not isinstance(timeout_ms, int) or timeout_ms <= 0):
            return web.json_response({"error": "timeout_ms must be a positive int"}, status=400)

        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        conn = self._open_connection(sandbox, request)
        try:
            await resp.prepare(request)
            writer = _SseWriter(resp, self._rng, self.split_events)
            if self.exec_error is not None:
                await writer.event("error", json.dumps({"error": self.exec_error}))
                await resp.write_eof()
                return resp
            await writer.comment("stream open")
            await self._run_exec(conn, sandbox, argv, timeout_ms, writer)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away: the finally below kills what is left
        finally:
            try:
                await settle(self._kill(conn, 0))
            finally:
                self._close_connection(sandbox, conn)
        return resp

    async def _run_exec(
        self,
        conn: _Connection,
        sandbox: FakeSandbox,
        argv: list[str],
        timeout_ms: int | None,
        writer: _SseWriter,
    ) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        try:
            conn.proc = self._spawn(
                argv,
                tty=False,
                env=self._env(sandbox, tty=False),
                cwd=sandbox.root,
                on_stdout=lambda data: queue.put_nowait(("stdout", data)),
                on_stderr=lambda data: queue.put_nowait(("stderr", data)),
                on_exit=lambda code: queue.put_nowait(("exit", b"")),
                on_eof=lambda: queue.put_nowait(("eof", b"")),
            )
        except OSError as exc:
            # Like a shell: a command that cannot be started exits with 127.
            await writer.event("stderr", _b64(f"{argv[0]}: {exc.strerror}\n".encode()))
            await writer.event("exit", json.dumps({"exit_code": 127}))
            return
        proc = conn.proc
        deadline = loop.time() + timeout_ms / 1000 if timeout_ms is not None else None
        events = 0
        exited_at: float | None = None
        eof = False
        while not (exited_at is not None and eof):
            limit = deadline
            if exited_at is not None:
                limit = exited_at + EXIT_DRAIN_S
            try:
                async with asyncio.timeout_at(limit):
                    kind, data = await queue.get()
            except TimeoutError:
                if exited_at is not None:
                    break  # a background child holds the pipes: the group is killed below
                await proc.terminate(0)
                await writer.event(
                    "error", json.dumps({"error": f"command timed out after {timeout_ms} ms"})
                )
                return
            if kind == "exit":
                exited_at = loop.time()
            elif kind == "eof":
                eof = True
            else:
                await writer.event(kind, _b64(data))
                events += 1
                if (
                    self.drop_exec_after_events is not None
                    and events >= self.drop_exec_after_events
                ):
                    assert conn.request.transport is not None
                    conn.request.transport.abort()
                    return
                if events == 1:
                    await self._maybe_stall("exec_stream")
        proc.drain_now()
        while not queue.empty():
            kind, data = queue.get_nowait()
            if kind in ("stdout", "stderr"):
                await writer.event(kind, _b64(data))
        if not self.exec_omit_exit:
            code = await proc.wait()
            await writer.event("exit", json.dumps({"exit_code": code}))

    # ---- terminals --------------------------------------------------------------------------

    async def _pty(self, request: web.Request) -> web.StreamResponse:
        sandbox = self._sandbox(request)
        try:
            cols = int(request.query.get("cols", "80"))
            rows = int(request.query.get("rows", "24"))
        except ValueError:
            return web.json_response({"error": "cols and rows must be ints"}, status=400)
        if not (1 <= cols <= 10_000 and 1 <= rows <= 10_000):
            return web.json_response({"error": "cols and rows out of range"}, status=400)
        ws = web.WebSocketResponse(autoclose=False, max_msg_size=0)
        conn = self._open_connection(sandbox, request)
        conn.ws = ws
        sender: asyncio.Task[None] | None = None
        try:
            await ws.prepare(request)
            queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
            conn.proc = self._spawn(
                self.shell,
                tty=True,
                env=self._env(sandbox, tty=True),
                cwd=sandbox.root,
                rows=rows,
                cols=cols,
                on_stdout=lambda data: queue.put_nowait(("data", data)),
                on_exit=lambda code: queue.put_nowait(("exit", b"")),
                on_eof=lambda: queue.put_nowait(("eof", b"")),
            )
            sender = asyncio.create_task(self._pty_sender(conn, queue))
            if await self._pty_receiver(conn) == "closing":
                # Our sender sent `exit` and is closing the socket: let it finish the
                # close handshake before the teardown below cancels it.
                await asyncio.wait([sender], timeout=5)
        finally:
            try:
                await settle(self._end_terminal(conn, sender))
            finally:
                self._close_connection(sandbox, conn)
        return ws

    async def _end_terminal(self, conn: _Connection, sender: asyncio.Task[None] | None) -> None:
        if sender is not None:
            sender.cancel()
            await asyncio.wait([sender])
            error = None if sender.cancelled() else sender.exception()
            if error is not None:
                raise error
        await self._kill(conn, 0.2)
        ws = conn.ws
        if ws is not None and not ws.closed:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await ws.close()

    async def _pty_receiver(self, conn: _Connection) -> str:
        """Client frames -> the terminal, until the socket ends; returns how it ended:
        "closing" (our sender is closing it), "closed" (the client closed it) or
        "dropped"."""
        ws, proc = conn.ws, conn.proc
        assert ws is not None and proc is not None
        while True:
            msg = await ws.receive()
            if msg.type is WSMsgType.BINARY:
                await self._maybe_stall("pty_input")
                if not proc.exited:
                    with contextlib.suppress(ProcessExitedError):
                        await proc.write(msg.data)
            elif msg.type is WSMsgType.TEXT:
                with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                    control = json.loads(msg.data)
                    if control.get("type") == "resize":
                        proc.resize(int(control["rows"]), int(control["cols"]))
            elif msg.type is WSMsgType.CLOSE:
                await self._maybe_stall("pty_close")
                await ws.close()
                return "closed"
            elif msg.type is WSMsgType.CLOSING:
                return "closing"
            else:  # CLOSED, ERROR: the connection dropped
                return "dropped"

    async def _pty_sender(self, conn: _Connection, queue: asyncio.Queue[tuple[str, bytes]]) -> None:
        ws, proc = conn.ws, conn.proc
        assert ws is not None and proc is not None
        loop = asyncio.get_running_loop()
        try:
            if self.pre_ready_output:
                await ws.send_bytes(self.pre_ready_output)
            pending: list[tuple[str, bytes]] = []
            # Forward the shell's first output (its prompt) before `ready`, as the
            # real Worker may.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FIRST_PROMPT_WAIT_S):
                    item = await queue.get()
                    if item[0] == "data":
                        await ws.send_bytes(item[1])
                    else:
                        pending.append(item)
            await self._maybe_stall("pty_ready")
            if self.pty_error_instead_of_ready is not None:
                await ws.send_str(
                    json.dumps({"type": "error", "message": self.pty_error_instead_of_ready})
                )
                await ws.close()
                return
            await ws.send_str(json.dumps({"type": "ready"}))
            for item in pending:
                queue.put_nowait(item)
            exited_at: float | None = None
            eof = False
            while not (exited_at is not None and eof):
                try:
                    async with asyncio.timeout_at(
                        exited_at + EXIT_DRAIN_S if exited_at is not None else None
                    ):
                        kind, data = await queue.get()
                except TimeoutError:
                    break  # exited, but something still holds the terminal open
                if kind == "data":
                    await ws.send_bytes(data)
                elif kind == "exit":
                    exited_at = loop.time()
                else:
                    eof = True
            proc.drain_now()
            while not queue.empty():
                kind, data = queue.get_nowait()
                if kind == "data":
                    await ws.send_bytes(data)
            code = await proc.wait()
            await ws.send_str(json.dumps({"type": "exit", "code": code}))
            await ws.close()
        except (ConnectionError, RuntimeError):
            pass  # the client went away; the handler tears the rest down


def _endpoint_of(request: web.Request) -> str:
    """The endpoint name of a request, from its path (`/v1/sandbox/{id}/<name>/...`)."""
    parts = request.path.strip("/").split("/")
    if len(parts) <= 2:
        return "create"
    if len(parts) == 3:
        return "delete"
    if parts[3] == "file":
        return "file_get" if request.method == "GET" else "file_put"
    return parts[3] if parts[3] in ENDPOINTS else "unknown"


def _file_error(exc: SandboxError) -> web.Response:
    """The protocol's answer to a failed file request: 403 outside the sandbox, 404
    missing, 409 not a regular file (or under a file), 500 otherwise."""
    if isinstance(exc, WorkspacePathError):
        return web.json_response({"error": "path outside the sandbox"}, status=403)
    if isinstance(exc, SandboxFileNotFoundError):
        return web.json_response({"error": "file not found"}, status=404)
    if isinstance(exc, NotAFileError):
        return web.json_response({"error": exc.message}, status=409)
    return web.json_response({"error": exc.message}, status=500)


def _make_root(given: str | None) -> str:
    """The real path of the directory that holds the sandboxes (made if needed)."""
    if given is None:
        return os.path.realpath(tempfile.mkdtemp(prefix="cf-worker-"))
    os.makedirs(given, exist_ok=True)
    return os.path.realpath(given)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _default_shell() -> list[str]:
    bash = shutil.which("bash")
    if bash:
        return [bash, "--norc", "--noprofile", "-i"]
    return ["sh", "-i"]
