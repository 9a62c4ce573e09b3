"""Capabilities: what a backend can do besides running processes, as objects it provides.

A backend session class names one capability type per attribute (`None` where the
provider has none): `_file_access` (`FileAccess`), `_workspace_access`
(`WorkspaceAccess`), `_ports` (`Ports`), `_snapshots` (`Snapshots`), `_durability`
(`Durability`). The base session builds each once, with the session as the only
argument (`Capabilities.of`), and calls the objects; a missing one is replaced by a
refusing object that raises the same `UnsupportedOperationError` every backend without
it raised before. A new capability is one protocol here plus one object per backend
that has it, never a hook in every backend.

What several backends share is written once: `FileAccess` streams through whole-file
calls, `WorkspaceAccess` persists by walking and hydrates through the safe extractor,
`Durability` keeps no lease and terminates what it cannot release. A capability object
holds its session (for the backend's own state: clients, ids, folders) but reads
nothing of the base session's machinery.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..durable.lease import LeaseStore
from ..durable.refs import ProcessNotReattached, ProcessRef, SessionRef
from ..errors import FileTooLargeError, UnsupportedOperationError
from ..process_entry import OutputSink
from ..workspace import calls as ws_calls
from ..workspace import extract as ws_extract
from ..workspace import persist as ws_persist
from ..workspace.info import FileInfo
from ..workspace.ports import ExposedPort
from ..workspace.snapshots import SnapshotRef

__all__ = [
    "Capabilities",
    "Capability",
    "Durability",
    "FileAccess",
    "Ports",
    "Snapshots",
    "WorkspaceAccess",
]


class Capability:
    """What every capability object is made with: the backend session it serves (its
    own state: clients, ids, folders), stored as `session`."""

    def __init__(self, session: Any) -> None:
        self.session = session


# ---- files --------------------------------------------------------------------------


class FileAccess(Capability, ABC):
    """Regular files in the sandbox. Paths are checked (a non-empty str without NUL;
    relative ones are in the workspace); each method confines them to the workspace."""

    @abstractmethod
    async def read(self, path: str, max_bytes: int) -> bytes:
        """A whole regular file. `NotAFileError` for anything but a regular file (a
        directory, FIFO, socket, device) without opening what could block,
        `SandboxFileNotFoundError` when missing, `FileTooLargeError` above `max_bytes`
        where the size is known before reading (the session checks the length too)."""

    @abstractmethod
    async def write(self, path: str, data: bytes) -> None:
        """A regular file, parent folders created. `NotAFileError` (and nothing changed)
        over a directory, FIFO, socket or device, or when a parent is a file."""

    def read_chunks(self, path: str, chunk_size: int, max_bytes: int) -> AsyncIterator[bytes]:
        """Stream a regular file in chunks of about `chunk_size` bytes (the session
        re-cuts longer ones); same errors as `read`. `max_bytes` (the session's
        `read_limit_bytes`) bounds a file fetched whole first. Default: `read`, sliced."""
        return _sliced(self, path, chunk_size, max_bytes)

    async def write_chunks(self, path: str, chunks: AsyncIterator[bytes]) -> None:
        """Write a regular file from `chunks` (bytes, never empty); same rules as
        `write`. Default: the chunks joined, then `write`."""
        await self.write(path, b"".join([chunk async for chunk in chunks]))


async def _sliced(
    files: FileAccess, path: str, chunk_size: int, max_bytes: int
) -> AsyncIterator[bytes]:
    data = await files.read(path, max_bytes)
    if len(data) > max_bytes:
        raise FileTooLargeError.over(path, len(data), max_bytes)
    view = memoryview(data)
    for start in range(0, len(view), chunk_size):
        yield bytes(view[start : start + chunk_size])


# ---- workspace ----------------------------------------------------------------------


class WorkspaceAccess(Capability, ABC):
    """The workspace's file operations and archives (docs/workspaces.md). Paths are
    checked as for `FileAccess` and confined the same way."""

    @abstractmethod
    async def stat(self, path: str) -> FileInfo:
        """The `FileInfo` of `path`, never following a final symlink (its `link_target`
        set); `SandboxFileNotFoundError` when missing, `WorkspacePathError` outside."""

    @abstractmethod
    async def list_dir(self, path: str) -> list[FileInfo]:
        """The entries of the folder `path` (symlinks on the way followed inside the
        workspace, the entries not followed), each `path` spelled `path`/name. Not a
        folder: `InvalidArgumentError`."""

    @abstractmethod
    async def remove(self, path: str, recursive: bool) -> None:
        """Remove the name `path` (never what a symlink points at); a non-empty folder
        without `recursive` is an `InvalidArgumentError` and nothing is removed; the
        workspace itself is refused."""

    @abstractmethod
    async def make_dir(self, path: str, parents: bool) -> None:
        """Make the folder `path` (`parents`: its missing parents too, an existing
        folder is fine); a file in the way is `NotAFileError`."""

    @abstractmethod
    async def make_symlink(self, path: str, target: str) -> None:
        """Make (or replace a file or symlink at) `path` as a symlink to `target`, which
        the extractor checked stays inside; a folder there is `NotAFileError`."""

    async def set_mode(self, path: str, mode: int) -> None:
        """Set the permission bits of `path` (after an extraction wrote it). Default:
        nothing (the provider's default modes stay)."""

    def persist(self, path: str, files: FileAccess, read_limit: int) -> AsyncIterator[bytes]:
        """The pax tar of `path`. Default: a walk through `stat`, `list_dir` and
        `files.read_chunks` (bounded by `read_limit` where a file is fetched whole)."""
        return ws_persist.walk_tar(ws_calls.TreeSource(self, files, read_limit), path)

    async def hydrate(
        self,
        chunks: AsyncIterator[bytes],
        path: str,
        files: FileAccess,
        max_members: int,
        max_bytes: int,
    ) -> int:
        """Extract `chunks` below `path` under the extractor's rules; the member count.
        Default: `sandbox.workspace.extract` through `make_dir`, `files.write_chunks`,
        `make_symlink` and `set_mode`."""
        await self.make_dir(path, True)
        sink = ws_calls.TreeSink(self, files, path)
        return await ws_extract.extract(chunks, sink, max_members=max_members, max_bytes=max_bytes)


class Ports(Capability, ABC):
    """How a client outside the sandbox reaches a server inside."""

    @abstractmethod
    async def expose(self, port: int) -> ExposedPort:
        """The `ExposedPort` for `port` (1..65535), or `UnsupportedOperationError`
        saying why this one cannot be."""


class Snapshots(Capability, ABC):
    """The provider's own snapshots of a sandbox."""

    @abstractmethod
    async def take(self) -> SnapshotRef:
        """A `SnapshotRef` from the provider's snapshot."""

    @classmethod
    @abstractmethod
    def open_options(cls, snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
        """The constructor options that open a session from `snapshot` (already checked
        to be this backend's), given the caller's other `options`."""


# ---- durable sessions (docs/durable-sessions.md) ------------------------------------


class Durability(Capability, ABC):
    """Refs, the lease, resume and detach. Made with the session (`self.session`);
    `options_from_ref` is read of the class, before any session exists (a resume makes
    its session from it)."""

    @property
    def keeps_processes(self) -> bool:
        """Whether the provider keeps a process running, reattachable, with no client
        (`BaseSandboxSession.keeps_processes`). A backend whose every session does sets a
        class attribute; one where it depends on the session's options (the runner)
        answers per session."""
        return False

    @abstractmethod
    def ref_sandbox(self) -> dict[str, Any]:
        """Where the sandbox is, for a ref (a container id, a workspace path...): JSON
        data, never a secret."""

    def ref_options(self, base: dict[str, Any]) -> dict[str, Any]:
        """The options a resumed session is made with: `base` (the base session's
        bounds) plus an allow-list of this backend's options that are not secrets
        (never credentials, never `env` values). Default: `base`."""
        return base

    def ref_process(self, entry: OutputSink[Any]) -> dict[str, Any]:
        """The provider's handle of a running process, for a ref (JSON, no secret)."""
        return {}

    @classmethod
    def options_from_ref(cls, ref: SessionRef) -> dict[str, Any]:
        """The constructor options of a session resuming `ref` (before the caller's)."""
        return dict(ref.options)

    def lease_store(self) -> LeaseStore | None:
        """Where this session's lease lives (`sandbox.durable.lease`); None: nowhere."""
        return None

    @abstractmethod
    async def resume(self, ref: SessionRef) -> None:
        """Attach to `ref`'s sandbox instead of `_start_backend`, so that
        `_stop_backend` deletes it as the first client's close would. Raise
        `SessionGoneError` when it no longer exists. Where the ref lists processes that
        could not outlive their client (it crashed), end what is left of them here. If
        this raises or is cancelled, `detach()` is called (settled): the sandbox stays."""

    async def reattach(self, entry: OutputSink[Any], process: ProcessRef) -> None:
        """Follow the running process `process` again as `entry`, like
        `_spawn_process`: what it printed after `process.output_position` (bounded, the
        omission marker where the provider kept less), then its output and exit. Raise
        `ProcessNotReattached(note, exit_code)` when the provider lost it. Default:
        never (the provider keeps no process without its client)."""
        raise ProcessNotReattached(
            f"the {self.session.backend_name} backend cannot reattach a process"
        )

    async def release(self, entry: OutputSink[Any]) -> None:
        """Stop following a process without ending it (detach, takeover): stop its
        readers, close its sockets. Called instead of `_terminate_pty_entry`, once, by
        the settled teardown. Default: terminate it (nothing outlives its client)."""
        await self.session._terminate_pty_entry(entry)

    async def detach(self) -> None:
        """Release the provider's clients and connections, leaving the sandbox running
        (detach, a takeover, an undone resume). Default: nothing."""


class _NoDurability(Durability):
    """What a backend without durable sessions answers."""

    def ref_sandbox(self) -> dict[str, Any]:
        raise UnsupportedOperationError(
            f"the {self.session.backend_name} backend cannot detach or resume sessions"
        )

    async def resume(self, ref: SessionRef) -> None:
        raise UnsupportedOperationError(
            f"the {self.session.backend_name} backend cannot resume sessions"
        )


# ---- what a backend without a capability answers -------------------------------------


class _NoFiles(FileAccess):
    async def read(self, path: str, max_bytes: int) -> bytes:
        raise UnsupportedOperationError(
            f"the {self.session.backend_name} backend cannot read files"
        )

    async def write(self, path: str, data: bytes) -> None:
        raise UnsupportedOperationError(
            f"the {self.session.backend_name} backend cannot write files"
        )


class _NoWorkspace(WorkspaceAccess):
    def _refuse(self, what: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(f"the {self.session.backend_name} backend cannot {what}")

    async def stat(self, path: str) -> FileInfo:
        raise self._refuse("stat files")

    async def list_dir(self, path: str) -> list[FileInfo]:
        raise self._refuse("list folders")

    async def remove(self, path: str, recursive: bool) -> None:
        raise self._refuse("remove files")

    async def make_dir(self, path: str, parents: bool) -> None:
        raise self._refuse("make folders")

    async def make_symlink(self, path: str, target: str) -> None:
        raise self._refuse("make symlinks")


class _NoPorts(Ports):
    async def expose(self, port: int) -> ExposedPort:
        raise UnsupportedOperationError(
            f"the {self.session.backend_name} backend cannot expose ports"
        )


class _NoSnapshots(Snapshots):
    async def take(self) -> SnapshotRef:
        raise UnsupportedOperationError(
            f"the {self.session.backend_name} backend has no snapshots; persist_workspace() "
            "and hydrate_workspace() carry a workspace anywhere"
        )

    @classmethod
    def open_options(cls, snapshot: SnapshotRef, options: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("never called: `snapshot_options_of` refuses first")


def snapshot_options_of(
    backend: str, snapshots: type[Snapshots] | None, snapshot: SnapshotRef, options: dict[str, Any]
) -> dict[str, Any]:
    """The options that open `snapshot` on a backend whose snapshots are `snapshots`."""
    if snapshots is None:
        raise UnsupportedOperationError(
            f"the {backend} backend cannot open snapshots; hydrate_workspace() "
            "restores a persisted workspace anywhere"
        )
    return snapshots.open_options(snapshot, options)


@dataclass(frozen=True)
class Capabilities:
    """A session's capability objects, each the backend's or the refusing one."""

    files: FileAccess
    workspace: WorkspaceAccess
    ports: Ports
    snapshots: Snapshots
    durability: Durability

    @classmethod
    def of(cls, session: Any) -> Capabilities:
        """Each capability the session's class names built with `session`, or the
        refusing one where it names None."""
        kind = type(session)
        return cls(
            files=(kind._file_access or _NoFiles)(session),
            workspace=(kind._workspace_access or _NoWorkspace)(session),
            ports=(kind._ports or _NoPorts)(session),
            snapshots=(kind._snapshots or _NoSnapshots)(session),
            durability=(kind._durability or _NoDurability)(session),
        )
