"""Conformance fixture for `unix_local` with `runner=True`: a detachable session whose
processes the local runner daemon keeps (docs/runner.md).

Every session reaches this user's one local daemon. Each session's processes carry a
variable of their own in their environment (the `env` option), so after the session
no process may carry it: the daemon itself may stay (its orphan timeout ends it), and
so may the processes of other sessions that share it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.runner import unavailable_reason
from sandbox.testing import conformance, procfs

MARK = "SANDBOX_RUNNER_FIXTURE"


def skip_reason() -> str | None:
    return unavailable_reason()


def assert_none_marked(value: str, timeout: float = 10.0) -> None:
    """Fail unless, within `timeout`, no process carries the session's mark."""
    deadline = time.monotonic() + timeout
    while True:
        left = procfs.pids_with_env(MARK, value)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of the session left behind: {left}")
        time.sleep(0.05)


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    token = secrets.token_hex(8)
    yield sandbox.open_session(
        "unix_local",
        workdir=tmp_path / "ws",
        terminate_grace_s=0.5,
        env={MARK: token},
        runner=True,
    )
    assert_none_marked(token)


BACKEND = conformance.Backend(
    name="unix_local_runner",
    session=conformance.fixture_session(environment),
    skip_reason=skip_reason,
)
