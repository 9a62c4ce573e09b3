"""The session adapter: an SDK `BaseSandboxSession` that delegates to one of ours.

Every call the SDK's tools make is mapped onto our contract, with the SDK's own types
and errors: `bytes` output, `session_id=` keywords, `PtySessionNotFoundError` for an
unknown id, and for a pipes process the exact `RuntimeError` their `write_stdin` tool
turns into its "start it with tty" hint.
"""

from __future__ import annotations

import io
import re
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import Any

from agents.sandbox.errors import (
    ExecTimeoutError as SdkExecTimeoutError,
)
from agents.sandbox.errors import (
    ExecTransportError,
    ExposedPortUnavailableError,
    PtySessionNotFoundError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession as SdkSession
from agents.sandbox.session.pty_types import PtyExecUpdate
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User

import sandbox
from sandbox.errors import (
    ConnectionLostError,
    ExecTimeoutError,
    ProcessExitedError,
    ProviderError,
    PtyProcessNotFoundError,
    SandboxFileNotFoundError,
    StdinClosedError,
)
from sandbox.types import PtyUpdate

from .state import SandboxSessionState

UntilPattern = str | re.Pattern[str]

#: The exact text the SDK's `write_stdin` tool compares to give its "use tty" hint.
STDIN_UNAVAILABLE = "stdin is not available for this process"

# Archives are spooled here before the SDK reads them: memory up to this, then disk.
_SPOOL_IN_MEMORY_BYTES = 8 * 1024 * 1024
_HYDRATE_CHUNK_BYTES = 1024 * 1024


class AgentsSessionAdapter(SdkSession):
    """An SDK session backed by a `sandbox` session of any backend.

    The SDK drives its life: `start()` opens (or, from a state holding a `SessionRef`,
    resumes) our session; `shutdown()` closes it. `sandbox_session` is ours, for the
    calls the SDK has no name for (the `Terminal` capability uses it).
    """

    state: SandboxSessionState

    def __init__(self, *, state: SandboxSessionState, private_options: dict[str, Any]) -> None:
        self.state = state
        self._private_options = dict(private_options)
        self._ours: sandbox.BaseSandboxSession[Any] | None = None
        self._cwd: str | None = None
        self._owns_ours = True

    def __repr__(self) -> str:
        return f"<AgentsSessionAdapter backend={self.state.backend!r} running={self._live()}>"

    @classmethod
    async def around(
        cls, session: sandbox.BaseSandboxSession[Any], *, manifest: Any = None
    ) -> AgentsSessionAdapter:
        """An adapter over a session you opened (and will close): pass it as
        `SandboxRunConfig(session=...)`; the SDK then neither starts nor deletes it."""
        from agents.sandbox.manifest import Manifest
        from agents.sandbox.snapshot import NoopSnapshot

        session_id = uuid.uuid4()
        state = SandboxSessionState(
            session_id=session_id,
            manifest=manifest if manifest is not None else Manifest(),
            snapshot=NoopSnapshot(id=str(session_id)),
            backend=session.backend_name,
        )
        adapter = cls(state=state, private_options={})
        adapter._ours = session
        adapter._owns_ours = False
        await adapter._settle_workspace_root()
        adapter.state.workspace_root_ready = True
        return adapter

    # ---- our session ----

    @property
    def sandbox_session(self) -> sandbox.BaseSandboxSession[Any]:
        """The `sandbox` session this adapter drives (started by the SDK's `start()`)."""
        if self._ours is None:
            raise sandbox.SessionNotStartedError("the SDK session has not been started")
        return self._ours

    def _live(self) -> bool:
        return self._ours is not None and self._ours.state is sandbox.SessionState.RUNNING

    async def _ensure_backend_started(self) -> None:
        if self._live():
            return
        options = {**self.state.backend_options, **self._private_options}
        ours = await self._resumed(options)
        if ours is None:
            ours = sandbox.open_session(self.state.backend, **options)
            await ours.start()
        else:
            self._set_start_state_preserved(True)
        self._ours = ours
        await self._settle_workspace_root()

    async def _resumed(self, options: dict[str, Any]) -> sandbox.BaseSandboxSession[Any] | None:
        """Our session resumed from the state's ref, or None (no ref, no durable sessions,
        or the sandbox is gone: the SDK then creates a replacement and restores its
        snapshot, as its `resume` contract says)."""
        ref_data = self.state.session_ref
        resume = getattr(sandbox, "resume_session", None)
        ref_type = getattr(sandbox, "SessionRef", None)
        if ref_data is None or resume is None or ref_type is None:
            return None
        gone = getattr(sandbox, "SessionGoneError", ())
        ref = ref_type.from_dict(ref_data)
        private = {k: v for k, v in options.items() if k not in self.state.backend_options}
        session: sandbox.BaseSandboxSession[Any] = resume(ref, **private)
        try:
            await session.start()
        except gone:
            self.state.session_ref = None
            return None
        return session

    async def _settle_workspace_root(self) -> None:
        """Point the manifest's root at the sandbox's real workspace (the SDK resolves
        every tool path against it); a root the user chose becomes our cwd."""
        ours = self.sandbox_session
        here = (await ours.exec("pwd")).stdout.decode().strip()
        root = self.state.manifest.root
        if root in ("", _default_root()) or root == here:
            self.state.manifest = self.state.manifest.model_copy(update={"root": here})
            self._cwd = None
        else:
            await ours.exec("mkdir", "-p", "--", root, shell=False)
            self._cwd = root

    def refresh_ref(self) -> None:
        """Write our session's current `SessionRef` into the state (the client does this
        when the SDK serializes it), so the state resumes to the same sandbox. Taken
        only then: a session that handed out a ref checks its lease on every call. A
        backend without durable sessions leaves the state without one."""
        ours = self._ours
        ref = getattr(ours, "ref", None)
        if ours is None or ref is None or not self._live():
            return
        try:
            self.state.session_ref = ref().to_dict()
        except sandbox.UnsupportedOperationError:
            self.state.session_ref = None

    async def _shutdown_backend(self) -> None:
        ours, self._ours = self._ours, None
        if ours is not None and self._owns_ours:
            await ours.aclose()

    async def running(self) -> bool:
        """True while our session is started and not closed."""
        return self._live()

    def supports_pty(self) -> bool:
        """Every backend has interactive processes (tty or pipes)."""
        return True

    # ---- commands ----

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        argv = [str(part) for part in command]
        try:
            result = await self.sandbox_session.exec(
                *argv, shell=False, timeout=timeout, cwd=self._cwd
            )
        except ExecTimeoutError as error:
            raise SdkExecTimeoutError(command=argv, timeout_s=timeout, cause=error) from error
        except (ConnectionLostError, ProviderError) as error:
            raise ExecTransportError(command=argv, cause=error) from error
        return ExecResult(stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code)

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
        until: UntilPattern | None = None,
        until_screen: UntilPattern | None = None,
    ) -> PtyExecUpdate:
        """Start a process as the SDK's `exec_command` tool asks (`until`/`until_screen`
        are ours, for the `Terminal` capability). `timeout` is ignored, as the SDK's own
        sessions do: a window is bounded by `yield_time_s`."""
        del timeout
        argv = self._prepare_exec_command(*command, shell=shell, user=user)
        try:
            update = await self.sandbox_session.pty_exec_start(
                *argv,
                shell=False,
                tty=tty,
                cwd=self._cwd,
                yield_time_s=yield_time_s,
                max_output_tokens=max_output_tokens,
                until=until,
                until_screen=until_screen,
            )
        except (ConnectionLostError, ProviderError) as error:
            raise ExecTransportError(command=argv, cause=error) from error
        return _sdk_update(update)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
        until: UntilPattern | None = None,
        until_screen: UntilPattern | None = None,
    ) -> PtyExecUpdate:
        """Write to (or, with empty `chars`, poll) a process, as the SDK's `write_stdin`."""
        ours = self.sandbox_session
        try:
            update = await ours.pty_write_stdin(
                session_id,
                chars,
                yield_time_s=yield_time_s,
                max_output_tokens=max_output_tokens,
                until=until,
                until_screen=until_screen,
            )
        except PtyProcessNotFoundError as error:
            raise PtySessionNotFoundError(session_id=session_id, cause=error) from error
        except StdinClosedError as error:
            raise RuntimeError(STDIN_UNAVAILABLE) from error
        except ProcessExitedError:
            # It exited before the input went in: nothing is lost, its rest is a poll away.
            update = await ours.pty_write_stdin(
                session_id, "", yield_time_s=yield_time_s, max_output_tokens=max_output_tokens
            )
        return _sdk_update(update)

    async def pty_terminate_all(self) -> None:
        """Tear down every process of our session (their trees included)."""
        if self._live():
            try:
                await self.sandbox_session.pty_terminate_all()
            except sandbox.SessionTakenOverError:
                return  # resumed elsewhere: the processes are the new owner's

    # ---- files ----

    def _sandbox_path(self, path: Path | str) -> str:
        """The path our session's file calls take, after the SDK's own workspace check."""
        normalized = PurePosixPath(str(self.normalize_path(path)))
        root = PurePosixPath(self.state.manifest.root)
        try:
            return str(normalized.relative_to(root)) or "."
        except ValueError:
            return str(normalized)

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        """The file's bytes (bounded by our `read_limit_bytes`)."""
        _refuse_user(user, "read")
        try:
            data = await self.sandbox_session.read_file(self._sandbox_path(path))
        except SandboxFileNotFoundError as error:
            raise WorkspaceReadNotFoundError(path=path, cause=error) from error
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        """Write the stream's bytes to the file (streamed, parents made)."""
        _refuse_user(user, "write")
        await self.sandbox_session.write_file_chunks(self._sandbox_path(path), _chunks(data))

    # ---- workspace archives and ports ----

    async def persist_workspace(self) -> io.IOBase:
        """A tar of the workspace (our streamed archive), spooled for the SDK to read."""
        ours = self.sandbox_session
        persist = getattr(ours, "persist_workspace", None)
        root = Path(self.state.manifest.root)
        if persist is None:
            raise WorkspaceArchiveReadError(
                path=root, context={"reason": "this sandbox version has no workspace archives"}
            )
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY_BYTES)
        try:
            async for chunk in persist(self._cwd or "."):
                spool.write(chunk)
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return spool

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Extract such a tar into the workspace, under our archive rules."""
        hydrate = getattr(self.sandbox_session, "hydrate_workspace", None)
        if hydrate is None:
            raise WorkspaceArchiveWriteError(
                path=Path(self.state.manifest.root),
                message="this sandbox version cannot extract workspace archives",
            )
        await hydrate(_chunks(data), self._cwd or ".")

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        expose = getattr(self.sandbox_session, "expose_port", None)
        if expose is None:
            if self.state.backend == "unix_local":
                return ExposedPortEndpoint(host="127.0.0.1", port=port)
            raise ExposedPortUnavailableError(
                port=port, exposed_ports=self.state.exposed_ports, reason="backend_unavailable"
            )
        exposed = await expose(port)
        return ExposedPortEndpoint(host=exposed.host, port=exposed.port, tls=exposed.tls)


def _default_root() -> str:
    from agents.sandbox.manifest import Manifest

    return str(Manifest.model_fields["root"].default)


def _refuse_user(user: str | User | None, call: str) -> None:
    if user is not None:
        raise sandbox.UnsupportedOperationError(
            f"{call} as another user is not supported: file calls run as the sandbox's user"
        )


def _sdk_update(update: PtyUpdate) -> PtyExecUpdate:
    return PtyExecUpdate(
        process_id=update.process_id,
        output=update.output.encode("utf-8", "surrogateescape"),
        exit_code=update.exit_code,
        original_token_count=update.original_token_count,
    )


async def _chunks(data: io.IOBase) -> AsyncIterator[bytes]:
    """Bytes of a binary stream (or a text one, encoded), one bounded chunk at a time."""
    while True:
        chunk = data.read(_HYDRATE_CHUNK_BYTES)
        if not chunk:
            return
        yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)
