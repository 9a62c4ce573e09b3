"""Daytona: a pipe process's log, written while no client was attached, after a resume;
PTY sessions reconnected (their output while detached is not kept)."""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import sys
import termios
from pathlib import Path

import pytest

pytest.importorskip("daytona")

import sandbox
from sandbox.testing.daytona_fake import FakeDaytona
from tests.backend_fixtures.daytona import API_KEY
from tests.helpers import eventually


async def test_output_written_while_detached_is_returned_once(tmp_path):
    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        options = {"api_key": API_KEY, "daytona_class": fake.AsyncDaytona}
        session = sandbox.open_session("daytona", **options)
        await session.start()
        started = await session.pty_exec_start(
            "echo early; sleep 0.5; echo late; exit 4", until="early", yield_time_s=10
        )
        assert "early" in started.output
        ref = await session.detach()
        assert API_KEY not in ref.to_json()
        # "late" is printed with no client attached (or, on a slow machine, after the
        # resume): either way the log gives it once, and never "early" again.
        async with sandbox.resume_session(ref, **options) as resumed:
            update = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=10)
            assert "late" in update.output and "early" not in update.output
            assert update.exit_code == 4


async def test_a_second_detach_keeps_counting_from_the_first_byte(tmp_path):
    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        options = {"api_key": API_KEY, "daytona_class": fake.AsyncDaytona}
        session = sandbox.open_session("daytona", **options)
        await session.start()
        started = await session.pty_exec_start(
            "echo one; while [ ! -e go ]; do sleep 0.02; done; echo two; "
            "while [ ! -e go2 ]; do sleep 0.02; done; echo three",
            until="one",
            yield_time_s=10,
        )
        ref = await session.detach()
        async with sandbox.resume_session(ref, **options) as resumed:
            await resumed.write_file("go", b"")
            update = await resumed.pty_write_stdin(started.process_id, "", until="two")
            assert "two" in update.output and "one" not in update.output
            second = await resumed.detach()
        async with sandbox.resume_session(second, **options) as last:
            await last.write_file("go2", b"")
            update = await last.pty_write_stdin(started.process_id, "", yield_time_s=10)
            assert "three" in update.output
            assert "one" not in update.output and "two" not in update.output


# ---- PTY sessions: the daemon keeps them running, but none of their output ------------


def _options(fake: FakeDaytona) -> dict[str, object]:
    return {"api_key": API_KEY, "daytona_class": fake.AsyncDaytona, "terminate_grace_s": 0.3}


def _printed_and_read(fake: FakeDaytona, sandbox_id: str, pty_id: str, flag: Path) -> bool:
    """The terminal touched `flag` after printing, and the fake's daemon has read all
    it printed (nothing left on the terminal's master), so it was sent to nobody."""
    if not flag.exists():
        return False
    pty = fake.sandboxes[sandbox_id].ptys.get(pty_id)
    if pty is None or pty.local.master_fd is None:
        return True
    unread = fcntl.ioctl(pty.local.master_fd, termios.FIONREAD, b"\0\0\0\0")
    return int.from_bytes(unread, sys.byteorder) == 0


async def test_a_detached_terminal_keeps_running_and_is_reattached(tmp_path):
    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        session = sandbox.open_session("daytona", **_options(fake))
        await session.start()
        root = fake.sandboxes[session.sandbox_id].root
        started = await session.pty_exec_start(
            "echo before; while [ ! -e go ]; do sleep 0.02; done; echo during; touch printed; "
            "while [ ! -e go2 ]; do sleep 0.02; done; echo after; exit 3",
            tty=True,
            until="before",
            yield_time_s=10,
        )
        ref = await session.detach()
        [proc] = ref.processes
        assert proc.running and proc.tty and proc.handle["pty_id"]
        assert fake.open_streams() == []  # the connection is closed ...
        assert fake.pty_ids(ref.sandbox["sandbox_id"]) == [proc.handle["pty_id"]]  # ... not the PTY
        # It prints with no client connected: the daemon sends that to nobody.
        (Path(root) / "go").touch()
        flag = Path(root) / "printed"
        sandbox_id, pty_id = ref.sandbox["sandbox_id"], proc.handle["pty_id"]
        assert await eventually(lambda: _printed_and_read(fake, sandbox_id, pty_id, flag))
        async with sandbox.resume_session(ref, **_options(fake)) as resumed:
            [info] = resumed.pty_processes()
            assert info.process_id == started.process_id and info.running
            await resumed.write_file("go2", b"")
            update = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=10)
            assert "printed meanwhile is not shown" in update.output
            assert "after" in update.output
            assert "during" not in update.output and "before" not in update.output
            assert update.exit_code == 3
        assert fake.live_sandbox_ids() == []
        assert await eventually(lambda: fake.leftover_pids() == [])
        assert fake.open_streams() == []


