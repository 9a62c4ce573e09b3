"""Conformance fixture for the `blaxel` backend with `runner=True` (docs/runner.md),
through the loopback `BlaxelServer`: the runner is written into the stand-in sandbox
through the filesystem API, started detached by a bridge typed into one of its
terminals (`connect --text --ready`) and really runs here, in the sandbox's own runner
folder (`SANDBOX_RUNNER_DIR`, see `sandbox.testing.blaxel_server`).

The server converts terminal output as the real one does (`go_utf8=True`: a character
split between two PTY reads becomes U+FFFDs): through the runner's base64 lines nothing
is split, so the contract's split-character test passes here, unlike on the plain
`blaxel` fixture.

On exit, as the `blaxel` fixture: no sandbox, no process of the server's; and no local
process carrying a sandbox's mark (the runner, its keepers and its processes: deleting
the sandbox ends them), and no runner folder left.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.runner import unavailable_reason
from sandbox.testing import conformance
from tests.helpers import describe_pids, eventually

from . import blaxel as plain


def skip_reason() -> str | None:
    return plain.skip_reason() or unavailable_reason()


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.blaxel_server import BlaxelServer

    async with BlaxelServer(root=str(tmp_path)) as server:
        yield sandbox.open_session(
            "blaxel",
            workdir=str(tmp_path / "ws"),
            terminate_grace_s=0.5,
            runner=True,
            **server.backend_options(),
        )
        assert server.sandboxes == {}, "the sandbox was not deleted on close"
        assert server.live_processes() == 0
        assert await eventually(lambda: server.leftover_pids() == [], timeout=15), describe_pids(
            server.leftover_pids()
        )
        left = [folder for folder in server.runner_dirs() if os.path.exists(folder)]
        assert not left, f"a runner folder was left: {left}"


BACKEND = conformance.Backend(
    name="blaxel_runner",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
