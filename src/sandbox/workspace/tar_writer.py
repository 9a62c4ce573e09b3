"""The pieces of a streamed POSIX (pax) tar: one header per member, its data, padding.

Headers are made by the standard library's `tarfile.TarInfo.tobuf` (pax format: long
names, big sizes and UTF-8 names get an extended header); nothing here holds more than
one header in memory. Names are relative; directories end in "/".
"""

from __future__ import annotations

import tarfile

BLOCK = 512
END = b"\0" * (2 * BLOCK)


def _header(name: str, kind: bytes, *, size: int, mode: int, mtime: float, link: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mode = mode & 0o7777
    info.mtime = int(mtime)
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
