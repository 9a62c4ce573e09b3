"""What a daytona entry holds: a terminal session (`PtyState`) or a session command
(`PipeState`). Here, apart from the modules that drive them, so `commands`, `terminal`
and `session` all import it and not one another.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..toolkit import ShellTrap


@dataclass(eq=False)
class PipeState:
    """A session command: its session, command id and reader."""

    session_id: str
    pidfile: str
    session_attempted: bool = False
    execute_attempted: bool = False
    cmd_id: str | None = None
    finished: bool = False
    pump: asyncio.Task[None] | None = None


@dataclass(eq=False)
class PtyState:
    """A tty process: its PTY session, the trap filtering its output, its waiter."""

    pty_id: str
    pidfile: str
    trap: ShellTrap
    handle: Any = None
    connect_attempted: bool = False
    line_sent: bool = False
    waiter: asyncio.Task[None] | None = None
    script: str | None = None


# What a daytona entry holds: a terminal session, or a pipe command.
DaytonaHandle = PtyState | PipeState
