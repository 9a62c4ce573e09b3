"""`Admission`: the one check every public call of a session makes before it runs.

"May this call run now?" has one answer, `Lifecycle.admit()`: the session is running
(not new, starting, closing or closed) and no other client took its sandbox over (the
lease of a shared session, read once). `admit_now()` is the part that needs no await,
for a call that must answer before it can await (a stream is returned before its first
chunk is read: it is admitted now and again at its first chunk). `closing` is not a
check but a fact a call that lost a race reads: the close is why its process is gone.
The collaborators (`FileCalls`, `WorkspaceCalls`, `PtyCalls`, `ExecStream`,
`OwnedTasks`) are handed this object, never a set of callbacks.
"""

from __future__ import annotations

from typing import Protocol


class Admission(Protocol):
    """What a call asks of the session's lifecycle before it runs."""

    @property
    def closing(self) -> bool:
        """Whether a close (or detach) began: a call that loses to it raises
        `SessionClosedError`."""
        ...

    def admit_now(self) -> None:
        """Raise unless calls may run now, as far as can be told without awaiting:
        `SessionTakenOverError` once another client took the sandbox over (seen by an
        earlier check), `SessionClosedError` once closing, else `SessionNotStartedError`
        before the start completed."""
        ...

    async def admit(self) -> None:
        """The check: `admit_now()`, then the lease of a shared session (one read;
        nothing while no ref was handed out): `SessionTakenOverError` if another client
        resumed the sandbox."""
        ...
