"""Commands with a terminal: one Daytona PTY session each.

Daytona runs an interactive shell in a PTY session, so the command is typed into it
with `ShellTrap` in exec mode: the shell is replaced by the command, whose own exit ends
the PTY; everything before the trap's start marker (prompt, echo) is dropped. The PTY's
output arrives as bytes. The command first writes its pid (the terminal's session and
group id) and start time to a pid file, so terminating kills that group and session
from a second exec (`scripts.kill_script`), even after the command exited: it may have
left children. A line too long to type safely goes through a script file. `PtyState`,
the handle of one terminal, is a `Process`: the base session's hooks write to it
(Ctrl-C is the interrupt character it is sent), resize it and kill it through its
methods.

The daemon reports a death by signal N as 128+N or as Go's -1 with a reason ("signal:
killed"): `normalize_exit` reads both.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import shlex
from dataclasses import dataclass, field
from typing import Any

from daytona import DaytonaError, PtySize

from ...backend import OutputSink, cancel_and_wait
from ...errors import ProcessExitedError
from ..toolkit import CommandCheck, ShellTrap, normalize_exit, wait_for_verdict
from .client import DaytonaClient
from .commands import signal_group
from .errors import is_not_found
from .handles import DaytonaHandle
from .scripts import PIDFILE_WAIT_S, pty_inner_command

logger = logging.getLogger("sandbox.daytona")

DEFAULT_TERM = "xterm-256color"
# A trap line longer than this is not typed: the command goes to a script file first,
# because a terminal in canonical mode silently truncates lines beyond 4095 bytes.
MAX_TYPED_LINE = 1024


@dataclass(eq=False)
class PtyState(DaytonaHandle):
    """A tty process: its PTY session (`pty`, the SDK's `AsyncPtyHandle` once it
    connected), the trap filtering its output, its waiter, how far its start went, and
    the sink it reports to (a write reads whether the process exited)."""

    pty_id: str
    trap: ShellTrap
    sink: OutputSink[DaytonaHandle] = field(repr=False)
    pty: Any = None
    connect_attempted: bool = False
    line_sent: bool = False
    waiter: asyncio.Task[None] | None = None
    script: str | None = None

    async def write(self, data: bytes) -> None:
        """Send bytes to the PTY. A PTY whose process exited is no longer "connected" in
        the SDK (`AsyncPtyHandle.send_input` raises `DaytonaConnectionError("PTY is not
        connected")` once the daemon said "exited"), which is not a lost connection: the
        SDK's handle then has its exit code, and the write is a `ProcessExitedError`."""
        client = self.client
        try:
            await client.timed("write to the terminal", self.pty.send_input(data))
        except DaytonaError as exc:
            if self.sink.exited or getattr(self.pty, "exit_code", None) is not None:
                raise ProcessExitedError(
                    "the process has exited; poll it with empty chars to collect its "
                    "remaining output and exit code"
                ) from None
            raise client.error(exc, "write to the terminal") from None

    async def resize(self, rows: int, cols: int) -> None:
        """Resize through `process.resize_pty_session` (typed errors, unlike the SDK
        handle's `resize`, which re-wraps them in a plain `DaytonaError`)."""
        client = self.client
        await client.call(
            "resize the terminal",
            client.process.resize_pty_session(self.pty_id, PtySize(rows=rows, cols=cols)),
        )

    async def kill(self, *, sandbox_stopping: bool = False) -> None:
        """Stop our waiter and the SDK's reader; unless the sandbox's deletion comes
        next, kill the terminal's group and session (even after the command exited: it
        may have left children), and kill the PTY session itself when that did not
        already end it."""
        client = self.client
        errors: list[BaseException] = []
        waiter = self.waiter
        if waiter is not None:
            await cancel_and_wait([waiter])
        if self.pty is not None:
            try:
                await client.bounded(self.pty.disconnect())
            except Exception as exc:
                errors.append(exc)
        if self.sandbox_ends_it(sandbox_stopping):  # its deletion kills everything in it
            if errors:
                raise client.teardown_error(errors[0], "stop the terminal")
            return
        clean_exit = self.sink.exited and self.sink.lost_reason is None
        group_killed = False
        if self.line_sent:
            try:
                group_killed = await client.bounded_retry(
                    lambda: signal_group(
                        client,
                        self.pidfile,
                        wait_s=0 if clean_exit else PIDFILE_WAIT_S,
                        grace_s=0 if clean_exit else self.grace_s,
                    )
                )
            except Exception as exc:
                errors.append(exc)
        if self.connect_attempted and not (group_killed or clean_exit):
            try:
                await client.bounded_retry(lambda: _kill_pty(client, self.pty_id))
            except Exception as exc:
                errors.append(exc)
            else:
                if errors:
                    # The shell is dead, but children that ignore SIGHUP may have survived.
                    logger.warning(
                        "daytona: could not kill the process group of a terminal (%s); "
                        "killed its shell only",
                        client.describe(errors[0]),
                    )
                    errors.clear()
        if errors:
            raise client.teardown_error(errors[0], "stop the terminal")

    async def release(self) -> None:
        """Stop following the PTY session without ending it: our waiter, then the SDK's
        connection (the daemon keeps the session and its process)."""
        waiter = self.waiter
        if waiter is not None:
            await cancel_and_wait([waiter])
        if self.pty is not None:
            try:
                await self.client.bounded(self.pty.disconnect())
            except Exception as exc:
                raise self.client.teardown_error(exc, "disconnect from the terminal") from None

    def ref_handle(self) -> dict[str, Any]:
        """The PTY session's id and the pid file."""
        return {"pty_id": self.pty_id, "pidfile": self.pidfile}


