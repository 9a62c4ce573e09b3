"""A loopback server that speaks Blaxel's protocols, for provider-free tests.

`BlaxelServer` is an aiohttp server bound to 127.0.0.1 on a free port. It implements
what the Blaxel SDK (`blaxel==0.4.24`) and the `blaxel` backend call, over REAL local
processes (it is a "sandbox" that is this machine, so point it only at code you would
run here):

- control plane, under `api_url` (`http://127.0.0.1:<port>/v0`):
  `POST /sandboxes[?createIfNotExist=true]`, `GET /sandboxes/{name}`,
  `DELETE /sandboxes/{name}` (which kills everything the sandbox runs), the previews,
  and snapshots (see "Snapshots");
- sandbox API, under each sandbox's `metadata.url`
  (`http://127.0.0.1:<port>/run/<workspace>/sandboxes/<name>`):
  `POST /process` (with `waitForCompletion`, `timeout`, `env`, `workingDir`),
  `GET /process/{id}`, `GET /process/{id}/wait`, `GET /process/{id}/logs`,
  `DELETE /process/{id}[/kill]`, `GET|PUT /filesystem/{path}` (raw bytes, multipart
  uploads, JSON `isDirectory`/`content` requests), the multipart-upload endpoints,
  and the terminal WebSocket `GET /terminal/ws?token=&cols=&rows=&sessionId=&workingDir=`.

The terminal runs an interactive shell on a real PTY (`bash -i`, else `sh -i`), like
the real service, and reproduces its awkward parts: output frames are JSON
`{"type": "output", "data": ...}` sent as text OR binary frames, keys are sometimes
capitalised (`Type`/`Data`), garbage frames (not UTF-8, not JSON, unknown types,
non-string data) are mixed in, and there is NO exit message. Set `quirks=False` for
plain frames.

Where it follows the real in-sandbox server (github.com/blaxel-ai/sandbox, commit
bfecd2e7da6a, `sandbox-api/src/handler/...`) rather than what was assumed before, each
behaviour has a knob that restores the stand-in's older one:

- `edge_cut_s` (default 60): the edge in front of a sandbox answers 504 to a request
  that stayed silent that long (a `POST /process` waiting for completion, a
  `GET /process/{id}/wait`), while the command keeps running (documented by the SDK,
  `blaxel==0.4.24`, `SandboxProcess.exec`). None: no cut.
- `timeout_status` (default 422): the server's own `timeout` (whole seconds) answers
  422 `{"error": "process timed out after N seconds"}` and leaves the process running
  (`handler/process.go` `HandleExecuteCommand`, `handler/process/service.go`
  `ExecuteProcess`). 408: the older answer (the process killed, its record in the body).
- `go_exit_codes` (default True): a process killed by a signal reports exit code -1
  (Go's `ExitError.ExitCode()`, `handler/process/process.go`). False: 128+N.
- `wait_endpoint` (default True): `GET /process/{id}/wait`, which the SDK long-polls;
  the server at that commit has no such route, so False answers gin's plain-text 404
  (the SDK then polls `GET /process/{id}`).
- terminal (`handler/terminal.go`, `handler/terminal/session_manager.go`,
  `handler/terminal/terminal.go`): `{"type": "resize", "cols", "rows"}` resizes the
  PTY and unknown or malformed messages are ignored silently (`terminal_resize=False`:
  both answered with an `error` frame, as before). When the shell exits, its session's
  processes are killed, but the socket stays OPEN: the server only notices between
  client messages, so it closes after the next one (`close_terminal_on_exit=True`:
  it closes at once). Sessions outlive their sockets (`session_manager.go`): one is
  found again by `sessionId` (a dead one is replaced by a new shell), resized to the
  new client's size, and its output ring (`TERMINAL_RING_BYTES`, 100 KiB, its front
  cut at a line) is replayed first as one `output` frame after `ANSI_RESET`; the
  `shell` query parameter names the program of a NEW session only (one that cannot
  start answers an `error` frame and closes). A session without clients is closed
  `terminal_idle_s` (600) after its last output or client, swept every
  `terminal_cleanup_s` (30); `cleanup_terminals(idle_s=0)` runs the sweep as if
  that time had passed. `GET /sandboxes/{name}` answers a deleted sandbox with status
  TERMINATED (the SDK's `SandboxInstance.get`; `terminated` holds them). Output
  is read from the PTY `read_size` (4096) bytes at a time and each read becomes one
  frame through `string(buf[:n])` and Go's JSON encoder, which replaces every byte of
  an invalid or split UTF-8 sequence with one U+FFFD
  (`go_utf8=False`: an incremental decoder that never splits a character). Frames are
  further cut to at most `output_frame_chars` characters.

Snapshots (blaxel==0.4.24 `core/sandbox/default/snapshot.py`, `core/snapshot/snapshot.py`,
the generated `client/api/compute/*snapshot*.py` and `client/models/sandbox_snapshot*.py`;
the states from blaxel-ai/sdk-python's integration test
`test_workspace_snapshots.py`): `POST /sandboxes/{name}/snapshots` answers the record
at once with status "pending" (409 for a name the sandbox's snapshots already use,
404 for an unknown sandbox); the capture runs beside it and the status becomes "ready"
(or "failed"). `GET /snapshots/{id}`, `GET /sandboxes/{name}/snapshots`,
`DELETE /snapshots/{id}` and `DELETE /sandboxes/{name}/snapshots/{id}` (204; 404
`NOT_FOUND` when unknown); a snapshot outlives its sandbox (`source.deleted`).
`POST /snapshots/{id}/fork` with `{targetName, targetType: "sandbox"}` makes the
sandbox at once, status "DEPLOYING", answers `{name, snapshotId, type}`, and puts the
snapshot's files in place before the status becomes "DEPLOYED" (a fork of a snapshot
not "ready" is refused with 409: an assumption; a fork into an application is not
modelled). A stand-in sandbox is this machine, so "its files" are one folder, the
`workdir` knob (default None: snapshots hold nothing): a snapshot copies that tree
(symlinks as links, modes kept, FIFOs made anew, sockets and devices left out), a fork
replaces the folder's contents with it, and deleting the last sandbox removes the
folder (its filesystem goes with it). Every sandbox of one server shares the folder.
Fault points: `snapshot_create`, `snapshot_get`, `snapshot_delete`, `snapshot_fork` (a
gate with `after=True` on `snapshot_create` or `snapshot_fork` holds the answer of a
snapshot or fork already made), `snapshot_capture` (a stall keeps a snapshot
"pending", a planned failure makes it "failed") and `fork_deploy` (likewise
"DEPLOYING" or "FAILED").

Authentication: HTTP calls must carry `X-Blaxel-Authorization: Bearer <api_key>` (and,
on the control plane, `X-Blaxel-Workspace`); the terminal checks `?token=`. The access
log is off, because the terminal URL carries the token.

Using it::

    from sandbox.testing.blaxel_server import BlaxelServer

    async with BlaxelServer() as server:
        # the backend:
        async with sandbox.open_session(
            "blaxel", workdir=str(tmp_path), **server.backend_options()
        ) as session:
            ...
        # or the Blaxel SDK directly:
        server.configure_sdk()
        box = await SandboxInstance.create_if_not_exists({"name": "demo"})

Give the backend a `workdir` that exists on this machine (the default `/workspace`
usually cannot be created here).

Fault injection (thin wrappers over `server.faults`, a `sandbox.testing.faults.FaultPlan`;
each knob names an endpoint from `ENDPOINTS`; `"exec_wait"` is a `POST /process` with
`waitForCompletion` after its process started):

- `fail(endpoint, status, code=..., times=1)`: answer the next call(s) with that HTTP
  status and a body shaped like Blaxel's (gateway envelope for 502/503/504/429, the
  endpoint's documented error model otherwise). For `"terminal"` this refuses the
  WebSocket handshake.
- `stall(endpoint)`: the next call blocks; the returned `asyncio.Event` is set once it
  is blocked, so a test can cancel its client deterministically. `release()` (or
  closing the server) unblocks it. `"terminal_output"` stops sending output frames
  and `"terminal_input"` stops reading the socket (so a big client write blocks).
- `flood(endpoint)`: the next call is answered 200 with a body that never ends (up
  to `FLOOD_LIMIT`); `trickle(endpoint)`: one byte every `interval_s`;
  `send_terminal_frame(size)`: one huge `output` frame on every live terminal.
- `drop_terminals()`: abort every live terminal connection now (no close frame);
  `drop_terminals_after(frames)`: new terminals are aborted after that many output
  frames.
- `send_terminal_error(text)`: send an `error` frame on every live terminal.
- `break_terminals("input" | "output")`: the next client message read, or the next
  output turn, fails (`TerminalFault`); the other branch is cancelled and awaited,
  the terminal ends. `terminal_tasks()` counts the handlers and pumps still running.

Inspection: `requests` (method and path of every call), `terminals` (the query of every
terminal handshake), `sandboxes`, `terminal_sessions(name)` (each session id and whether
its shell runs), `live_processes()` (local processes still running), `leftover_pids()`
(local processes still carrying a sandbox's mark, its runner's included).

The runner (docs/runner.md) runs in a stand-in sandbox as in a real one: its bytes
written through the filesystem API, started detached by a bridge typed into a terminal,
reached again by the next client's bridge. A real sandbox is a VM of its own (its /tmp
its own, its deletion the end of everything in it); here every sandbox shares this
machine, so each sandbox's processes (one-shot and terminal alike) see
`SANDBOX_RUNNER_DIR`, a short folder name of its own (made by whoever puts a runner
there, removed with the sandbox), and `SANDBOX_STANDIN_BOX`, the stand-in's own mark
(no Blaxel variable): the runner leaves the session of the terminal that started it, so
deleting a sandbox also kills every local process whose environment carries its mark,
as the VM's end would.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import os
import posixpath
import secrets
import shutil
import signal
import socket
import stat as stat_module
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

from aiohttp import WSMsgType, web

from ..files.remove_tree import discard_tree
from ..local import tree as process_tree
from ..local.process import LocalProcess
from . import faults, procfs
from .preview_proxy import PreviewProxy
from .special_files import wait_forever_on_special_file

ENDPOINTS = (
    "create",
    "get",
    "delete",
    "exec",
    "exec_wait",
    "process_get",
    "process_wait",
    "process_logs",
    "kill",
    "read",
    "write",
    "mkdir",
    "terminal",
    "terminal_output",
    "terminal_input",
    "snapshot_create",
    "snapshot_get",
    "snapshot_delete",
    "snapshot_fork",
    "snapshot_capture",
    "fork_deploy",
)

# Frames mixed into terminal output with `quirks=True`: none of them is a valid frame.
GARBAGE_FRAMES: tuple[str | bytes, ...] = (
    "not json at all",
    b"\xff\xfe\x00\x81 not utf-8",
    "[1, 2, 3]",
    '{"type": "ping"}',
    '{"data": "orphan data"}',
    '{"type": "output", "data": 42}',
    '{"Type": "resize", "Data": "80x24"}',
    '"just a string"',
    "",
    b'{"type": "output"',
)

_DEFAULT_CODES = {
    400: "BAD_REQUEST",
    401: "AUTHENTICATION_FAILED",
    403: "FORBIDDEN",
    404: "WORKLOAD_NOT_FOUND",
    408: "UPSTREAM_TIMEOUT",
    409: "SANDBOX_ALREADY_EXISTS",
    429: "RATE_LIMIT_EXCEEDED",
    500: "INTERNAL_ERROR",
    502: "UPSTREAM_ERROR",
    503: "WORKLOAD_UNAVAILABLE",
    504: "UPSTREAM_TIMEOUT",
}
_GATEWAY_STATUSES = frozenset({429, 502, 503, 504})
_OUTPUT_HIGH_WATER = 1024 * 1024
# A process's output as Blaxel keeps it (the SDK: `logs` returns up to 4 MB, `get` and
# `list` the last 64 KB of each stream).
OUTPUT_RETAIN = 4 * 1024 * 1024
GET_OUTPUT_TAIL = 64 * 1024
# The terminal's session manager (handler/terminal/session_manager.go): the output ring
# replayed to a new connection (`maxBufferSize`), prefixed with `ansiReset`; a session
# with no client is closed this long after its last activity (`sessionIdleTimeout`),
# checked this often (`sessionCleanupInterval`).
TERMINAL_RING_BYTES = 100 * 1024
ANSI_RESET = b"\x1b[0m"
TERMINAL_IDLE_S = 10 * 60.0
TERMINAL_CLEANUP_S = 30.0
# What every process of a stand-in sandbox sees (see "The runner" in the module
# docstring): its own runner folder, and the mark its deletion finds its processes by.
RUNNER_DIR_ENV = "SANDBOX_RUNNER_DIR"
BOX_MARK_ENV = "SANDBOX_STANDIN_BOX"
# The header a private preview's token travels in (blaxel==0.4.24 `SandboxPreviewToken`).
PREVIEW_TOKEN_HEADER = "X-Blaxel-Preview-Token"
_CONTROL_ENDPOINTS = frozenset(
    {"create", "get", "delete", "snapshot_create", "snapshot_get", "snapshot_delete"}
    | {"snapshot_fork"}
)


def _go_replace(error: UnicodeError) -> tuple[str, int]:
    """Go's `encoding/json` replaces each byte of invalid UTF-8 with one U+FFFD (its
    `utf8.DecodeRuneInString` reports size 1 for any invalid or truncated sequence),
    where Python's "replace" uses one U+FFFD per maximal invalid subpart."""
    assert isinstance(error, UnicodeDecodeError)
    return "\ufffd", error.start + 1


