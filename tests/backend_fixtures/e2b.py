"""Conformance fixture for the `e2b` backend, through the SDK fake (real local processes
behind `sandbox.testing.e2b_fake`)."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance
from tests.helpers import describe_pids, eventually

API_KEY = "e2b_fake_conformance_key"


def skip_reason() -> str | None:
    if importlib.util.find_spec("e2b") is None:
        return "the e2b SDK is not installed (pip install 'agent-sandbox-pty[e2b]')"
    return None


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.e2b_fake import FakeE2B

    root = tmp_path / "fake-e2b"
    root.mkdir()
    async with FakeE2B(api_key=API_KEY, root=root) as fake:
        # The default teardown bound (15 s): the prune rule's test tears 40 processes down
        # at once, which a loaded machine's fake can take more than 5 s to answer.
        yield sandbox.open_session("e2b", api_key=API_KEY, sandbox_class=fake.AsyncSandbox)
        # Closing the session killed its sandbox, and with it every process.
        assert fake.live_sandbox_ids() == []
        # The kill is sent, not finished: a SIGKILLed process leaves the table a moment later.
        assert await eventually(lambda: fake.leftover_pids() == [], timeout=15), describe_pids(
            fake.leftover_pids()
        )
        assert fake.open_streams() == []


BACKEND = conformance.Backend(
    name="e2b",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
