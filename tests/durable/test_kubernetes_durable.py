"""Detach, resume, takeover and crash survival on kubernetes, against the loopback API
server (`sandbox.testing.kubernetes_server`): real sockets, real processes behind it, a
kubeconfig written by the test (its bearer token must never reach a ref). On the
per-exec path (`runner=False`: what a session without the runner promises); through the
runner, the default, in tests/backends/test_kubernetes_runner.py and the durable
conformance suite."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import sandbox
from sandbox.backends.kubernetes import KubernetesSession
from sandbox.backends.kubernetes.scripts import KEEPALIVE
from sandbox.backends.toolkit.shell import KILL_NAME
from sandbox.testing.kubernetes_server import KubernetesApiServer
from tests.helpers import HookGate, eventually, host_pids_with_arg, unique_seconds

TOKEN = "k8s-durable-token-SECRET-41e9a0"
ENV_SECRET = "env-value-SECRET-77d1"


@pytest.fixture
async def server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[KubernetesApiServer]:
    # A resume takes no kubeconfig from the ref: this client's environment names it.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    async with KubernetesApiServer(token=TOKEN, root=tmp_path / "cluster") as srv:
        yield srv


def _kubeconfig(server: KubernetesApiServer, tmp_path: Path) -> str:
    return str(server.write_kubeconfig(tmp_path / "kubeconfig"))


def _open(server: KubernetesApiServer, tmp_path: Path, **options: Any) -> KubernetesSession:
    options.setdefault("image", "busybox")
    options.setdefault("runner", False)  # the per-exec path (the module docstring)
    s = sandbox.open_session(
        "kubernetes", kubeconfig=_kubeconfig(server, tmp_path), terminate_grace_s=0.2, **options
    )
    assert isinstance(s, KubernetesSession)
    return s


async def _nothing_left(server: KubernetesApiServer) -> None:
    assert await eventually(lambda: server.pods == {} and server.live_processes() == 0)


async def _api(server: KubernetesApiServer, method: str, path: str, body: Any = None) -> int:
    """One call to the stand-in as another cluster user would make it (kubectl)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, server.url + path, json=body, headers=headers) as reply,
    ):
        await reply.read()
        return reply.status


def _pod_path(ref: sandbox.SessionRef) -> str:
    return f"/api/v1/namespaces/{ref.sandbox['namespace']}/pods/{ref.sandbox['pod']}"


async def test_detach_kills_the_execs_keeps_the_pod_and_the_resume_deletes_it(server, tmp_path):
    marker = unique_seconds()
    session = _open(server, tmp_path, env={"API_TOKEN": ENV_SECRET})
    await session.start()
    name = session.pod_name
    await session.write_file("note.txt", b"kept")
    tty = await session.pty_exec_start("sleep", marker, tty=True, yield_time_s=0.2)
    pipes = await session.pty_exec_start("sleep", marker, tty=False, yield_time_s=0.2)
    assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
    ref = await session.detach()

    # Both trees were killed by tag before the detach returned; the pod runs on.
    assert host_pids_with_arg(marker) == []
    assert session.keeps_processes is False and ref.keeps_processes is False
    assert [p.process_id for p in ref.processes] == [tty.process_id, pipes.process_id]
    for proc in ref.processes:
        assert not proc.running and proc.exit_code is not None and proc.handle == {}
        assert "cannot outlive" in (proc.note or "")
    assert list(server.pods) == [("default", name)]
    assert ref.sandbox["pod"] == name and ref.sandbox["created"] == name
    assert ref.sandbox["uid"] == server.pods[("default", name)].obj["metadata"]["uid"]

    async with sandbox.resume_session(ref.to_json()) as resumed:
        assert isinstance(resumed, KubernetesSession) and resumed.pod_name == name
        assert resumed.session_label == session.session_label
        assert await resumed.read_file("note.txt") == b"kept"
        # The lease lives in the container's TMPDIR, not among the user's files.
        assert [f.name for f in await resumed.list_dir(".")] == ["note.txt"]
        infos = resumed.pty_processes()
        assert [i.process_id for i in infos] == [tty.process_id, pipes.process_id]
        assert not any(i.running for i in infos)
        assert (await resumed.exec("echo", "ok")).stdout == b"ok\n"
    # The resumed close deleted the pod the first session had created.
    assert server.deleted == [name]
    await _nothing_left(server)


