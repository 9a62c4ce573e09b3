"""Conformance fixture for the `daytona` backend, through the SDK fake (real local
processes behind `sandbox.testing.daytona_fake`)."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from tests.helpers import describe_pids, eventually, maybe_started

NAME = "daytona"
CAPABILITIES = {"resize", "signals"}
API_KEY = "dtn_fake_conformance_key"


def skip_reason() -> str | None:
    if importlib.util.find_spec("daytona") is None:
        return "the daytona SDK is not installed (pip install 'agent-sandbox-pty[daytona]')"
    return None


@asynccontextmanager
async def session(
    tmp_path: Path, *, start: bool = True
) -> AsyncIterator[sandbox.BaseSandboxSession]:
    """A session of this backend, started unless `start=False` (then the test starts
    it); the leak checks below run once it is closed."""
    from sandbox.testing.daytona_fake import FakeDaytona

    root = tmp_path / "fake-daytona"
    root.mkdir()
    async with FakeDaytona(api_key=API_KEY, root=root) as fake:
        async with maybe_started(
            sandbox.open_session(
                "daytona",
                api_key=API_KEY,
                daytona_class=fake.AsyncDaytona,
                terminate_grace_s=0.5,
                teardown_timeout_s=10.0,
            ),
            start,
        ) as s:
            yield s
        # Closing the session deleted its sandbox, and with it every process.
        assert fake.live_sandbox_ids() == []
        # The kill is sent, not finished: a SIGKILLed process leaves the table a moment later.
        assert await eventually(lambda: fake.leftover_pids() == []), describe_pids(
            fake.leftover_pids()
        )
        assert fake.open_streams() == []
