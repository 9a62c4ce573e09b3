"""Files under /workspace, the only place the bridge reads and writes them.

`GET|PUT .../file/<path>` resolve ``'/' + <path>`` (routes.ts, helpers.ts
`resolveWorkspacePath`): a relative path is sent as ``workspace/<path>``. What the path
names is asked first with a `stat` exec (`files.remote.regular_file`), since the bridge
would open a FIFO and wait.
"""

from __future__ import annotations

import posixpath

from ...backend import FileAccess, explain_write_failure, regular_file
from ...backend import RemoteEntry as Entry
from ...errors import (
    FileTooLargeError,
    ProviderError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)
from .client import WorkerClient
from .scripts import stat_argv

WORKSPACE = "/workspace"


def workspace_relative(path: str) -> str:
    """`path` relative to /workspace, resolved lexically as the bridge does
    (helpers.ts `resolveWorkspacePath`); raises `WorkspacePathError` outside it."""
    absolute = path if path.startswith("/") else f"{WORKSPACE}/{path}"
    resolved = posixpath.normpath(absolute)
    if resolved.startswith("//"):
        resolved = resolved[1:]
    if resolved == WORKSPACE:
        return "."
    if resolved.startswith(WORKSPACE + "/"):
        return resolved[len(WORKSPACE) + 1 :]
    raise WorkspacePathError(
        f"path {path!r} is outside the sandbox's /workspace (the only place the "
        "Cloudflare bridge reads and writes files)"
    )


def _outside(path: str) -> WorkspacePathError:
    return WorkspacePathError(f"path {path!r} is outside the sandbox's /workspace")


class WorkerFiles:
    """Whole-file reads and writes through the Worker, regular files only."""

    def __init__(self, client: WorkerClient) -> None:
        self._client = client

    async def stat(self, relative: str) -> Entry | None:
        """What `relative` (to /workspace, the exec's cwd) names, by a `stat` exec."""
        code, out = await self._client.control(stat_argv(relative), f"look at {relative!r}")
        kind, _, size = out.decode("utf-8", "replace").strip().partition("|")
        if code != 0 or kind == "none":
            return None
        if kind == "symlink":
            return Entry("symlink")
        if kind.startswith("regular"):
            return Entry("file", int(size) if size.isdigit() else None)
        return Entry("dir" if kind == "directory" else "other")

    async def read(self, path: str, max_bytes: int) -> bytes:
        """Stat first (the bridge would open a FIFO and wait), then GET the file."""
        relative = workspace_relative(path)
        size = await regular_file(self.stat, relative, write=False, shown=path)
        if size is not None and size > max_bytes:
            raise FileTooLargeError.over(path, size, max_bytes)
        _, body = await self._client.call(
            "GET",
            self._client.file_url(relative),
            f"read {path!r}",
            special={
                404: SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}"),
                403: _outside(path),
            },
            # Never more than the limit is kept, whatever the file grew to since the stat.
            max_body=max_bytes,
            too_large=lambda size: FileTooLargeError.over(path, size, max_bytes),
        )
        return body

    async def write(self, path: str, data: bytes) -> None:
        """Stat first (refusing what is not a regular file), then PUT the bytes; a
        failed PUT under a file is explained as such."""
        relative = workspace_relative(path)
        await regular_file(self.stat, relative, write=True, shown=path)
        try:
            await self._client.call(
                "PUT",
                self._client.file_url(relative),
                f"write {path!r}",
                data=data,
                special={403: _outside(path)},
            )
        except ProviderError as exc:
            raise await explain_write_failure(self.stat, relative, exc) from None


class CloudflareFiles(FileAccess):
    """cloudflare's files: the session's `WorkerFiles` (under /workspace, stat'ed by an
    exec first)."""

    async def read(self, path: str, max_bytes: int) -> bytes:
        """See `WorkerFiles.read`."""
        files: WorkerFiles = self.session._files
        return await files.read(path, max_bytes)

    async def write(self, path: str, data: bytes) -> None:
        """See `WorkerFiles.write`."""
        files: WorkerFiles = self.session._files
        await files.write(path, data)
