"""docker's resource limits (`memory_limit_bytes`, `process_limit`, `cpu_limit`) on a
container the session creates, against this machine's real engine: a memory hog is
killed with 137 and says why (a session with a memory limit keeps the per-exec path
unless it asks for the runner), a fork bomb stops at the process limit and the close
still finishes (the runner's kill needs no fork, so it works there too), the CPU limit
is the container's; an attached container refuses them.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest

import sandbox
from sandbox.backends.docker import DockerSession
from sandbox.backends.docker.runner_link import MEMORY_LIMITED
from sandbox.runner import runner_binary, unavailable_reason
from tests.backend_fixtures import docker as fx
from tests.conftest import skip_or_fail

TEST_LABEL = "sandbox.test.case"
NOTE = "killed by the session's memory limit (memory_limit_bytes)"
MIB = 1024 * 1024
# Doubles a string in the shell until the memory limit kills it.
HOG = 'x=a; while :; do x="$x$x"; done'


@pytest.fixture(autouse=True)
def _engine() -> None:
    reason = fx.skip_reason()
    if reason:
        skip_or_fail(f"docker: {reason}")


def containers_of(case: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = fx._client().containers(
        all=True, filters={"label": f"{TEST_LABEL}={case}"}
    )
    return found


@asynccontextmanager
async def limited_session(case: str, **options: Any) -> AsyncIterator[DockerSession]:
    session = sandbox.open_session(
        "docker",
        image=fx.image(),
        network_mode="none",
        labels={TEST_LABEL: case},
        terminate_grace_s=0.3,
        **options,
    )
    assert isinstance(session, DockerSession)
    try:
        async with session:
            yield session
    finally:
        for info in containers_of(case):
            with suppress(Exception):
                fx._client().remove_container(info["Id"], force=True, v=True)


async def wait_exit(s: DockerSession, update: sandbox.PtyUpdate) -> tuple[str, int | None]:
    output = update.output
    while update.process_id is not None:
        update = await s.pty_write_stdin(update.process_id, "", yield_time_s=5)
        output += update.output
    return output, update.exit_code


def test_limits_on_an_attached_container_are_unsupported() -> None:
    for option, value in (
        ("memory_limit_bytes", 64 * MIB),
        ("process_limit", 10),
        ("cpu_limit", 0.5),
    ):
        with pytest.raises(sandbox.UnsupportedOperationError, match=option):
            sandbox.open_session("docker", container="c0ffee", **{option: value})


def test_earlier_limit_names_are_refused_naming_the_new_ones() -> None:
    for old, new in (("memory", "memory_limit_bytes"), ("pids_limit", "process_limit")):
        with pytest.raises(sandbox.InvalidArgumentError, match=f"{old}= is now {new}="):
            sandbox.open_session("docker", image="x", **{old: 1})


async def test_memory_hog_is_killed_with_137_and_says_why() -> None:
    case = secrets.token_hex(6)
    session = sandbox.open_session(
        "docker", image=fx.image(), memory_limit_bytes=32 * MIB, labels={TEST_LABEL: case}
    )
    # By default (auto) a memory limit keeps the per-exec path, which says why; so the
    # session says before its start too.
    assert not session.keeps_processes
    await session.aclose()
    async with limited_session(case, memory_limit_bytes=32 * MIB) as s:
        assert not s.uses_runner and not s.keeps_processes
        if runner_binary() is not None:
            assert s.runner_fallback_reason == MEMORY_LIMITED
        host = fx._client().inspect_container(s.container_id)["HostConfig"]
        assert host["Memory"] == host["MemorySwap"] == 32 * MIB
        result = await s.exec(HOG)
        assert result.exit_code == 137
        assert NOTE in result.stderr.decode() and result.stdout == b""
        output, code = await wait_exit(s, await s.pty_exec_start(HOG, tty=False))
        assert code == 137 and NOTE in output
        output, code = await wait_exit(s, await s.pty_exec_start(HOG, tty=True))
        assert code == 137 and NOTE in output
        # A SIGKILL that is not the limit's says nothing of it; the session goes on.
        killed = await s.exec("kill -9 $$")
        assert killed.exit_code == 137 and NOTE not in killed.stderr.decode()
        assert (await s.exec("echo fine")).stdout == b"fine\n"
    assert containers_of(case) == []


async def test_memory_hog_through_the_runner_is_killed_with_137() -> None:
    if runner_binary() is None:
        skip_or_fail(f"docker runner: {unavailable_reason()}")
    case = secrets.token_hex(6)
    async with limited_session(case, memory_limit_bytes=32 * MIB, runner=True) as s:
        assert s.uses_runner and s.keeps_processes
        result = await s.exec(HOG)
        assert result.exit_code == 137 and NOTE not in result.stderr.decode()
        assert (await s.exec("echo fine")).stdout == b"fine\n"
    assert containers_of(case) == []


@pytest.mark.parametrize("runner", [False, None], ids=["per-exec", "default"])
async def test_fork_loop_stops_at_the_process_limit_and_close_finishes(
    runner: bool | None,
) -> None:
    """An interactive shell forks sleepers until fork fails; it survives the failure, so
    the container stays full: the per-exec kill cannot run (it needs a shell), the
    runner's can (it forks nothing); either way the close ends, removing the container."""
    case = secrets.token_hex(6)
    async with asyncio.timeout(120):  # a bound against a hang, not a timing check
        async with limited_session(case, process_limit=40, cpu_limit=0.5, runner=runner) as s:
            assert s.uses_runner is (runner is None and runner_binary() is not None)
            host = fx._client().inspect_container(s.container_id)["HostConfig"]
            assert host["PidsLimit"] == 40 and host["NanoCpus"] == 500_000_000
            update = await s.pty_exec_start("exec sh -i", tty=True, until="# ")
            assert update.process_id is not None
            update = await s.pty_write_stdin(
                update.process_id,
                "while :; do sleep 600 & done\n",
                until="can't fork",
                yield_time_s=60,
            )
            assert "can't fork" in update.output
            # A builtin (no fork) answers once the loop is over.
            update = await s.pty_write_stdin(
                update.process_id, "echo loop-$((6*7))\n", until="loop-42", yield_time_s=60
            )
            assert "loop-42" in update.output and update.process_id is not None
            stats = fx._client().stats(s.container_id, stream=False)
            assert stats["pids_stats"]["current"] == 40
            if not s.uses_runner:
                with pytest.raises(sandbox.ProviderError, match="process_limit"):
                    await s.pty_terminate(update.process_id)
            else:
                await s.pty_terminate(update.process_id)
                # The whole tree went: there is room to fork again.
                assert (await s.exec("echo room")).stdout == b"room\n"
    assert containers_of(case) == []
