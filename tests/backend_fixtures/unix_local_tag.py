"""Conformance fixture for `unix_local` with `containment="tag"`: the fallback used
where no cgroup can be made (trees through /proc, escapees by their environment tag)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    yield sandbox.open_session(
        "unix_local", workdir=tmp_path / "ws", terminate_grace_s=0.5, containment="tag"
    )


BACKEND = conformance.Backend(
    name="unix_local_tag",
    session=conformance.fixture_session(environment),
    waits_for_processes=True,
)
