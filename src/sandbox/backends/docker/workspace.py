"""The workspace calls of docker, through the engine's archive endpoint where it can.

- `stat`: the engine's stat (HEAD, runs nothing) of the name inside its folder, the
  folders on the way walked as `files.locate` walks them (symlinks by the engine's
  resolved target, kept inside the workspace); a symlink's own target (as written) is
  read from the one-member archive of the link.
- `list_dir`: the folder's archive, headers only (data is skipped as it streams); the
  cost grows with the subtree, but nothing runs in the container.
- `make_dir`, `make_symlink`, hydration: tar members put into the deepest existing
  folder (with `noOverwriteDirNonDir`), modes and the session's owner in the headers.
- `persist_workspace`: the folder's archive as the engine streams it, names re-rooted
  (the engine prefixes the folder's name), FIFOs, sockets and devices dropped, a hard
  link (the engine emits one for a second name of an inode) sent as a copy of the
  file's data, fetched again by its name.
- `remove` has no endpoint: it runs `rm`/`rmdir` through `workspace.shell_ops`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import posixpath
import re
import tarfile
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any

from ...backend import (
    TAR_END,
    FileInfo,
    FileKind,
    TarStream,
    child_path,
    dir_header,
    exact_chunks,
    file_header,
    symlink_header,
    tar_padding,
    walk_tar,
)
from ...errors import (
    InvalidArgumentError,
    NotAFileError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)
from .archive import MODE_DIR, MODE_SYMLINK, put_tar, stat_path
from .engine import Engine
from .files import MAX_SYMLINK_HOPS, ContainerFiles, _below, workspace_parts

READ_CHUNK = 1024 * 1024
# Go's os.FileMode bits (the engine's stat) for what is neither a file nor a folder.
_GO_SPECIAL = (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
_GO_SETUID, _GO_SETGID, _GO_STICKY = 1 << 23, 1 << 22, 1 << 20
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$")


def go_mode(mode: int) -> tuple[FileKind, int]:
    """The kind and POSIX permission bits of a Go `os.FileMode`."""
    perm = mode & 0o777
    perm |= 0o4000 if mode & _GO_SETUID else 0
    perm |= 0o2000 if mode & _GO_SETGID else 0
    perm |= 0o1000 if mode & _GO_STICKY else 0
    if mode & MODE_SYMLINK:
        return "symlink", perm
    if mode & MODE_DIR:
        return "dir", perm
    if mode & _GO_SPECIAL:
        return "other", perm
    return "file", perm


def go_time(text: object) -> float:
    """Seconds since the epoch of the engine's RFC 3339 time (nanoseconds cut)."""
    found = _RFC3339.match(text) if isinstance(text, str) else None
    if found is None:
        return 0.0
    whole, fraction, zone = found.groups()
    stamp = f"{whole}.{(fraction or '0')[:6]:0<6}{'+00:00' if zone in (None, 'Z') else zone}"
    try:
        return datetime.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


def _climb(target: str) -> int:
    """How many folders above its own the relative symlink `target` reaches."""
    depth = lowest = 0
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            lowest = min(lowest, depth)
        elif part not in ("", "."):
            depth += 1
    return -lowest


