"""unix_local's `hydrate_workspace`: the shared extractor's rules, with what it lands
batched into few executor calls.

The checks are `sandbox.workspace.extract`'s, unchanged: a member is refused (absolute
name, `..`, a link pointing out, a hard link, a device, a FIFO, a path through a
symlink the archive planted or a link resolving out through one, the limits) before
the `Sink` hears of it; the modes it hears are already masked (no setuid, setgid,
sticky, group or world write: the extractor's `landing_mode`). What the
default sink costs is executor round trips: a make-folder, a mode, an open and one call
per chunk for every member, each resolving its path from the workspace's root again.
`BatchSink` queues the operations instead and `flush()`es them in one executor call
once `BATCH_BYTES` of data or `BATCH_OPS` operations are queued (so memory stays
bounded by a batch), and at the end; inside a flush, the folder that holds a name is
opened beneath the workspace once (`safe_open.open_directory_raw`, symlinks followed
only while they stay inside) and reused for the next names in it.

Each name is then acted on relative to that folder's fd, never followed: a file is
opened `O_NOFOLLOW | O_NONBLOCK` (a FIFO there cannot block it; `fstat` refuses what is
not regular), truncated, written and `fchmod`ed through its fd; a folder is made with
`mkdirat` and its mode set through an `O_NOFOLLOW` fd of it; a symlink with
`symlinkat`. A symlink that was in the workspace before (not one the archive made:
those are refused) at a file's name is followed as `write_file` follows it, through
`safe_open.open_regular`, beneath the workspace. A refused member, or a source that
fails, leaves what came before it landed (its operations are flushed) and nothing of
it or after it (a file cut off is dropped from the queue; only one larger than a batch
has had its start written already).
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ...backend import extract_archive_batched
from ...errors import NotAFileError
from .safe_open import (
    DIR_FLAGS,
    WRITE_FLAGS,
    io_error,
    open_directory_raw,
    open_error,
    open_regular,
    relative_inside,
    write_all,
)
from .workspace_files import explain

BATCH_BYTES = 4 * 1024 * 1024  # file data queued before a flush
BATCH_OPS = 2048  # operations queued before a flush
MODE_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class _Dir:
    path: str
    mode: int


@dataclass(frozen=True, slots=True)
class _Open:
    path: str
    mode: int


@dataclass(frozen=True, slots=True)
class _Data:
    data: bytes


@dataclass(frozen=True, slots=True)
class _Close:
    pass


@dataclass(frozen=True, slots=True)
class _Link:
    path: str
    target: str


_Op = _Dir | _Open | _Data | _Close | _Link


class Lander:
    """Carries out queued operations beneath the workspace `root`, below the folder
    `base` (one thread at a time); `close()` releases every fd."""

    def __init__(self, root: str, base: str, resolver: str = "auto") -> None:
        self._root = root
        self._base = posixpath.normpath(relative_inside(root, base))
        self._resolver = resolver
        self._holders: dict[str, int] = {}  # folder -> fd, for one flush
        self._file: tuple[int, str] | None = None  # the file being written, and its path

    def run(self, ops: list[_Op]) -> None:
        """Carry out `ops` in order; the folder fds are dropped at the end (a folder a
        process renames meanwhile is opened afresh by the next batch)."""
        try:
            for op in ops:
                self._one(op)
        finally:
            self._drop_holders()

    def close(self) -> None:
        """Close the file being written (when a failure cut it off) and every folder fd."""
        if self._file is not None:
            os.close(self._file[0])
            self._file = None
        self._drop_holders()

    def _drop_holders(self) -> None:
        while self._holders:
            os.close(self._holders.popitem()[1])

    def _full(self, path: str) -> str:
        return path if self._base == "." else f"{self._base}/{path}"

    def _holder(self, full: str) -> tuple[int, str]:
        """The fd of the folder holding `full` (opened beneath the root), and the name."""
        folder, name = posixpath.dirname(full) or ".", posixpath.basename(full)
        fd = self._holders.get(folder)
        if fd is None:
            root_fd = os.open(self._root, DIR_FLAGS)
            try:
                fd = open_directory_raw(root_fd, folder, root=self._root, resolver=self._resolver)
            finally:
                os.close(root_fd)
            self._holders[folder] = fd
        return fd, name

    def _one(self, op: _Op) -> None:
        if isinstance(op, _Data):
            assert self._file is not None
            write_all(self._file[0], op.data, self._file[1])
            return
        if isinstance(op, _Close):
            assert self._file is not None
            fd, _ = self._file
            self._file = None
            os.close(fd)
            return
        full = self._full(op.path)
        try:
            if isinstance(op, _Dir):
                self._make_dir(full, op.mode)
            elif isinstance(op, _Open):
                self._open(full, op.mode)
            else:
                self._link(full, op.target)
        except OSError as exc:
            raise explain(exc, full) from None

    def _make_dir(self, full: str, mode: int) -> None:
        fd, name = self._holder(full)
        try:
            os.mkdir(name, 0o777, dir_fd=fd)
        except FileExistsError:
            # A folder, or a symlink to one (followed beneath the root by later opens).
            if not stat.S_ISDIR(os.stat(name, dir_fd=fd).st_mode):
                raise NotAFileError(f"cannot make {full!r}: a file is in the way") from None
        try:
            folder = os.open(name, MODE_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return  # a symlink: left alone, as `set_mode` leaves it
            raise
        try:
            os.fchmod(folder, mode & 0o7777)
        finally:
            os.close(folder)

    def _open(self, full: str, mode: int) -> None:
        fd, name = self._holder(full)
        try:
            file_fd = os.open(name, WRITE_FLAGS | os.O_NOFOLLOW, 0o666, dir_fd=fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                # ENXIO: a FIFO without a reader (never blocks: O_NONBLOCK), EISDIR...
                raise open_error(exc, full, write=True) from None
            # A symlink the workspace held: followed beneath the root, as write_file does.
            file_fd = open_regular(self._root, full, write=True, resolver=self._resolver).fd
        try:
            if not stat.S_ISREG(os.fstat(file_fd).st_mode):
                raise NotAFileError(f"{full!r} is not a regular file")
            try:
                os.ftruncate(file_fd, 0)
                os.fchmod(file_fd, mode & 0o7777)
            except OSError as exc:
                raise io_error(exc, full, write=True) from None
        except BaseException:
            os.close(file_fd)
            raise
        self._file = (file_fd, full)

    def _link(self, full: str, target: str) -> None:
        fd, name = self._holder(full)
        try:
            os.symlink(target, name, dir_fd=fd)
            return
        except FileExistsError:
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                raise NotAFileError(
                    f"cannot make the symlink {full!r}: a folder is there"
                ) from None
            os.unlink(name, dir_fd=fd)
        os.symlink(target, name, dir_fd=fd)


class BatchSink:
    """`extract.Sink` that queues operations for a `Lander` and runs them in batches."""

    def __init__(self, lander: Lander) -> None:
        self._lander = lander
        self._ops: list[_Op] = []
        self._bytes = 0
        self._flushes = 0
        self._call: asyncio.Future[None] | None = None

    async def make_dir(self, path: str, mode: int) -> None:
        """Queue the folder `path`."""
        await self._queue(_Dir(path, mode))

    async def write_file(
        self, path: str, chunks: AsyncIterator[bytes], size: int, mode: int
    ) -> None:
        """Queue the file `path` and its data (flushed as it piles up). When its data
        does not all come (the archive ends, the source fails), what of it is still
        queued is dropped: a member cut off leaves no half file, unless it was larger
        than a batch and its start has already landed."""
        start, flushes = len(self._ops), self._flushes
        await self._queue(_Open(path, mode))
        try:
            async for chunk in chunks:
                if chunk:
                    self._bytes += len(chunk)
                    await self._queue(_Data(chunk))
        except BaseException:
            if self._flushes == flushes:
                del self._ops[start:]
            raise
        await self._queue(_Close())

    async def make_symlink(self, path: str, target: str) -> None:
        """Queue the symlink `path` -> `target`."""
        await self._queue(_Link(path, target))

    async def _queue(self, op: _Op) -> None:
        self._ops.append(op)
        if self._bytes >= BATCH_BYTES or len(self._ops) >= BATCH_OPS:
            await self.flush()

    async def flush(self) -> None:
        """Run what is queued, in one executor call."""
        ops, self._ops, self._bytes = self._ops, [], 0
        if not ops:
            return
        self._flushes += 1
        self._call = asyncio.ensure_future(asyncio.to_thread(self._lander.run, ops))
        # wait() leaves the batch running when we are cancelled: `close()` then waits
        # for it before closing the lander's fds.
        await asyncio.wait({self._call})
        call, self._call = self._call, None
        call.result()

    def close(self) -> None:
        """Release the lander's fds, now or when a running batch ends."""
        call = self._call
        if call is None or call.done():
            self._lander.close()
            return

        def close(done: asyncio.Future[None]) -> None:
            if not done.cancelled():
                done.exception()  # consumed: nobody waits for it any more
            self._lander.close()

        call.add_done_callback(close)


async def hydrate(
    root: str,
    base: str,
    chunks: AsyncIterator[bytes],
    *,
    max_members: int,
    max_bytes: int,
    resolver: str = "auto",
) -> int:
    """Extract `chunks` below the folder `base` (made first, with its parents) of the
    workspace `root`; the member count."""
    sink = BatchSink(Lander(root, base, resolver))
    try:
        return await extract_archive_batched(
            chunks, sink, max_members=max_members, max_bytes=max_bytes
        )
    finally:
        sink.close()
