"""`BlaxelSession`: the hooks only. The sandbox is created, or attached to, by name
through the SDK (`client`) and deleted on close unless `keep=True`; one-shot commands
are `process.exec` calls (`execs`); files go through the sandbox API (`files`); PTYs
use the sandbox's terminal WebSocket (`terminal`), each process's handle a `Terminal`
(`process`: a `Process`, so the session writes no write, resize, interrupt or drain
hook). With `runner=True` processes and one-shot commands go through the runner
instead (`runner_link`). Provider facts and their sources: docs/providers.md (Blaxel).
"""

from __future__ import annotations

import asyncio
import posixpath
import secrets
from collections.abc import Mapping
from typing import Any

from ...backend import (
    BaseSandboxSession,
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    ShellFileOps,
    ShellWorkspace,
    durable_session_id,
    kill_handle,
)
from ...errors import InvalidArgumentError, UnsupportedOperationError
from ..toolkit import (
    CommandCheck,
    RunnerChoice,
    RunnerReport,
    refuse_renamed,
    require_credential,
)
from . import bounds, limits, runner_link, workspace
from . import durable as durable_blaxel
from .client import SESSION_LABEL, BlaxelClient
from .execs import BlaxelOneShot, exec_request, start_on_runner
from .files import BlaxelFileAccess, BlaxelFiles
from .options import check_options
from .process import Terminal, spawn_on_runner
from .runner_link import BlaxelRunner
from .terminal import TerminalOptions
from .workspace import BlaxelPorts, BlaxelSnapshots

DEFAULT_WORKDIR = "/workspace"
API_KEY_ENV = "BL_API_KEY"
WORKSPACE_ENV = "BL_WORKSPACE"


