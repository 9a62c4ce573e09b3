"""`OwnedTasks`: the tasks a session owns, and the one place teardowns go through.

Starts, spawns and one-shot commands run as tasks the session owns, not in their
caller's task: a cancelled caller cancels and awaits its task (settled), and a task the
close cancelled makes its caller raise `SessionClosedError` (it lost the race). Every
teardown of a process entry is handed to `settle_batch`: one settled task per batch
that attempts every entry (a few at a time), which the close waits for before the
backend stops. The entries come from the `ProcessRegistry`, already taken.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine
from typing import Any, Generic, TypeVar

from ..errors import CleanupError, SessionClosedError
from ..process_entry import H, PtyEntry
from ..process_handle import Process
from ..settle import DEFAULT_BATCH_CONCURRENCY, attempt_all, settle
from .admission import Admission
from .registry import ProcessRegistry

logger = logging.getLogger("sandbox")

T = TypeVar("T")


def closed_error(backend_name: str) -> SessionClosedError:
    """What a call that lost its race with the close raises."""
    return SessionClosedError(f"the {backend_name} session was closed")


async def finished(task: asyncio.Future[Any]) -> None:
    """Wait until `task` is done, without taking over its result or exception."""
    await asyncio.wait({task})


class OwnedTasks(Generic[H]):
    """The start, spawn and one-shot tasks of one session, and its teardown batches.

    `terminate` is the backend's `_terminate_pty_entry` hook; `admission.closing` says
    whether the session is closing or closed (a task that failed then lost to the close).
    `release` is the `_release_entry` hook, run instead of `terminate` for the entries a
    batch lets go of (a detach, a takeover: they stay the ref's); `changed()` is called
    after a process was admitted or a batch ended (the ref file follows).
    """

    def __init__(
        self,
        processes: ProcessRegistry[H],
        terminate: Callable[[PtyEntry[H]], Awaitable[None]],
        *,
        admission: Admission,
        concurrency: int = DEFAULT_BATCH_CONCURRENCY,
        release: Callable[[PtyEntry[H]], Awaitable[None]] | None = None,
        changed: Callable[[], None] | None = None,
    ) -> None:
        self.concurrency = concurrency
        # The `start()` in progress, if any (the close cancels it first).
        self.start_task: asyncio.Task[None] | None = None
        self._processes = processes
        self._terminate = terminate
        self._release = release or terminate
        self._changed = changed or (lambda: None)
        self._letting_go: set[int] = set()  # ids whose teardown releases, not ends
        self._admission = admission
        self._execs: set[asyncio.Task[Any]] = set()
        self._teardowns: set[asyncio.Task[None]] = set()

    @property
    def busy(self) -> bool:
        """Whether a one-shot command or a teardown batch is still running."""
        return bool(self._execs or self._teardowns)

    # ---- owned tasks ---------------------------------------------------------------

    async def wait(self, task: asyncio.Future[T]) -> T:
        """Wait for a task the session owns (a start, a spawn, a one-shot command).

        If the caller is cancelled, the task is cancelled and awaited (settled) before
        the cancellation propagates, so nothing it made outlives the call. If the close
        cancelled it (or broke it while tearing things down), this raises
        `SessionClosedError`: the caller lost the race.
        """
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            await settle(finished(task))
            raise
        if (task.cancelled() or task.exception() is not None) and self._admission.closing:
            error = None if task.cancelled() else task.exception()
            raise closed_error(self._processes.backend_name) from error
        return task.result()

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` (a one-shot command) as a task the close cancels and awaits."""
        return await self.wait(self.begin(work))

    def begin(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start `work` as a task the close cancels and awaits, without waiting for it
        (a streamed command: its caller takes its output as it comes, then `wait`s)."""
        task = asyncio.ensure_future(work)
        self._execs.add(task)
        task.add_done_callback(self._execs.discard)
        return task

    async def start_process(
        self,
        entry: PtyEntry[H],
        victim: PtyEntry[H] | None,
        *,
        prepare: Callable[[], None],
        spawn: Callable[[PtyEntry[H]], Awaitable[None] | None],
    ) -> None:
        """Bring a reserved entry to the registry: tear the prune `victim` down (its
        failure is only logged: not this start's), `prepare()` (open the recording),
        call `spawn(entry)` (the backend's hook) and run what it returns as an owned
        task, then admit it. A spawn that returns None did all of it without awaiting:
        no task is made, nothing could interleave with it.

        If anything fails or the caller is cancelled, the entry is torn down (settled)
        before the error propagates; if the close took the entry or came first, it is
        the close's (or ours, torn down here) and this raises `SessionClosedError`.
        """
        lost = closed_error(self._processes.backend_name)
        try:
            if victim is not None:
                await self.settle_batch([victim], log_errors=True)
            if not self._processes.is_starting(entry):
                raise lost  # closed while the victim went
            prepare()
            pending = spawn(entry)
            if pending is not None:
                task = asyncio.ensure_future(pending)
                entry.spawn_task = task
                await self.wait(task)
        except BaseException as exc:
            if self._processes.take_starting(entry):  # still ours to undo
                try:
                    await self.settle_batch([entry])
                except Exception as cleanup_exc:
                    exc.add_note(f"tearing down the failed start also failed: {cleanup_exc}")
            raise
        if self._admission.closing and self._processes.take_starting(entry):
            await self.settle_batch([entry])  # the spawn won against the close: undo it
            raise lost
        if not self._processes.admit(entry):
            raise lost  # the close took it over and tears it down
        self._changed()

    async def cancel_in_flight(self) -> None:
        """Cancel the one-shot commands and the spawns in progress, and wait for them
        (their hooks see the cancellation and undo what they made)."""
        in_flight: list[asyncio.Future[Any]] = [*self._execs, *self._processes.spawn_tasks()]
        for task in in_flight:
            task.cancel()
        if in_flight:
            await asyncio.wait(in_flight)

    # ---- teardowns -----------------------------------------------------------------

    async def settle_batch(
        self,
        entries: list[PtyEntry[H]],
        *,
        log_errors: bool = False,
        let_go: Collection[int] = (),
    ) -> None:
        """THE place where teardowns are handed over, attempted and awaited.

        The caller has already taken `entries` from the registry, so it owns them; this
        hands them to one settled task that tears every one down (`concurrency` at a
        time), which the close also waits for (`wait_teardowns`) before the backend
        stops. The finalizer, prune, terminate, terminate-all, failed starts and the
        close all come here; one entry is a batch of one. Failures are raised (several
        as a `CleanupError`), or only logged with `log_errors`. The entries whose ids
        are in `let_go` are released (`release`), not ended.
        """
        if not entries:
            return
        self._letting_go.update(let_go)
        task = asyncio.ensure_future(attempt_all(entries, self._teardown_entry, self.concurrency))
        self._teardowns.add(task)
        task.add_done_callback(self._teardowns.discard)
        try:
            await settle(task)
        except Exception as exc:
            if not log_errors:
                raise
            name = self._processes.backend_name
            logger.warning("%s session: a teardown failed: %s", name, exc)
        finally:
            self._changed()

    async def discard(self, entry: PtyEntry[H]) -> None:
        """Take `entry` from the registry if it is still there, and tear it down: at
        once if its `Process` handle's `finish_now` can, else settled."""
        if self._processes.take_entry(entry) and not self._teardown_nowait(entry):
            await self.settle_batch([entry])

    def _teardown_nowait(self, entry: PtyEntry[H]) -> bool:
        """`_teardown_entry` without a wait, if the handle's `Process.finish_now` ends
        the process (False: nothing was done). It never awaits, so no cancellation or
        close can come between its steps: the one owner is this call, from start to
        end. The same code for every caller: the `_terminate_pty_entry` hook (or a
        test's gate on it) is for what must wait."""
        write = entry.write_task
        if (write is not None and not write.done()) or entry.process_id in self._letting_go:
            return False
        handle = entry.handle
        if not isinstance(handle, Process):
            return False
        ended = True  # a handle that raised half-way ended the entry's teardown too
        try:
            ended = handle.finish_now()
        finally:
            if ended:
                self._finish_teardown(entry)
                self._changed()
        return ended

    async def wait_teardowns(self) -> None:
        """Wait until no teardown batch is running (the close, before the backend stops:
        a terminate or a prune another call owns finishes first)."""
        while self._teardowns:
            await asyncio.wait(list(self._teardowns))

    async def _teardown_entry(self, entry: PtyEntry[H]) -> None:
        # End a pending write, run the backend's teardown, then release the id.
        try:
            write = entry.write_task
            if write is not None and not write.done():
                write.cancel()
                await asyncio.wait({write})
            if entry.process_id in self._letting_go:
                self._letting_go.discard(entry.process_id)
                await self._release(entry)  # it stays the ref's (a detach, a takeover)
            else:
                await self._terminate(entry)
        finally:
            self._finish_teardown(entry)

    def _finish_teardown(self, entry: PtyEntry[H]) -> None:
        # The readers are stopped: the recording is complete (and valid) now.
        entry.close_terminal()
        self._processes.release(entry)
        # A window still waiting on this entry (a poll racing a terminate) must end
        # now, even if the backend could not report an exit status.
        entry.report_torn_down()

    async def settle_all(
        self, entries: list[PtyEntry[H]], *, let_go: Collection[int] = ()
    ) -> list[BaseException]:
        """`settle_batch(entries)`, then wait for every other batch; the failures are
        returned, not raised (a detach or a takeover's close goes on regardless)."""
        errors: list[BaseException] = []
        try:
            await self.settle_batch(entries, let_go=let_go)
        except CleanupError as exc:
            errors.extend(exc.errors)
        except Exception as exc:
            errors.append(exc)
        await self.wait_teardowns()
        return errors
