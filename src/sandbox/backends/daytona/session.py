"""`DaytonaSession`: the lifecycle hooks only. Beside it, one idea per module: `client`
(the SDK client and sandbox: create or attach, prepare, delete, bounded calls),
`commands` (pipes and one-shot commands: one session command each, `PipeState` its
handle; or the runner's), `terminal` (PTY sessions with `ShellTrap`, `PtyState` their
handle), `handles` (the `Process` both handles are: the base session's hooks write,
resize, interrupt and kill through them), `files`, `scripts` (the `sh` beside a
command), `runner_link` (the runner, with `runner=True`: its link, start and stop) and
`errors` (the SDK's exceptions by the toolkit's policy).

Checked against daytona==0.226.1. What the SDK makes impossible, and what is done
instead, is in each module's docstring: session logs arrive as text (non-UTF-8 bytes on
pipes become U+FFFD), a PTY's signal death may come as Go's -1 with a reason, a PTY's
output is kept nowhere while no client is connected. With `runner=True` processes and
one-shot commands go through the runner instead (`runner_link`, docs/runner.md), which
lifts those three.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from daytona import AsyncDaytona

from ...backend import (
    BaseSandboxSession,
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    ShellFileOps,
    ShellWorkspace,
    check_env,
    check_seconds,
    check_str,
    durable_session_id,
    kill_handle,
)
from ...errors import InvalidArgumentError, UnsupportedOperationError
from ..toolkit import (
    RunnerChoice,
    RunnerProcess,
    RunnerReport,
    Secret,
    check_limits,
    refuse_renamed,
    require_credential,
)
from . import commands, runner_link, terminal
from . import durable as durable_daytona
from .client import SESSION_LABEL, ClientOptions, DaytonaClient
from .errors import API_KEY_ENV
from .files import DaytonaFiles
from .handles import DaytonaHandle
from .limits import create_resources
from .runner_link import DaytonaRunner
from .workspace import DaytonaPorts, DaytonaSnapshots


class DaytonaSession(RunnerReport, BaseSandboxSession[DaytonaHandle]):
    """Runs commands in a Daytona sandbox through the async SDK.

    Options:

    - `api_key`: the API key (default: the `DAYTONA_API_KEY` environment variable);
      `api_url`, `target`: passed to `DaytonaConfig` (the SDK falls back to
      `DAYTONA_API_URL` / `DAYTONA_TARGET`);
    - `sandbox_id`: attach to this existing sandbox (id or name) instead of creating one;
    - `keep`: leave the sandbox alive on close (default False: closing deletes it, be it
      created or attached, as the other cloud backends do). A start that fails or is
      cancelled deletes what it created and never an attached sandbox;
    - `snapshot`, `create_options` (extra `CreateSandboxFromSnapshotParams` fields, e.g.
      `{"auto_stop_interval": 30}`), `create_timeout_s`: how to create the sandbox (a
      created sandbox is labelled `sandbox.session` with the durable session's id, which
      a resume checks before it takes on deleting it: that label is not the caller's);
    - `image`: create from this image instead (`CreateSandboxFromImageParams`), which
      is what `memory_limit_bytes` (whole GiB) and `cpu_limit` (whole cores) need:
      Daytona takes resources only there; `process_limit` is refused (see `limits`);
    - `terminate_grace_s`: time between the polite signals and SIGKILL (default 1 s);
    - `teardown_timeout_s`: bound on each provider call made while tearing down, so a
      provider that stops answering cannot hang `pty_terminate` or `aclose` (default 30 s);
    - `call_timeout_s`: bound on each other provider call, over the whole call (a file
      transfer, a command's start, typed input; default 120 s; a create or start gets
      `create_timeout_s` plus this), so a provider that never answers, or trickles its
      answer, fails with a retryable `ProviderError`; output streams are not bounded;
    - `daytona_class`: the client class, default the SDK's `AsyncDaytona`. Tests pass
      `sandbox.testing.daytona_fake.FakeDaytona(...).AsyncDaytona`;
    - `runner` (default False): True runs processes and one-shot commands through the
      runner (docs/runner.md, `runner_link`): uploaded once through the files API
      (skipped when the file at its content-named path in `$SANDBOX_RUNNER_DIR`, else
      `$TMPDIR`, else /tmp, has the same sha256), started detached and reached by one
      session command, `connect --text`, whose input and logs carry its frames as
      base64 lines (the SDK hands both over as text). What it gains over the daemon's
      own processes: a reattached terminal replays what it printed while no client was
      connected (the daemon keeps no PTY output), pipe output is byte-exact (logs turn
      non-UTF-8 bytes into U+FFFD), `stdin=True` keeps a pipe's stdin open until
      `pty_close_stdin`, a kill ends the whole tree, and every process starts with
      exactly the sandbox's environment plus its own. Refused
      (`UnsupportedOperationError`) where this install has no runner for the sandbox's
      machine (`uname -m`); None: the runner where there is one, else the daemon's;
    - plus the base session's options.
    """

    backend_name = "daytona"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_url: str | None = None,
        target: str | None = None,
        sandbox_id: str | None = None,
        keep: bool = False,
        snapshot: str | None = None,
        create_options: Mapping[str, Any] | None = None,
        create_timeout_s: float = 120.0,
        terminate_grace_s: float = 1.0,
        teardown_timeout_s: float = 30.0,
        call_timeout_s: float = 120.0,
        daytona_class: Callable[..., Any] | None = None,
        image: str | None = None,
        memory_limit_bytes: int | None = None,
        process_limit: int | None = None,
        cpu_limit: float | None = None,
        runner: bool | None = False,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        super().__init__(**options)
        limits = check_limits(
            memory_limit_bytes=memory_limit_bytes, process_limit=process_limit, cpu_limit=cpu_limit
        )
        key = require_credential(
            api_key, API_KEY_ENV, backend="daytona", what="an API key (api_key)"
        )
        for name, value in (
            ("create_timeout_s", create_timeout_s),
            ("teardown_timeout_s", teardown_timeout_s),
            ("call_timeout_s", call_timeout_s),
        ):
            check_seconds(name, value)
        check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
        for name, text in (
            ("api_url", api_url),
            ("target", target),
            ("sandbox_id", sandbox_id),
            ("snapshot", snapshot),
            ("image", image),
        ):
            check_str(name, text)
        if runner is not None and not isinstance(runner, bool):
            raise InvalidArgumentError(f"runner must be True, False or None, not {runner!r}")
        if image is not None and snapshot is not None:
            raise InvalidArgumentError("give a snapshot or an image to create from, not both")
        resources = create_resources(limits, image=image, attach=sandbox_id is not None)
        if create_options is not None and not isinstance(create_options, Mapping):
            raise InvalidArgumentError("create_options must be a mapping of option names")
        # What reaches the sandbox's environment or its labels is checked like `env`.
        if create_options and "env_vars" in create_options:
            check_env(create_options["env_vars"], name="create_options['env_vars']")
        if create_options and "labels" in create_options:
            check_env(create_options["labels"], name="create_options['labels']", variables=False)
            if SESSION_LABEL in (create_options["labels"] or {}):
                raise InvalidArgumentError(
                    f"create_options['labels'][{SESSION_LABEL!r}] is the library's own mark of "
                    "the sandboxes it creates: choose another label"
                )
        self.keep = bool(keep)
        # Whether this session's start created the sandbox (a resume: its ref said so and
        # the sandbox's label confirmed it).
        self._created = False
        self.create_timeout_s = create_timeout_s
        self.terminate_grace_s = terminate_grace_s
        self.teardown_timeout_s = teardown_timeout_s
        # The link to the runner in the sandbox, while the session has one.
        self._runner: DaytonaRunner | None = None
        # Whether this session runs its processes through the runner: True once a start
        # connected to it (`runner=None` may fall back); before, whether it is asked for.
        self._runner_choice = RunnerChoice(runner)
        # A resume starts the runner only once the sandbox is known to be ours (`durable`).
        self._runner_deferred = False
        self._client = DaytonaClient(
            ClientOptions(
                api_key=Secret(key),
                api_url=api_url,
                target=target,
                attach_id=sandbox_id,
                keep=self.keep,
                snapshot=snapshot,
                image=image,
                resources=resources,
                create_options=dict(create_options or {}),
                create_timeout_s=create_timeout_s,
                teardown_timeout_s=teardown_timeout_s,
                daytona_class=daytona_class or AsyncDaytona,
                call_timeout_s=float(call_timeout_s),
            )
        )

    @property
    def sandbox_id(self) -> str | None:
        """The id of the sandbox (after start)."""
        return getattr(self._client.sandbox, "id", None)

    @property
    def workdir(self) -> str:
        """The sandbox's working directory: the default cwd and base of relative paths."""
        return self._client.workdir

    @property
    def _state_dir(self) -> str:
        """The private directory for pid files and long scripts (after start)."""
        return self._client.state_dir

    # ---- lifecycle ---------------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Create the sandbox (or attach to one), prepare it, then connect to the runner
        when the `runner` option asks for it (a resume: once the sandbox is checked)."""
        await self._client.start(durable_session_id(self))
        self._created = self._client.options.attach_id is None
        if not self._runner_deferred:
            await self._start_runner()

    async def _start_runner(self) -> None:
        """Connect to the runner in the sandbox (delivered and started when needed);
        `runner=None` keeps the daemon's processes where this install has no runner for
        the sandbox's machine (`runner_link.connect`)."""
        choice = self._runner_choice
        self._runner = await choice.decide(
            lambda: runner_link.connect(self._client, choice.asked),
            backend="daytona",
            where="sandbox",
        )

    async def _stop_backend(self) -> None:
        """Close the runner's link (the runner lives on in a kept sandbox; a deleted one
        ends it), then delete the sandbox unless kept and close the client (every call
        bounded; `runner_link.shut_down`)."""
        runner, self._runner = self._runner, None
        await runner_link.shut_down(runner, self._client)

    # ---- one-shot commands -------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """Start a one-shot command in its own session (see `commands.OneShotCommand`);
        a start that fails or is cancelled deletes what it made. With the runner: the
        runner's one-shot, stdout and stderr apart, byte-exact
        (`commands.start_oneshot_on_runner`)."""
        if self._runner is not None:
            return await commands.start_oneshot_on_runner(self._runner, self._client, spec, capture)
        return await commands.start_oneshot(self._client, spec, capture, self.terminate_grace_s)

    # ---- processes ---------------------------------------------------------------------

    async def _spawn_process(self, entry: OutputSink[DaytonaHandle]) -> None:
        """A PTY session for `tty=True` (`terminal.spawn`), a session command for pipes
        (`commands.spawn`); either handle is a `Process` the base hooks drive. Without
        the runner no pipe keeps its stdin open (`stdin=True` is refused here, before
        anything starts: `commands.refuse_open_stdin`). With the runner: the runner's
        process (`RunnerProcess`, `commands.spawn_on_runner`)."""
        runner, grace_s = self._runner, self.terminate_grace_s
        if runner is not None:
            return await commands.spawn_on_runner(runner, self._client, entry, grace_s)
        commands.refuse_open_stdin(entry)
        spawn = terminal.spawn if entry.tty else commands.spawn
        await spawn(self._client, entry, grace_s)

    async def _close_stdin(self, entry: OutputSink[DaytonaHandle]) -> None:
        """End the open stdin of a process on pipes: only a runner's process has one
        (`RunnerProcess.close_stdin`); overriding this is what lets `stdin=True` reach
        `_spawn_process`, which refuses it without the runner."""
        handle = entry.require_handle()
        if not isinstance(handle, RunnerProcess):
            raise UnsupportedOperationError(
                "the daytona backend cannot close the stdin of a process started without the runner"
            )
        await handle.close_stdin()

    async def _terminate_pty_entry(self, entry: OutputSink[DaytonaHandle]) -> None:
        """The handle's `kill` (`PtyState.kill`, `PipeState.kill`): when the sandbox's
        deletion comes next (`entry.sandbox_stopping`, and the close deletes it) only
        our side is released. A runner's process: its tree killed by the runner
        (`RunnerProcess.kill`)."""
        await kill_handle(entry)

    # ---- capabilities (`sandbox.backend.Capability`: each made with the session) ----

    _file_access = DaytonaFiles
    _workspace_access = ShellWorkspace
    _ports = DaytonaPorts
    _snapshots = DaytonaSnapshots
    _durability = durable_daytona.DaytonaDurability

    # ---- what the capabilities use ---------------------------------------------------

    async def _shell_ops(self) -> ShellFileOps:
        """The shell file operations in this sandbox's workspace."""
        return ShellFileOps(self.exec, self._client.workdir)
