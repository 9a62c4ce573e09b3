"""docker through the runner (docs/runner.md), its default: delivery checked by content,
processes that outlive their client and replay what they printed meanwhile, a dropped
link that kills nothing, a tree kill that catches escapees; and the `runner` option
itself: auto (None, the default) uses the runner and falls back to the per-exec path
with its reason where the container cannot take it, True requires it, False never uses
it, and `keeps_processes` and a ref follow what the session used.

The conformance, ownership and durable suites run on both paths (fixtures `docker`, the
default, and `docker_exec`, `runner=False`); these are the runner's own promises.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import logging
import os
import re
import secrets
import tarfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

import sandbox
from sandbox.backends.docker import DockerSession
from sandbox.backends.docker.runner_link import runner_path
from sandbox.runner import runner_binary, unavailable_reason
from sandbox.testing.conformance import eventually
from tests.backend_fixtures import docker as fx
from tests.conftest import skip_or_fail


@pytest.fixture(autouse=True)
def _engine() -> None:
    reason = fx.skip_reason() or unavailable_reason()
    if reason:
        skip_or_fail(f"docker runner: {reason}")


def _exec(container: str, *argv: str) -> tuple[int, bytes]:
    api = fx._client()
    exec_id = api.exec_create(container, list(argv))["Id"]
    output = api.exec_start(exec_id)
    return int(api.exec_inspect(exec_id)["ExitCode"]), output


async def _until_file(container: str, path: str) -> None:
    """Wait (bounded) until `path` exists in the container, asking the engine directly:
    no session follows the process meanwhile."""
    deadline = time.monotonic() + 30
    while (await asyncio.to_thread(_exec, container, "test", "-e", path))[0] != 0:
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.05)


@asynccontextmanager
async def _session(**options: Any) -> AsyncIterator[tuple[sandbox.BaseSandboxSession, str]]:
    container = fx.shared_container()
    workdir = f"/tmp/rn-{secrets.token_hex(6)}"
    session = sandbox.open_session(
        "docker", container=container, workdir=workdir, runner=True, **options
    )
    try:
        yield session, workdir
    finally:
        await session.aclose()
        await asyncio.to_thread(_exec, container, "rm", "-rf", workdir)


async def test_a_detached_process_runs_on_and_its_output_meanwhile_is_replayed() -> None:
    async with _session() as (s, workdir):
        await s.start()
        command = (
            "echo early; while [ ! -e go ]; do sleep 0.02; done; echo meanwhile; "
            "touch printed; while [ ! -e end ]; do sleep 0.02; done; echo late; exit 7"
        )
        started = await s.pty_exec_start(command, until="early", yield_time_s=10)
        assert started.process_id is not None and "early" in started.output
        ref = await s.detach()
        [kept] = ref.processes
        assert kept.running and "runner_id" in kept.handle
        # Nobody follows the process now: it prints, and the runner's ring keeps it.
        container = fx.shared_container()
        await asyncio.to_thread(_exec, container, "touch", f"{workdir}/go")
        await _until_file(container, f"{workdir}/printed")
        async with sandbox.resume_session(ref) as resumed:
            assert resumed.keeps_processes
            [info] = resumed.pty_processes()
            assert info.process_id == started.process_id and info.running
            update = await resumed.pty_write_stdin(
                started.process_id, "", until="meanwhile", yield_time_s=10
            )
            assert "meanwhile" in update.output and "early" not in update.output
            await resumed.write_file("end", b"")
            last = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=30)
            assert "late" in last.output and last.exit_code == 7


async def test_a_second_session_reuses_the_delivered_runner_and_a_forged_one_is_replaced() -> None:
    binary = runner_binary()
    assert binary is not None
    container = fx.shared_container()
    path = runner_path(binary)
    async with _session() as (s, _):
        await s.start()
        assert (await s.exec("echo", "one")).stdout == b"one\n"
    # Something else at the runner's name (a container may write anything there):
    # replaced by the next session, which then works.
    forged = b"#!/bin/sh\necho forged\n"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(path.rsplit("/", 1)[1])
        info.size, info.mode = len(forged), 0o755
        tar.addfile(info, io.BytesIO(forged))
    fx._client().put_archive(container, "/tmp", buffer.getvalue())
    async with _session() as (s, _):
        await s.start()
        assert (await s.exec("echo", "two")).stdout == b"two\n"
    chunks, _ = fx._client().get_archive(container, path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        member = tar.extractfile(tar.getmembers()[0])
        assert member is not None
        assert hashlib.sha256(member.read()).hexdigest() == binary.sha256


@pytest.mark.parametrize(
    ("uid", "mode"),
    [(1000, 0o755), (0, 0o777), (0, 0o775)],
    ids=["another uid's", "world-writable", "group-writable"],
)
async def test_the_right_bytes_that_others_could_rewrite_are_replaced_by_roots(
    uid: int, mode: int
) -> None:
    """The runner's exact bytes at its name, but in a file another uid owns or others
    may write: it could be rewritten between the check and the link's exec (run as the
    session's user, maybe root), so it is not trusted: ours is written over it."""
    binary = runner_binary()
    assert binary is not None
    container = fx.shared_container()
    path = runner_path(binary)
    data = binary.path.read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(path.rsplit("/", 1)[1])
        info.size, info.mode, info.uid = len(data), mode, uid
        tar.addfile(info, io.BytesIO(data))
    fx._client().put_archive(container, "/tmp", buffer.getvalue())
    async with _session() as (s, _):
        await s.start()
        assert (await s.exec("echo", "ok")).stdout == b"ok\n"
    chunks, _ = fx._client().get_archive(container, path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        info = tar.getmembers()[0]
        member = tar.extractfile(info)
        assert member is not None
        assert hashlib.sha256(member.read()).hexdigest() == binary.sha256
    assert (info.uid, info.mode & 0o7777) == (0, 0o755)


async def test_the_tree_kill_reaches_double_forked_and_setsid_escapees() -> None:
    async with _session(terminate_grace_s=0) as (s, _):
        await s.start()
        marker = f"esc{secrets.token_hex(4)}"
        command = (
            f"(sleep 600 & ) ; setsid sh -c 'exec -a {marker} sleep 600' & "
            f"exec -a {marker}main sleep 600"
        )
        started = await s.pty_exec_start(command, yield_time_s=0.5)
        assert started.process_id is not None
        await s.pty_terminate(started.process_id)
    container = fx.shared_container()
    deadline = time.monotonic() + 10
    while any(marker in p for p in fx.container_processes(container)):
        assert time.monotonic() < deadline, fx.container_processes(container)
        await asyncio.sleep(0.05)


async def test_a_dropped_link_kills_nothing() -> None:
    async with _session() as (s, workdir):
        await s.start()
        started = await s.pty_exec_start(
            "while [ ! -e stop ]; do sleep 0.02; done; echo stopped", yield_time_s=0.2
        )
        assert started.process_id is not None
        ref = s.ref()
        # The bridge exec goes away (as if the engine connection broke).
        container = fx.shared_container()
        runner = s._runner
        assert runner is not None
        runner.link.close()
        await runner.client.wait_closed()
        update = await s.pty_write_stdin(started.process_id, "", yield_time_s=5)
        assert update.exit_code is None and "process lost" in update.output
        # The runner still keeps it: a resumed client (the ref's takeover) reattaches.
        async with sandbox.resume_session(ref) as resumed:
            await resumed.write_file("stop", b"")
            last = await resumed.pty_write_stdin(started.process_id, "", yield_time_s=30)
            assert "stopped" in last.output and last.exit_code == 0
        assert (await asyncio.to_thread(_exec, container, "test", "-d", workdir))[0] == 0


def _bridge_execs(api: Any, container: str, among: set[str] | None = None) -> list[str]:
    """The container's execs of the runner's bridge (`connect --start`), running (or,
    with `among` excluded, created since)."""
    found = []
    for exec_id in api.inspect_container(container).get("ExecIDs") or []:
        if among is not None and exec_id in among:
            continue
        info = api.exec_inspect(exec_id)
        if "connect" in (info.get("ProcessConfig") or {}).get("arguments", []) and (
            among is not None or info.get("Running")
        ):
            found.append(exec_id)
    return found


def _fds() -> int:
    return len(_fd_targets())


def _fd_targets() -> list[str]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            continue  # the listing's own fd, closed by now
    return sorted(found)


async def test_a_start_cancelled_while_the_link_opens_leaks_no_socket_and_no_bridge() -> None:
    import docker

    container = fx.shared_container()
    async with _session() as (warm, _):
        await warm.start()  # the runner is delivered and running: only the link is left
    before = _fds()
    api = docker.APIClient(version="auto")  # this test's own, closed before the count
    cancelled = 0
    try:
        # The start may win the race with the cancel (the exec's start is quick once
        # the engine lists it): that outcome is legal, so try until three cancels land.
        for _ in range(12):
            s = sandbox.open_session("docker", container=container, workdir="/tmp", runner=True)
            try:
                seen = set(api.inspect_container(container).get("ExecIDs") or [])
                starting = asyncio.ensure_future(s.start())
                # Cancel once the engine shows the bridge's exec: its start is in flight.
                deadline = time.monotonic() + 30
                while not starting.done() and not await asyncio.to_thread(
                    _bridge_execs, api, container, seen
                ):
                    assert time.monotonic() < deadline
                starting.cancel()
                try:
                    await starting
                except asyncio.CancelledError:
                    cancelled += 1
            finally:
                await s.aclose()
            if cancelled == 3:
                break
        assert cancelled >= 1, "no cancel landed while the bridge's exec was starting"
        assert await eventually(lambda: _bridge_execs(api, container) == [], timeout=10)
    finally:
        api.close()
    assert await eventually(lambda: _fds() <= before, timeout=10), "; ".join(_fd_targets())


# ---- the `runner` option: auto (the default), True, False ------------------------------


@asynccontextmanager
async def _attached(container: str | None = None, **options: Any) -> AsyncIterator[DockerSession]:
    """An unstarted session attached to `container` (the shared one) in a fresh workdir,
    removed afterwards; the test starts and closes it."""
    container = container or fx.shared_container()
    workdir = f"/tmp/rn-{secrets.token_hex(6)}"
    session = sandbox.open_session(
        "docker", container=container, workdir=workdir, terminate_grace_s=0.3, **options
    )
    assert isinstance(session, DockerSession)
    try:
        yield session
    finally:
        await session.aclose()
        await asyncio.to_thread(_exec, container, "rm", "-rf", workdir)


async def test_by_default_a_session_goes_through_the_runner_and_keeps_processes() -> None:
    async with _attached() as s:
        # Before the start: what the options pick (this install has the runner).
        assert s.uses_runner and s.keeps_processes
        await s.start()
        assert s.uses_runner and s.keeps_processes and s.runner_fallback_reason is None
        started = await s.pty_exec_start("exec sleep 600", yield_time_s=0.1)
        assert started.process_id is not None
        ref = s.ref()
        assert ref.keeps_processes and ref.options["runner"] is True
        [kept] = ref.processes
        assert "runner_id" in kept.handle


async def test_a_fresh_container_gets_the_runner_by_default_and_is_removed() -> None:
    case = secrets.token_hex(6)
    label = "sandbox.test.case"
    session = sandbox.open_session(
        "docker", image=fx.image(), labels={label: case}, network_mode="none"
    )
    assert isinstance(session, DockerSession)
    try:
        async with session as s:
            assert s.uses_runner and s.runner_fallback_reason is None
            assert (await s.exec("echo", "fresh")).stdout == b"fresh\n"
        assert fx._client().containers(all=True, filters={"label": f"{label}={case}"}) == []
    finally:
        for info in fx._client().containers(all=True, filters={"label": f"{label}={case}"}):
            fx._client().remove_container(info["Id"], force=True, v=True)


async def test_runner_false_is_the_per_exec_path() -> None:
    async with _attached(runner=False) as s:
        assert not s.uses_runner and not s.keeps_processes
        await s.start()
        assert not s.uses_runner and not s.keeps_processes
        assert s.runner_fallback_reason == "runner=False" and s._runner is None
        assert (await s.exec("echo", "by exec")).stdout == b"by exec\n"
        started = await s.pty_exec_start("exec sleep 600", yield_time_s=0.1)
        assert started.process_id is not None
        ref = s.ref()
        assert not ref.keeps_processes and ref.options["runner"] is False
        [direct] = ref.processes
        assert "exec_id" in direct.handle and "runner_id" not in direct.handle


def test_runner_must_be_true_false_or_none() -> None:
    with pytest.raises(sandbox.InvalidArgumentError, match="runner must be True, False or None"):
        sandbox.open_session("docker", container="any", runner="yes")


async def test_a_resume_takes_the_path_its_ref_says_the_session_used() -> None:
    for runner in (None, False):
        async with _attached(runner=runner) as s:
            await s.start()
            ref = await s.detach()
            assert ref.options["runner"] is (runner is None)
            async with sandbox.resume_session(ref) as resumed:
                assert resumed.uses_runner is (runner is None)
                assert resumed.keeps_processes is (runner is None)
    # A ref made before the runner existed has no `runner`: its session was per-exec,
    # and so is the resumed one (not auto's runner).
    async with _attached(runner=False) as s:
        await s.start()
        ref = await s.detach()
        options = {k: v for k, v in ref.options.items() if k != "runner"}
        legacy = dataclasses.replace(ref, options=options)
        async with sandbox.resume_session(legacy) as resumed:
            assert not resumed.uses_runner and not resumed.keeps_processes


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ({"read_only": True}, "read-only"),
        # The archive endpoint cannot write into a tmpfs (what it puts lands under the
        # mount, unseen), and a noexec one would not run it: the runner is not there.
        ({"tmpfs": {"/tmp": "rw,noexec,size=64m"}}, "OCI runtime exec failed"),
    ],
    ids=["read-only root", "tmpfs noexec /tmp"],
)
async def test_auto_falls_back_to_the_per_exec_path_where_the_container_cannot_take_it(
    host: dict[str, Any], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    api = fx._client()
    container = api.create_container(
        fx.image(),
        command=fx.KEEPALIVE[1:],
        entrypoint=fx.KEEPALIVE[:1],
        labels={"sandbox.test.case": secrets.token_hex(6)},
        host_config=api.create_host_config(init=True, network_mode="none", **host),
    )["Id"]
    workdir = "/" if host.get("read_only") else "/tmp/ws"
    try:
        api.start(container)
        session = sandbox.open_session("docker", container=container, workdir=workdir)
        assert isinstance(session, DockerSession)
        with caplog.at_level(logging.WARNING, logger="sandbox.docker"):
            async with session as s:
                assert not s.uses_runner and not s.keeps_processes
                reason = s.runner_fallback_reason
                assert reason is not None and why in reason, reason
                assert reason.startswith("runner: could not be started in the container")
                assert (await s.exec("echo", "by exec")).stdout == b"by exec\n"
                update = await s.pty_exec_start("echo r; exec cat", stdin=True, until="r")
                assert update.process_id is not None
                await s.pty_terminate(update.process_id)
        assert reason in caplog.text  # said once, as a warning, at the start
        # Required, the same failure fails the start, saying why.
        strict = sandbox.open_session("docker", container=container, workdir=workdir, runner=True)
        try:
            with pytest.raises(sandbox.ProviderError, match=re.escape(why)):
                await strict.start()
        finally:
            await strict.aclose()
        fx.assert_only_keepalive(container)
    finally:
        api.remove_container(container, force=True, v=True)
