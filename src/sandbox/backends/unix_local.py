"""The `unix_local` backend: processes on this machine, PTYs from `openpty`.

No thread per process or per read: output fds are read with event-loop readers and exits
are seen through pidfds (see `sandbox.local_process`). A workspace directory (given, or
a temporary one removed on close) is every command's cwd and HOME.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence

from .. import confine as jail
from ..errors import ExecTimeoutError, SandboxFileNotFoundError
from ..local_process import LocalProcess
from ..process_entry import EXIT_DRAIN_GRACE_S, CommandSpec, PtyEntry
from ..session import BaseSandboxSession
from ..settle import settle
from ..types import ExecResult
from ..workspace import Workspace

DEFAULT_TERM = "xterm-256color"


class UnixLocalSession(BaseSandboxSession):
    """Runs commands as local processes.

    Options: `workspace` (a directory; default a temporary one removed on close), `env`
    (variables added to every command), `inherit_env` (start from this process's
    environment; default True, but False when confined), `terminate_grace_s` (time
    between the polite signals and SIGKILL when terminating, default 1 s), plus the base
    session's options.

    Confinement (Linux, needs bubblewrap; see `sandbox.confine`): `confine=True` runs
    every process in a jail where the workspace (same path as on the host, and HOME) is
    the only writable host directory, the system is read-only and everything else is
    hidden; `network=True` keeps the host's network inside it (off by default);
    `readonly_paths` shows more host paths read-only (e.g. a toolchain in your home).
    Without bubblewrap, `start()` raises `BackendUnavailableError`: it never runs
    unconfined instead. Unconfined sessions ignore `network` and `readonly_paths`.
    """

    backend_name = "unix_local"

    def __init__(
        self,
        *,
        workspace: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        inherit_env: bool | None = None,
        terminate_grace_s: float = 1.0,
        confine: bool = False,
        network: bool = False,
        readonly_paths: Sequence[str | os.PathLike[str]] = (),
        **options: int,
    ) -> None:
        super().__init__(**options)
        self._workspace = Workspace(workspace)
        self._env = dict(env or {})
        # A jail that hides ~/.aws but hands over AWS_SECRET_ACCESS_KEY would be theatre:
        # confined sessions start from a small allow-list unless told otherwise.
        self._inherit_env = (not confine) if inherit_env is None else inherit_env
        self.terminate_grace_s = terminate_grace_s
        self.confine = confine
        self.network = network
        self._readonly_request = [os.fspath(p) for p in readonly_paths]
        self._readonly_paths: list[str] = []
        self._bwrap: str | None = None

    @property
    def workspace(self) -> str:
        """The workspace directory (after start)."""
        return self._workspace.path

    # ---- lifecycle -----------------------------------------------------------------

    async def _start_backend(self) -> None:
        if self.confine:
            self._bwrap = await asyncio.to_thread(jail.require_bwrap)
            self._readonly_paths = jail.check_readonly_paths(self._readonly_request)
        self._workspace.create()
        if self.confine:
            jail.check_workspace(self._workspace.path)

    async def _stop_backend(self) -> None:
        await asyncio.to_thread(self._workspace.cleanup)

    # ---- commands ------------------------------------------------------------------

    def _environment(self, spec: CommandSpec, *, tty: bool) -> dict[str, str]:
        if self._inherit_env:
            env = dict(os.environ)
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

    async def _exec(self, spec: CommandSpec, timeout: float | None) -> ExecResult:
        stdout = bytearray()
        stderr = bytearray()
        proc = LocalProcess.spawn(
            self._argv(spec),
            tty=False,
            env=self._environment(spec, tty=False),
            cwd=self._workspace.cwd_for(spec.cwd),
            on_stdout=stdout.extend,
            on_stderr=stderr.extend,
        )
        try:
            async with asyncio.timeout(timeout):
                code = await proc.wait()
            # A background child may hold the pipes open: give it the same short grace a
            # PTY window gives, then the whole group is killed by close().
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EXIT_DRAIN_GRACE_S):
                    await proc.wait_eof()
            proc.drain_now()
        except TimeoutError:
            await settle(proc.terminate(0))
            raise ExecTimeoutError.killed(spec.display, timeout, stdout, stderr) from None
        except BaseException:
            await settle(proc.terminate(0))
            raise
        proc.close()
        return ExecResult(stdout=bytes(stdout), stderr=bytes(stderr), exit_code=code)

    async def _spawn_process(self, entry: PtyEntry) -> None:
        spec = entry.spec
        entry.handle = LocalProcess.spawn(
            self._argv(spec.command),
            tty=spec.tty,
            env=self._environment(spec.command, tty=spec.tty),
            cwd=self._workspace.cwd_for(spec.command.cwd),
            rows=spec.rows,
            cols=spec.cols,
            on_stdout=entry.feed,
            on_exit=entry.report_exit,
            on_eof=entry.report_eof,
        )

    async def _write_stdin(self, entry: PtyEntry, data: bytes) -> None:
        proc: LocalProcess = entry.handle
        await proc.write(data)

    async def _resize(self, entry: PtyEntry, rows: int, cols: int) -> None:
        proc: LocalProcess = entry.handle
        proc.resize(rows, cols)

    async def _interrupt(self, entry: PtyEntry) -> None:
        proc: LocalProcess = entry.handle
        if entry.tty:
            await proc.write(b"\x03")
        else:
            proc.signal_group(signal.SIGINT)

    async def _terminate_pty_entry(self, entry: PtyEntry) -> None:
        proc: LocalProcess | None = entry.handle
        if proc is not None:
            await proc.terminate(self.terminate_grace_s)

    async def _final_drain(self, entry: PtyEntry) -> None:
        proc: LocalProcess | None = entry.handle
        if proc is not None:
            proc.drain_now()

    # ---- files -------------------------------------------------------------------------

    async def _read_file(self, path: str) -> bytes:
        real = self._workspace.resolve_inside(path)

        def read() -> bytes:
            try:
                with open(real, "rb") as handle:
                    return handle.read()
            except FileNotFoundError:
                raise SandboxFileNotFoundError(f"no such file in the workspace: {path!r}") from None

        return await asyncio.to_thread(read)

    async def _write_file(self, path: str, data: bytes) -> None:
        real = self._workspace.resolve_inside(path)

        def write() -> None:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            with open(real, "wb") as handle:
                handle.write(data)

        await asyncio.to_thread(write)


def _is_locale_or_identity(name: str) -> bool:
    """Variables a confined session passes on without `inherit_env`: none is a secret."""
    return name in ("LANG", "LANGUAGE", "TZ", "USER", "LOGNAME") or name.startswith("LC_")
