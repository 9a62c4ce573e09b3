"""The workspace calls of docker, through the engine's archive endpoint where it can.

- `stat`: the engine's stat (HEAD, runs nothing) of the name inside its folder, the
  folders on the way walked as `files.locate` walks them (symlinks by the engine's
  resolved target, kept inside the workspace); a symlink's own target (as written) is
  read from the one-member archive of the link.
- `list_dir`: the folder's archive, headers only (data is skipped as it streams); the
  cost grows with the subtree, but nothing runs in the container.
- `make_dir`, `make_symlink`: tar members put into the deepest existing folder (with
  `noOverwriteDirNonDir`), modes and the session's owner in the headers.
- hydration (`hydrate`, `DockerSink`): the same members gathered into one tar per
  existing folder and put in batches; stats only for names in folders the container
  held (see `DockerSink`).
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
    FileAccess,
    FileInfo,
    FileKind,
    TarStream,
    WorkspaceAccess,
    child_path,
    dir_header,
    exact_chunks,
    extract_archive_batched,
    file_header,
    symlink_header,
    tar_padding,
    walk_tar,
)
from ...errors import (
    InvalidArgumentError,
    NotAFileError,
    ProviderError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)
from .archive import MODE_DIR, MODE_SYMLINK, put_tar, stat_path
from .engine import Engine
from .errors import is_not_found
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

    def _header(self, name: str, kind: bytes, mode: int, link: str = "", size: int = 0) -> bytes:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.size = size
        info.mode = mode & 0o7777
        info.uid, info.gid = self._owner
        info.linkname = link
        info.mtime = int(datetime.datetime.now().timestamp())
        return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")

    def _make_dir_blocking(self, path: str, parents: bool, mode: int | None) -> bool:
        """Make the folder; whether it was missing (and so was made here)."""
        parts = workspace_parts(self._workspace, path)
        if not parts:
            if not parents:
                raise InvalidArgumentError(f"{path!r} exists (it is the workspace)")
            return False
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
            return False
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
        return True

    def _root_blocking(self, path: str) -> tuple[str, bool]:
        made = self._make_dir_blocking(path, True, None)
        return self._folder(workspace_parts(self._workspace, path), path), made

    def _kind_blocking(self, full: str) -> FileKind | None:
        stat = stat_path(self._engine.api, self._id, full)
        return None if stat is None else go_mode(int(stat.get("mode", 0)))[0]

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

    async def extraction_root(self, path: str) -> tuple[str, bool]:
        """The absolute folder `path` leads to, made (with its parents) when missing, and
        whether this call made it (then it holds nothing yet)."""
        return await self._engine.call(f"make the folder {path!r}", self._root_blocking, path)

    async def folder_at(self, path: str) -> str:
        """The absolute folder `path` leads to (symlinks followed inside the workspace;
        one out of it is a `WorkspacePathError`)."""
        parts = workspace_parts(self._workspace, path)
        return await self._engine.call(f"stat {path!r}", self._folder, parts, path)

    async def kind_at(self, full: str) -> FileKind | None:
        """What is at the absolute `full` (not followed), None when nothing is: one stat."""
        return await self._engine.call(f"stat {full!r}", self._kind_blocking, full)

    def member_header(
        self, name: str, kind: bytes, mode: int, *, link: str = "", size: int = 0
    ) -> bytes:
        """The tar header of one member with the session's owner (pax when it must)."""
        return self._header(name, kind, mode, link, size)

    async def put_batch(self, folder: str, spool: Spool) -> None:
        """Put the members `spool` holds (one tar, its end added) into the absolute,
        existing `folder`: one engine call. Cancelled, the call goes on and the spool is
        closed when it ends; the spool is emptied for the next batch once it landed."""
        api, tail = self._engine.api, spool.tail()

        def put() -> None:
            put_tar(api, self._id, folder, spool.pieces(tail))
            spool.rewind()

        call = self._engine.submit(f"hydrate into {folder!r}", put)
        spool.hold(call)
        await asyncio.wait({call})  # a cancelled caller leaves the call to end
        try:
            call.result()
        except ProviderError as exc:
            if is_not_found(exc) and "could not find the file" in str(exc).lower():
                raise SandboxFileNotFoundError(
                    f"cannot hydrate into {folder!r}: it disappeared while hydrating"
                ) from None
            raise
        spool.landed()

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


