"""`CloudflareSession`: the hooks of the `cloudflare` backend, a user-deployed Cloudflare
Sandbox Worker (the bridge of cloudflare/sandbox-sdk) over HTTP and WebSocket.

The protocol lives beside this module: `client` (requests, control execs), `execs`
(one-shot commands), `terminal` (PTY sessions; `PtyHandle`, a process's handle, is a
`Process`: the base session's hooks write to it, resize, interrupt, drain and kill it),
`processes` (the spawn), `files`, `scripts`, `errors`, `sse`, `durable` (detach,
resume: a process's terminal session outlives the client).
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
from ..toolkit import CommandCheck, Secret, refuse_renamed, require_credential
from . import durable as durable_cf
from .client import SANDBOX_ID_RE, WorkerClient
from .errors import API_KEY_ENV, json_object, worker_text
from .execs import WorkerExec, exec_argv
from .files import CloudflareFiles, WorkerFiles
from .processes import spawn_terminal
from .terminal import PtyHandle
from .workspace import CloudflarePorts, CloudflareSnapshots

logger = logging.getLogger("sandbox.cloudflare")

WORKER_URL_ENV = "CLOUDFLARE_SANDBOX_WORKER_URL"


def _created_id(body: bytes) -> str:
    """The new sandbox's id from the Worker's answer to a create."""
    sandbox_id = json_object(body.decode("utf-8", "replace")).get("id")
    if not isinstance(sandbox_id, str) or not sandbox_id:
        raise ProviderError(
            "could not create a sandbox: the Worker's answer has no id", retryable=False
        )
    return sandbox_id


class CloudflareSession(BaseSandboxSession[PtyHandle]):
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
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
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
            await self._create_sandbox()
        await durable_cf.mark(self)

    async def _attach_sandbox(self) -> None:
        """Open the client and check the requested sandbox runs."""
        client = self._client
        client.sandbox_id = None
        client.open()
        requested = self._requested_id
        assert requested is not None
        # The id is adopted only once the check succeeded: a failed attach must not make
        # the cleanup delete a sandbox we never held.
        _, body = await client.call(
            "GET", client.url(requested, "running"), "attach to the sandbox"
        )
        # The bridge answers 200 either way; `running` says whether the sandbox's
        # container answered a `true` exec.
        if json_object(body.decode("utf-8", "replace")).get("running") is not True:
            raise ProviderError(
                f"could not attach to the sandbox {requested!r}: it is not running "
                "(stopped, or no such sandbox)",
                retryable=False,
            )
        client.sandbox_id = requested

    async def _create_sandbox(self) -> None:
        """Open the client and create a sandbox."""
        client = self._client
        client.sandbox_id = None
        client.open()
        # The create runs as our own task: if this caller is cancelled after the Worker
        # made the sandbox, `_stop_backend` waits for the answer and deletes it.
        create = asyncio.ensure_future(
            client.call("POST", client.url(), "create a sandbox", json_body={})
        )
        self._create_task = create
        _, body = await asyncio.shield(create)
        self._create_task = None
        client.sandbox_id = _created_id(body)
        logger.debug("created cloudflare sandbox %s", client.sandbox_id)

    async def _stop_backend(self) -> None:
        """Delete the sandbox (unless kept; 404 is already gone), close the client."""
        client = self._client
        create, self._create_task = self._create_task, None
        if create is not None and client.sandbox_id is None:
            await asyncio.wait({create})
            if not create.cancelled() and create.exception() is None:
                with contextlib.suppress(ProviderError):
                    client.sandbox_id = _created_id(create.result()[1])
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
        task the process owns, so nothing here can be cancelled half-way."""
        capture.check = CommandCheck.needed(spec, cwd=spec.cwd)
        self._client.session()  # closed: fail here, before a task exists
        return WorkerExec(self._client, exec_argv(spec, capture.check), capture).start()

    # ---- processes -----------------------------------------------------------------

    async def _spawn_process(self, entry: OutputSink[PtyHandle]) -> None:
        """A session of its own, its PTY socket, then the trapped command typed in
        (`processes.spawn_terminal`); the handle, a `PtyHandle`, is a `Process`."""
        await spawn_terminal(
            entry,
            self._client,
            keep=self.keep,
            ready_timeout_s=self.ready_timeout_s,
            heartbeat_s=self.heartbeat_s,
            redact=self._redact,
        )

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
