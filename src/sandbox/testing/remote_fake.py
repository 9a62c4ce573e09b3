"""Serve an in-process SDK fake to another process, so the fake outlives its client.

The SDK fakes (`e2b_fake`, `daytona_fake`, `modal_fake`) keep their provider's state in
the process that made them. A test of crash survival needs the opposite: a client
process that holds a session is SIGKILLed, and the provider (its sandboxes, its
processes) carries on, as a real one does. `FakeServer` runs in the test's process and
serves one object (the fake's SDK class, or the fake itself) on a unix socket;
`connect(path)` in the client's process returns an SDK-shaped proxy of it. The backend in
the client uses the proxy exactly as it would use the fake (the fixtures' SDK class
option, unchanged code):

```python
# the test's process
async with FakeE2B(api_key=KEY) as fake, FakeServer(fake.AsyncSandbox, path) as server:
    ...  # start a child that runs the lines below, SIGKILL it, resume here
    await server.wait_idle()  # the dead client's connection has been cleaned up

# the child's process, inside its event loop
remote = connect(path)
session = sandbox.open_session("e2b", api_key=KEY, sandbox_class=remote.root)
```

How calls cross (one connection per client, one frame per message: a 4-byte length and
a pickle):

- attribute reads and plain calls are answered at once (the client waits on the socket
  for that one answer, queuing whatever else arrives meanwhile), so `sandbox.id`,
  `handle.exit_code` and sync methods behave as on the fake;
- a call that makes a coroutine (any awaitable) returns a proxy of it; awaiting the
  proxy runs it in the server as a task and delivers its result or exception. A
  cancelled await cancels that task and waits for it to finish, as cancelling a
  coroutine of the fake itself does; a result that arrives after the cancel is dropped;
- async iteration (`async for`) and async context managers go through the same path
  (`__aiter__`, `__anext__`, `__aenter__`, `__aexit__`);
- values go by value (pickled): numbers, strings, bytes, containers, enums, exceptions
  (with their `__cause__`), dataclasses, pydantic models; everything else by reference:
  the fake's objects, functions and methods, coroutines, classes made by the fake.
  The client's own callables passed as arguments (output callbacks) become references
  too: the server calls them by sending a message, and the client runs them (awaiting
  those that return an awaitable) in the order they were sent, before the answer of
  any await that follows them is delivered, so output reaches the caller before the
  exit that follows it (an attribute read is answered at once and may overtake them).
  A `memoryview` argument crosses as bytes.

When a client goes away (closed, or killed) the server does what the death of the SDK
objects in that client would do, and nothing more: it cancels the client's pending
awaits, disconnects every handle it gave out that has an async `disconnect()` (a
command or PTY handle: the provider's process keeps running), runs `release(obj)` on
each object if given (for instance closing a Modal client), closes the coroutines it
made that were never awaited, and drops the client's callbacks. The fake's sandboxes
and processes stay.

Both ends trust each other (pickle): the socket is for tests, in a private folder.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import enum
import inspect
import io
import itertools
import os
import pickle
import select
import socket
import struct
import sys
import types
from collections.abc import Awaitable, Callable
from typing import Any

# A frame's header: the length of the pickle that follows.
FRAME = struct.Struct("!I")
# No single message of a test comes near this; beyond it a peer is broken.
MAX_FRAME = 256 * 1024 * 1024
# How long the server gives one `disconnect()` or `release` of a dead client's object.
RELEASE_TIMEOUT_S = 10.0
_ROOT = 0


def _is_global(obj: Any) -> bool:
    """Whether pickle can name `obj` by module and qualified name (a plain function or
    class that its module really holds under that name)."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    qualname = getattr(obj, "__qualname__", None)
    if module is None or not isinstance(qualname, str) or "<locals>" in qualname:
        return False
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return False
    return target is obj


