"""Conformance fixture for `unix_local` with `confine=True`: every process in a
bubblewrap jail (needs `bwrap`; CI installs it and sets SANDBOX_REQUIRE_ALL=1)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.backends.unix_local import confine
from tests.helpers import maybe_started

NAME = "unix_local_confined"
CAPABILITIES = {"resize", "signals"}


def skip_reason() -> str | None:
    ok, reason = confine.availability()
    return None if ok else reason


@asynccontextmanager
async def session(
    tmp_path: Path, *, start: bool = True
) -> AsyncIterator[sandbox.BaseSandboxSession]:
    """A session of this backend, started unless `start=False` (then the test starts
    it); the leak checks below run once it is closed."""
    async with maybe_started(
        sandbox.open_session(
            "unix_local", workspace=tmp_path / "ws", terminate_grace_s=0.5, confine=True
        ),
        start,
    ) as s:
        yield s
