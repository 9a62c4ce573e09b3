"""The one rule for side-by-side tasks: nothing keeps running after a call unwound.

Wherever the library runs tasks concurrently (readers, pumps, watchers, stream
collectors), a branch that fails cancels its siblings and waits for them to finish
before the error propagates, and a caller that is cancelled does the same. Concurrent
teardowns are the one exception (`sandbox.settle.attempt_all` attempts every item).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, cast

logger = logging.getLogger("sandbox")


async def cancel_and_wait(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait until every one has finished; their results and errors
    are consumed (an error is only logged: the caller is already handling one, or is
    tearing down). Re-raises the caller's own cancellation."""
    # Kept over the stdlib (bench/settle_cases.py, tests/test_settle_vs_stdlib.py): a
    # TaskGroup cannot take tasks already running; cancel + `asyncio.wait` lets a
    # cancelled caller leave before they stop; cancel + `gather(return_exceptions=True)`
    # does the job but costs 12.1 us of CPU for one task (33.1 for 8) where this costs 7.9
    # (20.4), and logs nothing.
    # An awaited coroutine under asyncio always runs in a task.
    current = cast("asyncio.Task[Any]", asyncio.current_task())
    # Our caller's cancellations are counted, not told apart by the error: one that lands
    # while we await a task is passed on to that task, and comes back as the task's own;
    # one that lands as a task ends is raised at once, at that `await`. Either way it is
    # re-raised only after every task finished.
    before = current.cancelling()
    for task in tasks:
        task.cancel()
    for task in tasks:
        try:
            await task
        except asyncio.CancelledError:
            pass  # the task's own, or our caller's: that one is counted, raised below
        except Exception as exc:
            logger.debug("a background task failed while stopped: %s", type(exc).__name__)
    if current.cancelling() > before:
        raise asyncio.CancelledError


async def first_failure(tasks: Sequence[asyncio.Future[Any]], until: asyncio.Future[Any]) -> None:
    """Wait until `until` is done, or raise as soon as it or one of `tasks` fails: then
    (and when this is cancelled) `until` and every task are cancelled and awaited first,
    so nothing keeps running while the error propagates. `tasks` that finish cleanly
    before `until` are fine (a reader that reached its end)."""
    # Not a TaskGroup, which would hold on until every reader ended (here `until` ends
    # the wait and the caller gives its readers a grace), takes only coroutines it
    # starts itself, and raises the error inside an ExceptionGroup
    # (tests/test_settle_vs_stdlib.py). It costs 28.6 us of CPU for two readers and `until`
    # where a TaskGroup of the same three takes 24.0 (bench/settle_cases.py).
    try:
        while True:
            for task in (until, *tasks):
                error = task.exception() if task.done() and not task.cancelled() else None
                if error is not None:
                    raise error
            if until.done():
                return
            running = [until, *(task for task in tasks if not task.done())]
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        await cancel_and_wait([until, *tasks])
        raise
