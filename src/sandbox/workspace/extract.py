"""The safe extractor: which tar members may land in a workspace, checked before each
lands, and the extraction loop over a backend's `Sink`.

Refused, with an `InvalidArgumentError` naming the member, before that member (or
anything after it) is written: an absolute name, a `..` component, a NUL, a name or
link target longer than `MAX_NAME_BYTES`, a hard link, a device, a FIFO or any other
special member, and a member whose path goes through (or lands on) a symlink the same
archive made earlier: a planted `a -> /etc` followed by `a/passwd` never writes through
the link. Limits: `max_members` members and `max_bytes` of file data in all (checked
against each member's declared size before it is written). The archive itself is read
by `tar_reader`'s checked parser (negative sizes, header chains, malformed pax records).

Symlinks: a link's target is resolved against the tree the archive has built so far
(`_Tree`), from the link's folder, lexically, following the links the archive already
landed (at most `MAX_LINK_HOPS` of them, `MAX_LINK_STEPS` components in all); a link
whose target leaves the extraction folder at any step is refused. Checking each
link's own text is not enough: `l1 -> .` then `l2 -> l1/../../..` climbs out only
through `l1`. Because a later link could change what an earlier resolution walked
through, a symlink may not land where the archive made a folder or a file, nor on a
name an earlier resolution stepped back out of with `..`.

Modes: what lands is masked the way a umask of 022 would, and more: no setuid, setgid
or sticky bit, no group or world write (`landing_mode`): a file keeps `mode & 0o755`,
a folder `mode & 0o755 | 0o700` (its owner can always go on filling it). An archive
from a sandbox cannot leave a world-writable setgid folder on the host.

What the workspace already holds is the backend's business: its `Sink` writes through
the same confined file calls as `write_file` (unix_local's beneath-the-root opens,
docker's walked stats, the remote backends' workspace check).
"""

from __future__ import annotations

import contextlib
import tarfile
from collections.abc import AsyncIterator
from typing import Protocol

from ..errors import InvalidArgumentError
from .tar_reader import Member, TarStream

DEFAULT_MAX_MEMBERS = 100_000
DEFAULT_MAX_BYTES = 8 * 1024 * 1024 * 1024
MAX_NAME_BYTES = 4096  # a member's name or a link's target (PATH_MAX)
MAX_LINK_HOPS = 40  # links followed resolving one target (the kernel's own limit)
MAX_LINK_STEPS = 4096  # path components walked resolving one target, links included
FILE_MODE_MASK = 0o755
DIR_MODE_MASK = 0o755
DIR_MODE_FLOOR = 0o700

_FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


class Sink(Protocol):
    """Where an extraction lands: paths are relative to the extraction folder, already
    checked by the rules above, parents made before their children, modes masked."""

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


def landing_mode(mode: int, *, folder: bool) -> int:
    """The permission bits a member of mode `mode` lands with (see the module
    docstring): never setuid, setgid, sticky, group or world write."""
    if folder:
        return (mode & DIR_MODE_MASK) | DIR_MODE_FLOOR
    return mode & FILE_MODE_MASK


def member_path(member: Member) -> str:
    """The member's name as a clean relative path ("" for the folder itself), or
    `InvalidArgumentError` naming it."""
    name = member.name
    if "\0" in name:
        raise refused(member, "its name holds a NUL")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise refused(member, f"its name is longer than {MAX_NAME_BYTES} bytes")
    if name.startswith("/"):
        raise refused(member, "its name is absolute")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise refused(member, "its name holds '..'")
    return "/".join(parts)


def refused(member: Member, why: str) -> InvalidArgumentError:
    """The error for a member the rules refuse."""
    return InvalidArgumentError(f"archive member {member.name[:200]!r} refused: {why}")


