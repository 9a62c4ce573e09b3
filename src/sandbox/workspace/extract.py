"""The safe extractor: which tar members may land in a workspace, checked before each
lands, and the extraction loop over a backend's `Sink`.

Refused, with an `InvalidArgumentError` naming the member, before that member (or
anything after it) is written: an absolute name, a `..` component, a symlink whose
target is absolute or climbs out of the extraction folder, a hard link, a device, a
FIFO or any other special member, and a member whose path goes through (or lands on)
a symlink the same archive made earlier: a planted `a -> /etc` followed by `a/passwd`
never writes through the link. Limits: `max_members` members and `max_bytes` of file
data in all (checked against each member's declared size before it is written).

What the workspace already holds is the backend's business: its `Sink` writes through
the same confined file calls as `write_file` (unix_local's beneath-the-root opens,
docker's walked stats, the remote backends' workspace check).
"""

from __future__ import annotations

import contextlib
import posixpath
import tarfile
from collections.abc import AsyncIterator
from typing import Protocol

from ..errors import InvalidArgumentError
from .tar_reader import Member, TarStream

DEFAULT_MAX_MEMBERS = 100_000
DEFAULT_MAX_BYTES = 8 * 1024 * 1024 * 1024

_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


class Sink(Protocol):
    """Where an extraction lands: paths are relative to the extraction folder, already
    checked by the rules above, parents made before their children."""

    async def make_dir(self, path: str, mode: int) -> None:
        """Make the directory `path` (fine when it exists)."""

    async def write_file(
        self, path: str, chunks: AsyncIterator[bytes], size: int, mode: int
    ) -> None:
        """Write the regular file `path` from `chunks` (`size` bytes in all)."""

    async def make_symlink(self, path: str, target: str) -> None:
        """Make the symlink `path` pointing at `target` (relative, checked)."""


class BatchingSink(Sink, Protocol):
    """A `Sink` that queues its operations and runs them at `flush()`."""

    async def flush(self) -> None:
        """Run the operations queued so far."""


def member_path(member: Member) -> str:
    """The member's name as a clean relative path ("" for the folder itself), or
    `InvalidArgumentError` naming it."""
    name = member.name
    if name.startswith("/"):
        raise refused(member, "its name is absolute")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise refused(member, "its name holds '..'")
    return "/".join(parts)


def refused(member: Member, why: str) -> InvalidArgumentError:
    """The error for a member the rules refuse."""
    return InvalidArgumentError(f"archive member {member.name!r} refused: {why}")


def check_link_target(member: Member, path: str) -> str:
    """A symlink member's target, when it stays inside the extraction folder."""
    target = member.linkname
    if not target:
        raise refused(member, "a symlink without a target")
    if target.startswith("/"):
        raise refused(member, f"a symlink to the absolute path {target!r}")
    depth = len(posixpath.dirname(path).split("/")) if posixpath.dirname(path) else 0
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                raise refused(member, f"a symlink pointing out ({target!r})")
        elif part not in ("", "."):
            depth += 1
    return target


def _through_planted(path: str, planted: set[str]) -> str | None:
    """The planted symlink on `path`'s way (or at `path` itself), if any."""
    parts = path.split("/")
    for k in range(1, len(parts) + 1):
        prefix = "/".join(parts[:k])
        if prefix in planted:
            return prefix
    return None


async def extract(
    chunks: AsyncIterator[bytes],
    sink: Sink,
    *,
    max_members: int = DEFAULT_MAX_MEMBERS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> int:
    """Extract the tar `chunks` into `sink` under the rules above; the member count."""
    stream = TarStream(chunks)
    planted: set[str] = set()
    made_dirs: set[str] = {""}
    count = 0
    total = 0
    while (member := await stream.next_member()) is not None:
        count += 1
        if count > max_members:
            raise refused(member, f"the archive holds more than {max_members} members")
        path = member_path(member)
        link = _through_planted(path, planted) if path else None
        if link is not None:
            raise refused(member, f"it goes through the symlink {link!r} the archive made")
        kind = member.type
        if kind == tarfile.DIRTYPE:
            if path:
                await _parents(sink, path, made_dirs)
                await sink.make_dir(path, member.mode)
                made_dirs.add(path)
            continue
        if not path:
            raise refused(member, "it names the extraction folder itself")
        if kind in _FILE_TYPES:
            if total + member.size > max_bytes:
                raise refused(member, f"the archive's files hold more than {max_bytes} bytes")
            total += member.size
            await _parents(sink, path, made_dirs)
            await sink.write_file(path, stream.data(), member.size, member.mode)
        elif kind == tarfile.SYMTYPE:
            target = check_link_target(member, path)
            await _parents(sink, path, made_dirs)
            await sink.make_symlink(path, target)
            planted.add(path)
        elif kind == tarfile.LNKTYPE:
            raise refused(member, "hard links are not accepted")
        elif kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            raise refused(member, "device files are not accepted")
        elif kind == tarfile.FIFOTYPE:
            raise refused(member, "FIFOs are not accepted")
        else:
            raise refused(member, f"members of type {kind!r} are not accepted")
    return count


async def extract_batched(
    chunks: AsyncIterator[bytes],
    sink: BatchingSink,
    *,
    max_members: int = DEFAULT_MAX_MEMBERS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> int:
    """`extract` into a sink that queues its operations, flushed at the end.

    What came before a failure lands, as a member-by-member extraction would have
    landed it: on a refused member, a failing source or a failing operation (any
    `Exception`, not a cancellation) the queue is flushed before the error goes on,
    and a failure of that flush does not hide the first one. A member the failure cut
    off is the sink's to leave out of its queue (both in-tree sinks do).
    """
    try:
        count = await extract(chunks, sink, max_members=max_members, max_bytes=max_bytes)
    except Exception:
        with contextlib.suppress(Exception):
            await sink.flush()
        raise
    await sink.flush()
    return count


async def _parents(sink: Sink, path: str, made: set[str]) -> None:
    """Make the folders above `path` the archive did not list (in order)."""
    parts = path.split("/")[:-1]
    for k in range(1, len(parts) + 1):
        folder = "/".join(parts[:k])
        if folder not in made:
            await sink.make_dir(folder, 0o755)
            made.add(folder)
