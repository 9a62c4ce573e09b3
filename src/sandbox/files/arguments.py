"""Arguments of the file calls, checked once for every backend: paths, read limits,
chunk sizes, and the caller's chunks (sync or async iterables) as one async stream."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable

from ..errors import InvalidArgumentError

DEFAULT_READ_LIMIT = 64 * 1024 * 1024
DEFAULT_CHUNK_SIZE = 1024 * 1024


def check_path(path: object) -> str:
    """A non-empty str without NUL bytes (no backend can name such a file: some would cut
    the path at the NUL and touch another file) and without lone surrogates (remote
    backends send paths as UTF-8)."""
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(f"path must be a non-empty str, not {path!r}")
    if "\0" in path:
        raise InvalidArgumentError(f"path {path!r} contains a NUL byte")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"path {path!r} holds a lone surrogate (it has no UTF-8 form)"
        ) from None
    return path


def check_byte_count(value: object, name: str) -> int:
    """A byte count: an int >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be an int >= 0, not {value!r}")
    return value


def check_chunk_size(value: object) -> int:
    """A chunk size: an int >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"chunk_size must be an int >= 1, not {value!r}")
    return value


async def chunks_of(
    source: AsyncIterable[bytes | bytearray | memoryview | str]
    | Iterable[bytes | bytearray | memoryview | str],
    path: str,
) -> AsyncIterator[bytes]:
    """The caller's chunks as bytes (str is UTF-8 encoded), empty ones skipped. A sync
    iterable is iterated on the event loop: pass an async one for a slow source."""
    if isinstance(source, bytes | bytearray | memoryview | str):
        raise InvalidArgumentError(
            f"write_file_chunks({path!r}) takes an iterable of chunks; use write_file for "
            "one bytes object"
        )
    if isinstance(source, AsyncIterable):
        async for chunk in source:
            data = _chunk_bytes(chunk, path)
            if data:
                yield data
    elif isinstance(source, Iterable):
        for chunk in source:
            data = _chunk_bytes(chunk, path)
            if data:
                yield data
    else:
        raise InvalidArgumentError(
            f"write_file_chunks({path!r}) takes an iterable or async iterable of bytes, "
            f"not {type(source).__name__}"
        )


def _chunk_bytes(chunk: object, path: str) -> bytes:
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, bytearray | memoryview):
        return bytes(chunk)
    if isinstance(chunk, str):
        return chunk.encode("utf-8")
    raise InvalidArgumentError(
        f"a chunk for {path!r} must be bytes or str, not {type(chunk).__name__}"
    )


async def at_most(chunks: AsyncIterator[bytes], chunk_size: int) -> AsyncIterator[bytes]:
    """`chunks` re-cut so that none is longer than `chunk_size` (empty ones dropped)."""
    async for chunk in chunks:
        if len(chunk) <= chunk_size:
            if chunk:
                yield chunk
            continue
        view = memoryview(chunk)
        for start in range(0, len(view), chunk_size):
            yield bytes(view[start : start + chunk_size])
