"""Conformance fixture for the `blaxel` backend, through the loopback `BlaxelServer`
(real sockets, the real Blaxel SDK, real processes behind the server)."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance


def skip_reason() -> str | None:
    for module in ("blaxel", "aiohttp"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'agent-sandbox-pty[blaxel]')"
    return None


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.blaxel_server import BlaxelServer

    # `go_utf8=False`: the real terminal turns a character split between two PTY reads
    # into U+FFFDs (docs/providers.md, Blaxel), which the contract's split-character test
    # cannot pass; tests/backends/test_blaxel.py covers the real conversion.
    async with BlaxelServer(root=str(tmp_path), go_utf8=False) as server:
        yield sandbox.open_session(
            "blaxel",
            workdir=str(tmp_path / "ws"),
            terminate_grace_s=0.5,
            **server.backend_options(),
        )
        # Closing deleted the sandbox, which stops everything it ran.
        assert server.sandboxes == {}, "the sandbox was not deleted on close"
        assert server.live_processes() == 0


BACKEND = conformance.Backend(
    name="blaxel",
    session=conformance.fixture_session(environment),
    # The terminal's `resize` message (sandbox-api/src/handler/terminal.go).
    capabilities={"files", "resize", "signals"},
    skip_reason=skip_reason,
    # `process.exec` answers once the command ended, with all of its output.
    exec_output_at_end=True,
)