async def test_a_reattached_terminal_takes_input(tmp_path):
    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        session = sandbox.open_session("daytona", **_options(fake))
        await session.start()
        term = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        ref = await session.detach()
        async with sandbox.resume_session(ref, **_options(fake)) as resumed:
            echoed = await resumed.pty_write_stdin(term.process_id, "hello\n", until="hello")
            assert "hello" in echoed.output
            await resumed.pty_terminate(term.process_id)
            assert fake.pty_ids(ref.sandbox["sandbox_id"]) == []


async def test_a_terminal_that_ended_while_detached_is_reported_with_a_note(tmp_path):
    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        session = sandbox.open_session("daytona", **_options(fake))
        await session.start()
        root = fake.sandboxes[session.sandbox_id].root
        started = await session.pty_exec_start(
            "echo ready; while [ ! -e go ]; do sleep 0.02; done; exit 5",
            tty=True,
            until="ready",
        )
        ref = await session.detach()
        (Path(root) / "go").touch()
        # It ends with no client connected: the daemon deletes the session, exit status too.
        assert await eventually(lambda: fake.pty_ids(ref.sandbox["sandbox_id"]) == [])
        async with sandbox.resume_session(ref, **_options(fake)) as resumed:
            [info] = resumed.pty_processes()
            assert info.process_id == started.process_id and not info.running
            done = await resumed.pty_write_stdin(started.process_id, "")
            assert "no longer has this terminal" in done.output
            assert "printed meanwhile" not in done.output  # nothing was reattached
            assert done.process_id is None
        assert fake.open_streams() == []


async def test_a_terminal_the_provider_lost_is_reported_not_dropped(tmp_path):
    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        session = sandbox.open_session("daytona", **_options(fake))
        await session.start()
        started = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        ref = await session.detach()
        # The daemon forgot it (restarted): the ref names a PTY session it does not know.
        # Made in code (a ref read back as JSON must carry the library's own seal).
        first = ref.processes[0]
        handle = {**first.handle, "pty_id": "sandbox-pty-tgone-000000000000"}
        lost = dataclasses.replace(ref, processes=(dataclasses.replace(first, handle=handle),))
        async with sandbox.resume_session(lost, **_options(fake)) as resumed:
            done = await resumed.pty_write_stdin(started.process_id, "")
            assert "no longer has this terminal" in done.output
        assert await eventually(lambda: fake.leftover_pids() == [])


async def test_a_failed_reconnect_fails_the_resume_and_leaves_the_terminal(tmp_path):
    from daytona import DaytonaConnectionError

    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        session = sandbox.open_session("daytona", **_options(fake))
        await session.start()
        started = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        ref = await session.detach()
        # A transport failure is not "gone": the daemon still has the session.
        fake.fail("connect_pty_session", DaytonaConnectionError("connection reset by peer"))
        with pytest.raises(sandbox.ConnectionLostError):
            async with sandbox.resume_session(ref, **_options(fake)):
                pass
        assert fake.pty_ids(ref.sandbox["sandbox_id"]) == [ref.processes[0].handle["pty_id"]]
        async with sandbox.resume_session(ref, **_options(fake)) as again:
            echoed = await again.pty_write_stdin(started.process_id, "x1\n", until="x1")
            assert "x1" in echoed.output


