"""What a daytona entry holds: a `DaytonaHandle`, the `Process` of a terminal session
(`terminal.PtyState`) or of a session command (`commands.PipeState`). The base is
here, apart from the modules that drive the two kinds, so `commands`, `terminal`,
`durable` and `session` all import it and not one another for it.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ...backend import Process
from .client import DaytonaClient


@dataclass(eq=False)
class DaytonaHandle(Process):
    """One process in the sandbox, as the base session's hooks drive it: what every
    kind keeps from its spawn (the client whose calls are bounded and whose errors are
    mapped, the pid file its group is killed through, the grace of a kill)."""

    client: DaytonaClient = field(repr=False)
    pidfile: str
    grace_s: float

    def sandbox_ends_it(self, sandbox_stopping: bool) -> bool:
        """Whether the sandbox's deletion right after ends this process, so a kill is
        only our side's release: a kept sandbox outlives the session, and its
        processes are killed one by one."""
        return sandbox_stopping and self.client.deletes_sandbox()

    @abstractmethod
    def ref_handle(self) -> dict[str, Any]:
        """The ids a session ref keeps to follow this process again (`durable`)."""

    @abstractmethod
    async def release(self) -> None:
        """Stop following the process without ending it (a detach): the daemon keeps
        it, and a resumed session reattaches to it."""
