"""Detach, resume, takeover and the ref file on unix_local (real processes)."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

import sandbox
from tests.helpers import HookGate, eventually, host_pids_with_arg, unique_seconds


async def test_ref_round_trips_by_value(tmp_path):
    async with sandbox.open_session("unix_local", workdir=tmp_path, env={"TOKEN": "s3cret"}) as s:
        await s.pty_exec_start("sleep", unique_seconds(), yield_time_s=0.1)
        ref = s.ref()
        again = sandbox.SessionRef.from_json(ref.to_json())
        assert again == ref and hash(again) == hash(ref)
        assert sandbox.SessionRef.from_dict(ref.to_dict()) == ref
        assert ref.backend == "unix_local"
        assert ref.sandbox["workspace"] == os.path.realpath(tmp_path)
        [proc] = ref.processes
        assert proc.running and proc.command.startswith("sleep")
        assert "s3cret" not in ref.to_json()  # env values are never kept
        assert s.keeps_processes is False


@pytest.mark.parametrize(
    "text",
    ['{"version": 2}', "[]", "not json", '{"version": 1, "backend": "x"}'],
)
def test_bad_refs_are_refused(text):
    with pytest.raises(sandbox.InvalidArgumentError):
        sandbox.SessionRef.from_json(text)


async def test_detach_terminates_children_and_resume_reports_them(tmp_path):
    marker = unique_seconds()
    session = sandbox.open_session("unix_local")
    await session.start()
    workspace = session.workdir
    await session.write_file("kept.txt", b"still here")
    update = await session.pty_exec_start("sleep", marker, yield_time_s=0.1)
    pid = update.process_id
    assert pid is not None
    ref = await session.detach()
    assert host_pids_with_arg(marker) == []
    assert os.path.isdir(workspace)  # a temporary workspace outlives the detach
    [proc] = ref.processes
    assert not proc.running and proc.exit_code is not None and "cannot outlive" in (proc.note or "")
    with pytest.raises(sandbox.SessionClosedError):
        await session.exec("true")
    assert session.ref() == ref

    async with sandbox.resume_session(ref) as resumed:
        assert await resumed.read_file("kept.txt") == b"still here"
        [info] = resumed.pty_processes()
        assert info.process_id == pid and not info.running
        last = await resumed.pty_write_stdin(pid, "")
        assert last.process_id is None and last.exit_code == proc.exit_code
        result = await resumed.exec("echo", "hi")
        assert result.stdout == b"hi\n"
    assert not os.path.exists(workspace)  # the resumed close removes what the first made


async def test_resume_of_a_gone_workspace_is_session_gone(tmp_path):
    session = sandbox.open_session("unix_local")
    await session.start()
    ref = await session.detach()
    os.rmdir(ref.sandbox["workspace"])
    with pytest.raises(sandbox.SessionGoneError) as caught:
        async with sandbox.resume_session(ref):
            pass
    assert caught.value.retryable is False


async def test_resume_after_close_is_session_gone(tmp_path):
    async with sandbox.open_session("unix_local", workdir=tmp_path) as session:
        ref = session.ref()
    with pytest.raises(sandbox.SessionGoneError):
        async with sandbox.resume_session(ref):
            pass


async def test_takeover_locks_the_old_client_out_and_its_close_leaves_things(tmp_path):
    marker = unique_seconds()
    old = sandbox.open_session("unix_local", workdir=tmp_path)
    await old.start()
    await old.pty_exec_start("sleep", marker, yield_time_s=0.1)
    ref = old.ref()
    async with sandbox.resume_session(ref) as new:
        # The old client's child cannot be held by the new owner: it was ended.
        assert await eventually(lambda: host_pids_with_arg(marker) == [])
        mine = await new.pty_exec_start("sleep", marker + "1", yield_time_s=0.1)
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.exec("true")
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.pty_exec_start("true")
        await old.aclose()  # leaves the workspace and the new owner's process alone
        assert host_pids_with_arg(marker + "1") != []
        assert (await new.exec("pwd")).stdout.strip() == os.path.realpath(tmp_path).encode()
        await new.pty_terminate(mine.process_id)


async def test_takeover_after_the_old_close_is_gone(tmp_path):
    old = sandbox.open_session("unix_local", workdir=tmp_path)
    await old.start()
    ref = old.ref()
    await old.aclose()
    with pytest.raises(sandbox.SessionGoneError):
        async with sandbox.resume_session(ref):
            pass


@pytest.mark.parametrize("winner", ["close", "resume"])
async def test_resume_racing_the_old_close_leaves_one_owner(tmp_path, winner):
    old = sandbox.open_session("unix_local")
    await old.start()
    workspace = old.workdir
    ref = old.ref()
    new = sandbox.resume_session(ref)
    if winner == "close":
        # The close has claimed the lease and is tearing down when the resume arrives.
        gate = HookGate(old, "_stop_backend")
        closing = asyncio.ensure_future(old.aclose())
        await gate.reached.wait()
        with pytest.raises(sandbox.SessionGoneError):
            await new.start()
        gate.release()
        await closing
        assert not os.path.exists(workspace)
    else:
        # The resume has attached and is about to take the lease when the close starts.
        gate = HookGate(new, "durability.resume", after=True)
        starting = asyncio.ensure_future(new.start())
        await gate.reached.wait()
        gate.release()
        await starting
        await old.aclose()
        assert os.path.isdir(workspace)  # the close lost: it let go
        assert (await new.exec("true")).exit_code == 0
        await new.aclose()
        assert not os.path.exists(workspace)


async def test_cancelled_resume_leaves_the_ref_the_owner(tmp_path):
    session = sandbox.open_session("unix_local", workdir=tmp_path)
    await session.start()
    ref = await session.detach()
    new = sandbox.resume_session(ref)
    gate = HookGate(new, "durability.resume", after=True)
    starting = asyncio.ensure_future(new.start())
    await gate.reached.wait()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert new.state is sandbox.SessionState.NEW
    assert os.path.isdir(tmp_path)
    async with sandbox.resume_session(ref) as again:
        assert (await again.exec("true")).exit_code == 0


async def test_cancelled_detach_still_hands_the_sandbox_to_the_ref(tmp_path):
    marker = unique_seconds()
    session = sandbox.open_session("unix_local", workdir=tmp_path)
    await session.start()
    await session.pty_exec_start("sleep", marker, yield_time_s=0.1)
    gate = HookGate(session, "durability.detach")
    detaching = asyncio.ensure_future(session.detach())
    await gate.reached.wait()
    detaching.cancel()
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await detaching
    assert session.state is sandbox.SessionState.CLOSED
    ref = session.ref()
    assert host_pids_with_arg(marker) == []
    async with sandbox.resume_session(ref) as again:
        assert len(again.pty_processes()) == 1


async def test_ref_file_is_kept_current_and_private(tmp_path):
    path = tmp_path / "ref.json"
    async with sandbox.open_session("unix_local", ref_file=path) as session:
        first = sandbox.read_ref_file(path)
        assert first.processes == ()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        update = await session.pty_exec_start("sleep", unique_seconds(), yield_time_s=0.1)
        assert [p.process_id for p in sandbox.read_ref_file(path).processes] == [update.process_id]
        await session.pty_terminate(update.process_id)
        assert sandbox.read_ref_file(path).processes == ()
    assert not path.exists()  # closed: the sandbox it named is gone


async def test_ref_file_replaces_a_planted_symlink_without_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path = tmp_path / "ref.json"
    os.symlink(victim, path)
    async with sandbox.open_session("unix_local", ref_file=path) as session:
        assert not os.path.islink(path)
        assert victim.read_text() == "keep"
        ref = await session.detach()
    assert json.loads(path.read_text())["session_id"] == ref.session_id


async def test_sigkilled_client_is_resumed_from_its_ref_file(tmp_path):
    from tests.durable.crash import crash_with_a_process

    marker = unique_seconds()
    ref_file = tmp_path / "ref.json"
    process_id = await crash_with_a_process("unix_local", {}, ref_file, ["sleep", marker])
    # The orphan outlived its client (nothing reads its pipes now).
    assert host_pids_with_arg(marker) != []
    ref = sandbox.read_ref_file(ref_file)
    assert [p.process_id for p in ref.processes] == [process_id]
    async with sandbox.resume_session(ref) as s:
        assert await eventually(lambda: host_pids_with_arg(marker) == [])
        [info] = s.pty_processes()
        assert info.process_id == process_id and not info.running
        update = await s.pty_write_stdin(process_id, "")
        assert "child of the client" in update.output
        assert (await s.exec("true")).exit_code == 0
    assert not os.path.exists(ref.sandbox["workspace"])


def test_ref_file_on_a_backend_without_durable_hooks_is_refused(tmp_path):
    from sandbox.backend import BaseSandboxSession

    class Plain(BaseSandboxSession):
        backend_name = "plain"

    with pytest.raises(sandbox.UnsupportedOperationError):
        Plain(ref_file=tmp_path / "ref.json")
    assert not (tmp_path / "ref.json").exists()
