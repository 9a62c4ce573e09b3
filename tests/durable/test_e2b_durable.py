"""Detach, resume (reattach by pid), takeover on e2b, against the SDK fake."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("e2b")

import sandbox
from sandbox.testing.e2b_fake import FakeE2B
from tests.helpers import HookGate, eventually

API_KEY = "e2b_fake_durable_key_0123456789"


def _open(fake: FakeE2B, **options: object) -> sandbox.BaseSandboxSession:
    return sandbox.open_session(
        "e2b", api_key=API_KEY, sandbox_class=fake.AsyncSandbox, teardown_timeout_s=5.0, **options
    )


def _resume(fake: FakeE2B, ref: sandbox.SessionRef) -> sandbox.BaseSandboxSession:
    return sandbox.resume_session(ref, api_key=API_KEY, sandbox_class=fake.AsyncSandbox)


async def test_detached_processes_keep_running_and_are_reattached(tmp_path):
    async with FakeE2B(api_key=API_KEY, root=tmp_path) as fake:
        session = _open(fake)
        await session.start()
        assert session.keeps_processes is True
        gate_file = "go"
        update = await session.pty_exec_start(
            f"echo before; while [ ! -e {gate_file} ]; do sleep 0.02; done; echo after; exit 7",
            yield_time_s=0.5,
            until="before",
        )
        pid = update.process_id
        assert pid is not None and "before" in update.output
        term = await session.pty_exec_start("cat", tty=True, yield_time_s=0.5)
        ref = await session.detach()
        assert API_KEY not in ref.to_json()
        assert [p.running for p in ref.processes] == [True, True]
        assert fake.live_sandbox_ids() != []

        async with _resume(fake, ref) as resumed:
            assert {p.process_id for p in resumed.pty_processes()} == {pid, term.process_id}
            await resumed.write_file(gate_file, b"")
            last = await resumed.pty_write_stdin(pid, "", yield_time_s=10)
            assert "printed meanwhile is not shown" in last.output
            assert "after" in last.output and last.exit_code == 7
            echoed = await resumed.pty_write_stdin(term.process_id, "hello\n", until="hello")
            assert "hello" in echoed.output
        assert fake.live_sandbox_ids() == []
        assert await eventually(lambda: fake.leftover_pids() == [])


async def test_a_process_that_ended_while_detached_is_reported_with_a_note(tmp_path):
    async with FakeE2B(api_key=API_KEY, root=tmp_path) as fake:
        session = _open(fake)
        await session.start()
        update = await session.pty_exec_start("sleep 0.3", yield_time_s=0.1)
        ref = await session.detach()
        [proc] = ref.processes
        ref_pid = proc.handle["pid"]
        # It ends while no client is connected (envd then forgets it).
        state = fake._sandboxes[ref.sandbox["sandbox_id"]]
        handle = state.processes[ref_pid]
        assert await eventually(lambda: handle.ended)
        async with _resume(fake, ref) as again:
            done = await again.pty_write_stdin(update.process_id, "")
            assert "no longer has this process" in done.output
            assert done.process_id is None


async def test_gone_sandbox_and_takeover(tmp_path):
    async with FakeE2B(api_key=API_KEY, root=tmp_path) as fake:
        old = _open(fake)
        await old.start()
        ref = old.ref()
        async with _resume(fake, ref) as new:
            with pytest.raises(sandbox.SessionTakenOverError):
                await old.exec("true")
            await old.aclose()  # lets go: the sandbox is the new owner's
            assert fake.live_sandbox_ids() != []
            assert (await new.exec("echo", "ok")).stdout == b"ok\n"
        with pytest.raises(sandbox.SessionGoneError):
            async with _resume(fake, ref):
                pass


async def test_cancelled_reattach_releases_without_killing(tmp_path):
    async with FakeE2B(api_key=API_KEY, root=tmp_path) as fake:
        session = _open(fake)
        await session.start()
        update = await session.pty_exec_start("sleep 30", yield_time_s=0.1)
        ref = await session.detach()
        resumed = _resume(fake, ref)
        gate = HookGate(resumed, "durability.reattach", after=True)
        starting = asyncio.ensure_future(resumed.start())
        await gate.reached.wait()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert fake.open_streams() == []
        async with _resume(fake, ref) as again:
            [info] = again.pty_processes()
            assert info.process_id == update.process_id and info.running


@pytest.mark.parametrize("tty", [False, True], ids=["pipes", "terminal"])
async def test_sigkilled_client_is_resumed_from_its_ref_file(tmp_path, tty):
    from sandbox.testing.remote_fake import FakeServer
    from tests.durable.crash import crash_with_a_process, socket_path

    ref_file = tmp_path / "ref.json"
    with socket_path() as path:
        async with (
            FakeE2B(api_key=API_KEY, root=tmp_path / "e2b") as fake,
            FakeServer(fake.AsyncSandbox, path) as server,
        ):
            process_id = await crash_with_a_process(
                "e2b",
                {"api_key": API_KEY, "teardown_timeout_s": 5.0},
                ref_file,
                [
                    "sh",
                    "-c",
                    "echo before; while [ ! -e go ]; do sleep 0.02; done; echo after; exit 7",
                ],
                remote=(path, "sandbox_class", None),
                tty=tty,
            )
            await server.wait_idle()  # the dead client's SDK objects are gone with it
            assert fake.open_streams() == []
            ref = sandbox.read_ref_file(ref_file)
            [proc] = ref.processes
            assert proc.process_id == process_id and proc.running
            # envd keeps the process running with nobody connected.
            assert fake.live_sandbox_ids() == [ref.sandbox["sandbox_id"]]
            assert fake.process(proc.handle["pid"]).running
            async with _resume(fake, ref) as s:
                [info] = s.pty_processes()
                assert info.process_id == process_id and info.running
                await s.write_file("go", b"")
                last = await s.pty_write_stdin(process_id, "", yield_time_s=10)
                assert "printed meanwhile is not shown" in last.output
                assert "after" in last.output and last.exit_code == 7
            assert fake.live_sandbox_ids() == []
            assert await eventually(lambda: fake.leftover_pids() == [])
            assert server.clients_served == 1
