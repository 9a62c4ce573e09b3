"""The workspace calls' argument checks and the glue between a session's hooks and the
walk (`persist`) or the extractor (`extract`): what `BaseSandboxSession`'s thin public
methods call."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Protocol

from ..errors import InvalidArgumentError
from .info import FileInfo


class Tree(Protocol):
    """The workspace operations the walk and the extractor go through (a
    `WorkspaceAccess`; a Protocol so that this module does not import the session)."""

    async def stat(self, path: str) -> FileInfo: ...

    async def list_dir(self, path: str) -> list[FileInfo]: ...

    async def make_dir(self, path: str, parents: bool) -> None: ...

    async def set_mode(self, path: str, mode: int) -> None: ...

    async def make_symlink(self, path: str, target: str) -> None: ...


class Files(Protocol):
    """The file operations they go through (a `FileAccess`)."""

    def read_chunks(self, path: str, chunk_size: int, max_bytes: int) -> AsyncIterator[bytes]: ...

    async def write(self, path: str, data: bytes) -> None: ...

    async def write_chunks(self, path: str, chunks: AsyncIterator[bytes]) -> None: ...


def check_flag(value: object, name: str) -> bool:
    """A bool argument (not a truthy object: `recursive="no"` must not delete a tree)."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a bool, not {value!r}")
    return value


def check_limit(value: object, name: str) -> int:
    """A positive int limit."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be an int >= 1, not {value!r}")
    return value


class TreeSource:
    """`persist.Source` over a workspace and its files (`read_limit`: the bound of a
    file fetched whole first)."""

    def __init__(self, tree: Tree, files: Files, read_limit: int) -> None:
        self._tree = tree
        self._files = files
        self._read_limit = read_limit

    async def stat(self, path: str) -> FileInfo:
        """The workspace's `stat`."""
        return await self._tree.stat(path)

    async def list_dir(self, path: str) -> list[FileInfo]:
        """The workspace's `list_dir`."""
        return await self._tree.list_dir(path)

    def read_chunks(self, path: str) -> AsyncIterator[bytes]:
        """The files' `read_chunks`, 1 MiB at a time."""
        return self._files.read_chunks(path, 1024 * 1024, self._read_limit)


class TreeSink:
    """`extract.Sink` over a workspace and its files, below the folder `root`."""

    def __init__(self, tree: Tree, files: Files, root: str) -> None:
        self._tree = tree
        self._files = files
        self._root = root

    def _path(self, path: str) -> str:
        return path if self._root in ("", ".") else f"{self._root.rstrip('/')}/{path}"

    async def make_dir(self, path: str, mode: int) -> None:
        """`make_dir` with parents, then `set_mode`."""
        full = self._path(path)
        await self._tree.make_dir(full, True)
        await self._tree.set_mode(full, mode)

    async def write_file(
        self, path: str, chunks: AsyncIterator[bytes], size: int, mode: int
    ) -> None:
        """`write_chunks` (an empty file by `write`), then `set_mode`."""
        full = self._path(path)
        if size == 0:
            await self._files.write(full, b"")
        else:
            await self._files.write_chunks(full, _nonempty(chunks))
        await self._tree.set_mode(full, mode)

    async def make_symlink(self, path: str, target: str) -> None:
        """`make_symlink`."""
        await self._tree.make_symlink(self._path(path), target)


async def _nonempty(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        if chunk:
            yield chunk


async def archive_chunks(
    source: AsyncIterable[bytes | bytearray | memoryview]
    | Iterable[bytes | bytearray | memoryview],
) -> AsyncIterator[bytes]:
    """The caller's archive chunks as one async stream of bytes."""
    if isinstance(source, bytes | bytearray | memoryview | str):
        raise InvalidArgumentError(
            "hydrate_workspace takes an iterable of chunks (wrap one bytes object in a list)"
        )
    if isinstance(source, AsyncIterable):
        async for chunk in source:
            yield _bytes(chunk)
    elif isinstance(source, Iterable):
        for chunk in source:
            yield _bytes(chunk)
    else:
        raise InvalidArgumentError(f"hydrate_workspace takes chunks, not {source!r}")


def _bytes(chunk: object) -> bytes:
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, bytearray | memoryview):
        return bytes(chunk)
    raise InvalidArgumentError(f"archive chunks must be bytes, not {type(chunk).__name__}")
