"""`sandbox cp SRC DST`: copy a file or a directory between the host and a sandbox.

The side written `:path` is in the sandbox (relative paths in its workspace), the other
on the host. A directory travels as an archive (`persist_workspace` /
`hydrate_workspace`, under the extractor's rules both ways): its contents land in DST,
as `cp -r SRC/. DST` would put them. A file is streamed (`read_file_chunks` /
`write_file_chunks`); a DST that is a folder, or ends in "/", receives it under its own
name. On the host both sides stay beneath the folder named (the same beneath-the-root
opens as unix_local's workspace: no symlink leads a copy out of DST). A progress line
goes to stderr for copies over `PROGRESS_FROM` bytes when stderr is a terminal.

With `--session REF_FILE` the copy goes into or out of the sandbox `sandbox open` left
running (resumed, then detached again, its ref rewritten); otherwise a fresh session is
opened for the copy and closed after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import posixpath
import sys
from collections.abc import AsyncIterator
from typing import TextIO

from ..backends.toolkit import options as cli_options
from ..backends.unix_local import local_files
from ..backends.unix_local.workspace_files import LocalTree
from ..errors import InvalidArgumentError, SandboxFileNotFoundError
from ..session import BaseSandboxSession
from ..workspace.extract import extract, landing_mode
from ..workspace.info import FileInfo
from ..workspace.persist import walk_tar
from .cp_guard import refuse_throwaway_target
from .durable import cli_session

CHUNK = 1024 * 1024
PROGRESS_FROM = 8 * 1024 * 1024
PROGRESS_STEP = 4 * 1024 * 1024


class Progress:
    """Counts bytes; on a terminal, rewrites one stderr line as they pass."""

    def __init__(self, stream: TextIO, what: str) -> None:
        self._stream = stream
        self._what = what
        self._on = stream.isatty()
        self.total = 0
        self._shown = 0

    async def count(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`chunks`, counted."""
        async for chunk in chunks:
            self.total += len(chunk)
            if (
                self._on
                and self.total >= PROGRESS_FROM
                and self.total - self._shown >= PROGRESS_STEP
            ):
                self._shown = self.total
                self._stream.write(f"\r{self._what}: {self.total / 2**20:.0f} MiB")
                self._stream.flush()
            yield chunk

    def done(self) -> None:
        """End the progress line, if one was shown."""
        if self._shown:
            self._stream.write(f"\r{self._what}: {self.total / 2**20:.1f} MiB, done\n")
            self._stream.flush()


class _HostSource:
    """`persist.Source` over a host folder, beneath it."""

    def __init__(self, root: str) -> None:
        self._root = root
        self._tree = LocalTree(root)

    async def stat(self, path: str) -> FileInfo:
        return await asyncio.to_thread(self._tree.stat, path)

    async def list_dir(self, path: str) -> list[FileInfo]:
        return await asyncio.to_thread(self._tree.list_dir, path)

    def read_chunks(self, path: str) -> AsyncIterator[bytes]:
        return local_files.read_chunks(self._root, path, CHUNK)


class _HostSink:
    """`extract.Sink` into a host folder, beneath it; never over `protected` (the
    session's own ref file: a sandbox must not be able to rewrite what finds it)."""

    def __init__(self, root: str, protected: str | None = None) -> None:
        self._root = root
        self._tree = LocalTree(root)
        self._protected = protected

    async def make_dir(self, path: str, mode: int) -> None:
        await asyncio.to_thread(self._tree.make_dir, path, True)
        # Masked here too (the extractor already did): this is the host's own folder.
        await asyncio.to_thread(self._tree.set_mode, path, landing_mode(mode, folder=True))

    async def write_file(
        self, path: str, chunks: AsyncIterator[bytes], size: int, mode: int
    ) -> None:
        del size
        _refuse_session_file(self._root, path, self._protected)
        await local_files.write_chunks(self._root, path, chunks)
        await asyncio.to_thread(self._tree.set_mode, path, landing_mode(mode, folder=False))

    async def make_symlink(self, path: str, target: str) -> None:
        _refuse_session_file(self._root, path, self._protected)
        await asyncio.to_thread(self._tree.make_symlink, path, target)


def _refuse_session_file(folder: str, name: str, protected: str | None) -> None:
    """Refuse a host destination that is the session's ref file (`--session FILE`)."""
    if protected is None:
        return
    if os.path.normpath(os.path.join(folder, name)) == protected:
        raise InvalidArgumentError(
            f"refusing to copy over {protected!r}: it is the ref file of the session the "
            "copy comes from; choose another destination"
        )


