"""`FileCalls` and `WorkspaceCalls` alone, over a backend of ours kept in memory.

`MemoryFiles`, `MemoryWorkspace` and `MemoryPorts` are capabilities the way a backend
writes them (a backend, not a stand-in for our code), over the files of a `Memory`;
`Checks` is the session's `Admission` (its lifecycle), here switches the test flips. What is
proven: the checks run before any hook, arguments are checked before the hook sees them,
the bound on a returned length holds for a backend that cannot tell the size first,
chunks are re-cut, and listings are sorted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sandbox.errors import (
    FileTooLargeError,
    InvalidArgumentError,
    SessionClosedError,
    SessionTakenOverError,
)
from sandbox.session.capabilities import (
    Capabilities,
    FileAccess,
    Ports,
    WorkspaceAccess,
)
from sandbox.session.file_calls import FileCalls
from sandbox.session.workspace_calls import WorkspaceCalls
from sandbox.workspace.info import FileInfo
from sandbox.workspace.ports import ExposedPort


class Memory:
    """Files in a dict, and the calls the capabilities below received."""

    backend_name = "memory"

    def __init__(self) -> None:
        self.read_limit_bytes = 8
        self.files: dict[str, bytes] = {}
        self.calls: list[tuple[object, ...]] = []


class MemoryFiles(FileAccess):
    """`read` ignores `max_bytes` (it cannot tell a size first); writes by chunks use
    the shared default (joined, then `write`)."""

    async def read(self, path: str, max_bytes: int) -> bytes:
        self.session.calls.append(("read", path, max_bytes))
        return self.session.files[path]

    async def write(self, path: str, data: bytes) -> None:
        self.session.calls.append(("write", path, data))
        self.session.files[path] = data

    async def read_chunks(  # type: ignore[override]  # an async generator
        self, path: str, chunk_size: int, max_bytes: int
    ) -> AsyncIterator[bytes]:
        self.session.calls.append(("chunks", path, chunk_size))
        yield self.session.files[path]  # one chunk, however long: the caller re-cuts it


class MemoryWorkspace(WorkspaceAccess):
    async def stat(self, path: str) -> FileInfo:
        self.session.calls.append(("stat", path))
        return FileInfo(path, path, "file", len(self.session.files[path]), 0o644, 0.0)

    async def list_dir(self, path: str) -> list[FileInfo]:
        self.session.calls.append(("list", path))
        items = self.session.files.items()
        return [FileInfo(n, n, "file", len(d), 0o644, 0.0) for n, d in items]

    async def remove(self, path: str, recursive: bool) -> None:
        self.session.calls.append(("remove", path, recursive))
        del self.session.files[path]

    async def make_dir(self, path: str, parents: bool) -> None:
        self.session.calls.append(("mkdir", path, parents))

    async def make_symlink(self, path: str, target: str) -> None:
        raise AssertionError("not made here")


class MemoryPorts(Ports):
    async def expose(self, port: int) -> ExposedPort:
        self.session.calls.append(("port", port))
        return ExposedPort(url=f"http://127.0.0.1:{port}/", host="127.0.0.1", port=port)


class MemorySession:
    """What `Capabilities.of` reads of a session class: its capability types."""

    backend_name = "memory"
    _file_access = MemoryFiles
    _workspace_access = MemoryWorkspace
    _ports = MemoryPorts
    _snapshots = None
    _durability = None


class Checks:
    def __init__(self) -> None:
        self.running = True
        self.taken_over = False
        self.order: list[str] = []

    @property
    def closing(self) -> bool:
        return not self.running

    def admit_now(self) -> None:
        self.order.append("state")
        if not self.running:
            raise SessionClosedError("closed")

    async def admit(self) -> None:
        self.admit_now()
        self.order.append("lease")
        if self.taken_over:
            raise SessionTakenOverError("taken over")


def _calls() -> tuple[Memory, Checks, FileCalls, WorkspaceCalls]:
    hooks, checks = Memory(), Checks()
    caps = Capabilities(
        files=MemoryFiles(hooks),
        workspace=MemoryWorkspace(hooks),
        ports=MemoryPorts(hooks),
        snapshots=Capabilities.of(MemorySession()).snapshots,
        durability=Capabilities.of(MemorySession()).durability,
    )

    limit = hooks.read_limit_bytes
    files = FileCalls(caps.files, read_limit=limit, admission=checks)
    workspace = WorkspaceCalls(caps, read_limit=limit, admission=checks)
    return hooks, checks, files, workspace


async def test_read_bounds_what_the_backend_returned() -> None:
    hooks, checks, files, _ = _calls()
    hooks.files["a"] = b"123456789"  # 9 bytes: one more than the session's limit
    with pytest.raises(FileTooLargeError):
        await files.read_file("a", None)
    assert hooks.calls == [("read", "a", 8)]  # the session's limit
    with pytest.raises(FileTooLargeError):
        await files.read_file("a", 8)
    assert await files.read_file("a", 9) == b"123456789"
    assert checks.order[:2] == ["state", "lease"]


async def test_the_checks_run_before_any_hook() -> None:
    hooks, checks, files, workspace = _calls()
    hooks.files["a"] = b"x"
    checks.taken_over = True
    with pytest.raises(SessionTakenOverError):
        await files.read_file("a", None)
    with pytest.raises(SessionTakenOverError):
        await files.write_file("a", b"y")
    # Every call that reaches the sandbox checks the lease alike (streams at their first
    # chunk, as they return before anything is read).
    with pytest.raises(SessionTakenOverError):
        await workspace.remove("a", False)
    with pytest.raises(SessionTakenOverError):
        await workspace.make_dir("d", True)
    with pytest.raises(SessionTakenOverError):
        await workspace.stat("a")
    with pytest.raises(SessionTakenOverError):
        await workspace.expose_port(80)
    with pytest.raises(SessionTakenOverError):
        await anext(aiter(files.read_file_chunks("a", 4)))
    with pytest.raises(SessionTakenOverError):
        await anext(aiter(workspace.persist_workspace(".")))
    checks.taken_over, checks.running = False, False
    with pytest.raises(SessionClosedError):
        files.read_file_chunks("a", 4)
    with pytest.raises(SessionClosedError):
        await workspace.stat("a")
    with pytest.raises(SessionClosedError):
        await workspace.remove("a", False)
    with pytest.raises(SessionClosedError):
        await workspace.expose_port(80)
    assert hooks.calls == []
    assert hooks.files == {"a": b"x"}


async def test_arguments_are_checked_before_the_hook() -> None:
    hooks, _, files, workspace = _calls()
    for bad in ("", "a\0b", 3):
        with pytest.raises(InvalidArgumentError):
            await files.read_file(bad, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await files.read_file("a", -1)
    with pytest.raises(InvalidArgumentError):
        files.read_file_chunks("a", 0)
    with pytest.raises(InvalidArgumentError):
        await workspace.remove("a", "yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        await workspace.make_dir("d", 1)  # type: ignore[arg-type]
    for port in (0, 65536, True):
        with pytest.raises(InvalidArgumentError):
            await workspace.expose_port(port)
    for limits in ((0, 1), (1, 0)):
        with pytest.raises(InvalidArgumentError):
            await workspace.hydrate_workspace([], ".", *limits)
    assert hooks.calls == []


async def test_writes_encode_text_and_chunks_are_recut() -> None:
    hooks, _, files, _ = _calls()
    await files.write_file("t", "é")
    assert hooks.files["t"] == "é".encode()
    await files.write_file_chunks("c", ["ab", b"", bytearray(b"cd"), memoryview(b"e")])
    assert hooks.files["c"] == b"abcde"  # the shared default joined the chunks
    got = [chunk async for chunk in files.read_file_chunks("c", 2)]
    assert got == [b"ab", b"cd", b"e"]
    assert ("chunks", "c", 2) in hooks.calls


async def test_workspace_calls_reach_their_hook() -> None:
    hooks, _, _, workspace = _calls()
    hooks.files.update({"b": b"1", "a": b"22", "c": b""})
    assert [info.name for info in await workspace.list_dir(".")] == ["a", "b", "c"]
    assert (await workspace.stat("a")).size == 2
    await workspace.remove("a", True)
    await workspace.make_dir("d", False)
    exposed = await workspace.expose_port(8080)
    assert exposed.port == 8080
    assert hooks.calls[-3:] == [("remove", "a", True), ("mkdir", "d", False), ("port", 8080)]
