"""Conformance fixture for the `blaxel` backend, through the loopback `BlaxelServer`
(real sockets, the real Blaxel SDK, real processes behind the server)."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from tests.helpers import maybe_started

NAME = "blaxel"
# The terminal's `resize` message (sandbox-api/src/handler/terminal.go).
CAPABILITIES = {"signals", "resize"}


def skip_reason() -> str | None:
    for module in ("blaxel", "aiohttp"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'agent-sandbox-pty[blaxel]')"
    return None


@asynccontextmanager
async def session(
    tmp_path: Path, *, start: bool = True
) -> AsyncIterator[sandbox.BaseSandboxSession]:
    """A session of this backend, started unless `start=False` (then the test starts
    it); the leak checks below run once it is closed."""
    from sandbox.testing.blaxel_server import BlaxelServer

    workdir = tmp_path / "ws"
    # `go_utf8=False`: the real terminal turns a character split between two PTY reads
    # into U+FFFDs (docs/providers.md, Blaxel), which the contract's split-character test
    # cannot pass; tests/backends/test_blaxel.py covers the real conversion.
    async with BlaxelServer(root=str(tmp_path), go_utf8=False) as server:
        async with maybe_started(
            sandbox.open_session(
                "blaxel", workdir=str(workdir), terminate_grace_s=0.5, **server.backend_options()
            ),
            start,
        ) as s:
            yield s
        # Closing deleted the sandbox, which stops everything it ran.
        assert server.sandboxes == {}, "the sandbox was not deleted on close"
        assert server.live_processes() == 0