def _fake_module(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module.startswith("sandbox.testing") and module != __name__


def _rebuild_exception(
    cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]
) -> BaseException:
    """An exception from its class, args and attributes, without calling `__init__`
    (some SDK exceptions, e2b's `CommandExitException`, cannot be rebuilt from args)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


def _reduce_exception(obj: Any) -> Any:
    if isinstance(obj, BaseException):
        return (_rebuild_exception, (type(obj), obj.args, dict(vars(obj))))
    if isinstance(obj, memoryview):  # accepted where bytes are (a file write), unpicklable
        return (bytes, (obj.tobytes(),))
    return NotImplemented


def _by_value(obj: Any) -> bool:
    """Whether an object the server sends is copied (data) rather than referenced."""
    if obj is None or isinstance(
        obj,
        bool | int | float | complex | str | bytes | bytearray | tuple | list | dict | set,
    ):
        return True
    if isinstance(obj, frozenset | range | slice | enum.Enum | BaseException):
        return True
    if isinstance(obj, datetime.date | datetime.time | datetime.timedelta | datetime.tzinfo):
        return True
    if isinstance(obj, type):
        # The classes of the values above (and of exceptions the fake defines) go by
        # name; a class the fake made (bound to its service) is a reference.
        return _is_global(obj) and (not _fake_module(obj) or issubclass(obj, BaseException))
    if isinstance(obj, types.FunctionType | types.BuiltinFunctionType):
        # Reconstructors pickle uses (copyreg's) go by name; the fake's are references.
        bound = getattr(obj, "__self__", None)
        plain = bound is None or isinstance(bound, types.ModuleType)
        return plain and _is_global(obj) and not _fake_module(obj)
    if _fake_module(type(obj)):
        return False
    if dataclasses.is_dataclass(obj):
        return True
    return hasattr(type(obj), "model_fields") and hasattr(obj, "model_dump")


def _is_client_callable(obj: Any) -> bool:
    """Whether an argument the client sends is one of its callables (a reference)."""
    if isinstance(obj, type) or not callable(obj):
        return False
    if isinstance(obj, types.FunctionType | types.BuiltinFunctionType):
        bound = getattr(obj, "__self__", None)
        if (bound is None or isinstance(bound, types.ModuleType)) and _is_global(obj):
            return False  # a plain function pickle names (a reconstructor)
    return True


def _frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload)) + payload


def _split_frames(buffer: bytearray) -> list[bytes]:
    frames = []
    while len(buffer) >= FRAME.size:
        (size,) = FRAME.unpack_from(buffer)
        if size > MAX_FRAME:
            raise ConnectionError(f"a remote fake frame of {size} bytes is too large")
        if len(buffer) < FRAME.size + size:
            break
        frames.append(bytes(buffer[FRAME.size : FRAME.size + size]))
        del buffer[: FRAME.size + size]
    return frames


# ---- the server (the test's process) --------------------------------------------------


class _ClientCallable:
    """The server's stand-in for a callable of the client: calling it sends a message
    (fire and forget); once the client is gone it does nothing."""

    def __init__(self, connection: _Connection, callback_id: int) -> None:
        self._connection = connection
        self._id = callback_id

    def __repr__(self) -> str:
        return f"<client callable {self._id}>"

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._connection.send(("cb", self._id, args, kwargs))


class _ServerPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, connection: _Connection) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._connection = connection

    def reducer_override(self, obj: Any) -> Any:
        return _reduce_exception(obj)

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _ClientCallable):
            return ("c", obj._id)
        if _by_value(obj):
            return None
        return ("s", self._connection.register(obj), repr(obj)[:200])


class _ServerUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, connection: _Connection) -> None:
        super().__init__(file)
        self._connection = connection

    def persistent_load(self, pid: Any) -> Any:
        kind, number = pid[0], pid[1]
        if kind == "s":
            return self._connection.objects[number]
        return self._connection.callback(number)


class _Connection:
    """One client: the objects it was given, its pending awaits and callbacks."""

    def __init__(self, server: FakeServer, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.writer = writer
        self.objects: dict[int, Any] = {_ROOT: server.root}
        self._numbers: dict[int, int] = {id(server.root): _ROOT}
        self._next = itertools.count(1)
        self._callbacks: dict[int, _ClientCallable] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.alive = True

    def register(self, obj: Any) -> int:
        number = self._numbers.get(id(obj))
        if number is None or self.objects.get(number) is not obj:
            number = next(self._next)
            self.objects[number] = obj
            self._numbers[id(obj)] = number
        return number

    def callback(self, number: int) -> _ClientCallable:
        found = self._callbacks.get(number)
        if found is None:
            found = self._callbacks[number] = _ClientCallable(self, number)
        return found

    def dumps(self, message: Any) -> bytes:
        buffer = io.BytesIO()
        _ServerPickler(buffer, self).dump(message)
        return buffer.getvalue()

    def loads(self, payload: bytes) -> Any:
        return _ServerUnpickler(io.BytesIO(payload), self).load()

    def send(self, message: Any) -> None:
        if not self.alive or self.writer.is_closing():
            return
        self.writer.write(_frame(self.dumps(message)))

    def answer(self, rid: int, value: Any) -> None:
        try:
            payload = self.dumps(("ok", rid, value))
        except Exception as exc:  # a value that cannot cross: its caller learns why
            payload = self.dumps(("err", rid, RuntimeError(f"cannot send {value!r}: {exc}"), None))
        if self.alive and not self.writer.is_closing():
            self.writer.write(_frame(payload))

    def fail(self, rid: int, exc: BaseException) -> None:
        try:
            payload = self.dumps(("err", rid, exc, exc.__cause__))
        except Exception:  # an exception that cannot cross: its caller learns what it was
            payload = self.dumps(("err", rid, RuntimeError(f"{type(exc).__name__}: {exc}"), None))
        if self.alive and not self.writer.is_closing():
            self.writer.write(_frame(payload))

    def handle(self, message: Any) -> None:
        kind, rid = message[0], message[1]
        if kind == "cancel":
            task = self.tasks.get(rid)
            if task is not None:
                task.cancel()
            return
        try:
            target = self.objects[message[2]]
            if kind == "get":
                value = getattr(target, message[3])
            elif kind == "call":
                value = target(*message[3], **message[4])
            elif kind == "callattr":
                value = getattr(target, message[3])(*message[4], **message[5])
            elif kind == "await":
                self.tasks[rid] = asyncio.get_running_loop().create_task(self._await(rid, target))
                return
            else:
                raise ValueError(f"unknown remote fake message {kind!r}")
        except Exception as exc:
            self.fail(rid, exc)
            return
        self.answer(rid, value)

    async def _await(self, rid: int, target: Any) -> None:
        try:
            value = await target
        except asyncio.CancelledError:
            self.send(("err", rid, asyncio.CancelledError(), None))
        except Exception as exc:
            self.fail(rid, exc)
        else:
            self.answer(rid, value)
        finally:
            self.tasks.pop(rid, None)

    async def lost(self) -> None:
        """The client is gone: undo what its SDK objects held, keep the provider's."""
        self.alive = False
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        release = self.server.release
        for number, obj in list(self.objects.items()):
            if number == _ROOT:
                continue
            steps: list[Awaitable[Any]] = []
            disconnect = getattr(type(obj), "disconnect", None)
            if inspect.iscoroutinefunction(disconnect):
                steps.append(obj.disconnect())
            if release is not None:
                done = release(obj)
                if inspect.isawaitable(done):
                    steps.append(done)
            for step in steps:
                with contextlib.suppress(Exception, TimeoutError):
                    async with asyncio.timeout(RELEASE_TIMEOUT_S):
                        await step
        for obj in self.objects.values():
            if inspect.iscoroutine(obj) and inspect.getcoroutinestate(obj) == "CORO_CREATED":
                obj.close()  # never awaited: closed, so no "never awaited" warning
            elif inspect.isasyncgen(obj) and not obj.ag_running:
                with contextlib.suppress(Exception):
                    await obj.aclose()
        self.objects.clear()
        self._callbacks.clear()


