"""Conformance fixture for `unix_local` with `confine=True` and `runner=True`: the
bubblewrap jail's argv started by the local runner daemon, the command check run in the
jail as on the direct path (needs `bwrap` and the runner). The leftover check is the
`unix_local_runner` fixture's: no process carrying the session's mark is left."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.backends.unix_local import confine
from sandbox.testing import conformance

from . import unix_local_runner as plain


def skip_reason() -> str | None:
    ok, reason = confine.availability()
    return plain.skip_reason() or (None if ok else reason)


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    token = secrets.token_hex(8)
    yield sandbox.open_session(
        "unix_local",
        workdir=tmp_path / "ws",
        terminate_grace_s=0.5,
        env={plain.MARK: token},
        confine=True,
        runner=True,
    )
    plain.assert_none_marked(token)


BACKEND = conformance.Backend(
    name="unix_local_confined_runner",
    session=conformance.fixture_session(environment),
    skip_reason=skip_reason,
)
