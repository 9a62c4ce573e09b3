"""`E2BSession`: E2B cloud sandboxes through the `e2b` SDK's async surface (the
lifecycle hooks only; the SDK calls live beside it, see the package docstring). A
process's handle is an `E2BProcess` (`processes`), a `Process`: the base session's
hooks write to it, resize it, interrupt it, end its input and kill it through its
methods, so the session writes no per-process hook but the spawn and the teardown.

How the contract maps onto E2B:

- The session creates a sandbox (`AsyncSandbox.create`) or attaches to one by id
  (`AsyncSandbox.connect`), and kills it on close unless `keep=True`.
- `tty=True` processes use `sandbox.pty.create()`, which starts an interactive login
  bash, not our command. A `ShellTrap` line in exec mode is handed to it in its
  environment and run by a short typed line (`scripts.line_environment`): the shell is
  replaced by the toolkit's `sh` wrapper, which runs the command and exits with its
  status (128+N for a death by signal N, which E2B reports as -1), so the PTY's own end
  reports the command's exit code.
- `tty=False` processes (and one-shot `exec`) use `commands.run(background=True,
  stdin=False)`, the wrapper running as a `set -m` job (see `scripts`); with
  `stdin=True` the command keeps envd's stdin pipe (`commands.send_stdin` writes to it,
  `commands.close_stdin` ends it: envd 0.5.2 and later).
- Interrupt (pipes) and terminate run the toolkit's kill script as a second command: it
  finds the tagged tree through /proc. E2B's own `kill` follows (it reaches the process
  it started only). At the close of a sandbox that is killed next
  (`entry.sandbox_stopping`, not kept), the per-process kills are skipped.
- Every SDK call that creates something remote (a sandbox, a process) runs as a task the
  session owns; if the caller is cancelled meanwhile, the teardown waits for that task and
  deletes what it made (a create whose outcome is unknown: `sandboxes.sweep`).
- Background commands run with `retain_output=False`: the SDK would otherwise keep every
  character a command printed in its handle for as long as the handle lives.

Options: `api_key` (else `E2B_API_KEY`), `sandbox_id` (attach), `image` (the E2B
template a new sandbox is made from), `keep`, `sandbox_timeout_s` (the sandbox's
lifetime on E2B), `start_timeout_s` (bound on creating/attaching and on starting a
process), `teardown_timeout_s` (bound on each teardown call), `process_timeout_s` (the
lifetime E2B gives each process stream, one-shot commands included; 0 means
unlimited), `call_timeout_s` (bound on each other call, over the whole call: a file
transfer, typed input, a resize; default 120 s), `snapshot_mode` (what `snapshot()`
keeps: None for the API's default, "full" or "filesystem"; see `workspace`; the call is
bounded by `start_timeout_s`), `labels` (E2B's metadata) and `env` (for a new sandbox: its
environment, so every command's; the label `sandbox.session` is the library's:
a created sandbox carries the durable session's id there, which a resume checks before
it takes on the sandbox's deletion), and `sandbox_class` (default `e2b.AsyncSandbox`;
pass `sandbox.testing.e2b_fake.FakeE2B().AsyncSandbox` to run against the fake).
`memory_limit_bytes`, `process_limit` and `cpu_limit` raise `UnsupportedOperationError`:
E2B's create takes no resources (a template has its CPU and memory).

`runner` (default False): `True` runs processes and one-shot commands through the runner
(docs/runner.md, `runner_link`): put into the sandbox once through the files API (skipped
when the file at its content-named path in `$SANDBOX_RUNNER_DIR`, else `$TMPDIR`, else
/tmp, has the same sha256), started detached and reached by one background command,
`connect --text`, whose stdin and stdout carry its frames as base64 lines (the SDK
decodes a command's stdout as text). What it gains over envd's own processes: a
reattached process replays what it printed while no client was connected (from the
runner's ring, the omission marker where the ring kept less), pipe output is byte-exact,
a kill ends the whole tree, and every process starts with exactly the sandbox's
environment plus its own (no login shell, no wrapper). Refused
(`UnsupportedOperationError`) where this install has no runner for the sandbox's machine
(`uname -m`); `None`: the runner where there is one, else envd's processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from e2b import AsyncSandbox

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
from ..toolkit import RunnerChoice, RunnerReport, Secret, refuse_renamed, require_credential
from . import durable as durable_e2b
from . import files, processes, runner_link, sandboxes
from .client import DEFAULT_CALL_TIMEOUT_S, E2BClient
from .errors import ErrorPolicy
from .files import E2BFiles
from .processes import E2BProcess
from .runner_link import E2BRunner
from .workspace import E2BPorts, E2BSnapshots, check_snapshot_mode

API_KEY_ENV = "E2B_API_KEY"


class E2BSession(RunnerReport, BaseSandboxSession[E2BProcess]):
    """Runs commands in an E2B sandbox (see the module docstring for the options)."""

    backend_name = "e2b"
    # A process on pipes may keep envd's stdin pipe open (`E2BProcess.close_stdin` ends it).
    _stdin_stays_open = True

    def __init__(
        self,
        *,
        api_key: str | None = None,
        sandbox_id: str | None = None,
        image: str | None = None,
        keep: bool = False,
        sandbox_timeout_s: int = 3600,
        start_timeout_s: float = 120.0,
        teardown_timeout_s: float = 15.0,
        process_timeout_s: float = 86_400.0,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        sandbox_class: Any = None,
        snapshot_mode: str | None = None,
        memory_limit_bytes: int | None = None,
        process_limit: int | None = None,
        cpu_limit: float | None = None,
        runner: bool | None = False,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        super().__init__(**options)
        # E2B's create takes no resources (a template has its CPU and memory).
        sandboxes.refuse_limits(memory_limit_bytes, process_limit, cpu_limit)
        for name, value in (
            ("start_timeout_s", start_timeout_s),
            ("teardown_timeout_s", teardown_timeout_s),
            ("sandbox_timeout_s", sandbox_timeout_s),
            ("call_timeout_s", call_timeout_s),
        ):
            check_seconds(name, value)
        check_seconds("process_timeout_s", process_timeout_s, allow_zero=True)  # 0: no limit
        if api_key is not None and not isinstance(api_key, str):
            raise InvalidArgumentError("api_key must be a str")
        for name, text in (("sandbox_id", sandbox_id), ("image", image)):
            check_str(name, text)
        labels = sandboxes.check_labels(labels)
        env = check_env(env)
        if runner is not None and not isinstance(runner, bool):
            raise InvalidArgumentError(f"runner must be True, False or None, not {runner!r}")
        # Credentials only ever in a `Secret` (its repr hides them).
        self._api_key_option = None if not api_key else Secret(api_key)
        self._api_key: Secret | None = None
        self._errors = ErrorPolicy([self._api_key_option])
        self._client = E2BClient(
            self._errors,
            # Each SDK request keeps the SDK's own timeout: every call is bounded as a
            # whole by one of ours (start, teardown, call), which is what a caller sets.
            request_timeout=None,
            start_timeout=float(start_timeout_s),
            kill_timeout=float(teardown_timeout_s),
            process_timeout=float(process_timeout_s),
            call_timeout=float(call_timeout_s),
        )
        self._attach_id = sandbox_id
        self._template = image
        self._keep = bool(keep)
        # Whether this session's start created the sandbox (a resume: its ref said so and
        # the sandbox's metadata confirmed it).
        self._created = False
        self._sandbox_timeout = int(sandbox_timeout_s)
        self._metadata = dict(labels or {})
        self._envs = dict(env or {})
        self._sandbox_class: Any = sandbox_class if sandbox_class is not None else AsyncSandbox
        self._snapshot_mode = check_snapshot_mode(snapshot_mode)
        self._start_task: asyncio.Task[Any] | None = None
        self._start_token: str | None = None
        # The link to the runner in the sandbox, while the session has one.
        self._runner: E2BRunner | None = None
        # Whether this session runs its processes through the runner: True once a start
        # connected to it (`runner=None` may fall back); before, whether it is asked for.
        self._runner_choice = RunnerChoice(runner)
        # A resume starts the runner only once the sandbox is known to be ours (`durable`).
        self._runner_deferred = False

    @property
    def sandbox_id(self) -> str | None:
        """The E2B sandbox id (after start), or the one given to attach to."""
        if self._client.sandbox is not None:
            return str(self._client.sandbox.sandbox_id)
        return self._attach_id

    def _api_params(self) -> dict[str, Any]:
        key = None if self._api_key is None else self._api_key.reveal()
        return {"api_key": key, **self._client.request()}

    # ---- lifecycle -----------------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Resolve the API key, then attach to `sandbox_id` or create a sandbox (tagged,
        as a task we own, so a cancelled or failed create can be cleaned up)."""
        given = None if self._api_key_option is None else self._api_key_option.reveal()
        what = "an E2B API key (api_key)"
        self._api_key = Secret(require_credential(given, API_KEY_ENV, backend="e2b", what=what))
        self._errors.secrets = (self._api_key, self._api_key_option)
        client, cls, params = self._client, self._sandbox_class, self._api_params()
        if self._attach_id is not None:
            lifetime = self._sandbox_timeout
            client.sandbox = await sandboxes.attach(client, cls, self._attach_id, lifetime, params)
            if not self._runner_deferred:
                await self._start_runner()
            return
        token = self._start_token = sandboxes.new_start_token()
        create = sandboxes.create_call(
            cls,
            token,
            template=self._template,
            lifetime=self._sandbox_timeout,
            metadata=self._metadata,
            envs=self._envs,
            params=params,
            session_id=durable_session_id(self),
        )
        # The create runs as our task: if this caller is cancelled, `_stop_backend` waits
        # for it and deletes the sandbox it made.
        self._start_task = asyncio.ensure_future(client.bounded(create, client.start_timeout))
        client.sandbox = await sandboxes.created(client, self._start_task)
        self._start_task = None
        self._created = True
        await self._start_runner()

    async def _start_runner(self) -> None:
        """Connect to the runner in the sandbox (delivered and started when needed) if
        the `runner` option asks for it (`runner_link.connect`)."""
        choice = self._runner_choice
        self._runner = await choice.decide(
            lambda: runner_link.connect(self._client, choice.asked), backend="e2b", where="sandbox"
        )

    async def _stop_backend(self) -> None:
        """Close the runner's link (the runner lives on in a kept sandbox; a killed one
        ends it), then kill the sandbox unless kept; after an unfinished start, delete
        whatever the create made (waiting for it, or searching by tag when its outcome
        is unknown: `runner_link.shut_down`, `sandboxes.release`)."""
        runner, self._runner = self._runner, None
        await runner_link.shut_down(runner, self._release_sandbox)

    async def _release_sandbox(self) -> None:
        """Forget the sandbox and kill it unless kept (see `_stop_backend`)."""
        # The home is the sandbox's: a start after this one (a cancelled start retried)
        # asks the next sandbox for its own.
        self._client.home = None
        task, self._start_task = self._start_task, None
        sandbox, self._client.sandbox = self._client.sandbox, None
        token, self._start_token = self._start_token, None
        cls, params = self._sandbox_class, self._api_params()
        await sandboxes.release(self._client, cls, params, sandbox, task, token, keep=self._keep)

    # ---- one-shot commands ---------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """Start the command as a background job under the tagged wrapper, its output
        streamed into the bounded capture (`processes.start_exec`). A `cwd` (or
        `shell=False`) runs behind the command check: E2B would refuse a missing `cwd`
        with an error of its own. With the runner: the runner's one-shot, stdout and
        stderr apart, byte-exact (`processes.start_on_runner`)."""
        if self._runner is not None:
            return await processes.start_on_runner(self._runner, spec, capture)
        return await processes.start_exec(self._client, spec, capture)

    # ---- processes --------------------------------------------------------------------------

    async def _spawn_process(self, entry: OutputSink[E2BProcess]) -> None:
        """tty: an E2B PTY (a login bash) running the shell-trap line; pipes: a
        background command, its stdin closed unless `stdin=True`. Output flows into
        `entry.feed`; the handle is an `E2BProcess` (`processes.spawn_process`). With
        the runner: the runner's process, a `RunnerProcess` (`processes.spawn_on_runner`)."""
        if self._runner is not None:
            await processes.spawn_on_runner(entry, self._runner)
            return
        await processes.spawn_process(entry, self._client, keep=self._keep)

    async def _terminate_pty_entry(self, entry: OutputSink[E2BProcess]) -> None:
        """`E2BProcess.kill`: wait for an unfinished start, kill the tagged tree and the
        process (unless the sandbox is killed right after), stop the waiter task and
        disconnect the SDK handle. A runner's process: its tree killed by the runner
        (`RunnerProcess.kill`)."""
        await kill_handle(entry)

    # ---- capabilities (`sandbox.backend.Capability`: each made with the session) ----

    _file_access = E2BFiles
    _workspace_access = ShellWorkspace
    _ports = E2BPorts
    _snapshots = E2BSnapshots
    _durability = durable_e2b.E2BDurability

    # ---- what the capabilities use ---------------------------------------------------

    async def _shell_ops(self) -> ShellFileOps:
        await files.in_workspace(self._client, ".")  # learns the home, once
        assert self._client.home is not None
        return ShellFileOps(self.exec, self._client.home)