class FakeServer:
    """Serves `root` (an SDK fake's class, or the fake) on the unix socket `path`.

    `release(obj)` (optional, may return an awaitable) is run on every object a client
    was given when that client goes away, after the handles' `disconnect()`: what the
    death of the client's SDK objects releases beyond those (e.g. a Modal client)."""

    def __init__(
        self,
        root: Any,
        path: str | os.PathLike[str],
        *,
        release: Callable[[Any], Awaitable[Any] | None] | None = None,
    ) -> None:
        self.root = root
        self.path = os.fspath(path)
        self.release = release
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.clients_served = 0

    def __repr__(self) -> str:
        return f"<FakeServer {self.path} clients={len(self._handlers)}>"

    async def start(self) -> FakeServer:
        """Listen (the socket file is created mode 0600)."""
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        os.chmod(self.path, 0o600)
        return self

    async def __aenter__(self) -> FakeServer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def clients(self) -> int:
        """How many clients are connected now."""
        return len(self._handlers)

    async def wait_idle(self) -> None:
        """Return once no client is connected (and every gone one was cleaned up)."""
        await self._idle.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._idle.clear()
        self.clients_served += 1
        self._writers.add(writer)
        connection = _Connection(self, writer)
        try:
            while True:
                header = await reader.readexactly(FRAME.size)
                (size,) = FRAME.unpack(header)
                if size > MAX_FRAME:
                    break
                payload = await reader.readexactly(size)
                try:
                    message = connection.loads(payload)
                except Exception:  # a client that sends what cannot be read is dropped
                    break
                connection.handle(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away (closed, or killed)
        finally:
            try:
                await connection.lost()
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
                self._handlers.discard(task)
                self._writers.discard(writer)
                if not self._handlers:
                    self._idle.set()

    async def aclose(self) -> None:
        """Stop listening, drop every client (cleaned up as gone), remove the socket."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        # Each client's connection is cut (its handler then cleans up as for a client
        # gone), rather than its handler cancelled: the stream protocol would log that.
        for writer in list(self._writers):
            writer.transport.abort()
        handlers = list(self._handlers)
        if handlers:
            await asyncio.wait(handlers)
        if server is not None:
            await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


# ---- the client (the other process) ------------------------------------------------------


class RemoteObject:
    """An object of the server, as the client sees it: attributes, calls, awaits,
    async iteration and async context managers all go to the server."""

    __slots__ = ("__weakref__", "_client", "_number", "_repr")

    def __init__(self, client: RemoteFakeClient, number: int, text: str) -> None:
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_repr", text)

    def __repr__(self) -> str:
        return f"<remote {self._repr}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._client.request("get", self._number, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a remote fake object is read-only")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._client.request("call", self._number, args, kwargs)

    def __await__(self) -> Any:
        return self._client.wait_for(self._number).__await__()

    def __aiter__(self) -> Any:
        return self._client.request("callattr", self._number, "__aiter__", (), {})

    def __anext__(self) -> Any:
        return self._client.request("callattr", self._number, "__anext__", (), {})

    def __aenter__(self) -> Any:
        return self._client.request("callattr", self._number, "__aenter__", (), {})

    def __aexit__(self, *exc_info: Any) -> Any:
        kind, exc, _ = exc_info  # a traceback cannot cross
        return self._client.request("callattr", self._number, "__aexit__", (kind, exc, None), {})


class _ClientPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, client: RemoteFakeClient) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._client = client

    def reducer_override(self, obj: Any) -> Any:
        return _reduce_exception(obj)

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, RemoteObject):
            return ("s", obj._number)
        if _is_client_callable(obj):
            return ("c", self._client.keep_callback(obj))
        return None


class _ClientUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, client: RemoteFakeClient) -> None:
        super().__init__(file)
        self._client = client

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "s":
            return self._client.proxy(pid[1], pid[2])
        return self._client.callbacks[pid[1]]


class RemoteFakeClient:
    """The client's end of one connection (made by `connect`, inside an event loop)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._ids = itertools.count(1)
        self._proxies: dict[int, RemoteObject] = {}
        self.callbacks: dict[int, Callable[..., Any]] = {}
        self._callback_ids: dict[int, int] = {}
        self._answers: dict[int, Any] = {}
        self._waiting: set[int] = set()
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._inbox: collections.deque[Any] = collections.deque()
        self._wake = asyncio.Event()
        self._closed = False
        self.root = self.proxy(_ROOT, "root")
        self._loop.add_reader(sock.fileno(), self._readable)
        self._runner = self._loop.create_task(self._run())

    def proxy(self, number: int, text: str) -> RemoteObject:
        found = self._proxies.get(number)
        if found is None:
            found = self._proxies[number] = RemoteObject(self, number, text)
        return found

    def keep_callback(self, func: Callable[..., Any]) -> int:
        number = self._callback_ids.get(id(func))
        if number is None or self.callbacks.get(number) is not func:
            number = next(self._ids)
            self.callbacks[number] = func  # kept: the server may call it until the end
            self._callback_ids[id(func)] = number
        return number

    def _send(self, message: Any) -> None:
        if self._closed:
            raise ConnectionResetError("the remote fake connection is closed")
        buffer = io.BytesIO()
        _ClientPickler(buffer, self).dump(message)
        self._sock.sendall(_frame(buffer.getvalue()))

    def _dispatch(self, payload: bytes) -> None:
        message = _ClientUnpickler(io.BytesIO(payload), self).load()
        if message[0] in ("ok", "err") and message[1] in self._waiting:
            self._answers[message[1]] = message
            return
        self._inbox.append(message)  # callbacks and await answers, in arrival order
        self._wake.set()

    def _take(self, data: bytes) -> None:
        if not data:
            self._lost()
            return
        self._buffer.extend(data)
        for payload in _split_frames(self._buffer):
            self._dispatch(payload)

    def _readable(self) -> None:
        try:
            data = self._sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return  # a synchronous request read it first
        except OSError:
            data = b""
        self._take(data)

    def _lost(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._sock.fileno())
        self._inbox.append(("lost",))
        self._wake.set()

    def request(self, kind: str, number: int, *rest: Any) -> Any:
        """A synchronous request: wait on the socket for its answer (queuing the rest)."""
        rid = next(self._ids)
        self._waiting.add(rid)
        try:
            self._send((kind, rid, number, *rest))
            while rid not in self._answers:
                if self._closed:
                    raise ConnectionResetError("the remote fake server went away")
                select.select([self._sock], [], [])
                try:
                    data = self._sock.recv(1 << 16)
                except OSError:
                    data = b""
                self._take(data)
            return self._result(self._answers.pop(rid))
        finally:
            self._waiting.discard(rid)

    @staticmethod
    def _result(message: Any) -> Any:
        if message[0] == "ok":
            return message[2]
        exc, cause = message[2], message[3]
        if cause is not None:
            exc.__cause__ = cause
        raise exc

    async def wait_for(self, number: int) -> Any:
        """Await a server awaitable; a cancel is passed on and its end awaited."""
        rid = next(self._ids)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._futures[rid] = future
        try:
            self._send(("await", rid, number))
            try:
                # Shielded: a cancel must leave the future to the server's answer.
                message = await asyncio.shield(future)
            except asyncio.CancelledError:
                if not future.done() and not self._closed:
                    self._send(("cancel", rid, number))
                    with contextlib.suppress(BaseException):
                        await asyncio.shield(future)
                raise
            return self._result(message)
        finally:
            self._futures.pop(rid, None)

    async def _run(self) -> None:
        """Deliver callbacks and await answers one by one, in the order sent."""
        while True:
            while not self._inbox:
                self._wake.clear()
                await self._wake.wait()
            message = self._inbox.popleft()
            if message[0] == "cb":
                func = self.callbacks.get(message[1])
                if func is None:
                    continue
                try:
                    result = func(*message[2], **message[3])
                    if inspect.isawaitable(result):
                        await result
                except Exception:  # a callback's failure is its own (as in the SDKs' readers)
                    continue
            elif message[0] == "lost":
                for future in self._futures.values():
                    if not future.done():
                        future.set_exception(
                            ConnectionResetError("the remote fake server went away")
                        )
            else:
                waiting = self._futures.get(message[1])
                if waiting is not None and not waiting.done():
                    waiting.set_result(message)

    async def aclose(self) -> None:
        """Close the connection (the server cleans up as for a client gone)."""
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._sock.fileno())
        self._runner.cancel()
        await asyncio.wait([self._runner])
        self._sock.close()


def connect(path: str | os.PathLike[str]) -> RemoteFakeClient:
    """Connect to a `FakeServer` (call it inside the event loop that will use it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.fspath(path))
    except BaseException:
        sock.close()
        raise
    return RemoteFakeClient(sock)


__all__ = [
    "FRAME",
    "MAX_FRAME",
    "RELEASE_TIMEOUT_S",
    "FakeServer",
    "RemoteFakeClient",
    "RemoteObject",
    "connect",
]
