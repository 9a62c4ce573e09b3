"""Files in and out of a container through the engine's tar archive endpoints, streamed.

`write_file` sends a tar built on the fly: a directory member per missing parent (see
`files`), the file's header, then the caller's bytes as memoryview slices (never
copied), then the padding; `write_file_chunks` spools the chunks to a temporary file
first (the header needs the size) and streams from it. `put_tar` uploads it.
`read_file` parses the tar stream as it arrives and writes the member's payload into one
buffer, so the file is held in memory once, plus one chunk; `read_file_chunks` yields
the payload as it arrives. `stat_path` asks the engine what a path is (HEAD on the
archive endpoint) without fetching anything.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import docker.utils

from ...errors import FileTooLargeError, NotAFileError, ProviderError

BLOCK = 512
WRITE_CHUNK = 1024 * 1024

# Go's os.FileMode bits as the engine reports them in the archive stat header.
MODE_DIR = 1 << 31
MODE_SYMLINK = 1 << 27
# The mode of folders the archive creates: what `mkdir -p` gives under umask 022.
DIR_MODE = 0o755
MODE_NOT_REGULAR = (
    MODE_DIR | MODE_SYMLINK | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
)


def _header(name: str, size: int, uid: int, gid: int, mode: int, kind: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.uid = uid
    info.gid = gid
    info.mode = mode
    info.mtime = int(time.time())
    info.type = kind
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def _folders(parents: Sequence[str], uid: int, gid: int, mode: int = DIR_MODE) -> Iterator[bytes]:
    """The directory members that create `parents` (each inside the one before), owned
    and permitted as `mkdir -p` under the usual umask would make them (or `mode`)."""
    for depth in range(1, len(parents) + 1):
        yield _header("/".join(parents[:depth]) + "/", 0, uid, gid, mode, tarfile.DIRTYPE)


def tar_one_file(
    name: str,
    data: bytes,
    *,
    uid: int = 0,
    gid: int = 0,
    mode: int = 0o644,
    parents: Sequence[str] = (),
    parents_mode: int = DIR_MODE,
) -> Iterator[bytes | memoryview]:
    """Yield a tar archive holding `data` as the file `name`, without copying `data`;
    inside the folders `parents` (created by the archive, in order, with `parents_mode`)
    when given."""
    yield from _folders(parents, uid, gid, parents_mode)
    yield _header("/".join([*parents, name]), len(data), uid, gid, mode, tarfile.REGTYPE)
    view = memoryview(data)
    for start in range(0, len(view), WRITE_CHUNK):
        yield view[start : start + WRITE_CHUNK]
    padding = -len(data) % BLOCK
    yield b"\0" * (padding + 2 * BLOCK)


def tar_spooled_file(
    name: str,
    spool: IO[bytes],
    size: int,
    *,
    uid: int = 0,
    gid: int = 0,
    mode: int = 0o644,
    parents: Sequence[str] = (),
) -> Iterator[bytes]:
    """Yield a tar archive holding the first `size` bytes of `spool` as the file `name`
    (inside the folders `parents`, as `tar_one_file`), read a chunk at a time (the
    engine's request thread iterates it)."""
    yield from _folders(parents, uid, gid)
    yield _header("/".join([*parents, name]), size, uid, gid, mode, tarfile.REGTYPE)
    spool.seek(0)
    left = size
    while left:
        piece = spool.read(min(WRITE_CHUNK, left))
        if not piece:
            raise ProviderError(f"the spooled copy of {name!r} ended early", retryable=False)
        left -= len(piece)
        yield piece
    yield b"\0" * (-size % BLOCK + 2 * BLOCK)


def tar_folders(parents: Sequence[str], *, uid: int = 0, gid: int = 0) -> Iterator[bytes]:
    """Yield a tar archive holding only the folders `parents` (each inside the one
    before)."""
    yield from _folders(parents, uid, gid)
    yield b"\0" * (2 * BLOCK)


def put_tar(
    api: Any, container_id: str, directory: str, data: Iterable[bytes | memoryview]
) -> None:
    """Extract the tar `data` into the existing folder `directory` of the container.

    `noOverwriteDirNonDir` makes the engine fail rather than replace a directory with a
    file (or a file with a directory) that appeared after our stat. The SDK's
    `put_archive` cannot pass it, so this is its request with that one parameter more.
    """
    response = api._put(
        api._url("/containers/{0}/archive", container_id),
        params={"path": directory, "noOverwriteDirNonDir": "true"},
        data=data,
    )
    api._raise_for_status(response)


def stat_path(api: Any, container_id: str, path: str) -> dict[str, Any] | None:
    """The engine's stat of `path` in the container (symlinks not followed), None when it
    does not exist; another failure (a parent that is a file: 500) raises ProviderError."""
    response = api.head(api._url("/containers/{0}/archive", container_id), params={"path": path})
    if response.status_code == 404:
        return None
    encoded = response.headers.get("x-docker-container-path-stat")
    if response.status_code != 200 or not encoded:
        raise ProviderError(
            f"the Docker engine answered {response.status_code} to a stat of {path!r}",
            retryable=response.status_code in (408, 429, 502, 503, 504),
        )
    stat: dict[str, Any] = docker.utils.decode_json_header(encoded)
    return stat


class _ChunkReader:
    """Reads exact byte counts from an iterator of chunks."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""
        self._pos = 0

    def _more(self) -> bool:
        # Only called once the current chunk is used up.
        for chunk in self._chunks:
            if chunk:
                self._buffer = chunk
                self._pos = 0
                return True
        return False

    def read_exact(self, size: int) -> bytes:
        """Exactly `size` bytes (short only at the end of the stream)."""
        parts: list[bytes] = []
        need = size
        while need:
            if self._pos >= len(self._buffer) and not self._more():
                break
            piece = self._buffer[self._pos : self._pos + need]
            self._pos += len(piece)
            need -= len(piece)
            parts.append(piece)
        return b"".join(parts)

    def copy_to(self, out: io.BytesIO, size: int) -> int:
        """Copy `size` bytes into `out`, chunk by chunk; returns how many were copied."""
        copied = 0
        while copied < size:
            if self._pos >= len(self._buffer) and not self._more():
                break
            end = min(len(self._buffer), self._pos + size - copied)
            out.write(memoryview(self._buffer)[self._pos : end])
            copied += end - self._pos
            self._pos = end
        return copied


def _pax_size(payload: bytes) -> int | None:
    """The `size` record of a PAX extended header, if any."""
    pos = 0
    size: int | None = None
    while pos < len(payload):
        space = payload.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(payload[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        record = payload[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        if key == b"size":
            size = int(value)
        pos += length
    return size


def _first_file_size(reader: _ChunkReader, path: str) -> int:
    """Parse the headers before the first regular file's payload; its size."""
    size_override: int | None = None
    while True:
        header = reader.read_exact(BLOCK)
        if len(header) < BLOCK or header.count(0) == BLOCK:
            raise ProviderError(f"the archive of {path!r} ended early", retryable=True)
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        except tarfile.TarError as exc:
            raise ProviderError(f"the archive of {path!r} is damaged: {exc}") from exc
        padded = info.size + (-info.size % BLOCK)
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE):
            payload = reader.read_exact(padded)[: info.size]
            if info.type == tarfile.XHDTYPE:
                size_override = _pax_size(payload)
            continue
        if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            reader.read_exact(padded)
            continue
        if not info.isreg():
            # The path changed between the stat and the fetch: still not read.
            raise NotAFileError(f"{path!r} is not a regular file")
        return size_override if size_override is not None else info.size


def read_first_file(chunks: Iterable[bytes], path: str, max_bytes: int | None = None) -> bytes:
    """The payload of the first regular file in a tar stream (the engine's archive of
    one file), parsed as it streams in; refused above `max_bytes` before copying."""
    reader = _ChunkReader(chunks)
    size = _first_file_size(reader, path)
    if max_bytes is not None and size > max_bytes:
        raise FileTooLargeError.over(path, size, max_bytes)
    out = io.BytesIO()
    if reader.copy_to(out, size) != size:
        raise ProviderError(f"the archive of {path!r} ended early", retryable=True)
    # getvalue() hands over the buffer without a copy when it is exactly full.
    return out.getvalue()


def iter_first_file(chunks: Iterable[bytes], path: str, chunk_size: int) -> Iterator[bytes]:
    """The payload of the first regular file in a tar stream, `chunk_size` bytes at a
    time, as it streams in (a blocking iterator: drive it from a worker thread)."""
    reader = _ChunkReader(chunks)
    left = _first_file_size(reader, path)
    while left:
        piece = reader.read_exact(min(chunk_size, left))
        if not piece:
            raise ProviderError(f"the archive of {path!r} ended early", retryable=True)
        left -= len(piece)
        yield piece
