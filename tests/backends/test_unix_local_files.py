"""unix_local files: bounded reads, streaming in constant memory, no fd left behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sandbox
from sandbox.backends.unix_local import UnixLocalSession, safe_open
from tests.helpers import eventually, open_fds

SPARSE_BYTES = 200 * 1024 * 1024

# Run in a fresh interpreter so ru_maxrss (a high-water mark) says what THIS read cost.
MEASURE = textwrap.dedent(
    """
    import asyncio, json, resource, sys
    import sandbox

    async def main(workspace):
        async with sandbox.open_session("unix_local", workdir=workspace) as s:
            await s.write_file("warm.txt", b"warm")  # load what the first call loads
            await s.read_file("warm.txt")
            async for _ in s.read_file_chunks("warm.txt"):
                pass
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            try:
                await s.read_file("sparse.bin")
                refused = None
            except sandbox.FileTooLargeError as exc:
                refused = [exc.size, exc.limit]
            after_refusal = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            total, biggest, count = 0, 0, 0
            async for chunk in s.read_file_chunks("sparse.bin", chunk_size=1 << 20):
                total += len(chunk)
                biggest = max(biggest, len(chunk))
                count += 1
            after_stream = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({
            "refused": refused,
            "refusal_kib": after_refusal - before,
            "stream_kib": after_stream - before,
            "total": total, "biggest": biggest, "count": count,
        }))

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.fixture
async def session(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with UnixLocalSession(workdir=tmp_path, terminate_grace_s=0.3) as s:
        yield s


def test_sparse_file_streams_in_constant_memory_and_read_file_refuses_it(
    tmp_path: Path,
) -> None:
    with open(tmp_path / "sparse.bin", "wb") as handle:
        handle.truncate(SPARSE_BYTES)  # a hole: 200 MB to read, nothing on disk
    measured = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path)],
        capture_output=True,
        check=True,
        timeout=120,
    )
    result = json.loads(measured.stdout)
    assert result["refused"] == [SPARSE_BYTES, 64 * 1024 * 1024]
    assert result["refusal_kib"] < 8 * 1024, "the refusal must come before any reading"
    assert result["total"] == SPARSE_BYTES
    assert result["biggest"] == 1 << 20 and result["count"] == 200
    assert result["stream_kib"] < 32 * 1024, "streaming must not hold the file"


async def test_limits_and_chunk_sizes(session: UnixLocalSession, tmp_path: Path) -> None:
    (tmp_path / "ten.txt").write_bytes(b"0123456789")
    assert await session.read_file("ten.txt", max_bytes=10) == b"0123456789"
    with pytest.raises(sandbox.FileTooLargeError, match=r"'ten\.txt' is 10 bytes") as info:
        await session.read_file("ten.txt", max_bytes=9)
    assert (info.value.size, info.value.limit) == (10, 9)
    chunks = [c async for c in session.read_file_chunks("ten.txt", chunk_size=3)]
    assert chunks == [b"012", b"345", b"678", b"9"]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(sandbox.InvalidArgumentError, match="chunk_size"):
            session.read_file_chunks("ten.txt", chunk_size=bad)  # type: ignore[arg-type]
    with pytest.raises(sandbox.InvalidArgumentError, match="max_bytes"):
        await session.read_file("ten.txt", max_bytes=-1)
    with pytest.raises(sandbox.InvalidArgumentError, match="read_limit_bytes"):
        UnixLocalSession(read_limit_bytes=-5)
    async with UnixLocalSession(workdir=tmp_path, read_limit_bytes=4) as small:
        with pytest.raises(sandbox.FileTooLargeError, match="limit of 4 bytes"):
            await small.read_file("ten.txt")
        # Streaming has no limit here: it never holds the file.
        assert b"".join([c async for c in small.read_file_chunks("ten.txt")]) == b"0123456789"


async def test_write_chunks_from_sync_and_async_iterables(
    session: UnixLocalSession, tmp_path: Path
) -> None:
    async def produce() -> object:
        for part in (b"a" * 5, bytearray(b"b"), memoryview(b"cc"), "dé"):
            await asyncio.sleep(0)
            yield part

    await session.write_file_chunks("deep/er/out.bin", produce())  # type: ignore[arg-type]
    assert (tmp_path / "deep/er/out.bin").read_bytes() == b"aaaaabccd\xc3\xa9"
    await session.write_file_chunks("deep/er/out.bin", [b"short"])
    assert (tmp_path / "deep/er/out.bin").read_bytes() == b"short", "the old tail must go"
    await session.write_file_chunks("empty.bin", [])
    assert (tmp_path / "empty.bin").read_bytes() == b""
    with pytest.raises(sandbox.InvalidArgumentError, match="iterable of chunks"):
        await session.write_file_chunks("x.bin", b"not chunks")
    with pytest.raises(sandbox.InvalidArgumentError, match="must be bytes or str"):
        await session.write_file_chunks("x.bin", [b"ok", 42])  # type: ignore[list-item]