_GO_REPLACE = "sandbox-blaxel-go-json"
codecs.register_error(_GO_REPLACE, _go_replace)


def go_terminal_text(data: bytes) -> str:
    """What the real terminal sends for one PTY read: `string(buf[:n])` through Go's
    JSON encoder, every byte of invalid or split UTF-8 becoming one U+FFFD
    (`sandbox-api/src/handler/terminal.go`, the output goroutine)."""
    return data.decode("utf-8", _GO_REPLACE)


def _http_date() -> str:
    return formatdate(usegmt=True)


def _kill_session(sid: int) -> None:
    """SIGKILL every member of session `sid` (its leader is a child of this process,
    unreaped, so the id cannot have been reused)."""
    process_tree.signal_session(sid, signal.SIGKILL)


class TerminalFault(RuntimeError):
    """A failure injected into one direction of a terminal with `break_terminals`."""


@dataclass(frozen=True)
class _Failure:
    """The answer a planned failure gives (the `FaultPlan` counts the calls)."""

    status: int
    code: str
    message: str


def _keep_tail(buffer: bytearray, data: bytes) -> None:
    """Append, keeping at most the last `OUTPUT_RETAIN` bytes (a flood must not fill
    the test process's memory; Blaxel itself keeps a bounded log)."""
    buffer += data
    excess = len(buffer) - OUTPUT_RETAIN
    if excess > 0:
        del buffer[:excess]


@dataclass(eq=False)
class _Process:
    """One process started through `POST /process`. Its output is kept as Blaxel keeps
    it: the last 4 MB of each stream (what `logs` returns); `GET /process/{id}` and the
    list answer the last 64 KB."""

    name: str
    command: str
    working_dir: str
    proc: LocalProcess | None = None
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    started_at: str = field(default_factory=_http_date)
    completed_at: str = ""
    status: str = "running"
    exit_code: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def finish(self, code: int) -> None:
        if self.done.is_set():
            return
        self.exit_code = code
        if self.status == "running":
            self.status = "completed" if code == 0 else "failed"
        self.completed_at = _http_date()
        self.done.set()

    def add_stdout(self, data: bytes) -> None:
        _keep_tail(self.stdout, data)

    def add_stderr(self, data: bytes) -> None:
        _keep_tail(self.stderr, data)

    def to_json(self, tail: int = OUTPUT_RETAIN) -> dict[str, Any]:
        out = self.stdout[-tail:].decode("utf-8", "replace")
        err = self.stderr[-tail:].decode("utf-8", "replace")
        return {
            "command": self.command,
            "completedAt": self.completed_at,
            "exitCode": self.exit_code,
            "logs": out + err,
            "name": self.name,
            "pid": str(self.proc.pid if self.proc else 0),
            "startedAt": self.started_at,
            "status": self.status,
            "stderr": err,
            "stdout": out,
            "workingDir": self.working_dir,
        }


@dataclass(eq=False)
class _TerminalSession:
    """One terminal session: the shell on its PTY, kept across WebSocket connections by
    `sessionId`, as `ManagedSession` (handler/terminal/session_manager.go) keeps it."""

    id: str
    proc: LocalProcess | None = None
    # The output ring replayed to each new connection (`maxBufferSize`, cut at a line).
    ring: bytearray = field(default_factory=bytearray)
    # The connections subscribed to the output now.
    conns: set[_Terminal] = field(default_factory=set)
    paused: bool = False
    # The shell is gone (it exited, or the session was closed and killed).
    exited: bool = False
    eof: bool = False
    # The shell exited and its session was killed (`markDead`): no more output, the
    # ring is frozen, and a connection to this id creates a new session.
    dead: bool = False
    # `lastActivity`: the last output appended or client leaving (loop time).
    last_activity: float = 0.0


@dataclass(eq=False)
class _Terminal:
    """One terminal WebSocket connection, subscribed to a `_TerminalSession`."""

    ws: web.WebSocketResponse
    transport: asyncio.Transport | None
    session: _TerminalSession | None = None
    # Output not yet sent on this connection.
    buffer: bytearray = field(default_factory=bytearray)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    closed: bool = False
    frames: int = 0
    drop_after: int | None = None
    # Every output text sent, in order (what the real server would have produced).
    sent: list[str] = field(default_factory=list)

    @property
    def exited(self) -> bool:
        """Whether the shell behind this connection is gone."""
        return self.session is None or self.session.exited

    @property
    def dead(self) -> bool:
        """Whether the session behind this connection is dead (see `_TerminalSession`)."""
        return self.session is not None and self.session.dead

    @property
    def eof(self) -> bool:
        """Whether the shell's output ended."""
        return self.session is None or self.session.eof


# A flood stops by itself after this many bytes (the client is expected to give up
# long before).
FLOOD_LIMIT = 1024 * 1024 * 1024
_FLOOD_CHUNK = b"x" * (64 * 1024)


@dataclass
class FloodingPeer:
    """A peer that answers 200 and then sends a body that never ends (see `flood`)."""

    limit: int
    skip: int = 0
    # A `Content-Encoding` to claim (the body is sent as it is).
    encoding: str | None = None
    sent: int = 0

    async def answer(self, request: web.Request) -> web.StreamResponse:
        """Stream the endless body (see `BlaxelServer.flood`)."""
        headers = {"Content-Type": "application/json"}
        if self.encoding:
            headers["Content-Encoding"] = self.encoding
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write(b'{"stdout": "')
            while self.sent < self.limit:
                await response.write(_FLOOD_CHUNK)
                self.sent += len(_FLOOD_CHUNK)
        return response


