"""`ModalSession`: the `modal` backend's hooks, on Modal sandboxes through the SDK's
async (`.aio`) calls.

On the per-exec path (the default) every process is a `sandbox.exec.aio(...)`
(`pty=True` for a terminal): the command is the process, so its exit status comes from
`process.wait.aio()` and no shell trap is needed. Beside it (one module per idea):
`options` (the options, their defaults and checks), `lifecycle` (the provider calls that
connect, create or attach, and at the stop close the runner's link, terminate and
detach), `commands` (start a command, a terminal one with an explicit `TERM` (see
there), signal it with the toolkit's scripts, read a stream; `Command`, a process's
handle: a `Process` the base session's hooks write to, interrupt, end the input of and
kill), `scripts` (the argv: preamble, toolkit wrapper, kill script), `oneshot` (the
`OneShotProcess` of `exec`, and its start: per exec or through the runner),
`processes` (the start, readers and watcher of a `pty_exec_start` process; or its start
through the runner), `files`, `limits`, `workspace`, `durable`, `errors` (the SDK's
exceptions through the toolkit's policy), `runner_link` (the runner in the sandbox:
delivery, start, the exec that carries its link). A terminal is interrupted with
`\\x03`; resizing raises `UnsupportedOperationError` there (the SDK has no call for it).

By default (`runner=None`: where this install has a runner for the sandbox's machine
and the sandbox takes it; `runner=True` requires it) processes and commands go through
the runner (docs/runner.md, `runner_link`): put into the sandbox once (checked by
content hash), started detached, and reached by one exec whose binary stdin and stdout
carry its protocol. Its processes
outlive the client (`keeps_processes`), keep stdin open until `close_stdin`, are killed
with their whole tree, and resize (the runner owns the terminal).

Tests run this backend against `sandbox.testing.modal_fake.FakeModal` (option `sdk`),
a fake of the SDK surface used here, driven by real local processes and checked against
the installed SDK.
"""

from __future__ import annotations

import os
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
from ..toolkit import TAG_VARIABLE, RunnerChoice, RunnerReport, Secret, refuse_renamed
from . import durable as durable_modal
from . import lifecycle, oneshot, processes
from . import options as modal_options
from .commands import Command, Commands
from .errors import DEFAULT_CALL_TIMEOUT_S, ModalErrors
from .files import ModalFileAccess, ModalFiles
from .runner_link import SandboxRunner
from .workspace import ModalPorts, ModalSnapshots, image_of

TOKEN_ENV = TAG_VARIABLE  # the variable that tags a command's tree


