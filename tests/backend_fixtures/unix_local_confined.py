"""Conformance fixture for `unix_local` with `confine=True`: every process in a
bubblewrap jail (needs `bwrap`; CI installs it and sets SANDBOX_REQUIRE_ALL=1)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.backends.unix_local import confine
from sandbox.testing import conformance


def skip_reason() -> str | None:
    ok, reason = confine.availability()
    return None if ok else reason


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    yield sandbox.open_session(
        "unix_local", workdir=tmp_path / "ws", terminate_grace_s=0.5, confine=True
    )


BACKEND = conformance.Backend(
    name="unix_local_confined",
    session=conformance.fixture_session(environment),
    skip_reason=skip_reason,
    waits_for_processes=True,
)
