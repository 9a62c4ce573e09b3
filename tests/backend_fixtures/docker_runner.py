"""Conformance fixture for the `docker` backend with `runner=True` (docs/runner.md).

A shared container of its own, made like the `docker` fixture's (the runner's daemon
stays in it between sessions, which the plain fixture's check would rightly call a
leftover); every session reaches the one runner the first session put there (one per
user and build). After each session the container may run its init, the keepalive
command and that runner's daemon, nothing else: no keeper (a process the runner still
holds), no bridge exec, no process of the session's.
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

import sandbox
from sandbox.runner import unavailable_reason
from sandbox.testing import conformance

from . import docker as plain


def skip_reason() -> str | None:
    return plain.skip_reason() or unavailable_reason()


@functools.cache
def runner_container() -> str:
    """The id of the container every runner session of this test process attaches to."""
    api = plain._client()
    plain.remove_leftovers()
    info = api.create_container(
        plain.image(),
        command=plain.KEEPALIVE[1:],
        entrypoint=plain.KEEPALIVE[:1],
        labels={plain.SHARED_LABEL: "1", plain.OWNER_LABEL: plain.owner_token(os.getpid())},
        host_config=api.create_host_config(init=True, network_mode="none"),
        detach=True,
    )
    container_id = str(info["Id"])
    atexit.register(plain._remove, container_id)
    api.start(container_id)
    return container_id


def _stray(procs: list[str]) -> list[str]:
    allowed_daemons = 1
    stray = []
    for proc in procs:
        if "docker-init" in proc or proc == " ".join(plain.KEEPALIVE):
            continue
        if proc.startswith("/tmp/.sandbox-runner-") and " serve " in proc and allowed_daemons:
            allowed_daemons -= 1
            continue
        stray.append(proc)
    return stray


def assert_only_runner(container_id: str, timeout: float = 10.0) -> None:
    """Fail unless, within `timeout`, the container runs only its own processes and the
    runner's daemon, and no exec is running."""
    deadline = time.monotonic() + timeout
    while True:
        stray = _stray(plain.container_processes(container_id))
        execs = plain.running_execs(container_id)
        if not stray and not execs:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind in the container: {stray} execs={execs}")
        time.sleep(0.05)


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    container_id = runner_container()
    workdir = f"/tmp/ws-{secrets.token_hex(6)}"
    try:
        yield sandbox.open_session(
            "docker", container=container_id, workdir=workdir, terminate_grace_s=0.5, runner=True
        )
        assert_only_runner(container_id)
    finally:
        exec_id = plain._client().exec_create(container_id, ["rm", "-rf", workdir])["Id"]
        plain._client().exec_start(exec_id)


BACKEND = conformance.Backend(
    name="docker_runner",
    session=conformance.fixture_session(environment),
    skip_reason=skip_reason,
)