class _Chunks(io.RawIOBase):
    """A blocking file over an iterator of chunks (for `tarfile`'s stream mode)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._rest))
        buffer[:size] = self._rest[:size]
        self._rest = self._rest[size:]
        return size


class ContainerTree:
    """The workspace calls of one container (see the module docstring)."""

    def __init__(
        self, engine: Engine, container_id: str, workspace: str, owner: tuple[int, int]
    ) -> None:
        self._engine = engine
        self._id = container_id
        self._workspace = workspace
        self._owner = owner
        self._files = ContainerFiles(engine, container_id, workspace, owner)

    # ---- walking (blocking, on the engine's pool) ---------------------------------------

    def _folder(self, parts: list[str], path: str) -> str:
        """The absolute folder `parts` lead to (symlinks followed inside)."""
        api, current, queue, hops = self._engine.api, self._workspace, list(parts), 0
        while queue:
            part = queue.pop(0)
            candidate = posixpath.join(current, part)
            stat = stat_path(api, self._id, candidate)
            if stat is None:
                raise SandboxFileNotFoundError(f"no such file in the workspace: {path!r}")
            kind, _ = go_mode(int(stat.get("mode", 0)))
            if kind == "symlink":
                hops += 1
                target = str(stat.get("linkTarget") or "")
                below = _below(self._workspace, posixpath.normpath(target)) if target else None
                if hops > MAX_SYMLINK_HOPS or not target.startswith("/"):
                    raise NotAFileError(f"{path!r}: a symbolic link the engine did not resolve")
                if below is None:
                    raise WorkspacePathError(
                        f"path {path!r} leads out of the workspace through a symbolic link"
                    )
                current, queue = self._workspace, [*below, *queue]
            elif kind == "dir":
                current = candidate
            else:
                raise InvalidArgumentError(f"{path!r}: {part!r} on its path is not a directory")
        return current

    def _raw_link(self, full: str) -> str:
        chunks, _ = self._engine.api.get_archive(self._id, full, chunk_size=READ_CHUNK)
        try:
            with tarfile.open(fileobj=io.BufferedReader(_Chunks(iter(chunks))), mode="r|") as tar:
                for member in tar:
                    return member.linkname
        finally:
            chunks.close()
        return ""

    def _stat_blocking(self, path: str) -> FileInfo:
        parts = workspace_parts(self._workspace, path)
        shown = posixpath.basename(posixpath.normpath(path))
        folder = self._folder(parts[:-1], path) if parts else posixpath.dirname(self._workspace)
        full = posixpath.join(folder, parts[-1]) if parts else self._workspace
        stat = stat_path(self._engine.api, self._id, full)
        if stat is None:
            raise SandboxFileNotFoundError(f"no such file in the workspace: {path!r}")
        kind, perm = go_mode(int(stat.get("mode", 0)))
        link = self._raw_link(full) if kind == "symlink" else None
        size = len(link.encode()) if link is not None else int(stat.get("size", 0))
        return FileInfo(shown, path, kind, size, perm, go_time(stat.get("mtime")), link)

    def _list_blocking(self, path: str) -> list[FileInfo]:
        folder = self._folder(workspace_parts(self._workspace, path), path)
        chunks, _ = self._engine.api.get_archive(self._id, folder, chunk_size=READ_CHUNK)
        entries: list[FileInfo] = []
        try:
            reader = io.BufferedReader(_Chunks(iter(chunks)), READ_CHUNK)
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                for member in tar:
                    rest = member.name.rstrip("/").partition("/")[2]
                    if not rest or "/" in rest:
                        continue
                    entries.append(self._entry(member, rest, child_path(path, rest), folder))
        finally:
            chunks.close()
        return entries

    def _entry(self, member: tarfile.TarInfo, name: str, shown: str, folder: str) -> FileInfo:
        if member.isdir():
            kind: FileKind = "dir"
        elif member.issym():
            kind = "symlink"
        elif member.isreg():
            kind = "file"
        elif member.islnk():  # a second name of a file: its size by the engine's stat
            stat = stat_path(self._engine.api, self._id, posixpath.join(folder, name)) or {}
            return FileInfo(
                name, shown, "file", int(stat.get("size", 0)), member.mode & 0o7777, member.mtime
            )
        else:
            kind = "other"
        link = member.linkname if kind == "symlink" else None
        size = len(link.encode()) if link is not None else member.size
        # The engine's headers carry the whole st_mode (type bits too).
        return FileInfo(name, shown, kind, size, member.mode & 0o7777, member.mtime, link)

    def _located_parent(self, path: str) -> tuple[str, str]:
        parts = workspace_parts(self._workspace, path)
        if not parts:
            raise InvalidArgumentError(f"{path!r} is the workspace itself")
        return self._folder(parts[:-1], path), parts[-1]

    def _put_members(self, folder: str, headers: list[bytes]) -> None:
        put_tar(self._engine.api, self._id, folder, iter([*headers, TAR_END]))

    def _header(self, name: str, kind: bytes, mode: int, link: str = "") -> bytes:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode & 0o7777
        info.uid, info.gid = self._owner
        info.linkname = link
        info.mtime = int(datetime.datetime.now().timestamp())
        return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")

    def _make_dir_blocking(self, path: str, parents: bool, mode: int | None) -> None:
        parts = workspace_parts(self._workspace, path)
        if not parts:
            if not parents:
                raise InvalidArgumentError(f"{path!r} exists (it is the workspace)")
            return
        api = self._engine.api
        existing = 0
        for k in range(1, len(parts) + 1):
            try:
                self._folder(parts[:k], path)
            except SandboxFileNotFoundError:
                break
            except InvalidArgumentError:
                raise NotAFileError(f"cannot make {path!r}: a file is in the way") from None
            existing = k
        if existing == len(parts):
            if not parents and mode is None:
                raise InvalidArgumentError(f"cannot make {path!r}: it exists")
            if mode is not None:  # a folder member over it sets its mode
                parent = self._folder(parts[:-1], path)
                self._put_members(parent, [self._header(parts[-1], tarfile.DIRTYPE, mode)])
            return
        if existing < len(parts) - 1 and not parents:
            raise SandboxFileNotFoundError(f"cannot make {path!r}: its parent is missing")
        base = self._folder(parts[:existing], path) if existing else self._workspace
        missing = parts[existing:]
        stat = stat_path(api, self._id, posixpath.join(base, missing[0]))
        if stat is not None:  # a file or a dangling link is where a folder should be
            raise NotAFileError(f"cannot make {path!r}: {missing[0]!r} is in the way")
        headers = [
            self._header(
                "/".join(missing[:depth]),
                tarfile.DIRTYPE,
                mode if (mode is not None and depth == len(missing)) else 0o755,
            )
            for depth in range(1, len(missing) + 1)
        ]
        self._put_members(base, headers)

    def _symlink_blocking(self, path: str, target: str) -> None:
        folder, name = self._located_parent(path)
        stat = stat_path(self._engine.api, self._id, posixpath.join(folder, name))
        if stat is not None and go_mode(int(stat.get("mode", 0)))[0] == "dir":
            raise NotAFileError(f"cannot make the symlink {path!r}: a folder is there")
        # The engine refuses a link whose target climbs above the folder the tar is put
        # into: put it that many folders higher, its name carrying the folders between.
        climb = _climb(target)
        names = [name]
        for _ in range(climb):
            if folder == self._workspace:
                raise WorkspacePathError(f"the symlink {path!r} -> {target!r} leads out")
            names.insert(0, posixpath.basename(folder))
            folder = posixpath.dirname(folder)
        member = "/".join(names)
        self._put_members(folder, [self._header(member, tarfile.SYMTYPE, 0o777, target)])

    # ---- the calls -------------------------------------------------------------------

    async def stat(self, path: str) -> FileInfo:
        """The entry at `path`, not followed."""
        return await self._engine.call(f"stat {path!r}", self._stat_blocking, path)

    async def list_dir(self, path: str) -> list[FileInfo]:
        """The entries of the folder `path`, from its archive's headers."""
        return await self._engine.call(f"list {path!r}", self._list_blocking, path)

    async def make_dir(self, path: str, parents: bool, mode: int | None = None) -> None:
        """Make the folder `path` by folder members (with `mode` for the last one)."""
        await self._engine.call(
            f"make the folder {path!r}", self._make_dir_blocking, path, parents, mode
        )

    async def make_symlink(self, path: str, target: str) -> None:
        """Put a symlink member where `path` leads."""
        await self._engine.call(f"make the symlink {path!r}", self._symlink_blocking, path, target)

    async def write_file(self, path: str, chunks: AsyncIterator[bytes], mode: int) -> None:
        """Spool `chunks`, then put one file member with `mode` (and the session's owner).

        Cancelled while the chunks arrive, the spool is closed (once the write to it in
        flight ends); cancelled during the put, it is left to the pool call reading it
        (closed when that call drops it)."""
        from .archive import tar_spooled_file

        spool = await asyncio.to_thread(tempfile.TemporaryFile)
        size = 0
        call: asyncio.Future[Any] | None = None
        try:
            async for chunk in chunks:
                call = asyncio.ensure_future(asyncio.to_thread(spool.write, chunk))
                await asyncio.wait({call})
                call.result()
                call = None
                size += len(chunk)
        except BaseException:
            if call is None or call.done():
                spool.close()
            else:
                call.add_done_callback(lambda _: spool.close())
            raise
        try:
            await self._files._put(
                path,
                lambda name, parents, uid, gid: tar_spooled_file(
                    name, spool, size, uid=uid, gid=gid, mode=mode & 0o7777, parents=parents
                ),
            )
        except asyncio.CancelledError:
            raise  # the pool call may still read the spool
        except BaseException:
            spool.close()
            raise
        spool.close()

    async def persist(self, path: str) -> AsyncIterator[bytes]:
        """The folder's archive, re-rooted (see the module docstring)."""
        top = await self.stat(path)
        if top.kind != "dir":
            async with contextlib.aclosing(walk_tar(_TreeSource(self), path)) as walked:
                async for piece in walked:
                    yield piece
            return
        parts = workspace_parts(self._workspace, path)
        engine = self._engine

        def start() -> tuple[Any, Iterator[bytes]]:
            folder = self._folder(parts, path)
            chunks, _ = engine.api.get_archive(self._id, folder, chunk_size=READ_CHUNK)
            return chunks, iter(chunks)

        stream, pieces = await engine.call(f"archive {path!r}", start)
        pull = _Pull(engine, stream, pieces, path)
        chunks = pull.chunks()
        try:
            members = TarStream(chunks)
            while (member := await members.next_member()) is not None:
                name = member.name.rstrip("/").partition("/")[2]
                if not name:
                    continue
                kind = member.type
                if kind == tarfile.DIRTYPE:
                    yield dir_header(name, mode=member.mode, mtime=member.mtime)
                elif kind == tarfile.SYMTYPE:
                    yield symlink_header(name, member.linkname, mtime=member.mtime)
                elif kind in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    yield file_header(name, size=member.size, mode=member.mode, mtime=member.mtime)
                    async for piece in members.data():
                        yield piece
                    yield tar_padding(member.size)
                elif kind == tarfile.LNKTYPE:
                    first = member.linkname.partition("/")[2]
                    source = child_path(path, first)
                    info = await self.stat(source)
                    yield file_header(name, size=info.size, mode=member.mode, mtime=member.mtime)
                    async for piece in exact_chunks(
                        self._files.read_chunks(source, READ_CHUNK), info.size
                    ):
                        yield piece
                    yield tar_padding(info.size)
            yield TAR_END
        finally:
            await chunks.aclose()
            pull.close()


