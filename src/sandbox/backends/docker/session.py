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
    durable_session_id,
    kill_handle,
)
from ...runner import runner_binary
from ..toolkit import (
    RunnerChoice,
    RunnerProcess,
    RunnerReport,
    refuse_renamed,
    spawn_through_runner,
    start_one_shot,
)
from . import durable as durable_docker
from .container import disconnect, exec_options, ready_container, running_container
from .engine import DEFAULT_API_TIMEOUT_S, Engine
from .execs import DockerExec, ExecOptions, KillBatcher
from .files import ContainerFiles, DockerFiles
from .options import DEFAULT_DETACH_KEYS, DEFAULT_KEEPALIVE, TEARDOWN_CONCURRENCY, docker_options
from .ports import DockerPorts, DockerSnapshots
from .processes import DEFAULT_TERM, spawn_exec, start_exec
from .runner_link import ContainerRunner, connect_as_asked, deliver_as_asked
from .workspace import ContainerTree, DockerWorkspace


class DockerSession(RunnerReport, BaseSandboxSession[DockerExec]):
    """Runs commands in a Docker container: a fresh one from `image=`, or a running one
    given by `container=`. The options are documented, and checked, in
    `options.DockerOptions`; plus the base session's options.
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
        runner: bool | None = None,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        options.setdefault("teardown_concurrency", TEARDOWN_CONCURRENCY)
        super().__init__(**options)
        self._docker_options = o = docker_options(
            image=image,
            container=container,
            workdir=workdir,
            user=user,
            env=env,
            memory_limit_bytes=memory_limit_bytes,
            process_limit=process_limit,
            cpu_limit=cpu_limit,
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
            keep=keep,
            api_url=api_url,
            api_version=api_version,
            call_timeout_s=call_timeout_s,
            client=client,
            terminate_grace_s=terminate_grace_s,
            detach_keys=detach_keys,
            runner=runner,
        )
        self.image = image
        self.container_name = container
        self.terminate_grace_s = o.terminate_grace_s
        # Not only the option's: a resume takes it from its ref (`durable`).
        self._keep_container = o.keep
        self._engine: Engine | None = None
        self._created_name: str | None = None
        self._container_id: str | None = None
        self._workdir = "/"
        self._file_owner = (0, 0)
        self._exec_options: ExecOptions | None = None
        self._killer: KillBatcher | None = None
        self._runner: ContainerRunner | None = None
        # Whether processes go through the runner: what the options would pick until the
        # start decides (auto falls back where the container cannot take it, and keeps
        # the per-exec path with a memory limit); not cleared by a close or a detach (a
        # ref made then says what the session used).
        self._runner_choice = RunnerChoice(
            o.runner, predicted=o.spec.memory_limit_bytes is None and runner_binary() is not None
        )

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
        """Connect, create or find the container (`container.running_container`), watch
        its events and probe it (`container.ready_container`), start the runner as the
        `runner` option asks (`runner_link.deliver_as_asked`, `connect_as_asked`)."""
        o = self._docker_options
        self._created_name = None
        self._killer = None
        self._engine = engine = Engine(
            base_url=o.api_url,
            api_version=o.api_version,
            api_timeout=o.call_timeout_s,
            client=o.client,
        )
        await engine.connect()
        info = await running_container(
            engine,
            self.image,
            self.container_name,
            o.spec,
            self._claim,
            durable_session_id(self),
        )
        self._exec_options = options = exec_options(info, o)
        self._container_id, self._workdir = options.container_id, options.workdir
        self._killer = KillBatcher(engine, options)
        self._file_owner = await ready_container(
            engine, options, self._file_owner, o.call_timeout_s
        )
        # (Run alongside the probe, the delivery saved nothing measurable on a loaded
        # 2-core machine: the engine and the read-back's hashing compete for the CPU.)
        delivered = await deliver_as_asked(engine, options, o.runner)
        image_env = (info.get("Config") or {}).get("Env")
        self._runner, reason = await connect_as_asked(
            delivered, engine, options, image_env, o.runner
        )
        self._runner_choice.record(self._runner, reason)

    def _claim(self, name: str) -> None:
        """The container `name` may exist from now on: `_stop_backend` removes it."""
        self._created_name = name

    async def _stop_backend(self) -> None:
        """Wait for calls in flight, remove a created container (by name, so one whose
        creation was cancelled goes too), close the engine connection
        (`container.disconnect`)."""
        engine = self._engine
        if engine is None:
            return
        runner, self._runner = self._runner, None
        remove = None if self._keep_container else self._created_name
        await disconnect(engine, runner, self._killer, remove=remove)

    # ---- helpers -----------------------------------------------------------------------

    def _require_engine(self) -> tuple[Engine, ExecOptions]:
        assert self._engine is not None and self._exec_options is not None
        return self._engine, self._exec_options

    def _cwd(self, cwd: str | None) -> str | None:
        if cwd is None:
            return None
        return posixpath.normpath(posixpath.join(self._workdir, cwd))

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
        cwd = self._cwd(spec.cwd)
        return await start_exec(engine, options, self._killer, spec, capture, cwd=cwd)

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
        cwd = self._cwd(spec.command.cwd)
        await spawn_exec(
            entry, engine, options, self._killer, cwd=cwd, grace_s=self.terminate_grace_s
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
