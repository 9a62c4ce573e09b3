"""Reading and writing files under a local root from the event loop, whole or streamed.

Every open goes through `backends.unix_local.safe_open` (race-free, regular files only). Each
blocking step runs as one short call in the default executor: no thread is held by a
stream between chunks. An fd is never closed while an executor call may still use it,
nor leaked when the caller is cancelled during the open: whatever is still running
closes it when it finishes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import TypeVar

from ...backend import FileAccess
from .safe_open import OpenedFile, io_error, open_regular, read_bounded, write_all

T = TypeVar("T")


async def read_whole(root: str, path: str, limit: int) -> bytes:
    """The whole regular file at `path`, refused above `limit` bytes before reading."""

    def read() -> bytes:
        opened = open_regular(root, path, write=False)
        try:
            return read_bounded(opened, path, limit)
        finally:
            os.close(opened.fd)

    return await asyncio.to_thread(read)


async def write_whole(root: str, path: str, data: bytes) -> None:
    """Replace the content of the regular file at `path` (created with its folders)."""

    def write() -> None:
        opened = open_regular(root, path, write=True)
        try:
            _truncate(opened, path)
            write_all(opened.fd, data, path)
        finally:
            os.close(opened.fd)

    await asyncio.to_thread(write)


async def read_chunks(root: str, path: str, chunk_size: int) -> AsyncIterator[bytes]:
    """The regular file at `path`, `chunk_size` bytes at a time, however large."""
    opened = await _open(root, path, write=False)
    call: asyncio.Future[bytes] | None = None
    try:
        while True:
            call = asyncio.ensure_future(asyncio.to_thread(_read_some, opened.fd, chunk_size, path))
            await asyncio.wait({call})
            chunk = call.result()
            call = None
            if not chunk:
                return
            yield chunk
    finally:
        _close_after(call, opened.fd)


async def write_chunks(root: str, path: str, chunks: AsyncIterator[bytes]) -> None:
    """Replace the content of the regular file at `path` with `chunks`, one executor call
    per chunk (a failing `chunks` leaves what was written so far)."""
    opened = await _open(root, path, write=True)
    call: asyncio.Future[None] | None = None
    try:
        call = asyncio.ensure_future(asyncio.to_thread(_truncate, opened, path))
        await asyncio.wait({call})
        call.result()
        async for chunk in chunks:
            call = asyncio.ensure_future(asyncio.to_thread(write_all, opened.fd, chunk, path))
            await asyncio.wait({call})
            call.result()
        call = None
    finally:
        _close_after(call, opened.fd)


async def _open(root: str, path: str, *, write: bool) -> OpenedFile:
    call = asyncio.ensure_future(asyncio.to_thread(open_regular, root, path, write=write))
    try:
        # wait() does not cancel the call when we are cancelled: its fd is closed below.
        await asyncio.wait({call})
    except asyncio.CancelledError:
        call.add_done_callback(_close_opened)
        raise
    return call.result()


def _close_opened(call: asyncio.Future[OpenedFile]) -> None:
    if not call.cancelled() and call.exception() is None:
        os.close(call.result().fd)


def _close_after(call: asyncio.Future[T] | None, fd: int) -> None:
    """Close `fd` now, or when the executor call still using it ends."""
    if call is None or call.done():
        os.close(fd)
        return

    def close(done: asyncio.Future[T]) -> None:
        if not done.cancelled():
            done.exception()  # consumed: nobody waits for it any more
        os.close(fd)

    call.add_done_callback(close)


def _read_some(fd: int, size: int, path: str) -> bytes:
    try:
        return os.read(fd, size)
    except OSError as exc:
        raise io_error(exc, path, write=False) from None


def _truncate(opened: OpenedFile, path: str) -> None:
    try:
        os.ftruncate(opened.fd, 0)
    except OSError as exc:
        raise io_error(exc, path, write=True) from None


class LocalFiles(FileAccess):
    """unix_local's files: resolved and opened in one step beneath the workspace
    (`safe_open`), so a process swapping a folder for a symlink cannot lead a call out
    of it; streams go through one open fd, one short executor call per chunk."""

    async def read(self, path: str, max_bytes: int) -> bytes:
        """A whole regular file (`read_whole`)."""
        return await read_whole(self.session._workspace.path, path, max_bytes)

    async def write(self, path: str, data: bytes) -> None:
        """Created with its folders, never through a link out; truncated only once known
        to be a regular file (`write_whole`)."""
        await write_whole(self.session._workspace.path, path, data)

    def read_chunks(self, path: str, chunk_size: int, max_bytes: int) -> AsyncIterator[bytes]:
        """Streamed from one open fd, with no size limit (`read_chunks`)."""
        return read_chunks(self.session._workspace.path, path, chunk_size)

    async def write_chunks(self, path: str, chunks: AsyncIterator[bytes]) -> None:
        """Streamed into one open fd (`write_chunks`)."""
        await write_chunks(self.session._workspace.path, path, chunks)
