"""Side-by-side tasks (sandbox.tasks): cancel_and_wait and first_failure, event by event."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sandbox.tasks import cancel_and_wait, first_failure


async def test_cancel_and_wait_really_waits_for_each_task_to_finish() -> None:
    finished: list[str] = []
    release = asyncio.Event()

    async def slow_to_stop(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # its cleanup takes a while
            finished.append(name)

    tasks = [asyncio.create_task(slow_to_stop(n)) for n in "ab"]
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cancel_and_wait(tasks))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()  # both are still in their cleanup
    assert finished == []
    release.set()
    await waiter
    assert finished == ["a", "b"]
    assert all(task.cancelled() for task in tasks)


async def test_cancel_and_wait_consumes_errors_and_results(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise OSError("boom")

    async def done() -> int:
        return 1

    failing = asyncio.create_task(fails_on_cancel())
    finished = asyncio.create_task(done())
    await asyncio.sleep(0)
    with caplog.at_level(logging.DEBUG, logger="sandbox"):
        await cancel_and_wait([failing, finished])
    assert isinstance(failing.exception(), OSError)
    assert finished.result() == 1
    assert "OSError" in caplog.text
    assert "boom" not in caplog.text  # the type only: messages may hold secrets


async def test_cancel_and_wait_reraises_its_callers_cancellation() -> None:
    gate = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await gate.wait()

    child = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cancel_and_wait([child]))
    await asyncio.sleep(0)
    waiter.cancel()  # the caller is cancelled while the child is still stopping
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done()  # it still waits for the child
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert child.done()


async def test_cancel_and_wait_of_nothing_returns() -> None:
    await cancel_and_wait([])


async def test_first_failure_returns_when_until_finishes() -> None:
    until = asyncio.get_running_loop().create_future()
    reader_done = asyncio.get_running_loop().create_future()
    reader_done.set_result(None)  # a reader that reached its end is fine
    other = asyncio.create_task(asyncio.Event().wait())
    waiter = asyncio.create_task(first_failure([reader_done, other], until))
    await asyncio.sleep(0)
    assert not waiter.done()
    until.set_result("ok")
    await waiter
    assert not other.done()  # a clean return cancels nothing
    other.cancel()
    await asyncio.gather(other, return_exceptions=True)


async def test_first_failure_raises_a_tasks_error_and_stops_the_rest() -> None:
    until = asyncio.get_running_loop().create_future()
    stopped: list[str] = []

    async def sibling() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.append("sibling")

    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("reader broke")

    running = asyncio.create_task(sibling())
    broken = asyncio.create_task(failing())
    with pytest.raises(ValueError, match="reader broke"):
        await first_failure([running, broken], until)
    assert stopped == ["sibling"]
    assert running.cancelled()
    assert until.cancelled()


async def test_first_failure_raises_an_error_already_there() -> None:
    until = asyncio.get_running_loop().create_future()
    failed = asyncio.get_running_loop().create_future()
    failed.set_exception(KeyError("early"))
    with pytest.raises(KeyError):
        await first_failure([failed], until)
    assert until.cancelled()


async def test_first_failure_raises_the_until_futures_error() -> None:
    until = asyncio.get_running_loop().create_future()
    until.set_exception(RuntimeError("until failed"))
    other = asyncio.create_task(asyncio.Event().wait())
    with pytest.raises(RuntimeError, match="until failed"):
        await first_failure([other], until)
    assert other.cancelled()


async def test_first_failure_ignores_cancelled_tasks() -> None:
    until = asyncio.get_running_loop().create_future()
    cancelled = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    waiter = asyncio.create_task(first_failure([cancelled], until))
    await asyncio.sleep(0)
    until.set_result(None)
    await waiter


async def test_first_failure_keeps_waiting_after_a_task_ends_cleanly() -> None:
    loop = asyncio.get_running_loop()
    until = loop.create_future()
    first = loop.create_future()
    second = asyncio.create_task(asyncio.Event().wait())
    waiter = asyncio.create_task(first_failure([first, second], until))
    await asyncio.sleep(0)
    first.set_result(None)
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done()
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    await asyncio.sleep(0)
    assert not waiter.done()
    until.set_result(None)
    await waiter


async def test_cancelling_first_failure_cancels_and_awaits_everything() -> None:
    until = asyncio.get_running_loop().create_future()
    release = asyncio.Event()
    stopped: list[str] = []

    async def slow_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()
            stopped.append("child")

    child = asyncio.create_task(slow_stop())
    waiter = asyncio.create_task(first_failure([child], until))
    await asyncio.sleep(0)
    waiter.cancel()
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiter.done()  # still waiting for the child's cleanup
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert stopped == ["child"]
    assert until.cancelled()


async def test_a_cancellation_as_a_task_ends_still_waits_for_the_rest() -> None:
    # The caller is cancelled in the very step the first task ends (its done callback,
    # registered first, runs before the caller wakes): the cancellation is raised at
    # that `await`, and must still wait for the second task before it leaves.
    stopping, release = asyncio.Event(), asyncio.Event()

    async def quick() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "stopped"  # ends cleanly when cancelled
        return "never"

    async def slow() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopping.set()
            await release.wait()

    first = asyncio.create_task(quick())
    second = asyncio.create_task(slow())
    waiter: asyncio.Task[None] | None = None

    def cancel_the_caller(_: object) -> None:
        assert waiter is not None
        waiter.cancel()

    first.add_done_callback(cancel_the_caller)
    waiter = asyncio.create_task(cancel_and_wait([first, second]))
    await stopping.wait()
    assert first.result() == "stopped"
    assert not waiter.done()  # still waiting for the second task
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert second.done()
