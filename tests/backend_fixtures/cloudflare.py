"""Conformance fixture for the `cloudflare` backend: the loopback Worker server
(`sandbox.testing.cloudflare_server`), real sockets and real processes behind it."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from tests.helpers import maybe_started

NAME = "cloudflare"
CAPABILITIES = {"resize", "signals"}
API_KEY = "conformance-key-7f3a"


def skip_reason() -> str | None:
    if importlib.util.find_spec("aiohttp") is None:
        return "aiohttp is not installed: pip install 'agent-sandbox-pty[cloudflare]'"
    return None


@asynccontextmanager
async def session(
    tmp_path: Path, *, start: bool = True
) -> AsyncIterator[sandbox.BaseSandboxSession]:
    """A session of this backend, started unless `start=False` (then the test starts
    it); the leak checks below run once it is closed."""
    from sandbox.testing.cloudflare_server import CloudflareWorkerServer

    async with CloudflareWorkerServer(api_key=API_KEY, root=tmp_path / "worker") as server:
        async with maybe_started(
            sandbox.open_session("cloudflare", worker_url=server.url, api_key=API_KEY), start
        ) as s:
            yield s
        # Closing the session deleted its sandbox, and with it every process and socket.
        assert server.sandboxes == {}, "the session's sandbox was not deleted"
        assert server.live_processes() == 0
