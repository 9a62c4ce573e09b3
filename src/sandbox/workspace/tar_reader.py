"""An incremental tar parser over an async stream of chunks (ustar, pax, GNU names).

`TarStream.next_member()` answers the next member's header (pax and GNU long-name
records applied), `TarStream.data()` streams that member's bytes in the pieces they
arrived in, never more than one chunk held.

An archive is untrusted input (it comes from a sandbox or a caller), so every header
goes through one checked parser, `parse_header`, and every path that reads a tar
(hydrate, `sandbox cp`, docker's re-rooted archives) uses this stream. What it refuses,
with an `InvalidArgumentError` (a `SandboxError`) that says why, never a raw exception:
a bad checksum or a field that is not a number; a size that is negative (a base-256
field decoding to -1, a pax `size=-1`) or above `MAX_MEMBER_SIZE`; a pax `mtime` that
is not a finite decimal number of seconds within `MAX_ABS_MTIME`; a NUL in a pax or GNU
name; a malformed pax record. Extended headers are bounded: one is at most
`MAX_EXTENDED` bytes, the extended headers before one member at most
`MAX_EXTENDED_CHAIN` of them and `MAX_EXTENDED` bytes together, and only the records we
use (`path`, `linkpath`, `size`, `mtime`) are kept, so a peer cannot make us hold a
gigabyte "name" or swell memory with a chain of headers. Global pax headers and GNU
sparse members are refused (they would change what later bytes mean behind our
checks).
"""

from __future__ import annotations

import math
import re
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..errors import InvalidArgumentError

BLOCK = 512
MAX_EXTENDED = 1024 * 1024  # a pax record or GNU long name, and a chain of them, in bytes
MAX_EXTENDED_CHAIN = 8  # extended headers (pax, GNU long name/link) before one member
MAX_PAX_RECORDS = 4096  # records in one pax header (each a few bytes at least)
MAX_MEMBER_SIZE = 1 << 48  # 256 TiB: any real member is smaller
MAX_ABS_MTIME = 1 << 40  # seconds either side of the epoch (about 35,000 years)
GNU_LONGNAME = b"L"
GNU_LONGLINK = b"K"
GNU_SPARSE = b"S"
_EXTENDED = (tarfile.XHDTYPE, tarfile.XGLTYPE, GNU_LONGNAME, GNU_LONGLINK)
_PAX_KEPT = frozenset({"path", "linkpath", "size", "mtime"})
# A pax number: decimal digits, an optional fraction (mtime), no sign games, no spaces.
_PAX_INT = re.compile(rb"[0-9]{1,20}")
_PAX_SIZE = re.compile(rb"-?[0-9]{1,20}")  # the sign read, to be refused by name
_PAX_TIME = re.compile(rb"-?[0-9]{1,20}(\.[0-9]{0,30})?")


def malformed(why: str) -> InvalidArgumentError:
    """The error for an archive that is not a well-formed tar, or whose fields are out
    of bounds."""
    return InvalidArgumentError(f"a malformed tar archive: {why}")


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


@dataclass(frozen=True, slots=True)
class Header:
    """One 512-byte header block, checked: its fields as stored (no pax applied)."""

    name: str
    type: bytes
    size: int
    mode: int
    mtime: float
    linkname: str
    # The owner's uid as stored (-1 when the field is not a number).
    uid: int = -1


def parse_header(block: bytes) -> Header:
    """The checked fields of one header block, or `malformed` saying why: the
    checksum, every number (octal or base-256) and the size's bounds."""
    if len(block) != BLOCK:
        raise malformed("the archive ends inside a header")
    try:
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except (tarfile.HeaderError, ValueError, OverflowError, UnicodeError) as exc:
        raise malformed(f"not a tar archive: {exc}") from None
    if info.type == GNU_SPARSE:
        raise malformed("GNU sparse members are not accepted")
    size = check_size(info.size, "a header's size")
    mode = info.mode
    if not isinstance(mode, int) or mode < 0:
        raise malformed(f"a header with the mode {mode!r}")
    mtime = check_mtime(info.mtime, "a header's mtime")
    uid = info.uid if isinstance(info.uid, int) and info.uid >= 0 else -1
    return Header(info.name, info.type, size, mode & 0o7777, mtime, info.linkname, uid)


