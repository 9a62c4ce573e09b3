"""Conformance fixture for the `daytona` backend with `runner=True` (docs/runner.md),
through the SDK fake (real local processes): the runner is uploaded into the fake
sandbox by `fs.upload_file`, started detached by a session command, `connect --text
--start`, and really runs here, in the sandbox's own runner folder
(`SANDBOX_RUNNER_DIR`, see `sandbox.testing.daytona_fake`).

On exit, as the `daytona` fixture: no sandbox, no local process started by the fake (the
runner, its keepers and its processes included: deleting the sandbox ends them), no open
stream; and the sandbox's runner folder is gone.
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

from . import daytona as plain

API_KEY = plain.API_KEY


def skip_reason() -> str | None:
    return plain.skip_reason() or unavailable_reason()


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.daytona_fake import FakeDaytona

    root = tmp_path / "fake-daytona"
    root.mkdir()
    async with FakeDaytona(api_key=API_KEY, root=root) as fake:
        yield sandbox.open_session(
            "daytona",
            api_key=API_KEY,
            daytona_class=fake.AsyncDaytona,
            terminate_grace_s=0.5,
            teardown_timeout_s=10.0,
            runner=True,
        )
        assert fake.live_sandbox_ids() == []
        assert await eventually(lambda: fake.leftover_pids() == [], timeout=15), describe_pids(
            fake.leftover_pids()
        )
        assert fake.open_streams() == []
        left = [folder for folder in fake.runner_dirs if os.path.exists(folder)]
        assert not left, "a runner folder was left"


BACKEND = conformance.Backend(
    name="daytona_runner",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