# ---- hydration ------------------------------------------------------------------------

# A batch is put once it holds this many members or bytes (its spool is on disk past
# SPILL_BYTES, so memory stays near SPILL_BYTES plus one chunk whatever the archive).
BATCH_MEMBERS = 1000
BATCH_BYTES = 8 * 1024 * 1024
SPILL_BYTES = 1024 * 1024


class Spool:
    """The tar members of one batch: the first bytes in memory, the rest spilled to a
    temporary file. Only complete members are sent (`commit` marks where the last one
    ends): an archive cut inside a file leaves no half member in a put.

    `close` closes the file now, or once the pool call using it (a write to it, or the
    put reading it) ends: a blocking call cannot be stopped, and must not find it
    closed."""

    def __init__(self) -> None:
        self._file: Any = None
        self._buffer = bytearray()
        self._spilled = 0
        self._committed = 0
        self._busy: asyncio.Future[Any] | None = None
        self._closed = False
        self.members = 0

    @property
    def size(self) -> int:
        """The bytes of the complete members held."""
        return self._committed

    async def write(self, data: bytes) -> None:
        """Add `data` at the end (spilled to the file once enough is in memory)."""
        self._buffer += data
        if len(self._buffer) < SPILL_BYTES:
            return
        if self._file is None:
            call = asyncio.ensure_future(asyncio.to_thread(tempfile.TemporaryFile))
            call.add_done_callback(self._adopt)
            await self._wait(call)
        data, self._buffer = bytes(self._buffer), bytearray()
        await self._wait(asyncio.ensure_future(asyncio.to_thread(self._file.write, data)))
        self._spilled += len(data)

    def commit(self) -> None:
        """The bytes written so far are whole members (one more than before)."""
        self._committed = self._spilled + len(self._buffer)
        self.members += 1

    def tail(self) -> bytes:
        """The committed bytes still in memory (taken on the loop, before a put)."""
        return bytes(self._buffer[: max(0, self._committed - self._spilled)])

    def pieces(self, tail: bytes) -> Iterator[bytes]:
        """The committed members and the archive's end (iterated on the pool)."""
        if self._file is not None:
            self._file.seek(0)
            left = min(self._spilled, self._committed)
            while left:
                piece = self._file.read(min(READ_CHUNK, left))
                if not piece:
                    raise ProviderError("the hydration's spool ended early", retryable=False)
                left -= len(piece)
                yield piece
        yield tail
        yield TAR_END

    def rewind(self) -> None:
        """Empty the file for the next batch (on the pool, after the put)."""
        if self._file is not None:
            self._file.seek(0)
            self._file.truncate()

    def landed(self) -> None:
        """The batch was put: start the next one empty."""
        self._buffer.clear()
        self._spilled = self._committed = self.members = 0

    def hold(self, call: asyncio.Future[Any]) -> None:
        """`call` (on the pool) uses the file until it ends."""
        self._busy = call

    def close(self) -> None:
        """Close the file now, or when the pool call using it ends."""
        self._closed = True
        busy = self._busy
        if busy is not None and not busy.done():
            busy.add_done_callback(lambda _: self._close_file())
        else:
            self._close_file()

    async def _wait(self, call: asyncio.Future[Any]) -> Any:
        self._busy = call
        await asyncio.wait({call})  # cancelled, the call still ends; `close` waits for it
        return call.result()

    def _adopt(self, call: asyncio.Future[Any]) -> None:
        if call.cancelled() or call.exception() is not None:
            return
        self._file = call.result()
        if self._closed:
            self._close_file()

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()


class _Folder:
    """What the sink knows of one folder of the extraction: the existing container
    folder its members are put into (`base`) and its name below it (`rel`: "" for the
    base itself; every folder between is a real folder, none a symlink), whether this
    hydration made it (`fresh`: nothing is in it but what `names` lists), and the names
    in it that this hydration put or saw, by kind."""

    __slots__ = ("base", "fresh", "names", "rel")

    def __init__(self, base: str, rel: str, fresh: bool) -> None:
        self.base, self.rel, self.fresh = base, rel, fresh
        self.names: dict[str, FileKind] = {}

    def child(self, name: str, fresh: bool) -> _Folder:
        """The record of its real subfolder `name`."""
        return _Folder(self.base, posixpath.join(self.rel, name) if self.rel else name, fresh)

    def member(self, name: str) -> str:
        """The tar name of its entry `name`, below `base`."""
        return posixpath.join(self.rel, name) if self.rel else name


