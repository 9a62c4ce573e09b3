"""Files in the container, through the engine's archive endpoint (tar in, tar out), with
no program run in the container: an image holding nothing but `sh` will do.

Every path is checked against the workspace (the session's working directory) before
any call: `..` above it or an absolute path elsewhere is a `WorkspacePathError`. It is
then walked one component at a time by the engine's stat (HEAD on the archive
endpoint, which runs nothing): a symlink is followed by the target the engine resolved
for it, and one that leads out of the workspace is a `WorkspacePathError` too; what is
not a regular file is refused before anything is transferred (a FIFO is never opened,
a directory never replaced). Missing parents of a written file travel in the tar as
directory members owned by the session's user, extracted into the deepest folder that
exists, so the engine never follows a path the container could have planted below it:
with `noOverwriteDirNonDir` it fails, writing nothing, when a directory member meets a
symlink or file planted after the walk (or the file meets a new directory), and it
replaces a symlink at the file's own name rather than follow it. A process in the
container that swaps an existing folder of the path for a symlink between the walk and
the transfer can still redirect that one call elsewhere in its own container: only its
own container is at stake.

Blocking SDK calls run on the engine's pool; a streamed read costs one pool call per
chunk, and a streamed write is spooled to a temporary file (the tar header needs the
size), never held in memory.
"""

from __future__ import annotations

import asyncio
import posixpath
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ...backend import FileAccess
from ...errors import (
    FileTooLargeError,
    NotAFileError,
    ProviderError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)
from .archive import (
    MODE_DIR,
    MODE_NOT_REGULAR,
    MODE_SYMLINK,
    iter_first_file,
    put_tar,
    read_first_file,
    stat_path,
    tar_folders,
    tar_one_file,
    tar_spooled_file,
)
from .engine import Engine
from .errors import is_not_found

READ_CHUNK = 1024 * 1024
MAX_SYMLINK_HOPS = 16

# Builds the tar of one write: (file name, missing parents, uid, gid) -> its pieces.
MakeTar = Callable[[str, Sequence[str], int, int], Iterable[bytes | memoryview]]


def workspace_parts(workspace: str, path: str) -> list[str]:
    """The components of `path` below `workspace` (relative paths are in it), resolved
    lexically; `WorkspacePathError` for `..` above it or an absolute path elsewhere."""
    full = posixpath.normpath(posixpath.join(workspace, path))
    if full.startswith("//"):
        full = "/" + full.lstrip("/")  # POSIX lets normpath keep a leading "//"
    relative = _below(workspace, full)
    if relative is None:
        raise WorkspacePathError(f"path {path!r} is outside the workspace ({workspace})")
    return relative


def _below(workspace: str, full: str) -> list[str] | None:
    """The components of the absolute, normalized `full` below `workspace`; None when it
    is not the workspace or inside it."""
    if workspace == "/":
        return [part for part in full.split("/") if part]
    if full == workspace:
        return []
    if not full.startswith(workspace + "/"):
        return None
    return full[len(workspace) + 1 :].split("/")


@dataclass(frozen=True, slots=True)
class Located:
    """Where a path leads: the deepest existing folder on its way (`folder`), the
    folders still missing below it (`missing`), the file's name, and its size when a
    regular file is already there (None: no file yet)."""

    folder: str
    missing: tuple[str, ...]
    name: str
    size: int | None

    @property
    def target(self) -> str:
        """The file's absolute path in the container."""
        return posixpath.join(self.folder, *self.missing, self.name)


