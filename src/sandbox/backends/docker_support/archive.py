"""Files in and out of a container through the engine's tar archive endpoints, streamed.

`write_file` sends a one-member tar built on the fly: the header, then the caller's bytes
as memoryview slices (never copied), then the padding. `read_file` parses the tar stream
as it arrives and writes the member's payload into one buffer, so the file is held in
memory once, plus one chunk.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterable, Iterator

from ...errors import ProviderError

BLOCK = 512
WRITE_CHUNK = 1024 * 1024

# Go's os.FileMode bits as the engine reports them in the archive stat header.
MODE_DIR = 1 << 31
MODE_SYMLINK = 1 << 27
MODE_NOT_REGULAR = (
    MODE_DIR | MODE_SYMLINK | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
)


def tar_one_file(
    name: str, data: bytes, *, uid: int = 0, gid: int = 0, mode: int = 0o644
) -> Iterator[bytes | memoryview]:
    """Yield a tar archive holding `data` as the file `name`, without copying `data`."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.uid = uid
    info.gid = gid
    info.mode = mode
    info.mtime = int(time.time())
    info.type = tarfile.REGTYPE
    yield info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
    view = memoryview(data)
    for start in range(0, len(view), WRITE_CHUNK):
        yield view[start : start + WRITE_CHUNK]
    padding = -len(data) % BLOCK
    yield b"\0" * (padding + 2 * BLOCK)


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


def read_first_file(chunks: Iterable[bytes], path: str) -> bytes:
    """The payload of the first regular file in a tar stream (the engine's archive of
    one file), parsed as it streams in."""
    reader = _ChunkReader(chunks)
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
            raise ProviderError(f"{path!r} is not a regular file", retryable=False)
        size = size_override if size_override is not None else info.size
        out = io.BytesIO()
        if reader.copy_to(out, size) != size:
            raise ProviderError(f"the archive of {path!r} ended early", retryable=True)
        # getvalue() hands over the buffer without a copy when it is exactly full.
        return out.getvalue()
