"""Our settled cleanup and side-by-side task helpers (`sandbox.settle`, `sandbox.tasks`)
beside the closest stdlib code that does the same job (issue 36): what keeping ours
costs per call. anyio is not a runtime dependency (and its shielded `CancelScope` does
not hold off a plain `task.cancel()`), so the baselines are asyncio only.

Every figure is CPU microseconds per call (this process's CPU time: the machine is
shared, and wall time moved by 2x from one round to the next), lower is better; the
ratio is baseline / ours (1.0 = as fast as the stdlib, < 1 = ours is slower). Ours and
the baseline alternate within each round, on the same loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, TypeVar

from sandbox.errors import CleanupError
from sandbox.settle import settle, settle_each
from sandbox.tasks import cancel_and_wait, first_failure

from .local_cases import Config
from .measure import Figure

GROUP = "settle"
T = TypeVar("T")
BATCH = 64
CONCURRENCY = 8


ROUNDS = 9


async def per_call_us(call: Callable[[], Awaitable[object]], calls: int) -> float:
    """Mean CPU microseconds of `calls` sequential awaits of `call()`."""
    t0 = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - t0) / calls * 1e6


async def taskgroup_attempt_all(
    items: Iterable[T], teardown: Callable[[T], Awaitable[object]], concurrency: int
) -> None:
    """The batch written on `asyncio.TaskGroup`: a TaskGroup alone would cancel the
    siblings at the first failure, so each branch catches its own, and the same gate
    bounds it. Same results as `attempt_all`."""
    gate = asyncio.Semaphore(max(1, concurrency))
    errors: list[BaseException] = []

    async def one(item: T) -> None:
        async with gate:
            try:
                await teardown(item)
            except Exception as exc:
                errors.append(exc)

    async with asyncio.TaskGroup() as group:
        for item in items:
            group.create_task(one(item))
    if len(errors) == 1:
        raise errors.pop()
    if errors:
        raise CleanupError(f"{len(errors)} teardowns failed: {errors[0]}", errors)


async def gather_attempt_all(
    items: Iterable[T], teardown: Callable[[T], Awaitable[object]], concurrency: int
) -> None:
    """The batch on `asyncio.gather(..., return_exceptions=True)`, as `attempt_all` had it
    before issue 36: kept to show why it moved to a TaskGroup."""
    gate = asyncio.Semaphore(max(1, concurrency))
    errors: list[BaseException] = []

    async def one(item: T) -> None:
        async with gate:
            try:
                await teardown(item)
            except Exception as exc:
                errors.append(exc)

    await asyncio.gather(*(one(item) for item in items), return_exceptions=True)
    if len(errors) == 1:
        raise errors.pop()
    if errors:
        raise CleanupError(f"{len(errors)} teardowns failed: {errors[0]}", errors)


async def settled_gather(items: list[int], teardown: Callable[[int], Awaitable[None]]) -> None:
    """The gather batch, settled."""
    await settle(gather_attempt_all(items, teardown, CONCURRENCY))


async def settled_taskgroup(items: list[int], teardown: Callable[[int], Awaitable[None]]) -> None:
    """The TaskGroup batch, settled as ours is."""
    await settle(taskgroup_attempt_all(items, teardown, CONCURRENCY))


async def noop(_: object = None) -> None:
    """A teardown with nothing to wait for."""


async def short(_: object = None) -> None:
    """A teardown that yields to the loop once (a kill answered at once)."""
    await asyncio.sleep(0)


async def settle_one(cfg: Config) -> list[Figure]:
    """`settle(cleanup)` beside `asyncio.shield(cleanup)`, the stdlib's nearest: the
    shield lets the caller leave at its cancellation while the cleanup runs on, which is
    why ours loops; when nobody cancels, the two do the same work."""
    calls = 2000 if cfg.quick else 10000
    fig = Figure(GROUP, "settle one no-op cleanup", "us", False)
    for _ in range(ROUNDS):
        fig.ours.append(await per_call_us(lambda: settle(noop()), calls))
        fig.baseline.append(await per_call_us(lambda: asyncio.shield(noop()), calls))
    fig.note = "baseline: await asyncio.shield(cleanup) (does not wait out a cancellation)"
    return [fig]


async def settle_batches(cfg: Config) -> list[Figure]:
    """`settle_each` beside the same batch on a TaskGroup, both under `settle` (the stdlib
    has no wait that outlives the caller's cancellation, so the TaskGroup needs it too):
    64 no-op and 64 short teardowns 8 at a time, and a batch of one (the common one: a
    terminate, a finalizer); and beside the batch on gather, which ours used before."""
    calls = 100 if cfg.quick else 400
    figures = []
    for label, teardown, size, baseline in (
        (f"batch of {BATCH} no-op teardowns", noop, BATCH, settled_taskgroup),
        (f"batch of {BATCH} short teardowns", short, BATCH, settled_taskgroup),
        ("batch of 1 short teardown", short, 1, settled_taskgroup),
        (f"batch of {BATCH} no-op teardowns, vs gather", noop, BATCH, settled_gather),
    ):
        fig = Figure(GROUP, label, "us", False)
        many = calls if size > 1 else calls * 20
        items = list(range(size))
        ours = partial(settle_each, items, teardown, concurrency=CONCURRENCY)
        stdlib = partial(baseline, items, teardown)
        for _ in range(ROUNDS):
            fig.ours.append(await per_call_us(ours, many))
            fig.baseline.append(await per_call_us(stdlib, many))
        how = "gather" if baseline is settled_gather else "a TaskGroup"
        fig.note = f"{CONCURRENCY} at once; baseline: the batch on {how}, also settled"
        figures.append(fig)
    return figures


async def parked() -> None:
    """A reader parked on a read that never comes: it ends when cancelled."""
    await asyncio.Event().wait()


async def gather_cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """The stdlib's cancel-and-wait: cancel, then gather with the errors returned."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def wait_cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel, then `asyncio.wait` (which a cancelled caller leaves at once)."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)


async def cancel_tasks(cfg: Config) -> list[Figure]:
    """`cancel_and_wait` on 1 and 8 parked tasks beside cancel + gather(return_exceptions)
    and cancel + asyncio.wait. The tasks are made (and started) outside the timing."""
    calls = 1000 if cfg.quick else 4000
    figures = []
    for count in (1, 8):
        for name, baseline in (("gather", gather_cancel), ("wait", wait_cancel)):
            fig = Figure(GROUP, f"cancel_and_wait, {count} tasks, vs {name}", "us", False)
            for _ in range(ROUNDS):
                for side, stop in ((fig.ours, cancel_and_wait), (fig.baseline, baseline)):
                    total = 0.0
                    for _ in range(calls):
                        tasks = [asyncio.create_task(parked()) for _ in range(count)]
                        await asyncio.sleep(0)  # every task parked on its read
                        t0 = time.process_time()
                        await stop(tasks)
                        total += time.process_time() - t0
                    side.append(total / calls * 1e6)
            fig.note = f"baseline: task.cancel() each, then asyncio.{name}(...)"
            figures.append(fig)
    return figures


async def until_after_readers(readers: int) -> None:
    """`first_failure` over `readers` tasks that end at once and an `until` that ends
    after them (a command's output read, then its exit status)."""
    tasks = [asyncio.create_task(short()) for _ in range(readers)]
    until = asyncio.create_task(short())
    await first_failure(tasks, until)


async def until_after_readers_taskgroup(readers: int) -> None:
    """The same on a TaskGroup: it waits for every task (here the readers end first, so
    the outcome is the same; a reader still running would hold it)."""
    async with asyncio.TaskGroup() as group:
        for _ in range(readers):
            group.create_task(short())
        group.create_task(short())


async def first_failures(cfg: Config) -> list[Figure]:
    """`first_failure` with two readers (the Modal one-shot's shape) beside a TaskGroup
    running the same three coroutines."""
    calls = 2000 if cfg.quick else 8000
    fig = Figure(GROUP, "first_failure, 2 readers + until", "us", False)
    for _ in range(ROUNDS):
        fig.ours.append(await per_call_us(lambda: until_after_readers(2), calls))
        fig.baseline.append(await per_call_us(lambda: until_after_readers_taskgroup(2), calls))
    fig.note = "tasks made inside the timing on both sides; baseline: asyncio.TaskGroup"
    return [fig]


CASES = [settle_one, settle_batches, cancel_tasks, first_failures]
