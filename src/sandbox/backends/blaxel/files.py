"""Files through the sandbox API (`fs.ls`, `fs.read_binary`, `fs.write_binary`,
`fs.mkdir`), regular files only.

The API's GET of a FIFO would open it and wait forever, so what a path names is asked
of its parent's listing first (each entry's Go FileMode in octal, type bits included).
The API answers a GET of a directory with its JSON listing as if it were the file's
bytes: such an answer is checked, and refused. The SDK pastes paths into URLs
unescaped, so every path is percent-encoded first.

The server confines nothing: it cleans a path lexically (`filepath.Clean`, so `..`
climbs), takes an absolute one as it is and a relative one from its own working
directory (`handler/filesystem/filesystem.go` `GetAbsolutePath`). So the workspace
(`workdir`) is enforced here, lexically and before any call: a path that resolves
outside it is a `WorkspacePathError`. Symlinks are the server's to follow (its listing
gives no target), which puts only the sandbox itself at stake.
"""

from __future__ import annotations

import json
import posixpath
from urllib.parse import quote

from ...backend import (
    FileAccess,
    explain_write_failure,
    go_file_mode_kind,
    regular_file,
    under_a_file,
)
from ...backend import RemoteEntry as Entry
from ...errors import (
    FileTooLargeError,
    NotAFileError,
    SandboxError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)
from .client import BlaxelClient
from .errors import AnswerTooLargeError, BlaxelAPIError

# A listing larger than this is not worth parsing to tell it from a file.
_MAX_LISTING_BYTES = 64 * 1024 * 1024


def url_path(path: str) -> str:
    """`path` as the SDK must get it: a `#`, `?` or `%` in a file name would otherwise
    cut or corrupt the request."""
    return quote(path, safe="/")


def looks_like_a_listing(data: bytes) -> bool:
    """Whether `data` has the shape of the sandbox API's JSON listing of a directory
    (its answer to a GET of one); `is_directory` confirms."""
    if not data.startswith(b"{") or len(data) > _MAX_LISTING_BYTES:
        return False
    try:
        value = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(value, dict)
        and isinstance(value.get("files"), list)
        and isinstance(value.get("subdirectories"), list)
        and "path" in value
    )


class BlaxelFiles:
    """The file calls of one session; relative paths are in `workdir`."""

    def __init__(self, client: BlaxelClient, workdir: str) -> None:
        self._client = client
        self.workdir = workdir

    def absolute(self, path: str) -> str:
        """A sandbox path: relative ones are in `workdir`."""
        resolved = posixpath.normpath(posixpath.join(self.workdir, path))
        # POSIX keeps a leading "//"; the server's Clean does not.
        return "/" + resolved.lstrip("/")

    def workspace_path(self, path: str) -> str:
        """`path` resolved as the server resolves it (lexically, `..` included), which
        must be `workdir` or beneath it: else `WorkspacePathError`, before any call."""
        target = self.absolute(path)
        root = self.workdir.rstrip("/")
        if target != self.workdir and not target.startswith(root + "/"):
            raise WorkspacePathError(
                f"path {path!r} is outside the workspace; use a path inside {self.workdir}"
            )
        return target

    async def mkdir(self, path: str) -> None:
        """Create the directory `path` (and its parents)."""
        instance = self._client.sandbox()
        await self._client.call(
            f"create the directory {path!r}", lambda: instance.fs.mkdir(url_path(path))
        )

    async def stat(self, path: str) -> Entry | None:
        """What the parent's listing says `path` is (None: nothing is there)."""
        if path == "/":
            return Entry("dir")
        parent, name = posixpath.split(path)
        instance = self._client.sandbox()
        try:
            listing = await self._client.call(
                f"list {parent!r}", lambda: instance.fs.ls(url_path(parent))
            )
        except BlaxelAPIError as exc:
            if exc.status == 404:
                return None
            raise
        if any(sub.name == name for sub in listing.subdirectories or []):
            return Entry("dir")
        for entry in listing.files or []:
            if entry.name == name:
                try:
                    mode = int(str(entry.permissions), 8)
                except ValueError:
                    mode = 0
                return Entry(go_file_mode_kind(mode), size=entry.size)
        return None

    async def read(self, path: str, max_bytes: int) -> bytes:
        """`fs.read_binary`, after the listing says `path` is a regular file within
        `max_bytes`; the answer itself is bounded by `max_bytes` too."""
        target = self.workspace_path(path)
        instance = self._client.sandbox()
        size = await regular_file(self.stat, target, write=False, shown=path)
        if size is not None and size > max_bytes:
            raise FileTooLargeError.over(path, size, max_bytes)
        try:
            data: bytes = await self._client.call(
                f"read {target!r}",
                lambda: instance.fs.read_binary(url_path(target)),
                max_bytes=max_bytes,
            )
        except AnswerTooLargeError:
            # It grew past the limit since the listing (or is a directory's big listing).
            if await self.is_directory(target):
                raise NotAFileError(f"{path!r} is a directory, not a regular file") from None
            raise FileTooLargeError.over(path, None, max_bytes) from None
        except BlaxelAPIError as exc:
            if exc.status == 404:
                raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from None
            raise
        if looks_like_a_listing(data) and await self.is_directory(target):
            raise NotAFileError(f"{path!r} is a directory, not a regular file")
        return data

    async def is_directory(self, target: str) -> bool:
        """Whether `target` lists as a directory now (a file that merely holds JSON
        shaped like a listing does not: the API answers it as a file)."""
        instance = self._client.sandbox()
        try:
            await self._client.call(f"list {target!r}", lambda: instance.fs.ls(url_path(target)))
        except SandboxError:
            return False
        return True

    async def write(self, path: str, data: bytes) -> None:
        """`fs.write_binary` (its parent made first), after the listing says nothing or
        a regular file is there (the API's upload over a FIFO would wait forever, over a
        directory it fails with a 422)."""
        target = self.workspace_path(path)
        instance = self._client.sandbox()
        await regular_file(self.stat, target, write=True, shown=path)
        parent = posixpath.dirname(target)
        try:
            if parent not in ("/", self.workdir):
                await self.mkdir(parent)
            await self._client.call(
                f"write {target!r}", lambda: instance.fs.write_binary(url_path(target), data)
            )
        except BlaxelAPIError as failure:
            error = await explain_write_failure(self.stat, target, failure)
            if isinstance(error, NotAFileError):
                raise under_a_file(path) from None
            raise


class BlaxelFileAccess(FileAccess):
    """blaxel's files: the session's `BlaxelFiles` (a regular file, through the parent's
    listing first)."""

    async def read(self, path: str, max_bytes: int) -> bytes:
        """See `BlaxelFiles.read`."""
        files: BlaxelFiles = self.session._files
        return await files.read(path, max_bytes)

    async def write(self, path: str, data: bytes) -> None:
        """See `BlaxelFiles.write` (parents made)."""
        files: BlaxelFiles = self.session._files
        await files.write(path, data)