async def test_symlinks_inside_are_followed_links_out_refused(
    session: UnixLocalSession, tmp_path: Path
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "real.txt").write_bytes(b"real")
    os.symlink("sub/real.txt", tmp_path / "rel-link")
    os.symlink("../sub", tmp_path / "sub" / "up-and-back")
    os.symlink(str(tmp_path / "sub"), tmp_path / "abs-inside")
    os.symlink("/etc", tmp_path / "abs-out")
    os.symlink("../..", tmp_path / "sub" / "rel-out")
    assert await session.read_file("rel-link") == b"real"
    assert await session.read_file("sub/up-and-back/real.txt") == b"real"
    assert await session.read_file("abs-inside/real.txt") == b"real"
    await session.write_file("rel-link", b"through the link")
    assert (tmp_path / "sub" / "real.txt").read_bytes() == b"through the link"
    assert os.path.islink(tmp_path / "rel-link")
    for path in ("abs-out/passwd", "sub/rel-out/x"):
        with pytest.raises(sandbox.WorkspacePathError, match=re.escape(repr(path))):
            await session.read_file(path)
        with pytest.raises(sandbox.WorkspacePathError):
            await session.write_file(path, b"x")


def test_both_resolvers_agree(tmp_path: Path) -> None:
    """The openat2 path and the walk older kernels get give the same answers."""
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_bytes(b"f")
    (root / "file").write_bytes(b"x")
    os.mkfifo(root / "fifo")
    for name, target in (
        ("lf", "sub/f"),
        ("lsub", "sub"),
        ("dangling", "missing/dir"),
        ("abs-in", str(root / "sub")),
        ("abs-out", str(tmp_path)),
        ("loop", "loop"),
    ):
        os.symlink(target, root / name)
    cases = [
        ("sub/f", False), ("lf", False), ("lsub/f", False), ("abs-in/f", False),
        ("abs-out/ws/file", False), ("lsub/../file", False), ("fifo", False),
        ("fifo", True), ("sub", False), ("sub", True), (".", False), ("sub/", False),
        ("file/", False), ("file/x", False), ("file/x", True), ("nope", False),
        ("dangling/x", True), ("lsub/new/x.txt", True), ("loop", False), ("a/../../x", False),
        (str(root / "sub" / "f"), False), ("/etc/hostname", False),
    ]  # fmt: skip
    if not safe_open.openat2_available():
        pytest.skip("this kernel has no openat2: only the walk runs")
    answers: dict[str, list[str]] = {}
    for resolver in ("openat2", "walk"):
        for path, write in cases:
            try:
                opened = safe_open.open_regular(str(root), path, write=write, resolver=resolver)
            except sandbox.SandboxError as exc:
                outcome = type(exc).__name__
            else:
                os.close(opened.fd)
                outcome = "ok"
            answers.setdefault(resolver, []).append(f"{path} {write}: {outcome}")
    assert answers["openat2"] == answers["walk"]
    assert "lsub/new/x.txt True: ok" in answers["walk"]
    assert (root / "sub" / "new" / "x.txt").exists()
    assert not (root / "missing").exists(), "never made through a dangling link"
    assert "abs-out/ws/file False: WorkspacePathError" in answers["walk"]


async def test_no_fd_left_after_failures_and_abandoned_streams(
    session: UnixLocalSession, tmp_path: Path
) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big.bin").write_bytes(b"z" * (4 << 20))
    await session.read_file("big.bin")  # warm up the executor threads
    fds = open_fds()
    for _ in range(20):
        with contextlib.suppress(sandbox.NotAFileError):
            await session.read_file("fifo")
        with contextlib.suppress(sandbox.NotAFileError):
            await session.write_file("fifo", b"x")
        stream = session.read_file_chunks("big.bin", chunk_size=1024)
        async with contextlib.aclosing(stream):
            assert len(await anext(stream)) == 1024
    # A stream cancelled while a chunk is being read closes its fd once the read ends.
    stream = session.read_file_chunks("big.bin", chunk_size=1)
    assert await anext(stream) == b"z"
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)  # one loop turn: the next chunk's executor call is under way
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert await eventually(lambda: open_fds() == fds)
