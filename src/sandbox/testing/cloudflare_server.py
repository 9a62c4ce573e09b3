"""A loopback Cloudflare Sandbox bridge Worker: test code that uses the `cloudflare`
backend without a Cloudflare account or network access.

`CloudflareWorkerServer` is an aiohttp server on 127.0.0.1 (a free port) that speaks the
bridge protocol, over REAL local processes (`sandbox.local.process`). It follows
cloudflare/sandbox-sdk at commit 6abf639caffa6dd20dcdba6f957ab203ece4cb01 (see
docs/providers.md, "Cloudflare"); each behaviour below names the upstream file:

==========================================  ==============================================
`POST   /v1/sandbox`                        ``{"id": ...}``: 26 base32 characters
                                            (routes.ts); the sandbox's directory plays
                                            ``/workspace`` (its cwd and HOME)
`DELETE /v1/sandbox/{id}`                   kills everything, 204 (also for an unknown id,
                                            without making a container: warm-pool.ts
                                            `lookupContainer`)
`GET    /v1/sandbox/{id}/running`           ``{"running": true|false}``, always 200
                                            (routes.ts)
`POST   /v1/sandbox/{id}/session`           ``{"id": sid}`` (body ``{"id"?}``); 502 when
                                            the id exists
`DELETE /v1/sandbox/{id}/session/{sid}`     ends the session and its PTY (SIGHUP, then
                                            the group is killed); 502 when unknown
`GET|PUT /v1/sandbox/{id}/file/<path>`      raw bytes at ``'/' + <path>`` resolved like
                                            ``resolveWorkspacePath`` (helpers.ts): 400
                                            empty, 403 outside /workspace, 404 missing,
                                            502 anything else (a directory, FIFO...);
                                            PUT: 413 above 32 MiB
`POST   /v1/sandbox/{id}/exec`              ``{"argv": [...], "timeout_ms": N}`` ->
                                            server-sent events: ``stdout``/``stderr``
                                            (base64), then ``exit`` ``{"exit_code": N}``
                                            or ``error``; ``timeout_ms`` is ignored and a
                                            client going away does not stop the command
                                            (execute-handler.ts)
`GET    /v1/sandbox/{id}/pty?cols=&rows=`   WebSocket to the PTY of a session
                                            (``Session-Id`` header or ``?session=``,
                                            else the sandbox's default session): its
                                            buffered output (256 KiB ring) replayed in a
                                            binary frame, then ``{"type": "ready"}``, raw
                                            bytes both ways; ``{"type": "error"}``; the
                                            client may send ``{"type": "resize", ...}``
                                            (pty-ws-handler.ts, session-manager.ts)
==========================================  ==============================================

Every request must carry ``Authorization: Bearer <api_key>`` (else 401), and an id in
``/v1/sandbox/{id}/...`` must match ``^[a-z2-7]{1,128}$`` (else 400), as in routes.ts.
Any such request for an id with no running container (never made, deleted, or
replaced) gets a fresh, empty one, as the bridge's pool does (warm-pool.ts
`getContainer`); `allocated` lists those ids.

Like the real container, and unlike older bridges:

- a session has ONE PTY, created on the first connection and shared by every later one
  (each new connection gets the buffered output first); closing a socket only
  unsubscribes it: the PTY and its processes keep running until the session is deleted
  (or the sandbox);
- the PTY keeps the newest 256 KiB of its output (pty.ts, utils/ring-buffer.ts) whether
  or not a socket listens, and after its shell exited (only a session delete clears
  it); a socket that connects later gets exactly that ring, then ``ready``, then live
  output, with nothing lost or repeated between them (pty-ws-handler.ts `onOpen` reads
  the ring and subscribes in one synchronous step): what a resumed client relies on;
- creating a session that exists answers 502 ``Session '<id>' already exists``
  (session-manager.ts `createSession`);
- no ``exit`` frame is ever sent: when the shell exits the socket simply stays open
  (`legacy_exit_frame=True` sends ``{"type": "exit", "code": N}`` and closes, as older
  bridges did);
- a one-shot exec gets no abort signal and no server-side timeout.

The awkward parts of the real service are reproduced on purpose, always:

- a new PTY's buffer holds a banner (`pre_ready_output`), so output arrives BEFORE
  ``ready``; ``ready`` follows at once (pty-ws-handler.ts `onOpen` waits for nothing),
  so the first keys may reach the shell before it reads with readline, while its tty
  is still in canonical mode (which keeps at most 4095 bytes of a line, as on Linux);
- the shell is an interactive bash on a real PTY with ``PROMPT_COMMAND`` set to clear
  the screen once (pty.ts), so a line editor acts on control keys as it does there;
- event streams mix CR, LF and CRLF line ends, include comments and ``id:`` lines, and
  are written in pieces cut at random places, so a client sees events split across
  network chunks. `seed` makes the cuts reproducible.

What the stand-in adds because this machine is not a container: every process of a
sandbox has `SANDBOX_RUNNER_DIR` (`RUNNER_DIR_ENV`), a short folder of the container's
own under this machine's /tmp (a real container's /tmp is its own: the runner goes
there), and the container's mark (`MARKER_ENV`). The container's end (a sandbox delete,
`replace_container`, the server's close) SIGKILLs every local process with its mark (the
runner, which leaves the session of the terminal that started it, and whatever it keeps)
and removes the folder, as the real container's end takes everything in it.

Fault injection (all of it can be changed while the server runs; the failures and
stalls are thin wrappers over `server.faults`, a `sandbox.testing.faults.FaultPlan`):

- ``server.fail(endpoint, status, times=1, body=None)``: answer the next `times`
  requests of an endpoint (``"create"``, ``"delete"``, ``"running"``, ``"exec"``,
  ``"file_get"``, ``"file_put"``, ``"pty"``, ``"session_create"``,
  ``"session_delete"``) with `status`. For ``"pty"`` this refuses the handshake.
- ``stall = server.stall(point)``: requests reaching `point` wait until
  ``stall.release()``; ``await stall.reached.wait()`` tells a test that one is blocked
  there. Points: the endpoints above (before anything is done), ``"exec_stream"``
  (after the first output event), ``"pty_ready"`` (before ``ready``), ``"pty_input"``
  (holding a terminal's input frame before it reaches the shell) and ``"pty_close"``
  (when the client's close frame arrives, before it is answered).
- ``server.drop_pty_connections()``: abort every open terminal socket.
- ``server.drop_exec_after_events = N``: abort an exec stream after N events.
- ``server.exec_omit_exit = True``: end exec streams cleanly but without ``exit``.
- ``server.exec_error = "message"``: answer exec with an ``error`` event.
- ``server.pty_error_instead_of_ready = "message"``: an ``error`` frame, then close,
  instead of ``ready``.
- ``await server.send_pty_error("message")``: an ``error`` frame to every terminal.
- ``server.stop_sandbox(id)``: its ``running`` answers false from now on.
- ``await server.replace_container(id)``: its container stopped (it sleeps after 10
  minutes without a request) and the id gets a fresh, empty one (warm-pool.ts).
- ``server.legacy_exit_frame = True``: the older bridge's ``exit`` frame.

Peers that send too much or too little (each sends at most `flood_bytes`, default
1 GiB, and stops as soon as the client goes away; writes wait for the socket to drain,
so the server's own memory stays small):

- ``server.exec_flood = "line" | "event"``: after the first output event, the next exec
  stream sends one ``data:`` line that never ends, or ``data:`` lines of 64 KiB that never
  end their event.
- ``server.oversize(endpoint, size, times=1)``: answer the next requests of a plain
  endpoint with 200 and a body of `size` bytes (chunked, no ``Content-Length``).
- ``server.trickle(endpoint, times=1)``: answer with 200 and a body announced as
  1 KiB that arrives one byte every `trickle_interval_s` (default 0.05 s).
- ``server.pty_flood = "frame" | "early"``: on the next terminal socket, after
  ``ready``, one binary frame that
  announces `flood_bytes` and streams them; or, before ``ready``, `flood_bytes` of
  output in 64 KiB binary frames.
- A peer that accepts and never answers: ``server.stall(endpoint)``.

What a test can look at: `sandboxes` (live ones, with their `root` directory, the
``/workspace``, and their `sessions`), `deleted` (ids), `replaced` (ids), `deleted_sessions`,
`allocated` (ids given a fresh container by a request),
`requests` (method, path, endpoint, authorized, client port, session id: never other
headers), `exec_bodies`, `live_processes()`, `open_terminals()`, `ended_containers`
(marks), `leftover_pids()` and `leftover_runner_dirs()` (what an ended container left).

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
import re
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from ..backends.unix_local import local_files
from ..errors import ProcessExitedError, SandboxError, SandboxFileNotFoundError
from ..files.remove_tree import discard_tree
from ..local.process import LocalProcess
from ..settle import settle
from . import faults, procfs
from .preview_proxy import PreviewProxy

# The worker's endpoints a fault can be planned on, and the points a call
# can be stalled at (`stall`); the banner a terminal prints before it is ready.
ENDPOINTS = (
    "create",
    "delete",
    "running",
    "exec",
    "file_get",
    "file_put",
    "pty",
    "session_create",
    "session_delete",
    "tunnel",
)
STALL_POINTS = (*ENDPOINTS, "exec_stream", "pty_ready", "pty_input", "pty_close")
DEFAULT_PRE_READY_OUTPUT = b"Cloudflare Sandbox terminal\r\n"
# After a process exits, how long its last output may take to arrive.
EXIT_DRAIN_S = 0.05
# The most a flooding knob sends, and the size of each of its writes.
DEFAULT_FLOOD_BYTES = 1 << 30
FLOOD_CHUNK = 64 * 1024
# What `trickle` announces, and the pause between its bytes.
TRICKLE_BYTES = 1024
DEFAULT_TRICKLE_INTERVAL_S = 0.05
# pty.ts: DEFAULT_BUFFER_SIZE, the ring of output replayed to each new connection.
PTY_BUFFER_BYTES = 256 * 1024
# routes.ts: MAX_WRITE_BYTES.
MAX_WRITE_BYTES = 32 * 1024 * 1024
SANDBOX_ID_RE = re.compile(r"[a-z2-7]{1,128}")
# Where the backend puts the runner (its `$SANDBOX_RUNNER_DIR`): a real container's /tmp
# is its own, here every sandbox shares this machine's, so each gets a short folder of
# its own (a unix socket's path is at most 107 bytes), removed with its container.
RUNNER_DIR_ENV = "SANDBOX_RUNNER_DIR"
# Set to the container's mark in every process of a sandbox (the stand-in's, not the real
# container's): how a container's end finds what left its session (the runner, started
# detached from a terminal, and every process it keeps), as the real container's end
# takes everything in it.
MARKER_ENV = "SANDBOX_FAKE_CLOUDFLARE"
SESSION_ID_RE = re.compile(r"[a-zA-Z0-9._-]{1,128}")
WORKSPACE = "/workspace"

# An aiohttp request handler of this server.
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# What `stall` returns (`sandbox.testing.faults.Gate`: `reached`, `abandoned`, `hits`,
# `release()`), under the name this server's tests know.
Stall = faults.Gate


@dataclass(frozen=True)
class _Failure:
    """The answer a planned failure gives (the `FaultPlan` counts the requests)."""

    status: int
    body: str | None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as the server saw it (no headers but the session id: the others
    carry the key)."""

    method: str
    path: str
    endpoint: str
    authorized: bool
    client_port: int | None = None
    session: str | None = None


