"""`FileCalls`: the session's file calls, from the caller's arguments to the backend's hook.

Each call is admitted first (`Admission.admit`: the session runs, and no other client
took a shared sandbox over), checks its
arguments (`sandbox.files.arguments`), then calls the backend's `FileAccess` once. The
bound a backend cannot apply before reading (`FileTooLargeError` on the returned
length) and the re-cutting of chunks a backend made too long are done here, for every
backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable

from .. import arguments
from ..errors import FileTooLargeError
from ..files import arguments as files
from .admission import Admission
from .capabilities import FileAccess

Chunks = (
    AsyncIterable[bytes | bytearray | memoryview | str]
    | Iterable[bytes | bytearray | memoryview | str]
)


async def admitted(admission: Admission, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`stream` once `admission.admit()` passed (checked at the first chunk: a stream
    call returns before anything is read); closing this closes `stream`."""
    try:
        await admission.admit()
        async for chunk in stream:
            yield chunk
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


class FileCalls:
    """`read_file`, `write_file`, `read_file_chunks`, `write_file_chunks` over `files`.

    `admission` is the session's lifecycle: every call is admitted by it first. The
    default read limit is `read_limit` (the session's option)."""

    def __init__(
        self,
        files: FileAccess,
        *,
        read_limit: int,
        admission: Admission,
    ) -> None:
        self._files = files
        self._read_limit = read_limit
        self._admission = admission

    async def read_file(self, path: str, max_bytes: int | None) -> bytes:
        """`BaseSandboxSession.read_file`."""
        await self._admission.admit()
        path = files.check_path(path)
        limit = self._read_limit
        if max_bytes is not None:
            limit = files.check_byte_count(max_bytes, "max_bytes")
        data = await self._files.read(path, limit)
        if len(data) > limit:  # backends that cannot tell the size first
            raise FileTooLargeError.over(path, len(data), limit)
        return data

    async def write_file(self, path: str, data: bytes | str) -> None:
        """`BaseSandboxSession.write_file`."""
        await self._admission.admit()
        path = files.check_path(path)
        payload = arguments.to_input_bytes(data)
        await self._files.write(path, payload)

    def read_file_chunks(self, path: str, chunk_size: int) -> AsyncIterator[bytes]:
        """`BaseSandboxSession.read_file_chunks` (a plain call: it returns the stream)."""
        self._admission.admit_now()
        path = files.check_path(path)
        size = files.check_chunk_size(chunk_size)
        stream = files.at_most(self._files.read_chunks(path, size, self._read_limit), size)
        return admitted(self._admission, stream)

    async def write_file_chunks(self, path: str, chunks: Chunks) -> None:
        """`BaseSandboxSession.write_file_chunks`."""
        await self._admission.admit()
        path = files.check_path(path)
        await self._files.write_chunks(path, files.chunks_of(chunks, path))
