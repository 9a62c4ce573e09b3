"""`sandbox.testing.remote_fake`: an object served to a client in another event loop (a
thread here; a child process in the crash tests) behaves as the object itself."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from sandbox.testing.remote_fake import FakeServer, RemoteObject, connect


class Unbuildable(Exception):
    """An exception that cannot be rebuilt from its args (like e2b's CommandExitException)."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__()
        self.code = code
        self.detail = detail


@dataclasses.dataclass
class Result:
    code: int
    text: str


class Handle:
    def __init__(self) -> None:
        self.disconnected = False

    async def disconnect(self) -> None:
        self.disconnected = True


class Service:
    def __init__(self) -> None:
        self.name = "svc"
        self.child = Handle()
        self.started = asyncio.Event()
        self.cancelled = False
        self.made: Any = None

    def add(self, a: Any, b: Any = 1) -> Any:
        return a + b

    async def result(self, code: int) -> Result:
        return Result(code, "done")

    async def fail(self) -> None:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise Unbuildable(7, "outer") from exc

    async def stream(self, on_data: Callable[[str], Awaitable[None] | None]) -> str:
        for piece in ("a", "b", "c"):
            on_data(piece)
        return "end"

    async def hang(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def wait_started(self) -> None:
        await self.started.wait()

    async def chunks(self) -> AsyncIterator[bytes]:
        for piece in (b"x", b"y"):
            yield piece

    async def handle(self) -> Handle:
        return Handle()

    def make(self) -> Any:
        self.made = self._later()
        return self.made

    async def _later(self) -> None:
        return None


def _in_another_loop(path: str, body: Callable[[Any], Awaitable[Any]]) -> Awaitable[Any]:
    async def client() -> Any:
        remote = connect(path)
        try:
            return await body(remote.root)
        finally:
            await remote.aclose()

    return asyncio.to_thread(asyncio.run, client())


@pytest.fixture
async def served() -> AsyncIterator[tuple[Service, FakeServer]]:
    folder = tempfile.mkdtemp(prefix="sandbox-fake-")
    service = Service()
    try:
        async with FakeServer(service, os.path.join(folder, "s.sock")) as server:
            yield service, server
    finally:
        os.rmdir(folder)


async def test_attributes_calls_awaits_and_values_cross(served):
    _, server = served

    async def body(root: Any) -> Any:
        child = root.child
        assert isinstance(child, RemoteObject) and root.child is child  # one proxy per object
        result = await root.result(3)
        assert root.add(b"a", b=memoryview(b"b")) == b"ab"  # a memoryview crosses as bytes
        return root.name, root.add(2, b=5), result, child.disconnected

    name, total, result, flag = await _in_another_loop(server.path, body)
    assert (name, total, result, flag) == ("svc", 7, Result(3, "done"), False)
    assert os.stat(server.path).st_mode & 0o777 == 0o600


async def test_exceptions_cross_with_their_attributes_and_cause(served):
    _, server = served

    async def body(root: Any) -> Any:
        with pytest.raises(Unbuildable) as caught:
            await root.fail()
        with pytest.raises(AttributeError):
            _ = root.missing
        return caught.value

    exc = await _in_another_loop(server.path, body)
    assert (exc.code, exc.detail) == (7, "outer")
    assert isinstance(exc.__cause__, KeyError)


async def test_callbacks_run_in_order_before_the_answer_that_follows_them(served):
    _, server = served

    async def body(root: Any) -> Any:
        seen: list[str] = []

        async def slow(piece: str) -> None:
            await asyncio.sleep(0)
            seen.append(piece)

        first = await root.stream(seen.append)
        assert seen == ["a", "b", "c"] and first == "end"
        seen.clear()
        await root.stream(slow)  # async callbacks are awaited, still in order
        return seen

    assert await _in_another_loop(server.path, body) == ["a", "b", "c"]


async def test_a_cancelled_await_cancels_the_servers_task_and_waits_for_it(served):
    service, server = served

    async def body(root: Any) -> Any:
        task = asyncio.ensure_future(root.hang())
        await root.wait_started()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return root.cancelled  # already true: the cancel was awaited on the server

    assert await _in_another_loop(server.path, body) is True
    assert service.cancelled


async def test_async_iteration_crosses(served):
    _, server = served

    async def body(root: Any) -> Any:
        return [chunk async for chunk in root.chunks()]

    assert await _in_another_loop(server.path, body) == [b"x", b"y"]


async def test_a_client_gone_disconnects_its_handles_and_closes_unawaited_coroutines(served):
    service, server = served

    async def body(root: Any) -> Any:
        handle = await root.handle()
        root.make()  # a coroutine made on the server and never awaited
        return handle

    await _in_another_loop(server.path, body)
    await server.wait_idle()
    assert server.clients == 0 and server.clients_served == 1
    assert inspect.getcoroutinestate(service.made) == "CORO_CLOSED"
    assert not service.child.disconnected  # only what the client was given (and made)


async def test_the_server_going_away_fails_the_clients_calls(served):
    _, server = served
    ready = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def body(root: Any) -> Any:
        task = asyncio.ensure_future(root.hang())
        await root.wait_started()
        loop.call_soon_threadsafe(ready.set)
        with pytest.raises(ConnectionResetError):
            await task
        with pytest.raises(ConnectionResetError):
            _ = root.name
        return True

    running = asyncio.ensure_future(_in_another_loop(server.path, body))
    await ready.wait()
    await server.aclose()
    assert await running is True
