"""Conformance fixture for the embedded `unix_local` backend: real local processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox

NAME = "unix_local"
CAPABILITIES = {"resize", "signals"}


def skip_reason() -> str | None:
    return None


@asynccontextmanager
async def session(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    async with sandbox.open_session(
        "unix_local", workspace=tmp_path / "ws", terminate_grace_s=0.5
    ) as s:
        yield s