class ContainerFiles:
    """The session's file calls, through the archive endpoint only. `workspace` is the
    session's working directory (absolute, normalized); `owner` is the uid/gid written
    files and created folders get (the session's user, learned at start). Paths come as
    the caller spelled them, checked with `workspace_parts` first."""

    def __init__(
        self, engine: Engine, container_id: str, workspace: str, owner: tuple[int, int]
    ) -> None:
        self._engine = engine
        self._container_id = container_id
        self._workspace = workspace
        self._owner = owner

    async def read(self, path: str, max_bytes: int) -> bytes:
        """Stream the file out of the archive endpoint (symlinks followed within the
        workspace); what is not a regular file, or is above `max_bytes`, is refused by
        its stat before fetching."""
        parts = workspace_parts(self._workspace, path)
        engine, container_id, workspace = self._engine, self._container_id, self._workspace
        api = engine.api

        def read() -> bytes:
            found = locate(api, container_id, workspace, parts, path, write=False)
            size = found.size or 0
            if size > max_bytes:
                raise FileTooLargeError.over(path, size, max_bytes)
            chunks = _fetch(api, container_id, found.target, path)
            try:
                return read_first_file(chunks, path, max_bytes)
            finally:
                chunks.close()

        return await engine.call(f"read {path!r}", read)

    async def read_chunks(self, path: str, chunk_size: int) -> AsyncIterator[bytes]:
        """The archive stream's payload as it arrives, one pool call per chunk."""
        parts = workspace_parts(self._workspace, path)
        engine, container_id, workspace = self._engine, self._container_id, self._workspace
        api = engine.api

        def start() -> tuple[Any, Iterator[bytes]]:
            found = locate(api, container_id, workspace, parts, path, write=False)
            chunks = _fetch(api, container_id, found.target, path)
            return chunks, iter_first_file(chunks, path, chunk_size)

        chunks, pieces = await engine.call(f"read {path!r}", start)
        call: asyncio.Future[bytes | None] | None = None
        try:
            while True:
                call = engine.submit(f"read {path!r}", next, pieces, None)
                await asyncio.wait({call})  # a cancelled caller leaves the call to finish
                piece = call.result()
                call = None
                if piece is None:
                    return
                yield piece
        finally:
            # A generator cannot be closed while a pool thread runs it.
            if call is None or call.done():
                _close_stream(chunks, pieces)
            else:
                call.add_done_callback(lambda _: _close_stream(chunks, pieces))

    async def write(self, path: str, data: bytes) -> None:
        """Stream a one-file tar in (with its missing parents), owned by the session's
        user."""
        await self._put(
            path,
            lambda name, parents, uid, gid: tar_one_file(
                name, data, uid=uid, gid=gid, parents=parents
            ),
        )

    async def write_chunks(self, path: str, chunks: AsyncIterator[bytes]) -> None:
        """Spool the chunks to a temporary file (the tar header needs the size), then
        stream the tar from it: the file is never held in memory."""
        parts = workspace_parts(self._workspace, path)  # before the chunks are read
        spool = await asyncio.to_thread(tempfile.TemporaryFile)
        size = 0
        try:
            async for chunk in chunks:
                await asyncio.to_thread(spool.write, chunk)
                size += len(chunk)
            await self._put(
                path,
                lambda name, parents, uid, gid: tar_spooled_file(
                    name, spool, size, uid=uid, gid=gid, parents=parents
                ),
                parts,
            )
        except asyncio.CancelledError:
            raise  # a pool call may still use the spool: it closes once nothing holds it
        except BaseException:
            spool.close()
            raise
        spool.close()

    async def _put(self, path: str, make_tar: MakeTar, parts: list[str] | None = None) -> None:
        """Put the tar of one file where `path` leads, after walking it (see the module
        docstring). A failed put is explained by a second walk (something on the way
        changed: the caller's error, not the provider's) and retried once when the walk
        finds the way clear again (a folder removed in between)."""
        if parts is None:
            parts = workspace_parts(self._workspace, path)
        if path.endswith("/") or not parts:
            raise NotAFileError(f"cannot write {path!r}: it names a folder, not a file")
        engine, container_id, workspace = self._engine, self._container_id, self._workspace
        api = engine.api
        uid, gid = self._owner
        action = f"write {path!r}"

        def put() -> None:
            found = locate(api, container_id, workspace, parts, path, write=True)
            tar = make_tar(found.name, found.missing, uid, gid)
            try:
                put_tar(api, container_id, found.folder, tar)
                return
            except Exception as exc:
                failure = exc
            again = locate(api, container_id, workspace, parts, path, write=True)
            if again != found:  # the way changed under us: once more, on the new way
                put_tar(
                    api, container_id, again.folder, make_tar(again.name, again.missing, uid, gid)
                )
                return
            raise failure

        try:
            await engine.call(action, put)
        except ProviderError as exc:
            # The engine's words for a missing folder (a missing container is 404 too).
            missing = "could not find the file" in str(exc).lower()
            if is_not_found(exc) and missing and engine.gone_reason is None:
                raise SandboxFileNotFoundError(
                    f"cannot write {path!r}: a folder on its path disappeared while writing"
                ) from None
            raise

    async def make_folder(self, folder: str) -> None:
        """Create the absolute `folder` and its missing parents (owned by the session's
        user); nothing is sent when it exists. Used for the working directory, which
        defines the workspace: symlinks on its way are followed wherever they lead."""
        engine, container_id = self._engine, self._container_id
        api = engine.api
        uid, gid = self._owner

        def make() -> None:
            existing, missing = _existing_folder(api, container_id, folder)
            if missing:
                put_tar(api, container_id, existing, tar_folders(missing, uid=uid, gid=gid))

        await engine.call(f"create the folder {folder!r}", make)


# ---- blocking helpers run on the engine's pool -----------------------------------------


