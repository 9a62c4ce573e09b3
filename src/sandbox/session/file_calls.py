"""`FileCalls`: the session's file calls, from the caller's arguments to the backend's hook.

Each call checks that the session may be used (`ready`, then the durable `guard`: the
lease of a shared session, for every call that reaches the sandbox), checks its
arguments (`sandbox.files.arguments`), then calls the backend's `FileAccess` once. The
bound a backend cannot apply before reading (`FileTooLargeError` on the returned
length) and the re-cutting of chunks a backend made too long are done here, for every
backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable

from .. import arguments
from ..errors import FileTooLargeError
from ..files import arguments as files
from .capabilities import FileAccess

Chunks = (
    AsyncIterable[bytes | bytearray | memoryview | str]
    | Iterable[bytes | bytearray | memoryview | str]
)


async def guarded(
    guard: Callable[[], Awaitable[None]], stream: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """`stream` once `guard()` passed (checked at the first chunk: a stream call returns
    before anything is read); closing this closes `stream`."""
    try:
        await guard()
        async for chunk in stream:
            yield chunk
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


class FileCalls:
    """`read_file`, `write_file`, `read_file_chunks`, `write_file_chunks` over `files`.

    `ready()` raises when the session is not running; `guard()` when another client
    took the sandbox over. The default read limit is `read_limit()`, asked at each call
    (it is the session's option)."""

    def __init__(
        self,
        files: FileAccess,
        *,
        read_limit: Callable[[], int],
        ready: Callable[[], None],
        guard: Callable[[], Awaitable[None]],
    ) -> None:
        self._files = files
        self._read_limit = read_limit
        self._ready = ready
        self._guard = guard

    async def _enter(self) -> None:
        self._ready()
        await self._guard()

    async def read_file(self, path: str, max_bytes: int | None) -> bytes:
        """`BaseSandboxSession.read_file`."""
        await self._enter()
        path = files.check_path(path)
        limit = self._read_limit()
        if max_bytes is not None:
            limit = files.check_byte_count(max_bytes, "max_bytes")
        data = await self._files.read(path, limit)
        if len(data) > limit:  # backends that cannot tell the size first
            raise FileTooLargeError.over(path, len(data), limit)
        return data

    async def write_file(self, path: str, data: bytes | str) -> None:
        """`BaseSandboxSession.write_file`."""
        await self._enter()
        path = files.check_path(path)
        payload = arguments.to_input_bytes(data)
        await self._files.write(path, payload)

    def read_file_chunks(self, path: str, chunk_size: int) -> AsyncIterator[bytes]:
        """`BaseSandboxSession.read_file_chunks` (a plain call: it returns the stream)."""
        self._ready()
        path = files.check_path(path)
        size = files.check_chunk_size(chunk_size)
        stream = files.at_most(self._files.read_chunks(path, size, self._read_limit()), size)
        return guarded(self._guard, stream)

    async def write_file_chunks(self, path: str, chunks: Chunks) -> None:
        """`BaseSandboxSession.write_file_chunks`."""
        await self._enter()
        path = files.check_path(path)
        await self._files.write_chunks(path, files.chunks_of(chunks, path))
