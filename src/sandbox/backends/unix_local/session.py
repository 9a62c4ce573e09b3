"""The `unix_local` backend: processes on this machine, PTYs from `openpty`.

No thread per process or per read: output fds are read with event-loop readers and exits
are seen through pidfds (see `sandbox.local.process`). The session's folder, its
workspace (`workdir`, or a temporary one removed on close), is every command's cwd and
HOME.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, cast

from ...backend import (
    BaseSandboxSession,
    CommandSpec,
    ExecCapture,
    OneShotProcess,
    OutputSink,
    Process,
    check_env,
    check_seconds,
    kill_handle,
)
from ...errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    SandboxError,
    UnsupportedOperationError,
)
from ...local import cgroups
from ...local import tree as process_tree
from ...local.host_env import host_environment
from ...local.process import LocalProcess
from ...local.readiness import ReadinessHub
from ...runner import RunnerClient, RunnerError, connect_local
from ..toolkit import (
    CommandCheck,
    RunnerProcess,
    ShellTrap,
    refuse_renamed,
    spawn_through_runner,
    start_one_shot,
    wait_for_verdict,
)
from . import cgroup_limits, local_files
from . import confine as jail
from . import durable as durable_local
from .handle import LocalHandle, LocalOneShot
from .workspace import LocalPorts, LocalWorkspace, Workspace

DEFAULT_TERM = "xterm-256color"


CONTAINMENTS = ("auto", "cgroup", "tag")
MEMORY_NOTE = b"\n[sandbox: killed by the session's memory limit (memory_limit_bytes)]\n"
PROCESS_NOTE = b"\n[sandbox: the session's process limit (process_limit) refused a new process]\n"


class UnixLocalSession(BaseSandboxSession[Process]):
    """Runs commands as local processes.

    Options: `workdir` (a directory; default a temporary one removed on close), `env`
    (variables added to every command), `inherit_env` (start from this process's
    environment; default True, but False when confined), `terminate_grace_s` (time
    between the polite signals and SIGKILL when terminating, default 1 s), plus the base
    session's options.

    Confinement (Linux, needs bubblewrap; see `backends.unix_local.confine`): `confine=True` runs
    every process in a jail where the workspace (same path as on the host, and HOME) is
    the only writable host directory, the system is read-only and everything else is
    hidden; `network=True` keeps the host's network inside it (off by default);
    `readonly_paths` shows more host paths read-only (e.g. a toolchain in your home).
    Without bubblewrap, `start()` raises `BackendUnavailableError`: it never runs
    unconfined instead. Unconfined sessions ignore `network` and `readonly_paths`.

    `runner=True` (a detachable session): processes and one-shot commands are started
    by this user's local runner daemon (docs/runner.md; started on first use, found
    again through its private socket), with the same argv, environment, cwd and jail
    as without it. They outlive this client: `detach()` leaves them running and
    `resume_session` reattaches them with what they printed meanwhile
    (`keeps_processes`). The close ends them as usual. The runner contains each tree
    itself, so `containment` stays "auto" and the cgroup limits are refused.
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
        # Every option is checked here, when the session is opened: a bad one must not
        # surface later as a raw TypeError in a teardown.
        if workdir is not None:
            _check_workdir_option(workdir)
        for name, flag in (
            ("inherit_env", inherit_env),
            ("confine", confine),
            ("network", network),
            ("runner", runner),
        ):
            if not isinstance(flag, bool) and not (name == "inherit_env" and flag is None):
                raise InvalidArgumentError(f"{name} must be a bool, not {flag!r}")
        if isinstance(readonly_paths, str | bytes) or not all(
            isinstance(p, str | os.PathLike) for p in readonly_paths
        ):
            raise InvalidArgumentError("readonly_paths must be a list of paths")
        self._workspace = Workspace(workdir)
        # Every process of this session carries a tag within this one (see
        # `process_tree`): what escaped its own tree is still found when the session stops.
        self._session_tag = process_tree.new_session_tag()
        self._env = check_env(env) or {}
        # A jail that hides ~/.aws but hands over AWS_SECRET_ACCESS_KEY would be theatre:
        # confined sessions start from a small allow-list unless told otherwise.
        self._inherit_env = (not confine) if inherit_env is None else inherit_env
        grace = check_seconds("terminate_grace_s", terminate_grace_s, allow_zero=True)
        assert grace is not None
        self.terminate_grace_s = grace
        self.confine = confine
        self.network = network
        self._readonly_request = [os.fspath(p) for p in readonly_paths]
        self._readonly_paths: list[str] = []
        self._bwrap: str | None = None
        if containment not in CONTAINMENTS:
            raise InvalidArgumentError(
                f"containment must be one of {', '.join(CONTAINMENTS)}, not {containment!r}"
            )
        self.containment = containment
        self._limits = cgroup_limits.check_limit_options(
            memory_limit_bytes, process_limit, cpu_limit
        )
        self._cgroup: cgroups.SessionCgroup | None = None
        self._applied: cgroup_limits.AppliedLimits | None = None
        self._readers: ReadinessHub | None = None  # from the start to the stop
        if runner:
            _check_runner_options(containment, self._limits)
        self.runner = runner
        self._runner: RunnerClient | None = None  # from the start to the stop (runner)

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
            self._bwrap = await asyncio.to_thread(jail.require_bwrap)
            self._readonly_paths = jail.check_readonly_paths(self._readonly_request)
        self._workspace.create()
        if self.confine:
            jail.check_workspace(self._workspace.path)
        if self.runner:
            # The runner contains its processes itself (a subreaper, a cgroup leaf per
            # process where it can make one): the session makes no cgroup of its own.
            try:
                self._runner = await connect_local()
            except RunnerError as exc:
                raise BackendUnavailableError(f"runner=True but {exc}") from None
            return
        self._make_cgroups()
        self._readers = ReadinessHub(asyncio.get_running_loop())

    def _make_cgroups(self) -> None:
        """The session's cgroup (per `containment`) and its limits, in one synchronous
        step: a cancelled start leaves nothing half made for `_stop_backend`."""
        if self.containment != "tag":
            try:
                self._cgroup = cgroups.SessionCgroup.create()
            except (cgroups.CgroupUnavailable, OSError) as exc:
                if self.containment == "cgroup":
                    raise BackendUnavailableError(
                        f"containment='cgroup' but no cgroup can be made here: {exc}"
                    ) from None
        self.containment = "tag" if self._cgroup is None else "cgroup"
        if self._limits.wanted():
            self._applied = cgroup_limits.apply(self._limits, self._cgroup)

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
            cgroup.kill()
            await cgroup.wait_empty()
            cgroup.remove()
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
        """Where a new process goes: the session's cgroup, and the v1 limit groups; and
        what watches its fds (the session's hub)."""
        return {
            "cgroup": self._cgroup,
            "join_fds": () if self._applied is None else self._applied.join_fds,
            "readers": self._readers,
        }

    def _memory_note(self, code: int) -> bytes:
        """The note a process killed by the memory limit gets, or one that failed after
        the process limit refused it a fork (b"" otherwise)."""
        if code == 137 and self._applied is not None and self._applied.memory_killed():
            return MEMORY_NOTE
        if code != 0 and self._applied is not None and self._applied.process_limit_hit():
            return PROCESS_NOTE
        return b""

    # ---- commands ------------------------------------------------------------------

    def _environment(self, spec: CommandSpec, *, tty: bool) -> dict[str, str]:
        if self._inherit_env:
            env = host_environment()
        else:
            env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}
            if self.confine:
                env.update((k, v) for k, v in os.environ.items() if _is_locale_or_identity(k))
        env.update(self._env)
        env["HOME"] = self._workspace.path
        if self.confine:
            env["TMPDIR"] = "/tmp"  # the host's TMPDIR is not visible in the jail
        env["PWD"] = self._workspace.cwd_for(spec.cwd)
        if tty:
            env.setdefault("TERM", DEFAULT_TERM)
        if spec.env:
            env.update(spec.env)
        return env

    def _argv(self, spec: CommandSpec) -> list[str]:
        """The argv actually executed (a hook for wrappers such as a jail)."""
        if not self.confine:
            return list(spec.argv)
        assert self._bwrap is not None, "a confined session runs commands only once started"
        return jail.jail_argv(
            spec.argv,
            bwrap=self._bwrap,
            workspace=self._workspace.path,
            cwd=self._workspace.cwd_for(spec.cwd),
            network=self.network,
            readonly_paths=self._readonly_paths,
        )

    def _require_runner(self) -> RunnerClient:
        assert self._runner is not None, "a runner session runs commands only once started"
        return self._runner

    def _runner_command(self, command: CommandSpec) -> tuple[CommandSpec, str]:
        """The command the runner starts (the jail's argv when confined: `command` is
        then the checked one) and its cwd on the host. Unconfined, the runner reports a
        missing cwd or program itself; in the jail, bwrap changes into the cwd."""
        cwd = self._workspace.cwd_for(command.cwd)
        if not self.confine:
            return command, cwd
        return dataclasses.replace(command, argv=tuple(self._argv(command))), self.workdir

    async def _start_exec(self, spec: CommandSpec, capture: ExecCapture) -> OneShotProcess:
        """Pipes read by the event loop straight into the bounded capture; the base
        session waits, times out and kills (see `LocalOneShot`)."""
        command, capture.check = self._checked_command(spec, announce=False)
        if self.runner:
            started, cwd = self._runner_command(command)
            return await start_one_shot(
                self._require_runner(),
                started,
                capture,
                env=self._environment(command, tty=False),
                cwd=cwd,
            )
        try:
            proc = LocalProcess.spawn(
                self._argv(command),
                tty=False,
                env=self._environment(command, tty=False),
                cwd=self._workspace.cwd_for(command.cwd),
                on_stdout=capture.add_stdout,
                on_stderr=capture.add_stderr,
                tag=process_tree.new_tag(self._session_tag),
                **self._placement(),
            )
        except OSError as exc:
            raise _start_error(spec, self._workspace.cwd_for(spec.cwd), exc) from None
        return LocalOneShot(proc, capture, self._memory_note)

    def _spawn_process(self, entry: OutputSink[Process]) -> Awaitable[None] | None:
        """A local child on a PTY or pipes (`LocalHandle`): one synchronous clone, done
        here without a task (None). What must be awaited is returned instead: in the
        jail, the command check's verdict when a `cwd` (or no shell) needs one; with the
        runner, all of the runner's spawn (`RunnerProcess`)."""
        command, check = self._checked_command(entry.spec.command, announce=True)
        trap = None if check is None else ShellTrap(report_exit=False, token=check.token)
        if self.runner:
            return self._spawn_through_runner(entry, command, trap, check)
        self._spawn_local(entry, command, trap)
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
        """Start `command` (the entry's, checked) through the runner, then wait for the
        check's verdict if it has one."""
        started, cwd = self._runner_command(command)
        await spawn_through_runner(
            self._require_runner(),
            cast(OutputSink[RunnerProcess], entry),
            env=self._environment(command, tty=entry.spec.tty),
            cwd=cwd,
            argv=started.argv,
            shown=None if trap is None else trap.feed,
            grace_s=self.terminate_grace_s,
        )
        if trap is not None and check is not None:
            await wait_for_verdict(entry, trap, check)

    def _spawn_local(
        self, entry: OutputSink[Process], command: CommandSpec, trap: ShellTrap | None
    ) -> None:
        """Start `command` (the entry's, checked) as the entry's `LocalProcess`."""
        spec = entry.spec

        def on_stdout(data: bytes) -> None:
            # Only with a check: the trap strips its start marker (nothing precedes it).
            shown = data if trap is None else trap.feed(data)
            if shown:
                entry.feed(shown)

        def on_exit(code: int) -> None:
            note = self._memory_note(code)
            if note:
                entry.feed(note)
            entry.report_exit(code)

        try:
            process = LocalProcess.spawn(
                self._argv(command),
                tty=spec.tty,
                env=self._environment(command, tty=spec.tty),
                cwd=self._workspace.cwd_for(command.cwd),
                rows=spec.rows,
                cols=spec.cols,
                stdin=spec.stdin,
                on_stdout=entry.feed if trap is None else on_stdout,
                on_exit=entry.report_exit if self._applied is None else on_exit,
                on_eof=entry.report_eof,
                tag=process_tree.new_tag(self._session_tag),
                **self._placement(),
            )
        except OSError as exc:
            raise _start_error(
                spec.command, self._workspace.cwd_for(spec.command.cwd), exc
            ) from None
        entry.handle = LocalHandle(process, entry, grace_s=self.terminate_grace_s)

    def _checked_command(
        self, spec: CommandSpec, *, announce: bool
    ) -> tuple[CommandSpec, CommandCheck | None]:
        """The command to start, and its check (None: not needed).

        Unconfined, `Popen` itself reports a bad `cwd` or program exactly (see
        `_start_error`): no check. In the jail the host cannot tell what exists inside
        it, so the shared check runs there, from the workspace.
        """
        if not self.confine:
            return spec, None
        check = CommandCheck.needed(spec, cwd=self._workspace.cwd_for(spec.cwd))
        if check is None:
            return spec, None
        argv = tuple(check.argv(spec.argv, announce=announce))
        return dataclasses.replace(spec, argv=argv, cwd=None), check

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


