"""`Process`: what a backend's spawn stores in `sink.handle`, the controls of one process.

A backend whose handle is a `Process` writes no per-process hook but the spawn and
`_terminate_pty_entry`: the base session's hooks (`session/hooks.py`) call the handle's
methods, so a write, a resize, an interrupt, an end of input and a window's last drain
are the handle's own code, the same for users and for the race tests. A method a
process cannot do is left as it is here: the base session then refuses the call with
the backend's name, as it does for a hook the backend did not write.

The handle keeps what it needs from the spawn (the `OutputSink` it reports to, the
backend's client, the grace of a kill); it never reaches the session itself. Every
method runs in a task the session owns: cancelled, it must leave the process as
`kill` can still end it.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from .process_entry import OutputSink


class Process(ABC):
    """The controls of one running process (see the module docstring)."""

    # Whether `interrupt` also serves a process on a terminal (it knows better than
    # writing the interrupt character: unix_local signals the terminal's foreground
    # group when the terminal has no room for it); else the base session writes ^C
    # through `write`.
    interrupts_terminal: ClassVar[bool] = False

    def try_write(self, data: bytes) -> int:
        """Write what the process takes right now, never waiting, and return how many
        bytes that was; the rest goes through `write`. Default: 0."""
        return 0

    async def write(self, data: bytes) -> None:
        """Write `data` to the process's terminal, or to its open stdin on pipes, all of
        it or until cancelled; a handle that writes in parts reports each part to its
        sink's `count_input`, so a write cut short says how much was not written."""
        raise NotImplementedError  # not overridden: the base session refuses the call

    async def close_stdin(self) -> None:
        """End the input of a process on pipes started with its stdin open (it reads
        end-of-file once every byte written before was read). Idempotent: a close
        cancelled half-way is asked again. Writing it is how a handle says it can."""
        raise NotImplementedError  # not overridden: `stdin=True` is refused at start

    async def resize(self, rows: int, cols: int) -> None:
        """Resize the process's terminal."""
        raise NotImplementedError  # not overridden: the base session refuses the call

    async def interrupt(self) -> None:
        """SIGINT to the process's group, for a process without a terminal (on a
        terminal the base session writes the interrupt character instead, unless the
        handle sets `interrupts_terminal`: then this serves a terminal too)."""
        raise NotImplementedError  # not overridden: the base session refuses the call

    async def drain(self) -> None:
        """At a window's deadline, move output that already reached the transport into
        the sink. Default: let pending callbacks run once."""
        await asyncio.sleep(0)

    def finish_now(self) -> bool:
        """Do all of `kill` now, never waiting, and return True, when the process's end
        is certain (it exited and nothing of it is left to wait for); else do nothing
        and return False (the settled teardown then calls `kill`). Default: False."""
        return False

    @abstractmethod
    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """Tear the process down: kill its whole tree, stop its readers, close its
        sockets and fds. Idempotent, and it copes with a spawn that stopped half-way.
        `sandbox_stopping`: the whole sandbox is deleted right after (the close), so a
        handle whose sandbox's deletion kills every process may skip its own kill."""


def overrides(handle: object, name: str) -> bool:
    """Whether `handle` is a `Process` whose class writes `name` itself."""
    return isinstance(handle, Process) and getattr(type(handle), name) is not getattr(Process, name)


async def kill_handle(sink: OutputSink[Any]) -> None:
    """`Process.kill` of the sink's handle, if the spawn stored one (a spawn that failed
    before it did left nothing to kill): the body of a `_terminate_pty_entry`."""
    handle = sink.handle
    if isinstance(handle, Process):
        await handle.kill(sandbox_stopping=sink.sandbox_stopping)
