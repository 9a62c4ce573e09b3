"""`WorkspaceCalls`: the session's workspace calls, from the caller's arguments to a capability.

File operations, archives, ports and snapshots (`sandbox.workspace`; the rules are in
docs/workspaces.md). Each call is admitted first (`Admission.admit`), checks its
arguments (paths as the file calls do, flags, limits, ports), then calls the backend's
capability once (`WorkspaceAccess`, `Ports`, `Snapshots`); `list_dir` sorts what the
backend listed, so every backend answers in the same order.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable

from ..files import arguments as files
from ..workspace import calls as ws_calls
from ..workspace import ports as ws_ports
from ..workspace.info import FileInfo
from ..workspace.ports import ExposedPort
from ..workspace.snapshots import SnapshotRef
from .admission import Admission
from .capabilities import Capabilities
from .file_calls import admitted

Archive = AsyncIterable[bytes | bytearray | memoryview] | Iterable[bytes | bytearray | memoryview]


class WorkspaceCalls:
    """The workspace calls of a session over its `capabilities`, each admitted by
    `admission` (the session's lifecycle) first; `read_limit` bounds a file a persist
    fetches whole (the session's option)."""

    def __init__(
        self,
        capabilities: Capabilities,
        *,
        read_limit: int,
        admission: Admission,
    ) -> None:
        self._workspace = capabilities.workspace
        self._files = capabilities.files
        self._ports = capabilities.ports
        self._snapshots = capabilities.snapshots
        self._read_limit = read_limit
        self._admission = admission

    async def stat(self, path: str) -> FileInfo:
        """`BaseSandboxSession.stat`."""
        await self._admission.admit()
        return await self._workspace.stat(files.check_path(path))

    async def list_dir(self, path: str) -> list[FileInfo]:
        """`BaseSandboxSession.list_dir`: the backend's entries, sorted by name."""
        await self._admission.admit()
        entries = await self._workspace.list_dir(files.check_path(path))
        return sorted(entries, key=lambda info: info.name)

    async def remove(self, path: str, recursive: bool) -> None:
        """`BaseSandboxSession.remove`."""
        await self._admission.admit()
        checked = files.check_path(path)
        await self._workspace.remove(checked, ws_calls.check_flag(recursive, "recursive"))

    async def make_dir(self, path: str, parents: bool) -> None:
        """`BaseSandboxSession.make_dir`."""
        await self._admission.admit()
        checked = files.check_path(path)
        await self._workspace.make_dir(checked, ws_calls.check_flag(parents, "parents"))

    def persist_workspace(self, path: str) -> AsyncIterator[bytes]:
        """`BaseSandboxSession.persist_workspace` (a plain call: it returns the stream)."""
        self._admission.admit_now()
        stream = self._workspace.persist(files.check_path(path), self._files, self._read_limit)
        return admitted(self._admission, stream)

    async def hydrate_workspace(
        self, chunks: Archive, path: str, max_members: int, max_bytes: int
    ) -> int:
        """`BaseSandboxSession.hydrate_workspace`: the member count."""
        await self._admission.admit()
        root = files.check_path(path)
        members = ws_calls.check_limit(max_members, "max_members")
        size = ws_calls.check_limit(max_bytes, "max_bytes")
        return await self._workspace.hydrate(
            ws_calls.archive_chunks(chunks), root, self._files, members, size
        )

    async def expose_port(self, port: int) -> ExposedPort:
        """`BaseSandboxSession.expose_port`."""
        await self._admission.admit()
        return await self._ports.expose(ws_ports.check_port(port))

    async def snapshot(self) -> SnapshotRef:
        """`BaseSandboxSession.snapshot`."""
        await self._admission.admit()
        return await self._snapshots.take()
