"""Detach, resume (terminal sessions reattached by id), takeover and crash survival on
blaxel, against the loopback stand-in (real sockets, the real SDK, real processes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("blaxel")

import sandbox
from sandbox.backends.blaxel.durable import CUT_NOTE, GONE_NOTE
from sandbox.testing.blaxel_server import TERMINAL_RING_BYTES, BlaxelServer
from tests.helpers import HookGate, eventually

API_KEY = "bl-durable-Secret/Key+0123456789abcdef"
WORKSPACE = "durable-workspace"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BlaxelServer]:
    async with BlaxelServer(api_key=API_KEY, workspace=WORKSPACE, root=str(tmp_path)) as srv:
        yield srv
    assert srv.live_processes() == 0


def _options(server: BlaxelServer, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return server.backend_options(workdir=str(tmp_path / "ws"), terminate_grace_s=0.3, **extra)


def _open(server: BlaxelServer, tmp_path: Path, **extra: Any) -> Any:
    return sandbox.open_session("blaxel", **_options(server, tmp_path, **extra))


def _resume(ref: sandbox.SessionRef, **extra: Any) -> Any:
    # Credentials are never in a ref: they are given again (or read from BL_*); so is the
    # API they go to (a resume takes no endpoint from a ref).
    extra.setdefault("api_url", ref.options["api_url"])
    return sandbox.resume_session(ref, api_key=API_KEY, workspace=WORKSPACE, **extra)


def _sessions(server: BlaxelServer, name: str) -> dict[str, bool]:
    return server.terminal_sessions(name)


def _ring(server: BlaxelServer, name: str, session_id: str) -> bytes:
    return bytes(server.sandboxes[name].term_sessions[session_id].ring)


async def test_output_printed_while_detached_comes_on_the_first_poll(
    server: BlaxelServer, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    async with _open(server, tmp_path) as s:
        assert s.keeps_processes is True
        started = await s.pty_exec_start(
            "echo before; while [ ! -e go ]; do sleep 0.02; done; echo during; "
            "while [ ! -e go2 ]; do sleep 0.02; done; echo after; exit 7",
            yield_time_s=5,
            until="before",
        )
        pid = started.process_id
        assert pid is not None and "before" in started.output
        ref = await s.detach()
        [proc] = ref.processes
        assert proc.running and proc.handle["session_id"]
        # Nobody is attached: the terminal session keeps running, and keeps its output.
        assert _sessions(server, s.sandbox_name) == {proc.handle["session_id"]: True}
        (ws / "go").touch()
        name, sid = s.sandbox_name, proc.handle["session_id"]
        assert await eventually(lambda: b"\nduring" in _ring(server, name, sid))

        async with _resume(ref) as resumed:
            [info] = resumed.pty_processes()
            assert (info.process_id, info.running) == (pid, True)
            first = await resumed.pty_write_stdin(pid, "", until="during", yield_time_s=10)
            # What the earlier client returned is skipped; what came meanwhile is there.
            assert "during" in first.output and "before" not in first.output
            assert first.process_id == pid
            (ws / "go2").touch()
            last = await resumed.pty_write_stdin(pid, "", yield_time_s=10)
            assert "after" in last.output and last.exit_code == 7
        assert server.sandboxes == {}


async def test_a_process_that_ended_while_detached_reports_its_exit_code(
    server: BlaxelServer, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    async with _open(server, tmp_path) as s:
        started = await s.pty_exec_start(
            "echo one; while [ ! -e go ]; do sleep 0.02; done; echo two; exit 3",
            tty=True,
            yield_time_s=5,
            until="one",
        )
        pid = started.process_id
        ref = await s.detach()
        (ws / "go").touch()
        name, sid = s.sandbox_name, ref.processes[0].handle["session_id"]
        # It ended with no client attached; its wrapper lingers with the end marker
        # in the ring, so the session is still alive.
        assert await eventually(lambda: b"\x1eE" in _ring(server, name, sid))
        assert _sessions(server, name) == {sid: True}
        async with _resume(ref) as resumed:
            done = await resumed.pty_write_stdin(pid, "", yield_time_s=10)
            assert "two" in done.output and "one" not in done.output
            assert (done.process_id, done.exit_code) == (None, 3)
            # The release line was typed: the lingering wrapper exits, the session ends.
            assert await eventually(lambda: _sessions(server, name).get(sid) is not True)


async def test_the_ring_kept_less_than_was_printed_an_omission_within_the_limit(
    server: BlaxelServer, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    limit = 32 * 1024
    async with _open(server, tmp_path, output_limit_bytes=limit) as s:
        started = await s.pty_exec_start(
            "echo first; while [ ! -e go ]; do sleep 0.02; done; seq 1 60000; "
            "echo end-of-output; exit 4",
            yield_time_s=5,
            until="first",
        )
        pid = started.process_id
        ref = await s.detach()
        (ws / "go").touch()
        name, sid = s.sandbox_name, ref.processes[0].handle["session_id"]
        assert await eventually(lambda: b"\nend-of-output" in _ring(server, name, sid), 20)
        assert len(_ring(server, name, sid)) <= TERMINAL_RING_BYTES
        async with _resume(ref) as resumed:
            done = await resumed.pty_write_stdin(pid, "", yield_time_s=10)
            assert done.exit_code == 4
            # The start of the output is gone from the ring: a note says so; the rest is
            # bounded by output_limit_bytes, with the omission marker.
            assert CUT_NOTE in done.output
            assert "bytes of output omitted" in done.output
            assert done.output.rstrip().endswith("end-of-output")
            assert len(done.output.encode()) < limit + 1024
            assert "\n1\n" not in done.output


async def test_a_session_the_server_closed_while_detached_is_lost_with_a_note(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with _open(server, tmp_path) as s:
        started = await s.pty_exec_start("sleep 600", yield_time_s=0.2)
        ref = await s.detach()
        # No client and no output for longer than the idle timeout: the server closes it.
        assert await server.cleanup_terminals(idle_s=0) == 1
        assert _sessions(server, s.sandbox_name) == {}
        async with _resume(ref) as resumed:
            last = await resumed.pty_write_stdin(started.process_id, "")
            assert (last.process_id, last.exit_code) == (None, None)
            assert GONE_NOTE in last.output and "process lost" in last.output
            # Reattaching never starts a new shell under the old id.
            assert _sessions(server, s.sandbox_name) == {}
            shells = [q.get("shell") for q in server.terminals]
            assert shells[-1] and shells[-1].startswith("/nonexistent/")


async def test_takeover_either_order_leaves_the_new_owners_process(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with _open(server, tmp_path) as old:
        started = await old.pty_exec_start("cat", tty=True, yield_time_s=0.3)
        pid = started.process_id
        ref = old.ref()
        async with _resume(ref) as new:
            with pytest.raises(sandbox.SessionTakenOverError):
                await old.pty_write_stdin(pid, "x\n")
            with pytest.raises(sandbox.SessionTakenOverError):
                await old.exec("true")
            await old.aclose()  # lets go: kills nothing, deletes nothing
            assert old.sandbox_name in server.sandboxes
            echoed = await new.pty_write_stdin(pid, "hello\n", until="hello\r\nhello")
            assert "hello" in echoed.output and echoed.process_id == pid
            # The new owner is taken over in turn; its close lets go too.
            newer = _resume(new.ref())
            await newer.start()
            try:
                with pytest.raises(sandbox.SessionTakenOverError):
                    await new.exec("true")
                await new.aclose()
                again = await newer.pty_write_stdin(pid, "more\n", until="more\r\nmore")
                assert "more" in again.output
            finally:
                await newer.aclose()
        assert server.sandboxes == {}


async def test_a_resume_racing_the_old_clients_close(server: BlaxelServer, tmp_path: Path) -> None:
    async with _open(server, tmp_path) as old:
        await old.pty_exec_start("sleep 600", yield_time_s=0.2)
        ref = old.ref()
        gate = HookGate(old, "_stop_backend")
        closing = asyncio.ensure_future(old.aclose())
        await gate.reached.wait()
        # The close claimed the lease first: the resume finds the session closed.
        with pytest.raises(sandbox.SessionGoneError):
            async with _resume(ref):
                pass
        gate.release()
        await closing
    assert server.sandboxes == {}


@pytest.mark.parametrize("endpoint", ["get", "terminal", "terminal_output"])
async def test_a_resume_cancelled_inside_a_call_leaves_the_ref_the_owner(
    server: BlaxelServer, tmp_path: Path, endpoint: str
) -> None:
    # The await points inside the hooks: finding the sandbox, the terminal's handshake,
    # and the wait for its replay.
    async with _open(server, tmp_path) as s:
        started = await s.pty_exec_start("echo ready; sleep 600", yield_time_s=5, until="ready")
        ref = await s.detach()
        name, sid = s.sandbox_name, ref.processes[0].handle["session_id"]
        resumed = _resume(ref)
        blocked = server.stall(endpoint)
        starting = asyncio.ensure_future(resumed.start())
        await blocked.wait()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        server.release()
        assert resumed.state is sandbox.SessionState.NEW
        assert resumed._client.http is None and resumed._client.instance is None
        # Nothing was killed, and no connection is left to the session.
        assert await eventually(lambda: server.terminal_tasks() == 0)
        assert _sessions(server, name) == {sid: True}
        async with _resume(ref) as again:
            [info] = again.pty_processes()
            assert (info.process_id, info.running) == (started.process_id, True)
            await again.pty_terminate(started.process_id)
            assert await eventually(lambda: _sessions(server, name).get(sid) is not True)


async def test_gone_sandbox_is_session_gone(server: BlaxelServer, tmp_path: Path) -> None:
    async with _open(server, tmp_path) as s:
        await s.pty_exec_start("sleep 600", yield_time_s=0.2)
        ref = await s.detach()
    name = ref.sandbox["name"]
    # Deleted behind the ref's back (another client attached by name and closed):
    # `GET` answers TERMINATED for a while, then 404; both are gone, never recreated.
    async with sandbox.open_session("blaxel", **_options(server, tmp_path, sandbox_id=name)):
        pass
    assert name not in server.sandboxes and name in server.terminated
    for _ in range(2):
        with pytest.raises(sandbox.SessionGoneError) as caught:
            async with _resume(ref):
                pass
        assert caught.value.retryable is False
        assert name not in server.sandboxes
        server.terminated.clear()


async def test_no_secret_reaches_the_ref_or_its_file(server: BlaxelServer, tmp_path: Path) -> None:
    ref_file = tmp_path / "ref.json"
    async with _open(server, tmp_path, ref_file=str(ref_file)) as s:
        await s.pty_exec_start("sleep 600", yield_time_s=0.2)
        ref = await s.detach()
    text = ref.to_json() + repr(ref) + ref_file.read_text()
    for secret in (API_KEY, WORKSPACE, "Secret%2FKey"):
        assert secret not in text
    assert json.loads(ref.to_json())["sandbox"]["name"] == s.sandbox_name
    async with _resume(sandbox.read_ref_file(ref_file)) as resumed:
        assert [p.running for p in resumed.pty_processes()] == [True]


async def test_sigkilled_client_is_resumed_from_its_ref_file(
    server: BlaxelServer, tmp_path: Path
) -> None:
    from tests.durable.crash import crash_with_a_process, ref_of

    ws = tmp_path / "ws"
    ref_file = tmp_path / "ref.json"
    process_id = await crash_with_a_process(
        "blaxel",
        _options(server, tmp_path),
        ref_file,
        [
            "sh",
            "-c",
            "echo started; while [ ! -e go ]; do sleep 0.02; done; echo after-crash; exit 4",
        ],
    )
    ref = ref_of(ref_file)
    assert API_KEY not in ref_file.read_text()
    [proc] = ref.processes
    assert proc.process_id == process_id and proc.running
    # The dead client's socket is gone; its terminal session runs on, unattached.
    sid = proc.handle["session_id"]
    name = ref.sandbox["name"]
    assert await eventually(lambda: not server.sandboxes[name].term_sessions[sid].conns)
    assert _sessions(server, name) == {sid: True}
    (ws / "go").touch()
    async with _resume(ref, ref_file=str(ref_file)) as s:
        last = await s.pty_write_stdin(process_id, "", yield_time_s=10)
        assert "after-crash" in last.output and last.exit_code == 4
    assert server.sandboxes == {}
    assert not ref_file.exists()  # the close deleted the sandbox, and the file