async def test_a_cancelled_reconnect_lets_go_of_the_terminal(tmp_path):
    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        session = sandbox.open_session("daytona", **_options(fake))
        await session.start()
        started = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        ref = await session.detach()
        for after in (False, True):
            gate = fake.block("connect_pty_session", after=after)
            resumed = sandbox.resume_session(ref, **_options(fake))
            starting = asyncio.ensure_future(resumed.start())
            await gate.reached.wait()
            starting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await starting
            gate.release()
            assert fake.open_streams() == []
            assert fake.pty_ids(ref.sandbox["sandbox_id"]) == [ref.processes[0].handle["pty_id"]]
        async with sandbox.resume_session(ref, **_options(fake)) as again:
            [info] = again.pty_processes()
            assert info.process_id == started.process_id and info.running


# ---- crash survival: the fake stays in this process, the SIGKILLed client in a child ---


@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "terminal"])
async def test_sigkilled_client_is_resumed_from_its_ref_file(tmp_path, tty):
    from sandbox.testing.remote_fake import FakeServer
    from tests.durable.crash import crash_with_a_process, socket_path

    ref_file = tmp_path / "ref.json"
    script = (
        "echo before; while [ ! -e go ]; do sleep 0.02; done; echo during; touch printed; "
        "while [ ! -e go2 ]; do sleep 0.02; done; echo after; exit 6"
    )
    with socket_path() as path:
        async with (
            FakeDaytona(api_key=API_KEY, root=tmp_path / "daytona") as fake,
            FakeServer(fake.AsyncDaytona, path) as server,
        ):
            process_id = await crash_with_a_process(
                "daytona",
                {"api_key": API_KEY, "terminate_grace_s": 0.3},
                ref_file,
                ["sh", "-c", script],
                remote=(path, "daytona_class", None),
                tty=tty,
            )
            await server.wait_idle()  # the dead client's connections are closed
            assert fake.open_streams() == []
            ref = sandbox.read_ref_file(ref_file)
            [proc] = ref.processes
            assert proc.process_id == process_id and proc.running
            [sandbox_id] = fake.live_sandbox_ids()
            root = Path(fake.sandboxes[sandbox_id].root)
            # The daemon keeps the command (or terminal) running with nobody connected.
            (root / "go").touch()
            pty_id = proc.handle.get("pty_id", "")
            flag = root / "printed"
            assert await eventually(lambda: _printed_and_read(fake, sandbox_id, pty_id, flag))
            async with sandbox.resume_session(ref, **_options(fake)) as s:
                [info] = s.pty_processes()
                assert info.process_id == process_id and info.running
                await s.write_file("go2", b"")
                last = await s.pty_write_stdin(process_id, "", yield_time_s=10)
                assert "after" in last.output and last.exit_code == 6
                if tty:  # the daemon sent what the terminal printed meanwhile to nobody
                    assert "printed meanwhile is not shown" in last.output
                    assert "during" not in last.output
                else:  # a session command's log is kept whole: replayed from the ref's position
                    assert "during" in last.output
            assert fake.live_sandbox_ids() == []
            assert await eventually(lambda: fake.leftover_pids() == [])
            assert fake.open_streams() == []


async def test_a_reconnect_cancelled_while_looking_the_terminal_up_lets_go(tmp_path):
    from daytona import DaytonaConnectionError

    async with FakeDaytona(api_key=API_KEY, root=tmp_path) as fake:
        session = sandbox.open_session("daytona", **_options(fake))
        await session.start()
        started = await session.pty_exec_start("echo ready; exec cat", tty=True, until="ready")
        ref = await session.detach()
        fake.fail("connect_pty_session", DaytonaConnectionError("connection reset by peer"))
        gate = fake.block("get_pty_session_info")
        resumed = sandbox.resume_session(ref, **_options(fake))
        starting = asyncio.ensure_future(resumed.start())
        await gate.reached.wait()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        gate.release()
        assert resumed.state is sandbox.SessionState.NEW
        assert fake.open_streams() == []
        async with sandbox.resume_session(ref, **_options(fake)) as again:
            echoed = await again.pty_write_stdin(started.process_id, "x2\n", until="x2")
            assert "x2" in echoed.output