@dataclass
class TricklingPeer:
    """A peer that answers 200 and then one byte every `interval_s` (see `trickle`)."""

    interval_s: float
    limit: int
    skip: int = 0
    sent: int = 0

    async def answer(self, request: web.Request) -> web.StreamResponse:
        """Send the body a byte at a time (see `BlaxelServer.trickle`)."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            while self.sent < self.limit:
                await response.write(b" ")
                self.sent += 1
                await asyncio.sleep(self.interval_s)
        return response


@dataclass(eq=False)
class FakeSandbox:
    """A sandbox of the server: its record and what runs in it."""

    name: str
    record: dict[str, Any]
    processes: dict[str, _Process] = field(default_factory=dict)
    terminals: set[_Terminal] = field(default_factory=set)
    # Terminal sessions by `sessionId`: they outlive their connections.
    term_sessions: dict[str, _TerminalSession] = field(default_factory=dict)
    # Previews by name, each with the loopback forwarder that serves its URL.
    previews: dict[str, tuple[dict[str, Any], PreviewProxy]] = field(default_factory=dict)
    # The sandbox's own runner folder (`RUNNER_DIR_ENV`): short, since a unix socket's
    # path is at most 107 bytes; named here, made by whoever puts a runner there.
    runner_dir: str = field(default_factory=lambda: f"/tmp/brun-{secrets.token_hex(6)}")
    # The mark (`BOX_MARK_ENV`) every process of this sandbox carries.
    mark: str = field(default_factory=lambda: secrets.token_hex(8))


@dataclass(eq=False)
class FakeSnapshot:
    """A snapshot of the server: its record (blaxel==0.4.24 `SandboxSnapshot`) and the
    folder holding the files it captured (the `workdir` tree, once it is "ready")."""

    id: str
    record: dict[str, Any]
    folder: str


class BlaxelServer:
    """The loopback Blaxel server (see the module docstring). Use it as
    `async with BlaxelServer(...) as server:`, or `await start()` / `await close()`."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        workspace: str = "local-workspace",
        shell: list[str] | None = None,
        quirks: bool = True,
        output_frame_chars: int = 4096,
        root: str | None = None,
        edge_cut_s: float | None = 60.0,
        timeout_status: int = 422,
        go_exit_codes: bool = True,
        wait_endpoint: bool = True,
        terminal_resize: bool = True,
        close_terminal_on_exit: bool = False,
        go_utf8: bool = True,
        read_size: int = 4096,
        terminal_idle_s: float = TERMINAL_IDLE_S,
        terminal_cleanup_s: float = TERMINAL_CLEANUP_S,
        workdir: str | None = None,
    ) -> None:
        self.api_key = api_key or f"bl-test-{secrets.token_hex(16)}"
        self.workspace = workspace
        if shell is None:
            bash = shutil.which("bash")
            shell = [bash, "--noprofile", "--norc", "-i"] if bash else ["sh", "-i"]
        self.shell = shell
        self.quirks = quirks
        self.output_frame_chars = max(1, output_frame_chars)
        if timeout_status not in (408, 422):
            raise ValueError("timeout_status is 422 (the server's) or 408 (the older stand-in)")
        self.edge_cut_s = edge_cut_s
        self.timeout_status = timeout_status
        self.go_exit_codes = go_exit_codes
        self.wait_endpoint = wait_endpoint
        self.terminal_resize = terminal_resize
        self.close_terminal_on_exit = close_terminal_on_exit
        self.go_utf8 = go_utf8
        self.read_size = max(1, read_size)
        self.terminal_idle_s = terminal_idle_s
        self.terminal_cleanup_s = terminal_cleanup_s
        self._cleanup: asyncio.Task[None] | None = None
        # The folder standing in for each sandbox's own files (see "Snapshots").
        self.workdir = os.path.realpath(workdir) if workdir is not None else None
        self.snapshots: dict[str, FakeSnapshot] = {}
        self._snapshot_root = ""
        # Captures and fork deployments under way (they outlive their request).
        self._background: set[asyncio.Task[None]] = set()
        # Deleted sandboxes: `GET` still answers them, status TERMINATED (the SDK,
        # `SandboxInstance.get`: "until its terminated_retention (5 minutes by default)").
        self.terminated: dict[str, dict[str, Any]] = {}
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.requests: list[tuple[str, str]] = []
        self.terminals: list[dict[str, str]] = []
        # Every accepted resize `(rows, cols)`, and how many `input` messages came.
        self.resizes: list[tuple[int, int]] = []
        self.inputs = 0
        self._terminal_sent: list[list[str]] = []
        self._given_root = root
        self.root = ""
        self._faults = faults.FaultPlan(ENDPOINTS)
        self._peers: dict[str, FloodingPeer | TricklingPeer] = {}
        self._drop_after: int | None = None
        # Directions ("input", "output") whose next step fails (`break_terminals`).
        self._broken: set[str] = set()
        # What serves terminals now: handlers, and the output pumps beside them.
        self._serving = 0
        self._pumps: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        # Every sandbox mark and runner folder handed out (`leftover_pids`, `runner_dirs`).
        self._marks: set[str] = set()
        self._runner_dirs: set[str] = set()
        self._port = 0
        self._counter = 0

    # ---- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> BlaxelServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Bind 127.0.0.1 on a free port and start serving."""
        self.root = self._given_root or tempfile.mkdtemp(prefix="blaxel-server-")
        self._snapshot_root = tempfile.mkdtemp(prefix="blaxel-snapshots-")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        self._routes(app)
        # No access log: the terminal URL carries the API key in its query.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        site = web.SockSite(runner, sock)
        self._runner = runner
        await site.start()
        self._cleanup = asyncio.create_task(self._cleanup_loop(), name="blaxel-server-cleanup")

    async def close(self) -> None:
        """Unblock stalled calls, kill every process of every sandbox, stop serving."""
        self.release()
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup.cancel()
            await asyncio.gather(cleanup, return_exceptions=True)
        background, self._background = list(self._background), set()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for box in list(self.sandboxes.values()):
            await self._destroy(box)
        self.sandboxes.clear()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if not self._given_root and self.root:
            discard_tree(self.root)
        self.snapshots.clear()
        if self._snapshot_root:
            discard_tree(self._snapshot_root)

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def api_url(self) -> str:
        """The control-plane URL to give the SDK / the backend (`api_url=`)."""
        return f"{self.url}/v0"

    def sandbox_url(self, name: str) -> str:
        """The URL of sandbox `name` (what the API returns as its `metadata.url`)."""
        return f"{self.url}/run/{self.workspace}/sandboxes/{name}"

    def backend_options(self, **extra: Any) -> dict[str, Any]:
        """Options for `open_session("blaxel", ...)` that point the backend here."""
        options: dict[str, Any] = {
            "api_url": self.api_url,
            "api_key": self.api_key,
            "workspace": self.workspace,
            "region": "local-1",
        }
        options.update(extra)
        return options

    def configure_sdk(self) -> None:
        """Point the Blaxel SDK's process-wide client at this server (for tests that use
        the SDK directly)."""
        from ..backends.blaxel.sdk import configure_sdk

        configure_sdk(api_key=self.api_key, workspace=self.workspace, api_url=self.api_url)

    def terminal_output(self) -> list[list[str]]:
        """The output texts each terminal sent (one per PTY read), in the order the
        terminals were opened: after the conversion the real server makes, before any
        frame quirk."""
        return [list(sent) for sent in self._terminal_sent]

    def live_processes(self) -> int:
        """How many local processes (one-shot and terminal shells) are still running."""
        count = 0
        for box in self.sandboxes.values():
            count += sum(1 for p in box.processes.values() if not p.done.is_set())
            count += sum(1 for t in box.term_sessions.values() if not t.exited)
        return count

    def leftover_pids(self, marks: list[str] | None = None) -> list[int]:
        """Live local processes carrying the mark of a sandbox of this server (alive or
        deleted, or of `marks`): the runner and what it keeps left their session, so
        only the mark finds them (leaks, unless their sandbox is still meant to run them)."""
        wanted = set(marks or []) | set(self._marks)
        found: set[int] = set()
        for mark in wanted:
            found.update(procfs.pids_with_env(BOX_MARK_ENV, mark))
        return sorted(found)

    def runner_dirs(self) -> list[str]:
        """The runner folder of every sandbox this server made (alive or deleted)."""
        return list(self._runner_dirs)

    # ---- fault knobs -----------------------------------------------------------------

    @property
    def faults(self) -> faults.FaultPlan:
        """The fault plan behind the knobs below (`sandbox.testing.faults`): arm gates
        and planned failures at any point directly, in the kit's own terms."""
        return self._faults

    def fail(
        self,
        endpoint: str,
        status: int,
        *,
        code: str | None = None,
        message: str | None = None,
        times: int | None = 1,
    ) -> None:
        """Answer the next `times` calls (None: all) of `endpoint` with HTTP `status`."""
        self._check_endpoint(endpoint)
        # A new failure replaces the one armed for the same endpoint.
        self._faults.failures[:] = [f for f in self._faults.failures if f.point != endpoint]
        answer = _Failure(
            status,
            code or _DEFAULT_CODES.get(status, "UNKNOWN_ERROR"),
            message or f"injected failure ({status})",
        )
        self._faults.fail(endpoint, answer, times=times)

    def stall(self, endpoint: str) -> asyncio.Event:
        """Block the next call of `endpoint`; the event is set once it is blocked."""
        self._check_endpoint(endpoint)
        # A new stall replaces the one armed for the same endpoint (parked calls stay).
        self._faults.gates[:] = [g for g in self._faults.gates if g.point != endpoint]
        return self._faults.stall(endpoint).reached

    def flood(
        self,
        endpoint: str,
        *,
        skip: int = 0,
        limit: int = FLOOD_LIMIT,
        content_encoding: str | None = None,
    ) -> FloodingPeer:
        """Answer the next call of `endpoint` (after `skip` more) with a 200 whose body
        never ends: a JSON string that is never closed, sent as fast as the client
        reads, until it goes away or `limit` bytes were sent (claiming
        `content_encoding` if given)."""
        self._check_endpoint(endpoint)
        peer = FloodingPeer(limit=limit, skip=skip, encoding=content_encoding)
        self._peers[endpoint] = peer
        return peer

    def trickle(
        self, endpoint: str, *, skip: int = 0, interval_s: float = 0.05, limit: int = 10_000
    ) -> TricklingPeer:
        """Answer the next call of `endpoint` (after `skip` more) with a 200 whose body
        comes one byte every `interval_s` (no single read waits long), at most `limit`
        bytes."""
        self._check_endpoint(endpoint)
        peer = self._peers[endpoint] = TricklingPeer(interval_s=interval_s, limit=limit, skip=skip)
        return peer

    async def send_terminal_frame(self, size: int) -> int:
        """Send one `output` frame of about `size` bytes on every live terminal (the
        real server's are at most ~600 KiB); returns to how many it was sent."""
        frame = json.dumps({"type": "output", "data": "x" * size})
        count = 0
        for box in self.sandboxes.values():
            for term in list(box.terminals):
                if not term.closed and not term.ws.closed:
                    count += 1
                    # A client that refuses the frame may drop the connection mid-send.
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await term.ws.send_str(frame)
        return count

    def release(self) -> None:
        """Unblock every stalled call (and stop stalling)."""
        self._faults.release_all()
        self._faults.gates.clear()

    def drop_terminals(self) -> int:
        """Abort every live terminal connection now (no close frame); returns how many."""
        count = 0
        for box in self.sandboxes.values():
            for term in list(box.terminals):
                if term.transport is not None and not term.closed:
                    term.transport.abort()
                    count += 1
        return count

    def drop_terminals_after(self, frames: int | None) -> None:
        """Abort each NEW terminal connection after it sent `frames` output frames."""
        self._drop_after = frames

    def break_terminals(self, direction: str) -> None:
        """Make the next step of one terminal branch fail with `TerminalFault`:
        `"input"` the next client message read, `"output"` the next output turn (every
        live pump is woken for it). The terminal then ends as on a server bug."""
        if direction not in ("input", "output"):
            raise ValueError("direction is 'input' or 'output'")
        self._broken.add(direction)
        if direction == "output":
            for box in self.sandboxes.values():
                for term in box.terminals:
                    term.wake.set()

    def terminal_tasks(self) -> int:
        """How many terminal handlers and output pumps are still running."""
        return self._serving + sum(not task.done() for task in self._pumps)

    def _fault(self, direction: str) -> None:
        if direction in self._broken:
            self._broken.discard(direction)
            raise TerminalFault(f"injected failure of the terminal's {direction}")

    async def send_terminal_error(self, text: str) -> None:
        """Send an `error` frame on every live terminal."""
        for box in self.sandboxes.values():
            for term in list(box.terminals):
                if not term.closed and not term.ws.closed:
                    await term.ws.send_str(json.dumps({"type": "error", "data": text}))

    def _check_endpoint(self, endpoint: str) -> None:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; known: {', '.join(ENDPOINTS)}")

    async def _gate(self, endpoint: str, request: web.Request) -> web.StreamResponse | None:
        """Apply the faults set for `endpoint`: a failure response, a stall, a flood or
        a trickle."""
        peer = self._peers.get(endpoint)
        if peer is not None:
            if peer.skip > 0:
                peer.skip -= 1
            else:
                del self._peers[endpoint]
                return await peer.answer(request)
        failure = self._faults.take(endpoint)
        if isinstance(failure, _Failure):
            return self._error(endpoint, failure.status, failure.code, failure.message)
        await self._faults.park(endpoint)
        return None

    def _error(self, endpoint: str, status: int, code: str, message: str) -> web.Response:
        body: dict[str, Any]
        if status in _GATEWAY_STATUSES:
            body = {
                "error": {
                    "code": code,
                    "message": message,
                    "status": status,
                    "origin": "platform",
                    "retryable": status != 429 or code == "RATE_LIMIT_EXCEEDED",
                }
            }
        elif endpoint == "create":
            body = {"code": code, "message": message, "status_code": status}
        elif endpoint in _CONTROL_ENDPOINTS:
            body = {"error": code, "code": status, "message": message}
        else:
            body = {"error": message, "code": code}
        return web.json_response(body, status=status)

    # ---- routing and auth ---------------------------------------------------------------

    def _routes(self, app: web.Application) -> None:
        box = "/run/{workspace}/sandboxes/{name}"
        app.router.add_post("/v0/sandboxes", self._create)
        app.router.add_get("/v0/sandboxes/{name}", self._get)
        app.router.add_delete("/v0/sandboxes/{name}", self._delete)
        previews = "/v0/sandboxes/{name}/previews"
        app.router.add_post(previews, self._preview_create)
        app.router.add_get(previews + "/{preview}", self._preview_get)
        app.router.add_delete(previews + "/{preview}", self._preview_delete)
        app.router.add_post(previews + "/{preview}/tokens", self._preview_token)
        app.router.add_post("/v0/sandboxes/{name}/snapshots", self._snapshot_create)
        app.router.add_get("/v0/sandboxes/{name}/snapshots", self._snapshot_list)
        app.router.add_delete("/v0/sandboxes/{name}/snapshots/{id}", self._snapshot_delete)
        app.router.add_get("/v0/snapshots/{id}", self._snapshot_get)
        app.router.add_delete("/v0/snapshots/{id}", self._snapshot_delete)
        app.router.add_post("/v0/snapshots/{id}/fork", self._snapshot_fork)
        app.router.add_post(box + "/process", self._exec)
        app.router.add_get(box + "/process/{id}", self._process_get)
        app.router.add_get(box + "/process/{id}/wait", self._process_wait)
        app.router.add_get(box + "/process/{id}/logs", self._process_logs)
        app.router.add_delete(box + "/process/{id}", self._kill)
        app.router.add_delete(box + "/process/{id}/kill", self._kill)
        app.router.add_get(box + "/filesystem/{path:.*}", self._read)
        app.router.add_put(box + "/filesystem/{path:.*}", self._write)
        app.router.add_post(box + "/filesystem-multipart/initiate/{path:.*}", self._mp_initiate)
        app.router.add_put(box + "/filesystem-multipart/{upload}/part", self._mp_part)
        app.router.add_post(box + "/filesystem-multipart/{upload}/complete", self._mp_complete)
        app.router.add_delete(box + "/filesystem-multipart/{upload}/abort", self._mp_abort)
        app.router.add_get(box + "/terminal/ws", self._terminal)
        self._uploads: dict[str, dict[int, bytes]] = {}
        self._upload_paths: dict[str, str] = {}

    def _record(self, request: web.Request) -> None:
        self.requests.append((request.method, request.path))

    def _authorized(self, request: web.Request, *, control: bool) -> bool:
        if request.headers.get("X-Blaxel-Authorization") != f"Bearer {self.api_key}":
            return False
        return not control or request.headers.get("X-Blaxel-Workspace") == self.workspace

    def _unauthorized(self, endpoint: str) -> web.Response:
        return self._error(endpoint, 401, "AUTHENTICATION_FAILED", "invalid credentials")

    def _sandbox(self, request: web.Request) -> FakeSandbox | None:
        if request.match_info.get("workspace", self.workspace) != self.workspace:
            return None
        return self.sandboxes.get(request.match_info["name"])

    def _not_found(self, endpoint: str) -> web.Response:
        return web.json_response(
            {
                "error": {
                    "code": "WORKLOAD_NOT_FOUND",
                    "message": "sandbox not found",
                    "status": 404,
                    "origin": "platform",
                    "retryable": False,
                }
            },
            status=404,
        )

    async def _data_plane(
        self, request: web.Request, endpoint: str
    ) -> tuple[FakeSandbox | None, web.StreamResponse | None]:
        """Common checks of a sandbox-API call: the sandbox, auth, faults."""
        self._record(request)
        box = self._sandbox(request)
        if box is None:
            return None, self._not_found(endpoint)
        if not self._authorized(request, control=False):
            return None, self._unauthorized(endpoint)
        if request.content_type == "application/json":
            await request.read()  # read first (kept by aiohttp): a stalled call was received
        early = await self._gate(endpoint, request)
        if early is not None:
            return None, early
        if self.sandboxes.get(box.name) is not box:  # deleted while stalled
            return None, self._not_found(endpoint)
        return box, None

    # ---- control plane ------------------------------------------------------------------

    async def _create(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        if not self._authorized(request, control=True):
            return self._unauthorized("create")
        body = await request.json()  # read first: a stalled request was still received
        early = await self._gate("create", request)
        if early is not None:
            return early
        metadata = dict(body.get("metadata") or {})
        name = metadata.get("name") or f"sandbox-{secrets.token_hex(4)}"
        existing = self.sandboxes.get(name)
        if existing is not None:
            if request.query.get("createIfNotExist") == "true":
                return web.json_response(existing.record)
            return self._error("create", 409, "SANDBOX_ALREADY_EXISTS", f"{name} exists")
        metadata.update(name=name, url=self.sandbox_url(name), workspace=self.workspace)
        record: dict[str, Any] = {
            "metadata": metadata,
            "spec": body.get("spec") or {},
            "status": "DEPLOYED",
            "events": [],
        }
        self.terminated.pop(name, None)  # a TERMINATED one is replaced
        self.sandboxes[name] = FakeSandbox(name, record)
        return web.json_response(record)

    async def _get(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        if not self._authorized(request, control=True):
            return self._unauthorized("get")
        early = await self._gate("get", request)
        if early is not None:
            return early
        name = request.match_info["name"]
        box = self.sandboxes.get(name)
        if box is None:
            terminated = self.terminated.get(name)
            if terminated is not None:
                return web.json_response(terminated)
            return self._error("get", 404, "WORKLOAD_NOT_FOUND", "Sandbox not found")
        return web.json_response(box.record)

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        if not self._authorized(request, control=True):
            return self._unauthorized("delete")
        early = await self._gate("delete", request)
        if early is not None:
            return early
        box = self.sandboxes.pop(request.match_info["name"], None)
        if box is None:
            return self._error("delete", 404, "WORKLOAD_NOT_FOUND", "Sandbox not found")
        await self._destroy(box)
        self.terminated[box.name] = {**box.record, "status": "TERMINATED"}
        for snap in self.snapshots.values():  # they outlive it (`source.deleted`)
            if snap.record["sandboxName"] == box.name:
                snap.record["source"]["deleted"] = True
        if self.workdir is not None and not self.sandboxes:
            # The sandbox's filesystem goes with it (the folder is the files of every
            # sandbox here: it goes with the last one).
            await asyncio.to_thread(discard_tree, self.workdir)
        return web.json_response(self.terminated[box.name])

    async def _destroy(self, box: FakeSandbox) -> None:
        """Kill everything `box` runs: one-shot processes and terminal sessions (and
        stop serving its previews)."""
        for _record, proxy in list(box.previews.values()):
            await proxy.close()
        box.previews.clear()
        for session in list(box.term_sessions.values()):
            await self._close_session(box, session)
        for term in list(box.terminals):
            if not term.ws.closed:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await term.ws.close()
        for record in box.processes.values():
            if record.proc is not None:
                await record.proc.terminate(0)
        # What left its session (the runner, and the processes it keeps) ends too, and
        # the sandbox's runner folder goes with its filesystem.
        for pid in procfs.pids_with_env(BOX_MARK_ENV, box.mark):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(shutil.rmtree, box.runner_dir, True)

    # ---- previews (the control plane's `/sandboxes/{name}/previews`) ----------------------

    async def _preview_box(
        self, request: web.Request
    ) -> tuple[FakeSandbox | None, web.StreamResponse | None]:
        self._record(request)
        if not self._authorized(request, control=True):
            return None, self._unauthorized("get")
        box = self.sandboxes.get(request.match_info["name"])
        if box is None:
            return None, self._error("get", 404, "WORKLOAD_NOT_FOUND", "Sandbox not found")
        return box, None

    async def _preview_create(self, request: web.Request) -> web.StreamResponse:
        """A preview publishes one port of the sandbox (blaxel==0.4.24
        `SandboxPreviews.create`: `{metadata: {name}, spec: {port, public}}`): here a
        loopback forwarder to that port, which a private preview guards with the
        `X-Blaxel-Preview-Token` header (the SDK's `SandboxPreviewToken`). 409 for a
        name in use."""
        box, early = await self._preview_box(request)
        if box is None or early is not None:
            return early or self._not_found("get")
        body = await request.json()
        name = str((body.get("metadata") or {}).get("name") or "")
        spec = dict(body.get("spec") or {})
        port = spec.get("port")
        if not name or isinstance(port, bool) or not isinstance(port, int):
            return self._error("get", 400, "BAD_REQUEST", "a preview needs a name and a port")
        if name in box.previews:
            return self._error("get", 409, "CONFLICT", f"preview {name} exists")
        public = bool(spec.get("public"))
        header = None if public else PREVIEW_TOKEN_HEADER
        # A private preview accepts only the tokens minted for it (`allow`).
        proxy = await PreviewProxy(port, header=header, token=secrets.token_hex(32)).start()
        spec.update(public=public, url=proxy.url)
        # The SDK mints tokens under `metadata.resourceName` (`SandboxPreviewTokens`):
        # the API's record names the sandbox that owns the preview.
        metadata = {
            "name": name,
            "resourceName": box.name,
            "resourceType": "Sandbox",
            "workspace": self.workspace,
        }
        record = {"metadata": metadata, "spec": spec, "status": "DEPLOYED"}
        box.previews[name] = (record, proxy)
        return web.json_response(record)

    async def _preview_get(self, request: web.Request) -> web.StreamResponse:
        box, early = await self._preview_box(request)
        if box is None or early is not None:
            return early or self._not_found("get")
        found = box.previews.get(request.match_info["preview"])
        if found is None:
            return self._error("get", 404, "NOT_FOUND", "preview not found")
        return web.json_response(found[0])

    async def _preview_delete(self, request: web.Request) -> web.StreamResponse:
        box, early = await self._preview_box(request)
        if box is None or early is not None:
            return early or self._not_found("get")
        found = box.previews.pop(request.match_info["preview"], None)
        if found is None:
            return self._error("get", 404, "NOT_FOUND", "preview not found")
        await found[1].close()
        return web.json_response(found[0])

    async def _preview_token(self, request: web.Request) -> web.StreamResponse:
        """A new token for a private preview (`SandboxPreviewTokens.create`), valid
        until its `expiresAt` (expiry is not enforced here)."""
        box, early = await self._preview_box(request)
        if box is None or early is not None:
            return early or self._not_found("get")
        found = box.previews.get(request.match_info["preview"])
        if found is None:
            return self._error("get", 404, "NOT_FOUND", "preview not found")
        body = await request.json()
        expires = str((body.get("spec") or {}).get("expiresAt") or "")
        token = f"bl-preview-{secrets.token_hex(16)}"
        found[1].allow(token)
        return web.json_response(
            {
                "metadata": {"name": f"token-{secrets.token_hex(4)}"},
                "spec": {"token": token, "expiresAt": expires, "expired": False},
            }
        )

    # ---- snapshots (the control plane's `/sandboxes/{name}/snapshots`, `/snapshots`) ----

    def _in_background(self, work: Any, name: str) -> None:
        """Run `work` beside the request (the close cancels and awaits it)."""
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _control(self, request: web.Request, endpoint: str) -> web.StreamResponse | None:
        """The checks of a control-plane call: auth, then the faults (body read first,
        so a stalled call was received)."""
        self._record(request)
        if not self._authorized(request, control=True):
            return self._unauthorized(endpoint)
        if request.body_exists:
            await request.read()
        return await self._gate(endpoint, request)

    def _snapshot_not_found(self, endpoint: str, ident: str) -> web.Response:
        return self._error(endpoint, 404, "NOT_FOUND", f"snapshot {ident} not found")

    async def _snapshot_create(self, request: web.Request) -> web.StreamResponse:
        """`POST /sandboxes/{name}/snapshots` (`SandboxSnapshots.create`): the record
        at once, status "pending"; the capture runs beside it (`_capture`). 404 for an
        unknown sandbox, 409 for a name its snapshots already use ("unique among the
        snapshots of the sandbox it was captured from")."""
        early = await self._control(request, "snapshot_create")
        if early is not None:
            return early
        box = self.sandboxes.get(request.match_info["name"])
        if box is None:
            return self._error("snapshot_create", 404, "WORKLOAD_NOT_FOUND", "Sandbox not found")
        body = await request.json() if request.body_exists else {}
        snap_id = f"snap_{secrets.token_hex(8)}"
        name = str((body or {}).get("name") or snap_id)
        for other in self.snapshots.values():
            if other.record["sandboxName"] == box.name and other.record["name"] == name:
                return self._error(
                    "snapshot_create", 409, "CONFLICT", f"snapshot {name} already exists"
                )
        spec = dict(box.record.get("spec") or {})
        runtime = dict(spec.get("runtime") or {})
        carried = {
            "image": runtime.get("image"),
            "memory": runtime.get("memory"),
            "region": spec.get("region"),
        }
        record: dict[str, Any] = {
            "id": snap_id,
            "name": name,
            "status": "pending",
            "workspace": self.workspace,
            "createdAt": _http_date(),
            "sandboxName": box.name,
            "source": {"name": box.name, "kind": "sandbox", "deleted": False},
            "spec": {key: value for key, value in carried.items() if value is not None},
        }
        snap = FakeSnapshot(snap_id, record, os.path.join(self._snapshot_root, snap_id))
        self.snapshots[snap_id] = snap
        self._in_background(self._capture(snap), f"blaxel-snapshot-{snap_id}")
        await self._faults.park("snapshot_create", after=True)  # made, the answer held
        return web.json_response(record)

    async def _capture(self, snap: FakeSnapshot) -> None:
        """Copy the `workdir` tree into the snapshot, then "ready" ("failed" when a
        failure of `snapshot_capture` is planned). Parks at `snapshot_capture` first:
        a stall keeps the snapshot "pending"."""
        failure = self._faults.take("snapshot_capture")
        await self._faults.park("snapshot_capture")
        if self.snapshots.get(snap.id) is not snap:
            return  # deleted meanwhile
        if failure is not None:
            snap.record["status"] = "failed"
            return
        try:
            await asyncio.to_thread(_copy_files, self.workdir, snap.folder)
        except OSError:
            snap.record["status"] = "failed"
            return
        if self.snapshots.get(snap.id) is not snap:  # deleted while it was copied
            await asyncio.to_thread(discard_tree, snap.folder)
            return
        snap.record["status"] = "ready"

    async def _snapshot_get(self, request: web.Request) -> web.StreamResponse:
        """`GET /snapshots/{id}` (`Snapshot.get`): the record, 404 when unknown."""
        early = await self._control(request, "snapshot_get")
        if early is not None:
            return early
        snap = self.snapshots.get(request.match_info["id"])
        if snap is None:
            return self._snapshot_not_found("snapshot_get", request.match_info["id"])
        return web.json_response(snap.record)

    async def _snapshot_list(self, request: web.Request) -> web.StreamResponse:
        """`GET /sandboxes/{name}/snapshots` (`SandboxSnapshots.list`): a bare array."""
        early = await self._control(request, "snapshot_get")
        if early is not None:
            return early
        name = request.match_info["name"]
        if name not in self.sandboxes:
            return self._error("snapshot_get", 404, "WORKLOAD_NOT_FOUND", "Sandbox not found")
        found = [s.record for s in self.snapshots.values() if s.record["sandboxName"] == name]
        return web.json_response(found)

    async def _snapshot_delete(self, request: web.Request) -> web.StreamResponse:
        """`DELETE /snapshots/{id}` (`Snapshot.delete`, workspace-wide) or
        `DELETE /sandboxes/{name}/snapshots/{id or name}`: 204, 404 when unknown; the
        files it kept go with it."""
        early = await self._control(request, "snapshot_delete")
        if early is not None:
            return early
        ident = request.match_info["id"]
        owner = request.match_info.get("name")
        snap = self.snapshots.get(ident)
        if owner is not None:
            mine = [s for s in self.snapshots.values() if s.record["sandboxName"] == owner]
            snap = next((s for s in mine if ident in (s.id, s.record["name"])), None)
        if snap is None:
            return self._snapshot_not_found("snapshot_delete", ident)
        del self.snapshots[snap.id]
        await asyncio.to_thread(discard_tree, snap.folder)
        return web.Response(status=204)

    async def _snapshot_fork(self, request: web.Request) -> web.StreamResponse:
        """`POST /snapshots/{id}/fork` (`Snapshot.fork`, `SandboxForkRequest`): a new
        sandbox named `targetName`, "DEPLOYING" until the snapshot's files are in its
        workdir (`_deploy_fork`), answered at once with `SandboxForkResponse`. 404 for an
        unknown snapshot, 409 for a name in use; a snapshot not yet "ready" is refused
        with 409 (an assumption: the public source does not say), a fork into an
        application with 400 (not modelled)."""
        early = await self._control(request, "snapshot_fork")
        if early is not None:
            return early
        snap = self.snapshots.get(request.match_info["id"])
        if snap is None:
            return self._snapshot_not_found("snapshot_fork", request.match_info["id"])
        body = await request.json() if request.body_exists else {}
        target = str((body or {}).get("targetName") or "")
        kind = str((body or {}).get("targetType") or "sandbox")
        if not target or kind != "sandbox":
            return self._error("snapshot_fork", 400, "BAD_REQUEST", "a sandbox target needed")
        if snap.record["status"] != "ready":
            return self._error("snapshot_fork", 409, "CONFLICT", f"snapshot {snap.id} not ready")
        if target in self.sandboxes:
            return self._error(
                "snapshot_fork", 409, "SANDBOX_ALREADY_EXISTS", f"{target} already exists"
            )
        carried = snap.record.get("spec") or {}
        runtime = {key: carried[key] for key in ("image", "memory") if key in carried}
        spec: dict[str, Any] = {"runtime": runtime}
        if "region" in carried:
            spec["region"] = carried["region"]
        metadata = {"name": target, "url": self.sandbox_url(target), "workspace": self.workspace}
        record = {"metadata": metadata, "spec": spec, "status": "DEPLOYING", "events": []}
        self.terminated.pop(target, None)
        box = self.sandboxes[target] = FakeSandbox(target, record)
        self._in_background(self._deploy_fork(box, snap), f"blaxel-fork-{target}")
        await self._faults.park("snapshot_fork", after=True)  # made, the answer held
        return web.json_response({"name": target, "snapshotId": snap.id, "type": "sandbox"})

    async def _deploy_fork(self, box: FakeSandbox, snap: FakeSnapshot) -> None:
        """Put the snapshot's files in the workdir (replacing what it held), then
        "DEPLOYED" ("FAILED" when a failure of `fork_deploy` is planned). Parks at
        `fork_deploy` first: a stall keeps the sandbox "DEPLOYING"."""
        failure = self._faults.take("fork_deploy")
        await self._faults.park("fork_deploy")
        if self.sandboxes.get(box.name) is not box:
            return  # deleted meanwhile
        if failure is not None:
            box.record["status"] = "FAILED"
            return
        if self.workdir is not None:
            try:
                await asyncio.to_thread(_restore_files, snap.folder, self.workdir)
            except OSError:
                box.record["status"] = "FAILED"
                return
            if self.sandboxes.get(box.name) is not box and not self.sandboxes:
                await asyncio.to_thread(discard_tree, self.workdir)
                return
        box.record["status"] = "DEPLOYED"

    # ---- processes ----------------------------------------------------------------------

    def _environment(self, box: FakeSandbox, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = dict(os.environ)
        env[RUNNER_DIR_ENV] = box.runner_dir
        env[BOX_MARK_ENV] = box.mark
        self._marks.add(box.mark)
        self._runner_dirs.add(box.runner_dir)
        if extra:
            env.update({str(k): str(v) for k, v in extra.items()})
        return env

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        box, early = await self._data_plane(request, "exec")
        if early is not None or box is None:
            return early or self._not_found("exec")
        body = await request.json()
        command = body.get("command")
        if not isinstance(command, str) or not command:
            return web.json_response({"error": "command is required"}, status=400)
        self._counter += 1
        name = body.get("name") or f"proc-{self._counter}"
        old = box.processes.get(name)
        if old is not None and not old.done.is_set():
            return web.json_response({"error": f"process {name} is running"}, status=400)
        cwd = body.get("workingDir") or body.get("working_dir") or self.root
        if not await asyncio.to_thread(os.path.isdir, cwd):
            return web.json_response({"error": f"no such directory: {cwd}"}, status=400)
        record = _Process(name=name, command=command, working_dir=cwd)
        box.processes[name] = record
        try:
            record.proc = LocalProcess.spawn(
                ["sh", "-c", command],
                tty=False,
                env=self._environment(box, body.get("env")),
                cwd=cwd,
                on_stdout=record.add_stdout,
                on_stderr=record.add_stderr,
                on_exit=lambda code: record.finish(self._exit_code(record, code)),
            )
        except OSError as exc:
            del box.processes[name]
            return web.json_response({"error": f"cannot start: {exc}"}, status=500)
        if not (body.get("waitForCompletion") or body.get("wait_for_completion")):
            return web.json_response(record.to_json())
        # Faults of "exec_wait" hit a started process (e.g. the edge's 504 on a silent
        # wait, while the command keeps running).
        early = await self._gate("exec_wait", request)
        if early is not None:
            return early
        timeout = body.get("timeout")
        limit = timeout if isinstance(timeout, int) and timeout > 0 else None
        cut = self.edge_cut_s
        hold = min((t for t in (limit, cut) if t is not None), default=None)
        try:
            async with asyncio.timeout(hold):
                await record.done.wait()
        except TimeoutError:
            if limit is None or (cut is not None and cut < limit):
                return self._edge_cut("exec_wait")
            if self.timeout_status == 408:  # the older stand-in's answer
                record.status = "killed"
                await record.proc.terminate(0)
                return web.json_response(
                    {"error": f"process {name} timed out after {timeout}s", **record.to_json()},
                    status=408,
                )
            # handler/process/service.go: the wait ends, the process keeps running, and
            # HandleExecuteCommand answers the error with 422.
            return web.json_response(
                {"error": f"process timed out after {limit} seconds"}, status=422
            )
        await self._settle_output(record)
        return web.json_response(record.to_json())

    def _edge_cut(self, endpoint: str) -> web.Response:
        """The edge's answer to a request that stayed silent for `edge_cut_s` (the SDK
        documents it in `SandboxProcess.exec`): a gateway 504; the command goes on."""
        return self._error(endpoint, 504, "UPSTREAM_TIMEOUT", "the upstream did not answer in time")

    def _exit_code(self, record: _Process, code: int) -> int:
        """The exit code the real server reports: Go's `ExitError.ExitCode()` is -1 for
        a process killed by a signal (`handler/process/process.go`), which the local
        status (128+N) does not tell apart from an exit, so the zombie is asked."""
        proc = record.proc
        if not self.go_exit_codes or proc is None:
            return code
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return code
        if info is not None and info.si_code != os.CLD_EXITED:
            return -1
        return code

    async def _settle_output(self, record: _Process) -> None:
        proc = record.proc
        if proc is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.05):
                await proc.wait_eof()
        proc.drain_now()

    def _find(self, box: FakeSandbox, ident: str) -> _Process | None:
        record = box.processes.get(ident)
        if record is not None:
            return record
        for candidate in box.processes.values():
            if candidate.proc is not None and str(candidate.proc.pid) == ident:
                return candidate
        return None

    async def _process_get(self, request: web.Request) -> web.StreamResponse:
        box, early = await self._data_plane(request, "process_get")
        if early is not None or box is None:
            return early or self._not_found("process_get")
        record = self._find(box, request.match_info["id"])
        if record is None:
            return web.json_response({"error": "process not found"}, status=404)
        if record.done.is_set():
            await self._settle_output(record)
        return web.json_response(record.to_json(GET_OUTPUT_TAIL))

    async def _process_wait(self, request: web.Request) -> web.StreamResponse:
        if not self.wait_endpoint:
            # gin's answer to an unknown route: the SDK then polls GET /process/{id}.
            self._record(request)
            return web.Response(text="404 page not found", status=404)
        box, early = await self._data_plane(request, "process_wait")
        if early is not None or box is None:
            return early or self._not_found("process_wait")
        record = self._find(box, request.match_info["id"])
        if record is None:
            return web.json_response({"error": "process not found"}, status=404)
        try:
            hold = float(request.query.get("timeout", "30"))
        except ValueError:
            hold = 30.0
        cut = self.edge_cut_s
        try:
            async with asyncio.timeout(hold if cut is None else min(hold, cut)):
                await record.done.wait()
        except TimeoutError:
            if cut is not None and cut < hold:
                return self._edge_cut("process_wait")
        if record.done.is_set():
            await self._settle_output(record)
        return web.json_response(record.to_json())

    async def _process_logs(self, request: web.Request) -> web.StreamResponse:
        box, early = await self._data_plane(request, "process_logs")
        if early is not None or box is None:
            return early or self._not_found("process_logs")
        record = self._find(box, request.match_info["id"])
        if record is None:
            return web.json_response({"error": "process not found"}, status=404)
        state = record.to_json()
        return web.json_response(
            {"logs": state["logs"], "stdout": state["stdout"], "stderr": state["stderr"]}
        )

    async def _kill(self, request: web.Request) -> web.StreamResponse:
        box, early = await self._data_plane(request, "kill")
        if early is not None or box is None:
            return early or self._not_found("kill")
        record = self._find(box, request.match_info["id"])
        if record is None or record.done.is_set() or record.proc is None:
            return web.json_response({"error": "process not found or not running"}, status=404)
        record.status = "killed" if request.path.endswith("/kill") else "stopped"
        await record.proc.terminate(0 if request.path.endswith("/kill") else 1.0)
        return web.json_response({"message": f"process {record.name} {record.status}"})

    # ---- files ----------------------------------------------------------------------------

    def _path(self, request: web.Request) -> str:
        """The file a filesystem call names, resolved as the sandbox API does: gin's
        `*path` keeps its leading "/", which is stripped (a relative path) unless the raw
        URL holds "%2F" (`handler/filesystem.go` `extractPathFromRequest`); then a
        relative path is joined to the working directory and the result cleaned
        lexically, `..` climbing anywhere (`filesystem.go` `GetAbsolutePath`: only
        "outside the root" is refused, and the root is "/")."""
        path = request.match_info["path"]
        if "%2F" in request.raw_path:
            path = "/" + path
        elif not path:
            path = "."
        if not path.startswith("/"):
            path = posixpath.join(self.root, path)
        return "/" + posixpath.normpath(path).lstrip("/")

    async def _read(self, request: web.Request) -> web.StreamResponse:
        """As the sandbox API: a directory (symlinks followed) answers its JSON listing
        whatever was asked; a file its bytes with `Accept: application/octet-stream`,
        else a JSON FileWithContent. A FIFO or device is opened and waited on forever
        (here without holding a thread: the client's timeout ends it)."""
        box, early = await self._data_plane(request, "read")
        if early is not None or box is None:
            return early or self._not_found("read")
        path = self._path(request)
        try:
            listing = await asyncio.to_thread(_listing, path)
        except FileNotFoundError:
            return web.json_response({"error": f"file not found: {path}"}, status=404)
        except OSError as exc:
            return web.json_response({"error": f"stat {path}: {exc.strerror}"}, status=500)
        if listing is not None:
            return web.json_response(listing)
        await wait_forever_on_special_file(path)
        try:
            data = await asyncio.to_thread(_read_bytes, path)
        except FileNotFoundError:
            return web.json_response({"error": f"file not found: {path}"}, status=404)
        except PermissionError:
            return web.json_response({"error": f"permission denied: {path}"}, status=403)
        if "application/octet-stream" in request.headers.get("Accept", ""):
            return web.Response(body=data, content_type="application/octet-stream")
        entry = await asyncio.to_thread(_file_entry, path, os.stat)
        entry["content"] = data.decode("utf-8", "replace")
        return web.json_response(entry)

    async def _write(self, request: web.Request) -> web.StreamResponse:
        endpoint = "mkdir" if request.content_type == "application/json" else "write"
        if endpoint == "mkdir":
            body = await request.json()
            if not body.get("isDirectory") and "content" in body:
                endpoint = "write"
        else:
            body = None
        box, early = await self._data_plane(request, endpoint)
        if early is not None or box is None:
            return early or self._not_found(endpoint)
        path = self._path(request)
        try:
            if body is not None and body.get("isDirectory"):
                await asyncio.to_thread(os.makedirs, path, exist_ok=True)
                return web.json_response({"message": "Directory created", "path": path})
            if body is not None:
                data = str(body.get("content", "")).encode()
            else:
                data = await self._multipart_file(request)
            await wait_forever_on_special_file(path)  # the API's open would block
            await asyncio.to_thread(_write_bytes, path, data)
        except PermissionError:
            return web.json_response({"error": f"permission denied: {path}"}, status=403)
        except OSError as exc:
            # A directory there, or a parent that is a file: the API's 422.
            return web.json_response(
                {"error": f"error writing file: {path}: {exc.strerror}"}, status=422
            )
        return web.json_response({"message": "File created", "path": path})

    async def _multipart_file(self, request: web.Request) -> bytes:
        reader = await request.multipart()
        data = b""
        while True:
            part = await reader.next()
            if part is None:
                return data
            if getattr(part, "name", None) == "file":
                data = bytes(await part.read())  # type: ignore[union-attr]

    async def _mp_initiate(self, request: web.Request) -> web.StreamResponse:
        box, early = await self._data_plane(request, "write")
        if early is not None or box is None:
            return early or self._not_found("write")
        upload = secrets.token_hex(8)
        self._uploads[upload] = {}
        self._upload_paths[upload] = self._path(request)
        return web.json_response({"uploadId": upload, "path": self._upload_paths[upload]})

    async def _mp_part(self, request: web.Request) -> web.StreamResponse:
        box, early = await self._data_plane(request, "write")
        if early is not None or box is None:
            return early or self._not_found("write")
        parts = self._uploads.get(request.match_info["upload"])
        if parts is None:
            return web.json_response({"error": "unknown upload"}, status=404)
        number = int(request.query.get("partNumber", "0"))
        parts[number] = await self._multipart_file(request)
        return web.json_response({"partNumber": number, "etag": secrets.token_hex(8)})

    async def _mp_complete(self, request: web.Request) -> web.StreamResponse:
        box, early = await self._data_plane(request, "write")
        if early is not None or box is None:
            return early or self._not_found("write")
        upload = request.match_info["upload"]
        parts = self._uploads.pop(upload, None)
        path = self._upload_paths.pop(upload, None)
        if parts is None or path is None:
            return web.json_response({"error": "unknown upload"}, status=404)
        data = b"".join(parts[n] for n in sorted(parts))
        await asyncio.to_thread(_write_bytes, path, data)
        return web.json_response({"message": "File created", "path": path})

    async def _mp_abort(self, request: web.Request) -> web.StreamResponse:
        self._record(request)
        upload = request.match_info["upload"]
        self._uploads.pop(upload, None)
        self._upload_paths.pop(upload, None)
        return web.json_response({"message": "aborted"})

    # ---- the terminal ---------------------------------------------------------------------

    async def _terminal(self, request: web.Request) -> web.StreamResponse:
        """`HandleTerminalWS` (handler/terminal.go): the upgrade, then the session of
        `sessionId` (default "default"): a live one is reattached (and resized to this
        client's size), else a new one is made with `shell` (default: the server's
        shell); a shell that cannot start answers an `error` frame and closes. The
        ring of the session is replayed first, as one `output` frame prefixed with
        `ANSI_RESET`; a client leaving only unsubscribes (the session lingers)."""
        self._record(request)
        query = request.query
        self.terminals.append(dict(query))
        box = self._sandbox(request)
        if box is None:
            return self._not_found("terminal")
        if query.get("token") != self.api_key:
            return self._unauthorized("terminal")
        early = await self._gate("terminal", request)
        if early is not None:
            return early
        try:
            cols = int(query.get("cols", "80"))
            rows = int(query.get("rows", "24"))
        except ValueError:
            return web.json_response({"error": "bad terminal size"}, status=400)
        ws = web.WebSocketResponse(max_msg_size=16 * 1024 * 1024, autoping=True)
        await ws.prepare(request)
        if request.transport is None or request.transport.is_closing():
            return ws  # the client left before the upgrade completed: no session
        session_id = query.get("sessionId") or "default"
        session = box.term_sessions.get(session_id)
        fresh = session is None or session.dead
        if fresh:
            session, failure = await self._new_terminal_session(
                box, session_id, query.get("shell") or None, query.get("workingDir"), rows, cols
            )
            if session is None:
                await ws.send_str(json.dumps({"type": "error", "data": failure}))
                await ws.close()
                return ws
        assert session is not None
        if not fresh and cols > 0 and rows > 0 and session.proc is not None:
            session.proc.resize(rows, cols)
        term = _Terminal(
            ws=ws, transport=request.transport, session=session, drop_after=self._drop_after
        )
        self._terminal_sent.append(term.sent)
        session.conns.add(term)
        box.terminals.add(term)
        self._serving += 1
        try:
            if session.ring:
                await self._replay(term, bytes(session.ring))
            await self._serve(term)
        except* TerminalFault:
            # A failure inside the server ends its terminal (as a crash of the handler
            # would): the session is closed, everything in it killed.
            await self._close_session(box, session)
        except* ConnectionError:
            pass  # the client went away: the session lingers
        finally:
            self._serving -= 1
            self._unsubscribe(box, term)
            if not ws.closed:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await ws.close()
        return ws

    async def _new_terminal_session(
        self,
        box: FakeSandbox,
        session_id: str,
        shell: str | None,
        working_dir: str | None,
        rows: int,
        cols: int,
    ) -> tuple[_TerminalSession | None, str]:
        """`GetOrCreate`'s create (`NewTerminalSession`, handler/terminal/terminal.go):
        `exec.Command(shell)` with no arguments; a shell that cannot be started is the
        error text Go gives, and the session is not made (a dead one of the same id
        stays as it was)."""
        argv = self.shell if shell is None else [shell]
        if shell is not None:
            found = shell if "/" in shell else shutil.which(shell)
            if found is None:
                return None, f'exec: "{shell}": executable file not found in $PATH'
            if not await asyncio.to_thread(_executable, found):
                return None, f"fork/exec {shell}: no such file or directory"
        cwd = working_dir or self.root
        if not await asyncio.to_thread(os.path.isdir, cwd):
            cwd = self.root  # the shell starts in its default directory, like a real one
        loop = asyncio.get_running_loop()
        session = _TerminalSession(id=session_id, last_activity=loop.time())
        env = self._environment(box, {"TERM": "xterm-256color", "PS1": r"\u@sandbox:\w\$ "})
        try:
            session.proc = LocalProcess.spawn(
                argv,
                tty=True,
                env=env,
                cwd=cwd,
                rows=rows,
                cols=cols,
                on_stdout=lambda data: self._on_shell_output(session, data),
                on_exit=lambda _code: self._on_shell_exit(session),
                on_eof=lambda: self._on_shell_eof(session),
            )
        except OSError as exc:
            return None, f"fork/exec {argv[0]}: {exc.strerror or exc}"
        old = box.term_sessions.get(session_id)
        if old is not None:
            await self._release_session(old)
        box.term_sessions[session_id] = session
        return session, ""

    async def _replay(self, term: _Terminal, ring: bytes) -> None:
        """The ring, as ONE `output` frame after `ANSI_RESET` (`GetBuffer`, then
        `conn.WriteJSON` in `HandleTerminalWS`): one conversion of the whole ring."""
        await self._faults.park("terminal_output")  # a stalled output holds the replay too
        data = ANSI_RESET + ring
        text = go_terminal_text(data) if self.go_utf8 else data.decode("utf-8", "replace")
        term.sent.append(text)
        await self._send_output(term, text)

    def _unsubscribe(self, box: FakeSandbox, term: _Terminal) -> None:
        """`Unsubscribe`: the connection leaves its session, which records the activity
        and lingers (finally-safe: no await)."""
        term.closed = True
        box.terminals.discard(term)
        session = term.session
        if session is None:
            return
        session.conns.discard(term)
        session.last_activity = asyncio.get_running_loop().time()
        self._resume(session)
        term.wake.set()

    async def _serve(self, term: _Terminal) -> None:
        """Both directions of one terminal, side by side: client messages are read until
        the socket closes while the output is pumped. A branch that fails cancels the
        other, and both are awaited before the error propagates (a TaskGroup); the end
        of the input ends the pump."""
        async with asyncio.TaskGroup() as group:
            pump = group.create_task(self._pump_output(term), name="blaxel-server-pump")
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)
            await self._read_input(term)
            pump.cancel()

    def _on_shell_output(self, session: _TerminalSession, data: bytes) -> None:
        """`readLoop`: each read goes to the ring (`appendBuffer`, which also records
        the activity) and to every connection subscribed now."""
        if session.dead:
            return  # the real server closed the PTY when the shell exited
        _append_ring(session.ring, data)
        session.last_activity = asyncio.get_running_loop().time()
        for term in session.conns:
            term.buffer.extend(data)
            term.wake.set()
        proc = session.proc
        if (
            any(len(t.buffer) > _OUTPUT_HIGH_WATER for t in session.conns)
            and not session.paused
            and proc is not None
            and proc.master_fd is not None
        ):
            # Backpressure: stop reading the PTY until the client took the output.
            asyncio.get_running_loop().remove_reader(proc.master_fd)
            session.paused = True

    def _resume(self, session: _TerminalSession) -> None:
        proc = session.proc
        if (
            session.paused
            and proc is not None
            and proc.master_fd is not None
            and not session.exited
            and all(len(t.buffer) <= _OUTPUT_HIGH_WATER for t in session.conns)
        ):
            session.paused = False
            asyncio.get_running_loop().add_reader(proc.master_fd, proc.drain_now)

    def _on_shell_exit(self, session: _TerminalSession) -> None:
        """As `watchShellExit` (handler/terminal/session_manager.go): the shell's exit
        closes the session at once, killing every process of it; output still unread
        then is lost. The WebSockets are left open (see `_read_input`)."""
        proc = session.proc
        if proc is not None and not session.paused:
            proc.drain_now()
        session.exited = True
        if proc is not None and proc.pid > 0:
            _kill_session(proc.pid)
        session.dead = True
        session.eof = True
        for term in session.conns:
            term.wake.set()

    def _on_shell_eof(self, session: _TerminalSession) -> None:
        session.eof = True
        for term in session.conns:
            term.wake.set()

    async def _pump_output(self, term: _Terminal) -> None:
        """Send the shell's output as quirky frames, one PTY read (`read_size` bytes at
        most) at a time. When the shell has exited: no exit message, and the socket
        stays open (`close_terminal_on_exit=True`: it closes)."""
        session = term.session
        assert session is not None
        while True:
            await term.wake.wait()
            term.wake.clear()
            self._fault("output")
            await self._faults.park("terminal_output")
            chunk = bytes(term.buffer)
            term.buffer.clear()
            self._resume(session)
            final = session.eof and not term.buffer
            for text in self._reads_as_text(term, chunk, final):
                term.sent.append(text)
                for at in range(0, len(text), self.output_frame_chars):
                    await self._send_output(term, text[at : at + self.output_frame_chars])
            if final:
                if self.close_terminal_on_exit:
                    await term.ws.close()
                return

    def _reads_as_text(self, term: _Terminal, chunk: bytes, final: bool) -> list[str]:
        """`chunk` as the texts the server sends: with `go_utf8`, one per 4096-byte read,
        each converted on its own (a character split between reads becomes U+FFFDs)."""
        if not self.go_utf8:
            text = term.decoder.decode(chunk, final=final)
            return [text] if text else []
        size = self.read_size
        return [go_terminal_text(chunk[at : at + size]) for at in range(0, len(chunk), size)]

    async def _send_output(self, term: _Terminal, text: str) -> None:
        n = term.frames
        term.frames += 1
        if self.quirks and n % 5 == 3:
            garbage = GARBAGE_FRAMES[(n // 5) % len(GARBAGE_FRAMES)]
            if isinstance(garbage, bytes):
                await term.ws.send_bytes(garbage)
            else:
                await term.ws.send_str(garbage)
        keys = ("Type", "Data") if self.quirks and n % 2 == 1 else ("type", "data")
        payload = json.dumps({keys[0]: "output", keys[1]: text})
        if self.quirks and n % 3 == 2:
            await term.ws.send_bytes(payload.encode())
        else:
            await term.ws.send_str(payload)
        if term.drop_after is not None and term.frames >= term.drop_after:
            if term.transport is not None:
                term.transport.abort()

    async def _read_input(self, term: _Terminal) -> None:
        async for msg in term.ws:
            if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                continue
            self._fault("input")
            if self._faults.gates_at("terminal_input"):
                # Stop reading the socket itself, so the client's writes back up.
                if term.transport is not None:
                    with contextlib.suppress(AttributeError, RuntimeError):
                        term.transport.pause_reading()
                try:
                    await self._faults.park("terminal_input")
                finally:  # released, or cancelled because the pump failed
                    if term.transport is not None:
                        with contextlib.suppress(AttributeError, RuntimeError):
                            term.transport.resume_reading()
            await self._on_input(term, msg.data)
            if term.dead and not self.close_terminal_on_exit:
                # handler/terminal.go checks whether the session ended only between
                # client messages: the first one after the shell's exit closes it.
                await term.ws.close()
                return

    async def _on_input(self, term: _Terminal, payload: str | bytes) -> None:
        """One client message: `input` goes to the PTY, `resize` resizes it (both
        sizes positive), anything else is ignored, as `HandleTerminalWS` does."""
        try:
            text = payload if isinstance(payload, str) else payload.decode()
            frame = json.loads(text)
            kind = frame.get("type")
            data = frame.get("data")
        except (ValueError, AttributeError, UnicodeDecodeError):
            if not self.terminal_resize:  # the older stand-in answered with an error
                await term.ws.send_str(json.dumps({"type": "error", "data": "invalid message"}))
            return
        session = term.session
        proc = None if session is None else session.proc
        if kind == "resize" and self.terminal_resize:
            cols, rows = frame.get("cols"), frame.get("rows")
            sizes = (cols, rows)
            if all(isinstance(n, int) and not isinstance(n, bool) for n in sizes) and (
                0 < cols < 65536 and 0 < rows < 65536
            ):
                if proc is not None and not term.dead:
                    proc.resize(rows, cols)
                self.resizes.append((rows, cols))
            return
        if kind != "input" or not isinstance(data, str):
            if not self.terminal_resize:
                await term.ws.send_str(
                    json.dumps({"type": "error", "data": f"unsupported message type {kind!r}"})
                )
            return
        self.inputs += 1
        if proc is None or term.exited:
            return
        with contextlib.suppress(Exception):
            await proc.write(data.encode("utf-8", "surrogateescape"))

    async def _close_session(self, box: FakeSandbox, session: _TerminalSession) -> None:
        """`SessionManager.Remove` / the cleanup's `Close`: kill the whole session, drop
        it from the sandbox, close its connections."""
        if box.term_sessions.get(session.id) is session:
            del box.term_sessions[session.id]
        for term in list(session.conns):
            term.wake.set()
        await self._release_session(session)
        for term in list(session.conns):
            if not term.ws.closed:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await term.ws.close()

    async def _release_session(self, session: _TerminalSession) -> None:
        """Kill the session's processes and release its PTY."""
        proc = session.proc
        session.dead = True
        session.eof = True
        if proc is not None:
            if proc.pid > 0 and not session.exited:
                _kill_session(proc.pid)
            await proc.terminate(0)
            # The real server kills the session by its id (`killSessionProcesses`):
            # what a dead shell left behind goes too.
            if proc.pid > 0:
                _kill_session(proc.pid)
        session.exited = True

    async def _cleanup_loop(self) -> None:
        """`cleanupLoop`: every `terminal_cleanup_s`, `cleanup_terminals()`."""
        while True:
            await asyncio.sleep(self.terminal_cleanup_s)
            await self.cleanup_terminals()

    async def cleanup_terminals(self, *, idle_s: float | None = None) -> int:
        """One pass of the server's cleanup (`SessionManager.cleanup`): a dead session
        without clients is dropped; one without clients for longer than `idle_s`
        (default `terminal_idle_s`, `sessionIdleTimeout`: 10 minutes) since its last
        activity is closed, killing what it runs. Returns how many went. A test passes
        `idle_s=0` to age every unattached session past the timeout at once."""
        limit = self.terminal_idle_s if idle_s is None else idle_s
        now = asyncio.get_running_loop().time()
        gone = 0
        for box in list(self.sandboxes.values()):
            for session in list(box.term_sessions.values()):
                if session.conns:
                    continue
                if session.dead or now - session.last_activity >= limit:
                    await self._close_session(box, session)
                    gone += 1
        return gone

    def terminal_sessions(self, name: str) -> dict[str, bool]:
        """The terminal sessions sandbox `name` keeps: id -> whether its shell runs."""
        box = self.sandboxes.get(name)
        if box is None:
            return {}
        return {sid: not s.exited for sid, s in box.term_sessions.items()}


def _executable(path: str) -> bool:
    return os.access(path, os.X_OK) and not os.path.isdir(path)


def _append_ring(ring: bytearray, data: bytes) -> None:
    """`appendBuffer`: keep at most `TERMINAL_RING_BYTES`, cutting the front at the
    first newline within 256 bytes past the excess (else at the excess)."""
    ring += data
    if len(ring) <= TERMINAL_RING_BYTES:
        return
    excess = len(ring) - TERMINAL_RING_BYTES
    cut = excess
    newline = ring.find(b"\n", excess, min(len(ring), excess + 256))
    if newline >= 0:
        cut = newline + 1
    del ring[:cut]


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _listing(path: str) -> dict[str, Any] | None:
    """A directory listing shaped like the sandbox API's (entries by lstat: a symlink is
    a file whose permissions carry Go's symlink bit), or None for a non-directory."""
    if not os.path.isdir(path):
        os.stat(path)  # raises for a missing path or one under a file
        return None
    files: list[dict[str, Any]] = []
    subdirectories: list[dict[str, str]] = []
    for name in sorted(os.listdir(path)):
        item = os.path.join(path, name)
        try:
            info = os.lstat(item)
        except FileNotFoundError:
            continue
        if stat_module.S_ISDIR(info.st_mode):
            subdirectories.append({"name": name, "path": item})
        else:
            files.append(_file_entry(item, os.lstat))
    return {
        "name": os.path.basename(path),
        "path": path,
        "files": files,
        "subdirectories": subdirectories,
    }


def _file_entry(path: str, stat_fn: Callable[[str], os.stat_result]) -> dict[str, Any]:
    """A File as the sandbox API sends it: `permissions` is Go's FileMode in octal."""
    info = stat_fn(path)
    return {
        "name": os.path.basename(path),
        "path": path,
        "permissions": f"{_go_file_mode(info.st_mode):o}",
        "size": info.st_size,
        "lastModified": _http_date(),
        "owner": str(info.st_uid),
        "group": str(info.st_gid),
    }


def _go_file_mode(mode: int) -> int:
    """Go's `os.FileMode` bits for an st_mode (type bits above the permissions)."""
    bits = stat_module.S_IMODE(mode)
    if stat_module.S_ISDIR(mode):
        bits |= 1 << 31
    elif stat_module.S_ISLNK(mode):
        bits |= 1 << 27
    elif stat_module.S_ISFIFO(mode):
        bits |= 1 << 25
    elif stat_module.S_ISSOCK(mode):
        bits |= 1 << 24
    elif stat_module.S_ISCHR(mode):
        bits |= (1 << 26) | (1 << 21)
    elif stat_module.S_ISBLK(mode):
        bits |= 1 << 26
    return bits


def _write_bytes(path: str, data: bytes) -> None:
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)


def _copy_files(source: str | None, target: str) -> None:
    """Copy a workdir tree as a snapshot keeps it: symlinks as links, modes and times
    kept, FIFOs made anew (never opened), sockets and devices left out. No source (or
    none there): an empty folder."""

    def copy(src: str, dst: str) -> None:
        info = os.lstat(src)
        if stat_module.S_ISFIFO(info.st_mode):
            os.mkfifo(dst, stat_module.S_IMODE(info.st_mode))
        elif stat_module.S_ISREG(info.st_mode):
            shutil.copy2(src, dst, follow_symlinks=False)

    if source is None or not os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
        return
    shutil.copytree(source, target, symlinks=True, copy_function=copy)


def _restore_files(folder: str, workdir: str) -> None:
    """Make `workdir` hold exactly the snapshot's files."""
    discard_tree(workdir)
    _copy_files(folder, workdir)


__all__ = [
    "ANSI_RESET",
    "BOX_MARK_ENV",
    "ENDPOINTS",
    "FLOOD_LIMIT",
    "GARBAGE_FRAMES",
    "GET_OUTPUT_TAIL",
    "OUTPUT_RETAIN",
    "PREVIEW_TOKEN_HEADER",
    "RUNNER_DIR_ENV",
    "TERMINAL_CLEANUP_S",
    "TERMINAL_IDLE_S",
    "TERMINAL_RING_BYTES",
    "BlaxelServer",
    "FakeSandbox",
    "FakeSnapshot",
    "FloodingPeer",
    "TerminalFault",
    "TricklingPeer",
    "go_terminal_text",
]