def check_size(size: object, what: str) -> int:
    """`size` when it is an int in 0..`MAX_MEMBER_SIZE`, else `malformed`."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise malformed(f"{what} is not a number")
    if size < 0:
        raise malformed(f"{what} is negative ({size})")
    if size > MAX_MEMBER_SIZE:
        raise malformed(f"{what} is above {MAX_MEMBER_SIZE} bytes")
    return size


def check_mtime(mtime: object, what: str) -> float:
    """`mtime` as a float when it is finite and within `MAX_ABS_MTIME`, else
    `malformed`."""
    if isinstance(mtime, bool) or not isinstance(mtime, int | float):
        raise malformed(f"{what} is not a number")
    try:
        value = float(mtime)
    except OverflowError:
        raise malformed(f"{what} is out of range") from None
    if not math.isfinite(value) or abs(value) > MAX_ABS_MTIME:
        raise malformed(f"{what} is out of range")
    return value


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
            raise malformed(f"the archive ends inside {what}")
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
        extended = _Extended()
        while True:
            if self._ended or not await self._fill(BLOCK):
                self._ended = True
                if self._buffer:
                    # Bytes, but not a whole header: not a tar archive (or a cut one).
                    raise malformed("the archive ends inside a header")
                if extended.count:
                    raise malformed("the archive ends after an extended header")
                return None
            block = await self._take(BLOCK, "a header")
            if block == b"\0" * BLOCK:
                self._ended = True
                if extended.count:
                    raise malformed("the archive ends after an extended header")
                return None
            header = parse_header(block)
            if header.type in _EXTENDED:
                if header.type == tarfile.XGLTYPE:
                    raise InvalidArgumentError("global pax headers are not accepted")
                extended.admit(header.size)
                payload = await self._take(header.size + (-header.size % BLOCK), "a header")
                extended.add(header.type, payload[: header.size])
                continue
            member = extended.apply(header)
            self._remaining = member.size
            self._padding = -member.size % BLOCK
            return member

    async def data(self) -> AsyncIterator[bytes]:
        """The current member's data, piece by piece, as it arrives."""
        while self._remaining > 0:
            if not self._buffer and not await self._fill(1):
                raise malformed("the archive ends inside a member's data")
            piece = bytes(self._buffer[: self._remaining])
            del self._buffer[: len(piece)]
            self._remaining -= len(piece)
            yield piece


class _Extended:
    """The extended headers (pax, GNU long name and link) before one member, bounded."""

    def __init__(self) -> None:
        self.count = 0
        self._bytes = 0
        self._pax: dict[str, str] = {}
        self._long_name: str | None = None
        self._long_link: str | None = None

    def admit(self, size: int) -> None:
        """Check that one more extended header of `size` bytes stays within bounds."""
        self.count += 1
        if self.count > MAX_EXTENDED_CHAIN:
            raise malformed(f"more than {MAX_EXTENDED_CHAIN} extended headers before a member")
        if size > MAX_EXTENDED:
            raise malformed(f"an extended header of {size} bytes is above {MAX_EXTENDED}")
        self._bytes += size
        if self._bytes > MAX_EXTENDED:
            raise malformed(f"the extended headers of a member hold more than {MAX_EXTENDED} bytes")

    def add(self, kind: bytes, payload: bytes) -> None:
        """Take in one extended header's `payload`."""
        if kind == tarfile.XHDTYPE:
            self._pax.update(_pax_records(payload))
        elif kind == GNU_LONGNAME:
            self._long_name = _gnu_name(payload)
        else:
            self._long_link = _gnu_name(payload)

    def apply(self, header: Header) -> Member:
        """The member `header` describes, with these extended records applied, checked."""
        pax = self._pax
        name = pax.get("path", self._long_name if self._long_name is not None else header.name)
        link = pax.get(
            "linkpath", self._long_link if self._long_link is not None else header.linkname
        )
        size = header.size
        if "size" in pax:
            raw = pax["size"].encode("utf-8", "surrogateescape")
            if not _PAX_SIZE.fullmatch(raw):
                raise malformed(f"a pax size that is not a number of bytes ({pax['size'][:40]!r})")
            size = check_size(int(raw), "a pax size")
        mtime = header.mtime
        if "mtime" in pax:
            raw = pax["mtime"].encode("utf-8", "surrogateescape")
            if not _PAX_TIME.fullmatch(raw):
                raise malformed(f"a pax mtime that is not a number ({pax['mtime'][:40]!r})")
            mtime = check_mtime(float(raw), "a pax mtime")
        if header.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
            size = 0  # links carry no data whatever their size field says
        return Member(name, header.type, size, header.mode, mtime, link)


def _gnu_name(payload: bytes) -> str:
    raw = payload.rstrip(b"\0")
    if b"\0" in raw:
        raise malformed("a NUL inside a GNU long name")
    return raw.decode("utf-8", "surrogateescape")


def _pax_records(payload: bytes) -> dict[str, str]:
    """The records we use among the `length key=value\\n` records of a pax header."""
    records: dict[str, str] = {}
    position = 0
    count = 0
    while position < len(payload):
        count += 1
        if count > MAX_PAX_RECORDS:
            raise malformed(f"a pax header of more than {MAX_PAX_RECORDS} records")
        space = payload.find(b" ", position, position + 21)
        if space < 0 or not _PAX_INT.fullmatch(payload[position:space]):
            raise malformed("a pax record without its length")
        length = int(payload[position:space])
        end = position + length
        if length <= space - position + 1 or end > len(payload) or payload[end - 1] != 0x0A:
            raise malformed("a pax record whose length does not match")
        key, equals, value = payload[space + 1 : end - 1].partition(b"=")
        if not equals or not key:
            raise malformed("a pax record without a key")
        name = key.decode("utf-8", "surrogateescape")
        if name.startswith("GNU.sparse."):
            raise malformed("GNU sparse members are not accepted")
        if name in _PAX_KEPT:
            if b"\0" in value:
                raise malformed(f"a NUL inside the pax {name!r}")
            records[name] = value.decode("utf-8", "surrogateescape")
        position = end
    return records