class DockerSink:
    """`extract.Sink` for docker: members gathered into tars put through the archive
    endpoint (one engine call per batch), with their modes and the session's owner, below
    the folder `root`.

    The extractor has refused bad names and anything through a link the archive made;
    what is left is what the container already held. A member goes into the batch
    without an engine call when its folder was made by this hydration (it holds only
    what the hydration put there); in a folder that existed, its name is stated first
    (one HEAD: what was already there), and a batch goes to one existing folder only, so
    the engine never follows a symlink on a member's way. Anything but the plain case
    (nothing at the name, a folder where a folder member goes, a file where a file
    member goes) puts the batch first and walks the container's real state: a folder
    member over a symlink to a folder inside the workspace follows it (what goes below
    it is batched into that folder), the rest goes through the per-member calls
    (`ContainerTree`), where a symlink out of the workspace, a FIFO or a file in the way
    is refused, as by `write_file` and `make_dir`.

    `open` before the members, `flush` after them (what came before a refused member
    lands), `close` in any case (the spool, now or once its put ends)."""

    def __init__(self, tree: ContainerTree, root: str) -> None:
        self._tree = tree
        self._root = root
        self._folders: dict[str, _Folder] = {}
        self._spool = Spool()
        self._base: str | None = None
        self._failed = False

    def _path(self, path: str) -> str:
        return path if self._root in ("", ".") else f"{self._root.rstrip('/')}/{path}"

    async def open(self) -> None:
        """Make the root folder when it is missing, and learn where it leads."""
        folder, made = await self._tree.extraction_root(self._root or ".")
        self._folders[""] = _Folder(folder, "", made)

    async def flush(self) -> None:
        """Put the members gathered so far (nothing more once a put failed: the batch it
        held is not sent twice)."""
        if self._failed or not self._spool.members or self._base is None:
            return
        try:
            await self._tree.put_batch(self._base, self._spool)
        except Exception:
            self._failed = True
            raise

    def close(self) -> None:
        """Drop what was not put; the spool is closed once nothing uses it."""
        self._spool.close()

    async def _parent(self, path: str) -> tuple[_Folder, str]:
        """The record of `path`'s folder (made before it by the extractor) and its name."""
        folder, _, name = path.rpartition("/")
        record = self._folders.get(folder)
        if record is None:  # not made through this sink: as the container's walk finds it
            await self.flush()
            record = self._folders[folder] = await self._walked(folder, None)
        return record, name

    async def _walked(self, path: str, parent: _Folder | None) -> _Folder:
        """The record of the existing folder `path` as the container's walk finds it."""
        folder = await self._tree.folder_at(self._path(path))
        if parent is not None:
            same = posixpath.join(parent.base, parent.member(posixpath.basename(path)))
            if folder == same:
                return parent.child(posixpath.basename(path), False)
        return _Folder(folder, "", False)

    async def _kind(self, parent: _Folder, name: str) -> FileKind | None:
        """What is at `name` in `parent` (a stat only when the container may hold it)."""
        kind = parent.names.get(name)
        if kind is not None or parent.fresh:
            return kind
        return await self._tree.kind_at(posixpath.join(parent.base, parent.member(name)))

    async def _into(self, base: str) -> None:
        """Start on a batch for the folder `base` (the one before is put first)."""
        if self._base != base:
            await self.flush()
            self._base = base

    async def _after_member(self) -> None:
        self._spool.commit()
        if self._spool.members >= BATCH_MEMBERS or self._spool.size >= BATCH_BYTES:
            await self.flush()

    async def make_dir(self, path: str, mode: int) -> None:
        """A folder member with `mode` (over an existing folder: its mode is set)."""
        parent, name = await self._parent(path)
        kind = await self._kind(parent, name)
        if kind == "symlink":
            # One the container held: followed when it leads to a folder inside the
            # workspace (the walk refuses any other), its mode left alone, as unix_local
            # does; what goes below it is put into the folder it leads to.
            await self.flush()  # the walk sees the container as it is
            self._folders[path] = await self._walked(path, None)
            parent.names[name] = "symlink"
            return
        if kind not in (None, "dir"):
            await self.flush()  # the per-member call sees the container as it is
            await self._tree.make_dir(self._path(path), True, mode)
            self._folders[path] = await self._walked(path, parent)
            return
        record = self._folders.get(path) or parent.child(name, kind is None)
        await self._into(parent.base)
        await self._spool.write(
            self._tree.member_header(parent.member(name), tarfile.DIRTYPE, mode)
        )
        await self._after_member()
        parent.names[name] = "dir"
        self._folders[path] = record

    async def write_file(
        self, path: str, chunks: AsyncIterator[bytes], size: int, mode: int
    ) -> None:
        """One file member, its data streamed into the batch."""
        parent, name = await self._parent(path)
        kind = await self._kind(parent, name)
        if kind not in (None, "file"):
            await self.flush()
            await self._tree.write_file(self._path(path), chunks, mode)
            return
        await self._into(parent.base)
        spool = self._spool
        await spool.write(
            self._tree.member_header(parent.member(name), tarfile.REGTYPE, mode, size=size)
        )
        written = 0
        async for chunk in chunks:
            written += len(chunk)
            if written > size:
                break
            await spool.write(chunk)
        if written != size:
            raise ProviderError(f"{path!r}: {written} bytes where the archive said {size}")
        await spool.write(tar_padding(size))
        await self._after_member()
        parent.names[name] = "file"

    async def make_symlink(self, path: str, target: str) -> None:
        """A symlink member."""
        parent, name = await self._parent(path)
        kind = await self._kind(parent, name)
        depth = len(parent.rel.split("/")) if parent.rel else 0
        # The engine refuses a link climbing above the folder the tar goes into.
        if kind == "dir" or _climb(target) > depth:
            await self.flush()
            await self._tree.make_symlink(self._path(path), target)
            parent.names[name] = "symlink"
            return
        await self._into(parent.base)
        await self._spool.write(
            self._tree.member_header(parent.member(name), tarfile.SYMTYPE, 0o777, link=target)
        )
        await self._after_member()
        parent.names[name] = "symlink"


