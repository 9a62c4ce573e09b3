"""The spawn of a `pty_exec_start` process: a bridge session of its own, its PTY socket
and reader (`terminal`), then the trapped command typed into the session's shell, its
handle a `PtyHandle` (a `Process`).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable

from ...backend import OutputSink
from ..toolkit import CommandCheck, ShellTrap, wait_for_verdict
from .client import WorkerClient
from .execs import pty_command
from .scripts import PID_PRINTF
from .terminal import PtyHandle, WorkerTerminal, connect, pump, send_frame, typed_line


async def spawn_terminal(
    entry: OutputSink[PtyHandle],
    client: WorkerClient,
    *,
    keep: bool,
    ready_timeout_s: float,
    heartbeat_s: float | None,
    redact: Callable[[str], str],
) -> None:
    """A session of its own, its PTY socket, then the trapped command typed in; with a
    command check, wait for its verdict. `keep`: the session keeps the sandbox at close
    (the handle's kill then ends the process itself); `redact` hides the key in the
    Worker's error frames."""
    spec = entry.spec
    # The session is named here, before it exists, and recorded at once: if this
    # call is cancelled while the create is in flight, the teardown still knows
    # which session to delete.
    handle = PtyHandle(
        client=client,
        keep=keep,
        trap=ShellTrap(report_exit=True),
        session_id=f"sandbox-py-{secrets.token_hex(8)}",
    )
    entry.handle = handle
    await client.call(
        "POST",
        client.sandbox_url("session"),
        "create a terminal session",
        json_body={"id": handle.session_id},
    )
    handle.session_confirmed = True
    early = await connect(
        client,
        handle,
        rows=spec.rows,
        cols=spec.cols,
        ready_timeout_s=ready_timeout_s,
        heartbeat_s=heartbeat_s,
    )
    assert handle.ws is not None
    handle.terminal = WorkerTerminal(handle.ws, early)
    handle.reader = asyncio.create_task(pump(entry, handle, redact))
    check = CommandCheck.needed(spec.command, cwd=spec.command.cwd, token=handle.trap.token)
    # The shell's pid first (so a terminate can kill its whole session), then the
    # trapped command, isolated: an interactive shell drops the rest of a line after
    # Ctrl-C, which would lose the end marker.
    line = PID_PRINTF.format(token=handle.trap.token) + handle.trap.line(
        pty_command(spec.command, check),
        tty=spec.tty,
        isolate=True,
        announced=check is not None,
    )
    line = await typed_line(client, handle.trap.token, line)
    await send_frame(handle, line.encode(), "write to the terminal")
    if check is not None:
        await wait_for_verdict(entry, handle.trap, check)
