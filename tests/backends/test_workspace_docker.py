"""docker's workspace calls: the engine's archive streamed in bounded memory, a consumer
that stops early or a cancelled hydration leaving nothing behind (no engine stream, no
spool, no running exec), and hard links sent as copies."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.backend_fixtures import docker as docker_fixture
from tests.conftest import skip_or_fail
from tests.helpers import HookGate, open_fds
from tests.test_conformance_workspace import archive


@pytest.fixture
def docker_ready() -> None:
    if reason := docker_fixture.skip_reason():
        skip_or_fail(f"docker: {reason}")


def _spools() -> list[str]:
    """Open fds of deleted temporary files (a member's spool)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.endswith("(deleted)"):
                found.append(target)
    return found


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_persist_400_mib_from_the_engine_in_bounded_memory(
    docker_ready: None, tmp_path: Path
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        result = await session.exec(
            "mkdir -p big && for k in 0 1 2 3; do truncate -s 100M big/part$k.bin; done"
        )
        assert result.exit_code == 0, result
        before = peak = _rss_kib()
        total = 0
        async for chunk in session.persist_workspace("big"):
            total += len(chunk)
            peak = max(peak, _rss_kib())
        assert total > 400 * 1024 * 1024
        assert peak - before <= 64 * 1024, f"RSS grew by {(peak - before) // 1024} MiB"
        await session.remove("big", recursive=True)


async def test_persist_stopped_early_releases_the_stream(
    docker_ready: None, tmp_path: Path
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        assert (await session.exec("mkdir -p t && truncate -s 50M t/big.bin")).exit_code == 0
        before = open_fds()
        async with contextlib.aclosing(session.persist_workspace("t")) as stream:  # type: ignore[type-var]
            async for _ in stream:
                break
        # The engine's response is closed once the pool call reading it ends.
        for _ in range(200):
            if open_fds() <= before:
                break
            await asyncio.sleep(0.05)
        assert open_fds() <= before
        assert [e.name for e in await session.list_dir("t")] == ["big.bin"]


async def test_hydrate_cancelled_inside_a_put_leaks_nothing(
    docker_ready: None, tmp_path: Path
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in ("one.txt", "two.txt"):
                info = tarfile.TarInfo(name)
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
        tree = session._tree()  # type: ignore[attr-defined]
        gate = HookGate(tree, "write_file")
        session._tree = lambda: tree  # type: ignore[attr-defined]
        spools = _spools()  # pytest's own captures are deleted temporary files too
        task = asyncio.create_task(session.hydrate_workspace([out.getvalue()], "dest"))
        await gate.reached.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release()
        assert _spools() == spools  # no member's spool left open (engine sockets are pooled)
        assert await session.list_dir("dest") == []
        assert (await session.exec("echo alive")).stdout == b"alive\n"


async def test_hydrate_cancelled_while_its_source_blocks_closes_the_spool(
    docker_ready: None, tmp_path: Path
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo("big.bin")
            info.size = 200_000
            tar.addfile(info, io.BytesIO(b"z" * 200_000))
        data = out.getvalue()
        blocked = asyncio.Event()

        async def source() -> AsyncIterator[bytes]:
            yield data[:100_000]  # the header and part of the file: its spool is open
            blocked.set()
            await asyncio.Event().wait()
            yield b""

        spools = _spools()
        task = asyncio.create_task(session.hydrate_workspace(source(), "dest"))
        await blocked.wait()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):  # closed once the write to it in flight ends
            if _spools() == spools:
                break
            await asyncio.sleep(0.05)
        assert _spools() == spools
        assert await session.list_dir("dest") == []


async def test_a_hard_link_travels_as_a_copy(docker_ready: None, tmp_path: Path) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        await session.write_file("h/first.txt", b"shared inode")
        assert (await session.exec("ln h/first.txt h/second.txt")).exit_code == 0
        with tarfile.open(fileobj=io.BytesIO(await archive(session, "h"))) as tar:
            members = {m.name: m for m in tar.getmembers()}
            assert members["second.txt"].isfile() and members["first.txt"].isfile()
            second = tar.extractfile(members["second.txt"])
            assert second is not None and second.read() == b"shared inode"
