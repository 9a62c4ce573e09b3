"""Conformance fixture for the `e2b` backend with `runner=True` (docs/runner.md), through
the SDK fake (real local processes): the runner is written into the fake sandbox by
`files.write`, started detached by a background `connect --text --start` command and
really runs here, in the sandbox's own runner folder (`SANDBOX_RUNNER_DIR`, see
`sandbox.testing.e2b_fake`).

On exit, as the `e2b` fixture: no sandbox, no local process started by the fake (the
runner, its keepers and its processes included: killing the sandbox ends them), no open
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

from . import e2b as plain

API_KEY = plain.API_KEY


def skip_reason() -> str | None:
    return plain.skip_reason() or unavailable_reason()


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.e2b_fake import FakeE2B

    root = tmp_path / "fake-e2b"
    root.mkdir()
    async with FakeE2B(api_key=API_KEY, root=root) as fake:
        yield sandbox.open_session(
            "e2b", api_key=API_KEY, sandbox_class=fake.AsyncSandbox, runner=True
        )
        assert fake.live_sandbox_ids() == []
        assert await eventually(lambda: fake.leftover_pids() == [], timeout=15), describe_pids(
            fake.leftover_pids()
        )
        assert fake.open_streams() == []
        folders = [state.runner_dir for state in fake._sandboxes.values()]
        assert not [f for f in folders if os.path.exists(f)], "a runner folder was left"


BACKEND = conformance.Backend(
    name="e2b_runner",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
