"""`sandbox.backend.durable_session_id`: the id a backend names its lease and marks with."""

from __future__ import annotations

from pathlib import Path

import sandbox
from sandbox.backend import durable_session_id
from sandbox.backends.unix_local import UnixLocalSession


async def test_it_is_the_refs_id_and_a_resume_takes_it_over(tmp_path: Path) -> None:
    first = UnixLocalSession(workdir=tmp_path)
    other = UnixLocalSession(workdir=tmp_path)
    assert durable_session_id(first) != durable_session_id(other)  # new per session
    async with first:
        ref = first.ref()
        assert durable_session_id(first) == ref.session_id
        resumed = sandbox.resume_session(ref)
        # Set when the resume is made, before `Durability.resume` could ask for it.
        assert durable_session_id(resumed) == ref.session_id
        assert resumed.state is sandbox.SessionState.NEW