async def test_the_ref_holds_the_kubeconfig_path_never_its_token(server, tmp_path):
    async with _open(server, tmp_path, env={"API_TOKEN": ENV_SECRET}) as session:
        await session.pty_exec_start("sleep 30", yield_time_s=0.1)
        ref = session.ref()
        text = ref.to_json()
        for secret in (TOKEN, ENV_SECRET):
            assert secret not in text and secret not in repr(ref)
        assert ref.options["kubeconfig"] == _kubeconfig(server, tmp_path)
        assert ref.options["context"] == "standin"
        assert ref.sandbox["namespace"] == "default"
        [proc] = ref.processes
        assert set(proc.handle) == {"tag"}
    await _nothing_left(server)


async def test_an_attached_pod_is_left_running_by_the_resumed_close(server, tmp_path):
    async with _open(server, tmp_path, keep=True) as first:
        name = first.pod_name
    attached = _open(server, tmp_path, image=None, pod=name)
    await attached.start()
    ref = await attached.detach()
    assert ref.sandbox["created"] is None
    async with sandbox.resume_session(ref) as resumed:
        assert (await resumed.exec("true")).exit_code == 0
    assert list(server.pods) == [("default", name)] and server.deleted == []
    # ... and its lease says the session was closed: it cannot be resumed again.
    with pytest.raises(sandbox.SessionGoneError):
        async with sandbox.resume_session(ref):
            pass


async def test_a_deleted_pod_is_session_gone(server, tmp_path):
    session = _open(server, tmp_path)
    await session.start()
    ref = await session.detach()
    status = await _api(server, "DELETE", _pod_path(ref), {"gracePeriodSeconds": 0})
    assert status == 200 and server.pods == {}
    with pytest.raises(sandbox.SessionGoneError) as caught:
        async with sandbox.resume_session(ref):
            pass
    assert caught.value.retryable is False
    await _nothing_left(server)


async def test_a_shared_session_whose_pod_was_deleted_says_gone(server, tmp_path):
    session = _open(server, tmp_path)
    await session.start()
    ref = session.ref()  # shared: each call reads the lease in the pod
    await _api(server, "DELETE", _pod_path(ref), {"gracePeriodSeconds": 0})
    with pytest.raises(sandbox.SessionGoneError, match="is gone"):
        await session.exec("true")
    await session.aclose()  # nothing left to claim or tear down: it only lets go
    assert server.deleted == [ref.sandbox["pod"]]
    await _nothing_left(server)


async def test_a_pod_being_deleted_is_session_gone(server, tmp_path):
    server.stuck_deletion = True  # the object stays, with its deletionTimestamp
    session = _open(server, tmp_path)
    await session.start()
    ref = await session.detach()
    assert await _api(server, "DELETE", _pod_path(ref), {"gracePeriodSeconds": 30}) == 200
    with pytest.raises(sandbox.SessionGoneError, match="being deleted"):
        async with sandbox.resume_session(ref):
            pass
    assert await _api(server, "DELETE", _pod_path(ref), {"gracePeriodSeconds": 0}) == 200
    await _nothing_left(server)


async def test_a_pod_made_again_under_the_same_name_is_session_gone(server, tmp_path):
    session = _open(server, tmp_path)
    await session.start()
    await session.write_file("mine.txt", b"x")
    ref = await session.detach()
    await _api(server, "DELETE", _pod_path(ref), {"gracePeriodSeconds": 0})
    manifest = {
        "metadata": {"name": ref.sandbox["pod"]},
        "spec": {
            "containers": [
                {"name": "sandbox", "image": "busybox", "command": KEEPALIVE, "stdin": True}
            ]
        },
    }
    path = _pod_path(ref).rsplit("/", 1)[0]
    assert await _api(server, "POST", path, manifest) == 201
    key = (ref.sandbox["namespace"], ref.sandbox["pod"])
    assert await eventually(lambda: server.pods[key].obj["status"]["phase"] == "Running")
    with pytest.raises(sandbox.SessionGoneError, match="another uid"):
        async with sandbox.resume_session(ref):
            pass
    # The impostor is somebody else's: the failed resume left it alone.
    assert key in server.pods and server.deleted == [key[1]]


async def test_takeover_refuses_the_old_client_and_its_close_lets_go(server, tmp_path):
    marker = unique_seconds()
    old = _open(server, tmp_path)
    await old.start()
    name = old.pod_name
    ref = old.ref()
    async with sandbox.resume_session(ref) as new:
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.exec("true")
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.pty_exec_start("sleep", marker)
        await old.aclose()  # lets go: nothing of the new owner's is touched
        assert list(server.pods) == [("default", name)] and server.deleted == []
        started = await new.pty_exec_start("sleep", marker, yield_time_s=0.1)
        assert started.process_id is not None
        assert (await new.exec("echo", "mine")).stdout == b"mine\n"
        assert len(host_pids_with_arg(marker)) == 1
    assert server.deleted == [name]
    await _nothing_left(server)


