"""Conformance fixture for the `modal` backend, through the SDK fake (real local processes).

The fake (`sandbox.testing.modal_fake.FakeModal`) has exactly the SDK surface the backend
uses, checked against the installed SDK by tests/backends/test_modal.py. On exit the
fixture checks that nothing was left behind: no sandbox, no client, no local process
started by the fake, no background task.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance
from tests.helpers import describe_pids, eventually


def skip_reason() -> str | None:
    if importlib.util.find_spec("modal") is None:
        return "the modal SDK is not installed (pip install 'agent-sandbox-pty[modal]')"
    return None


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
            runner=False,  # the per-exec path (`modal_runner` is the runner's)
        )
        assert fake.live_sandboxes() == [], "the sandbox was not terminated"
        assert fake.open_clients() == [], "the Modal client was not closed"
        # The kill is sent, not finished: a SIGKILLed process leaves the table a moment later
        # (15 s: on a loaded machine the reap of a whole tree took more than 5 s).
        assert await eventually(lambda: fake.leftover_pids() == [], timeout=15), describe_pids(
            fake.leftover_pids()
        )
        current = asyncio.current_task()
        leaked = {t for t in asyncio.all_tasks() - tasks_before if t is not current}
        assert not leaked, f"tasks were left behind: {leaked}"
    finally:
        await fake.aclose()


BACKEND = conformance.Backend(
    name="modal",
    session=conformance.fixture_session(environment),
    capabilities={"files", "open_stdin", "signals"},  # Modal cannot resize a terminal
    skip_reason=skip_reason,
)
