"""A session's life: its state, its start and close tasks, and the check every call makes.

`Lifecycle` is the part of the session's `SessionCore` (`core.py`) that owns the state
machine (`SessionState`) and the close task, runs `start()` / `aclose()` / `detach()`'s
closing, answers "may a call run now?" (`admit`, the `Admission` of `admission.py`)
and "is the session closing?" (`closing`), keeps the ref file current after a change,
and does the work of an unclosed session's `__del__`. What the start and close tasks do is in the
functions below it, in order: a start that creates or resumes the sandbox and undoes
itself when it fails; a close that cancels what is in flight, takes every entry, tears
them down as one settled batch, waits for teardowns other calls own, then stops the
backend. The session is typed as `LifecycleSession`, the part of it used here (the
session imports this module, so this one must not import it back).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import warnings
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from ..durable import ops as durable_ops
from ..errors import (
    CleanupError,
    SessionClosedError,
    SessionNotStartedError,
    SessionStateError,
)
from ..process_entry import OutputSink
from ..settle import settle
from .ownership import finished

T = TypeVar("T")


class SessionState(enum.Enum):
    """Where a session is in its life."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class LifecycleSession(durable_ops.DurableSession, Protocol):
    """What the start and the close use of a session: its collaborators (through
    `DurableSession`) and the lifecycle hooks."""

    async def _start_backend(self) -> None: ...

    async def _stop_backend(self) -> None: ...

    def _abandon(self, entries: Sequence[OutputSink[Any]]) -> None: ...


async def undo_start(session: LifecycleSession) -> None:
    """Undo a start that failed or was cancelled: a resume lets go (the sandbox stays
    the ref's), a fresh start stops what it made."""
    if session._core.durable.resuming:
        await durable_ops.abandon_resume(session)
    else:
        await session._stop_backend()


async def run_start(session: LifecycleSession) -> None:
    """The start task: create (or resume) the sandbox; if that fails or is cancelled,
    undo it (settled) before the error propagates, a failed undo noted on it."""
    try:
        if session._core.durable.resuming:
            await durable_ops.resume(session)
        else:
            await session._start_backend()
    except BaseException as exc:
        try:
            await settle(undo_start(session))
        except Exception as cleanup_exc:
            exc.add_note(f"cleaning up the failed start also failed: {cleanup_exc}")
        raise


async def close_everything(session: LifecycleSession, previous: SessionState) -> None:
    """The close task of a session that was `previous` (its state before the close):
    everything torn down, the backend stopped if it was up. One failure is raised as
    it is, several as one `CleanupError`."""
    errors: list[BaseException] = []
    backend_up = previous is SessionState.RUNNING
    start = session._core.owned.start_task
    if previous is SessionState.STARTING and start is not None:
        start.cancel()  # the start's own failure path stops what it made
        await asyncio.wait({start})
        backend_up = not start.cancelled() and start.exception() is None
    # Calls in flight lose: their hooks see the cancellation and undo what they made.
    await session._core.owned.cancel_in_flight()
    entries = session._core.processes.take_everything()
    if backend_up and not await durable_ops.close_or_let_go(session, entries):
        return  # another client resumed the sandbox: it was only let go of
    for entry in entries:
        entry.sandbox_stopping = True
    try:
        await session._core.owned.settle_batch(entries)
    except CleanupError as exc:
        errors.extend(exc.errors)
    except Exception as exc:
        errors.append(exc)
    # Teardowns other calls own (a terminate, a prune) finish before the backend stops.
    await session._core.owned.wait_teardowns()
    stopped = backend_up
    if backend_up:
        try:
            await session._stop_backend()
        except Exception as exc:
            errors.append(exc)
            stopped = False
    session._core.recordings.close()
    # The ref file goes only once the sandbox is gone: after a failed stop it may still
    # be there (a workspace left half removed, a provider's sandbox not deleted), and
    # the file is what a retried close (`sandbox close`) finds it from. A resume that
    # never came up left the sandbox the ref's.
    gone = stopped or not (backend_up or session._core.durable.resuming)
    if backend_up and not stopped:
        await durable_ops.release_close(session)
    durable_ops.finish_ref_file(session, None, keep=not gone)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise CleanupError(
            f"closing the {session.backend_name} session failed {len(errors)} ways: "
            + "; ".join(str(e) for e in errors),
            errors,
        )