class _TreeSource:
    """`persist.Source` over a `ContainerTree`."""

    def __init__(self, tree: ContainerTree) -> None:
        self._tree = tree

    async def stat(self, path: str) -> FileInfo:
        return await self._tree.stat(path)

    async def list_dir(self, path: str) -> list[FileInfo]:
        return await self._tree.list_dir(path)

    def read_chunks(self, path: str) -> AsyncIterator[bytes]:
        return self._tree._files.read_chunks(path, READ_CHUNK)


class _Pull:
    """The archive's chunks, one pool call each; `close` closes the engine's stream now,
    or when the pool call still reading it ends (a generator cannot be closed while a
    thread runs it)."""

    def __init__(self, engine: Engine, stream: Any, pieces: Iterator[bytes], path: str) -> None:
        self._engine, self._stream, self._pieces, self._path = engine, stream, pieces, path
        self._call: asyncio.Future[bytes | None] | None = None

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The chunks as they arrive."""
        while True:
            call = self._engine.submit(f"archive {self._path!r}", next, self._pieces, None)
            self._call = call
            await asyncio.wait({call})  # a cancelled caller leaves the call to end
            chunk = call.result()
            self._call = None
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        """Close the stream once nothing reads it."""
        call = self._call
        if call is None or call.done():
            self._stream.close()
        else:
            call.add_done_callback(lambda _: self._stream.close())


class DockerSink:
    """`extract.Sink` for docker: members put through the archive endpoint with their
    modes and the session's owner, below the folder `root`."""

    def __init__(self, tree: ContainerTree, root: str) -> None:
        self._tree = tree
        self._root = root

    def _path(self, path: str) -> str:
        return path if self._root in ("", ".") else f"{self._root.rstrip('/')}/{path}"

    async def make_dir(self, path: str, mode: int) -> None:
        """A folder member with `mode` (over an existing folder: its mode is set)."""
        await self._tree.make_dir(self._path(path), True, mode)

    async def write_file(
        self, path: str, chunks: AsyncIterator[bytes], size: int, mode: int
    ) -> None:
        """One file member (spooled first: the header needs the size)."""
        del size
        await self._tree.write_file(self._path(path), chunks, mode)

    async def make_symlink(self, path: str, target: str) -> None:
        """A symlink member."""
        await self._tree.make_symlink(self._path(path), target)
