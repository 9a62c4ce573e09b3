"""Files through exec: a shell and `cat` in the image, nothing else on the happy path.

A path is checked lexically against the workspace first (`toolkit.paths`), then handed
on relative to the exec's working directory (the workspace). A read is one exec of
`scripts.READ_SCRIPT`, which refuses a directory, FIFO, socket or device by the shell's
own tests before `cat` opens anything, and whose stdout is kept up to `max_bytes + 1`
bytes only (more is `FileTooLargeError`: the exec is cut off and its tagged `cat`
killed). A write is one exec of `scripts.WRITE_SCRIPT` with the bytes on stdin: under
v5 stdin is then closed (`cat` sees EOF); under v4, which cannot close stdin,
`head -c SIZE` stops at the announced size.
"""

from __future__ import annotations

import posixpath
from collections.abc import AsyncIterator

from ...backend import FileAccess, settle, under_a_file
from ...errors import FileTooLargeError, NotAFileError, ProviderError, SandboxFileNotFoundError
from ..toolkit import kill_script, new_tag, tag_environment, within_workspace
from . import scripts
from .client import V5_PROTOCOL, KubeClient
from .execs import Target, run_control


def relative_to(path: str, workdir: str) -> str:
    """`path` relative to `workdir` ("." for the workspace itself), or
    `WorkspacePathError` when it leaves it."""
    resolved = within_workspace(path, workdir)
    root = posixpath.normpath(workdir)
    if resolved == root:
        return "."
    return resolved[len(root) :].lstrip("/") if root != "/" else resolved.lstrip("/")


def _refusal(code: int, path: str, *, write: bool) -> Exception | None:
    if code == scripts.IS_DIRECTORY:
        return NotAFileError(f"{path!r} is a directory, not a regular file")
    if code == scripts.NOT_REGULAR:
        return NotAFileError(f"{path!r} is not a regular file")
    if code == scripts.NOT_FOUND:
        return SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}")
    if code == scripts.UNDER_A_FILE:
        return under_a_file(path)
    if code == scripts.NO_FOLDER:
        return ProviderError(f"could not write {path!r}: its folder could not be made")
    return None


class PodFiles:
    """Whole-file reads and writes in the session's container."""

    def __init__(self, client: KubeClient, target: Target, workdir: str) -> None:
        self._client = client
        self._target = target
        self._workdir = workdir

    async def read(self, path: str, max_bytes: int) -> bytes:
        """The file's bytes; refused without opening unless it is a regular file."""
        relative = relative_to(path, self._workdir)
        tag = new_tag()
        data = bytearray()
        over = False

        def take(chunk: bytes) -> bool:
            nonlocal over
            room = max_bytes + 1 - len(data)
            data.extend(chunk[: max(0, room)])
            over = len(data) > max_bytes
            return not over

        argv = scripts.prelude_argv(scripts.read_argv(relative), env=tag_environment(tag))
        try:
            code, err = await run_control(
                self._client, self._target, argv, f"read {path!r}", on_stdout=take
            )
        finally:
            if over:
                # The cut-off `cat` may still be writing into a pipe nobody reads.
                await settle(self._kill(tag))
        if over:
            raise FileTooLargeError.over(path, None, max_bytes)
        refusal = _refusal(code, path, write=False)
        if refusal is not None:
            raise refusal
        if code != 0:
            detail = err.decode("utf-8", "replace").strip()[:200]
            raise ProviderError(f"could not read {path!r}: cat exited {code}: {detail}")
        return bytes(data)

    async def write(self, path: str, data: bytes) -> None:
        """Write the file whole (parents made), refusing what is not a regular file."""
        relative = relative_to(path, self._workdir)
        if relative == ".":
            raise NotAFileError(f"{path!r} is a directory, not a regular file")
        v5 = self._client.agreed == V5_PROTOCOL
        argv = scripts.write_argv(relative, None if v5 else len(data))
        code, err = await run_control(
            self._client, self._target, scripts.prelude_argv(argv), f"write {path!r}", stdin=data
        )
        self._check_write(code, err, path)

    async def write_chunks(self, path: str, chunks: AsyncIterator[bytes]) -> None:
        """Stream the chunks to the file's stdin (v5: never all in memory). Under v4 the
        size must be known first: the chunks are joined, then written."""
        if self._client.agreed != V5_PROTOCOL:
            await self.write(path, b"".join([chunk async for chunk in chunks]))
            return
        relative = relative_to(path, self._workdir)
        if relative == ".":
            raise NotAFileError(f"{path!r} is a directory, not a regular file")
        argv = scripts.prelude_argv(scripts.write_argv(relative, None))
        code, err = await run_control(
            self._client, self._target, argv, f"write {path!r}", stdin=chunks
        )
        self._check_write(code, err, path)

    def _check_write(self, code: int, err: bytes, path: str) -> None:
        refusal = _refusal(code, path, write=True)
        if refusal is not None:
            raise refusal
        if code != 0:
            detail = err.decode("utf-8", "replace").strip()[:200]
            raise ProviderError(f"could not write {path!r}: exit {code}: {detail}")

    async def _kill(self, tag: str) -> None:
        await run_control(
            self._client, self._target, kill_script([tag], ticks=0), "stop a file read"
        )


class KubernetesFiles(FileAccess):
    """kubernetes's files, through exec (`PodFiles`): checked against the workspace,
    refused unless a regular file, at most `max_bytes + 1` bytes kept; writes carry the
    bytes on stdin (chunk by chunk under v5, joined under v4)."""

    async def read(self, path: str, max_bytes: int) -> bytes:
        """Shell tests, then `cat`."""
        files: PodFiles = self.session._files()
        return await files.read(path, max_bytes)

    async def write(self, path: str, data: bytes) -> None:
        """The bytes on the exec's stdin."""
        await self.session._files().write(path, data)

    async def write_chunks(self, path: str, chunks: AsyncIterator[bytes]) -> None:
        """The chunks on stdin as they come (v5; v4 joins them first)."""
        await self.session._files().write_chunks(path, chunks)