async def test_takeover_then_the_new_owner_closes_first(server, tmp_path):
    old = _open(server, tmp_path)
    await old.start()
    ref = old.ref()
    async with sandbox.resume_session(ref):
        pass  # deletes the pod: the new owner's to delete
    await _nothing_left(server)
    # The old client finds nothing to claim: its close ends without touching anything.
    await old.aclose()
    assert old.state is sandbox.SessionState.CLOSED


async def test_a_close_holding_the_lease_beats_a_resume(server, tmp_path):
    old = _open(server, tmp_path)
    await old.start()
    ref = old.ref()
    gate = HookGate(old, "_stop_backend")
    closing = asyncio.ensure_future(old.aclose())
    await gate.reached.wait()  # the close has claimed the lease ("closing")
    with pytest.raises(sandbox.SessionGoneError):
        async with sandbox.resume_session(ref):
            pass
    gate.release()
    await closing
    await _nothing_left(server)


async def test_a_close_before_the_resume_takes_the_lease_wins(server, tmp_path):
    old = _open(server, tmp_path)
    await old.start()
    ref = old.ref()
    resumed = sandbox.resume_session(ref)
    gate = HookGate(resumed, "durability.resume", after=True)  # attached, lease not yet taken
    starting = asyncio.ensure_future(resumed.start())
    await gate.reached.wait()
    await old.aclose()  # still the owner: deletes the pod
    gate.release()
    with pytest.raises(sandbox.SessionGoneError):
        await starting
    assert resumed.state is sandbox.SessionState.NEW
    await _nothing_left(server)


@pytest.mark.parametrize("parked", ["kill", "lease"])
async def test_a_resume_cancelled_at_its_own_execs_leaves_the_ref_the_owner(
    server, tmp_path, parked
):
    marker = unique_seconds()
    old = _open(server, tmp_path)
    await old.start()
    await old.pty_exec_start("sleep", marker, yield_time_s=0.1)
    ref = old.ref()  # lists the process as running, with its tag
    name = KILL_NAME if parked == "kill" else "sandbox-lease"
    stall = server.stall("exec", where=lambda argv: name in argv, times=1)
    resumed = sandbox.resume_session(ref)
    starting = asyncio.ensure_future(resumed.start())
    await stall.reached.wait()  # the kill (or the lease check) exec parked at its upgrade
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert await eventually(lambda: stall.abandoned.is_set())
    assert resumed.state is sandbox.SessionState.NEW
    # The kill never ran, or ran before the lease was taken: the lease is the old one.
    assert len(host_pids_with_arg(marker)) == (1 if parked == "kill" else 0)
    # The ref still owns the pod: the old client goes on, a new resume takes over.
    assert (await old.exec("true")).exit_code == 0
    stall.release()
    async with sandbox.resume_session(ref) as again:
        assert host_pids_with_arg(marker) == []
        with pytest.raises(sandbox.SessionTakenOverError):
            await old.exec("true")
        await old.aclose()
        assert (await again.exec("true")).exit_code == 0
    await _nothing_left(server)


@pytest.mark.parametrize("tty", [False, True])
async def test_sigkilled_client_leaves_its_exec_running_until_the_resume(server, tmp_path, tty):
    from tests.durable.crash import crash_with_a_process

    marker = unique_seconds()
    ref_file = tmp_path / "ref.json"
    options = {"kubeconfig": _kubeconfig(server, tmp_path), "image": "busybox", "runner": False}
    process_id = await crash_with_a_process(
        "kubernetes", options, ref_file, ["sleep", marker], tty=tty
    )
    assert os.stat(ref_file).st_mode & 0o777 == 0o600
    assert TOKEN not in ref_file.read_text()
    # The exec's socket died with the client; its process did not (a tty is not hung
    # up, a pipes process keeps running), and nobody reads it.
    assert await eventually(lambda: server.open_execs() == 0)
    assert len(host_pids_with_arg(marker)) == 1
    ref = sandbox.read_ref_file(ref_file)
    [proc] = ref.processes
    assert proc.process_id == process_id and proc.running and proc.tty is tty
    assert set(proc.handle) == {"tag"}

    async with sandbox.resume_session(ref, ref_file=str(ref_file)) as s:
        # Killed by its tag at the resume, and reported as ended, with a note.
        assert host_pids_with_arg(marker) == []
        update = await s.pty_write_stdin(process_id, "")
        assert "cannot reattach" in update.output
        [info] = s.pty_processes() or [None]
        assert info is None or not info.running
        assert json.loads(ref_file.read_text())["session_id"] == ref.session_id
    assert not ref_file.exists()  # the close deleted the pod, and removed the file
    await _nothing_left(server)
