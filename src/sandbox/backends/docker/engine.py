"""One connection to a Docker engine: the SDK client, a private thread pool for its
blocking calls, and the container's event stream.

The docker SDK is synchronous. Its short calls (create an exec, inspect, resize, create
the container) run on a small pool owned by the session, never on the loop's default
executor, so a slow engine cannot starve the rest of the program and the session can
wait for every call it started before it closes the client. A call whose caller was
cancelled still completes; its future stays tracked until then.

The event stream of the session's container (one dedicated thread per session, blocked
in the SDK's reader) tells when an exec dies (`exec_die`, with its exit code) and when
the container stops or disappears. That is how exits are detected: by event, not by
polling every process.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import docker
import docker.constants
import docker.utils

from ...errors import SandboxError
from .errors import engine_error

logger = logging.getLogger("sandbox.docker")

T = TypeVar("T")

DEFAULT_API_TIMEOUT_S = 60.0
DEFAULT_WORKERS = 8
CLOSE_WAIT_S = 10.0
SYNC_FIRST_WAIT_S = 0.1


class ExecListener(Protocol):
    """What the engine tells a running exec."""

    def exec_died(self, exit_code: int | None) -> None:
        """The engine reported the exec's end (exit code None if it did not say)."""

    def container_gone(self, reason: str) -> None:
        """The container stopped or was removed: the exec cannot be running any more."""

    def container_oom(self) -> None:
        """The kernel's OOM killer hit the container's memory limit (some process in it
        was killed: the engine does not say which)."""


