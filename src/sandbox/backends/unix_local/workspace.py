"""A workspace directory on the local file system.

Files in it are opened through `backends.unix_local.safe_open`, which resolves and opens a path in
one step beneath the workspace: checking a path first and opening it afterwards would be
a race a process in the sandbox can win (by swapping a folder for a symlink meanwhile).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator

from ...backend import (
    ExposedPort,
    FileAccess,
    FileInfo,
    Ports,
    WorkspaceAccess,
    http_url,
    remove_tree,
)
from ...errors import CleanupError, InvalidArgumentError, SandboxError, UnsupportedOperationError
from . import tar_land, tar_walk
from .workspace_files import LocalTree

# The name of every temporary workspace begins so (a ref's `temporary` claim is checked
# against it: `durable.check_temporary`).
TEMPORARY_PREFIX = "sandbox-ws-"


class Workspace:
    """A directory that is the session's cwd and HOME; temporary ones are removed on
    `cleanup()`."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._given = path is not None
        self._path: str | None = os.fspath(path) if path is not None else None
        self._adopted_temporary = False

    @classmethod
    def adopted(cls, path: str, *, temporary: bool) -> Workspace:
        """An existing workspace a resumed session takes over (a temporary one is still
        removed on `cleanup()`, as by the session that made it)."""
        workspace = cls(path)
        workspace._adopted_temporary = temporary
        return workspace

    @property
    def temporary(self) -> bool:
        """Whether `cleanup()` removes it (the session made it, or adopted one made so)."""
        return not self._given or self._adopted_temporary

    @property
    def path(self) -> str:
        """The workspace's real path (available after `create()`)."""
        if self._path is None:
            raise RuntimeError("the workspace has not been created")
        return self._path

    def create(self) -> str:
        """Create the directory (a fresh temporary one when no path was given)."""
        try:
            if self._path is None or not self._given:
                self._path = tempfile.mkdtemp(prefix=TEMPORARY_PREFIX)
            else:
                os.makedirs(self._path, exist_ok=True)
                if not os.path.isdir(self._path):
                    raise NotADirectoryError(f"{self._path!r} is not a directory")
        except OSError as exc:
            # The path was fine when the session was opened; something changed since.
            raise InvalidArgumentError(
                f"the workspace {self._path!r} cannot be created: {exc.strerror or exc}"
            ) from None
        self._path = os.path.realpath(self._path)
        return self._path

    def cleanup(self) -> None:
        """Remove a temporary workspace; a given one is left as it is. Raises
        `CleanupError` when some of it cannot be removed (the path is then kept)."""
        if self.temporary and self._path is not None:
            try:
                # What the sandbox left there is hostile (deep, symlinks, FIFOs): an
                # iterative walk that follows nothing (`files.remove_tree`).
                remove_tree(self._path)
            except SandboxError as exc:
                raise CleanupError(
                    f"the temporary workspace {self._path!r} was not removed: {exc}", [exc]
                ) from None
            self._path = None

    def cwd_for(self, cwd: str | None) -> str:
        """The working directory for a command: the workspace, or `cwd` relative to it."""
        if cwd is None:
            return self.path
        return cwd if os.path.isabs(cwd) else os.path.join(self.path, cwd)


class LocalWorkspace(WorkspaceAccess):
    """unix_local's workspace: every operation relative to a folder fd opened beneath
    the workspace (`workspace_files.LocalTree`, in a thread); archives walked and landed
    by dir fds, a batch per executor call (`tar_walk`, `tar_land`)."""

    def _tree(self) -> LocalTree:
        return LocalTree(self.session._workspace.path)

    async def stat(self, path: str) -> FileInfo:
        """`fstatat` without following, relative to the holding folder's fd."""
        return await asyncio.to_thread(self._tree().stat, path)

    async def list_dir(self, path: str) -> list[FileInfo]:
        """`scandir` of the folder opened beneath the workspace."""
        return await asyncio.to_thread(self._tree().list_dir, path)

    async def remove(self, path: str, recursive: bool) -> None:
        """`unlinkat`/`rmdir`/`remove_tree_at` relative to the holding folder's fd."""
        await asyncio.to_thread(self._tree().remove, path, recursive)

    async def make_dir(self, path: str, parents: bool) -> None:
        """`mkdirat` one name at a time, each folder opened beneath the workspace."""
        await asyncio.to_thread(self._tree().make_dir, path, parents)

    async def make_symlink(self, path: str, target: str) -> None:
        """`symlinkat` relative to the holding folder's fd."""
        await asyncio.to_thread(self._tree().make_symlink, path, target)

    async def set_mode(self, path: str, mode: int) -> None:
        """`fchmodat` relative to the holding folder's fd (symlinks left alone)."""
        await asyncio.to_thread(self._tree().set_mode, path, mode)

    def persist(self, path: str, files: FileAccess, read_limit: int) -> AsyncIterator[bytes]:
        """A walk by dir fds, a batch of archive per executor call (`tar_walk`)."""
        return tar_walk.persist(self.session._workspace.path, path)

    async def hydrate(
        self,
        chunks: AsyncIterator[bytes],
        path: str,
        files: FileAccess,
        max_members: int,
        max_bytes: int,
    ) -> int:
        """The shared extractor's rules, what it lands batched by dir fds (`tar_land`)."""
        await self.make_dir(path, True)
        return await tar_land.hydrate(
            self.session._workspace.path, path, chunks, max_members=max_members, max_bytes=max_bytes
        )


class LocalPorts(Ports):
    """The host's loopback: unconfined processes (and a jail with `network=True`) share
    the host's network; a jail without it has a network of its own."""

    async def expose(self, port: int) -> ExposedPort:
        """`127.0.0.1:port`, or `UnsupportedOperationError` in a jail without network."""
        if self.session.confine and not self.session.network:
            raise UnsupportedOperationError(
                f"port {port} cannot be exposed: this confined session has no network "
                "(open it with network=True)"
            )
        return ExposedPort(url=http_url("127.0.0.1", port), host="127.0.0.1", port=port)
