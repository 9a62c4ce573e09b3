"""The Blaxel SDK, imported without its side effects, and its process-wide client.

Importing the SDK calls `logging.basicConfig` and silences httpx: a library must not
reconfigure its user's logging, so `_logging_untouched` puts back whatever it changed.

The SDK keeps ONE process-wide client and credential set (read once, at import):
`configure_sdk` replaces them, and the session re-applies its own before every SDK call,
so sessions with different credentials can coexist in one process. The SDK never closes
that shared HTTP client: the last session to stop on an event loop closes it there
(`release_shared_client`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Iterator
from typing import Any

from .bounds import HOOKS, with_hooks


@contextlib.contextmanager
def _logging_untouched() -> Iterator[None]:
    """Whatever the SDK's import changes in `logging` (the root logger's handlers and
    level, httpx's and httpcore's levels) is restored when the block ends."""
    root = logging.getLogger()
    handlers, root_level = list(root.handlers), root.level
    quiet = ("httpx", "httpcore")
    levels = [logging.getLogger(name).level for name in quiet]
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)
        for name, level in zip(quiet, levels, strict=True):
            logging.getLogger(name).setLevel(level)


with _logging_untouched():
    from blaxel.core.authentication.apikey import ApiKey
    from blaxel.core.authentication.types import CredentialsError, CredentialsType
    from blaxel.core.client.client import client as sdk_client
    from blaxel.core.common.settings import settings as sdk_settings
    from blaxel.core.sandbox import SandboxInstance
    from blaxel.core.snapshot import Snapshot

__all__ = [
    "CredentialsError",
    "SandboxInstance",
    "Snapshot",
    "configure_sdk",
    "pool_generated_clients",
    "release_shared_client",
    "track_loop",
]

# Event loops with a live session: the last session to stop on a loop closes the SDK's
# shared HTTP client there (it would otherwise keep pooled sockets open).
_LIVE: weakref.WeakKeyDictionary[object, asyncio.AbstractEventLoop] = weakref.WeakKeyDictionary()


def default_api_url() -> str:
    """The control-plane URL a session without `api_url=` uses (the SDK's)."""
    return str(sdk_settings.base_url)


def configure_sdk(*, api_key: str, workspace: str, api_url: str | None = None) -> None:
    """Point the Blaxel SDK's process-wide client at `api_url` with these credentials.

    The SDK reads its credentials and control-plane URL once, at import, into globals;
    this replaces them (e.g. to talk to `sandbox.testing.blaxel_server.BlaxelServer`).
    `api_url` defaults to the SDK's own (`https://api.blaxel.ai/v0`, or the dev API
    with `BL_ENV=dev`).
    """
    url = api_url or sdk_settings.base_url
    auth = ApiKey(CredentialsType(api_key=api_key, workspace=workspace), workspace, url)
    sdk_settings.auth = auth
    sdk_client.with_auth(auth)
    sdk_client.with_base_url(url)
    # The bounds of `bounds` on the control plane too (they act only inside our calls).
    present = getattr(sdk_client, "_async_event_hooks", None) or {}
    sdk_client.with_event_hooks(async_hooks=with_hooks(dict(present)))


def track_loop(owner: object) -> None:
    """Record that `owner` (a session) uses the SDK on the running loop."""
    _LIVE[owner] = asyncio.get_running_loop()


async def release_shared_client(owner: object) -> None:
    """`owner` stopped: when no other session uses the SDK on its loop, close the SDK's
    shared client there."""
    loop = _LIVE.pop(owner, None)
    if loop is not None and loop not in _LIVE.values():
        await close_shared_sdk_client(loop)


async def close_shared_sdk_client(loop: asyncio.AbstractEventLoop) -> None:
    """Close the SDK's process-wide async HTTP client if it belongs to `loop` (the SDK
    has no public call for it; the next SDK call simply creates a new one)."""
    http = getattr(sdk_client, "_async_client", None)
    if http is None or getattr(sdk_client, "_async_client_loop", None) is not loop:
        return
    sdk_client._async_client = None
    sdk_client._async_client_loop = None
    with contextlib.suppress(Exception):
        await http.aclose()


def pool_generated_clients(action: Any) -> None:
    """Make `action`'s generated-API calls (`process.get`, `write_stdin`, ...) reuse its
    pooled, bounded httpx client, or open a bounded one they close themselves.

    blaxel 0.4.24 builds a fresh generated `Client` per call (`get_api_client`). For
    `process.get` it hands that client the helper's pooled httpx client through
    `set_async_httpx_client`, which does not record the event loop, so the next
    `get_async_httpx_client` discards it and opens a new httpx client that nothing
    closes (a socket left to the garbage collector on every call) and that has none of
    our answer bounds. Stamping the running loop on each new generated client keeps the
    handed-over pooled client; the calls that build their own (`async with`) close it
    on exit, and both carry the bound hooks.
    """
    build = action.get_api_client

    def get_api_client() -> Any:
        api = build()
        api.with_event_hooks(async_hooks=with_hooks(dict(HOOKS)))
        # The SDK's own attribute (attrs field `_async_client_loop`): what it compares
        # with the running loop before trusting a client it was given.
        api._async_client_loop = asyncio.get_running_loop()
        return api

    action.get_api_client = get_api_client
