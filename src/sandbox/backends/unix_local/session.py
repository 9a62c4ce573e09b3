"""The `unix_local` backend: processes on this machine, PTYs from `openpty`.

No thread per process or per read: output fds are read with event-loop readers and exits
are seen through pidfds (see `sandbox.local.process`). The session's folder, its
workspace (`workdir`, or a temporary one removed on close), is every command's cwd and
HOME. Its options are in `options`; what a command runs as (argv, environment, cwd),
in `commands`; how it starts, in `processes` (on this host) and `runner_link` (through
the runner); the jail, in `confine`; the cgroup and its limits, in `cgroup_limits`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from ...backend import (
    BaseSandboxSession,
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    Process,
    kill_handle,
)
from ...local import cgroups
from ...local import tree as process_tree
from ...local.readiness import ReadinessHub
from ...runner import RunnerClient
from ..toolkit import CommandCheck, ShellTrap, refuse_renamed, start_one_shot, wait_for_verdict
from . import cgroup_limits, local_files, processes, runner_link
from . import confine as jail
from . import durable as durable_local
from .cgroup_limits import MEMORY_NOTE, PROCESS_NOTE
from .commands import LocalCommands
from .handle import LocalHandle
from .options import CONTAINMENTS, check_options
from .processes import DEFAULT_TERM
from .workspace import LocalPorts, LocalWorkspace, Workspace

__all__ = ["CONTAINMENTS", "DEFAULT_TERM", "MEMORY_NOTE", "PROCESS_NOTE", "UnixLocalSession"]


class UnixLocalSession(BaseSandboxSession[Process]):
    """Runs commands as local processes, unconfined or in a bubblewrap jail, directly
    or through the local runner (a detachable session).

    Its options (`workdir`, `env`, `inherit_env`, `terminate_grace_s`, `confine`,
    `network`, `readonly_paths`, `containment`, the cgroup limits, `runner`) are
    documented, with their defaults and checks, in
    `sandbox.backends.unix_local.options.LocalOptions`.
    """

    backend_name = "unix_local"

    def __init__(
        self,
        *,
        workdir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        inherit_env: bool | None = None,
        terminate_grace_s: float = 1.0,
        confine: bool = False,
        network: bool = False,
        readonly_paths: Sequence[str | os.PathLike[str]] = (),
        containment: str = "auto",
        memory_limit_bytes: int | None = None,
        process_limit: int | None = None,
        cpu_limit: float | None = None,
        runner: bool = False,
        **options: Any,
    ) -> None:
        refuse_renamed(type(self), options)
        super().__init__(**options)
        settings = check_options(
            workdir=workdir,
            env=env,
            inherit_env=inherit_env,
            terminate_grace_s=terminate_grace_s,
            confine=confine,
            network=network,
            readonly_paths=readonly_paths,
            containment=containment,
            memory_limit_bytes=memory_limit_bytes,
            process_limit=process_limit,
            cpu_limit=cpu_limit,
            runner=runner,
        )
        # Every process of this session carries a tag within this one (see
        # `process_tree`): what escaped its own tree is still found when the session stops.
        self._session_tag = process_tree.new_session_tag()
        self.terminate_grace_s = settings.terminate_grace_s
        self.confine = settings.confine
        self.network = settings.network
        # The session's folder lives here, where its commands find it (a resume adopts
        # the ref's: `LocalDurability.resume`).
        self._commands = LocalCommands(
            Workspace(workdir),
            env=settings.env,
            inherit_env=settings.inherit_env,
            confine=settings.confine,
            network=settings.network,
            readonly_paths=settings.readonly_paths,
        )
        self.containment = settings.containment
        self._limits = settings.limits
        self._cgroup: cgroups.SessionCgroup | None = None
        self._applied: cgroup_limits.AppliedLimits | None = None
        self._readers: ReadinessHub | None = None  # from the start to the stop
        self.runner = settings.runner
        self._runner: RunnerClient | None = None  # from the start to the stop (runner)

    @property
    def _workspace(self) -> Workspace:
        return self._commands.workspace

    @property
    def workdir(self) -> str:
        """The session's folder, its workspace (after start)."""
        return self._workspace.path

    @property
    def limits_enforced(self) -> dict[str, str]:
        """After start: each limit option in force and how ("cgroup v2" or "cgroup v1")."""
        return {} if self._applied is None else dict(self._applied.enforced)

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        if self.confine:
            self._commands.enter_jail(await asyncio.to_thread(jail.require_bwrap))
        self._workspace.create()
        if self.confine:
            jail.check_workspace(self._workspace.path)
        if self.runner:
            # The runner contains its processes itself: no cgroup of the session's own.
            self._runner = await runner_link.connect()
            return
        # The cgroup and its limits in one synchronous step: a cancelled start leaves
        # nothing half made for `_stop_backend`.
        self._cgroup, self._applied = cgroup_limits.make_session_cgroup(
            self.containment, self._limits
        )
        self.containment = "tag" if self._cgroup is None else "cgroup"
        self._readers = ReadinessHub(asyncio.get_running_loop())

    def _close_readers(self) -> None:
        """Close the hub (at the stop or the detach: every process is torn down)."""
        readers, self._readers = self._readers, None
        if readers is not None:
            readers.close()

    async def _close_runner(self) -> None:
        """Close the connection to the runner (its processes were torn down, or are
        left to it by a detach); the daemon stays for other sessions."""
        client, self._runner = self._runner, None
        if client is not None:
            await client.aclose()

    async def _stop_backend(self) -> None:
        self._close_readers()
        cgroup, self._cgroup = self._cgroup, None
        if self.runner:
            # Every process's tree was ended through the runner by its teardown.
            await self._close_runner()
        elif cgroup is not None:
            # Everything the session started is in its cgroup: one write kills it all.
            await cgroup_limits.remove_session_cgroup(cgroup)
        else:
            # Last, what escaped every tree: a one-shot command's daemon (a one-shot
            # command that ended by itself only had its group killed), a setsid child.
            escaped = await asyncio.to_thread(process_tree.kill_session, self._session_tag)
            await process_tree.wait_gone(escaped)
        applied, self._applied = self._applied, None
        if applied is not None:
            applied.remove()
        await asyncio.to_thread(self._workspace.cleanup)

    def _placement(self) -> dict[str, Any]:
        """Where a new process goes: the session's cgroup, and the v1 limit groups; what
        watches its fds (the session's hub); and the tag it carries within the session's."""
        return {
            "tag": process_tree.new_tag(self._session_tag),
            "cgroup": self._cgroup,
            "join_fds": () if self._applied is None else self._applied.join_fds,
            "readers": self._readers,
        }

    def _memory_note(self, code: int) -> bytes:
        """The note a process killed by the memory limit gets, or one that failed after
        the process limit refused it a fork (b"" otherwise)."""
        return cgroup_limits.exit_note(self._applied, code)

    # ---- commands ------------------------------------------------------------------

    def _require_runner(self) -> RunnerClient:
        assert self._runner is not None, "a runner session runs commands only once started"
        return self._runner

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """Pipes read by the event loop straight into the bounded capture; the base
        session waits, times out and kills (see `LocalOneShot`)."""
        commands = self._commands
        command, capture.check = commands.checked(spec, announce=False)
        env = commands.environment(command, tty=False)
        if self.runner:
            started, cwd = commands.for_runner(command)
            return await start_one_shot(self._require_runner(), started, capture, env=env, cwd=cwd)
        return processes.start_one_shot(
            spec,
            capture,
            argv=commands.argv(command),
            env=env,
            cwd=commands.cwd(command),
            error_cwd=commands.cwd(spec),
            placement=self._placement(),
            note=self._memory_note,
        )

    def _spawn_process(self, entry: OutputSink[Process]) -> Awaitable[None] | None:
        """A local child on a PTY or pipes (`LocalHandle`): one synchronous clone, done
        here without a task (None). What must be awaited is returned instead: in the
        jail, the command check's verdict when a `cwd` (or no shell) needs one; with the
        runner, all of the runner's spawn (`runner_link.spawn`)."""
        commands = self._commands
        command, check = commands.checked(entry.spec.command, announce=True)
        trap = None if check is None else ShellTrap(report_exit=False, token=check.token)
        if self.runner:
            return self._spawn_through_runner(entry, command, trap, check)
        spec = entry.spec
        processes.spawn(
            entry,
            trap,
            argv=commands.argv(command),
            env=commands.environment(command, tty=spec.tty),
            cwd=commands.cwd(command),
            error_cwd=commands.cwd(spec.command),
            placement=self._placement(),
            note=None if self._applied is None else self._memory_note,
            grace_s=self.terminate_grace_s,
        )
        if trap is None or check is None:
            return None
        return wait_for_verdict(entry, trap, check)

    async def _spawn_through_runner(
        self,
        entry: OutputSink[Process],
        command: CommandSpec,
        trap: ShellTrap | None,
        check: CommandCheck | None,
    ) -> None:
        """Start `command` (the entry's, checked) through the runner (what it starts and
        where, worked out when awaited), then wait for the check's verdict if any."""
        started, cwd = self._commands.for_runner(command)
        await runner_link.spawn(
            self._require_runner(),
            entry,
            started,
            trap,
            check,
            env=self._commands.environment(command, tty=entry.spec.tty),
            cwd=cwd,
            grace_s=self.terminate_grace_s,
        )

    async def _terminate_pty_entry(self, entry: OutputSink[Process]) -> None:
        """The handle's kill: the runner's (it ends the whole tree, being its
        subreaper), or the local tree's (`LocalHandle.kill`)."""
        await kill_handle(entry)

    def _abandon(self, entries: Sequence[OutputSink[Process]]) -> None:
        """Garbage-collected unclosed: SIGKILL every process tree (the workspace stays).
        A runner's processes are left to it: its connection ends with this client, and
        its orphan policy ends what no client comes back for."""
        for entry in entries:
            handle = entry.handle
            if isinstance(handle, LocalHandle):
                handle.kill_now()
        if self._cgroup is not None:
            self._cgroup.kill()  # its directories stay until a later session cleans them
            self._cgroup.close_files()
        else:
            process_tree.kill_session(self._session_tag)

    # Both handles can keep the stdin of a process on pipes open (`close_stdin`).
    _stdin_stays_open = True

    # ---- capabilities (`sandbox.backend.Capability`: each made with the session) ----

    _file_access = local_files.LocalFiles
    _workspace_access = LocalWorkspace
    _ports = LocalPorts
    _durability = durable_local.LocalDurability