class BlaxelSession(RunnerReport, BaseSandboxSession[Terminal]):
    """A Blaxel sandbox.

    Options:
    - `sandbox_id`: the name of the sandbox to create or attach to (default: a new
      `sandbox-<random>`); it is deleted on close unless `keep=True`;
    - `api_key` / `workspace`: credentials (default: `BL_API_KEY` / `BL_WORKSPACE`);
    - `api_url`: the control-plane API (default: the SDK's; point it at a
      `BlaxelServer` for provider-free tests);
    - `image`, `region`, `ttl`, `labels`, `create_timeout_s` (1-50 s):
      passed to the sandbox creation (the label `sandbox.session` is the library's: a
      created sandbox carries the durable session's id there, which a resume checks
      before it takes on deleting the sandbox; a fork from a snapshot carries none, so
      its ref resumes only with `keep=True`);
    - `memory_limit_bytes`: the sandbox's memory (a whole number of MiB: Blaxel's
      `memory` in MB); `cpu_limit` and `process_limit` raise `UnsupportedOperationError`
      (see `limits`);
    - `max_response_bytes` (default 32 MiB): bound on one API answer;
      `max_terminal_frame_bytes` (default 1 MiB): bound on one terminal message (see
      `bounds`; past either the call fails with a `ProviderError`);
    - `workdir`: the directory relative paths, `cwd`s and commands start in (created at
      start; default `/workspace`);
    - `snapshot`: the id of a Blaxel snapshot to fork the new sandbox from (what
      `snapshot()` made: `open_session("blaxel", snapshot=ref)` sets it, and the ref's
      workdir as the default one); the fork keeps the snapshot's image, memory and
      region, so `image`, `memory_limit_bytes`, `ttl` and `labels` are
      refused beside it (see `workspace`);
    - `call_timeout_s` (default 120): bound on each API call; `connect_timeout_s`
      (default 30): bound on a terminal handshake; `close_timeout_s` (default 2): bound
      on a WebSocket close; `heartbeat_s` (default 30): WebSocket ping interval, so a
      silently dead connection is noticed; `terminate_grace_s` (default 1): time between
      the polite signals and SIGKILL when a running process is terminated;
      `probe_interval_s` (default 5): after that long without a frame from a running
      process's terminal, it is probed, so a shell that died without reporting is
      found lost within about twice that;
    - `runner` (default False): True runs every process and one-shot command through
      the runner (docs/runner.md, `runner_link`): byte-exact output on terminals and
      pipes, open stdin (`stdin=True`), tree kills, replay after a resume; refused
      (`UnsupportedOperationError`) where this install has no runner for the sandbox's
      machine. None: the runner where there is one, else Blaxel's own terminals;
    - plus the base session's options.
    """

    backend_name = "blaxel"

    def __init__(
        self,
        *,
        sandbox_id: str | None = None,
        keep: bool = False,
        api_key: str | None = None,
        workspace: str | None = None,
        api_url: str | None = None,
        image: str | None = None,
        region: str | None = None,
        ttl: str | None = None,
        labels: Mapping[str, str] | None = None,
        create_timeout_s: int | None = None,
        workdir: str = DEFAULT_WORKDIR,
        snapshot: str | None = None,
        call_timeout_s: float = 120.0,
        connect_timeout_s: float = 30.0,
        close_timeout_s: float = 2.0,
        heartbeat_s: float | None = 30.0,
        terminate_grace_s: float = 1.0,
        probe_interval_s: float = 5.0,
        memory_limit_bytes: int | None = None,
        process_limit: int | None = None,
        cpu_limit: float | None = None,
        max_response_bytes: int = bounds.MAX_RESPONSE_BYTES,
        max_terminal_frame_bytes: int = bounds.MAX_TERMINAL_FRAME_BYTES,
        runner: bool | None = False,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        super().__init__(**options)
        key = require_credential(
            api_key, API_KEY_ENV, backend="blaxel", what="an API key (api_key)"
        )
        space = require_credential(
            workspace, WORKSPACE_ENV, backend="blaxel", what="a workspace (workspace)"
        )
        if not isinstance(workdir, str) or not workdir.startswith("/"):
            raise InvalidArgumentError("workdir must be an absolute path in the sandbox")
        labels = check_options(
            seconds={
                "call_timeout_s": call_timeout_s,
                "connect_timeout_s": connect_timeout_s,
                "close_timeout_s": close_timeout_s,
                "probe_interval_s": probe_interval_s,
            },
            heartbeat_s=heartbeat_s,
            terminate_grace_s=terminate_grace_s,
            texts={"sandbox_id": sandbox_id, "image": image, "region": region}
            | {"ttl": ttl, "snapshot": snapshot},
            snapshot=snapshot,
            not_with_snapshot={
                "image": image,
                "memory_limit_bytes": memory_limit_bytes,
                "ttl": ttl,
                "labels": labels,
            },
            labels=labels,
            create_timeout_s=create_timeout_s,
            sizes={
                "max_response_bytes": max_response_bytes,
                "max_terminal_frame_bytes": max_terminal_frame_bytes,
            },
            runner=runner,
        )
        memory = limits.memory_mib(
            memory_limit_bytes, process_limit=process_limit, cpu_limit=cpu_limit
        )
        self.sandbox_name = sandbox_id or f"sandbox-{secrets.token_hex(6)}"
        self.keep = keep
        self.workdir = posixpath.normpath(workdir)
        self.terminate_grace_s = terminate_grace_s
        self._terminal_options = TerminalOptions(
            connect_timeout_s=connect_timeout_s,
            close_timeout_s=close_timeout_s,
            heartbeat_s=heartbeat_s,
            probe_interval_s=probe_interval_s,
            terminate_grace_s=terminate_grace_s,
            max_frame_bytes=max_terminal_frame_bytes,
        )
        self._client = BlaxelClient(
            api_key=key,
            workspace=space,
            api_url=api_url,
            api_timeout_s=call_timeout_s,
            max_response_bytes=max_response_bytes,
        )
        self._files = BlaxelFiles(self._client, self.workdir)
        self._create_config: dict[str, Any] = {"name": self.sandbox_name}
        for option, value in (
            ("image", image),
            ("memory", memory),
            ("region", region),
            ("ttl", ttl),
            ("labels", dict(labels) if labels else None),
        ):
            if value is not None:
                self._create_config[option] = value
        self._create_timeout_s = create_timeout_s
        self._region = region
        self._snapshot_id = snapshot
        # The fork's creating call, as our own task: a cancelled start leaves it to
        # `_stop_backend`, which waits for it before deleting by name.
        self._fork_task: asyncio.Future[None] | None = None
        self._create_attempted = False
        self._deleted = False
        # Whether this session's start created the sandbox: the sandbox Blaxel answered
        # carries our label (a name that already existed is attached to, and does not).
        self._created = False
        # The link to the runner, while the session has one; whether this session runs its
        # processes through it (`runner=None` may fall back; a ref records it).
        self._runner: BlaxelRunner | None = None
        self._runner_choice = RunnerChoice(runner)

    def __repr__(self) -> str:
        # The base's repr (backend, state, processes) plus the sandbox: never the key.
        return f"{super().__repr__()[:-1]} sandbox={self.sandbox_name!r}>"

    def _cwd(self, cwd: str | None) -> str:
        return self.workdir if cwd is None else self._files.absolute(cwd)

    # ---- lifecycle -------------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Create (or attach to) the sandbox, then its working directory."""
        self._create_attempted = True
        self._deleted = False
        if self._snapshot_id is None:
            session_id = durable_session_id(self)
            config = dict(self._create_config)
            config["labels"] = {**(config.get("labels") or {}), SESSION_LABEL: session_id}
            await self._client.open(self.sandbox_name, config, self._create_timeout_s)
            self._created = self._client.labels().get(SESSION_LABEL) == session_id
        else:
            self._client.prepare()
            fork = workspace.fork(self._client, self.sandbox_name, self._snapshot_id, self._region)
            self._fork_task = asyncio.ensure_future(fork)
            await asyncio.shield(self._fork_task)
            self._fork_task = None
            seconds = self._create_timeout_s or workspace.FORK_READY_TIMEOUT_S
            await workspace.bind_when_deployed(self._client, self.sandbox_name, seconds)
        await self._files.mkdir(self.workdir)
        await self._start_runner()

    async def _start_runner(self) -> None:
        """Deliver and connect to the runner if the `runner` option asks for it
        (`runner_link.connect`)."""
        choice, client, terminal = self._runner_choice, self._client, self._terminal_options
        self._runner = await choice.decide(
            lambda: runner_link.connect(
                client, choice.asked, terminal, self.workdir, self.sandbox_name
            ),
            backend="blaxel",
            where="sandbox",
        )

    async def _stop_backend(self) -> None:
        """Close the runner's link, then delete the sandbox (unless kept; tolerating one
        never made), release clients. After a cancelled fork, its task is awaited first:
        the sandbox it made is then deleted by name."""
        runner, self._runner = self._runner, None
        await runner_link.shut_down(runner, self._release_sandbox)

    async def _release_sandbox(self) -> None:
        """The rest of `_stop_backend`, whatever became of the runner's link."""
        fork, self._fork_task = self._fork_task, None
        if fork is not None and not fork.done():
            await asyncio.wait([fork])
        try:
            if self._create_attempted and not self.keep and not self._deleted:
                await self._client.delete(self.sandbox_name)
                self._deleted = True
        finally:
            await self._client.close()

    # ---- one-shot commands -------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """One `process.exec` (see `execs`). A `cwd` (or `shell=False`) runs behind the
        command check, started in `workdir`, so a bad one is reported as everywhere.
        With the runner: its one-shot, byte-exact (`execs.start_on_runner`)."""
        if (runner := self._runner) is not None:
            env = runner.environment(spec.env, tty=False)
            return await start_on_runner(runner.client, spec, capture, env, self._cwd(spec.cwd))
        check = capture.check = CommandCheck.needed(spec, cwd=self._cwd(spec.cwd))
        argv = spec.argv if check is None else check.argv(spec.argv, announce=False)
        request = exec_request(argv, spec.env, self.workdir)
        return BlaxelOneShot(self._client, request, spec.display, capture).start()

    # ---- terminal processes ------------------------------------------------------------

    async def _spawn_process(self, entry: OutputSink[Terminal]) -> None:
        """Type the command into a new terminal, its handle a `Terminal` stored at once
        (`Terminal.start`; see `terminal`). With the runner: its process, a
        `RunnerProcess` (`process.spawn_on_runner`); without, no pipe stays open."""
        if (runner := self._runner) is not None:
            command, grace = entry.spec.command, self.terminate_grace_s
            env = runner.environment(command.env, tty=entry.spec.tty)
            return await spawn_on_runner(entry, runner.client, env, self._cwd(command.cwd), grace)
        if entry.spec.stdin:
            raise UnsupportedOperationError(runner_link.NO_OPEN_STDIN)
        term = Terminal(entry, self._client, self._terminal_options, keep=self.keep)
        entry.handle = term
        await term.start(self._cwd(entry.spec.command.cwd), self.workdir, self.sandbox_name)

    async def _terminate_pty_entry(self, entry: OutputSink[Terminal]) -> None:
        """`Terminal.kill`: the terminal's tagged session killed (unless the sandbox's
        deletion follows), then its reader stopped and its socket closed."""
        await kill_handle(entry)

    async def _close_stdin(self, entry: OutputSink[Terminal]) -> None:
        """End a runner's process's open stdin (`RunnerProcess.close_stdin`): only the
        runner keeps one open (overriding this lets `stdin=True` reach the spawn)."""
        await runner_link.close_stdin(entry.require_handle())

    # ---- capabilities (`sandbox.backend.Capability`: each made with the session) ----

    _file_access = BlaxelFileAccess
    _workspace_access = ShellWorkspace
    _ports = BlaxelPorts
    _snapshots = BlaxelSnapshots
    _durability = durable_blaxel.BlaxelDurability

    # ---- what the capabilities use ---------------------------------------------------

    async def _shell_ops(self) -> ShellFileOps:
        """The shell file operations in this sandbox's workspace."""
        return ShellFileOps(self.exec, self.workdir)