def _start_error(spec: CommandSpec, cwd: str, exc: OSError) -> SandboxError:
    """Our error for `Popen` failing to start `spec` in `cwd` (it names the culprit:
    the directory, or the program it could not execute)."""
    check = CommandCheck(spec, cwd=cwd)
    if exc.filename == cwd:
        kind = {errno.ENOENT: "nocwd", errno.ENOTDIR: "notdir"}.get(exc.errno or 0, "noaccess")
        return check.error(kind)
    if not spec.shell:
        missing = exc.errno in (errno.ENOENT, errno.ENOTDIR)
        return check.error("noprog" if missing else "noexec")
    return SandboxError(f"could not start the command: {exc.strerror or exc}")


def _check_runner_options(containment: str, limits: cgroup_limits.Limits) -> None:
    """Refuse what the runner cannot honour (never dropped silently): the session's
    cgroup limits, and a containment chosen by hand (the runner contains each process
    tree itself)."""
    wanted = [
        name
        for name, value in (
            ("memory_limit_bytes", limits.memory_bytes),
            ("process_limit", limits.processes),
            ("cpu_limit", limits.cpus),
        )
        if value is not None
    ]
    if wanted:
        raise UnsupportedOperationError(
            f"runner=True cannot enforce {', '.join(wanted)}: the runner's processes are "
            "not in the session's cgroup (open the session without runner=True)"
        )
    if containment != "auto":
        raise InvalidArgumentError(
            f"runner=True with containment={containment!r}: the runner contains every "
            "process tree itself (leave containment at 'auto')"
        )


def _check_workdir_option(workdir: object) -> None:
    """`workdir` must be a path whose existing part is a directory (it is created at
    start): a file there would only fail later, with a raw OSError."""
    if not isinstance(workdir, str | os.PathLike):
        raise InvalidArgumentError(f"workdir must be a path, not {type(workdir).__name__}")
    path = os.fspath(workdir)
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidArgumentError(f"workdir must be a non-empty str path, not {path!r}")
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        what = (
            "exists and is not" if probe == os.path.abspath(path) else f"is inside {probe!r}, not"
        )
        raise InvalidArgumentError(f"workdir {path!r} {what} a directory")


def _is_locale_or_identity(name: str) -> bool:
    """Variables a confined session passes on without `inherit_env`: none is a secret."""
    return name in ("LANG", "LANGUAGE", "TZ", "USER", "LOGNAME") or name.startswith("LC_")
