"""`DaytonaSession`: the lifecycle hooks only. Beside it, one idea per module: `client`
(the SDK client and sandbox: create or attach, prepare, delete, bounded calls),
`commands` (pipes and one-shot commands: one session command each, `PipeState` its
handle), `terminal` (PTY sessions with `ShellTrap`, `PtyState` their handle), `handles`
(the `Process` both handles are: the base session's hooks write, resize, interrupt and
kill through them), `files`, `scripts` (the `sh` beside a command) and `errors` (the
SDK's exceptions by the toolkit's policy).

Checked against daytona==0.226.1. What the SDK makes impossible, and what is done
instead, is in each module's docstring: session logs arrive as text (non-UTF-8 bytes on
pipes become U+FFFD), a PTY's signal death may come as Go's -1 with a reason.
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
from ...errors import InvalidArgumentError
from ..toolkit import Secret, check_limits, refuse_renamed, require_credential
from . import commands, terminal
from . import durable as durable_daytona
from .client import SESSION_LABEL, ClientOptions, DaytonaClient
from .errors import API_KEY_ENV
from .files import DaytonaFiles
from .handles import DaytonaHandle
from .limits import create_resources
from .workspace import DaytonaPorts, DaytonaSnapshots


class DaytonaSession(BaseSandboxSession[DaytonaHandle]):
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
        """Create the sandbox (or attach to one), then prepare it."""
        await self._client.start(durable_session_id(self))
        self._created = self._client.options.attach_id is None

    async def _stop_backend(self) -> None:
        """Delete the sandbox unless kept, then close the client (every call bounded)."""
        await self._client.stop()

    # ---- one-shot commands -------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """Start a one-shot command in its own session (see `commands.OneShotCommand`);
        a start that fails or is cancelled deletes what it made."""
        return await commands.start_oneshot(self._client, spec, capture, self.terminate_grace_s)

    # ---- processes ---------------------------------------------------------------------

    async def _spawn_process(self, entry: OutputSink[DaytonaHandle]) -> None:
        """A PTY session for `tty=True` (`terminal.spawn`), a session command for pipes
        (`commands.spawn`); either handle is a `Process` the base hooks drive. No pipe
        keeps its stdin open (`stdin=True` is refused at start)."""
        spawn = terminal.spawn if entry.tty else commands.spawn
        await spawn(self._client, entry, self.terminate_grace_s)

    async def _terminate_pty_entry(self, entry: OutputSink[DaytonaHandle]) -> None:
        """The handle's `kill` (`PtyState.kill`, `PipeState.kill`): when the sandbox's
        deletion comes next (`entry.sandbox_stopping`, and the close deletes it) only
        our side is released."""
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