def pty_exit_status(code: int | None, reason: str | None) -> int | None:
    """A PTY's exit status as the contract reports it (128+N for signal N), from what
    the daemon reported; None when it reported neither a code nor a signal (the
    connection ended instead)."""
    if code is None and normalize_exit(None, reason) == 255:
        return None
    return normalize_exit(code, reason)


async def spawn(client: DaytonaClient, entry: OutputSink[DaytonaHandle], grace_s: float) -> None:
    """Open the PTY session, type the trapped command, start the waiter."""
    spec = entry.spec
    pty_id = client.new_id(f"t{entry.process_id}")
    check = CommandCheck.needed(spec.command, cwd=client.cwd(spec.command.cwd))
    state = PtyState(
        client=client,
        pidfile=posixpath.join(client.state_dir, f"{pty_id}.pid"),
        grace_s=grace_s,
        pty_id=pty_id,
        trap=ShellTrap(report_exit=False, token=None if check is None else check.token),
        sink=entry,
    )
    # Behind a check the shell starts in the working directory, the check enters `cwd`
    # and prints the trap's start marker (or a failure marker) itself.
    if check is None:
        shell_command, cwd = spec.command.shell_command, client.cwd(spec.command.cwd)
    else:
        shell_command, cwd = check.shell(spec.command.argv, announce=True), client.workdir
    entry.handle = state

    def on_data(data: bytes) -> None:
        shown = state.trap.feed(data)
        if shown:
            entry.feed(shown)

    envs = {"TERM": DEFAULT_TERM, **(spec.command.env or {})}
    inner = pty_inner_command(shell_command, pidfile=state.pidfile, cwd=cwd)
    announced = check is not None
    line = state.trap.line(inner, tty=True, announced=announced)
    try:
        if len(line.encode()) > MAX_TYPED_LINE:
            # Too long to type safely: the shell runs it from a file instead.
            state.script = posixpath.join(client.state_dir, f"{pty_id}.sh")
            inner = pty_inner_command(
                shell_command, pidfile=state.pidfile, cwd=cwd, script=state.script
            )
            await client.timed(
                "write the terminal's script", client.fs.upload_file(inner.encode(), state.script)
            )
            line = state.trap.line(f". {shlex.quote(state.script)}", tty=True, announced=announced)
        state.connect_attempted = True
        state.pty = await client.timed(
            "open the terminal",
            client.process.create_pty_session(
                id=pty_id,
                on_data=on_data,
                envs=envs,
                pty_size=PtySize(rows=spec.rows, cols=spec.cols),
            ),
        )
        state.waiter = asyncio.create_task(_wait(client, entry, state))
        state.line_sent = True
        await client.timed("type into the terminal", state.pty.send_input(line))
    except DaytonaError as exc:
        raise client.error(exc, "start the terminal") from None
    if check is not None:
        await wait_for_verdict(entry, state.trap, check)


async def reconnect(
    client: DaytonaClient,
    entry: OutputSink[DaytonaHandle],
    pty_id: str,
    pidfile: str,
    note: bytes,
    grace_s: float,
) -> bool:
    """Connect again to a PTY session an earlier client started, and follow it; False
    when the daemon no longer has it (it ended: the daemon deletes a PTY session, and
    its exit status, when its process ends).

    The command was typed (and its start marker passed, or about to) by the earlier
    client, so the trap shows everything from now on, after `note` (fed before the
    first byte, which may come before the connect returns). A connect that fails
    otherwise (a transport error) is raised: the process may still be running."""
    state = PtyState(
        client=client,
        pidfile=pidfile,
        grace_s=grace_s,
        pty_id=pty_id,
        trap=ShellTrap(report_exit=False),
        sink=entry,
        connect_attempted=True,
        line_sent=True,
    )
    state.trap.started = True
    state.trap.decided.set()
    pending = [note]

    def on_data(data: bytes) -> None:
        shown = state.trap.feed(data)
        if pending:
            entry.feed(pending.pop())
        if shown:
            entry.feed(shown)

    entry.handle = state
    try:
        state.pty = await client.timed(
            "reconnect to the terminal", client.process.connect_pty_session(pty_id, on_data)
        )
    except DaytonaError as exc:
        # The SDK reports an unknown session as a connection error (the daemon's error
        # control message, no status): its REST info says 404 when it is really gone.
        try:
            await client.timed("look the terminal up", client.process.get_pty_session_info(pty_id))
        except DaytonaError as info_exc:
            if is_not_found(info_exc):
                entry.handle = None
                return False
        raise client.error(exc, "reconnect to the terminal") from None
    if pending:
        entry.feed(pending.pop())
    state.waiter = asyncio.create_task(_wait(client, entry, state))
    return True


async def _wait(client: DaytonaClient, entry: OutputSink[DaytonaHandle], state: PtyState) -> None:
    """Wait for the PTY's end and report it (or the lost connection)."""
    try:
        result = await state.pty.wait()
    except Exception as exc:
        entry.report_lost(f"the daytona terminal failed: {client.describe(exc)}")
        return
    tail = state.trap.flush()
    if tail:
        entry.feed(tail)
    code = pty_exit_status(result.exit_code, result.error)
    if code is None:
        reason = client.describe(Exception(result.error or "no exit status was reported"))
        entry.report_lost(f"the daytona terminal connection ended: {reason}")
        return
    entry.report_eof()
    entry.report_exit(code)


async def _kill_pty(client: DaytonaClient, pty_id: str) -> None:
    """SIGKILL the PTY's shell; "no such PTY session" is taken at its word (gone)."""
    try:
        await client.process.kill_pty_session(pty_id)
    except DaytonaError as exc:
        if not is_not_found(exc):
            raise