class Lifecycle:
    """The state and the start/close work of one session (`session`).

    `state` moves NEW -> STARTING -> RUNNING -> CLOSING -> CLOSED (a failed or
    cancelled start goes back to NEW). The start and the close each run as a task of
    their own, so that a cancelled caller never leaves half a start or half a close.
    """

    def __init__(self, session: LifecycleSession) -> None:
        self._session = session
        self.state = SessionState.NEW
        # The close (or detach) task once one began: a second `aclose()` awaits it.
        self._close_task: asyncio.Future[Any] | None = None

    @property
    def closing(self) -> bool:
        """Whether a close (or detach) began: calls that lose to it raise
        `SessionClosedError`."""
        return self.state in (SessionState.CLOSING, SessionState.CLOSED)

    def admit_now(self) -> None:
        """`Admission.admit_now`: raise unless calls may run now, as far as can be told
        without awaiting (`SessionTakenOverError` once another client resumed the
        sandbox, `SessionClosedError` once closing, else `SessionNotStartedError`)."""
        name = self._session.backend_name
        if self._session._core.durable.taken_over:
            raise durable_ops.taken_over_error(self._session)
        if self.state is SessionState.RUNNING:
            return
        if self.closing:
            raise SessionClosedError(f"the {name} session is closed")
        raise SessionNotStartedError(
            f"the {name} session is not started: use `async with session:` or await session.start()"
        )

    async def admit(self) -> None:
        """`Admission.admit`, the one check every call makes before it runs:
        `admit_now()`, then the lease of a shared session (one read, nothing when no ref
        was handed out)."""
        self.admit_now()
        await durable_ops.guard(self._session)

    def changed(self) -> None:
        """After a process was admitted or a teardown batch ended: the ref file follows
        (only while running: the start and the close write it themselves)."""
        if self.state is SessionState.RUNNING:
            durable_ops.changed(self._session)

    async def start(self) -> None:
        """`BaseSandboxSession.start`: the start task, run to its end or undone."""
        session = self._session
        if self.state is SessionState.RUNNING:
            return
        if self.closing:
            raise SessionClosedError(f"the {session.backend_name} session is closed")
        if self.state is SessionState.STARTING:
            raise SessionStateError("start() is already in progress")
        session._core.recordings.open()  # before the sandbox runs anything (`recordings.py`)
        self.state = SessionState.STARTING
        task = asyncio.ensure_future(run_start(session))
        session._core.owned.start_task = task
        try:
            await session._core.owned.wait(task)
        except BaseException as exc:
            if self.state is SessionState.STARTING:
                if task.done() and not task.cancelled() and task.exception() is None:
                    # The backend came up just as our caller was cancelled: undo it.
                    try:
                        await settle(undo_start(session))
                    except Exception as cleanup_exc:
                        exc.add_note(f"stopping the started backend failed: {cleanup_exc}")
                self.state = SessionState.NEW
                session._core.recordings.close()
            raise
        finally:
            if session._core.owned.start_task is task:
                session._core.owned.start_task = None
        if self.state is not SessionState.STARTING:
            # The close came after the backend was up: it stops the backend, we lost.
            raise SessionClosedError(
                f"the {session.backend_name} session was closed while starting"
            )
        self.state = SessionState.RUNNING
        durable_ops.changed(session)

    async def close(self) -> None:
        """`BaseSandboxSession.aclose`: the close task (the one already running, if a
        close or detach began)."""
        if self.state is SessionState.CLOSED:
            return
        if self._close_task is not None:
            await settle(finished(self._close_task))
            return
        await self.run_closing(close_everything(self._session, self.state))

    async def run_closing(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` (a close or a detach) as the closing task and return its result.

        A task of its own: a cancelled caller leaves it to run to its end (settled), and
        a second `aclose()` awaits the same one. The state is CLOSED afterwards, even
        when `work` failed."""
        self.state = SessionState.CLOSING
        task = asyncio.ensure_future(work)
        self._close_task = task
        try:
            await settle(task)
        finally:
            self.state = SessionState.CLOSED
        return task.result()

    def unclosed(self) -> None:
        """The `__del__` of a session that was started and never closed: warn (like an
        unclosed aiohttp session) and let the backend kill what it can synchronously
        (`_abandon`: unix_local kills its process groups; a remote sandbox is left to
        the provider's own timeout). Nothing for a session never started or closed."""
        if self.state in (SessionState.NEW, SessionState.CLOSED):
            return
        session = self._session
        warnings.warn(
            f"unclosed {session.backend_name} session (state {self.state.value}): use "
            "`async with session:` or await session.aclose()",
            ResourceWarning,
            source=session,
            stacklevel=2,
        )
        with contextlib.suppress(Exception):
            session._abandon(session._core.processes.entries())
