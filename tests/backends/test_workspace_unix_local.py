"""unix_local's workspace calls against a hostile sandbox: a folder swapped for a symlink
to a host folder while the calls run (sessions, and the fallback walk on its own), a
FIFO where a file is expected, memory bounds for a 400 MiB archive, and cancellation at
each await the archive calls add."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import safe_open, tar_land
from sandbox.backends.unix_local.workspace_files import LocalTree
from sandbox.workspace.tar_writer import file_header, padding
from tests.helpers import PeakRss, open_fds
from tests.test_workspace_race import SWAPPER

ROUNDS = 1500
BUDGET_S = 60.0
ENOUGH = 30
HOST_ONLY = "host-only.txt"


def _prepare(workspace: Path, host: Path) -> None:
    host.mkdir()
    (host / HOST_ONLY).write_bytes(b"host")
    (workspace / "d" / "sub").mkdir(parents=True)
    (workspace / "d" / "inside.txt").write_bytes(b"inside")
    (workspace / "swap").symlink_to(host)
    (workspace / "swapper.py").write_text(SWAPPER)


def _host_untouched(host: Path) -> None:
    assert sorted(p.name for p in host.iterdir()) == [HOST_ONLY], "something escaped"
    assert (host / HOST_ONLY).read_bytes() == b"host"


def _tar(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def _one_round(session: sandbox.BaseSandboxSession, i: int, outcomes: list[str]) -> None:
    calls = [
        session.list_dir("d"),
        session.stat("d/inside.txt"),
        session.make_dir(f"d/made{i}/x"),
        session.hydrate_workspace([_tar(f"d/h{i}.txt", b"h")]),
        session.remove(f"d/made{i}", recursive=True),
    ]
    for call in calls:
        try:
            result = await call
            if isinstance(result, list):
                assert HOST_ONLY not in {e.name for e in result}, "a host listing came back"
            outcomes.append("ok")
        except sandbox.SandboxError as exc:  # anything else fails the test
            outcomes.append(type(exc).__name__)


async def test_swapped_symlink_cannot_lead_workspace_calls_out(tmp_path: Path) -> None:
    workspace, host = tmp_path / "ws", tmp_path / "host"
    _prepare(workspace, host)
    outcomes: list[str] = []
    async with sandbox.open_session("unix_local", workdir=workspace) as session:
        update = await session.pty_exec_start(
            f"exec python3 swapper.py {BUDGET_S + 30:g}", until="swapping", yield_time_s=30
        )
        assert update.process_id is not None and "swapping" in update.output
        started = time.monotonic()
        try:
            for i in range(ROUNDS):
                await _one_round(session, i, outcomes)
                ok = outcomes.count("ok")
                if (ok >= ENOUGH and len(outcomes) - ok >= ENOUGH) or (
                    time.monotonic() - started > BUDGET_S
                ):
                    break
        finally:
            await session.write_file("stop", "")
            with contextlib.suppress(sandbox.PtyProcessNotFoundError):
                final = await session.pty_write_stdin(update.process_id, "", yield_time_s=30)
                assert final.exit_code == 0, final.output
    _host_untouched(host)
    assert "WorkspacePathError" in outcomes and "ok" in outcomes, set(outcomes)


@pytest.mark.parametrize("resolver", ["walk", "openat2"])
def test_resolvers_hold_for_tree_calls(tmp_path: Path, resolver: str) -> None:
    if resolver == "openat2" and not safe_open.openat2_available():
        pytest.skip("this kernel has no openat2")
    workspace, host = tmp_path / "ws", tmp_path / "host"
    _prepare(workspace, host)
    tree = LocalTree(os.path.realpath(workspace), resolver=resolver)
    swapper = subprocess.Popen(
        [sys.executable, "swapper.py", str(BUDGET_S + 30)], cwd=workspace, stdout=subprocess.PIPE
    )
    outcomes: list[str] = []
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == b"swapping\n"
        started = time.monotonic()
        for i in range(ROUNDS * 4):
            calls: list[tuple[Callable[..., object], tuple[object, ...]]] = [
                (tree.list_dir, ("d",)),
                (tree.make_dir, (f"d/m{i}", True)),
                (tree.make_symlink, (f"d/l{i}", "inside.txt")),
                (tree.set_mode, ("d", 0o700)),
                (tree.set_mode, ("d/sub", 0o711)),
                (tree.remove, (f"d/m{i}", True)),
            ]
            for call, args in calls:
                try:
                    result = call(*args)
                    if isinstance(result, list):
                        assert HOST_ONLY not in {e.name for e in result}
                    outcomes.append("ok")
                except sandbox.SandboxError as exc:
                    outcomes.append(type(exc).__name__)
            ok = outcomes.count("ok")
            if (ok >= ENOUGH and len(outcomes) - ok >= ENOUGH) or (
                time.monotonic() - started > BUDGET_S
            ):
                break
    finally:
        (workspace / "stop").touch()
        code = swapper.wait(timeout=30)
        if swapper.stdout is not None:
            swapper.stdout.close()
        assert code == 0
    _host_untouched(host)
    assert host.stat().st_mode & 0o777 != 0o700, "a mode was set outside"
    assert "WorkspacePathError" in outcomes and "ok" in outcomes, set(outcomes)


async def test_hydrate_onto_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as session:
        os.mkfifo(os.path.join(session.workdir, "pipe"))
        async with asyncio.timeout(60):  # a safety net: the refusal must not wait
            with pytest.raises(sandbox.NotAFileError, match="'pipe'"):
                await session.hydrate_workspace([_tar("pipe", b"data")])


async def test_persist_400_mib_in_bounded_memory(tmp_path: Path) -> None:
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as session:
        for k in range(4):  # sparse files: 400 MiB of data, hardly any disk
            path = os.path.join(session.workdir, f"big/part{k}.bin")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.truncate(100 * 1024 * 1024)
                handle.write(b"head")
        for k in range(200):
            await session.write_file(f"small/{k % 10}/f{k}.txt", f"file {k}\n")
        rss = PeakRss()
        total = 0
        async for chunk in session.persist_workspace():
            total += len(chunk)
            rss.passed(len(chunk))
        assert total > 400 * 1024 * 1024
        assert rss.growth <= 64 << 20, f"RSS grew by {rss.growth >> 20} MiB"


async def test_persist_closed_early_leaks_no_fd(tmp_path: Path) -> None:
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as session:
        await session.write_file("a/big.bin", b"x" * (5 * 1024 * 1024))
        before = open_fds()
        async with contextlib.aclosing(session.persist_workspace()) as stream:
            async for _ in stream:
                break
        assert open_fds() == before
        assert (await session.stat("a/big.bin")).size == 5 * 1024 * 1024


async def test_hydrate_cancelled_inside_a_write_leaks_nothing(tmp_path: Path) -> None:
    """Cancelled while a file is half written (its fd open in the lander, a batch of its
    data flushed): every fd is closed, and the session hydrates again."""
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as session:
        size = 3 * tar_land.BATCH_BYTES
        blocked = asyncio.Event()

        async def source() -> AsyncIterator[bytes]:
            yield file_header("one.txt", size=1, mode=0o644, mtime=0) + b"1" + padding(1)
            yield file_header("two.bin", size=size, mode=0o644, mtime=0)
            yield b"2" * (2 * tar_land.BATCH_BYTES)  # a batch flushed, two.bin open
            blocked.set()
            await asyncio.Event().wait()  # the peer stops sending mid-file
            yield b""

        before = open_fds()
        task = asyncio.create_task(session.hydrate_workspace(source()))
        await blocked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert open_fds() == before
        assert (tmp_path / "ws" / "one.txt").read_bytes() == b"1"  # a full batch landed
        assert await session.hydrate_workspace([_tar("after.txt", b"a")]) == 1


async def test_hydrate_cancelled_while_its_source_blocks(tmp_path: Path) -> None:
    async with sandbox.open_session("unix_local", workdir=tmp_path / "ws") as session:
        blocked = asyncio.Event()
        first = _tar("big.bin", b"z" * 100_000)

        async def source() -> AsyncIterator[bytes]:
            yield first[:60_000]
            blocked.set()
            await asyncio.Event().wait()  # a peer that stops sending
            yield b""

        before = open_fds()
        task = asyncio.create_task(session.hydrate_workspace(source()))
        await blocked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert open_fds() == before
        assert (await session.exec("echo alive")).stdout == b"alive\n"


async def test_names_removed_while_walked_are_left_out(tmp_path: Path) -> None:
    """A sandbox process deleting files between the walk's listing and its reading (pid
    files, temporaries): the archive stays valid and leaves them out."""
    from sandbox.workspace.persist import walk_tar

    root = tmp_path / "tree"
    (root / "gone-dir").mkdir(parents=True)
    (root / "gone.txt").write_bytes(b"soon gone")
    (root / "kept.txt").write_bytes(b"kept")
    tree = LocalTree(os.path.realpath(root))

    class Racing:
        async def stat(self, path: str) -> sandbox.FileInfo:
            return tree.stat(path)

        async def list_dir(self, path: str) -> list[sandbox.FileInfo]:
            listed = tree.list_dir(path)
            if path == ".":  # what the sandbox removes right after the listing
                (root / "gone.txt").unlink()
                (root / "gone-dir").rmdir()
            return listed

        def read_chunks(self, path: str) -> AsyncIterator[bytes]:
            from sandbox.backends.unix_local import local_files

            return local_files.read_chunks(os.path.realpath(root), path, 1024)

    data = b"".join([chunk async for chunk in walk_tar(Racing(), ".")])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = sorted(m.name for m in tar.getmembers())
        assert names == ["gone-dir", "kept.txt"]
        kept = tar.extractfile("kept.txt")
        assert kept is not None and kept.read() == b"kept"