class _Tree:
    """What the archive has landed so far, as far as links are concerned: its folders,
    files and symlinks (by clean relative path), and the names an earlier link's
    resolution stepped out of with `..` (a link there would change that resolution)."""

    def __init__(self) -> None:
        self.dirs: set[str] = {""}
        self.files: set[str] = set()
        self.links: dict[str, str] = {}
        self.pinned: set[str] = set()

    def through_link(self, path: str) -> str | None:
        """The landed symlink on `path`'s way (or at `path` itself), if any."""
        if not self.links:
            return None
        parts = path.split("/")
        for k in range(1, len(parts) + 1):
            prefix = "/".join(parts[:k])
            if prefix in self.links:
                return prefix
        return None

    def check_link(self, member: Member, path: str) -> str:
        """The symlink member's target, when it resolves inside the extraction folder
        (see the module docstring), else the member is refused."""
        target = member.linkname
        if not target:
            raise refused(member, "a symlink without a target")
        if "\0" in target:
            raise refused(member, "a symlink whose target holds a NUL")
        if len(target.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise refused(member, f"a symlink target longer than {MAX_NAME_BYTES} bytes")
        if target.startswith("/"):
            raise refused(member, f"a symlink to the absolute path {target[:200]!r}")
        if path in self.dirs or path in self.files:
            raise refused(member, "a symlink in place of a member the archive made")
        if path in self.pinned:
            raise refused(member, "a symlink where an earlier link's target goes through")
        self._resolve(member, path, target)
        return target

    def _resolve(self, member: Member, path: str, target: str) -> None:
        stack = path.split("/")[:-1]
        todo = list(reversed(target.split("/")))
        hops = steps = 0
        pins: list[str] = []
        while todo:
            part = todo.pop()
            steps += 1
            if steps > MAX_LINK_STEPS:
                raise refused(member, f"a symlink target of more than {MAX_LINK_STEPS} steps")
            if part in ("", "."):
                continue
            if part == "..":
                if not stack:
                    raise refused(member, f"a symlink pointing out ({target[:200]!r})")
                here = "/".join(stack)
                if here not in self.dirs:
                    pins.append(here)
                stack.pop()
                continue
            stack.append(part)
            landed = self.links.get("/".join(stack))
            if landed is not None:
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise refused(member, f"a symlink through more than {MAX_LINK_HOPS} links")
                stack.pop()
                todo.extend(reversed(landed.split("/")))
        for here in pins:
            # The name and its folders: a link at any of them would move what `..` left.
            parts = here.split("/")
            for k in range(len(parts), 0, -1):
                prefix = "/".join(parts[:k])
                if prefix in self.pinned or prefix in self.dirs:
                    break
                self.pinned.add(prefix)


async def extract(
    chunks: AsyncIterator[bytes],
    sink: Sink,
    *,
    max_members: int = DEFAULT_MAX_MEMBERS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> int:
    """Extract the tar `chunks` into `sink` under the rules above; the member count."""
    stream = TarStream(chunks)
    tree = _Tree()
    count = 0
    total = 0
    while (member := await stream.next_member()) is not None:
        count += 1
        if count > max_members:
            raise refused(member, f"the archive holds more than {max_members} members")
        path = member_path(member)
        link = tree.through_link(path) if path else None
        if link is not None:
            raise refused(member, f"it goes through the symlink {link!r} the archive made")
        kind = member.type
        if kind == tarfile.DIRTYPE:
            if path:
                if path in tree.files:
                    raise refused(member, "a folder in place of a file the archive made")
                await _parents(sink, path, tree)
                await sink.make_dir(path, landing_mode(member.mode, folder=True))
                tree.dirs.add(path)
            continue
        if not path:
            raise refused(member, "it names the extraction folder itself")
        if kind in _FILE_TYPES:
            if path in tree.dirs:
                raise refused(member, "a file in place of a folder the archive made")
            if total + member.size > max_bytes:
                raise refused(member, f"the archive's files hold more than {max_bytes} bytes")
            total += member.size
            await _parents(sink, path, tree)
            await sink.write_file(
                path, stream.data(), member.size, landing_mode(member.mode, folder=False)
            )
            tree.files.add(path)
        elif kind == tarfile.SYMTYPE:
            target = tree.check_link(member, path)
            await _parents(sink, path, tree)
            await sink.make_symlink(path, target)
            tree.links[path] = target
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


async def _parents(sink: Sink, path: str, tree: _Tree) -> None:
    """Make the folders above `path` the archive did not list (in order)."""
    parts = path.split("/")[:-1]
    for k in range(1, len(parts) + 1):
        folder = "/".join(parts[:k])
        if folder not in tree.dirs:
            if folder in tree.files:
                raise InvalidArgumentError(
                    f"archive member {path[:200]!r} refused: it goes through a file the "
                    "archive made"
                )
            await sink.make_dir(folder, 0o755)
            tree.dirs.add(folder)
