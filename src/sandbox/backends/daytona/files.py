"""Files through the SDK's `fs` API: regular files only, asked of `get_file_info` first
(the daemon's download of a FIFO waits forever; of a directory it says "not found").
Relative paths are in the sandbox's working directory.
"""

from __future__ import annotations

import posixpath
import shlex

import aiohttp
from daytona import DaytonaError

from ...backend import FileAccess, explain_write_failure, read_at_most, regular_file
from ...backend import RemoteEntry as Entry
from ...errors import FileTooLargeError, ProviderError, SandboxFileNotFoundError
from ..toolkit import transport_error, within_workspace
from .client import DaytonaClient
from .errors import SERVICE, is_not_found, status_of, typed_cause


async def stat(client: DaytonaClient, path: str) -> Entry | None:
    """`fs.get_file_info` (Go's os.Stat: symlinks followed) as an `Entry`."""
    try:
        info = await client.timed(f"inspect {path!r}", client.fs.get_file_info(path))
    except DaytonaError as exc:
        if is_not_found(exc):
            return None
        raise client.error(exc, f"inspect {path!r}") from None
    if info.is_dir:
        return Entry("dir")
    # Go's FileMode.String(): "-rw-r--r--" for a regular file, "prw-..." for a FIFO,
    # "Srw-..." for a socket, "Dcrw-..." for a device.
    mode = str(info.mode or "-")
    return Entry("file" if mode.startswith("-") else "other", size=info.size)


async def read(client: DaytonaClient, path: str, max_bytes: int) -> bytes:
    """Download a regular file within `max_bytes`."""

    async def look(p: str) -> Entry | None:
        return await stat(client, p)

    size = await regular_file(look, path, write=False)
    if size is not None and size > max_bytes:
        raise FileTooLargeError.over(path, size, max_bytes)
    if size == 0:
        return b""  # the stream would say "No file data received" for an empty file
    try:
        return await client.timed(f"read {path!r}", _download(client, path, max_bytes))
    except aiohttp.ClientError as exc:
        # The stream's own request errors come from its iterator, past the SDK's
        # error mapping (`intercept_errors` wraps only the call that returns it).
        raise transport_error(exc, f"read {path!r}", service=SERVICE) from None
    except DaytonaError as exc:
        if is_not_found(exc):
            raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from None
        error = client.error(exc, f"read {path!r}")
        if type(typed_cause(exc)) is DaytonaError and status_of(exc) is None:
            # No error details (a daemon that sends only text, or "No data received
            # for this file"): the SDK raises a plain `DaytonaError`
            # (`common.filesystem.create_file_download_error`). What is there now
            # decides: gone is not-found, a directory or FIFO is not-a-file.
            await regular_file(look, path, write=False)
        raise error from None


async def _download(client: DaytonaClient, path: str, max_bytes: int) -> bytes:
    """`fs.download_file_stream`, stopped as soon as it passes `max_bytes` (the file may
    have grown since its stat): `download_file` would buffer all of it in the SDK."""
    stream = await client.fs.download_file_stream(path)
    return await read_at_most(stream, path, max_bytes)


async def write(client: DaytonaClient, path: str, data: bytes) -> None:
    """Upload a regular file, creating its folder first (the SDK does not promise that
    an upload creates missing folders)."""

    async def look(p: str) -> Entry | None:
        return await stat(client, p)

    await regular_file(look, path, write=True)
    parent = posixpath.dirname(path)
    if parent and parent != "/":
        script = f"mkdir -p -- {shlex.quote(posixpath.join(client.workdir, parent))}"
        response = await client.call(f"create the folder of {path!r}", client.process.exec(script))
        if response.exit_code != 0:
            detail = client.options.api_key.redact(response.result or "")[:300]
            failure = ProviderError(f"could not create the folder of {path!r}: {detail}")
            raise await explain_write_failure(look, path, failure)
    try:
        await client.call(f"write {path!r}", client.fs.upload_file(data, path))
    except ProviderError as failure:
        raise await explain_write_failure(look, path, failure) from None


class DaytonaFiles(FileAccess):
    """daytona's files: the path checked against the working directory before any call
    (the daemon would read or write anywhere the sandbox user may), then `read` /
    `write` above."""

    async def read(self, path: str, max_bytes: int) -> bytes:
        """Download a regular file (see `read`)."""
        client: DaytonaClient = self.session._client
        within_workspace(path, client.workdir)
        return await read(client, path, max_bytes)

    async def write(self, path: str, data: bytes) -> None:
        """Upload a regular file, its folder created (see `write`)."""
        client: DaytonaClient = self.session._client
        within_workspace(path, client.workdir)
        await write(client, path, data)
