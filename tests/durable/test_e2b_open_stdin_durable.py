"""Open stdin across a detach and a resume on e2b (its processes outlive the client),
against the SDK fake: the ref says which pipe processes still have an open stdin."""

from __future__ import annotations

import pytest

pytest.importorskip("e2b")

import sandbox
from sandbox.testing.e2b_fake import FakeE2B
from tests.helpers import eventually

API_KEY = "e2b_fake_open_stdin_key_0123456789"


def _open(fake: FakeE2B) -> sandbox.BaseSandboxSession:
    return sandbox.open_session(
        "e2b", api_key=API_KEY, sandbox_class=fake.AsyncSandbox, teardown_timeout_s=5.0
    )


async def _final(session: sandbox.BaseSandboxSession, pid: int) -> tuple[str, int | None]:
    output = ""
    for _ in range(10):
        update = await session.pty_write_stdin(pid, "", yield_time_s=10)
        output += update.output
        if update.process_id is None:
            return output, update.exit_code
    raise AssertionError(f"process {pid} did not exit: {output[-200:]!r}")


async def test_an_open_stdin_is_written_and_closed_after_a_resume(tmp_path):
    async with FakeE2B(api_key=API_KEY, root=tmp_path) as fake:
        session = _open(fake)
        await session.start()
        sorter = await session.pty_exec_start(
            "echo ready; exec sort", stdin=True, until="ready", yield_time_s=10
        )
        ended = await session.pty_exec_start(
            "echo ready; exec sort", stdin=True, until="ready", yield_time_s=10
        )
        assert sorter.process_id is not None and ended.process_id is not None
        await session.pty_write_stdin(sorter.process_id, "pear\nfig\n", yield_time_s=0.2)
        await session.pty_close_stdin(ended.process_id)
        ref = await session.detach()
        stdin = {p.process_id: p.stdin for p in ref.processes}
        assert stdin == {sorter.process_id: True, ended.process_id: False}
        assert sandbox.SessionRef.from_json(ref.to_json()).processes == ref.processes

        resumed = sandbox.resume_session(ref, api_key=API_KEY, sandbox_class=fake.AsyncSandbox)
        async with resumed:
            await resumed.pty_write_stdin(sorter.process_id, "apple\n", yield_time_s=0.2)
            await resumed.pty_close_stdin(sorter.process_id)
            output, code = await _final(resumed, sorter.process_id)
            assert (output.replace("\r", ""), code) == ("apple\nfig\npear\n", 0)
            # Its stdin was closed before the detach: it stays closed.
            with pytest.raises(sandbox.StdinClosedError):
                await resumed.pty_write_stdin(ended.process_id, "x\n")
        assert fake.live_sandbox_ids() == []
        assert await eventually(lambda: fake.leftover_pids() == [])
