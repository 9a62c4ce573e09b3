"""unix_local's `persist_workspace`: the workspace walked into a pax tar with dir fds,
a batch of archive bytes per executor call.

The portable walk (`sandbox.workspace.persist`) costs several executor round trips per
member (a stat, a listing, an open, each read); on a tree of small files those round
trips are most of the time. `TarWalk` does the same walk synchronously, one `step()`
making up to `BATCH` bytes of archive, and `persist` runs one step per executor call:
memory stays bounded by a batch, one listing per level and one fd per level, and no
thread is held between batches.

The confinement is the fd walk's: the walked folder is opened beneath the workspace
(`safe_open.open_directory_raw`), and every name under it is reached relative to the
fd of the folder that lists it, with `O_NOFOLLOW`, never through a path. A folder
swapped for a symlink between its listing and its opening fails that open (`ELOOP`) and
is left out, as is anything removed meanwhile; a symlink is stored, never followed.
Files are opened `O_NONBLOCK` (a FIFO swapped in cannot block the open) and kept only
when `fstat` on the opened fd says regular; FIFOs, sockets and devices seen by the
listing are never opened. The archive is the walk's (`sandbox.workspace.persist`):
members relative to the walked folder, names sorted, a file that changes size while
read cut or padded to the size its fd's `fstat` said.
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import stat
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from ...backend import TAR_END, dir_header, file_header, symlink_header, tar_padding
from ...errors import SandboxError
from .safe_open import DIR_FLAGS, READ_FLAGS, io_error, open_directory_raw, relative_inside
from .workspace_files import MAX_ENTRIES, explain

BATCH = 1024 * 1024  # archive bytes one executor call makes
LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = READ_FLAGS | os.O_NOFOLLOW
# What an open relative to a listed folder answers when the name changed since the
# listing: removed, swapped for a symlink (or a folder for a file): the entry is left out.
_GONE = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO)


@dataclass
class _Folder:
    """A folder being walked: its fd, its members' name prefix, the names still to go
    (sorted, popped from the end)."""

    fd: int
    prefix: str
    names: list[str] = field(default_factory=list)


@dataclass
class _OpenFile:
    """A file whose data is being archived: its fd, its name, the bytes still owed."""

    fd: int
    name: str
    left: int
    size: int


class TarWalk:
    """The tar of `path` under the workspace `root`, made by `step()` calls (one thread
    at a time); `close()` releases every fd."""

    def __init__(self, root: str, path: str, resolver: str = "auto") -> None:
        self._root = root
        self._path = path
        self._resolver = resolver
        self._started = False
        self._done = False
        self._folders: list[_Folder] = []
        self._file: _OpenFile | None = None
        self._pad = 0

    def step(self) -> bytes:
        """The next piece of the archive (at most about `BATCH` bytes), b"" at its end."""
        if self._done:
            return b""
        out = bytearray()
        if not self._started:
            self._started = True
            self._start(out)
        while len(out) < BATCH:
            if self._file is not None:
                data = self._read(BATCH - len(out))
                if not out and len(data) >= BATCH // 2:
                    return data  # a big file's data goes out without a copy
                out += data
                continue
            if self._pad:
                out += b"\0" * self._pad
                self._pad = 0
            if not self._folders:
                out += TAR_END
                self._done = True
                break
            self._next_entry(out)
        return bytes(out)

    def close(self) -> None:
        """Close every fd the walk holds (the walk ends)."""
        self._done = True
        if self._file is not None:
            os.close(self._file.fd)
            self._file = None
        while self._folders:
            os.close(self._folders.pop().fd)

    # ---- the walk -------------------------------------------------------------------

    def _start(self, out: bytearray) -> None:
        rel = posixpath.normpath(relative_inside(self._root, self._path))
        if rel == ".":
            folder, name = ".", "."
        else:
            folder, name = posixpath.dirname(rel) or ".", posixpath.basename(rel)
        try:
            root_fd = os.open(self._root, DIR_FLAGS)
            try:
                holder = open_directory_raw(
                    root_fd, folder, root=self._root, resolver=self._resolver
                )
            finally:
                os.close(root_fd)
            try:
                info = os.stat(name, dir_fd=holder, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    fd = os.open(name, LIST_FLAGS, dir_fd=holder)
                    self._push(fd, "")
                else:
                    self._member(holder, name, name, info, out)
            finally:
                os.close(holder)
        except OSError as exc:
            raise explain(exc, self._path) from None

    def _push(self, fd: int, prefix: str) -> None:
        try:
            names = self._listing(fd)
        except BaseException:
            os.close(fd)
            raise
        names.sort(reverse=True)
        self._folders.append(_Folder(fd, prefix, names))

    def _listing(self, fd: int) -> list[str]:
        names: list[str] = []
        with os.scandir(fd) as scan:  # scandir works on a dup: the fd stays ours
            for entry in scan:
                if len(names) >= MAX_ENTRIES:
                    raise SandboxError(f"a folder holds more than {MAX_ENTRIES} entries")
                names.append(entry.name)
        return names

    def _next_entry(self, out: bytearray) -> None:
        top = self._folders[-1]
        if not top.names:
            os.close(self._folders.pop().fd)
            return
        name = top.names.pop()
        try:
            info = os.stat(name, dir_fd=top.fd, follow_symlinks=False)
        except FileNotFoundError:
            return  # removed since the listing
        self._member(top.fd, name, top.prefix + name, info, out)

    def _member(
        self, holder: int, name: str, shown: str, info: os.stat_result, out: bytearray
    ) -> None:
        """Archive the entry `name` of the folder `holder` as the member `shown`."""
        kind = info.st_mode
        try:
            if stat.S_ISDIR(kind):
                fd = os.open(name, LIST_FLAGS, dir_fd=holder)
                opened = os.fstat(fd)
                out += dir_header(shown, mode=opened.st_mode, mtime=opened.st_mtime)
                self._push(fd, shown + "/")
            elif stat.S_ISLNK(kind):
                target = os.readlink(name, dir_fd=holder)
                out += symlink_header(shown, target, mtime=info.st_mtime)
            elif stat.S_ISREG(kind):
                self._open_file(holder, name, shown, out)
            # FIFOs, sockets, devices: left out, never opened.
        except OSError as exc:
            if exc.errno in _GONE or exc.errno == errno.EINVAL:  # EINVAL: not a link now
                return
            raise io_error(exc, shown, write=False) from None

    def _open_file(self, holder: int, name: str, shown: str, out: bytearray) -> None:
        fd = os.open(name, FILE_FLAGS, dir_fd=holder)
        try:
            opened = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if not stat.S_ISREG(opened.st_mode):
            os.close(fd)  # swapped for a FIFO or a device since the listing
            return
        out += file_header(shown, size=opened.st_size, mode=opened.st_mode, mtime=opened.st_mtime)
        if opened.st_size == 0:
            os.close(fd)
            return
        self._file = _OpenFile(fd, shown, opened.st_size, opened.st_size)

    def _read(self, room: int) -> bytes:
        """Up to `room` bytes of the open file's data (zeros past its end); closes it
        once its member is complete."""
        current = self._file
        assert current is not None
        want = min(room, current.left)
        try:
            data = os.read(current.fd, want)
        except OSError as exc:
            raise io_error(exc, current.name, write=False) from None
        if not data:
            data = b"\0" * want  # it shrank while read: its member keeps the stat's size
        current.left -= len(data)
        if not current.left:
            os.close(current.fd)
            self._file = None
            self._pad = len(tar_padding(current.size))
        return data


async def persist(root: str, path: str, resolver: str = "auto") -> AsyncGenerator[bytes, None]:
    """The tar of `path` under `root`, one `TarWalk.step` per executor call."""
    walk = TarWalk(root, path, resolver)
    call: asyncio.Future[bytes] | None = None
    try:
        while True:
            call = asyncio.ensure_future(asyncio.to_thread(walk.step))
            # wait() leaves the step running when we are cancelled: the walk is closed
            # by whatever finishes last, never under a running step.
            await asyncio.wait({call})
            piece = call.result()
            call = None
            if not piece:
                return
            yield piece
    finally:
        _close_after(call, walk)


def _close_after(call: asyncio.Future[bytes] | None, walk: TarWalk) -> None:
    if call is None or call.done():
        walk.close()
        return

    def close(done: asyncio.Future[bytes]) -> None:
        if not done.cancelled():
            done.exception()  # consumed: nobody waits for it any more
        walk.close()

    call.add_done_callback(close)
