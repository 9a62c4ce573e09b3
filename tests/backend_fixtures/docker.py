"""Conformance fixture for the `docker` backend as it is opened by default, against this
machine's real engine: through the runner (docs/runner.md) where this install has it
(`runner` left to its default, auto), else the per-exec path. The per-exec path is
covered on its own by the `docker_exec` fixture (`runner=False`).

For speed every session attaches (`container=`) to one shared container, started once per
test run from the locally built busybox image; each session gets its own fresh working
directory, so it sees a clean state. On exit the fixture checks through the Docker API
that the session left no exec running and no process beyond the container's own and the
runner's daemon (it stays in the container between sessions: every session reaches the
one runner the first put there, one per user and build), no keeper (a process the runner
still holds), no bridge exec; that a session of an install with the runner used it; then
removes the session's directory. The shared container is removed when the run ends, and
a run stopped before it could remove it (SIGTERM, SIGKILL) leaves one labelled with its
owner (`OWNER_LABEL`: the pid namespace, pid and start time of the run's process): the
next run removes those whose owner is gone from this pid namespace, and no other
container.
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import sandbox
from sandbox.runner import runner_binary
from sandbox.testing import conformance, procfs

SHARED_LABEL = "sandbox.test.shared"
OWNER_LABEL = "sandbox.test.owner"
KEEPALIVE = ["sleep", "2147483647"]


@functools.cache
def skip_reason() -> str | None:
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install 'agent-sandbox-pty[docker]')"
    try:
        client = docker.from_env()
        client.ping()
        client.close()
    except Exception as exc:
        return f"no Docker engine is reachable ({type(exc).__name__}: {exc})"
    try:
        from sandbox.testing.docker_image import ensure_busybox_image

        ensure_busybox_image()
    except Exception as exc:
        return f"cannot build the busybox test image: {exc}"
    return None


def image() -> str:
    """The test image's tag (built on first use in this run)."""
    from sandbox.testing.docker_image import ensure_busybox_image

    return ensure_busybox_image()


@functools.cache
def _client() -> Any:
    import docker

    return docker.APIClient(version="auto")


@functools.cache
def shared_container() -> str:
    """The id of the container every conformance session attaches to."""
    api = _client()
    remove_leftovers()
    info = api.create_container(
        image(),
        command=KEEPALIVE[1:],
        entrypoint=KEEPALIVE[:1],
        labels={SHARED_LABEL: "1", OWNER_LABEL: owner_token(os.getpid())},
        host_config=api.create_host_config(init=True, network_mode="none"),
        detach=True,
    )
    container_id = str(info["Id"])
    atexit.register(_remove, container_id)
    api.start(container_id)
    return container_id


def _pid_namespace() -> str:
    return os.readlink("/proc/self/ns/pid")


def owner_token(pid: int) -> str:
    """`pid:[N] PID START`: names one process of this pid namespace for as long as it
    lives (the start time tells a reused pid apart); "" for a process that is gone."""
    info = procfs.stat(pid)
    return "" if info is None else f"{_pid_namespace()} {pid} {info.start_time}"


def _owner_gone(token: str) -> bool:
    """Whether the run `token` names has ended. Only a token of our pid namespace can be
    judged; a container without one (made before owners were labelled, or by a run
    elsewhere on the same engine) is not ours to judge."""
    namespace, _, rest = token.rpartition(" ")[0].partition(" ")
    if namespace != _pid_namespace() or not rest.isdigit():
        return False
    return owner_token(int(rest)) != token


def remove_leftovers() -> list[str]:
    """Remove the shared containers of earlier runs that ended without removing theirs;
    their ids. Only containers with `SHARED_LABEL` whose owner is gone: never one of a
    run still going, never any other container."""
    api = _client()
    removed = []
    for container in api.containers(all=True, filters={"label": SHARED_LABEL}):
        labels = container.get("Labels") or {}
        if SHARED_LABEL in labels and _owner_gone(labels.get(OWNER_LABEL, "")):
            _remove(container["Id"])
            removed.append(str(container["Id"]))
    return removed


def _remove(container_id: str) -> None:
    try:
        _client().remove_container(container_id, force=True, v=True)
    except Exception:
        pass


def container_processes(container_id: str) -> list[str]:
    """The command lines of the processes in a container, from the engine's `top`."""
    top = _client().top(container_id, ps_args="-o pid,args")
    index = top["Titles"].index("COMMAND") if "COMMAND" in top["Titles"] else -1
    return [row[index] for row in top.get("Processes") or []]


def running_execs(container_id: str) -> list[str]:
    """Execs of the container the engine still reports as running."""
    api = _client()
    ids = api.inspect_container(container_id).get("ExecIDs") or []
    running = []
    for exec_id in ids:
        try:
            if api.exec_inspect(exec_id).get("Running"):
                running.append(exec_id)
        except Exception:
            continue
    return running


def stray_processes(procs: list[str], *, runner_daemons: bool) -> list[str]:
    """The processes of `procs` (command lines) that are not the container's own (its
    init and keepalive command), nor, with `runner_daemons`, a runner's daemon: one per
    socket (a user and build), never a second on the same socket."""
    sockets: set[str] = set()
    stray = []
    for proc in procs:
        if "docker-init" in proc or proc == " ".join(KEEPALIVE):
            continue
        if runner_daemons and proc.startswith("/tmp/.sandbox-runner-") and " serve " in proc:
            socket = proc.partition(" --socket ")[2].split(" ", 1)[0]
            if socket not in sockets:
                sockets.add(socket)
                continue
        stray.append(proc)
    return stray


def assert_only_keepalive(
    container_id: str, timeout: float = 10.0, *, runner_daemons: bool = False
) -> None:
    """Fail unless, within `timeout`, the container runs nothing but its init and the
    keepalive command (and, with `runner_daemons`, the runners' daemons: see
    `stray_processes`), and no exec is running."""
    deadline = time.monotonic() + timeout
    while True:
        procs = container_processes(container_id)
        stray = stray_processes(procs, runner_daemons=runner_daemons)
        execs = running_execs(container_id)
        if not stray and not execs:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind in the container: {stray} execs={execs}")
        time.sleep(0.05)


def assert_only_runner(container_id: str, timeout: float = 10.0) -> None:
    """`assert_only_keepalive`, the runners' daemons allowed: what a shared container
    holds after sessions opened by default (through the runner) left it."""
    assert_only_keepalive(container_id, timeout, runner_daemons=True)


# How many of this fixture's sessions are open now (a test may open one inside another:
# the outer one's link to the runner is a running exec the inner one's check would see).
_open_sessions = 0


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    global _open_sessions
    container_id = shared_container()
    workdir = f"/tmp/ws-{secrets.token_hex(6)}"
    _open_sessions += 1
    try:
        session = sandbox.open_session(
            "docker", container=container_id, workdir=workdir, terminate_grace_s=0.5
        )
        yield session
        # The default is the runner wherever this install has it: a session that fell
        # back would run this suite on the per-exec path twice and the runner's never.
        if runner_binary() is not None:
            assert session.runner_fallback_reason is None, session.runner_fallback_reason
            assert session.keeps_processes
        # A session inside another: the outermost one's check sees what it left.
        if _open_sessions == 1:
            assert_only_runner(container_id)
    finally:
        _open_sessions -= 1
        exec_id = _client().exec_create(container_id, ["rm", "-rf", workdir])["Id"]
        _client().exec_start(exec_id)


BACKEND = conformance.Backend(
    name="docker",
    session=conformance.fixture_session(environment),
    skip_reason=skip_reason,
)
