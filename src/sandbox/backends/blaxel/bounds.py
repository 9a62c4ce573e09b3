"""How much a Blaxel peer may make us hold: every byte count it controls is bounded here.

- API answers (the SDK's httpx calls): at most `MAX_RESPONSE_BYTES` per answer. The
  largest real one is a finished process's logs: `GET /process/{id}/logs` and a waited
  `POST /process` carry stdout and stderr (each at most 4 MiB, `maxLogsResponseBytes`
  in `handler/process/logfile.go`) and their concatenation, JSON-escaped; 32 MiB leaves
  room for the escaping. A file read is bounded by its `max_bytes` instead (the stat
  said its size, a file that grew since is `FileTooLargeError`).
- Terminal WebSocket messages: at most `MAX_TERMINAL_FRAME_BYTES`. The server sends one
  PTY read (4096 bytes) per frame, or on a reconnect its replay buffer (100 KiB,
  `maxBufferSize` in `handler/terminal/session_manager.go`), JSON-escaped (at most six
  bytes per byte): 1 MiB is that plus margin. The terminal's output has no total bound.

The SDK reads each answer whole, so the bound is applied inside its httpx clients: a
response hook wraps the body stream in a counter that fails past the bound
(`ResponseTooLarge`, deliberately not an httpx error, which the SDK would retry), and a
request hook asks for an uncompressed answer (a compressed one could grow past any
bound while it is decoded, so one sent anyway is refused). The hooks act only inside
our own calls (`answer_limit`), so other users of the SDK's process-wide client are
left alone. Deadlines are the client's (`client.call`: the whole call, however slowly a
peer trickles).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

import httpx

MAX_RESPONSE_BYTES = 32 * 1024 * 1024
MAX_TERMINAL_FRAME_BYTES = 1024 * 1024

# The bound of the answer the current task is waiting for (None: not our call).
_LIMIT: ContextVar[int | None] = ContextVar("sandbox_blaxel_answer_limit", default=None)


class ResponseTooLarge(Exception):
    """A Blaxel answer was larger than its bound (`limit` bytes)."""

    def __init__(self, limit: int, *, compressed: bool = False) -> None:
        why = "compressed, though an uncompressed one was asked" if compressed else "larger"
        super().__init__(f"the answer was {why} than the bound of {limit} bytes")
        self.limit = limit
        self.compressed = compressed


@contextlib.contextmanager
def answer_limit(limit: int) -> Iterator[None]:
    """Bound every answer the SDK reads inside the block (in this task and the tasks
    it starts) to `limit` bytes."""
    token = _LIMIT.set(limit)
    try:
        yield
    finally:
        _LIMIT.reset(token)


class _BoundedStream(httpx.AsyncByteStream):
    """A response body that raises `ResponseTooLarge` once more than `limit` bytes came."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise ResponseTooLarge(self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _on_request(request: httpx.Request) -> None:
    if _LIMIT.get() is not None:
        request.headers["Accept-Encoding"] = "identity"


async def _on_response(response: httpx.Response) -> None:
    limit = _LIMIT.get()
    if limit is None:
        return
    if response.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
        raise ResponseTooLarge(limit, compressed=True)
    length = response.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > limit:
        raise ResponseTooLarge(limit)
    stream = response.stream
    if isinstance(stream, httpx.AsyncByteStream):
        response.stream = _BoundedStream(stream, limit)


HOOKS: dict[str, list[Callable[[Any], Awaitable[None]]]] = {
    "request": [_on_request],
    "response": [_on_response],
}
"""The httpx event hooks that apply the bounds (see the module docstring)."""


def bound_client(client: httpx.AsyncClient) -> None:
    """Add the hooks to one of the SDK's httpx clients (kept for its lifetime)."""
    client.event_hooks = with_hooks(client.event_hooks)


def with_hooks(
    hooks: dict[str, list[Callable[..., Any]]],
) -> dict[str, list[Callable[..., Any]]]:
    """`hooks` (an httpx client's) with ours added once, the others kept."""
    merged = {event: list(present) for event, present in hooks.items()}
    for event, added in HOOKS.items():
        present = merged.setdefault(event, [])
        present.extend(hook for hook in added if hook not in present)
    return merged
