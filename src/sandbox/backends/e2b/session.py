"""`E2BSession`: E2B cloud sandboxes through the `e2b` SDK's async surface (the hooks
only; the SDK calls live beside it, see the package docstring).

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
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from typing import Any

from e2b import AsyncSandbox, NotFoundException, PtySize

from ...backend import (
    BaseSandboxSession,
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    ShellFileOps,
    ShellWorkspace,
    cancel_and_wait,
    check_env,
    check_seconds,
    check_str,
    durable_session_id,
    settle,
)
from ...errors import InvalidArgumentError
from ..toolkit import (
    CommandCheck,
    Secret,
    ShellTrap,
    check_limits,
    refuse_renamed,
    refuse_unsupported,
    require_credential,
    tag_environment,
    wait_for_verdict,
)
from . import durable as durable_e2b
from . import files, sandboxes
from .client import DEFAULT_CALL_TIMEOUT_S, E2BClient
from .errors import REFUSED, ErrorPolicy
from .files import E2BFiles
from .processes import E2BProcess, OneShot, text_to_bytes
from .sandboxes import SESSION_LABEL
from .scripts import TYPED_LINE, line_environment, pipe_line, tty_command
from .workspace import E2BPorts, E2BSnapshots, check_snapshot_mode

API_KEY_ENV = "E2B_API_KEY"


class E2BSession(BaseSandboxSession[E2BProcess]):
    """Runs commands in an E2B sandbox (see the module docstring for the options)."""

    backend_name = "e2b"

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
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        super().__init__(**options)
        # E2B's create (e2b==2.63.0 `AsyncSandbox.create`) takes no resources: CPU and
        # memory belong to the template (set when it is built), processes are unlimited.
        refuse_unsupported(
            check_limits(
                memory_limit_bytes=memory_limit_bytes,
                process_limit=process_limit,
                cpu_limit=cpu_limit,
            ),
            backend="e2b",
            supported=(),
            why="E2B sets CPU and memory per template (at build), not per sandbox",
        )
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
        labels = check_env(labels, name="labels", variables=False)
        if labels and SESSION_LABEL in labels:
            raise InvalidArgumentError(
                f"labels[{SESSION_LABEL!r}] is the library's own mark of the sandboxes it "
                "creates: choose another key"
            )
        env = check_env(env)
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
        self._api_key = Secret(
            require_credential(
                None if self._api_key_option is None else self._api_key_option.reveal(),
                API_KEY_ENV,
                backend="e2b",
                what="an E2B API key (api_key)",
            )
        )
        self._errors.secrets = (self._api_key, self._api_key_option)
        client, cls = self._client, self._sandbox_class
        if self._attach_id is not None:
            connect = cls.connect(
                self._attach_id, timeout=self._sandbox_timeout, **self._api_params()
            )
            try:
                client.sandbox = await client.bounded(connect, client.start_timeout)
            except Exception as exc:
                self._errors.fail(exc, f"attach to sandbox {self._attach_id}")
            return
        token = self._start_token = sandboxes.new_start_token()
        create = sandboxes.create_call(
            cls,
            token,
            template=self._template,
            lifetime=self._sandbox_timeout,
            metadata=self._metadata,
            envs=self._envs,
            params=self._api_params(),
            session_id=durable_session_id(self),
        )
        # The create runs as our task: if this caller is cancelled, `_stop_backend` waits
        # for it and deletes the sandbox it made.
        self._start_task = asyncio.ensure_future(client.bounded(create, client.start_timeout))
        try:
            client.sandbox = await asyncio.shield(self._start_task)
        except Exception as exc:
            self._errors.fail(exc, "create a sandbox")
        self._start_task = None
        self._created = True

    async def _stop_backend(self) -> None:
        """Kill the sandbox unless kept; after an unfinished start, delete whatever the
        create made (waiting for it, or searching by tag when its outcome is unknown)."""
        task, self._start_task = self._start_task, None
        sandbox, self._client.sandbox = self._client.sandbox, None
        token, self._start_token = self._start_token, None
        unfinished_start = task is not None
        if task is not None and sandbox is None:
            # The start failed or its caller was cancelled: the create's outcome decides.
            if not task.done():
                await asyncio.wait([task])
            failure = None if task.cancelled() else task.exception()
            if task.cancelled() or failure is not None:
                if token is not None and not isinstance(failure, REFUSED):
                    await sandboxes.sweep(
                        self._client, self._sandbox_class, token, self._api_params()
                    )
                return
            sandbox = task.result()
        if sandbox is None or (self._keep and not unfinished_start):
            return
        await sandboxes.kill_sandbox(self._client, sandbox, self._api_params())

    # ---- one-shot commands ---------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """Start the command as a background job under the tagged wrapper, its output
        streamed into the bounded capture. A `cwd` (or `shell=False`) runs behind the
        command check: E2B would refuse a missing `cwd` with an error of its own."""
        client = self._client
        check = capture.check = CommandCheck.needed(spec, cwd=spec.cwd)
        command = spec.shell_command if check is None else check.shell(spec.argv, announce=False)
        proc = E2BProcess(tty=False)
        start = client.sandbox.commands.run(
            pipe_line(proc.tag, command),
            background=True,
            envs={**(spec.env or {}), **tag_environment(proc.outer_tag)},
            on_stdout=lambda chunk: capture.add_stdout(text_to_bytes(chunk)),
            on_stderr=lambda chunk: capture.add_stderr(text_to_bytes(chunk)),
            stdin=False,
            timeout=client.process_timeout,
            retain_output=False,
            **client.request(),
        )
        # Our task, shielded: if this caller is cancelled, wait for it and kill what it
        # started (nobody else knows the command yet).
        proc.start_task = asyncio.ensure_future(client.bounded(start, client.start_timeout))
        try:
            handle = await asyncio.shield(proc.start_task)
        except asyncio.CancelledError:
            await settle(self._undo_start(proc))
            raise
        except Exception as exc:
            self._errors.fail(exc, "start a command")
        return OneShot(client, handle, proc.tags)

    async def _undo_start(self, process: E2BProcess) -> None:
        """Kill what a cancelled one-shot start made, once the start came to its end."""
        handle = await process.started_handle()
        if handle is not None:
            await OneShot(self._client, handle, process.tags).kill()

    # ---- processes --------------------------------------------------------------------------

    async def _spawn_process(self, entry: OutputSink[E2BProcess]) -> None:
        """tty: an E2B PTY (a login bash) running the shell-trap line; pipes: a
        background command with stdin closed. Output flows into `entry.feed`."""
        client = self._client
        spec = entry.spec
        command = spec.command
        proc = E2BProcess(tty=spec.tty)
        entry.handle = proc
        # With a check (a `cwd`, or `shell=False`) the process starts in E2B's default
        # directory and the check enters `cwd`; its verdict is waited for below.
        check = CommandCheck.needed(command, cwd=command.cwd)
        shell_command = (
            command.shell_command if check is None else check.shell(command.argv, announce=True)
        )
        cwd = command.cwd if check is None else None
        if check is not None or spec.tty:
            proc.trap = ShellTrap(report_exit=False, token=None if check is None else check.token)
        trap = proc.trap
        if trap is not None and spec.tty:
            shell_trap = trap

            def on_data(data: bytes) -> None:
                """Terminal output, minus what the shell trap added."""
                shown = shell_trap.feed(bytes(data))
                if shown:
                    entry.feed(shown)

            # The trap's line reaches the login bash through its environment; only a
            # short fixed line is typed (see `scripts.line_environment`).
            line = trap.line(tty_command(proc.tag, shell_command), tty=True, announced=bool(check))
            start: Coroutine[Any, Any, Any] = client.sandbox.pty.create(
                size=PtySize(rows=spec.rows, cols=spec.cols),
                on_data=on_data,
                cwd=cwd,
                envs={**(command.env or {}), **tag_environment(proc.tag), **line_environment(line)},
                timeout=client.process_timeout,
                **client.request(),
            )
        else:

            def on_output(chunk: str | bytes) -> None:
                """Pipe output (stdout and stderr, in arrival order) as bytes."""
                entry.feed(text_to_bytes(chunk))

            def on_stdout(chunk: str | bytes) -> None:
                """Stdout behind a check: the trap strips the check's start marker."""
                assert trap is not None
                shown = trap.feed(text_to_bytes(chunk))
                if shown:
                    entry.feed(shown)

            start = client.sandbox.commands.run(
                pipe_line(proc.tag, shell_command, stdin=spec.stdin),
                background=True,
                envs={**(command.env or {}), **tag_environment(proc.outer_tag)},
                cwd=cwd,
                on_stdout=on_output if check is None else on_stdout,
                on_stderr=on_output,
                stdin=spec.stdin,
                timeout=client.process_timeout,
                retain_output=False,
                **client.request(),
            )
        # Our task, shielded: a cancelled caller leaves it to `_terminate_pty_entry`,
        # which waits for it and kills what it started.
        proc.start_task = asyncio.ensure_future(client.bounded(start, client.start_timeout))
        try:
            proc.handle = await asyncio.shield(proc.start_task)
        except Exception as exc:
            self._errors.fail(exc, "start a process")
        proc.waiter = asyncio.ensure_future(proc.watch(entry, client))
        if spec.tty:
            await client.send(proc.handle.pid, TYPED_LINE.encode())
        if check is not None and trap is not None:
            await wait_for_verdict(entry, trap, check)

    async def _write_stdin(self, entry: OutputSink[E2BProcess], data: bytes) -> None:
        """Send keystrokes to the PTY, or bytes to a pipe command's open stdin (in
        pieces of at most `STDIN_CHUNK`)."""
        proc = entry.require_handle()
        if entry.tty:
            await self._client.send(proc.handle.pid, data)
        else:
            await self._client.send_input(proc.handle.pid, data)

    async def _close_stdin(self, entry: OutputSink[E2BProcess]) -> None:
        """`commands.close_stdin`: envd closes the command's stdin pipe after the input
        sent before (each `send_stdin` answered first). Asked once per process."""
        proc = entry.require_handle()
        if not proc.stdin_closed:
            await self._client.close_input(proc.handle.pid)
            proc.stdin_closed = True

    async def _resize(self, entry: OutputSink[E2BProcess], rows: int, cols: int) -> None:
        """Resize the PTY (`pty.resize`); a process that just exited is left alone."""
        proc = entry.require_handle()
        client = self._client
        try:
            await client.timed(
                client.sandbox.pty.resize(
                    proc.handle.pid, PtySize(rows=rows, cols=cols), **client.request()
                ),
                "resize the terminal",
            )
        except NotFoundException:
            return  # it just exited: nothing to resize
        except Exception as exc:
            self._errors.fail(exc, "resize the terminal")

    async def _interrupt(self, entry: OutputSink[E2BProcess]) -> None:
        """tty: the interrupt character; pipes: SIGINT to the command's process group,
        sent by the toolkit's interrupt script."""
        proc = entry.require_handle()
        if entry.tty:
            await self._client.send(proc.handle.pid, b"\x03")
            return
        await self._client.interrupt(proc.tag)

    async def _terminate_pty_entry(self, entry: OutputSink[E2BProcess]) -> None:
        """Wait for an unfinished start, kill the tagged tree and the process (unless the
        sandbox is killed right after), stop and await the waiter task, and disconnect
        the SDK handle (its reader task)."""
        proc: E2BProcess | None = entry.handle
        if proc is None:
            return
        handle = await proc.started_handle()
        # A sandbox the close kills next takes every process with it: killing them one
        # by one first would only cost requests.
        sandbox_going = entry.sandbox_stopping and not self._keep
        error: BaseException | None = None
        if handle is not None and not proc.ended and not sandbox_going:
            try:
                await self._client.kill_tree(handle.pid, proc.tags, tty=proc.tty)
            except Exception as exc:
                error = exc
        if proc.waiter is not None:
            await cancel_and_wait([proc.waiter])
        if handle is not None:
            await self._client.disconnect(handle)
        if error is not None:
            raise error

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
