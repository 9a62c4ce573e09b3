"""The session adapter: an SDK `BaseSandboxSession` that delegates to one of ours.

Every call the SDK's tools make is mapped onto our contract, with the SDK's own types
and errors: `bytes` output, `session_id=` keywords, `PtySessionNotFoundError` for an
unknown id, and for a pipes process the exact `RuntimeError` their `write_stdin` tool
turns into its "start it with tty" hint.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import posixpath
import re
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import Any

from agents.sandbox.errors import (
    ExecNonZeroError,
    ExecTransportError,
    ExposedPortUnavailableError,
    InvalidManifestPathError,
    PtySessionNotFoundError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.errors import (
    ExecTimeoutError as SdkExecTimeoutError,
)
from agents.sandbox.files import FileEntry
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession as SdkSession
from agents.sandbox.session.pty_types import PtyExecUpdate
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User

import sandbox
from sandbox.errors import (
    ConnectionLostError,
    ExecTimeoutError,
    InvalidArgumentError,
    ProcessExitedError,
    ProviderError,
    PtyProcessNotFoundError,
    SandboxError,
    SandboxFileNotFoundError,
    StdinClosedError,
    WorkspacePathError,
)
from sandbox.types import PtyUpdate

from . import archive
from .files import (
    FILE_ERRORS,
    Operation,
    file_entry,
    move_error,
    resolve_inside,
    sdk_error,
    symlink_archive,
)
from .state import SandboxSessionState

UntilPattern = str | re.Pattern[str]

# Our extractor's words for a refused member (`archive member 'name' refused: why`):
# the SDK's hydrate error names the member in its context.
_REFUSED_MEMBER = re.compile(r"archive member '(.*)' refused: ")

#: The exact text the SDK's `write_stdin` tool compares to give its "use tty" hint.
STDIN_UNAVAILABLE = "stdin is not available for this process"

# Archives are spooled here before the SDK reads them: memory up to this, then disk.
_SPOOL_IN_MEMORY_BYTES = 8 * 1024 * 1024
_HYDRATE_CHUNK_BYTES = 1024 * 1024
# Raw bytes per command when writing through a path grant: base64 of it stays below the
# kernel's limit of 128 KiB for one argument.
_GRANT_PIECE_BYTES = 64 * 1024


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
        # The sandbox's workspace as it spells it (`pwd` there): our file calls take paths
        # relative to it.
        self._here: str | None = None
        self._owns_ours = True
        # The manifest's `environment`, resolved once at start (its values may come from
        # a secret store): every command gets it.
        self._env: dict[str, str] | None = None
        # unix_local: the workspace folder's (device, inode) when the session was made
        # (or, not there yet, at start). Our file calls open the workspace by its path,
        # so a root replaced since (by a symlink, say) would take them elsewhere: each
        # file operation checks it first.
        self._root_id = _folder_id(state.manifest.root) if state.backend == "unix_local" else None

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
        state.reseal()
        await adapter._settle_workspace_root()
        adapter.state.workspace_root_ready = True
        adapter._env = await adapter.state.manifest.environment.resolve() or None
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
        self._env = await self.state.manifest.environment.resolve() or None
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
            self.state.reseal()
            return None
        return session

    async def _settle_workspace_root(self) -> None:
        """Point the manifest's root at the sandbox's real workspace (the SDK resolves
        every tool path against it); a root the user chose becomes our cwd."""
        ours = self.sandbox_session
        here = (await ours.exec("pwd")).stdout.decode().strip()
        self._here = here
        if self.state.backend == "unix_local" and self._root_id is None:
            self._root_id = await asyncio.to_thread(_folder_id, here)
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
        self.state.reseal()

    async def _after_start_failed(self) -> None:
        """A start that failed (a snapshot refused on resume, a manifest refused) leaves
        no session running, as the SDK's own sandboxes: ours is closed."""
        await self._shutdown_backend()

    async def _shutdown_backend(self) -> None:
        ours, self._ours = self._ours, None
        if ours is not None and self._owns_ours:
            await ours.aclose()

    def _refuse_host_accounts(self) -> None:
        """On unix_local the "sandbox" is the host: manifest users and groups would be
        `useradd`/`groupadd` on this machine. Refused, as the SDK's own unix_local does."""
        manifest = self.state.manifest
        if self.state.backend == "unix_local" and (manifest.users or manifest.groups):
            raise InvalidArgumentError(
                "manifest users or groups are not supported on unix_local: provisioning "
                "them would run useradd/groupadd on the host machine"
            )

    async def _apply_manifest(
        self, *, only_ephemeral: bool = False, provision_accounts: bool = True
    ) -> Any:
        self._refuse_host_accounts()
        return await super()._apply_manifest(
            only_ephemeral=only_ephemeral, provision_accounts=provision_accounts
        )

    async def provision_manifest_accounts(self) -> None:
        """The SDK's account provisioning, refused on unix_local (the host's accounts)."""
        self._refuse_host_accounts()
        await super().provision_manifest_accounts()

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
                *argv, shell=False, timeout=timeout, cwd=self._cwd, env=self._env
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
                env=self._env,
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
    # Every SDK file operation goes through our session's file calls, which resolve the
    # path inside the workspace on the backend's side and refuse one a symlink or `..`
    # leads out of. The SDK's own defaults run `rm`/`mkdir`/`ls`/`mv`/`test -ef` in the
    # sandbox after a lexical check only, following a link to any host folder.

    def _check_root(self, operation: Operation, path: Path | str) -> None:
        """Raise the SDK's `InvalidManifestPathError` when the unix_local workspace folder
        is no longer the one the session was made on (replaced, by a symlink or a
        folder, since)."""
        if self._root_id is None or self._here is None:
            return
        if _folder_id(self._here) != self._root_id:
            error = WorkspacePathError(
                f"the workspace folder {self._here!r} was replaced since the session was "
                "made: refusing to follow it"
            )
            # What the SDK's unix_local raises here, for every operation.
            raise InvalidManifestPathError(
                rel=str(path), reason="escape_root", context={"operation": operation}, cause=error
            ) from error

    def _sandbox_path(self, path: Path | str, *, for_write: bool = False) -> str:
        """The path our session's file calls take (relative to the workspace), after the
        SDK's own lexical check."""
        normalized = PurePosixPath(str(self.normalize_path(path, for_write=for_write)))
        base = PurePosixPath(self._here or self.state.manifest.root)
        try:
            return str(normalized.relative_to(base)) or "."
        except ValueError:
            return str(normalized)

    def _granted(self, path: Path | str) -> tuple[str, Any] | None:
        """For a path outside the workspace that one of the manifest's
        `extra_path_grants` covers: the absolute path and that grant; else None."""
        grants = self.state.manifest.extra_path_grants
        if not grants:
            return None
        relative = self._sandbox_path(path)
        if not relative.startswith("/"):
            return None
        target = PurePosixPath(posixpath.normpath(relative))
        for grant in grants:
            base = PurePosixPath(posixpath.normpath(grant.path))
            if target == base or base in target.parents:
                return str(target), grant
        return None

    async def _granted_exec(self, script: str, *args: str) -> sandbox.ExecResult:
        """`script` run in the sandbox with `$1` the path, `$2` the grant's folder and
        `$p` the path resolved (links followed) and checked to be below the grant's
        folder, itself resolved: a link in the grant leading elsewhere is refused
        (exit 3). Exit 2: the path does not resolve."""
        guard = (
            'g=$(realpath -e -- "$2") || exit 2; p=$(realpath -m -- "$1") || exit 2; '
            'case "$p/" in "$g"/*) ;; *) exit 3;; esac; '
        )
        return await self.sandbox_session.exec("sh", "-c", guard + script, "sh", *args, shell=False)

    async def _read_granted(self, path: Path, absolute: str, grant: Any) -> io.IOBase:
        result = await self._granted_exec(
            '[ -e "$p" ] || exit 4; [ -f "$p" ] || exit 5; exec cat -- "$p"', absolute, grant.path
        )
        if result.exit_code == 4:
            raise WorkspaceReadNotFoundError(path=path)
        if result.exit_code != 0:
            raise WorkspaceArchiveReadError(
                path=path, context={"reason": _granted_reason(result.exit_code)}
            )
        return io.BytesIO(result.stdout)

    async def _write_granted(self, path: Path, data: io.IOBase, absolute: str, grant: Any) -> None:
        if grant.read_only:
            raise WorkspaceArchiveWriteError(
                path=path, context={"reason": f"the path grant {grant.path!r} is read-only"}
            )
        # Written in place (`>` keeps the inode, its mode and its other names), in
        # pieces small enough for one argument each.
        first = True
        while True:
            piece = data.read(_GRANT_PIECE_BYTES)
            if isinstance(piece, str):
                piece = piece.encode()
            if not piece and not first:
                return
            redirect = ">" if first else ">>"
            script = f'[ ! -d "$p" ] || exit 5; printf %s "$3" | base64 -d {redirect} "$p"'
            result = await self._granted_exec(
                script, absolute, grant.path, base64.b64encode(bytes(piece or b"")).decode()
            )
            if result.exit_code != 0:
                raise WorkspaceArchiveWriteError(
                    path=path, context={"reason": _granted_reason(result.exit_code)}
                )
            if not piece:
                return
            first = False

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        """The file's bytes (bounded by our `read_limit_bytes`); a path one of the
        manifest's `extra_path_grants` covers is read there."""
        _refuse_user(user, "read")
        self._check_root("read", path)
        granted = self._granted(path)
        if granted is not None:
            return await self._read_granted(path, *granted)
        try:
            data = await self.sandbox_session.read_file(self._sandbox_path(path))
        except FILE_ERRORS as error:
            raise sdk_error("read", path, error) from error
        return io.BytesIO(data)

    async def _read_bounded(self, path: Path, *, max_bytes: int) -> bytes:
        """At most `max_bytes` of the file's first bytes, streamed: a big file is never
        read whole for a prefix."""
        self._check_root("read", path)
        taken = bytearray()
        chunks = self.sandbox_session.read_file_chunks(
            self._sandbox_path(path), chunk_size=min(max_bytes, _HYDRATE_CHUNK_BYTES)
        )
        try:
            async for chunk in chunks:
                taken += chunk[: max_bytes - len(taken)]
                if len(taken) >= max_bytes:
                    break
        except FILE_ERRORS as error:
            raise sdk_error("read", path, error) from error
        finally:
            # Stopping early closes the file at once, not when the stream is collected.
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()
        return bytes(taken)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        """Write the stream's bytes to the file (streamed, parents made); a path one of
        the manifest's `extra_path_grants` covers is written there (refused when the
        grant is read-only)."""
        _refuse_user(user, "write")
        self._check_root("write", path)
        granted = self._granted(path)
        if granted is not None:
            await self._write_granted(path, data, *granted)
            return
        relative = self._sandbox_path(path, for_write=True)
        try:
            if self.state.backend == "docker" and await self._is_file(relative):
                await self._write_in_place(path, relative, data)
                return
            await self.sandbox_session.write_file_chunks(relative, _chunks(data))
        except FILE_ERRORS as error:
            raise sdk_error("write", path, error) from error

    async def _is_file(self, relative: str) -> bool:
        try:
            return (await self.sandbox_session.stat(relative)).kind == "file"
        except SandboxFileNotFoundError:
            return False

    async def _write_in_place(self, path: Path, relative: str, data: io.IOBase) -> None:
        """Docker's archive upload replaces a file (a new inode, mode 0644): an
        executable would lose its x bits and a hard link keep the old bytes. So an
        existing file gets the bytes through a sibling spool (our confined write), then
        copied over it in place by `cat` in the sandbox (same inode, mode, links), the
        target checked to be still a regular file, not a link swapped in."""
        ours = self.sandbox_session
        folder, name = posixpath.split(relative)
        spool = posixpath.join(folder, f".{name}.sandbox-write-{uuid.uuid4().hex[:12]}")
        await ours.write_file_chunks(spool, _chunks(data))
        script = (
            '[ -f "$2" ] && [ ! -L "$2" ] || exit 3; cat -- "$1" > "$2"; rc=$?; '
            'rm -f -- "$1"; exit "$rc"'
        )
        result = await ours.exec(
            "sh", "-c", script, "sh", _dot(spool), _dot(relative), shell=False, cwd=self._cwd
        )
        if result.exit_code != 0:
            with contextlib.suppress(SandboxError):
                await ours.remove(spool)
            raise WorkspaceArchiveWriteError(
                path=path,
                context={
                    "reason": "the file changed while it was written"
                    if result.exit_code == 3
                    else result.stderr.decode("utf-8", "replace")[:200]
                },
            )

    async def _write_new_file(
        self, path: Path, data: io.IOBase, *, user: str | User | None = None
    ) -> None:
        """`apply_patch`'s create: `FileExistsError` when something is at `path` (a
        symlink included), else a write (parents made)."""
        _refuse_user(user, "write")
        self._check_root("write", path)
        ours = self.sandbox_session
        relative = self._sandbox_path(path, for_write=True)
        try:
            await ours.stat(relative)
        except SandboxFileNotFoundError:
            pass
        except FILE_ERRORS as error:
            raise sdk_error("write", path, error) from error
        else:
            raise FileExistsError(f"{path} already exists")
        try:
            await ours.write_file_chunks(relative, _chunks(data))
        except FILE_ERRORS as error:
            raise sdk_error("write", path, error) from error

    async def ls(self, path: Path | str, *, user: str | User | None = None) -> list[FileEntry]:
        """The entries of a folder, by our `list_dir` (entries not followed; a path a
        symlink leads out of is the SDK's `InvalidManifestPathError`)."""
        _refuse_user(user, "ls")
        self._check_root("ls", path)
        shown = str(self.normalize_path(path))
        try:
            infos = await self.sandbox_session.list_dir(self._sandbox_path(path))
        except FILE_ERRORS as error:
            raise sdk_error("ls", path, error) from error
        return [file_entry(info, posixpath.join(shown, info.name)) for info in infos]

    async def mkdir(
        self, path: Path | str, *, parents: bool = False, user: str | User | None = None
    ) -> None:
        """Make a folder (with `parents`, its missing parents; an existing one is fine),
        by our `make_dir`."""
        _refuse_user(user, "mkdir")
        self._check_root("mkdir", path)
        ours = self.sandbox_session
        relative = self._sandbox_path(path, for_write=True)
        try:
            try:
                there = (await ours.stat(relative)).kind
            except SandboxFileNotFoundError:
                there = None
            if there == "dir":
                return  # as the SDK's unix_local: an existing folder is no error
            if there is not None:
                # A file, or a symlink (never followed, even to a folder).
                raise InvalidArgumentError(f"{str(path)!r} exists and is not a folder")
            await ours.make_dir(relative, parents=parents)
        except FILE_ERRORS as error:
            raise sdk_error("mkdir", path, error) from error

    async def rm(
        self, path: Path | str, *, recursive: bool = False, user: str | User | None = None
    ) -> None:
        """Remove a file, a symlink (never what it points at) or, with `recursive`, a
        folder, by our `remove`. Missing: an error, except with `recursive` (`rm -rf`)."""
        _refuse_user(user, "rm")
        self._check_root("rm", path)
        try:
            await self.sandbox_session.remove(
                self._sandbox_path(path, for_write=True), recursive=recursive
            )
        except SandboxFileNotFoundError as error:
            if recursive:
                return
            raise sdk_error("rm", path, error) from error
        except FILE_ERRORS as error:
            raise sdk_error("rm", path, error) from error

    async def mv(
        self, source: Path | str, destination: Path | str, *, user: str | User | None = None
    ) -> None:
        """Move a regular file or a symlink onto `destination`, replacing a file or symlink
        there (a folder there is refused), as the SDK's `mv` does.

        Our sessions have no rename, so a file is copied (streamed through
        `read_file_chunks`/`write_file_chunks`) and then removed, and a symlink is made
        again through `hydrate_workspace` (which refuses a target leading out): every
        step is one of our confined file calls. Not atomic: a failure part way leaves
        the source in place (and the destination possibly partly written); the copy
        gets the default permission bits."""
        _refuse_user(user, "mv")
        self._check_root("mv", source)
        ours = self.sandbox_session
        src = self._sandbox_path(source, for_write=True)
        dst = self._sandbox_path(destination, for_write=True)
        try:
            info = await ours.stat(src)
            if info.kind not in ("file", "symlink"):
                raise move_error(
                    "Move source must be a regular file or symlink", source, destination
                )
            if src == dst:
                return
            try:
                there: sandbox.FileInfo | None = await ours.stat(dst)
            except SandboxFileNotFoundError:
                there = None
            if there is not None:
                if there.kind == "dir":
                    raise move_error("Move destination is a directory", source, destination)
                if await self._same_entry(src, dst):
                    return  # rename(2) of two names of one file changes nothing
                if there.kind == "symlink":
                    await ours.remove(dst)  # the link is replaced, never written through
            if info.kind == "file":
                await ours.write_file_chunks(dst, ours.read_file_chunks(src))
            else:
                if info.link_target is None:
                    raise move_error("cannot tell where the symlink points", source, destination)
                await ours.hydrate_workspace([symlink_archive(dst, info.link_target)], ".")
            await ours.remove(src)
        except FILE_ERRORS as error:
            raise sdk_error("mv", f"{source} -> {destination}", error) from error

    async def same_file(
        self,
        left: Path | str,
        right: Path | str,
        *,
        follow_symlinks: bool = True,
        user: str | User | None = None,
    ) -> bool:
        """Whether two paths name one file. Symlinks are followed by our `stat`, one link
        at a time inside the workspace (a link leading out is the SDK's
        `InvalidManifestPathError`, never followed); with `follow_symlinks=False` a
        symlink at either path answers False. A missing path answers False."""
        _refuse_user(user, "same_file")
        self._check_root("same_file", left)
        ours = self.sandbox_session
        root = self._here or self.state.manifest.root
        first = self._sandbox_path(left)
        second = self._sandbox_path(right)
        try:
            if follow_symlinks:
                first = await resolve_inside(ours, first, root)
                second = await resolve_inside(ours, second, root)
            kinds = {(await ours.stat(first)).kind, (await ours.stat(second)).kind}
        except SandboxFileNotFoundError:
            return False
        except FILE_ERRORS as error:
            raise sdk_error("same_file", f"{left} {right}", error) from error
        if "symlink" in kinds:
            return False
        if first == second:
            return True
        return await self._same_entry(first, second)

    async def _same_entry(self, first: str, second: str) -> bool:
        """Whether two workspace paths our `stat` checked name one file (device and inode,
        by `test -ef` in the sandbox: hard links, a case-folding file system). A symlink
        swapped in at either name since answers False (`! -L`): nothing is followed."""
        test = '[ ! -L "$1" ] && [ ! -L "$2" ] && [ "$1" -ef "$2" ]'
        argv = ("sh", "-c", test, "sh", _dot(first), _dot(second))
        result = await self.sandbox_session.exec(*argv, shell=False)
        if result.exit_code in (0, 1):
            return result.exit_code == 0
        raise ExecNonZeroError(
            ExecResult(stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code),
            command=("sh", "-c", "<same_file_check>", first, second),
        )

    # ---- workspace archives and ports ----

    async def persist_workspace(self) -> io.IOBase:
        """A tar of the workspace (our streamed archive), spooled for the SDK to read."""
        ours = self.sandbox_session
        persist = getattr(ours, "persist_workspace", None)
        root = Path(self.state.manifest.root)
        self._check_root("read", root)
        if persist is None:
            raise WorkspaceArchiveReadError(
                path=root, context={"reason": "this sandbox version has no workspace archives"}
            )
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY_BYTES)
        fitted = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY_BYTES)
        skip = {PurePosixPath(p.as_posix()) for p in self._persist_workspace_skip_relpaths()}
        skip |= {PurePosixPath(p.as_posix()) for p in self._mount_relpaths_within_workspace()}
        here = self._cwd or self._here or self.state.manifest.root
        try:
            async for chunk in persist(self._cwd or "."):
                spool.write(chunk)
            spool.seek(0)
            # The SDK's skip set (ephemeral entries, mounts, registered paths) left out,
            # absolute links into the workspace made relative: off the event loop.
            await asyncio.to_thread(archive.rewrite, spool, fitted, skip, here)
        except BaseException:
            fitted.close()
            raise
        finally:
            spool.close()
        fitted.seek(0)
        return fitted

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Extract such a tar into the workspace, under our archive rules."""
        hydrate = getattr(self.sandbox_session, "hydrate_workspace", None)
        if hydrate is None:
            raise WorkspaceArchiveWriteError(
                path=Path(self.state.manifest.root),
                message="this sandbox version cannot extract workspace archives",
            )
        root = Path(self.state.manifest.root)
        self._check_root("write", root)
        try:
            await hydrate(_nonempty(_chunks(data)), self._cwd or ".")
        except (SandboxError, ValueError) as error:
            # The SDK (its resume, its callers) catches its own type.
            raise _hydrate_error(root, error) from error

    async def _restore_snapshot_into_workspace_on_resume(self) -> None:
        """The SDK's restore on resume clears the workspace and then hydrates the
        snapshot: a snapshot our hydrate refuses would lose the files. So the snapshot is
        spooled and checked first (`WorkspaceArchiveWriteError` before anything is
        cleared), then cleared and hydrated from the spool."""
        restored = await self.state.snapshot.restore(dependencies=self.dependencies)
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY_BYTES)
        try:
            try:
                await asyncio.to_thread(_copy_stream, restored, spool)
            finally:
                close = getattr(restored, "close", None)
                if close is not None:
                    close()
            spool.seek(0)
            try:
                await asyncio.to_thread(archive.check, spool)
            except InvalidArgumentError as error:
                raise _hydrate_error(Path(self.state.manifest.root), error) from error
            spool.seek(0)
            await self._clear_workspace_root_on_resume()
            await self.hydrate_workspace(spool)
        finally:
            spool.close()

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        if self.state.backend == "unix_local" and not self._live():
            # The host's own port: known without a session, as the SDK's unix_local.
            return ExposedPortEndpoint(host="127.0.0.1", port=port)
        expose = getattr(self.sandbox_session, "expose_port", None)
        if expose is None:
            if self.state.backend == "unix_local":
                return ExposedPortEndpoint(host="127.0.0.1", port=port)
            raise ExposedPortUnavailableError(
                port=port, exposed_ports=self.state.exposed_ports, reason="backend_unavailable"
            )
        exposed = await expose(port)
        return ExposedPortEndpoint(host=exposed.host, port=exposed.port, tls=exposed.tls)


def _folder_id(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the folder `path` leads to, or None (not there)."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino)


def _hydrate_error(root: Path, error: Exception) -> WorkspaceArchiveWriteError:
    """The SDK's hydrate error for ours (a refused member named in its context)."""
    context = {"reason": str(error)}
    named = _REFUSED_MEMBER.match(str(error))
    if named is not None:
        context["member"] = named.group(1)
    return WorkspaceArchiveWriteError(path=root, context=context, cause=error)


