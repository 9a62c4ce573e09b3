"""The settle helper on its own: ownership, repeated cancellation, error precedence."""

from __future__ import annotations

import asyncio

import pytest

from sandbox import CleanupError
from sandbox.settle import settle, settle_each


async def test_result_is_returned() -> None:
    async def cleanup() -> int:
        await asyncio.sleep(0)
        return 7

    assert await settle(cleanup()) == 7


async def test_cleanup_outlives_repeated_cancellation() -> None:
    started, release, done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await release.wait()
        done.set()

    caught: list[BaseException] = []

    async def caller() -> None:
        try:
            await settle(cleanup())
        except BaseException as exc:
            caught.append(exc)
            raise

    task = asyncio.ensure_future(caller())
    await started.wait()
    for index in range(5):
        task.cancel(f"cancel-{index}")
        await asyncio.sleep(0)
        assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done.is_set()
    assert caught[0].args == ("cancel-0",)


async def test_cleanup_error_wins_over_cancellation() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await release.wait()
        raise ValueError("broken")

    task = asyncio.ensure_future(settle(cleanup()))
    await started.wait()
    task.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(ValueError, match="broken"):
        await task


async def test_batch_reports_every_failure_and_attempts_all() -> None:
    seen: list[int] = []

    async def teardown(item: int) -> None:
        seen.append(item)
        if item % 2:
            raise RuntimeError(f"item {item}")

    with pytest.raises(CleanupError) as info:
        await settle_each(range(6), teardown, concurrency=2)
    assert sorted(seen) == list(range(6))
    assert sorted(str(e) for e in info.value.errors) == ["item 1", "item 3", "item 5"]


async def test_batch_concurrency_is_bounded() -> None:
    running = 0
    peak = 0

    async def teardown(item: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        running -= 1

    await settle_each(range(20), teardown, concurrency=3)
    assert peak == 3
