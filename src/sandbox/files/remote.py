"""What a path in a remote sandbox names, asked before a provider's file call.

A provider's download or upload of a FIFO opens it and waits forever, one over a
directory may replace the directory or hand back a listing as the file's bytes, and one
under a file fails with an error of its own. The remote backends therefore ask the
provider's stat first (`regular_file`) and refuse, with the same errors on every
backend, what is not a regular file; after a failed upload, `file_on_the_way` finds a
parent that is a file. Each backend turns its provider's stat into an `Entry`.

The check and the provider's call are two requests: a process in the sandbox can still
change the path in between. That is its own sandbox's business; the host's files are
never at stake here (unlike `backends.unix_local.safe_open`, which guards the host).
"""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from ..errors import FileTooLargeError, NotAFileError, SandboxError, SandboxFileNotFoundError

MAX_SYMLINK_HOPS = 16

Kind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True)
class Entry:
    """What a provider's stat says a path is: a regular file (with its size when
    known), a directory, a symlink (with its target when the provider tells; a relative
    target is relative to the link's folder), or something else (FIFO, socket, device)."""

    kind: Kind
    size: int | None = None
    target: str | None = None


Stat = Callable[[str], Awaitable[Entry | None]]
"""A backend's stat: None when nothing is at the path; raises a `SandboxError` for any
other failure (such as a parent that is a file)."""


async def regular_file(
    stat: Stat, path: str, *, write: bool, shown: str | None = None
) -> int | None:
    """Check that `path` names a regular file (symlinks followed, at most 16): its size
    when known. For a write, nothing there is fine (None). Raises `NotAFileError` for a
    directory, FIFO, socket or device, or (for a write) a parent that is a file, and
    `SandboxFileNotFoundError` for a read of nothing. Messages name `shown` (default
    `path`): the path as the caller wrote it."""
    current = path
    path = shown if shown is not None else path
    for _ in range(MAX_SYMLINK_HOPS):
        try:
            entry = await stat(current)
        except SandboxError:
            if await file_on_the_way(stat, current) is None:
                raise
            if write:
                raise under_a_file(path) from None
            raise SandboxFileNotFoundError(
                f"no such file in the sandbox: {path!r} (a parent on its path is not a folder)"
            ) from None
        if entry is None:
            if write:
                return None
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}")
        if entry.kind == "symlink":
            if not entry.target:
                return None  # the provider follows it; nothing more can be known here
            current = posixpath.normpath(posixpath.join(posixpath.dirname(current), entry.target))
            continue
        if entry.kind == "dir":
            raise NotAFileError(f"{path!r} is a directory, not a regular file")
        if entry.kind != "file":
            raise NotAFileError(f"{path!r} is not a regular file")
        return entry.size
    raise NotAFileError(f"{path!r}: too many levels of symbolic links")


async def file_on_the_way(stat: Stat, path: str) -> str | None:
    """The nearest existing ancestor of `path` when it is not a folder (what makes a
    write under it fail), else None."""
    current = posixpath.dirname(path.rstrip("/"))
    while current not in ("", "/", "."):
        try:
            entry = await stat(current)
        except SandboxError:
            entry = None  # itself under a file, or unknowable: look further up
        if entry is not None:
            return None if entry.kind in ("dir", "symlink") else current
        current = posixpath.dirname(current)
    return None


async def explain_write_failure(stat: Stat, path: str, failure: SandboxError) -> SandboxError:
    """The error for a failed upload: `NotAFileError` when a parent is a file (the
    caller's mistake, not the provider's), else `failure`."""
    try:
        blocker = await file_on_the_way(stat, path)
    except SandboxError:
        return failure
    return under_a_file(path) if blocker is not None else failure


def under_a_file(path: str) -> NotAFileError:
    """The error for a write under a path whose parent is a file."""
    return NotAFileError(f"cannot write {path!r}: a parent on its path is not a folder")


def go_file_mode_kind(mode: int) -> Kind:
    """The kind of a Go `os.FileMode` (what Go daemons report): type bits above the
    permission bits (dir 1<<31, symlink 1<<27, device 1<<26, named pipe 1<<25, socket
    1<<24, char device 1<<21, irregular 1<<19)."""
    if mode & (1 << 31):
        return "dir"
    if mode & (1 << 27):
        return "symlink"
    if mode & ((1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)):
        return "other"
    return "file"


class DownloadStream(Protocol):
    """A provider's file download as chunks (what the SDKs' streaming reads return)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


async def read_at_most(stream: DownloadStream, path: str, max_bytes: int) -> bytes:
    """The whole of `stream`, stopped with `FileTooLargeError` as soon as it passes
    `max_bytes` (a file may grow after its stat), the stream closed either way: a
    whole-body read would keep all of it."""
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in stream:
            size += len(chunk)
            if size > max_bytes:
                raise FileTooLargeError.over(path, None, max_bytes)
            parts.append(bytes(chunk))
    finally:
        await stream.aclose()
    return b"".join(parts)