def _copy_stream(source: Any, destination: Any) -> None:
    while True:
        chunk = source.read(_HYDRATE_CHUNK_BYTES)
        if not chunk:
            return
        destination.write(chunk.encode() if isinstance(chunk, str) else chunk)


def _granted_reason(code: int) -> str:
    return {
        2: "the path does not resolve",
        3: "a symlink leads out of the path grant",
        4: "no such file",
        5: "not a regular file",
    }.get(code, f"the sandbox's command failed (exit status {code})")


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


def _dot(path: str) -> str:
    """A relative path spelled so that no command reads it as an option."""
    return path if path.startswith("/") else f"./{path}"


async def _nonempty(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks`, or an `InvalidArgumentError` when there are no bytes at all: a tar
    archive always ends with its end blocks, so an empty stream is not one."""
    empty = True
    async for chunk in chunks:
        empty = empty and not chunk
        yield chunk
    if empty:
        raise InvalidArgumentError("a malformed tar archive: the stream is empty")


async def _chunks(data: io.IOBase) -> AsyncIterator[bytes]:
    """Bytes of a binary stream (or a text one, encoded), one bounded chunk at a time."""
    while True:
        chunk = data.read(_HYDRATE_CHUNK_BYTES)
        if not chunk:
            return
        yield chunk.encode() if isinstance(chunk, str) else bytes(chunk)