@dataclass(eq=False)
class _Connection:
    """A running exec stream or terminal socket, so a delete can end it."""

    request: web.Request
    done: asyncio.Event = field(default_factory=asyncio.Event)
    proc: LocalProcess | None = None
    ws: web.WebSocketResponse | None = None


@dataclass(eq=False)
class FakePty:
    """A session's one PTY (pty.ts): the shell, its output ring, who listens (each
    socket with the queue of output its sender writes in order)."""

    proc: LocalProcess
    buffer: bytearray = field(default_factory=bytearray)
    listeners: dict[web.WebSocketResponse, asyncio.Queue[bytes]] = field(default_factory=dict)
    exit_code: int | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class FakeSession:
    """A container session (session-manager.ts): its PTY once one was asked for."""

    id: str
    pty: FakePty | None = None


@dataclass(eq=False)
class FakeSandbox:
    """One sandbox: a directory (its /workspace), its sessions, the exec streams and
    terminals running in it, and the exec processes nobody waits for any more."""

    id: str
    root: str
    connections: set[_Connection] = field(default_factory=set)
    sessions: dict[str, FakeSession] = field(default_factory=dict)
    orphans: set[LocalProcess] = field(default_factory=set)
    running: bool = True
    tunnels: dict[int, PreviewProxy] = field(default_factory=dict)  # port -> forwarder
    # This container's mark (`MARKER_ENV`: a fresh container for the same id has
    # another) and its own runner folder (`RUNNER_DIR_ENV`, made with its first process).
    container: str = field(default_factory=lambda: secrets.token_hex(6))

    @property
    def runner_dir(self) -> str:
        """The container's `$SANDBOX_RUNNER_DIR` (short: a socket's path is bounded)."""
        return f"/tmp/cfrun-{self.container}"

    @property
    def default_session_id(self) -> str:
        """sandbox.ts: `terminal()` always uses `sandbox-<id>`."""
        return f"sandbox-{self.id}"


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

    async def flood(
        self, kind: str, send: Callable[[Callable[[bytes], Awaitable[None]], int], Awaitable[None]]
    ) -> None:
        """A ``stdout`` event that never ends: one endless ``data:`` line ("line"), or
        endless 64 KiB ``data:`` lines with no blank line after them ("event")."""
        await self._resp.write(b"event: stdout\ndata: ")
        if kind == "line":
            await send(self._resp.write, sys.maxsize)
            return

        async def lines(data: bytes) -> None:
            await self._resp.write(data + b"\ndata: ")

        await send(lines, sys.maxsize)

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
    """A loopback Cloudflare Sandbox bridge Worker over real local processes (see the
    module docstring for the endpoints, the upstream files they follow, and every fault
    knob).

    `api_key` is the bearer key clients must send. `root` is where sandbox directories
    are made (default: a temporary directory, removed on close). `shell` is the argv of
    a PTY's interactive shell (default bash, else sh). `seed` fixes how event streams
    are cut into pieces; `split_events=False` writes them whole. `legacy_exit_frame`
    makes terminals send an ``exit`` frame and close when the shell exits (older
    bridges); the current container never does.
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
        legacy_exit_frame: bool = False,
    ) -> None:
        if not api_key:
            raise ValueError("api_key must be a non-empty str")
        self._api_key = api_key
        self._given_root = os.fspath(root) if root is not None else None
        self._root: str | None = None
        self.shell = shell or _default_shell()
        self.split_events = split_events
        self.pre_ready_output = pre_ready_output
        self.legacy_exit_frame = legacy_exit_frame
        self.drop_exec_after_events: int | None = None
        self.exec_omit_exit = False
        self.exec_error: str | None = None
        self.pty_error_instead_of_ready: str | None = None
        self.exec_flood: str | None = None
        self.pty_flood: str | None = None
        self.flood_bytes = DEFAULT_FLOOD_BYTES
        self.trickle_interval_s = DEFAULT_TRICKLE_INTERVAL_S
        self.flooded = 0
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.deleted: list[str] = []
        self.replaced: list[str] = []
        self.allocated: list[str] = []
        self.deleted_sessions: list[str] = []
        # The marks and runner folders of the containers that ended (a leak check).
        self.ended_containers: list[str] = []
        self.requests: list[RequestRecord] = []
        self.exec_bodies: list[object] = []
        self._rng = random.Random(seed)
        self._faults = faults.FaultPlan(STALL_POINTS)
        self._answers: dict[str, list[tuple[str, int]]] = {}
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._processes: set[LocalProcess] = set()
        self._tasks: set[asyncio.Task[None]] = set()
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
                web.post(
                    "/v1/sandbox/{id}/session", self._wrap("session_create", self._session_create)
                ),
                web.delete(
                    "/v1/sandbox/{id}/session/{sid}",
                    self._wrap("session_delete", self._session_delete),
                ),
                web.get("/v1/sandbox/{id}/file/{path:.*}", self._wrap("file_get", self._get)),
                web.put("/v1/sandbox/{id}/file/{path:.*}", self._wrap("file_put", self._put)),
                web.post("/v1/sandbox/{id}/exec", self._wrap("exec", self._exec)),
                web.get("/v1/sandbox/{id}/pty", self._wrap("pty", self._pty)),
                web.post("/v1/sandbox/{id}/tunnel/{port}", self._wrap("tunnel", self._tunnel)),
            ]
        )
        # handler_cancellation: a stall a client walks away from is abandoned (tests
        # wait for that). It never kills anything: execs and PTYs outlive their client.
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
        self._faults.release_all()
        for sandbox_id in list(self.sandboxes):
            await self._destroy(sandbox_id)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        if self._root is not None and self._given_root is None:
            discard_tree(self._root)
        self._url = None

    async def __aenter__(self) -> CloudflareWorkerServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ---- fault injection -------------------------------------------------------------

    @property
    def faults(self) -> faults.FaultPlan:
        """The fault plan behind the knobs below (`sandbox.testing.faults`): arm gates
        and planned failures at any point directly, in the kit's own terms."""
        return self._faults

    def fail(self, endpoint: str, status: int, *, times: int = 1, body: str | None = None) -> None:
        """Answer the next `times` requests to `endpoint` with HTTP `status` (and `body`,
        default a JSON error)."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; known: {', '.join(ENDPOINTS)}")
        self._faults.fail(endpoint, _Failure(status, body), times=times)

    def oversize(self, endpoint: str, size: int, *, times: int = 1) -> None:
        """Answer the next `times` requests to a plain `endpoint` with 200 and `size`
        bytes of body, chunked (no ``Content-Length`` says how much is coming)."""
        self._answer(endpoint, "oversize", size, times)

    def trickle(self, endpoint: str, *, times: int = 1) -> None:
        """Answer the next `times` requests to a plain `endpoint` with 200 and a body
        announced as `TRICKLE_BYTES` that arrives a byte every `trickle_interval_s`."""
        self._answer(endpoint, "trickle", TRICKLE_BYTES, times)

    def _answer(self, endpoint: str, kind: str, size: int, times: int) -> None:
        if endpoint not in ENDPOINTS or endpoint in ("exec", "pty"):
            raise ValueError(f"{kind} needs a plain endpoint, not {endpoint!r}")
        self._answers.setdefault(endpoint, []).extend([(kind, size)] * times)

    def stall(self, point: str) -> Stall:
        """Make requests wait at `point` until the returned stall is released."""
        if point not in STALL_POINTS:
            raise ValueError(f"unknown stall point {point!r}; known: {', '.join(STALL_POINTS)}")
        # A new stall replaces the one armed at the same point (parked requests stay).
        self._faults.gates[:] = [g for g in self._faults.gates if g.point != point]
        return self._faults.stall(point)

    def stop_sandbox(self, sandbox_id: str) -> None:
        """From now on `running` answers false for this sandbox (a stopped container)."""
        self.sandboxes[sandbox_id].running = False

    def drop_pty_connections(self) -> int:
        """Abort every open terminal socket without a close frame; returns how many.
        The PTYs go on running, as on the real container."""
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
        """Processes started by the server that are not yet killed and reaped (PTY
        shells until their session or sandbox is deleted, execs until they end)."""
        return len(self._processes)

    async def wait_idle(self) -> None:
        """Wait until no exec stream or terminal socket is being served."""
        await self._idle.wait()

    def leftover_pids(self) -> list[int]:
        """Live local processes of any container this server made that is gone (the
        runner and what it keeps left their session: found by `MARKER_ENV`)."""
        found: set[int] = set()
        for container in self.ended_containers:
            found.update(procfs.pids_with_env(MARKER_ENV, container))
        return sorted(found)

    def leftover_runner_dirs(self) -> list[str]:
        """Runner folders of ended containers that still exist (leaks)."""
        dirs = [f"/tmp/cfrun-{container}" for container in self.ended_containers]
        return [folder for folder in dirs if os.path.exists(folder)]

    def open_terminals(self) -> int:
        """Terminal WebSockets currently open."""
        return sum(
            1
            for sandbox in self.sandboxes.values()
            for conn in sandbox.connections
            if conn.ws is not None and not conn.ws.closed
        )

    def workspace(self, sandbox_id: str) -> str:
        """The host directory that plays a sandbox's ``/workspace``."""
        return self.sandboxes[sandbox_id].root

    # ---- request plumbing --------------------------------------------------------------

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {self._api_key}"
        authorized = hmac.compare_digest(given.encode(), expected.encode())
        endpoint = _endpoint_of(request)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        port = peer[1] if isinstance(peer, tuple) else None
        session = request.headers.get("Session-Id") or request.query.get("session")
        self.requests.append(
            RequestRecord(request.method, request.path, endpoint, authorized, port, session)
        )
        # routes.ts: the id format is checked first, then the key.
        parts = request.path.split("/")
        if len(parts) > 3 and parts[3] and not SANDBOX_ID_RE.fullmatch(parts[3]):
            return _error_json("Invalid sandbox ID format", "invalid_request", 400)
        if not authorized:
            return _error_json("Unauthorized", "unauthorized", 401)
        return await handler(request)

    def _wrap(self, endpoint: str, handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            failure = self._faults.take(endpoint)
            if isinstance(failure, _Failure):
                body = (
                    failure.body
                    if failure.body is not None
                    else json.dumps({"error": f"injected failure {failure.status}"})
                )
                return web.Response(
                    status=failure.status, text=body, content_type="application/json"
                )
            answers = self._answers.get(endpoint)
            if answers:
                kind, size = answers.pop(0)
                return await self._odd_answer(request, kind, size)
            await self._maybe_stall(endpoint)
            return await handler(request)

        return wrapped

    async def _odd_answer(self, request: web.Request, kind: str, size: int) -> web.StreamResponse:
        """A 200 whose body is too large (`oversize`) or too slow (`trickle`)."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if kind == "trickle":
            resp.content_length = size
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            if kind == "trickle":
                for _ in range(size):
                    await resp.write(b" ")
                    await asyncio.sleep(self.trickle_interval_s)
            else:
                await resp.write(b'{"id": "')
                await self._flood(resp.write, size)
            await resp.write_eof()
        return resp

    async def _flood(self, write: Callable[[bytes], Awaitable[None]], size: int) -> None:
        """`size` bytes (at most `flood_bytes`) in chunks, each write waiting for the
        socket to drain; `flooded` counts what went out. Ends with ConnectionError when
        the client goes away."""
        chunk = b"A" * FLOOD_CHUNK
        left = min(size, self.flood_bytes)
        while left > 0:
            piece = chunk[:left]
            await write(piece)
            self.flooded += len(piece)
            left -= len(piece)

    async def _maybe_stall(self, point: str) -> None:
        await self._faults.park(point)

    def _sandbox(self, request: web.Request) -> FakeSandbox:
        """The container a `/v1/sandbox/{id}/...` request reaches: routes.ts resolves
        every such request through the pool's `getContainer` (warm-pool.ts), which
        gives an id without a running container (never made, deleted, stopped) a fresh
        one, with an empty /workspace."""
        sandbox_id = request.match_info["id"]
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            assert self._root is not None
            root = os.path.join(self._root, sandbox_id)
            os.makedirs(root, exist_ok=True)
            sandbox = self.sandboxes[sandbox_id] = FakeSandbox(sandbox_id, root)
            self.allocated.append(sandbox_id)
        return sandbox

    def _env(self, sandbox: FakeSandbox, *, tty: bool) -> dict[str, str]:
        # A small environment of its own: nothing from the test process (which may hold
        # the real credentials) leaks into the sandbox. The runner folder exists as a
        # container's /tmp does.
        os.makedirs(sandbox.runner_dir, mode=0o700, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": sandbox.root,
            "LANG": "C.UTF-8",
            "HISTFILE": "/dev/null",
            RUNNER_DIR_ENV: sandbox.runner_dir,
            MARKER_ENV: sandbox.container,
        }
        if tty:
            # pty.ts: the shell's first prompt clears the screen once.
            env.update(
                {
                    "TERM": "xterm-256color",
                    "PS1": "$ ",
                    "PROMPT_COMMAND": "clear; unset PROMPT_COMMAND",
                }
            )
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

    async def _end_process(self, proc: LocalProcess, grace_s: float) -> None:
        """Kill a process's group (after `grace_s` of polite signals, SIGHUP first as
        when a terminal closes), reap it."""
        try:
            await proc.terminate(grace_s)
        finally:
            self._processes.discard(proc)

    def _background(self, coro: Awaitable[None]) -> None:
        async def run() -> None:
            await coro

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- sandboxes ----------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.StreamResponse:
        """routes.ts: 16 random bytes, base32 (a-z, 2-7), 26 characters."""
        assert self._root is not None
        sandbox_id = base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()
        root = os.path.join(self._root, sandbox_id)
        os.makedirs(root)
        self.sandboxes[sandbox_id] = FakeSandbox(sandbox_id, root)
        return web.json_response({"id": sandbox_id})

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        """routes.ts: 204, also when no container exists for the id."""
        await self._destroy(request.match_info["id"])
        return web.Response(status=204)

    async def _tunnel(self, request: web.Request) -> web.StreamResponse:
        """routes.ts `POST /sandbox/:id/tunnel/:port`: `validatePort` (security.ts:
        1024..65535, not 3000) else 400 `invalid_request`; the answer is a
        `QuickTunnelInfo` (shared/src/rpc-types.ts: id, port, url, hostname,
        createdAt). The real URL is `https://<random>.trycloudflare.com`; here it is a
        loopback forwarder to the port (`preview_proxy`), plain HTTP."""
        sandbox = self._sandbox(request)
        try:
            port = int(request.match_info["port"])
        except ValueError:
            port = -1
        if not 1024 <= port <= 65535 or port == 3000:
            return _error_json("Invalid port", "invalid_request", 400)
        proxy = sandbox.tunnels.get(port)
        if proxy is None:
            proxy = await PreviewProxy(port).start()
            sandbox.tunnels[port] = proxy
        return web.json_response(
            {
                "id": f"tunnel-{sandbox.id}-{port}",
                "port": port,
                "url": proxy.url,
                "hostname": f"127.0.0.1:{proxy.port}",
                "createdAt": "1970-01-01T00:00:00Z",
            }
        )

    async def replace_container(self, sandbox_id: str) -> None:
        """The sandbox's container stopped (sandbox.ts: it sleeps after `sleepAfter`,
        10 minutes without a request, or it crashed) and the bridge's pool gives the id
        a fresh container at its next request (warm-pool.ts `getContainer`: an
        assignment whose container is not running is dropped). Every session, PTY,
        exec and file of the old one is gone; the id answers again, with an empty
        /workspace. (Files this server's processes wrote outside the sandbox
        directory, in the host's /tmp, cannot be told apart and stay.)"""
        await self._teardown(self.sandboxes[sandbox_id])
        os.makedirs(self.sandboxes[sandbox_id].root)
        self.sandboxes[sandbox_id] = FakeSandbox(sandbox_id, self.sandboxes[sandbox_id].root)
        self.replaced.append(sandbox_id)

    async def _destroy(self, sandbox_id: str) -> None:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            return
        await self._teardown(sandbox)
        self.sandboxes.pop(sandbox_id, None)
        self.deleted.append(sandbox_id)

    async def _teardown(self, sandbox: FakeSandbox) -> None:
        """End everything of a sandbox's container and remove its files."""
        tunnels, sandbox.tunnels = list(sandbox.tunnels.values()), {}
        for proxy in tunnels:
            await proxy.close()
        for conn in list(sandbox.connections):
            if conn.request.transport is not None:
                conn.request.transport.abort()
        for session in list(sandbox.sessions.values()):
            await self._end_session(session)
        sandbox.sessions.clear()
        for proc in list(sandbox.orphans):
            await settle(self._end_process(proc, 0))
        sandbox.orphans.clear()
        for conn in list(sandbox.connections):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await conn.done.wait()
        # What left its session (the runner, and what it keeps) ends with the container.
        for pid in procfs.pids_with_env(MARKER_ENV, sandbox.container):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.ended_containers.append(sandbox.container)
        await asyncio.to_thread(shutil.rmtree, sandbox.runner_dir, True)
        discard_tree(sandbox.root)

    async def _running(self, request: web.Request) -> web.StreamResponse:
        """routes.ts: always 200; ``running`` is whether `exec('true')` worked (in the
        container the pool gives the id: a fresh one for an unknown id)."""
        return web.json_response({"running": self._sandbox(request).running})

    # ---- sessions ----------------------------------------------------------------------

    async def _session_create(self, request: web.Request) -> web.StreamResponse:
        """routes.ts `POST /sandbox/:id/session`: an optional ``{"id"}`` (else one is
        made up); answers ``{"id"}``, 502 when that session exists already."""
        sandbox = self._sandbox(request)
        body: Any = {}
        with contextlib.suppress(ValueError):
            body = await request.json()
        wanted = body.get("id") if isinstance(body, dict) else None
        sid = wanted if isinstance(wanted, str) and wanted else "session-" + secrets.token_hex(6)
        if sid in sandbox.sessions:
            # session-manager.ts `createSession`: SESSION_ALREADY_EXISTS, whose message
            # the bridge passes on with its 502.
            return _error_json(
                f"session create failed: Session '{sid}' already exists", "session_error", 502
            )
        if not SESSION_ID_RE.fullmatch(sid) or ".." in sid:
            return _error_json(
                f"session create failed: invalid session id '{sid}'", "session_error", 502
            )
        sandbox.sessions[sid] = FakeSession(sid)
        return web.json_response({"id": sid})

    async def _session_delete(self, request: web.Request) -> web.StreamResponse:
        """routes.ts `DELETE /sandbox/:id/session/:sid` -> session-manager.ts
        `deleteSession`: 502 for an unknown session; else its PTY is destroyed (pty.ts
        `destroy`: the terminal closed, the shell killed)."""
        sandbox = self._sandbox(request)
        sid = request.match_info["sid"]
        session = sandbox.sessions.pop(sid, None)
        if session is None:
            return _error_json(
                f"session delete failed: Session '{sid}' not found", "session_error", 502
            )
        await self._end_session(session)
        self.deleted_sessions.append(sid)
        return web.json_response({"success": True, "sessionId": sid})

    async def _end_session(self, session: FakeSession) -> None:
        pty, session.pty = session.pty, None
        if pty is None:
            return
        for queue in pty.listeners.values():
            queue.put_nowait(b"")
        for ws in list(pty.listeners):
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await ws.close()
        pty.listeners.clear()
        await settle(self._end_process(pty.proc, 0.2))
        pty.ended.set()

    # ---- files ----------------------------------------------------------------------------

    def _file_path(self, request: web.Request) -> tuple[FakeSandbox, str] | web.Response:
        """routes.ts: ``resolveWorkspacePath('/' + relativePath)``; the sandbox
        directory stands for /workspace."""
        sandbox = self._sandbox(request)
        path = request.match_info["path"]
        if not path:
            return _error_json("file path must not be empty", "invalid_request", 400)
        resolved = _resolve_workspace_path("/" + path)
        if resolved is None:
            return _error_json(
                "path must resolve to a location within /workspace", "invalid_request", 403
            )
        return sandbox, resolved[len(WORKSPACE) :].lstrip("/") or "."

    async def _get(self, request: web.Request) -> web.StreamResponse:
        """404 for a missing file, 502 for anything else that fails (a directory, a
        FIFO: the real one would wait on it, this one refuses without opening it)."""
        found = self._file_path(request)
        if isinstance(found, web.Response):
            return found
        sandbox, relative = found
        try:
            data = await local_files.read_whole(sandbox.root, relative, sys.maxsize)
        except SandboxFileNotFoundError:
            return _error_json(
                f"File not found: {WORKSPACE}/{relative}", "workspace_read_not_found", 404
            )
        except SandboxError as exc:
            return _error_json(f"read failed: {exc.message}", "exec_transport_error", 502)
        return web.Response(body=data, content_type="application/octet-stream")

    async def _put(self, request: web.Request) -> web.StreamResponse:
        """413 above 32 MiB, 502 for any failure (a directory there, a parent that is a
        file), else ``{"ok": true}``."""
        found = self._file_path(request)
        if isinstance(found, web.Response):
            return found
        sandbox, relative = found
        data = await request.read()
        if len(data) > MAX_WRITE_BYTES:
            return _error_json(
                f"payload too large: {len(data)} bytes exceeds the {MAX_WRITE_BYTES}-byte limit",
                "payload_too_large",
                413,
            )
        try:
            await local_files.write_whole(sandbox.root, relative, data)
        except SandboxError as exc:
            return _error_json(f"write failed: {exc.message}", "workspace_archive_write_error", 502)
        return web.json_response({"ok": True})

    # ---- one-shot exec ----------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        """routes.ts exec -> execute-handler.ts `handleStreamingExecute`: no abort
        signal reaches the command and ``timeout_ms`` is not applied on this path, so a
        client that goes away leaves the command running."""
        sandbox = self._sandbox(request)
        try:
            body = await request.json()
        except ValueError:
            return _error_json("Invalid JSON body", "invalid_request", 400)
        self.exec_bodies.append(body)
        argv = body.get("argv") if isinstance(body, dict) else None
        if (
            not isinstance(argv, list)
            or not argv
            or not all(isinstance(a, str) and "\x00" not in a for a in argv)
        ):
            return _error_json("argv must be a non-empty array", "invalid_request", 400)

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
            await self._run_exec(conn, sandbox, argv, writer)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away: the command goes on (below)
        finally:
            # The handler is cancelled when the client goes away (handler_cancellation),
            # and an await below then re-raises it: the connection is closed regardless.
            try:
                proc, conn.proc = conn.proc, None
                if proc is not None:
                    if proc.exited:
                        await settle(self._end_process(proc, 0))
                    else:
                        sandbox.orphans.add(proc)
                        self._background(self._reap_orphan(sandbox, proc))
            finally:
                self._close_connection(sandbox, conn)
        return resp

    async def _reap_orphan(self, sandbox: FakeSandbox, proc: LocalProcess) -> None:
        """An exec nobody listens to any more runs to its end, then is reaped."""
        try:
            await proc.wait()
        finally:
            sandbox.orphans.discard(proc)
            await settle(self._end_process(proc, 0))

    async def _run_exec(
        self, conn: _Connection, sandbox: FakeSandbox, argv: list[str], writer: _SseWriter
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
        events = 0
        exited_at: float | None = None
        eof = False
        while not (exited_at is not None and eof):
            try:
                async with asyncio.timeout_at(
                    exited_at + EXIT_DRAIN_S if exited_at is not None else None
                ):
                    kind, data = await queue.get()
            except TimeoutError:
                break  # a background child holds the pipes
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
                    flood, self.exec_flood = self.exec_flood, None
                    if flood is not None:
                        await writer.flood(flood, self._flood)
                        return
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
        """routes.ts pty: the ``Session-Id`` header or ``?session=``, else the default
        session (sandbox.ts `terminal` -> `sandbox-<id>`); pty-ws-handler.ts `onOpen`:
        the session's PTY (made on first use), its buffered output, then ``ready``."""
        sandbox = self._sandbox(request)
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return _error_json("WebSocket upgrade required", "invalid_request", 400)
        try:
            cols = int(request.query.get("cols", "80"))
            rows = int(request.query.get("rows", "24"))
        except ValueError:
            return _error_json("cols and rows must be valid numbers", "invalid_request", 400)
        sid = request.headers.get("Session-Id") or request.query.get("session")
        if sid is not None and (not SESSION_ID_RE.fullmatch(sid) or ".." in sid):
            return _error_json("Invalid session ID format", "invalid_request", 400)
        sid = sid or sandbox.default_session_id
        # session-manager.ts `getPty` -> `getOrCreateSession`: an unknown id is created.
        session = sandbox.sessions.setdefault(sid, FakeSession(sid))
        ws = web.WebSocketResponse(autoclose=False, max_msg_size=0)
        conn = self._open_connection(sandbox, request)
        conn.ws = ws
        pty: FakePty | None = None
        try:
            await ws.prepare(request)
            pty = session.pty
            if pty is None:
                pty = session.pty = self._new_pty(sandbox, rows, cols)
            await self._maybe_stall("pty_ready")
            flood, self.pty_flood = self.pty_flood, None
            if flood == "early":
                await self._flood(ws.send_bytes, sys.maxsize)
            if self.pty_error_instead_of_ready is not None:
                await ws.send_str(
                    json.dumps({"type": "error", "message": self.pty_error_instead_of_ready})
                )
                await ws.close()
                return ws
            # pty-ws-handler.ts `onOpen`: the ring is read and the socket subscribed in
            # one synchronous step, so nothing printed meanwhile is lost or sent twice:
            # the ring, `ready`, then live output in order (queued while these go out).
            ring = bytes(pty.buffer)
            queue: asyncio.Queue[bytes] = asyncio.Queue()
            pty.listeners[ws] = queue
            if ring:
                await ws.send_bytes(ring)
            await ws.send_str(json.dumps({"type": "ready"}))
            self._background(self._pty_sender(ws, queue))
            if flood == "frame":
                await self._huge_frame(request)
            if self.legacy_exit_frame and pty.exit_code is not None:
                await self._send_exit(ws, pty.exit_code)
            await self._pty_receiver(conn, pty)
        except (ConnectionError, RuntimeError):
            pass  # the client went away: the PTY goes on
        finally:
            if pty is not None:
                queue_of = pty.listeners.pop(ws, None)
                if queue_of is not None:
                    queue_of.put_nowait(b"")  # ends its sender
            try:
                if not ws.closed:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(2):
                            await ws.close()
            finally:
                self._close_connection(sandbox, conn)  # even when cancelled (see `_exec`)
        return ws

    async def _huge_frame(self, request: web.Request) -> None:
        """One unmasked binary frame (RFC 6455: FIN + opcode 2, 64-bit length) that
        announces `flood_bytes` and streams them, never held whole."""
        transport = request.transport
        assert transport is not None
        size = self.flood_bytes
        transport.write(b"\x82\x7f" + size.to_bytes(8, "big"))

        async def write(data: bytes) -> None:
            if transport.is_closing():
                raise ConnectionResetError("the client went away")
            transport.write(data)
            await request.protocol._drain_helper()

        await self._flood(write, size)

    def _new_pty(self, sandbox: FakeSandbox, rows: int, cols: int) -> FakePty:
        """pty.ts `initialize`: an interactive shell on a terminal; every output chunk
        goes into the ring and to each listening socket."""
        holder: list[FakePty] = []

        def on_output(data: bytes) -> None:
            pty = holder[0]
            pty.buffer += data
            del pty.buffer[: max(0, len(pty.buffer) - PTY_BUFFER_BYTES)]
            for queue in pty.listeners.values():
                queue.put_nowait(data)

        def on_exit(code: int) -> None:
            pty = holder[0]
            pty.exit_code = code
            if self.legacy_exit_frame:
                for ws in list(pty.listeners):
                    self._background(self._send_exit(ws, code))

        proc = self._spawn(
            self.shell,
            tty=True,
            env=self._env(sandbox, tty=True),
            cwd=sandbox.root,
            rows=rows,
            cols=cols,
            on_stdout=on_output,
            on_exit=on_exit,
        )
        pty = FakePty(proc)
        holder.append(pty)
        if self.pre_ready_output:
            pty.buffer += self.pre_ready_output
        return pty

    async def _pty_sender(self, ws: web.WebSocketResponse, queue: asyncio.Queue[bytes]) -> None:
        """A socket's live output, in order, until it is unsubscribed (an empty item)."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            while data := await queue.get():
                if ws.closed:
                    return
                await ws.send_bytes(data)

    async def _send_exit(self, ws: web.WebSocketResponse, code: int) -> None:
        """The older bridge: ``exit`` once the shell is gone (after its last output has
        had a moment to arrive), then close."""
        await asyncio.sleep(EXIT_DRAIN_S)
        with contextlib.suppress(ConnectionError, RuntimeError):
            if not ws.closed:
                await ws.send_str(json.dumps({"type": "exit", "code": code}))
                await ws.close()

    async def _pty_receiver(self, conn: _Connection, pty: FakePty) -> None:
        """Client frames -> the PTY, until the socket ends (pty-ws-handler.ts
        `onMessage`: binary is input, text is a control message; input for a PTY whose
        shell exited is dropped)."""
        ws = conn.ws
        assert ws is not None
        while True:
            msg = await ws.receive()
            if msg.type is WSMsgType.BINARY:
                await self._maybe_stall("pty_input")
                if not pty.proc.exited:
                    with contextlib.suppress(ProcessExitedError, OSError):
                        await pty.proc.write(msg.data)
            elif msg.type is WSMsgType.TEXT:
                try:
                    control = json.loads(msg.data)
                    if control.get("type") == "resize":
                        rows, cols = int(control["rows"]), int(control["cols"])
                        if rows <= 0 or cols <= 0:
                            raise ValueError("Invalid dimensions")
                        if not pty.proc.exited:
                            pty.proc.resize(rows, cols)
                except (ValueError, TypeError, KeyError, AttributeError):
                    await ws.send_str(
                        json.dumps({"type": "error", "message": "Invalid control message"})
                    )
            elif msg.type is WSMsgType.CLOSE:
                await self._maybe_stall("pty_close")
                await ws.close()
                return
            else:  # CLOSING, CLOSED, ERROR
                return


def _resolve_workspace_path(path: str) -> str | None:
    """helpers.ts `resolveWorkspacePath`: relative means under /workspace; dot segments
    resolved lexically; None when the result is not /workspace or below it."""
    absolute = path if path.startswith("/") else f"{WORKSPACE}/{path}"
    parts: list[str] = []
    for segment in absolute.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if parts:
                parts.pop()
        else:
            parts.append(segment)
    resolved = "/" + "/".join(parts)
    if resolved == WORKSPACE or resolved.startswith(WORKSPACE + "/"):
        return resolved
    return None


def _error_json(error: str, code: str, status: int) -> web.Response:
    """helpers.ts `errorJson`: ``{"error", "code"}``."""
    return web.json_response({"error": error, "code": code}, status=status)


def _endpoint_of(request: web.Request) -> str:
    """The endpoint name of a request, from its path (`/v1/sandbox/{id}/<name>/...`)."""
    parts = request.path.strip("/").split("/")
    if len(parts) <= 2:
        return "create"
    if len(parts) == 3:
        return "delete"
    if parts[3] == "file":
        return "file_get" if request.method == "GET" else "file_put"
    if parts[3] == "session":
        return "session_create" if request.method == "POST" else "session_delete"
    return parts[3] if parts[3] in ENDPOINTS else "unknown"


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


__all__ = [
    "DEFAULT_FLOOD_BYTES",
    "DEFAULT_PRE_READY_OUTPUT",
    "DEFAULT_TRICKLE_INTERVAL_S",
    "ENDPOINTS",
    "EXIT_DRAIN_S",
    "FLOOD_CHUNK",
    "MARKER_ENV",
    "MAX_WRITE_BYTES",
    "PTY_BUFFER_BYTES",
    "RUNNER_DIR_ENV",
    "SANDBOX_ID_RE",
    "SESSION_ID_RE",
    "STALL_POINTS",
    "TRICKLE_BYTES",
    "WORKSPACE",
    "CloudflareWorkerServer",
    "FakePty",
    "FakeSandbox",
    "FakeSession",
    "Handler",
    "RequestRecord",
    "Stall",
]
