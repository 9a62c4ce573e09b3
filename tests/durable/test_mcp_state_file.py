"""`sandbox mcp --state-file`: a restarted server finds its sandbox again."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("mcp")

import sandbox
from tests.test_mcp import ok, session_id, stdio_session


async def test_a_restarted_server_resumes_its_sandbox(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    state = tmp_path / "state.json"
    log = tmp_path / "server.log"
    async with stdio_session(workspace, log, "--state-file", str(state)) as client:
        await ok(client, "exec_command", cmd="echo kept > note.txt")
        out = await ok(client, "exec_command", cmd="sleep 600", yield_time_ms=250)
        first = session_id(out)
    ref = sandbox.read_ref_file(state)  # detached on stop: the file names the sandbox
    assert [p.process_id for p in ref.processes] == [first]
    assert not ref.processes[0].running  # unix_local: a child of the server that stopped

    async with stdio_session(workspace, log, "--state-file", str(state)) as client:
        listed = await ok(client, "list_processes")
        assert str(first) in listed, listed
        out = await ok(client, "exec_command", cmd="cat note.txt")
        assert out.endswith("Output:\nkept\n")
    assert sandbox.read_ref_file(state).session_id == ref.session_id

    async with stdio_session(workspace, log, "--state-file", str(state), "--close-on-exit"):
        pass
    assert not os.path.exists(state)  # closed: nothing left to resume
