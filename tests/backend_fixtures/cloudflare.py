"""Conformance fixture for the `cloudflare` backend: the loopback Worker server
(`sandbox.testing.cloudflare_server`), real sockets and real processes behind it."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance

API_KEY = "conformance-key-7f3a"


def skip_reason() -> str | None:
    if importlib.util.find_spec("aiohttp") is None:
        return "aiohttp is not installed: pip install 'agent-sandbox-pty[cloudflare]'"
    return None


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.cloudflare_server import CloudflareWorkerServer

    async with CloudflareWorkerServer(api_key=API_KEY, root=tmp_path / "worker") as server:
        yield sandbox.open_session("cloudflare", worker_url=server.url, api_key=API_KEY)
        # Closing the session deleted its sandbox, and with it every process and socket.
        # A container the bridge's pool gave a deleted id at a later request (a resume
        # that found the session gone asks once) is left empty, as on the real bridge.
        left = {i: sb for i, sb in server.sandboxes.items() if i not in server.allocated}
        assert left == {}, "the session's sandbox was not deleted"
        assert all(not sb.sessions for sb in server.sandboxes.values())
        assert server.live_processes() == 0


BACKEND = conformance.Backend(
    name="cloudflare",
    session=conformance.fixture_session(environment),
    capabilities={"files", "resize", "signals"},
    skip_reason=skip_reason,
)
