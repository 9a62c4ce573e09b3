"""Files in the container, through the engine's archive endpoint (tar in, tar out).

Reads follow symlinks by the engine's stat and refuse what is not a regular file (or is
above the limit) before fetching anything; writes check what is at the path first,
since the archive endpoint would replace a directory (and all it holds), a FIFO or a
device with the file. Blocking SDK calls run on the engine's pool; a streamed read
costs one pool call per chunk, and a streamed write is spooled to a temporary file
(the tar header needs the size), never held in memory.
"""

from __future__ import annotations

import asyncio
import posixpath
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

from ...errors import (
    FileTooLargeError,
    NotAFileError,
    ProviderError,
    SandboxFileNotFoundError,
)
from .archive import (
    MODE_DIR,
    MODE_NOT_REGULAR,
    MODE_SYMLINK,
    iter_first_file,
    read_first_file,
    stat_path,
    tar_one_file,
    tar_spooled_file,
)
from .engine import Engine
from .errors import is_not_found

READ_CHUNK = 1024 * 1024
MAX_SYMLINK_HOPS = 16

# Creates a missing parent directory as the session's user: (exit code, stderr).
MakeDirectory = Callable[[str], Awaitable[tuple[int, bytes]]]


class ContainerFiles:
    """The session's file calls. `owner` is the uid/gid written files get (the
    session's user, learned at start); `make_directory` runs `mkdir -p` as that user.
    Paths come resolved (`full`, absolute in the container) beside the caller's
    spelling (`path`, for messages)."""

    def __init__(
        self,
        engine: Engine,
        container_id: str,
        owner: tuple[int, int],
        make_directory: MakeDirectory,
    ) -> None:
        self._engine = engine
        self._container_id = container_id
        self._owner = owner
        self._make_directory = make_directory

    async def read(self, full: str, path: str, max_bytes: int) -> bytes:
        """Stream the file out of the archive endpoint (symlinks followed); what is not a
        regular file, or is above `max_bytes`, is refused by its stat before fetching."""
        engine, container_id = self._engine, self._container_id
        api = engine.api

        def read() -> bytes:
            target, size = _locate(api, container_id, full, path, write=False)
            if size is not None and size > max_bytes:
                raise FileTooLargeError.over(path, size, max_bytes)
            chunks = _fetch(api, container_id, target, path)
            try:
                return read_first_file(chunks, path, max_bytes)
            finally:
                chunks.close()

        return await engine.call(f"read {path!r}", read)

    async def read_chunks(self, full: str, path: str, chunk_size: int) -> AsyncIterator[bytes]:
        """The archive stream's payload as it arrives, one pool call per chunk."""
        engine, container_id = self._engine, self._container_id
        api = engine.api

        def start() -> tuple[Any, Iterator[bytes]]:
            target, _ = _locate(api, container_id, full, path, write=False)
            chunks = _fetch(api, container_id, target, path)
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

    async def write(self, full: str, path: str, data: bytes) -> None:
        """Stream a one-file tar in, owned by the session's user."""
        await self._put(
            full, path, lambda name, uid, gid: tar_one_file(name, data, uid=uid, gid=gid)
        )

    async def write_chunks(self, full: str, path: str, chunks: AsyncIterator[bytes]) -> None:
        """Spool the chunks to a temporary file (the tar header needs the size), then
        stream the tar from it: the file is never held in memory."""
        spool = await asyncio.to_thread(tempfile.TemporaryFile)
        size = 0
        try:
            async for chunk in chunks:
                await asyncio.to_thread(spool.write, chunk)
                size += len(chunk)
            await self._put(
                full,
                path,
                lambda name, uid, gid: tar_spooled_file(name, spool, size, uid=uid, gid=gid),
            )
        except asyncio.CancelledError:
            raise  # a pool call may still use the spool: it closes once nothing holds it
        except BaseException:
            spool.close()
            raise
        spool.close()

    async def _put(
        self,
        full: str,
        path: str,
        make_tar: Callable[[str, int, int], Iterable[bytes | memoryview]],
    ) -> None:
        """Put a one-file tar at `path` after checking what is there: the archive
        endpoint would replace a directory (and all it holds), a FIFO or a device with
        the file. A final symlink is followed (bounded). A missing parent directory is
        created (as the session's user) and the write retried. A process in the
        container that swaps the path between the check and the put can still have it
        replaced: only its own container is at stake."""
        engine, container_id = self._engine, self._container_id
        if path.endswith("/") or full == "/":
            raise NotAFileError(f"cannot write {path!r}: it names a folder, not a file")
        api = engine.api
        target, _ = await engine.call(
            f"write {path!r}", _locate, api, container_id, full, path, write=True
        )
        directory, name = posixpath.split(target)
        uid, gid = self._owner

        async def put() -> None:
            await engine.call(
                f"write {path!r}",
                api.put_archive,
                container_id,
                directory,
                make_tar(name, uid, gid),
            )

        async def explain(exc: ProviderError) -> None:
            """A file on the way is the caller's mistake, not the provider's."""
            blocker = await engine.call(
                f"write {path!r}", _file_on_the_way, api, container_id, target
            )
            if blocker is not None:
                raise NotAFileError(
                    f"cannot write {path!r}: a parent on its path is not a folder"
                ) from None
            raise exc

        try:
            await put()
            return
        except ProviderError as exc:
            if engine.gone_reason is not None:
                raise
            if not is_not_found(exc):
                await explain(exc)
        # The parent directory is missing: create it as the session's user, then retry.
        code, stderr = await self._make_directory(directory)
        if code != 0:
            await explain(
                ProviderError(
                    f"could not create the directory of {path!r}: "
                    f"{stderr.decode('utf-8', 'replace').strip()[-300:]}",
                    retryable=False,
                )
            )
        await put()