class Engine:
    """The session's link to the Docker engine (see the module docstring).

    `client` may be a ready `docker.APIClient` (then the caller owns it and it is not
    closed here); otherwise one is made from `base_url` (default: the environment, as
    the docker CLI does) when `connect()` runs.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_version: str | None = None,
        api_timeout: float = DEFAULT_API_TIMEOUT_S,
        client: Any = None,
        workers: int = DEFAULT_WORKERS,
    ) -> None:
        self._base_url = base_url
        self._api_version = api_version
        self._api_timeout = api_timeout
        self._client: Any = client
        self._owns_client = client is None
        self._loop = asyncio.get_running_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, workers), thread_name_prefix="sandbox-docker"
        )
        self._inflight: set[asyncio.Future[Any]] = set()
        self._listeners: dict[str, ExecListener] = {}
        self._created_seen: collections.deque[str] = collections.deque(maxlen=256)
        self._created_waiters: dict[str, asyncio.Future[None]] = {}
        self._events: Any = None
        self._events_thread: threading.Thread | None = None
        self._events_done: asyncio.Future[None] = self._loop.create_future()
        self._closing = False
        self._closed = False
        self.events_alive = False
        self.gone_reason: str | None = None
        # `oom` events seen for the container: an exec that dies of SIGKILL after this
        # grew since its start was (most likely) killed by the memory limit.
        self.oom_kills = 0

    @property
    def api(self) -> Any:
        """The SDK's low-level `docker.APIClient` (after `connect()`)."""
        if self._client is None:
            raise RuntimeError("the Docker engine is not connected")
        return self._client

    # ---- blocking calls ----------------------------------------------------------------

    def submit(
        self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> asyncio.Future[T]:
        """Run `fn` on the session's pool; its errors come back translated.

        The returned future is tracked until it completes, whoever awaits it.
        """
        if self._closed:
            raise RuntimeError("the Docker engine connection is closed")

        def run() -> T:
            try:
                return fn(*args, **kwargs)
            except SandboxError:
                raise
            except Exception as exc:
                raise engine_error(exc, action) from exc

        future: asyncio.Future[T] = self._loop.run_in_executor(self._executor, run)
        self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        future.add_done_callback(_mark_retrieved)
        return future

    async def call(self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`submit` and wait. Cancelling the caller does not cancel the call itself."""
        return await asyncio.shield(self.submit(action, fn, *args, **kwargs))

    async def connect(self) -> None:
        """Make the SDK client (contacting the engine for its API version)."""
        if self._client is not None:
            return
        future = self.submit("connect to the Docker engine", self._make_client)
        future.add_done_callback(self._adopt_client)
        await asyncio.shield(future)

    def _make_client(self) -> Any:
        if self._base_url is None:
            kwargs: dict[str, Any] = docker.utils.kwargs_from_env()
        else:
            kwargs = {"base_url": self._base_url}
        kwargs["timeout"] = self._api_timeout
        if self._api_version is not None:
            kwargs["version"] = self._api_version
        _probe_unix_socket(kwargs.get("base_url"), self._api_timeout)
        return docker.APIClient(**kwargs)

    def _adopt_client(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._client = future.result()

    # ---- events ------------------------------------------------------------------------

    async def watch(self, container_id: str) -> None:
        """Subscribe to the container's events (one dedicated reader thread)."""
        future = self.submit(
            "watch the container's events",
            self.api.events,
            filters={"container": container_id},
            decode=True,
        )
        future.add_done_callback(self._adopt_events)
        await asyncio.shield(future)

    def _adopt_events(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        stream = future.result()
        self._events = stream
        if self._closing:
            self._close_events()
            return
        self.events_alive = True
        thread = threading.Thread(
            target=self._pump_events, args=(stream,), name="sandbox-docker-events", daemon=True
        )
        self._events_thread = thread
        thread.start()

    def _pump_events(self, stream: Any) -> None:
        error: BaseException | None = None
        try:
            for event in stream:
                self._post(self._dispatch, event)
        except Exception as exc:
            error = exc
        self._post(self._events_ended, error)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
            self._loop.call_soon_threadsafe(fn, *args)

    def _events_ended(self, error: BaseException | None) -> None:
        self.events_alive = False
        if not self._events_done.done():
            self._events_done.set_result(None)
        if not self._closing:
            logger.warning(
                "the Docker event stream ended%s; exits are now detected when output ends",
                f" ({type(error).__name__})" if error else "",
            )

    def _dispatch(self, event: Mapping[str, Any]) -> None:
        if event.get("Type", "container") != "container":
            return
        action = str(event.get("Action") or event.get("status") or "")
        actor = event.get("Actor") or {}
        attributes: Mapping[str, Any] = actor.get("Attributes") or {}
        if action == "exec_die":
            listener = self._listeners.get(str(attributes.get("execID", "")))
            if listener is not None:
                listener.exec_died(_int_or_none(attributes.get("exitCode")))
        elif action.startswith("exec_create"):
            exec_id = str(attributes.get("execID", ""))
            self._created_seen.append(exec_id)
            waiter = self._created_waiters.pop(exec_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif action == "oom":
            self.oom_kills += 1
            for oom_listener in list(self._listeners.values()):
                oom_listener.container_oom()
        elif action == "die":
            code = attributes.get("exitCode", "?")
            self._container_gone(f"the container stopped (exit code {code})")
        elif action == "destroy":
            self._container_gone("the container was removed")

    def _container_gone(self, reason: str) -> None:
        if self._closing:
            return
        if self.gone_reason is None:
            self.gone_reason = reason
        for listener in list(self._listeners.values()):
            listener.container_gone(reason)

    async def wait_exec_seen(self, exec_id: str, timeout: float) -> bool:
        """Wait until the event stream delivered the `exec_create` of `exec_id`: proof
        that the subscription is live. False if it did not come within `timeout`."""
        if exec_id in self._created_seen:
            return True
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._created_waiters[exec_id] = waiter
        try:
            async with asyncio.timeout(timeout):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            self._created_waiters.pop(exec_id, None)

    async def sync_events(self, container_id: str, first_exec_id: str, timeout: float) -> bool:
        """Make sure the event subscription is live: wait for the `exec_create` event of
        an exec just created, and if it does not come (the engine answers the subscribe
        call a moment before it subscribes), create marker execs until one is seen.
        Markers are then started (`true`) so the engine can forget them. False when the
        stream stayed silent for `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        wait = SYNC_FIRST_WAIT_S
        markers: list[str] = []
        seen = await self.wait_exec_seen(first_exec_id, wait)
        try:
            while not seen and loop.time() < deadline:
                created = await self.call(
                    "check the event stream", self.api.exec_create, container_id, ["true"]
                )
                markers.append(str(created["Id"]))
                wait = min(wait * 2, max(0.0, deadline - loop.time()))
                seen = await self.wait_exec_seen(markers[-1], wait)
        finally:
            for marker in markers:
                with contextlib.suppress(SandboxError):
                    await self.call("start a marker exec", self.api.exec_start, marker, detach=True)
        return seen

    def register(self, exec_id: str, listener: ExecListener) -> None:
        """Route the events of `exec_id` to `listener`."""
        self._listeners[exec_id] = listener

    def unregister(self, exec_id: str) -> None:
        """Stop routing the events of `exec_id`."""
        self._listeners.pop(exec_id, None)

    # ---- closing -----------------------------------------------------------------------

    def stop_events(self) -> None:
        """Stop listening to the container (before removing it on purpose)."""
        self._closing = True
        self._close_events()

    def _close_events(self) -> None:
        stream, self._events = self._events, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()

    async def settle_calls(self, timeout: float = CLOSE_WAIT_S) -> None:
        """Wait (bounded) for every blocking call started so far."""
        pending = [f for f in self._inflight if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def close(self) -> None:
        """Stop the event stream, wait for calls in flight, close the client and pool.

        Idempotent. Call it only from the session's settled teardown.
        """
        if self._closed:
            return
        self._closing = True
        self._close_events()
        if self._events_thread is not None and not self._events_done.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await asyncio.shield(self._events_done)
        await self.settle_calls()
        self._closed = True
        for waiter in self._created_waiters.values():
            waiter.cancel()
        self._listeners.clear()
        if self._owns_client and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        self._executor.shutdown(wait=False, cancel_futures=True)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _mark_retrieved(future: asyncio.Future[Any]) -> None:
    # A caller that was cancelled never reads the result; reading the exception here
    # keeps asyncio from logging "exception was never retrieved" for it.
    if not future.cancelled():
        future.exception()


def _probe_unix_socket(base_url: object, timeout: float | None) -> None:
    """Connect once to the engine's unix socket with a socket closed right after, so an
    engine that is not there fails here (`engine_error`: "cannot reach").

    docker 7.1's `UnixHTTPConnection.connect` does not close a socket whose `connect`
    failed: it is left to the garbage collector (a `ResourceWarning`). With the probe,
    only an engine that goes away between the probe and the client's first request can
    still leak one that way.
    """
    url = base_url if isinstance(base_url, str) else docker.constants.DEFAULT_UNIX_SOCKET
    for scheme in ("http+unix://", "unix://"):
        if url.startswith(scheme):
            path = url[len(scheme) :]
            break
    else:
        return  # tcp, ssh, npipe: not docker-py's unix connection
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        probe.connect(path)
