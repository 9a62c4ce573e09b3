"""blaxel snapshots through the stand-in: `snapshot()` makes a Blaxel snapshot of the
sandbox's files and waits until it is ready, `open_session("blaxel", snapshot=ref)`
forks a new sandbox from it holding the same files; a call cancelled while the snapshot
or the fork is made undoes it; a snapshot that failed or is gone is a clear error."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("blaxel", reason="the blaxel extra is not installed")
pytest.importorskip("aiohttp", reason="the blaxel extra is not installed")

import sandbox
from sandbox.testing.blaxel_server import BlaxelServer

# Every byte value, and more than one read's worth: the copy must be byte-exact.
PAYLOAD = bytes(range(256)) * 1024 + b"\x00tail"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[BlaxelServer]:
    async with BlaxelServer(root=str(tmp_path), workdir=str(tmp_path / "ws")) as running:
        yield running


def options(server: BlaxelServer, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return server.backend_options(workdir=str(tmp_path / "ws"), terminate_grace_s=0.5, **extra)


async def test_files_written_before_the_snapshot_come_back_in_a_fork(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with sandbox.open_session("blaxel", **options(server, tmp_path)) as first:
        await first.write_file("state/kept.bin", PAYLOAD)
        await first.exec("ln -s kept.bin state/alias && chmod 700 state/kept.bin")
        await first.make_dir("state/empty")
        ref = await first.snapshot()
        await first.write_file("state/after.txt", b"written after the snapshot")
        source = first.sandbox_name  # type: ignore[attr-defined]
    # Deleting the sandbox took its files; the snapshot outlives it.
    assert not (tmp_path / "ws").exists()
    assert list(server.snapshots) == [ref.snapshot_id]
    assert server.snapshots[ref.snapshot_id].record["source"] == {
        "name": source,
        "kind": "sandbox",
        "deleted": True,
    }
    text = ref.to_json()
    assert server.api_key not in text and server.workspace not in text
    assert sandbox.SnapshotRef.from_json(text) == ref
    assert json.loads(text)["backend"] == "blaxel"
    assert ref.details["workdir"] == str(tmp_path / "ws")
    # The ref's workdir is the default one.
    reopened = sandbox.open_session("blaxel", snapshot=text, **server.backend_options())
    async with reopened as second:
        assert second.sandbox_name != source  # type: ignore[attr-defined]
        assert await second.read_file("state/kept.bin") == PAYLOAD
        link = await second.stat("state/alias")
        assert (link.kind, link.link_target) == ("symlink", "kept.bin")
        assert (await second.stat("state/kept.bin")).mode == 0o700
        assert (await second.stat("state/empty")).kind == "dir"
        with pytest.raises(sandbox.SandboxFileNotFoundError):
            await second.stat("state/after.txt")
    forks = [path for method, path in server.requests if method == "POST" and "fork" in path]
    assert forks == [f"/v0/snapshots/{ref.snapshot_id}/fork"]
    assert server.sandboxes == {} and server.live_processes() == 0


async def test_options_a_fork_cannot_carry_are_refused(
    server: BlaxelServer, tmp_path: Path
) -> None:
    ref = sandbox.SnapshotRef(backend="blaxel", snapshot_id="snap_x", details={})
    for extra in (
        {"image": "blaxel/base"},
        {"memory_limit_bytes": 2 * 1024**3},
        {"labels": {"a": "b"}},
    ):
        with pytest.raises(sandbox.InvalidArgumentError, match="snapshot= replaces"):
            sandbox.open_session("blaxel", snapshot=ref, **options(server, tmp_path, **extra))
    with pytest.raises(sandbox.InvalidArgumentError, match="of the blaxel backend"):
        sandbox.open_session(
            "blaxel", snapshot=sandbox.SnapshotRef("e2b", "x"), **options(server, tmp_path)
        )


async def test_a_snapshot_that_is_gone_is_a_clear_error(
    server: BlaxelServer, tmp_path: Path
) -> None:
    from sandbox.backends.blaxel.sdk import Snapshot

    async with sandbox.open_session("blaxel", **options(server, tmp_path)) as first:
        await first.write_file("kept.txt", b"kept")
        ref = await first.snapshot()
        await Snapshot.delete(ref.snapshot_id)  # the SDK call a user would make
    assert server.snapshots == {}
    for gone in (ref, "snap_never_made"):
        session = sandbox.open_session("blaxel", snapshot=gone, **options(server, tmp_path))
        with pytest.raises(sandbox.ProviderError, match="no longer exists") as caught:
            await session.start()
        assert not caught.value.retryable
        assert server.api_key not in str(caught.value)
        await session.aclose()
    assert server.sandboxes == {}


async def test_a_snapshot_that_failed_is_an_error_and_is_deleted(
    server: BlaxelServer, tmp_path: Path
) -> None:
    async with sandbox.open_session("blaxel", **options(server, tmp_path)) as session:
        server.fail("snapshot_capture", 500)
        with pytest.raises(sandbox.ProviderError, match="ended 'failed'"):
            await session.snapshot()
        assert server.snapshots == {}
        server.fail("snapshot_create", 404)
        with pytest.raises(sandbox.ProviderError, match="snapshot the Blaxel sandbox"):
            await session.snapshot()
        assert server.snapshots == {}
        assert (await session.exec("echo still here")).stdout == b"still here\n"


@pytest.mark.parametrize("where", ["pending", "answer held"])
async def test_a_snapshot_cancelled_while_made_is_deleted(
    server: BlaxelServer, tmp_path: Path, where: str
) -> None:
    async with sandbox.open_session("blaxel", **options(server, tmp_path)) as session:
        await session.write_file("kept.txt", b"kept")
        if where == "pending":  # made, "pending": the caller is polling
            gate = server.faults.gate("snapshot_capture")
        else:  # made, its answer not yet sent
            gate = server.faults.gate("snapshot_create", after=True)
        call = asyncio.ensure_future(session.snapshot())
        await gate.reached.wait()
        (made,) = server.snapshots.values()
        if where == "pending":
            assert made.record["status"] == "pending"
        call.cancel()
        gate.release()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert server.snapshots == {}
        assert not os.path.exists(made.folder)
        assert (await session.exec("echo still here")).stdout == b"still here\n"
    assert server.sandboxes == {}


@pytest.mark.parametrize("point", ["snapshot_fork", "fork_deploy"])
async def test_a_fork_cancelled_while_made_is_deleted(
    server: BlaxelServer, tmp_path: Path, point: str
) -> None:
    async with sandbox.open_session("blaxel", **options(server, tmp_path)) as first:
        await first.write_file("kept.txt", b"kept")
        ref = await first.snapshot()
    # `snapshot_fork`: the fork is made, its answer held; `fork_deploy`: the fork is
    # DEPLOYING and the caller polls it.
    gate = server.faults.gate(point, after=point == "snapshot_fork")
    session = sandbox.open_session("blaxel", snapshot=ref, **options(server, tmp_path))
    start = asyncio.ensure_future(session.start())
    await gate.reached.wait()
    (name,) = server.sandboxes
    assert server.sandboxes[name].record["status"] == "DEPLOYING"
    start.cancel()
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert session.state is sandbox.SessionState.NEW
    assert server.sandboxes == {} and name in server.terminated
    assert session._client.http is None  # type: ignore[attr-defined]
    await session.aclose()
    assert list(server.snapshots) == [ref.snapshot_id]  # the snapshot is not ours to undo