async def hydrate(
    tree: ContainerTree,
    root: str,
    chunks: AsyncIterator[bytes],
    *,
    max_members: int,
    max_bytes: int,
) -> int:
    """Extract the tar `chunks` into the folder `root` (made when missing) through a
    `DockerSink`; the member count. A refused member (or any failure but a cancel)
    still lands what came before it, as a member-by-member extraction would."""
    sink = DockerSink(tree, root)
    try:
        await sink.open()
        return await extract_archive_batched(
            chunks, sink, max_members=max_members, max_bytes=max_bytes
        )
    finally:
        sink.close()


class DockerWorkspace(WorkspaceAccess):
    """docker's workspace: the archive endpoint (`ContainerTree`: runs nothing in the
    container), except `remove` and `set_mode`, which the engine has no call for (a
    shell in the container: `ShellFileOps`)."""

    def _tree(self) -> ContainerTree:
        tree: ContainerTree = self.session._tree()
        return tree

    async def stat(self, path: str) -> FileInfo:
        """The engine's stat of the name in its walked folder."""
        return await self._tree().stat(path)

    async def list_dir(self, path: str) -> list[FileInfo]:
        """The folder's archive, headers only."""
        return await self._tree().list_dir(path)

    async def remove(self, path: str, recursive: bool) -> None:
        """`rm`/`rmdir` in the container."""
        await self.session._shell_ops().remove(path, recursive)

    async def make_dir(self, path: str, parents: bool) -> None:
        """Folder members put into the deepest existing folder."""
        await self._tree().make_dir(path, parents)

    async def make_symlink(self, path: str, target: str) -> None:
        """A symlink member put into the link's folder."""
        await self._tree().make_symlink(path, target)

    async def set_mode(self, path: str, mode: int) -> None:
        """`chmod` in the container (hydration sets modes in the tar headers instead)."""
        await self.session._shell_ops().set_mode(path, mode)

    def persist(self, path: str, files: FileAccess, read_limit: int) -> AsyncIterator[bytes]:
        """The engine's archive of the folder, re-rooted as it streams."""
        return self._tree().persist(path)

    async def hydrate(
        self,
        chunks: AsyncIterator[bytes],
        path: str,
        files: FileAccess,
        max_members: int,
        max_bytes: int,
    ) -> int:
        """The extractor's members put through the archive endpoint in batches, modes in
        headers (`DockerSink`)."""
        return await hydrate(
            self._tree(), path, chunks, max_members=max_members, max_bytes=max_bytes
        )
