"""Conformance fixture for the `modal` backend with `runner=True` (docs/runner.md), through
the SDK fake (real local processes): the runner is put into the fake sandbox by an exec's
stdin, started detached by `connect --start` and really runs here, in the sandbox's own
runner folder (`SANDBOX_RUNNER_DIR`, see `sandbox.testing.modal_fake`).

On exit, as the `modal` fixture: no sandbox, no client, no local process started by the
fake (the runner, its keepers and its processes included: terminating the sandbox ends
them), no background task; and the sandbox's runner folder is gone.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.runner import unavailable_reason
from sandbox.testing import conformance
from tests.helpers import describe_pids, eventually

from . import modal as plain


def skip_reason() -> str | None:
    return plain.skip_reason() or unavailable_reason()


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    from sandbox.testing.modal_fake import FakeModal

    fake = FakeModal()
    tasks_before = asyncio.all_tasks()
    try:
        yield sandbox.open_session(
            "modal",
            sdk=fake,
            token_id="fake-token-id",
            token_secret="fake-token-secret",
            workdir=str(tmp_path / "ws"),
            state_dir=str(tmp_path / "state"),
            terminate_grace_s=0.5,
            runner=True,
        )
        assert fake.live_sandboxes() == [], "the sandbox was not terminated"
        assert fake.open_clients() == [], "the Modal client was not closed"
        assert await eventually(lambda: fake.leftover_pids() == [], timeout=15), describe_pids(
            fake.leftover_pids()
        )
        folders = [b._runner_dir for b in fake.sandboxes.values() if b._runner_dir]
        assert not [f for f in folders if os.path.exists(f)], "a runner folder was left"
        current = asyncio.current_task()
        leaked = {t for t in asyncio.all_tasks() - tasks_before if t is not current}
        assert not leaked, f"tasks were left behind: {leaked}"
    finally:
        await fake.aclose()


BACKEND = conformance.Backend(
    name="modal_runner",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "resize", "signals"},
    skip_reason=skip_reason,
)
