"""Files in an E2B sandbox: envd's `files.get_info/read/write`, regular files only.

envd's download of a FIFO would wait forever, so every read and write asks
`files.get_info` first (`sandbox.files.remote.regular_file`). Relative paths are in the
sandbox user's home; E2B creates the parent directories of a write.
"""

from __future__ import annotations

from e2b import FileNotFoundException, FileType

from ...backend import FileAccess, explain_write_failure, read_at_most, regular_file
from ...backend import RemoteEntry as Entry
from ...backend import RemoteKind as Kind
from ...errors import FileTooLargeError, ProviderError, SandboxFileNotFoundError
from ..toolkit import within_workspace
from .client import E2BClient

# envd reports no type (None here) for a FIFO, socket or device: "other".
_KINDS: dict[object, Kind] = {
    FileType.FILE: "file",
    FileType.DIR: "dir",
    FileType.SYMLINK: "symlink",
}


async def stat(client: E2BClient, path: str) -> Entry | None:
    """`files.get_info` as an `Entry` (None when nothing is there)."""
    try:
        info = await client.timed(
            client.sandbox.files.get_info(path, **client.request()), f"inspect {path!r}"
        )
    except FileNotFoundException:
        return None
    except Exception as exc:
        client.errors.fail(exc, f"inspect {path!r}")
    return Entry(_KINDS.get(info.type, "other"), size=info.size, target=info.symlink_target)


async def in_workspace(client: E2BClient, path: str) -> None:
    """`path` checked against the sandbox user's home (where envd puts relative paths),
    before any call on it: `WorkspacePathError` outside. The home is what envd's stat
    of "." names (its `path` is absolute), asked once."""
    if client.home is None:
        try:
            info = await client.timed(
                client.sandbox.files.get_info(".", **client.request()), "find the home directory"
            )
        except Exception as exc:
            client.errors.fail(exc, "find the home directory")
        client.home = str(info.path)
    within_workspace(path, client.home)


async def read_file(client: E2BClient, path: str, max_bytes: int) -> bytes:
    """`files.read` as bytes, after `files.get_info` says it is a regular file within
    `max_bytes`."""
    await in_workspace(client, path)

    async def stat_path(where: str) -> Entry | None:
        return await stat(client, where)

    size = await regular_file(stat_path, path, write=False)
    if size is not None and size > max_bytes:
        raise FileTooLargeError.over(path, size, max_bytes)
    try:
        return await client.timed(_read_bounded(client, path, max_bytes), f"read {path!r}")
    except FileNotFoundException:
        raise SandboxFileNotFoundError(f"no such file in the sandbox: {path!r}") from None
    except Exception as exc:
        client.errors.fail(exc, f"read {path!r}")


async def _read_bounded(client: E2BClient, path: str, max_bytes: int) -> bytes:
    """The download as a stream, stopped as soon as it passes `max_bytes` (the file may
    have grown since its stat): the SDK's whole-body read would keep all of it."""
    stream = await client.sandbox.files.read(path, format="stream", **client.request())
    return await read_at_most(stream, path, max_bytes)


async def write_file(client: E2BClient, path: str, data: bytes) -> None:
    """`files.write`, after `files.get_info` says nothing or a regular file is there."""
    await in_workspace(client, path)

    async def stat_path(where: str) -> Entry | None:
        return await stat(client, where)

    await regular_file(stat_path, path, write=True)
    try:
        await client.timed(
            client.sandbox.files.write(path, data, **client.request()), f"write {path!r}"
        )
    except ProviderError:
        raise
    except Exception as exc:
        failure = client.errors.error(exc, f"write {path!r}")
        raise await explain_write_failure(stat_path, path, failure) from None


class E2BFiles(FileAccess):
    """e2b's files (relative paths are in the sandbox user's home): `files.get_info`
    first says it is a regular file within `max_bytes` (envd's download of a FIFO would
    wait forever), or that nothing or a regular file is where a write goes."""

    async def read(self, path: str, max_bytes: int) -> bytes:
        """See `read_file`."""
        return await read_file(self.session._client, path, max_bytes)

    async def write(self, path: str, data: bytes) -> None:
        """See `write_file` (E2B creates the parent folders)."""
        await write_file(self.session._client, path, data)
