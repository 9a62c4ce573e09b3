"""`FileCalls` and `WorkspaceCalls` alone, over a backend of ours kept in memory.

`Memory` implements the file and workspace hooks of `SessionHooks` the way a backend
does (it is a backend, not a stand-in for our code); `ready` and `guard` are the
session's checks, here switches the test flips. What is proven: the checks run before
any hook, arguments are checked before the hook sees them, the bound on a returned
length holds for a backend that cannot tell the size first, chunks are re-cut, and
listings are sorted.
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
from sandbox.session.file_calls import FileCalls
from sandbox.session.hooks import SessionHooks
from sandbox.session.workspace_calls import WorkspaceCalls
from sandbox.workspace.info import FileInfo
from sandbox.workspace.ports import ExposedPort


class Memory(SessionHooks[None]):
    """Files in a dict; `_read_file` ignores `max_bytes` (it cannot tell a size first)."""

    backend_name = "memory"

    def __init__(self) -> None:
        self.read_limit_bytes = 8
        self.files: dict[str, bytes] = {}
        self.calls: list[tuple[object, ...]] = []

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        self.calls.append(("read", path, max_bytes))
        return self.files[path]

    async def _write_file(self, path: str, data: bytes) -> None:
        self.calls.append(("write", path, data))
        self.files[path] = data

    async def _read_file_chunks(self, path: str, chunk_size: int) -> AsyncIterator[bytes]:
        self.calls.append(("chunks", path, chunk_size))
        yield self.files[path]  # one chunk, however long: the caller re-cuts it

    async def _stat(self, path: str) -> FileInfo:
        self.calls.append(("stat", path))
        return FileInfo(path, path, "file", len(self.files[path]), 0o644, 0.0)

    async def _list_dir(self, path: str) -> list[FileInfo]:
        self.calls.append(("list", path))
        return [FileInfo(n, n, "file", len(d), 0o644, 0.0) for n, d in self.files.items()]

    async def _remove(self, path: str, recursive: bool) -> None:
        self.calls.append(("remove", path, recursive))
        del self.files[path]

    async def _make_dir(self, path: str, parents: bool) -> None:
        self.calls.append(("mkdir", path, parents))

    async def _expose_port(self, port: int) -> ExposedPort:
        self.calls.append(("port", port))
        return ExposedPort(url=f"http://127.0.0.1:{port}/", host="127.0.0.1", port=port)


class Checks:
    def __init__(self) -> None:
        self.running = True
        self.taken_over = False
        self.order: list[str] = []

    def ready(self) -> None:
        self.order.append("ready")
        if not self.running:
            raise SessionClosedError("closed")

    async def guard(self) -> None:
        self.order.append("guard")
        if self.taken_over:
            raise SessionTakenOverError("taken over")


def _calls() -> tuple[Memory, Checks, FileCalls, WorkspaceCalls]:
    hooks, checks = Memory(), Checks()
    files = FileCalls(hooks, ready=checks.ready, guard=checks.guard)
    return hooks, checks, files, WorkspaceCalls(hooks, ready=checks.ready, guard=checks.guard)


async def test_read_bounds_what_the_backend_returned() -> None:
    hooks, checks, files, _ = _calls()
    hooks.files["a"] = b"123456789"  # 9 bytes: one more than the session's limit
    with pytest.raises(FileTooLargeError):
        await files.read_file("a", None)
    assert hooks.calls == [("read", "a", 8)]  # the session's limit, read at the call
    hooks.read_limit_bytes = 9
    assert await files.read_file("a", None) == b"123456789"
    with pytest.raises(FileTooLargeError):
        await files.read_file("a", 8)
    assert await files.read_file("a", 9) == b"123456789"
    assert checks.order[:2] == ["ready", "guard"]


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
    assert hooks.files["c"] == b"abcde"  # the default hook joined the chunks
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
