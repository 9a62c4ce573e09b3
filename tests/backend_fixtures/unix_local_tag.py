"""Conformance fixture for `unix_local` with `containment="tag"`: the fallback used
where no cgroup can be made (trees through /proc, escapees by their environment tag)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from tests.helpers import maybe_started

NAME = "unix_local_tag"
CAPABILITIES = {"resize", "signals"}


def skip_reason() -> str | None:
    return None


@asynccontextmanager
async def session(
    tmp_path: Path, *, start: bool = True
) -> AsyncIterator[sandbox.BaseSandboxSession]:
    """A session of this backend, started unless `start=False` (then the test starts
    it); the leak checks below run once it is closed."""
    async with maybe_started(
        sandbox.open_session(
            "unix_local", workspace=tmp_path / "ws", terminate_grace_s=0.5, containment="tag"
        ),
        start,
    ) as s:
        yield s
