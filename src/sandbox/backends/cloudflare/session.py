"""`CloudflareSession`: the hooks of the `cloudflare` backend, a user-deployed Cloudflare
Sandbox Worker (the bridge of cloudflare/sandbox-sdk) over HTTP and WebSocket.

The protocol lives beside this module: `client` (requests, control execs), `execs`
(one-shot commands), `terminal` (PTY sessions; `PtyHandle`, a process's handle, is a
`Process`: the base session's hooks write to it, resize, interrupt, drain and kill it),
`processes` (the spawn), `files`, `scripts`, `errors`, `sse`, `durable` (detach,
resume: a process's terminal session outlives the client), `runner_link` (the runner,
by option).
Every fact and its upstream source is in docs/providers.md, "Cloudflare".

- A one-shot command is a `WorkerExec` (`execs`): the base session times it out and
  kills it; the kill is a second exec of the toolkit's kill script, by tag.
- A PTY belongs to a bridge *session* and a session has one PTY (shared by every
  socket, its buffer replayed to each), so every process gets a session of its own,
  named by us before it is created (so a cancelled spawn can still delete it). The
  line typed into its shell first prints the shell's pid, so a terminate can kill the
  session's whole tree before it deletes the session.

The API key is held in a `Secret` whose repr hides it, provider text is redacted before
it reaches a message, and aiohttp exceptions (which carry request headers) are never
chained to the errors we raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ...backend import (
    BaseSandboxSession,
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    ShellFileOps,
    ShellWorkspace,
    check_seconds,
    kill_handle,
)
from ...errors import InvalidArgumentError, ProviderError, UnsupportedOperationError
from ..toolkit import (
    CommandCheck,
    LinkSink,
    RunnerChoice,
    RunnerProcess,
    RunnerReport,
    Secret,
    refuse_renamed,
    require_credential,
)
from . import durable as durable_cf
from . import processes, runner_link, sandboxes
from .client import SANDBOX_ID_RE, WorkerClient
from .errors import API_KEY_ENV, worker_text
from .execs import WorkerExec, exec_argv
from .files import CloudflareFiles, WorkerFiles
from .processes import spawn_terminal
from .runner_link import CloudflareRunner
from .terminal import PtyHandle
from .workspace import CloudflarePorts, CloudflareSnapshots

logger = logging.getLogger("sandbox.cloudflare")

WORKER_URL_ENV = "CLOUDFLARE_SANDBOX_WORKER_URL"


class CloudflareSession(RunnerReport, BaseSandboxSession[PtyHandle]):
    """Runs commands in a sandbox of a user-deployed Cloudflare Sandbox Worker.

    Options:

    - `worker_url`: the Worker's base URL (else `$CLOUDFLARE_SANDBOX_WORKER_URL`);
    - `api_key`: the Worker's bearer key (else `$CLOUDFLARE_SANDBOX_API_KEY`);
    - `sandbox_id`: attach to this existing sandbox instead of creating one;
    - `keep`: do not delete the sandbox on close (by default it is deleted, whether it
      was created or attached to);
    - `call_timeout_s` (default 60): limit for each plain HTTP request, as a whole;
    - `connect_timeout_s` (default 15): limit for opening a connection;
    - `ready_timeout_s` (default 30): limit for a terminal's WebSocket handshake and
      `ready` frame;
    - `heartbeat_s` (default 30): WebSocket ping interval, so a silently dead connection
      ends its process instead of hanging (None disables it);
    - `memory_limit_bytes`, `process_limit`, `cpu_limit`: not supported (the bridge's
      create takes no options): any value raises `UnsupportedOperationError`;
    - `runner` (default False): True runs every process and one-shot command through
      the runner (docs/runner.md, `runner_link`), reached over one terminal of its own;
      what it adds: byte-exact output, `stdin=True` on pipes ended by
      `pty_close_stdin`, whole-tree kills, and a resume that replays what a process
      printed meanwhile and the exit code of one that ended. Refused
      (`UnsupportedOperationError`) where this install has no runner for the sandbox's
      machine; None: the runner where there is one, else the bridge's terminals;

    plus the base session's options.
    """

    backend_name = "cloudflare"

    def __init__(
        self,
        *,
        worker_url: str | None = None,
        api_key: str | None = None,
        sandbox_id: str | None = None,
        keep: bool = False,
        call_timeout_s: float = 60.0,
        connect_timeout_s: float = 15.0,
        ready_timeout_s: float = 30.0,
        heartbeat_s: float | None = 30.0,
        memory_limit_bytes: int | None = None,
        process_limit: int | None = None,
        cpu_limit: float | None = None,
        runner: bool | None = False,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        if runner is not None and not isinstance(runner, bool):
            raise InvalidArgumentError(f"runner must be True, False or None, not {runner!r}")
        for name, value in (
            ("memory_limit_bytes", memory_limit_bytes),
            ("process_limit", process_limit),
            ("cpu_limit", cpu_limit),
        ):
            if value is not None:
                # routes.ts `POST /sandbox` reads no body: a sandbox's size is the
                # Worker's container `instance_type` (wrangler config), not per sandbox.
                raise UnsupportedOperationError(
                    f"the cloudflare backend cannot set {name}: the bridge's create takes "
                    "no options (the container's size is the Worker's instance_type)"
                )
        super().__init__(**options)
        url_text = require_credential(
            worker_url, WORKER_URL_ENV, backend="cloudflare", what="the Worker's URL (worker_url)"
        )
        key = Secret(
            require_credential(
                api_key, API_KEY_ENV, backend="cloudflare", what="the Worker's API key (api_key)"
            )
        )
        if sandbox_id is not None and (
            not isinstance(sandbox_id, str) or not SANDBOX_ID_RE.fullmatch(sandbox_id)
        ):
            # The bridge answers 400 for any other id (routes.ts): say so before asking.
            raise InvalidArgumentError(
                "sandbox_id must be 1 to 128 characters from a-z and 2-7 (the bridge's "
                "sandbox id format)"
            )
        for name, value in (
            ("call_timeout_s", call_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("ready_timeout_s", ready_timeout_s),
        ):
            check_seconds(name, value)
        check_seconds("heartbeat_s", heartbeat_s, allow_none=True)
        self._client = WorkerClient(
            url_text,
            key,
            request_timeout_s=float(call_timeout_s),
            connect_timeout_s=float(connect_timeout_s),
        )
        self._files = WorkerFiles(self._client)
        # Kept for a ref, which keeps it only when it is a bare origin (`durable`).
        self._worker_url = url_text
        # A resume refuses a ref made against another Worker unless the caller named one.
        self._worker_url_given = worker_url is not None
        self._requested_id = sandbox_id
        self.keep = bool(keep)
        self.call_timeout_s = float(call_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.ready_timeout_s = float(ready_timeout_s)
        self.heartbeat_s = heartbeat_s
        self._create_task: asyncio.Future[tuple[int, bytes]] | None = None
        # The link to the runner while the session has one; whether its processes go
        # through it (True once a start connected: `runner=None` may fall back).
        self._runner: CloudflareRunner | None = None
        self._runner_choice = RunnerChoice(runner)

    def __repr__(self) -> str:
        # The base's repr (backend, state, processes) plus where: never the key.
        client = self._client
        return f"{super().__repr__()[:-1]} worker={client.origin!r} sandbox={client.sandbox_id!r}>"

    @property
    def sandbox_id(self) -> str | None:
        """The id of the sandbox in use (after start)."""
        return self._client.sandbox_id

    def _redact(self, text: str) -> str:
        return worker_text(text, self._client.key)

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Attach (`GET .../running`) or create (`POST /v1/sandbox`, as our own task),
        then mark the container (a bridge session: `durable.mark`), so that a resume can
        tell it from a fresh one the bridge gives the same id."""
        if self._requested_id is not None:
            await self._attach_sandbox()
        else:
            await sandboxes.create(self)
        await durable_cf.mark(self)
        await self._start_runner()

    async def _start_runner(self) -> None:
        """Connect to the runner in the sandbox (delivered and started when needed) if
        the `runner` option asks for it (`runner_link.connect`)."""
        choice = self._runner_choice
        self._runner = await choice.decide(
            lambda: runner_link.connect(self._client, self._spawn_link, choice.asked),
            backend="cloudflare",
            where="sandbox",
        )

    async def _spawn_link(self, sink: LinkSink[PtyHandle]) -> None:
        """The runner link's terminal, spawned as any process's (`spawn_terminal`)."""
        await spawn_terminal(
            sink,
            self._client,
            keep=self.keep,
            ready_timeout_s=self.ready_timeout_s,
            heartbeat_s=self.heartbeat_s,
            redact=self._redact,
        )

    async def _attach_sandbox(self) -> None:
        """Open the client and check the requested sandbox runs (`sandboxes.attach`)."""
        assert self._requested_id is not None
        await sandboxes.attach(self._client, self._requested_id)

    async def _stop_backend(self) -> None:
        """End the runner's link (the runner lives on in a kept sandbox), delete the
        sandbox (unless kept; 404 is already gone), close the client."""
        runner, self._runner = self._runner, None
        try:
            await runner_link.shut_down(runner)
        finally:
            await self._release_sandbox()

    async def _release_sandbox(self) -> None:
        """Delete the sandbox (see `_stop_backend`), close the client."""
        client = self._client
        create, self._create_task = self._create_task, None
        if create is not None and client.sandbox_id is None:
            await asyncio.wait({create})
            if not create.cancelled() and create.exception() is None:
                with contextlib.suppress(ProviderError):
                    client.sandbox_id = sandboxes.created_id(create.result()[1])
        sandbox_id = client.sandbox_id
        try:
            if self.keep:
                await durable_cf.unmark(self)
            if client.http is not None and sandbox_id is not None and not self.keep:
                # Idempotence: forget the id first, so the delete is attempted only once.
                client.sandbox_id = None
                status, _ = await client.call(
                    "DELETE", client.url(sandbox_id), "delete the sandbox", accept=frozenset({404})
                )
                logger.debug("deleted cloudflare sandbox %s (HTTP %d)", sandbox_id, status)
        finally:
            await client.close()

    # ---- one-shot commands ---------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """One `exec` request under the toolkit's wrapper (see `execs`); started as a
        task the process owns, so nothing here can be cancelled half-way. With the
        runner: its one-shot, byte-exact (`processes.start_on_runner`)."""
        if self._runner is not None:
            return await processes.start_on_runner(self._runner, spec, capture)
        capture.check = CommandCheck.needed(spec, cwd=spec.cwd)
        self._client.session()  # closed: fail here, before a task exists
        return WorkerExec(self._client, exec_argv(spec, capture.check), capture).start()

    # ---- processes -----------------------------------------------------------------

    async def _spawn_process(self, entry: OutputSink[PtyHandle]) -> None:
        """A session of its own, its PTY socket, then the trapped command typed in
        (`processes.spawn_terminal`); the handle, a `PtyHandle`, is a `Process`. With
        the runner: its process, a `RunnerProcess` (`processes.spawn_on_runner`);
        without it `stdin=True` on pipes is refused before anything starts."""
        if self._runner is not None:
            await processes.spawn_on_runner(entry, self._runner)
            return
        processes.refuse_open_stdin(entry)
        await spawn_terminal(
            entry,
            self._client,
            keep=self.keep,
            ready_timeout_s=self.ready_timeout_s,
            heartbeat_s=self.heartbeat_s,
            redact=self._redact,
        )

    async def _close_stdin(self, entry: OutputSink[PtyHandle]) -> None:
        """EOF on the open stdin of a runner's process (`RunnerProcess.close_stdin`):
        overriding this lets `stdin=True` reach `_spawn_process`."""
        handle = entry.require_handle()
        if not isinstance(handle, RunnerProcess):
            raise UnsupportedOperationError("only a process through the runner has open stdin")
        await handle.close_stdin()

    async def _terminate_pty_entry(self, entry: OutputSink[PtyHandle]) -> None:
        """`PtyHandle.kill`: the session's tree killed and the session deleted, then the
        socket closed; only our side (socket, reader) when the sandbox's deletion right
        after (`entry.sandbox_stopping`, not kept) ends everything in it."""
        await kill_handle(entry)

    # ---- capabilities (`sandbox.backend.Capability`: each made with the session) ----

    _file_access = CloudflareFiles
    _workspace_access = ShellWorkspace
    _ports = CloudflarePorts
    _snapshots = CloudflareSnapshots
    _durability = durable_cf.CloudflareDurability

    # ---- what the capabilities use ---------------------------------------------------

    async def _shell_ops(self) -> ShellFileOps:
        """The shell file operations in this sandbox's workspace."""
        # Commands start in /workspace: the script finds it as ".".
        return ShellFileOps(self.exec, "/workspace", shell_root=".")
