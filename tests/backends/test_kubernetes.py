"""kubernetes specifics: protocol versions (v5, v4-only), Status errors, pod start
failures, attach, deletion (graceful, forced, exactly once), dropped sockets, the stream
a background child holds open, bounds, the token, and cancellation while a request is
parked on the server (signal-based).

Everything runs against `sandbox.testing.kubernetes_server` on loopback: real sockets,
real processes behind it, a kubeconfig written by the test.

These are the per-exec path's (an exec per process): its sessions say `runner=False`,
the runner being the default where this install has it (the runner's own promises and
the option's defaults: test_kubernetes_runner.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox.backends.kubernetes import KubernetesSession, bounds
from sandbox.backends.kubernetes.client import V4_PROTOCOL, V5_PROTOCOL
from sandbox.backends.kubernetes.errors import exit_code_from_status
from sandbox.backends.kubernetes.pods import SESSION_LABEL, PodStartError
from sandbox.testing.kubernetes_server import KubernetesApiServer
from tests.helpers import eventually, host_pids_with_arg, unique_seconds

TOKEN = "k8s-test-token-SECRET-7c41d2"


@pytest.fixture(autouse=True)
def token_never_logged(caplog: pytest.LogCaptureFixture) -> Any:
    """Every test runs with DEBUG logging captured; the token must never appear in it."""
    caplog.set_level(logging.DEBUG)
    yield
    assert TOKEN not in caplog.text


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[KubernetesApiServer]:
    async with KubernetesApiServer(token=TOKEN, root=tmp_path / "cluster") as srv:
        yield srv


def open_k8s(server: KubernetesApiServer, tmp_path: Path, **options: Any) -> KubernetesSession:
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    options.setdefault("image", "busybox")
    options.setdefault("runner", False)  # the per-exec path (the module docstring)
    s = sandbox.open_session("kubernetes", kubeconfig=str(kubeconfig), **options)
    assert isinstance(s, KubernetesSession)
    return s


async def nothing_left(server: KubernetesApiServer) -> None:
    assert await eventually(lambda: server.pods == {} and server.live_processes() == 0)


# ---- protocol versions -----------------------------------------------------------------


async def test_v5_is_agreed_and_labels_the_pod(server: KubernetesApiServer, tmp_path: Path) -> None:
    async with open_k8s(server, tmp_path) as s:
        assert s._client is not None and s._client.agreed == V5_PROTOCOL
        ((_, pod),) = server.pods.items()
        meta, spec = pod.obj["metadata"], pod.obj["spec"]
        assert meta["labels"][SESSION_LABEL] == s.session_label
        assert spec["restartPolicy"] == "Never"
        assert spec["containers"][0]["workingDir"] == "/workspace"
        assert (await s.exec("echo $HOSTNAME")).stdout.decode().strip() == pod.name
    await nothing_left(server)


@pytest.mark.parametrize("how", ["server-v4-only", "client-offers-v4"])
async def test_v4_only_runs_everything(
    server: KubernetesApiServer, tmp_path: Path, how: str
) -> None:
    options: dict[str, Any] = {}
    if how == "server-v4-only":
        server.v4_only = True
    else:
        options["protocols"] = (V4_PROTOCOL,)
    async with open_k8s(server, tmp_path, **options) as s:
        assert s._client is not None and s._client.agreed == V4_PROTOCOL
        assert (await s.exec("echo hi; exit 4")).exit_code == 4
        # No stdin close under v4: the write counts its bytes (head -c) instead.
        payload = bytes(range(256)) * 300
        await s.write_file("d/blob", payload)
        assert await s.read_file("d/blob") == payload
        await s.write_file_chunks(
            "d/chunks", (payload[i : i + 7000] for i in range(0, 76800, 7000))
        )
        assert await s.read_file("d/chunks") == payload
        # A pipes process gets no stdin at all, so `cat` ends at once.
        started = await s.pty_exec_start("cat; echo cat-done", yield_time_s=5)
        update = started
        while update.exit_code is None:
            update = await s.pty_write_stdin(started.process_id, "", yield_time_s=5)
        assert "cat-done" in started.output + update.output
        assert update.exit_code == 0


async def test_v4_refuses_open_stdin_before_starting_anything(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    # v4 cannot end a process's stdin while its output goes on (v5's CLOSE can): a
    # `stdin=True` start is refused before any exec, never left waiting for an end.
    server.v4_only = True
    async with open_k8s(server, tmp_path) as s:
        execs = len(server.exec_argvs)
        with pytest.raises(sandbox.UnsupportedOperationError, match=r"stdin=True.*v4"):
            await s.pty_exec_start("sort", stdin=True)
        assert len(server.exec_argvs) == execs
        assert s.pty_processes() == []
        # A tty process still takes keystrokes, and pipes processes still run.
        update = await s.pty_exec_start("echo ready; exec cat", tty=True, stdin=True, until="ready")
        assert update.process_id is not None
    await nothing_left(server)


async def test_no_common_protocol_is_a_clear_error(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    server.v4_only = True
    s = open_k8s(server, tmp_path, protocols=(V5_PROTOCOL,))
    with pytest.raises(sandbox.ProviderError, match="403") as info:
        await s.start()
    assert TOKEN not in str(info.value)
    await s.aclose()
    await nothing_left(server)


# ---- API errors and pod start failures ---------------------------------------------------


async def test_exec_forbidden_is_a_clear_error_and_deletes_the_pod(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    server.forbid_exec = True
    s = open_k8s(server, tmp_path)
    with pytest.raises(sandbox.ProviderError, match=r"forbidden.*pods/exec") as info:
        await s.start()
    assert "HTTP 403" in str(info.value) and TOKEN not in str(info.value)
    await s.aclose()
    await nothing_left(server)
    assert len(server.deleted) == 1


async def test_image_pull_failure_is_reported_at_once(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    server.image_pull_fails = True
    s = open_k8s(server, tmp_path, image="no-such-image:1", create_timeout_s=600)
    with pytest.raises(PodStartError, match=r"ErrImagePull|ImagePullBackOff") as info:
        await s.start()
    assert "no-such-image:1" in str(info.value)
    await s.aclose()
    await nothing_left(server)


async def test_unschedulable_is_named_at_the_deadline(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    server.unschedulable = True
    s = open_k8s(server, tmp_path, create_timeout_s=0.5)
    with pytest.raises(PodStartError, match="Unschedulable: 0/1 nodes are available") as info:
        await s.start()
    assert info.value.retryable
    await s.aclose()
    await nothing_left(server)


async def test_bad_token_is_rejected_without_showing_it(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    other = KubernetesApiServer(token="a-different-token-99", root=tmp_path / "other")
    async with other:
        config = json.loads(other.write_kubeconfig(tmp_path / "other.json").read_text())
    config["clusters"][0]["cluster"]["server"] = server.url
    path = tmp_path / "wrong"
    path.write_text(json.dumps(config))
    s = sandbox.open_session("kubernetes", kubeconfig=str(path), image="busybox")
    with pytest.raises(sandbox.ProviderError, match="HTTP 401") as info:
        await s.start()
    assert "a-different-token-99" not in str(info.value) + repr(s) + repr(s._client)
    await s.aclose()
    assert server.pods == {}


async def test_kubeconfig_from_the_environment_and_missing_credentials(
    server: KubernetesApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "env-config")))
    async with sandbox.open_session("kubernetes", image="busybox") as s:
        assert (await s.exec("echo via-env")).stdout == b"via-env\n"
        assert TOKEN not in repr(s) + repr(s._client)  # type: ignore[attr-defined]
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    s = sandbox.open_session("kubernetes", image="busybox")
    with pytest.raises(sandbox.CredentialsMissingError, match="KUBECONFIG"):
        await s.start()
    await s.aclose()


async def test_exec_credential_plugin_is_run_again_when_its_token_expired(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    plugin = tmp_path / "plugin.py"
    # The token it hands out is already expired: the loader must run it before each call.
    plugin.write_text(
        "import json, pathlib\n"
        f"pathlib.Path({str(runs)!r}).open('a').write('x')\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1',"
        " 'kind': 'ExecCredential', 'status': {'token': "
        f"{TOKEN!r}, 'expirationTimestamp': '2000-01-01T00:00:00Z'}}}}))\n"
    )
    config = json.loads(server.write_kubeconfig(tmp_path / "kc").read_text())
    config["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin)],
        }
    }
    (tmp_path / "kc").write_text(json.dumps(config))
    # The per-exec path: each command is an API call (the runner's go over one link).
    s = sandbox.open_session(
        "kubernetes", kubeconfig=str(tmp_path / "kc"), image="busybox", runner=False
    )
    async with s:
        assert (await s.exec("echo plugged")).stdout == b"plugged\n"
        before = len(runs.read_text())
        await s.exec("true")
        assert len(runs.read_text()) > before
    assert all(authorized for _, _, authorized in server.requests)
    await nothing_left(server)


def test_backends_report_names_the_context_not_the_token(tmp_path: Path) -> None:
    config = {
        "apiVersion": "v1",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "ctx-east", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx-east",
    }
    (tmp_path / "kc").write_text(json.dumps(config))
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "kc"))
    out = subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "backends"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    (line,) = [row for row in out.stdout.splitlines() if row.startswith("kubernetes")]
    assert "found (kubeconfig, context ctx-east)" in line
    assert TOKEN not in out.stdout + out.stderr
    env["KUBECONFIG"] = str(tmp_path / "none")
    env["HOME"] = str(tmp_path)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    out = subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "backends"], capture_output=True, text=True, env=env
    )
    (line,) = [row for row in out.stdout.splitlines() if row.startswith("kubernetes")]
    assert "missing" in line


def test_bad_options_are_invalid_arguments() -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="exactly one of image"):
        sandbox.open_session("kubernetes")
    with pytest.raises(sandbox.InvalidArgumentError, match="exactly one of image"):
        sandbox.open_session("kubernetes", image="a", pod="b")
    with pytest.raises(sandbox.InvalidArgumentError, match="absolute"):
        sandbox.open_session("kubernetes", image="a", workdir="rel")
    with pytest.raises(sandbox.InvalidArgumentError, match="protocols"):
        sandbox.open_session("kubernetes", image="a", protocols=("v3.channel.k8s.io",))


async def test_limits_go_into_the_created_pod(server: KubernetesApiServer, tmp_path: Path) -> None:
    options = {"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "4"}}}
    async with open_k8s(
        server, tmp_path, memory_limit_bytes=256 * 1024 * 1024, cpu_limit=1.5, **options
    ):
        ((_, pod),) = server.pods.items()
        resources = pod.obj["spec"]["containers"][0]["resources"]
        assert resources == {
            "requests": {"cpu": "100m"},
            "limits": {"cpu": "1500m", "memory": str(256 * 1024 * 1024)},
        }
    with pytest.raises(sandbox.UnsupportedOperationError, match="process_limit"):
        open_k8s(server, tmp_path, process_limit=10)
    with pytest.raises(sandbox.UnsupportedOperationError, match=r"memory_limit_bytes.*attached"):
        open_k8s(server, tmp_path, image=None, pod="p", memory_limit_bytes=1 << 20)
    with pytest.raises(sandbox.InvalidArgumentError, match="cpu_limit"):
        open_k8s(server, tmp_path, cpu_limit=-1)


# ---- attach, deletion ------------------------------------------------------------------


async def test_attach_to_a_pod_leaves_it_running(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    async with open_k8s(server, tmp_path, keep=True) as first:
        await first.write_file("kept.txt", b"from the first session")
        name = first.pod_name
    assert name is not None and ("default", name) in server.pods
    async with open_k8s(server, tmp_path, image=None, pod=name) as attached:
        assert await attached.read_file("/workspace/kept.txt") == b"from the first session"
        marker = unique_seconds()
        started = await attached.pty_exec_start(f"sleep {marker}", yield_time_s=0.1)
        assert started.exit_code is None
    # The attached session killed its own process but left the pod running.
    assert await eventually(lambda: not host_pids_with_arg(marker))
    assert ("default", name) in server.pods
    assert server.deleted == []
    with pytest.raises(sandbox.InvalidArgumentError, match="no pod 'missing'"):
        await open_k8s(server, tmp_path, image=None, pod="missing").start()
    with pytest.raises(sandbox.InvalidArgumentError, match="no container 'other'"):
        await open_k8s(server, tmp_path, image=None, pod=name, container="other").start()


async def test_close_deletes_gracefully_once(server: KubernetesApiServer, tmp_path: Path) -> None:
    server.ignore_term = True  # the init waits out its grace, as `sleep infinity` would
    async with open_k8s(server, tmp_path, delete_grace_s=1) as s:
        await s.exec("true")
    deletes = [r for r in server.requests if r[0] == "DELETE"]
    assert len(deletes) == 1
    await nothing_left(server)


async def test_a_stuck_deletion_is_forced(
    server: KubernetesApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bounds, "DELETE_SLACK_S", 0.2)
    server.stuck_deletion = True
    async with open_k8s(server, tmp_path, delete_grace_s=1) as s:
        await s.exec("true")
    assert [r[0] for r in server.requests if r[0] == "DELETE"] == ["DELETE", "DELETE"]
    await nothing_left(server)


# ---- streams -------------------------------------------------------------------------------


async def test_dropped_exec_socket_is_a_lost_process(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    async with open_k8s(server, tmp_path) as s:
        marker = unique_seconds()
        started = await s.pty_exec_start(f"sleep {marker}", tty=True, yield_time_s=0.1)
        assert server.drop_exec_sockets() == 1
        update = await s.pty_write_stdin(started.process_id, "", yield_time_s=5)
        assert update.exit_code is None
        assert "process lost" in update.output
        assert (await s.exec("echo still-here")).stdout == b"still-here\n"
        # The tty process outlived its socket (as on containerd): the final poll of the
        # lost process tore it down, and that killed it in the pod.
        assert update.process_id is None
        assert await eventually(lambda: not host_pids_with_arg(marker))
        assert server.pods
    await nothing_left(server)


async def test_background_child_holding_stdout_ends_at_the_timeout(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    marker = unique_seconds()
    async with open_k8s(server, tmp_path) as s:
        # setsid leaves the wrapper's session: the wrapper's sweep misses it, the stream
        # stays open (the Status comes after EOF only), the timeout's kill finds it by tag.
        with pytest.raises(sandbox.ExecTimeoutError) as info:
            # The command ends only once the child has left the session (it made `ready`
            # after setsid), so the wrapper's sweep cannot catch it first on a slow machine.
            await s.exec(
                f"setsid sh -c 'touch ready; exec sleep {marker}' & "
                "while [ ! -e ready ]; do sleep 0.01; done; echo started",
                timeout=3,
            )
        assert b"started" in info.value.stdout
        assert await eventually(lambda: not host_pids_with_arg(marker))
        # A plain background child is swept by the wrapper: the exec ends at once.
        result = await s.exec(f"sleep {marker} & echo quick")
        assert result.stdout == b"quick\n"
    await nothing_left(server)


async def test_split_utf8_and_signal_exit(server: KubernetesApiServer, tmp_path: Path) -> None:
    async with open_k8s(server, tmp_path) as s:
        result = await s.exec("printf '\\342'; sleep 0.1; printf '\\202\\254'")
        assert result.stdout.decode() == "€"
        assert (await s.exec("kill -9 $$")).exit_code == 137


async def test_status_frames_are_parsed_fact_by_fact() -> None:
    assert exit_code_from_status({"status": "Success"}, "x") == 0
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "42"}]},
    }
    assert exit_code_from_status(failure, "x") == 42
    missing = {
        "status": "Failure",
        "reason": "InternalError",
        "message": 'exec: "nope": executable file not found in $PATH: unknown',
    }
    with pytest.raises(sandbox.ProviderError, match="executable file not found"):
        exit_code_from_status(missing, "run it")


# ---- files and bounds ------------------------------------------------------------------


async def test_paths_outside_the_workspace_make_no_call(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    async with open_k8s(server, tmp_path) as s:
        before = len(server.exec_argvs)
        for path in ("../escape", "/etc/passwd", "/workspace/../etc/passwd"):
            with pytest.raises(sandbox.WorkspacePathError):
                await s.read_file(path)
            with pytest.raises(sandbox.WorkspacePathError):
                await s.write_file(path, b"x")
        assert len(server.exec_argvs) == before
        await s.write_file("/workspace/abs.txt", b"absolute inside")
        assert await s.read_file("abs.txt") == b"absolute inside"


async def test_big_file_read_is_cut_at_the_limit(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    async with open_k8s(server, tmp_path) as s:
        assert (await s.exec("head -c 3000000 /dev/zero > big")).exit_code == 0
        with pytest.raises(sandbox.FileTooLargeError):
            await s.read_file("big", max_bytes=1000)
        # A device behind a symlink is refused by the shell's tests, never opened.
        assert (await s.exec("ln -s /dev/zero zero")).exit_code == 0
        with pytest.raises(sandbox.NotAFileError):
            await s.read_file("zero")
        # A streamed write over a directory is refused and writes nothing, also when
        # the refusal comes while chunks are still being sent.
        assert (await s.exec("mkdir folder")).exit_code == 0
        with pytest.raises(sandbox.NotAFileError, match="directory"):
            await s.write_file_chunks("folder", (b"x" * 65536 for _ in range(200)))
        assert (await s.exec("ls -A folder")).stdout == b""
        assert await eventually(lambda: server.open_execs() == 0)


async def test_a_flooding_status_is_refused(server: KubernetesApiServer, tmp_path: Path) -> None:
    async with open_k8s(server, tmp_path) as s:
        server.status_padding = bounds.MAX_STATUS_BYTES + 1
        with pytest.raises(sandbox.ProviderError, match="status was too long"):
            await s.exec("exit 3")
        server.status_padding = 0
        assert (await s.exec("exit 3")).exit_code == 3


async def test_a_flooding_watch_is_refused(server: KubernetesApiServer, tmp_path: Path) -> None:
    server.watch_floods = 1
    scheduling = server.stall("schedule")  # the pod stays Pending: the start must watch
    s = open_k8s(server, tmp_path)
    with pytest.raises(sandbox.ProviderError, match="watch event exceeded"):
        await s.start()
    scheduling.release()
    await s.aclose()
    await nothing_left(server)


# ---- cancellation at the server's await points --------------------------------------------


@pytest.mark.parametrize("point", ["create", "watch", "exec"])
async def test_cancelled_start_leaves_no_pod(
    server: KubernetesApiServer, tmp_path: Path, point: str
) -> None:
    stall = server.stall(point)
    # A pod still Pending at the first look makes the start watch.
    scheduling = server.stall("schedule") if point == "watch" else None
    s = open_k8s(server, tmp_path)
    starting = asyncio.ensure_future(s.start())
    await stall.reached.wait()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    stall.release()
    if scheduling is not None:
        scheduling.release()
    await s.aclose()
    await nothing_left(server)


@pytest.mark.parametrize("point", ["create", "watch"])
async def test_close_racing_pod_creation(
    server: KubernetesApiServer, tmp_path: Path, point: str
) -> None:
    stall = server.stall(point)
    scheduling = server.stall("schedule") if point == "watch" else None
    s = open_k8s(server, tmp_path)
    starting = asyncio.ensure_future(s.start())
    await stall.reached.wait()
    closing = asyncio.ensure_future(s.aclose())
    with pytest.raises(sandbox.SessionClosedError):
        await starting
    stall.release()
    if scheduling is not None:
        scheduling.release()
    await closing
    await nothing_left(server)


async def test_cancelled_exec_and_spawn_leave_no_process(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    async with open_k8s(server, tmp_path) as s:
        for run in ("exec", "spawn"):
            marker = unique_seconds()
            stall = server.stall("exec")
            if run == "exec":
                task = asyncio.ensure_future(s.exec(f"sleep {marker}"))
            else:
                task = asyncio.ensure_future(s.pty_exec_start(f"sleep {marker}", tty=True))
            await stall.reached.wait()
            # The cancelled caller waits for the settled undo of its start, which waits
            # for the stalled call: released at once (not left to its 30 s deadline).
            # `cancel()` cancels what the caller awaits now, so the release cannot
            # outrun the cancellation.
            task.cancel()
            stall.release()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await eventually(lambda m=marker: not host_pids_with_arg(m))
            assert await eventually(lambda: server.open_execs() == 0)
        assert s.pty_processes() == []


async def test_cancelled_write_poll_and_terminate(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    async with open_k8s(server, tmp_path) as s:
        marker = unique_seconds()
        # A short window: the command prints nothing, so the default one is waited out.
        started = await s.pty_exec_start(
            f"sh -c 'read x; sleep {marker}'", tty=True, yield_time_s=0.1
        )
        pid = started.process_id
        polling = asyncio.ensure_future(s.pty_write_stdin(pid, "", yield_time_s=30))
        await asyncio.sleep(0)
        polling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await polling
        stall = server.stall("exec")  # the kill script's exec parks on the server
        terminating = asyncio.ensure_future(s.pty_terminate(pid))
        await stall.reached.wait()
        terminating.cancel()
        # The teardown is settled: it finishes its kill before the cancellation lands.
        stall.release()
        with pytest.raises(asyncio.CancelledError):
            await terminating
        assert s.pty_processes() == []
        assert await eventually(lambda: server.open_execs() <= 1, timeout=10)
    assert await eventually(lambda: not host_pids_with_arg(marker))
    await nothing_left(server)


async def test_cancelled_close_still_deletes_the_pod(
    server: KubernetesApiServer, tmp_path: Path
) -> None:
    s = open_k8s(server, tmp_path)
    await s.start()
    marker = unique_seconds()
    await s.pty_exec_start(f"sleep {marker}", tty=True, yield_time_s=0.1)
    stall = server.stall("delete")
    closing = asyncio.ensure_future(s.aclose())
    await stall.reached.wait()
    closing.cancel()
    stall.release()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    assert s.state is sandbox.SessionState.CLOSED
    await nothing_left(server)
    assert await eventually(lambda: not host_pids_with_arg(marker))
    assert [r[0] for r in server.requests].count("DELETE") == 1