class ModalSession(RunnerReport, BaseSandboxSession[Command]):
    """Runs commands in a Modal sandbox, created (or attached to by `sandbox_id`) at
    start and terminated at close unless `keep`; its options are documented, and
    checked, in `sandbox.backends.modal.options`.

    Without the runner, every command sees one extra variable, the toolkit's
    `SANDBOX_PROCESS_TAG`, which identifies its process tree for teardown (see
    `scripts`). A one-shot `exec` that leaves a daemon with its output redirected leaves
    it running (like `docker exec`); one still holding the output pipes is killed after
    a short grace.
    """

    backend_name = "modal"
    # A process on pipes may keep its stdin open (`Command.close_stdin` ends it).
    _stdin_stays_open = True

    def __init__(
        self,
        *,
        app_name: str = modal_options.DEFAULT_APP_NAME,
        image: Any = None,
        sandbox_id: str | None = None,
        keep: bool = False,
        token_id: str | None = None,
        token_secret: str | None = None,
        client: Any = None,
        workdir: str = modal_options.DEFAULT_WORKDIR,
        env: Mapping[str, str] | None = None,
        sandbox_timeout_s: int = modal_options.DEFAULT_SANDBOX_TIMEOUT_S,
        create_options: Mapping[str, Any] | None = None,
        terminate_grace_s: float = 1.0,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        create_timeout_s: float = modal_options.DEFAULT_CREATE_TIMEOUT_S,
        state_dir: str = modal_options.STATE_ROOT,
        term: str = modal_options.DEFAULT_TERM,
        sdk: Any = None,
        memory_limit_bytes: int | None = None,
        process_limit: int | None = None,
        cpu_limit: float | None = None,
        runner: bool | None = None,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        super().__init__(**options)
        given = self._given = modal_options.check_options(
            app_name=app_name,
            image=image,
            sandbox_id=sandbox_id,
            keep=keep,
            token_id=token_id,
            token_secret=token_secret,
            client=client,
            workdir=workdir,
            env=env,
            sandbox_timeout_s=sandbox_timeout_s,
            create_options=create_options,
            terminate_grace_s=terminate_grace_s,
            call_timeout_s=call_timeout_s,
            create_timeout_s=create_timeout_s,
            state_dir=state_dir,
            term=term,
            sdk=sdk,
            memory_limit_bytes=memory_limit_bytes,
            process_limit=process_limit,
            cpu_limit=cpu_limit,
            runner=runner,
        )
        self.app_name = given.app_name
        self.keep = given.keep
        self.workdir = given.workdir
        self.sandbox_timeout_s = given.sandbox_timeout_s
        self.terminate_grace_s = given.terminate_grace_s
        self.create_timeout_s = given.create_timeout_s
        self.exit_output_grace_s = processes.EXIT_OUTPUT_GRACE_S
        self.exit_status_timeout_s = processes.EXIT_STATUS_TIMEOUT_S
        # Under the names they always had: a caller resuming with the same SDK and token
        # reads them here (tests/test_conformance_durable.py).
        self._sdk: Any = given.sdk
        self._token_id, self._token_secret = given.token_id, given.token_secret
        self._client: Any = None
        self._owns_client = False
        self._sandbox: Any = None
        self._create_name: str | None = None
        # Whether this session's start created the sandbox (a resume: its ref said so and
        # the sandbox's tag confirmed it).
        self._created = False
        self._errors = ModalErrors(self._secrets, given.call_timeout_s)
        self._commands = Commands(
            self._errors,
            workdir=given.workdir,
            env=given.env,
            term=given.term,
            state_dir=f"{given.state_dir}/{secrets.token_hex(8)}",
            terminate_grace_s=given.terminate_grace_s,
        )
        self._files = ModalFiles(self._errors, given.workdir)
        # The link to the runner in the sandbox, while the session has one.
        self._runner: SandboxRunner | None = None
        # Whether this session runs its processes through the runner: True once a start
        # connected to it (`runner=None` may fall back), and after a detach (its ref
        # says so); before the start, whether `runner=True` asks for it.
        self._runner_choice = RunnerChoice(given.runner)
        # A resume starts the runner only once the sandbox is known to run (`durable`).
        self._runner_deferred = False

    @property
    def sandbox_id(self) -> str | None:
        """The Modal sandbox id (once started), for attaching to it again later."""
        return self._sandbox.object_id if self._sandbox is not None else None

    def _secrets(self) -> list[str | Secret | None]:
        """What no message may show: the token, given or found in the environment."""
        return [self._token_secret, self._token_id, *map(os.environ.get, lifecycle.TOKEN_ENVS)]

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Connect with the token (or the given client), then attach to `sandbox_id` or
        look up the app and create a sandbox with a unique name (see `lifecycle`); then
        the runner if asked for (on a resume: once `durable` knows the sandbox runs)."""
        given, errors, sdk = self._given, self._errors, self._sdk
        self._client, self._owns_client = await lifecycle.open_client(
            sdk, errors, given.client, self._token_id, self._token_secret
        )
        if given.sandbox_id is not None:
            self._sandbox = await lifecycle.attach(sdk, errors, given.sandbox_id, self._client)
        else:
            app = await lifecycle.lookup_app(sdk, errors, self.app_name, self._client)
            image = image_of(sdk, given.image, self._client)
            # Named before the create call: a stop after it failed or was cancelled finds
            # (and terminates) a sandbox the provider created anyway.
            self._create_name = lifecycle.sandbox_name()
            self._sandbox = await lifecycle.create_sandbox(
                sdk,
                errors,
                app=app,
                name=self._create_name,
                image=image,
                client=self._client,
                lifetime_s=self.sandbox_timeout_s,
                workdir=self.workdir,
                create_options=given.create_options,
                session_id=durable_session_id(self),
                timeout_s=self.create_timeout_s,
            )
            self._created = True
        self._commands.sandbox = self._sandbox
        if not self._runner_deferred:
            await self._start_runner()

    async def _start_runner(self) -> None:
        """Connect to the runner in the sandbox if the `runner` option asks for it
        (`SandboxRunner.start`: `runner=None` falls back to the per-exec path where this
        install has no runner for the sandbox's machine)."""
        given, sandbox = self._given, self._commands.require_sandbox()
        choice = self._runner_choice
        self._runner = await choice.decide(
            lambda: SandboxRunner.start(
                sandbox, self._errors, given.env, given.term, wanted=choice.asked
            ),
            backend="modal",
            where="sandbox",
        )

    async def _stop_backend(self) -> None:
        """Close the runner's link, terminate the sandbox unless kept (also one a failed
        or cancelled create left behind, found by its name), detach, and close the
        client we opened (`lifecycle.shut_down`)."""
        commands = self._commands
        runner, self._runner = self._runner, None
        try:
            await lifecycle.shut_down(
                self._sdk,
                self._errors,
                self._sandbox,
                runner=runner,
                client=self._client,
                owns_client=self._owns_client,
                keep=self.keep,
                app_name=self.app_name,
                create_name=self._create_name,
                markers=commands.state_dir if commands.marked else None,
            )
        finally:
            self._sandbox = commands.sandbox = self._client = self._create_name = None
            self._owns_client = False

    # ---- one-shot commands -------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """One exec, its output read into the bounded capture (`oneshot.start_oneshot`,
        which kills the tree by its tag should this be cancelled mid-start). With the
        runner: the runner's one-shot, stdout and stderr apart (`oneshot.start_on_runner`)."""
        if self._runner is not None:
            return await oneshot.start_on_runner(self._runner, self._commands, spec, capture)
        grace_s = self.exit_output_grace_s
        return await oneshot.start_oneshot(
            self._commands, spec, capture, keep=self.keep, exit_output_grace_s=grace_s
        )

    # ---- processes -------------------------------------------------------------------

    async def _spawn_process(self, entry: OutputSink[Command]) -> None:
        """Exec the command under the toolkit's wrapper (`pty=True` for a terminal), then
        one reader task per stream and a watcher task for the exit (`processes.spawn`).
        With the runner: the runner's process (`processes.spawn_on_runner`)."""
        if self._runner is not None:
            grace_s = self.terminate_grace_s
            await processes.spawn_on_runner(entry, self._runner, self._commands, grace_s=grace_s)
            return
        await processes.spawn(
            entry,
            self._commands,
            keep=self.keep,
            exit_output_grace_s=self.exit_output_grace_s,
            exit_status_timeout_s=self.exit_status_timeout_s,
        )

    async def _terminate_pty_entry(self, entry: OutputSink[Command]) -> None:
        """`Command.kill`: the tree killed by tag, unless the sandbox's deletion right
        after ends it; the reader and watcher tasks stopped either way. A runner's
        process: its tree killed by the runner (`RunnerProcess.kill`)."""
        await kill_handle(entry)

    # ---- capabilities (`sandbox.backend.Capability`: each made with the session) ----

    _file_access = ModalFileAccess
    _workspace_access = ShellWorkspace
    _ports = ModalPorts
    _snapshots = ModalSnapshots
    _durability = durable_modal.ModalDurability

    # ---- what the capabilities use ---------------------------------------------------

    async def _shell_ops(self) -> ShellFileOps:
        """The shell file operations in this sandbox's workspace."""
        return ShellFileOps(self.exec, self.workdir)
