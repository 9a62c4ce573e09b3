"""`extract_archive_batched`: what came before a failure lands, a cancel lands nothing."""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator

import pytest

from sandbox.backend import extract_archive_batched
from sandbox.errors import InvalidArgumentError


class QueueingSink:
    """Queues every operation; `flush()` moves the queue into `landed`."""

    def __init__(self, *, flush_fails: bool = False) -> None:
        self.queued: list[str] = []
        self.landed: list[str] = []
        self.flushes = 0
        self.flush_fails = flush_fails

    async def make_dir(self, path: str, mode: int) -> None:
        self.queued.append(f"dir {path}")

    async def write_file(
        self, path: str, chunks: AsyncIterator[bytes], size: int, mode: int
    ) -> None:
        data = b"".join([chunk async for chunk in chunks])
        self.queued.append(f"file {path} {data!r}")

    async def make_symlink(self, path: str, target: str) -> None:
        self.queued.append(f"link {path}")

    async def flush(self) -> None:
        self.flushes += 1
        if self.flush_fails:
            raise OSError("the disk is gone")
        self.landed += self.queued
        self.queued.clear()


def _archive(*names: str, fifo_last: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = len(name)
            tar.addfile(info, io.BytesIO(name.encode()))
        if fifo_last:
            info = tarfile.TarInfo("pipe")
            info.type = tarfile.FIFOTYPE
            tar.addfile(info)
    return buf.getvalue()


async def _chunks(data: bytes, *, then: BaseException | None = None) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 512):
        yield data[start : start + 512]
    if then is not None:
        raise then


async def test_everything_lands_in_one_flush_at_the_end() -> None:
    sink = QueueingSink()
    count = await extract_archive_batched(_chunks(_archive("a", "b")), sink)
    assert count == 2
    assert sink.landed == ["file a b'a'", "file b b'b'"] and sink.flushes == 1


async def test_a_refused_member_lands_what_came_before_it() -> None:
    sink = QueueingSink()
    with pytest.raises(InvalidArgumentError, match="pipe"):
        await extract_archive_batched(_chunks(_archive("a", fifo_last=True)), sink)
    assert sink.landed == ["file a b'a'"] and not sink.queued


async def test_a_failing_source_lands_what_came_before_it() -> None:
    data = _archive("a", "b")[:2048]  # two members (header + data block each), no end
    sink = QueueingSink()
    with pytest.raises(ConnectionResetError):
        await extract_archive_batched(_chunks(data, then=ConnectionResetError("dropped")), sink)
    assert sink.landed == ["file a b'a'", "file b b'b'"]


async def test_a_failing_flush_does_not_hide_the_first_error() -> None:
    sink = QueueingSink(flush_fails=True)
    with pytest.raises(InvalidArgumentError, match="pipe"):
        await extract_archive_batched(_chunks(_archive("a", fifo_last=True)), sink)
    assert sink.flushes == 1 and not sink.landed


async def test_a_cancel_lands_nothing_more() -> None:
    sink = QueueingSink()
    data = _archive("a", "b")[:2048]
    with pytest.raises(asyncio.CancelledError):
        await extract_archive_batched(_chunks(data, then=asyncio.CancelledError()), sink)
    assert sink.flushes == 0 and sink.queued == ["file a b'a'", "file b b'b'"]
