"""Why `sandbox.settle` and `sandbox.tasks` are not the stdlib (issue 36).

Each scenario runs on our helper and on the nearest stdlib code (anyio is not a runtime
dependency, and its shielded `CancelScope` does not hold off a plain `task.cancel()`:
test_an_anyio_shield_does_not_hold_off_a_plain_cancel).
Our row is the property the library relies on: it fails if the helper is swapped for
the stdlib one. The stdlib row records that the stdlib lacks it today; if a later
Python gains it, that row fails and ours can go. docs/performance.md has the costs.

Shown elsewhere, not repeated here. In tests/session/test_settle.py: the cleanup task
held against garbage collection (test_the_cleanup_task_is_held_while_it_runs_and_released_after),
repeated cancellations and the first one's message kept
(test_a_cancelled_caller_gets_its_first_message_after_the_cleanup), the batch's bound
(test_batch_concurrency_is_bounded, test_the_default_batch_runs_eight_at_once), several
failures as one `CleanupError` (test_several_failures_are_one_cleanup_error_naming_the_first).
In tests/session/test_tasks.py: `first_failure` raising the error itself, not an
ExceptionGroup (test_first_failure_raises_a_tasks_error_and_stops_the_rest), and taking
a plain future as `until` (test_first_failure_returns_when_until_finishes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

import pytest

from sandbox.settle import settle, settle_each
from sandbox.tasks import cancel_and_wait, first_failure

Waiter = Callable[[Coroutine[Any, Any, None]], Awaitable[object]]


async def steps(count: int = 3) -> None:
    """Let the loop run a few steps: enough for anything already scheduled to happen."""
    for _ in range(count):
        await asyncio.sleep(0)


# --- settle vs asyncio.shield ------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait_with", "waits"), [(settle, True), (asyncio.shield, False)], ids=["settle", "shield"]
)
async def test_a_cancelled_caller_waits_for_its_cleanup(wait_with: Waiter, waits: bool) -> None:
    started, release, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await release.wait()
        finished.set()

    async def caller() -> None:
        await wait_with(cleanup())

    task = asyncio.create_task(caller())
    await started.wait()
    task.cancel("closing")
    await steps()
    assert (not task.done()) is waits  # the shield lets the caller go at once
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set() is waits  # settle: done before the caller left
    await finished.wait()  # the shielded cleanup still ends (after its caller left)


async def test_an_anyio_shield_does_not_hold_off_a_plain_cancel() -> None:
    # anyio is only here as a dependency of optional extras; its shielded scope guards
    # against its own scopes' cancellation, not the `task.cancel()` that asyncio.timeout,
    # wait_for and TaskGroup send: the cleanup, run in the caller's task, is cut short.
    anyio = pytest.importorskip("anyio")
    started, finished = asyncio.Event(), asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await asyncio.Event().wait()
        finished.set()

    async def caller() -> None:
        with anyio.CancelScope(shield=True):
            await cleanup()

    task = asyncio.create_task(caller())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not finished.is_set()


@pytest.mark.parametrize(
    ("wait_with", "raised"),
    [(settle, OSError), (asyncio.shield, asyncio.CancelledError)],
    ids=["settle", "shield"],
)
async def test_the_cleanup_error_reaches_a_cancelled_caller(
    wait_with: Waiter, raised: type[BaseException]
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    failed = asyncio.Event()

    async def cleanup() -> None:
        started.set()
        await release.wait()
        failed.set()
        raise OSError("teardown failed")

    async def caller() -> None:
        await wait_with(cleanup())

    task = asyncio.create_task(caller())
    await started.wait()
    task.cancel()
    await steps()
    release.set()
    with pytest.raises(raised):  # the shield: the error is dropped, unseen
        await task
    await failed.wait()
    await steps()  # the shield's inner task ends (its error consumed by the shield)


# --- settle_each vs asyncio.TaskGroup ------------------------------------------------------


async def taskgroup_batch(items: Iterable[int], teardown: Callable[[int], Awaitable[None]]) -> None:
    """The batch a TaskGroup gives as it is: one task per item."""

    async def one(item: int) -> None:
        await teardown(item)

    async with asyncio.TaskGroup() as group:
        for item in items:
            group.create_task(one(item))


@pytest.mark.parametrize(
    ("run_batch", "raised", "siblings"),
    [(settle_each, OSError, "done"), (taskgroup_batch, ExceptionGroup, "cancelled")],
    ids=["settle_each", "TaskGroup"],
)
async def test_a_failed_teardown_leaves_the_others_running(
    run_batch: Callable[[Iterable[int], Callable[[int], Awaitable[None]]], Awaitable[None]],
    raised: type[BaseException],
    siblings: str,
) -> None:
    # Item 0 fails while 1..3 wait: a TaskGroup cancels them, a teardown batch must not
    # (each one left undone is a process or sandbox leaked). One failure is raised as
    # itself, not wrapped in a group.
    all_waiting, failed, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    outcome: dict[int, str] = {}

    async def teardown(item: int) -> None:
        if item == 0:
            await all_waiting.wait()
            failed.set()
            raise OSError("teardown 0 failed")
        try:
            if len(outcome) == 2:
                all_waiting.set()
            outcome[item] = "waiting"
            await release.wait()
            outcome[item] = "done"
        except asyncio.CancelledError:
            outcome[item] = "cancelled"
            raise

    batch = asyncio.create_task(run_batch(range(4), teardown))
    await failed.wait()
    release.set()
    with pytest.raises(raised):
        await batch
    assert outcome == {1: siblings, 2: siblings, 3: siblings}


# --- cancel_and_wait vs cancel + asyncio.wait / gather -----------------------------------


async def cancel_then_wait(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel, then `asyncio.wait` for them."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)


async def cancel_then_gather(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel, then `asyncio.gather` them with their errors returned."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize(
    ("stop", "waits"),
    [(cancel_and_wait, True), (cancel_then_wait, False), (cancel_then_gather, True)],
    ids=["cancel_and_wait", "asyncio.wait", "asyncio.gather"],
)
async def test_a_cancelled_caller_still_waits_for_the_tasks_to_stop(
    stop: Callable[[list[asyncio.Task[None]]], Awaitable[None]], waits: bool
) -> None:
    # gather has the property too: ours is kept for its cost (docs/performance.md) and
    # for logging the errors it consumes. Both pass the caller's cancellation on to the
    # task they wait for, so this one finishes its cleanup whatever comes.
    stopping, release, stopped = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def reader() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopping.set()
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    pass  # the caller's, passed on: the cleanup goes on
            stopped.set()

    child = asyncio.create_task(reader())
    await steps(1)
    caller = asyncio.create_task(stop([child]))
    await stopping.wait()
    caller.cancel()
    await steps()
    assert (not caller.done()) is waits  # asyncio.wait lets the caller go at once
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert stopped.is_set() is waits
    await stopped.wait()


# --- first_failure vs asyncio.TaskGroup -----------------------------------------------------


async def taskgroup_until(
    reader: asyncio.Event, until: asyncio.Event, ended: asyncio.Event
) -> None:
    """A TaskGroup over the reader and the `until` wait: it ends when both have."""
    async with asyncio.TaskGroup() as group:
        group.create_task(reader.wait())
        group.create_task(until.wait())
    ended.set()


async def first_failure_until(
    reader: asyncio.Event, until: asyncio.Event, ended: asyncio.Event
) -> None:
    """`first_failure` over the same two, as tasks made beforehand (as its callers do)."""
    read = asyncio.ensure_future(reader.wait())
    await first_failure([read], asyncio.ensure_future(until.wait()))
    ended.set()
    await read  # the caller gives its readers their grace (here: until the test ends it)


@pytest.mark.parametrize(
    ("wait_with", "returns"),
    [(first_failure_until, True), (taskgroup_until, False)],
    ids=["first_failure", "TaskGroup"],
)
async def test_until_ends_the_wait_while_a_reader_still_runs(
    wait_with: Callable[[asyncio.Event, asyncio.Event, asyncio.Event], Awaitable[None]],
    returns: bool,
) -> None:
    # A command's exit status ends the wait; its readers (still open) are the caller's
    # to stop or give a grace. A TaskGroup holds on until every task has ended.
    reader, until, ended = asyncio.Event(), asyncio.Event(), asyncio.Event()
    waiter = asyncio.create_task(wait_with(reader, until, ended))
    await steps()
    until.set()
    await steps()
    assert ended.is_set() is returns
    reader.set()
    await waiter
    assert ended.is_set()
