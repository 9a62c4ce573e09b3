"""An incremental tar parser over an async stream of chunks (ustar, pax, GNU names).

`TarStream.next_member()` answers the next member's header (pax and GNU long-name
records applied), `TarStream.data()` streams that member's bytes in the pieces they
arrived in, never more than one chunk held. Extended records are bounded
(`MAX_EXTENDED`): a peer cannot make us hold a gigabyte "name". Global pax headers are
refused (they would change every later member's meaning behind our checks).
"""

from __future__ import annotations

import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..errors import InvalidArgumentError

BLOCK = 512
MAX_EXTENDED = 1024 * 1024  # a pax record or GNU long name, in bytes
GNU_LONGNAME = b"L"
GNU_LONGLINK = b"K"


@dataclass(frozen=True, slots=True)
class Member:
    """One member: its `name` and `linkname` as stored (pax/GNU names applied), its
    `type` (tarfile's one-byte codes), `size` of its data, `mode` bits and `mtime`."""

    name: str
    type: bytes
    size: int
    mode: int
    mtime: float
    linkname: str


class TarStream:
    """Reads members one after the other from `chunks` (bytes of any sizes)."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = bytearray()
        self._remaining = 0  # data bytes of the current member not yet handed out
        self._padding = 0
        self._ended = False

    async def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            try:
                chunk = await anext(self._chunks)
            except StopAsyncIteration:
                return False
            if not isinstance(chunk, bytes | bytearray | memoryview):
                raise InvalidArgumentError(f"archive chunks must be bytes, not {chunk!r}")
            self._buffer += chunk
        return True

    async def _take(self, size: int, what: str) -> bytes:
        if not await self._fill(size):
            raise InvalidArgumentError(f"the archive ends inside {what}")
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def _skip_rest(self) -> None:
        async for _ in self.data():
            pass
        if self._padding:
            await self._take(self._padding, "padding")
            self._padding = 0

    async def next_member(self) -> Member | None:
        """The next member's header (after skipping what is left of the one before),
        None at the end of the archive."""
        await self._skip_rest()
        long_name: str | None = None
        long_link: str | None = None
        pax: dict[str, str] = {}
        while True:
            if self._ended or not await self._fill(BLOCK):
                self._ended = True
                return None
            block = await self._take(BLOCK, "a header")
            if block == b"\0" * BLOCK:
                self._ended = True
                return None
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                raise InvalidArgumentError(f"not a tar archive: {exc}") from None
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, GNU_LONGNAME, GNU_LONGLINK):
                if info.size > MAX_EXTENDED:
                    raise InvalidArgumentError(
                        f"an extended header of {info.size} bytes is above {MAX_EXTENDED}"
                    )
                payload = await self._take(info.size + (-info.size % BLOCK), "a header")
                payload = payload[: info.size]
                if info.type == tarfile.XGLTYPE:
                    raise InvalidArgumentError("global pax headers are not accepted")
                if info.type == tarfile.XHDTYPE:
                    pax.update(_pax_records(payload))
                elif info.type == GNU_LONGNAME:
                    long_name = _gnu_name(payload)
                else:
                    long_link = _gnu_name(payload)
                continue
            name = pax.get("path", long_name if long_name is not None else info.name)
            link = pax.get("linkpath", long_link if long_link is not None else info.linkname)
            size = info.size
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError:
                    raise InvalidArgumentError("a pax size that is not a number") from None
            if info.type in (tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE):
                size = 0 if info.type != tarfile.DIRTYPE else size
            mtime = float(pax.get("mtime", info.mtime) or 0)
            self._remaining = size
            self._padding = -size % BLOCK
            return Member(name, info.type, size, info.mode, mtime, link)

    async def data(self) -> AsyncIterator[bytes]:
        """The current member's data, piece by piece, as it arrives."""
        while self._remaining:
            if not self._buffer and not await self._fill(1):
                raise InvalidArgumentError("the archive ends inside a member's data")
            piece = bytes(self._buffer[: self._remaining])
            del self._buffer[: len(piece)]
            self._remaining -= len(piece)
            yield piece


def _gnu_name(payload: bytes) -> str:
    return payload.rstrip(b"\0").decode("utf-8", "surrogateescape")


def _pax_records(payload: bytes) -> dict[str, str]:
    """The `length key=value\\n` records of a pax extended header."""
    records: dict[str, str] = {}
    position = 0
    while position < len(payload):
        space = payload.find(b" ", position)
        if space < 0:
            raise InvalidArgumentError("a malformed pax header")
        try:
            length = int(payload[position:space])
        except ValueError:
            raise InvalidArgumentError("a malformed pax header") from None
        record = payload[space + 1 : position + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise InvalidArgumentError("a malformed pax header")
        key, _, value = record[:-1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records
