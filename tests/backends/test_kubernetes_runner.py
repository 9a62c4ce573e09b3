"""kubernetes through the runner (docs/runner.md), its default, on the loopback API server
whose pods run real local processes: delivery by an exec with stdin, checked by
content; a second session finds the same runner; a dropped link kills nothing; a pod's
deletion ends its runner and everything it keeps; open stdin through the runner under
v4 too. And the `runner` option itself: auto (None, the default) uses the runner and
falls back to the per-exec path with its reason where the pod cannot take it, True
requires it, False never uses it, and `keeps_processes` and a ref follow what the
session used.

The conformance and durable suites run on both paths (fixtures `kubernetes`, the
default, and `kubernetes_exec`, `runner=False`); these are the runner's own promises on
this backend.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import sandbox
from sandbox.backends.kubernetes import KubernetesSession
from sandbox.backends.kubernetes.client import V4_PROTOCOL
from sandbox.backends.kubernetes.runner_link import runner_name
from sandbox.runner import runner_binary, unavailable_reason
from sandbox.testing.kubernetes_server import KubernetesApiServer
from tests.backend_fixtures.kubernetes import assert_runner_gone, processes_mentioning
from tests.conftest import skip_or_fail
from tests.helpers import eventually, host_pids_with_arg

TOKEN = "k8s-runner-token-3b9e0f"


@pytest.fixture(autouse=True)
def _runner_built() -> None:
    reason = unavailable_reason()
    if reason:
        skip_or_fail(f"kubernetes runner: {reason}")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[KubernetesApiServer]:
    async with KubernetesApiServer(token=TOKEN, root=tmp_path / "cluster") as srv:
        yield srv


def _kubeconfig(server: KubernetesApiServer, tmp_path: Path) -> str:
    return str(server.write_kubeconfig(tmp_path / "kubeconfig"))


def open_k8s(server: KubernetesApiServer, tmp_path: Path, **options: Any) -> KubernetesSession:
    options.setdefault("image", "busybox")
    s = sandbox.open_session(
        "kubernetes", kubeconfig=_kubeconfig(server, tmp_path), runner=True, **options
    )
    assert isinstance(s, KubernetesSession)
    return s


def uploads(server: KubernetesApiServer) -> int:
    return sum("sandbox-runner-upload" in argv for argv in server.exec_argvs)


def runner_file(server: KubernetesApiServer) -> Path:
    binary = runner_binary()
    assert binary is not None
    [folder] = server.runner_dirs
    return Path(folder) / runner_name(binary)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_delivered_once_a_second_session_finds_the_same_runner_a_forged_one_is_replaced(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    binary = runner_binary()
    assert binary is not None
    async with open_k8s(server, tmp_path) as first:
        assert (await first.exec("echo", "one")).stdout == b"one\n"
        assert uploads(server) == 1
        path = runner_file(server)
        assert digest(path) == binary.sha256
        assert first._runner is not None and first._runner.client.hello is not None
        runner_pid = first._runner.client.hello.pid
        # The runner runs from the pod's own folder: the exec really ran the binary.
        assert os.readlink(f"/proc/{runner_pid}/exe") == str(path)

        # A second client of the same pod: the same bytes are there, so no upload, and
        # `connect --start` reaches the runner already running.
        second = open_k8s(server, tmp_path, image=None, pod=first.pod_name)
        async with second:
            assert (await second.exec("echo", "two")).stdout == b"two\n"
            assert second._runner is not None and second._runner.client.hello is not None
            assert second._runner.client.hello.pid == runner_pid
        assert uploads(server) == 1

        # Something else at the runner's name (a pod may write anything there): the next
        # session sees other bytes, puts ours back, and works.
        forged = path.with_name("forged")
        forged.write_bytes(b"#!/bin/sh\necho forged\n")
        forged.chmod(0o755)
        os.replace(forged, path)
        third = open_k8s(server, tmp_path, image=None, pod=first.pod_name)
        async with third:
            assert (await third.exec("echo", "three")).stdout == b"three\n"
        assert uploads(server) == 2
        assert digest(path) == binary.sha256
    assert_runner_gone(list(server.runner_dirs))


async def test_a_dropped_link_kills_nothing(server: KubernetesApiServer, tmp_path: Path) -> None:
    async with open_k8s(server, tmp_path) as s:
        started = await s.pty_exec_start(
            "while [ ! -e stop ]; do sleep 0.02; done; echo stopped", yield_time_s=0.2
        )
        assert started.process_id is not None
        ref = s.ref()
        runner = s._runner
        assert runner is not None
        # Every exec socket goes at once, the runner's bridge among them (a broken
        # connection to the API server).
        assert server.drop_exec_sockets() >= 1
        await runner.client.wait_closed()
        update = await s.pty_write_stdin(started.process_id, "", yield_time_s=5)
        assert update.exit_code is None and "process lost" in update.output
        # The runner still keeps it: a resumed client (the ref's takeover) reattaches.
        async with sandbox.resume_session(ref, kubeconfig=_kubeconfig(server, tmp_path)) as resumed:
            assert resumed.keeps_processes
            await resumed.write_file("stop", b"")
            last = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=30)
            assert "stopped" in last.output and last.exit_code == 0
    assert await eventually(lambda: server.pods == {})
    assert_runner_gone(list(server.runner_dirs))


async def test_the_pods_deletion_ends_its_runner_and_all_it_keeps(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    marker = f"kept{secrets.token_hex(4)}"
    s = open_k8s(server, tmp_path)
    await s.start()
    # An escapee that leaves its session, beside a plain one: both kept by the runner.
    started = await s.pty_exec_start(
        f'cp "$(command -v sleep)" ./{marker} && PATH=$PWD:$PATH && '
        f"{{ setsid {marker} 600 & }} && exec {marker} 600",
        yield_time_s=0.3,
    )
    assert started.process_id is not None
    assert s._runner is not None and s._runner.client.hello is not None
    runner_pid = s._runner.client.hello.pid
    ref = await s.detach()
    assert ref.keeps_processes and ref.processes[0].running
    assert await eventually(lambda: len(host_pids_with_arg(marker)) == 2)
    assert os.path.exists(f"/proc/{runner_pid}")
    # Nobody is connected; the pod is deleted (as `kubectl delete pod` would).
    async with aiohttp.ClientSession() as http:
        async with http.delete(
            f"{server.url}/api/v1/namespaces/default/pods/{s.pod_name}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={"gracePeriodSeconds": 0},
        ) as response:
            assert response.status == 200
    assert server.pods == {}
    assert await eventually(lambda: host_pids_with_arg(marker) == [])
    assert await eventually(lambda: not _alive(runner_pid))
    assert_runner_gone(list(server.runner_dirs))
    with pytest.raises(sandbox.SessionGoneError):
        async with sandbox.resume_session(ref, kubeconfig=_kubeconfig(server, tmp_path)):
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


async def test_open_stdin_through_the_runner_under_v4(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    # v4 cannot end an exec's stdin; the runner ends its process's input itself.
    async with open_k8s(server, tmp_path, protocols=(V4_PROTOCOL,)) as s:
        started = await s.pty_exec_start("sort", tty=False, stdin=True, yield_time_s=0.1)
        assert started.process_id is not None
        await s.pty_write_stdin(started.process_id, "pear\napple\n")
        await s.pty_close_stdin(started.process_id)
        last = await s.pty_write_stdin(started.process_id, "", yield_time_s=10)
        assert last.output.replace("\r", "") == "apple\npear\n" and last.exit_code == 0
    assert await eventually(lambda: server.pods == {} and server.live_processes() == 0)


async def test_the_tree_kill_reaches_double_forked_and_setsid_escapees(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    marker = f"esc{secrets.token_hex(4)}"
    async with open_k8s(server, tmp_path, terminate_grace_s=0) as s:
        started = await s.pty_exec_start(
            f'cp "$(command -v sleep)" ./{marker} && PATH=$PWD:$PATH && '
            f"{{ ( {marker} 600 & ) ; setsid {marker} 600 & }} && exec {marker} 600",
            yield_time_s=0.3,
        )
        assert started.process_id is not None
        assert await eventually(lambda: len(host_pids_with_arg(marker)) == 3)
        await s.pty_terminate(started.process_id)
        # Gone before the pod is: the runner's kill, not the pod's deletion.
        assert await eventually(lambda: host_pids_with_arg(marker) == [])
        assert server.pods != {}


async def test_runner_dir_places_the_runner_and_a_socket_path_too_long_is_refused(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    binary = runner_binary()
    assert binary is not None
    folder = tempfile.mkdtemp(prefix="k8s-rd-")
    try:
        async with open_k8s(server, tmp_path, runner_dir=folder) as s:
            assert (await s.exec("echo", "here")).stdout == b"here\n"
            assert digest(Path(folder) / runner_name(binary)) == binary.sha256
            assert not (Path(server.runner_dirs[0]) / runner_name(binary)).exists()
        assert await eventually(lambda: not processes_mentioning([folder]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    too_long = "/tmp/" + "x" * 100
    with pytest.raises(sandbox.UnsupportedOperationError, match="runner_dir"):
        async with open_k8s(server, tmp_path, runner_dir=too_long):
            pass
    assert await eventually(lambda: server.pods == {} and server.live_processes() == 0)
    with pytest.raises(sandbox.InvalidArgumentError, match="absolute"):
        open_k8s(server, tmp_path, runner_dir="relative/dir")


@pytest.mark.parametrize("tty", [False, True])
async def test_a_sigkilled_clients_process_is_reattached_at_the_resume(
    server: KubernetesApiServer, tmp_path: Path, tty: bool
) -> None:
    from tests.durable.crash import crash_with_a_process

    ref_file = tmp_path / "ref.json"
    options = {"kubeconfig": _kubeconfig(server, tmp_path), "image": "busybox", "runner": True}
    command = "echo before; while [ ! -e go ]; do sleep 0.02; done; echo after; exit 3"
    process_id = await crash_with_a_process("kubernetes", options, ref_file, [command], tty=tty)
    # The client and its link died; the runner and its process did not.
    assert await eventually(lambda: server.open_execs() == 0)
    ref = sandbox.read_ref_file(ref_file)
    [proc] = ref.processes
    assert proc.process_id == process_id and proc.running and "runner_id" in proc.handle
    async with sandbox.resume_session(
        ref, ref_file=str(ref_file), kubeconfig=_kubeconfig(server, tmp_path)
    ) as s:
        assert s.keeps_processes
        [info] = s.pty_processes()
        assert info.process_id == process_id and info.running
        await s.write_file("go", b"")
        last = await s.pty_write_stdin(process_id, "", yield_time_s=30)
        assert "after" in last.output and last.exit_code == 3
    assert await eventually(lambda: server.pods == {} and server.live_processes() == 0)
    assert_runner_gone(list(server.runner_dirs))


# ---- the `runner` option: auto (the default), True, False ------------------------------


def open_default(server: KubernetesApiServer, tmp_path: Path, **options: Any) -> KubernetesSession:
    """A session with the `runner` option as given (left out: the default, auto)."""
    options.setdefault("image", "busybox")
    s = sandbox.open_session("kubernetes", kubeconfig=_kubeconfig(server, tmp_path), **options)
    assert isinstance(s, KubernetesSession)
    return s


def runner_execs(server: KubernetesApiServer) -> list[list[str]]:
    """The execs the server ran that put, found or reached a runner."""
    return [a for a in server.exec_argvs if any("sandbox-runner" in part for part in a)]


async def test_by_default_a_session_goes_through_the_runner_and_keeps_processes(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    s = open_default(server, tmp_path)
    # Before the start: what the options pick (this install has the runner).
    assert s.uses_runner and s.keeps_processes
    async with s:
        assert s.uses_runner and s.keeps_processes and s.runner_fallback_reason is None
        assert uploads(server) == 1
        started = await s.pty_exec_start("exec sleep 600", yield_time_s=0.1)
        assert started.process_id is not None
        ref = s.ref()
        assert ref.keeps_processes and ref.options["runner"] is True
        [kept] = ref.processes
        assert "runner_id" in kept.handle
    assert_runner_gone(list(server.runner_dirs))


async def test_runner_false_is_the_per_exec_path(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    s = open_default(server, tmp_path, runner=False)
    assert not s.uses_runner and not s.keeps_processes
    async with s:
        assert not s.uses_runner and not s.keeps_processes and s._runner is None
        assert s.runner_fallback_reason == "runner=False"
        assert (await s.exec("echo", "by exec")).stdout == b"by exec\n"
        started = await s.pty_exec_start("exec sleep 600", yield_time_s=0.1)
        assert started.process_id is not None
        ref = s.ref()
        assert not ref.keeps_processes and ref.options["runner"] is False
        [direct] = ref.processes
        assert "tag" in direct.handle and "runner_id" not in direct.handle
    assert runner_execs(server) == []
    assert await eventually(lambda: server.pods == {} and server.live_processes() == 0)


def test_runner_must_be_true_false_or_none() -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="runner must be True, False or None"):
        sandbox.open_session("kubernetes", image="busybox", runner=1)


async def test_a_resume_takes_the_path_its_ref_says_the_session_used(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    kubeconfig = _kubeconfig(server, tmp_path)
    for runner in (None, False):
        async with open_default(server, tmp_path, runner=runner) as s:
            ref = await s.detach()
            assert ref.options["runner"] is (runner is None)
            async with sandbox.resume_session(ref, kubeconfig=kubeconfig) as resumed:
                assert resumed.uses_runner is (runner is None)
                assert resumed.keeps_processes is (runner is None)
    # A ref made before the runner existed has no `runner`: its session was per-exec,
    # and so is the resumed one (not auto's runner).
    async with open_default(server, tmp_path, runner=False) as s:
        ref = await s.detach()
        options = {k: v for k, v in ref.options.items() if k != "runner"}
        legacy = dataclasses.replace(ref, options=options)
        async with sandbox.resume_session(legacy, kubeconfig=kubeconfig) as resumed:
            assert not resumed.uses_runner and not resumed.keeps_processes
    assert await eventually(lambda: server.pods == {} and server.live_processes() == 0)


async def test_auto_falls_back_to_the_per_exec_path_where_the_runner_dir_is_not_writable(
    server: KubernetesApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Nobody, root included, makes a folder in /proc: the upload fails.
    unwritable = f"/proc/sandbox-runner-{secrets.token_hex(4)}"
    with caplog.at_level(logging.WARNING, logger="sandbox.kubernetes"):
        async with open_default(server, tmp_path, runner_dir=unwritable) as s:
            assert not s.uses_runner and not s.keeps_processes and s._runner is None
            reason = s.runner_fallback_reason
            assert reason is not None, "the session should have fallen back"
            assert reason.startswith("runner: could not be started in the pod")
            assert "could not put the runner into the pod" in reason
            assert (await s.exec("echo", "by exec")).stdout == b"by exec\n"
            update = await s.pty_exec_start("echo r; exec cat", stdin=True, until="r")
            assert update.process_id is not None
            await s.pty_terminate(update.process_id)
    assert reason in caplog.text  # said once, as a warning, at the start
    # Nothing of the runner connected: only the failed delivery ran.
    assert not any("connect" in argv for argv in runner_execs(server))
    # Required, the same failure fails the start, saying why.
    strict = open_default(server, tmp_path, runner_dir=unwritable, runner=True)
    with pytest.raises(sandbox.ProviderError, match="could not put the runner into the pod"):
        await strict.start()
    await strict.aclose()
    assert await eventually(lambda: server.pods == {} and server.live_processes() == 0)
