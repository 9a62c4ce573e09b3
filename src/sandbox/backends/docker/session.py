"""The `docker` backend: commands and PTYs in a Docker container, via the docker SDK.

A session either creates a fresh container from an `image` (removed on close) or attaches
to a running `container` (left running on close). Every process is an exec; its hijacked
socket is read by the event loop (no thread per process), its exit comes from the
container's event stream, and its tree is killed by a second exec (Docker has no
kill-exec call). The parts live beside this module (see the package docstring).

Commands need a POSIX `sh` in the image; interrupt and terminate (the kill script)
also `grep`, `kill` and `sleep` (busybox is enough); `stty` sets the initial terminal
size of tty processes when there is one. The file API runs nothing in the container.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ...backend import (
    BaseSandboxSession,
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    ShellFileOps,
    check_env,
    check_seconds,
    check_str,
    durable_session_id,
    kill_handle,
)
from ...errors import InvalidArgumentError, UnsupportedOperationError
from ..toolkit import (
    CommandCheck,
    RunnerProcess,
    refuse_renamed,
    spawn_through_runner,
    start_one_shot,
)
from . import durable as durable_docker
from .container import (
    DEFAULT_KEEPALIVE,
    container_spec,
    probe,
    remove_container,
    running_container,
)
from .engine import DEFAULT_API_TIMEOUT_S, Engine
from .execs import DockerExec, ExecOptions, KillBatcher
from .files import ContainerFiles, DockerFiles
from .ports import DockerPorts, DockerSnapshots
from .processes import check_half_close, spawn_exec, start_exec
from .runner_link import ContainerRunner
from .workspace import ContainerTree, DockerWorkspace

logger = logging.getLogger("sandbox.docker")

DEFAULT_TERM = "xterm-256color"
# Docker always has detach keys on a tty exec (a lone first key is held back until the
# next keystroke): use a sequence nobody types by accident.
DEFAULT_DETACH_KEYS = "ctrl-^,ctrl-@,ctrl-^,ctrl-@"
TEARDOWN_CONCURRENCY = 64


class DockerSession(BaseSandboxSession[DockerExec]):
    """Runs commands in a Docker container.

    Exactly one of:
    - `image`: create and start a fresh container from this local image (removed on
      close unless `keep=True`); `pull=True` pulls it when missing;
    - `container`: attach to this running container (name or id), left running.

    Options: `workdir` (default: the image's working directory, created if missing),
    `user`, `env` (added to every command), `terminate_grace_s` (SIGTERM to SIGKILL,
    default 1 s). For created containers only (with `container=` they raise
    `UnsupportedOperationError`: a container we do not own keeps its own limits):
    `memory_limit_bytes` (memory and swap together; a process the limit kills exits
    137 with a note on its output), `process_limit` (the container's pids limit, which
    counts its init, keepalive and our wrapper shells too), `cpu_limit` (cores, a
    float). Also `network_mode` (default: the engine's default; "none" cuts the
    network) or `network` (bool), `volumes` (the SDK's `binds` format: host paths
    are mounted only when asked), `privileged` (default False), `init` (a tiny init
    reaps orphans, default True), `keepalive_command`, `labels`, `name_prefix`,
    `ports` (container ports published on the host's loopback at create, for
    `expose_port`). `snapshot=` (through `open_session`): a fresh container from a
    `snapshot()`'s committed image.
    Engine: `api_url` (the engine's address, Docker's `base_url`; default: DOCKER_HOST /
    the local socket), `api_version`, `call_timeout_s` (bound on each engine call), or a
    ready `client` (a `docker.APIClient`, not closed here).
    `runner=True`: processes and commands go through the runner (docs/runner.md), put
    into the container at start: one frame per start instead of an exec, stdin open
    or closed, whole-tree kills without a script, output kept in a ring by the runner.
    Plus the base session's options.
    """

    backend_name = "docker"
    # Both handles (`DockerExec`, `RunnerProcess`) end an open stdin: `close_stdin`.
    _stdin_stays_open = True

    def __init__(
        self,
        *,
        image: str | None = None,
        container: str | None = None,
        workdir: str | None = None,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        memory_limit_bytes: int | None = None,
        process_limit: int | None = None,
        cpu_limit: float | None = None,
        network_mode: str | None = None,
        network: bool | None = None,
        volumes: Mapping[str, Any] | Sequence[str] | None = None,
        privileged: bool = False,
        init: bool = True,
        pull: bool = False,
        keepalive_command: Sequence[str] = DEFAULT_KEEPALIVE,
        labels: Mapping[str, str] | None = None,
        name_prefix: str = "sandbox",
        ports: Sequence[int] = (),
        keep: bool = False,
        api_url: str | None = None,
        api_version: str | None = None,
        call_timeout_s: float = DEFAULT_API_TIMEOUT_S,
        client: Any = None,
        terminate_grace_s: float = 1.0,
        detach_keys: str = DEFAULT_DETACH_KEYS,
        runner: bool = False,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        # Kills that happen together are merged into one exec (see KillBatcher), so a
        # terminate-all tears every process down at once instead of 8 at a time.
        options.setdefault("teardown_concurrency", TEARDOWN_CONCURRENCY)
        super().__init__(**options)
        if (image is None) == (container is None):
            raise InvalidArgumentError(
                "the docker backend needs exactly one of image= (start a fresh container) "
                "or container= (attach to a running one)"
            )
        for label, value in (("image", image), ("container", container)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise InvalidArgumentError(f"{label} must be a non-empty str")
        self._spec = container_spec(
            workdir=workdir,
            user=user or "",
            memory_limit_bytes=memory_limit_bytes,
            cpu_limit=cpu_limit,
            process_limit=process_limit,
            network_mode=network_mode,
            network=network,
            volumes=volumes,
            privileged=privileged,
            init=init,
            pull=pull,
            keepalive_command=keepalive_command,
            labels=labels,
            name_prefix=name_prefix,
            ports=ports,
        )
        limits = {
            "memory_limit_bytes": memory_limit_bytes,
            "process_limit": process_limit,
            "cpu_limit": cpu_limit,
        }
        if container is not None and (given := [k for k, v in limits.items() if v is not None]):
            raise UnsupportedOperationError(
                f"{', '.join(given)}: limits apply only to a container the session creates "
                "(image=), not to an attached one (container=)"
            )
        grace = check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
        timeout = check_seconds("call_timeout_s", call_timeout_s)
        for name, text in (
            ("user", user or None),  # "" is the image's user, as None
            ("api_url", api_url),
            ("api_version", api_version),
            ("detach_keys", detach_keys),
        ):
            check_str(name, text)
        env = check_env(env)
        self.image = image
        self.container_name = container
        assert grace is not None and timeout is not None
        self.terminate_grace_s = grace
        self._user = user or ""
        self._env = dict(env or {})
        self._keep_container = bool(keep)
        self._base_url = api_url
        self._api_version = api_version
        self._api_timeout = timeout
        self._client = client
        self._detach_keys = detach_keys
        self._engine: Engine | None = None
        self._created_name: str | None = None
        self._container_id: str | None = None
        self._workdir = "/"
        self._file_owner = (0, 0)
        self._exec_options: ExecOptions | None = None
        self._killer: KillBatcher | None = None
        self._use_runner = bool(runner)
        self._runner: ContainerRunner | None = None

    @property
    def container_id(self) -> str | None:
        """The id of the session's container (after start)."""
        return self._container_id

    @property
    def workdir(self) -> str:
        """The working directory of commands (after start)."""
        return self._workdir

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        """Connect, create or find the container, watch its events, probe it."""
        self._created_name = None
        self._killer = None
        self._engine = engine = Engine(
            base_url=self._base_url,
            api_version=self._api_version,
            api_timeout=self._api_timeout,
            client=self._client,
        )
        await engine.connect()
        info = await running_container(
            engine,
            self.image,
            self.container_name,
            self._spec,
            self._claim,
            durable_session_id(self),
        )
        self._container_id = str(info["Id"])
        config = info.get("Config") or {}
        self._workdir = posixpath.normpath(self._spec.workdir or config.get("WorkingDir") or "/")
        self._exec_options = ExecOptions(
            container_id=self._container_id,
            user=self._user,
            env=self._env,
            workdir=self._workdir,
            detach_keys=self._detach_keys,
            memory_limited=self._spec.memory_limit_bytes is not None,
        )
        self._killer = KillBatcher(engine, self._exec_options)
        await engine.watch(self._container_id)
        probed = await probe(engine, self._exec_options, self._workdir, self._api_timeout)
        if probed.owner is not None:
            self._file_owner = probed.owner
        if not probed.workdir_made:
            # No `mkdir` in the image (or it failed): through the archive endpoint.
            await self._files().make_folder(self._workdir)
        if self._use_runner:
            self._runner = await ContainerRunner.start(
                engine, self._exec_options, config.get("Env")
            )

    def _claim(self, name: str) -> None:
        """The container `name` may exist from now on: `_stop_backend` removes it."""
        self._created_name = name

    async def _stop_backend(self) -> None:
        """Wait for calls in flight, remove a created container (by name, so one whose
        creation was cancelled goes too), close the engine connection."""
        engine = self._engine
        if engine is None:
            return
        try:
            if self._runner is not None:
                runner, self._runner = self._runner, None
                await runner.aclose()
            if self._killer is not None:
                await self._killer.settle()
            await engine.settle_calls()
            engine.stop_events()
            if self._created_name is not None and not self._keep_container:
                await remove_container(engine, self._created_name)
        finally:
            await engine.close()

    # ---- helpers -----------------------------------------------------------------------

    def _require_engine(self) -> tuple[Engine, ExecOptions]:
        assert self._engine is not None and self._exec_options is not None
        return self._engine, self._exec_options

    def _cwd(self, cwd: str | None) -> str | None:
        if cwd is None:
            return None
        return posixpath.normpath(posixpath.join(self._workdir, cwd))

    def _environment(self, spec: CommandSpec, *, tty: bool) -> dict[str, str]:
        env = dict(spec.env or {})
        if tty and "TERM" not in env and "TERM" not in self._env:
            env["TERM"] = DEFAULT_TERM
        return env

    # ---- commands ----------------------------------------------------------------------

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """One exec on pipes, stdout and stderr kept apart (`processes.start_exec`); the
        base session waits, times out and kills the tree through the kill script (see
        `DockerOneShot`). A `cwd` or `shell=False` runs behind the command check."""
        engine, options = self._require_engine()
        if self._runner is not None:
            return await start_one_shot(
                self._runner.client,
                spec,
                capture,
                env=self._runner.environment(spec.env, tty=False, term=DEFAULT_TERM),
                cwd=self._cwd(spec.cwd) or self._workdir,
            )
        argv, cwd, capture.check = self._checked(spec, announce=False)
        env = self._environment(spec, tty=False)
        return await start_exec(engine, options, self._killer, argv, capture, cwd=cwd, env=env)

    def _checked(
        self, spec: CommandSpec, *, announce: bool
    ) -> tuple[Sequence[str], str | None, CommandCheck | None]:
        """The argv and working directory of the exec, and the command check they run
        (None when there is no `cwd` and a shell runs the command). With a check the
        exec starts in the session's directory and the check changes to `cwd`: the
        engine would otherwise fail the exec itself (exit 126/127, its error as output).
        """
        check = CommandCheck.needed(spec, cwd=self._cwd(spec.cwd))
        if check is None:
            return spec.argv, self._cwd(spec.cwd), None
        return check.argv(spec.argv, announce=announce), None, check

    async def _spawn_process(self, entry: OutputSink[DockerExec]) -> None:
        """Start an attached exec whose socket feeds the entry (no thread), its handle a
        `DockerExec` (`processes.spawn_exec`); with a command check, wait for its
        verdict. With the runner: the runner's process (`RunnerProcess`)."""
        spec = entry.spec
        if self._runner is not None:
            await spawn_through_runner(
                self._runner.client,
                cast(OutputSink[RunnerProcess], entry),
                env=self._runner.environment(spec.command.env, tty=spec.tty, term=DEFAULT_TERM),
                cwd=self._cwd(spec.command.cwd) or self._workdir,
                grace_s=self.terminate_grace_s,
            )
            return
        engine, options = self._require_engine()
        if spec.stdin:
            check_half_close(engine)
        argv, cwd, check = self._checked(spec.command, announce=True)
        await spawn_exec(
            entry,
            engine,
            options,
            self._killer,
            argv,
            cwd=cwd,
            env=self._environment(spec.command, tty=spec.tty),
            check=check,
            grace_s=self.terminate_grace_s,
        )

    async def _terminate_pty_entry(self, entry: OutputSink[DockerExec]) -> None:
        """Kill the tree (grace, then SIGKILL), close the socket: the handle's `kill`.
        Even on a close: an attached or kept container outlives the session."""
        await kill_handle(entry)

    # ---- capabilities (`sandbox.backend.Capability`: each made with the session) ----

    _file_access = DockerFiles
    _workspace_access = DockerWorkspace
    _ports = DockerPorts
    _snapshots = DockerSnapshots
    _durability = durable_docker.DockerDurability

    # ---- what the capabilities use ---------------------------------------------------

    def _files(self) -> ContainerFiles:
        engine, options = self._require_engine()
        return ContainerFiles(engine, options.container_id, self._workdir, self._file_owner)

    def _tree(self) -> ContainerTree:
        engine, options = self._require_engine()
        return ContainerTree(engine, options.container_id, self._workdir, self._file_owner)

    def _shell_ops(self) -> ShellFileOps:
        return ShellFileOps(self.exec, self._workdir)