def _split(spec: str) -> tuple[bool, str]:
    """(in the sandbox, path) for a command-line side."""
    if spec.startswith(":"):
        if len(spec) == 1:
            raise InvalidArgumentError("`:` names no path in the sandbox (try `:.`)")
        return True, spec[1:]
    if not spec:
        raise InvalidArgumentError("an empty path")
    return False, spec


async def copy_command(args: argparse.Namespace) -> int:
    """Run `sandbox cp`; the exit code."""
    (src_in, src), (dst_in, dst) = _split(args.src), _split(args.dst)
    if src_in == dst_in:
        raise InvalidArgumentError(
            "cp copies between the host and the sandbox: write exactly one side as :PATH"
        )
    backend, options = cli_options.options_from_args(args)
    if dst_in:
        refuse_throwaway_target(backend, options, args.session)
    progress = Progress(sys.stderr, f"{args.src} -> {args.dst}")
    protected = None if args.session is None else _session_file(args.session)
    async with cli_session(backend, options, args.session) as session:
        if src_in:
            await _out_of(session, src, dst, progress, protected)
        else:
            await _into(session, src, dst, progress)
    progress.done()
    return 0


async def _closing(chunks: AsyncIterator[bytes]) -> None:
    closer = getattr(chunks, "aclose", None)
    if closer is not None:
        await closer()


def _host_source(host: str) -> tuple[str, str | None]:
    """(the real folder, None) for a host folder, (its real parent, the name) for a file."""
    if not os.path.lexists(host):
        raise SandboxFileNotFoundError(f"no such file on the host: {host!r}")
    if os.path.isdir(host):
        return os.path.realpath(host), None
    folder, name = os.path.split(os.path.abspath(host))
    return os.path.realpath(folder), name


def _host_target(host: str, name: str, *, folder: bool) -> tuple[str, str]:
    """(the real folder to write in, the name to write) for a host DST; made if missing."""
    if folder:
        os.makedirs(host, exist_ok=True)
        return os.path.realpath(host), "."
    if os.path.isdir(host) or host.endswith("/"):
        os.makedirs(host, exist_ok=True)
        return os.path.realpath(host), name
    parent, own = os.path.split(os.path.abspath(host))
    return os.path.realpath(parent), own


async def _into(session: BaseSandboxSession, host: str, inside: str, progress: Progress) -> None:
    """Host -> sandbox."""
    root, name = await asyncio.to_thread(_host_source, host)
    if name is None:
        tar = walk_tar(_HostSource(root), ".")
        try:
            await session.hydrate_workspace(progress.count(tar), inside)
        finally:
            await tar.aclose()
        return
    target = inside
    if inside.endswith("/"):
        target = posixpath.join(inside, name)
    else:
        with contextlib.suppress(SandboxFileNotFoundError):
            if (await session.stat(inside)).kind == "dir":
                target = posixpath.join(inside, name)
    chunks = local_files.read_chunks(root, name, CHUNK)
    try:
        await session.write_file_chunks(target, progress.count(chunks))
    finally:
        await _closing(chunks)


def _own_name(inside: str, answered: str) -> str:
    """The name a file copied out lands under in a host folder: the last part of the
    path the caller wrote, else the sandbox's answer if it is one plain name (the
    sandbox's `stat` answer is not trusted to pick a host path)."""
    name = posixpath.basename(posixpath.normpath(inside))
    if name in ("", ".", "..", "/"):
        name = answered
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InvalidArgumentError(
            f"cannot name the copy of {inside!r} on the host: give the destination's file name"
        )
    return name


def _session_file(path: str) -> str:
    """The `--session` ref file's real path (its folder's symlinks resolved)."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(folder), name)


async def _out_of(
    session: BaseSandboxSession,
    inside: str,
    host: str,
    progress: Progress,
    protected: str | None = None,
) -> None:
    """Sandbox -> host (never over `protected`, the session's ref file)."""
    info = await session.stat(inside)
    own = _own_name(inside, info.name)
    folder, name = await asyncio.to_thread(_host_target, host, own, folder=info.kind == "dir")
    if info.kind == "dir":
        tar = session.persist_workspace(inside)
        try:
            await extract(progress.count(tar), _HostSink(folder, protected))
        finally:
            await _closing(tar)
        return
    _refuse_session_file(folder, name, protected)
    chunks = session.read_file_chunks(inside)
    try:
        await local_files.write_chunks(folder, name, progress.count(chunks))
    finally:
        await _closing(chunks)
