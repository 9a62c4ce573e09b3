"""Conformance fixture for the `docker` backend on its per-exec path (`runner=False`: an
exec per process, no runner), which sessions also take where this install has no runner
or the container cannot take it (docs/runner.md). The `docker` fixture covers the
default, the runner.

A shared container of its own, made like the `docker` fixture's, so that its check is
the strict one: after each session the container runs its init and the keepalive
command, nothing else (no runner's daemon either: the session never starts one), and no
exec is running.
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sandbox
from sandbox.testing import conformance

from . import docker as plain


def skip_reason() -> str | None:
    return plain.skip_reason()


@functools.cache
def exec_container() -> str:
    """The id of the container every per-exec session of this test process attaches to."""
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


@asynccontextmanager
async def environment(tmp_path: Path) -> AsyncIterator[sandbox.BaseSandboxSession]:
    container_id = exec_container()
    workdir = f"/tmp/ws-{secrets.token_hex(6)}"
    try:
        session = sandbox.open_session(
            "docker", container=container_id, workdir=workdir, terminate_grace_s=0.5, runner=False
        )
        yield session
        assert not session.keeps_processes
        assert session.runner_fallback_reason in (None, "runner=False")
        plain.assert_only_keepalive(container_id)
    finally:
        exec_id = plain._client().exec_create(container_id, ["rm", "-rf", workdir])["Id"]
        plain._client().exec_start(exec_id)


BACKEND = conformance.Backend(
    name="docker_exec",
    session=conformance.fixture_session(environment),
    skip_reason=skip_reason,
)
