"""Conformance fixture for the `cloudflare` backend with `runner=True` (docs/runner.md),
through the loopback Worker (`sandbox.testing.cloudflare_server`, real local processes):
the runner is written into the sandbox by the file route, started detached by a terminal
of its own, `connect --text --start --ready`, and really runs here, in the container's
own runner folder (`SANDBOX_RUNNER_DIR`).

On exit, as the `cloudflare` fixture: no sandbox, no terminal session, no process the
server started; and no local process of an ended container (the runner, its keepers and
its processes included: the sandbox's deletion ends them) and no runner folder left.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.runner import unavailable_reason
from sandbox.testing import conformance
from tests.helpers import describe_pids, eventually

from . import cloudflare as plain

API_KEY = plain.API_KEY


def skip_reason() -> str | None:
    return plain.skip_reason() or unavailable_reason()


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.cloudflare_server import CloudflareWorkerServer

    async with CloudflareWorkerServer(api_key=API_KEY, root=tmp_path / "worker") as server:
        yield sandbox.open_session(
            "cloudflare", worker_url=server.url, api_key=API_KEY, runner=True
        )
        left = {i: sb for i, sb in server.sandboxes.items() if i not in server.allocated}
        assert left == {}, "the session's sandbox was not deleted"
        assert all(not sb.sessions for sb in server.sandboxes.values())
        assert server.live_processes() == 0
        assert await eventually(lambda: server.leftover_pids() == [], timeout=15), describe_pids(
            server.leftover_pids()
        )
        assert server.leftover_runner_dirs() == [], "a runner folder was left"


BACKEND = conformance.Backend(
    name="cloudflare_runner",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
