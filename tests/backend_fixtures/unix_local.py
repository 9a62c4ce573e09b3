"""Conformance fixture for the embedded `unix_local` backend: real local processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    yield sandbox.open_session("unix_local", workdir=tmp_path / "ws", terminate_grace_s=0.5)


BACKEND = conformance.Backend(
    name="unix_local",
    session=conformance.fixture_session(environment),
    waits_for_processes=True,
)
