"""The SDK's file operations (`ls`, `mkdir`, `rm`, `mv`, `same_file`, ...) on our file calls.

The SDK's base session checks a path only lexically (`normalize_path`) and then runs
`rm`, `mkdir`, `ls` or `mv` in the sandbox, which follow a symlink anywhere it points:
a link in the workspace to a host folder made `rm link/victim.txt` delete a host file on
unix_local. Our session's file calls (`stat`, `list_dir`, `make_dir`, `remove`,
`read_file_chunks`, `write_file_chunks`, `hydrate_workspace`) resolve every path inside
the workspace on the backend's side and refuse one a symlink or `..` leads out of
(`WorkspacePathError`), so the adapter routes every SDK file operation through them.
Here: the error mapping onto the SDK's own types, the confined symlink resolution
`same_file` needs, and the one-entry archive that moves a symlink.
"""

from __future__ import annotations

import io
import posixpath
import stat as stat_module
import tarfile
from pathlib import Path
from typing import Any, Literal

from agents.sandbox.errors import (
    ExecNonZeroError,
    InvalidManifestPathError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.files import EntryKind, FileEntry
from agents.sandbox.types import ExecResult, Permissions

import sandbox
from sandbox.errors import (
    InvalidArgumentError,
    SandboxError,
    SandboxFileNotFoundError,
    WorkspacePathError,
)

Operation = Literal["ls", "mkdir", "rm", "mv", "same_file", "read", "write"]

#: Our errors that describe the file operation's outcome (the path is outside, missing,
#: of the wrong kind): they become the SDK's types. Any other error (the session closed,
#: the connection lost, a file above the read limit) is ours and propagates as it is.
FILE_ERRORS = (WorkspacePathError, SandboxFileNotFoundError, InvalidArgumentError)

#: Symlinks followed while resolving one path for `same_file` (the kernel's own limit).
MAX_LINK_HOPS = 40

_KINDS: dict[str, EntryKind] = {
    "file": EntryKind.FILE,
    "dir": EntryKind.DIRECTORY,
    "symlink": EntryKind.SYMLINK,
    "other": EntryKind.OTHER,
}


def sdk_error(operation: Operation, path: Path | str, error: SandboxError) -> Exception:
    """The SDK's exception for our `error` in `operation` on `path`.

    A path leading out of the workspace is the SDK's `InvalidManifestPathError` (what its
    remote backends raise when their in-sandbox check finds an escape), except on
    `read`/`write`, whose callers catch the archive errors below; a missing file
    on `read` is `WorkspaceReadNotFoundError`; `mkdir`/`write` failures are
    `WorkspaceArchiveWriteError`, other `read` failures `WorkspaceArchiveReadError`; and
    `ls`, `rm`, `mv`, `same_file` fail with `ExecNonZeroError`, as the SDK's own
    implementations of them do. Our error is the cause."""
    shown = str(path)
    if isinstance(error, WorkspacePathError) and operation == "read":
        # What the SDK's own sessions raise for a read through a link leading out (and
        # what its callers, `read_bounded` and the sinks, catch).
        return WorkspaceArchiveReadError(
            path=Path(shown), context={"reason": str(error)}, cause=error
        )
    if isinstance(error, WorkspacePathError) and operation == "write":
        return WorkspaceArchiveWriteError(
            path=Path(shown), context={"reason": str(error)}, cause=error
        )
    if isinstance(error, WorkspacePathError):
        return InvalidManifestPathError(
            rel=shown, reason="escape_root", context={"operation": operation}, cause=error
        )
    if operation == "read":
        if isinstance(error, SandboxFileNotFoundError):
            return WorkspaceReadNotFoundError(path=Path(shown), cause=error)
        return WorkspaceArchiveReadError(
            path=Path(shown), context={"reason": str(error)}, cause=error
        )
    if operation in ("mkdir", "write"):
        return WorkspaceArchiveWriteError(
            path=Path(shown), context={"reason": str(error)}, cause=error
        )
    return ExecNonZeroError(
        ExecResult(stdout=b"", stderr=str(error).encode("utf-8", "replace"), exit_code=1),
        command=(operation, shown),
        cause=error,
    )


def move_error(message: str, source: Path | str, destination: Path | str) -> ExecNonZeroError:
    """The SDK's `mv` failure (`ExecNonZeroError`) for a move refused before any change."""
    return ExecNonZeroError(
        ExecResult(stdout=b"", stderr=message.encode(), exit_code=1),
        command=("mv", str(source), str(destination)),
    )


def file_entry(info: sandbox.FileInfo, shown: str) -> FileEntry:
    """The SDK's `FileEntry` for one of our `list_dir` entries, `shown` its SDK path.
    Our `FileInfo` carries no owner or group: both are empty."""
    kind = _KINDS.get(info.kind, EntryKind.OTHER)
    permissions = Permissions.from_mode(info.mode).model_copy(
        update={"directory": kind is EntryKind.DIRECTORY}
    )
    return FileEntry(
        path=shown, permissions=permissions, owner="", group="", size=info.size, kind=kind
    )


async def resolve_inside(ours: sandbox.BaseSandboxSession[Any], path: str, root: str) -> str:
    """`path` (relative to the workspace `root`, as the sandbox spells it) with its
    symlinks followed, each step checked by our `stat` (which refuses a path a link on
    the way leads out of); a link whose target leads out of the workspace raises
    `WorkspacePathError`. The result names an entry that is not a symlink (or does not
    exist), relative to the workspace."""
    current = posixpath.normpath(path)
    for _ in range(MAX_LINK_HOPS):
        try:
            info = await ours.stat(current)
        except SandboxFileNotFoundError:
            return current
        if info.kind != "symlink":
            return current
        target = info.link_target
        if target is None:
            raise InvalidArgumentError(f"cannot tell where the symlink {current!r} points")
        if posixpath.isabs(target):
            # Inside only below the workspace as the sandbox spells it (`pwd` there).
            relative = posixpath.relpath(posixpath.normpath(target), root)
            joined = posixpath.normpath(relative)
        else:
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
        if joined == ".." or joined.startswith("../"):
            raise WorkspacePathError(
                f"path {path!r} is outside the workspace (the symlink {current!r} leads out)"
            )
        current = joined
    raise InvalidArgumentError(f"too many symlinks while resolving {path!r}")


def symlink_archive(name: str, target: str) -> bytes:
    """A tar holding one symlink `name` -> `target`: `mv` of a symlink lands it through our
    `hydrate_workspace`, whose extractor refuses a target that leads out."""
    member = tarfile.TarInfo(name)
    member.type = tarfile.SYMTYPE
    member.linkname = target
    member.mode = stat_module.S_IMODE(0o777)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(member)
    return buffer.getvalue()
