"""The work a session's start and close run, as tasks the session owns.

`BaseSandboxSession.start()` / `aclose()` / `detach()` keep the state machine
(`SessionState`) and the tasks; what those tasks do is here, in order: a start that
creates or resumes the sandbox and undoes itself when it fails; a close that cancels
what is in flight, takes every entry, tears them down as one settled batch, waits for
teardowns other calls own, then stops the backend. The session is typed as
`LifecycleSession`, the part of it used here (the session imports this module, so this
one must not import it back).
"""

from __future__ import annotations

import asyncio
import enum
from typing import Protocol

from ..durable import ops as durable_ops
from ..errors import CleanupError
from ..settle import settle


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


async def undo_start(session: LifecycleSession) -> None:
    """Undo a start that failed or was cancelled: a resume lets go (the sandbox stays
    the ref's), a fresh start stops what it made."""
    if session._durable.resuming:
        await durable_ops.abandon_resume(session)
    else:
        await session._stop_backend()


async def run_start(session: LifecycleSession) -> None:
    """The start task: create (or resume) the sandbox; if that fails or is cancelled,
    undo it (settled) before the error propagates, a failed undo noted on it."""
    try:
        if session._durable.resuming:
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
    start = session._owned.start_task
    if previous is SessionState.STARTING and start is not None:
        start.cancel()  # the start's own failure path stops what it made
        await asyncio.wait({start})
        backend_up = not start.cancelled() and start.exception() is None
    # Calls in flight lose: their hooks see the cancellation and undo what they made.
    await session._owned.cancel_in_flight()
    entries = session._processes.take_everything()
    if backend_up and not await durable_ops.close_or_let_go(session, entries):
        return  # another client resumed the sandbox: it was only let go of
    for entry in entries:
        entry.sandbox_stopping = True
    try:
        await session._owned.settle_batch(entries)
    except CleanupError as exc:
        errors.extend(exc.errors)
    except Exception as exc:
        errors.append(exc)
    # Teardowns other calls own (a terminate, a prune) finish before the backend stops.
    await session._owned.wait_teardowns()
    if backend_up:
        try:
            await session._stop_backend()
        except Exception as exc:
            errors.append(exc)
    session._recordings.close()
    durable_ops.finish_ref_file(session, None)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise CleanupError(
            f"closing the {session.backend_name} session failed {len(errors)} ways: "
            + "; ".join(str(e) for e in errors),
            errors,
        )
