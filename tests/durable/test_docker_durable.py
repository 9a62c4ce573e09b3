"""Detach, resume, takeover and crash survival on docker (the real engine), on the per-exec
path (`runner=False`: what a session without the runner promises); through the runner,
the default, in tests/backends/test_docker_runner.py and the durable conformance suite."""

from __future__ import annotations

import asyncio

import pytest

import sandbox
from tests.backend_fixtures import docker as docker_fixture
from tests.helpers import HookGate, eventually, host_pids_with_arg, unique_seconds

pytestmark = pytest.mark.skipif(
    docker_fixture.skip_reason() is not None, reason=str(docker_fixture.skip_reason())
)


def _exists(container_id: str) -> bool:
    import docker

    try:
        docker.APIClient(version="auto").inspect_container(container_id)
    except docker.errors.NotFound:
        return False
    return True


def _open(**options: object) -> sandbox.BaseSandboxSession:
    options.setdefault("runner", False)  # the per-exec path (the module docstring)
    return sandbox.open_session(
        "docker", image=docker_fixture.image(), terminate_grace_s=0.2, **options
    )


async def test_detach_kills_execs_keeps_the_container_and_resume_owns_it(tmp_path):
    marker = unique_seconds()
    session = _open(env={"API_TOKEN": "hunter2"})
    await session.start()
    container = session.container_id
    assert container is not None
    await session.write_file("note.txt", b"kept")
    update = await session.pty_exec_start("sleep", marker, tty=True, yield_time_s=0.2)
    ref = await session.detach()
    assert "hunter2" not in ref.to_json()
    assert host_pids_with_arg(marker) == []
    [proc] = ref.processes
    assert not proc.running and proc.exit_code is not None
    assert _exists(container)
    assert session.keeps_processes is False

    async with sandbox.resume_session(ref.to_json()) as resumed:
        assert await resumed.read_file("note.txt") == b"kept"
        [info] = resumed.pty_processes()
        assert info.process_id == update.process_id and not info.running
        assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"
    assert not _exists(container)  # the resumed close removed what the first created


async def test_resume_of_a_removed_container_is_session_gone():
    session = _open()
    await session.start()
    ref = await session.detach()
    import docker

    docker.APIClient(version="auto").remove_container(ref.sandbox["container_id"], force=True)
    with pytest.raises(sandbox.SessionGoneError):
        async with sandbox.resume_session(ref):
            pass


async def test_takeover_then_the_old_client_is_refused_and_its_close_lets_go():
    old = _open()
    await old.start()
    container = old.container_id
    ref = old.ref()
    async with sandbox.resume_session(ref) as new:
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.exec("true")
        await old.aclose()
        assert _exists(container)
        assert (await new.exec("true")).exit_code == 0
    assert not _exists(container)


async def test_close_racing_a_resume_leaves_one_owner():
    old = _open()
    await old.start()
    container = old.container_id
    ref = old.ref()
    gate = HookGate(old, "_stop_backend")
    closing = asyncio.ensure_future(old.aclose())
    await gate.reached.wait()  # the close has claimed the lease
    with pytest.raises(sandbox.SessionGoneError):
        async with sandbox.resume_session(ref):
            pass
    gate.release()
    await closing
    assert not _exists(container)


async def test_sigkilled_client_leaves_its_exec_running_until_the_resume(tmp_path):
    from tests.durable.crash import crash_with_a_process

    marker = unique_seconds()
    ref_file = tmp_path / "ref.json"
    process_id = await crash_with_a_process(
        "docker",
        {"image": docker_fixture.image(), "terminate_grace_s": 0.2, "runner": False},
        ref_file,
        ["sleep", marker],
    )
    # The engine keeps the exec running with nobody attached.
    assert host_pids_with_arg(marker) != []
    ref = sandbox.read_ref_file(ref_file)
    container = ref.sandbox["container_id"]
    try:
        async with sandbox.resume_session(ref) as s:
            assert await eventually(lambda: host_pids_with_arg(marker) == [])
            update = await s.pty_write_stdin(process_id, "")
            assert "cannot reattach" in update.output
        assert not _exists(container)
    finally:
        if _exists(container):
            import docker

            docker.APIClient(version="auto").remove_container(container, force=True)
