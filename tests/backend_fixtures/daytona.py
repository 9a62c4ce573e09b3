"""Conformance fixture for the `daytona` backend, through the SDK fake (real local
processes behind `sandbox.testing.daytona_fake`)."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance
from tests.helpers import describe_pids, eventually

API_KEY = "dtn_fake_conformance_key"


def skip_reason() -> str | None:
    if importlib.util.find_spec("daytona") is None:
        return "the daytona SDK is not installed (pip install 'agent-sandbox-pty[daytona]')"
    return None


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
        )
        # Closing the session deleted its sandbox, and with it every process.
        assert fake.live_sandbox_ids() == []
        # The kill is sent, not finished: a SIGKILLed process leaves the table a moment later.
        assert await eventually(lambda: fake.leftover_pids() == [], timeout=15), describe_pids(
            fake.leftover_pids()
        )
        assert fake.open_streams() == []


BACKEND = conformance.Backend(
    name="daytona",
    session=conformance.fixture_session(environment),
    capabilities={"files", "resize", "signals"},
    skip_reason=skip_reason,
)
