"""One process (`pty_exec_start`): its start (`spawn`, the session's `_spawn_process`)
and the tasks behind it: a reader per output stream, feeding the `OutputSink`, and a
watcher reporting the exit. With the runner, `spawn_on_runner` starts the runner's
process instead (`RunnerProcess`, the toolkit's `spawn_through_runner`).

Output and exit status travel on different RPC streams, so the watcher reports the exit
once the output ended too (or `exit_output_grace_s` passed): reporting it first could
end a window before the last output arrived. Output that ends without an exit status
is followed by `exit_status_timeout_s` of waiting, then the process is lost. A branch
that fails stops its siblings and awaits them before it reports the loss: a reader that
fails cancels the other reader and the watcher; a wait that fails cancels the readers.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from ...backend import OutputSink, cancel_and_wait
from ..toolkit import (
    CommandCheck,
    RunnerProcess,
    ShellTrap,
    normalize_exit,
    spawn_through_runner,
    wait_for_verdict,
)
from .commands import Command, Commands, read_stream
from .errors import ModalErrors
from .runner_link import SandboxRunner

SERVER_TIMEOUT_CODE = -1  # what `ContainerProcess.wait()` returns without a status
# Output and exit status travel on different RPC streams: after one of them ends, how long
# to wait for the other before giving up on it (the session's `exit_output_grace_s`,
# which a one-shot's wait takes too, and `exit_status_timeout_s`).
EXIT_OUTPUT_GRACE_S = 1.0
EXIT_STATUS_TIMEOUT_S = 10.0


async def spawn(
    entry: OutputSink[Command],
    commands: Commands,
    *,
    keep: bool,
    exit_output_grace_s: float,
    exit_status_timeout_s: float,
) -> None:
    """Exec the command under the toolkit's wrapper (`pty=True` for a terminal), then
    start one reader task per stream and a watcher task for the exit; behind a command
    check, wait for its verdict."""
    spec = entry.spec
    command = Command(commands, tty=spec.tty, keep=keep)
    entry.handle = command  # from here on, teardown can find (and kill) it by tag
    check = CommandCheck.needed(spec.command, cwd=commands.cwd(spec.command.cwd))
    trap = None if check is None else ShellTrap(report_exit=False, token=check.token)
    await commands.start(
        spec.command,
        command,
        wrap=True,
        rows=spec.rows,
        cols=spec.cols,
        check=check,
        announce=True,
        keep_stdin=spec.stdin,
    )
    start_tasks(
        entry,
        command,
        commands.errors,
        trap,
        exit_output_grace_s=exit_output_grace_s,
        exit_status_timeout_s=exit_status_timeout_s,
    )
    if check is not None and trap is not None:
        await wait_for_verdict(entry, trap, check)


async def spawn_on_runner(
    entry: OutputSink[Command], runner: SandboxRunner, commands: Commands, *, grace_s: float
) -> None:
    """Start the entry's command as a process of the runner (its handle a
    `RunnerProcess`, killed with its tree, SIGTERM to SIGKILL in `grace_s`), in its folder
    under the workdir (`commands.cwd`) with the runner's environment for it."""
    command = entry.spec.command
    env = runner.environment(command.env, tty=entry.spec.tty)
    sink = cast(OutputSink[RunnerProcess], entry)
    cwd = commands.cwd(command.cwd)
    await spawn_through_runner(runner.client, sink, env=env, cwd=cwd, grace_s=grace_s)


def start_tasks(
    entry: OutputSink,
    command: Command,
    errors: ModalErrors,
    trap: ShellTrap | None,
    *,
    exit_output_grace_s: float,
    exit_status_timeout_s: float,
) -> None:
    """Start the readers (stdout only with a terminal: stderr is merged into it; the
    command check's markers come on stdout, the stream `trap` filters) and the watcher."""
    process = command.process
    streams = [process.stdout] if command.tty else [process.stdout, process.stderr]
    command.readers = [
        asyncio.create_task(_pump(entry, command, errors, s, trap if s is process.stdout else None))
        for s in streams
    ]
    command.watcher = asyncio.create_task(
        _watch(entry, command, errors, exit_output_grace_s, exit_status_timeout_s)
    )


async def _pump(
    entry: OutputSink, command: Command, errors: ModalErrors, stream: Any, trap: ShellTrap | None
) -> None:
    """Feed one output stream into the entry (through `trap` behind a check); a stream
    that fails loses the process, once its sibling tasks are stopped."""

    def feed(data: bytes) -> None:
        shown = data if trap is None else trap.feed(data)
        if shown:
            entry.feed(shown)

    try:
        await read_stream(stream, feed)
    except Exception as exc:
        me = asyncio.current_task()
        await cancel_and_wait([task for task in command.tasks() if task is not me])
        entry.report_lost(f"reading its output from Modal failed ({errors.describe(exc)})")


async def _watch(
    entry: OutputSink,
    command: Command,
    errors: ModalErrors,
    grace_s: float,
    status_timeout_s: float,
) -> None:
    """Report the exit once it is known and the output has ended (see the module
    docstring)."""
    waiter = asyncio.ensure_future(
        errors.timed_call("wait for the process", None, command.process.wait.aio)
    )
    readers: set[asyncio.Task[Any]] = set(command.readers)
    try:
        while readers and not waiter.done():
            done, _ = await asyncio.wait({waiter, *readers}, return_when=asyncio.FIRST_COMPLETED)
            readers -= done
        if waiter.done():
            if not waiter.cancelled() and waiter.exception() is not None:
                await cancel_and_wait(list(command.readers))  # the wait failed: stop reading
            elif readers:
                await asyncio.wait(readers, timeout=grace_s)
            if all(reader.done() for reader in command.readers):
                entry.report_eof()
            _report_exit(entry, command, errors, waiter)
            return
        entry.report_eof()
        await asyncio.wait({waiter}, timeout=status_timeout_s)
        if waiter.done():
            _report_exit(entry, command, errors, waiter)
        else:
            entry.report_lost(
                f"Modal did not report its exit status within {status_timeout_s:g}s of "
                "its output ending"
            )
    finally:
        await cancel_and_wait([waiter])


def _report_exit(
    entry: OutputSink, command: Command, errors: ModalErrors, waiter: asyncio.Future[int]
) -> None:
    exc = asyncio.CancelledError() if waiter.cancelled() else waiter.exception()
    if exc is not None:
        entry.report_lost(f"waiting for its exit failed ({errors.describe(exc)})")
        return
    command.exited = True
    code = waiter.result()
    if code == SERVER_TIMEOUT_CODE:
        entry.report_lost("Modal reported no exit status")
    else:
        entry.report_exit(normalize_exit(code))
