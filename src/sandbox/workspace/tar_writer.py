"""The pieces of a streamed POSIX (pax) tar: one header per member, its data, padding.

Headers are made by the standard library's `tarfile.TarInfo.tobuf` (pax format: long
names, big sizes and UTF-8 names get an extended header); nothing here holds more than
one header in memory. Names are relative; directories end in "/". The common member (an
ASCII name and link under 100 bytes, a size and mtime that fit their octal fields) skips
`TarInfo` and is packed here, to the same bytes `tobuf` makes (a test compares them):
`TarInfo` costs tens of microseconds a member, which a walk of many small files feels.

What goes into a header often comes from a sandbox's `stat` answer, which is untrusted:
a size that is not an int in 0..`MAX_MEMBER_SIZE`, an mtime that is not finite or is
out of range, a NUL in a name or a target, are refused with an `InvalidArgumentError`
(a `SandboxError`) before any byte of the member goes out, rather than written into a
header the other side would choke on (a pax `size=-1`) or failing with a raw
`ValueError`.
"""

from __future__ import annotations

import math
import tarfile

from ..errors import InvalidArgumentError
from .tar_reader import MAX_ABS_MTIME, MAX_MEMBER_SIZE

BLOCK = 512
END = b"\0" * (2 * BLOCK)


_USTAR_MAGIC = b"ustar\x0000"
_ZERO_ID = b"0000000\x00"
_MAX_OCTAL_11 = 8**11  # size and mtime: 11 octal digits and a NUL


def _ustar(name: str, kind: bytes, size: int, mode: int, mtime: int, link: str) -> bytes | None:
    """The plain ustar header `tobuf` would make, or None when the member needs pax."""
    if not (name.isascii() and link.isascii()):
        return None
    raw_name = name.encode("ascii")
    raw_link = link.encode("ascii")
    if len(raw_name) >= 100 or len(raw_link) >= 100 or b"\0" in raw_name + raw_link:
        return None
    if not (0 <= size < _MAX_OCTAL_11 and 0 <= mtime < _MAX_OCTAL_11):
        return None
    head = b"".join(
        (
            raw_name.ljust(100, b"\0"),
            b"%07o\x00" % mode,
            _ZERO_ID,
            _ZERO_ID,
            b"%011o\x00" % size,
            b"%011o\x00" % mtime,
            b" " * 8,
            kind,
            raw_link.ljust(100, b"\0"),
            _USTAR_MAGIC,
        )
    ).ljust(BLOCK, b"\0")
    # The checksum: the sum of the header's bytes with its own field read as spaces.
    return head[:148] + b"%06o\x00 " % sum(head) + head[156:]


def _checked(name: str, *, size: int, mode: int, mtime: float, link: str) -> int:
    """The whole-second mtime of a member whose fields were checked (see the module
    docstring)."""
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_MEMBER_SIZE:
        raise InvalidArgumentError(f"cannot archive {name[:200]!r}: its size is {size!r}")
    if isinstance(mode, bool) or not isinstance(mode, int) or mode < 0:
        raise InvalidArgumentError(f"cannot archive {name[:200]!r}: its mode is {mode!r}")
    if (
        isinstance(mtime, bool)
        or not isinstance(mtime, int | float)
        or not math.isfinite(mtime)
        or abs(mtime) > MAX_ABS_MTIME
    ):
        raise InvalidArgumentError(f"cannot archive {name[:200]!r}: its mtime is {mtime!r}")
    if "\0" in name or "\0" in link:
        raise InvalidArgumentError(f"cannot archive {name[:200]!r}: a NUL in its name or target")
    return int(mtime)


def _header(name: str, kind: bytes, *, size: int, mode: int, mtime: float, link: str) -> bytes:
    whole = _checked(name, size=size, mode=mode, mtime=mtime, link=link)
    fast = _ustar(name, kind, size, mode & 0o7777, whole, link)
    if fast is not None:
        return fast
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mode = mode & 0o7777
    info.mtime = whole
    info.linkname = link
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def dir_header(name: str, *, mode: int, mtime: float) -> bytes:
    """The header of the directory `name` (a trailing "/" is added)."""
    return _header(name.rstrip("/") + "/", tarfile.DIRTYPE, size=0, mode=mode, mtime=mtime, link="")


def file_header(name: str, *, size: int, mode: int, mtime: float) -> bytes:
    """The header of the regular file `name` whose `size` bytes follow."""
    return _header(name, tarfile.REGTYPE, size=size, mode=mode, mtime=mtime, link="")


def symlink_header(name: str, target: str, *, mode: int = 0o777, mtime: float = 0.0) -> bytes:
    """The header of the symlink `name` pointing at `target` (as written)."""
    return _header(name, tarfile.SYMTYPE, size=0, mode=mode, mtime=mtime, link=target)


def padding(size: int) -> bytes:
    """The zeros that follow `size` bytes of data up to the next block."""
    return b"\0" * (-size % BLOCK)