# ---- blocking helpers run on the engine's pool -----------------------------------------


def _locate(
    api: Any, container_id: str, full: str, path: str, *, write: bool
) -> tuple[str, int | None]:
    """Follow symlinks from `full` by the engine's stat: the path of the regular file
    there and its size, or (for a write) where a new file goes and None. A directory,
    FIFO, socket or device raises `NotAFileError`; for a read, nothing there raises
    `SandboxFileNotFoundError`."""
    current = full
    for _ in range(MAX_SYMLINK_HOPS):
        try:
            stat = stat_path(api, container_id, current)
        except ProviderError:
            if _file_on_the_way(api, container_id, current) is None:
                raise
            if write:
                raise NotAFileError(
                    f"cannot write {path!r}: a parent on its path is not a folder"
                ) from None
            raise SandboxFileNotFoundError(
                f"no such file in the container: {path!r} (a parent on its path is not a folder)"
            ) from None
        if stat is None:
            if write:
                return current, None
            raise SandboxFileNotFoundError(f"no such file in the container: {path!r}")
        mode = int(stat.get("mode", 0))
        if mode & MODE_SYMLINK and stat.get("linkTarget"):
            current = str(stat["linkTarget"])
            continue
        _check_regular(mode, path)
        return current, int(stat.get("size", 0))
    raise NotAFileError(f"{path!r}: too many levels of symbolic links")


def _check_regular(mode: int, path: str) -> None:
    if mode & MODE_DIR:
        raise NotAFileError(f"{path!r} is a directory, not a regular file")
    if mode & MODE_NOT_REGULAR:
        raise NotAFileError(f"{path!r} is not a regular file")


def _fetch(api: Any, container_id: str, target: str, path: str) -> Any:
    """The archive stream of the regular file at `target` (checked again: it may have
    changed since `_locate`)."""
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


def _file_on_the_way(api: Any, container_id: str, full: str) -> str | None:
    """The nearest existing ancestor of `full` when it is not a directory (what makes a
    write under it fail), else None."""
    current = posixpath.dirname(full)
    while current not in ("/", ""):
        try:
            stat = stat_path(api, container_id, current)
        except ProviderError:
            stat = None  # itself under a file: look further up
        if stat is not None:
            mode = int(stat.get("mode", 0))
            return None if mode & (MODE_DIR | MODE_SYMLINK) else current
        current = posixpath.dirname(current)
    return None


def _close_stream(chunks: Any, pieces: Iterator[bytes]) -> None:
    close = getattr(pieces, "close", None)
    if close is not None:
        close()
    chunks.close()
