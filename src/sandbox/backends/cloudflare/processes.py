"""The spawn of a `pty_exec_start` process: a bridge session of its own, its PTY socket
and reader (`terminal`), then the trapped command typed into the session's shell, its
handle a `PtyHandle` (a `Process`). With the runner (`runner_link`), the twins
`spawn_on_runner` and `start_on_runner` start a process and a one-shot `exec` through it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any, cast

from ...backend import CommandSpec, ExecCapture, OneShotProcess, OutputSink
from ...errors import UnsupportedOperationError
from ..toolkit import (
    CommandCheck,
    RunnerProcess,
    ShellTrap,
    spawn_through_runner,
    start_one_shot,
    wait_for_verdict,
)
from .client import WorkerClient
from .execs import pty_command
from .runner_link import CloudflareRunner
from .scripts import PID_PRINTF
from .terminal import PtyHandle, WorkerTerminal, connect, pump, send_frame, typed_line


def refuse_open_stdin(entry: OutputSink[Any]) -> None:
    """Refuse `stdin=True` before anything starts: without the runner a process on pipes
    still runs on a terminal, whose input has no end of file."""
    if entry.spec.stdin and not entry.spec.tty:
        raise UnsupportedOperationError(
            "stdin=True: the cloudflare backend keeps the stdin of a process on pipes open "
            "only through the runner (runner=True); use tty=True to type into a process, "
            "or write the input to a file and redirect it (`sort < input.txt`)"
        )


async def spawn_on_runner(entry: OutputSink[Any], runner: CloudflareRunner) -> None:
    """Start `entry.spec` as a process of the runner (its handle a `RunnerProcess`, its
    tree killed by the runner), in its folder (`CloudflareRunner.cwd`) with the
    sandbox's environment plus its own."""
    command = entry.spec.command
    env = runner.environment(command.env, tty=entry.spec.tty)
    sink = cast(OutputSink[RunnerProcess], entry)
    await spawn_through_runner(runner.client, sink, env=env, cwd=runner.cwd(command.cwd))


async def start_on_runner(
    runner: CloudflareRunner, spec: CommandSpec, capture: ExecCapture
) -> OneShotProcess:
    """The runner's one-shot of `spec`, stdout and stderr apart, byte-exact, in its
    folder (`CloudflareRunner.cwd`) with the sandbox's environment plus its own."""
    env = runner.environment(spec.env, tty=False)
    return await start_one_shot(runner.client, spec, capture, env=env, cwd=runner.cwd(spec.cwd))


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
