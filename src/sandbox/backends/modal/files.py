"""Files in a Modal sandbox: `Sandbox.filesystem` (`stat`, `read_bytes`, `write_bytes`),
regular files only, stat'ed first (a download of a FIFO never ends)."""

from __future__ import annotations

import stat as stat_module
from typing import Any

from modal import exception as modal_exception
from modal.types import FileType

from ...backend import FileAccess, regular_file, under_a_file
from ...backend import RemoteEntry as Entry
from ...errors import FileTooLargeError, NotAFileError, SandboxFileNotFoundError
from ..toolkit import within_workspace
from .errors import SDK_ERRORS, CallDeadline, ModalErrors


class ModalFiles:
    """The file calls of one session (`sandbox` is the session's, looked up per call)."""

    def __init__(self, errors: ModalErrors, workdir: str) -> None:
        self._errors = errors
        self._workdir = workdir

    def path(self, path: str) -> str:
        """`path` as an absolute path inside `workdir` (relative ones are in it), checked
        before any call: `WorkspacePathError` outside it."""
        return within_workspace(path, self._workdir)

    async def stat(self, sandbox: Any, path: str) -> Entry | None:
        """`Sandbox.filesystem.stat` (the entry itself, not a symlink's target) as an
        `Entry`; a FILE whose mode carries file-type bits must be a regular one."""
        try:
            info = await self._errors.bounded(sandbox.filesystem.stat.aio(path))
        except modal_exception.SandboxFilesystemNotFoundError:
            return None
        except ValueError:
            return Entry("other")  # a type the SDK has no name for: not a regular file
        except CallDeadline:
            raise self._errors.no_answer(f"inspect {path!r}") from None
        except SDK_ERRORS as exc:
            raise self._errors.map(f"inspect {path!r}", exc) from None
        if info.type is FileType.DIRECTORY:
            return Entry("dir")
        if info.type is FileType.SYMLINK:
            return Entry("symlink", target=info.symlink_target)
        mode = int(info.mode or 0)
        regular = mode <= 0o7777 or stat_module.S_ISREG(mode)
        return Entry("file" if regular else "other", size=info.size)

    async def read(self, sandbox: Any, path: str, max_bytes: int) -> bytes:
        """`filesystem.read_bytes` after `stat` says it is a regular file within
        `max_bytes`."""
        full = self.path(path)
        size = await regular_file(lambda p: self.stat(sandbox, p), full, write=False, shown=path)
        if size is not None and size > max_bytes:
            raise FileTooLargeError.over(path, size, max_bytes)
        try:
            data: bytes = await self._errors.bounded(sandbox.filesystem.read_bytes.aio(full))
        except modal_exception.SandboxFilesystemNotFoundError:
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from None
        except modal_exception.SandboxFilesystemIsADirectoryError:
            raise NotAFileError(f"{path!r} is a directory, not a regular file") from None
        except CallDeadline:
            raise self._errors.no_answer(f"read {path!r}") from None
        except SDK_ERRORS as exc:
            raise self._errors.map(f"read {path!r}", exc) from None
        return bytes(data)

    async def write(self, sandbox: Any, path: str, data: bytes) -> None:
        """`filesystem.write_bytes`, which creates parent directories, after `stat`
        says nothing or a regular file is there."""
        full = self.path(path)
        await regular_file(lambda p: self.stat(sandbox, p), full, write=True, shown=path)
        try:
            await self._errors.bounded(sandbox.filesystem.write_bytes.aio(data, full))
        except modal_exception.SandboxFilesystemIsADirectoryError:
            raise NotAFileError(f"{path!r} is a directory, not a regular file") from None
        except modal_exception.SandboxFilesystemNotADirectoryError:
            raise under_a_file(path) from None
        except CallDeadline:
            raise self._errors.no_answer(f"write {path!r}") from None
        except SDK_ERRORS as exc:
            raise self._errors.map(f"write {path!r}", exc) from None


class ModalFileAccess(FileAccess):
    """modal's files: the session's `ModalFiles` over its sandbox (relative paths are in
    `workdir`; `filesystem.stat` first)."""

    async def read(self, path: str, max_bytes: int) -> bytes:
        """`Sandbox.filesystem.read_bytes` (see `ModalFiles.read`)."""
        files: ModalFiles = self.session._files
        return await files.read(self.session._commands.require_sandbox(), path, max_bytes)

    async def write(self, path: str, data: bytes) -> None:
        """`Sandbox.filesystem.write_bytes`, which creates parents (`ModalFiles.write`)."""
        files: ModalFiles = self.session._files
        await files.write(self.session._commands.require_sandbox(), path, data)
