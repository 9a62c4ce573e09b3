"""`ModalSession`: the `modal` backend's hooks, on Modal sandboxes through the SDK's
async (`.aio`) calls.

Every process is a `sandbox.exec.aio(...)` (`pty=True` for a terminal): the command is
the process, so its exit status comes from `process.wait.aio()` and no shell trap is
needed. Beside it (one module per idea): `commands` (start a command, signal it with
the toolkit's scripts, read a stream; `Command`, a process's handle: a `Process` the
base session's hooks write to, interrupt, end the input of and kill), `scripts` (the
argv: preamble, toolkit wrapper, kill script), `oneshot` (the `OneShotProcess` of
`exec`), `processes` (readers and watcher of a `pty_exec_start` process), `files`,
`errors` (the SDK's exceptions through the toolkit's policy). A terminal is interrupted
with `\\x03`; resizing raises `UnsupportedOperationError` (the SDK has no call for it).

With `pty=True` the SDK describes the terminal from the *client* process
(`modal._output.pty.get_pty_info`, called by `Sandbox.exec` through
`modal.sandbox._common.default_pty_info`): `TERM`, `COLORTERM` and `TERM_PROGRAM` from
`os.environ`, the window size from `sys.stdin`'s terminal. A server process has no TERM
and no terminal, so every terminal command gets `TERM` explicitly in its environment
(option `term`, default `xterm-256color`; a `TERM` in `env` or the command's own env
wins) and the toolkit's wrapper applies the requested size with `stty`.

Tests run this backend against `sandbox.testing.modal_fake.FakeModal` (option `sdk`),
a fake of the SDK surface used here, driven by real local processes and checked against
the installed SDK.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping
from typing import Any

import modal

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
    settle,
)
from ...errors import InvalidArgumentError
from ..toolkit import (
    TAG_VARIABLE,
    CommandCheck,
    Secret,
    ShellTrap,
    check_limits,
    refuse_renamed,
    wait_for_verdict,
)
from . import durable as durable_modal
from .commands import Command, Commands
from .errors import DEFAULT_CALL_TIMEOUT_S, ModalErrors
from .files import ModalFileAccess, ModalFiles
from .lifecycle import (
    SESSION_LABEL,
    TOKEN_ID_ENV,
    TOKEN_SECRET_ENV,
    credentials,
    find_created_sandbox,
    quietly,
    remove_dir,
    terminate,
)
from .limits import create_resources
from .oneshot import ModalOneShot, server_timeout
from .processes import start_tasks
from .workspace import ModalPorts, ModalSnapshots, image_of

logger = logging.getLogger("sandbox.modal")

DEFAULT_APP_NAME = "agent-sandbox-pty"
DEFAULT_WORKDIR = "/root"
DEFAULT_SANDBOX_TIMEOUT_S = 3600
DEFAULT_TERM = "xterm-256color"
STATE_ROOT = "/tmp/.agent-sandbox-pty"
TOKEN_ENV = TAG_VARIABLE  # the variable that tags a command's tree
TOKEN_ENVS = (TOKEN_ID_ENV, TOKEN_SECRET_ENV)
# Output and exit status travel on different RPC streams: after one of them ends, how long
# to wait for the other before giving up on it.
EXIT_OUTPUT_GRACE_S = 1.0
EXIT_STATUS_TIMEOUT_S = 10.0
# A create may build the image first.
DEFAULT_CREATE_TIMEOUT_S = 600.0


class ModalSession(BaseSandboxSession[Command]):
    """Runs commands in a Modal sandbox.

    Options:

    - `app_name`: the Modal app the sandbox belongs to (looked up, created if missing);
    - `image`: a `modal.Image`, or a registry tag such as `"python:3.12-slim"`; default
      Modal's stock image (Debian slim with Python);
    - `sandbox_id`: attach to this existing sandbox instead of creating one;
    - `keep`: do not terminate the sandbox on close (created or attached: by default
      both are terminated); `sandbox_id` then lets a later session attach to it;
    - `token_id`, `token_secret`: the Modal token (default `MODAL_TOKEN_ID` and
      `MODAL_TOKEN_SECRET`), or `client`: a ready `modal.Client` (not closed by us);
    - `workdir`: the sandbox's working directory, where relative paths and `cwd` point
      (default `/root`); `env`: variables added to every command;
    - `sandbox_timeout_s`: the sandbox's maximum lifetime (default 1 h), a backstop
      should a session never be closed; `create_options`: more `Sandbox.create` options
      (`cpu`, `memory`, `secrets`, `tags`, ...; the tag `sandbox.session` is the
      library's: a created sandbox carries the durable session's id there, which a
      resume checks before it takes on terminating the sandbox);
    - `call_timeout_s`: bound on each provider call that is not a stream, over the
      whole call (a lookup, a command's start, a file transfer; default 120 s), and
      `create_timeout_s` on the create (default 600 s: it may build the image first):
      a provider that never answers, or trickles, fails with a retryable
      `ProviderError`; a process's output and exit wait are not bounded;
    - `terminate_grace_s`: time between the polite signals and SIGKILL (default 1 s);
    - `term`: the `TERM` of terminal commands (default `xterm-256color`; the SDK would
      otherwise copy the client process's own `TERM`, or none);
    - `state_dir`: where, in the sandbox, a start cancelled mid-flight leaves its marker
      (default `/tmp/.agent-sandbox-pty`; with the fake, that is this machine);
    - `memory_limit_bytes`, `cpu_limit`: the sandbox's memory (a whole number of MiB)
      and CPU (a whole number of millicores), each passed to `Sandbox.create` as both
      request and limit; `process_limit` is refused (Modal has no such setting), as are
      limits with `sandbox_id` (they apply at create);
    - `sdk`: the object providing `Sandbox`, `App`, `Client` and `Image` (default the
      `modal` module; tests pass a `sandbox.testing.modal_fake.FakeModal`);

    plus the base session's options.

    Every command sees one extra variable, the toolkit's `SANDBOX_PROCESS_TAG`, which
    identifies its process tree for teardown (see `scripts`). A one-shot `exec` that
    leaves a daemon with its output redirected leaves it running (like `docker exec`);
    one still holding the output pipes is killed after a short grace.
    """

    backend_name = "modal"
    # A process on pipes may keep its stdin open (`Command.close_stdin` ends it).
    _stdin_stays_open = True

    def __init__(
        self,
        *,
        app_name: str = DEFAULT_APP_NAME,
        image: Any = None,
        sandbox_id: str | None = None,
        keep: bool = False,
        token_id: str | None = None,
        token_secret: str | None = None,
        client: Any = None,
        workdir: str = DEFAULT_WORKDIR,
        env: Mapping[str, str] | None = None,
        sandbox_timeout_s: int = DEFAULT_SANDBOX_TIMEOUT_S,
        create_options: Mapping[str, Any] | None = None,
        terminate_grace_s: float = 1.0,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        create_timeout_s: float = DEFAULT_CREATE_TIMEOUT_S,
        state_dir: str = STATE_ROOT,
        term: str = DEFAULT_TERM,
        sdk: Any = None,
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
        if not isinstance(workdir, str) or not workdir.startswith("/"):
            raise InvalidArgumentError(f"workdir must be an absolute path, not {workdir!r}")
        # Every option is checked now, not when first used (a bad grace period would
        # otherwise surface as a raw TypeError in a teardown).
        check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
        check_seconds("call_timeout_s", call_timeout_s)
        check_seconds("create_timeout_s", create_timeout_s)
        self.create_timeout_s = float(create_timeout_s)
        if (
            isinstance(sandbox_timeout_s, bool)
            or not isinstance(sandbox_timeout_s, int)
            or sandbox_timeout_s <= 0
        ):
            raise InvalidArgumentError(
                f"sandbox_timeout_s must be a positive int (seconds), not {sandbox_timeout_s!r}"
            )
        for name, text in (
            ("app_name", app_name),
            ("sandbox_id", sandbox_id),
            ("token_id", token_id),
            ("token_secret", token_secret),
            ("state_dir", state_dir),
            ("term", term),
        ):
            check_str(name, text)
        if not term or "\0" in term:
            raise InvalidArgumentError("term must be a non-empty terminal type, such as 'xterm'")
        env = check_env(env)
        if create_options is not None and not isinstance(create_options, Mapping):
            raise InvalidArgumentError("create_options must be a mapping of option names")
        if create_options and create_options.get("env") is not None:
            # What reaches every command's environment is checked like `env`.
            given = create_options["env"]
            if isinstance(given, Mapping):  # None unsets a variable in Modal's env
                given = {k: v for k, v in given.items() if v is not None}
            check_env(given, name="create_options['env']")
        given_tags = (create_options or {}).get("tags")
        if given_tags is not None:
            check_env(given_tags, name="create_options['tags']", variables=False)
            if SESSION_LABEL in given_tags:
                raise InvalidArgumentError(
                    f"create_options['tags'][{SESSION_LABEL!r}] is the library's own mark of "
                    "the sandboxes it creates: choose another tag"
                )
        resources = create_resources(limits, attach=sandbox_id is not None)
        for name in set(resources) & set(create_options or {}):
            raise InvalidArgumentError(
                f"create_options[{name!r}] and a resource limit both set the sandbox's {name}"
            )
        self.app_name = app_name
        self.keep = keep
        self.workdir = workdir
        self.sandbox_timeout_s = sandbox_timeout_s
        self.terminate_grace_s = terminate_grace_s
        self.exit_output_grace_s = EXIT_OUTPUT_GRACE_S
        self.exit_status_timeout_s = EXIT_STATUS_TIMEOUT_S
        self._image = image
        self._sandbox_id_option = sandbox_id
        self._token_id = Secret(token_id) if token_id else None
        self._token_secret = Secret(token_secret) if token_secret else None
        self._client_option = client
        self._create_options = {**(create_options or {}), **resources}
        self._sdk: Any = sdk if sdk is not None else modal
        self._client: Any = None
        self._owns_client = False
        self._sandbox: Any = None
        self._create_name: str | None = None
        # Whether this session's start created the sandbox (a resume: its ref said so and
        # the sandbox's tag confirmed it).
        self._created = False
        self._errors = ModalErrors(self._secrets, float(call_timeout_s))
        self._commands = Commands(
            self._errors,
            workdir=workdir,
            env=dict(env or {}),
            term=term,
            state_dir=f"{state_dir}/{secrets.token_hex(8)}",
            terminate_grace_s=terminate_grace_s,
        )
        self._files = ModalFiles(self._errors, workdir)

    @property
    def sandbox_id(self) -> str | None:
        """The Modal sandbox id (once started), for attaching to it again later."""
        return self._sandbox.object_id if self._sandbox is not None else None

    def _secrets(self) -> list[str | Secret | None]:
        """What no message may show: the token, given or found in the environment."""
        return [self._token_secret, self._token_id, *map(os.environ.get, TOKEN_ENVS)]

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Connect with the token (or the given client), then attach to `sandbox_id` or
        look up the app and create a sandbox with a unique name."""
        call = self._errors.call
        if self._client_option is not None:
            self._client = self._client_option
        else:
            token_id, token_secret = credentials(self._token_id, self._token_secret)
            self._owns_client = True
            self._client = await call(
                "connect to Modal",
                self._sdk.Client.from_credentials.aio,
                token_id.reveal(),
                token_secret.reveal(),
            )
        if self._sandbox_id_option is not None:
            self._sandbox = await call(
                "attach to the sandbox",
                self._sdk.Sandbox.from_id.aio,
                self._sandbox_id_option,
                client=self._client,
            )
            self._commands.sandbox = self._sandbox
            return
        app = await call(
            "look up the app",
            self._sdk.App.lookup.aio,
            self.app_name,
            create_if_missing=True,
            client=self._client,
        )
        image = image_of(self._sdk, self._image, self._client)
        # A unique name lets a start that fails or is cancelled while the create call is
        # in flight find, and terminate, a sandbox the provider created anyway.
        self._create_name = f"sandbox-pty-{secrets.token_hex(8)}"
        options = dict(self._create_options)
        # The caller's tags, and ours (`SESSION_LABEL`: the caller's value is refused).
        options["tags"] = {**(options.get("tags") or {}), SESSION_LABEL: durable_session_id(self)}
        self._sandbox = await self._errors.timed_call(
            "create the sandbox",
            self.create_timeout_s,
            self._sdk.Sandbox.create.aio,
            app=app,
            name=self._create_name,
            image=image,
            timeout=self.sandbox_timeout_s,
            workdir=self.workdir,
            client=self._client,
            **options,
        )
        self._commands.sandbox = self._sandbox
        self._created = True

    async def _stop_backend(self) -> None:
        """Terminate the sandbox unless kept (also one a failed or cancelled create left
        behind, found by its name), detach, and close the client we opened."""
        sandbox = self._sandbox
        try:
            if not self.keep:
                if sandbox is None and self._create_name is not None:
                    sandbox = await find_created_sandbox(
                        self._sdk, self._errors, self.app_name, self._create_name, self._client
                    )
                if sandbox is not None:
                    await terminate(self._errors, sandbox)
            elif sandbox is not None and self._commands.marked:
                await quietly(
                    self._errors, remove_dir(sandbox, self._commands.state_dir), "removing markers"
                )
            if sandbox is not None:
                await quietly(self._errors, sandbox.detach.aio(), "detaching from the sandbox")
        finally:
            self._sandbox = self._commands.sandbox = None
            self._create_name = None
            client, self._client = self._client, None
            if self._owns_client and client is not None:
                self._owns_client = False
                await quietly(self._errors, client.close.aio(), "closing the Modal client")

    # ---- one-shot commands -------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """One exec (without the wrapper: see `scripts`), stdin closed, both streams read
        chunk by chunk into the bounded capture (see `ModalOneShot`). If this is
        cancelled while the exec is in flight, the tree is killed by its tag (a marker
        stops it should the exec still start)."""
        timeout = capture.timeout  # for the server-side backstop just after it
        command = Command(self._commands, tty=False, keep=self.keep)
        check = capture.check = CommandCheck.needed(spec, cwd=self._commands.cwd(spec.cwd))
        try:
            await self._commands.start(
                spec, command, wrap=False, server_timeout=server_timeout(timeout), check=check
            )
        except BaseException:
            # Nobody else knows this command yet: its kill must outlive a second
            # cancellation (the close cancels this task too).
            await settle(self._commands.control(command, "kill"))
            raise
        return ModalOneShot(
            self._commands,
            command,
            capture,
            display=spec.display,
            timeout=timeout,
            exit_output_grace_s=self.exit_output_grace_s,
        )

    # ---- processes -------------------------------------------------------------------

    async def _spawn_process(self, entry: OutputSink[Command]) -> None:
        """Exec the command under the toolkit's wrapper (`pty=True` for a terminal), then
        one reader task per stream and a watcher task for the exit."""
        spec = entry.spec
        command = Command(self._commands, tty=spec.tty, keep=self.keep)
        entry.handle = command  # from here on, teardown can find (and kill) it by tag
        check = CommandCheck.needed(spec.command, cwd=self._commands.cwd(spec.command.cwd))
        trap = None if check is None else ShellTrap(report_exit=False, token=check.token)
        await self._commands.start(
            spec.command,
            command,
            wrap=True,
            rows=spec.rows,
            cols=spec.cols,
            check=check,
            announce=True,
            keep_stdin=spec.stdin,
        )
        start_tasks(
            entry,
            command,
            self._errors,
            trap,
            exit_output_grace_s=self.exit_output_grace_s,
            exit_status_timeout_s=self.exit_status_timeout_s,
        )
        if check is not None and trap is not None:
            await wait_for_verdict(entry, trap, check)

    async def _terminate_pty_entry(self, entry: OutputSink[Command]) -> None:
        """`Command.kill`: the tree killed by tag, unless the sandbox's deletion right
        after ends it; the reader and watcher tasks stopped either way."""
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