def locate(
    api: Any,
    container_id: str,
    workspace: str,
    parts: Sequence[str],
    path: str,
    *,
    write: bool,
) -> Located:
    """Walk `parts` from `workspace` by the engine's stat (see the module docstring).

    A read needs a regular file there (else `SandboxFileNotFoundError` or
    `NotAFileError`); a write accepts a missing file and missing folders, and refuses a
    directory, FIFO, socket or device there or a file on the way (`NotAFileError`). A
    symlink out of the workspace is a `WorkspacePathError`.
    """
    current = workspace
    queue = list(parts)
    hops = 0
    while queue:
        part = queue.pop(0)
        candidate = posixpath.join(current, part)
        stat = stat_path(api, container_id, candidate)
        if stat is None:
            if not write:
                raise SandboxFileNotFoundError(f"no such file in the container: {path!r}")
            rest = [part, *queue]
            return Located(current, tuple(rest[:-1]), rest[-1], None)
        mode = int(stat.get("mode", 0))
        if mode & MODE_SYMLINK:
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                raise NotAFileError(f"{path!r}: too many levels of symbolic links")
            # The engine resolved the whole chain (in the container's root): walk on
            # from what it leads to, which must still be in the workspace.
            target = str(stat.get("linkTarget") or "")
            if not target.startswith("/"):
                raise NotAFileError(f"{path!r} is a symbolic link the engine did not resolve")
            below = _below(workspace, posixpath.normpath(target))
            if below is None:
                raise WorkspacePathError(
                    f"path {path!r} leads out of the workspace ({workspace}) "
                    "through a symbolic link"
                )
            current, queue = workspace, [*below, *queue]
            if not queue:
                raise NotAFileError(f"{path!r} is a directory, not a regular file")
            continue
        if mode & MODE_DIR:
            if not queue:
                raise NotAFileError(f"{path!r} is a directory, not a regular file")
            current = candidate
            continue
        if queue:
            if write:
                raise NotAFileError(f"cannot write {path!r}: a parent on its path is not a folder")
            raise SandboxFileNotFoundError(
                f"no such file in the container: {path!r} (a parent on its path is not a folder)"
            )
        _check_regular(mode, path)
        return Located(current, (), part, int(stat.get("size", 0)))
    raise NotAFileError(f"{path!r} is a directory, not a regular file")


def _existing_folder(api: Any, container_id: str, folder: str) -> tuple[str, list[str]]:
    """The deepest existing folder on the way to the absolute `folder`, and the names of
    the folders missing below it; a non-folder on the way is a `ProviderError` (the
    session cannot start there)."""
    current = "/"
    queue = _below("/", posixpath.normpath(folder)) or []
    for _ in range(len(queue) + MAX_SYMLINK_HOPS):
        if not queue:
            return current, []
        candidate = posixpath.join(current, queue[0])
        stat = stat_path(api, container_id, candidate)
        if stat is None:
            return current, queue
        mode = int(stat.get("mode", 0))
        target = str(stat.get("linkTarget") or "")
        if mode & MODE_SYMLINK and target.startswith("/"):
            current, queue = "/", [*(_below("/", posixpath.normpath(target)) or []), *queue[1:]]
        elif mode & MODE_DIR:
            current, queue = candidate, queue[1:]
        else:
            break
    raise ProviderError(
        f"the working directory {folder!r} cannot be created: {candidate!r} is not a folder",
        retryable=False,
    )


def _check_regular(mode: int, path: str) -> None:
    if mode & MODE_DIR:
        raise NotAFileError(f"{path!r} is a directory, not a regular file")
    if mode & MODE_NOT_REGULAR:
        raise NotAFileError(f"{path!r} is not a regular file")


def _fetch(api: Any, container_id: str, target: str, path: str) -> Any:
    """The archive stream of the regular file at `target` (checked again: it may have
    changed since `locate`)."""
    try:
        chunks, stat = api.get_archive(container_id, target, chunk_size=READ_CHUNK)
    except Exception as exc:
        if is_not_found(exc):
            raise SandboxFileNotFoundError(f"no such file in the container: {path!r}") from None
        raise
    try:
        _check_regular(int((stat or {}).get("mode", 0)), path)
    except BaseException:
        chunks.close()
        raise
    return chunks


def _close_stream(chunks: Any, pieces: Iterator[bytes]) -> None:
    close = getattr(pieces, "close", None)
    if close is not None:
        close()
    chunks.close()


class DockerFiles(FileAccess):
    """docker's files, through the archive endpoint (`ContainerFiles`): the path
    checked against the workspace first, symlinks followed within it, a non-regular
    file or one above `max_bytes` refused by its stat before fetching; nothing runs in
    the container."""

    async def read(self, path: str, max_bytes: int) -> bytes:
        """The file's archive, its one member's payload."""
        files: ContainerFiles = self.session._files()
        return await files.read(path, max_bytes)

    async def write(self, path: str, data: bytes) -> None:
        """A one-file tar owned by the session's user; missing parents travel in it."""
        await self.session._files().write(path, data)

    def read_chunks(self, path: str, chunk_size: int, max_bytes: int) -> AsyncIterator[bytes]:
        """The archive stream's payload as it arrives, one pool call per chunk (no size
        limit)."""
        files: ContainerFiles = self.session._files()
        return files.read_chunks(path, chunk_size)

    async def write_chunks(self, path: str, chunks: AsyncIterator[bytes]) -> None:
        """Spooled to a temporary file, then streamed as a tar (never held in memory)."""
        await self.session._files().write_chunks(path, chunks)
