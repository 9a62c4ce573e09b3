"""settle() and settle_each() (sandbox.settle): ownership of the cleanup task, repeated
cancellation, which error wins, the batch's bounds."""

from __future__ import annotations

import asyncio

import pytest

from sandbox.errors import CleanupError
from sandbox.settle import DEFAULT_BATCH_CONCURRENCY, _running, attempt_all, settle, settle_each


async def test_the_cleanup_task_is_held_while_it_runs_and_released_after() -> None:
    release = asyncio.Event()
    held: list[bool] = []

    async def cleanup() -> str:
        held.append(asyncio.current_task() in _running)
        await release.wait()
        return "done"

    waiter = asyncio.create_task(settle(cleanup()))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert held == [True]
    assert len(_running) == 1
    release.set()
    assert await waiter == "done"
    assert not _running


async def test_a_cleanup_that_is_done_at_once_returns_its_result() -> None:
    async def cleanup() -> int:
        return 3

    assert await settle(cleanup()) == 3
    future = asyncio.get_running_loop().create_future()
    future.set_result("ready")
    assert await settle(future) == "ready"


async def test_the_cleanup_error_wins_over_a_cancellation_with_a_message() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await release.wait()
        raise OSError("teardown failed")

    waiter = asyncio.create_task(settle(cleanup()))
    await started.wait()
    waiter.cancel("closing")
    await asyncio.sleep(0)
    assert not waiter.done()
    release.set()
    with pytest.raises(OSError, match="teardown failed"):
        await waiter


async def test_a_cancelled_caller_gets_its_first_message_after_the_cleanup() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    finished: list[bool] = []

    async def cleanup() -> int:
        started.set()
        await release.wait()
        finished.append(True)
        return 1

    waiter = asyncio.create_task(settle(cleanup()))
    await started.wait()
    waiter.cancel("first")
    await asyncio.sleep(0)
    waiter.cancel("second")
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError) as info:
        await waiter
    assert info.value.args == ("first",)
    assert finished == [True]


async def test_a_cleanup_cancelled_by_someone_else_is_reported_as_cancelled() -> None:
    # Loop shutdown cancels every task, the cleanup too: the caller was not cancelled,
    # so the error carries no caller's message.
    started = asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await asyncio.Event().wait()

    waiter = asyncio.create_task(settle(cleanup()))
    await started.wait()
    (inner,) = _running
    inner.cancel("shutdown")
    with pytest.raises(asyncio.CancelledError) as info:
        await waiter
    assert info.value.args == ()
    assert waiter.cancelling() == 0  # not the caller's cancellation


async def test_a_cancelled_cleanup_after_a_cancelled_caller_keeps_the_callers_message() -> None:
    started, stop = asyncio.Event(), asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await stop.wait()
        raise asyncio.CancelledError("cleanup gave up")

    waiter = asyncio.create_task(settle(cleanup()))
    await started.wait()
    waiter.cancel("caller")
    await asyncio.sleep(0)
    stop.set()
    with pytest.raises(asyncio.CancelledError) as info:
        await waiter
    assert info.value.args == ("caller",)


async def test_a_cleanup_that_cancels_itself_is_a_cancellation() -> None:
    async def cleanup() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await settle(cleanup())


# --- batches ---------------------------------------------------------------------------


async def test_one_failure_is_raised_as_itself_after_every_item() -> None:
    seen: list[int] = []

    async def teardown(item: int) -> None:
        seen.append(item)
        if item == 2:
            raise KeyError(item)

    with pytest.raises(KeyError):
        await settle_each(iter(range(5)), teardown)
    assert sorted(seen) == [0, 1, 2, 3, 4]


async def test_several_failures_are_one_cleanup_error_naming_the_first() -> None:
    async def teardown(item: int) -> None:
        raise RuntimeError(f"item {item}")

    with pytest.raises(CleanupError) as info:
        await settle_each([1, 2], teardown, concurrency=1)
    assert str(info.value) == "2 teardowns failed: item 1"
    assert [str(e) for e in info.value.errors] == ["item 1", "item 2"]


async def test_no_failure_raises_nothing() -> None:
    seen: list[int] = []

    async def teardown(item: int) -> None:
        seen.append(item)

    await settle_each([7], teardown)
    await settle_each([], teardown)
    assert seen == [7]


async def peak_of(count: int, **kwargs: int) -> int:
    running = peak = 0
    gate = asyncio.Event()

    async def teardown(item: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if peak >= count:
            gate.set()
        await asyncio.sleep(0)
        running -= 1

    await settle_each(range(count), teardown, **kwargs)
    return peak


async def test_the_default_batch_runs_eight_at_once() -> None:
    assert DEFAULT_BATCH_CONCURRENCY == 8
    assert await peak_of(20) == 8


@pytest.mark.parametrize(("concurrency", "peak"), [(0, 1), (-3, 1), (1, 1), (2, 2)])
async def test_a_concurrency_below_one_still_runs_one_at_a_time(
    concurrency: int, peak: int
) -> None:
    assert await peak_of(6, concurrency=concurrency) == peak


async def test_a_cancelled_batch_attempts_every_item_then_reports_the_cancellation() -> None:
    gate = asyncio.Event()
    done: list[int] = []

    async def teardown(item: int) -> None:
        await gate.wait()
        done.append(item)

    waiter = asyncio.create_task(settle_each(range(4), teardown, concurrency=2))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.sleep(0)
    assert not waiter.done()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert sorted(done) == [0, 1, 2, 3]


async def test_attempt_all_on_its_own_is_not_settled() -> None:
    gate = asyncio.Event()

    async def teardown(item: int) -> None:
        await gate.wait()

    task = asyncio.create_task(attempt_all([1], teardown, 1))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _cancel_when_done(cleanup: asyncio.Task[object], caller: list[asyncio.Task[object]]) -> None:
    # Registered before `settle` shields the cleanup, so it runs first when the cleanup
    # ends: the caller is cancelled in that same step, its wake-up still pending.
    cleanup.add_done_callback(lambda _: caller[0].cancel("caller"))


async def test_a_caller_cancelled_as_the_cleanup_ends_is_still_cancelled() -> None:
    release = asyncio.Event()

    async def cleanup() -> str:
        await release.wait()
        return "done"

    inner: asyncio.Task[object] = asyncio.create_task(cleanup())
    caller: list[asyncio.Task[object]] = []
    _cancel_when_done(inner, caller)
    caller.append(asyncio.create_task(settle(inner)))
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError) as info:
        await caller[0]
    assert info.value.args == ("caller",)
    assert inner.result() == "done"


async def test_a_cleanup_error_in_the_step_its_caller_is_cancelled_wins() -> None:
    release = asyncio.Event()

    async def cleanup() -> None:
        await release.wait()
        raise OSError("teardown failed")

    inner: asyncio.Task[object] = asyncio.create_task(cleanup())
    caller: list[asyncio.Task[object]] = []
    _cancel_when_done(inner, caller)
    caller.append(asyncio.create_task(settle(inner)))
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(OSError, match="teardown failed"):
        await caller[0]


# ---- the caller's view: results, repeated cancellation, error precedence ---------------


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
