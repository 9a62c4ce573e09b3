"""A workspace (or a subtree) walked into a streamed pax tar through a backend's file
calls: the portable way, used where the provider has no archive of its own.

Depth first, names sorted, one directory listing per level held at a time and one
chunk of file data: memory stays bounded however big the tree. Member names are
relative to the walked folder (a walked file is one member named after it). Symlinks
are stored, never followed; FIFOs, sockets and devices are left out (their content is
not data). A file that changes size while it is read still yields a valid archive: its
member carries the size the stat said, cut or padded with zeros; a file or folder
removed between its listing and its reading is left out.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from ..errors import SandboxFileNotFoundError
from .info import FileInfo
from .tar_writer import END, dir_header, file_header, padding, symlink_header

PAD_PIECE = 1024 * 1024


class Source(Protocol):
    """What a walk reads, through the session's confined file calls."""

    async def stat(self, path: str) -> FileInfo:
        """The entry at `path` (not followed)."""

    async def list_dir(self, path: str) -> list[FileInfo]:
        """The entries of the directory `path`."""

    def read_chunks(self, path: str) -> AsyncIterator[bytes]:
        """The regular file at `path`, streamed."""


async def walk_tar(source: Source, path: str) -> AsyncGenerator[bytes, None]:
    """The tar of what `path` names (see the module docstring)."""
    top = await source.stat(path)
    inner = _folder(source, top.path, "") if top.kind == "dir" else _member(source, top, top.name)
    # Closed explicitly: a consumer that stops early must close the open file now, not
    # when the garbage collector finalizes the nested generators.
    async with contextlib.aclosing(inner) as pieces:
        async for piece in pieces:
            yield piece
    yield END


async def _folder(source: Source, path: str, prefix: str) -> AsyncGenerator[bytes, None]:
    try:
        listed = await source.list_dir(path)
    except SandboxFileNotFoundError:
        if not prefix:
            raise
        return  # removed while walked: its header is out, its content is gone
    entries = sorted(listed, key=lambda info: info.name)
    for entry in entries:
        name = prefix + entry.name
        async with contextlib.aclosing(_member(source, entry, name)) as pieces:
            async for piece in pieces:
                yield piece
        if entry.kind == "dir":
            async with contextlib.aclosing(_folder(source, entry.path, name + "/")) as pieces:
                async for piece in pieces:
                    yield piece


async def _member(source: Source, entry: FileInfo, name: str) -> AsyncGenerator[bytes, None]:
    if entry.kind == "dir":
        yield dir_header(name, mode=entry.mode, mtime=entry.mtime)
    elif entry.kind == "symlink":
        yield symlink_header(name, entry.link_target or "", mtime=entry.mtime)
    elif entry.kind == "file":
        chunks = source.read_chunks(entry.path)
        try:
            # Opened before its header goes out: a file removed since the listing (a
            # pid file, a temporary file) is left out, not sent as zeros.
            first = await anext(chunks, b"")
        except SandboxFileNotFoundError:
            await _close(chunks)
            return
        yield file_header(name, size=entry.size, mode=entry.mode, mtime=entry.mtime)
        async with contextlib.aclosing(exact(_after(first, chunks), entry.size)) as data:
            async for piece in data:
                yield piece
        yield padding(entry.size)


async def _after(first: bytes, rest: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    try:
        if first:
            yield first
        async for chunk in rest:
            yield chunk
    finally:
        await _close(rest)


async def _close(chunks: AsyncIterator[bytes]) -> None:
    closer = getattr(chunks, "aclose", None)
    if closer is not None:
        await closer()


async def exact(chunks: AsyncIterator[bytes], size: int) -> AsyncGenerator[bytes, None]:
    """Exactly `size` bytes of `chunks`: cut when it holds more, zeros when less."""
    left = size
    try:
        async for chunk in chunks:
            if len(chunk) >= left:
                if left:
                    yield chunk[:left]
                left = 0
                break
            left -= len(chunk)
            yield chunk
    finally:
        closer = getattr(chunks, "aclose", None)
        if closer is not None:
            await closer()
    while left:
        piece = min(left, PAD_PIECE)
        yield b"\0" * piece
        left -= piece
