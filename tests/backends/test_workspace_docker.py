"""docker's workspace calls: the engine's archive streamed in bounded memory, a consumer
that stops early or a cancelled hydration leaving nothing behind (no engine stream, no
spool, no running exec), hydration in batches that still never goes through a symlink
out of the workspace the container already held, and hard links sent as copies."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.docker.workspace import BATCH_BYTES, BATCH_MEMBERS, SPILL_BYTES
from tests.backend_fixtures import docker as docker_fixture
from tests.conftest import skip_or_fail
from tests.helpers import HookGate, PeakRss, open_fds
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


async def test_persist_400_mib_from_the_engine_in_bounded_memory(
    docker_ready: None, tmp_path: Path
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        result = await session.exec(
            "mkdir -p big && for k in 0 1 2 3; do truncate -s 100M big/part$k.bin; done"
        )
        assert result.exit_code == 0, result
        rss = PeakRss()
        total = 0
        async for chunk in session.persist_workspace("big"):
            total += len(chunk)
            rss.passed(len(chunk))
        assert total > 400 * 1024 * 1024
        assert rss.growth <= 64 << 20, f"RSS grew by {rss.growth >> 20} MiB"
        await session.remove("big", recursive=True)


async def test_persist_stopped_early_releases_the_stream(
    docker_ready: None, tmp_path: Path
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        assert (await session.exec("mkdir -p t/small && truncate -s 50M t/big.bin")).exit_code == 0
        # One whole persist first: the engine client's pool keeps the connections a
        # persist uses open (that is reuse, not a leak), so they are counted in `before`.
        async with contextlib.aclosing(session.persist_workspace("t/small")) as warm:  # type: ignore[type-var]
            assert b"".join([chunk async for chunk in warm])
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
        assert sorted(e.name for e in await session.list_dir("t")) == ["big.bin", "small"]


def _tar(*members: tuple[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# Past the size a batch keeps in memory: its spool is a temporary file.
SPILLED = b"s" * (SPILL_BYTES + 4096)


@pytest.mark.parametrize("after", [False, True], ids=["before-the-put", "after-the-put"])
async def test_hydrate_cancelled_at_a_put_leaks_nothing(
    docker_ready: None, tmp_path: Path, after: bool
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        data = _tar(("one.txt", b"abc"), ("big.bin", SPILLED))
        tree = session._tree()  # type: ignore[attr-defined]
        gate = HookGate(tree, "put_batch", after=after)
        session._tree = lambda: tree  # type: ignore[attr-defined]
        spools = _spools()  # pytest's own captures are deleted temporary files too
        task = asyncio.create_task(session.hydrate_workspace([data], "dest"))
        await gate.reached.wait()
        assert len(_spools()) == len(spools) + 1  # the batch is spooled to a file
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.release()
        assert _spools() == spools  # the batch's spool is closed (engine sockets are pooled)
        landed = sorted(e.name for e in await session.list_dir("dest"))
        assert landed == (["big.bin", "one.txt"] if after else [])
        assert (await session.exec("echo alive")).stdout == b"alive\n"


async def test_hydrate_cancelled_while_its_source_blocks_closes_the_spool(
    docker_ready: None, tmp_path: Path
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        data = _tar(("big.bin", SPILLED + SPILLED))
        blocked = asyncio.Event()

        async def source() -> AsyncIterator[bytes]:
            yield data[: len(SPILLED) + 1024]  # past the memory part: the spool is a file
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


async def test_hydrate_in_batches_keeps_every_member(docker_ready: None, tmp_path: Path) -> None:
    # More members than one batch takes, and a file larger than one batch's bytes.
    big = os.urandom(BATCH_BYTES + 12345)
    small = [(f"many/d{k % 7}/f{k}.txt", b"%d" % k) for k in range(BATCH_MEMBERS + 150)]
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        data = _tar(("first.txt", b"1"), *small, ("big/blob.bin", big), ("last.txt", b"z"))
        assert await session.hydrate_workspace([data], "copy") == len(small) + 3
        listing = await session.exec("cd copy && find . -type f | wc -l && cat many/d3/f10.txt")
        assert listing.stdout.split() == [b"%d" % (len(small) + 3), b"10"]
        assert await session.read_file("copy/big/blob.bin", max_bytes=len(big)) == big
        assert await session.read_file("copy/last.txt") == b"z"


async def _link_out(session: sandbox.BaseSandboxSession, where: str) -> None:
    result = await session.exec(f"mkdir -p dest/sub && ln -s /etc {where}")
    assert result.exit_code == 0, result


@pytest.mark.parametrize(
    ("link", "culprit"),
    [("dest/link", "link/x"), ("dest/sub/link", "sub/link/x"), ("dest/link", "link")],
    ids=["through-a-link", "through-a-nested-link", "onto-a-link"],
)
async def test_hydrate_never_follows_a_link_out_the_container_held(
    docker_ready: None, tmp_path: Path, link: str, culprit: str
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        await _link_out(session, link)
        members = [(f"sub/before{k}.txt", b"b") for k in range(20)]
        data = _tar(*members, (culprit, b"evil"), ("after.txt", b"late"))
        with pytest.raises(sandbox.WorkspacePathError, match="out of the workspace"):
            await session.hydrate_workspace([data], "dest")
        # What the batch held before the refused member landed, nothing after it did.
        landed = {e.name for e in await session.list_dir("dest/sub")}
        assert {f"before{k}.txt" for k in range(20)} <= landed
        assert "after.txt" not in {e.name for e in await session.list_dir("dest")}
        escaped = await session.exec("ls /etc/x /etc/link 2>/dev/null; cat /etc/passwd")
        assert b"evil" not in escaped.stdout and b"root:" in escaped.stdout


async def test_hydrate_follows_a_link_the_container_held_inside(
    docker_ready: None, tmp_path: Path
) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        result = await session.exec("mkdir -p dest other && ln -s ../other dest/in")
        assert result.exit_code == 0, result
        data = _tar(("a.txt", b"a"), ("in/x.txt", b"x"), ("in/deep/y.txt", b"y"), ("b.txt", b"b"))
        assert await session.hydrate_workspace([data], "dest") == 4
        assert await session.read_file("other/x.txt") == b"x"
        assert await session.read_file("other/deep/y.txt") == b"y"
        assert sorted(e.name for e in await session.list_dir("dest")) == ["a.txt", "b.txt", "in"]
        assert (await session.stat("dest/in")).kind == "symlink"


async def test_a_hard_link_travels_as_a_copy(docker_ready: None, tmp_path: Path) -> None:
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        await session.write_file("h/first.txt", b"shared inode")
        assert (await session.exec("ln h/first.txt h/second.txt")).exit_code == 0
        with tarfile.open(fileobj=io.BytesIO(await archive(session, "h"))) as tar:
            members = {m.name: m for m in tar.getmembers()}
            assert members["second.txt"].isfile() and members["first.txt"].isfile()
            second = tar.extractfile(members["second.txt"])
            assert second is not None and second.read() == b"shared inode"


class _EngineCalls:
    """Counts the SDK's stat (HEAD) and put requests of one session (the real engine
    still answers each)."""

    def __init__(self, session: sandbox.BaseSandboxSession) -> None:
        self.api = session._tree()._engine.api  # type: ignore[attr-defined]
        self.heads = self.puts = 0
        real_head, real_put = self.api.head, self.api._put

        def head(*args: object, **kwargs: object) -> object:
            self.heads += 1
            return real_head(*args, **kwargs)

        def put(*args: object, **kwargs: object) -> object:
            self.puts += 1
            return real_put(*args, **kwargs)

        self.api.head, self.api._put = head, put

    def close(self) -> None:
        del self.api.head, self.api._put


async def test_hydrate_states_only_names_the_container_held(
    docker_ready: None, tmp_path: Path
) -> None:
    members = [(f"top{k}.txt", b"t") for k in range(30)]
    members += [(f"tree/d{k % 3}/f{k}.txt", b"f") for k in range(300)]
    async with docker_fixture.BACKEND.session(tmp_path) as session:
        calls = _EngineCalls(session)
        try:
            # A folder this hydration makes: nothing in it can be there already.
            assert await session.hydrate_workspace([_tar(*members)], "fresh") == len(members)
            assert calls.heads <= 4 and calls.puts == 2, (calls.heads, calls.puts)
            # A folder that exists: one stat for each name directly in it, none below
            # the folders the hydration makes there.
            await session.make_dir("held")
            calls.heads = calls.puts = 0
            assert await session.hydrate_workspace([_tar(*members)], "held") == len(members)
            assert 31 <= calls.heads <= 31 + 4 and calls.puts == 1, (calls.heads, calls.puts)
        finally:
            calls.close()
        found = await session.exec("find fresh held -type f | wc -l")
        assert found.stdout.strip() == b"%d" % (2 * len(members))
